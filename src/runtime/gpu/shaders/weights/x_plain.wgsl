// How matvec_quads.wgsl reads x in its plain kernels: as it is.

fn x_begin(lid: u32) {}

fn x_at(j: u32) -> vec4<f32> {
    return x[j];
}
