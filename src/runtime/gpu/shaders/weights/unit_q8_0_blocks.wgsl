// The Q8_0 decoder as bundles made before the planes layout carry it (unit_q8_0.wgsl before
// it): kept for weights.rs `block_sources`, the test that such a bundle still runs.
// Decoder: GGML Q8_0 (block_q8_0, 34 bytes per 32 elements): d f16 at byte 0, qs[32] (i8)
// at 2; value q * d (gguf-py 0.19.0 Q8_0.dequantize_blocks). One unit is one block. The
// signed byte is (byte ^ 0x80) - 128. Exact: 11 bits times 8.

const BLOCK_BYTES: u32 = 34u;

fn unit(r: u32, u: u32) -> array<vec4<f32>, 8> {
    let b = (r * (params.cols / 32u) + u) * BLOCK_BYTES;
    let d = f16_at(b);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let w = vec4<u32>(word_at(b + 2u + 4u * i));
        v[i] = d * ints(((w >> SH8) & vec4<u32>(255u)) ^ vec4<u32>(128u), 128.0);
    }
    return v;
}

// quads(r, u, i), i < 4: unit(r, u)[i] and [i + 4] (matvec_quads.wgsl), qs words i and i + 4.
fn quads(r: u32, u: u32, i: u32) -> Quads {
    let b = (r * (params.cols / 32u) + u) * BLOCK_BYTES;
    let d = f16_at(b);
    let lo = vec4<u32>(word_at(b + 2u + 4u * i));
    let hi = vec4<u32>(word_at(b + 18u + 4u * i));
    return Quads(d * ints(((lo >> SH8) & vec4<u32>(255u)) ^ vec4<u32>(128u), 128.0), d * ints(((hi >> SH8) & vec4<u32>(255u)) ^ vec4<u32>(128u), 128.0));
}
