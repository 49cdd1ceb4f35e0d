// Merges attention.wgsl's splits: with M = max_s m_s, out[d] = sum_s exp(m_s - M) acc_s[d] /
// sum_s exp(m_s - M) l_s. One workgroup per (head, token); splits without positions (l = 0)
// contribute nothing. out: [tokens, heads, head_dim] f32.

struct P {
    heads: u32,
    head_dim: u32,
    splits: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> part: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> p: P;
@group(0) @binding(3) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let head = wid.x;
    let t = wid.y;
    if t >= step.n {
        return;
    }
    let hd = p.head_dim;
    let base = (t * p.heads + head) * p.splits;
    var mx = -3.4028234663852886e38;
    for (var s = 0u; s < p.splits; s++) {
        let o = (base + s) * (hd + 2u);
        if part[o + 1u] > 0.0 {
            mx = max(mx, part[o]);
        }
    }
    var l = 0.0;
    for (var s = 0u; s < p.splits; s++) {
        let o = (base + s) * (hd + 2u);
        if part[o + 1u] > 0.0 {
            l += exp(part[o] - mx) * part[o + 1u];
        }
    }
    let inv = 1.0 / l;
    for (var d = lid; d < hd; d += 64u) {
        var a = 0.0;
        for (var s = 0u; s < p.splits; s++) {
            let o = (base + s) * (hd + 2u);
            if part[o + 1u] > 0.0 {
                a += exp(part[o] - mx) * part[o + 2u + d];
            }
        }
        out[(t * p.heads + head) * hd + d] = a * inv;
    }
}
