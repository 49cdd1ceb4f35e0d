// Decoder: GGML Q5_1 (block_q5_1, 24 bytes per 32 elements): d f16 at byte 0, m f16 at 2,
// qh (u32, little-endian) at 4, qs[16] at 8; q as Q5_0 (bit j / j + 16 of qh as bit 4);
// value d * q + m (gguf-py 0.19.0 Q5_1.dequantize_blocks). One unit is one block.
// Exact: d * q is exact (11 bits times 5), so the add is the only rounding, fused or not.

const BLOCK_BYTES: u32 = 24u;

fn unit(r: u32, u: u32) -> array<vec4<f32>, 8> {
    let b = (r * (params.cols / 32u) + u) * BLOCK_BYTES;
    let d = f16_at(b);
    let m = f16_at(b + 2u);
    let qh = vec4<u32>(word_at(b + 4u));
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 4u; i++) {
        let w = vec4<u32>(word_at(b + 8u + 4u * i));
        let j = vec4<u32>(0u, 1u, 2u, 3u) + 4u * i;
        let h0 = ((qh >> j) & vec4<u32>(1u)) << vec4<u32>(4u);
        let h1 = ((qh >> (j + 16u)) & vec4<u32>(1u)) << vec4<u32>(4u);
        v[i] = d * ints(((w >> SH_LO) & vec4<u32>(15u)) | h0, 0.0) + m;
        v[i + 4u] = d * ints(((w >> SH_HI) & vec4<u32>(15u)) | h1, 0.0) + m;
    }
    return v;
}

// quads(r, u, i), i < 4: unit(r, u)[i] and [i + 4] (matvec_quads.wgsl), from qs word i and
// qh.
fn quads(r: u32, u: u32, i: u32) -> Quads {
    let b = (r * (params.cols / 32u) + u) * BLOCK_BYTES;
    let d = f16_at(b);
    let m = f16_at(b + 2u);
    let qh = vec4<u32>(word_at(b + 4u));
    let w = vec4<u32>(word_at(b + 8u + 4u * i));
    let j = vec4<u32>(0u, 1u, 2u, 3u) + 4u * i;
    let h0 = ((qh >> j) & vec4<u32>(1u)) << vec4<u32>(4u);
    let h1 = ((qh >> (j + 16u)) & vec4<u32>(1u)) << vec4<u32>(4u);
    return Quads(d * ints(((w >> SH_LO) & vec4<u32>(15u)) | h0, 0.0) + m, d * ints(((w >> SH_HI) & vec4<u32>(15u)) | h1, 0.0) + m);
}
