#!/usr/bin/env bash
# Device run 5 (one nvidia-h200, 2026-12-04, fourth session): where the committed build's 8B
# decode step goes inside the chain: the one-pass step with items left out
# (LOWBIT_PROFILE_SKIP, outputs wrong), and with the quantize dispatches in front of the
# products left out (LOWBIT_PROFILE_SKIP_PRE), for the next lever. No llama.cpp.
# Carry .gpubin (convert, gpu_decode_profile), .anchor/debs, the gguf wheel, the generator
# and the tokenizer.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run5; mkdir -p $O $W
t0=$(date +%s); el() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
for f in .anchor/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/gguf-site .anchor/gguf-0.19.0-py3-none-any.whl
[ -f /tmp/minicpm8b.gguf ] || PYTHONPATH=/tmp/gguf-site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json > /dev/null
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
rm -rf /tmp/m.b; $B/convert gguf-to-ternary -q -o /tmp/m.b /tmp/minicpm8b.gguf
el "bundle"
step() { sed -n 3p $1 | sed 's/;.*//'; }
$B/gpu_decode_profile /tmp/m.b 512 8 > $W/full-1.md 2>&1; echo "full: $(step $W/full-1.md)"
for s in ffn_gate ffn_down attn_q attn_output op_attention_decode op_attention_combine_q8 q6_k; do
  LOWBIT_PROFILE_SKIP=$s $B/gpu_decode_profile /tmp/m.b 512 8 > $W/skip-$s.md 2>&1; echo "skip $s: $(step $W/skip-$s.md)"
done
for s in ffn_gate attn_q; do
  LOWBIT_PROFILE_SKIP_PRE=$s $B/gpu_decode_profile /tmp/m.b 512 8 > $W/skippre-$s.md 2>&1; echo "skip pre $s: $(step $W/skippre-$s.md)"
done
$B/gpu_decode_profile /tmp/m.b 512 8 > $W/full-2.md 2>&1; echo "full: $(step $W/full-2.md)"
tar czf $O/run5.tar.gz -C $W .
el "done"
