// Reduction of ternary_matvec.wgsl without subgroup operations (adapters without SUBGROUP):
// every invocation's partials in workgroup memory, then a tree of halving steps (WG a power
// of two), one barrier each.

var<workgroup> red: array<f32, ROWS * WG>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let row0 = (wid.y * params.groups_x + wid.x) * ROWS;
    if row0 >= params.rows {
        return;
    }
    let acc = row_partials(lid, row0);
    for (var r = 0u; r < ROWS; r++) {
        red[r * WG + lid] = acc[r];
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            for (var r = 0u; r < ROWS; r++) {
                red[r * WG + lid] += red[r * WG + lid + s];
            }
        }
        workgroupBarrier();
    }
    if lid < ROWS && row0 + lid < params.rows {
        store_y(row0 + lid, red[lid * WG]);
    }
}
