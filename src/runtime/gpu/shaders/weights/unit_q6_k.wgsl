// Decoder: GGML Q6_K (block_q6_K, 210 bytes per 256 elements: ql[128], qh[64], scales[16] i8,
// d f16), uploaded as four planes (Q6_K planes, weights.rs `q6_k_planes`): for the chunk's nb
// = rows * K/256 blocks, block g's ql at byte 128 g, its qh at 128 nb + 64 g, its scales at
// 192 nb + 16 g and its d at 208 nb + 2 g (g = r * K/256 + block of row r): the same bytes,
// regrouped so that every word a kernel reads is aligned. Element h*128 + s*32 + l (h < 2,
// s < 4, l < 32): bits 4*(s/2) .. +3 of ql[h*64 + (s%2)*32 + l] with bits 2s..2s+1 of
// qh[h*32 + l] as bits 4..5, minus 32; sub-block h*8 + s*2 (l < 16) or the next; value
// (d * sc) * q (gguf-py 0.19.0 Q6_K.dequantize_blocks). Unit u of a row is part j = u % 8
// (h = j / 4, s = j % 4) of block u / 8.
//
// d * sc is exact (11 bits times 8); its product with q is rounded once here as on the CPU
// (the multiplications are done in the same order): the CPU's bits.

// Blocks of this chunk.
fn q6_blocks() -> u32 {
    return params.rows * (params.cols / 256u);
}

// Word o / 4 (o a multiple of 4) of block g's ql (o < 128), qh (o < 64) or scales (o < 16).
fn q6_ql(g: u32, o: u32) -> u32 {
    return data[(128u * g + o) >> 2u];
}

fn q6_qh(g: u32, o: u32) -> u32 {
    return data[(128u * q6_blocks() + 64u * g + o) >> 2u];
}

fn q6_sc(g: u32, o: u32) -> u32 {
    return data[(192u * q6_blocks() + 16u * g + o) >> 2u];
}

fn q6_d(g: u32) -> f32 {
    return f16_at(208u * q6_blocks() + 2u * g);
}

fn unit(r: u32, u: u32) -> array<vec4<f32>, 8> {
    let g = r * (params.cols / 256u) + (u >> 3u);
    let j = u & 7u;
    let h = j >> 2u;
    let s = j & 3u;
    let d = q6_d(g);
    let sb = h * 8u + s * 2u;
    // Scale bytes sb and sb + 1 (sb even: both in one word).
    let sw = q6_sc(g, sb & 12u);
    let ds1 = d * f32(bitcast<i32>(sw << (24u - 8u * (sb & 3u))) >> 24u);
    let ds2 = d * f32(bitcast<i32>(sw << (16u - 8u * (sb & 3u))) >> 24u);
    let lshift = SH8 + vec4<u32>(4u * (s >> 1u));
    let hshift = SH8 + vec4<u32>(2u * s);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let ql = vec4<u32>(q6_ql(g, h * 64u + (s & 1u) * 32u + 4u * i));
        let qh = vec4<u32>(q6_qh(g, h * 32u + 4u * i));
        let q = ints(((ql >> lshift) & vec4<u32>(15u)) | (((qh >> hshift) & vec4<u32>(3u)) << vec4<u32>(4u)), 32.0);
        if i < 4u {
            v[i] = ds1 * q;
        } else {
            v[i] = ds2 * q;
        }
    }
    return v;
}
