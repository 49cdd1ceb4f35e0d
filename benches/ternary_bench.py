#!/usr/bin/env python3
"""Ternary conversion benchmark (issue: gguf-to-ternary / verify).

Converts the MiniCPM4-8B-shape TQ2_0 GGUF with `convert gguf-to-ternary`, verifies the bundle
with `convert verify --source --maxerr 0`, and reports wall seconds, GB/s of input and peak
resident memory of each, next to the anchor measured in the same run: reading the input once
and hashing it with SHA256 (Python's hashlib, i.e. OpenSSL, 8 MiB reads). Page cache is warm
for the input (it is read once before timing). Also in the same run, the disk's floor: as many
bytes as the weight file written with 8 MiB O_DIRECT writes and an fsync, then read back with
O_DIRECT (the way convert writes and verify reads it: verify's read is cold).

Usage: ternary_bench.py --convert target/release/convert MODEL.gguf [--out DIR] [--threads N]
"""
import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

from benchutil import cpu_name, run_with_peak  # noqa: E402  (benches/ is on sys.path when run as a script)


def read_and_hash(path):
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(8 << 20)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def disk_floor(directory, nbytes):
    """Seconds to write `nbytes` durably with 8 MiB O_DIRECT writes into `directory`, and to
    read them back with O_DIRECT reads: what `gguf-to-ternary` (which writes its weight file
    so) and `verify` (which reads it so, cold) cannot beat on this disk. None where the file
    system refuses O_DIRECT."""
    import mmap
    chunk = 8 << 20
    buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(chunk))
    path = os.path.join(directory, "disk-floor.bin")
    n = (nbytes + chunk - 1) // chunk
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    except OSError:
        return None, None
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            os.write(fd, buf)
        os.fsync(fd)
        t_write = time.perf_counter() - t0
    finally:
        os.close(fd)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        t0 = time.perf_counter()
        while os.readv(fd, [buf]) > 0:
            pass
        t_read = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    return t_write, t_read


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--convert", default="target/release/convert")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("model")
    a = ap.parse_args()
    size = os.path.getsize(a.model)
    read_and_hash(a.model)  # warm the page cache
    t0 = time.perf_counter()
    read_and_hash(a.model)
    t_hash = time.perf_counter() - t0

    work = tempfile.mkdtemp(prefix="lowbit-bench-", dir=os.path.dirname(os.path.abspath(a.model)))
    out = os.path.join(work, "m.bundle")
    try:
        # Each command's own peak RSS from its VmHWM (benchutil.run_with_peak).
        def measured(cmd):
            rc, dt, rss, err = run_with_peak(cmd)
            if rc != 0:
                sys.exit(f"failed ({rc}): {' '.join(cmd)}\n{err}")
            return dt, rss

        conv = measured([a.convert, "--threads", str(a.threads), "gguf-to-ternary", "-q", a.model, "-o", out])
        ver = measured([a.convert, "--threads", str(a.threads), "verify", "--maxerr", "0", "--source", a.model, out])
        t_dw, t_dr = disk_floor(work, os.path.getsize(os.path.join(out, "weights.bin")))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    gb = size / 1e9
    res = {
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count()},
        "model": os.path.basename(a.model),
        "input_bytes": size,
        "threads": a.threads,
        "anchor_read_sha256_s": t_hash,
        "convert_s": conv[0],
        "convert_peak_rss_bytes": conv[1],
        "verify_s": ver[0],
        "verify_peak_rss_bytes": ver[1],
        "ratio_convert_plus_verify_to_anchor": (conv[0] + ver[0]) / t_hash,
        "disk_direct_write_s": t_dw,
        "disk_direct_read_s": t_dr,
    }
    print(f"machine: {res['machine']['cpu']}, {res['machine']['cores']} cores; threads {a.threads}")
    print(f"input: {res['model']}, {size} bytes")
    print()
    print("| step | seconds | GB/s of input | peak RSS (MB) | x anchor |")
    print("|---|---|---|---|---|")
    print(f"| anchor: read + SHA256 once (hashlib) | {t_hash:.2f} | {gb / t_hash:.2f} | - | 1.00 |")
    print(f"| convert gguf-to-ternary | {conv[0]:.2f} | {gb / conv[0]:.2f} | {conv[1] / 1e6:.0f} | {conv[0] / t_hash:.2f} |")
    print(f"| convert verify --maxerr 0 | {ver[0]:.2f} | {gb / ver[0]:.2f} | {ver[1] / 1e6:.0f} | {ver[0] / t_hash:.2f} |")
    print(f"| convert + verify | {conv[0] + ver[0]:.2f} | {gb / (conv[0] + ver[0]):.2f} | - | {res['ratio_convert_plus_verify_to_anchor']:.2f} |")
    if t_dw is not None:
        print(f"| floor: the weight file's bytes written (O_DIRECT, fsync) | {t_dw:.2f} | {gb / t_dw:.2f} | - | {t_dw / t_hash:.2f} |")
        print(f"| floor: read back (O_DIRECT) | {t_dr:.2f} | {gb / t_dr:.2f} | - | {t_dr / t_hash:.2f} |")
        print(f"| floor: both | {t_dw + t_dr:.2f} | {gb / (t_dw + t_dr):.2f} | - | {(t_dw + t_dr) / t_hash:.2f} |")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
