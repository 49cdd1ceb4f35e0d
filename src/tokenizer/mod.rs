//! Tokenizers of a bundle's `tokenizer.json`, giving the token ids llama.cpp gives.
//!
//! `tokenizer.json` ([`crate::bundle::config::tokenizer_json`]) holds every GGUF
//! `tokenizer.*` key verbatim under `metadata`, with the `tokenizer.` prefix dropped. This
//! module rebuilds llama.cpp's vocabulary from it (`llama_vocab::impl::load`) and ports its
//! tokenizers (`src/llama-vocab.cpp`, `src/unicode.cpp` of llama.cpp build 11434):
//!
//! * `ggml.model == "gpt2"`: byte-level BPE. The pre-tokenizer regexes are llama.cpp's for
//!   `ggml.pre` (see [`PRE_TOKENIZERS`]; e.g. `"smollm"`: `\p{N}` then the GPT-2 regex), with
//!   llama.cpp's hand-written splitters and its own Unicode table; merges by rank from
//!   `ggml.merges`.
//! * `ggml.model == "llama"`: SentencePiece-style (`llm_tokenizer_spm`): spaces become
//!   U+2581, a space is prepended after BOS/special tokens when `add_space_prefix` (default
//!   true, Gemma: false), adjacent pieces merge by token score, and characters no token
//!   covers fall back to `<0xXX>` byte tokens.
//!
//! Special tokens (types CONTROL, USER_DEFINED and UNKNOWN) are split out of the text first,
//! longest first, as llama.cpp's `tokenizer_st_partition`; CONTROL and UNKNOWN ones only when
//! `parse_special`. End-of-generation ids ([`Tokenizer::is_eog`]) follow llama.cpp's rules
//! (eos, eot, eom, fim pad/rep/sep and tokens with texts such as `<|im_end|>`,
//! `<end_of_turn>`, `<|endoftext|>`, `</s>`).
//!
//! eot/eom/fim tokens found by text are, as in llama.cpp, the first match in the iteration
//! order of its `std::unordered_map` of token texts, reproduced for GNU libstdc++ (64-bit) by
//! `libstdcxx` (Qwen2.5's eot is `<|im_end|>` 151645, not `<|endoftext|>` 151643).
//!
//! Differences from llama.cpp, all in cases llama.cpp leaves to chance or crashes on:
//! special tokens of equal length keep id
//! order (llama.cpp uses an unstable sort); a byte with no byte token becomes the unknown
//! token (llama.cpp throws); per-model-name token attributes (phi-3 RSTRIP, `<mask>` LSTRIP)
//! are not applied, since `general.name` is not part of `tokenizer.json`.

mod bpe;
mod chat;
mod libstdcxx;
pub mod llama_tokenize;
mod pretok;
mod spm;
mod unicode;
mod unicode_data;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value as Json};
use thiserror::Error;

use pretok::Split;

/// `format` of `tokenizer.json`.
pub const FORMAT: &str = "lowbit-tokenizer";
/// The `format_version` this module reads.
pub const FORMAT_VERSION: u64 = 1;

/// Errors from reading a tokenizer or rendering a chat template.
#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A field is missing or malformed. `field` names it, e.g. `metadata ggml.merges`.
    #[error("tokenizer.json: {field}: {detail}")]
    Field { field: String, detail: String },
    #[error("tokenizer.json: metadata ggml.model: {}", unsupported_model(.0))]
    UnsupportedModel(String),
    #[error("tokenizer.json: metadata ggml.pre: {}", unsupported_pre(.0, "ggml.model"))]
    UnsupportedPre(String),
    #[error("tokenizer.json has no chat template (metadata chat_template)")]
    NoChatTemplate,
    #[error("chat template: {0}")]
    Template(String),
    /// A GGUF file given as a model could not be read.
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    /// A GGUF file given as a model has a tokenizer key missing or malformed, or names a
    /// tokenizer model or pre-tokenizer lowbit does not implement: `key` is the GGUF key
    /// (`tokenizer.ggml.model`), not its name in a bundle's tokenizer.json.
    #[error("{}: metadata {key}: {detail}", path.display())]
    GgufField {
        path: PathBuf,
        key: String,
        detail: String,
    },
}

/// What [`TokenizerError::UnsupportedModel`] says of model `m` (a GGUF's error says the same).
pub(crate) fn unsupported_model(m: &str) -> String {
    format!("unsupported tokenizer model {m:?} (supported: \"gpt2\", \"llama\")")
}

/// What [`TokenizerError::UnsupportedPre`] says of pre-tokenizer `p`, the model key named as
/// `model_key` (`ggml.model` in a bundle's tokenizer.json, `tokenizer.ggml.model` in a GGUF).
pub(crate) fn unsupported_pre(p: &str, model_key: &str) -> String {
    format!("unsupported pre-tokenizer {p:?} for {model_key} \"gpt2\"")
}

fn field_err(field: &str, detail: impl Into<String>) -> TokenizerError {
    TokenizerError::Field {
        field: field.to_string(),
        detail: detail.into(),
    }
}

/// Token attributes, as llama.cpp's `llama_token_attr` bits.
pub mod attr {
    pub const UNDEFINED: u32 = 0;
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
}

/// The GGUF token type (`ggml.token_type`) as an attribute.
fn attr_of_type(t: i64) -> u32 {
    match t {
        1 => attr::NORMAL,
        2 => attr::UNKNOWN,
        3 => attr::CONTROL,
        4 => attr::USER_DEFINED,
        5 => attr::UNUSED,
        6 => attr::BYTE,
        _ => attr::UNDEFINED,
    }
}

/// Which algorithm the tokenizer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerKind {
    /// `ggml.model == "gpt2"`: byte-level BPE.
    Bpe,
    /// `ggml.model == "llama"`: SentencePiece-style merging by score.
    Spm,
}

/// A pre-tokenizer configuration: llama.cpp's settings for one `ggml.pre` value.
#[derive(Clone, Copy, Debug)]
struct PreConfig {
    splits: &'static [Split],
    clean_spaces: bool,
    ignore_merges: bool,
    add_bos: bool,
    no_bos_token: bool,
}

const SPLITS_GPT2: &[Split] = &[Split::Gpt2];
const SPLITS_DIGIT_GPT2: &[Split] = &[Split::Digit, Split::Gpt2];
const SPLITS_LLAMA3: &[Split] = &[Split::Llama3];
const SPLITS_QWEN2: &[Split] = &[Split::Qwen2];

/// The `ggml.pre` values this module supports for `ggml.model == "gpt2"`: those whose
/// llama.cpp regexes all have hand-written implementations there. Others are
/// [`TokenizerError::UnsupportedPre`].
#[rustfmt::skip]
pub const PRE_TOKENIZERS: &[&str] = &[
    "smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2",
    "gpt-2", "phi-2", "gigachat", "a.x-4.0", "mellum", "modern-bert", "mpt", "olmo", "jais",
    "trillion", "granite-docling", "exaone4", "llama3", "llama-v3", "llama-bpe", "falcon3",
    "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano", "dbrx", "smaug-bpe", "chatglm-bpe",
    "glm4", "glm5", "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "hunyuan",
    "solar-open", "megrez", "grok-2",
];

/// llama.cpp `llama_vocab::impl::load` for a BPE `tokenizer_pre`.
fn pre_config(pre: &str) -> Option<PreConfig> {
    let c = |splits, clean_spaces| PreConfig {
        splits,
        clean_spaces,
        ignore_merges: false,
        add_bos: false,
        no_bos_token: false,
    };
    Some(match pre {
        "smollm" | "command-r" => c(SPLITS_DIGIT_GPT2, false),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            c(SPLITS_DIGIT_GPT2, true)
        }
        "gpt-2" | "phi-2" | "gigachat" | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" | "olmo"
        | "jais" | "exaone4" => c(SPLITS_GPT2, true),
        "trillion" | "granite-docling" => c(SPLITS_GPT2, false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => PreConfig {
            ignore_merges: true,
            add_bos: true,
            ..c(SPLITS_LLAMA3, true)
        },
        "dbrx" | "smaug-bpe" => c(SPLITS_LLAMA3, true),
        "chatglm-bpe" => PreConfig {
            no_bos_token: true,
            ..c(SPLITS_LLAMA3, true)
        },
        "glm4" | "glm5" => PreConfig {
            no_bos_token: true,
            ignore_merges: true,
            ..c(SPLITS_LLAMA3, true)
        },
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open"
        | "grok-2" => c(SPLITS_QWEN2, false),
        "stablelm2" | "megrez" => c(SPLITS_QWEN2, true),
        _ => return None,
    })
}

/// Texts llama.cpp recognises as end-of-generation tokens (`special_eog_ids`).
#[rustfmt::skip]
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
];
#[rustfmt::skip]
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
#[rustfmt::skip]
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>",
];
#[rustfmt::skip]
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
    "<|code_suffix|>", "<|suffix|>",
];
#[rustfmt::skip]
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
    "<|code_middle|>", "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
#[rustfmt::skip]
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

#[derive(Clone, Debug)]
struct TokenData {
    text: Vec<u8>,
    score: f32,
    attr: u32,
}

/// Special token ids (`None`: the vocabulary has none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

enum Algo {
    Bpe { pre: PreConfig, ranks: bpe::Ranks },
    Spm,
}

/// A tokenizer built from `tokenizer.json`. Immutable and `Sync`: share it freely.
pub struct Tokenizer {
    model: String,
    pre: String,
    algo: Algo,
    tokens: Vec<TokenData>,
    token_to_id: HashMap<Vec<u8>, u32>,
    special: SpecialTokens,
    eog: BTreeSet<u32>,
    /// CONTROL / USER_DEFINED / UNKNOWN ids, longest text first.
    special_cache: Vec<u32>,
    /// `token_to_piece(id, special = true)` of every token.
    pieces: Vec<Vec<u8>>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    chat_template: Option<String>,
    /// Why the file's chat template cannot be used (not UTF-8), where it has one.
    chat_template_error: Option<String>,
    byte_chars: [char; 256],
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.model)
            .field("pre", &self.pre)
            .field("n_vocab", &self.tokens.len())
            .field("special", &self.special)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .finish_non_exhaustive()
    }
}

// ------------------------------------------------------------------ JSON helpers

/// A metadata string: a JSON string or `{"hex": "..."}` (non-UTF-8 bytes).
fn json_bytes(v: &Json) -> Option<Vec<u8>> {
    match v {
        Json::String(s) => Some(s.as_bytes().to_vec()),
        Json::Object(o) if o.len() == 1 => o.get("hex")?.as_str().and_then(|h| hex::decode(h).ok()),
        _ => None,
    }
}

/// A metadata float: a JSON number or `"NaN"`, `"inf"`, `"-inf"`.
fn json_f32(v: &Json) -> Option<f32> {
    match v {
        Json::Number(n) => n.as_f64().map(|x| x as f32),
        Json::String(s) => match s.as_str() {
            "NaN" => Some(f32::NAN),
            "inf" => Some(f32::INFINITY),
            "-inf" => Some(f32::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

struct Meta<'a>(&'a Map<String, Json>);

impl<'a> Meta<'a> {
    fn field(key: &str) -> String {
        format!("metadata {key}")
    }
    fn get(&self, key: &str) -> Option<&'a Json> {
        self.0.get(key)
    }
    fn string(&self, key: &str) -> Result<Option<String>, TokenizerError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_str() {
                Some(s) => Ok(Some(s.to_string())),
                None => Err(field_err(
                    &Self::field(key),
                    format!("expected a string, found {}", kind(v)),
                )),
            },
        }
    }
    fn bool(&self, key: &str) -> Result<Option<bool>, TokenizerError> {
        match self.get(key) {
            None => Ok(None),
            Some(Json::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(field_err(
                &Self::field(key),
                format!("expected a boolean, found {}", kind(v)),
            )),
        }
    }
    fn u32(&self, key: &str) -> Result<Option<u32>, TokenizerError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|x| u32::try_from(x).ok()) {
                Some(x) => Ok(Some(x)),
                None => Err(field_err(
                    &Self::field(key),
                    format!(
                        "expected an unsigned 32-bit integer, found {}",
                        kind_value(v)
                    ),
                )),
            },
        }
    }
    fn array(&self, key: &str) -> Result<Option<&'a Vec<Json>>, TokenizerError> {
        match self.get(key) {
            None => Ok(None),
            Some(Json::Array(a)) => Ok(Some(a)),
            Some(v) => Err(field_err(
                &Self::field(key),
                format!("expected an array, found {}", kind(v)),
            )),
        }
    }
}

/// What kind of JSON value `v` is, for messages ("a string", "an array", ...).
pub fn kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

fn kind_value(v: &Json) -> String {
    match v {
        Json::Number(n) => n.to_string(),
        other => kind(other).to_string(),
    }
}

// ------------------------------------------------------------------ loading

impl Tokenizer {
    /// Reads `<dir>/tokenizer.json` of a bundle.
    pub fn from_bundle_dir(dir: &Path) -> Result<Tokenizer, TokenizerError> {
        Self::from_file(&dir.join(crate::bundle::manifest::TOKENIZER_FILE))
    }

    /// [`Tokenizer::from_bundle_dir`] for a model of `n_vocab` logits: the token count must
    /// equal it (as llama.cpp requires of the vocabulary and the embedding's rows), so every
    /// id the tokenizer makes has a logit and every logit a token.
    pub fn for_model(dir: &Path, n_vocab: usize) -> Result<Tokenizer, TokenizerError> {
        let t = Self::from_bundle_dir(dir)?;
        if t.n_vocab() != n_vocab {
            return Err(field_err(
                "metadata ggml.tokens",
                format!(
                    "{} tokens, but the model's n_vocab is {n_vocab}",
                    t.n_vocab()
                ),
            ));
        }
        Ok(t)
    }

    /// Reads a `tokenizer.json` file.
    pub fn from_file(path: &Path) -> Result<Tokenizer, TokenizerError> {
        let bytes = crate::util::read_input(path).map_err(|source| TokenizerError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let v: Json = serde_json::from_slice(&bytes).map_err(|source| TokenizerError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&v)
    }

    /// Builds the tokenizer from parsed `tokenizer.json`
    /// (`{"format": "lowbit-tokenizer", "format_version": 1, "metadata": {...}}`).
    pub fn from_json(v: &Json) -> Result<Tokenizer, TokenizerError> {
        let root = v
            .as_object()
            .ok_or_else(|| field_err("(root)", format!("expected an object, found {}", kind(v))))?;
        match root.get("format").and_then(Json::as_str) {
            Some(FORMAT) => {}
            other => {
                return Err(field_err(
                    "format",
                    format!("expected {FORMAT:?}, found {other:?}"),
                ))
            }
        }
        match root.get("format_version").and_then(Json::as_u64) {
            Some(FORMAT_VERSION) => {}
            _ => {
                return Err(field_err(
                    "format_version",
                    format!(
                        "expected {FORMAT_VERSION}, found {}",
                        root.get("format_version")
                            .map_or("nothing".to_string(), kind_value)
                    ),
                ))
            }
        }
        let meta = match root.get("metadata") {
            Some(Json::Object(m)) => Meta(m),
            Some(other) => {
                return Err(field_err(
                    "metadata",
                    format!("expected an object, found {}", kind(other)),
                ))
            }
            None => return Err(field_err("metadata", "missing")),
        };
        Self::from_metadata(&meta)
    }

    fn from_metadata(meta: &Meta<'_>) -> Result<Tokenizer, TokenizerError> {
        let model = meta
            .string("ggml.model")?
            .ok_or_else(|| field_err("metadata ggml.model", "missing"))?;
        let pre = meta.string("ggml.pre")?.unwrap_or_default();
        let algo_kind = match model.as_str() {
            "gpt2" => TokenizerKind::Bpe,
            "llama" => TokenizerKind::Spm,
            _ => return Err(TokenizerError::UnsupportedModel(model)),
        };
        let pre_cfg = match algo_kind {
            TokenizerKind::Bpe => {
                Some(pre_config(&pre).ok_or_else(|| TokenizerError::UnsupportedPre(pre.clone()))?)
            }
            TokenizerKind::Spm => None,
        };

        // Tokens, scores, types.
        let list = meta
            .array("ggml.tokens")?
            .ok_or_else(|| field_err("metadata ggml.tokens", "missing"))?;
        let n = list.len();
        if n == 0 {
            return Err(field_err("metadata ggml.tokens", "is empty"));
        }
        if n > i32::MAX as usize {
            return Err(field_err(
                "metadata ggml.tokens",
                format!("{n} tokens is too many"),
            ));
        }
        let scores = match meta.array("ggml.scores")? {
            None => None,
            Some(s) if s.len() < n => {
                return Err(field_err(
                    "metadata ggml.scores",
                    format!("has {} entries for {n} tokens", s.len()),
                ))
            }
            Some(s) => Some(s),
        };
        let types = match meta.array("ggml.token_type")? {
            None => None,
            Some(t) if t.len() < n => {
                return Err(field_err(
                    "metadata ggml.token_type",
                    format!("has {} entries for {n} tokens", t.len()),
                ))
            }
            Some(t) => Some(t),
        };
        let mut tokens = Vec::with_capacity(n);
        let mut token_to_id = HashMap::with_capacity(n);
        for (i, t) in list.iter().enumerate() {
            let mut text = json_bytes(t).ok_or_else(|| {
                field_err(
                    "metadata ggml.tokens",
                    format!(
                        "entry {i}: expected a string or {{\"hex\": ...}}, found {}",
                        kind(t)
                    ),
                )
            })?;
            if text.is_empty() {
                text = format!("[EMPTY_{i}]").into_bytes();
            }
            let score = match scores {
                None => 0.0,
                Some(s) => json_f32(&s[i]).ok_or_else(|| {
                    field_err(
                        "metadata ggml.scores",
                        format!("entry {i}: expected a number, found {}", kind(&s[i])),
                    )
                })?,
            };
            let attr = match types {
                None => attr::NORMAL,
                Some(t) => attr_of_type(
                    t[i].as_i64()
                        .filter(|x| i32::try_from(*x).is_ok())
                        .ok_or_else(|| {
                            field_err(
                                "metadata ggml.token_type",
                                format!(
                                    "entry {i}: expected a 32-bit integer, found {}",
                                    kind_value(&t[i])
                                ),
                            )
                        })?,
                ),
            };
            token_to_id.insert(text.clone(), i as u32);
            tokens.push(TokenData { text, score, attr });
        }

        // Merges.
        let algo = match pre_cfg {
            Some(pre) => {
                let merges = meta
                    .array("ggml.merges")?
                    .ok_or_else(|| field_err("metadata ggml.merges", "missing"))?;
                let mut ranks = bpe::Ranks::default();
                for (i, m) in merges.iter().enumerate() {
                    let word = json_bytes(m).ok_or_else(|| {
                        field_err(
                            "metadata ggml.merges",
                            format!("entry {i}: expected a string, found {}", kind(m)),
                        )
                    })?;
                    // llama.cpp: word.find(' ', 1)
                    let pos = word
                        .iter()
                        .skip(1)
                        .position(|&b| b == b' ')
                        .map(|p| p + 1)
                        .ok_or_else(|| {
                            field_err("metadata ggml.merges", format!("entry {i} has no space"))
                        })?;
                    ranks.insert(&word[..pos], &word[pos + 1..], i as u32);
                }
                Algo::Bpe { pre, ranks }
            }
            None => Algo::Spm,
        };

        // Special ids: model defaults, dropped when out of range, then the metadata.
        let mut sp = match algo_kind {
            TokenizerKind::Spm => SpecialTokens {
                bos: Some(1),
                eos: Some(2),
                unk: Some(0),
                ..Default::default()
            },
            TokenizerKind::Bpe => SpecialTokens {
                bos: if pre_cfg.is_some_and(|p| p.no_bos_token) {
                    None
                } else {
                    Some(11)
                },
                eos: Some(11),
                ..Default::default()
            },
        };
        {
            let keys: [(&str, &mut Option<u32>); 14] = [
                ("ggml.bos_token_id", &mut sp.bos),
                ("ggml.eos_token_id", &mut sp.eos),
                ("ggml.eot_token_id", &mut sp.eot),
                ("ggml.eom_token_id", &mut sp.eom),
                ("ggml.unknown_token_id", &mut sp.unk),
                ("ggml.seperator_token_id", &mut sp.sep),
                ("ggml.padding_token_id", &mut sp.pad),
                ("ggml.mask_token_id", &mut sp.mask),
                ("ggml.fim_pre_token_id", &mut sp.fim_pre),
                ("ggml.fim_suf_token_id", &mut sp.fim_suf),
                ("ggml.fim_mid_token_id", &mut sp.fim_mid),
                ("ggml.fim_pad_token_id", &mut sp.fim_pad),
                ("ggml.fim_rep_token_id", &mut sp.fim_rep),
                ("ggml.fim_sep_token_id", &mut sp.fim_sep),
            ];
            for (key, slot) in keys {
                set_special(meta, key, slot, n)?;
            }
            // deprecated keys, read after the fim ones as llama.cpp does
            set_special(meta, "ggml.prefix_token_id", &mut sp.fim_pre, n)?;
            set_special(meta, "ggml.suffix_token_id", &mut sp.fim_suf, n)?;
            set_special(meta, "ggml.middle_token_id", &mut sp.fim_mid, n)?;
        }

        let (mut add_bos, mut add_eos, mut add_space_prefix, clean_spaces) = match pre_cfg {
            Some(p) => (p.add_bos, false, false, p.clean_spaces),
            None => (true, false, true, false),
        };
        if let Some(b) = meta.bool("ggml.add_space_prefix")? {
            add_space_prefix = b;
        }
        if let Some(b) = meta.bool("ggml.add_bos_token")? {
            add_bos = b;
        }
        if let Some(b) = meta.bool("ggml.add_eos_token")? {
            add_eos = b;
        }

        // A template that is not UTF-8 (a GGUF string of other bytes; the bundle keeps it as
        // `{"hex": ..}`) cannot be rendered, but the model still runs without --chat: kept as
        // the error `apply_chat_template` gives.
        let (chat_template, chat_template_error) = match meta.get("chat_template") {
            Some(v @ Json::Object(_)) => match json_bytes(v) {
                Some(b) => match String::from_utf8(b) {
                    Ok(t) => (Some(t), None),
                    Err(e) => (
                        None,
                        Some(format!(
                            "not valid UTF-8 (byte {} of {}): it cannot be rendered",
                            e.utf8_error().valid_up_to(),
                            e.as_bytes().len()
                        )),
                    ),
                },
                None => (None, Some(format!("expected a string, found {}", kind(v)))),
            },
            _ => (meta.string("chat_template")?, None),
        };

        let mut tok = Tokenizer {
            model,
            pre,
            algo,
            tokens,
            token_to_id,
            special: sp,
            eog: BTreeSet::new(),
            special_cache: Vec::new(),
            pieces: Vec::new(),
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
            chat_template,
            chat_template_error,
            byte_chars: unicode::byte_to_char_table(),
        };
        tok.detect_special_tokens();
        tok.build_caches();
        Ok(tok)
    }

    /// Ids in `token_to_id`, ascending (the ids llama.cpp's `for (t : token_to_id)` visits).
    fn mapped_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.token_to_id.values().copied().collect();
        ids.sort_unstable();
        ids
    }

    fn id_of(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text.as_bytes()).copied()
    }

    /// llama.cpp's text-based detection of eot/eom/fim tokens, unused tokens and the
    /// end-of-generation set, with the attribute changes it makes on the way.
    fn detect_special_tokens(&mut self) {
        let ids = self.mapped_ids();
        // llama.cpp takes the first match in its token_to_id map's iteration order (see
        // libstdcxx); beyond what that emulation covers, the lowest id.
        let texts: Vec<&[u8]> = self.tokens.iter().map(|t| t.text.as_slice()).collect();
        let map_order = libstdcxx::iteration_order(&texts)
            .map(|o| {
                // the map holds the last id of a repeated text
                o.into_iter()
                    .map(|i| self.token_to_id[texts[i as usize]])
                    .collect::<Vec<u32>>()
            })
            .unwrap_or_else(|| ids.clone());
        let find = |tok: &Tokenizer, texts: &[&str]| -> Option<u32> {
            map_order.iter().copied().find(|&id| {
                texts
                    .iter()
                    .any(|t| tok.tokens[id as usize].text == t.as_bytes())
            })
        };
        let mut sp = self.special;
        for (slot, texts) in [
            (&mut sp.eot, EOT_TEXTS),
            (&mut sp.eom, EOM_TEXTS),
            (&mut sp.fim_pre, FIM_PRE_TEXTS),
            (&mut sp.fim_suf, FIM_SUF_TEXTS),
            (&mut sp.fim_mid, FIM_MID_TEXTS),
            (&mut sp.fim_pad, FIM_PAD_TEXTS),
            (&mut sp.fim_rep, FIM_REP_TEXTS),
            (&mut sp.fim_sep, FIM_SEP_TEXTS),
        ] {
            if slot.is_none() {
                if let Some(id) = find(self, texts) {
                    *slot = Some(id);
                    self.tokens[id as usize].attr |= attr::CONTROL;
                }
            }
        }
        self.special = sp;

        // unused: control tokens whose text contains "unused"
        for &id in &ids {
            let t = &mut self.tokens[id as usize];
            if t.attr & attr::CONTROL != 0 && t.text.windows(6).any(|w| w == b"unused") {
                t.attr |= attr::UNUSED;
            }
        }

        let mut eog = BTreeSet::new();
        eog.extend(sp.fim_pad);
        eog.extend(sp.fim_rep);
        eog.extend(sp.fim_sep);
        for &id in &ids {
            let t = &mut self.tokens[id as usize];
            if EOG_TEXTS.iter().any(|e| t.text == e.as_bytes()) {
                eog.insert(id);
                t.attr |= attr::CONTROL;
            }
        }
        // gpt-oss: always render these tokens
        for &id in &ids {
            let t = &mut self.tokens[id as usize];
            if [
                &b"<|channel|>"[..],
                b"<|message|>",
                b"<|start|>",
                b"<|constrain|>",
            ]
            .contains(&t.text.as_slice())
            {
                t.attr = attr::USER_DEFINED;
            }
        }
        eog.extend(sp.eos);
        eog.extend(sp.eot);
        eog.extend(sp.eom);

        // o200k_harmony / solar-open: "<|end|>" is not end-of-generation there.
        let has = |tokens: &[TokenData], eog: &BTreeSet<u32>, text: &str| {
            eog.iter()
                .any(|&i| tokens[i as usize].text == text.as_bytes())
        };
        let end_id = eog
            .iter()
            .copied()
            .find(|&i| self.tokens[i as usize].text == b"<|end|>");
        if let Some(end_id) = end_id {
            let t = &self.tokens;
            let call = has(t, &eog, "<|call|>") || has(t, &eog, "<|calls|>");
            if call && (has(t, &eog, "<|return|>") || has(t, &eog, "<|flush|>")) {
                eog.remove(&end_id);
                self.tokens[end_id as usize].attr = attr::USER_DEFINED;
            }
        }
        // gemma4 / plamo: "</s>" is a normal token there.
        let s_id = eog
            .iter()
            .copied()
            .find(|&i| self.tokens[i as usize].text == b"</s>");
        if let Some(s_id) = s_id {
            let t = &self.tokens;
            if has(t, &eog, "<|tool_response>") || has(t, &eog, "<|plamo:eos|>") {
                eog.remove(&s_id);
                self.tokens[s_id as usize].attr = attr::NORMAL;
            }
        }
        self.eog = eog;
    }

    fn build_caches(&mut self) {
        let mut cache: Vec<u32> = (0..self.tokens.len() as u32)
            .filter(|&id| {
                self.tokens[id as usize].attr & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN)
                    != 0
            })
            .collect();
        cache.sort_by(|&a, &b| {
            self.tokens[b as usize]
                .text
                .len()
                .cmp(&self.tokens[a as usize].text.len())
        });
        self.special_cache = cache;
        let inv = unicode::char_to_byte_table();
        self.pieces = (0..self.tokens.len())
            .map(|id| self.make_piece(id, &inv))
            .collect();
    }

    /// llama.cpp `token_to_piece(id, special = true)` without the cache.
    fn make_piece(&self, id: usize, inv: &[Option<u8>; 512]) -> Vec<u8> {
        let t = &self.tokens[id];
        if t.attr & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            return t.text.clone();
        }
        if t.attr & attr::NORMAL != 0 {
            return match self.algo {
                Algo::Spm => replace_all(&t.text, "\u{2581}".as_bytes(), b" "),
                Algo::Bpe { .. } => decode_byte_level(&t.text, inv),
            };
        }
        if t.attr & attr::BYTE != 0 {
            return vec![byte_token_value(&t.text)];
        }
        Vec::new()
    }

    // -------------------------------------------------------------- accessors

    /// Which algorithm runs.
    pub fn kind(&self) -> TokenizerKind {
        match self.algo {
            Algo::Bpe { .. } => TokenizerKind::Bpe,
            Algo::Spm => TokenizerKind::Spm,
        }
    }
    /// `ggml.model`.
    pub fn model(&self) -> &str {
        &self.model
    }
    /// `ggml.pre` (empty when absent).
    pub fn pre(&self) -> &str {
        &self.pre
    }
    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }
    /// Number of BPE merges (0 for SentencePiece).
    pub fn n_merges(&self) -> usize {
        match &self.algo {
            Algo::Bpe { ranks, .. } => ranks.len(),
            Algo::Spm => 0,
        }
    }
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }
    pub fn bos(&self) -> Option<u32> {
        self.special.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.special.eos
    }
    pub fn eot(&self) -> Option<u32> {
        self.special.eot
    }
    pub fn unk(&self) -> Option<u32> {
        self.special.unk
    }
    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }
    /// Whether generating `id` ends generation (llama.cpp `llama_vocab_is_eog`).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }
    /// The end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.eog.iter().copied()
    }
    /// The ids split out of text before tokenizing (CONTROL, USER_DEFINED, UNKNOWN).
    pub fn special_token_ids(&self) -> &[u32] {
        &self.special_cache
    }
    /// A token's text as stored (`None`: out of range).
    pub fn token_text(&self, id: u32) -> Option<&[u8]> {
        self.tokens.get(id as usize).map(|t| t.text.as_slice())
    }
    /// A token's score (`ggml.scores`, 0 when absent).
    pub fn token_score(&self, id: u32) -> Option<f32> {
        self.tokens.get(id as usize).map(|t| t.score)
    }
    /// A token's [`attr`] bits after llama.cpp's adjustments.
    pub fn token_attr(&self, id: u32) -> Option<u32> {
        self.tokens.get(id as usize).map(|t| t.attr)
    }
    /// The id of the token whose stored text is `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.id_of(text)
    }
    /// `chat_template`, when the GGUF had one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    // -------------------------------------------------------------- encoding

    /// Token ids of `text`, as llama.cpp's `llama_tokenize(text, add_special, parse_special)`.
    ///
    /// `add_special` adds BOS / EOS where the tokenizer does ([`Tokenizer::add_bos`],
    /// [`Tokenizer::add_eos`]). `parse_special` lets CONTROL and UNKNOWN token texts in
    /// `text` (e.g. `<|im_start|>`) become those tokens; USER_DEFINED tokens are always
    /// split out. Never fails: bytes no token covers become byte tokens, or are dropped when
    /// the vocabulary has none.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let frags = self.partition(text.as_bytes(), parse_special);
        let mut out = Vec::new();
        match &self.algo {
            Algo::Spm => {
                if add_special && self.add_bos {
                    out.extend(self.special.bos);
                }
                let mut is_prev_special = true;
                let space = "\u{2581}".as_bytes();
                let mut buf = Vec::new();
                for f in frags {
                    match f {
                        Frag::Text(t) => {
                            buf.clear();
                            if self.add_space_prefix && is_prev_special {
                                buf.extend_from_slice(space);
                            }
                            for &b in t {
                                if b == b' ' {
                                    buf.extend_from_slice(space);
                                } else {
                                    buf.push(b);
                                }
                            }
                            let lookup = |piece: &[u8]| {
                                self.token_to_id
                                    .get(piece)
                                    .map(|&id| (id, self.tokens[id as usize].score))
                            };
                            let byte = |b: u8| self.spm_byte_token(b);
                            spm::tokenize(&buf, &lookup, &byte, &mut out);
                            is_prev_special = false;
                        }
                        Frag::Token(id) => {
                            out.push(id);
                            is_prev_special = true;
                        }
                    }
                }
                if add_special && self.add_eos {
                    out.extend(self.special.eos);
                }
            }
            Algo::Bpe { pre, ranks } => {
                if add_special && self.add_bos {
                    out.extend(self.special.bos);
                }
                for f in frags {
                    match f {
                        Frag::Text(t) => {
                            self.bpe_text(&String::from_utf8_lossy(t), pre, ranks, &mut out)
                        }
                        Frag::Token(id) => out.push(id),
                    }
                }
                if add_special && self.add_eos {
                    out.extend(self.special.eos);
                }
            }
        }
        out
    }

    /// llama.cpp `byte_to_token` for SPM: `<0xXX>`, else the byte itself as a token; else
    /// (llama.cpp throws) the unknown token.
    fn spm_byte_token(&self, b: u8) -> Option<u32> {
        let hex = format!("<0x{b:02X}>");
        self.token_to_id
            .get(hex.as_bytes())
            .or_else(|| self.token_to_id.get(&[b][..]))
            .copied()
            .or(self.special.unk)
    }

    fn bpe_text(&self, text: &str, pre: &PreConfig, ranks: &bpe::Ranks, out: &mut Vec<u32>) {
        let mut word = String::new();
        let mut spans = Vec::new();
        for w in pretok::split(text, pre.splits) {
            word.clear();
            word.extend(w.bytes().map(|b| self.byte_chars[b as usize]));
            let bytes = word.as_bytes();
            let whole = pre.ignore_merges && self.token_to_id.contains_key(bytes);
            spans.clear();
            bpe::merge_word(bytes, ranks, whole, &mut spans);
            for &(s, e) in &spans {
                match self.token_to_id.get(&bytes[s..e]) {
                    Some(&id) => out.push(id),
                    None => {
                        // llama.cpp looks each byte of the (encoded) symbol up as a
                        // one-byte token
                        for &b in &bytes[s..e] {
                            if let Some(&id) = self.token_to_id.get(&[b][..]) {
                                out.push(id);
                            }
                        }
                    }
                }
            }
        }
    }

    /// llama.cpp `tokenizer_st_partition`: splits special token texts out of `text`, for
    /// each special token longest first, every occurrence left to right.
    fn partition<'t>(&self, text: &'t [u8], parse_special: bool) -> Vec<Frag<'t>> {
        let mut frags = if text.is_empty() {
            Vec::new()
        } else {
            vec![Frag::Text(text)]
        };
        for &id in &self.special_cache {
            let t = &self.tokens[id as usize];
            if !parse_special && t.attr & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            if !frags
                .iter()
                .any(|f| matches!(f, Frag::Text(s) if s.len() >= t.text.len()))
            {
                continue;
            }
            let finder = memchr::memmem::Finder::new(&t.text);
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Frag::Text(mut rest) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(m) = finder.find(rest) {
                    if m > 0 {
                        next.push(Frag::Text(&rest[..m]));
                    }
                    next.push(Frag::Token(id));
                    rest = &rest[m + t.text.len()..];
                }
                if !rest.is_empty() {
                    next.push(Frag::Text(rest));
                }
            }
            frags = next;
        }
        frags
    }

    // -------------------------------------------------------------- decoding

    /// A token's bytes for output: llama.cpp `token_to_piece(id, special = false)`. CONTROL
    /// and UNKNOWN tokens give nothing; SentencePiece `▁` becomes a space and `<0xXX>` its
    /// byte; byte-level BPE tokens map back to their bytes. A piece may be part of a UTF-8
    /// sequence: join pieces (e.g. with [`Utf8Stream`]) before printing. Out of range: empty.
    pub fn token_to_bytes(&self, id: u32) -> Vec<u8> {
        self.token_to_piece(id, false).to_vec()
    }

    /// llama.cpp `token_to_piece(id, special)`: as [`Tokenizer::token_to_bytes`], with
    /// `special` rendering CONTROL / UNKNOWN tokens as their text.
    pub fn token_to_piece(&self, id: u32, special: bool) -> &[u8] {
        let Some(t) = self.tokens.get(id as usize) else {
            return &[];
        };
        if !special && t.attr & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return &[];
        }
        &self.pieces[id as usize]
    }

    /// llama.cpp `llama_detokenize(ids, remove_special, unparse_special)`: the pieces joined;
    /// with `add_space_prefix` the first piece loses one leading space; `remove_special`
    /// drops a leading BOS / trailing EOS that the tokenizer adds; `unparse_special` renders
    /// CONTROL tokens; some BPE pre-tokenizers clean spaces before punctuation.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        let mut ids = ids;
        let mut remove_space = self.add_space_prefix;
        if remove_special
            && self.add_bos
            && ids.first().is_some_and(|&i| Some(i) == self.special.bos)
        {
            remove_space = false;
            ids = &ids[1..];
        }
        if remove_special
            && self.add_eos
            && ids.last().is_some_and(|&i| Some(i) == self.special.eos)
        {
            ids = &ids[..ids.len() - 1];
        }
        let mut text = Vec::new();
        for &id in ids {
            let mut piece = self.token_to_piece(id, unparse_special);
            if remove_space {
                if let Some(rest) = piece.strip_prefix(b" ") {
                    piece = rest;
                }
            }
            remove_space = false;
            text.extend_from_slice(piece);
        }
        if self.clean_spaces {
            clean_spaces(&mut text);
        }
        text
    }

    /// The text of `ids` (invalid UTF-8 replaced): `detokenize(ids, false, false)`, as
    /// llama.cpp's `common_detokenize(.., special = false)`.
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.detokenize(ids, false, false)).into_owned()
    }

    // -------------------------------------------------------------- chat

    /// Renders the GGUF's `chat_template` (Jinja, with minijinja) for `messages`
    /// (`(role, content)` pairs), as llama.cpp's `common_chat_templates_apply` with jinja:
    /// variables `messages` (`[{role, content}]`), `add_generation_prompt`, `bos_token`,
    /// `eos_token` (the token texts), `enable_thinking` (true); functions
    /// `raise_exception(msg)` and `strftime_now(format)` (UTC); `trim_blocks` and
    /// `lstrip_blocks` on; Python string methods (`.strip()`, ...). As llama.cpp, a leading
    /// BOS text is removed when the tokenizer adds BOS itself (and a trailing EOS text when it
    /// adds EOS), so `encode(result, true, true)` has exactly one.
    ///
    /// Errors: [`TokenizerError::NoChatTemplate`], or [`TokenizerError::Template`] for a
    /// template that does not compile or render (including `raise_exception`).
    /// Whether the tokenizer carries a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// Uses `template` when the model file carries none (an architecture's own turn format).
    pub fn set_fallback_chat_template(&mut self, template: &str) {
        if self.chat_template.is_none() && self.chat_template_error.is_none() {
            self.chat_template = Some(template.to_string());
        }
    }

    pub fn apply_chat_template<R: AsRef<str>, C: AsRef<str>>(
        &self,
        messages: &[(R, C)],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        if let Some(e) = &self.chat_template_error {
            return Err(field_err("metadata chat_template", e.clone()));
        }
        let tmpl = self
            .chat_template
            .as_deref()
            .ok_or(TokenizerError::NoChatTemplate)?;
        let text = |id: Option<u32>| {
            id.map(|i| String::from_utf8_lossy(self.token_to_piece(i, true)).into_owned())
                .unwrap_or_default()
        };
        let (bos, eos) = (text(self.special.bos), text(self.special.eos));
        let msgs: Vec<(&str, &str)> = messages
            .iter()
            .map(|(r, c)| (r.as_ref(), c.as_ref()))
            .collect();
        let mut out = chat::render(tmpl, &msgs, add_generation_prompt, &bos, &eos)?;
        if self.add_bos && !bos.is_empty() && out.starts_with(&bos) {
            out.drain(..bos.len());
        }
        if self.add_eos && !eos.is_empty() && out.ends_with(&eos) {
            out.truncate(out.len() - eos.len());
        }
        // A template that renders nothing of non-empty messages (an empty template, or one
        // of only the BOS the tokenizer adds anyway) would send the model no prompt at all:
        // refused rather than run silently.
        if out.trim().is_empty() && msgs.iter().any(|(_, c)| !c.trim().is_empty()) {
            return Err(field_err(
                "metadata chat_template",
                "renders nothing for the messages (an empty template?): the prompt would be lost",
            ));
        }
        Ok(out)
    }
}

enum Frag<'t> {
    Text(&'t [u8]),
    Token(u32),
}

fn replace_all(s: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut rest = s;
    while let Some(p) = memchr::memmem::find(rest, from) {
        out.extend_from_slice(&rest[..p]);
        out.extend_from_slice(to);
        rest = &rest[p + from.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// llama.cpp `llama_decode_text`: each char of a byte-level token back to its byte; a char
/// outside the table becomes `[UNK_BYTE_0x<utf8 hex><token text>]` as there.
fn decode_byte_level(text: &[u8], inv: &[Option<u8>; 512]) -> Vec<u8> {
    let s = String::from_utf8_lossy(text);
    let mut out = Vec::with_capacity(text.len());
    for c in s.chars() {
        match inv.get(c as usize).copied().flatten() {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(b"[UNK_BYTE_0x");
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text);
                out.push(b']');
            }
        }
    }
    out
}

/// llama.cpp `token_to_byte`: `strtol(text.substr(3, 2), 16)` of a `<0xXX>` token.
fn byte_token_value(text: &[u8]) -> u8 {
    let digits = text.get(3..text.len().min(5)).unwrap_or(&[]);
    let mut v: u32 = 0;
    for &d in digits {
        match (d as char).to_digit(16) {
            Some(x) => v = v * 16 + x,
            None => break,
        }
    }
    v as u8
}

/// llama.cpp's `clean_spaces` passes of `detokenize`, ported literally (they compact the
/// text in place, and the second pass writes a NUL that the third pass then sees).
fn clean_spaces(text: &mut Vec<u8>) {
    // first pass: " ?", " !", " .", " ,"
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    // second pass: strip a single apostrophe between spaces
    let n = total;
    total = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    // third pass: " 's", " 'm", " 're", " 've"
    let n = total;
    total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = text[i + 1];
            if x1 == b't' || x1 == b'd' {
                // kept
            } else if x1 == b's' || x1 == b'm' {
                total -= 1;
            } else if i + 2 < n {
                let x2 = text[i + 2];
                if (x1 == b'r' || x1 == b'v') && x2 == b'e' {
                    total -= 1;
                }
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

/// Reads an optional special-token id key: a present, in-range value replaces the default;
/// an out-of-range default becomes `None` (llama.cpp warns and does the same).
fn set_special(
    meta: &Meta<'_>,
    key: &str,
    slot: &mut Option<u32>,
    n: usize,
) -> Result<(), TokenizerError> {
    if slot.is_some_and(|id| id as usize >= n) {
        *slot = None;
    }
    if let Some(id) = meta.u32(key)? {
        if (id as usize) < n {
            *slot = Some(id);
        }
    }
    Ok(())
}

/// Joins token pieces into text for streaming output: [`Utf8Stream::push`] returns the
/// complete UTF-8 characters so far and keeps an incomplete tail for the next piece;
/// invalid bytes become U+FFFD.
#[derive(Debug, Default, Clone)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `bytes`; returns the text that is complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // incomplete sequence at the end: keep it for the next push
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        Some(n) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + n);
                        }
                    }
                }
            }
        }
    }

    /// Ends the stream: whatever is left, lossily.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_pre_tokenizer_has_a_config() {
        for pre in PRE_TOKENIZERS {
            assert!(pre_config(pre).is_some(), "{pre}");
        }
        assert!(pre_config("default").is_none());
        assert!(pre_config("").is_none());
    }

    #[test]
    fn clean_spaces_as_llama_cpp() {
        let run = |s: &str| {
            let mut v = s.as_bytes().to_vec();
            clean_spaces(&mut v);
            String::from_utf8(v).unwrap()
        };
        assert_eq!(run("Hello , world ! ok ."), "Hello, world! ok.");
        assert_eq!(run("it ' s"), "it's");
        assert_eq!(run("he 's we 're I 'd"), "he's we're I 'd");
        assert_eq!(run(""), "");
    }

    #[test]
    fn byte_token_values() {
        assert_eq!(byte_token_value(b"<0x0A>"), 10);
        assert_eq!(byte_token_value(b"<0xFF>"), 255);
        assert_eq!(byte_token_value(b"<0x"), 0);
    }
}
