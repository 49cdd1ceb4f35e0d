#!/usr/bin/env bash
# Device run 33 (twenty-fifth session, 2026-12-07; asked for nvidia-h200): the decode
# attention with its combine merged in its last workgroups (op_attention_decode_combine_q8,
# the default of the build it ran with, 7fe4403; LOWBIT_GPU_ATTN_MERGE=1 since 71d891a, set
# here for both) against the two dispatches (LOWBIT_GPU_ATTN_MERGE=0:
# op_attention_decode, then op_attention_combine_q8), same binary and bundle, alternating:
# `convert bench --backend gpu` on the 8B-shape bundle, decode profiles at position 512, and
# the GPU's first-step logits and 48 greedy ids of both forms compared bit for bit.
# On an H200 also run 29's floor (`gpu_stream_bench step`, twice). Carry .gpubin
# (convert, gpu_decode_profile, gpu_stream_bench) and .anchor (debs, gguf wheel,
# gen_minicpm8b.py, tokenizer.json).
set -u
cd "$(dirname "$0")/../../.."
RUN=run33; . benches/gpu/device_env.sh
save() { tar czf $O/run33.tar.gz -C $W .; }
rm -rf /tmp/minicpm8b.bundle
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
el "setup"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do
  LOWBIT_GPU_ATTN_MERGE=0 $B/convert bench /tmp/minicpm8b.bundle $A > $W/apart-$i.json; summary $W/apart-$i.json
  LOWBIT_GPU_ATTN_MERGE=1 $B/convert bench /tmp/minicpm8b.bundle $A > $W/merged-$i.json; summary $W/merged-$i.json
done
el "bench"; save
for pos in 512; do
  for f in apart merged; do
    g=1; [ $f = apart ] && g=0
    LOWBIT_GPU_ATTN_MERGE=$g $B/gpu_decode_profile /tmp/minicpm8b.bundle $pos 8 > $W/profile-$f-$pos.md 2>&1
    echo "== $f $pos"; grep -h "step (one pass)\|op_attention" $W/profile-$f-$pos.md | sed 's/items in passes.*//'
  done
done
el "profiles"; save
ids=1,2345,678,9012,345,6789,1111,2222,3333,4444,5555,6666,7777,8888,9999,1234,4321,100,200,300,400,500,600,700,800,900,1000,1100,1200,1300,1400,1500,1600,1700,1800,1900,2000,2100,2200,2300
for f in apart merged; do
  g=1; [ $f = apart ] && g=0
  LOWBIT_GPU_ATTN_MERGE=$g $B/convert run /tmp/minicpm8b.bundle --backend gpu --prompt-ids $ids --max-tokens 48 --ignore-eos --print-ids --dump-logits $W/logits-$f.f32 > $W/run-$f.txt 2> $W/ids-$f.txt
done
{ cmp $W/logits-apart.f32 $W/logits-merged.f32 && echo "first-step logits: identical"
  diff <(grep -i "generated ids" $W/ids-apart.txt) <(grep -i "generated ids" $W/ids-merged.txt) && echo "48 greedy ids: identical"; } | tee $W/checks.txt
rm -f $W/*.f32
el "checks"; save
if grep -q H200 $W/nvidia-smi.txt; then
  for i in 1 2; do timeout 150 $B/gpu_stream_bench step > $W/stream-step-$i.md 2>&1; grep -h "tok/s\|total" $W/stream-step-$i.md | tail -3; done
  el "stream"; save
fi
