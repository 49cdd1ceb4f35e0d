#!/usr/bin/env bash
# TQ2_0 GGUFs made by llama.cpp's own quantizer (llama-quantize, C reference
# quantize_row_tq2_0_ref), from the real test models:
#
#   llama-quantize --allow-requantize SRC OUT TQ2_0 $LOWBIT_JOBS
#
#   SmolLM2-135M-Instruct.Q4_1.gguf -> $LOWBIT_CACHE/ternary/smollm2-tq2_0-llama.gguf
#   gemma-3-270m-q4_k_m.gguf        -> $LOWBIT_CACHE/ternary/gemma3-270m-tq2_0-llama.gguf
#
# Then, for each output, prints the type of every tensor (gguf-py's reader) and
# writes testdata/ternary/<name>-tq2_0-llama.json: output sha256/size and
# {tensor: type}. If testdata/ternary/<name>-tq2_0-gguf-py.json exists
# (tests/ref/make_tq2_from_real.py), the TQ2_0 bytes of the tensors both tools
# made are compared (llama.cpp dequantizes the source with its C code, then
# quantizes; gguf-py does both in numpy).
#
#   LOWBIT_CACHE  cache root (default $HOME/.cache/lowbit)
#   LOWBIT_JOBS   llama-quantize threads (default 2)
#   LLAMA_BIN     llama.cpp bin dir (default $LOWBIT_CACHE/llama.cpp-11434/build/bin)
set -euo pipefail

CACHE="${LOWBIT_CACHE:-$HOME/.cache/lowbit}"
JOBS="${LOWBIT_JOBS:-2}"
BIN="${LLAMA_BIN:-$CACHE/llama.cpp-11434/build/bin}"
VPY="${VPY:-$CACHE/venv/bin/python}"
QUANT="$BIN/llama-quantize"
OUTDIR="$CACHE/ternary"
TESTDATA="${TESTDATA:-testdata/ternary}"

[ -x "$QUANT" ] || { echo "error: $QUANT not found (make llama)" >&2; exit 1; }
mkdir -p "$OUTDIR" "$TESTDATA"

run_one() {
  local src="$1" name="$2"
  local out="$OUTDIR/$name-tq2_0-llama.gguf"
  [ -f "$src" ] || { echo "error: $src missing (make fetch)" >&2; return 1; }
  echo "+ $QUANT --allow-requantize $src $out TQ2_0 $JOBS" >&2
  "$QUANT" --allow-requantize "$src" "$out.partial" TQ2_0 "$JOBS" > "$OUTDIR/$name-tq2_0-llama.log" 2>&1 \
    || { tail -n 30 "$OUTDIR/$name-tq2_0-llama.log" >&2; return 1; }
  mv "$out.partial" "$out"
  "$VPY" - "$src" "$out" "$name" "$TESTDATA" <<'EOF'
import hashlib, json, sys
from collections import Counter
from pathlib import Path
import numpy as np
from gguf import GGUFReader

src, out, name, testdata = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
rs = {t.name: t for t in GGUFReader(src).tensors}
ro = GGUFReader(out)

def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for c in iter(lambda: f.read(1 << 20), b""):
            h.update(c)
    return h.hexdigest()

types = {}
moves = Counter()
for t in ro.tensors:
    types[t.name] = t.tensor_type.name
    kind = t.name.split(".", 2)[-1] if t.name.startswith("blk.") else t.name
    moves[(kind, rs[t.name].tensor_type.name, t.tensor_type.name, int(t.shape[0]))] += 1
print(f"{out.name}: {out.stat().st_size} bytes, {len(types)} tensors")
print(f"  {'tensor':28s} {'from':6s} -> {'to':6s} {'ne0':>5s} count")
for (kind, a, b, ne0), n in sorted(moves.items()):
    print(f"  {kind:28s} {a:6s} -> {b:6s} {ne0:5d} {n}")
doc = {"generator": "tests/ref/make_tq2_llama_quantize.sh", "source": src.name,
       "output": {"file": out.name, "size": out.stat().st_size, "sha256": sha(out)},
       "tensor_types": types}
ref = testdata / f"{name}-tq2_0-gguf-py.json"
if ref.exists():
    g = json.loads(ref.read_text())["tensors"]
    same, diff = [], []
    for t in ro.tensors:
        if t.name in g and t.tensor_type.name == "TQ2_0":
            h = hashlib.sha256(np.asarray(t.data).tobytes()).hexdigest()
            (same if h == g[t.name]["tq2_sha256"] else diff).append(t.name)
    print(f"  TQ2_0 bytes vs gguf-py: {len(same)} identical, {len(diff)} different {diff[:5]}")
    doc["tq2_vs_gguf_py"] = {"identical": sorted(same), "different": sorted(diff)}
(testdata / f"{name}-tq2_0-llama.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
EOF
}

run_one "$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf" smollm2
run_one "$CACHE/models/gemma-3-270m-q4_k_m.gguf" gemma3-270m
