#!/usr/bin/env bash
# Device run 39 (twenty-sixth session, 2026-12-07): the decode attention dispatched with only
# the splits that hold positions (Item::Splits; 17 of 128 splits on the 8B shape at position
# 512, 65 at 2048) against every split (LOWBIT_GPU_ATTN_ALL_SPLITS=1, the grid before: the
# others only wrote an empty state no op reads). Same binary and bundle: profiles at 512
# (and, with BENCH=1, at 2048 and `convert bench --backend gpu` twice each, alternating;
# left out with the session's device time nearly spent), and the 48 greedy ids and
# first-step logits of both compared (`--dump-logits` writes the prompt's logits, which the
# prefill graph computes without Item::Splits: only the greedy ids cover the changed path). Carry .gpubin (convert, gpu_decode_profile of this
# build) and .anchor.
set -u
cd "$(dirname "$0")/../../.."
RUN=run39; . benches/gpu/device_env.sh
save() { tar czf $O/run39.tar.gz -C $W .; }
rm -rf /tmp/minicpm8b.bundle
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
el "setup"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do
  [ -n "${BENCH:-}" ] || break
  LOWBIT_GPU_ATTN_ALL_SPLITS=1 $B/convert bench /tmp/minicpm8b.bundle $A > $W/all-$i.json; summary $W/all-$i.json
  LOWBIT_GPU_ATTN_ALL_SPLITS=0 $B/convert bench /tmp/minicpm8b.bundle $A > $W/held-$i.json; summary $W/held-$i.json
done
el "bench"; save
for pos in 512 ${BENCH:+2048}; do
  for f in all held; do
    k=0; [ $f = all ] && k=1
    LOWBIT_GPU_ATTN_ALL_SPLITS=$k $B/gpu_decode_profile /tmp/minicpm8b.bundle $pos 8 > $W/profile-$f-$pos.md 2>&1
    echo "== $f $pos"; grep -h "step (one pass)\|op_attention" $W/profile-$f-$pos.md | sed 's/items in passes.*//'
  done
done
el "profiles"; save
ids=1,2345,678,9012,345,6789,1111,2222,3333,4444,5555,6666,7777,8888,9999,1234,4321,100,200,300,400,500,600,700,800,900,1000,1100,1200,1300,1400,1500,1600,1700,1800,1900,2000,2100,2200,2300
for f in all held; do
  k=0; [ $f = all ] && k=1
  LOWBIT_GPU_ATTN_ALL_SPLITS=$k $B/convert run /tmp/minicpm8b.bundle --backend gpu --prompt-ids $ids --max-tokens 48 --ignore-eos --print-ids --dump-logits $W/logits-$f.f32 > $W/run-$f.txt 2> $W/ids-$f.txt
done
{ cmp $W/logits-all.f32 $W/logits-held.f32 && echo "first-step logits: identical"
  diff <(grep -i "generated ids" $W/ids-all.txt) <(grep -i "generated ids" $W/ids-held.txt) && echo "48 greedy ids: identical"; } | tee $W/checks.txt
rm -f $W/*.f32
el "checks"; save
