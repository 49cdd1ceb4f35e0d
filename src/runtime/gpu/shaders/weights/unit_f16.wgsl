// Decoder: GGML F16: IEEE binary16, little-endian, two per word (element 2i in the low
// half of word i of the row); decoded exactly with integer operations. A row of K elements
// is K/2 words, so every unit (16 words) is word-aligned.

fn unit(r: u32, u: u32) -> array<vec4<f32>, 8> {
    let wi = r * (params.cols / 2u) + u * 16u;
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let a = data[wi + 2u * i];
        let c = data[wi + 2u * i + 1u];
        v[i] = vec4<f32>(
            f16_bits_to_f32(a & 0xffffu),
            f16_bits_to_f32(a >> 16u),
            f16_bits_to_f32(c & 0xffffu),
            f16_bits_to_f32(c >> 16u),
        );
    }
    return v;
}

// quads(r, u, i), i < 4: unit(r, u)[i] and [i + 4] (matvec_quads.wgsl).
fn f16_quad(a: u32, c: u32) -> vec4<f32> {
    return vec4<f32>(f16_bits_to_f32(a & 0xffffu), f16_bits_to_f32(a >> 16u), f16_bits_to_f32(c & 0xffffu), f16_bits_to_f32(c >> 16u));
}

fn quads(r: u32, u: u32, i: u32) -> Quads {
    let wi = r * (params.cols / 2u) + u * 16u + 2u * i;
    return Quads(f16_quad(data[wi], data[wi + 1u]), f16_quad(data[wi + 8u], data[wi + 9u]));
}
