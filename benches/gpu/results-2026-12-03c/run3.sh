#!/usr/bin/env bash
# Device run 3 (one nvidia-h200, 2026-12-03): after the review fixes (decode attention clusters
# by subgroup lane; grain 0 read as the fixed chunk by both kernels). 8B shape: decode and
# pp512 with the default, the small prefill buckets (pp16, pp64) with the grouped prefill
# attention against LOWBIT_GPU_ATTN_GROUP=1; `convert eval --backend gpu` against `--backend
# cpu` speed on the SmolLM2 shape copy (4 chunks of 512 of Botchan: the GPU's prefill_logits
# in 256-token chunks). Carry as run2.sh, plus .anchor/botchan.txt.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run3; mkdir -p $O $W /tmp/shapes
t0=$(date +%s)
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/gguf-site .anchor/gguf-*.whl
PYTHONPATH=/tmp/gguf-site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json
gunzip -c .anchor/shapes/smollm2.json.gz > /tmp/shapes/smollm2.json
PYTHONPATH=/tmp/gguf-site python3 benches/gpu/shape_copy.py generate /tmp/shapes/smollm2.json /tmp/smollm2.copy.gguf
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
$B/convert pack -q -o /tmp/smollm2.bundle /tmp/smollm2.copy.gguf
echo "bundles made at $(( $(date +%s) - t0 )) s"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r.get('info',{}).get('kernel'), 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
$B/convert bench /tmp/minicpm8b.bundle --backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json > $W/minicpm8b.json; summary $W/minicpm8b.json
for pp in 16 64; do
  $B/convert bench /tmp/minicpm8b.bundle --backend gpu --prompt-tokens $pp --gen-tokens 16 --repeats 5 --json > $W/pp$pp-default.json; summary $W/pp$pp-default.json
  LOWBIT_GPU_ATTN_GROUP=1 $B/convert bench /tmp/minicpm8b.bundle --backend gpu --prompt-tokens $pp --gen-tokens 16 --repeats 5 --json > $W/pp$pp-group1.json; summary $W/pp$pp-group1.json
done
echo "benches done at $(( $(date +%s) - t0 )) s"
for be in gpu cpu; do
  s=$(date +%s.%N)
  $B/convert eval /tmp/smollm2.bundle --text .anchor/botchan.txt --ctx 512 --chunks 4 --backend $be --json $W/eval-smollm2-$be.json > $W/eval-smollm2-$be.txt 2>&1
  echo "eval $be: rc $? in $(python3 -c "import time;print(round(time.time()-$s,2))") s"; tail -3 $W/eval-smollm2-$be.txt
done
tar czf $O/run3.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
