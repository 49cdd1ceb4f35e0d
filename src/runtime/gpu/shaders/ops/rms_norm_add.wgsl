// A post-norm and the residual add after it, and optionally the norm that follows them, in one
// op (Gemma 3's post-attention and post-FFN norms), with op_rms_norm's and op_add's
// arithmetic, so the same bits as the three ops one after another:
//     x[r, i] += ((y[r, i] * scale_y) * w[i]) * s
//     h[r, i] = (x[r, i] * scale_x) * w2[i]          (next == 1)
// scale_v = 1 / sqrt(mean_i(v[r, i]^2) + eps), each sum of squares the tree of rms_norm.wgsl
// (every invocation adds the elements lid, lid + WG, ... it also writes, so it reads back
// its own stores of x). One workgroup per row: workgroup (x + y * 65535) is row r.

struct P {
    len: u32,
    eps: f32,
    rows: u32,
    next: u32,
    s: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> w2: array<f32>;
@group(0) @binding(4) var<storage, read_write> h: array<f32>;
@group(0) @binding(5) var<uniform> p: P;

const WG: u32 = 256u;
var<workgroup> part: array<f32, WG>;

// 1 / sqrt(mean + eps) of the sums in `part` (each invocation's own in part[lid]).
fn tree_scale(lid: u32) -> f32 {
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if lid < k {
            part[lid] += part[lid + k];
        }
        workgroupBarrier();
    }
    let mean = part[0] / f32(p.len);
    return 1.0 / sqrt(mean + p.eps);
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.y * 65535u + wid.x;
    if r >= p.rows {
        return;
    }
    let base = r * p.len;
    var s = 0.0;
    for (var i = lid; i < p.len; i += WG) {
        let v = y[base + i];
        s += v * v;
    }
    part[lid] = s;
    let scale = tree_scale(lid);
    for (var i = lid; i < p.len; i += WG) {
        let n = (y[base + i] * scale) * w[i];
        x[base + i] = x[base + i] + n * p.s;
    }
    if p.next == 0u {
        return;
    }
    var s2 = 0.0;
    for (var i = lid; i < p.len; i += WG) {
        let v = x[base + i];
        s2 += v * v;
    }
    // Every invocation has read part[0] above before any writes it again.
    workgroupBarrier();
    part[lid] = s2;
    let scale2 = tree_scale(lid);
    for (var i = lid; i < p.len; i += WG) {
        h[base + i] = (x[base + i] * scale2) * w2[i];
    }
}
