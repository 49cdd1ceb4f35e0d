// The decode attention kernels' helpers (attention_decode.wgsl and the host-generated
// op_attention_decode_q8_hd*, src/runtime/gpu/mod.rs): RoPE of the staged query and the
// token's own key, and the f16 cache words as f32. Each module declares the parameters `p`
// (n_rot, neox, q_scale, head_dim) and the bindings q, k and table this reads.

// For a rotated element e (< n_rot): its pair's index i in the table and the pair (ia, ib):
// (2i, 2i + 1), or (i, i + n_rot / 2) for NEOX (rope_kv.wgsl).
fn rope_pair(e: u32) -> vec3<u32> {
    let rot = p.n_rot / 2u;
    if p.neox == 1u {
        let i = select(e, e - rot, e >= rot);
        return vec3<u32>(i, i, i + rot);
    }
    let i = e / 2u;
    return vec3<u32>(i, 2u * i, 2u * i + 1u);
}

// Element e of query head `head`, rotated for position pos and scaled by q_scale: the
// operations of rope_kv.wgsl in its order.
fn q_rotated(head: u32, e: u32, pos: u32) -> f32 {
    let base = head * p.head_dim;
    if e >= p.n_rot {
        return q[base + e] * p.q_scale;
    }
    let r = rope_pair(e);
    let cs = table[pos * (p.n_rot / 2u) + r.x];
    let x0 = q[base + r.y];
    let x1 = q[base + r.z];
    if e == r.y {
        return (x0 * cs.x - x1 * cs.y) * p.q_scale;
    }
    return (x0 * cs.y + x1 * cs.x) * p.q_scale;
}

// Element e of KV head `kvh`'s key, rotated for position pos (K's scale is 1), as
// rope_kv.wgsl's k_rotated.
fn k_rotated(kvh: u32, e: u32, pos: u32) -> f32 {
    let base = kvh * p.head_dim;
    if e >= p.n_rot {
        return k[base + e] * 1.0;
    }
    let r = rope_pair(e);
    let cs = table[pos * (p.n_rot / 2u) + r.x];
    let x0 = k[base + r.y];
    let x1 = k[base + r.z];
    if e == r.y {
        return (x0 * cs.x - x1 * cs.y) * 1.0;
    }
    return (x0 * cs.y + x1 * cs.x) * 1.0;
}

// The 8 f16 of a 16-byte cache word, as f32.
fn word_lo(w: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

fn word_hi(w: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w));
}
