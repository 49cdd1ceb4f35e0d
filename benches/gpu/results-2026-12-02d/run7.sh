# Run 7: the SwiGLU int8 configuration back to 32 rows per workgroup of 256, 2 rows per pass (run 3: 28 us against 33), the rest as run 6.
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
B=.gpubin; O=${OUT:-/tmp/out}; mkdir -p $O
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/run7-nvidia-smi.txt
if [ ! -f /tmp/minicpm8b.gguf ]; then
python3 -m pip install -q --no-index --no-deps --target /tmp/site .anchor-slim/gguf-*.whl
PYTHONPATH=/tmp/site python3 .anchor-slim/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor-slim/tokenizer.json
fi
rm -rf /tmp/new.bundle; $B/convert gguf-to-ternary -q -o /tmp/new.bundle /tmp/minicpm8b.gguf
echo "bundle made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r['kernel'], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r['info'].get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
$B/convert bench /tmp/new.bundle $A > $O/run7-int8.json; summary $O/run7-int8.json
$B/convert bench /tmp/new.bundle $A --kernel f32 > $O/run7-f32.json; summary $O/run7-f32.json
$B/gpu_decode_profile /tmp/new.bundle 512 8 > $O/run7-profile.md 2>&1; cat $O/run7-profile.md
$B/convert bench /tmp/new.bundle $A > $O/run7-int8b.json; summary $O/run7-int8b.json
echo "done at $(( $(date +%s) - t0 )) s"
