// RoPE in place on a [tokens, heads, head_dim] f32 buffer, then an optional scale of every
// element (Gemma's Q scale). cos/sin come from a table the host computed at load with the
// CPU backend's code (`cpu::rope_cache`, ggml's rope cache in f32): table[pos][i] =
// (cos theta_i, sin theta_i), n_rot / 2 pairs per position, so both backends rotate by the
// same f32 values. Pairs are (2i, 2i + 1) (NORM) or (i, i + n_rot / 2) (NEOX). One invocation
// per (token, head, pair of dims): pairs below n_rot / 2 rotate, the others (head_dim >
// n_rot) are only scaled. Tokens at or past step.n (padding) are left alone.

struct P {
    heads: u32,
    head_dim: u32,
    n_rot: u32,
    neox: u32,
    scale: f32,
    tokens: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read> table: array<vec2<f32>>;
@group(0) @binding(2) var<uniform> p: P;
@group(0) @binding(3) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half = p.head_dim / 2u;
    let per_token = p.heads * half;
    let t = gid.y;
    let j = gid.x;
    if t >= step.n || j >= per_token {
        return;
    }
    let head = j / half;
    let i = j % half;
    let base = (t * p.heads + head) * p.head_dim;
    let rot = p.n_rot / 2u;
    var ia: u32;
    var ib: u32;
    if i < rot {
        if p.neox == 1u {
            ia = i;
            ib = i + rot;
        } else {
            ia = 2u * i;
            ib = 2u * i + 1u;
        }
        let cs = table[(step.pos0 + t) * rot + i];
        let x0 = a[base + ia];
        let x1 = a[base + ib];
        a[base + ia] = (x0 * cs.x - x1 * cs.y) * p.scale;
        a[base + ib] = (x0 * cs.y + x1 * cs.x) * p.scale;
    } else {
        ia = p.n_rot + 2u * (i - rot);
        a[base + ia] = a[base + ia] * p.scale;
        a[base + ia + 1u] = a[base + ia + 1u] * p.scale;
    }
}
