#!/usr/bin/env bash
# Device run 2 (one nvidia-h200, 2026-12-03, fifth session): run 1's decode attention
# rewritten without indexed arrays (each tile's key and value words in named variables,
# attention_decode.wgsl's `//@each` blocks unrolled by the host): bench and decode profiles
# at positions 512 and 2048 with split grains 8, 16 and 32; the committed kernel (f286c35's
# gpu_decode_profile with its built-in kernels) in the same run as the anchor. Carry .gl,
# .gpubin (stripped convert, gpu_decode_profile, gpu_decode_profile_f286c35) and .anchor's
# gen_minicpm8b.py, gguf wheel and tokenizer.json.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run2; mkdir -p $O $W
t0=$(date +%s)
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/gguf-site .anchor/gguf-*.whl
PYTHONPATH=/tmp/gguf-site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json > $W/gen.log 2>&1
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf >> $W/gen.log 2>&1
echo "bundle made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r.get('info',{}).get('kernel'), 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
for g in 8 16 32; do
  LOWBIT_GPU_ATTN_GRAIN=$g $B/convert bench /tmp/minicpm8b.bundle $A > $W/ours-grain$g.json; summary $W/ours-grain$g.json
done
echo "benches done at $(( $(date +%s) - t0 )) s"
for pos in 512 2048; do
  LOWBIT_PROFILE_BUILTIN=1 $B/gpu_decode_profile_f286c35 /tmp/minicpm8b.bundle $pos 8 > $W/profile-$pos-f286c35.md 2>&1
  echo "pos $pos f286c35"; sed -n 3p $W/profile-$pos-f286c35.md; grep "op_attention" $W/profile-$pos-f286c35.md
  for g in 8 16 32; do
    LOWBIT_GPU_ATTN_GRAIN=$g $B/gpu_decode_profile /tmp/minicpm8b.bundle $pos 8 > $W/profile-$pos-grain$g.md 2>&1
    echo "pos $pos grain $g"; sed -n 3p $W/profile-$pos-grain$g.md; grep "op_attention" $W/profile-$pos-grain$g.md
  done
done
echo "profiles done at $(( $(date +%s) - t0 )) s"
tar czf $O/run2.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
