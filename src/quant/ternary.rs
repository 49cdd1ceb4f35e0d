//! Ternary formats: TQ1_0 and TQ2_0 (256-element blocks, values `d * {-1, 0, +1}`).
//!
//! Formulas follow gguf-py 0.19.0 `gguf/quants.py` (`TQ1_0.dequantize_blocks`,
//! `TQ2_0.dequantize_blocks`), which match `dequantize_row_tq1_0`/`_tq2_0` in ggml
//! `ggml/src/ggml-quants.c`.

use super::f16_to_f32;
use crate::ggml::QK_K;

/// `block_tq1_0`: base-3 packing, 5 trits per byte in `qs` (160 + 80 elements) and 4 per
/// byte in `qh` (16 elements); `x = d * (trit - 1)`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockTQ1_0 {
    pub qs: [u8; (QK_K - 4 * QK_K / 64) / 5],
    pub qh: [u8; QK_K / 64],
    pub d: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockTQ1_0>() == 54);

/// `block_tq2_0`: 2-bit codes, element `h*128 + s*32 + l` in bits `2s..2s+2` of
/// `qs[h*32 + l]`; `x = d * (code - 1)`. Code 3 (`+2d`) is representable but never written by
/// the quantizer.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockTQ2_0 {
    pub qs: [u8; QK_K / 4],
    pub d: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockTQ2_0>() == 66);

/// Powers of three used to shift a trit to the top of a byte.
const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// The trit (0, 1 or 2) stored at position `k` of a packed byte, as ggml extracts it:
/// `((u8)(byte * 3^k) as u16 * 3) >> 8`. The u8 multiply wraps, as in C and in numpy.
#[inline(always)]
pub fn tq1_trit(byte: u8, k: usize) -> u8 {
    let q = byte.wrapping_mul(POW3[k]);
    ((q as u16 * 3) >> 8) as u8
}

/// TQ1_0 codes (0, 1, 2) of one block in element order.
#[inline(always)]
pub fn tq1_0_codes(b: &BlockTQ1_0) -> [u8; QK_K] {
    let mut c = [0u8; QK_K];
    for k in 0..5 {
        for l in 0..32 {
            c[k * 32 + l] = tq1_trit(b.qs[l], k);
        }
        for l in 0..16 {
            c[160 + k * 16 + l] = tq1_trit(b.qs[32 + l], k);
        }
    }
    for k in 0..4 {
        for l in 0..4 {
            c[240 + k * 4 + l] = tq1_trit(b.qh[l], k);
        }
    }
    c
}

/// TQ2_0 codes (0..4) of one block in element order.
#[inline(always)]
pub fn tq2_0_codes(b: &BlockTQ2_0) -> [u8; QK_K] {
    let mut c = [0u8; QK_K];
    for h in 0..2 {
        for s in 0..4 {
            for l in 0..32 {
                c[h * 128 + s * 32 + l] = (b.qs[h * 32 + l] >> (2 * s)) & 3;
            }
        }
    }
    c
}

#[inline(always)]
pub fn dequant_tq1_0(blocks: &[BlockTQ1_0], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let codes = tq1_0_codes(b);
        for (o, &c) in y.iter_mut().zip(codes.iter()) {
            *o = d * (c as i8 - 1) as f32;
        }
    }
}

#[inline(always)]
pub fn dequant_tq2_0(blocks: &[BlockTQ2_0], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        for (h, yh) in y.chunks_exact_mut(128).enumerate() {
            let qs = &b.qs[h * 32..h * 32 + 32];
            for (s, ys) in yh.chunks_exact_mut(32).enumerate() {
                for l in 0..32 {
                    ys[l] = d * (((qs[l] >> (2 * s)) & 3) as i8 - 1) as f32;
                }
            }
        }
    }
}
