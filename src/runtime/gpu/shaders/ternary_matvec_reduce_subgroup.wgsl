// Reduction of ternary_matvec.wgsl with subgroup operations: subgroupAdd per row, one
// partial per subgroup in workgroup memory, then one invocation per row adds them. The
// subgroup size is read from the hardware (subgroup_id, num_subgroups), never assumed:
// 8 on lavapipe, 32 on NVIDIA and Apple, 64 on AMD.

// wgpu's smallest subgroup is 4 invocations, so a workgroup holds at most WG / 4 subgroups.
const MAX_SUBGROUPS: u32 = WG / 4u;
var<workgroup> part: array<f32, ROWS * MAX_SUBGROUPS>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    let row0 = (wid.y * params.groups_x + wid.x) * ROWS;
    if row0 >= params.rows {
        return;
    }
    let acc = row_partials(lid, row0);
    for (var r = 0u; r < ROWS; r++) {
        let s = subgroupAdd(acc[r]);
        if lane == 0u {
            part[r * MAX_SUBGROUPS + sg] = s;
        }
    }
    workgroupBarrier();
    if lid < ROWS && row0 + lid < params.rows {
        var total = 0.0;
        for (var i = 0u; i < nsg; i++) {
            total += part[lid * MAX_SUBGROUPS + i];
        }
        store_y(row0 + lid, total);
    }
}
