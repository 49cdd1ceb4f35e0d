#!/usr/bin/env bash
# Device run 20 (twelfth session, 2026-12-05, asked for an nvidia-h200): the session's build
# (Q8_0's single-token body reading its code plane by 16-byte words, matvec_q8_0.wgsl; the
# Q6_K body as before) beside llama.cpp b11434's Vulkan backend in one command, and against
# c483801's build (`convert-old`) alternating: `convert bench` (two runs each) and
# llama-bench pp512 / tg128 (three repeats) on the 8B-shape TQ2_0 GGUF and the SmolLM2,
# Qwen2.5 and Gemma 3 shape copies; decode profiles of each bundle by its own binary; greedy
# ids and first-step logits of the new bundles against the CPU f32 reference. Carry .gpubin
# (bin.tar.xz: convert, convert-old, gpu_decode_profile, gpu_decode_profile-old) and .anchor
# with llama.cpp's sdist trimmed (docs, models, benches, tools/ui, examples/llama.android,
# conversion and the test GGUFs left out: 9.5 MB, so that the run fits the 64 MiB a call
# carries; none of them is built by run.sh's configuration).
set -u
cd "$(dirname "$0")/../../.."
RUN=run20; . benches/gpu/device_env.sh
save() { tar czf $O/run20.tar.gz -C $W .; }
copies
rm -rf /tmp/minicpm8b.bundle /tmp/minicpm8b.old.bundle
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
$B/convert-old gguf-to-ternary -q -o /tmp/minicpm8b.old.bundle /tmp/minicpm8b.gguf
for m in smollm2 qwen2.5 gemma3; do rm -rf /tmp/$m.old.bundle; $B/convert-old pack -q -o /tmp/$m.old.bundle /tmp/$m.copy.gguf; done
el "setup"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do for m in minicpm8b smollm2 qwen2.5 gemma3; do
  $B/convert-old bench /tmp/$m.old.bundle $A > $W/$m-old-$i.json; summary $W/$m-old-$i.json
  $B/convert bench /tmp/$m.bundle $A > $W/$m-$i.json; summary $W/$m-$i.json
done; done
el "bench"; save
bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-minicpm8b.md 2> $W/llama.err; tail -4 $W/llama-minicpm8b.md
for m in smollm2 qwen2.5 gemma3; do
  MODEL=/tmp/$m.copy.gguf bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-$m.md 2>> $W/llama.err; tail -3 $W/llama-$m.md
done
el "llama.cpp"; save
for m in minicpm8b smollm2 qwen2.5 gemma3; do
  $B/gpu_decode_profile-old /tmp/$m.old.bundle 512 8 > $W/profile-$m-old.md 2>&1
  $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m.md 2>&1
  echo "== $m"; grep -h "step (one pass)\|q8_0_matvec" $W/profile-$m-old.md $W/profile-$m.md | sed 's/items in passes.*//'
done
el "profiles"; save
echo "8B:" >> $W/checks.txt; greedy_check /tmp/minicpm8b.bundle 48
for m in smollm2 qwen2.5 gemma3; do echo "$m:" >> $W/checks.txt; greedy_check /tmp/$m.bundle 32; done
el "checks"; save
