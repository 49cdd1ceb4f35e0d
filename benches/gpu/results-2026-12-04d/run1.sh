#!/usr/bin/env bash
# Device run 1 (one nvidia-h200, 2026-12-04, fourth session): three latency cuts in the 8B
# decode step, each keeping every output bit: the quantize-RMSNorm kernel's loads issued at
# once (ternary_q8_quantize_rms), the combine's first 36 splits' values loaded before its
# barriers (op_attention_combine_q8), the Q6_K head's loop over tasks with TU tasks' loads
# issued together (LOWBIT_GPU_Q6K_TU, 1 in the new bundle; 2 and 4 through the built-in
# kernels). The bundle of the committed binary (convert-old) against the new one: logits
# and greedy ids (bits), profiles and decode, alternating. No llama.cpp.
# Carry .gpubin (convert, convert-old, gpu_decode_profile) and .anchor without its tarball.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run1; mkdir -p $O $W
t0=$(date +%s); el() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
for f in .anchor/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/gguf-site .anchor/gguf-0.19.0-py3-none-any.whl
[ -f /tmp/minicpm8b.gguf ] || PYTHONPATH=/tmp/gguf-site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json > /dev/null
el "gguf"
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
rm -rf /tmp/old.b /tmp/new.b
$B/convert-old gguf-to-ternary -q -o /tmp/old.b /tmp/minicpm8b.gguf
$B/convert gguf-to-ternary -q -o /tmp/new.b /tmp/minicpm8b.gguf
el "bundles"
IDS=1,2345,678,9012,345,6789,1111,2222,3333,4444,5555,6666,7777,8888,9999,1234,4321,100,200,300,400,500,600,700,800,900,1000,1100,1200,1300,1400,1500,1600,1700,1800,1900,2000,2100,2200,2300
for v in old new; do
  $B/convert run /tmp/$v.b --backend gpu --prompt-ids $IDS --max-tokens 48 --ignore-eos --print-ids --dump-logits $W/logits-$v.f32 > $W/run-$v.txt 2> $W/ids-$v.txt
done
cmp $W/logits-old.f32 $W/logits-new.f32 && echo "first-step logits: the same bits"
[ "$(grep -i 'generated ids' $W/ids-old.txt)" = "$(grep -i 'generated ids' $W/ids-new.txt)" ] && echo "48 greedy ids: the same" || echo "48 greedy ids: DIFFER"
rm -f $W/*.f32
el "checks"
show() { sed -n 3p $1; grep -E 'q6_k|quantize_rms|combine_q8' $1 | head -4; }
for i in 1 2; do
  $B/gpu_decode_profile /tmp/old.b 512 8 > $W/profile-old-$i.md 2>&1; echo "old $i"; show $W/profile-old-$i.md
  $B/gpu_decode_profile /tmp/new.b 512 8 > $W/profile-new-$i.md 2>&1; echo "new $i"; show $W/profile-new-$i.md
  for tu in 2 4; do
    LOWBIT_PROFILE_BUILTIN=1 LOWBIT_GPU_Q6K_TU=$tu $B/gpu_decode_profile /tmp/new.b 512 8 > $W/profile-tu$tu-$i.md 2>&1; echo "tu$tu $i"; show $W/profile-tu$tu-$i.md
  done
done
el "profiles"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'))" "$1"; }
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do
  for v in old new; do
    $B/convert bench /tmp/$v.b $A > $W/bench-$v-$i.json; summary $W/bench-$v-$i.json
  done
  el "bench $i"
  [ $(( $(date +%s) - t0 )) -gt 500 ] && break
done
tar czf $O/run1.tar.gz -C $W .
el "done"
