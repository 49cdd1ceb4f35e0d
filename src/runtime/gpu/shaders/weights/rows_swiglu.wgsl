// SwiGLU folded into the single-token product of a stacked gate/up weight (matvec_quads.wgsl
// with two rows a workgroup; in place of rows.wgsl): the weight's rows are the F gate rows,
// then the F up rows (params.rows = 2F in one chunk), the grid has F workgroups and
// workgroup w (row0 = 2w) decodes gate row w and up row w + F into its two accumulators. It
// stores one value, swiglu.wgsl's silu(g) * u in its operations, at output row w: the gate
// part of y (params.seg1 = F), where op_swiglu would leave it. Each row's sum is the plain
// product's (same body, same order), so the result has the bits of the product and then
// op_swiglu.

fn weight_row(row0: u32, r: u32) -> u32 {
    return row0 / 2u + r * (params.rows / 2u);
}

fn store_sums(lid: u32, row0: u32, t0: u32, nsg: u32) {
    if lid == 0u && row0 < params.rows {
        let g = total(0u, nsg);
        let u = total(1u, nsg);
        store_y(t0, params.row0 + row0 / 2u, (g / (1.0 + exp(-g))) * u);
    }
}
