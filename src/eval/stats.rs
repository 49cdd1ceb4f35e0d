//! Per-position statistics of next-token prediction, and their summaries.
//!
//! The figures are those `llama-perplexity` prints (tools/perplexity/perplexity.cpp in
//! llama.cpp b11434), with two documented differences: every log-softmax is computed in f64
//! over the f32 logits, and the reference's distribution is used exactly (llama.cpp stores the
//! base model's log-probabilities as 16-bit steps of (max - min)/65535 over a range of at most
//! 16 nats, and leaves out of the KL sum the terms whose base log-probability is below -16).

use serde::Serialize;

/// One row of logits, reduced: `log Z = max + ln sum exp(l - max)` and the first index of the
/// largest logit.
#[derive(Clone, Copy, Debug)]
pub struct RowNorm {
    pub log_z: f64,
    pub argmax: usize,
}

/// `log Z` and the argmax (first index on ties) of a row of logits.
pub fn row_norm(row: &[f32]) -> RowNorm {
    let mut argmax = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[argmax] {
            argmax = i;
        }
    }
    let max = row[argmax] as f64;
    let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    RowNorm {
        log_z: max + sum.ln(),
        argmax,
    }
}

/// What one scored position contributes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Position {
    /// `-ln p(token)` under the model.
    pub nll: f64,
    /// With a reference: `-ln p_ref(token)`, `KL(p_ref || p)`, `p(token) - p_ref(token)`, and
    /// whether both put their largest logit on the same token.
    pub nll_ref: f64,
    pub kld: f64,
    pub p_diff: f64,
    pub same_top: bool,
}

/// The statistics of the model's row `row` (and the reference's `row_ref`) at a position whose
/// next token is `token`.
pub fn position(row: &[f32], row_ref: Option<&[f32]>, token: u32) -> Position {
    let t = token as usize;
    let n = row_norm(row);
    let nll = n.log_z - row[t] as f64;
    let Some(r) = row_ref else {
        return Position {
            nll,
            ..Default::default()
        };
    };
    let nr = row_norm(r);
    let nll_ref = nr.log_z - r[t] as f64;
    // KL(p_ref || p) = sum_i p_ref,i (ln p_ref,i - ln p_i).
    let kld: f64 = r
        .iter()
        .zip(row)
        .map(|(&a, &b)| {
            let lr = a as f64 - nr.log_z;
            let lp = b as f64 - n.log_z;
            lr.exp() * (lr - lp)
        })
        .sum();
    Position {
        nll,
        nll_ref,
        kld: kld.max(0.0),
        p_diff: (-nll).exp() - (-nll_ref).exp(),
        same_top: n.argmax == nr.argmax,
    }
}

/// A mean and its standard error, as llama.cpp computes them: the error is
/// `sqrt((mean(x^2) - mean(x)^2) / (n - 1))`; for the KL-divergence statistics
/// (`mean_and_uncertainty`) 0 for fewer than 11 values, for the perplexity's final estimate
/// only where the variance is positive ([`mean_and_error`]'s `min_count`).
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Estimate {
    pub value: f64,
    pub error: f64,
}

/// Values from which `mean_and_uncertainty` (llama-perplexity's KL-divergence statistics)
/// gives an error.
const KLD_MIN_COUNT: usize = 11;

/// [`Estimate`] of `n` values from their sum and sum of squares; the error only from
/// `min_count` values on (11 in `mean_and_uncertainty`, 2 in the perplexity's final estimate).
fn mean_and_error(sum: f64, sum2: f64, n: usize, min_count: usize) -> Estimate {
    if n == 0 {
        return Estimate {
            value: 0.0,
            error: 0.0,
        };
    }
    let f = sum / n as f64;
    let df = sum2 / n as f64 - f * f;
    let error = if df > 0.0 && n >= min_count.max(2) {
        (df / (n as f64 - 1.0)).sqrt()
    } else {
        0.0
    };
    Estimate { value: f, error }
}

/// llama.cpp's percentile: linear interpolation between the sorted values at
/// `fraction * (n - 1)`.
pub fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    if fraction <= 0.0 {
        return sorted[0];
    }
    if fraction >= 1.0 {
        return sorted[sorted.len() - 1];
    }
    let p = fraction * (sorted.len() - 1) as f64;
    let ip = p as usize;
    let f = p - ip as f64;
    (1.0 - f) * sorted[ip] + f * sorted[(ip + 1).min(sorted.len() - 1)]
}

fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n == 0 {
        f64::NAN
    } else if n.is_multiple_of(2) {
        0.5 * (sorted[n / 2] + sorted[n / 2 - 1])
    } else {
        sorted[n / 2]
    }
}

/// Perplexity of one model.
#[derive(Clone, Debug, Serialize)]
pub struct Perplexity {
    /// Positions scored.
    pub count: usize,
    /// `exp(mean nll)` and its error `ppl * se(nll)` (llama-perplexity's "Final estimate").
    pub ppl: Estimate,
    /// Mean negative log-likelihood (nats per token) and its standard error.
    pub nll: Estimate,
}

/// The figures `llama-perplexity --kl-divergence` prints.
#[derive(Clone, Debug, Serialize)]
pub struct Divergence {
    pub ppl_reference: Estimate,
    /// Correlation of the two models' per-position nll.
    pub ln_ppl_correlation: f64,
    /// `ln(PPL / PPL_ref)`, its error from both errors and their covariance.
    pub ln_ppl_ratio: Estimate,
    pub ppl_ratio: Estimate,
    pub ppl_diff: Estimate,
    /// Mean `KL(p_ref || p)` in nats, and its distribution over positions.
    pub kld: Estimate,
    pub kld_quantiles: Quantiles,
    /// Share of positions where both models' largest logit is the same token.
    pub same_top: Estimate,
    /// `p(token) - p_ref(token)`: mean, RMS, and its distribution.
    pub p_diff: Estimate,
    pub p_diff_rms: Estimate,
    pub p_diff_quantiles: Quantiles,
}

/// Order statistics (llama.cpp's percentile interpolation).
#[derive(Clone, Debug, Serialize)]
pub struct Quantiles {
    pub max: f64,
    pub p99_9: f64,
    pub p99: f64,
    pub p95: f64,
    pub p90: f64,
    pub p75: f64,
    pub median: f64,
    pub p25: f64,
    pub p10: f64,
    pub p5: f64,
    pub p1: f64,
    pub p0_1: f64,
    pub min: f64,
}

impl Quantiles {
    fn of(mut v: Vec<f64>) -> Quantiles {
        v.sort_by(f64::total_cmp);
        let q = |f| percentile(&v, f);
        Quantiles {
            max: q(1.0),
            p99_9: q(0.999),
            p99: q(0.99),
            p95: q(0.95),
            p90: q(0.90),
            p75: q(0.75),
            median: median(&v),
            p25: q(0.25),
            p10: q(0.10),
            p5: q(0.05),
            p1: q(0.01),
            p0_1: q(0.001),
            min: q(0.0),
        }
    }
}

/// Running sums over scored positions.
#[derive(Clone, Debug, Default)]
pub struct Accumulator {
    positions: Vec<Position>,
    with_reference: bool,
}

impl Accumulator {
    pub fn new(with_reference: bool) -> Self {
        Accumulator {
            positions: Vec::new(),
            with_reference,
        }
    }

    pub fn push(&mut self, p: Position) {
        self.positions.push(p);
    }

    pub fn count(&self) -> usize {
        self.positions.len()
    }

    /// Perplexity so far.
    pub fn perplexity(&self) -> Perplexity {
        let n = self.positions.len();
        let (s, s2) = sums(self.positions.iter().map(|p| p.nll));
        // perplexity.cpp's "Final estimate": the error wherever the variance is positive.
        let nll = mean_and_error(s, s2, n, 2);
        let ppl = nll.value.exp();
        Perplexity {
            count: n,
            ppl: Estimate {
                value: ppl,
                error: ppl * nll.error,
            },
            nll,
        }
    }

    /// The reference statistics; `None` without a reference or positions.
    pub fn divergence(&self) -> Option<Divergence> {
        let n = self.positions.len();
        if !self.with_reference || n == 0 {
            return None;
        }
        let ps = &self.positions;
        let (s, s2) = sums(ps.iter().map(|p| p.nll));
        let (sb, sb2) = sums(ps.iter().map(|p| p.nll_ref));
        let sab: f64 = ps.iter().map(|p| p.nll * p.nll_ref).sum();
        let lp = mean_and_error(s, s2, n, KLD_MIN_COUNT);
        let lpb = mean_and_error(sb, sb2, n, KLD_MIN_COUNT);
        // llama.cpp's covariance of the two means: 0 for fewer than 10 positions.
        let cov = if n < 10 {
            0.0
        } else {
            (sab / n as f64 - (s / n as f64) * (sb / n as f64)) / (n as f64 - 1.0)
        };
        let ppl = lp.value.exp();
        let ppl_b = lpb.value.exp();
        let (ppl_e, ppl_be) = (ppl * lp.error, ppl_b * lpb.error);
        let ratio_ln = lp.value - lpb.value;
        let ratio_ln_e = (lp.error * lp.error + lpb.error * lpb.error - 2.0 * cov)
            .max(0.0)
            .sqrt();
        let ratio = ratio_ln.exp();
        let diff_e = (ppl_e * ppl_e + ppl_be * ppl_be - 2.0 * ppl * ppl_b * cov)
            .max(0.0)
            .sqrt();
        let (sk, sk2) = sums(ps.iter().map(|p| p.kld));
        let (sd, sd2) = sums(ps.iter().map(|p| p.p_diff));
        let (_, sd4) = sums(ps.iter().map(|p| p.p_diff * p.p_diff));
        let mse = mean_and_error(sd2, sd4, n, KLD_MIN_COUNT);
        let rms = mse.value.sqrt();
        let same = ps.iter().filter(|p| p.same_top).count() as f64 / n as f64;
        Some(Divergence {
            ppl_reference: Estimate {
                value: ppl_b,
                error: ppl_be,
            },
            ln_ppl_correlation: if lp.error > 0.0 && lpb.error > 0.0 {
                cov / (lp.error * lpb.error)
            } else {
                0.0
            },
            ln_ppl_ratio: Estimate {
                value: ratio_ln,
                error: ratio_ln_e,
            },
            ppl_ratio: Estimate {
                value: ratio,
                error: ratio * ratio_ln_e,
            },
            ppl_diff: Estimate {
                value: ppl - ppl_b,
                error: diff_e,
            },
            kld: mean_and_error(sk, sk2, n, KLD_MIN_COUNT),
            kld_quantiles: Quantiles::of(ps.iter().map(|p| p.kld).collect()),
            same_top: Estimate {
                value: same,
                error: if n > 1 {
                    (same * (1.0 - same) / (n as f64 - 1.0)).sqrt()
                } else {
                    0.0
                },
            },
            p_diff: mean_and_error(sd, sd2, n, KLD_MIN_COUNT),
            p_diff_rms: Estimate {
                value: rms,
                error: if rms > 0.0 {
                    0.5 / rms * mse.error
                } else {
                    0.0
                },
            },
            p_diff_quantiles: Quantiles::of(ps.iter().map(|p| p.p_diff).collect()),
        })
    }
}

fn sums(v: impl Iterator<Item = f64>) -> (f64, f64) {
    v.fold((0.0, 0.0), |(a, b), x| (a + x, b + x * x))
}

/// A proportion with its 95% Wilson score interval.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Proportion {
    pub value: f64,
    pub low: f64,
    pub high: f64,
    pub n: usize,
}

/// `z` of a two-sided 95% interval.
pub const Z95: f64 = 1.959_963_984_540_054;

/// `k` successes of `n` with the Wilson score interval (Wilson 1927), which unlike the normal
/// approximation stays inside [0, 1] and behaves at small `n`.
pub fn wilson(k: usize, n: usize) -> Proportion {
    if n == 0 {
        return Proportion {
            value: f64::NAN,
            low: 0.0,
            high: 1.0,
            n,
        };
    }
    let (k, nf, z) = (k as f64, n as f64, Z95);
    let p = k / nf;
    let den = 1.0 + z * z / nf;
    let centre = (p + z * z / (2.0 * nf)) / den;
    let half = z * (p * (1.0 - p) / nf + z * z / (4.0 * nf * nf)).sqrt() / den;
    // At k = 0 and k = n the bound is exactly 0 or 1 (the two terms cancel; in floating point
    // they may not).
    Proportion {
        value: p,
        low: if k == 0.0 {
            0.0
        } else {
            (centre - half).clamp(0.0, p)
        },
        high: if k == nf {
            1.0
        } else {
            (centre + half).clamp(p, 1.0)
        },
        n,
    }
}

/// The paired comparison of two models on the same examples.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Paired {
    /// `accuracy - accuracy_ref` with its 95% interval (normal approximation of the paired
    /// difference: `se = sqrt(b + c - (b - c)^2 / n) / n`).
    pub diff: f64,
    pub diff_low: f64,
    pub diff_high: f64,
    /// Examples only the model gets right (`b`) and only the reference gets right (`c`).
    pub only_model: usize,
    pub only_reference: usize,
    /// McNemar's exact test: two-sided binomial p-value of `min(b, c)` in `b + c` at 1/2.
    pub mcnemar_p: f64,
}

/// The paired difference of `model` and `reference` correctness on the same examples.
pub fn paired(model: &[bool], reference: &[bool]) -> Paired {
    let n = model.len().min(reference.len());
    let b = (0..n).filter(|&i| model[i] && !reference[i]).count();
    let c = (0..n).filter(|&i| !model[i] && reference[i]).count();
    let (bf, cf, nf) = (b as f64, c as f64, n.max(1) as f64);
    let diff = (bf - cf) / nf;
    let se = (bf + cf - (bf - cf) * (bf - cf) / nf).max(0.0).sqrt() / nf;
    Paired {
        diff,
        diff_low: diff - Z95 * se,
        diff_high: diff + Z95 * se,
        only_model: b,
        only_reference: c,
        mcnemar_p: mcnemar_exact(b, c),
    }
}

/// Two-sided exact McNemar p-value: `min(1, 2 P[X <= min(b, c)])`, X ~ Binomial(b + c, 1/2).
pub fn mcnemar_exact(b: usize, c: usize) -> f64 {
    let n = b + c;
    if n == 0 {
        return 1.0;
    }
    let k = b.min(c);
    // ln C(n, i) - n ln 2, summed in the log domain's exponent.
    let ln2n = n as f64 * std::f64::consts::LN_2;
    let mut ln_c = 0.0f64; // ln C(n, 0)
    let mut p = 0.0;
    for i in 0..=k {
        if i > 0 {
            ln_c += ((n - i + 1) as f64).ln() - (i as f64).ln();
        }
        p += (ln_c - ln2n).exp();
    }
    (2.0 * p).min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wilson_matches_the_textbook_value() {
        // 81 of 263: Wilson 95% interval [0.2553, 0.3662] (e.g. Newcombe 1998, Table I style).
        let p = wilson(81, 263);
        assert!((p.low - 0.2553).abs() < 5e-4, "{p:?}");
        assert!((p.high - 0.3662).abs() < 5e-4, "{p:?}");
    }

    /// The perplexity's error as perplexity.cpp's final estimate gives it, from two values
    /// on (not only past 10, as the KL statistics' `mean_and_uncertainty`).
    #[test]
    fn perplexity_error_from_few_positions() {
        let nll = [11.07, 9.33, 11.53];
        let mut acc = Accumulator::new(false);
        for &v in &nll {
            acc.push(Position {
                nll: v,
                nll_ref: 0.0,
                kld: 0.0,
                p_diff: 0.0,
                same_top: true,
            });
        }
        let p = acc.perplexity();
        let n = nll.len() as f64;
        let mean = nll.iter().sum::<f64>() / n;
        let var = nll.iter().map(|v| v * v).sum::<f64>() / n - mean * mean;
        let want = mean.exp() * (var / (n - 1.0)).sqrt();
        assert!(
            p.ppl.error > 0.0 && (p.ppl.error - want).abs() <= 1e-9 * want,
            "{p:?}"
        );
        // The KL statistics keep llama.cpp's 11-value floor.
        assert_eq!(mean_and_error(3.0, 5.0, 3, KLD_MIN_COUNT).error, 0.0);
        // Two values, 1 and 3: mean 2, variance 1, error sqrt(1 / 1) from two on.
        assert_eq!(mean_and_error(4.0, 10.0, 2, 2).error, 1.0);
        assert_eq!(mean_and_error(4.0, 10.0, 2, KLD_MIN_COUNT).error, 0.0);
    }

    #[test]
    fn mcnemar_is_the_binomial_tail() {
        // b = 1, c = 9: 2 * (1 + 10) / 1024.
        assert!((mcnemar_exact(1, 9) - 22.0 / 1024.0).abs() < 1e-12);
        assert_eq!(mcnemar_exact(5, 5), 1.0);
        assert_eq!(mcnemar_exact(0, 0), 1.0);
    }

    #[test]
    fn kl_of_identical_rows_is_zero_and_positive_otherwise() {
        let a = [1.0f32, 2.0, 3.0, -1.0];
        let p = position(&a, Some(&a), 2);
        assert!(p.kld.abs() < 1e-15 && p.same_top && p.p_diff == 0.0);
        let b = [1.0f32, 2.5, 3.0, -1.0];
        let q = position(&b, Some(&a), 2);
        // By hand: ln Z and the sum over four terms.
        let lz = |r: &[f32]| r.iter().map(|&v| (v as f64).exp()).sum::<f64>().ln();
        let (za, zb) = (lz(&a), lz(&b));
        let want: f64 = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| {
                let (lx, ly) = (x as f64 - za, y as f64 - zb);
                lx.exp() * (lx - ly)
            })
            .sum();
        assert!((q.kld - want).abs() < 1e-14, "{} {want}", q.kld);
        assert!((q.nll - (zb - 3.0)).abs() < 1e-12);
    }

    #[test]
    fn percentiles_interpolate_as_llama_cpp() {
        let v = [0.0, 1.0, 2.0, 3.0];
        assert_eq!(percentile(&v, 0.5), 1.5);
        assert_eq!(percentile(&v, 0.9), 2.7);
        assert_eq!(median(&v), 1.5);
    }
}
