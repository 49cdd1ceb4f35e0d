#!/usr/bin/env python3
"""Palettization benchmark (issue: convert palettize) against coremltools 9.0 in the same run.

Both tools palettize the same f16 weights (SmolLM2's, dequantized by `convert dequantize
--dtype f16`) with k-means, per_grouped_channel, group size 32, one bit width at a time:
coremltools through `palettize_weights.blockwise_compress` (its kmeans1d path, the one
`OpPalettizerConfig(mode="kmeans", granularity="per_grouped_channel", group_size=32)` takes,
`num_kmeans_workers` = --threads), lowbit through `convert palettize --include` on the same
tensors with --workers = --threads. Reported per bit width: both wall times and SSEs (f64,
against the same f16 input) and the ratios coremltools/lowbit (time) and lowbit/coremltools
(SSE), and lowbit's peak RSS. Model loading and conversion to numpy are outside coremltools'
timed region; lowbit's time is the whole command, which also hashes the input and writes every
other tensor of the model into the bundle (carried), so it is the conservative side.

With --large-shape ROWSxCOLS (issue 16 item 1, coremltools #2551) it instead times lowbit alone
on one F32 matrix of that shape of N(0, 1) values (nearly all distinct: about 45 M for
4096x16384) added to the model's f32 safetensors as `blk.0.big.weight`, palettized at each
--bits with one table per tensor (and with --group-size G for each --large-group-size G),
reporting wall time and peak RSS; coremltools is not run on it (40-50 GB).

Usage: palette_bench.py --convert target/release/convert SMOLLM2.gguf [--tensors GLOB ...]
       [--bits 8 6 4] [--threads N] [--json OUT]
       palette_bench.py --convert ... SMOLLM2.gguf --large-shape 4096x16384 [--bits 8]
       [--large-group-size 32] [--json OUT]
"""
import argparse, fnmatch, json, logging, os, shutil, subprocess, sys, tempfile, time

import numpy as np

from benchutil import cpu_name, run_with_peak  # noqa: E402  (benches/ is on sys.path when run as a script)

logging.disable(logging.WARNING)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--convert", required=True)
    ap.add_argument("model")
    ap.add_argument("--tensors", nargs="*", default=["blk.0.*.weight", "blk.15.*.weight"])
    ap.add_argument("--bits", nargs="*", type=int, default=[8, 6, 4])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json")
    ap.add_argument("--large-shape", help="ROWSxCOLS: lowbit alone on one F32 matrix of this shape")
    ap.add_argument("--large-group-size", nargs="*", type=int, default=[])
    a = ap.parse_args()
    if a.large_shape:
        return large_shape(a)
    import coremltools
    from coremltools.optimize.coreml._quantization_passes import palettize_weights as pw
    from safetensors.numpy import load_file

    work = tempfile.mkdtemp(prefix="lowbit-palbench-")
    try:
        st = os.path.join(work, "model.safetensors")
        subprocess.run([a.convert, "dequantize", a.model, "-o", st, "--dtype", "f16", "--with-config", "-q"], check=True)
        ws = load_file(st)
        names = [n for n in ws if ws[n].ndim == 2 and ws[n].size > 2048 and "norm" not in n
                 and any(fnmatch.fnmatch(n, g) for g in a.tensors)]
        names.sort()
        n_el = sum(ws[n].size for n in names)
        print(f"{len(names)} tensors, {n_el} weights, f16, group size 32, {a.threads} threads; {cpu_name()}")
        rows = []
        for bits in a.bits:
            # coremltools
            # (only blockwise_compress is timed; the reconstruction and its SSE come after)
            ct_t = 0.0
            ct_sse = 0.0
            for n in names:
                t0 = time.perf_counter()
                p = pw.blockwise_compress(ws[n], "KMEANS", bits, [32, 0], num_kmeans_workers=a.threads)
                ct_t += time.perf_counter() - t0
                rec = pw.decompress(p)
                ct_sse += float(((rec.astype(np.float64) - ws[n].astype(np.float64)) ** 2).sum())
            # lowbit
            out = os.path.join(work, f"p{bits}.bundle")
            cmd = [a.convert, "palettize", st, "-o", out, "--bits", str(bits), "--group-size", "32",
                   "--workers", str(a.threads), "-q"]
            for n in names:
                cmd += ["--include", n]
            rc, lb_t, peak, err = run_with_peak(cmd)
            peak_kb = peak / 1024
            if rc != 0:
                sys.exit(f"convert palettize failed: {cmd}\n{err}")
            m = json.load(open(os.path.join(out, "manifest.json")))
            lb_sse = sum(t["encoding"]["sse"] for t in m["tensors"] if t["encoding"]["kind"] == "palette")
            shutil.rmtree(out)
            r = {"bits": bits, "coremltools_s": ct_t, "lowbit_s": lb_t, "speedup": ct_t / lb_t,
                 "coremltools_sse": ct_sse, "lowbit_sse": lb_sse, "sse_ratio": lb_sse / ct_sse if ct_sse else None,
                 "lowbit_peak_rss_mb": peak_kb / 1024}
            rows.append(r)
            print(f"{bits}-bit: coremltools {ct_t:.2f}s sse {ct_sse:.6e} | lowbit {lb_t:.2f}s sse {lb_sse:.6e} | "
                  f"speedup {r['speedup']:.1f}x, SSE ratio {r['sse_ratio']:.7f}; lowbit peak RSS {r['lowbit_peak_rss_mb']:.0f} MB")
        rep = {"cpu": cpu_name(), "threads": a.threads, "coremltools": coremltools.__version__,
               "tensors": names, "weights": int(n_el), "results": rows}
        if a.json:
            os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
            json.dump(rep, open(a.json, "w"), indent=2)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def large_shape(a):
    from safetensors.numpy import load_file, save_file
    rows, cols = (int(x) for x in a.large_shape.lower().split("x"))
    work = tempfile.mkdtemp(prefix="lowbit-palbench-large-")
    try:
        st = os.path.join(work, "model.safetensors")
        subprocess.run([a.convert, "dequantize", a.model, "-o", st, "--dtype", "f32", "--with-config", "-q"], check=True)
        ws = load_file(st)
        w = np.random.default_rng(2551).standard_normal((rows, cols), dtype=np.float32)
        n_distinct = len(np.unique(w))
        ws["blk.0.big.weight"] = w
        save_file(ws, st)
        del ws
        print(f"[{rows}, {cols}] F32 N(0, 1), {n_distinct} distinct values, {a.threads} threads; {cpu_name()}")
        rows_out = []
        for bits in a.bits:
            for g in [None] + a.large_group_size:
                out = os.path.join(work, "big.bundle")
                cmd = [a.convert, "palettize", st, "-o", out, "--bits", str(bits), "--include", "blk.0.big.weight",
                       "--workers", str(a.threads), "-q"]
                if g:
                    cmd += ["--group-size", str(g)]
                rc, t, peak, err = run_with_peak(cmd)
                if rc != 0:
                    sys.exit(f"convert palettize failed: {cmd}\n{err}")
                m = json.load(open(os.path.join(out, "manifest.json")))
                sse = next(t["encoding"]["sse"] for t in m["tensors"] if t["name"] == "blk.0.big.weight")
                shutil.rmtree(out)
                r = {"bits": bits, "group_size": g, "lowbit_s": t, "lowbit_peak_rss_mb": peak / 2**20,
                     "lowbit_sse": sse}
                rows_out.append(r)
                print(f"{bits}-bit, {'one table' if g is None else f'group size {g}'}: {t:.1f} s, "
                      f"peak RSS {peak / 2**20:.0f} MB, SSE {sse:.6e}")
        rep = {"cpu": cpu_name(), "threads": a.threads, "shape": [rows, cols], "distinct": int(n_distinct),
               "results": rows_out}
        if a.json:
            os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
            json.dump(rep, open(a.json, "w"), indent=2)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
