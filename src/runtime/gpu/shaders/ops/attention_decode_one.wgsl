// Attention of one decode step over the f16 KV cache in one dispatch, for positions up to
// MAXP: the work of attention_decode.wgsl (RoPE of q and of the token's own key, the KV
// store) and of its combine (the merged output) without the split state between them, so a
// decode step has one dispatch less per layer; in the int8 form also the output product's
// quantization (op_attention_combine_q8's). A template: the host (src/runtime/gpu/mod.rs,
// attention_decode_one_source) sets HD and HB, expands the `//@for` blocks (the `//@for Q Q8`
// ones once in the int8 form, never in the f32 one) and puts the int8 quantization's lines
// (those of the quantize kernels) at `//@q8`; the modules are registered as
// op_attention_decode_q8_hd{HD} (int8: HB = 256 / HD, a block of 256 outputs) and
// op_attention_decode_one_hd{HD} (f32: HB = 1).
//
// One workgroup per block of HB * HD outputs: the query heads h0 .. h0 + HB - 1 (the host
// uses it only where they share one KV head). In three phases over the positions
// lo ..= pos (lo = pos + 1 - window with a sliding window, else 0), n of them:
// - Scores, into workgroup memory: cluster c of LANES invocations (consecutive lanes of one
//   subgroup) takes positions c, c + NC, ..., KU at a time with all their key words loaded
//   before any arithmetic; lane l of the cluster reads the key's 16-byte words l, l + LANES,
//   ... and dots them with every head's rotated query (one key load serves the block's HB
//   heads), the cluster adding its partial dots with two subgroupShuffleXor steps (a score
//   is the same sum, in the same order, as attention_decode.wgsl's).
// - Softmax: each head's max M over the n scores (subgroupMax, then the subgroups' maxima in
//   workgroup memory), each weight w = exp(s - M) written over its score, each head's sum
//   l = sum w (subgroupAdd, then the subgroups' sums in subgroup order).
// - Values: invocation (g, c) of NG position groups of HQ invocations reads word c of the
//   value rows g, g + NG, ..., KV at a time with their loads issued together, and keeps 8
//   running sums per head; the groups' sums are added in group order (head by head, in the
//   scores' workgroup memory), times 1 / l.
// Then the block's values are stored to `out`, and in the int8 form (256 of them) quantized
// exactly as op_attention_combine_q8 quantizes its block (per 16-element group; the
// product's int8 x at binding 7). The token's own key and value (rotated, rounded to f16)
// are used for position pos from workgroup memory and stored into the cache row pos by the
// workgroup of the KV head's first query head (no workgroup of this dispatch reads that
// row).
//
// The scores of a block take HB * MAXP f32 of workgroup memory (8 KiB): at most
// MAXP = 2048 / HB positions (int8: 512 at HD = 64, 1024 at 128, 2048 at 256; f32: 2048).
// The host runs it only while n <= MAXP and the split attention with its combine past that;
// a dispatch with more positions writes NaN (never a result computed from part of them).
//
// Needs subgroups of at least LANES invocations. Bindings: q, k, v, table, kc, vc, out, xq
// (int8 form only), p, step, numbered in that order (the f32 form's p and step are 7 and
// 8). q: [1, heads, HD] f32 and k, v: [1, kv_heads, HD] f32, before RoPE; table: (cos, sin)
// per position and pair; caches [kv_heads, n_ctx, HD] f16 pairs in u32 as vec4<u32> words
// of 8 f16 (kv_store.wgsl); out: [heads * HD] f32; xq (int8 form): the int8 x of the output
// product (q8_common.wgsl's group layout, then per 64-element unit its sum of q and its
// block's da).

struct P {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    n_ctx: u32,
    // attention_decode.wgsl's split parameters (the same uniform serves both; unused here).
    splits: u32,
    chunk: u32,
    // 0: every earlier position
    window: u32,
    kq_scale: f32,
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
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
//@for Q Q8
@group(0) @binding(7) var<storage, read_write> xq: array<vec4<u32>>;
//@end
@group(0) @binding(8) var<uniform> p: P;
@group(0) @binding(9) var<uniform> step: Step;

const WG: u32 = 256u;
// Invocations per score; clusters (positions per round of scores).
const LANES: u32 = 4u;
const NC: u32 = WG / LANES;
const HD: u32 = 0u;
// Key rows a cluster and value rows an invocation load together (the `//@for U KU` and
// `//@for U KV` blocks' counts).
const KU: u32 = 0u;
const KV: u32 = 0u;
// Query heads per workgroup, 16-byte words per cache row, value position groups.
const HB: u32 = 0u;
const HQ: u32 = HD / 8u;
const NG: u32 = WG / HQ;
// Workgroup memory for the scores (f32), and the positions it holds.
const SCN: u32 = 2048u;
const MAXP: u32 = SCN / HB;
// wgpu's smallest subgroup is 4 invocations.
const MAX_SUBGROUPS: u32 = WG / 4u;
const NEG_BIG: f32 = -3.4028234663852886e38;

// The block's queries rotated and scaled, as 4-element words (head hh's element 4i + e at
// qs[hh * HD / 4 + i][e]).
var<workgroup> qs: array<vec4<f32>, HB * HD / 4u>;
// The token's own key (rotated) and value as f16 pairs.
var<workgroup> kf: array<u32, HD / 2u>;
var<workgroup> vf: array<u32, HD / 2u>;
// Head hh's score (then weight) of position lo + r at hh * MAXP + r; afterwards the value
// groups' sums of one head (8 per invocation).
var<workgroup> wsm: array<f32, SCN>;
// Per head and subgroup: its max, then its sum of weights.
var<workgroup> red: array<f32, HB * MAX_SUBGROUPS>;
// The block's merged values (each invocation writes a word of its own).
var<workgroup> xs: array<f32, HB * HD>;
//@for Q Q8
// The block's max |x| as f32 bits (a NaN as 0x7fc00000) and its units' sums of q.
var<workgroup> bmax: array<atomic<u32>, 1>;
var<workgroup> usum: array<atomic<i32>, 4>;
//@end

// Word i of the own key or value (kf or vf) as a 16-byte cache word.
fn own_word(own_k: bool, i: u32) -> vec4<u32> {
    if own_k {
        return vec4<u32>(kf[4u * i], kf[4u * i + 1u], kf[4u * i + 2u], kf[4u * i + 3u]);
    }
    return vec4<u32>(vf[4u * i], vf[4u * i + 1u], vf[4u * i + 2u], vf[4u * i + 3u]);
}

//@for Q Q8
// Elements 4j .. 4j + 3 of the block.
fn xv(j: u32) -> vec4<f32> {
    return vec4<f32>(xs[4u * j], xs[4u * j + 1u], xs[4u * j + 2u], xs[4u * j + 3u]);
}
//@end

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(num_subgroups) nsg: u32,
    @builtin(subgroup_size) sg_size: u32,
) {
    let blk = wid.x;
    let h0 = blk * HB;
    let pos = step.pos0;
    var lo = 0u;
    if p.window > 0u && pos + 1u > p.window {
        lo = pos + 1u - p.window;
    }
    let n = pos + 1u - lo;
    // Positions taken (all of them unless the host ran this past MAXP: then NaN below).
    let nn = min(n, MAXP);
    let group = p.heads / p.kv_heads;
    let kvh = h0 / group;
    // The KV head's first row, in 16-byte words.
    let cbase = kvh * p.n_ctx * HQ;
    let kbase = kvh * HD;
    if lid < HB * HD / 4u {
        let hh = lid / (HD / 4u);
        let i = lid % (HD / 4u);
        qs[lid] = vec4<f32>(
            q_rotated(h0 + hh, 4u * i, pos),
            q_rotated(h0 + hh, 4u * i + 1u, pos),
            q_rotated(h0 + hh, 4u * i + 2u, pos),
            q_rotated(h0 + hh, 4u * i + 3u, pos),
        );
    }
    if lid < HD / 2u {
        kf[lid] = f32_to_f16_bits(k_rotated(kvh, 2u * lid, pos)) | (f32_to_f16_bits(k_rotated(kvh, 2u * lid + 1u, pos)) << 16u);
        vf[lid] = f32_to_f16_bits(v[kbase + 2u * lid]) | (f32_to_f16_bits(v[kbase + 2u * lid + 1u]) << 16u);
    }
    //@for Q Q8
    if lid == 0u {
        atomicStore(&bmax[0], 0u);
    }
    if lid < 4u {
        atomicStore(&usum[lid], 0);
    }
    //@end
    workgroupBarrier();
    // The KV store: once per KV head.
    if h0 % group == 0u && lid < HQ {
        kc[cbase + pos * HQ + lid] = own_word(true, lid);
        vc[cbase + pos * HQ + lid] = own_word(false, lid);
    }
    // Scores. Clusters by subgroup lane (sg_size is a multiple of LANES here).
    let cluster = (sg * sg_size + lane) / LANES;
    let cl = lane % LANES;
    //@for H HB
    var mx{H} = NEG_BIG;
    //@end
    // Workgroup-uniform bounds: the shuffles run in uniform control flow.
    for (var j0 = 0u; j0 < nn; j0 += KU * NC) {
        //@for U KU
        let r{U} = j0 + cluster + {U}u * NC;
        // A cluster past the end reads the last position again and discards its score.
        let jk{U} = lo + min(r{U}, nn - 1u);
        //@for W KW
        var k{U}_{W}: vec4<u32>;
        if jk{U} == pos {
            k{U}_{W} = own_word(true, cl + {W}u * LANES);
        } else {
            k{U}_{W} = kc[cbase + jk{U} * HQ + cl + {W}u * LANES];
        }
        //@end
        //@end
        //@for U KU
        //@for H HB
        var d{U}_{H} = 0.0;
        //@for W KW
        d{U}_{H} += dot(word_lo(k{U}_{W}), qs[{H}u * (HD / 4u) + 2u * (cl + {W}u * LANES)]) + dot(word_hi(k{U}_{W}), qs[{H}u * (HD / 4u) + 2u * (cl + {W}u * LANES) + 1u]);
        //@end
        d{U}_{H} += subgroupShuffleXor(d{U}_{H}, 1u);
        d{U}_{H} += subgroupShuffleXor(d{U}_{H}, 2u);
        if r{U} < nn {
            let s = d{U}_{H} * p.kq_scale;
            mx{H} = max(mx{H}, s);
            if cl == 0u {
                wsm[{H}u * MAXP + r{U}] = s;
            }
        }
        //@end
        //@end
    }
    // Each head's max.
    //@for H HB
    let gm{H} = subgroupMax(mx{H});
    //@end
    if lane == 0u {
        //@for H HB
        red[{H}u * MAX_SUBGROUPS + sg] = gm{H};
        //@end
    }
    workgroupBarrier();
    //@for H HB
    var m{H} = red[{H}u * MAX_SUBGROUPS];
    for (var i = 1u; i < nsg; i++) {
        m{H} = max(m{H}, red[{H}u * MAX_SUBGROUPS + i]);
    }
    var ls{H} = 0.0;
    //@end
    // Every invocation has read the maxima before red is rewritten.
    workgroupBarrier();
    // The weights over the scores, and each head's sum.
    for (var r = lid; r < nn; r += WG) {
        //@for H HB
        let w{H} = exp(wsm[{H}u * MAXP + r] - m{H});
        wsm[{H}u * MAXP + r] = w{H};
        ls{H} += w{H};
        //@end
    }
    //@for H HB
    let gs{H} = subgroupAdd(ls{H});
    //@end
    if lane == 0u {
        //@for H HB
        red[{H}u * MAX_SUBGROUPS + sg] = gs{H};
        //@end
    }
    workgroupBarrier();
    //@for H HB
    var l{H} = 0.0;
    for (var i = 0u; i < nsg; i++) {
        l{H} += red[{H}u * MAX_SUBGROUPS + i];
    }
    //@end
    // Values: invocation lid is word vw of positions vg, vg + NG, ...
    let vg = lid / HQ;
    let vw = lid % HQ;
    //@for H HB
    var alo{H} = vec4<f32>(0.0);
    var ahi{H} = vec4<f32>(0.0);
    //@end
    for (var r0 = vg; r0 < nn; r0 += KV * NG) {
        //@for U KV
        let r{U} = r0 + {U}u * NG;
        let jv{U} = lo + min(r{U}, nn - 1u);
        var v{U}: vec4<u32>;
        if jv{U} == pos {
            v{U} = own_word(false, vw);
        } else {
            v{U} = vc[cbase + jv{U} * HQ + vw];
        }
        //@end
        //@for U KV
        if r{U} < nn {
            let vl = word_lo(v{U});
            let vh = word_hi(v{U});
            //@for H HB
            let w{H} = wsm[{H}u * MAXP + r{U}];
            alo{H} += w{H} * vl;
            ahi{H} += w{H} * vh;
            //@end
        }
        //@end
    }
    // NaN where the host ran this past MAXP (a run-time value: a constant NaN is an error).
    let bad = bitcast<f32>(select(0u, 0x7fc00000u, n > MAXP));
    // Each head's 8 sums per invocation into wsm, then dim d of the head: its word's sums
    // over the NG groups in group order, times 1 / l.
    //@for H HB
    // The weights (or the previous head's sums) have been read.
    workgroupBarrier();
    wsm[8u * lid] = alo{H}.x;
    wsm[8u * lid + 1u] = alo{H}.y;
    wsm[8u * lid + 2u] = alo{H}.z;
    wsm[8u * lid + 3u] = alo{H}.w;
    wsm[8u * lid + 4u] = ahi{H}.x;
    wsm[8u * lid + 5u] = ahi{H}.y;
    wsm[8u * lid + 6u] = ahi{H}.z;
    wsm[8u * lid + 7u] = ahi{H}.w;
    workgroupBarrier();
    if lid < HD {
        var a = 0.0;
        for (var g = 0u; g < NG; g++) {
            a += wsm[8u * (g * HQ + lid / 8u) + lid % 8u];
        }
        xs[{H}u * HD + lid] = select(a * (1.0 / l{H}), bad, n > MAXP);
    }
    //@end
    workgroupBarrier();
    if lid < HB * HD {
        out[blk * HB * HD + lid] = xs[lid];
    }
    //@for Q Q8
    // The block's 16 groups, one invocation each (the quantize kernels' lines).
    let g = lid;
    let live = g < 16u;
    let gl = min(g, 15u);
    //@q8
    // Units 2i and 2i + 1 of the block (its da twice) after the heads * HD / 16 groups.
    if lid < 2u {
        let groups = p.heads * HD / 16u;
        xq[groups + blk * 2u + lid] = vec4<u32>(
            bitcast<u32>(atomicLoad(&usum[2u * lid])),
            bitcast<u32>(d),
            bitcast<u32>(atomicLoad(&usum[2u * lid + 1u])),
            bitcast<u32>(d),
        );
    }
    //@end
}
