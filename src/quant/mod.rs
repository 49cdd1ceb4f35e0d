//! Dequantization of GGML block formats to f32, bit-exact with gguf-py's
//! `gguf.quants.dequantize` (PyPI `gguf` 0.19.0).
//!
//! Input: the tensor's raw bytes, `n_blocks * type_size` long. Output: `n_blocks *
//! block_size` f32 values in the order they are stored, which for a GGUF tensor is row-major
//! with `ne[0]` fastest.
//!
//! Bit-exactness rests on three rules, each matching numpy's evaluation of gguf-py's code:
//! every f16 scale widens exactly to f32; every product and sum is an f32 operation rounded on
//! its own (Rust never contracts `a * b + c` into a fused multiply-add, and this crate never
//! calls `mul_add`); and integer fields wrap exactly as numpy's fixed-width integers do.
//!
//! Speed: the same loop bodies are compiled twice, once for the baseline target and once with
//! AVX2 enabled, and the AVX2 copy is chosen at run time when the CPU has it. Only the
//! instruction selection differs; the f32 operations and their order do not, so both give the
//! same bits (checked by `tests/dequant_vectors.rs`). F16 tensors on the AVX2 path use the
//! F16C conversion instruction when present, which widens exactly as the portable code does.

pub mod float;
pub mod kquants;
pub mod legacy;
pub mod ternary;

use rayon::prelude::*;

use crate::ggml::GgmlType;

/// Why a dequantization could not run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum DequantError {
    /// The type has no dequantizer here.
    #[error("unsupported type {ty} (ggml type id {id}): dequantize supports F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, TQ1_0, TQ2_0")]
    Unsupported { ty: GgmlType, id: u32 },
    /// Input is not a whole number of blocks, or output length does not match.
    #[error("{ty}: {src_len} input bytes and {dst_len} output values do not describe whole blocks of {block_size} elements / {type_size} bytes")]
    Length {
        ty: GgmlType,
        src_len: usize,
        dst_len: usize,
        block_size: usize,
        type_size: usize,
    },
}

/// Widens an IEEE binary16 scale stored little-endian. Exact for every input.
#[inline(always)]
pub fn f16_to_f32(b: [u8; 2]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes(b)).to_f32()
}

/// Widens IEEE binary16 bits to f32: exact for every finite value and infinity, the same
/// value as numpy's `astype(float32)`; a NaN stays a NaN with its sign and payload (shifted
/// up 13 bits) and is made quiet, the same bits as F16C's `vcvtph2ps` and `half`.
/// Branch-free, so a loop of it vectorizes; `half`'s `to_f32` checks for F16C at run time on
/// every call unless the crate itself was built with F16C, which keeps such loops scalar.
#[inline(always)]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    let exp = em & 0x7c00;
    // Normal: rebias the exponent from 15 to 127. Inf/NaN: exponent 31 becomes 255.
    let normal = (em << 13) + ((127 - 15) << 23);
    let quiet = if em & 0x03ff != 0 { 0x0040_0000 } else { 0 };
    let inf_nan = ((em << 13) + ((255 - 31) << 23)) | quiet;
    // Zero and subnormal: the value is mantissa * 2^-24, exact in f32 (a normal f32).
    let sub = (em as f32 * (1.0 / 16_777_216.0)).to_bits();
    let bits = if exp == 0x7c00 {
        inf_nan
    } else if exp == 0 {
        sub
    } else {
        normal
    };
    f32::from_bits(bits | sign)
}

/// Which code path [`dequantize`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// The baseline build (SSE2 on x86-64), available everywhere.
    Scalar,
    /// The same code compiled with AVX2 enabled; F16 tensors use F16C's `vcvtph2ps` as well
    /// when the CPU has it (same bits as the portable widening, see `f16_bits_to_f32`).
    Avx2,
}

/// The fastest path this CPU supports.
pub fn detected_path() -> Path {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            return Path::Avx2;
        }
    }
    Path::Scalar
}

/// Defines a function whose body is compiled twice, for the baseline target and with AVX2
/// enabled, and dispatches to the AVX2 copy at run time when the CPU has it. The body's
/// floating-point operations and their order are the same in both copies (Rust never fuses
/// or reorders them), so both give the same bits; only the vector width differs.
///
/// One type parameter with one bound may be given (`fn name<T: Bound>(...)`); both copies
/// are generic over it.
///
/// Functions called from the body must be `#[inline(always)]` to be compiled with AVX2 too.
/// (A closure passed to a `#[target_feature]` function is not: it stays a baseline function,
/// which is why this is a macro.)
#[macro_export]
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident $(<$g:ident : $gb:path>)? ($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name $(<$g: $gb>)? ($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn body $(<$g: $gb>)? ($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2 $(<$g: $gb>)? ($($arg: $ty),*) $(-> $ret)? {
                    body $(::<$g>)? ($($arg),*)
                }
                if std::is_x86_feature_detected!("avx2") {
                    // SAFETY: AVX2 is present, checked on the line above.
                    return unsafe { avx2 $(::<$g>)? ($($arg),*) };
                }
            }
            body $(::<$g>)? ($($arg),*)
        }
    };
}

fn check_len(ty: GgmlType, src: &[u8], dst: &[f32]) -> Result<usize, DequantError> {
    if !ty.can_dequantize() {
        return Err(DequantError::Unsupported { ty, id: ty.id() });
    }
    let (bs, ts) = (ty.block_size(), ty.type_size());
    let n_blocks = src.len() / ts;
    if !src.len().is_multiple_of(ts) || n_blocks.checked_mul(bs) != Some(dst.len()) {
        return Err(DequantError::Length {
            ty,
            src_len: src.len(),
            dst_len: dst.len(),
            block_size: bs,
            type_size: ts,
        });
    }
    Ok(n_blocks)
}

/// Dequantizes `src` (whole blocks of `ty`) into `dst` on the calling thread, using
/// [`detected_path`].
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), DequantError> {
    dequantize_with(detected_path(), ty, src, dst)
}

/// As [`dequantize`] with an explicit code path (for testing that paths agree). A path the
/// CPU lacks falls back to [`Path::Scalar`].
pub fn dequantize_with(
    path: Path,
    ty: GgmlType,
    src: &[u8],
    dst: &mut [f32],
) -> Result<(), DequantError> {
    check_len(ty, src, dst)?;
    #[cfg(target_arch = "x86_64")]
    {
        if path == Path::Avx2 && std::is_x86_feature_detected!("avx2") {
            if ty == GgmlType::F16 && std::is_x86_feature_detected!("f16c") {
                // SAFETY: AVX2 and F16C are present, checked on the lines above.
                unsafe { float::dequant_f16_f16c(src, dst) };
                return Ok(());
            }
            // SAFETY: AVX2 is present, checked on the line above.
            unsafe { dequant_avx2(ty, src, dst) };
            return Ok(());
        }
    }
    let _ = path;
    dequant_body(ty, src, dst);
    Ok(())
}

/// Dequantizes on the rayon pool, splitting the blocks into chunks of about 64 KiB of
/// output. Same bits as [`dequantize`] whatever the thread count.
pub fn dequantize_par(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), DequantError> {
    let n_blocks = check_len(ty, src, dst)?;
    let (bs, ts) = (ty.block_size(), ty.type_size());
    let blocks_per_chunk = (16384 / bs).max(1);
    let path = detected_path();
    if n_blocks <= blocks_per_chunk {
        return dequantize_with(path, ty, src, dst);
    }
    src.par_chunks(blocks_per_chunk * ts)
        .zip(dst.par_chunks_mut(blocks_per_chunk * bs))
        .try_for_each(|(s, d)| dequantize_with(path, ty, s, d))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dequant_avx2(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    dequant_body(ty, src, dst)
}

/// Dequantizes whole blocks without the run-time dispatch, for callers that are themselves
/// compiled per target (see [`multiversion`]). Does nothing for a type without a
/// dequantizer or a length that is not whole blocks (callers check both beforehand).
#[inline(always)]
pub fn dequantize_body_checked(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    if check_len(ty, src, dst).is_ok() {
        dequant_body(ty, src, dst);
    }
}

/// The one implementation; lengths are already checked.
#[inline(always)]
fn dequant_body(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    use bytemuck::cast_slice;
    match ty {
        GgmlType::F32 => float::dequant_f32(src, dst),
        GgmlType::F16 => float::dequant_f16(src, dst),
        GgmlType::BF16 => float::dequant_bf16(src, dst),
        GgmlType::Q4_0 => legacy::dequant_q4_0(cast_slice(src), dst),
        GgmlType::Q4_1 => legacy::dequant_q4_1(cast_slice(src), dst),
        GgmlType::Q5_0 => legacy::dequant_q5_0(cast_slice(src), dst),
        GgmlType::Q5_1 => legacy::dequant_q5_1(cast_slice(src), dst),
        GgmlType::Q8_0 => legacy::dequant_q8_0(cast_slice(src), dst),
        GgmlType::Q2_K => kquants::dequant_q2_k(cast_slice(src), dst),
        GgmlType::Q3_K => kquants::dequant_q3_k(cast_slice(src), dst),
        GgmlType::Q4_K => kquants::dequant_q4_k(cast_slice(src), dst),
        GgmlType::Q5_K => kquants::dequant_q5_k(cast_slice(src), dst),
        GgmlType::Q6_K => kquants::dequant_q6_k(cast_slice(src), dst),
        GgmlType::TQ1_0 => ternary::dequant_tq1_0(cast_slice(src), dst),
        GgmlType::TQ2_0 => ternary::dequant_tq2_0(cast_slice(src), dst),
        // check_len refused every other type.
        _ => unreachable!("unsupported type passed the length check"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The branch-free widening gives `half`'s bits for every binary16 pattern, NaNs included
    /// (both quiet a signalling NaN and keep its payload).
    #[test]
    fn f16_bits_to_f32_matches_half() {
        for h in 0..=u16::MAX {
            let got = f16_bits_to_f32(h);
            let want = half::f16::from_bits(h).to_f32();
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{h:#06x}: {got:e} vs {want:e}"
            );
        }
    }

    /// The F16C path gives the same bits as the portable one on every binary16 pattern.
    #[test]
    fn f16_paths_agree_on_every_pattern() {
        let src: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
        // Start one element in (not 16-byte aligned) and end 4 short of a multiple of 8, so the
        // F16C loop's unaligned loads and its scalar tail both run.
        let src = &src[2..src.len() - 6];
        let mut a = vec![0f32; src.len() / 2];
        let mut b = vec![0f32; src.len() / 2];
        dequantize_with(Path::Scalar, GgmlType::F16, src, &mut a).unwrap();
        dequantize_with(Path::Avx2, GgmlType::F16, src, &mut b).unwrap();
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(x.to_bits(), y.to_bits(), "element {i}");
        }
    }
}
