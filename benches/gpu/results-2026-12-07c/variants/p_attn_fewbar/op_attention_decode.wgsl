// op_attention_decode: src/runtime/gpu/shaders/ops/common.wgsl + attention_decode.wgsl
// Shared by every op module (prepended by the registry, src/runtime/gpu/ops.rs).
//
// Step: written by the host before each submission (queue.write_buffer, ordered before the
// submission's commands), so one set of bind groups made at load serves every step.
struct Step {
    // Position of the chunk's first token.
    pos0: u32,
    // Tokens of the chunk that are real (the rest of the bucket is padding, never stored).
    n: u32,
    _pad0: u32,
    _pad1: u32,
}

// Positions per split of the split attention for a token at position pos
// (attention_decode.wgsl, attention_combine.wgsl): `chunk`, the splits' fixed size, where
// grain is 0; else ceil((pos + 1) / splits) rounded up to a multiple of grain, at most chunk
// (splits * chunk >= n_ctx > pos, so every position has a split): early in a long context the
// positions go to ceil((pos + 1) / c) splits of c instead of a few splits of `chunk` (at
// position 512 with 64 splits and grain 8, 33 splits of 16 instead of 9 of 64).
fn split_chunk(pos: u32, splits: u32, chunk: u32, grain: u32) -> u32 {
    if grain == 0u {
        return chunk;
    }
    let even = pos / splits + 1u;
    return min(chunk, (even + grain - 1u) / grain * grain);
}

// IEEE binary16 bits (low 16 bits of h) to f32, exactly, with integer operations (no
// SHADER_F16 feature, no denormal flushing).
fn f16_bits_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if e == 0u {
        return bitcast<f32>(sign | bitcast<u32>(f32(m) * 5.9604644775390625e-8));
    }
    if e == 31u {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

// f32 to IEEE binary16 bits, rounded to nearest, ties to even (as the `half` crate and the
// CPU backend's KV cache round), with integer operations: exact on every adapter, where
// pack2x16float leaves the rounding to the implementation.
fn f32_to_f16_bits(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    let sign = (x >> 16u) & 0x8000u;
    let ax = x & 0x7fffffffu;
    if ax >= 0x7f800000u {
        // inf, or NaN (quiet, top payload bits kept)
        return sign | 0x7c00u | select(0u, 0x200u | ((ax >> 13u) & 0x3ffu), ax > 0x7f800000u);
    }
    if ax >= 0x477ff000u {
        // 65520 and above round to inf
        return sign | 0x7c00u;
    }
    if ax < 0x38800000u {
        // below 2^-14: a subnormal f16 (units of 2^-24) or zero
        if ax < 0x33000000u {
            return sign;
        }
        let e = ax >> 23u;
        let m = (ax & 0x7fffffu) | 0x800000u;
        let shift = 126u - e;
        let q = m >> shift;
        let rem = m & ((1u << shift) - 1u);
        let half = 1u << (shift - 1u);
        var r = q;
        if rem > half || (rem == half && (q & 1u) == 1u) {
            r += 1u;
        }
        return sign | r;
    }
    var r = (ax - 0x38000000u) >> 13u;
    let rem = ax & 0x1fffu;
    if rem > 0x1000u || (rem == 0x1000u && (r & 1u) == 1u) {
        r += 1u;
    }
    return sign | r;
}

// Attention of one decode step over the f16 KV cache, split along the sequence
// (flash-decoding), with RoPE and the KV store folded in and subgroup operations (needs the
// SUBGROUP feature and subgroups of at least LANES invocations; the path without them is
// rope_kv.wgsl, then attention.wgsl). Writes the partial softmax state of attention.wgsl,
// which attention_combine.wgsl merges: workgroup (head, split) writes m = max_j s_j,
// l = sum_j exp(s_j - m) and acc[d] = sum_j exp(s_j - m) v_j[d] over its positions j,
// s_j = (q . k_j) * kq_scale.
//
// One token (position pos = step.pos0; a prefill chunk's tokens would need each other's keys
// in the cache). A decode step's attention is short of neither bandwidth nor workgroups but
// of latency (dependent memory reads) and of ALU (decoding f16 for every query head); what
// differs from rope_kv.wgsl + attention.wgsl:
// - RoPE in the workgroup: q is rotated (and scaled by q_scale) while it is staged, with
//   rope_kv.wgsl's operations in its order; the token's own key (rotated) and value are
//   rounded to f16 into workgroup memory and used for position pos, and the workgroup of the
//   KV head's first query head whose split holds pos stores them into the cache row pos for
//   later steps (no workgroup of this dispatch reads that row from the cache). One dispatch
//   less per layer.
// - Positions per split follow the position (`split_chunk` in common.wgsl, with the host's
//   grain; grain 0 gives the fixed `chunk`, as the combine reads it): ceil((pos + 1) / splits)
//   rounded up to a multiple of grain, at most `chunk`; attention.wgsl gives each split
//   `chunk` positions whatever the position. A split past the position (or before a sliding
//   window) writes its empty state and exits before staging anything.
// - A split's positions go in tiles of TILE = WG / LANES, and each tile's key and value words
//   are all read at once, into named variables (the `//@each` blocks, which the host repeats
//   UNROLL times: an indexed array may live in memory), before any arithmetic: one round trip
//   to memory per tile. Keys: each score is one cluster of LANES invocations (consecutive
//   lanes of one subgroup, by subgroup_invocation_id: the shuffles exchange by lane), lane c
//   of the cluster reading the key's 16-byte words c, c + LANES, ..., the cluster adding its
//   partial dots with two subgroupShuffleXor steps. Values: the workgroup's invocations form
//   floor(WG / hq) position groups of hq = head_dim / 8 invocations (the other WG % hq
//   invocations idle: 4 at head_dim 96), invocation (g, w) reading word w of the tile's
//   positions g, g + WG / hq, ... and keeping 8 running sums; the groups' sums are added in
//   group order at the end.
// - Cache words are decoded by unpack2x16float (one conversion per two f16; with the integer
//   decode of common.wgsl, about 12 operations per f16, the kernel was ALU-bound: decode
//   steps 14% longer at position 2048 on an H200, 3457 against 3046 us). Every normal f16
//   converts exactly; WGSL leaves a subnormal one (|v| < 6.1e-5) to the implementation,
//   which may give 0 (a difference far inside the attention tolerance).
// - The tile's max and the sum of its weights by subgroupMax / subgroupAdd, one partial per
//   subgroup in workgroup memory (the subgroup size is read from the hardware).
// exp is WGSL's precise exp. head_dim is a multiple of 8, at most MAX_HD.
//
// q: [1, heads, head_dim] f32 and k, v: [1, kv_heads, head_dim] f32, before RoPE; table:
// rope_kv.wgsl's (cos, sin) per position and pair; caches [kv_heads, n_ctx, head_dim] f16
// pairs in u32 (kv_store.wgsl; read and written here as vec4<u32> words of 8 f16, rows of
// head_dim / 8 words); part: [1, heads, splits, head_dim + 2] f32 (m, l, acc).

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
@group(0) @binding(4) var<storage, read_write> kc: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> vc: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> part: array<f32>;
@group(0) @binding(7) var<uniform> p: P;
@group(0) @binding(8) var<uniform> step: Step;

const WG: u32 = 64u;
// Invocations per score (a power of two; every subgroup this kernel runs in holds whole
// clusters: the host uses it only where the smallest subgroup has at least LANES).
const LANES: u32 = 4u;
// Positions per tile: one per cluster.
const TILE: u32 = WG / LANES;
const MAX_HD: u32 = 256u;
// 16-byte words (8 f16) of a key or value row, at most.
const MAX_HQ: u32 = MAX_HD / 8u;
// Key words per cluster lane and value rows per invocation in a tile, at most: the number of
// times the host repeats each `//@each` block below (`{g}` replaced by 0, 1, ...). A lane
// takes at most MAX_HQ / LANES words of a key; an invocation at most TILE / (WG / MAX_HQ)
// positions' words of the values (WG / hq position groups share a tile's TILE positions).
const UNROLL: u32 = 8u;
// wgpu's smallest subgroup is 4 invocations.
const MAX_SUBGROUPS: u32 = WG / 4u;
const NEG_BIG: f32 = -3.4028234663852886e38;

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

// The 8 f16 of a 16-byte cache word, as f32.
fn word_lo(w: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

fn word_hi(w: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w));
}

// q rotated and scaled, as 4-element words (element 4i + e at qs[i][e]).
var<workgroup> qs: array<vec4<f32>, MAX_HD / 4u>;
// The token's own key (rotated) and value as f16 pairs.
var<workgroup> kf: array<u32, MAX_HD / 2u>;
var<workgroup> vf: array<u32, MAX_HD / 2u>;
var<workgroup> sc: array<f32, TILE>;
var<workgroup> red: array<f32, MAX_SUBGROUPS>;
// Each invocation's 8 value sums (two 4-element halves) for the final sum over groups.
var<workgroup> vsum: array<vec4<f32>, 2u * WG>;

// Word i of the own key or value (kf or vf) as a 16-byte cache word.
fn own_word(own_k: bool, i: u32) -> vec4<u32> {
    if own_k {
        return vec4<u32>(kf[4u * i], kf[4u * i + 1u], kf[4u * i + 2u], kf[4u * i + 3u]);
    }
    return vec4<u32>(vf[4u * i], vf[4u * i + 1u], vf[4u * i + 2u], vf[4u * i + 3u]);
}

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
    // 16-byte words per row.
    let hq = hd / 8u;
    let pos = step.pos0;
    var lo = 0u;
    if p.window > 0u && pos + 1u > p.window {
        lo = pos + 1u - p.window;
    }
    let c = split_chunk(pos, p.splits, p.chunk, p.grain);
    let start = max(lo, split * c);
    let end = min(pos + 1u, (split + 1u) * c);
    let out = (head * p.splits + split) * (hd + 2u);
    // A split without positions (past the position, or before a sliding window) writes only
    // its empty state (l = 0: the combine gives it weight 0 and never uses its acc) and stages
    // nothing: most of a decode step's splits early in a long context.
    if start >= end {
        if lid == 0u {
            part[out] = NEG_BIG;
            part[out + 1u] = 0.0;
        }
        return;
    }
    let group = p.heads / p.kv_heads;
    let kvh = head / group;
    // The KV head's first row, in 16-byte words.
    let cbase = kvh * p.n_ctx * hq;
    let kbase = kvh * hd;
    for (var i = lid; i < hd / 4u; i += WG) {
        qs[i] = vec4<f32>(
            q_rotated(head, 4u * i, pos),
            q_rotated(head, 4u * i + 1u, pos),
            q_rotated(head, 4u * i + 2u, pos),
            q_rotated(head, 4u * i + 3u, pos),
        );
    }
    for (var i = lid; i < half; i += WG) {
        kf[i] = f32_to_f16_bits(k_rotated(kvh, 2u * i, pos)) | (f32_to_f16_bits(k_rotated(kvh, 2u * i + 1u, pos)) << 16u);
        vf[i] = f32_to_f16_bits(v[kbase + 2u * i]) | (f32_to_f16_bits(v[kbase + 2u * i + 1u]) << 16u);
    }
    workgroupBarrier();
    // The KV store: once per KV head, by the split that holds pos.
    if head % group == 0u && split == pos / c {
        for (var i = lid; i < hq; i += WG) {
            kc[cbase + pos * hq + i] = own_word(true, i);
            vc[cbase + pos * hq + i] = own_word(false, i);
        }
    }
    // Clusters by subgroup lane (sg_size is a multiple of LANES here), TILE of them.
    let cluster = (sg * sg_size + lane) / LANES;
    let cl = lane % LANES;
    // Value position groups: invocation lid is word vw of positions vg, vg + ng, ...
    let ng = WG / hq;
    let vg = lid / hq;
    let vw = lid % hq;
    var m = NEG_BIG;
    var l = 0.0;
    var acc_lo = vec4<f32>(0.0);
    var acc_hi = vec4<f32>(0.0);
    var any = false;
    // The tile's key words (k{g}: word cl + g * LANES of the cluster's position) and value
    // words (v{g}: word vw of position vg + g * ng), named variables rather than an array
    // (an indexed array may live in memory, each element waiting on the load before it).
    var k0 = vec4<u32>(0u);
    var v0 = vec4<u32>(0u);
    var k1 = vec4<u32>(0u);
    var v1 = vec4<u32>(0u);
    var k2 = vec4<u32>(0u);
    var v2 = vec4<u32>(0u);
    var k3 = vec4<u32>(0u);
    var v3 = vec4<u32>(0u);
    var k4 = vec4<u32>(0u);
    var v4 = vec4<u32>(0u);
    var k5 = vec4<u32>(0u);
    var v5 = vec4<u32>(0u);
    var k6 = vec4<u32>(0u);
    var v6 = vec4<u32>(0u);
    var k7 = vec4<u32>(0u);
    var v7 = vec4<u32>(0u);
    // Workgroup-uniform loop bounds (start and end depend only on the workgroup), so the
    // subgroup operations below run in uniform control flow.
    for (var tile = start; tile < end; tile += TILE) {
        let n_tile = min(TILE, end - tile);
        // Every key and value load of the tile first. A cluster past the end reads the
        // tile's first position again and discards its score; position pos (the last of the
        // split that holds it) comes from kf and vf, never from the cache row this dispatch
        // writes.
        let jk = tile + select(0u, cluster, cluster < n_tile);
        let krow = cbase + jk * hq;
        if cl + 0u * LANES < hq {
            if jk == pos {
                k0 = own_word(true, cl + 0u * LANES);
            } else {
                k0 = kc[krow + cl + 0u * LANES];
            }
        }
        if vg < ng && vg + 0u * ng < n_tile {
            if tile + vg + 0u * ng == pos {
                v0 = own_word(false, vw);
            } else {
                v0 = vc[cbase + (tile + vg + 0u * ng) * hq + vw];
            }
        }
        if cl + 1u * LANES < hq {
            if jk == pos {
                k1 = own_word(true, cl + 1u * LANES);
            } else {
                k1 = kc[krow + cl + 1u * LANES];
            }
        }
        if vg < ng && vg + 1u * ng < n_tile {
            if tile + vg + 1u * ng == pos {
                v1 = own_word(false, vw);
            } else {
                v1 = vc[cbase + (tile + vg + 1u * ng) * hq + vw];
            }
        }
        if cl + 2u * LANES < hq {
            if jk == pos {
                k2 = own_word(true, cl + 2u * LANES);
            } else {
                k2 = kc[krow + cl + 2u * LANES];
            }
        }
        if vg < ng && vg + 2u * ng < n_tile {
            if tile + vg + 2u * ng == pos {
                v2 = own_word(false, vw);
            } else {
                v2 = vc[cbase + (tile + vg + 2u * ng) * hq + vw];
            }
        }
        if cl + 3u * LANES < hq {
            if jk == pos {
                k3 = own_word(true, cl + 3u * LANES);
            } else {
                k3 = kc[krow + cl + 3u * LANES];
            }
        }
        if vg < ng && vg + 3u * ng < n_tile {
            if tile + vg + 3u * ng == pos {
                v3 = own_word(false, vw);
            } else {
                v3 = vc[cbase + (tile + vg + 3u * ng) * hq + vw];
            }
        }
        if cl + 4u * LANES < hq {
            if jk == pos {
                k4 = own_word(true, cl + 4u * LANES);
            } else {
                k4 = kc[krow + cl + 4u * LANES];
            }
        }
        if vg < ng && vg + 4u * ng < n_tile {
            if tile + vg + 4u * ng == pos {
                v4 = own_word(false, vw);
            } else {
                v4 = vc[cbase + (tile + vg + 4u * ng) * hq + vw];
            }
        }
        if cl + 5u * LANES < hq {
            if jk == pos {
                k5 = own_word(true, cl + 5u * LANES);
            } else {
                k5 = kc[krow + cl + 5u * LANES];
            }
        }
        if vg < ng && vg + 5u * ng < n_tile {
            if tile + vg + 5u * ng == pos {
                v5 = own_word(false, vw);
            } else {
                v5 = vc[cbase + (tile + vg + 5u * ng) * hq + vw];
            }
        }
        if cl + 6u * LANES < hq {
            if jk == pos {
                k6 = own_word(true, cl + 6u * LANES);
            } else {
                k6 = kc[krow + cl + 6u * LANES];
            }
        }
        if vg < ng && vg + 6u * ng < n_tile {
            if tile + vg + 6u * ng == pos {
                v6 = own_word(false, vw);
            } else {
                v6 = vc[cbase + (tile + vg + 6u * ng) * hq + vw];
            }
        }
        if cl + 7u * LANES < hq {
            if jk == pos {
                k7 = own_word(true, cl + 7u * LANES);
            } else {
                k7 = kc[krow + cl + 7u * LANES];
            }
        }
        if vg < ng && vg + 7u * ng < n_tile {
            if tile + vg + 7u * ng == pos {
                v7 = own_word(false, vw);
            } else {
                v7 = vc[cbase + (tile + vg + 7u * ng) * hq + vw];
            }
        }
        // Scores.
        var dotv = 0.0;
        if cl + 0u * LANES < hq {
            dotv += dot(word_lo(k0), qs[2u * (cl + 0u * LANES)]) + dot(word_hi(k0), qs[2u * (cl + 0u * LANES) + 1u]);
        }
        if cl + 1u * LANES < hq {
            dotv += dot(word_lo(k1), qs[2u * (cl + 1u * LANES)]) + dot(word_hi(k1), qs[2u * (cl + 1u * LANES) + 1u]);
        }
        if cl + 2u * LANES < hq {
            dotv += dot(word_lo(k2), qs[2u * (cl + 2u * LANES)]) + dot(word_hi(k2), qs[2u * (cl + 2u * LANES) + 1u]);
        }
        if cl + 3u * LANES < hq {
            dotv += dot(word_lo(k3), qs[2u * (cl + 3u * LANES)]) + dot(word_hi(k3), qs[2u * (cl + 3u * LANES) + 1u]);
        }
        if cl + 4u * LANES < hq {
            dotv += dot(word_lo(k4), qs[2u * (cl + 4u * LANES)]) + dot(word_hi(k4), qs[2u * (cl + 4u * LANES) + 1u]);
        }
        if cl + 5u * LANES < hq {
            dotv += dot(word_lo(k5), qs[2u * (cl + 5u * LANES)]) + dot(word_hi(k5), qs[2u * (cl + 5u * LANES) + 1u]);
        }
        if cl + 6u * LANES < hq {
            dotv += dot(word_lo(k6), qs[2u * (cl + 6u * LANES)]) + dot(word_hi(k6), qs[2u * (cl + 6u * LANES) + 1u]);
        }
        if cl + 7u * LANES < hq {
            dotv += dot(word_lo(k7), qs[2u * (cl + 7u * LANES)]) + dot(word_hi(k7), qs[2u * (cl + 7u * LANES) + 1u]);
        }
        dotv += subgroupShuffleXor(dotv, 1u);
        dotv += subgroupShuffleXor(dotv, 2u);
        if cl == 0u && cluster < n_tile {
            sc[cluster] = dotv * p.kq_scale;
        }
        workgroupBarrier();
        // Invocation lid < n_tile holds position tile + lid: the tile's max, then its weight.
        let s = select(NEG_BIG, sc[min(lid, TILE - 1u)], lid < n_tile);
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
        if lid < n_tile {
            sc[lid] = wgt;
        }
        let ssum = subgroupAdd(wgt);
        if lane == 0u {
            red[sg] = ssum;
        }
        workgroupBarrier();
        var lt = red[0];
        for (var i = 1u; i < nsg; i++) {
            lt += red[i];
        }
        acc_lo *= corr;
        acc_hi *= corr;
        if vg < ng && vg + 0u * ng < n_tile {
            let w = sc[vg + 0u * ng];
            acc_lo += w * word_lo(v0);
            acc_hi += w * word_hi(v0);
        }
        if vg < ng && vg + 1u * ng < n_tile {
            let w = sc[vg + 1u * ng];
            acc_lo += w * word_lo(v1);
            acc_hi += w * word_hi(v1);
        }
        if vg < ng && vg + 2u * ng < n_tile {
            let w = sc[vg + 2u * ng];
            acc_lo += w * word_lo(v2);
            acc_hi += w * word_hi(v2);
        }
        if vg < ng && vg + 3u * ng < n_tile {
            let w = sc[vg + 3u * ng];
            acc_lo += w * word_lo(v3);
            acc_hi += w * word_hi(v3);
        }
        if vg < ng && vg + 4u * ng < n_tile {
            let w = sc[vg + 4u * ng];
            acc_lo += w * word_lo(v4);
            acc_hi += w * word_hi(v4);
        }
        if vg < ng && vg + 5u * ng < n_tile {
            let w = sc[vg + 5u * ng];
            acc_lo += w * word_lo(v5);
            acc_hi += w * word_hi(v5);
        }
        if vg < ng && vg + 6u * ng < n_tile {
            let w = sc[vg + 6u * ng];
            acc_lo += w * word_lo(v6);
            acc_hi += w * word_hi(v6);
        }
        if vg < ng && vg + 7u * ng < n_tile {
            let w = sc[vg + 7u * ng];
            acc_lo += w * word_lo(v7);
            acc_hi += w * word_hi(v7);
        }
        l = l * corr + lt;
        m = m_new;
        any = true;
        // sc and red are rewritten by the next tile.
    }
    vsum[2u * lid] = acc_lo;
    vsum[2u * lid + 1u] = acc_hi;
    workgroupBarrier();
    if lid == 0u {
        part[out] = select(NEG_BIG, m, any);
        part[out + 1u] = l;
    }
    // Output dims 4e .. 4e + 3: half (e & 1) of word e / 2, summed over the groups in order.
    for (var e = lid; e < hd / 4u; e += WG) {
        var a = vec4<f32>(0.0);
        for (var g = 0u; g < ng; g++) {
            a += vsum[2u * (g * hq + e / 2u) + (e & 1u)];
        }
        part[out + 2u + 4u * e] = a.x;
        part[out + 3u + 4u * e] = a.y;
        part[out + 4u + 4u * e] = a.z;
        part[out + 5u + 4u * e] = a.w;
    }
}
