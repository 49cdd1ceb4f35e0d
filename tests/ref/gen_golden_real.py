#!/usr/bin/env python3
"""Golden per-tensor hashes of a real GGUF file, computed FROM THE REFERENCE (gguf-py).

For every tensor in the file, gguf-py's GGUFReader locates the data and
`gguf.quants.dequantize` turns it into float32; the SHA-256 of those float32
values (little-endian, row-major / C order, ne[0] fastest) is recorded.

Usage (from the repository root):
    python tests/ref/gen_golden_real.py MODEL.gguf [MODEL2.gguf ...] [--out testdata/golden]

Writes `<out>/<stem>.json` (stem = file name without the .gguf suffix),
sorted keys, indent 1. See tests/ref/README.md for the format.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from importlib.metadata import version

import numpy as np

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

PINNED_GGUF = "0.19.0"
PINNED_NUMPY = "2.2.6"
GENERATOR = "tests/ref/gen_golden_real.py"


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def tensor_entry(t) -> dict:
    qtype = GGMLQuantizationType(t.tensor_type)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    ne = [int(x) for x in t.shape]            # GGML order, ne[0] = fastest-varying
    shape = list(reversed(ne))                # row-major (numpy) shape
    n_elements = int(np.prod(ne, dtype=np.int64)) if ne else 1
    assert n_elements == t.n_elements, (t.name, ne, t.n_elements)
    assert ne[0] % block_size == 0, (t.name, ne, qtype.name)
    n_bytes = n_elements // block_size * type_size
    assert n_bytes == t.n_bytes, (t.name, n_bytes, t.n_bytes)

    # The reader returns typed arrays for F32 (float32) and F16 (float16), and a
    # uint8 byte array shaped (*shape[:-1], bytes_per_row) for everything else
    # (BF16 included). Feed dequantize exactly the raw little-endian bytes, as a
    # uint8 array shaped like the reader's byte layout, so every type takes the
    # same path; F32/F16 dequantize() just views/casts those bytes.
    raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
    assert raw.size == n_bytes, (t.name, raw.size, n_bytes)
    raw_rows = raw.reshape((-1, ne[0] // block_size * type_size))

    with np.errstate(all="ignore"):
        out = dequantize(raw_rows, qtype)
    assert out.dtype == np.float32, (t.name, out.dtype)
    assert out.size == n_elements, (t.name, out.shape)
    # rows of ne[0] elements, C order => ne[0] fastest; reshape to the full shape
    out = np.ascontiguousarray(out).reshape(shape)

    # Cross-check against dequantizing the reader's own (typed / shaped) array.
    with np.errstate(all="ignore"):
        alt = dequantize(t.data, qtype)
    alt = np.ascontiguousarray(alt, dtype=np.float32)
    assert alt.shape == tuple(shape), (t.name, alt.shape, shape)
    assert np.array_equal(alt.view(np.uint32), out.view(np.uint32)), t.name

    f32 = out.astype("<f4", copy=False).reshape(-1)
    return {
        "type": qtype.name,
        "type_id": int(qtype),
        "ne": ne,
        "shape": shape,
        "n_elements": n_elements,
        "n_bytes": n_bytes,
        "data_offset": int(t.data_offset),
        "raw_sha256": hashlib.sha256(raw.tobytes()).hexdigest(),
        "f32_sha256": hashlib.sha256(f32.tobytes()).hexdigest(),
        "n_nan": int(np.isnan(f32).sum()),
    }


def golden(path: str) -> dict:
    reader = GGUFReader(path, "r")
    if reader.byte_order != "I":
        raise SystemExit(f"{path}: byte-swapped (big-endian) GGUF files are not supported here")
    tensor_count_field = reader.fields.get("GGUF.tensor_count")
    declared = int(tensor_count_field.parts[-1][0]) if tensor_count_field is not None else None
    tensors = {}
    for t in reader.tensors:
        assert t.name not in tensors, t.name
        tensors[t.name] = tensor_entry(t)
    if declared is not None:
        assert declared == len(tensors), (declared, len(tensors))
    return {
        "generator": GENERATOR,
        "gguf": version("gguf"),
        "numpy": np.__version__,
        "file": os.path.basename(path),
        "file_size": os.path.getsize(path),
        "file_sha256": sha256_file(path),
        "tensor_count": len(tensors),
        "tensors": tensors,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", nargs="+", help="GGUF file(s)")
    ap.add_argument("--out", default="testdata/golden", help="output directory (default: %(default)s)")
    args = ap.parse_args()

    gv, nv = version("gguf"), np.__version__
    if gv != PINNED_GGUF or nv != PINNED_NUMPY:
        print(f"error: need gguf=={PINNED_GGUF} numpy=={PINNED_NUMPY}, have gguf=={gv} numpy=={nv}",
              file=sys.stderr)
        return 2
    if sys.byteorder != "little":
        print("error: must run on a little-endian host", file=sys.stderr)
        return 2

    os.makedirs(args.out, exist_ok=True)
    for path in args.gguf:
        name = os.path.basename(path)
        stem = name[: -len(".gguf")] if name.endswith(".gguf") else name
        doc = golden(path)
        dst = os.path.join(args.out, f"{stem}.json")
        with open(dst, "w", encoding="utf-8", newline="\n") as f:
            f.write(json.dumps(doc, sort_keys=True, indent=1) + "\n")
        types: dict[str, int] = {}
        for e in doc["tensors"].values():
            types[e["type"]] = types.get(e["type"], 0) + 1
        print(f"{dst}: {doc['tensor_count']} tensors {dict(sorted(types.items()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
