#!/usr/bin/env bash
# Device run 3 (one nvidia-h200, 2026-12-03): the committed default (x quantized once per
# ternary decode product, q8g `r8_wg128_sgrows2_p2` in all four products) beside llama.cpp
# b11434's Vulkan backend on the MiniCPM4-8B-shape TQ2_0 GGUF in one command; the former
# kernel (LOWBIT_GPU_Q8_PRE=0) and decode profiles at positions 512 and 2048. Carry .gl,
# .gpubin (stripped convert and gpu_decode_profile only: the carry limit) and .anchor
# (prepare.sh's folder, the sdist slimmed).
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run3; mkdir -p $O $W
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-minicpm8b.md 2>$W/llama.err; tail -4 $W/llama-minicpm8b.md
echo "llama.cpp done at $(( $(date +%s) - t0 )) s"
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
echo "bundle made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r.get('info',{}).get('kernel'), 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
for i in 1 2; do
  $B/convert bench /tmp/minicpm8b.bundle $A > $W/ours-minicpm8b-$i.json; summary $W/ours-minicpm8b-$i.json
done
LOWBIT_GPU_Q8_PRE=0 $B/convert bench /tmp/minicpm8b.bundle $A > $W/minicpm8b-q8pre0.json; summary $W/minicpm8b-q8pre0.json
$B/convert bench /tmp/minicpm8b.bundle --backend gpu --prompt-tokens 2048 --gen-tokens 128 --repeats 2 --json > $W/minicpm8b-pp2048.json; summary $W/minicpm8b-pp2048.json
echo "benches done at $(( $(date +%s) - t0 )) s"
$B/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $W/profile-decode.md 2>&1; head -20 $W/profile-decode.md
$B/gpu_decode_profile /tmp/minicpm8b.bundle 2048 8 > $W/profile-decode-2048.md 2>&1; head -3 $W/profile-decode-2048.md
tar czf $O/run3.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
