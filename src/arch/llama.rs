//! `llama` (Llama 2/3, SmolLM2, ...): llama.cpp `src/models/llama.cpp` at b11434.
//!
//! ```text
//! x = token_embd[token]
//! per layer:
//!   h = rms_norm(x) * attn_norm
//!   q, k, v = Wq h, Wk h, Wv h;  RoPE(q, k), adjacent pairs (NORM)
//!   x = x + Wo softmax(q k^T / sqrt(head_dim)) v      (grouped-query: head h reads KV head h / (n_head / n_head_kv))
//!   h = rms_norm(x) * ffn_norm
//!   x = x + Wdown (silu(Wgate h) * Wup h)
//! logits = Wout (rms_norm(x) * output_norm)            (Wout = token_embd when tied)
//! ```

use super::{Activation, ArchSpec, EmbedScale, RopeMode};

pub const SPEC: ArchSpec = ArchSpec {
    name: "llama",
    hf_names: &["LlamaForCausalLM"],
    rope: RopeMode::Norm,
    activation: Activation::Silu,
    embed_scale: EmbedScale::None,
    qkv_bias: false,
    qk_norm: false,
    post_norms: false,
    residual_and_logit_scales: false,
    sliding_window: false,
    chat_template: None,
    check: |_| Ok(()),
};
