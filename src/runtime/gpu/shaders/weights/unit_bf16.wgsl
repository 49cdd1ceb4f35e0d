// Decoder: GGML BF16: bfloat16, little-endian, two per word; the value is the f32 whose top
// half is the stored bits (gguf-py 0.19.0 BF16.dequantize_blocks), exact.

fn unit(r: u32, u: u32) -> array<vec4<f32>, 8> {
    let wi = r * (params.cols / 2u) + u * 16u;
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let a = data[wi + 2u * i];
        let c = data[wi + 2u * i + 1u];
        v[i] = bitcast<vec4<f32>>(vec4<u32>(a << 16u, a & 0xffff0000u, c << 16u, c & 0xffff0000u));
    }
    return v;
}

// quads(r, u, i), i < 4: unit(r, u)[i] and [i + 4] (matvec_quads.wgsl).
fn bf16_quad(a: u32, c: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(vec4<u32>(a << 16u, a & 0xffff0000u, c << 16u, c & 0xffff0000u));
}

fn quads(r: u32, u: u32, i: u32) -> Quads {
    let wi = r * (params.cols / 2u) + u * 16u + 2u * i;
    return Quads(bf16_quad(data[wi], data[wi + 1u]), bf16_quad(data[wi + 8u], data[wi + 9u]));
}
