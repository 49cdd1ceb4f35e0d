//! Matrix-vector products and row gathers directly on the bundle's encodings, f32 activations.
//!
//! `W` is row-major `[rows, cols]` (`cols = K`), `x` is `[cols]`, `y = W x` is `[rows]`. Rows
//! are split across the rayon pool; each row's dot product is computed in a fixed order (8
//! partial sums combined pairwise), so results do not depend on the thread count.
//!
//! Kernels: ternary (`d * (code - 1)` from packed words, summed per block before the scale),
//! Q8_0, Q4_0, Q4_1 fused; every other GGML type by dequantizing one row at a time with the
//! bit-exact dequantizer into a small buffer and taking the dot product. Nothing dequantizes a
//! whole matrix.

use rayon::prelude::*;

use crate::ggml::GgmlType;
use crate::quant::{self, f16_bits_to_f32};

/// A weight matrix as stored in the bundle.
#[derive(Clone, Copy)]
pub enum WeightData<'a> {
    /// GGML blocks, `rows * bytes_per_row` bytes.
    Gguf { ty: GgmlType, bytes: &'a [u8] },
    /// Ternary: `rows * cols/16` words and `rows * cols/256` f16 scales.
    Ternary { words: &'a [u32], scales: &'a [u16] },
    /// Ternary codes repacked at load for the int8 kernel ([`repack_ternary`]): per 256-block
    /// 64 bytes, element `h*128 + s*32 + l` in bits `2s..2s+2` of byte `h*32 + l` (TQ2_0's
    /// order), so one shift and mask unpack 32 codes. Same scales.
    TernaryQs { qs: &'a [u8], scales: &'a [u16] },
    /// Palettized: per group of rows a table of `2^bits` f16 entries, `bits`-bit indices.
    Palette(crate::palette::PaletteView<'a>),
}

/// Repacks ternary words (16 codes per u32) into the [`WeightData::TernaryQs`] byte layout.
pub fn repack_ternary(words: &[u32]) -> Vec<u8> {
    let mut qs = vec![0u8; words.len() * 4];
    for (bw, bq) in words.chunks_exact(16).zip(qs.chunks_exact_mut(64)) {
        for e in 0..256 {
            let c = ((bw[e / 16] >> (2 * (e % 16))) & 3) as u8;
            let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
            bq[h * 32 + l] |= c << (2 * s);
        }
    }
    qs
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn ternary_qs_rows_i8_avx2(
    qs: &[u8],
    scales: &[u16],
    cols: usize,
    a: &Q8Act,
    ys: &mut [f32],
    r0: usize,
) {
    use std::arch::x86_64::*;
    let (bpr, spr) = (cols / 4, cols / 256);
    let ones = _mm256_set1_epi16(1);
    let m3 = _mm256_set1_epi8(3);
    for (i, yo) in ys.iter_mut().enumerate() {
        let r = r0 + i;
        let rq = &qs[r * bpr..(r + 1) * bpr];
        let mut total = 0f32;
        for b in 0..spr {
            let mut acc = _mm256_setzero_si256();
            for h in 0..2 {
                // SAFETY: 32 bytes of this block's 64 code bytes.
                let v = _mm256_loadu_si256(rq[b * 64 + h * 32..].as_ptr() as *const __m256i);
                for s in 0..4 {
                    let codes = match s {
                        0 => _mm256_and_si256(v, m3),
                        1 => _mm256_and_si256(_mm256_srli_epi16(v, 2), m3),
                        2 => _mm256_and_si256(_mm256_srli_epi16(v, 4), m3),
                        _ => _mm256_and_si256(_mm256_srli_epi16(v, 6), m3),
                    };
                    let xq = _mm256_loadu_si256(
                        a.q[b * 256 + h * 128 + s * 32..].as_ptr() as *const __m256i
                    );
                    let prod = _mm256_madd_epi16(_mm256_maddubs_epi16(codes, xq), ones);
                    acc = _mm256_add_epi32(acc, prod);
                }
            }
            let s128 = _mm_add_epi32(
                _mm256_castsi256_si128(acc),
                _mm256_extracti128_si256(acc, 1),
            );
            let s64 = _mm_add_epi32(s128, _mm_shuffle_epi32(s128, 0b01_00_11_10));
            let s32 = _mm_add_epi32(s64, _mm_shuffle_epi32(s64, 0b10_11_00_01));
            let isum = _mm_cvtsi128_si32(s32) - a.sum[b];
            total += f16_bits_to_f32(scales[r * spr + b]) * (a.d[b] * isum as f32);
        }
        *yo = total;
    }
}

/// Rows of a repacked ternary matrix with int8 activations; the portable path gives the same
/// bits as the AVX2 one (exact integer block sums, the same f32 steps).
pub fn ternary_qs_rows_i8(
    qs: &[u8],
    scales: &[u16],
    cols: usize,
    a: &Q8Act,
    ys: &mut [f32],
    r0: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present, checked on the line above.
            unsafe { ternary_qs_rows_i8_avx2(qs, scales, cols, a, ys, r0) };
            return;
        }
    }
    ternary_qs_rows_i8_portable(qs, scales, cols, a, ys, r0)
}

/// The portable path of [`ternary_qs_rows_i8`].
pub fn ternary_qs_rows_i8_portable(
    qs: &[u8],
    scales: &[u16],
    cols: usize,
    a: &Q8Act,
    ys: &mut [f32],
    r0: usize,
) {
    let (bpr, spr) = (cols / 4, cols / 256);
    for (i, yo) in ys.iter_mut().enumerate() {
        let r = r0 + i;
        let mut total = 0f32;
        for b in 0..spr {
            let bq = &qs[r * bpr + b * 64..r * bpr + b * 64 + 64];
            let mut isum = 0i32;
            for e in 0..256 {
                let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
                let c = ((bq[h * 32 + l] >> (2 * s)) & 3) as i32;
                isum += c * a.q[b * 256 + e] as i32;
            }
            total += f16_bits_to_f32(scales[r * spr + b]) * (a.d[b] * (isum - a.sum[b]) as f32);
        }
        *yo = total;
    }
}

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 16;

/// Dot product in a fixed order: 8 lanes, then pairwise.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let n8 = a.len() / 8 * 8;
    for (ca, cb) in a[..n8].chunks_exact(8).zip(b[..n8].chunks_exact(8)) {
        for j in 0..8 {
            acc[j] += ca[j] * cb[j];
        }
    }
    for (i, (x, y)) in a[n8..].iter().zip(&b[n8..]).enumerate() {
        acc[i] += x * y;
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// Sum in a fixed order (16 lanes, then pairwise).
#[inline(always)]
fn hsum16(acc: &[f32; 16]) -> f32 {
    let mut a8 = [0f32; 8];
    for j in 0..8 {
        a8[j] = acc[j] + acc[j + 8];
    }
    ((a8[0] + a8[4]) + (a8[2] + a8[6])) + ((a8[1] + a8[5]) + (a8[3] + a8[7]))
}

/// One ternary row: `sum_b d_b * sum_{k in b} x_k * (code_k - 1)`.
#[inline(always)]
fn ternary_row(words: &[u32], scales: &[u16], x: &[f32]) -> f32 {
    let mut total = 0f32;
    for ((wb, &s), xb) in words.chunks_exact(16).zip(scales).zip(x.chunks_exact(256)) {
        let mut acc = [0f32; 16];
        for (&w, xs) in wb.iter().zip(xb.chunks_exact(16)) {
            for j in 0..16 {
                let c = ((w >> (2 * j)) & 3) as i32 - 1;
                acc[j] += xs[j] * c as f32;
            }
        }
        total += f16_bits_to_f32(s) * hsum16(&acc);
    }
    total
}

/// Q8_0 row: per lane `acc += d * (q * x)`, one horizontal sum at the end.
#[inline(always)]
fn q8_0_row(bytes: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; 32];
    for (b, xb) in bytes.chunks_exact(34).zip(x.chunks_exact(32)) {
        let d = f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
        let q = &b[2..34];
        for j in 0..32 {
            acc[j] += d * ((q[j] as i8) as f32 * xb[j]);
        }
    }
    let mut a16 = [0f32; 16];
    for j in 0..16 {
        a16[j] = acc[j] + acc[j + 16];
    }
    hsum16(&a16)
}

/// Q4_0 / Q4_1 row: per lane `acc += d * (q * x)` (+ `m * x` for Q4_1, or `d * -8 * x` for
/// Q4_0), one horizontal sum at the end.
#[inline(always)]
fn q4_row(bytes: &[u8], x: &[f32], with_min: bool) -> f32 {
    let ts = if with_min { 20 } else { 18 };
    let qoff = if with_min { 4 } else { 2 };
    let mut acc = [0f32; 16];
    for (b, xb) in bytes.chunks_exact(ts).zip(x.chunks_exact(32)) {
        let d = f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
        let m = if with_min {
            f16_bits_to_f32(u16::from_le_bytes([b[2], b[3]]))
        } else {
            -8.0 * d
        };
        let qs = &b[qoff..qoff + 16];
        for j in 0..16 {
            let lo = (qs[j] & 0x0F) as f32;
            let hi = (qs[j] >> 4) as f32;
            acc[j] += d * (lo * xb[j] + hi * xb[j + 16]) + m * (xb[j] + xb[j + 16]);
        }
    }
    hsum16(&acc)
}

crate::multiversion! {
    /// Rows `r0..r0 + ys.len()` of a ternary matrix.
    fn ternary_rows(words: &[u32], scales: &[u16], cols: usize, x: &[f32], ys: &mut [f32], r0: usize) {
        let (wpr, spr) = (cols / 16, cols / 256);
        for (i, yo) in ys.iter_mut().enumerate() {
            let r = r0 + i;
            *yo = ternary_row(&words[r * wpr..(r + 1) * wpr], &scales[r * spr..(r + 1) * spr], x);
        }
    }
}

crate::multiversion! {
    /// Rows `r0..r0 + ys.len()` of a GGML-encoded matrix (`rb` bytes per row).
    fn gguf_rows(ty: GgmlType, bytes: &[u8], rb: usize, x: &[f32], ys: &mut [f32], r0: usize, buf: &mut [f32]) {
        for (i, yo) in ys.iter_mut().enumerate() {
            let r = r0 + i;
            let row = &bytes[r * rb..(r + 1) * rb];
            *yo = match ty {
                GgmlType::Q8_0 => q8_0_row(row, x),
                GgmlType::Q4_0 => q4_row(row, x, false),
                GgmlType::Q4_1 => q4_row(row, x, true),
                _ => {
                    // Whole blocks of a dequantizable type, checked at load.
                    quant::dequantize_body_checked(ty, row, buf);
                    dot(buf, x)
                }
            };
        }
    }
}

crate::multiversion! {
    /// Rows `r0..r0 + ys.len()` of a palettized matrix: each row rebuilt from its group's
    /// table into `buf`, then the fixed-order [`dot`].
    fn palette_rows(v: &crate::palette::PaletteView, x: &[f32], ys: &mut [f32], r0: usize, buf: &mut [f32], idx: &mut [u8]) {
        // Widen each group's table once, not once per row.
        let mut group = usize::MAX;
        let mut table = [0f32; 256];
        for (i, yo) in ys.iter_mut().enumerate() {
            let r = r0 + i;
            if r / v.group_size != group {
                group = r / v.group_size;
                table = v.table_f32(r);
            }
            v.row_with_table(&table, r, buf, idx);
            *yo = dot(buf, x);
        }
    }
}

/// How ternary matrix-vector products treat the activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Kernel {
    /// f32 activations: the reference.
    #[default]
    F32,
    /// Activations quantized to int8 per 256-block (`d = max|x| / 127`, as llama.cpp's Q8_K)
    /// and integer dot products with the 2-bit codes; faster, with llama.cpp-like error.
    Int8,
}

/// Activations quantized per 256-element block: `x ~= d[b] * q[k]`.
pub struct Q8Act {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    /// Sum of `q` over each block.
    pub sum: Vec<i32>,
}

/// Quantizes `x` (length a multiple of 256) to [`Q8Act`]: `d = max|x| / 127`,
/// `q = round(x / d)` (half away from zero), `d = 0` for an all-zero block.
pub fn quantize_act(x: &[f32]) -> Q8Act {
    let nb = x.len() / 256;
    let mut a = Q8Act {
        q: vec![0; nb * 256],
        d: vec![0.0; nb],
        sum: vec![0; nb],
    };
    for (b, xb) in x.chunks_exact(256).enumerate() {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        if amax == 0.0 {
            continue;
        }
        let d = amax / 127.0;
        let id = 1.0 / d;
        let mut s = 0i32;
        for (q, v) in a.q[b * 256..(b + 1) * 256].iter_mut().zip(xb) {
            *q = (v * id).round().clamp(-127.0, 127.0) as i8;
            s += *q as i32;
        }
        a.d[b] = d;
        a.sum[b] = s;
    }
    a
}

/// `sum_k code_k * q_k` over one 256-block (16 words), exact in integers.
#[inline(always)]
fn block_dot_i8_scalar(words: &[u32], q: &[i8]) -> i32 {
    let mut s = 0i32;
    for (&w, qs) in words.iter().zip(q.chunks_exact(16)) {
        for (j, &qj) in qs.iter().enumerate() {
            s += ((w >> (2 * j)) & 3) as i32 * qj as i32;
        }
    }
    s
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi2")]
unsafe fn ternary_rows_i8_avx2(
    words: &[u32],
    scales: &[u16],
    cols: usize,
    a: &Q8Act,
    ys: &mut [f32],
    r0: usize,
) {
    use std::arch::x86_64::*;
    const M: u64 = 0x0303_0303_0303_0303;
    let (wpr, spr) = (cols / 16, cols / 256);
    let ones = _mm256_set1_epi16(1);
    for (i, yo) in ys.iter_mut().enumerate() {
        let r = r0 + i;
        let rw = &words[r * wpr..(r + 1) * wpr];
        let rs = &scales[r * spr..(r + 1) * spr];
        let mut total = 0f32;
        for b in 0..spr {
            let bw = &rw[b * 16..b * 16 + 16];
            let qp = a.q[b * 256..].as_ptr();
            let mut acc = _mm256_setzero_si256();
            for p in 0..8 {
                let w0 = bw[2 * p] as u64;
                let w1 = bw[2 * p + 1] as u64;
                let codes = _mm256_set_epi64x(
                    _pdep_u64(w1 >> 16, M) as i64,
                    _pdep_u64(w1 & 0xffff, M) as i64,
                    _pdep_u64(w0 >> 16, M) as i64,
                    _pdep_u64(w0 & 0xffff, M) as i64,
                );
                // SAFETY: 32 bytes of the block's 256 quantized activations.
                let xq = _mm256_loadu_si256(qp.add(32 * p) as *const __m256i);
                let prod = _mm256_madd_epi16(_mm256_maddubs_epi16(codes, xq), ones);
                acc = _mm256_add_epi32(acc, prod);
            }
            let s128 = _mm_add_epi32(
                _mm256_castsi256_si128(acc),
                _mm256_extracti128_si256(acc, 1),
            );
            let s64 = _mm_add_epi32(s128, _mm_shuffle_epi32(s128, 0b01_00_11_10));
            let s32 = _mm_add_epi32(s64, _mm_shuffle_epi32(s64, 0b10_11_00_01));
            let isum = _mm_cvtsi128_si32(s32) - a.sum[b];
            total += f16_bits_to_f32(rs[b]) * (a.d[b] * isum as f32);
        }
        *yo = total;
    }
}

/// Rows `r0..` with int8 activations; the AVX2+BMI2 path and the portable one give the same
/// bits (the block sums are exact integers; the f32 steps are the same).
fn ternary_rows_i8(
    words: &[u32],
    scales: &[u16],
    cols: usize,
    a: &Q8Act,
    ys: &mut [f32],
    r0: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("bmi2") {
            // SAFETY: AVX2 and BMI2 are present, checked on the line above.
            unsafe { ternary_rows_i8_avx2(words, scales, cols, a, ys, r0) };
            return;
        }
    }
    ternary_rows_i8_portable(words, scales, cols, a, ys, r0)
}

/// The portable int8 path (any CPU).
pub fn ternary_rows_i8_portable(
    words: &[u32],
    scales: &[u16],
    cols: usize,
    a: &Q8Act,
    ys: &mut [f32],
    r0: usize,
) {
    let (wpr, spr) = (cols / 16, cols / 256);
    for (i, yo) in ys.iter_mut().enumerate() {
        let r = r0 + i;
        let mut total = 0f32;
        for b in 0..spr {
            let bw = &words[r * wpr + b * 16..r * wpr + b * 16 + 16];
            let isum = block_dot_i8_scalar(bw, &a.q[b * 256..(b + 1) * 256]) - a.sum[b];
            total += f16_bits_to_f32(scales[r * spr + b]) * (a.d[b] * isum as f32);
        }
        *yo = total;
    }
}

/// `y = W x` with `W` `[y.len(), cols]`; `x.len() == cols`.
pub fn matvec(w: WeightData, cols: usize, x: &[f32], y: &mut [f32]) {
    matvec_with(Kernel::F32, w, cols, x, y)
}

/// [`matvec`] with a choice of ternary kernel.
pub fn matvec_with(kernel: Kernel, w: WeightData, cols: usize, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), cols);
    match w {
        WeightData::TernaryQs { qs, scales } => {
            // Repacked weights are made for, and always run with, int8 activations.
            let a = quantize_act(x);
            y.par_chunks_mut(ROWS_PER_TASK)
                .enumerate()
                .for_each(|(t, ys)| {
                    ternary_qs_rows_i8(qs, scales, cols, &a, ys, t * ROWS_PER_TASK)
                });
        }
        WeightData::Ternary { words, scales } if kernel == Kernel::Int8 => {
            let a = quantize_act(x);
            y.par_chunks_mut(ROWS_PER_TASK)
                .enumerate()
                .for_each(|(t, ys)| {
                    ternary_rows_i8(words, scales, cols, &a, ys, t * ROWS_PER_TASK)
                });
        }
        WeightData::Ternary { words, scales } => {
            y.par_chunks_mut(ROWS_PER_TASK)
                .enumerate()
                .for_each(|(t, ys)| ternary_rows(words, scales, cols, x, ys, t * ROWS_PER_TASK));
        }
        WeightData::Palette(v) => {
            y.par_chunks_mut(ROWS_PER_TASK).enumerate().for_each_init(
                || (vec![0f32; cols], vec![0u8; cols]),
                |(buf, idx), (t, ys)| palette_rows(&v, x, ys, t * ROWS_PER_TASK, buf, idx),
            );
        }
        WeightData::Gguf { ty, bytes } => {
            let rb = ty.bytes_for(cols as u64).unwrap_or(0) as usize;
            y.par_chunks_mut(ROWS_PER_TASK).enumerate().for_each_init(
                || vec![0f32; cols],
                |buf, (t, ys)| gguf_rows(ty, bytes, rb, x, ys, t * ROWS_PER_TASK, buf),
            );
        }
    }
}

/// Row `r` of `W` as f32 (embedding gather): ternary `d * (code - 1)`, GGML types dequantized
/// bit-exactly.
pub fn row(w: WeightData, cols: usize, r: usize, out: &mut [f32]) {
    match w {
        WeightData::TernaryQs { qs, scales } => {
            let (bpr, spr) = (cols / 4, cols / 256);
            for b in 0..spr {
                let d = f16_bits_to_f32(scales[r * spr + b]);
                let bq = &qs[r * bpr + b * 64..r * bpr + b * 64 + 64];
                for e in 0..256 {
                    let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
                    let c = ((bq[h * 32 + l] >> (2 * s)) & 3) as i32;
                    out[b * 256 + e] = d * (c - 1) as f32;
                }
            }
        }
        WeightData::Ternary { words, scales } => crate::ternary::row_values(
            &words[r * cols / 16..(r + 1) * cols / 16],
            &scales[r * cols / 256..(r + 1) * cols / 256],
            out,
        ),
        WeightData::Gguf { ty, bytes } => {
            let rb = ty.bytes_for(cols as u64).unwrap_or(0) as usize;
            let _ = quant::dequantize(ty, &bytes[r * rb..(r + 1) * rb], out);
        }
        WeightData::Palette(v) => v.row(r, out, &mut vec![0u8; cols]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(ty: GgmlType, bytes: &[u8], cols: usize, x: &[f32]) -> Vec<f64> {
        let rows = bytes.len() / ty.bytes_for(cols as u64).unwrap() as usize;
        let mut w = vec![0f32; rows * cols];
        quant::dequantize(ty, bytes, &mut w).unwrap();
        w.chunks_exact(cols)
            .map(|r| r.iter().zip(x).map(|(a, b)| *a as f64 * *b as f64).sum())
            .collect()
    }

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    #[test]
    fn fused_kernels_match_dequantize_then_dot() {
        let cols = 512;
        let rows = 40;
        let mut seed = 7u64;
        let x: Vec<f32> = (0..cols)
            .map(|_| (lcg(&mut seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q6_K,
            GgmlType::TQ2_0,
        ] {
            let n = ty.bytes_for((rows * cols) as u64).unwrap() as usize;
            let mut bytes: Vec<u8> = (0..n).map(|_| lcg(&mut seed) as u8).collect();
            // Finite, modest scales: overwrite every block's f16 fields with 0.01.
            let ts = ty.type_size();
            for b in bytes.chunks_exact_mut(ts) {
                let d = half::f16::from_f32(0.01).to_le_bytes();
                match ty {
                    GgmlType::Q6_K => b[208..210].copy_from_slice(&d),
                    GgmlType::TQ2_0 => b[64..66].copy_from_slice(&d),
                    GgmlType::Q4_1 => {
                        b[0..2].copy_from_slice(&d);
                        b[2..4].copy_from_slice(&d);
                    }
                    _ => b[0..2].copy_from_slice(&d),
                }
            }
            let want = reference(ty, &bytes, cols, &x);
            let mut y = vec![0f32; rows];
            matvec(WeightData::Gguf { ty, bytes: &bytes }, cols, &x, &mut y);
            for (r, (a, b)) in y.iter().zip(&want).enumerate() {
                assert!(
                    (*a as f64 - b).abs() <= 1e-4 * (1.0 + b.abs()),
                    "{ty} row {r}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn int8_kernel_is_exact_on_its_own_quantized_activations() {
        let cols = 768;
        let rows = 20;
        let mut seed = 11u64;
        let x: Vec<f32> = (0..cols)
            .map(|_| (lcg(&mut seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        let words: Vec<u32> = (0..rows * cols / 16)
            .map(|_| (0..16).fold(0u32, |w, j| w | ((lcg(&mut seed) % 3) << (2 * j))))
            .collect();
        let scales: Vec<u16> = (0..rows * cols / 256)
            .map(|i| half::f16::from_f32(0.02 * (1 + i % 5) as f32).to_bits())
            .collect();
        let a = quantize_act(&x);
        let mut y = vec![0f32; rows];
        matvec_with(
            Kernel::Int8,
            WeightData::Ternary {
                words: &words,
                scales: &scales,
            },
            cols,
            &x,
            &mut y,
        );
        // Reference: the same quantized activations, in f64.
        let mut rowv = vec![0f32; cols];
        for (r, yr) in y.iter().enumerate() {
            row(
                WeightData::Ternary {
                    words: &words,
                    scales: &scales,
                },
                cols,
                r,
                &mut rowv,
            );
            let want: f64 = rowv
                .iter()
                .enumerate()
                .map(|(k, w)| *w as f64 * a.d[k / 256] as f64 * a.q[k] as f64)
                .sum();
            assert!((*yr as f64 - want).abs() < 1e-4, "row {r}: {yr} vs {want}");
        }
        // The repacked layout gives the same bits, on both its paths.
        let qs = repack_ternary(&words);
        let mut yq = vec![0f32; rows];
        matvec_with(
            Kernel::Int8,
            WeightData::TernaryQs {
                qs: &qs,
                scales: &scales,
            },
            cols,
            &x,
            &mut yq,
        );
        assert!(y.iter().zip(&yq).all(|(p, q)| p.to_bits() == q.to_bits()));
        ternary_qs_rows_i8_portable(&qs, &scales, cols, &a, &mut yq, 0);
        assert!(y.iter().zip(&yq).all(|(p, q)| p.to_bits() == q.to_bits()));
        let mut r0 = vec![0f32; cols];
        let mut r1 = vec![0f32; cols];
        row(
            WeightData::Ternary {
                words: &words,
                scales: &scales,
            },
            cols,
            3,
            &mut r0,
        );
        row(
            WeightData::TernaryQs {
                qs: &qs,
                scales: &scales,
            },
            cols,
            3,
            &mut r1,
        );
        assert_eq!(r0, r1);
        // The portable path gives the same bits as the dispatched (AVX2+BMI2) one.
        let mut yp = vec![0f32; rows];
        ternary_rows_i8_portable(&words, &scales, cols, &a, &mut yp, 0);
        assert!(y.iter().zip(&yp).all(|(p, q)| p.to_bits() == q.to_bits()));
        // And close to the f32 kernel.
        let mut yf = vec![0f32; rows];
        matvec(
            WeightData::Ternary {
                words: &words,
                scales: &scales,
            },
            cols,
            &x,
            &mut yf,
        );
        for (a, b) in y.iter().zip(&yf) {
            assert!((a - b).abs() < 0.05, "{a} vs {b}");
        }
    }

    #[test]
    fn ternary_kernel_matches_row_values() {
        let cols = 512;
        let rows = 33;
        let mut seed = 3u64;
        let x: Vec<f32> = (0..cols)
            .map(|_| (lcg(&mut seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        let words: Vec<u32> = (0..rows * cols / 16)
            .map(|_| {
                let mut w = 0u32;
                for j in 0..16 {
                    w |= (lcg(&mut seed) % 3) << (2 * j);
                }
                w
            })
            .collect();
        let scales: Vec<u16> = (0..rows * cols / 256)
            .map(|i| half::f16::from_f32(0.01 * (1 + i % 7) as f32).to_bits())
            .collect();
        let mut y = vec![0f32; rows];
        matvec(
            WeightData::Ternary {
                words: &words,
                scales: &scales,
            },
            cols,
            &x,
            &mut y,
        );
        let mut rowv = vec![0f32; cols];
        for (r, yr) in y.iter().enumerate() {
            row(
                WeightData::Ternary {
                    words: &words,
                    scales: &scales,
                },
                cols,
                r,
                &mut rowv,
            );
            let want: f64 = rowv
                .iter()
                .zip(&x)
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum();
            assert!((*yr as f64 - want).abs() < 1e-4, "row {r}: {yr} vs {want}");
        }
    }
}
