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

With --whole (issue 15 part 4) the model is a whole F16 checkpoint (benches/make_llama3_8b.py
writes one at Llama-3-8B shapes): lowbit palettizes all of it (every matrix, 8 bits, G = 32,
--workers = --threads), timed with its peak RSS; coremltools, in the same run, palettizes only
the --tensors subset (whole tensors, same settings: it would take about half a day on the whole
model); the rates are compared per thread (weights per second / threads) and the SSEs on the
subset (lowbit's from its manifest's per-tensor SSE, both in f64 against the f16 source).

Usage: palette_bench.py --convert target/release/convert SMOLLM2.gguf [--tensors GLOB ...]
       [--bits 8 6 4] [--threads N] [--json OUT]
       palette_bench.py --convert ... SMOLLM2.gguf --large-shape 4096x16384 [--bits 8]
       [--large-group-size 32] [--json OUT]
       palette_bench.py --convert ... --whole LLAMA3-8B.gguf [--tensors blk.0.attn_k.weight ...]
       [--threads N] [--json OUT]
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
    ap.add_argument("--whole", action="store_true",
                    help="MODEL is a whole F16 GGUF: lowbit on all of it, coremltools on --tensors")
    ap.add_argument("--out-dir", help="--whole: where the bundle goes (removed after; default: a temporary directory)")
    a = ap.parse_args()
    if a.large_shape:
        return large_shape(a)
    if a.whole:
        return whole(a)
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


def whole(a):
    """Issue 15 part 4: all of a whole F16 checkpoint through lowbit, a subset through
    coremltools, one run, same threads."""
    from coremltools.optimize.coreml._quantization_passes import palettize_weights as pw
    import coremltools
    from gguf import GGUFReader

    tensors = a.tensors if a.tensors != ["blk.0.*.weight", "blk.15.*.weight"] else \
        ["blk.0.attn_k.weight", "blk.0.attn_v.weight"]
    r = GGUFReader(a.model)
    mats = [t for t in r.tensors if len(t.shape) == 2]
    bad = [t.name for t in mats if t.tensor_type.name != "F16"]
    if bad:
        sys.exit(f"--whole wants an all-F16 checkpoint; {a.model}: {bad[0]} is not F16")
    n_all = sum(int(t.n_elements) for t in mats)
    sub = [t for t in mats if any(fnmatch.fnmatch(t.name, g) for g in tensors)]
    if not sub:
        sys.exit(f"--tensors {tensors} match no matrix of {a.model}")
    n_sub = sum(int(t.n_elements) for t in sub)
    print(f"{a.model}: {len(mats)} matrices, {n_all / 1e9:.3f} G weights (F16); 8 bits, group size 32, "
          f"{a.threads} threads; {cpu_name()}")

    # coremltools on the subset (only blockwise_compress is timed).
    ct_t = ct_sse = 0.0
    for t in sub:
        w = np.array(t.data).reshape(int(t.shape[1]), int(t.shape[0])).astype(np.float16)
        t0 = time.perf_counter()
        p = pw.blockwise_compress(w, "KMEANS", 8, [32, 0], num_kmeans_workers=a.threads)
        ct_t += time.perf_counter() - t0
        rec = pw.decompress(p)
        ct_sse += float(((rec.astype(np.float64) - w.astype(np.float64)) ** 2).sum())
        del w, p, rec
    del r
    ct_rate = n_sub / ct_t
    print(f"coremltools {coremltools.__version__}: {[t.name for t in sub]} ({n_sub / 1e6:.2f} M weights) in "
          f"{ct_t:.1f} s = {ct_rate / 1e6:.3f} M weights/s ({ct_rate / a.threads / 1e6:.3f} per thread), SSE {ct_sse:.10g}")

    work = tempfile.mkdtemp(prefix="lowbit-palbench-whole-", dir=a.out_dir)
    try:
        out = os.path.join(work, "whole.bundle")
        cmd = [a.convert, "palettize", a.model, "-o", out, "--bits", "8", "--group-size", "32",
               "--workers", str(a.threads), "-q"]
        rc, lb_t, peak, err = run_with_peak(cmd)
        if rc != 0:
            sys.exit(f"convert palettize failed: {cmd}\n{err}")
        m = json.load(open(os.path.join(out, "manifest.json")))
        pal = [t for t in m["tensors"] if t["encoding"]["kind"] == "palette"]
        by_name = {t["name"]: t for t in pal}
        lb_sse = sum(by_name[t.name]["encoding"]["sse"] for t in sub)
        n_pal = len(pal)
        bundle_bytes = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out)
                           if os.path.isfile(os.path.join(out, f)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if n_pal != len(mats):
        sys.exit(f"lowbit palettized {n_pal} of the {len(mats)} matrices: the rate would be over the wrong count")
    lb_rate = n_all / lb_t
    per_thread = (lb_rate / a.threads) / (ct_rate / a.threads)
    print(f"lowbit: all {n_pal} matrices ({n_all / 1e9:.3f} G weights) in {lb_t:.1f} s = {lb_rate / 1e6:.2f} M weights/s "
          f"({lb_rate / a.threads / 1e6:.2f} per thread), peak RSS {peak / 2**20:.0f} MB, bundle {bundle_bytes / 1e9:.2f} GB; "
          f"subset SSE {lb_sse:.10g}")
    print(f"per thread: lowbit {per_thread:.1f}x coremltools; SSE ratio lowbit/coremltools {lb_sse / ct_sse:.9f}; "
          f"coremltools on the whole model at its subset rate: {n_all / ct_rate / 3600:.1f} h")
    rep = {"cpu": cpu_name(), "threads": a.threads, "coremltools": coremltools.__version__,
           "model": os.path.basename(a.model), "weights": n_all, "matrices": n_pal,
           "lowbit_s": lb_t, "lowbit_peak_rss_mb": peak / 2**20, "lowbit_weights_per_s": lb_rate,
           "subset": [t.name for t in sub], "subset_weights": n_sub, "coremltools_subset_s": ct_t,
           "coremltools_weights_per_s": ct_rate, "per_thread_speedup": per_thread,
           "coremltools_subset_sse": ct_sse, "lowbit_subset_sse": lb_sse, "sse_ratio": lb_sse / ct_sse}
    if a.json:
        os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
        json.dump(rep, open(a.json, "w"), indent=2)


if __name__ == "__main__":
    main()
