# Sourced by device run scripts (benches/gpu/results-*/run*.sh from 2026-12-05 on; the first,
# results-2026-12-05/run1.sh, was written as benches/gpu/next_run.sh): the setup the earlier
# run scripts each wrote out. Run from the
# repository root on an offline nvidia-h200 machine with `.gpubin` (convert and the examples,
# built here and stripped) and `.anchor` (../shared/anchors/gpu/prepare.sh; `.anchor/shapes`
# from `benches/gpu/shape_copy.py describe`) carried.
#   RUN  the run's name (its work folder /tmp/$RUN and tarball $OUT/$RUN.tar.gz)
#   NO_8B  set: no 8B GGUF (a run on the shape copies only; .anchor's generator and
#          tokenizer need not be carried)
# `.gpubin/bin.tar.xz`, where carried, is unpacked into .gpubin first (three stripped binaries
# are about 35 MB, 10 xz-compressed, against the 64 MiB a run carries).
# Gives: R (root), B (.gpubin), O ($OUT), W (work folder), el (elapsed-time echo), summary
# (one line from a `convert bench --json` report), the Vulkan loader and gguf-py installed,
# /tmp/minicpm8b.gguf generated (once a machine), VK_DRIVER_FILES at NVIDIA's ICD, and
# `copies` (the shape copies' GGUFs and bundles in /tmp, once a machine).
R=$PWD; B=$R/.gpubin; [ -f "$B/bin.tar.xz" ] && tar xJf "$B/bin.tar.xz" -C "$B"; O=${OUT:-/tmp/out}; W=/tmp/${RUN:?RUN names the run}; mkdir -p "$O" "$W" /tmp/shapes
t0=$(date +%s); el() { echo "$1 at $(( $(date +%s) - t0 )) s"; }
for f in .anchor/debs/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/gguf-site .anchor/gguf-0.19.0-py3-none-any.whl
[ -n "${NO_8B:-}" ] || [ -f /tmp/minicpm8b.gguf ] || PYTHONPATH=/tmp/gguf-site python3 .anchor/gen_minicpm8b.py 8b /tmp/minicpm8b.gguf .anchor/tokenizer.json > /dev/null
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$W/nvidia-smi.txt" 2>&1
summary() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', round(r.get('decode_cpu_ms_per_token') or 0, 3))" "$1"; }
copies() { # SmolLM2, Qwen2.5 and Gemma 3 shape copies: /tmp/NAME.copy.gguf and /tmp/NAME.bundle
  for m in smollm2 qwen2.5 gemma3; do
    [ -f .anchor/shapes/$m.json.gz ] || continue
    [ -f /tmp/$m.copy.gguf ] || { gunzip -c .anchor/shapes/$m.json.gz > /tmp/shapes/$m.json
      PYTHONPATH=/tmp/gguf-site python3 benches/gpu/shape_copy.py generate /tmp/shapes/$m.json /tmp/$m.copy.gguf > /dev/null; }
    [ -d /tmp/$m.bundle ] || "$B/convert" pack -q -o /tmp/$m.bundle /tmp/$m.copy.gguf
  done
}
