//! The GPU backend's ops other than the weight kernels: RMSNorm (and a post-norm with the
//! residual add and the next norm, `rms_norm_add`), RoPE, the f16 KV cache
//! store (and RoPE with the store fused, `rope_kv`), split attention and its combine, SwiGLU/GeGLU, residual and bias adds, scales and
//! soft caps, and the greedy argmax. Each is one WGSL module (`shaders/ops/`, with
//! `common.wgsl` prepended: the [`Step`] uniform and exact f16 conversions), registered in
//! [`super::kernels::all`] under the name `op_{file}`; the grouped prefill attention
//! (`attention_group.wgsl`, a template) as `op_attention_g{N}` for each group size N.
//!
//! Every op's bind group is made once (at load) over fixed buffers; what changes per step
//! (the chunk's first position and its real token count) is the [`Step`] uniform the host
//! writes before each submission.

use super::kernels::KernelSource;
use super::{GpuContext, GpuError};

const COMMON: &str = include_str!("shaders/ops/common.wgsl");
/// `shaders/ops/common.wgsl`, for op modules the host generates
/// ([`super::combine_q8_source`]).
pub(crate) const COMMON_WGSL: &str = COMMON;

/// The op modules: `(file stem, body)`.
const OPS: &[(&str, &str)] = &[
    ("add", include_str!("shaders/ops/add.wgsl")),
    ("argmax", include_str!("shaders/ops/argmax.wgsl")),
    ("attention", include_str!("shaders/ops/attention.wgsl")),
    (
        "attention_combine",
        include_str!("shaders/ops/attention_combine.wgsl"),
    ),
    (
        "attention_decode",
        include_str!("shaders/ops/attention_decode.wgsl"),
    ),
    ("bias_add", include_str!("shaders/ops/bias_add.wgsl")),
    ("geglu", include_str!("shaders/ops/geglu.wgsl")),
    ("kv_store", include_str!("shaders/ops/kv_store.wgsl")),
    ("rms_norm", include_str!("shaders/ops/rms_norm.wgsl")),
    (
        "rms_norm_add",
        include_str!("shaders/ops/rms_norm_add.wgsl"),
    ),
    ("rope", include_str!("shaders/ops/rope.wgsl")),
    ("rope_kv", include_str!("shaders/ops/rope_kv.wgsl")),
    ("scale", include_str!("shaders/ops/scale.wgsl")),
    ("swiglu", include_str!("shaders/ops/swiglu.wgsl")),
];

/// Largest head dimension the attention kernel takes (`MAX_HD` in attention.wgsl).
pub const MAX_HEAD_DIM: usize = 256;

/// The op modules that use subgroup operations (compiled only where the adapter has them).
pub const SUBGROUP_OPS: &[&str] = &["op_attention_decode", super::kernels::ATTENTION_COMBINE_Q8];

/// Invocations per score of `op_attention_decode` (`LANES` in attention_decode.wgsl): it runs
/// only where every subgroup has at least this many (wgpu's smallest subgroup is 4).
pub const DECODE_ATTENTION_LANES: u32 = 4;

/// How many times attention_decode.wgsl's `//@each` blocks are repeated ([`expand_heads`]; its
/// `UNROLL`): the most key words a cluster lane and value rows an invocation take in a tile.
const DECODE_ATTENTION_UNROLL: usize = 8;

/// Positions per split of `op_attention_decode` are a multiple of this (its `grain`
/// parameter, [`split_chunk`]): two of its tiles of 16. On an H200 (8B shape: 32 query heads,
/// 64 splits) grain 32 gave the shortest decode step at positions 512 and 2048 (2796 and
/// 3046 us against 2847 and 3311 with grain 8: fewer, longer splits; BENCHMARKS.md).
pub const DECODE_SPLIT_GRAIN: u32 = 32;

/// Positions per split of the split attention for a token at position `pos` (`split_chunk`
/// of common.wgsl, which the attention kernels and the combine compute on the GPU): `chunk`
/// where `grain` is 0; else `ceil((pos + 1) / splits)` rounded up to a multiple of `grain`,
/// at most `chunk`.
pub fn split_chunk(pos: u32, splits: u32, chunk: u32, grain: u32) -> u32 {
    if grain == 0 {
        return chunk;
    }
    let even = pos / splits + 1;
    chunk.min(even.div_ceil(grain) * grain)
}

/// Most query heads one prefill attention workgroup takes (`QG` of attention_group.wgsl).
pub const MAX_ATTENTION_GROUP: usize = 4;

/// The grouped prefill attention's template ([`expand_heads`]).
const ATTENTION_GROUP: &str = include_str!("shaders/ops/attention_group.wgsl");

/// The `QG` line of attention_group.wgsl that each variant replaces.
const QG_LINE: &str = "const QG: u32 = 0u;";

/// The `MAX_HD` line of attention_group.wgsl, replaced by [`MAX_HEAD_DIM`] (attention.wgsl's
/// `MAX_HD`, which a unit test checks).
const MAX_HD_LINE: &str = "const MAX_HD: u32 = 0u;";

/// Query heads per prefill attention workgroup for `heads` query heads over `kv_heads` KV
/// heads: the largest divisor of `heads / kv_heads` up to [`MAX_ATTENTION_GROUP`] (every head
/// of a workgroup reads the same keys and values). Decode keeps one head per workgroup.
pub fn attention_group(heads: usize, kv_heads: usize) -> usize {
    let per_kv = if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        1
    } else {
        heads / kv_heads
    };
    (1..=MAX_ATTENTION_GROUP.min(per_kv))
        .rev()
        .find(|&g| per_kv.is_multiple_of(g))
        .unwrap_or(1)
}

/// The attention kernel's name for `group` (1 to [`MAX_ATTENTION_GROUP`]) query heads per
/// workgroup: `op_attention` for 1, else `op_attention_g{group}`.
pub fn attention_name(group: usize) -> &'static str {
    const NAMES: [&str; MAX_ATTENTION_GROUP] = [
        "op_attention",
        "op_attention_g2",
        "op_attention_g3",
        "op_attention_g4",
    ];
    assert!(
        (1..=MAX_ATTENTION_GROUP).contains(&group),
        "no attention kernel for {group} heads per workgroup"
    );
    NAMES[group - 1]
}

/// The tiled prefill attention's template (`attention_tile.wgsl`: HD, R and KT substituted
/// per variant, [`attention_tile_name`]).
const ATTENTION_TILE: &str = include_str!("shaders/ops/attention_tile.wgsl");

/// Head dimensions the tiled prefill attention has a variant for (other head dimensions run
/// the grouped kernels).
pub const ATTENTION_TILE_HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// Query rows per workgroup of the tiled prefill attention for `head_dim` (its `R`: the rows'
/// queries fill 16 KB of workgroup memory).
pub fn attention_tile_rows(head_dim: usize) -> usize {
    4096 / head_dim
}

/// Workgroups along x of the tiled prefill attention's grid for `tokens` tokens: the
/// (token, query head) rows of one KV head, [`attention_tile_rows`] a workgroup (the grid
/// is `(this, splits, kv_heads)`). `kv_heads` divides `heads`.
pub fn attention_tile_workgroups(
    tokens: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
) -> usize {
    (tokens * (heads / kv_heads)).div_ceil(attention_tile_rows(head_dim))
}

/// Positions per tile of the tiled prefill attention for `head_dim` (its `KT`).
fn attention_tile_positions(head_dim: usize) -> usize {
    if head_dim > 128 {
        16
    } else {
        32
    }
}

/// Bytes of workgroup memory the tiled prefill attention for `head_dim` declares (`qs`, `kv`,
/// `sc`, `pm`, `cr` of attention_tile.wgsl), to hold against the adapter's limit.
pub fn attention_tile_shared_bytes(head_dim: usize) -> u64 {
    let (r, kt, hw) = (
        attention_tile_rows(head_dim),
        attention_tile_positions(head_dim),
        head_dim / 2,
    );
    (8 * r * (hw + 1) + 4 * kt * (hw + 1) + 4 * r * (kt + 1) + 4 * 128 + 4 * r) as u64
}

/// The tiled prefill attention's name for `head_dim`, `None` for a head dimension it has no
/// variant for.
pub fn attention_tile_name(head_dim: usize) -> Option<&'static str> {
    match head_dim {
        64 => Some("op_attention_tile_hd64"),
        128 => Some("op_attention_tile_hd128"),
        256 => Some("op_attention_tile_hd256"),
        _ => None,
    }
}

/// A template's `//@for NAME COUNT` ... `//@end` blocks (nested or not) each repeated
/// `counts[COUNT]` times with `{NAME}` replaced by the copy's index (attention_tile.wgsl).
pub(crate) fn expand_for(template: &str, counts: &[(&str, usize)]) -> String {
    fn expand(lines: &[&str], counts: &[(&str, usize)], out: &mut String) {
        let mut i = 0;
        while i < lines.len() {
            let t = lines[i].trim();
            let Some(spec) = t.strip_prefix("//@for ") else {
                assert!(t != "//@end", "an //@end without //@for");
                out.push_str(lines[i]);
                out.push('\n');
                i += 1;
                continue;
            };
            let (name, count) = spec.split_once(' ').expect("//@for NAME COUNT");
            let n = counts
                .iter()
                .find(|(c, _)| *c == count)
                .unwrap_or_else(|| panic!("no count {count}"))
                .1;
            // The matching //@end.
            let mut depth = 0;
            let end = (i + 1..lines.len())
                .find(|&j| {
                    let u = lines[j].trim();
                    if u.starts_with("//@for ") {
                        depth += 1;
                    } else if u == "//@end" {
                        if depth == 0 {
                            return true;
                        }
                        depth -= 1;
                    }
                    false
                })
                .expect("an //@for without //@end");
            let key = format!("{{{name}}}");
            for k in 0..n {
                let copy: Vec<String> = lines[i + 1..end]
                    .iter()
                    .map(|l| l.replace(&key, &k.to_string()))
                    .collect();
                let refs: Vec<&str> = copy.iter().map(|l| l.as_str()).collect();
                expand(&refs, counts, out);
            }
            i = end + 1;
        }
    }
    let lines: Vec<&str> = template.lines().collect();
    let mut out = String::with_capacity(template.len() * 4);
    expand(&lines, counts, &mut out);
    out
}

/// A template with `group` copies of each block between a `//@each` line and an `//@end` line,
/// `{g}` replaced by the copy's index: attention_group.wgsl's once per query head, and
/// attention_decode.wgsl's [`DECODE_ATTENTION_UNROLL`] times (its tile's loads).
fn expand_heads(template: &str, group: usize) -> String {
    let mut out = String::with_capacity(template.len() * 2);
    let mut block: Option<Vec<&str>> = None;
    for line in template.lines() {
        match (line.trim(), &mut block) {
            ("//@each", None) => block = Some(Vec::new()),
            ("//@end", Some(lines)) => {
                for g in 0..group {
                    for l in lines.iter() {
                        out.push_str(&l.replace("{g}", &g.to_string()));
                        out.push('\n');
                    }
                }
                block = None;
            }
            (_, Some(lines)) => lines.push(line),
            (_, None) => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    assert!(block.is_none(), "an //@each block without //@end");
    assert!(
        out.lines().all(|l| {
            let t = l.trim();
            t != "//@each" && t != "//@end" && (t.starts_with("//") || !t.contains("{g}"))
        }),
        "an //@end without //@each, or {{g}} outside an //@each block"
    );
    out
}

/// attention_decode.wgsl with its `//@each` blocks expanded (without common.wgsl): what
/// `op_attention_decode` compiles after common.wgsl, and the attention of
/// [`super::attention_decode_combine_q8_source`].
pub(crate) fn attention_decode_body() -> String {
    let (_, body) = OPS
        .iter()
        .find(|(stem, _)| *stem == "attention_decode")
        .expect("attention_decode is an op module");
    expand_heads(body, DECODE_ATTENTION_UNROLL)
}

/// The op modules as complete WGSL sources, named `op_{stem}`, and the grouped prefill
/// attention's variants ([`attention_name`], 2 to [`MAX_ATTENTION_GROUP`] query heads per
/// workgroup).
pub fn sources() -> Vec<KernelSource> {
    let mut v: Vec<KernelSource> = OPS
        .iter()
        .map(|(stem, body)| {
            // The decode attention's unrolled blocks (the others have none).
            let body = if *stem == "attention_decode" {
                attention_decode_body()
            } else {
                body.to_string()
            };
            KernelSource {
                name: format!("op_{stem}"),
                wgsl: format!(
                    "// op_{stem}: src/runtime/gpu/shaders/ops/common.wgsl + {stem}.wgsl\n{COMMON}\n{body}"
                ),
            }
        })
        .collect();
    assert!(
        ATTENTION_GROUP.contains(QG_LINE),
        "attention_group.wgsl declares QG"
    );
    assert!(
        ATTENTION_GROUP.contains(MAX_HD_LINE),
        "attention_group.wgsl declares MAX_HD"
    );
    for g in 2..=MAX_ATTENTION_GROUP {
        let name = attention_name(g);
        let body = expand_heads(ATTENTION_GROUP, g)
            .replace(QG_LINE, &format!("const QG: u32 = {g}u;"))
            .replace(
                MAX_HD_LINE,
                &format!("const MAX_HD: u32 = {MAX_HEAD_DIM}u;"),
            );
        v.push(KernelSource {
            wgsl: format!(
                "// {name}: src/runtime/gpu/shaders/ops/common.wgsl + attention_group.wgsl with QG = {g}\n{COMMON}\n{body}"
            ),
            name: name.into(),
        });
    }
    for hd in ATTENTION_TILE_HEAD_DIMS {
        let name = attention_tile_name(hd).expect("a variant per listed head dimension");
        let (r, kt) = (attention_tile_rows(hd), attention_tile_positions(hd));
        let mut body = expand_for(
            ATTENTION_TILE,
            &[
                ("SBR", r / 16),
                ("SBK", kt / 8),
                ("OBW", hd / 16),
                ("LD", kt * hd / 2 / 128),
                ("QLD", r * hd / 2 / 128),
            ],
        );
        for (line, value) in [("HD", hd), ("R", r), ("KT", kt)] {
            let decl = format!("const {line}: u32 = 0u;");
            assert!(body.contains(&decl), "attention_tile.wgsl declares {line}");
            body = body.replace(&decl, &format!("const {line}: u32 = {value}u;"));
        }
        v.push(KernelSource {
            wgsl: format!(
                "// {name}: src/runtime/gpu/shaders/ops/common.wgsl + attention_tile.wgsl with HD = {hd}, R = {r}, KT = {kt}\n{COMMON}\n{body}"
            ),
            name: name.into(),
        });
    }
    v
}

/// What the host writes before each submission (`Step` in common.wgsl).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Step {
    /// Position of the chunk's first token.
    pub pos0: u32,
    /// Real tokens in the chunk (the rest of the bucket is padding).
    pub n: u32,
    pub _pad: [u32; 2],
}

/// Something an op binds: a whole buffer, or a [`BufView`] of one.
pub trait Bindable {
    fn binding(&self) -> wgpu::BindingResource<'_>;
}

impl Bindable for wgpu::Buffer {
    fn binding(&self) -> wgpu::BindingResource<'_> {
        self.as_entire_binding()
    }
}

/// Bytes `offset .. offset + size` of a buffer, bound as a vector of its own: one part of a
/// stacked product's output (Q, K and V of one dispatch). `offset` is a multiple of the
/// adapter's `min_storage_buffer_offset_alignment` ([`GpuContext::view`] checks).
#[derive(Clone, Debug)]
pub struct BufView {
    pub buffer: wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
}

impl BufView {
    /// The whole of `buffer`.
    pub fn whole(buffer: &wgpu::Buffer) -> BufView {
        BufView {
            buffer: buffer.clone(),
            offset: 0,
            size: buffer.size(),
        }
    }
}

impl Bindable for BufView {
    fn binding(&self) -> wgpu::BindingResource<'_> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &self.buffer,
            offset: self.offset,
            size: std::num::NonZeroU64::new(self.size),
        })
    }
}

/// One op's dispatch: pipeline, bind group and grid, made once, encoded any number of times.
#[derive(Debug)]
pub struct OpDispatch {
    pub name: &'static str,
    pipeline: wgpu::ComputePipeline,
    bind: wgpu::BindGroup,
    grid: (u32, u32, u32),
}

impl OpDispatch {
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>) {
        self.encode_rows(pass, self.grid.1);
    }

    /// The dispatch with `rows` workgroups along y (at most its grid's) in place of its
    /// grid's: the decode attention's splits that hold positions at the step's position.
    pub fn encode_rows(&self, pass: &mut wgpu::ComputePass<'_>, rows: u32) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(self.grid.0, rows.min(self.grid.1), self.grid.2);
    }
}

/// A 1-D grid of `n` invocations in workgroups of `wg`, 2-D past 65,535 workgroups:
/// `(groups_x, groups_y)`; the kernels index `gid.y * groups_x * wg + gid.x`.
pub fn grid_1d(n: usize, wg: usize) -> Result<(u32, u32), GpuError> {
    let groups = n.div_ceil(wg).max(1) as u64;
    super::grid_or_limit("dispatch", groups)
}

impl GpuContext {
    /// A uniform buffer holding `bytes` (padded to 16 bytes).
    pub fn uniform(&self, label: &str, bytes: &[u8]) -> wgpu::Buffer {
        let size = (bytes.len() as u64).div_ceil(16).max(1) * 16;
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.queue.write_buffer(&buf, 0, bytes);
        buf
    }

    /// Bytes `offset .. offset + size` of `buffer` as a [`BufView`], or `None` where the
    /// adapter does not allow a binding at that offset (or the range is empty or outside).
    pub fn view(&self, buffer: &wgpu::Buffer, offset: u64, size: u64) -> Option<BufView> {
        let align = self.limits.min_storage_buffer_offset_alignment as u64;
        (size > 0 && offset.is_multiple_of(align) && offset + size <= buffer.size()).then(|| {
            BufView {
                buffer: buffer.clone(),
                offset,
                size,
            }
        })
    }

    /// Op `name` (`op_{stem}`) bound to `buffers` (bindings 0, 1, ... in order: storage
    /// buffers, then its parameter uniform, then the step uniform where the op has one),
    /// dispatched over `grid`.
    pub fn bind_op(
        &self,
        name: &'static str,
        buffers: &[&dyn Bindable],
        grid: (u32, u32, u32),
    ) -> Result<OpDispatch, GpuError> {
        let max = super::MAX_WORKGROUPS_PER_DIM;
        if grid.0 > max || grid.1 > max || grid.2 > max {
            return Err(GpuError::Limit {
                op: name,
                what: "workgroups in one grid dimension",
                needed: grid.0.max(grid.1).max(grid.2) as u64,
                limit: max as u64,
            });
        }
        let pipeline = self.pipeline_named(name, None)?;
        let layout = pipeline.get_bind_group_layout(0);
        let entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.binding(),
            })
            .collect();
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(name),
            layout: &layout,
            entries: &entries,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Device {
                op: name,
                detail: e.to_string(),
            });
        }
        Ok(OpDispatch {
            name,
            pipeline,
            bind,
            grid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn for_blocks_expand_nested_and_tiled_attention_fits_32_kb() {
        let t = "a\n  //@for r TWO\n  x{r}\n  //@for k THREE\n  y{r}{k}\n  //@end\n  //@end\nb\n";
        assert_eq!(
            expand_for(t, &[("TWO", 2), ("THREE", 3)]),
            "a\n  x0\n  y00\n  y01\n  y02\n  x1\n  y10\n  y11\n  y12\nb\n"
        );
        let all = sources();
        for hd in ATTENTION_TILE_HEAD_DIMS {
            // 32 KB: Apple GPUs' workgroup memory (the most WebGPU's own limits promise is
            // 16 KB; the host checks the adapter's limit before choosing the kernel).
            assert!(attention_tile_shared_bytes(hd) <= 32768, "hd {hd}");
            let name = attention_tile_name(hd).unwrap();
            let k = all.iter().find(|k| k.name == name).unwrap();
            assert!(
                k.wgsl.lines().all(|l| {
                    let t = l.trim();
                    !t.starts_with("//@for") && t != "//@end"
                }),
                "{name}"
            );
            for p in ["{r}", "{k}", "{d}", "{i}"] {
                assert!(!k.wgsl.contains(p), "{name} keeps {p}");
            }
            assert!(
                k.wgsl.contains(&format!("const HD: u32 = {hd}u;")),
                "{name}"
            );
            // The template's constants and the host's byte count agree.
            let r = attention_tile_rows(hd);
            assert!(k.wgsl.contains(&format!("const R: u32 = {r}u;")), "{name}");
            assert_eq!(r * hd, 4096);
        }
        assert_eq!(attention_tile_name(80), None);
    }

    #[test]
    fn attention_kernels_share_max_hd_and_expand_per_head() {
        let (_, attention) = OPS.iter().find(|(s, _)| *s == "attention").unwrap();
        assert!(attention.contains(&format!("const MAX_HD: u32 = {MAX_HEAD_DIM}u;")));
        let all = sources();
        for g in 2..=MAX_ATTENTION_GROUP {
            let k = all.iter().find(|k| k.name == attention_name(g)).unwrap();
            assert!(k.wgsl.contains(&format!("const QG: u32 = {g}u;")));
            assert!(k
                .wgsl
                .contains(&format!("const MAX_HD: u32 = {MAX_HEAD_DIM}u;")));
            // One running max per head, named by its index.
            for h in 0..g {
                assert!(k.wgsl.contains(&format!("var m{h} = ")), "{} m{h}", k.name);
            }
            assert!(!k.wgsl.contains(&format!("var m{g} = ")), "{}", k.name);
        }
        assert_eq!(attention_group(32, 2), 4);
        assert_eq!(attention_group(9, 3), 3);
        assert_eq!(attention_group(14, 2), 1);
        assert_eq!(attention_group(4, 1), 4);
        assert_eq!(attention_group(8, 8), 1);
        assert_eq!(attention_group(6, 0), 1);
    }

    #[test]
    fn decode_attention_constants_match_its_source_and_splits_cover_every_position() {
        let (_, decode) = OPS.iter().find(|(s, _)| *s == "attention_decode").unwrap();
        assert!(decode.contains(&format!("const LANES: u32 = {DECODE_ATTENTION_LANES}u;")));
        assert!(decode.contains(&format!("const MAX_HD: u32 = {MAX_HEAD_DIM}u;")));
        assert!(decode.contains(&format!("const UNROLL: u32 = {DECODE_ATTENTION_UNROLL}u;")));
        assert!(decode.contains("const WG: u32 = 64u;"));
        // A lane's key words (MAX_HD / 8 words over LANES lanes) and an invocation's value
        // rows (TILE = WG / LANES positions over WG / (MAX_HD / 8) groups) fit the unrolling.
        let (wg, max_hq) = (64usize, MAX_HEAD_DIM / 8);
        assert!(max_hq / DECODE_ATTENTION_LANES as usize <= DECODE_ATTENTION_UNROLL);
        assert!(
            (wg / DECODE_ATTENTION_LANES as usize).div_ceil(wg / max_hq) <= DECODE_ATTENTION_UNROLL
        );
        // The default grain is a whole number of tiles (TILE = WG / LANES positions).
        assert_eq!(DECODE_SPLIT_GRAIN % (64 / DECODE_ATTENTION_LANES), 0);
        let all = super::super::kernels::all();
        for stem in SUBGROUP_OPS {
            assert!(all.iter().any(|k| k.name == *stem), "{stem}");
        }
        // Every position of every context lands in a split, none past the last, for the
        // fixed chunk (grain 0) and the position-dependent one.
        for (n_ctx, splits) in [(4096u32, 64u32), (600, 8), (8192, 128), (100, 1), (65, 2)] {
            let chunk = n_ctx.div_ceil(splits);
            for grain in [0, DECODE_SPLIT_GRAIN] {
                for pos in 0..n_ctx {
                    let c = split_chunk(pos, splits, chunk, grain);
                    assert!(c >= 1 && c <= chunk, "{n_ctx} {splits} {grain} {pos}: {c}");
                    assert!(c * splits > pos, "{n_ctx} {splits} {grain} {pos}: {c}");
                    assert!(grain == 0 || c == chunk || c.is_multiple_of(grain));
                }
            }
        }
        // Early in a long context more splits share the positions: 513 go to 33 splits of 16
        // (9 of 64 with the fixed chunk).
        assert_eq!(split_chunk(512, 64, 64, 8), 16);
        assert_eq!(split_chunk(0, 64, 64, 8), 8);
        assert_eq!(split_chunk(4095, 64, 64, 8), 64);
        assert_eq!(split_chunk(512, 64, 64, 0), 64);
    }
}
