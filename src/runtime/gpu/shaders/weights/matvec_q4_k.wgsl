// Body: y = W x for one token (TOK = 1) over GGML Q4_K rows, in place of matvec.wgsl (same
// bindings, grid, rows per workgroup and reduction). matvec.wgsl decodes each 32-element
// unit through `unit`, each unit reading its sub-block's 6-bit scale and min (four byte
// reads) and eight funnel-shifted words; this body, as llama.cpp's Q4_K matvec does, takes
// lane tasks of 16 weights that read each `qs` byte once and decode each sub-block's scale
// and min once per task:
//
// Block layout (unit_q4_k.wgsl): d f16 at byte 0, dmin f16 at 2, scales[12] at 4 (8 six-bit
// scales and mins, get_scale_min_k4), qs[128] at 16; element j*32 + l of the block (sub-block
// j < 8, l < 32) is the low (j even) or high (j odd) nibble of qs[(j/2)*32 + l], value
// (d * sc_j) * q - dmin * m_j. Task k of a row is block k / 16 and, with t = k % 16, pair
// p = t / 4 and l = 8 (t % 4) .. 8 (t % 4) + 7: two qs words at 16 + p*32 + l give the 8
// low nibbles (sub-block 2p) and the 8 high ones (2p + 1), each weight decoded to its exact
// value as unit_q4_k.wgsl does, (d * sc) * q - dmin * m (one rounding, the CPU's), and
//     acc += dot(w_lo, x_lo) + dot(w_hi, x_hi)
// (so the products' error bound in weights.rs, in terms of sum |w x|, holds). Blocks
// of 144 bytes are whole words: every field is read with one aligned word load, no
// funnel shift (the scales as three words, d and dmin as one). Invocation lid takes tasks
// lid, lid + WG, ... of each of the workgroup's params.wg_rows rows (at most ROWS), the 16
// activations of a task loaded once for all of them. The reduction appended after this file
// adds the WG partials of each row. The sum's order is not matvec.wgsl's: the GPU's products
// are held to the CPU within a tolerance, not bit for bit.
//
// A template: the host repeats each `//@for R ROWS` ... `//@end` block once per row of ROWS
// (ops.rs `expand_for`), so that every row's value is a named variable. Rows past
// params.wg_rows are computed and not stored.

@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const NACC: u32 = ROWS * TOK;
const WORDS: u32 = BLOCK_BYTES / 4u;
const LO4 = vec4<u32>(15u);

// Rows per workgroup (the reduction's stride and store bound): params.wg_rows, ROWS or fewer
// for a weight of few rows.
fn rows_per_wg() -> u32 {
    return params.wg_rows;
}

// Byte i (< 12) of the scales, held as the words s0, s1, s2.
fn scale_byte(s0: u32, s1: u32, s2: u32, i: u32) -> u32 {
    let w = select(select(s2, s1, i < 8u), s0, i < 4u);
    return (w >> ((i & 3u) * 8u)) & 0xffu;
}

// Scale (x) and min (y) of sub-block j (get_scale_min_k4) from the scale words.
fn scale_min(s0: u32, s1: u32, s2: u32, j: u32) -> vec2<u32> {
    let lo = vec2<u32>(scale_byte(s0, s1, s2, j) & 63u, scale_byte(s0, s1, s2, j + 4u) & 63u);
    let e = scale_byte(s0, s1, s2, (j + 4u) & 15u);
    let hi = vec2<u32>(
        (e & 15u) | ((scale_byte(s0, s1, s2, (j - 4u) & 15u) >> 6u) << 4u),
        (e >> 4u) | ((scale_byte(s0, s1, s2, j & 15u) >> 6u) << 4u),
    );
    return select(hi, lo, vec2<bool>(j < 4u));
}

fn partials(lid: u32, row0: u32, t0: u32) -> array<f32, NACC> {
    let blocks = params.cols / 256u;
    let tasks = blocks * 16u;
    // Rows past params.wg_rows read the workgroup's last row again (rows.wgsl `weight_row`:
    // from the cache, their sums never stored), so that every load below is unconditional.
    //@for R ROWS
    let rw{R} = weight_row(row0, {R}u) * blocks * WORDS;
    var acc{R} = 0.0;
    //@end
    for (var k = lid; k < tasks; k += WG) {
        let blk = k >> 4u;
        let t = k & 15u;
        let p = t >> 2u;
        let l = (t & 3u) * 8u;
        let xb = (blk * 256u + p * 64u + l) / 4u;
        let x0 = x[xb];
        let x1 = x[xb + 1u];
        let x2 = x[xb + 8u];
        let x3 = x[xb + 9u];
        // Every row's loads before any arithmetic.
        //@for R ROWS
        let w{R} = rw{R} + blk * WORDS;
        let dm_{R} = data[w{R}];
        let s0_{R} = data[w{R} + 1u];
        let s1_{R} = data[w{R} + 2u];
        let s2_{R} = data[w{R} + 3u];
        let qa_{R} = data[w{R} + 4u + (p * 32u + l) / 4u];
        let qb_{R} = data[w{R} + 5u + (p * 32u + l) / 4u];
        //@end
        //@for R ROWS
        {
            let d = f16_bits_to_f32(dm_{R} & 0xffffu);
            let dmin = f16_bits_to_f32(dm_{R} >> 16u);
            let sm0 = scale_min(s0_{R}, s1_{R}, s2_{R}, 2u * p);
            let sm1 = scale_min(s0_{R}, s1_{R}, s2_{R}, 2u * p + 1u);
            let dl0 = d * f32(sm0.x);
            let ml0 = dmin * f32(sm0.y);
            let dl1 = d * f32(sm1.x);
            let ml1 = dmin * f32(sm1.y);
            let qa = vec4<u32>(qa_{R});
            let qb = vec4<u32>(qb_{R});
            let lo = dot(dl0 * ints((qa >> SH_LO) & LO4, 0.0) - ml0, x0)
                + dot(dl0 * ints((qb >> SH_LO) & LO4, 0.0) - ml0, x1);
            let hi = dot(dl1 * ints((qa >> SH_HI) & LO4, 0.0) - ml1, x2)
                + dot(dl1 * ints((qb >> SH_HI) & LO4, 0.0) - ml1, x3);
            acc{R} += lo + hi;
        }
        //@end
    }
    var acc: array<f32, NACC>;
    //@for R ROWS
    acc[{R}u] = acc{R};
    //@end
    return acc;
}
