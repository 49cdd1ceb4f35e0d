// The Q6_K decoder as bundles made before the planes layout carry it (unit_q6_k.wgsl before
// it): kept for weights.rs `block_sources`, the test that such a bundle still runs.
// Decoder: GGML Q6_K (block_q6_K, 210 bytes per 256 elements): ql[128] at byte 0, qh[64] at
// 128, scales[16] (i8) at 192, d f16 at 208. Element h*128 + s*32 + l (h < 2, s < 4,
// l < 32): bits 4*(s/2) .. +3 of ql[h*64 + (s%2)*32 + l] with bits 2s..2s+1 of qh[h*32 + l]
// as bits 4..5, minus 32; sub-block h*8 + s*2 (l < 16) or the next; value (d * sc) * q
// (gguf-py 0.19.0 Q6_K.dequantize_blocks). Unit u of a row is part j = u % 8 (h = j / 4,
// s = j % 4) of block u / 8.
//
// d * sc is exact (11 bits times 8); its product with q is rounded once here as on the CPU
// (the multiplications are done in the same order): the CPU's bits.

const BLOCK_BYTES: u32 = 210u;

fn unit(r: u32, u: u32) -> array<vec4<f32>, 8> {
    let b = (r * (params.cols / 256u) + (u >> 3u)) * BLOCK_BYTES;
    let j = u & 7u;
    let h = j >> 2u;
    let s = j & 3u;
    let d = f16_at(b + 208u);
    let sb = h * 8u + s * 2u;
    let ds1 = d * f32(bitcast<i32>(byte_at(b + 192u + sb) << 24u) >> 24u);
    let ds2 = d * f32(bitcast<i32>(byte_at(b + 193u + sb) << 24u) >> 24u);
    let lshift = SH8 + vec4<u32>(4u * (s >> 1u));
    let hshift = SH8 + vec4<u32>(2u * s);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let ql = vec4<u32>(word_at(b + h * 64u + (s & 1u) * 32u + 4u * i));
        let qh = vec4<u32>(word_at(b + 128u + h * 32u + 4u * i));
        let q = ints(((ql >> lshift) & vec4<u32>(15u)) | (((qh >> hshift) & vec4<u32>(3u)) << vec4<u32>(4u)), 32.0);
        if i < 4u {
            v[i] = ds1 * q;
        } else {
            v[i] = ds2 * q;
        }
    }
    return v;
}
