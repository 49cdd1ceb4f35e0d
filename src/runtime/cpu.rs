//! The CPU reference backend: one token per step, f32 activations (or int8 with
//! `Kernel::Int8`), f16 KV cache (or f32 with [`KvType::F32`]).
//!
//! The forward pass follows llama.cpp's graphs (`src/models/llama.cpp`, `granite.cpp`, which
//! MiniCPM reuses, at build b11434):
//!
//! ```text
//! x = token_embd[token]                    (MiniCPM: x *= embedding_scale)
//! per layer:
//!   h = rms_norm(x) * attn_norm
//!   q, k, v = Wq h, Wk h, Wv h;  RoPE(q, k) at this position (adjacent pairs, "NORM" mode)
//!   keyCache[l, :, pos] = k; valueCache[l, :, pos] = v   (stored as f16)
//!   a = softmax(q k^T / sqrt(head_dim)) v   per head; head h reads KV head h / (n_head/n_head_kv)
//!   x = x + Wo a                            (MiniCPM: x + residual_scale * Wo a)
//!   h = rms_norm(x) * ffn_norm
//!   x = x + Wdown (silu(Wgate h) * Wup h)   (MiniCPM: residual_scale as above)
//! logits = Wout (rms_norm(x) * output_norm) (MiniCPM: logits * (1 / logit_scale))
//! ```
//!
//! `rms_norm(x) = x * (1 / sqrt(mean(x^2) + eps))` with the sum of squares in f64, as ggml's
//! CPU kernel. RoPE angles are built as ggml's rope cache builds them: `theta = pos`, then per
//! pair `theta_i = theta / factor_i` and `theta *= base^(-2/n_rot)`, all in f32.

use rayon::prelude::*;

use super::matvec::{self, dot};
use super::model::{Arch, Model};
use super::{Backend, RuntimeError};
use crate::bundle::manifest::ModelConfig;

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvType {
    /// float16, the bundle contract's state type (what a GPU backend stores).
    #[default]
    F16,
    /// float32: no rounding of K and V (a reference setting, as llama.cpp's `-ctk f32 -ctv f32`).
    F32,
}

/// One KV cache element type.
trait KvElem: Copy + Default + Send + Sync {
    fn store(v: f32) -> Self;
    /// Widens `src` into `dst` (same length).
    fn widen(src: &[Self], dst: &mut [f32]);
}

crate::multiversion! {
    /// f16 bits to f32, exactly (vectorized).
    fn widen_f16(src: &[u16], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = crate::quant::f16_bits_to_f32(*s);
        }
    }
}

crate::multiversion! {
    /// `out += p * v` element by element.
    fn axpy(p: f32, v: &[f32], out: &mut [f32]) {
        for (o, x) in out.iter_mut().zip(v) {
            *o += p * x;
        }
    }
}

impl KvElem for u16 {
    #[inline(always)]
    fn store(v: f32) -> u16 {
        half::f16::from_f32(v).to_bits()
    }
    fn widen(src: &[u16], dst: &mut [f32]) {
        widen_f16(src, dst)
    }
}

impl KvElem for f32 {
    #[inline(always)]
    fn store(v: f32) -> f32 {
        v
    }
    fn widen(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
}

/// K and V, each `[n_layer][n_head_kv][n_ctx][head_dim]`.
enum KvStore {
    F16 { k: Vec<u16>, v: Vec<u16> },
    F32 { k: Vec<f32>, v: Vec<f32> },
}

/// Geometry of one layer's attention at one position.
struct AttnShape {
    layer_base: usize,
    nctx: usize,
    hd: usize,
    group: usize,
    pos: usize,
    kq_scale: f32,
}

/// Writes this position's K and V rows, then attends every head over positions `0..=pos`:
/// `softmax(q k^T * kq_scale) v`, the max subtracted first, the normalizer summed in f64.
fn attend<T: KvElem>(
    kc: &mut [T],
    vc: &mut [T],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    sh: &AttnShape,
) {
    let (hd, nctx, pos) = (sh.hd, sh.nctx, sh.pos);
    for kh in 0..k.len() / hd {
        let at = sh.layer_base + (kh * nctx + pos) * hd;
        for d in 0..hd {
            kc[at + d] = T::store(k[kh * hd + d]);
            vc[at + d] = T::store(v[kh * hd + d]);
        }
    }
    let (kc, vc) = (&*kc, &*vc);
    out.par_chunks_mut(hd).enumerate().for_each(|(head, out)| {
        let kh = head / sh.group;
        let qh = &q[head * hd..(head + 1) * hd];
        let base = sh.layer_base + kh * nctx * hd;
        let n = pos + 1;
        // This head's keys and values for positions 0..=pos, widened once.
        let mut rows = vec![0f32; n * hd];
        T::widen(&kc[base..base + n * hd], &mut rows);
        let mut scores: Vec<f32> = rows
            .chunks_exact(hd)
            .map(|kt| dot(qh, kt) * sh.kq_scale)
            .collect();
        let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f64;
        for s in scores.iter_mut() {
            *s = (*s - m).exp();
            sum += *s as f64;
        }
        let inv = (1.0 / sum) as f32;
        out.iter_mut().for_each(|o| *o = 0.0);
        T::widen(&vc[base..base + n * hd], &mut rows);
        for (vt, s) in rows.chunks_exact(hd).zip(&scores) {
            axpy(s * inv, vt, out);
        }
    });
}

/// KV cache and scratch buffers of one decode session.
pub struct CpuBackend {
    pub model: Model,
    kv: KvStore,
    /// The next position expected (positions are contiguous from 0).
    next_pos: usize,
    logits: Vec<f32>,
    norms: Vec<(Vec<f32>, Vec<f32>)>,
    output_norm: Vec<f32>,
    /// Matvec kernel: f32 activations (reference) or int8; set with [`CpuBackend::set_kernel`].
    kernel: matvec::Kernel,
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let sum: f64 = x.iter().map(|v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0f32 / (mean + eps).sqrt();
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = (v * scale) * g;
    }
}

/// With `LOWBIT_TRACE=1`, prints each intermediate's sum and edge values to stderr (names as
/// llama.cpp's eval callback prints them), for comparing with `llama-eval-callback`.
fn trace(name: &str, il: usize, v: &[f32]) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !*ON.get_or_init(|| std::env::var("LOWBIT_TRACE").as_deref() == Ok("1")) {
        return;
    }
    let sum: f64 = v.iter().map(|x| *x as f64).sum();
    let n = v.len();
    eprintln!(
        "trace {name}-{il} sum={sum:.6} [{:.4}, {:.4}, {:.4} ... {:.4}, {:.4}, {:.4}]",
        v[0],
        v[1.min(n - 1)],
        v[2.min(n - 1)],
        v[n.saturating_sub(3)],
        v[n.saturating_sub(2)],
        v[n - 1]
    );
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Elements of K (and of V) in the KV cache, `n_layer * n_head_kv * n_ctx * head_dim`, when
/// the cache of `elem_bytes`-byte elements fits this machine's physical memory. The pages are
/// zero and untouched until a position is written (calloc), so the bound is what the
/// allocation could come to, not what it costs at once.
fn kv_elements(c: &ModelConfig, elem_bytes: u64) -> Result<usize, RuntimeError> {
    let err = |detail: String| RuntimeError::KvCache {
        n_ctx: c.n_ctx,
        detail,
    };
    let n = [c.n_head_kv, c.n_ctx, c.head_dim]
        .iter()
        .try_fold(c.n_layer, |a, &b| a.checked_mul(b))
        .ok_or_else(|| err("the element count overflows 64 bits".into()))?;
    let bytes = n
        .checked_mul(2 * elem_bytes)
        .ok_or_else(|| err("the byte count overflows 64 bits".into()))?;
    let phys = physical_memory();
    if bytes > phys {
        return Err(err(format!(
            "K and V need {bytes} bytes, more than this machine's {phys} bytes of memory"
        )));
    }
    usize::try_from(n).map_err(|_| err(format!("{n} elements do not fit this address space")))
}

/// Physical memory in bytes (u64::MAX where it cannot be read).
fn physical_memory() -> u64 {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions.
        let (pages, size) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        if pages > 0 && size > 0 {
            return (pages as u64).saturating_mul(size as u64);
        }
    }
    u64::MAX
}

impl CpuBackend {
    /// The backend for `model` with an f16 KV cache of `n_ctx` positions. Errors when that
    /// cache cannot be allocated ([`RuntimeError::KvCache`], with the byte count).
    pub fn new(model: Model) -> Result<CpuBackend, RuntimeError> {
        let c = &model.cfg;
        let n = kv_elements(c, 2)?;
        let norms = model
            .layers
            .iter()
            .map(|l| {
                (
                    l.attn_norm.vector(&model.bundle),
                    l.ffn_norm.vector(&model.bundle),
                )
            })
            .collect();
        let output_norm = model.output_norm.vector(&model.bundle);
        Ok(CpuBackend {
            kv: KvStore::F16 {
                k: vec![0; n],
                v: vec![0; n],
            },
            next_pos: 0,
            logits: vec![0f32; c.n_vocab as usize],
            norms,
            output_norm,
            model,
            kernel: matvec::Kernel::F32,
        })
    }

    /// The matvec kernel in use.
    pub fn kernel(&self) -> matvec::Kernel {
        self.kernel
    }

    /// Chooses the matvec kernel (f32 activations, the reference, or int8).
    pub fn set_kernel(&mut self, k: matvec::Kernel) {
        self.kernel = k;
    }

    fn mvw(&self, w: &super::model::Weight, x: &[f32], y: &mut [f32]) {
        matvec::matvec_with(self.kernel, w.data(&self.model.bundle), w.cols, x, y);
    }

    /// Chooses the KV cache's element type (f16 by default); the sequence restarts. Errors
    /// (keeping the current cache) when the new one cannot be allocated.
    pub fn set_kv_type(&mut self, t: KvType) -> Result<(), RuntimeError> {
        let n = kv_elements(
            &self.model.cfg,
            match t {
                KvType::F16 => 2,
                KvType::F32 => 4,
            },
        )?;
        self.kv = match t {
            KvType::F16 => KvStore::F16 {
                k: vec![0; n],
                v: vec![0; n],
            },
            KvType::F32 => KvStore::F32 {
                k: vec![0.0; n],
                v: vec![0.0; n],
            },
        };
        self.next_pos = 0;
        Ok(())
    }

    /// The KV cache's element type.
    pub fn kv_type(&self) -> KvType {
        match self.kv {
            KvStore::F16 { .. } => KvType::F16,
            KvStore::F32 { .. } => KvType::F32,
        }
    }

    /// Bytes held by the KV cache.
    pub fn kv_bytes(&self) -> u64 {
        match &self.kv {
            KvStore::F16 { k, v } => (k.len() + v.len()) as u64 * 2,
            KvStore::F32 { k, v } => (k.len() + v.len()) as u64 * 4,
        }
    }

    /// Rotates adjacent pairs of the first `n_rot` dims of each head in place.
    fn rope(&self, v: &mut [f32], n_heads: usize, pos: usize) {
        let c = &self.model.cfg;
        let hd = c.head_dim as usize;
        let n_rot = c.rope.dimension_count as usize;
        let base = c.rope.freq_base as f32;
        let theta_scale = base.powf(-2.0 / n_rot as f32);
        let mut cache = vec![0f32; n_rot];
        let mut theta = pos as f32;
        for i in 0..n_rot / 2 {
            let ff = self
                .model
                .rope_factors
                .as_ref()
                .map(|f| f[i])
                .unwrap_or(1.0);
            let t = self.model.rope_freq_scale * (theta / ff);
            cache[2 * i] = t.cos() * self.model.rope_attn_factor;
            cache[2 * i + 1] = t.sin() * self.model.rope_attn_factor;
            theta *= theta_scale;
        }
        for h in 0..n_heads {
            let x = &mut v[h * hd..(h + 1) * hd];
            for i in 0..n_rot / 2 {
                let (cos, sin) = (cache[2 * i], cache[2 * i + 1]);
                let (x0, x1) = (x[2 * i], x[2 * i + 1]);
                x[2 * i] = x0 * cos - x1 * sin;
                x[2 * i + 1] = x0 * sin + x1 * cos;
            }
        }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn n_vocab(&self) -> usize {
        self.model.cfg.n_vocab as usize
    }

    fn n_ctx(&self) -> usize {
        self.model.cfg.n_ctx as usize
    }

    fn reset(&mut self) {
        self.next_pos = 0;
    }

    fn step(&mut self, token: u32, pos: usize) -> Result<&[f32], RuntimeError> {
        // The step runs on a worker of the rayon pool, so that its parallel loops split work
        // among the workers directly instead of each one being handed over from (and waking)
        // a thread outside the pool: one hand-over per token instead of one per matvec.
        if rayon::current_thread_index().is_none() {
            rayon::scope(|_| self.forward(token, pos))?;
        } else {
            self.forward(token, pos)?;
        }
        Ok(&self.logits)
    }
}

impl CpuBackend {
    /// One decode step (see [`Backend::step`]); the logits are left in `self.logits`.
    fn forward(&mut self, token: u32, pos: usize) -> Result<(), RuntimeError> {
        let c = self.model.cfg.clone();
        if token as u64 >= c.n_vocab {
            return Err(RuntimeError::TokenOutOfRange {
                token,
                n_vocab: c.n_vocab,
            });
        }
        if pos as u64 >= c.n_ctx {
            return Err(RuntimeError::PositionOutOfRange {
                pos,
                n_ctx: c.n_ctx,
            });
        }
        if pos != self.next_pos {
            return Err(RuntimeError::NonContiguous {
                pos,
                expected: self.next_pos,
            });
        }
        let (e, hd) = (c.n_embd as usize, c.head_dim as usize);
        let (nh, nkv, nctx) = (c.n_head as usize, c.n_head_kv as usize, c.n_ctx as usize);
        let eps = c.norm_eps as f32;
        let minicpm = self.model.arch == Arch::MiniCpm;
        let res_scale = if minicpm {
            c.residual_scale.unwrap_or(1.0) as f32
        } else {
            1.0
        };

        let mut x = vec![0f32; e];
        let emb = self.model.weight(&self.model.tok_embd);
        matvec::row(emb.data, e, token as usize, &mut x);
        if minicpm {
            let s = c.embedding_scale.unwrap_or(1.0) as f32;
            x.iter_mut().for_each(|v| *v *= s);
        }

        let mut h = vec![0f32; e];
        let mut q = vec![0f32; nh * hd];
        let mut k = vec![0f32; nkv * hd];
        let mut v = vec![0f32; nkv * hd];
        let mut attn = vec![0f32; nh * hd];
        let mut o = vec![0f32; e];
        let nff = c.n_ff as usize;
        let mut g = vec![0f32; nff];
        let mut u = vec![0f32; nff];
        let kq_scale = 1.0f32 / (hd as f32).sqrt();
        let group = nh / nkv;

        for (il, layer) in self.model.layers.iter().enumerate() {
            rms_norm(&x, &self.norms[il].0, eps, &mut h);
            trace("attn_norm", il, &h);
            self.mvw(&layer.wq, &h, &mut q);
            self.mvw(&layer.wk, &h, &mut k);
            self.mvw(&layer.wv, &h, &mut v);
            trace("Qcur_mm", il, &q);
            trace("Kcur_mm", il, &k);
            trace("Vcur", il, &v);
            self.rope(&mut q, nh, pos);
            self.rope(&mut k, nkv, pos);
            trace("Qcur_rope", il, &q);
            trace("Kcur_rope", il, &k);
            let sh = AttnShape {
                layer_base: il * nkv * nctx * hd,
                nctx,
                hd,
                group,
                pos,
                kq_scale,
            };
            match &mut self.kv {
                KvStore::F16 { k: kc, v: vc } => attend(kc, vc, &q, &k, &v, &mut attn, &sh),
                KvStore::F32 { k: kc, v: vc } => attend(kc, vc, &q, &k, &v, &mut attn, &sh),
            }
            trace("kqv_out", il, &attn);
            self.mvw(&layer.wo, &attn, &mut o);
            trace("attn_out", il, &o);
            for (xi, oi) in x.iter_mut().zip(&o) {
                *xi += if minicpm { oi * res_scale } else { *oi };
            }
            rms_norm(&x, &self.norms[il].1, eps, &mut h);
            self.mvw(&layer.w_gate, &h, &mut g);
            self.mvw(&layer.w_up, &h, &mut u);
            for (gi, ui) in g.iter_mut().zip(&u) {
                *gi = silu(*gi) * ui;
            }
            trace("ffn_swiglu", il, &g);
            self.mvw(&layer.w_down, &g, &mut o);
            trace("ffn_out", il, &o);
            for (xi, oi) in x.iter_mut().zip(&o) {
                *xi += if minicpm { oi * res_scale } else { *oi };
            }
        }
        rms_norm(&x, &self.output_norm, eps, &mut h);
        trace("result_norm", 0, &h);
        let out_w = self.model.weight(&self.model.output);
        let mut logits = std::mem::take(&mut self.logits);
        matvec::matvec_with(self.kernel, out_w.data, e, &h, &mut logits);
        if minicpm {
            let s = 1.0f32 / c.logit_scale.unwrap_or(1.0) as f32;
            logits.iter_mut().for_each(|v| *v *= s);
        }
        self.logits = logits;
        self.next_pos = pos + 1;
        Ok(())
    }
}
