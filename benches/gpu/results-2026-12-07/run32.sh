#!/usr/bin/env bash
# Device run 32 (twenty-fourth session, 2026-12-07; asked for nvidia-h200, given an H100 on a
# fresh machine): run 29's `gpu_stream_bench step`, twice. Carry .gl and .gpubin as run 29.
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/nvidia-smi.txt 2>&1
for i in 1 2; do timeout 200 .gpubin/gpu_stream_bench step > $OUT/step-$i.md 2>&1; done
