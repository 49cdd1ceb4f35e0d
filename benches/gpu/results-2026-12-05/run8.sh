#!/usr/bin/env bash
# Device run 8 (ninth session, 2026-12-05): Q6_K's single-token body with 8 rows a workgroup
# for a weight of at least 8 x 1024 rows (`weights_q6_k_matvec_r8_wg64_*`), against the
# 2-row body (`LOWBIT_GPU_Q6K_WIDE=0`, same binary and bundle), on the 8B shape's 73,448 x
# 4,096 Q6_K head: decode profiles (the head's own pass) and `convert bench` pp512 / tg128,
# alternating, twice; 8 greedy ids and first-step logits against the CPU f32 reference.
# Carry .gpubin (bin.tar.xz: convert, gpu_decode_profile) and .anchor (generator, tokenizer).
set -u
cd "$(dirname "$0")/../../.."
RUN=run8; . benches/gpu/device_env.sh
save() { tar czf $O/run8.tar.gz -C $W .; }
rm -rf /tmp/minicpm8b.bundle; $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
M=/tmp/minicpm8b.bundle
el "8B"
for v in 1 0; do
  LOWBIT_GPU_Q6K_WIDE=$v $B/gpu_decode_profile $M 512 8 > $W/profile-wide$v.md 2>&1; sed -n 3p $W/profile-wide$v.md; grep q6_k $W/profile-wide$v.md
done
save
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
for i in 1 2; do for v in 1 0; do
  LOWBIT_GPU_Q6K_WIDE=$v $B/convert bench $M $A > $W/minicpm8b-wide$v-$i.json; summary $W/minicpm8b-wide$v-$i.json
done; done
el "bench"; save
IDS=1,2345,678,9012,345,6789,1111,2222,3333,4444,5555,6666,7777,8888,9999,1234,4321,100,200,300,400,500,600,700,800,900,1000,1100,1200,1300,1400,1500,1600,1700,1800,1900,2000,2100,2200,2300
$B/convert run $M --backend gpu --prompt-ids $IDS --max-tokens 8 --ignore-eos --print-ids --dump-logits $W/logits-gpu.f32 > $W/run-gpu.txt 2> $W/ids-gpu.txt
$B/convert run $M --prompt-ids $IDS --max-tokens 8 --ignore-eos --print-ids --kernel f32 --dump-logits $W/logits-cpu.f32 > $W/run-cpu.txt 2> $W/ids-cpu.txt
python3 - $W <<'PY' | tee $W/checks.txt
import sys, struct
w = sys.argv[1]
def f(n):
    b = open('%s/logits-%s.f32' % (w, n), 'rb').read(); return struct.unpack('%df' % (len(b) // 4), b)
def ids(n):
    l = [l for l in open('%s/ids-%s.txt' % (w, n)) if 'generated ids' in l.lower()]; return l[-1].strip() if l else 'none'
c = f('cpu'); g = f('gpu'); top = sorted(range(len(c)), key=lambda i: -c[i])[:2]
print('cpu f32 first-step top-2 margin %.4g' % (c[top[0]] - c[top[1]]))
print('gpu max |logit - cpu f32| %.4g, argmax equal %s, 8 greedy ids equal to cpu f32: %s' % (max(abs(a - b) for a, b in zip(g, c)), max(range(len(g)), key=g.__getitem__) == top[0], ids('gpu') == ids('cpu')))
PY
rm -f $W/*.f32
el "done"; save
