// Decoder: the bundle's ternary2 layout (src/ternary.rs): `data` holds the codes, [rows,
// K/16] u32 words (element 16w + j of a row in bits 2j..2j+1 of its word w), `aux` the
// scales, [rows, K/256] f16 two to a word; value f32(scale) * (code - 1), exact, the CPU's
// bits (ternary::row_values). Unit u of a row is words 2u and 2u + 1. (The single-token
// product uses the tuned ternary_matvec kernel instead; this decoder serves the multi-token
// product and the gather.)

@group(0) @binding(1) var<storage, read> aux: array<u32>;

fn unit(r: u32, u: u32) -> array<vec4<f32>, 8> {
    let wi = r * (params.cols / 16u) + 2u * u;
    let si = r * (params.cols / 256u) + u / 8u;
    let d = f16_bits_to_f32((aux[si >> 1u] >> ((si & 1u) * 16u)) & 0xffffu);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let w = data[wi + i / 4u] >> (8u * (i % 4u));
        v[i] = d * ints((vec4<u32>(w) >> vec4<u32>(0u, 2u, 4u, 6u)) & vec4<u32>(3u), 1.0);
    }
    return v;
}
