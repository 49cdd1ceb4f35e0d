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

use super::q8;
use crate::ggml::GgmlType;
use crate::quant::{self, f16_bits_to_f32};

/// A weight matrix as stored in the bundle.
#[derive(Clone, Copy)]
pub enum WeightData<'a> {
    /// GGML blocks, `rows * bytes_per_row` bytes.
    Gguf { ty: GgmlType, bytes: &'a [u8] },
    /// Ternary: `rows * cols/16` words and `rows * cols/256` f16 scales.
    Ternary { words: &'a [u32], scales: &'a [u16] },
    /// Palettized: per group of rows a table of `2^bits` f16 entries, `bits`-bit indices.
    Palette(crate::palette::PaletteView<'a>),
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

/// Rows `r0..r0 + ys.len()` of a ternary matrix with f32 activations: AVX-512 when the CPU
/// has it ([`ternary_rows_avx512`]), else the portable body compiled for the baseline and AVX2;
/// all give the same bits.
fn ternary_rows(words: &[u32], scales: &[u16], cols: usize, x: &[f32], ys: &mut [f32], r0: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let avx512 = *AVX512.get_or_init(|| {
            // `LOWBIT_ISA=portable|avx2` (crate::isa) caps it like every other kernel.
            std::is_x86_feature_detected!("avx512f")
                && crate::isa::detect() == crate::isa::Isa::Avx512Vnni
        });
        if avx512 {
            // SAFETY: AVX-512F is present, checked on the line above.
            return unsafe { ternary_rows_avx512(words, scales, cols, x, ys, r0) };
        }
    }
    ternary_rows_portable(words, scales, cols, x, ys, r0)
}

/// [`ternary_row`] with the 16 lanes of `acc` in one AVX-512 vector: per word the 16 codes are
/// shifted into lanes, mapped to -1, 0, 1, 2 by a permute from a table of floats, multiplied
/// with 16 activations and added, the same operations in the same order as the portable loop;
/// then [`hsum16`]'s pairwise sum and the block's scale.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn ternary_rows_avx512(
    words: &[u32],
    scales: &[u16],
    cols: usize,
    x: &[f32],
    ys: &mut [f32],
    r0: usize,
) {
    use std::arch::x86_64::*;
    let (wpr, spr) = (cols / 16, cols / 256);
    let shifts = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let m3 = _mm512_set1_epi32(3);
    // code - 1 as f32 for codes 0..3 (entries past 3 unused)
    let table = _mm512_setr_ps(
        -1.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
    );
    for (i, yo) in ys.iter_mut().enumerate() {
        let r = r0 + i;
        let rw = &words[r * wpr..(r + 1) * wpr];
        let rs = &scales[r * spr..(r + 1) * spr];
        let mut total = 0f32;
        for (b, &sb) in rs.iter().enumerate() {
            let mut acc = _mm512_setzero_ps();
            for wi in 0..16 {
                let w = *rw.get_unchecked(b * 16 + wi);
                let codes =
                    _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(w as i32), shifts), m3);
                let c = _mm512_permutexvar_ps(codes, table);
                let xs = _mm512_loadu_ps(x.as_ptr().add(b * 256 + wi * 16));
                acc = _mm512_add_ps(acc, _mm512_mul_ps(xs, c));
            }
            // hsum16: a8[j] = acc[j] + acc[j + 8], then ((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7))
            let a8 = _mm256_add_ps(
                _mm512_castps512_ps256(acc),
                _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)),
            );
            let s4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            let h = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
            total += f16_bits_to_f32(sb) * h;
        }
        *yo = total;
    }
}

crate::multiversion! {
    /// The portable body of [`ternary_rows`].
    fn ternary_rows_portable(words: &[u32], scales: &[u16], cols: usize, x: &[f32], ys: &mut [f32], r0: usize) {
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

#[cfg(target_arch = "x86_64")]
fn palette_gather_ok() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("f16c")
            && crate::isa::detect() != crate::isa::Isa::Portable
    })
}

/// [`palette_rows`] for 8- and 4-bit indices without the row buffer: eight indices at a time
/// are widened to i32 lanes, their entries gathered from the group's f32 table and multiplied
/// with `x` into the eight lanes of [`dot`] (separate multiply and add, the same order), so the
/// result has the same bits as rebuilding the row and taking [`dot`].
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn palette_rows_gather(
    v: &crate::palette::PaletteView,
    x: &[f32],
    ys: &mut [f32],
    r0: usize,
) {
    use std::arch::x86_64::*;
    let cols = v.cols;
    let n8 = cols / 8 * 8;
    let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    let m4 = _mm256_set1_epi32(0xF);
    let mut group = usize::MAX;
    let mut table = [0f32; 256];
    for (i, yo) in ys.iter_mut().enumerate() {
        let r = r0 + i;
        if r / v.group_size != group {
            group = r / v.group_size;
            table = v.table_f32(r);
        }
        let row = &v.indices[r * v.row_bytes..(r + 1) * v.row_bytes];
        let mut acc = _mm256_setzero_ps();
        let mut c = 0;
        while c < n8 {
            let ix = if v.bits == 8 {
                _mm256_cvtepu8_epi32(_mm_loadl_epi64(row.as_ptr().add(c) as *const __m128i))
            } else {
                let w = u32::from_le_bytes([
                    row[c / 2],
                    row[c / 2 + 1],
                    row[c / 2 + 2],
                    row[c / 2 + 3],
                ]);
                _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w as i32), shifts), m4)
            };
            let w = _mm256_i32gather_ps::<4>(table.as_ptr(), ix);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(w, _mm256_loadu_ps(x.as_ptr().add(c))));
            c += 8;
        }
        let mut l = [0f32; 8];
        _mm256_storeu_ps(l.as_mut_ptr(), acc);
        for (j, k) in (n8..cols).enumerate() {
            let ix = if v.bits == 8 {
                row[k] as usize
            } else {
                ((row[k / 2] >> ((k % 2) * 4)) & 0xF) as usize
            };
            l[j] += table[ix] * x[k];
        }
        *yo = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    }
}

/// How ternary matrix-vector products treat the activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Kernel {
    /// f32 activations: the exact reference.
    F32,
    /// Activations quantized to int8 (per 256 for ternary and k-quants, per 32 for the
    /// 32-element types) and exact integer dot products with the weights' codes
    /// (`super::q8`: ternary, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K); faster, with
    /// llama.cpp-like error (llama.cpp's CPU backend does the same). Other encodings keep the
    /// f32 kernels. The default.
    #[default]
    Int8,
}

/// `y = W x` with `W` `[y.len(), cols]`; `x.len() == cols`.
pub fn matvec(w: WeightData, cols: usize, x: &[f32], y: &mut [f32]) {
    matvec_with(Kernel::F32, w, cols, x, y)
}

/// One input vector prepared for a weight's kernel: quantized once for the int8 kernels.
enum Prepared {
    F32,
    /// int8 activations for a GGML type ([`q8::act_block`]).
    Q(q8::QAct),
    /// int8 activations and their permutation for the ternary words.
    Ternary(q8::QAct, Vec<i8>),
}

/// Which kernel `kernel` selects for `w`, with `x` prepared for it.
fn prepare(kernel: Kernel, w: &WeightData, cols: usize, x: &[f32]) -> Prepared {
    match w {
        WeightData::Ternary { .. } if kernel == Kernel::Int8 => {
            let a = q8::quantize(x, 256);
            let p = q8::permute_for_ternary(&a);
            Prepared::Ternary(a, p)
        }
        WeightData::Gguf { ty, .. }
            if kernel == Kernel::Int8
                && q8::act_block(*ty).is_some_and(|b| cols.is_multiple_of(b)) =>
        {
            Prepared::Q(q8::quantize(x, q8::act_block(*ty).unwrap_or(32)))
        }
        _ => Prepared::F32,
    }
}

/// Per-task scratch of the f32 kernels that rebuild a row (`cols` values and indices),
/// allocated on first use: the int8 and fused kernels need none, and a task is started for
/// every few rows.
#[derive(Default)]
struct Scratch {
    buf: Vec<f32>,
    idx: Vec<u8>,
    /// Unpacked weights of the multi-token kernels.
    words: Vec<u32>,
}

impl Scratch {
    fn sized(&mut self, cols: usize) -> &mut Self {
        if self.buf.len() < cols {
            self.buf.resize(cols, 0.0);
            self.idx.resize(cols, 0);
        }
        self
    }
}

/// Rows `r0 .. r0 + ys.len()` of `W x`, by the kernel `a` was prepared for. Every product of
/// one row with one input vector goes through here, so a row's result does not depend on
/// how rows and vectors are grouped into tasks (decode, prefill, any thread count).
#[allow(clippy::too_many_arguments)]
fn rows(
    w: &WeightData,
    cols: usize,
    x: &[f32],
    a: &Prepared,
    isa: q8::Isa,
    ys: &mut [f32],
    r0: usize,
    s: &mut Scratch,
) {
    match (w, a) {
        (WeightData::Ternary { words, scales }, Prepared::Ternary(q, p)) => {
            q8::ternary_rows(isa, words, scales, cols, q, p, ys, r0)
        }
        (WeightData::Gguf { ty, bytes }, Prepared::Q(q)) => {
            let rb = ty.bytes_for(cols as u64).unwrap_or(0) as usize;
            q8::gguf_rows(isa, *ty, bytes, rb, q, ys, r0)
        }
        (WeightData::Ternary { words, scales }, _) => ternary_rows(words, scales, cols, x, ys, r0),
        (WeightData::Palette(v), _) => {
            #[cfg(target_arch = "x86_64")]
            if (v.bits == 8 || v.bits == 4) && palette_gather_ok() {
                // SAFETY: AVX2 and F16C are present (palette_gather_ok).
                unsafe { palette_rows_gather(v, x, ys, r0) };
                return;
            }
            let s = s.sized(cols);
            palette_rows(v, x, ys, r0, &mut s.buf[..cols], &mut s.idx[..cols])
        }
        (WeightData::Gguf { ty, bytes }, _) => {
            let rb = ty.bytes_for(cols as u64).unwrap_or(0) as usize;
            gguf_rows(*ty, bytes, rb, x, ys, r0, &mut s.sized(cols).buf[..cols])
        }
    }
}

/// [`matvec`] with a choice of kernel.
pub fn matvec_with(kernel: Kernel, w: WeightData, cols: usize, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), cols);
    let a = prepare(kernel, &w, cols, x);
    let isa = q8::detect();
    y.par_chunks_mut(ROWS_PER_TASK)
        .enumerate()
        .for_each_init(Scratch::default, |s, (t, ys)| {
            rows(&w, cols, x, &a, isa, ys, t * ROWS_PER_TASK, s)
        });
}

/// One tile of [`matmul_with`]: `(r0, k, tile, scratch)` fills `tile[j * n + i]` with row
/// `r0 + j` against vector `i`.
type TileFn<'a> = dyn Fn(usize, usize, &mut [f32], &mut Scratch) + Sync + 'a;

/// `ys`, shared by the tasks of [`matmul_with`], each of which writes only its own rows.
struct SharedOut(*mut f32);
// SAFETY: tasks write disjoint elements (their own rows of every token), see `scatter`.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// Writes a tile (`tile[j * n + i]`, rows `r0 .. r0 + k` of every token `i`) into `ys`
    /// (`[n, nrows]`).
    ///
    /// # Safety
    /// `ys` has `n * nrows` elements, `r0 + k <= nrows`, and no other task writes these rows.
    unsafe fn scatter(&self, tile: &[f32], n: usize, nrows: usize, r0: usize, k: usize) {
        for i in 0..n {
            let dst = self.0.add(i * nrows + r0);
            for j in 0..k {
                *dst.add(j) = tile[j * n + i];
            }
        }
    }
}

/// `Y = W X` for `n` input vectors at once (prefill): `xs` is `[n, cols]`, `ys` is
/// `[n, rows]`, both row-major. Each task takes a tile of [`ROWS_PER_TASK`] rows and runs it
/// against every vector before the next tile, so each weight byte is read from memory once
/// per call, not once per vector; it writes its rows of every vector into `ys` itself. Each
/// vector is prepared (quantized) once, exactly as [`matvec_with`] prepares it, and every
/// (row, vector) product has the bits of the single-vector kernel: `ys[i]` has the same bits
/// as `matvec_with(kernel, w, cols, xs[i], ys[i])`.
pub fn matmul_with(kernel: Kernel, w: WeightData, cols: usize, xs: &[f32], ys: &mut [f32]) {
    let n = xs.len() / cols.max(1);
    if n <= 1 {
        return matvec_with(kernel, w, cols, xs, ys);
    }
    let nrows = ys.len() / n;
    assert_eq!(ys.len(), n * nrows, "ys is [n, rows]");
    let isa = q8::detect();
    let tasks = nrows.div_ceil(ROWS_PER_TASK);
    let out = SharedOut(ys.as_mut_ptr());
    // Runs `f(r0, k, tile, scratch)` for every tile of rows, then scatters the tile.
    let run = |f: &TileFn| {
        (0..tasks).into_par_iter().for_each_init(
            || (Vec::new(), Scratch::default()),
            |(tile, s): &mut (Vec<f32>, Scratch), t| {
                let r0 = t * ROWS_PER_TASK;
                let k = ROWS_PER_TASK.min(nrows - r0);
                tile.resize(k * n, 0.0);
                f(r0, k, &mut tile[..k * n], s);
                // SAFETY: ys is [n, nrows] (asserted), r0 + k <= nrows, tiles are disjoint.
                unsafe { out.scatter(tile, n, nrows, r0, k) };
            },
        )
    };
    match w {
        WeightData::Ternary { words, scales }
            if kernel == Kernel::Int8 && q8::ternary_tokens_available(isa) =>
        {
            // 16 tokens per vector lane group: each weight's codes unpacked once per group.
            // The activations are quantized as [`prepare`] quantizes them, without the
            // permutation only the per-token kernel reads.
            let acts: Vec<q8::QAct> = xs
                .par_chunks_exact(cols)
                .map(|x| q8::quantize(x, 256))
                .collect();
            let groups = q8::token_groups(&acts.iter().collect::<Vec<_>>());
            run(&|r0, k, tile, s| {
                q8::ternary_rows_tokens(words, scales, cols, &groups, tile, r0, k, &mut s.words)
            });
        }
        WeightData::Gguf { ty, bytes }
            if kernel == Kernel::Int8
                && q8::gguf_tokens_available(isa, ty)
                && q8::act_block(ty).is_some_and(|b| cols.is_multiple_of(b)) =>
        {
            // The GGML types of the int8 kernels, 16 tokens per vector lane group as above:
            // each row's weights unpacked once per call. Quantized as [`prepare`] does.
            let rb = ty.bytes_for(cols as u64).unwrap_or(0) as usize;
            let block = q8::act_block(ty).unwrap_or(32);
            let acts: Vec<q8::QAct> = xs
                .par_chunks_exact(cols)
                .map(|x| q8::quantize(x, block))
                .collect();
            let groups = q8::token_groups(&acts.iter().collect::<Vec<_>>());
            run(&|r0, k, tile, s| {
                q8::gguf_rows_tokens(ty, bytes, rb, &groups, tile, r0, k, &mut s.words)
            });
        }
        _ => {
            let prepared: Vec<Prepared> = xs
                .par_chunks_exact(cols)
                .map(|x| prepare(kernel, &w, cols, x))
                .collect();
            run(&|r0, k, tile, s| {
                let mut col = [0f32; ROWS_PER_TASK];
                for (i, (x, a)) in xs.chunks_exact(cols).zip(&prepared).enumerate() {
                    rows(&w, cols, x, a, isa, &mut col[..k], r0, s);
                    for (j, v) in col[..k].iter().enumerate() {
                        tile[j * n + i] = *v;
                    }
                }
            });
        }
    }
}

/// Row `r` of `W` as f32 (embedding gather): ternary `d * (code - 1)`, GGML types dequantized
/// bit-exactly.
pub fn row(w: WeightData, cols: usize, r: usize, out: &mut [f32]) {
    match w {
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
    fn palette_gather_path_gives_the_rebuilt_rows_bits() {
        let mut seed = 9u64;
        for bits in [4u32, 8] {
            let (rows, cols, g) = (12usize, 77usize, 4usize);
            let rb = crate::palette::row_bytes(cols as u64, bits) as usize;
            let mut indices = vec![0u8; rows * rb];
            for r in 0..rows {
                let idx: Vec<u8> = (0..cols)
                    .map(|_| (lcg(&mut seed) % (1 << bits)) as u8)
                    .collect();
                crate::palette::pack_row(&idx, bits, &mut indices[r * rb..(r + 1) * rb]);
            }
            let tables: Vec<u8> = (0..(rows / g) << bits)
                .flat_map(|_| {
                    half::f16::from_f32((lcg(&mut seed) % 2001) as f32 / 1000.0 - 1.0).to_le_bytes()
                })
                .collect();
            let v = crate::palette::PaletteView {
                bits,
                group_size: g,
                cols,
                row_bytes: rb,
                tables: &tables,
                indices: &indices,
            };
            let x: Vec<f32> = (0..cols)
                .map(|_| (lcg(&mut seed) % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            let mut want = vec![0f32; rows];
            palette_rows(
                &v,
                &x,
                &mut want,
                0,
                &mut vec![0f32; cols],
                &mut vec![0u8; cols],
            );
            let mut y = vec![0f32; rows];
            matvec(WeightData::Palette(v), cols, &x, &mut y);
            assert_eq!(
                y.iter().map(|a| a.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|a| a.to_bits()).collect::<Vec<_>>(),
                "bits {bits}"
            );
        }
    }

    #[test]
    fn matmul_gives_each_vectors_matvec_bits_on_every_encoding() {
        // Ternary (the multi-token int8 kernel where the CPU has AVX-512), GGML types, both
        // kernels; token counts around the 16-token groups; rows not a multiple of 16; a
        // row length whose 32-element blocks are no multiple of 8 (SmolLM2's 576), one whose
        // 256-element blocks are more than 8 and no multiple of 8 (2304).
        for cols in [512, 576, 2304] {
            matmul_bits_case(cols);
        }
    }

    fn matmul_bits_case(cols: usize) {
        let rows = 37;
        let mut seed = 23u64;
        let words: Vec<u32> = (0..rows * cols / 16).map(|_| lcg(&mut seed)).collect();
        let scales: Vec<u16> = (0..rows * cols / 256)
            .map(|i| half::f16::from_f32([0.02, -0.03, 0.0, 1.5][i % 4]).to_bits())
            .collect();
        let mut q = vec![];
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::F16,
        ] {
            if !cols.is_multiple_of(ty.block_size()) {
                continue;
            }
            let nb = ty.bytes_for((rows * cols) as u64).unwrap() as usize;
            let mut bytes: Vec<u8> = (0..nb).map(|_| lcg(&mut seed) as u8).collect();
            if ty == GgmlType::F16 {
                for h in bytes.chunks_exact_mut(2) {
                    h.copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                }
            } else {
                let ts = ty.type_size();
                let d = half::f16::from_f32(0.01).to_le_bytes();
                for b in bytes.chunks_exact_mut(ts) {
                    if matches!(
                        ty,
                        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q4_1 | GgmlType::Q5_1
                    ) {
                        // scale and min (random f16 bytes could be NaN, whose payload
                        // the compiler need not keep)
                        b[0..2].copy_from_slice(&d);
                        b[2..4].copy_from_slice(&d);
                    } else if ty == GgmlType::Q6_K {
                        b[208..210].copy_from_slice(&d);
                    } else {
                        b[0..2].copy_from_slice(&d);
                    }
                }
            }
            q.push((ty, bytes));
        }
        let mut ws = vec![];
        if cols.is_multiple_of(256) {
            ws.push(WeightData::Ternary {
                words: &words,
                scales: &scales,
            });
        }
        ws.extend(
            q.iter()
                .map(|(ty, b)| WeightData::Gguf { ty: *ty, bytes: b }),
        );
        for n in [2usize, 5, 16, 17, 33] {
            let xs: Vec<f32> = (0..n * cols)
                .map(|i| {
                    if i % 300 < 8 {
                        0.0
                    } else {
                        (lcg(&mut seed) % 2001) as f32 / 1000.0 - 1.0
                    }
                })
                .collect();
            for w in &ws {
                for kernel in [Kernel::F32, Kernel::Int8] {
                    let mut y = vec![0f32; n * rows];
                    matmul_with(kernel, *w, cols, &xs, &mut y);
                    for (i, x) in xs.chunks_exact(cols).enumerate() {
                        let mut want = vec![0f32; rows];
                        matvec_with(kernel, *w, cols, x, &mut want);
                        let got = &y[i * rows..(i + 1) * rows];
                        assert!(
                            got.iter()
                                .zip(&want)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{kernel:?} {} cols {cols} n {n} token {i}: {:?} vs {:?}",
                            match w {
                                WeightData::Gguf { ty, .. } => ty.name(),
                                _ => "other",
                            },
                            &got[..4],
                            &want[..4]
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn ternary_f32_paths_give_the_same_bits() {
        let (cols, rows) = (768, 21);
        let mut seed = 17u64;
        let x: Vec<f32> = (0..cols)
            .map(|i| {
                let v = (lcg(&mut seed) % 2001) as f32 / 1000.0 - 1.0;
                if i % 97 == 0 {
                    -0.0
                } else {
                    v
                }
            })
            .collect();
        // every code 0..3, negative and zero scales
        let words: Vec<u32> = (0..rows * cols / 16).map(|_| lcg(&mut seed)).collect();
        let scales: Vec<u16> = (0..rows * cols / 256)
            .map(|i| half::f16::from_f32([0.02, -0.03, 0.0, 1.5][i % 4]).to_bits())
            .collect();
        let mut want = vec![0f32; rows];
        ternary_rows_portable(&words, &scales, cols, &x, &mut want, 0);
        let mut y = vec![0f32; rows];
        ternary_rows(&words, &scales, cols, &x, &mut y, 0);
        assert_eq!(
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
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
