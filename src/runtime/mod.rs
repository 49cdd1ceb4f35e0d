//! The runtime: loads a checked bundle onto a backend and runs it.
//!
//! # The backend contract
//!
//! [`load`] opens a bundle (every file hashed and checked first), builds the model's
//! [`crate::arch::Layout`] and hands it to the backend named by [`BackendKind`]. A
//! [`Backend`] holds one sequence: its KV cache and the position it has reached.
//!
//! - Positions are contiguous from 0: [`Backend::prefill`] of a span `tokens` at `start`, or
//!   [`Backend::decode`] of one token at `pos`, must begin where the sequence stands
//!   ([`Backend::position`]); [`Backend::reset`] starts a new sequence at 0 (the KV cache is
//!   overwritten as positions are reached again, never read past the sequence).
//! - A prefill span holds at most the largest of the backend's prefill buckets
//!   ([`BackendInfo::buckets`]); [`run_prompt`] cuts a prompt into the fewest such chunks.
//! - After either call the backend holds the logits of the last position it ran:
//!   [`Backend::argmax`] picks the greedy token without copying them, [`Backend::logits`]
//!   gives them (a copy from the device on a GPU).
//! - Refused before any work, with the sequence unchanged: a token id outside the vocabulary,
//!   a position other than the next one, a span past the context `n_ctx` or longer than the
//!   largest bucket, an empty span.
//!
//! The bundle's functions are the static-shape form of the same contract: `main` is one
//! decode step (`input_ids [1,1]`), `prefill_S` one chunk of a fixed length `S`
//! (`input_ids [1,S]`, the tail past the prompt padded and masked). A prompt runs as prefill
//! chunks, then generation continues one token per decode step. With the int8 kernel (the
//! default) and with the f32 reference alike, a chunk's logits have the same bits as running
//! its tokens as single decode steps.
//!
//! Non-finite logits stop generation with an error naming the step and the position.

pub mod cpu;
pub mod gpu;
pub mod matvec;
pub mod model;
pub mod q8;
mod team;
pub mod validate;

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::arch::ArchError;
use crate::bundle::reader::Bundle;
use crate::bundle::BundleError;

pub use cpu::KvType;
pub use matvec::Kernel;

/// Runtime errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(transparent)]
    Arch(#[from] ArchError),
    #[error("KV cache for n_ctx = {n_ctx}: {detail}; rebuild the bundle with a smaller --context")]
    KvCache { n_ctx: u64, detail: String },
    #[error("tensor {tensor:?}: {detail}")]
    Encoding { tensor: String, detail: String },
    #[error("token id {token} is outside the vocabulary (n_vocab = {n_vocab})")]
    TokenOutOfRange { token: u32, n_vocab: u64 },
    #[error("position {pos} is at or past the bundle's context n_ctx = {n_ctx}")]
    PositionOutOfRange { pos: usize, n_ctx: u64 },
    #[error("position {pos} given, but positions are contiguous from 0 and {expected} is next")]
    NonContiguous { pos: usize, expected: usize },
    #[error("prefill of {len} tokens: more than the largest prefill bucket {max}")]
    SpanTooLong { len: usize, max: usize },
    #[error("prompt of {prompt} tokens plus --max-tokens {max_tokens} is {total} tokens, more than the bundle's context n_ctx = {n_ctx}; rebuild the bundle with a larger --context or shorten the input")]
    TooLong {
        prompt: usize,
        max_tokens: usize,
        total: u128,
        n_ctx: usize,
    },
    #[error("the prompt is empty (no tokens)")]
    EmptyPrompt,
    #[error("non-finite logits at generation step {step} (position {pos})")]
    NonFinite { step: usize, pos: usize },
    #[error("sampling: {0}")]
    Sampling(String),
    #[error("prefill buckets {buckets:?}: {detail}")]
    Buckets { buckets: Vec<u64>, detail: String },
    #[error("{bundle}: {detail}")]
    Functions {
        bundle: std::path::PathBuf,
        detail: String,
    },
    #[error("backend {name:?}: {detail}")]
    Backend { name: String, detail: String },
}

/// The backends [`load`] knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// The CPU reference: f32 or int8 activations, f16 or f32 KV cache.
    Cpu,
    /// wgpu (Vulkan, Metal, DX12): f32 activations, f16 KV cache.
    Gpu,
}

impl std::str::FromStr for BackendKind {
    type Err = RuntimeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(BackendKind::Cpu),
            "gpu" => Ok(BackendKind::Gpu),
            other => Err(RuntimeError::Backend {
                name: other.into(),
                detail: "unknown backend (this build has: cpu, gpu)".into(),
            }),
        }
    }
}

/// How a backend is set up.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Matrix kernel (int8 activations by default).
    pub kernel: Kernel,
    pub kv: KvType,
    /// Prefill chunk lengths to use instead of the bundle's `prefill_S` functions (`[1]` runs a
    /// prompt as single decode steps).
    pub buckets: Option<Vec<usize>>,
    /// GPU: the adapter (`--gpu-adapter`); the first discrete GPU when `None`.
    pub gpu_adapter: Option<gpu::AdapterSelector>,
    /// GPU: use the workgroup-memory reductions even where subgroup operations exist.
    pub gpu_no_subgroups: bool,
    /// GPU: the bytes of device memory the model may take (`--gpu-memory`); `None`: the
    /// adapter's own figure, where the driver gives one.
    pub gpu_memory: Option<u64>,
    /// GPU: the most bytes one storage binding may cover, below the adapter's own limit (a
    /// test knob: weights then split into more row chunks, and the prefill logits tail takes
    /// only a bucket whose `[S, n_vocab]` logits fit, else the per-token fallback); `None`:
    /// the adapter's limit.
    pub gpu_max_binding_bytes: Option<u64>,
    /// GPU: the WGSL modules to compile. [`load`] fills in the bundle's own when `None`
    /// ([`gpu::kernels::from_bundle`]: a bundle without kernels is refused);
    /// `GpuBackend::new` given `None` compiles the ones built into this binary.
    pub gpu_sources: Option<std::collections::HashMap<String, String>>,
    /// Load only a bundle signed by one of these keys (`--trusted-key`,
    /// [`Bundle::open_trusted`]); any bundle when empty.
    pub trusted_keys: Vec<crate::bundle::sign::PublicKey>,
}

/// What a loaded backend is (what `bench --json` prints).
#[derive(Clone, Debug, Serialize)]
pub struct BackendInfo {
    pub backend: &'static str,
    pub architecture: String,
    /// `f32` (the exact reference) or `int8`; on the GPU, where only the ternary decode
    /// products take int8 activations, `int8` when all of them do, `f32` when none does
    /// (a model without ternary weights included) and `int8+f32` when some fell back.
    pub kernel: &'static str,
    /// `f16` or `f32`.
    pub kv_cache: &'static str,
    pub kv_cache_bytes: u64,
    pub weight_bytes: u64,
    /// Weight bytes one decode step reads.
    pub decode_bytes_per_token: u64,
    /// Prefill chunk lengths, ascending.
    pub buckets: Vec<usize>,
    /// Where the buckets come from: `bundle` (its `prefill_S` functions), `default` (a bundle
    /// made before prefill functions existed) or `override`.
    pub buckets_from: &'static str,
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub threads: usize,
    /// The CPU kernels' level ([`crate::isa::detect`], [`crate::isa::Isa::name`]: `avx512vnni`,
    /// `avx2`, `neon-dot`, `neon` or `portable`); absent on the GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_level: Option<&'static str>,
    /// The GPU adapter (name, API, driver); absent on the CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Dispatches one decode step records (GPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dispatches_per_token: Option<usize>,
    /// Bytes of weights on the device (GPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_weight_bytes: Option<u64>,
}

/// One sequence on a device: the KV cache and the position reached (see the module doc).
pub trait Backend {
    fn info(&self) -> BackendInfo;
    fn n_vocab(&self) -> usize;
    fn n_ctx(&self) -> usize;
    /// The next position (the number of tokens in the sequence).
    fn position(&self) -> usize;
    /// Runs `tokens` at positions `start..start + tokens.len()` as one chunk (at most the
    /// largest bucket); keeps the last position's logits.
    fn prefill(&mut self, tokens: &[u32], start: usize) -> Result<(), RuntimeError>;
    /// Runs `tokens` as [`Backend::prefill`] does and appends the logits of the span's
    /// positions `from..tokens.len()` to `out` (`(tokens.len() - from) * n_vocab` values,
    /// row-major); what perplexity and log-likelihood scoring read. Each row equals the
    /// logits [`Backend::logits`] gives after running the same tokens one decode step at a
    /// time. The default runs the span's first `from` tokens as one prefill, then one decode
    /// step per scored position.
    fn prefill_logits(
        &mut self,
        tokens: &[u32],
        start: usize,
        from: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), RuntimeError> {
        check_rows(tokens.len(), from)?;
        prefill_logits_by_steps(self, tokens, start, from, out)
    }
    /// Runs one token at `pos`; keeps its logits.
    fn decode(&mut self, token: u32, pos: usize) -> Result<(), RuntimeError>;
    /// The last position's logits `[n_vocab]`.
    fn logits(&mut self) -> Result<&[f32], RuntimeError>;
    /// The greedy token of the last position (lowest id on ties), never one of `banned`;
    /// `None` when a logit is not finite.
    fn argmax(&mut self, banned: &[u32]) -> Result<Option<u32>, RuntimeError>;
    /// Starts a new sequence at position 0.
    fn reset(&mut self);
    /// Cuts the sequence back to its first `pos` tokens (`pos <= position()`): the next span
    /// starts at `pos`, and what was cached past it is overwritten as positions are reached
    /// again. Scoring several continuations of one context runs the context once. No logits
    /// are held afterwards. Errors when `pos` is past the sequence.
    fn rewind(&mut self, pos: usize) -> Result<(), RuntimeError>;

    /// Greedy decoding from `first`, the token at `pos`: runs up to `max` decode steps, each
    /// on the previous step's greedy token (never one of `banned`), and hands each new token
    /// to `on_token` in order; stops when it returns false. Returns the steps whose tokens
    /// were handed over. A backend may run one step ahead of `on_token` (the GPU submits
    /// step t + 1 before step t's token reaches the host); the sequence then holds that step
    /// too ([`Backend::position`] says where it stands).
    fn decode_greedy(
        &mut self,
        first: u32,
        pos: usize,
        max: usize,
        banned: &[u32],
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<usize, RuntimeError> {
        greedy_steps(self, first, pos, max, banned, on_token)
    }
}

/// [`Backend::decode_greedy`] one step at a time: decode, then the backend's argmax.
pub fn greedy_steps<B: Backend + ?Sized>(
    be: &mut B,
    first: u32,
    pos: usize,
    max: usize,
    banned: &[u32],
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<usize, RuntimeError> {
    let mut tok = first;
    let mut steps = 0;
    while steps < max {
        be.decode(tok, pos + steps)?;
        steps += 1;
        tok = be.argmax(banned)?.ok_or(RuntimeError::NonFinite {
            step: steps,
            pos: pos + steps - 1,
        })?;
        if !on_token(tok) {
            break;
        }
    }
    Ok(steps)
}

/// [`Backend::rewind`]: `pos` within the sequence of `len` tokens.
pub fn check_rewind(pos: usize, len: usize) -> Result<(), RuntimeError> {
    if pos > len {
        return Err(RuntimeError::NonContiguous { pos, expected: len });
    }
    Ok(())
}

/// [`Backend::prefill_logits`] the slow way (the trait's default, and the GPU's where no
/// bucket's logits fit a binding): the first `from` tokens as one prefill, then one decode
/// step per scored position, its logits appended to `out`.
pub fn prefill_logits_by_steps<B: Backend + ?Sized>(
    be: &mut B,
    tokens: &[u32],
    start: usize,
    from: usize,
    out: &mut Vec<f32>,
) -> Result<(), RuntimeError> {
    if from > 0 {
        be.prefill(&tokens[..from], start)?;
    }
    for (i, &t) in tokens.iter().enumerate().skip(from) {
        be.decode(t, start + i)?;
        out.extend_from_slice(be.logits()?);
    }
    Ok(())
}

/// [`Backend::prefill_logits`]: the first scored row `from` lies inside a span of `len`.
pub fn check_rows(len: usize, from: usize) -> Result<(), RuntimeError> {
    if from >= len {
        return Err(RuntimeError::Backend {
            name: "prefill_logits".into(),
            detail: format!("first scored row {from} is not inside the span of {len} tokens"),
        });
    }
    Ok(())
}

/// The checks of the backend contract, before any work: a non-empty span, ids in the
/// vocabulary, every position inside the context, starting at the next position `next`, at
/// most `max` tokens (the largest bucket).
pub fn check_span(
    tokens: &[u32],
    start: usize,
    max: usize,
    n_vocab: u64,
    n_ctx: u64,
    next: usize,
) -> Result<(), RuntimeError> {
    if tokens.is_empty() {
        return Err(RuntimeError::EmptyPrompt);
    }
    if let Some(&t) = tokens.iter().find(|&&t| t as u64 >= n_vocab) {
        return Err(RuntimeError::TokenOutOfRange { token: t, n_vocab });
    }
    let last = start.saturating_add(tokens.len() - 1);
    if last as u64 >= n_ctx {
        return Err(RuntimeError::PositionOutOfRange { pos: last, n_ctx });
    }
    if start != next {
        return Err(RuntimeError::NonContiguous {
            pos: start,
            expected: next,
        });
    }
    if tokens.len() > max {
        return Err(RuntimeError::SpanTooLong {
            len: tokens.len(),
            max,
        });
    }
    Ok(())
}

/// Opens, checks and loads a bundle onto the backend `kind`.
pub fn load(
    kind: BackendKind,
    bundle_dir: &Path,
    opts: &LoadOptions,
) -> Result<Box<dyn Backend + Send>, RuntimeError> {
    match kind {
        BackendKind::Cpu => Ok(Box::new(load_cpu_with(bundle_dir, opts)?)),
        BackendKind::Gpu => {
            let model = open_model_trusted(bundle_dir, &opts.trusted_keys)?;
            // The GPU compiles only the kernels the bundle carries (checked with every other
            // file when it was opened); a bundle made before kernels shipped is refused with
            // the command that adds them.
            let mut opts = opts.clone();
            if opts.gpu_sources.is_none() {
                opts.gpu_sources = Some(
                    gpu::kernels::from_bundle(&model.bundle)
                        .map_err(|e| RuntimeError::Bundle(e.into()))?,
                );
            }
            Ok(Box::new(gpu::backend::GpuBackend::new(model, &opts)?))
        }
    }
}

/// Opens and checks a bundle and resolves its model: the configuration first (its errors
/// name the field), then the function table it implies, then the layout and encodings.
pub fn open_model(bundle_dir: &Path) -> Result<model::Model, RuntimeError> {
    open_model_trusted(bundle_dir, &[])
}

/// [`open_model`] of a bundle that must be signed by one of `trusted` (any bundle when empty;
/// [`Bundle::open_trusted`]).
pub fn open_model_trusted(
    bundle_dir: &Path,
    trusted: &[crate::bundle::sign::PublicKey],
) -> Result<model::Model, RuntimeError> {
    let bundle = Bundle::open_trusted(bundle_dir, trusted)?;
    crate::arch::check_config(&bundle.manifest.model)?;
    if let Some(f) = crate::bundle::verify::function_table_faults(&bundle.manifest)
        .into_iter()
        .next()
    {
        return Err(RuntimeError::Functions {
            bundle: bundle_dir.to_path_buf(),
            detail: f,
        });
    }
    model::Model::new(bundle)
}

/// Opens, checks and loads a bundle onto the CPU backend with the exact f32 reference kernel
/// (the backend every other is held to).
pub fn load_cpu(bundle_dir: &Path) -> Result<cpu::CpuBackend, RuntimeError> {
    load_cpu_with(
        bundle_dir,
        &LoadOptions {
            kernel: Kernel::F32,
            ..Default::default()
        },
    )
}

/// Opens, checks and loads a bundle onto the CPU backend.
pub fn load_cpu_with(
    bundle_dir: &Path,
    opts: &LoadOptions,
) -> Result<cpu::CpuBackend, RuntimeError> {
    cpu::CpuBackend::new(open_model_trusted(bundle_dir, &opts.trusted_keys)?, opts)
}

/// Checks a prefill bucket list against the context
/// ([`crate::bundle::manifest::check_prefill_buckets`]).
pub fn check_buckets(buckets: &[u64], n_ctx: u64) -> Result<(), RuntimeError> {
    crate::bundle::manifest::check_prefill_buckets(buckets, n_ctx).map_err(|detail| {
        RuntimeError::Buckets {
            buckets: buckets.to_vec(),
            detail,
        }
    })
}

/// How a prompt of `n` tokens is cut into prefill chunks: `(length, bucket)` pairs, the fewest
/// chunks (every chunk but the last fills the largest bucket; the last runs in the smallest
/// bucket that holds it, padded and masked). `buckets` ascending, non-empty.
pub fn plan_chunks(buckets: &[usize], n: usize) -> Vec<(usize, usize)> {
    let max = *buckets.last().expect("non-empty bucket list");
    let mut out = Vec::with_capacity(n.div_ceil(max.max(1)));
    let mut left = n;
    while left > max {
        out.push((max, max));
        left -= max;
    }
    if left > 0 {
        let b = buckets.iter().copied().find(|&b| b >= left).unwrap_or(max);
        out.push((left, b));
    }
    out
}

/// Runs `tokens` from position `start` as prefill chunks ([`plan_chunks`]).
pub fn run_prompt(
    backend: &mut dyn Backend,
    tokens: &[u32],
    start: usize,
) -> Result<(), RuntimeError> {
    let buckets = backend.info().buckets;
    let mut pos = start;
    for (len, _) in plan_chunks(&buckets, tokens.len()) {
        backend.prefill(&tokens[pos - start..pos - start + len], pos)?;
        pos += len;
    }
    Ok(())
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
    /// Whether this sampler takes the argmax (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.cfg.temperature == 0.0
    }

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
    /// CPU time of the whole process (every thread, the GPU driver's included) during the
    /// decode steps, where the platform reports it.
    pub decode_cpu_seconds: Option<f64>,
}

/// CPU time used by this process so far (user + system, every thread), in seconds.
pub fn process_cpu_seconds() -> Option<f64> {
    #[cfg(unix)]
    {
        // SAFETY: getrusage writes into the zeroed struct we pass.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } == 0 {
            let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
            return Some(t(ru.ru_utime) + t(ru.ru_stime));
        }
    }
    None
}

impl GenStats {
    pub fn prompt_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_seconds.max(1e-9)
    }
    pub fn decode_tps(&self) -> f64 {
        self.decode_steps as f64 / self.decode_seconds.max(1e-9)
    }
}

/// The next token from the backend's last logits: the backend's argmax when greedy (no copy),
/// else a sample from the copied logits. `step` and `pos` name it in a non-finite error.
fn pick(
    backend: &mut dyn Backend,
    sampler: &mut Sampler,
    step: usize,
    pos: usize,
) -> Result<u32, RuntimeError> {
    if sampler.is_greedy() {
        return backend
            .argmax(&sampler.cfg.banned)?
            .ok_or(RuntimeError::NonFinite { step, pos });
    }
    let logits = backend.logits()?;
    if logits.iter().any(|v| !v.is_finite()) {
        return Err(RuntimeError::NonFinite { step, pos });
    }
    Ok(sampler.sample(logits))
}

/// Runs the prompt as prefill chunks, then generates up to `max_tokens` tokens, calling
/// `on_token(id)` for each generated one (it returns false to stop, e.g. when its output is
/// closed); stops early when `stop(id)` says so (the stop token is still reported). All
/// limits are checked before the first step.
pub fn generate(
    backend: &mut dyn Backend,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    stop: &dyn Fn(u32) -> bool,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<(Vec<u32>, GenStats), RuntimeError> {
    generate_inner(backend, prompt, max_tokens, sampler, stop, on_token, None)
}

/// [`generate`], also handing the logits after the prompt (those the first token is picked
/// from) to `after_prompt` when given (`run --dump-logits`): one run, not two.
pub fn generate_with_hook(
    backend: &mut dyn Backend,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    stop: &dyn Fn(u32) -> bool,
    on_token: &mut dyn FnMut(u32) -> bool,
    after_prompt: PromptHook,
) -> Result<(Vec<u32>, GenStats), RuntimeError> {
    generate_inner(
        backend,
        prompt,
        max_tokens,
        sampler,
        stop,
        on_token,
        after_prompt,
    )
}

/// A callback given the logits after the prompt.
pub type PromptHook<'a> = Option<&'a mut dyn FnMut(&[f32])>;

fn generate_inner(
    backend: &mut dyn Backend,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    stop: &dyn Fn(u32) -> bool,
    on_token: &mut dyn FnMut(u32) -> bool,
    after_prompt: PromptHook,
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
    // u128: the sum of two usize cannot wrap, so the message gives it exactly.
    let total = prompt.len() as u128 + max_tokens as u128;
    if total > n_ctx as u128 {
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
    run_prompt(backend, prompt, 0)?;
    if let Some(f) = after_prompt {
        f(backend.logits()?);
    }
    if max_tokens == 0 {
        // The prompt only (llama.cpp's `-n 0`): nothing generated, nothing picked.
        stats.prompt_seconds = t0.elapsed().as_secs_f64();
        return Ok((Vec::new(), stats));
    }
    let mut next = pick(backend, sampler, 0, prompt.len() - 1)?;
    stats.prompt_seconds = t0.elapsed().as_secs_f64();
    let mut out = Vec::with_capacity(max_tokens);
    let cpu1 = process_cpu_seconds();
    let t1 = std::time::Instant::now();
    let mut pos = prompt.len();
    out.push(next);
    let done = !on_token(next) || stop(next) || out.len() == max_tokens;
    if !done && sampler.is_greedy() {
        let left = max_tokens - out.len();
        let banned = sampler.cfg.banned.clone();
        stats.decode_steps = backend.decode_greedy(next, pos, left, &banned, &mut |t| {
            out.push(t);
            on_token(t) && !stop(t) && out.len() < max_tokens
        })?;
    } else if !done {
        loop {
            backend.decode(next, pos)?;
            stats.decode_steps += 1;
            next = pick(backend, sampler, stats.decode_steps, pos)?;
            pos += 1;
            out.push(next);
            if !on_token(next) || stop(next) || out.len() == max_tokens {
                break;
            }
        }
    }
    stats.decode_seconds = t1.elapsed().as_secs_f64();
    stats.decode_cpu_seconds = cpu1.and_then(|a| process_cpu_seconds().map(|b| b - a));
    stats.generated = out.len();
    Ok((out, stats))
}

/// A measuring knob that is 0 or 1: `default` where `name` is unset, and where it holds
/// anything else (said on stderr).
pub(crate) fn env_switch(name: &str, default: bool) -> bool {
    match std::env::var(name) {
        Ok(v) if v == "1" => true,
        Ok(v) if v == "0" => false,
        Ok(v) => {
            eprintln!(
                "warning: {name}={v} is neither 0 nor 1: using {}",
                u8::from(default)
            );
            default
        }
        Err(_) => default,
    }
}
