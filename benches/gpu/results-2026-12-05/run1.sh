#!/usr/bin/env bash
# Device run 1 (one nvidia-h200, 2026-12-05, seventh session; written the session before as
# benches/gpu/next_run.sh, when no machine was lent). No llama.cpp; 79 s of work.
# 1. The floor of one dependent dispatch (examples/gpu_dispatch_floor.rs), at 1, 16 and 4096
#    workgroups: with the 8B decode step's 261 dependent dispatches it bounds what the
#    one-op-per-dispatch design can reach (the aim, 1000 tok/s, is 1000 us a step; the
#    quantize-RMSNorm dispatches cost 3.7 us each inside the chain, run 5 of
#    results-2026-12-04d, their work included).
# 2. A prefill chunk of the small models' shape copies op by op (LOWBIT_PROFILE_PREFILL=256
#    gpu_decode_profile): where their prompts (0.16-0.36x llama.cpp's) lose, before writing a
#    tiled int8 GGUF product.
# 3. The tiled prefill product of GGUF weights (shaders/weights/matmul_tile.wgsl, from 32
#    tokens) against the former one (LOWBIT_GPU_TILE=0), alternating, on the copies' prompts
#    (pp512); and the SmolLM2 copy's last-position logits after a 300-token prompt (a
#    256-token chunk) with each, against the CPU f32 reference.
# 4. The 8B decode profile of the committed build, for the record.
# Carry .gpubin (convert, gpu_decode_profile, gpu_dispatch_floor) and .anchor (debs, gguf
# wheel, generator, tokenizer, shapes/*.json.gz; the llama.cpp tarball is not needed).
set -u
cd "$(dirname "$0")/../../.."
RUN=run1; . benches/gpu/device_env.sh
$B/gpu_dispatch_floor 256 4096 1048576 | tee $W/dispatch-floor.md
el "floor"
copies
for m in smollm2 qwen2.5 gemma3; do
  [ -d /tmp/$m.bundle ] || continue
  LOWBIT_PROFILE_PREFILL=256 $B/gpu_decode_profile /tmp/$m.bundle 256 2 > $W/prefill-$m.md 2>&1
  echo "== $m prefill chunk of 256"; sed -n 1,14p $W/prefill-$m.md
done
el "prefill profiles"
A="--backend gpu --prompt-tokens 512 --gen-tokens 16 --repeats 3 --json"
for i in 1 2; do
  for m in smollm2 qwen2.5 gemma3; do
    [ -d /tmp/$m.bundle ] || continue
    $B/convert bench /tmp/$m.bundle $A > $W/$m-tile-$i.json; summary $W/$m-tile-$i.json
    LOWBIT_GPU_TILE=0 $B/convert bench /tmp/$m.bundle $A > $W/$m-old-$i.json; summary $W/$m-old-$i.json
  done
done
IDS=$(python3 -c "print(','.join(str(1 + (i * 7919) % 49000) for i in range(300)))")
R1="--prompt-ids $IDS --max-tokens 1 --ignore-eos"
$B/convert run /tmp/smollm2.bundle --backend gpu $R1 --dump-logits $W/l-tile.f32 > /dev/null 2>&1
LOWBIT_GPU_TILE=0 $B/convert run /tmp/smollm2.bundle --backend gpu $R1 --dump-logits $W/l-old.f32 > /dev/null 2>&1
$B/convert run /tmp/smollm2.bundle --kernel f32 $R1 --dump-logits $W/l-cpu.f32 > /dev/null 2>&1
python3 - $W <<'PY'
import sys, struct
w = sys.argv[1]
def f(n):
    b = open('%s/l-%s.f32' % (w, n), 'rb').read(); return struct.unpack('%df' % (len(b) // 4), b)
c = f('cpu')
for n in ('tile', 'old'):
    g = f(n); print('%s: max |logit - cpu f32| %.4g, argmax equal %s' % (n, max(abs(a - b) for a, b in zip(g, c)), max(range(len(g)), key=g.__getitem__) == max(range(len(c)), key=c.__getitem__)))
PY
rm -f $W/*.f32
el "tile A/B"
rm -rf /tmp/m.b; $B/convert gguf-to-ternary -q -o /tmp/m.b /tmp/minicpm8b.gguf
$B/gpu_decode_profile /tmp/m.b 512 8 > $W/profile-minicpm8b.md 2>&1; sed -n 1,12p $W/profile-minicpm8b.md
tar czf $O/run1.tar.gz -C $W .
el "done"
