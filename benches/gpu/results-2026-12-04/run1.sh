#!/usr/bin/env bash
# Device run 1 (one nvidia-h200, 2026-12-04): what holds the int8 ternary decode products
# (q8g) back at the 8B model's shapes. (1) The whole-workgroup split (`wgrows`: every
# invocation on each pass's rows, K split over the workgroup) against the subgroup-rows
# default; (2) the same products with x's loads taken away (`--probe x0`: every unit reads
# unit 0's activations) and with the weight's stream taken away (`--probe w0`: every row
# reads row 0); (3) decode profiles of the 8B bundle with the wgrows variants forced
# (built-in kernels). Carry .gpubin (convert, gpu_decode_profile, gpu_matvec_bench) and
# .anchor.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run1; mkdir -p $O $W
t0=$(date +%s)
for f in .anchor/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/gguf-site .anchor/gguf-*.whl
( PYTHONPATH=/tmp/gguf-site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json \
  && $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf ) > $W/gen.log 2>&1 &
GEN=$!
base=q8g_r8_wg128_sgrows2_p2
down="$base,q8g_r1_wg128_wgrows1_p2,q8g_r2_wg128_wgrows2_p2,q8g_r2_wg64_wgrows2_p4,q8g_r1_wg256_wgrows1_p1,q8g_r2_wg256_wgrows2_p1,q8g_r4_wg128_wgrows4_p2,q8g_r4_wg128_wgrows2_p2,q8g_r1_wg64_wgrows1_p4"
small="$base,q8g_r1_wg64_wgrows1_p1,q8g_r2_wg64_wgrows2_p1,q8g_r2_wg32_wgrows2_p2,q8g_r4_wg64_wgrows4_p1,q8g_r1_wg32_wgrows1_p2"
glu="${base}_swiglu,q8g_r1_wg64_wgrows1_p1_swiglu,q8g_r2_wg64_wgrows2_p1_swiglu,q8g_r1_wg32_wgrows1_p2_swiglu,q8g_r2_wg32_wgrows2_p2_swiglu,q8g_r4_wg64_wgrows2_p1_swiglu"
G=$B/gpu_matvec_bench
$G --shapes 4096x16384 --configs $down --json $W/down.json > $W/down.txt 2>&1
echo "down done at $(( $(date +%s) - t0 )) s"; grep -o "q8g_\S*\|product chain *[0-9]* ns" $W/down.txt | paste - - 
$G --shapes 4608x4096,4096x4096 --configs $small --json $W/small.json > $W/small.txt 2>&1
$G --shapes 32768x4096 --configs $glu --json $W/glu.json > $W/glu.txt 2>&1
echo "small, glu done at $(( $(date +%s) - t0 )) s"
for pr in x0 w0; do
  $G --probe $pr --shapes 4096x16384 --configs $base,q8g_r2_wg128_wgrows2_p2,q8g_r2_wg64_wgrows2_p4 > $W/probe-$pr-down.txt 2>&1
  $G --probe $pr --shapes 32768x4096 --configs ${base}_swiglu > $W/probe-$pr-glu.txt 2>&1
  $G --probe $pr --shapes 4096x4096 --configs $base > $W/probe-$pr-out.txt 2>&1
done
echo "probes done at $(( $(date +%s) - t0 )) s"
grep -H -o "q8g_\S*\|product chain *[0-9]* ns" $W/*.txt | paste - - 
wait $GEN; tail -2 $W/gen.log
echo "bundle made at $(( $(date +%s) - t0 )) s"
P=$B/gpu_decode_profile
LOWBIT_PROFILE_BUILTIN=1 $P /tmp/minicpm8b.bundle 512 8 > $W/profile-builtin.md 2>&1; sed -n 3p $W/profile-builtin.md
b=${base#q8g_}
for v in "r2_wg128_wgrows2_p2,$b" "r2_wg64_wgrows2_p4,$b" "r2_wg128_wgrows2_p2,r2_wg64_wgrows2_p1" "$b,r1_wg64_wgrows1_p1"; do
  LOWBIT_GPU_Q8G=$v LOWBIT_PROFILE_BUILTIN=1 $P /tmp/minicpm8b.bundle 512 8 > "$W/profile-$v.md" 2>&1; echo "$v: $(sed -n 3p "$W/profile-$v.md")"
done
tar czf $O/run1.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
