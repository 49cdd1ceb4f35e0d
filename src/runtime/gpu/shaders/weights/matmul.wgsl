// Body: y[t] = W x[t] for tokens t0 .. t0 + TOK - 1 (t0 = TOK * workgroup_id.z), a prefill
// chunk. As matvec.wgsl, but each row's unit is decoded once and dotted with the TOK
// tokens' activations (x is [n_tokens, K], row-major; y is [n_tokens, rows of the whole
// weight]), so a weight block is read once per TOK tokens. acc{r}_{t} holds row r, token t
// (returned as acc[r * TOK + t]); tokens past n_tokens are neither read nor stored. Each
// term is ((w0.x0 + w1.x1) + (w2.x2 + w3.x3)) + ((w4.x4 + w5.x5) + (w6.x6 + w7.x7)) (wi.xi a
// vec4 dot), added unit after unit.
//
// A template: the host expands the `//@for NAME COUNT` blocks (ops.rs `expand_for`; ROWS
// and TOK) so that every accumulator is a named variable. Per unit each row's weights are
// decoded once, then each token's activations loaded once for every row: on an H200
// (BENCHMARKS.md) prompts of the SmolLM2, Qwen2.5 and Gemma 3 shape copies ran 11-14% faster
// than with the accumulators in a private array indexed in the loops, and 3-6% with the
// named accumulators in the former order (per row, each token's activations loaded again).

@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const NACC: u32 = ROWS * TOK;

// Rows per workgroup (the reduction's stride and store bound).
fn rows_per_wg() -> u32 {
    return ROWS;
}

fn partials(lid: u32, row0: u32, t0: u32) -> array<f32, NACC> {
    let units = params.cols / 32u;
    let stride = params.cols / 4u;
    let nt = min(TOK, params.n_tokens - t0);
    //@for R ROWS
    let rr{R} = min(row0 + {R}u, params.rows - 1u);
    //@for T TOK
    var acc{R}_{T} = 0.0;
    //@end
    //@end
    for (var u = lid; u < units; u += WG) {
        //@for R ROWS
        let w{R} = unit(rr{R}, u);
        //@end
        //@for T TOK
        if {T}u < nt {
            let xb = (t0 + {T}u) * stride + u * 8u;
            let x0 = x[xb];
            let x1 = x[xb + 1u];
            let x2 = x[xb + 2u];
            let x3 = x[xb + 3u];
            let x4 = x[xb + 4u];
            let x5 = x[xb + 5u];
            let x6 = x[xb + 6u];
            let x7 = x[xb + 7u];
            //@for R ROWS
            acc{R}_{T} += ((dot(w{R}[0], x0) + dot(w{R}[1], x1)) + (dot(w{R}[2], x2) + dot(w{R}[3], x3)))
                + ((dot(w{R}[4], x4) + dot(w{R}[5], x5)) + (dot(w{R}[6], x6) + dot(w{R}[7], x7)));
            //@end
        }
        //@end
    }
    var acc: array<f32, NACC>;
    //@for R ROWS
    //@for T TOK
    acc[{R}u * TOK + {T}u] = acc{R}_{T};
    //@end
    //@end
    return acc;
}
