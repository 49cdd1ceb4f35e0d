#!/usr/bin/env bash
# Device run 5 (one nvidia-h200, 2026-12-05, seventh session; the session's last device time):
# the quads decode body with a loop on row 0 alone where a workgroup has one row (weights of
# under 2048 rows; before, such a workgroup decoded its row twice, the second time for a
# sum never stored) against the committed build (`convert-old`, bed396e), alternating, on
# the three shape copies; 32 greedy ids of each against the CPU f32 reference. Carry .gpubin
# (bin.tar.xz: convert, convert-old) and .anchor (debs, gguf wheel, shapes).
set -u
cd "$(dirname "$0")/../../.."
NO_8B=1 RUN=run5; . benches/gpu/device_env.sh
copies
for m in smollm2 qwen2.5 gemma3; do
  rm -rf /tmp/$m.old.bundle; $B/convert-old pack -q -o /tmp/$m.old.bundle /tmp/$m.copy.gguf
done
el "bundles"
A="--backend gpu --prompt-tokens 64 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do
  for m in smollm2 qwen2.5 gemma3; do
    $B/convert bench /tmp/$m.bundle $A > $W/$m-new-$i.json; summary $W/$m-new-$i.json
    $B/convert bench /tmp/$m.old.bundle $A > $W/$m-old-$i.json; summary $W/$m-old-$i.json
  done
done
el "bench"
IDS=$(python3 -c "print(','.join(str(1 + (i * 7919) % 49000) for i in range(40)))")
for m in smollm2 qwen2.5 gemma3; do
  R1="--prompt-ids $IDS --max-tokens 32 --ignore-eos --print-ids"
  $B/convert run /tmp/$m.bundle --backend gpu $R1 > /dev/null 2> $W/ids-$m-new.txt
  $B/convert run /tmp/$m.bundle --kernel f32 $R1 > /dev/null 2> $W/ids-$m-cpu.txt
  python3 -c "
import sys
g=[l for l in open('$W/ids-$m-new.txt') if 'generated ids' in l][-1]; c=[l for l in open('$W/ids-$m-cpu.txt') if 'generated ids' in l][-1]
print('$m: 32 greedy ids equal to cpu f32:', g == c)"
done
tar czf $O/run5.tar.gz -C $W .
el "done"
