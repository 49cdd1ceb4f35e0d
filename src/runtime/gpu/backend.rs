//! The GPU backend: a [`Backend`] on wgpu, held to the CPU reference.
//!
//! At load, every weight is uploaded once ([`GpuContext::upload_model_weight`]), the small
//! vectors (norms, biases) as f32, the RoPE tables as the CPU backend computes them
//! ([`crate::runtime::cpu::rope_cache`]), the GELU table as the CPU builds it, and the f16 KV
//! cache is allocated per layer. Then, for decode (one token) and for each prefill bucket
//! `S`, the whole forward pass is bound once: a list of dispatches over fixed buffers sized
//! for `S` tokens. A step writes the token ids and the [`Step`] uniform (first position,
//! real tokens), encodes that list into one compute pass of one command buffer and submits
//! it: no host round-trip inside a step, no allocation after load. A prefill chunk shorter
//! than its bucket runs padded (padding rows are computed and never stored or attended).
//!
//! Greedy decoding reads back only the token id ([`Backend::argmax`] runs the argmax kernel,
//! which also leaves the id where the next step's embedding gather reads it). The full
//! logits are copied only by [`Backend::logits`].
//!
//! Numerics: f32 activations and accumulation everywhere, f16 KV cache rounded to nearest
//! even (as the CPU's), the same RoPE cos/sin and GELU table values as the CPU's; sums run in
//! other orders than the CPU's, so logits differ by f32 rounding (bounded per op in
//! `tests/gpu_ops.rs` and `tests/gpu_backend.rs`).

use super::kernels::{ATTENTION_COMBINE_Q8, COMBINE_Q8};
use super::ops::{self, grid_1d, Bindable, BufView, OpDispatch, Step, MAX_HEAD_DIM};
use super::weights::{Bound, GpuWeight, WeightFormat};
use super::{q8_quantize_name, ContextOptions, Epilogue, Fuse, GpuContext, GpuError};
use crate::arch::{Activation, RopeMode};
use crate::runtime::model::{Model, Weight};
use crate::runtime::{env_switch, Backend, BackendInfo, LoadOptions, RuntimeError};

/// Ids the argmax kernel can exclude (`--ignore-eos` bans a handful); more fall back to
/// reading the logits.
const MAX_BANNED: usize = 64;

fn gpu_err(e: GpuError) -> RuntimeError {
    RuntimeError::Backend {
        name: "gpu".into(),
        detail: e.to_string(),
    }
}

/// One dispatch list entry.
enum Item {
    Op(OpDispatch),
    Weight(Bound),
    /// The decode attention (`op_attention_decode`, one workgroup per query head and split),
    /// dispatched with only the splits that hold positions at the step's position:
    /// `min(splits, pos / c + 1)` with `c` = [`ops::split_chunk`] of these `[splits, chunk,
    /// grain]`, the splits the combine reads. The others would only write an empty state no
    /// op reads (on the 8B shape at position 512: 17 of 128 splits). The rows are counted
    /// when the item is encoded, from the position given to [`Item::encode`]: a command
    /// buffer encoded for one position must run with that position in the step uniform (as
    /// every submission here writes it), never be replayed at another.
    Splits(OpDispatch, [u32; 3]),
}

impl Item {
    /// The item's dispatches for a span starting at position `pos0`.
    fn encode(&self, pass: &mut wgpu::ComputePass<'_>, pos0: usize) {
        match self {
            Item::Op(o) => o.encode(pass),
            Item::Weight(b) => b.encode(pass),
            Item::Splits(o, [splits, chunk, grain]) => {
                let pos = pos0 as u32;
                let c = ops::split_chunk(pos, *splits, (*chunk).max(1), *grain);
                o.encode_rows(pass, (*splits).min(pos / c.max(1) + 1));
            }
        }
    }
    fn dispatches(&self) -> usize {
        match self {
            Item::Op(_) | Item::Splits(..) => 1,
            Item::Weight(b) => b.dispatches(),
        }
    }
    fn label(&self) -> String {
        match self {
            Item::Op(o) | Item::Splits(o, _) => o.name.to_string(),
            Item::Weight(b) => b.label.clone(),
        }
    }
}

/// Activations for `S` tokens. Q, K and V are the three parts of one buffer (`[S, nq]`,
/// `[S, nk]`, `[S, nk]` one after another: what a stacked Q/K/V product stores) and gate and
/// up the two parts of another, where the adapter's storage offset alignment allows binding
/// the parts; else each is a buffer of its own (and the weights are not stacked).
struct Acts {
    s: usize,
    ids: wgpu::Buffer,
    x: wgpu::Buffer,
    h: wgpu::Buffer,
    q: BufView,
    k: BufView,
    v: BufView,
    qn: wgpu::Buffer,
    kn: wgpu::Buffer,
    attn: wgpu::Buffer,
    o: wgpu::Buffer,
    o2: wgpu::Buffer,
    g: BufView,
    u: BufView,
    part: wgpu::Buffer,
    step: wgpu::Buffer,
}

/// Byte offsets of the parts of a buffer holding `S` tokens of vectors of `lens` f32 each,
/// part after part, for every bucket size in `sizes`: `Some` where every part of every size
/// starts where the adapter allows a binding.
fn part_offsets_aligned(ctx: &GpuContext, sizes: &[usize], lens: &[usize]) -> bool {
    let align = ctx.limits.min_storage_buffer_offset_alignment as u64;
    sizes.iter().all(|&s| {
        let mut off = 0u64;
        lens.iter().all(|&l| {
            let ok = off.is_multiple_of(align);
            off += (s * l * 4) as u64;
            ok
        })
    })
}

/// Views of one buffer holding `s` tokens of vectors of `lens` f32 each, part after part
/// (`stacked`), or of one buffer per part.
fn part_views(
    ctx: &GpuContext,
    label: &str,
    s: usize,
    lens: &[usize],
    stacked: bool,
) -> Result<Vec<BufView>, RuntimeError> {
    if !stacked {
        return Ok(lens
            .iter()
            .map(|&l| BufView::whole(&ctx.vector_buffer(label, s * l)))
            .collect());
    }
    let total: usize = lens.iter().sum();
    let buf = ctx.vector_buffer(label, s * total);
    let mut off = 0u64;
    let mut v = Vec::with_capacity(lens.len());
    for &l in lens {
        let size = (s * l * 4) as u64;
        v.push(
            ctx.view(&buf, off, size)
                .ok_or_else(|| RuntimeError::Backend {
                    name: "gpu".into(),
                    detail: format!("{label}: part at byte {off} cannot be bound on this adapter"),
                })?,
        );
        off += size;
    }
    Ok(v)
}

/// The forward pass for one bucket size, bound.
struct Graph {
    acts: Acts,
    items: Vec<Item>,
}

impl Graph {
    fn dispatches(&self) -> usize {
        self.items.iter().map(Item::dispatches).sum()
    }
}

/// Per-layer device vectors.
struct LayerVecs {
    attn_norm: wgpu::Buffer,
    ffn_norm: wgpu::Buffer,
    bq: Option<wgpu::Buffer>,
    bk: Option<wgpu::Buffer>,
    bv: Option<wgpu::Buffer>,
    /// Q, K and V's biases one after another (all three present): the stacked Q/K/V
    /// product's bias epilogue.
    bqkv: Option<wgpu::Buffer>,
    q_norm: Option<wgpu::Buffer>,
    k_norm: Option<wgpu::Buffer>,
    post_attn_norm: Option<wgpu::Buffer>,
    post_ffn_norm: Option<wgpu::Buffer>,
}

/// The GPU layer's weights. `qkv` is Q, K and V stacked into one weight (one product for
/// the three) or the three of them; `gate_up` likewise gate and up.
struct LayerWeights {
    qkv: Vec<GpuWeight>,
    wo: GpuWeight,
    gate_up: Vec<GpuWeight>,
    w_down: GpuWeight,
}

/// The GPU backend (see the module doc).
pub struct GpuBackend {
    ctx: GpuContext,
    model: Model,
    /// Graphs by bucket, ascending; `graphs[0]` is decode (S = 1).
    graphs: Vec<Graph>,
    buckets: Vec<usize>,
    buckets_from: &'static str,
    logits: wgpu::Buffer,
    result: wgpu::Buffer,
    banned: wgpu::Buffer,
    argmax_params: wgpu::Buffer,
    /// Argmax over the logits; writes the id where the decode graph's gather reads it.
    argmax: OpDispatch,
    /// Two staging buffers the argmax's id is copied into, alternately, for the pipelined
    /// greedy loop.
    ring: [wgpu::Buffer; 2],
    host_logits: Vec<f32>,
    host_logits_valid: bool,
    has_logits: bool,
    next_pos: usize,
    kv_bytes: u64,
    weight_bytes_device: u64,
    /// `int8` where the ternary decode products quantize their activations, else `f32`.
    kernel: &'static str,
    /// The output head (the embedding where tied) and the final norm's weight.
    head: (GpuWeight, wgpu::Buffer),
    /// The logits of every position of a chunk ([`Backend::prefill_logits`]), bound on first
    /// use; `Some(None)` where no bucket's logits fit one binding.
    logits_tail: Option<Option<LogitsTail>>,
}

/// Most bytes of the every-position logits buffer ([`LogitsTail`]): the largest bucket whose
/// `s * n_vocab` f32 logits fit is the one scored chunks run in (64 tokens for Qwen2.5's
/// 151,936-token vocabulary, 256 for SmolLM2's 49,152).
const LOGITS_TAIL_BYTES: u64 = 64 << 20;

/// What follows a prefill graph to give the logits of all its positions: the final norm of
/// every row of x, the head over all of them, the logit scale and soft cap.
struct LogitsTail {
    /// The graph it follows (its bucket holds `s` tokens).
    gi: usize,
    items: Vec<Item>,
    /// `[s, n_vocab]` f32.
    logits: wgpu::Buffer,
}

/// Bytes of one layer's K (or V) cache: `[n_head_kv, n_ctx, head_dim]` f16.
fn layer_kv_bytes(model: &Model) -> u64 {
    let hp = &model.layout.hyper;
    (hp.n_head_kv * hp.n_ctx * hp.head_dim * 2) as u64
}

/// Refuses a model that does not fit, before anything is uploaded: the bytes it needs at
/// least (its weights as stored, with ternary scales a second time as f32 and palette tables
/// widened to f32, the f16 KV cache,
/// the RoPE tables; activations are a few MB more) against `limit` (`--gpu-memory`), or without one the adapter's own figure where the
/// driver gives one ([`GpuContext::device_memory`]; a heap size is a driver's hint, which the
/// user may know better than: lavapipe reports 2 GiB whatever the RAM).
fn check_memory(ctx: &GpuContext, model: &Model, limit: Option<u64>) -> Result<(), RuntimeError> {
    let hp = &model.layout.hyper;
    // Ternary weights also carry their block scales as f32 for the int8 decode products
    // (`scales4`: twice the f16 scales' bytes); palette tables are uploaded as f32 (twice
    // their f16 bytes, counted once in the weights: once more here).
    let scales4: u64 = model
        .bundle
        .manifest
        .tensors
        .iter()
        .map(|t| match &t.encoding {
            crate::bundle::manifest::Encoding::Ternary2 { scales_length, .. } => 2 * scales_length,
            crate::bundle::manifest::Encoding::Palette { tables_length, .. } => *tables_length,
            _ => 0,
        })
        .sum();
    let weights = model.weight_bytes() + scales4;
    let kv = 2 * hp.n_layer as u64 * layer_kv_bytes(model);
    let mut keys: Vec<(u32, u32)> = (0..hp.n_layer)
        .map(|il| {
            let (base, fscale) = hp.rope_of_layer(il);
            (base.to_bits(), fscale.to_bits())
        })
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let tables = (keys.len() * hp.n_ctx * hp.n_rot.max(2) * 4) as u64;
    let needed = weights + kv + tables;
    let available = match (limit, ctx.device_memory) {
        (Some(l), _) => Some((l, "--gpu-memory".to_string())),
        (None, Some((d, what))) => Some((d, format!("{what}; --gpu-memory overrides"))),
        (None, None) => None,
    };
    match available {
        Some((avail, what)) if needed > avail => Err(RuntimeError::Backend {
            name: "gpu".into(),
            detail: format!(
                "the model needs at least {needed} bytes of device memory (weights {weights}, f16 KV cache {kv} for {} positions, RoPE tables {tables}) but {} has {avail} ({what}); nothing was uploaded",
                hp.n_ctx, ctx.info.name
            ),
        }),
        _ => Ok(()),
    }
}

fn f32_bytes(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

impl GpuBackend {
    /// Uploads `model` and binds its graphs.
    pub fn new(model: Model, opts: &LoadOptions) -> Result<GpuBackend, RuntimeError> {
        if opts.kv == crate::runtime::KvType::F32 {
            return Err(RuntimeError::Backend {
                name: "gpu".into(),
                detail: "the GPU backend keeps an f16 KV cache (--kv-cache f16)".into(),
            });
        }
        let (buckets, buckets_from) = crate::runtime::cpu::resolve_buckets(&model, opts)?;
        let sources = opts.gpu_sources.clone();
        let ctx = GpuContext::new(&ContextOptions {
            adapter: opts.gpu_adapter.clone(),
            sources,
            force_workgroup_reduction: opts.gpu_no_subgroups,
            int8: opts.kernel == crate::runtime::Kernel::Int8,
            max_binding_bytes: opts.gpu_max_binding_bytes,
            // The bundle's kernels that are this binary's own, byte for byte, without wgpu's
            // bounds checks on each array access (the host checks every binding against the
            // shapes; on an H100 with every kernel so, decode of the shape copies ran
            // 1.14-1.22x as fast, prompts 1.6-1.8x: BENCHMARKS.md); other sources keep them.
            // Measuring knobs:
            // `LOWBIT_GPU_CHECKED=1` keeps the checks everywhere, `LOWBIT_GPU_UNCHECKED=1`
            // drops them everywhere.
            unchecked_shaders: std::env::var("LOWBIT_GPU_UNCHECKED").is_ok_and(|v| v == "1"),
            unchecked_builtin: std::env::var("LOWBIT_GPU_CHECKED").map_or(true, |v| v != "1"),
        })
        .map_err(gpu_err)?;
        let hp = model.layout.hyper.clone();
        if hp.head_dim > MAX_HEAD_DIM || !hp.head_dim.is_multiple_of(8) {
            return Err(RuntimeError::Backend {
                name: "gpu".into(),
                detail: format!(
                    "head_dim {} is not a multiple of 8 up to {MAX_HEAD_DIM}",
                    hp.head_dim
                ),
            });
        }
        check_memory(&ctx, &model, opts.gpu_memory)?;
        let b = &model.bundle;
        let up = |w: &Weight| ctx.upload_model_weight(b, w).map_err(gpu_err);
        let vecbuf = |w: &Weight| {
            ctx.upload_bytes(&w.name, f32_bytes(&w.vector(b)))
                .map_err(gpu_err)
        };
        let ovec = |w: &Option<Weight>| w.as_ref().map(vecbuf).transpose();
        let tok_embd = up(&model.tok_embd)?;
        let output = if model.layout.cfg.tied_embeddings {
            None
        } else {
            Some(up(&model.output)?)
        };
        let output_norm = vecbuf(&model.output_norm)?;
        // Graph sizes: decode (1) and the prefill buckets.
        let mut sizes = vec![1usize];
        sizes.extend(buckets.iter().copied().filter(|&s| s > 1));
        let (nq, nk) = (hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim);
        let stack_qkv = part_offsets_aligned(&ctx, &sizes, &[nq, nk, nk]);
        let stack_gu = part_offsets_aligned(&ctx, &sizes, &[hp.n_ff, hp.n_ff]);
        // Stacked where the parts can be bound and the weights share an encoding; else one
        // weight each.
        let stacked = |ws: &[&Weight], ok: bool| -> Result<Vec<GpuWeight>, RuntimeError> {
            if ok {
                if let Some(w) = ctx.upload_stacked(b, ws).map_err(gpu_err)? {
                    return Ok(vec![w]);
                }
            }
            ws.iter().map(|w| up(w)).collect()
        };
        let mut layers = Vec::with_capacity(model.layers.len());
        let mut vecs = Vec::with_capacity(model.layers.len());
        for l in &model.layers {
            layers.push(LayerWeights {
                qkv: stacked(&[&l.wq, &l.wk, &l.wv], stack_qkv)?,
                wo: up(&l.wo)?,
                gate_up: stacked(&[&l.w_gate, &l.w_up], stack_gu)?,
                w_down: up(&l.w_down)?,
            });
            vecs.push(LayerVecs {
                attn_norm: vecbuf(&l.attn_norm)?,
                ffn_norm: vecbuf(&l.ffn_norm)?,
                bq: ovec(&l.bq)?,
                bk: ovec(&l.bk)?,
                bv: ovec(&l.bv)?,
                bqkv: match (&l.bq, &l.bk, &l.bv) {
                    (Some(q), Some(k), Some(v)) => {
                        let mut all = q.vector(b);
                        all.extend(k.vector(b));
                        all.extend(v.vector(b));
                        Some(
                            ctx.upload_bytes("q, k, v biases", f32_bytes(&all))
                                .map_err(gpu_err)?,
                        )
                    }
                    _ => None,
                },
                q_norm: ovec(&l.q_norm)?,
                k_norm: ovec(&l.k_norm)?,
                post_attn_norm: ovec(&l.post_attn_norm)?,
                post_ffn_norm: ovec(&l.post_ffn_norm)?,
            });
        }
        let weight_bytes_device = {
            let mut s = tok_embd.bytes() + output.as_ref().map_or(0, |w| w.bytes());
            for l in &layers {
                for w in l.qkv.iter().chain(&l.gate_up).chain([&l.wo, &l.w_down]) {
                    s += w.bytes();
                }
            }
            s
        };

        // RoPE tables, one per distinct (base, frequency scale), [n_ctx][n_rot / 2] (cos, sin).
        let (nctx, n_rot) = (hp.n_ctx, hp.n_rot);
        let mut tables: Vec<((u32, u32), wgpu::Buffer)> = Vec::new();
        let mut layer_table = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let (base, fscale) = hp.rope_of_layer(il);
            let key = (base.to_bits(), fscale.to_bits());
            let i = match tables.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    let mut t = vec![0f32; nctx * n_rot.max(2)];
                    for (pos, row) in t.chunks_exact_mut(n_rot.max(2)).enumerate() {
                        crate::runtime::cpu::rope_cache(
                            pos,
                            n_rot,
                            base,
                            fscale,
                            hp.rope_attn_factor,
                            model.rope_factors.as_deref(),
                            row,
                        );
                    }
                    tables.push((
                        key,
                        ctx.upload_bytes("rope table", f32_bytes(&t))
                            .map_err(gpu_err)?,
                    ));
                    tables.len() - 1
                }
            };
            layer_table.push(i);
        }
        let gelu = if model.layout.spec.activation == Activation::GeluTanh {
            Some(
                ctx.upload_bytes(
                    "gelu table",
                    bytemuck::cast_slice(crate::runtime::cpu::gelu_table()),
                )
                .map_err(gpu_err)?,
            )
        } else {
            None
        };

        // The KV cache: per layer [n_head_kv, n_ctx, head_dim] f16, K and V.
        let layer_kv_bytes = layer_kv_bytes(&model);
        if layer_kv_bytes > ctx.max_binding_bytes {
            return Err(gpu_err(GpuError::Limit {
                op: "KV cache",
                what: "one layer's K (bytes)",
                needed: layer_kv_bytes,
                limit: ctx.max_binding_bytes,
            }));
        }
        let mut kv = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let mk = |what: &str| {
                ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(&format!("{what} cache layer {il}")),
                    size: layer_kv_bytes,
                    usage: wgpu::BufferUsages::STORAGE,
                    mapped_at_creation: false,
                })
            };
            kv.push((mk("K"), mk("V")));
        }
        let kv_bytes = layer_kv_bytes * 2 * hp.n_layer as u64;

        let logits = ctx.vector_buffer("logits", hp.n_vocab);
        let hl = ctx.vector_buffer("last hidden", hp.n_embd);
        let result = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("argmax result"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let banned = ctx
            .upload_bytes("banned ids", &[0u8; MAX_BANNED * 4])
            .map_err(gpu_err)?;
        let argmax_params = ctx.uniform(
            "argmax params",
            bytemuck::cast_slice(&[hp.n_vocab as u32, 0, 0, 0]),
        );

        let shared = Shared {
            tok_embd: &tok_embd,
            output: output.as_ref().unwrap_or(&tok_embd),
            output_norm: &output_norm,
            layers: &layers,
            vecs: &vecs,
            tables: &tables,
            layer_table: &layer_table,
            kv: &kv,
            gelu: gelu.as_ref(),
            logits: &logits,
            hl: &hl,
        };
        let graphs = sizes
            .iter()
            .map(|&s| build_graph(&ctx, &model, &shared, s, stack_qkv, stack_gu))
            .collect::<Result<Vec<_>, _>>()?;
        let argmax = ctx
            .bind_op(
                "op_argmax",
                &[
                    &logits,
                    &banned,
                    &graphs[0].acts.ids,
                    &result,
                    &argmax_params,
                ],
                (1, 1, 1),
            )
            .map_err(gpu_err)?;
        // Keep the weights and tables alive with the bind groups that reference them (wgpu
        // resources are reference counted, so dropping the handles here is enough).
        // (The head and its norm stay: the logits of every position of a chunk are bound
        // from them on first use, `logits_tail`.)
        drop((layers, vecs, tables, kv, gelu, hl));
        let n_vocab = hp.n_vocab;
        let staging = |i: usize| {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(&format!("token id read-back {i}")),
                size: 16,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        let ring = [staging(0), staging(1)];
        // From the decode graph as bound: `int8` where every ternary product quantizes its
        // activations, `f32` where none does (no ternary weights, `--kernel f32`, no
        // subgroups), `int8+f32` where some fell back (a width or a variant this adapter or
        // the bundle's kernels lack).
        let kernel = {
            let labels: Vec<String> = graphs[0].items.iter().map(|i| i.label()).collect();
            let ternary = labels.iter().filter(|l| l.starts_with("ternary_matvec_"));
            let (n, q8) = ternary.fold((0, 0), |(n, q), l| {
                let int8 = [
                    "ternary_matvec_q8_",
                    "ternary_matvec_q8g_",
                    "ternary_matvec_q8g4_",
                ]
                .iter()
                .any(|p| l.starts_with(p));
                (n + 1, q + int8 as usize)
            });
            match q8 {
                0 => "f32",
                q if q == n => "int8",
                _ => "int8+f32",
            }
        };
        Ok(GpuBackend {
            kernel,
            ring,
            ctx,
            model,
            graphs,
            buckets,
            buckets_from,
            logits,
            result,
            banned,
            argmax_params,
            argmax,
            host_logits: vec![0f32; n_vocab],
            host_logits_valid: false,
            head: (output.unwrap_or(tok_embd), output_norm),
            logits_tail: None,
            has_logits: false,
            next_pos: 0,
            kv_bytes,
            weight_bytes_device,
        })
    }

    /// Dispatches one decode step records.
    pub fn dispatches_per_token(&self) -> usize {
        self.graphs[0].dispatches()
    }

    /// The labels of a decode step's dispatch list, in order (`kernel weight` for a product,
    /// the op's kernel name otherwise): which kernel each product runs.
    pub fn decode_labels(&self) -> Vec<String> {
        self.graphs[0].items.iter().map(|i| i.label()).collect()
    }

    /// The labels of the largest prefill bucket's dispatch list, as [`Self::decode_labels`]
    /// (the decode step's where the only bucket is 1).
    pub fn prefill_labels(&self) -> Vec<String> {
        let g = self.graphs.last().expect("the decode graph at least");
        g.items.iter().map(|i| i.label()).collect()
    }

    /// Times one decode step of `token` at `pos` on the device, for tools
    /// (`examples/gpu_decode_profile.rs`): [`Self::profile_span`] of one token.
    pub fn profile_decode(
        &mut self,
        token: u32,
        pos: usize,
    ) -> Result<(f64, Vec<(String, f64)>), RuntimeError> {
        self.profile_span(&[token], pos)
    }

    /// Times the graph that runs `tokens` at `pos` (the decode step for one token, else the
    /// smallest prefill bucket that holds them) on the device: first the whole graph as one
    /// compute pass, then each item of its dispatch list (an op, or a product's dispatches) in
    /// a pass of its own, both from timestamp queries. Returns the graph's nanoseconds and
    /// `(label, ns)` per item, in order (a pass per item adds its own start and end, so the
    /// items add up to more than the graph). Writes the KV cache at the span's positions, as
    /// running it does. Needs the adapter's TIMESTAMP_QUERY. With `LOWBIT_PROFILE_SKIP`
    /// (substrings of item labels, comma-separated) the whole-graph pass leaves the items
    /// whose label holds one out: their cost inside the chain, by difference.
    pub fn profile_span(
        &mut self,
        tokens: &[u32],
        pos: usize,
    ) -> Result<(f64, Vec<(String, f64)>), RuntimeError> {
        if !self.ctx.has_timestamps() {
            return Err(gpu_err(GpuError::MissingFeature {
                op: "profile",
                adapter: self.ctx.info.name.clone(),
                feature: "TIMESTAMP_QUERY",
            }));
        }
        let max = *self.buckets.last().unwrap_or(&1);
        self.check_span(tokens, pos, max.max(1))?;
        let gi = self
            .graphs
            .iter()
            .position(|g| g.acts.s >= tokens.len())
            .unwrap_or(self.graphs.len() - 1);
        let g = &self.graphs[gi];
        let n = g.items.len() + 1;
        let q = &self.ctx.queue;
        let mut ids = vec![0u32; g.acts.s];
        ids[..tokens.len()].copy_from_slice(tokens);
        q.write_buffer(&g.acts.ids, 0, bytemuck::cast_slice(&ids));
        let step = Step {
            pos0: pos as u32,
            n: tokens.len() as u32,
            _pad: [0; 2],
        };
        q.write_buffer(&g.acts.step, 0, bytemuck::bytes_of(&step));
        let dev = &self.ctx.device;
        let qs = dev.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("profile"),
            ty: wgpu::QueryType::Timestamp,
            count: (2 * n) as u32,
        });
        let resolve = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("profile timestamps"),
            size: (16 * n) as u64,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let mut enc = dev.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        let writes = |i: usize| {
            Some(wgpu::ComputePassTimestampWrites {
                query_set: &qs,
                beginning_of_pass_write_index: Some(2 * i as u32),
                end_of_pass_write_index: Some(2 * i as u32 + 1),
            })
        };
        // `LOWBIT_PROFILE_SKIP` = labels' substrings, comma-separated: the whole-graph pass
        // leaves those items out (its outputs are then wrong; a measuring knob: the
        // difference to the full pass is those items' cost inside the chain).
        let list = |knob: &str| -> Vec<String> {
            std::env::var(knob)
                .map(|v| v.split(',').map(str::to_string).collect())
                .unwrap_or_default()
        };
        let skip = list("LOWBIT_PROFILE_SKIP");
        // `LOWBIT_PROFILE_SKIP_PRE`: the same for the quantize dispatches in front of the
        // products whose label holds one of the substrings (the products stay).
        let skip_pre = list("LOWBIT_PROFILE_SKIP_PRE");
        let holds = |list: &[String], label: &str| {
            list.iter()
                .any(|s| !s.is_empty() && label.contains(s.as_str()))
        };
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("step"),
                timestamp_writes: writes(0),
            });
            for it in &g.items {
                let label = it.label();
                match it {
                    _ if holds(&skip, &label) => {}
                    Item::Weight(b) if holds(&skip_pre, &label) => b.encode_with(&mut pass, false),
                    _ => it.encode(&mut pass, pos),
                }
            }
        }
        for (i, it) in g.items.iter().enumerate() {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: writes(i + 1),
            });
            it.encode(&mut pass, pos);
        }
        enc.resolve_query_set(&qs, 0..(2 * n) as u32, &resolve, 0);
        q.submit([enc.finish()]);
        let bytes = self
            .ctx
            .read_buffer(&resolve, (16 * n) as u64)
            .map_err(gpu_err)?;
        let t: &[u64] = bytemuck::cast_slice(&bytes);
        let period = q.get_timestamp_period() as f64;
        let ns: Vec<f64> = t
            .chunks_exact(2)
            .map(|p| p[1].saturating_sub(p[0]) as f64 * period)
            .collect();
        self.next_pos = pos + tokens.len();
        self.has_logits = true;
        self.host_logits_valid = false;
        Ok((
            ns[0],
            g.items
                .iter()
                .map(Item::label)
                .zip(ns[1..].iter().copied())
                .collect(),
        ))
    }

    /// The adapter's name.
    pub fn adapter(&self) -> &str {
        &self.ctx.info.name
    }

    fn check_span(&self, tokens: &[u32], start: usize, max: usize) -> Result<(), RuntimeError> {
        let hp = &self.model.layout.hyper;
        crate::runtime::check_span(
            tokens,
            start,
            max,
            hp.n_vocab as u64,
            hp.n_ctx as u64,
            self.next_pos,
        )
    }

    /// Tokens per chunk of `prefill_logits`' logits tail (its bucket), bound on first use;
    /// `None` where no bucket's `[S, n_vocab]` logits fit one binding, and `prefill_logits`
    /// runs the tokens as decode steps instead.
    pub fn logits_tail_rows(&mut self) -> Result<Option<usize>, RuntimeError> {
        if self.logits_tail.is_none() {
            self.logits_tail = Some(self.bind_logits_tail()?);
        }
        Ok(match &self.logits_tail {
            Some(Some(t)) => Some(self.graphs[t.gi].acts.s),
            _ => None,
        })
    }

    /// Binds [`LogitsTail`] behind the largest prefill graph whose logits fit
    /// [`LOGITS_TAIL_BYTES`] and one storage binding (else the smallest that fits a binding);
    /// `None` where none does.
    fn bind_logits_tail(&self) -> Result<Option<LogitsTail>, RuntimeError> {
        let hp = &self.model.layout.hyper;
        let (e, nv) = (hp.n_embd, hp.n_vocab);
        let bytes = |s: usize| (s * nv * 4) as u64;
        let fits = |gi: &usize| bytes(self.graphs[*gi].acts.s) <= self.ctx.max_binding_bytes;
        let prefill = 1..self.graphs.len();
        let gi = prefill
            .clone()
            .filter(fits)
            .rfind(|&gi| bytes(self.graphs[gi].acts.s) <= LOGITS_TAIL_BYTES)
            .or_else(|| prefill.clone().find(fits));
        let Some(gi) = gi else {
            return Ok(None);
        };
        let ctx = &self.ctx;
        let acts = &self.graphs[gi].acts;
        let s = acts.s;
        let h = ctx.vector_buffer("hidden, every position", s * e);
        let logits = ctx.vector_buffer("logits, every position", s * nv);
        let u32s = |v: &[u32]| ctx.uniform("params", bytemuck::cast_slice(v));
        let mut items = Vec::new();
        let p = u32s(&[e as u32, hp.norm_eps.to_bits(), s as u32, 0]);
        let (gx, gy) = super::grid(s as u64).ok_or_else(|| {
            gpu_err(GpuError::Shape {
                op: "rms_norm",
                detail: format!("{s} rows"),
            })
        })?;
        items.push(Item::Op(
            ctx.bind_op(
                "op_rms_norm",
                &[&acts.x, &self.head.1, &h, &p, &acts.step],
                (gx, gy, 1),
            )
            .map_err(gpu_err)?,
        ));
        items.push(Item::Weight(
            ctx.bind_matmul(&self.head.0, &h, &logits, s as u32)
                .map_err(gpu_err)?,
        ));
        if hp.logit_mul.is_some() || hp.final_softcap.is_some() {
            let (gx, gy) = grid_1d(s * nv, 256).map_err(gpu_err)?;
            let p = u32s(&[
                (s * nv) as u32,
                gx,
                hp.logit_mul.unwrap_or(1.0).to_bits(),
                hp.final_softcap.unwrap_or(0.0).to_bits(),
            ]);
            items.push(Item::Op(
                ctx.bind_op("op_scale", &[&logits, &p], (gx, gy, 1))
                    .map_err(gpu_err)?,
            ));
        }
        Ok(Some(LogitsTail { gi, items, logits }))
    }

    /// Runs graph `gi` on `tokens` at `start`: ids and step written, one command buffer.
    /// With `tail`, the bound [`LogitsTail`]'s items follow the graph in the same pass.
    fn run(&mut self, gi: usize, tokens: &[u32], start: usize, tail: bool) {
        let g = &self.graphs[gi];
        let mut ids = vec![0u32; g.acts.s];
        ids[..tokens.len()].copy_from_slice(tokens);
        self.ctx
            .queue
            .write_buffer(&g.acts.ids, 0, bytemuck::cast_slice(&ids));
        let extra: &[Item] = match &self.logits_tail {
            Some(Some(t)) if tail => &t.items,
            _ => &[],
        };
        self.submit_graph_with(gi, start, tokens.len(), None, extra);
        self.next_pos = start + tokens.len();
        self.has_logits = true;
        self.host_logits_valid = false;
    }
}

/// What every graph shares.
struct Shared<'a> {
    tok_embd: &'a GpuWeight,
    output: &'a GpuWeight,
    output_norm: &'a wgpu::Buffer,
    layers: &'a [LayerWeights],
    vecs: &'a [LayerVecs],
    tables: &'a [((u32, u32), wgpu::Buffer)],
    layer_table: &'a [usize],
    kv: &'a [(wgpu::Buffer, wgpu::Buffer)],
    gelu: Option<&'a wgpu::Buffer>,
    logits: &'a wgpu::Buffer,
    hl: &'a wgpu::Buffer,
}

/// The decode attention with RoPE and the KV store folded in (attention_decode.wgsl; needs
/// subgroups of at least [`ops::DECODE_ATTENTION_LANES`] and unpack2x16float,
/// [`GpuContext::has_f16_in_f32`]).
const DECODE_ATTENTION: &str = "op_attention_decode";

/// Attention splits for `s` tokens over `n_ctx` positions and the most positions each takes:
/// decode splits long contexts into up to 128 chunks of at least 64 positions (flash-decoding:
/// enough workgroups to fill a GPU when there are few heads, each workgroup's serial work
/// short; `op_attention_decode` spreads the positions up to the current one over the
/// splits, [`ops::split_chunk`], and only the splits that hold positions are dispatched,
/// `Item::Splits`); prefill chunks into up
/// to 8 (with the tiled prefill attention on an H200, splits of 256 positions gave the
/// same prompt speed as 1024: BENCHMARKS.md). At most `MAX_SPLITS` of
/// attention_combine.wgsl.
fn attention_splits(s: usize, n_ctx: usize) -> (usize, usize) {
    let splits = if s == 1 {
        n_ctx.div_ceil(64).clamp(1, 128)
    } else {
        n_ctx.div_ceil(1024).clamp(1, 8)
    };
    (splits, n_ctx.div_ceil(splits))
}

/// The forward pass for `s` tokens, bound. Fused where it can be: Q/K/V in one product and
/// gate/up in another where their weights are stacked (`stack_qkv`, `stack_gu`: the
/// activations are then parts of one buffer), RoPE of Q and K with the KV store in one op,
/// the residual adds in the output and down products' epilogues (where no norm comes between).
fn build_graph(
    ctx: &GpuContext,
    model: &Model,
    sh: &Shared,
    s: usize,
    stack_qkv: bool,
    stack_gu: bool,
) -> Result<Graph, RuntimeError> {
    let hp = &model.layout.hyper;
    let (e, hd, nh, nkv, nff) = (hp.n_embd, hp.head_dim, hp.n_head, hp.n_head_kv, hp.n_ff);
    let (nq, nk) = (nh * hd, nkv * hd);
    let (splits, chunk) = attention_splits(s, hp.n_ctx);
    let vb = |label: &str, n: usize| ctx.vector_buffer(label, n);
    let mut qkv = part_views(ctx, "q, k, v", s, &[nq, nk, nk], stack_qkv)?.into_iter();
    let mut gu = part_views(ctx, "gate, up", s, &[nff, nff], stack_gu)?.into_iter();
    let next = |it: &mut std::vec::IntoIter<BufView>| it.next().expect("one view per part");
    let acts = Acts {
        s,
        ids: ctx
            .upload_bytes("ids", &vec![0u8; s * 4])
            .map_err(gpu_err)?,
        x: vb("x", s * e),
        h: vb("h", s * e),
        q: next(&mut qkv),
        k: next(&mut qkv),
        v: next(&mut qkv),
        qn: vb("q normed", s * nq),
        kn: vb("k normed", s * nk),
        attn: vb("attn", s * nq),
        o: vb("o", s * e),
        o2: vb("o normed", s * e),
        g: next(&mut gu),
        u: next(&mut gu),
        part: vb("attention partials", s * nh * splits * (hd + 2)),
        step: ctx.uniform("step", bytemuck::bytes_of(&Step::default())),
    };
    let a = &acts;
    let mut items: Vec<Item> = Vec::new();
    let n_tok = s as u32;
    let op = |name: &'static str,
              bufs: &[&dyn Bindable],
              grid: (u32, u32, u32)|
     -> Result<Item, RuntimeError> {
        Ok(Item::Op(ctx.bind_op(name, bufs, grid).map_err(gpu_err)?))
    };
    let u32s = |v: &[u32]| ctx.uniform("params", bytemuck::cast_slice(v));
    let mm = |w: &GpuWeight, x: &wgpu::Buffer, y: &wgpu::Buffer, n: u32| {
        ctx.bind_matmul(w, x, y, n)
            .map(Item::Weight)
            .map_err(gpu_err)
    };
    let mm_with = |w: &GpuWeight, x: &wgpu::Buffer, y: &BufView, epilogue: Epilogue| {
        ctx.bind_matmul_with(w, x, y, n_tok, epilogue)
            .map(Item::Weight)
            .map_err(gpu_err)
    };
    // The products of stacked weights, or of each weight into its part.
    let mm_parts = |ws: &[GpuWeight], x: &wgpu::Buffer, ys: &[&BufView]| {
        if let [w] = ws {
            // One stacked weight: its parts are stored one after another from the first
            // part's offset, the buffer's start.
            let whole = BufView::whole(&ys[0].buffer);
            return Ok(vec![mm_with(w, x, &whole, Epilogue::Store)?]);
        }
        ws.iter()
            .zip(ys)
            .map(|(w, y)| mm_with(w, x, y, Epilogue::Store))
            .collect::<Result<Vec<_>, RuntimeError>>()
    };
    let residual = Epilogue::Accumulate(hp.residual_scale.unwrap_or(1.0));
    // The combine that writes the output product's int8 x, where the sources carry it.
    let combine_q8 = ctx.has_source(COMBINE_Q8)
        && std::env::var("LOWBIT_GPU_COMBINE_Q8").map_or(true, |v| v != "0");
    // That combine done by the decode attention's last workgroup of each block of 256
    // outputs (`op_attention_decode_combine_q8`, one dispatch and one barrier fewer a layer)
    // where the sources carry it, on Vulkan only (its workgroups pass their partials through
    // device-scope barriers and atomics, which naga's Metal output does not give across
    // threadgroups; `GpuContext::merges_decode_attention`), only with
    // `LOWBIT_GPU_ATTN_MERGE=1` (a measuring knob): on an H100 (run 33, BENCHMARKS.md) the
    // merged attention took 36.2 us a layer against 18.3 + 13.3 for the two dispatches and
    // the 8B decode 370 tok/s against 400, the same bits. Its counts (one per block), shared
    // by every layer's dispatch: each is back at 0 when its dispatch ends.
    let merge = ctx.merges_decode_attention()
        && std::env::var("LOWBIT_GPU_ATTN_MERGE").is_ok_and(|v| v == "1");
    // The decode attention dispatches every split, not only those that hold positions
    // (`Item::Splits`), with `LOWBIT_GPU_ATTN_ALL_SPLITS=1` (a measuring knob: the same bits).
    let all_splits = s == 1 && env_switch("LOWBIT_GPU_ATTN_ALL_SPLITS", false);
    let merge_counts = ctx.vector_buffer(
        "attention merge counts",
        if merge { (nh * hd).div_ceil(256) } else { 1 },
    );
    // The attention kernel, its query heads per workgroup and its split grain. Decode:
    // `op_attention_decode` (one cluster of invocations per score, splits that follow the
    // position) where the adapter has subgroups of at least its cluster size and
    // unpack2x16float (`has_f16_in_f32`; required of a bundle's older kernel too, which does
    // not use it: such an adapter then runs `op_attention`) and the sources carry it, else
    // `op_attention`; `LOWBIT_GPU_ATTN_DECODE=0` forces `op_attention` (a
    // benchmarking knob). Prefill chunks: query heads per workgroup (grouped-query
    // attention: the heads of a group share one KV head, whose keys and values the workgroup
    // then reads once) `ops::attention_group`, or `LOWBIT_GPU_ATTN_GROUP` = N (a benchmarking
    // knob; a divisor of heads / kv_heads up to 4, else the default); 1 where the kernels
    // lack the variant (a bundle made before them). Decode keeps one head per workgroup (its
    // few workgroups are bound by latency: in groups of 8, a decode step's attention ran
    // 2.5x slower on an H200). Before those, prefill takes the tiled attention
    // (`op_attention_tile_hd{64,128,256}`, `GpuContext::attention_tile`) where it runs: on
    // the H200 a 256-token chunk's attention of the 8B shape took 0.55 ms a layer against
    // 1.9 with groups of 4.
    let (attention, group, grain) = if s == 1 {
        let forced_off = !env_switch("LOWBIT_GPU_ATTN_DECODE", true);
        // A bundle's kernel may predate clusters of 4 (its `LANES` then needs subgroups of 8).
        let lanes = ctx
            .source_constant(DECODE_ATTENTION, "LANES")
            .unwrap_or(ops::DECODE_ATTENTION_LANES);
        if !forced_off
            && ctx.subgroup_ops(lanes)
            && ctx.has_f16_in_f32()
            && ctx.has_source(DECODE_ATTENTION)
        {
            // `LOWBIT_GPU_ATTN_GRAIN` = a positive multiple of 8 overrides the grain (a
            // benchmarking knob: any grain is correct; 8 and 16 give more, shorter splits).
            let grain = match std::env::var("LOWBIT_GPU_ATTN_GRAIN") {
                Ok(v) => match v.parse::<u32>() {
                    Ok(g) if g > 0 && g.is_multiple_of(8) => g,
                    _ => {
                        eprintln!(
                            "warning: LOWBIT_GPU_ATTN_GRAIN={v} is not a positive multiple of 8: \
                             using {}",
                            ops::DECODE_SPLIT_GRAIN
                        );
                        ops::DECODE_SPLIT_GRAIN
                    }
                },
                Err(_) => ops::DECODE_SPLIT_GRAIN,
            };
            (DECODE_ATTENTION, 1, grain)
        } else {
            (ops::attention_name(1), 1, 0)
        }
    } else {
        let group = match std::env::var("LOWBIT_GPU_ATTN_GROUP") {
            Ok(v) => match v.parse::<usize>() {
                Ok(g)
                    if (1..=ops::MAX_ATTENTION_GROUP).contains(&g)
                        && nkv > 0
                        && (nh / nkv).is_multiple_of(g) =>
                {
                    g
                }
                _ => {
                    let g = ops::attention_group(nh, nkv);
                    eprintln!(
                        "warning: LOWBIT_GPU_ATTN_GROUP={v} is not a divisor of the {} query \
                         heads per KV head from 1 to {}: using {g}",
                        nh / nkv.max(1),
                        ops::MAX_ATTENTION_GROUP
                    );
                    g
                }
            },
            Err(_) => ops::attention_group(nh, nkv),
        };
        // The tiled kernel where it runs here and its grid fits (`LOWBIT_GPU_ATTN_TILE=0`:
        // the grouped kernels, a benchmarking knob); `group` 0 marks it.
        let tile = std::env::var("LOWBIT_GPU_ATTN_TILE").map_or(true, |v| v != "0");
        let fits = || {
            nkv > 0
                && nh.is_multiple_of(nkv)
                && ops::attention_tile_workgroups(s, nh, nkv, hd) <= 65_535
        };
        match (tile, ctx.attention_tile(hd)) {
            (true, Some(name)) if fits() => (name, 0, 0),
            _ => match ops::attention_name(group) {
                name if ctx.has_source(name) => (name, group, 0),
                _ => (ops::attention_name(1), 1, 0),
            },
        }
    };
    // Which ops decode folds into the products: `LOWBIT_GPU_FOLD` = `all` (the norms into the
    // ternary Q/K/V and gate/up, the gating (SwiGLU, or GELU on GGUF weights) into gate/up),
    // `glu` (the gating only), `norm` (the norms only) or `none`. A benchmarking knob: the
    // folded and separate forms compute the same values within the tests' tolerances. The
    // default is `all` where the products take int8 activations (every workgroup quantizes
    // all of x anyway, so normalizing it on the way costs one more read of x and saves a
    // dispatch: 206 -> 241 tok/s on the 8B shape, BENCHMARKS.md) and `glu` with f32
    // activations (there each workgroup stages only a tile of x, and the norm's extra pass
    // over x cost an H200 more than the dispatch).
    let fold = std::env::var("LOWBIT_GPU_FOLD").unwrap_or_default();
    // (The probe asks for a ternary decode kernel, which a bundle without ternary weights
    // does not carry: there `int8` is false, and every use of `fold_norm` below is for ternary
    // products only.)
    let int8 = ctx.decodes_int8(e);
    let (fold_norm, fold_glu) = match fold.as_str() {
        "none" => (false, false),
        "norm" => (true, false),
        "all" => (true, true),
        "glu" => (false, true),
        _ => (int8, true),
    };
    // The norms into the GGUF products of matvec_quads.wgsl (x_rms.wgsl: each workgroup
    // computes the norm of x itself, op_rms_norm's bits; K is small in the models that have
    // them, 576 to 896): by default and with `norm` and `all`.
    let fold_gguf_norm = !matches!(fold.as_str(), "none" | "glu");
    // Decode: the products of the weights into their parts with the RMSNorm of x (`norm`:
    // its weight) and/or SwiGLU (`swiglu`) folded in, where every weight has such a kernel
    // here; `None` where one has not (the caller dispatches the ops on their own).
    let mm_fused = |ws: &[GpuWeight],
                    x: &wgpu::Buffer,
                    ys: &[&BufView],
                    norm: Option<&wgpu::Buffer>,
                    swiglu: bool|
     -> Result<Option<Vec<Item>>, RuntimeError> {
        if s != 1 || (norm.is_none() && !swiglu) {
            return Ok(None);
        }
        let fuse = Fuse {
            rms_norm: norm.is_some(),
            swiglu,
        };
        let whole;
        let targets: Vec<&BufView> = if ws.len() == 1 && ys.len() > 1 && !swiglu {
            whole = BufView::whole(&ys[0].buffer);
            vec![&whole]
        } else {
            ys.to_vec()
        };
        let mut items = Vec::with_capacity(ws.len());
        for (w, y) in ws.iter().zip(targets) {
            match ctx
                .bind_matvec_fused(w, x, y, fuse, norm.map(|n| (n, hp.norm_eps)))
                .map_err(gpu_err)?
            {
                Some(b) => items.push(Item::Weight(b)),
                None => return Ok(None),
            }
        }
        Ok(Some(items))
    };
    // Element-wise ops over n values: (params buffer, grid).
    let elem = |n: usize, third: u32| -> Result<(wgpu::Buffer, (u32, u32, u32)), RuntimeError> {
        let (gx, gy) = grid_1d(n, 256).map_err(gpu_err)?;
        Ok((u32s(&[n as u32, gx, third, 0]), (gx, gy, 1)))
    };
    // One workgroup a row (the norms): the 2-D grid, or a shape error naming the op.
    let row_grid = |op: &'static str, rows: usize| -> Result<(u32, u32, u32), RuntimeError> {
        let (gx, gy) = super::grid(rows as u64).ok_or_else(|| {
            gpu_err(GpuError::Shape {
                op,
                detail: format!("{rows} rows"),
            })
        })?;
        Ok((gx, gy, 1))
    };
    let rms = |x: &dyn Bindable,
               w: &wgpu::Buffer,
               out: &wgpu::Buffer,
               len: usize,
               rows: usize,
               last: bool|
     -> Result<Item, RuntimeError> {
        let p = u32s(&[len as u32, hp.norm_eps.to_bits(), rows as u32, last as u32]);
        op(
            "op_rms_norm",
            &[x, w, out, &p, &a.step],
            row_grid("rms_norm", rows)?,
        )
    };
    let add = |x: &wgpu::Buffer, y: &wgpu::Buffer| -> Result<Item, RuntimeError> {
        let (p, grid) = elem(s * e, hp.residual_scale.unwrap_or(1.0).to_bits())?;
        op("op_add", &[x, y, &p], grid)
    };
    // A post-norm of `y` and the residual add into x, and with `next` the norm of the new x
    // into h: `op_rms_norm_add`, one dispatch with the same arithmetic (the same bits), where
    // the sources carry it; else the ops one by one (the next norm then left to its site).
    // Whether h was written.
    let post_norm_add = |items: &mut Vec<Item>,
                         y: &wgpu::Buffer,
                         w: &wgpu::Buffer,
                         next: Option<&wgpu::Buffer>|
     -> Result<bool, RuntimeError> {
        if !ctx.has_source("op_rms_norm_add") {
            items.push(rms(y, w, &a.o2, e, s, false)?);
            items.push(add(&a.x, &a.o2)?);
            return Ok(false);
        }
        let p = u32s(&[
            e as u32,
            hp.norm_eps.to_bits(),
            s as u32,
            next.is_some() as u32,
            hp.residual_scale.unwrap_or(1.0).to_bits(),
            0,
            0,
            0,
        ]);
        items.push(op(
            "op_rms_norm_add",
            &[&a.x, y, w, next.unwrap_or(w), &a.h, &p],
            row_grid("rms_norm_add", s)?,
        )?);
        Ok(next.is_some())
    };
    // Whether products `ws` are int8-capable ternary ones, whose quantize dispatch takes the
    // norm with `fold_norm` (x itself, not its norm): a post-norm op then leaves the next
    // norm to them. Other products take the norm `op_rms_norm_add` writes with the post-norm
    // (no dispatch of its own; better than each workgroup computing it, x_rms.wgsl).
    let ternary = |ws: &[GpuWeight]| ws.iter().any(|w| w.format == WeightFormat::Ternary);
    // Whether a.h holds the norm the next layer's attention (or this layer's FFN) starts
    // with, written by `op_rms_norm_add`: only where that norm is an op of its own
    // (`fold_norm` puts it in the int8 ternary products' quantize dispatch instead).
    let mut h_ready = false;

    items.push(Item::Weight(
        ctx.bind_gather(sh.tok_embd, &a.ids, &a.x, n_tok)
            .map_err(gpu_err)?,
    ));
    if let Some(sc) = hp.embed_scale {
        let (gx, gy) = grid_1d(s * e, 256).map_err(gpu_err)?;
        let p = u32s(&[(s * e) as u32, gx, sc.to_bits(), 0f32.to_bits()]);
        items.push(op("op_scale", &[&a.x, &p], (gx, gy, 1))?);
    }
    let neox = (model.layout.spec.rope == RopeMode::Neox) as u32;
    let kq_scale = match hp.q_scale {
        Some(_) => 1.0f32,
        None => 1.0f32 / (hd as f32).sqrt(),
    };
    // `LOWBIT_GPU_BIAS_EPILOGUE=0` keeps op_bias_add for Q/K/V's biases (a benchmarking knob;
    // below).
    let bias_epilogue = std::env::var("LOWBIT_GPU_BIAS_EPILOGUE").map_or(true, |v| v != "0");
    // One token's stacked Q/K/V product from x with the attention norm folded in
    // (`GpuContext::bind_matvec_norm`), the stacked biases in its epilogue unless
    // `bias_epilogue` is off, and whether they are there; `None` where it does not apply:
    // a weight without such a kernel, a norm fold that does not pay there, or Q/K/V as three
    // products, which would each compute the norm (Qwen2.5-0.5B's Q5_0, Q5_0 and Q8_0 took
    // 34.7 us so against 33.3 with the norm's own dispatch on an H100, BENCHMARKS.md).
    let gguf_qkv_norm = |lw: &LayerWeights, lv: &LayerVecs| {
        let [w] = &lw.qkv[..] else {
            return Ok(None);
        };
        let (epilogue, bias) = match &lv.bqkv {
            Some(b) if bias_epilogue => (Epilogue::Bias, Some(b)),
            _ => (Epilogue::Store, None),
        };
        // The parts one after another from the buffer's start.
        let whole = BufView::whole(&a.q.buffer);
        let norm = (&lv.attn_norm, hp.norm_eps);
        Ok::<_, RuntimeError>(
            ctx.bind_matvec_norm(w, &a.x, &whole, epilogue, bias, norm)
                .map_err(gpu_err)?
                .map(|b| (vec![Item::Weight(b)], bias.is_some())),
        )
    };
    for il in 0..hp.n_layer {
        let (lw, lv) = (&sh.layers[il], &sh.vecs[il]);
        let mut bias_done = false;
        // GGUF Q/K/V products of matvec_quads.wgsl with the norm folded in, the biases in
        // their epilogue as below; else (`fold_norm`) the int8 ternary ones.
        let mut folded = None;
        if s == 1 && fold_gguf_norm && !h_ready {
            if let Some((items, biased)) = gguf_qkv_norm(lw, lv)? {
                folded = Some(items);
                bias_done = biased;
            }
        }
        if folded.is_none() && fold_norm && !h_ready && ternary(&lw.qkv) {
            folded = mm_fused(
                &lw.qkv,
                &a.x,
                &[&a.q, &a.k, &a.v],
                Some(&lv.attn_norm),
                false,
            )?;
        }
        match folded {
            Some(fused) => items.extend(fused),
            None => {
                if !std::mem::take(&mut h_ready) {
                    items.push(rms(&a.x, &lv.attn_norm, &a.h, e, s, false)?);
                }
                // The biases in the products' epilogue where they can be (GGUF and palette
                // weights; a stacked weight takes the stacked biases): the same operation as
                // op_bias_add, one dispatch less per bias.
                let parts = [(&a.q, &lv.bq), (&a.k, &lv.bk), (&a.v, &lv.bv)];
                let biased: Option<Vec<Item>> = match (&lw.qkv[..], &lv.bqkv) {
                    _ if !bias_epilogue => None,
                    ([w], Some(b)) => ctx
                        .bind_matmul_bias(w, &a.h, &BufView::whole(&a.q.buffer), n_tok, b)
                        .ok()
                        .map(|b| vec![Item::Weight(b)]),
                    (ws, _) if ws.len() == 3 && parts.iter().all(|(_, b)| b.is_some()) => ws
                        .iter()
                        .zip(parts)
                        .map(|(w, (y, b))| {
                            let b = b.as_ref().expect("checked");
                            ctx.bind_matmul_bias(w, &a.h, y, n_tok, b)
                                .ok()
                                .map(Item::Weight)
                        })
                        .collect(),
                    _ => None,
                };
                match biased {
                    Some(b) => {
                        items.extend(b);
                        bias_done = true;
                    }
                    None => items.extend(mm_parts(&lw.qkv, &a.h, &[&a.q, &a.k, &a.v])?),
                }
            }
        }
        if !bias_done {
            for (y, bias, len) in [(&a.q, &lv.bq, nq), (&a.k, &lv.bk, nk), (&a.v, &lv.bv, nk)] {
                if let Some(b) = bias {
                    let (p, grid) = elem(s * len, len as u32)?;
                    items.push(op("op_bias_add", &[y, b, &p], grid)?);
                }
            }
        }
        let qf: &dyn Bindable = match &lv.q_norm {
            Some(w) => {
                items.push(rms(&a.q, w, &a.qn, hd, s * nh, false)?);
                &a.qn
            }
            None => &a.q,
        };
        let kf: &dyn Bindable = match &lv.k_norm {
            Some(w) => {
                items.push(rms(&a.k, w, &a.kn, hd, s * nkv, false)?);
                &a.kn
            }
            None => &a.k,
        };
        // RoPE of Q and K and the KV store: one op, or (decode with op_attention_decode) in
        // the attention.
        let table = &sh.tables[sh.layer_table[il]].1;
        let (kc, vc) = &sh.kv[il];
        let q_scale = hp.q_scale.unwrap_or(1.0).to_bits();
        let window = hp.window_of_layer(il).unwrap_or(0) as u32;
        let p = u32s(&[
            nh as u32,
            nkv as u32,
            hd as u32,
            hp.n_ctx as u32,
            splits as u32,
            chunk as u32,
            window,
            kq_scale.to_bits(),
            grain,
            hp.n_rot as u32,
            neox,
            q_scale,
        ]);
        let x_view = BufView::whole(&a.x);
        // The output product, with the residual add in its epilogue where no norm comes
        // between (bound here: whether it quantizes x itself decides the combine).
        let mut wo_residual = match &lv.post_attn_norm {
            Some(_) => None,
            None => Some(mm_with(&lw.wo, &a.attn, &x_view, residual)?),
        };
        // Decode with an int8 output product that quantizes x itself: the combine writes that
        // int8 x (op_attention_combine_q8) and the product's own quantize dispatch goes
        // (`LOWBIT_GPU_COMBINE_Q8=0`: not, a measuring knob); with `merge`, in the
        // attention's dispatch.
        let q8_combine = s == 1
            && combine_q8
            && hd >= 64
            && (nh * hd).is_multiple_of(256)
            && splits <= 128
            && matches!(&wo_residual, Some(Item::Weight(b)) if b.has_pre(q8_quantize_name(false)));
        let merged = q8_combine && merge && attention == DECODE_ATTENTION;
        if merged {
            items.push(op(
                ATTENTION_COMBINE_Q8,
                &[
                    qf,
                    kf,
                    &a.v,
                    table,
                    kc,
                    vc,
                    &a.part,
                    &p,
                    &a.step,
                    &a.attn,
                    &ctx.q8_vec_scratch(nh * hd),
                    &merge_counts,
                ],
                (nh as u32, splits as u32, 1),
            )?);
        } else if attention == DECODE_ATTENTION {
            let o = ctx
                .bind_op(
                    attention,
                    &[qf, kf, &a.v, table, kc, vc, &a.part, &p, &a.step],
                    (nh as u32, splits as u32, 1),
                )
                .map_err(gpu_err)?;
            // Only the splits that hold positions (`Item::Splits`), unless `all_splits`.
            items.push(if all_splits {
                Item::Op(o)
            } else {
                Item::Splits(o, [splits as u32, chunk as u32, grain])
            });
        } else {
            let pr = u32s(&[
                nh as u32,
                nkv as u32,
                hd as u32,
                hp.n_rot as u32,
                neox,
                q_scale,
                hp.n_ctx as u32,
                0,
            ]);
            let gx = ((nh + nkv) * hd / 2).div_ceil(64) as u32;
            items.push(op(
                "op_rope_kv",
                &[qf, kf, &a.v, table, kc, vc, &pr, &a.step],
                (gx, n_tok, 1),
            )?);
            // The tiled kernel: `ops::attention_tile_workgroups` per (split, KV head); the
            // others: one per (head group, split, token).
            let grid = match nh.checked_div(group) {
                Some(per_group) => (per_group as u32, splits as u32, n_tok),
                None => (
                    ops::attention_tile_workgroups(s, nh, nkv, hd) as u32,
                    splits as u32,
                    nkv as u32,
                ),
            };
            items.push(op(attention, &[qf, kc, vc, &a.part, &p, &a.step], grid)?);
        }
        let p = u32s(&[
            nh as u32,
            hd as u32,
            splits as u32,
            chunk as u32,
            grain,
            0,
            0,
            0,
        ]);
        // The residual add in the product's epilogue unless a norm comes between.
        match &lv.post_attn_norm {
            Some(w) => {
                items.push(op(
                    "op_attention_combine",
                    &[&a.part, &a.attn, &p, &a.step],
                    (nh as u32, n_tok, 1),
                )?);
                items.push(mm(&lw.wo, &a.attn, &a.o, n_tok)?);
                let next = (!fold_norm || !ternary(&lw.gate_up)).then_some(&lv.ffn_norm);
                h_ready = post_norm_add(&mut items, &a.o, w, next)?;
            }
            None => {
                let mut wo = wo_residual.take().expect("bound above where no norm comes");
                if q8_combine && !merged {
                    let xq = ctx.q8_vec_scratch(nh * hd);
                    items.push(op(
                        COMBINE_Q8,
                        &[&a.part, &a.attn, &xq, &p, &a.step],
                        ((nh * hd / 256) as u32, 1, 1),
                    )?);
                }
                if q8_combine {
                    if let Item::Weight(b) = &mut wo {
                        b.drop_pre(q8_quantize_name(false));
                    }
                } else {
                    items.push(op(
                        "op_attention_combine",
                        &[&a.part, &a.attn, &p, &a.step],
                        (nh as u32, n_tok, 1),
                    )?);
                }
                items.push(wo);
            }
        }
        // Decode with int8 ternary FFN products: gate/up (SwiGLU; the norm in its quantize
        // dispatch) writes the down product's x per 16-element group, and the down product
        // reads it: no quantize dispatch between them (`GpuContext::bind_glu_down_q16`).
        let q16 = match (&lw.gate_up[..], &lv.post_ffn_norm) {
            ([gu], None) if s == 1 && fold_glu && fold_norm && sh.gelu.is_none() => ctx
                .bind_glu_down_q16(
                    gu,
                    &lw.w_down,
                    &a.x,
                    Some((&lv.ffn_norm, hp.norm_eps)),
                    &x_view,
                    residual,
                )
                .map_err(gpu_err)?,
            _ => None,
        };
        if let Some((gu, dn)) = q16 {
            items.push(Item::Weight(gu));
            items.push(Item::Weight(dn));
            continue;
        }
        // SwiGLU (and with `fold_norm` the norm) in the gate/up product where it can be;
        // else the norm in the products where it can be; else each op on its own.
        // With `fold_norm` the norm too where the product takes it (int8 ternary), else
        // SwiGLU alone after the norm's own dispatch (also the GGUF products of
        // matvec_quads.wgsl: rows_swiglu.wgsl).
        let mut glu_done = false;
        // GELU gating (Gemma 3) folded into a GGUF gate/up product (rows_geglu.wgsl), after
        // the norm's own dispatch.
        if let (true, 1, [gu], Some(t)) = (fold_glu, s, &lw.gate_up[..], sh.gelu) {
            if let Some(b) = ctx
                .bind_gguf_glu(gu, &a.h, &a.g, Some(t))
                .map_err(gpu_err)?
            {
                if !std::mem::take(&mut h_ready) {
                    items.push(rms(&a.x, &lv.ffn_norm, &a.h, e, s, false)?);
                }
                items.push(Item::Weight(b));
                glu_done = true;
            }
        }
        // The norm folded into gate/up: int8 ternary products (`fold_norm`) or one GGUF
        // product of matvec_quads.wgsl (`fold_gguf_norm`; `bind_gguf_glu_norm` and
        // `bind_matvec_norm` decline where it does not pay), x not yet normalized by a
        // post-norm op. (Not GGUF products under `fold_norm`: three Q/K/V products would
        // each compute the norm and take their biases as ops.)
        let gguf = lw.gate_up.len() == 1 && lw.gate_up[0].format != WeightFormat::Ternary;
        let norm_into_gate_up =
            !h_ready && ((fold_norm && ternary(&lw.gate_up)) || (fold_gguf_norm && gguf));
        if fold_glu && sh.gelu.is_none() && lw.gate_up.len() == 1 {
            let forms: &[bool] = if norm_into_gate_up {
                &[true, false]
            } else {
                &[false]
            };
            for &with_norm in forms {
                let (input, norm) = if with_norm {
                    (&a.x, Some(&lv.ffn_norm))
                } else {
                    (&a.h, None)
                };
                if let Some(fused) = mm_fused(&lw.gate_up, input, &[&a.g], norm, true)? {
                    if !with_norm && !std::mem::take(&mut h_ready) {
                        items.push(rms(&a.x, &lv.ffn_norm, &a.h, e, s, false)?);
                    }
                    items.extend(fused);
                    glu_done = true;
                    break;
                }
            }
        }
        if !glu_done {
            let folded = if norm_into_gate_up {
                mm_fused(&lw.gate_up, &a.x, &[&a.g, &a.u], Some(&lv.ffn_norm), false)?
            } else {
                None
            };
            match folded {
                Some(fused) => items.extend(fused),
                None => {
                    if !std::mem::take(&mut h_ready) {
                        items.push(rms(&a.x, &lv.ffn_norm, &a.h, e, s, false)?);
                    }
                    items.extend(mm_parts(&lw.gate_up, &a.h, &[&a.g, &a.u])?);
                }
            }
            let (p, grid) = elem(s * nff, 0)?;
            items.push(match sh.gelu {
                Some(t) => op("op_geglu", &[&a.g, &a.u, t, &p], grid)?,
                None => op("op_swiglu", &[&a.g, &a.u, &p], grid)?,
            });
        }
        // The gate part starts the buffer: the down product reads its s * nff values there.
        let g_buf = &a.g.buffer;
        match &lv.post_ffn_norm {
            Some(w) => {
                items.push(mm(&lw.w_down, g_buf, &a.o, n_tok)?);
                let next = match sh.vecs.get(il + 1) {
                    Some(nv) if !fold_norm || !ternary(&sh.layers[il + 1].qkv) => {
                        Some(&nv.attn_norm)
                    }
                    _ => None,
                };
                h_ready = post_norm_add(&mut items, &a.o, w, next)?;
            }
            None => items.push(mm_with(&lw.w_down, g_buf, &x_view, residual)?),
        }
    }
    items.push(rms(&a.x, sh.output_norm, sh.hl, e, 1, true)?);
    items.push(mm(sh.output, sh.hl, sh.logits, 1)?);
    if hp.logit_mul.is_some() || hp.final_softcap.is_some() {
        let n = hp.n_vocab;
        let (gx, gy) = grid_1d(n, 256).map_err(gpu_err)?;
        let p = u32s(&[
            n as u32,
            gx,
            hp.logit_mul.unwrap_or(1.0).to_bits(),
            hp.final_softcap.unwrap_or(0.0).to_bits(),
        ]);
        items.push(op("op_scale", &[sh.logits, &p], (gx, gy, 1))?);
    }
    Ok(Graph { acts, items })
}

impl GpuBackend {
    /// Writes graph `gi`'s step record (first position `pos0`, `n` real tokens) and submits
    /// its dispatches as one command buffer; with `slot`, also the argmax and the copy of its
    /// id into `ring[slot]` (the pipelined greedy step, on the decode graph).
    fn submit_graph(
        &self,
        gi: usize,
        pos0: usize,
        n: usize,
        slot: Option<usize>,
    ) -> wgpu::SubmissionIndex {
        self.submit_graph_with(gi, pos0, n, slot, &[])
    }

    /// [`GpuBackend::submit_graph`] with `extra` encoded after the graph in the same pass.
    fn submit_graph_with(
        &self,
        gi: usize,
        pos0: usize,
        n: usize,
        slot: Option<usize>,
        extra: &[Item],
    ) -> wgpu::SubmissionIndex {
        let g = &self.graphs[gi];
        let step = Step {
            pos0: pos0 as u32,
            n: n as u32,
            _pad: [0; 2],
        };
        self.ctx
            .queue
            .write_buffer(&g.acts.step, 0, bytemuck::bytes_of(&step));
        let mut enc = self
            .ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("forward"),
                timestamp_writes: None,
            });
            for it in g.items.iter().chain(extra) {
                it.encode(&mut pass, pos0);
            }
            if slot.is_some() {
                self.argmax.encode(&mut pass);
            }
        }
        if let Some(slot) = slot {
            enc.copy_buffer_to_buffer(&self.result, 0, &self.ring[slot], 0, 4);
        }
        self.ctx.queue.submit([enc.finish()])
    }

    /// Waits for submission `idx` and reads the id it copied into `ring[slot]`.
    fn read_id(&self, slot: usize, idx: wgpu::SubmissionIndex) -> Result<u32, RuntimeError> {
        let buf = &self.ring[slot];
        let (tx, rx) = std::sync::mpsc::channel();
        buf.map_async(wgpu::MapMode::Read, 0..4, move |r| {
            let _ = tx.send(r);
        });
        let dev = |e: String| {
            gpu_err(GpuError::Device {
                op: "token id read-back",
                detail: e,
            })
        };
        self.ctx
            .device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(idx),
                timeout: None,
            })
            .map_err(|e| dev(e.to_string()))?;
        rx.recv()
            .map_err(|e| dev(e.to_string()))?
            .map_err(|e| dev(e.to_string()))?;
        let id = {
            let view = buf.get_mapped_range(0..4).map_err(|e| dev(e.to_string()))?;
            u32::from_le_bytes([view[0], view[1], view[2], view[3]])
        };
        buf.unmap();
        Ok(id)
    }
}

impl Backend for GpuBackend {
    /// Pipelined: step t + 1 is submitted before step t's id is read; its embedding gather
    /// reads the id step t's argmax left on the device. One command buffer per token, one
    /// 4-byte read-back.
    fn decode_greedy(
        &mut self,
        first: u32,
        pos: usize,
        max: usize,
        banned: &[u32],
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<usize, RuntimeError> {
        if max == 0 {
            return Ok(0);
        }
        if banned.len() > MAX_BANNED {
            // The kernel holds MAX_BANNED ids: step by step, picking on the host.
            return crate::runtime::greedy_steps(self, first, pos, max, banned, on_token);
        }
        self.check_span(&[first], pos, 1)?;
        let last = pos + max - 1;
        if last >= self.n_ctx() {
            return Err(RuntimeError::PositionOutOfRange {
                pos: last,
                n_ctx: self.n_ctx() as u64,
            });
        }
        let q = &self.ctx.queue;
        q.write_buffer(&self.banned, 0, bytemuck::cast_slice(banned));
        q.write_buffer(
            &self.argmax_params,
            0,
            bytemuck::cast_slice(&[self.n_vocab() as u32, banned.len() as u32, 0, 0]),
        );
        q.write_buffer(&self.graphs[0].acts.ids, 0, bytemuck::bytes_of(&first));
        self.has_logits = true;
        self.host_logits_valid = false;
        let mut pending = self.submit_graph(0, pos, 1, Some(0));
        let mut steps = 0;
        loop {
            let i = steps;
            let ahead =
                (i + 1 < max).then(|| self.submit_graph(0, pos + i + 1, 1, Some((i + 1) % 2)));
            // Until the read below, steps i and i + 1 are both queued.
            self.next_pos = pos + i + 1 + ahead.is_some() as usize;
            let id = self.read_id(i % 2, pending)?;
            steps += 1;
            if id == u32::MAX {
                return Err(RuntimeError::NonFinite {
                    step: steps,
                    pos: pos + i,
                });
            }
            match ahead {
                Some(next) if on_token(id) => pending = next,
                Some(next) => {
                    // The step run ahead was on an accepted token: the sequence holds it.
                    let _ = self.ctx.device.poll(wgpu::PollType::Wait {
                        submission_index: Some(next),
                        timeout: None,
                    });
                    break;
                }
                None => {
                    on_token(id);
                    break;
                }
            }
        }
        Ok(steps)
    }

    fn info(&self) -> BackendInfo {
        BackendInfo {
            backend: "gpu",
            architecture: self.model.layout.cfg.architecture.clone(),
            kernel: self.kernel,
            kv_cache: "f16",
            kv_cache_bytes: self.kv_bytes,
            weight_bytes: self.model.weight_bytes(),
            decode_bytes_per_token: self.model.decode_bytes_per_token(),
            buckets: self.buckets.clone(),
            buckets_from: self.buckets_from,
            n_ctx: self.n_ctx(),
            n_vocab: self.n_vocab(),
            threads: 1,
            cpu_level: None,
            device: Some(format!(
                "{} ({:?}, {})",
                self.ctx.info.name, self.ctx.info.backend, self.ctx.info.driver
            )),
            dispatches_per_token: Some(self.dispatches_per_token()),
            device_weight_bytes: Some(self.weight_bytes_device),
        }
    }

    fn n_vocab(&self) -> usize {
        self.model.layout.hyper.n_vocab
    }

    fn n_ctx(&self) -> usize {
        self.model.layout.hyper.n_ctx
    }

    fn position(&self) -> usize {
        self.next_pos
    }

    fn prefill(&mut self, tokens: &[u32], start: usize) -> Result<(), RuntimeError> {
        let max = *self.buckets.last().unwrap_or(&1);
        self.check_span(tokens, start, max)?;
        // The smallest graph that holds the span (graph 0 is the decode graph, S = 1).
        let gi = self
            .graphs
            .iter()
            .position(|g| g.acts.s >= tokens.len())
            .unwrap_or(self.graphs.len() - 1);
        self.run(gi, tokens, start, false);
        Ok(())
    }

    /// The span in chunks of the logits tail's bucket ([`LogitsTail`]): a chunk before
    /// `from` as a plain prefill, the others with the tail in the same command buffer and
    /// their rows from `from` read back. Each row is the logits of its position computed by
    /// the prefill products, which equal a decode step's within the GPU's tolerances (not bit
    /// for bit, as on the CPU). Where no bucket's logits fit a binding, one decode step per
    /// scored position (the trait's default).
    fn prefill_logits(
        &mut self,
        tokens: &[u32],
        start: usize,
        from: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), RuntimeError> {
        let max = *self.buckets.last().unwrap_or(&1);
        self.check_span(tokens, start, max)?;
        crate::runtime::check_rows(tokens.len(), from)?;
        // Binds the tail on first use.
        self.logits_tail_rows()?;
        let Some(Some(tail)) = &self.logits_tail else {
            return crate::runtime::prefill_logits_by_steps(self, tokens, start, from, out);
        };
        let (gi, s) = (tail.gi, self.graphs[tail.gi].acts.s);
        let nv = self.model.layout.hyper.n_vocab;
        let mut off = 0;
        while off < tokens.len() {
            let len = s.min(tokens.len() - off);
            let span = &tokens[off..off + len];
            if off + len <= from {
                self.prefill(span, start + off)?;
                off += len;
                continue;
            }
            self.run(gi, span, start + off, true);
            let Some(Some(tail)) = &self.logits_tail else {
                unreachable!("bound above");
            };
            let first = from.saturating_sub(off);
            let bytes = self
                .ctx
                .read_buffer(&tail.logits, (len * nv * 4) as u64)
                .map_err(gpu_err)?;
            let rows: &[f32] = bytemuck::cast_slice(&bytes);
            out.extend_from_slice(&rows[first * nv..len * nv]);
            off += len;
        }
        Ok(())
    }

    fn decode(&mut self, token: u32, pos: usize) -> Result<(), RuntimeError> {
        self.check_span(&[token], pos, 1)?;
        self.run(0, &[token], pos, false);
        Ok(())
    }

    fn logits(&mut self) -> Result<&[f32], RuntimeError> {
        if !self.has_logits {
            return Err(RuntimeError::Backend {
                name: "gpu".into(),
                detail: "no logits: nothing has run since the last reset".into(),
            });
        }
        if !self.host_logits_valid {
            let bytes = self
                .ctx
                .read_buffer(&self.logits, (self.host_logits.len() * 4) as u64)
                .map_err(gpu_err)?;
            self.host_logits
                .copy_from_slice(bytemuck::cast_slice(&bytes));
            self.host_logits_valid = true;
        }
        Ok(&self.host_logits)
    }

    fn argmax(&mut self, banned: &[u32]) -> Result<Option<u32>, RuntimeError> {
        if !self.has_logits {
            return Err(RuntimeError::Backend {
                name: "gpu".into(),
                detail: "no logits: nothing has run since the last reset".into(),
            });
        }
        if banned.len() > MAX_BANNED {
            // Rare: more banned ids than the kernel holds; pick on the host.
            let l = self.logits()?;
            if l.iter().any(|v| !v.is_finite()) {
                return Ok(None);
            }
            let mut best: Option<usize> = None;
            for (i, x) in l.iter().enumerate() {
                if !banned.contains(&(i as u32)) && best.is_none_or(|b| *x > l[b]) {
                    best = Some(i);
                }
            }
            return Ok(best.map(|b| b as u32));
        }
        let q = &self.ctx.queue;
        q.write_buffer(&self.banned, 0, bytemuck::cast_slice(banned));
        q.write_buffer(
            &self.argmax_params,
            0,
            bytemuck::cast_slice(&[self.n_vocab() as u32, banned.len() as u32, 0, 0]),
        );
        let mut enc = self
            .ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("argmax"),
                timestamp_writes: None,
            });
            self.argmax.encode(&mut pass);
        }
        q.submit([enc.finish()]);
        let bytes = self.ctx.read_buffer(&self.result, 4).map_err(gpu_err)?;
        let id = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        Ok((id != u32::MAX).then_some(id))
    }

    fn reset(&mut self) {
        self.next_pos = 0;
        self.has_logits = false;
        self.host_logits_valid = false;
    }

    fn rewind(&mut self, pos: usize) -> Result<(), RuntimeError> {
        crate::runtime::check_rewind(pos, self.next_pos)?;
        self.next_pos = pos;
        self.has_logits = false;
        self.host_logits_valid = false;
        Ok(())
    }
}
