#!/usr/bin/env bash
# Device run 2 (one nvidia-h200, 2026-12-03, sixth session): the staged single-token body
# (matvec_staged.wgsl: a workgroup's rows and x copied into workgroup memory first) against
# matvec.wgsl in the same binary (LOWBIT_GPU_MATVEC_STAGED=0), both with the split per
# weight of run 1, beside llama.cpp b11434's Vulkan backend, on the SmolLM2 and Qwen2.5 shape
# copies (packed, and 4-bit uniform palettes) and the 8B shape; decode profiles at position
# 512. Carry .gpubin (stripped convert and gpu_decode_profile) and .anchor.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run2; mkdir -p $O $W /tmp/shapes
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-minicpm8b.md 2>$W/llama.err; tail -3 $W/llama-minicpm8b.md
echo "llama.cpp 8B done at $(( $(date +%s) - t0 )) s"
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
for m in smollm2 qwen2.5; do
  gunzip -c .anchor/shapes/$m.json.gz > /tmp/shapes/$m.json
  PYTHONPATH=/tmp/gguf-site python3 benches/gpu/shape_copy.py generate /tmp/shapes/$m.json /tmp/$m.copy.gguf > /dev/null
  MODEL=/tmp/$m.copy.gguf bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-$m.md 2>>$W/llama.err; tail -2 $W/llama-$m.md
  $B/convert pack -q -o /tmp/$m.bundle /tmp/$m.copy.gguf
  $B/convert palettize -q --bits 4 --group-size 32 --mode uniform --context 512 -o /tmp/$m-pal4.bundle /tmp/$m.copy.gguf
done
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
echo "bundles made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'))" "$1"; }
for m in smollm2 qwen2.5 smollm2-pal4 qwen2.5-pal4; do
  for i in 1 2; do
    $B/convert bench /tmp/$m.bundle $A > $W/ours-$m-$i.json; summary $W/ours-$m-$i.json
    LOWBIT_GPU_MATVEC_STAGED=0 $B/convert bench /tmp/$m.bundle $A > $W/ours-$m-unstaged-$i.json; summary $W/ours-$m-unstaged-$i.json
  done
  $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m.md 2>&1
  LOWBIT_GPU_MATVEC_STAGED=0 $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m-unstaged.md 2>&1
  for p in $W/profile-$m.md $W/profile-$m-unstaged.md; do echo "$(basename $p): $(sed -n 3p $p)"; done
done
$B/convert bench /tmp/minicpm8b.bundle $A > $W/ours-minicpm8b.json; summary $W/ours-minicpm8b.json
head -22 $W/profile-qwen2.5.md; head -14 $W/profile-smollm2.md | tail -9
tar czf $O/run2.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
