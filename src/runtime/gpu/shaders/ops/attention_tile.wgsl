// Prefill attention in tiles (flash attention): one workgroup takes R query rows that share
// one KV head and one split of the positions, and walks the split's positions in tiles of KT,
// each tile's keys and then its values staged once in workgroup memory for all R rows. The
// rows of KV head h are the chunk's tokens times the G = heads / kv_heads query heads that
// share it, row r being token r / G and query head h * G + r % G, so a workgroup holds all of
// a token's heads of that KV head (MiniCPM4's 16, Qwen2.5's 7) and rows of a few neighbouring
// tokens. attention.wgsl and attention_group.wgsl give each (token, head) or (token, head
// group) a workgroup that reads the keys and values itself, one score per invocation: at a
// 256-token chunk of the 8B ternary shape, 1.4 ms a layer on an H200 (BENCHMARKS.md).
//
// The partial softmax state written is attention.wgsl's (read its comment): for each row and
// split, the running max m of the scores s_j = (q . k_j) * kq_scale over the row's positions
// in the split (lo..=pos, lo = pos + 1 - window on a sliding-window layer, else 0), l = sum_j
// exp(s_j - m), acc[d] = sum_j exp(s_j - m) v_j[d]; a split with no position of the row
// writes m = -3.4e38, l = 0, acc = 0. attention_combine.wgsl merges the splits.
//
// Per tile, with WG = 128 invocations (four barriers):
//   1. the tile's keys (KT positions x HD/2 words of two f16) into `kv` (each invocation
//      loaded its LD words a step earlier, into registers) and the tile's values' loads;
//   2. scores: invocation i takes rows SBR * (i / 8) .. + SBR and positions i % 8 + 8 b
//      (b < SBK), each a dot over the head's dims in pairs (q from `qs`, the key's pair
//      widened by unpack2x16float: exact for normal f16, a driver may flush subnormals),
//      times kq_scale, into `sc`;
//   3. the tile's values into `kv` (the keys are no longer read) and the next tile's keys'
//      loads; each row's IPR invocations take KPI positions each: their max into `pm`;
//   4. each row's new max from its IPR partial maxes (in order), the weights exp(s - m_new)
//      of its valid positions into `sc` (0 for the others), the row's rescale exp(m_old -
//      m_new) into `cr`; each invocation keeps its own part of the row's l, rescaled alike;
//   5. the weighted values: invocation i owns rows SBR * (i / 8) .. + SBR and dim pairs
//      i % 8 + 8 w (w < OBW), R * HD / 128 = 32 values in SBR * OBW vec2 accumulators,
//      rescaled by `cr`, then adds each position's weight times its value pair in position
//      order, skipping the positions outside the row's range (a position a later token of
//      the chunk attends to, or one outside a window, holding an inf or NaN value, leaves the
//      row as the other attention kernels and the CPU leave it).
// The rows' bounds are workgroup-uniform (the loop runs from the first row's lowest position
// to the last row's highest), each row masked to its own. exp is WGSL's precise exp.
// Template (src/runtime/gpu/ops.rs): HD (64, 128 or 256), R = 4096 / HD and KT (32, or 16 at
// HD 256) are substituted per variant `op_attention_tile_hd{HD}`, so that every array of
// workgroup memory is sized at compile time (at most 30 KB), and each block between
// `//@for NAME COUNT` and its `//@end` is repeated COUNT times (a constant below) with
// `{NAME}` replaced by 0, 1, ...: each invocation's scores and accumulators are scalars of
// their own (private arrays indexed in loops are kept in memory by some compilers). Needs
// unpack2x16float (wgpu's SHADER_F16_IN_F32).
//
// q: [tokens, heads, head_dim] f32; caches [kv_heads, n_ctx, head_dim] f16 pairs in u32
// (kv_store.wgsl); part: [tokens, heads, splits, head_dim + 2] f32 (m, l, acc).
// Grid: (ceil(tokens * G / R), splits, kv_heads).

struct P {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    n_ctx: u32,
    splits: u32,
    chunk: u32,
    // 0: every earlier position
    window: u32,
    kq_scale: f32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<u32>;
@group(0) @binding(2) var<storage, read> vc: array<u32>;
@group(0) @binding(3) var<storage, read_write> part: array<f32>;
@group(0) @binding(4) var<uniform> p: P;
@group(0) @binding(5) var<uniform> step: Step;

const WG: u32 = 128u;
const HD: u32 = 0u;
const R: u32 = 0u;
const KT: u32 = 0u;
// Words (f16 pairs) of a head.
const HW: u32 = HD / 2u;
// Padded strides (a word more per row, so that the 8 positions or pairs an instruction
// reads fall in different banks).
const QS: u32 = HW + 1u;
const KS: u32 = HW + 1u;
const SS: u32 = KT + 1u;
// Rows and positions of an invocation's scores; dim pairs of its accumulators per row.
const SBR: u32 = R / 16u;
const SBK: u32 = KT / 8u;
const OBW: u32 = HW / 8u;
// Invocations per row and positions per invocation in the softmax steps.
const IPR: u32 = WG / R;
const KPI: u32 = KT / IPR;
const NEG: f32 = -3.4028234663852886e38;

var<workgroup> qs: array<vec2<f32>, R * QS>;
var<workgroup> kv: array<u32, KT * KS>;
var<workgroup> sc: array<f32, R * SS>;
var<workgroup> pm: array<f32, WG>;
var<workgroup> cr: array<f32, R>;

// The first position (inclusive) and the end (exclusive) of split `split` that the token at
// `pos` attends to.
fn row_range(pos: u32, split: u32) -> vec2<u32> {
    var lo = 0u;
    if p.window > 0u && pos + 1u > p.window {
        lo = pos + 1u - p.window;
    }
    return vec2<u32>(max(lo, split * p.chunk), min(pos + 1u, (split + 1u) * p.chunk));
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let g = p.heads / p.kv_heads;
    let rows = step.n * g;
    let r0 = wid.x * R;
    // Uniform over the workgroup: no barrier below is skipped by some invocations only.
    if r0 >= rows {
        return;
    }
    let split = wid.y;
    let kvh = wid.z;
    let cbase = kvh * p.n_ctx * HW;
    // The workgroup's positions: from its first row's start to its last row's end.
    let first = row_range(step.pos0 + r0 / g, split);
    let last = row_range(step.pos0 + (min(r0 + R, rows) - 1u) / g, split);
    let start = first.x;
    let end = last.y;
    // The positions every real row of the workgroup attends to: from the last row's start
    // to the first row's end (empty where the rows' ranges do not all overlap; rows past the
    // chunk's last token are never stored).
    let inner = vec2<u32>(last.x, first.y);

    // The rows' queries (every load issued before any store).
    //@for i QLD
    let qi_{i} = lid + {i}u * WG;
    let qr_{i} = r0 + qi_{i} / HW;
    var qv_{i} = vec2<f32>(0.0);
    if qr_{i} < rows {
        let e = ((qr_{i} / g) * p.heads + kvh * g + qr_{i} % g) * HD + 2u * (qi_{i} % HW);
        qv_{i} = vec2<f32>(q[e], q[e + 1u]);
    }
    //@end
    //@for i QLD
    qs[(qi_{i} / HW) * QS + qi_{i} % HW] = qv_{i};
    //@end

    // Steps 2 and 5: rows SBR * rg .. and positions / dim pairs kg + 8 b.
    let rg = lid / 8u;
    let kg = lid % 8u;
    // Steps 3 and 4: row srow, positions ssub * KPI ..
    let srow = lid / IPR;
    let ssub = lid % IPR;
    let sr = r0 + srow;
    let s_range = row_range(step.pos0 + min(sr, rows - 1u) / g, split);
    let s_valid = sr < rows;
    var m = NEG;
    var l = 0.0;
    // Step 5's rows' own ranges (empty for a row past the chunk's last token).
    //@for r SBR
    let pr_{r} = r0 + rg * SBR + {r}u;
    let range_{r} = select(vec2<u32>(0u), row_range(step.pos0 + min(pr_{r}, rows - 1u) / g, split), pr_{r} < rows);
    //@end
    //@for r SBR
    //@for d OBW
    var acc_{r}_{d} = vec2<f32>(0.0);
    //@end
    //@end

    // Word lid + i WG of a tile (position e / HW, word e % HW) is this invocation's i-th
    // load; each tile's keys and values are loaded into registers a step before they are
    // stored into `kv` (the first tile's keys here), so that the loads' latency overlaps the
    // arithmetic.
    //@for i LD
    let e_{i} = lid + {i}u * WG;
    let kvi_{i} = (e_{i} / HW) * KS + e_{i} % HW;
    var kr_{i} = 0u;
    var vr_{i} = 0u;
    if start < end && e_{i} / HW < end - start {
        kr_{i} = kc[cbase + start * HW + e_{i}];
    }
    //@end

    for (var tile = start; tile < end; tile += KT) {
        let n_tile = min(KT, end - tile);
        // 1. Keys; the values' loads issued.
        //@for i LD
        kv[kvi_{i}] = kr_{i};
        vr_{i} = 0u;
        if e_{i} / HW < n_tile {
            vr_{i} = vc[cbase + tile * HW + e_{i}];
        }
        //@end
        workgroupBarrier();
        // 2. Scores.
        //@for r SBR
        //@for k SBK
        var s_{r}_{k} = 0.0;
        //@end
        //@end
        for (var w = 0u; w < HW; w++) {
            //@for k SBK
            let k_{k} = unpack2x16float(kv[(kg + 8u * {k}u) * KS + w]);
            //@end
            //@for r SBR
            let q_{r} = qs[(rg * SBR + {r}u) * QS + w];
            //@for k SBK
            s_{r}_{k} += q_{r}.x * k_{k}.x + q_{r}.y * k_{k}.y;
            //@end
            //@end
        }
        //@for r SBR
        //@for k SBK
        sc[(rg * SBR + {r}u) * SS + kg + 8u * {k}u] = s_{r}_{k} * p.kq_scale;
        //@end
        //@end
        workgroupBarrier();
        // 3. Values; the next tile's keys' loads issued; each invocation's partial max of
        // its row.
        let next = tile + KT;
        //@for i LD
        kv[kvi_{i}] = vr_{i};
        kr_{i} = 0u;
        if next < end && e_{i} / HW < end - next {
            kr_{i} = kc[cbase + next * HW + e_{i}];
        }
        //@end
        var mx = NEG;
        for (var c = 0u; c < KPI; c++) {
            let j = ssub * KPI + c;
            let jp = tile + j;
            if s_valid && jp >= s_range.x && jp < s_range.y {
                mx = max(mx, sc[srow * SS + j]);
            }
        }
        pm[lid] = mx;
        workgroupBarrier();
        // 4. The row's new max, its weights and rescale.
        var m_new = m;
        for (var i = 0u; i < IPR; i++) {
            m_new = max(m_new, pm[srow * IPR + i]);
        }
        let corr = exp(m - m_new);
        m = m_new;
        var lt = 0.0;
        for (var c = 0u; c < KPI; c++) {
            let j = ssub * KPI + c;
            let jp = tile + j;
            let ok = s_valid && jp >= s_range.x && jp < s_range.y;
            let e = select(0.0, exp(sc[srow * SS + j] - m_new), ok);
            sc[srow * SS + j] = e;
            lt += e;
        }
        l = l * corr + lt;
        if ssub == 0u {
            cr[srow] = corr;
        }
        workgroupBarrier();
        // 5. The weighted values.
        //@for r SBR
        let c_{r} = cr[rg * SBR + {r}u];
        //@for d OBW
        acc_{r}_{d} *= c_{r};
        //@end
        //@end
        // A tile inside every row's range (all but the first and last few) adds every
        // position; the others skip each row's positions outside its range. Uniform over
        // the workgroup: `inner` and `outer` bound every row's range.
        if tile >= inner.x && tile + n_tile <= inner.y {
            for (var j = 0u; j < n_tile; j++) {
                //@for d OBW
                let v_{d} = unpack2x16float(kv[j * KS + kg + 8u * {d}u]);
                //@end
                //@for r SBR
                let wt_{r} = sc[(rg * SBR + {r}u) * SS + j];
                //@for d OBW
                acc_{r}_{d} += wt_{r} * v_{d};
                //@end
                //@end
            }
        } else {
            for (var j = 0u; j < n_tile; j++) {
                //@for d OBW
                let v_{d} = unpack2x16float(kv[j * KS + kg + 8u * {d}u]);
                //@end
                //@for r SBR
                let wt_{r} = sc[(rg * SBR + {r}u) * SS + j];
                if tile + j >= range_{r}.x && tile + j < range_{r}.y {
                    //@for d OBW
                    acc_{r}_{d} += wt_{r} * v_{d};
                    //@end
                }
                //@end
            }
        }
        workgroupBarrier();
    }

    // The rows' l from their invocations' parts (in order), then the partial state.
    pm[lid] = l;
    workgroupBarrier();
    if s_valid && ssub == 0u {
        var lr = 0.0;
        for (var i = 0u; i < IPR; i++) {
            lr += pm[srow * IPR + i];
        }
        let out = (((sr / g) * p.heads + kvh * g + sr % g) * p.splits + split) * (HD + 2u);
        part[out] = m;
        part[out + 1u] = lr;
    }
    //@for r SBR
    let r_{r} = r0 + rg * SBR + {r}u;
    if r_{r} < rows {
        let out = (((r_{r} / g) * p.heads + kvh * g + r_{r} % g) * p.splits + split) * (HD + 2u);
        //@for d OBW
        part[out + 2u + 2u * (kg + 8u * {d}u)] = acc_{r}_{d}.x;
        part[out + 3u + 2u * (kg + 8u * {d}u)] = acc_{r}_{d}.y;
        //@end
    }
    //@end
}
