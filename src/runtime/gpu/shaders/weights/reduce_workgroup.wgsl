// Reduction of matvec.wgsl / matvec_q6_k.wgsl / matmul.wgsl (each body defines
// rows_per_wg(), the workgroup's rows) without subgroup operations: every invocation's
// partials in workgroup memory, then a tree of halving steps (WG a power of two), one
// barrier each; then `store_sums` (rows.wgsl or rows_swiglu.wgsl) stores the roots.

var<workgroup> red: array<f32, NACC * WG>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let row0 = (wid.y * params.groups_x + wid.x) * rows_per_wg();
    if row0 >= params.rows {
        return;
    }
    let t0 = wid.z * TOK;
    let acc = partials(lid, row0, t0);
    for (var i = 0u; i < NACC; i++) {
        red[i * WG + lid] = acc[i];
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            for (var i = 0u; i < NACC; i++) {
                red[i * WG + lid] += red[i * WG + lid + s];
            }
        }
        workgroupBarrier();
    }
    store_sums(lid, row0, t0, 1u);
}

// Accumulator i's sum over the workgroup (the tree's root; `nsg` unused).
fn total(i: u32, nsg: u32) -> f32 {
    return red[i * WG];
}
