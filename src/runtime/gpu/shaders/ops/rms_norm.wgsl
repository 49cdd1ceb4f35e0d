// RMSNorm: out[r, i] = (x[r, i] * (1 / sqrt(mean_i(x[r, i]^2) + eps))) * w[i], as ggml and the
// CPU backend compute it (the scale applied to x first, then the weight). One workgroup per
// row of `len` values; the sum of squares is a tree in workgroup memory (the CPU sums in
// f64: the difference is f32 rounding of a sum of positive terms, below len * 2^-24
// relative).
//
// Rows: workgroup (x + y * 65535) is row r when `last == 0`; when `last == 1` the one row
// processed is the chunk's last real token (step.n - 1), written to out row 0 (the final
// norm before the head).

struct P {
    len: u32,
    eps: f32,
    rows: u32,
    last: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: P;
@group(0) @binding(4) var<uniform> step: Step;

const WG: u32 = 256u;
var<workgroup> part: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    var r = wid.y * 65535u + wid.x;
    var o = r;
    if p.last == 1u {
        r = max(step.n, 1u) - 1u;
        o = 0u;
    }
    if wid.y * 65535u + wid.x >= p.rows {
        return;
    }
    let base = r * p.len;
    var s = 0.0;
    for (var i = lid; i < p.len; i += WG) {
        let v = x[base + i];
        s += v * v;
    }
    part[lid] = s;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if lid < k {
            part[lid] += part[lid + k];
        }
        workgroupBarrier();
    }
    let mean = part[0] / f32(p.len);
    let scale = 1.0 / sqrt(mean + p.eps);
    for (var i = lid; i < p.len; i += WG) {
        out[o * p.len + i] = (x[base + i] * scale) * w[i];
    }
}
