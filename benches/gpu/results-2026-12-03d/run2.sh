#!/usr/bin/env bash
# Device run 2 (one nvidia-h200, 2026-12-03): run 1's `convert` was stale (built before the
# fix that keeps a Q8Pre product's quantize dispatch in the decode graph: it ran the q8g
# products on whatever x the scratch held, 197 dispatches, 348 tok/s, a measure of the
# products without their quantization only). Here: the q8g product only where run 1's sweep
# found it faster with its quantize dispatch (Q/K/V, output, down: r8_wg128_sgrows2_p2;
# gate/up keeps the per-workgroup quantization), end to end against LOWBIT_GPU_Q8_PRE=0 and
# neighbouring splits (LOWBIT_GPU_Q8G with built-in kernels). Carry as run1.sh.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run2; mkdir -p $O $W
t0=$(date +%s)
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/gguf-site .anchor/gguf-*.whl
PYTHONPATH=/tmp/gguf-site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json > $W/gen.log 2>&1
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
echo "bundle made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r.get('info',{}).get('kernel'), 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
for i in 1 2; do
  $B/convert bench /tmp/minicpm8b.bundle $A > $W/minicpm8b-$i.json; summary $W/minicpm8b-$i.json
  LOWBIT_GPU_Q8_PRE=0 $B/convert bench /tmp/minicpm8b.bundle $A > $W/minicpm8b-q8pre0-$i.json; summary $W/minicpm8b-q8pre0-$i.json
done
echo "benches done at $(( $(date +%s) - t0 )) s"
$B/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $W/profile-decode.md 2>&1; head -16 $W/profile-decode.md
LOWBIT_GPU_Q8_PRE=0 $B/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $W/profile-decode-q8pre0.md 2>&1; head -3 $W/profile-decode-q8pre0.md
for v in r4_wg64_sgrows2_p2 r16_wg256_sgrows2_p2 r8_wg128_sgrows2_p2,r8_wg128_sgrows2_p2 r8_wg128_sgrows1_p2; do
  LOWBIT_PROFILE_BUILTIN=1 LOWBIT_GPU_Q8G=$v $B/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $W/profile-decode-$v.md 2>&1; echo "$v"; head -3 $W/profile-decode-$v.md | tail -2
done
$B/gpu_decode_profile /tmp/minicpm8b.bundle 2048 8 > $W/profile-decode-2048.md 2>&1; head -3 $W/profile-decode-2048.md
echo "profiles done at $(( $(date +%s) - t0 )) s"
tar czf $O/run2.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
