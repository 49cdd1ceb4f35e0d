#!/usr/bin/env python3
"""TQ2_0 (or Q4_0, Q8_0) from REAL weights with gguf-py's reference quantizer.

    make_tq2_from_real.py [SRC.gguf] [--type TQ2_0|Q4_0|Q8_0] [--out OUT.gguf] [--json OUT.json]

--type Q4_0 / Q8_0 requantize every 2-D blk.* tensor whose ne[0] is a multiple of 32 instead
(all linears of SmolLM2): a model of ordinary quantization loss, the realistic side of the
KL-divergence anchors of tests/eval.rs (tests/ref/gen_eval_vectors.py). Their output defaults
to $LOWBIT_CACHE/requant/<name>-<type>-gguf-py.gguf with its JSON beside it ("q_sha256" for
"tq2_sha256", no "n_blocks_d_zero"). What follows describes TQ2_0.

Reads SRC (default $LOWBIT_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf) and
writes OUT (default $LOWBIT_CACHE/ternary/<name>-tq2_0-gguf-py.gguf), a copy in
which every 2-D tensor named blk.* whose ne[0] is a multiple of 256 is replaced
by

    gguf.quants.quantize(gguf.quants.dequantize(raw_bytes, src_type), TQ2_0)

(the f32 input is exactly what tests/ref/gen_golden_real.py hashes as
f32_sha256). Everything else is copied verbatim: every metadata key in order
with its value type (general.file_type included: it keeps the source's value,
since most weights keep their type), and every other tensor's raw bytes with
its original type, in the original tensor order. Tensor data alignment follows
the source's general.alignment (default 32).

For SmolLM2-135M (n_embd 576, n_ff 1536) only the 30 blk.*.ffn_down tensors
(ne[0] = 1536) qualify; all other linears have ne[0] = 576 = 2.25*256.

It also writes a JSON (default testdata/ternary/<name>-tq2_0-gguf-py.json,
sorted keys, indent 1):

  {"generator", "gguf", "numpy", "source": {"file", "size", "sha256"},
   "output": {"file", "size", "sha256"},
   "tensors": {"<name>": {"src_type", "src_type_id", "ne": [ne0, ne1],
                          "n_blocks", "n_blocks_d_zero",
                          "f32_sha256":  sha256 of the dequantized input
                                         (little-endian f32, ne[0] fastest),
                          "tq2_sha256":  sha256 of gguf-py's TQ2_0 bytes}}}

A Rust test can take the same source tensor, dequantize it (bit-identical to
gguf-py, checked by f32_sha256), quantize it with lowbit's TQ2_0 quantizer and
compare with tq2_sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np

import gguf
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, GGUFReader, GGUFWriter, GGUFValueType
from gguf.quants import dequantize, quantize

PINNED_GGUF = "0.19.0"
PINNED_NUMPY = "2.2.6"
GENERATOR = "tests/ref/make_tq2_from_real.py"
CACHE = Path(os.environ.get("LOWBIT_CACHE", os.path.expanduser("~/.cache/lowbit")))
KNOWN_NAMES = {"SmolLM2-135M-Instruct.Q4_1": "smollm2", "gemma-3-270m-q4_k_m": "gemma3-270m"}


def sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def raw_rows(t) -> np.ndarray:
    """The tensor's raw bytes as uint8, numpy shape ne[::-1] with the last dim in bytes."""
    ne = [int(x) for x in t.shape]
    bs, ts = GGML_QUANT_SIZES[t.tensor_type]
    raw = np.asarray(t.data).view(np.uint8).reshape(-1)
    assert raw.size == t.n_bytes
    return raw.reshape(*ne[:0:-1], ne[0] // bs * ts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", nargs="?", type=Path, default=CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--name", help="short name for default output names (default: from SRC)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--type", default="TQ2_0", choices=["TQ2_0", "Q4_0", "Q8_0"])
    a = ap.parse_args()
    qt = T[a.type]
    qblock, qbytes = GGML_QUANT_SIZES[qt]
    gv, nv = version("gguf"), version("numpy")
    if gv != PINNED_GGUF or nv != PINNED_NUMPY:
        sys.exit(f"error: need gguf=={PINNED_GGUF} numpy=={PINNED_NUMPY}, have gguf=={gv} numpy=={nv}")
    if sys.byteorder != "little":
        sys.exit("error: little-endian host required")
    stem = a.src.name.removesuffix(".gguf")
    name = a.name or KNOWN_NAMES.get(stem, stem.lower())
    if qt == T.TQ2_0:
        out = a.out or CACHE / "ternary" / f"{name}-tq2_0-gguf-py.gguf"
        js = a.json or Path("testdata/ternary") / f"{name}-tq2_0-gguf-py.json"
    else:
        low = a.type.lower()
        out = a.out or CACHE / "requant" / f"{name}-{low}-gguf-py.gguf"
        js = a.json or out.with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    js.parent.mkdir(parents=True, exist_ok=True)

    r = GGUFReader(a.src)
    arch = r.fields[gguf.Keys.General.ARCHITECTURE].contents()
    w = GGUFWriter(out, arch)
    for field in r.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        if vtype == GGUFValueType.ARRAY and len(field.types) > 2:
            sys.exit(f"error: nested array {field.name} not supported")
        w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
        if field.name == gguf.Keys.General.ALIGNMENT:
            w.data_alignment = int(field.contents())

    info: dict[str, dict] = {}
    for t in r.tensors:
        ne = [int(x) for x in t.shape]
        if t.name.startswith("blk.") and len(ne) == 2 and ne[0] % qblock == 0:
            rows = raw_rows(t)
            with np.errstate(all="ignore"):
                x = dequantize(rows, t.tensor_type).astype(np.float32, copy=False)
            assert x.shape == (ne[1], ne[0]), (t.name, x.shape)
            q = quantize(x, qt)
            assert q.shape == (ne[1], ne[0] // qblock * qbytes)
            blocks = q.reshape(-1, qbytes)
            info[t.name] = {
                "src_type": t.tensor_type.name, "src_type_id": int(t.tensor_type), "ne": ne,
                "n_blocks": int(blocks.shape[0]),
                "f32_sha256": hashlib.sha256(np.ascontiguousarray(x).astype("<f4").tobytes()).hexdigest(),
            }
            if qt == T.TQ2_0:
                info[t.name]["n_blocks_d_zero"] = int(np.count_nonzero((blocks[:, 64] == 0) & (blocks[:, 65] == 0)))
                info[t.name]["tq2_sha256"] = hashlib.sha256(q.tobytes()).hexdigest()
            else:
                info[t.name]["q_sha256"] = hashlib.sha256(q.tobytes()).hexdigest()
            w.add_tensor(t.name, q, raw_dtype=qt)
        else:
            w.add_tensor(t.name, raw_rows(t), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # verify: same keys/values, same tensors, TQ2_0 bytes as hashed, others byte-identical
    o = GGUFReader(out)
    src_kv = [(f.name, f.types, f.contents()) for f in r.fields.values() if not f.name.startswith("GGUF.")]
    out_kv = [(f.name, f.types, f.contents()) for f in o.fields.values() if not f.name.startswith("GGUF.")]
    assert src_kv == out_kv, "metadata differs"
    assert [t.name for t in o.tensors] == [t.name for t in r.tensors]
    for ts, to in zip(r.tensors, o.tensors):
        assert list(ts.shape) == list(to.shape), ts.name
        if ts.name in info:
            assert to.tensor_type == qt
            want = info[ts.name]["tq2_sha256" if qt == T.TQ2_0 else "q_sha256"]
            assert hashlib.sha256(raw_rows(to).tobytes()).hexdigest() == want
        else:
            assert to.tensor_type == ts.tensor_type and np.array_equal(raw_rows(ts), raw_rows(to)), ts.name

    doc = {
        "generator": GENERATOR, "gguf": gv, "numpy": nv,
        "source": {"file": a.src.name, "size": a.src.stat().st_size, "sha256": sha256_file(a.src)},
        "output": {"file": out.name, "size": out.stat().st_size, "sha256": sha256_file(out)},
        "tensors": info,
    }
    js.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"{a.src.name}: {len(info)} of {len(r.tensors)} tensors -> {a.type}; wrote {out} "
          f"({doc['output']['size']} bytes) and {js}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
