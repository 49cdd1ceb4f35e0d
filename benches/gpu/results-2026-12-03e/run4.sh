#!/usr/bin/env bash
# Device run 4 (one nvidia-h200, 2026-12-03, fifth session): decode attention variants in
# gpu_decode_profile binaries built with each variant's kernels (LOWBIT_PROFILE_BUILTIN=1):
# B = run 3's B (WG 64, clusters of 4, tiles of 16 read at once, empty splits exit early,
# f16 cache words decoded with integer operations), D = B with the cache words decoded by
# unpack2x16float; f286c35 (the committed kernel) as the anchor; positions 512 and 2048,
# grains 8, 16, 32. Carry .gl, .gpubin (convert, prof_B, prof_D,
# gpu_decode_profile_f286c35) and .anchor's gen_minicpm8b.py, gguf wheel and tokenizer.json.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run4; mkdir -p $O $W
t0=$(date +%s)
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/gguf-site .anchor/gguf-*.whl
PYTHONPATH=/tmp/gguf-site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json > $W/gen.log 2>&1
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf >> $W/gen.log 2>&1
echo "bundle made at $(( $(date +%s) - t0 )) s"
export LOWBIT_PROFILE_BUILTIN=1
for pos in 512 2048; do
  $B/gpu_decode_profile_f286c35 /tmp/minicpm8b.bundle $pos 8 > $W/profile-$pos-f286c35.md 2>&1
  echo "pos $pos f286c35: $(sed -n 3p $W/profile-$pos-f286c35.md | cut -c1-45) | $(grep 'op_attention' $W/profile-$pos-f286c35.md | tr '\n' ' ')"
  for v in B D; do for g in 8 16 32; do
    LOWBIT_GPU_ATTN_GRAIN=$g $B/prof_$v /tmp/minicpm8b.bundle $pos 8 > $W/profile-$pos-$v-grain$g.md 2>&1
    echo "pos $pos $v grain $g: $(sed -n 3p $W/profile-$pos-$v-grain$g.md | cut -c1-45) | $(grep 'op_attention' $W/profile-$pos-$v-grain$g.md | tr '\n' ' ')"
  done; done
done
echo "profiles done at $(( $(date +%s) - t0 )) s"
tar czf $O/run4.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
