#!/usr/bin/env bash
# Device run 14 (eleventh session, 2026-12-05, the H200 run 13 left warm; run 12 got an H100): the committed build (277675b)
# beside llama.cpp b11434's Vulkan backend in one command, the figures of record for issue 12:
# `convert bench` (two runs) and llama-bench pp512 / tg128 (three repeats) on the 8B-shape
# TQ2_0 GGUF and the SmolLM2, Qwen2.5 and Gemma 3 shape copies; greedy ids and first-step
# logits against the CPU f32 reference; decode profiles; then the read roofline
# (gpu_stream_bench: what one dispatch that only reads 4.4-247 MB achieves through wgpu here)
# and the ternary products at the 8B shapes on the same machine (gpu_matvec_bench, the
# defaults). Carry .gpubin (bin.tar.xz: convert, gpu_decode_profile, gpu_matvec_bench,
# gpu_stream_bench) and the whole .anchor. Output: one tarball, rewritten after each phase.
set -u
cd "$(dirname "$0")/../../.."
RUN=run14; . benches/gpu/device_env.sh
save() { tar czf $O/run14.tar.gz -C $W .; }
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
$B/gpu_stream_bench > $W/stream.md 2>&1; cat $W/stream.md
el "stream"; save
$B/gpu_matvec_bench --unchecked --shapes 32768x4096,4096x16384,4608x4096,4096x4096 \
  --configs q8g4_r16_wg128_sgrows4_p1,q8g4_r4_wg128_wgrows4_p1 > $W/matvec.txt 2>&1; grep -v "^\s*$" $W/matvec.txt | cut -c1-260
el "matvec"; save
bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-minicpm8b.md 2>$W/llama.err; grep "Vulkan " $W/llama-minicpm8b.md
for m in smollm2 qwen2.5 gemma3; do
  MODEL=/tmp/$m.copy.gguf bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-$m.md 2>>$W/llama.err; grep "Vulkan " $W/llama-$m.md
done
el "llama.cpp"; save
