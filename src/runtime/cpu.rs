//! The CPU reference backend: one token per step, f32 activations, f16 KV cache.
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

/// KV cache and scratch buffers of one decode session.
pub struct CpuBackend {
    pub model: Model,
    /// `[n_layer][n_head_kv][n_ctx][head_dim]` as f16 bits.
    k_cache: Vec<u16>,
    v_cache: Vec<u16>,
    /// The next position expected (positions are contiguous from 0).
    next_pos: usize,
    logits: Vec<f32>,
    norms: Vec<(Vec<f32>, Vec<f32>)>,
    output_norm: Vec<f32>,
    /// Ternary kernel: f32 activations (reference) or int8; set with [`CpuBackend::set_kernel`].
    kernel: matvec::Kernel,
    /// Ternary weights repacked for the int8 kernel, by tensor name.
    repacked: std::collections::HashMap<String, Vec<u8>>,
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

impl CpuBackend {
    pub fn new(model: Model) -> CpuBackend {
        let c = &model.cfg;
        let n = (c.n_layer * c.n_head_kv * c.n_ctx * c.head_dim) as usize;
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
        CpuBackend {
            k_cache: vec![0; n],
            v_cache: vec![0; n],
            next_pos: 0,
            logits: vec![0f32; c.n_vocab as usize],
            norms,
            output_norm,
            model,
            kernel: matvec::Kernel::F32,
            repacked: Default::default(),
        }
    }

    /// The ternary kernel in use.
    pub fn kernel(&self) -> matvec::Kernel {
        self.kernel
    }

    /// Chooses the ternary kernel. The int8 kernel repacks every ternary linear weight once
    /// into a layout where one shift unpacks 32 codes, and releases the bundle pages it read, so
    /// memory stays at about the weights' size.
    pub fn set_kernel(&mut self, k: matvec::Kernel) {
        self.kernel = k;
        self.repacked.clear();
        if k != matvec::Kernel::Int8 {
            return;
        }
        let mut ws: Vec<&super::model::Weight> = Vec::new();
        for l in &self.model.layers {
            ws.extend([&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]);
        }
        for w in ws {
            if let matvec::WeightData::Ternary { words, .. } = w.data(&self.model.bundle) {
                self.repacked
                    .insert(w.name.clone(), matvec::repack_ternary(words));
                if let Some(t) = self.model.bundle.tensor(&w.name) {
                    self.model.bundle.release(t);
                }
            }
        }
    }

    /// A weight's data: the repacked copy when the int8 kernel made one.
    fn wdata<'a>(&'a self, w: &super::model::Weight) -> matvec::WeightData<'a> {
        match (self.repacked.get(&w.name), w.data(&self.model.bundle)) {
            (Some(qs), matvec::WeightData::Ternary { scales, .. }) => {
                matvec::WeightData::TernaryQs { qs, scales }
            }
            (_, d) => d,
        }
    }

    fn mvw(&self, w: &super::model::Weight, x: &[f32], y: &mut [f32]) {
        matvec::matvec_with(self.kernel, self.wdata(w), w.cols, x, y);
    }

    /// Bytes held by the KV cache.
    pub fn kv_bytes(&self) -> u64 {
        (self.k_cache.len() + self.v_cache.len()) as u64 * 2
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
            let layer_base = il * nkv * nctx * hd;
            for kh in 0..nkv {
                let at = layer_base + (kh * nctx + pos) * hd;
                for d in 0..hd {
                    self.k_cache[at + d] = half::f16::from_f32(k[kh * hd + d]).to_bits();
                    self.v_cache[at + d] = half::f16::from_f32(v[kh * hd + d]).to_bits();
                }
            }
            let (kc, vc) = (&self.k_cache, &self.v_cache);
            attn.par_chunks_mut(hd).enumerate().for_each(|(head, out)| {
                let kh = head / group;
                let qh = &q[head * hd..(head + 1) * hd];
                let base = layer_base + kh * nctx * hd;
                let mut scores = Vec::with_capacity(pos + 1);
                let mut kt = vec![0f32; hd];
                for t in 0..=pos {
                    let row = &kc[base + t * hd..base + (t + 1) * hd];
                    for (a, b) in kt.iter_mut().zip(row) {
                        *a = half::f16::from_bits(*b).to_f32();
                    }
                    scores.push(dot(qh, &kt) * kq_scale);
                }
                let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f64;
                for s in scores.iter_mut() {
                    *s = (*s - m).exp();
                    sum += *s as f64;
                }
                let inv = (1.0 / sum) as f32;
                out.iter_mut().for_each(|o| *o = 0.0);
                for (t, s) in scores.iter().enumerate() {
                    let p = s * inv;
                    let row = &vc[base + t * hd..base + (t + 1) * hd];
                    for (a, b) in out.iter_mut().zip(row) {
                        *a += p * half::f16::from_bits(*b).to_f32();
                    }
                }
            });
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
        Ok(&self.logits)
    }
}
