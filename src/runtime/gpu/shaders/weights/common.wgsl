// Shared by every weight kernel (src/runtime/gpu/weights.rs): the parameters, the weight's
// bytes, and the helpers that read them. A module is this file, one decoder (unit_*.wgsl,
// which defines `unit`), one body (matvec.wgsl, matmul.wgsl or gather.wgsl) and, for the
// products, one reduction; the host prepends the compile-time constants the module's name
// carries:
//   const ROWS: u32   rows per workgroup (products)
//   const TOK: u32    tokens per workgroup (products; 1 for the matvec)
//   const WG: u32     invocations per workgroup (a power of two)
//   const BITS: u32   index width (palette decoders only)
//
// Byte addressing. `data` holds one row chunk of the weight as the bundle stores it (GGML
// blocks, packed ternary codes or palette indices; Q8_0 and Q6_K blocks regrouped into planes,
// unit_q8_0.wgsl and unit_q6_k.wgsl), as little-endian u32 words, padded with zeros to a whole
// word and then one more word. Byte b of the chunk is bits
// 8*(b%4) .. 8*(b%4)+7 of word b/4. GGML blocks of 18, 22, 34, 54, 66, 110 and 210 bytes
// start off a word boundary (block i of a row at byte i * block_bytes), so block fields are
// read through three helpers:
//   byte_at(b)  one byte, any b
//   half_at(b)  two bytes at an even b: every f16 field of every block is at an even offset
//               (block sizes and field offsets are all even)
//   word_at(b)  four bytes at any b: the two words that hold them, funnel-shifted; the second
//               word may be the padding word after the last block
// Only the decoders whose fields are all word-aligned (F16, BF16, F32, palette and ternary
// codes, the Q8_0 and Q6_K planes, matvec_q4_k.wgsl's whole-word reads) index `data` directly.
// No kernel needs a feature beyond WGSL's core (f16 fields are decoded with integer
// operations, exactly).

struct Params {
    // Rows of this chunk.
    rows: u32,
    // K, elements per row, a multiple of 32.
    cols: u32,
    // Workgroups along x of the dispatch grid (a grid past 65,535 workgroups is 2-D).
    groups_x: u32,
    // The chunk's first row in the whole weight.
    row0: u32,
    // Rows of the whole weight: y's stride per token, and the gather's clamp for ids.
    out_rows: u32,
    // Tokens (vectors of x, rows of y or of the gather's output).
    n_tokens: u32,
    // Palette: rows per table (group_size). Unused elsewhere.
    p0: u32,
    // Palette: row0 % group_size, the chunk's first row's place in its group.
    p1: u32,
    // Products: where the parts of a stacked weight end (rows of the whole weight; both
    // `out_rows` for a plain weight): store.wgsl.
    seg1: u32,
    seg2: u32,
    // Products: 0 to store the sum, 1 for the residual epilogue (y += sum * scale), 2 for the
    // bias epilogue (y = sum + bias[r]; store.wgsl).
    accumulate: u32,
    scale: f32,
    // Single-token products (matvec.wgsl): invocations per row, G, a power of two dividing
    // WG with WG / G <= ROWS; WG where K has more units than WG / 2 (weights.rs
    // `matvec_split`). Unused elsewhere.
    lanes: u32,
    // Single-token products (matvec.wgsl, matvec_q6_k.wgsl): rows per workgroup, at most
    // ROWS and at least WG / lanes; fewer than ROWS where a weight has few rows, so that its
    // grid has enough workgroups to keep the memory system busy (weights.rs `matvec_split`).
    // Unused elsewhere.
    wg_rows: u32,
    // The single-token `_rms` kernels (x_rms.wgsl): the folded RMSNorm's eps. Unused
    // elsewhere.
    norm_eps: f32,
}

// Elements 4i .. 4i+3 (lo) and 16+4i .. 16+4i+3 (hi) of a 32-element unit: what a decoder's
// `quads(r, u, i)` returns (i < 4), where it has one (matvec_quads.wgsl).
struct Quads {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

@group(0) @binding(0) var<storage, read> data: array<u32>;
@group(0) @binding(4) var<uniform> params: Params;

const MAGIC_BITS: u32 = 0x4b000000u; // f32 bit pattern of 2^23
const SH8 = vec4<u32>(0u, 8u, 16u, 24u); // byte j of a word at bits 8j
const SH_LO = vec4<u32>(0u, 8u, 16u, 24u); // low nibble of byte j
const SH_HI = vec4<u32>(4u, 12u, 20u, 28u); // high nibble of byte j

// IEEE binary16 bits (low 16 bits of h) to f32, exactly (subnormals included).
fn f16_bits_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if e == 0u {
        // zero or subnormal: m * 2^-24 (exact in f32)
        return bitcast<f32>(sign | bitcast<u32>(f32(m) * 5.9604644775390625e-8));
    }
    if e == 31u {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

// Byte b of the chunk.
fn byte_at(b: u32) -> u32 {
    return (data[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
}

// Bytes b, b+1 as a little-endian u16; b even.
fn half_at(b: u32) -> u32 {
    return (data[b >> 2u] >> ((b & 2u) * 8u)) & 0xffffu;
}

// Bytes b .. b+3 as a little-endian u32, any b. For s = 8*(b%4) the bytes are the top
// 32 - s bits of word b/4 and the low s bits of the next word; `(hi << 1) << (31 - s)` is
// `hi << (32 - s)` without a shift by 32 when s = 0 (a WGSL shift takes its amount mod 32).
fn word_at(b: u32) -> u32 {
    let i = b >> 2u;
    let s = (b & 3u) * 8u;
    return (data[i] >> s) | ((data[i + 1u] << 1u) << (31u - s));
}

// The f16 field at even byte b, as f32.
fn f16_at(b: u32) -> f32 {
    return f16_bits_to_f32(half_at(b));
}

// q - off as f32, exactly, for integers 0 <= q < 2^23 and 0 <= off <= 128, without an
// integer-to-float conversion (a quarter-rate instruction on NVIDIA GPUs): q OR-ed into the
// mantissa of 2^23 is the f32 2^23 + q, and subtracting 2^23 + off (exact in f32) leaves
// q - off, an integer of magnitude below 2^23, so the subtraction is exact.
fn ints(q: vec4<u32>, off: f32) -> vec4<f32> {
    return bitcast<vec4<f32>>(q | vec4<u32>(MAGIC_BITS)) - vec4<f32>(8388608.0 + off);
}
