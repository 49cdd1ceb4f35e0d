#!/usr/bin/env bash
# Device run 1 for branch gpu-fuse (commit 1d736af): before (.gpubin/convert-before, the
# subgroup-rows build of the last session) and after, MiniCPM4-8B-shape ternary bundle.
set -u
cd "$(dirname "$0")/.."
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
B=.gpubin; O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $O/nvidia-smi.txt
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .anchor-slim/gguf-*.whl
PYTHONPATH=/tmp/site python3 .anchor-slim/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor-slim/tokenizer.json
echo "gguf made in $(( $(date +%s) - t0 )) s"
$B/convert gpu-info > $O/gpu-info.txt
$B/convert gguf-to-ternary -q -o /tmp/new.bundle /tmp/minicpm8b.gguf
$B/convert-before add-kernels -q /tmp/new.bundle -o /tmp/old.bundle
echo "bundles made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
$B/convert-before bench /tmp/old.bundle $A > $O/before-minicpm8b.json; summary $O/before-minicpm8b.json
$B/convert bench /tmp/new.bundle $A > $O/after-minicpm8b.json; summary $O/after-minicpm8b.json
$B/convert bench /tmp/new.bundle $A --gpu-no-subgroups > $O/after-nosg-minicpm8b.json; summary $O/after-nosg-minicpm8b.json
$B/gpu_decode_profile /tmp/new.bundle 512 8 > $O/profile-after.md 2>&1; cat $O/profile-after.md
echo "done at $(( $(date +%s) - t0 )) s"
