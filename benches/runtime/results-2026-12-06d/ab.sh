#!/bin/bash
# usage: ab.sh ISA PROMPT GEN ROUNDS bundles...
isa=$1; p=$2; g=$3; rounds=$4; shift 4
for r in $(seq $rounds); do
 for b in "$@"; do
  for v in old new; do
   LOWBIT_ISA=$isa /tmp/cpu-$v bench /tmp/b/$b.bundle --prompt-tokens $p --gen-tokens $g --repeats 2 --threads 2 --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print('$r $b $v', round(d['prompt_tokens_per_second'],1), round(d['decode_tokens_per_second'],1))"
  done
 done
done
