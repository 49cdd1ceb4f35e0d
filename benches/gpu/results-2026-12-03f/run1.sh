#!/usr/bin/env bash
# Device run 1 (one nvidia-h200, 2026-12-03, sixth session): the single-token GGUF product's
# split chosen per weight (matvec_split: invocations per row from K, rows per workgroup from
# the weight's rows) against the kernel's former split forced in the same binary
# (LOWBIT_GPU_MATVEC_LANES=64 LOWBIT_GPU_MATVEC_WG_ROWS=4), beside llama.cpp b11434's Vulkan
# backend, on the SmolLM2 and Qwen2.5 shape copies and the MiniCPM4-8B-shape TQ2_0 GGUF;
# decode profiles at position 512 with rows per workgroup forced to 1, 2 and 4. Carry
# .gpubin (stripped convert and gpu_decode_profile) and .anchor (prepare.sh's folder, the
# sdist slimmed, shapes/).
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run1; mkdir -p $O $W /tmp/shapes
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
done
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
echo "bundles made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'))" "$1"; }
former() { LOWBIT_GPU_MATVEC_LANES=64 LOWBIT_GPU_MATVEC_WG_ROWS=4 "$@"; }
for m in smollm2 qwen2.5; do
  for i in 1 2; do
    $B/convert bench /tmp/$m.bundle $A > $W/ours-$m-$i.json; summary $W/ours-$m-$i.json
    former $B/convert bench /tmp/$m.bundle $A > $W/ours-$m-former-$i.json; summary $W/ours-$m-former-$i.json
  done
  $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m.md 2>&1
  former $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m-former.md 2>&1
  for r in 1 2 4; do
    LOWBIT_GPU_MATVEC_WG_ROWS=$r $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m-wgrows$r.md 2>&1
  done
  for p in $W/profile-$m*.md; do echo "$(basename $p): $(sed -n 3p $p)"; done
done
$B/convert bench /tmp/minicpm8b.bundle $A > $W/ours-minicpm8b.json; summary $W/ours-minicpm8b.json
former $B/convert bench /tmp/minicpm8b.bundle $A > $W/ours-minicpm8b-former.json; summary $W/ours-minicpm8b-former.json
$B/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $W/profile-minicpm8b.md 2>&1
echo "8B: $(sed -n 3p $W/profile-minicpm8b.md)"
head -24 $W/profile-qwen2.5.md; head -24 $W/profile-qwen2.5-former.md
tar czf $O/run1.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
