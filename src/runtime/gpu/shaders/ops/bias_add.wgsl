// Bias: y[t, i] += b[i] for the rows t of a [tokens, len] buffer (Qwen2's Q/K/V biases).

struct P {
    n: u32,
    groups_x: u32,
    len: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<uniform> p: P;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * p.groups_x * 256u + gid.x;
    if i >= p.n {
        return;
    }
    y[i] = y[i] + b[i % p.len];
}
