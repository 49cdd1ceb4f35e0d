#!/usr/bin/env bash
# Device run 18 (eleventh session, 2026-12-05, asked for an nvidia-h200): the session's last
# build (d99ea4a: Q8_0 and Q6_K weights as planes) beside llama.cpp b11434's Vulkan backend in
# one command: `convert bench` (two runs) and llama-bench pp512 / tg128 (three repeats) on the
# 8B-shape TQ2_0 GGUF and the SmolLM2, Qwen2.5 and Gemma 3 shape copies; greedy ids and
# first-step logits against the CPU f32 reference; decode profiles. Carry .gpubin
# (bin.tar.xz: convert, gpu_decode_profile) and the whole .anchor. Output: one tarball,
# rewritten after each phase.
set -u
cd "$(dirname "$0")/../../.."
RUN=run18; . benches/gpu/device_env.sh
save() { tar czf $O/run18.tar.gz -C $W .; }
copies
rm -rf /tmp/minicpm8b.bundle; $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
M=/tmp/minicpm8b.bundle
el "setup"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do
  $B/convert bench $M $A > $W/minicpm8b-$i.json; summary $W/minicpm8b-$i.json
  for m in smollm2 qwen2.5 gemma3; do
    $B/convert bench /tmp/$m.bundle $A > $W/$m-$i.json; summary $W/$m-$i.json
  done
done
el "bench"; save
echo "8B:" >> $W/checks.txt; greedy_check $M 48
for m in smollm2 qwen2.5 gemma3; do echo "$m:" >> $W/checks.txt; greedy_check /tmp/$m.bundle 32; done
el "checks"; save
$B/gpu_decode_profile $M 512 8 > $W/profile-minicpm8b.md 2>&1; sed -n 1,12p $W/profile-minicpm8b.md
for m in smollm2 qwen2.5 gemma3; do $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m.md 2>&1; done
el "profiles"; save
bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-minicpm8b.md 2>$W/llama.err; grep "Vulkan " $W/llama-minicpm8b.md
for m in smollm2 qwen2.5 gemma3; do
  MODEL=/tmp/$m.copy.gguf bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-$m.md 2>>$W/llama.err; grep "Vulkan " $W/llama-$m.md
done
el "llama.cpp"; save
