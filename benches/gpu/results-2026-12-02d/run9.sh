# Run 9: decode attention in splits of 32 positions (LOWBIT_GPU_ATTN_CHUNK=32, a measurement
# knob) against the default 64, int8 kernels as run 7.
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
B=.gpubin; O=${OUT:-/tmp/out}; mkdir -p $O
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .anchor-slim/gguf-*.whl
PYTHONPATH=/tmp/site python3 .anchor-slim/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor-slim/tokenizer.json
$B/convert gguf-to-ternary -q -o /tmp/new.bundle /tmp/minicpm8b.gguf
echo "bundle made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r['kernel'], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r['info'].get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
$B/convert bench /tmp/new.bundle $A > $O/run9-int8.json; summary $O/run9-int8.json
LOWBIT_GPU_ATTN_CHUNK=32 $B/convert bench /tmp/new.bundle $A > $O/run9-int8-chunk32.json; summary $O/run9-int8-chunk32.json
LOWBIT_GPU_ATTN_CHUNK=32 $B/gpu_decode_profile /tmp/new.bundle 512 8 > $O/run9-profile-chunk32.md 2>&1; head -12 $O/run9-profile-chunk32.md; grep attention $O/run9-profile-chunk32.md
echo "done at $(( $(date +%s) - t0 )) s"
