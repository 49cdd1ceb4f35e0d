#!/usr/bin/env bash
# Device run 24 (fourteenth session, 2026-12-06): the one-dispatch decode attention
# (op_attention_decode_q8_hd*: attention, merge and the output product's quantization in one
# workgroup per 256 outputs, for positions up to 1024 at head_dim 128) against the split
# attention with its combine (the default; the form is off by default, LOWBIT_GPU_ATTN_ONE=1
# turns it on; same binary), on the 8B shape:
# `convert bench` alternating, decode profiles of both at position 512, greedy ids and
# first-step logits against the CPU f32 reference. Then run 23's checks of the filtered
# bundles (the build carries only its encodings' kernels): the shape copies packed, a
# palettized 4-bit SmolLM2, greedy checks, bench once each with and without the f32
# one-dispatch attention (op_attention_decode_one_hd*); after the profiles, the one-dispatch
# kernel's unroll counts at position 512 (LOWBIT_GPU_ATTN_ONE_UNROLL, built-in kernels). Carry .gpubin (convert,
# gpu_decode_profile) and .anchor (gen_minicpm8b.py, tokenizer.json, debs, gguf wheel, shapes).
set -u
cd "$(dirname "$0")/../../.."
RUN=run24; . benches/gpu/device_env.sh
save() { tar czf $O/run24.tar.gz -C $W .; }
rm -rf /tmp/minicpm8b.bundle
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
el "setup 8B"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do
  LOWBIT_GPU_ATTN_ONE=1 $B/convert bench /tmp/minicpm8b.bundle $A > $W/minicpm8b-one-$i.json; summary $W/minicpm8b-one-$i.json
  $B/convert bench /tmp/minicpm8b.bundle $A > $W/minicpm8b-split-$i.json; summary $W/minicpm8b-split-$i.json
done
el "bench 8B"; save
LOWBIT_GPU_ATTN_ONE=1 $B/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $W/profile-minicpm8b-one.md 2>&1
$B/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $W/profile-minicpm8b-split.md 2>&1
LOWBIT_GPU_ATTN_ONE=1 $B/gpu_decode_profile /tmp/minicpm8b.bundle 1000 8 > $W/profile-minicpm8b-one-1000.md 2>&1
$B/gpu_decode_profile /tmp/minicpm8b.bundle 1000 8 > $W/profile-minicpm8b-split-1000.md 2>&1
for f in one split one-1000 split-1000; do echo "$f: $(grep -h "step (one pass)" $W/profile-minicpm8b-$f.md)"; grep -h "op_attention" $W/profile-minicpm8b-$f.md | sed 's/^/  /'; done
el "profile 8B"; save
# The one-dispatch kernel's unroll counts (KU key rows a cluster, KV value rows an invocation;
# built-in kernels, LOWBIT_GPU_ATTN_ONE_UNROLL), at position 512: the built-in default first.
for u in 2,4 1,4 4,4 2,8 4,2; do
  LOWBIT_PROFILE_BUILTIN=1 LOWBIT_GPU_ATTN_ONE=1 LOWBIT_GPU_ATTN_ONE_UNROLL=$u $B/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $W/profile-minicpm8b-one-u$u.md 2>&1
  echo "unroll $u: $(grep -h "step (one pass)" $W/profile-minicpm8b-one-u$u.md)"; grep -h "op_attention" $W/profile-minicpm8b-one-u$u.md | sed 's/^/  /'
done
el "unroll 8B"; save
echo "8B one:" >> $W/checks.txt; LOWBIT_GPU_ATTN_ONE=1 greedy_check /tmp/minicpm8b.bundle 48
echo "8B split:" >> $W/checks.txt; greedy_check /tmp/minicpm8b.bundle 48
el "checks 8B"; save
copies
rm -rf /tmp/smollm2-pal4.bundle
$B/convert palettize -q --bits 4 -o /tmp/smollm2-pal4.bundle /tmp/smollm2.bundle
for m in minicpm8b smollm2 smollm2-pal4 qwen2.5 gemma3; do echo "$m $(ls /tmp/$m.bundle/kernels | wc -l) kernel files, $(du -sb /tmp/$m.bundle/kernels | cut -f1) bytes" | tee -a $W/kernels.txt; done
for m in smollm2 smollm2-pal4 qwen2.5 gemma3; do
  $B/convert bench /tmp/$m.bundle $A > $W/$m.json; summary $W/$m.json
  LOWBIT_GPU_ATTN_ONE=1 $B/convert bench /tmp/$m.bundle $A > $W/$m-one.json; summary $W/$m-one.json
done
el "bench copies"; save
for m in smollm2 smollm2-pal4 qwen2.5 gemma3; do echo "$m:" >> $W/checks.txt; greedy_check /tmp/$m.bundle 32; done
el "checks copies"; save
