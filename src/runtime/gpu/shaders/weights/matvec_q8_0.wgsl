// Body: y = W x for one token (TOK = 1) over Q8_0 planes (unit_q8_0.wgsl), in place of
// matvec_quads.wgsl (the same bindings, grid, rows per workgroup, reductions, gating forms
// and x hooks, `x_begin` / `x_at`: x_plain.wgsl or x_rms.wgsl), plus `data4`. With the codes
// uploaded as a plane, 16 codes of a row are one aligned `vec4<u32>` of `data4` (the chunk's
// buffer bound again as 16-byte words): task k of a row is codes 16 k .. 16 k + 15 (half of
// unit k / 2), one 16-byte load and the unit's d, and
//     acc += d * ((dot(q0, x0) + dot(q1, x1)) + (dot(q2, x2) + dot(q3, x3)))
// with q_i word i's four codes (exact integers, `ints`) and x_i = x_at(4 k + i). matvec_quads
// took 8 codes a task from two 4-byte loads: a row of K = 640 (Gemma 3's tied head, 262,144
// rows) was two round trips to memory for each invocation, here it is one, and each
// invocation has 36 bytes of weights in flight where it had 20. Invocation lid takes tasks
// lid, lid + WG, ... of every row of the workgroup (params.lanes is not read), x loaded once
// per task for all of them. The sum's order is not matvec_quads.wgsl's: the GPU's products
// are held to the CPU within a tolerance, not bit for bit (d is applied to the task's sum,
// as on the CPU's int8 path, not to each code).
//
// A template: the host repeats each `//@for R ROWS` ... `//@end` block once per row of ROWS
// (ops.rs `expand_for`), so that every row's value is a named variable.

@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// The chunk's bytes (binding 0's buffer) as 16-byte words: the host binds it where a kernel
// uses it (weights.rs `DATA4_BINDING`).
@group(0) @binding(9) var<storage, read> data4: array<vec4<u32>>;

const NACC: u32 = ROWS * TOK;
// Tasks a unit: 16 codes each.
const Q8_TASKS: u32 = 2u;

// Rows per workgroup (the reduction's stride and store bound).
fn rows_per_wg() -> u32 {
    return params.wg_rows;
}

// The four signed codes of word w, exactly, as f32.
fn q8_codes(w: u32) -> vec4<f32> {
    return ints(((vec4<u32>(w) >> SH8) & vec4<u32>(255u)) ^ vec4<u32>(128u), 128.0);
}

// Task k's sum over its 16 codes (w: its 16-byte word) times x, before the scale.
fn q8_task(w: vec4<u32>, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>) -> f32 {
    return (dot(q8_codes(w.x), x0) + dot(q8_codes(w.y), x1)) + (dot(q8_codes(w.z), x2) + dot(q8_codes(w.w), x3));
}

fn partials(lid: u32, row0: u32, t0: u32) -> array<f32, NACC> {
    x_begin(lid);
    let tasks = (params.cols / 32u) * Q8_TASKS;
    // A row's first 16-byte word of codes: row r's codes start at byte r * K.
    let rw = params.cols / 16u;
    //@for R ROWS
    let rr{R} = weight_row(row0, {R}u);
    var acc{R} = 0.0;
    //@end
    if params.wg_rows == 1u {
        // One row a workgroup (a weight of few rows): only row 0 is decoded (the loop below
        // would decode it ROWS times), its sum in the same order.
        for (var k = lid; k < tasks; k += WG) {
            let w = data4[rr0 * rw + k];
            let d = q8_d(rr0, k >> 1u);
            acc0 += d * q8_task(w, x_at(4u * k), x_at(4u * k + 1u), x_at(4u * k + 2u), x_at(4u * k + 3u));
        }
    } else {
        for (var k = lid; k < tasks; k += WG) {
            // Every row's loads before any arithmetic.
            //@for R ROWS
            let w{R} = data4[rr{R} * rw + k];
            let d{R} = q8_d(rr{R}, k >> 1u);
            //@end
            let x0 = x_at(4u * k);
            let x1 = x_at(4u * k + 1u);
            let x2 = x_at(4u * k + 2u);
            let x3 = x_at(4u * k + 3u);
            //@for R ROWS
            acc{R} += d{R} * q8_task(w{R}, x0, x1, x2, x3);
            //@end
        }
    }
    var acc: array<f32, NACC>;
    //@for R ROWS
    acc[{R}u] = acc{R};
    //@end
    return acc;
}
