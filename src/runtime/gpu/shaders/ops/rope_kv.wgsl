// RoPE on Q and K and the f16 KV store in one dispatch (op_rope then op_rope on K then
// op_kv_store, fused): Q rotated in place (then scaled, Gemma's Q scale), K rotated and,
// with V, rounded to f16 and stored into the layer's cache; the rotated K is not written
// back (nothing else reads it).
//
// q: [tokens, heads, head_dim] f32; k, v: [tokens, kv_heads, head_dim] f32; the caches
// [kv_heads, n_ctx, head_dim] f16, two to a u32 (element 2i in the low half), rounded to
// nearest even (f32_to_f16_bits). cos/sin: the host's table from the CPU backend's code,
// table[pos][i] = (cos theta_i, sin theta_i), n_rot / 2 pairs per position. Pairs are
// (2i, 2i + 1) (NORM) or (i, i + n_rot / 2) (NEOX); dims past n_rot are not rotated. Each
// value is computed with rope.wgsl's operations in its order (`(x0 c - x1 s) * scale`,
// `(x0 s + x1 c) * scale`, K's scale 1), so the results are op_rope's and op_kv_store's.
//
// One invocation per (token, j): j < heads * head_dim / 2 is a rotation pair of Q (as
// rope.wgsl); the next kv_heads * head_dim / 2 are the cache's pairs (2i, 2i + 1) of K and V
// (as kv_store.wgsl), each K element rotated from its own pair. Tokens at or past step.n
// (padding) are left alone. q, k and v are all declared read_write because the host may
// bind them as parts of one buffer (a stacked Q/K/V product's output), and a dispatch may
// not use one buffer both read-only and writable.

struct P {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    n_rot: u32,
    neox: u32,
    q_scale: f32,
    n_ctx: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read_write> q: array<f32>;
@group(0) @binding(1) var<storage, read_write> k: array<f32>;
@group(0) @binding(2) var<storage, read_write> v: array<f32>;
@group(0) @binding(3) var<storage, read> table: array<vec2<f32>>;
@group(0) @binding(4) var<storage, read_write> kc: array<u32>;
@group(0) @binding(5) var<storage, read_write> vc: array<u32>;
@group(0) @binding(6) var<uniform> p: P;
@group(0) @binding(7) var<uniform> step: Step;

// Element e of the K head at `base`, rotated for position `pos` (K's scale is 1).
fn k_rotated(base: u32, e: u32, pos: u32) -> f32 {
    let rot = p.n_rot / 2u;
    if e >= p.n_rot {
        return k[base + e] * 1.0;
    }
    var i: u32;
    var ia: u32;
    var ib: u32;
    if p.neox == 1u {
        i = select(e, e - rot, e >= rot);
        ia = i;
        ib = i + rot;
    } else {
        i = e / 2u;
        ia = 2u * i;
        ib = 2u * i + 1u;
    }
    let cs = table[pos * rot + i];
    let x0 = k[base + ia];
    let x1 = k[base + ib];
    if e == ia {
        return (x0 * cs.x - x1 * cs.y) * 1.0;
    }
    return (x0 * cs.y + x1 * cs.x) * 1.0;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half = p.head_dim / 2u;
    let nq = p.heads * half;
    let t = gid.y;
    let j = gid.x;
    if t >= step.n || j >= nq + p.kv_heads * half {
        return;
    }
    let pos = step.pos0 + t;
    let rot = p.n_rot / 2u;
    if j < nq {
        let head = j / half;
        let i = j % half;
        let base = (t * p.heads + head) * p.head_dim;
        if i < rot {
            var ia: u32;
            var ib: u32;
            if p.neox == 1u {
                ia = i;
                ib = i + rot;
            } else {
                ia = 2u * i;
                ib = 2u * i + 1u;
            }
            let cs = table[pos * rot + i];
            let x0 = q[base + ia];
            let x1 = q[base + ib];
            q[base + ia] = (x0 * cs.x - x1 * cs.y) * p.q_scale;
            q[base + ib] = (x0 * cs.y + x1 * cs.x) * p.q_scale;
        } else {
            let ia = p.n_rot + 2u * (i - rot);
            q[base + ia] = q[base + ia] * p.q_scale;
            q[base + ia + 1u] = q[base + ia + 1u] * p.q_scale;
        }
        return;
    }
    let jk = j - nq;
    let h = jk / half;
    let i = jk % half;
    let base = (t * p.kv_heads + h) * p.head_dim;
    let dst = (h * p.n_ctx + pos) * half + i;
    let k0 = k_rotated(base, 2u * i, pos);
    let k1 = k_rotated(base, 2u * i + 1u, pos);
    kc[dst] = f32_to_f16_bits(k0) | (f32_to_f16_bits(k1) << 16u);
    vc[dst] = f32_to_f16_bits(v[base + 2u * i]) | (f32_to_f16_bits(v[base + 2u * i + 1u]) << 16u);
}
