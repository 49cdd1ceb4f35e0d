#!/usr/bin/env python3
"""An independent float64 forward pass (numpy + gguf-py's dequantizer) for llama and minicpm
GGUFs: the ground truth the runtime's f32 math is measured against, free of llama.cpp's
activation quantization and f16 KV cache.

Usage: numpy_forward.py MODEL.gguf IDS(comma-separated) OUT.f32 [--n-ctx N]
Writes the logits after the last prompt token as little-endian f32.

Follows llama.cpp's graphs (src/models/llama.cpp, granite.cpp for minicpm): RMSNorm,
RoPE on adjacent pairs ("NORM" mode) with optional frequency factors (LongRoPE: long factors
when n_ctx > original context) and attn_factor, GQA attention with 1/sqrt(head_dim), SwiGLU;
MiniCPM's embedding, residual and logit scales.
"""
import argparse
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("ids")
    ap.add_argument("out")
    ap.add_argument("--n-ctx", type=int, default=None, help="context the bundle was built for (LongRoPE choice)")
    ap.add_argument("--greedy", type=int, default=0, help="also generate N tokens greedily; print their ids as JSON on stdout")
    a = ap.parse_args()
    r = GGUFReader(a.model)

    def kv(key, default=None):
        f = r.fields.get(key)
        if f is None:
            return default
        v = f.contents()
        return v

    arch = kv("general.architecture")
    T = {t.name: t for t in r.tensors}

    def W(name):
        t = T[name]
        x = dequantize(t.data, t.tensor_type).astype(np.float64)
        return x.reshape([int(d) for d in reversed(t.shape)]) if x.ndim == 1 and len(t.shape) > 1 else x

    n_layer = kv(f"{arch}.block_count")
    n_embd = kv(f"{arch}.embedding_length")
    n_head = kv(f"{arch}.attention.head_count")
    n_head_kv = kv(f"{arch}.attention.head_count_kv", n_head)
    hd = kv(f"{arch}.attention.key_length", n_embd // n_head)
    eps = kv(f"{arch}.attention.layer_norm_rms_epsilon")
    base = kv(f"{arch}.rope.freq_base", 10000.0)
    n_rot = kv(f"{arch}.rope.dimension_count", hd)
    n_ctx_train = kv(f"{arch}.context_length")
    n_ctx = a.n_ctx or min(4096, n_ctx_train)
    scaling = kv(f"{arch}.rope.scaling.type", "none")
    attn_factor = kv(f"{arch}.rope.scaling.attn_factor", 1.0)
    factors = None
    if scaling == "longrope":
        orig = kv(f"{arch}.rope.scaling.original_context_length", n_ctx_train)
        name = "rope_factors_long.weight" if n_ctx > orig else "rope_factors_short.weight"
        factors = W(name)
    elif "rope_freqs.weight" in T:
        factors = W("rope_freqs.weight")
    minicpm = arch == "minicpm"
    emb_scale = kv(f"{arch}.embedding_scale", 12.0 if minicpm else 1.0)
    res_scale = kv(f"{arch}.residual_scale", 1.4 / np.sqrt(n_layer) if minicpm else 1.0)
    logit_scale = kv(f"{arch}.logit_scale", 256.0 / n_embd if minicpm else 1.0)

    emb = W("token_embd.weight")
    out_w = W("output.weight") if "output.weight" in T else emb
    layers = []
    for i in range(n_layer):
        g = lambda s: W(f"blk.{i}.{s}.weight")
        layers.append({k: g(k) for k in ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]})
    out_norm = W("output_norm.weight")

    ids = [int(x) for x in a.ids.split(",")]
    inv = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    if factors is not None:
        inv = inv / factors

    def rope(x, pos):  # x [heads, hd]
        th = pos * inv
        c, s = np.cos(th) * attn_factor, np.sin(th) * attn_factor
        y = x.copy()
        x0, x1 = x[:, 0:n_rot:2], x[:, 1:n_rot:2]
        y[:, 0:n_rot:2] = x0 * c - x1 * s
        y[:, 1:n_rot:2] = x0 * s + x1 * c
        return y

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x) + eps) * w

    K = [[] for _ in range(n_layer)]
    V = [[] for _ in range(n_layer)]
    group = n_head // n_head_kv
    def step(pos, t):
        x = emb[t].copy() * (emb_scale if minicpm else 1.0)
        for il, L in enumerate(layers):
            h = rms(x, L["attn_norm"])
            q = rope((L["attn_q"] @ h).reshape(n_head, hd), pos)
            k = rope((L["attn_k"] @ h).reshape(n_head_kv, hd), pos)
            v = (L["attn_v"] @ h).reshape(n_head_kv, hd)
            K[il].append(k)
            V[il].append(v)
            Ks = np.stack(K[il], 1)  # [kvh, t, hd]
            Vs = np.stack(V[il], 1)
            att = np.zeros((n_head, hd))
            for hh in range(n_head):
                kh = hh // group
                sc = Ks[kh] @ q[hh] / np.sqrt(hd)
                p = np.exp(sc - sc.max())
                p /= p.sum()
                att[hh] = p @ Vs[kh]
            o = L["attn_output"] @ att.reshape(-1)
            x = x + (o * res_scale if minicpm else o)
            h = rms(x, L["ffn_norm"])
            gg = L["ffn_gate"] @ h
            u = L["ffn_up"] @ h
            d = L["ffn_down"] @ (gg / (1 + np.exp(-gg)) * u)
            x = x + (d * res_scale if minicpm else d)
        logits = out_w @ rms(x, out_norm)
        if minicpm:
            logits = logits / logit_scale
        return logits

    for pos, t in enumerate(ids):
        logits = step(pos, t)
    logits.astype("<f4").tofile(a.out)
    print(f"argmax {int(np.argmax(logits))} {logits.max():.6f}", file=sys.stderr)
    if a.greedy:
        gen, margins = [], []
        pos = len(ids)
        for _ in range(a.greedy):
            top = np.argsort(-logits, kind="stable")[:2]
            nxt = int(top[0])
            gen.append(nxt)
            margins.append(float(logits[top[0]] - logits[top[1]]))
            if len(gen) == a.greedy:
                break
            logits = step(pos, nxt)
            pos += 1
        import json
        print(json.dumps({"greedy_ids": gen, "top2_margins": margins}))


if __name__ == "__main__":
    main()
