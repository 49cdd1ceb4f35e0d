//! The runtime: loads a checked bundle and decodes one token per step through a [`Backend`].
//!
//! The bundle's function "main" is the contract: `step(token_id, position) -> logits[n_vocab]`
//! with the KV cache as state mutated in place. A prompt runs as pipelined single-token steps
//! (positions 0, 1, 2, ...), then generation continues one token per step.
//!
//! Refused before any work: a token id outside the vocabulary, a position at or past the
//! bundle's context, a prompt plus `max_tokens` longer than the context (never truncated).
//! Non-finite logits stop generation with an error naming the step.

pub mod cpu;
pub mod matvec;
pub mod model;
pub mod q8;
pub mod validate;

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::bundle::reader::Bundle;
use crate::bundle::BundleError;

/// Runtime errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error("architecture {arch:?} is not supported by the runtime (supported: llama, minicpm)")]
    Architecture { arch: String },
    #[error("manifest.json model.{field}: {detail}")]
    Config { field: String, detail: String },
    #[error("KV cache for n_ctx = {n_ctx}: {detail}; rebuild the bundle with a smaller --context")]
    KvCache { n_ctx: u64, detail: String },
    #[error("tensor {tensor:?} is missing from the bundle")]
    MissingTensor { tensor: String },
    #[error("tensor {tensor:?}: {detail}")]
    Shape { tensor: String, detail: String },
    #[error("tensor {tensor:?}: {detail}")]
    Encoding { tensor: String, detail: String },
    #[error("token id {token} is outside the vocabulary (n_vocab = {n_vocab})")]
    TokenOutOfRange { token: u32, n_vocab: u64 },
    #[error("position {pos} is at or past the bundle's context n_ctx = {n_ctx}")]
    PositionOutOfRange { pos: usize, n_ctx: u64 },
    #[error("position {pos} given, but positions are contiguous from 0 and {expected} is next")]
    NonContiguous { pos: usize, expected: usize },
    #[error("prompt of {prompt} tokens plus --max-tokens {max_tokens} is {total} tokens, more than the bundle's context n_ctx = {n_ctx}; rebuild the bundle with a larger --context or shorten the input")]
    TooLong {
        prompt: usize,
        max_tokens: usize,
        total: usize,
        n_ctx: usize,
    },
    #[error("the prompt is empty (no tokens)")]
    EmptyPrompt,
    #[error("non-finite logits at step {step} (position {pos})")]
    NonFinite { step: usize, pos: usize },
    #[error("sampling: {0}")]
    Sampling(String),
}

/// A decode backend: one token per step, KV cache as internal state.
pub trait Backend {
    fn name(&self) -> &'static str;
    fn n_vocab(&self) -> usize;
    fn n_ctx(&self) -> usize;
    /// Runs one step: `token` at `pos` (contiguous from 0). Returns the logits `[n_vocab]`.
    fn step(&mut self, token: u32, pos: usize) -> Result<&[f32], RuntimeError>;
    /// Forgets the sequence (the next step must be position 0).
    fn reset(&mut self);
}

/// Opens, checks and loads a bundle onto the CPU backend.
pub fn load_cpu(bundle_dir: &Path) -> Result<cpu::CpuBackend, RuntimeError> {
    let bundle = Bundle::open(bundle_dir)?;
    let model = model::Model::new(bundle)?;
    cpu::CpuBackend::new(model)
}

/// Sampling settings. `temperature == 0` is greedy (argmax, lowest id on ties).
#[derive(Clone, Debug)]
pub struct SamplerConfig {
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p` (1: all).
    pub top_p: f32,
    pub seed: u64,
    /// Token ids never sampled (their logits count as -inf), as llama.cpp's `--ignore-eos`
    /// bans the end-of-generation ids.
    pub banned: Vec<u32>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            seed: 0,
            banned: Vec::new(),
        }
    }
}

/// Picks tokens from logits.
pub struct Sampler {
    cfg: SamplerConfig,
    rng: ChaCha8Rng,
}

/// Index of the largest value, lowest index on ties.
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Result<Sampler, RuntimeError> {
        if !(cfg.temperature.is_finite() && cfg.temperature >= 0.0) {
            return Err(RuntimeError::Sampling(format!(
                "--temperature {} must be a finite number >= 0",
                cfg.temperature
            )));
        }
        // top_p only matters when sampling (temperature > 0).
        if cfg.temperature > 0.0 && !(cfg.top_p > 0.0 && cfg.top_p <= 1.0) {
            return Err(RuntimeError::Sampling(format!(
                "--top-p {} must be in (0, 1] when sampling (--temperature {})",
                cfg.top_p, cfg.temperature
            )));
        }
        Ok(Sampler {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
        })
    }

    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let masked;
        let logits = if self.cfg.banned.is_empty() {
            logits
        } else {
            let mut m = logits.to_vec();
            for &t in &self.cfg.banned {
                if let Some(v) = m.get_mut(t as usize) {
                    *v = f32::NEG_INFINITY;
                }
            }
            masked = m;
            &masked
        };
        if self.cfg.temperature == 0.0 {
            return argmax(logits) as u32;
        }
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        // Stable order: by logit descending, then id ascending.
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if self.cfg.top_k > 0 {
            idx.truncate(self.cfg.top_k);
        }
        let m = logits[idx[0]];
        let mut p: Vec<f64> = idx
            .iter()
            .map(|&i| (((logits[i] - m) / self.cfg.temperature) as f64).exp())
            .collect();
        let s: f64 = p.iter().sum();
        p.iter_mut().for_each(|x| *x /= s);
        let mut cum = 0.0;
        let mut keep = p.len();
        for (i, x) in p.iter().enumerate() {
            cum += x;
            if cum >= self.cfg.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        let total: f64 = p[..keep].iter().sum();
        let mut r = self.rng.random::<f64>() * total;
        for (i, x) in p[..keep].iter().enumerate() {
            if r < *x {
                return idx[i] as u32;
            }
            r -= x;
        }
        idx[keep - 1] as u32
    }
}

/// Timing of a generation.
#[derive(Clone, Debug, Default)]
pub struct GenStats {
    pub prompt_tokens: usize,
    pub generated: usize,
    /// Decode steps run (the first generated token comes from the prompt's last step).
    pub decode_steps: usize,
    pub prompt_seconds: f64,
    pub decode_seconds: f64,
}

impl GenStats {
    pub fn prompt_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_seconds.max(1e-9)
    }
    pub fn decode_tps(&self) -> f64 {
        self.decode_steps as f64 / self.decode_seconds.max(1e-9)
    }
}

/// Runs the prompt as single-token steps, then generates up to `max_tokens` tokens, calling
/// `on_token(id)` for each generated one; stops early when `stop(id)` says so (the stop token
/// is still reported). All limits are checked before the first step.
pub fn generate(
    backend: &mut dyn Backend,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    stop: &dyn Fn(u32) -> bool,
    on_token: &mut dyn FnMut(u32),
) -> Result<(Vec<u32>, GenStats), RuntimeError> {
    if prompt.is_empty() {
        return Err(RuntimeError::EmptyPrompt);
    }
    let n_vocab = backend.n_vocab();
    if let Some(&t) = prompt.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(RuntimeError::TokenOutOfRange {
            token: t,
            n_vocab: n_vocab as u64,
        });
    }
    let n_ctx = backend.n_ctx();
    // The last generated token is never fed back, so prompt + max_tokens - 1 steps run.
    let total = prompt.len().saturating_add(max_tokens);
    if total > n_ctx {
        return Err(RuntimeError::TooLong {
            prompt: prompt.len(),
            max_tokens,
            total,
            n_ctx,
        });
    }
    backend.reset();
    let mut stats = GenStats {
        prompt_tokens: prompt.len(),
        ..Default::default()
    };
    let t0 = std::time::Instant::now();
    let mut next = 0u32;
    for (pos, &t) in prompt.iter().enumerate() {
        let logits = backend.step(t, pos)?;
        if pos + 1 == prompt.len() {
            if logits.iter().any(|v| !v.is_finite()) {
                return Err(RuntimeError::NonFinite { step: pos, pos });
            }
            next = sampler.sample(logits);
        }
    }
    stats.prompt_seconds = t0.elapsed().as_secs_f64();
    let mut out = Vec::with_capacity(max_tokens);
    let t1 = std::time::Instant::now();
    let mut pos = prompt.len();
    while out.len() < max_tokens {
        out.push(next);
        on_token(next);
        if stop(next) || out.len() == max_tokens {
            break;
        }
        let logits = backend.step(next, pos)?;
        if logits.iter().any(|v| !v.is_finite()) {
            return Err(RuntimeError::NonFinite { step: pos, pos });
        }
        next = sampler.sample(logits);
        pos += 1;
        stats.decode_steps += 1;
    }
    stats.decode_seconds = t1.elapsed().as_secs_f64();
    stats.generated = out.len();
    Ok((out, stats))
}
