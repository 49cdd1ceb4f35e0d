#!/usr/bin/env bash
# Device run 21 (twelfth session, 2026-12-05): rows a workgroup of Q8_0's plain single-token
# kernel (matvec_q8_0.wgsl), through `LOWBIT_GPU_Q8_ROWS=N`, a measuring knob of that build
# (the kernel's ROWS, and the host's rows a workgroup for it): the three shape copies (Q8_0
# heads) packed with N = 2 (the committed kernel), 4, 8 and 16, `convert bench` of each
# alternating, twice; decode profiles of each; greedy ids and first-step logits of each
# against the CPU f32 reference. Carry .gpubin (bin.tar.xz: convert, gpu_decode_profile) and
# .anchor (no llama.cpp; NO_8B).
set -u
cd "$(dirname "$0")/../../.."
RUN=run21; NO_8B=1; . benches/gpu/device_env.sh
save() { tar czf $O/run21.tar.gz -C $W .; }
copies
for n in 2 4 8 16; do for m in smollm2 qwen2.5 gemma3; do
  rm -rf /tmp/$m.r$n.bundle; LOWBIT_GPU_Q8_ROWS=$n $B/convert pack -q -o /tmp/$m.r$n.bundle /tmp/$m.copy.gguf
done; done
el "setup"
for m in smollm2 qwen2.5 gemma3; do for n in 2 4 8 16; do
  LOWBIT_GPU_Q8_ROWS=$n $B/gpu_decode_profile /tmp/$m.r$n.bundle 512 8 > $W/profile-$m-r$n.md 2>&1
  echo "== $m r$n"; grep -h "step (one pass)\|q8_0_matvec" $W/profile-$m-r$n.md | sed 's/items in passes.*//'
done; done
el "profiles"; save
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do for m in smollm2 qwen2.5 gemma3; do for n in 2 4 8 16; do
  LOWBIT_GPU_Q8_ROWS=$n $B/convert bench /tmp/$m.r$n.bundle $A > $W/$m-r$n-$i.json; summary $W/$m-r$n-$i.json
done; done; done
el "bench"; save
for n in 4 8 16; do for m in smollm2 qwen2.5 gemma3; do
  echo "$m r$n:" >> $W/checks.txt; LOWBIT_GPU_Q8_ROWS=$n greedy_check /tmp/$m.r$n.bundle 32
done; done
el "checks"; save
