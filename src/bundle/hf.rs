//! Hugging Face checkpoints as `convert palettize` inputs: the model configuration from
//! `config.json`, tensor names mapped to the GGUF names the runtime uses, and the tokenizer
//! from `tokenizer.json` (byte-level BPE) or `tokenizer.model` (SentencePiece), all as llama.cpp's
//! `convert_hf_to_gguf.py` (build b11434: `conversion/llama.py`, `conversion/minicpm.py`,
//! `conversion/base.py`, gguf-py's `vocab.py`) maps them, so that a checkpoint and the GGUF
//! made from it give the same bundle weights.
//!
//! Architectures: those of [`crate::arch`] with Hugging Face names: `LlamaForCausalLM`
//! (`model_type` `llama`), `MiniCPMForCausalLM` (`minicpm`) and `Qwen2ForCausalLM` (`qwen2`,
//! `conversion/qwen.py`: Q/K/V biases, no row permutation since its RoPE pairs halves as
//! Hugging Face does).
//!
//! Tensors (`N` the layer):
//!
//! ```text
//! model.embed_tokens.weight                  token_embd.weight
//! model.norm.weight                          output_norm.weight
//! lm_head.weight                             output.weight (absent: tied embeddings)
//! model.layers.N.input_layernorm.weight      blk.N.attn_norm.weight
//! model.layers.N.post_attention_layernorm    blk.N.ffn_norm.weight
//! model.layers.N.self_attn.{q,k,v,o}_proj    blk.N.attn_{q,k,v,output}.weight
//! model.layers.N.self_attn.{q,k,v}_proj.bias blk.N.attn_{q,k,v}.bias (Qwen2)
//! model.layers.N.mlp.{gate,up,down}_proj     blk.N.ffn_{gate,up,down}.weight
//! config.json rope_scaling long/short_factor rope_factors_{long,short}.weight (F32, MiniCPM)
//! ```
//!
//! For architectures whose RoPE pairs adjacent dimensions (llama, minicpm), `q_proj` and
//! `k_proj` rows are permuted as `LlamaModel.permute` does (n_head heads for q, n_head_kv for
//! k): GGUF row `h*hd + 2i + p` is Hugging Face row `h*hd + p*hd/2 + i`, which turns the
//! Hugging Face "rotate half" RoPE layout into GGUF's adjacent pairs.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Map, Value as Json};

use super::config::DEFAULT_CONTEXT;
use super::manifest::{ModelConfig, RopeConfig, TokenizerRef, TOKENIZER_FILE};
use super::BundleError;

/// What a GGUF-named tensor is made from in the checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// The Hugging Face tensor of this name, rows in the same order.
    Tensor(String),
    /// The Hugging Face tensor of this name with its rows permuted for `heads` heads
    /// ([`permuted_row`]).
    Permuted { name: String, heads: usize },
}

/// The checkpoint's configuration, tokenizer and the tensors GGUF has that a Hugging Face
/// checkpoint keeps in `config.json`.
pub struct HfModel {
    pub model: ModelConfig,
    pub tokenizer: TokenizerRef,
    pub tokenizer_bytes: Vec<u8>,
    /// F32 vectors by GGUF name (LongRoPE factors).
    pub extra: Vec<(String, Vec<f32>)>,
    /// `q_proj` / `k_proj` head counts for the permutation.
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Whether `q_proj` / `k_proj` rows are permuted (RoPE on adjacent pairs).
    pub permute_qk: bool,
}

fn err(file: &Path, key: &str, detail: impl Into<String>) -> BundleError {
    BundleError::HfConfig {
        file: file.to_path_buf(),
        key: key.to_string(),
        detail: detail.into(),
    }
}

/// Row `r` of the GGUF-ordered `q`/`k` weight is row `permuted_row(r, rows, heads)` of the
/// Hugging Face one (`rows` divisible by `2 * heads`).
pub fn permuted_row(r: usize, rows: usize, heads: usize) -> usize {
    let hd = rows / heads;
    let (h, w) = (r / hd, r % hd);
    h * hd + (w % 2) * (hd / 2) + w / 2
}

/// The GGUF name of a Hugging Face tensor name and how it is read, or `None` for a name this
/// mapping does not know. `permute`: `q_proj`/`k_proj` weights are permuted (RoPE on adjacent
/// pairs), else read as they are.
pub fn gguf_name(
    hf: &str,
    n_head: usize,
    n_head_kv: usize,
    permute: bool,
) -> Option<(String, Source)> {
    let plain = |g: String| Some((g, Source::Tensor(hf.to_string())));
    match hf {
        "model.embed_tokens.weight" => return plain("token_embd.weight".into()),
        "model.norm.weight" => return plain("output_norm.weight".into()),
        "lm_head.weight" => return plain("output.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (n, tail) = rest.split_once('.')?;
    let layer: u64 = n.parse().ok()?;
    if let Some(p) = tail.strip_prefix("self_attn.") {
        let b = match p {
            "q_proj.bias" => Some("attn_q"),
            "k_proj.bias" => Some("attn_k"),
            "v_proj.bias" => Some("attn_v"),
            _ => None,
        };
        if let Some(b) = b {
            return plain(format!("blk.{layer}.{b}.bias"));
        }
    }
    let kind = match tail {
        "input_layernorm.weight" => "attn_norm",
        "post_attention_layernorm.weight" => "ffn_norm",
        "self_attn.q_proj.weight" => "attn_q",
        "self_attn.k_proj.weight" => "attn_k",
        "self_attn.v_proj.weight" => "attn_v",
        "self_attn.o_proj.weight" => "attn_output",
        "mlp.gate_proj.weight" => "ffn_gate",
        "mlp.up_proj.weight" => "ffn_up",
        "mlp.down_proj.weight" => "ffn_down",
        _ => return None,
    };
    let g = format!("blk.{layer}.{kind}.weight");
    if !permute {
        return plain(g);
    }
    let heads = match kind {
        "attn_q" => n_head,
        "attn_k" => n_head_kv,
        _ => return plain(g),
    };
    Some((
        g,
        Source::Permuted {
            name: hf.to_string(),
            heads,
        },
    ))
}

/// Whether `config.json` is a Hugging Face configuration (it names architectures or a
/// model type).
pub fn is_hf_config(cfg: &Json) -> bool {
    cfg.get("model_type").is_some() || cfg.get("architectures").is_some()
}

struct Cfg<'a> {
    v: &'a Map<String, Json>,
    path: &'a Path,
}

impl Cfg<'_> {
    fn u64(&self, key: &str) -> Result<u64, BundleError> {
        self.opt_u64(key)?
            .ok_or_else(|| err(self.path, key, "missing"))
    }
    fn opt_u64(&self, key: &str) -> Result<Option<u64>, BundleError> {
        match self.v.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(j) => j.as_u64().map(Some).ok_or_else(|| {
                err(
                    self.path,
                    key,
                    format!("expected an unsigned integer, found {j}"),
                )
            }),
        }
    }
    fn f64(&self, key: &str) -> Result<f64, BundleError> {
        self.opt_f64(key)?
            .ok_or_else(|| err(self.path, key, "missing"))
    }
    fn opt_f64(&self, key: &str) -> Result<Option<f64>, BundleError> {
        match self.v.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(j) => j
                .as_f64()
                .map(Some)
                .ok_or_else(|| err(self.path, key, format!("expected a number, found {j}"))),
        }
    }
}

/// GGUF stores these hyperparameters as f32: round as convert_hf_to_gguf's writer does.
fn f32r(x: f64) -> f64 {
    x as f32 as f64
}

/// `x` rounded to f32, refused (naming `key`) unless finite and, with `positive`, above 0.
fn hyper(path: &Path, key: &str, x: f64, positive: bool) -> Result<f64, BundleError> {
    let r = f32r(x);
    if !r.is_finite() || (positive && r <= 0.0) {
        return Err(err(
            path,
            key,
            format!(
                "{x:?} is not a {}finite f32 value",
                if positive { "positive " } else { "" }
            ),
        ));
    }
    Ok(r)
}

/// `MAX_VOCAB`: vocabulary sizes above this are refused (the largest real vocabularies are
/// about 2^18; this bounds what a config value can make the tokenizer allocate).
pub const MAX_VOCAB: u64 = 1 << 22;

/// Reads a Hugging Face checkpoint's configuration and tokenizer from `dir` (`config.json`
/// already parsed as `cfg`). `context` is the requested bundle context; `embedding` the
/// `[rows, cols]` of `model.embed_tokens.weight`, which `vocab_size` and `hidden_size` must
/// match (so a config value cannot size an allocation the weights do not back).
pub fn load(
    dir: &Path,
    cfg_path: &Path,
    cfg: &Json,
    context: Option<u64>,
    embedding: Option<(u64, u64)>,
) -> Result<HfModel, BundleError> {
    let v = cfg
        .as_object()
        .ok_or_else(|| err(cfg_path, "(root)", "expected a JSON object"))?;
    let c = Cfg { v, path: cfg_path };
    let model_type = match v.get("model_type") {
        Some(Json::String(t)) => t.as_str(),
        Some(j) => {
            return Err(err(
                cfg_path,
                "model_type",
                format!("expected a string, found {j}"),
            ))
        }
        None => return Err(err(cfg_path, "model_type", "missing")),
    };
    let spec = crate::arch::lookup(model_type)
        .ok()
        .filter(|a| !a.hf_names.is_empty())
        .ok_or_else(|| {
            let known: Vec<String> = crate::arch::ALL
                .iter()
                .filter(|a| !a.hf_names.is_empty())
                .map(|a| format!("{}: {}", a.name, a.hf_names.join(", ")))
                .collect();
            err(
                cfg_path,
                "model_type",
                format!("{model_type:?} is not supported ({})", known.join("; ")),
            )
        })?;
    let arch = spec.name;
    if v.get("use_sliding_window").and_then(Json::as_bool) == Some(true) {
        return Err(err(
            cfg_path,
            "use_sliding_window",
            "true: sliding-window attention is not implemented for this architecture",
        ));
    }
    let n_layer = c.u64("num_hidden_layers")?;
    let n_embd = c.u64("hidden_size")?;
    let n_ff = c.u64("intermediate_size")?;
    let n_head = c.u64("num_attention_heads")?;
    if n_head == 0 || n_embd % n_head != 0 {
        return Err(err(
            cfg_path,
            "num_attention_heads",
            format!("{n_head} does not divide hidden_size {n_embd}"),
        ));
    }
    let n_head_kv = c.opt_u64("num_key_value_heads")?.unwrap_or(n_head);
    if n_head_kv == 0 || n_head % n_head_kv != 0 {
        return Err(err(
            cfg_path,
            "num_key_value_heads",
            format!("{n_head_kv} does not divide num_attention_heads {n_head}"),
        ));
    }
    let head_dim = c.opt_u64("head_dim")?.unwrap_or(n_embd / n_head);
    if head_dim % 2 != 0 {
        return Err(err(cfg_path, "head_dim", format!("{head_dim} is odd")));
    }
    for (key, x) in [
        ("num_hidden_layers", n_layer),
        ("hidden_size", n_embd),
        ("intermediate_size", n_ff),
    ] {
        if x == 0 {
            return Err(err(cfg_path, key, "is 0"));
        }
    }
    let n_vocab = c.u64("vocab_size")?;
    if n_vocab == 0 || n_vocab > MAX_VOCAB {
        return Err(err(
            cfg_path,
            "vocab_size",
            format!("{n_vocab} is not between 1 and {MAX_VOCAB}"),
        ));
    }
    match embedding {
        None => {
            return Err(err(
                cfg_path,
                "vocab_size",
                "the checkpoint has no model.embed_tokens.weight to check it against",
            ))
        }
        Some((rows, cols)) if rows != n_vocab || cols != n_embd => {
            return Err(err(
                cfg_path,
                "vocab_size",
                format!(
                    "vocab_size {n_vocab} and hidden_size {n_embd} do not match model.embed_tokens.weight [{rows}, {cols}]"
                ),
            ))
        }
        _ => {}
    }
    let n_ctx_train = c.u64("max_position_embeddings")?;
    if n_ctx_train == 0 {
        return Err(err(cfg_path, "max_position_embeddings", "is 0"));
    }
    let n_ctx = match context {
        Some(x) if x == 0 || x > n_ctx_train => {
            return Err(err(
                cfg_path,
                "max_position_embeddings",
                format!("--context {x} must be between 1 and the trained context {n_ctx_train}"),
            ))
        }
        Some(x) => x,
        None => n_ctx_train.min(DEFAULT_CONTEXT),
    };
    let norm_eps = hyper(cfg_path, "rms_norm_eps", c.f64("rms_norm_eps")?, true)?;
    let freq_base = hyper(
        cfg_path,
        "rope_theta",
        c.opt_f64("rope_theta")?.unwrap_or(10000.0),
        true,
    )?;
    let tied = match v.get("tie_word_embeddings") {
        None => false,
        Some(j) => j
            .as_bool()
            .ok_or_else(|| err(cfg_path, "tie_word_embeddings", "expected a boolean"))?,
    };
    // hparams as convert_hf_to_gguf writes them ({arch}.*)
    let mut hp = BTreeMap::new();
    let k = |s: &str| format!("{arch}.{s}");
    hp.insert(k("block_count"), json!(n_layer));
    hp.insert(k("context_length"), json!(n_ctx_train));
    hp.insert(k("embedding_length"), json!(n_embd));
    hp.insert(k("feed_forward_length"), json!(n_ff));
    hp.insert(k("attention.head_count"), json!(n_head));
    hp.insert(k("attention.head_count_kv"), json!(n_head_kv));
    hp.insert(k("rope.freq_base"), json!(freq_base));
    hp.insert(k("attention.layer_norm_rms_epsilon"), json!(norm_eps));
    hp.insert(k("vocab_size"), json!(n_vocab));
    hp.insert(k("rope.dimension_count"), json!(head_dim));
    if head_dim != n_embd / n_head {
        hp.insert(k("attention.key_length"), json!(head_dim));
        hp.insert(k("attention.value_length"), json!(head_dim));
    }
    let mut rope = RopeConfig {
        freq_base,
        dimension_count: head_dim,
        scaling_type: "none".into(),
        scaling_factor: None,
        original_context_length: None,
        attn_factor: None,
        factors_long: None,
        factors_short: None,
        freq_factors: None,
    };
    let mut extra = Vec::new();
    if let Some(rs) = v.get("rope_scaling").filter(|j| !j.is_null()) {
        if !rs.is_object() {
            return Err(err(
                cfg_path,
                "rope_scaling",
                format!("expected an object or null, found {rs}"),
            ));
        }
        let ty = match rs.get("rope_type").or_else(|| rs.get("type")) {
            None => "",
            Some(Json::String(t)) => t.as_str(),
            Some(j) => {
                return Err(err(
                    cfg_path,
                    "rope_scaling.rope_type",
                    format!("expected a string, found {j}"),
                ))
            }
        };
        let factors = |key: &str| -> Result<Vec<f32>, BundleError> {
            let a = rs.get(key).and_then(Json::as_array).ok_or_else(|| {
                err(
                    cfg_path,
                    &format!("rope_scaling.{key}"),
                    "missing or not an array",
                )
            })?;
            let f: Option<Vec<f32>> = a
                .iter()
                .map(|x| {
                    x.as_f64()
                        .map(|x| x as f32)
                        .filter(|x| x.is_finite() && *x > 0.0)
                })
                .collect();
            let f = f.ok_or_else(|| {
                err(
                    cfg_path,
                    &format!("rope_scaling.{key}"),
                    "not all positive finite f32 numbers",
                )
            })?;
            if f.len() as u64 != head_dim / 2 {
                return Err(err(
                    cfg_path,
                    &format!("rope_scaling.{key}"),
                    format!(
                        "{} factors, expected head_dim / 2 = {}",
                        f.len(),
                        head_dim / 2
                    ),
                ));
            }
            Ok(f)
        };
        match ty {
            "longrope" => {
                extra.push((
                    "rope_factors_long.weight".to_string(),
                    factors("long_factor")?,
                ));
                extra.push((
                    "rope_factors_short.weight".to_string(),
                    factors("short_factor")?,
                ));
                let orig = rs
                    .get("original_max_position_embeddings")
                    .and_then(Json::as_u64)
                    .or(c.opt_u64("original_max_position_embeddings")?)
                    .ok_or_else(|| {
                        err(
                            cfg_path,
                            "rope_scaling.original_max_position_embeddings",
                            "missing",
                        )
                    })?;
                rope.scaling_type = "longrope".into();
                rope.original_context_length = Some(orig);
                // Hugging Face's LongRoPE scales cos and sin by sqrt(1 + ln(max / orig) /
                // ln(orig)) beyond the original context (llama.cpp's rope attn_factor).
                // convert_hf_to_gguf writes neither this nor the original context.
                if n_ctx_train > orig && orig > 1 {
                    let m =
                        (1.0 + (n_ctx_train as f64 / orig as f64).ln() / (orig as f64).ln()).sqrt();
                    rope.attn_factor = Some(f32r(m));
                    hp.insert(k("rope.scaling.attn_factor"), json!(f32r(m)));
                }
                rope.factors_long = Some("rope_factors_long.weight".into());
                rope.factors_short = Some("rope_factors_short.weight".into());
                hp.insert(k("rope.scaling.type"), json!("longrope"));
                hp.insert(k("rope.scaling.original_context_length"), json!(orig));
            }
            "linear" => {
                let f = rs
                    .get("factor")
                    .and_then(Json::as_f64)
                    .ok_or_else(|| err(cfg_path, "rope_scaling.factor", "missing"))?;
                let f = hyper(cfg_path, "rope_scaling.factor", f, true)?;
                rope.scaling_type = "linear".into();
                rope.scaling_factor = Some(f);
                hp.insert(k("rope.scaling.type"), json!("linear"));
                hp.insert(k("rope.scaling.factor"), json!(f));
            }
            "default" | "" => {}
            other => {
                return Err(err(
                    cfg_path,
                    "rope_scaling.rope_type",
                    format!("{other:?} is not supported (longrope, linear)"),
                ))
            }
        }
    }
    let (mut emb, mut res, mut logit) = (None, None, None);
    if arch == "minicpm" {
        // convert_hf_to_gguf (conversion/minicpm.py): embedding_scale = scale_emb, residual_scale
        // = scale_depth / sqrt(num_hidden_layers), logit_scale = hidden_size / dim_model_base
        let e = hyper(cfg_path, "scale_emb", c.f64("scale_emb")?, false)?;
        let r = hyper(
            cfg_path,
            "scale_depth",
            c.f64("scale_depth")? / (n_layer as f64).sqrt(),
            false,
        )?;
        let base = hyper(cfg_path, "dim_model_base", c.f64("dim_model_base")?, true)?;
        let l = hyper(cfg_path, "dim_model_base", n_embd as f64 / base, true)?;
        hp.insert(k("embedding_scale"), json!(e));
        hp.insert(k("residual_scale"), json!(r));
        hp.insert(k("logit_scale"), json!(l));
        (emb, res, logit) = (Some(e), Some(r), Some(l));
    }
    let tok = tokenizer(dir, v, n_vocab as usize)?;
    let model = ModelConfig {
        architecture: arch.into(),
        n_layer,
        n_embd,
        n_ff,
        n_head,
        n_head_kv,
        head_dim,
        n_vocab,
        n_ctx_train,
        n_ctx,
        norm_eps,
        rope,
        embedding_scale: emb,
        residual_scale: res,
        logit_scale: logit,
        tied_embeddings: tied,
        special_tokens: tok.special,
        chat_template: tok.chat_template,
        hparams: hp,
    };
    Ok(HfModel {
        model,
        tokenizer: TokenizerRef {
            file: TOKENIZER_FILE.into(),
            model: tok.model,
            pre: tok.pre,
            n_vocab: tok.n_vocab,
        },
        tokenizer_bytes: tok.bytes,
        extra,
        n_head: n_head as usize,
        n_head_kv: n_head_kv as usize,
        permute_qk: spec.rope == crate::arch::RopeMode::Norm,
    })
}

struct Tok {
    model: String,
    pre: Option<String>,
    n_vocab: u64,
    bytes: Vec<u8>,
    special: BTreeMap<String, u64>,
    chat_template: Option<String>,
}

fn read_json(path: &Path) -> Result<Option<Json>, BundleError> {
    match crate::util::read_input(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(BundleError::Io {
            path: path.to_path_buf(),
            source: e,
        }),
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| err(path, "(file)", format!("not JSON: {e}"))),
    }
}

/// A token given in tokenizer_config.json as a string or as `{"content": ...}`.
fn token_text(j: &Json) -> Option<&str> {
    j.as_str()
        .or_else(|| j.get("content").and_then(Json::as_str))
}

/// gguf-py's TokenType.
const NORMAL: i64 = 1;
const UNKNOWN: i64 = 2;
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;
const BYTE: i64 = 6;

/// The `Split` regex of Qwen2's tokenizer.json (llama.cpp's `qwen2` pre-tokenizer: single
/// digits).
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Hugging Face pre-tokenizers (tokenizer.json `pre_tokenizer`) of byte-level BPE models and
/// the llama.cpp pre-tokenizer name (`tokenizer.ggml.pre`) of each. convert_hf_to_gguf
/// recognises a pre-tokenizer by hashing the ids of a test text; this table recognises the
/// configurations themselves, for the ones listed.
fn pre_name(pre: &Json) -> Option<&'static str> {
    let byte_level = |j: &Json| {
        j.get("type").and_then(Json::as_str) == Some("ByteLevel")
            && j.get("use_regex").and_then(Json::as_bool).unwrap_or(true)
    };
    if byte_level(pre) {
        return Some("gpt-2");
    }
    if pre.get("type").and_then(Json::as_str) == Some("Sequence") {
        let items = pre.get("pretokenizers").and_then(Json::as_array)?;
        // Qwen2: the split regex of llama.cpp's `qwen2` pre-tokenizer, then byte-level
        // without its own regex.
        if let [split, bl] = items.as_slice() {
            let regex = split
                .get("pattern")
                .and_then(|p| p.get("Regex"))
                .and_then(Json::as_str);
            if split.get("type").and_then(Json::as_str) == Some("Split")
                && regex == Some(QWEN2_SPLIT)
                && bl.get("type").and_then(Json::as_str) == Some("ByteLevel")
                && bl.get("use_regex").and_then(Json::as_bool) == Some(false)
            {
                return Some("qwen2");
            }
        }
        if let [digits, bl] = items.as_slice() {
            if digits.get("type").and_then(Json::as_str) == Some("Digits")
                && digits.get("individual_digits").and_then(Json::as_bool) == Some(true)
                && byte_level(bl)
            {
                return Some("smollm");
            }
        }
    }
    None
}

fn tokenizer(dir: &Path, cfg: &Map<String, Json>, n_vocab: usize) -> Result<Tok, BundleError> {
    let tc_path = dir.join("tokenizer_config.json");
    let tc = read_json(&tc_path)?.unwrap_or_else(|| json!({}));
    let tj_path = dir.join("tokenizer.json");
    let sp_path = dir.join("tokenizer.model");
    let mut meta: BTreeMap<String, Json> = BTreeMap::new();
    let (model, tokens, pre) = if sp_path.exists() {
        let bytes = crate::util::read_input(&sp_path).map_err(|e| BundleError::Io {
            path: sp_path.clone(),
            source: e,
        })?;
        let sp = sentencepiece(&bytes, n_vocab).map_err(|d| err(&sp_path, "(ModelProto)", d))?;
        if sp.pieces.len() != n_vocab {
            return Err(err(
                &sp_path,
                "pieces",
                format!(
                    "{} pieces, but config.json's vocab_size is {n_vocab}",
                    sp.pieces.len()
                ),
            ));
        }
        if let Some((i, p)) = sp.pieces.iter().enumerate().find(|(_, p)| !p.1.is_finite()) {
            return Err(err(
                &sp_path,
                "pieces",
                format!("piece {i} {:?} has score {}", p.0, p.1),
            ));
        }
        meta.insert("ggml.model".into(), json!("llama"));
        meta.insert(
            "ggml.tokens".into(),
            json!(sp.pieces.iter().map(|p| p.0.clone()).collect::<Vec<_>>()),
        );
        meta.insert(
            "ggml.scores".into(),
            json!(sp.pieces.iter().map(|p| p.1 as f64).collect::<Vec<_>>()),
        );
        meta.insert(
            "ggml.token_type".into(),
            json!(sp.pieces.iter().map(|p| p.2).collect::<Vec<_>>()),
        );
        meta.insert("ggml.add_space_prefix".into(), json!(sp.add_dummy_prefix));
        let tokens: Vec<String> = sp.pieces.iter().map(|p| p.0.clone()).collect();
        for (name, id) in [
            ("unknown", sp.unk_id),
            ("bos", sp.bos_id),
            ("eos", sp.eos_id),
            ("padding", sp.pad_id),
        ] {
            if id >= 0 {
                meta.insert(format!("ggml.{name}_token_id"), json!(id));
            }
        }
        ("llama".to_string(), tokens, None)
    } else {
        let tj = read_json(&tj_path)?.ok_or_else(|| err(&tj_path, "(file)", "a Hugging Face checkpoint needs tokenizer.json (byte-level BPE) or tokenizer.model (SentencePiece) beside config.json"))?;
        let m = tj
            .get("model")
            .ok_or_else(|| err(&tj_path, "model", "missing"))?;
        if m.get("type").and_then(Json::as_str) != Some("BPE") {
            return Err(err(
                &tj_path,
                "model.type",
                format!("{:?} is not supported (BPE)", m.get("type")),
            ));
        }
        let pre = tj.get("pre_tokenizer").unwrap_or(&Json::Null);
        let pre = pre_name(pre).ok_or_else(|| err(&tj_path, "pre_tokenizer", format!("{pre} is not a pre-tokenizer this tool maps to llama.cpp's (known: smollm, gpt-2, qwen2)")))?;
        let vocab = m
            .get("vocab")
            .and_then(Json::as_object)
            .ok_or_else(|| err(&tj_path, "model.vocab", "missing or not an object"))?;
        if vocab.len() > n_vocab {
            return Err(err(
                &tj_path,
                "model.vocab",
                format!(
                    "{} tokens, more than config.json's vocab_size {n_vocab}",
                    vocab.len()
                ),
            ));
        }
        let mut tokens: Vec<Option<String>> = vec![None; n_vocab];
        for (t, id) in vocab {
            let id = id.as_u64().ok_or_else(|| {
                err(
                    &tj_path,
                    "model.vocab",
                    format!("id of {t:?} is not an integer"),
                )
            })? as usize;
            if id >= tokens.len() {
                return Err(err(
                    &tj_path,
                    "model.vocab",
                    format!("id {id} of {t:?} is not below vocab_size {}", tokens.len()),
                ));
            }
            tokens[id] = Some(t.clone());
        }
        let mut types = vec![NORMAL; tokens.len()];
        if let Some(added) = tj.get("added_tokens").and_then(Json::as_array) {
            for a in added {
                let (Some(id), Some(content)) = (
                    a.get("id").and_then(Json::as_u64),
                    a.get("content").and_then(Json::as_str),
                ) else {
                    return Err(err(
                        &tj_path,
                        "added_tokens",
                        format!("entry {a} lacks id or content"),
                    ));
                };
                let id = id as usize;
                if id >= tokens.len() {
                    return Err(err(
                        &tj_path,
                        "added_tokens",
                        format!("id {id} is not below vocab_size {}", tokens.len()),
                    ));
                }
                tokens[id] = Some(content.to_string());
                let special = a.get("special").and_then(Json::as_bool).unwrap_or(false);
                types[id] = if special || looks_special(content) {
                    CONTROL
                } else {
                    USER_DEFINED
                };
            }
        }
        // convert_hf_to_gguf fills ids the vocabulary lacks with "[PAD{i}]", user-defined.
        let tokens: Vec<String> = tokens
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                t.unwrap_or_else(|| {
                    types[i] = USER_DEFINED;
                    format!("[PAD{i}]")
                })
            })
            .collect();
        let merges = match m.get("merges") {
            None | Some(Json::Null) => &[][..],
            Some(Json::Array(a)) => a.as_slice(),
            Some(j) => {
                return Err(err(
                    &tj_path,
                    "model.merges",
                    format!("expected an array, found {}", crate::tokenizer::kind(j)),
                ))
            }
        };
        let merges: Result<Vec<String>, BundleError> = merges
            .iter()
            .map(|x| match x {
                Json::String(s)
                    if s.split_once(' ')
                        .is_some_and(|(a, b)| !a.is_empty() && !b.is_empty()) =>
                {
                    Ok(s.clone())
                }
                Json::Array(p) if p.len() == 2 => match (p[0].as_str(), p[1].as_str()) {
                    (Some(a), Some(b)) => Ok(format!("{a} {b}")),
                    _ => Err(err(
                        &tj_path,
                        "model.merges",
                        format!("{x} is not a pair of strings"),
                    )),
                },
                _ => Err(err(&tj_path, "model.merges", format!("{x} is not a merge"))),
            })
            .collect();
        meta.insert("ggml.model".into(), json!("gpt2"));
        meta.insert("ggml.pre".into(), json!(pre));
        meta.insert("ggml.tokens".into(), json!(tokens));
        meta.insert("ggml.token_type".into(), json!(types));
        meta.insert("ggml.merges".into(), json!(merges?));
        // ByteLevel's add_prefix_space, as convert_hf_to_gguf reads it from tokenizer.json
        let add_prefix = find_add_prefix_space(tj.get("pre_tokenizer").unwrap_or(&Json::Null));
        if let Some(p) = add_prefix {
            meta.insert("ggml.add_space_prefix".into(), json!(p));
        }
        ("gpt2".to_string(), tokens, Some(pre.to_string()))
    };
    // Special tokens (gguf-py SpecialVocab): tokenizer_config.json's <name>_token text, else
    // config.json's <name>_token_id.
    let id_of = |text: &str| tokens.iter().position(|t| t == text).map(|i| i as u64);
    for (hf, gg) in [
        ("bos", "bos"),
        ("eos", "eos"),
        ("unk", "unknown"),
        ("pad", "padding"),
    ] {
        let from_tc = tc
            .get(format!("{hf}_token"))
            .and_then(token_text)
            .and_then(id_of);
        let from_cfg = cfg.get(&format!("{hf}_token_id")).and_then(Json::as_u64);
        if let Some(id) = from_tc.or(from_cfg) {
            if id as usize >= tokens.len() {
                return Err(err(
                    &dir.join("config.json"),
                    &format!("{hf}_token_id"),
                    format!("{id} is not below the vocabulary size {}", tokens.len()),
                ));
            }
            meta.insert(format!("ggml.{gg}_token_id"), json!(id));
        }
    }
    for (hf, gg) in [
        ("add_bos_token", "ggml.add_bos_token"),
        ("add_eos_token", "ggml.add_eos_token"),
    ] {
        if let Some(b) = tc.get(hf).and_then(Json::as_bool) {
            meta.insert(gg.into(), json!(b));
        }
    }
    let chat_template = tc
        .get("chat_template")
        .and_then(Json::as_str)
        .map(|s| s.to_string());
    if let Some(t) = &chat_template {
        meta.insert("chat_template".into(), json!(t));
    }
    let special = meta
        .iter()
        .filter_map(|(key, v)| {
            let name = key.strip_prefix("ggml.")?.strip_suffix("_token_id")?;
            Some((name.to_string(), v.as_u64()?))
        })
        .collect();
    let doc = json!({
        "format": "lowbit-tokenizer",
        "format_version": 1,
        "source": "Hugging Face tokenizer files, as convert_hf_to_gguf.py maps them to GGUF tokenizer.* keys",
        "metadata": meta,
    });
    // The runtime must be able to build it: refuse here, not when the bundle is run.
    if let Err(e) = crate::tokenizer::Tokenizer::from_json(&doc) {
        let file = if model == "llama" { sp_path } else { tj_path };
        return Err(err(
            &file,
            "(tokenizer)",
            format!("the mapped vocabulary is unusable: {e}"),
        ));
    }
    Ok(Tok {
        model,
        pre,
        n_vocab: tokens.len() as u64,
        bytes: serde_json::to_vec_pretty(&doc).expect("a JSON value always serializes"),
        special,
        chat_template,
    })
}

/// convert_hf_to_gguf's `does_token_look_special`: `<|...|>` and a few known texts.
fn looks_special(t: &str) -> bool {
    (t.starts_with("<|") && t.ends_with("|>"))
        || matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
}

fn find_add_prefix_space(pre: &Json) -> Option<bool> {
    if pre.get("type").and_then(Json::as_str) == Some("ByteLevel") {
        return pre.get("add_prefix_space").and_then(Json::as_bool);
    }
    pre.get("pretokenizers")
        .and_then(Json::as_array)?
        .iter()
        .find_map(find_add_prefix_space)
}

/// The parts of a SentencePiece `ModelProto` a GGUF vocabulary needs.
#[derive(Debug)]
struct SpModel {
    /// (piece, score, gguf token type)
    pieces: Vec<(String, f32, i64)>,
    add_dummy_prefix: bool,
    unk_id: i64,
    bos_id: i64,
    eos_id: i64,
    pad_id: i64,
}

/// `MAX_SP_PIECES`: more pieces than any vocabulary has (protects the allocation from a
/// malformed file; each piece needs at least a few bytes of the file anyway).
const MAX_SP_PIECES: usize = MAX_VOCAB as usize;

/// A minimal protobuf reader for sentencepiece_model.proto: `ModelProto.pieces` (1: piece 1,
/// score 2, type 3), `trainer_spec` (2: unk_id 40, bos_id 41, eos_id 42, pad_id 43),
/// `normalizer_spec` (3: add_dummy_prefix 3). Unknown fields are skipped.
/// At most `max_pieces` pieces (config.json's vocabulary size) are read.
fn sentencepiece(b: &[u8], max_pieces: usize) -> Result<SpModel, String> {
    let max_pieces = max_pieces.min(MAX_SP_PIECES);
    let mut m = SpModel {
        pieces: Vec::new(),
        add_dummy_prefix: true,
        unk_id: 0,
        bos_id: 1,
        eos_id: 2,
        pad_id: -1,
    };
    for f in fields(b)? {
        match (f.num, f.val) {
            (1, Val::Bytes(p)) => {
                if m.pieces.len() >= max_pieces {
                    return Err(format!(
                        "more than {max_pieces} pieces (config.json's vocab_size, at most {MAX_SP_PIECES})"
                    ));
                }
                let (mut piece, mut score, mut ty) = (String::new(), 0f32, 1i64);
                for g in fields(p)? {
                    match (g.num, g.val) {
                        (1, Val::Bytes(s)) => {
                            piece = String::from_utf8(s.to_vec())
                                .map_err(|_| format!("piece {} is not UTF-8", m.pieces.len()))?
                        }
                        (2, Val::Fixed32(x)) => score = f32::from_bits(x),
                        (3, Val::Varint(t)) => ty = t as i64,
                        _ => {}
                    }
                }
                // sentencepiece Type -> gguf TokenType
                let gty = match ty {
                    1 => NORMAL,
                    2 => UNKNOWN,
                    3 => CONTROL,
                    4 => USER_DEFINED,
                    5 => 5,
                    6 => BYTE,
                    t => return Err(format!("piece {} has unknown type {t}", m.pieces.len())),
                };
                m.pieces.push((piece, score, gty));
            }
            (2, Val::Bytes(t)) => {
                for g in fields(t)? {
                    if let Val::Varint(x) = g.val {
                        let x = x as i64 as i32 as i64; // int32, negative values sign-extended
                        match g.num {
                            40 => m.unk_id = x,
                            41 => m.bos_id = x,
                            42 => m.eos_id = x,
                            43 => m.pad_id = x,
                            _ => {}
                        }
                    }
                }
            }
            (3, Val::Bytes(n)) => {
                for g in fields(n)? {
                    if let (3, Val::Varint(x)) = (g.num, g.val) {
                        m.add_dummy_prefix = x != 0;
                    }
                }
            }
            _ => {}
        }
    }
    if m.pieces.is_empty() {
        return Err("no pieces".into());
    }
    Ok(m)
}

enum Val<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32(u32),
}

struct Field<'a> {
    num: u64,
    val: Val<'a>,
}

fn varint(b: &[u8], pos: &mut usize) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b
            .get(*pos)
            .ok_or_else(|| format!("truncated varint at byte {}", *pos))?;
        *pos += 1;
        v |= ((byte & 0x7f) as u64) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(format!("varint longer than 10 bytes before byte {}", *pos))
}

fn fields(b: &[u8]) -> Result<Vec<Field<'_>>, String> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < b.len() {
        let at = pos;
        let key = varint(b, &mut pos)?;
        let (num, wt) = (key >> 3, key & 7);
        let take = |pos: &mut usize, n: usize| -> Result<&[u8], String> {
            let end = pos
                .checked_add(n)
                .filter(|&e| e <= b.len())
                .ok_or_else(|| format!("field {num} at byte {at} runs past the end"))?;
            let s = &b[*pos..end];
            *pos = end;
            Ok(s)
        };
        let val = match wt {
            0 => Val::Varint(varint(b, &mut pos)?),
            1 => {
                take(&mut pos, 8)?;
                Val::Fixed64
            }
            2 => {
                let n = varint(b, &mut pos)?;
                let n = usize::try_from(n)
                    .map_err(|_| format!("field {num} at byte {at}: length {n}"))?;
                Val::Bytes(take(&mut pos, n)?)
            }
            5 => Val::Fixed32(u32::from_le_bytes(
                take(&mut pos, 4)?.try_into().expect("4 bytes"),
            )),
            w => {
                return Err(format!(
                    "field {num} at byte {at}: wire type {w} is not supported"
                ))
            }
        };
        out.push(Field { num, val });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_pre_tokenizers_map_to_names_the_runtime_knows() {
        let gpt2 = json!({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true});
        let smollm = json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, gpt2.clone()]});
        // "gpt-2" is llama.cpp's name (a "gpt2" pre used to give an unusable tokenizer)
        assert_eq!(pre_name(&gpt2), Some("gpt-2"));
        assert_eq!(pre_name(&smollm), Some("smollm"));
        for name in [pre_name(&gpt2).unwrap(), pre_name(&smollm).unwrap()] {
            assert!(crate::tokenizer::PRE_TOKENIZERS.contains(&name), "{name}");
        }
        assert_eq!(pre_name(&json!({"type": "Whitespace"})), None);
    }

    #[test]
    fn qwen2_maps_biases_and_does_not_permute() {
        assert_eq!(
            gguf_name("model.layers.3.self_attn.q_proj.weight", 14, 2, false),
            Some((
                "blk.3.attn_q.weight".into(),
                Source::Tensor("model.layers.3.self_attn.q_proj.weight".into())
            ))
        );
        for (hf, g) in [("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v")] {
            let name = format!("model.layers.0.self_attn.{hf}_proj.bias");
            assert_eq!(
                gguf_name(&name, 14, 2, false),
                Some((format!("blk.0.{g}.bias"), Source::Tensor(name.clone())))
            );
        }
        assert_eq!(
            gguf_name("model.layers.0.self_attn.o_proj.bias", 14, 2, false),
            None
        );
        let qwen2 = json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]});
        assert_eq!(pre_name(&qwen2), Some("qwen2"));
        let mut other = qwen2.clone();
        other["pretokenizers"][0]["pattern"]["Regex"] = json!("\\p{N}{1,3}");
        assert_eq!(pre_name(&other), None);
    }

    #[test]
    fn permutation_is_convert_hf_to_gguf_permute() {
        // LlamaModel.permute: w.reshape(n_head, 2, rows / n_head / 2, cols).swapaxes(1, 2)
        let (heads, hd) = (3, 8);
        let rows = heads * hd;
        let mut gguf_of_hf = vec![0usize; rows];
        for h in 0..heads {
            for p in 0..2 {
                for i in 0..hd / 2 {
                    let hf = h * hd + p * hd / 2 + i;
                    let g = h * hd + i * 2 + p;
                    gguf_of_hf[g] = hf;
                }
            }
        }
        for (g, &hf) in gguf_of_hf.iter().enumerate() {
            assert_eq!(permuted_row(g, rows, heads), hf);
        }
    }

    #[test]
    fn names_map_and_unknown_names_do_not() {
        assert_eq!(
            gguf_name("model.layers.7.self_attn.k_proj.weight", 9, 3, true),
            Some((
                "blk.7.attn_k.weight".into(),
                Source::Permuted {
                    name: "model.layers.7.self_attn.k_proj.weight".into(),
                    heads: 3
                }
            ))
        );
        assert_eq!(
            gguf_name("model.layers.0.mlp.down_proj.weight", 9, 3, true).map(|x| x.0),
            Some("blk.0.ffn_down.weight".into())
        );
        assert_eq!(
            gguf_name("model.layers.0.self_attn.rotary_emb.inv_freq", 9, 3, true),
            None
        );
        assert_eq!(
            gguf_name("model.layers.x.mlp.up_proj.weight", 9, 3, true),
            None
        );
    }

    #[test]
    fn protobuf_reader_rejects_truncation_and_reads_pieces() {
        // pieces { piece: "a" score: -1.5 type: 3 }, normalizer_spec { add_dummy_prefix: false }
        let mut piece = vec![0x0a, 1, b'a', 0x15];
        piece.extend_from_slice(&(-1.5f32).to_bits().to_le_bytes());
        piece.extend_from_slice(&[0x18, 3]);
        let mut b = vec![0x0a, piece.len() as u8];
        b.extend_from_slice(&piece);
        b.extend_from_slice(&[0x1a, 2, 0x18, 0]);
        let m = sentencepiece(&b, 10).unwrap();
        assert_eq!(m.pieces, vec![("a".to_string(), -1.5, CONTROL)]);
        assert!(!m.add_dummy_prefix);
        assert!(sentencepiece(&b, 0)
            .unwrap_err()
            .contains("more than 0 pieces"));
        assert!(sentencepiece(&b[..b.len() - 1], 10)
            .unwrap_err()
            .contains("past the end"));
        assert!(sentencepiece(&[0x0a, 0xff], 10).is_err());
        assert!(sentencepiece(&[], 10).unwrap_err().contains("no pieces"));
    }
}
