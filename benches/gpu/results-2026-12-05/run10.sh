#!/usr/bin/env bash
# Device run 10 (tenth session, 2026-12-05): run 9's build with the GGUF norm fold no longer
# taken by the int8 path's `fold_norm` for three Q/K/V products (run 9's Qwen2.5 had 231
# dispatches a token so, its biases as ops): Qwen2.5 and SmolLM2 copies, default against
# `LOWBIT_GPU_FOLD=glu` (no norm fold) and `LOWBIT_GPU_CHECKED=1`, alternating twice; greedy
# ids against the CPU f32 reference. Carry .gpubin and .anchor/shapes (NO_8B).
set -u
cd "$(dirname "$0")/../../.."
RUN=run10; NO_8B=1; . benches/gpu/device_env.sh
save() { tar czf $O/run10.tar.gz -C $W .; }
variant() { case $1 in default) echo LOWBIT_X=1;; checked) echo LOWBIT_GPU_CHECKED=1;; glu) echo LOWBIT_GPU_FOLD=glu;; esac; }
copies
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do for m in qwen2.5 smollm2; do for v in default glu checked; do
  env $(variant $v) $B/convert bench /tmp/$m.bundle $A > $W/$m-$v-$i.json; summary $W/$m-$v-$i.json
done; done; done
save
for m in qwen2.5 smollm2; do echo "$m:" >> $W/checks.txt; greedy_check /tmp/$m.bundle 32; done
el "done"; save
