#!/usr/bin/env bash
# Device run 3 (one nvidia-h200, 2026-12-03): the grouped kernel (attention_group.wgsl,
# unrolled per head) for prefill chunks only, op_attention_gN with N = 4 by default on the 8B
# shape; decode back on op_attention, the former kernel. Bench with the default, with
# LOWBIT_GPU_ATTN_GROUP=1 (the former prefill attention) and 2; profiles. No llama.cpp this time
# (run 1 of this folder measured it on a machine of the same kind an hour earlier). Outputs in
# one tarball (the device returns at most 8 files).
set -u
cd "$(dirname "$0")/../../.."
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
B=$PWD/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run3; mkdir -p $O $W
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .anchor/gguf-*.whl
PYTHONPATH=/tmp/site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json
$B/convert gguf-to-ternary -q -o /tmp/new.bundle /tmp/minicpm8b.gguf
echo "bundle made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r.get('info',{}).get('kernel'), 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
$B/convert bench /tmp/new.bundle $A > $W/group-default.json; summary $W/group-default.json
for g in 1 2; do
  LOWBIT_GPU_ATTN_GROUP=$g $B/convert bench /tmp/new.bundle $A > $W/group-$g.json; summary $W/group-$g.json
done
$B/convert bench /tmp/new.bundle --backend gpu --prompt-tokens 2048 --gen-tokens 16 --repeats 2 --json > $W/pp2048-default.json; summary $W/pp2048-default.json
echo "benches done at $(( $(date +%s) - t0 )) s"
LOWBIT_PROFILE_PREFILL=256 $B/gpu_decode_profile /tmp/new.bundle 256 3 > $W/profile-prefill256.md 2>&1; cat $W/profile-prefill256.md
$B/gpu_decode_profile /tmp/new.bundle 512 8 > $W/profile-decode.md 2>&1; cat $W/profile-decode.md
tar czf $O/run3.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
