//! `convert tokenize`: llama.cpp's `llama-tokenize` over lowbit's tokenizer.
//!
//! Reference: `tools/tokenize/tokenize.cpp` of llama.cpp build 11434. That tool loads only the
//! vocabulary of a GGUF (`vocab_only`), tokenizes with
//! `common_tokenize(vocab, prompt, add_special = add_bos && !--no-bos, parse_special)` and
//! prints either every token as `printf("%6d -> '%s'\n", id, piece)`, where `piece` is
//! `common_token_to_piece(ctx, id)` (special tokens rendered as their text, bytes written
//! as they are, even when they are not UTF-8), or with `--ids` the ids as a Python list,
//! `[1, 2, 3]\n`. This module does the same for a GGUF file (a vocabulary-only GGUF with no
//! tensors included) or a bundle directory, and adds a JSON form.
//!
//! Two things differ from `llama-tokenize` on purpose, both documented in the README: the
//! prompt text is used verbatim (as `llama-tokenize --no-escape`; the tool's default turns
//! `\n` and friends into control characters), and special-token text is parsed only when
//! asked (`TokenizeOptions::parse_special`; `llama-tokenize` parses by default and has
//! `--no-parse-special`).

use std::io::{self, Write};
use std::path::Path;

use serde_json::{json, Value as Json};

use super::{Tokenizer, TokenizerError};
use crate::gguf::GgufFile;

/// How to tokenize, as `llama-tokenize`'s flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenizeOptions {
    /// `--no-bos`: no BOS (and no EOS) even when the model adds them. As in llama.cpp, this
    /// turns off `add_special` as a whole.
    pub no_bos: bool,
    /// Split special-token text (`<|im_start|>`, `<end_of_turn>`) out as those tokens.
    pub parse_special: bool,
}

/// The ids of one text and how they were made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tokenized {
    pub ids: Vec<u32>,
    /// Whether BOS/EOS were added where the model adds them (`add_bos && !no_bos`).
    pub add_special: bool,
    pub parse_special: bool,
}

/// The tokenizer of `model`: a bundle directory (its `tokenizer.json`) or a GGUF file (its
/// `tokenizer.*` metadata; the file may have no tensors at all, like llama.cpp's
/// `models/ggml-vocab-*.gguf`).
///
/// Errors: [`TokenizerError::Io`] / [`TokenizerError::Json`] for a bundle's file,
/// [`TokenizerError::Gguf`] for an unreadable GGUF; [`TokenizerError::UnsupportedModel`] /
/// [`TokenizerError::UnsupportedPre`] naming a tokenizer model or pre-tokenizer lowbit does not
/// implement and [`TokenizerError::Field`] for missing or malformed metadata, for a bundle;
/// for a GGUF each of those as [`TokenizerError::GgufField`], naming the file and its key.
pub fn load(model: &Path) -> Result<Tokenizer, TokenizerError> {
    if model.is_dir() {
        return Tokenizer::from_bundle_dir(model);
    }
    let f = GgufFile::open(model)?;
    // The tokenizer.json form names its keys without the `tokenizer.` prefix and as a bundle's
    // file: name the GGUF and its key instead.
    let in_gguf = |key: &str, detail: String| TokenizerError::GgufField {
        path: model.to_path_buf(),
        key: format!("tokenizer.{key}"),
        detail,
    };
    Tokenizer::from_json(&crate::bundle::config::tokenizer_json(&f)).map_err(|e| match e {
        TokenizerError::Field { field, detail } => match field.strip_prefix("metadata ") {
            Some(key) => in_gguf(key, detail),
            None => TokenizerError::Field { field, detail },
        },
        TokenizerError::UnsupportedModel(m) => in_gguf("ggml.model", super::unsupported_model(&m)),
        TokenizerError::UnsupportedPre(p) => in_gguf(
            "ggml.pre",
            super::unsupported_pre(&p, "tokenizer.ggml.model"),
        ),
        other => other,
    })
}

/// `llama-tokenize`'s tokenization of `text`.
pub fn tokenize(tok: &Tokenizer, text: &str, opts: TokenizeOptions) -> Tokenized {
    let add_special = tok.add_bos() && !opts.no_bos;
    Tokenized {
        ids: tok.encode(text, add_special, opts.parse_special),
        add_special,
        parse_special: opts.parse_special,
    }
}

/// `llama-tokenize`'s default output: `format!("{id:6} -> '")`, the piece's bytes, `'\n` per
/// token. Pieces are `token_to_piece(id, special = true)`, written raw (a piece can be part of
/// a UTF-8 sequence).
pub fn write_pieces(tok: &Tokenizer, ids: &[u32], out: &mut impl Write) -> io::Result<()> {
    for &id in ids {
        write!(out, "{id:6} -> '")?;
        out.write_all(tok.token_to_piece(id, true))?;
        out.write_all(b"'\n")?;
    }
    Ok(())
}

/// `llama-tokenize --ids`: `[1, 2, 3]` and a newline (`[]` for no tokens).
pub fn write_ids(ids: &[u32], out: &mut impl Write) -> io::Result<()> {
    out.write_all(b"[")?;
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            out.write_all(b", ")?;
        }
        write!(out, "{id}")?;
    }
    out.write_all(b"]\n")
}

/// `llama-tokenize --show-count`'s line.
pub fn write_count(n: usize, out: &mut impl Write) -> io::Result<()> {
    writeln!(out, "Total number of tokens: {n}")
}

/// A piece as JSON: a string when it is UTF-8, else `{"hex": "..."}` (the convention of
/// `tokenizer.json`).
fn piece_json(bytes: &[u8]) -> Json {
    match std::str::from_utf8(bytes) {
        Ok(s) => Json::String(s.to_string()),
        Err(_) => json!({ "hex": hex::encode(bytes) }),
    }
}

/// Stable JSON for `t`, keys in this order:
/// `{"n_tokens": N, "add_special": bool, "parse_special": bool, "ids": [..], "pieces": [..]}`,
/// `pieces[i]` being `token_to_piece(ids[i], special = true)` as a string, or `{"hex": ..}`
/// when it is not UTF-8.
pub fn to_json(tok: &Tokenizer, t: &Tokenized) -> Json {
    let pieces: Vec<Json> = t
        .ids
        .iter()
        .map(|&id| piece_json(tok.token_to_piece(id, true)))
        .collect();
    json!({
        "n_tokens": t.ids.len(),
        "add_special": t.add_special,
        "parse_special": t.parse_special,
        "ids": t.ids,
        "pieces": pieces,
    })
}
