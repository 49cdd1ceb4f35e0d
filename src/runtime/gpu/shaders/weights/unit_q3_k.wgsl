// Decoder: GGML Q3_K (block_q3_K, 110 bytes per 256 elements): hmask[32] at byte 0, qs[64]
// at 32, scales[12] at 96, d f16 at 108. Element h*128 + s*32 + l (h < 2, s < 4, l < 32):
// low bits 2s..2s+1 of qs[h*32 + l], minus 4 where bit h*4 + s of hmask[l] is clear;
// sub-block h*8 + s*2 (l < 16) or the next; 16 six-bit signed scales (q3_k_scales in
// src/quant/kquants.rs, minus 32); value (d * sc) * q (gguf-py 0.19.0 Q3_K). Unit u of a
// row is part j = u % 8 (h = j / 4, s = j % 4) of block u / 8.
//
// Exact: d * sc is exact in f32 (11 bits times 6) and so is its product with q (17 bits
// times 3): the CPU's bits.

const BLOCK_BYTES: u32 = 110u;

// Scale i of the block at byte b, unpacked as q3_k_scales does.
fn q3k_scale(b: u32, i: u32) -> f32 {
    var low: u32;
    if i < 8u {
        low = byte_at(b + 96u + i) & 15u;
    } else {
        low = byte_at(b + 88u + i) >> 4u;
    }
    let high = (byte_at(b + 104u + (i & 3u)) >> (2u * (i >> 2u))) & 3u;
    return f32(i32(low | (high << 4u)) - 32);
}

fn unit(r: u32, u: u32) -> array<vec4<f32>, 8> {
    let b = (r * (params.cols / 256u) + (u >> 3u)) * BLOCK_BYTES;
    let j = u & 7u;
    let h = j >> 2u;
    let s = j & 3u;
    let d = f16_at(b + 108u);
    let sb = h * 8u + s * 2u;
    let dl1 = d * q3k_scale(b, sb);
    let dl2 = d * q3k_scale(b, sb + 1u);
    let bit = h * 4u + s;
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let ql = (vec4<u32>(word_at(b + 32u + h * 32u + 4u * i)) >> (SH8 + vec4<u32>(2u * s)))
            & vec4<u32>(3u);
        let hm = (vec4<u32>(word_at(b + 4u * i)) >> (SH8 + vec4<u32>(bit))) & vec4<u32>(1u);
        let q = ints(ql | (hm << vec4<u32>(2u)), 4.0);
        if i < 4u {
            v[i] = dl1 * q;
        } else {
            v[i] = dl2 * q;
        }
    }
    return v;
}
