//! Model configuration and tokenizer, read from GGUF metadata for the bundle.

use std::collections::BTreeMap;

use serde_json::{json, Value as Json};

use super::manifest::{ModelConfig, RopeConfig};
use super::BundleError;
use crate::gguf::{GgufFile, Value};

/// Default bundle context when `--context` is not given (capped by the trained context).
pub const DEFAULT_CONTEXT: u64 = 4096;

fn cfg_err(f: &GgufFile, key: &str, detail: &str) -> BundleError {
    BundleError::Config {
        file: f.path().to_path_buf(),
        key: key.to_string(),
        detail: detail.to_string(),
    }
}

fn req_u64(f: &GgufFile, key: &str) -> Result<u64, BundleError> {
    match f.get(key) {
        None => Err(cfg_err(f, key, "missing")),
        Some(v) => v.as_u64().ok_or_else(|| {
            cfg_err(
                f,
                key,
                &format!(
                    "expected an unsigned integer, found {}",
                    v.value_type().name()
                ),
            )
        }),
    }
}

fn opt_u64(f: &GgufFile, key: &str) -> Result<Option<u64>, BundleError> {
    match f.get(key) {
        None => Ok(None),
        Some(_) => req_u64(f, key).map(Some),
    }
}

fn opt_f64(f: &GgufFile, key: &str) -> Result<Option<f64>, BundleError> {
    match f.get(key) {
        None => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| {
            cfg_err(
                f,
                key,
                &format!("expected a number, found {}", v.value_type().name()),
            )
        }),
    }
}

/// A metadata value as lossless JSON: full arrays; strings that are not UTF-8 become
/// `{"hex": "..."}`; non-finite floats become the strings `"NaN"`, `"inf"`, `"-inf"`.
pub fn value_to_json(v: &Value) -> Json {
    match v {
        Value::String(b) => match std::str::from_utf8(b) {
            Ok(s) => json!(s),
            Err(_) => json!({ "hex": hex::encode(b) }),
        },
        Value::Array(_, items) => Json::Array(items.iter().map(value_to_json).collect()),
        other => other.to_json(),
    }
}

/// Reads the model configuration. `context` is the requested bundle context (`None`: the
/// smaller of [`DEFAULT_CONTEXT`] and the trained context).
pub fn model_config(f: &GgufFile, context: Option<u64>) -> Result<ModelConfig, BundleError> {
    let arch = f
        .architecture()
        .ok_or_else(|| cfg_err(f, "general.architecture", "missing"))?;
    let k = |s: &str| format!("{arch}.{s}");
    let n_layer = req_u64(f, &k("block_count"))?;
    let n_embd = req_u64(f, &k("embedding_length"))?;
    let n_ff = match f.get(&k("feed_forward_length")) {
        Some(Value::Array(_, items)) => items.iter().filter_map(|v| v.as_u64()).max().unwrap_or(0),
        _ => req_u64(f, &k("feed_forward_length"))?,
    };
    let n_head = req_u64(f, &k("attention.head_count"))?;
    if n_head == 0 {
        return Err(cfg_err(f, &k("attention.head_count"), "is 0"));
    }
    let n_head_kv = opt_u64(f, &k("attention.head_count_kv"))?.unwrap_or(n_head);
    if n_head_kv == 0 || n_head % n_head_kv != 0 {
        return Err(cfg_err(
            f,
            &k("attention.head_count_kv"),
            &format!("{n_head_kv} does not divide head_count {n_head}"),
        ));
    }
    let head_dim = opt_u64(f, &k("attention.key_length"))?.unwrap_or(n_embd / n_head);
    let n_vocab = match opt_u64(f, &k("vocab_size"))? {
        Some(n) => n,
        None => match f.get("tokenizer.ggml.tokens") {
            Some(Value::Array(_, t)) => t.len() as u64,
            _ => f
                .tensor("token_embd.weight")
                .map(|t| t.n_rows())
                .ok_or_else(|| {
                    cfg_err(
                        f,
                        &k("vocab_size"),
                        "missing, and no tokenizer or token_embd.weight to count",
                    )
                })?,
        },
    };
    let n_ctx_train = req_u64(f, &k("context_length"))?;
    let n_ctx = match context {
        Some(c) if c == 0 || c > n_ctx_train => {
            return Err(cfg_err(
                f,
                &k("context_length"),
                &format!("--context {c} must be between 1 and the trained context {n_ctx_train}"),
            ))
        }
        Some(c) => c,
        None => n_ctx_train.min(DEFAULT_CONTEXT),
    };
    let norm_eps = match opt_f64(f, &k("attention.layer_norm_rms_epsilon"))? {
        Some(e) => e,
        None => opt_f64(f, &k("attention.layer_norm_epsilon"))?
            .ok_or_else(|| cfg_err(f, &k("attention.layer_norm_rms_epsilon"), "missing"))?,
    };
    let scaling_type = match f.get(&k("rope.scaling.type")) {
        Some(v) => v
            .as_str()
            .map(|s| s.into_owned())
            .ok_or_else(|| cfg_err(f, &k("rope.scaling.type"), "expected a string"))?,
        None => "none".to_string(),
    };
    let present = |name: &str| f.tensor(name).map(|_| name.to_string());
    let rope = RopeConfig {
        freq_base: opt_f64(f, &k("rope.freq_base"))?.unwrap_or(10000.0),
        dimension_count: opt_u64(f, &k("rope.dimension_count"))?.unwrap_or(head_dim),
        scaling_type,
        scaling_factor: opt_f64(f, &k("rope.scaling.factor"))?,
        original_context_length: opt_u64(f, &k("rope.scaling.original_context_length"))?,
        attn_factor: opt_f64(f, &k("rope.scaling.attn_factor"))?,
        factors_long: present("rope_factors_long.weight"),
        factors_short: present("rope_factors_short.weight"),
        freq_factors: present("rope_freqs.weight"),
    };
    // MiniCPM's defaults for older files, computed in f32 as llama.cpp does
    // (src/models/minicpm.cpp: 12, 1.4/sqrt(n_layer), 256/n_embd).
    let (mut emb, mut res, mut logit) = (
        opt_f64(f, &k("embedding_scale"))?,
        opt_f64(f, &k("residual_scale"))?,
        opt_f64(f, &k("logit_scale"))?,
    );
    if arch == "minicpm" {
        emb.get_or_insert(12.0f32 as f64);
        res.get_or_insert((1.4f32 / (n_layer as f32).sqrt()) as f64);
        logit.get_or_insert((256.0f32 / n_embd as f32) as f64);
    }
    let mut special_tokens = BTreeMap::new();
    for (key, v) in &f.metadata {
        if let Some(name) = key
            .strip_prefix("tokenizer.ggml.")
            .and_then(|s| s.strip_suffix("_token_id"))
        {
            if let Some(id) = v.as_u64() {
                // An id past the vocabulary would be recorded and then replaced by the
                // runtime's fallback; refuse it here, naming the key.
                if id >= n_vocab {
                    return Err(cfg_err(
                        f,
                        key,
                        &format!("{id} is outside the vocabulary (n_vocab = {n_vocab})"),
                    ));
                }
                special_tokens.insert(name.to_string(), id);
            }
        }
    }
    let chat_template = f
        .get("tokenizer.chat_template")
        .and_then(|v| v.as_str())
        .map(|s| s.into_owned());
    let prefix = format!("{arch}.");
    let hparams = f
        .metadata
        .iter()
        .filter(|(key, _)| key.starts_with(&prefix))
        .map(|(key, v)| (key.clone(), value_to_json(v)))
        .collect();
    let m = ModelConfig {
        architecture: arch,
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
        tied_embeddings: f.tensor("output.weight").is_none(),
        special_tokens,
        chat_template,
        hparams,
    };
    m.check()
        .map_err(|(field, detail)| BundleError::ModelConfig {
            path: f.path().to_path_buf(),
            field: format!("{field} (from the {}.* metadata)", m.architecture),
            detail,
        })?;
    super::check_model(f.path(), &m)?;
    Ok(m)
}

/// [`tokenizer_json`] as the bytes of a bundle's `tokenizer.json` (pretty-printed).
pub fn tokenizer_file_bytes(f: &GgufFile) -> Vec<u8> {
    serde_json::to_vec_pretty(&tokenizer_json(f)).expect("a JSON value always serializes")
}

/// The tokenizer as JSON: every `tokenizer.*` metadata key, verbatim and in full, sorted by
/// key (the `tokenizer.` prefix dropped), as [`value_to_json`] writes values.
pub fn tokenizer_json(f: &GgufFile) -> Json {
    let map: BTreeMap<String, Json> = f
        .metadata
        .iter()
        .filter_map(|(key, v)| {
            key.strip_prefix("tokenizer.")
                .map(|k| (k.to_string(), value_to_json(v)))
        })
        .collect();
    json!({
        "format": "lowbit-tokenizer",
        "format_version": 1,
        "source": "GGUF tokenizer.* metadata, verbatim",
        "metadata": map,
    })
}
