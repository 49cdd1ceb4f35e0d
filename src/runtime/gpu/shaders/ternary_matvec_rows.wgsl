// Ternary matrix-vector product y = W x for decode, rows spread over subgroups (the
// "subgroup rows" variant; the layout of the buffers is that of ternary_matvec.wgsl).
//
// W is row-major [rows, cols], cols = K a multiple of 256:
//   codes   [rows, K/64] vec4<u32> (the bundle's u32 words as stored), element 16w+j of a row in
//           bits 2j..2j+1 of word w, code q in {0, 1, 2} meaning q - 1
//   scales  [rows, K/256] IEEE f16, two to a u32, flat index row * K/256 + b
//   x       [K] f32 (as vec4<f32>),  y [rows] f32
//
// Work split. A workgroup takes ROWS consecutive rows. Its subgroups take them RS at a time
// (subgroup i: rows i*RS.., then (i + num_subgroups)*RS.., ...), so how many subgroups there
// are (subgroup_size is read from the hardware, never assumed) changes only how many passes
// each makes. Within a subgroup of s lanes, lane l streams the row's 64-element units
// l, l + s, l + 2s, ...: one vec4<u32> of codes each, consecutive lanes reading consecutive
// 16-byte words. A chunk is P such units per lane (P*s units, P*s/4 blocks): the codes of
// all P units of all RS rows are loaded first (RS*P loads in flight per lane), then each unit's
// 64 activations are loaded once into registers and used for the RS rows. A chunk's P*s/4
// block scales are loaded and decoded once per row, one per lane, and handed to the lanes of
// each unit with subgroupShuffle. The row's partials are added with subgroupAdd: no workgroup
// memory, no barrier.
//
// Formula, per 64-element unit (quarter block) of a row, as ternary_matvec.wgsl:
//     d_b * (sum_k x_k * q_k - sum_k x_k)
// (scale once per unit, never per element; sum x computed once per unit for the RS rows).
// Same tolerance (src/runtime/gpu/mod.rs).
//
// Decoding codes without shifts per byte or integer-to-float conversions: the 2-bit field of
// element e (0..7) of a half word, masked in place and OR-ed into the mantissa of 2^23, is the
// f32 2^23 + q * 4^e; one fma with the powers of two 4^-e and -2^23 * 4^-e gives q exactly.
// Elements 8..15 of a word are the same after one shift by 16.
//
// The host (src/runtime/gpu/mod.rs) prepends
//   const ROWS: u32   rows per workgroup (a multiple of RS)
//   const WG: u32     invocations per workgroup (a power of two)
//   const RS: u32     rows per subgroup pass
//   const P: u32      units per lane per chunk (1, 2 or 4)
// and appends the entry point `main`, unrolled over the RS rows and P units.

struct Params {
    // Rows of this dispatch.
    rows: u32,
    // K, a multiple of 256.
    cols: u32,
    // Workgroups along x of the dispatch grid (a grid past 65,535 workgroups is 2-D).
    groups_x: u32,
    // 1: the residual epilogue, y[i] = y[i] + sum * scale (the residual add folded in);
    // 0: y[i] = sum.
    accumulate: u32,
    scale: f32,
    // The folded RMSNorm's epsilon (kernels named `_rms`).
    eps: f32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

// Stores row i's sum: y[i] = sum, or with the residual epilogue y[i] = y[i] + sum * scale
// (the GPU's op_add and the CPU's residual add, in the same order: the same bits).
fn store_y(i: u32, sum: f32) {
    if params.accumulate == 1u {
        y[i] = y[i] + sum * params.scale;
    } else {
        y[i] = sum;
    }
}

const MAGIC_BITS = 0x4b000000u; // f32 bit pattern of 2^23
// Elements 0..3 and 4..7 of a half word.
const MASK_LO = vec4<u32>(0x3u, 0xcu, 0x30u, 0xc0u);
const MASK_HI = vec4<u32>(0x300u, 0xc00u, 0x3000u, 0xc000u);
const UNSCALE_LO = vec4<f32>(1.0, 0.25, 0.0625, 0.015625); // 4^-e, e = 0..3
const UNSCALE_HI = vec4<f32>(0.00390625, 0.0009765625, 0.000244140625, 0.00006103515625); // e = 4..7
const OFFSET_LO = vec4<f32>(-8388608.0, -2097152.0, -524288.0, -131072.0); // -2^23 * 4^-e
const OFFSET_HI = vec4<f32>(-32768.0, -8192.0, -2048.0, -512.0);

// IEEE binary16 bits (low 16 bits of h) to f32, exactly.
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

// The f16 scale at flat index i of the scales array.
fn scale_at(i: u32) -> f32 {
    let w = scales[i >> 1u];
    return f16_bits_to_f32((w >> ((i & 1u) * 16u)) & 0xffffu);
}

// Codes q (as f32, exactly) of elements 0..3 (MASK_LO) or 4..7 (MASK_HI) of half word h.
fn dec_lo(h: u32) -> vec4<f32> {
    return fma(bitcast<vec4<f32>>((vec4<u32>(h) & MASK_LO) | vec4<u32>(MAGIC_BITS)), UNSCALE_LO, OFFSET_LO);
}
fn dec_hi(h: u32) -> vec4<f32> {
    return fma(bitcast<vec4<f32>>((vec4<u32>(h) & MASK_HI) | vec4<u32>(MAGIC_BITS)), UNSCALE_HI, OFFSET_HI);
}

// acc + x * q over the 16 elements of word w (xa .. xd their activations), per vec4 lane.
fn word_fma(w: u32, xa: vec4<f32>, xb: vec4<f32>, xc: vec4<f32>, xd: vec4<f32>, acc: vec4<f32>) -> vec4<f32> {
    let h = w >> 16u;
    var a = fma(xa, dec_lo(w), acc);
    a = fma(xb, dec_hi(w), a);
    a = fma(xc, dec_lo(h), a);
    return fma(xd, dec_hi(h), a);
}

// sum x * q over the 64 elements of unit w.
fn unit_dot(
    w: vec4<u32>,
    x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>,
    x4: vec4<f32>, x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>,
    x8: vec4<f32>, x9: vec4<f32>, x10: vec4<f32>, x11: vec4<f32>,
    x12: vec4<f32>, x13: vec4<f32>, x14: vec4<f32>, x15: vec4<f32>,
) -> f32 {
    var a = word_fma(w.x, x0, x1, x2, x3, vec4<f32>(0.0));
    a = word_fma(w.y, x4, x5, x6, x7, a);
    a = word_fma(w.z, x8, x9, x10, x11, a);
    a = word_fma(w.w, x12, x13, x14, x15, a);
    return (a.x + a.y) + (a.z + a.w);
}
