#!/usr/bin/env bash
# Device run 3 (one nvidia-h200, 2026-12-04): the int8 ternary decode products with their
# block scales as f32 in groups of four rows (`q8g4`, one 16-byte load for a pass's rows of a
# group, no f16 decode) against the f16 scales (`q8g`), at the 8B model's shapes; the 8B
# bundle made with this build: `convert bench`, decode profile, in-chain costs. Carry
# .gpubin and .anchor's debs, generator, gguf wheel and tokenizer.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run3; mkdir -p $O $W
t0=$(date +%s)
for f in .anchor/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/gguf-site .anchor/gguf-*.whl
( PYTHONPATH=/tmp/gguf-site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json \
  && $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf ) > $W/gen.log 2>&1 &
GEN=$!
G=$B/gpu_matvec_bench
both() { echo "q8g_$1,q8g4_$1"; }
$G --shapes 4096x16384 --configs $(both r4_wg128_wgrows4_p2),$(both r8_wg128_sgrows2_p2),q8g4_r4_wg128_wgrows4_p1,q8g4_r8_wg256_wgrows8_p1 --json $W/down.json > $W/down.txt 2>&1
$G --shapes 32768x4096 --configs $(both r8_wg128_sgrows2_p2_swiglu),q8g4_r16_wg128_sgrows4_p1_swiglu,q8g4_r16_wg256_sgrows2_p2_swiglu,q8g4_r4_wg64_wgrows2_p1_swiglu --json $W/glu.json > $W/glu.txt 2>&1
$G --shapes 4608x4096,4096x4096 --configs $(both r8_wg128_sgrows2_p2),q8g4_r16_wg128_sgrows4_p1,q8g4_r16_wg256_sgrows2_p2 --json $W/small.json > $W/small.txt 2>&1
$G --probe alu --shapes 32768x4096 --configs q8g4_r8_wg128_sgrows2_p2_swiglu > $W/probe-alu-glu.txt 2>&1
$G --probe alu --shapes 4096x16384 --configs q8g4_r4_wg128_wgrows4_p2 > $W/probe-alu-down.txt 2>&1
echo "benches done at $(( $(date +%s) - t0 )) s"
grep -H -o "q8g4*_\S*\|product chain *[0-9]* ns\|err [0-9.e-]*" $W/*.txt | paste - - - | sed 's|/tmp/run3/||g'
wait $GEN; tail -2 $W/gen.log
echo "bundle made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'))" "$1"; }
for i in 1 2; do $B/convert bench /tmp/minicpm8b.bundle $A > $W/ours-$i.json; summary $W/ours-$i.json; done
P=$B/gpu_decode_profile
$P /tmp/minicpm8b.bundle 512 8 > $W/profile.md 2>&1; sed -n 2,3p $W/profile.md; grep "blk.##" $W/profile.md | cut -c1-150
for s in ffn_gate ffn_down attn_q attn_output; do
  LOWBIT_PROFILE_SKIP=$s $P /tmp/minicpm8b.bundle 512 8 > "$W/profile-skip-$s.md" 2>&1; echo "skip $s: $(sed -n 3p "$W/profile-skip-$s.md")"
done
tar czf $O/run3.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
