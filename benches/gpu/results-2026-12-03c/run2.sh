#!/usr/bin/env bash
# Device run 2 (one nvidia-h200, 2026-12-03): everything in one command on one GPU.
# llama.cpp b11434's Vulkan backend (llama-bench pp512 / tg128, 3 repeats) on the
# MiniCPM4-8B-shape TQ2_0 GGUF and on shape copies of SmolLM2-135M Q4_1 and Qwen2.5-Coder-0.5B
# Q4_K_M (benches/gpu/shape_copy.py: the real files' metadata, names, shapes and types, random
# blocks), then `convert bench --backend gpu` on bundles made from the same files: the
# default, and for the 8B shape the decode attention's measurement knobs
# (LOWBIT_GPU_ATTN_DECODE=0: the former rope_kv + attention; LOWBIT_GPU_ATTN_GRAIN=16, 32),
# pp2048, decode profiles at positions 512 and 2048. Run from the repository root with .gl,
# .gpubin (stripped convert and gpu_decode_profile) and .anchor (prepare.sh's folder, the
# sdist slimmed, with shapes/*.json.gz from `shape_copy.py describe`) carried. Outputs in one
# tarball (the device returns at most 8 files).
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run2; mkdir -p $O $W /tmp/shapes
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-minicpm8b.md 2>$W/llama.err; tail -4 $W/llama-minicpm8b.md
echo "llama.cpp 8B done at $(( $(date +%s) - t0 )) s"
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
for j in .anchor/shapes/*.json.gz; do
  n=$(basename $j .json.gz); gunzip -c $j > /tmp/shapes/$n.json
  PYTHONPATH=/tmp/gguf-site python3 benches/gpu/shape_copy.py generate /tmp/shapes/$n.json /tmp/$n.copy.gguf
  /tmp/llama-vk/bin/llama-bench -m /tmp/$n.copy.gguf -ngl 99 -p 512 -n 128 -r 3 -o md > $W/llama-$n.md 2>&1; tail -3 $W/llama-$n.md
done
echo "llama.cpp copies done at $(( $(date +%s) - t0 )) s"
$B/convert gpu-info > $W/gpu-info.txt 2>&1
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
for n in smollm2 qwen2.5; do $B/convert pack -q -o /tmp/$n.bundle /tmp/$n.copy.gguf; done
echo "bundles made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r.get('info',{}).get('kernel'), 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
$B/convert bench /tmp/minicpm8b.bundle $A > $W/ours-minicpm8b.json; summary $W/ours-minicpm8b.json
for n in smollm2 qwen2.5; do $B/convert bench /tmp/$n.bundle $A > $W/ours-$n.json; summary $W/ours-$n.json; done
LOWBIT_GPU_ATTN_DECODE=0 $B/convert bench /tmp/minicpm8b.bundle $A > $W/minicpm8b-attn-former.json; summary $W/minicpm8b-attn-former.json
for g in 16 32; do LOWBIT_GPU_ATTN_GRAIN=$g $B/convert bench /tmp/minicpm8b.bundle $A > $W/minicpm8b-grain$g.json; summary $W/minicpm8b-grain$g.json; done
$B/convert bench /tmp/minicpm8b.bundle --backend gpu --prompt-tokens 2048 --gen-tokens 128 --repeats 2 --json > $W/minicpm8b-pp2048.json; summary $W/minicpm8b-pp2048.json
LOWBIT_GPU_ATTN_DECODE=0 $B/convert bench /tmp/minicpm8b.bundle --backend gpu --prompt-tokens 2048 --gen-tokens 128 --repeats 2 --json > $W/minicpm8b-pp2048-attn-former.json; summary $W/minicpm8b-pp2048-attn-former.json
echo "benches done at $(( $(date +%s) - t0 )) s"
$B/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $W/profile-decode.md 2>&1; head -12 $W/profile-decode.md
$B/gpu_decode_profile /tmp/minicpm8b.bundle 2048 8 > $W/profile-decode-2048.md 2>&1; head -8 $W/profile-decode-2048.md
LOWBIT_GPU_ATTN_DECODE=0 $B/gpu_decode_profile /tmp/minicpm8b.bundle 2048 8 > $W/profile-decode-2048-attn-former.md 2>&1; head -8 $W/profile-decode-2048-attn-former.md
for n in smollm2 qwen2.5; do $B/gpu_decode_profile /tmp/$n.bundle 512 8 > $W/profile-decode-$n.md 2>&1; head -10 $W/profile-decode-$n.md; done
tar czf $O/run2.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
