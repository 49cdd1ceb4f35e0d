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
        *o = super::f16_bits_to_f32(u16::from_le_bytes([s[0], s[1]]));
    }
}

#[inline(always)]
pub fn dequant_bf16(src: &[u8], out: &mut [f32]) {
    for (s, o) in src.chunks_exact(2).zip(out.iter_mut()) {
        *o = f32::from_bits((u16::from_le_bytes([s[0], s[1]]) as u32) << 16);
    }
}

/// F16 with the F16C instruction `vcvtph2ps`, 8 values at a time: exact like
/// [`super::f16_bits_to_f32`] for every non-NaN input (a NaN stays a NaN, quieted).
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn dequant_f16_f16c(src: &[u8], out: &mut [f32]) {
    use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
    let n = out.len().min(src.len() / 2);
    let (src, out) = (&src[..2 * n], &mut out[..n]);
    let mut s8 = src.chunks_exact(16);
    let mut o8 = out.chunks_exact_mut(8);
    for (s, o) in (&mut s8).zip(&mut o8) {
        // SAFETY: s is 16 bytes and o is 8 f32; both intrinsics take unaligned pointers.
        unsafe {
            let h = _mm_loadu_si128(s.as_ptr().cast::<__m128i>());
            _mm256_storeu_ps(o.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
    dequant_f16(s8.remainder(), o8.into_remainder());
}
