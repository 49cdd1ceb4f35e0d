// Attention over the f16 KV cache, split along the sequence (flash-decoding): workgroup
// (head, split, token) takes positions [split * chunk, (split + 1) * chunk) clipped to the
// token's range lo..=pos (pos = step.pos0 + token; lo = pos + 1 - window on a sliding-window
// layer, else 0) and writes its partial softmax state: the running max m of the scores
// s_j = (q . k_j) * kq_scale, l = sum_j exp(s_j - m), acc[d] = sum_j exp(s_j - m) v_j[d].
// attention_combine.wgsl merges the splits. A split with no position writes m = -inf, l = 0.
//
// Inside a split, positions go in tiles of WG: invocation i scores position tile + i (a dot
// of head_dim terms, q read from workgroup memory), then every invocation updates the
// head_dim / WG output dims it owns with the tile's weights (online softmax: the running sum
// and accumulators are rescaled by exp(m_old - m_new) when the max grows). exp is WGSL's
// precise exp (no fast-math approximations).
//
// q: [tokens, heads, head_dim] f32; caches [kv_heads, n_ctx, head_dim] f16 pairs in u32
// (kv_store.wgsl); part: [tokens, heads, splits, head_dim + 2] f32 (m, l, acc).

struct P {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    n_ctx: u32,
    splits: u32,
    chunk: u32,
    // 0: every earlier position
    window: u32,
    kq_scale: f32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<u32>;
@group(0) @binding(2) var<storage, read> vc: array<u32>;
@group(0) @binding(3) var<storage, read_write> part: array<f32>;
@group(0) @binding(4) var<uniform> p: P;
@group(0) @binding(5) var<uniform> step: Step;

const WG: u32 = 64u;
// head_dim up to 256: each invocation owns at most 256 / WG output dims.
const MAX_HD: u32 = 256u;
const DIMS: u32 = MAX_HD / WG;

var<workgroup> qs: array<f32, MAX_HD>;
var<workgroup> sc: array<f32, WG>;
var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let head = wid.x;
    let split = wid.y;
    let t = wid.z;
    if t >= step.n {
        return;
    }
    let hd = p.head_dim;
    let half = hd / 2u;
    let pos = step.pos0 + t;
    var lo = 0u;
    if p.window > 0u && pos + 1u > p.window {
        lo = pos + 1u - p.window;
    }
    let start = max(lo, split * p.chunk);
    let end = min(pos + 1u, (split + 1u) * p.chunk);
    let out = ((t * p.heads + head) * p.splits + split) * (hd + 2u);
    let kvh = head / (p.heads / p.kv_heads);
    let cbase = kvh * p.n_ctx * half;
    for (var d = lid; d < hd; d += WG) {
        qs[d] = q[(t * p.heads + head) * hd + d];
    }
    workgroupBarrier();
    var m = -3.4028234663852886e38;
    var l = 0.0;
    var acc: array<f32, DIMS>;
    var any = false;
    // Workgroup-uniform loop bounds (start and end depend only on the workgroup).
    for (var tile = start; tile < end; tile += WG) {
        let j = tile + lid;
        var s = -3.4028234663852886e38;
        if j < end {
            var dotv = 0.0;
            let row = cbase + j * half;
            for (var i = 0u; i < half; i++) {
                let kk = kc[row + i];
                dotv += qs[2u * i] * f16_bits_to_f32(kk & 0xffffu)
                    + qs[2u * i + 1u] * f16_bits_to_f32(kk >> 16u);
            }
            s = dotv * p.kq_scale;
        }
        sc[lid] = s;
        red[lid] = s;
        workgroupBarrier();
        for (var k = WG / 2u; k > 0u; k >>= 1u) {
            if lid < k {
                red[lid] = max(red[lid], red[lid + k]);
            }
            workgroupBarrier();
        }
        let m_new = max(m, red[0]);
        let corr = exp(m - m_new);
        let n_tile = min(WG, end - tile);
        var lt = 0.0;
        for (var i = 0u; i < DIMS; i++) {
            acc[i] *= corr;
        }
        for (var jj = 0u; jj < n_tile; jj++) {
            let w = exp(sc[jj] - m_new);
            lt += w;
            let row = cbase + (tile + jj) * half;
            for (var i = 0u; i < DIMS; i++) {
                let d = lid + i * WG;
                if d < hd {
                    let vv = vc[row + d / 2u];
                    acc[i] += w * f16_bits_to_f32((vv >> ((d & 1u) * 16u)) & 0xffffu);
                }
            }
        }
        l = l * corr + lt;
        m = m_new;
        any = true;
        workgroupBarrier();
    }
    if lid == 0u {
        part[out] = select(-3.4028234663852886e38, m, any);
        part[out + 1u] = l;
    }
    for (var i = 0u; i < DIMS; i++) {
        let d = lid + i * WG;
        if d < hd {
            part[out + 2u + d] = acc[i];
        }
    }
}
