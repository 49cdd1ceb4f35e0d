#!/usr/bin/env bash
# Device run 34 (twenty-sixth session, 2026-12-07): the floor of a decode step run as ONE
# persistent dispatch, its ops as phases behind grid-wide barriers built from a storage atomic
# (`gpu_stream_bench persistent 132 264 528`: the same 261 reads as `gpu_stream_bench step`,
# whose chain table it prints first, in the same process), with and without each
# workgroup's next weights in flight across the barrier; twice. Carry .gpubin
# (gpu_stream_bench, built here and stripped) and .anchor (its debs: the Vulkan loader).
set -u
cd "$(dirname "$0")/../../.."
RUN=run34; NO_8B=1; . benches/gpu/device_env.sh
save() { tar czf $O/run34.tar.gz -C $W .; }
for i in 1 2; do
  timeout 240 $B/gpu_stream_bench persistent 132 264 528 > $W/persistent-$i.md 2>&1
  echo "rc $?"; grep -v "^ \|^$" $W/persistent-$i.md | tail -24
  el "persistent $i"; save
done
# Run 34b, on the same warm machine right after (no script of its own; output in run34b/):
#   RUN=run34b; . benches/gpu/device_env.sh; for i in 1 2; do timeout 200 $B/gpu_stream_bench \
#     persistent 264 330 396 462 > $W/persistent-g-$i.md 2>&1; done
