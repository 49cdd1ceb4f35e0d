// Body of the int8 prefill product of a `ternary2` weight: y[t] = W x[t] for a chunk of
// tokens, x quantized once by q8_quantize.wgsl (xq, xs; q8_common.wgsl's group layout).
//
// Workgroup (x, y, z) takes R = TR * WR rows (of this row chunk) and T = TT * WT tokens
// (t0 = T * z). Per 256-element block b of the rows, in order: the block's code words of
// the R rows (16 each), their f16 scales d, and the T tokens' 16 groups of q with their da
// and sum q are staged in workgroup memory (rows padded to 17 words, tokens to 17 groups:
// consecutive rows' words and consecutive tokens' groups fall in different banks), then
// invocation (ir, it) = (lid % WR, lid / WR) takes rows ir + WR i (i < TR) and tokens
// it + WT j (j < TT): sum c*q over the block exactly in integers (word_dot, 16 words), then
// acc[i][j] += (d * da) * f32(sum c*q - sum q), blocks in order. A code word is read from
// workgroup memory once per TT tokens and an activation group once per TR rows; each weight
// byte is read from memory once per T tokens.
//
// The block term is the CPU int8 kernel's formula, (d * da) * f32(sum c*q - sum q), from the
// same quantization (q8_common.wgsl: da and a q at a rounding tie may differ from the CPU's
// in the last bit); the sum over blocks is sequential here, in eight lanes on the CPU, and
// the decode kernel forms its terms per 64-element unit, so the results differ by f32
// rounding (and by a contracted multiply-add where the compiler forms one).
//
// The host prepends TR, WR, TT, WT, WG = WR * WT, common.wgsl, q8_common.wgsl and
// store.wgsl, and appends `main` (weights.rs, unrolled over i and j).

@group(0) @binding(1) var<storage, read> aux: array<u32>;
@group(0) @binding(2) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read> xs: array<u32>;

const R: u32 = TR * WR;
const T: u32 = TT * WT;
const CS: u32 = 17u;
const GS: u32 = 17u;

var<workgroup> wc: array<u32, R * CS>;
var<workgroup> wx: array<vec4<u32>, T * GS>;
var<workgroup> wd: array<f32, R>;
var<workgroup> wa: array<f32, T>;
var<workgroup> wq: array<i32, T>;

// Stages block b of rows row0 .. row0 + R (clamped to the chunk's last row) and tokens
// t0 .. t0 + T (clamped to the last token).
fn stage(lid: u32, b: u32, row0: u32, t0: u32) {
    let blocks = params.cols / 256u;
    let wpr = params.cols / 16u;
    let last = params.rows - 1u;
    let lt = params.n_tokens - 1u;
    for (var i = lid; i < R * 16u; i += WG) {
        let r = i / 16u;
        let w = i % 16u;
        wc[r * CS + w] = data[min(row0 + r, last) * wpr + b * 16u + w];
    }
    for (var i = lid; i < T * 16u; i += WG) {
        let t = i / 16u;
        let g = i % 16u;
        wx[t * GS + g] = xq[min(t0 + t, lt) * wpr + b * 16u + g];
    }
    for (var r = lid; r < R; r += WG) {
        let si = min(row0 + r, last) * blocks + b;
        wd[r] = f16_bits_to_f32((aux[si >> 1u] >> ((si & 1u) * 16u)) & 0xffffu);
    }
    for (var t = lid; t < T; t += WG) {
        let o = 2u * (min(t0 + t, lt) * blocks + b);
        wa[t] = bitcast<f32>(xs[o]);
        wq[t] = bitcast<i32>(xs[o + 1u]);
    }
}
