#!/usr/bin/env bash
# Device run 6 (one nvidia-h200, 2026-12-04, third session): run5.sh with the range check only
# in tiles not inside every row's range (run 5 checked every position: attention 547 -> 660 us);
# the tiled prefill attention
# with step 5 skipping the positions outside each row's range (so that an inf value a later
# token of the chunk attends to stays out of earlier rows), against LOWBIT_GPU_ATTN_TILE=0,
# alternating; the prefill chunk profile; logits and greedy ids against the CPU f32
# reference. No llama.cpp (run 4 has its figures). Carry .gpubin and .anchor.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run6; mkdir -p $O $W
t0=$(date +%s)
for f in .anchor/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/gguf-site .anchor/gguf-0.19.0-py3-none-any.whl
[ -f /tmp/minicpm8b.gguf ] || PYTHONPATH=/tmp/gguf-site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
rm -rf /tmp/minicpm8b.bundle; $B/convert gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
M=/tmp/minicpm8b.bundle
IDS=1,2345,678,9012,345,6789,1111,2222,3333,4444,5555,6666,7777,8888,9999,1234,4321,100,200,300,400,500,600,700,800,900,1000,1100,1200,1300,1400,1500,1600,1700,1800,1900,2000,2100,2200,2300
$B/convert run $M --backend gpu --prompt-ids $IDS --max-tokens 48 --ignore-eos --print-ids > $W/run-tile.txt 2> $W/ids-tile.txt
$B/convert run $M --prompt-ids $IDS --max-tokens 48 --ignore-eos --print-ids --kernel f32 > $W/run-cpu.txt 2> $W/ids-cpu.txt
echo "48 greedy ids equal to cpu f32: $( [ "$(grep -i 'generated ids' $W/ids-tile.txt)" = "$(grep -i 'generated ids' $W/ids-cpu.txt)" ] && echo yes || echo no)"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1))" "$1"; }
for i in 1 2; do
  for p in 512 2048; do
    A="--backend gpu --prompt-tokens $p --gen-tokens 16 --repeats 3 --json"
    $B/convert bench $M $A > $W/pp$p-tile-$i.json; summary $W/pp$p-tile-$i.json
    LOWBIT_GPU_ATTN_TILE=0 $B/convert bench $M $A > $W/pp$p-group-$i.json; summary $W/pp$p-group-$i.json
  done
done
LOWBIT_PROFILE_PREFILL=256 $B/gpu_decode_profile $M 512 3 > $W/profile-prefill-tile.md 2>&1
sed -n 3p $W/profile-prefill-tile.md; grep 'op_attention' $W/profile-prefill-tile.md
tar czf $O/run6.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
