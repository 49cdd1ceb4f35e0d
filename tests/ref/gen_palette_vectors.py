#!/usr/bin/env python3
"""Reference vectors for palettization, from coremltools 9.0 (PyPI) and the weighted
kmeans1d it vendors (coremltools._deps.kmeans1d).

Writes testdata/palette/vectors.json:
  cases[]: name, dtype ("f16"|"f32"), values (f16 bit patterns, or f32 bit patterns),
    kmeans[bits]: kmeans1d's optimal SSE on the weighted distinct values (f64, centroids not
      rounded), and coremltools' per-group result (LUT cast to the input dtype, indices =
      kmeans1d's labels) SSE against the input in f64;
    uniform[bits]: coremltools' UNIFORM LUT (bit patterns in the input dtype) and indices.

Usage: python tests/ref/gen_palette_vectors.py [SmolLM2 GGUF]   (run from the repo root)
"""
import json, logging, sys
import numpy as np

logging.disable(logging.WARNING)
import coremltools  # noqa: E402
from coremltools._deps import kmeans1d  # noqa: E402
from coremltools.optimize.coreml._quantization_passes import palettize_weights as pw  # noqa: E402
from coremltools.models.neural_network.quantization_utils import _get_kmeans_lookup_table_and_weight  # noqa: E402

assert coremltools.__version__ == "9.0", coremltools.__version__

rng = np.random.default_rng(20261129)
cases = []


def add(name, w):
    cases.append((name, w))


add("normal_f16", (rng.standard_normal(2048) * 0.02).astype(np.float16))
add("laplace_f16", rng.laplace(0, 0.05, 2048).astype(np.float16))
add("clumps_f16", (rng.integers(0, 40, 2048) * 0.01 + rng.standard_normal(2048) * 1e-4).astype(np.float16))
add("few_distinct_f16", rng.choice(np.array([-0.5, -0.125, 0.0, 0.25, 1.0, 3.5], np.float16), 2048))
add("outliers_f16", np.concatenate([(rng.standard_normal(2040) * 0.01), [4.0, -3.0, 2.5, 7.0, -6.0, 0.9, 1.1, -2.2]]).astype(np.float16))
add("normal_f32", (rng.standard_normal(2048) * 0.02).astype(np.float32))
add("constant_f16", np.full(512, 0.375, np.float16))
if len(sys.argv) > 1:
    from gguf import GGUFReader
    from gguf.quants import dequantize
    r = GGUFReader(sys.argv[1])
    for t in r.tensors:
        if t.name in ("blk.0.attn_q.weight", "blk.3.ffn_down.weight"):
            w = dequantize(t.data, t.tensor_type).reshape([int(x) for x in reversed(t.shape)])
            add("smollm2_" + t.name.replace(".", "_") + "_rows0_4_f16", w[:4].astype(np.float16).ravel())

out = {"generator": "tests/ref/gen_palette_vectors.py", "coremltools": coremltools.__version__, "cases": []}
for name, w in cases:
    dt = "f16" if w.dtype == np.float16 else "f32"
    bits_view = w.view(np.uint16 if dt == "f16" else np.uint32)
    c = {"name": name, "dtype": dt, "values": [int(x) for x in bits_view], "kmeans": {}, "uniform": {}}
    vals, counts = np.unique(w, return_counts=True)
    for nbits in (1, 2, 3, 4, 6, 8):
        k = min(len(vals), 1 << nbits)
        res = kmeans1d.cluster(vals.astype(np.float64), k, weights=counts.astype(np.float64))
        cen = np.array(res.centroids, np.float64)
        lab = np.array(res.clusters)
        opt_sse = float((counts * (vals.astype(np.float64) - cen[lab]) ** 2).sum())
        # coremltools' kmeans1d path for this group (what it takes for f16 groups of >= 10000
        # weights; forced here for these smaller ones), LUT cast to the input dtype.
        lut, idx = _get_kmeans_lookup_table_and_weight(nbits, w, force_kmeans1d=True)
        lut = lut.astype(w.dtype)
        rec = lut.astype(np.float64)[np.asarray(idx).astype(np.int64)]
        ct_sse = float(((rec - w.astype(np.float64)) ** 2).sum())
        c["kmeans"][str(nbits)] = {"optimal_sse": opt_sse, "coremltools_sse": ct_sse, "clusters": k}
        lut, idx = pw._get_lut_and_indices(w, "UNIFORM", nbits, None)
        lb = lut.view(np.uint16 if dt == "f16" else np.uint32)
        c["uniform"][str(nbits)] = {"lut": [int(x) for x in lb], "indices": [int(x) for x in idx]}
    out["cases"].append(c)

with open("testdata/palette/vectors.json", "w") as f:
    json.dump(out, f, separators=(",", ":"))
    f.write("\n")
print("wrote testdata/palette/vectors.json:", len(out["cases"]), "cases")
