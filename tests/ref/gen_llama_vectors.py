#!/usr/bin/env python3
"""Record llama.cpp (b11434, CPU) outputs as end-to-end test vectors for lowbit.

For every prompt of every model this writes (see testdata/llama/README.md):

  * prompt_ids   the prompt as llama.cpp tokenizes it (llama-tokenize; BOS as
                 the model's add_bos says; parse_special per case),
  * logits       llama-debug --save-logits: raw little-endian f32 logits at the
                 last prompt position (n_vocab floats) -> <stem>/<i>.logits.f32,
  * greedy_ids   llama-completion's greedy continuation (-n 48 --temp 0
                 --top-k 1), read back as exact token ids from the session file
                 that --prompt-cache-all writes at exit (prompt + every sampled
                 id), never by re-tokenizing text; cross-checked against a plain run
                 without prompt cache through llama.cpp's batch log
                 (LLAMA_BATCH_DEBUG=1 -v: the ids llama_decode was given),
  * top2_margins logit(top1) - logit(top2) at every generated step, from
                 llama-debug re-run on prompt_ids + greedy_ids[:k] (one run per
                 step; -ub 32 keeps every ubatch under 64 rows, which makes the
                 result bit-identical to incremental decoding, see README).
                 Each run's argmax is checked against greedy_ids[k].

Only unmodified llama.cpp binaries are run. llama-debug takes its prompt only
as text and tokenizes it without special tokens, and arbitrary id sequences
(generated text, byte tokens, <|im_end|>) do not survive a text round trip. So
whenever exact ids must be fed to llama-debug, it is run on a temporary
"typeable" copy of the GGUF (written to a temp dir, never kept): same tensors
and keys, but every token is USER_DEFINED (llama.cpp matches those in the
prompt text even without special-token parsing) with a unique private-use
code as its text, so the concatenated codes tokenize to exactly the wanted
ids. The graph never reads token text or type. The script checks that
llama-debug's own token dump equals the wanted ids on every such run, and
that the copy gives bit-identical logits to the original file for a plain
prompt (and, with margins on, for every prompt: step 0 of the re-runs must
equal the logits file bit for bit).

Usage (from the repository root, venv with gguf 0.19.0 / numpy 2.2.6):
    $(LOWBIT_CACHE)/venv/bin/python tests/ref/gen_llama_vectors.py [--models smollm2,minicpm-tiny]
        [--no-margins] [--bin DIR] [--out testdata/llama] [--keep-work]

Runtime on a busy 2-core machine: ~10 minutes for SmolLM2 (dominated by the
margin re-runs, ~7 x 48 llama-debug runs), ~20 s for the tiny MiniCPM.
Deterministic: rerunning gives byte-identical files on the same CPU build.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from gguf import GGUFReader

GENERATOR = "tests/ref/gen_llama_vectors.py"
LLAMA_BUILD = 11434
N_GEN = 48

# --------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------

SMOL_PARAGRAPH = (
    "The history of computing is a story of ideas that took decades to mature. "
    "Early mechanical calculators could only add and subtract, but in the nineteenth "
    "century Charles Babbage designed an engine that could follow a program stored on "
    "punched cards, and Ada Lovelace wrote notes on how it might"
)

MODELS = {
    "smollm2": {
        "path": "{cache}/models/SmolLM2-135M-Instruct.Q4_1.gguf",
        "cases": [
            {"prompt": "The capital of France is"},
            {"prompt": "Once upon a time"},
            {"prompt": "def fibonacci(n):"},
            {"prompt": "The quick brown fox"},
            {"prompt": SMOL_PARAGRAPH},
            {"prompt": "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                       "<|im_start|>assistant\n", "parse_special": True},
            {"prompt": "<|im_start|>user\nWrite a short story about a robot who learns to paint."
                       "<|im_end|>\n<|im_start|>assistant\n", "parse_special": True},
        ],
        # cases that also get a logits file from the most precise CPU path
        "precise_cases": [0],
        "expect": {0: " Paris"},   # greedy_text of case 0 must contain this
    },
    "minicpm-tiny": {
        "path": "testdata/ternary/minicpm-tiny-tq2_0.gguf",
        "cases": [
            {"prompt": "The capital of France is"},
            {"prompt": "Hello world, the quick brown fox jumps over the lazy dog."},
            {"prompt": "What is 42? Zebra caf\u00e9"},
            # same prompt with -c 256 <= original context 256: short LongRoPE factors
            {"prompt": "The capital of France is", "extra_flags": ["-c", "256"]},
        ],
        "precise_cases": [0, 1, 2, 3],
        "expect": {},
    },
}

# llama.cpp's f32 path: the same model requantized to F32 by llama-quantize (every value is
# gguf-py's dequantization bit for bit, checked), run with an f32 KV cache and without flash
# attention. F32 weights have vec_dot_type F32, so no activation is quantized anywhere; this is
# the llama.cpp path an f32-activation runtime can be held to token for token.
F32PATH_FLAGS = ["-fa", "off", "-ctk", "f32", "-ctv", "f32"]
for _key in ("smollm2", "minicpm-tiny"):
    _m = MODELS[_key]
    MODELS[_key + "-f32"] = {
        "derive_from": _key,
        "suffix": ".f32path",
        "flags": F32PATH_FLAGS,
        # SmolLM2 ends "The capital of France is" with <|im_end|> after 30 tokens; the same
        # prompt with --ignore-eos (EOG ids banned) gives a 48-token continuation to compare.
        "cases": _m["cases"] + ([{"prompt": "The capital of France is", "ignore_eos": True}]
                                if _key == "smollm2" else []),
        "precise_cases": [],
        "expect": _m["expect"],
    }

# Qwen2.5-Coder-0.5B-Instruct and Gemma 3 270M: f32 path only (the base entries are not run by
# themselves, see "f32path_only"). Cases: the five plain prompts of SmolLM2 and one chat prompt
# rendered with the model's chat template as llama.cpp renders it, then tokenized by
# llama-tokenize with special tokens parsed.
CHAT_USER = "Write a Python function that reverses a string"
PLAIN_CASES = [c for c in MODELS["smollm2"]["cases"] if not c.get("parse_special")]
# Qwen: the GGUF's own Jinja template (tokenizer.chat_template; llama.cpp applies it with --jinja,
# its default in llama-cli / llama-server) with no system message: it adds Qwen's default one.
QWEN_CHAT = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
             "assistant.<|im_end|>\n<|im_start|>user\n" + CHAT_USER + "<|im_end|>\n"
             "<|im_start|>assistant\n")
# Gemma: this GGUF has no tokenizer.chat_template; llama.cpp's built-in "gemma" template
# (src/llama-chat.cpp, LLM_CHAT_TEMPLATE_GEMMA); BOS comes from the tokenizer (add_bos true).
GEMMA_CHAT = "<start_of_turn>user\n" + CHAT_USER + "<end_of_turn>\n<start_of_turn>model\n"
MODELS["qwen2.5"] = {
    "path": "{cache}/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "f32path_only": True,
    "cases": PLAIN_CASES + [{"prompt": QWEN_CHAT, "parse_special": True,
                             "chat": {"template": "tokenizer.chat_template (Jinja, from the GGUF)",
                                      "messages": [["user", CHAT_USER]],
                                      "add_generation_prompt": True}}],
    "expect": {0: " Paris"},
}
MODELS["gemma3"] = {
    "path": "{cache}/models/gemma-3-270m-q4_k_m.gguf",
    "f32path_only": True,
    "cases": PLAIN_CASES + [{"prompt": GEMMA_CHAT, "parse_special": True,
                             "chat": {"template": "llama.cpp built-in \"gemma\" (the GGUF has none)",
                                      "messages": [["user", CHAT_USER]],
                                      "add_generation_prompt": True}}],
    "expect": {},
}
for _key in ("qwen2.5", "gemma3"):
    MODELS[_key + "-f32"] = {
        "derive_from": _key,
        "suffix": ".f32path",
        "flags": F32PATH_FLAGS,
        "cases": MODELS[_key]["cases"],
        "precise_cases": [],
        "expect": MODELS[_key]["expect"],
        # keep the checked-in size small: logits files only for the first cases of a big vocab
        # (262,144 floats = 1 MiB per case for Gemma); the JSON still has every case
        "max_logits_cases": 3 if _key == "gemma3" else None,
    }

# Prompts must stay under 64 tokens (checked), see README "Batch shape".
# Flags. Everything not listed is llama.cpp's default (flash attention "auto",
# which resolves to enabled on CPU; KV cache f16/f16; repack on; n_ctx from the
# model; n_batch 2048; n_ubatch 512; threads = llama.cpp's default).
COMMON_FLAGS = ["--no-escape"]
DEBUG_FLAGS = COMMON_FLAGS + ["--save-logits"]
GREEDY_FLAGS = COMMON_FLAGS + ["-n", str(N_GEN), "--temp", "0", "--top-k", "1",
                               "--seed", "0", "-no-cnv"]
# official run: ids come from the session file that --prompt-cache-all writes
# synchronously at exit: prompt + every decoded id + the last sampled id (which
# llama-completion never decodes), as int32
SESSION_FLAGS = ["--prompt-cache", "<tmp>/session.bin", "--prompt-cache-all"]
COMPLETION_FLAGS = GREEDY_FLAGS + SESSION_FLAGS
# cross-check run without a prompt cache: ids from llama.cpp's batch log
CHECK_FLAGS = GREEDY_FLAGS + ["-v"]
CHECK_ENV = {"LLAMA_BATCH_DEBUG": "1"}
LLAMA_SESSION_MAGIC = 0x6767736E  # 'ggsn'
LLAMA_SESSION_VERSION = 11
MARGIN_FLAGS = DEBUG_FLAGS + ["-t", "1", "--no-warmup", "-ub", "32"]
PRECISE_FLAGS = DEBUG_FLAGS + ["-fa", "off", "-ctk", "f32", "-ctv", "f32", "-nr"]
TOKENIZE_FLAGS = COMMON_FLAGS + ["--ids", "--log-disable"]

# ggml-cpu type_traits_cpu[...].vec_dot_type (ggml/src/ggml-cpu/ggml-cpu.c),
# checked against the source at run time when the source tree is present.
VEC_DOT_TYPE = {
    "F32": "F32", "F16": "F16", "BF16": "BF16", "Q4_0": "Q8_0", "Q4_1": "Q8_1",
    "Q8_0": "Q8_0", "Q4_K": "Q8_K", "Q6_K": "Q8_K", "TQ1_0": "Q8_K", "TQ2_0": "Q8_K",
}

def log(msg: str) -> None:
    print(f"[gen_llama_vectors] {msg}", file=sys.stderr, flush=True)


def die(msg: str) -> None:
    log("ERROR: " + msg)
    sys.exit(1)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------
# vocabulary (for greedy_text and the typeable copy; all tokenization is llama.cpp's)
# --------------------------------------------------------------------------

def _bytes_to_unicode() -> dict[str, int]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) \
        + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class Vocab:
    def __init__(self, path: Path):
        r = GGUFReader(path)
        f = r.fields
        self.model = bytes(f["tokenizer.ggml.model"].parts[-1]).decode()
        fk = f["tokenizer.ggml.tokens"]
        self.tokens = [bytes(fk.parts[i]).decode("utf-8") for i in fk.data]
        ft = f["tokenizer.ggml.token_type"]
        self.types = [int(ft.parts[i][0]) for i in ft.data]
        self.n_vocab = len(self.tokens)
        arch = bytes(f["general.architecture"].parts[-1]).decode()
        self.n_ctx_train = int(f[f"{arch}.context_length"].parts[-1][0])
        self.u2b = _bytes_to_unicode()
        self.tensor_types: dict[str, int] = {}
        for t in r.tensors:
            self.tensor_types[t.tensor_type.name] = self.tensor_types.get(t.tensor_type.name, 0) + 1

    def piece(self, tid: int, special: bool) -> bytes:
        """The bytes of one token, like llama.cpp's token_to_piece (for greedy_text only)."""
        text, typ = self.tokens[tid], self.types[tid]
        if typ in (2, 3, 5):  # UNKNOWN / CONTROL / UNUSED
            return text.encode() if special else b""
        if typ == 4:  # USER_DEFINED
            return text.encode()
        if self.model == "gpt2":
            try:
                return bytes(self.u2b[c] for c in text)
            except KeyError:
                return text.encode()
        if self.model == "llama":
            if typ == 6:  # BYTE <0xNN>
                return bytes([int(text[3:5], 16)])
            return text.replace("\u2581", " ").encode()
        raise ValueError(f"unsupported tokenizer model {self.model}")

    def render(self, ids, special: bool) -> bytes:
        return b"".join(self.piece(t, special) for t in ids)


CODE_MARK = "\ue000"      # private-use code points: never in a kept token text
CODE_DIGIT0 = 0xE100


def make_typeable_copy(src: Path, dst: Path, vocab: Vocab, write: bool = True) -> list[str]:
    """Write dst = src with a tokenizer in which every id can be typed as text.

    Every token becomes USER_DEFINED (llama.cpp matches those in the prompt text
    even with parse_special=false) and gets a unique code text MARK + 3 digits
    (private-use code points). Kept verbatim, because llama.cpp's vocab loader
    looks them up by text: SPM byte tokens <0xNN>, and for gpt2 vocabs the
    single-character byte-level tokens. Codes and kept texts can't overlap (UTF-8
    is self-synchronizing and the kept texts use no private-use code points), so
    concatenated codes tokenize back to exactly those ids. Tensor data and every
    other key are copied unchanged (gguf_new_metadata.py's method). Returns the
    text of each id in the copy.
    """
    import gguf

    texts = []
    for tid, (t, typ) in enumerate(zip(vocab.tokens, vocab.types)):
        keep = (vocab.model == "llama" and typ == 6) or (vocab.model == "gpt2" and len(t) == 1)
        if keep:
            texts.append(t)
        else:
            d = [(tid >> 12) & 63, (tid >> 6) & 63, tid & 63]
            texts.append(CODE_MARK + "".join(chr(CODE_DIGIT0 + x) for x in d))
    if len(set(texts)) != len(texts) or vocab.n_vocab > 1 << 18:
        die("typeable vocab is not unique")
    if not write:
        return texts
    r = GGUFReader(src)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(dst, arch, endianess=r.endianess)
    for field in r.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        if field.name == "tokenizer.ggml.tokens":
            val = texts
        elif field.name == "tokenizer.ggml.token_type":
            val = [4] * vocab.n_vocab
        else:
            val = field.contents()
        w.add_key_value(field.name, val, vtype, sub_type=sub)
    for t in r.tensors:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in r.tensors:
        w.write_tensor_data(t.data, tensor_endianess=r.endianess)
    w.close()
    return texts


# --------------------------------------------------------------------------
# llama.cpp runners
# --------------------------------------------------------------------------

class Llama:
    def __init__(self, bindir: Path, work: Path):
        self.bin = bindir
        self.work = work
        self.n_runs = 0
        self.reuse = False
        for t in ("llama-debug", "llama-completion", "llama-tokenize"):
            if not (bindir / t).is_file():
                die(f"missing {bindir / t} (run tests/ref/build_llama.sh)")

    def run(self, tool: str, args: list, env_extra: dict | None = None) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / tool)] + [a if isinstance(a, bytes) else str(a) for a in args]
        # no LLAMA_ARG_* defaults and no debug/kernel switches (LLAMA_ATTN_ROT_DISABLE,
        # GGML_CPU_TILED_MM, GGML_CPU_DISABLE_FUSION, ...) from the caller's environment
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "GGML_"))}
        if env_extra:
            env.update(env_extra)
        self.n_runs += 1
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, env=env)
        if p.returncode != 0:
            sys.stderr.write(p.stderr.decode(errors="replace")[-4000:])
            die(f"{tool} failed (rc {p.returncode}): {cmd[1:]}")
        return p

    def version(self) -> str:
        p = self.run("llama-completion", ["--version"])
        txt = (p.stdout + p.stderr).decode(errors="replace")
        m = re.search(r"version: (\S+) \(build (\d+), commit ([^)]+)\)", txt)
        if not m or int(m.group(2)) != LLAMA_BUILD:
            die(f"unexpected llama.cpp version: {txt.strip()!r}")
        return m.group(0)

    def tokenize(self, model: Path, prompt: str, parse_special: bool, no_bos: bool = False) -> list[int]:
        args = ["-m", model, "-p", prompt] + TOKENIZE_FLAGS
        if not parse_special:
            args.append("--no-parse-special")
        if no_bos:
            args.append("--no-bos")
        p = self.run("llama-tokenize", args)
        return [int(x) for x in json.loads(p.stdout.decode().strip())]

    def debug_logits(self, model: Path, prompt: bytes | str, flags: list, extra: list):
        out = Path(tempfile.mkdtemp(prefix="dbg-", dir=self.work))
        p = self.run("llama-debug", ["-m", model, "-p", prompt] + flags + extra
                     + ["--logits-output-dir", out])
        stem = model.stem
        logits = np.fromfile(out / f"llamacpp-{stem}.bin", dtype="<f4")
        toks = np.fromfile(out / f"llamacpp-{stem}-tokens.bin", dtype="<i4").tolist()
        txt = (p.stdout + p.stderr).decode(errors="replace")
        shutil.rmtree(out)
        return logits, toks, txt

    def greedy(self, model: Path, prompt: str, extra: list) -> list[int]:
        """Official greedy run; returns prompt + all sampled ids from the session file."""
        sess = self.work / "session.bin"
        if sess.exists():
            sess.unlink()
        flags = [str(sess) if f == "<tmp>/session.bin" else f for f in COMPLETION_FLAGS]
        self.run("llama-completion", ["-m", model, "-p", prompt] + flags + extra)
        raw = sess.read_bytes()
        magic, ver, n = np.frombuffer(raw[:12], dtype="<u4").tolist()
        if magic != LLAMA_SESSION_MAGIC or ver != LLAMA_SESSION_VERSION:
            die(f"unexpected session file header {magic:#x} v{ver}")
        ids = np.frombuffer(raw[12:12 + 4 * n], dtype="<i4").tolist()
        sess.unlink()
        return ids

    def greedy_check(self, model: Path, prompt: str, extra: list):
        """Plain run (no prompt cache) with the batch log; the log is asynchronous and
        llama.cpp does not flush it at exit, so its tail may be missing."""
        p = self.run("llama-completion", ["-m", model, "-p", prompt] + CHECK_FLAGS + extra,
                     env_extra=CHECK_ENV)
        return p.stdout, p.stderr.decode(errors="replace")


BATCH_RE = re.compile(r"ubatch_print:\s+\d+: id =\s*(-?\d+) \((.*?)\), pos =\s*(\d+), n_seq_id", re.S)


def parse_batch_log(err: str) -> list[int]:
    """Token ids by position from LLAMA_BATCH_DEBUG, for the last sequence started at pos 0
    (the warmup decode of [BOS, EOS] comes first and is dropped)."""
    recs = [(int(m.group(3)), int(m.group(1))) for m in BATCH_RE.finditer(err)]
    if not recs:
        die("no LLAMA_BATCH_DEBUG records in llama-completion log")
    last0 = max(i for i, (pos, _) in enumerate(recs) if pos == 0)
    by_pos: dict[int, int] = {}
    for pos, tid in recs[last0:]:
        if by_pos.setdefault(pos, tid) != tid:
            die(f"inconsistent batch log at pos {pos}")
    n = len(by_pos)
    if sorted(by_pos) != list(range(n)):
        die("gap in batch log positions")
    return [by_pos[i] for i in range(n)]


def grab(pattern: str, text: str, default=None):
    m = re.search(pattern, text, re.M)
    return m.group(1).strip() if m else default


def top2(logits: np.ndarray, banned=()):
    """Best two ids and their logit gap; `banned` ids (--ignore-eos: the EOG ids) excluded."""
    v = logits.astype(np.float64)
    if len(banned):
        v = v.copy()
        v[list(banned)] = -np.inf
    o = np.argsort(-v, kind="stable")[:2]
    return int(o[0]), int(o[1]), float(logits[o[0]]) - float(logits[o[1]])


def f32_round(x: float) -> float:
    return float(np.float32(x))


# --------------------------------------------------------------------------
# source checks
# --------------------------------------------------------------------------

def check_vec_dot_types(src: Path) -> str:
    f = src / "ggml/src/ggml-cpu/ggml-cpu.c"
    if not f.is_file():
        log(f"warning: {f} not found; vec_dot_type table not re-checked")
        return "not checked (source not found)"
    text = f.read_text()
    for t, want in VEC_DOT_TYPE.items():
        m = re.search(r"\[GGML_TYPE_%s\]\s*=\s*\{(.*?)\n    \}," % t, text, re.S)
        got = re.search(r"\.vec_dot_type\s*=\s*GGML_TYPE_(\w+)", m.group(1)) if m else None
        if not got or got.group(1) != want:
            die(f"vec_dot_type of {t} in {f} is {got and got.group(1)}, expected {want}")
    return "checked against ggml/src/ggml-cpu/ggml-cpu.c"


# --------------------------------------------------------------------------
# per model
# --------------------------------------------------------------------------

def model_path(cfg: dict, args, repo: Path) -> Path:
    model = Path(cfg["path"].format(cache=args.cache))
    if not model.is_absolute():
        model = repo / model
    if not model.is_file():
        die(f"model not found: {model}")
    return model


def derive_f32(src: Path, llama: Llama) -> tuple[Path, dict]:
    """src requantized to F32 by llama-quantize, checked value for value against gguf-py."""
    from gguf.quants import dequantize

    dst = llama.work / (src.stem + ".F32.gguf")
    args = ["--allow-requantize", src, dst, "F32"]
    if dst.exists() and llama.reuse:
        log(f"  reusing {dst} from --work (checked again below)")
    else:
        llama.run("llama-quantize", args)
    a, b = GGUFReader(src), GGUFReader(dst)
    tb = {t.name: t for t in b.tensors}
    if sorted(tb) != sorted(t.name for t in a.tensors):
        die(f"{dst.name}: tensor names differ from {src.name}")
    for t in a.tensors:
        want = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)
        got = np.asarray(tb[t.name].data, dtype=np.float32).reshape(-1)
        if tb[t.name].tensor_type.name != "F32" or want.view(np.uint32).tobytes() != got.view(np.uint32).tobytes():
            die(f"{dst.name}: {t.name} is not gguf-py's dequantization of {src.name} bit for bit")
    info = {
        "from_file": src.name,
        "from_sha256": sha256_file(src),
        "from_size": src.stat().st_size,
        "tool": "llama-quantize",
        "args": ["--allow-requantize", "<from_file>", "<file>", "F32"],
        "file_sha256": sha256_file(dst),
        "file_size": dst.stat().st_size,
        "values": "every tensor equals gguf-py's dequantization of from_file bit for bit (checked)",
    }
    return dst, info


def check_chat_prompt(model: Path, case: dict) -> str:
    """For a case rendered with the GGUF's own template: render it again with jinja2 when that
    is installed (trim_blocks, lstrip_blocks, as llama.cpp's engine and Hugging Face) and
    require the same text. Returns how the prompt was checked."""
    chat = case["chat"]
    if not chat["template"].startswith("tokenizer.chat_template"):
        return "literal (llama.cpp's built-in template, transcribed from src/llama-chat.cpp)"
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415
    except ImportError:
        log("    warning: jinja2 not installed; chat prompt not re-rendered")
        return "literal (not re-rendered: jinja2 missing)"
    r = GGUFReader(model)
    tmpl = bytes(r.fields["tokenizer.chat_template"].parts[-1]).decode()
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    got = env.from_string(tmpl).render(
        messages=[{"role": a, "content": b} for a, b in chat["messages"]],
        add_generation_prompt=chat["add_generation_prompt"], bos_token="", eos_token="")
    if got != case["prompt"]:
        die(f"chat template renders {got!r}, not the case's prompt")
    return "re-rendered with jinja2 from tokenizer.chat_template (checked equal)"


def process_model(key: str, cfg: dict, llama: Llama, args, repo: Path, version: str, vd_check: str):
    if cfg.get("f32path_only"):
        die(f"{key} has only f32-path vectors: use --models {key}-f32")
    derived = None
    if "derive_from" in cfg:
        src = model_path(MODELS[cfg["derive_from"]], args, repo)
        model, derived = derive_f32(src, llama)
        stem = src.stem + cfg["suffix"]
    else:
        model = model_path(cfg, args, repo)
        stem = model.stem
    model_flags = list(cfg.get("flags", []))
    out_dir = args.out / stem
    out_dir.mkdir(parents=True, exist_ok=True)
    log(f"{key}: {model}")
    vocab = Vocab(model)
    typeable: dict = {}

    def typed(id_list: list[int], add_bos: bool):
        """(typeable model copy, text that llama-debug tokenizes to exactly id_list)."""
        if not typeable:
            path = llama.work / f"{stem}.typeable.gguf"
            # a copy kept in --work from an earlier run is the same file (deterministic)
            typeable["texts"] = make_typeable_copy(model, path, vocab,
                                                   write=not (llama.reuse and path.exists()))
            typeable["path"] = path
            log(f"  wrote typeable-tokenizer copy {path.name}")
        body = id_list[1:] if add_bos else id_list
        return typeable["path"], "".join(typeable["texts"][t] for t in body)

    typeable_checked = False
    cases_out = []
    run_info: dict = {}
    for i, case in enumerate(cfg["cases"]):
        prompt = case["prompt"]
        parse_special = bool(case.get("parse_special", False))
        ignore_eos = bool(case.get("ignore_eos", False))
        # --ignore-eos is a sampling flag: only the greedy llama-completion runs take it
        sampling = ["--ignore-eos"] if ignore_eos else []
        extra = model_flags + list(case.get("extra_flags", []))
        log(f"  case {i}: {prompt[:50]!r}")

        # 1. prompt ids
        ids = llama.tokenize(model, prompt, parse_special)
        ids_plain = llama.tokenize(model, prompt, False) if parse_special else ids
        if len(ids) >= 64:
            # >= 64 query rows switch llama.cpp's flash attention to its tiled kernel: the
            # reference would then depend on -ub and differ from incremental decoding
            die(f"prompt has {len(ids)} tokens; keep prompts under 64 (see README)")

        # 2. first-step logits: the original file with the prompt text whenever llama-debug's
        #    own tokenization (parse_special=false) gives the right ids
        # the model's add_bos as llama.cpp applies it (not from logs: llama.cpp's logger is
        # asynchronous and loses its tail at exit)
        add_bos = ids != llama.tokenize(model, prompt, parse_special, no_bos=True)
        use_typeable = ids != ids_plain
        if use_typeable:
            dbg_model, dbg_text = typed(ids, add_bos)
        else:
            dbg_model, dbg_text = model, prompt
        logits, dbg_ids, dbg_log = llama.debug_logits(dbg_model, dbg_text, DEBUG_FLAGS, extra)
        if dbg_ids != ids:
            die(f"llama-debug tokens {dbg_ids} != llama-tokenize {ids}")
        if logits.size != vocab.n_vocab:
            die(f"logits size {logits.size} != n_vocab {vocab.n_vocab}")
        if grab(r"^Model add_bos: (\w+)", dbg_log, str(add_bos).lower()) != str(add_bos).lower():
            die("llama-debug reports a different add_bos")
        if not run_info.get("debug_system_info"):
            # llama.cpp's logger may drop lines at exit: fill from the first run that has it
            run_info["debug_system_info"] = grab(r"system_info: (.*)$", dbg_log)
        max_lc = cfg.get("max_logits_cases")
        keep_logits = max_lc is None or i < max_lc
        lf = out_dir / f"{i}.logits.f32"
        if keep_logits:
            logits.astype("<f4").tofile(lf)
        elif lf.exists():
            lf.unlink()
        logits_sha = hashlib.sha256(logits.astype("<f4").tobytes()).hexdigest()
        a1, a2, m1 = top2(logits)

        if not typeable_checked and not use_typeable:
            # the typeable copy must give bit-identical logits (same flags, same ids)
            tm, tt = typed(ids, add_bos)
            lb, tb, _ = llama.debug_logits(tm, tt, DEBUG_FLAGS, extra)
            if tb != ids or lb.tobytes() != logits.tobytes():
                die("typeable-tokenizer copy changes the logits of a plain prompt")
            typeable_checked = True

        # 3. greedy continuation
        seq = llama.greedy(model, prompt, extra + sampling)
        if seq[:len(ids)] != ids:
            die(f"llama-completion prompt ids {seq[:len(ids)]} != llama-tokenize {ids}")
        gen = seq[len(ids):]
        stdout, err = llama.greedy_check(model, prompt, extra + sampling)
        chk = parse_batch_log(err)
        n_overlap = min(len(chk), len(seq))
        check_diff = next((k for k in range(n_overlap) if chk[k] != seq[k]), None)
        if n_overlap < len(ids) or (check_diff is not None and check_diff < len(ids)):
            die(f"plain llama-completion run disagrees with the session run: {chk} vs {seq}")
        if check_diff is not None:
            # seen once (Gemma 3, f32 path, case 4, generated step 44): two llama-completion
            # runs of the same model, prompt and flags, with and without a prompt cache, chose
            # different ids at a near-tie; the session run stays the reference, the
            # disagreement is recorded
            log(f"    WARNING: the plain run chose {chk[check_diff]} at generated step "
                f"{check_diff - len(ids)}, the session run {seq[check_diff]}")
        # (the count varies from run to run, so it is logged, not stored)
        log(f"    check run confirmed {n_overlap} of {len(seq)} ids")
        eog_ids = list(dict.fromkeys(int(x) for x in re.findall(r"load:\s+- (\d+) \('", err)))
        if not eog_ids:
            die("no EOG ids in llama-completion log")
        stopped_at_eog = bool(gen) and gen[-1] in eog_ids
        if any(t in eog_ids for t in gen[:-1]):
            die("EOG inside the continuation")
        if len(gen) != N_GEN and not stopped_at_eog:
            die(f"{len(gen)} generated ids, expected {N_GEN} or an EOG at the end")
        banned = eog_ids if ignore_eos else []
        if ignore_eos:
            if stopped_at_eog:
                die("--ignore-eos run ended with an EOG id")
            a1, a2, m1 = top2(logits, banned)
        if gen[0] != a1:
            die(f"first greedy id {gen[0]} != argmax of llama-debug logits {a1}")
        if extra == model_flags:
            found = {
                "n_ctx": grab(r"llama_context: n_ctx\s+= (\d+)", err),
                "n_batch": grab(r"llama_context: n_batch\s+= (\d+)", err),
                "n_ubatch": grab(r"llama_context: n_ubatch\s+= (\d+)", err),
                "flash_attn_param": grab(r"llama_context: flash_attn\s+= (\w+)", err),
                "flash_attn_enabled": True if "Flash Attention enabled" in err else (
                    False if grab(r"llama_context: flash_attn\s+= (\w+)", err) in ("disabled", "off")
                    else None),
                "kv_cache": grab(r"llama_kv_cache: size = .*?(K \(\w+\).*)$", err),
                "system_info": grab(r"system_info: (.*)$", err),
                "sampler_chain": grab(r"sampler chain: (.*)$", err),
                "eog_ids": eog_ids,
            }
            for k, v in found.items():
                if run_info.get(k) is None and v is not None:
                    run_info[k] = int(v) if k in ("n_ctx", "n_batch", "n_ubatch") else v
        # n_ctx: -c if given, else the model's context length (llama.cpp's default -c 0);
        # cross-checked with the log when the log line survived
        case_n_ctx = int(extra[extra.index("-c") + 1]) if "-c" in extra else vocab.n_ctx_train
        logged = grab(r"llama_context: n_ctx\s+= (\d+)", err)
        if logged is not None and int(logged) != case_n_ctx:
            die(f"llama.cpp used n_ctx {logged}, expected {case_n_ctx}")
        greedy_text = vocab.render(gen, special=True).decode("utf-8", errors="replace")
        if i in cfg.get("expect", {}) and cfg["expect"][i] not in greedy_text:
            die(f"case {i}: greedy text {greedy_text!r} lacks {cfg['expect'][i]!r}")

        rec = {
            "prompt": prompt,
            "parse_special": parse_special,
            "ignore_eos": ignore_eos,
            "extra_flags": extra[len(model_flags):],
            "n_ctx": case_n_ctx,
            "prompt_ids": ids,
            "n_prompt": len(ids),
            "add_bos": add_bos,
            "logits_file": f"{stem}/{i}.logits.f32" if keep_logits else None,
            "logits_sha256": logits_sha,
            "logits_argmax": a1,
            "logits_top2": [a1, a2],
            "logits_top2_margin": f32_round(m1),
            "logits_from_typeable_copy": use_typeable,
            "greedy_ids": gen,
            "greedy_text": greedy_text,
            "stopped_at_eog": stopped_at_eog,
            "greedy_check_agrees": check_diff is None,
        }
        if check_diff is not None:
            rec["greedy_check_first_difference"] = {
                "step": check_diff - len(ids), "session_id": seq[check_diff],
                "plain_id": chk[check_diff]}
        if "chat" in case:
            rec["chat"] = dict(case["chat"], checked=check_chat_prompt(model, case))

        # 4. per-step margins: llama-debug on prompt_ids + greedy_ids[:k], typed through the
        #    typeable copy, one run per step
        if not args.no_margins:
            margins, runner_up, mism = [], [], []
            for k in range(len(gen)):
                tm, tt = typed(ids + gen[:k], add_bos)
                lk, tk, _ = llama.debug_logits(tm, tt, MARGIN_FLAGS, extra)
                if tk != ids + gen[:k]:
                    die(f"typeable re-run tokenized differently at step {k}")
                if k == 0 and lk.tobytes() != logits.tobytes():
                    die("margin run (step 0) is not bit-identical to the logits file")
                b1, b2, mk = top2(lk, banned)
                margins.append(f32_round(mk))
                runner_up.append(b2 if b1 == gen[k] else b1)
                if b1 != gen[k]:
                    mism.append(k)
            if mism:
                log(f"    WARNING: re-run argmax differs from greedy at steps {mism}")
            rec["top2_margins"] = margins
            rec["top2_runner_up_ids"] = runner_up
            rec["margin_argmax_mismatch_steps"] = mism
            log(f"    greedy {len(gen)} ids, eog={stopped_at_eog}, min margin {min(margins):.4g} "
                f"at step {int(np.argmin(margins))}")

        # 5. precise path
        if i in cfg.get("precise_cases", []):
            lp, tp, plog = llama.debug_logits(dbg_model, dbg_text, PRECISE_FLAGS, extra)
            if tp != ids:
                die("precise run tokenized differently")
            pf = out_dir / f"{i}.precise.logits.f32"
            lp.astype("<f4").tofile(pf)
            d = np.abs(lp.astype(np.float64) - logits.astype(np.float64))
            p1, p2, pm = top2(lp)
            rec["precise"] = {
                "logits_file": f"{stem}/{i}.precise.logits.f32",
                "logits_sha256": sha256_file(pf),
                "flags": PRECISE_FLAGS + extra,
                "argmax": p1,
                "top2_margin": f32_round(pm),
                "max_abs_diff_vs_default": f32_round(d.max()),
                "rms_diff_vs_default": f32_round(np.sqrt((d * d).mean())),
            }
        cases_out.append(rec)

    missing = [k for k in ("debug_system_info", "n_ctx", "n_batch", "n_ubatch", "flash_attn_param",
                           "flash_attn_enabled", "kv_cache", "system_info", "sampler_chain")
               if run_info.get(k) is None]
    if missing:
        die(f"llama.cpp logs never showed {missing}")
    doc = {
        "generator": GENERATOR,
        "llama_cpp_build": LLAMA_BUILD,
        "llama_cpp_version": version,
        "model_file": derived["from_file"] if derived else model.name,
        "model_sha256": derived["from_sha256"] if derived else sha256_file(model),
        "model_size": derived["from_size"] if derived else model.stat().st_size,
        "llama_cpp_ran": derived,
        "model_flags": model_flags,
        "n_vocab": vocab.n_vocab,
        "tokenizer_model": vocab.model,
        "tensor_types": vocab.tensor_types,
        "activation_vec_dot_type": {t: VEC_DOT_TYPE[t] for t in sorted(vocab.tensor_types)
                                    if t in VEC_DOT_TYPE},
        "vec_dot_type_source": vd_check,
        "n_generate": N_GEN,
        "tool": "llama-completion",
        "flags": COMPLETION_FLAGS,
        "tools": {
            "prompt_ids": {"tool": "llama-tokenize", "flags": TOKENIZE_FLAGS,
                           "flags_unless_parse_special": ["--no-parse-special"],
                           "note": "add_bos = whether adding --no-bos changes the ids"},
            "logits": {"tool": "llama-debug", "flags": DEBUG_FLAGS},
            "greedy_ids": {"tool": "llama-completion", "flags": COMPLETION_FLAGS,
                           "note": "ids = the session file written at exit: prompt, every decoded "
                                   "id, and the last sampled id (never decoded); an EOG ends "
                                   "generation and is the last id"},
            "greedy_check": {"tool": "llama-completion", "flags": CHECK_FLAGS, "env": CHECK_ENV,
                             "note": "same run without a prompt cache; the ids llama_decode received "
                                     "(LLAMA_BATCH_DEBUG) must agree with the session file (the "
                                     "log is asynchronous and may lose its tail at exit, so only "
                                     "the part that was printed is compared)"},
            "top2_margins": {"tool": "llama-debug", "flags": MARGIN_FLAGS},
            "precise": {"tool": "llama-debug", "flags": PRECISE_FLAGS},
        },
        "run": run_info,
        "cases": cases_out,
    }
    jf = args.out / f"{stem}.json"
    jf.write_text(json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=False) + "\n")
    log(f"  wrote {jf} ({llama.n_runs} llama.cpp runs so far)")


def main() -> None:
    repo = Path(__file__).resolve().parents[2]
    cache = Path(os.environ.get("LOWBIT_CACHE", Path.home() / ".cache/lowbit"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(k for k, v in MODELS.items() if not v.get("f32path_only")))
    ap.add_argument("--cache", type=Path, default=cache)
    ap.add_argument("--bin", type=Path, default=cache / "llama.cpp-11434/build/bin")
    ap.add_argument("--src", type=Path, default=cache / "llama.cpp-11434/src")
    ap.add_argument("--out", type=Path, default=repo / "testdata/llama")
    ap.add_argument("--no-margins", action="store_true", help="skip the per-step llama-debug re-runs")
    ap.add_argument("--keep-work", action="store_true")
    ap.add_argument("--work", type=Path, help="work directory to use and keep; an F32 GGUF or typeable "
                    "copy already there is reused (the F32 file is still checked against gguf-py)")
    args = ap.parse_args()
    if sys.byteorder != "little":
        die("little-endian host required")
    os.chdir(repo)
    args.out = args.out if args.out.is_absolute() else repo / args.out
    args.out.mkdir(parents=True, exist_ok=True)
    if args.work:
        args.work.mkdir(parents=True, exist_ok=True)
        args.keep_work = True
    work = args.work or Path(tempfile.mkdtemp(prefix="gen_llama_vectors-"))
    try:
        llama = Llama(args.bin, work)
        llama.reuse = bool(args.work)
        version = llama.version()
        vd = check_vec_dot_types(args.src)
        for key in args.models.split(","):
            if key not in MODELS:
                die(f"unknown model key {key}; known: {', '.join(MODELS)}")
            process_model(key, MODELS[key], llama, args, repo, version, vd)
    finally:
        if args.keep_work:
            log(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
