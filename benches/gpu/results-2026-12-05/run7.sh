#!/usr/bin/env bash
# Device run 7 (ninth session, 2026-12-05; whatever card is lent: run 6 got an H100): this
# build (a351795: the gating folded into the GGUF gate/up products) on the 8B-shape TQ2_0
# model and the three shape copies, then llama.cpp b11434's Vulkan backend on the same files
# in the same run, so the ratios on this card stand beside the H200's of record.
#   1. 8B: 48 greedy ids and first-step logits against the CPU f32 reference; `convert bench`
#      pp512 / tg128 twice; decode profiles with the Q6_K head at 2 rows a workgroup (the
#      default) and at 1 (`LOWBIT_GPU_MATVEC_WG_ROWS=1`, a knob).
#   2. The copies, alternating: bed396e's build (`convert-old`, checked below to carry
#      op_rms_norm_add and the quads body: run 6's did not), this build with
#      `LOWBIT_GPU_FOLD=norm` (the one-row loop of 67443aa, no gating fold) and as shipped.
#   3. run7b.sh, a second command on the same warm machine: llama-bench -p 512 -n 128 -r 3
#      on the 8B and the copies (run7.sh's files in /tmp).
# Carry .gpubin (bin.tar.xz: convert, convert-old, gpu_decode_profile) and .anchor (whole:
# its generator, tokenizer, llama.cpp tarball). One tarball, rewritten after each phase.
set -u
cd "$(dirname "$0")/../../.."
RUN=run7; . benches/gpu/device_env.sh
save() { tar czf $O/run7.tar.gz -C $W .; }
for s in op_rms_norm_add QUAD_TASKS rows_swiglu rows_geglu; do echo "$s: old $(grep -c $s $B/convert-old) new $(grep -c $s $B/convert)"; done | tee $W/binaries.txt
el "8B gguf"
rm -rf /tmp/minicpm8b.bundle; $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
M=/tmp/minicpm8b.bundle
IDS=1,2345,678,9012,345,6789,1111,2222,3333,4444,5555,6666,7777,8888,9999,1234,4321,100,200,300,400,500,600,700,800,900,1000,1100,1200,1300,1400,1500,1600,1700,1800,1900,2000,2100,2200,2300
$B/convert run $M --backend gpu --prompt-ids $IDS --max-tokens 48 --ignore-eos --print-ids --dump-logits $W/logits-gpu.f32 > $W/run-gpu.txt 2> $W/ids-gpu.txt
$B/convert run $M --prompt-ids $IDS --max-tokens 48 --ignore-eos --print-ids --kernel f32 --dump-logits $W/logits-cpu.f32 > $W/run-cpu.txt 2> $W/ids-cpu.txt
python3 - $W <<'PY' | tee $W/checks.txt
import sys, struct
w = sys.argv[1]
def f(n):
    b = open('%s/logits-%s.f32' % (w, n), 'rb').read(); return struct.unpack('%df' % (len(b) // 4), b)
def ids(n):
    l = [l for l in open('%s/ids-%s.txt' % (w, n)) if 'generated ids' in l.lower()]; return l[-1].strip() if l else 'none'
c = f('cpu'); g = f('gpu'); top = sorted(range(len(c)), key=lambda i: -c[i])[:2]
print('cpu f32 first-step top-2 margin %.4g' % (c[top[0]] - c[top[1]]))
print('gpu max |logit - cpu f32| %.4g, argmax equal %s, 48 greedy ids equal to cpu f32: %s' % (max(abs(a - b) for a, b in zip(g, c)), max(range(len(g)), key=g.__getitem__) == top[0], ids('gpu') == ids('cpu')))
PY
rm -f $W/*.f32
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do $B/convert bench $M $A > $W/minicpm8b-$i.json; summary $W/minicpm8b-$i.json; done
el "8B"; save
$B/gpu_decode_profile $M 512 8 > $W/profile-minicpm8b.md 2>&1; sed -n 1,6p $W/profile-minicpm8b.md; grep q6_k $W/profile-minicpm8b.md
LOWBIT_GPU_MATVEC_WG_ROWS=1 $B/gpu_decode_profile $M 512 8 > $W/profile-minicpm8b-wgrows1.md 2>&1; sed -n 3p $W/profile-minicpm8b-wgrows1.md; grep q6_k $W/profile-minicpm8b-wgrows1.md
el "profiles"; save
copies
for m in smollm2 qwen2.5 gemma3; do
  rm -rf /tmp/$m.old.bundle; $B/convert-old pack -q -o /tmp/$m.old.bundle /tmp/$m.copy.gguf
done
for i in 1 2; do
  for m in smollm2 qwen2.5 gemma3; do
    $B/convert bench /tmp/$m.bundle $A > $W/$m-new-$i.json; summary $W/$m-new-$i.json
    LOWBIT_GPU_FOLD=norm $B/convert bench /tmp/$m.bundle $A > $W/$m-row-$i.json; summary $W/$m-row-$i.json
    $B/convert-old bench /tmp/$m.old.bundle $A > $W/$m-old-$i.json; summary $W/$m-old-$i.json
  done
done
el "copies"; save
