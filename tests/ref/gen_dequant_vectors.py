#!/usr/bin/env python3
"""Generate reference dequantization test vectors FROM THE REFERENCE (gguf-py).

Every `<TYPE>.f32` file written here is the output of
`gguf.quants.dequantize` from the pinned PyPI package `gguf` (see
tests/ref/requirements.txt), never of lowbit's own code.

Output (default `testdata/dequant/`, relative to the current directory, which
should be the repository root):

  <TYPE>.bin   raw GGML blocks, n_blocks * type_size bytes, exactly as they
               would appear in a GGUF tensor's data.
  <TYPE>.f32   gguf.quants.dequantize(<TYPE>.bin as a (1, n_bytes) uint8
               array, <TYPE>) flattened, as raw little-endian IEEE-754
               binary32 bits (NaN payloads exactly as numpy produced them).
  index.json   per type: type_id, block_size, type_size, n_blocks and the
               named, contiguous block ranges ("cases") that make up the file.

The script is deterministic: running it twice yields byte-identical files.
See tests/ref/README.md for the exact formats.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from importlib.metadata import version

import numpy as np

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

PINNED_GGUF = "0.19.0"
PINNED_NUMPY = "2.2.6"
GENERATOR = "tests/ref/gen_dequant_vectors.py"
SEED = 0x10B17  # "lowbit"-ish; any fixed value works
N_RANDOM_BLOCKS = 48

T = GGMLQuantizationType

# ---------------------------------------------------------------------------
# Block layouts (byte offsets inside one block), as read by gguf-py's
# dequantize_blocks in gguf/quants.py (0.19.0). Only the fp16 scale fields are
# listed here; they are verified against the reference by check_layouts().
#   d : the fp16 super-block / block scale
#   m : the second fp16 field (Q4_1/Q5_1 "m" = min, K-quants "dmin")
# ---------------------------------------------------------------------------
QUANT_TYPES: dict[str, dict] = {
    # name     d offset, m offset (or None), name of the m field, signed d?
    "Q4_0":  dict(d=0,   m=None, mname=None,   d_signed=True),   # d[0:2] qs[2:18]
    "Q4_1":  dict(d=0,   m=2,    mname="m",    d_signed=False),  # d[0:2] m[2:4] qs[4:20]
    "Q5_0":  dict(d=0,   m=None, mname=None,   d_signed=True),   # d[0:2] qh[2:6] qs[6:22]
    "Q5_1":  dict(d=0,   m=2,    mname="m",    d_signed=False),  # d m qh[4:8] qs[8:24]
    "Q8_0":  dict(d=0,   m=None, mname=None,   d_signed=True),   # d[0:2] qs[2:34] int8
    "Q2_K":  dict(d=80,  m=82,   mname="dmin", d_signed=False),  # scales[0:16] qs[16:80] d dmin
    "Q3_K":  dict(d=108, m=None, mname=None,   d_signed=True),   # hmask[0:32] qs[32:96] scales[96:108] d
    "Q4_K":  dict(d=0,   m=2,    mname="dmin", d_signed=False),  # d dmin scales[4:16] qs[16:144]
    "Q5_K":  dict(d=0,   m=2,    mname="dmin", d_signed=False),  # d dmin scales[4:16] qh[16:48] qs[48:176]
    "Q6_K":  dict(d=208, m=None, mname=None,   d_signed=True),   # ql[0:128] qh[128:192] scales[192:208] i8, d
    "TQ1_0": dict(d=52,  m=None, mname=None,   d_signed=True),   # qs[0:48] qh[48:52] d[52:54]
    "TQ2_0": dict(d=64,  m=None, mname=None,   d_signed=True),   # qs[0:64] d[64:66]
}

ELEMENT_TYPES = ("F32", "F16", "BF16")
TYPE_ORDER = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
              "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "TQ1_0", "TQ2_0")

# fp16 bit patterns used as special scale values: (case suffix, bits)
F16_SPECIAL_FULL = [
    ("zero", 0x0000),
    ("neg_zero", 0x8000),
    ("one", 0x3C00),
    ("max", 0x7BFF),              # 65504
    ("neg_max", 0xFBFF),
    ("subnormal_min", 0x0001),    # 2^-24
    ("neg_subnormal_min", 0x8001),
    ("subnormal_max", 0x03FF),
    ("normal_min", 0x0400),       # 2^-14
    ("neg_normal_min", 0x8400),
    ("pos_inf", 0x7C00),
    ("neg_inf", 0xFC00),
    ("nan", 0x7E00),              # canonical quiet NaN
    ("neg_nan", 0xFE00),
    ("nan_payload", 0x7FFF),      # quiet NaN, all payload bits set
    ("snan", 0x7C01),             # signalling NaN, payload 1
    ("snan_payload", 0x7D55),     # signalling NaN, other payload
    ("neg_snan", 0xFC01),
]
# shorter list for the second fp16 field (m / dmin)
F16_SPECIAL_SHORT = [
    ("zero", 0x0000),
    ("neg_zero", 0x8000),
    ("max", 0x7BFF),
    ("neg_max", 0xFBFF),
    ("subnormal_min", 0x0001),
    ("normal_min", 0x0400),
    ("pos_inf", 0x7C00),
    ("neg_inf", 0xFC00),
    ("nan", 0x7E00),
    ("snan", 0x7C01),
]


def f16_is_nonfinite(bits: np.ndarray) -> np.ndarray:
    return (bits & 0x7C00) == 0x7C00


class Builder:
    """Accumulates named contiguous runs of blocks."""

    def __init__(self, type_size: int):
        self.type_size = type_size
        self.chunks: list[np.ndarray] = []
        self.cases: list[dict] = []
        self.n = 0

    def add(self, name: str, blocks: np.ndarray) -> None:
        blocks = np.ascontiguousarray(blocks, dtype=np.uint8)
        assert blocks.ndim == 2 and blocks.shape[1] == self.type_size, (name, blocks.shape)
        assert blocks.shape[0] > 0
        assert all(c["name"] != name for c in self.cases), name
        self.cases.append({"name": name, "first_block": self.n, "n_blocks": int(blocks.shape[0])})
        self.chunks.append(blocks)
        self.n += blocks.shape[0]

    def data(self) -> bytes:
        return np.concatenate(self.chunks, axis=0).tobytes()


def set_f16(blocks: np.ndarray, off: int, bits) -> None:
    """Write fp16 bit patterns (scalar or per-block array) little-endian at byte offset `off`."""
    bits = np.broadcast_to(np.asarray(bits, dtype=np.uint16), (blocks.shape[0],))
    blocks[:, off] = (bits & 0xFF).astype(np.uint8)
    blocks[:, off + 1] = (bits >> 8).astype(np.uint8)


def realistic_f16(rng: np.random.Generator, n: int, lo: float, hi: float, signed: bool) -> np.ndarray:
    """Finite, normal fp16 values with log-uniform magnitude in [lo, hi); returns uint16 bits."""
    mag = 10.0 ** rng.uniform(np.log10(lo), np.log10(hi), size=n)
    if signed:
        mag = mag * np.where(rng.random(n) < 0.5, -1.0, 1.0)
    bits = mag.astype(np.float16).view(np.uint16)
    assert not f16_is_nonfinite(bits).any() and ((bits & 0x7C00) != 0).all()
    return bits


# ---------------------------------------------------------------------------
# quantized types
# ---------------------------------------------------------------------------

def gen_quant(name: str, rng: np.random.Generator) -> Builder:
    spec = QUANT_TYPES[name]
    qtype = T[name]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    od, om, mname = spec["d"], spec["m"], spec["mname"]
    per_case = 2 if block_size == 32 else 1
    b = Builder(type_size)

    def d_bits(n: int) -> np.ndarray:
        return realistic_f16(rng, n, 1e-4, 3e-2, spec["d_signed"])

    def m_bits(n: int) -> np.ndarray:
        if mname == "m":  # Q4_1/Q5_1 block minimum: any sign, larger magnitude
            return realistic_f16(rng, n, 1e-3, 1.0, True)
        return realistic_f16(rng, n, 1e-4, 3e-2, False)  # K-quant dmin

    def rand_blocks(n: int) -> np.ndarray:
        """Uniform random bytes with realistic finite scale fields."""
        blk = rng.integers(0, 256, size=(n, type_size), dtype=np.uint8)
        set_f16(blk, od, d_bits(n))
        if om is not None:
            set_f16(blk, om, m_bits(n))
        return blk

    # 1. random blocks
    b.add("random", rand_blocks(N_RANDOM_BLOCKS))

    # 2. a few blocks with the scale fields NOT overwritten (fully random bytes):
    #    exercises huge / subnormal / non-finite scales. Blocks whose d AND m
    #    are both non-finite are rejected (see README: NaN+NaN in a commutative
    #    add has no well-defined payload).
    raw = rng.integers(0, 256, size=(4 * per_case * 8, type_size), dtype=np.uint8)
    if om is not None:
        dd = raw[:, od].astype(np.uint16) | (raw[:, od + 1].astype(np.uint16) << 8)
        mm = raw[:, om].astype(np.uint16) | (raw[:, om + 1].astype(np.uint16) << 8)
        raw = raw[~(f16_is_nonfinite(dd) & f16_is_nonfinite(mm))]
    b.add("random_raw", raw[: 4 * per_case])

    # 3. all-zero bytes
    b.add("all_zero", np.zeros((per_case, type_size), dtype=np.uint8))

    # 4. negative scales (realistic magnitude)
    blk = rand_blocks(per_case)
    set_f16(blk, od, realistic_f16(rng, per_case, 1e-4, 3e-2, False) | 0x8000)
    b.add("d_negative", blk)
    if om is not None:
        blk = rand_blocks(per_case)
        set_f16(blk, om, realistic_f16(rng, per_case, 1e-4, 3e-2, False) | 0x8000)
        b.add(f"{mname}_negative", blk)

    # 5. special values of d (other fp16 field realistic and finite)
    for suffix, bits in F16_SPECIAL_FULL:
        blk = rand_blocks(per_case)
        set_f16(blk, od, bits)
        b.add(f"d_{suffix}", blk)

    # 6. special values of m / dmin (d realistic and finite)
    if om is not None:
        for suffix, bits in F16_SPECIAL_SHORT:
            blk = rand_blocks(per_case)
            set_f16(blk, om, bits)
            b.add(f"{mname}_{suffix}", blk)

    # 7. type-specific payload edge cases (scales realistic unless stated)
    def with_bytes(case: str, lo: int, hi: int, value, n: int = per_case, d=None, m=None):
        blk = rand_blocks(n)
        v = np.asarray(value, dtype=np.uint8)
        blk[:, lo:hi] = np.resize(v, hi - lo) if v.ndim else v
        if d is not None:
            set_f16(blk, od, d)
        if m is not None:
            set_f16(blk, om, m)
        b.add(case, blk)

    if name == "Q4_0":
        with_bytes("qs_00", 2, 18, 0x00)   # all codes 0 -> -8
        with_bytes("qs_ff", 2, 18, 0xFF)   # all codes 15 -> 7
        with_bytes("qs_ff_d_max", 2, 18, 0xFF, d=0xFBFF)
    elif name == "Q4_1":
        with_bytes("qs_00", 4, 20, 0x00)
        with_bytes("qs_ff", 4, 20, 0xFF)
        with_bytes("qs_ff_d_max_m_max", 4, 20, 0xFF, d=0x7BFF, m=0x7BFF)
        with_bytes("d_inf_qs_00", 4, 20, 0x00, d=0x7C00)   # Inf*0 = NaN, then + finite m
    elif name == "Q5_0":
        with_bytes("qh_00", 2, 6, 0x00)
        with_bytes("qh_ff", 2, 6, 0xFF)
        with_bytes("qh_alt", 2, 6, [0x55, 0xAA, 0x0F, 0xF0])
        blk = rand_blocks(per_case); blk[:, 2:22] = 0xFF; b.add("q_all_31", blk)
        blk = rand_blocks(per_case); blk[:, 2:22] = 0x00; b.add("q_all_0", blk)
    elif name == "Q5_1":
        with_bytes("qh_00", 4, 8, 0x00)
        with_bytes("qh_ff", 4, 8, 0xFF)
        with_bytes("qh_alt", 4, 8, [0x55, 0xAA, 0x0F, 0xF0])
        blk = rand_blocks(per_case); blk[:, 4:24] = 0xFF; b.add("q_all_31", blk)
        blk = rand_blocks(per_case); blk[:, 4:24] = 0x00; set_f16(blk, od, 0x7C00); b.add("q_all_0_d_inf", blk)
    elif name == "Q8_0":
        with_bytes("qs_min", 2, 34, 0x80)  # -128
        with_bytes("qs_max", 2, 34, 0x7F)  # 127
        blk = rand_blocks(8)
        blk[:, 2:34] = np.arange(256, dtype=np.uint8).reshape(8, 32)  # every int8 value once
        b.add("qs_every_byte", blk)
        with_bytes("qs_min_d_max", 2, 34, 0x80, d=0xFBFF)
    elif name == "Q2_K":
        with_bytes("scales_ff", 0, 16, 0xFF)   # sc=15, min=15
        with_bytes("scales_00", 0, 16, 0x00)   # sc=0, min=0
        with_bytes("scales_0f", 0, 16, 0x0F)   # sc=15, min=0
        with_bytes("scales_f0", 0, 16, 0xF0)   # sc=0, min=15
        with_bytes("qs_ff", 16, 80, 0xFF)
        with_bytes("scales_ff_d_max_dmin_max", 0, 16, 0xFF, d=0x7BFF, m=0x7BFF)
        with_bytes("scales_00_d_inf", 0, 16, 0x00, d=0x7C00)   # Inf*0 -> NaN
    elif name == "Q3_K":
        with_bytes("scales_00", 96, 108, 0x00)   # every 6-bit scale 0 -> -32
        with_bytes("scales_ff", 96, 108, 0xFF)   # every 6-bit scale 63 -> 31
        with_bytes("scales_alt_55aa", 96, 108, [0x55, 0xAA])
        # low nibbles 0, high 2 bits 2 -> scale 32 -> 0 after -32
        with_bytes("scales_eq_32", 96, 108, [0x00] * 8 + [0xAA] * 4)
        with_bytes("hmask_00", 0, 32, 0x00)      # q = ql - 4
        with_bytes("hmask_ff", 0, 32, 0xFF)      # q = ql
        blk = rand_blocks(per_case); blk[:, 0:96] = 0x00; blk[:, 96:108] = 0x00; b.add("q_min_scales_00", blk)   # q=-4, sc=-32
        blk = rand_blocks(per_case); blk[:, 0:96] = 0xFF; blk[:, 96:108] = 0xFF; b.add("q_max_scales_ff", blk)   # q=3, sc=31
        blk = rand_blocks(per_case); blk[:, 0:96] = 0x00; blk[:, 96:108] = 0x00; set_f16(blk, od, 0x7BFF); b.add("q_min_scales_00_d_max", blk)
    elif name in ("Q4_K", "Q5_K"):
        with_bytes("scales_ff", 4, 16, 0xFF)    # all sc=63, m=63
        with_bytes("scales_00", 4, 16, 0x00)    # all sc=0, m=0
        with_bytes("scales_alt_aa55", 4, 16, [0xAA, 0x55])
        with_bytes("scales_alt_ff00", 4, 16, [0xFF, 0x00])
        with_bytes("scales_ff_d_max_dmin_max", 4, 16, 0xFF, d=0x7BFF, m=0x7BFF)
        with_bytes("scales_00_d_inf", 4, 16, 0x00, d=0x7C00)    # d*sc = Inf*0 = NaN
        with_bytes("scales_00_dmin_inf", 4, 16, 0x00, m=0x7C00)  # dmin*m = NaN
        if name == "Q4_K":
            with_bytes("qs_ff", 16, 144, 0xFF)
            with_bytes("qs_00", 16, 144, 0x00)
        else:
            with_bytes("qh_ff", 16, 48, 0xFF)
            with_bytes("qh_00", 16, 48, 0x00)
            blk = rand_blocks(per_case); blk[:, 16:176] = 0xFF; b.add("q_all_31", blk)
    elif name == "Q6_K":
        with_bytes("scales_min", 192, 208, 0x80)   # int8 -128
        with_bytes("scales_max", 192, 208, 0x7F)   # int8 127
        with_bytes("scales_zero", 192, 208, 0x00)
        with_bytes("scales_alt_min_max", 192, 208, [0x80, 0x7F])
        blk = rand_blocks(per_case); blk[:, 0:192] = 0x00; b.add("q_all_min", blk)   # q = -32
        blk = rand_blocks(per_case); blk[:, 0:192] = 0xFF; b.add("q_all_max", blk)   # q = 31
        blk = rand_blocks(per_case); blk[:, 0:192] = 0x00; blk[:, 192:208] = 0x80; set_f16(blk, od, 0x7BFF)
        b.add("q_min_scales_min_d_max", blk)
        blk = rand_blocks(per_case); blk[:, 0:192] = 0x00; blk[:, 192:208] = 0x80; set_f16(blk, od, 0xFBFF)
        b.add("q_min_scales_min_d_neg_max", blk)
        with_bytes("scales_zero_d_inf", 192, 208, 0x00, d=0x7C00)
    elif name == "TQ1_0":
        with_bytes("qs_00", 0, 52, 0x00)
        with_bytes("qs_ff", 0, 52, 0xFF)
        with_bytes("qs_243_255", 0, 52, np.arange(243, 256, dtype=np.uint8))
        # every byte value 0..255 in qs/qh (52 bytes per block, 5 blocks)
        blk = rand_blocks(5)
        sweep = np.resize(np.arange(256, dtype=np.uint8), 5 * 52).reshape(5, 52)
        blk[:, 0:52] = sweep
        b.add("qs_every_byte", blk)
        # bytes that encode exact ternary digits as the reference quantizer writes them
        vals = np.array([(t * 256 + 242) // 243 for t in range(243)], dtype=np.uint16).astype(np.uint8)
        blk = rand_blocks(5)
        blk[:, 0:52] = np.resize(vals, 5 * 52).reshape(5, 52)
        b.add("qs_canonical", blk)
    elif name == "TQ2_0":
        with_bytes("qs_code0", 0, 64, 0x00)   # -1
        with_bytes("qs_code1", 0, 64, 0x55)   # 0
        with_bytes("qs_code2", 0, 64, 0xAA)   # +1
        with_bytes("qs_code3", 0, 64, 0xFF)   # code 3 -> +2 (not produced by the quantizer)
        with_bytes("qs_codes_0123", 0, 64, 0xE4)  # 2-bit fields 0,1,2,3 (LSB first)
        with_bytes("qs_code3_d_max", 0, 64, 0xFF, d=0x7BFF)
        with_bytes("qs_code1_d_inf", 0, 64, 0x55, d=0x7C00)   # Inf*0 -> NaN
    return b


# ---------------------------------------------------------------------------
# element types (block_size 1)
# ---------------------------------------------------------------------------
N_ELEMENTS = 4096

F32_EDGES = {
    "zero": [0x00000000, 0x80000000],
    "one": [0x3F800000, 0xBF800000],
    "subnormal": [0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00400000, 0x00000F00],
    "normal_min": [0x00800000, 0x80800000],
    "max": [0x7F7FFFFF, 0xFF7FFFFF],
    "inf": [0x7F800000, 0xFF800000],
    "nan": [0x7FC00000, 0xFFC00000, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00001, 0x7FE12345],
    "snan": [0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FA00000, 0x7F812345],
}
F16_EDGES = {
    "zero": [0x0000, 0x8000],
    "one": [0x3C00, 0xBC00],
    "subnormal": [0x0001, 0x8001, 0x03FF, 0x83FF, 0x0200, 0x0155],
    "normal_min": [0x0400, 0x8400],
    "max": [0x7BFF, 0xFBFF],
    "inf": [0x7C00, 0xFC00],
    "nan": [0x7E00, 0xFE00, 0x7FFF, 0xFFFF, 0x7E01, 0x7F55],
    "snan": [0x7C01, 0xFC01, 0x7DFF, 0x7D00, 0x7D55],
}
BF16_EDGES = {
    "zero": [0x0000, 0x8000],
    "one": [0x3F80, 0xBF80],
    "subnormal": [0x0001, 0x8001, 0x007F, 0x807F, 0x0040],
    "normal_min": [0x0080, 0x8080],
    "max": [0x7F7F, 0xFF7F],
    "inf": [0x7F80, 0xFF80],
    "nan": [0x7FC0, 0xFFC0, 0x7FFF, 0xFFFF, 0x7FC1],
    "snan": [0x7F81, 0xFF81, 0x7FBF, 0x7FA0],
}


def gen_elements(name: str, rng: np.random.Generator) -> Builder:
    qtype = T[name]
    _, type_size = GGML_QUANT_SIZES[qtype]
    b = Builder(type_size)
    if name == "F32":
        uint, edges = np.uint32, F32_EDGES
        realistic = (rng.standard_normal(2048) * 0.05).astype(np.float32).view(np.uint32)
    elif name == "F16":
        uint, edges = np.uint16, F16_EDGES
        realistic = (rng.standard_normal(2048) * 0.05).astype(np.float16).view(np.uint16)
    else:  # BF16: truncate realistic f32 values (bit pattern of the upper half)
        uint, edges = np.uint16, BF16_EDGES
        realistic = ((rng.standard_normal(2048) * 0.05).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)

    def add(case: str, bits) -> None:
        arr = np.asarray(bits, dtype=np.uint64).astype(uint).astype(np.dtype(uint).newbyteorder("<"))
        b.add(case, arr.view(np.uint8).reshape(-1, type_size))

    add("random", realistic)
    for case, bits in edges.items():
        add(case, bits)
    n_left = N_ELEMENTS - b.n
    info = np.iinfo(uint)
    add("random_bits", rng.integers(0, int(info.max) + 1, size=n_left, dtype=np.uint64))
    if name == "F16":
        # exhaustive: every fp16 bit pattern 0x0000..0xFFFF in order (fp16 -> f32
        # conversion underlies every quantized type's scales)
        add("all_bit_patterns", np.arange(0x10000, dtype=np.uint64))
    return b


# ---------------------------------------------------------------------------

def dequant_bits(raw: bytes, qtype: GGMLQuantizationType) -> np.ndarray:
    """Reference dequantization; returns the float32 result as uint32 bits."""
    arr = np.frombuffer(raw, dtype=np.uint8).reshape((1, len(raw)))
    with np.errstate(all="ignore"):
        out = dequantize(arr, qtype)
    assert out.dtype == np.float32, out.dtype
    out = np.ascontiguousarray(out).reshape(-1)
    return out.view(np.uint32).copy()


def check_layouts() -> None:
    """Verify the scale offsets in QUANT_TYPES against the reference: a NaN
    written at the d (or m/dmin) offset of a finite block must turn every
    output of that block into NaN, and no other 2-byte position may do so."""
    rng = np.random.default_rng([SEED, 999])
    for name, spec in QUANT_TYPES.items():
        qtype = T[name]
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        base = rng.integers(0, 256, size=(1, type_size), dtype=np.uint8)
        set_f16(base, spec["d"], 0x2000)
        if spec["m"] is not None:
            set_f16(base, spec["m"], 0x2000)
        found = []
        for off in range(0, type_size - 1):
            blk = base.copy()
            blk[0, off:off + 2] = [0x00, 0x7E]
            out = dequant_bits(blk.tobytes(), qtype).view(np.float32)
            assert out.size == block_size
            if np.isnan(out).all():
                found.append(off)
        expect = sorted(o for o in (spec["d"], spec["m"]) if o is not None)
        assert found == expect, (name, found, expect)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="testdata/dequant", help="output directory (default: %(default)s)")
    args = ap.parse_args()

    gv, nv = version("gguf"), np.__version__
    if gv != PINNED_GGUF or nv != PINNED_NUMPY:
        print(f"error: need gguf=={PINNED_GGUF} numpy=={PINNED_NUMPY}, have gguf=={gv} numpy=={nv}",
              file=sys.stderr)
        return 2
    if sys.byteorder != "little":
        print("error: must run on a little-endian host", file=sys.stderr)
        return 2

    check_layouts()

    os.makedirs(args.out, exist_ok=True)
    index = {
        "generator": GENERATOR,
        "gguf": gv,
        "numpy": nv,
        "seed": SEED,
        "types": {},
    }
    for name in TYPE_ORDER:
        qtype = T[name]
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        # independent stream per type: adding/changing one type never shifts another
        rng = np.random.default_rng([SEED, int(qtype)])
        b = gen_elements(name, rng) if name in ELEMENT_TYPES else gen_quant(name, rng)
        raw = b.data()
        assert len(raw) == b.n * type_size
        bits = dequant_bits(raw, qtype)
        assert bits.size == b.n * block_size
        # blocks are independent: every case dequantized alone must give the same bits
        for c in b.cases:
            lo, n = c["first_block"], c["n_blocks"]
            part = dequant_bits(raw[lo * type_size:(lo + n) * type_size], qtype)
            assert np.array_equal(part, bits[lo * block_size:(lo + n) * block_size]), (name, c["name"])
        with open(os.path.join(args.out, f"{name}.bin"), "wb") as f:
            f.write(raw)
        with open(os.path.join(args.out, f"{name}.f32"), "wb") as f:
            f.write(bits.astype("<u4").tobytes())
        index["types"][name] = {
            "type_id": int(qtype),
            "block_size": block_size,
            "type_size": type_size,
            "n_blocks": b.n,
            "cases": b.cases,
        }
    with open(os.path.join(args.out, "index.json"), "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(index, sort_keys=True, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
