// The rows of a product's workgroup and how their sums are stored (matvec.wgsl,
// matvec_quads.wgsl, matvec_q8_0.wgsl, matvec_q4_k.wgsl, matvec_q6_k.wgsl, matmul.wgsl with
// either reduction; the SwiGLU form of the single-token product is rows_swiglu.wgsl).

// The weight row that accumulator row r of the workgroup starting at row0 decodes
// (matvec_quads.wgsl, matvec_q8_0.wgsl, matvec_q4_k.wgsl, matvec_q6_k.wgsl): rows past
// params.wg_rows read the workgroup's last row again, and none past the chunk.
fn weight_row(row0: u32, r: u32) -> u32 {
    return min(row0 + min(r, params.wg_rows - 1u), params.rows - 1u);
}

// Invocation lid < NACC stores accumulator lid: row lid / TOK of the workgroup, token
// lid % TOK (store.wgsl's epilogues), its sum from the reduction's `total`.
fn store_sums(lid: u32, row0: u32, t0: u32, nsg: u32) {
    if lid < NACC {
        let r = lid / TOK;
        let t = lid % TOK;
        if r < rows_per_wg() && row0 + r < params.rows && t0 + t < params.n_tokens {
            store_y(t0 + t, params.row0 + row0 + r, total(lid, nsg));
        }
    }
}
