#!/usr/bin/env bash
# Device run 13 (eleventh session, 2026-12-05): the single-token GGUF products with the
# workgroup's rows staged in workgroup memory by 16-byte loads (`LOWBIT_GPU_STAGED=1`, a
# knob of this build: Q6_K and the quads decoders, not the gated forms) against the
# committed bodies, on the 8B shape and the three shape copies: bundles packed each way,
# `convert bench` alternating, twice; decode profiles with the built-in kernels each way;
# greedy ids and first-step logits of the staged bundles against the CPU f32 reference.
# Carry .gpubin and .anchor (generator, tokenizer, shapes).
set -u
cd "$(dirname "$0")/../../.."
RUN=run13; . benches/gpu/device_env.sh
save() { tar czf $O/run13.tar.gz -C $W .; }
copies
[ -d /tmp/minicpm8b.bundle ] || $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
rm -rf /tmp/minicpm8b.st.bundle; LOWBIT_GPU_STAGED=1 $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.st.bundle /tmp/minicpm8b.gguf
for m in smollm2 qwen2.5 gemma3; do rm -rf /tmp/$m.st.bundle; LOWBIT_GPU_STAGED=1 $B/convert pack -q -o /tmp/$m.st.bundle /tmp/$m.copy.gguf; done
el "setup"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do for m in minicpm8b smollm2 qwen2.5 gemma3; do
  $B/convert bench /tmp/$m.bundle $A > $W/$m-plain-$i.json; summary $W/$m-plain-$i.json
  LOWBIT_GPU_STAGED=1 $B/convert bench /tmp/$m.st.bundle $A > $W/$m-staged-$i.json; summary $W/$m-staged-$i.json
done; done
el "bench"; save
for m in minicpm8b smollm2 qwen2.5 gemma3; do
  LOWBIT_PROFILE_BUILTIN=1 $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m-plain.md 2>&1
  LOWBIT_PROFILE_BUILTIN=1 LOWBIT_GPU_STAGED=1 $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m-staged.md 2>&1
  echo "== $m"; grep -h "step (one pass)\|output.weight\|token_embd.weight |" $W/profile-$m-plain.md $W/profile-$m-staged.md | grep -v gather
done
el "profiles"; save
export LOWBIT_GPU_STAGED=1
echo "8B staged:" >> $W/checks.txt; greedy_check /tmp/minicpm8b.st.bundle 48
for m in smollm2 qwen2.5 gemma3; do echo "$m staged:" >> $W/checks.txt; greedy_check /tmp/$m.st.bundle 32; done
el "checks"; save
