// Decoder: GGML TQ2_0 (block_tq2_0, 66 bytes per 256 elements): qs[64] at byte 0, d f16 at
// 64. Element h*128 + s*32 + l (h < 2, s < 4, l < 32) is bits 2s..2s+1 of qs[h*32 + l];
// value d * (q - 1) (gguf-py 0.19.0 TQ2_0.dequantize_blocks). Unit u of a row is part
// j = u % 8 (h = j / 4, s = j % 4) of block u / 8. Exact.

const BLOCK_BYTES: u32 = 66u;

fn unit(r: u32, u: u32) -> array<vec4<f32>, 8> {
    let b = (r * (params.cols / 256u) + (u >> 3u)) * BLOCK_BYTES;
    let j = u & 7u;
    let d = f16_at(b + 64u);
    let shift = SH8 + vec4<u32>(2u * (j & 3u));
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let w = vec4<u32>(word_at(b + (j >> 2u) * 32u + 4u * i));
        v[i] = d * ints((w >> shift) & vec4<u32>(3u), 1.0);
    }
    return v;
}
