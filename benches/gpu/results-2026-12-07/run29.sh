#!/usr/bin/env bash
# Device run 29 (twenty-fourth session, 2026-12-07; asked for nvidia-h200, given an H100): the
# floor of a one-op-per-dispatch decode step of the 8B ternary shape, `gpu_stream_bench step`
# (three times), then the read roofline table (`gpu_stream_bench` at its default sizes).
# Carry .gl (Debian's libvulkan1, libegl1, libglvnd0 as .debs, /work/.library/device/README.md)
# and .gpubin (gpu_stream_bench, built here and stripped).
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/nvidia-smi.txt 2>&1
for i in 1 2 3; do timeout 200 .gpubin/gpu_stream_bench step > $OUT/step-$i.md 2>&1; done
timeout 200 .gpubin/gpu_stream_bench > $OUT/stream.md 2>&1
