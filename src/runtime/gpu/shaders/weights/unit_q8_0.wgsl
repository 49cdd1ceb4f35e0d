// Decoder: GGML Q8_0 (block_q8_0, 34 bytes per 32 elements: d f16, then qs[32] i8; value
// q * d, gguf-py 0.19.0 Q8_0.dequantize_blocks), uploaded as two planes (Q8_0 planes,
// weights.rs `q8_0_planes`): the chunk's qs first, row r's element k at byte r * K + k (every
// unit of every row starts on a word: K is a multiple of 32), then the d of each block, row
// r's block u an f16 at byte rows * K + 2 * (r * K/32 + u) (rows: this chunk's, params.rows).
// The same bytes as the blocks, regrouped, so that a unit's 32 codes are 8 aligned words
// (no funnel shift) and neighbouring invocations read neighbouring words. One unit is one
// block. The signed byte is (byte ^ 0x80) - 128. Exact: 11 bits times 8.

// Unit u of row r: its first qs word, and its d.
fn q8_qs(r: u32, u: u32) -> u32 {
    return (r * params.cols + 32u * u) >> 2u;
}

fn q8_d(r: u32, u: u32) -> f32 {
    return f16_at(params.rows * params.cols + 2u * (r * (params.cols / 32u) + u));
}

fn unit(r: u32, u: u32) -> array<vec4<f32>, 8> {
    let w0 = q8_qs(r, u);
    let d = q8_d(r, u);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let w = vec4<u32>(data[w0 + i]);
        v[i] = d * ints(((w >> SH8) & vec4<u32>(255u)) ^ vec4<u32>(128u), 128.0);
    }
    return v;
}

// quads(r, u, i), i < 4: unit(r, u)[i] and [i + 4] (matvec_quads.wgsl), qs words i and i + 4.
fn quads(r: u32, u: u32, i: u32) -> Quads {
    let w0 = q8_qs(r, u);
    let d = q8_d(r, u);
    let lo = vec4<u32>(data[w0 + i]);
    let hi = vec4<u32>(data[w0 + 4u + i]);
    return Quads(d * ints(((lo >> SH8) & vec4<u32>(255u)) ^ vec4<u32>(128u), 128.0), d * ints(((hi >> SH8) & vec4<u32>(255u)) ^ vec4<u32>(128u), 128.0));
}
