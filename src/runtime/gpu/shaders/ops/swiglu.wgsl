// SwiGLU in place: g[i] = silu(g[i]) * u[i], silu(x) = x / (1 + exp(-x)) (the CPU backend's
// formula; WGSL's precise exp). n = p.n elements.

struct P {
    n: u32,
    groups_x: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read_write> g: array<f32>;
// read_write though only read: the host may bind g and u as the two parts of one buffer (the
// stacked gate/up product's output), and a dispatch may not use one buffer both read-only
// and writable.
@group(0) @binding(1) var<storage, read_write> u: array<f32>;
@group(0) @binding(2) var<uniform> p: P;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * p.groups_x * 256u + gid.x;
    if i >= p.n {
        return;
    }
    let x = g[i];
    g[i] = (x / (1.0 + exp(-x))) * u[i];
}
