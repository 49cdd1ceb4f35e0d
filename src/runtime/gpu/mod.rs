//! The GPU backend on wgpu (issue 12), first layer: adapters, a device context with its
//! pipelines, weight upload from the bundle's bytes, and the ternary matvec. Metal on Apple
//! devices, Vulkan elsewhere (lavapipe, Mesa's CPU Vulkan driver, in the tests), DX12 on
//! Windows, all through one set of WGSL kernels in `shaders/`.
//!
//! The other ops are in [`ops`], the weight kernels in [`weights`], the [`super::Backend`] in
//! [`backend`]. Every module of [`kernels::all`] that the bundle's tensors' encodings need
//! ([`kernels::for_tensors`]) ships in it (`kernels/`, with its MSL:
//! [`crate::bundle::kernels`]), and [`super::load`] compiles only the bundle's.
//!
//! # Ternary matvec
//!
//! `y = W x` for a `ternary2` weight `W` of row-major shape `[rows, cols]` (`cols = K`, a
//! multiple of 256), `x` `[K]` f32, `y` `[rows]` f32, computed by
//! `shaders/ternary_matvec.wgsl` or `shaders/ternary_matvec_rows.wgsl` (below) from the
//! bundle's words and f16 scales as stored. Per quarter block (64 elements, one `vec4<u32>` of
//! codes) of a row, both take
//! `d * (sum x*q - sum x)` with codes `q` in {0, 1, 2}, where the CPU reference takes
//! `d * sum x*(q - 1)` per block: the same value in exact arithmetic, different f32 rounding.
//!
//! **Tolerance** against the CPU f32 kernel ([`crate::runtime::matvec::matvec`] with
//! `Kernel::F32`), for a row with `A = sum_k |d_b(k) * x_k|`:
//! `|y_gpu - y_cpu| <= 4 * K * 2^-24 * A` ([`tolerance`]). Derivation: any order of summing
//! `n` terms in f32 errs by at most `gamma_n * sum|terms|`, `gamma_n ~ n * 2^-24`, whatever
//! the tree. The CPU sums the terms `d * x * (q - 1)` (magnitudes at most `|d x|`), depth below
//! `K`: at most `K * 2^-24 * A`. The GPU's terms are `x * q` (at most `2|x|`) and `x`, scaled by
//! `d` after the quarter-block sums, so its intermediate magnitudes are at most `3 A`: at most
//! `3 * K * 2^-24 * A`. The code-to-float step is exact, and f16 scales decode exactly. The
//! bound is a worst case; the tests print the largest ratio seen, far below it.
//!
//! # Two kernels, two reductions
//!
//! [`MatvecKernel::Split`] (`shaders/ternary_matvec.wgsl`) gives every invocation of a
//! workgroup a share of each of the workgroup's rows and adds the partials over the whole
//! workgroup: [`Reduction::Subgroup`] with `subgroupAdd` (subgroup size read from the
//! hardware, never assumed) and then workgroup memory, [`Reduction::Workgroup`] with a tree in
//! workgroup memory, for adapters without the SUBGROUP feature. Both are selectable and both
//! are tested.
//!
//! [`MatvecKernel::SubgroupRows`] (`shaders/ternary_matvec_rows.wgsl`, the entry point
//! generated unrolled by [`MatvecConfig::source`]) is the decode kernel where subgroups exist
//! ([`decode_matvec_config`], [`GpuContext::default_matvec_config`]): each subgroup takes its
//! workgroup's rows a few at a time, its lanes stream consecutive `vec4<u32>` words of those
//! rows (several loads in flight per lane), each 64-element unit's activations are loaded once
//! into registers for those rows, the block scales are read once per block and handed out with
//! `subgroupShuffle`, and a row ends with `subgroupAdd` alone. x is read from the storage
//! buffer or, with `x_tile`, staged in workgroup memory a tile at a time (a barrier before and
//! after each tile; the layout is XOR-swizzled so that neither the staging nor the reads have
//! bank conflicts). How many subgroups a workgroup has changes only how many passes each makes
//! over the workgroup's rows, so nothing depends on the subgroup size at compile time. The
//! formula and the tolerance are the split kernel's. Its variants with x staged can fold ops
//! into the product ([`Fuse`]: the RMSNorm of x before it, SwiGLU of a stacked gate/up weight
//! after it; kernels named `..._rms`, `..._swiglu`), and every ternary kernel can add its
//! sums into y instead of storing them ([`Epilogue`], the residual add).
//!
//! With int8 activations (`--kernel int8`, the default) decode takes [`MatvecKernel::Q8Pre`]:
//! a quantize dispatch ([`q8_quantize_source`], the RMSNorm folded in where one comes before)
//! writes x as int8 groups with each 64-element unit's `sum q` and its block's `da` into the
//! context's scratch ([`GpuContext::q8_vec_scratch`]), and the product
//! (`shaders/ternary_matvec_q8g.wgsl`, the subgroup-rows split) takes each unit's
//! `sum c*q - sum q` exactly with `dot4I8Packed`. [`MatvecKernel::Q8`] (each workgroup
//! quantizes all of x into workgroup memory itself) is the fallback for a bundle whose
//! kernels predate it and `LOWBIT_GPU_Q8_PRE=0`; both give the same int8 values. Two ops
//! write a product's int8 x themselves, so that its quantize dispatch goes: the decode
//! attention's combine (`op_attention_combine_q8`, [`combine_q8_source`]; on Vulkan with
//! `LOWBIT_GPU_ATTN_MERGE=1`, slower on an H100, done by the attention's last workgroups,
//! `op_attention_decode_combine_q8`, [`attention_decode_combine_q8_source`]) for the output
//! product, and the gate/up
//! product (`_y16`: its 16 rows a workgroup quantized as one group)
//! for the down product (`_x16`: each group's integer dot product times its own `da`;
//! [`Q16_LAYOUT`], [`GpuContext::q16_vec_scratch`]).
//!
//! # Limits
//!
//! A weight whose codes exceed the adapter's `max_storage_buffer_binding_size` (or
//! `max_buffer_size`, or [`ContextOptions::max_binding_bytes`]) is split into row chunks, one
//! buffer pair and one dispatch each. A dispatch of more than 65,535 workgroups (the per
//! dimension limit of every backend) is a 2-D grid.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::Serialize;

pub mod backend;
pub mod kernels;
pub mod ops;
pub mod weights;

/// The ternary matvec's body; the host prepends the parameters and appends a reduction.
const TERNARY_MATVEC_WGSL: &str = include_str!("shaders/ternary_matvec.wgsl");
const REDUCE_SUBGROUP_WGSL: &str = include_str!("shaders/ternary_matvec_reduce_subgroup.wgsl");
const REDUCE_WORKGROUP_WGSL: &str = include_str!("shaders/ternary_matvec_reduce_workgroup.wgsl");
/// The subgroup-rows matvec's helpers; the host prepends the parameters and appends `main`.
const TERNARY_MATVEC_ROWS_WGSL: &str = include_str!("shaders/ternary_matvec_rows.wgsl");
/// The int8-activation decode matvec's helpers; the host prepends the parameters and appends
/// `main`.
const TERNARY_MATVEC_Q8_WGSL: &str = include_str!("shaders/ternary_matvec_q8.wgsl");
/// The int8 decode products' shared part (parameters, bindings but x, epilogue, unit dot).
const TERNARY_MATVEC_Q8_BODY_WGSL: &str = include_str!("shaders/ternary_matvec_q8_body.wgsl");
/// The int8 decode product of x quantized once before it ([`MatvecKernel::Q8Pre`]).
const TERNARY_MATVEC_Q8G_WGSL: &str = include_str!("shaders/ternary_matvec_q8g.wgsl");
/// The int8 activations' helpers (quantization, `word_dot`), prepended to every int8 kernel.
pub(crate) const Q8_COMMON_WGSL: &str = include_str!("shaders/q8_common.wgsl");

/// Workgroups per grid dimension that every backend accepts (WebGPU's
/// `maxComputeWorkgroupsPerDimension` default; Vulkan, Metal and DX12 all allow at least it).
pub const MAX_WORKGROUPS_PER_DIM: u32 = 65_535;

/// Rows per workgroup a split matvec accepts (each row is an accumulator register per
/// invocation).
pub const MAX_ROWS_PER_WORKGROUP: u32 = 32;

/// Rows per workgroup a subgroup-rows matvec accepts (its subgroups loop over them).
pub const MAX_ROWS_PER_WORKGROUP_SUBGROUP_ROWS: u32 = 256;

/// Errors of the GPU layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GpuError {
    /// No adapter at all (no driver, or no GPU and no software driver).
    #[error("no GPU adapter found (on Linux install a Vulkan driver; Mesa's lavapipe, Debian package mesa-vulkan-drivers, runs on any CPU)")]
    NoAdapter,
    /// `--gpu-adapter` matched nothing.
    #[error("--gpu-adapter {selector:?}: no adapter matches; available: {available}")]
    AdapterNotFound { selector: String, available: String },
    /// `--gpu-adapter` given an empty name.
    #[error("--gpu-adapter: empty selector (give an index or a name substring)")]
    EmptySelector,
    #[error("request device on {adapter}: {detail}")]
    RequestDevice { adapter: String, detail: String },
    /// A kernel failed to compile or validate.
    #[error("shader {name}: {detail}")]
    Shader { name: String, detail: String },
    /// A shape or parameter the op does not take.
    #[error("{op}: {detail}")]
    Shape { op: &'static str, detail: String },
    /// The adapter lacks a feature the request needs.
    #[error("{op}: the adapter {adapter} lacks {feature}")]
    MissingFeature {
        op: &'static str,
        adapter: String,
        feature: &'static str,
    },
    #[error("{op}: {what} needs {needed} but the adapter allows {limit}")]
    Limit {
        op: &'static str,
        what: &'static str,
        needed: u64,
        limit: u64,
    },
    /// A device error (validation, out of memory) or a failed read-back.
    #[error("{op}: {detail}")]
    Device { op: &'static str, detail: String },
}

/// A way to pick an adapter: its index in [`adapters`] order or a case-insensitive substring
/// of its name (`--gpu-adapter INDEX|SUBSTRING`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdapterSelector {
    Index(usize),
    Name(String),
}

impl std::str::FromStr for AdapterSelector {
    type Err = GpuError;
    fn from_str(s: &str) -> Result<Self, GpuError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(GpuError::EmptySelector);
        }
        Ok(match s.parse::<usize>() {
            Ok(i) => AdapterSelector::Index(i),
            Err(_) => AdapterSelector::Name(s.to_string()),
        })
    }
}

impl std::fmt::Display for AdapterSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdapterSelector::Index(i) => write!(f, "{i}"),
            AdapterSelector::Name(n) => f.write_str(n),
        }
    }
}

fn instance() -> wgpu::Instance {
    // WGPU_BACKEND and the other wgpu variables may narrow the search.
    wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env())
}

/// Every adapter of every compiled-in backend (Vulkan, Metal, DX12), in the order wgpu lists
/// them: the order `--gpu-adapter INDEX` counts in.
pub fn adapters() -> Vec<wgpu::Adapter> {
    pollster::block_on(instance().enumerate_adapters(wgpu::Backends::all()))
}

/// Rank of a device type when no adapter is named: a real GPU before a software one.
fn type_rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// The index in `infos` that `selector` picks; with none, the first discrete GPU, else the
/// first integrated, virtual, other, CPU adapter.
pub fn select_index(
    infos: &[wgpu::AdapterInfo],
    selector: Option<&AdapterSelector>,
) -> Result<usize, GpuError> {
    if infos.is_empty() {
        return Err(GpuError::NoAdapter);
    }
    let not_found = |s: &AdapterSelector| GpuError::AdapterNotFound {
        selector: s.to_string(),
        available: infos
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{i}: {} ({:?})", a.name, a.backend))
            .collect::<Vec<_>>()
            .join(", "),
    };
    match selector {
        None => Ok((0..infos.len())
            .min_by_key(|&i| (type_rank(infos[i].device_type), i))
            .unwrap_or(0)),
        Some(s @ AdapterSelector::Index(i)) => {
            if *i < infos.len() {
                Ok(*i)
            } else {
                Err(not_found(s))
            }
        }
        Some(s @ AdapterSelector::Name(n)) => {
            let n = n.to_lowercase();
            infos
                .iter()
                .position(|a| a.name.to_lowercase().contains(&n))
                .ok_or_else(|| not_found(s))
        }
    }
}

/// The adapter `selector` picks ([`select_index`]).
pub fn select_adapter(selector: Option<&AdapterSelector>) -> Result<wgpu::Adapter, GpuError> {
    let mut all = adapters();
    let infos: Vec<_> = all.iter().map(|a| a.get_info()).collect();
    let i = select_index(&infos, selector)?;
    Ok(all.swap_remove(i))
}

/// The limits that matter to the kernels (`convert gpu-info`).
#[derive(Clone, Debug, Serialize)]
pub struct LimitsReport {
    pub max_buffer_size: u64,
    pub max_storage_buffer_binding_size: u64,
    pub max_compute_workgroup_size_x: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_compute_workgroups_per_dimension: u32,
    pub max_compute_workgroup_storage_size: u32,
    pub min_storage_buffer_offset_alignment: u32,
}

/// One adapter as `convert gpu-info` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct AdapterReport {
    pub index: usize,
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub driver_info: String,
    pub vendor: u32,
    pub device: u32,
    /// The one picked when no `--gpu-adapter` is given.
    pub default: bool,
    pub subgroup: bool,
    pub shader_f16: bool,
    pub timestamp_query: bool,
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    pub limits: LimitsReport,
    /// Bytes of device memory (Vulkan: the largest device-local heap); `None` where the
    /// backend gives no figure.
    pub device_memory_bytes: Option<u64>,
    /// Every feature the adapter reports, by wgpu's names, sorted.
    pub features: Vec<String>,
}

fn feature_names(f: wgpu::Features) -> Vec<String> {
    let mut v: Vec<String> = f.iter_names().map(|(n, _)| n.to_string()).collect();
    v.sort();
    v
}

/// Every adapter, described ([`AdapterReport`]); empty when there is none.
pub fn adapter_reports() -> Vec<AdapterReport> {
    let all = adapters();
    let infos: Vec<_> = all.iter().map(|a| a.get_info()).collect();
    let default = select_index(&infos, None).ok();
    all.iter()
        .zip(infos)
        .enumerate()
        .map(|(index, (a, info))| {
            let f = a.features();
            let l = a.limits();
            AdapterReport {
                index,
                name: info.name,
                backend: info.backend.to_string(),
                device_type: format!("{:?}", info.device_type),
                driver: info.driver,
                driver_info: info.driver_info,
                vendor: info.vendor,
                device: info.device,
                default: default == Some(index),
                subgroup: f.contains(wgpu::Features::SUBGROUP),
                shader_f16: f.contains(wgpu::Features::SHADER_F16),
                timestamp_query: f.contains(wgpu::Features::TIMESTAMP_QUERY),
                subgroup_min_size: info.subgroup_min_size,
                subgroup_max_size: info.subgroup_max_size,
                limits: LimitsReport {
                    max_buffer_size: l.max_buffer_size,
                    max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
                    max_compute_workgroup_size_x: l.max_compute_workgroup_size_x,
                    max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
                    max_compute_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
                    max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
                    min_storage_buffer_offset_alignment: l.min_storage_buffer_offset_alignment,
                },
                device_memory_bytes: device_local_heap(a),
                features: feature_names(f),
            }
        })
        .collect()
}

/// How a matvec adds up a row's partial sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// `subgroupAdd`, then one partial per subgroup (needs the SUBGROUP feature).
    Subgroup,
    /// A tree in workgroup memory (any adapter).
    Workgroup,
}

impl Reduction {
    pub fn name(self) -> &'static str {
        match self {
            Reduction::Subgroup => "sg",
            Reduction::Workgroup => "wg",
        }
    }
}

/// How a ternary matvec kernel splits its work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatvecKernel {
    /// Every invocation of the workgroup takes a share of every row of the workgroup
    /// (`shaders/ternary_matvec.wgsl` and a reduction over the whole workgroup).
    Split,
    /// Subgroups take the workgroup's rows `rows_per_subgroup` at a time, lane `l` streaming
    /// units `l, l + s, ...` of those rows, `units_in_flight` of them per chunk, added with
    /// `subgroupAdd` alone (`shaders/ternary_matvec_rows.wgsl`; needs SUBGROUP).
    SubgroupRows {
        /// Rows a subgroup computes at once, sharing each unit's activations (1..=8).
        rows_per_subgroup: u32,
        /// Units (64 elements, one `vec4<u32>` of codes) per lane per chunk whose codes are
        /// loaded before any is used: 1, 2 or 4.
        units_in_flight: u32,
        /// Elements of x the workgroup stages in workgroup memory at a time (a multiple of 256,
        /// `4 * x_tile` bytes, one barrier before and after each tile), read from there
        /// without bank conflicts; 0: every subgroup reads x from the storage buffer.
        x_tile: u32,
    },
    /// The subgroup-rows split with int8 activations (`shaders/ternary_matvec_q8.wgsl`; needs
    /// SUBGROUP): every workgroup quantizes all of x into workgroup memory as the CPU's int8
    /// kernel does (per block of 256), and each unit's dot product is exact in integers
    /// (`dot4I8Packed`).
    Q8 {
        /// Rows a subgroup computes at once, sharing each unit's activations (1..=8).
        rows_per_subgroup: u32,
        /// Units per lane per chunk whose codes are loaded before any is used: 1, 2 or 4.
        units_in_flight: u32,
        /// The largest K the kernel takes (a multiple of 256 up to [`MAX_Q8_COLS`]): its
        /// workgroup memory holds `max_cols + max_cols / 16 + max_cols / 32` bytes.
        max_cols: u32,
    },
    /// The int8 product of x quantized once before it: a quantize dispatch
    /// ([`q8_quantize_name`], with the RMSNorm folded in where `fuse.rms_norm`) writes x's int8
    /// groups and each 64-element unit's sum q and block `da` to the context's scratch
    /// ([`GpuContext::q8_vec_scratch`]), then the product (`shaders/ternary_matvec_q8g.wgsl`;
    /// needs SUBGROUP) reads them from there: no workgroup memory and no barrier (but in a
    /// `y16` product's epilogue), so its workgroups can be small and many. The same
    /// quantization and per-unit arithmetic as [`MatvecKernel::Q8`], so the same values up to
    /// the order the driver contracts in; an `x16` product reads x per 16-element group
    /// instead, with no quantize dispatch of its own ([`Q16_LAYOUT`]).
    Q8Pre {
        /// Rows a subgroup computes at once, sharing each unit's activations (1..=8); with
        /// `whole_workgroup`, rows the whole workgroup computes at once.
        rows_per_subgroup: u32,
        /// Units per lane per chunk whose codes are loaded before any is used: 1, 2 or 4.
        units_in_flight: u32,
        /// Every invocation of the workgroup on each pass's rows (name `wgrows`): invocation
        /// `i` streams units `i, i + WG, ...`, the row's partials added by `subgroupAdd` and
        /// then across subgroups in workgroup memory, in subgroup order. K is split over
        /// WG invocations instead of one subgroup's: a long row (the down product's K =
        /// 16,384) takes one chunk instead of several, and more of the weight is in flight.
        whole_workgroup: bool,
        /// Block scales read as f32 in groups of four rows ([`scales4`], name `q8g4`): one
        /// 16-byte load for a pass's rows of one group and no f16 decode; else (`q8g`, the
        /// kernels of bundles made before) one f16 load and decode per unit and row.
        scales4: bool,
        /// With `fuse.rms_norm`, the norm's `1 / sqrt(mean(x^2) + eps)` applied to each row's
        /// sum at the end (name `_rmsl`): the quantize dispatch (`ternary_q8_quantize_rmsl`)
        /// quantizes `x * n` (the norm's weight) in one pass over x and writes the sums of
        /// `x^2` of its workgroups after the unit terms; the product adds them up. Else the
        /// quantize dispatch normalizes x first (`ternary_q8_quantize_rms`, two passes).
        rms_late: bool,
        /// x quantized per 16-element group (name `_x16`; [`Q16_LAYOUT`]), as a
        /// [`MatvecKernel::Q8Pre`] product that writes `y16` leaves it: no quantize dispatch.
        x16: bool,
        /// The SwiGLU outputs quantized per 16-element group into binding 3 (name `_y16`;
        /// [`Q16_LAYOUT`]) in place of f32 y: each workgroup's rows (a multiple of 16) are
        /// whole groups. Subgroup rows with SwiGLU only.
        y16: bool,
    },
}

/// The per-16 int8 layout of x (`_x16` products read it, `_y16` products write it), as
/// `vec4<u32>` for K activations: `[0, K/16)` the groups as
/// `shaders/ternary_matvec_q8g.wgsl` lays them out; then per 64-element unit u two `vec4`s:
/// at `K/16 + 2u` the f32 bits of `da` of its four groups (`da = max|x| / 127` of the group),
/// at `K/16 + 2u + 1` each group's `da * sum q`. A row's unit term is
/// `d * (sum_g da_g * (sum c*q)_g - sum_g da_g * sum q_g)`: the four groups' exact integer
/// dot products each scaled by its own `da`.
pub const Q16_LAYOUT: &str = "K + K/2 bytes: groups, then per unit (da x4, da * sum q x4)";

/// The largest K an int8-activation matvec ([`MatvecKernel::Q8`]) is built for.
pub const MAX_Q8_COLS: u32 = 32768;

/// The compile-time parameters of the ternary matvec (a pipeline each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatvecConfig {
    /// Rows per workgroup (1..=[`MAX_ROWS_PER_WORKGROUP`]; for
    /// [`MatvecKernel::SubgroupRows`] a multiple of its rows per subgroup).
    pub rows_per_workgroup: u32,
    /// Invocations per workgroup: a power of two from 32 to 1024, within the adapter's limits.
    pub workgroup_size: u32,
    /// [`Reduction::Subgroup`] for [`MatvecKernel::SubgroupRows`].
    pub reduction: Reduction,
    pub kernel: MatvecKernel,
    /// The ops folded into the product (subgroup rows with x staged only).
    pub fuse: Fuse,
}

/// Ops a ternary decode product does in the same dispatch (the subgroup-rows kernel with x
/// staged in workgroup memory; suffixes `_rms` and `_swiglu` of its name).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Fuse {
    /// RMSNorm of x first: every workgroup adds up `x . x` itself (one pass over x before
    /// the first tile), then stages `(x_k * (1 / sqrt(mean + eps))) * n_k` (rms_norm.wgsl's
    /// operations; `n` the norm's weight, binding 5; `eps` a parameter) in place of `x_k`.
    pub rms_norm: bool,
    /// SwiGLU of a stacked gate/up weight (`2 * rows` rows, gate then up, one row chunk):
    /// output row `i` is `silu(gate_i . x) * (up_i . x)` (swiglu.wgsl's operations), each
    /// subgroup pass taking rows `i..` of both halves.
    pub swiglu: bool,
}

impl Fuse {
    /// The name suffix: `_rms`, `_swiglu`, both or none.
    fn suffix(&self) -> &'static str {
        match (self.rms_norm, self.swiglu) {
            (false, false) => "",
            (true, false) => "_rms",
            (false, true) => "_swiglu",
            (true, true) => "_rms_swiglu",
        }
    }
}

/// Elements of x a [`MatvecKernel::SubgroupRows`] workgroup stages at a time, at most.
pub const MAX_X_TILE: u32 = 16384;

/// Rows a [`MatvecKernel::SubgroupRows`] subgroup takes at once, at most.
pub const MAX_ROWS_PER_SUBGROUP: u32 = 8;

impl MatvecConfig {
    /// A [`MatvecKernel::Split`] configuration.
    pub fn split(rows_per_workgroup: u32, workgroup_size: u32, reduction: Reduction) -> Self {
        MatvecConfig {
            rows_per_workgroup,
            workgroup_size,
            reduction,
            kernel: MatvecKernel::Split,
            fuse: Fuse::default(),
        }
    }

    /// A [`MatvecKernel::SubgroupRows`] configuration reading x from the storage buffer.
    pub fn subgroup_rows(
        rows_per_workgroup: u32,
        workgroup_size: u32,
        rows_per_subgroup: u32,
        units_in_flight: u32,
    ) -> Self {
        Self::subgroup_rows_tiled(
            rows_per_workgroup,
            workgroup_size,
            rows_per_subgroup,
            units_in_flight,
            0,
        )
    }

    /// A [`MatvecKernel::SubgroupRows`] configuration staging `x_tile` elements of x at a
    /// time in workgroup memory (0: none).
    pub fn subgroup_rows_tiled(
        rows_per_workgroup: u32,
        workgroup_size: u32,
        rows_per_subgroup: u32,
        units_in_flight: u32,
        x_tile: u32,
    ) -> Self {
        MatvecConfig {
            rows_per_workgroup,
            workgroup_size,
            reduction: Reduction::Subgroup,
            kernel: MatvecKernel::SubgroupRows {
                rows_per_subgroup,
                units_in_flight,
                x_tile,
            },
            fuse: Fuse::default(),
        }
    }

    /// A [`MatvecKernel::Q8`] configuration (int8 activations) for K up to `max_cols`.
    pub fn q8(
        rows_per_workgroup: u32,
        workgroup_size: u32,
        rows_per_subgroup: u32,
        units_in_flight: u32,
        max_cols: u32,
    ) -> Self {
        MatvecConfig {
            rows_per_workgroup,
            workgroup_size,
            reduction: Reduction::Subgroup,
            kernel: MatvecKernel::Q8 {
                rows_per_subgroup,
                units_in_flight,
                max_cols,
            },
            fuse: Fuse::default(),
        }
    }

    /// A [`MatvecKernel::Q8Pre`] configuration (int8 activations quantized once before the
    /// product).
    pub fn q8_pre(
        rows_per_workgroup: u32,
        workgroup_size: u32,
        rows_per_subgroup: u32,
        units_in_flight: u32,
    ) -> Self {
        MatvecConfig {
            rows_per_workgroup,
            workgroup_size,
            reduction: Reduction::Subgroup,
            kernel: MatvecKernel::Q8Pre {
                rows_per_subgroup,
                units_in_flight,
                whole_workgroup: false,
                scales4: true,
                rms_late: false,
                x16: false,
                y16: false,
            },
            fuse: Fuse::default(),
        }
    }

    /// A [`MatvecKernel::Q8Pre`] configuration whose passes take the whole workgroup
    /// (`whole_workgroup`): `rows_per_pass` rows at a time, K split over all invocations.
    pub fn q8_pre_wg(
        rows_per_workgroup: u32,
        workgroup_size: u32,
        rows_per_pass: u32,
        units_in_flight: u32,
    ) -> Self {
        MatvecConfig {
            rows_per_workgroup,
            workgroup_size,
            reduction: Reduction::Subgroup,
            kernel: MatvecKernel::Q8Pre {
                rows_per_subgroup: rows_per_pass,
                units_in_flight,
                whole_workgroup: true,
                scales4: true,
                rms_late: false,
                x16: false,
                y16: false,
            },
            fuse: Fuse::default(),
        }
    }

    /// This [`MatvecKernel::Q8Pre`] configuration reading the f16 block scales as stored
    /// (the `q8g` kernels of bundles made before the f32 scales); others unchanged.
    pub fn with_f16_scales(self) -> Self {
        let mut c = self;
        if let MatvecKernel::Q8Pre { scales4, .. } = &mut c.kernel {
            *scales4 = false;
        }
        c
    }

    /// This [`MatvecKernel::Q8Pre`] configuration with its RMSNorm applied at the end
    /// (`rms_late`; it takes effect where the configuration folds a norm in,
    /// `fuse.rms_norm`); others unchanged.
    pub fn with_rms_late(self) -> Self {
        let mut c = self;
        if let MatvecKernel::Q8Pre { rms_late, .. } = &mut c.kernel {
            *rms_late = true;
        }
        c
    }

    /// This [`MatvecKernel::Q8Pre`] configuration reading x per 16-element group (`x16`:
    /// `true`) or writing its SwiGLU outputs so (`y16`), as `x16` and `y16` say.
    pub fn with_q16(self, x16_on: bool, y16_on: bool) -> Self {
        let mut c = self;
        if let MatvecKernel::Q8Pre { x16, y16, .. } = &mut c.kernel {
            *x16 = x16_on;
            *y16 = y16_on;
        }
        c
    }

    /// `(x16, y16)` of a [`MatvecKernel::Q8Pre`] configuration; `(false, false)` otherwise.
    pub fn q16(&self) -> (bool, bool) {
        match self.kernel {
            MatvecKernel::Q8Pre { x16, y16, .. } => (x16, y16),
            _ => (false, false),
        }
    }

    /// Whether this is a [`MatvecKernel::Q8Pre`] product that applies its RMSNorm at the end.
    pub fn applies_norm_late(&self) -> bool {
        self.fuse.rms_norm && matches!(self.kernel, MatvecKernel::Q8Pre { rms_late: true, .. })
    }

    /// Whether this configuration binds the f32 block scales ([`scales4`]).
    pub fn reads_scales4(&self) -> bool {
        matches!(self.kernel, MatvecKernel::Q8Pre { scales4: true, .. })
    }

    /// Whether this configuration takes a weight of `cols` columns.
    pub fn takes_cols(&self, cols: usize) -> bool {
        match self.kernel {
            MatvecKernel::Q8 { max_cols, .. } => cols <= max_cols as usize,
            MatvecKernel::Q8Pre { .. } => cols <= MAX_Q8_COLS as usize,
            _ => true,
        }
    }

    /// Whether this configuration quantizes the activations to int8.
    pub fn is_int8(&self) -> bool {
        matches!(
            self.kernel,
            MatvecKernel::Q8 { .. } | MatvecKernel::Q8Pre { .. }
        )
    }

    /// The quantize kernel a [`MatvecKernel::Q8Pre`] configuration dispatches before its
    /// product (with the RMSNorm where `fuse.rms_norm`); `None` for an `x16` one (the product
    /// before it writes its x) and the other kernels.
    pub fn pre_kernel(&self) -> Option<&'static str> {
        match self.kernel {
            MatvecKernel::Q8Pre { x16: true, .. } => None,
            MatvecKernel::Q8Pre { .. } if self.applies_norm_late() => Some(Q8_QUANTIZE_RMS_LATE),
            MatvecKernel::Q8Pre { .. } => Some(q8_quantize_name(self.fuse.rms_norm)),
            _ => None,
        }
    }

    /// This configuration with `fuse`.
    pub fn fused(self, fuse: Fuse) -> Self {
        MatvecConfig { fuse, ..self }
    }

    /// The pipeline's name, carrying its parameters: `ternary_matvec_r4_wg64_sg` (split),
    /// `ternary_matvec_r16_wg128_sgrows4_p2` (subgroup rows, 4 rows per subgroup pass, 2
    /// units in flight), `ternary_matvec_r16_wg128_sgrows4_p2_xs4096` (x staged 4096
    /// elements at a time in workgroup memory).
    pub fn name(&self) -> String {
        match self.kernel {
            MatvecKernel::Split => format!(
                "ternary_matvec_r{}_wg{}_{}",
                self.rows_per_workgroup,
                self.workgroup_size,
                self.reduction.name()
            ),
            MatvecKernel::SubgroupRows {
                rows_per_subgroup,
                units_in_flight,
                x_tile,
            } => {
                let mut n = format!(
                    "ternary_matvec_r{}_wg{}_sgrows{}_p{}",
                    self.rows_per_workgroup,
                    self.workgroup_size,
                    rows_per_subgroup,
                    units_in_flight
                );
                if x_tile > 0 {
                    n += &format!("_xs{x_tile}");
                }
                n + self.fuse.suffix()
            }
            MatvecKernel::Q8 {
                rows_per_subgroup,
                units_in_flight,
                max_cols,
            } => {
                format!(
                    "ternary_matvec_q8_r{}_wg{}_sgrows{}_p{}_k{}",
                    self.rows_per_workgroup,
                    self.workgroup_size,
                    rows_per_subgroup,
                    units_in_flight,
                    max_cols
                ) + self.fuse.suffix()
            }
            MatvecKernel::Q8Pre {
                rows_per_subgroup,
                units_in_flight,
                whole_workgroup,
                scales4,
                x16,
                y16,
                ..
            } => {
                // The product is the same with or without a norm the quantize kernel
                // applies: its name carries a norm applied at the end and SwiGLU only.
                format!(
                    "ternary_matvec_{}_r{}_wg{}_{}{}_p{}",
                    if scales4 { "q8g4" } else { "q8g" },
                    self.rows_per_workgroup,
                    self.workgroup_size,
                    if whole_workgroup { "wgrows" } else { "sgrows" },
                    rows_per_subgroup,
                    units_in_flight
                ) + if self.applies_norm_late() {
                    "_rmsl"
                } else {
                    ""
                } + if x16 { "_x16" } else { "" }
                    + if y16 { "_y16" } else { "" }
                    + if self.fuse.swiglu { "_swiglu" } else { "" }
            }
        }
    }

    /// The configuration a name of [`MatvecConfig::name`] stands for (the `ternary_matvec_`
    /// prefix may be left out): `r4_wg64_sg`, `r16_wg128_sgrows4_p2`.
    pub fn parse(name: &str) -> Option<MatvecConfig> {
        let s = name.strip_prefix("ternary_matvec_").unwrap_or(name);
        if let Some(q) = s.strip_prefix("q8_") {
            return Self::parse_q8(q);
        }
        if let Some(q) = s.strip_prefix("q8g_") {
            return Self::parse_q8_pre(q).map(Self::with_f16_scales);
        }
        if let Some(q) = s.strip_prefix("q8g4_") {
            return Self::parse_q8_pre(q);
        }
        let mut it = s.split('_');
        let rows = it.next()?.strip_prefix('r')?.parse().ok()?;
        let wg = it.next()?.strip_prefix("wg")?.parse().ok()?;
        let kind = it.next()?;
        let cfg = match kind {
            "sg" => MatvecConfig::split(rows, wg, Reduction::Subgroup),
            "wg" => MatvecConfig::split(rows, wg, Reduction::Workgroup),
            _ => {
                let rs = kind.strip_prefix("sgrows")?.parse().ok()?;
                let p = it.next()?.strip_prefix('p')?.parse().ok()?;
                let mut next = it.next();
                let xt = match next {
                    Some(t) if t.starts_with("xs") => {
                        next = it.next();
                        t.strip_prefix("xs")?.parse().ok().filter(|&t| t > 0)?
                    }
                    _ => 0,
                };
                let mut fuse = Fuse::default();
                if next == Some("rms") {
                    fuse.rms_norm = true;
                    next = it.next();
                }
                if next == Some("swiglu") {
                    fuse.swiglu = true;
                    next = it.next();
                }
                if next.is_some() {
                    return None;
                }
                MatvecConfig::subgroup_rows_tiled(rows, wg, rs, p, xt).fused(fuse)
            }
        };
        it.next().is_none().then_some(cfg)
    }

    /// `r32_wg256_sgrows2_p2_k16384[_rms][_swiglu]` (after `ternary_matvec_q8_`).
    fn parse_q8(s: &str) -> Option<MatvecConfig> {
        let mut it = s.split('_');
        let rows = it.next()?.strip_prefix('r')?.parse().ok()?;
        let wg = it.next()?.strip_prefix("wg")?.parse().ok()?;
        let rs = it.next()?.strip_prefix("sgrows")?.parse().ok()?;
        let p = it.next()?.strip_prefix('p')?.parse().ok()?;
        let k = it.next()?.strip_prefix('k')?.parse().ok()?;
        let mut fuse = Fuse::default();
        let mut next = it.next();
        if next == Some("rms") {
            fuse.rms_norm = true;
            next = it.next();
        }
        if next == Some("swiglu") {
            fuse.swiglu = true;
            next = it.next();
        }
        next.is_none()
            .then(|| MatvecConfig::q8(rows, wg, rs, p, k).fused(fuse))
    }

    /// `r8_wg64_sgrows4_p1[_rmsl][_x16][_y16][_swiglu]` or the same with `wgrowsN` (after
    /// `ternary_matvec_q8g4_`; the caller turns `q8g_` names to f16 scales).
    fn parse_q8_pre(s: &str) -> Option<MatvecConfig> {
        let mut it = s.split('_');
        let rows = it.next()?.strip_prefix('r')?.parse().ok()?;
        let wg = it.next()?.strip_prefix("wg")?.parse().ok()?;
        let kind = it.next()?;
        let (rs, whole) = match kind.strip_prefix("wgrows") {
            Some(n) => (n.parse().ok()?, true),
            None => (kind.strip_prefix("sgrows")?.parse().ok()?, false),
        };
        let p = it.next()?.strip_prefix('p')?.parse().ok()?;
        let mut fuse = Fuse::default();
        let mut next = it.next();
        let late = next == Some("rmsl");
        if late {
            fuse.rms_norm = true;
            next = it.next();
        }
        let x16 = next == Some("x16");
        if x16 {
            next = it.next();
        }
        let y16 = next == Some("y16");
        if y16 {
            next = it.next();
        }
        if next == Some("swiglu") {
            fuse.swiglu = true;
            next = it.next();
        }
        next.is_none()
            .then(|| {
                if whole {
                    MatvecConfig::q8_pre_wg(rows, wg, rs, p).fused(fuse)
                } else {
                    MatvecConfig::q8_pre(rows, wg, rs, p).fused(fuse)
                }
            })
            .map(|c| if late { c.with_rms_late() } else { c })
            .map(|c| c.with_q16(x16, y16))
    }

    /// The WGSL source of this variant.
    pub fn source(&self) -> String {
        match self.kernel {
            MatvecKernel::Split => format!(
                "// {}: parameters prepended by the host (src/runtime/gpu/mod.rs)\nconst ROWS: u32 = {}u;\nconst WG: u32 = {}u;\n\n{}\n{}",
                self.name(),
                self.rows_per_workgroup,
                self.workgroup_size,
                TERNARY_MATVEC_WGSL,
                match self.reduction {
                    Reduction::Subgroup => REDUCE_SUBGROUP_WGSL,
                    Reduction::Workgroup => REDUCE_WORKGROUP_WGSL,
                }
            ),
            MatvecKernel::SubgroupRows {
                rows_per_subgroup,
                units_in_flight,
                x_tile,
            } => format!(
                "// {}: parameters prepended and entry point generated by the host (src/runtime/gpu/mod.rs)\nconst ROWS: u32 = {}u;\nconst WG: u32 = {}u;\nconst RS: u32 = {}u;\nconst P: u32 = {}u;\n{}\n{}\n{}",
                self.name(),
                self.rows_per_workgroup,
                self.workgroup_size,
                rows_per_subgroup,
                units_in_flight,
                if x_tile > 0 {
                    format!("const XT: u32 = {x_tile}u;\n")
                } else {
                    String::new()
                },
                TERNARY_MATVEC_ROWS_WGSL,
                if x_tile > 0 {
                    rows_main_tiled(
                        rows_per_subgroup,
                        units_in_flight,
                        self.workgroup_size,
                        x_tile,
                        self.fuse,
                    )
                } else {
                    rows_main(rows_per_subgroup, units_in_flight)
                }
            ),
            MatvecKernel::Q8 {
                rows_per_subgroup,
                units_in_flight,
                max_cols,
            } => format!(
                "// {}: parameters prepended and entry point generated by the host (src/runtime/gpu/mod.rs)\nconst ROWS: u32 = {}u;\nconst WG: u32 = {}u;\nconst RS: u32 = {}u;\nconst P: u32 = {}u;\nconst XK: u32 = {}u;\n\n{}\n{}\n{}\n{}",
                self.name(),
                self.rows_per_workgroup,
                self.workgroup_size,
                rows_per_subgroup,
                units_in_flight,
                max_cols,
                TERNARY_MATVEC_Q8_WGSL,
                Q8_COMMON_WGSL,
                TERNARY_MATVEC_Q8_BODY_WGSL,
                q8_main(
                    rows_per_subgroup,
                    units_in_flight,
                    self.fuse,
                    false,
                    false,
                    false,
                    false,
                ),
            ),
            MatvecKernel::Q8Pre {
                rows_per_subgroup,
                units_in_flight,
                whole_workgroup,
                scales4,
                x16,
                y16,
                ..
            } => format!(
                "// {}: parameters prepended and entry point generated by the host (src/runtime/gpu/mod.rs)\nconst ROWS: u32 = {}u;\nconst WG: u32 = {}u;\nconst RS: u32 = {}u;\nconst P: u32 = {}u;\n\n{}\n{}\n{}\n{}",
                self.name(),
                self.rows_per_workgroup,
                self.workgroup_size,
                rows_per_subgroup,
                units_in_flight,
                TERNARY_MATVEC_Q8G_WGSL,
                Q8_COMMON_WGSL,
                q8_body_y16(q8_body(scales4), y16),
                if whole_workgroup {
                    q8_main_wg(
                        rows_per_subgroup,
                        units_in_flight,
                        self.fuse.swiglu,
                        scales4,
                        self.applies_norm_late(),
                        x16,
                    )
                } else {
                    q8_main(
                        rows_per_subgroup,
                        units_in_flight,
                        Fuse {
                            rms_norm: self.applies_norm_late(),
                            swiglu: self.fuse.swiglu,
                        },
                        true,
                        scales4,
                        x16,
                        y16,
                    )
                },
            ),
        }
    }
}

/// The declarations a subgroup-rows kernel with the RMSNorm folded in adds: the norm's weight
/// (binding 5) and the subgroups' sums of squares.
fn rms_decls(w: &mut dyn FnMut(String)) {
    w("// The RMSNorm's weight (binding 5) and the subgroups' sums of squares.".into());
    w("@group(0) @binding(5) var<storage, read> nw: array<vec4<f32>>;".into());
    w("var<workgroup> ssq: array<f32, WG / 4u>;".into());
}

/// Iterations of [`rms_scale`]'s loop over x whose loads are issued together, before any sum.
const RMS_UNROLL: u32 = 4;

/// `rinv`, rms_norm.wgsl's scale `1 / sqrt(mean(x^2) + eps)`, computed by every workgroup of a
/// kernel with the RMSNorm folded in: every subgroup's sum added in the same order by every
/// invocation. Invocation `lid` adds `dot(v, v)` of `x[lid]`, `x[lid + WG]`, ... in that
/// order; the first [`RMS_UNROLL`] of those loads are issued at once (a loop with a bound
/// known only at run time waits for each load in turn: one round trip to memory instead of
/// four at K = 4096 and 256 invocations), a load past the end adding `0.0`, which leaves the
/// sum's bits as they are (it is `+0.0` or more).
fn rms_scale(w: &mut dyn FnMut(String)) {
    w("    let n4 = params.cols / 4u;".into());
    for k in 0..RMS_UNROLL {
        w(format!("    let rv{k} = x[min(lid + {k}u * WG, n4 - 1u)];"));
    }
    w("    var sq = 0.0;".into());
    for k in 0..RMS_UNROLL {
        w(format!(
            "    sq += select(0.0, dot(rv{k}, rv{k}), lid + {k}u * WG < n4);"
        ));
    }
    w(format!(
        "    for (var i = lid + {RMS_UNROLL}u * WG; i < n4; i += WG) {{"
    ));
    w("        let v = x[i];".into());
    w("        sq += dot(v, v);".into());
    w("    }".into());
    w("    sq = subgroupAdd(sq);".into());
    w("    if lane == 0u {".into());
    w("        ssq[sg] = sq;".into());
    w("    }".into());
    w("    workgroupBarrier();".into());
    w("    var total = 0.0;".into());
    w("    for (var i = 0u; i < nsg; i++) {".into());
    w("        total += ssq[i];".into());
    w("    }".into());
    w("    let rinv = 1.0 / sqrt(total / f32(params.cols) + params.eps);".into());
}

/// Lines of the int8 quantization both quantizing kernels emit ([`q8_quantize_source`] and
/// the per-workgroup [`q8_stage`]), each indented by `ind`: x's 16-element group `g` as
/// `a0..a3` (normalized where `rms`).
fn q8_load16(w: &mut dyn FnMut(String), ind: &str, rms: bool) {
    q8_load16_as(w, ind, if rms { Q8Load::Norm } else { Q8Load::Plain });
}

/// What the quantization of a 16-element group reads ([`q8_load16_as`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Q8Load {
    /// x as it is.
    Plain,
    /// x normalized: `(x * rinv) * n` (`n` the norm's weight `nw`).
    Norm,
    /// `x * n`, x kept as `x0..x3` (the norm applied at the end: `rms_late`).
    Late,
}

/// [`q8_load16`] for each [`Q8Load`].
fn q8_load16_as(w: &mut dyn FnMut(String), ind: &str, load: Q8Load) {
    for i in 0..4 {
        match load {
            Q8Load::Norm => w(format!(
                "{ind}let a{i} = (x[4u * g + {i}u] * rinv) * nw[4u * g + {i}u];"
            )),
            Q8Load::Plain => w(format!("{ind}let a{i} = x[4u * g + {i}u];")),
            Q8Load::Late => {
                w(format!("{ind}let x{i} = x[4u * g + {i}u];"));
                w(format!("{ind}let a{i} = x{i} * nw[4u * g + {i}u];"));
            }
        }
    }
}

/// The group's max |a| into block maximum `bmax[slot]` (a NaN as the largest bits).
fn q8_group_max(w: &mut dyn FnMut(String), ind: &str, slot: &str) {
    w(format!(
        "{ind}let m4 = max(max(abs(a0), abs(a1)), max(abs(a2), abs(a3)));"
    ));
    w(format!(
        "{ind}let nan = any(nan4(a0) | nan4(a1) | nan4(a2) | nan4(a3));"
    ));
    w(format!(
        "{ind}let mb = bitcast<u32>(max(max(m4.x, m4.y), max(m4.z, m4.w)));"
    ));
    w(format!(
        "{ind}atomicMax(&bmax[{slot}], select(mb, 0x7fc00000u, nan));"
    ));
}

/// `amax`, `d = amax / 127` and `id = 1 / d` of block maximum `bmax[slot]`.
fn q8_quantize_group(w: &mut dyn FnMut(String), ind: &str, slot: &str) {
    w(format!(
        "{ind}let amax = bitcast<f32>(atomicLoad(&bmax[{slot}]));"
    ));
    q8_scale(w, ind);
}

/// `d = amax / 127` and `id = 1 / d` (0 for an all-zero group) of a group's `amax`: the one
/// formula of every int8 quantization here (the quantize kernels, the combine, `_y16`).
fn q8_scale(w: &mut dyn FnMut(String), ind: &str) {
    w(format!("{ind}let d = amax / 127.0;"));
    w(format!("{ind}let id = select(0.0, 1.0 / d, amax > 0.0);"));
}

/// `q0..q3` of the group, each line indented by `ind`.
fn q8_quant4(w: &mut dyn FnMut(String), ind: &str) {
    for i in 0..4 {
        w(format!("{ind}let q{i} = quant4(a{i} * id);"));
    }
}

/// The group's q packed into `xq[dst]` (the group layout) and its sum added to `usum[slot]`.
fn q8_pack_group(w: &mut dyn FnMut(String), ind: &str, dst: &str, slot: &str) {
    w(format!("{ind}xq[{dst}] = vec4<u32>("));
    for c in ["x", "y", "z", "w"] {
        w(format!(
            "{ind}    pack4xI8(vec4<i32>(q0.{c}, q1.{c}, q2.{c}, q3.{c})),"
        ));
    }
    w(format!("{ind});"));
    w(format!("{ind}let t = (q0 + q1) + (q2 + q3);"));
    w(format!(
        "{ind}atomicAdd(&usum[{slot}], (t.x + t.y) + (t.z + t.w));"
    ));
}

/// One 16-element group `g` per invocation (where `live` is false it loads and stores
/// nothing), each line indented by 4: the block maximum into `bmax[max_slot]`, a barrier,
/// the group's `q` into `xq[dst]` and its sum into `usum[sum_slot]`, a barrier; with `rms`
/// x normalized (`rinv`, `nw`). The quantize kernel's and `op_attention_combine_q8`'s.
fn q8_quantize_groups(
    w: &mut dyn FnMut(String),
    load: Q8Load,
    max_slot: &str,
    dst: &str,
    sum_slot: &str,
) {
    q8_load16_as(w, "    ", load);
    if load == Q8Load::Late {
        // The group's x . x (0 past the last group), each subgroup's sum into wssq.
        w("    let sql = select(0.0, (dot(x0, x0) + dot(x1, x1)) + (dot(x2, x2) + dot(x3, x3)), live);".into());
        w("    let sqs = subgroupAdd(sql);".into());
        w("    if lane == 0u {".into());
        w("        wssq[sg] = sqs;".into());
        w("    }".into());
    }
    w("    if live {".into());
    q8_group_max(w, "        ", max_slot);
    w("    }".into());
    w("    workgroupBarrier();".into());
    q8_quantize_group(w, "    ", max_slot);
    q8_quant4(w, "    ");
    w("    if live {".into());
    q8_pack_group(w, "        ", dst, sum_slot);
    w("    }".into());
    w("    workgroupBarrier();".into());
}

/// Invocations per workgroup of the decode quantize kernel ([`q8_quantize_name`]): one per
/// 16-element group, so a workgroup quantizes 4096 activations.
pub const Q8_QUANTIZE_WG: u32 = 256;

/// The decode quantize kernel of [`MatvecKernel::Q8Pre`]: `ternary_q8_quantize`, or with the
/// RMSNorm folded in (`rms`) `ternary_q8_quantize_rms`.
pub fn q8_quantize_name(rms: bool) -> &'static str {
    if rms {
        "ternary_q8_quantize_rms"
    } else {
        "ternary_q8_quantize"
    }
}

/// The WGSL of [`q8_quantize_name`]`(rms)`: x [K] f32 (K a multiple of 256) to the int8 x of
/// `shaders/ternary_matvec_q8g.wgsl`, quantized as [`MatvecKernel::Q8`] quantizes it in each
/// workgroup (the same expressions, the norm's sum of squares in the same order for the
/// same workgroup size: the same int8 values and `da`). Bindings: x (0), the output (1), the
/// parameters `(K, eps, 0, 0)` (2) and with `rms` the norm's weight (3). Workgroup `i` takes
/// groups `256 i ..` (blocks `16 i ..`); with `rms` every workgroup adds up `x . x` itself.
pub fn q8_quantize_source(rms: bool) -> String {
    q8_quantize_source_as(if rms { Q8Load::Norm } else { Q8Load::Plain })
}

/// The quantize kernel of a [`MatvecKernel::Q8Pre`] product with its RMSNorm applied at the
/// end (`rms_late`).
pub const Q8_QUANTIZE_RMS_LATE: &str = "ternary_q8_quantize_rmsl";

/// The WGSL of [`Q8_QUANTIZE_RMS_LATE`]: [`q8_quantize_source`]'s bindings and layout, x
/// times the norm's weight quantized in one pass over x (no `rinv`: a block's `q` do not
/// depend on a common factor, only its `da` does, and the product multiplies its sums by
/// `rinv` at the end), and after the unit terms (at `vec4` index `K/16 + K/128 + i`) the sum
/// of `x^2` over workgroup `i`'s elements in `.x`, its subgroups' sums added in order.
pub fn q8_quantize_rms_late_source() -> String {
    q8_quantize_source_as(Q8Load::Late)
}

fn q8_quantize_source_as(load: Q8Load) -> String {
    use std::fmt::Write;
    let rms = load != Q8Load::Plain;
    let mut m = String::new();
    let mut w = |line: String| {
        let _ = writeln!(m, "{line}");
    };
    let name = match load {
        Q8Load::Late => Q8_QUANTIZE_RMS_LATE,
        _ => q8_quantize_name(rms),
    };
    w(format!(
        "// {name}: generated by the host (src/runtime/gpu/mod.rs, q8_quantize_source)"
    ));
    w(format!("const WG: u32 = {Q8_QUANTIZE_WG}u;"));
    w(Q8_COMMON_WGSL.into());
    w("struct QParams {".into());
    w("    cols: u32,".into());
    w("    eps: f32,".into());
    w("    _pad0: u32,".into());
    w("    _pad1: u32,".into());
    w("}".into());
    w("@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;".into());
    w("@group(0) @binding(1) var<storage, read_write> xq: array<vec4<u32>>;".into());
    w("@group(0) @binding(2) var<uniform> params: QParams;".into());
    if rms {
        w("@group(0) @binding(3) var<storage, read> nw: array<vec4<f32>>;".into());
        let v = if load == Q8Load::Late { "wssq" } else { "ssq" };
        w(format!("var<workgroup> {v}: array<f32, WG / 4u>;"));
    }
    w(
        "// Per block of the workgroup: max |x| as f32 bits (a NaN as 0x7fc00000, above every"
            .into(),
    );
    w("// other); per unit: sum q.".into());
    w("var<workgroup> bmax: array<atomic<u32>, WG / 16u>;".into());
    w("var<workgroup> usum: array<atomic<i32>, WG / 4u>;".into());
    w(String::new());
    w("@compute @workgroup_size(WG)".into());
    w("fn main(".into());
    w("    @builtin(workgroup_id) wid: vec3<u32>,".into());
    w("    @builtin(local_invocation_index) lid: u32,".into());
    w("    @builtin(subgroup_id) sg: u32,".into());
    w("    @builtin(subgroup_invocation_id) lane: u32,".into());
    w("    @builtin(num_subgroups) nsg: u32,".into());
    w(") {".into());
    w("    let groups = params.cols / 16u;".into());
    w(
        "    // Every invocation reaches every barrier: those past the last group load it again"
            .into(),
    );
    w("    // and store nothing.".into());
    w("    let g0 = wid.x * WG + lid;".into());
    w("    let live = g0 < groups;".into());
    w("    let g = min(g0, groups - 1u);".into());
    // The group's x and norm weight are loaded first, beside the sum of squares' loads: one
    // round trip to memory for all of them (the same values, the same expressions below).
    w(
        "    // The group's words first, with the sum of squares' (the same values as later)."
            .into(),
    );
    for i in 0..4 {
        w(format!("    let xg{i} = x[4u * g + {i}u];"));
        if rms {
            w(format!("    let ng{i} = nw[4u * g + {i}u];"));
        }
    }
    w("    if lid < WG / 16u {".into());
    w("        atomicStore(&bmax[lid], 0u);".into());
    w("    }".into());
    w("    if lid < WG / 4u {".into());
    w("        atomicStore(&usum[lid], 0);".into());
    w("    }".into());
    if load == Q8Load::Norm {
        // Its barrier also orders the stores above before the atomics below.
        rms_scale(&mut w);
    } else {
        w("    workgroupBarrier();".into());
    }
    let mut sub = String::new();
    q8_quantize_groups(
        &mut |line| {
            let _ = writeln!(sub, "{line}");
        },
        load,
        "lid / 16u",
        "g",
        "lid / 4u",
    );
    for i in 0..4 {
        sub = sub
            .replace(&format!("x[4u * g + {i}u]"), &format!("xg{i}"))
            .replace(&format!("nw[4u * g + {i}u]"), &format!("ng{i}"));
    }
    debug_assert!(!sub.contains("[4u * g"));
    w(sub.trim_end().into());
    if load == Q8Load::Late {
        w(
            "    // The workgroup's x . x after the unit terms, its subgroups' sums in order."
                .into(),
        );
        w("    if lid == 0u {".into());
        w("        var t = 0.0;".into());
        w("        for (var i = 0u; i < nsg; i++) {".into());
        w("            t += wssq[i];".into());
        w("        }".into());
        w(
            "        xq[groups + groups / 8u + wid.x] = vec4<u32>(bitcast<u32>(t), 0u, 0u, 0u);"
                .into(),
        );
        w("    }".into());
    }
    w("    // Units 2i and 2i + 1 (one block: the same da) in one vec4 after the groups.".into());
    w("    if live && (lid & 7u) == 0u {".into());
    w("        let u = lid / 4u;".into());
    w("        xq[groups + g / 8u] = vec4<u32>(".into());
    w("            bitcast<u32>(atomicLoad(&usum[u])),".into());
    w("            bitcast<u32>(d),".into());
    w("            bitcast<u32>(atomicLoad(&usum[u + 1u])),".into());
    w("            bitcast<u32>(d),".into());
    w("        );".into());
    w("    }".into());
    w("}".into());
    m
}

/// Groups of four splits whose values `op_attention_combine_q8` loads before its first barrier,
/// beside the splits' m and l (measured when the 8B shape's decode step at position 512
/// merged 33 splits; with the split grain of 32 it merges 17 there, 65 at 2048).
/// On an H200 (BENCHMARKS.md), with 4 the step took 2358-2361 us, with 0 (every group in the
/// loop after the barriers) 2371-2375, with 9 (36 splits) 2381-2390: the first loads help,
/// 36 values an invocation held across the barriers cost more than the round trips saved.
/// The loop after them adds one group a pass; four a pass with every load first (the same
/// bits) took the H100's step at 2048 from 2621-2632 to 2603-2607 us (run 38, BENCHMARKS.md):
/// not kept for under 1%, which would change every ternary bundle's kernel digests.
const COMBINE_Q8_PRE: u32 = 4;

/// `op_attention_combine_q8`'s parameters and bindings.
const COMBINE_Q8_BINDINGS: &str = r#"struct P {
    heads: u32,
    head_dim: u32,
    splits: u32,
    chunk: u32,
    grain: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> part: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read_write> xq: array<vec4<u32>>;
@group(0) @binding(3) var<uniform> p: P;
@group(0) @binding(4) var<uniform> step: Step;

"#;

/// The combine's bounds (heads a block spans, splits), shared with the attention that
/// combines in its last workgroup ([`attention_decode_combine_q8_source`]).
const COMBINE_Q8_LIMITS: &str = r#"// Heads a block of 256 outputs spans, at most (head_dim >= 64), and splits (backend.rs).
const MAXH: u32 = 5u;
const MAX_SPLITS: u32 = 128u;
"#;

/// The standalone combine's preloaded groups and its `NEG_BIG` (the attention declares its own).
const COMBINE_Q8_PRE_DECLS: &str = r#"// Groups of four splits whose values are loaded at the start.
const PRE: u32 = {COMBINE_Q8_PRE}u;
const NEG_BIG: f32 = -3.4028234663852886e38;
"#;

/// The combine's workgroup memory and its `xv` helper.
const COMBINE_Q8_WORKGROUP: &str = r#"// Per head of the block and split: m (or NEG_BIG where the split holds no position), l, and
// then the split's weight exp(m - M).
var<workgroup> ms: array<f32, MAXH * MAX_SPLITS>;
var<workgroup> ls: array<f32, MAXH * MAX_SPLITS>;
var<workgroup> ws: array<f32, MAXH * MAX_SPLITS>;
// Per head of the block: M, then 1 / sum w l.
var<workgroup> hm: array<f32, MAXH>;
var<workgroup> hinv: array<f32, MAXH>;
// The block's 256 merged values, one f32 per invocation (each invocation writes a word of
// its own: no invocation writes part of a vector another writes).
var<workgroup> xs: array<f32, 256>;
// The block's max |x| as f32 bits (a NaN as 0x7fc00000) and its units' sums of q.
var<workgroup> bmax: array<atomic<u32>, 1>;
var<workgroup> usum: array<atomic<i32>, 4>;

// Elements 4j .. 4j + 3 of the block.
fn xv(j: u32) -> vec4<f32> {
    return vec4<f32>(xs[4u * j], xs[4u * j + 1u], xs[4u * j + 2u], xs[4u * j + 3u]);
}

"#;

/// The standalone combine's entry point: its block, the splits in use, and element
/// `256 blk + lid`'s first values.
const COMBINE_Q8_MAIN: &str = r#"@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let hd = p.head_dim;
    let blk = wid.x;
    let pos = step.pos0;
    let c = split_chunk(pos, p.splits, max(p.chunk, 1u), p.grain);
    let used = min(p.splits, pos / max(c, 1u) + 1u);
    let h0 = (blk * 256u) / hd;
    let nhb = (blk * 256u + 255u) / hd - h0 + 1u;
    let stride = hd + 2u;
    // Element e's values of the first 4 * PRE splits, loaded here, before the barriers (in
    // flight with the m and l loads below; the loop after the barriers waits for each group
    // of four in turn); a split past the last used reads the last and adds nothing.
    let e = blk * 256u + lid;
    let lh = e / hd - h0;
    let dim = e % hd;
    let b = lh * MAX_SPLITS;
    let o = (e / hd) * p.splits * stride + 2u + dim;
    let lastu = used - 1u;
    //@for K PRE
    let pv{K} = vec4<f32>(part[o + min(4u * {K}u, lastu) * stride], part[o + min(4u * {K}u + 1u, lastu) * stride], part[o + min(4u * {K}u + 2u, lastu) * stride], part[o + min(4u * {K}u + 3u, lastu) * stride]);
    //@end
"#;

/// Per head of the block: M, the splits' weights and 1 / sum w l (any workgroup size).
const COMBINE_Q8_WEIGHTS: &str = r#"    if lid == 0u {
        atomicStore(&bmax[0], 0u);
    }
    if lid < 4u {
        atomicStore(&usum[lid], 0);
    }
    for (var j = lid; j < nhb * used; j += WG) {
        let lh = j / used;
        let sp = j % used;
        let o = ((h0 + lh) * p.splits + sp) * stride;
        let l = part[o + 1u];
        ms[lh * MAX_SPLITS + sp] = select(NEG_BIG, part[o], l > 0.0);
        ls[lh * MAX_SPLITS + sp] = l;
    }
    workgroupBarrier();
    // M per head: four independent chains (max is exact in any order).
    if lid < nhb {
        let b = lid * MAX_SPLITS;
        var m4 = vec4<f32>(NEG_BIG);
        var sp = 0u;
        for (; sp + 4u <= used; sp += 4u) {
            m4 = max(m4, vec4<f32>(ms[b + sp], ms[b + sp + 1u], ms[b + sp + 2u], ms[b + sp + 3u]));
        }
        for (; sp < used; sp++) {
            m4.x = max(m4.x, ms[b + sp]);
        }
        hm[lid] = max(max(m4.x, m4.y), max(m4.z, m4.w));
    }
    workgroupBarrier();
    for (var j = lid; j < nhb * used; j += WG) {
        let lh = j / used;
        let k = lh * MAX_SPLITS + j % used;
        ws[k] = select(0.0, exp(ms[k] - hm[lh]), ls[k] > 0.0);
    }
    workgroupBarrier();
    // 1 / sum w l per head, the sum in attention_combine.wgsl's order.
    if lid < nhb {
        let b = lid * MAX_SPLITS;
        var l4 = vec4<f32>(0.0);
        var sp = 0u;
        for (; sp + 4u <= used; sp += 4u) {
            let wv = vec4<f32>(ws[b + sp], ws[b + sp + 1u], ws[b + sp + 2u], ws[b + sp + 3u]);
            let lv = vec4<f32>(ls[b + sp], ls[b + sp + 1u], ls[b + sp + 2u], ls[b + sp + 3u]);
            l4 += select(vec4<f32>(0.0), wv * lv, wv > vec4<f32>(0.0));
        }
        for (; sp < used; sp++) {
            if ws[b + sp] > 0.0 {
                l4.x += ws[b + sp] * ls[b + sp];
            }
        }
        hinv[lid] = 1.0 / ((l4.x + l4.y) + (l4.z + l4.w));
    }
    workgroupBarrier();
"#;

/// The standalone combine's preloaded groups of splits, added first.
const COMBINE_Q8_PRELOADED: &str = r#"    // Element e's weighted values over the splits: four interleaved partial sums, added in
    // order. Lane k of `a` adds splits k, k + 4, ... (attention_combine.wgsl's groups), and
    // the lanes are added in its order: the same bits as that kernel.
    var a = vec4<f32>(0.0);
    // The preloaded groups first, each as the loop below adds a group.
    //@for K PRE
    if 4u * {K}u < used {
        let sp = 4u * {K}u;
        let live = vec4<u32>(sp, sp + 1u, sp + 2u, sp + 3u) < vec4<u32>(used);
        let wv = vec4<f32>(ws[b + sp], ws[b + min(sp + 1u, lastu)], ws[b + min(sp + 2u, lastu)], ws[b + min(sp + 3u, lastu)]);
        a += select(vec4<f32>(0.0), wv * pv{K}, (wv > vec4<f32>(0.0)) & live);
    }
    //@end
"#;

/// Element `e`'s groups of four splits after the preloaded ones, added in order.
const COMBINE_Q8_SPLITS: &str = r#"    for (var sp = 4u * PRE; sp < used; sp += 4u) {
        let i1 = min(sp + 1u, used - 1u);
        let i2 = min(sp + 2u, used - 1u);
        let i3 = min(sp + 3u, used - 1u);
        let live = vec4<u32>(sp, sp + 1u, sp + 2u, sp + 3u) < vec4<u32>(used);
        let wv = vec4<f32>(ws[b + sp], ws[b + i1], ws[b + i2], ws[b + i3]);
        let pv = vec4<f32>(part[o + sp * stride], part[o + i1 * stride], part[o + i2 * stride], part[o + i3 * stride]);
        a += select(vec4<f32>(0.0), wv * pv, (wv > vec4<f32>(0.0)) & live);
    }
"#;

/// The standalone combine's store of element `e` (invocation `lid`'s).
const COMBINE_Q8_STORE: &str = r#"    let v = (((a.x + a.y) + a.z) + a.w) * hinv[lh];
    out[e] = v;
    xs[lid] = v;
    workgroupBarrier();
"#;

/// The start of the block's quantization: its 16 groups, one invocation each.
const COMBINE_Q8_GROUPS: &str = r#"    // The block's 16 groups, one invocation each (q8_quantize_source's lines).
    let g = lid;
    let live = g < 16u;
    let gl = min(g, 15u);"#;

/// The end of the combine of block `blk` (its merged values in `xs`; `live`, `g` and `gl`
/// set by [`COMBINE_Q8_GROUPS`]): the block's 16 groups quantized into `xq` and its units'
/// terms after the `K / 16` groups (`p.heads` heads of `hd` elements).
fn combine_q8_quantize(w: &mut dyn FnMut(String)) {
    use std::fmt::Write;
    // The helpers index x by `4u * g`; the local group is `gl`.
    let mut sub = String::new();
    q8_quantize_groups(
        &mut |line| {
            let _ = writeln!(sub, "{line}");
        },
        Q8Load::Plain,
        "0u",
        "blk * 16u + gl",
        "gl / 4u",
    );
    // The helpers read x[4g + i], group g's elements 4i .. 4i + 3, as a vec4.
    for i in 0..4 {
        sub = sub.replace(&format!("x[4u * g + {i}u]"), &format!("xv(4u * gl + {i}u)"));
    }
    debug_assert!(!sub.contains("x[4u * g"));
    w(sub);
    w(
        r#"    // Units 2i and 2i + 1 of the block (its da twice) after the K / 16 groups.
    if lid < 2u {
        let groups = p.heads * hd / 16u;
        xq[groups + blk * 2u + lid] = vec4<u32>(
            bitcast<u32>(atomicLoad(&usum[2u * lid])),
            bitcast<u32>(d),
            bitcast<u32>(atomicLoad(&usum[2u * lid + 1u])),
            bitcast<u32>(d),
        );
    }"#
        .into(),
    );
}

/// The decode attention's combine with the output product's int8 quantization folded in
/// (`op_attention_combine_q8`): one workgroup of [`COMBINE_Q8_WG`] invocations per block of
/// 256 outputs of the attention (`heads * head_dim` of them, a multiple of 256; head_dim at
/// least 64, so a block spans at most 5 heads). Invocation i merges the splits of element
/// `256 b + i` as `attention_combine.wgsl` does (M = max m_s, weights exp(m_s - M), sum of the
/// weighted values over the splits that hold positions, times 1 / sum w_s l_s; the same
/// operations in the same order: the same bits), stores it to `out`, and the block is then
/// quantized into the product's int8 x
/// ([`q8_quantize_source`]'s expressions: the same int8 values and `da` for the same f32
/// values) at binding 2. One token only (decode). Bindings: part (0), out (1), xq (2), the
/// combine's parameters (3), the step (4).
pub fn combine_q8_source() -> String {
    use std::fmt::Write;
    let mut m = String::new();
    let mut w = |line: String| {
        let _ = writeln!(m, "{line}");
    };
    w("// op_attention_combine_q8: generated by the host (src/runtime/gpu/mod.rs, combine_q8_source)".into());
    w(ops::COMMON_WGSL.into());
    w(Q8_COMMON_WGSL.into());
    let mut raw = String::new();
    for piece in [
        COMBINE_Q8_BINDINGS,
        &format!("const WG: u32 = {COMBINE_Q8_WG}u;\n"),
        COMBINE_Q8_LIMITS,
        &COMBINE_Q8_PRE_DECLS.replace("{COMBINE_Q8_PRE}", &COMBINE_Q8_PRE.to_string()),
        COMBINE_Q8_WORKGROUP,
        COMBINE_Q8_MAIN,
        COMBINE_Q8_WEIGHTS,
        COMBINE_Q8_PRELOADED,
        COMBINE_Q8_SPLITS,
        COMBINE_Q8_STORE,
        COMBINE_Q8_GROUPS,
    ] {
        raw.push_str(piece);
    }
    w(raw);
    combine_q8_quantize(&mut w);
    w("}".into());
    ops::expand_for(&m, &[("PRE", COMBINE_Q8_PRE as usize)])
}

/// The entry point of attention_decode.wgsl, which [`attention_decode_combine_q8_source`]
/// turns into a function.
const DECODE_ATTENTION_ENTRY: &str = "@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(num_subgroups) nsg: u32,
    @builtin(subgroup_size) sg_size: u32,
) {";

/// The decode attention with its combine folded in (`op_attention_decode_combine_q8`,
/// [`kernels::ATTENTION_COMBINE_Q8`]): `op_attention_decode`'s workgroups (head, split), each
/// writing its partial (m, l, acc) as that kernel does; then each counts itself done in
/// `done[b]` for every block `b` of 256 outputs its head overlaps, and the workgroup that
/// counts a block's last (all `splits` workgroups of each head the block spans) merges that
/// block as [`combine_q8_source`] merges it (the same operations in the same order for each
/// element: the same values and int8 x, the values at binding 9, the int8 x at 10) and
/// sets its count back to 0 for the next dispatch. One dispatch and one barrier fewer a
/// layer than the attention, then the combine, but slower on an H100 (run 33, BENCHMARKS.md:
/// 36.2 us a layer against 31.6): the backend runs it only with `LOWBIT_GPU_ATTN_MERGE=1`.
///
/// The partials cross workgroups through memory: every workgroup's stores, then
/// `storageBarrier()` (naga's SPIR-V: a control barrier with device-scope acquire-release on
/// storage memory), then its count (an atomic); the last workgroup's count, then
/// `storageBarrier()` again before it reads the others' partials: the release / acquire
/// fence pattern at device scope. The partials' binding is `@coherent` (SPIR-V's Coherent:
/// under the GLSL450 memory model naga emits, only such accesses take part in that ordering
/// between invocations; wgpu's MEMORY_DECORATION_COHERENT, which every Vulkan adapter has).
/// naga's MSL for the same barrier orders memory within a threadgroup only, so the backend
/// runs this kernel on Vulkan only.
/// No workgroup waits for another (no forward-progress assumption): whichever is last
/// does the merge. Bindings: `op_attention_decode`'s (0 to 8), the merged values (9), the
/// int8 x (10), the counts (11, `heads * head_dim / 256` u32, zero before the first
/// dispatch). `head_dim` at least 64 and `heads * head_dim` a multiple of 256, as for the
/// combine; 10 storage bindings.
pub fn attention_decode_combine_q8_source() -> String {
    use std::fmt::Write;
    let attention = ops::attention_decode_body();
    assert_eq!(
        attention.matches(DECODE_ATTENTION_ENTRY).count(),
        1,
        "attention_decode.wgsl's entry point"
    );
    assert!(
        attention.contains(&format!("const WG: u32 = {DECODE_ATTENTION_WG}u;")),
        "attention_decode.wgsl's workgroup size"
    );
    let attention = attention.replace(
        DECODE_ATTENTION_ENTRY,
        "fn attend(lid: u32, wid: vec3<u32>, sg: u32, lane: u32, nsg: u32, sg_size: u32) {",
    );
    // The partials `@coherent`: other workgroups read them in this dispatch (SPIR-V's
    // Coherent decoration, without which the GLSL450 memory model naga emits does not order
    // plain accesses between invocations).
    const PART: &str = "@group(0) @binding(6) var<storage, read_write> part: array<f32>;";
    assert_eq!(
        attention.matches(PART).count(),
        1,
        "attention_decode.wgsl's part"
    );
    let attention = attention.replace(PART, &format!("@coherent {PART}"));
    let mut m = String::new();
    let mut w = |line: String| {
        let _ = writeln!(m, "{line}");
    };
    w(format!(
        "// {}: generated by the host (src/runtime/gpu/mod.rs, \
         attention_decode_combine_q8_source): common.wgsl, q8_common.wgsl, \
         attention_decode.wgsl as `attend`, the combine of op_attention_combine_q8",
        kernels::ATTENTION_COMBINE_Q8
    ));
    w(ops::COMMON_WGSL.into());
    w(Q8_COMMON_WGSL.into());
    w(attention);
    w(
        r#"@group(0) @binding(9) var<storage, read_write> attn_out: array<f32>;
@group(0) @binding(10) var<storage, read_write> xq: array<vec4<u32>>;
// Per block of 256 outputs: how many of the workgroups of the heads it spans are done.
@group(0) @binding(11) var<storage, read_write> done: array<atomic<u32>>;
"#
        .into(),
    );
    w(COMBINE_Q8_LIMITS.into());
    w(COMBINE_Q8_WORKGROUP.into());
    w(
        r#"// The blocks this workgroup merges (bit i: block b0 + i), from invocation 0.
var<workgroup> last_of: u32;

// The combine of block blk, as op_attention_combine_q8's workgroup blk merges it, its 256
// elements 4 an invocation (element 256 blk + r WG + lid for r = 0 .. 3).
fn combine_block(blk: u32, lid: u32) {
    let hd = p.head_dim;
    let pos = step.pos0;
    let c = split_chunk(pos, p.splits, max(p.chunk, 1u), p.grain);
    let used = min(p.splits, pos / max(c, 1u) + 1u);
    let h0 = (blk * 256u) / hd;
    let nhb = (blk * 256u + 255u) / hd - h0 + 1u;
    let stride = hd + 2u;"#
            .into(),
    );
    let mut raw = String::from(COMBINE_Q8_WEIGHTS);
    // The invocation's 256 / WG elements side by side (`//@for R ELEMS`, expanded below):
    // each group of four splits' values of all of them loaded at once, then added to each
    // element's own sums as the combine adds them (COMBINE_Q8_SPLITS' operations in its
    // order: the same bits), so that their loads are in flight together.
    raw.push_str(
        r#"    //@for R ELEMS
    let e{R} = blk * 256u + {R}u * WG + lid;
    let lh{R} = e{R} / hd - h0;
    let b{R} = lh{R} * MAX_SPLITS;
    let o{R} = (e{R} / hd) * p.splits * stride + 2u + e{R} % hd;
    var acc{R} = vec4<f32>(0.0);
    //@end
    for (var sp = 0u; sp < used; sp += 4u) {
        let i1 = min(sp + 1u, used - 1u);
        let i2 = min(sp + 2u, used - 1u);
        let i3 = min(sp + 3u, used - 1u);
        let live = vec4<u32>(sp, sp + 1u, sp + 2u, sp + 3u) < vec4<u32>(used);
        //@for R ELEMS
        let pv{R} = vec4<f32>(part[o{R} + sp * stride], part[o{R} + i1 * stride], part[o{R} + i2 * stride], part[o{R} + i3 * stride]);
        //@end
        //@for R ELEMS
        let wv{R} = vec4<f32>(ws[b{R} + sp], ws[b{R} + i1], ws[b{R} + i2], ws[b{R} + i3]);
        acc{R} += select(vec4<f32>(0.0), wv{R} * pv{R}, (wv{R} > vec4<f32>(0.0)) & live);
        //@end
    }
    //@for R ELEMS
    let v{R} = (((acc{R}.x + acc{R}.y) + acc{R}.z) + acc{R}.w) * hinv[lh{R}];
    attn_out[e{R}] = v{R};
    xs[{R}u * WG + lid] = v{R};
    //@end
    workgroupBarrier();
"#,
    );
    raw.push_str(COMBINE_Q8_GROUPS);
    w(raw);
    combine_q8_quantize(&mut w);
    w(
        r#"    // The next block this workgroup merges rewrites the workgroup memory read above.
    workgroupBarrier();
}
"#
        .into(),
    );
    // The entry point of attention_decode.wgsl, now calling its body.
    w(DECODE_ATTENTION_ENTRY.into());
    w(r#"    attend(lid, wid, sg, lane, nsg, sg_size);
    // This workgroup's partial, stored by several invocations, visible on the device before
    // its count (release).
    storageBarrier();
    let hd = p.head_dim;
    let b0 = (wid.x * hd) / 256u;
    let b1 = (wid.x * hd + hd - 1u) / 256u;
    if lid == 0u {
        var flags = 0u;
        for (var blk = b0; blk <= b1; blk++) {
            let heads = (blk * 256u + 255u) / hd - (blk * 256u) / hd + 1u;
            if atomicAdd(&done[blk], 1u) + 1u == heads * p.splits {
                flags |= 1u << (blk - b0);
            }
        }
        last_of = flags;
    }
    let flags = workgroupUniformLoad(&last_of);
    if flags == 0u {
        return;
    }
    // The other workgroups' partials (acquire).
    storageBarrier();
    for (var blk = b0; blk <= b1; blk++) {
        if (flags & (1u << (blk - b0))) != 0u {
            if lid == 0u {
                atomicStore(&done[blk], 0u);
            }
            combine_block(blk, lid);
        }
    }
}"#
    .into());
    ops::expand_for(&m, &[("ELEMS", 256 / DECODE_ATTENTION_WG)])
}

/// Invocations per workgroup of `op_attention_decode` (`WG` in attention_decode.wgsl).
const DECODE_ATTENTION_WG: usize = 64;

/// Invocations per workgroup of `op_attention_combine_q8` ([`combine_q8_source`]): one per
/// output of a 256-block.
pub const COMBINE_Q8_WG: u32 = 256;

/// The end of a subgroup pass over `rs` rows, each line indented by `ind`: each row's sum over
/// the subgroup (with `swiglu`, `silu(gate) * up` of its gate row and its up row `r + rs`),
/// stored by lane 0 for the rows inside the dispatch. With `late` each sum is multiplied by
/// `rinv` first (the RMSNorm applied at the end, [`MatvecKernel::Q8Pre`]'s `rms_late`).
fn rows_store(w: &mut dyn FnMut(String), rs: u32, swiglu: bool, late: bool, ind: &str) {
    let k = if late { " * rinv" } else { "" };
    for r in 0..rs {
        if swiglu {
            let u = r + rs;
            w(format!("{ind}let tg{r} = subgroupAdd(acc{r}){k};"));
            w(format!("{ind}let tu{r} = subgroupAdd(acc{u}){k};"));
            w(format!(
                "{ind}let t{r} = (tg{r} / (1.0 + exp(-tg{r}))) * tu{r};"
            ));
        } else {
            w(format!("{ind}let t{r} = subgroupAdd(acc{r}){k};"));
        }
    }
    w(format!("{ind}if lane == 0u {{"));
    w(format!("{ind}    store_y(r0, t0);"));
    for r in 1..rs {
        w(format!("{ind}    if r0 + {r}u < params.rows {{"));
        w(format!("{ind}        store_y(r0 + {r}u, t{r});"));
        w(format!("{ind}    }}"));
    }
    w(format!("{ind}}}"));
}

/// The entry point of the subgroup-rows kernel with x staged in workgroup memory, `XT`
/// elements (`XT / 64` units) per tile, unrolled over `rs` rows and `p` units per chunk.
/// Unit `u` of a tile is stored as its 16 `vec4`s at `16 u + (k ^ (u % 16))`: the staging
/// (consecutive invocations, consecutive `vec4`s of x) and the reads (consecutive lanes,
/// consecutive units, one `k` at a time) both hit 8 distinct 16-byte bank groups per 8 lanes.
///
/// With `fuse.swiglu` each pass also takes the up rows `row + params.rows` (accumulators
/// `rs..2 rs`) and stores `silu(gate) * up`; with `fuse.rms_norm` the workgroup first adds up
/// `x . x` and stages x normalized.
fn rows_main_tiled(rs: u32, p: u32, wg: u32, x_tile: u32, fuse: Fuse) -> String {
    use std::fmt::Write;
    let mut m = String::new();
    // vec4s of x each invocation stages at once (all loads, then all stores): at most 8.
    let stage = (x_tile / 4).div_ceil(wg).clamp(1, 8);
    // Weight rows per pass: the rs output rows, and with SwiGLU their up rows.
    let nr = if fuse.swiglu { 2 * rs } else { rs };
    let rows = 0..nr;
    let units = 0..p;
    // `writeln!` into a String cannot fail.
    let mut w = |line: String| {
        let _ = writeln!(m, "{line}");
    };
    w("const UT: u32 = XT / 64u;".into());
    w(format!("const STAGE: u32 = {stage}u;"));
    w("var<workgroup> xs: array<vec4<f32>, XT / 4u>;".into());
    if fuse.rms_norm {
        rms_decls(&mut w);
    }
    w(String::new());
    w("@compute @workgroup_size(WG)".into());
    w("fn main(".into());
    w("    @builtin(workgroup_id) wid: vec3<u32>,".into());
    w("    @builtin(local_invocation_index) lid: u32,".into());
    w("    @builtin(subgroup_id) sg: u32,".into());
    w("    @builtin(subgroup_invocation_id) lane: u32,".into());
    w("    @builtin(subgroup_size) sg_size: u32,".into());
    w("    @builtin(num_subgroups) nsg: u32,".into());
    w(") {".into());
    w("    let row_base = (wid.y * params.groups_x + wid.x) * ROWS;".into());
    w("    if row_base >= params.rows {".into());
    w("        return;".into());
    w("    }".into());
    w("    let s = min(sg_size, WG);".into());
    w("    let units = params.cols / 64u;".into());
    w("    let blocks = params.cols / 256u;".into());
    w("    let last = params.rows - 1u;".into());
    w("    let quarter = s / 4u;".into());
    if fuse.rms_norm {
        rms_scale(&mut w);
    }
    w(
        "    // Passes over the workgroup's rows, the same number for every subgroup (barriers)."
            .into(),
    );
    w("    for (var g0 = 0u; g0 < ROWS; g0 += nsg * RS) {".into());
    w("        let g = g0 + sg * RS;".into());
    w("        let r0 = row_base + g;".into());
    w("        let has_rows = g < ROWS && r0 < params.rows;".into());
    for r in rows.clone() {
        if r < rs {
            w(format!("        let row{r} = min(r0 + {r}u, last);"));
        } else {
            w(format!("        let row{r} = row{} + params.rows;", r - rs));
        }
        w(format!("        var acc{r} = 0.0;"));
    }
    // Codes and scales of the next chunk, loaded before the current one is computed (the
    // tile's first chunk before the staging barriers).
    for r in rows.clone() {
        w(format!("        var d{r} = 0.0;"));
        for j in units.clone() {
            w(format!("        var w{r}_{j} = vec4<u32>();"));
        }
    }
    let load = |w: &mut dyn FnMut(String), ind: &str, c: &str| {
        w(format!(
            "{ind}let b = min((tb + {c}) / 4u + lane, blocks - 1u);"
        ));
        for r in 0..nr {
            w(format!("{ind}d{r} = scale_at(row{r} * blocks + b);"));
        }
        for j in 0..p {
            w(format!(
                "{ind}let v{j} = tb + min({c} + lane + {j}u * s, tu - 1u);"
            ));
        }
        for j in 0..p {
            for r in 0..nr {
                w(format!("{ind}w{r}_{j} = codes[row{r} * units + v{j}];"));
            }
        }
    };
    w("        for (var tb = 0u; tb < units; tb += UT) {".into());
    w("            let tu = min(UT, units - tb);".into());
    w("            if has_rows {".into());
    load(&mut w, "                ", "0u");
    w("            }".into());
    w("            workgroupBarrier();".into());
    // The tile's vec4s, STAGE per invocation at a time: every load issued before any store.
    w("            let n = tu * 16u;".into());
    w("            for (var m0 = 0u; m0 < n; m0 += STAGE * WG) {".into());
    for i in 0..stage {
        w(format!(
            "                let a{i} = x[tb * 16u + min(m0 + lid + {i}u * WG, n - 1u)];"
        ));
    }
    if fuse.rms_norm {
        for i in 0..stage {
            w(format!(
                "                let n{i} = nw[tb * 16u + min(m0 + lid + {i}u * WG, n - 1u)];"
            ));
        }
    }
    for i in 0..stage {
        w(format!("                let v{i} = m0 + lid + {i}u * WG;"));
        w(format!("                if v{i} < n {{"));
        w(format!("                    let ul = v{i} / 16u;"));
        let val = if fuse.rms_norm {
            format!("(a{i} * rinv) * n{i}")
        } else {
            format!("a{i}")
        };
        w(format!(
            "                    xs[ul * 16u + ((v{i} & 15u) ^ (ul & 15u))] = {val};"
        ));
        w("                }".into());
    }
    w("            }".into());
    w("            workgroupBarrier();".into());
    w("            if has_rows {".into());
    w("                for (var c = 0u; c < tu; c += s * P) {".into());
    for r in rows.clone() {
        w(format!("                    let cd{r} = d{r};"));
        for j in units.clone() {
            w(format!("                    let cw{r}_{j} = w{r}_{j};"));
        }
    }
    w("                    if c + s * P < tu {".into());
    load(&mut w, "                        ", "(c + s * P)");
    w("                    }".into());
    for j in units.clone() {
        w(format!(
            "                    let u{j} = c + lane + {j}u * s;"
        ));
    }
    for j in units.clone() {
        for r in rows.clone() {
            w(format!(
                "                    let e{r}_{j} = subgroupShuffle(cd{r}, lane / 4u + {j}u * quarter);"
            ));
        }
        w(format!("                    if u{j} < tu {{"));
        w(format!("                        let xi = u{j} * 16u;"));
        w(format!("                        let sw = u{j} & 15u;"));
        for k in 0..16 {
            w(format!(
                "                        let x{k} = xs[xi + ({k}u ^ sw)];"
            ));
        }
        w(
            "                        let s4 = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))"
                .into(),
        );
        w("                            + (((x8 + x9) + (x10 + x11)) + ((x12 + x13) + (x14 + x15)));".into());
        w("                        let sx = (s4.x + s4.y) + (s4.z + s4.w);".into());
        for r in rows.clone() {
            w(format!(
                "                        acc{r} += e{r}_{j} * (unit_dot(cw{r}_{j}, x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15) - sx);"
            ));
        }
        w("                    }".into());
    }
    w("                }".into());
    w("            }".into());
    w("        }".into());
    w("        if has_rows {".into());
    rows_store(&mut w, rs, fuse.swiglu, false, "            ");
    w("        }".into());
    w("    }".into());
    w("}".into());
    m
}

/// The entry point of the int8-activation kernel (`shaders/ternary_matvec_q8.wgsl`), unrolled
/// over `rs` rows and `p` units per chunk: the workgroup quantizes x (with `fuse.rms_norm`,
/// x normalized first, as the `_rms` subgroup-rows kernel does) into workgroup memory, then its
/// subgroups take the rows `rs` at a time as `rows_main` does. With `fuse.swiglu` each pass
/// also takes the up rows `row + params.rows` and stores `silu(gate) * up`. With `pre`, the
/// [`MatvecKernel::Q8Pre`] product: no quantization (x is already int8 in the layout of
/// `shaders/ternary_matvec_q8g.wgsl`, read from binding 2), the same passes and unit terms.
///
/// A [`MatvecKernel::Q8Pre`] product (`pre`) may read x per 16-element group (`x16`) and/or
/// write its outputs so (`y16`; [`Q16_LAYOUT`]).
fn q8_main(rs: u32, p: u32, fuse: Fuse, pre: bool, scales4: bool, x16: bool, y16: bool) -> String {
    use std::fmt::Write;
    let mut m = String::new();
    // `writeln!` into a String cannot fail.
    let mut w = |line: String| {
        let _ = writeln!(m, "{line}");
    };
    // With x quantized before the product a norm is applied at the end (`rms_late`).
    let late = pre && fuse.rms_norm;
    if fuse.rms_norm && !late {
        rms_decls(&mut w);
    }
    w(String::new());
    w("@compute @workgroup_size(WG)".into());
    w("fn main(".into());
    w("    @builtin(workgroup_id) wid: vec3<u32>,".into());
    w("    @builtin(local_invocation_index) lid: u32,".into());
    w("    @builtin(subgroup_id) sg: u32,".into());
    w("    @builtin(subgroup_invocation_id) lane: u32,".into());
    w("    @builtin(subgroup_size) sg_size: u32,".into());
    w("    @builtin(num_subgroups) nsg: u32,".into());
    w(") {".into());
    w("    let row_base = (wid.y * params.groups_x + wid.x) * ROWS;".into());
    w(
        "    // The same for the whole workgroup: no barrier is skipped by some invocations only."
            .into(),
    );
    w("    if row_base >= params.rows {".into());
    w("        return;".into());
    w("    }".into());
    w("    let s = min(sg_size, WG);".into());
    w("    let units = params.cols / 64u;".into());
    w("    let blocks = params.cols / 256u;".into());
    w("    let groups = params.cols / 16u;".into());
    w("    let last = params.rows - 1u;".into());
    if late {
        rms_late_loads(&mut w);
    } else if fuse.rms_norm {
        rms_scale(&mut w);
    }
    if !pre {
        q8_stage(&mut w, fuse.rms_norm);
    }
    if y16 {
        w(
            "    // Passes over the workgroup's rows (a subgroup may stop early; every one reaches"
                .into(),
        );
        w("    // the epilogue's barrier after them).".into());
    } else {
        w(
            "    // Passes over the workgroup's rows (no barrier below: a subgroup may stop early)."
                .into(),
        );
    }
    q8_passes(&mut w, rs, p, fuse, pre, scales4, x16);
    if y16 {
        y16_epilogue(&mut w);
    }
    w("}".into());
    m
}

/// The end of a `_y16` product ([`Q16_LAYOUT`]): after every pass has stored its rows into
/// `yq` (`store_y`), invocation i quantizes the workgroup's group i of 16 rows as the
/// quantize kernels quantize a group (`da = max|y| / 127`, a NaN as the largest; `q =
/// quant4(y * (1 / da))`) and stores its words, `da` and `da * sum q` at binding 3.
fn y16_epilogue(w: &mut dyn FnMut(String)) {
    w("    // The workgroup's rows as groups of 16, quantized (Q16_LAYOUT in mod.rs).".into());
    w("    workgroupBarrier();".into());
    w("    if lid < ROWS / 16u && row_base + 16u * lid < params.rows {".into());
    w("        let g = row_base / 16u + lid;".into());
    for i in 0..4 {
        let b = 4 * i;
        w(format!(
            "        let a{i} = vec4<f32>(yq[16u * lid + {b}u], yq[16u * lid + {}u], yq[16u * lid + {}u], yq[16u * lid + {}u]);",
            b + 1,
            b + 2,
            b + 3
        ));
    }
    w("        let m4 = max(max(abs(a0), abs(a1)), max(abs(a2), abs(a3)));".into());
    w("        let nan = any(nan4(a0) | nan4(a1) | nan4(a2) | nan4(a3));".into());
    w("        let mb = select(bitcast<u32>(max(max(m4.x, m4.y), max(m4.z, m4.w))), 0x7fc00000u, nan);".into());
    w("        let amax = bitcast<f32>(mb);".into());
    q8_scale(w, "        ");
    q8_quant4(w, "        ");
    for (k, c) in ["x", "y", "z", "w"].iter().enumerate() {
        w(format!(
            "        y[4u * g + {k}u] = pack4xI8(vec4<i32>(q0.{c}, q1.{c}, q2.{c}, q3.{c}));"
        ));
    }
    w("        let t = (q0 + q1) + (q2 + q3);".into());
    w("        let sq = (t.x + t.y) + (t.z + t.w);".into());
    w("        let mu = params.rows / 16u + 2u * (g / 4u);".into());
    w("        y[4u * mu + (g & 3u)] = bitcast<u32>(d);".into());
    w("        y[4u * mu + 4u + (g & 3u)] = bitcast<u32>(d * f32(sq));".into());
    w("    }".into());
}

/// [`q8_body`] for a `_y16` product: y (binding 3) as `array<u32>` ([`Q16_LAYOUT`]) and
/// `store_y` writing the row's sum into workgroup memory for [`y16_epilogue`].
fn q8_body_y16(body: String, y16: bool) -> String {
    if !y16 {
        return body;
    }
    const Y: &str = "@group(0) @binding(3) var<storage, read_write> y: array<f32>;";
    const STORE: &str = "fn store_y(i: u32, sum: f32) {\n    if params.accumulate == 1u {\n        y[i] = y[i] + sum * params.scale;\n    } else {\n        y[i] = sum;\n    }\n}";
    debug_assert!(body.contains(Y) && body.contains(STORE));
    body.replace(
        Y,
        "// x of the next product per 16-element group (Q16_LAYOUT in mod.rs), and this\n// workgroup's rows until they are quantized.\n@group(0) @binding(3) var<storage, read_write> y: array<u32>;\nvar<workgroup> yq: array<f32, ROWS>;",
    )
    .replace(STORE, "fn store_y(i: u32, sum: f32) {\n    yq[i % ROWS] = sum;\n}")
}

/// The entry point of the whole-workgroup [`MatvecKernel::Q8Pre`] product
/// (`whole_workgroup`): the workgroup's rows `rs` at a time (with `swiglu` each output row's
/// gate and up rows), every invocation on each pass, invocation `lid` streaming units `lid,
/// lid + WG, ...` in chunks of `p` per invocation; each accumulator added by `subgroupAdd`,
/// one partial per subgroup into workgroup memory, and invocation 0 adding the partials in
/// subgroup order. The loops are the same for the whole workgroup, so every invocation
/// reaches every barrier.
fn q8_main_wg(rs: u32, p: u32, swiglu: bool, scales4: bool, late: bool, x16: bool) -> String {
    use std::fmt::Write;
    let mut m = String::new();
    let mut w = |line: String| {
        let _ = writeln!(m, "{line}");
    };
    let nr = if swiglu { 2 * rs } else { rs };
    w(String::new());
    w("// One partial per subgroup (at least 4 invocations each) and accumulator.".into());
    w(format!("const NR: u32 = {nr}u;"));
    w("var<workgroup> part: array<f32, (WG / 4u) * NR>;".into());
    w(String::new());
    w("@compute @workgroup_size(WG)".into());
    w("fn main(".into());
    w("    @builtin(workgroup_id) wid: vec3<u32>,".into());
    w("    @builtin(local_invocation_index) lid: u32,".into());
    w("    @builtin(subgroup_id) sg: u32,".into());
    w("    @builtin(subgroup_invocation_id) lane: u32,".into());
    w("    @builtin(num_subgroups) nsg: u32,".into());
    w(") {".into());
    w("    let row_base = (wid.y * params.groups_x + wid.x) * ROWS;".into());
    w("    if row_base >= params.rows {".into());
    w("        return;".into());
    w("    }".into());
    w("    let units = params.cols / 64u;".into());
    w("    let blocks = params.cols / 256u;".into());
    w("    let groups = params.cols / 16u;".into());
    w("    let last = params.rows - 1u;".into());
    if late {
        rms_late_loads(&mut w);
    }
    w("    // row_base is the workgroup's: every invocation runs the same passes.".into());
    w("    for (var g = 0u; g < ROWS; g += RS) {".into());
    w("        let r0 = row_base + g;".into());
    w("        if r0 >= params.rows {".into());
    w("            break;".into());
    w("        }".into());
    w("        // Rows past the end read the last row; their sums are never stored.".into());
    for r in 0..nr {
        if r < rs {
            w(format!("        let row{r} = min(r0 + {r}u, last);"));
        } else {
            w(format!("        let row{r} = row{} + params.rows;", r - rs));
        }
        w(format!("        var acc{r} = 0.0;"));
    }
    w("        for (var c = 0u; c < units; c += WG * P) {".into());
    w("            // Every code and scale load of the chunk before any arithmetic.".into());
    for j in 0..p {
        w(format!("            let u{j} = c + lid + {j}u * WG;"));
        w(format!("            let v{j} = min(u{j}, units - 1u);"));
    }
    for j in 0..p {
        for r in 0..nr {
            w(format!(
                "            let w{r}_{j} = codes[row{r} * units + v{j}];"
            ));
        }
    }
    q8_scale_loads(&mut w, rs, p, swiglu, scales4);
    for j in 0..p {
        w(format!("            if u{j} < units {{"));
        w(format!("                let xi = 4u * u{j};"));
        if x16 {
            q16_unit(&mut w, j, 0..nr);
            w("            }".into());
            continue;
        }
        q8_x_loads(&mut w);
        w(format!("                let m = x[groups + u{j} / 2u];"));
        w(format!(
            "                let sq = bitcast<i32>(select(m.x, m.z, (u{j} & 1u) == 1u));"
        ));
        w("                let dx = bitcast<f32>(m.y);".into());
        for r in 0..nr {
            w(format!(
                "                acc{r} += (e{r}_{j} * dx) * f32(unit_dot(w{r}_{j}, xa, xb, xc, xd) - sq);"
            ));
        }
        w("            }".into());
    }
    w("        }".into());
    for r in 0..nr {
        w(format!("        let s{r} = subgroupAdd(acc{r});"));
    }
    w("        if lane == 0u {".into());
    for r in 0..nr {
        w(format!("            part[sg * NR + {r}u] = s{r};"));
    }
    w("        }".into());
    w("        workgroupBarrier();".into());
    w("        if lid == 0u {".into());
    for r in 0..nr {
        w(format!("            var t{r} = part[{r}u];"));
    }
    w("            for (var i = 1u; i < nsg; i++) {".into());
    for r in 0..nr {
        w(format!("                t{r} += part[i * NR + {r}u];"));
    }
    w("            }".into());
    if late {
        rms_late_rinv(&mut w, "            ");
        for r in 0..nr {
            w(format!("            t{r} *= rinv;"));
        }
    }
    for r in 0..rs {
        let v = if swiglu {
            let u = r + rs;
            format!("(t{r} / (1.0 + exp(-t{r}))) * t{u}")
        } else {
            format!("t{r}")
        };
        if r == 0 {
            w(format!("            store_y(r0, {v});"));
        } else {
            w(format!("            if r0 + {r}u < params.rows {{"));
            w(format!("                store_y(r0 + {r}u, {v});"));
            w("            }".into());
        }
    }
    w("        }".into());
    w("        // part is rewritten by the next pass.".into());
    w("        workgroupBarrier();".into());
    w("    }".into());
    w("}".into());
    m
}

/// The block scale `e{r}_{j}` of each row `r` of a pass and unit `j` of a chunk (rows `rs`,
/// with `swiglu` also their up rows `rs..2 rs`), every load before any arithmetic. f16
/// (`scale_at`) one per unit and row; with `scales4` ([`scales4`]) one `vec4<f32>` load for
/// each set of rows in one group of four: the pass's first `rs` rows when `rs` divides 4
/// (a pass starts at a multiple of `rs`, and rows past the end read the last row, so they
/// never leave the group), a row outside its set's group (the up rows of a weight whose
/// half is not a multiple of 4, or `rs` not dividing 4) loading its own.
fn q8_scale_loads(w: &mut dyn FnMut(String), rs: u32, p: u32, swiglu: bool, scales4: bool) {
    let nr = if swiglu { 2 * rs } else { rs };
    for j in 0..p {
        if !scales4 {
            for r in 0..nr {
                w(format!(
                    "            let e{r}_{j} = scale_at(row{r} * blocks + v{j} / 4u);"
                ));
            }
            continue;
        }
        let sets: Vec<(u32, u32)> = if swiglu {
            vec![(0, rs), (rs, 2 * rs)]
        } else {
            vec![(0, rs)]
        };
        for (first, end) in sets {
            w(format!(
                "            let sv{first}_{j} = scales[(row{first} / 4u) * blocks + v{j} / 4u];"
            ));
            for r in first..end {
                let same_group = first == 0 && 4 % rs == 0;
                if r == first || same_group {
                    w(format!(
                        "            let e{r}_{j} = sv{first}_{j}[row{r} % 4u];"
                    ));
                } else {
                    w(format!(
                        "            var e{r}_{j} = sv{first}_{j}[row{r} % 4u];"
                    ));
                    w(format!("            if row{r} / 4u != row{first} / 4u {{"));
                    w(format!(
                        "                e{r}_{j} = scales[(row{r} / 4u) * blocks + v{j} / 4u][row{r} % 4u];"
                    ));
                    w("            }".into());
                }
            }
        }
    }
}

/// `shaders/ternary_matvec_q8_body.wgsl` for a [`MatvecKernel::Q8Pre`] product: as written
/// (f16 block scales, `scale_at`), or with `scales4` binding 1 as `array<vec4<f32>>`
/// ([`scales4`]) and no `scale_at`.
fn q8_body(scales4: bool) -> String {
    if !scales4 {
        return TERNARY_MATVEC_Q8_BODY_WGSL.to_string();
    }
    const F16: &str = "@group(0) @binding(1) var<storage, read> scales: array<u32>;";
    const AT: &str = "// The f16 scale at flat index i of the scales array.\nfn scale_at(i: u32) -> f32 {\n    let w = scales[i >> 1u];\n    return f16_bits_to_f32((w >> ((i & 1u) * 16u)) & 0xffffu);\n}\n";
    debug_assert!(
        TERNARY_MATVEC_Q8_BODY_WGSL.contains(F16) && TERNARY_MATVEC_Q8_BODY_WGSL.contains(AT)
    );
    TERNARY_MATVEC_Q8_BODY_WGSL
        .replace(
            F16,
            "// With f32 block scales (the host's scales4): group g of four rows, block b at\n// g * K/256 + b, row 4g + i in component i.\n@group(0) @binding(1) var<storage, read> scales: array<vec4<f32>>;",
        )
        .replace(AT, "")
}

/// The loads of a [`MatvecKernel::Q8Pre`] product with its RMSNorm applied at the end
/// (`rms_late`): the sums of `x^2` the quantize dispatch's workgroups wrote after x's unit
/// terms (one `vec4` each, the sum in `.x`; at most [`MAX_Q8_COLS`] / 4096 of them), all
/// issued before the product's loop (no loop of loads: nothing waits on them until
/// [`rms_late_rinv`] adds them up after it).
fn rms_late_loads(w: &mut dyn FnMut(String)) {
    let per = Q8_QUANTIZE_WG * 16;
    w("    // The quantize workgroups' sums of x^2, loaded now and added after the loop.".into());
    w(format!(
        "    let nsums = (params.cols + {}u) / {per}u;",
        per - 1
    ));
    w("    let sbase = params.cols / 16u + params.cols / 128u;".into());
    for i in 0..MAX_Q8_COLS / per {
        w(format!(
            "    let ps{i} = bitcast<f32>(x[sbase + min({i}u, nsums - 1u)].x);"
        ));
    }
}

/// `rinv = 1 / sqrt(mean(x^2) + eps)` from [`rms_late_loads`]' sums, added in workgroup
/// order (each line indented by `ind`).
fn rms_late_rinv(w: &mut dyn FnMut(String), ind: &str) {
    let per = Q8_QUANTIZE_WG * 16;
    w(format!("{ind}var total = ps0;"));
    for i in 1..MAX_Q8_COLS / per {
        w(format!("{ind}total += select(0.0, ps{i}, {i}u < nsums);"));
    }
    w(format!(
        "{ind}let rinv = 1.0 / sqrt(total / f32(params.cols) + params.eps);"
    ));
}

/// The per-workgroup quantization of x into workgroup memory ([`MatvecKernel::Q8`]), ending
/// with a barrier.
fn q8_stage(w: &mut dyn FnMut(String), rms: bool) {
    w("    for (var i = lid; i < blocks; i += WG) {".into());
    w("        atomicStore(&bmax[i], 0u);".into());
    w("    }".into());
    w("    for (var i = lid; i < units; i += WG) {".into());
    w("        atomicStore(&usum[i], 0);".into());
    w("    }".into());
    w("    workgroupBarrier();".into());
    w("    // Each block's max |x| (16 invocations per block).".into());
    w("    for (var g = lid; g < groups; g += WG) {".into());
    q8_load16(w, "        ", rms);
    q8_group_max(w, "        ", "g / 16u");
    w("    }".into());
    w("    workgroupBarrier();".into());
    w("    // q = round(x / da), four words per group, and the unit sums of q.".into());
    w("    for (var g = lid; g < groups; g += WG) {".into());
    q8_load16(w, "        ", rms);
    q8_quantize_group(w, "        ", "g / 16u");
    q8_quant4(w, "        ");
    q8_pack_group(w, "        ", "xq_index(g)", "g / 4u");
    w("        if (g & 15u) == 0u {".into());
    w("            bd[g / 16u] = d;".into());
    w("        }".into());
    w("    }".into());
    w("    workgroupBarrier();".into());
}

/// The subgroup passes over the workgroup's rows of the int8 decode products, each unit's x
/// from workgroup memory or (`pre`) from binding 2.
fn q8_passes(
    w: &mut dyn FnMut(String),
    rs: u32,
    p: u32,
    fuse: Fuse,
    pre: bool,
    scales4: bool,
    x16: bool,
) {
    let nr = if fuse.swiglu { 2 * rs } else { rs };
    let rows = 0..nr;
    let units = 0..p;
    w("    for (var g = sg * RS; g < ROWS; g += nsg * RS) {".into());
    w("        let r0 = row_base + g;".into());
    w("        if r0 >= params.rows {".into());
    w("            break;".into());
    w("        }".into());
    w("        // Rows past the end read the last row; their sums are never stored.".into());
    for r in rows.clone() {
        if r < rs {
            w(format!("        let row{r} = min(r0 + {r}u, last);"));
        } else {
            w(format!("        let row{r} = row{} + params.rows;", r - rs));
        }
        w(format!("        var acc{r} = 0.0;"));
    }
    w("        for (var c = 0u; c < units; c += s * P) {".into());
    w("            // Every code and scale load of the chunk before any arithmetic.".into());
    for j in units.clone() {
        w(format!("            let u{j} = c + lane + {j}u * s;"));
        w(format!("            let v{j} = min(u{j}, units - 1u);"));
    }
    for j in units.clone() {
        for r in rows.clone() {
            w(format!(
                "            let w{r}_{j} = codes[row{r} * units + v{j}];"
            ));
        }
    }
    q8_scale_loads(w, rs, p, fuse.swiglu, scales4);
    for j in units.clone() {
        w(format!("            if u{j} < units {{"));
        w(format!("                let xi = 4u * u{j};"));
        if x16 {
            q16_unit(w, j, rows.clone());
            w("            }".into());
            continue;
        }
        if pre {
            q8_x_loads(w);
            w(format!("                let m = x[groups + u{j} / 2u];"));
            w(format!(
                "                let sq = bitcast<i32>(select(m.x, m.z, (u{j} & 1u) == 1u));"
            ));
            w("                let dx = bitcast<f32>(m.y);".into());
        } else {
            w(format!("                let sw = (u{j} >> 1u) & 3u;"));
            w("                let xa = xq[xi + sw];".into());
            w("                let xb = xq[xi + (1u ^ sw)];".into());
            w("                let xc = xq[xi + (2u ^ sw)];".into());
            w("                let xd = xq[xi + (3u ^ sw)];".into());
            w(format!("                let sq = atomicLoad(&usum[u{j}]);"));
            w(format!("                let dx = bd[u{j} / 4u];"));
        }
        for r in rows.clone() {
            w(format!(
                "                acc{r} += (e{r}_{j} * dx) * f32(unit_dot(w{r}_{j}, xa, xb, xc, xd) - sq);"
            ));
        }
        w("            }".into());
    }
    w("        }".into());
    if pre && fuse.rms_norm {
        rms_late_rinv(w, "        ");
    }
    rows_store(w, rs, fuse.swiglu, pre && fuse.rms_norm, "        ");
    w("    }".into());
}

/// A unit's four 16-element groups of int8 x, `xa..xd` (binding 2 from `vec4` index `xi`),
/// inside the unit's `if` of the int8 decode products' loops.
fn q8_x_loads(w: &mut dyn FnMut(String)) {
    w("                let xa = x[xi];".into());
    w("                let xb = x[xi + 1u];".into());
    w("                let xc = x[xi + 2u];".into());
    w("                let xd = x[xi + 3u];".into());
}

/// Unit `j`'s terms of `rows` from x per 16-element group ([`Q16_LAYOUT`]), inside the
/// unit's `if` (`xi` its first group).
fn q16_unit(w: &mut dyn FnMut(String), j: u32, rows: std::ops::Range<u32>) {
    q8_x_loads(w);
    w(format!(
        "                let dv = bitcast<vec4<f32>>(x[groups + 2u * u{j}]);"
    ));
    w(format!(
        "                let cv = bitcast<vec4<f32>>(x[groups + 2u * u{j} + 1u]);"
    ));
    w("                let cu = (cv.x + cv.y) + (cv.z + cv.w);".into());
    for r in rows {
        let wr = format!("w{r}_{j}");
        w(format!(
            "                acc{r} += e{r}_{j} * (((dv.x * f32(word_dot({wr}.x, xa)) + dv.y * f32(word_dot({wr}.y, xb))) + (dv.z * f32(word_dot({wr}.z, xc)) + dv.w * f32(word_dot({wr}.w, xd)))) - cu);"
        ));
    }
}

/// The entry point of the subgroup-rows kernel, unrolled over `rs` rows and `p` units per
/// chunk (every per-row and per-unit value a named variable, so none is an indexed array).
fn rows_main(rs: u32, p: u32) -> String {
    use std::fmt::Write;
    let mut m = String::new();
    let rows = 0..rs;
    let units = 0..p;
    // `writeln!` into a String cannot fail.
    let mut w = |line: String| {
        let _ = writeln!(m, "{line}");
    };
    w("@compute @workgroup_size(WG)".into());
    w("fn main(".into());
    w("    @builtin(workgroup_id) wid: vec3<u32>,".into());
    w("    @builtin(subgroup_id) sg: u32,".into());
    w("    @builtin(subgroup_invocation_id) lane: u32,".into());
    w("    @builtin(subgroup_size) sg_size: u32,".into());
    w("    @builtin(num_subgroups) nsg: u32,".into());
    w(") {".into());
    w("    let row_base = (wid.y * params.groups_x + wid.x) * ROWS;".into());
    w("    if row_base >= params.rows {".into());
    w("        return;".into());
    w("    }".into());
    w("    // Lanes of a subgroup (a workgroup smaller than the subgroup is one partial subgroup).".into());
    w("    let s = min(sg_size, WG);".into());
    w("    let units = params.cols / 64u;".into());
    w("    let blocks = params.cols / 256u;".into());
    w("    let last = params.rows - 1u;".into());
    w("    let quarter = s / 4u;".into());
    w("    for (var g = sg * RS; g < ROWS; g += nsg * RS) {".into());
    w("        let r0 = row_base + g;".into());
    w("        if r0 >= params.rows {".into());
    w("            break;".into());
    w("        }".into());
    w("        // Rows past the end read the last row; their sums are never stored.".into());
    for r in rows.clone() {
        w(format!("        let row{r} = min(r0 + {r}u, last);"));
        w(format!("        var acc{r} = 0.0;"));
    }
    w("        for (var c = 0u; c < units; c += s * P) {".into());
    w("            // Block c/4 + lane's scale per row (this chunk's P*s/4 blocks).".into());
    w("            let b = min(c / 4u + lane, blocks - 1u);".into());
    for r in rows.clone() {
        w(format!(
            "            let d{r} = scale_at(row{r} * blocks + b);"
        ));
    }
    w("            // Every code load of the chunk before any arithmetic (clamped at the row's end).".into());
    for j in units.clone() {
        w(format!("            let u{j} = c + lane + {j}u * s;"));
        w(format!("            let v{j} = min(u{j}, units - 1u);"));
    }
    for j in units.clone() {
        for r in rows.clone() {
            w(format!(
                "            let w{r}_{j} = codes[row{r} * units + v{j}];"
            ));
        }
    }
    for j in units.clone() {
        w(format!(
            "            // Unit {j}: block c/4 + (lane + {j}s)/4, held by lane lane/4 + {j}s/4."
        ));
        for r in rows.clone() {
            w(format!(
                "            let e{r}_{j} = subgroupShuffle(d{r}, lane / 4u + {j}u * quarter);"
            ));
        }
        w(format!("            if u{j} < units {{"));
        w(format!("                let xi = u{j} * 16u;"));
        for k in 0..16 {
            w(format!("                let x{k} = x[xi + {k}u];"));
        }
        w("                let s4 = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))".into());
        w(
            "                    + (((x8 + x9) + (x10 + x11)) + ((x12 + x13) + (x14 + x15)));"
                .into(),
        );
        w("                let sx = (s4.x + s4.y) + (s4.z + s4.w);".into());
        for r in rows.clone() {
            w(format!(
                "                acc{r} += e{r}_{j} * (unit_dot(w{r}_{j}, x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15) - sx);"
            ));
        }
        w("            }".into());
    }
    w("        }".into());
    rows_store(&mut w, rs, false, false, "        ");
    w("    }".into());
    w("}".into());
    m
}

/// The ternary matvec configuration of one token (decode) for `reduction`:
/// [`Reduction::Subgroup`] gives the subgroup-rows kernel `r8_wg128_sgrows2_p2_xs4096` (8
/// rows per workgroup of 128 invocations, 2 rows per subgroup pass, 2 units in flight, x staged
/// 4096 elements at a time in 16 KB of workgroup memory: the fastest over the 8B model's
/// decode shapes on an NVIDIA H200, BENCHMARKS.md), [`Reduction::Workgroup`] the split kernel
/// with 4 rows per workgroup of 64 invocations.
pub fn decode_matvec_config(reduction: Reduction) -> MatvecConfig {
    match reduction {
        Reduction::Subgroup => MatvecConfig::subgroup_rows_tiled(8, 128, 2, 2, 4096),
        Reduction::Workgroup => MatvecConfig::split(4, 64, Reduction::Workgroup),
    }
}

/// The subgroup-rows split's rules (both kernels): `rs` rows per subgroup pass dividing the
/// `r` rows per workgroup, `p` units in flight, subgroup reductions.
fn check_rows_split(r: u32, rs: u32, p: u32, reduction: Reduction) -> Result<(), GpuError> {
    const OP: &str = "ternary matvec";
    if rs == 0 || rs > MAX_ROWS_PER_SUBGROUP || !r.is_multiple_of(rs) {
        return Err(GpuError::Shape {
            op: OP,
            detail: format!(
                "rows per subgroup {rs}: must be 1..={MAX_ROWS_PER_SUBGROUP} and divide the rows per workgroup {r}"
            ),
        });
    }
    if ![1, 2, 4].contains(&p) {
        return Err(GpuError::Shape {
            op: OP,
            detail: format!("units in flight {p}: must be 1, 2 or 4"),
        });
    }
    if reduction != Reduction::Subgroup {
        return Err(GpuError::Shape {
            op: OP,
            detail: "the subgroup-rows kernels add with subgroups only".into(),
        });
    }
    Ok(())
}

/// The size of `adapter`'s largest device-local memory heap on Vulkan
/// (`vkGetPhysicalDeviceMemoryProperties`, through wgpu-hal); `None` on other backends, which
/// wgpu gives no memory figure for.
#[cfg(not(target_vendor = "apple"))]
fn device_local_heap(adapter: &wgpu::Adapter) -> Option<u64> {
    // VK_MEMORY_HEAP_DEVICE_LOCAL_BIT.
    const DEVICE_LOCAL: u32 = 0x1;
    // SAFETY: the adapter's raw Vulkan handles are only read, for the call's duration, while
    // `adapter` (which owns them) is alive; the query has no other requirement.
    unsafe {
        let hal = adapter.as_hal::<wgpu::hal::api::Vulkan>()?;
        let instance = hal.shared_instance().raw_instance();
        let props = instance.get_physical_device_memory_properties(hal.raw_physical_device());
        props
            .memory_heaps_as_slice()
            .iter()
            .filter(|h| h.flags.as_raw() & DEVICE_LOCAL != 0)
            .map(|h| h.size)
            .max()
    }
}

/// On Apple platforms wgpu has no Vulkan backend (Metal only): no memory figure.
#[cfg(target_vendor = "apple")]
fn device_local_heap(_adapter: &wgpu::Adapter) -> Option<u64> {
    None
}

/// The widths of x the int8 decode kernels are built for ([`MatvecKernel::Q8`]'s `max_cols`;
/// the workgroup memory a kernel holds grows with it).
pub const Q8_COLS: [u32; 3] = [4096, 16384, 32768];

/// The int8-activation decode configuration for a product of `rows` weight rows and `cols`
/// columns (`swiglu`: a stacked gate/up weight whose SwiGLU is folded in), built for the
/// smallest of [`Q8_COLS`] that holds `cols`; `None` past the largest. From a sweep at the 8B
/// model's shapes and decode profiles on an NVIDIA H200 (BENCHMARKS.md): 32 rows per
/// workgroup of 256 invocations, 4 rows per subgroup pass, 1 unit in flight; 64 rows per
/// workgroup of 512, 2 rows per pass, 2 units in flight, for 16,384 rows or more; SwiGLU 32
/// output rows per workgroup of 256, 2 per pass (each with its up row), 2 units in flight
/// (28 us per layer against 33 for the 512-invocation form of the plain kernel's best).
pub fn decode_q8_config(rows: usize, cols: usize, swiglu: bool) -> Option<MatvecConfig> {
    let k = *Q8_COLS.iter().find(|&&k| cols <= k as usize)?;
    Some(if swiglu {
        MatvecConfig::q8(32, 256, 2, 2, k)
    } else if rows >= 16384 {
        MatvecConfig::q8(64, 512, 2, 2, k)
    } else {
        MatvecConfig::q8(32, 256, 4, 1, k)
    })
}

/// The [`MatvecKernel::Q8Pre`] decode configuration for a product of `rows` weight rows and
/// any K up to [`MAX_Q8_COLS`] (`swiglu`: a stacked gate/up weight whose SwiGLU is folded
/// in), or `None` where the per-workgroup quantization ([`decode_q8_config`]) is to be used:
/// 16 (output) rows per workgroup of 128 invocations, 4 per subgroup pass, 1 unit in flight,
/// for every product but those of K >= [`Q8_WHOLE_WORKGROUP_COLS`] without SwiGLU, which take
/// 4 rows per workgroup of 128 invocations, all of them on each row, 1 unit in flight
/// ([`MatvecKernel::Q8Pre`]'s `whole_workgroup`); both read the block scales as f32 in groups
/// of four rows ([`scales4`]: with 4 rows a pass, one 16-byte load for all four). Before
/// them, every product took 8 rows per workgroup, 2 per pass, 2 units in flight and the f16
/// scales ([`q8_pre_subgroup_rows`]). From run 1 and 2 of
/// benches/gpu/results-2026-12-03d on an NVIDIA H200 (BENCHMARKS.md): with its quantize
/// dispatch, a chain of subgroup-rows products took 9.5, 9.3 and 17.6 us for Q/K/V, output
/// and down against 10.0, 12.3 and 20.8 us with the per-workgroup quantization (gate/up with
/// SwiGLU 19.6 against 19.3 us), and the 8B model's decode step 3071 us with it in all four
/// products, 3114 us without it in gate/up, 3288 us without it; from runs 1-3 of
/// benches/gpu/results-2026-12-04: the down product (4096 x 16384) alone in a chain 14.2 us
/// with subgroup rows, 11.7 us with the whole workgroup on 4 rows, 8.8 us with that and the
/// f32 scales, 1 unit in flight; Q/K/V and output (K = 4096) 6.08 and 5.84 us before, 5.74
/// and 5.49 us with 4 rows a pass and the f32 scales (the whole workgroup is slower there);
/// gate/up with SwiGLU 16.26 before, 16.18 us so.
/// `LOWBIT_GPU_Q8G` = `PLAIN[,SWIGLU]` ([`MatvecConfig::name`]s after
/// `ternary_matvec_q8g4_`, the f32-scale forms, without `_swiglu`; `none` for either; a name
/// with `_x16`, `_y16` or `_rmsl` is refused) overrides both (a benchmarking knob, read once per process: with built-in kernels, which
/// generate any variant; with a bundle's kernels, a variant the bundle lacks falls back as
/// for an older bundle: its f16-scale form, then `q8g_r8_wg128_sgrows2_p2`, then
/// [`decode_q8_config`]).
pub fn decode_q8_pre_config(rows: usize, cols: usize, swiglu: bool) -> Option<MatvecConfig> {
    let _ = rows;
    type Knob = Option<(Option<MatvecConfig>, Option<MatvecConfig>)>;
    static KNOB: std::sync::OnceLock<Knob> = std::sync::OnceLock::new();
    let knob = KNOB.get_or_init(|| {
        let v = std::env::var("LOWBIT_GPU_Q8G").ok()?;
        let picked: Vec<Option<MatvecConfig>> = v
            .split(',')
            .map(|n| match n.trim() {
                "none" => Some(None),
                // The per-16-group and norm-at-the-end forms pair with a particular producer
                // or quantize dispatch: not for every product.
                n if ["_x16", "_y16", "_rmsl"].iter().any(|t| n.contains(t)) => None,
                n => MatvecConfig::parse(&format!("q8g4_{n}")).map(Some),
            })
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default();
        match picked[..] {
            [plain] => Some((plain, None)),
            [plain, glu] => Some((plain, glu)),
            _ => {
                eprintln!(
                    "warning: LOWBIT_GPU_Q8G={v} is not one or two q8g configurations: using the default"
                );
                None
            }
        }
    });
    match knob {
        Some((plain, glu)) => {
            if swiglu {
                *glu
            } else {
                *plain
            }
        }
        None => Some(default_q8_pre_config(cols, swiglu)),
    }
}

/// K from which a [`MatvecKernel::Q8Pre`] product without SwiGLU takes the whole-workgroup
/// split ([`decode_q8_pre_config`]).
pub const Q8_WHOLE_WORKGROUP_COLS: usize = 16384;

/// The subgroup-rows [`MatvecKernel::Q8Pre`] product: every product's before the
/// whole-workgroup split, and (with f16 scales) the fallback for a bundle whose kernels
/// predate that split.
pub fn q8_pre_subgroup_rows() -> MatvecConfig {
    MatvecConfig::q8_pre(8, 128, 2, 2)
}

/// [`decode_q8_pre_config`] without the knob: the registry's.
fn default_q8_pre_config(cols: usize, swiglu: bool) -> MatvecConfig {
    if !swiglu && cols >= Q8_WHOLE_WORKGROUP_COLS {
        MatvecConfig::q8_pre_wg(4, 128, 4, 1)
    } else {
        MatvecConfig::q8_pre(16, 128, 4, 1)
    }
}

/// Every int8 decode configuration [`decode_q8_config`] gives, with the fused variants the
/// decode graph uses (the RMSNorm folded into each; SwiGLU into the gate/up one): the kernel
/// registry's list.
pub fn decode_q8_configs() -> Vec<MatvecConfig> {
    let mut v = Vec::new();
    for k in Q8_COLS {
        let k = k as usize;
        for (rows, swiglu) in [(4096, false), (16384, false), (32768, true)] {
            let c = decode_q8_config(rows, k, swiglu).expect("a width of Q8_COLS");
            for rms_norm in [false, true] {
                v.push(c.fused(Fuse { rms_norm, swiglu }));
            }
        }
    }
    // The pre-quantized products (the norm is the quantize kernel's: one name each).
    for (cols, swiglu) in [
        (4096, false),
        (Q8_WHOLE_WORKGROUP_COLS, false),
        (4096, true),
    ] {
        let c = default_q8_pre_config(cols, swiglu).fused(Fuse {
            rms_norm: false,
            swiglu,
        });
        if !v.contains(&c) {
            v.push(c);
        }
        // Gate/up's writing the down product's x per 16-element group (`_y16`; its norm in
        // the quantize dispatch, `_rms`), which the down products read (`_x16`).
        if swiglu {
            v.push(c.with_q16(false, true));
        } else {
            v.push(c.with_q16(true, false));
        }
    }
    v
}

/// How a [`GpuContext`] is set up.
#[derive(Clone, Debug, Default)]
pub struct ContextOptions {
    pub adapter: Option<AdapterSelector>,
    /// A smaller cap than the adapter's on the bytes of one storage binding (tests use it to
    /// force the row-chunked path).
    pub max_binding_bytes: Option<u64>,
    /// Compile the kernels without wgpu's bounds checks on every array access (the host
    /// checks every buffer against the shapes before binding; benchmarks compare both).
    pub unchecked_shaders: bool,
    /// Compile without those checks only the kernels whose source is this binary's own
    /// ([`kernels::all`], byte for byte: code this build is tested with, on buffers the host
    /// checks before binding); any other source (a bundle made by another build) keeps them.
    pub unchecked_builtin: bool,
    /// The WGSL modules to compile from, by name (a bundle's, after its hash checks); `None`:
    /// the ones built into this binary ([`kernels::all`]).
    pub sources: Option<HashMap<String, String>>,
    /// Use the workgroup-memory reduction in the weight kernels even where the adapter has
    /// subgroups ([`GpuContext::weight_reduction`]; tests run both paths).
    pub force_workgroup_reduction: bool,
    /// Run the ternary products with int8 activations (`--kernel int8`): decode with
    /// [`MatvecKernel::Q8`], prefill chunks with the int8 prefill product
    /// ([`weights::mmq_name`]), where the adapter has subgroups and the sources have the kernel; else (and
    /// when false) with f32 activations.
    pub int8: bool,
}

/// The ternary matvec's bind group layout: codes, scales, x (read-only storage), y (storage),
/// params (uniform), each with its smallest size.
fn ternary_layout(device: &wgpu::Device) -> wgpu::BindGroupLayout {
    let storage = |binding: u32, read_only: bool, min: u64| wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset: false,
            min_binding_size: std::num::NonZeroU64::new(min),
        },
        count: None,
    };
    device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some("ternary_matvec"),
        entries: &[
            storage(0, true, 16),
            // 16: the f32 scales of the int8 decode products are vec4s (scales4).
            storage(1, true, 16),
            storage(2, true, 16),
            storage(3, false, 4),
            // The folded RMSNorm's weight (a placeholder where the kernel has none).
            storage(5, true, 16),
            wgpu::BindGroupLayoutEntry {
                binding: 4,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Uniform,
                    has_dynamic_offset: false,
                    min_binding_size: std::num::NonZeroU64::new(32),
                },
                count: None,
            },
        ],
    })
}

/// A device, its queue, and the pipelines built on it (once each, cached by name).
pub struct GpuContext {
    pub info: wgpu::AdapterInfo,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub features: wgpu::Features,
    pub limits: wgpu::Limits,
    /// The adapter's device memory in bytes where the driver says (Vulkan: its largest
    /// device-local heap), with where the figure came from; `None` elsewhere.
    pub device_memory: Option<(u64, &'static str)>,
    /// Bytes one storage binding may hold here (the adapter's, or the options' smaller cap).
    pub max_binding_bytes: u64,
    ternary_layout: wgpu::BindGroupLayout,
    ternary_pipeline_layout: wgpu::PipelineLayout,
    /// 16 bytes bound where a layout has a binding the kernel does not use.
    placeholder: wgpu::Buffer,
    pipelines: Mutex<HashMap<String, wgpu::ComputePipeline>>,
    unchecked_shaders: bool,
    /// [`ContextOptions::unchecked_builtin`].
    unchecked_builtin: bool,
    /// [`ContextOptions::force_workgroup_reduction`].
    force_workgroup_reduction: bool,
    /// [`ContextOptions::int8`].
    int8: bool,
    /// Whether shaders may use unpack2x16float and its kin (wgpu's downlevel flag
    /// SHADER_F16_IN_F32: every adapter but Mesa's llvmpipe without SHADER_F16).
    f16_in_f32: bool,
    /// The WGSL modules this context may compile, by name: [`kernels::all`] by default, a
    /// bundle's `kernels/` when the backend loads one ([`ContextOptions::sources`]).
    sources: HashMap<String, String>,
    /// Whether `sources` are the built-in ones (then variants outside the list may be
    /// generated into `extra`).
    builtin: bool,
    extra: Mutex<HashMap<String, String>>,
    /// The int8 prefill products' quantized activations, per (tokens, K): `xq` and `xs` of
    /// `shaders/weights/q8_quantize.wgsl`, shared by every product of that shape (each
    /// product's quantization pass runs just before it, in order).
    q8_scratch: Mutex<HashMap<(u32, usize), (wgpu::Buffer, wgpu::Buffer)>>,
    /// [`GpuContext::q8_vec_scratch`]'s buffers, by K.
    q8_vec: Mutex<HashMap<usize, wgpu::Buffer>>,
    /// [`GpuContext::q16_vec_scratch`]'s buffers, by K.
    q16_vec: Mutex<HashMap<usize, wgpu::Buffer>>,
    /// [`GpuContext::used_bindings`], by kernel name.
    used_bindings: Mutex<HashMap<String, std::sync::Arc<std::collections::BTreeSet<u32>>>>,
}

impl GpuContext {
    /// Opens the adapter the options pick, with its own limits and the optional features the
    /// kernels use when present (SUBGROUP, TIMESTAMP_QUERY).
    pub fn new(opts: &ContextOptions) -> Result<GpuContext, GpuError> {
        let adapter = select_adapter(opts.adapter.as_ref())?;
        let info = adapter.get_info();
        let device_memory =
            device_local_heap(&adapter).map(|b| (b, "its largest Vulkan device-local memory heap"));
        let wanted = wgpu::Features::SUBGROUP
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::MEMORY_DECORATION_COHERENT;
        let features = adapter.features() & wanted;
        let limits = adapter.limits();
        let f16_in_f32 = adapter
            .get_downlevel_capabilities()
            .flags
            .contains(wgpu::DownlevelFlags::SHADER_F16_IN_F32);
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("lowbit"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::default(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| GpuError::RequestDevice {
            adapter: info.name.clone(),
            detail: e.to_string(),
        })?;
        let mut max_binding_bytes = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        if let Some(cap) = opts.max_binding_bytes {
            max_binding_bytes = max_binding_bytes.min(cap);
        }
        let ternary_layout = ternary_layout(&device);
        let ternary_pipeline_layout =
            device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("ternary_matvec"),
                bind_group_layouts: &[Some(&ternary_layout)],
                immediate_size: 0,
            });
        let placeholder = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("placeholder"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        Ok(GpuContext {
            device_memory,
            placeholder,
            info,
            device,
            queue,
            features,
            limits,
            max_binding_bytes,
            ternary_layout,
            ternary_pipeline_layout,
            pipelines: Mutex::new(HashMap::new()),
            unchecked_shaders: opts.unchecked_shaders,
            unchecked_builtin: opts.unchecked_builtin,
            force_workgroup_reduction: opts.force_workgroup_reduction,
            int8: opts.int8,
            f16_in_f32,
            builtin: opts.sources.is_none(),
            extra: Mutex::new(HashMap::new()),
            q8_scratch: Mutex::new(HashMap::new()),
            q8_vec: Mutex::new(HashMap::new()),
            q16_vec: Mutex::new(HashMap::new()),
            used_bindings: Mutex::new(HashMap::new()),
            sources: match &opts.sources {
                Some(s) => s.clone(),
                None => kernels::all()
                    .into_iter()
                    .map(|k| (k.name, k.wgsl))
                    .collect(),
            },
        })
    }

    /// Whether the device has subgroup operations.
    pub fn has_subgroups(&self) -> bool {
        self.features.contains(wgpu::Features::SUBGROUP)
    }

    /// Whether the subgroup op modules ([`ops::SUBGROUP_OPS`]) run here: the adapter has
    /// subgroups of at least `min_size` invocations and the context does not force the
    /// workgroup path ([`ContextOptions::force_workgroup_reduction`], which tests use to run
    /// the path for adapters without subgroups).
    pub fn subgroup_ops(&self, min_size: u32) -> bool {
        self.has_subgroups()
            && !self.force_workgroup_reduction
            && self.info.subgroup_min_size >= min_size
    }

    /// Whether the decode attention may merge its own splits here
    /// (`op_attention_decode_combine_q8`, [`attention_decode_combine_q8_source`]): the sources
    /// carry it, the adapter is a Vulkan one (its workgroups hand their partials over through
    /// device-scope barriers and atomics, which naga's Metal output gives within a
    /// threadgroup only; DX12 and GL not tried), the device has the `@coherent` decoration
    /// (MEMORY_DECORATION_COHERENT) and a kernel may have its 10 storage bindings. The
    /// backend also needs the decode attention itself to run here ([`Self::subgroup_ops`]).
    pub fn merges_decode_attention(&self) -> bool {
        self.has_source(kernels::ATTENTION_COMBINE_Q8)
            && self.info.backend == wgpu::Backend::Vulkan
            && self
                .features
                .contains(wgpu::Features::MEMORY_DECORATION_COHERENT)
            && self.limits.max_storage_buffers_per_shader_stage >= 10
    }

    /// Whether shaders may convert f16 bits with unpack2x16float here (wgpu's downlevel flag
    /// SHADER_F16_IN_F32; `op_attention_decode` needs it).
    pub fn has_f16_in_f32(&self) -> bool {
        self.f16_in_f32
    }

    /// The tiled prefill attention for `head_dim` (`op_attention_tile_hd{N}`) where it runs
    /// here: a variant for the head dimension, unpack2x16float, workgroup memory for it
    /// ([`ops::attention_tile_shared_bytes`]) and its source carried; `None` otherwise (the
    /// grouped kernels then run prefill).
    pub fn attention_tile(&self, head_dim: usize) -> Option<&'static str> {
        let name = ops::attention_tile_name(head_dim)?;
        (self.f16_in_f32
            && ops::attention_tile_shared_bytes(head_dim)
                <= self.limits.max_compute_workgroup_storage_size as u64
            && self.has_source(name))
        .then_some(name)
    }

    /// Whether the device can time passes with timestamp queries.
    pub fn has_timestamps(&self) -> bool {
        self.features.contains(wgpu::Features::TIMESTAMP_QUERY)
    }

    /// The matvec configuration of one token (decode) here: [`decode_matvec_config`] of
    /// [`GpuContext::weight_reduction`] (the subgroup-rows kernel where the adapter has
    /// subgroups), or the split kernel `r4_wg64` with the same reduction when the adapter
    /// refuses that kernel (workgroup limits) or the context's sources lack it (a bundle that
    /// ships kernels from before it).
    pub fn default_matvec_config(&self) -> MatvecConfig {
        let reduction = self.weight_reduction();
        let cfg = decode_matvec_config(reduction);
        if self.check_config(&cfg).is_ok()
            && (self.builtin || self.sources.contains_key(&cfg.name()))
        {
            cfg
        } else {
            MatvecConfig::split(4, 64, reduction)
        }
    }

    /// The ternary decode configuration for a product of `rows` weight rows and `cols` columns
    /// with `fuse` folded in (`fuse.swiglu`: a stacked gate/up weight): with
    /// [`ContextOptions::int8`], [`decode_q8_pre_config`] fused (x quantized once by its own
    /// dispatch; not with `LOWBIT_GPU_Q8_PRE=0`), else [`decode_q8_config`] fused, where this
    /// adapter and the sources take it; else [`GpuContext::default_matvec_config`] fused, where that is the
    /// subgroup-rows kernel with x staged and the sources have the fused variant; `None` when
    /// no kernel here folds `fuse` in (never for `Fuse::default()`). A bundle whose kernels
    /// predate a variant gets the next one down the list.
    pub fn decode_config(&self, rows: usize, cols: usize, fuse: Fuse) -> Option<MatvecConfig> {
        let usable = |c: &MatvecConfig| self.config_usable(c);
        if self.int8 && !self.force_workgroup_reduction {
            // x quantized once per product unless `LOWBIT_GPU_Q8_PRE=0` (a benchmarking
            // knob: each workgroup quantizes x itself, the former default).
            let pre = std::env::var("LOWBIT_GPU_Q8_PRE").map_or(true, |v| v != "0");
            if pre && cols <= MAX_Q8_COLS as usize && cols.is_multiple_of(256) {
                if let Some(c) = decode_q8_pre_config(rows, cols, fuse.swiglu) {
                    // A norm applied at the end of the product (`rms_late`) only with
                    // `LOWBIT_GPU_RMS_LATE=1` (a measuring knob: an H200 took 50-70 us a step
                    // longer with it; no bundle carries those kernels) and built-in kernels;
                    // else in the quantize dispatch. A bundle made before the f32 scales has
                    // the f16 form; one made before the whole-workgroup split, the
                    // subgroup-rows one.
                    let late = fuse.rms_norm
                        && std::env::var("LOWBIT_GPU_RMS_LATE").is_ok_and(|v| v == "1");
                    let first = late.then(|| c.fused(fuse).with_rms_late());
                    for c in first.into_iter().chain(
                        [
                            c,
                            c.with_f16_scales(),
                            q8_pre_subgroup_rows().with_f16_scales(),
                        ]
                        .map(|c| c.fused(fuse)),
                    ) {
                        if usable(&c) {
                            return Some(c);
                        }
                    }
                }
            }
            if let Some(c) = decode_q8_config(rows, cols, fuse.swiglu) {
                let c = c.fused(fuse);
                if usable(&c) {
                    return Some(c);
                }
            }
        }
        let d = self.default_matvec_config();
        if fuse == Fuse::default() {
            return Some(d);
        }
        let staged = matches!(d.kernel, MatvecKernel::SubgroupRows { x_tile, .. } if x_tile > 0);
        let c = d.fused(fuse);
        (staged && usable(&c)).then_some(c)
    }

    /// Whether `c` runs here: the adapter takes it and the sources carry its kernel and its
    /// quantize dispatch's ([`MatvecConfig::pre_kernel`]).
    pub fn config_usable(&self, c: &MatvecConfig) -> bool {
        self.check_config(c).is_ok()
            && self.has_source(&c.name())
            && c.pre_kernel().is_none_or(|q| self.has_source(q))
    }

    /// Whether the ternary decode products quantize their activations to int8 here (for a
    /// weight of `cols` columns).
    pub fn decodes_int8(&self, cols: usize) -> bool {
        self.decode_config(1, cols, Fuse::default())
            .is_some_and(|c| c.is_int8())
    }

    /// Whether module `name` is among the sources this context compiles from (the built-in
    /// registry also generates variants outside its list).
    pub fn has_source(&self, name: &str) -> bool {
        self.builtin || self.sources.contains_key(name)
    }

    /// The value of `const {constant}: u32 = Nu;` in the carried source of module `name`
    /// (None for the built-in registry, a module not carried, or no such line): what a
    /// bundle's kernel from an earlier release was built with, where the host's choice
    /// depends on it (the decode attention's cluster size).
    pub fn source_constant(&self, name: &str, constant: &str) -> Option<u32> {
        if self.builtin {
            return None;
        }
        let prefix = format!("const {constant}: u32 = ");
        self.sources.get(name)?.lines().find_map(|l| {
            l.trim()
                .strip_prefix(&prefix)?
                .strip_suffix("u;")?
                .parse()
                .ok()
        })
    }

    /// Checks `cfg` against the op's rules and this adapter.
    pub fn check_config(&self, cfg: &MatvecConfig) -> Result<(), GpuError> {
        const OP: &str = "ternary matvec";
        let (r, wg) = (cfg.rows_per_workgroup, cfg.workgroup_size);
        let max_rows = match cfg.kernel {
            MatvecKernel::Split => MAX_ROWS_PER_WORKGROUP,
            MatvecKernel::SubgroupRows { .. }
            | MatvecKernel::Q8 { .. }
            | MatvecKernel::Q8Pre { .. } => MAX_ROWS_PER_WORKGROUP_SUBGROUP_ROWS,
        };
        if r == 0 || r > max_rows {
            return Err(GpuError::Shape {
                op: OP,
                detail: format!("rows per workgroup {r}: must be 1..={max_rows}"),
            });
        }
        if !wg.is_power_of_two() || !(32..=1024).contains(&wg) {
            return Err(GpuError::Shape {
                op: OP,
                detail: format!("workgroup size {wg}: must be a power of two from 32 to 1024"),
            });
        }
        let l = &self.limits;
        let max_wg = l
            .max_compute_workgroup_size_x
            .min(l.max_compute_invocations_per_workgroup);
        if wg > max_wg {
            return Err(GpuError::Limit {
                op: OP,
                what: "the workgroup size",
                needed: wg as u64,
                limit: max_wg as u64,
            });
        }
        if let MatvecKernel::Q8 {
            rows_per_subgroup: rs,
            units_in_flight: p,
            max_cols,
        } = cfg.kernel
        {
            if max_cols == 0 || !max_cols.is_multiple_of(256) || max_cols > MAX_Q8_COLS {
                return Err(GpuError::Shape {
                    op: OP,
                    detail: format!(
                        "largest K {max_cols}: must be a multiple of 256 up to {MAX_Q8_COLS}"
                    ),
                });
            }
            check_rows_split(r, rs, p, cfg.reduction)?;
        }
        if let MatvecKernel::Q8Pre {
            rows_per_subgroup: rs,
            units_in_flight: p,
            whole_workgroup,
            y16,
            ..
        } = cfg.kernel
        {
            check_rows_split(r, rs, p, cfg.reduction)?;
            // A `_y16` product quantizes whole groups of 16 of its SwiGLU outputs; an `_x16`
            // one has no quantize dispatch, so no norm to fold in.
            if y16 && (whole_workgroup || !cfg.fuse.swiglu || !r.is_multiple_of(16)) {
                return Err(GpuError::Shape {
                    op: OP,
                    detail: format!(
                        "{}: a product writing x per 16-element group takes subgroup rows, SwiGLU and a multiple of 16 rows per workgroup",
                        cfg.name()
                    ),
                });
            }
            if cfg.q16().0 && cfg.fuse.rms_norm {
                return Err(GpuError::Shape {
                    op: OP,
                    detail: format!(
                        "{}: a product reading x per 16-element group folds no RMSNorm in",
                        cfg.name()
                    ),
                });
            }
        }
        if let MatvecKernel::SubgroupRows {
            rows_per_subgroup: rs,
            units_in_flight: p,
            x_tile,
        } = cfg.kernel
        {
            if !x_tile.is_multiple_of(256) || x_tile > MAX_X_TILE {
                return Err(GpuError::Shape {
                    op: OP,
                    detail: format!(
                        "x tile {x_tile}: must be a multiple of 256 up to {MAX_X_TILE} (0: none)"
                    ),
                });
            }
            check_rows_split(r, rs, p, cfg.reduction)?;
            if cfg.fuse != Fuse::default() && x_tile == 0 {
                return Err(GpuError::Shape {
                    op: OP,
                    detail: "fused ops need x staged in workgroup memory (x tile > 0)".into(),
                });
            }
        } else if cfg.fuse != Fuse::default() && !cfg.is_int8() {
            return Err(GpuError::Shape {
                op: OP,
                detail: "only the subgroup-rows kernels fuse ops".into(),
            });
        }
        let norm_sums = if cfg.fuse.rms_norm { wg as u64 } else { 0 };
        let shared = match (cfg.kernel, cfg.reduction) {
            // The quantize kernel's: Q8_QUANTIZE_WG / 16 block maxima and / 4 unit sums, and
            // the norm's subgroup sums.
            (
                MatvecKernel::Q8Pre {
                    rows_per_subgroup: rs,
                    whole_workgroup,
                    ..
                },
                _,
            ) => {
                let q = Q8_QUANTIZE_WG as u64;
                let quantize = 4 * (q / 16 + q / 4) + if cfg.fuse.rms_norm { q } else { 0 };
                // The whole-workgroup product's partials: one per subgroup (of at least 4
                // invocations) and accumulator.
                let nr = if cfg.fuse.swiglu { 2 * rs } else { rs } as u64;
                let partials = if whole_workgroup {
                    4 * (wg as u64 / 4) * nr
                } else {
                    0
                };
                // A `_y16` product's rows until they are quantized.
                let yq = if cfg.q16().1 { 4 * r as u64 } else { 0 };
                quantize.max(partials + yq)
            }
            (MatvecKernel::SubgroupRows { x_tile, .. }, _) => 4 * x_tile as u64 + norm_sums,
            (MatvecKernel::Q8 { max_cols, .. }, _) => {
                let k = max_cols as u64;
                k + k / 16 + k / 32 + norm_sums
            }
            (_, Reduction::Subgroup) => 4 * r as u64 * (wg as u64 / 4),
            (_, Reduction::Workgroup) => 4 * r as u64 * wg as u64,
        };
        if shared > l.max_compute_workgroup_storage_size as u64 {
            return Err(GpuError::Limit {
                op: OP,
                what: "workgroup memory (bytes)",
                needed: shared,
                limit: l.max_compute_workgroup_storage_size as u64,
            });
        }
        if cfg.reduction == Reduction::Subgroup && !self.has_subgroups() {
            return Err(GpuError::MissingFeature {
                op: OP,
                adapter: self.info.name.clone(),
                feature: "SUBGROUP",
            });
        }
        Ok(())
    }

    /// The pipeline of `cfg`, built on first use.
    pub fn pipeline(&self, cfg: &MatvecConfig) -> Result<wgpu::ComputePipeline, GpuError> {
        self.check_config(cfg)?;
        let name = cfg.name();
        if self.builtin && !self.sources.contains_key(&name) {
            // A variant outside the registry's list (tests and the tuning benchmark try
            // others): built-in sources may generate it; a bundle's may not.
            let _ = self.extra.lock().map(|mut m| {
                m.entry(name.clone())
                    .or_insert_with(|| cfg.source())
                    .clone()
            });
        }
        self.pipeline_named(&name, Some(&self.ternary_pipeline_layout))
    }

    /// The `@group(0)` bindings that kernel `name`'s entry point `main` uses, by naga's
    /// analysis of its source (once per kernel): exactly the bindings of the layout wgpu
    /// derives from it (wgpu-core keeps a resource where the entry point's use of it is not
    /// empty), so that the host binds an optional resource (a bias, a second view of the
    /// weight) only where the kernel reads it, whatever else its source declares. Empty for
    /// a kernel not among the sources (those of [`Self::pipeline_named`]: the generated
    /// variants first, then [`Self::source`]; not cached, as a variant may be generated later)
    /// or whose source does not parse and validate here (building its pipeline reports that).
    pub fn used_bindings(&self, name: &str) -> std::sync::Arc<std::collections::BTreeSet<u32>> {
        let mut cache = self.used_bindings.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = cache.get(name) {
            return b.clone();
        }
        let Ok(wgsl) = self.module_source(name) else {
            return Default::default();
        };
        let used = std::sync::Arc::new(
            crate::bundle::kernels::parse_and_validate(name, &wgsl)
                .and_then(|p| crate::bundle::kernels::used_bindings(name, &p))
                .unwrap_or_default(),
        );
        cache.insert(name.to_string(), used.clone());
        used
    }

    /// The source [`Self::pipeline_named`] builds module `name` from: a generated variant
    /// (`extra`), else [`Self::source`]'s (its error where neither has it).
    fn module_source(&self, name: &str) -> Result<String, GpuError> {
        let extra = self
            .extra
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned();
        match extra {
            Some(s) => Ok(s),
            None => self.source(name).map(str::to_string),
        }
    }

    /// The WGSL source of module `name` ([`ContextOptions::sources`]).
    pub fn source(&self, name: &str) -> Result<&str, GpuError> {
        self.sources
            .get(name)
            .map(|s| s.as_str())
            .ok_or_else(|| GpuError::Shader {
                name: name.to_string(),
                detail: "no such kernel among the sources (a bundle made before this kernel existed: add the kernels with `convert add-kernels`)".into(),
            })
    }

    /// The compute pipeline of module `name` (entry point `main`), built on first use with
    /// `layout`, or with the layout wgpu derives from the shader when `None` (then
    /// `pipeline.get_bind_group_layout(0)` gives the bind group layout).
    pub fn pipeline_named(
        &self,
        name: &str,
        layout: Option<&wgpu::PipelineLayout>,
    ) -> Result<wgpu::ComputePipeline, GpuError> {
        let mut cache = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = cache.get(name) {
            return Ok(p.clone());
        }
        let src = self.module_source(name)?;
        let src = src.as_str();
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(name),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        };
        let unchecked =
            self.unchecked_shaders || (self.unchecked_builtin && kernels::is_builtin(name, src));
        let module = if unchecked {
            // SAFETY: every index the kernels form is inside its buffer for the shapes the
            // host checks before binding: each weight `bind_*` checks buffer sizes against
            // shapes (rows past the end are clamped to the last row); the ops (`bind_op`,
            // which checks only the grid) are bound by the backend's graph to buffers it
            // sizes from the same hyper-parameters their parameters carry, and a step's
            // positions past the context are refused before it runs (`PositionOutOfRange`).
            // By default only this binary's own sources come here (`unchecked_builtin`); the
            // GPU test suites run them so on lavapipe.
            unsafe {
                self.device
                    .create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
            }
        } else {
            self.device.create_shader_module(desc)
        };
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(name),
                layout,
                module: &module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions::default(),
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Shader {
                name: name.to_string(),
                detail: e.to_string(),
            });
        }
        cache.insert(name.to_string(), pipeline.clone());
        Ok(pipeline)
    }

    /// Uploads a ternary weight `[rows, cols]` from its stored bytes (`words`: `rows * cols/16`
    /// little-endian u32, `scales`: `rows * cols/256` little-endian f16), straight from the
    /// given slices (the bundle's memory map), split into row chunks that fit one binding.
    pub fn upload_ternary(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        words: &[u8],
        scales: &[u8],
    ) -> Result<GpuTernary, GpuError> {
        const OP: &str = "ternary upload";
        let shape = |detail: String| GpuError::Shape {
            op: OP,
            detail: format!("{name} [{rows}, {cols}]: {detail}"),
        };
        if rows == 0 || cols == 0 || !cols.is_multiple_of(256) {
            return Err(shape("cols must be a positive multiple of 256".into()));
        }
        let row_words = (cols / 16) as u64 * 4;
        let row_scales = (cols / 256) as u64 * 2;
        let want_words = (rows as u64).checked_mul(row_words);
        let want_scales = (rows as u64).checked_mul(row_scales);
        if want_words != Some(words.len() as u64) || want_scales != Some(scales.len() as u64) {
            return Err(shape(format!(
                "{} code bytes and {} scale bytes given, {:?} and {:?} expected",
                words.len(),
                scales.len(),
                want_words,
                want_scales
            )));
        }
        // Rows per chunk: the codes of a chunk fit one binding; a multiple of `step` rows so
        // every chunk's scales start on a u32 (a row has cols/256 f16, possibly an odd number)
        // and its part of y on the adapter's storage offset alignment.
        let cap = self.max_binding_bytes;
        let step = (self.limits.min_storage_buffer_offset_alignment as u64 / 4).max(2);
        let mut chunk_rows = (cap / row_words).min(rows as u64);
        if chunk_rows < rows as u64 {
            chunk_rows -= chunk_rows % step;
        }
        if chunk_rows == 0 {
            return Err(GpuError::Limit {
                op: OP,
                what: "the smallest row chunk's codes (bytes)",
                needed: row_words * step,
                limit: cap,
            });
        }
        let mut chunks = Vec::new();
        let mut row0 = 0usize;
        while row0 < rows {
            let n = (chunk_rows as usize).min(rows - row0);
            let w = &words[row0 * row_words as usize..(row0 + n) * row_words as usize];
            let s = &scales[row0 * row_scales as usize..(row0 + n) * row_scales as usize];
            // The f16 scales, padded to the storage offset alignment, then the f32 ones.
            let align = (self.limits.min_storage_buffer_offset_alignment as usize).max(16);
            let off = s.len().div_ceil(align) * align;
            let mut aux = s.to_vec();
            aux.resize(off, 0);
            aux.extend_from_slice(bytemuck::cast_slice(&scales4(s, n, cols / 256)));
            chunks.push(TernaryChunk {
                row0,
                rows: n,
                codes: self.upload_bytes(&format!("{name}.codes[{row0}..]"), w)?,
                scales: self.upload_bytes(&format!("{name}.scales[{row0}..]"), &aux)?,
                scales4: off as u64,
            });
            row0 += n;
        }
        Ok(GpuTernary {
            name: name.to_string(),
            rows,
            cols,
            chunks,
        })
    }

    /// Uploads a `ternary2` weight of an opened bundle from its memory map.
    pub fn upload_weight(
        &self,
        bundle: &crate::bundle::reader::Bundle,
        w: &super::model::Weight,
    ) -> Result<GpuTernary, GpuError> {
        match &w.kind {
            super::model::WeightKind::Ternary { codes, scales } => self.upload_ternary(
                &w.name,
                w.rows,
                w.cols,
                w.bytes(bundle, *codes),
                w.bytes(bundle, *scales),
            ),
            _ => Err(GpuError::Shape {
                op: "weight upload",
                detail: format!("{}: only ternary2 weights have a GPU kernel yet", w.name),
            }),
        }
    }

    /// A storage buffer holding `bytes`, padded with zeros to a multiple of 4 bytes.
    pub fn upload_bytes(&self, label: &str, bytes: &[u8]) -> Result<wgpu::Buffer, GpuError> {
        let size = (bytes.len() as u64).div_ceil(4).max(1) * 4;
        if size > self.limits.max_buffer_size {
            return Err(GpuError::Limit {
                op: "upload",
                what: "one buffer (bytes)",
                needed: size,
                limit: self.limits.max_buffer_size,
            });
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Device {
                op: "upload",
                detail: format!("{label}: {e}"),
            });
        }
        let whole = bytes.len() / 4 * 4;
        if whole > 0 {
            self.queue.write_buffer(&buf, 0, &bytes[..whole]);
        }
        if whole < bytes.len() {
            let mut tail = [0u8; 4];
            tail[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
            self.queue.write_buffer(&buf, whole as u64, &tail);
        }
        Ok(buf)
    }

    /// The int8 prefill products' scratch for `n_tokens` tokens of `cols` activations: `xq`
    /// (`n_tokens * cols` bytes of int8 in the group layout) and `xs` (`da` and sum q per
    /// block of 256, 8 bytes each), made on first use.
    pub fn q8_scratch(&self, n_tokens: u32, cols: usize) -> (wgpu::Buffer, wgpu::Buffer) {
        let mut m = self.q8_scratch.lock().unwrap_or_else(|e| e.into_inner());
        m.entry((n_tokens, cols))
            .or_insert_with(|| {
                let n = n_tokens as usize;
                (
                    self.vector_buffer("q8 activations", n * cols / 4),
                    self.vector_buffer("q8 block scales and sums", n * cols / 256 * 2),
                )
            })
            .clone()
    }

    /// The int8 x of one token's [`MatvecKernel::Q8Pre`] products of `cols` columns
    /// (`cols + cols / 8` bytes: the groups, then the unit sums and block `da`; the layout of
    /// `shaders/ternary_matvec_q8g.wgsl`), made on first use and shared by every such
    /// product (each writes it just before reading it, in one queue).
    pub fn q8_vec_scratch(&self, cols: usize) -> wgpu::Buffer {
        let mut m = self.q8_vec.lock().unwrap_or_else(|e| e.into_inner());
        // And a `vec4` per quantize workgroup: its sum of x^2 ([`Q8_QUANTIZE_RMS_LATE`]).
        let sums = 4 * cols.div_ceil(16 * Q8_QUANTIZE_WG as usize);
        m.entry(cols)
            .or_insert_with(|| self.vector_buffer("q8 x", (cols + cols / 8) / 4 + sums))
            .clone()
    }

    /// x per 16-element group of `cols` columns ([`Q16_LAYOUT`], `cols + cols / 2` bytes): what
    /// a `_y16` product writes and the `_x16` product after it reads, made on first use and
    /// shared by every such pair.
    pub fn q16_vec_scratch(&self, cols: usize) -> wgpu::Buffer {
        let mut m = self.q16_vec.lock().unwrap_or_else(|e| e.into_inner());
        m.entry(cols)
            .or_insert_with(|| self.vector_buffer("q16 x", (cols + cols / 2) / 4))
            .clone()
    }

    /// A storage buffer of `n` f32 (a vector the kernels write), readable back.
    pub fn vector_buffer(&self, label: &str, n: usize) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: (n.max(1) * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// The bind groups and grids of `y = w x` with `cfg`, made once and encoded any number of
    /// times. `x` holds `w.cols` f32, `y` `w.rows` f32.
    pub fn bind_matvec(
        &self,
        w: &GpuTernary,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        cfg: &MatvecConfig,
    ) -> Result<BoundMatvec, GpuError> {
        self.bind_matvec_with(w, x, &ops::BufView::whole(y), cfg, Epilogue::Store)
    }

    /// [`GpuContext::bind_matvec`] into a view `y` (its `w.rows` f32 from the view's offset),
    /// with the sums stored as `epilogue` says.
    pub fn bind_matvec_with(
        &self,
        w: &GpuTernary,
        x: &wgpu::Buffer,
        y: &ops::BufView,
        cfg: &MatvecConfig,
        epilogue: Epilogue,
    ) -> Result<BoundMatvec, GpuError> {
        self.bind_ternary_fused(w, x, y, cfg, epilogue, None)
    }

    /// [`GpuContext::bind_matvec_with`] for a configuration that fuses ops ([`Fuse`]):
    /// `norm` (the RMSNorm's weight, `w.cols` f32, and epsilon) when `cfg.fuse.rms_norm`;
    /// with `cfg.fuse.swiglu`, `w` is a stacked gate/up weight of `2 * h` rows in one chunk
    /// and `y` takes `h` values.
    pub fn bind_ternary_fused(
        &self,
        w: &GpuTernary,
        x: &wgpu::Buffer,
        y: &ops::BufView,
        cfg: &MatvecConfig,
        epilogue: Epilogue,
        norm: Option<(&wgpu::Buffer, f32)>,
    ) -> Result<BoundMatvec, GpuError> {
        const OP: &str = "ternary matvec";
        if epilogue == Epilogue::Bias {
            return Err(GpuError::Shape {
                op: OP,
                detail: format!("{}: the ternary kernels have no bias epilogue", w.name),
            });
        }
        let pipeline = self.pipeline(cfg)?;
        let glu = cfg.fuse.swiglu;
        if norm.is_some() != cfg.fuse.rms_norm
            || !cfg.takes_cols(w.cols)
            || norm.is_some_and(|(n, _)| n.size() < (w.cols * 4) as u64)
            || (glu && (w.chunks.len() != 1 || !w.rows.is_multiple_of(2)))
        {
            return Err(GpuError::Shape {
                op: OP,
                detail: format!(
                    "{} [{}, {}] with {}: {} chunks, {} norm weight",
                    w.name,
                    w.rows,
                    w.cols,
                    cfg.name(),
                    w.chunks.len(),
                    norm.map_or("no".to_string(), |(n, _)| format!("a {}-byte", n.size()))
                ),
            });
        }
        // Output rows: SwiGLU makes one of each gate row and its up row.
        let out_rows = if glu { w.rows / 2 } else { w.rows };
        // x and y per 16-element group take K + K/2 bytes ([`Q16_LAYOUT`]); a `_y16` product
        // stores no f32 y, so it has no residual epilogue.
        let (x16, y16) = cfg.q16();
        if y16 && epilogue != Epilogue::Store {
            return Err(GpuError::Shape {
                op: OP,
                detail: format!(
                    "{}: {} stores no sums (no residual epilogue)",
                    w.name,
                    cfg.name()
                ),
            });
        }
        let x_need = if x16 { w.cols * 3 / 2 } else { w.cols * 4 };
        let y_need = if y16 { out_rows * 3 / 2 } else { out_rows * 4 };
        if y16 && !out_rows.is_multiple_of(256) {
            return Err(GpuError::Shape {
                op: OP,
                detail: format!(
                    "{} [{}, {}] with {}: {out_rows} outputs are not a multiple of 256",
                    w.name,
                    w.rows,
                    w.cols,
                    cfg.name()
                ),
            });
        }
        if x.size() < x_need as u64 || y.size < y_need as u64 {
            return Err(GpuError::Shape {
                op: OP,
                detail: format!(
                    "{} [{}, {}]: x buffer of {} bytes, y buffer of {} bytes",
                    w.name,
                    w.rows,
                    w.cols,
                    x.size(),
                    y.size
                ),
            });
        }
        if cfg.reads_scales4() {
            if let Some(c) = w.chunks.iter().find(|c| c.scales4 == 0) {
                return Err(GpuError::Shape {
                    op: OP,
                    detail: format!(
                        "{}: chunk at row {} has no f32 scales for {}",
                        w.name,
                        c.row0,
                        cfg.name()
                    ),
                });
            }
        }
        // Q8Pre: x quantized (and normalized) once into the scratch the product reads.
        let mut pre = None;
        let mut x = x;
        let scratch;
        if let Some(name) = cfg.pre_kernel() {
            if self.builtin && name == Q8_QUANTIZE_RMS_LATE && !self.sources.contains_key(name) {
                // The opt-in norm-at-the-end path's quantize kernel: not in the registry (no
                // bundle carries it); built-in sources generate it.
                let _ = self.extra.lock().map(|mut m| {
                    m.entry(name.to_string())
                        .or_insert_with(q8_quantize_rms_late_source)
                        .clone()
                });
            }
            scratch = self.q8_vec_scratch(w.cols);
            let qp = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("q8 quantize params"),
                size: 16,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let eps = norm.map_or(0.0f32, |(_, e)| e);
            self.queue.write_buffer(
                &qp,
                0,
                bytemuck::cast_slice(&[w.cols as u32, eps.to_bits(), 0, 0]),
            );
            let qpipe = self.pipeline_named(name, None)?;
            let mut entries = vec![
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: x.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: scratch.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: qp.as_entire_binding(),
                },
            ];
            if let Some((n, _)) = norm {
                entries.push(wgpu::BindGroupEntry {
                    binding: 3,
                    resource: n.as_entire_binding(),
                });
            }
            let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(name),
                layout: &qpipe.get_bind_group_layout(0),
                entries: &entries,
            });
            let groups = (w.cols / 16).div_ceil(Q8_QUANTIZE_WG as usize) as u32;
            pre = Some((qpipe, bg, groups));
            x = &scratch;
        }
        let align = self.limits.min_storage_buffer_offset_alignment as u64;
        let mut parts = Vec::with_capacity(w.chunks.len());
        for c in &w.chunks {
            let c_rows = if glu { c.rows / 2 } else { c.rows };
            let groups = c_rows.div_ceil(cfg.rows_per_workgroup as usize) as u64;
            let (gx, gy) = grid_or_limit(OP, groups)?;
            let y_off = (c.row0 * 4) as u64;
            // y of a later chunk starts at its first row: an offset the adapter must accept.
            if !y_off.is_multiple_of(align) {
                return Err(GpuError::Shape {
                    op: OP,
                    detail: format!(
                        "{}: chunk at row {} puts y at byte {y_off}, not a multiple of the adapter's storage offset alignment {align}",
                        w.name, c.row0
                    ),
                });
            }
            let (acc, scale) = epilogue.flag_and_scale();
            let eps = norm.map_or(0.0f32, |(_, e)| e);
            let params = [
                c_rows as u32,
                w.cols as u32,
                gx,
                acc,
                scale.to_bits(),
                eps.to_bits(),
                0,
                0,
            ];
            let ubuf = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("ternary_matvec params"),
                size: 32,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            self.queue
                .write_buffer(&ubuf, 0, bytemuck::cast_slice(&params));
            let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&w.name),
                layout: &self.ternary_layout,
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: c.codes.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: if cfg.reads_scales4() {
                            wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                buffer: &c.scales,
                                offset: c.scales4,
                                size: None,
                            })
                        } else {
                            c.scales.as_entire_binding()
                        },
                    },
                    wgpu::BindGroupEntry {
                        binding: 2,
                        resource: x.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 3,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &y.buffer,
                            offset: y.offset + y_off,
                            size: std::num::NonZeroU64::new(if y16 {
                                y_need as u64
                            } else {
                                (c_rows * 4) as u64
                            }),
                        }),
                    },
                    wgpu::BindGroupEntry {
                        binding: 4,
                        resource: ubuf.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 5,
                        resource: norm
                            .map_or(&self.placeholder, |(n, _)| n)
                            .as_entire_binding(),
                    },
                ],
            });
            parts.push((bg, (gx, gy)));
        }
        Ok(BoundMatvec {
            pre_kernel: pre.as_ref().and(cfg.pre_kernel()),
            pre,
            pipeline,
            parts,
            // Q8Pre: the quantize kernel after the product's name (`+q8_quantize_rms`).
            label: match cfg.pre_kernel() {
                Some(q) => format!(
                    "{}+{} {}",
                    cfg.name(),
                    q.trim_start_matches("ternary_"),
                    w.name
                ),
                None => format!("{} {}", cfg.name(), w.name),
            },
        })
    }

    /// `y = w x` with `cfg`, one submission, read back.
    pub fn matvec(
        &self,
        w: &GpuTernary,
        x: &[f32],
        cfg: &MatvecConfig,
    ) -> Result<Vec<f32>, GpuError> {
        if x.len() != w.cols {
            return Err(GpuError::Shape {
                op: "ternary matvec",
                detail: format!(
                    "{} [{}, {}]: x has {} values",
                    w.name,
                    w.rows,
                    w.cols,
                    x.len()
                ),
            });
        }
        let xb = self.upload_bytes("x", bytemuck::cast_slice(x))?;
        let yb = self.vector_buffer("y", w.rows);
        let bound = self.bind_matvec(w, &xb, &yb, cfg)?;
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("ternary matvec"),
                timestamp_writes: None,
            });
            bound.encode(&mut pass);
        }
        self.queue.submit([enc.finish()]);
        let bytes = self.read_buffer(&yb, (w.rows * 4) as u64)?;
        Ok(bytemuck::cast_slice::<u8, f32>(&bytes).to_vec())
    }

    /// The first `size` bytes of `buf` (which needs COPY_SRC), after all submitted work.
    pub fn read_buffer(&self, buf: &wgpu::Buffer, size: u64) -> Result<Vec<u8>, GpuError> {
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("read back"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        enc.copy_buffer_to_buffer(buf, 0, &staging, 0, size);
        self.queue.submit([enc.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Device {
                op: "read back",
                detail: e.to_string(),
            })?;
        rx.recv()
            .map_err(|e| GpuError::Device {
                op: "read back",
                detail: e.to_string(),
            })?
            .map_err(|e| GpuError::Device {
                op: "read back",
                detail: e.to_string(),
            })?;
        let view = staging.get_mapped_range(..).map_err(|e| GpuError::Device {
            op: "read back",
            detail: e.to_string(),
        })?;
        let out = view.to_vec();
        drop(view);
        staging.unmap();
        Ok(out)
    }

    /// Times one compute pass whose dispatches `record` encodes (the probes and benchmarks in
    /// `examples/`): from the pass's begin and end timestamps where the adapter has
    /// TIMESTAMP_QUERY, else the wall clock from submit to done.
    pub fn time_pass(
        &self,
        record: &mut dyn FnMut(&mut wgpu::ComputePass<'_>),
    ) -> Result<PassTime, GpuError> {
        let query = self.has_timestamps().then(|| {
            (
                self.device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("pass timestamps"),
                    ty: wgpu::QueryType::Timestamp,
                    count: 2,
                }),
                self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("pass timestamps"),
                    size: 16,
                    usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                }),
            )
        });
        let t_enc = std::time::Instant::now();
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: query
                    .as_ref()
                    .map(|(q, _)| wgpu::ComputePassTimestampWrites {
                        query_set: q,
                        beginning_of_pass_write_index: Some(0),
                        end_of_pass_write_index: Some(1),
                    }),
            });
            record(&mut pass);
        }
        if let Some((q, r)) = &query {
            enc.resolve_query_set(q, 0..2, r, 0);
        }
        let cmd = enc.finish();
        let encode_ns = t_enc.elapsed().as_nanos() as f64;
        let t = std::time::Instant::now();
        self.queue.submit([cmd]);
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Device {
                op: "time a pass",
                detail: e.to_string(),
            })?;
        let wall = t.elapsed().as_nanos() as f64;
        let (ns, timestamps) = match &query {
            Some((_, r)) => {
                let b = self.read_buffer(r, 16)?;
                let ts: &[u64] = bytemuck::cast_slice(&b);
                let ticks = ts[1].saturating_sub(ts[0]) as f64;
                (ticks * self.queue.get_timestamp_period() as f64, true)
            }
            None => (wall, false),
        };
        Ok(PassTime {
            ns,
            timestamps,
            encode_ns,
        })
    }
}

/// One pass's time ([`GpuContext::time_pass`]).
#[derive(Clone, Copy, Debug)]
pub struct PassTime {
    /// Nanoseconds the pass took on the GPU (timestamps) or from submit to done.
    pub ns: f64,
    /// Whether `ns` comes from timestamp queries.
    pub timestamps: bool,
    /// Nanoseconds on the host to record the pass and finish its command buffer.
    pub encode_ns: f64,
}

/// What a matrix product does with each sum (its epilogue), so that the op after it need not
/// be a dispatch of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Epilogue {
    /// `y = W x`.
    #[default]
    Store,
    /// `y = y + (W x) * scale`: the residual add (`op_add`, the CPU's `x + y * scale`, the same
    /// operations in the same order, so the same bits) folded into the product. `y` must not
    /// be the product's `x`.
    Accumulate(f32),
    /// `y = W x + b`: a bias add (`op_bias_add`, the same operation, so the same bits) folded
    /// into a GGUF or palette product (`shaders/weights/store.wgsl`); the bias vector is given
    /// where the product is bound ([`GpuContext::bind_matmul_bias`]). The ternary kernels
    /// have no such epilogue.
    Bias,
}

impl Epilogue {
    /// `(accumulate, scale)` as the kernels' parameters take them.
    pub fn flag_and_scale(self) -> (u32, f32) {
        match self {
            Epilogue::Store => (0, 1.0),
            Epilogue::Accumulate(s) => (1, s),
            Epilogue::Bias => (2, 1.0),
        }
    }
}

/// A dispatch grid of `groups` workgroups: `(groups, 1)` up to 65,535, else 2-D with
/// `x = 65,535`; `None` past 65,535^2.
pub fn grid(groups: u64) -> Option<(u32, u32)> {
    let m = MAX_WORKGROUPS_PER_DIM as u64;
    if groups <= m {
        return Some((groups.max(1) as u32, 1));
    }
    let gy = groups.div_ceil(m);
    (gy <= m).then_some((m as u32, gy as u32))
}

/// [`grid`], or past its 65,535 x 65,535 workgroups the limit error of `op`.
pub fn grid_or_limit(op: &'static str, groups: u64) -> Result<(u32, u32), GpuError> {
    grid(groups).ok_or(GpuError::Limit {
        op,
        what: "workgroups",
        needed: groups,
        limit: MAX_WORKGROUPS_PER_DIM as u64 * MAX_WORKGROUPS_PER_DIM as u64,
    })
}

/// One row chunk of a ternary weight on the device.
#[derive(Debug)]
pub struct TernaryChunk {
    pub row0: usize,
    pub rows: usize,
    pub codes: wgpu::Buffer,
    /// The chunk's block scales as stored (`rows * cols/256` f16), then at byte offset
    /// `scales4` the same scales as f32 in groups of four rows (see [`scales4`]).
    pub scales: wgpu::Buffer,
    /// Byte offset of the f32 scales in `scales` (a multiple of the adapter's storage offset
    /// alignment); 0 where the chunk has none.
    pub scales4: u64,
}

/// A ternary chunk's block scales (`rows` rows of `blocks` little-endian f16) as the int8
/// decode products read them ([`MatvecKernel::Q8Pre`]): f32, four rows to a `vec4`, group
/// `g`'s block `b` at `vec4` index `g * blocks + b` holding rows `4g .. 4g + 3` (0 past the
/// last row). A subgroup pass over 2 or 4 rows of one group takes all their scales of a
/// block with one 16-byte load and no f16 decode (the f16 bits widen exactly).
pub fn scales4(scales: &[u8], rows: usize, blocks: usize) -> Vec<f32> {
    let groups = rows.div_ceil(4);
    let mut out = vec![0f32; groups * blocks * 4];
    for (i, h) in scales.chunks_exact(2).enumerate().take(rows * blocks) {
        let (r, b) = (i / blocks, i % blocks);
        out[((r / 4) * blocks + b) * 4 + r % 4] =
            half::f16::from_bits(u16::from_le_bytes([h[0], h[1]])).to_f32();
    }
    out
}

/// A ternary weight on the device (row chunks that each fit one binding).
#[derive(Debug)]
pub struct GpuTernary {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub chunks: Vec<TernaryChunk>,
}

impl GpuTernary {
    /// Bytes one matvec reads from the weight (codes and scales).
    pub fn weight_bytes(&self) -> u64 {
        (self.rows * self.cols / 4 + self.rows * self.cols / 128) as u64
    }
}

/// A matvec's pipeline, bind groups and grids, ready to encode.
pub struct BoundMatvec {
    /// [`MatvecKernel::Q8Pre`]: the quantize dispatch that writes the product's int8 x.
    pub(crate) pre: Option<(wgpu::ComputePipeline, wgpu::BindGroup, u32)>,
    /// The name of `pre`'s kernel ([`MatvecConfig::pre_kernel`]).
    pub(crate) pre_kernel: Option<&'static str>,
    pipeline: wgpu::ComputePipeline,
    parts: Vec<(wgpu::BindGroup, (u32, u32))>,
    /// `kernel weight`, for profiles.
    pub label: String,
}

impl BoundMatvec {
    /// Records the dispatches (one per row chunk) into `pass`.
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>) {
        if let Some((p, bg, groups)) = &self.pre {
            pass.set_pipeline(p);
            pass.set_bind_group(0, bg, &[]);
            pass.dispatch_workgroups(*groups, 1, 1);
        }
        self.encode_product(pass);
    }

    /// Records the product's dispatches only (without a [`MatvecKernel::Q8Pre`] kernel's
    /// quantize dispatch: the benchmarks time the two apart).
    pub fn encode_product(&self, pass: &mut wgpu::ComputePass<'_>) {
        pass.set_pipeline(&self.pipeline);
        for (bg, (gx, gy)) in &self.parts {
            pass.set_bind_group(0, bg, &[]);
            pass.dispatch_workgroups(*gx, *gy, 1);
        }
    }

    /// Dispatches per matvec.
    pub fn dispatches(&self) -> usize {
        self.parts.len() + self.pre.is_some() as usize
    }
}

/// The bound of the module doc: `4 * K * 2^-24 * sum_k |d_b(k) x_k|` for one row (`abs_dx`
/// the sum), plus the smallest normal f32 for rows whose sum is 0.
pub fn tolerance(cols: usize, abs_dx: f64) -> f64 {
    4.0 * cols as f64 * f32::EPSILON as f64 / 2.0 * abs_dx + f32::MIN_POSITIVE as f64
}

/// The context of the tests and benchmarks: `None` (after saying why on stderr) when no
/// adapter appears, unless `LOWBIT_REQUIRE_GPU=1` (set by `make test`), where that panics.
pub fn context_for_tests(opts: &ContextOptions) -> Option<GpuContext> {
    match GpuContext::new(opts) {
        Ok(c) => Some(c),
        Err(e) => {
            if std::env::var("LOWBIT_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("no GPU context and LOWBIT_REQUIRE_GPU=1: {e}");
            }
            eprintln!("skipping: no GPU context ({e})");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_stays_within_65535_per_dimension() {
        assert_eq!(grid(1), Some((1, 1)));
        assert_eq!(grid(65_535), Some((65_535, 1)));
        assert_eq!(grid(65_536), Some((65_535, 2)));
        assert_eq!(grid(65_535 * 65_535), Some((65_535, 65_535)));
        assert_eq!(grid(65_535 * 65_535 + 1), None);
    }

    #[test]
    fn selector_parses_index_or_name() {
        assert_eq!(
            "1".parse::<AdapterSelector>().unwrap(),
            AdapterSelector::Index(1)
        );
        assert_eq!(
            "llvmpipe".parse::<AdapterSelector>().unwrap(),
            AdapterSelector::Name("llvmpipe".into())
        );
        assert!(matches!(
            " ".parse::<AdapterSelector>(),
            Err(GpuError::EmptySelector)
        ));
    }

    fn info(name: &str, t: wgpu::DeviceType) -> wgpu::AdapterInfo {
        let mut i = wgpu::AdapterInfo::new(t, wgpu::Backend::Vulkan);
        i.name = name.into();
        i
    }

    #[test]
    fn select_prefers_a_real_gpu_and_matches_names() {
        let infos = [
            info("llvmpipe (LLVM 15)", wgpu::DeviceType::Cpu),
            info("NVIDIA H200", wgpu::DeviceType::DiscreteGpu),
        ];
        assert_eq!(select_index(&infos, None).unwrap(), 1);
        let sel = |s: &str| s.parse::<AdapterSelector>().unwrap();
        assert_eq!(select_index(&infos, Some(&sel("0"))).unwrap(), 0);
        assert_eq!(select_index(&infos, Some(&sel("h200"))).unwrap(), 1);
        let e = select_index(&infos, Some(&sel("radeon"))).unwrap_err();
        assert!(e.to_string().contains("0: llvmpipe"), "{e}");
        assert!(select_index(&infos, Some(&sel("2"))).is_err());
        assert!(matches!(select_index(&[], None), Err(GpuError::NoAdapter)));
    }

    #[test]
    fn pipeline_names_carry_their_parameters() {
        let c = MatvecConfig::split(4, 64, Reduction::Subgroup);
        assert_eq!(c.name(), "ternary_matvec_r4_wg64_sg");
        assert!(c.source().contains("const ROWS: u32 = 4u;"));
        let r = MatvecConfig::subgroup_rows(16, 128, 4, 2);
        assert_eq!(r.name(), "ternary_matvec_r16_wg128_sgrows4_p2");
        let src = r.source();
        assert!(src.starts_with("// ternary_matvec_r16_wg128_sgrows4_p2:"));
        assert!(src.contains("const RS: u32 = 4u;") && src.contains("const P: u32 = 2u;"));
        // Unrolled: one variable per row and unit, no workgroup memory or barrier.
        assert!(src.contains("let w3_1 = codes[row3 * units + v1];"));
        assert!(!src.contains("w4_") && !src.contains("_2 ="));
        assert!(!src.contains("var<workgroup>") && !src.contains("Barrier"));
        for c in [c, r, MatvecConfig::split(8, 256, Reduction::Workgroup)] {
            assert_eq!(MatvecConfig::parse(&c.name()), Some(c));
        }
        assert_eq!(
            MatvecConfig::parse("r8_wg64_sgrows2_p4"),
            Some(MatvecConfig::subgroup_rows(8, 64, 2, 4))
        );
        let t = MatvecConfig::subgroup_rows_tiled(16, 128, 4, 2, 4096);
        assert_eq!(t.name(), "ternary_matvec_r16_wg128_sgrows4_p2_xs4096");
        assert_eq!(MatvecConfig::parse(&t.name()), Some(t));
        let src = t.source();
        assert!(src.contains("const XT: u32 = 4096u;") && src.contains("var<workgroup> xs"));
        assert_eq!(MatvecConfig::parse("r4_wg64_sgrows2_p2_xs0"), None);
        assert_eq!(MatvecConfig::parse("r4_wg64_sgrows2_p2_xs256_x"), None);
        for bad in [
            "r4_wg64",
            "r4_wg64_xx",
            "r4_wg64_sgrows2",
            "r4_wg64_sg_p2",
            "x4_wg64_sg",
        ] {
            assert_eq!(MatvecConfig::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn int8_decode_product_names_carry_split_and_scales() {
        let sg = MatvecConfig::q8_pre(8, 128, 2, 2);
        let wg = MatvecConfig::q8_pre_wg(4, 128, 4, 2);
        assert_eq!(sg.name(), "ternary_matvec_q8g4_r8_wg128_sgrows2_p2");
        assert_eq!(wg.name(), "ternary_matvec_q8g4_r4_wg128_wgrows4_p2");
        assert_eq!(
            wg.with_f16_scales().name(),
            "ternary_matvec_q8g_r4_wg128_wgrows4_p2"
        );
        let glu = sg.fused(Fuse {
            rms_norm: false,
            swiglu: true,
        });
        for c in [sg, wg, sg.with_f16_scales(), wg.with_f16_scales(), glu] {
            assert_eq!(MatvecConfig::parse(&c.name()), Some(c), "{}", c.name());
        }
        assert!(sg.reads_scales4() && !sg.with_f16_scales().reads_scales4());
        // The f32 scales: one vec4 load per set of rows, no f16 decode; the f16 form as
        // before.
        let src = sg.source();
        assert!(src.contains("var<storage, read> scales: array<vec4<f32>>;"));
        assert!(!src.contains("scale_at("));
        assert!(src.contains("let sv0_1 = scales[(row0 / 4u) * blocks + v1 / 4u];"));
        assert!(src.contains("let e1_1 = sv0_1[row1 % 4u];"));
        let src16 = sg.with_f16_scales().source();
        assert!(src16.contains("let e1_1 = scale_at(row1 * blocks + v1 / 4u);"));
        // Up rows share their first row's group only when they are in it.
        let src = glu.source();
        assert!(src.contains("let sv2_0 = scales[(row2 / 4u) * blocks + v0 / 4u];"));
        assert!(src.contains("if row3 / 4u != row2 / 4u {"));
        // The whole workgroup on each row: partials across subgroups in workgroup memory.
        let src = wg.source();
        assert!(src.contains("var<workgroup> part: array<f32, (WG / 4u) * NR>;"));
        assert!(src.contains("let u1 = c + lid + 1u * WG;"));
        // The registry's products read the f32 scales with 4 rows a pass; the down
        // product's K takes the whole workgroup.
        let four = MatvecConfig::q8_pre(16, 128, 4, 1);
        assert_eq!(decode_q8_pre_config(4096, 4096, false), Some(four));
        assert_eq!(
            decode_q8_pre_config(4096, 16384, false),
            Some(MatvecConfig::q8_pre_wg(4, 128, 4, 1))
        );
        assert_eq!(decode_q8_pre_config(16384, 16384, true), Some(four));
    }

    #[test]
    fn scales4_groups_four_rows_a_block() {
        // 6 rows of 2 blocks: row r block b = r * 10 + b.
        let f16: Vec<u8> = (0..6)
            .flat_map(|r| (0..2).map(move |b| (r * 10 + b) as f32))
            .flat_map(|v| half::f16::from_f32(v).to_le_bytes())
            .collect();
        let s = scales4(&f16, 6, 2);
        assert_eq!(s.len(), 2 * 2 * 4);
        // Group 0: block 0 rows 0..3, block 1 rows 0..3; group 1 rows 4, 5 and zeros.
        assert_eq!(&s[..8], &[0.0, 10.0, 20.0, 30.0, 1.0, 11.0, 21.0, 31.0]);
        assert_eq!(&s[8..], &[40.0, 50.0, 0.0, 0.0, 41.0, 51.0, 0.0, 0.0]);
        // Exact for a subnormal f16 (the kernels used to decode the bits themselves).
        let tiny = half::f16::from_bits(0x0001);
        let s = scales4(&tiny.to_le_bytes(), 1, 1);
        assert_eq!(s[0], tiny.to_f32());
        assert_eq!(s[0], 2f32.powi(-24));
    }
}
