#!/usr/bin/env bash
# Device run 25 (fifteenth session, 2026-12-06): palettized bundles' single-token products on
# the four-invocation body (matvec_quads.wgsl, `quads` in unit_palette.wgsl) with the RMSNorm
# and the gating folded in (`_rms`, `_swiglu`, `_swiglu_rms`, `_geglu` palette kernels), against
# the build before it. Two binaries carried: .gpubin/convert (this build) and
# .gpubin/convert-old (8d461dc: palette products on matvec.wgsl, no folds). Each palettizes the
# SmolLM2 and Gemma 3 shape copies as the recipes do (4-bit one table a row, the tied
# embedding excluded; 8-bit G = 32) and benches its own bundles, alternating twice; greedy
# checks of the new bundles against the CPU f32 reference; decode profiles of SmolLM2's 4-bit
# bundles. Carry .gpubin (convert, convert-old, gpu_decode_profile) and .anchor (debs, gguf
# wheel, shapes). About 5 minutes.
set -u
cd "$(dirname "$0")/../../.."
RUN=run25; NO_8B=1; . benches/gpu/device_env.sh
save() { tar czf $O/run25.tar.gz -C $W .; }
copies
el "copies"
for v in new old; do
  C=$B/convert; [ $v = old ] && C=$B/convert-old
  for m in smollm2 gemma3; do
    rm -rf /tmp/$m-pal4-$v.bundle /tmp/$m-pal8-$v.bundle
    $C palettize -q --bits 4 --group-size 1 --exclude token_embd.weight -o /tmp/$m-pal4-$v.bundle /tmp/$m.bundle
    $C palettize -q --bits 8 --group-size 32 -o /tmp/$m-pal8-$v.bundle /tmp/$m.bundle
  done
done
el "palettize"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do
  for b in smollm2-pal4 smollm2-pal8 gemma3-pal4 gemma3-pal8; do
    $B/convert bench /tmp/$b-new.bundle $A > $W/$b-new-$i.json; summary $W/$b-new-$i.json
    $B/convert-old bench /tmp/$b-old.bundle $A > $W/$b-old-$i.json; summary $W/$b-old-$i.json
  done
done
el "bench"; save
for v in new old; do
  $B/gpu_decode_profile /tmp/smollm2-pal4-$v.bundle 512 8 > $W/profile-smollm2-pal4-$v.md 2>&1
  echo "$v: $(grep -h "dispatches per step\|step (one pass)" $W/profile-smollm2-pal4-$v.md | tr '\n' ' ')"
done
el "profile"; save
for b in smollm2-pal4 smollm2-pal8 gemma3-pal4 gemma3-pal8; do echo "$b new:" >> $W/checks.txt; greedy_check /tmp/$b-new.bundle 32; done
el "checks"; save
