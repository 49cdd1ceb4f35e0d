#!/usr/bin/env bash
# Device run 1 (one nvidia-h200, 2026-12-04, second session): (1) the L2 prefetch of each
# layer product's weight (op_prefetch, LOWBIT_GPU_PREFETCH) beside the latency-bound
# dispatch before the product: first-step logits and greedy ids with and without, decode
# step profiles for several budgets and both placements, `convert bench` off and on;
# (2) what the quantize dispatches in front of the products cost inside the chain
# (LOWBIT_PROFILE_SKIP_PRE: the one-pass step without them, outputs wrong). Carry .gpubin
# and .anchor's debs, generator, gguf wheel and tokenizer.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run1; mkdir -p $O $W
t0=$(date +%s)
for f in .anchor/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/gguf-site .anchor/gguf-*.whl
PYTHONPATH=/tmp/gguf-site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json > $W/gen.log 2>&1
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf >> $W/gen.log 2>&1
echo "bundle at $(( $(date +%s) - t0 )) s"
M=/tmp/minicpm8b.bundle
R8="$B/convert run $M --backend gpu --prompt-ids 1,2345,678,9012,345,6789 --max-tokens 32 --ignore-eos --print-ids"
$R8 --dump-logits $W/logits-off.f32 > $W/run-off.txt 2> $W/ids-off.txt
LOWBIT_GPU_PREFETCH=all $R8 --dump-logits $W/logits-all.f32 > $W/run-all.txt 2> $W/ids-all.txt
python3 - $W <<'PY'
import sys
w = sys.argv[1]
a = open(w + '/logits-off.f32', 'rb').read(); b = open(w + '/logits-all.f32', 'rb').read()
print('first-step logits identical bits:', a == b, len(a) // 4)
ia = [l for l in open(w + '/ids-off.txt') if 'ids' in l.lower()]; ib = [l for l in open(w + '/ids-all.txt') if 'ids' in l.lower()]
print('greedy ids equal:', ia == ib, ia[-1:] if ia else 'no ids line')
PY
rm -f $W/*.f32
P="$B/gpu_decode_profile $M 512 8"
prof() { local tag=$1; shift; env "$@" $P > $W/profile-$tag.md 2>&1; echo "$tag: $(sed -n 2,3p $W/profile-$tag.md | tr '\n' ' ')"; }
prof off X=0
prof all LOWBIT_GPU_PREFETCH=all
prof all-before LOWBIT_GPU_PREFETCH=all LOWBIT_GPU_PREFETCH_AT=before
for mb in 4 8 16; do prof mb$mb LOWBIT_GPU_PREFETCH=$mb; done
prof off2 X=0
for s in ffn_down ffn_gate attn_q ffn_down,ffn_gate,attn_q; do prof "nopre-${s//,/+}" LOWBIT_PROFILE_SKIP_PRE=$s; done
prof all-nopre LOWBIT_GPU_PREFETCH=all LOWBIT_PROFILE_SKIP_PRE=ffn_down,ffn_gate,attn_q
echo "profiles done at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token') or 0, 3))" "$1"; }
$B/convert bench $M $A > $W/bench-off.json; summary $W/bench-off.json
LOWBIT_GPU_PREFETCH=all $B/convert bench $M $A > $W/bench-all.json; summary $W/bench-all.json
tar czf $O/run1.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
