#!/usr/bin/env bash
# Device run (one nvidia-h200, 2026-12-03, later the same day): grouped-query attention
# (`op_attention_gN`: one workgroup takes N query heads of one KV head and reads each key and
# value once for all of them; N = 8 on the MiniCPM4-8B shape's 16:1 GQA) against one head per
# workgroup (`LOWBIT_GPU_ATTN_GROUP=1`: this source with one head), beside llama.cpp
# b11434's Vulkan backend on the same GGUF in the same command. Then prefill (chunks of 256)
# and decode profiles. Run from the repository root with .gl, .gpubin (stripped convert and
# gpu_decode_profile of the working tree) and .anchor (../shared/anchors/gpu/prepare.sh) carried.
set -u
cd "$(dirname "$0")/../../.."
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
B=$PWD/.gpubin; O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $O/nvidia-smi.txt
t0=$(date +%s)
# llama.cpp: writes /tmp/minicpm8b.gguf, builds, runs llama-bench (pp512, tg128, 3 repeats).
bash .anchor/run.sh -p 512 -n 128 -r 3 > $O/llama-minicpm8b.md 2>$O/llama.err; tail -8 $O/llama-minicpm8b.md
echo "llama.cpp done at $(( $(date +%s) - t0 )) s"
$B/convert gguf-to-ternary -q -o /tmp/new.bundle /tmp/minicpm8b.gguf
echo "bundle made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r.get('info',{}).get('kernel'), 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
$B/convert bench /tmp/new.bundle $A > $O/group-default.json; summary $O/group-default.json
for g in 1 2 4 8; do
  LOWBIT_GPU_ATTN_GROUP=$g $B/convert bench /tmp/new.bundle $A > $O/group-$g.json; summary $O/group-$g.json
done
$B/convert bench /tmp/new.bundle --backend gpu --prompt-tokens 2048 --gen-tokens 16 --repeats 2 --json > $O/pp2048-default.json; summary $O/pp2048-default.json
LOWBIT_GPU_ATTN_GROUP=1 $B/convert bench /tmp/new.bundle --backend gpu --prompt-tokens 2048 --gen-tokens 16 --repeats 2 --json > $O/pp2048-group-1.json; summary $O/pp2048-group-1.json
echo "benches done at $(( $(date +%s) - t0 )) s"
LOWBIT_PROFILE_PREFILL=256 $B/gpu_decode_profile /tmp/new.bundle 256 3 > $O/profile-prefill256.md 2>&1; cat $O/profile-prefill256.md
$B/gpu_decode_profile /tmp/new.bundle 512 8 > $O/profile-decode.md 2>&1; cat $O/profile-decode.md
echo "done at $(( $(date +%s) - t0 )) s"
