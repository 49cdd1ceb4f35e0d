//! Ternary recovery, the TQ2_0 quantizer, and the packed 2-bit layout of the matvec kernel.
//!
//! **Recovery** (from the ternary port notes, `shared/seeds/000_*`): a TQ2_0/TQ1_0 weight
//! dequantizes to `W = d * (q - 1)` with `q` in {0, 1, 2}. Per 256-element block along K
//! (`ne[0]`), `d_block = max|W|` is exact (the nonzero magnitude is `|d|`), and
//! `code = round(W / d_block) + 1`. [`recover_block`] computes that from the dequantized
//! values and also decodes the codes straight from the block bytes, and requires both routes
//! to agree.
//!
//! **Packed layout** (`ternary2` in the bundle manifest): for a weight of row-major shape
//! `[N, K]` (`K = ne[0]`, a multiple of 256):
//!
//! ```text
//! codes:  N * K/16 little-endian u32 words, row-major [N, K/16]; word w of row n holds
//!         elements k = 16w .. 16w+15 of that row, element 16w+j in bits 2j..2j+1.
//!         Each word lies inside one 256-element block (16 words per block).
//! scales: N * K/256 IEEE f16 values, little-endian, row-major [N, K/256]; scale b of row n
//!         belongs to elements 256b .. 256b+255.
//! value:  W[n, k] = f32(scale[n, k/256]) * (code[n, k] - 1), one f32 multiply.
//! ```
//!
//! The stored scale is the block's own f16 `d` (whose magnitude equals `d_block`) and the
//! stored codes are the block's own codes, so `f32(scale) * (code - 1)` reproduces the GGUF
//! dequantization bit for bit, signed zeros included, also for the degenerate blocks
//! (`d = 0`, a negative `d`) where the two routes describe the same values differently.
//!
//! **Quantizer**: [`quantize_tq2_0_block`] is gguf-py 0.19.0's `TQ2_0.quantize_blocks`
//! (`d = max|x|`, `q = round_half_away(x * (1/d))`), operation for operation, so its bytes
//! equal gguf-py's.

use crate::ggml::{GgmlType, QK_K};
use crate::quant::ternary::{tq1_0_codes, tq2_0_codes, BlockTQ1_0, BlockTQ2_0};

/// Elements per ternary block (`QK_K`).
pub const BLOCK: usize = QK_K;
/// Codes per packed u32 word.
pub const CODES_PER_WORD: usize = 16;
/// Words per 256-element block.
pub const WORDS_PER_BLOCK: usize = BLOCK / CODES_PER_WORD;

/// What is wrong with one block, as found by [`recover_block`] or the quantizer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum BlockFault {
    #[error("scale d is not finite (f16 bits {d_bits:#06x})")]
    NonFiniteScale { d_bits: u16 },
    #[error("element {element} has TQ2_0 code 3 (value +2d), which is not ternary")]
    CodeThree { element: usize },
    #[error("element {element} = {value} is neither 0 nor +/-d (d = {d})")]
    NotTernary { element: usize, value: f32, d: f32 },
    #[error("max|W| = {max} differs from |d| = {d}")]
    ScaleMismatch { max: f32, d: f32 },
    #[error("element {element}: code {from_values} from the dequantized values but {from_bytes} from the block bytes")]
    RoutesDisagree {
        element: usize,
        from_values: u8,
        from_bytes: u8,
    },
    #[error("element {element} = {value} is not finite")]
    NonFiniteWeight { element: usize, value: f32 },
    #[error("max|x| = {max} does not fit an f16 scale (largest finite f16 is 65504)")]
    ScaleOverflow { max: f32 },
}

/// One recovered block: the f16 scale bits and 256 codes in {0, 1, 2}.
#[derive(Clone, Debug, PartialEq)]
pub struct TernaryBlock {
    pub d_bits: u16,
    pub codes: [u8; BLOCK],
}

/// Recovers one block. `d_bits` and `byte_codes` come straight from the block bytes; `w` is
/// the block's dequantized values (from [`crate::quant::dequantize`]).
///
/// The common case runs as straight-line loops over the block that the compiler vectorizes;
/// only a block that fails a check is walked again element by element to name the fault.
#[inline(always)]
pub fn recover_block(
    d_bits: u16,
    byte_codes: &[u8; BLOCK],
    w: &[f32],
) -> Result<TernaryBlock, BlockFault> {
    let Ok(w) = <&[f32; BLOCK]>::try_from(w) else {
        return Err(BlockFault::NotTernary {
            element: w.len().min(BLOCK),
            value: f32::NAN,
            d: f32::NAN,
        });
    };
    let d = half::f16::from_bits(d_bits).to_f32();
    if !d.is_finite() {
        return Err(BlockFault::NonFiniteScale { d_bits });
    }
    // Route 1: from the values. d_block = max|W|, in 8 independent lanes so the loop
    // vectorizes (max is exact, so the lane split does not change the result).
    let mut m8 = [0f32; 8];
    for c in w.chunks_exact(8) {
        for j in 0..8 {
            let a = c[j].abs();
            m8[j] = if a > m8[j] { a } else { m8[j] };
        }
    }
    let max = m8.iter().fold(0f32, |m, &a| if a > m { a } else { m });
    let any3 = byte_codes.iter().fold(0u8, |m, &c| m.max(c)) > 2;
    if any3 {
        return Err(recover_block_fault(d, byte_codes, w, max));
    }
    if max == 0.0 && w.iter().all(|v| *v == 0.0) {
        // d = 0, or every code 1: all values are zero; every code is 1 by the rule, and the
        // stored bytes reproduce the zeros (and their signs) exactly.
        return Ok(TernaryBlock {
            d_bits,
            codes: *byte_codes,
        });
    }
    if max != d.abs() {
        return Err(recover_block_fault(d, byte_codes, w, max));
    }
    // code = round(W / max) + 1; W is exactly -max, 0 or +max in a ternary block, so the
    // division is exact and equality tests are the same computation without it.
    // Route 2: from the bytes; a negative d mirrors the codes.
    let flip = d < 0.0;
    let mut bad = false;
    for i in 0..BLOCK {
        let v = w[i];
        let from_values: u8 = if v == max {
            2
        } else if v == -max {
            0
        } else {
            1
        };
        let valid = v == max || v == -max || v == 0.0;
        let q = byte_codes[i];
        let from_bytes = if flip { 2 - q } else { q };
        bad |= !valid | (from_values != from_bytes);
    }
    if bad {
        return Err(recover_block_fault(d, byte_codes, w, max));
    }
    Ok(TernaryBlock {
        d_bits,
        codes: *byte_codes,
    })
}

/// The slow path of [`recover_block`]: finds and names the first fault of a block that failed.
#[cold]
fn recover_block_fault(d: f32, byte_codes: &[u8; BLOCK], w: &[f32; BLOCK], max: f32) -> BlockFault {
    if let Some(element) = byte_codes.iter().position(|&c| c > 2) {
        return BlockFault::CodeThree { element };
    }
    if let Some(element) = w.iter().position(|v| !v.is_finite()) {
        return BlockFault::NonFiniteWeight {
            element,
            value: w[element],
        };
    }
    if max != d.abs() {
        return BlockFault::ScaleMismatch { max, d: d.abs() };
    }
    for (element, (&v, &q)) in w.iter().zip(byte_codes.iter()).enumerate() {
        let from_values = if v == max {
            2u8
        } else if v == 0.0 {
            1
        } else if v == -max {
            0
        } else {
            return BlockFault::NotTernary {
                element,
                value: v,
                d: max,
            };
        };
        let from_bytes = if d > 0.0 { q } else { 2 - q };
        if from_values != from_bytes {
            return BlockFault::RoutesDisagree {
                element,
                from_values,
                from_bytes,
            };
        }
    }
    // Unreachable for a block that failed the fast path; report the scale to be safe.
    BlockFault::ScaleMismatch { max, d: d.abs() }
}

/// Gathers field `s` (bits `2s..2s+1`) of each of the 8 bytes of `x` into 16 bits, byte `j`'s
/// field at bits `2j..2j+1` (a SWAR transpose; every step is a shift, an OR and a mask).
#[inline(always)]
fn gather_field(x: u64, s: u32) -> u32 {
    let mut t = (x >> (2 * s)) & 0x0303_0303_0303_0303;
    t = (t | (t >> 6)) & 0x000f_000f_000f_000f;
    t = (t | (t >> 12)) & 0x0000_00ff_0000_00ff;
    t = (t | (t >> 24)) & 0xffff;
    t as u32
}

/// The inverse of [`gather_field`]: 8 two-bit values (bits `2j..2j+1` of `v`) to the low two
/// bits of 8 bytes.
#[inline(always)]
fn scatter_field(v: u32) -> u64 {
    let mut t = v as u64 & 0xffff;
    t = (t | (t << 24)) & 0x0000_00ff_0000_00ff;
    t = (t | (t << 12)) & 0x000f_000f_000f_000f;
    (t | (t << 6)) & 0x0303_0303_0303_0303
}

/// The 64 code bytes of a TQ2_0 block as 8 little-endian u64.
#[inline(always)]
fn qs_lanes(qs: &[u8]) -> [u64; 8] {
    let mut x = [0u64; 8];
    for (v, c) in x.iter_mut().zip(qs.chunks_exact(8)) {
        *v = u64::from_le_bytes(c.try_into().expect("8 bytes"));
    }
    x
}

/// Recovers one TQ2_0 block (66 bytes: 64 code bytes `qs`, then `d` as f16) in the code
/// domain, straight into the packed layout: the block's own `d` bits and its 16 words.
///
/// Equivalent to [`recover_block`] on the block's dequantized values (`tests` check it on
/// random and degenerate blocks): for a finite `d` and codes in {0, 1, 2} the values are
/// exactly `d * (q - 1)`, so `max|W|` is `|d|` (or 0 when every value is zero), the two routes
/// agree by construction, and the recovered block is the block's own `d` and codes. What is
/// left to check is what can fail: a non-finite `d` and code 3.
///
/// TQ2_0 keeps element `128h + 32s + l` in bits `2s..2s+1` of `qs[32h + l]`; packed word `w`
/// holds elements `16w .. 16w+15`, i.e. field `s = (w % 8) / 2` of the 16 bytes
/// `qs[32 (w / 8) + 16 (w % 2) ..][..16]`.
#[inline(always)]
pub fn recover_tq2_0_words(block: &[u8], words: &mut [u32]) -> Result<u16, BlockFault> {
    let d_bits = u16::from_le_bytes([block[64], block[65]]);
    if d_bits & 0x7c00 == 0x7c00 {
        return Err(BlockFault::NonFiniteScale { d_bits });
    }
    let x = qs_lanes(&block[..64]);
    // Code 3 is both bits of a field set.
    let three = x
        .iter()
        .fold(0u64, |a, &v| a | (v & (v >> 1) & 0x5555_5555_5555_5555));
    if three != 0 {
        let element = (0..BLOCK)
            .find(|&e| (block[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3 == 3)
            .unwrap_or(0);
        return Err(BlockFault::CodeThree { element });
    }
    for (w, out) in words[..WORDS_PER_BLOCK].iter_mut().enumerate() {
        let (h, s, half) = (w / 8, ((w % 8) / 2) as u32, w % 2);
        let lo = x[4 * h + 2 * half];
        let hi = x[4 * h + 2 * half + 1];
        *out = gather_field(lo, s) | (gather_field(hi, s) << 16);
    }
    Ok(d_bits)
}

/// The inverse of [`recover_tq2_0_words`] (`verify` compares its result with the source block,
/// so the two directions are separate code): the 64 TQ2_0 code bytes of one block's 16 packed
/// words, as 8 little-endian u64 (bytes `8l .. 8l+8` in lane `l`). Lane `l` holds `qs[32h + 16half + 8hi ..][..8]` with
/// `(h, half, hi) = (l / 4, l / 2 % 2, l % 2)`, whose field `s` comes from the `hi` half of
/// word `8h + 2s + half`; written lane-parallel so the compiler can vectorize the 8 lanes.
#[inline(always)]
pub fn tq2_0_qs_lanes_from_words(words: &[u32]) -> [u64; 8] {
    let w = &words[..WORDS_PER_BLOCK];
    let mut x = [0u64; 8];
    for s in 0..4 {
        let v = [
            w[2 * s],
            w[2 * s] >> 16,
            w[2 * s + 1],
            w[2 * s + 1] >> 16,
            w[8 + 2 * s],
            w[8 + 2 * s] >> 16,
            w[9 + 2 * s],
            w[9 + 2 * s] >> 16,
        ];
        for (xl, vl) in x.iter_mut().zip(v) {
            *xl |= scatter_field(vl & 0xffff) << (2 * s);
        }
    }
    x
}

/// Codes and scale bits of one TQ2_0 or TQ1_0 block, decoded from its bytes.
#[inline(always)]
pub fn decode_block(ty: GgmlType, bytes: &[u8]) -> Option<(u16, [u8; BLOCK])> {
    match ty {
        GgmlType::TQ2_0 => {
            let b: &BlockTQ2_0 = bytemuck::try_from_bytes(bytes).ok()?;
            Some((u16::from_le_bytes(b.d), tq2_0_codes(b)))
        }
        GgmlType::TQ1_0 => {
            let b: &BlockTQ1_0 = bytemuck::try_from_bytes(bytes).ok()?;
            Some((u16::from_le_bytes(b.d), tq1_0_codes(b)))
        }
        _ => None,
    }
}

/// gguf-py's `np_roundf`: round half away from zero, as
/// `sign(n) * (floor(|n|) + floor(2 * (|n| - floor(|n|))))` in f32.
#[inline(always)]
pub fn np_roundf(n: f32) -> f32 {
    let a = n.abs();
    let floored = a.floor();
    let b = floored + (2.0 * (a - floored)).floor();
    if n > 0.0 {
        b
    } else if n < 0.0 {
        -b
    } else {
        // numpy's sign(±0) is +0.
        0.0 * b
    }
}

/// Quantizes 256 f32 values to one TQ2_0 block exactly as gguf-py's `TQ2_0.quantize_blocks`.
/// Non-finite inputs and a `max|x|` that overflows f16 are errors (gguf-py would write a NaN or
/// Inf scale).
#[inline(always)]
pub fn quantize_tq2_0_block(x: &[f32]) -> Result<TernaryBlock, BlockFault> {
    debug_assert_eq!(x.len(), BLOCK);
    let mut d = 0f32;
    for (element, &v) in x.iter().enumerate() {
        if !v.is_finite() {
            return Err(BlockFault::NonFiniteWeight { element, value: v });
        }
        d = d.max(v.abs());
    }
    let d16 = half::f16::from_f32(d);
    if !d16.is_finite() {
        return Err(BlockFault::ScaleOverflow { max: d });
    }
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let mut codes = [0u8; BLOCK];
    for (c, &v) in codes.iter_mut().zip(x) {
        let q = np_roundf(v * id);
        *c = (q as i8 + 1) as u8;
    }
    Ok(TernaryBlock {
        d_bits: d16.to_bits(),
        codes,
    })
}

/// Serializes a block in the TQ2_0 byte layout (the inverse of `tq2_0_codes`).
pub fn tq2_0_bytes(b: &TernaryBlock) -> [u8; 66] {
    let mut out = [0u8; 66];
    for h in 0..2 {
        for s in 0..4 {
            for l in 0..32 {
                out[h * 32 + l] |= (b.codes[h * 128 + s * 32 + l] & 3) << (2 * s);
            }
        }
    }
    out[64..66].copy_from_slice(&b.d_bits.to_le_bytes());
    out
}

/// Packs one block's 256 codes into 16 words (element j of a word at bits 2j..2j+1).
#[inline(always)]
pub fn pack_block(codes: &[u8; BLOCK], words: &mut [u32]) {
    for (w, chunk) in words.iter_mut().zip(codes.chunks_exact(CODES_PER_WORD)) {
        let mut v = 0u32;
        for (j, &c) in chunk.iter().enumerate() {
            v |= ((c & 3) as u32) << (2 * j);
        }
        *w = v;
    }
}

/// The kernel's definition of one row: `out[k] = f32(scale[k/256]) * (code[k] - 1)`.
/// `words` holds `K/16` words and `scales` `K/256` f16 bit patterns.
#[inline(always)]
pub fn row_values(words: &[u32], scales: &[u16], out: &mut [f32]) {
    for ((wb, &s), ob) in words
        .chunks_exact(WORDS_PER_BLOCK)
        .zip(scales)
        .zip(out.chunks_exact_mut(BLOCK))
    {
        let d = half::f16::from_bits(s).to_f32();
        for (&w, o) in wb.iter().zip(ob.chunks_exact_mut(CODES_PER_WORD)) {
            for (j, v) in o.iter_mut().enumerate() {
                let code = ((w >> (2 * j)) & 3) as i8;
                *v = d * (code - 1) as f32;
            }
        }
    }
}

/// Whether a `[N, K]` ternary weight fits the GPU kernel's fast path: K a multiple of 512
/// (two blocks per SIMD lane group) and N a multiple of 32 (rows per threadgroup).
pub fn fast_path(n: u64, k: u64) -> bool {
    k.is_multiple_of(512) && n.is_multiple_of(32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundf_is_half_away_from_zero() {
        assert_eq!(np_roundf(0.5), 1.0);
        assert_eq!(np_roundf(-0.5), -1.0);
        assert_eq!(np_roundf(0.49999997), 0.0);
        assert_eq!(np_roundf(1.0000001), 1.0);
        // numpy: np.sign(np.float32(-0.0)) * 0 == +0.0.
        assert_eq!(np_roundf(-0.0).to_bits(), 0.0f32.to_bits());
    }

    #[test]
    fn pack_and_row_values_invert() {
        let mut codes = [0u8; BLOCK];
        for (i, c) in codes.iter_mut().enumerate() {
            *c = (i % 3) as u8;
        }
        let mut words = [0u32; WORDS_PER_BLOCK];
        pack_block(&codes, &mut words);
        assert_eq!(words[0] & 3, 0);
        assert_eq!((words[0] >> 2) & 3, 1);
        assert_eq!((words[0] >> 4) & 3, 2);
        let d = half::f16::from_f32(0.5);
        let mut out = [0f32; BLOCK];
        row_values(&words, &[d.to_bits()], &mut out);
        for (i, v) in out.iter().enumerate() {
            assert_eq!(*v, 0.5 * ((i % 3) as f32 - 1.0));
        }
    }

    #[test]
    fn recover_rejects_code_three_and_nonfinite() {
        let mut codes = [1u8; BLOCK];
        codes[7] = 3;
        let w = [0f32; BLOCK];
        assert_eq!(
            recover_block(0x3c00, &codes, &w),
            Err(BlockFault::CodeThree { element: 7 })
        );
        assert_eq!(
            recover_block(0x7c00, &[1u8; BLOCK], &w),
            Err(BlockFault::NonFiniteScale { d_bits: 0x7c00 })
        );
    }

    /// A small deterministic generator (xorshift64*), so the tests need no crate.
    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed | 1;
        move || {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            s.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }

    #[test]
    fn code_domain_recovery_equals_the_value_route() {
        use crate::quant::ternary::dequant_tq2_0;
        let mut next = rng(7);
        // Random codes in {0, 1, 2} under scales of every kind (positive, negative, +/-0,
        // subnormal, the largest finite), plus all-ones blocks.
        let scales = [
            0x3c00u16, 0xbc00, 0x0000, 0x8000, 0x0001, 0x83ff, 0x7bff, 0x2e66, 0xa8f5,
        ];
        for (i, &d_bits) in scales.iter().cycle().take(200).enumerate() {
            let mut codes = [0u8; BLOCK];
            for c in codes.iter_mut() {
                *c = if i % 5 == 4 { 1 } else { (next() % 3) as u8 };
            }
            let bytes = tq2_0_bytes(&TernaryBlock { d_bits, codes });
            let blk: &BlockTQ2_0 = bytemuck::from_bytes(&bytes);
            let mut w = [0f32; BLOCK];
            dequant_tq2_0(std::slice::from_ref(blk), &mut w);
            let by_values = recover_block(d_bits, &tq2_0_codes(blk), &w).unwrap();
            let mut want = [0u32; WORDS_PER_BLOCK];
            pack_block(&by_values.codes, &mut want);
            let mut got = [0u32; WORDS_PER_BLOCK];
            let d = recover_tq2_0_words(&bytes, &mut got).unwrap();
            assert_eq!((d, got), (by_values.d_bits, want), "block {i}");
            let qs: Vec<u8> = tq2_0_qs_lanes_from_words(&got)
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            assert_eq!(qs, bytes[..64], "block {i}");
        }
    }

    #[test]
    fn code_domain_recovery_names_the_faults() {
        let mut codes = [1u8; BLOCK];
        codes[200] = 3;
        let bytes = tq2_0_bytes(&TernaryBlock {
            d_bits: 0x3c00,
            codes,
        });
        let mut words = [0u32; WORDS_PER_BLOCK];
        assert_eq!(
            recover_tq2_0_words(&bytes, &mut words),
            Err(BlockFault::CodeThree { element: 200 })
        );
        for d_bits in [0x7c00u16, 0xfc00, 0x7e00] {
            let bytes = tq2_0_bytes(&TernaryBlock {
                d_bits,
                codes: [1; BLOCK],
            });
            assert_eq!(
                recover_tq2_0_words(&bytes, &mut words),
                Err(BlockFault::NonFiniteScale { d_bits })
            );
        }
    }

    #[test]
    fn quantizer_roundtrips_through_tq2_bytes() {
        let x: Vec<f32> = (0..BLOCK).map(|i| (i as f32 - 128.0) / 64.0).collect();
        let b = quantize_tq2_0_block(&x).unwrap();
        let bytes = tq2_0_bytes(&b);
        let (d, codes) = decode_block(GgmlType::TQ2_0, &bytes).unwrap();
        assert_eq!(d, b.d_bits);
        assert_eq!(codes, b.codes);
    }
}
