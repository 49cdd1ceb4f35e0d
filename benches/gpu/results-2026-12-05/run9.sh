#!/usr/bin/env bash
# Device run 9 (tenth session, 2026-12-05): the build after run 8 (kernels that are this
# binary's own compiled without wgpu's bounds checks by default; the RMSNorm folded into the
# GGUF products only where it paid in run 8; Q4_K's own single-token body, matvec_q4_k.wgsl)
# against the same binary with the bounds checks everywhere (`LOWBIT_GPU_CHECKED=1`, variant
# `checked`) and without the norm fold (`LOWBIT_GPU_FOLD=glu`, variant `glu`): the 8B shape
# and the shape copies, decode profiles and `convert bench` alternating twice, greedy ids and
# first-step logits against the CPU f32 reference. Carry .gpubin (bin.tar.xz: convert,
# gpu_decode_profile) and .anchor (generator, tokenizer, shapes).
set -u
cd "$(dirname "$0")/../../.."
RUN=run9; . benches/gpu/device_env.sh
save() { tar czf $O/run9.tar.gz -C $W .; }
variant() { case $1 in default) echo LOWBIT_X=1;; checked) echo LOWBIT_GPU_CHECKED=1;; glu) echo LOWBIT_GPU_FOLD=glu;; esac; }
copies
el "copies"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do for m in smollm2 qwen2.5 gemma3; do for v in default checked glu; do
  env $(variant $v) $B/convert bench /tmp/$m.bundle $A > $W/$m-$v-$i.json; summary $W/$m-$v-$i.json
done; done; done
el "copies bench"; save
for m in smollm2 qwen2.5 gemma3; do echo "$m:" >> $W/checks.txt; greedy_check /tmp/$m.bundle 32; done
for m in smollm2 qwen2.5 gemma3; do for v in default glu; do
  env $(variant $v) $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m-$v.md 2>&1; sed -n 2,3p $W/profile-$m-$v.md
done; done
save
rm -rf /tmp/minicpm8b.bundle; $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
M=/tmp/minicpm8b.bundle
el "8B"
for i in 1 2; do for v in default checked; do
  env $(variant $v) $B/convert bench $M $A > $W/minicpm8b-$v-$i.json; summary $W/minicpm8b-$v-$i.json
done; done
el "8B bench"; save
echo "8B:" >> $W/checks.txt; greedy_check $M 8
$B/gpu_decode_profile $M 512 8 > $W/profile-minicpm8b.md 2>&1; sed -n 2,3p $W/profile-minicpm8b.md
el "done"; save
