#!/usr/bin/env bash
# Device run 4 (one nvidia-h200, 2026-12-04, fourth session): the multi-token GGUF product
# (prefill of the small models) with named accumulators (matmul.wgsl as a template): per unit
# each row's weights decoded once and each token's activations loaded once (the new default),
# against the former order with named accumulators (LOWBIT_GPU_MATMUL_ORDER=rows, a knob of
# this build) and the committed binary's bundles (accumulators in a private array), on shape
# copies of SmolLM2 (Q4_1), Qwen2.5 (Q4_K_M) and Gemma 3 (Q4_K_M): logits and greedy ids,
# prompt and decode, the prefill chunk profile. No llama.cpp (run 3 has its figures).
# Carry .gpubin/convert, .gpubin/convert-old, .anchor/debs, the gguf wheel and .anchor/shapes
# (with gpu_decode_profile too it is past the 64 MiB a run carries: the prefill profile then
# runs only where the binary is there).
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run4; mkdir -p $O $W /tmp/shapes
t0=$(date +%s); el() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $W/nvidia-smi.txt
for f in .anchor/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/gguf-site .anchor/gguf-0.19.0-py3-none-any.whl
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
for m in smollm2 qwen2.5 gemma3; do
  gunzip -c .anchor/shapes/$m.json.gz > /tmp/shapes/$m.json
  PYTHONPATH=/tmp/gguf-site python3 benches/gpu/shape_copy.py generate /tmp/shapes/$m.json /tmp/$m.copy.gguf > /dev/null
  rm -rf /tmp/$m-*.b
  $B/convert-old pack -q -o /tmp/$m-old.b /tmp/$m.copy.gguf
  $B/convert pack -q -o /tmp/$m-new.b /tmp/$m.copy.gguf
  LOWBIT_GPU_MATMUL_ORDER=rows $B/convert pack -q -o /tmp/$m-rows.b /tmp/$m.copy.gguf
done
el "bundles"
IDS=1,2345,678,9012,345,6789,1111,2222,3333,4444,5555,6666,7777,8888,9999,1234,4321,100,200,300,400,500,600,700,800,900,1000,1100,1200,1300,1400,1500,1600,1700,1800,1900,2000,2100,2200,2300
for m in smollm2 qwen2.5 gemma3; do
  for v in old new rows; do
    $B/convert run /tmp/$m-$v.b --backend gpu --prompt-ids $IDS --max-tokens 32 --ignore-eos --print-ids --dump-logits $W/logits-$m-$v.f32 > $W/run-$m-$v.txt 2> $W/ids-$m-$v.txt
  done
  python3 - $W $m <<'PY'
import sys, struct
w, m = sys.argv[1], sys.argv[2]
def f(v):
    b = open('%s/logits-%s-%s.f32' % (w, m, v), 'rb').read(); return struct.unpack('%df' % (len(b) // 4), b)
def ids(v):
    l = [l for l in open('%s/ids-%s-%s.txt' % (w, m, v)) if 'generated ids' in l.lower()]; return l[-1].strip() if l else 'none'
o = f('old')
for v in ['new', 'rows']:
    g = f(v)
    print('%s %s: first-step logits max |diff| to old %.3g (bits equal %s), 32 greedy ids equal %s' % (m, v, max(abs(a - b) for a, b in zip(g, o)), g == o, ids(v) == ids('old')))
PY
done
rm -f $W/*.f32
el "checks"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1))" "$1"; }
A="--backend gpu --prompt-tokens 512 --gen-tokens 32 --repeats 3 --json"
for i in 1 2; do
  for m in smollm2 qwen2.5 gemma3; do
    for v in old new rows; do
      $B/convert bench /tmp/$m-$v.b $A > $W/bench-$m-$v-$i.json; summary $W/bench-$m-$v-$i.json
    done
  done
done
el "bench"
[ -x $B/gpu_decode_profile ] && for v in old new rows; do
  LOWBIT_PROFILE_PREFILL=256 $B/gpu_decode_profile /tmp/qwen2.5-$v.b 512 3 > $W/profile-prefill-qwen2.5-$v.md 2>&1
  echo "qwen2.5 $v"; sed -n 3p $W/profile-prefill-qwen2.5-$v.md; grep matmul $W/profile-prefill-qwen2.5-$v.md | head -3
done
tar czf $O/run4.tar.gz -C $W .
el "done"
