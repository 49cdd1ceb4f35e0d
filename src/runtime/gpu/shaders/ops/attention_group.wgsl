// Prefill attention with grouped query heads: attention.wgsl's kernel (read its comment for
// the splits, tiles, online softmax and layouts) with one workgroup per (head group, split,
// token) instead of per (head, split, token). A group is QG query heads of one KV head (heads
// QG * group .. QG * group + QG - 1; QG divides heads / kv_heads): invocation i scores
// position tile + i for every head of the group from one load and one widening of the key's
// words, and adds each value word into every head's accumulators, so each key and value is
// read once per workgroup instead of once per query head. Each head's arithmetic is the
// same sequence as attention.wgsl's. The backend uses it for prefill chunks only
// (op_attention_gN, N the largest divisor of heads / kv_heads up to 4): on an H200 it took a
// 256-token chunk's attention from 2.0 to 1.4 ms per layer of the 8B ternary shape (N = 4),
// while a decode step, whose few workgroups are bound by latency, ran 2.5x slower with
// groups of 8 (BENCHMARKS.md).
//
// A template: src/runtime/gpu/ops.rs repeats each block between `//@each` and `//@end` once
// per head of the group with `{g}` replaced by the head's index (0 .. QG - 1), so that each
// head's state is scalars and vectors of its own (kept in registers; with private arrays
// indexed in loops the kernel ran about 1.2x slower on an H200), and substitutes QG and
// MAX_HD (attention.wgsl's).
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
const MAX_HD: u32 = 0u;
// Query heads per workgroup (substituted per variant by src/runtime/gpu/ops.rs).
const QG: u32 = 0u;

// The two f16 of a cache word as f32 (element 2i in the low half), exactly.
fn pair_f32(w: u32) -> vec2<f32> {
    return vec2<f32>(f16_bits_to_f32(w & 0xffffu), f16_bits_to_f32(w >> 16u));
}

var<workgroup> qs: array<f32, QG * MAX_HD>;
var<workgroup> sc: array<f32, QG * WG>;
var<workgroup> red: array<f32, QG * WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let head0 = wid.x * QG;
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
    let kvh = head0 / (p.heads / p.kv_heads);
    let cbase = kvh * p.n_ctx * half;
    for (var g = 0u; g < QG; g++) {
        for (var d = lid; d < hd; d += WG) {
            qs[g * MAX_HD + d] = q[(t * p.heads + head0 + g) * hd + d];
        }
    }
    workgroupBarrier();
    // Output dims 2 (lid + i WG) and 2 (lid + i WG) + 1 for i < PAIRS, per head.
    //@each
    var m{g} = -3.4028234663852886e38;
    var l{g} = 0.0;
    var acc0_{g} = vec2<f32>(0.0);
    var acc1_{g} = vec2<f32>(0.0);
    //@end
    var any = false;
    // Workgroup-uniform loop bounds (start and end depend only on the workgroup).
    for (var tile = start; tile < end; tile += WG) {
        let j = tile + lid;
        //@each
        var s{g} = -3.4028234663852886e38;
        //@end
        if j < end {
            //@each
            var dot{g} = 0.0;
            //@end
            let row = cbase + j * half;
            for (var i = 0u; i < half; i += 4u) {
                let k0 = pair_f32(kc[row + i]);
                let k1 = pair_f32(kc[row + i + 1u]);
                let k2 = pair_f32(kc[row + i + 2u]);
                let k3 = pair_f32(kc[row + i + 3u]);
                //@each
                let e{g} = {g}u * MAX_HD + 2u * i;
                dot{g} += (qs[e{g}] * k0.x + qs[e{g} + 1u] * k0.y) + (qs[e{g} + 2u] * k1.x + qs[e{g} + 3u] * k1.y);
                dot{g} += (qs[e{g} + 4u] * k2.x + qs[e{g} + 5u] * k2.y) + (qs[e{g} + 6u] * k3.x + qs[e{g} + 7u] * k3.y);
                //@end
            }
            //@each
            s{g} = dot{g} * p.kq_scale;
            //@end
        }
        //@each
        red[{g}u * WG + lid] = s{g};
        //@end
        workgroupBarrier();
        for (var k = WG / 2u; k > 0u; k >>= 1u) {
            if lid < k {
                for (var g = 0u; g < QG; g++) {
                    red[g * WG + lid] = max(red[g * WG + lid], red[g * WG + lid + k]);
                }
            }
            workgroupBarrier();
        }
        let n_tile = min(WG, end - tile);
        //@each
        let m_new{g} = max(m{g}, red[{g}u * WG]);
        let corr{g} = exp(m{g} - m_new{g});
        m{g} = m_new{g};
        // This position's weight, once.
        sc[{g}u * WG + lid] = select(0.0, exp(s{g} - m_new{g}), j < end);
        //@end
        workgroupBarrier();
        //@each
        var lt{g} = 0.0;
        for (var jj = 0u; jj < n_tile; jj++) {
            lt{g} += sc[{g}u * WG + jj];
        }
        l{g} = l{g} * corr{g} + lt{g};
        acc0_{g} *= corr{g};
        acc1_{g} *= corr{g};
        //@end
        let pair0 = lid;
        let pair1 = lid + WG;
        var jj = 0u;
        for (; jj + 4u <= n_tile; jj += 4u) {
            let row = cbase + (tile + jj) * half;
            if pair0 < half {
                let v0 = pair_f32(vc[row + pair0]);
                let v1 = pair_f32(vc[row + half + pair0]);
                let v2 = pair_f32(vc[row + 2u * half + pair0]);
                let v3 = pair_f32(vc[row + 3u * half + pair0]);
                //@each
                let b{g} = {g}u * WG + jj;
                acc0_{g} += sc[b{g}] * v0 + sc[b{g} + 1u] * v1 + sc[b{g} + 2u] * v2 + sc[b{g} + 3u] * v3;
                //@end
            }
            if pair1 < half {
                let v0 = pair_f32(vc[row + pair1]);
                let v1 = pair_f32(vc[row + half + pair1]);
                let v2 = pair_f32(vc[row + 2u * half + pair1]);
                let v3 = pair_f32(vc[row + 3u * half + pair1]);
                //@each
                let b{g} = {g}u * WG + jj;
                acc1_{g} += sc[b{g}] * v0 + sc[b{g} + 1u] * v1 + sc[b{g} + 2u] * v2 + sc[b{g} + 3u] * v3;
                //@end
            }
        }
        for (; jj < n_tile; jj++) {
            let row = cbase + (tile + jj) * half;
            if pair0 < half {
                let v = pair_f32(vc[row + pair0]);
                //@each
                acc0_{g} += sc[{g}u * WG + jj] * v;
                //@end
            }
            if pair1 < half {
                let v = pair_f32(vc[row + pair1]);
                //@each
                acc1_{g} += sc[{g}u * WG + jj] * v;
                //@end
            }
        }
        any = true;
        workgroupBarrier();
    }
    //@each
    let out{g} = ((t * p.heads + head0 + {g}u) * p.splits + split) * (hd + 2u);
    if lid == 0u {
        part[out{g}] = select(-3.4028234663852886e38, m{g}, any);
        part[out{g} + 1u] = l{g};
    }
    if lid < half {
        part[out{g} + 2u + 2u * lid] = acc0_{g}.x;
        part[out{g} + 3u + 2u * lid] = acc0_{g}.y;
    }
    if lid + WG < half {
        part[out{g} + 2u + 2u * (lid + WG)] = acc1_{g}.x;
        part[out{g} + 3u + 2u * (lid + WG)] = acc1_{g}.y;
    }
    //@end
}
