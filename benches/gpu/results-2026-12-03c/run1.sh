#!/usr/bin/env bash
# Device run 1 (one nvidia-h200, 2026-12-03, third session of the day): the decode attention
# with subgroup clusters and splits that follow the position (op_attention_decode) against
# the former decode attention (LOWBIT_GPU_ATTN_DECODE=0: op_rope_kv + op_attention); RoPE and the
# KV store folded into the new one, and the Q6_K matvec
# that reads each byte of a block once (the 8B shape's output head). MiniCPM4-8B-shape TQ2_0
# from the anchor's generator. Then decode profiles of both. Run from the repository root
# with .gl, .gpubin (stripped convert and gpu_decode_profile) and .anchor carried; outputs
# in one tarball (the device returns at most 8 files).
set -u
cd "$(dirname "$0")/../../.."
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
B=$PWD/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run1; mkdir -p $O $W
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .anchor/gguf-*.whl
PYTHONPATH=/tmp/site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json
$B/convert gguf-to-ternary -q -o /tmp/new.bundle /tmp/minicpm8b.gguf
echo "bundle made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r.get('info',{}).get('kernel'), 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
$B/convert bench /tmp/new.bundle $A > $W/default.json; summary $W/default.json
LOWBIT_GPU_ATTN_DECODE=0 $B/convert bench /tmp/new.bundle $A > $W/attn-former.json; summary $W/attn-former.json
$B/convert bench /tmp/new.bundle --backend gpu --prompt-tokens 2048 --gen-tokens 128 --repeats 2 --json > $W/pp2048-default.json; summary $W/pp2048-default.json
LOWBIT_GPU_ATTN_DECODE=0 $B/convert bench /tmp/new.bundle --backend gpu --prompt-tokens 2048 --gen-tokens 128 --repeats 2 --json > $W/pp2048-attn-former.json; summary $W/pp2048-attn-former.json
echo "benches done at $(( $(date +%s) - t0 )) s"
$B/gpu_decode_profile /tmp/new.bundle 512 8 > $W/profile-decode.md 2>&1; cat $W/profile-decode.md
LOWBIT_GPU_ATTN_DECODE=0 $B/gpu_decode_profile /tmp/new.bundle 512 8 > $W/profile-decode-attn-former.md 2>&1; head -8 $W/profile-decode-attn-former.md
$B/gpu_decode_profile /tmp/new.bundle 2048 8 > $W/profile-decode-2048.md 2>&1; head -8 $W/profile-decode-2048.md
tar czf $O/run1.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
