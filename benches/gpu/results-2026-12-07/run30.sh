#!/usr/bin/env bash
# Device run 30 (the same warm H100 as run 29): the 8B-shape bundle's real decode beside the
# floor: the anchor generator's TQ2_0 GGUF, `gguf-to-ternary`, `gpu_stream_bench step` before
# and after, `convert bench --backend gpu` twice, `gpu_decode_profile` at position 512.
# Carry .gl, .gpubin (convert, gpu_decode_profile, gpu_stream_bench) and .anchor
# (../shared/anchors/gpu/gen_minicpm8b.py, the gguf 0.19.0 wheel, SmolLM2's tokenizer as
# prepare.sh writes it).
t0=$(date +%s)
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/nvidia-smi-2.txt 2>&1
python3 -m pip install -q --no-index --no-deps --target /tmp/gguf-site .anchor/gguf-0.19.0-py3-none-any.whl
PYTHONPATH=/tmp/gguf-site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json > /dev/null
echo "gen $(( $(date +%s) - t0 )) s"
.gpubin/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
echo "pack $(( $(date +%s) - t0 )) s"
.gpubin/gpu_stream_bench step > $OUT/step-4.md 2>&1
for i in 1 2; do
  .gpubin/convert bench /tmp/minicpm8b.bundle --backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 > $OUT/bench-$i.txt 2>&1
done
.gpubin/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $OUT/profile.md 2>&1
.gpubin/gpu_stream_bench step > $OUT/step-5.md 2>&1
echo "end $(( $(date +%s) - t0 )) s"
