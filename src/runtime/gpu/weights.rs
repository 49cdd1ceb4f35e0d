//! Every weight encoding a bundle carries, on the GPU: upload from the bundle's bytes (as
//! stored; Q8_0 and Q6_K blocks regrouped into aligned planes, palette tables widened to f32),
//! the matrix product `y = W x` over one or more tokens, and the embedding gather
//! `out = W[ids]`.
//!
//! # Shapes and layouts
//!
//! A weight `W` is row-major `[rows, cols]` (`cols = K`, elements per row, a multiple of 32
//! for every encoding here; all real models satisfy it). Activations `x` are `[n_tokens, K]`
//! f32 row-major, products `y` `[n_tokens, rows]` f32 row-major
//! (`y[t * rows + r] = sum_k W[r, k] * x[t * K + k]`), the gather's output `[n_tokens, K]`
//! f32 and its ids `[n_tokens]` u32. Sizes below are in bytes unless they say elements.
//!
//! | [`WeightFormat`] | `data` (per row chunk) | `aux` |
//! |---|---|---|
//! | `Gguf(ty)`: Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, TQ1_0, TQ2_0, F16, BF16, F32 | the rows' GGML blocks as stored (`rows * K / block_size * type_size`) | a 4-byte placeholder (unused) |
//! | `Gguf(Q8_0)`, `Gguf(Q6_K)` | the same bytes as planes ([`q8_0_planes`]: every block's 32 codes, then every d; [`q6_k_planes`]: every ql, every qh, every scales, every d), as stored where the context's kernels of that type are a bundle's from before the planes ([`GpuContext::reads_planes`]) | the placeholder |
//! | `Ternary` (`ternary2`, [`crate::ternary`]) | codes, `rows * K/16` u32 | f16 scales, `rows * K/256` |
//! | `Palette { bits, group_size, row_bytes }` ([`crate::palette`]) | indices, `rows * row_bytes` (`row_bytes = K * bits / 8`) | the tables of the groups the chunk's rows belong to, `2^bits` entries each, widened to f32 (as stored, f16, for a bundle's kernels from before: [`GpuContext::reads_f32_tables`]) |
//!
//! Every kernel sees 32 consecutive elements of a row (a *unit*: one block of the 32-element
//! GGML types, an eighth of a 256-element block, 16 f16 words, `bits` palette words) through
//! one WGSL function per encoding, `unit(row, u)`, which returns the unit's values as f32
//! (`shaders/weights/unit_*.wgsl`). The gather stores them; the products dot them with x.
//!
//! # Unaligned blocks
//!
//! GGML blocks of 18, 22, 34, 54, 66, 110 and 210 bytes put most blocks off a 4-byte
//! boundary (block `i` of a row starts at byte `i * type_size`; 20, 24, 84, 144 and 176 are
//! multiples of 4 but are read the same way). The bytes are uploaded exactly as stored (but
//! Q8_0's and Q6_K's, regrouped into aligned planes: [`q8_0_planes`], [`q6_k_planes`]),
//! padded with zeros to a whole word and then **one more zero word**, and read as
//! `array<u32>` (byte `b` is bits `8*(b%4)..` of word `b/4`) through three helpers in
//! `shaders/weights/common.wgsl`: `byte_at(b)`, `half_at(b)` (two bytes at an even `b`:
//! every type size and every f16 field offset is even, so every f16 field is at an even
//! byte), and `word_at(b)`, four bytes at any `b`: the two words holding them shifted
//! together, `(w[b/4] >> s) | ((w[b/4 + 1] << 1) << (31 - s))` with `s = 8 * (b % 4)`
//! (written so that `s = 0` never shifts by 32, which WGSL takes mod 32). The second word
//! may be the padding word. Palette indices that straddle two words are read the same way.
//! f16 and bf16 are decoded with integer operations, exactly; no SHADER_F16.
//!
//! # Kernels
//!
//! One complete WGSL module per encoding and operation, listed in [`super::kernels::all`]
//! (so a bundle can ship them) and compiled only by name through
//! [`GpuContext::pipeline_named`]; names carry their parameters (see [`kernel_name`]):
//!
//! - `weights_{enc}_matvec_r2_wg64_{sg|wg}`: one token; up to 2 rows per workgroup of 64
//!   invocations. Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16, BF16, F32 (`matvec_quads.wgsl`): four
//!   invocations on each 32-element unit, each 8 of its elements through the decoder's
//!   `quads`, all 64 on each row. The other encodings (`matvec.wgsl`): groups of G (32 or
//!   64, [`matvec_split`]), invocation `i` of a group takes units `i, i + G, ...` of its row
//!   (consecutive invocations read consecutive blocks), x loaded once per unit for the
//!   invocation's rows; Q6_K, Q4_K and Q8_0 have bodies of their own (`matvec_q6_k.wgsl`,
//!   `matvec_q4_k.wgsl`: tasks of 16 weights; `matvec_q8_0.wgsl`, split as the quads: tasks
//!   of 16 codes, one 16-byte load of the chunk's buffer bound a second time as
//!   `array<vec4<u32>>`, binding 9 `data4`; all 64 invocations on each row). The quads (and
//!   Q8_0) types also have `_swiglu`, `_geglu` (the gating folded in), `_rms` and `_swiglu_rms`
//!   (the RMSNorm of x folded in, `x_rms.wgsl`) forms. For
//!   `ternary2` the single-token product is the ternary kernel of
//!   [`GpuContext::default_matvec_config`]: `ternary_matvec_r8_wg128_sgrows2_p2_xs4096`
//!   (subgroup rows) with `sg`, `ternary_matvec_r4_wg64_wg` (split) with `wg`.
//! - `weights_{enc}_matmul_r4_t8_wg64_{sg|wg}`: a prefill chunk; each workgroup takes 4 rows
//!   and 8 tokens (grid z = `ceil(n_tokens / 8)`), decodes each unit once and dots it with
//!   the 8 tokens' activations, so a weight block is read once per 8 tokens.
//! - `weights_{enc}_gather_wg64`: one invocation per (token, unit).
//! - `weights_ternary2_mmq_r128_t{64,16}_wg256` after `weights_q8_quantize_wg64`: a prefill
//!   chunk of a `ternary2` weight with int8 activations ([`super::ContextOptions::int8`],
//!   where decode is int8 too): the chunk's activations
//!   quantized once into the context's scratch ([`GpuContext::q8_scratch`]), then 128 rows
//!   and 64 tokens (16 below 64 tokens) per workgroup with exact integer block sums, each
//!   weight byte read once per 64 (16) tokens (`shaders/weights/mmq_ternary2.wgsl`).
//!
//! The products store through `shaders/weights/store.wgsl`: a stacked weight
//! ([`GpuContext::upload_stacked`], Q/K/V or gate/up as one; [`GpuWeight::parts`]) writes each
//! part as its own `[n_tokens, rows_j]` block, and [`Epilogue::Accumulate`] adds the sum into
//! `y` (the residual add) instead of storing it. The single-token `ternary2` product can also
//! fold the RMSNorm before it and SwiGLU after it ([`GpuContext::bind_matvec_fused`]), the
//! quads types' likewise ([`GpuContext::bind_matvec_norm`], [`GpuContext::bind_gguf_glu`],
//! [`GpuContext::bind_gguf_glu_norm`]).
//!
//! `{enc}` is the GGML type in lower case (`q4_k`), `ternary2`, or `palette_b{bits}`
//! (`group_size` and `row_bytes` are run-time parameters). `sg` adds a row's partials with
//! `subgroupAdd` (subgroup size read from the hardware), `wg` with a tree in workgroup
//! memory; [`GpuContext::weight_reduction`] picks `sg` where the adapter has subgroups unless
//! [`super::ContextOptions::force_workgroup_reduction`].
//!
//! # Limits
//!
//! A weight is split into row chunks whose `data` and `aux` each fit one storage binding
//! ([`GpuContext::max_binding_bytes`], which tests cap small), one dispatch per chunk (and
//! for the int8 prefill product one quantization pass before them); the
//! kernels take the chunk's first row as a parameter and never write rows outside it. A
//! dispatch past 65,535 workgroups is a 2-D grid ([`super::grid`]). `ternary2` chunks are
//! whole multiples of `min_storage_buffer_offset_alignment / 4` rows (the tuned kernel binds
//! y at the chunk's row).
//!
//! # Numerics
//!
//! **Values.** Every decoder yields exactly the f32 value of the CPU dequantizer
//! ([`crate::quant::dequantize`], bit-exact with gguf-py; [`crate::runtime::model::Weight::row_values`]),
//! signed zeros included, so **the gather is bit for bit the CPU's**, for every type. Why,
//! where a formula has more than one operation: every product of an f16 scale (11-bit
//! significand) with a small integer is exact in f32, and so are the products of such a
//! product with the quant (Q4_1 and Q5_1 `d * q`: at most 16 significant bits; K-quants
//! `d * sc` at most 19, `(d * sc) * q` at most 22 for Q2_K/Q3_K/Q4_K/Q5_K; f32 has 24). An exact product
//! followed by one add (`d * q + m`, `dl * q - ml`) rounds once whether or not the shader
//! compiler fuses the two into an fma, and that one rounding is the CPU's. Q6_K's
//! `(d * sc) * q` (up to 25 bits) is not always exact, but it is one multiplication after an
//! exact one, in the CPU's order, rounded once on both. Integers become f32 without
//! conversions (`ints` in common.wgsl: OR into the mantissa of 2^23, subtract, exact).
//! NaN payloads of f16 weights may differ (the CPU quiets them); tests use finite scales.
//!
//! **Products.** With each `w_k` exact, a product `y = sum_k w_k x_k` over `K` terms is
//! computed in f32 by a tree whose every path has at most `D` roundings: 1 product and 3
//! adds in a `vec4` dot, at most 3 more before the invocation's accumulator (3 adds over a
//! unit's 8 dots; the Q6_K body's scale product and 2 adds over its 4 sub-block terms; the
//! Q8_0 body's 2 adds over its 4 dots and the scale product), at most `ceil(K / (8 * 64))`
//! adds into the accumulator (matvec_quads.wgsl's tasks are 8 weights, the Q4_K, Q6_K and
//! Q8_0 bodies' 16, matvec.wgsl's a unit of 32 for each of at least 32 lanes), and at most
//! 64 in the reduction of the 64 partials (`subgroupAdd` in any order, then the subgroups'
//! partials; or the 6-level tree), so `D = 71 + ceil(K / 512)`; the tiled prefill product (`matmul_tile.wgsl`, from
//! [`MATMUL_TILE_MIN_TOKENS`] tokens) adds the unit terms one after another, `D = 7 +
//! ceil(K / 32)` ([`matmul_tile_tolerance`]: smaller up to K = 2176, 1.95x at K = 4864). The
//! classical bound for any summation tree (Higham, *Accuracy
//! and Stability of Numerical Algorithms*, 2nd ed., eq. 4.4) gives
//! `|y_gpu - y| <= gamma_D * A`, `A = sum_k |w_k x_k|`, `gamma_D = D u / (1 - D u)`,
//! `u = 2^-24`. [`matmul_tolerance`] is `(D + 1) * 2^-24 * A` (the extra unit covers
//! `gamma`'s denominator and an f64 reference's rounding) plus `2 K` times the smallest normal
//! f32 (for GPUs that flush subnormal products and sums to zero). Against the CPU f32 kernel
//! ([`crate::runtime::matvec::matvec`] with `Kernel::F32`) add that kernel's own
//! `gamma_K * A`. In the form `c * K * 2^-24 * A`, `c = (D + 1) / K`: 0.13 at K = 576,
//! 0.020 at K = 4096, below 1 for every K >= 96. The single-token `ternary2` product is the ternary kernel's own bound,
//! [`super::tolerance`] (`4 * K * 2^-24 * sum_k |d_b(k) x_k|`, in terms of the scales, not of
//! the values). The int8 prefill product is held to the CPU's int8 arithmetic instead:
//! `4 (K/256 + 4) 2^-24 S` with `S = sum_k |d da (c - 1) q|`, plus `|d da|` per element at a
//! rounding tie (`tests/gpu.rs`). The tests print the worst ratio seen per type.
//!
//! # Speed (not tuned yet)
//!
//! Decode is memory-bound: each weight byte is read once per matvec, consecutive invocations
//! read consecutive units of a row, x is loaded once per unit for the 4 rows. Measured once
//! on an NVIDIA H200 through Vulkan (the `throughput` test, `--ignored`, `[65536, 4096]`,
//! wall clock over 200 back-to-back products in one pass, bounds checks on): single token
//! 132 GB/s of weight for Q4_0, 304 Q4_K, 430 Q6_K, 555 Q8_0, 939 F16, 206 palette 4-bit
//! (the tuned ternary kernel 424): 3-20% of the 4.8 TB/s HBM. The 16-token product takes
//! about 5.2 ms whatever the encoding (213-1510 GB/s of weight per token), so it is bound by
//! something the encodings share: each row's unit is dotted with 8 tokens' activations
//! re-read from L1 (32 bytes of x per weight element), and its 32 accumulators are a
//! dynamically indexed function-scope array. Next steps, as for the ternary kernel
//! (BENCHMARKS.md): accumulators and unit values in registers (unrolled code per variant
//! instead of loops over arrays), x tiles in workgroup memory for the multi-token product,
//! scales factored out of the unit's dot, aligned word loads for the 4-byte-multiple blocks.
//! (The single-token `ternary2` product has since moved to the subgroup-rows kernel, 1.6-3.1x
//! faster per shape; BENCHMARKS.md. The same x-load pattern, 16-byte loads 128 bytes
//! apart across lanes, probably limits these kernels too.)

use super::kernels::KernelSource;
use super::ops::{Bindable, BufView};
use super::{
    grid_or_limit, BoundMatvec, Epilogue, Fuse, GpuContext, GpuError, GpuTernary, MatvecConfig,
    Reduction, TernaryChunk, MAX_WORKGROUPS_PER_DIM,
};
use crate::ggml::GgmlType;

const COMMON_WGSL: &str = include_str!("shaders/weights/common.wgsl");
const MATVEC_WGSL: &str = include_str!("shaders/weights/matvec.wgsl");
const MATVEC_QUADS_WGSL: &str = include_str!("shaders/weights/matvec_quads.wgsl");
/// How matvec_quads.wgsl reads x: as it is, or with the RMSNorm folded in (the `_rms`
/// kernels).
const X_PLAIN_WGSL: &str = include_str!("shaders/weights/x_plain.wgsl");
const X_RMS_WGSL: &str = include_str!("shaders/weights/x_rms.wgsl");
// x_rms.wgsl keeps four of op_rms_norm's 256 partial sums an invocation: 64 invocations.
const _: () = assert!(WORKGROUP == 64);
/// The single-token body of Q6_K (each `ql` and `qh` byte read once; matvec.wgsl's bindings,
/// grid and reduction).
const MATVEC_Q6_K_WGSL: &str = include_str!("shaders/weights/matvec_q6_k.wgsl");
/// Q8_0's single-token body (its planes read 16 codes at a time), in place of
/// matvec_quads.wgsl with the same forms (`_rms`, `_swiglu`, `_geglu`).
const MATVEC_Q8_0_WGSL: &str = include_str!("shaders/weights/matvec_q8_0.wgsl");
/// The single-token body of Q4_K (each `qs` byte read once, each sub-block's scale and min
/// decoded once per task of 16 weights; matvec.wgsl's bindings, grid and reduction).
const MATVEC_Q4_K_WGSL: &str = include_str!("shaders/weights/matvec_q4_k.wgsl");
const MATMUL_WGSL: &str = include_str!("shaders/weights/matmul.wgsl");
const MATMUL_TILE_WGSL: &str = include_str!("shaders/weights/matmul_tile.wgsl");
const GATHER_WGSL: &str = include_str!("shaders/weights/gather.wgsl");
const STORE_WGSL: &str = include_str!("shaders/weights/store.wgsl");
const ROWS_WGSL: &str = include_str!("shaders/weights/rows.wgsl");
const ROWS_SWIGLU_WGSL: &str = include_str!("shaders/weights/rows_swiglu.wgsl");
const ROWS_GEGLU_WGSL: &str = include_str!("shaders/weights/rows_geglu.wgsl");
const REDUCE_SUBGROUP_WGSL: &str = include_str!("shaders/weights/reduce_subgroup.wgsl");
const REDUCE_WORKGROUP_WGSL: &str = include_str!("shaders/weights/reduce_workgroup.wgsl");
const Q8_QUANTIZE_WGSL: &str = include_str!("shaders/weights/q8_quantize.wgsl");
const MMQ_TERNARY2_WGSL: &str = include_str!("shaders/weights/mmq_ternary2.wgsl");

/// Elements of a unit, the 32 consecutive elements of a row each kernel decodes at once; `K`
/// must be a multiple of it.
pub const UNIT: usize = 32;
/// Rows per workgroup of the single-token product.
pub const MATVEC_ROWS: u32 = 2;
/// Rows per workgroup of Q8_0's single-token kernel for weights of at least
/// [`WIDE_MATVEC_MIN_ROWS`] rows (the heads and tied embeddings of Qwen2.5-0.5B, 151,936 x
/// 896, and Gemma 3 270M, 262,144 x 640): with tasks of 16 codes a row of 640 or 896 codes is
/// one load an invocation, so two rows a workgroup leave each invocation 36 bytes in flight;
/// eight give 144. On an H200 Gemma 3's head took 115.7 us against 157.8 with two rows
/// (4: 153.7; 16: 295.0), Qwen2.5's 77.2 against 105.2 (4: 76.4); SmolLM2's 49,152-row head
/// 31.4 against 28.8, and the 128- to 256-row `attn_v` products were slower with a kernel of
/// 8 rows even at one row a workgroup (7.8-8.3 us against 7.0-7.4): so the other weights
/// keep the `_r2_` kernel (BENCHMARKS.md, run 21).
pub const WIDE_MATVEC_ROWS: u32 = 8;
/// Rows from which a Q8_0 weight's single-token product takes the [`WIDE_MATVEC_ROWS`]
/// kernel.
pub const WIDE_MATVEC_MIN_ROWS: usize = 65_536;
/// A line of matvec_quads.wgsl by which the host tells that body in a kernel's source (a
/// bundle made before it carries matvec.wgsl under the same name, which reads
/// `Params::lanes`).
const QUADS_MARK: &str = "const QUAD_TASKS: u32 = 4u;";
/// The line of matvec_q8_0.wgsl by which the host tells that body (split as matvec_quads.wgsl:
/// every invocation on each row).
const Q8_0_BODY_MARK: &str = "const Q8_TASKS: u32 = 2u;";
/// The binding at which a kernel reads its chunk's bytes again as 16-byte words
/// (matvec_q8_0.wgsl's `data4`): where the kernel uses it ([`GpuContext::used_bindings`]) the
/// host binds the chunk's buffer there too. A bundle's kernels from before it lack it.
const DATA4_BINDING: u32 = 9;
/// Rows per workgroup of the single-token body in bundles made before it took
/// [`MATVEC_ROWS`] = 2 (kernels `weights_{enc}_matvec_r4_wg64_{sg|wg}`): the host runs those
/// where a bundle has no `_r2_` kernel. 4 accumulators per invocation cost registers: on an
/// H200 the `_r2_` body decodes SmolLM2 at 547 tok/s against 503 and Qwen2.5-0.5B at 333
/// against 323 (an `_r8_` body: 432 and 307; BENCHMARKS.md).
pub const LEGACY_MATVEC_ROWS: u32 = 4;

/// The most workgroups a single-token product with the RMSNorm folded in (x_rms.wgsl) may
/// have: each workgroup computes the norm again, which costs more than the norm's own
/// dispatch saves where there are many. On an H100 SmolLM2's folded Q/K/V (960 workgroups)
/// and SwiGLU gate/up (1536) and Qwen2.5-0.5B's stacked Q/K/V (1152) gained (decode +8.8%
/// on SmolLM2), Qwen2.5's SwiGLU gate/up (4864) did not (25.0 us against 16.5 + 8.6).
/// `LOWBIT_GPU_NORM_FOLD_MAX=N` sets another bound (a measuring knob).
pub const NORM_FOLD_MAX_WORKGROUPS: usize = 2048;

/// [`NORM_FOLD_MAX_WORKGROUPS`], or `LOWBIT_GPU_NORM_FOLD_MAX`.
fn norm_fold_max_workgroups() -> usize {
    std::env::var("LOWBIT_GPU_NORM_FOLD_MAX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(NORM_FOLD_MAX_WORKGROUPS)
}

/// Workgroups below which [`matvec_split`] gives a workgroup fewer rows than
/// [`MATVEC_ROWS`]: a weight of few rows (Qwen2.5-0.5B's 896-row down and output products
/// made 224 workgroups of 64 invocations, under two per SM of an H200) leaves most of the
/// GPU waiting on memory.
pub const MATVEC_MIN_WORKGROUPS: usize = 1024;

/// What a kernel of GGML type `ty` has where its decoder reads the planes layout
/// ([`q8_0_planes`], [`q6_k_planes`]): the plane-addressing function of
/// shaders/weights/unit_q8_0.wgsl / unit_q6_k.wgsl (code, not a comment, so that a reflowed
/// comment cannot change how a bundle's weights are uploaded); None for the types uploaded
/// as stored.
pub fn planes_mark(ty: GgmlType) -> Option<&'static str> {
    match ty {
        GgmlType::Q8_0 => Some("fn q8_qs("),
        GgmlType::Q6_K => Some("fn q6_ql("),
        _ => None,
    }
}

/// What a palette kernel has where its decoder reads the tables widened to f32 by the host
/// (shaders/weights/unit_palette.wgsl's lookup function: code, as [`planes_mark`]); the
/// kernels of bundles made before read them as stored, f16 (unit_palette_f16.wgsl).
pub const PALETTE_F32_MARK: &str = "fn table_f32(";

/// The regrouping of a type uploaded as planes (`(blocks, rows, cols) -> bytes`).
type Regroup = fn(&[u8], usize, usize) -> Vec<u8>;

fn planes_of(ty: GgmlType) -> Option<Regroup> {
    match ty {
        GgmlType::Q8_0 => Some(q8_0_planes),
        GgmlType::Q6_K => Some(q6_k_planes),
        _ => None,
    }
}

/// `rows` rows of Q6_K blocks (`cols / 256` a row, each ql[128], qh[64], scales[16], d f16,
/// as stored) as the GPU's Q6_K kernels read them: for nb = `rows * cols / 256` blocks, block
/// g's ql at byte `128 g`, its qh at `128 nb + 64 g`, its scales at `192 nb + 16 g`, its d at
/// `208 nb + 2 g`. The same bytes, regrouped so that every word a kernel reads is aligned
/// (the single-token product reads 6 words a task of 16 weights instead of 11).
pub fn q6_k_planes(blocks: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let nb = rows * cols / 256;
    debug_assert_eq!(blocks.len(), nb * 210);
    let mut out = vec![0u8; blocks.len()];
    let (ql, rest) = out.split_at_mut(128 * nb);
    let (qh, rest) = rest.split_at_mut(64 * nb);
    let (sc, d) = rest.split_at_mut(16 * nb);
    for (g, b) in blocks.chunks_exact(210).enumerate() {
        ql[128 * g..128 * (g + 1)].copy_from_slice(&b[..128]);
        qh[64 * g..64 * (g + 1)].copy_from_slice(&b[128..192]);
        sc[16 * g..16 * (g + 1)].copy_from_slice(&b[192..208]);
        d[2 * g..2 * (g + 1)].copy_from_slice(&b[208..]);
    }
    out
}

/// `rows` rows of Q8_0 blocks (`cols / 32` a row, each d f16 then 32 qs bytes, as stored) as
/// the GPU's Q8_0 kernels read them: every block's qs in order (row r's element k at byte
/// `r * cols + k`), then every block's d (block u of row r at byte `rows * cols + 2 * (r *
/// cols/32 + u)`). The same bytes, regrouped so that each unit's codes are 8 aligned words
/// (two aligned 16-byte words): the single-token product (matvec_q8_0.wgsl) reads one
/// 16-byte word and the d a task of 16 codes, where from blocks it read two funnel-shifted
/// pairs and the d a task of 8 (BENCHMARKS.md).
pub fn q8_0_planes(blocks: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    debug_assert_eq!(blocks.len(), rows * cols / 32 * 34);
    let mut out = vec![0u8; blocks.len()];
    let (qs, ds) = out.split_at_mut(rows * cols);
    for (i, b) in blocks.chunks_exact(34).enumerate() {
        ds[2 * i..2 * i + 2].copy_from_slice(&b[..2]);
        qs[32 * i..32 * i + 32].copy_from_slice(&b[2..]);
    }
    out
}

/// How the single-token body (matvec.wgsl; matvec_quads.wgsl, `quads`, and matvec_q6_k.wgsl
/// take the rows only) splits a weight of `rows` x `cols`: (`Params::lanes`,
/// `Params::wg_rows`).
///
/// With `quads` every invocation of a workgroup works on each of its rows: lanes are
/// `WORKGROUP`, and rows per workgroup go down to 1 by the rule below (on an H200 two groups
/// of 32 lanes, a row each, decoded the shape copies 1-8% slower; BENCHMARKS.md).
///
/// Lanes, the invocations per row: the smallest power of two at least the row's units (32
/// elements each), between `WORKGROUP / MATVEC_ROWS` and `WORKGROUP`. K = 576 and 896
/// (SmolLM2's and Qwen2.5-0.5B's width, 18 and 28 units) take 32: two groups of a
/// workgroup's invocations, each on a row of its own, where one group of 64 left 46 or 36 of
/// them idle. Rows per workgroup: [`MATVEC_ROWS`], halved while the grid has fewer than
/// [`MATVEC_MIN_WORKGROUPS`] workgroups and each group of lanes keeps a row.
///
/// `LOWBIT_GPU_MATVEC_LANES=N` (not with `quads`) and `LOWBIT_GPU_MATVEC_WG_ROWS=N` (powers
/// of two, clamped to those ranges) force either, for measurements (lanes 64 with 1 row puts
/// every invocation of a workgroup on one row; the split before this choice, 64 lanes on
/// each of 4 rows, needs the `_r4_` kernel, which this build no longer makes).
pub fn matvec_split(rows: usize, cols: usize, quads: bool) -> (u32, u32) {
    matvec_split_max(rows, cols, quads, MATVEC_ROWS)
}

/// [`matvec_split`] for a kernel of `max_rows` rows a workgroup.
pub fn matvec_split_max(rows: usize, cols: usize, quads: bool, max_rows: u32) -> (u32, u32) {
    let knob = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            .filter(|n| n.is_power_of_two())
    };
    let lo = WORKGROUP / MATVEC_ROWS;
    let units = (cols / 32).max(1) as u32;
    let lanes = if quads {
        WORKGROUP
    } else {
        knob("LOWBIT_GPU_MATVEC_LANES")
            .unwrap_or(units.next_power_of_two())
            .clamp(lo, WORKGROUP)
    };
    let min_rows = WORKGROUP / lanes;
    let wg_rows = match knob("LOWBIT_GPU_MATVEC_WG_ROWS") {
        Some(n) => n.clamp(min_rows, max_rows),
        None => {
            let mut r = max_rows;
            while r > min_rows && rows.div_ceil(r as usize) < MATVEC_MIN_WORKGROUPS {
                r /= 2;
            }
            r
        }
    };
    (lanes, wg_rows)
}

/// Rows per workgroup of the multi-token product.
pub const MATMUL_ROWS: u32 = 4;
/// Tokens per workgroup of the multi-token product (a weight block is read once per this
/// many tokens).
pub const MATMUL_TOKENS: u32 = 8;
/// Invocations per workgroup of the products.
pub const WORKGROUP: u32 = 64;
/// Invocations per workgroup of the gather.
pub const GATHER_WORKGROUP: u32 = 64;

/// The tiled multi-token product (`shaders/weights/matmul_tile.wgsl`): rows and tokens per
/// workgroup, invocations (16 x 16, each on 4 rows and 4 tokens).
pub const MATMUL_TILE_ROWS: u32 = 64;
pub const MATMUL_TILE_TOKENS: u32 = 64;
pub const MATMUL_TILE_WORKGROUP: u32 = 256;
/// Tokens from which a prefill product takes the tiled kernel where the sources have it
/// (fewer: [`MATMUL_TOKENS`] a workgroup, less of the tile's work wasted on absent tokens).
pub const MATMUL_TILE_MIN_TOKENS: u32 = 32;

/// The tiled product of decoder `d`: `weights_q4_k_mmt_r64_t64_wg256`.
fn tile_name(d: Decoder) -> String {
    format!(
        "weights_{}_mmt_r{MATMUL_TILE_ROWS}_t{MATMUL_TILE_TOKENS}_wg{MATMUL_TILE_WORKGROUP}",
        d.stem()
    )
}

/// Workgroup memory of the tiled product (bytes): a unit (8 vec4) of each row and token.
pub fn tile_shared_bytes() -> u64 {
    16 * 8 * (MATMUL_TILE_ROWS + MATMUL_TILE_TOKENS) as u64
}

/// The tiled product's module: its constants, common.wgsl, the decoder, store.wgsl and the
/// body expanded over an invocation's 4 rows and 4 tokens.
fn tile_source(d: Decoder) -> String {
    let per = |n: u32| (n / 16) as usize;
    debug_assert_eq!(MATMUL_TILE_WORKGROUP, 256);
    let body = super::ops::expand_for(
        MATMUL_TILE_WGSL,
        &[
            ("RI", per(MATMUL_TILE_ROWS)),
            ("TI", per(MATMUL_TILE_TOKENS)),
        ],
    );
    format!(
        "// {}: generated by src/runtime/gpu/weights.rs from shaders/weights/matmul_tile.wgsl\nconst TM: u32 = {MATMUL_TILE_ROWS}u;\nconst TN: u32 = {MATMUL_TILE_TOKENS}u;\nconst WG: u32 = {MATMUL_TILE_WORKGROUP}u;\n\n{COMMON_WGSL}\n{}\n{STORE_WGSL}\n{body}",
        tile_name(d),
        d.source()
    )
}

/// The int8 prefill product of a `ternary2` weight (`shaders/weights/mmq_ternary2.wgsl`):
/// rows per invocation (`TR`), invocations along the rows (`WR`) and along the tokens (`WT`).
const MMQ_TR: u32 = 8;
const MMQ_WR: u32 = 16;
const MMQ_WT: u32 = 16;
/// Tokens per invocation (`TT`) of its variants: 4 (64 tokens per workgroup) for chunks of
/// 64 tokens and more, 1 (16 tokens) below.
pub const MMQ_TOKENS_PER_INVOCATION: [u32; 2] = [1, 4];
/// The quantization pass before it (`shaders/weights/q8_quantize.wgsl`).
pub const Q8_QUANTIZE: &str = "weights_q8_quantize_wg64";

/// The name of the int8 prefill product with `tt` tokens per invocation:
/// `weights_ternary2_mmq_r128_t64_wg256` (rows and tokens per workgroup, invocations).
pub fn mmq_name(tt: u32) -> String {
    format!(
        "weights_ternary2_mmq_r{}_t{}_wg{}",
        MMQ_TR * MMQ_WR,
        tt * MMQ_WT,
        MMQ_WR * MMQ_WT
    )
}

/// Workgroup memory of the int8 prefill product with `tt` tokens per invocation (bytes):
/// code words (rows padded to 17 words), activation groups (tokens padded to 17 groups of 16
/// bytes), the rows' scales and the tokens' `da` and sum q.
fn mmq_shared_bytes(tt: u32) -> u64 {
    let (r, t) = ((MMQ_TR * MMQ_WR) as u64, (tt * MMQ_WT) as u64);
    r * 17 * 4 + t * 17 * 16 + r * 4 + t * 8
}

/// The entry point of the int8 prefill product, unrolled over its `MMQ_TR` rows and `tt`
/// tokens per invocation (`shaders/weights/mmq_ternary2.wgsl` describes the work split).
fn mmq_main(tt: u32) -> String {
    use std::fmt::Write;
    let mut m = String::new();
    let pairs: Vec<(u32, u32)> = (0..MMQ_TR)
        .flat_map(|i| (0..tt).map(move |j| (i, j)))
        .collect();
    // `writeln!` into a String cannot fail.
    let mut w = |line: String| {
        let _ = writeln!(m, "{line}");
    };
    w("@compute @workgroup_size(WG)".into());
    w("fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {".into());
    w("    let row0 = (wid.y * params.groups_x + wid.x) * R;".into());
    w(
        "    // The same for the whole workgroup: no barrier is skipped by some invocations only."
            .into(),
    );
    w("    if row0 >= params.rows {".into());
    w("        return;".into());
    w("    }".into());
    w("    let t0 = wid.z * T;".into());
    w("    let ir = lid % WR;".into());
    w("    let it = lid / WR;".into());
    w("    let blocks = params.cols / 256u;".into());
    for &(i, j) in &pairs {
        w(format!("    var acc{i}_{j} = 0.0;"));
    }
    w("    for (var b = 0u; b < blocks; b++) {".into());
    w("        stage(lid, b, row0, t0);".into());
    w("        workgroupBarrier();".into());
    for &(i, j) in &pairs {
        w(format!("        var s{i}_{j}: i32 = 0;"));
    }
    w("        for (var k = 0u; k < 16u; k++) {".into());
    for i in 0..MMQ_TR {
        w(format!(
            "            let c{i} = wc[(ir + {i}u * WR) * CS + k];"
        ));
    }
    for j in 0..tt {
        w(format!(
            "            let x{j} = wx[(it + {j}u * WT) * GS + k];"
        ));
    }
    for &(i, j) in &pairs {
        w(format!("            s{i}_{j} += word_dot(c{i}, x{j});"));
    }
    w("        }".into());
    for i in 0..MMQ_TR {
        w(format!("        let d{i} = wd[ir + {i}u * WR];"));
    }
    for j in 0..tt {
        w(format!("        let da{j} = wa[it + {j}u * WT];"));
        w(format!("        let sq{j} = wq[it + {j}u * WT];"));
    }
    for &(i, j) in &pairs {
        w(format!(
            "        acc{i}_{j} += (d{i} * da{j}) * f32(s{i}_{j} - sq{j});"
        ));
    }
    w("        workgroupBarrier();".into());
    w("    }".into());
    for &(i, j) in &pairs {
        w(format!(
            "    if row0 + ir + {i}u * WR < params.rows && t0 + it + {j}u * WT < params.n_tokens {{"
        ));
        w(format!(
            "        store_y(t0 + it + {j}u * WT, params.row0 + row0 + ir + {i}u * WR, acc{i}_{j});"
        ));
        w("    }".into());
    }
    w("}".into());
    m
}

/// The complete module of the int8 prefill product with `tt` tokens per invocation.
fn mmq_source(tt: u32) -> String {
    format!(
        "// {}: generated by src/runtime/gpu/weights.rs from shaders/weights/mmq_ternary2.wgsl\nconst TR: u32 = {MMQ_TR}u;\nconst WR: u32 = {MMQ_WR}u;\nconst TT: u32 = {tt}u;\nconst WT: u32 = {MMQ_WT}u;\nconst WG: u32 = {}u;\n\n{COMMON_WGSL}\n{}\n{STORE_WGSL}\n{MMQ_TERNARY2_WGSL}\n{}",
        mmq_name(tt),
        MMQ_WR * MMQ_WT,
        super::Q8_COMMON_WGSL,
        mmq_main(tt)
    )
}

/// The GGML types with kernels here, in ggml id order.
pub const GGUF_TYPES: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::BF16,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
];

/// How a [`GpuWeight`] is encoded on the device (the bundle's encoding, bytes as stored but
/// for the Q8_0 and Q6_K planes, [`q8_0_planes`], [`q6_k_planes`], and the palette tables,
/// widened to f32 where the kernels read them so: [`GpuContext::reads_f32_tables`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    /// GGML blocks of one of [`GGUF_TYPES`].
    Gguf(GgmlType),
    /// `ternary2`: 2-bit codes and f16 scales per 256 elements.
    Ternary,
    /// Per `group_size` rows one table of `2^bits` entries of `entry_bytes` each on the
    /// device (4: widened to f32; 2: the bundle's f16 as stored, for a bundle's kernels from
    /// before); `bits`-bit indices, `row_bytes` per row.
    Palette {
        bits: u32,
        group_size: u32,
        row_bytes: u32,
        entry_bytes: u32,
    },
}

/// A weight on the device, split into row chunks that each fit one storage binding.
#[derive(Debug)]
pub struct GpuWeight {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub format: WeightFormat,
    pub chunks: Vec<WeightChunk>,
    /// Rows of each weight stacked into this one, in order (`[rows]` for a plain weight; up
    /// to three for a stacked one, [`GpuContext::upload_stacked`]): a product stores each
    /// part as its own `[n_tokens, rows_j]` block of `y` (`shaders/weights/store.wgsl`).
    pub parts: Vec<usize>,
}

/// Rows `row0 .. row0 + rows` of a weight: `data` the encoded rows, `aux` the scales
/// (`ternary2`), the tables (palette) or a 4-byte placeholder (GGUF), as the module doc's
/// table says.
#[derive(Debug)]
pub struct WeightChunk {
    pub row0: usize,
    pub rows: usize,
    pub data: wgpu::Buffer,
    pub aux: wgpu::Buffer,
    /// `ternary2`: the byte offset in `aux` of the scales as f32 in groups of four rows
    /// ([`super::TernaryChunk::scales4`]); 0 for the other formats.
    pub aux4: u64,
}

impl GpuWeight {
    /// A stacked gate/up weight in one row chunk: two equal parts, the gate rows then the up
    /// rows, as the products with SwiGLU folded in read them.
    pub fn is_gate_up_stack(&self) -> bool {
        self.chunks.len() == 1 && self.parts.len() == 2 && self.parts[0] == self.parts[1]
    }

    /// A `ternary2` weight as the ternary kernels take it (the same buffers).
    fn ternary_view(&self) -> GpuTernary {
        GpuTernary {
            name: self.name.clone(),
            rows: self.rows,
            cols: self.cols,
            chunks: self
                .chunks
                .iter()
                .map(|c| TernaryChunk {
                    row0: c.row0,
                    rows: c.rows,
                    codes: c.data.clone(),
                    scales: c.aux.clone(),
                    scales4: c.aux4,
                })
                .collect(),
        }
    }

    /// Bytes a full matvec reads from the weight: its encoded rows and their scales or
    /// tables (without the upload's padding).
    pub fn bytes(&self) -> u64 {
        let (rows, cols) = (self.rows as u64, self.cols as u64);
        match self.format {
            WeightFormat::Gguf(ty) => rows * ty.bytes_for(cols).unwrap_or(0),
            WeightFormat::Ternary => rows * cols / 4 + rows * cols / 128,
            WeightFormat::Palette {
                bits,
                group_size,
                row_bytes,
                entry_bytes,
            } => {
                rows * row_bytes as u64
                    + rows / group_size.max(1) as u64 * ((entry_bytes as u64) << bits)
            }
        }
    }
}

/// What a kernel does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightOp {
    /// `y = W x`, one token.
    Matvec,
    /// `y = W x` over a chunk of tokens.
    Matmul,
    /// `out = W[ids]`.
    Gather,
}

/// The decoder a kernel is built with: the encoding without its run-time parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Decoder {
    Gguf(GgmlType),
    Ternary,
    Palette(u32),
}

impl Decoder {
    fn of(f: WeightFormat) -> Decoder {
        match f {
            WeightFormat::Gguf(ty) => Decoder::Gguf(ty),
            WeightFormat::Ternary => Decoder::Ternary,
            WeightFormat::Palette { bits, .. } => Decoder::Palette(bits),
        }
    }

    fn all() -> Vec<Decoder> {
        let mut v: Vec<Decoder> = GGUF_TYPES.iter().map(|&t| Decoder::Gguf(t)).collect();
        v.push(Decoder::Ternary);
        v.extend((1..=8).map(Decoder::Palette));
        v
    }

    /// The encoding's part of a kernel name.
    fn stem(self) -> String {
        match self {
            Decoder::Gguf(ty) => ty.name().to_lowercase(),
            Decoder::Ternary => "ternary2".into(),
            Decoder::Palette(bits) => format!("palette_b{bits}"),
        }
    }

    /// Whether the single-token body is matvec_quads.wgsl (four invocations on a unit,
    /// through the decoder's `quads`): the 32-element GGUF blocks, the float types and the
    /// palettes (whose folded forms, the RMSNorm and the gating in the product, come with
    /// it). Not Q4_K and Q5_K: there each task decoded its
    /// sub-block's 6-bit scale and min again (four byte reads), and on an H200 Qwen2.5-0.5B's
    /// Q4_K down product took 22.0 us that way against 19.8 with matvec.wgsl (BENCHMARKS.md),
    /// where the 32-element blocks' products halved. Q4_K has a body of its own instead
    /// (matvec_q4_k.wgsl: tasks of 16 weights of two sub-blocks, each scale and min decoded
    /// once per task), as Q6_K has (matvec_q6_k.wgsl).
    fn has_quads(self) -> bool {
        use GgmlType::*;
        matches!(
            self,
            Decoder::Gguf(Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | F16 | BF16 | F32)
                | Decoder::Palette(_)
        )
    }

    /// Whether the kernel binds `aux` (binding 1).
    fn has_aux(self) -> bool {
        !matches!(self, Decoder::Gguf(_))
    }

    /// The decoder's WGSL (defines `unit`), with its constants.
    fn source(self) -> String {
        let unit = match self {
            Decoder::Gguf(ty) => match ty {
                GgmlType::Q4_0 => include_str!("shaders/weights/unit_q4_0.wgsl"),
                GgmlType::Q4_1 => include_str!("shaders/weights/unit_q4_1.wgsl"),
                GgmlType::Q5_0 => include_str!("shaders/weights/unit_q5_0.wgsl"),
                GgmlType::Q5_1 => include_str!("shaders/weights/unit_q5_1.wgsl"),
                GgmlType::Q8_0 => include_str!("shaders/weights/unit_q8_0.wgsl"),
                GgmlType::Q2_K => include_str!("shaders/weights/unit_q2_k.wgsl"),
                GgmlType::Q3_K => include_str!("shaders/weights/unit_q3_k.wgsl"),
                GgmlType::Q4_K => include_str!("shaders/weights/unit_q4_k.wgsl"),
                GgmlType::Q5_K => include_str!("shaders/weights/unit_q5_k.wgsl"),
                GgmlType::Q6_K => include_str!("shaders/weights/unit_q6_k.wgsl"),
                GgmlType::TQ1_0 => include_str!("shaders/weights/unit_tq1_0.wgsl"),
                GgmlType::TQ2_0 => include_str!("shaders/weights/unit_tq2_0.wgsl"),
                GgmlType::F16 => include_str!("shaders/weights/unit_f16.wgsl"),
                GgmlType::BF16 => include_str!("shaders/weights/unit_bf16.wgsl"),
                GgmlType::F32 => include_str!("shaders/weights/unit_f32.wgsl"),
                // Decoder::all() lists only GGUF_TYPES, and uploads refuse the rest.
                _ => "",
            },
            Decoder::Ternary => include_str!("shaders/weights/unit_ternary2.wgsl"),
            Decoder::Palette(bits) => {
                return format!(
                    "const BITS: u32 = {bits}u;\n{}",
                    include_str!("shaders/weights/unit_palette.wgsl")
                )
            }
        };
        unit.to_string()
    }
}

/// Greatest common divisor (`gcd(0, n) = n`).
fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The registered name of the kernel of `format` for `op` with `reduction` (the gather has
/// none): `weights_q4_k_matvec_r2_wg64_sg`, `weights_palette_b3_matmul_r4_t8_wg64_wg`,
/// `weights_bf16_gather_wg64`. The single-token `ternary2` product is the ternary kernel of
/// [`super::decode_matvec_config`] (its [`super::MatvecConfig::name`]).
pub fn kernel_name(format: WeightFormat, op: WeightOp, reduction: Reduction) -> String {
    let d = Decoder::of(format);
    if d == Decoder::Ternary && op == WeightOp::Matvec {
        return super::decode_matvec_config(reduction).name();
    }
    name_of(d, op, reduction)
}

/// The weight encoding a kernel decodes, where it decodes one, as [`encoding_stem`] names it:
/// `q4_k` for `weights_q4_k_*`, `ternary2` for the ternary products (`ternary_matvec_*`,
/// [`super::MatvecConfig::name`]) and `weights_ternary2_*`, `palette_b4` for
/// `weights_palette_b4_*`; also `ternary2` for the kernels that exist only for the int8
/// ternary decode products: their quantize kernels (`ternary_q8_quantize*`) and the
/// attention's combine that writes their int8 x (`op_attention_combine_q8`, and the
/// attention with it folded in, `op_attention_decode_combine_q8`); `None` for every
/// other kernel (the ops, the prefill quantize kernel, any kernel not named for an encoding).
/// A bundle carries
/// the kernels of its own tensors' encodings and every kernel of no encoding
/// ([`super::kernels::needed`]).
pub fn kernel_encoding(name: &str) -> Option<String> {
    let int8_ternary = name.starts_with("ternary_q8_quantize")
        || name == super::kernels::COMBINE_Q8
        || name == super::kernels::ATTENTION_COMBINE_Q8;
    if name.starts_with("ternary_matvec") || int8_ternary {
        return Some(Decoder::Ternary.stem());
    }
    Decoder::all()
        .into_iter()
        .map(Decoder::stem)
        .find(|stem| name.starts_with(&format!("weights_{stem}_")))
}

/// The encoding of a bundle tensor as [`kernel_encoding`] names it: the GGML type in lower
/// case (`q6_k`), `ternary2`, or `palette_b{bits}`.
pub fn encoding_stem(e: &crate::bundle::manifest::Encoding) -> String {
    use crate::bundle::manifest::Encoding;
    match e {
        Encoding::Gguf { ggml_type, .. } => ggml_type.to_lowercase(),
        Encoding::Ternary2 { .. } => Decoder::Ternary.stem(),
        Encoding::Palette { bits, .. } => Decoder::Palette(*bits).stem(),
    }
}

/// What every kernel name of decoder `d` starts with (`weights_q8_0_`; [`name_of`]).
fn kernel_prefix(d: Decoder) -> String {
    format!("weights_{}_", d.stem())
}

fn name_of(d: Decoder, op: WeightOp, reduction: Reduction) -> String {
    match op {
        WeightOp::Matvec => format!(
            "weights_{}_matvec_r{MATVEC_ROWS}_wg{WORKGROUP}_{}",
            d.stem(),
            reduction.name()
        ),
        WeightOp::Matmul => format!(
            "weights_{}_matmul_r{MATMUL_ROWS}_t{MATMUL_TOKENS}_wg{WORKGROUP}_{}",
            d.stem(),
            reduction.name()
        ),
        WeightOp::Gather => format!("weights_{}_gather_wg{GATHER_WORKGROUP}", d.stem()),
    }
}

/// The complete module of a kernel: its constants, common.wgsl, the decoder, the body and
/// (products) the reduction.
fn source_of(d: Decoder, op: WeightOp, reduction: Reduction) -> String {
    source_variant(
        d,
        op,
        reduction,
        name_of(d, op, reduction),
        Variant::STANDARD,
    )
}

/// The single-token Q8_0 kernel of [`WIDE_MATVEC_ROWS`] rows a workgroup, for weights of at
/// least [`WIDE_MATVEC_MIN_ROWS`] rows: `weights_q8_0_matvec_r8_wg64_{sg|wg}`.
fn wide_matvec_name(reduction: Reduction) -> String {
    format!(
        "{}matvec_r{WIDE_MATVEC_ROWS}_wg{WORKGROUP}_{}",
        kernel_prefix(Decoder::Gguf(GgmlType::Q8_0)),
        reduction.name()
    )
}

/// Whether `name` is one of the wide Q8_0 kernels ([`wide_matvec_name`]), which no bundle
/// made before them carries.
#[doc(hidden)]
pub fn is_wide_matvec(name: &str) -> bool {
    [Reduction::Subgroup, Reduction::Workgroup]
        .into_iter()
        .any(|r| name == wide_matvec_name(r))
}

/// Q8_0's single-token body as a kernel holds it (expanded for [`MATVEC_ROWS`] rows), today's
/// (matvec_q8_0.wgsl) and the one it replaced (matvec_quads.wgsl): for the sources of
/// bundles made before.
fn q8_0_body_now_and_before() -> (String, String) {
    let expand = |body: &str| super::ops::expand_for(body, &[("ROWS", MATVEC_ROWS as usize)]);
    (expand(MATVEC_Q8_0_WGSL), expand(MATVEC_QUADS_WGSL))
}

/// The optional bindings of a weight kernel's bind group: store.wgsl's bias (6), rows_geglu's
/// GELU table (7), x_rms.wgsl's norm weight (8), and the chunk's bytes again as 16-byte
/// words (9, [`DATA4_BINDING`]).
#[derive(Clone, Copy, Default)]
struct Slots<'a> {
    bias: Option<&'a wgpu::Buffer>,
    table: Option<&'a wgpu::Buffer>,
    norm: Option<&'a wgpu::Buffer>,
    data4: bool,
}

/// The gating a stacked gate/up weight's single-token product can have folded in (for the
/// decoders whose body is matvec_quads.wgsl): SwiGLU (rows_swiglu.wgsl) or GELU-tanh gating
/// with ggml's f16 table (rows_geglu.wgsl, the table at binding 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glu {
    Swiglu,
    Geglu,
}

impl Glu {
    fn suffix(self) -> &'static str {
        match self {
            Glu::Swiglu => "swiglu",
            Glu::Geglu => "geglu",
        }
    }
}

/// The registered name of the single-token product of a stacked gate/up weight with its
/// gating folded in: `weights_q4_1_matvec_r2_wg64_sg_swiglu`, `..._geglu`.
fn glu_name(d: Decoder, reduction: Reduction, glu: Glu) -> String {
    format!(
        "{}_{}",
        name_of(d, WeightOp::Matvec, reduction),
        glu.suffix()
    )
}

fn glu_source(d: Decoder, reduction: Reduction, glu: Glu) -> String {
    let v = Variant {
        glu: Some(glu),
        ..Variant::STANDARD
    };
    source_variant(
        d,
        WeightOp::Matvec,
        reduction,
        glu_name(d, reduction, glu),
        v,
    )
}

/// The registered name of a single-token product with the RMSNorm of x folded in (x_rms.wgsl):
/// the plain (`glu` None) or SwiGLU kernel's name and `_rms`.
fn rms_name(d: Decoder, reduction: Reduction, glu: Option<Glu>) -> String {
    match glu {
        None => format!("{}_rms", name_of(d, WeightOp::Matvec, reduction)),
        Some(g) => format!("{}_rms", glu_name(d, reduction, g)),
    }
}

/// The gating of the `_rms` kernels: none or SwiGLU. (Gemma 3's GELU-gated FFN has its norm
/// in the post-norm op of the layer before, `op_rms_norm_add`: no `_rms` gating kernel.)
const RMS_GLUS: [Option<Glu>; 2] = [None, Some(Glu::Swiglu)];

/// The text of WGSL function `name` in `src`, from its `fn` line to its closing brace at the
/// start of a line (the op modules' `f32_to_f16_bits` for rows_geglu.wgsl: the weights' own
/// common.wgsl has a function of another's name, so the whole ops/common.wgsl cannot come).
fn wgsl_fn<'a>(src: &'a str, name: &str) -> &'a str {
    let start = src
        .find(&format!("fn {name}("))
        .unwrap_or_else(|| panic!("no fn {name} in the WGSL"));
    let len = src[start..]
        .find("\n}\n")
        .unwrap_or_else(|| panic!("fn {name} has no closing brace"));
    &src[start..start + len + 3]
}

/// The single-token kernels of the decoders whose body is matvec_quads.wgsl, under their
/// names but with matvec.wgsl, as a bundle made before that body carries them: for the test
/// that such a bundle still runs (with matvec.wgsl's split, `Params::lanes` included).
#[doc(hidden)]
pub fn unit_matvec_sources() -> Vec<KernelSource> {
    older_matvec_sources(MATVEC_ROWS, Decoder::has_quads)
}

/// Every Q8_0 single-token kernel as a bundle made between the planes layout and
/// matvec_q8_0.wgsl carries it (the planes decoder with matvec_quads.wgsl's body, no `data4`,
/// no wide kernel), for the test that such a bundle still runs.
#[doc(hidden)]
pub fn q8_0_quads_body_sources() -> Vec<KernelSource> {
    let (now, before) = q8_0_body_now_and_before();
    let prefix = format!("{}matvec_", kernel_prefix(Decoder::Gguf(GgmlType::Q8_0)));
    sources()
        .into_iter()
        .filter(|k| k.name.starts_with(&prefix) && !is_wide_matvec(&k.name))
        .map(|k| {
            assert!(k.wgsl.contains(&now), "{}: not today's source", k.name);
            KernelSource {
                wgsl: k.wgsl.replace(&now, &before),
                name: k.name,
            }
        })
        .collect()
}

/// Every Q8_0 and Q6_K kernel as a bundle made before the planes layouts ([`q8_0_planes`],
/// [`q6_k_planes`]) carries it: today's modules with the decoders and the Q6_K single-token
/// body that read the blocks as stored (`shaders/weights/*_blocks.wgsl`) and Q8_0's
/// single-token body then, matvec_quads.wgsl, for the test that such a bundle still runs (a
/// context with these uploads those weights as stored and binds no `data4`).
#[doc(hidden)]
pub fn block_sources() -> Vec<KernelSource> {
    let expand = |body: &str| super::ops::expand_for(body, &[("ROWS", MATVEC_ROWS as usize)]);
    let q8 = [
        (
            Decoder::Gguf(GgmlType::Q8_0).source(),
            include_str!("shaders/weights/unit_q8_0_blocks.wgsl").to_string(),
        ),
        // Q8_0's single-token body was matvec_quads.wgsl's.
        q8_0_body_now_and_before(),
    ];
    let q6 = [
        (
            Decoder::Gguf(GgmlType::Q6_K).source(),
            include_str!("shaders/weights/unit_q6_k_blocks.wgsl").to_string(),
        ),
        (
            expand(MATVEC_Q6_K_WGSL),
            expand(include_str!("shaders/weights/matvec_q6_k_blocks.wgsl")),
        ),
    ];
    let (q8_prefix, q6_prefix) = (
        kernel_prefix(Decoder::Gguf(GgmlType::Q8_0)),
        kernel_prefix(Decoder::Gguf(GgmlType::Q6_K)),
    );
    sources()
        .into_iter()
        .filter_map(|k| {
            // Kernels made since (the wide Q8_0 matvec) are not in such a bundle.
            if is_wide_matvec(&k.name) {
                return None;
            }
            let pairs: &[(String, String)] = if k.name.starts_with(&q8_prefix) {
                &q8
            } else if k.name.starts_with(&q6_prefix) {
                &q6
            } else {
                return None;
            };
            let mut wgsl = k.wgsl;
            for (now, before) in pairs {
                if k.name.contains("_matvec_") || !before.contains("fn partials") {
                    assert!(
                        wgsl.contains(now.as_str()),
                        "{}: not today's source",
                        k.name
                    );
                    wgsl = wgsl.replace(now.as_str(), before);
                }
            }
            Some(KernelSource { name: k.name, wgsl })
        })
        .collect()
}

/// Every palette kernel as a bundle made before the f32 tables carries it: today's modules
/// with the decoder that reads the f16 tables as stored (unit_palette_f16.wgsl), for the test
/// that such a bundle still runs (a context with these uploads the tables as stored).
#[doc(hidden)]
pub fn palette_f16_sources() -> Vec<KernelSource> {
    sources()
        .into_iter()
        .filter_map(|k| {
            let bits =
                (1..=8).find(|&b| k.name.starts_with(&kernel_prefix(Decoder::Palette(b))))?;
            let now = Decoder::Palette(bits).source();
            assert!(k.wgsl.contains(&now), "{}: not today's source", k.name);
            let before = format!(
                "const BITS: u32 = {bits}u;\n{}",
                include_str!("shaders/weights/unit_palette_f16.wgsl")
            );
            Some(KernelSource {
                wgsl: k.wgsl.replace(&now, &before),
                name: k.name,
            })
        })
        .collect()
}

/// The single-token kernels as a bundle made before the body took [`MATVEC_ROWS`] rows names
/// them (`weights_{enc}_matvec_r4_wg64_{sg|wg}`), with [`LEGACY_MATVEC_ROWS`] rows: for the
/// test that such a bundle still runs (a real one carries its own, older source).
#[doc(hidden)]
pub fn legacy_matvec_sources() -> Vec<KernelSource> {
    older_matvec_sources(LEGACY_MATVEC_ROWS, |d| d != Decoder::Ternary)
}

/// matvec.wgsl (never matvec_quads.wgsl) with `rows` rows a workgroup, named `_r{rows}_`, for
/// each decoder `keep` takes and both reductions.
fn older_matvec_sources(rows: u32, keep: fn(Decoder) -> bool) -> Vec<KernelSource> {
    let mut v = Vec::new();
    for d in Decoder::all().into_iter().filter(|&d| keep(d)) {
        for reduction in [Reduction::Subgroup, Reduction::Workgroup] {
            let name = name_of(d, WeightOp::Matvec, reduction).replace(
                &format!("_matvec_r{MATVEC_ROWS}_"),
                &format!("_matvec_r{rows}_"),
            );
            let older = Variant {
                rows,
                quads: false,
                ..Variant::STANDARD
            };
            let wgsl = source_variant(d, WeightOp::Matvec, reduction, name.clone(), older);
            v.push(KernelSource { name, wgsl });
        }
    }
    v
}

/// What a product's module is made of beyond its decoder, operation and reduction.
#[derive(Clone, Copy, Debug)]
struct Variant {
    /// Rows a workgroup of the single-token body (its `ROWS`, the count its template is
    /// expanded with).
    rows: u32,
    /// false: matvec.wgsl as the single-token body even where the decoder's is
    /// matvec_quads.wgsl or matvec_q4_k.wgsl (a bundle made before those carries it).
    quads: bool,
    /// rows_swiglu.wgsl or rows_geglu.wgsl (with ops/common.wgsl's `f32_to_f16_bits`) in
    /// place of rows.wgsl.
    glu: Option<Glu>,
    /// x_rms.wgsl (the RMSNorm of x folded in) in place of x_plain.wgsl (matvec_quads.wgsl,
    /// matvec_q8_0.wgsl).
    rms: bool,
}

impl Variant {
    const STANDARD: Variant = Variant {
        rows: MATVEC_ROWS,
        quads: true,
        glu: None,
        rms: false,
    };
}

/// The complete module of kernel `name`: [`source_of`] as `v` varies it.
fn source_variant(
    d: Decoder,
    op: WeightOp,
    reduction: Reduction,
    name: String,
    v: Variant,
) -> String {
    let Variant {
        rows: matvec_rows,
        quads,
        glu,
        rms,
    } = v;
    let geglu_rows;
    let rows_wgsl = match glu {
        None => ROWS_WGSL,
        Some(Glu::Swiglu) => ROWS_SWIGLU_WGSL,
        Some(Glu::Geglu) => {
            geglu_rows = format!(
                "{ROWS_GEGLU_WGSL}\n// From ops/common.wgsl.\n{}",
                wgsl_fn(super::ops::COMMON_WGSL, "f32_to_f16_bits")
            );
            &geglu_rows
        }
    };
    let (consts, body, reduce) = match op {
        WeightOp::Matvec | WeightOp::Matmul => {
            let (rows, tok, body) = if op == WeightOp::Matvec {
                let body = match d {
                    Decoder::Gguf(GgmlType::Q6_K) => MATVEC_Q6_K_WGSL.to_string(),
                    Decoder::Gguf(GgmlType::Q4_K) if quads => MATVEC_Q4_K_WGSL.to_string(),
                    d if quads && d.has_quads() => {
                        // Q8_0's own body takes the quads' forms and x hooks.
                        let body = if d == Decoder::Gguf(GgmlType::Q8_0) {
                            MATVEC_Q8_0_WGSL
                        } else {
                            MATVEC_QUADS_WGSL
                        };
                        let x = if rms { X_RMS_WGSL } else { X_PLAIN_WGSL };
                        format!("{body}\n{x}")
                    }
                    _ => MATVEC_WGSL.to_string(),
                };
                (matvec_rows, 1, body)
            } else {
                (MATMUL_ROWS, MATMUL_TOKENS, MATMUL_WGSL.to_string())
            };
            (
                format!("const ROWS: u32 = {rows}u;\nconst TOK: u32 = {tok}u;\nconst WG: u32 = {WORKGROUP}u;\n"),
                body,
                match reduction {
                    Reduction::Subgroup => {
                        format!("{STORE_WGSL}\n{rows_wgsl}\n{REDUCE_SUBGROUP_WGSL}")
                    }
                    Reduction::Workgroup => {
                        format!("{STORE_WGSL}\n{rows_wgsl}\n{REDUCE_WORKGROUP_WGSL}")
                    }
                },
            )
        }
        WeightOp::Gather => (
            format!("const WG: u32 = {GATHER_WORKGROUP}u;\n"),
            GATHER_WGSL.to_string(),
            String::new(),
        ),
    };
    // The products' bodies are templates over their rows (and the multi-token one over its
    // tokens): matvec.wgsl, matvec_q6_k.wgsl, matmul.wgsl.
    let body = match op {
        WeightOp::Matvec => super::ops::expand_for(&body, &[("ROWS", matvec_rows as usize)]),
        WeightOp::Matmul => super::ops::expand_for(
            &body,
            &[
                ("ROWS", MATMUL_ROWS as usize),
                ("TOK", MATMUL_TOKENS as usize),
            ],
        ),
        WeightOp::Gather => body,
    };
    format!(
        "// {name}: generated by src/runtime/gpu/weights.rs from shaders/weights/\n{consts}\n{COMMON_WGSL}\n{}\n{body}\n{reduce}",
        d.source()
    )
}

/// Every weight kernel, for [`super::kernels::all`]: each decoder's matvec and matmul with
/// both reductions and its gather (the `ternary2` matvec is the ternary kernel, listed
/// there).
pub fn sources() -> Vec<KernelSource> {
    let mut v = Vec::new();
    for d in Decoder::all() {
        for reduction in [Reduction::Subgroup, Reduction::Workgroup] {
            for op in [WeightOp::Matvec, WeightOp::Matmul] {
                if d == Decoder::Ternary && op == WeightOp::Matvec {
                    continue;
                }
                v.push(KernelSource {
                    name: name_of(d, op, reduction),
                    wgsl: source_of(d, op, reduction),
                });
                if d == Decoder::Gguf(GgmlType::Q8_0) && op == WeightOp::Matvec {
                    let name = wide_matvec_name(reduction);
                    let wide = Variant {
                        rows: WIDE_MATVEC_ROWS,
                        ..Variant::STANDARD
                    };
                    v.push(KernelSource {
                        wgsl: source_variant(d, op, reduction, name.clone(), wide),
                        name,
                    });
                }
            }
            if d.has_quads() {
                for glu in [Glu::Swiglu, Glu::Geglu] {
                    v.push(KernelSource {
                        name: glu_name(d, reduction, glu),
                        wgsl: glu_source(d, reduction, glu),
                    });
                }
                for glu in RMS_GLUS {
                    let name = rms_name(d, reduction, glu);
                    let rms = Variant {
                        glu,
                        rms: true,
                        ..Variant::STANDARD
                    };
                    v.push(KernelSource {
                        wgsl: source_variant(d, WeightOp::Matvec, reduction, name.clone(), rms),
                        name,
                    });
                }
            }
        }
        v.push(KernelSource {
            name: name_of(d, WeightOp::Gather, Reduction::Workgroup),
            wgsl: source_of(d, WeightOp::Gather, Reduction::Workgroup),
        });
        v.push(KernelSource {
            name: tile_name(d),
            wgsl: tile_source(d),
        });
    }
    v.push(KernelSource {
        name: Q8_QUANTIZE.into(),
        wgsl: format!(
            "// {Q8_QUANTIZE}: generated by src/runtime/gpu/weights.rs from shaders/weights/q8_quantize.wgsl\n{}\n{Q8_QUANTIZE_WGSL}",
            super::Q8_COMMON_WGSL
        ),
    });
    for tt in MMQ_TOKENS_PER_INVOCATION {
        v.push(KernelSource {
            name: mmq_name(tt),
            wgsl: mmq_source(tt),
        });
    }
    v
}

/// The bound of the module doc on `|y_gpu - y|` for one output of a product over `cols`
/// (`K`) elements, `abs_wx = sum_k |w_k x_k|` (in f64): `(D + 1) * 2^-24 * abs_wx +
/// 2 K * f32::MIN_POSITIVE` with `D = 71 + ceil(K / 512)`. Not for the single-token
/// `ternary2` product ([`super::tolerance`]).
pub fn matmul_tolerance(cols: usize, abs_wx: f64) -> f64 {
    let d = 7 + cols.div_ceil(8 * WORKGROUP as usize) + WORKGROUP as usize;
    (d + 1) as f64 * (f32::EPSILON as f64 / 2.0) * abs_wx
        + 2.0 * cols as f64 * f32::MIN_POSITIVE as f64
}

/// [`matmul_tolerance`]'s bound for the tiled product (`shaders/weights/matmul_tile.wgsl`):
/// the same unit term (depth 7), then the `K / 32` unit terms added one after another, so
/// `D = 7 + ceil(K / 32)`.
pub fn matmul_tile_tolerance(cols: usize, abs_wx: f64) -> f64 {
    let d = 7 + cols.div_ceil(UNIT);
    (d + 1) as f64 * (f32::EPSILON as f64 / 2.0) * abs_wx
        + 2.0 * cols as f64 * f32::MIN_POSITIVE as f64
}

/// A bound dispatch list (pipeline + bind groups + grids), made once at load, encoded any
/// number of times.
pub struct Bound {
    pipeline: wgpu::ComputePipeline,
    parts: Vec<(wgpu::BindGroup, [u32; 3])>,
    /// A dispatch encoded before this one's: the quantization of x of the int8 prefill
    /// product, or of a [`super::MatvecKernel::Q8Pre`] decode product.
    pre: Option<Box<Bound>>,
    /// The kernel of `pre` where it is a [`super::MatvecKernel::Q8Pre`] product's quantize
    /// dispatch ([`super::q8_quantize_name`]).
    pre_kernel: Option<&'static str>,
    /// `kernel weight`, for profiles.
    pub label: String,
}

impl Bound {
    /// The workgroup grid of each of its dispatches (one per row chunk; the pre pass's not
    /// included): how the host split the product, for tests and profiles.
    pub fn grids(&self) -> Vec<[u32; 3]> {
        self.parts.iter().map(|p| p.1).collect()
    }

    /// Records the dispatches (one per row chunk, after the pre pass's) into `pass`.
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>) {
        self.encode_with(pass, true)
    }

    /// [`Bound::encode`], leaving the pre pass out where `pre` is false (a measuring knob of
    /// the profile: the product's cost without its quantize dispatch; its outputs are then
    /// wrong).
    pub fn encode_with(&self, pass: &mut wgpu::ComputePass<'_>, pre: bool) {
        if let (Some(p), true) = (&self.pre, pre) {
            p.encode(pass);
        }
        pass.set_pipeline(&self.pipeline);
        for (bg, [gx, gy, gz]) in &self.parts {
            pass.set_bind_group(0, bg, &[]);
            pass.dispatch_workgroups(*gx, *gy, *gz);
        }
    }

    /// Whether this is a [`super::MatvecKernel::Q8Pre`] product with its quantize dispatch
    /// `quantize` in front.
    pub fn has_pre(&self, quantize: &str) -> bool {
        self.pre.is_some() && self.pre_kernel == Some(quantize)
    }

    /// Leaves out the quantize dispatch `quantize` of a [`super::MatvecKernel::Q8Pre`] decode
    /// product (the op before it writes the int8 x instead: `op_attention_combine_q8`), and
    /// its `+{quantize}` from the label; whether there was one.
    pub fn drop_pre(&mut self, quantize: &str) -> bool {
        if !self.has_pre(quantize) {
            return false;
        }
        let tag = format!("+{} ", quantize.trim_start_matches("ternary_"));
        self.pre = None;
        self.pre_kernel = None;
        self.label = self.label.replacen(&tag, " ", 1);
        true
    }

    /// Dispatches per encode (one per row chunk, and the pre pass's).
    pub fn dispatches(&self) -> usize {
        self.parts.len() + self.pre.as_ref().map_or(0, |p| p.dispatches())
    }
}

impl From<BoundMatvec> for Bound {
    fn from(b: BoundMatvec) -> Bound {
        // A Q8Pre product's quantize dispatch stays in front of it.
        let pre = b.pre.map(|(pipeline, bg, groups)| {
            Box::new(Bound {
                pre_kernel: None,
                label: String::new(),
                pre: None,
                pipeline,
                parts: vec![(bg, [groups, 1, 1])],
            })
        });
        Bound {
            label: b.label,
            pre_kernel: b.pre_kernel,
            pre,
            pipeline: b.pipeline,
            parts: b
                .parts
                .into_iter()
                .map(|(bg, (gx, gy))| (bg, [gx, gy, 1]))
                .collect(),
        }
    }
}

/// `what [rows, cols]: detail` as a shape error of `op`.
fn shape_err(op: &'static str, name: &str, rows: usize, cols: usize, detail: String) -> GpuError {
    GpuError::Shape {
        op,
        detail: format!("{name} [{rows}, {cols}]: {detail}"),
    }
}

const UPLOAD: &str = "weight upload";

/// The checks every encoding shares: a nonempty weight, `cols` a multiple of [`UNIT`], shapes
/// that the kernels' u32 arithmetic holds.
fn check_shape(name: &str, rows: usize, cols: usize) -> Result<(), GpuError> {
    if rows == 0 || cols == 0 || !cols.is_multiple_of(UNIT) {
        return Err(shape_err(
            UPLOAD,
            name,
            rows,
            cols,
            format!("cols must be a positive multiple of {UNIT}"),
        ));
    }
    if rows > u32::MAX as usize || cols > u32::MAX as usize / 8 {
        return Err(shape_err(
            UPLOAD,
            name,
            rows,
            cols,
            "more rows or columns than the kernels' 32-bit indices hold".into(),
        ));
    }
    Ok(())
}

impl GpuContext {
    /// The reduction the weight kernels use here: subgroups where the adapter has them,
    /// unless [`super::ContextOptions::force_workgroup_reduction`].
    pub fn weight_reduction(&self) -> Reduction {
        if self.has_subgroups() && !self.force_workgroup_reduction {
            Reduction::Subgroup
        } else {
            Reduction::Workgroup
        }
    }

    /// Bytes of one chunk's binding: the smaller of the context's cap and what a u32 byte
    /// index addresses (the GGUF decoders index bytes).
    fn weight_binding_cap(&self) -> u64 {
        self.max_binding_bytes.min(1 << 32)
    }

    /// A storage buffer holding `bytes`, zero-padded to a whole word and then one more word
    /// (read by `word_at` and the palette's straddling indices past the last block).
    fn upload_padded(&self, label: &str, bytes: &[u8]) -> Result<wgpu::Buffer, GpuError> {
        let size = (bytes.len() as u64).div_ceil(4) * 4 + 4;
        if size > self.limits.max_buffer_size {
            return Err(GpuError::Limit {
                op: UPLOAD,
                what: "one buffer (bytes)",
                needed: size,
                limit: self.limits.max_buffer_size,
            });
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        // Buffers are created zeroed: the padding is zero.
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Device {
                op: UPLOAD,
                detail: format!("{label}: {e}"),
            });
        }
        let whole = bytes.len() / 4 * 4;
        if whole > 0 {
            self.queue.write_buffer(&buf, 0, &bytes[..whole]);
        }
        if whole < bytes.len() {
            let mut tail = [0u8; 4];
            tail[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
            self.queue.write_buffer(&buf, whole as u64, &tail);
        }
        Ok(buf)
    }

    /// Uploads a weight of an opened bundle from its memory map, in its stored encoding.
    /// Refuses (naming the tensor) encodings without kernels, `cols` not a multiple of 32,
    /// and layouts that do not match the shape.
    pub fn upload_model_weight(
        &self,
        bundle: &crate::bundle::reader::Bundle,
        w: &crate::runtime::model::Weight,
    ) -> Result<GpuWeight, GpuError> {
        use crate::runtime::model::WeightKind;
        match &w.kind {
            WeightKind::Gguf { ty, range } => {
                self.upload_gguf(&w.name, *ty, w.rows, w.cols, w.bytes(bundle, *range))
            }
            WeightKind::Ternary { codes, scales } => self.upload_ternary_weight(
                &w.name,
                w.rows,
                w.cols,
                w.bytes(bundle, *codes),
                w.bytes(bundle, *scales),
            ),
            WeightKind::Palette {
                bits,
                group_size,
                row_bytes,
                tables,
                indices,
            } => self.upload_palette(
                &w.name,
                w.rows,
                w.cols,
                *bits,
                *group_size,
                *row_bytes,
                w.bytes(bundle, *tables),
                w.bytes(bundle, *indices),
            ),
        }
    }

    /// Uploads up to three weights with the same columns and encoding (GGML type; palette
    /// bits, group size and row bytes) as one, their rows one after another (Q, K and V; gate
    /// and up), so that one dispatch computes all their products
    /// ([`GpuWeight::parts`] says where each ends; [`GpuContext::bind_matmul_with`] stores
    /// each part as its own block). `None` when they cannot be stacked (different encodings
    /// or columns, a palette part that is not a whole number of groups, more than three).
    /// The bytes are copied once on the host (one part at a time would be as many uploads).
    pub fn upload_stacked(
        &self,
        bundle: &crate::bundle::reader::Bundle,
        ws: &[&crate::runtime::model::Weight],
    ) -> Result<Option<GpuWeight>, GpuError> {
        use crate::runtime::model::WeightKind;
        let Some(first) = ws.first() else {
            return Ok(None);
        };
        if ws.len() > 3 || ws.iter().any(|w| w.cols != first.cols) {
            return Ok(None);
        }
        let rows: usize = ws.iter().map(|w| w.rows).sum();
        let name = ws
            .iter()
            .map(|w| w.name.as_str())
            .collect::<Vec<_>>()
            .join("+");
        // The parts' bytes of one kind, one after another.
        fn cat<'a>(
            ws: &[&crate::runtime::model::Weight],
            f: impl Fn(&crate::runtime::model::Weight) -> &'a [u8],
        ) -> Vec<u8> {
            let mut v = Vec::new();
            for w in ws {
                v.extend_from_slice(f(w));
            }
            v
        }
        let mut out = match &first.kind {
            WeightKind::Gguf { ty, .. } => {
                let ty = *ty;
                if !ws
                    .iter()
                    .all(|w| matches!(w.kind, WeightKind::Gguf { ty: t, .. } if t == ty))
                {
                    return Ok(None);
                }
                let bytes = cat(ws, |w| match &w.kind {
                    WeightKind::Gguf { range, .. } => w.bytes(bundle, *range),
                    _ => &[],
                });
                self.upload_gguf(&name, ty, rows, first.cols, &bytes)?
            }
            WeightKind::Ternary { .. } => {
                if !ws
                    .iter()
                    .all(|w| matches!(w.kind, WeightKind::Ternary { .. }))
                {
                    return Ok(None);
                }
                let codes = cat(ws, |w| match &w.kind {
                    WeightKind::Ternary { codes, .. } => w.bytes(bundle, *codes),
                    _ => &[],
                });
                let scales = cat(ws, |w| match &w.kind {
                    WeightKind::Ternary { scales, .. } => w.bytes(bundle, *scales),
                    _ => &[],
                });
                self.upload_ternary_weight(&name, rows, first.cols, &codes, &scales)?
            }
            WeightKind::Palette {
                bits, row_bytes, ..
            } => {
                let (bits, row_bytes) = (*bits, *row_bytes);
                // Parts of one width and row length whose groups may differ (`palettize`'s
                // default is one table per tensor: Q's 576 rows against K's 192): the stack's
                // group is the greatest common divisor of theirs, each part's tables repeated
                // (its group / that) times, so that every row of the stack still reads its
                // own part's table.
                let mut group = 0usize;
                for w in ws {
                    match &w.kind {
                        WeightKind::Palette {
                            bits: b,
                            group_size: g,
                            row_bytes: rb,
                            ..
                        } if (*b, *rb) == (bits, row_bytes)
                            && *g > 0
                            && w.rows.is_multiple_of(*g) =>
                        {
                            group = gcd(group, *g)
                        }
                        _ => return Ok(None),
                    }
                }
                let table_bytes = 2usize << bits;
                // Not where the repeated tables, as uploaded (f32 or as stored), would rival
                // the indices (groups of few rows against wide tables): each part a product
                // of its own then.
                let device_table_bytes = if self.reads_f32_tables()? {
                    4usize << bits
                } else {
                    table_bytes
                };
                if (rows / group) * device_table_bytes > rows * row_bytes / 4 {
                    return Ok(None);
                }
                let mut tables = Vec::with_capacity(rows / group * table_bytes);
                for w in ws {
                    if let WeightKind::Palette {
                        tables: t,
                        group_size,
                        ..
                    } = &w.kind
                    {
                        let bytes = w.bytes(bundle, *t);
                        if bytes.len() != w.rows / group_size * table_bytes {
                            return Ok(None);
                        }
                        for table in bytes.chunks_exact(table_bytes) {
                            for _ in 0..group_size / group {
                                tables.extend_from_slice(table);
                            }
                        }
                    }
                }
                let indices = cat(ws, |w| match &w.kind {
                    WeightKind::Palette { indices, .. } => w.bytes(bundle, *indices),
                    _ => &[],
                });
                self.upload_palette(
                    &name, rows, first.cols, bits, group, row_bytes, &tables, &indices,
                )?
            }
        };
        out.parts = ws.iter().map(|w| w.rows).collect();
        Ok(Some(out))
    }

    /// Uploads GGML blocks `[rows, cols]` of type `ty` (`bytes`: `rows * cols / block_size *
    /// type_size`, as stored), split into row chunks that fit one binding; each Q8_0 or Q6_K
    /// chunk regrouped into planes where this context's kernels of that type read them
    /// ([`GpuContext::reads_planes`]).
    pub fn upload_gguf(
        &self,
        name: &str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<GpuWeight, GpuError> {
        if !GGUF_TYPES.contains(&ty) {
            return Err(shape_err(
                UPLOAD,
                name,
                rows,
                cols,
                format!(
                    "GGML type {ty} has no GPU kernel (supported: {})",
                    GGUF_TYPES.map(|t| t.name()).join(", ")
                ),
            ));
        }
        check_shape(name, rows, cols)?;
        let rb = ty.bytes_for(cols as u64).ok_or_else(|| {
            shape_err(
                UPLOAD,
                name,
                rows,
                cols,
                format!(
                    "{ty} rows must be a multiple of {} elements",
                    ty.block_size()
                ),
            )
        })?;
        if (rows as u64).checked_mul(rb) != Some(bytes.len() as u64) {
            return Err(shape_err(
                UPLOAD,
                name,
                rows,
                cols,
                format!("{} bytes given, {ty} needs {rb} per row", bytes.len()),
            ));
        }
        // data: n * rb bytes, padded to a word plus one word, within the cap.
        let n_max = self.weight_binding_cap().saturating_sub(8) / rb;
        if n_max == 0 {
            return Err(GpuError::Limit {
                op: UPLOAD,
                what: "one row's blocks and padding (bytes)",
                needed: rb + 8,
                limit: self.weight_binding_cap(),
            });
        }
        let regroup = match planes_of(ty) {
            Some(f) if self.reads_planes(ty)? => Some(f),
            _ => None,
        };
        let mut chunks = Vec::new();
        let mut row0 = 0usize;
        while row0 < rows {
            let n = (n_max as usize).min(rows - row0);
            let mut part = &bytes[row0 * rb as usize..(row0 + n) * rb as usize];
            let planes;
            if let Some(regroup) = regroup {
                planes = regroup(part, n, cols);
                part = &planes;
            }
            chunks.push(WeightChunk {
                row0,
                rows: n,
                data: self.upload_padded(&format!("{name}[{row0}..]"), part)?,
                aux: self.upload_padded(&format!("{name}[{row0}..] aux"), &[])?,
                aux4: 0,
            });
            row0 += n;
        }
        Ok(GpuWeight {
            name: name.to_string(),
            rows,
            cols,
            format: WeightFormat::Gguf(ty),
            chunks,
            parts: vec![rows],
        })
    }

    /// Whether this context's kernels of GGML type `ty` (Q8_0 or Q6_K) read a weight as
    /// planes ([`q8_0_planes`], [`q6_k_planes`]): the built-in ones do, and so do a bundle's
    /// from this release on (their decoder says [`planes_mark`]); a bundle made before
    /// carries kernels that read the blocks as stored, and its weights of that type are
    /// uploaded so. A kernel set that has both (no tool makes one: `add-kernels` replaces a
    /// bundle's whole set) is an error naming one of each, since no upload suits both.
    pub fn reads_planes(&self, ty: GgmlType) -> Result<bool, GpuError> {
        let Some(mark) = planes_mark(ty) else {
            return Ok(false);
        };
        self.reads_marked_layout(
            &kernel_prefix(Decoder::Gguf(ty)),
            mark,
            &format!("{ty} blocks as stored"),
            "them as planes",
        )
    }

    /// Whether the kernels named `prefix...` read a layout whose code has `mark`: the
    /// built-in ones do (they are this build's), a bundle's do where its sources have the
    /// mark; a bundle made before the layout carries sources without it. A set with both is
    /// an error naming one of each (`old` and `new` say what each reads), since no upload
    /// suits both. For [`GpuContext::reads_planes`] and [`GpuContext::reads_f32_tables`].
    fn reads_marked_layout(
        &self,
        prefix: &str,
        mark: &str,
        old: &str,
        new: &str,
    ) -> Result<bool, GpuError> {
        if self.builtin {
            return Ok(true);
        }
        let mut with = None;
        let mut without = None;
        for (n, s) in self.sources.iter().filter(|(n, _)| n.starts_with(prefix)) {
            if s.contains(mark) {
                with.get_or_insert(n);
            } else {
                without.get_or_insert(n);
            }
        }
        match (with, without) {
            (Some(w), Some(o)) => Err(GpuError::Shader {
                name: o.clone(),
                detail: format!(
                    "reads {old} where {w} reads {new}: the kernels are from two releases (`convert add-kernels` gives a bundle one set)"
                ),
            }),
            (w, _) => Ok(w.is_some()),
        }
    }

    /// Whether this context's palette kernels read the tables as f32 ([`PALETTE_F32_MARK`]):
    /// the built-in ones do, and so do a bundle's from this release on; a bundle made before
    /// carries kernels that read the f16 tables as stored, and its palette weights' tables
    /// are uploaded so. A kernel set with both is an error naming one of each, as in
    /// [`GpuContext::reads_planes`].
    pub fn reads_f32_tables(&self) -> Result<bool, GpuError> {
        self.reads_marked_layout(
            "weights_palette_",
            PALETTE_F32_MARK,
            "palette tables as f16",
            "them as f32",
        )
    }

    /// Uploads a `ternary2` weight `[rows, cols]` (`words`: `rows * cols/16` little-endian
    /// u32, `scales`: `rows * cols/256` little-endian f16) as [`GpuContext::upload_ternary`]
    /// does (the same chunks, usable by the tuned kernel).
    pub fn upload_ternary_weight(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        words: &[u8],
        scales: &[u8],
    ) -> Result<GpuWeight, GpuError> {
        check_shape(name, rows, cols)?;
        let t = self.upload_ternary(name, rows, cols, words, scales)?;
        Ok(GpuWeight {
            name: t.name,
            rows,
            cols,
            format: WeightFormat::Ternary,
            chunks: t
                .chunks
                .into_iter()
                .map(|c| WeightChunk {
                    row0: c.row0,
                    rows: c.rows,
                    data: c.codes,
                    aux: c.scales,
                    aux4: c.scales4,
                })
                .collect(),
            parts: vec![rows],
        })
    }

    /// Uploads a palettized weight `[rows, cols]`: `indices` `rows * row_bytes` bytes
    /// (`row_bytes = cols * bits / 8`, packed by [`crate::palette::pack_row`]), `tables`
    /// `rows / group_size` tables of `2^bits` little-endian f16 (uploaded widened to f32, or
    /// as given: [`GpuContext::reads_f32_tables`]). `bits` is 1..=8 and `rows` a multiple of
    /// `group_size`.
    #[allow(clippy::too_many_arguments)]
    pub fn upload_palette(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        bits: u32,
        group_size: usize,
        row_bytes: usize,
        tables: &[u8],
        indices: &[u8],
    ) -> Result<GpuWeight, GpuError> {
        check_shape(name, rows, cols)?;
        let err = |d: String| shape_err(UPLOAD, name, rows, cols, d);
        if !(1..=8).contains(&bits) {
            return Err(err(format!("palette bits {bits}: must be 1..=8")));
        }
        if group_size == 0 || !rows.is_multiple_of(group_size) || group_size > u32::MAX as usize {
            return Err(err(format!(
                "palette group size {group_size}: rows must be a whole number of groups"
            )));
        }
        if row_bytes != cols * bits as usize / 8 {
            return Err(err(format!(
                "palette row bytes {row_bytes}, expected {} ({bits} bits per index)",
                cols * bits as usize / 8
            )));
        }
        let stored_bytes = 2usize << bits;
        let want_tables = rows / group_size * stored_bytes;
        if (rows as u64).checked_mul(row_bytes as u64) != Some(indices.len() as u64)
            || tables.len() != want_tables
        {
            return Err(err(format!(
                "{} index bytes and {} table bytes given, {} and {want_tables} expected",
                indices.len(),
                tables.len(),
                rows as u64 * row_bytes as u64
            )));
        }
        // The tables as the kernels read them: each f16 entry widened to f32 (exact), or as
        // stored for a bundle's kernels from before ([`GpuContext::reads_f32_tables`]).
        let widened: Vec<u8>;
        let (tables, table_bytes) = if self.reads_f32_tables()? {
            widened = tables
                .chunks_exact(2)
                .flat_map(|h| {
                    crate::quant::f16_bits_to_f32(u16::from_le_bytes([h[0], h[1]])).to_le_bytes()
                })
                .collect();
            (&widened[..], 4usize << bits)
        } else {
            (tables, stored_bytes)
        };
        // Rows per chunk: the indices (plus padding) fit the cap, and so do the tables of
        // the at most ceil(n / group_size) + 1 groups that n rows starting anywhere touch.
        let cap = self.weight_binding_cap();
        let by_data = cap.saturating_sub(8) / row_bytes as u64;
        // (upload_padded adds a word to each buffer.)
        let by_tables =
            (cap.saturating_sub(4) / table_bytes as u64).saturating_sub(1) * group_size as u64;
        let n_max = by_data.min(by_tables);
        if n_max == 0 {
            return Err(GpuError::Limit {
                op: UPLOAD,
                what: "one row's indices and two tables (bytes)",
                needed: (row_bytes + 8).max(2 * table_bytes) as u64,
                limit: cap,
            });
        }
        let mut chunks = Vec::new();
        let mut row0 = 0usize;
        while row0 < rows {
            let n = (n_max as usize).min(rows - row0);
            let (g0, g1) = (row0 / group_size, (row0 + n - 1) / group_size + 1);
            chunks.push(WeightChunk {
                row0,
                rows: n,
                data: self.upload_padded(
                    &format!("{name}.indices[{row0}..]"),
                    &indices[row0 * row_bytes..(row0 + n) * row_bytes],
                )?,
                aux: self.upload_padded(
                    &format!("{name}.tables[{row0}..]"),
                    &tables[g0 * table_bytes..g1 * table_bytes],
                )?,
                aux4: 0,
            });
            row0 += n;
        }
        Ok(GpuWeight {
            name: name.to_string(),
            rows,
            cols,
            format: WeightFormat::Palette {
                bits,
                group_size: group_size as u32,
                row_bytes: row_bytes as u32,
                entry_bytes: (table_bytes >> bits) as u32,
            },
            chunks,
            parts: vec![rows],
        })
    }

    /// The uniform parameters of one chunk's dispatch (`Params` in common.wgsl; 60 bytes
    /// padded to 64). `split`: the single-token body's lanes and rows per workgroup
    /// ([`matvec_split`]), or (WORKGROUP, the kernel's compiled rows) for the kernels that
    /// read neither (the multi-token products, a bundle's kernels from before the split);
    /// `norm_eps`: the folded RMSNorm's eps (the `_rms` kernels; 0 elsewhere).
    #[allow(clippy::too_many_arguments)]
    fn weight_params(
        &self,
        w: &GpuWeight,
        c: &WeightChunk,
        groups_x: u32,
        n: u32,
        epilogue: Epilogue,
        split: (u32, u32),
        norm_eps: f32,
    ) -> wgpu::Buffer {
        let (p0, p1) = match w.format {
            WeightFormat::Palette { group_size, .. } => {
                (group_size, (c.row0 % group_size as usize) as u32)
            }
            _ => (1, 0),
        };
        let (seg1, seg2) = match w.parts[..] {
            [a, _] => (a, w.rows),
            [a, b, _] => (a, a + b),
            _ => (w.rows, w.rows),
        };
        let (acc, scale) = epilogue.flag_and_scale();
        let params = [
            c.rows as u32,
            w.cols as u32,
            groups_x,
            c.row0 as u32,
            w.rows as u32,
            n,
            p0,
            p1,
            seg1 as u32,
            seg2 as u32,
            acc,
            scale.to_bits(),
            split.0,
            split.1,
            norm_eps.to_bits(),
            0,
        ];
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("weights params"),
            size: 64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.queue
            .write_buffer(&buf, 0, bytemuck::cast_slice(&params));
        buf
    }

    /// One chunk's bind group: data, aux where the kernel has it, the two vectors, params, and
    /// for a product (`bias` `Some`: store.wgsl's binding 6) the bias vector or, for the other
    /// epilogues, a placeholder.
    #[allow(clippy::too_many_arguments)]
    fn weight_bind_group(
        &self,
        layout: &wgpu::BindGroupLayout,
        w: &GpuWeight,
        c: &WeightChunk,
        input: &wgpu::Buffer,
        output: &dyn Bindable,
        params: &wgpu::Buffer,
        bias: Option<&wgpu::Buffer>,
    ) -> wgpu::BindGroup {
        let slots = Slots {
            bias,
            ..Slots::default()
        };
        self.weight_bind_group_with(layout, w, c, input, output, params, slots)
    }

    /// [`Self::weight_bind_group`] with the optional bindings `slots` names.
    #[allow(clippy::too_many_arguments)]
    fn weight_bind_group_with(
        &self,
        layout: &wgpu::BindGroupLayout,
        w: &GpuWeight,
        c: &WeightChunk,
        input: &wgpu::Buffer,
        output: &dyn Bindable,
        params: &wgpu::Buffer,
        slots: Slots,
    ) -> wgpu::BindGroup {
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: c.data.as_entire_binding(),
        }];
        if Decoder::of(w.format).has_aux() {
            entries.push(wgpu::BindGroupEntry {
                binding: 1,
                resource: c.aux.as_entire_binding(),
            });
        }
        entries.extend([
            wgpu::BindGroupEntry {
                binding: 2,
                resource: input.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 3,
                resource: output.binding(),
            },
            wgpu::BindGroupEntry {
                binding: 4,
                resource: params.as_entire_binding(),
            },
        ]);
        if slots.data4 {
            entries.push(wgpu::BindGroupEntry {
                binding: 9,
                resource: c.data.as_entire_binding(),
            });
        }
        for (binding, b) in [(6, slots.bias), (7, slots.table), (8, slots.norm)] {
            if let Some(b) = b {
                entries.push(wgpu::BindGroupEntry {
                    binding,
                    resource: b.as_entire_binding(),
                });
            }
        }
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&w.name),
            layout,
            entries: &entries,
        })
    }

    /// `y[t * w.rows + r] = sum_k W[r, k] * x[t * w.cols + k]` for `t < n_tokens` (`x`, `y`
    /// f32 storage buffers of at least `n_tokens * cols` and `n_tokens * rows` values).
    /// `n_tokens == 1` is the decode matvec (for `ternary2` the ternary kernel of
    /// [`GpuContext::default_matvec_config`]); larger
    /// `n_tokens` the prefill product, which reads each weight block once per
    /// [`MATMUL_TOKENS`] tokens, from [`MATMUL_TILE_MIN_TOKENS`] on once per
    /// [`MATMUL_TILE_TOKENS`] (the tiled kernel, [`GpuContext::matmul_tile_applies`]; a
    /// `ternary2` weight with int8 activations: the int8 prefill product, once per 64 or 16
    /// tokens).
    pub fn bind_matmul(
        &self,
        w: &GpuWeight,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        n_tokens: u32,
    ) -> Result<Bound, GpuError> {
        self.bind_matmul_with(w, x, &BufView::whole(y), n_tokens, Epilogue::Store)
    }

    /// [`GpuContext::bind_matmul`] into a view `y` (from its offset), with the sums stored as
    /// `epilogue` says. A stacked weight ([`GpuWeight::parts`]) stores each part's
    /// `[n_tokens, rows_j]` block after the previous one's (for one token, the parts one
    /// after another).
    pub fn bind_matmul_with(
        &self,
        w: &GpuWeight,
        x: &wgpu::Buffer,
        y: &BufView,
        n_tokens: u32,
        epilogue: Epilogue,
    ) -> Result<Bound, GpuError> {
        if epilogue == Epilogue::Bias {
            return Err(shape_err(
                "weight matmul",
                &w.name,
                w.rows,
                w.cols,
                "the bias epilogue needs its vector: bind_matmul_bias".into(),
            ));
        }
        self.bind_matmul_inner(w, x, y, n_tokens, epilogue, None, None)
    }

    /// [`GpuContext::bind_matmul_with`] with the bias add folded in: `y = W x + bias` per
    /// token (`bias`: `w.rows` f32, a stacked weight's parts' biases one after another, as
    /// `op_bias_add` adds them, the same bits). GGUF and palette weights; a `ternary2` weight
    /// is refused (its kernels have no such epilogue: the caller adds the bias as an op).
    pub fn bind_matmul_bias(
        &self,
        w: &GpuWeight,
        x: &wgpu::Buffer,
        y: &BufView,
        n_tokens: u32,
        bias: &wgpu::Buffer,
    ) -> Result<Bound, GpuError> {
        if w.format == WeightFormat::Ternary || bias.size() < (w.rows * 4) as u64 {
            return Err(shape_err(
                "weight matmul",
                &w.name,
                w.rows,
                w.cols,
                format!(
                    "a bias epilogue needs a GGUF or palette weight and {} bias bytes; given {} bytes",
                    w.rows * 4,
                    bias.size()
                ),
            ));
        }
        self.bind_matmul_inner(w, x, y, n_tokens, Epilogue::Bias, Some(bias), None)
    }

    /// One token's product of `w` with the RMSNorm of `x` folded in (x_rms.wgsl):
    /// `y = W rms_norm(x, norm.0, eps = norm.1)` stored as `epilogue` says (with its `bias`
    /// for [`Epilogue::Bias`]), the bits of `op_rms_norm` (one row) followed by the plain
    /// product. `norm.0`: `w.cols` f32. Where it does not apply (a decoder without the
    /// four-invocation body, a bundle made before the `_rms` kernels) `Ok(None)`: the caller
    /// dispatches the norm and the product.
    pub fn bind_matvec_norm(
        &self,
        w: &GpuWeight,
        x: &wgpu::Buffer,
        y: &BufView,
        epilogue: Epilogue,
        bias: Option<&wgpu::Buffer>,
        norm: (&wgpu::Buffer, f32),
    ) -> Result<Option<Bound>, GpuError> {
        let d = Decoder::of(w.format);
        if !(d.has_quads() && self.has_source(&rms_name(d, self.weight_reduction(), None))) {
            return Ok(None);
        }
        let wg_rows = matvec_split(w.rows, w.cols, true).1.min(MATVEC_ROWS);
        if w.rows.div_ceil(wg_rows as usize) > norm_fold_max_workgroups() {
            return Ok(None);
        }
        self.check_norm_weight("weight matvec with RMSNorm", w, norm.0)?;
        match (epilogue, bias) {
            (Epilogue::Bias, Some(b)) if b.size() >= (w.rows * 4) as u64 => {}
            (Epilogue::Bias, _) | (_, Some(_)) => {
                return Err(shape_err(
                    "weight matvec with RMSNorm",
                    &w.name,
                    w.rows,
                    w.cols,
                    format!(
                        "a bias vector of {} bytes goes with the bias epilogue, and only with \
                         it; given {:?} with {epilogue:?}",
                        w.rows * 4,
                        bias.map(|b| b.size())
                    ),
                ))
            }
            _ => {}
        }
        self.bind_matmul_inner(w, x, y, 1, epilogue, bias, Some(norm))
            .map(Some)
    }

    /// An RMSNorm weight folded into a product of `w` must hold `w.cols` f32.
    fn check_norm_weight(
        &self,
        op: &'static str,
        w: &GpuWeight,
        norm: &wgpu::Buffer,
    ) -> Result<(), GpuError> {
        if norm.size() < (w.cols * 4) as u64 {
            return Err(shape_err(
                op,
                &w.name,
                w.rows,
                w.cols,
                format!(
                    "an RMSNorm weight of {} bytes; {} needed",
                    norm.size(),
                    w.cols * 4
                ),
            ));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn bind_matmul_inner(
        &self,
        w: &GpuWeight,
        x: &wgpu::Buffer,
        y: &BufView,
        n_tokens: u32,
        epilogue: Epilogue,
        bias: Option<&wgpu::Buffer>,
        norm: Option<(&wgpu::Buffer, f32)>,
    ) -> Result<Bound, GpuError> {
        const OP: &str = "weight matmul";
        let n = n_tokens as u64;
        let (need_x, need_y) = (n * w.cols as u64 * 4, n * w.rows as u64 * 4);
        if n == 0 || x.size() < need_x || y.size < need_y {
            return Err(shape_err(
                OP,
                &w.name,
                w.rows,
                w.cols,
                format!(
                    "{n_tokens} tokens need x of {need_x} bytes and y of {need_y} bytes; given {} and {}",
                    x.size(),
                    y.size
                ),
            ));
        }
        let reduction = self.weight_reduction();
        if w.format == WeightFormat::Ternary && n_tokens == 1 {
            let t = w.ternary_view();
            return Ok(self
                .bind_matvec_with(&t, x, y, &self.decode_matvec_plain(w), epilogue)?
                .into());
        }
        if w.format == WeightFormat::Ternary {
            if let Some(b) = self.bind_ternary_mmq(w, x, y, n_tokens, epilogue)? {
                return Ok(b);
            }
        }
        // The kernel, its tokens a workgroup and its split (invocations per row, rows a
        // workgroup; the grid's rows come from the second).
        let (kernel, tok, split) = if self.matmul_tile_applies(w, n_tokens) {
            // The tiled prefill product: MATMUL_TILE_ROWS rows by MATMUL_TILE_TOKENS tokens a
            // workgroup, each weight unit decoded once per workgroup.
            let kernel = tile_name(Decoder::of(w.format));
            let split = (MATMUL_TILE_WORKGROUP, MATMUL_TILE_ROWS);
            (kernel, MATMUL_TILE_TOKENS, split)
        } else {
            let (op, rows_per_wg, tok) = if n_tokens == 1 {
                (WeightOp::Matvec, MATVEC_ROWS, 1)
            } else {
                (WeightOp::Matmul, MATMUL_ROWS, MATMUL_TOKENS)
            };
            let mut kernel = name_of(Decoder::of(w.format), op, reduction);
            let mut rows_cap = rows_per_wg;
            let mut wide = false;
            if norm.is_some() {
                // bind_matvec_norm checked the kernel is among the sources.
                kernel = rms_name(Decoder::of(w.format), reduction, None);
            } else if op == WeightOp::Matvec
                && w.format == WeightFormat::Gguf(GgmlType::Q8_0)
                && w.rows >= WIDE_MATVEC_MIN_ROWS
                && self.has_source(&wide_matvec_name(reduction))
            {
                // A head: more rows a workgroup (a bundle made before has only `_r2_`).
                kernel = wide_matvec_name(reduction);
                rows_cap = WIDE_MATVEC_ROWS;
                wide = true;
            }
            if op == WeightOp::Matvec && !self.has_source(&kernel) {
                // A bundle made before the body took MATVEC_ROWS rows carries it as `_r4_`.
                let legacy = kernel.replace(
                    &format!("_matvec_r{MATVEC_ROWS}_"),
                    &format!("_matvec_r{LEGACY_MATVEC_ROWS}_"),
                );
                if self.has_source(&legacy) {
                    kernel = legacy;
                    rows_cap = LEGACY_MATVEC_ROWS;
                }
            }
            // The workgroup reduction keeps every accumulator of every invocation.
            if reduction == Reduction::Workgroup {
                let shared = 4 * (rows_cap * tok * WORKGROUP) as u64;
                let limit = self.limits.max_compute_workgroup_storage_size as u64;
                if shared > limit {
                    return Err(GpuError::Limit {
                        op: OP,
                        what: "workgroup memory (bytes)",
                        needed: shared,
                        limit,
                    });
                }
            }
            // The single-token bodies read their split from the parameters; a bundle's
            // kernels from before it take ROWS rows a workgroup with every invocation on each.
            let body = match self.source(&kernel) {
                Ok(s)
                    if op == WeightOp::Matvec
                        && (s.contains(QUADS_MARK) || s.contains(Q8_0_BODY_MARK)) =>
                {
                    Some(true)
                }
                Ok(s) if op == WeightOp::Matvec && s.contains("params.wg_rows") => Some(false),
                _ => None,
            };
            let split = if let Some(quads) = body {
                // The wide kernel's split starts from its 8 rows; the others' from
                // MATVEC_ROWS, capped by what the kernel holds (a legacy `_r4_` one too).
                let start = if wide { WIDE_MATVEC_ROWS } else { MATVEC_ROWS };
                let (lanes, wg_rows) = matvec_split_max(w.rows, w.cols, quads, start);
                (lanes, wg_rows.min(rows_cap))
            } else {
                (WORKGROUP, rows_cap)
            };
            (kernel, tok, split)
        };
        let gz = n_tokens.div_ceil(tok);
        if gz > MAX_WORKGROUPS_PER_DIM {
            return Err(GpuError::Limit {
                op: OP,
                what: "tokens",
                needed: n,
                limit: MAX_WORKGROUPS_PER_DIM as u64 * tok as u64,
            });
        }
        let pipeline = self.pipeline_named(&kernel, None)?;
        let layout = pipeline.get_bind_group_layout(0);
        // The bias binding of store.wgsl, which a bundle's kernels from before the bias
        // epilogue lack: those take no bias (the caller adds it as an op).
        let bias_slot = self.has_bias_slot(&kernel);
        let data4_slot = self.has_data4_slot(&kernel);
        if bias.is_some() && !bias_slot {
            return Err(shape_err(
                OP,
                &w.name,
                w.rows,
                w.cols,
                format!("{kernel} has no bias epilogue (a bundle's kernels from before it)"),
            ));
        }
        let norm_eps = norm.map_or(0.0, |n| n.1);
        let mut parts = Vec::with_capacity(w.chunks.len());
        for c in &w.chunks {
            let groups = c.rows.div_ceil(split.1 as usize) as u64;
            let (gx, gy) = grid_or_limit(OP, groups)?;
            let params = self.weight_params(w, c, gx, n_tokens, epilogue, split, norm_eps);
            let slots = Slots {
                bias: bias_slot.then(|| bias.unwrap_or(&self.placeholder)),
                norm: norm.map(|n| n.0),
                data4: data4_slot,
                ..Slots::default()
            };
            let bg = self.weight_bind_group_with(&layout, w, c, x, y, &params, slots);
            parts.push((bg, [gx, gy, gz]));
        }
        Ok(Bound {
            pre_kernel: None,
            pipeline,
            parts,
            pre: None,
            label: format!("{kernel} {}", w.name),
        })
    }

    /// Whether a product of `w` over `n_tokens` tokens takes the tiled kernel
    /// (`matmul_tile.wgsl`, error bound [`matmul_tile_tolerance`]): a weight other than an
    /// int8 `ternary2` one, at least [`MATMUL_TILE_MIN_TOKENS`] tokens, the kernel among the
    /// sources and the adapter's workgroup memory and invocations enough for it. On an H200
    /// it took the shape copies' prompts 3.4-4.4x past `matmul.wgsl` (BENCHMARKS.md).
    pub fn matmul_tile_applies(&self, w: &GpuWeight, n_tokens: u32) -> bool {
        !(w.format == WeightFormat::Ternary && self.decodes_int8(w.cols))
            && n_tokens >= MATMUL_TILE_MIN_TOKENS
            && self.has_source(&tile_name(Decoder::of(w.format)))
            && tile_shared_bytes() <= self.limits.max_compute_workgroup_storage_size as u64
            && MATMUL_TILE_WORKGROUP <= self.limits.max_compute_invocations_per_workgroup
    }

    /// The int8 prefill product of a `ternary2` weight over `n_tokens > 1` tokens: x quantized
    /// once by [`Q8_QUANTIZE`] into this context's scratch for the chunk's shape, then
    /// [`mmq_name`] (64 tokens per workgroup from 64 tokens on, else 16), each weight block
    /// read once per workgroup's tokens. `None` where it does not apply, and the f32 product
    /// serves: one token, the context's ternary decode products are not int8
    /// ([`GpuContext::decodes_int8`]: `--kernel f32`, no subgroups, K past the int8 kernels),
    /// the sources lack either kernel (a bundle made before them), or the adapter's workgroup
    /// memory is too small.
    fn bind_ternary_mmq(
        &self,
        w: &GpuWeight,
        x: &wgpu::Buffer,
        y: &BufView,
        n_tokens: u32,
        epilogue: Epilogue,
    ) -> Result<Option<Bound>, GpuError> {
        const OP: &str = "ternary prefill product";
        if n_tokens < 2 || !self.decodes_int8(w.cols) {
            return Ok(None);
        }
        // 64 tokens per workgroup from 64 tokens on, else 16; the 16-token kernel also where
        // the adapter's workgroup memory or the sources do not take the 64-token one.
        let fits = |tt: u32| {
            self.has_source(&mmq_name(tt))
                && mmq_shared_bytes(tt) <= self.limits.max_compute_workgroup_storage_size as u64
        };
        let Some(tt) = [4, 1]
            .into_iter()
            .filter(|&tt| tt == 1 || n_tokens >= 64)
            .find(|&tt| fits(tt))
        else {
            return Ok(None);
        };
        if !self.has_source(Q8_QUANTIZE) {
            return Ok(None);
        }
        let name = mmq_name(tt);
        let gz = n_tokens.div_ceil(tt * MMQ_WT);
        if n_tokens > MAX_WORKGROUPS_PER_DIM {
            return Err(GpuError::Limit {
                op: OP,
                what: "tokens",
                needed: n_tokens as u64,
                limit: MAX_WORKGROUPS_PER_DIM as u64,
            });
        }
        let (xq, xs) = self.q8_scratch(n_tokens, w.cols);
        let qpipe = self.pipeline_named(Q8_QUANTIZE, None)?;
        let qparams = self.uniform(
            "q8 quantize params",
            bytemuck::cast_slice(&[w.cols as u32, n_tokens, 0, 0]),
        );
        let qbg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(Q8_QUANTIZE),
            layout: &qpipe.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: x.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: xq.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: xs.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 3,
                    resource: qparams.as_entire_binding(),
                },
            ],
        });
        let quantize = Bound {
            pre_kernel: None,
            pipeline: qpipe,
            parts: vec![(qbg, [(w.cols as u32 / 16).div_ceil(64), n_tokens, 1])],
            pre: None,
            label: format!("{Q8_QUANTIZE} {}", w.name),
        };
        let pipeline = self.pipeline_named(&name, None)?;
        let layout = pipeline.get_bind_group_layout(0);
        let bias_slot = self.has_bias_slot(&name);
        let rows_per_wg = (MMQ_TR * MMQ_WR) as usize;
        let mut parts = Vec::with_capacity(w.chunks.len());
        for c in &w.chunks {
            let groups = c.rows.div_ceil(rows_per_wg) as u64;
            let (gx, gy) = grid_or_limit(OP, groups)?;
            let params =
                self.weight_params(w, c, gx, n_tokens, epilogue, (WORKGROUP, MATVEC_ROWS), 0.0);
            let mut entries = vec![
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: c.data.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: c.aux.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: xq.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 3,
                    resource: y.binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 4,
                    resource: params.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 5,
                    resource: xs.as_entire_binding(),
                },
            ];
            // store.wgsl's bias (a placeholder: no bias epilogue for ternary weights), where
            // the kernel has the binding.
            if bias_slot {
                entries.push(wgpu::BindGroupEntry {
                    binding: 6,
                    resource: self.placeholder.as_entire_binding(),
                });
            }
            let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&w.name),
                layout: &layout,
                entries: &entries,
            });
            parts.push((bg, [gx, gy, gz]));
        }
        Ok(Some(Bound {
            pre_kernel: None,
            pipeline,
            parts,
            pre: Some(Box::new(quantize)),
            label: format!("{name} {}", w.name),
        }))
    }

    /// One token's product with ops folded in ([`Fuse`]), where this weight and adapter have
    /// such a kernel: a `ternary2` weight, the subgroup-rows decode kernel with x staged
    /// (the default where subgroups exist and are not forced off), the fused variant among
    /// the context's sources (a bundle made before it lacks it), and for SwiGLU a stacked
    /// gate/up weight of two equal parts in one row chunk. `norm` is the RMSNorm's weight
    /// (`w.cols` f32) and epsilon when `fuse.rms_norm`. `Ok(None)`: no such kernel here (the
    /// caller dispatches the ops on their own).
    pub fn bind_matvec_fused(
        &self,
        w: &GpuWeight,
        x: &wgpu::Buffer,
        y: &BufView,
        fuse: Fuse,
        norm: Option<(&wgpu::Buffer, f32)>,
    ) -> Result<Option<Bound>, GpuError> {
        if w.format != WeightFormat::Ternary {
            // GGUF weights of matvec_quads.wgsl (matvec_q8_0.wgsl for Q8_0): the gating, the
            // norm or both.
            return match (fuse.swiglu, fuse.rms_norm, norm) {
                (true, false, None) => self.bind_gguf_glu(w, x, y, None),
                (true, true, Some(n)) => self.bind_gguf_glu_norm(w, x, y, None, Some(n)),
                (false, true, Some(n)) => self.bind_matvec_norm(w, x, y, Epilogue::Store, None, n),
                _ => Ok(None),
            };
        }
        if norm.is_some() != fuse.rms_norm || (fuse.swiglu && !w.is_gate_up_stack()) {
            return Ok(None);
        }
        let Some(cfg) = self.decode_config(w.rows, w.cols, fuse) else {
            return Ok(None);
        };
        let t = w.ternary_view();
        Ok(Some(
            self.bind_ternary_fused(&t, x, y, &cfg, Epilogue::Store, norm)?
                .into(),
        ))
    }

    /// One token's product of a stacked gate/up weight (two equal parts, one row chunk) of a
    /// decoder with the four-invocation body (matvec_quads.wgsl; Q8_0's matvec_q8_0.wgsl) with its gating folded in:
    /// SwiGLU (`gelu_table` None; rows_swiglu.wgsl), `y[r] = silu(gate_r . x) * (up_r . x)`,
    /// or GELU-tanh gating with `gelu_table` (rows_geglu.wgsl; the CPU backend's
    /// [`crate::runtime::cpu::gelu_table`], two f16 to a u32, as op_geglu binds it), for the
    /// F = rows / 2 output rows, one workgroup each: the bits of the plain product followed by
    /// op_swiglu or op_geglu. Where it does not apply (another encoding, not such a stack, a
    /// bundle made before the kernel) `Ok(None)`: the caller dispatches the product and the
    /// op.
    pub fn bind_gguf_glu(
        &self,
        w: &GpuWeight,
        x: &wgpu::Buffer,
        y: &BufView,
        gelu_table: Option<&wgpu::Buffer>,
    ) -> Result<Option<Bound>, GpuError> {
        self.bind_gguf_glu_norm(w, x, y, gelu_table, None)
    }

    /// [`GpuContext::bind_gguf_glu`] with, for SwiGLU (`gelu_table` None), the RMSNorm of x
    /// folded in where `norm` is given (weight `w.cols` f32, eps; x_rms.wgsl): the bits of
    /// `op_rms_norm` followed by the SwiGLU product. `Ok(None)` where that does not apply
    /// (also GELU gating with a norm: no such kernel).
    pub fn bind_gguf_glu_norm(
        &self,
        w: &GpuWeight,
        x: &wgpu::Buffer,
        y: &BufView,
        gelu_table: Option<&wgpu::Buffer>,
        norm: Option<(&wgpu::Buffer, f32)>,
    ) -> Result<Option<Bound>, GpuError> {
        const OP: &str = "weight matvec with gating";
        let d = Decoder::of(w.format);
        let glu = match gelu_table {
            None => Glu::Swiglu,
            Some(_) => Glu::Geglu,
        };
        let kernel = match norm {
            None => glu_name(d, self.weight_reduction(), glu),
            Some(_) if glu == Glu::Swiglu => rms_name(d, self.weight_reduction(), Some(glu)),
            Some(_) => return Ok(None),
        };
        if !(d.has_quads() && w.is_gate_up_stack() && self.has_source(&kernel)) {
            return Ok(None);
        }
        if let Some((n, _)) = norm {
            // One workgroup an output row.
            if w.parts[0] > norm_fold_max_workgroups() {
                return Ok(None);
            }
            self.check_norm_weight(OP, w, n)?;
        }
        let norm_eps = norm.map_or(0.0, |n| n.1);
        let f = w.parts[0];
        if x.size() < (w.cols * 4) as u64 || y.size < (f * 4) as u64 {
            return Err(shape_err(
                OP,
                &w.name,
                w.rows,
                w.cols,
                format!(
                    "x of {} bytes and y of {} bytes; {} and {} needed",
                    x.size(),
                    y.size,
                    w.cols * 4,
                    f * 4
                ),
            ));
        }
        if let Some(t) = gelu_table {
            // The CPU backend's table: an f16 for each of the 65,536 f16 values.
            let need = std::mem::size_of_val(crate::runtime::cpu::gelu_table()) as u64;
            if t.size() < need {
                return Err(shape_err(
                    OP,
                    &w.name,
                    w.rows,
                    w.cols,
                    format!("a GELU table of {} bytes; {need} needed", t.size()),
                ));
            }
        }
        let pipeline = self.pipeline_named(&kernel, None)?;
        let layout = pipeline.get_bind_group_layout(0);
        let c = &w.chunks[0];
        let (gx, gy) = grid_or_limit(OP, f as u64)?;
        // Two accumulator rows a workgroup (a gate row and its up row), every invocation on
        // each, as matvec_split gives the plain product of 2F rows from 2048 rows on.
        let params = self.weight_params(w, c, gx, 1, Epilogue::Store, (WORKGROUP, 2), norm_eps);
        let slot = self.has_bias_slot(&kernel).then_some(&self.placeholder);
        let slots = Slots {
            bias: slot,
            table: gelu_table,
            norm: norm.map(|n| n.0),
            data4: self.has_data4_slot(&kernel),
        };
        let bg = self.weight_bind_group_with(&layout, w, c, x, y, &params, slots);
        Ok(Some(Bound {
            pre_kernel: None,
            pipeline,
            parts: vec![(bg, [gx, gy, 1])],
            pre: None,
            label: format!("{kernel} {}", w.name),
        }))
    }

    /// One token's gate/up product with SwiGLU (and with `norm` the RMSNorm, in its quantize
    /// dispatch, or at the end of the product with `LOWBIT_GPU_RMS_LATE=1`) writing the down
    /// product's x per 16-element group (`_y16`), and the down product reading it (`_x16`)
    /// into `out` as `epilogue` says: the down product's quantize dispatch goes
    /// ([`super::Q16_LAYOUT`]). Where both weights are `ternary2`, gate/up stacked in one
    /// chunk, the decode configurations are [`super::MatvecKernel::Q8Pre`] products (gate/up
    /// on subgroup rows) whose `_y16` / `_x16` variants the kernels have (a bundle made before
    /// them lacks them), and `LOWBIT_GPU_Q16` is not `0` (a measuring knob); `Ok(None)`
    /// otherwise.
    pub fn bind_glu_down_q16(
        &self,
        gate_up: &GpuWeight,
        down: &GpuWeight,
        x: &wgpu::Buffer,
        norm: Option<(&wgpu::Buffer, f32)>,
        out: &BufView,
        epilogue: Epilogue,
    ) -> Result<Option<(Bound, Bound)>, GpuError> {
        if std::env::var("LOWBIT_GPU_Q16").is_ok_and(|v| v == "0")
            || gate_up.format != WeightFormat::Ternary
            || down.format != WeightFormat::Ternary
            || !gate_up.is_gate_up_stack()
            || down.cols != gate_up.rows / 2
            || !down.cols.is_multiple_of(256)
        {
            return Ok(None);
        }
        let fuse = super::Fuse {
            rms_norm: norm.is_some(),
            swiglu: true,
        };
        let (Some(gu), Some(dn)) = (
            self.decode_config(gate_up.rows, gate_up.cols, fuse),
            self.decode_config(down.rows, down.cols, super::Fuse::default()),
        ) else {
            return Ok(None);
        };
        let (gu, dn) = (gu.with_q16(false, true), dn.with_q16(true, false));
        // Both int8 products with x quantized before them (not a bundle's older kernels).
        if gu.q16() != (false, true)
            || dn.q16() != (true, false)
            || !self.config_usable(&gu)
            || !self.config_usable(&dn)
        {
            return Ok(None);
        }
        let q16 = self.q16_vec_scratch(down.cols);
        let a = self.bind_ternary_fused(
            &gate_up.ternary_view(),
            x,
            &BufView::whole(&q16),
            &gu,
            Epilogue::Store,
            norm,
        )?;
        let b = self.bind_ternary_fused(&down.ternary_view(), &q16, out, &dn, epilogue, None)?;
        Ok(Some((a.into(), b.into())))
    }

    /// The decode configuration of `w`'s product without ops folded in.
    fn decode_matvec_plain(&self, w: &GpuWeight) -> MatvecConfig {
        self.decode_config(w.rows, w.cols, Fuse::default())
            .unwrap_or_else(|| self.default_matvec_config())
    }

    /// `out[t * w.cols + k] = W[ids[t], k]` for `t < n_tokens` (the embedding gather; `ids`
    /// a u32 storage buffer of at least `n_tokens` ids, read on the device only; `out` f32 of
    /// at least `n_tokens * cols`). An id `>= w.rows` reads row `w.rows - 1` (the host checks
    /// ids before writing them; the clamp keeps every read in bounds). The values are the
    /// CPU dequantizer's, bit for bit.
    pub fn bind_gather(
        &self,
        w: &GpuWeight,
        ids: &wgpu::Buffer,
        out: &wgpu::Buffer,
        n_tokens: u32,
    ) -> Result<Bound, GpuError> {
        const OP: &str = "weight gather";
        let n = n_tokens as u64;
        let (need_ids, need_out) = (n * 4, n * w.cols as u64 * 4);
        if n == 0 || ids.size() < need_ids || out.size() < need_out {
            return Err(shape_err(
                OP,
                &w.name,
                w.rows,
                w.cols,
                format!(
                    "{n_tokens} tokens need ids of {need_ids} bytes and out of {need_out} bytes; given {} and {}",
                    ids.size(),
                    out.size()
                ),
            ));
        }
        let invocations = n * (w.cols / UNIT) as u64;
        if invocations > u32::MAX as u64 {
            return Err(GpuError::Limit {
                op: OP,
                what: "tokens times units of 32 elements",
                needed: invocations,
                limit: u32::MAX as u64,
            });
        }
        let groups = invocations.div_ceil(GATHER_WORKGROUP as u64);
        let (gx, gy) = grid_or_limit(OP, groups)?;
        let kernel = name_of(
            Decoder::of(w.format),
            WeightOp::Gather,
            Reduction::Workgroup,
        );
        let pipeline = self.pipeline_named(&kernel, None)?;
        let layout = pipeline.get_bind_group_layout(0);
        let parts = w
            .chunks
            .iter()
            .map(|c| {
                let params = self.weight_params(
                    w,
                    c,
                    gx,
                    n_tokens,
                    Epilogue::Store,
                    (WORKGROUP, MATVEC_ROWS),
                    0.0,
                );
                (
                    self.weight_bind_group(&layout, w, c, ids, out, &params, None),
                    [gx, gy, 1],
                )
            })
            .collect();
        Ok(Bound {
            pre_kernel: None,
            pipeline,
            parts,
            pre: None,
            label: format!("{kernel} {}", w.name),
        })
    }

    /// Runs `bound` in one submission and reads back the first `n` f32 of `out`.
    fn run_bound(&self, bound: &Bound, out: &wgpu::Buffer, n: usize) -> Result<Vec<f32>, GpuError> {
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("weights"),
                timestamp_writes: None,
            });
            bound.encode(&mut pass);
        }
        self.queue.submit([enc.finish()]);
        let bytes = self.read_buffer(out, (n * 4) as u64)?;
        Ok(bytemuck::cast_slice::<u8, f32>(&bytes).to_vec())
    }

    /// Whether product kernel `name` (among this context's sources) reads store.wgsl's bias
    /// binding (kernels from before the bias epilogue have none): by naga's analysis
    /// ([`GpuContext::used_bindings`]), not by the declaration's text.
    fn has_bias_slot(&self, name: &str) -> bool {
        self.used_bindings(name).contains(&6)
    }

    /// Whether kernel `name` reads its chunk's bytes as 16-byte words too ([`DATA4_BINDING`];
    /// [`GpuContext::used_bindings`]).
    fn has_data4_slot(&self, name: &str) -> bool {
        self.used_bindings(name).contains(&DATA4_BINDING)
    }

    /// [`GpuContext::bind_matmul`] once, from host vectors (`x`: `n_tokens * cols` f32),
    /// read back (`n_tokens * rows` f32). For tests and tools; the backend binds once.
    pub fn run_matmul(
        &self,
        w: &GpuWeight,
        x: &[f32],
        n_tokens: u32,
    ) -> Result<Vec<f32>, GpuError> {
        if x.len() != n_tokens as usize * w.cols {
            return Err(shape_err(
                "weight matmul",
                &w.name,
                w.rows,
                w.cols,
                format!("x has {} values for {n_tokens} tokens", x.len()),
            ));
        }
        let xb = self.upload_bytes("x", bytemuck::cast_slice(x))?;
        let n = n_tokens as usize * w.rows;
        let yb = self.vector_buffer("y", n);
        let bound = self.bind_matmul(w, &xb, &yb, n_tokens)?;
        self.run_bound(&bound, &yb, n)
    }

    /// [`GpuContext::bind_gather`] once for `ids`, read back (`ids.len() * cols` f32).
    pub fn run_gather(&self, w: &GpuWeight, ids: &[u32]) -> Result<Vec<f32>, GpuError> {
        let idb = self.upload_bytes("ids", bytemuck::cast_slice(ids))?;
        let n = ids.len() * w.cols;
        let out = self.vector_buffer("gather out", n);
        let bound = self.bind_gather(w, &idb, &out, ids.len() as u32)?;
        self.run_bound(&bound, &out, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Q8_0 planes: block i's 32 codes at 32 i, its d at rows * cols + 2 i; Q6_K: block g's
    /// ql at 128 g, qh at 128 nb + 64 g, scales at 192 nb + 16 g, d at 208 nb + 2 g. Every
    /// byte is a distinct value (mod 251 of its source position), so a misplaced field shows.
    #[test]
    fn planes_put_every_field_where_the_decoders_read_it() {
        let mark = |n: usize| -> Vec<u8> { (0..n).map(|i| (i % 251) as u8).collect() };
        let (rows, cols) = (3, 96);
        let blocks = mark(rows * cols / 32 * 34);
        let p = q8_0_planes(&blocks, rows, cols);
        assert_eq!(p.len(), blocks.len());
        for i in 0..rows * cols / 32 {
            let b = &blocks[34 * i..34 * (i + 1)];
            assert_eq!(&p[32 * i..32 * (i + 1)], &b[2..], "Q8_0 block {i} codes");
            let d = rows * cols + 2 * i;
            assert_eq!(&p[d..d + 2], &b[..2], "Q8_0 block {i} d");
        }
        let (rows, cols) = (3, 512);
        let nb = rows * cols / 256;
        let blocks = mark(nb * 210);
        let p = q6_k_planes(&blocks, rows, cols);
        assert_eq!(p.len(), blocks.len());
        for g in 0..nb {
            let b = &blocks[210 * g..210 * (g + 1)];
            assert_eq!(&p[128 * g..128 * (g + 1)], &b[..128], "Q6_K block {g} ql");
            let qh = 128 * nb + 64 * g;
            assert_eq!(&p[qh..qh + 64], &b[128..192], "Q6_K block {g} qh");
            let sc = 192 * nb + 16 * g;
            assert_eq!(&p[sc..sc + 16], &b[192..208], "Q6_K block {g} scales");
            let d = 208 * nb + 2 * g;
            assert_eq!(&p[d..d + 2], &b[208..], "Q6_K block {g} d");
        }
    }

    /// The upload's layout follows [`planes_mark`]: every kernel of this build for Q8_0 and
    /// Q6_K has it, the block-reading sources of a bundle made before (`block_sources`) do
    /// not, and no other type has a mark.
    #[test]
    fn the_planes_mark_tells_the_two_layouts_apart() {
        let types = [GgmlType::Q8_0, GgmlType::Q6_K];
        for ty in types {
            let mark = planes_mark(ty).expect("a mark");
            let prefix = kernel_prefix(Decoder::Gguf(ty));
            let now: Vec<KernelSource> = sources()
                .into_iter()
                .filter(|k| k.name.starts_with(&prefix))
                .collect();
            assert!(now.len() >= 6, "{ty}: {} kernels", now.len());
            for k in &now {
                assert!(k.wgsl.contains(mark), "{}: no {mark}", k.name);
            }
            let before: Vec<KernelSource> = block_sources()
                .into_iter()
                .filter(|k| k.name.starts_with(&prefix))
                .collect();
            // All but the two wide Q8_0 kernels, made since.
            let since = if ty == GgmlType::Q8_0 { 2 } else { 0 };
            assert_eq!(before.len() + since, now.len(), "{ty}");
            for k in &before {
                assert!(
                    !k.wgsl.contains(mark),
                    "{}: {mark} in a block source",
                    k.name
                );
            }
        }
        for ty in GGUF_TYPES.into_iter().filter(|t| !types.contains(t)) {
            assert!(planes_mark(ty).is_none(), "{ty}");
        }
    }

    /// The upload's table layout follows [`PALETTE_F32_MARK`]: every palette kernel of this
    /// build has it, the f16-reading sources of a bundle made before
    /// ([`palette_f16_sources`], one for each) do not, and no other kernel has it.
    #[test]
    fn the_palette_mark_tells_the_two_table_layouts_apart() {
        let (now, others): (Vec<KernelSource>, Vec<KernelSource>) = sources()
            .into_iter()
            .partition(|k| k.name.starts_with("weights_palette_"));
        assert!(now.len() >= 8 * 6, "{} palette kernels", now.len());
        for k in &now {
            assert!(k.wgsl.contains(PALETTE_F32_MARK), "{}", k.name);
        }
        for k in &others {
            assert!(!k.wgsl.contains(PALETTE_F32_MARK), "{}", k.name);
        }
        let before = palette_f16_sources();
        assert_eq!(
            before.iter().map(|k| &k.name).collect::<Vec<_>>(),
            now.iter().map(|k| &k.name).collect::<Vec<_>>()
        );
        for k in &before {
            assert!(!k.wgsl.contains(PALETTE_F32_MARK), "{}", k.name);
            // The f16 lookup of unit_palette_f16.wgsl.
            assert!(k.wgsl.contains("fn entry(g: u32, ix: u32)"), "{}", k.name);
        }
    }

    #[test]
    fn every_module_is_complete_and_named_by_its_parameters() {
        let all = sources();
        // 24 decoders x (2 reductions x 2 products + 1 gather + 1 tiled product), less
        // ternary2's 2 matvecs, plus the SwiGLU and the GELU-gating matvecs of the 16 decoders
        // of matvec_quads.wgsl (8 GGUF types, Q8_0 with matvec_q8_0.wgsl, and the 8 palette
        // widths) with either reduction, plus their
        // `_rms` forms (below), plus Q8_0's wide kernel with either reduction, plus
        // the int8 prefill path: the activation
        // quantizer and one ternary mmq per tokens-per-invocation shape.
        let int8: Vec<String> = std::iter::once(Q8_QUANTIZE.to_string())
            .chain(MMQ_TOKENS_PER_INVOCATION.iter().map(|&t| mmq_name(t)))
            .collect();
        assert_eq!(int8.len(), 3);
        // matvec_quads.wgsl, or for Q8_0 matvec_q8_0.wgsl (which reads binding 9), never
        // both.
        let quads_body = |k: &KernelSource| {
            let q8 = k
                .name
                .starts_with(&kernel_prefix(Decoder::Gguf(GgmlType::Q8_0)));
            k.wgsl.contains(QUADS_MARK) != q8
                && k.wgsl.contains(Q8_0_BODY_MARK) == q8
                && k.wgsl
                    .contains("@group(0) @binding(9) var<storage, read> data4")
                    == q8
        };
        let swiglu: Vec<&KernelSource> =
            all.iter().filter(|k| k.name.ends_with("_swiglu")).collect();
        assert_eq!(swiglu.len(), 16 * 2);
        for k in &swiglu {
            // The quads body (Q8_0's own) with rows_swiglu.wgsl's rows and store, not
            // rows.wgsl's.
            assert!(
                quads_body(k) && k.wgsl.contains("(g / (1.0 + exp(-g))) * u"),
                "{}",
                k.name
            );
            assert!(!k.wgsl.contains("if lid < NACC {"), "{}", k.name);
        }
        let geglu: Vec<&KernelSource> = all.iter().filter(|k| k.name.ends_with("_geglu")).collect();
        assert_eq!(geglu.len(), 16 * 2);
        for k in &geglu {
            // The quads body with rows_geglu.wgsl's store, its table and the f16 rounding of
            // ops/common.wgsl, once each.
            assert!(
                quads_body(k)
                    && k.wgsl.contains("@binding(7) var<storage, read> gelu_table")
                    && k.wgsl.matches("fn f32_to_f16_bits(").count() == 1
                    && k.wgsl.matches("fn f16_bits_to_f32(").count() == 1,
                "{}",
                k.name
            );
            assert!(!k.wgsl.contains("if lid < NACC {"), "{}", k.name);
        }
        // The `_rms` kernels: the plain and the SwiGLU body with x_rms.wgsl, each once.
        let rms: Vec<&KernelSource> = all.iter().filter(|k| k.name.ends_with("_rms")).collect();
        assert_eq!(rms.len(), 16 * 2 * 2);
        for k in &rms {
            assert!(
                quads_body(k)
                    && k.wgsl.contains("@binding(8) var<storage, read> norm_w")
                    && k.wgsl.matches("fn x_at(").count() == 1
                    && k.wgsl.contains("const WG: u32 = 64u;"),
                "{}",
                k.name
            );
            assert_eq!(
                k.name.contains("_swiglu_"),
                k.wgsl.contains("(g / (1.0 + exp(-g))) * u")
            );
        }
        // Q8_0's single-token kernel of 8 rows a workgroup for the heads, either reduction.
        for reduction in [Reduction::Subgroup, Reduction::Workgroup] {
            let wide = all
                .iter()
                .find(|k| k.name == wide_matvec_name(reduction))
                .expect("the wide Q8_0 kernel");
            assert!(wide.name.contains("_matvec_r8_"));
            assert!(quads_body(wide) && wide.wgsl.contains("const ROWS: u32 = 8u;"));
            assert!(wide.wgsl.contains("acc7") && !wide.wgsl.contains("acc8"));
        }
        assert_eq!(all.len(), 24 * 6 - 2 + 32 + 32 + 64 + 2 + int8.len());
        assert_eq!(
            all.iter()
                .filter(|k| k.name.contains("_mmt_r64_t64_wg256"))
                .count(),
            24
        );
        // The tiled body expanded (no template line left), 4 x 4 sums an invocation.
        let tile = all
            .iter()
            .find(|k| k.name == "weights_q4_k_mmt_r64_t64_wg256")
            .expect("the Q4_K tiled product");
        assert!(!tile.wgsl.lines().any(|l| l.trim().starts_with("//@")));
        assert!(tile.wgsl.contains("var acc3_3 = 0.0;") && !tile.wgsl.contains("acc4_"));
        assert!(tile
            .wgsl
            .contains("var<workgroup> ws: array<vec4<f32>, 8u * TM>;"));
        assert_eq!(tile_shared_bytes(), 16 * 1024);
        let mut names = std::collections::HashSet::new();
        for k in &all {
            assert!(names.insert(k.name.clone()), "duplicate kernel {}", k.name);
            assert!(k.wgsl.contains("fn main"), "{}", k.name);
            assert!(k.wgsl.starts_with(&format!("// {}:", k.name)), "{}", k.name);
            if int8.contains(&k.name) {
                assert!(k.wgsl.contains("dot4I8Packed"), "{}", k.name);
            } else {
                assert!(k.wgsl.contains("fn unit"), "{}", k.name);
            }
        }
        for n in &int8 {
            assert!(names.contains(n), "{n} is not among the sources");
        }
        assert_eq!(
            kernel_name(
                WeightFormat::Gguf(GgmlType::Q4_K),
                WeightOp::Matvec,
                Reduction::Subgroup
            ),
            "weights_q4_k_matvec_r2_wg64_sg"
        );
        assert_eq!(
            kernel_name(
                WeightFormat::Palette {
                    bits: 3,
                    group_size: 8,
                    row_bytes: 12,
                    entry_bytes: 4
                },
                WeightOp::Matmul,
                Reduction::Workgroup
            ),
            "weights_palette_b3_matmul_r4_t8_wg64_wg"
        );
        assert_eq!(
            kernel_name(WeightFormat::Ternary, WeightOp::Matvec, Reduction::Subgroup),
            "ternary_matvec_r8_wg128_sgrows2_p2_xs4096"
        );
        let names: std::collections::HashSet<_> = all.iter().map(|k| k.name.clone()).collect();
        assert_eq!(names.len(), all.len());
    }

    #[test]
    fn tolerance_grows_with_k_and_the_sum() {
        // D = 7 + ceil(4096 / 512) + 64 = 79: (D + 1) u.
        let t = matmul_tolerance(4096, 1.0);
        assert!(t > 79.0 * 5.9e-8 && t < 81.0 * 6.0e-8, "{t}");
        assert!(matmul_tolerance(576, 2.0) > matmul_tolerance(576, 1.0));
    }

    #[test]
    fn the_single_token_split_fills_small_weights() {
        // Qwen2.5-0.5B (K = 896, 28 units): Q/O, stacked Q/K/V, stacked gate/up, the head;
        // its down (K = 4864); SmolLM2 (K = 576, 18 units); the 8B's down.
        assert_eq!(matvec_split(896, 896, false), (32, 2));
        assert_eq!(matvec_split(1152, 896, false), (32, 2));
        assert_eq!(matvec_split(9728, 896, false), (32, 2));
        assert_eq!(matvec_split(151_936, 896, false), (32, 2));
        assert_eq!(matvec_split(896, 4864, false), (64, 1));
        assert_eq!(matvec_split(576, 576, false), (32, 2));
        assert_eq!(matvec_split(4096, 16_384, false), (64, 2));
        assert_eq!(matvec_split(13, 96, false), (32, 2));
        // The quads body: every invocation on each row, rows halved down to 1 while the grid
        // has fewer than MATVEC_MIN_WORKGROUPS workgroups.
        assert_eq!(matvec_split(896, 896, true), (64, 1));
        assert_eq!(matvec_split(1536, 576, true), (64, 1));
        assert_eq!(matvec_split(9728, 896, true), (64, 2));
        assert_eq!(matvec_split(151_936, 896, true), (64, 2));
        for rows in [1, 7, 100, 2047, 2048, 100_000] {
            let (lanes, wg_rows) = matvec_split(rows, 896, true);
            assert_eq!(lanes, WORKGROUP);
            assert!(wg_rows.is_power_of_two() && wg_rows <= MATVEC_ROWS);
            assert_eq!(
                wg_rows == MATVEC_ROWS,
                rows.div_ceil(2) >= MATVEC_MIN_WORKGROUPS
            );
        }
        for cols in (32..=2048).step_by(32) {
            for rows in [1, 7, 100, 1000, 5000, 100_000] {
                let (lanes, wg_rows) = matvec_split(rows, cols, false);
                assert!(lanes.is_power_of_two() && wg_rows.is_power_of_two());
                assert!((WORKGROUP / MATVEC_ROWS..=WORKGROUP).contains(&lanes));
                // Every group of lanes has a row; no workgroup has more than the kernel's ROWS.
                assert!(wg_rows >= WORKGROUP / lanes && wg_rows <= MATVEC_ROWS);
                // No row's units are left to a second pass while lanes idle.
                assert!(lanes as usize >= (cols / 32).min(WORKGROUP as usize));
            }
        }
    }
}
