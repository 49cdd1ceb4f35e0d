// The int8 ternary decode products' shared part (ternary_matvec_q8.wgsl, which quantizes x
// in each workgroup, and ternary_matvec_q8g.wgsl, which reads x quantized once before it):
// the parameters, the weight and output bindings, the epilogue, the f16 scale and the unit
// dot product. The host prepends it after q8_common.wgsl and before the kernel's own part.
//
// Buffers (binding 2, x, is each kernel's own):
//   codes   [rows, K/64] vec4<u32>, element 16w+j of a row in bits 2j..2j+1 of word w, code c
//           in {0, 1, 2} meaning c - 1
//   scales  [rows, K/256] IEEE f16, two to a u32, flat index row * K/256 + b
//   y       [rows] f32

struct Params {
    // Rows of this dispatch (output rows; with SwiGLU the gate rows, the up rows following).
    rows: u32,
    // K, a multiple of 256 (at most XK in ternary_matvec_q8.wgsl).
    cols: u32,
    // Workgroups along x of the dispatch grid (a grid past 65,535 workgroups is 2-D).
    groups_x: u32,
    // 1: the residual epilogue, y[i] = y[i] + sum * scale; 0: y[i] = sum.
    accumulate: u32,
    scale: f32,
    // The folded RMSNorm's epsilon (kernels named `_rms`).
    eps: f32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;

// Stores row i's sum: y[i] = sum, or with the residual epilogue y[i] = y[i] + sum * scale.
fn store_y(i: u32, sum: f32) {
    if params.accumulate == 1u {
        y[i] = y[i] + sum * params.scale;
    } else {
        y[i] = sum;
    }
}

// IEEE binary16 bits (low 16 bits of h) to f32, exactly.
fn f16_bits_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if e == 0u {
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

// sum c*q over the 64 elements of unit w (activation groups xa..xd).
fn unit_dot(w: vec4<u32>, xa: vec4<u32>, xb: vec4<u32>, xc: vec4<u32>, xd: vec4<u32>) -> i32 {
    return (word_dot(w.x, xa) + word_dot(w.y, xb)) + (word_dot(w.z, xc) + word_dot(w.w, xd));
}
