// Attention over the f16 KV cache, split along the sequence (flash-decoding): workgroup
// (head, split, token) takes positions [split * chunk, (split + 1) * chunk) clipped to the
// token's range lo..=pos (pos = step.pos0 + token; lo = pos + 1 - window on a sliding-window
// layer, else 0) and writes its partial softmax state: the running max m of the scores
// s_j = (q . k_j) * kq_scale, l = sum_j exp(s_j - m), acc[d] = sum_j exp(s_j - m) v_j[d].
// attention_combine.wgsl merges the splits. A split with no position writes m = -inf, l = 0.
//
// Inside a split, positions go in tiles of WG: invocation i scores position tile + i (a dot
// of head_dim terms, q read from workgroup memory, the key's words loaded four at a time),
// the tile's max is reduced in workgroup memory, invocation i turns its score into its
// weight exp(s - m_new) once, and every invocation then adds the tile's weighted values into
// the pairs of output dims it owns (one u32 of two f16 per position and pair; online softmax:
// the running sum and accumulators are rescaled by exp(m_old - m_new) when the max grows).
// exp is WGSL's precise exp (no fast-math approximations). head_dim is a multiple of 8.
// Prefill chunks use attention_group.wgsl instead where query heads share a KV head: the same
// arithmetic per head, one workgroup for several heads.
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
// head_dim up to 256: each invocation owns at most 2 pairs of output dims (MAX_HD / 2 / WG).
const MAX_HD: u32 = 256u;

// The two f16 of a cache word as f32 (element 2i in the low half), exactly.
fn pair_f32(w: u32) -> vec2<f32> {
    return vec2<f32>(f16_bits_to_f32(w & 0xffffu), f16_bits_to_f32(w >> 16u));
}

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
    // Output dims 2 (lid + i WG) and 2 (lid + i WG) + 1 for i < PAIRS.
    var acc0 = vec2<f32>(0.0);
    var acc1 = vec2<f32>(0.0);
    var any = false;
    // Workgroup-uniform loop bounds (start and end depend only on the workgroup).
    for (var tile = start; tile < end; tile += WG) {
        let j = tile + lid;
        var s = -3.4028234663852886e38;
        if j < end {
            var dotv = 0.0;
            let row = cbase + j * half;
            for (var i = 0u; i < half; i += 4u) {
                let k0 = kc[row + i];
                let k1 = kc[row + i + 1u];
                let k2 = kc[row + i + 2u];
                let k3 = kc[row + i + 3u];
                let e = 2u * i;
                dotv += (qs[e] * f16_bits_to_f32(k0 & 0xffffu) + qs[e + 1u] * f16_bits_to_f32(k0 >> 16u))
                    + (qs[e + 2u] * f16_bits_to_f32(k1 & 0xffffu) + qs[e + 3u] * f16_bits_to_f32(k1 >> 16u));
                dotv += (qs[e + 4u] * f16_bits_to_f32(k2 & 0xffffu) + qs[e + 5u] * f16_bits_to_f32(k2 >> 16u))
                    + (qs[e + 6u] * f16_bits_to_f32(k3 & 0xffffu) + qs[e + 7u] * f16_bits_to_f32(k3 >> 16u));
            }
            s = dotv * p.kq_scale;
        }
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
        // This position's weight, once.
        sc[lid] = select(0.0, exp(s - m_new), j < end);
        workgroupBarrier();
        var lt = 0.0;
        for (var jj = 0u; jj < n_tile; jj++) {
            lt += sc[jj];
        }
        acc0 *= corr;
        acc1 *= corr;
        let pair0 = lid;
        let pair1 = lid + WG;
        var jj = 0u;
        for (; jj + 4u <= n_tile; jj += 4u) {
            let row = cbase + (tile + jj) * half;
            let w = vec4<f32>(sc[jj], sc[jj + 1u], sc[jj + 2u], sc[jj + 3u]);
            if pair0 < half {
                let v0 = vc[row + pair0];
                let v1 = vc[row + half + pair0];
                let v2 = vc[row + 2u * half + pair0];
                let v3 = vc[row + 3u * half + pair0];
                acc0 += w.x * pair_f32(v0) + w.y * pair_f32(v1) + w.z * pair_f32(v2) + w.w * pair_f32(v3);
            }
            if pair1 < half {
                let v0 = vc[row + pair1];
                let v1 = vc[row + half + pair1];
                let v2 = vc[row + 2u * half + pair1];
                let v3 = vc[row + 3u * half + pair1];
                acc1 += w.x * pair_f32(v0) + w.y * pair_f32(v1) + w.z * pair_f32(v2) + w.w * pair_f32(v3);
            }
        }
        for (; jj < n_tile; jj++) {
            let row = cbase + (tile + jj) * half;
            let w = sc[jj];
            if pair0 < half {
                acc0 += w * pair_f32(vc[row + pair0]);
            }
            if pair1 < half {
                acc1 += w * pair_f32(vc[row + pair1]);
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
    if lid < half {
        part[out + 2u + 2u * lid] = acc0.x;
        part[out + 3u + 2u * lid] = acc0.y;
    }
    if lid + WG < half {
        part[out + 2u + 2u * (lid + WG)] = acc1.x;
        part[out + 3u + 2u * (lid + WG)] = acc1.y;
    }
}
