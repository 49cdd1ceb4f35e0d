#!/usr/bin/env python3
"""Ground-truth vectors for the runtime: for every case of testdata/llama/<model>.json (the same
prompt ids llama.cpp used), the float64 forward pass of tests/ref/numpy_forward.py gives the
first-step logits and a greedy continuation. Writes testdata/runtime/<model>.json and
testdata/runtime/<model>/<i>.logits.f32 (little-endian f32).

Usage: gen_ground_truth.py MODEL.gguf [--n-ctx N] [--greedy 32]
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--n-ctx", type=int, default=None)
    ap.add_argument("--greedy", type=int, default=32)
    a = ap.parse_args()
    stem = a.model.name.removesuffix(".gguf")
    llama = json.loads((REPO / "testdata/llama" / f"{stem}.json").read_text())
    outdir = REPO / "testdata/runtime" / stem
    outdir.mkdir(parents=True, exist_ok=True)
    cases = []
    for i, c in enumerate(llama["cases"]):
        ids = ",".join(str(t) for t in c["prompt_ids"])
        lf = outdir / f"{i}.logits.f32"
        cmd = [sys.executable, str(HERE / "numpy_forward.py"), str(a.model), ids, str(lf), "--greedy", str(a.greedy)]
        # The context decides LongRoPE's long or short factors: use the case's own.
        n_ctx = c.get("n_ctx") or a.n_ctx
        if n_ctx:
            cmd += ["--n-ctx", str(n_ctx)]
        r = subprocess.run(cmd, check=True, capture_output=True, text=True)
        g = json.loads(r.stdout.strip().splitlines()[-1])
        cases.append({
            "prompt": c["prompt"],
            "prompt_ids": c["prompt_ids"],
            "logits_file": f"{stem}/{i}.logits.f32",
            "n_ctx": c.get("n_ctx") or a.n_ctx,
            "greedy_ids": g["greedy_ids"],
            "top2_margins": g["top2_margins"],
        })
        print(f"case {i}: {g['greedy_ids'][:8]}...", file=sys.stderr)
    data = a.model.read_bytes()
    out = {
        "generator": "tests/ref/gen_ground_truth.py (tests/ref/numpy_forward.py, float64)",
        "model_file": a.model.name,
        "model_sha256": hashlib.sha256(data).hexdigest(),
        "n_ctx": a.n_ctx,
        "cases": cases,
    }
    (REPO / "testdata/runtime" / f"{stem}.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
