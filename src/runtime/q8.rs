//! Integer matrix-vector kernels (`--kernel int8`): the activations are quantized to int8 once
//! per input vector, each weight block's dot product with them is computed exactly in
//! integers, and the blocks' f32 terms are summed in one fixed order. As llama.cpp's CPU
//! backend does (`ggml/src/ggml-cpu/arch/x86/quants.c`, `ggml_vec_dot_*_q8_*`), with our own
//! activation format and summation order.
//!
//! Activations ([`QAct`]): per block of `B` values (32 for the legacy 32-element types, 256 for
//! the k-quants and ternary), `d = max|x| / 127`, `q = round(x * (1 / d))` (half away from
//! zero, clamped to ±127), `d = 0` for an all-zero block; `x[k] ~= d[k / B] * q[k]`. Also the
//! sum of `q` over every 16 values.
//!
//! Block terms, with `dw`, `mw` the block's f16 scale and min widened to f32, `da` the
//! activation scale, `isum` an exact integer dot product over the block:
//!
//! ```text
//! ternary (256)   (dw * da) * f32(sum c*q - sum q)                  c in {0, 1, 2}
//! Q8_0 (32)       (dw * da) * f32(sum w*q)
//! Q4_0 (32)       (dw * da) * f32(sum w*q - 8 sum q)                w in 0..16
//! Q4_1 (32)       (dw * da) * f32(sum w*q) + (mw * da) * f32(sum q)
//! Q5_0 (32)       (dw * da) * f32(sum w*q - 16 sum q)               w in 0..32
//! Q5_1 (32)       (dw * da) * f32(sum w*q) + (mw * da) * f32(sum q) w in 0..32
//! Q4_K (256)      (d * da) * f32(sum_j sc_j sum_{32} w*q) - (dmin * da) * f32(sum_j m_j sum_{32} q)
//! Q5_K (256)      as Q4_K                                           w in 0..32
//! Q6_K (256)      (d * da) * f32(sum_j sc_j (sum_{16} w*q - 32 sum_{16} q))   w in 0..64
//! ```
//!
//! A row's result: block `b`'s term is added to lane `b % 8` of eight f32 accumulators (blocks
//! in order), then `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`. Every f32 operation is a
//! separate multiply or add (no fused multiply-add), so the portable path, the AVX2 path and
//! the AVX-512 VNNI path give the same bits; the tests compare them.
//!
//! The integer sums cannot overflow: `maddubs` pairs stay below 2^15 (|w| <= 128, |q| <= 127,
//! two products; Q6_K 63 * 127 * 2; Q5_0 31 * 127 * 2), block sums below 2^31.
//!
//! Q5_0 and Q5_1 (`ggml_vec_dot_q5_0_q8_0`, `ggml_vec_dot_q5_1_q8_1` in the same llama.cpp
//! file): weight `k` of a block is `(qs nibble) | (bit k of qh) << 4` (`legacy::BlockQ5_0`,
//! `BlockQ5_1`), `w - 16` the signed Q5_0 code. For Q5_0 llama.cpp folds the `- 16` into the
//! bytes and multiplies signed by signed; we keep `w` unsigned for `maddubs` / `vpdpbusd` and
//! subtract `16 sum q` from the exact sum, as Q4_0 does with 8. Q5_1 takes the min as Q4_1
//! does (llama.cpp reads `m * d_act * sum q` from its Q8_1 activations; ours carry `sum q`).
//! Q5_K (`ggml_vec_dot_q5_K_q8_K`) is Q4_K with bit `2c` (`2c + 1`) of `qh[l]` as the fifth
//! bit of element `64c + l` (`64c + 32 + l`) (`kquants::BlockQ5K`); sums stay below 2^31
//! (256 * 31 * 127 * 63).

use crate::ggml::GgmlType;
use crate::quant::f16_bits_to_f32;

/// Activations quantized per block of `block` values ([`quantize`]). The kernels take `q` in
/// -127..=127, as [`quantize`] makes it (a hand-made -128 gives wrong sums on some paths:
/// AVX2's Q8_0 negates it, NEON's pairs can leave i16).
#[derive(Clone, Debug)]
pub struct QAct {
    pub block: usize,
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    /// Sum of `q` over each block.
    pub sum: Vec<i32>,
    /// Sum of `q` over every 16 values.
    pub sum16: Vec<i32>,
}

/// Quantizes `x` (a multiple of `block` long; `block` a multiple of 16) per block.
pub fn quantize(x: &[f32], block: usize) -> QAct {
    debug_assert!(block.is_multiple_of(16) && x.len().is_multiple_of(block));
    let nb = x.len() / block;
    let mut a = QAct {
        block,
        q: vec![0; x.len()],
        d: vec![0.0; nb],
        sum: vec![0; nb],
        sum16: vec![0; x.len() / 16],
    };
    for (b, xb) in x.chunks_exact(block).enumerate() {
        // A block with a NaN gets d = NaN (its q stay 0), so every product term of it is
        // NaN and the logits are reported non-finite, as with the f32 kernel. An infinite
        // value gives d = inf and terms inf * 0 = NaN likewise. max |x| as the largest
        // `bits & 0x7fffffff` (non-negative floats order as their bits; a NaN's are above
        // infinity's): the value f32::max would give, in a loop that vectorizes.
        let amax_bits = xb
            .iter()
            .fold(0u32, |m, v| m.max(v.to_bits() & 0x7fff_ffff));
        if amax_bits > 0x7f80_0000 {
            a.d[b] = f32::NAN;
            continue;
        }
        let amax = f32::from_bits(amax_bits);
        if amax == 0.0 {
            continue;
        }
        let d = amax / 127.0;
        round_block(xb, 1.0 / d, &mut a.q[b * block..(b + 1) * block]);
        a.d[b] = d;
    }
    for (s, q) in a.sum16.iter_mut().zip(a.q.chunks_exact(16)) {
        *s = q.iter().map(|&v| v as i32).sum();
    }
    let per = block / 16;
    for (s, c) in a.sum.iter_mut().zip(a.sum16.chunks_exact(per)) {
        *s = c.iter().sum();
    }
    a
}

crate::multiversion! {
    /// `q = round(x * id)` (half away from zero, as `f32::round`), clamped to ±127. The
    /// rounding is written out so that it vectorizes (`f32::round` is a libm call): `t =
    /// trunc(y)`, `y - t` is exact, and `|y - t| >= 0.5` moves `t` one away from zero. NaN
    /// gives 0, as `f32::round` then `as i8` do.
    fn round_block(x: &[f32], id: f32, q: &mut [i8]) {
        for (q, v) in q.iter_mut().zip(x) {
            let y = v * id;
            let t = y.trunc();
            let r = if (y - t).abs() >= 0.5 { t + 1f32.copysign(y) } else { t };
            // NaN to 0, then clamped: an integral value in -127..=127, so the plain
            // (vectorizing) conversion is exact.
            let r = if r.is_nan() { 0.0 } else { r.clamp(-127.0, 127.0) };
            // SAFETY: r is finite and within i32 (checked above).
            *q = unsafe { r.to_int_unchecked::<i32>() } as i8;
        }
    }
}

/// Weight types the integer kernels take, and the activation block each needs.
pub fn act_block(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => {
            Some(32)
        }
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => Some(256),
        _ => None,
    }
}

/// The fixed final sum of the eight lane accumulators.
#[inline(always)]
fn lanes_sum(l: &[f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

#[inline(always)]
fn f16_at(b: &[u8], off: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}

use crate::isa::usable;
pub use crate::isa::{detect, Isa};

/// Rows `r0 .. r0 + ys.len()` of a GGML matrix of type `ty` (`rb` bytes per row) with
/// activations `a` ([`act_block`] of `ty`).
pub fn gguf_rows(
    isa: Isa,
    ty: GgmlType,
    bytes: &[u8],
    rb: usize,
    a: &QAct,
    ys: &mut [f32],
    r0: usize,
) {
    // The vector paths load activations unchecked: the lengths once, here.
    // A row is `rb / ts` whole blocks (the kernels take `chunks_exact(ts)`); the activations
    // must cover them. Multiplied out (no division: this runs for every 16 rows of a product).
    let block = act_block(ty).expect("gguf_rows takes the types of act_block");
    let ts = ty.type_size();
    assert!(
        bytes.len() >= (r0 + ys.len()) * rb
            && a.block == block
            && a.q.len() * ts >= rb * block
            && a.d.len() * ts >= rb
            && a.sum.len() * ts >= rb
            && a.sum16.len() * ts * 16 >= rb * block,
        "gguf_rows: {ty} rows of {rb} bytes against activations of {} values",
        a.q.len()
    );
    let isa = usable(isa);
    #[cfg(target_arch = "x86_64")]
    {
        match isa {
            // SAFETY: `usable` gives only a level this CPU has.
            Isa::Avx512Vnni => return unsafe { x86::gguf_rows_vnni(ty, bytes, rb, a, ys, r0) },
            Isa::Avx2 => return unsafe { x86::gguf_rows_avx2(ty, bytes, rb, a, ys, r0) },
            _ => {}
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        match isa {
            // SAFETY: `usable` gives only a level this CPU has.
            Isa::Neon => return unsafe { arm::gguf_rows_neon(ty, bytes, rb, a, ys, r0) },
            Isa::NeonDot => return unsafe { arm::gguf_rows_dot(ty, bytes, rb, a, ys, r0) },
            _ => {}
        }
    }
    let _ = isa;
    for (i, y) in ys.iter_mut().enumerate() {
        let row = &bytes[(r0 + i) * rb..(r0 + i + 1) * rb];
        *y = portable::row(ty, row, a);
    }
}

/// Activations permuted for the bundle's ternary words ([`ternary_rows`]): within each
/// 128-element half `h` of a 256-block, `p[h*128 + u*32 + i] = q[h*128 + 4i + u]`. Byte `i` of a
/// half's 32 code bytes holds elements `4i + u` in bits `2u..2u+2`, so one shift and one mask
/// give 32 codes in the order of 32 consecutive permuted activations.
pub fn permute_for_ternary(a: &QAct) -> Vec<i8> {
    let mut p = vec![0i8; a.q.len()];
    for (ph, qh) in p.chunks_exact_mut(128).zip(a.q.chunks_exact(128)) {
        for u in 0..4 {
            for i in 0..32 {
                ph[u * 32 + i] = qh[4 * i + u];
            }
        }
    }
    p
}

/// Rows `r0 .. r0 + ys.len()` of a ternary matrix in the bundle's layout (per row `cols / 16`
/// little-endian u32 words, element `16w + j` in bits `2j..2j+2` of word `w`; `cols / 256` f16
/// scales) with 256-block activations `a` and their permutation `p`
/// ([`permute_for_ternary`]). Term of block `b`: `(dw * da) * f32(sum c*q - sum q)`.
#[allow(clippy::too_many_arguments)]
pub fn ternary_rows(
    isa: Isa,
    words: &[u32],
    scales: &[u16],
    cols: usize,
    a: &QAct,
    p: &[i8],
    ys: &mut [f32],
    r0: usize,
) {
    let codes: &[u8] = bytemuck::cast_slice(words);
    // The vector paths load activations unchecked: the lengths once, here.
    let (rows, nb) = (r0 + ys.len(), cols / 256);
    assert!(
        cols.is_multiple_of(256)
            && codes.len() >= rows * cols / 4
            && scales.len() >= rows * nb
            && a.q.len() >= cols
            && p.len() >= cols
            && a.d.len() >= nb
            && a.sum.len() >= nb,
        "ternary_rows: {rows} rows of {cols} against {} words, {} scales, {} activations",
        words.len(),
        scales.len(),
        a.q.len()
    );
    let isa = usable(isa);
    #[cfg(target_arch = "x86_64")]
    {
        match isa {
            // SAFETY: `usable` gives only a level this CPU has.
            Isa::Avx512Vnni => {
                return unsafe { x86::ternary_rows_vnni(codes, scales, cols, a, p, ys, r0) }
            }
            Isa::Avx2 => {
                return unsafe { x86::ternary_rows_avx2(codes, scales, cols, a, p, ys, r0) }
            }
            _ => {}
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        match isa {
            // SAFETY: `usable` gives only a level this CPU has.
            Isa::Neon => {
                return unsafe { arm::ternary_rows_neon(codes, scales, cols, a, p, ys, r0) }
            }
            Isa::NeonDot => {
                return unsafe { arm::ternary_rows_dot(codes, scales, cols, a, p, ys, r0) }
            }
            _ => {}
        }
    }
    let _ = (isa, p);
    let (bpr, spr) = (cols / 4, cols / 256);
    for (i, y) in ys.iter_mut().enumerate() {
        let r = r0 + i;
        let mut acc = [0f32; 8];
        for b in 0..spr {
            let bq = &codes[r * bpr + b * 64..r * bpr + b * 64 + 64];
            let aq = &a.q[b * 256..b * 256 + 256];
            let mut isum = 0i32;
            for (e, &q) in aq.iter().enumerate() {
                isum += ((bq[e / 4] >> (2 * (e % 4))) & 3) as i32 * q as i32;
            }
            let dw = f16_bits_to_f32(scales[r * spr + b]);
            acc[b % 8] += (dw * a.d[b]) * (isum - a.sum[b]) as f32;
        }
        *y = lanes_sum(&acc);
    }
}

/// Tokens per group of the multi-token kernels ([`ternary_rows_tokens`],
/// [`gguf_rows_tokens`]): one per i32 lane of a 512-bit vector.
pub const TOKENS_PER_GROUP: usize = 16;

/// Up to [`TOKENS_PER_GROUP`] tokens' activations laid out for the multi-token kernels: for
/// each group `j` of 4 consecutive elements (`4j .. 4j + 4`: the elements of a ternary row's
/// code byte `j`, or one u32 of a GGUF block's unpacked weights), the 16 tokens' 4 activations
/// as unsigned bytes `q + 128` (`x[j * 64 + t * 4 + u]`); per activation block (the tokens'
/// [`QAct::block`]) and token the scale `da` and the sum of `q`. Missing tokens are zeros
/// (`q = 0`, `da = 0`).
pub struct TokenGroup {
    /// Real tokens in the group.
    pub n: usize,
    /// The activation block the tokens were quantized in ([`QAct::block`]).
    block: usize,
    x: Vec<u8>,
    da: Vec<f32>,
    asum: Vec<i32>,
    /// The sums of `q` over each 16 values, two at a time per token (`s16[p * 32 + t * 2 +
    /// e] = sum16[2p + e]` of token `t`), as the k-quant kernels' `vpdpwssd` takes them
    /// (`|sum16| <= 16 * 127` fits i16).
    s16: Vec<i16>,
}

/// Groups `acts` (activations of one token each, as [`quantize`] makes them, all of one
/// length and block) by [`TOKENS_PER_GROUP`]. Panics on activations of different lengths or
/// blocks, or whose parts disagree with their length.
pub fn token_groups(acts: &[&QAct]) -> Vec<TokenGroup> {
    acts.chunks(TOKENS_PER_GROUP)
        .map(|g| {
            let (cols, block) = (g[0].q.len(), g[0].block);
            assert!(
                block > 0 && block.is_multiple_of(16) && cols.is_multiple_of(block),
                "token_groups: {cols} activations in blocks of {block}"
            );
            let nb = cols / block;
            let mut t = TokenGroup {
                n: g.len(),
                block,
                x: vec![128u8; cols * TOKENS_PER_GROUP],
                da: vec![0f32; nb * TOKENS_PER_GROUP],
                asum: vec![0i32; nb * TOKENS_PER_GROUP],
                s16: vec![0i16; cols / 16 * TOKENS_PER_GROUP],
            };
            for (k, a) in g.iter().enumerate() {
                assert!(
                    (a.q.len(), a.block, a.d.len(), a.sum.len(), a.sum16.len())
                        == (cols, block, nb, nb, cols / 16),
                    "token_groups: token {k} is not {cols} activations in blocks of {block}"
                );
                for (j, q4) in a.q.chunks_exact(4).enumerate() {
                    // q + 128 as a byte is q ^ 0x80, four at a time.
                    let w = u32::from_le_bytes(bytemuck::cast([q4[0], q4[1], q4[2], q4[3]]));
                    t.x[j * 64 + k * 4..j * 64 + k * 4 + 4]
                        .copy_from_slice(&(w ^ 0x8080_8080).to_le_bytes());
                }
                for b in 0..nb {
                    t.da[b * TOKENS_PER_GROUP + k] = a.d[b];
                    t.asum[b * TOKENS_PER_GROUP + k] = a.sum[b];
                }
                for (p, s2) in a.sum16.chunks_exact(2).enumerate() {
                    t.s16[p * 32 + k * 2] = s2[0] as i16;
                    t.s16[p * 32 + k * 2 + 1] = s2[1] as i16;
                }
            }
            t
        })
        .collect()
}

/// The level [`ternary_rows_tokens`] and [`gguf_rows_tokens`] run for `isa` on this CPU
/// ([`crate::isa::usable`]): the AVX-512 kernels (`vpdpbusd` on 16 tokens a vector), the
/// AVX2 ones (`vpmaddubsw`, two halves of 8) or the aarch64 ones (`sdot`, or `smull` and
/// `sadalp`, four quarters of 4); `None` for the portable level.
fn tokens_level(isa: Isa) -> Option<Isa> {
    match crate::isa::usable(isa) {
        l @ (Isa::Avx512Vnni | Isa::Avx2 | Isa::Neon | Isa::NeonDot) => Some(l),
        _ => None,
    }
}

/// Whether [`ternary_rows_tokens`] runs for `isa` on this CPU: any level but the portable
/// one ([`tokens_level`]).
pub fn ternary_tokens_available(isa: Isa) -> bool {
    tokens_level(isa).is_some()
}

/// Rows `r0 .. r0 + k` of a ternary matrix (the bundle's layout, as [`ternary_rows`]) against
/// the tokens of `groups` at once: `ys[j * n + t]` (`n` the tokens of all groups) is row
/// `r0 + j` against token `t`, the same bits as [`ternary_rows`] with that token's
/// activations. Each block's exact sum
/// `sum c * q` comes from `sum c * (q + 128) - 128 * sum c` with the 16 tokens in the lanes of
/// one vector (`vpdpbusd`, the row's codes broadcast), so a weight's codes are unpacked once
/// for 16 tokens and no horizontal sum is needed; the f32 terms and their summation order are
/// [`ternary_rows`]'s. With AVX2 only, the same on two halves of 8 tokens (`vpmaddubsw`); on
/// aarch64 on four quarters of 4 (`sdot`, or `smull` and `sadalp`).
/// Only where [`ternary_tokens_available`]; panics where not, and on inputs shorter than the
/// rows and groups asked for.
#[allow(clippy::too_many_arguments)]
pub fn ternary_rows_tokens(
    isa: Isa,
    words: &[u32],
    scales: &[u16],
    cols: usize,
    groups: &[TokenGroup],
    ys: &mut [f32],
    r0: usize,
    k: usize,
    buf: &mut Vec<u32>,
) {
    let codes: &[u8] = bytemuck::cast_slice(words);
    check_tokens(cols, 256, groups, ys, k);
    let rows = r0.checked_add(k).expect("r0 + k overflows");
    assert!(
        cols.is_multiple_of(256)
            && rows.checked_mul(cols / 4).is_some_and(|b| codes.len() >= b)
            && scales.len() >= rows * (cols / 256),
        "ternary_rows_tokens: rows {r0}..{} of {cols} columns need {} code bytes and {} \
         scales, given {} and {}",
        r0 + k,
        (r0 + k) * (cols / 4),
        (r0 + k) * (cols / 256),
        codes.len(),
        scales.len()
    );
    match tokens_level(isa) {
        // SAFETY: the level's features are present (tokens_level: usable), the inputs'
        // lengths are checked above.
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx512Vnni) => unsafe {
            x86::ternary_tokens_vnni(codes, scales, cols, groups, ys, r0, k, buf)
        },
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx2) => unsafe {
            x86::ternary_tokens_avx2(codes, scales, cols, groups, ys, r0, k, buf)
        },
        #[cfg(target_arch = "aarch64")]
        Some(Isa::NeonDot) => unsafe {
            arm::ternary_tokens_dot(codes, scales, cols, groups, ys, r0, k, buf)
        },
        #[cfg(target_arch = "aarch64")]
        Some(Isa::Neon) => unsafe {
            arm::ternary_tokens_neon(codes, scales, cols, groups, ys, r0, k, buf)
        },
        _ => panic!("ternary_rows_tokens: no multi-token kernel for {isa:?} on this CPU"),
    }
}

/// The multi-token kernels' common checks (they load the groups unchecked): every group
/// holds `cols` values a token quantized in blocks of `block`, and `ys` takes `k` rows of all
/// the groups' tokens.
fn check_tokens(cols: usize, block: usize, groups: &[TokenGroup], ys: &[f32], k: usize) {
    let n: usize = groups.iter().map(|g| g.n).sum();
    for g in groups {
        let nb = cols / block;
        assert!(
            g.block == block
                && g.x.len() == cols * TOKENS_PER_GROUP
                && g.da.len() == nb * TOKENS_PER_GROUP
                && g.asum.len() == nb * TOKENS_PER_GROUP
                && g.s16.len() == cols / 16 * TOKENS_PER_GROUP
                && g.n <= TOKENS_PER_GROUP,
            "token groups are not of {cols} values a token in blocks of {block} (given {} \
             values in blocks of {})",
            g.x.len() / TOKENS_PER_GROUP,
            g.block
        );
    }
    let need = k.checked_mul(n).expect("rows times tokens overflows");
    assert!(
        ys.len() >= need,
        "ys holds {} values, {k} rows of {n} tokens need {need}",
        ys.len()
    );
}

/// Whether [`gguf_rows_tokens`] takes `ty` on this CPU: every type of [`act_block`] (Q8_0,
/// Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) where [`ternary_tokens_available`].
pub fn gguf_tokens_available(isa: Isa, ty: GgmlType) -> bool {
    act_block(ty).is_some() && ternary_tokens_available(isa)
}

/// Rows `r0 .. r0 + k` of a GGML matrix of type `ty` (`rb` bytes per row) against the tokens
/// of `groups` (blocks of [`act_block`] of `ty`, [`token_groups`]) at once: `ys[j * n + t]`
/// (`n` the tokens of all groups) has the bits of [`gguf_rows`] for row `r0 + j` and token
/// `t`. Each row's weights are unpacked once to bytes in element order (`buf`), with the sum
/// of `w` over each block or sub-block; a (sub-)block's exact `sum w*q` is `sum w*(q + 128) -
/// 128 sum w`, the 16 tokens in the lanes of one vector and 4 weights broadcast per
/// `vpdpbusd`, so no horizontal sums. The k-quants' sub-block scales multiply those exact
/// sums (`vpmulld`), their mins (Q4_K, Q5_K) and Q6_K's `32 sum q` term take the tokens'
/// 16-value sums two at a time (`vpdpwssd`). The f32 terms and their summation order are
/// [`gguf_rows`]'s. With AVX2 only, the same on two halves of 8 tokens (`vpmaddubsw`; Q8_0's
/// signed weights as `|w|` and `q` with `w`'s sign); on aarch64 on four quarters of 4
/// (`sdot`, or `smull` and `sadalp`). Only where [`gguf_tokens_available`];
/// panics where not, and on inputs shorter than the rows and groups asked for.
#[allow(clippy::too_many_arguments)]
pub fn gguf_rows_tokens(
    isa: Isa,
    ty: GgmlType,
    bytes: &[u8],
    rb: usize,
    groups: &[TokenGroup],
    ys: &mut [f32],
    r0: usize,
    k: usize,
    buf: &mut Vec<u32>,
) {
    let block =
        act_block(ty).unwrap_or_else(|| panic!("gguf_rows_tokens: {ty} has no multi-token kernel"));
    let ts = ty.type_size();
    let rows = r0.checked_add(k).expect("r0 + k overflows");
    assert!(
        rb.is_multiple_of(ts) && rows.checked_mul(rb).is_some_and(|b| bytes.len() >= b),
        "gguf_rows_tokens: rows {r0}..{} of {rb} bytes need {} bytes, given {}",
        r0 + k,
        (r0 + k) * rb,
        bytes.len()
    );
    check_tokens(rb / ts * block, block, groups, ys, k);
    match tokens_level(isa) {
        // SAFETY: the level's features are present (tokens_level: usable), the inputs'
        // lengths are checked above.
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx512Vnni) => unsafe {
            x86::gguf_tokens_vnni(ty, bytes, rb, groups, ys, r0, k, buf)
        },
        #[cfg(target_arch = "x86_64")]
        Some(Isa::Avx2) => unsafe { x86::gguf_tokens_avx2(ty, bytes, rb, groups, ys, r0, k, buf) },
        #[cfg(target_arch = "aarch64")]
        Some(Isa::NeonDot) => unsafe {
            arm::gguf_tokens_dot(ty, bytes, rb, groups, ys, r0, k, buf)
        },
        #[cfg(target_arch = "aarch64")]
        Some(Isa::Neon) => unsafe { arm::gguf_tokens_neon(ty, bytes, rb, groups, ys, r0, k, buf) },
        _ => panic!("gguf_rows_tokens: no multi-token kernel for {isa:?} on this CPU"),
    }
}

/// How many of the `left` rows of a pass the next call of a multi-token kernel takes: 4,
/// then the last 2 and 1. (The drivers loop over it themselves: a closure would not inherit
/// their target features, and the kernels inlined into it would call each intrinsic.)
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
fn next_rows(left: usize) -> usize {
    [4, 2, 1].into_iter().find(|&m| m <= left).unwrap_or(1)
}

/// Copies a multi-token pass's results against group `g` (`out[r]`, rows `j .. j + nr` of a
/// task; the group's first token is `*t0`) into `ys` (`ys[r * n + t]`, `n` the tokens of all
/// groups) and moves `*t0` past the group's tokens.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
fn scatter_group(
    out: &[[f32; 16]],
    g: &TokenGroup,
    ys: &mut [f32],
    n: usize,
    j: usize,
    t0: &mut usize,
) {
    for (rr, row) in out.iter().enumerate() {
        let at = (j + rr) * n + *t0;
        ys[at..at + g.n].copy_from_slice(&row[..g.n]);
    }
    *t0 += g.n;
}

/// Sub-blocks of a 256-block whose elements share a scale: 8 of 32 (Q4_K, Q5_K), 16 of 16
/// (Q6_K).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const fn subs(ty: GgmlType) -> usize {
    if matches!(ty, GgmlType::Q6_K) {
        16
    } else {
        8
    }
}

/// The term of a 32-element block (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) from its exact `sum w*q` (`w`
/// the unsigned code for Q4_x and Q5_x).
#[inline(always)]
fn term32(ty: GgmlType, blk: &[u8], a: &QAct, b: usize, isum: i32) -> f32 {
    let da = a.d[b];
    match ty {
        GgmlType::Q4_0 => (f16_at(blk, 0) * da) * (isum - 8 * a.sum[b]) as f32,
        GgmlType::Q5_0 => (f16_at(blk, 0) * da) * (isum - 16 * a.sum[b]) as f32,
        GgmlType::Q4_1 | GgmlType::Q5_1 => {
            (f16_at(blk, 0) * da) * isum as f32 + (f16_at(blk, 2) * da) * a.sum[b] as f32
        }
        _ => (f16_at(blk, 0) * da) * isum as f32,
    }
}

/// The term of a Q4_K/Q5_K block from its exact `s1 = sum_j sc_j * (sum_{32} w*q)_j` and its
/// sub-block mins `mn` (the min term's `sum_j m_j * sum_{32} q` from the activations'
/// 16-value sums).
#[inline(always)]
fn term_k4(blk: &[u8], a: &QAct, b: usize, s1: i32, mn: &[u8; 8]) -> f32 {
    let mut s2 = 0i32;
    for (j, &m) in mn.iter().enumerate() {
        s2 += m as i32 * (a.sum16[b * 16 + 2 * j] + a.sum16[b * 16 + 2 * j + 1]);
    }
    let da = a.d[b];
    (f16_at(blk, 0) * da) * s1 as f32 - (f16_at(blk, 2) * da) * s2 as f32
}

/// The definitions, one block at a time (the reference the SIMD paths are held to).
pub mod portable {
    use super::*;

    /// One row of `ty` (whole blocks) against `a`.
    pub fn row(ty: GgmlType, row: &[u8], a: &QAct) -> f32 {
        let mut acc = [0f32; 8];
        let ts = ty.type_size();
        for (b, blk) in row.chunks_exact(ts).enumerate() {
            acc[b % 8] += term(ty, blk, a, b);
        }
        lanes_sum(&acc)
    }

    /// Exact `sum w*q` of a Q5 block with block `b` of `a`: `w = nibble | (bit k of qh) << 4`,
    /// elements `0..16` in the low nibbles of `qs`, `16..32` in the high ones.
    #[inline(always)]
    fn q5_isum(qh: [u8; 4], qs: &[u8; 16], a: &QAct, b: usize) -> i32 {
        let qh = u32::from_le_bytes(qh);
        let q = &a.q[b * 32..b * 32 + 32];
        let mut isum = 0i32;
        for (j, &w) in qs.iter().enumerate() {
            let lo = (w & 0x0F) as u32 | (((qh >> j) & 1) << 4);
            let hi = (w >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
            isum += lo as i32 * q[j] as i32 + hi as i32 * q[j + 16] as i32;
        }
        isum
    }

    /// Block `b`'s term.
    #[inline(always)]
    pub fn term(ty: GgmlType, blk: &[u8], a: &QAct, b: usize) -> f32 {
        let da = a.d[b];
        match ty {
            GgmlType::Q8_0 => {
                let q = &a.q[b * 32..b * 32 + 32];
                let isum: i32 = blk[2..34]
                    .iter()
                    .zip(q)
                    .map(|(&w, &x)| (w as i8) as i32 * x as i32)
                    .sum();
                term32(ty, blk, a, b, isum)
            }
            GgmlType::Q4_0 | GgmlType::Q4_1 => {
                let off = if ty == GgmlType::Q4_1 { 4 } else { 2 };
                let q = &a.q[b * 32..b * 32 + 32];
                let mut isum = 0i32;
                for j in 0..16 {
                    let w = blk[off + j];
                    isum += (w & 0x0F) as i32 * q[j] as i32 + (w >> 4) as i32 * q[j + 16] as i32;
                }
                term32(ty, blk, a, b, isum)
            }
            GgmlType::Q5_0 => {
                let blk5: &crate::quant::legacy::BlockQ5_0 = bytemuck::from_bytes(blk);
                term32(ty, blk, a, b, q5_isum(blk5.qh, &blk5.qs, a, b))
            }
            GgmlType::Q5_1 => {
                let blk5: &crate::quant::legacy::BlockQ5_1 = bytemuck::from_bytes(blk);
                term32(ty, blk, a, b, q5_isum(blk5.qh, &blk5.qs, a, b))
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let sc: &[u8; 12] = blk[4..16].try_into().expect("12 bytes");
                let (sc, mn) = crate::quant::kquants::get_scale_min_k4(sc);
                // Q4_K: no fifth bits (all zero).
                let (qs, qh) = if ty == GgmlType::Q5_K {
                    let blk5: &crate::quant::kquants::BlockQ5K = bytemuck::from_bytes(blk);
                    (&blk5.qs[..], blk5.qh)
                } else {
                    (&blk[16..144], [0u8; 32])
                };
                let q = &a.q[b * 256..b * 256 + 256];
                let mut s1 = 0i32;
                for c in 0..4 {
                    let (mut lo, mut hi) = (0i32, 0i32);
                    for l in 0..32 {
                        let w = qs[c * 32 + l];
                        let h1 = ((qh[l] >> (2 * c)) & 1) << 4;
                        let h2 = ((qh[l] >> (2 * c + 1)) & 1) << 4;
                        lo += ((w & 0x0F) | h1) as i32 * q[c * 64 + l] as i32;
                        hi += ((w >> 4) | h2) as i32 * q[c * 64 + 32 + l] as i32;
                    }
                    s1 += sc[2 * c] as i32 * lo + sc[2 * c + 1] as i32 * hi;
                }
                term_k4(blk, a, b, s1, &mn)
            }
            GgmlType::Q6_K => {
                let (ql, qh, sc) = (&blk[0..128], &blk[128..192], &blk[192..208]);
                let q = &a.q[b * 256..b * 256 + 256];
                let mut isum = 0i32;
                for h in 0..2 {
                    for s in 0..4 {
                        let lq = &ql[h * 64 + (s % 2) * 32..h * 64 + (s % 2) * 32 + 32];
                        let shift = 4 * (s / 2);
                        for half in 0..2 {
                            let mut p = 0i32;
                            for l in half * 16..half * 16 + 16 {
                                let w = ((lq[l] >> shift) & 0x0F)
                                    | (((qh[h * 32 + l] >> (2 * s)) & 3) << 4);
                                p += w as i32 * q[h * 128 + s * 32 + l] as i32;
                            }
                            let j = h * 8 + s * 2 + half;
                            isum += (sc[j] as i8) as i32 * (p - 32 * a.sum16[b * 16 + j]);
                        }
                    }
                }
                (f16_at(blk, 208) * da) * isum as f32
            }
            _ => unreachable!("act_block() admits only the types above"),
        }
    }
}

/// The aarch64 paths ([`Isa::Neon`], [`Isa::NeonDot`]): each block's exact integer dot product
/// with 128-bit vectors, then [`portable::term`]'s f32 arithmetic on it in the same order (so
/// the same bits). `sdot` (the `dotprod` extension, ARMv8.2 and later: Apple M1 on, Cortex-A55/A75
/// on) adds four `i8 x i8` products into each i32 lane; without it `smull` and `sadalp` widen
/// the products to i16 and add pairs into i32 lanes. Every weight code fits i8 (Q4/Q5 codes
/// 0..32, Q6_K 0..64, ternary 0..3, Q8_0 signed), so both are exact.
#[cfg(target_arch = "aarch64")]
mod arm {
    use super::*;
    use std::arch::aarch64::*;

    /// `acc + a . b` of one `sdot` (four `i8 x i8` products a lane).
    #[target_feature(enable = "neon,dotprod")]
    #[inline]
    unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let mut acc = acc;
        std::arch::asm!(
            "sdot {0:v}.4s, {1:v}.16b, {2:v}.16b",
            inout(vreg) acc,
            in(vreg) a,
            in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
        acc
    }

    /// `acc` plus the 16 products `a_i * b_i` in its four lanes (which lane holds which
    /// product differs between the two forms; only the lanes' total is used).
    #[inline(always)]
    unsafe fn dot_acc<const DOT: bool>(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        if DOT {
            sdot(acc, a, b)
        } else {
            let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
            let hi = vmull_high_s8(a, b);
            vpadalq_s16(vpadalq_s16(acc, lo), hi)
        }
    }

    #[inline(always)]
    unsafe fn load(p: &[u8], off: usize) -> uint8x16_t {
        debug_assert!(off + 16 <= p.len());
        vld1q_u8(p.as_ptr().add(off))
    }

    #[inline(always)]
    unsafe fn load_i8(p: &[i8], off: usize) -> int8x16_t {
        debug_assert!(off + 16 <= p.len());
        vld1q_s8(p.as_ptr().add(off))
    }

    #[inline(always)]
    unsafe fn s8(v: uint8x16_t) -> int8x16_t {
        vreinterpretq_s8_u8(v)
    }

    /// Exact `sum w_i * q_i` over 32 weights (two vectors, element order) and the activations
    /// at `a.q[off..off + 32]`.
    #[inline(always)]
    unsafe fn isum2<const DOT: bool>(w: [int8x16_t; 2], a: &[i8], off: usize) -> i32 {
        let acc = dot_acc::<DOT>(vdupq_n_s32(0), w[0], load_i8(a, off));
        vaddvq_s32(dot_acc::<DOT>(acc, w[1], load_i8(a, off + 16)))
    }

    /// The 32 nibbles of the 16 bytes at `blk[off..]`: low nibbles (elements 0..16), high
    /// nibbles (16..32).
    #[inline(always)]
    unsafe fn nibbles(blk: &[u8], off: usize) -> [uint8x16_t; 2] {
        let v = load(blk, off);
        [vandq_u8(v, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(v)]
    }

    /// `0x10` in byte `k` (of 32) where bit `k` of the little-endian u32 at `blk[off..]` is set:
    /// a Q5 block's fifth bits in element order (scalar: `((qh >> k) & 1) << 4`).
    #[inline(always)]
    unsafe fn q5_high(blk: &[u8], off: usize) -> [uint8x16_t; 2] {
        const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
        let bit = vld1q_u8(BIT.as_ptr());
        let t = vdupq_n_u8(0x10);
        let half = |b0: u8, b1: u8| {
            let v = vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1));
            vandq_u8(vtstq_u8(v, bit), t)
        };
        [
            half(blk[off], blk[off + 1]),
            half(blk[off + 2], blk[off + 3]),
        ]
    }

    /// A 32-element block's exact `sum w*q` (`w` as [`portable::term`] reads it).
    #[inline(always)]
    unsafe fn isum32<const DOT: bool>(ty: GgmlType, blk: &[u8], a: &QAct, b: usize) -> i32 {
        let w = codes32(ty, blk);
        isum2::<DOT>([s8(w[0]), s8(w[1])], &a.q, b * 32)
    }

    /// The four lane totals of each of `v[0..4]` and `v[4..8]`: `[sum v0, .., sum v3]`,
    /// `[sum v4, .., sum v7]` (pairwise adds; exact in i32).
    #[inline(always)]
    unsafe fn totals8(v: &[int32x4_t; 8]) -> [int32x4_t; 2] {
        let t = [
            vpaddq_s32(v[0], v[1]),
            vpaddq_s32(v[2], v[3]),
            vpaddq_s32(v[4], v[5]),
            vpaddq_s32(v[6], v[7]),
        ];
        [vpaddq_s32(t[0], t[1]), vpaddq_s32(t[2], t[3])]
    }

    /// Q4_K's / Q5_K's block term ([`term_k4`] of the exact `s1 = sum_j sc_j * (sum_{32}
    /// w*q)_j`, one integer from the eight sub-block sums' lane totals times the scales,
    /// added in any order).
    #[inline(always)]
    unsafe fn term_q45k<const DOT: bool>(ty: GgmlType, blk: &[u8], a: &QAct, b: usize) -> f32 {
        let sc: &[u8; 12] = blk[4..16].try_into().expect("12 bytes");
        let (sc, mn) = crate::quant::kquants::get_scale_min_k4(sc);
        let (qs_off, qh) = if ty == GgmlType::Q5_K {
            (48, Some([load(blk, 16), load(blk, 32)]))
        } else {
            (16, None)
        };
        let (t, m) = (vdupq_n_u8(0x10), vdupq_n_u8(0x0F));
        let z = vdupq_n_s32(0);
        // Sub-block j = 2c (low nibbles) and 2c + 1 (high nibbles) of each 64-element chunk c.
        let mut u = [z; 8];
        for c in 0..4 {
            let v = [load(blk, qs_off + c * 32), load(blk, qs_off + c * 32 + 16)];
            let mut lo = [vandq_u8(v[0], m), vandq_u8(v[1], m)];
            let mut hi = [vshrq_n_u8::<4>(v[0]), vshrq_n_u8::<4>(v[1])];
            if let Some(qh) = qh {
                let (b1, b2) = (vdupq_n_u8(1 << (2 * c)), vdupq_n_u8(2 << (2 * c)));
                for k in 0..2 {
                    lo[k] = vorrq_u8(lo[k], vandq_u8(vtstq_u8(qh[k], b1), t));
                    hi[k] = vorrq_u8(hi[k], vandq_u8(vtstq_u8(qh[k], b2), t));
                }
            }
            let off = b * 256 + c * 64;
            let l = dot_acc::<DOT>(z, s8(lo[0]), load_i8(&a.q, off));
            u[2 * c] = dot_acc::<DOT>(l, s8(lo[1]), load_i8(&a.q, off + 16));
            let h = dot_acc::<DOT>(z, s8(hi[0]), load_i8(&a.q, off + 32));
            u[2 * c + 1] = dot_acc::<DOT>(h, s8(hi[1]), load_i8(&a.q, off + 48));
        }
        let [p0, p1] = totals8(&u);
        let sc = sc.map(|v| v as i32);
        let s0 = vld1q_s32(sc[..4].as_ptr());
        let s4 = vld1q_s32(sc[4..].as_ptr());
        let s1 = vaddvq_s32(vmlaq_s32(vmulq_s32(p0, s0), p1, s4));
        term_k4(blk, a, b, s1, &mn)
    }

    /// Q6_K's block term ([`portable::term`]'s arithmetic on the same exact sum
    /// `sum_j sc_j * (p_j - 32 sum16_j)`, `p_j` the exact `sum w*q` of sub-block j: each
    /// half's eight `p_j` as lane totals, then the scaled differences in i32 lanes).
    #[inline(always)]
    unsafe fn term_q6k<const DOT: bool>(blk: &[u8], a: &QAct, b: usize) -> f32 {
        let (m4, m2) = (vdupq_n_u8(0x0F), vdupq_n_u8(3));
        let z = vdupq_n_s32(0);
        let mut acc = z;
        for h in 0..2 {
            let ql = [0, 16, 32, 48].map(|o| load(blk, h * 64 + o));
            let qh = [load(blk, 128 + h * 32), load(blk, 128 + h * 32 + 16)];
            // Sub-block j = h * 8 + s * 2 + half: element h * 128 + s * 32 + half * 16 + l.
            let mut v = [z; 8];
            for s in 0..4 {
                let right = vdupq_n_s8(-2 * s as i8);
                for half in 0..2 {
                    let l = ql[(s % 2) * 2 + half];
                    let l = if s < 2 {
                        vandq_u8(l, m4)
                    } else {
                        vshrq_n_u8::<4>(l)
                    };
                    let hb = vandq_u8(vshlq_u8(qh[half], right), m2);
                    let w = s8(vorrq_u8(l, vshlq_n_u8::<4>(hb)));
                    let q = load_i8(&a.q, b * 256 + h * 128 + s * 32 + half * 16);
                    v[s * 2 + half] = dot_acc::<DOT>(z, w, q);
                }
            }
            let p = totals8(&v);
            // The half's eight scales and 16-value activation sums, four to a vector.
            let sc = vmovl_s8(vld1_s8(blk.as_ptr().add(192 + h * 8) as *const i8));
            let sc = [vmovl_s16(vget_low_s16(sc)), vmovl_high_s16(sc)];
            let s16 = &a.sum16[b * 16 + h * 8..b * 16 + h * 8 + 8];
            for k in 0..2 {
                let sum16 = vld1q_s32(s16[k * 4..].as_ptr());
                let d = vsubq_s32(p[k], vshlq_n_s32::<5>(sum16));
                acc = vmlaq_s32(acc, d, sc[k]);
            }
        }
        (f16_at(blk, 208) * a.d[b]) * vaddvq_s32(acc) as f32
    }

    #[inline(always)]
    unsafe fn gguf_rows_body<const DOT: bool>(
        ty: GgmlType,
        bytes: &[u8],
        rb: usize,
        a: &QAct,
        ys: &mut [f32],
        r0: usize,
    ) {
        let ts = ty.type_size();
        for (i, y) in ys.iter_mut().enumerate() {
            let row = &bytes[(r0 + i) * rb..(r0 + i + 1) * rb];
            let mut acc = [0f32; 8];
            for (b, blk) in row.chunks_exact(ts).enumerate() {
                acc[b % 8] += match ty {
                    GgmlType::Q4_K | GgmlType::Q5_K => term_q45k::<DOT>(ty, blk, a, b),
                    GgmlType::Q6_K => term_q6k::<DOT>(blk, a, b),
                    _ => term32(ty, blk, a, b, isum32::<DOT>(ty, blk, a, b)),
                };
            }
            *y = lanes_sum(&acc);
        }
    }

    /// [`gguf_rows`] with `smull`/`sadalp` (NEON, every aarch64 CPU).
    #[target_feature(enable = "neon")]
    pub unsafe fn gguf_rows_neon(
        ty: GgmlType,
        bytes: &[u8],
        rb: usize,
        a: &QAct,
        ys: &mut [f32],
        r0: usize,
    ) {
        gguf_rows_body::<false>(ty, bytes, rb, a, ys, r0)
    }

    /// [`gguf_rows`] with `sdot`.
    #[target_feature(enable = "neon,dotprod")]
    pub unsafe fn gguf_rows_dot(
        ty: GgmlType,
        bytes: &[u8],
        rb: usize,
        a: &QAct,
        ys: &mut [f32],
        r0: usize,
    ) {
        gguf_rows_body::<true>(ty, bytes, rb, a, ys, r0)
    }

    /// [`ternary_rows`]: per 128-element half of a block, its 32 code bytes shifted by
    /// `2u` and masked are the codes of permuted activations `p[u * 32..u * 32 + 32]`.
    #[inline(always)]
    unsafe fn ternary_rows_body<const DOT: bool>(
        codes: &[u8],
        scales: &[u16],
        cols: usize,
        a: &QAct,
        p: &[i8],
        ys: &mut [f32],
        r0: usize,
    ) {
        let (bpr, spr) = (cols / 4, cols / 256);
        let m2 = vdupq_n_u8(3);
        for (i, y) in ys.iter_mut().enumerate() {
            let r = r0 + i;
            let rq = &codes[r * bpr..(r + 1) * bpr];
            let mut acc = [0f32; 8];
            for b in 0..spr {
                // One accumulator per shift: four independent `sdot` chains.
                let mut v = [vdupq_n_s32(0); 4];
                for h in 0..2 {
                    let c = [load(rq, b * 64 + h * 32), load(rq, b * 64 + h * 32 + 16)];
                    let pa = b * 256 + h * 128;
                    for (k, &cv) in c.iter().enumerate() {
                        let cs = [
                            vandq_u8(cv, m2),
                            vandq_u8(vshrq_n_u8::<2>(cv), m2),
                            vandq_u8(vshrq_n_u8::<4>(cv), m2),
                            vshrq_n_u8::<6>(cv),
                        ];
                        for u in 0..4 {
                            let pu = load_i8(p, pa + u * 32 + k * 16);
                            v[u] = dot_acc::<DOT>(v[u], s8(cs[u]), pu);
                        }
                    }
                }
                let isum = vaddvq_s32(vaddq_s32(vaddq_s32(v[0], v[1]), vaddq_s32(v[2], v[3])));
                let dw = f16_bits_to_f32(scales[r * spr + b]);
                acc[b % 8] += (dw * a.d[b]) * (isum - a.sum[b]) as f32;
            }
            *y = lanes_sum(&acc);
        }
    }

    /// [`ternary_rows`] with `smull`/`sadalp`.
    #[target_feature(enable = "neon")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn ternary_rows_neon(
        codes: &[u8],
        scales: &[u16],
        cols: usize,
        a: &QAct,
        p: &[i8],
        ys: &mut [f32],
        r0: usize,
    ) {
        ternary_rows_body::<false>(codes, scales, cols, a, p, ys, r0)
    }

    /// [`ternary_rows`] with `sdot`.
    #[target_feature(enable = "neon,dotprod")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn ternary_rows_dot(
        codes: &[u8],
        scales: &[u16],
        cols: usize,
        a: &QAct,
        p: &[i8],
        ys: &mut [f32],
        r0: usize,
    ) {
        ternary_rows_body::<true>(codes, scales, cols, a, p, ys, r0)
    }

    // The multi-token kernels (prefill): the x86 ones' layout and f32 arithmetic on 128-bit
    // vectors, a token group's 16 tokens as four quarters of 4 (one token's 4 values to an
    // i32 lane). `sdot` (or, without `dotprod`, `smull`, a pairwise add in i16 and `sadalp`,
    // which keep each 4-byte group in its lane: a pair of products is at most 2 * 128 * 127)
    // multiplies signed by signed, so the codes and the signed `q` (the group holds `q + 128`:
    // one `eor` a load) enter as they are and each block's `sum w*q` is exact with no
    // correction; every term and its order are the single-token kernels', so the same bits.

    /// `acc` plus, in each i32 lane, the dot product of that lane's 4 bytes of `a` and `b`.
    #[inline(always)]
    unsafe fn dot4<const DOT: bool>(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        if DOT {
            sdot(acc, a, b)
        } else {
            let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
            let hi = vmull_high_s8(a, b);
            // Adjacent products (|p| <= 128 * 127, a pair fits i16), then adjacent pairs.
            vpadalq_s16(acc, vpaddq_s16(lo, hi))
        }
    }

    /// The 16 tokens of a group's activation word `gi` (4 values each) as four quarters of
    /// signed `q`.
    #[inline(always)]
    unsafe fn q_quarters(g: &TokenGroup, gi: usize) -> [int8x16_t; 4] {
        debug_assert!(gi * 64 + 64 <= g.x.len());
        let p = g.x.as_ptr().add(gi * 64);
        let m = vdupq_n_u8(0x80);
        [0, 16, 32, 48].map(|o| s8(veorq_u8(vld1q_u8(p.add(o)), m)))
    }

    /// A row's 4 codes of word `gi` (bytes, in element order) in every lane.
    #[inline(always)]
    unsafe fn bcast(w: &[u32], i: usize) -> int8x16_t {
        debug_assert!(i < w.len());
        vreinterpretq_s8_u32(vld1q_dup_u32(w.as_ptr().add(i)))
    }

    /// `acc[r][q][l]` (row `r`, token quarter `q`, lane `l` = block `% 8`) added in the
    /// single-token kernels' order into `out[r]` (16 tokens).
    #[inline(always)]
    unsafe fn store_sums4<const R: usize>(acc: &[[[float32x4_t; 8]; 4]; R], out: &mut [[f32; 16]]) {
        for (o, a) in out.iter_mut().zip(acc) {
            for (qd, l) in a.iter().enumerate() {
                let y = vaddq_f32(
                    vaddq_f32(vaddq_f32(l[0], l[4]), vaddq_f32(l[2], l[6])),
                    vaddq_f32(vaddq_f32(l[1], l[5]), vaddq_f32(l[3], l[7])),
                );
                vst1q_f32(o.as_mut_ptr().add(qd * 4), y);
            }
        }
    }

    /// `acc[r][q][b % 8] += t` for block `b`, `t = (dw_r * da) * f32(isum[r][q])` (plus
    /// `(mw_r * da) * f32(sum q)` where `mw` is given: Q4_1, Q5_1), `da` the quarter's
    /// activation scales: [`term32`]'s and the ternary term's arithmetic lane-wise.
    #[inline(always)]
    unsafe fn add_terms<const R: usize>(
        acc: &mut [[[float32x4_t; 8]; 4]; R],
        isum: &[[int32x4_t; 4]; R],
        dw: [f32; R],
        mw: Option<[f32; R]>,
        g: &TokenGroup,
        b: usize,
    ) {
        for qd in 0..4 {
            let da = vld1q_f32(g.da.as_ptr().add(b * 16 + qd * 4));
            for rr in 0..R {
                let mut t = vmulq_f32(vmulq_n_f32(da, dw[rr]), vcvtq_f32_s32(isum[rr][qd]));
                if let Some(mw) = mw {
                    let sq = vcvtq_f32_s32(asum4(g, b, qd));
                    t = vaddq_f32(t, vmulq_f32(vmulq_n_f32(da, mw[rr]), sq));
                }
                acc[rr][qd][b % 8] = vaddq_f32(acc[rr][qd][b % 8], t);
            }
        }
    }

    /// The activations' block sums of quarter `qd` (`sum q` of each token).
    #[inline(always)]
    unsafe fn asum4(g: &TokenGroup, b: usize, qd: usize) -> int32x4_t {
        vld1q_s32(g.asum.as_ptr().add(b * 16 + qd * 4))
    }

    /// `R` ternary rows (codes unpacked in `c`, `R` slices of `cols / 4`; block scales
    /// widened in `dws`) against the 16 tokens of `g`: `out[r]`, `sum c*q - sum q` a block.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn tokens_rows4<const R: usize, const DOT: bool>(
        c: &[u32],
        dws: &[f32],
        cols: usize,
        g: &TokenGroup,
        out: &mut [[f32; 16]],
    ) {
        let (ng, spr) = (cols / 4, cols / 256);
        let z = vdupq_n_s32(0);
        let mut acc = [[[vdupq_n_f32(0.0); 8]; 4]; R];
        for b in 0..spr {
            let mut ia = [[z; 4]; R];
            for gi in b * 64..b * 64 + 64 {
                let x = q_quarters(g, gi);
                for rr in 0..R {
                    let w = bcast(c, rr * ng + gi);
                    for qd in 0..4 {
                        ia[rr][qd] = dot4::<DOT>(ia[rr][qd], x[qd], w);
                    }
                }
            }
            for qd in 0..4 {
                let s = asum4(g, b, qd);
                for rr in 0..R {
                    ia[rr][qd] = vsubq_s32(ia[rr][qd], s);
                }
            }
            add_terms(
                &mut acc,
                &ia,
                std::array::from_fn(|rr| dws[rr * spr + b]),
                None,
                g,
                b,
            );
        }
        store_sums4(&acc, &mut out[..R]);
    }

    /// Rows unpacked at once by the multi-token drivers.
    const PASS: usize = 8;

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn ternary_tokens_impl<const DOT: bool>(
        codes: &[u8],
        scales: &[u16],
        cols: usize,
        groups: &[TokenGroup],
        ys: &mut [f32],
        r0: usize,
        k: usize,
        buf: &mut Vec<u32>,
    ) {
        let (bpr, ng, spr) = (cols / 4, cols / 4, cols / 256);
        let n: usize = groups.iter().map(|g| g.n).sum();
        buf.resize(PASS * ng, 0);
        let mut dws = vec![0f32; PASS * spr];
        let mut out = [[0f32; 16]; PASS];
        let m3 = vdupq_n_u8(3);
        let mut j = 0;
        while j < k {
            let nr = (k - j).min(PASS);
            for rr in 0..nr {
                let r = r0 + j + rr;
                // Each code byte's 4 codes as the 4 bytes of a u32, in element order.
                let row = &codes[r * bpr..(r + 1) * bpr];
                let dst = buf[rr * ng..(rr + 1) * ng].as_mut_ptr() as *mut u8;
                for (i, c16) in row.chunks_exact(16).enumerate() {
                    let v = vld1q_u8(c16.as_ptr());
                    let cs = uint8x16x4_t(
                        vandq_u8(v, m3),
                        vandq_u8(vshrq_n_u8::<2>(v), m3),
                        vandq_u8(vshrq_n_u8::<4>(v), m3),
                        vshrq_n_u8::<6>(v),
                    );
                    vst4q_u8(dst.add(i * 64), cs);
                }
                for b in 0..spr {
                    dws[rr * spr + b] = f16_bits_to_f32(scales[r * spr + b]);
                }
            }
            let mut t0 = 0;
            for g in groups {
                let mut r = 0;
                while r < nr {
                    let m = next_rows(nr - r);
                    let (c, d, o) = (&buf[r * ng..], &dws[r * spr..], &mut out[r..]);
                    match m {
                        4 => tokens_rows4::<4, DOT>(c, d, cols, g, o),
                        2 => tokens_rows4::<2, DOT>(c, d, cols, g, o),
                        _ => tokens_rows4::<1, DOT>(c, d, cols, g, o),
                    }
                    r += m;
                }
                scatter_group(&out[..nr], g, ys, n, j, &mut t0);
            }
            j += nr;
        }
    }

    /// [`ternary_rows_tokens`] with `smull`/`sadalp`.
    #[target_feature(enable = "neon")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn ternary_tokens_neon(
        codes: &[u8],
        scales: &[u16],
        cols: usize,
        groups: &[TokenGroup],
        ys: &mut [f32],
        r0: usize,
        k: usize,
        buf: &mut Vec<u32>,
    ) {
        ternary_tokens_impl::<false>(codes, scales, cols, groups, ys, r0, k, buf)
    }

    /// [`ternary_rows_tokens`] with `sdot`.
    #[target_feature(enable = "neon,dotprod")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn ternary_tokens_dot(
        codes: &[u8],
        scales: &[u16],
        cols: usize,
        groups: &[TokenGroup],
        ys: &mut [f32],
        r0: usize,
        k: usize,
        buf: &mut Vec<u32>,
    ) {
        ternary_tokens_impl::<true>(codes, scales, cols, groups, ys, r0, k, buf)
    }

    /// A 32-element block's 32 codes in element order (signed bytes for Q8_0, unsigned codes
    /// otherwise), for [`isum32`] and the multi-token unpacking.
    #[inline(always)]
    unsafe fn codes32(ty: GgmlType, blk: &[u8]) -> [uint8x16_t; 2] {
        match ty {
            GgmlType::Q8_0 => [load(blk, 2), load(blk, 18)],
            GgmlType::Q4_0 => nibbles(blk, 2),
            GgmlType::Q4_1 => nibbles(blk, 4),
            GgmlType::Q5_0 | GgmlType::Q5_1 => {
                let (qh, qs) = if ty == GgmlType::Q5_0 { (2, 6) } else { (4, 8) };
                let [lo, hi] = nibbles(blk, qs);
                let [h0, h1] = q5_high(blk, qh);
                [vorrq_u8(lo, h0), vorrq_u8(hi, h1)]
            }
            _ => unreachable!("32-element types only"),
        }
    }

    /// `R` rows of a 32-element type (codes in `w`, 8 words a block; scales `dw`, mins
    /// `mw`) against the 16 tokens of `g`: `out[r]`, [`term32`]'s arithmetic lane-wise.
    #[inline(always)]
    #[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
    unsafe fn tokens32_4<const R: usize, const DOT: bool>(
        ty: GgmlType,
        w: &[u32],
        dw: &[f32],
        mw: &[f32],
        nb: usize,
        g: &TokenGroup,
        out: &mut [[f32; 16]],
    ) {
        let nw = nb * 8;
        let z = vdupq_n_s32(0);
        let mut acc = [[[vdupq_n_f32(0.0); 8]; 4]; R];
        for b in 0..nb {
            let mut ia = [[z; 4]; R];
            for gi in b * 8..b * 8 + 8 {
                let x = q_quarters(g, gi);
                for rr in 0..R {
                    let wv = bcast(w, rr * nw + gi);
                    for qd in 0..4 {
                        ia[rr][qd] = dot4::<DOT>(ia[rr][qd], x[qd], wv);
                    }
                }
            }
            let shift = match ty {
                GgmlType::Q4_0 => 3,
                GgmlType::Q5_0 => 4,
                _ => 0,
            };
            if shift > 0 {
                for qd in 0..4 {
                    let s = vshlq_s32(asum4(g, b, qd), vdupq_n_s32(shift));
                    for rr in 0..R {
                        ia[rr][qd] = vsubq_s32(ia[rr][qd], s);
                    }
                }
            }
            let mins = (ty == GgmlType::Q4_1 || ty == GgmlType::Q5_1)
                .then(|| std::array::from_fn(|rr| mw[rr * nb + b]));
            add_terms(
                &mut acc,
                &ia,
                std::array::from_fn(|rr| dw[rr * nb + b]),
                mins,
                g,
                b,
            );
        }
        store_sums4(&acc, &mut out[..R]);
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn gguf32_tokens_impl<const DOT: bool>(
        ty: GgmlType,
        bytes: &[u8],
        rb: usize,
        groups: &[TokenGroup],
        ys: &mut [f32],
        r0: usize,
        k: usize,
        buf: &mut Vec<u32>,
    ) {
        let ts = ty.type_size();
        let nb = rb / ts;
        let nw = nb * 8;
        let n: usize = groups.iter().map(|g| g.n).sum();
        buf.resize(PASS * nw, 0);
        let (mut dw, mut mw) = (vec![0f32; PASS * nb], vec![0f32; PASS * nb]);
        let mut out = [[0f32; 16]; PASS];
        let mut j = 0;
        while j < k {
            let nr = (k - j).min(PASS);
            for rr in 0..nr {
                let r = r0 + j + rr;
                let dst = buf[rr * nw..(rr + 1) * nw].as_mut_ptr() as *mut u8;
                for (b, blk) in bytes[r * rb..(r + 1) * rb].chunks_exact(ts).enumerate() {
                    let [w0, w1] = codes32(ty, blk);
                    vst1q_u8(dst.add(b * 32), w0);
                    vst1q_u8(dst.add(b * 32 + 16), w1);
                    dw[rr * nb + b] = f16_at(blk, 0);
                    mw[rr * nb + b] = f16_at(blk, 2);
                }
            }
            let mut t0 = 0;
            for g in groups {
                let mut r = 0;
                while r < nr {
                    let m = next_rows(nr - r);
                    let (w, d, mn) = (&buf[r * nw..], &dw[r * nb..], &mw[r * nb..]);
                    let o = &mut out[r..];
                    match m {
                        4 => tokens32_4::<4, DOT>(ty, w, d, mn, nb, g, o),
                        2 => tokens32_4::<2, DOT>(ty, w, d, mn, nb, g, o),
                        _ => tokens32_4::<1, DOT>(ty, w, d, mn, nb, g, o),
                    }
                    r += m;
                }
                scatter_group(&out[..nr], g, ys, n, j, &mut t0);
            }
            j += nr;
        }
    }

    /// A k-quant row unpacked: per block the 256 codes in element order (64 words of `w`),
    /// each sub-block's scale (`sc`, 16 a block; Q6_K's signed), `mp` the min pairs `m_j |
    /// m_j << 16` (Q4_K, Q5_K) or Q6_K's scale pairs `sc_2p | sc_2p+1 << 16` (i16 halves),
    /// `d` and `dmin` widened.
    struct Rows256<'a> {
        w: &'a [u32],
        sc: &'a [i32],
        mp: &'a [u32],
        d: &'a [f32],
        dmin: &'a [f32],
    }

    /// Block `blk`'s codes into `dst` (256 bytes), its scales and min (or scale) pairs.
    #[inline(always)]
    unsafe fn unpack256(ty: GgmlType, blk: &[u8], dst: *mut u8, sc: &mut [i32], mp: &mut [u32]) {
        let (m4, m2) = (vdupq_n_u8(0x0F), vdupq_n_u8(3));
        if ty == GgmlType::Q6_K {
            for h in 0..2 {
                let ql = [0, 16, 32, 48].map(|o| load(blk, h * 64 + o));
                let qh = [load(blk, 128 + h * 32), load(blk, 128 + h * 32 + 16)];
                for s in 0..4 {
                    let right = vdupq_n_s8(-2 * s as i8);
                    for half in 0..2 {
                        let l = ql[(s % 2) * 2 + half];
                        let l = if s < 2 {
                            vandq_u8(l, m4)
                        } else {
                            vshrq_n_u8::<4>(l)
                        };
                        let hb = vandq_u8(vshlq_u8(qh[half], right), m2);
                        let w = vorrq_u8(l, vshlq_n_u8::<4>(hb));
                        vst1q_u8(dst.add(h * 128 + s * 32 + half * 16), w);
                    }
                }
            }
            for j in 0..16 {
                sc[j] = (blk[192 + j] as i8) as i32;
            }
            for p in 0..8 {
                mp[p] = sc[2 * p] as u16 as u32 | (sc[2 * p + 1] as u16 as u32) << 16;
            }
        } else {
            let (qs_off, qh) = if ty == GgmlType::Q5_K {
                (48, Some([load(blk, 16), load(blk, 32)]))
            } else {
                (16, None)
            };
            let t = vdupq_n_u8(0x10);
            for c in 0..4 {
                let v = [load(blk, qs_off + c * 32), load(blk, qs_off + c * 32 + 16)];
                let mut lo = [vandq_u8(v[0], m4), vandq_u8(v[1], m4)];
                let mut hi = [vshrq_n_u8::<4>(v[0]), vshrq_n_u8::<4>(v[1])];
                if let Some(qh) = qh {
                    let (b1, b2) = (vdupq_n_u8(1 << (2 * c)), vdupq_n_u8(2 << (2 * c)));
                    for k in 0..2 {
                        lo[k] = vorrq_u8(lo[k], vandq_u8(vtstq_u8(qh[k], b1), t));
                        hi[k] = vorrq_u8(hi[k], vandq_u8(vtstq_u8(qh[k], b2), t));
                    }
                }
                vst1q_u8(dst.add(c * 64), lo[0]);
                vst1q_u8(dst.add(c * 64 + 16), lo[1]);
                vst1q_u8(dst.add(c * 64 + 32), hi[0]);
                vst1q_u8(dst.add(c * 64 + 48), hi[1]);
            }
            let scb: &[u8; 12] = blk[4..16].try_into().expect("12 bytes");
            let (s8, m8) = crate::quant::kquants::get_scale_min_k4(scb);
            for j in 0..8 {
                sc[j] = s8[j] as i32;
                mp[j] = m8[j] as u32 | (m8[j] as u32) << 16;
            }
        }
    }

    /// `R` rows of a k-quant against the 16 tokens of `g`: `out[r]`. Per sub-block each
    /// token's exact `sum w*q` times the sub-block's scale; the min (or Q6_K's `32 sum q`)
    /// term from the tokens' 16-value sums (`smull` of i16 pairs); then [`gguf_rows`]'s f32
    /// term, added to lane `b % 8`.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn tokens256_4<const R: usize, const DOT: bool>(
        ty: GgmlType,
        u: &Rows256,
        nb: usize,
        g: &TokenGroup,
        out: &mut [[f32; 16]],
    ) {
        let nw = nb * 64;
        let ns = subs(ty);
        let wps = 64 / ns; // words per sub-block
        let z = vdupq_n_s32(0);
        let mut acc = [[[vdupq_n_f32(0.0); 8]; 4]; R];
        for b in 0..nb {
            let mut s1 = [[z; 4]; R];
            for j in 0..ns {
                let mut ia = [[z; 4]; R];
                for gi in b * 64 + j * wps..b * 64 + (j + 1) * wps {
                    let x = q_quarters(g, gi);
                    for rr in 0..R {
                        let wv = bcast(u.w, rr * nw + gi);
                        for qd in 0..4 {
                            ia[rr][qd] = dot4::<DOT>(ia[rr][qd], x[qd], wv);
                        }
                    }
                }
                for rr in 0..R {
                    let scv = u.sc[rr * nb * 16 + b * 16 + j];
                    for qd in 0..4 {
                        s1[rr][qd] = vmlaq_n_s32(s1[rr][qd], ia[rr][qd], scv);
                    }
                }
            }
            let mut s2 = [[z; 4]; R];
            for p in 0..8 {
                for qd in 0..4 {
                    let sv = vld1q_s16(g.s16.as_ptr().add((b * 8 + p) * 32 + qd * 8));
                    for rr in 0..R {
                        let mv = vreinterpretq_s16_u32(vdupq_n_u32(u.mp[rr * nb * 8 + b * 8 + p]));
                        let lo = vmull_s16(vget_low_s16(sv), vget_low_s16(mv));
                        let hi = vmull_high_s16(sv, mv);
                        s2[rr][qd] = vaddq_s32(s2[rr][qd], vpaddq_s32(lo, hi));
                    }
                }
            }
            for qd in 0..4 {
                let da = vld1q_f32(g.da.as_ptr().add(b * 16 + qd * 4));
                for rr in 0..R {
                    let dv = vmulq_n_f32(da, u.d[rr * nb + b]);
                    let t = if ty == GgmlType::Q6_K {
                        let isum = vsubq_s32(s1[rr][qd], vshlq_n_s32::<5>(s2[rr][qd]));
                        vmulq_f32(dv, vcvtq_f32_s32(isum))
                    } else {
                        let mv = vmulq_n_f32(da, u.dmin[rr * nb + b]);
                        vsubq_f32(
                            vmulq_f32(dv, vcvtq_f32_s32(s1[rr][qd])),
                            vmulq_f32(mv, vcvtq_f32_s32(s2[rr][qd])),
                        )
                    };
                    acc[rr][qd][b % 8] = vaddq_f32(acc[rr][qd][b % 8], t);
                }
            }
        }
        store_sums4(&acc, &mut out[..R]);
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn gguf256_tokens_impl<const DOT: bool>(
        ty: GgmlType,
        bytes: &[u8],
        rb: usize,
        groups: &[TokenGroup],
        ys: &mut [f32],
        r0: usize,
        k: usize,
        buf: &mut Vec<u32>,
    ) {
        let ts = ty.type_size();
        let nb = rb / ts;
        let nw = nb * 64;
        let n: usize = groups.iter().map(|g| g.n).sum();
        buf.resize(PASS * nw, 0);
        let mut sc = vec![0i32; PASS * nb * 16];
        let mut mp = vec![0u32; PASS * nb * 8];
        let (mut d, mut dmin) = (vec![0f32; PASS * nb], vec![0f32; PASS * nb]);
        let mut out = [[0f32; 16]; PASS];
        let mut j = 0;
        while j < k {
            let nr = (k - j).min(PASS);
            for rr in 0..nr {
                let r = r0 + j + rr;
                let dst = buf[rr * nw..(rr + 1) * nw].as_mut_ptr() as *mut u8;
                for (b, blk) in bytes[r * rb..(r + 1) * rb].chunks_exact(ts).enumerate() {
                    let at = rr * nb + b;
                    unpack256(
                        ty,
                        blk,
                        dst.add(b * 256),
                        &mut sc[at * 16..at * 16 + 16],
                        &mut mp[at * 8..at * 8 + 8],
                    );
                    if ty == GgmlType::Q6_K {
                        d[at] = f16_at(blk, 208);
                    } else {
                        d[at] = f16_at(blk, 0);
                        dmin[at] = f16_at(blk, 2);
                    }
                }
            }
            let mut t0 = 0;
            for g in groups {
                let mut r = 0;
                while r < nr {
                    let m = next_rows(nr - r);
                    let u = Rows256 {
                        w: &buf[r * nw..],
                        sc: &sc[r * nb * 16..],
                        mp: &mp[r * nb * 8..],
                        d: &d[r * nb..],
                        dmin: &dmin[r * nb..],
                    };
                    let o = &mut out[r..];
                    match m {
                        4 => tokens256_4::<4, DOT>(ty, &u, nb, g, o),
                        2 => tokens256_4::<2, DOT>(ty, &u, nb, g, o),
                        _ => tokens256_4::<1, DOT>(ty, &u, nb, g, o),
                    }
                    r += m;
                }
                scatter_group(&out[..nr], g, ys, n, j, &mut t0);
            }
            j += nr;
        }
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn gguf_tokens_impl<const DOT: bool>(
        ty: GgmlType,
        bytes: &[u8],
        rb: usize,
        groups: &[TokenGroup],
        ys: &mut [f32],
        r0: usize,
        k: usize,
        buf: &mut Vec<u32>,
    ) {
        // One copy of the kernel per type, the type's branches folded away.
        use GgmlType as T;
        match ty {
            T::Q8_0 => gguf32_tokens_impl::<DOT>(T::Q8_0, bytes, rb, groups, ys, r0, k, buf),
            T::Q4_0 => gguf32_tokens_impl::<DOT>(T::Q4_0, bytes, rb, groups, ys, r0, k, buf),
            T::Q4_1 => gguf32_tokens_impl::<DOT>(T::Q4_1, bytes, rb, groups, ys, r0, k, buf),
            T::Q5_0 => gguf32_tokens_impl::<DOT>(T::Q5_0, bytes, rb, groups, ys, r0, k, buf),
            T::Q5_1 => gguf32_tokens_impl::<DOT>(T::Q5_1, bytes, rb, groups, ys, r0, k, buf),
            T::Q4_K => gguf256_tokens_impl::<DOT>(T::Q4_K, bytes, rb, groups, ys, r0, k, buf),
            T::Q5_K => gguf256_tokens_impl::<DOT>(T::Q5_K, bytes, rb, groups, ys, r0, k, buf),
            T::Q6_K => gguf256_tokens_impl::<DOT>(T::Q6_K, bytes, rb, groups, ys, r0, k, buf),
            _ => unreachable!("gguf_tokens_available admits only act_block's types"),
        }
    }

    /// [`gguf_rows_tokens`] with `smull`/`sadalp`.
    #[target_feature(enable = "neon")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gguf_tokens_neon(
        ty: GgmlType,
        bytes: &[u8],
        rb: usize,
        groups: &[TokenGroup],
        ys: &mut [f32],
        r0: usize,
        k: usize,
        buf: &mut Vec<u32>,
    ) {
        gguf_tokens_impl::<false>(ty, bytes, rb, groups, ys, r0, k, buf)
    }

    /// [`gguf_rows_tokens`] with `sdot`.
    #[target_feature(enable = "neon,dotprod")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gguf_tokens_dot(
        ty: GgmlType,
        bytes: &[u8],
        rb: usize,
        groups: &[TokenGroup],
        ys: &mut [f32],
        r0: usize,
        k: usize,
        buf: &mut Vec<u32>,
    ) {
        gguf_tokens_impl::<true>(ty, bytes, rb, groups, ys, r0, k, buf)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// `u8 x i8` products of 32 bytes, summed in four-byte groups into 8 i32 lanes.
    #[inline(always)]
    unsafe fn dot<const VNNI: bool>(u: __m256i, s: __m256i) -> __m256i {
        dot_acc::<VNNI>(_mm256_setzero_si256(), u, s)
    }

    /// `acc +` [`dot`]`(u, s)`.
    #[inline(always)]
    unsafe fn dot_acc<const VNNI: bool>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        if VNNI {
            _mm256_dpbusd_epi32(acc, u, s)
        } else {
            _mm256_add_epi32(
                acc,
                _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)),
            )
        }
    }

    #[inline(always)]
    unsafe fn hsum_i32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }

    /// The eight lanes' sums of eight vectors, as one vector `[sum v0, ..., sum v7]`.
    #[inline(always)]
    unsafe fn hsum8(v: &[__m256i; 8]) -> __m256i {
        let h01 = _mm256_hadd_epi32(v[0], v[1]);
        let h23 = _mm256_hadd_epi32(v[2], v[3]);
        let h45 = _mm256_hadd_epi32(v[4], v[5]);
        let h67 = _mm256_hadd_epi32(v[6], v[7]);
        let t0 = _mm256_hadd_epi32(h01, h23);
        let t1 = _mm256_hadd_epi32(h45, h67);
        _mm256_add_epi32(
            _mm256_permute2x128_si256(t0, t1, 0x20),
            _mm256_permute2x128_si256(t0, t1, 0x31),
        )
    }

    #[inline(always)]
    unsafe fn load(p: &[u8], off: usize) -> __m256i {
        debug_assert!(off + 32 <= p.len());
        _mm256_loadu_si256(p.as_ptr().add(off) as *const __m256i)
    }

    #[inline(always)]
    unsafe fn load_q(a: &QAct, off: usize) -> __m256i {
        debug_assert!(off + 32 <= a.q.len());
        _mm256_loadu_si256(a.q.as_ptr().add(off) as *const __m256i)
    }

    /// The 32 nibbles of a Q4_0/Q4_1 block (the low four bits of a Q5_0/Q5_1 block) as bytes
    /// in element order: low nibbles in bytes 0..16, high nibbles in 16..32.
    #[inline(always)]
    unsafe fn q4_weights(blk: &[u8], off: usize) -> __m256i {
        let v = _mm_loadu_si128(blk.as_ptr().add(off) as *const __m128i);
        let m = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(v, m);
        let hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
        _mm256_set_m128i(hi, lo)
    }

    /// `0x10` in byte `k` where bit `k` of the little-endian u32 at `blk[off..off + 4]` is set,
    /// else 0: the fifth bits of a Q5 block's 32 weights in element order. As llama.cpp's
    /// `bytes_from_bits_32`: broadcast, byte `k / 8` of the word into bytes `8(k / 8)..`, OR
    /// every bit but `k % 8`, compare with all-ones. Scalar reference: `((qh >> k) & 1) << 4`
    /// in [`portable::term`].
    #[inline(always)]
    unsafe fn q5_high_bits(blk: &[u8], off: usize) -> __m256i {
        debug_assert!(off + 4 <= blk.len());
        let qh = (blk.as_ptr().add(off) as *const i32).read_unaligned();
        let shuf = _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0x0000000000000000,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(qh), shuf);
        let others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
        let set = _mm256_cmpeq_epi8(_mm256_or_si256(bytes, others), _mm256_set1_epi8(-1));
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }

    /// A 32-element block's weights as 32 bytes in element order: Q8_0's signed bytes, the
    /// unsigned codes of Q4_x (nibbles) and Q5_x (nibbles with their fifth bits,
    /// [`q5_high_bits`]).
    #[inline(always)]
    unsafe fn weights32(ty: GgmlType, blk: &[u8]) -> __m256i {
        match ty {
            GgmlType::Q8_0 => load(blk, 2),
            GgmlType::Q4_0 => q4_weights(blk, 2),
            GgmlType::Q5_0 => _mm256_or_si256(q4_weights(blk, 6), q5_high_bits(blk, 2)),
            GgmlType::Q5_1 => _mm256_or_si256(q4_weights(blk, 8), q5_high_bits(blk, 4)),
            _ => q4_weights(blk, 4),
        }
    }

    /// Exact integer dot product of a 32-element block with its activations (Q8_0: signed
    /// weights through the sign trick; the others' codes are unsigned, [`weights32`]).
    #[inline(always)]
    unsafe fn block32<const VNNI: bool>(ty: GgmlType, blk: &[u8], a: &QAct, b: usize) -> __m256i {
        let q = load_q(a, b * 32);
        let w = weights32(ty, blk);
        if ty == GgmlType::Q8_0 {
            dot::<VNNI>(_mm256_abs_epi8(w), _mm256_sign_epi8(q, w))
        } else {
            dot::<VNNI>(w, q)
        }
    }

    /// The f32 terms of eight 32-element blocks ([`term32`]'s, lane j block j): their exact
    /// sums `v` reduced into one vector, f16 scales `dw` (and mins `mw`), the activations'
    /// scales `da` and sums `asum`.
    #[inline(always)]
    unsafe fn terms8(
        ty: GgmlType,
        v: &[__m256i; 8],
        dw: &[u16; 8],
        mw: &[u16; 8],
        da: __m256,
        asum: __m256i,
    ) -> __m256 {
        let mut isum = hsum8(v);
        if ty == GgmlType::Q4_0 {
            isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(asum, 3));
        }
        if ty == GgmlType::Q5_0 {
            isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(asum, 4));
        }
        let dwv = _mm256_cvtph_ps(_mm_loadu_si128(dw.as_ptr() as *const __m128i));
        let mut t = _mm256_mul_ps(_mm256_mul_ps(dwv, da), _mm256_cvtepi32_ps(isum));
        if ty == GgmlType::Q4_1 || ty == GgmlType::Q5_1 {
            let mwv = _mm256_cvtph_ps(_mm_loadu_si128(mw.as_ptr() as *const __m128i));
            t = _mm256_add_ps(
                t,
                _mm256_mul_ps(_mm256_mul_ps(mwv, da), _mm256_cvtepi32_ps(asum)),
            );
        }
        t
    }

    /// Rows of a 32-element-block type: eight blocks at a time, their exact sums reduced into
    /// one vector, the terms computed as eight lanes (lane j holds block 8i + j).
    #[inline(always)]
    unsafe fn rows32<const VNNI: bool>(
        ty: GgmlType,
        bytes: &[u8],
        rb: usize,
        a: &QAct,
        ys: &mut [f32],
        r0: usize,
    ) {
        let ts = ty.type_size();
        let nb = rb / ts;
        let n8 = nb / 8 * 8;
        for (i, y) in ys.iter_mut().enumerate() {
            let row = &bytes[(r0 + i) * rb..(r0 + i + 1) * rb];
            let mut acc = _mm256_setzero_ps();
            let mut b = 0;
            while b < n8 {
                let mut v = [_mm256_setzero_si256(); 8];
                let mut dw = [0u16; 8];
                let mut mw = [0u16; 8];
                for j in 0..8 {
                    let blk = &row[(b + j) * ts..(b + j + 1) * ts];
                    v[j] = block32::<VNNI>(ty, blk, a, b + j);
                    dw[j] = u16::from_le_bytes([blk[0], blk[1]]);
                    mw[j] = u16::from_le_bytes([blk[2], blk[3]]);
                }
                let da = _mm256_loadu_ps(a.d.as_ptr().add(b));
                let asum = _mm256_loadu_si256(a.sum.as_ptr().add(b) as *const __m256i);
                acc = _mm256_add_ps(acc, terms8(ty, &v, &dw, &mw, da, asum));
                b += 8;
            }
            if nb > n8 {
                // The last `nb % 8` blocks (4 of a 896-wide row's 28) the same way, into
                // their lanes only: the other lanes keep their bits (adding a zero term
                // would turn a -0.0 into +0.0).
                let rem = nb - n8;
                let mut v = [_mm256_setzero_si256(); 8];
                let (mut dw, mut mw) = ([0u16; 8], [0u16; 8]);
                let (mut da, mut asum) = ([0f32; 8], [0i32; 8]);
                for j in 0..rem {
                    let blk = &row[(n8 + j) * ts..(n8 + j + 1) * ts];
                    v[j] = block32::<VNNI>(ty, blk, a, n8 + j);
                    dw[j] = u16::from_le_bytes([blk[0], blk[1]]);
                    mw[j] = u16::from_le_bytes([blk[2], blk[3]]);
                    da[j] = a.d[n8 + j];
                    asum[j] = a.sum[n8 + j];
                }
                let t = terms8(
                    ty,
                    &v,
                    &dw,
                    &mw,
                    _mm256_loadu_ps(da.as_ptr()),
                    _mm256_loadu_si256(asum.as_ptr() as *const __m256i),
                );
                let lane = _mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0);
                let real =
                    _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(rem as i32), lane));
                acc = _mm256_blendv_ps(acc, _mm256_add_ps(acc, t), real);
            }
            let mut l = [0f32; 8];
            _mm256_storeu_ps(l.as_mut_ptr(), acc);
            *y = lanes_sum(&l);
        }
    }

    /// Q6_K: per super-block the 16 sub-block sums scaled by their i8 scales with `madd`.
    #[inline(always)]
    unsafe fn q6k_isum(blk: &[u8], a: &QAct, b: usize) -> i32 {
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(3);
        let sc = &blk[192..208];
        let mut acc = _mm256_setzero_si256();
        for h in 0..2 {
            let ql0 = load(blk, h * 64);
            let ql1 = load(blk, h * 64 + 32);
            let qh = load(blk, 128 + h * 32);
            let w = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, m4),
                    _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4),
                ),
            ];
            for (s, ws) in w.iter().enumerate() {
                let j = h * 8 + s * 2;
                let p = _mm256_maddubs_epi16(*ws, load_q(a, b * 256 + h * 128 + s * 32));
                let s0 = (sc[j] as i8) as i16;
                let s1 = (sc[j + 1] as i8) as i16;
                let scv = _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scv));
            }
        }
        let mut off = 0i32;
        for (j, &s) in sc.iter().enumerate() {
            off += (s as i8) as i32 * a.sum16[b * 16 + j];
        }
        hsum_i32(acc) - 32 * off
    }

    /// Q4_K and Q5_K: the eight sub-block sums scaled by their 6-bit scales with `madd`. Q5_K's
    /// fifth bits: bit `2c` (`2c + 1`) of each `qh` byte shifted down (a 16-bit shift by at
    /// most 7, then the mask keeps the byte's own bit) and up to `0x10`; scalar reference in
    /// [`portable::term`].
    #[inline(always)]
    unsafe fn q4k_isum<const Q5: bool>(blk: &[u8], sc: &[u8; 8], a: &QAct, b: usize) -> i32 {
        let m4 = _mm256_set1_epi8(0x0F);
        let m1 = _mm256_set1_epi8(1);
        let qs = if Q5 { 48 } else { 16 };
        let qh = if Q5 {
            load(blk, 16)
        } else {
            _mm256_setzero_si256()
        };
        let mut acc = _mm256_setzero_si256();
        for c in 0..4 {
            let v = load(blk, qs + c * 32);
            let mut lo = _mm256_and_si256(v, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if Q5 {
                let s = _mm_cvtsi32_si128(2 * c as i32);
                let s1 = _mm_cvtsi32_si128(2 * c as i32 + 1);
                let h1 = _mm256_and_si256(_mm256_srl_epi16(qh, s), m1);
                let h2 = _mm256_and_si256(_mm256_srl_epi16(qh, s1), m1);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(h1, 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(h2, 4));
            }
            let plo = _mm256_maddubs_epi16(lo, load_q(a, b * 256 + c * 64));
            let phi = _mm256_maddubs_epi16(hi, load_q(a, b * 256 + c * 64 + 32));
            acc = _mm256_add_epi32(
                acc,
                _mm256_madd_epi16(plo, _mm256_set1_epi16(sc[2 * c] as i16)),
            );
            acc = _mm256_add_epi32(
                acc,
                _mm256_madd_epi16(phi, _mm256_set1_epi16(sc[2 * c + 1] as i16)),
            );
        }
        hsum_i32(acc)
    }

    #[inline(always)]
    unsafe fn rows256(ty: GgmlType, bytes: &[u8], rb: usize, a: &QAct, ys: &mut [f32], r0: usize) {
        let ts = ty.type_size();
        for (i, y) in ys.iter_mut().enumerate() {
            let row = &bytes[(r0 + i) * rb..(r0 + i + 1) * rb];
            let mut l = [0f32; 8];
            for (b, blk) in row.chunks_exact(ts).enumerate() {
                let da = a.d[b];
                l[b % 8] += match ty {
                    GgmlType::Q6_K => (f16_at(blk, 208) * da) * q6k_isum(blk, a, b) as f32,
                    _ => {
                        let scb: &[u8; 12] = blk[4..16].try_into().expect("12 bytes");
                        let (sc, mn) = crate::quant::kquants::get_scale_min_k4(scb);
                        let s1 = if ty == GgmlType::Q5_K {
                            q4k_isum::<true>(blk, &sc, a, b)
                        } else {
                            q4k_isum::<false>(blk, &sc, a, b)
                        };
                        term_k4(blk, a, b, s1, &mn)
                    }
                };
            }
            *y = lanes_sum(&l);
        }
    }

    #[inline(always)]
    unsafe fn gguf_rows_impl<const VNNI: bool>(
        ty: GgmlType,
        bytes: &[u8],
        rb: usize,
        a: &QAct,
        ys: &mut [f32],
        r0: usize,
    ) {
        match ty {
            GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => {
                rows32::<VNNI>(ty, bytes, rb, a, ys, r0)
            }
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => rows256(ty, bytes, rb, a, ys, r0),
            _ => unreachable!("act_block() admits only the types above"),
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn gguf_rows_avx2(
        ty: GgmlType,
        bytes: &[u8],
        rb: usize,
        a: &QAct,
        ys: &mut [f32],
        r0: usize,
    ) {
        gguf_rows_impl::<false>(ty, bytes, rb, a, ys, r0)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn gguf_rows_vnni(
        ty: GgmlType,
        bytes: &[u8],
        rb: usize,
        a: &QAct,
        ys: &mut [f32],
        r0: usize,
    ) {
        gguf_rows_impl::<true>(ty, bytes, rb, a, ys, r0)
    }

    /// Exact `sum c*p` over one 256-block: two 32-byte halves, four shifts each.
    #[inline(always)]
    unsafe fn ternary_block<const VNNI: bool>(bq: &[u8], p: &[i8]) -> __m256i {
        let m3 = _mm256_set1_epi8(3);
        let mut acc = _mm256_setzero_si256();
        for h in 0..2 {
            let v = load(bq, h * 32);
            for u in 0..4 {
                let c = match u {
                    0 => _mm256_and_si256(v, m3),
                    1 => _mm256_and_si256(_mm256_srli_epi16(v, 2), m3),
                    2 => _mm256_and_si256(_mm256_srli_epi16(v, 4), m3),
                    _ => _mm256_and_si256(_mm256_srli_epi16(v, 6), m3),
                };
                let x = _mm256_loadu_si256(p.as_ptr().add(h * 128 + u * 32) as *const __m256i);
                acc = dot_acc::<VNNI>(acc, c, x);
            }
        }
        acc
    }

    /// Eight blocks at a time: their exact sums reduced into one vector and the terms computed
    /// as eight lanes (lane j holds block 8i + j), the rest one block at a time.
    #[inline(always)]
    unsafe fn ternary_impl<const VNNI: bool>(
        codes: &[u8],
        scales: &[u16],
        cols: usize,
        a: &QAct,
        p: &[i8],
        ys: &mut [f32],
        r0: usize,
    ) {
        let (bpr, spr) = (cols / 4, cols / 256);
        let n8 = spr / 8 * 8;
        for (i, y) in ys.iter_mut().enumerate() {
            let r = r0 + i;
            let rq = &codes[r * bpr..(r + 1) * bpr];
            let rs = &scales[r * spr..(r + 1) * spr];
            let mut acc = _mm256_setzero_ps();
            let mut b = 0;
            while b < n8 {
                let mut v = [_mm256_setzero_si256(); 8];
                for (j, vj) in v.iter_mut().enumerate() {
                    *vj = ternary_block::<VNNI>(&rq[(b + j) * 64..], &p[(b + j) * 256..]);
                }
                let asum = _mm256_loadu_si256(a.sum.as_ptr().add(b) as *const __m256i);
                let isum = _mm256_sub_epi32(hsum8(&v), asum);
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(rs.as_ptr().add(b) as *const __m128i));
                let da = _mm256_loadu_ps(a.d.as_ptr().add(b));
                acc = _mm256_add_ps(
                    acc,
                    _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum)),
                );
                b += 8;
            }
            let mut l = [0f32; 8];
            _mm256_storeu_ps(l.as_mut_ptr(), acc);
            for bt in n8..spr {
                let isum =
                    hsum_i32(ternary_block::<VNNI>(&rq[bt * 64..], &p[bt * 256..])) - a.sum[bt];
                l[bt % 8] += (f16_bits_to_f32(rs[bt]) * a.d[bt]) * isum as f32;
            }
            *y = lanes_sum(&l);
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn ternary_rows_avx2(
        codes: &[u8],
        scales: &[u16],
        cols: usize,
        a: &QAct,
        p: &[i8],
        ys: &mut [f32],
        r0: usize,
    ) {
        ternary_impl::<false>(codes, scales, cols, a, p, ys, r0)
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn ternary_rows_vnni(
        codes: &[u8],
        scales: &[u16],
        cols: usize,
        a: &QAct,
        p: &[i8],
        ys: &mut [f32],
        r0: usize,
    ) {
        ternary_impl::<true>(codes, scales, cols, a, p, ys, r0)
    }

    /// The 4 codes of each code byte as the 4 bytes of a u32 (`(b | b << 6 | b << 12 |
    /// b << 18) & 0x03030303`), and the sum of the codes of each 64-byte block.
    #[inline(always)]
    unsafe fn unpack_codes(row: &[u8], out: &mut [u32], csum: &mut [i32]) {
        let m = _mm512_set1_epi32(0x0303_0303);
        for (j, c16) in row.chunks_exact(16).enumerate() {
            let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(c16.as_ptr() as *const __m128i));
            let w = _mm512_or_si512(
                _mm512_or_si512(v, _mm512_slli_epi32(v, 6)),
                _mm512_or_si512(_mm512_slli_epi32(v, 12), _mm512_slli_epi32(v, 18)),
            );
            _mm512_storeu_si512(
                out.as_mut_ptr().add(j * 16) as *mut _,
                _mm512_and_si512(w, m),
            );
        }
        for (b, blk) in row.chunks_exact(64).enumerate() {
            let mut s = 0u32;
            for w8 in blk.chunks_exact(8) {
                let w = u64::from_le_bytes(w8.try_into().expect("8 bytes"));
                s += (w & 0x5555_5555_5555_5555).count_ones()
                    + 2 * (w & 0xAAAA_AAAA_AAAA_AAAA).count_ones();
            }
            csum[b] = s as i32;
        }
    }

    /// Each accumulator's 8 lanes (`acc[g][r][b % 8]`, block `b`'s terms) added in the
    /// single-token kernels' order, `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`,
    /// into `out[g][r]` (the multi-token kernels' common epilogue).
    #[inline(always)]
    unsafe fn store_sums<const R: usize, const G: usize, const P: usize>(
        acc: &[[[__m512; 8]; R]; G],
        out: &mut [[[f32; 16]; P]; 2],
    ) {
        for (o, a) in out.iter_mut().zip(acc) {
            for (o, l) in o.iter_mut().zip(a) {
                let y = _mm512_add_ps(
                    _mm512_add_ps(_mm512_add_ps(l[0], l[4]), _mm512_add_ps(l[2], l[6])),
                    _mm512_add_ps(_mm512_add_ps(l[1], l[5]), _mm512_add_ps(l[3], l[7])),
                );
                _mm512_storeu_ps(o.as_mut_ptr(), y);
            }
        }
    }

    /// Copies a pass's results (`out[g][r]`, rows `j .. j + nr` of a task against the
    /// groups of `pair`, whose first token is `*t0`) into `ys` (`ys[r * n + t]`, `n` the
    /// tokens of all groups), and moves `*t0` past the pair's tokens.
    #[inline(always)]
    fn scatter_pass<const P: usize>(
        out: &[[[f32; 16]; P]; 2],
        pair: &[TokenGroup],
        nr: usize,
        ys: &mut [f32],
        n: usize,
        j: usize,
        t0: &mut usize,
    ) {
        for (o, g) in out.iter().zip(pair) {
            scatter_group(&o[..nr], g, ys, n, j, t0);
        }
    }

    /// Rows a pass of [`ternary_tokens_vnni`]: their codes unpacked once, then run against
    /// the chunk's token groups two at a time.
    const PASS_ROWS: usize = 8;

    /// `R` rows (codes unpacked in `c`, `R` slices of `cols / 4`; block scales widened in
    /// `dws`, `R` slices of `cols / 256`) against the 16 tokens of each of `G` groups:
    /// `out[g][r]` is row `r` against the tokens of group `g`. Each step loads two 64-byte
    /// activation words a group and broadcasts each row's code word once for all `G`
    /// groups; `S` accumulators a row and group (2 where `R * G` alone gives too few
    /// independent `vpdpbusd` chains for their latency). The integer sums are exact, so
    /// neither changes a bit; the f32 terms and their order are [`ternary_rows`]'s. With 8
    /// rows and 2 groups (16 accumulators) a step is 4 activation loads and 16 broadcasts
    /// for 32 `vpdpbusd`; 4 rows and 1 group (this kernel's former pass) was 2 and 8 for
    /// 8: on a Zen 5 core 210 -> 290-340 multiply-accumulates a ns at the 8B shape's
    /// matrices (BENCHMARKS.md).
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn tokens_rows<const R: usize, const G: usize, const S: usize>(
        c: &[u32],
        csum: &[i32],
        dws: &[f32],
        cols: usize,
        gs: [&TokenGroup; G],
        out: &mut [[[f32; 16]; PASS_ROWS]; 2],
    ) {
        let (ng, spr) = (cols / 4, cols / 256);
        let mut acc = [[[_mm512_setzero_ps(); 8]; R]; G];
        for b in 0..spr {
            let mut ia = [[[_mm512_setzero_si512(); S]; R]; G];
            for gi in (b * 64..b * 64 + 64).step_by(2) {
                let mut x = [[_mm512_setzero_si512(); 2]; G];
                for gg in 0..G {
                    let p = gs[gg].x.as_ptr().add(gi * 64);
                    x[gg][0] = _mm512_loadu_si512(p as *const _);
                    x[gg][1] = _mm512_loadu_si512(p.add(64) as *const _);
                }
                for rr in 0..R {
                    let w0 = _mm512_set1_epi32(*c.get_unchecked(rr * ng + gi) as i32);
                    let w1 = _mm512_set1_epi32(*c.get_unchecked(rr * ng + gi + 1) as i32);
                    for gg in 0..G {
                        let a = &mut ia[gg][rr];
                        a[0] = _mm512_dpbusd_epi32(a[0], x[gg][0], w0);
                        a[S - 1] = _mm512_dpbusd_epi32(a[S - 1], x[gg][1], w1);
                    }
                }
            }
            for gg in 0..G {
                let asum = _mm512_loadu_si512(gs[gg].asum.as_ptr().add(b * 16) as *const _);
                let da = _mm512_loadu_ps(gs[gg].da.as_ptr().add(b * 16));
                for rr in 0..R {
                    let a = &ia[gg][rr];
                    let dot = if S == 2 {
                        _mm512_add_epi32(a[0], a[S - 1])
                    } else {
                        a[0]
                    };
                    let off = _mm512_set1_epi32(128 * csum[rr * spr + b]);
                    let isum = _mm512_sub_epi32(_mm512_sub_epi32(dot, off), asum);
                    let dw = _mm512_set1_ps(dws[rr * spr + b]);
                    acc[gg][rr][b % 8] = _mm512_add_ps(
                        acc[gg][rr][b % 8],
                        _mm512_mul_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(isum)),
                    );
                }
            }
        }
        store_sums(&acc, out);
    }

    /// [`tokens_rows`] for `nr <= PASS_ROWS` unpacked rows against one or two groups
    /// (`pair`): 8 rows at once, fewer (a task's last rows) 4, 2 and 1 at a time.
    #[inline(always)]
    unsafe fn rows_pass(
        nr: usize,
        c: &[u32],
        csum: &[i32],
        dws: &[f32],
        cols: usize,
        pair: &[TokenGroup],
        out: &mut [[[f32; 16]; PASS_ROWS]; 2],
    ) {
        match (nr, pair) {
            (PASS_ROWS, [a, b]) => tokens_rows::<PASS_ROWS, 2, 1>(c, csum, dws, cols, [a, b], out),
            (PASS_ROWS, [a]) => tokens_rows::<PASS_ROWS, 1, 2>(c, csum, dws, cols, [a], out),
            _ => {
                let (ng, spr) = (cols / 4, cols / 256);
                let mut part = [[[0f32; 16]; PASS_ROWS]; 2];
                let mut r = 0;
                while r < nr {
                    let m = [4, 2, 1].into_iter().find(|&m| m <= nr - r).unwrap_or(1);
                    for (gg, g) in pair.iter().enumerate() {
                        let (c, csum, dws) = (&c[r * ng..], &csum[r * spr..], &dws[r * spr..]);
                        match m {
                            4 => tokens_rows::<4, 1, 2>(c, csum, dws, cols, [g], &mut part),
                            2 => tokens_rows::<2, 1, 2>(c, csum, dws, cols, [g], &mut part),
                            _ => tokens_rows::<1, 1, 2>(c, csum, dws, cols, [g], &mut part),
                        }
                        out[gg][r..r + m].copy_from_slice(&part[0][..m]);
                    }
                    r += m;
                }
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vl,avx2,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn ternary_tokens_vnni(
        codes: &[u8],
        scales: &[u16],
        cols: usize,
        groups: &[TokenGroup],
        ys: &mut [f32],
        r0: usize,
        k: usize,
        buf: &mut Vec<u32>,
    ) {
        let (bpr, ng, spr) = (cols / 4, cols / 4, cols / 256);
        let n: usize = groups.iter().map(|g| g.n).sum();
        buf.resize(PASS_ROWS * ng, 0);
        let mut csum = vec![0i32; PASS_ROWS * spr];
        let mut dws = vec![0f32; PASS_ROWS * spr];
        let mut out = [[[0f32; 16]; PASS_ROWS]; 2];
        let mut j = 0;
        while j < k {
            // Up to PASS_ROWS rows' codes unpacked and block scales widened once, then run
            // against every group.
            let nr = (k - j).min(PASS_ROWS);
            for rr in 0..nr {
                let r = r0 + j + rr;
                unpack_codes(
                    &codes[r * bpr..(r + 1) * bpr],
                    &mut buf[rr * ng..(rr + 1) * ng],
                    &mut csum[rr * spr..(rr + 1) * spr],
                );
                for b in 0..spr {
                    dws[rr * spr + b] = f16_bits_to_f32(scales[r * spr + b]);
                }
            }
            let mut t0 = 0;
            for pair in groups.chunks(2) {
                rows_pass(nr, buf, &csum, &dws, cols, pair, &mut out);
                scatter_pass(&out, pair, nr, ys, n, j, &mut t0);
            }
            j += nr;
        }
    }

    /// Row `r`'s weights unpacked for [`tokens32`]: the 32 bytes of each block in element
    /// order ([`weights32`]) as 8 u32 into `w`, each block's `sum w`, f16 scale and (Q4_1,
    /// Q5_1) min widened to f32.
    #[inline(always)]
    unsafe fn unpack32(
        ty: GgmlType,
        row: &[u8],
        w: &mut [u32],
        wsum: &mut [i32],
        dw: &mut [f32],
        mw: &mut [f32],
    ) {
        let ts = ty.type_size();
        let ones = _mm256_set1_epi8(1);
        for (b, blk) in row.chunks_exact(ts).enumerate() {
            let v = weights32(ty, blk);
            debug_assert!(b * 8 + 8 <= w.len());
            _mm256_storeu_si256(w.as_mut_ptr().add(b * 8) as *mut __m256i, v);
            // sum of the 32 signed bytes: |w| <= 128 per byte, so the i16 pairs cannot
            // saturate.
            let s16 = _mm256_maddubs_epi16(ones, v);
            wsum[b] = hsum_i32(_mm256_madd_epi16(s16, _mm256_set1_epi16(1)));
            dw[b] = f16_at(blk, 0);
            mw[b] = f16_at(blk, 2);
        }
    }

    /// Rows a pass of [`gguf_tokens_impl`] (the 32-element types): unpacked once, then run
    /// against the token groups two at a time.
    const PASS_ROWS32: usize = 8;

    /// `R` rows (unpacked by [`unpack32`]: `nb * 8` words, `nb` sums, scales and mins per
    /// row) against the 16 tokens of each of `G` groups: per block, 8 `vpdpbusd` a row and
    /// group (4 weights broadcast once for the `G` groups, the tokens' `q + 128` in the
    /// lanes) give each token's exact sum, then [`term32`]'s arithmetic lane-wise, added to
    /// lane `b % 8` of eight accumulators as [`gguf_rows`] does. `out[g][r]`: row `r`
    /// against group `g`. Each accumulator is a chain of 8 dependent `vpdpbusd` a block, so
    /// `R * G` chains keep the unit busy: 2 rows and 1 group (the former pass) left a Zen 5
    /// core waiting on their latency (BENCHMARKS.md).
    #[inline(always)]
    #[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
    unsafe fn tokens32<const R: usize, const G: usize>(
        ty: GgmlType,
        w: &[u32],
        wsum: &[i32],
        dw: &[f32],
        mw: &[f32],
        nb: usize,
        gs: [&TokenGroup; G],
        out: &mut [[[f32; 16]; PASS_ROWS32]; 2],
    ) {
        let nw = nb * 8;
        let mut acc = [[[_mm512_setzero_ps(); 8]; R]; G];
        let mut b8 = 0;
        while b8 < nb {
            for j in 0..8 {
                let b = b8 + j;
                if b >= nb {
                    break;
                }
                let mut ia = [[_mm512_setzero_si512(); R]; G];
                for gi in b * 8..b * 8 + 8 {
                    let mut x = [_mm512_setzero_si512(); G];
                    for gg in 0..G {
                        x[gg] = _mm512_loadu_si512(gs[gg].x.as_ptr().add(gi * 64) as *const _);
                    }
                    for rr in 0..R {
                        let wv = _mm512_set1_epi32(*w.get_unchecked(rr * nw + gi) as i32);
                        for gg in 0..G {
                            ia[gg][rr] = _mm512_dpbusd_epi32(ia[gg][rr], x[gg], wv);
                        }
                    }
                }
                for gg in 0..G {
                    let g = gs[gg];
                    let asum = _mm512_loadu_si512(g.asum.as_ptr().add(b * 16) as *const _);
                    let da = _mm512_loadu_ps(g.da.as_ptr().add(b * 16));
                    for rr in 0..R {
                        let mut isum = _mm512_sub_epi32(
                            ia[gg][rr],
                            _mm512_set1_epi32(128 * wsum[rr * nb + b]),
                        );
                        if ty == GgmlType::Q4_0 {
                            isum = _mm512_sub_epi32(isum, _mm512_slli_epi32(asum, 3));
                        }
                        if ty == GgmlType::Q5_0 {
                            isum = _mm512_sub_epi32(isum, _mm512_slli_epi32(asum, 4));
                        }
                        let mut t = _mm512_mul_ps(
                            _mm512_mul_ps(_mm512_set1_ps(dw[rr * nb + b]), da),
                            _mm512_cvtepi32_ps(isum),
                        );
                        if ty == GgmlType::Q4_1 || ty == GgmlType::Q5_1 {
                            t = _mm512_add_ps(
                                t,
                                _mm512_mul_ps(
                                    _mm512_mul_ps(_mm512_set1_ps(mw[rr * nb + b]), da),
                                    _mm512_cvtepi32_ps(asum),
                                ),
                            );
                        }
                        acc[gg][rr][j] = _mm512_add_ps(acc[gg][rr][j], t);
                    }
                }
            }
            b8 += 8;
        }
        store_sums(&acc, out);
    }

    /// [`tokens32`] for `nr <= PASS_ROWS32` unpacked rows against one or two groups: all at
    /// once where `nr` is a whole pass, else 4, 2 and 1 at a time.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows_pass32(
        ty: GgmlType,
        nr: usize,
        w: &[u32],
        wsum: &[i32],
        dw: &[f32],
        mw: &[f32],
        nb: usize,
        pair: &[TokenGroup],
        out: &mut [[[f32; 16]; PASS_ROWS32]; 2],
    ) {
        match (nr, pair) {
            (PASS_ROWS32, [a, b]) => {
                tokens32::<PASS_ROWS32, 2>(ty, w, wsum, dw, mw, nb, [a, b], out)
            }
            (PASS_ROWS32, [a]) => tokens32::<PASS_ROWS32, 1>(ty, w, wsum, dw, mw, nb, [a], out),
            _ => {
                let nw = nb * 8;
                let mut part = [[[0f32; 16]; PASS_ROWS32]; 2];
                let mut r = 0;
                while r < nr {
                    let m = [4, 2, 1].into_iter().find(|&m| m <= nr - r).unwrap_or(1);
                    let (w, wsum, dw, mw) =
                        (&w[r * nw..], &wsum[r * nb..], &dw[r * nb..], &mw[r * nb..]);
                    for (gg, g) in pair.iter().enumerate() {
                        match m {
                            4 => tokens32::<4, 1>(ty, w, wsum, dw, mw, nb, [g], &mut part),
                            2 => tokens32::<2, 1>(ty, w, wsum, dw, mw, nb, [g], &mut part),
                            _ => tokens32::<1, 1>(ty, w, wsum, dw, mw, nb, [g], &mut part),
                        }
                        out[gg][r..r + m].copy_from_slice(&part[0][..m]);
                    }
                    r += m;
                }
            }
        }
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn gguf_tokens_impl(
        ty: GgmlType,
        bytes: &[u8],
        rb: usize,
        groups: &[TokenGroup],
        ys: &mut [f32],
        r0: usize,
        k: usize,
        buf: &mut Vec<u32>,
    ) {
        const P: usize = PASS_ROWS32;
        let nb = rb / ty.type_size();
        let nw = nb * 8;
        let n: usize = groups.iter().map(|g| g.n).sum();
        buf.resize(P * nw, 0);
        let (mut wsum, mut dw, mut mw) =
            (vec![0i32; P * nb], vec![0f32; P * nb], vec![0f32; P * nb]);
        let mut out = [[[0f32; 16]; P]; 2];
        let mut j = 0;
        while j < k {
            // Up to P rows unpacked once, then run against every group.
            let nr = (k - j).min(P);
            for rr in 0..nr {
                let r = r0 + j + rr;
                unpack32(
                    ty,
                    &bytes[r * rb..(r + 1) * rb],
                    &mut buf[rr * nw..(rr + 1) * nw],
                    &mut wsum[rr * nb..(rr + 1) * nb],
                    &mut dw[rr * nb..(rr + 1) * nb],
                    &mut mw[rr * nb..(rr + 1) * nb],
                );
            }
            let mut t0 = 0;
            for pair in groups.chunks(2) {
                rows_pass32(ty, nr, buf, &wsum, &dw, &mw, nb, pair, &mut out);
                scatter_pass(&out, pair, nr, ys, n, j, &mut t0);
            }
            j += nr;
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vl,avx2,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gguf_tokens_vnni(
        ty: GgmlType,
        bytes: &[u8],
        rb: usize,
        groups: &[TokenGroup],
        ys: &mut [f32],
        r0: usize,
        k: usize,
        buf: &mut Vec<u32>,
    ) {
        // One copy of the kernel per type, the type's branches folded away.
        match ty {
            GgmlType::Q8_0 => gguf_tokens_impl(GgmlType::Q8_0, bytes, rb, groups, ys, r0, k, buf),
            GgmlType::Q4_0 => gguf_tokens_impl(GgmlType::Q4_0, bytes, rb, groups, ys, r0, k, buf),
            GgmlType::Q4_1 => gguf_tokens_impl(GgmlType::Q4_1, bytes, rb, groups, ys, r0, k, buf),
            GgmlType::Q5_0 => gguf_tokens_impl(GgmlType::Q5_0, bytes, rb, groups, ys, r0, k, buf),
            GgmlType::Q5_1 => gguf_tokens_impl(GgmlType::Q5_1, bytes, rb, groups, ys, r0, k, buf),
            GgmlType::Q4_K => tokens256_impl(GgmlType::Q4_K, bytes, rb, groups, ys, r0, k, buf),
            GgmlType::Q5_K => tokens256_impl(GgmlType::Q5_K, bytes, rb, groups, ys, r0, k, buf),
            GgmlType::Q6_K => tokens256_impl(GgmlType::Q6_K, bytes, rb, groups, ys, r0, k, buf),
            _ => unreachable!("gguf_tokens_available admits only act_block's types"),
        }
    }

    /// One row of a k-quant unpacked for [`tokens256`]: `w` (64 u32 per block) the 256 codes
    /// in element order (`w` in 0..16, 0..32 or 0..64, unsigned), and per block: `sc` each
    /// sub-block's scale (Q6_K's signed), `mp` the min pairs `m_j | m_j << 16` (Q4_K, Q5_K)
    /// or Q6_K's scale pairs `sc_2p | sc_2p+1 << 16` (i16 halves) for `vpdpwssd`, `c` the
    /// constant `128 sum_j sc_j sum w_j`, `d` and `dmin` widened.
    struct Unpacked256<'a> {
        w: &'a mut [u32],
        sc: &'a mut [i32],
        mp: &'a mut [i32],
        c: &'a mut [i32],
        d: &'a mut [f32],
        dmin: &'a mut [f32],
    }

    /// Sum of the unsigned bytes of each 16-byte half of `v`.
    #[inline(always)]
    unsafe fn sums16(v: __m256i) -> [i32; 2] {
        let s = _mm256_sad_epu8(v, _mm256_setzero_si256());
        let lo = _mm256_extract_epi64(s, 0) + _mm256_extract_epi64(s, 1);
        let hi = _mm256_extract_epi64(s, 2) + _mm256_extract_epi64(s, 3);
        [lo as i32, hi as i32]
    }

    #[inline(always)]
    unsafe fn unpack256(ty: GgmlType, row: &[u8], u: &mut Unpacked256) {
        let ts = ty.type_size();
        let ns = subs(ty);
        for (b, blk) in row.chunks_exact(ts).enumerate() {
            let wp = u.w.as_mut_ptr().add(b * 64) as *mut __m256i;
            // The 256 codes as eight 32-byte vectors in element order, and the sum of each
            // 16-element half of each.
            let mut v = [_mm256_setzero_si256(); 8];
            let (sc, mn): ([i32; 16], [i32; 8]) = if ty == GgmlType::Q6_K {
                let m4 = _mm256_set1_epi8(0x0F);
                let m2 = _mm256_set1_epi8(3);
                for h in 0..2 {
                    let ql0 = load(blk, h * 64);
                    let ql1 = load(blk, h * 64 + 32);
                    let qh = load(blk, 128 + h * 32);
                    // Not a closure: one would not inherit the caller's target features.
                    #[inline(always)]
                    unsafe fn hb(qh: __m256i, m2: __m256i, sh: i32) -> __m256i {
                        let x = match sh {
                            0 => qh,
                            2 => _mm256_srli_epi16(qh, 2),
                            4 => _mm256_srli_epi16(qh, 4),
                            _ => _mm256_srli_epi16(qh, 6),
                        };
                        _mm256_slli_epi16(_mm256_and_si256(x, m2), 4)
                    }
                    v[h * 4] = _mm256_or_si256(_mm256_and_si256(ql0, m4), hb(qh, m2, 0));
                    v[h * 4 + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), hb(qh, m2, 2));
                    v[h * 4 + 2] = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                        hb(qh, m2, 4),
                    );
                    v[h * 4 + 3] = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                        hb(qh, m2, 6),
                    );
                }
                let mut sc = [0i32; 16];
                for (j, s) in sc.iter_mut().enumerate() {
                    *s = (blk[192 + j] as i8) as i32;
                }
                (sc, [0; 8])
            } else {
                let m4 = _mm256_set1_epi8(0x0F);
                let m1 = _mm256_set1_epi8(1);
                let q5 = ty == GgmlType::Q5_K;
                let (qs, qh) = if q5 {
                    (48, load(blk, 16))
                } else {
                    (16, _mm256_setzero_si256())
                };
                for c in 0..4 {
                    let x = load(blk, qs + c * 32);
                    let mut lo = _mm256_and_si256(x, m4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
                    if q5 {
                        let s = _mm_cvtsi32_si128(2 * c as i32);
                        let s1 = _mm_cvtsi32_si128(2 * c as i32 + 1);
                        let h1 = _mm256_and_si256(_mm256_srl_epi16(qh, s), m1);
                        let h2 = _mm256_and_si256(_mm256_srl_epi16(qh, s1), m1);
                        lo = _mm256_or_si256(lo, _mm256_slli_epi16(h1, 4));
                        hi = _mm256_or_si256(hi, _mm256_slli_epi16(h2, 4));
                    }
                    v[2 * c] = lo;
                    v[2 * c + 1] = hi;
                }
                let scb: &[u8; 12] = blk[4..16].try_into().expect("12 bytes");
                let (s8, m8) = crate::quant::kquants::get_scale_min_k4(scb);
                let mut sc = [0i32; 16];
                let mut mn = [0i32; 8];
                for j in 0..8 {
                    sc[j] = s8[j] as i32;
                    mn[j] = m8[j] as i32;
                }
                (sc, mn)
            };
            let mut halves = [0i32; 16];
            for (i, x) in v.iter().enumerate() {
                _mm256_storeu_si256(wp.add(i), *x);
                let [a, b2] = sums16(*x);
                halves[2 * i] = a;
                halves[2 * i + 1] = b2;
            }
            // Sub-block sums of w: 16 halves for Q6_K, pairs of them for 32-element ones.
            let mut c = 0i32;
            for j in 0..ns {
                let wsum = if ns == 16 {
                    halves[j]
                } else {
                    halves[2 * j] + halves[2 * j + 1]
                };
                c += 128 * sc[j] * wsum;
                u.sc[b * 16 + j] = sc[j];
            }
            for p in 0..8 {
                let (a, b2) = if ns == 16 {
                    (sc[2 * p], sc[2 * p + 1])
                } else {
                    (mn[p], mn[p])
                };
                u.mp[b * 8 + p] = (a as u16 as u32 | (b2 as u16 as u32) << 16) as i32;
            }
            u.c[b] = c;
            if ty == GgmlType::Q6_K {
                u.d[b] = f16_at(blk, 208);
            } else {
                u.d[b] = f16_at(blk, 0);
                u.dmin[b] = f16_at(blk, 2);
            }
        }
    }

    /// Rows a pass of [`tokens256_impl`] (the k-quants): unpacked once, then run against
    /// the token groups two at a time (more rows gained nothing on a Zen 5 core:
    /// BENCHMARKS.md).
    const PASS_ROWS256: usize = 4;

    /// The parts of [`Unpacked256`] the kernel reads, for `R` rows.
    #[derive(Clone, Copy)]
    struct Rows256<'a> {
        w: &'a [u32],
        sc: &'a [i32],
        mp: &'a [i32],
        c: &'a [i32],
        d: &'a [f32],
        dmin: &'a [f32],
    }

    impl<'a> Rows256<'a> {
        /// The rows from row `r` on.
        fn from(self, r: usize, nb: usize) -> Rows256<'a> {
            Rows256 {
                w: &self.w[r * nb * 64..],
                sc: &self.sc[r * nb * 16..],
                mp: &self.mp[r * nb * 8..],
                c: &self.c[r * nb..],
                d: &self.d[r * nb..],
                dmin: &self.dmin[r * nb..],
            }
        }
    }

    /// `R` rows of a k-quant (unpacked by [`unpack256`], `nb` blocks each) against the 16
    /// tokens of each of `G` groups (`out[g][r]`): per sub-block 8 (Q4_K, Q5_K) or 4 (Q6_K)
    /// `vpdpbusd` a row and group (the weights broadcast once for the `G` groups) give each
    /// token's `sum w*(q + 128)`, times the sub-block's scale; `- c` makes the scaled sum
    /// exact; the min (or Q6_K's `32 sum q`) term by 8 `vpdpwssd` on the tokens' 16-value
    /// sums; then [`gguf_rows`]'s f32 term, added to lane `b % 8`.
    #[inline(always)]
    #[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
    unsafe fn tokens256<const R: usize, const G: usize>(
        ty: GgmlType,
        u: Rows256,
        nb: usize,
        gs: [&TokenGroup; G],
        out: &mut [[[f32; 16]; PASS_ROWS256]; 2],
    ) {
        let Rows256 {
            w,
            sc,
            mp,
            c,
            d,
            dmin,
        } = u;
        let nw = nb * 64;
        let ns = subs(ty);
        let wps = 64 / ns; // words per sub-block
        let mut acc = [[[_mm512_setzero_ps(); 8]; R]; G];
        let mut b8 = 0;
        while b8 < nb {
            for l in 0..8 {
                let b = b8 + l;
                if b >= nb {
                    break;
                }
                let mut s1 = [[_mm512_setzero_si512(); R]; G];
                for j in 0..ns {
                    let mut ia = [[_mm512_setzero_si512(); R]; G];
                    for gi in b * 64 + j * wps..b * 64 + (j + 1) * wps {
                        let mut x = [_mm512_setzero_si512(); G];
                        for gg in 0..G {
                            x[gg] = _mm512_loadu_si512(gs[gg].x.as_ptr().add(gi * 64) as *const _);
                        }
                        for rr in 0..R {
                            let wv = _mm512_set1_epi32(*w.get_unchecked(rr * nw + gi) as i32);
                            for gg in 0..G {
                                ia[gg][rr] = _mm512_dpbusd_epi32(ia[gg][rr], x[gg], wv);
                            }
                        }
                    }
                    for rr in 0..R {
                        let scv = _mm512_set1_epi32(*sc.get_unchecked(rr * nb * 16 + b * 16 + j));
                        for gg in 0..G {
                            s1[gg][rr] =
                                _mm512_add_epi32(s1[gg][rr], _mm512_mullo_epi32(ia[gg][rr], scv));
                        }
                    }
                }
                let mut s2 = [[_mm512_setzero_si512(); R]; G];
                for p in 0..8 {
                    for gg in 0..G {
                        let sv = _mm512_loadu_si512(
                            gs[gg].s16.as_ptr().add((b * 8 + p) * 32) as *const _
                        );
                        for rr in 0..R {
                            let mv = _mm512_set1_epi32(*mp.get_unchecked(rr * nb * 8 + b * 8 + p));
                            s2[gg][rr] = _mm512_dpwssd_epi32(s2[gg][rr], sv, mv);
                        }
                    }
                }
                for gg in 0..G {
                    let da = _mm512_loadu_ps(gs[gg].da.as_ptr().add(b * 16));
                    for rr in 0..R {
                        let s1 = _mm512_sub_epi32(s1[gg][rr], _mm512_set1_epi32(c[rr * nb + b]));
                        let dv = _mm512_set1_ps(d[rr * nb + b]);
                        let t = if ty == GgmlType::Q6_K {
                            let isum = _mm512_sub_epi32(s1, _mm512_slli_epi32(s2[gg][rr], 5));
                            _mm512_mul_ps(_mm512_mul_ps(dv, da), _mm512_cvtepi32_ps(isum))
                        } else {
                            let mv = _mm512_set1_ps(dmin[rr * nb + b]);
                            _mm512_sub_ps(
                                _mm512_mul_ps(_mm512_mul_ps(dv, da), _mm512_cvtepi32_ps(s1)),
                                _mm512_mul_ps(
                                    _mm512_mul_ps(mv, da),
                                    _mm512_cvtepi32_ps(s2[gg][rr]),
                                ),
                            )
                        };
                        acc[gg][rr][l] = _mm512_add_ps(acc[gg][rr][l], t);
                    }
                }
            }
            b8 += 8;
        }
        store_sums(&acc, out);
    }

    /// [`tokens256`] for `nr <= PASS_ROWS256` unpacked rows against one or two groups: all
    /// at once where `nr` is a whole pass, else 2 and 1 at a time.
    #[inline(always)]
    unsafe fn rows_pass256(
        ty: GgmlType,
        nr: usize,
        u: Rows256,
        nb: usize,
        pair: &[TokenGroup],
        out: &mut [[[f32; 16]; PASS_ROWS256]; 2],
    ) {
        match (nr, pair) {
            (PASS_ROWS256, [a, b]) => tokens256::<PASS_ROWS256, 2>(ty, u, nb, [a, b], out),
            (PASS_ROWS256, [a]) => tokens256::<PASS_ROWS256, 1>(ty, u, nb, [a], out),
            _ => {
                let mut part = [[[0f32; 16]; PASS_ROWS256]; 2];
                let mut r = 0;
                while r < nr {
                    let m = if nr - r >= 2 { 2 } else { 1 };
                    for (gg, g) in pair.iter().enumerate() {
                        let v = u.from(r, nb);
                        if m == 2 {
                            tokens256::<2, 1>(ty, v, nb, [g], &mut part);
                        } else {
                            tokens256::<1, 1>(ty, v, nb, [g], &mut part);
                        }
                        out[gg][r..r + m].copy_from_slice(&part[0][..m]);
                    }
                    r += m;
                }
            }
        }
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tokens256_impl(
        ty: GgmlType,
        bytes: &[u8],
        rb: usize,
        groups: &[TokenGroup],
        ys: &mut [f32],
        r0: usize,
        k: usize,
        buf: &mut Vec<u32>,
    ) {
        const P: usize = PASS_ROWS256;
        let nb = rb / ty.type_size();
        let nw = nb * 64;
        let n: usize = groups.iter().map(|g| g.n).sum();
        buf.resize(P * nw, 0);
        let mut sc = vec![0i32; P * nb * 16];
        let mut mp = vec![0i32; P * nb * 8];
        let mut c = vec![0i32; P * nb];
        let mut d = vec![0f32; P * nb];
        let mut dmin = vec![0f32; P * nb];
        let mut out = [[[0f32; 16]; P]; 2];
        let mut j = 0;
        while j < k {
            // Up to P rows unpacked once, then run against every group.
            let nr = (k - j).min(P);
            for rr in 0..nr {
                let r = r0 + j + rr;
                let mut u = Unpacked256 {
                    w: &mut buf[rr * nw..(rr + 1) * nw],
                    sc: &mut sc[rr * nb * 16..(rr + 1) * nb * 16],
                    mp: &mut mp[rr * nb * 8..(rr + 1) * nb * 8],
                    c: &mut c[rr * nb..(rr + 1) * nb],
                    d: &mut d[rr * nb..(rr + 1) * nb],
                    dmin: &mut dmin[rr * nb..(rr + 1) * nb],
                };
                unpack256(ty, &bytes[r * rb..(r + 1) * rb], &mut u);
            }
            let u = Rows256 {
                w: buf,
                sc: &sc,
                mp: &mp,
                c: &c,
                d: &d,
                dmin: &dmin,
            };
            let mut t0 = 0;
            for pair in groups.chunks(2) {
                rows_pass256(ty, nr, u, nb, pair, &mut out);
                scatter_pass(&out, pair, nr, ys, n, j, &mut t0);
            }
            j += nr;
        }
    }

    // The AVX2 multi-token kernels: the AVX-512 ones' layout and f32 arithmetic on 256-bit
    // vectors, a token group's 16 tokens as two halves of 8. Without `vpdpbusd` a step is
    // `vpmaddubsw` (pairs of `u8 x i8` products into i16 lanes, saturating) then `vpmaddwd`
    // by ones into i32. So that no pair saturates, the weights are the unsigned operand and
    // the activations enter as signed `q` (the group holds `q + 128`: one `xor` a load),
    // never `q + 128`: a pair is at most `2 * max|w| * 127`; the pairs of several steps add
    // in i16 lanes before one `vpmaddwd` ([`steps16`]). Q8_0's signed weights go as `|w|`
    // with `q` carrying `w`'s sign (`vpsignb`), as llama.cpp's AVX2 `ggml_vec_dot_q8_0_q8_0`
    // does. The sums are exact integers, `sum w*q` itself (no `128 sum w` to take off), so
    // every term and its order are the single-token kernels' and the bits the same.

    /// The 16 tokens of a group's activation word `gi` (4 values each) as two 8-token
    /// halves of signed `q`.
    #[inline(always)]
    unsafe fn q_halves(g: &TokenGroup, gi: usize) -> [__m256i; 2] {
        debug_assert!(gi * 64 + 64 <= g.x.len());
        let p = g.x.as_ptr().add(gi * 64) as *const __m256i;
        let m = _mm256_set1_epi8(-128);
        [
            _mm256_xor_si256(_mm256_loadu_si256(p), m),
            _mm256_xor_si256(_mm256_loadu_si256(p.add(1)), m),
        ]
    }

    /// Steps (4-weight words) of `ty` (`None`: ternary) whose `vpmaddubsw` pairs an i16
    /// lane adds before one `vpmaddwd`: `steps * 2 * max w * 127 <= 32,767` (ternary: 32,
    /// half a 256-block, for a 2-bit field's largest value 3, which no converter writes but
    /// the other paths take exactly; Q4 codes 0..16: 8; Q5: 4; Q6_K: 2; Q8_0, a pair of up
    /// to 2 * 128 * 127: 1).
    const fn steps16(ty: Option<GgmlType>) -> usize {
        match ty {
            None => 32,
            Some(GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K) => 8,
            Some(GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5_K) => 4,
            Some(GgmlType::Q6_K) => 2,
            _ => 1,
        }
    }

    /// `acc[r][h][l]` (row `r`, token half `h`, lane `l` = block `% 8`) added in the
    /// single-token kernels' order into `out[r]` (16 tokens).
    #[inline(always)]
    unsafe fn store_sums2<const R: usize>(acc: &[[[__m256; 8]; 2]; R], out: &mut [[f32; 16]]) {
        for (o, a) in out.iter_mut().zip(acc) {
            for (h, l) in a.iter().enumerate() {
                let y = _mm256_add_ps(
                    _mm256_add_ps(_mm256_add_ps(l[0], l[4]), _mm256_add_ps(l[2], l[6])),
                    _mm256_add_ps(_mm256_add_ps(l[1], l[5]), _mm256_add_ps(l[3], l[7])),
                );
                _mm256_storeu_ps(o.as_mut_ptr().add(h * 8), y);
            }
        }
    }

    /// Ternary codes unpacked as [`unpack_codes`] does (its `u32` per code byte), with
    /// 256-bit vectors.
    #[inline(always)]
    unsafe fn unpack_codes2(row: &[u8], out: &mut [u32]) {
        debug_assert!(out.len() >= row.len());
        let m = _mm256_set1_epi32(0x0303_0303);
        for (j, c8) in row.chunks_exact(8).enumerate() {
            let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(c8.as_ptr() as *const __m128i));
            let w = _mm256_or_si256(
                _mm256_or_si256(v, _mm256_slli_epi32(v, 6)),
                _mm256_or_si256(_mm256_slli_epi32(v, 12), _mm256_slli_epi32(v, 18)),
            );
            _mm256_storeu_si256(
                out.as_mut_ptr().add(j * 8) as *mut __m256i,
                _mm256_and_si256(w, m),
            );
        }
    }

    /// `R` ternary rows (codes unpacked in `c`, `R` slices of `cols / 4`; block scales
    /// widened in `dws`) against the 16 tokens of `g`: `out[r]`. Each half block's 32 steps
    /// add in i16 lanes ([`steps16`]), then `sum c*q - sum q`.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn tokens_rows2<const R: usize>(
        c: &[u32],
        dws: &[f32],
        cols: usize,
        g: &TokenGroup,
        out: &mut [[f32; 16]],
    ) {
        let (ng, spr) = (cols / 4, cols / 256);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[[_mm256_setzero_ps(); 8]; 2]; R];
        const F: usize = steps16(None);
        for b in 0..spr {
            let mut ia = [[_mm256_setzero_si256(); 2]; R];
            for s0 in (b * 64..b * 64 + 64).step_by(F) {
                let mut a16 = [[_mm256_setzero_si256(); 2]; R];
                for gi in s0..s0 + F {
                    let x = q_halves(g, gi);
                    for rr in 0..R {
                        let wv = _mm256_set1_epi32(*c.get_unchecked(rr * ng + gi) as i32);
                        for h in 0..2 {
                            let p = _mm256_maddubs_epi16(wv, x[h]);
                            a16[rr][h] = _mm256_add_epi16(a16[rr][h], p);
                        }
                    }
                }
                for rr in 0..R {
                    for h in 0..2 {
                        let p = _mm256_madd_epi16(a16[rr][h], ones);
                        ia[rr][h] = _mm256_add_epi32(ia[rr][h], p);
                    }
                }
            }
            for h in 0..2 {
                let asum = _mm256_loadu_si256(g.asum.as_ptr().add(b * 16 + h * 8) as *const _);
                let da = _mm256_loadu_ps(g.da.as_ptr().add(b * 16 + h * 8));
                for rr in 0..R {
                    let isum = _mm256_sub_epi32(ia[rr][h], asum);
                    let dw = _mm256_set1_ps(dws[rr * spr + b]);
                    let l = &mut acc[rr][h][b % 8];
                    *l = _mm256_add_ps(
                        *l,
                        _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum)),
                    );
                }
            }
        }
        store_sums2(&acc, &mut out[..R]);
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn ternary_tokens_avx2(
        codes: &[u8],
        scales: &[u16],
        cols: usize,
        groups: &[TokenGroup],
        ys: &mut [f32],
        r0: usize,
        k: usize,
        buf: &mut Vec<u32>,
    ) {
        const P: usize = PASS_ROWS;
        let (bpr, ng, spr) = (cols / 4, cols / 4, cols / 256);
        let n: usize = groups.iter().map(|g| g.n).sum();
        buf.resize(P * ng, 0);
        let mut dws = vec![0f32; P * spr];
        let mut out = [[0f32; 16]; P];
        let mut j = 0;
        while j < k {
            let nr = (k - j).min(P);
            for rr in 0..nr {
                let r = r0 + j + rr;
                unpack_codes2(
                    &codes[r * bpr..(r + 1) * bpr],
                    &mut buf[rr * ng..(rr + 1) * ng],
                );
                for b in 0..spr {
                    dws[rr * spr + b] = f16_bits_to_f32(scales[r * spr + b]);
                }
            }
            let mut t0 = 0;
            for g in groups {
                let mut r = 0;
                while r < nr {
                    let m = next_rows(nr - r);
                    let (c, d, o) = (&buf[r * ng..], &dws[r * spr..], &mut out[r..]);
                    match m {
                        4 => tokens_rows2::<4>(c, d, cols, g, o),
                        2 => tokens_rows2::<2>(c, d, cols, g, o),
                        _ => tokens_rows2::<1>(c, d, cols, g, o),
                    }
                    r += m;
                }
                scatter_group(&out[..nr], g, ys, n, j, &mut t0);
            }
            j += nr;
        }
    }

    /// `R` rows of a 32-element type (unpacked by [`unpack32`]) against the 16 tokens of
    /// `g`: `out[r]`. Per block, each token's exact `sum w*q` (Q8_0: `|w|` times `q` with
    /// `w`'s sign, a `vpmaddwd` a step), then [`term32`]'s arithmetic lane-wise, added to
    /// lane `b % 8`.
    #[inline(always)]
    #[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
    unsafe fn tokens32_2<const R: usize>(
        ty: GgmlType,
        w: &[u32],
        dw: &[f32],
        mw: &[f32],
        nb: usize,
        g: &TokenGroup,
        out: &mut [[f32; 16]],
    ) {
        let nw = nb * 8;
        let ones = _mm256_set1_epi16(1);
        let f = steps16(Some(ty));
        let mut acc = [[[_mm256_setzero_ps(); 8]; 2]; R];
        for b in 0..nb {
            let mut ia = [[_mm256_setzero_si256(); 2]; R];
            for s0 in (b * 8..b * 8 + 8).step_by(f) {
                let mut a16 = [[_mm256_setzero_si256(); 2]; R];
                for gi in s0..s0 + f {
                    let x = q_halves(g, gi);
                    for rr in 0..R {
                        let wv = _mm256_set1_epi32(*w.get_unchecked(rr * nw + gi) as i32);
                        if ty == GgmlType::Q8_0 {
                            let aw = _mm256_abs_epi8(wv);
                            for h in 0..2 {
                                let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x[h], wv));
                                a16[rr][h] = _mm256_add_epi16(a16[rr][h], p);
                            }
                        } else {
                            for h in 0..2 {
                                let p = _mm256_maddubs_epi16(wv, x[h]);
                                a16[rr][h] = _mm256_add_epi16(a16[rr][h], p);
                            }
                        }
                    }
                }
                for rr in 0..R {
                    for h in 0..2 {
                        ia[rr][h] =
                            _mm256_add_epi32(ia[rr][h], _mm256_madd_epi16(a16[rr][h], ones));
                    }
                }
            }
            for h in 0..2 {
                let asum = _mm256_loadu_si256(g.asum.as_ptr().add(b * 16 + h * 8) as *const _);
                let da = _mm256_loadu_ps(g.da.as_ptr().add(b * 16 + h * 8));
                for rr in 0..R {
                    let mut isum = ia[rr][h];
                    if ty == GgmlType::Q4_0 {
                        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(asum, 3));
                    }
                    if ty == GgmlType::Q5_0 {
                        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(asum, 4));
                    }
                    let mut t = _mm256_mul_ps(
                        _mm256_mul_ps(_mm256_set1_ps(dw[rr * nb + b]), da),
                        _mm256_cvtepi32_ps(isum),
                    );
                    if ty == GgmlType::Q4_1 || ty == GgmlType::Q5_1 {
                        t = _mm256_add_ps(
                            t,
                            _mm256_mul_ps(
                                _mm256_mul_ps(_mm256_set1_ps(mw[rr * nb + b]), da),
                                _mm256_cvtepi32_ps(asum),
                            ),
                        );
                    }
                    let l = &mut acc[rr][h][b % 8];
                    *l = _mm256_add_ps(*l, t);
                }
            }
        }
        store_sums2(&acc, &mut out[..R]);
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn gguf_tokens2_impl(
        ty: GgmlType,
        bytes: &[u8],
        rb: usize,
        groups: &[TokenGroup],
        ys: &mut [f32],
        r0: usize,
        k: usize,
        buf: &mut Vec<u32>,
    ) {
        const P: usize = PASS_ROWS32;
        let nb = rb / ty.type_size();
        let nw = nb * 8;
        let n: usize = groups.iter().map(|g| g.n).sum();
        buf.resize(P * nw, 0);
        let (mut wsum, mut dw, mut mw) =
            (vec![0i32; P * nb], vec![0f32; P * nb], vec![0f32; P * nb]);
        let mut out = [[0f32; 16]; P];
        let mut j = 0;
        while j < k {
            let nr = (k - j).min(P);
            for rr in 0..nr {
                let r = r0 + j + rr;
                unpack32(
                    ty,
                    &bytes[r * rb..(r + 1) * rb],
                    &mut buf[rr * nw..(rr + 1) * nw],
                    &mut wsum[rr * nb..(rr + 1) * nb],
                    &mut dw[rr * nb..(rr + 1) * nb],
                    &mut mw[rr * nb..(rr + 1) * nb],
                );
            }
            let mut t0 = 0;
            for g in groups {
                let mut r = 0;
                while r < nr {
                    let m = next_rows(nr - r);
                    let (w, d, mn, o) =
                        (&buf[r * nw..], &dw[r * nb..], &mw[r * nb..], &mut out[r..]);
                    match m {
                        4 => tokens32_2::<4>(ty, w, d, mn, nb, g, o),
                        2 => tokens32_2::<2>(ty, w, d, mn, nb, g, o),
                        _ => tokens32_2::<1>(ty, w, d, mn, nb, g, o),
                    }
                    r += m;
                }
                scatter_group(&out[..nr], g, ys, n, j, &mut t0);
            }
            j += nr;
        }
    }

    /// `R` rows of a k-quant (unpacked by [`unpack256`], whose `c` this kernel does not use)
    /// against the 16 tokens of `g`: `out[r]`. Per sub-block each token's exact `sum w*q`
    /// times the sub-block's scale; the min (or Q6_K's `32 sum q`) term from the tokens'
    /// 16-value sums by `vpmaddwd`; then [`gguf_rows`]'s f32 term, added to lane `b % 8`.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn tokens256_2<const R: usize>(
        ty: GgmlType,
        u: Rows256,
        nb: usize,
        g: &TokenGroup,
        out: &mut [[f32; 16]],
    ) {
        let Rows256 {
            w, sc, mp, d, dmin, ..
        } = u;
        let nw = nb * 64;
        let ns = subs(ty);
        let wps = 64 / ns; // words per sub-block
        let f = steps16(Some(ty));
        let mut acc = [[[_mm256_setzero_ps(); 8]; 2]; R];
        for b in 0..nb {
            // Each step group's i16 lanes times the sub-block's scale straight into i32 by
            // `vpmaddwd` (the scale as both i16 factors of a pair: |lane| <= 32,767 and
            // |scale| <= 128, so a pair's sum fits i32), in place of `vpmaddwd` by ones and a
            // `vpmulld`: the same integer.
            let mut s1 = [[_mm256_setzero_si256(); 2]; R];
            for j in 0..ns {
                let mut scv = [_mm256_setzero_si256(); R];
                for (rr, v) in scv.iter_mut().enumerate() {
                    *v = _mm256_set1_epi16(*sc.get_unchecked(rr * nb * 16 + b * 16 + j) as i16);
                }
                let w0 = b * 64 + j * wps;
                for s0 in (w0..w0 + wps).step_by(f) {
                    let mut a16 = [[_mm256_setzero_si256(); 2]; R];
                    for gi in s0..s0 + f {
                        let x = q_halves(g, gi);
                        for rr in 0..R {
                            let wv = _mm256_set1_epi32(*w.get_unchecked(rr * nw + gi) as i32);
                            for h in 0..2 {
                                let p = _mm256_maddubs_epi16(wv, x[h]);
                                a16[rr][h] = _mm256_add_epi16(a16[rr][h], p);
                            }
                        }
                    }
                    for rr in 0..R {
                        for h in 0..2 {
                            let p = _mm256_madd_epi16(a16[rr][h], scv[rr]);
                            s1[rr][h] = _mm256_add_epi32(s1[rr][h], p);
                        }
                    }
                }
            }
            let mut s2 = [[_mm256_setzero_si256(); 2]; R];
            for p in 0..8 {
                for h in 0..2 {
                    let sv = _mm256_loadu_si256(
                        g.s16.as_ptr().add((b * 8 + p) * 32 + h * 16) as *const _
                    );
                    for rr in 0..R {
                        let mv = _mm256_set1_epi32(*mp.get_unchecked(rr * nb * 8 + b * 8 + p));
                        s2[rr][h] = _mm256_add_epi32(s2[rr][h], _mm256_madd_epi16(sv, mv));
                    }
                }
            }
            for h in 0..2 {
                let da = _mm256_loadu_ps(g.da.as_ptr().add(b * 16 + h * 8));
                for rr in 0..R {
                    let dv = _mm256_set1_ps(d[rr * nb + b]);
                    let t = if ty == GgmlType::Q6_K {
                        let isum = _mm256_sub_epi32(s1[rr][h], _mm256_slli_epi32(s2[rr][h], 5));
                        _mm256_mul_ps(_mm256_mul_ps(dv, da), _mm256_cvtepi32_ps(isum))
                    } else {
                        let mv = _mm256_set1_ps(dmin[rr * nb + b]);
                        _mm256_sub_ps(
                            _mm256_mul_ps(_mm256_mul_ps(dv, da), _mm256_cvtepi32_ps(s1[rr][h])),
                            _mm256_mul_ps(_mm256_mul_ps(mv, da), _mm256_cvtepi32_ps(s2[rr][h])),
                        )
                    };
                    let l = &mut acc[rr][h][b % 8];
                    *l = _mm256_add_ps(*l, t);
                }
            }
        }
        store_sums2(&acc, &mut out[..R]);
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tokens256_2_impl(
        ty: GgmlType,
        bytes: &[u8],
        rb: usize,
        groups: &[TokenGroup],
        ys: &mut [f32],
        r0: usize,
        k: usize,
        buf: &mut Vec<u32>,
    ) {
        const P: usize = PASS_ROWS256;
        let nb = rb / ty.type_size();
        let nw = nb * 64;
        let n: usize = groups.iter().map(|g| g.n).sum();
        buf.resize(P * nw, 0);
        let mut sc = vec![0i32; P * nb * 16];
        let mut mp = vec![0i32; P * nb * 8];
        let mut c = vec![0i32; P * nb];
        let mut d = vec![0f32; P * nb];
        let mut dmin = vec![0f32; P * nb];
        let mut out = [[0f32; 16]; P];
        let mut j = 0;
        while j < k {
            let nr = (k - j).min(P);
            for rr in 0..nr {
                let r = r0 + j + rr;
                let mut u = Unpacked256 {
                    w: &mut buf[rr * nw..(rr + 1) * nw],
                    sc: &mut sc[rr * nb * 16..(rr + 1) * nb * 16],
                    mp: &mut mp[rr * nb * 8..(rr + 1) * nb * 8],
                    c: &mut c[rr * nb..(rr + 1) * nb],
                    d: &mut d[rr * nb..(rr + 1) * nb],
                    dmin: &mut dmin[rr * nb..(rr + 1) * nb],
                };
                unpack256(ty, &bytes[r * rb..(r + 1) * rb], &mut u);
            }
            let u = Rows256 {
                w: buf,
                sc: &sc,
                mp: &mp,
                c: &c,
                d: &d,
                dmin: &dmin,
            };
            let mut t0 = 0;
            for g in groups {
                let mut r = 0;
                while r < nr {
                    let m = next_rows(nr - r);
                    let (v, o) = (u.from(r, nb), &mut out[r..]);
                    match m {
                        4 => tokens256_2::<4>(ty, v, nb, g, o),
                        2 => tokens256_2::<2>(ty, v, nb, g, o),
                        _ => tokens256_2::<1>(ty, v, nb, g, o),
                    }
                    r += m;
                }
                scatter_group(&out[..nr], g, ys, n, j, &mut t0);
            }
            j += nr;
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gguf_tokens_avx2(
        ty: GgmlType,
        bytes: &[u8],
        rb: usize,
        groups: &[TokenGroup],
        ys: &mut [f32],
        r0: usize,
        k: usize,
        buf: &mut Vec<u32>,
    ) {
        // One copy of the kernel per type, the type's branches folded away.
        use GgmlType as T;
        match ty {
            T::Q8_0 => gguf_tokens2_impl(T::Q8_0, bytes, rb, groups, ys, r0, k, buf),
            T::Q4_0 => gguf_tokens2_impl(T::Q4_0, bytes, rb, groups, ys, r0, k, buf),
            T::Q4_1 => gguf_tokens2_impl(T::Q4_1, bytes, rb, groups, ys, r0, k, buf),
            T::Q5_0 => gguf_tokens2_impl(T::Q5_0, bytes, rb, groups, ys, r0, k, buf),
            T::Q5_1 => gguf_tokens2_impl(T::Q5_1, bytes, rb, groups, ys, r0, k, buf),
            T::Q4_K => tokens256_2_impl(T::Q4_K, bytes, rb, groups, ys, r0, k, buf),
            T::Q5_K => tokens256_2_impl(T::Q5_K, bytes, rb, groups, ys, r0, k, buf),
            T::Q6_K => tokens256_2_impl(T::Q6_K, bytes, rb, groups, ys, r0, k, buf),
            _ => unreachable!("gguf_tokens_available admits only act_block's types"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::matvec::{self, Kernel, WeightData};

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    /// Every implementation this machine can run.
    fn isas() -> Vec<Isa> {
        let mut v = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c") {
                v.push(Isa::Avx2);
            }
            if detect() == Isa::Avx512Vnni {
                v.push(Isa::Avx512Vnni);
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            v.push(Isa::Neon);
            if detect() == Isa::NeonDot {
                v.push(Isa::NeonDot);
            }
        }
        v
    }

    /// A NaN activation makes its block's scale NaN, and so every row's sum (the int8 kernel
    /// reports non-finite logits as the f32 one does, instead of reading the NaN as 0); an
    /// infinite one too. Single token and a prefill chunk, ternary and GGUF weights.
    #[test]
    fn a_non_finite_activation_gives_non_finite_sums() {
        let (rows, cols) = (32, 512);
        let mut seed = 7u64;
        let words: Vec<u32> = (0..rows * cols / 16)
            .map(|_| lcg(&mut seed) & 0x5555_5555)
            .collect();
        let scales = vec![half::f16::from_f32(0.01).to_bits(); rows * cols / 256];
        let q4 = random_blocks(GgmlType::Q4_0, rows * cols / 32, &mut seed);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let a = quantize(&[1.0, bad, 0.5, -2.0].repeat(64), 256);
            assert!(!a.d[0].is_finite(), "{bad}");
            for w in [
                WeightData::Ternary {
                    words: &words,
                    scales: &scales,
                },
                WeightData::Gguf {
                    ty: GgmlType::Q4_0,
                    bytes: &q4,
                },
            ] {
                for n in [1, 20] {
                    let mut x: Vec<f32> = (0..n * cols).map(|i| (i % 7) as f32 - 3.0).collect();
                    // The last token's 300th value.
                    x[(n - 1) * cols + 300] = bad;
                    let mut y = vec![0f32; n * rows];
                    matvec::matmul_with(Kernel::Int8, w, cols, &x, &mut y);
                    for t in 0..n {
                        let yt = &y[t * rows..(t + 1) * rows];
                        if t == n - 1 {
                            assert!(yt.iter().all(|v| v.is_nan()), "{bad} n={n}: {yt:?}");
                        } else {
                            assert!(yt.iter().all(|v| v.is_finite()), "{bad} n={n} token {t}");
                        }
                    }
                }
            }
        }
    }

    /// Random blocks of `ty` with modest finite scales (every f16 field overwritten).
    fn random_blocks(ty: GgmlType, n_blocks: usize, seed: &mut u64) -> Vec<u8> {
        let ts = ty.type_size();
        let mut bytes: Vec<u8> = (0..n_blocks * ts).map(|_| lcg(seed) as u8).collect();
        for (i, b) in bytes.chunks_exact_mut(ts).enumerate() {
            let d = half::f16::from_f32(0.002 * (1 + i % 9) as f32).to_le_bytes();
            let m = half::f16::from_f32(-0.01 * (1 + i % 4) as f32).to_le_bytes();
            match ty {
                GgmlType::Q6_K => b[208..210].copy_from_slice(&d),
                GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => {
                    b[0..2].copy_from_slice(&d);
                    b[2..4].copy_from_slice(&m);
                }
                _ => b[0..2].copy_from_slice(&d),
            }
        }
        bytes
    }

    fn activations(n: usize, seed: &mut u64) -> Vec<f32> {
        let mut x: Vec<f32> = (0..n)
            .map(|_| (lcg(seed) % 20001) as f32 / 10000.0 - 1.0)
            .collect();
        // An all-zero block and an outlier, to exercise d = 0 and the clamp.
        x[..32].iter_mut().for_each(|v| *v = 0.0);
        x[n / 2] = 9.5;
        x
    }

    #[test]
    fn every_path_gives_the_same_bits_and_the_exact_dot_on_quantized_activations() {
        let mut seed = 5u64;
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ] {
            let block = act_block(ty).unwrap();
            // 576 = 18 blocks of 32 (a tail of 2 after the 8-block groups), 224 (7: only a
            // tail), 896 (28: Qwen2.5's rows), 992 (31); 1280 = 5 super-blocks.
            let widths: &[usize] = if block == 32 {
                &[576, 224, 896, 992]
            } else {
                &[1280]
            };
            for &cols in widths {
                let rows = 21;
                let rb = ty.bytes_for(cols as u64).unwrap() as usize;
                let bytes = random_blocks(ty, rows * rb / ty.type_size(), &mut seed);
                let x = activations(cols, &mut seed);
                let a = quantize(&x, block);
                let mut want = vec![0f32; rows];
                gguf_rows(Isa::Portable, ty, &bytes, rb, &a, &mut want, 0);
                for isa in isas() {
                    let mut y = vec![0f32; rows];
                    gguf_rows(isa, ty, &bytes, rb, &a, &mut y[3..], 3);
                    gguf_rows(isa, ty, &bytes, rb, &a, &mut y[..3], 0);
                    for (r, (p, q)) in y.iter().zip(&want).enumerate() {
                        assert_eq!(p.to_bits(), q.to_bits(), "{ty} {isa:?} row {r}: {p} vs {q}");
                    }
                }
                // The definition: the dequantized weights times the quantized activations, in f64.
                let mut w = vec![0f32; cols];
                for (r, y) in want.iter().enumerate() {
                    crate::quant::dequantize(ty, &bytes[r * rb..(r + 1) * rb], &mut w).unwrap();
                    let exact: f64 = w
                        .iter()
                        .enumerate()
                        .map(|(k, wk)| *wk as f64 * a.d[k / block] as f64 * a.q[k] as f64)
                        .sum();
                    let scale: f64 = w
                        .iter()
                        .enumerate()
                        .map(|(k, wk)| (*wk as f64 * a.d[k / block] as f64 * a.q[k] as f64).abs())
                        .sum();
                    assert!(
                        (*y as f64 - exact).abs() <= 1e-5 * (1.0 + scale),
                        "{ty} row {r}: {y} vs {exact}"
                    );
                }
                // And the f32-activation kernel within the activation rounding.
                let mut yf = vec![0f32; rows];
                matvec::matvec(WeightData::Gguf { ty, bytes: &bytes }, cols, &x, &mut yf);
                let mut yi = vec![0f32; rows];
                matvec::matvec_with(
                    Kernel::Int8,
                    WeightData::Gguf { ty, bytes: &bytes },
                    cols,
                    &x,
                    &mut yi,
                );
                assert_eq!(
                    yi.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{ty}: matvec_with(Int8) takes the integer kernel"
                );
                // |sum w (x - d q)| <= sum |w| d / 2: the activation rounding bounds the difference.
                for (r, (p, q)) in yi.iter().zip(&yf).enumerate() {
                    crate::quant::dequantize(ty, &bytes[r * rb..(r + 1) * rb], &mut w).unwrap();
                    let bound: f64 = w
                        .iter()
                        .enumerate()
                        .map(|(k, wk)| (*wk as f64).abs() * a.d[k / block] as f64 / 2.0)
                        .sum();
                    assert!(
                        ((p - q).abs() as f64) <= bound * 1.001 + 1e-5,
                        "{ty} row {r}: {p} vs f32 {q} (bound {bound})"
                    );
                }
            }
        }
    }

    /// Q5 blocks covering the edge cases, by block index: `d = 0`, negative `d`, `qh = 0`,
    /// `qh = 0xFFFFFFFF` with every nibble 15 (all weights 31), `qh = 0xFFFFFFFF` with every
    /// nibble 0 (all weights 16), then random bytes with a random-sign scale. Q5_1 mins: zero
    /// every fifth block, else of random sign.
    fn q5_edge_blocks(ty: GgmlType, n_blocks: usize, seed: &mut u64) -> Vec<u8> {
        let ts = ty.type_size();
        let (qh, qs) = if ty == GgmlType::Q5_0 { (2, 6) } else { (4, 8) };
        let mut bytes = random_blocks(ty, n_blocks, seed);
        for (i, b) in bytes.chunks_exact_mut(ts).enumerate() {
            let sign = if lcg(seed).is_multiple_of(2) {
                1.0
            } else {
                -1.0
            };
            let d = match i % 7 {
                0 => 0.0,
                1 => -0.75,
                _ => sign * 0.001 * (1 + lcg(seed) % 50) as f32,
            };
            b[0..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
            if ty == GgmlType::Q5_1 {
                let m = match i % 5 {
                    0 => 0.0,
                    _ => sign * -0.02 * (1 + lcg(seed) % 10) as f32,
                };
                b[2..4].copy_from_slice(&half::f16::from_f32(m).to_le_bytes());
            }
            match i % 7 {
                2 => b[qh..qh + 4].copy_from_slice(&0u32.to_le_bytes()),
                3 => {
                    b[qh..qh + 4].copy_from_slice(&u32::MAX.to_le_bytes());
                    b[qs..qs + 16].fill(0xFF);
                }
                4 => {
                    b[qh..qh + 4].copy_from_slice(&u32::MAX.to_le_bytes());
                    b[qs..qs + 16].fill(0);
                }
                _ => {}
            }
        }
        bytes
    }

    /// The term of block `b` from an independent decoding: the block dequantized by
    /// `crate::quant` with `d = 1` (and `m = 0`) gives the codes exactly (Q5_0 signed, Q5_1
    /// unsigned), whose dot with the activation codes, and their sum, are summed in i64.
    fn q5_reference_term(ty: GgmlType, blk: &[u8], a: &QAct, b: usize) -> f32 {
        let mut unit = blk.to_vec();
        unit[0..2].copy_from_slice(&half::f16::ONE.to_le_bytes());
        if ty == GgmlType::Q5_1 {
            unit[2..4].copy_from_slice(&half::f16::ZERO.to_le_bytes());
        }
        let mut w = [0f32; 32];
        crate::quant::dequantize(ty, &unit, &mut w).unwrap();
        let lo = if ty == GgmlType::Q5_0 { -16.0 } else { 0.0 };
        assert!(w
            .iter()
            .all(|v| v.fract() == 0.0 && (lo..lo + 32.0).contains(v)));
        let q = &a.q[b * 32..b * 32 + 32];
        let isum: i64 = w.iter().zip(q).map(|(&w, &q)| w as i64 * q as i64).sum();
        let qsum: i64 = q.iter().map(|&q| q as i64).sum();
        let (dw, da) = (f16_at(blk, 0), a.d[b]);
        if ty == GgmlType::Q5_1 {
            (dw * da) * isum as f32 + (f16_at(blk, 2) * da) * qsum as f32
        } else {
            (dw * da) * isum as f32
        }
    }

    #[test]
    fn q5_edge_blocks_match_the_integer_reference_on_every_path() {
        for ty in [GgmlType::Q5_0, GgmlType::Q5_1] {
            // 19 blocks: two groups of eight and a tail of three; an odd row count.
            let (cols, rows) = (19 * 32, 13);
            let mut seed = 23u64;
            let rb = ty.bytes_for(cols as u64).unwrap() as usize;
            let bytes = q5_edge_blocks(ty, rows * rb / ty.type_size(), &mut seed);
            let mut x = activations(cols, &mut seed);
            // Blocks of activations at +127 and at -127 (the largest |sum q|).
            x[64..96].fill(1.0);
            x[96..128].fill(-2.0);
            let a = quantize(&x, 32);
            assert!(a.q[64..96].iter().all(|&q| q == 127) && a.sum[3] == -127 * 32);
            let mut want = vec![0f32; rows];
            for (r, y) in want.iter_mut().enumerate() {
                let row = &bytes[r * rb..(r + 1) * rb];
                let mut l = [0f32; 8];
                for (b, blk) in row.chunks_exact(ty.type_size()).enumerate() {
                    let t = q5_reference_term(ty, blk, &a, b);
                    let p = portable::term(ty, blk, &a, b);
                    assert_eq!(
                        p.to_bits(),
                        t.to_bits(),
                        "{ty} row {r} block {b}: {p} vs {t}"
                    );
                    l[b % 8] += t;
                }
                *y = lanes_sum(&l);
            }
            for isa in isas() {
                let mut y = vec![0f32; rows];
                gguf_rows(isa, ty, &bytes, rb, &a, &mut y[7..], 7);
                gguf_rows(isa, ty, &bytes, rb, &a, &mut y[..7], 0);
                for (r, (p, q)) in y.iter().zip(&want).enumerate() {
                    assert_eq!(p.to_bits(), q.to_bits(), "{ty} {isa:?} row {r}: {p} vs {q}");
                }
            }
        }
    }

    #[test]
    fn q5k_blocks_match_the_integer_reference_on_every_path() {
        let ty = GgmlType::Q5_K;
        // 9 super-blocks: one group of eight lanes and one more; an odd row count.
        let (cols, rows) = (9 * 256, 7);
        let mut seed = 31u64;
        let rb = ty.bytes_for(cols as u64).unwrap() as usize;
        let mut bytes = random_blocks(ty, rows * rb / ty.type_size(), &mut seed);
        // By block: d = 0, negative d and dmin, qh = 0, qh all ones with nibbles 15, then random.
        for (i, b) in bytes.chunks_exact_mut(ty.type_size()).enumerate() {
            match i % 5 {
                0 => b[0..2].copy_from_slice(&half::f16::ZERO.to_le_bytes()),
                1 => {
                    b[0..2].copy_from_slice(&half::f16::from_f32(-0.5).to_le_bytes());
                    b[2..4].copy_from_slice(&half::f16::from_f32(-0.25).to_le_bytes());
                }
                2 => b[16..48].fill(0),
                3 => {
                    b[16..48].fill(0xFF);
                    b[48..176].fill(0xFF);
                }
                _ => {}
            }
        }
        let mut x = activations(cols, &mut seed);
        x[256..512].fill(-1.0);
        let a = quantize(&x, 256);
        // Independent sums from crate::quant: d = 1, dmin = 0 gives sc_j * w; d = 0, dmin = 1
        // gives -m_j; each dotted with the activation codes in i64.
        let isum = |blk: &[u8], d: half::f16, dmin: half::f16, b: usize| -> i64 {
            let mut unit = blk.to_vec();
            unit[0..2].copy_from_slice(&d.to_le_bytes());
            unit[2..4].copy_from_slice(&dmin.to_le_bytes());
            let mut w = [0f32; 256];
            crate::quant::dequantize(ty, &unit, &mut w).unwrap();
            assert!(w.iter().all(|v| v.fract() == 0.0));
            let q = &a.q[b * 256..b * 256 + 256];
            w.iter().zip(q).map(|(&w, &q)| w as i64 * q as i64).sum()
        };
        let mut want = vec![0f32; rows];
        for (r, y) in want.iter_mut().enumerate() {
            let mut l = [0f32; 8];
            for (b, blk) in bytes[r * rb..(r + 1) * rb]
                .chunks_exact(ty.type_size())
                .enumerate()
            {
                let s1 = isum(blk, half::f16::ONE, half::f16::ZERO, b);
                let s2 = -isum(blk, half::f16::ZERO, half::f16::ONE, b);
                let da = a.d[b];
                let t = (f16_at(blk, 0) * da) * s1 as f32 - (f16_at(blk, 2) * da) * s2 as f32;
                let p = portable::term(ty, blk, &a, b);
                assert_eq!(p.to_bits(), t.to_bits(), "row {r} block {b}: {p} vs {t}");
                l[b % 8] += t;
            }
            *y = lanes_sum(&l);
        }
        for isa in isas() {
            let mut y = vec![0f32; rows];
            gguf_rows(isa, ty, &bytes, rb, &a, &mut y[2..], 2);
            gguf_rows(isa, ty, &bytes, rb, &a, &mut y[..2], 0);
            for (r, (p, q)) in y.iter().zip(&want).enumerate() {
                assert_eq!(p.to_bits(), q.to_bits(), "{isa:?} row {r}: {p} vs {q}");
            }
        }
    }

    /// Time of one Q5_0 and one Q5_1 matvec at Qwen2.5-0.5B's FFN shapes on one thread: the f32 kernel
    /// (dequantize a row, then dot) against the integer kernel on each ISA (activation
    /// quantization included). Prints; asserts nothing. Run with
    /// `cargo test --release --lib q5_matvec_timing -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn q5_matvec_timing() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        for (ty, (rows, cols)) in [GgmlType::Q5_0, GgmlType::Q5_1]
            .into_iter()
            .flat_map(|ty| [(ty, (4864, 896)), (ty, (896, 4864))])
        {
            let mut seed = 3u64;
            let rb = ty.bytes_for(cols as u64).unwrap() as usize;
            let bytes = random_blocks(ty, rows * rb / ty.type_size(), &mut seed);
            let x = activations(cols, &mut seed);
            let mut y = vec![0f32; rows];
            let time = |f: &mut dyn FnMut()| {
                f();
                let mut t: Vec<u128> = (0..15)
                    .map(|_| {
                        let s = std::time::Instant::now();
                        f();
                        s.elapsed().as_nanos()
                    })
                    .collect();
                t.sort();
                t[t.len() / 2]
            };
            let wd = WeightData::Gguf { ty, bytes: &bytes };
            let f32_ns = time(&mut || pool.install(|| matvec::matvec(wd, cols, &x, &mut y)));
            eprintln!("{ty} [{rows}, {cols}] f32 kernel: {f32_ns} ns");
            for isa in isas() {
                let ns = time(&mut || {
                    let a = quantize(&x, 32);
                    gguf_rows(isa, ty, &bytes, rb, &a, &mut y, 0);
                });
                eprintln!("{ty} [{rows}, {cols}] int8 {isa:?}: {ns} ns");
            }
        }
    }

    #[test]
    fn ternary_paths_agree_bit_for_bit() {
        // 2304 = 9 blocks: one group of eight and a tail.
        let (cols, rows) = (2304, 19);
        let mut seed = 11u64;
        let x = activations(cols, &mut seed);
        let words: Vec<u32> = (0..rows * cols / 16)
            .map(|_| (0..16).fold(0u32, |w, j| w | ((lcg(&mut seed) % 3) << (2 * j))))
            .collect();
        let scales: Vec<u16> = (0..rows * cols / 256)
            .map(|i| {
                let s = if i % 3 == 0 { -0.02 } else { 0.02 };
                half::f16::from_f32(s * (1 + i % 5) as f32).to_bits()
            })
            .collect();
        let a = quantize(&x, 256);
        let p = permute_for_ternary(&a);
        let mut want = vec![0f32; rows];
        ternary_rows(Isa::Portable, &words, &scales, cols, &a, &p, &mut want, 0);
        for isa in isas() {
            let mut y = vec![0f32; rows];
            ternary_rows(isa, &words, &scales, cols, &a, &p, &mut y[5..], 5);
            ternary_rows(isa, &words, &scales, cols, &a, &p, &mut y[..5], 0);
            assert_eq!(
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{isa:?}"
            );
        }
        let wd = WeightData::Ternary {
            words: &words,
            scales: &scales,
        };
        let mut yi = vec![0f32; rows];
        matvec::matvec_with(Kernel::Int8, wd, cols, &x, &mut yi);
        assert_eq!(
            yi.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        let mut rowv = vec![0f32; cols];
        for (r, y) in want.iter().enumerate() {
            matvec::row(wd, cols, r, &mut rowv);
            let exact: f64 = rowv
                .iter()
                .enumerate()
                .map(|(k, w)| *w as f64 * a.d[k / 256] as f64 * a.q[k] as f64)
                .sum();
            assert!((*y as f64 - exact).abs() < 1e-4, "row {r}: {y} vs {exact}");
        }
    }

    #[test]
    fn rounding_is_f32_round_on_every_kind_of_value() {
        // Every 251st f32 bit pattern (both signs, subnormals, NaN, inf), ties and their
        // neighbours, against `f32::round` then the clamp and cast.
        let mut x: Vec<f32> = (0..=u32::MAX / 251)
            .map(|i| f32::from_bits(i * 251))
            .collect();
        for k in -130..130 {
            let t = k as f32 + 0.5;
            x.extend([
                t,
                f32::from_bits(t.to_bits() - 1),
                f32::from_bits(t.to_bits() + 1),
            ]);
        }
        x.extend([
            0.49999997,
            -0.49999997,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -0.0,
        ]);
        for id in [1.0f32, 127.0 / 3.5] {
            let mut got = vec![0i8; x.len()];
            round_block(&x, id, &mut got);
            for (v, g) in x.iter().zip(&got) {
                let want = (v * id).round().clamp(-127.0, 127.0) as i8;
                assert_eq!(*g, want, "{v:e} * {id}");
            }
        }
    }

    #[test]
    fn quantize_keeps_zero_blocks_and_sums() {
        let mut x = vec![0f32; 64];
        x[32] = 1.27;
        x[34] = 0.0151;
        let a = quantize(&x, 32);
        assert_eq!(a.d[0], 0.0);
        assert!(a.q[..32].iter().all(|&q| q == 0));
        assert_eq!(a.q[32], 127);
        assert_eq!(a.q[34], 2);
        assert_eq!(a.sum[1], a.q[32..].iter().map(|&q| q as i32).sum::<i32>());
        assert_eq!(a.sum16.len(), 4);
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Every level of [`Isa`], this CPU's or not: a level the CPU lacks runs one it has.
    const ALL_ISAS: [Isa; 5] = [
        Isa::Portable,
        Isa::Avx2,
        Isa::Avx512Vnni,
        Isa::Neon,
        Isa::NeonDot,
    ];

    /// Activation blocks of all +127, all -127 and alternating +-127 (a QAct of `block`).
    fn extreme_acts(cols: usize, block: usize) -> QAct {
        let x: Vec<f32> = (0..cols)
            .map(|i| match (i / block) % 3 {
                0 => 1.0,
                1 => -1.0,
                _ if i % 2 == 0 => 1.0,
                _ => -1.0,
            })
            .collect();
        let a = quantize(&x, block);
        assert!(a.q.iter().all(|&q| q == 127 || q == -127));
        a
    }

    /// Extreme blocks (every payload byte 0x80, 0x7F, 0xFF, or those and 0x00 in turn: Q8_0
    /// weights of -128 and 127, the largest codes, Q6_K scales of -128) against extreme
    /// activations, and ternary words of every code; each level of [`ALL_ISAS`] against the
    /// portable definition, bit for bit (from a review of the NEON paths).
    #[test]
    fn extreme_blocks_give_the_portable_bits_on_every_level() {
        let (cols, rows) = (9 * 256, 4);
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ] {
            let block = act_block(ty).unwrap();
            let rb = ty.bytes_for(cols as u64).unwrap() as usize;
            let a = extreme_acts(cols, block);
            for fill in [&[0x80u8][..], &[0x7F], &[0xFF], &[0x80, 0x7F, 0xFF, 0x00]] {
                let ts = ty.type_size();
                let mut bytes = vec![0u8; rows * rb];
                for (i, b) in bytes.chunks_exact_mut(ts).enumerate() {
                    b.fill(fill[i % fill.len()]);
                    let one = half::f16::from_f32(1.0).to_le_bytes();
                    let m = half::f16::from_f32(-0.5).to_le_bytes();
                    match ty {
                        GgmlType::Q6_K => b[208..210].copy_from_slice(&one),
                        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => {
                            b[0..2].copy_from_slice(&one);
                            b[2..4].copy_from_slice(&m);
                        }
                        _ => b[0..2].copy_from_slice(&one),
                    }
                }
                let want: Vec<u32> = bytes
                    .chunks_exact(rb)
                    .map(|r| portable::row(ty, r, &a).to_bits())
                    .collect();
                for isa in ALL_ISAS {
                    let mut y = vec![0f32; rows];
                    gguf_rows(isa, ty, &bytes, rb, &a, &mut y, 0);
                    assert_eq!(bits(&y), want, "{ty} {isa:?} fill {fill:?}");
                }
            }
        }
        let a = extreme_acts(cols, 256);
        let p = permute_for_ternary(&a);
        for w in [0xFFFF_FFFFu32, 0xAAAA_AAAA, 0x1B1B_1B1B, 0] {
            let words = vec![w; rows * cols / 16];
            let scales = vec![half::f16::from_f32(-0.75).to_bits(); rows * cols / 256];
            let mut want = vec![0f32; rows];
            ternary_rows(Isa::Portable, &words, &scales, cols, &a, &p, &mut want, 0);
            for isa in ALL_ISAS {
                let mut y = vec![0f32; rows];
                ternary_rows(isa, &words, &scales, cols, &a, &p, &mut y, 0);
                assert_eq!(bits(&y), bits(&want), "ternary {isa:?} {w:#x}");
            }
        }
    }

    /// The multi-token kernels (AVX-512, AVX2, NEON with and without `sdot`, each where this
    /// CPU has it) against the portable single-token definition, bit for bit: every type
    /// they take and ternary, random and extreme blocks (the largest codes, Q8_0's -128 and
    /// 127, every ternary code) against random and extreme (all +-127: the i16 lanes' worst
    /// case) activations; 13 rows (passes of 8 or 4, then 4, 2 and 1), 1, 16, 17 and 35
    /// tokens (partial groups), 9 k-quant blocks and 72 32-element blocks a row (no multiple
    /// of 8).
    /// A multi-token entry point on `(level, groups, ys, r0, k)`.
    type RunTokens<'a> = dyn Fn(Isa, &[TokenGroup], &mut [f32], usize, usize) + 'a;

    #[test]
    fn tokens_kernels_give_the_single_token_bits_on_every_level() {
        let (cols, rows) = (9 * 256, 13);
        let levels: Vec<Isa> = [Isa::Avx512Vnni, Isa::Avx2, Isa::NeonDot, Isa::Neon]
            .into_iter()
            .filter(|&l| tokens_level(l) == Some(l))
            .collect();
        eprintln!("multi-token levels on this CPU: {levels:?}");
        let mut seed = 11u64;
        let acts_for = |block: usize, n: usize, seed: &mut u64| -> Vec<QAct> {
            (0..n)
                .map(|t| match t % 3 {
                    0 => extreme_acts(cols, block),
                    _ => quantize(&activations(cols, seed), block),
                })
                .collect()
        };
        let check = |what: &str,
                     n: usize,
                     want: &dyn Fn(usize, &QAct) -> Vec<u32>,
                     block: usize,
                     run: &RunTokens,
                     seed: &mut u64| {
            let acts = acts_for(block, n, seed);
            let groups = token_groups(&acts.iter().collect::<Vec<_>>());
            let want: Vec<Vec<u32>> = acts.iter().enumerate().map(|(t, a)| want(t, a)).collect();
            for &l in &levels {
                // Every row, then rows 3.. (a task that does not start at row 0).
                for r0 in [0, 3] {
                    let k = rows - r0;
                    let mut ys = vec![0f32; k * n];
                    run(l, &groups, &mut ys, r0, k);
                    for (t, w) in want.iter().enumerate() {
                        let got: Vec<u32> = (0..k).map(|r| ys[r * n + t].to_bits()).collect();
                        assert_eq!(&got, &w[r0..], "{what} {l:?} n {n} r0 {r0} token {t}");
                    }
                }
            }
        };
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ] {
            let block = act_block(ty).unwrap();
            let rb = ty.bytes_for(cols as u64).unwrap() as usize;
            let ts = ty.type_size();
            let mut extreme = random_blocks(ty, rows * rb / ts, &mut seed);
            for (i, b) in extreme.chunks_exact_mut(ts).enumerate() {
                // Payload bytes all 0x80, 0x7F or 0xFF (row by row), the f16 fields kept.
                let fill = [0x80u8, 0x7F, 0xFF][(i / (rb / ts)) % 3];
                let keep: Vec<u8> = b.to_vec();
                b.fill(fill);
                match ty {
                    GgmlType::Q6_K => b[208..210].copy_from_slice(&keep[208..210]),
                    GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => {
                        b[0..4].copy_from_slice(&keep[0..4])
                    }
                    _ => b[0..2].copy_from_slice(&keep[0..2]),
                }
            }
            for bytes in [random_blocks(ty, rows * rb / ts, &mut seed), extreme] {
                for n in [1, 16, 17, 35] {
                    let want = |_: usize, a: &QAct| -> Vec<u32> {
                        let mut y = vec![0f32; rows];
                        gguf_rows(Isa::Portable, ty, &bytes, rb, a, &mut y, 0);
                        bits(&y)
                    };
                    let run = |l: Isa, g: &[TokenGroup], ys: &mut [f32], r0, k| {
                        gguf_rows_tokens(l, ty, &bytes, rb, g, ys, r0, k, &mut Vec::new())
                    };
                    check(&format!("{ty}"), n, &want, block, &run, &mut seed);
                }
            }
        }
        let scales: Vec<u16> = (0..rows * cols / 256)
            .map(|i| half::f16::from_f32([0.02, -0.03, 0.0, 1.5][i % 4]).to_bits())
            .collect();
        let random: Vec<u32> = (0..rows * cols / 16).map(|_| lcg(&mut seed)).collect();
        // Every code 2 (the largest a converter writes), every code 3 (the largest a 2-bit
        // field holds), every code 0, and all four codes in turn.
        for words in [
            random,
            vec![0xAAAA_AAAA; rows * cols / 16],
            vec![0xFFFF_FFFF; rows * cols / 16],
            vec![0; rows * cols / 16],
            vec![0x1B1B_1B1B; rows * cols / 16],
        ] {
            for n in [1, 16, 17, 35] {
                let want = |_: usize, a: &QAct| -> Vec<u32> {
                    let mut y = vec![0f32; rows];
                    let p = permute_for_ternary(a);
                    ternary_rows(Isa::Portable, &words, &scales, cols, a, &p, &mut y, 0);
                    bits(&y)
                };
                let run = |l: Isa, g: &[TokenGroup], ys: &mut [f32], r0, k| {
                    ternary_rows_tokens(l, &words, &scales, cols, g, ys, r0, k, &mut Vec::new())
                };
                check(
                    &format!("ternary {:#x}", words[0]),
                    n,
                    &want,
                    256,
                    &run,
                    &mut seed,
                );
            }
        }
    }

    /// The multi-token entry points (whose kernels load unchecked) panic instead of reading
    /// past their inputs: token groups quantized in another block than the weights' (a
    /// review found 256-blocks given to Q4_0 read `da` far past its end) or of another
    /// length, too few rows of weights or scales, too short an output, and `token_groups`
    /// of activations that disagree.
    #[test]
    fn tokens_entry_points_panic_on_mismatched_inputs() {
        let cols = 512;
        let x = vec![0.5f32; cols];
        let (a32, a256) = (quantize(&x, 32), quantize(&x, 256));
        let g32 = token_groups(&[&a32, &a32]);
        let g256 = token_groups(&[&a256, &a256]);
        let short = quantize(&x[..256], 256);
        let g_short = token_groups(&[&short]);
        let q4 = random_blocks(GgmlType::Q4_0, 2 * cols / 32, &mut 3u64);
        let q4k = random_blocks(GgmlType::Q4_K, 2 * cols / 256, &mut 4u64);
        let words = vec![0x5555_5555u32; 2 * cols / 16];
        let scales = vec![half::f16::from_f32(1.0).to_bits(); 2 * cols / 256];
        let (rb4, rbk) = (cols / 32 * 18, cols / 256 * 144);
        for isa in ALL_ISAS.into_iter().filter(|&l| tokens_level(l) == Some(l)) {
            type Case<'a> = (&'a str, Box<dyn Fn() + std::panic::RefUnwindSafe + 'a>);
            // Rows 0..2 (from `r0`) into an output of `ys` values.
            let gguf = |ty, bytes: &[u8], rb, g: &[TokenGroup], ys: usize, r0| {
                gguf_rows_tokens(
                    isa,
                    ty,
                    bytes,
                    rb,
                    g,
                    &mut vec![0f32; ys],
                    r0,
                    2,
                    &mut vec![],
                )
            };
            let tern = |w: &[u32], g: &[TokenGroup], ys: usize| {
                ternary_rows_tokens(
                    isa,
                    w,
                    &scales,
                    cols,
                    g,
                    &mut vec![0f32; ys],
                    0,
                    2,
                    &mut vec![],
                )
            };
            let cases: [Case; 8] = [
                (
                    "256-blocks to Q4_0",
                    Box::new(|| gguf(GgmlType::Q4_0, &q4, rb4, &g256, 4, 0)),
                ),
                (
                    "32-blocks to Q4_K",
                    Box::new(|| gguf(GgmlType::Q4_K, &q4k, rbk, &g32, 4, 0)),
                ),
                ("32-blocks to ternary", Box::new(|| tern(&words, &g32, 4))),
                (
                    "groups of 256 values to 512 columns",
                    Box::new(|| tern(&words, &g_short, 2)),
                ),
                (
                    "ternary words for one row of two",
                    Box::new(|| tern(&words[..cols / 16], &g256, 4)),
                ),
                (
                    "GGUF rows past the bytes",
                    Box::new(|| gguf(GgmlType::Q4_0, &q4, rb4, &g32, 4, 1)),
                ),
                (
                    "short output",
                    Box::new(|| gguf(GgmlType::Q4_0, &q4, rb4, &g32, 3, 0)),
                ),
                (
                    "token_groups of two blocks",
                    Box::new(|| drop(token_groups(&[&a32, &a256]))),
                ),
            ];
            for (what, f) in cases {
                let r = std::panic::catch_unwind(&*f);
                assert!(r.is_err(), "{isa:?}: {what} did not panic");
            }
        }
    }

    /// Inputs shorter than the rows asked for panic on every level (the vector paths load
    /// unchecked) instead of reading past them: words or scales for one row of two, too few
    /// activations, GGUF bytes for one row of two.
    #[test]
    fn short_inputs_panic_on_every_level() {
        let cols = 512;
        let a = quantize(&vec![0.5f32; cols], 256);
        let p = permute_for_ternary(&a);
        let short_a = quantize(&vec![0.5f32; 256], 256);
        let one_row = vec![0x5555_5555u32; cols / 16];
        let two_rows = vec![0x5555_5555u32; 2 * cols / 16];
        let one = half::f16::from_f32(1.0).to_bits();
        let q4 = vec![0x11u8; 2 * cols / 32 * 18];
        let a32 = quantize(&vec![0.5f32; cols], 32);
        let short_a32 = quantize(&vec![0.5f32; cols - 32], 32);
        for isa in ALL_ISAS {
            type Case<'a> = (&'a str, Box<dyn Fn() + std::panic::RefUnwindSafe + 'a>);
            let cases: [Case; 5] = [
                (
                    "words",
                    Box::new(|| {
                        let s = vec![one; 2 * cols / 256];
                        ternary_rows(isa, &one_row, &s, cols, &a, &p, &mut [0.0; 2], 0)
                    }),
                ),
                (
                    "scales",
                    Box::new(|| {
                        let s = vec![one; cols / 256];
                        ternary_rows(isa, &two_rows, &s, cols, &a, &p, &mut [0.0; 2], 0)
                    }),
                ),
                (
                    "activations",
                    Box::new(|| {
                        let s = vec![one; 2 * cols / 256];
                        let sp = permute_for_ternary(&short_a);
                        ternary_rows(isa, &two_rows, &s, cols, &short_a, &sp, &mut [0.0; 2], 0)
                    }),
                ),
                (
                    "gguf bytes",
                    Box::new(|| {
                        let rb = cols / 32 * 18;
                        gguf_rows(isa, GgmlType::Q4_0, &q4[..rb], rb, &a32, &mut [0.0; 2], 0)
                    }),
                ),
                (
                    "gguf activations",
                    Box::new(|| {
                        let rb = cols / 32 * 18;
                        gguf_rows(isa, GgmlType::Q4_0, &q4, rb, &short_a32, &mut [0.0; 2], 0)
                    }),
                ),
            ];
            for (what, f) in cases {
                let r = std::panic::catch_unwind(&*f);
                assert!(r.is_err(), "{isa:?}: short {what} did not panic");
            }
        }
    }
}
