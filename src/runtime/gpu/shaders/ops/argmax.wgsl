// Greedy token: the index of the largest logit, the lowest on ties, never one of the banned
// ids; 0xffffffff when any logit is not finite (the CPU backend's `argmax` returns None
// then). One workgroup: each invocation scans a strided share, then a tree in workgroup
// memory keeps (value, index) pairs ordered by value, then by lower index. The id goes to
// `ids[0]` (what the next decode step's embedding gather reads, so the host need not hand
// it back) and to `result[0]` (what the host reads); a non-finite result writes id 0 to
// `ids[0]` so the next gather stays in range (the host stops on the sentinel anyway).

struct P {
    n: u32,
    n_banned: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read> banned: array<u32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> result: array<u32>;
@group(0) @binding(4) var<uniform> p: P;

const WG: u32 = 256u;
var<workgroup> bv: array<f32, WG>;
var<workgroup> bi: array<u32, WG>;
var<workgroup> bad: array<u32, WG>;

fn is_banned(i: u32) -> bool {
    for (var k = 0u; k < p.n_banned; k++) {
        if banned[k] == i {
            return true;
        }
    }
    return false;
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32) {
    var best = -3.4028234663852886e38;
    var idx = 0xffffffffu;
    var nonfinite = 0u;
    for (var i = lid; i < p.n; i += WG) {
        let v = logits[i];
        // not finite: NaN (v != v) or +-inf (exponent all ones)
        if (bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u {
            nonfinite = 1u;
        }
        if (idx == 0xffffffffu || v > best) && !is_banned(i) {
            best = v;
            idx = i;
        }
    }
    bv[lid] = best;
    bi[lid] = idx;
    bad[lid] = nonfinite;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if lid < k {
            let ov = bv[lid + k];
            let oi = bi[lid + k];
            let mi = bi[lid];
            if oi != 0xffffffffu && (mi == 0xffffffffu || ov > bv[lid] || (ov == bv[lid] && oi < mi)) {
                bv[lid] = ov;
                bi[lid] = oi;
            }
            bad[lid] = bad[lid] | bad[lid + k];
        }
        workgroupBarrier();
    }
    if lid == 0u {
        var r = bi[0];
        if bad[0] != 0u {
            r = 0xffffffffu;
        }
        result[0] = r;
        ids[0] = select(r, 0u, r == 0xffffffffu);
    }
}
