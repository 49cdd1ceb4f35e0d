// Body: the embedding gather, out[t, k] = W[ids[t], k] for t < n_tokens (out is [n_tokens,
// K] f32, row-major; ids a u32 per token, read here, never by the host). Invocation i takes
// token i / (K/32), unit i % (K/32): it decodes the unit with `unit` (the CPU dequantizer's
// bits) and stores its 32 values. An id >= the weight's rows reads the last row (the host
// checks ids before writing them; this only keeps every read in bounds). A weight in several
// row chunks is one dispatch per chunk; each stores the tokens whose row it holds.

@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let units = params.cols / 32u;
    let i = (wid.y * params.groups_x + wid.x) * WG + lid;
    if i >= params.n_tokens * units {
        return;
    }
    let t = i / units;
    let u = i - t * units;
    let id = min(ids[t], params.out_rows - 1u);
    if id < params.row0 || id - params.row0 >= params.rows {
        return;
    }
    let v = unit(id - params.row0, u);
    let o = i * 8u;
    for (var j = 0u; j < 8u; j++) {
        out[o + j] = v[j];
    }
}
