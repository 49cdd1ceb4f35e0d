#!/usr/bin/env bash
# Device run 3 (one nvidia-h200, 2026-12-03): prefill attention split into more, shorter
# ranges of positions (LOWBIT_GPU_PREFILL_SPLIT=P positions per split, a measurement knob
# removed afterwards; default 1024 for the 4096-position context: one split below position
# 1024), pp512 and pp2048 each way. Carried: .gl, .gpubin, .anchor-slim.
set -u
cd "$(dirname "$0")/../../.."
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
B=.gpubin; O=${OUT:-/tmp/out}; mkdir -p $O
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .anchor-slim/gguf-*.whl
PYTHONPATH=/tmp/site python3 .anchor-slim/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor-slim/tokenizer.json
$B/convert gguf-to-ternary -q -o /tmp/new.bundle /tmp/minicpm8b.gguf
echo "bundle made at $(( $(date +%s) - t0 )) s"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r.get('info',{}).get('kernel'), 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1))" "$1"; }
for P in 1024 256 64; do
  LOWBIT_GPU_PREFILL_SPLIT=$P $B/convert bench /tmp/new.bundle --backend gpu --prompt-tokens 512 --gen-tokens 8 --repeats 3 --json > $O/run3-split$P-pp512.json; summary $O/run3-split$P-pp512.json
  LOWBIT_GPU_PREFILL_SPLIT=$P $B/convert bench /tmp/new.bundle --backend gpu --prompt-tokens 2048 --gen-tokens 8 --repeats 2 --json > $O/run3-split$P-pp2048.json; summary $O/run3-split$P-pp2048.json
done
LOWBIT_GPU_PREFILL_SPLIT=256 LOWBIT_PROFILE_PREFILL=256 $B/gpu_decode_profile /tmp/new.bundle 256 3 > $O/run3-profile-split256.md 2>&1; head -8 $O/run3-profile-split256.md
echo "done at $(( $(date +%s) - t0 )) s"
