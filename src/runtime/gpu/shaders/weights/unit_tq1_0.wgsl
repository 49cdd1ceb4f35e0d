// Decoder: GGML TQ1_0 (block_tq1_0, 54 bytes per 256 elements): qs[48] at byte 0, qh[4] at
// 48, d f16 at 52. Base-3 packing (tq1_0_codes in src/quant/ternary.rs): trit k of byte c is
// ((c * 3^k mod 256) * 3) >> 8; element k*32 + l is trit k of qs[l] (k < 5, l < 32),
// element 160 + k*16 + l trit k of qs[32 + l] (k < 5, l < 16), element 240 + k*4 + l trit k
// of qh[l] (k < 4, l < 4); value d * (trit - 1) (gguf-py 0.19.0 TQ1_0.dequantize_blocks).
// Unit u of a row is elements 32*(u % 8) .. +31 of block u / 8; every aligned group of four
// elements comes from four consecutive bytes with one k. Exact.

const BLOCK_BYTES: u32 = 54u;

fn unit(r: u32, u: u32) -> array<vec4<f32>, 8> {
    let b = (r * (params.cols / 256u) + (u >> 3u)) * BLOCK_BYTES;
    let d = f16_at(b + 52u);
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        // The block element of this group's first value, and where its trits are.
        let e = (u & 7u) * 32u + 4u * i;
        var off: u32;
        var k: u32;
        if e < 160u {
            k = e / 32u;
            off = e % 32u;
        } else if e < 240u {
            k = (e - 160u) / 16u;
            off = 32u + (e - 160u) % 16u;
        } else {
            k = (e - 240u) / 4u;
            off = 48u;
        }
        let p3 = select(select(select(select(81u, 27u, k == 3u), 9u, k == 2u), 3u, k == 1u), 1u, k == 0u);
        let c = (vec4<u32>(word_at(b + off)) >> SH8) & vec4<u32>(255u);
        let t = (((c * p3) & vec4<u32>(255u)) * 3u) >> vec4<u32>(8u);
        v[i] = d * ints(t, 1.0);
    }
    return v;
}
