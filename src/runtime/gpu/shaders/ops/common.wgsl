// Shared by every op module (prepended by the registry, src/runtime/gpu/ops.rs).
//
// Step: written by the host before each submission (queue.write_buffer, ordered before the
// submission's commands), so one set of bind groups made at load serves every step.
struct Step {
    // Position of the chunk's first token.
    pos0: u32,
    // Tokens of the chunk that are real (the rest of the bucket is padding, never stored).
    n: u32,
    _pad0: u32,
    _pad1: u32,
}

// Positions per split of the split attention for a token at position pos
// (attention_decode.wgsl, attention_combine.wgsl): `chunk`, the splits' fixed size, where
// grain is 0; else ceil((pos + 1) / splits) rounded up to a multiple of grain, at most chunk
// (splits * chunk >= n_ctx > pos, so every position has a split): early in a long context the
// positions go to ceil((pos + 1) / c) splits of c instead of a few splits of `chunk` (at
// position 512 with 64 splits and grain 8, 33 splits of 16 instead of 9 of 64).
fn split_chunk(pos: u32, splits: u32, chunk: u32, grain: u32) -> u32 {
    if grain == 0u {
        return chunk;
    }
    let even = pos / splits + 1u;
    return min(chunk, (even + grain - 1u) / grain * grain);
}

// IEEE binary16 bits (low 16 bits of h) to f32, exactly, with integer operations (no
// SHADER_F16 feature, no denormal flushing).
fn f16_bits_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if e == 0u {
        return bitcast<f32>(sign | bitcast<u32>(f32(m) * 5.9604644775390625e-8));
    }
    if e == 31u {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

// f32 to IEEE binary16 bits, rounded to nearest, ties to even (as the `half` crate and the
// CPU backend's KV cache round), with integer operations: exact on every adapter, where
// pack2x16float leaves the rounding to the implementation.
fn f32_to_f16_bits(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    let sign = (x >> 16u) & 0x8000u;
    let ax = x & 0x7fffffffu;
    if ax >= 0x7f800000u {
        // inf, or NaN (quiet, top payload bits kept)
        return sign | 0x7c00u | select(0u, 0x200u | ((ax >> 13u) & 0x3ffu), ax > 0x7f800000u);
    }
    if ax >= 0x477ff000u {
        // 65520 and above round to inf
        return sign | 0x7c00u;
    }
    if ax < 0x38800000u {
        // below 2^-14: a subnormal f16 (units of 2^-24) or zero
        if ax < 0x33000000u {
            return sign;
        }
        let e = ax >> 23u;
        let m = (ax & 0x7fffffu) | 0x800000u;
        let shift = 126u - e;
        let q = m >> shift;
        let rem = m & ((1u << shift) - 1u);
        let half = 1u << (shift - 1u);
        var r = q;
        if rem > half || (rem == half && (q & 1u) == 1u) {
            r += 1u;
        }
        return sign | r;
    }
    var r = (ax - 0x38000000u) >> 13u;
    let rem = ax & 0x1fffu;
    if rem > 0x1000u || (rem == 0x1000u && (r & 1u) == 1u) {
        r += 1u;
    }
    return sign | r;
}
