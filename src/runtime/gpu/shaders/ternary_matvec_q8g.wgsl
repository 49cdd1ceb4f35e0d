// Ternary matrix-vector product y = W x for decode with x quantized to int8 once, before the
// product, by the quantize kernel (q8_quantize_vec, generated in src/runtime/gpu/mod.rs:
// `ternary_q8_quantize`, `_rms` with the RMSNorm folded in): the subgroup-rows work split and
// unit arithmetic of ternary_matvec_q8.wgsl, without the per-workgroup quantization, its
// workgroup memory and its barriers. Every workgroup reads the same few kilobytes of x from
// the caches; rows per workgroup are a choice of the dispatch, not of how often x is
// quantized.
//
// x (binding 2), what the quantize kernel writes for K activations, as vec4<u32>:
//   [0, K/16)             16-element group g (elements 16g..16g+15) at index g: word k holds
//                         the int8 q of elements 16g+k, 16g+4+k, 16g+8+k, 16g+12+k (the
//                         group layout of q8_common.wgsl), not swizzled
//   [K/16, K/16 + K/128)  per pair of 64-element units 2i, 2i+1 (one block of 256 holds four
//                         units): (sum q of unit 2i as i32, da of its block as f32,
//                         sum q of unit 2i+1, da again)
// The per-unit term is ternary_matvec_q8.wgsl's: (d_b * da_b) * f32(sum c*q - sum q).
//
// The host prepends ROWS, WG, RS, P (as ternary_matvec_q8.wgsl, no XK), q8_common.wgsl and
// ternary_matvec_q8_body.wgsl, and appends the entry point `main`.

@group(0) @binding(2) var<storage, read> x: array<vec4<u32>>;
