// Quantizes a prefill chunk's activations to int8 once, for the int8 ternary prefill product
// (mmq_ternary2.wgsl): x [n_tokens, K] f32 -> xq [n_tokens, K/16] vec4<u32> in the group
// layout of q8_common.wgsl (group g of token t at t * K/16 + g) and, per block b of 256 of
// token t, xs[2 (t * K/256 + b)] = da as f32 bits and xs[2 (t * K/256 + b) + 1] = sum q (i32).
// The same quantization as the decode kernel's and the CPU's (q8_common.wgsl).
//
// Workgroup (x, t): groups 64x .. 64x + 63 of token t (four blocks), one per invocation; the
// blocks' max |x| and sum q in workgroup atomics. K is a multiple of 256.

struct QParams {
    cols: u32,
    n_tokens: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> xq: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> xs: array<u32>;
@group(0) @binding(3) var<uniform> qp: QParams;

const WG: u32 = 64u;
// Per block of the workgroup: max |x| as f32 bits (a NaN as 0x7fc00000, above every other),
// then sum q.
var<workgroup> bmax: array<atomic<u32>, 4>;
var<workgroup> bsum: array<atomic<i32>, 4>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = wid.y;
    let groups = qp.cols / 16u;
    let g = wid.x * WG + lid;
    let lb = lid / 16u;
    if lid < 4u {
        atomicStore(&bmax[lid], 0u);
        atomicStore(&bsum[lid], 0);
    }
    workgroupBarrier();
    // Every invocation reaches every barrier: those past the row's groups load its last group
    // and store nothing.
    let live = g < groups;
    let xb = (t * groups + min(g, groups - 1u)) * 4u;
    let a0 = x[xb];
    let a1 = x[xb + 1u];
    let a2 = x[xb + 2u];
    let a3 = x[xb + 3u];
    if live {
        let m4 = max(max(abs(a0), abs(a1)), max(abs(a2), abs(a3)));
        let nan = any(nan4(a0) | nan4(a1) | nan4(a2) | nan4(a3));
        let mb = bitcast<u32>(max(max(m4.x, m4.y), max(m4.z, m4.w)));
        atomicMax(&bmax[lb], select(mb, 0x7fc00000u, nan));
    }
    workgroupBarrier();
    let amax = bitcast<f32>(atomicLoad(&bmax[lb]));
    let d = amax / 127.0;
    let id = select(0.0, 1.0 / d, amax > 0.0);
    let q0 = quant4(a0 * id);
    let q1 = quant4(a1 * id);
    let q2 = quant4(a2 * id);
    let q3 = quant4(a3 * id);
    if live {
        xq[t * groups + g] = vec4<u32>(
            pack4xI8(vec4<i32>(q0.x, q1.x, q2.x, q3.x)),
            pack4xI8(vec4<i32>(q0.y, q1.y, q2.y, q3.y)),
            pack4xI8(vec4<i32>(q0.z, q1.z, q2.z, q3.z)),
            pack4xI8(vec4<i32>(q0.w, q1.w, q2.w, q3.w)),
        );
        let s = (q0 + q1) + (q2 + q3);
        atomicAdd(&bsum[lb], (s.x + s.y) + (s.z + s.w));
    }
    workgroupBarrier();
    if live && lid % 16u == 0u {
        let o = 2u * (t * (qp.cols / 256u) + g / 16u);
        xs[o] = bitcast<u32>(d);
        xs[o + 1u] = bitcast<u32>(atomicLoad(&bsum[lb]));
    }
}
