// Decoder: GGML Q4_1 (block_q4_1, 20 bytes per 32 elements): d f16 at byte 0, m f16 at 2,
// qs[16] at 4; element j < 16 is the low nibble of qs[j], element 16 + j its high nibble;
// value d * q + m (gguf-py 0.19.0 Q4_1.dequantize_blocks). One unit is one block.
//
// Exact: d * q is exact in f32 (11-bit significand times a 4-bit integer), so d * q + m has
// one rounding whether or not the compiler fuses it into an fma: the CPU's bits.

const BLOCK_BYTES: u32 = 20u;

fn unit(r: u32, u: u32) -> array<vec4<f32>, 8> {
    let b = (r * (params.cols / 32u) + u) * BLOCK_BYTES;
    let d = f16_at(b);
    let m = f16_at(b + 2u);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        let w = vec4<u32>(word_at(b + 4u + 4u * i));
        v[i] = d * ints((w >> SH_LO) & vec4<u32>(15u), 0.0) + m;
        v[i + 4u] = d * ints((w >> SH_HI) & vec4<u32>(15u), 0.0) + m;
    }
    return v;
}

// quads(r, u, i), i < 4: unit(r, u)[i] and [i + 4] (matvec_quads.wgsl), from qs word i.
fn quads(r: u32, u: u32, i: u32) -> Quads {
    let b = (r * (params.cols / 32u) + u) * BLOCK_BYTES;
    let d = f16_at(b);
    let m = f16_at(b + 2u);
    let w = vec4<u32>(word_at(b + 4u + 4u * i));
    return Quads(d * ints((w >> SH_LO) & vec4<u32>(15u), 0.0) + m, d * ints((w >> SH_HI) & vec4<u32>(15u), 0.0) + m);
}
