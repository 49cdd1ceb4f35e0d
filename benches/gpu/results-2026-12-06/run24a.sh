#!/usr/bin/env bash
# Device run 24a (fourteenth session, 2026-12-06): run24.sh cut to what fits the session's
# last device minutes (the device refused five starts): on the 8B shape, the one-dispatch
# decode attention (LOWBIT_GPU_ATTN_ONE=1; off by default) against the split attention with its combine (the default),
# `convert bench` alternating, decode profiles of both at position 512, greedy ids and
# first-step logits of the default against the CPU f32 reference. Partial results are saved
# after each stage.
set -u
cd "$(dirname "$0")/../../.."
RUN=run24a; . benches/gpu/device_env.sh
save() { tar czf $O/run24a.tar.gz -C $W .; }
el "gen 8B"
rm -rf /tmp/minicpm8b.bundle
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
el "pack 8B"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 2 --json"
LOWBIT_GPU_ATTN_ONE=1 $B/convert bench /tmp/minicpm8b.bundle $A > $W/minicpm8b-one-1.json; summary $W/minicpm8b-one-1.json
$B/convert bench /tmp/minicpm8b.bundle $A > $W/minicpm8b-split-1.json; summary $W/minicpm8b-split-1.json
el "bench 8B"; save
LOWBIT_GPU_ATTN_ONE=1 $B/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $W/profile-minicpm8b-one.md 2>&1
$B/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $W/profile-minicpm8b-split.md 2>&1
for f in one split; do echo "$f: $(grep -h "dispatches per step\|step (one pass)" $W/profile-minicpm8b-$f.md | tr '\n' ' ')"; grep -h "op_attention" $W/profile-minicpm8b-$f.md | sed 's/^/  /'; done
el "profile 8B"; save
LOWBIT_GPU_ATTN_ONE=1 $B/convert bench /tmp/minicpm8b.bundle $A > $W/minicpm8b-one-2.json; summary $W/minicpm8b-one-2.json
$B/convert bench /tmp/minicpm8b.bundle $A > $W/minicpm8b-split-2.json; summary $W/minicpm8b-split-2.json
el "bench 8B again"; save
echo "8B one:" >> $W/checks.txt; LOWBIT_GPU_ATTN_ONE=1 greedy_check /tmp/minicpm8b.bundle 48
el "checks 8B"; save
