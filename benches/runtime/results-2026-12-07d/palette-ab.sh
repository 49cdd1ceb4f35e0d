#!/bin/bash
# Palettized decode, old (/tmp/cpu-old: fd20500) against new (/tmp/cpu-new: 6-bit indices
# spread by one permute, the AVX2 level's 4-bit lookups by two vpermps and a blend),
# alternating, ROUNDS rounds, at the AVX-512 level and at LOWBIT_ISA=avx2.
# Bundles: convert palettize MODEL.gguf --bits {4,6} --mode uniform --group-size 32 --context 512
rounds=${1:-3}
for r in $(seq $rounds); do
 for isa in avx512vnni avx2; do
  for b in smollm2-p4 smollm2-p6 qwen-p4 qwen-p6; do
   for v in old new; do
    LOWBIT_ISA=$isa /tmp/cpu-$v bench /tmp/b/$b.bundle --prompt-tokens 16 --gen-tokens 32 --threads 2 --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print('$r $isa $b $v decode', round(d['decode_tokens_per_second'],2))"
   done
  done
 done
done
