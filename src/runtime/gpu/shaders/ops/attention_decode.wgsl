// Attention of one decode step over the f16 KV cache, split along the sequence
// (flash-decoding), with RoPE and the KV store folded in and subgroup operations (needs the
// SUBGROUP feature and subgroups of at least LANES invocations; the path without them is
// rope_kv.wgsl, then attention.wgsl). Writes the partial softmax state of attention.wgsl,
// which attention_combine.wgsl merges: workgroup (head, split) writes m = max_j s_j,
// l = sum_j exp(s_j - m) and acc[d] = sum_j exp(s_j - m) v_j[d] over its positions j,
// s_j = (q . k_j) * kq_scale.
//
// One token (position pos = step.pos0; a prefill chunk's tokens would need each other's keys
// in the cache). What differs from rope_kv.wgsl + attention.wgsl, for the few, latency-bound
// workgroups of a decode step:
// - RoPE in the workgroup: q is rotated (and scaled by q_scale) while it is staged, with
//   rope_kv.wgsl's operations in its order; the token's own key (rotated) and value are
//   rounded to f16 into workgroup memory and used for position pos, and the workgroup of the
//   KV head's first query head whose split holds pos stores them into the cache row pos for
//   later steps (no workgroup of this dispatch reads that row from the cache). One dispatch
//   less per layer.
// - Positions per split follow the position (`split_chunk` in common.wgsl, with the host's
//   grain; grain 0 gives the fixed `chunk`, as the combine reads it): ceil((pos + 1) / splits)
//   rounded up to a multiple of grain, at most `chunk`; attention.wgsl gives each split
//   `chunk` positions whatever the position, so early in a long context a few workgroups did
//   all the work (at position 512 of 64 splits: 33 splits of 16 positions instead of 9 of 64).
//   A split of more than WG positions (contexts past 8192) takes them in tiles of WG.
// - Each score is one cluster of LANES invocations (consecutive lanes of one subgroup, by
//   subgroup_invocation_id: the shuffles exchange by lane): lane c of the cluster takes the key's
//   words c, c + LANES, ... (adjacent lanes, adjacent words: one coalesced read per key) and
//   the cluster adds its partial dots with three subgroupShuffleXor steps; WG / LANES
//   positions per pass. attention.wgsl had each invocation walk a whole key alone.
// - The tile's max and the sum of its weights by subgroupMax / subgroupAdd, one partial per
//   subgroup in workgroup memory (the subgroup size is read from the hardware).
// The weighted sum of values is attention.wgsl's (each invocation owns pairs of output dims).
// exp is WGSL's precise exp. head_dim is a multiple of 8, at most MAX_HD.
//
// q: [1, heads, head_dim] f32 and k, v: [1, kv_heads, head_dim] f32, before RoPE; table:
// rope_kv.wgsl's (cos, sin) per position and pair; caches [kv_heads, n_ctx, head_dim] f16
// pairs in u32 (kv_store.wgsl); part: [1, heads, splits, head_dim + 2] f32 (m, l, acc).

struct P {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    n_ctx: u32,
    splits: u32,
    // Most positions per split (n_ctx / splits, rounded up).
    chunk: u32,
    // 0: every earlier position
    window: u32,
    kq_scale: f32,
    // Positions per split are a multiple of this (`split_chunk`; 0: the fixed chunk).
    grain: u32,
    // RoPE (rope_kv.wgsl): rotated dims, 1 for NEOX pairs, Q's scale.
    n_rot: u32,
    neox: u32,
    q_scale: f32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read> table: array<vec2<f32>>;
@group(0) @binding(4) var<storage, read_write> kc: array<u32>;
@group(0) @binding(5) var<storage, read_write> vc: array<u32>;
@group(0) @binding(6) var<storage, read_write> part: array<f32>;
@group(0) @binding(7) var<uniform> p: P;
@group(0) @binding(8) var<uniform> step: Step;

const WG: u32 = 64u;
// Invocations per score (a power of two; every subgroup this kernel runs in holds whole
// clusters: the host uses it only where the smallest subgroup has at least LANES).
const LANES: u32 = 8u;
const MAX_HD: u32 = 256u;
// wgpu's smallest subgroup is 4 invocations.
const MAX_SUBGROUPS: u32 = WG / 4u;
const NEG_BIG: f32 = -3.4028234663852886e38;

fn pair_f32(w: u32) -> vec2<f32> {
    return vec2<f32>(f16_bits_to_f32(w & 0xffffu), f16_bits_to_f32(w >> 16u));
}

// For a rotated element e (< n_rot): its pair's index i in the table and the pair (ia, ib):
// (2i, 2i + 1), or (i, i + n_rot / 2) for NEOX (rope_kv.wgsl).
fn rope_pair(e: u32) -> vec3<u32> {
    let rot = p.n_rot / 2u;
    if p.neox == 1u {
        let i = select(e, e - rot, e >= rot);
        return vec3<u32>(i, i, i + rot);
    }
    let i = e / 2u;
    return vec3<u32>(i, 2u * i, 2u * i + 1u);
}

// Element e of query head `head`, rotated for position pos and scaled by q_scale: the
// operations of rope_kv.wgsl in its order.
fn q_rotated(head: u32, e: u32, pos: u32) -> f32 {
    let base = head * p.head_dim;
    if e >= p.n_rot {
        return q[base + e] * p.q_scale;
    }
    let r = rope_pair(e);
    let cs = table[pos * (p.n_rot / 2u) + r.x];
    let x0 = q[base + r.y];
    let x1 = q[base + r.z];
    if e == r.y {
        return (x0 * cs.x - x1 * cs.y) * p.q_scale;
    }
    return (x0 * cs.y + x1 * cs.x) * p.q_scale;
}

// Element e of KV head `kvh`'s key, rotated for position pos (K's scale is 1), as
// rope_kv.wgsl's k_rotated.
fn k_rotated(kvh: u32, e: u32, pos: u32) -> f32 {
    let base = kvh * p.head_dim;
    if e >= p.n_rot {
        return k[base + e] * 1.0;
    }
    let r = rope_pair(e);
    let cs = table[pos * (p.n_rot / 2u) + r.x];
    let x0 = k[base + r.y];
    let x1 = k[base + r.z];
    if e == r.y {
        return (x0 * cs.x - x1 * cs.y) * 1.0;
    }
    return (x0 * cs.y + x1 * cs.x) * 1.0;
}

var<workgroup> qs: array<f32, MAX_HD>;
// The token's own key (rotated) and value as f16 pairs.
var<workgroup> kf: array<u32, MAX_HD / 2u>;
var<workgroup> vf: array<u32, MAX_HD / 2u>;
var<workgroup> sc: array<f32, WG>;
var<workgroup> red: array<f32, MAX_SUBGROUPS>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(num_subgroups) nsg: u32,
    @builtin(subgroup_size) sg_size: u32,
) {
    let head = wid.x;
    let split = wid.y;
    let hd = p.head_dim;
    let half = hd / 2u;
    let pos = step.pos0;
    var lo = 0u;
    if p.window > 0u && pos + 1u > p.window {
        lo = pos + 1u - p.window;
    }
    let c = split_chunk(pos, p.splits, p.chunk, p.grain);
    let start = max(lo, split * c);
    let end = min(pos + 1u, (split + 1u) * c);
    let out = (head * p.splits + split) * (hd + 2u);
    let group = p.heads / p.kv_heads;
    let kvh = head / group;
    let cbase = kvh * p.n_ctx * half;
    let kbase = kvh * hd;
    for (var d = lid; d < hd; d += WG) {
        qs[d] = q_rotated(head, d, pos);
    }
    for (var i = lid; i < half; i += WG) {
        kf[i] = f32_to_f16_bits(k_rotated(kvh, 2u * i, pos)) | (f32_to_f16_bits(k_rotated(kvh, 2u * i + 1u, pos)) << 16u);
        vf[i] = f32_to_f16_bits(v[kbase + 2u * i]) | (f32_to_f16_bits(v[kbase + 2u * i + 1u]) << 16u);
    }
    workgroupBarrier();
    // The KV store: once per KV head, by the split that holds pos.
    if head % group == 0u && split == pos / c {
        for (var i = lid; i < half; i += WG) {
            kc[cbase + pos * half + i] = kf[i];
            vc[cbase + pos * half + i] = vf[i];
        }
    }
    // Clusters by subgroup lane (sg_size is a multiple of LANES here), WG / LANES of them.
    let cluster = (sg * sg_size + lane) / LANES;
    let cl = lane % LANES;
    var m = NEG_BIG;
    var l = 0.0;
    var acc0 = vec2<f32>(0.0);
    var acc1 = vec2<f32>(0.0);
    var any = false;
    // Workgroup-uniform loop bounds (start and end depend only on the workgroup), so the
    // subgroup operations below run in uniform control flow.
    for (var tile = start; tile < end; tile += WG) {
        let n_tile = min(WG, end - tile);
        // Scores: pass pp takes positions tile + pp .. + WG / LANES, one per cluster. A
        // cluster past the end scores the last position again and discards it.
        for (var pp = 0u; pp < n_tile; pp += WG / LANES) {
            let jl = pp + cluster;
            let j = tile + min(jl, n_tile - 1u);
            let row = cbase + j * half;
            var dotv = 0.0;
            if j == pos {
                for (var w = cl; w < half; w += LANES) {
                    let kw = kf[w];
                    dotv += qs[2u * w] * f16_bits_to_f32(kw & 0xffffu) + qs[2u * w + 1u] * f16_bits_to_f32(kw >> 16u);
                }
            } else {
                for (var w = cl; w < half; w += LANES) {
                    let kw = kc[row + w];
                    dotv += qs[2u * w] * f16_bits_to_f32(kw & 0xffffu) + qs[2u * w + 1u] * f16_bits_to_f32(kw >> 16u);
                }
            }
            dotv += subgroupShuffleXor(dotv, 1u);
            dotv += subgroupShuffleXor(dotv, 2u);
            dotv += subgroupShuffleXor(dotv, 4u);
            if cl == 0u && jl < n_tile {
                sc[jl] = dotv * p.kq_scale;
            }
        }
        workgroupBarrier();
        // Invocation lid holds position tile + lid: the tile's max, then its weight.
        let s = select(NEG_BIG, sc[lid], lid < n_tile);
        let smax = subgroupMax(s);
        if lane == 0u {
            red[sg] = smax;
        }
        workgroupBarrier();
        var tmax = red[0];
        for (var i = 1u; i < nsg; i++) {
            tmax = max(tmax, red[i]);
        }
        let m_new = max(m, tmax);
        let corr = exp(m - m_new);
        let wgt = select(0.0, exp(s - m_new), lid < n_tile);
        // Every invocation has read red and its own score before they are overwritten.
        workgroupBarrier();
        sc[lid] = wgt;
        let ssum = subgroupAdd(wgt);
        if lane == 0u {
            red[sg] = ssum;
        }
        workgroupBarrier();
        var lt = red[0];
        for (var i = 1u; i < nsg; i++) {
            lt += red[i];
        }
        acc0 *= corr;
        acc1 *= corr;
        let pair0 = lid;
        let pair1 = lid + WG;
        // Positions from the cache; pos itself (the last position, in the last tile of the
        // split that holds it) from vf.
        let own = tile + n_tile == pos + 1u;
        let n_cache = select(n_tile, n_tile - 1u, own);
        var jj = 0u;
        for (; jj + 4u <= n_cache; jj += 4u) {
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
        for (; jj < n_cache; jj++) {
            let row = cbase + (tile + jj) * half;
            let w = sc[jj];
            if pair0 < half {
                acc0 += w * pair_f32(vc[row + pair0]);
            }
            if pair1 < half {
                acc1 += w * pair_f32(vc[row + pair1]);
            }
        }
        if own {
            let w = sc[n_cache];
            if pair0 < half {
                acc0 += w * pair_f32(vf[pair0]);
            }
            if pair1 < half {
                acc1 += w * pair_f32(vf[pair1]);
            }
        }
        l = l * corr + lt;
        m = m_new;
        any = true;
        workgroupBarrier();
    }
    if lid == 0u {
        part[out] = select(NEG_BIG, m, any);
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
