#!/usr/bin/env bash
# Device run 4 (one nvidia-h200, 2026-12-05, seventh session): the committed build (run 3's
# with the quads body back to run 2's, without groups of lanes) beside llama.cpp b11434's
# Vulkan backend in one command: the 8B-shape TQ2_0 GGUF and the SmolLM2, Qwen2.5 and Gemma 3
# shape copies (llama-bench pp512 / tg128, three repeats; `convert bench` the same, two
# runs); 8B first-step logits and 48 greedy ids against the CPU f32 reference; decode
# profiles. Carry .gpubin (bin.tar.xz: convert, gpu_decode_profile) and .anchor (with its
# llama.cpp tarball, repacked as in results-2026-12-04d). Output: one tarball, rewritten
# after each phase (a run returns at most a few files).
set -u
cd "$(dirname "$0")/../../.."
RUN=run4; . benches/gpu/device_env.sh
save() { tar czf $O/run4.tar.gz -C $W .; } # after each phase: what ran comes back if time runs out
bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-minicpm8b.md 2>$W/llama.err; grep "Vulkan " $W/llama-minicpm8b.md
copies
for m in smollm2 qwen2.5 gemma3; do
  MODEL=/tmp/$m.copy.gguf bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-$m.md 2>>$W/llama.err; grep "Vulkan " $W/llama-$m.md
done
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
  done
done
el "bench"; save
$B/gpu_decode_profile $M 512 8 > $W/profile-minicpm8b.md 2>&1; sed -n 1,12p $W/profile-minicpm8b.md
for m in smollm2 qwen2.5 gemma3; do
  $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m.md 2>&1
  echo "== $m"; sed -n 3,10p $W/profile-$m.md
done
el "done"; save
