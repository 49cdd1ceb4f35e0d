#!/usr/bin/env bash
# Device run 4 (one nvidia-h200, 2026-12-03, sixth session): the single-token body built
# with MATVEC_ROWS = 2 (the split's rule halving from 2) against 1 row a workgroup forced in
# the same binary (LOWBIT_GPU_MATVEC_WG_ROWS=1), on the SmolLM2 and Qwen2.5 shape copies;
# decode profiles at position 512. No llama.cpp. Carry .gpubin and .anchor (gguf wheel,
# shapes/).
set -u
cd "$(dirname "$0")/../../.."
R=$PWD; B=$R/.gpubin; O=${OUT:-/tmp/out}; W=/tmp/run4; mkdir -p $O $W /tmp/shapes
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --target /tmp/gguf-site .anchor/gguf-0.19.0-py3-none-any.whl
for f in .anchor/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
for m in smollm2 qwen2.5; do
  gunzip -c .anchor/shapes/$m.json.gz > /tmp/shapes/$m.json
  PYTHONPATH=/tmp/gguf-site python3 benches/gpu/shape_copy.py generate /tmp/shapes/$m.json /tmp/$m.copy.gguf > /dev/null
  $B/convert pack -q -o /tmp/$m.bundle /tmp/$m.copy.gguf
done
echo "bundles made at $(( $(date +%s) - t0 )) s"
A="--backend gpu --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json"
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'))" "$1"; }
for m in smollm2 qwen2.5; do
  for i in 1 2; do
    $B/convert bench /tmp/$m.bundle $A > $W/ours-$m-$i.json; summary $W/ours-$m-$i.json
    LOWBIT_GPU_MATVEC_WG_ROWS=1 $B/convert bench /tmp/$m.bundle $A > $W/ours-$m-wgrows1-$i.json; summary $W/ours-$m-wgrows1-$i.json
  done
  $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m.md 2>&1
  LOWBIT_GPU_MATVEC_WG_ROWS=1 $B/gpu_decode_profile /tmp/$m.bundle 512 8 > $W/profile-$m-wgrows1.md 2>&1
  for p in $W/profile-$m.md $W/profile-$m-wgrows1.md; do echo "$(basename $p): $(sed -n 3p $p)"; head -12 $p | tail -8; done
done
tar czf $O/run4.tar.gz -C $W .
echo "done at $(( $(date +%s) - t0 )) s"
