//! Plain float element types: F32, F16 (IEEE binary16) and BF16 (bfloat16).
//!
//! F16 widens exactly (every binary16 value, subnormals included, is an f32 value); BF16 is the
//! top half of an f32 (`bits << 16`), as gguf-py's `BF16.dequantize_blocks`.

#[inline(always)]
pub fn dequant_f32(src: &[u8], out: &mut [f32]) {
    for (s, o) in src.chunks_exact(4).zip(out.iter_mut()) {
        *o = f32::from_bits(u32::from_le_bytes([s[0], s[1], s[2], s[3]]));
    }
}

#[inline(always)]
pub fn dequant_f16(src: &[u8], out: &mut [f32]) {
    for (s, o) in src.chunks_exact(2).zip(out.iter_mut()) {
        *o = super::f16_to_f32([s[0], s[1]]);
    }
}

#[inline(always)]
pub fn dequant_bf16(src: &[u8], out: &mut [f32]) {
    for (s, o) in src.chunks_exact(2).zip(out.iter_mut()) {
        *o = f32::from_bits((u16::from_le_bytes([s[0], s[1]]) as u32) << 16);
    }
}
