#!/usr/bin/env bash
# Perplexity speed: `convert eval --text` (the default int8 kernel, f16 KV cache, the bundle's
# prefill buckets) next to llama-perplexity (its default CPU path) on the same GGUF, text,
# context, chunks and threads, timed in one run. Prints both PPLs, both times and the ratio
# llama-perplexity time / convert eval time (above 1: lowbit is faster).
#   CONVERT LLAMA_BIN GGUF TEXT [CTX=512] [CHUNKS=all] [THREADS=nproc] [OUT=/tmp/bench-eval]
set -euo pipefail
CONVERT=${CONVERT:?}; LLAMA_BIN=${LLAMA_BIN:?}; GGUF=${GGUF:?}; TEXT=${TEXT:?}
CTX=${CTX:-512}; CHUNKS=${CHUNKS:--1}; THREADS=${THREADS:-$(nproc)}; OUT=${OUT:-/tmp/bench-eval}
mkdir -p "$OUT"
bundle="$OUT/$(basename "$GGUF" .gguf).bundle"
rm -rf "$bundle"
"$CONVERT" pack -q --context "$CTX" -o "$bundle" "$GGUF"
now() { date +%s.%N; }
t0=$(now)
"$LLAMA_BIN/llama-perplexity" -m "$GGUF" -f "$TEXT" -c "$CTX" -b "$CTX" --chunks "$CHUNKS" \
  -t "$THREADS" > "$OUT/llama.log" 2>&1
t1=$(now)
chunk_arg=(); [ "$CHUNKS" != -1 ] && chunk_arg=(--chunks "$CHUNKS")
"$CONVERT" --threads "$THREADS" eval "$bundle" -q --text "$TEXT" --ctx "$CTX" "${chunk_arg[@]}" \
  --json "$OUT/ours.json" > "$OUT/ours.log"
t2=$(now)
python3 - "$OUT" "$t0" "$t1" "$t2" "$THREADS" <<'PY'
import json, re, sys
out, t0, t1, t2, threads = sys.argv[1], *map(float, sys.argv[2:5]), sys.argv[5]
ll = open(f"{out}/llama.log").read()
m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", ll)
ours = json.load(open(f"{out}/ours.json"))["perplexity"]
r = {"threads": int(threads), "ctx": ours["ctx"], "chunks": ours["chunks"], "scored": ours["scored"],
     "llama_perplexity": {"seconds": t1 - t0, "ppl": float(m.group(1))},
     "convert_eval": {"seconds": t2 - t1, "ppl": ours["ppl"]["value"]},
     "ratio_llama_over_ours": (t1 - t0) / (t2 - t1)}
json.dump(r, open(f"{out}/bench-eval.json", "w"), indent=1)
print(json.dumps(r))
PY
