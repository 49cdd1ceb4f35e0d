#!/usr/bin/env bash
# Device run 36 (twenty-sixth session, 2026-12-07; asked for nvidia-h200): on an H200 only,
# run 35's floors (the dispatch chain's and the persistent dispatch's, `gpu_stream_bench
# persistent 264 330 396`, twice), then the 8B ternary decode of this build (`convert bench
# --backend gpu`, 512 prompt + 128 generated, twice) and its profile at position 512. On
# another card it says so and stops. Carry .gpubin (convert, gpu_decode_profile,
# gpu_stream_bench, stripped) and .anchor (debs, gguf wheel, gen_minicpm8b.py, tokenizer.json).
# Asked once this session: an H100 came and it stopped (not yet run on an H200).
set -u
cd "$(dirname "$0")/../../.."
RUN=run36; NO_8B=1; . benches/gpu/device_env.sh
save() { tar czf $O/run36.tar.gz -C $W .; }
cat $W/nvidia-smi.txt
if ! grep -q H200 $W/nvidia-smi.txt; then echo "not an H200: stopping"; save; exit 0; fi
for i in 1 2; do
  timeout 240 $B/gpu_stream_bench persistent 264 330 396 > $W/persistent-$i.md 2>&1
  echo "rc $?"; grep -h "barriers\|checks\|step:" $W/persistent-$i.md | grep -v "no barriers |"
  el "persistent $i"; save
done
PYTHONPATH=/tmp/gguf-site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json > /dev/null
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
el "setup"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do $B/convert bench /tmp/minicpm8b.bundle $A > $W/bench-$i.json; summary $W/bench-$i.json; done
$B/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $W/profile-512.md 2>&1; grep -h "step (one pass)" $W/profile-512.md
el "bench"; save
