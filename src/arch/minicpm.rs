//! `minicpm` (MiniCPM 1-4): llama's graph with three scales, as llama.cpp builds it
//! (`src/models/minicpm.cpp`, through the granite graph, at b11434):
//!
//! ```text
//! x = token_embd[token] * embedding_scale
//! per layer: llama's, each residual add  x = x + residual_scale * (...)
//! logits = (Wout (rms_norm(x) * output_norm)) * (1 / logit_scale)
//! ```
//!
//! RoPE: adjacent pairs, with LongRoPE factors (long when `n_ctx` exceeds the original
//! context, else short). Defaults for files without the scales (computed in f32 as llama.cpp
//! does): embedding 12, residual `1.4 / sqrt(n_layer)`, logit `256 / n_embd`; applied where
//! the GGUF is read (`bundle::config`).

use super::{Activation, ArchSpec, EmbedScale, RopeMode};

pub const SPEC: ArchSpec = ArchSpec {
    name: "minicpm",
    hf_names: &["MiniCPMForCausalLM"],
    rope: RopeMode::Norm,
    activation: Activation::Silu,
    embed_scale: EmbedScale::Config,
    qkv_bias: false,
    qk_norm: false,
    post_norms: false,
    residual_and_logit_scales: true,
    sliding_window: false,
    chat_template: None,
    check: |_| Ok(()),
};
