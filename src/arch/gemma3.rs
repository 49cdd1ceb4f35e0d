//! `gemma3` (Gemma 3 text models, 270M to 27B): llama.cpp `src/models/gemma3.cpp` at b11434.
//!
//! ```text
//! x = token_embd[token] * sqrt(n_embd)                       (f32)
//! per layer il:
//!   h = rms_norm(x) * attn_norm
//!   q, k, v = Wq h, Wk h, Wv h
//!   q = rms_norm(q per head) * attn_q_norm;  k = rms_norm(k per head) * attn_k_norm
//!   RoPE(q, k), pairs (i, i + n_rot/2) (NEOX), base: rope.freq_base_swa (default 10000,
//!       frequency scale 1) on sliding-window layers, rope.freq_base on global ones
//!   q = q * attention_scale                                  (1/sqrt(head_dim); 27B: 1/sqrt(n_embd/n_head))
//!   a = Wo softmax(q k^T) v   over positions p - j < sliding_window on sliding-window layers
//!   x = x + rms_norm(a) * post_attention_norm
//!   h = rms_norm(x) * ffn_norm
//!   x = x + rms_norm(Wdown (gelu_tanh(Wgate h) * Wup h)) * post_ffw_norm
//! logits = token_embd (rms_norm(x) * output_norm)            (tied head)
//!          [then c * tanh(logits / c) if final_logit_softcapping = c is set]
//! ```
//!
//! Sliding-window layers: `il % pattern < pattern - 1` with `pattern` from
//! `attention.sliding_window_pattern` (default 6: five local layers, then one global), or
//! that key's per-layer booleans. Without `attention.sliding_window` every layer is global.
//! The norm weights in GGUF already include Gemma's `+ 1`.

use super::{hparam, hparam_f64, hparam_u64, Activation, ArchError, ArchSpec, EmbedScale};
use super::{Hyper, RopeMode, Swa};
use crate::bundle::manifest::ModelConfig;

pub const SPEC: ArchSpec = ArchSpec {
    name: "gemma3",
    hf_names: &[],
    rope: RopeMode::Neox,
    activation: Activation::GeluTanh,
    embed_scale: EmbedScale::SqrtEmbd,
    qkv_bias: false,
    qk_norm: true,
    post_norms: true,
    residual_and_logit_scales: false,
    sliding_window: true,
    chat_template: Some(CHAT_TEMPLATE),
    check: |c| super::hyper(&SPEC, c).map(|_| ()),
};

/// Gemma's turn format (the `chat_template` of Gemma 3's Hugging Face tokenizer config, text
/// models): used when the GGUF carries no template, as the Gemma 3 270M file does (llama.cpp
/// falls back to ChatML there, which this model was not trained on).
pub const CHAT_TEMPLATE: &str = "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}{%- set role = message['role'] -%}{%- endif -%}{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}";

fn bad(c: &ModelConfig, key: &str, detail: String) -> ArchError {
    ArchError::Config {
        field: format!("hparams.{}.{key}", c.architecture),
        detail,
    }
}

/// Fills Gemma 3's sliding window, attention scale and soft cap into `h`.
pub(super) fn hyper(c: &ModelConfig, h: &mut Hyper) -> Result<(), ArchError> {
    if let Some(v) = hparam_u64(c, "attention.value_length")? {
        if v != c.head_dim {
            return Err(bad(
                c,
                "attention.value_length",
                format!(
                    "{v} must equal head_dim (attention.key_length) {}",
                    c.head_dim
                ),
            ));
        }
    }
    let n_layer = c.n_layer as usize;
    let window = hparam_u64(c, "attention.sliding_window")?;
    // llama.cpp masks every key where p - j >= n_swa: a window of 0 masks them all.
    if window == Some(0) {
        return Err(bad(
            c,
            "attention.sliding_window",
            "0 is a window of no positions (every key masked on the sliding-window layers); \
             leave the key out for global attention on every layer"
                .to_string(),
        ));
    }
    h.swa = match window {
        None => None,
        Some(w) => {
            let layers: Vec<bool> = match hparam(c, "attention.sliding_window_pattern") {
                Some(serde_json::Value::Array(a)) => {
                    if a.len() != n_layer {
                        return Err(bad(
                            c,
                            "attention.sliding_window_pattern",
                            format!("{} entries for {n_layer} layers", a.len()),
                        ));
                    }
                    a.iter()
                        .map(|v| {
                            v.as_bool().ok_or_else(|| {
                                bad(
                                    c,
                                    "attention.sliding_window_pattern",
                                    format!("entry {v} is not a boolean"),
                                )
                            })
                        })
                        .collect::<Result<_, _>>()?
                }
                _ => {
                    let p = hparam_u64(c, "attention.sliding_window_pattern")?.unwrap_or(6);
                    (0..n_layer as u64)
                        .map(|il| p == 0 || il % p < p - 1)
                        .collect()
                }
            };
            let base = hparam_f64(c, "rope.freq_base_swa")?.unwrap_or(10000.0);
            if base <= 0.0 {
                return Err(bad(
                    c,
                    "rope.freq_base_swa",
                    format!("{base} must be positive"),
                ));
            }
            Some(Swa {
                window: usize::try_from(w).unwrap_or(usize::MAX),
                layers,
                rope_base: base as f32,
            })
        }
    };
    // llama.cpp: 1/sqrt(n_embd_head_k), except the 27B model (62 layers): 1/sqrt(n_embd/n_head).
    let d = if c.n_layer == 62 {
        (c.n_embd / c.n_head) as f32
    } else {
        c.head_dim as f32
    };
    h.q_scale = Some(1.0f32 / d.sqrt());
    h.final_softcap = match hparam_f64(c, "final_logit_softcapping")? {
        None => None,
        Some(0.0) => None,
        Some(x) if x > 0.0 => Some(x as f32),
        Some(x) => {
            return Err(bad(
                c,
                "final_logit_softcapping",
                format!("{x} must be positive"),
            ))
        }
    };
    Ok(())
}
