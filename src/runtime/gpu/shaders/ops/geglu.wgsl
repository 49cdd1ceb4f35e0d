// GELU (tanh) gating in place, as ggml's CPU backend and lowbit's CPU backend compute it:
// g[i] = 0 when g[i] <= -10, g[i] * u[i] when g[i] >= 10, else table[f16(g[i])] * u[i],
// where table is ggml's gelu of every f16 value rounded to f16 (65,536 entries, two to a
// u32), computed on the host by the CPU backend's code and uploaded at load: both backends
// give the same bits for the same inputs.

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
@group(0) @binding(2) var<storage, read> table: array<u32>;
@group(0) @binding(3) var<uniform> p: P;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * p.groups_x * 256u + gid.x;
    if i >= p.n {
        return;
    }
    let x = g[i];
    var r = 0.0;
    if x >= 10.0 {
        r = x * u[i];
    } else if x > -10.0 {
        let h = f32_to_f16_bits(x);
        let e = (table[h >> 1u] >> ((h & 1u) * 16u)) & 0xffffu;
        r = f16_bits_to_f32(e) * u[i];
    }
    g[i] = r;
}
