#!/usr/bin/env python3
"""Reference vectors for the TQ2_0 / TQ1_0 QUANTIZERS, from gguf-py.

For each type X in (tq2_0, tq1_0), writes to --out (default testdata/ternary/):

  X_quant.f32   input: n_blocks * 256 little-endian float32 (block b = floats
                b*256 .. b*256+255). The same inputs for both types.
  X_quant.bin   output: gguf.quants.<X>.quantize_blocks(input as (n_blocks, 256)
                float32), n_blocks * type_size bytes (66 for TQ2_0, 54 for TQ1_0),
                blocks back to back as in a GGUF tensor.
  X_quant.json  index: type, type_id, block_size, type_size, n_blocks, the named
                contiguous block ranges ("cases") and per-case flags.

The output is also checked to equal gguf.quants.quantize(input, X) (the
row-level API), so a reimplementation can be compared with either.

What gguf-py 0.19.0 does (what a bit-identical port must copy):
  d   = max(|x|) over the block (numpy max: a NaN anywhere makes d NaN)
  id  = 0 if d == 0 else 1/d                         (f32 division)
  q   = round_half_away_from_zero(x * id)            (f32 product, NOT x/d)
  TQ2_0: code = q + 1 in {0,1,2}; element j = h*128 + s*32 + l (h in 0..1,
         s in 0..3, l in 0..31) goes to bits 2s..2s+1 of qs[h*32 + l];
         block = qs[0:64] + d as IEEE binary16 (numpy astype(float16):
         round-to-nearest-even, overflow to +inf when d >= 65520).
  TQ1_0: codes packed 5 (qs) / 4 (qh) per byte as base-3 digits, most
         significant first, then byte = (v*256 + 242) // 243 (uint16 maths);
         block = qs[0:48] + qh[48:52] + d f16 [52:54].
  Because x*id is rounded to f32 before rounding to an integer, an element
  equal to exactly d/2 can give 0.49999997 (-> code for 0) or 0.5 / 0.50000006
  (-> +-1) depending on how 1/d rounded: see the "ties_*" cases.
  Non-finite x*id (subnormal d whose reciprocal overflows, inf or NaN input)
  becomes NaN in np_roundf; numpy 2.2.6 on x86-64 casts NaN (and +-inf, and
  anything outside int32) to int8 as 0, so those elements get code 1 (value 0).
  Cases whose result depends on that cast are flagged "platform_cast": true.
  llama.cpp's C quantize_row_tq2_0_ref matches for finite input; for NaN input
  it differs (C's amax ignores NaN).

Deterministic (fixed seed); running twice gives byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import TQ1_0, TQ2_0, quantize

PINNED_GGUF = "0.19.0"
PINNED_NUMPY = "2.2.6"
GENERATOR = "tests/ref/gen_tq_quant_vectors.py"
SEED = 0x7E2A
QK = 256
f32 = np.float32


def nextafter(x, to) -> f32:
    return np.nextafter(f32(x), f32(to), dtype=f32)


def build_cases(rng: np.random.Generator) -> list[tuple[str, np.ndarray, dict]]:
    cases: list[tuple[str, np.ndarray, dict]] = []

    def add(name: str, blocks, **flags):
        b = np.asarray(blocks, dtype=f32).reshape(-1, QK)
        cases.append((name, b, flags))

    # realistic weights at many scales
    sig = 10.0 ** rng.uniform(-4, 1, size=(16, 1))
    add("normal", rng.standard_normal((16, QK)).astype(f32) * sig.astype(f32))
    amp = 10.0 ** rng.uniform(-3, 2, size=(6, 1))
    add("uniform", (rng.uniform(-1, 1, (6, QK)) * amp).astype(f32))

    # exact ties at +-d/2 (plus the f32 neighbours), with max element positive or negative
    def tie_block(m: float, sign_tie: float, sign_max: float) -> np.ndarray:
        m = f32(m)
        half = f32(m * f32(0.5))
        x = (rng.uniform(-0.45, 0.45, QK) * m).astype(f32)
        x[0] = sign_max * m
        idx = rng.permutation(np.arange(1, QK))
        x[idx[:64]] = sign_tie * half
        x[idx[64:72]] = sign_tie * nextafter(half, 0)
        x[idx[72:80]] = sign_tie * nextafter(half, np.inf)
        x[idx[80:88]] = -sign_tie * half
        return x

    ms = [1.0, 3.0, 0.1, 7.0, 1e-3, 12345.678]
    add("ties_half_pos", [tie_block(m, 1.0, 1.0 if i % 2 == 0 else -1.0) for i, m in enumerate(ms)])
    add("ties_half_neg", [tie_block(m, -1.0, -1.0 if i % 2 == 0 else 1.0) for i, m in enumerate(ms)])
    # sweep of d values: every other element is exactly +-d/2, so each block shows
    # whether (d/2) * (1/d) rounded below 0.5 for that d
    # (8 blocks where the tie product rounds below 0.5, 8 where it doesn't)
    sweep = []
    low: list[f32] = []
    high: list[f32] = []
    while len(low) < 8 or len(high) < 8:
        m = f32(10.0 ** rng.uniform(-3, 3))
        below = f32(m * f32(0.5)) * (f32(1.0) / m) < f32(0.5)
        (low if below else high).append(m)
    for i, m in enumerate([v for pair in zip(low[:8], high[:8]) for v in pair]):
        x = np.empty(QK, dtype=f32)
        x[0::2] = f32(m * f32(0.5))
        x[1::2] = -f32(m * f32(0.5))
        x[0] = m if i % 2 == 0 else -m
        sweep.append(x)
    add("ties_sweep", sweep)

    z = np.zeros((2, QK), dtype=f32)
    z[1] = -0.0
    add("all_zero", z)  # block 0: +0.0, block 1: -0.0
    singles = np.zeros((4, QK), dtype=f32)
    for k, (pos, val) in enumerate([(0, 0.3), (77, -2.5), (128, 1e-20), (255, -7e10)]):
        singles[k, pos] = val
    add("single_nonzero", singles)
    add("constant", [np.full(QK, f32(1.0 / 3.0)), np.full(QK, f32(-5.0))])

    # f32 subnormal block maxima
    den = (rng.uniform(-1, 1, QK) * 5e-39).astype(f32)
    den[3] = f32(5e-39)
    add("denormal_finite_recip", den)  # 1/d finite (~2e38), f16(d) == 0
    den2 = np.zeros(QK, dtype=f32)
    den2[:8] = np.array([1e-45, -1e-45, 2.8e-45, -4.2e-45, 1e-45, 0, 5.6e-45, -5.6e-45], dtype=f32)
    add("denormal_inf_recip", den2, platform_cast=True)  # 1/d == inf -> x*id inf/NaN -> code 1

    def scaled(maxval: float, neg: bool = False) -> np.ndarray:
        x = (rng.uniform(-1, 1, QK) * f32(maxval)).astype(f32)
        x[11] = -f32(maxval) if neg else f32(maxval)
        return x

    add("d_f16_subnormal", scaled(1e-6))                 # f16(d) subnormal
    add("d_f16_underflow", scaled(2e-8, neg=True))       # f16(d) rounds to 0
    add("d_f16_max_exact", scaled(65504.0))
    add("d_f16_round_to_max", scaled(float(nextafter(65520.0, 0))))  # 65519.996 -> 65504
    add("d_f16_overflow_inf", scaled(65520.0, neg=True))  # -> +inf
    add("d_f16_overflow_big", scaled(1e5))
    add("huge_1e30", scaled(3e30))                       # f16(d) = inf, codes fine
    fm = scaled(float(np.finfo(f32).max))
    fm[12] = -np.finfo(f32).max
    add("f32_max", fm)                                   # id = 1/FLT_MAX is an f32 subnormal
    # d exactly halfway between two f16 values (round-to-nearest-even decides)
    add("d_f16_rne", [scaled(1.0 + 2.0 ** -11), scaled(1.0 + 3.0 * 2.0 ** -11)])

    nf = rng.standard_normal((3, QK)).astype(f32)
    nf[0, 5] = np.inf
    nf[1, 6] = -np.inf
    nf[2, 7] = np.nan
    add("nonfinite_input", nf, platform_cast=True)
    return cases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("testdata/ternary"))
    a = ap.parse_args()
    gv, nv = version("gguf"), version("numpy")
    if gv != PINNED_GGUF or nv != PINNED_NUMPY:
        sys.exit(f"error: need gguf=={PINNED_GGUF} numpy=={PINNED_NUMPY}, have gguf=={gv} numpy=={nv}")
    if sys.byteorder != "little":
        sys.exit("error: little-endian host required")
    a.out.mkdir(parents=True, exist_ok=True)

    cases = build_cases(np.random.default_rng(SEED))
    x = np.concatenate([b for _, b, _ in cases], axis=0)
    index_cases = []
    first = 0
    for name, b, flags in cases:
        c = {"name": name, "first_block": first, "n_blocks": int(b.shape[0])}
        c.update(flags)
        index_cases.append(c)
        first += b.shape[0]

    for qtype, cls in ((T.TQ2_0, TQ2_0), (T.TQ1_0, TQ1_0)):
        bs, ts = GGML_QUANT_SIZES[qtype]
        with np.errstate(all="ignore"):
            q = cls.quantize_blocks(x.copy())
            q2 = quantize(x.copy(), qtype)
        assert q.dtype == np.uint8 and q.shape == (x.shape[0], ts), q.shape
        assert np.array_equal(q, q2), "quantize_blocks != quantize"
        stem = qtype.name.lower() + "_quant"
        x.astype("<f4").tofile(a.out / f"{stem}.f32")
        q.tofile(a.out / f"{stem}.bin")
        idx = {
            "generator": GENERATOR, "gguf": gv, "numpy": nv, "seed": SEED,
            "type": qtype.name, "type_id": int(qtype), "block_size": bs, "type_size": ts,
            "n_blocks": int(x.shape[0]), "input": f"{stem}.f32", "output": f"{stem}.bin",
            "cases": index_cases,
        }
        (a.out / f"{stem}.json").write_text(json.dumps(idx, indent=1, sort_keys=True) + "\n")
        print(f"{stem}: {x.shape[0]} blocks -> {a.out}/{stem}.{{f32,bin,json}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
