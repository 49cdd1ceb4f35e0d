// int8 activations, shared by the int8 ternary kernels (ternary_matvec_q8.wgsl for decode,
// weights/q8_quantize.wgsl and weights/mmq_ternary2.wgsl for prefill; the host prepends it).
//
// Quantization, the CPU int8 kernel's formula (src/runtime/q8.rs): per block of 256,
// da = max|x| / 127, q = round(x * (1 / da)) (half away from zero, clamped to +-127), da = 0
// and q = 0 for an all-zero block. WGSL's division may differ from the CPU's in the last bit
// (Vulkan allows 2.5 ulp), so da, and q at a rounding tie, may differ from the CPU's. A NaN
// in the block makes da NaN here, so that every row it touches comes out NaN as with f32
// activations (the CPU's max skips a NaN: its da stays finite and the NaN's q is 0).
//
// Group layout: 16-element group g (elements 16g..16g+15) is one vec4<u32> whose word k
// holds the int8 q of elements 16g+k, 16g+4+k, 16g+8+k, 16g+12+k (bytes 0..3): then
// `(w >> 2k) & 0x03030303` of a ternary code word w (element 16w+j in bits 2j..2j+1) holds
// the codes of exactly those elements, one per byte, and dot4I8Packed gives their four
// products (word_dot).

// Whether each lane of v is a NaN, from its bits (WGSL lets an implementation assume that
// float comparisons never see a NaN).
fn nan4(v: vec4<f32>) -> vec4<bool> {
    return (bitcast<vec4<u32>>(v) & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u);
}

// round(t) half away from zero (Rust's f32::round, the CPU's), clamped to +-127, 0 for a NaN
// (as Rust's `as i8` gives; the NaN itself reaches the row through its block's da).
// WGSL's round is half to even; a tie is exactly t - trunc(t) = +-0.5.
fn quant4(t: vec4<f32>) -> vec4<i32> {
    let tr = trunc(t);
    let tie = abs(t - tr) == vec4<f32>(0.5);
    let r = select(round(t), tr + sign(t), tie);
    let q = clamp(r, vec4<f32>(-127.0), vec4<f32>(127.0));
    return vec4<i32>(select(q, vec4<f32>(0.0), nan4(t)));
}

const M2 = 0x03030303u;

// sum c*q over the 16 elements of code word w and activation words xw (the group layout).
fn word_dot(w: u32, xw: vec4<u32>) -> i32 {
    return (dot4I8Packed(w & M2, xw.x) + dot4I8Packed((w >> 2u) & M2, xw.y))
        + (dot4I8Packed((w >> 4u) & M2, xw.z) + dot4I8Packed((w >> 6u) & M2, xw.w));
}

