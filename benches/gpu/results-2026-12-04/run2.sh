#!/usr/bin/env bash
# Device run 2 (one nvidia-h200, 2026-12-04): (1) more whole-workgroup splits of the down
# product; (2) the q8g products with their arithmetic cut to one dot product a unit
# (`--probe alu`) and with the block scales' loads and decodes taken away (`--probe s1`);
# (3) the 8B bundle made with this build (down on the whole-workgroup split by default):
# `convert bench`, decode profiles, and profiles whose one-pass step leaves items out
# (LOWBIT_PROFILE_SKIP: each item's cost inside the chain, by difference). Carry .gpubin
# and .anchor's debs, generator, gguf wheel and tokenizer.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run2; mkdir -p $O $W
t0=$(date +%s)
for f in .anchor/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/gguf-site .anchor/gguf-*.whl
( PYTHONPATH=/tmp/gguf-site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json \
  && $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf ) > $W/gen.log 2>&1 &
GEN=$!
base=q8g_r8_wg128_sgrows2_p2
G=$B/gpu_matvec_bench
down="$base,q8g_r4_wg128_wgrows4_p2,q8g_r8_wg128_wgrows4_p2,q8g_r8_wg128_wgrows8_p2,q8g_r4_wg256_wgrows4_p1,q8g_r4_wg64_wgrows4_p4,q8g_r8_wg256_wgrows8_p1,q8g_r2_wg128_wgrows2_p2,q8g_r4_wg128_wgrows4_p1"
$G --shapes 4096x16384 --configs $down --json $W/down.json > $W/down.txt 2>&1
for pr in alu s1; do
  $G --probe $pr --shapes 4096x16384 --configs $base,q8g_r4_wg128_wgrows4_p2 > $W/probe-$pr-down.txt 2>&1
  $G --probe $pr --shapes 32768x4096 --configs ${base}_swiglu > $W/probe-$pr-glu.txt 2>&1
  $G --probe $pr --shapes 4096x4096 --configs $base > $W/probe-$pr-out.txt 2>&1
done
echo "benches done at $(( $(date +%s) - t0 )) s"
grep -H -o "q8g_\S*\|product chain *[0-9]* ns" $W/*.txt | paste - - | sed 's|/tmp/run2/||g'
wait $GEN; tail -2 $W/gen.log
echo "bundle made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'))" "$1"; }
for i in 1 2; do $B/convert bench /tmp/minicpm8b.bundle $A > $W/ours-$i.json; summary $W/ours-$i.json; done
LOWBIT_GPU_Q8G=r8_wg128_sgrows2_p2,r8_wg128_sgrows2_p2 $B/convert bench /tmp/minicpm8b.bundle $A > $W/ours-sgrows.json; summary $W/ours-sgrows.json
P=$B/gpu_decode_profile
$P /tmp/minicpm8b.bundle 512 8 > $W/profile.md 2>&1; sed -n 2,3p $W/profile.md
for s in op_attention_decode op_attention_combine ffn_gate ffn_down attn_q attn_output q6_k op_attention_decode,op_attention_combine; do
  LOWBIT_PROFILE_SKIP=$s $P /tmp/minicpm8b.bundle 512 8 > "$W/profile-skip-$s.md" 2>&1; echo "skip $s: $(sed -n 3p "$W/profile-skip-$s.md")"
done
tar czf $O/run2.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
