// Decoder: GGML Q5_K (block_q5_K, 176 bytes per 256 elements): d f16 at byte 0, dmin f16
// at 2, scales[12] at 4 (as Q4_K), qh[32] at 16, qs[128] at 48. Sub-block j: the nibbles of
// Q4_K with bit j of qh[l] as bit 4; value (d * sc_j) * q - dmin * m_j (gguf-py 0.19.0
// Q5_K.dequantize_blocks). Unit u of a row is sub-block j = u % 8 of block u / 8.
//
// Exact: as Q4_K ((d * sc) * q is 17 bits times 5): the CPU's bits.

const BLOCK_BYTES: u32 = 176u;

// Scale (x) and min (y) of sub-block j of the block at byte b (get_scale_min_k4).
fn scale_min_k4(b: u32, j: u32) -> vec2<u32> {
    if j < 4u {
        return vec2<u32>(byte_at(b + 4u + j) & 63u, byte_at(b + 8u + j) & 63u);
    }
    let e = byte_at(b + 8u + j);
    return vec2<u32>(
        (e & 15u) | ((byte_at(b + j) >> 6u) << 4u),
        (e >> 4u) | ((byte_at(b + 4u + j) >> 6u) << 4u),
    );
}

fn unit(r: u32, u: u32) -> array<vec4<f32>, 8> {
    let b = (r * (params.cols / 256u) + (u >> 3u)) * BLOCK_BYTES;
    let j = u & 7u;
    let sm = scale_min_k4(b, j);
    let dl = f16_at(b) * f32(sm.x);
    let ml = f16_at(b + 2u) * f32(sm.y);
    let shift = SH8 + vec4<u32>(4u * (j & 1u));
    let hshift = SH8 + vec4<u32>(j);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let w = vec4<u32>(word_at(b + 48u + (j >> 1u) * 32u + 4u * i));
        let qh = vec4<u32>(word_at(b + 16u + 4u * i));
        let q = ((w >> shift) & vec4<u32>(15u)) | (((qh >> hshift) & vec4<u32>(1u)) << vec4<u32>(4u));
        v[i] = dl * ints(q, 0.0) - ml;
    }
    return v;
}
