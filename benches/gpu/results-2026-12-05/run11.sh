#!/usr/bin/env bash
# Device run 11 (tenth session, 2026-12-05): run 10's build on the machine run 10 left warm
# (an H200): the 8B shape and the Gemma 3 copy, default against `LOWBIT_GPU_CHECKED=1`,
# alternating twice; 8 greedy ids of the 8B against the CPU f32 reference. Carry .gpubin and
# .anchor (generator, tokenizer, shapes).
set -u
cd "$(dirname "$0")/../../.."
RUN=run11; . benches/gpu/device_env.sh
save() { tar czf $O/run11.tar.gz -C $W .; }
variant() { case $1 in default) echo LOWBIT_X=1;; checked) echo LOWBIT_GPU_CHECKED=1;; esac; }
copies
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
rm -rf /tmp/minicpm8b.bundle; $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
for i in 1 2; do for v in default checked; do
  env $(variant $v) $B/convert bench /tmp/gemma3.bundle $A > $W/gemma3-$v-$i.json; summary $W/gemma3-$v-$i.json
  env $(variant $v) $B/convert bench /tmp/minicpm8b.bundle $A > $W/minicpm8b-$v-$i.json; summary $W/minicpm8b-$v-$i.json
done; done
save
echo "8B:" >> $W/checks.txt; greedy_check /tmp/minicpm8b.bundle 8
el "done"; save
