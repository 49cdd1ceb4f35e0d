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
        // The 32 high bits spread to byte lanes (bit j to bit 4 of byte j) once per block, so
        // the element loop is byte arithmetic that vectorizes (no per-lane variable shift).
        let h = high_bits_to_bytes(qh);
        let (lo, hi) = y.split_at_mut(16);
        for j in 0..16 {
            lo[j] = d * (((b.qs[j] & 0x0F) | h[j]) as i8 - 16) as f32;
            hi[j] = d * (((b.qs[j] >> 4) | h[j + 16]) as i8 - 16) as f32;
        }
    }
}

/// Bit `j` of `qh` as bit 4 of byte `j` (0x10 or 0), for the 32 bits of a Q5 block's `qh`.
#[inline(always)]
fn high_bits_to_bytes(qh: u32) -> [u8; 32] {
    let mut h = [0u8; 32];
    for (k, c) in h.chunks_exact_mut(8).enumerate() {
        let byte = (qh >> (8 * k)) & 0xff;
        // Each byte of the product holds the 8 bits; lane i keeps bit i, then moves it to bit 4.
        let spread = (byte as u64).wrapping_mul(0x0101_0101_0101_0101) & 0x8040_2010_0804_0201;
        // Lane i is nonzero iff bit i is set: adding 0x7f to each lane's value (at most 0x80)
        // sets the lane's top bit exactly then, without carrying into the next lane.
        let top = (spread + 0x7f7f_7f7f_7f7f_7f7f) & 0x8080_8080_8080_8080;
        c.copy_from_slice(&(top >> 3).to_le_bytes());
    }
    h
}

#[inline(always)]
pub fn dequant_q5_1(blocks: &[BlockQ5_1], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK4_0)) {
        let d = f16_to_f32(b.d);
        let m = f16_to_f32(b.m);
        let qh = u32::from_le_bytes(b.qh);
        let (lo, hi) = y.split_at_mut(16);
        let h = high_bits_to_bytes(qh);
        for j in 0..16 {
            lo[j] = d * ((b.qs[j] & 0x0F) | h[j]) as f32 + m;
            hi[j] = d * ((b.qs[j] >> 4) | h[j + 16]) as f32 + m;
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
