#!/usr/bin/env python3
"""Write a GGUF model as a Hugging Face checkpoint directory (the inverse of llama.cpp's
convert_hf_to_gguf.py for LlamaForCausalLM, MiniCPMForCausalLM and Qwen2ForCausalLM), the test input for
`convert palettize` on Hugging Face safetensors, and check it with tools independent of
lowbit:

  model.safetensors       gguf-py's dequantization (f16 or f32), Hugging Face tensor names;
                          q_proj/k_proj rows un-permuted (the inverse of LlamaModel.permute in
                          llama.cpp's conversion/llama.py, which MiniCPM applies too; Qwen2 is
                          converted without permuting, its GGUF uses NeoX-style RoPE); Qwen2's
                          q/k/v biases as q_proj.bias/k_proj.bias/v_proj.bias
  config.json             Hugging Face keys from the GGUF metadata (rope_scaling longrope with
                          the factor tensors' values for MiniCPM)
  tokenizer.json          gpt2 vocabularies: a `tokenizers` BPE with ByteLevel pre-tokenizer (Qwen2:
                          Qwen2's Split regex, then ByteLevel without its own regex)
  tokenizer.model         llama (SentencePiece) vocabularies: a sentencepiece ModelProto
  tokenizer_config.json   chat template, special tokens, add_bos_token

Checks (the script fails otherwise):
  * tokenizer: the `tokenizers` library (gpt2) or `sentencepiece` (llama) encodes every text of
    testdata/tokenizer/texts.json to llama-tokenize's ids recorded in testdata/tokenizer/;
  * weights: a float64 numpy forward pass written the Hugging Face way (un-permuted q/k with
    rotate_half RoPE over the two halves of each head) on the checkpoint gives the logits that
    llama.cpp's f32 path recorded in testdata/llama/*.f32path.json, to 1e-3 for an f32
    checkpoint (0.05 for f16, whose rounding moves the logits), with the same argmax.

Usage: make_hf_checkpoint.py MODEL.gguf OUT_DIR [--dtype f16|f32] [--shards N]
         [--tokenizer-vectors testdata/tokenizer/X.json] [--llama-f32path testdata/llama/X.f32path.json]
"""
import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

REPO = Path(__file__).resolve().parents[2]


def die(msg):
    print(f"[make_hf_checkpoint] ERROR: {msg}", file=sys.stderr)
    sys.exit(1)


def log(msg):
    print(f"[make_hf_checkpoint] {msg}", file=sys.stderr)


class Gguf:
    def __init__(self, path):
        self.r = GGUFReader(path)
        self.T = {t.name: t for t in self.r.tensors}
        self.arch = self.kv("general.architecture")

    def kv(self, key, default=None):
        f = self.r.fields.get(key)
        return default if f is None else f.contents()

    def a(self, key, default=None):
        return self.kv(f"{self.arch}.{key}", default)

    def W(self, name):
        t = self.T[name]
        x = dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(d) for d in reversed(t.shape)]
        return x.reshape(shape)


def unpermute(w, n_head):
    """Inverse of llama.cpp's LlamaModel.permute (HF -> GGUF):
    GGUF rows [head][half-index i][pair member p] <- HF rows [head][p][i]."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute(w, n_head):
    """llama.cpp's LlamaModel.permute (HF -> GGUF)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ------------------------------------------------------------------ config ---

ARCHITECTURES = {"llama": "LlamaForCausalLM", "minicpm": "MiniCPMForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def hf_config(g: Gguf):
    n_embd, n_layer = g.a("embedding_length"), g.a("block_count")
    n_head = g.a("attention.head_count")
    cfg = {
        "architectures": [ARCHITECTURES[g.arch]],
        "model_type": g.arch,
        "hidden_size": n_embd,
        "intermediate_size": g.a("feed_forward_length"),
        "num_hidden_layers": n_layer,
        "num_attention_heads": n_head,
        "num_key_value_heads": g.a("attention.head_count_kv", n_head),
        "head_dim": g.a("attention.key_length", n_embd // n_head),
        "max_position_embeddings": g.a("context_length"),
        "rms_norm_eps": float(np.float32(g.a("attention.layer_norm_rms_epsilon"))),
        "rope_theta": float(np.float32(g.a("rope.freq_base", 10000.0))),
        "vocab_size": len(g.kv("tokenizer.ggml.tokens")),
        "tie_word_embeddings": "output.weight" not in g.T,
        "hidden_act": "silu",
        "torch_dtype": "float16",
    }
    for k, key in (("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id"),
                   ("pad_token_id", "tokenizer.ggml.padding_token_id")):
        if g.kv(key) is not None:
            cfg[k] = int(g.kv(key))
    if g.arch == "minicpm":
        # convert_hf_to_gguf: embedding_scale = scale_emb, residual_scale = scale_depth /
        # sqrt(num_hidden_layers), logit_scale = hidden_size / dim_model_base
        cfg["scale_emb"] = float(np.float32(g.a("embedding_scale")))
        cfg["scale_depth"] = float(np.float32(g.a("residual_scale"))) * float(np.sqrt(n_layer))
        cfg["dim_model_base"] = float(n_embd) / float(np.float32(g.a("logit_scale")))
    if g.arch == "qwen2":
        # Qwen2Config keys of Qwen2.5's config.json; llama.cpp's qwen2 graph has no sliding
        # window, nor does Qwen2.5 use one (use_sliding_window false)
        cfg["use_sliding_window"] = False
        cfg["sliding_window"] = g.a("context_length")
        cfg["max_window_layers"] = n_layer
        cfg["attention_dropout"] = 0.0
    if g.a("rope.scaling.type") == "longrope":
        cfg["rope_scaling"] = {
            "rope_type": "longrope",
            "long_factor": [float(x) for x in g.W("rope_factors_long.weight")],
            "short_factor": [float(x) for x in g.W("rope_factors_short.weight")],
            "original_max_position_embeddings": g.a("rope.scaling.original_context_length"),
        }
    return cfg


# --------------------------------------------------------------- tokenizer ---

def tokenizer_config(g: Gguf, tokens):
    tc = {"model_max_length": g.a("context_length"), "clean_up_tokenization_spaces": False}
    if g.kv("tokenizer.chat_template") is not None:
        tc["chat_template"] = g.kv("tokenizer.chat_template")
    for name, key in (("bos_token", "tokenizer.ggml.bos_token_id"), ("eos_token", "tokenizer.ggml.eos_token_id"),
                      ("unk_token", "tokenizer.ggml.unknown_token_id"), ("pad_token", "tokenizer.ggml.padding_token_id")):
        if g.kv(key) is not None:
            tc[name] = tokens[int(g.kv(key))]
    if g.kv("tokenizer.ggml.add_bos_token") is not None:
        tc["add_bos_token"] = bool(g.kv("tokenizer.ggml.add_bos_token"))
    if g.kv("tokenizer.ggml.add_eos_token") is not None:
        tc["add_eos_token"] = bool(g.kv("tokenizer.ggml.add_eos_token"))
    return tc


QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Pre-tokenizers of gguf "pre" names, as the Hugging Face tokenizer.json of those models
# writes them (convert_hf_to_gguf.py recognises them by the ids they produce).
PRE = {
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
    "gpt2": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    # Qwen2/Qwen2.5 tokenizer.json (llama.cpp's "qwen2" pre-tokenizer regex is the same)
    "qwen2": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
}


def gpt2_tokenizer_json(g: Gguf, pre: str):
    tokens = g.kv("tokenizer.ggml.tokens")
    types = g.kv("tokenizer.ggml.token_type")
    merges = g.kv("tokenizer.ggml.merges")
    added = []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty in (3, 4):  # CONTROL, USER_DEFINED
            added.append({"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": ty == 4, "special": ty == 3})
    if pre not in PRE:
        die(f"no Hugging Face pre-tokenizer known for gguf pre {pre!r} (known: {sorted(PRE)})")
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        # Qwen2's own tokenizer.json has an NFC normalizer; llama.cpp does not normalize, and
        # the check is against llama-tokenize, so none here
        "normalizer": None,
        "pre_tokenizer": PRE[pre],
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": [m.split(" ", 1) for m in merges]},
    }


def spm_model(g: Gguf) -> bytes:
    """A sentencepiece ModelProto (BPE) with the GGUF's pieces, scores and types."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    m = pb.ModelProto()
    tokens, scores, types = (g.kv("tokenizer.ggml.tokens"), g.kv("tokenizer.ggml.scores"),
                             g.kv("tokenizer.ggml.token_type"))
    # gguf token_type: 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte;
    # sentencepiece Type: 1 NORMAL, 2 UNKNOWN, 3 CONTROL, 4 USER_DEFINED, 6 BYTE, 5 UNUSED
    for t, s, ty in zip(tokens, scores, types):
        p = m.pieces.add()
        p.piece, p.score, p.type = t, float(s), int(ty)
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.vocab_size = len(tokens)
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.unk_id = int(g.kv("tokenizer.ggml.unknown_token_id", 0))
    m.trainer_spec.bos_id = int(g.kv("tokenizer.ggml.bos_token_id", 1))
    m.trainer_spec.eos_id = int(g.kv("tokenizer.ggml.eos_token_id", 2))
    pad = g.kv("tokenizer.ggml.padding_token_id")
    m.trainer_spec.pad_id = -1 if pad is None else int(pad)
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = bool(g.kv("tokenizer.ggml.add_space_prefix", True))
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    return m.SerializeToString()


def check_tokenizer(g: Gguf, out: Path, vectors: Path):
    """Hugging Face `tokenizers` always matches added tokens in the text, as llama-tokenize
    with special parsing does (`special` ids); sentencepiece matches none, as plain parsing
    without BOS (`nobos`), so texts holding control-token text are skipped there."""
    vec = json.loads(vectors.read_text())
    texts = {t["name"]: t["text"] for t in json.loads((REPO / "testdata/tokenizer/texts.json").read_text())["texts"]}
    model = g.kv("tokenizer.ggml.model")
    tokens, types = g.kv("tokenizer.ggml.tokens"), g.kv("tokenizer.ggml.token_type")
    controls = [t for t, ty in zip(tokens, types) if ty in (2, 3) and t]  # control, unknown
    if model == "gpt2":
        from tokenizers import Tokenizer
        tk = Tokenizer.from_file(str(out / "tokenizer.json"))
        enc, field = (lambda s: tk.encode(s, add_special_tokens=False).ids), "special"
    else:
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))
        enc, field = (lambda s: sp.encode(s)), "nobos"
    # llama.cpp makes tokens with these texts CONTROL whatever their GGUF type (llama-vocab.cpp,
    # the EOG list), so with special parsing it splits them out where Hugging Face tokenizes the
    # text (Qwen2.5: "</s>" is the NORMAL token 128247); texts with such a token are skipped
    forced = {"</s>", "<eos>", "<|endoftext|>", "<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>",
              "<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<|eom_id|>"}
    forced = [t for t, ty in zip(tokens, types) if t in forced and ty not in (2, 3)]
    n = 0
    for c in vec["cases"]:
        text = texts[c["name"]]
        if field == "nobos" and any(t in text for t in controls):
            continue
        if field == "special" and any(t in text for t in forced):
            continue
        got, want = enc(text), c[field]
        if got != want:
            die(f"{model} tokenizer: {c['name']} {text[:40]!r}: {got[:12]} != llama-tokenize {want[:12]}")
        n += 1
    skipped = len(vec["cases"]) - n
    log(f"tokenizer: {n} texts encode to llama-tokenize's ids ({field})"
        + (f"; {skipped} skipped: holding control-token text sentencepiece does not parse, or text "
           f"llama.cpp forces to control ({forced})" if skipped else ""))


# ------------------------------------------------------ HF-style forward pass ---

def hf_forward_logits(out: Path, ids, n_ctx):
    """float64 numpy forward pass over the checkpoint, the way transformers' Llama/MiniCPM/Qwen2
    modelling code computes it: un-permuted q/k, rotate_half RoPE (cos/sin over both halves),
    q/k/v biases where present."""
    from safetensors.numpy import load_file
    cfg = json.loads((out / "config.json").read_text())
    W = {}
    for f in sorted(out.glob("*.safetensors")):
        W.update({k: v.astype(np.float64) for k, v in load_file(str(f)).items()})
    E, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", E // H)
    eps = cfg["rms_norm_eps"]
    minicpm = cfg["model_type"] == "minicpm"
    inv = cfg["rope_theta"] ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    rs = cfg.get("rope_scaling")
    mscale = 1.0
    if rs and rs.get("rope_type") == "longrope":
        # The factors as llama.cpp chooses them (per context: long when n_ctx > the original
        # context), the comparison target; cos and sin scaled by Hugging Face's LongRoPE mscale.
        orig = rs["original_max_position_embeddings"]
        f = np.array(rs["long_factor"] if n_ctx > orig else rs["short_factor"], dtype=np.float64)
        inv = inv / f
        mp = cfg["max_position_embeddings"]
        if mp > orig:
            mscale = float(np.float32(np.sqrt(1 + np.log(mp / orig) / np.log(orig))))
    emb = W["model.embed_tokens.weight"]
    head = W.get("lm_head.weight", emb)

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x) + eps) * w

    def lin(name, x):  # nn.Linear, with a bias where the checkpoint has one (Qwen2 q/k/v)
        y = W[name + ".weight"] @ x
        return y + W[name + ".bias"] if name + ".bias" in W else y

    def rot(x, pos):  # x [heads, hd]; rotate_half over the two halves
        th = np.concatenate([pos * inv, pos * inv])
        c, s = np.cos(th) * mscale, np.sin(th) * mscale
        x1, x2 = x[:, : hd // 2], x[:, hd // 2:]
        return x * c + np.concatenate([-x2, x1], axis=1) * s

    Ks, Vs = [[] for _ in range(L)], [[] for _ in range(L)]
    logits = None
    for pos, t in enumerate(ids):
        x = emb[t] * (cfg["scale_emb"] if minicpm else 1.0)
        for i in range(L):
            p = f"model.layers.{i}."
            h = rms(x, W[p + "input_layernorm.weight"])
            q = rot(lin(p + "self_attn.q_proj", h).reshape(H, hd), pos)
            k = rot(lin(p + "self_attn.k_proj", h).reshape(KV, hd), pos)
            v = lin(p + "self_attn.v_proj", h).reshape(KV, hd)
            Ks[i].append(k)
            Vs[i].append(v)
            Kt, Vt = np.stack(Ks[i], 1), np.stack(Vs[i], 1)
            att = np.zeros((H, hd))
            for hh in range(H):
                sc = Kt[hh // (H // KV)] @ q[hh] / np.sqrt(hd)
                pr = np.exp(sc - sc.max())
                att[hh] = (pr / pr.sum()) @ Vt[hh // (H // KV)]
            o = W[p + "self_attn.o_proj.weight"] @ att.reshape(-1)
            rsd = cfg["scale_depth"] / np.sqrt(L) if minicpm else 1.0
            x = x + o * rsd
            h = rms(x, W[p + "post_attention_layernorm.weight"])
            gg, u = W[p + "mlp.gate_proj.weight"] @ h, W[p + "mlp.up_proj.weight"] @ h
            x = x + (W[p + "mlp.down_proj.weight"] @ (gg / (1 + np.exp(-gg)) * u)) * rsd
        logits = head @ rms(x, W["model.norm.weight"])
        if minicpm:
            logits = logits / (E / cfg["dim_model_base"])
    return logits


def check_weights(out: Path, f32path_json: Path, tol: float):
    d = json.loads(f32path_json.read_text())
    c = d["cases"][0]
    want = np.fromfile(f32path_json.parent / c["logits_file"], dtype="<f4").astype(np.float64)
    got = hf_forward_logits(out, c["prompt_ids"], c["n_ctx"])
    diff = float(np.abs(got - want).max())
    if diff > tol or int(np.argmax(got)) != int(np.argmax(want)):
        die(f"weights: Hugging Face-style forward pass differs from llama.cpp's f32 path by {diff}")
    log(f"weights: Hugging Face-style forward pass = llama.cpp f32 path to {diff:.2e} ({c['prompt']!r})")


# --------------------------------------------------------------------- main ---

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=["f16", "f32"], default="f16")
    ap.add_argument("--shards", type=int, default=1,
                    help="split the weights into this many files with a model.safetensors.index.json")
    ap.add_argument("--tokenizer-vectors", help="testdata/tokenizer/*.json of this model (checked)")
    ap.add_argument("--llama-f32path", help="testdata/llama/*.f32path.json of this model (checked)")
    a = ap.parse_args()
    from safetensors.numpy import save_file

    g = Gguf(a.model)
    if g.arch not in ARCHITECTURES:
        die(f"architecture {g.arch} not handled")
    out = Path(a.out)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    n_head = g.a("attention.head_count")
    n_kv = g.a("attention.head_count_kv", n_head)
    names = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    }
    per_layer = {
        "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    dt = np.float16 if a.dtype == "f16" else np.float32
    tensors = {}
    for name in g.T:
        if name.startswith("rope_factors_"):
            continue  # config.json rope_scaling
        if name.startswith("blk."):
            _, i, kind, suffix = name.split(".")
            if suffix == "bias" and (g.arch != "qwen2" or kind not in ("attn_q", "attn_k", "attn_v")):
                die(f"unexpected bias tensor {name}")
            hf = f"model.layers.{i}.{per_layer[kind]}.{suffix}"
            w = g.W(name)
            if g.arch == "qwen2":
                pass  # Qwen2Model in convert_hf_to_gguf.py writes q/k as they are (NeoX RoPE)
            elif kind == "attn_q":
                w = unpermute(w, n_head)
            elif kind == "attn_k":
                w = unpermute(w, n_kv)
        else:
            hf, w = names[name], g.W(name)
        # permute(unpermute(w)) == w: the inverse is exact
        if name.endswith(("attn_q.weight", "attn_k.weight")) and g.arch != "qwen2":
            assert np.array_equal(permute(w, n_head if "attn_q" in name else n_kv), g.W(name))
        tensors[hf] = np.ascontiguousarray(w.astype(dt))
    if a.shards <= 1:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    else:
        # Hugging Face's sharded layout: model-0000i-of-0000N.safetensors and an index
        names_sorted = sorted(tensors)
        weight_map = {}
        for i in range(a.shards):
            part = names_sorted[i::a.shards]
            fname = f"model-{i + 1:05d}-of-{a.shards:05d}.safetensors"
            save_file({n: tensors[n] for n in part}, str(tmp / fname), metadata={"format": "pt"})
            weight_map.update({n: fname for n in part})
        total = sum(t.nbytes for t in tensors.values())
        (tmp / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n")
    (tmp / "config.json").write_text(json.dumps(hf_config(g), indent=2) + "\n")
    tokens = g.kv("tokenizer.ggml.tokens")
    (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(g, tokens), indent=2, ensure_ascii=False) + "\n")
    if g.kv("tokenizer.ggml.model") == "gpt2":
        tj = gpt2_tokenizer_json(g, g.kv("tokenizer.ggml.pre", "gpt2"))
        (tmp / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False) + "\n")
    else:
        (tmp / "tokenizer.model").write_bytes(spm_model(g))
    if a.tokenizer_vectors:
        check_tokenizer(g, tmp, Path(a.tokenizer_vectors))
    if a.llama_f32path:
        # f32 holds the GGUF's values exactly; f16 rounds them (about 0.02 in SmolLM2's logits)
        check_weights(tmp, Path(a.llama_f32path), 1e-3 if a.dtype == "f32" else 0.05)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    log(f"wrote {out}: {len(tensors)} tensors ({a.dtype})")


if __name__ == "__main__":
    main()
