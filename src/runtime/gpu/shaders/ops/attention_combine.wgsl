// Merges attention.wgsl's splits: with M = max_s m_s, out[d] = sum_s exp(m_s - M) acc_s[d] /
// sum_s exp(m_s - M) l_s. One workgroup per (head, token); splits without positions (l = 0)
// contribute nothing. out: [tokens, heads, head_dim] f32.
//
// Token t (position pos0 + t) sees positions 0 ..= pos0 + t, so only the splits
// 0 ..= (pos0 + t) / chunk can hold any: the rest (all l = 0) are never read. The same sums
// in the same order as reading all of them, so the same bits; a decode step at position p
// reads p / chunk + 1 splits instead of all.

struct P {
    heads: u32,
    head_dim: u32,
    splits: u32,
    // Positions per split (attention.wgsl's chunk).
    chunk: u32,
}

@group(0) @binding(0) var<storage, read> part: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> p: P;
@group(0) @binding(3) var<uniform> step: Step;

const WG: u32 = 64u;
// Splits a decode or prefill graph uses, at most (attention_splits in backend.rs).
const MAX_SPLITS: u32 = 128u;
var<workgroup> ms: array<f32, MAX_SPLITS>;
var<workgroup> ws: array<f32, MAX_SPLITS>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let head = wid.x;
    let t = wid.y;
    if t >= step.n {
        return;
    }
    let hd = p.head_dim;
    let base = (t * p.heads + head) * p.splits;
    let used = min(p.splits, (step.pos0 + t) / max(p.chunk, 1u) + 1u);
    // Each split's m (or -inf-like where it has no position), then M, then its weight
    // exp(m_s - M), once per split in workgroup memory.
    for (var s = lid; s < used; s += WG) {
        let o = (base + s) * (hd + 2u);
        ms[s] = select(-3.4028234663852886e38, part[o], part[o + 1u] > 0.0);
    }
    workgroupBarrier();
    var mx = -3.4028234663852886e38;
    for (var s = 0u; s < used; s++) {
        mx = max(mx, ms[s]);
    }
    for (var s = lid; s < used; s += WG) {
        let o = (base + s) * (hd + 2u);
        ws[s] = select(0.0, exp(ms[s] - mx), part[o + 1u] > 0.0);
    }
    workgroupBarrier();
    var l = 0.0;
    for (var s = 0u; s < used; s++) {
        let o = (base + s) * (hd + 2u);
        if ws[s] > 0.0 {
            l += ws[s] * part[o + 1u];
        }
    }
    let inv = 1.0 / l;
    for (var d = lid; d < hd; d += WG) {
        var a = 0.0;
        for (var s = 0u; s < used; s++) {
            let w = ws[s];
            if w > 0.0 {
                a += w * part[(base + s) * (hd + 2u) + 2u + d];
            }
        }
        out[(t * p.heads + head) * hd + d] = a * inv;
    }
}
