#!/usr/bin/env bash
# Device run 26 (fifteenth session, 2026-12-06): bundles palettized with `palettize`'s
# defaults (4-bit, k-means, one table per tensor), whose Q/K/V this build stacks with the
# greatest common divisor of their groups (and so folds the norm in), on the four-invocation
# body, against 8d461dc's build (.gpubin/convert-old: palette products on matvec.wgsl, no
# folds, Q/K/V of different groups unstacked). Each binary palettizes the SmolLM2, Qwen2.5 and
# Gemma 3 shape copies and benches its own bundles, alternating twice; greedy checks of the
# new bundles. Carry .gpubin (convert, convert-old, gpu_decode_profile) and .anchor (debs,
# gguf wheel, shapes).
set -u
cd "$(dirname "$0")/../../.."
RUN=run26; NO_8B=1; . benches/gpu/device_env.sh
save() { tar czf $O/run26.tar.gz -C $W .; }
copies
el "copies"
for v in new old; do
  C=$B/convert; [ $v = old ] && C=$B/convert-old
  for m in smollm2 qwen2.5 gemma3; do
    rm -rf /tmp/$m-def4-$v.bundle
    $C palettize -q --bits 4 -o /tmp/$m-def4-$v.bundle /tmp/$m.bundle
  done
done
el "palettize"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do
  for m in smollm2 qwen2.5 gemma3; do
    $B/convert bench /tmp/$m-def4-new.bundle $A > $W/$m-def4-new-$i.json; summary $W/$m-def4-new-$i.json
    $B/convert-old bench /tmp/$m-def4-old.bundle $A > $W/$m-def4-old-$i.json; summary $W/$m-def4-old-$i.json
  done
done
el "bench"; save
for m in smollm2 qwen2.5 gemma3; do echo "$m def4 new:" >> $W/checks.txt; greedy_check /tmp/$m-def4-new.bundle 32; done
el "checks"; save
