// Body and entry point of the tiled multi-token product: y[t] = W x[t] for a prefill chunk,
// each weight unit (32 elements, the decoder's `unit`) decoded once per TN tokens and each
// token's activations loaded once per TM rows (matmul.wgsl: once per 8 tokens, and x once
// per 4 rows).
//
// Workgroup (x, y, z) takes rows row0 .. row0 + TM of this row chunk and tokens t0 .. t0 +
// TN (t0 = TN * z). Per unit u, in order: invocations lid < TM decode row row0 + lid's unit
// into workgroup memory (ws, vec4 q of row r at q * TM + r), all stage the TN tokens'
// 32 activations (xs, vec4 q of token t at q * TN + t; rows and tokens past the end
// clamped to the last), then invocation (tr, tt) = (lid % 16, lid / 16) adds the unit's
// term to its 4 x 4 sums, rows tr + 16 i and tokens tt + 16 j (consecutive invocations read
// consecutive rows' vec4s: no bank conflicts; the 16 of a token group read the same token).
//
// Each sum is matmul.wgsl's unit term, ((w0.x0 + w1.x1) + (w2.x2 + w3.x3)) + ((w4.x4 +
// w5.x5) + (w6.x6 + w7.x7)) (wi.xi a vec4 dot), added unit after unit in order: no
// reduction across invocations. Its error bound is weights::matmul_tile_tolerance (K / 32
// sequential additions where matmul.wgsl has K / (32 WG) and a reduction over WG).
//
// A template: the host expands the `//@for NAME COUNT` blocks (ops.rs `expand_for`; I and J
// over the 4 rows and 4 tokens of an invocation) and prepends TM, TN, WG, common.wgsl, the
// decoder and store.wgsl. Workgroup memory: 16 * 8 * (TM + TN) bytes (16 KiB, WebGPU's
// default limit).

@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

var<workgroup> ws: array<vec4<f32>, 8u * TM>;
var<workgroup> xs: array<vec4<f32>, 8u * TN>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let row0 = (wid.y * params.groups_x + wid.x) * TM;
    if row0 >= params.rows {
        return;
    }
    let t0 = wid.z * TN;
    let units = params.cols / 32u;
    let stride = params.cols / 4u;
    let last_row = params.rows - 1u;
    let last_tok = params.n_tokens - 1u;
    let tr = lid % 16u;
    let tt = lid / 16u;
    //@for I RI
    //@for J TI
    var acc{I}_{J} = 0.0;
    //@end
    //@end
    for (var u = 0u; u < units; u++) {
        if lid < TM {
            let w = unit(min(row0 + lid, last_row), u);
            for (var q = 0u; q < 8u; q++) {
                ws[q * TM + lid] = w[q];
            }
        }
        for (var i = lid; i < 8u * TN; i += WG) {
            let t = i / 8u;
            let q = i % 8u;
            xs[q * TN + t] = x[min(t0 + t, last_tok) * stride + u * 8u + q];
        }
        workgroupBarrier();
        // Vec4s 0 and 1, then 2 and 3: (w0.x0 + w1.x1) + (w2.x2 + w3.x3).
        //@for I RI
        let wa{I} = ws[tr + {I}u * 16u];
        let wb{I} = ws[TM + tr + {I}u * 16u];
        //@end
        //@for J TI
        let xa{J} = xs[tt + {J}u * 16u];
        let xb{J} = xs[TN + tt + {J}u * 16u];
        //@end
        //@for I RI
        //@for J TI
        var s{I}_{J} = dot(wa{I}, xa{J}) + dot(wb{I}, xb{J});
        //@end
        //@end
        //@for I RI
        let wc{I} = ws[2u * TM + tr + {I}u * 16u];
        let wd{I} = ws[3u * TM + tr + {I}u * 16u];
        //@end
        //@for J TI
        let xc{J} = xs[2u * TN + tt + {J}u * 16u];
        let xd{J} = xs[3u * TN + tt + {J}u * 16u];
        //@end
        //@for I RI
        //@for J TI
        s{I}_{J} = s{I}_{J} + (dot(wc{I}, xc{J}) + dot(wd{I}, xd{J}));
        //@end
        //@end
        // Vec4s 4 to 7 likewise, then the unit's term is the two halves' sum.
        //@for I RI
        let we{I} = ws[4u * TM + tr + {I}u * 16u];
        let wf{I} = ws[5u * TM + tr + {I}u * 16u];
        //@end
        //@for J TI
        let xe{J} = xs[4u * TN + tt + {J}u * 16u];
        let xf{J} = xs[5u * TN + tt + {J}u * 16u];
        //@end
        //@for I RI
        //@for J TI
        var h{I}_{J} = dot(we{I}, xe{J}) + dot(wf{I}, xf{J});
        //@end
        //@end
        //@for I RI
        let wg{I} = ws[6u * TM + tr + {I}u * 16u];
        let wh{I} = ws[7u * TM + tr + {I}u * 16u];
        //@end
        //@for J TI
        let xg{J} = xs[6u * TN + tt + {J}u * 16u];
        let xh{J} = xs[7u * TN + tt + {J}u * 16u];
        //@end
        //@for I RI
        //@for J TI
        acc{I}_{J} += s{I}_{J} + (h{I}_{J} + (dot(wg{I}, xg{J}) + dot(wh{I}, xh{J})));
        //@end
        //@end
        workgroupBarrier();
    }
    //@for I RI
    //@for J TI
    if row0 + tr + {I}u * 16u < params.rows && t0 + tt + {J}u * 16u < params.n_tokens {
        store_y(t0 + tt + {J}u * 16u, params.row0 + row0 + tr + {I}u * 16u, acc{I}_{J});
    }
    //@end
    //@end
}
