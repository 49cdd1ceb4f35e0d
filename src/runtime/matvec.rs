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
use super::team;
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

/// The checks a single-token palette kernel's unchecked reads rely on (run once per tile of
/// rows; a bundle's reader checks `row_bytes`): `width_ok` (the kernel takes `v.bits`), `x`
/// holding `v.cols` values, a row's bytes holding its indices. Panics naming `kernel`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn assert_palette_args(kernel: &str, v: &crate::palette::PaletteView, x: &[f32], width_ok: bool) {
    assert!(
        width_ok && x.len() >= v.cols && v.row_bytes * 8 >= v.cols * v.bits as usize,
        "{kernel}: {} bits, {} columns, {} bytes a row, x of {}",
        v.bits,
        v.cols,
        v.row_bytes,
        x.len()
    );
}

/// A palette row's result from its [`dot`] lanes `l` over the first `n8` columns: the tail
/// columns `n8 .. x.len()` (at most 7, `table` entries of `row`'s `bits`-bit indices) added
/// to lanes 0.. as [`dot`] adds them, then [`hsum8`].
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
fn palette_row_end(
    mut l: [f32; 8],
    table: &[f32; 256],
    row: &[u8],
    bits: u32,
    x: &[f32],
    n8: usize,
) -> f32 {
    for (j, k) in (n8..x.len()).enumerate() {
        l[j] += table[crate::palette::index_at(row, bits, k) as usize] * x[k];
    }
    hsum8(&l)
}

/// The eight 6-bit indices at byte `o` of `indices` (six bytes, LSB first) as two 24-bit
/// words in one u64: bytes 0-2 (indices 0-3) in the low 32 bits, bytes 3-5 (indices 4-7) in
/// the high 32, so that lane `j` of a vector holding word `j / 4` gives index `j` by a shift
/// of `6 (j % 4)` and a mask. Reads the 8 bytes at `o` where they lie inside `indices` (the
/// two past the six, the row's next indices or at its end the next row's, go unused), else
/// the six.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn six_bit_words(indices: &[u8], o: usize) -> u64 {
    let u = six_bytes_at(indices, o);
    (u & 0xFFFF_FFFF) | ((u >> 24) << 32)
}

/// The six bytes at `o` of `indices` (eight 6-bit indices) as the low 48 bits of a
/// little-endian u64, by one 8-byte read where the 8 bytes lie inside `indices` (the top two
/// are then the next bytes, whatever they hold), else by the six.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
fn six_bytes_at(indices: &[u8], o: usize) -> u64 {
    match indices.get(o..o + 8) {
        Some(b) => u64::from_le_bytes(b.try_into().expect("8 bytes")),
        None => {
            let mut b = [0u8; 8];
            b[..6].copy_from_slice(&indices[o..o + 6]);
            u64::from_le_bytes(b)
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

/// [`palette_rows`] for 8-, 6- and 4-bit indices without the row buffer: eight indices at a
/// time are widened to i32 lanes (6 bits: the eight come from 6 bytes, LSB first, indices 0-3
/// from the first three as one 24-bit word and 4-7 from the next three, [`six_bit_words`]),
/// their entries taken from the group's f32 table (8 and 6 bits: gathered; 4 bits: the 16
/// entries held in two registers, two `vpermps` and a blend on index bit 3) and multiplied
/// with `x` into the eight lanes of [`dot`] (separate multiply and add, the same order), so
/// the result has the same bits as rebuilding the row and taking [`dot`].
///
/// # Safety
/// The CPU must have AVX2. Panics unless `v.bits` is 4, 6 or 8, `x` holds `v.cols` values and
/// a row's bytes hold its indices.
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
    // 4 bits: one unchecked 4-byte read a step.
    assert_palette_args("palette_rows_gather", v, x, matches!(v.bits, 4 | 6 | 8));
    let n8 = cols / 8 * 8;
    let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    let m4 = _mm256_set1_epi32(0xF);
    let shifts6 = _mm256_setr_epi32(0, 6, 12, 18, 0, 6, 12, 18);
    let (m6, spread) = (
        _mm256_set1_epi32(0x3F),
        _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
    );
    let mut group = usize::MAX;
    let mut table = [0f32; 256];
    // 4 bits: the table's 16 entries in two registers.
    let (mut t0, mut t1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for (i, yo) in ys.iter_mut().enumerate() {
        let r = r0 + i;
        if r / v.group_size != group {
            group = r / v.group_size;
            table = v.table_f32(r);
            t0 = _mm256_loadu_ps(table.as_ptr());
            t1 = _mm256_loadu_ps(table.as_ptr().add(8));
        }
        let row = &v.indices[r * v.row_bytes..(r + 1) * v.row_bytes];
        let mut acc = _mm256_setzero_ps();
        let mut c = 0;
        while c < n8 {
            let w = if v.bits == 8 {
                let ix =
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(row.as_ptr().add(c) as *const __m128i));
                _mm256_i32gather_ps::<4>(table.as_ptr(), ix)
            } else if v.bits == 6 {
                let u = six_bit_words(v.indices, r * v.row_bytes + c / 4 * 3);
                let w = _mm256_permutevar8x32_epi32(
                    _mm256_castsi128_si256(_mm_cvtsi64_si128(u as i64)),
                    spread,
                );
                let ix = _mm256_and_si256(_mm256_srlv_epi32(w, shifts6), m6);
                _mm256_i32gather_ps::<4>(table.as_ptr(), ix)
            } else {
                let w = (row.as_ptr().add(c / 2) as *const u32).read_unaligned();
                let ix =
                    _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w as i32), shifts), m4);
                // Entry ix & 7 of both halves, the second where bit 3 (moved to the sign) is set.
                _mm256_blendv_ps(
                    _mm256_permutevar8x32_ps(t0, ix),
                    _mm256_permutevar8x32_ps(t1, ix),
                    _mm256_castsi256_ps(_mm256_slli_epi32::<28>(ix)),
                )
            };
            acc = _mm256_add_ps(acc, _mm256_mul_ps(w, _mm256_loadu_ps(x.as_ptr().add(c))));
            c += 8;
        }
        let mut l = [0f32; 8];
        _mm256_storeu_ps(l.as_mut_ptr(), acc);
        *yo = palette_row_end(l, &table, row, v.bits, &x[..cols], n8);
    }
}

/// [`palette_rows`] for 4-, 6- and 8-bit indices on AVX-512, no row buffer, no gather: rows in
/// pairs, the pair's 8 columns in one 512-bit vector (lanes 0-7 the pair's first row, lanes
/// 8-15 its second, as [`palette_tile_avx512`] lays them out), each group's table (its f16 entries widened
/// exactly) in registers, both rows' entries looked up together: at 4 bits by one `vpermt2ps`
/// over the two rows' 16-entry tables (the second row's indices plus 16), at 6 bits by two
/// `vpermt2ps` and a blend on index bit 5, at 8 bits by eight and a tree of blends on bits 5,
/// 6 and 7 (the 256 entries in 16 registers) (6 and 8 bits: twice, and a blend of the halves,
/// where the two rows' groups differ); `x`'s 8 columns in both halves. Each lane is [`dot`]'s lane of its row
/// (a multiply, then an add, in column order); the tail columns and the final sum as
/// [`dot`]'s. So the bits of rebuilding the row and taking [`dot`]. An odd last row is paired
/// with itself.
///
/// # Safety
/// The CPU must have AVX-512F and AVX2. Panics unless `v.bits == BITS` (4, 6 or 8), `x` holds
/// `v.cols` values and a row's bytes hold its indices (the rows `r0 .. r0 + ys.len()` are
/// sliced with bounds checks).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn palette_rows_perm<const BITS: u32>(
    v: &crate::palette::PaletteView,
    x: &[f32],
    ys: &mut [f32],
    r0: usize,
) {
    use std::arch::x86_64::*;
    let width_ok = v.bits == BITS && matches!(BITS, 4 | 6 | 8);
    assert_palette_args("palette_rows_perm", v, x, width_ok);
    /// A group's table: its number, widened entries and their registers of 16 (4, or 16 at
    /// 8 bits).
    #[derive(Clone, Copy)]
    struct Lut {
        g: usize,
        t: [f32; 256],
        z: [__m512; 16],
    }
    let lut = |r: usize| -> Lut {
        let t = v.table_f32(r);
        Lut {
            g: r / v.group_size,
            t,
            z: std::array::from_fn(|q| {
                if q < 1 << (BITS - 4) {
                    _mm512_loadu_ps(t.as_ptr().add(16 * q))
                } else {
                    _mm512_setzero_ps()
                }
            }),
        }
    };
    let (cols, rb) = (v.cols, v.row_bytes);
    let n8 = cols / 8 * 8;
    let m0f = _mm_set1_epi8(0x0F);
    let second = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 16, 16, 16, 16, 16, 16, 16, 16);
    let shifts6 = _mm512_setr_epi32(0, 6, 12, 18, 0, 6, 12, 18, 0, 6, 12, 18, 0, 6, 12, 18);
    let (m6, bit5) = (_mm512_set1_epi32(0x3F), _mm512_set1_epi32(32));
    let spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    // Entries 0-63 of one table: bit 4 picks the register of a pair, bit 5 the pair.
    let look6 = |z: &[__m512; 16], i: __m512i| {
        _mm512_mask_blend_ps(
            _mm512_test_epi32_mask(i, bit5),
            _mm512_permutex2var_ps(z[0], i, z[1]),
            _mm512_permutex2var_ps(z[2], i, z[3]),
        )
    };
    // Entries 0-255 (8 bits): 32 at a time from register pairs, then a blend tree on index
    // bits 5, 6 and 7.
    let (bit6, bit7) = (_mm512_set1_epi32(64), _mm512_set1_epi32(128));
    let look8 = |z: &[__m512; 16], i: __m512i| {
        let (m5, m6, m7) = (
            _mm512_test_epi32_mask(i, bit5),
            _mm512_test_epi32_mask(i, bit6),
            _mm512_test_epi32_mask(i, bit7),
        );
        let q = |k: usize| {
            _mm512_mask_blend_ps(
                m5,
                _mm512_permutex2var_ps(z[4 * k], i, z[4 * k + 1]),
                _mm512_permutex2var_ps(z[4 * k + 2], i, z[4 * k + 3]),
            )
        };
        _mm512_mask_blend_ps(
            m7,
            _mm512_mask_blend_ps(m6, q(0), q(1)),
            _mm512_mask_blend_ps(m6, q(2), q(3)),
        )
    };
    let mut la = lut(r0);
    let mut lb = la;
    let k = ys.len();
    let mut j = 0;
    while j < k {
        let (ra, rb2) = (r0 + j, r0 + (j + 1).min(k - 1));
        if ra / v.group_size != la.g {
            la = lut(ra);
        }
        if rb2 / v.group_size != lb.g {
            lb = if rb2 / v.group_size == la.g {
                la
            } else {
                lut(rb2)
            };
        }
        let (ia, ib) = (
            &v.indices[ra * rb..(ra + 1) * rb],
            &v.indices[rb2 * rb..(rb2 + 1) * rb],
        );
        let mut acc = _mm512_setzero_ps();
        let mut c = 0;
        while c < n8 {
            let wv = if BITS == 4 {
                // 8 indices of each row: 4 bytes, low nibble first.
                let wa = (ia.as_ptr().add(c / 2) as *const u32).read_unaligned() as u64;
                let wb = (ib.as_ptr().add(c / 2) as *const u32).read_unaligned() as u64;
                let w = _mm_cvtsi64_si128((wa | (wb << 32)) as i64);
                let lo = _mm_and_si128(w, m0f);
                let hi = _mm_and_si128(_mm_srli_epi16::<4>(w), m0f);
                let ix = _mm512_or_si512(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)), second);
                _mm512_permutex2var_ps(la.z[0], ix, lb.z[0])
            } else if BITS == 8 {
                // 8 indices of each row: 8 bytes.
                let wa = (ia.as_ptr().add(c) as *const u64).read_unaligned();
                let wb = (ib.as_ptr().add(c) as *const u64).read_unaligned();
                let ix = _mm512_cvtepu8_epi32(_mm_set_epi64x(wb as i64, wa as i64));
                if la.g == lb.g {
                    look8(&la.z, ix)
                } else {
                    _mm512_mask_blend_ps(0xFF00, look8(&la.z, ix), look8(&lb.z, ix))
                }
            } else {
                // 8 indices of each row: 6 bytes, indices 0-3 from the first three as one
                // 24-bit word (LSB first), 4-7 from the next three; the four words spread
                // over their lanes by one permute.
                let o = c / 8 * 6;
                let (wa, wb) = (
                    six_bit_words(v.indices, ra * rb + o),
                    six_bit_words(v.indices, rb2 * rb + o),
                );
                let w = _mm512_permutexvar_epi32(
                    spread,
                    _mm512_castsi128_si512(_mm_set_epi64x(wb as i64, wa as i64)),
                );
                let ix = _mm512_and_si512(_mm512_srlv_epi32(w, shifts6), m6);
                if la.g == lb.g {
                    look6(&la.z, ix)
                } else {
                    _mm512_mask_blend_ps(0xFF00, look6(&la.z, ix), look6(&lb.z, ix))
                }
            };
            let xv = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(
                x.as_ptr().add(c),
            ))));
            acc = _mm512_add_ps(acc, _mm512_mul_ps(wv, xv));
            c += 8;
        }
        let mut l = [0f32; 16];
        _mm512_storeu_ps(l.as_mut_ptr(), acc);
        let (a, b): ([f32; 8], [f32; 8]) = (
            l[..8].try_into().expect("8 lanes"),
            l[8..].try_into().expect("8 lanes"),
        );
        let x = &x[..cols];
        ys[j] = palette_row_end(a, &la.t, ia, BITS, x, n8);
        if j + 1 < k {
            ys[j + 1] = palette_row_end(b, &lb.t, ib, BITS, x, n8);
        }
        j += 2;
    }
}

/// [`palette_rows`] for 4- and 6-bit indices on aarch64 (NEON), no row buffer: the group's
/// table (its f16 entries widened exactly) as the bytes of 4 (4 bits) or 16 (6 bits) table
/// registers, an 8-column step's entries looked up as bytes by `tbl` (6 bits: one `tbl` over
/// entries 0-15 and three `tbx` over the next 16 each), 4 entries a lookup: byte `4e + k` of
/// the table is byte `k` of entry `e`. The 8 indices of a step: 4 bytes split into nibbles
/// (4 bits), or 6 bytes whose byte pairs are put into 16-bit lanes by a `tbl` and shifted into
/// place (6 bits). Lanes 0-3 and 4-7 of [`dot`] are two vectors, a multiply then an add in
/// column order; the tail and the final sum as [`dot`]'s. So the bits of rebuilding the row
/// and taking [`dot`].
///
/// # Safety
/// NEON (every aarch64 target has it). Panics unless `v.bits == BITS` (4 or 6), `x` holds
/// `v.cols` values and a row's bytes hold its indices.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
unsafe fn palette_rows_neon<const BITS: u32>(
    v: &crate::palette::PaletteView,
    x: &[f32],
    ys: &mut [f32],
    r0: usize,
) {
    use std::arch::aarch64::*;
    assert_palette_args(
        "palette_rows_neon",
        v,
        x,
        v.bits == BITS && matches!(BITS, 4 | 6),
    );
    let (cols, rb) = (v.cols, v.row_bytes);
    let n8 = cols / 8 * 8;
    // Byte k of each of four entries: the entry's index times 4 in all four bytes, plus k.
    let dup_lo: [u8; 16] = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3];
    let dup_hi: [u8; 16] = [4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7];
    let (dup_lo, dup_hi) = (vld1q_u8(dup_lo.as_ptr()), vld1q_u8(dup_hi.as_ptr()));
    let k4 = vld1q_u8([0u8, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3].as_ptr());
    // 6 bits: index j is bits 6j .. 6j + 5 of the six bytes; the byte pair holding them
    // into 16-bit lane j, then shifted right by 6j mod 8.
    let pairs = vld1q_u8([0u8, 1, 0, 1, 1, 2, 2, 3, 3, 4, 3, 4, 4, 5, 5, 6].as_ptr());
    let shr = vld1q_s16([0i16, -6, -4, -2, 0, -6, -4, -2].as_ptr());
    let (m4, m6) = (vdup_n_u8(0x0F), vdupq_n_u16(0x3F));
    let (b64, b128, b192) = (vdupq_n_u8(64), vdupq_n_u8(128), vdupq_n_u8(192));
    let mut group = usize::MAX;
    let mut table = [0f32; 256];
    let z = vdupq_n_u8(0);
    let mut tq = [uint8x16x4_t(z, z, z, z); 4];
    for (i, yo) in ys.iter_mut().enumerate() {
        let r = r0 + i;
        if r / v.group_size != group {
            group = r / v.group_size;
            table = v.table_f32(r);
            let tp = table.as_ptr() as *const u8;
            for (q, t) in tq.iter_mut().enumerate().take(1usize << (BITS - 4)) {
                *t = vld1q_u8_x4(tp.add(64 * q));
            }
        }
        let row = &v.indices[r * rb..(r + 1) * rb];
        let (mut acc0, mut acc1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        let mut c = 0;
        while c < n8 {
            let e = if BITS == 4 {
                // 4 bytes, low nibble first: nibbles interleaved back into column order.
                let b4 = &row[c / 2..c / 2 + 4];
                let w = vcreate_u8(u32::from_le_bytes([b4[0], b4[1], b4[2], b4[3]]) as u64);
                vzip1_u8(vand_u8(w, m4), vshr_n_u8::<4>(w))
            } else {
                let u = six_bytes_at(v.indices, r * rb + c / 8 * 6);
                let b = vcombine_u8(vcreate_u8(u), vcreate_u8(0));
                let h = vshlq_u16(vreinterpretq_u16_u8(vqtbl1q_u8(b, pairs)), shr);
                vmovn_u16(vandq_u16(h, m6))
            };
            let e4 = vshl_n_u8::<2>(e);
            let e4 = vcombine_u8(e4, e4);
            let ilo = vaddq_u8(vqtbl1q_u8(e4, dup_lo), k4);
            let ihi = vaddq_u8(vqtbl1q_u8(e4, dup_hi), k4);
            let look = |ix: uint8x16_t| {
                let mut t = vqtbl4q_u8(tq[0], ix);
                if BITS == 6 {
                    // Entries 16-31, 32-47, 48-63: bytes 64-255, each range's bytes
                    // brought to 0-63 (the others wrap past 63 and leave t as it is).
                    t = vqtbx4q_u8(t, tq[1], vsubq_u8(ix, b64));
                    t = vqtbx4q_u8(t, tq[2], vsubq_u8(ix, b128));
                    t = vqtbx4q_u8(t, tq[3], vsubq_u8(ix, b192));
                }
                vreinterpretq_f32_u8(t)
            };
            let (wlo, whi) = (look(ilo), look(ihi));
            let xp = x.as_ptr().add(c);
            acc0 = vaddq_f32(acc0, vmulq_f32(wlo, vld1q_f32(xp)));
            acc1 = vaddq_f32(acc1, vmulq_f32(whi, vld1q_f32(xp.add(4))));
            c += 8;
        }
        let mut l = [0f32; 8];
        vst1q_f32(l.as_mut_ptr(), acc0);
        vst1q_f32(l.as_mut_ptr().add(4), acc1);
        *yo = palette_row_end(l, &table, row, BITS, &x[..cols], n8);
    }
}

/// Rows (row pairs on AVX-512) per register block of the multi-token palette kernels.
const PAL_ROWS: usize = 4;
/// Tokens per register block of the portable and AVX2 multi-token palette kernels.
const PAL_TOKENS: usize = 2;
/// Tokens per register block of the AVX-512 multi-token palette kernel.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const PAL_TOKENS_512: usize = 4;

/// Whether [`palette_rows_tokens`] takes the AVX-512 kernel ([`palette_tokens_avx512`]) for
/// `isa`: AVX-512F and AVX2 present and `isa` the AVX-512 level (`LOWBIT_ISA` caps it).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn palette_tokens_avx512_ok(isa: q8::Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        isa == q8::Isa::Avx512Vnni
            && *OK.get_or_init(|| {
                std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx2")
            })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// Rows `r0 .. r0 + k` of a palettized matrix against `n` tokens (prefill): `xs` is
/// `[n, cols]`, `tile[j * n + i]` receives row `r0 + j` against token `i`. Each row is rebuilt
/// from its group's LUT once per call (not once per token), then every (row, token) pair is
/// summed in [`dot`]'s order — 8 lanes over the columns in steps of 8, the `cols % 8` tail
/// into lanes `0..`, the same pairwise tree, separate multiply and add — so each value has
/// the bits of [`palette_rows`], [`palette_rows_perm`] and [`palette_rows_gather`] (the
/// single-token kernels `rows` picks), on every path: [`palette_tokens_avx512`] where `isa` allows it
/// ([`palette_tokens_avx512_ok`]), else [`palette_tokens_avx2`] where it allows AVX2, else
/// [`palette_tokens_portable`] (compiled for the baseline and AVX2). `s.rows` holds the
/// rebuilt rows, `s.idx` one row's indices.
#[allow(clippy::too_many_arguments)]
fn palette_rows_tokens(
    isa: q8::Isa,
    v: &crate::palette::PaletteView,
    xs: &[f32],
    n: usize,
    tile: &mut [f32],
    r0: usize,
    k: usize,
    s: &mut Scratch,
) {
    let cols = v.cols;
    if s.idx.len() < cols {
        s.idx.resize(cols, 0);
    }
    #[cfg(target_arch = "x86_64")]
    if palette_tokens_avx512_ok(isa) {
        // Row pairs interleaved per 8 columns (`[k.div_ceil(2)][cols / 8][16]`; the partner
        // lanes of an odd last row keep what they held and are never read back), then each
        // row's `cols % 8` tail values (`[k][8]`).
        let (pairs, nch) = (k.div_ceil(2), cols / 8);
        let body = pairs * nch * 16;
        s.rows.resize(body + pairs * 2 * 8, 0.0);
        let (wp, wt) = s.rows.split_at_mut(body);
        // SAFETY: AVX-512F and AVX2 are present (palette_tokens_avx512_ok); the lengths are
        // those `palette_tile_avx512` asks for.
        unsafe { palette_tile_avx512(v, r0, k, wp, wt, &mut s.idx[..cols]) };
        // SAFETY: AVX-512F and AVX2 are present (palette_tokens_avx512_ok); `wp` holds
        // `pairs * cols/8 * 16` values, `wt` `pairs * 2 * 8`, `xs` `n * cols`, `tile` `k * n`.
        unsafe { palette_tokens_avx512(wp, wt, k, xs, cols, n, tile) };
        return;
    }
    s.rows.resize(k * cols, 0.0);
    let mut group = usize::MAX;
    let mut table = [0f32; 256];
    for (j, out) in s.rows[..k * cols].chunks_exact_mut(cols).enumerate() {
        let r = r0 + j;
        if r / v.group_size != group {
            group = r / v.group_size;
            table = v.table_f32(r);
        }
        v.row_with_table(&table, r, out, &mut s.idx[..cols]);
    }
    #[cfg(target_arch = "x86_64")]
    if palette_tokens_avx2_ok(isa) {
        // SAFETY: AVX2 is present (palette_tokens_avx2_ok); `s.rows` holds `k * cols` values,
        // `xs` `n * cols`, `tile` `k * n`.
        unsafe { palette_tokens_avx2(&s.rows[..k * cols], k, xs, cols, n, tile) };
        return;
    }
    let _ = isa;
    palette_tokens_portable(&s.rows[..k * cols], k, xs, cols, n, tile);
}

/// Whether [`palette_rows_tokens`] takes the AVX2 kernel ([`palette_tokens_avx2`]) for `isa`:
/// AVX2 present and `isa` not capped to the portable code.
#[cfg(target_arch = "x86_64")]
fn palette_tokens_avx2_ok(isa: q8::Isa) -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    isa != q8::Isa::Portable && *OK.get_or_init(|| std::is_x86_feature_detected!("avx2"))
}

/// [`palette_tokens_portable`] with AVX2: one 256-bit accumulator holds [`dot`]'s 8 lanes of
/// one row against one token; blocks of [`PAL_ROWS`] rows by [`PAL_TOKENS`] tokens (8
/// accumulators, 6 loads per 16 multiplies and adds). Separate multiply and add, then the tail and [`hsum8`]
/// per (row, token) in scalar code, as [`dot`] does.
///
/// # Safety
/// The CPU must have AVX2; `w` holds `k * cols` values, `xs` `n * cols`, `tile` `k * n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn palette_tokens_avx2(
    w: &[f32],
    k: usize,
    xs: &[f32],
    cols: usize,
    n: usize,
    tile: &mut [f32],
) {
    debug_assert!(w.len() >= k * cols && xs.len() >= n * cols && tile.len() >= k * n);
    let mut j0 = 0;
    while j0 < k {
        let rn = PAL_ROWS.min(k - j0);
        let mut t0 = 0;
        while t0 < n {
            let tn = PAL_TOKENS.min(n - t0);
            let a = (w, xs, cols, n, j0, t0);
            match (rn, tn) {
                (4, 2) => pal_block256::<4, 2>(a, tile),
                (4, _) => pal_block256::<4, 1>(a, tile),
                (3, 2) => pal_block256::<3, 2>(a, tile),
                (3, _) => pal_block256::<3, 1>(a, tile),
                (2, 2) => pal_block256::<2, 2>(a, tile),
                (2, _) => pal_block256::<2, 1>(a, tile),
                (_, 2) => pal_block256::<1, 2>(a, tile),
                _ => pal_block256::<1, 1>(a, tile),
            }
            t0 += tn;
        }
        j0 += rn;
    }
}

/// `R` rows from `j0` by `T` tokens from `t0` of [`palette_tokens_avx2`]; `a` is
/// `(w, xs, cols, n, j0, t0)`.
///
/// # Safety
/// As [`palette_tokens_avx2`]; `j0 + R <= k`, `t0 + T <= n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
#[allow(clippy::type_complexity)]
unsafe fn pal_block256<const R: usize, const T: usize>(
    a: (&[f32], &[f32], usize, usize, usize, usize),
    tile: &mut [f32],
) {
    use std::arch::x86_64::*;
    let (w, xs, cols, n, j0, t0) = a;
    let n8 = cols / 8 * 8;
    let wbase = w.as_ptr().add(j0 * cols);
    let xbase = xs.as_ptr().add(t0 * cols);
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let mut c = 0;
    while c < n8 {
        let mut xv = [_mm256_setzero_ps(); T];
        for (t, x) in xv.iter_mut().enumerate() {
            *x = _mm256_loadu_ps(xbase.add(t * cols + c));
        }
        for (r, ar) in acc.iter_mut().enumerate() {
            let wv = _mm256_loadu_ps(wbase.add(r * cols + c));
            for (at, x) in ar.iter_mut().zip(&xv) {
                *at = _mm256_add_ps(*at, _mm256_mul_ps(wv, *x));
            }
        }
        c += 8;
    }
    for (r, ar) in acc.iter().enumerate() {
        let wr = &w[(j0 + r) * cols..(j0 + r + 1) * cols];
        for (t, at) in ar.iter().enumerate() {
            let x = &xs[(t0 + t) * cols..(t0 + t + 1) * cols];
            let mut l = [0f32; 8];
            _mm256_storeu_ps(l.as_mut_ptr(), *at);
            for (q, kk) in (n8..cols).enumerate() {
                l[q] += wr[kk] * x[kk];
            }
            tile[(j0 + r) * n + t0 + t] = hsum8(&l);
        }
    }
}

/// Rebuilds rows `r0 .. r0 + k` of a palettized matrix for [`palette_tokens_avx512`]: row
/// pairs interleaved per 8 columns into `wp` (`[k.div_ceil(2)][cols / 8][16]`, lanes 0-7 row
/// `2p`, lanes 8-15 row `2p + 1`, those of an odd last row's partner left as they are), each
/// row's `cols % 8` tail into `wt` (`[k][8]`). The LUT entries are the f16 table widened exactly
/// ([`crate::palette::PaletteView::table_f32`]), looked up 16 indices at a time: by one
/// permute from a register for up to 4 bits, two permutes and a blend at 6 bits, a gather
/// from the widened table at 8 bits. `idx` is scratch of `cols` bytes.
///
/// # Safety
/// The CPU must have AVX-512F and AVX2; `wp` holds `k.div_ceil(2) * (cols / 8) * 16` values
/// and `wt` `k * 8`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn palette_tile_avx512(
    v: &crate::palette::PaletteView,
    r0: usize,
    k: usize,
    wp: &mut [f32],
    wt: &mut [f32],
    idx: &mut [u8],
) {
    use std::arch::x86_64::*;
    let cols = v.cols;
    let nch = cols / 8;
    debug_assert!(wp.len() >= k.div_ceil(2) * nch * 16 && wt.len() >= k * 8);
    let mut group = usize::MAX;
    let mut table = [0f32; 256];
    let mut tz = [_mm512_setzero_ps(); 4];
    let bit5 = _mm512_set1_epi32(32);
    for j in 0..k {
        let r = r0 + j;
        if r / v.group_size != group {
            group = r / v.group_size;
            table = v.table_f32(r);
            for (q, t) in tz.iter_mut().enumerate() {
                *t = _mm512_loadu_ps(table.as_ptr().add(16 * q));
            }
        }
        let packed = &v.indices[r * v.row_bytes..(r + 1) * v.row_bytes];
        let ix: &[u8] = if v.bits == 8 {
            &packed[..cols]
        } else {
            crate::palette::unpack_row(packed, v.bits, &mut idx[..cols]);
            &idx[..cols]
        };
        let dst = wp.as_mut_ptr().add((j / 2) * nch * 16 + (j % 2) * 8);
        let mut c = 0;
        while c + 16 <= nch * 8 {
            let i = _mm512_cvtepu8_epi32(_mm_loadu_si128(ix.as_ptr().add(c) as *const __m128i));
            let w = match v.bits {
                0..=4 => _mm512_permutexvar_ps(i, tz[0]),
                5..=6 => _mm512_mask_blend_ps(
                    _mm512_test_epi32_mask(i, bit5),
                    _mm512_permutex2var_ps(tz[0], i, tz[1]),
                    _mm512_permutex2var_ps(tz[2], i, tz[3]),
                ),
                _ => _mm512_i32gather_ps::<4>(i, table.as_ptr()),
            };
            _mm256_storeu_ps(dst.add(c * 2), _mm512_castps512_ps256(w));
            _mm256_storeu_ps(
                dst.add(c * 2 + 16),
                _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(w), 1)),
            );
            c += 16;
        }
        while c < nch * 8 {
            for l in 0..8 {
                *dst.add(c * 2 + l) = table[ix[c + l] as usize];
            }
            c += 8;
        }
        for (o, &i) in wt[j * 8..j * 8 + 8].iter_mut().zip(&ix[nch * 8..]) {
            *o = table[i as usize];
        }
    }
}

/// [`dot`]'s final pairwise sum of 8 lanes.
#[inline(always)]
fn hsum8(l: &[f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

crate::multiversion! {
    /// The portable body of [`palette_rows_tokens`]: `w` is `[k, cols]` (the rebuilt rows);
    /// blocks of [`PAL_ROWS`] rows by [`PAL_TOKENS`] tokens, each pair in [`dot`]'s 8 lanes.
    fn palette_tokens_portable(w: &[f32], k: usize, xs: &[f32], cols: usize, n: usize, tile: &mut [f32]) {
        let mut j0 = 0;
        while j0 < k {
            let rn = PAL_ROWS.min(k - j0);
            let mut t0 = 0;
            while t0 < n {
                let tn = PAL_TOKENS.min(n - t0);
                match (rn, tn) {
                    (4, 2) => pal_block::<4, 2>(w, j0, xs, t0, cols, n, tile),
                    (4, _) => pal_block::<4, 1>(w, j0, xs, t0, cols, n, tile),
                    (3, 2) => pal_block::<3, 2>(w, j0, xs, t0, cols, n, tile),
                    (3, _) => pal_block::<3, 1>(w, j0, xs, t0, cols, n, tile),
                    (2, 2) => pal_block::<2, 2>(w, j0, xs, t0, cols, n, tile),
                    (2, _) => pal_block::<2, 1>(w, j0, xs, t0, cols, n, tile),
                    (_, 2) => pal_block::<1, 2>(w, j0, xs, t0, cols, n, tile),
                    _ => pal_block::<1, 1>(w, j0, xs, t0, cols, n, tile),
                }
                t0 += tn;
            }
            j0 += rn;
        }
    }
}

/// `R` rows from `j0` by `T` tokens from `t0` of [`palette_tokens_portable`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn pal_block<const R: usize, const T: usize>(
    w: &[f32],
    j0: usize,
    xs: &[f32],
    t0: usize,
    cols: usize,
    n: usize,
    tile: &mut [f32],
) {
    let n8 = cols / 8 * 8;
    let wr: [&[f32]; R] = std::array::from_fn(|r| &w[(j0 + r) * cols..(j0 + r + 1) * cols]);
    let xr: [&[f32]; T] = std::array::from_fn(|t| &xs[(t0 + t) * cols..(t0 + t + 1) * cols]);
    let mut acc = [[[0f32; 8]; T]; R];
    let mut c = 0;
    while c < n8 {
        let xv: [[f32; 8]; T] = std::array::from_fn(|t| xr[t][c..c + 8].try_into().unwrap());
        for r in 0..R {
            let wv: [f32; 8] = wr[r][c..c + 8].try_into().unwrap();
            for t in 0..T {
                for l in 0..8 {
                    acc[r][t][l] += wv[l] * xv[t][l];
                }
            }
        }
        c += 8;
    }
    for r in 0..R {
        for t in 0..T {
            let l = &mut acc[r][t];
            for (j, q) in (n8..cols).enumerate() {
                l[j] += wr[r][q] * xr[t][q];
            }
            tile[(j0 + r) * n + t0 + t] = hsum8(l);
        }
    }
}

/// [`palette_rows_tokens`] with AVX-512: `wp` holds row pairs interleaved per 8 columns
/// (`[k.div_ceil(2)][cols / 8][16]`: lanes 0-7 row `2p`, lanes 8-15 row `2p + 1`), `wt` each
/// row's `cols % 8` tail (`[2 * k.div_ceil(2)][8]`). One 512-bit accumulator holds [`dot`]'s 8
/// lanes of two rows against one token, whose 8 activations are broadcast to both halves;
/// blocks of [`PAL_ROWS`] row pairs by [`PAL_TOKENS_512`] tokens (16 accumulators). Separate
/// multiply and add, then the tail and [`hsum8`] per (row, token) in scalar code, as [`dot`]
/// does.
///
/// # Safety
/// The CPU must have AVX-512F and AVX2; the slices have the lengths above, `xs` `n * cols`
/// and `tile` `k * n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn palette_tokens_avx512(
    wp: &[f32],
    wt: &[f32],
    k: usize,
    xs: &[f32],
    cols: usize,
    n: usize,
    tile: &mut [f32],
) {
    let pairs = k.div_ceil(2);
    debug_assert!(wp.len() >= pairs * (cols / 8) * 16 && wt.len() >= pairs * 16);
    debug_assert!(xs.len() >= n * cols && tile.len() >= k * n);
    let mut p0 = 0;
    while p0 < pairs {
        let pn = PAL_ROWS.min(pairs - p0);
        let mut t0 = 0;
        while t0 < n {
            let tn = PAL_TOKENS_512.min(n - t0);
            let a = (wp, wt, k, xs, cols, n, p0, t0);
            match (pn, tn) {
                (4, 4) => pal_block512::<4, 4>(a, tile),
                (4, 3) => pal_block512::<4, 3>(a, tile),
                (4, 2) => pal_block512::<4, 2>(a, tile),
                (4, _) => pal_block512::<4, 1>(a, tile),
                (3, 4) => pal_block512::<3, 4>(a, tile),
                (3, 3) => pal_block512::<3, 3>(a, tile),
                (3, 2) => pal_block512::<3, 2>(a, tile),
                (3, _) => pal_block512::<3, 1>(a, tile),
                (2, 4) => pal_block512::<2, 4>(a, tile),
                (2, 3) => pal_block512::<2, 3>(a, tile),
                (2, 2) => pal_block512::<2, 2>(a, tile),
                (2, _) => pal_block512::<2, 1>(a, tile),
                (_, 4) => pal_block512::<1, 4>(a, tile),
                (_, 3) => pal_block512::<1, 3>(a, tile),
                (_, 2) => pal_block512::<1, 2>(a, tile),
                _ => pal_block512::<1, 1>(a, tile),
            }
            t0 += tn;
        }
        p0 += pn;
    }
}

/// The arguments of [`pal_block512`]: `(wp, wt, k, xs, cols, n, first pair, first token)`.
#[cfg(target_arch = "x86_64")]
type Block512<'a> = (
    &'a [f32],
    &'a [f32],
    usize,
    &'a [f32],
    usize,
    usize,
    usize,
    usize,
);

/// `P` row pairs from `p0` by `T` tokens from `t0` of [`palette_tokens_avx512`].
///
/// # Safety
/// As [`palette_tokens_avx512`]; `p0 + P <= k.div_ceil(2)`, `t0 + T <= n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
#[inline]
unsafe fn pal_block512<const P: usize, const T: usize>(a: Block512, tile: &mut [f32]) {
    use std::arch::x86_64::*;
    let (wp, wt, k, xs, cols, n, p0, t0) = a;
    let nch = cols / 8;
    let n8 = nch * 8;
    let wbase = wp.as_ptr().add(p0 * nch * 16);
    let xbase = xs.as_ptr().add(t0 * cols);
    let mut acc = [[_mm512_setzero_ps(); T]; P];
    for c in 0..nch {
        let mut xv = [_mm512_setzero_ps(); T];
        for (t, x) in xv.iter_mut().enumerate() {
            *x = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(
                xbase.add(t * cols + c * 8) as *const f64,
            )));
        }
        for (p, ap) in acc.iter_mut().enumerate() {
            let w = _mm512_loadu_ps(wbase.add((p * nch + c) * 16));
            for (at, x) in ap.iter_mut().zip(&xv) {
                *at = _mm512_add_ps(*at, _mm512_mul_ps(w, *x));
            }
        }
    }
    for (p, ap) in acc.iter().enumerate() {
        for (t, at) in ap.iter().enumerate() {
            let mut l = [0f32; 16];
            _mm512_storeu_ps(l.as_mut_ptr(), *at);
            let x = &xs[(t0 + t) * cols..(t0 + t + 1) * cols];
            for h in 0..2 {
                let j = (p0 + p) * 2 + h;
                if j >= k {
                    break;
                }
                let mut l8: [f32; 8] = l[h * 8..h * 8 + 8].try_into().unwrap();
                for (q, (&wv, &xv)) in wt[j * 8..j * 8 + 8].iter().zip(&x[n8..]).enumerate() {
                    l8[q] += wv * xv;
                }
                tile[j * n + t0 + t] = hsum8(&l8);
            }
        }
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

/// How [`prepare`] prepares an input vector for a weight: weights with the same key take
/// the same prepared vector.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PrepKey {
    F32,
    /// int8 activations in blocks of this many values.
    Q(usize),
    Ternary,
}

/// How `kernel` prepares a vector of `cols` values for `w` ([`prepare`]).
fn prep_key(kernel: Kernel, w: &WeightData, cols: usize) -> PrepKey {
    match w {
        WeightData::Ternary { .. } if kernel == Kernel::Int8 => PrepKey::Ternary,
        WeightData::Gguf { ty, .. }
            if kernel == Kernel::Int8
                && q8::act_block(*ty).is_some_and(|b| cols.is_multiple_of(b)) =>
        {
            PrepKey::Q(q8::act_block(*ty).unwrap_or(32))
        }
        _ => PrepKey::F32,
    }
}

/// Which kernel `kernel` selects for `w`, with `x` prepared for it.
fn prepare(kernel: Kernel, w: &WeightData, cols: usize, x: &[f32]) -> Prepared {
    prepare_key(prep_key(kernel, w, cols), x)
}

fn prepare_key(key: PrepKey, x: &[f32]) -> Prepared {
    match key {
        PrepKey::Ternary => {
            let a = q8::quantize(x, 256);
            let p = q8::permute_for_ternary(&a);
            Prepared::Ternary(a, p)
        }
        PrepKey::Q(block) => Prepared::Q(q8::quantize(x, block)),
        PrepKey::F32 => Prepared::F32,
    }
}

/// The inputs of one or more products over the same activations (`xs`, `[n, cols]`),
/// prepared once for all of them: Q, K and V (or gate and up) read the same normed hidden
/// state, and each would quantize it and regroup it for its kernel again. For one vector
/// the prepared vector of each [`PrepKey`]; for several the int8 token groups of each block
/// size. The values are those each product would compute itself, so the bits are the same.
pub struct SharedActs<'a> {
    xs: &'a [f32],
    cols: usize,
    prepared: Vec<(PrepKey, Prepared)>,
    groups: Vec<(usize, Vec<q8::TokenGroup>)>,
}

impl<'a> SharedActs<'a> {
    /// Nothing is prepared until a product asks for it.
    pub fn new(xs: &'a [f32], cols: usize) -> Self {
        SharedActs {
            xs,
            cols,
            prepared: Vec::new(),
            groups: Vec::new(),
        }
    }

    /// Values in each vector.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The single vector prepared for `key`.
    fn prepared(&mut self, key: PrepKey) -> &Prepared {
        let i = match self.prepared.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                self.prepared.push((key, prepare_key(key, self.xs)));
                self.prepared.len() - 1
            }
        };
        &self.prepared[i].1
    }

    /// Every vector quantized in blocks of `block` ([`q8::quantize`]) and grouped by
    /// [`q8::TOKENS_PER_GROUP`] tokens ([`q8::token_groups`]).
    fn groups(&mut self, block: usize) -> &[q8::TokenGroup] {
        let i = match self.groups.iter().position(|(b, _)| *b == block) {
            Some(i) => i,
            None => {
                let acts: Vec<q8::QAct> = self
                    .xs
                    .par_chunks_exact(self.cols)
                    .map(|x| q8::quantize(x, block))
                    .collect();
                let g = q8::token_groups(&acts.iter().collect::<Vec<_>>());
                self.groups.push((block, g));
                self.groups.len() - 1
            }
        };
        &self.groups[i].1
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
    /// Rows of a tile rebuilt from their LUTs ([`palette_rows_tokens`]).
    rows: Vec<f32>,
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
            if matches!(v.bits, 4 | 6 | 8) && palette_tokens_avx512_ok(isa) {
                // SAFETY: AVX-512F and AVX2 are present (palette_tokens_avx512_ok); the
                // indices' width is the kernel's; x holds cols values, the rows exist (the
                // caller's tiles).
                unsafe {
                    match v.bits {
                        4 => palette_rows_perm::<4>(v, x, ys, r0),
                        6 => palette_rows_perm::<6>(v, x, ys, r0),
                        _ => palette_rows_perm::<8>(v, x, ys, r0),
                    }
                };
                return;
            }
            #[cfg(target_arch = "aarch64")]
            if matches!(v.bits, 4 | 6)
                && matches!(crate::isa::usable(isa), q8::Isa::Neon | q8::Isa::NeonDot)
            {
                // SAFETY: NEON is part of every aarch64 target; the indices' width is the
                // kernel's; x holds cols values, the rows exist (the caller's tiles).
                unsafe {
                    if v.bits == 4 {
                        palette_rows_neon::<4>(v, x, ys, r0)
                    } else {
                        palette_rows_neon::<6>(v, x, ys, r0)
                    }
                };
                return;
            }
            #[cfg(target_arch = "x86_64")]
            if matches!(v.bits, 8 | 6 | 4) && palette_gather_ok() {
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
    let a = prepare(kernel, &w, cols, x);
    matvec_prepared(kernel, w, cols, x, &a, y)
}

/// [`matvec_with`] with `x` already prepared for `w`'s kernel ([`prepare`]).
fn matvec_prepared(
    kernel: Kernel,
    w: WeightData,
    cols: usize,
    x: &[f32],
    a: &Prepared,
    y: &mut [f32],
) {
    debug_assert_eq!(x.len(), cols);
    debug_assert!(match (prep_key(kernel, &w, cols), a) {
        (PrepKey::F32, Prepared::F32) | (PrepKey::Ternary, Prepared::Ternary(..)) => true,
        (PrepKey::Q(block), Prepared::Q(q)) => q.block == block,
        _ => false,
    });
    let isa = q8::detect();
    if team::in_step() {
        // A decode step's team: items of several tasks (about ITEMS_PER_THREAD a thread,
        // each claimed by one atomic operation), each task's rows as rayon's tasks run them.
        let tasks = y.len().div_ceil(ROWS_PER_TASK);
        let per_item = (tasks / (rayon::current_num_threads() * ITEMS_PER_THREAD)).max(1);
        let size = per_item * ROWS_PER_TASK;
        return team::chunks_mut(y, size, |i, ys| {
            STEP_SCRATCH.with_borrow_mut(|s| {
                for (j, ys) in ys.chunks_mut(ROWS_PER_TASK).enumerate() {
                    rows(&w, cols, x, a, isa, ys, i * size + j * ROWS_PER_TASK, s)
                }
            })
        });
    }
    y.par_chunks_mut(ROWS_PER_TASK)
        .enumerate()
        .for_each_init(Scratch::default, |s, (t, ys)| {
            rows(&w, cols, x, a, isa, ys, t * ROWS_PER_TASK, s)
        });
}

/// Items a thread of a decode step's team takes from one single-token product, about: fewer
/// mean fewer atomic claims, more a shorter wait for the last.
const ITEMS_PER_THREAD: usize = 8;

thread_local! {
    /// The scratch of a team thread's tasks ([`matvec_prepared`] in a decode step), kept
    /// between products.
    static STEP_SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
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
    matmul_shared(kernel, w, ys, &mut SharedActs::new(xs, cols))
}

/// [`matmul_with`] over `acts`' vectors, reusing what an earlier product over the same
/// `acts` prepared (the same bits as [`matmul_with`]).
pub fn matmul_shared(kernel: Kernel, w: WeightData, ys: &mut [f32], acts: &mut SharedActs) {
    let (xs, cols) = (acts.xs, acts.cols);
    let n = xs.len() / cols.max(1);
    if n <= 1 {
        let a = acts.prepared(prep_key(kernel, &w, cols));
        return matvec_prepared(kernel, w, cols, xs, a, ys);
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
            let groups = acts.groups(256);
            run(&|r0, k, tile, s| {
                q8::ternary_rows_tokens(isa, words, scales, cols, groups, tile, r0, k, &mut s.words)
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
            let groups = acts.groups(q8::act_block(ty).unwrap_or(32));
            run(&|r0, k, tile, s| {
                q8::gguf_rows_tokens(isa, ty, bytes, rb, groups, tile, r0, k, &mut s.words)
            });
        }
        WeightData::Palette(v) => {
            // f32 activations with either kernel (as [`prepare`]): each row of a tile is
            // rebuilt from its LUT once per call and run against every token.
            debug_assert_eq!(v.cols, cols);
            run(&|r0, k, tile, s| palette_rows_tokens(isa, &v, xs, n, tile, r0, k, s));
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

    /// `matvec` on palettized weights (whichever single-token kernel this CPU's level takes:
    /// the AVX-512 table in registers, the AVX2 one, the row rebuilt) gives the rebuilt rows'
    /// bits; every kernel at every width is run directly by
    /// `palette_perm_paths_give_the_rebuilt_rows_bits`.
    #[test]
    fn palette_matvec_gives_the_rebuilt_rows_bits() {
        let mut seed = 9u64;
        for (bits, cols) in [(4u32, 77usize), (8, 77), (6, 77), (6, 64), (6, 5)] {
            let (rows, g) = (12usize, 4usize);
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
                "bits {bits} cols {cols}"
            );
        }
    }

    /// The single-token palette kernels without the row buffer (AVX-512: row pairs,
    /// `vpermt2ps`, 4, 6 and 8 bits; AVX2: `vpermps` at 4 bits, gathers at 6 and 8; aarch64:
    /// `tbl`, 4 and 6 bits) give the rebuilt rows' bits: odd row counts (the last row paired with itself), first rows that
    /// put a pair across a group boundary (groups of 3 and 1 rows), row lengths below 8, not a
    /// multiple of 8 and SmolLM2's 576, and `x` with zeros of both signs.
    #[test]
    fn palette_perm_paths_give_the_rebuilt_rows_bits() {
        type Kernel = unsafe fn(&crate::palette::PaletteView, &[f32], &mut [f32], usize);
        // (level, index width, kernel)
        let mut kernels: Vec<(&str, u32, Kernel)> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if palette_tokens_avx512_ok(q8::detect()) {
                kernels.push(("avx512", 4, palette_rows_perm::<4>));
                kernels.push(("avx512", 6, palette_rows_perm::<6>));
                kernels.push(("avx512", 8, palette_rows_perm::<8>));
            }
            // AVX2: registers at 4 bits, gathers at 6 and 8 (matvec takes it only below
            // AVX-512).
            if palette_gather_ok() {
                for bits in [4, 6, 8] {
                    kernels.push(("avx2", bits, palette_rows_gather));
                }
            }
        }
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("neon") {
            kernels.push(("neon", 4, palette_rows_neon::<4>));
            kernels.push(("neon", 6, palette_rows_neon::<6>));
        }
        if kernels.is_empty() {
            eprintln!("skipped: no AVX2, AVX-512 or NEON here");
            return;
        }
        let mut seed = 41u64;
        let rows = 23;
        for (bits, cols) in [4u32, 6, 8]
            .into_iter()
            .flat_map(|b| [3usize, 8, 16, 77, 576].map(|c| (b, c)))
        {
            for g in [1usize, 3, 32] {
                let (tables, indices) = palette_case(rows, cols, bits, g, &mut seed);
                let v = palette_view(&tables, &indices, bits, g, cols);
                let x: Vec<f32> = (0..cols)
                    .map(|i| match i % 29 {
                        0 => 0.0,
                        1 => -0.0,
                        _ => (lcg(&mut seed) % 2001) as f32 / 1000.0 - 1.0,
                    })
                    .collect();
                for (r0, k) in [(0usize, rows), (1, 22), (2, 7), (5, 1), (22, 1)] {
                    let mut want = vec![0f32; k];
                    palette_rows(
                        &v,
                        &x,
                        &mut want,
                        r0,
                        &mut vec![0f32; cols],
                        &mut vec![0u8; cols],
                    );
                    for &(name, _, kernel) in kernels.iter().filter(|kn| kn.1 == bits) {
                        let mut got = vec![f32::NAN; k];
                        // SAFETY: the kernels' features checked above (NEON: every aarch64
                        // target); the rows r0 .. r0 + k exist.
                        unsafe { kernel(&v, &x, &mut got, r0) };
                        assert_eq!(
                            bits_of(&got),
                            bits_of(&want),
                            "{name}: bits {bits} cols {cols} group {g} rows {r0} + {k}"
                        );
                    }
                }
            }
        }
    }

    /// The view of [`palette_case`]'s matrix (`bits`-bit indices, groups of `g` rows).
    fn palette_view<'a>(
        tables: &'a [u8],
        indices: &'a [u8],
        bits: u32,
        g: usize,
        cols: usize,
    ) -> crate::palette::PaletteView<'a> {
        crate::palette::PaletteView {
            bits,
            group_size: g,
            cols,
            row_bytes: crate::palette::row_bytes(cols as u64, bits) as usize,
            tables,
            indices,
        }
    }

    /// A palettized `[rows, cols]` matrix with random indices and LUT entries in [-1, 1]
    /// (one group of `g` rows per table): `(tables, indices)`.
    fn palette_case(
        rows: usize,
        cols: usize,
        bits: u32,
        g: usize,
        seed: &mut u64,
    ) -> (Vec<u8>, Vec<u8>) {
        let rb = crate::palette::row_bytes(cols as u64, bits) as usize;
        let mut indices = vec![0u8; rows * rb];
        for r in 0..rows {
            let idx: Vec<u8> = (0..cols).map(|_| (lcg(seed) % (1 << bits)) as u8).collect();
            crate::palette::pack_row(&idx, bits, &mut indices[r * rb..(r + 1) * rb]);
        }
        let tables: Vec<u8> = (0..rows.div_ceil(g) << bits)
            .flat_map(|_| {
                half::f16::from_f32((lcg(seed) % 2001) as f32 / 1000.0 - 1.0).to_le_bytes()
            })
            .collect();
        (tables, indices)
    }

    #[test]
    fn palette_matmul_gives_each_tokens_matvec_bits() {
        // Every index width; row lengths below 8, not a multiple of 8, 16 or 64 and
        // SmolLM2's 576; 37 rows (two full tiles of 16 and an odd 5, whose last row pair is
        // padded); groups of 3 rows (boundaries inside tiles and inside a row pair), 32 and
        // one per tensor; token counts around the register blocks (2 and 4 tokens) and 16.
        // Against per-token `matvec_with` through `matmul_with` (the detected path), and
        // the multi-token kernel forced onto each path this CPU has against the portable
        // single-token `palette_rows`.
        let mut isas = vec![q8::Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") {
                isas.push(q8::Isa::Avx2);
            }
            if q8::detect() == q8::Isa::Avx512Vnni {
                isas.push(q8::Isa::Avx512Vnni);
            }
        }
        // The multi-token palette kernels have no NEON form: the aarch64 levels take the
        // portable one.
        #[cfg(target_arch = "aarch64")]
        isas.push(q8::detect());
        let mut seed = 31u64;
        let rows = 37;
        for &bits in crate::palette::SUPPORTED_BITS {
            for cols in [5usize, 77, 203, 576] {
                for g in [3usize, 32, rows] {
                    let (tables, indices) = palette_case(rows, cols, bits, g, &mut seed);
                    let v = palette_view(&tables, &indices, bits, g, cols);
                    for n in [2usize, 3, 4, 16, 17] {
                        let xs: Vec<f32> = (0..n * cols)
                            .map(|i| match i % 53 {
                                0 => 0.0,
                                1 => -0.0,
                                _ => (lcg(&mut seed) % 2001) as f32 / 1000.0 - 1.0,
                            })
                            .collect();
                        let mut want = vec![0f32; n * rows];
                        for (x, y) in xs.chunks_exact(cols).zip(want.chunks_exact_mut(rows)) {
                            palette_rows(&v, x, y, 0, &mut vec![0f32; cols], &mut vec![0u8; cols]);
                        }
                        let case = format!("bits {bits} cols {cols} group {g} n {n}");
                        for kernel in [Kernel::F32, Kernel::Int8] {
                            let mut y = vec![0f32; n * rows];
                            matmul_with(kernel, WeightData::Palette(v), cols, &xs, &mut y);
                            for (i, x) in xs.chunks_exact(cols).enumerate() {
                                let mut one = vec![0f32; rows];
                                matvec_with(kernel, WeightData::Palette(v), cols, x, &mut one);
                                assert_eq!(
                                    bits_of(&one),
                                    bits_of(&want[i * rows..][..rows]),
                                    "{case}: matvec token {i}"
                                );
                                assert_eq!(
                                    bits_of(&y[i * rows..][..rows]),
                                    bits_of(&one),
                                    "{case} {kernel:?}: matmul token {i}"
                                );
                            }
                        }
                        for &isa in &isas {
                            let mut s = Scratch::default();
                            for r0 in (0..rows).step_by(ROWS_PER_TASK) {
                                let k = ROWS_PER_TASK.min(rows - r0);
                                let mut tile = vec![f32::NAN; k * n];
                                palette_rows_tokens(isa, &v, &xs, n, &mut tile, r0, k, &mut s);
                                for j in 0..k {
                                    for i in 0..n {
                                        assert_eq!(
                                            tile[j * n + i].to_bits(),
                                            want[i * rows + r0 + j].to_bits(),
                                            "{case} {isa:?}: row {} token {i}",
                                            r0 + j
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    fn bits_of(v: &[f32]) -> Vec<u32> {
        v.iter().map(|a| a.to_bits()).collect()
    }

    #[test]
    fn matmul_gives_each_vectors_matvec_bits_on_every_encoding() {
        // Ternary (the multi-token int8 kernel where the CPU has AVX-512 or AVX2), GGML
        // types, both kernels; token counts around the 16-token groups; rows not a multiple
        // of 16; a
        // row length whose 32-element blocks are no multiple of 8 (SmolLM2's 576), one whose
        // 256-element blocks are more than 8 and no multiple of 8 (2304).
        // 37 and 39 rows: tasks of 16 rows end with 5 and 7 (passes of 8 rows, or 4 for the
        // k-quants, then 4, 2 and 1 at a time).
        for rows in [37, 39] {
            for cols in [512, 576, 2304] {
                matmul_bits_case(rows, cols);
            }
        }
    }

    fn matmul_bits_case(rows: usize, cols: usize) {
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
        for n in [1usize, 2, 5, 16, 17, 33] {
            let xs: Vec<f32> = (0..n * cols)
                .map(|i| {
                    if i % 300 < 8 {
                        0.0
                    } else {
                        (lcg(&mut seed) % 2001) as f32 / 1000.0 - 1.0
                    }
                })
                .collect();
            // One SharedActs across every encoding (both orders, so each cache entry is
            // made by one weight and reused by another), against matvec_with.
            for kernel in [Kernel::F32, Kernel::Int8] {
                for rev in [false, true] {
                    let mut acts = SharedActs::new(&xs, cols);
                    let order: Vec<&WeightData> = if rev {
                        ws.iter().rev().collect()
                    } else {
                        ws.iter().collect()
                    };
                    for w in order {
                        let mut y = vec![0f32; n * rows];
                        matmul_shared(kernel, *w, &mut y, &mut acts);
                        for (i, x) in xs.chunks_exact(cols).enumerate() {
                            let mut want = vec![0f32; rows];
                            matvec_with(kernel, *w, cols, x, &mut want);
                            assert_eq!(
                                bits_of(&y[i * rows..(i + 1) * rows]),
                                bits_of(&want),
                                "shared {kernel:?} cols {cols} n {n} rev {rev}"
                            );
                        }
                    }
                }
            }
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
