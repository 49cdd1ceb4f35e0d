//! The k-quants: 256-element super-blocks with per-sub-block scales. Q2_K, Q3_K, Q4_K, Q5_K,
//! Q6_K.
//!
//! Formulas follow gguf-py 0.19.0 `gguf/quants.py` (`Q2_K.dequantize_blocks`, ...), which
//! matches `dequantize_row_q2_K` and friends in ggml `ggml/src/ggml-quants.c`. The sub-block
//! scale is computed first as its own f32 product (`dl = d * sc`, `ml = dmin * m`), then each
//! element as `dl * q - ml`, with the multiply and the subtract rounded separately.
//!
//! Within a super-block element `e` has index `e` in the output. The 2-bit fields (Q2_K,
//! Q3_K low bits, Q6_K high bits) are laid out as two halves of 128 elements; in half `h` the
//! element `h*128 + s*32 + l` sits in bits `2s..2s+2` of byte `h*32 + l`.

use super::f16_to_f32;
use crate::ggml::QK_K;

/// `K_SCALE_SIZE`: bytes of packed 6-bit scales and mins in Q4_K and Q5_K.
pub const K_SCALE_SIZE: usize = 12;

/// `block_q2_K`: 16 sub-blocks of 16; 4-bit scale (low nibble) and 4-bit min (high nibble) per
/// sub-block; `x = d*sc * q - dmin*m`, q in 0..4.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: [u8; 2],
    pub dmin: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);

/// `block_q3_K`: 16 sub-blocks of 16; 6-bit signed scales (offset 32); q = low 2 bits from
/// `qs` minus 4 where the `hmask` bit is clear.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);

/// `block_q4_K`: 8 sub-blocks of 32; 6-bit scales and mins packed in 12 bytes;
/// `x = d*sc * q - dmin*m`, q in 0..16.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

/// `block_q5_K`: as Q4_K plus a fifth bit per element in `qh`; q in 0..32.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

/// `block_q6_K`: 16 sub-blocks of 16 with i8 scales; `x = (d*sc) * (q - 32)`, q in 0..64.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [u8; QK_K / 16],
    pub d: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

#[inline(always)]
pub fn dequant_q2_k(blocks: &[BlockQ2K], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let dmin = f16_to_f32(b.dmin);
        for (h, yh) in y.chunks_exact_mut(128).enumerate() {
            let qs = &b.qs[h * 32..h * 32 + 32];
            for (s, ys) in yh.chunks_exact_mut(32).enumerate() {
                // Elements h*128 + s*32 + l: bits 2s..2s+2 of qs[h*32 + l]; sub-block
                // h*8 + s*2 for l < 16, the next one for l >= 16.
                let sb = h * 8 + s * 2;
                let dl1 = d * (b.scales[sb] & 0x0F) as f32;
                let ml1 = dmin * (b.scales[sb] >> 4) as f32;
                let dl2 = d * (b.scales[sb + 1] & 0x0F) as f32;
                let ml2 = dmin * (b.scales[sb + 1] >> 4) as f32;
                let (lo, hi) = ys.split_at_mut(16);
                for ((o, &q), (o2, &q2)) in lo
                    .iter_mut()
                    .zip(&qs[..16])
                    .zip(hi.iter_mut().zip(&qs[16..]))
                {
                    *o = dl1 * ((q >> (2 * s)) & 3) as f32 - ml1;
                    *o2 = dl2 * ((q2 >> (2 * s)) & 3) as f32 - ml2;
                }
            }
        }
    }
}

/// Unpacks Q3_K's 16 six-bit scales (see the bit diagram in gguf-py's `Q3_K`), minus 32.
#[inline(always)]
pub fn q3_k_scales(scales: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let low = if i < 8 {
            scales[i] & 0x0F
        } else {
            scales[i - 8] >> 4
        };
        let high = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

#[inline(always)]
pub fn dequant_q3_k(blocks: &[BlockQ3K], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let sc = q3_k_scales(&b.scales);
        for (h, yh) in y.chunks_exact_mut(128).enumerate() {
            let qs = &b.qs[h * 32..h * 32 + 32];
            for (s, ys) in yh.chunks_exact_mut(32).enumerate() {
                // Elements h*128 + s*32 + l: low bits 2s..2s+2 of qs[h*32 + l], high bit
                // h*4 + s of hmask[l]; sub-block h*8 + s*2 for l < 16, the next for l >= 16.
                let sb = h * 8 + s * 2;
                let bit = h * 4 + s;
                let dl1 = d * sc[sb] as f32;
                let dl2 = d * sc[sb + 1] as f32;
                for (l, o) in ys.iter_mut().enumerate() {
                    let ql = ((qs[l] >> (2 * s)) & 3) as i8;
                    let qh = ((b.hmask[l] >> bit) & 1) ^ 1;
                    let q = (ql - ((qh << 2) as i8)) as f32;
                    *o = if l < 16 { dl1 * q } else { dl2 * q };
                }
            }
        }
    }
}

/// Unpacks the 8 six-bit scales and 8 six-bit mins of Q4_K/Q5_K (`get_scale_min_k4`).
#[inline(always)]
pub fn get_scale_min_k4(scales: &[u8; K_SCALE_SIZE]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..4 {
        sc[j] = scales[j] & 0x3F;
        mn[j] = scales[j + 4] & 0x3F;
        sc[j + 4] = (scales[j + 8] & 0x0F) | ((scales[j] >> 2) & 0x30);
        mn[j + 4] = (scales[j + 8] >> 4) | ((scales[j + 4] >> 2) & 0x30);
    }
    (sc, mn)
}

#[inline(always)]
pub fn dequant_q4_k(blocks: &[BlockQ4K], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let dmin = f16_to_f32(b.dmin);
        let (sc, mn) = get_scale_min_k4(&b.scales);
        for (c, yc) in y.chunks_exact_mut(64).enumerate() {
            let d1 = d * sc[2 * c] as f32;
            let m1 = dmin * mn[2 * c] as f32;
            let d2 = d * sc[2 * c + 1] as f32;
            let m2 = dmin * mn[2 * c + 1] as f32;
            let qs = &b.qs[c * 32..c * 32 + 32];
            let (lo, hi) = yc.split_at_mut(32);
            for l in 0..32 {
                lo[l] = d1 * (qs[l] & 0x0F) as f32 - m1;
                hi[l] = d2 * (qs[l] >> 4) as f32 - m2;
            }
        }
    }
}

#[inline(always)]
pub fn dequant_q5_k(blocks: &[BlockQ5K], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let dmin = f16_to_f32(b.dmin);
        let (sc, mn) = get_scale_min_k4(&b.scales);
        for (c, yc) in y.chunks_exact_mut(64).enumerate() {
            let d1 = d * sc[2 * c] as f32;
            let m1 = dmin * mn[2 * c] as f32;
            let d2 = d * sc[2 * c + 1] as f32;
            let m2 = dmin * mn[2 * c + 1] as f32;
            let qs = &b.qs[c * 32..c * 32 + 32];
            let (lo, hi) = yc.split_at_mut(32);
            for l in 0..32 {
                let h1 = ((b.qh[l] >> (2 * c)) & 1) << 4;
                let h2 = ((b.qh[l] >> (2 * c + 1)) & 1) << 4;
                lo[l] = d1 * ((qs[l] & 0x0F) | h1) as f32 - m1;
                hi[l] = d2 * ((qs[l] >> 4) | h2) as f32 - m2;
            }
        }
    }
}

#[inline(always)]
pub fn dequant_q6_k(blocks: &[BlockQ6K], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let mut ds = [0f32; 16];
        for (i, v) in ds.iter_mut().enumerate() {
            *v = d * (b.scales[i] as i8) as f32;
        }
        for (h, yh) in y.chunks_exact_mut(128).enumerate() {
            let ql = &b.ql[h * 64..h * 64 + 64];
            let qh = &b.qh[h * 32..h * 32 + 32];
            for (s, ys) in yh.chunks_exact_mut(32).enumerate() {
                // Elements h*128 + s*32 + l: low nibble of ql[(s%2)*32 + l] shifted by 4*(s/2),
                // high bits (qh[l] >> 2s) & 3.
                let lq = &ql[(s % 2) * 32..(s % 2) * 32 + 32];
                let shift = 4 * (s / 2);
                let sb = h * 8 + s * 2;
                let (d1, d2) = (ds[sb], ds[sb + 1]);
                for l in 0..32 {
                    let q = ((lq[l] >> shift) & 0x0F) | (((qh[l] >> (2 * s)) & 3) << 4);
                    let q = (q as i8 - 32) as f32;
                    ys[l] = if l < 16 { d1 * q } else { d2 * q };
                }
            }
        }
    }
}
