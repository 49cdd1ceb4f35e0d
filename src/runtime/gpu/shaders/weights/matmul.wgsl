// Body: y[t] = W x[t] for tokens t0 .. t0 + TOK - 1 (t0 = TOK * workgroup_id.z), a prefill
// chunk. As matvec.wgsl, but each row's unit is decoded once and dotted with the TOK
// tokens' activations (x is [n_tokens, K], row-major; y is [n_tokens, rows of the whole
// weight]), so a weight block is read once per TOK tokens. acc[r * TOK + t] holds row r,
// token t; tokens past n_tokens are neither read nor stored.

@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const NACC: u32 = ROWS * TOK;

// Rows per workgroup (the reduction's stride and store bound).
fn rows_per_wg() -> u32 {
    return ROWS;
}

fn dot_unit(w: array<vec4<f32>, 8>, xb: u32) -> f32 {
    return ((dot(w[0], x[xb]) + dot(w[1], x[xb + 1u])) + (dot(w[2], x[xb + 2u]) + dot(w[3], x[xb + 3u])))
        + ((dot(w[4], x[xb + 4u]) + dot(w[5], x[xb + 5u])) + (dot(w[6], x[xb + 6u]) + dot(w[7], x[xb + 7u])));
}

fn partials(lid: u32, row0: u32, t0: u32) -> array<f32, NACC> {
    var acc: array<f32, NACC>;
    let units = params.cols / 32u;
    let stride = params.cols / 4u;
    let nt = min(TOK, params.n_tokens - t0);
    for (var u = lid; u < units; u += WG) {
        for (var r = 0u; r < ROWS; r++) {
            let w = unit(min(row0 + r, params.rows - 1u), u);
            for (var t = 0u; t < TOK; t++) {
                if t < nt {
                    acc[r * TOK + t] += dot_unit(w, (t0 + t) * stride + u * 8u);
                }
            }
        }
    }
    return acc;
}
