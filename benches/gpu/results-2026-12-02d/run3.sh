# Run 3: the same binary's int8 configurations per shape (default) against one configuration for
# every shape (LOWBIT_GPU_Q8=uniform: r32_wg256_sgrows2_p2, run 1's), both with the norms folded.
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
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r['kernel'], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r['info'].get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token'),3))" "$1"; }
$B/convert bench /tmp/new.bundle $A > $O/run3-int8-minicpm8b.json; summary $O/run3-int8-minicpm8b.json
LOWBIT_GPU_Q8=uniform $B/convert bench /tmp/new.bundle $A > $O/run3-uniform-minicpm8b.json; summary $O/run3-uniform-minicpm8b.json
LOWBIT_GPU_Q8=uniform $B/gpu_decode_profile /tmp/new.bundle 512 8 > $O/run3-profile-uniform.md 2>&1; head -12 $O/run3-profile-uniform.md
LOWBIT_GPU_FOLD=glu $B/convert bench /tmp/new.bundle $A > $O/run3-int8-glu-minicpm8b.json; summary $O/run3-int8-glu-minicpm8b.json
$B/convert bench /tmp/new.bundle $A > $O/run3b-int8-minicpm8b.json; summary $O/run3b-int8-minicpm8b.json
echo "done at $(( $(date +%s) - t0 )) s"
