#!/usr/bin/env bash
# Device run 5 (one nvidia-h200, 2026-12-03, fifth session): the committed default (decode
# attention D of run 4: WG 64, clusters of 4, tiles of 16 read at once, cache words by
# unpack2x16float, empty splits exit early, grain 32) beside llama.cpp b11434's Vulkan
# backend in one command, on the MiniCPM4-8B-shape TQ2_0 GGUF and the SmolLM2 and Qwen2.5
# shape copies; `LOWBIT_GPU_ATTN_DECODE=0` (op_rope_kv + op_attention) in the same run;
# decode profiles at positions 512 and 2048. Carry .gl, .gpubin (stripped convert and
# gpu_decode_profile) and .anchor (prepare.sh's folder, the sdist slimmed, shapes/).
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run5; mkdir -p $O $W /tmp/shapes
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-minicpm8b.md 2>$W/llama.err; tail -4 $W/llama-minicpm8b.md
echo "llama.cpp 8B done at $(( $(date +%s) - t0 )) s"
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
for m in smollm2 qwen2.5; do
  gunzip -c .anchor/shapes/$m.json.gz > /tmp/shapes/$m.json
  PYTHONPATH=/tmp/gguf-site python3 benches/gpu/shape_copy.py generate /tmp/shapes/$m.json /tmp/$m.copy.gguf > /dev/null
  MODEL=/tmp/$m.copy.gguf bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-$m.md 2>>$W/llama.err; tail -3 $W/llama-$m.md
  $B/convert pack -q -o /tmp/$m.bundle /tmp/$m.copy.gguf
done
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
echo "bundles made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r.get('info',{}).get('kernel'), 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
for m in minicpm8b smollm2 qwen2.5; do
  for i in 1 2; do $B/convert bench /tmp/$m.bundle $A > $W/ours-$m-$i.json; summary $W/ours-$m-$i.json; done
  LOWBIT_GPU_ATTN_DECODE=0 $B/convert bench /tmp/$m.bundle $A > $W/ours-$m-attn-decode0.json; summary $W/ours-$m-attn-decode0.json
done
$B/convert bench /tmp/minicpm8b.bundle --backend gpu --prompt-tokens 2048 --gen-tokens 128 --repeats 2 --json > $W/minicpm8b-pp2048.json; summary $W/minicpm8b-pp2048.json
LOWBIT_GPU_ATTN_DECODE=0 $B/convert bench /tmp/minicpm8b.bundle --backend gpu --prompt-tokens 2048 --gen-tokens 128 --repeats 2 --json > $W/minicpm8b-pp2048-attn-decode0.json; summary $W/minicpm8b-pp2048-attn-decode0.json
echo "benches done at $(( $(date +%s) - t0 )) s"
for pos in 512 2048; do
  $B/gpu_decode_profile /tmp/minicpm8b.bundle $pos 8 > $W/profile-decode-$pos.md 2>&1
  echo "pos $pos: $(sed -n 2,3p $W/profile-decode-$pos.md | tr '\n' ' ')"; head -20 $W/profile-decode-$pos.md | tail -16
done
tar czf $O/run5.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
