#!/usr/bin/env bash
# Device run 35 (twenty-sixth session, 2026-12-07): run 34's persistent step floor at 264, 330
# and 396 workgroups (396 with the next weights in flight was run 34b's best; 462 and 528 with
# them were not all resident), with a third barrier: the last workgroup to arrive moves a
# generation word in another 128-byte line, which the others poll (`grid barriers
# (generation word)`), where the first form's workgroups poll the arrival count itself. Twice.
# Carry .gpubin (gpu_stream_bench of this commit, stripped) and .anchor (its debs).
set -u
cd "$(dirname "$0")/../../.."
RUN=run35; NO_8B=1; . benches/gpu/device_env.sh
for i in 1 2; do
  timeout 240 $B/gpu_stream_bench persistent 264 330 396 > $W/persistent-$i.md 2>&1
  echo "rc $?"; grep -h "barriers\|checks\|step:" $W/persistent-$i.md | grep -v "no barriers |" 
  el "persistent $i"; tar czf $O/run35.tar.gz -C $W .
done
