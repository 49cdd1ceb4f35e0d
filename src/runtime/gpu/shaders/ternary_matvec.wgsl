// Ternary matrix-vector product y = W x on the bundle's packed layout (src/ternary.rs).
//
// W is row-major [rows, cols], cols = K a multiple of 256. The buffers hold the bundle's bytes
// as stored:
//   codes   [rows, K/16] little-endian u32 words, read here as vec4<u32> ([rows, K/64]); word w
//           of a row holds elements 16w .. 16w+15, element 16w+j in bits 2j..2j+1, code q in
//           {0, 1, 2} meaning the value q - 1 in {-1, 0, +1}
//   scales  [rows, K/256] IEEE f16, two to a u32 (element i in bits 16*(i%2)..), flat index
//           row * K/256 + b; decoded with integer operations (exact, subnormals included; no
//           SHADER_F16 needed)
//   x       [K] f32 (as vec4<f32>),  y [rows] f32
//
// Formula. The CPU reference (src/runtime/matvec.rs) computes, per 256-block b of a row,
// d_b * sum_k x_k * (q_k - 1). Here each invocation takes one vec4<u32> of codes (64 elements,
// a quarter of one block) per row and computes
//     d_b * (sum_k x_k * q_k - sum_k x_k)
// over those 64 elements: the same value in exact arithmetic, the scale applied once per 64
// elements (never per element), sum x computed once and shared by the ROWS rows of the
// workgroup. The two differ only by f32 rounding (the bound is in src/runtime/gpu/mod.rs).
//
// Codes become f32 without integer-to-float conversions (see codes4), which run at a
// quarter of the rate of other arithmetic on NVIDIA GPUs.
//
// The host prepends the compile-time parameters (the pipeline's name carries them):
//   const ROWS: u32   rows per workgroup
//   const WG: u32     invocations per workgroup (a power of two)
// and appends one of the reductions, ternary_matvec_reduce_subgroup.wgsl or
// ternary_matvec_reduce_workgroup.wgsl, which holds the entry point `main`.

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
// Element 4i+j of a word sits at bits 2j..2j+1 of byte i.
const MASKS = vec4<u32>(3u, 12u, 48u, 192u);
const UNSCALE = vec4<f32>(1.0, 0.25, 0.0625, 0.015625); // 4^-j
const OFFSET = vec4<f32>(-8388608.0, -2097152.0, -524288.0, -131072.0); // -2^23 * 4^-j

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

// Codes of elements 4i .. 4i+3 of word w (byte i) as f32 q in {0, 1, 2}, exactly and without
// an integer-to-float conversion: element j's bits, masked in place and OR-ed into the
// mantissa of 2^23, give the f32 2^23 + q * 4^j; one fma scales that by 4^-j (exact, a power
// of two) and subtracts 2^23 * 4^-j, leaving q. One shift per byte, one AND-OR per element.
fn codes4(w: u32, i: u32) -> vec4<f32> {
    let f = bitcast<vec4<f32>>((vec4<u32>(w >> (8u * i)) & MASKS) | vec4<u32>(MAGIC_BITS));
    return fma(f, UNSCALE, OFFSET);
}

// sum x * q over the 16 elements of word w; xa .. xd are their activations.
fn word_dot(w: u32, xa: vec4<f32>, xb: vec4<f32>, xc: vec4<f32>, xd: vec4<f32>) -> f32 {
    return (dot(xa, codes4(w, 0u)) + dot(xb, codes4(w, 1u)))
        + (dot(xc, codes4(w, 2u)) + dot(xd, codes4(w, 3u)));
}

// This invocation's partial sums of rows row0 .. row0 + ROWS - 1 (rows past the end read the
// last row; their results are never stored). Invocation lid takes the 64-element units lid,
// lid + WG, ... of every row.
fn row_partials(lid: u32, row0: u32) -> array<f32, ROWS> {
    var acc: array<f32, ROWS>;
    let units = params.cols / 64u;
    let blocks = params.cols / 256u;
    var rbase: array<u32, ROWS>;
    for (var r = 0u; r < ROWS; r++) {
        rbase[r] = min(row0 + r, params.rows - 1u);
    }
    for (var u = lid; u < units; u += WG) {
        // All ROWS loads first, so they are in flight together.
        var cw: array<vec4<u32>, ROWS>;
        for (var r = 0u; r < ROWS; r++) {
            cw[r] = codes[rbase[r] * units + u];
        }
        // The unit's 64 activations, loaded once for all ROWS rows, and their sum.
        let xi = u * 16u;
        let x0 = x[xi];
        let x1 = x[xi + 1u];
        let x2 = x[xi + 2u];
        let x3 = x[xi + 3u];
        let x4 = x[xi + 4u];
        let x5 = x[xi + 5u];
        let x6 = x[xi + 6u];
        let x7 = x[xi + 7u];
        let x8 = x[xi + 8u];
        let x9 = x[xi + 9u];
        let x10 = x[xi + 10u];
        let x11 = x[xi + 11u];
        let x12 = x[xi + 12u];
        let x13 = x[xi + 13u];
        let x14 = x[xi + 14u];
        let x15 = x[xi + 15u];
        let s4 = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))
            + (((x8 + x9) + (x10 + x11)) + ((x12 + x13) + (x14 + x15)));
        let sx = (s4.x + s4.y) + (s4.z + s4.w);
        let b = u / 4u;
        for (var r = 0u; r < ROWS; r++) {
            let w = cw[r];
            let t = (word_dot(w.x, x0, x1, x2, x3) + word_dot(w.y, x4, x5, x6, x7))
                + (word_dot(w.z, x8, x9, x10, x11) + word_dot(w.w, x12, x13, x14, x15));
            acc[r] += scale_at(rbase[r] * blocks + b) * (t - sx);
        }
    }
    return acc;
}
