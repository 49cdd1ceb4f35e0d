// How matvec_quads.wgsl reads x in its `_rms` kernels: the RMSNorm of x folded in. x is the
// residual stream (params.cols values), `norm_w` the norm's weight and params.norm_eps its
// eps; each workgroup computes the norm's scale itself and the body reads
//     x_at(j) = (x[j] * scale) * norm_w[j]
// op_rms_norm's output (ops/rms_norm.wgsl) in its operations. The scale is op_rms_norm's bit
// for bit: that op sums squares in 256 partials (partial v over elements v, v + 256, ... in
// turn) and adds them as a tree in workgroup memory (v += v + 128, then v += v + 64, ...).
// Here invocation lid < 64 (WG = 64, weights.rs WORKGROUP) keeps partials lid, lid + 64,
// lid + 128 and lid + 192, adds them as the tree's first two levels do, and the workgroup
// adds the 64 results with the tree's remaining levels, in workgroup memory. So the product
// has the bits of op_rms_norm followed by the plain kernel, one dispatch less (each
// workgroup reads x once more: K = 576 to 896 values in the models that use it).

@group(0) @binding(8) var<storage, read> norm_w: array<vec4<f32>>;

var<workgroup> norm_part: array<f32, 64>;
var<private> norm_scale: f32;

// x[i], element i of the activations, or 0 past its len values (adding 0 * 0 to a sum of
// squares leaves its bits).
fn x_or_0(i: u32, len: u32) -> f32 {
    return select(0.0, x[min(i, len - 1u) >> 2u][min(i, len - 1u) & 3u], i < len);
}

fn x_begin(lid: u32) {
    let len = params.cols;
    // Partials lid, lid + 64, lid + 128, lid + 192 (s0 .. s3) over 1024 values at a time:
    // the 16 loads first (one wait, not one a term), then each partial's terms in order.
    var s0 = 0.0;
    var s1 = 0.0;
    var s2 = 0.0;
    var s3 = 0.0;
    for (var c = lid; c < len; c += 1024u) {
        let v0 = x_or_0(c, len);
        let v1 = x_or_0(c + 64u, len);
        let v2 = x_or_0(c + 128u, len);
        let v3 = x_or_0(c + 192u, len);
        let v4 = x_or_0(c + 256u, len);
        let v5 = x_or_0(c + 320u, len);
        let v6 = x_or_0(c + 384u, len);
        let v7 = x_or_0(c + 448u, len);
        let v8 = x_or_0(c + 512u, len);
        let v9 = x_or_0(c + 576u, len);
        let v10 = x_or_0(c + 640u, len);
        let v11 = x_or_0(c + 704u, len);
        let v12 = x_or_0(c + 768u, len);
        let v13 = x_or_0(c + 832u, len);
        let v14 = x_or_0(c + 896u, len);
        let v15 = x_or_0(c + 960u, len);
        s0 += v0 * v0;
        s0 += v4 * v4;
        s0 += v8 * v8;
        s0 += v12 * v12;
        s1 += v1 * v1;
        s1 += v5 * v5;
        s1 += v9 * v9;
        s1 += v13 * v13;
        s2 += v2 * v2;
        s2 += v6 * v6;
        s2 += v10 * v10;
        s2 += v14 * v14;
        s3 += v3 * v3;
        s3 += v7 * v7;
        s3 += v11 * v11;
        s3 += v15 * v15;
    }
    norm_part[lid] = (s0 + s2) + (s1 + s3);
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {
        if lid < k {
            norm_part[lid] += norm_part[lid + k];
        }
        workgroupBarrier();
    }
    let mean = norm_part[0] / f32(len);
    norm_scale = 1.0 / sqrt(mean + params.norm_eps);
}

fn x_at(j: u32) -> vec4<f32> {
    return (x[j] * norm_scale) * norm_w[j];
}
