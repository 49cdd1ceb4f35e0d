#!/usr/bin/env bash
# Device run 1 (one nvidia-h200, 2026-12-03, fourth session): x quantized once per ternary
# decode product (MatvecKernel::Q8Pre: `ternary_q8_quantize[_rms]` then
# `ternary_matvec_q8g_*`) against each workgroup quantizing x itself (the former default,
# LOWBIT_GPU_Q8_PRE=0). A sweep of the q8g product's splits at the 8B shapes
# (gpu_matvec_bench: chain with the quantize dispatch, product chain without), then the 8B
# model end to end (convert bench, decode profiles) with the default, the former kernel and
# other q8g splits (LOWBIT_GPU_Q8G with built-in kernels). Carry .gl, .gpubin (stripped
# convert, gpu_decode_profile, gpu_matvec_bench) and .anchor's gen_minicpm8b.py, gguf wheel
# and tokenizer.json.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run1; mkdir -p $O $W
t0=$(date +%s)
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/gguf-site .anchor/gguf-*.whl
# The model on the CPU while the GPU sweeps.
( PYTHONPATH=/tmp/gguf-site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json \
  && $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf ) > $W/gen.log 2>&1 &
GEN=$!
plain=""; glu=""
for rs in 1 2 4; do for p in 1 2; do for wg in 64 128 256; do
  r=$(( rs * wg / 32 )); plain="$plain,q8g_r${r}_wg${wg}_sgrows${rs}_p${p}"; glu="$glu,q8g_r${r}_wg${wg}_sgrows${rs}_p${p}_swiglu"
done; done; done
plain="$plain,q8g_r32_wg128_sgrows4_p1,q8g_r64_wg256_sgrows4_p1,q8g_r8_wg32_sgrows8_p1,q8g_r16_wg64_sgrows8_p1,q8g_r4_wg32_sgrows4_p1"
$B/gpu_matvec_bench --shapes 4608x4096,4096x4096 --configs q8_r32_wg256_sgrows4_p1_k4096$plain --json $W/sweep-k4096.json > $W/sweep-k4096.txt 2>&1
echo "sweep k4096 done at $(( $(date +%s) - t0 )) s"
$B/gpu_matvec_bench --shapes 4096x16384 --configs q8_r32_wg256_sgrows4_p1_k16384$plain --json $W/sweep-down.json > $W/sweep-down.txt 2>&1
echo "sweep down done at $(( $(date +%s) - t0 )) s"
$B/gpu_matvec_bench --shapes 32768x4096 --configs q8_r32_wg256_sgrows2_p2_k4096_swiglu$glu --json $W/sweep-glu.json > $W/sweep-glu.txt 2>&1
echo "sweep glu done at $(( $(date +%s) - t0 )) s"
wait $GEN; tail -2 $W/gen.log
echo "bundle made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r.get('info',{}).get('kernel'), 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
$B/convert bench /tmp/minicpm8b.bundle $A > $W/minicpm8b.json; summary $W/minicpm8b.json
LOWBIT_GPU_Q8_PRE=0 $B/convert bench /tmp/minicpm8b.bundle $A > $W/minicpm8b-q8pre0.json; summary $W/minicpm8b-q8pre0.json
echo "benches done at $(( $(date +%s) - t0 )) s"
$B/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $W/profile-decode.md 2>&1; head -14 $W/profile-decode.md
LOWBIT_GPU_Q8_PRE=0 $B/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $W/profile-decode-q8pre0.md 2>&1; head -3 $W/profile-decode-q8pre0.md
for v in r8_wg64_sgrows4_p1,r8_wg64_sgrows2_p2 r32_wg256_sgrows4_p1,r32_wg256_sgrows2_p2 r16_wg128_sgrows2_p2,r16_wg128_sgrows1_p2 r8_wg64_sgrows2_p1,r8_wg64_sgrows1_p1; do
  LOWBIT_PROFILE_BUILTIN=1 LOWBIT_GPU_Q8G=$v $B/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $W/profile-decode-$v.md 2>&1; echo "$v"; head -3 $W/profile-decode-$v.md | tail -2
done
echo "profiles done at $(( $(date +%s) - t0 )) s"
tar czf $O/run1.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
