#!/usr/bin/env bash
# Device run 4 (one nvidia-h200, 2026-12-03): Qwen2.5-Coder-0.5B's Q/K/V biases in the GGUF
# products' epilogue (store.wgsl's bias epilogue: 72 op_bias_add dispatches a step fewer)
# against LOWBIT_GPU_BIAS_EPILOGUE=0, on the shape copy of the real file
# (benches/gpu/shape_copy.py); llama.cpp's figure is run 2 of results-2026-12-03c (not rerun).
# Carry .gl, .gpubin (stripped convert, gpu_decode_profile), .anchor's gguf wheel and shapes/.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run4; mkdir -p $O $W /tmp/shapes
t0=$(date +%s)
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/gguf-site .anchor/gguf-*.whl
gunzip -c .anchor/shapes/qwen2.5.json.gz > /tmp/shapes/qwen2.5.json
PYTHONPATH=/tmp/gguf-site python3 benches/gpu/shape_copy.py generate /tmp/shapes/qwen2.5.json /tmp/qwen2.5.copy.gguf
$B/convert pack -q -o /tmp/qwen2.5.bundle /tmp/qwen2.5.copy.gguf
echo "bundle made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r.get('info',{}).get('kernel'), 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
for i in 1 2; do
  $B/convert bench /tmp/qwen2.5.bundle $A > $W/qwen2.5-$i.json; summary $W/qwen2.5-$i.json
  LOWBIT_GPU_BIAS_EPILOGUE=0 $B/convert bench /tmp/qwen2.5.bundle $A > $W/qwen2.5-bias-op-$i.json; summary $W/qwen2.5-bias-op-$i.json
done
$B/gpu_decode_profile /tmp/qwen2.5.bundle 512 8 > $W/profile-decode-qwen2.5.md 2>&1; head -14 $W/profile-decode-qwen2.5.md
LOWBIT_GPU_BIAS_EPILOGUE=0 $B/gpu_decode_profile /tmp/qwen2.5.bundle 512 8 > $W/profile-decode-qwen2.5-bias-op.md 2>&1; head -3 $W/profile-decode-qwen2.5-bias-op.md
tar czf $O/run4.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
