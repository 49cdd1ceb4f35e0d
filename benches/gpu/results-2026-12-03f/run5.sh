#!/usr/bin/env bash
# Device run 5 (one nvidia-h200, 2026-12-03, sixth session): the committed candidate (the
# single-token body with 2 rows a workgroup, MATVEC_ROWS = 2, and the split per weight) beside
# llama.cpp b11434's Vulkan backend on the 8B-shape TQ2_0 GGUF and the SmolLM2 and Qwen2.5
# shape copies; decode profiles at position 512 (the 8B's Q6_K head runs the r2 Q6_K body).
# Carry .gpubin and .anchor.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run5; mkdir -p $O $W /tmp/shapes
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-minicpm8b.md 2>$W/llama.err; tail -3 $W/llama-minicpm8b.md
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
for m in smollm2 qwen2.5; do
  gunzip -c .anchor/shapes/$m.json.gz > /tmp/shapes/$m.json
  PYTHONPATH=/tmp/gguf-site python3 benches/gpu/shape_copy.py generate /tmp/shapes/$m.json /tmp/$m.copy.gguf > /dev/null
  MODEL=/tmp/$m.copy.gguf bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-$m.md 2>>$W/llama.err; tail -2 $W/llama-$m.md
  $B/convert pack -q -o /tmp/$m.bundle /tmp/$m.copy.gguf
done
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
echo "bundles made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'))" "$1"; }
for m in minicpm8b smollm2 qwen2.5; do
  for i in 1 2; do $B/convert bench /tmp/$m.bundle $A > $W/ours-$m-$i.json; summary $W/ours-$m-$i.json; done
  $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m.md 2>&1
  echo "$m: $(sed -n 3p $W/profile-$m.md)"; grep 'output.weight\|token_embd' $W/profile-$m.md
done
tar czf $O/run5.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
