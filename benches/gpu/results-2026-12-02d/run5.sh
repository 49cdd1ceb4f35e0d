# Run 5: decode wall time with the read-back waited on by blocking (default) and by polling
# in a loop (LOWBIT_GPU_SPIN=1), both kernels.
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
B=.gpubin; O=${OUT:-/tmp/out}; mkdir -p $O
t0=$(date +%s)
if [ ! -f /tmp/minicpm8b.gguf ]; then
python3 -m pip install -q --no-index --no-deps --target /tmp/site .anchor-slim/gguf-*.whl
PYTHONPATH=/tmp/site python3 .anchor-slim/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor-slim/tokenizer.json
fi
rm -rf /tmp/new.bundle; $B/convert gguf-to-ternary -q -o /tmp/new.bundle /tmp/minicpm8b.gguf
echo "bundle made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 64 --gen-tokens 256 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r['kernel'], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r['info'].get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
$B/convert bench /tmp/new.bundle $A > $O/run5-int8.json; summary $O/run5-int8.json
LOWBIT_GPU_SPIN=1 $B/convert bench /tmp/new.bundle $A > $O/run5-int8-spin.json; summary $O/run5-int8-spin.json
$B/convert bench /tmp/new.bundle $A --kernel f32 > $O/run5-f32.json; summary $O/run5-f32.json
LOWBIT_GPU_SPIN=1 $B/convert bench /tmp/new.bundle $A --kernel f32 > $O/run5-f32-spin.json; summary $O/run5-f32-spin.json
nproc; cat /proc/cpuinfo | grep "model name" | head -1
echo "done at $(( $(date +%s) - t0 )) s"
