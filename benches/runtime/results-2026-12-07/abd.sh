#!/bin/bash
# usage: abd.sh ISA DEPTH GEN ROUNDS bundles...  (decode tok/s after a DEPTH-token prompt, old vs new, alternating)
isa=$1; p=$2; g=$3; rounds=$4; shift 4
for r in $(seq $rounds); do
 for b in "$@"; do
  for v in old new; do
   LOWBIT_ISA=$isa /tmp/cpu-$v bench /tmp/b/$b.bundle --prompt-tokens $p --gen-tokens $g --threads 2 --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print('isa=${isa:-native} d=$p $r $b $v', round(d['decode_tokens_per_second'],2))"
  done
 done
done
