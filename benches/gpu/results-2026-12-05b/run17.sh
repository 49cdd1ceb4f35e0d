#!/usr/bin/env bash
# Device run 17 (eleventh session, 2026-12-05): Q6_K weights uploaded as planes (every ql,
# qh, scales and d: aligned words; unit_q6_k.wgsl, matvec_q6_k.wgsl) on top of the Q8_0
# planes, against 277675b's build (`convert-old`: both types read as stored): the 8B shape
# (its only GGUF weights: the Q6_K head and the Q4_K embedding) and the three shape copies,
# packed by each binary, `convert bench` alternating, twice; decode profiles; greedy ids and
# first-step logits of the new bundles against the CPU f32 reference. Carry .gpubin
# (convert, convert-old, gpu_decode_profile) and .anchor.
set -u
cd "$(dirname "$0")/../../.."
RUN=run17; . benches/gpu/device_env.sh
save() { tar czf $O/run17.tar.gz -C $W .; }
copies
rm -rf /tmp/minicpm8b.bundle /tmp/minicpm8b.old.bundle
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
$B/convert-old gguf-to-ternary -q -o /tmp/minicpm8b.old.bundle /tmp/minicpm8b.gguf
for m in smollm2 qwen2.5 gemma3; do rm -rf /tmp/$m.old.bundle; $B/convert-old pack -q -o /tmp/$m.old.bundle /tmp/$m.copy.gguf; done
el "setup"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do for m in minicpm8b smollm2 qwen2.5 gemma3; do
  $B/convert-old bench /tmp/$m.old.bundle $A > $W/$m-old-$i.json; summary $W/$m-old-$i.json
  $B/convert bench /tmp/$m.bundle $A > $W/$m-planes-$i.json; summary $W/$m-planes-$i.json
done; done
el "bench"; save
for m in minicpm8b smollm2 qwen2.5 gemma3; do
  $B/gpu_decode_profile /tmp/$m.old.bundle 512 8 > $W/profile-$m-old.md 2>&1
  $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m-planes.md 2>&1
  echo "== $m"; grep -h "step (one pass)\|q6_k\|q8_0_matvec" $W/profile-$m-old.md $W/profile-$m-planes.md | sed 's/items in passes.*//'
done
el "profiles"; save
echo "8B planes:" >> $W/checks.txt; greedy_check /tmp/minicpm8b.bundle 48
for m in smollm2 qwen2.5 gemma3; do echo "$m planes:" >> $W/checks.txt; greedy_check /tmp/$m.bundle 32; done
el "checks"; save
