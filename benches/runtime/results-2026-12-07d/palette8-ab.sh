#!/bin/bash
# 8-bit palettized decode at the AVX-512 level, old (/tmp/cpu-new: 193c8ca, gathers) against
# new (/tmp/cpu-new8: palette_rows_perm::<8>, the table in 16 registers), alternating, ROUNDS
# rounds. Bundles: convert palettize MODEL.gguf --bits 8 --mode uniform --group-size 32 --context 512
rounds=${1:-3}
for r in $(seq $rounds); do
 for b in smollm2-p8 qwen-p8; do
  for v in new new8; do
   /tmp/cpu-$v bench /tmp/b/$b.bundle --prompt-tokens 16 --gen-tokens 32 --threads 2 --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print('$r $b $v decode', round(d['decode_tokens_per_second'],2))"
  done
 done
done
