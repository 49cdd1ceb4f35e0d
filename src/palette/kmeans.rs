//! Globally optimal 1-D k-means on weighted, sorted, distinct values: the minimum
//! within-cluster sum of squares over all partitions into at most `k` clusters, the same
//! optimum the PyPI `kmeans1d` package computes (Grønlund et al., "Fast Exact k-Means,
//! k-Medians and Bregman Divergence Clustering in 1D", 2017; coremltools 9.0 vendors a
//! weighted `kmeans1d` and calls it on `np.unique(w, return_counts=True)` for f16 weights).
//!
//! In 1-D an optimal clustering is a partition of the sorted values into contiguous runs, so
//! it is the dynamic program
//!
//! ```text
//! D_1(i) = cost(0, i)
//! D_m(i) = min_{m-1 <= j < i} D_{m-1}(j) + cost(j, i)      (first i values, m clusters)
//! cost(j, i) = sum_{t in j..i} w_t (x_t - mean_{j..i})^2 = Q(j,i) - S(j,i)^2 / W(j,i)
//! ```
//!
//! with prefix sums `W`, `S`, `Q` of `w`, `w x`, `w x^2` (in f64, on values centred on their
//! weighted mean to keep the subtraction well conditioned). `cost` satisfies the quadrangle
//! inequality, so the last cluster's start `opt_m(i)` obeys `opt_m(i) <= opt_m(i + 1)` and
//! `opt_{m-1}(i) <= opt_m(i)` (Knuth/Yao). Layers with few clusters are solved by divide and
//! conquer on the first inequality (O(n log n) each); layers with many clusters by Knuth's
//! sweep within `[opt_{m-1}(i), opt_m(i + 1)]`, whose window is narrow there. Both give the
//! exact minimum of every `D_m(i)` (ties: the smallest `j`). The result is checked against
//! `kmeans1d` and an exhaustive O(k n^2) search in the tests.
//!
//! Memory. The direct solver keeps `k * (n + 1)` u32 back-pointers (one row per layer) to
//! walk the optimum back; at 8 bits on one table of a `[4096, 16384]` f32 tensor (about 45 M
//! distinct values) that is 46 GB. It is used only while the table fits in
//! [`MAX_BACKPOINTER_BYTES`]; larger problems are split Hirschberg-style: the cost of the
//! first `k1 = k / 2` clusters ending at each `j` (forward layers, two rows kept) and of the
//! last `k - k1` clusters starting at each `j` (the same layers on the reversed, negated
//! values) give the optimal boundary `j*` between them (`argmin F(j) + G(j)`, smallest `j`);
//! the two halves are solved the same way, side by side. Memory is O(n) (about 100 bytes per
//! distinct value at the top level), time about twice the direct solver's. Both reach the
//! exact optimum; on exact ties of the total they may pick different (equally optimal)
//! partitions. Every buffer is allocated fallibly: a failure is an [`AllocFailed`] error.

/// Largest back-pointer table (`k * (n + 1)` u32) the direct solver allocates per group;
/// larger problems take the linear-memory split (see the module docs). 64 MiB covers every
/// grouped palettization of real models (at 8 bits, up to about 65 000 distinct values per
/// group) so their results and speed are the direct solver's.
pub const MAX_BACKPOINTER_BYTES: usize = 64 << 20;

/// Most distinct values one group may have (back-pointers are u32).
pub const MAX_DISTINCT: usize = u32::MAX as usize - 1;

/// A buffer of the solver could not be allocated, or the problem is too large to index.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("cannot allocate {bytes} bytes for {what}")]
pub struct AllocFailed {
    pub what: &'static str,
    pub bytes: usize,
}

/// `n` copies of `v`, or [`AllocFailed`] instead of an abort when memory runs out.
pub fn try_filled<T: Clone>(n: usize, v: T, what: &'static str) -> Result<Vec<T>, AllocFailed> {
    let mut out = Vec::new();
    try_reserve(&mut out, n, what)?;
    out.resize(n, v);
    Ok(out)
}

/// Room for `n` more elements in `v`, or [`AllocFailed`].
pub fn try_reserve<T>(v: &mut Vec<T>, n: usize, what: &'static str) -> Result<(), AllocFailed> {
    v.try_reserve_exact(n).map_err(|_| AllocFailed {
        what,
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
    })
}

/// Result of [`optimal`]: cluster `c` covers `x[starts[c]..starts[c + 1]]` (the last one runs
/// to the end); `means` are the clusters' weighted means; `sse` their total cost.
#[derive(Clone, Debug, PartialEq)]
pub struct Clustering {
    pub starts: Vec<usize>,
    pub means: Vec<f64>,
    pub sse: f64,
}

/// Prefix sums of the weighted values, centred on their weighted mean.
struct Prefix {
    w: Vec<f64>,
    s: Vec<f64>,
    q: Vec<f64>,
}

impl Prefix {
    /// Prefix sums of `x`, `w`; with `reversed`, of the values in reverse order and negated
    /// (so still ascending): the suffix problem as a prefix problem.
    fn new(x: &[f64], w: &[f64], reversed: bool) -> Result<Prefix, AllocFailed> {
        let wt: f64 = w.iter().sum();
        let center = x.iter().zip(w).map(|(a, b)| a * b).sum::<f64>() / wt;
        let n = x.len();
        let (mut pw, mut ps, mut pq) = (Vec::new(), Vec::new(), Vec::new());
        for v in [&mut pw, &mut ps, &mut pq] {
            try_reserve(v, n + 1, "k-means prefix sums")?;
        }
        let (mut a, mut b, mut c) = (0f64, 0f64, 0f64);
        pw.push(0.0);
        ps.push(0.0);
        pq.push(0.0);
        for t in 0..n {
            let (xi, wi) = if reversed {
                (center - x[n - 1 - t], w[n - 1 - t])
            } else {
                (x[t] - center, w[t])
            };
            let d = xi;
            a += wi;
            b += wi * d;
            c += wi * d * d;
            pw.push(a);
            ps.push(b);
            pq.push(c);
        }
        Ok(Prefix {
            w: pw,
            s: ps,
            q: pq,
        })
    }

    /// Cost of one cluster over values `j..i` (`j < i`), never negative.
    #[inline(always)]
    fn cost(&self, j: usize, i: usize) -> f64 {
        let w = self.w[i] - self.w[j];
        let s = self.s[i] - self.s[j];
        let q = self.q[i] - self.q[j];
        (q - s * s / w).max(0.0)
    }
}

/// The vector paths the solver may take (each gives the scalar path's bits, tested).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Simd {
    Scalar,
    Avx2,
    Avx512,
}

/// Detected once; `LOWBIT_ISA=portable` (the crate's one switch, see
/// [`crate::isa::detect`]) keeps the scalar path, as on a CPU without AVX2.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn simd() -> Simd {
    static S: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
    *S.get_or_init(|| {
        if crate::isa::detect() == crate::isa::Isa::Portable {
            return Simd::Scalar;
        }
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                return Simd::Avx512;
            }
            if std::is_x86_feature_detected!("avx2") {
                return Simd::Avx2;
            }
        }
        Simd::Scalar
    })
}

/// Best `j` in `lo..=hi` for `D_m(i)`; returns (value, j), the smallest `j` among equal
/// values. `lo <= hi` required. The AVX2 path computes the same f64 operations four `j` at a
/// time and reduces to the same (value, smallest j), so both paths return the same result.
#[inline(always)]
fn best_start(p: &Prefix, prev: &[f64], i: usize, lo: usize, hi: usize) -> (f64, usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if hi - lo >= AVX512_MIN_WIDTH && simd() == Simd::Avx512 {
            // SAFETY: AVX-512F is present; indices are in bounds (the caller's ranges).
            return unsafe { best_start_avx512(p, prev, i, lo, hi) };
        }
        if hi - lo >= 8 && simd() >= Simd::Avx2 {
            // SAFETY: AVX2 is present; indices are in bounds (checked by the caller's ranges).
            return unsafe { best_start_avx2(p, prev, i, lo, hi) };
        }
    }
    best_start_scalar(p, prev, i, lo, hi)
}

#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn best_start_scalar(p: &Prefix, prev: &[f64], i: usize, lo: usize, hi: usize) -> (f64, usize) {
    let mut best = f64::INFINITY;
    let mut bj = lo;
    for j in lo..=hi {
        let v = prev[j] + p.cost(j, i);
        // Branch-free select: the comparison is unpredictable.
        let lt = v < best;
        bj = if lt { j } else { bj };
        best = if lt { v } else { best };
    }
    (best, bj)
}

/// [`Prefix::cost`] on four cells: `max(q - s * s / w, 0)` lane by lane, the same operations.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn cost256(
    w: std::arch::x86_64::__m256d,
    s: std::arch::x86_64::__m256d,
    q: std::arch::x86_64::__m256d,
) -> std::arch::x86_64::__m256d {
    use std::arch::x86_64::*;
    _mm256_max_pd(
        _mm256_sub_pd(q, _mm256_div_pd(_mm256_mul_pd(s, s), w)),
        _mm256_setzero_pd(),
    )
}

/// [`cost256`] on eight cells.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
#[inline]
unsafe fn cost512(
    w: std::arch::x86_64::__m512d,
    s: std::arch::x86_64::__m512d,
    q: std::arch::x86_64::__m512d,
) -> std::arch::x86_64::__m512d {
    use std::arch::x86_64::*;
    _mm512_max_pd(
        _mm512_sub_pd(q, _mm512_div_pd(_mm512_mul_pd(s, s), w)),
        _mm512_setzero_pd(),
    )
}

/// Windows at least this wide (`hi - lo`) take [`best_start_avx512`].
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const AVX512_MIN_WIDTH: usize = 2;

/// [`best_start_scalar`] eight `j` at a time, the last step masked (no scalar tail): each lane
/// keeps its first minimum, then the smallest `j` among the lanes holding the minimum value.
///
/// # Safety
/// The CPU must have AVX-512F; `lo <= hi < prev.len()`, `i < p.w.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn best_start_avx512(
    p: &Prefix,
    prev: &[f64],
    i: usize,
    lo: usize,
    hi: usize,
) -> (f64, usize) {
    use std::arch::x86_64::*;
    let (wi, si, qi) = (
        _mm512_set1_pd(p.w[i]),
        _mm512_set1_pd(p.s[i]),
        _mm512_set1_pd(p.q[i]),
    );
    let mut best = _mm512_set1_pd(f64::INFINITY);
    let mut bj = _mm512_set1_epi64(lo as i64);
    let mut jv = _mm512_add_epi64(
        _mm512_set1_epi64(lo as i64),
        _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7),
    );
    let eight = _mm512_set1_epi64(8);
    let (pw, ps, pq, pv) = (p.w.as_ptr(), p.s.as_ptr(), p.q.as_ptr(), prev.as_ptr());
    let mut j = lo;
    while j <= hi {
        let left = hi + 1 - j;
        let k: __mmask8 = if left >= 8 { 0xff } else { (1u8 << left) - 1 };
        // Masked loads do not touch the lanes past `hi` (no fault past the slices' ends).
        let w = _mm512_sub_pd(wi, _mm512_maskz_loadu_pd(k, pw.add(j)));
        let s = _mm512_sub_pd(si, _mm512_maskz_loadu_pd(k, ps.add(j)));
        let q = _mm512_sub_pd(qi, _mm512_maskz_loadu_pd(k, pq.add(j)));
        let c = cost512(w, s, q);
        let v = _mm512_add_pd(_mm512_maskz_loadu_pd(k, pv.add(j)), c);
        let lt = _mm512_mask_cmp_pd_mask::<_CMP_LT_OQ>(k, v, best);
        best = _mm512_mask_blend_pd(lt, best, v);
        bj = _mm512_mask_blend_epi64(lt, bj, jv);
        jv = _mm512_add_epi64(jv, eight);
        j += 8;
    }
    let rv = _mm512_reduce_min_pd(best);
    let at_min = _mm512_cmp_pd_mask::<_CMP_EQ_OQ>(best, _mm512_set1_pd(rv));
    let rj = if at_min == 0 {
        lo // every value infinite (or NaN): the scalar search keeps `lo`
    } else {
        _mm512_mask_reduce_min_epi64(at_min, bj) as usize
    };
    (rv, rj)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn best_start_avx2(
    p: &Prefix,
    prev: &[f64],
    i: usize,
    lo: usize,
    hi: usize,
) -> (f64, usize) {
    use std::arch::x86_64::*;
    let (wi, si, qi) = (
        _mm256_set1_pd(p.w[i]),
        _mm256_set1_pd(p.s[i]),
        _mm256_set1_pd(p.q[i]),
    );
    let mut best = _mm256_set1_pd(f64::INFINITY);
    let mut bj = _mm256_set1_epi64x(lo as i64);
    let mut jv = _mm256_setr_epi64x(lo as i64, lo as i64 + 1, lo as i64 + 2, lo as i64 + 3);
    let four = _mm256_set1_epi64x(4);
    let n4 = (hi + 1 - lo) / 4 * 4;
    let (pw, ps, pq, pv) = (p.w.as_ptr(), p.s.as_ptr(), p.q.as_ptr(), prev.as_ptr());
    let mut j = lo;
    while j < lo + n4 {
        let w = _mm256_sub_pd(wi, _mm256_loadu_pd(pw.add(j)));
        let s = _mm256_sub_pd(si, _mm256_loadu_pd(ps.add(j)));
        let q = _mm256_sub_pd(qi, _mm256_loadu_pd(pq.add(j)));
        let c = cost256(w, s, q);
        let v = _mm256_add_pd(_mm256_loadu_pd(pv.add(j)), c);
        let lt = _mm256_cmp_pd::<_CMP_LT_OQ>(v, best);
        best = _mm256_blendv_pd(best, v, lt);
        bj = _mm256_castpd_si256(_mm256_blendv_pd(
            _mm256_castsi256_pd(bj),
            _mm256_castsi256_pd(jv),
            lt,
        ));
        jv = _mm256_add_epi64(jv, four);
        j += 4;
    }
    let mut bv = [0f64; 4];
    let mut bi = [0i64; 4];
    _mm256_storeu_pd(bv.as_mut_ptr(), best);
    _mm256_storeu_si256(bi.as_mut_ptr() as *mut __m256i, bj);
    let (mut rv, mut rj) = (f64::INFINITY, usize::MAX);
    for l in 0..4 {
        let (v, jl) = (bv[l], bi[l] as usize);
        if v < rv || (v == rv && jl < rj) {
            rv = v;
            rj = jl;
        }
    }
    if lo + n4 <= hi {
        let (v, jt) = best_start_scalar(p, prev, i, lo + n4, hi);
        if v < rv {
            rv = v;
            rj = jt;
        }
    }
    if rj == usize::MAX {
        rj = lo;
    }
    (rv, rj)
}

/// Rows per group of a Knuth layer (they share one upper bound, see [`knuth_layer`]).
const GROUP: usize = 8;

/// AVX2 vectors (four rows each) per group.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const HALVES: usize = GROUP / 4;

/// Independent row ranges of a Knuth layer, swept side by side (see [`knuth_segments`]).
const SEGMENTS: usize = 3;

/// Layers with fewer rows than this per segment are swept as one range.
const SEGMENT_MIN_ROWS: usize = 64;

/// The row ranges `(top, bottom)` (inclusive, `top` first) of layer `m`'s rows `m..=n`, top
/// range first; an unused range has `top < bottom`. Each range's sweep starts with no upper
/// bound of its own (`opt_m(i) <= i - 1`) and carries its groups' results down, so the ranges
/// do not wait on one another: the CPU overlaps one range's division and reduction latency
/// with the other's work (each group of eight rows otherwise waits for the group above it).
/// The cost is one wider window at the top of each range past the first. The split depends
/// only on `m` and `n`, so every path (scalar, AVX2, AVX-512) sweeps the same ranges.
fn knuth_segments(m: usize, n: usize) -> [(usize, usize); SEGMENTS] {
    let rows = n + 1 - m;
    let mut out = [(0, 1); SEGMENTS];
    if rows < SEGMENTS * SEGMENT_MIN_ROWS {
        out[0] = (n, m);
        return out;
    }
    let len = rows / SEGMENTS / GROUP * GROUP;
    for (s, seg) in out.iter_mut().enumerate() {
        let top = n - s * len;
        *seg = (top, if s + 1 == SEGMENTS { m } else { top + 1 - len });
    }
    out
}

/// One Knuth layer: `cur[i], opt_cur[i]` for `i` in `m..=n` from layer `m - 1`, [`GROUP`]
/// rows at a time within each range of [`knuth_segments`]. The rows of a group share the
/// upper bound `opt_m` of the row just above the group (at least each row's own `opt_m`,
/// which is monotone), each with its own lower bound `max(m - 1, opt_{m-1}(row))`. The
/// windows are a few columns wide at these layers; independent rows per step keep the
/// divider busy instead of waiting for one row's result to know the next row's window, and
/// the ranges' groups, interleaved, hide the wait between groups.
fn knuth_layer(
    p: &Prefix,
    prev: &[f64],
    opt_prev: &[u32],
    m: usize,
    n: usize,
    cur: &mut [f64],
    opt_cur: &mut [u32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if simd() == Simd::Avx512 {
            // SAFETY: AVX-512F (and so AVX2) is present, checked by simd().
            return unsafe { knuth_layer_avx512(p, prev, opt_prev, m, n, cur, opt_cur) };
        }
        if simd() >= Simd::Avx2 {
            // SAFETY: AVX2 is present, checked on the line above.
            return unsafe { knuth_layer_avx2(p, prev, opt_prev, m, n, cur, opt_cur) };
        }
    }
    knuth_layer_body(p, prev, opt_prev, m, n, cur, opt_cur)
}

/// [`knuth_layer_body`] with the eight rows of a group in the lanes of two AVX2 vectors
/// (lane `t` of half `h` holds row `i - 7 + 4h + t`): the windows, the candidates of each column
/// of their union, the per-lane minimum (smallest `j` on ties) and the stores are all vector
/// operations. The partial group at the bottom (fewer than eight rows) is left to the scalar
/// rows. Same results as the scalar body (tested).
///
/// # Safety
/// The CPU must have AVX2. `prev`, `opt_prev`, `cur`, `opt_cur` are `n + 1` long, `p` is the
/// prefix of `n` values, `2 <= m <= n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn knuth_layer_avx2(
    p: &Prefix,
    prev: &[f64],
    opt_prev: &[u32],
    m: usize,
    n: usize,
    cur: &mut [f64],
    opt_cur: &mut [u32],
) {
    use std::arch::x86_64::*;
    debug_assert!(
        prev.len() == n + 1
            && opt_prev.len() == n + 1
            && cur.len() == n + 1
            && opt_cur.len() == n + 1
    );
    let (pw, ps, pq, pv) = (p.w.as_ptr(), p.s.as_ptr(), p.q.as_ptr(), prev.as_ptr());
    let zero = _mm256_setzero_pd();
    let inf = _mm256_set1_pd(f64::INFINITY);
    let mmin = _mm256_set1_epi64x(m as i64 - 1);
    let lane = _mm256_setr_epi64x(0, 1, 2, 3);
    macro_rules! pick {
        ($a:expr, $b:expr) => {{
            let (a, b): ((__m256d, __m256i), (__m256d, __m256i)) = ($a, $b);
            let lt = _mm256_cmp_pd::<_CMP_LT_OQ>(b.0, a.0);
            (
                _mm256_blendv_pd(a.0, b.0, lt),
                _mm256_blendv_epi8(a.1, b.1, _mm256_castpd_si256(lt)),
            )
        }};
    }
    for (top, bottom) in knuth_segments(m, n) {
        if top < bottom {
            continue;
        }
        let mut upper = n - 1;
        let mut i = top;
        while i >= bottom + GROUP - 1 {
            let r0 = i - (GROUP - 1);
            let up = _mm256_set1_epi64x(upper as i64);
            let mut wi = [zero; HALVES];
            let mut si = [zero; HALVES];
            let mut qi = [zero; HALVES];
            let mut wlo = [up; HALVES];
            let mut whi = [up; HALVES];
            let (mut j0, mut j1) = (usize::MAX, 0usize);
            for h in 0..HALVES {
                let r = r0 + 4 * h;
                wi[h] = _mm256_loadu_pd(pw.add(r));
                si[h] = _mm256_loadu_pd(ps.add(r));
                qi[h] = _mm256_loadu_pd(pq.add(r));
                // lo = max(m - 1, opt_prev[row]); hi = min(upper, row - 1); crossed bounds
                // (rounding in near-ties) search [hi, min(lo, row - 1)].
                let op = _mm256_cvtepu32_epi64(_mm_loadu_si128(
                    opt_prev.as_ptr().add(r) as *const __m128i
                ));
                let lo = _mm256_blendv_epi8(op, mmin, _mm256_cmpgt_epi64(mmin, op));
                let rm1 = _mm256_add_epi64(_mm256_set1_epi64x(r as i64 - 1), lane);
                let hi = _mm256_blendv_epi8(up, rm1, _mm256_cmpgt_epi64(up, rm1));
                let crossed = _mm256_cmpgt_epi64(lo, hi);
                wlo[h] = _mm256_blendv_epi8(lo, hi, crossed);
                let whi0 = _mm256_blendv_epi8(hi, lo, crossed);
                whi[h] = _mm256_blendv_epi8(whi0, rm1, _mm256_cmpgt_epi64(whi0, rm1));
                let mut l = [0i64; 4];
                let mut hh = [0i64; 4];
                _mm256_storeu_si256(l.as_mut_ptr() as *mut __m256i, wlo[h]);
                _mm256_storeu_si256(hh.as_mut_ptr() as *mut __m256i, whi[h]);
                j0 = j0.min(l[0].min(l[1]).min(l[2]).min(l[3]) as usize);
                j1 = j1.max(hh[0].max(hh[1]).max(hh[2]).max(hh[3]) as usize);
            }
            let mut best: [(__m256d, __m256i); HALVES] = std::array::from_fn(|h| (inf, wlo[h]));
            let mut j = j0;
            while j <= j1 {
                for (h, bh) in best.iter_mut().enumerate() {
                    // Columns j..j+4, those past j1 outside every lane's window (never read).
                    let mut cv = [inf; 4];
                    let mut cj = [_mm256_setzero_si256(); 4];
                    for (u, (cvu, cju)) in cv.iter_mut().zip(cj.iter_mut()).enumerate() {
                        let jj = j + u;
                        let jv = _mm256_set1_epi64x(jj as i64);
                        *cju = jv;
                        if jj > j1 {
                            continue;
                        }
                        let outside = _mm256_or_si256(
                            _mm256_cmpgt_epi64(wlo[h], jv),
                            _mm256_cmpgt_epi64(jv, whi[h]),
                        );
                        let w = _mm256_sub_pd(wi[h], _mm256_set1_pd(*pw.add(jj)));
                        let s = _mm256_sub_pd(si[h], _mm256_set1_pd(*ps.add(jj)));
                        let q = _mm256_sub_pd(qi[h], _mm256_set1_pd(*pq.add(jj)));
                        let c = cost256(w, s, q);
                        let v = _mm256_add_pd(_mm256_set1_pd(*pv.add(jj)), c);
                        *cvu = _mm256_blendv_pd(v, inf, _mm256_castsi256_pd(outside));
                    }
                    // Tree minimum over the four columns, then into the running best; strict `<`
                    // keeps the earlier (smaller) column on equal values.
                    let c01 = pick!((cv[0], cj[0]), (cv[1], cj[1]));
                    let c23 = pick!((cv[2], cj[2]), (cv[3], cj[3]));
                    *bh = pick!(*bh, pick!(c01, c23));
                }
                j += 4;
            }
            for (h, &(b, bj)) in best.iter().enumerate() {
                let r = r0 + 4 * h;
                _mm256_storeu_pd(cur.as_mut_ptr().add(r), b);
                // Low 32 bits of each 64-bit lane (j <= n < 2^32).
                let packed =
                    _mm256_permutevar8x32_epi32(bj, _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0));
                _mm_storeu_si128(
                    opt_cur.as_mut_ptr().add(r) as *mut __m128i,
                    _mm256_castsi256_si128(packed),
                );
            }
            upper = _mm256_cvtsi256_si32(best[0].1) as u32 as usize;
            i -= GROUP;
        }
        if i >= bottom {
            knuth_rows(p, prev, opt_prev, m, bottom, i, upper, cur, opt_cur);
        }
    }
}

/// [`knuth_layer_avx2`] with the eight rows in one AVX-512 vector and mask registers.
///
/// # Safety
/// The CPU must have AVX-512F; the rest as [`knuth_layer_avx2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn knuth_layer_avx512(
    p: &Prefix,
    prev: &[f64],
    opt_prev: &[u32],
    m: usize,
    n: usize,
    cur: &mut [f64],
    opt_cur: &mut [u32],
) {
    debug_assert!(
        prev.len() == n + 1
            && opt_prev.len() == n + 1
            && cur.len() == n + 1
            && opt_cur.len() == n + 1
    );
    let segs = knuth_segments(m, n);
    let mut i = segs.map(|(top, _)| top);
    let mut upper = [n - 1; SEGMENTS];
    loop {
        // One group of each range per pass: the ranges' dependency chains are independent.
        let mut any = false;
        for s in 0..SEGMENTS {
            if i[s] >= segs[s].1 + GROUP - 1 {
                upper[s] = knuth_group_avx512(
                    p,
                    prev,
                    opt_prev,
                    m,
                    i[s] - (GROUP - 1),
                    upper[s],
                    cur,
                    opt_cur,
                );
                i[s] -= GROUP;
                any = true;
            }
        }
        if !any {
            break;
        }
    }
    for s in 0..SEGMENTS {
        if i[s] >= segs[s].1 {
            knuth_rows(
                p, prev, opt_prev, m, segs[s].1, i[s], upper[s], cur, opt_cur,
            );
        }
    }
}

/// Rows `r0..r0 + 8` of a Knuth layer in the lanes of one AVX-512 vector, under the shared
/// upper bound `upper`; returns row `r0`'s `opt_m`, the next group's upper bound.
///
/// # Safety
/// As [`knuth_layer_avx512`]; `m <= r0` and `r0 + 7 <= n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn knuth_group_avx512(
    p: &Prefix,
    prev: &[f64],
    opt_prev: &[u32],
    m: usize,
    r0: usize,
    upper: usize,
    cur: &mut [f64],
    opt_cur: &mut [u32],
) -> usize {
    use std::arch::x86_64::*;
    let (pw, ps, pq, pv) = (p.w.as_ptr(), p.s.as_ptr(), p.q.as_ptr(), prev.as_ptr());
    let inf = _mm512_set1_pd(f64::INFINITY);
    let mmin = _mm512_set1_epi64(m as i64 - 1);
    let lane = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
    let wi = _mm512_loadu_pd(pw.add(r0));
    let si = _mm512_loadu_pd(ps.add(r0));
    let qi = _mm512_loadu_pd(pq.add(r0));
    let op = _mm512_cvtepu32_epi64(_mm256_loadu_si256(
        opt_prev.as_ptr().add(r0) as *const __m256i
    ));
    let lo = _mm512_max_epi64(op, mmin);
    let rm1 = _mm512_add_epi64(_mm512_set1_epi64(r0 as i64 - 1), lane);
    let hi = _mm512_min_epi64(_mm512_set1_epi64(upper as i64), rm1);
    let crossed = _mm512_cmpgt_epi64_mask(lo, hi);
    let wlo = _mm512_mask_blend_epi64(crossed, lo, hi);
    let whi = _mm512_min_epi64(_mm512_mask_blend_epi64(crossed, hi, lo), rm1);
    let j0 = _mm512_reduce_min_epi64(wlo) as usize;
    let j1 = _mm512_reduce_max_epi64(whi) as usize;
    let mut best = (inf, wlo);
    // Column jj is inside a lane's window when jj - wlo <= whi - wlo, unsigned (one compare).
    let span = _mm512_sub_epi64(whi, wlo);
    let mut off = _mm512_sub_epi64(_mm512_set1_epi64(j0 as i64), wlo);
    let one = _mm512_set1_epi64(1);
    for jj in j0..=j1 {
        let inside = _mm512_cmple_epu64_mask(off, span);
        off = _mm512_add_epi64(off, one);
        let w = _mm512_sub_pd(wi, _mm512_set1_pd(*pw.add(jj)));
        let s = _mm512_sub_pd(si, _mm512_set1_pd(*ps.add(jj)));
        let q = _mm512_sub_pd(qi, _mm512_set1_pd(*pq.add(jj)));
        let c = cost512(w, s, q);
        let v = _mm512_add_pd(_mm512_set1_pd(*pv.add(jj)), c);
        // Strict `<` in column order: the smallest j on equal values.
        let lt = _mm512_mask_cmp_pd_mask::<_CMP_LT_OQ>(inside, v, best.0);
        best = (
            _mm512_mask_blend_pd(lt, best.0, v),
            _mm512_mask_blend_epi64(lt, best.1, _mm512_set1_epi64(jj as i64)),
        );
    }
    _mm512_storeu_pd(cur.as_mut_ptr().add(r0), best.0);
    _mm256_storeu_si256(
        opt_cur.as_mut_ptr().add(r0) as *mut __m256i,
        _mm512_cvtepi64_epi32(best.1),
    );
    _mm_cvtsi128_si64(_mm512_castsi512_si128(best.1)) as usize
}

/// The portable Knuth layer ([`knuth_layer`]).
fn knuth_layer_body(
    p: &Prefix,
    prev: &[f64],
    opt_prev: &[u32],
    m: usize,
    n: usize,
    cur: &mut [f64],
    opt_cur: &mut [u32],
) {
    for (top, bottom) in knuth_segments(m, n) {
        if top >= bottom {
            knuth_rows(p, prev, opt_prev, m, bottom, top, n - 1, cur, opt_cur);
        }
    }
}

/// Rows `top` down to `bottom` of a Knuth layer (one range of [`knuth_segments`]) in groups
/// of [`GROUP`], the first group's upper bound `upper` (see [`knuth_layer`]); each row's window `[max(m - 1, opt_{m-1}(row)),
/// min(upper, row - 1)]` (crossed bounds: both searched), its minimum the smallest `j`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn knuth_rows(
    p: &Prefix,
    prev: &[f64],
    opt_prev: &[u32],
    m: usize,
    bottom: usize,
    top: usize,
    mut upper: usize,
    cur: &mut [f64],
    opt_cur: &mut [u32],
) {
    let mut i = top;
    while i >= bottom {
        let rows = GROUP.min(i - bottom + 1);
        let mut low_j = 0;
        for t in (0..rows).rev() {
            let r = i - t;
            let lo = (opt_prev[r] as usize).max(m - 1);
            let hi = upper.min(r - 1);
            // The bounds cross only through rounding in near-ties; search both then.
            let (v, j) = best_start_scalar(p, prev, r, lo.min(hi), lo.max(hi).min(r - 1));
            cur[r] = v;
            opt_cur[r] = j as u32;
            if t == rows - 1 {
                low_j = j;
            }
        }
        upper = low_j;
        i -= rows;
    }
}

/// Layer `m` (`cur`, `opt_cur`) of the dynamic program from layer `m - 1`: Knuth's sweep at
/// or past `knuth_from` clusters, divide and conquer below.
#[allow(clippy::too_many_arguments)]
fn layer(
    p: &Prefix,
    prev: &[f64],
    opt_prev: &[u32],
    m: usize,
    n: usize,
    knuth_from: usize,
    cur: &mut [f64],
    opt_cur: &mut [u32],
) {
    cur.iter_mut().for_each(|v| *v = f64::INFINITY);
    if m >= knuth_from.max(2) {
        // Knuth, eight rows at a time (see knuth_layer): the windows are a few columns wide
        // here; independent rows per step keep the divider busy.
        knuth_layer(p, prev, opt_prev, m, n, cur, opt_cur);
    } else {
        // Divide and conquer over i in m..=n with the monotone argmin, one level of the
        // recursion at a time: the intervals of a level are independent (their windows come
        // from the level above), so the CPU overlaps their searches. An interval
        // [ilo, ihi]'s window is bounded by the starts found for rows ilo - 1 and ihi + 1
        // (m - 1 and n - 1 at the ends), as in the depth-first recursion.
        let mut level = vec![(m, n)];
        let mut next = Vec::with_capacity(2);
        while !level.is_empty() {
            next.clear();
            for &(ilo, ihi) in &level {
                let mid = ilo + (ihi - ilo) / 2;
                let jlo = if ilo > m {
                    opt_cur[ilo - 1] as usize
                } else {
                    m - 1
                };
                let jhi = if ihi < n {
                    opt_cur[ihi + 1] as usize
                } else {
                    n - 1
                };
                let lo = jlo.max(opt_prev[mid] as usize).max(m - 1);
                let hi = jhi.min(mid - 1);
                let (v, j) = best_start(p, prev, mid, lo.min(hi), lo.max(hi).min(mid - 1));
                cur[mid] = v;
                opt_cur[mid] = j as u32;
                if mid > ilo {
                    next.push((ilo, mid - 1));
                }
                if mid < ihi {
                    next.push((mid + 1, ihi));
                }
            }
            std::mem::swap(&mut level, &mut next);
        }
    }
}

/// Layers at or past this count use Knuth's sweep; below it, divide and conquer. The sweep
/// costs about n + n^2 / (2 m^2) per layer, divide and conquer about n log2 n.
fn knuth_from(n: usize) -> usize {
    let log2n = (usize::BITS - n.leading_zeros()) as usize;
    ((n / (2 * log2n.max(1))) as f64).sqrt().ceil() as usize
}

/// The optimal partition of sorted, strictly increasing `x` (weights `w > 0`, same length)
/// into `min(k, x.len())` contiguous clusters, in O(n) memory past
/// [`MAX_BACKPOINTER_BYTES`] (module docs).
///
/// Panics if `x` is empty, lengths differ or `k == 0` (callers check; this is internal).
pub fn optimal(x: &[f64], w: &[f64], k: usize) -> Result<Clustering, AllocFailed> {
    optimal_with_limit(x, w, k, MAX_BACKPOINTER_BYTES)
}

/// [`optimal`] with the direct solver's back-pointer budget `max_backpointer_bytes` (0: the
/// linear-memory split all the way down; for tests and benchmarks).
pub fn optimal_with_limit(
    x: &[f64],
    w: &[f64],
    k: usize,
    max_backpointer_bytes: usize,
) -> Result<Clustering, AllocFailed> {
    assert!(!x.is_empty() && x.len() == w.len() && k > 0);
    let n = x.len();
    if n > MAX_DISTINCT {
        return Err(AllocFailed {
            what: "k-means over more than 2^32 - 2 distinct values",
            bytes: n.saturating_mul(8),
        });
    }
    let k = k.min(n);
    let mut starts = Vec::new();
    try_reserve(&mut starts, k, "k-means cluster starts")?;
    split(x, w, k, max_backpointer_bytes, 0, &mut starts)?;
    starts.sort_unstable();
    debug_assert_eq!(starts.len(), k);
    let mut means = Vec::with_capacity(k);
    let mut sse = 0.0;
    for c in 0..k {
        let (a, b) = (starts[c], if c + 1 < k { starts[c + 1] } else { n });
        // Direct weighted mean about the cluster's first value: exact for a singleton.
        let wt: f64 = w[a..b].iter().sum();
        let dm = x[a..b]
            .iter()
            .zip(&w[a..b])
            .map(|(xi, wi)| wi * (xi - x[a]))
            .sum::<f64>()
            / wt;
        means.push(x[a] + dm);
        sse += x[a..b]
            .iter()
            .zip(&w[a..b])
            .map(|(xi, wi)| wi * (xi - means[c]) * (xi - means[c]))
            .sum::<f64>();
    }
    Ok(Clustering { starts, means, sse })
}

/// Appends to `starts` the starts (plus `base`) of the optimal `k` clusters of `x`
/// (`1 <= k <= x.len()`), directly when the back-pointers fit `limit` bytes, else by the
/// Hirschberg split.
fn split(
    x: &[f64],
    w: &[f64],
    k: usize,
    limit: usize,
    base: usize,
    starts: &mut Vec<usize>,
) -> Result<(), AllocFailed> {
    let n = x.len();
    if k == 1 {
        starts.push(base);
        return Ok(());
    }
    if k == n {
        starts.extend(base..base + n);
        return Ok(());
    }
    let table = k.saturating_mul(n + 1).saturating_mul(4);
    if table <= limit {
        return direct(x, w, k, base, starts);
    }
    let k1 = k / 2;
    let k2 = k - k1;
    // F[j]: the first j values in k1 clusters; R[t]: the last t values in k2 clusters. The
    // two passes are independent (run side by side).
    let (f, r) = rayon::join(
        || last_layer(x, w, k1, false),
        || last_layer(x, w, k2, true),
    );
    let (f, r) = (f?, r?);
    let mut best = f64::INFINITY;
    let mut s = k1;
    for j in k1..=n - k2 {
        let v = f[j] + r[n - j];
        if v < best {
            best = v;
            s = j;
        }
    }
    drop((f, r));
    let mut right = Vec::new();
    try_reserve(&mut right, k2, "k-means cluster starts")?;
    let (a, b) = rayon::join(
        || split(&x[..s], &w[..s], k1, limit, base, starts),
        || split(&x[s..], &w[s..], k2, limit, base + s, &mut right),
    );
    a?;
    b?;
    starts.extend_from_slice(&right);
    Ok(())
}

/// The last layer `D_k(i)`, `i` in `0..=n`, of the dynamic program over `x` (`reversed`: over
/// the values reversed and negated, i.e. the cost of the last `i` values in `k` clusters),
/// keeping two rows.
fn last_layer(x: &[f64], w: &[f64], k: usize, reversed: bool) -> Result<Vec<f64>, AllocFailed> {
    let n = x.len();
    let p = Prefix::new(x, w, reversed)?;
    let stride = n + 1;
    let mut prev = try_filled(stride, f64::INFINITY, "k-means rows")?;
    let mut cur = try_filled(stride, f64::INFINITY, "k-means rows")?;
    let mut opt_prev = try_filled(stride, 0u32, "k-means rows")?;
    let mut opt_cur = try_filled(stride, 0u32, "k-means rows")?;
    for (i, v) in prev.iter_mut().enumerate().skip(1) {
        *v = p.cost(0, i);
    }
    let kf = knuth_from(n);
    for m in 2..=k {
        layer(&p, &prev, &opt_prev, m, n, kf, &mut cur, &mut opt_cur);
        std::mem::swap(&mut prev, &mut cur);
        std::mem::swap(&mut opt_prev, &mut opt_cur);
    }
    Ok(prev)
}

/// The direct solver: every layer's back-pointers kept, then one walk back from `D_k(n)`.
fn direct(
    x: &[f64],
    w: &[f64],
    k: usize,
    base: usize,
    starts: &mut Vec<usize>,
) -> Result<(), AllocFailed> {
    let n = x.len();
    let p = Prefix::new(x, w, false)?;
    // opt[(m - 1) * (n + 1) + i]: start of the last cluster of D_m(i).
    let stride = n + 1;
    // The back-pointers (k * (n + 1) u32, megabytes at 8 bits) in a buffer kept per thread:
    // a fresh allocation per group would cost its page faults every time.
    thread_local! {
        static OPT: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let mut opt = OPT.with(|b| std::mem::take(&mut *b.borrow_mut()));
    opt.clear();
    try_reserve(&mut opt, k * stride, "k-means back-pointers")?;
    opt.resize(k * stride, 0);
    let mut prev = try_filled(stride, f64::INFINITY, "k-means rows")?;
    let mut cur = try_filled(stride, f64::INFINITY, "k-means rows")?;
    for (i, v) in prev.iter_mut().enumerate().skip(1) {
        *v = p.cost(0, i);
    }
    let kf = knuth_from(n);
    for m in 2..=k {
        let (before, rest) = opt.split_at_mut((m - 1) * stride);
        let opt_prev = &before[(m - 2) * stride..];
        let opt_cur = &mut rest[..stride];
        layer(&p, &prev, opt_prev, m, n, kf, &mut cur, opt_cur);
        std::mem::swap(&mut prev, &mut cur);
    }
    // Walk back from D_k(n).
    let first = starts.len();
    starts.resize(first + k, base);
    let mut i = n;
    for m in (2..=k).rev() {
        let j = opt[(m - 1) * stride + i] as usize;
        starts[first + m - 1] = base + j;
        i = j;
    }
    OPT.with(|b| *b.borrow_mut() = opt);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exhaustive O(k n^2) dynamic program with direct (not prefix) cluster costs.
    fn brute(x: &[f64], w: &[f64], k: usize) -> f64 {
        let n = x.len();
        let k = k.min(n);
        let cost = |j: usize, i: usize| {
            let wt: f64 = w[j..i].iter().sum();
            let mean = x[j..i]
                .iter()
                .zip(&w[j..i])
                .map(|(a, b)| a * b)
                .sum::<f64>()
                / wt;
            x[j..i]
                .iter()
                .zip(&w[j..i])
                .map(|(a, b)| b * (a - mean) * (a - mean))
                .sum::<f64>()
        };
        let mut d = vec![vec![f64::INFINITY; n + 1]; k + 1];
        d[0][0] = 0.0;
        for m in 1..=k {
            for i in m..=n {
                for j in (m - 1)..i {
                    let v = d[m - 1][j] + cost(j, i);
                    if v < d[m][i] {
                        d[m][i] = v;
                    }
                }
            }
        }
        d[k][n]
    }

    fn lcg(s: &mut u64) -> f64 {
        *s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*s >> 11) as f64) / (1u64 << 53) as f64
    }

    #[test]
    fn matches_exhaustive_search() {
        let mut s = 7u64;
        for case in 0..300 {
            let n = 1 + (case % 40);
            let mut x: Vec<f64> = (0..n)
                .map(|_| {
                    let u = lcg(&mut s);
                    // Mixed scales and clumps.
                    if case % 3 == 0 {
                        (u * 8.0).floor() + lcg(&mut s) * 1e-3
                    } else {
                        (u - 0.5) * (1.0 + case as f64)
                    }
                })
                .collect();
            x.sort_by(f64::total_cmp);
            x.dedup();
            let w: Vec<f64> = x
                .iter()
                .map(|_| 1.0 + (lcg(&mut s) * 5.0).floor())
                .collect();
            for k in [1, 2, 3, 4, 7, 16] {
                let c = optimal(&x, &w, k).unwrap();
                let b = brute(&x, &w, k);
                assert!(
                    (c.sse - b).abs() <= 1e-9 * (1.0 + b.abs()),
                    "case {case} n {} k {k}: {} vs exhaustive {}",
                    x.len(),
                    c.sse,
                    b
                );
                assert_eq!(c.starts.len(), k.min(x.len()));
                assert!(c.starts.windows(2).all(|p| p[0] < p[1]));
            }
        }
    }

    /// Issue 16 item 1 (coremltools #2551: memory grows as clusters x distinct values): the
    /// linear-memory split (forced all the way down, and with a small budget so it ends in
    /// the direct solver) reaches the exhaustive optimum.
    #[test]
    fn kmeans_memory_grows_as_clusters_x_distinct_values() {
        let mut s = 99u64;
        for case in 0..200 {
            let n = 1 + (case % 45);
            let mut x: Vec<f64> = (0..n)
                .map(|_| {
                    let u = lcg(&mut s);
                    if case % 3 == 0 {
                        (u * 6.0).floor() + lcg(&mut s) * 1e-3
                    } else {
                        (u - 0.5) * (1.0 + case as f64)
                    }
                })
                .collect();
            x.sort_by(f64::total_cmp);
            x.dedup();
            let w: Vec<f64> = x
                .iter()
                .map(|_| 1.0 + (lcg(&mut s) * 5.0).floor())
                .collect();
            for k in [1, 2, 3, 5, 8, 16] {
                let b = brute(&x, &w, k);
                for limit in [0, 64, MAX_BACKPOINTER_BYTES] {
                    let c = optimal_with_limit(&x, &w, k, limit).unwrap();
                    assert!(
                        (c.sse - b).abs() <= 1e-9 * (1.0 + b.abs()),
                        "case {case} n {} k {k} limit {limit}: {} vs exhaustive {b}",
                        x.len(),
                        c.sse
                    );
                    assert_eq!(c.starts.len(), k.min(x.len()));
                    assert_eq!(c.starts[0], 0);
                    assert!(c.starts.windows(2).all(|p| p[0] < p[1]));
                }
            }
        }
    }

    /// The split on a larger problem (20 000 values, 256 clusters, a budget of 1 MiB so it
    /// splits several times) equals the direct solver's optimum.
    #[test]
    fn split_equals_direct_on_a_larger_problem() {
        let mut s = 5u64;
        let mut x: Vec<f64> = (0..20_000).map(|_| lcg(&mut s) + lcg(&mut s)).collect();
        x.sort_by(f64::total_cmp);
        x.dedup();
        let w: Vec<f64> = x
            .iter()
            .map(|_| 1.0 + (lcg(&mut s) * 3.0).floor())
            .collect();
        let d = optimal_with_limit(&x, &w, 256, usize::MAX).unwrap();
        let h = optimal_with_limit(&x, &w, 256, 1 << 20).unwrap();
        assert!(
            (d.sse - h.sse).abs() <= 1e-12 * d.sse,
            "direct {} split {}",
            d.sse,
            h.sse
        );
    }

    #[test]
    fn avx2_scan_equals_scalar_scan() {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            let mut s = 11u64;
            let n = 3000;
            // Clumped values make exact ties between candidates likely.
            let mut x: Vec<f64> = (0..n)
                .map(|_| (lcg(&mut s) * 200.0).floor() * 0.01 + lcg(&mut s) * 1e-9)
                .collect();
            x.sort_by(f64::total_cmp);
            x.dedup();
            let w: Vec<f64> = x
                .iter()
                .map(|_| 1.0 + (lcg(&mut s) * 3.0).floor())
                .collect();
            let p = Prefix::new(&x, &w, false).unwrap();
            let prev: Vec<f64> = (0..=x.len()).map(|i| (i % 7) as f64 * 1e-3).collect();
            for _ in 0..2000 {
                let i = 2 + (lcg(&mut s) * (x.len() - 2) as f64) as usize;
                let lo = (lcg(&mut s) * (i - 1) as f64) as usize;
                let hi = lo + (lcg(&mut s) * (i - lo) as f64) as usize;
                let a = best_start_scalar(&p, &prev, i, lo, hi.min(i - 1));
                // SAFETY: AVX2 checked above; lo <= hi < i <= n.
                let b = unsafe { best_start_avx2(&p, &prev, i, lo, hi.min(i - 1)) };
                assert_eq!(
                    (a.0.to_bits(), a.1),
                    (b.0.to_bits(), b.1),
                    "i {i} lo {lo} hi {hi}"
                );
            }
        }
    }

    #[test]
    fn simd_knuth_layers_equal_the_scalar_layer() {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            let mut s = 23u64;
            for case in 0..20 {
                let n = 50 + case * 37;
                // Clumped values (near-ties) in some cases.
                let mut x: Vec<f64> = (0..n)
                    .map(|_| {
                        if case % 2 == 0 {
                            (lcg(&mut s) * 50.0).floor() * 0.02 + lcg(&mut s) * 1e-9
                        } else {
                            lcg(&mut s) - 0.5
                        }
                    })
                    .collect();
                x.sort_by(f64::total_cmp);
                x.dedup();
                let n = x.len();
                let w: Vec<f64> = x
                    .iter()
                    .map(|_| 1.0 + (lcg(&mut s) * 4.0).floor())
                    .collect();
                let p = Prefix::new(&x, &w, false).unwrap();
                // Layer 1 exactly, then a few layers on both paths from the same input.
                let mut prev: Vec<f64> = (0..=n)
                    .map(|i| if i == 0 { f64::INFINITY } else { p.cost(0, i) })
                    .collect();
                let mut opt_prev = vec![0u32; n + 1];
                for m in 2..6 {
                    let (mut c0, mut c1) = (vec![f64::INFINITY; n + 1], vec![f64::INFINITY; n + 1]);
                    let (mut o0, mut o1) = (vec![0u32; n + 1], vec![0u32; n + 1]);
                    knuth_layer_body(&p, &prev, &opt_prev, m, n, &mut c0, &mut o0);
                    // SAFETY: AVX2 checked above.
                    unsafe { knuth_layer_avx2(&p, &prev, &opt_prev, m, n, &mut c1, &mut o1) };
                    assert_eq!(o0, o1, "case {case} layer {m}");
                    let b0: Vec<u64> = c0.iter().map(|v| v.to_bits()).collect();
                    let b1: Vec<u64> = c1.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(b0, b1, "case {case} layer {m}");
                    if std::is_x86_feature_detected!("avx512f") {
                        let (mut c2, mut o2) = (vec![f64::INFINITY; n + 1], vec![0u32; n + 1]);
                        // SAFETY: AVX-512F checked on the line above.
                        unsafe { knuth_layer_avx512(&p, &prev, &opt_prev, m, n, &mut c2, &mut o2) };
                        assert_eq!(o0, o2, "case {case} layer {m} (AVX-512)");
                        let b2: Vec<u64> = c2.iter().map(|v| v.to_bits()).collect();
                        assert_eq!(b0, b2, "case {case} layer {m} (AVX-512)");
                    }
                    prev = c0;
                    opt_prev = o0;
                }
            }
        }
    }

    /// Layers long enough to be swept as several ranges ([`knuth_segments`]) reach the
    /// minimum of the full O(k n^2) search over every start (same cost function).
    #[test]
    fn segmented_knuth_layers_reach_the_full_search_minimum() {
        let mut s = 41u64;
        for case in 0..6 {
            let n0 = 300 + case * 150;
            let mut x: Vec<f64> = (0..n0)
                .map(|_| {
                    if case % 2 == 0 {
                        lcg(&mut s) + lcg(&mut s) + lcg(&mut s)
                    } else {
                        (lcg(&mut s) * 90.0).floor() * 0.01 + lcg(&mut s) * 1e-7
                    }
                })
                .collect();
            x.sort_by(f64::total_cmp);
            x.dedup();
            let n = x.len();
            assert!(n + 1 - knuth_from(n) >= SEGMENTS * SEGMENT_MIN_ROWS);
            let w: Vec<f64> = x
                .iter()
                .map(|_| 1.0 + (lcg(&mut s) * 4.0).floor())
                .collect();
            let p = Prefix::new(&x, &w, false).unwrap();
            for k in [8usize, 33, 64] {
                let mut d: Vec<f64> = (0..=n)
                    .map(|i| if i == 0 { f64::INFINITY } else { p.cost(0, i) })
                    .collect();
                for m in 2..=k {
                    let mut e = vec![f64::INFINITY; n + 1];
                    for (i, ei) in e.iter_mut().enumerate().skip(m) {
                        for (j, dj) in d.iter().enumerate().take(i).skip(m - 1) {
                            *ei = ei.min(dj + p.cost(j, i));
                        }
                    }
                    d = e;
                }
                let c = optimal_with_limit(&x, &w, k, usize::MAX).unwrap();
                assert!(
                    (c.sse - d[n]).abs() <= 1e-9 * (1.0 + d[n]),
                    "case {case} n {n} k {k}: {} vs full search {}",
                    c.sse,
                    d[n]
                );
            }
        }
    }

    #[test]
    fn at_most_k_values_are_exact() {
        let x = [-1.5, -0.25, 0.0, 3.0];
        let w = [2.0, 1.0, 7.0, 1.0];
        let c = optimal(&x, &w, 4).unwrap();
        assert_eq!(c.sse, 0.0);
        assert_eq!(c.means, x.to_vec());
        let c = optimal(&x, &w, 256).unwrap();
        assert_eq!(c.starts, vec![0, 1, 2, 3]);
    }
}
