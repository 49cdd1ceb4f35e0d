// Body: y = W x for one token (TOK = 1). Workgroup w takes rows w*R .. w*R + R - 1 of the
// chunk, R = params.wg_rows (ROWS, or fewer for a weight of few rows). Its invocations form
// WG / G groups of G = params.lanes: group g takes rows g, g + WG/G, g + 2 WG/G, ... of the
// workgroup's R, and its invocation j the units (32 elements) j, j + G, ... of each of them,
// so consecutive invocations read consecutive blocks of a row. G is WG unless K is small: a
// row of K = 896 (28 units) on G = 64 left 36 of 64 invocations idle; on G = 32 the two
// halves of a workgroup take a row each. Per unit the 32
// activations are loaded once and used for all of the group's rows; each row's 32 weights are
// decoded by `unit` to their exact f32 values and dotted with them:
//     acc[r] += ((w0.x0 + w1.x1) + (w2.x2 + w3.x3)) + ((w4.x4 + w5.x5) + (w6.x6 + w7.x7))
// (wi.xi a vec4 dot). A row's accumulator is 0 in the other groups' invocations, so the
// reduction appended after this file (which adds the WG partials of each row, subgroup by
// subgroup) is unchanged; it writes y[row0 + row]. The sum's order depends on G: the GPU's
// products are held to the CPU within a tolerance, not bit for bit.
//
// A template: the host repeats each `//@for R ROWS` ... `//@end` block once per row of ROWS
// (ops.rs `expand_for`), so that every row's value is a named variable, not an element of a
// private array indexed in the loop.

@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const NACC: u32 = ROWS * TOK;

// Rows per workgroup (the reduction's stride and store bound).
fn rows_per_wg() -> u32 {
    return params.wg_rows;
}

// This invocation's partial sums of chunk rows row0 .. row0 + params.wg_rows - 1 (rows past
// the end read the last row; their sums are never stored; accumulators of rows this
// invocation's group does not take stay 0); t0 is always 0 here.
fn partials(lid: u32, row0: u32, t0: u32) -> array<f32, NACC> {
    let units = params.cols / 32u;
    let lanes = params.lanes;
    let g = lid / lanes;
    let groups = WG / lanes;
    //@for R ROWS
    let rr{R} = min(row0 + {R}u, params.rows - 1u);
    let mine{R} = {R}u < params.wg_rows && {R}u % groups == g;
    var acc{R} = 0.0;
    //@end
    for (var u = lid % lanes; u < units; u += lanes) {
        let xb = u * 8u;
        let x0 = x[xb];
        let x1 = x[xb + 1u];
        let x2 = x[xb + 2u];
        let x3 = x[xb + 3u];
        let x4 = x[xb + 4u];
        let x5 = x[xb + 5u];
        let x6 = x[xb + 6u];
        let x7 = x[xb + 7u];
        //@for R ROWS
        if mine{R} {
            let w = unit(rr{R}, u);
            acc{R} += ((dot(w[0], x0) + dot(w[1], x1)) + (dot(w[2], x2) + dot(w[3], x3)))
                + ((dot(w[4], x4) + dot(w[5], x5)) + (dot(w[6], x6) + dot(w[7], x7)));
        }
        //@end
    }
    var acc: array<f32, NACC>;
    //@for R ROWS
    acc[{R}u] = acc{R};
    //@end
    return acc;
}
