#!/usr/bin/env bash
# Device run 16 (eleventh session, 2026-12-05): Q8_0 weights uploaded as planes (every qs,
# then every d; unit_q8_0.wgsl reads aligned words) against the committed build (277675b,
# carried as convert-old: its bundles carry the block-reading Q8_0 decoder, and its Q8_0
# weights are uploaded as stored). The three shape copies (Q8_0 heads: SmolLM2's and Gemma
# 3's tied, Qwen2.5's own) packed by each binary, `convert bench` alternating, twice; decode
# profiles (each binary's bundle kernels); greedy ids and first-step logits of the new
# bundles against the CPU f32 reference. Carry .gpubin (convert, convert-old,
# gpu_decode_profile) and .anchor (shapes). NO_8B: the 8B has no Q8_0 weight.
set -u
cd "$(dirname "$0")/../../.."
RUN=run16; NO_8B=1; . benches/gpu/device_env.sh
save() { tar czf $O/run16.tar.gz -C $W .; }
copies
for m in smollm2 qwen2.5 gemma3; do rm -rf /tmp/$m.old.bundle; $B/convert-old pack -q -o /tmp/$m.old.bundle /tmp/$m.copy.gguf; done
el "setup"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do for m in smollm2 qwen2.5 gemma3; do
  $B/convert-old bench /tmp/$m.old.bundle $A > $W/$m-old-$i.json; summary $W/$m-old-$i.json
  $B/convert bench /tmp/$m.bundle $A > $W/$m-planes-$i.json; summary $W/$m-planes-$i.json
done; done
el "bench"; save
for m in smollm2 qwen2.5 gemma3; do
  $B/gpu_decode_profile /tmp/$m.old.bundle 512 8 > $W/profile-$m-old.md 2>&1
  $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m-planes.md 2>&1
  echo "== $m"; grep -h "step (one pass)\|q8_0" $W/profile-$m-old.md $W/profile-$m-planes.md | sed 's/items in passes.*//'
done
el "profiles"; save
for m in smollm2 qwen2.5 gemma3; do echo "$m planes:" >> $W/checks.txt; greedy_check /tmp/$m.bundle 32; done
el "checks"; save
