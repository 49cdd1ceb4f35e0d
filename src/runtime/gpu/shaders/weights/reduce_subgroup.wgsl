// Reduction of matvec.wgsl / matvec_q6_k.wgsl / matmul.wgsl (each body defines
// rows_per_wg(), the workgroup's rows) with subgroup operations: subgroupAdd per
// accumulator, one partial per subgroup in workgroup memory, then `store_sums` (rows.wgsl or
// rows_swiglu.wgsl) stores what `total` adds of them. The subgroup size is read from the
// hardware (subgroup_id, num_subgroups), never assumed.

// wgpu's smallest subgroup is 4 invocations, so a workgroup holds at most WG / 4 subgroups.
const MAX_SUBGROUPS: u32 = WG / 4u;
var<workgroup> part: array<f32, NACC * MAX_SUBGROUPS>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    let row0 = (wid.y * params.groups_x + wid.x) * rows_per_wg();
    if row0 >= params.rows {
        return;
    }
    let t0 = wid.z * TOK;
    let acc = partials(lid, row0, t0);
    for (var i = 0u; i < NACC; i++) {
        let s = subgroupAdd(acc[i]);
        if lane == 0u {
            part[i * MAX_SUBGROUPS + sg] = s;
        }
    }
    workgroupBarrier();
    store_sums(lid, row0, t0, nsg);
}

// Accumulator i's sum over the workgroup: its nsg subgroup partials in subgroup order.
fn total(i: u32, nsg: u32) -> f32 {
    var total = 0.0;
    for (var k = 0u; k < nsg; k++) {
        total += part[i * MAX_SUBGROUPS + k];
    }
    return total;
}
