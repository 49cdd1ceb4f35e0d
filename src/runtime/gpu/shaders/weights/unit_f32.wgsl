// Decoder: GGML F32: the stored words are the values.

fn unit(r: u32, u: u32) -> array<vec4<f32>, 8> {
    let wi = r * params.cols + u * 32u;
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let o = wi + 4u * i;
        v[i] = bitcast<vec4<f32>>(vec4<u32>(data[o], data[o + 1u], data[o + 2u], data[o + 3u]));
    }
    return v;
}

// quads(r, u, i), i < 4: unit(r, u)[i] and [i + 4] (matvec_quads.wgsl).
fn quads(r: u32, u: u32, i: u32) -> Quads {
    let o = r * params.cols + u * 32u + 4u * i;
    return Quads(
        bitcast<vec4<f32>>(vec4<u32>(data[o], data[o + 1u], data[o + 2u], data[o + 3u])),
        bitcast<vec4<f32>>(vec4<u32>(data[o + 16u], data[o + 17u], data[o + 18u], data[o + 19u])),
    );
}
