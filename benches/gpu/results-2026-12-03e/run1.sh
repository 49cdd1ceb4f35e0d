#!/usr/bin/env bash
# Device run 1 (one nvidia-h200, 2026-12-03, fifth session): the decode attention with each
# tile's key and value rows read at once (attention_decode.wgsl: tiles of 32 positions,
# clusters of 4 invocations per score) on the 8B shape, decode profiles at positions 512
# and 2048 with split grains 8 (default), 16 and 32, and `LOWBIT_GPU_ATTN_DECODE=0`
# (op_rope_kv + op_attention) as this run's anchor; a sweep of the down product's units in
# flight (K = 16384: p2 is four chunks per row). Carry .gl, .gpubin (stripped convert,
# gpu_decode_profile, gpu_matvec_bench) and .anchor's gen_minicpm8b.py, gguf wheel and
# tokenizer.json.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run1; mkdir -p $O $W
t0=$(date +%s)
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/gguf-site .anchor/gguf-*.whl
( PYTHONPATH=/tmp/gguf-site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json \
  && $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf ) > $W/gen.log 2>&1 &
GEN=$!
down="q8g_r8_wg128_sgrows2_p2,q8g_r8_wg128_sgrows2_p4,q8g_r8_wg128_sgrows2_p8,q8g_r4_wg128_sgrows1_p4,q8g_r4_wg128_sgrows1_p8,q8g_r8_wg256_sgrows1_p4,q8g_r4_wg64_sgrows2_p4,q8g_r16_wg256_sgrows2_p4"
$B/gpu_matvec_bench --shapes 4096x16384 --configs $down --json $W/sweep-down.json > $W/sweep-down.txt 2>&1
echo "sweep down done at $(( $(date +%s) - t0 )) s"; grep -o "q8g_[a-z0-9_]* kernel.*product chain [0-9]* ns" $W/sweep-down.txt | sed 's/ kernel.*product chain/: product chain/'
wait $GEN; tail -2 $W/gen.log
echo "bundle made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r.get('info',{}).get('kernel'), 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
for i in 1 2; do $B/convert bench /tmp/minicpm8b.bundle $A > $W/ours-$i.json; summary $W/ours-$i.json; done
LOWBIT_GPU_ATTN_DECODE=0 $B/convert bench /tmp/minicpm8b.bundle $A > $W/attn-decode0.json; summary $W/attn-decode0.json
LOWBIT_GPU_ATTN_GRAIN=32 $B/convert bench /tmp/minicpm8b.bundle $A > $W/grain32.json; summary $W/grain32.json
$B/convert bench /tmp/minicpm8b.bundle --backend gpu --prompt-tokens 2048 --gen-tokens 128 --repeats 2 --json > $W/pp2048.json; summary $W/pp2048.json
echo "benches done at $(( $(date +%s) - t0 )) s"
for pos in 512 2048; do
  for g in 8 16 32; do
    LOWBIT_GPU_ATTN_GRAIN=$g $B/gpu_decode_profile /tmp/minicpm8b.bundle $pos 8 > $W/profile-$pos-grain$g.md 2>&1
    echo "pos $pos grain $g"; sed -n 3p $W/profile-$pos-grain$g.md; grep "op_attention" $W/profile-$pos-grain$g.md
  done
  LOWBIT_GPU_ATTN_DECODE=0 $B/gpu_decode_profile /tmp/minicpm8b.bundle $pos 8 > $W/profile-$pos-decode0.md 2>&1
  echo "pos $pos op_attention"; sed -n 3p $W/profile-$pos-decode0.md; grep "op_attention\|op_rope" $W/profile-$pos-decode0.md
done
for v in r8_wg128_sgrows2_p4 r8_wg128_sgrows2_p8; do
  LOWBIT_PROFILE_BUILTIN=1 LOWBIT_GPU_Q8G=$v,r8_wg128_sgrows2_p2_swiglu $B/gpu_decode_profile /tmp/minicpm8b.bundle 512 8 > $W/profile-512-$v.md 2>&1
  echo "$v"; sed -n 3p $W/profile-512-$v.md; grep "ffn_down\|attn_output\|attn_q" $W/profile-512-$v.md
done
echo "profiles done at $(( $(date +%s) - t0 )) s"
tar czf $O/run1.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
