#!/usr/bin/env bash
# Device run 6 (one nvidia-h200, 2026-12-03, fifth session): weights streamed into L2 while
# the decode attention runs (`op_prefetch` right after `op_attention_decode`, no shared
# buffer, so no barrier between them): LOWBIT_GPU_PREFETCH = 0, o, gu, o,gu, o,gu,d on the
# 8B shape, decode profiles at positions 512 and 2048 and bench. Carry .gl, .gpubin
# (stripped convert, gpu_decode_profile) and .anchor's gen_minicpm8b.py, gguf wheel and
# tokenizer.json.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run6; mkdir -p $O $W
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
for pf in 0 gu o,gu o,gu,d d 0; do
  for pos in 512 2048; do
    LOWBIT_GPU_PREFETCH=$pf $B/gpu_decode_profile /tmp/minicpm8b.bundle $pos 8 > $W/profile-$pos-pf-$pf.md 2>&1
    echo "prefetch $pf pos $pos: $(sed -n 1,3p $W/profile-$pos-pf-$pf.md | tail -2 | cut -c1-60 | tr '\n' ' ')"
  done
done
for pf in 0 o,gu; do
  LOWBIT_GPU_PREFETCH=$pf $B/convert bench /tmp/minicpm8b.bundle $A > $W/bench-pf-$pf.json; summary $W/bench-pf-$pf.json
done
echo "done at $(( $(date +%s) - t0 )) s"
tar czf $O/run6.tar.gz -C $W .
