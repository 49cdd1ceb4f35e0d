#!/usr/bin/env bash
# Device run 3 (one nvidia-h200, 2026-12-05, seventh session; its save() copied 34 files to
# $OUT, of which a run returns only 8: the rest came back by a second call, tarred, while the
# machine was warm; run4.sh tars instead): the build with the tiled
# prefill product and the four-invocations-a-unit decode body beside llama.cpp b11434's
# Vulkan backend in one command: the 8B-shape TQ2_0 GGUF and the SmolLM2, Qwen2.5 and Gemma 3
# shape copies (llama-bench pp512 / tg128, three repeats; `convert bench` the same, two
# runs); the copies also with two groups of 32 invocations a workgroup in the decode body
# (LOWBIT_GPU_MATVEC_LANES=32, one row each) against the default (64 on every row),
# alternating; Gemma 3's post-norm, residual add and next norm in one op (op_rms_norm_add)
# against the three ops (the copy packed by `convert-old`, the same build without that op);
# 8B first-step logits and 48 greedy ids against the CPU f32 reference; decode
# profiles. Carry .gpubin (bin.tar.xz: convert, convert-old, gpu_decode_profile) and .anchor (with its
# llama.cpp tarball, repacked without the other backends' sources as in results-2026-12-04d).
set -u
cd "$(dirname "$0")/../../.."
RUN=run3; . benches/gpu/device_env.sh
save() { mkdir -p $O/run3 && cp -r $W/. $O/run3/; } # after each phase: what ran comes back if time runs out
bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-minicpm8b.md 2>$W/llama.err; tail -3 $W/llama-minicpm8b.md
copies
for m in smollm2 qwen2.5 gemma3; do
  MODEL=/tmp/$m.copy.gguf bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-$m.md 2>>$W/llama.err; tail -2 $W/llama-$m.md
done
rm -rf /tmp/gemma3.old.bundle; $B/convert-old pack -q -o /tmp/gemma3.old.bundle /tmp/gemma3.copy.gguf
el "llama.cpp"; save
rm -rf /tmp/minicpm8b.bundle; $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
M=/tmp/minicpm8b.bundle
IDS=1,2345,678,9012,345,6789,1111,2222,3333,4444,5555,6666,7777,8888,9999,1234,4321,100,200,300,400,500,600,700,800,900,1000,1100,1200,1300,1400,1500,1600,1700,1800,1900,2000,2100,2200,2300
$B/convert run $M --backend gpu --prompt-ids $IDS --max-tokens 48 --ignore-eos --print-ids --dump-logits $W/logits-gpu.f32 > $W/run-gpu.txt 2> $W/ids-gpu.txt
$B/convert run $M --prompt-ids $IDS --max-tokens 48 --ignore-eos --print-ids --kernel f32 --dump-logits $W/logits-cpu.f32 > $W/run-cpu.txt 2> $W/ids-cpu.txt
python3 - $W <<'PY'
import sys, struct
w = sys.argv[1]
def f(n):
    b = open('%s/logits-%s.f32' % (w, n), 'rb').read(); return struct.unpack('%df' % (len(b) // 4), b)
def ids(n):
    l = [l for l in open('%s/ids-%s.txt' % (w, n)) if 'generated ids' in l.lower()]; return l[-1].strip() if l else 'none'
c = f('cpu'); g = f('gpu'); top = sorted(range(len(c)), key=lambda i: -c[i])[:2]
print('cpu f32 first-step top-2 margin %.4g' % (c[top[0]] - c[top[1]]))
print('gpu max |logit - cpu f32| %.4g, argmax equal %s, 48 greedy ids equal to cpu f32: %s' % (max(abs(a - b) for a, b in zip(g, c)), max(range(len(g)), key=g.__getitem__) == top[0], ids('gpu') == ids('cpu')))
PY
rm -f $W/*.f32
el "checks"; save
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do
  $B/convert bench $M $A > $W/minicpm8b-$i.json; summary $W/minicpm8b-$i.json
  for m in smollm2 qwen2.5 gemma3; do
    $B/convert bench /tmp/$m.bundle $A > $W/$m-$i.json; summary $W/$m-$i.json
    LOWBIT_GPU_MATVEC_LANES=32 $B/convert bench /tmp/$m.bundle $A > $W/$m-l32-$i.json; summary $W/$m-l32-$i.json
  done
  $B/convert bench /tmp/gemma3.old.bundle $A > $W/gemma3-3ops-$i.json; summary $W/gemma3-3ops-$i.json
done
el "bench"; save
$B/gpu_decode_profile $M 512 8 > $W/profile-minicpm8b.md 2>&1; sed -n 1,12p $W/profile-minicpm8b.md
for m in smollm2 qwen2.5 gemma3; do
  $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m.md 2>&1
  LOWBIT_GPU_MATVEC_LANES=32 $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m-l32.md 2>&1
  echo "== $m"; sed -n 3p $W/profile-$m.md; sed -n 3p $W/profile-$m-l32.md
done
$B/gpu_decode_profile /tmp/gemma3.old.bundle 512 8 > $W/profile-gemma3-3ops.md 2>&1; echo "== gemma3, three ops"; sed -n 3p $W/profile-gemma3-3ops.md
el "done"; save
