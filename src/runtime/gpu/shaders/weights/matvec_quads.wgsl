// Body: y = W x for one token (TOK = 1), in place of matvec.wgsl for the decoders that define
// `quads` (same bindings, grid, rows per workgroup and reduction). matvec.wgsl gives each
// invocation whole units, so the 32 invocations of a subgroup read 32 blocks at once (about
// a kilobyte of weights and of x per load instruction, each instruction touching many cache
// lines): on an H200 that body moved 0.45 TB/s through a 145 MB Q8_0 head. Here four
// consecutive invocations share a unit, as llama.cpp's mul_mat_vec shares a block among
// threads: task k of a row is unit k / 4 and i = k % 4, elements 4i .. 4i+3 and 16+4i ..
// 16+4i+3 (`quads(r, u, i)`, the values of `unit(r, u)[i]` and `[i + 4]`: the low and high
// nibbles of one word in the 4-bit and 5-bit blocks), so a subgroup's load instruction
// reads 8 neighbouring blocks. Invocation lid takes tasks lid, lid + WG, ... of every row of
// the workgroup (params.lanes is not read: all WG invocations work on each row, the host
// passes WG), x loaded once per task for all of them:
//     acc[r] += dot(lo, x[4u .. 4u+3 of unit u]) + dot(hi, x[16+4i ..])
// With params.wg_rows = 1 a loop on row 0 alone; otherwise each accumulator row decodes the
// weight row `weight_row` gives (rows.wgsl: rows past params.wg_rows read the workgroup's
// last row again, their sums never stored, so that every load is unconditional;
// rows_swiglu.wgsl: a gate row and its up row). The reduction appended after this file adds
// the WG partials of each row. The sum's order is not matvec.wgsl's: the GPU's products are
// held to the CPU within a tolerance, not bit for bit.
//
// x is read through `x_at(j)` (vec4 j of the activations), after `x_begin(lid)`: x_plain.wgsl
// reads x itself; x_rms.wgsl (the `_rms` kernels) the RMSNorm of x, computed in the
// workgroup (op_rms_norm's values, bit for bit).
//
// A template: the host repeats each `//@for R ROWS` ... `//@end` block once per row of ROWS
// (ops.rs `expand_for`), so that every row's value is a named variable.

@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const NACC: u32 = ROWS * TOK;
// Tasks a unit: invocations that share one.
const QUAD_TASKS: u32 = 4u;

// Rows per workgroup (the reduction's stride and store bound).
fn rows_per_wg() -> u32 {
    return params.wg_rows;
}

fn partials(lid: u32, row0: u32, t0: u32) -> array<f32, NACC> {
    x_begin(lid);
    let tasks = (params.cols / 32u) * QUAD_TASKS;
    //@for R ROWS
    let rr{R} = weight_row(row0, {R}u);
    var acc{R} = 0.0;
    //@end
    if params.wg_rows == 1u {
        // One row a workgroup (a weight of few rows): only row 0 is decoded (the loop below
        // would decode it ROWS times), its sum in the same order.
        for (var k = lid; k < tasks; k += WG) {
            let u = k >> 2u;
            let i = k & 3u;
            let q = quads(rr0, u, i);
            acc0 += dot(q.lo, x_at(u * 8u + i)) + dot(q.hi, x_at(u * 8u + i + 4u));
        }
    } else {
        for (var k = lid; k < tasks; k += WG) {
            let u = k >> 2u;
            let i = k & 3u;
            let xa = x_at(u * 8u + i);
            let xb = x_at(u * 8u + i + 4u);
            //@for R ROWS
            let q{R} = quads(rr{R}, u, i);
            //@end
            //@for R ROWS
            acc{R} += dot(q{R}.lo, xa) + dot(q{R}.hi, xb);
            //@end
        }
    }
    var acc: array<f32, NACC>;
    //@for R ROWS
    acc[{R}u] = acc{R};
    //@end
    return acc;
}
