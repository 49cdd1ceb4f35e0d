#!/usr/bin/env bash
# Device run 38 (twenty-sixth session, 2026-12-07): the combine's groups of splits after the
# preloaded ones taken several at a time, every load of them issued before the first add
# (variants/c1: 4 groups, 16 splits, a pass; c1b: 2 groups), where the shipped loop loads a
# group, waits, adds, loads the next: the same additions in the same order (the logits
# check says so). Baseline and variants alternate at position 512 (17 splits: 16 preloaded,
# one group after them: c1 changes little there), then base and c1 at 2048 (65 splits: 13
# groups after the preloaded, 4 passes of c1). As run37.sh otherwise (the variants built by
# variants/make.sh into .gpubin/variants).
set -u
cd "$(dirname "$0")/../../.."
RUN=run38; . benches/gpu/device_env.sh
V=$B/variants
save() { tar czf $O/run38.tar.gz -C $W .; }
[ -d /tmp/minicpm8b.bundle ] || $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
el "setup"
export LOWBIT_GPU_UNCHECKED=1
prof() { # NAME POS [VARIANT]
  if [ -n "${3:-}" ]; then LOWBIT_PROFILE_SOURCES=$V/$3 $B/gpu_decode_profile /tmp/minicpm8b.bundle $2 8 > $W/profile-$1.md 2>&1
  else $B/gpu_decode_profile /tmp/minicpm8b.bundle $2 8 > $W/profile-$1.md 2>&1; fi
  echo "== $1"; grep -h "logits\|step (one pass)\|op_attention\|Error" $W/profile-$1.md | sed 's/items in passes.*//'
}
for i in 1 2; do prof base-512-$i 512; prof c1-512-$i 512 c1; prof c1b-512-$i 512 c1b; done
el "512"; save
for i in 1 2; do prof base-2048-$i 2048; prof c1-2048-$i 2048 c1; done
el "2048"; save
# On an H200 also run 35's floors (the chain's and the persistent dispatch's).
if grep -q H200 $W/nvidia-smi.txt; then
  timeout 200 $B/gpu_stream_bench persistent 264 330 396 > $W/persistent.md 2>&1
  grep -h "barriers\|checks\|step:" $W/persistent.md | grep -v "no barriers |"
  el "persistent"; save
fi
