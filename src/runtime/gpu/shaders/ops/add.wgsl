// Residual add: x[i] += y[i] * s (s = 1 when the architecture has no residual scale: the
// product is then exact and the sum is the CPU's x + y). n = p.n elements.

struct P {
    n: u32,
    groups_x: u32,
    s: f32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<uniform> p: P;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * p.groups_x * 256u + gid.x;
    if i >= p.n {
        return;
    }
    x[i] = x[i] + y[i] * p.s;
}
