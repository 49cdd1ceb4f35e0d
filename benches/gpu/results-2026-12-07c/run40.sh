#!/usr/bin/env bash
# Device run 40 (prepared in the twenty-sixth session, 2026-12-07; not yet run): the combine's
# per-head reductions (M and sum w l over the splits, one invocation a head walking every
# split) as four chains in four invocations each, combined in the vector form's order
# (variants/c2; the same bits: checked on lavapipe at positions 100-470 of the tiny MiniCPM),
# and c2 with c1's four groups a pass (variants/c12); and the decode attention in workgroups
# of 128 (variants/w128: tiles of 32 positions, one tile a split at the grain of 32 where
# tiles of 16 take two round trips; NOT the same bits: the tile is the online softmax's
# unit, so its rounding moves, by up to 1e-6 in the tiny MiniCPM's logits on lavapipe; a
# timing probe first); and a probe with wrong outputs, p_attn_fewbar (the attention's tile
# loop without its two write-after-read barriers: what two barriers a tile cost), against
# the kernels of the bundle, at
# positions 512 and 2048, alternating, each with gpu_decode_profile's logits check. Carry
# .gpubin (convert, gpu_decode_profile, and variants/ built from the patches by
# `variants/make.sh .gpubin/gpu_decode_profile BUNDLE .gpubin/variants` with that binary: the
# bundle's kernels must be the ones the patches edit) and .anchor.
set -u
cd "$(dirname "$0")/../../.."
RUN=run40; . benches/gpu/device_env.sh
V=$B/variants
save() { tar czf $O/run40.tar.gz -C $W .; }
[ -d /tmp/minicpm8b.bundle ] || $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
el "setup"
export LOWBIT_GPU_UNCHECKED=1
prof() { # NAME POS [VARIANT]
  if [ -n "${3:-}" ]; then LOWBIT_PROFILE_SOURCES=$V/$3 $B/gpu_decode_profile /tmp/minicpm8b.bundle $2 8 > $W/profile-$1.md 2>&1
  else $B/gpu_decode_profile /tmp/minicpm8b.bundle $2 8 > $W/profile-$1.md 2>&1; fi
  echo "== $1"; grep -h "logits\|step (one pass)\|op_attention\|Error" $W/profile-$1.md | sed 's/items in passes.*//'
}
for pos in 512 2048; do
  for i in 1 2; do prof base-$pos-$i $pos; prof c2-$pos-$i $pos c2; prof c12-$pos-$i $pos c12; prof w128-$pos-$i $pos w128; done
  prof p_attn_fewbar-$pos $pos p_attn_fewbar
  el "$pos"; save
done
