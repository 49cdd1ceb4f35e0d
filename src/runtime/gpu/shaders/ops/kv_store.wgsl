// Stores the chunk's K and V rows into one layer's f16 KV cache. k, v: [tokens, kv_heads,
// head_dim] f32; the caches: [kv_heads, n_ctx, head_dim] f16, two to a u32 (element 2i in the
// low half), rounded to nearest even (f32_to_f16_bits). One invocation per (token, kv head,
// pair of dims); padding tokens (at or past step.n) are not stored.

struct P {
    kv_heads: u32,
    head_dim: u32,
    n_ctx: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> k: array<f32>;
@group(0) @binding(1) var<storage, read> v: array<f32>;
@group(0) @binding(2) var<storage, read_write> kc: array<u32>;
@group(0) @binding(3) var<storage, read_write> vc: array<u32>;
@group(0) @binding(4) var<uniform> p: P;
@group(0) @binding(5) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half = p.head_dim / 2u;
    let t = gid.y;
    let j = gid.x;
    if t >= step.n || j >= p.kv_heads * half {
        return;
    }
    let h = j / half;
    let i = j % half;
    let pos = step.pos0 + t;
    let src = (t * p.kv_heads + h) * p.head_dim + 2u * i;
    let dst = (h * p.n_ctx + pos) * half + i;
    kc[dst] = f32_to_f16_bits(k[src]) | (f32_to_f16_bits(k[src + 1u]) << 16u);
    vc[dst] = f32_to_f16_bits(v[src]) | (f32_to_f16_bits(v[src + 1u]) << 16u);
}
