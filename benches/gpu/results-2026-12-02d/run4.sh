# Run 4: why decode wall time (bench) is above the step's GPU time (profile) on some machines:
# clocks and power sampled during the benches, a longer decode, both kernels.
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
B=.gpubin; O=${OUT:-/tmp/out}; mkdir -p $O
t0=$(date +%s)
nvidia-smi -q -d CLOCK,POWER,PERFORMANCE > $O/run4-smi-q.txt 2>&1
if [ ! -f /tmp/minicpm8b.gguf ]; then
python3 -m pip install -q --no-index --no-deps --target /tmp/site .anchor-slim/gguf-*.whl
PYTHONPATH=/tmp/site python3 .anchor-slim/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor-slim/tokenizer.json
fi
rm -rf /tmp/new.bundle; $B/convert gguf-to-ternary -q -o /tmp/new.bundle /tmp/minicpm8b.gguf
echo "bundle made at $(( $(date +%s) - t0 )) s"
nvidia-smi dmon -s pcu -d 1 > $O/run4-dmon.txt 2>&1 &
DM=$!
A="--backend gpu --prompt-tokens 512 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r['kernel'], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r['info'].get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
date +%T; $B/convert bench /tmp/new.bundle $A --gen-tokens 128 > $O/run4-int8.json; summary $O/run4-int8.json
date +%T; $B/convert bench /tmp/new.bundle $A --gen-tokens 512 > $O/run4-int8-512.json; summary $O/run4-int8-512.json
date +%T; $B/convert bench /tmp/new.bundle $A --gen-tokens 128 --kernel f32 > $O/run4-f32.json; summary $O/run4-f32.json
date +%T; $B/gpu_decode_profile /tmp/new.bundle 512 8 > $O/run4-profile.md 2>&1; head -4 $O/run4-profile.md
date +%T; $B/convert bench /tmp/new.bundle $A --gen-tokens 128 --prompt-tokens 16 > $O/run4-int8-p16.json; summary $O/run4-int8-p16.json
date +%T; kill $DM; cat $O/run4-dmon.txt | head -80
grep -i -A3 "clocks_event\|Throttle\|Power Draw\|Current Power Limit" $O/run4-smi-q.txt | head -40
echo "done at $(( $(date +%s) - t0 )) s"
