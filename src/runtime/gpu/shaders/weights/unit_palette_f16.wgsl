// The palette decoder as bundles made before 2026-12-06 carry it (unit_palette.wgsl reads
// f32 tables): the tables as stored, f16, decoded per entry; each index read on its own (two
// loads). Kept for the test that such a bundle still runs (weights::palette_f16_sources).
// Decoder: the bundle's palette layout (src/palette/mod.rs) at BITS bits per index: `data`
// holds the indices, each row's packed LSB-first at BITS bits (index c at bits c*BITS ..
// of the row's little-endian bit stream), rows K*BITS/8 bytes apart; with K a multiple of
// 32, unit u (indices 32u .. 32u+31) is exactly the BITS words at row word u*BITS. `aux`
// holds the tables of the groups this chunk touches, 2^BITS f16 each, two to a word; row r
// of the chunk uses table (r + p1) / p0 of them (p0 = group_size, p1 = row0 % group_size).
// Value: the table entry widened to f32, exact (PaletteView::row).

@group(0) @binding(1) var<storage, read> aux: array<u32>;

const MASK: u32 = (1u << BITS) - 1u;

// Index i (< 32) of the unit whose first word is `base`. An index may straddle two words;
// the second read may be the word after the unit (the next unit's, or the padding word).
fn index_at(base: u32, i: u32) -> u32 {
    let p = i * BITS;
    let wi = base + (p >> 5u);
    let s = p & 31u;
    return ((data[wi] >> s) | ((data[wi + 1u] << 1u) << (31u - s))) & MASK;
}

fn entry(g: u32, ix: u32) -> f32 {
    let h = (g << BITS) + ix;
    return f16_bits_to_f32((aux[h >> 1u] >> ((h & 1u) * 16u)) & 0xffffu);
}

fn unit(r: u32, u: u32) -> array<vec4<f32>, 8> {
    let base = (r * (params.cols / 32u) + u) * BITS;
    let g = (r + params.p1) / params.p0;
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = vec4<f32>(
            entry(g, index_at(base, 4u * i)),
            entry(g, index_at(base, 4u * i + 1u)),
            entry(g, index_at(base, 4u * i + 2u)),
            entry(g, index_at(base, 4u * i + 3u)),
        );
    }
    return v;
}

// quads(r, u, i), i < 4: unit(r, u)[i] and [i + 4] (matvec_quads.wgsl): indices 4i .. 4i+3
// and 16+4i .. 16+4i+3 of the unit, each table entry as `unit` decodes it.
fn quads(r: u32, u: u32, i: u32) -> Quads {
    let base = (r * (params.cols / 32u) + u) * BITS;
    let g = (r + params.p1) / params.p0;
    let a = 4u * i;
    let b = 16u + a;
    return Quads(
        vec4<f32>(
            entry(g, index_at(base, a)),
            entry(g, index_at(base, a + 1u)),
            entry(g, index_at(base, a + 2u)),
            entry(g, index_at(base, a + 3u)),
        ),
        vec4<f32>(
            entry(g, index_at(base, b)),
            entry(g, index_at(base, b + 1u)),
            entry(g, index_at(base, b + 2u)),
            entry(g, index_at(base, b + 3u)),
        ),
    );
}
