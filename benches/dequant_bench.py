#!/usr/bin/env python3
"""Dequantization throughput: lowbit next to gguf-py, in one run (`make bench-dequant`).

Usage (from anywhere; run with the pinned venv's Python, $LOWBIT_CACHE/venv):

    python benches/dequant_bench.py [--threads-list 1,2] [--reps 5] [--min-secs 0.2]
                                    [--out-mb 24] [MODEL.gguf ...]

1. Per type: tiles the "random" case blocks of testdata/dequant/<TYPE>.bin (the first case
   in index.json; their values are finite) into a buffer of about --out-mb MiB of f32
   output, written to a temporary directory as <TYPE>.bin.
2. Times gguf-py (`gguf.quants.dequantize`) on each buffer, shaped as rows of 4096 elements
   worth of bytes (2-D uint8, as GGUFReader hands out a quantized tensor), single-threaded.
3. Times gguf-py on every tensor of each real GGUF file, read with GGUFReader.
4. Runs `cargo bench --bench dequant` on the same buffers and files: lowbit serial and in
   rayon pools of each thread count, over the whole buffer (output to memory) and in 64 KiB
   output chunks into a reused buffer ("in-cache", the code's own speed; also the scalar and
   AVX2 paths).
5. Prints the comparison and a markdown table for BENCHMARKS.md, and writes everything to
   $LOWBIT_CACHE/bench/dequant.json.

Timing, both sides: one untimed warm-up call, then --reps runs, each repeating the work until
--min-secs have passed; the best run's seconds per call is reported (the median is kept in
the JSON). Throughput is GB/s (1e9 bytes) of f32 output.

Environment for gguf-py: OMP/OPENBLAS/MKL thread counts are set to 1, and OPENBLAS_CORETYPE
and OPENBLAS_L2_SIZE are removed (both together), before numpy is imported; the JSON records
what was removed. gguf-py's dequantization is elementwise numpy, which runs on one thread
and uses no BLAS, so this only rules the BLAS settings out.
"""

from __future__ import annotations

import os

# Before numpy is imported: one thread, and no OpenBLAS core-type override (see the docstring).
_REMOVED_ENV = {k: os.environ.pop(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
for _k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_k] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from importlib.metadata import version  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
VECTORS = REPO / "testdata" / "dequant"
ROW_ELEMENTS = 4096


def time_it(reps: int, min_secs: float, f) -> tuple[float, float]:
    """Seconds per call of f: (best, median) over reps runs of at least min_secs each."""
    f()
    per_call = []
    for _ in range(reps):
        n = 0
        start = time.perf_counter()
        while True:
            f()
            n += 1
            t = time.perf_counter() - start
            if t >= min_secs:
                per_call.append(t / n)
                break
    per_call.sort()
    return per_call[0], per_call[len(per_call) // 2]


def gbps(nbytes: int, secs: float) -> float:
    return round(nbytes / secs / 1e9, 4)


def build_type_buffers(tmp: Path, out_mib: int) -> dict[str, dict]:
    """Writes <TYPE>.bin of tiled "random" blocks; returns per-type facts and the arrays."""
    index = json.loads((VECTORS / "index.json").read_text())
    n_elements = out_mib * (1 << 20) // 4
    n_elements -= n_elements % ROW_ELEMENTS  # whole rows; 4096 is a multiple of every block size
    out = {}
    for name, entry in index["types"].items():
        bs, ts = entry["block_size"], entry["type_size"]
        case = entry["cases"][0]
        assert case["name"] == "random", (name, case)
        assert (bs, ts) == GGML_QUANT_SIZES[GGMLQuantizationType[name]], name
        raw = np.fromfile(VECTORS / f"{name}.bin", dtype=np.uint8).reshape(-1, ts)
        random = raw[case["first_block"] : case["first_block"] + case["n_blocks"]]
        n_blocks = n_elements // bs
        reps = -(-n_blocks // len(random))
        blocks = np.tile(random, (reps, 1))[:n_blocks]
        buf = np.ascontiguousarray(blocks).reshape(-1)
        buf.tofile(tmp / f"{name}.bin")
        out[name] = {
            "qtype": GGMLQuantizationType[name],
            "rows": buf.reshape(-1, ROW_ELEMENTS // bs * ts),
            "in_bytes": int(buf.size),
            "out_bytes": n_elements * 4,
            "source_blocks": int(len(random)),
        }
    return out


def bench_gguf_py_types(bufs: dict[str, dict], reps: int, min_secs: float) -> dict[str, dict]:
    res = {}
    for name, b in bufs.items():
        rows, qtype = b["rows"], b["qtype"]
        with np.errstate(all="ignore"):
            y = dequantize(rows, qtype)
        assert y.dtype == np.float32 and y.size * 4 == b["out_bytes"], (name, y.dtype, y.shape)
        # gguf-py's F32 "dequantization" is a zero-copy view: nothing to time.
        zero_copy = np.shares_memory(y, rows)

        def run(rows=rows, qtype=qtype):
            with np.errstate(all="ignore"):
                dequantize(rows, qtype)

        best, median = time_it(reps, min_secs, run)
        res[name] = {
            "out_bytes": b["out_bytes"],
            "in_bytes": b["in_bytes"],
            "zero_copy_view": bool(zero_copy),
            "gbps": None if zero_copy else gbps(b["out_bytes"], best),
            "gbps_median": None if zero_copy else gbps(b["out_bytes"], median),
        }
        shown = "zero-copy view" if zero_copy else f"{res[name]['gbps']:.3f} GB/s"
        print(f"  gguf-py {name:<6} {shown}", flush=True)
    return res


def bench_gguf_py_file(path: Path, reps: int, min_secs: float) -> dict:
    reader = GGUFReader(path)
    work = []
    out_bytes = 0
    for t in reader.tensors:
        qtype = GGMLQuantizationType(t.tensor_type)
        bs, ts = GGML_QUANT_SIZES[qtype]
        ne0 = int(t.shape[0])
        # Raw bytes as rows of ne[0] elements, as gguf-py's own readers hand them out.
        raw = np.asarray(t.data).view(np.uint8).reshape(-1, ne0 // bs * ts)
        work.append((raw, qtype))
        out_bytes += int(t.n_elements) * 4

    def run():
        with np.errstate(all="ignore"):
            for raw, qtype in work:
                dequantize(raw, qtype)

    best, median = time_it(reps, min_secs, run)
    r = {
        "tensors": len(work),
        "out_bytes": out_bytes,
        "gbps": gbps(out_bytes, best),
        "gbps_median": gbps(out_bytes, median),
        "seconds_per_pass": round(best, 4),
    }
    print(f"  gguf-py {path.name}: {r['gbps']:.3f} GB/s ({best:.2f} s per pass)", flush=True)
    return r


def load_avg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def fmt(x, digits=2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def ratio(a, b) -> str:
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.1f}x"


def tables(report: dict, threads: list[int]) -> str:
    nmax = max(threads)
    key = str(nmax)
    lines = [
        f"| type | gguf-py GB/s | lowbit 1-thread GB/s | ratio | lowbit {nmax}-thread GB/s | "
        f"scaling ({nmax}t/1t) | in-cache 1-thread GB/s | ratio | in-cache {nmax}-thread GB/s | "
        f"scaling | in-cache scalar GB/s | in-cache AVX2 GB/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, lb in report["lowbit"]["types"].items():
        py = report["gguf_py"]["types"].get(name, {})
        pyg = py.get("gbps")
        one, par1, parn = lb["serial_gbps"], lb["gbps"].get("1"), lb["gbps"].get(key)
        c_one, c_par1, c_parn = lb["chunked_serial_gbps"], lb["chunked_gbps"].get("1"), lb["chunked_gbps"].get(key)
        py_cell = "view (no copy)" if py.get("zero_copy_view") else fmt(pyg, 3)
        lines.append(
            f"| {name} | {py_cell} | {fmt(one)} | {ratio(one, pyg)} | {fmt(parn)} | {ratio(parn, par1)} | "
            f"{fmt(c_one)} | {ratio(c_one, pyg)} | {fmt(c_parn)} | {ratio(c_parn, c_par1)} | "
            f"{fmt(lb['scalar_gbps'])} | {fmt(lb['avx2_gbps'])} |"
        )
    if report["lowbit"]["files"]:
        lines += [
            "",
            f"| file | tensors (types) | output GB | gguf-py GB/s | lowbit 1-thread GB/s | ratio | "
            f"lowbit {nmax}-thread GB/s | scaling ({nmax}t/1t) |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, lb in report["lowbit"]["files"].items():
            py = report["gguf_py"]["files"].get(name, {})
            pyg = py.get("gbps")
            one = lb["serial_gbps"]
            par1 = lb["gbps"].get("1")
            parn = lb["gbps"].get(key)
            types = ", ".join(f"{n} {k}" for k, n in lb["tensor_types"].items())
            lines.append(
                f"| {name} | {lb['tensors']} ({types}) | {lb['out_bytes'] / 1e9:.2f} | {fmt(pyg, 3)} | "
                f"{fmt(one)} | {ratio(one, pyg)} | {fmt(parn)} | {ratio(parn, par1)} |"
            )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", nargs="*", type=Path, help="real GGUF files to time")
    ap.add_argument("--threads-list", default=None, help="rayon thread counts (default 1,...,nproc)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--min-secs", type=float, default=0.2)
    ap.add_argument("--out-mb", type=int, default=24, help="MiB of f32 output per type buffer")
    ap.add_argument("--skip-files-gguf-py", action="store_true", help="time lowbit only on the real files")
    ap.add_argument("--json", type=Path, default=None, help="default $LOWBIT_CACHE/bench/dequant.json")
    args = ap.parse_args()

    cache = Path(os.environ.get("LOWBIT_CACHE", Path.home() / ".cache" / "lowbit"))
    out_json = args.json or cache / "bench" / "dequant.json"
    ncpu = os.cpu_count() or 1
    threads = args.threads_list or ",".join(str(n) for n in sorted({1, *range(2, ncpu + 1)}))
    thread_list = [int(x) for x in threads.split(",")]
    for p in args.gguf:
        if not p.is_file():
            print(f"{p}: no such file (make fetch)", file=sys.stderr)
            return 2

    # Build first: a build error shows at once, and no compiler runs while anything is timed.
    build = ["cargo", "bench", "--quiet", "--bench", "dequant", "--no-run"]
    print("$ " + shlex.join(build), flush=True)
    subprocess.run(build, cwd=REPO, check=True)

    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = load_avg()
    print(f"load average at start: {load_start}", flush=True)
    with tempfile.TemporaryDirectory(prefix="lowbit-bench-") as tmpd:
        tmp = Path(tmpd)
        bufs = build_type_buffers(tmp, args.out_mb)
        print(f"gguf-py {version('gguf')}, numpy {np.__version__}, single thread; "
              f"removed from env: {sorted(_REMOVED_ENV) or 'nothing (unset already)'}", flush=True)
        py_types = bench_gguf_py_types(bufs, args.reps, args.min_secs)
        del bufs
        py_files = {}
        if not args.skip_files_gguf_py:
            for p in args.gguf:
                py_files[p.name] = bench_gguf_py_file(p, args.reps, args.min_secs)

        lowbit_json = tmp / "lowbit.json"
        cmd = ["cargo", "bench", "--quiet", "--bench", "dequant", "--", "--data", str(tmp),
               "--threads-list", threads, "--reps", str(args.reps), "--min-secs", str(args.min_secs),
               "--json", str(lowbit_json)]
        for p in args.gguf:
            cmd += ["--gguf", str(p)]
        print("$ " + shlex.join(cmd), flush=True)
        subprocess.run(cmd, cwd=REPO, check=True)
        lowbit = json.loads(lowbit_json.read_text())

    for name, lb in lowbit["types"].items():
        assert lb["out_bytes"] == py_types[name]["out_bytes"], name
    for name, lb in lowbit["files"].items():
        if name in py_files:
            assert lb["out_bytes"] == py_files[name]["out_bytes"], name

    report = {
        "date": started.isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "machine": {**lowbit["machine"], "platform": platform.platform()},
        "load_avg": {"start": load_start, "end": load_avg()},
        "gguf_py": {
            "gguf": version("gguf"),
            "numpy": np.__version__,
            "python": platform.python_version(),
            "env_removed": sorted(_REMOVED_ENV),
            "threads": 1,
            "row_elements": ROW_ELEMENTS,
            "types": py_types,
            "files": py_files,
        },
        "lowbit": lowbit,
        "timing": lowbit["timing"],
    }
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(report, indent=1) + "\n")

    md = tables(report, thread_list)
    m = report["machine"]
    print()
    print(f"Machine: {m['cpu']} (family {m['cpu_family']} model {m['cpu_model']}), {m['cores']} cores; "
          f"{report['date']}; load average start {load_start}, end {report['load_avg']['end']}")
    print(f"gguf-py {report['gguf_py']['gguf']} / numpy {report['gguf_py']['numpy']}, one thread. "
          f"GB/s of f32 output, best of {args.reps} runs of >= {args.min_secs} s.")
    print()
    print(md)
    print()
    for name, lb in report["lowbit"]["types"].items():
        pyg = report["gguf_py"]["types"][name]["gbps"]
        if pyg is None:
            continue
        whole, cached = lb["serial_gbps"] / pyg, lb["chunked_serial_gbps"] / pyg
        if min(whole, cached) < 20:
            print(f"below 20x gguf-py on one thread: {name}: whole buffer {whole:.1f}x, in-cache {cached:.1f}x")
    print(f"wrote {out_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
