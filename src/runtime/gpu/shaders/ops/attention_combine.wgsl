// Merges the splits of attention.wgsl (or its variants): with M = max_s m_s,
// out[d] = sum_s exp(m_s - M) acc_s[d] / sum_s exp(m_s - M) l_s. One workgroup per
// (head, token); splits without positions (l = 0) contribute nothing. out: [tokens, heads,
// head_dim] f32.
//
// Token t (position pos = pos0 + t) sees positions 0 ..= pos, so only the splits
// 0 ..= pos / c can hold any, c = split_chunk(pos, splits, chunk, grain) (common.wgsl: the
// fixed chunk, or with grain > 0 the position-dependent one of attention_decode.wgsl): the
// rest are never read. Each split's m and l are read once, in parallel, into workgroup
// memory; each output dim's sum over the splits runs as SG interleaved partial sums (splits
// g, g + SG, ... by SG groups of invocations at once), added at the end in group order.

struct P {
    heads: u32,
    head_dim: u32,
    splits: u32,
    // Most positions per split (attention.wgsl's chunk).
    chunk: u32,
    // 0: every split has `chunk` positions; else attention_decode.wgsl's grain.
    grain: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> part: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> p: P;
@group(0) @binding(3) var<uniform> step: Step;

const WG: u32 = 256u;
// Output dims per pass (one per invocation of a group) and groups of invocations that share
// the splits.
const DW: u32 = 64u;
const SG: u32 = WG / DW;
// Splits a decode or prefill graph uses, at most (attention_splits in backend.rs).
const MAX_SPLITS: u32 = 128u;
var<workgroup> ms: array<f32, MAX_SPLITS>;
var<workgroup> ls: array<f32, MAX_SPLITS>;
var<workgroup> ws: array<f32, MAX_SPLITS>;
var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let head = wid.x;
    let t = wid.y;
    if t >= step.n {
        return;
    }
    let hd = p.head_dim;
    let base = (t * p.heads + head) * p.splits;
    let pos = step.pos0 + t;
    let c = split_chunk(pos, p.splits, max(p.chunk, 1u), p.grain);
    let used = min(p.splits, pos / max(c, 1u) + 1u);
    // Each split's m (or -inf-like where it has no position) and l, then M, then its weight
    // exp(m_s - M), once per split in workgroup memory.
    for (var i = lid; i < used; i += WG) {
        let o = (base + i) * (hd + 2u);
        let l = part[o + 1u];
        ms[i] = select(-3.4028234663852886e38, part[o], l > 0.0);
        ls[i] = l;
    }
    workgroupBarrier();
    // M and the weights' sum over the splits in four independent chains (a short dependency
    // chain; max is exact in any order, the sum's order is fixed).
    var m4 = vec4<f32>(-3.4028234663852886e38);
    var s = 0u;
    for (; s + 4u <= used; s += 4u) {
        m4 = max(m4, vec4<f32>(ms[s], ms[s + 1u], ms[s + 2u], ms[s + 3u]));
    }
    for (; s < used; s++) {
        m4.x = max(m4.x, ms[s]);
    }
    let mx = max(max(m4.x, m4.y), max(m4.z, m4.w));
    for (var i = lid; i < used; i += WG) {
        ws[i] = select(0.0, exp(ms[i] - mx), ls[i] > 0.0);
    }
    workgroupBarrier();
    var l4 = vec4<f32>(0.0);
    s = 0u;
    for (; s + 4u <= used; s += 4u) {
        let w = vec4<f32>(ws[s], ws[s + 1u], ws[s + 2u], ws[s + 3u]);
        let lv = vec4<f32>(ls[s], ls[s + 1u], ls[s + 2u], ls[s + 3u]);
        l4 += select(vec4<f32>(0.0), w * lv, w > vec4<f32>(0.0));
    }
    for (; s < used; s++) {
        if ws[s] > 0.0 {
            l4.x += ws[s] * ls[s];
        }
    }
    let inv = 1.0 / ((l4.x + l4.y) + (l4.z + l4.w));
    // Each output dim: invocation group g (of SG groups of DW) adds the weighted values of
    // splits g, g + SG, ... (their loads issued together: no branch between them, a split of
    // weight 0 adds 0); then group 0 adds the SG partial sums in order.
    let stride = hd + 2u;
    let g = lid / DW;
    for (var d0 = 0u; d0 < hd; d0 += DW) {
        let d = d0 + lid % DW;
        var a = 0.0;
        if d < hd {
            let o = base * stride + 2u + d;
            for (var i = g; i < used; i += SG) {
                a += select(0.0, ws[i] * part[o + i * stride], ws[i] > 0.0);
            }
        }
        red[lid] = a;
        workgroupBarrier();
        if g == 0u && d < hd {
            var sum = red[lid];
            for (var j = 1u; j < SG; j++) {
                sum += red[lid + j * DW];
            }
            out[(t * p.heads + head) * hd + d] = sum * inv;
        }
        workgroupBarrier();
    }
}
