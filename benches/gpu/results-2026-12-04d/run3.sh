#!/usr/bin/env bash
# Device run 3 (one nvidia-h200, 2026-12-04, fourth session): the committed build (the
# quantize-RMSNorm kernel's loads at once, the combine's first 16 splits' values loaded
# before its barriers, the single-token GGUF bodies with named rows) beside llama.cpp b11434's
# Vulkan backend in one command: the 8B-shape TQ2_0 GGUF (pp512, tg128) and shape copies of
# SmolLM2-135M Q4_1, Qwen2.5-Coder-0.5B Q4_K_M and Gemma 3 270M Q4_K_M
# (benches/gpu/shape_copy.py from .anchor/shapes/*.json.gz); first-step logits and 48 greedy
# ids of a 40-token prompt on the 8B shape against the CPU f32 reference; the decode profile.
# Carry .gpubin (convert, gpu_decode_profile) and .anchor (its llama.cpp tarball without
# models/, docs/, benches/, tools/ui and the other GPU backends' sources, which the Vulkan
# build does not read: under the 64 MiB a run carries).
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run3; mkdir -p $O $W /tmp/shapes
t0=$(date +%s); el() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-minicpm8b.md 2>$W/llama.err; tail -3 $W/llama-minicpm8b.md
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
for m in smollm2 qwen2.5 gemma3; do
  gunzip -c .anchor/shapes/$m.json.gz > /tmp/shapes/$m.json
  PYTHONPATH=/tmp/gguf-site python3 benches/gpu/shape_copy.py generate /tmp/shapes/$m.json /tmp/$m.copy.gguf > /dev/null
  MODEL=/tmp/$m.copy.gguf bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-$m.md 2>>$W/llama.err; tail -2 $W/llama-$m.md
  rm -rf /tmp/$m.bundle; $B/convert pack -q -o /tmp/$m.bundle /tmp/$m.copy.gguf
done
el "llama.cpp"
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
el "checks"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token') or 0, 3))" "$1"; }
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do
  $B/convert bench $M $A > $W/minicpm8b-$i.json; summary $W/minicpm8b-$i.json
  for m in smollm2 qwen2.5 gemma3; do
    $B/convert bench /tmp/$m.bundle $A > $W/$m-$i.json; summary $W/$m-$i.json
  done
done
$B/gpu_decode_profile $M 512 8 > $W/profile-minicpm8b.md 2>&1; sed -n 1,12p $W/profile-minicpm8b.md
tar czf $O/run3.tar.gz -C $W .
el "done"
