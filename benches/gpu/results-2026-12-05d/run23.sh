#!/usr/bin/env bash
# Device run 23 (thirteenth session, 2026-12-05): the build whose bundles carry only the
# kernels of their matrices' encodings (a58782d: also the optional bindings by naga's analysis), on an NVIDIA GPU (lavapipe ran them in the tests):
# the 8B shape and the three shape copies packed by it, a palettized 4-bit copy of the SmolLM2
# one, greedy ids and first-step logits of each against the CPU f32 reference, `convert bench`
# once each, the kernel files each bundle carries, and the decode profile of the Qwen2.5 copy
# again (run 22's was taken on a card clocked down). Carry .gpubin (convert,
# gpu_decode_profile) and .anchor (gen_minicpm8b.py, tokenizer.json, debs, gguf wheel, shapes).
set -u
cd "$(dirname "$0")/../../.."
RUN=run23; . benches/gpu/device_env.sh
save() { tar czf $O/run23.tar.gz -C $W .; }
copies
rm -rf /tmp/minicpm8b.bundle /tmp/smollm2-pal4.bundle
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
$B/convert palettize -q --bits 4 -o /tmp/smollm2-pal4.bundle /tmp/smollm2.bundle
for m in minicpm8b smollm2 smollm2-pal4 qwen2.5 gemma3; do echo "$m $(ls /tmp/$m.bundle/kernels | wc -l) kernel files, $(du -sb /tmp/$m.bundle/kernels | cut -f1) bytes" | tee -a $W/kernels.txt; done
el "setup"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for m in minicpm8b smollm2 smollm2-pal4 qwen2.5 gemma3; do
  $B/convert bench /tmp/$m.bundle $A > $W/$m.json; summary $W/$m.json
done
el "bench"; save
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >> $W/nvidia-smi.txt 2>&1
$B/gpu_decode_profile /tmp/qwen2.5.bundle 512 8 > $W/profile-qwen2.5.md 2>&1
grep -h "step (one pass)\|_matvec_r8_" $W/profile-qwen2.5.md | sed 's/items in passes.*//'
el "profile"; save
echo "8B:" >> $W/checks.txt; greedy_check /tmp/minicpm8b.bundle 48
for m in smollm2 smollm2-pal4 qwen2.5 gemma3; do echo "$m:" >> $W/checks.txt; greedy_check /tmp/$m.bundle 32; done
for m in smollm2 qwen2.5; do echo "$m no subgroups:" >> $W/checks.txt; $B/convert run /tmp/$m.bundle --backend gpu --gpu-no-subgroups --prompt-ids 1,2345,678,9012 --max-tokens 16 --ignore-eos --print-ids 2>&1 >/dev/null | grep -i "generated ids" | tee -a $W/checks.txt; $B/convert run /tmp/$m.bundle --backend gpu --prompt-ids 1,2345,678,9012 --max-tokens 16 --ignore-eos --print-ids 2>&1 >/dev/null | grep -i "generated ids" | tee -a $W/checks.txt; done
el "checks"; save
