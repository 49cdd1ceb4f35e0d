// Decoder: GGML Q5_0 (block_q5_0, 22 bytes per 32 elements): d f16 at byte 0, qh (u32,
// little-endian) at 2, qs[16] at 6; element j < 16 is the low nibble of qs[j] with bit j of
// qh as bit 4, element 16 + j the high nibble with bit j + 16; value d * (q - 16) (gguf-py
// 0.19.0 Q5_0.dequantize_blocks). One unit is one block. Exact: 11 bits times 5.

const BLOCK_BYTES: u32 = 22u;

fn unit(r: u32, u: u32) -> array<vec4<f32>, 8> {
    let b = (r * (params.cols / 32u) + u) * BLOCK_BYTES;
    let d = f16_at(b);
    let qh = vec4<u32>(word_at(b + 2u));
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        let w = vec4<u32>(word_at(b + 6u + 4u * i));
        let j = vec4<u32>(0u, 1u, 2u, 3u) + 4u * i;
        let h0 = ((qh >> j) & vec4<u32>(1u)) << vec4<u32>(4u);
        let h1 = ((qh >> (j + 16u)) & vec4<u32>(1u)) << vec4<u32>(4u);
        v[i] = d * ints(((w >> SH_LO) & vec4<u32>(15u)) | h0, 16.0);
        v[i + 4u] = d * ints(((w >> SH_HI) & vec4<u32>(15u)) | h1, 16.0);
    }
    return v;
}

// quads(r, u, i), i < 4: unit(r, u)[i] and [i + 4] (matvec_quads.wgsl), from qs word i and
// qh.
fn quads(r: u32, u: u32, i: u32) -> Quads {
    let b = (r * (params.cols / 32u) + u) * BLOCK_BYTES;
    let d = f16_at(b);
    let qh = vec4<u32>(word_at(b + 2u));
    let w = vec4<u32>(word_at(b + 6u + 4u * i));
    let j = vec4<u32>(0u, 1u, 2u, 3u) + 4u * i;
    let h0 = ((qh >> j) & vec4<u32>(1u)) << vec4<u32>(4u);
    let h1 = ((qh >> (j + 16u)) & vec4<u32>(1u)) << vec4<u32>(4u);
    return Quads(d * ints(((w >> SH_LO) & vec4<u32>(15u)) | h0, 16.0), d * ints(((w >> SH_HI) & vec4<u32>(15u)) | h1, 16.0));
}
