// GELU (tanh) gating folded into the single-token product of a stacked gate/up weight
// (matvec_quads.wgsl with two rows a workgroup; in place of rows.wgsl), as rows_swiglu.wgsl
// folds SwiGLU: workgroup w (row0 = 2w) decodes gate row w and up row w + F (params.rows =
// 2F in one chunk) and stores at output row w geglu.wgsl's operations on the two sums:
// 0 when g <= -10, g * u when g >= 10, else gelu_table[f16(g)] * u. Each row's sum is the
// plain product's (same body, same order) and the gating is a table lookup, so the result
// has the bits of the product and then op_geglu. The host appends ops/common.wgsl's
// f32_to_f16_bits (weights/common.wgsl has the f16-to-f32 conversion).

// ggml's gelu of every f16 value rounded to f16, two to a u32 (the CPU backend's table,
// uploaded at load: geglu.wgsl's binding 2).
@group(0) @binding(7) var<storage, read> gelu_table: array<u32>;

fn weight_row(row0: u32, r: u32) -> u32 {
    return row0 / 2u + r * (params.rows / 2u);
}

fn store_sums(lid: u32, row0: u32, t0: u32, nsg: u32) {
    if lid == 0u && row0 < params.rows {
        let g = total(0u, nsg);
        let u = total(1u, nsg);
        var r = 0.0;
        if g >= 10.0 {
            r = g * u;
        } else if g > -10.0 {
            let h = f32_to_f16_bits(g);
            let e = (gelu_table[h >> 1u] >> ((h & 1u) * 16u)) & 0xffffu;
            r = f16_bits_to_f32(e) * u;
        }
        store_y(t0, params.row0 + row0 / 2u, r);
    }
}
