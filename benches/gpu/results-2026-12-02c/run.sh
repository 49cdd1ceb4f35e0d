#!/usr/bin/env bash
# Device run (one nvidia-h200, 2026-12-02): the combine reading only the splits that hold
# positions, and a trial op_rms_norm with its 16 loads per invocation issued together (kept in
# registers for the output pass), on the MiniCPM4-8B-shape TQ2_0 model; the decode bench
# and the per-dispatch profile (compare run3 of results-2026-12-02b). The rms_norm trial did
# not help (18.6 us per item against 17.0 before) and was reverted; the combine went from
# 24.9 to 11.8 us. Run from the repository root with .gl, .gpubin (stripped convert and
# gpu_decode_profile of the working tree) and .anchor-slim carried.
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
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
$B/convert bench /tmp/new.bundle $A > $O/after-minicpm8b.json; summary $O/after-minicpm8b.json
$B/gpu_decode_profile /tmp/new.bundle 512 8 > $O/profile.md 2>&1; cat $O/profile.md
$B/convert bench /tmp/new.bundle $A > $O/after2-minicpm8b.json; summary $O/after2-minicpm8b.json
echo "done at $(( $(date +%s) - t0 )) s"
