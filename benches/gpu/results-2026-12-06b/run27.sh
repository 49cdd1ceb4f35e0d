#!/usr/bin/env bash
# Device run 27 (sixteenth session, 2026-12-06): palette products that read each four
# consecutive indices with one load (`four_at` in unit_palette.wgsl; two where a 4 * BITS-bit
# span can straddle words) instead of two loads an index, against 60a88a8's build
# (.gpubin/convert-old). Each binary palettizes the SmolLM2, Qwen2.5 and Gemma 3 shape copies
# with `palettize`'s defaults at 4 bits, SmolLM2 at 8 and 6 bits too (6: the two-word path),
# and benches its own bundles (a bundle carries its kernels), alternating twice; greedy checks
# of the new bundles. Carry .gpubin (convert, convert-old, gpu_decode_profile) and .anchor
# (debs, gguf wheel, shapes).
set -u
cd "$(dirname "$0")/../../.."
RUN=run27; NO_8B=1; . benches/gpu/device_env.sh
save() { tar czf $O/run27.tar.gz -C $W .; }
copies
el "copies"
V="smollm2:4 smollm2:8 smollm2:6 qwen2.5:4 gemma3:4"
for v in new old; do
  C=$B/convert; [ $v = old ] && C=$B/convert-old
  for mb in $V; do
    m=${mb%:*}; b=${mb#*:}
    rm -rf /tmp/$m-p$b-$v.bundle
    $C palettize -q --bits $b -o /tmp/$m-p$b-$v.bundle /tmp/$m.bundle
  done
done
el "palettize"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do
  for mb in $V; do
    m=${mb%:*}; b=${mb#*:}
    $B/convert bench /tmp/$m-p$b-new.bundle $A > $W/$m-p$b-new-$i.json; summary $W/$m-p$b-new-$i.json
    $B/convert-old bench /tmp/$m-p$b-old.bundle $A > $W/$m-p$b-old-$i.json; summary $W/$m-p$b-old-$i.json
  done
done
el "bench"; save
for mb in $V; do
  m=${mb%:*}; b=${mb#*:}
  echo "$m p$b new:" >> $W/checks.txt; greedy_check /tmp/$m-p$b-new.bundle 32
done
el "checks"; save
