#!/bin/bash
# Palettized decode, old (/tmp/cpu-old: d4cb2fc, AVX2 gathers) against new (/tmp/cpu-new: the
# AVX-512 permute kernels for 4 and 6 bits), alternating, ROUNDS rounds; the packed GGUF
# bundles of the same models with the new binary as the reference.
# Bundles: convert palettize MODEL.gguf --bits {4,6} --mode uniform --group-size 32 --context 512
rounds=${1:-3}
for r in $(seq $rounds); do
 for b in smollm2-p4 smollm2-p6 qwen-p4 qwen-p6; do
  for v in old new; do
   /tmp/cpu-$v bench /tmp/b/$b.bundle --prompt-tokens 16 --gen-tokens 32 --threads 2 --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print('$r $b $v decode', round(d['decode_tokens_per_second'],2))"
  done
 done
 for b in smollm2 qwen; do
  /tmp/cpu-new bench /tmp/b/$b.bundle --prompt-tokens 16 --gen-tokens 32 --threads 2 --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print('$r $b packed new decode', round(d['decode_tokens_per_second'],2))"
 done
done
