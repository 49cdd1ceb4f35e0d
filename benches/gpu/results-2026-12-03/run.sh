#!/usr/bin/env bash
# Device run (one nvidia-h200, 2026-12-03): the int8 prefill product of the ternary weights
# (`weights_ternary2_mmq_*` after `weights_q8_quantize_wg64`, the default) against the f32
# prefill product of the same binary (--kernel f32), on the MiniCPM4-8B-shape TQ2_0 model:
# bench both ways (pp512 and tg128), then prefill chunks of 256 profiled op by op and a decode
# profile. Run from the repository root with .gl, .gpubin (stripped convert and
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
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r.get('info',{}).get('kernel'), 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
$B/convert bench /tmp/new.bundle $A > $O/int8-minicpm8b.json; summary $O/int8-minicpm8b.json
$B/convert bench /tmp/new.bundle $A --kernel f32 > $O/f32-minicpm8b.json; summary $O/f32-minicpm8b.json
echo "benches done at $(( $(date +%s) - t0 )) s"
LOWBIT_PROFILE_PREFILL=256 $B/gpu_decode_profile /tmp/new.bundle 256 3 > $O/profile-prefill256.md 2>&1; cat $O/profile-prefill256.md
$B/gpu_decode_profile /tmp/new.bundle 512 8 > $O/profile-decode.md 2>&1; cat $O/profile-decode.md
echo "done at $(( $(date +%s) - t0 )) s"
