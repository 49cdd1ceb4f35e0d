#!/usr/bin/env bash
# Device run 2 (one nvidia-h200, 2026-12-05, seventh session): the single-token GGUF body
# with four invocations on a unit (shaders/weights/matvec_quads.wgsl) against the former one
# (matvec.wgsl, which the committed binary, `convert-old`, packs under the same kernel names)
# on the SmolLM2, Qwen2.5 and Gemma 3 shape copies: decode, the decode step's profile, and 32
# greedy ids of each against the CPU f32 reference; the new body with one row a workgroup
# throughout (LOWBIT_GPU_MATVEC_WG_ROWS=1) beside its default (2, 1 where a weight has under
# 2048 rows). Carry .gpubin (convert, convert-old,
# gpu_decode_profile) and .anchor (debs, gguf wheel, generator, tokenizer, shapes).
set -u
cd "$(dirname "$0")/../../.."
NO_8B=1 RUN=run2; . benches/gpu/device_env.sh
copies
for m in smollm2 qwen2.5 gemma3; do
  rm -rf /tmp/$m.old.bundle; $B/convert-old pack -q -o /tmp/$m.old.bundle /tmp/$m.copy.gguf
done
el "bundles"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do
  for m in smollm2 qwen2.5 gemma3; do
    $B/convert bench /tmp/$m.bundle $A > $W/$m-new-$i.json; summary $W/$m-new-$i.json
    $B/convert bench /tmp/$m.old.bundle $A > $W/$m-old-$i.json; summary $W/$m-old-$i.json
    LOWBIT_GPU_MATVEC_WG_ROWS=1 $B/convert bench /tmp/$m.bundle $A > $W/$m-new1-$i.json; summary $W/$m-new1-$i.json
  done
done
el "bench"
for m in smollm2 qwen2.5 gemma3; do
  $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m-new.md 2>&1
  $B/gpu_decode_profile /tmp/$m.old.bundle 512 8 > $W/profile-$m-old.md 2>&1
  echo "== $m new"; sed -n 3,12p $W/profile-$m-new.md; echo "== $m old"; sed -n 3,8p $W/profile-$m-old.md
done
el "profiles"
IDS=$(python3 -c "print(','.join(str(1 + (i * 7919) % 49000) for i in range(40)))")
for m in smollm2 qwen2.5 gemma3; do
  R1="--prompt-ids $IDS --max-tokens 32 --ignore-eos --print-ids"
  $B/convert run /tmp/$m.bundle --backend gpu $R1 > /dev/null 2> $W/ids-$m-new.txt
  $B/convert run /tmp/$m.old.bundle --backend gpu $R1 > /dev/null 2> $W/ids-$m-old.txt
  $B/convert run /tmp/$m.bundle --kernel f32 $R1 > /dev/null 2> $W/ids-$m-cpu.txt
  python3 - $W $m <<'PY'
import sys
w, m = sys.argv[1:]
def ids(n):
    l = [l for l in open('%s/ids-%s-%s.txt' % (w, m, n)) if 'generated ids' in l.lower()]; return l[-1].strip() if l else 'none'
c = ids('cpu')
print('%s: 32 greedy ids equal to cpu f32: new %s, old %s' % (m, ids('new') == c, ids('old') == c))
PY
done
tar czf $O/run2.tar.gz -C $W .
el "done"
