//! The 32-element "legacy" block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
//!
//! Formulas follow gguf-py 0.19.0 `gguf/quants.py` (`Q4_0.dequantize_blocks`, ...), which
//! matches `dequantize_row_q4_0` and friends in ggml `ggml/src/ggml-quants.c`. Element `j` of
//! a block is at position `j` of the output; nibble-packed formats keep elements `0..16` in
//! the low nibbles of `qs` and `16..32` in the high nibbles.
//!
//! Arithmetic is f32 with each multiply and add rounded separately (`d * q + m`, never fused),
//! exactly as numpy evaluates it.

use super::f16_to_f32;

pub const QK4_0: usize = 32;

/// `block_q4_0`: `x = d * (q - 8)`, q in 0..16.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK4_0 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

/// `block_q4_1`: `x = d * q + m`, q in 0..16.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qs: [u8; QK4_0 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

/// `block_q5_0`: `x = d * (q - 16)`, q in 0..32; bit 4 of element j is bit j of `qh`
/// (little-endian u32).
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5_0 {
    pub d: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK4_0 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

/// `block_q5_1`: `x = d * q + m`, q in 0..32.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK4_0 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

/// `block_q8_0`: `x = q * d`, q an i8.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ8_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK4_0],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

#[inline(always)]
pub fn dequant_q4_0(blocks: &[BlockQ4_0], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK4_0)) {
        let d = f16_to_f32(b.d);
        let (lo, hi) = y.split_at_mut(16);
        for j in 0..16 {
            lo[j] = d * ((b.qs[j] & 0x0F) as i8 - 8) as f32;
            hi[j] = d * ((b.qs[j] >> 4) as i8 - 8) as f32;
        }
    }
}

#[inline(always)]
pub fn dequant_q4_1(blocks: &[BlockQ4_1], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK4_0)) {
        let d = f16_to_f32(b.d);
        let m = f16_to_f32(b.m);
        let (lo, hi) = y.split_at_mut(16);
        for j in 0..16 {
            lo[j] = d * (b.qs[j] & 0x0F) as f32 + m;
            hi[j] = d * (b.qs[j] >> 4) as f32 + m;
        }
    }
}

#[inline(always)]
pub fn dequant_q5_0(blocks: &[BlockQ5_0], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK4_0)) {
        let d = f16_to_f32(b.d);
        let qh = u32::from_le_bytes(b.qh);
        let (lo, hi) = y.split_at_mut(16);
        for j in 0..16 {
            let h0 = ((qh >> j) & 1) as u8;
            let h1 = ((qh >> (j + 16)) & 1) as u8;
            lo[j] = d * (((b.qs[j] & 0x0F) | (h0 << 4)) as i8 - 16) as f32;
            hi[j] = d * (((b.qs[j] >> 4) | (h1 << 4)) as i8 - 16) as f32;
        }
    }
}

#[inline(always)]
pub fn dequant_q5_1(blocks: &[BlockQ5_1], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK4_0)) {
        let d = f16_to_f32(b.d);
        let m = f16_to_f32(b.m);
        let qh = u32::from_le_bytes(b.qh);
        let (lo, hi) = y.split_at_mut(16);
        for j in 0..16 {
            let h0 = ((qh >> j) & 1) as u8;
            let h1 = ((qh >> (j + 16)) & 1) as u8;
            lo[j] = d * ((b.qs[j] & 0x0F) | (h0 << 4)) as f32 + m;
            hi[j] = d * ((b.qs[j] >> 4) | (h1 << 4)) as f32 + m;
        }
    }
}

#[inline(always)]
pub fn dequant_q8_0(blocks: &[BlockQ8_0], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK4_0)) {
        let d = f16_to_f32(b.d);
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = (q as i8) as f32 * d;
        }
    }
}
