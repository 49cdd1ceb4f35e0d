#!/usr/bin/env bash
# Device run 19 (twelfth session, 2026-12-05): the Q6_K and Q8_0 single-token bodies that read
# the planes by 16-byte words (matvec_q6_k.wgsl: tasks of 64 weights; matvec_q8_0.wgsl: tasks
# of 16 codes; binding 9 `data4`) against c483801's build (`convert-old`, the same kernels as
# e48e26b): the 8B shape and the three shape copies packed by each binary, `convert bench`
# alternating, twice; decode profiles of each bundle by its own binary; greedy ids and
# first-step logits of the new bundles against the CPU f32 reference. Carry .gpubin
# (bin.tar.xz: convert, convert-old, gpu_decode_profile, gpu_decode_profile-old,
# gpu_matvec_bench) and .anchor.
set -u
cd "$(dirname "$0")/../../.."
RUN=run19; . benches/gpu/device_env.sh
save() { tar czf $O/run19.tar.gz -C $W .; }
copies
rm -rf /tmp/minicpm8b.bundle /tmp/minicpm8b.old.bundle
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
$B/convert-old gguf-to-ternary -q -o /tmp/minicpm8b.old.bundle /tmp/minicpm8b.gguf
for m in smollm2 qwen2.5 gemma3; do rm -rf /tmp/$m.old.bundle; $B/convert-old pack -q -o /tmp/$m.old.bundle /tmp/$m.copy.gguf; done
el "setup"
for m in minicpm8b smollm2 qwen2.5 gemma3; do
  $B/gpu_decode_profile-old /tmp/$m.old.bundle 512 8 > $W/profile-$m-old.md 2>&1
  $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m-vec4.md 2>&1
  echo "== $m"; grep -h "step (one pass)\|q6_k_matvec\|q8_0_matvec" $W/profile-$m-old.md $W/profile-$m-vec4.md | sed 's/items in passes.*//'
done
el "profiles"; save
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do for m in minicpm8b smollm2 qwen2.5 gemma3; do
  $B/convert-old bench /tmp/$m.old.bundle $A > $W/$m-old-$i.json; summary $W/$m-old-$i.json
  $B/convert bench /tmp/$m.bundle $A > $W/$m-vec4-$i.json; summary $W/$m-vec4-$i.json
done; done
el "bench"; save
echo "8B vec4:" >> $W/checks.txt; greedy_check /tmp/minicpm8b.bundle 48
for m in smollm2 qwen2.5 gemma3; do echo "$m vec4:" >> $W/checks.txt; greedy_check /tmp/$m.bundle 32; done
el "checks"; save
