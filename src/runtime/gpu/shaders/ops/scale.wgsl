// v[i] = v[i] * s, then, when cap > 0, v[i] = tanh(v[i] / cap) * cap: the embedding scale
// (Gemma's sqrt(n_embd), MiniCPM's scale_emb) and the logits' scale and soft cap.

struct P {
    n: u32,
    groups_x: u32,
    s: f32,
    cap: f32,
}

@group(0) @binding(0) var<storage, read_write> v: array<f32>;
@group(0) @binding(1) var<uniform> p: P;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.y * p.groups_x * 256u + gid.x;
    if i >= p.n {
        return;
    }
    var a = v[i] * p.s;
    if p.cap > 0.0 {
        a = tanh(a / p.cap) * p.cap;
    }
    v[i] = a;
}
