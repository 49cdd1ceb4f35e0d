#!/usr/bin/env python3
"""The README's quality table, in one run: for each model, `convert pack` of its GGUF (the
reference) and the variants below, measured by `convert eval` on Botchan (perplexity and the KL
statistics against the reference) and the four BIG-bench tasks.

    table.py --convert target/release/convert --llama-bin DIR --text botchan.txt \
             --tasks DIR/benchmark_tasks --out DIR [--models smollm2,qwen] [--chunks 8]
             [--limit 40] [--threads 2]

Variants: llama.cpp's Q8_0 and Q4_K_M of the same weights (llama-quantize --allow-requantize,
the controls), palettize k-means 8/6/4-bit with G = 32 and G = 8, uniform 8-bit (G = 32), and
`gguf-to-ternary --ternarize`. Tasks run without --reference for each variant (the reference's
answers are run once per model, with the same --limit/--seed, so the same examples); the
paired difference and McNemar's p-value are then computed here from the two reports'
per-example correctness, with the formulas of src/eval/stats.rs. Writes results.json and
table.md into --out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

CACHE = Path(os.environ.get("LOWBIT_CACHE", Path.home() / ".cache" / "lowbit"))
MODELS = {
    "smollm2": CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen": CACHE / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}
# Models whose linears cannot all be ternarized (K not a multiple of 256): the ternarized row
# is made from this GGUF instead (its ternarizable linears as TQ2_0, by gguf-py).
TERNARY_SOURCE = {
    "smollm2": CACHE / "ternary" / "smollm2-tq2_0-gguf-py.gguf",
    "qwen": CACHE / "ternary" / "qwen2.5-0.5b-tq2_0-gguf-py.gguf",
}
TASKS = ["arithmetic/2_digit_addition", "strategyqa", "sports_understanding", "navigate"]
# name -> how it is made: ("llama", type) | ("palettize", args) | ("ternary", args)
VARIANTS = [
    ("Q8_0 (llama-quantize)", ("llama", "Q8_0")),
    ("Q4_K_M (llama-quantize)", ("llama", "Q4_K_M")),
    ("k-means 8-bit G=32", ("palettize", ["--bits", "8", "--group-size", "32"])),
    ("k-means 8-bit G=8", ("palettize", ["--bits", "8", "--group-size", "8"])),
    ("k-means 6-bit G=32", ("palettize", ["--bits", "6", "--group-size", "32"])),
    ("k-means 6-bit G=8", ("palettize", ["--bits", "6", "--group-size", "8"])),
    ("k-means 4-bit G=32", ("palettize", ["--bits", "4", "--group-size", "32"])),
    ("k-means 4-bit G=8", ("palettize", ["--bits", "4", "--group-size", "8"])),
    ("uniform 8-bit G=32", ("palettize", ["--bits", "8", "--group-size", "32", "--mode", "uniform"])),
    ("ternarized (gguf-to-ternary --ternarize)", ("ternary", ["--ternarize"])),
]
Z95 = 1.959963984540054


def sh(args: list, log: Path | None = None, ok=(0,)) -> subprocess.CompletedProcess:
    print("+", " ".join(str(a) for a in args), file=sys.stderr, flush=True)
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if log:
        log.write_text(r.stdout + r.stderr)
    if r.returncode not in ok:
        sys.exit(f"{args[0]} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r


def paired(a: str, b: str) -> dict:
    """src/eval/stats.rs `paired` and `mcnemar_exact` on two correctness strings."""
    n = min(len(a), len(b))
    bb = sum(1 for i in range(n) if a[i] == "1" and b[i] == "0")
    cc = sum(1 for i in range(n) if a[i] == "0" and b[i] == "1")
    diff = (bb - cc) / n
    se = math.sqrt(max(bb + cc - (bb - cc) ** 2 / n, 0.0)) / n
    k, m = min(bb, cc), bb + cc
    p = 1.0 if m == 0 else min(1.0, 2 * sum(math.comb(m, i) for i in range(k + 1)) / 2 ** m)
    return {"diff": diff, "low": diff - Z95 * se, "high": diff + Z95 * se, "mcnemar_p": p}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--convert", type=Path, required=True)
    ap.add_argument("--llama-bin", type=Path, required=True)
    ap.add_argument("--text", type=Path, required=True)
    ap.add_argument("--tasks", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default="smollm2,qwen")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--skip-tasks", action="store_true",
                    help="text only for variants whose task report does not exist yet")
    ap.add_argument("--variants", help="comma-separated prefixes of the variant names to run "
                    "(default all), e.g. 'Q8_0,Q4_K_M,k-means 8-bit G=32,ternarized'")
    a = ap.parse_args()
    variants = VARIANTS
    if a.variants:
        keep = [v.strip() for v in a.variants.split(",")]
        variants = [v for v in VARIANTS if any(v[0].startswith(k) for k in keep)]
    a.out.mkdir(parents=True, exist_ok=True)
    conv = [a.convert, "--threads", a.threads]
    task_args = []
    for t in TASKS:
        task_args += ["--task", a.tasks / t / "task.json"]
    prev = a.out / "results.json"
    results = {"chunks": a.chunks, "ctx": 512, "limit": a.limit, "threads": a.threads, "models": {}}
    t_start = time.time()
    for m in a.models.split(","):
        src = MODELS[m]
        d = a.out / m
        d.mkdir(exist_ok=True)
        ref = d / "reference.bundle"
        if not ref.exists():
            sh(conv + ["pack", "-q", "--context", "1024", "-o", ref, src])
        ref_tasks = d / "reference-tasks.json"
        if not ref_tasks.exists():
            sh(conv + ["eval", ref, "-q", *task_args, "--limit", a.limit, "--json", ref_tasks])
        ref_report = json.loads(ref_tasks.read_text())
        rows = []
        for name, (kind, spec) in variants:
            slug = "".join(c if c.isalnum() else "-" for c in name.split(" (")[0]).strip("-")
            b = d / f"{slug}.bundle"
            if not b.exists():
                if kind == "llama":
                    g = d / f"{slug}.gguf"
                    sh([a.llama_bin / "llama-quantize", "--allow-requantize", src, g, spec, a.threads])
                    sh(conv + ["pack", "-q", "--context", "1024", "-o", b, g])
                elif kind == "palettize":
                    sh(conv + ["palettize", "-q", "--context", "1024", *spec, "-o", b, src])
                elif m in TERNARY_SOURCE:
                    # K = 576 (SmolLM2), 896 (Qwen2.5) is no multiple of 256: --ternarize
                    # cannot take every linear, so the ternarized row is gguf-py's TQ2_0 of
                    # the linears that can be (the ffn_down; make ternary-real, make
                    # eval-table), through gguf-to-ternary.
                    sh(conv + ["gguf-to-ternary", "-q", "--context", "1024", "-o", b, TERNARY_SOURCE[m]])
                else:
                    sh(conv + ["gguf-to-ternary", "-q", "--context", "1024", *spec, "-o", b, src])
            text_json, tasks_json = d / f"{slug}-text.json", d / f"{slug}-tasks.json"
            if not text_json.exists():
                sh(conv + ["eval", b, "-q", "--reference", ref, "--text", a.text, "--ctx", 512,
                           "--chunks", a.chunks, "--json", text_json])
            if not tasks_json.exists() and not a.skip_tasks:
                sh(conv + ["eval", b, "-q", *task_args, "--limit", a.limit, "--json", tasks_json])
            tr = json.loads(text_json.read_text())["perplexity"]
            tk = json.loads(tasks_json.read_text())["tasks"] if tasks_json.exists() else []
            size = sum(f.stat().st_size for f in b.iterdir() if f.is_file())
            shown = name
            if kind == "ternary" and m in TERNARY_SOURCE:
                shown = "ternarized ffn_down only (gguf-py TQ2_0, gguf-to-ternary)"
            row = {"variant": shown, "bundle_bytes": size, "ppl": tr["ppl"], "reference": tr["reference"],
                   "tasks": {}}
            for t, rt in zip(tk, ref_report["tasks"]):
                assert t["indices"] == rt["indices"]
                row["tasks"][t["task"]] = {"acc": t["acc"], "acc_reference": rt["acc"],
                                           "paired": paired(t["correct"], rt["correct"])}
            rows.append(row)
            print(name, round(tr["ppl"]["value"], 3), round(tr["reference"]["kld"]["value"], 5), file=sys.stderr)
        ref_size = sum(f.stat().st_size for f in ref.iterdir() if f.is_file())
        results["models"][m] = {"gguf": src.name, "reference_bytes": ref_size,
                                "chunks": a.chunks, "limit": a.limit, "threads": a.threads,
                                "reference_tasks": {t["task"]: t["acc"] for t in ref_report["tasks"]},
                                "rows": rows}
    results["seconds"] = time.time() - t_start
    # Models measured by an earlier run into the same folder stay in the table.
    if prev.exists():
        for m, r in json.loads(prev.read_text())["models"].items():
            results["models"].setdefault(m, r)
    (a.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    md = []
    for m, r in results["models"].items():
        names = list(r["reference_tasks"])
        md.append(f"**{m}** ({r['gguf']}; Botchan {r.get('chunks', results['chunks'])} chunks of 512, "
                  f"{r.get('limit', results['limit'])} examples per task; reference: `convert pack`, "
                  + ", ".join(f"{n} acc {v['value']:.3f}" for n, v in r["reference_tasks"].items()) + ")\n")
        md.append("| variant | MB | PPL | PPL ratio | mean KLD | 99% KLD | same top | RMS Δp | "
                  + " | ".join(f"{n} acc (Δ vs ref [95%])" for n in names) + " |")
        md.append("|---" * (8 + len(names)) + "|")
        for row in r["rows"]:
            ref = row["reference"]
            cells = [row["variant"], f"{row['bundle_bytes'] / 1e6:.0f}",
                     f"{row['ppl']['value']:.3f}", f"{ref['ppl_ratio']['value']:.4f}",
                     f"{ref['kld']['value']:.5f}", f"{ref['kld_quantiles']['p99']:.4f}",
                     f"{100 * ref['same_top']['value']:.2f}%", f"{100 * ref['p_diff_rms']['value']:.2f}%"]
            for n in names:
                if n not in row["tasks"]:
                    cells.append("-")
                    continue
                t = row["tasks"][n]
                p = t["paired"]
                cells.append(f"{t['acc']['value']:.3f} ({p['diff']:+.3f} [{p['low']:+.3f}, {p['high']:+.3f}])")
            md.append("| " + " | ".join(cells) + " |")
        md.append("")
    (a.out / "table.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
