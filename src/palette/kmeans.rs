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
//! Cost: O(n) memory per layer plus `k * (n + 1)` u32 back-pointers.

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
    fn new(x: &[f64], w: &[f64]) -> Prefix {
        let wt: f64 = w.iter().sum();
        let center = x.iter().zip(w).map(|(a, b)| a * b).sum::<f64>() / wt;
        let n = x.len();
        let (mut pw, mut ps, mut pq) = (
            Vec::with_capacity(n + 1),
            Vec::with_capacity(n + 1),
            Vec::with_capacity(n + 1),
        );
        let (mut a, mut b, mut c) = (0f64, 0f64, 0f64);
        pw.push(0.0);
        ps.push(0.0);
        pq.push(0.0);
        for (&xi, &wi) in x.iter().zip(w) {
            let d = xi - center;
            a += wi;
            b += wi * d;
            c += wi * d * d;
            pw.push(a);
            ps.push(b);
            pq.push(c);
        }
        Prefix {
            w: pw,
            s: ps,
            q: pq,
        }
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

/// Best `j` in `lo..=hi` for `D_m(i)`; returns (value, j), the smallest `j` among equal
/// values. `lo <= hi` required. The AVX2 path computes the same f64 operations four `j` at a
/// time and reduces to the same (value, smallest j), so both paths return the same result.
#[inline(always)]
fn best_start(p: &Prefix, prev: &[f64], i: usize, lo: usize, hi: usize) -> (f64, usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if hi - lo >= 8 && std::is_x86_feature_detected!("avx2") {
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
    let zero = _mm256_setzero_pd();
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
        let c = _mm256_max_pd(
            _mm256_sub_pd(q, _mm256_div_pd(_mm256_mul_pd(s, s), w)),
            zero,
        );
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

/// The optimal partition of sorted, strictly increasing `x` (weights `w > 0`, same length)
/// into `min(k, x.len())` contiguous clusters.
///
/// Panics if `x` is empty, lengths differ or `k == 0` (callers check; this is internal).
pub fn optimal(x: &[f64], w: &[f64], k: usize) -> Clustering {
    assert!(!x.is_empty() && x.len() == w.len() && k > 0);
    let n = x.len();
    let k = k.min(n);
    let p = Prefix::new(x, w);
    // opt[(m - 1) * (n + 1) + i]: start of the last cluster of D_m(i).
    let stride = n + 1;
    let mut opt = vec![0u32; k * stride];
    let mut prev = vec![f64::INFINITY; stride];
    let mut cur = vec![f64::INFINITY; stride];
    for (i, v) in prev.iter_mut().enumerate().skip(1) {
        *v = p.cost(0, i);
    }
    // Layers at or past this count use Knuth's sweep; below it, divide and conquer. The sweep
    // costs about n + n^2 / (2 m^2) per layer, divide and conquer about n log2 n.
    let log2n = (usize::BITS - n.leading_zeros()) as usize;
    let knuth_from = ((n / (2 * log2n.max(1))) as f64).sqrt().ceil() as usize;
    for m in 2..=k {
        let (before, rest) = opt.split_at_mut((m - 1) * stride);
        let opt_prev = &before[(m - 2) * stride..];
        let opt_cur = &mut rest[..stride];
        cur.iter_mut().for_each(|v| *v = f64::INFINITY);
        if m >= knuth_from.max(2) {
            // Knuth: i from n down to m, j in [max(m - 1, opt_{m-1}(i)), min(i - 1, opt_m(i + 1))].
            let mut upper = n - 1;
            for i in (m..=n).rev() {
                let lo = (opt_prev[i] as usize).max(m - 1);
                let hi = upper.min(i - 1);
                // The two bounds cross only through rounding in near-ties; search both then.
                let (v, j) = best_start(&p, &prev, i, lo.min(hi), lo.max(hi).min(i - 1));
                cur[i] = v;
                opt_cur[i] = j as u32;
                upper = j;
            }
        } else {
            // Divide and conquer over i in m..=n with the monotone argmin.
            let mut stack = vec![(m, n, m - 1, n - 1)];
            while let Some((ilo, ihi, jlo, jhi)) = stack.pop() {
                if ilo > ihi {
                    continue;
                }
                let mid = ilo + (ihi - ilo) / 2;
                let lo = jlo.max(opt_prev[mid] as usize).max(m - 1);
                let hi = jhi.min(mid - 1);
                let (v, j) = best_start(&p, &prev, mid, lo.min(hi), lo.max(hi).min(mid - 1));
                cur[mid] = v;
                opt_cur[mid] = j as u32;
                if mid > ilo {
                    stack.push((ilo, mid - 1, jlo, j));
                }
                stack.push((mid + 1, ihi, j, jhi));
            }
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    // Walk back from D_k(n).
    let mut starts = vec![0usize; k];
    let mut i = n;
    for m in (2..=k).rev() {
        let j = opt[(m - 1) * stride + i] as usize;
        starts[m - 1] = j;
        i = j;
    }
    starts[0] = 0;
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
    Clustering { starts, means, sse }
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
                let c = optimal(&x, &w, k);
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
            let p = Prefix::new(&x, &w);
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
    fn at_most_k_values_are_exact() {
        let x = [-1.5, -0.25, 0.0, 3.0];
        let w = [2.0, 1.0, 7.0, 1.0];
        let c = optimal(&x, &w, 4);
        assert_eq!(c.sse, 0.0);
        assert_eq!(c.means, x.to_vec());
        let c = optimal(&x, &w, 256);
        assert_eq!(c.starts, vec![0, 1, 2, 3]);
    }
}
