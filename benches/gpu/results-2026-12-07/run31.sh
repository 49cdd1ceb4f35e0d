#!/usr/bin/env bash
# Device run 31 (twenty-fourth session, 2026-12-07): the decode attention with every query
# head of a KV head in one workgroup (op_attention_decode_gqa, this build's default) against
# one query head a workgroup (LOWBIT_GPU_ATTN_GQA=0, op_attention_decode), same binary and
# bundles, alternating: `convert bench --backend gpu` on the 8B-shape bundle and the SmolLM2,
# Qwen2.5 and Gemma 3 shape copies, decode profiles at positions 512 and 2000, greedy ids and
# first-step logits of both against the CPU f32 reference. Carry .gpubin (convert,
# gpu_decode_profile) and .anchor (debs, gguf wheel, gen_minicpm8b.py, tokenizer.json,
# shapes/).
set -u
cd "$(dirname "$0")/../../.."
RUN=run31; . benches/gpu/device_env.sh
save() { tar czf $O/run31.tar.gz -C $W .; }
copies
rm -rf /tmp/minicpm8b.bundle
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
el "setup"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do
  for m in minicpm8b smollm2 qwen2.5 gemma3; do
    LOWBIT_GPU_ATTN_GQA=0 $B/convert bench /tmp/$m.bundle $A > $W/$m-head-$i.json; summary $W/$m-head-$i.json
    $B/convert bench /tmp/$m.bundle $A > $W/$m-gqa-$i.json; summary $W/$m-gqa-$i.json
  done
done
el "bench"; save
for pos in 512 2000; do
  for f in head gqa; do
    g=1; [ $f = head ] && g=0
    LOWBIT_GPU_ATTN_GQA=$g $B/gpu_decode_profile /tmp/minicpm8b.bundle $pos 8 > $W/profile-8b-$f-$pos.md 2>&1
    echo "== 8B $f $pos"; grep -h "step (one pass)\|op_attention" $W/profile-8b-$f-$pos.md | sed 's/items in passes.*//'
  done
done
for m in smollm2 qwen2.5 gemma3; do
  for f in head gqa; do
    g=1; [ $f = head ] && g=0
    LOWBIT_GPU_ATTN_GQA=$g $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m-$f.md 2>&1
    echo "== $m $f"; grep -h "step (one pass)\|op_attention" $W/profile-$m-$f.md | sed 's/items in passes.*//'
  done
done
el "profiles"; save
echo "8B gqa:" >> $W/checks.txt; greedy_check /tmp/minicpm8b.bundle 48
for m in smollm2 qwen2.5 gemma3; do echo "$m gqa:" >> $W/checks.txt; greedy_check /tmp/$m.bundle 32; done
el "checks"; save
