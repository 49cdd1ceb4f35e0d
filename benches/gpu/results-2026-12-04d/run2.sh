#!/usr/bin/env bash
# Device run 2 (one nvidia-h200, 2026-12-04, fourth session): run 1 found the step 2476 ->
# 2393 us with three changes together, the combine slower in a pass of its own (12.2 -> 14.5
# us). Here the combine's preloaded groups of four splits apart (LOWBIT_GPU_COMBINE_PRE=0,
# the former loop, against 4 and 9, and 9 placed after the m and l loads,
# LOWBIT_GPU_COMBINE_PRE_MID=1; built-in kernels in the profiles, bundles for decode), and
# the single-token GGUF bodies with named rows (matvec.wgsl as matvec_q6_k.wgsl) on shape
# copies of SmolLM2 (Q4_1) and Qwen2.5 (Q4_K_M): the committed binary's bundles against the
# new ones. No llama.cpp. Carry .gpubin and .anchor without its tarball.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run2; mkdir -p $O $W /tmp/shapes
t0=$(date +%s); el() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
for f in .anchor/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/gguf-site .anchor/gguf-0.19.0-py3-none-any.whl
[ -f /tmp/minicpm8b.gguf ] || PYTHONPATH=/tmp/gguf-site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json > /dev/null
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
rm -rf /tmp/old.b /tmp/new.b /tmp/p0.b
$B/convert-old gguf-to-ternary -q -o /tmp/old.b /tmp/minicpm8b.gguf
$B/convert gguf-to-ternary -q -o /tmp/new.b /tmp/minicpm8b.gguf
LOWBIT_GPU_COMBINE_PRE=0 $B/convert gguf-to-ternary -q -o /tmp/p0.b /tmp/minicpm8b.gguf
for m in smollm2 qwen2.5; do
  gunzip -c .anchor/shapes/$m.json.gz > /tmp/shapes/$m.json
  PYTHONPATH=/tmp/gguf-site python3 benches/gpu/shape_copy.py generate /tmp/shapes/$m.json /tmp/$m.copy.gguf > /dev/null
  rm -rf /tmp/$m-old.b /tmp/$m-new.b
  $B/convert-old pack -q -o /tmp/$m-old.b /tmp/$m.copy.gguf
  $B/convert pack -q -o /tmp/$m-new.b /tmp/$m.copy.gguf
done
el "bundles"
IDS=1,2345,678,9012,345,6789,1111,2222,3333,4444,5555,6666,7777,8888,9999,1234,4321,100,200,300,400,500,600,700,800,900,1000,1100,1200,1300,1400,1500,1600,1700,1800,1900,2000,2100,2200,2300
for v in old new p0 smollm2-old smollm2-new qwen2.5-old qwen2.5-new; do
  $B/convert run /tmp/$v.b --backend gpu --prompt-ids $IDS --max-tokens 32 --ignore-eos --print-ids --dump-logits $W/logits-$v.f32 > $W/run-$v.txt 2> $W/ids-$v.txt
done
same() { cmp -s $W/logits-$1.f32 $W/logits-$2.f32 && a=same || a=DIFFER; [ "$(grep -i 'generated ids' $W/ids-$1.txt)" = "$(grep -i 'generated ids' $W/ids-$2.txt)" ] && b=same || b=DIFFER; echo "$1 vs $2: first-step logits $a, 32 greedy ids $b"; }
same old new; same old p0; same smollm2-old smollm2-new; same qwen2.5-old qwen2.5-new
rm -f $W/*.f32
el "checks"
show() { sed -n 3p $1; grep -E 'combine_q8|q6_k' $1 | head -2; }
for i in 1 2; do
  for c in 0 4 9 9mid; do
    case $c in 9mid) E="LOWBIT_GPU_COMBINE_PRE=9 LOWBIT_GPU_COMBINE_PRE_MID=1";; *) E="LOWBIT_GPU_COMBINE_PRE=$c";; esac
    env $E LOWBIT_PROFILE_BUILTIN=1 $B/gpu_decode_profile /tmp/new.b 512 8 > $W/profile-pre$c-$i.md 2>&1; echo "pre $c $i"; show $W/profile-pre$c-$i.md
  done
done
for m in smollm2 qwen2.5; do
  for v in old new; do
    $B/gpu_decode_profile /tmp/$m-$v.b 512 8 > $W/profile-$m-$v.md 2>&1; echo "$m $v"; sed -n 3p $W/profile-$m-$v.md
  done
done
el "profiles"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'))" "$1"; }
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do
  for v in old new p0 smollm2-old smollm2-new qwen2.5-old qwen2.5-new; do
    $B/convert bench /tmp/$v.b $A > $W/bench-$v-$i.json; summary $W/bench-$v-$i.json
  done
  el "bench $i"
  [ $(( $(date +%s) - t0 )) -gt 480 ] && break
done
tar czf $O/run2.tar.gz -C $W .
el "done"
