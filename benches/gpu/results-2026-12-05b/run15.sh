#!/usr/bin/env bash
# Device run 15 (eleventh session, 2026-12-05): the single-token GGUF products (subgroup
# reduction) looping over their row groups with fewer workgroups (`LOWBIT_GPU_LOOP=G`, a
# knob of this build: at most G workgroups, each taking row groups wid, wid + G, ...)
# against the committed one-pass grid: decode profiles with the built-in kernels for G =
# 528, 1056, 2112, 4224 on the 8B shape and the three shape copies; `convert bench` of
# bundles packed with the looped kernels at two G against the committed bundles,
# alternating; greedy ids and first-step logits of the looped bundles against the CPU f32
# reference. Carry .gpubin and .anchor (generator, tokenizer, shapes).
set -u
cd "$(dirname "$0")/../../.."
RUN=run15; . benches/gpu/device_env.sh
save() { tar czf $O/run15.tar.gz -C $W .; }
copies
[ -d /tmp/minicpm8b.bundle ] || $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
rm -rf /tmp/minicpm8b.lp.bundle; LOWBIT_GPU_LOOP=1 $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.lp.bundle /tmp/minicpm8b.gguf
for m in smollm2 qwen2.5 gemma3; do rm -rf /tmp/$m.lp.bundle; LOWBIT_GPU_LOOP=1 $B/convert pack -q -o /tmp/$m.lp.bundle /tmp/$m.copy.gguf; done
el "setup"
show() { grep -h "step (one pass)\|output.weight\|token_embd.weight |" "$@" | grep -v gather; }
for m in minicpm8b smollm2 qwen2.5 gemma3; do
  echo "== $m"
  LOWBIT_PROFILE_BUILTIN=1 $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m-plain.md 2>&1; echo "plain"; show $W/profile-$m-plain.md
  for g in 528 1056 2112 4224; do
    LOWBIT_PROFILE_BUILTIN=1 LOWBIT_GPU_LOOP=$g $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m-loop$g.md 2>&1; echo "loop $g"; show $W/profile-$m-loop$g.md
  done
done
el "profiles"; save
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do for m in minicpm8b smollm2 qwen2.5 gemma3; do
  $B/convert bench /tmp/$m.bundle $A > $W/$m-plain-$i.json; summary $W/$m-plain-$i.json
  for g in 1056 2112; do
    LOWBIT_GPU_LOOP=$g $B/convert bench /tmp/$m.lp.bundle $A > $W/$m-loop$g-$i.json; summary $W/$m-loop$g-$i.json
  done
done; done
el "bench"; save
export LOWBIT_GPU_LOOP=1056
echo "8B loop 1056:" >> $W/checks.txt; greedy_check /tmp/minicpm8b.lp.bundle 48
for m in smollm2 qwen2.5 gemma3; do echo "$m loop 1056:" >> $W/checks.txt; greedy_check /tmp/$m.lp.bundle 32; done
el "checks"; save
