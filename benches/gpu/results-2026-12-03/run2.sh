#!/usr/bin/env bash
# Device run 2 (one nvidia-h200, 2026-12-03): run 1 plus the prefill attention kernel
# (`op_attention_prefill`: 8 queries per workgroup over shared key/value tiles, no combine).
# Bench (pp512, tg128) with the default kernels and with --kernel f32, the prefill profile
# per chunk of 256. Run from the repository root with .gl, .gpubin and .anchor-slim carried.
set -u
cd "$(dirname "$0")/../../.."
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
B=.gpubin; O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $O/nvidia-smi.txt
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .anchor-slim/gguf-*.whl
PYTHONPATH=/tmp/site python3 .anchor-slim/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor-slim/tokenizer.json
$B/convert gguf-to-ternary -q -o /tmp/new.bundle /tmp/minicpm8b.gguf
echo "bundle made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r.get('info',{}).get('kernel'), 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
$B/convert bench /tmp/new.bundle $A > $O/run2-int8-minicpm8b.json; summary $O/run2-int8-minicpm8b.json
$B/convert bench /tmp/new.bundle $A --kernel f32 > $O/run2-f32-minicpm8b.json; summary $O/run2-f32-minicpm8b.json
$B/convert bench /tmp/new.bundle --backend gpu --prompt-tokens 2048 --gen-tokens 16 --repeats 2 --json > $O/run2-pp2048-minicpm8b.json; summary $O/run2-pp2048-minicpm8b.json
echo "benches done at $(( $(date +%s) - t0 )) s"
LOWBIT_PROFILE_PREFILL=256 $B/gpu_decode_profile /tmp/new.bundle 256 3 > $O/run2-profile-prefill256.md 2>&1; cat $O/run2-profile-prefill256.md
echo "done at $(( $(date +%s) - t0 )) s"
