#!/usr/bin/env bash
# Device run (one nvidia-h200, 2026-12-02, fourth session): the int8-activation ternary decode
# kernel (`ternary_matvec_q8_*`, --kernel int8, the new GPU default) against the f32 kernels of
# the same binary (--kernel f32, the former default), on the MiniCPM4-8B-shape TQ2_0 model:
# decode bench both ways, the norm folded in (LOWBIT_GPU_FOLD=all), the per-dispatch profile,
# and a sweep of int8 configurations at the model's matvec shapes. Run from the repository
# root with .gl, .gpubin (stripped convert, gpu_decode_profile, gpu_matvec_bench of the working
# tree) and .anchor-slim carried.
set -u
cd "$(dirname "$0")/../../.."
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
B=.gpubin; O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $O/nvidia-smi.txt
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .anchor-slim/gguf-*.whl
PYTHONPATH=/tmp/site python3 .anchor-slim/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor-slim/tokenizer.json
$B/convert gguf-to-ternary -q -o /tmp/new.bundle /tmp/minicpm8b.gguf
echo "bundle made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r.get('info',{}).get('kernel'), 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
$B/convert bench /tmp/new.bundle $A > $O/int8-minicpm8b.json; summary $O/int8-minicpm8b.json
$B/convert bench /tmp/new.bundle $A --kernel f32 > $O/f32-minicpm8b.json; summary $O/f32-minicpm8b.json
LOWBIT_GPU_FOLD=all $B/convert bench /tmp/new.bundle $A > $O/int8-foldall-minicpm8b.json; summary $O/int8-foldall-minicpm8b.json
$B/gpu_decode_profile /tmp/new.bundle 512 8 > $O/profile-int8.md 2>&1; cat $O/profile-int8.md
echo "profile done at $(( $(date +%s) - t0 )) s"
C=r8_wg128_sgrows2_p2_xs4096
for c in r16_wg128_sgrows2_p2 r32_wg256_sgrows2_p2 r64_wg256_sgrows2_p2 r32_wg256_sgrows4_p1 r32_wg256_sgrows1_p4 r64_wg256_sgrows4_p2 r16_wg256_sgrows2_p1 r32_wg256_sgrows2_p4 r128_wg256_sgrows4_p2 r64_wg512_sgrows2_p2; do
  C="$C,q8_${c}_k16384"
done
C="$C,q8_r32_wg256_sgrows2_p2_k4096,q8_r16_wg128_sgrows2_p2_k4096"
timeout 240 $B/gpu_matvec_bench --shapes 4608x4096,4096x4096,32768x4096,4096x16384 --configs $C --unchecked --json $O/sweep-q8.json > $O/sweep-q8.txt 2>&1; cat $O/sweep-q8.txt
$B/convert bench /tmp/new.bundle $A > $O/int8b-minicpm8b.json; summary $O/int8b-minicpm8b.json
echo "done at $(( $(date +%s) - t0 )) s"
