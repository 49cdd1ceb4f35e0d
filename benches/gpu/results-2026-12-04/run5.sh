#!/usr/bin/env bash
# Device run 5 (one nvidia-h200, 2026-12-04): the attention combine with the output
# product's int8 quantization folded in (op_attention_combine_q8: one dispatch less a layer)
# beside llama.cpp b11434's Vulkan backend on the 8B-shape TQ2_0 GGUF, against the same
# binary with LOWBIT_GPU_COMBINE_Q8=0; greedy tokens and first-step logits of both compared;
# decode profile and in-chain costs. Carry .gpubin (convert, gpu_decode_profile) and
# .anchor's run.sh, debs, generator, gguf wheel, tokenizer and llama.cpp sdist.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run5; mkdir -p $O $W
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
bash .anchor/run.sh -p 512 -n 128 -r 3 > $W/llama-minicpm8b.md 2>$W/llama.err; tail -3 $W/llama-minicpm8b.md
echo "llama.cpp done at $(( $(date +%s) - t0 )) s"
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
R8="$B/convert run /tmp/minicpm8b.bundle --backend gpu --prompt-ids 1,2345,678,9012,345,6789 --max-tokens 48 --ignore-eos --print-ids"
$R8 --dump-logits $W/logits-fold.f32 > $W/run-fold.txt 2> $W/ids-fold.txt
LOWBIT_GPU_COMBINE_Q8=0 $R8 --dump-logits $W/logits-plain.f32 > $W/run-plain.txt 2> $W/ids-plain.txt
python3 - $W <<'PY'
import sys, struct
w = sys.argv[1]
a = open(w + '/logits-fold.f32', 'rb').read(); b = open(w + '/logits-plain.f32', 'rb').read()
fa = struct.unpack('%df' % (len(a) // 4), a); fb = struct.unpack('%df' % (len(b) // 4), b)
print('first-step logits: %d values, max |diff| %g, identical bits: %s' % (len(fa), max(abs(x - y) for x, y in zip(fa, fb)), a == b))
ia = open(w + '/ids-fold.txt').read().split('\n'); ib = open(w + '/ids-plain.txt').read().split('\n')
ia = [l for l in ia if 'ids' in l.lower()]; ib = [l for l in ib if 'ids' in l.lower()]
print('greedy ids equal:', ia == ib, ia[-1:] if ia else 'no ids line')
PY
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token') or 0, 3))" "$1"; }
for i in 1 2; do $B/convert bench /tmp/minicpm8b.bundle $A > $W/ours-$i.json; summary $W/ours-$i.json; done
LOWBIT_GPU_COMBINE_Q8=0 $B/convert bench /tmp/minicpm8b.bundle $A > $W/ours-plain.json; summary $W/ours-plain.json
P=$B/gpu_decode_profile
$P /tmp/minicpm8b.bundle 512 8 > $W/profile.md 2>&1; sed -n 2,3p $W/profile.md; grep "combine\|attn_output" $W/profile.md | cut -c1-150
LOWBIT_GPU_COMBINE_Q8=0 $P /tmp/minicpm8b.bundle 512 8 > $W/profile-plain.md 2>&1; sed -n 2,3p $W/profile-plain.md
for s in op_attention_combine attn_output; do
  LOWBIT_PROFILE_SKIP=$s $P /tmp/minicpm8b.bundle 512 8 > "$W/profile-skip-$s.md" 2>&1; echo "skip $s: $(sed -n 3p "$W/profile-skip-$s.md")"
done
tar czf $O/run5.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
