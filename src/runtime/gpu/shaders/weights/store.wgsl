// How the products (matvec.wgsl, matmul.wgsl) store a sum: token t's output row r of the
// whole weight (r < out_rows).
//
// Layout of y. A plain weight: y[t * out_rows + r]. A stacked weight (up to three weights
// with the same columns and encoding uploaded as one, e.g. Q, K and V: rows [0, seg1),
// [seg1, seg2), [seg2, out_rows)) is stored part by part: part j's rows for every token as
// one contiguous [n_tokens, rows_j] block starting at element start_j * n_tokens, so the host
// binds each part as its own vector. For one token both layouts are y[r].
//
// Epilogue (`accumulate`): 0 y = sum; 1 y = y + sum * scale (the residual add, in op_add's
// and the CPU's order: the same bits); 2 y = sum + bias[r] (op_bias_add's operation: the same
// bits), `bias` the whole weight's rows' biases in row order (a stacked weight's parts one
// after another), a placeholder for the other epilogues.
@group(0) @binding(6) var<storage, read> bias: array<f32>;

fn store_y(t: u32, r: u32, sum: f32) {
    var start = 0u;
    var len = params.seg1;
    if r >= params.seg2 {
        start = params.seg2;
        len = params.out_rows - params.seg2;
    } else if r >= params.seg1 {
        start = params.seg1;
        len = params.seg2 - params.seg1;
    }
    let i = start * params.n_tokens + t * len + (r - start);
    if params.accumulate == 1u {
        y[i] = y[i] + sum * params.scale;
    } else if params.accumulate == 2u {
        y[i] = sum + bias[r];
    } else {
        y[i] = sum;
    }
}
