#!/usr/bin/env python3
"""Decode benchmark: `convert bench` on a bundle next to llama.cpp's `llama-bench` on the GGUF
it came from, same threads, same prompt and generation lengths, in one run.

Reports prompt and decode tokens/s for both, their ratio, lowbit's peak resident memory against
weights + KV cache, and how close decode comes to the memory bandwidth measured in the same run
(bytes of weights read per token x tokens/s, against numpy summing a 2 GiB buffer).

Usage: runtime_bench.py --convert target/release/convert --llama-bench PATH
         [--threads 2] [--prompt 64] [--gen 32] [--kernels f32,int8] [--json OUT]
         BUNDLE=GGUF [BUNDLE=GGUF ...]
"""
import argparse
import json
import os
import subprocess
import sys
import time

from benchutil import cpu_name  # noqa: E402  (benches/ is on sys.path when run as a script)


def memcpy_gbps():
    """Copy bandwidth (read + write counted once each) of a 512 MiB buffer, best of 3."""
    try:
        import numpy as np
    except ImportError:
        return None
    a = np.ones(64 << 20, dtype=np.float64)
    b = np.empty_like(a)
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        np.copyto(b, a)
        dt = time.perf_counter() - t
        best = max(best, 2 * a.nbytes / dt / 1e9)
    return best


def read_gbps():
    """Read bandwidth: numpy sums a 2 GiB uint64 buffer (one thread; on the machines measured
    a second thread adds nothing), best of 3."""
    try:
        import numpy as np
    except ImportError:
        return None
    a = np.ones(256 << 20, dtype=np.uint64)
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        a.sum()
        best = max(best, a.nbytes / (time.perf_counter() - t) / 1e9)
    del a
    return best


def llama_bench(exe, gguf, threads, p, n):
    out = subprocess.run(
        [exe, "-m", gguf, "-t", str(threads), "-p", str(p), "-n", str(n), "-r", "2", "-o", "json"],
        capture_output=True, text=True, check=True,
    ).stdout
    rows = json.loads(out)
    res = {}
    for r in rows:
        kind = "prompt" if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0 else "decode"
        res[kind] = r["avg_ts"]
    return res


def lowbit_bench(exe, bundle, threads, p, n, kernel):
    out = subprocess.run(
        [exe, "--threads", str(threads), "bench", bundle, "--prompt-tokens", str(p),
         "--gen-tokens", str(n), "--kernel", kernel, "--repeats", "2", "--json"],
        capture_output=True, text=True, check=True,
    ).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--convert", default="target/release/convert")
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--kernels", default="f32,int8")
    ap.add_argument("--json")
    ap.add_argument("pairs", nargs="+", help="BUNDLE=GGUF")
    a = ap.parse_args()
    cbw = memcpy_gbps()
    bw = read_gbps()
    results = {"machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "memcpy_gbps": cbw,
                           "read_gbps": bw},
               "threads": a.threads, "prompt": a.prompt, "gen": a.gen, "models": []}
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; threads {a.threads}; "
          f"prompt {a.prompt}, gen {a.gen}; memory read {bw and round(bw, 1)} GB/s, "
          f"copy {cbw and round(cbw, 1)} GB/s\n")
    print("| model | engine | prompt tok/s | decode tok/s | decode vs llama.cpp | peak RSS / (weights + KV) | MB read per token | weight reads GB/s (of read bw) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for pair in a.pairs:
        bundle, gguf = pair.split("=", 1)
        ll = llama_bench(a.llama_bench, gguf, a.threads, a.prompt, a.gen)
        name = os.path.basename(gguf)
        print(f"| {name} | llama.cpp | {ll.get('prompt', 0):.2f} | {ll.get('decode', 0):.2f} | 1.00 | - | - | - |")
        entry = {"gguf": name, "llama_cpp": ll, "lowbit": {}}
        for k in a.kernels.split(","):
            lb = lowbit_bench(a.convert, bundle, a.threads, a.prompt, a.gen, k)
            entry["lowbit"][k] = lb
            ratio = lb["decode_tokens_per_second"] / ll["decode"] if ll.get("decode") else float("nan")
            rb = lb["decode_weight_read_gb_per_second"]
            frac = f" ({rb / bw:.0%})" if bw else ""
            print(f"| {name} | lowbit cpu, {k} | {lb['prompt_tokens_per_second']:.2f} | "
                  f"{lb['decode_tokens_per_second']:.2f} | {ratio:.2f} | "
                  f"{lb['rss_over_weights_plus_kv']:.2f} | {lb['decode_bytes_per_token'] / 1e6:.1f} | "
                  f"{rb:.2f}{frac} |")
        results["models"].append(entry)
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        json.dump(results, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
