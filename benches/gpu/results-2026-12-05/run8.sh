#!/usr/bin/env bash
# Device run 8 (tenth session, 2026-12-05): the single-token body with 8 rows a workgroup for
# a weight of at least 8 x 1024 rows (`weights_{enc}_matvec_r8_wg64_*`: Q6_K and the decoders
# of matvec_quads.wgsl) against the 2-row body (`LOWBIT_GPU_WIDE=0`, same binary and
# bundle): the 8B shape's 73,448 x 4,096 Q6_K head, the copies' Q8_0 heads (Qwen2.5 151,936 x
# 896, Gemma 3 262,144 x 640 tied) and SmolLM2's. Decode profiles (the head's own pass) and
# `convert bench` alternating, twice; greedy ids and first-step logits against the CPU f32
# reference. Also each model with the kernels compiled without wgpu's bounds checks
# (`LOWBIT_GPU_UNCHECKED=1`, variant `unch`), and the copies without the RMSNorm folded into
# their GGUF products (`LOWBIT_GPU_FOLD=glu`, variant `glu`: the norms as ops of their own). Carry .gpubin (bin.tar.xz: convert, gpu_decode_profile) and .anchor (generator,
# tokenizer, shapes). (Its build's `_r8_` bodies and `LOWBIT_GPU_WIDE` knob were removed
# after this run: slower; BENCHMARKS.md.)
set -u
cd "$(dirname "$0")/../../.."
RUN=run8; . benches/gpu/device_env.sh
save() { tar czf $O/run8.tar.gz -C $W .; }
# variant NAME: the environment of variant NAME (wide1: as shipped; wide0: the 2-row body;
# unch: as shipped, unchecked kernels; glu: no norm folded into the GGUF products).
variant() { case $1 in wide1) echo LOWBIT_GPU_WIDE=1;; wide0) echo LOWBIT_GPU_WIDE=0;; unch) echo LOWBIT_GPU_UNCHECKED=1;; glu) echo LOWBIT_GPU_FOLD=glu;; esac; }
rm -rf /tmp/minicpm8b.bundle; $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
M=/tmp/minicpm8b.bundle
el "8B"
for v in wide1 wide0 unch; do
  env $(variant $v) $B/gpu_decode_profile $M 512 8 > $W/profile-minicpm8b-$v.md 2>&1; sed -n 3p $W/profile-minicpm8b-$v.md; grep q6_k $W/profile-minicpm8b-$v.md
done
save
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do for v in wide1 wide0 unch; do
  env $(variant $v) $B/convert bench $M $A > $W/minicpm8b-$v-$i.json; summary $W/minicpm8b-$v-$i.json
done; done
el "8B bench"; save
greedy_check $M 8
LOWBIT_GPU_UNCHECKED=1 greedy_check $M 8
copies
el "copies"
for m in smollm2 qwen2.5 gemma3; do for v in wide1 wide0 unch glu; do
  env $(variant $v) $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m-$v.md 2>&1; sed -n 2,3p $W/profile-$m-$v.md; grep -E "matvec.*(output|token_embd).weight" $W/profile-$m-$v.md
done; done
save
for i in 1 2; do for m in smollm2 qwen2.5 gemma3; do for v in wide1 wide0 unch glu; do
  env $(variant $v) $B/convert bench /tmp/$m.bundle $A > $W/$m-$v-$i.json; summary $W/$m-$v-$i.json
done; done; done
el "copies bench"; save
for m in smollm2 qwen2.5 gemma3; do echo "$m:" >> $W/checks.txt; greedy_check /tmp/$m.bundle 32; done
el "done"; save
