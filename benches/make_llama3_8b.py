#!/usr/bin/env python3
"""Write a synthetic F16 GGUF at Llama-3-8B shapes, for the whole-model palettization benchmark
(issue 15 part 4, `make bench-palette-8b`). Never committed: about 16.1 GB.

Shapes (Meta-Llama-3-8B's config.json): 32 layers, n_embd 4096, n_ff 14336, 32 heads, 8 KV
heads (head dim 128), vocab 128256, untied head, rope base 500000, context 8192; 8.03 G
parameters, every matrix F16, the norms F32. The weights are N(0, sigma^2) in f32 rounded to
f16, sigma 0.02 (ffn_down 0.01), from numpy's PCG64 seeded per tensor: real checkpoints are
heavier-tailed, so a real one has somewhat more distinct f16 values per group (lowbit's k-means
cost grows with the distinct values of a group; coremltools' with the group's size).

The tokenizer is the llama-style SentencePiece vocabulary of tests/ref/make_minicpm.py padded
with filler pieces to 128256 (Llama 3's own is a BPE vocabulary; only the shapes matter here).
Tensors are streamed to disk one block of rows at a time: peak memory is about 300 MB.

usage: make_llama3_8b.py OUT.gguf [--layers N] [--seed S]
"""
import argparse
import sys
from pathlib import Path

import numpy as np

import gguf
from gguf import GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "ref"))
from make_minicpm import add_spm_tokenizer, build_vocab  # noqa: E402

N_EMBD, N_FF, N_HEAD, N_HEAD_KV, VOCAB, N_CTX = 4096, 14336, 32, 8, 128256, 8192
HEAD_DIM = N_EMBD // N_HEAD
LLAMA_FTYPE_MOSTLY_F16 = 1


def plan(n_layer: int):
    """(name, shape in GGML order reversed = numpy [rows, cols], sigma or None for a norm)."""
    out = [("token_embd.weight", (VOCAB, N_EMBD), 0.02)]
    for il in range(n_layer):
        p = f"blk.{il}."
        out += [
            (p + "attn_norm.weight", (N_EMBD,), None),
            (p + "attn_q.weight", (N_HEAD * HEAD_DIM, N_EMBD), 0.02),
            (p + "attn_k.weight", (N_HEAD_KV * HEAD_DIM, N_EMBD), 0.02),
            (p + "attn_v.weight", (N_HEAD_KV * HEAD_DIM, N_EMBD), 0.02),
            (p + "attn_output.weight", (N_EMBD, N_HEAD * HEAD_DIM), 0.02),
            (p + "ffn_norm.weight", (N_EMBD,), None),
            (p + "ffn_gate.weight", (N_FF, N_EMBD), 0.02),
            (p + "ffn_up.weight", (N_FF, N_EMBD), 0.02),
            (p + "ffn_down.weight", (N_EMBD, N_FF), 0.01),
        ]
    out += [("output_norm.weight", (N_EMBD,), None), ("output.weight", (VOCAB, N_EMBD), 0.02)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=32, help="layers to write (32 for the real shape)")
    ap.add_argument("--seed", type=int, default=8)
    a = ap.parse_args()
    if a.layers < 1:
        sys.exit("error: --layers must be at least 1")

    tokens, scores, types = build_vocab(VOCAB)
    tmp = a.out.with_name(a.out.name + ".partial")
    w = GGUFWriter(tmp, "llama")
    w.add_name("Llama-3-8B-shaped synthetic F16")
    w.add_type("model")
    w.add_file_type(LLAMA_FTYPE_MOSTLY_F16)
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_block_count(a.layers)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_vocab_size(VOCAB)
    add_spm_tokenizer(w, tokens, scores, types)

    tensors = plan(a.layers)
    for name, shape, sigma in tensors:
        n = int(np.prod(shape))
        if sigma is None:
            w.add_tensor_info(name, shape, np.dtype(np.float32), n * 4)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.float16), n * 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    w.write_padding(fout, fout.tell())

    total = 0
    for idx, (name, shape, sigma) in enumerate(tensors):
        rng = np.random.default_rng([a.seed, idx])
        start = fout.tell()
        if sigma is None:
            (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).tofile(fout)
        else:
            rows, cols = shape
            step = max(1, (1 << 24) // cols)  # 16 M values a block
            for r0 in range(0, rows, step):
                r1 = min(rows, r0 + step)
                chunk = rng.standard_normal((r1 - r0, cols), dtype=np.float32)
                chunk *= sigma
                chunk.astype(np.float16).tofile(fout)
            total += rows * cols
        w.write_padding(fout, fout.tell() - start)
    w.close()
    tmp.rename(a.out)
    print(f"wrote {a.out}: {a.layers} layers, {total / 1e9:.3f} G matrix weights (F16)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
