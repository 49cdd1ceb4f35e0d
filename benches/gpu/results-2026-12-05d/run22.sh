#!/usr/bin/env bash
# Device run 22 (thirteenth session, 2026-12-05, asked for an nvidia-h200): the session's build
# (a8aa99f's kernels plus single-token Q6_K kernels of 8 rows a workgroup for weights of at
# least 65,536 rows, and, for this run only, Q6_K kernels of 4 and 16 rows with the knob
# LOWBIT_GPU_Q6K_ROWS = 2, 4, 8, 16 choosing the 8B head's kernel) beside llama.cpp b11434's
# Vulkan backend in one command: `convert bench` (two runs each; the 8B with each N,
# alternating) and llama-bench pp512 / tg128 (three repeats) on the 8B-shape TQ2_0 GGUF and the
# SmolLM2, Qwen2.5 and Gemma 3 shape copies; decode profiles; greedy ids and first-step logits
# against the CPU f32 reference. Carry .gpubin (bin.tar.xz: convert, gpu_decode_profile) and
# .anchor with llama.cpp's sdist trimmed as run20.sh says.
set -u
cd "$(dirname "$0")/../../.."
RUN=run22; . benches/gpu/device_env.sh
save() { tar czf $O/run22.tar.gz -C $W .; }
copies
rm -rf /tmp/minicpm8b.bundle
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
el "setup"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do
  for n in 2 8 4 16; do
    LOWBIT_GPU_Q6K_ROWS=$n $B/convert bench /tmp/minicpm8b.bundle $A > $W/minicpm8b-q6r$n-$i.json; summary $W/minicpm8b-q6r$n-$i.json
  done
  for m in smollm2 qwen2.5 gemma3; do
    $B/convert bench /tmp/$m.bundle $A > $W/$m-$i.json; summary $W/$m-$i.json
  done
done
el "bench"; save
bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-minicpm8b.md 2> $W/llama.err; tail -4 $W/llama-minicpm8b.md
for m in smollm2 qwen2.5 gemma3; do
  MODEL=/tmp/$m.copy.gguf bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-$m.md 2>> $W/llama.err; tail -3 $W/llama-$m.md
done
el "llama.cpp"; save
for n in 2 4 8 16; do
  LOWBIT_GPU_Q6K_ROWS=$n $B/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $W/profile-minicpm8b-q6r$n.md 2>&1
  echo "== 8B N=$n"; grep -h "step (one pass)\|q6_k_matvec" $W/profile-minicpm8b-q6r$n.md | sed 's/items in passes.*//'
done
for m in smollm2 qwen2.5 gemma3; do
  $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m.md 2>&1
  echo "== $m"; grep -h "step (one pass)\|_matvec_r8_" $W/profile-$m.md | sed 's/items in passes.*//'
done
el "profiles"; save
echo "8B:" >> $W/checks.txt; greedy_check /tmp/minicpm8b.bundle 48
for m in smollm2 qwen2.5 gemma3; do echo "$m:" >> $W/checks.txt; greedy_check /tmp/$m.bundle 32; done
el "checks"; save
