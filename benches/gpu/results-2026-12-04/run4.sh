#!/usr/bin/env bash
# Device run 4 (one nvidia-h200, 2026-12-04): the committed candidate (int8 decode products
# with f32 block scales in groups of four rows: 4 rows a subgroup pass, 1 unit in flight;
# the down product on the whole workgroup) beside llama.cpp b11434's Vulkan backend on the
# 8B-shape TQ2_0 GGUF, one command; decode profile and in-chain costs at position 512.
# Carry .gpubin (convert, gpu_decode_profile) and .anchor's run.sh, debs, generator, gguf
# wheel, tokenizer and llama.cpp sdist.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run4; mkdir -p $O $W
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-minicpm8b.md 2>$W/llama.err; tail -3 $W/llama-minicpm8b.md
echo "llama.cpp done at $(( $(date +%s) - t0 )) s"
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token') or 0, 3))" "$1"; }
for i in 1 2; do $B/convert bench /tmp/minicpm8b.bundle $A > $W/ours-$i.json; summary $W/ours-$i.json; done
P=$B/gpu_decode_profile
$P /tmp/minicpm8b.bundle 512 8 > $W/profile.md 2>&1; sed -n 2,3p $W/profile.md; grep "blk.##" $W/profile.md | cut -c1-150
for s in ffn_gate ffn_down attn_q attn_output op_attention_decode op_attention_combine; do
  LOWBIT_PROFILE_SKIP=$s $P /tmp/minicpm8b.bundle 512 8 > "$W/profile-skip-$s.md" 2>&1; echo "skip $s: $(sed -n 3p "$W/profile-skip-$s.md")"
done
tar czf $O/run4.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
