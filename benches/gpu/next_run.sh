#!/usr/bin/env bash
# The device run planned for the next session with an nvidia-h200 (written 2026-12-05, when
# no machine was lent). No llama.cpp; about 6 minutes. Copy it to benches/gpu/results-DATE/
# when it has run, with what it printed.
# 1. The floor of one dependent dispatch (examples/gpu_dispatch_floor.rs), at 1, 16 and 4096
#    workgroups: with the 8B decode step's 261 dependent dispatches it bounds what the
#    one-op-per-dispatch design can reach (the aim, 1000 tok/s, is 1000 us a step; the
#    quantize-RMSNorm dispatches cost 3.7 us each inside the chain, run 5 of
#    results-2026-12-04d, their work included).
# 2. A prefill chunk of the small models' shape copies op by op (LOWBIT_PROFILE_PREFILL=256
#    gpu_decode_profile): where their prompts (0.16-0.36x llama.cpp's) lose, before writing a
#    tiled int8 GGUF product.
# 3. The 8B decode profile of the committed build, for the record.
# Carry .gpubin (convert, gpu_decode_profile, gpu_dispatch_floor) and .anchor (debs, gguf
# wheel, generator, tokenizer, shapes/*.json.gz; the llama.cpp tarball is not needed).
set -u
cd "$(dirname "$0")/../.."
RUN=next; . benches/gpu/device_env.sh
$B/gpu_dispatch_floor 256 4096 1048576 | tee $W/dispatch-floor.md
el "floor"
copies
for m in smollm2 qwen2.5 gemma3; do
  [ -d /tmp/$m.bundle ] || continue
  LOWBIT_PROFILE_PREFILL=256 $B/gpu_decode_profile /tmp/$m.bundle 256 2 > $W/prefill-$m.md 2>&1
  echo "== $m prefill chunk of 256"; sed -n 1,14p $W/prefill-$m.md
done
el "prefill profiles"
rm -rf /tmp/m.b; $B/convert gguf-to-ternary -q -o /tmp/m.b /tmp/minicpm8b.gguf
$B/gpu_decode_profile /tmp/m.b 512 8 > $W/profile-minicpm8b.md 2>&1; sed -n 1,12p $W/profile-minicpm8b.md
tar czf $O/next.tar.gz -C $W .
el "done"
