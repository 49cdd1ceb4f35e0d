#!/usr/bin/env bash
# Device run 7, second command (run7.sh's header): llama.cpp b11434's Vulkan backend on the
# 8B-shape GGUF and the shape copies run7.sh left in /tmp (same machine), llama-bench -p 512
# -n 128 -r 3. Output: run7b.tar.gz (the llama-*.md files and its stderr).
set -u
cd "$(dirname "$0")/../../.."
RUN=run7b; . benches/gpu/device_env.sh
save() { tar czf $O/run7b.tar.gz -C $W .; }
bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-minicpm8b.md 2>$W/llama.err; grep "Vulkan " $W/llama-minicpm8b.md
save
for m in smollm2 qwen2.5 gemma3; do
  MODEL=/tmp/$m.copy.gguf bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-$m.md 2>>$W/llama.err; grep "Vulkan " $W/llama-$m.md
done
el "llama.cpp"; save
