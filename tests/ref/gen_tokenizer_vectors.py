#!/usr/bin/env python3
"""Tokenizer reference vectors, made FROM THE REFERENCE: llama.cpp's `llama-tokenize`.

For every text in `testdata/tokenizer/texts.json` and every model below, runs

    llama-tokenize -m MODEL -f TEXT_FILE --ids --no-escape --log-disable [FLAGS]

(the text is written to a file byte for byte; `--no-escape` keeps backslashes
literal) with three flag sets, and once more without `--ids` to read the piece
that llama.cpp prints for every token:

* `special`: no flags. llama-tokenize parses special tokens by default and adds
  the model's BOS (and EOS) when `tokenizer.ggml.add_bos_token` is true, i.e.
  `llama_tokenize(text, add_special = add_bos, parse_special = true)`.
* `plain`:   `--no-parse-special`, i.e. `(add_special = add_bos, parse_special = false)`.
* `nobos`:   `--no-bos`, i.e. `(add_special = false, parse_special = true)`.
* `pieces_hex`: for the `special` ids, `common_token_to_piece(id, special = true)`
  of each token as hex (pieces may be partial UTF-8).

Writes `testdata/tokenizer/<model>.json` (indent 1, one case per line):

    {"generator": ..., "llama_cpp": "<llama-tokenize --version>", "model_file": ...,
     "model_sha256": ..., "empty_with_special": ids of "" (BOS/EOS as the model adds them),
     "empty_without_special": ids of "" with --no-bos,
     "vocab_info": {"bos": id, "eos": id, "eot": id, "unk": id, ..., "eog": [ids],
                    "special_cache_size": n}  (from the loader's -v log),
     "cases": [{"name": ..., "special": [...], "plain": [...], "nobos": [...],
                "pieces_hex": [...]}, ...]}

Usage (from the repository root; what the checked-in files were made with):
    $LOWBIT_CACHE/venv/bin/python tests/ref/gen_tokenizer_vectors.py --synthetic --chat-template --cli
    [--llama-tokenize PATH] [--only NAME ...]   (--only: these models only)

Models (a missing one is skipped with a message):
    smollm2      $LOWBIT_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf   (GPT-2 BPE, pre "smollm")
    minicpm-tiny testdata/ternary/minicpm-tiny-tq2_0.gguf                (SentencePiece, in the repo)
    gemma3       $LOWBIT_CACHE/models/gemma-3-270m-q4_k_m.gguf          (SentencePiece, no space prefix)
    qwen2.5      $LOWBIT_CACHE/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf  (GPT-2 BPE, pre "qwen2")
    ggml-vocab-qwen2  $LOWBIT_CACHE/llama.cpp-11434/src/models/ggml-vocab-qwen2.gguf
                 (llama.cpp's vocabulary-only test GGUF, no tensors; in its source tree)

`$LOWBIT_CACHE` defaults to ~/.cache/lowbit; llama-tokenize defaults to
$LOWBIT_CACHE/llama.cpp-11434/build/bin/llama-tokenize (tests/ref/build_llama.sh).
Uses only the Python standard library, except `--synthetic` (gguf-py) and `--chat-template`
(jinja2). Deterministic.

`--synthetic` (needs gguf-py, e.g. the venv of tests/ref/requirements.txt) also writes
`smollm2-as-llama3.json` and `smollm2-as-qwen2.json`: SmolLM2's vocabulary and merges with
`tokenizer.ggml.pre` set to "llama-bpe" / "qwen2" (a tensor-less GGUF copy in a temporary
directory), to check the llama3 / qwen2 pre-tokenizer splits; no `pieces_hex` there.

`--unicode-table` only rewrites `src/tokenizer/unicode_data.rs`: llama.cpp's codepoint
category table (src/unicode-data.cpp under `--llama-src`, default
$LOWBIT_CACHE/llama.cpp-11434/src), so lowbit's pre-tokenizers classify codepoints with
llama.cpp's Unicode version.

`--cli` (needs gguf-py) writes `testdata/tokenizer/minicpm-tiny-vocab.gguf`, a vocabulary-only
copy (every key, no tensors) of the tiny MiniCPM, and `testdata/tokenizer/llama_tokenize_cli.json`:
llama-tokenize's exact stdout for CLI_PROMPTS x CLI_FLAGS on the CLI_MODELS that exist, for the
`convert tokenize` tests:

    {"generator", "llama_cpp", "command", "models": {name: {"file", "sha256"}},
     "prompts": [...], "runs": [{"model": name, "prompt": index, "flags": [...],
                                 "stdout": "..." | "stdout_hex": "..." (when not UTF-8)}, ...]}

`--chat-template` additionally renders the SmolLM2, MiniCPM and Qwen2.5 chat templates with
Python jinja2 (trim_blocks and lstrip_blocks on, as llama.cpp's jinja engine and
Hugging Face do) for the conversations in CHATS and writes
`testdata/tokenizer/chat_templates.json`. Needs `pip install jinja2`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

GENERATOR = "tests/ref/gen_tokenizer_vectors.py"
ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("LOWBIT_CACHE", Path.home() / ".cache" / "lowbit"))

MODELS = {
    "smollm2": CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf",
    "minicpm-tiny": ROOT / "testdata" / "ternary" / "minicpm-tiny-tq2_0.gguf",
    "gemma3": CACHE / "models" / "gemma-3-270m-q4_k_m.gguf",
    "qwen2.5": CACHE / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    # llama.cpp's own vocabulary-only test file (no tensors), from its source tree
    "ggml-vocab-qwen2": CACHE / "llama.cpp-11434" / "src" / "models" / "ggml-vocab-qwen2.gguf",
}

VARIANTS = {
    "special": [],
    "plain": ["--no-parse-special"],
    "nobos": ["--no-bos"],
}

# Conversations for the chat-template reference: (name, messages, add_generation_prompt).
CHATS = [
    ("user_only", [("user", "Hello!")], True),
    ("user_only_no_gen", [("user", "Hello!")], False),
    ("system_user", [("system", "You are terse."), ("user", "What is 2+2?")], True),
    (
        "multi_turn",
        [("user", "  Hi there  "), ("assistant", "Hello! How can I help?"), ("user", "Tell me a joke.\n")],
        True,
    ),
    ("unicode", [("user", "Grüße 你好 🦀")], True),
    ("empty", [], True),
]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def run(cmd: list[str]) -> bytes:
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr.decode(errors='replace')}")
    return p.stdout


def tokenize(exe: str, model: Path, text_file: str, flags: list[str]) -> list[int]:
    out = run([exe, "-m", str(model), "-f", text_file, "--ids", "--no-escape", "--log-disable", *flags])
    line = out.decode().strip()
    if not (line.startswith("[") and line.endswith("]")):
        sys.exit(f"unexpected llama-tokenize output: {line!r}")
    return json.loads(line)


def pieces(exe: str, model: Path, text_file: str, ids: list[int]) -> list[str]:
    """Each token's piece from the non --ids output: `%6d -> '<piece>'\\n` per token."""
    out = run([exe, "-m", str(model), "-f", text_file, "--no-escape", "--log-disable"])
    res = []
    pos = 0
    for i, tid in enumerate(ids):
        head = f"{tid:6d} -> '".encode()
        if not out.startswith(head, pos):
            sys.exit(f"piece parse error at token {i} ({tid}): {out[pos:pos + 40]!r}")
        pos += len(head)
        if i + 1 < len(ids):
            end = out.find(b"'\n" + f"{ids[i + 1]:6d} -> '".encode(), pos)
        else:
            end = len(out) - 2
            if out[end:] != b"'\n":
                sys.exit(f"piece parse error at the last token: {out[-40:]!r}")
        if end < 0:
            sys.exit(f"piece parse error at token {i} ({tid})")
        res.append(out[pos:end].hex())
        pos = end + 2
    return res


def vocab_info(exe: str, model: Path, text_file: str) -> dict:
    """Special token ids as llama.cpp's loader logs them with -v (print_info / load lines)."""
    p = subprocess.run(
        [exe, "-m", str(model), "-f", text_file, "--ids", "--no-escape", "-v"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False,
    )
    info: dict = {"eog": []}
    for line in p.stdout.decode(errors="replace").splitlines():
        m = re.search(r"print_info: (BOS|EOS|EOT|EOM|UNK|SEP|PAD|MASK|LF|FIM PRE|FIM SUF|FIM MID|FIM PAD|FIM REP|FIM SEP)"
                      r" token +(?:= )?(-?\d+)", line)
        if m:
            info[m.group(1).lower().replace(" ", "_")] = int(m.group(2))
            continue
        m = re.search(r"print_info: EOG token += (\d+)", line)
        if m:
            info["eog"].append(int(m.group(1)))
            continue
        m = re.search(r"special tokens cache size = (\d+)", line)
        if m:
            info["special_cache_size"] = int(m.group(1))
    info["eog"].sort()
    return info


def gen_model(
    exe: str, version: str, name: str, model: Path, texts: list[dict], out_dir: Path, pieces_too: bool = True
) -> None:
    meta_ids = None
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for t in texts:
            f = os.path.join(tmp, "text.txt")
            with open(f, "wb") as fh:
                fh.write(t["text"].encode("utf-8"))
            case = {"name": t["name"]}
            for v, flags in VARIANTS.items():
                case[v] = tokenize(exe, model, f, flags)
            if pieces_too:
                case["pieces_hex"] = pieces(exe, model, f, case["special"])
            cases.append(case)
        # add_bos / add_eos as llama.cpp applies them: tokenize "" with and without --no-bos.
        f = os.path.join(tmp, "empty.txt")
        open(f, "wb").close()
        meta_ids = (tokenize(exe, model, f, []), tokenize(exe, model, f, ["--no-bos"]))
        info = vocab_info(exe, model, f)
    doc = {
        "generator": GENERATOR,
        "llama_cpp": version,
        "model_file": model.name,
        "model_sha256": sha256_file(model) if pieces_too else None,
        "empty_with_special": meta_ids[0],
        "empty_without_special": meta_ids[1],
        "vocab_info": info,
        "cases": cases,
    }
    head = {k: v for k, v in doc.items() if k != "cases"}
    lines = [json.dumps(c, ensure_ascii=False, separators=(", ", ": ")) for c in cases]
    text = json.dumps(head, indent=1, ensure_ascii=False)[:-2]
    text += ',\n "cases": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"
    assert json.loads(text) == doc
    path = out_dir / f"{name}.json"
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}: {len(cases)} texts")


def gen_chat(out_dir: Path) -> None:
    import jinja2  # noqa: PLC0415 (optional dependency)
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415

    templates = {}
    for name in ("smollm2", "minicpm-tiny", "qwen2.5"):
        model = MODELS[name]
        if not model.exists():
            print(f"skipping chat template of {name}: {model} not found")
            continue
        templates[name] = read_gguf_template(model)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    out = {"generator": GENERATOR, "jinja2": jinja2.__version__, "templates": {}}
    for name, (tmpl, bos, eos) in templates.items():
        t = env.from_string(tmpl)
        cases = []
        for cname, msgs, gen in CHATS:
            messages = [{"role": r, "content": c} for r, c in msgs]
            try:
                rendered = t.render(messages=messages, add_generation_prompt=gen, bos_token=bos, eos_token=eos)
            except jinja2.exceptions.TemplateError as e:
                # e.g. Qwen2.5's template reads messages[0] and fails on an empty chat
                print(f"{name}: {cname}: jinja2 fails ({e}); case left out")
                continue
            cases.append({"name": cname, "messages": msgs, "add_generation_prompt": gen, "rendered": rendered})
        out["templates"][name] = {"bos_token": bos, "eos_token": eos, "cases": cases}
    path = out_dir / "chat_templates.json"
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {path}")


def read_gguf_template(path: Path) -> tuple[str, str, str]:
    """(chat_template, bos text, eos text) from a GGUF file, with a minimal GGUF v2/v3 reader."""
    import struct  # noqa: PLC0415

    with open(path, "rb") as f:
        data = f.read(64 << 20)
    if data[:4] != b"GGUF":
        sys.exit(f"{path}: not a GGUF file")
    (version,) = struct.unpack_from("<I", data, 4)
    if version < 2:
        sys.exit(f"{path}: GGUF v{version} is not supported")
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    pos = 24
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def read_str():
        nonlocal pos
        (n,) = struct.unpack_from("<Q", data, pos)
        s = data[pos + 8 : pos + 8 + n]
        pos += 8 + n
        return s.decode("utf-8")

    def read_val(t):
        nonlocal pos
        if t == 8:
            return read_str()
        if t == 9:
            (at, n) = struct.unpack_from("<IQ", data, pos)
            pos += 12
            if at in scalar:
                size = struct.calcsize("<" + scalar[at])
                vals = list(struct.unpack_from(f"<{n}{scalar[at]}", data, pos))
                pos += size * n
                return vals
            return [read_val(at) for _ in range(n)]
        fmt = "<" + scalar[t]
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    kv = {}
    for _ in range(n_kv):
        key = read_str()
        (t,) = struct.unpack_from("<I", data, pos)
        pos += 4
        kv[key] = read_val(t)
    tokens = kv["tokenizer.ggml.tokens"]
    bos = tokens[kv["tokenizer.ggml.bos_token_id"]] if "tokenizer.ggml.bos_token_id" in kv else ""
    eos = tokens[kv["tokenizer.ggml.eos_token_id"]] if "tokenizer.ggml.eos_token_id" in kv else ""
    return kv["tokenizer.chat_template"], bos, eos


# Synthetic variants: SmolLM2's vocabulary and merges under another `tokenizer.ggml.pre`,
# to check the llama3 and qwen2 pre-tokenizer splits (no cached model uses them).
SYNTHETIC = {"smollm2-as-llama3": "llama-bpe", "smollm2-as-qwen2": "qwen2"}


def gen_synthetic(exe: str, version: str, texts: list[dict], out_dir: Path) -> None:
    """Writes a tensor-less GGUF copy of SmolLM2's metadata with `tokenizer.ggml.pre`
    replaced (gguf-py, pinned in tests/ref/requirements.txt), then vectors as gen_model."""
    try:
        from gguf import GGUFReader, GGUFValueType, GGUFWriter  # noqa: PLC0415
    except ImportError:
        print("skipping synthetic pre-tokenizer vectors: the gguf package is not installed")
        return
    src = MODELS["smollm2"]
    if not src.exists():
        print(f"skipping synthetic pre-tokenizer vectors: {src} not found")
        return
    reader = GGUFReader(src)
    for name, pre in SYNTHETIC.items():
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{name}.gguf"
            w = GGUFWriter(path, arch=str(reader.fields["general.architecture"].contents()))
            for key, f in reader.fields.items():
                if key.startswith("GGUF.") or key == "general.architecture":
                    continue
                vtype = f.types[0]
                val = f.contents()
                if key == "tokenizer.ggml.pre":
                    val = pre
                sub = f.types[1] if vtype == GGUFValueType.ARRAY else None
                w.add_key_value(key, val, vtype, sub_type=sub)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
            gen_model(exe, version, name, path, texts, out_dir, pieces_too=False)
            # the vectors name the source model, not the temporary copy
            doc_path = out_dir / f"{name}.json"
            doc = doc_path.read_text(encoding="utf-8")
            doc = doc.replace(f'"model_file": "{name}.gguf"', f'"model_file": "{src.name} with tokenizer.ggml.pre = {pre}"')
            doc_path.write_text(doc, encoding="utf-8")


# A vocabulary-only GGUF (every key, no tensors) of the tiny MiniCPM, kept in the repository so
# that `convert tokenize` on a tensor-less GGUF is tested without any download.
VOCAB_ONLY = ROOT / "testdata" / "tokenizer" / "minicpm-tiny-vocab.gguf"


def write_vocab_only(src: Path, dst: Path) -> None:
    """dst = every metadata key of src (gguf-py), no tensors: like llama.cpp's ggml-vocab-*.gguf."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter  # noqa: PLC0415

    reader = GGUFReader(src)
    w = GGUFWriter(dst, arch=str(reader.fields["general.architecture"].contents()))
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), vtype, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {dst} ({dst.stat().st_size} bytes, no tensors)")


# `llama-tokenize`'s exact stdout, for the `convert tokenize` tests (tests/tokenize_cli.rs).
CLI_MODELS = {
    "minicpm-tiny-vocab": VOCAB_ONLY,
    "ggml-vocab-qwen2": MODELS["ggml-vocab-qwen2"],
    "qwen2.5": MODELS["qwen2.5"],
    "gemma3": MODELS["gemma3"],
    "smollm2": MODELS["smollm2"],
}
CLI_PROMPTS = [
    "Hello world",
    "<|im_start|>user\nWrite a Python function that reverses a string<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nGr\u00fc\u00dfe \u4f60\u597d \U0001f999<end_of_turn>\n<s> x  \t1234",
]
# every run gets `-m MODEL -p PROMPT --no-escape --log-disable` first
CLI_FLAGS = [
    [],
    ["--no-parse-special"],
    ["--ids"],
    ["--ids", "--no-parse-special"],
    ["--no-bos", "--ids"],
    ["--no-bos", "--show-count"],
]


def gen_cli(exe: str, version: str, out_dir: Path) -> None:
    models = {}
    runs = []
    for name, path in CLI_MODELS.items():
        if not path.exists():
            print(f"skipping llama-tokenize CLI runs of {name}: {path} not found")
            continue
        models[name] = {"file": path.name, "sha256": sha256_file(path)}
        for pi, prompt in enumerate(CLI_PROMPTS):
            for flags in CLI_FLAGS:
                out = run([exe, "-m", str(path), "-p", prompt, "--no-escape", "--log-disable", *flags])
                rec = {"model": name, "prompt": pi, "flags": flags}
                try:
                    rec["stdout"] = out.decode("utf-8")
                except UnicodeDecodeError:
                    rec["stdout_hex"] = out.hex()
                runs.append(rec)
    doc = {
        "generator": GENERATOR,
        "llama_cpp": version,
        "command": "llama-tokenize -m MODEL -p PROMPT --no-escape --log-disable FLAGS...",
        "models": models,
        "prompts": CLI_PROMPTS,
        "runs": runs,
    }
    head = {k: v for k, v in doc.items() if k != "runs"}
    text = json.dumps(head, indent=1, ensure_ascii=False)[:-2]
    text += ',\n "runs": [\n  ' + ",\n  ".join(json.dumps(r, ensure_ascii=False) for r in runs) + "\n ]\n}\n"
    assert json.loads(text) == doc
    path = out_dir / "llama_tokenize_cli.json"
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}: {len(runs)} runs")


def gen_unicode_table(llama_src: Path, out: Path) -> None:
    """Writes llama.cpp's codepoint category table (src/unicode-data.cpp: unicode_ranges_flags
    and unicode_set_whitespace) as Rust, so lowbit classifies codepoints exactly as llama.cpp
    does (its Unicode version, not the one of a Rust crate)."""

    src = (llama_src / "src" / "unicode-data.cpp").read_text(encoding="utf-8")
    ranges_blk = src.split("unicode_ranges_flags = {")[1].split("};")[0]
    ranges = [(int(a, 16), int(b, 16)) for a, b in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)\}", ranges_blk)]
    ws_blk = src.split("unicode_set_whitespace = {")[1].split("};")[0]
    ws = [int(x, 16) for x in re.findall(r"0x([0-9A-F]+)", ws_blk)]
    assert ranges[0][0] == 0 and ranges[-1][0] == 0x110000
    assert all(f <= 0xFF for _, f in ranges), "category flags must fit in 8 bits"
    assert all(a[0] < b[0] for a, b in zip(ranges, ranges[1:]))
    packed = [(start << 8) | flags for start, flags in ranges]
    lines = [
        "//! llama.cpp's codepoint categories. GENERATED by",
        "//! `python3 tests/ref/gen_tokenizer_vectors.py --unicode-table` from llama.cpp's",
        f"//! src/unicode-data.cpp ({llama_src.resolve().parent.name}); do not edit.",
        "",
        "/// `(first codepoint << 8) | category flags`, sorted: the flags hold up to the next entry's",
        "/// first codepoint. The last entry starts at 0x110000 (past the last codepoint).",
        "#[rustfmt::skip]",
        f"pub(super) static RANGES: [u32; {len(packed)}] = [",
    ]
    for i in range(0, len(packed), 8):
        lines.append("    " + " ".join(f"0x{v:08X}," for v in packed[i : i + 8]))
    lines.append("];")
    lines.append("")
    lines.append("/// Codepoints llama.cpp treats as whitespace (`\\s`), sorted.")
    lines.append("#[rustfmt::skip]")
    lines.append(f"pub(super) static WHITESPACE: [u32; {len(ws)}] = [")
    ws = sorted(ws)
    for i in range(0, len(ws), 8):
        lines.append("    " + " ".join(f"0x{v:06X}," for v in ws[i : i + 8]))
    lines.append("];")
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out}: {len(packed)} ranges, {len(ws)} whitespace codepoints")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--llama-tokenize",
        default=str(CACHE / "llama.cpp-11434" / "build" / "bin" / "llama-tokenize"),
    )
    ap.add_argument("--only", nargs="*", choices=sorted(MODELS), help="models to generate (default: all)")
    ap.add_argument("--out", default=str(ROOT / "testdata" / "tokenizer"))
    ap.add_argument("--chat-template", action="store_true", help="also write chat_templates.json (needs jinja2)")
    ap.add_argument(
        "--synthetic",
        action="store_true",
        help="also write smollm2-as-llama3.json / smollm2-as-qwen2.json (needs gguf-py)",
    )
    ap.add_argument(
        "--cli",
        action="store_true",
        help="also write minicpm-tiny-vocab.gguf (needs gguf-py) and llama_tokenize_cli.json",
    )
    ap.add_argument(
        "--unicode-table",
        action="store_true",
        help="only (re)write src/tokenizer/unicode_data.rs from llama.cpp's src/unicode-data.cpp",
    )
    ap.add_argument("--llama-src", default=str(CACHE / "llama.cpp-11434" / "src"))
    args = ap.parse_args()

    if args.unicode_table:
        gen_unicode_table(Path(args.llama_src), ROOT / "src" / "tokenizer" / "unicode_data.rs")
        return

    out_dir = Path(args.out)
    texts = json.loads((ROOT / "testdata" / "tokenizer" / "texts.json").read_text(encoding="utf-8"))["texts"]
    version = run([args.llama_tokenize, "--version"]).decode().strip()
    if not version:
        p = subprocess.run([args.llama_tokenize, "--version"], capture_output=True, check=False)
        version = p.stderr.decode().strip().splitlines()[0]
    for name in args.only or MODELS:
        model = MODELS[name]
        if not model.exists():
            print(f"skipping {name}: {model} not found")
            continue
        gen_model(args.llama_tokenize, version, name, model, texts, out_dir)
    if args.synthetic:
        gen_synthetic(args.llama_tokenize, version, texts, out_dir)
    if args.chat_template:
        gen_chat(out_dir)
    if args.cli:
        write_vocab_only(MODELS["minicpm-tiny"], VOCAB_ONLY)
        gen_cli(args.llama_tokenize, version, out_dir)


if __name__ == "__main__":
    main()
