// Decoder: GGML Q2_K (block_q2_K, 84 bytes per 256 elements): scales[16] at byte 0, qs[64]
// at 16, d f16 at 80, dmin f16 at 82. Element h*128 + s*32 + l (h < 2, s < 4, l < 32) is
// bits 2s..2s+1 of qs[h*32 + l], in sub-block h*8 + s*2 (l < 16) or the next (l >= 16);
// sub-block i has scale d * (scales[i] & 15) and min dmin * (scales[i] >> 4); value
// dl * q - ml (gguf-py 0.19.0 Q2_K.dequantize_blocks). Unit u of a row is part j = u % 8
// (h = j / 4, s = j % 4) of block u / 8.
//
// Exact: dl = d * sc and ml = dmin * m are exact in f32 (11 bits times 4) and so is dl * q
// (15 bits times 2), so dl * q - ml has one rounding, fused or not: the CPU's bits.

const BLOCK_BYTES: u32 = 84u;

fn unit(r: u32, u: u32) -> array<vec4<f32>, 8> {
    let b = (r * (params.cols / 256u) + (u >> 3u)) * BLOCK_BYTES;
    let j = u & 7u;
    let h = j >> 2u;
    let s = j & 3u;
    let d = f16_at(b + 80u);
    let dmin = f16_at(b + 82u);
    let sb = h * 8u + s * 2u;
    let sc1 = byte_at(b + sb);
    let sc2 = byte_at(b + sb + 1u);
    let dl1 = d * f32(sc1 & 15u);
    let ml1 = dmin * f32(sc1 >> 4u);
    let dl2 = d * f32(sc2 & 15u);
    let ml2 = dmin * f32(sc2 >> 4u);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let w = vec4<u32>(word_at(b + 16u + h * 32u + 4u * i));
        let q = ints((w >> (SH8 + vec4<u32>(2u * s))) & vec4<u32>(3u), 0.0);
        if i < 4u {
            v[i] = dl1 * q - ml1;
        } else {
            v[i] = dl2 * q - ml2;
        }
    }
    return v;
}
