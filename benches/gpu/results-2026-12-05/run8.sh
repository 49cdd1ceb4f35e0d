#!/usr/bin/env bash
# Device run 8 (ninth session, 2026-12-05): Q6_K's single-token body with 8 rows a workgroup
# for a weight of at least 8 x 1024 rows (`weights_q6_k_matvec_r8_wg64_*`), against the
# 2-row body (`LOWBIT_GPU_Q6K_WIDE=0`, same binary and bundle), on the 8B shape's 73,448 x
# 4,096 Q6_K head: decode profiles (the head's own pass) and `convert bench` pp512 / tg128,
# alternating, twice; 8 greedy ids and first-step logits against the CPU f32 reference.
# Carry .gpubin (bin.tar.xz: convert, gpu_decode_profile) and .anchor (generator, tokenizer).
set -u
cd "$(dirname "$0")/../../.."
RUN=run8; . benches/gpu/device_env.sh
save() { tar czf $O/run8.tar.gz -C $W .; }
rm -rf /tmp/minicpm8b.bundle; $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
M=/tmp/minicpm8b.bundle
el "8B"
for v in 1 0; do
  LOWBIT_GPU_Q6K_WIDE=$v $B/gpu_decode_profile $M 512 8 > $W/profile-wide$v.md 2>&1; sed -n 3p $W/profile-wide$v.md; grep q6_k $W/profile-wide$v.md
done
save
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do for v in 1 0; do
  LOWBIT_GPU_Q6K_WIDE=$v $B/convert bench $M $A > $W/minicpm8b-wide$v-$i.json; summary $W/minicpm8b-wide$v-$i.json
done; done
el "bench"; save
greedy_check $M 8
el "done"; save
