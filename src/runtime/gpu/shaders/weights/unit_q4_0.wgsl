// Decoder: GGML Q4_0 (block_q4_0, 18 bytes per 32 elements): d f16 at byte 0, qs[16] at 2;
// element j < 16 is the low nibble of qs[j], element 16 + j its high nibble; value
// d * (q - 8) (gguf-py 0.19.0 Q4_0.dequantize_blocks). One unit is one block.
//
// unit(r, u): the 32 values of unit u (elements 32u .. 32u+31) of chunk row r, exactly the
// CPU dequantizer's f32 values (d * (q - 8) is exact in f32: an 11-bit significand times a
// 4-bit integer).

const BLOCK_BYTES: u32 = 18u;

fn unit(r: u32, u: u32) -> array<vec4<f32>, 8> {
    let b = (r * (params.cols / 32u) + u) * BLOCK_BYTES;
    let d = f16_at(b);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        let w = vec4<u32>(word_at(b + 2u + 4u * i));
        v[i] = d * ints((w >> SH_LO) & vec4<u32>(15u), 8.0);
        v[i + 4u] = d * ints((w >> SH_HI) & vec4<u32>(15u), 8.0);
    }
    return v;
}

// quads(r, u, i), i < 4: elements 4i .. 4i+3 (lo) and 16+4i .. 16+4i+3 (hi) of unit u, the
// values of unit(r, u)[i] and [i + 4] (matvec_quads.wgsl): the low and high nibbles of qs
// word i.
fn quads(r: u32, u: u32, i: u32) -> Quads {
    let b = (r * (params.cols / 32u) + u) * BLOCK_BYTES;
    let d = f16_at(b);
    let w = vec4<u32>(word_at(b + 2u + 4u * i));
    return Quads(d * ints((w >> SH_LO) & vec4<u32>(15u), 8.0), d * ints((w >> SH_HI) & vec4<u32>(15u), 8.0));
}
