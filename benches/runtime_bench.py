#!/usr/bin/env python3
"""Runtime benchmark: `convert bench` on a bundle next to llama.cpp's `llama-bench` on the GGUF
it came from, same threads, same prompt and generation lengths, in one run.

Reports prompt tokens/s at each prompt length (lowbit runs the prompt as prefill chunks in the
bundle's buckets) and decode tokens/s for both, their ratios, lowbit's peak resident memory against
weights + KV cache, and how close decode comes to the memory bandwidth measured in the same run
(bytes of weights read per token x tokens/s, against numpy summing a 2 GiB buffer).

With --depths, also decode after a prompt of each depth (the KV cache holding that many
positions: what a long chat or document runs at), lowbit's `bench --prompt-tokens D` beside
llama-bench's `-p 0 -n GEN -d D`, for the GGUFs of at most --depth-max-gb (the prompts of a
larger model would take most of the run), with the first of --kernels. A depth whose prompt and
GEN tokens do not fit the bundle's context is reported as refused.

Usage: runtime_bench.py --convert target/release/convert --llama-bench PATH
         [--threads 2] [--prompts 64,512] [--gen 32] [--kernels int8,f32] [--json OUT]
         [--depths 1024,4000] [--depth-max-gb 1]
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


def llama_bench(exe, gguf, threads, prompts, n):
    """llama-bench: prompt processing at each length in `prompts` (pp) and decode of n tokens
    (tg), 2 repetitions each; tokens/s by kind ("pp64", ..., "decode")."""
    out = subprocess.run(
        [exe, "-m", gguf, "-t", str(threads), "-p", ",".join(map(str, prompts)), "-n", str(n),
         "-r", "2", "-o", "json"],
        capture_output=True, text=True, check=True,
    ).stdout
    rows = json.loads(out)
    res = {}
    for r in rows:
        if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0:
            res[f"pp{r['n_prompt']}"] = r["avg_ts"]
        else:
            res["decode"] = r["avg_ts"]
    return res


def llama_depths(exe, gguf, threads, depths, n):
    """llama-bench: decode of n tokens after each depth in `depths` (tg n @ dD), 2 repetitions;
    tokens/s by depth."""
    out = subprocess.run(
        [exe, "-m", gguf, "-t", str(threads), "-p", "0", "-n", str(n),
         "-d", ",".join(map(str, depths)), "-r", "2", "-o", "json"],
        capture_output=True, text=True, check=True,
    ).stdout
    return {r.get("n_depth", 0): r["avg_ts"] for r in json.loads(out) if r.get("n_gen", 0) > 0}


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
    ap.add_argument("--prompts", default="64,512",
                    help="prompt lengths (pp) timed on both engines; decode runs after the first")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--kernels", default="int8,f32")
    ap.add_argument("--json")
    ap.add_argument("--llama-label", default="llama.cpp",
                    help="the anchor's name in the table (e.g. that of an AVX2-only build)")
    ap.add_argument("--depths", default="",
                    help="decode after prompts of these lengths too (comma-separated; none: skip)")
    ap.add_argument("--depth-max-gb", type=float, default=1.0,
                    help="decode at depth only for GGUFs of at most this many GB")
    ap.add_argument("pairs", nargs="+", help="BUNDLE=GGUF")
    a = ap.parse_args()
    prompts = [int(x) for x in a.prompts.split(",")]
    depths = [int(x) for x in a.depths.split(",") if x]
    cbw = memcpy_gbps()
    bw = read_gbps()
    results = {"machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "memcpy_gbps": cbw,
                           "read_gbps": bw},
               "llama_bench": a.llama_bench, "lowbit_isa": os.environ.get("LOWBIT_ISA"),
               "threads": a.threads, "prompts": prompts, "gen": a.gen, "depths": depths,
               "models": []}
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; threads {a.threads}; "
          f"prompts {prompts}, gen {a.gen}; memory read {bw and round(bw, 1)} GB/s, "
          f"copy {cbw and round(cbw, 1)} GB/s; llama-bench {a.llama_bench}; "
          f"LOWBIT_ISA={os.environ.get('LOWBIT_ISA', '(unset)')}\n")
    pp_cols = " | ".join(f"pp{p} tok/s (vs llama.cpp)" for p in prompts)
    print(f"| model | engine | {pp_cols} | decode tok/s | decode vs llama.cpp | peak RSS / (weights + KV) | MB read per token | weight reads GB/s (of read bw) |")
    print("|---|---|" + "---:|" * (len(prompts) + 5))
    for pair in a.pairs:
        bundle, gguf = pair.split("=", 1)
        ll = llama_bench(a.llama_bench, gguf, a.threads, prompts, a.gen)
        name = os.path.basename(gguf)
        pps = " | ".join(f"{ll.get(f'pp{p}', 0):.2f}" for p in prompts)
        print(f"| {name} | {a.llama_label} | {pps} | {ll.get('decode', 0):.2f} | 1.00 | - | - | - |", flush=True)
        entry = {"gguf": name, "bundle": bundle, "llama_cpp": ll, "lowbit": {}}
        for k in a.kernels.split(","):
            runs = {p: lowbit_bench(a.convert, bundle, a.threads, p, a.gen, k) for p in prompts}
            entry["lowbit"][k] = {str(p): r for p, r in runs.items()}
            lb = runs[prompts[0]]
            ratio = lb["decode_tokens_per_second"] / ll["decode"] if ll.get("decode") else float("nan")
            rb = lb["decode_weight_read_gb_per_second"]
            frac = f" ({rb / bw:.0%})" if bw else ""
            pps = " | ".join(
                f"{runs[p]['prompt_tokens_per_second']:.2f} ({runs[p]['prompt_tokens_per_second'] / ll[f'pp{p}']:.2f}x)"
                if ll.get(f"pp{p}") else f"{runs[p]['prompt_tokens_per_second']:.2f}"
                for p in prompts)
            level = lb.get("cpu_level") or "?"
            print(f"| {name} | lowbit cpu, {k} ({level}) | {pps} | "
                  f"{lb['decode_tokens_per_second']:.2f} | {ratio:.2f} | "
                  f"{lb['rss_over_weights_plus_kv']:.2f} | {lb['decode_bytes_per_token'] / 1e6:.1f} | "
                  f"{rb:.2f}{frac} |", flush=True)
        results["models"].append(entry)
    if depths:
        print(f"\nDecode of {a.gen} tokens after a prompt of each depth (tok/s, vs llama.cpp's "
              f"`-p 0 -n {a.gen} -d DEPTH`; GGUFs up to {a.depth_max_gb} GB):\n")
        cols = " | ".join(f"decode @ {d} (vs llama.cpp)" for d in depths)
        print(f"| model | engine | {cols} |")
        print("|---|---|" + "---:|" * len(depths))
        for pair, entry in zip(a.pairs, results["models"]):
            bundle, gguf = pair.split("=", 1)
            if os.path.getsize(gguf) > a.depth_max_gb * 1e9:
                continue
            ll = llama_depths(a.llama_bench, gguf, a.threads, depths, a.gen)
            entry["llama_cpp_depths"] = ll
            name = entry["gguf"]
            print(f"| {name} | {a.llama_label} | " + " | ".join(
                f"{ll.get(d, 0):.2f}" for d in depths) + " |", flush=True)
            k = a.kernels.split(",")[0]
            runs = {}
            for d in depths:
                try:
                    runs[d] = lowbit_bench(a.convert, bundle, a.threads, d, a.gen, k)
                except subprocess.CalledProcessError as e:
                    # convert bench refuses a prompt and generation past the bundle's context.
                    print(f"  {name} @ {d}: {(e.stderr or '').strip()}", file=sys.stderr)
            entry["lowbit_depths"] = {k: {str(d): r for d, r in runs.items()}}
            cells = []
            for d in depths:
                if d not in runs:
                    cells.append("refused")
                    continue
                t = runs[d]["decode_tokens_per_second"]
                cells.append(f"{t:.2f} ({t / ll[d]:.2f}x)" if ll.get(d) else f"{t:.2f}")
            level = next((r.get("cpu_level") for r in runs.values()), None) or "?"
            print(f"| {name} | lowbit cpu, {k} ({level}) | " + " | ".join(cells) + " |",
                  flush=True)
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        json.dump(results, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
