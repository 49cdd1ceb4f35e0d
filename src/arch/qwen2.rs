//! `qwen2` (Qwen2, Qwen2.5, Qwen2.5-Coder): llama.cpp `src/models/qwen2.cpp` at b11434.
//!
//! llama's graph with two differences:
//!
//! ```text
//! q, k, v = Wq h + bq, Wk h + bk, Wv h + bv     (biases [n_head*head_dim], [n_head_kv*head_dim])
//! RoPE(q, k), pairs (i, i + n_rot/2) (NEOX)     (n_rot == head_dim, base 1e6 in Qwen2.5)
//! ```
//!
//! Tokenizer: byte-level BPE with the `qwen2` pre-tokenizer (single digits). Head untied in
//! the Q4_K_M files (Q8_0), tied in others.

use super::{hparam_u64, Activation, ArchError, ArchSpec, EmbedScale, RopeMode};
use crate::bundle::manifest::ModelConfig;

pub const SPEC: ArchSpec = ArchSpec {
    name: "qwen2",
    hf_names: &["Qwen2ForCausalLM"],
    rope: RopeMode::Neox,
    activation: Activation::Silu,
    embed_scale: EmbedScale::None,
    qkv_bias: true,
    qk_norm: false,
    post_norms: false,
    residual_and_logit_scales: false,
    sliding_window: false,
    chat_template: None,
    check,
};

/// llama.cpp asserts `n_rot == head_dim` and `value_length == key_length` for this graph.
fn check(c: &ModelConfig) -> Result<(), ArchError> {
    if c.rope.dimension_count != c.head_dim {
        return Err(ArchError::Config {
            field: "rope.dimension_count".into(),
            detail: format!(
                "{} must equal head_dim {} for qwen2",
                c.rope.dimension_count, c.head_dim
            ),
        });
    }
    if let Some(v) = hparam_u64(c, "attention.value_length")? {
        if v != c.head_dim {
            return Err(ArchError::Config {
                field: "hparams.qwen2.attention.value_length".into(),
                detail: format!("{v} must equal head_dim {}", c.head_dim),
            });
        }
    }
    Ok(())
}
