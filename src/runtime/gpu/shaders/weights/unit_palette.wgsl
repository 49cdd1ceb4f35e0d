// Decoder: the bundle's palette layout (src/palette/mod.rs) at BITS bits per index: `data`
// holds the indices, each row's packed LSB-first at BITS bits (index c at bits c*BITS ..
// of the row's little-endian bit stream), rows K*BITS/8 bytes apart; with K a multiple of
// 32, unit u (indices 32u .. 32u+31) is exactly the BITS words at row word u*BITS. `aux`
// holds the tables of the groups this chunk touches, 2^BITS entries each, every entry the
// bundle's f16 widened to f32 by the host (exact, as PaletteView::row widens it); row r of
// the chunk uses table (r + p1) / p0 of them (p0 = group_size, p1 = row0 % group_size).
// Bundles made before 2026-12-06 carry the form that reads the f16 tables as stored
// (unit_palette_f16.wgsl); the host uploads a weight's tables the way its kernels read them
// (`table_f32` is the mark, weights::PALETTE_F32_MARK).

@group(0) @binding(1) var<storage, read> aux: array<u32>;

const MASK: u32 = (1u << BITS) - 1u;

// Indices a .. a+3 (a a multiple of 4, a + 3 < 32) of the unit whose first word is `base`,
// from one read of their 4 * BITS bits: one word where 4 * BITS divides 32 (BITS 1, 2, 4, 8:
// the four never straddle two words), else two; the second may be the word after the unit
// (the next unit's, or the padding word), and for s = 0 it contributes nothing (shifted
// out by 1 + 31).
fn four_at(base: u32, a: u32) -> vec4<u32> {
    let p = a * BITS;
    let wi = base + (p >> 5u);
    let s = p & 31u;
    var w = data[wi] >> s;
    if (32u % (4u * BITS)) != 0u {
        w = w | ((data[wi + 1u] << 1u) << (31u - s));
    }
    return vec4<u32>(w, w >> BITS, w >> (2u * BITS), w >> (3u * BITS)) & vec4<u32>(MASK);
}

// Entry ix of table g, one load.
fn table_f32(g: u32, ix: u32) -> f32 {
    return bitcast<f32>(aux[(g << BITS) + ix]);
}

fn entry4(g: u32, ix: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(
        table_f32(g, ix.x),
        table_f32(g, ix.y),
        table_f32(g, ix.z),
        table_f32(g, ix.w),
    );
}

fn unit(r: u32, u: u32) -> array<vec4<f32>, 8> {
    let base = (r * (params.cols / 32u) + u) * BITS;
    let g = (r + params.p1) / params.p0;
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = entry4(g, four_at(base, 4u * i));
    }
    return v;
}

// quads(r, u, i), i < 4: unit(r, u)[i] and [i + 4] (matvec_quads.wgsl): indices 4i .. 4i+3
// and 16+4i .. 16+4i+3 of the unit, each table entry as `unit` decodes it.
fn quads(r: u32, u: u32, i: u32) -> Quads {
    let base = (r * (params.cols / 32u) + u) * BITS;
    let g = (r + params.p1) / params.p0;
    return Quads(entry4(g, four_at(base, 4u * i)), entry4(g, four_at(base, 16u + 4u * i)));
}
