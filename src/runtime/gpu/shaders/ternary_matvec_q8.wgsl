// Ternary matrix-vector product y = W x for decode with int8 activations (`--kernel int8`,
// the GPU's default where the adapter has subgroups): the subgroup-rows work split of
// ternary_matvec_rows.wgsl, with x quantized once per workgroup into workgroup memory and each
// 64-element unit's dot product taken exactly in integers by dot4I8Packed (DP4A where the
// device has it: SPIR-V OpSDot under VK_KHR_shader_integer_dot_product; naga lowers it to
// shifts and multiplies elsewhere).
//
// Buffers as ternary_matvec.wgsl:
//   codes   [rows, K/64] vec4<u32>, element 16w+j of a row in bits 2j..2j+1 of word w, code c
//           in {0, 1, 2} meaning c - 1
//   scales  [rows, K/256] IEEE f16, two to a u32, flat index row * K/256 + b
//   x       [K] f32 (as vec4<f32>),  y [rows] f32
//
// Activations, as the CPU's int8 kernel quantizes them (src/runtime/q8.rs): per block of 256,
// da = max|x| / 127, q = round(x / da) (half away from zero, clamped to +-127), da = 0 and q = 0
// for an all-zero block. In workgroup memory, 16-element group g (elements 16g..16g+15) is
// one vec4<u32> whose word k holds the int8 q of elements 16g+k, 16g+4+k, 16g+8+k, 16g+12+k
// (bytes 0..3): then `(w >> 2k) & 0x03030303` of code word w holds the codes of exactly those
// elements, one per byte, and dot4I8Packed gives their four products. Unit u (groups 4u..4u+3)
// is stored at 4u + (g ^ ((u >> 1) & 3)): eight lanes reading eight consecutive units hit
// eight distinct 16-byte bank groups. The sum of q over each unit is kept beside it.
//
// Formula per unit of a row (block b): (d_b * da_b) * f32(sum c*q - sum q), c*q summed exactly
// in integers (|sum| <= 64 * 2 * 127), the units' terms added in f32 per lane and then across
// the subgroup. The CPU int8 kernel adds the same products per block of 256 in a fixed order:
// same integers, other f32 rounding of the sum (tolerance in src/runtime/gpu/mod.rs).
//
// The host (src/runtime/gpu/mod.rs) prepends
//   const ROWS: u32   rows per workgroup (a multiple of RS)
//   const WG: u32     invocations per workgroup (a power of two)
//   const RS: u32     rows per subgroup pass
//   const P: u32      units per lane per chunk (1, 2 or 4)
//   const XK: u32     the largest K the kernel takes (its workgroup memory: XK + XK/16 + XK/32
//                     bytes)
// then q8_common.wgsl and ternary_matvec_q8_body.wgsl (parameters, bindings other than x,
// the epilogue, the unit dot product), and appends the entry point `main`, unrolled over the
// RS rows and P units.

@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;

// x quantized: one vec4<u32> per 16-element group (layout above).
var<workgroup> xq: array<vec4<u32>, XK / 16u>;
// Per block of 256: max |x| as f32 bits (non-negative floats order as their bits; a NaN in
// the block is stored as the quiet-NaN bits 0x7fc00000, above every other, so that the
// block's da is NaN and every row the block touches comes out NaN, as the f32 kernels give),
// then da.
var<workgroup> bmax: array<atomic<u32>, XK / 256u>;
var<workgroup> bd: array<f32, XK / 256u>;
// Per unit of 64: the sum of q.
var<workgroup> usum: array<atomic<i32>, XK / 64u>;

// Where group g is stored.
fn xq_index(g: u32) -> u32 {
    let u = g >> 2u;
    return 4u * u + ((g & 3u) ^ ((u >> 1u) & 3u));
}
