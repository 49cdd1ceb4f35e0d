#!/usr/bin/env bash
# The GPU benchmark: lowbit's GPU backend next to llama.cpp b11434's Vulkan backend, on one GPU,
# in one run (`make bench-gpu` here; on an offline GPU machine as BENCHMARKS.md says).
#   ANCHOR   folder filled by ../shared/anchors/gpu/prepare.sh (llama.cpp source, Vulkan
#            loader packages, gguf-py, the MiniCPM4-8B-shape generator)
#   SHAPES   folder of shape_copy.py descriptions (SmolLM2, Qwen2.5-0.5B), or empty
#   CONVERT  the convert binary
#   OUT      where the reports go
# Stages (STAGE="all", or a list of: llama copies ours): llama.cpp's llama-bench on the 8B-shape
# TQ2_0 GGUF (llama), on the shape copies (copies); ours on bundles made from the same files.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ANCHOR=${ANCHOR:?folder from prepare.sh}; SHAPES=${SHAPES:-}; CONVERT=${CONVERT:?convert binary}
OUT=${OUT:-/tmp/bench-gpu}; STAGE=${STAGE:-all}; mkdir -p "$OUT"
PP=${PP:-512}; TG=${TG:-128}; REPS=${REPS:-3}
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES=$icd
gen() { # the shape copies, once
  for j in "$SHAPES"/*.json; do
    [ -f "$j" ] || continue
    g=/tmp/$(basename "$j" .json).copy.gguf
    [ -f "$g" ] || PYTHONPATH=/tmp/gguf-site python3 "$here/shape_copy.py" generate "$j" "$g"
  done
}
has() { [ "$STAGE" = all ] || [[ " $STAGE " == *" $1 "* ]]; }
if has llama; then
  bash "$ANCHOR/run.sh" -p "$PP" -n "$TG" -r "$REPS" | tee "$OUT/llama-minicpm8b.md"
fi
if has copies; then
  gen
  for g in /tmp/*.copy.gguf; do
    [ -f "$g" ] || continue
    /tmp/llama-vk/bin/llama-bench -m "$g" -ngl 99 -p "$PP" -n "$TG" -r "$REPS" -o md 2>&1 \
      | tee "$OUT/llama-$(basename "$g" .gguf).md"
  done
fi
if has ours; then
  gen
  "$CONVERT" gpu-info | tee "$OUT/gpu-info.txt"
  [ -d /tmp/minicpm8b.bundle ] || "$CONVERT" gguf-to-ternary -q -o /tmp/minicpm8b.bundle /tmp/minicpm8b.gguf
  for g in /tmp/*.copy.gguf; do
    [ -f "$g" ] || continue
    b=/tmp/$(basename "$g" .gguf).bundle
    [ -d "$b" ] || "$CONVERT" pack -q -o "$b" "$g"
  done
  for b in /tmp/minicpm8b.bundle /tmp/*.copy.bundle; do
    [ -d "$b" ] || continue
    n=$(basename "$b" .bundle)
    "$CONVERT" bench "$b" --backend gpu --prompt-tokens "$PP" --gen-tokens "$TG" --repeats "$REPS" \
      --json > "$OUT/ours-$n.json" || echo "bench $n failed" >&2
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], 'pp', round(r['prompt_tokens_per_second'],1), 'tg', round(r['decode_tokens_per_second'],1), 'dispatches', r.get('dispatches_per_token'), 'cpu ms/token', r.get('decode_cpu_ms_per_token'))" "$OUT/ours-$n.json" "$n" || true
  done
fi
