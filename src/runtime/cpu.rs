//! The CPU reference backend: f32 or int8 activations ([`Kernel`]), f16 or f32 KV cache
//! ([`KvType`]), one decode step or one prefill chunk per call.
//!
//! The forward pass is the architecture's ([`crate::arch`], one module each, following
//! llama.cpp's graphs at build b11434), built from shared pieces:
//!
//! - `rms_norm(x) = x * (1 / sqrt(mean(x^2) + eps))` with the sum of squares in f64, then
//!   the weight multiplied separately, as ggml's CPU kernels;
//! - RoPE angles built as ggml's rope cache builds them: `theta = pos`, then per pair
//!   `theta_i = freq_scale * (theta / factor_i)` and `theta *= base^(-2/n_rot)`, all in f32;
//!   adjacent pairs (NORM) or halves (NEOX) by the architecture;
//! - attention per head over positions `lo..=pos` (`lo > 0` on sliding-window layers),
//!   `softmax(q k^T * scale)` with the max subtracted first, `exp` by Cephes' polynomial in
//!   plain f32 operations (the same bits in every vector form) and the normalizer summed in
//!   f64 in eight partial sums;
//! - the gated FFN `down(act(gate h) * up h)`.
//!
//! A prefill chunk runs each matrix as one matrix-matrix product ([`matvec::matmul_with`]:
//! each weight read once per chunk), attention as one pass per two query heads of a KV head
//! over the chunk's positions (each KV head's keys and values widened once), and everything
//! else token by token, all with a decode step's arithmetic, so its logits have the same bits
//! as single steps.

use rayon::prelude::*;

use super::matvec::{self, Kernel, WeightData};
use super::model::{Model, Weight, WeightKind};
use super::team;
use super::RuntimeError;
use super::{Backend, BackendInfo, LoadOptions};
use crate::arch::{Activation, RopeMode};
use crate::bundle::manifest::ModelConfig;

/// Values of the FFN's gating a task (for the threads; any split gives the same bits).
const GATE_CHUNK: usize = 4096;

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
    /// Stored as IEEE binary16 bits (`u16`), else as f32 (the vector forms' loads).
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    const F16: bool;
    fn store(v: f32) -> Self;
    /// The element as f32 (exact).
    fn to_f32(self) -> f32;
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

impl KvElem for u16 {
    const F16: bool = true;
    #[inline(always)]
    fn store(v: f32) -> u16 {
        half::f16::from_f32(v).to_bits()
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        crate::quant::f16_bits_to_f32(self)
    }
    fn widen(src: &[u16], dst: &mut [f32]) {
        widen_f16(src, dst)
    }
}

impl KvElem for f32 {
    const F16: bool = false;
    #[inline(always)]
    fn store(v: f32) -> f32 {
        v
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    fn widen(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
}

/// K as `[n_layer][n_head_kv][head_dim][slots]` (transposed: each element's positions in a
/// row, as [`scores_t_portable`] reads them), V as `[n_layer][n_head_kv][slots][head_dim]`,
/// `slots` = [`kv_slots`]`(n_ctx)`.
enum KvStore {
    F16 { k: Vec<u16>, v: Vec<u16> },
    F32 { k: Vec<f32>, v: Vec<f32> },
}

/// Positions a KV head's cache holds: `n_ctx` and [`KV_PAD`] unused ones, so that the rows of
/// the transposed K cache are not a multiple of 4 KiB apart. (At such strides, common since
/// `n_ctx` is a power of two, every row of a head maps to one L1 set, and at 64 KiB and more
/// to one or two L2 sets: a decode step's scores, which read a block of positions from each
/// of `head_dim` rows, missed L2 at every load; Qwen2.5 at 4,000 positions spent 38% of a
/// decode step there.)
fn kv_slots(n_ctx: usize) -> usize {
    n_ctx + KV_PAD
}

/// See [`kv_slots`]: 32 bytes of f16 a row.
const KV_PAD: usize = 16;

/// Geometry of one layer's attention over a span of positions.
struct AttnShape {
    layer_base: usize,
    nctx: usize,
    /// Positions a KV head's cache holds ([`kv_slots`]; `nctx` in tests that say so): the
    /// K rows' stride and the V rows' count.
    slots: usize,
    hd: usize,
    /// Query heads per KV head.
    group: usize,
    /// Position of the span's first token.
    start: usize,
    /// Sliding window (a position `pos` attends `pos + 1 - window ..= pos`), or all positions.
    window: Option<usize>,
    kq_scale: f32,
    /// The products' form ([`AttnForm::detect`] outside tests).
    form: AttnForm,
}

impl AttnShape {
    /// First position attended from `pos`.
    fn lo(&self, pos: usize) -> usize {
        self.window
            .map(|w| (pos + 1).saturating_sub(w))
            .unwrap_or(0)
    }
}

crate::multiversion! {
    /// `scores[p] = dot(q, k_p) * kq_scale` for the positions `p` of `kt` (the keys
    /// transposed: element `i` of position `p` at `kt[i * stride + p]`, f16 or f32), 8
    /// positions at a time, each with [`matvec::dot`]'s order: element `i` added to lane
    /// `i % 8` (a multiply, then an add), then `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 +
    /// l7))`. `kt` needs only the `scores.len()` positions of each row (the last block of
    /// fewer than 8 is copied first). Panics unless `kt` holds them.
    fn scores_t_portable<K: KvElem>(q: &[f32], kt: &[K], stride: usize, kq_scale: f32, scores: &mut [f32]) {
        let (hd, n) = (q.len(), scores.len());
        if hd == 0 || n == 0 {
            scores.fill(0.0);
            return;
        }
        let whole = in_place(kt.len(), hd, stride, n, 8);
        for (p0, out) in (0..whole.min(n)).step_by(8).zip(scores.chunks_mut(8)) {
            let y = scores8_portable(q, kt, stride, p0);
            for (o, y) in out.iter_mut().zip(y) {
                *o = y * kq_scale;
            }
        }
        if whole < n {
            let tail = tail_block(kt, hd, stride, whole, n, 8);
            let y = scores8_portable(q, &tail, 8, 0);
            for (o, y) in scores[whole..].iter_mut().zip(y) {
                *o = y * kq_scale;
            }
        }
    }
}

/// Positions of the transposed keys' products (`hd >= 1` rows of `stride`, `n >= 1` scores,
/// blocks of `b`) read in place: the `n` positions rounded up to `b` where `kt`'s `kt_len`
/// values hold them (a widened span's padded rows; the lanes past `n` are discarded), else
/// the whole blocks of `b` (the rest goes through [`tail_block`]: a decode step's last
/// position can be the cache's last value). Panics unless `kt` holds the `n` positions.
#[inline(always)]
fn in_place(kt_len: usize, hd: usize, stride: usize, n: usize, b: usize) -> usize {
    assert!(
        n <= stride && kt_len >= (hd - 1) * stride + n,
        "kt too short"
    );
    let up = n.div_ceil(b) * b;
    if kt_len >= (hd - 1) * stride + up {
        up
    } else {
        n / b * b
    }
}

/// The positions `whole .. n` of each of `kt`'s `hd` rows (of `stride`) copied into rows of
/// `b` (the rest default), for the last block that [`in_place`] leaves.
fn tail_block<K: KvElem>(
    kt: &[K],
    hd: usize,
    stride: usize,
    whole: usize,
    n: usize,
    b: usize,
) -> Vec<K> {
    let mut tail = vec![K::default(); hd * b];
    for (i, t) in tail.chunks_exact_mut(b).enumerate() {
        t[..n - whole].copy_from_slice(&kt[i * stride + whole..i * stride + n]);
    }
    tail
}

/// [`scores_t_portable`]'s sums (before `kq_scale`) for the 8 positions from `p0`.
#[inline(always)]
fn scores8_portable<K: KvElem>(q: &[f32], kt: &[K], stride: usize, p0: usize) -> [f32; 8] {
    let mut acc = [[0f32; 8]; 8];
    let k8 = |i: usize| -> [f32; 8] {
        let k: &[K; 8] = kt[i * stride + p0..i * stride + p0 + 8].try_into().unwrap();
        k.map(K::to_f32)
    };
    // Eight elements at a time, so that each lane's accumulator is a register.
    let n8 = q.len() / 8 * 8;
    for (c, q8) in q[..n8].chunks_exact(8).enumerate() {
        for (l, &qi) in q8.iter().enumerate() {
            let k = k8(c * 8 + l);
            for j in 0..8 {
                acc[l][j] += qi * k[j];
            }
        }
    }
    for (l, &qi) in q[n8..].iter().enumerate() {
        let k = k8(n8 + l);
        for j in 0..8 {
            acc[l][j] += qi * k[j];
        }
    }
    std::array::from_fn(|j| {
        let a = |l: usize| acc[l][j];
        ((a(0) + a(4)) + (a(2) + a(6))) + ((a(1) + a(5)) + (a(3) + a(7)))
    })
}

crate::multiversion! {
    /// `out = sum_p w[p] * v_p` over the rows of `v` (`out.len()` values each, f16 or f32),
    /// in position order per element (a multiply, then an add, from 0), `out` kept in
    /// registers.
    fn weighted_rows_portable<V: KvElem>(w: &[f32], v: &[V], out: &mut [f32]) {
        let hd = out.len();
        let mut d = 0;
        // 64 values at a time (eight 256-bit accumulators), then 16, then one by one: the
        // same per-element order in each.
        while d + 64 <= hd {
            let mut acc = [0f32; 64];
            for (p, &wp) in w.iter().enumerate() {
                let v64: &[V; 64] = v[p * hd + d..p * hd + d + 64].try_into().unwrap();
                for j in 0..64 {
                    acc[j] += wp * v64[j].to_f32();
                }
            }
            out[d..d + 64].copy_from_slice(&acc);
            d += 64;
        }
        while d + 16 <= hd {
            let mut acc = [0f32; 16];
            for (p, &wp) in w.iter().enumerate() {
                let v16: &[V; 16] = v[p * hd + d..p * hd + d + 16].try_into().unwrap();
                for j in 0..16 {
                    acc[j] += wp * v16[j].to_f32();
                }
            }
            out[d..d + 16].copy_from_slice(&acc);
            d += 16;
        }
        for (j, o) in out.iter_mut().enumerate().skip(d) {
            let mut a = 0f32;
            for (p, &wp) in w.iter().enumerate() {
                a += wp * v[p * hd + j].to_f32();
            }
            *o = a;
        }
    }
}

/// Which forms of the attention's two products [`attend`] runs; every form gives the portable
/// forms' bits ([`scores_t_portable`], [`weighted_rows_portable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum AttnForm {
    /// The portable forms (vectorized by the compiler), the keys transposed.
    Portable,
    /// 256-bit forms ([`attn256`]): the keys widened as rows, each key and value load shared
    /// by two query heads. Where a KV head serves at least [`ROWS_MIN_QUERIES`] queries (the
    /// span's positions times the query heads a KV head) and the head size is a multiple of
    /// 8; elsewhere the portable forms.
    Avx2,
    /// 512-bit forms ([`attn512`]): the keys transposed, 16 positions a vector, each key and
    /// value load shared by two query heads.
    Avx512,
    /// 128-bit NEON forms ([`attn128`], aarch64): the keys transposed, 8 positions a pair of
    /// vectors for one query head and 4 for two, each key and value load shared by two query
    /// heads.
    Neon,
}

/// Queries a KV head must serve for [`AttnForm::Avx2`]'s key rows: widening the keys as
/// rows costs 0.1-0.3 ns an element more than widening them transposed (on a Zen 4 core),
/// which the rows' scores, about twice as fast, repay after 3 to 6 queries (BENCHMARKS.md).
const ROWS_MIN_QUERIES: usize = 8;

impl AttnForm {
    /// The form the runtime's level runs ([`crate::isa::detect`], which `LOWBIT_ISA` caps):
    /// AVX-512 where the level is AVX-512 VNNI, AVX2 where it is AVX2, NEON where it is one of
    /// aarch64's (NEON, NEON with `dotprod`), else portable.
    fn detect() -> AttnForm {
        static FORM: std::sync::OnceLock<AttnForm> = std::sync::OnceLock::new();
        *FORM.get_or_init(|| {
            Self::of_level(crate::isa::detect(), Self::Avx2.here(), Self::Avx512.here())
        })
    }

    /// The form of the runtime level `isa` on a CPU with (or without) AVX2 and AVX-512F.
    fn of_level(isa: crate::isa::Isa, avx2: bool, avx512f: bool) -> AttnForm {
        use crate::isa::Isa;
        match isa {
            Isa::Avx512Vnni if avx512f => Self::Avx512,
            Isa::Avx512Vnni | Isa::Avx2 if avx2 => Self::Avx2,
            Isa::Neon | Isa::NeonDot => Self::Neon,
            _ => Self::Portable,
        }
    }

    /// Whether this CPU has the instructions of this form.
    fn here(self) -> bool {
        match self {
            Self::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => {
                std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Self::Avx512 => std::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "aarch64")]
            Self::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The form a span of `n` positions runs, `group` query heads a KV head of size `hd`.
    fn for_span(self, n: usize, group: usize, hd: usize) -> AttnForm {
        match self {
            Self::Avx2 if n * group < ROWS_MIN_QUERIES || !hd.is_multiple_of(8) => Self::Portable,
            f => f,
        }
    }
}

/// A span's keys as the products read them.
#[derive(Clone, Copy)]
enum Keys<'a, K> {
    /// Transposed: element `i` of position `p` at `kt[i * stride + p]` (the cache itself,
    /// `K` its element type, or the keys widened to f32).
    T { kt: &'a [K], stride: usize },
    /// Rows, widened: position `p`'s `hd` elements at `rows[p * hd..]`.
    Rows { rows: &'a [f32], hd: usize },
}

impl<'a, K> Keys<'a, K> {
    /// The keys from position `a` on.
    fn from(self, a: usize) -> Keys<'a, K> {
        match self {
            Keys::T { kt, stride } => Keys::T {
                kt: &kt[a..],
                stride,
            },
            Keys::Rows { rows, hd } => Keys::Rows {
                rows: &rows[a * hd..],
                hd,
            },
        }
    }
}

/// [`scores_t_portable`] for `H` queries over the same keys, each with its bits, in `form`
/// (transposed keys, f16 or f32: `kt` holds the scores' length in each row; rows: `H`
/// queries of a length that is a multiple of 8).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(unused_variables)
)]
fn scores<const H: usize, K: KvElem>(
    form: AttnForm,
    q: [&[f32]; H],
    keys: Keys<K>,
    kq_scale: f32,
    scores: [&mut [f32]; H],
) {
    match keys {
        #[cfg(target_arch = "x86_64")]
        Keys::Rows { rows, .. } => {
            assert!(AttnForm::Avx2.here(), "key rows need AVX2");
            // SAFETY: AVX2 is present (asserted); the lengths are checked inside.
            unsafe { attn256::scores_rows(q, rows, kq_scale, scores) }
        }
        #[cfg(target_arch = "x86_64")]
        Keys::T { kt, stride } if form == AttnForm::Avx512 => {
            assert!(form.here(), "AVX-512F");
            // SAFETY: AVX-512F is present (asserted); the lengths are checked inside.
            unsafe { attn512::scores_t(q, kt, stride, kq_scale, scores) }
        }
        #[cfg(target_arch = "x86_64")]
        Keys::T { kt, stride } if form == AttnForm::Avx2 => {
            assert!(form.here(), "AVX2 and F16C");
            for (q, s) in q.into_iter().zip(scores) {
                // SAFETY: AVX2 and F16C are present (asserted); the lengths are checked inside.
                unsafe { attn256::scores_t(q, kt, stride, kq_scale, s) }
            }
        }
        #[cfg(target_arch = "aarch64")]
        Keys::T { kt, stride } if form == AttnForm::Neon => {
            assert!(form.here(), "NEON");
            // SAFETY: NEON is present (asserted); the lengths are checked inside.
            unsafe { attn128::scores_t(q, kt, stride, kq_scale, scores) }
        }
        Keys::T { kt, stride } => {
            for (q, s) in q.into_iter().zip(scores) {
                scores_t_portable(q, kt, stride, kq_scale, s);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Keys::Rows { .. } => unreachable!("key rows are made only for the AVX2 form"),
    }
}

/// [`weighted_rows_portable`] for `H` weightings of the same rows (f16 or f32), each with its
/// bits, in `form` (each row loaded once for all `H` in the vector forms).
fn weighted_rows<const H: usize, V: KvElem>(
    form: AttnForm,
    w: [&[f32]; H],
    v: &[V],
    out: [&mut [f32]; H],
) {
    match form {
        #[cfg(target_arch = "x86_64")]
        AttnForm::Avx512 => {
            assert!(form.here(), "AVX-512F");
            // SAFETY: AVX-512F is present (asserted); the lengths are checked inside.
            unsafe { attn512::weighted_rows(w, v, out) }
        }
        #[cfg(target_arch = "x86_64")]
        AttnForm::Avx2 => {
            assert!(form.here(), "AVX2 and F16C");
            // SAFETY: AVX2 and F16C are present (asserted); the lengths are checked inside.
            unsafe { attn256::weighted_rows(w, v, out) }
        }
        #[cfg(target_arch = "aarch64")]
        AttnForm::Neon => {
            assert!(form.here(), "NEON");
            // SAFETY: NEON is present (asserted); the lengths are checked inside.
            unsafe { attn128::weighted_rows(w, v, out) }
        }
        _ => {
            for (w, o) in w.into_iter().zip(out) {
                weighted_rows_portable(w, v, o);
            }
        }
    }
}

/// `(a[0].len(), b[0].len())` of the vector forms' heads (queries and scores, weightings and
/// outputs); panics unless every `a` has the first's length and every `b` its first's.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn heads_shape(a: &[&[f32]], b: &[&mut [f32]]) -> (usize, usize) {
    let (x, y) = (a[0].len(), b[0].len());
    assert!(
        a.iter().all(|s| s.len() == x) && b.iter().all(|s| s.len() == y),
        "heads of one shape"
    );
    (x, y)
}

/// The values `d..` of [`weighted_rows_portable`] for each weighting, one by one (what the
/// vector forms' passes leave), in its order.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn weighted_tail<V: KvElem>(w: &[&[f32]], v: &[V], out: &mut [&mut [f32]], d: usize) {
    for (wh, o) in w.iter().zip(out.iter_mut()) {
        let hd = o.len();
        for (j, o) in o.iter_mut().enumerate().skip(d) {
            let mut a = 0f32;
            for (p, &wp) in wh.iter().enumerate() {
                a += wp * v[p * hd + j].to_f32();
            }
            *o = a;
        }
    }
}

/// The attention's two products on 256-bit vectors, each value's terms and their order the
/// portable forms' (a multiply, then an add; never fused), so the bits are theirs.
#[cfg(target_arch = "x86_64")]
mod attn256 {
    use super::KvElem;
    use std::arch::x86_64::*;

    /// [`super::exp_portable`] in 8 lanes: the same operations in the same order.
    #[inline(always)]
    unsafe fn exp8(x: __m256) -> __m256 {
        use super::expc::*;
        let xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(XMIN)), _mm256_setzero_ps());
        let round = _mm256_set1_ps(ROUND);
        let n = _mm256_sub_ps(
            _mm256_add_ps(_mm256_mul_ps(xc, _mm256_set1_ps(LOG2E)), round),
            round,
        );
        let r = _mm256_sub_ps(
            _mm256_sub_ps(xc, _mm256_mul_ps(n, _mm256_set1_ps(C1))),
            _mm256_mul_ps(n, _mm256_set1_ps(C2)),
        );
        let z = _mm256_mul_ps(r, r);
        let mut y = _mm256_set1_ps(P[0]);
        for &c in &P[1..] {
            y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(c));
        }
        let y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(y, z), r), _mm256_set1_ps(1.0));
        let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        let y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
        let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(XMIN));
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
        _mm256_blendv_ps(_mm256_andnot_ps(under, y), x, nan)
    }

    /// [`super::softmax`]'s exponentials of `scores - m` in place and their eight partial
    /// sums (positions `p % 8 == j` into sum `j`, in order).
    #[target_feature(enable = "avx2")]
    pub unsafe fn exp_sums(scores: &mut [f32], m: f32) -> [f64; 8] {
        let (n8, mv) = (scores.len() / 8 * 8, _mm256_set1_ps(m));
        let (mut lo, mut hi) = (_mm256_setzero_pd(), _mm256_setzero_pd());
        let sp = scores.as_mut_ptr();
        for p in (0..n8).step_by(8) {
            // SAFETY: p + 8 <= scores.len().
            let y = exp8(_mm256_sub_ps(_mm256_loadu_ps(sp.add(p)), mv));
            _mm256_storeu_ps(sp.add(p), y);
            lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(y)));
            hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(y)));
        }
        let mut sums = [0f64; 8];
        _mm256_storeu_pd(sums.as_mut_ptr(), lo);
        _mm256_storeu_pd(sums.as_mut_ptr().add(4), hi);
        super::exp_sums_tail(scores, n8, m, &mut sums);
        sums
    }

    /// [`super::swiglu_slice`] on 8 lanes ([`super::silu`]'s operations); returns the
    /// values done (whole vectors), the caller does the rest.
    #[target_feature(enable = "avx2")]
    pub unsafe fn swiglu(g: &mut [f32], u: &[f32]) -> usize {
        let n8 = g.len().min(u.len()) / 8 * 8;
        let (one, sign, zero) = (
            _mm256_set1_ps(1.0),
            _mm256_set1_ps(-0.0),
            _mm256_setzero_ps(),
        );
        let gp = g.as_mut_ptr();
        for i in (0..n8).step_by(8) {
            // SAFETY: i + 8 <= both lengths.
            let x = _mm256_loadu_ps(gp.add(i));
            let t = exp8(_mm256_or_ps(x, sign));
            let num =
                _mm256_blendv_ps(_mm256_mul_ps(x, t), x, _mm256_cmp_ps::<_CMP_GE_OQ>(x, zero));
            let s = _mm256_div_ps(num, _mm256_add_ps(one, t));
            _mm256_storeu_ps(
                gp.add(i),
                _mm256_mul_ps(s, _mm256_loadu_ps(u.as_ptr().add(i))),
            );
        }
        n8
    }

    /// 8 cache elements from `p` as f32 (f16 by `vcvtph2ps`, exact).
    #[inline(always)]
    unsafe fn load8<K: KvElem>(p: *const K) -> __m256 {
        if K::F16 {
            _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
        } else {
            _mm256_loadu_ps(p.cast())
        }
    }

    /// The 8 positions' sums from `p0` (before `kq_scale`) of [`scores_t`]: lane `j` of
    /// accumulator `l` is position `p0 + j`'s lane `l`.
    #[inline(always)]
    unsafe fn block_t<K: KvElem>(q: &[f32], kp: *const K, stride: usize, p0: usize) -> [__m256; 8] {
        let (hd, n8) = (q.len(), q.len() / 8 * 8);
        let mut acc = [_mm256_setzero_ps(); 8];
        for c in (0..n8).step_by(8) {
            for (l, a) in acc.iter_mut().enumerate() {
                let i = c + l;
                let k = load8(kp.add(i * stride + p0));
                *a = _mm256_add_ps(*a, _mm256_mul_ps(_mm256_set1_ps(*q.get_unchecked(i)), k));
            }
        }
        for (l, a) in acc.iter_mut().enumerate().take(hd - n8) {
            let i = n8 + l;
            let k = load8(kp.add(i * stride + p0));
            *a = _mm256_add_ps(*a, _mm256_mul_ps(_mm256_set1_ps(*q.get_unchecked(i)), k));
        }
        acc
    }

    /// [`block_t`]'s sums reduced as [`super::scores_t_portable`] reduces them, times
    /// `scale`, into `out` (up to 8 positions).
    #[inline(always)]
    unsafe fn finish_t(a: [__m256; 8], scale: __m256, out: &mut [f32]) {
        let y = _mm256_add_ps(
            _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
            _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])),
        );
        let mut v = [0f32; 8];
        _mm256_storeu_ps(v.as_mut_ptr(), _mm256_mul_ps(y, scale));
        let m = out.len();
        out.copy_from_slice(&v[..m]);
    }

    /// [`super::scores_t_portable`] on 256-bit vectors for one query over transposed keys
    /// (the cache itself: f16 widened by `vcvtph2ps` as they are loaded, or f32), 8 positions
    /// a vector; the last block of fewer than 8 is copied first, so `kt` needs only the
    /// scores' positions in each row.
    ///
    /// # Safety
    /// AVX2 and F16C are present. Panics unless `kt` holds `q.len()` rows of `stride` values
    /// with `scores.len() <= stride` positions in each.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn scores_t<K: KvElem>(
        q: &[f32],
        kt: &[K],
        stride: usize,
        kq_scale: f32,
        scores: &mut [f32],
    ) {
        let (hd, n) = (q.len(), scores.len());
        if hd == 0 || n == 0 {
            scores.fill(0.0);
            return;
        }
        let scale = _mm256_set1_ps(kq_scale);
        let whole = super::in_place(kt.len(), hd, stride, n, 8);
        for p0 in (0..whole.min(n)).step_by(8) {
            let m = (n - p0).min(8);
            // SAFETY: kt holds rows i < hd's positions to p0 + 8 <= whole (in_place).
            let acc = block_t(q, kt.as_ptr(), stride, p0);
            finish_t(acc, scale, &mut scores[p0..p0 + m]);
        }
        if whole < n {
            let tail = super::tail_block(kt, hd, stride, whole, n, 8);
            // SAFETY: tail holds hd rows of 8.
            finish_t(block_t(q, tail.as_ptr(), 8, 0), scale, &mut scores[whole..]);
        }
    }

    /// [`super::scores_t_portable`]'s last step for four positions at once: lane `l` of
    /// `a[j]` is position `j`'s lane `l`; gives `((l0 + l4) + (l2 + l6)) + ((l1 + l5) +
    /// (l3 + l7))` of each, times `kq_scale`.
    #[inline(always)]
    unsafe fn tree4(a: &[__m256], kq_scale: __m256) -> [f32; 4] {
        let half = |x: __m256, y: __m256| {
            _mm256_add_ps(
                _mm256_permute2f128_ps(x, y, 0x20),
                _mm256_permute2f128_ps(x, y, 0x31),
            )
        };
        // Each 128-bit half [s0, s1, s2, s3] (s_l = l_l + l_(l+4)) of positions 0 | 1 and
        // 2 | 3, reordered as [s0, s2, s1, s3].
        let x = _mm256_permute_ps(half(a[0], a[1]), 0b11_01_10_00);
        let y = _mm256_permute_ps(half(a[2], a[3]), 0b11_01_10_00);
        // [s0 + s2, s1 + s3] of positions 0, 2 | 1, 3; then their sums.
        let z = _mm256_hadd_ps(x, y);
        let t = _mm256_mul_ps(_mm256_hadd_ps(z, z), kq_scale);
        let mut v = [0f32; 8];
        _mm256_storeu_ps(v.as_mut_ptr(), t);
        [v[0], v[4], v[1], v[5]]
    }

    /// `P` positions' scores (rows from `rp`) for `H` queries: each key load shared by all
    /// `H`, lane `l` of accumulator `[h][p]` position `p`'s lane `l` (elements `i` with
    /// `i % 8 == l`).
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn block<const H: usize, const P: usize>(
        q: &[&[f32]; H],
        rp: *const f32,
        hd: usize,
        kq_scale: f32,
        out: &mut [&mut [f32]; H],
        p0: usize,
    ) {
        let mut acc = [[_mm256_setzero_ps(); P]; H];
        for c in (0..hd).step_by(8) {
            let qv = q.map(|qh| _mm256_loadu_ps(qh.as_ptr().add(c)));
            for p in 0..P {
                let k = _mm256_loadu_ps(rp.add((p0 + p) * hd + c));
                for h in 0..H {
                    acc[h][p] = _mm256_add_ps(acc[h][p], _mm256_mul_ps(qv[h], k));
                }
            }
        }
        let scale = _mm256_set1_ps(kq_scale);
        for (a, o) in acc.iter().zip(out.iter_mut()) {
            if P.is_multiple_of(4) {
                for (j, a4) in a.chunks_exact(4).enumerate() {
                    let s = tree4(a4, scale);
                    o[p0 + 4 * j..p0 + 4 * j + 4].copy_from_slice(&s);
                }
            } else {
                for (p, a) in a.iter().enumerate() {
                    let mut l = [0f32; 8];
                    _mm256_storeu_ps(l.as_mut_ptr(), *a);
                    o[p0 + p] = (((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])))
                        * kq_scale;
                }
            }
        }
    }

    /// [`super::scores_t_portable`] for `H` queries of the same length over the keys as
    /// rows (`rows[p * hd..]`): a block of 8 positions for one query, 4 for two, each key
    /// load shared by the queries, then the positions left one at a time.
    ///
    /// # Safety
    /// AVX2 is present. Panics unless the queries share a length that is a multiple of 8,
    /// the score slices a length `n`, and `rows` holds `n` rows.
    #[target_feature(enable = "avx2")]
    pub unsafe fn scores_rows<const H: usize>(
        q: [&[f32]; H],
        rows: &[f32],
        kq_scale: f32,
        scores: [&mut [f32]; H],
    ) {
        let (hd, n) = super::heads_shape(&q, &scores);
        assert!(hd.is_multiple_of(8), "head size {hd} not a multiple of 8");
        assert!(rows.len() >= n * hd, "key rows too short");
        let (rp, mut scores) = (rows.as_ptr(), scores);
        let step = 8 / H.clamp(1, 2);
        let mut p0 = 0;
        while p0 + step <= n {
            // SAFETY: rows p0 .. p0 + step <= n hold hd values each (asserted).
            if H == 1 {
                block::<H, 8>(&q, rp, hd, kq_scale, &mut scores, p0);
            } else {
                block::<H, 4>(&q, rp, hd, kq_scale, &mut scores, p0);
            }
            p0 += step;
        }
        while p0 < n {
            // SAFETY: as above, p0 < n.
            block::<H, 1>(&q, rp, hd, kq_scale, &mut scores, p0);
            p0 += 1;
        }
    }

    /// `kr[p * hd + d0 + j] = tmp[j * m + p]` for `j < 8` and the positions `p` of whole
    /// blocks of 8 (an 8 x 8 transpose a block); returns the first position left.
    ///
    /// # Safety
    /// AVX2 is present. Panics unless `tmp` holds 8 rows of `m`, `kr` `m` rows of `hd` and
    /// `d0 + 8 <= hd`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn interleave8(
        tmp: &[f32],
        m: usize,
        kr: &mut [f32],
        hd: usize,
        d0: usize,
    ) -> usize {
        assert!(
            tmp.len() >= 8 * m && kr.len() >= m * hd && d0 + 8 <= hd,
            "interleave8"
        );
        let (tp, kp) = (tmp.as_ptr(), kr.as_mut_ptr());
        let mut p = 0;
        while p + 8 <= m {
            // SAFETY: rows j < 8 of tmp hold m >= p + 8 values (asserted).
            let r: [__m256; 8] = std::array::from_fn(|j| _mm256_loadu_ps(tp.add(j * m + p)));
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let u0 = _mm256_shuffle_ps(t0, t2, 0x44);
            let u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
            let u2 = _mm256_shuffle_ps(t1, t3, 0x44);
            let u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            let u4 = _mm256_shuffle_ps(t4, t6, 0x44);
            let u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
            let u6 = _mm256_shuffle_ps(t5, t7, 0x44);
            let u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            let c = [
                _mm256_permute2f128_ps(u0, u4, 0x20),
                _mm256_permute2f128_ps(u1, u5, 0x20),
                _mm256_permute2f128_ps(u2, u6, 0x20),
                _mm256_permute2f128_ps(u3, u7, 0x20),
                _mm256_permute2f128_ps(u0, u4, 0x31),
                _mm256_permute2f128_ps(u1, u5, 0x31),
                _mm256_permute2f128_ps(u2, u6, 0x31),
                _mm256_permute2f128_ps(u3, u7, 0x31),
            ];
            for (i, c) in c.iter().enumerate() {
                // SAFETY: row p + i < m of kr holds hd >= d0 + 8 values (asserted).
                _mm256_storeu_ps(kp.add((p + i) * hd + d0), *c);
            }
            p += 8;
        }
        p
    }

    /// `C` 8-value columns from `d` of [`weighted_rows`] for `H` weightings, each row load
    /// shared by all.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn weighted_pass<const H: usize, const C: usize, V: KvElem>(
        w: [&[f32]; H],
        vp: *const V,
        hd: usize,
        d: usize,
        out: &mut [&mut [f32]; H],
    ) {
        let mut acc = [[_mm256_setzero_ps(); C]; H];
        for p in 0..w[0].len() {
            let b = w.map(|wh| _mm256_set1_ps(*wh.get_unchecked(p)));
            for j in 0..C {
                let x = load8(vp.add(p * hd + d + 8 * j));
                for h in 0..H {
                    acc[h][j] = _mm256_add_ps(acc[h][j], _mm256_mul_ps(b[h], x));
                }
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            for (j, a) in a.iter().enumerate() {
                _mm256_storeu_ps(o[d + 8 * j..d + 8 * j + 8].as_mut_ptr(), *a);
            }
        }
    }

    /// [`super::weighted_rows_portable`] for `H` weightings of the same rows, 64 values a
    /// pass for one weighting, 32 for two, then 8, then one by one, each row load shared by
    /// all: each value's terms in position order from 0, as there.
    ///
    /// # Safety
    /// AVX2 and F16C are present. Panics unless the weightings share a length, the outputs a
    /// length `hd`, and `v` holds `w.len()` rows of `hd` values (f16 or f32).
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn weighted_rows<const H: usize, V: KvElem>(
        w: [&[f32]; H],
        v: &[V],
        out: [&mut [f32]; H],
    ) {
        let mut out = out;
        let (np, hd) = super::heads_shape(&w, &out);
        assert!(v.len() >= np * hd, "v too short");
        let vp = v.as_ptr();
        let mut d = 0;
        if H == 1 {
            while d + 64 <= hd {
                // SAFETY: rows p < np hold hd values, d + 64 <= hd (asserted).
                weighted_pass::<H, 8, V>(w, vp, hd, d, &mut out);
                d += 64;
            }
        } else {
            while d + 32 <= hd {
                // SAFETY: as above, d + 32 <= hd.
                weighted_pass::<H, 4, V>(w, vp, hd, d, &mut out);
                d += 32;
            }
        }
        while d + 8 <= hd {
            // SAFETY: as above, d + 8 <= hd.
            weighted_pass::<H, 1, V>(w, vp, hd, d, &mut out);
            d += 8;
        }
        super::weighted_tail(&w, v, &mut out, d);
    }
}

/// The attention's two products on 512-bit vectors, each value's terms and their order the
/// portable forms' (a multiply, then an add; never fused), so the bits are theirs.
#[cfg(target_arch = "x86_64")]
mod attn512 {
    use super::KvElem;
    use std::arch::x86_64::*;

    /// [`super::exp_portable`] in 16 lanes: the same operations in the same order.
    #[inline(always)]
    unsafe fn exp16(x: __m512) -> __m512 {
        use super::expc::*;
        let xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(XMIN)), _mm512_setzero_ps());
        let round = _mm512_set1_ps(ROUND);
        let n = _mm512_sub_ps(
            _mm512_add_ps(_mm512_mul_ps(xc, _mm512_set1_ps(LOG2E)), round),
            round,
        );
        let r = _mm512_sub_ps(
            _mm512_sub_ps(xc, _mm512_mul_ps(n, _mm512_set1_ps(C1))),
            _mm512_mul_ps(n, _mm512_set1_ps(C2)),
        );
        let z = _mm512_mul_ps(r, r);
        let mut y = _mm512_set1_ps(P[0]);
        for &c in &P[1..] {
            y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(c));
        }
        let y = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(y, z), r), _mm512_set1_ps(1.0));
        let e = _mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_cvtps_epi32(n),
            _mm512_set1_epi32(127),
        ));
        let y = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
        let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(XMIN));
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        _mm512_mask_mov_ps(_mm512_maskz_mov_ps(!under, y), nan, x)
    }

    /// [`super::softmax`]'s exponentials of `scores - m` in place and their eight partial
    /// sums (lane `j` of the f64 accumulator: positions `p % 8 == j`, in order).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn exp_sums(scores: &mut [f32], m: f32) -> [f64; 8] {
        let (n16, mv) = (scores.len() / 16 * 16, _mm512_set1_ps(m));
        let mut acc = _mm512_setzero_pd();
        let sp = scores.as_mut_ptr();
        for p in (0..n16).step_by(16) {
            // SAFETY: p + 16 <= scores.len().
            let y = exp16(_mm512_sub_ps(_mm512_loadu_ps(sp.add(p)), mv));
            _mm512_storeu_ps(sp.add(p), y);
            acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(y)));
            let hi = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(y));
            acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_castpd_ps(hi)));
        }
        let mut sums = [0f64; 8];
        _mm512_storeu_pd(sums.as_mut_ptr(), acc);
        super::exp_sums_tail(scores, n16, m, &mut sums);
        sums
    }

    /// [`super::swiglu_slice`] on 16 lanes ([`super::silu`]'s operations); returns the
    /// values done (whole vectors), the caller does the rest.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn swiglu(g: &mut [f32], u: &[f32]) -> usize {
        let n16 = g.len().min(u.len()) / 16 * 16;
        let (one, sign, zero) = (
            _mm512_set1_ps(1.0),
            _mm512_set1_epi32(i32::MIN),
            _mm512_setzero_ps(),
        );
        let gp = g.as_mut_ptr();
        for i in (0..n16).step_by(16) {
            // SAFETY: i + 16 <= both lengths.
            let x = _mm512_loadu_ps(gp.add(i));
            let t = exp16(_mm512_castsi512_ps(_mm512_or_si512(
                _mm512_castps_si512(x),
                sign,
            )));
            let ge = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, zero);
            let num = _mm512_mask_mov_ps(_mm512_mul_ps(x, t), ge, x);
            let s = _mm512_div_ps(num, _mm512_add_ps(one, t));
            _mm512_storeu_ps(
                gp.add(i),
                _mm512_mul_ps(s, _mm512_loadu_ps(u.as_ptr().add(i))),
            );
        }
        n16
    }

    /// 16 cache elements from `p` as f32 (f16 by `vcvtph2ps`, exact).
    #[inline(always)]
    unsafe fn load16<K: KvElem>(p: *const K) -> __m512 {
        if K::F16 {
            _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
        } else {
            _mm512_loadu_ps(p.cast())
        }
    }

    /// The 16 positions' accumulators from `p0` of [`scores_t`] for `H` queries.
    #[inline(always)]
    unsafe fn block_t<const H: usize, K: KvElem>(
        q: &[&[f32]; H],
        kp: *const K,
        stride: usize,
        p0: usize,
    ) -> [[__m512; 8]; H] {
        let hd = q[0].len();
        let n8 = hd / 8 * 8;
        let mut acc = [[_mm512_setzero_ps(); 8]; H];
        for c in (0..n8).step_by(8) {
            for l in 0..8 {
                let i = c + l;
                let k = load16(kp.add(i * stride + p0));
                for (a, qh) in acc.iter_mut().zip(q) {
                    let qi = _mm512_set1_ps(*qh.get_unchecked(i));
                    a[l] = _mm512_add_ps(a[l], _mm512_mul_ps(qi, k));
                }
            }
        }
        for l in 0..hd - n8 {
            let k = load16(kp.add((n8 + l) * stride + p0));
            for (a, qh) in acc.iter_mut().zip(q) {
                let qi = _mm512_set1_ps(*qh.get_unchecked(n8 + l));
                a[l] = _mm512_add_ps(a[l], _mm512_mul_ps(qi, k));
            }
        }
        acc
    }

    /// [`super::scores_t_portable`] for `H` queries of the same length over the same keys
    /// (the cache itself: f16 widened by `vcvtph2ps` as they are loaded, or f32), with the
    /// positions 16 to a vector and each key vector loaded once for all `H`: lane `j` of
    /// accumulator `l` of query `h` is position `p0 + j`'s lane `l` (elements `i` with `i %
    /// 8 == l`), each query's terms and order as there. The last block of fewer than 16
    /// positions is copied first, so `kt` needs only the scores' positions in each row.
    ///
    /// # Safety
    /// AVX-512F is present. Panics unless the queries share a length, the score slices a
    /// length `n`, and `kt` holds `q[0].len()` rows of `stride` values with `n <= stride`
    /// positions in each.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn scores_t<const H: usize, K: KvElem>(
        q: [&[f32]; H],
        kt: &[K],
        stride: usize,
        kq_scale: f32,
        scores: [&mut [f32]; H],
    ) {
        let (hd, n) = super::heads_shape(&q, &scores);
        let mut scores = scores;
        if hd == 0 || n == 0 {
            scores.iter_mut().for_each(|s| s.fill(0.0));
            return;
        }
        let scale = _mm512_set1_ps(kq_scale);
        let whole = super::in_place(kt.len(), hd, stride, n, 16);
        for p0 in (0..whole.min(n)).step_by(16) {
            let m = (n - p0).min(16);
            // SAFETY: kt holds rows i < hd's positions to p0 + 16 <= whole (in_place).
            let acc = block_t(&q, kt.as_ptr(), stride, p0);
            for (a, s) in acc.iter().zip(scores.iter_mut()) {
                finish_t(a, scale, &mut s[p0..p0 + m]);
            }
        }
        if whole < n {
            let tail = super::tail_block(kt, hd, stride, whole, n, 16);
            // SAFETY: tail holds hd rows of 16.
            let acc = block_t(&q, tail.as_ptr(), 16, 0);
            for (a, s) in acc.iter().zip(scores.iter_mut()) {
                finish_t(a, scale, &mut s[whole..]);
            }
        }
    }

    /// [`block_t`]'s sums of one query reduced as [`super::scores_t_portable`] reduces them,
    /// times `scale`, into `out` (up to 16 positions).
    #[inline(always)]
    unsafe fn finish_t(a: &[__m512; 8], scale: __m512, out: &mut [f32]) {
        let y = _mm512_add_ps(
            _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
            _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])),
        );
        let mut v = [0f32; 16];
        _mm512_storeu_ps(v.as_mut_ptr(), _mm512_mul_ps(y, scale));
        let m = out.len();
        out.copy_from_slice(&v[..m]);
    }

    /// `C` 16-value columns from `d` of [`weighted_rows`] for `H` weightings, each row load
    /// shared by all.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn weighted_pass<const H: usize, const C: usize, V: KvElem>(
        w: [&[f32]; H],
        vp: *const V,
        hd: usize,
        d: usize,
        out: &mut [&mut [f32]; H],
    ) {
        let mut acc = [[_mm512_setzero_ps(); C]; H];
        for p in 0..w[0].len() {
            let b = w.map(|wh| _mm512_set1_ps(wh[p]));
            for j in 0..C {
                let x = load16(vp.add(p * hd + d + 16 * j));
                for h in 0..H {
                    acc[h][j] = _mm512_add_ps(acc[h][j], _mm512_mul_ps(b[h], x));
                }
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            for (j, a) in a.iter().enumerate() {
                _mm512_storeu_ps(o[d + 16 * j..d + 16 * j + 16].as_mut_ptr(), *a);
            }
        }
    }

    /// [`super::weighted_rows_portable`] for `H` weightings of the same rows, 128 values
    /// (eight 512-bit accumulators a weighting) a pass, then 64, then 16, then one by one, each row
    /// load shared by all: each value's terms in position order from 0, as there.
    ///
    /// # Safety
    /// AVX-512F is present. Panics unless the weightings share a length, the outputs a length
    /// `hd`, and `v` holds `w.len()` rows of `hd` values (f16 or f32).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn weighted_rows<const H: usize, V: KvElem>(
        w: [&[f32]; H],
        v: &[V],
        out: [&mut [f32]; H],
    ) {
        let mut out = out;
        let (np, hd) = super::heads_shape(&w, &out);
        assert!(v.len() >= np * hd, "v too short");
        let vp = v.as_ptr();
        let mut d = 0;
        while d + 128 <= hd {
            // SAFETY: rows p < np hold hd values, d + 128 <= hd (asserted).
            weighted_pass::<H, 8, V>(w, vp, hd, d, &mut out);
            d += 128;
        }
        // 64 values a pass where 128 do not fit (head_dim 64, 80): with one 16-value column a
        // pass, two heads' accumulators made two dependent chains of adds, and SmolLM2's
        // values took 1.5 times the AVX2 form's time.
        while d + 64 <= hd {
            // SAFETY: as above, d + 64 <= hd.
            weighted_pass::<H, 4, V>(w, vp, hd, d, &mut out);
            d += 64;
        }
        while d + 16 <= hd {
            // SAFETY: as above, d + 16 <= hd.
            weighted_pass::<H, 1, V>(w, vp, hd, d, &mut out);
            d += 16;
        }
        super::weighted_tail(&w, v, &mut out, d);
    }
}

/// The attention's two products and the softmax's exp on 128-bit NEON vectors (every aarch64
/// CPU), each value's terms and their order the portable forms' (a multiply, then an add;
/// never fused: `vmulq_f32` and `vaddq_f32` stay two instructions, LLVM contracts nothing
/// here), so the bits are theirs. f16 keys and values are widened by `fcvtl` (base AdvSIMD,
/// exact) as they are loaded, so a decode step reads the cache in place.
#[cfg(target_arch = "aarch64")]
mod attn128 {
    use super::KvElem;
    use std::arch::aarch64::*;

    /// Four binary16 values (bits) as f32 by `fcvtl` (exact). Through `asm!`: the intrinsic
    /// (`vcvt_f32_f16`) takes a `float16x4_t`, which needs Rust's unstable `f16` type. Not
    /// `preserves_flags`: a signaling NaN sets FPSR's invalid-operation bit (the cache holds
    /// only quiet NaNs, but the promise would be false).
    #[inline(always)]
    unsafe fn widen4(h: uint16x4_t) -> float32x4_t {
        let out: float32x4_t;
        std::arch::asm!(
            "fcvtl {0:v}.4s, {1:v}.4h",
            out(vreg) out,
            in(vreg) h,
            options(pure, nomem, nostack)
        );
        out
    }

    /// The upper four of eight binary16 values as f32 by `fcvtl2` (exact).
    #[inline(always)]
    unsafe fn widen4_high(h: uint16x8_t) -> float32x4_t {
        let out: float32x4_t;
        std::arch::asm!(
            "fcvtl2 {0:v}.4s, {1:v}.8h",
            out(vreg) out,
            in(vreg) h,
            options(pure, nomem, nostack)
        );
        out
    }

    /// `4 * V` cache elements from `p` as `V` vectors of f32 (`V` is 1 or 2).
    #[inline(always)]
    unsafe fn load<const V: usize, K: KvElem>(p: *const K) -> [float32x4_t; V] {
        if K::F16 {
            if V == 2 {
                let h = vld1q_u16(p.cast());
                let w = [widen4(vget_low_u16(h)), widen4_high(h)];
                std::array::from_fn(|j| w[j])
            } else {
                std::array::from_fn(|j| widen4(vld1_u16(p.cast::<u16>().add(4 * j))))
            }
        } else {
            std::array::from_fn(|j| vld1q_f32(p.cast::<f32>().add(4 * j)))
        }
    }

    /// [`super::exp_portable`] in 4 lanes: the same operations in the same order.
    #[inline(always)]
    unsafe fn exp4(x: float32x4_t) -> float32x4_t {
        use super::expc::*;
        let xc = vminq_f32(vmaxq_f32(x, vdupq_n_f32(XMIN)), vdupq_n_f32(0.0));
        let round = vdupq_n_f32(ROUND);
        let n = vsubq_f32(vaddq_f32(vmulq_f32(xc, vdupq_n_f32(LOG2E)), round), round);
        let r = vsubq_f32(
            vsubq_f32(xc, vmulq_f32(n, vdupq_n_f32(C1))),
            vmulq_f32(n, vdupq_n_f32(C2)),
        );
        let z = vmulq_f32(r, r);
        let mut y = vdupq_n_f32(P[0]);
        for &c in &P[1..] {
            y = vaddq_f32(vmulq_f32(y, r), vdupq_n_f32(c));
        }
        let y = vaddq_f32(vaddq_f32(vmulq_f32(y, z), r), vdupq_n_f32(1.0));
        // n is an integer (-126 ..= 0 where the lane is used): truncation is exact.
        let e = vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)));
        let y = vmulq_f32(y, vreinterpretq_f32_s32(e));
        let under = vcltq_f32(x, vdupq_n_f32(XMIN));
        let number = vceqq_f32(x, x);
        vbslq_f32(number, vbslq_f32(under, vdupq_n_f32(0.0), y), x)
    }

    /// [`super::softmax`]'s exponentials of `scores - m` in place and their eight partial
    /// sums (positions `p % 8 == j` into sum `j`, in order).
    ///
    /// # Safety
    /// NEON is present (every aarch64 CPU).
    pub unsafe fn exp_sums(scores: &mut [f32], m: f32) -> [f64; 8] {
        let (n8, mv) = (scores.len() / 8 * 8, vdupq_n_f32(m));
        let mut acc = [vdupq_n_f64(0.0); 4];
        let sp = scores.as_mut_ptr();
        for p in (0..n8).step_by(8) {
            for h in 0..2 {
                // SAFETY: p + 8 <= scores.len().
                let at = sp.add(p + 4 * h);
                let y = exp4(vsubq_f32(vld1q_f32(at), mv));
                vst1q_f32(at, y);
                acc[2 * h] = vaddq_f64(acc[2 * h], vcvt_f64_f32(vget_low_f32(y)));
                acc[2 * h + 1] = vaddq_f64(acc[2 * h + 1], vcvt_high_f64_f32(y));
            }
        }
        let mut sums = [0f64; 8];
        for (j, a) in acc.iter().enumerate() {
            vst1q_f64(sums.as_mut_ptr().add(2 * j), *a);
        }
        super::exp_sums_tail(scores, n8, m, &mut sums);
        sums
    }

    /// [`super::swiglu_slice`] on 4 lanes ([`super::silu`]'s operations); returns the
    /// values done (whole vectors), the caller does the rest.
    ///
    /// # Safety
    /// NEON is present (every aarch64 CPU).
    pub unsafe fn swiglu(g: &mut [f32], u: &[f32]) -> usize {
        let n4 = g.len().min(u.len()) / 4 * 4;
        let (one, zero) = (vdupq_n_f32(1.0), vdupq_n_f32(0.0));
        let gp = g.as_mut_ptr();
        for i in (0..n4).step_by(4) {
            // SAFETY: i + 4 <= both lengths.
            let x = vld1q_f32(gp.add(i));
            let t = exp4(vnegq_f32(vabsq_f32(x)));
            let num = vbslq_f32(vcgeq_f32(x, zero), x, vmulq_f32(x, t));
            let s = vdivq_f32(num, vaddq_f32(one, t));
            vst1q_f32(gp.add(i), vmulq_f32(s, vld1q_f32(u.as_ptr().add(i))));
        }
        n4
    }

    /// The `4 * V` positions' accumulators from `p0` of [`scores_t`] for `H` queries: lane
    /// `j` of `acc[h][v][l]` is position `p0 + 4v + j`'s lane `l` (elements `i` with `i % 8
    /// == l`) of query `h`.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn block_t<const H: usize, const V: usize, K: KvElem>(
        q: &[&[f32]; H],
        kp: *const K,
        stride: usize,
        p0: usize,
    ) -> [[[float32x4_t; 8]; V]; H] {
        let hd = q[0].len();
        let n8 = hd / 8 * 8;
        let mut acc = [[[vdupq_n_f32(0.0); 8]; V]; H];
        let mut step = |i: usize, l: usize| {
            let k = load::<V, K>(kp.add(i * stride + p0));
            for h in 0..H {
                let qi = *q[h].get_unchecked(i);
                for v in 0..V {
                    acc[h][v][l] = vaddq_f32(acc[h][v][l], vmulq_n_f32(k[v], qi));
                }
            }
        };
        for c in (0..n8).step_by(8) {
            for l in 0..8 {
                step(c + l, l);
            }
        }
        for l in 0..hd - n8 {
            step(n8 + l, l);
        }
        acc
    }

    /// [`block_t`]'s sums of one query's `4 * V` positions reduced as
    /// [`super::scores_t_portable`] reduces them, times `scale`, into `out` (up to `4 * V`
    /// positions).
    #[inline(always)]
    unsafe fn finish_t<const V: usize>(a: &[[float32x4_t; 8]; V], scale: f32, out: &mut [f32]) {
        let mut y = [0f32; 8];
        for (v, a) in a.iter().enumerate() {
            let s = vaddq_f32(
                vaddq_f32(vaddq_f32(a[0], a[4]), vaddq_f32(a[2], a[6])),
                vaddq_f32(vaddq_f32(a[1], a[5]), vaddq_f32(a[3], a[7])),
            );
            vst1q_f32(y.as_mut_ptr().add(4 * v), vmulq_n_f32(s, scale));
        }
        let m = out.len();
        out.copy_from_slice(&y[..m]);
    }

    /// [`scores_t`] with blocks of `4 * V` positions (16 accumulators: `H * V == 2`).
    #[inline(always)]
    unsafe fn scores_t_blocks<const H: usize, const V: usize, K: KvElem>(
        q: [&[f32]; H],
        kt: &[K],
        stride: usize,
        kq_scale: f32,
        scores: &mut [&mut [f32]; H],
    ) {
        let (hd, n, b) = (q[0].len(), scores[0].len(), 4 * V);
        let whole = super::in_place(kt.len(), hd, stride, n, b);
        for p0 in (0..whole.min(n)).step_by(b) {
            let m = (n - p0).min(b);
            // SAFETY: kt holds rows i < hd's positions to p0 + b <= whole (in_place).
            let acc = block_t::<H, V, K>(&q, kt.as_ptr(), stride, p0);
            for (a, s) in acc.iter().zip(scores.iter_mut()) {
                finish_t(a, kq_scale, &mut s[p0..p0 + m]);
            }
        }
        if whole < n {
            let tail = super::tail_block(kt, hd, stride, whole, n, b);
            // SAFETY: tail holds hd rows of b.
            let acc = block_t::<H, V, K>(&q, tail.as_ptr(), b, 0);
            for (a, s) in acc.iter().zip(scores.iter_mut()) {
                finish_t(a, kq_scale, &mut s[whole..]);
            }
        }
    }

    /// [`super::scores_t_portable`] for one or two queries of the same length over the same
    /// transposed keys (the cache itself: f16 widened by `fcvtl` as they are loaded, or
    /// f32): 8 positions a block for one query, 4 for two, each key load shared by both,
    /// each query's terms and order as there. The last partial block is copied first, so
    /// `kt` needs only the scores' positions in each row.
    ///
    /// # Safety
    /// NEON is present (every aarch64 CPU). Panics unless `H` is 1 or 2, the queries share a
    /// length, the score slices a length `n`, and `kt` holds `q[0].len()` rows of `stride`
    /// values with `n <= stride` positions in each.
    pub unsafe fn scores_t<const H: usize, K: KvElem>(
        q: [&[f32]; H],
        kt: &[K],
        stride: usize,
        kq_scale: f32,
        scores: [&mut [f32]; H],
    ) {
        assert!(H == 1 || H == 2, "one or two queries");
        let (hd, n) = super::heads_shape(&q, &scores);
        let mut scores = scores;
        if hd == 0 || n == 0 {
            scores.iter_mut().for_each(|s| s.fill(0.0));
            return;
        }
        if H == 1 {
            scores_t_blocks::<H, 2, K>(q, kt, stride, kq_scale, &mut scores)
        } else {
            scores_t_blocks::<H, 1, K>(q, kt, stride, kq_scale, &mut scores)
        }
    }

    /// `C` 4-value columns from `d` of [`weighted_rows`] for `H` weightings, each row load
    /// shared by all.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn weighted_pass<const H: usize, const C: usize, V: KvElem>(
        w: [&[f32]; H],
        vp: *const V,
        hd: usize,
        d: usize,
        out: &mut [&mut [f32]; H],
    ) {
        let mut acc = [[vdupq_n_f32(0.0); C]; H];
        for p in 0..w[0].len() {
            let b = w.map(|wh| *wh.get_unchecked(p));
            let row = vp.add(p * hd + d);
            let mut j = 0;
            while j < C {
                // Two columns a load where two are left (one `ldr q` and `fcvtl`/`fcvtl2`
                // for f16), else one.
                if j + 2 <= C {
                    let x = load::<2, V>(row.add(4 * j));
                    for h in 0..H {
                        acc[h][j] = vaddq_f32(acc[h][j], vmulq_n_f32(x[0], b[h]));
                        acc[h][j + 1] = vaddq_f32(acc[h][j + 1], vmulq_n_f32(x[1], b[h]));
                    }
                    j += 2;
                } else {
                    let [x] = load::<1, V>(row.add(4 * j));
                    for h in 0..H {
                        acc[h][j] = vaddq_f32(acc[h][j], vmulq_n_f32(x, b[h]));
                    }
                    j += 1;
                }
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            for (j, a) in a.iter().enumerate() {
                vst1q_f32(o[d + 4 * j..d + 4 * j + 4].as_mut_ptr(), *a);
            }
        }
    }

    /// [`super::weighted_rows_portable`] for `H` weightings of the same rows: 64 values (16
    /// accumulators) a pass for one weighting, 32 for two, then 16, then 4, then one by one,
    /// each row load shared by all: each value's terms in position order from 0, as there.
    ///
    /// # Safety
    /// NEON is present (every aarch64 CPU). Panics unless the weightings share a length, the
    /// outputs a length `hd`, and `v` holds `w.len()` rows of `hd` values (f16 or f32).
    pub unsafe fn weighted_rows<const H: usize, V: KvElem>(
        w: [&[f32]; H],
        v: &[V],
        out: [&mut [f32]; H],
    ) {
        let mut out = out;
        let (np, hd) = super::heads_shape(&w, &out);
        assert!(v.len() >= np * hd, "v too short");
        let vp = v.as_ptr();
        let mut d = 0;
        if H == 1 {
            while d + 64 <= hd {
                // SAFETY: rows p < np hold hd values, d + 64 <= hd (asserted).
                weighted_pass::<H, 16, V>(w, vp, hd, d, &mut out);
                d += 64;
            }
        } else {
            while d + 32 <= hd {
                // SAFETY: as above, d + 32 <= hd.
                weighted_pass::<H, 8, V>(w, vp, hd, d, &mut out);
                d += 32;
            }
        }
        while d + 16 <= hd {
            // SAFETY: as above, d + 16 <= hd.
            weighted_pass::<H, 4, V>(w, vp, hd, d, &mut out);
            d += 16;
        }
        while d + 4 <= hd {
            // SAFETY: as above, d + 4 <= hd.
            weighted_pass::<H, 1, V>(w, vp, hd, d, &mut out);
            d += 4;
        }
        super::weighted_tail(&w, v, &mut out, d);
    }
}

/// One or two query heads of one KV head at one position: for each, `softmax(q k^T *
/// kq_scale) v` over the attended positions (`n` of them in `keys` and in `v`'s rows), the
/// max subtracted first, the normalizer summed in f64. The one definition for decode and
/// prefill, so a position's output has the same bits however its tokens were grouped; a head
/// has the same bits alone or beside another and in every form (two share each load of K and
/// V: the products read them from the cache, and a prompt's attention is bound by that read).
/// The keys and values are the cache's own elements `K` (f16 or f32) or widened f32 copies.
#[allow(clippy::too_many_arguments)]
fn attend_heads<K: KvElem>(
    form: AttnForm,
    q: &[&[f32]],
    keys: Keys<K>,
    n: usize,
    v: &[K],
    kq_scale: f32,
    scores: &mut [Vec<f32>; 2],
    out: &mut [&mut [f32]],
) {
    for s in scores.iter_mut() {
        s.clear();
        s.resize(n, 0.0);
    }
    let [s0, s1] = scores;
    match (q, &mut *out) {
        ([q0, q1], [o0, o1]) => {
            self::scores(form, [q0, q1], keys, kq_scale, [s0, s1]);
            softmax(form, s0);
            softmax(form, s1);
            weighted_rows(form, [s0, s1], v, [o0, o1]);
        }
        _ => {
            for (q, o) in q.iter().zip(out.iter_mut()) {
                self::scores(form, [q], keys, kq_scale, [s0]);
                softmax(form, s0);
                weighted_rows(form, [s0], v, [o]);
            }
        }
    }
}

/// `scores = exp(scores - max) / sum` ([`exp_portable`]'s exp in every form), the sum of the
/// exponentials in f64 in eight partial sums (position `p` into sum `p % 8`, each in position
/// order, added `((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7))`). `form` picks the
/// instructions, never the bits.
fn softmax(form: AttnForm, scores: &mut [f32]) {
    assert!(form.here(), "{form:?} needs instructions this CPU lacks");
    let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let s = match form {
        // SAFETY: the form's instructions are present (asserted).
        #[cfg(target_arch = "x86_64")]
        AttnForm::Avx512 => unsafe { attn512::exp_sums(scores, m) },
        #[cfg(target_arch = "x86_64")]
        AttnForm::Avx2 => unsafe { attn256::exp_sums(scores, m) },
        #[cfg(target_arch = "aarch64")]
        AttnForm::Neon => unsafe { attn128::exp_sums(scores, m) },
        _ => {
            let mut s = [0f64; 8];
            exp_sums_tail(scores, 0, m, &mut s);
            s
        }
    };
    let sum = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
    let inv = (1.0 / sum) as f32;
    for s in scores.iter_mut() {
        *s *= inv;
    }
}

/// [`softmax`]'s exponentials from position `p0` on, one at a time, into their partial sums.
fn exp_sums_tail(scores: &mut [f32], p0: usize, m: f32, sums: &mut [f64; 8]) {
    for (p, s) in scores.iter_mut().enumerate().skip(p0) {
        *s = exp_portable(*s - m);
        sums[p % 8] += *s as f64;
    }
}

/// The constants of [`exp_portable`]: Cephes' `expf` (S. Moshier, Cephes Math Library,
/// `expf.c`), whose polynomial the ggml and Eigen vector exps descend from.
mod expc {
    /// The f32 just below `ln(2^-126)`: from it up, `n >= -126` and the scale `2^n` is a
    /// normal f32; below it the result is 0 (`exp(XMIN)` itself is a subnormal 1.1755e-38).
    pub const XMIN: f32 = -87.336_55;
    pub const LOG2E: f32 = std::f32::consts::LOG2_E;
    /// `1.5 * 2^23`: added and subtracted, it rounds to the nearest integer (ties to even).
    pub const ROUND: f32 = 12_582_912.0;
    /// `ln 2` in two parts: `C1` has 9 significant bits, so `n * C1` is exact.
    pub const C1: f32 = 0.693_359_4;
    pub const C2: f32 = -2.121_944_4e-4;
    pub const P: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ];
}

/// `exp(x)` for `x <= 0` (softmax's `s - max`; larger `x` give 1), within 1 ulp of the exact
/// value (0.982 ulp the worst over every f32 in `[XMIN, 0]`): `x = n ln 2 + r` with `n` the
/// nearest integer to `x / ln 2`, `exp(r)` by Cephes' polynomial, times `2^n` built in the
/// exponent bits; 0 below [`expc::XMIN`] (and for `-inf`), NaN kept. Plain multiplies and
/// adds in a fixed order, no fused multiply-add, so the vector forms (`attn256::exp8`,
/// `attn512::exp16`, `attn128::exp4`) give these bits in every lane.
#[inline(always)]
fn exp_portable(x: f32) -> f32 {
    use expc::*;
    let xc = x.clamp(XMIN, 0.0);
    let n = (xc * LOG2E + ROUND) - ROUND;
    let r = (xc - n * C1) - n * C2;
    let z = r * r;
    let mut y = P[0];
    for c in &P[1..] {
        y = y * r + c;
    }
    let y = (y * z + r) + 1.0;
    let y = y * f32::from_bits(((n as i32 + 127) as u32) << 23);
    if x.is_nan() {
        x
    } else if x < XMIN {
        0.0
    } else {
        y
    }
}

/// One KV head's keys of the positions `lo .. lo + m` widened as rows (`kr[p * hd + d]`,
/// `kr.len() == m * hd`) from the transposed cache (`kc[d * slots + pos]`, `hd` rows of
/// `slots`): eight of its rows at a time widened, then interleaved.
fn widen_rows<T: KvElem>(kc: &[T], slots: usize, lo: usize, m: usize, kr: &mut [f32]) {
    let hd = kc.len() / slots;
    assert!(
        kr.len() == m * hd && lo + m <= slots,
        "key rows of {m} positions"
    );
    // Blocks of positions whose 8 widened rows stay in L1 (8 KiB).
    const PB: usize = 256;
    let mut tmp = vec![0f32; 8 * PB];
    for p0 in (0..m).step_by(PB) {
        let pm = (m - p0).min(PB);
        let kb = &mut kr[p0 * hd..(p0 + pm) * hd];
        for d0 in (0..hd).step_by(8) {
            let w = (hd - d0).min(8);
            for j in 0..w {
                let at = (d0 + j) * slots + lo + p0;
                T::widen(&kc[at..at + pm], &mut tmp[j * pm..(j + 1) * pm]);
            }
            // Whole 8 x 8 blocks transposed in registers where AVX2 runs.
            #[cfg(target_arch = "x86_64")]
            let done = if w == 8 && AttnForm::Avx2.here() {
                // SAFETY: AVX2 is present; the lengths are checked inside.
                unsafe { attn256::interleave8(&tmp, pm, kb, hd, d0) }
            } else {
                0
            };
            #[cfg(not(target_arch = "x86_64"))]
            let done = 0;
            for (p, row) in kb.chunks_exact_mut(hd).enumerate().skip(done) {
                for (j, x) in row[d0..d0 + w].iter_mut().enumerate() {
                    *x = tmp[j * pm + p];
                }
            }
        }
    }
}

/// Writes the K and V of the positions `start .. start + n` (`k`, `v`: `[n][n_head_kv *
/// hd]`), then attends every head of every position over `lo(pos)..=pos` ([`attend_heads`]);
/// `q` and `out` are `[n][n_head * hd]`. The query heads run in parallel, two of one KV head
/// a task. A decode step (one position) on a vector form reads the keys and values from the
/// cache itself, f16 widened as they are loaded (widening the whole span first, once per
/// step, cost more than the products at long contexts), except the AVX2 form's key rows;
/// a prompt's span widens each KV head's keys and values once (in parallel over KV heads),
/// which its many queries repay. Either way the same terms in the same order: the same bits.
#[allow(clippy::too_many_arguments)]
fn attend<T: KvElem>(
    kc: &mut [T],
    vc: &mut [T],
    n: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    sh: &AttnShape,
) {
    let (hd, nctx, slots, start) = (sh.hd, sh.nctx, sh.slots, sh.start);
    assert!(
        start + n <= nctx && nctx <= slots,
        "positions {start} + {n} past the context {nctx}"
    );
    let (nq, nk) = (q.len() / n, k.len() / n);
    let nkv = nk / hd;
    for t in 0..n {
        for kh in 0..nkv {
            let head = sh.layer_base + kh * slots * hd;
            for d in 0..hd {
                kc[head + d * slots + start + t] = T::store(k[t * nk + kh * hd + d]);
                vc[head + (start + t) * hd + d] = T::store(v[t * nk + kh * hd + d]);
            }
        }
    }
    let (kc, vc) = (&*kc, &*vc);
    let (lo0, end) = (sh.lo(start), start + n);
    let m = end - lo0;
    let direct = n == 1 && sh.form != AttnForm::Portable;
    let span_form = sh.form.for_span(n, sh.group, hd);
    let key_rows = span_form == AttnForm::Avx2;
    let form = if direct { sh.form } else { span_form };
    // Row stride of the widened transposed keys: positions padded to a multiple of 16, and
    // 16 more, so that the products' 8- or 16-position steps from any first position read
    // their last partial step in place, and rows are not a multiple of 4 KiB apart (which
    // maps every row's line to one L1 set: the scores ran at half speed with such strides).
    let stride = m.div_ceil(16) * 16 + 16;
    // A decode step over a short span runs on this thread: there a fork-join over the pool
    // cost more than the work (Gemma 3 at ~40 positions: 1.22 ms of attention a step on two
    // threads, 0.81 on one; BENCHMARKS.md, "Decode below llama.cpp on the Intel VM"). Each
    // unit computes the same values wherever it runs.
    let serial = n == 1 && m * nq <= ATTN_SERIAL_WORK;
    let widen = |kh: usize| {
        let head = sh.layer_base + kh * slots * hd;
        let keys = if key_rows {
            let mut kr = vec![0f32; m * hd];
            widen_rows(&kc[head..head + hd * slots], slots, lo0, m, &mut kr);
            kr
        } else if direct {
            return Widened::InPlace;
        } else {
            let mut kt = vec![0f32; hd * stride];
            for (d, row) in kt.chunks_exact_mut(stride).enumerate() {
                let at = head + d * slots + lo0;
                T::widen(&kc[at..at + m], &mut row[..m]);
            }
            kt
        };
        if direct {
            return Widened::KeyRows(keys);
        }
        let mut vr = vec![0f32; m * hd];
        T::widen(&vc[head + lo0 * hd..head + end * hd], &mut vr);
        Widened::Both(keys, vr)
    };
    let widened: Vec<Widened> = if serial {
        (0..nkv).map(widen).collect()
    } else {
        team::map(nkv, widen)
    };
    // Tasks of two query heads of one KV head (one where a group is odd), which share each
    // load of the keys and values.
    let units: Vec<(usize, usize)> = (0..nq / hd / sh.group)
        .flat_map(|kh| {
            let first = kh * sh.group;
            (first..first + sh.group)
                .step_by(2)
                .map(move |h| (h, (first + sh.group - h).min(2)))
        })
        .collect();
    let run = |&(head, count): &(usize, usize)| {
        let kh = head / sh.group;
        let base = sh.layer_base + kh * slots * hd;
        let u = Unit {
            form,
            q,
            head,
            count,
            n,
            lo0,
            sh,
        };
        match &widened[kh] {
            Widened::KeyRows(rows) => u.run(Keys::Rows { rows, hd }, &vc[base + lo0 * hd..]),
            Widened::InPlace => u.run(
                Keys::T {
                    kt: &kc[base + lo0..],
                    stride: slots,
                },
                &vc[base + lo0 * hd..],
            ),
            Widened::Both(kw, vr) => {
                let keys = if key_rows {
                    Keys::Rows { rows: kw, hd }
                } else {
                    Keys::T { kt: kw, stride }
                };
                u.run(keys, vr)
            }
        }
    };
    let heads: Vec<Vec<f32>> = if serial {
        units.iter().map(run).collect()
    } else {
        team::map(units.len(), |i| run(&units[i]))
    };
    for (&(head, _), res) in units.iter().zip(&heads) {
        for (c, per_head) in res.chunks_exact(n * hd).enumerate() {
            let h = head + c;
            for (t, o) in per_head.chunks_exact(hd).enumerate() {
                out[t * nq + h * hd..t * nq + (h + 1) * hd].copy_from_slice(o);
            }
        }
    }
}

/// The most `span x query dims` (half the multiply-accumulates of a decode step's attention
/// in one layer) that [`attend`] runs on the calling thread: 131,072 is Gemma 3 270M's 1,024
/// query dims over 128 positions, SmolLM2's 576 over 227, the 8B shape's 4,096 over 32.
const ATTN_SERIAL_WORK: usize = 1 << 17;

/// One KV head's keys and values as [`attend`]'s products read them.
enum Widened {
    /// Both read from the cache in place (a decode step on a vector form).
    InPlace,
    /// The keys widened as rows, the values read in place (a decode step of the AVX2 form
    /// where a KV head serves 8 or more query heads).
    KeyRows(Vec<f32>),
    /// The keys (rows or transposed) and the values widened (a prompt's span).
    Both(Vec<f32>, Vec<f32>),
}

/// One task of [`attend`]: `count` query heads from `head` (of one KV head) at each position
/// of the span.
struct Unit<'a> {
    form: AttnForm,
    q: &'a [f32],
    head: usize,
    count: usize,
    n: usize,
    /// First position the span attends (the keys' and values' first).
    lo0: usize,
    sh: &'a AttnShape,
}

impl Unit<'_> {
    /// The heads' outputs, `[count][n][hd]`, over `keys` and the value rows `v` (both from
    /// position `lo0`).
    fn run<K: KvElem>(&self, keys: Keys<K>, v: &[K]) -> Vec<f32> {
        let (sh, hd, n, head, count) = (self.sh, self.sh.hd, self.n, self.head, self.count);
        let nq = self.q.len() / n;
        let mut res = vec![0f32; count * n * hd];
        let mut scores = [Vec::new(), Vec::new()];
        let (r0, r1) = res.split_at_mut(n * hd);
        let mut rows: Vec<std::slice::ChunksExactMut<f32>> = vec![r0.chunks_exact_mut(hd)];
        if count == 2 {
            rows.push(r1.chunks_exact_mut(hd));
        }
        for t in 0..n {
            let pos = sh.start + t;
            let a = sh.lo(pos) - self.lo0;
            let qs: Vec<&[f32]> = (head..head + count)
                .map(|h| &self.q[t * nq + h * hd..t * nq + (h + 1) * hd])
                .collect();
            let mut os: Vec<&mut [f32]> =
                rows.iter_mut().map(|r| r.next().expect("n rows")).collect();
            let vt = &v[a * hd..(pos + 1 - self.lo0) * hd];
            let len = pos + 1 - sh.lo(pos);
            attend_heads(
                self.form,
                &qs,
                keys.from(a),
                len,
                vt,
                sh.kq_scale,
                &mut scores,
                &mut os,
            );
        }
        res
    }
}

/// ggml's RoPE cache for one position: `cache[2i], cache[2i + 1] = cos, sin` of
/// `theta_i = freq_scale * (theta / factor_i)` times `attn_factor`, with `theta = pos`
/// multiplied by `base^(-2 / n_rot)` after each pair, all in f32 (`cache` holds `n_rot`
/// values). The GPU backend uploads these same values as its RoPE table.
pub fn rope_cache(
    pos: usize,
    n_rot: usize,
    base: f32,
    freq_scale: f32,
    attn_factor: f32,
    factors: Option<&[f32]>,
    cache: &mut [f32],
) {
    let theta_scale = base.powf(-2.0 / n_rot as f32);
    let mut theta = pos as f32;
    for i in 0..n_rot / 2 {
        let ff = factors.map(|f| f[i]).unwrap_or(1.0);
        let t = freq_scale * (theta / ff);
        cache[2 * i] = t.cos() * attn_factor;
        cache[2 * i + 1] = t.sin() * attn_factor;
        theta *= theta_scale;
    }
}

/// RMSNorm as ggml's CPU kernel: the sum of squares in f64, `x * (1 / sqrt(mean + eps))`,
/// then the weight.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
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

/// `x / (1 + exp(-x))` with [`exp_portable`]'s exp, so the same bits on every CPU, libm and
/// vector form ([`swiglu_slice`]): `t = exp(-|x|)` (never overflows), then `x / (1 + t)` for
/// `x >= 0` and `x t / (1 + t)` (that is, `x / (1 + 1/t)`) below 0. Within 3 ulp of the exact
/// value (checked once over every f32 from -87.34 to 88.8; the unit test takes 1 in 61);
/// below -87.34 it gives -0.0 where the exact value is under 1.1e-36 in magnitude. NaN and
/// -inf give NaN (as the formula does in f32).
pub fn silu(x: f32) -> f32 {
    let t = exp_portable(-x.abs());
    if x >= 0.0 {
        x / (1.0 + t)
    } else {
        (x * t) / (1.0 + t)
    }
}

/// `g[i] = silu(g[i]) * u[i]` (SwiGLU's gating; [`silu`]'s bits) in the attention's vector
/// form ([`AttnForm::detect`]: 16, 8 or 4 lanes), the same operations in every lane.
pub fn swiglu_slice(g: &mut [f32], u: &[f32]) {
    swiglu_in(AttnForm::detect(), g, u)
}

/// [`swiglu_slice`] in `form`.
fn swiglu_in(form: AttnForm, g: &mut [f32], u: &[f32]) {
    assert_eq!(g.len(), u.len(), "swiglu_slice lengths");
    assert!(form.here(), "{form:?} needs instructions this CPU lacks");
    let done = match form {
        // SAFETY: the form's instructions are present (asserted), the lengths equal.
        #[cfg(target_arch = "x86_64")]
        AttnForm::Avx512 => unsafe { attn512::swiglu(g, u) },
        #[cfg(target_arch = "x86_64")]
        AttnForm::Avx2 => unsafe { attn256::swiglu(g, u) },
        #[cfg(target_arch = "aarch64")]
        AttnForm::Neon => unsafe { attn128::swiglu(g, u) },
        _ => 0,
    };
    for (gi, ui) in g[done..].iter_mut().zip(&u[done..]) {
        *gi = silu(*gi) * ui;
    }
}

/// `gelu(x)` for every f16 `x`, rounded to f16: ggml's `ggml_table_gelu_f16`, built as
/// `ggml-cpu.c` builds it from `ggml_gelu_f32` (`0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715
/// x^2)))`, f32).
pub fn gelu_table() -> &'static [u16] {
    static T: std::sync::OnceLock<Vec<u16>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        const GELU_COEF_A: f32 = 0.044715;
        let sqrt_2_over_pi = (2.0f64 / std::f64::consts::PI).sqrt() as f32;
        (0..=u16::MAX)
            .map(|i| {
                let x = crate::quant::f16_bits_to_f32(i);
                let g = 0.5f32
                    * x
                    * (1.0f32 + (sqrt_2_over_pi * x * (1.0f32 + GELU_COEF_A * x * x)).tanh());
                half::f16::from_f32(g).to_bits()
            })
            .collect()
    })
}

/// `gelu(x) * g` as ggml's `ggml_vec_geglu_f32` computes it on the CPU (`GGML_GELU_FP16`):
/// `0` at or below -10, `x * g` at or above 10, else the table entry of `f16(x)` times `g`.
pub fn geglu(x: f32, g: f32, table: &[u16]) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x * g
    } else {
        crate::quant::f16_bits_to_f32(table[half::f16::from_f32(x).to_bits() as usize]) * g
    }
}

/// `g[i] = geglu(g[i], u[i])` ([`geglu`]'s bits): eight values at a time with F16C's
/// conversions where the CPU has them (the same rounding to f16 as `half`'s, round to nearest
/// even; the same exact widening), a block holding a NaN value one by one.
pub fn geglu_slice(g: &mut [f32], u: &[f32], table: &[u16]) {
    assert!(
        u.len() == g.len() && table.len() == 1 << 16,
        "geglu_slice lengths"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::isa::detect() != crate::isa::Isa::Portable
        && std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("f16c")
    {
        // SAFETY: AVX2 and F16C are present (checked above); lengths asserted above.
        return unsafe { geglu_f16c(g, u, table) };
    }
    geglu_each(g, u, table)
}

/// [`geglu`] value by value.
fn geglu_each(g: &mut [f32], u: &[f32], table: &[u16]) {
    for (gi, ui) in g.iter_mut().zip(u) {
        *gi = geglu(*gi, *ui, table);
    }
}

/// [`geglu_slice`] on AVX2 with F16C.
///
/// # Safety
/// AVX2 and F16C are present; `u.len() == g.len()`, `table.len() == 65536`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn geglu_f16c(g: &mut [f32], u: &[f32], table: &[u16]) {
    use std::arch::x86_64::*;
    let n8 = g.len() / 8 * 8;
    for i in (0..n8).step_by(8) {
        let x = _mm256_loadu_ps(g[i..i + 8].as_ptr());
        let w = _mm256_loadu_ps(u[i..i + 8].as_ptr());
        if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x)) != 0 {
            geglu_each(&mut g[i..i + 8], &u[i..i + 8], table);
            continue;
        }
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
        let mut hb = [0u16; 8];
        _mm_storeu_si128(hb.as_mut_ptr() as *mut __m128i, h);
        let tb = hb.map(|b| table[b as usize]);
        let gelu = _mm256_cvtph_ps(_mm_loadu_si128(tb.as_ptr() as *const __m128i));
        let mid = _mm256_mul_ps(gelu, w);
        let high = _mm256_mul_ps(x, w);
        let r = _mm256_blendv_ps(
            mid,
            high,
            _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(10.0)),
        );
        let r = _mm256_blendv_ps(
            r,
            _mm256_setzero_ps(),
            _mm256_cmp_ps::<_CMP_LE_OQ>(x, _mm256_set1_ps(-10.0)),
        );
        _mm256_storeu_ps(g[i..i + 8].as_mut_ptr(), r);
    }
    geglu_each(&mut g[n8..], &u[n8..], table)
}

/// Elements of K (and of V) in the KV cache, `n_layer * n_head_kv * kv_slots(n_ctx) * head_dim`, when
/// the cache of `elem_bytes`-byte elements fits this machine's physical memory. The pages are
/// zero and untouched until a position is written (calloc), so the bound is what the
/// allocation could come to, not what it costs at once.
fn kv_elements(c: &ModelConfig, elem_bytes: u64) -> Result<usize, RuntimeError> {
    let err = |detail: String| RuntimeError::KvCache {
        n_ctx: c.n_ctx,
        detail,
    };
    let slots = c
        .n_ctx
        .checked_add(KV_PAD as u64)
        .ok_or_else(|| err("the context overflows 64 bits".into()))?;
    let n = [c.n_head_kv, slots, c.head_dim]
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

/// `n` zeroed elements from the allocator's zeroed pages (`calloc`: untouched until written),
/// or `None` where the allocation is refused (`vec![0; n]` would abort the process).
fn zeroed<T: bytemuck::Zeroable>(n: usize) -> Option<Vec<T>> {
    let layout = std::alloc::Layout::array::<T>(n).ok()?;
    if layout.size() == 0 {
        return Some(Vec::new());
    }
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if p.is_null() {
        return None;
    }
    // SAFETY: p is the global allocator's, with the layout Vec<T> uses for capacity n, and
    // its n elements are initialized: all-zero bytes are a valid T (Zeroable).
    Some(unsafe { Vec::from_raw_parts(p, n, n) })
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

/// Small per-layer vectors, decoded once at load.
struct LayerVecs {
    attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    post_attn_norm: Option<Vec<f32>>,
    post_ffn_norm: Option<Vec<f32>>,
}

/// The CPU backend: the model, its KV cache and the last position's logits.
pub struct CpuBackend {
    pub model: Model,
    kv: KvStore,
    /// The next position expected (positions are contiguous from 0).
    next_pos: usize,
    /// Logits of the last position run (valid when `has_logits`).
    logits: Vec<f32>,
    has_logits: bool,
    vecs: Vec<LayerVecs>,
    output_norm: Vec<f32>,
    kernel: Kernel,
    buckets: Vec<usize>,
    buckets_from: &'static str,
}

/// The kernel's view of a weight's bytes in the bundle's memory map.
fn view<'a>(w: &Weight, m: &'a Model) -> WeightData<'a> {
    let b = &m.bundle;
    match w.kind {
        WeightKind::Gguf { ty, range } => WeightData::Gguf {
            ty,
            bytes: w.bytes(b, range),
        },
        WeightKind::Ternary { codes, scales } => WeightData::Ternary {
            words: bytemuck::cast_slice(w.bytes(b, codes)),
            scales: bytemuck::cast_slice(w.bytes(b, scales)),
        },
        WeightKind::Palette { .. } => WeightData::Palette(
            w.palette_view(b)
                .expect("a palette weight has a palette view"),
        ),
    }
}

/// The prefill buckets of a bundle: the lengths `S` of its `prefill_S` functions.
pub fn bundle_buckets(m: &crate::bundle::manifest::Manifest) -> Vec<usize> {
    crate::bundle::manifest::prefill_buckets(&m.functions)
        .into_iter()
        .map(|b| b as usize)
        .collect()
}

/// The prefill buckets a backend uses and where they come from: the override in `opts`
/// (checked against the context), else the bundle's `prefill_S` functions, else the defaults
/// for a bundle made before prefill functions existed.
pub fn resolve_buckets(
    model: &Model,
    opts: &LoadOptions,
) -> Result<(Vec<usize>, &'static str), RuntimeError> {
    let c = &model.layout.cfg;
    Ok(match &opts.buckets {
        Some(b) => {
            let b64: Vec<u64> = b.iter().map(|&x| x as u64).collect();
            super::check_buckets(&b64, c.n_ctx)?;
            (b.clone(), "override")
        }
        None => {
            let b = bundle_buckets(&model.bundle.manifest);
            if b.is_empty() {
                let d = crate::bundle::manifest::default_prefill_buckets(c.n_ctx);
                (d.into_iter().map(|x| x as usize).collect(), "default")
            } else {
                (b, "bundle")
            }
        }
    })
}

impl CpuBackend {
    /// The backend for `model` with a KV cache of `n_ctx` positions. Errors when that cache
    /// cannot be allocated ([`RuntimeError::KvCache`], with the byte count) or an override of
    /// the buckets is not a valid list for the context.
    pub fn new(model: Model, opts: &LoadOptions) -> Result<CpuBackend, RuntimeError> {
        let c = &model.layout.cfg;
        let (buckets, buckets_from) = resolve_buckets(&model, opts)?;
        let n = kv_elements(
            c,
            match opts.kv {
                KvType::F16 => 2,
                KvType::F32 => 4,
            },
        )?;
        // Zeroed pages (calloc, as `vec![0; n]`), but a refused allocation is an error naming
        // the bytes, not an abort: a process limit (ulimit -v, a cgroup) can be far below the
        // physical memory `kv_elements` checks.
        let refused = |elem: usize| RuntimeError::KvCache {
            n_ctx: c.n_ctx,
            detail: format!(
                "allocating K and V ({} bytes each) failed: not enough memory for this process",
                n * elem
            ),
        };
        let kv = match opts.kv {
            KvType::F16 => KvStore::F16 {
                k: zeroed(n).ok_or_else(|| refused(2))?,
                v: zeroed(n).ok_or_else(|| refused(2))?,
            },
            KvType::F32 => KvStore::F32 {
                k: zeroed(n).ok_or_else(|| refused(4))?,
                v: zeroed(n).ok_or_else(|| refused(4))?,
            },
        };
        let b = &model.bundle;
        let ov = |w: &Option<Weight>| w.as_ref().map(|w| w.vector(b));
        let vecs = model
            .layers
            .iter()
            .map(|l| LayerVecs {
                attn_norm: l.attn_norm.vector(b),
                ffn_norm: l.ffn_norm.vector(b),
                bq: ov(&l.bq),
                bk: ov(&l.bk),
                bv: ov(&l.bv),
                q_norm: ov(&l.q_norm),
                k_norm: ov(&l.k_norm),
                post_attn_norm: ov(&l.post_attn_norm),
                post_ffn_norm: ov(&l.post_ffn_norm),
            })
            .collect();
        let output_norm = model.output_norm.vector(b);
        Ok(CpuBackend {
            kv,
            next_pos: 0,
            logits: vec![0f32; c.n_vocab as usize],
            has_logits: false,
            vecs,
            output_norm,
            kernel: opts.kernel,
            buckets,
            buckets_from,
            model,
        })
    }

    /// The matrix kernel in use.
    pub fn kernel(&self) -> Kernel {
        self.kernel
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

    /// `Y = W X` for the `n` rows of `xs` (one matrix-vector product when `n == 1`).
    fn mm(&self, w: &Weight, xs: &[f32], ys: &mut [f32]) {
        matvec::matmul_with(self.kernel, view(w, &self.model), w.cols, xs, ys);
    }

    /// [`CpuBackend::mm`] for weights that read the same activations (Q/K/V, gate/up):
    /// they are quantized and grouped once for all of them (the same bits).
    fn mm_shared(&self, w: &Weight, acts: &mut matvec::SharedActs, ys: &mut [f32]) {
        assert_eq!(
            w.cols,
            acts.cols(),
            "{}: activations of another width",
            w.name
        );
        matvec::matmul_shared(self.kernel, view(w, &self.model), ys, acts);
    }

    /// Rotates the first `n_rot` dims of each head of `v` in place, at `pos`, with the layer's
    /// base and frequency scale.
    fn rope(&self, v: &mut [f32], n_heads: usize, pos: usize, base: f32, freq_scale: f32) {
        let hp = &self.model.layout.hyper;
        let (hd, n_rot) = (hp.head_dim, hp.n_rot);
        let mut cache = vec![0f32; n_rot];
        rope_cache(
            pos,
            n_rot,
            base,
            freq_scale,
            hp.rope_attn_factor,
            self.model.rope_factors.as_deref(),
            &mut cache,
        );
        let neox = self.model.layout.spec.rope == RopeMode::Neox;
        for h in 0..n_heads {
            let x = &mut v[h * hd..(h + 1) * hd];
            for i in 0..n_rot / 2 {
                let (cos, sin) = (cache[2 * i], cache[2 * i + 1]);
                let (a, b) = if neox {
                    (i, i + n_rot / 2)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (x[a], x[b]);
                x[a] = x0 * cos - x1 * sin;
                x[b] = x0 * sin + x1 * cos;
            }
        }
    }

    /// Checks a span before any work: non-empty, ids in the vocabulary, contiguous, inside the
    /// context, at most the largest bucket (`max`).
    fn check_span(&self, tokens: &[u32], start: usize, max: usize) -> Result<(), RuntimeError> {
        let c = &self.model.layout.cfg;
        super::check_span(tokens, start, max, c.n_vocab, c.n_ctx, self.next_pos)
    }

    /// Runs on a worker of the rayon pool, so that the parallel loops inside split work among
    /// the workers directly instead of each being handed over from (and waking) a thread
    /// outside the pool: one hand-over per call instead of one per matrix.
    fn run(
        &mut self,
        tokens: &[u32],
        start: usize,
        rows: Option<(usize, &mut Vec<f32>)>,
    ) -> Result<(), RuntimeError> {
        // A single token (a decode step) runs with a team of the pool's workers spinning
        // between its loops (`team`); a prompt's loops are long enough for rayon's.
        let step = tokens.len() == 1;
        let go = || {
            if step {
                team::decode_step(|| self.forward(tokens, start, rows))
            } else {
                self.forward(tokens, start, rows)
            }
        };
        let r = if rayon::current_thread_index().is_none() {
            rayon::scope(|_| go())
        } else {
            go()
        };
        self.has_logits = r.is_ok();
        r
    }

    /// Runs `tokens` at `start..`: every layer for every token, the head for the last one,
    /// and with `rows = Some((from, out))` also for the tokens `from..` (their logits
    /// appended to `out`, row-major).
    fn forward(
        &mut self,
        tokens: &[u32],
        start: usize,
        rows: Option<(usize, &mut Vec<f32>)>,
    ) -> Result<(), RuntimeError> {
        let hp = self.model.layout.hyper.clone();
        let spec = self.model.layout.spec;
        let n = tokens.len();
        let (e, hd) = (hp.n_embd, hp.head_dim);
        let (nh, nkv, nctx) = (hp.n_head, hp.n_head_kv, hp.n_ctx);
        let (nq, nk) = (nh * hd, nkv * hd);
        let eps = hp.norm_eps;
        let residual = |x: &mut [f32], o: &[f32]| match hp.residual_scale {
            Some(s) => x.iter_mut().zip(o).for_each(|(xi, oi)| *xi += oi * s),
            None => x.iter_mut().zip(o).for_each(|(xi, oi)| *xi += *oi),
        };

        let mut x = vec![0f32; n * e];
        {
            let emb = view(&self.model.tok_embd, &self.model);
            for (xt, &t) in x.chunks_exact_mut(e).zip(tokens) {
                matvec::row(emb, e, t as usize, xt);
                if let Some(s) = hp.embed_scale {
                    xt.iter_mut().for_each(|v| *v *= s);
                }
            }
        }
        let mut h = vec![0f32; n * e];
        let mut q = vec![0f32; n * nq];
        let mut k = vec![0f32; n * nk];
        let mut v = vec![0f32; n * nk];
        let mut attn = vec![0f32; n * nq];
        let mut o = vec![0f32; n * e];
        let nff = hp.n_ff;
        let mut g = vec![0f32; n * nff];
        let mut u = vec![0f32; n * nff];
        let mut tmp = vec![0f32; e.max(hd)];
        let (kq_scale, q_scale) = match hp.q_scale {
            Some(s) => (1.0f32, Some(s)),
            None => (1.0f32 / (hd as f32).sqrt(), None),
        };
        let group = nh / nkv;
        let gelu = (spec.activation == Activation::GeluTanh).then(gelu_table);

        for il in 0..hp.n_layer {
            let lv = &self.vecs[il];
            let layer = &self.model.layers[il];
            x.par_chunks_exact(e)
                .zip(h.par_chunks_exact_mut(e))
                .for_each(|(xt, ht)| rms_norm(xt, &lv.attn_norm, eps, ht));
            trace("attn_norm", il, &h[..e]);
            let mut acts = matvec::SharedActs::new(&h, e);
            self.mm_shared(&layer.wq, &mut acts, &mut q);
            self.mm_shared(&layer.wk, &mut acts, &mut k);
            self.mm_shared(&layer.wv, &mut acts, &mut v);
            drop(acts);
            let (base, fscale) = hp.rope_of_layer(il);
            for t in 0..n {
                let pos = start + t;
                let (qt, kt, vt) = (
                    &mut q[t * nq..(t + 1) * nq],
                    &mut k[t * nk..(t + 1) * nk],
                    &mut v[t * nk..(t + 1) * nk],
                );
                for (y, b) in [(&mut *qt, &lv.bq), (&mut *kt, &lv.bk), (&mut *vt, &lv.bv)] {
                    if let Some(b) = b {
                        y.iter_mut().zip(b).for_each(|(a, c)| *a += c);
                    }
                }
                trace("Qcur_mm", il, qt);
                trace("Kcur_mm", il, kt);
                trace("Vcur", il, vt);
                for (y, w) in [(&mut *qt, &lv.q_norm), (&mut *kt, &lv.k_norm)] {
                    if let Some(w) = w {
                        for head in y.chunks_exact_mut(hd) {
                            tmp[..hd].copy_from_slice(head);
                            rms_norm(&tmp[..hd], w, eps, head);
                        }
                    }
                }
                self.rope(qt, nh, pos, base, fscale);
                self.rope(kt, nkv, pos, base, fscale);
                if let Some(s) = q_scale {
                    qt.iter_mut().for_each(|a| *a *= s);
                }
                trace("Qcur_rope", il, qt);
                trace("Kcur_rope", il, kt);
            }
            let sh = AttnShape {
                layer_base: il * nkv * kv_slots(nctx) * hd,
                nctx,
                slots: kv_slots(nctx),
                hd,
                group,
                start,
                window: hp.window_of_layer(il),
                kq_scale,
                form: AttnForm::detect(),
            };
            match &mut self.kv {
                KvStore::F16 { k: kc, v: vc } => attend(kc, vc, n, &q, &k, &v, &mut attn, &sh),
                KvStore::F32 { k: kc, v: vc } => attend(kc, vc, n, &q, &k, &v, &mut attn, &sh),
            }
            for at in attn.chunks_exact(nq) {
                trace("kqv_out", il, at);
            }
            self.mm(&layer.wo, &attn, &mut o);
            for (xt, ot) in x.chunks_exact_mut(e).zip(o.chunks_exact_mut(e)) {
                trace("attn_out", il, ot);
                if let Some(w) = &lv.post_attn_norm {
                    tmp[..e].copy_from_slice(ot);
                    rms_norm(&tmp[..e], w, eps, ot);
                }
                residual(xt, ot);
            }
            x.par_chunks_exact(e)
                .zip(h.par_chunks_exact_mut(e))
                .for_each(|(xt, ht)| rms_norm(xt, &lv.ffn_norm, eps, ht));
            let mut acts = matvec::SharedActs::new(&h, e);
            self.mm_shared(&layer.w_gate, &mut acts, &mut g);
            self.mm_shared(&layer.w_up, &mut acts, &mut u);
            drop(acts);
            // Element by element (the same bits on any split), over the threads: an `exp` a
            // value, 16,384 a token on the 8B shape.
            let u = &u;
            team::chunks_mut(&mut g, GATE_CHUNK, |i, g| {
                let u = &u[i * GATE_CHUNK..i * GATE_CHUNK + g.len()];
                match gelu {
                    Some(table) => geglu_slice(g, u, table),
                    None => swiglu_slice(g, u),
                }
            });
            trace("ffn_swiglu", il, &g[..nff]);
            self.mm(&layer.w_down, &g, &mut o);
            for (xt, ot) in x.chunks_exact_mut(e).zip(o.chunks_exact_mut(e)) {
                trace("ffn_out", il, ot);
                if let Some(w) = &lv.post_ffn_norm {
                    tmp[..e].copy_from_slice(ot);
                    rms_norm(&tmp[..e], w, eps, ot);
                }
                residual(xt, ot);
            }
        }
        let scale = |logits: &mut [f32]| {
            if let Some(m) = hp.logit_mul {
                logits.iter_mut().for_each(|v| *v *= m);
            }
            if let Some(c) = hp.final_softcap {
                logits.iter_mut().for_each(|v| *v = (*v / c).tanh() * c);
            }
        };
        let mut logits = std::mem::take(&mut self.logits);
        match rows {
            Some((from, out)) => {
                // The head for rows from..n as one matrix product: each row has the bits
                // of the single-row product (the kernels' contract).
                let m = n - from;
                for (xt, ht) in x[from * e..].chunks_exact(e).zip(h.chunks_exact_mut(e)) {
                    rms_norm(xt, &self.output_norm, eps, ht);
                }
                let nv = hp.n_vocab;
                let at = out.len();
                out.resize(at + m * nv, 0.0);
                let ys = &mut out[at..];
                self.mm(&self.model.output, &h[..m * e], ys);
                ys.chunks_exact_mut(nv).for_each(scale);
                logits.copy_from_slice(&ys[(m - 1) * nv..]);
            }
            None => {
                let hl = &mut h[..e];
                rms_norm(&x[(n - 1) * e..], &self.output_norm, eps, hl);
                trace("result_norm", 0, hl);
                matvec::matvec_with(
                    self.kernel,
                    view(&self.model.output, &self.model),
                    e,
                    hl,
                    &mut logits,
                );
                scale(&mut logits);
            }
        }
        self.logits = logits;
        self.next_pos = start + n;
        Ok(())
    }
}

impl Backend for CpuBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            backend: "cpu",
            architecture: self.model.layout.cfg.architecture.clone(),
            kernel: match self.kernel {
                Kernel::F32 => "f32",
                Kernel::Int8 => "int8",
            },
            kv_cache: match self.kv_type() {
                KvType::F16 => "f16",
                KvType::F32 => "f32",
            },
            kv_cache_bytes: self.kv_bytes(),
            weight_bytes: self.model.weight_bytes(),
            decode_bytes_per_token: self.model.decode_bytes_per_token(),
            buckets: self.buckets.clone(),
            buckets_from: self.buckets_from,
            n_ctx: self.n_ctx(),
            n_vocab: self.n_vocab(),
            threads: rayon::current_num_threads(),
            cpu_level: Some(crate::isa::detect().name()),
            device: None,
            dispatches_per_token: None,
            device_weight_bytes: None,
        }
    }

    fn n_vocab(&self) -> usize {
        self.model.layout.hyper.n_vocab
    }

    fn n_ctx(&self) -> usize {
        self.model.layout.hyper.n_ctx
    }

    fn position(&self) -> usize {
        self.next_pos
    }

    fn prefill(&mut self, tokens: &[u32], start: usize) -> Result<(), RuntimeError> {
        let max = *self.buckets.last().unwrap_or(&1);
        self.check_span(tokens, start, max)?;
        self.run(tokens, start, None)
    }

    fn prefill_logits(
        &mut self,
        tokens: &[u32],
        start: usize,
        from: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), RuntimeError> {
        let max = *self.buckets.last().unwrap_or(&1);
        self.check_span(tokens, start, max)?;
        super::check_rows(tokens.len(), from)?;
        self.run(tokens, start, Some((from, out)))
    }

    fn decode(&mut self, token: u32, pos: usize) -> Result<(), RuntimeError> {
        self.check_span(&[token], pos, 1)?;
        self.run(&[token], pos, None)
    }

    fn logits(&mut self) -> Result<&[f32], RuntimeError> {
        if !self.has_logits {
            return Err(RuntimeError::Backend {
                name: "cpu".into(),
                detail: "no logits: nothing has run since the last reset".into(),
            });
        }
        Ok(&self.logits)
    }

    fn argmax(&mut self, banned: &[u32]) -> Result<Option<u32>, RuntimeError> {
        let l = self.logits()?;
        if l.iter().any(|v| !v.is_finite()) {
            return Ok(None);
        }
        let mut best: Option<usize> = None;
        for (i, x) in l.iter().enumerate() {
            if banned.contains(&(i as u32)) {
                continue;
            }
            if best.is_none_or(|b| *x > l[b]) {
                best = Some(i);
            }
        }
        Ok(best.map(|b| b as u32))
    }

    fn reset(&mut self) {
        self.next_pos = 0;
        self.has_logits = false;
    }

    fn rewind(&mut self, pos: usize) -> Result<(), RuntimeError> {
        super::check_rewind(pos, self.next_pos)?;
        self.next_pos = pos;
        self.has_logits = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` values in [-2, 2) from a linear congruential generator at `seed`.
    fn lcg_values(seed: &mut u32, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (*seed >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
            })
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// `x` rounded to f16 (the cache's bits) and those values widened back to f32.
    fn f16_pair(x: &[f32]) -> (Vec<u16>, Vec<f32>) {
        let h: Vec<u16> = x.iter().map(|&v| u16::store(v)).collect();
        let w = h.iter().map(|&b| b.to_f32()).collect();
        (h, w)
    }

    /// The portable products read an f16 cache as they read its values widened to f32, and
    /// need only the scores' positions in each row (the last partial block copied).
    #[test]
    fn portable_products_read_f16_as_its_widened_values() {
        let mut seed = 31u32;
        let mut rnd = |n: usize| lcg_values(&mut seed, n);
        for hd in [3, 8, 13, 64, 80] {
            for n in [1usize, 7, 8, 9, 23, 64] {
                let stride = n + 2;
                let q = rnd(hd);
                let (kt16, kt16w) = f16_pair(&rnd((hd - 1) * stride + n));
                let (mut want, mut got) = (vec![0f32; n], vec![0f32; n]);
                scores_t_portable(&q, &kt16w, stride, 0.3, &mut want);
                scores_t_portable(&q, &kt16, stride, 0.3, &mut got);
                assert_eq!(bits(&got), bits(&want), "scores hd {hd} n {n}");
                // Against the scalar dot of each position in matvec::dot's order.
                for (p, g) in got.iter().enumerate() {
                    let mut l = [0f32; 8];
                    for (i, qi) in q.iter().enumerate() {
                        l[i % 8] += qi * kt16w[i * stride + p];
                    }
                    let y =
                        (((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))) * 0.3;
                    assert_eq!(g.to_bits(), y.to_bits(), "position {p} hd {hd} n {n}");
                }
                let w = rnd(n);
                let (v16, v16w) = f16_pair(&rnd(n * hd));
                let (mut want, mut got) = (vec![0f32; hd], vec![0f32; hd]);
                weighted_rows_portable(&w, &v16w, &mut want);
                weighted_rows_portable(&w, &v16, &mut got);
                assert_eq!(bits(&got), bits(&want), "weighted hd {hd} n {n}");
            }
        }
    }

    /// The softmax's exp is within 1 ulp of the exact value over the f32s from its underflow
    /// bound to 0 (1 in 97 of them; all of them, run once with a stride of 1: 0.982 ulp the
    /// worst), 0 below that bound and at `-inf`, and keeps NaN.
    #[test]
    fn the_softmax_exp_is_within_1_ulp() {
        let mut worst = 0f64;
        let (lo, hi) = (expc::XMIN.to_bits(), 0x8000_0000u32);
        // Negative floats: larger bit patterns are smaller values; XMIN .. -0 is hi ..= lo.
        for b in (hi..=lo)
            .step_by(97)
            .chain([lo, hi, 0xbf80_0000, 0xbf31_7218])
        {
            let x = f32::from_bits(b);
            let (got, want) = (exp_portable(x) as f64, (x as f64).exp());
            // Results below 2^-126 are subnormal: their ulp is 2^-149.
            let ulp = if want < f32::MIN_POSITIVE as f64 {
                2f64.powi(-149)
            } else {
                2f64.powi(want.log2().floor() as i32 - 23)
            };
            let e = (got - want).abs() / ulp;
            assert!(e <= 1.0, "exp({x:e}) = {got:e}, want {want:e}: {e} ulp");
            worst = worst.max(e);
        }
        eprintln!("worst {worst:.3} ulp");
        assert_eq!(exp_portable(0.0), 1.0);
        assert_eq!(exp_portable(-0.0), 1.0);
        for x in [
            f32::NEG_INFINITY,
            -1e30,
            -100.0,
            f32::from_bits(expc::XMIN.to_bits() + 1),
        ] {
            assert_eq!(exp_portable(x).to_bits(), 0, "exp({x:e})");
        }
        assert!(exp_portable(f32::NAN).is_nan());
    }

    /// Every softmax form gives the portable form's bits at lengths that leave partial
    /// vectors, over scores with NaN, infinities, values at and past the underflow bound and
    /// signed zeros among ordinary ones; each vector form's exponentials and eight partial
    /// sums equal the scalar form's (`exp_sums_tail`) bit for bit, over a sweep of f32 bit
    /// patterns of every sign and exponent as well.
    #[test]
    fn softmax_forms_have_the_portable_bits() {
        let special = [
            f32::NEG_INFINITY,
            expc::XMIN,
            f32::from_bits(expc::XMIN.to_bits() + 1),
            -87.0,
            -0.0,
            0.0,
            -1e-30,
            -20.5,
        ];
        let mut seed = 7u32;
        let mut rnd = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1 << 24) as f32
        };
        // A NaN score makes every output NaN (its payload is the compiler's choice).
        let canon = |v: &[f32]| -> Vec<u32> {
            v.iter()
                .map(|x| {
                    if x.is_nan() {
                        f32::NAN.to_bits()
                    } else {
                        x.to_bits()
                    }
                })
                .collect()
        };
        for n in (0..50).chain([255, 4000]) {
            for case in 0..4 {
                let mut s: Vec<f32> = (0..n)
                    .map(|i| {
                        if case > 0 && i % 3 == 1 {
                            special[i % special.len()]
                        } else {
                            (rnd() - 0.9) * 60.0
                        }
                    })
                    .collect();
                if case >= 2 && n > 0 {
                    // +inf is the max: inf - inf is NaN.
                    s[n / 2] = if case == 2 { f32::NAN } else { f32::INFINITY };
                }
                let mut want = s.clone();
                softmax(AttnForm::Portable, &mut want);
                assert_eq!(case >= 2 && n > 0, want.iter().any(|x| x.is_nan()));
                for form in attn_forms() {
                    let mut got = s.clone();
                    softmax(form, &mut got);
                    assert_eq!(canon(&got), canon(&want), "{form:?} n {n} case {case}");
                }
            }
        }
        // The exponentials and partial sums themselves (the outputs above hide a change of
        // the sums' order: it rarely moves `1 / sum` rounded to f32), with m = 0 so that each
        // value is exp's own argument: every 4,099th bit pattern, signs, zeros, infinities.
        let sweep: Vec<f32> = (0..=u32::MAX)
            .step_by(4099)
            .map(f32::from_bits)
            .chain([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, expc::XMIN])
            .filter(|x| !x.is_nan())
            .collect();
        for len in [sweep.len(), 4000, 37] {
            let src = &sweep[sweep.len() - len..];
            let mut want = src.to_vec();
            let mut ws = [0f64; 8];
            exp_sums_tail(&mut want, 0, 0.0, &mut ws);
            for form in attn_forms() {
                let mut got = src.to_vec();
                // SAFETY: the form is present (attn_forms).
                let gs = match form {
                    #[cfg(target_arch = "x86_64")]
                    AttnForm::Avx512 => unsafe { attn512::exp_sums(&mut got, 0.0) },
                    #[cfg(target_arch = "x86_64")]
                    AttnForm::Avx2 => unsafe { attn256::exp_sums(&mut got, 0.0) },
                    #[cfg(target_arch = "aarch64")]
                    AttnForm::Neon => unsafe { attn128::exp_sums(&mut got, 0.0) },
                    _ => continue,
                };
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{form:?} exponentials, {len} values"
                );
                assert_eq!(gs.map(f64::to_bits), ws.map(f64::to_bits), "{form:?} sums");
            }
        }
    }

    /// The attention forms this CPU runs (whatever `LOWBIT_ISA` says).
    fn attn_forms() -> Vec<AttnForm> {
        [
            AttnForm::Portable,
            AttnForm::Avx2,
            AttnForm::Avx512,
            AttnForm::Neon,
        ]
        .into_iter()
        .filter(|f| f.here())
        .collect()
    }

    /// The attention's AVX2 products (one head, and two at once; the keys as rows, or
    /// transposed and read in place from an f32 or f16 cache; values f32 or f16) give the
    /// portable forms' bits, at head sizes that leave partial 64- and 32-value passes and
    /// scalar tails (the products of values) and position counts that leave partial blocks
    /// of 8 and 4 positions.
    #[test]
    fn attention_products_have_the_portable_bits_on_avx2() {
        #[cfg(target_arch = "x86_64")]
        {
            if !AttnForm::Avx2.here() {
                eprintln!("skipped: no AVX2 and F16C on this CPU");
                return;
            }
            let mut seed = 13u32;
            let mut rnd = |n: usize| lcg_values(&mut seed, n);
            for hd in [5, 8, 13, 16, 40, 64, 72, 80, 128, 136, 256] {
                for n in [1usize, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 17, 40, 129] {
                    let (q, q1) = (rnd(hd), rnd(hd));
                    let (w, w1, v) = (rnd(n), rnd(n), rnd(n * hd));
                    if hd.is_multiple_of(8) {
                        let stride = n.div_ceil(16) * 16 + 16;
                        let kt = rnd(hd * stride);
                        let mut rows = vec![0f32; n * hd];
                        for p in 0..n {
                            for d in 0..hd {
                                rows[p * hd + d] = kt[d * stride + p];
                            }
                        }
                        let (mut want0, mut want1) = (vec![0f32; n], vec![0f32; n]);
                        scores_t_portable(&q, &kt, stride, 0.3, &mut want0);
                        scores_t_portable(&q1, &kt, stride, 0.3, &mut want1);
                        let mut got = vec![0f32; n];
                        // SAFETY: AVX2 checked above; rows holds n rows of hd values.
                        unsafe { attn256::scores_rows([&q], &rows, 0.3, [&mut got]) };
                        assert_eq!(bits(&got), bits(&want0), "scores hd {hd} n {n}");
                        let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
                        // SAFETY: as above.
                        unsafe { attn256::scores_rows([&q, &q1], &rows, 0.3, [&mut a, &mut b]) };
                        assert_eq!(bits(&a), bits(&want0), "scores pair hd {hd} n {n}");
                        assert_eq!(bits(&b), bits(&want1), "scores pair hd {hd} n {n}");
                    }
                    // Transposed keys read in place (a decode step's cache): rows of a stride
                    // longer than the positions, no padding after the last row's positions,
                    // f32 and f16 (widened as loaded).
                    let stride = n + 3;
                    let kt = rnd((hd - 1) * stride + n);
                    let (kt16, kt16w) = f16_pair(&kt);
                    for (src, wide) in [(None, &kt), (Some(&kt16), &kt16w)] {
                        let mut want = vec![0f32; n];
                        scores_t_portable(&q, &wide[..], stride, 0.3, &mut want);
                        let mut got = vec![0f32; n];
                        // SAFETY: AVX2 and F16C checked above; kt holds hd rows of n.
                        unsafe {
                            match src {
                                None => attn256::scores_t(&q, &kt, stride, 0.3, &mut got),
                                Some(h) => attn256::scores_t(&q, &h[..], stride, 0.3, &mut got),
                            }
                        };
                        assert_eq!(bits(&got), bits(&want), "scores_t hd {hd} n {n}");
                        if let Some(h) = src {
                            let mut p = vec![0f32; n];
                            scores_t_portable(&q, &h[..], stride, 0.3, &mut p);
                            assert_eq!(bits(&p), bits(&want), "portable f16 hd {hd} n {n}");
                        }
                    }
                    let (v16, v16w) = f16_pair(&v);
                    let (mut want0, mut got) = (vec![0f32; hd], vec![0f32; hd]);
                    weighted_rows_portable(&w, &v16w, &mut want0);
                    // SAFETY: AVX2 and F16C checked above; v16 holds n rows of hd values.
                    unsafe { attn256::weighted_rows([&w], &v16, [&mut got]) };
                    assert_eq!(bits(&got), bits(&want0), "weighted f16 hd {hd} n {n}");
                    weighted_rows_portable(&w, &v16, &mut got);
                    assert_eq!(bits(&got), bits(&want0), "portable f16 hd {hd} n {n}");
                    let (mut want0, mut want1) = (vec![0f32; hd], vec![0f32; hd]);
                    weighted_rows_portable(&w, &v, &mut want0);
                    weighted_rows_portable(&w1, &v, &mut want1);
                    let mut got = vec![0f32; hd];
                    // SAFETY: AVX2 checked above; v holds n rows of hd values.
                    unsafe { attn256::weighted_rows([&w], &v, [&mut got]) };
                    assert_eq!(bits(&got), bits(&want0), "weighted rows hd {hd} n {n}");
                    let (mut a, mut b) = (vec![0f32; hd], vec![0f32; hd]);
                    // SAFETY: as above.
                    unsafe { attn256::weighted_rows([&w, &w1], &v, [&mut a, &mut b]) };
                    assert_eq!(bits(&a), bits(&want0), "weighted pair hd {hd} n {n}");
                    assert_eq!(bits(&b), bits(&want1), "weighted pair hd {hd} n {n}");
                }
            }
        }
    }

    /// The runtime levels' attention forms, and where the AVX2 form takes key rows.
    #[test]
    fn attention_forms_follow_the_level_and_the_span() {
        use crate::isa::Isa;
        use AttnForm::*;
        assert_eq!(AttnForm::of_level(Isa::Avx512Vnni, true, true), Avx512);
        assert_eq!(AttnForm::of_level(Isa::Avx512Vnni, true, false), Avx2);
        assert_eq!(AttnForm::of_level(Isa::Avx2, true, true), Avx2);
        assert_eq!(AttnForm::of_level(Isa::Avx2, false, false), Portable);
        assert_eq!(AttnForm::of_level(Isa::Portable, true, true), Portable);
        assert_eq!(AttnForm::of_level(Isa::NeonDot, false, false), Neon);
        assert_eq!(AttnForm::of_level(Isa::Neon, false, false), Neon);
        assert_eq!(Neon.for_span(1, 1, 5), Neon);
        // Queries a KV head serves: positions times query heads a KV head.
        assert_eq!(Avx2.for_span(1, 8, 64), Avx2);
        assert_eq!(Avx2.for_span(4, 2, 128), Avx2);
        assert_eq!(Avx2.for_span(1, 7, 64), Portable);
        assert_eq!(Avx2.for_span(7, 1, 64), Portable);
        assert_eq!(Avx2.for_span(16, 4, 12), Portable);
        assert_eq!(Avx512.for_span(1, 1, 5), Avx512);
        assert_eq!(Portable.for_span(64, 8, 64), Portable);
    }

    /// The attention's NEON products (one head, and two at once; the keys transposed, read
    /// in place from an f32 or f16 cache; values f32 or f16) give the portable forms' bits,
    /// at head sizes that leave partial 64-, 32-, 16- and 4-value passes and scalar tails,
    /// and position counts that leave partial blocks of 8 and 4 positions.
    #[test]
    fn attention_products_have_the_portable_bits_on_neon() {
        #[cfg(target_arch = "aarch64")]
        {
            let mut seed = 19u32;
            let mut rnd = |n: usize| lcg_values(&mut seed, n);
            for hd in [3, 5, 8, 13, 16, 20, 40, 64, 72, 80, 100, 128, 144, 256] {
                for n in [1usize, 2, 3, 4, 5, 7, 8, 9, 12, 17, 40, 129] {
                    let (q, q1) = (rnd(hd), rnd(hd));
                    let (w, w1, v) = (rnd(n), rnd(n), rnd(n * hd));
                    // Rows of a stride longer than the positions, no padding after the last
                    // row's positions (a decode step's cache), and a widened span's padded
                    // rows; f32 and f16 (widened as loaded).
                    for (stride, padded) in [(n + 3, false), (n.div_ceil(16) * 16 + 16, true)] {
                        // The cache ends at the last row's last position; a widened span's
                        // rows are whole (the partial block read in place).
                        let kt = rnd(if padded {
                            hd * stride
                        } else {
                            (hd - 1) * stride + n
                        });
                        let (kt16, kt16w) = f16_pair(&kt);
                        for (src, wide) in [(None, &kt), (Some(&kt16), &kt16w)] {
                            let (mut want0, mut want1) = (vec![0f32; n], vec![0f32; n]);
                            scores_t_portable(&q, &wide[..], stride, 0.3, &mut want0);
                            scores_t_portable(&q1, &wide[..], stride, 0.3, &mut want1);
                            let (mut a, mut b, mut c) =
                                (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
                            // SAFETY: NEON is on every aarch64 CPU; kt holds hd rows of n.
                            unsafe {
                                match src {
                                    None => {
                                        attn128::scores_t([&q], &kt, stride, 0.3, [&mut a]);
                                        attn128::scores_t(
                                            [&q, &q1],
                                            &kt,
                                            stride,
                                            0.3,
                                            [&mut b, &mut c],
                                        );
                                    }
                                    Some(h) => {
                                        attn128::scores_t([&q], &h[..], stride, 0.3, [&mut a]);
                                        attn128::scores_t(
                                            [&q, &q1],
                                            &h[..],
                                            stride,
                                            0.3,
                                            [&mut b, &mut c],
                                        );
                                    }
                                }
                            };
                            let f16 = src.is_some();
                            assert_eq!(bits(&a), bits(&want0), "scores hd {hd} n {n} f16 {f16}");
                            assert_eq!(
                                bits(&b),
                                bits(&want0),
                                "scores pair hd {hd} n {n} f16 {f16}"
                            );
                            assert_eq!(
                                bits(&c),
                                bits(&want1),
                                "scores pair hd {hd} n {n} f16 {f16}"
                            );
                        }
                    }
                    let (v16, v16w) = f16_pair(&v);
                    for (src, wide) in [(None, &v), (Some(&v16), &v16w)] {
                        let (mut want0, mut want1) = (vec![0f32; hd], vec![0f32; hd]);
                        weighted_rows_portable(&w, &wide[..], &mut want0);
                        weighted_rows_portable(&w1, &wide[..], &mut want1);
                        let (mut a, mut b, mut c) =
                            (vec![0f32; hd], vec![0f32; hd], vec![0f32; hd]);
                        // SAFETY: NEON is on every aarch64 CPU; v holds n rows of hd values.
                        unsafe {
                            match src {
                                None => {
                                    attn128::weighted_rows([&w], &v, [&mut a]);
                                    attn128::weighted_rows([&w, &w1], &v, [&mut b, &mut c]);
                                }
                                Some(h) => {
                                    attn128::weighted_rows([&w], &h[..], [&mut a]);
                                    attn128::weighted_rows([&w, &w1], &h[..], [&mut b, &mut c]);
                                }
                            }
                        };
                        let f16 = src.is_some();
                        assert_eq!(bits(&a), bits(&want0), "weighted hd {hd} n {n} f16 {f16}");
                        assert_eq!(
                            bits(&b),
                            bits(&want0),
                            "weighted pair hd {hd} n {n} f16 {f16}"
                        );
                        assert_eq!(
                            bits(&c),
                            bits(&want1),
                            "weighted pair hd {hd} n {n} f16 {f16}"
                        );
                    }
                }
            }
        }
    }

    /// The key rows ([`widen_rows`]) hold the transposed cache's keys, from f16 and f32
    /// caches, at head sizes that leave a partial group of 8 rows, position counts that leave
    /// a partial 8 x 8 block and span more than one block of 256 positions.
    #[test]
    fn widen_rows_transposes_the_cache() {
        let mut seed = 17u32;
        for (hd, nctx, lo, m) in [
            (3usize, 40, 5, 23),
            (8, 40, 5, 23),
            (13, 40, 5, 23),
            (64, 40, 5, 23),
            (16, 600, 7, 530),
        ] {
            let kc = lcg_values(&mut seed, hd * nctx);
            let kc16: Vec<u16> = kc.iter().map(|&x| u16::store(x)).collect();
            let (mut a, mut b) = (vec![0f32; m * hd], vec![0f32; m * hd]);
            widen_rows(&kc, nctx, lo, m, &mut a);
            widen_rows(&kc16, nctx, lo, m, &mut b);
            for p in 0..m {
                for d in 0..hd {
                    let at = d * nctx + lo + p;
                    assert_eq!(
                        a[p * hd + d].to_bits(),
                        kc[at].to_bits(),
                        "hd {hd} p {p} d {d}"
                    );
                    let w = crate::quant::f16_bits_to_f32(kc16[at]);
                    assert_eq!(b[p * hd + d].to_bits(), w.to_bits(), "hd {hd} p {p} d {d}");
                }
            }
        }
    }

    /// The attention's AVX-512 products (one head, and two at once) give the portable forms'
    /// bits, at head sizes that leave partial 8-element lanes, 16-value passes and scalar
    /// tails, and position counts that leave partial 16-position vectors.
    #[test]
    fn attention_products_have_the_portable_bits_on_avx512() {
        #[cfg(target_arch = "x86_64")]
        {
            if !std::is_x86_feature_detected!("avx512f") {
                eprintln!("skipped: no AVX-512F on this CPU");
                return;
            }
            let mut seed = 11u32;
            let mut rnd = |n: usize| lcg_values(&mut seed, n);
            for hd in [5, 8, 13, 64, 80, 128, 144, 256] {
                for n in [1usize, 7, 16, 17, 40, 129] {
                    let stride = n.div_ceil(16) * 16 + 16;
                    let (q, kt) = (rnd(hd), rnd(hd * stride));
                    let (mut want, mut got) = (vec![0f32; n], vec![0f32; n]);
                    scores_t_portable(&q, &kt, stride, 0.3, &mut want);
                    // SAFETY: AVX-512F checked above; kt holds hd rows of stride values.
                    unsafe { attn512::scores_t([&q], &kt, stride, 0.3, [&mut got]) };
                    assert_eq!(bits(&got), bits(&want), "scores hd {hd} n {n}");
                    let (w, v) = (rnd(n), rnd(n * hd));
                    let (mut want, mut got) = (vec![0f32; hd], vec![0f32; hd]);
                    weighted_rows_portable(&w, &v, &mut want);
                    // SAFETY: AVX-512F checked above; v holds n rows of hd values.
                    unsafe { attn512::weighted_rows([&w], &v, [&mut got]) };
                    assert_eq!(bits(&got), bits(&want), "weighted rows hd {hd} n {n}");
                    // Two heads at once: each the bits of the portable form alone.
                    let (q1, w1) = (rnd(hd), rnd(n));
                    let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
                    // SAFETY: AVX-512F checked above; kt holds hd rows of stride values.
                    unsafe { attn512::scores_t([&q, &q1], &kt, stride, 0.3, [&mut a, &mut b]) };
                    let mut want1 = vec![0f32; n];
                    scores_t_portable(&q1, &kt, stride, 0.3, &mut want1);
                    let mut want0 = vec![0f32; n];
                    scores_t_portable(&q, &kt, stride, 0.3, &mut want0);
                    assert_eq!(bits(&a), bits(&want0), "scores pair hd {hd} n {n}");
                    assert_eq!(bits(&b), bits(&want1), "scores pair hd {hd} n {n}");
                    let (mut a, mut b) = (vec![0f32; hd], vec![0f32; hd]);
                    // SAFETY: AVX-512F checked above; v holds n rows of hd values.
                    unsafe { attn512::weighted_rows([&w, &w1], &v, [&mut a, &mut b]) };
                    let mut want1 = vec![0f32; hd];
                    weighted_rows_portable(&w1, &v, &mut want1);
                    assert_eq!(bits(&a), bits(&want), "weighted pair hd {hd} n {n}");
                    assert_eq!(bits(&b), bits(&want1), "weighted pair hd {hd} n {n}");
                    // Keys read in place from an f16 cache (no padding after the last row's
                    // positions) and f16 values, for two heads at once.
                    let stride = n + 5;
                    let (kt16, kt16w) = f16_pair(&rnd((hd - 1) * stride + n));
                    let (v16, v16w) = f16_pair(&v);
                    let (mut want0, mut want1) = (vec![0f32; n], vec![0f32; n]);
                    scores_t_portable(&q, &kt16w, stride, 0.3, &mut want0);
                    scores_t_portable(&q1, &kt16w, stride, 0.3, &mut want1);
                    let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
                    // SAFETY: AVX-512F checked above; kt16 holds hd rows of n positions.
                    unsafe { attn512::scores_t([&q, &q1], &kt16, stride, 0.3, [&mut a, &mut b]) };
                    assert_eq!(bits(&a), bits(&want0), "scores f16 hd {hd} n {n}");
                    assert_eq!(bits(&b), bits(&want1), "scores f16 hd {hd} n {n}");
                    let (mut want0, mut want1) = (vec![0f32; hd], vec![0f32; hd]);
                    weighted_rows_portable(&w, &v16w, &mut want0);
                    weighted_rows_portable(&w1, &v16w, &mut want1);
                    let (mut a, mut b) = (vec![0f32; hd], vec![0f32; hd]);
                    // SAFETY: AVX-512F checked above; v16 holds n rows of hd values.
                    unsafe { attn512::weighted_rows([&w, &w1], &v16, [&mut a, &mut b]) };
                    assert_eq!(bits(&a), bits(&want0), "weighted f16 hd {hd} n {n}");
                    assert_eq!(bits(&b), bits(&want1), "weighted f16 hd {hd} n {n}");
                }
            }
        }
    }

    /// A decode step reads the cache in place on the vector forms: at every position up to
    /// the context's last, in the cache's last KV head (whose rows end where the cache
    /// ends), f16 and f32, each form gives the bits of the portable form (which widens the
    /// span first), at head sizes with partial lanes and groups that take the AVX2 form's
    /// key rows (8 query heads a KV head) or not, with and without the cache's unused slots.
    #[test]
    fn a_decode_step_reads_the_cache_in_place_up_to_the_last_position() {
        fn run<T: KvElem>(hd: usize, group: usize, window: Option<usize>, pad: usize) {
            let (nkv, nctx) = (2, 37);
            let slots = nctx + pad;
            let (nq, nk) = (nkv * group * hd, nkv * hd);
            let mut seed = 29u32;
            let mut rnd = |n: usize| lcg_values(&mut seed, n);
            let (q, k, v) = (rnd(nctx * nq), rnd(nctx * nk), rnd(nctx * nk));
            let mut outs = Vec::new();
            for form in attn_forms() {
                let (mut kc, mut vc) = (
                    vec![T::default(); nkv * slots * hd],
                    vec![T::default(); nkv * slots * hd],
                );
                let mut out = vec![0f32; nctx * nq];
                for t in 0..nctx {
                    let (qs, ks) = (t * nq..(t + 1) * nq, t * nk..(t + 1) * nk);
                    let sh = AttnShape {
                        layer_base: 0,
                        nctx,
                        slots,
                        hd,
                        group,
                        start: t,
                        window,
                        kq_scale: 0.3,
                        form,
                    };
                    attend(
                        &mut kc,
                        &mut vc,
                        1,
                        &q[qs.clone()],
                        &k[ks.clone()],
                        &v[ks],
                        &mut out[qs],
                        &sh,
                    );
                }
                assert!(out.iter().all(|x| x.is_finite()));
                outs.push((form, out));
            }
            let (_, want) = &outs[0];
            for (form, got) in &outs[1..] {
                assert_eq!(
                    bits(got),
                    bits(want),
                    "{form:?} hd {hd} group {group} {window:?}"
                );
            }
        }
        for (hd, group) in [(8, 3), (13, 2), (16, 8), (64, 1), (40, 9)] {
            for window in [None, Some(20)] {
                for pad in [0, KV_PAD] {
                    run::<u16>(hd, group, window, pad);
                    run::<f32>(hd, group, window, pad);
                }
            }
        }
    }

    /// `silu` is within 3 ulp of `x / (1 + exp(-x))` computed in f64, over every 61st f32
    /// from -87.3 to 88.8 (and -0.0 where the exact value is under 1.1e-36 below that), and
    /// keeps zeros' signs, +inf and NaN.
    #[test]
    fn silu_is_within_3_ulp() {
        let ord = |x: f32| -> i64 {
            let b = x.to_bits() as i32 as i64;
            if b < 0 {
                i32::MIN as i64 - b
            } else {
                b
            }
        };
        let mut worst = 0i64;
        for b in (0..=u32::MAX).step_by(61) {
            let x = f32::from_bits(b);
            if x.is_nan() || !(-88.0..=88.8).contains(&x) {
                continue;
            }
            let xd = x as f64;
            let want = (xd / (1.0 + (-xd).exp())) as f32;
            let got = silu(x);
            if x < expc::XMIN {
                assert!(
                    got == 0.0 && want.abs() < 1.1e-36,
                    "{x:e}: {got:e} vs {want:e}"
                );
                continue;
            }
            let d = (ord(got) - ord(want)).abs();
            worst = worst.max(d);
            assert!(d <= 3, "silu({x:e}) = {got:e}, exact {want:e}: {d} ulp");
        }
        assert!(worst >= 1, "a sweep this wide rounds somewhere");
        assert_eq!(silu(0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(silu(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(silu(f32::INFINITY), f32::INFINITY);
        // -inf / (1 + exp(inf)) is NaN, as in libm's and ggml's `x / (1 + expf(-x))`.
        assert!(silu(f32::NEG_INFINITY).is_nan());
        assert!(silu(f32::NAN).is_nan());
        assert_eq!(silu(1e30), 1e30);
    }

    /// Every vector form of `swiglu_slice` gives `silu(g) * u`'s bits, at lengths that leave
    /// partial vectors, over a sweep of f32 bit patterns of every sign and exponent (zeros,
    /// subnormals, infinities, NaN, the underflow bound of the exp).
    #[test]
    fn swiglu_forms_have_the_scalar_bits() {
        let mut g: Vec<f32> = (0..=u32::MAX)
            .step_by(4093)
            .map(f32::from_bits)
            .chain([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN])
            .chain([expc::XMIN, -expc::XMIN, 87.4, -87.4, 88.8, -88.8])
            .collect();
        let mut seed = 23u32;
        g.extend(lcg_values(&mut seed, 1000).iter().map(|v| v * 40.0));
        let u: Vec<f32> = (0..g.len())
            .map(|i| [1.0, -0.5, 3.25, 1e-3][i % 4])
            .collect();
        let canon = |v: &[f32]| -> Vec<u32> {
            v.iter()
                .map(|x| {
                    if x.is_nan() {
                        f32::NAN.to_bits()
                    } else {
                        x.to_bits()
                    }
                })
                .collect()
        };
        for len in [g.len(), 37, 16, 15, 3, 0] {
            let (g, u) = (&g[g.len() - len..], &u[u.len() - len..]);
            let want: Vec<f32> = g.iter().zip(u).map(|(a, b)| silu(*a) * b).collect();
            for form in attn_forms() {
                let mut got = g.to_vec();
                swiglu_in(form, &mut got, u);
                assert_eq!(canon(&got), canon(&want), "{form:?} {len} values");
            }
        }
    }

    /// A span attended at once has, at every position and head, the bits of the same positions
    /// attended one at a time (decode), on both KV types, with and without a sliding window
    /// shorter than the span (so the first positions' windows start at 0 and the last ones'
    /// later), the span starting after earlier positions.
    #[test]
    fn a_span_attends_as_its_positions_one_at_a_time() {
        fn run<T: KvElem>(window: Option<usize>, form: AttnForm) {
            let (hd, nkv, group, nctx) = (8, 2, 3, 64);
            let (nq, nk) = (nkv * group * hd, nkv * hd);
            let total = 40;
            let mut seed = 7u32;
            let mut rnd = |n: usize| lcg_values(&mut seed, n);
            let (q, k, v) = (rnd(total * nq), rnd(total * nk), rnd(total * nk));
            let slots = kv_slots(nctx);
            let sh = |start| AttnShape {
                layer_base: nkv * slots * hd, // the second of two layers
                nctx,
                slots,
                hd,
                group,
                start,
                window,
                kq_scale: 0.35,
                form,
            };
            let cache = || {
                (
                    vec![T::default(); 2 * nkv * slots * hd],
                    vec![T::default(); 2 * nkv * slots * hd],
                )
            };
            // One at a time.
            let (mut kc, mut vc) = cache();
            let mut want = vec![0f32; total * nq];
            for t in 0..total {
                let (qs, ks) = (t * nq..(t + 1) * nq, t * nk..(t + 1) * nk);
                attend(
                    &mut kc,
                    &mut vc,
                    1,
                    &q[qs.clone()],
                    &k[ks.clone()],
                    &v[ks],
                    &mut want[qs],
                    &sh(t),
                );
            }
            // Spans of 5, 7 and 28 positions.
            let (mut kc2, mut vc2) = cache();
            let mut got = vec![0f32; total * nq];
            for (a, b) in [(0, 5), (5, 12), (12, total)] {
                let n = b - a;
                attend(
                    &mut kc2,
                    &mut vc2,
                    n,
                    &q[a * nq..b * nq],
                    &k[a * nk..b * nk],
                    &v[a * nk..b * nk],
                    &mut got[a * nq..b * nq],
                    &sh(a),
                );
            }
            assert_eq!(bits(&got), bits(&want), "window {window:?} {form:?}");
            assert!(want.iter().all(|x| x.is_finite()));
        }
        for form in attn_forms() {
            for window in [None, Some(7)] {
                run::<u16>(window, form);
                run::<f32>(window, form);
            }
        }
    }
    /// The vectorized GEGLU gives the scalar definition's bits: every f16 value as x (the
    /// table's whole domain, subnormals, both zeros, the +-10 edges), values between f16
    /// steps (ties included), beyond +-10, infinities, and a block holding a NaN.
    #[test]
    fn geglu_slice_has_the_scalar_bits() {
        let table = gelu_table();
        let mut xs: Vec<f32> = (0..=u16::MAX)
            .map(crate::quant::f16_bits_to_f32)
            .filter(|x| !x.is_nan())
            .collect();
        let mut seed = 3u32;
        for _ in 0..100_000 {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            xs.push(f32::from_bits(seed) % 24.0);
            // Halfway between two f16 values: the rounding's ties.
            let h = (seed >> 16) as u16 & 0x7bff;
            let (a, b) = (
                crate::quant::f16_bits_to_f32(h),
                crate::quant::f16_bits_to_f32(h + 1),
            );
            xs.push((a + b) / 2.0);
        }
        xs.extend([
            10.0,
            -10.0,
            9.999,
            -9.999,
            10.001,
            -10.001,
            f32::INFINITY,
            -f32::INFINITY,
        ]);
        xs.extend([
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            5.9e-8,
            3.0e-8,
            f32::NAN,
            1.0,
            2.0,
            3.0,
        ]);
        let us: Vec<f32> = xs
            .iter()
            .enumerate()
            .map(|(i, _)| 0.5 + (i % 7) as f32 * 0.37)
            .collect();
        let want: Vec<u32> = xs
            .iter()
            .zip(&us)
            .map(|(x, u)| geglu(*x, *u, table).to_bits())
            .collect();
        let mut got = xs.clone();
        geglu_slice(&mut got, &us, table);
        let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                a == b || (f32::from_bits(*a).is_nan() && f32::from_bits(*b).is_nan()),
                "x {} u {}: {a:#x} vs {b:#x}",
                xs[i],
                us[i]
            );
        }
    }

    /// `attend` (f32 KV) gives each head at each position the bits of that head attended
    /// alone through the portable products (a reference outside the head-pair tasks and their
    /// copy-back), for groups of 1 to 7 query heads a KV head, odd head sizes, sliding
    /// windows, and the span run whole, in three spans and one position at a time.
    #[test]
    fn attend_gives_each_head_the_bits_of_the_portable_products_alone() {
        let mut seed = 5u32;
        let mut rnd = |n: usize| lcg_values(&mut seed, n);
        for hd in [5usize, 13, 16, 64, 80, 128, 144] {
            for (nkv, group) in [
                (1usize, 1usize),
                (2, 1),
                (2, 2),
                (2, 3),
                (1, 4),
                (2, 5),
                (1, 7),
            ] {
                for window in [None, Some(1), Some(7), Some(20)] {
                    let nctx = 64;
                    let (nq, nk) = (nkv * group * hd, nkv * hd);
                    let total = 37;
                    let (q, k, v) = (rnd(total * nq), rnd(total * nk), rnd(total * nk));
                    // Each head alone, from its own widened keys and values.
                    let mut want = vec![0f32; total * nq];
                    let lo = |pos: usize| window.map(|w| (pos + 1).saturating_sub(w)).unwrap_or(0);
                    for pos in 0..total {
                        for h in 0..nkv * group {
                            let kh = h / group;
                            let l = lo(pos);
                            let len = pos + 1 - l;
                            let stride = len.div_ceil(16) * 16 + 16;
                            let mut kt = vec![0f32; hd * stride];
                            let mut vr = vec![0f32; len * hd];
                            for p in 0..len {
                                for d in 0..hd {
                                    kt[d * stride + p] = k[(l + p) * nk + kh * hd + d];
                                    vr[p * hd + d] = v[(l + p) * nk + kh * hd + d];
                                }
                            }
                            let qh = &q[pos * nq + h * hd..pos * nq + (h + 1) * hd];
                            let mut sc = vec![0f32; len];
                            scores_t_portable(qh, &kt, stride, 0.35, &mut sc);
                            softmax(AttnForm::Portable, &mut sc);
                            weighted_rows_portable(
                                &sc,
                                &vr,
                                &mut want[pos * nq + h * hd..pos * nq + (h + 1) * hd],
                            );
                        }
                    }
                    for (form, spans) in attn_forms().into_iter().flat_map(|f| {
                        [
                            vec![(0usize, total)],
                            vec![(0, 5), (5, 6), (6, total)],
                            vec![(0, 20), (20, 29), (29, total)],
                            (0..total).map(|t| (t, t + 1)).collect::<Vec<_>>(),
                        ]
                        .map(|s| (f, s))
                    }) {
                        let mut kc = vec![0f32; 2 * nkv * nctx * hd];
                        let mut vc = vec![0f32; 2 * nkv * nctx * hd];
                        let mut got = vec![0f32; total * nq];
                        for (a, b) in spans.iter().copied() {
                            let sh = AttnShape {
                                layer_base: nkv * nctx * hd,
                                nctx,
                                slots: nctx,
                                hd,
                                group,
                                start: a,
                                window,
                                kq_scale: 0.35,
                                form,
                            };
                            attend(
                                &mut kc,
                                &mut vc,
                                b - a,
                                &q[a * nq..b * nq],
                                &k[a * nk..b * nk],
                                &v[a * nk..b * nk],
                                &mut got[a * nq..b * nq],
                                &sh,
                            );
                        }
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "hd {hd} nkv {nkv} group {group} window {window:?} spans {} {form:?}",
                            spans.len()
                        );
                    }
                }
            }
        }
    }
}
