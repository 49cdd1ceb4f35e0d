#!/usr/bin/env bash
# Device run 3 (one nvidia-h200, 2026-12-03, fifth session): decode attention variants, each
# with empty splits exiting before any staging (a decode grid holds `splits` = 64 splits per
# head, most of them past the position early in a context), in gpu_decode_profile binaries
# built with each variant's kernels (LOWBIT_PROFILE_BUILTIN=1): A = run 2's kernel (WG 128,
# clusters of 4, tiles of 32 read at once), B = the same with WG 64 (tiles of 16), C = the
# committed kernel (f286c35: WG 64, clusters of 8) with the early exit only; f286c35 itself
# as the anchor; positions 512 and 2048, grains 8, 16, 32. Carry .gl, .gpubin (convert,
# prof_A, prof_B, prof_C, gpu_decode_profile_f286c35) and .anchor's gen_minicpm8b.py, gguf
# wheel and tokenizer.json.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run3; mkdir -p $O $W
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
  for v in A B C; do for g in 8 16 32; do
    LOWBIT_GPU_ATTN_GRAIN=$g $B/prof_$v /tmp/minicpm8b.bundle $pos 8 > $W/profile-$pos-$v-grain$g.md 2>&1
    echo "pos $pos $v grain $g: $(sed -n 3p $W/profile-$pos-$v-grain$g.md | cut -c1-45) | $(grep 'op_attention' $W/profile-$pos-$v-grain$g.md | tr '\n' ' ')"
  done; done
done
echo "profiles done at $(( $(date +%s) - t0 )) s"
tar czf $O/run3.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
