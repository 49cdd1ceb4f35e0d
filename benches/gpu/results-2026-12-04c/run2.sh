#!/usr/bin/env bash
# Device run 2 (one nvidia-h200, 2026-12-04, third session): run1.sh with the tiled kernel's
# scores and accumulators unrolled into scalars (run 1: private arrays indexed in loops, 4x
# slower than the grouped kernels); no llama.cpp (run 1 has its figures).
# (op_attention_tile_hd128: 32 (token, head) rows of one KV head a workgroup, keys and values
# staged per tile of 32 positions) beside llama.cpp b11434's Vulkan backend on the 8B-shape
# TQ2_0 GGUF in one command (pp512, pp2048, tg128), against the same binary with it off
# (LOWBIT_GPU_ATTN_TILE=0: the grouped kernels) and with splits of 256 positions
# (LOWBIT_GPU_ATTN_PREFILL_CHUNK=256); logits and greedy ids of a 40-token prompt against the
# CPU f32 reference; prefill chunk profiles. Carry .gpubin (convert, gpu_decode_profile) and
# .anchor's run.sh, debs, generator, gguf wheel, tokenizer and (slimmed) llama.cpp sdist.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run2; mkdir -p $O $W
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $W/nvidia-smi.txt
for f in .anchor/debs/*.deb; do dpkg -x "$f" /; done; ldconfig; python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/gguf-site .anchor/gguf-0.19.0-py3-none-any.whl; [ -f /tmp/minicpm8b.gguf ] || PYTHONPATH=/tmp/gguf-site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json
echo "model ready at $(( $(date +%s) - t0 )) s"
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
$B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
M=/tmp/minicpm8b.bundle
IDS=1,2345,678,9012,345,6789,1111,2222,3333,4444,5555,6666,7777,8888,9999,1234,4321,100,200,300,400,500,600,700,800,900,1000,1100,1200,1300,1400,1500,1600,1700,1800,1900,2000,2100,2200,2300
R8="$B/convert run $M --backend gpu --prompt-ids $IDS --max-tokens 48 --ignore-eos --print-ids"
$R8 --dump-logits $W/logits-tile.f32 > $W/run-tile.txt 2> $W/ids-tile.txt
LOWBIT_GPU_ATTN_TILE=0 $R8 --dump-logits $W/logits-group.f32 > $W/run-group.txt 2> $W/ids-group.txt
$B/convert run $M --prompt-ids $IDS --max-tokens 48 --ignore-eos --print-ids --kernel f32 --dump-logits $W/logits-cpu.f32 > $W/run-cpu.txt 2> $W/ids-cpu.txt
python3 - $W <<'PY'
import sys, struct
w = sys.argv[1]
def f(n):
    b = open('%s/logits-%s.f32' % (w, n), 'rb').read(); return struct.unpack('%df' % (len(b) // 4), b)
def ids(n):
    l = [l for l in open('%s/ids-%s.txt' % (w, n)) if 'ids' in l.lower()]; return l[-1].strip() if l else 'none'
c = f('cpu'); top = sorted(range(len(c)), key=lambda i: -c[i])[:2]
print('cpu f32 first-step top-2 margin %.4g' % (c[top[0]] - c[top[1]]))
for n in ['group', 'tile']:
    v = f(n)
    print('%-5s max |logit - cpu f32| %.4g, argmax equal %s, 48 greedy ids equal to cpu f32: %s' % (n, max(abs(a - b) for a, b in zip(v, c)), max(range(len(v)), key=v.__getitem__) == top[0], ids(n) == ids('cpu')))
PY
rm -f $W/*.f32
echo "checks done at $(( $(date +%s) - t0 )) s"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1))" "$1"; }
for p in 512 2048; do
  A="--backend gpu --prompt-tokens $p --gen-tokens 16 --repeats 3 --json"
  for i in 1 2; do
    $B/convert bench $M $A > $W/pp$p-tile-$i.json; summary $W/pp$p-tile-$i.json
    LOWBIT_GPU_ATTN_TILE=0 $B/convert bench $M $A > $W/pp$p-group-$i.json; summary $W/pp$p-group-$i.json
  done
  LOWBIT_GPU_ATTN_PREFILL_CHUNK=256 $B/convert bench $M $A > $W/pp$p-tile-c256.json; summary $W/pp$p-tile-c256.json
  echo "pp$p done at $(( $(date +%s) - t0 )) s"
done
$B/convert bench $M --backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json > $W/ours-tg128.json; summary $W/ours-tg128.json
P="$B/gpu_decode_profile $M 512 3"
LOWBIT_PROFILE_PREFILL=256 $P > $W/profile-prefill-tile.md 2>&1
LOWBIT_PROFILE_PREFILL=256 LOWBIT_GPU_ATTN_TILE=0 $P > $W/profile-prefill-group.md 2>&1
LOWBIT_PROFILE_PREFILL=256 LOWBIT_GPU_ATTN_PREFILL_CHUNK=256 $P > $W/profile-prefill-tile-c256.md 2>&1
for f in $W/profile-prefill-*.md; do echo "$f"; sed -n 1,4p $f; grep -i 'attention' $f | head -4; done
tar czf $O/run2.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
