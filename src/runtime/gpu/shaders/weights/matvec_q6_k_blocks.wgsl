// The Q6_K single-token body as bundles made before the planes layout carry it
// (matvec_q6_k.wgsl before it): kept for weights.rs `block_sources`.
// Body: y = W x for one token (TOK = 1) over GGML Q6_K rows, in place of matvec.wgsl (same
// bindings, grid, rows per workgroup and reduction). matvec.wgsl decodes each 32-element
// unit to floats through `unit` (a funnel-shifted word per 4 bytes, twice per element pair);
// this body reads each byte of a block's `ql` and `qh` once (each task re-reads its half's
// two scale words and d), as llama.cpp's Q6_K matvec does, in lane tasks of 16 weights:
//
// Block layout (unit_q6_k.wgsl): element h*128 + s*32 + l (h < 2, s < 4, l < 32) is the
// nibble s/2 of ql[h*64 + (s%2)*32 + l] with bits 2s .. 2s+1 of qh[h*32 + l] as bits 4..5,
// minus 32, times d * scales[h*8 + 2s + l/16]. Task k of a row is block k / 16 and, with
// j = k % 16, h = j / 8 and l = 4 (j % 8) .. 4 (j % 8) + 3: one ql word at h*64 + l (s = 0
// low nibbles, s = 2 high), one at h*64 + 32 + l (s = 1 and 3), one qh word at h*32 + l (all
// four s) give four words of four 6-bit codes, each byte turned into q - 32 exactly
// (`ints`), and
//     acc += sum_s (d * sc_s) * dot(q_s - 32, x[block*256 + h*128 + s*32 + l ..][0..4])
// (d * sc_s exact: 11 bits times 8, as on the CPU). Blocks of 210 bytes start at even
// offsets; the words are read with `word_at`. Invocation lid takes tasks lid, lid + WG, ...
// of each of the workgroup's params.wg_rows rows (at most ROWS), the 16 activations of a
// task loaded once for all of them. The reduction appended after this file adds the WG
// partials of each row.
//
// A template: the host repeats each `//@for R ROWS` ... `//@end` block once per row of ROWS
// (ops.rs `expand_for`), so that every row's value is a named variable (indexed private
// arrays in the loop took 228 us on the 8B shape's 73,448 x 4,096 head on an H200, the
// named variables 208: BENCHMARKS.md). Rows past params.wg_rows are computed and not stored.

@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const NACC: u32 = ROWS * TOK;

// Rows per workgroup (the reduction's stride and store bound): params.wg_rows, ROWS or fewer
// for a weight of few rows.
fn rows_per_wg() -> u32 {
    return params.wg_rows;
}
const LO4 = 0x0f0f0f0fu;
const HI2 = 0x30303030u;

// Sub-block scale byte `o` (0..3) of word w as a signed value.
fn scale_byte(w: u32, o: u32) -> f32 {
    return f32(bitcast<i32>(w << (24u - 8u * o)) >> 24u);
}

// The four codes of word c (one per byte) minus 32, exactly, as f32.
fn codes(c: u32) -> vec4<f32> {
    return ints((vec4<u32>(c) >> SH8) & vec4<u32>(0xffu), 32.0);
}

fn partials(lid: u32, row0: u32, t0: u32) -> array<f32, NACC> {
    let blocks = params.cols / 256u;
    let tasks = blocks * 16u;
    // Rows past params.wg_rows read the workgroup's last row again (rows.wgsl `weight_row`:
    // from the cache, their sums never stored), so that every load below is unconditional.
    //@for R ROWS
    let rb{R} = weight_row(row0, {R}u) * blocks * BLOCK_BYTES;
    var acc{R} = 0.0;
    //@end
    for (var k = lid; k < tasks; k += WG) {
        let blk = k >> 4u;
        let j = k & 15u;
        let h = j >> 3u;
        let l = (j & 7u) * 4u;
        let xb = (blk * 256u + h * 128u + l) / 4u;
        let x0 = x[xb];
        let x1 = x[xb + 8u];
        let x2 = x[xb + 16u];
        let x3 = x[xb + 24u];
        // Scale bytes h*8 + 2s + l/16: bytes l/16 and l/16 + 2 of the words at h*8, h*8 + 4.
        let so = l >> 4u;
        // Every row's loads before any arithmetic.
        //@for R ROWS
        let b{R} = rb{R} + blk * BLOCK_BYTES;
        let ql0_{R} = word_at(b{R} + h * 64u + l);
        let ql1_{R} = word_at(b{R} + h * 64u + 32u + l);
        let qh_{R} = word_at(b{R} + 128u + h * 32u + l);
        let s01_{R} = word_at(b{R} + 192u + h * 8u);
        let s23_{R} = word_at(b{R} + 196u + h * 8u);
        let d_{R} = f16_at(b{R} + 208u);
        //@end
        //@for R ROWS
        {
            let q0 = codes((ql0_{R} & LO4) | ((qh_{R} << 4u) & HI2));
            let q1 = codes((ql1_{R} & LO4) | ((qh_{R} << 2u) & HI2));
            let q2 = codes(((ql0_{R} >> 4u) & LO4) | (qh_{R} & HI2));
            let q3 = codes(((ql1_{R} >> 4u) & LO4) | ((qh_{R} >> 2u) & HI2));
            let d = d_{R};
            acc{R} += ((d * scale_byte(s01_{R}, so)) * dot(q0, x0) + (d * scale_byte(s01_{R}, so + 2u)) * dot(q1, x1))
                + ((d * scale_byte(s23_{R}, so)) * dot(q2, x2) + (d * scale_byte(s23_{R}, so + 2u)) * dot(q3, x3));
        }
        //@end
    }
    var acc: array<f32, NACC>;
    //@for R ROWS
    acc[{R}u] = acc{R};
    //@end
    return acc;
}
