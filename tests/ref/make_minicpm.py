#!/usr/bin/env python3
"""Write a synthetic MiniCPM-architecture GGUF with TQ2_0 linears (gguf-py only).

Presets
-------
``--preset tiny`` (default out: testdata/ternary/minicpm-tiny-tq2_0.gguf, committed)
    2 layers, n_embd 256, n_ff 512, 4 heads / 2 KV heads (GQA 2), head dim 64,
    a 474-token llama-style SentencePiece vocab (see ``build_vocab``), context
    512, LongRoPE with original context 256, non-default MiniCPM scales.
    Every linear is quantized to TQ2_0 by gguf-py's reference quantizer
    (``gguf.quants.quantize(w, TQ2_0)``) from fixed-seed N(0, 0.02^2) floats.
    Two TQ2_0 blocks have d == 0 (their 256 inputs were all zero):
      * blk.0.attn_k.weight  row 5 (K = 256, so the block is the whole row)
      * blk.1.ffn_down.weight row 3, block 1 (columns 256..511 of 512)
    token_embd.weight is F16, the untied head output.weight is Q8_0 (gguf-py's
    Q8_0 quantizer), norms and rope factors are F32.

``--preset minicpm4-8b --out PATH`` (benchmark model, never committed)
    MiniCPM4-8B shapes: 32 layers, n_embd 4096, n_ff 16384, 32 heads, 2 KV
    heads, head dim 128, vocab 73448, context 32768. The 224 linears are
    random but valid TQ2_0 blocks written directly (codes uniform-ish in
    {0,1,2}, never the unused code 3; d a random positive f16 around
    1/sqrt(2K/3)), streamed to disk. Embedding and untied head are written F16
    to PATH.stage1.gguf, then converted by llama.cpp:
        llama-quantize --allow-requantize --token-embedding-type q4_k \\
            --output-tensor-type q6_k PATH.stage1.gguf PATH TQ2_0 <threads>
    TQ2_0 -> TQ2_0 is a byte copy in llama-quantize (llama-quant.cpp:
    ``quantize = cur_type != new_type``); the script verifies that every TQ2_0
    tensor's bytes are identical before and after, then deletes the stage-1
    file unless --keep-stage1.
    Its LongRoPE factors mimic MiniCPM4-8B's config: 64 values rising along a
    logistic curve from ~1.0 to ~31, long == short (as in MiniCPM4-8B), and no
    original_context_length key (as convert_hf_to_gguf.py writes it), so
    llama.cpp's n_ctx_orig_yarn = context_length = 32768.

How llama.cpp (b11434) uses these files
---------------------------------------
* Loader: src/models/minicpm.cpp. Keys read: minicpm.{context_length,
  embedding_length, feed_forward_length, block_count, attention.head_count,
  attention.head_count_kv, attention.layer_norm_rms_epsilon (required),
  rope.freq_base, rope.dimension_count, rope.scaling.type,
  rope.scaling.original_context_length, rope.scaling.attn_factor,
  embedding_scale, residual_scale, logit_scale}. The three scale keys are
  optional; when absent llama.cpp uses embedding_scale 12,
  residual_scale 1.4/sqrt(n_layer), logit_scale 256/n_embd.
  (convert_hf_to_gguf.py writes scale_emb, scale_depth/sqrt(n_layer) and
  hidden_size/dim_model_base. Note the absent-key default 256/n_embd is the
  reciprocal of what the converter writes, because the graph divides by it;
  old GGUFs without the key would get logits*n_embd/256 instead of
  logits*256/n_embd.)
* Tensors: token_embd, output_norm, output (optional: tied to token_embd when
  absent), per layer attn_norm, attn_q/k/v (or fused attn_qkv), attn_output,
  ffn_norm, ffn_gate, ffn_up, ffn_down. When rope.scaling.type == "longrope",
  rope_factors_long.weight and rope_factors_short.weight (F32, n_rot/2 each,
  global: no blk. prefix, shared by all layers) are loaded; otherwise an
  optional rope_freqs.weight.
* Graph: MiniCPM reuses the Granite graph (src/models/granite.cpp):
    x   = embedding_scale * token_embd[tok]                (llama-graph.cpp build_inp_embd)
    per layer:
      h   = attn(rms_norm(x) * attn_norm)                   (rope, then kq_scale)
      x   = x + residual_scale * (h @ attn_output)
      f   = ffn_down(silu(ffn_gate(n)) * ffn_up(n)),  n = rms_norm(x) * ffn_norm
      x   = x + residual_scale * f
    logits = (rms_norm(x) * output_norm @ output) / logit_scale
  kq_scale = 1/sqrt(head_dim) (minicpm has no attention.scale key; Granite's
  f_attention_scale stays 0). RoPE is LLAMA_ROPE_TYPE_NORM (adjacent pairs;
  convert_hf_to_gguf.py permutes HF q_proj/k_proj like LLaMA).
* LongRoPE: llama_model::get_rope_factors() picks
      rope_factors_long   if cparams.n_ctx_seq > hparams.n_ctx_orig_yarn
      rope_factors_short  otherwise
  where n_ctx_orig_yarn = minicpm.rope.scaling.original_context_length, or
  minicpm.context_length when that key is absent (the converter never writes
  it for longrope, so real MiniCPM GGUFs always use the short factors unless
  the user runs with -c > context_length). n_ctx_seq is the per-sequence
  context the user asked for (-c, default context_length). The choice is made
  once per context, not per position. The factor divides the frequency:
  theta_i = pos * freq_base^(-2i/n_rot) / factor_i. For longrope
  yarn_ext_factor = 0, freq_scale = 1 (no rope.scaling.factor), and
  attn_factor (the mscale multiplying cos and sin in ggml_rope_ext) is
  1.0 * minicpm.rope.scaling.attn_factor (default 1.0). HF's MiniCPM
  LongRoPE uses mscale = sqrt(1 + ln(max_pos/orig_max_pos)/ln(orig_max_pos))
  when max_pos > orig_max_pos; the converter does not write it, so llama.cpp
  runs with 1.0. The tiny preset writes that HF value explicitly
  (sqrt(1 + ln 2 / ln 256) = 1.0606602) so the key is exercised.
  With the tiny file: -c 512 (the default) uses the long factors, -c <= 256
  the short ones.

Deterministic: the same preset and seed give a byte-identical file.
Run from the repository root with the pinned venv (tests/ref/requirements.txt).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T, GGUFReader, GGUFWriter, TokenType, RopeScalingType
from gguf.quants import quantize

PINNED_GGUF = "0.19.0"
PINNED_NUMPY = "2.2.6"
ARCH = "minicpm"
SEED = 0x3C9C  # fixed; "minicpm"-ish
LLAMA_FTYPE_MOSTLY_TQ2_0 = 37

MINICPM_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{'<用户>' + message['content'].strip() + '<AI>'}}"
    "{% else %}{{message['content'].strip()}}{% endif %}{% endfor %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

PRESETS = {
    "tiny": dict(
        n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_ctx=512, n_ctx_orig=256,
        rms_eps=1e-5, rope_base=10000.0,
        embedding_scale=10.0, residual_scale=0.35, logit_scale=0.25,
        attn_factor=math.sqrt(1.0 + math.log(512 / 256) / math.log(256)),
        vocab_size=None, name="MiniCPM tiny synthetic TQ2_0", chat_template=MINICPM_CHAT_TEMPLATE,
    ),
    "minicpm4-8b": dict(
        n_layer=32, n_embd=4096, n_ff=16384, n_head=32, n_head_kv=2, n_ctx=32768, n_ctx_orig=None,
        rms_eps=1e-6, rope_base=10000.0,
        embedding_scale=12.0, residual_scale=1.4 / math.sqrt(32), logit_scale=4096 / 256,
        attn_factor=None,
        vocab_size=73448, name="MiniCPM4-8B-shaped synthetic TQ2_0", chat_template=CHATML_TEMPLATE,
    ),
}

LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def check_env() -> None:
    gv, nv = version("gguf"), version("numpy")
    if gv != PINNED_GGUF or nv != PINNED_NUMPY:
        sys.exit(f"error: need gguf=={PINNED_GGUF} numpy=={PINNED_NUMPY}, have gguf=={gv} numpy=={nv}")
    if sys.byteorder != "little":
        sys.exit("error: little-endian host required")


# --------------------------------------------------------------------------- vocab
WORDS = (
    "the capital of France is Paris Berlin Germany Rome Italy city country and a an in to it "
    "was for on with as that this what which who hello world quick brown fox jumps over lazy "
    "dog model language one two three The What Hello It"
).split()
SUFFIXES = ("ing", "ed", "er", "es", "ly", "tion", "'s")
SINGLE_CHARS = (
    list("abcdefghijklmnopqrstuvwxyz") + list("TFPBGRHWI") + list("0123456789")
    + list(".,!?'-:;()\"") + ["▁"]
)


def build_vocab(target_size: int | None = None) -> tuple[list[str], list[float], list[int]]:
    """Llama-style SentencePiece vocab: <unk>=0 <s>=1 </s>=2, <0x00>..<0xFF> = 3..258
    (type BYTE, score 0), then normal pieces sorted by score (higher first).

    Normal pieces: single characters (lowercase, a few capitals, digits,
    punctuation, U+2581) and, for every word w, "▁"+w with every prefix of it of
    >= 2 characters, plus suffix pieces and their prefixes, so llama.cpp's SPM
    bigram merging can reach every piece. Capitals other than TFPBGRHWI, and any
    non-ASCII text, fall back to <0xNN> byte tokens. Score = -12 + 1.25*len
    - 0.001*(alphabetical rank among pieces of that length), so longer pieces
    merge first. With target_size, "<tok_N>" filler pieces (score -30) pad the
    vocab up to that size.
    """
    pieces: set[str] = set(SINGLE_CHARS)
    for w in WORDS:
        p = "▁" + w
        for n in range(2, len(p) + 1):
            pieces.add(p[:n])
    for s in SUFFIXES:
        for n in range(2, len(s) + 1):
            pieces.add(s[:n])
    by_len: dict[int, list[str]] = {}
    for p in pieces:
        by_len.setdefault(len(p), []).append(p)
    scored = []
    for n, ps in by_len.items():
        for rank, p in enumerate(sorted(ps)):
            scored.append((float(np.float32(-12.0 + 1.25 * n - 0.001 * rank)), p))
    scored.sort(key=lambda sp: (-sp[0], sp[1]))

    tokens = ["<unk>", "<s>", "</s>"]
    scores = [0.0, 0.0, 0.0]
    types = [int(TokenType.UNKNOWN), int(TokenType.CONTROL), int(TokenType.CONTROL)]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(int(TokenType.BYTE))
    for s, p in scored:
        tokens.append(p)
        scores.append(s)
        types.append(int(TokenType.NORMAL))
    if target_size is not None:
        if target_size < len(tokens):
            raise ValueError(f"target vocab {target_size} < base vocab {len(tokens)}")
        for i in range(len(tokens), target_size):
            tokens.append(f"<tok_{i}>")
            scores.append(-30.0)
            types.append(int(TokenType.NORMAL))
    assert len(set(tokens)) == len(tokens)
    return tokens, scores, types


# --------------------------------------------------------------------------- rope factors
def rope_factors(preset: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(n, dtype=np.float64) / (n - 1)
    if preset == "tiny":
        long = 1.05 + 2.9 * i ** 1.5          # 1.05 .. 3.95
        short = 1.02 + 0.45 * i               # 1.02 .. 1.47
    else:
        # MiniCPM4-8B-like shape: logistic ramp from ~1.0 to ~31 (not the published values).
        x = np.arange(n, dtype=np.float64)
        long = 1.0 + 30.2 / (1.0 + np.exp(-(x - 32.0) / 5.5)) - 30.2 / (1.0 + np.exp(32.0 / 5.5))
        short = long.copy()
    return long.astype(np.float32), short.astype(np.float32)


# --------------------------------------------------------------------------- common KV
def add_kv(w: GGUFWriter, cfg: dict, tokens, scores, types) -> None:
    head_dim = cfg["n_embd"] // cfg["n_head"]
    w.add_name(cfg["name"])
    w.add_type("model")
    w.add_file_type(LLAMA_FTYPE_MOSTLY_TQ2_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(cfg["n_ctx"])
    w.add_embedding_length(cfg["n_embd"])
    w.add_feed_forward_length(cfg["n_ff"])
    w.add_block_count(cfg["n_layer"])
    w.add_head_count(cfg["n_head"])
    w.add_head_count_kv(cfg["n_head_kv"])
    w.add_layer_norm_rms_eps(cfg["rms_eps"])
    w.add_rope_freq_base(cfg["rope_base"])
    w.add_rope_dimension_count(head_dim)
    w.add_rope_scaling_type(RopeScalingType.LONGROPE)
    if cfg["n_ctx_orig"] is not None:
        w.add_rope_scaling_orig_ctx_len(cfg["n_ctx_orig"])
    if cfg["attn_factor"] is not None:
        w.add_rope_scaling_attn_factors(cfg["attn_factor"])
    w.add_embedding_scale(cfg["embedding_scale"])
    w.add_residual_scale(cfg["residual_scale"])
    w.add_logit_scale(cfg["logit_scale"])
    add_spm_tokenizer(w, tokens, scores, types)
    w.add_chat_template(cfg["chat_template"])


def add_spm_tokenizer(w: GGUFWriter, tokens, scores, types) -> None:
    """The tokenizer keys of a `build_vocab` vocabulary (<unk> 0, <s> 1, </s> 2; BOS added)."""
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def linear_shapes(cfg: dict) -> dict[str, tuple[int, int]]:
    """numpy shapes (rows = ne[1] = out features, cols = ne[0] = in features)."""
    e, f = cfg["n_embd"], cfg["n_ff"]
    hd = e // cfg["n_head"]
    return {
        "attn_q": (cfg["n_head"] * hd, e),
        "attn_k": (cfg["n_head_kv"] * hd, e),
        "attn_v": (cfg["n_head_kv"] * hd, e),
        "attn_output": (e, cfg["n_head"] * hd),
        "ffn_gate": (f, e),
        "ffn_up": (f, e),
        "ffn_down": (e, f),
    }


# --------------------------------------------------------------------------- tiny
ZERO_BLOCKS = (("blk.0.attn_k.weight", 5, 0), ("blk.1.ffn_down.weight", 3, 1))  # (tensor, row, block)


def write_tiny(out: Path, seed: int, linear_type: str = "tq2_0") -> dict[str, str]:
    """Writes the tiny model. linear_type 'f16' stores the linears unquantized (as f16) and
    returns, per linear, the sha256 of gguf-py's TQ2_0 quantization of those f16 values: the
    reference for `convert gguf-to-ternary --ternarize`."""
    ref: dict[str, str] = {}
    cfg = PRESETS["tiny"]
    rng = np.random.default_rng([seed, 0])
    tokens, scores, types = build_vocab(cfg["vocab_size"])
    n_vocab, e = len(tokens), cfg["n_embd"]
    hd = e // cfg["n_head"]

    w = GGUFWriter(out, ARCH)
    add_kv(w, cfg, tokens, scores, types)

    emb = (rng.standard_normal((n_vocab, e), dtype=np.float32) * 0.05).astype(np.float16)
    w.add_tensor("token_embd.weight", emb)
    w.add_tensor("output_norm.weight", (1.0 + 0.1 * rng.standard_normal(e, dtype=np.float32)).astype(np.float32))
    head = rng.standard_normal((n_vocab, e), dtype=np.float32) * 0.05
    w.add_tensor("output.weight", quantize(head, T.Q8_0), raw_dtype=T.Q8_0)
    long, short = rope_factors("tiny", hd // 2)
    w.add_tensor("rope_factors_long.weight", long)
    w.add_tensor("rope_factors_short.weight", short)

    zero = {(t, r, b) for t, r, b in ZERO_BLOCKS}
    shapes = linear_shapes(cfg)
    for il in range(cfg["n_layer"]):
        w.add_tensor(f"blk.{il}.attn_norm.weight",
                     (1.0 + 0.1 * rng.standard_normal(e, dtype=np.float32)).astype(np.float32))
        for lin in LINEARS:
            if lin == "ffn_gate":
                w.add_tensor(f"blk.{il}.ffn_norm.weight",
                             (1.0 + 0.1 * rng.standard_normal(e, dtype=np.float32)).astype(np.float32))
            name = f"blk.{il}.{lin}.weight"
            wt = rng.standard_normal(shapes[lin], dtype=np.float32) * 0.02
            for t, r, b in zero:
                if t == name:
                    wt[r, b * 256:(b + 1) * 256] = 0.0
            if linear_type == "f16":
                w16 = wt.astype(np.float16)
                w.add_tensor(name, w16)
                ref[name] = hashlib.sha256(quantize(w16.astype(np.float32), T.TQ2_0).tobytes()).hexdigest()
                continue
            q = quantize(wt, T.TQ2_0)
            w.add_tensor(name, q, raw_dtype=T.TQ2_0)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    if linear_type == "f16":
        return ref
    # self-check: the zero blocks have d == 0, every linear is TQ2_0
    r = GGUFReader(out)
    for t in r.tensors:
        if t.name in {z[0] for z in ZERO_BLOCKS}:
            blocks = np.asarray(t.data).reshape(-1, 66)
            cols = int(t.shape[0])
            for name, row, blk in ZERO_BLOCKS:
                if name == t.name:
                    b = blocks[row * (cols // 256) + blk]
                    assert b[64] == 0 and b[65] == 0, (name, row, blk)
                    assert (b[:64] == 0x55).all(), (name, row, blk)
    return ref


# --------------------------------------------------------------------------- 8b
def _lut81_bytes() -> np.ndarray:
    """lut[b] = a byte of four 2-bit codes in {0,1,2}: digits of (b % 81) in base 3."""
    lut = np.zeros(256, dtype=np.uint8)
    for b in range(256):
        v = b % 81
        byte = 0
        for s in range(4):
            byte |= (v % 3) << (2 * s)
            v //= 3
        lut[b] = byte
    return lut


def gen_tq2_0_blocks(rng: np.random.Generator, n_blocks: int, k: int, lut: np.ndarray) -> np.ndarray:
    """(n_blocks, 66) uint8 valid TQ2_0 blocks: qs[0:64] random codes in {0,1,2}
    (element h*128 + s*32 + l is bits 2s..2s+1 of qs[h*32 + l]), d[64:66] f16 > 0."""
    out = np.empty((n_blocks, 66), dtype=np.uint8)
    raw = np.frombuffer(rng.bytes(n_blocks * 64), dtype=np.uint8).reshape(n_blocks, 64)
    np.take(lut, raw, out=out[:, :64])
    scale = 1.0 / math.sqrt(k * 2.0 / 3.0)
    d = (rng.uniform(0.8, 1.2, n_blocks) * scale).astype(np.float16)
    out[:, 64:66] = d.view(np.uint8).reshape(n_blocks, 2)
    return out


def write_8b_stage1(path: Path, seed: int) -> dict[str, str]:
    """Stream the stage-1 file (F16 embd/head, TQ2_0 linears). Returns {tensor: sha256} of TQ2_0 bytes."""
    cfg = PRESETS["minicpm4-8b"]
    tokens, scores, types = build_vocab(cfg["vocab_size"])
    n_vocab, e = len(tokens), cfg["n_embd"]
    hd = e // cfg["n_head"]
    shapes = linear_shapes(cfg)
    lut = _lut81_bytes()

    # (name, numpy shape in elements, kind)
    plan: list[tuple[str, tuple[int, ...], str]] = [
        ("token_embd.weight", (n_vocab, e), "f16"),
        ("output_norm.weight", (e,), "norm"),
        ("output.weight", (n_vocab, e), "f16"),
        ("rope_factors_long.weight", (hd // 2,), "rope_long"),
        ("rope_factors_short.weight", (hd // 2,), "rope_short"),
    ]
    for il in range(cfg["n_layer"]):
        plan.append((f"blk.{il}.attn_norm.weight", (e,), "norm"))
        for lin in LINEARS:
            if lin == "ffn_gate":
                plan.append((f"blk.{il}.ffn_norm.weight", (e,), "norm"))
            plan.append((f"blk.{il}.{lin}.weight", shapes[lin], "tq2"))

    w = GGUFWriter(path, ARCH)
    add_kv(w, cfg, tokens, scores, types)
    for name, shape, kind in plan:
        n = int(np.prod(shape))
        if kind == "f16":
            w.add_tensor_info(name, shape, np.dtype(np.float16), n * 2)
        elif kind == "tq2":
            rows, cols = shape
            w.add_tensor_info(name, (rows, cols // 256 * 66), np.dtype(np.uint8), rows * cols // 256 * 66,
                              raw_dtype=T.TQ2_0)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.float32), n * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    fout = w.fout[0]
    w.write_padding(fout, fout.tell())

    long, short = rope_factors("minicpm4-8b", hd // 2)
    shas: dict[str, str] = {}
    for idx, (name, shape, kind) in enumerate(plan):
        rng = np.random.default_rng([seed, 1, idx])
        start = fout.tell()
        if kind == "f16":
            rows, cols = shape
            for r0 in range(0, rows, 8192):
                r1 = min(rows, r0 + 8192)
                chunk = (rng.standard_normal((r1 - r0, cols), dtype=np.float32) * 0.02).astype(np.float16)
                chunk.tofile(fout)
        elif kind == "tq2":
            rows, cols = shape
            blocks = gen_tq2_0_blocks(rng, rows * cols // 256, cols, lut)
            shas[name] = hashlib.sha256(blocks.tobytes()).hexdigest()
            blocks.tofile(fout)
        elif kind == "norm":
            (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32).tofile(fout)
        elif kind == "rope_long":
            long.tofile(fout)
        elif kind == "rope_short":
            short.tofile(fout)
        nbytes = fout.tell() - start
        w.write_padding(fout, nbytes)
    w.close()
    return shas


def find_llama_bin(name: str, explicit: str | None) -> str:
    if explicit:
        return explicit
    cache = os.environ.get("LOWBIT_CACHE", os.path.expanduser("~/.cache/lowbit"))
    p = Path(cache) / "llama.cpp-11434" / "build" / "bin" / name
    if p.exists():
        return str(p)
    found = shutil.which(name)
    if found:
        return found
    sys.exit(f"error: {name} not found (build it with `make llama`, or pass --llama-quantize)")


def write_8b(out: Path, seed: int, llama_quantize: str | None, keep_stage1: bool, threads: int) -> None:
    t0 = time.time()
    stage1 = out.with_name(out.name + ".stage1.gguf")
    shas = write_8b_stage1(stage1, seed)
    t1 = time.time()
    print(f"stage 1: {stage1} {stage1.stat().st_size} bytes in {t1 - t0:.1f} s", flush=True)
    lq = find_llama_bin("llama-quantize", llama_quantize)
    cmd = [lq, "--allow-requantize", "--token-embedding-type", "q4_k", "--output-tensor-type", "q6_k",
           str(stage1), str(out), "TQ2_0", str(threads)]
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    t2 = time.time()
    print(f"llama-quantize: {t2 - t1:.1f} s", flush=True)

    r = GGUFReader(out)
    types = {}
    n_tq2 = 0
    for t in r.tensors:
        types[t.name] = t.tensor_type.name
        if t.name in shas:
            got = hashlib.sha256(np.asarray(t.data).tobytes()).hexdigest()
            if t.tensor_type != T.TQ2_0 or got != shas[t.name]:
                sys.exit(f"error: {t.name} changed in llama-quantize ({t.tensor_type.name})")
            n_tq2 += 1
    assert n_tq2 == len(shas) == 224, (n_tq2, len(shas))
    assert types["token_embd.weight"] == "Q4_K" and types["output.weight"] == "Q6_K", types
    print(f"verified: {n_tq2} TQ2_0 tensors byte-identical after llama-quantize; "
          f"token_embd Q4_K, output Q6_K", flush=True)
    if not keep_stage1:
        stage1.unlink()
    print(f"wrote {out}: {out.stat().st_size} bytes, total {time.time() - t0:.1f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--llama-quantize", help="path of llama-quantize (minicpm4-8b preset)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep-stage1", action="store_true", help="keep the F16-embedding stage-1 file")
    ap.add_argument("--linear-type", choices=["tq2_0", "f16"], default="tq2_0",
                    help="tiny preset: store the linears as TQ2_0, or unquantized as F16 (and write "
                         "<out>.tq2_ref.json with gguf-py's TQ2_0 bytes hashes, the --ternarize reference)")
    a = ap.parse_args()
    check_env()
    if a.preset == "tiny":
        out = a.out or Path("testdata/ternary/minicpm-tiny-tq2_0.gguf")
        out.parent.mkdir(parents=True, exist_ok=True)
        ref = write_tiny(out, a.seed, a.linear_type)
        if a.linear_type == "f16":
            meta = {"generator": "tests/ref/make_minicpm.py --preset tiny --linear-type f16",
                    "gguf": version("gguf"),
                    "numpy": np.__version__,
                    "rule": "gguf.quants.quantize(f16 weights as f32, TQ2_0)",
                    "tq2_0_sha256": ref}
            Path(str(out) + ".tq2_ref.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        data = out.read_bytes()
        print(f"wrote {out}: {len(data)} bytes sha256 {hashlib.sha256(data).hexdigest()}")
    else:
        if a.out is None:
            cache = os.environ.get("LOWBIT_CACHE", os.path.expanduser("~/.cache/lowbit"))
            a.out = Path(cache) / "ternary" / "minicpm4-8b-tq2_0.gguf"
        a.out.parent.mkdir(parents=True, exist_ok=True)
        write_8b(a.out, a.seed, a.llama_quantize, a.keep_stage1, a.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
