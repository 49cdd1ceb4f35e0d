//! Architectures: what a model of each kind is, defined once.
//!
//! An architecture ([`ArchSpec`], one module each) says which tensors a model has and their
//! shapes, which operations a layer runs in which order, its scales, its RoPE variant, its
//! extra hyper-parameters and their checks. Every consumer reads it from here:
//!
//! - the runtime's backends build their forward pass from a [`Layout`] (tensor names and
//!   shapes resolved against a configuration) and [`Hyper`] (the numbers the graph needs);
//! - `convert verify` runs [`check_manifest`], so a bundle that verifies is one every backend
//!   can build;
//! - `pack`, `gguf-to-ternary` and `palettize` run [`check_config`] on the configuration they
//!   read, so an architecture the runtime does not implement is refused before anything is
//!   written, with the list of those it does;
//! - the Hugging Face loader maps a `config.json` whose `architectures` names one of
//!   [`ArchSpec::hf_names`].
//!
//! This module depends only on the manifest's data types ([`crate::bundle::manifest`]), never
//! on the runtime. Adding an architecture is one module here (its [`ArchSpec`] and checks),
//! an entry in [`ALL`], and its tests.
//!
//! The graphs follow llama.cpp's (`src/models/*.cpp` at build b11434); each module cites its
//! file.

pub mod gemma3;
pub mod llama;
pub mod minicpm;
pub mod qwen2;

use serde_json::Value as Json;

use crate::bundle::manifest::{Manifest, ModelConfig};

/// Errors about a model's architecture, configuration or tensor layout.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArchError {
    #[error(
        "architecture {arch:?} is not implemented by the runtime (implemented: {})",
        supported_list()
    )]
    Unsupported { arch: String },
    #[error("manifest.json model.{field}: {detail}")]
    Config { field: String, detail: String },
    #[error("tensor {tensor:?} is missing from the bundle")]
    MissingTensor { tensor: String },
    #[error("tensor {tensor:?}: {detail}")]
    Shape { tensor: String, detail: String },
}

/// The activation of the gated feed-forward network: `down(act(gate x) * up x)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (SwiGLU).
    Silu,
    /// GELU, tanh approximation, as ggml's CPU backend computes it: for `-10 < x < 10` the
    /// value is looked up in a table of `gelu(f16(x))` rounded to f16 (`ggml_vec_geglu_f32`
    /// with `GGML_GELU_FP16`), `0` at or below -10 and `x` at or above 10.
    GeluTanh,
}

/// How RoPE pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// Adjacent pairs `(2i, 2i + 1)` (ggml `GGML_ROPE_TYPE_NORM`: llama, minicpm).
    Norm,
    /// Pairs `(i, i + n_rot / 2)` (ggml `GGML_ROPE_TYPE_NEOX`: qwen2, gemma3).
    Neox,
}

/// The input embedding's scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbedScale {
    None,
    /// `model.embedding_scale` from the configuration (MiniCPM).
    Config,
    /// `sqrt(n_embd)` in f32 (Gemma).
    SqrtEmbd,
}

/// What an architecture is: its tensors, the order of operations, scales and RoPE.
#[derive(Debug)]
pub struct ArchSpec {
    /// `general.architecture` in GGUF, `model.architecture` in a manifest.
    pub name: &'static str,
    /// Hugging Face `config.json` `architectures` entries that map to this one.
    pub hf_names: &'static [&'static str],
    pub rope: RopeMode,
    pub activation: Activation,
    pub embed_scale: EmbedScale,
    /// `blk.N.attn_{q,k,v}.bias` `[n_head * head_dim]`, `[n_head_kv * head_dim]` (qwen2).
    pub qkv_bias: bool,
    /// `blk.N.attn_{q,k}_norm.weight` `[head_dim]`: RMS norm of each head of Q and K before
    /// RoPE (gemma3).
    pub qk_norm: bool,
    /// `blk.N.post_attention_norm.weight` and `blk.N.post_ffw_norm.weight` `[n_embd]`: RMS
    /// norm of the attention and FFN outputs before the residual add (gemma3).
    pub post_norms: bool,
    /// MiniCPM's residual and logit scales (`model.residual_scale`, `model.logit_scale`).
    pub residual_and_logit_scales: bool,
    /// Interleaved sliding-window layers (gemma3): see [`Hyper::swa`].
    pub sliding_window: bool,
    /// The chat template (Jinja) used when the model file carries none.
    pub chat_template: Option<&'static str>,
    /// Architecture-specific checks of the configuration (beyond [`ModelConfig::check`]).
    pub check: fn(&ModelConfig) -> Result<(), ArchError>,
}

/// Every architecture the runtime implements.
pub const ALL: &[&ArchSpec] = &[&llama::SPEC, &minicpm::SPEC, &qwen2::SPEC, &gemma3::SPEC];

/// `llama, minicpm, qwen2, gemma3`.
pub fn supported_list() -> String {
    ALL.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
}

/// The architecture named `name` (`general.architecture`).
pub fn lookup(name: &str) -> Result<&'static ArchSpec, ArchError> {
    ALL.iter()
        .copied()
        .find(|a| a.name == name)
        .ok_or_else(|| ArchError::Unsupported {
            arch: name.to_string(),
        })
}

/// The architecture for a Hugging Face `architectures` entry (e.g. `Qwen2ForCausalLM`).
pub fn lookup_hf(hf_name: &str) -> Option<&'static ArchSpec> {
    ALL.iter().copied().find(|a| a.hf_names.contains(&hf_name))
}

/// A configuration the runtime can build a model from: [`ModelConfig::check`], an
/// implemented architecture and that architecture's own checks. What `pack`,
/// `gguf-to-ternary` and `palettize` run before writing anything.
pub fn check_config(cfg: &ModelConfig) -> Result<&'static ArchSpec, ArchError> {
    cfg.check()
        .map_err(|(field, detail)| ArchError::Config { field, detail })?;
    let spec = lookup(&cfg.architecture)?;
    (spec.check)(cfg)?;
    Ok(spec)
}

/// A tensor the graph reads: its name and row-major shape `[rows, cols]` (a vector is
/// `[1, n]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorRef {
    pub name: String,
    pub rows: u64,
    pub cols: u64,
}

/// The tensors of one layer: their names and shapes ([`TensorRef`], here), or what a backend
/// resolves them to (`T`, e.g. the runtime's located weights) through [`LayerLayout::map`].
#[derive(Clone, Debug)]
pub struct LayerLayout<T = TensorRef> {
    pub attn_norm: T,
    pub wq: T,
    pub wk: T,
    pub wv: T,
    pub wo: T,
    pub bq: Option<T>,
    pub bk: Option<T>,
    pub bv: Option<T>,
    pub q_norm: Option<T>,
    pub k_norm: Option<T>,
    pub post_attn_norm: Option<T>,
    pub ffn_norm: T,
    pub w_gate: T,
    pub w_up: T,
    pub w_down: T,
    pub post_ffn_norm: Option<T>,
}

impl<T> LayerLayout<T> {
    /// Every tensor of the layer.
    pub fn all(&self) -> Vec<&T> {
        let mut v = vec![
            &self.attn_norm,
            &self.wq,
            &self.wk,
            &self.wv,
            &self.wo,
            &self.ffn_norm,
            &self.w_gate,
            &self.w_up,
            &self.w_down,
        ];
        v.extend(
            [
                &self.bq,
                &self.bk,
                &self.bv,
                &self.q_norm,
                &self.k_norm,
                &self.post_attn_norm,
                &self.post_ffn_norm,
            ]
            .into_iter()
            .flatten(),
        );
        v
    }

    /// The matrices (what a matrix kernel reads), in graph order.
    pub fn matrices(&self) -> [&T; 7] {
        [
            &self.wq,
            &self.wk,
            &self.wv,
            &self.wo,
            &self.w_gate,
            &self.w_up,
            &self.w_down,
        ]
    }

    /// The same layer with every tensor resolved by `f` (the first error returned).
    pub fn map<U, E>(&self, mut f: impl FnMut(&T) -> Result<U, E>) -> Result<LayerLayout<U>, E> {
        let mut o = |t: &Option<T>| t.as_ref().map(&mut f).transpose();
        Ok(LayerLayout {
            bq: o(&self.bq)?,
            bk: o(&self.bk)?,
            bv: o(&self.bv)?,
            q_norm: o(&self.q_norm)?,
            k_norm: o(&self.k_norm)?,
            post_attn_norm: o(&self.post_attn_norm)?,
            post_ffn_norm: o(&self.post_ffn_norm)?,
            attn_norm: f(&self.attn_norm)?,
            wq: f(&self.wq)?,
            wk: f(&self.wk)?,
            wv: f(&self.wv)?,
            wo: f(&self.wo)?,
            ffn_norm: f(&self.ffn_norm)?,
            w_gate: f(&self.w_gate)?,
            w_up: f(&self.w_up)?,
            w_down: f(&self.w_down)?,
        })
    }
}

/// The numbers the graph needs beyond the tensors, resolved once from the configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Hyper {
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    pub n_ctx: usize,
    pub n_layer: usize,
    pub norm_eps: f32,
    /// Multiplies the gathered embedding row (1 when the architecture has none).
    pub embed_scale: Option<f32>,
    /// Multiplies each layer's attention and FFN output before the residual add (MiniCPM).
    pub residual_scale: Option<f32>,
    /// Multiplies the logits (MiniCPM: `1 / logit_scale`, computed in f32).
    pub logit_mul: Option<f32>,
    /// Multiplies Q after RoPE, with a softmax scale of 1 (Gemma); else `None` and the
    /// softmax scale is `1 / sqrt(head_dim)`.
    pub q_scale: Option<f32>,
    /// Rotated dimensions per head.
    pub n_rot: usize,
    pub rope_base: f32,
    /// RoPE frequency scale (1 / rope.scaling.factor for linear scaling, else 1).
    pub rope_freq_scale: f32,
    /// RoPE cos/sin multiplier (`rope.scaling.attn_factor`, else 1).
    pub rope_attn_factor: f32,
    /// Sliding-window attention: `Some` for architectures with interleaved local layers.
    pub swa: Option<Swa>,
    /// `tanh` soft cap of the logits: `c * tanh(logits / c)` (Gemma 2 style; none in Gemma 3
    /// unless the file sets `final_logit_softcapping`).
    pub final_softcap: Option<f32>,
}

/// Interleaved sliding-window attention (llama.cpp `LLAMA_SWA_TYPE_STANDARD`): on a layer
/// with `layers[il]` set, the token at position `p` attends to positions `j` with
/// `p - j < window` only, and RoPE uses `rope_base` (with frequency scale 1).
#[derive(Clone, Debug, PartialEq)]
pub struct Swa {
    pub window: usize,
    pub layers: Vec<bool>,
    pub rope_base: f32,
}

impl Hyper {
    /// RoPE base and frequency scale of layer `il`.
    pub fn rope_of_layer(&self, il: usize) -> (f32, f32) {
        match &self.swa {
            Some(s) if s.layers[il] => (s.rope_base, 1.0),
            _ => (self.rope_base, self.rope_freq_scale),
        }
    }

    /// The attention window of layer `il` (`None`: every earlier position).
    pub fn window_of_layer(&self, il: usize) -> Option<usize> {
        match &self.swa {
            Some(s) if s.layers[il] => Some(s.window),
            _ => None,
        }
    }
}

/// A model's tensors, located by name and checked against the configuration; no weight byte
/// is read.
#[derive(Clone, Debug)]
pub struct Layout {
    pub spec: &'static ArchSpec,
    pub cfg: ModelConfig,
    pub hyper: Hyper,
    pub tok_embd: TensorRef,
    pub output_norm: TensorRef,
    /// The head: `output.weight`, or `token_embd.weight` when tied.
    pub output: TensorRef,
    pub layers: Vec<LayerLayout>,
    /// RoPE frequency factors `[n_rot / 2]` (LongRoPE long or short, or `rope_freqs`).
    pub rope_factors: Option<TensorRef>,
}

impl Layout {
    /// Resolves the layout of `cfg` against the tensors `shape_of` knows (row-major shapes).
    /// Errors name the missing tensor, the wrong shape, or the configuration field.
    pub fn new(
        cfg: &ModelConfig,
        shape_of: &dyn Fn(&str) -> Option<Vec<u64>>,
    ) -> Result<Layout, ArchError> {
        let spec = check_config(cfg)?;
        let get = |name: &str, rows: u64, cols: u64| -> Result<TensorRef, ArchError> {
            let shape = shape_of(name).ok_or_else(|| ArchError::MissingTensor {
                tensor: name.to_string(),
            })?;
            let (r, c) = match shape.as_slice() {
                [n] => (1, *n),
                [r, c] => (*r, *c),
                s => {
                    return Err(ArchError::Shape {
                        tensor: name.into(),
                        detail: format!("expected 1 or 2 dimensions, found {s:?}"),
                    })
                }
            };
            if (r, c) != (rows, cols) {
                let want = if rows == 1 {
                    format!("[{cols}]")
                } else {
                    format!("[{rows}, {cols}]")
                };
                return Err(ArchError::Shape {
                    tensor: name.into(),
                    detail: format!("expected {want}, found {shape:?}"),
                });
            }
            Ok(TensorRef {
                name: name.into(),
                rows,
                cols,
            })
        };
        let (e, hd) = (cfg.n_embd, cfg.head_dim);
        let (nq, nkv) = (cfg.n_head * hd, cfg.n_head_kv * hd);
        let tok_embd = get("token_embd.weight", cfg.n_vocab, e)?;
        let output_norm = get("output_norm.weight", 1, e)?;
        let has_output = shape_of("output.weight").is_some();
        if cfg.tied_embeddings && has_output {
            return Err(ArchError::Config {
                field: "tied_embeddings".into(),
                detail: "true, but the bundle has an output.weight (the head would be ignored)"
                    .into(),
            });
        }
        let output = if cfg.tied_embeddings {
            tok_embd.clone()
        } else {
            get("output.weight", cfg.n_vocab, e)?
        };
        // A layer count the tensors cannot back is refused at the first missing tensor, not
        // allocated for here.
        let mut layers = Vec::new();
        for i in 0..cfg.n_layer {
            let g = |s: &str, r: u64, c: u64| get(&format!("blk.{i}.{s}"), r, c);
            let opt = |on: bool, s: &str, r: u64, c: u64| -> Result<Option<TensorRef>, ArchError> {
                if on {
                    g(s, r, c).map(Some)
                } else {
                    Ok(None)
                }
            };
            layers.push(LayerLayout {
                attn_norm: g("attn_norm.weight", 1, e)?,
                wq: g("attn_q.weight", nq, e)?,
                wk: g("attn_k.weight", nkv, e)?,
                wv: g("attn_v.weight", nkv, e)?,
                wo: g("attn_output.weight", e, nq)?,
                bq: opt(spec.qkv_bias, "attn_q.bias", 1, nq)?,
                bk: opt(spec.qkv_bias, "attn_k.bias", 1, nkv)?,
                bv: opt(spec.qkv_bias, "attn_v.bias", 1, nkv)?,
                q_norm: opt(spec.qk_norm, "attn_q_norm.weight", 1, hd)?,
                k_norm: opt(spec.qk_norm, "attn_k_norm.weight", 1, hd)?,
                post_attn_norm: opt(spec.post_norms, "post_attention_norm.weight", 1, e)?,
                ffn_norm: g("ffn_norm.weight", 1, e)?,
                w_gate: g("ffn_gate.weight", cfg.n_ff, e)?,
                w_up: g("ffn_up.weight", cfg.n_ff, e)?,
                w_down: g("ffn_down.weight", e, cfg.n_ff)?,
                post_ffn_norm: opt(spec.post_norms, "post_ffw_norm.weight", 1, e)?,
            });
        }
        let rope = &cfg.rope;
        // llama.cpp (llama-model.cpp get_rope_factors): LongRoPE uses the long factors when
        // the context exceeds the original training context, else the short ones.
        let factors_name = match rope.scaling_type.as_str() {
            "longrope" => {
                let orig = rope.original_context_length.unwrap_or(cfg.n_ctx_train);
                if cfg.n_ctx > orig {
                    rope.factors_long.clone()
                } else {
                    rope.factors_short.clone()
                }
            }
            _ => rope.freq_factors.clone(),
        };
        let rope_factors = match factors_name {
            Some(n) => Some(get(&n, 1, rope.dimension_count / 2)?),
            None => None,
        };
        let hyper = hyper(spec, cfg)?;
        Ok(Layout {
            spec,
            cfg: cfg.clone(),
            hyper,
            tok_embd,
            output_norm,
            output,
            layers,
            rope_factors,
        })
    }

    /// The layout of a manifest's model over its tensor table.
    pub fn of_manifest(m: &Manifest) -> Result<Layout, ArchError> {
        Layout::new(&m.model, &|name| {
            m.tensors
                .iter()
                .find(|t| t.name == name)
                .map(|t| t.shape.clone())
        })
    }

    /// Every tensor the graph reads, the head once even when tied.
    pub fn tensors(&self) -> Vec<&TensorRef> {
        let mut v = vec![&self.tok_embd, &self.output_norm];
        if !self.cfg.tied_embeddings {
            v.push(&self.output);
        }
        v.extend(self.rope_factors.iter());
        for l in &self.layers {
            v.extend(l.all());
        }
        v
    }
}

/// Whether every backend can build the model a manifest describes: the configuration's checks,
/// an implemented architecture, every tensor it needs present with the shape the configuration
/// implies. `convert verify` runs this.
pub fn check_manifest(m: &Manifest) -> Result<(), ArchError> {
    Layout::of_manifest(m).map(|_| ())
}

/// `{arch}.{key}` from the configuration's verbatim hyper-parameters.
pub fn hparam<'a>(cfg: &'a ModelConfig, key: &str) -> Option<&'a Json> {
    cfg.hparams.get(&format!("{}.{key}", cfg.architecture))
}

/// An unsigned integer hyper-parameter, or an error naming it.
pub fn hparam_u64(cfg: &ModelConfig, key: &str) -> Result<Option<u64>, ArchError> {
    match hparam(cfg, key) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| ArchError::Config {
            field: format!("hparams.{}.{key}", cfg.architecture),
            detail: format!("{v} is not an unsigned integer"),
        }),
    }
}

/// A finite number hyper-parameter, or an error naming it.
pub fn hparam_f64(cfg: &ModelConfig, key: &str) -> Result<Option<f64>, ArchError> {
    match hparam(cfg, key) {
        None => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x.is_finite() => Ok(Some(x)),
            _ => Err(ArchError::Config {
                field: format!("hparams.{}.{key}", cfg.architecture),
                detail: format!("{v} is not a finite number"),
            }),
        },
    }
}

fn hyper(spec: &ArchSpec, c: &ModelConfig) -> Result<Hyper, ArchError> {
    let rope = &c.rope;
    let rope_freq_scale = match (rope.scaling_type.as_str(), rope.scaling_factor) {
        ("linear", Some(f)) if f > 0.0 => 1.0 / f as f32,
        _ => 1.0,
    };
    let scales = spec.residual_and_logit_scales;
    let mut h = Hyper {
        n_embd: c.n_embd as usize,
        n_head: c.n_head as usize,
        n_head_kv: c.n_head_kv as usize,
        head_dim: c.head_dim as usize,
        n_ff: c.n_ff as usize,
        n_vocab: c.n_vocab as usize,
        n_ctx: c.n_ctx as usize,
        n_layer: c.n_layer as usize,
        norm_eps: c.norm_eps as f32,
        embed_scale: match spec.embed_scale {
            EmbedScale::None => None,
            EmbedScale::Config => Some(c.embedding_scale.unwrap_or(1.0) as f32),
            EmbedScale::SqrtEmbd => Some((c.n_embd as f32).sqrt()),
        },
        residual_scale: scales.then(|| c.residual_scale.unwrap_or(1.0) as f32),
        logit_mul: scales.then(|| 1.0f32 / c.logit_scale.unwrap_or(1.0) as f32),
        q_scale: None,
        n_rot: rope.dimension_count as usize,
        rope_base: rope.freq_base as f32,
        rope_freq_scale,
        rope_attn_factor: rope.attn_factor.map(|a| a as f32).unwrap_or(1.0),
        swa: None,
        final_softcap: None,
    };
    if spec.sliding_window {
        gemma3::hyper(c, &mut h)?;
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_architecture_is_found_by_its_names() {
        for a in ALL {
            assert_eq!(lookup(a.name).unwrap().name, a.name);
            for hf in a.hf_names {
                assert_eq!(lookup_hf(hf).unwrap().name, a.name);
            }
        }
        let e = lookup("mamba").unwrap_err().to_string();
        assert!(
            e.contains("\"mamba\"") && e.contains("llama, minicpm, qwen2, gemma3"),
            "{e}"
        );
    }
}
