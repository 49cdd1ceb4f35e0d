//! The GPU kernels a bundle carries (issue 12): every WGSL module of the registry that its
//! tensors' encodings need ([`crate::runtime::gpu::kernels::for_tensors`]) as `kernels/NAME.wgsl`, and for native Metal hosts
//! the Metal Shading Language that naga translates it to as `kernels/NAME.metal`. Each file is
//! listed in the manifest's `kernels` section (name, kind, file, bytes, SHA256; for MSL how it
//! was made) and in `files`, so the bundle digest covers it exactly as it covers the weights.
//! The GPU backend compiles only the WGSL a bundle carries ([`wgsl_sources`]), after
//! [`super::reader::Bundle::open`] has checked every hash.
//!
//! # Translation
//!
//! naga is the version wgpu 30 compiles shaders with (one crate in `Cargo.lock`, recorded as
//! [`NAGA_VERSION`] by `build.rs`). For every module:
//!
//! 1. WGSL parsed by naga's front end and validated with every check
//!    (`ValidationFlags::all()`) and [`CAPABILITIES`], what the GPU context asks a device for
//!    (subgroup operations, in compute shaders). A module that does not parse or validate is an
//!    error naming it, never a skipped file.
//! 2. Overrides resolved to their defaults for the entry point `main` (compute), as wgpu-hal
//!    does before translating.
//! 3. MSL written by naga's back end with the options wgpu-hal's Metal backend uses for a
//!    pipeline made with wgpu's default runtime checks ([`default_msl_options`]): MSL 2.3
//!    ([`MSL_LANG_VERSION`]), bounds checks `restrict` (indices clamped) on indices, buffers
//!    and image loads, workgroup memory zero-initialized, loops bounded for the Metal compiler,
//!    integer division guarded. Bindings get buffer slots in `(group, binding)` order, 0, 1,
//!    ..., and the array-length buffer the bounds checks read the next slot, as wgpu-hal
//!    assigns them for a bind group layout that lists exactly the kernel's bindings. The
//!    manifest records all of it per file, so a Metal host knows what to bind where, and
//!    `convert verify` re-derives the bytes.
//!
//! MSL 2.3 (macOS 11, iOS 14): SIMD-group reductions (`simd_sum`, which `subgroupAdd` becomes)
//! exist since MSL 2.1 on macOS and 2.3 on iOS, and 2.3 is the first version on every OS that
//! runs the GPU families wgpu enables subgroups on (Apple7, Mac2). The MSL is generated and
//! checked against naga here, but never compiled by a Metal compiler (there is no Apple host in
//! the tests).
//!
//! Output is deterministic: modules sorted by name, each WGSL byte for byte as the registry
//! gives it, MSL from naga's deterministic writer, no timestamps.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use naga::back::msl;
use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy};
use naga::valid::{Capabilities, ModuleInfo, ValidationFlags, Validator};
use rayon::prelude::*;
use serde::Serialize;

use super::manifest::*;
use super::reader::Bundle;
use crate::runtime::gpu::kernels::KernelSource;

/// The version of naga (and so of wgpu's shader translator) this binary was built with.
pub const NAGA_VERSION: &str = env!("LOWBIT_NAGA_VERSION");

/// The Metal Shading Language version of the MSL files (module doc: why 2.3).
pub const MSL_LANG_VERSION: (u8, u8) = (2, 3);

/// The entry point every registry module has (a compute shader).
pub const ENTRY_POINT: &str = "main";

/// What WGSL modules may use: what [`crate::runtime::gpu::GpuContext::new`] asks a device for
/// (SUBGROUP), and unpack2x16float (SHADER_FLOAT16_IN_FLOAT32, wgpu's downlevel flag
/// SHADER_F16_IN_F32: the host runs `op_attention_decode`, its one user, only where the
/// adapter has it), and the `@coherent` decoration (MEMORY_DECORATION_COHERENT: the partials
/// of `op_attention_decode_combine_q8`, which the host runs only where the device has the
/// feature). A kernel that needs another feature adds its capability here and its feature
/// there.
pub const CAPABILITIES: Capabilities = Capabilities::SUBGROUP
    .union(Capabilities::SHADER_FLOAT16_IN_FLOAT32)
    .union(Capabilities::MEMORY_DECORATION_COHERENT);

/// `MAX_KERNEL_BYTES`: the largest kernel file accepted in a manifest (the registry's modules
/// are a few KiB; this bounds what naga is asked to parse).
pub const MAX_KERNEL_BYTES: u64 = 1 << 20;

/// `MAX_KERNEL_NAME`: the longest kernel name (file names stay far below 255 bytes).
pub const MAX_KERNEL_NAME: usize = 128;

/// `MAX_KERNEL_ENTRIES`: entries a manifest's `kernels` section may hold (the registry has
/// 161 modules today, two files each).
pub const MAX_KERNEL_ENTRIES: usize = 1 << 14;

/// `MAX_METAL_BUFFERS`: buffer slots of a Metal kernel's argument table (`[[buffer(0..30)]]`).
pub const MAX_METAL_BUFFERS: usize = 31;

/// Errors of the kernel files: a module that cannot be shipped, or a bundle whose kernels
/// cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// The bundle has no `kernels` section: made before kernels shipped in bundles.
    #[error("bundle {bundle} carries no GPU kernels (made before kernels shipped in bundles); add them with: {command}")]
    NoKernels { bundle: PathBuf, command: String },
    /// A name that is not `[A-Za-z0-9_]+` of at most [`MAX_KERNEL_NAME`] bytes, or one given
    /// twice.
    #[error("kernel {name:?}: {detail}")]
    Name { name: String, detail: String },
    /// A kernel file that cannot be read as its entry says (absent from the opened bundle,
    /// not UTF-8).
    #[error("{file}: {detail}")]
    File { file: String, detail: String },
    /// naga's WGSL front end refused the module.
    #[error("kernel {name}: the WGSL does not parse: {detail}")]
    Parse { name: String, detail: String },
    /// naga's validator refused the module (with [`CAPABILITIES`]).
    #[error("kernel {name}: the WGSL does not validate: {detail}")]
    Validate { name: String, detail: String },
    /// The module cannot be translated to MSL (no compute entry point `main`, a binding that
    /// is not a buffer, too many buffers, an option naga refuses).
    #[error("kernel {name}: no MSL translation: {detail}")]
    Msl { name: String, detail: String },
}

/// Whether `name` can name a kernel: `[A-Za-z0-9_]+`, at most [`MAX_KERNEL_NAME`] bytes.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_KERNEL_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The bundle path of a kernel's file: `kernels/{name}.wgsl`, `kernels/{name}.metal`.
pub fn kernel_path(name: &str, kind: KernelKind) -> String {
    format!("{KERNELS_DIR}/{name}.{}", kind.extension())
}

/// The MSL options of new bundles (module doc).
pub fn default_msl_options() -> MslOptions {
    MslOptions {
        lang_version: format!("{}.{}", MSL_LANG_VERSION.0, MSL_LANG_VERSION.1),
        bounds_checks: "restrict".into(),
        zero_initialize_workgroup_memory: true,
        force_loop_bounding: true,
        int_div_checks: true,
    }
}

/// A module parsed and validated by naga.
pub struct Parsed {
    pub module: naga::Module,
    pub info: ModuleInfo,
}

/// Parses `wgsl` and validates it with every check and [`CAPABILITIES`].
pub fn parse_and_validate(name: &str, wgsl: &str) -> Result<Parsed, KernelError> {
    let module = naga::front::wgsl::parse_str(wgsl).map_err(|e| KernelError::Parse {
        name: name.into(),
        detail: one_line(&e.emit_to_string(wgsl)),
    })?;
    let info = Validator::new(ValidationFlags::all(), CAPABILITIES)
        .validate(&module)
        .map_err(|e| KernelError::Validate {
            name: name.into(),
            detail: one_line(&e.emit_to_string(wgsl)),
        })?;
    Ok(Parsed { module, info })
}

/// naga's multi-line diagnostics on one line.
fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The compute entry point `main` of a module.
fn entry_point<'m>(
    name: &str,
    module: &'m naga::Module,
) -> Result<&'m naga::EntryPoint, KernelError> {
    entry_point_index(name, module).map(|i| &module.entry_points[i])
}

/// The index of [`entry_point`] among the module's entry points (naga's per-entry-point
/// analysis is indexed so).
fn entry_point_index(name: &str, module: &naga::Module) -> Result<usize, KernelError> {
    module
        .entry_points
        .iter()
        .position(|e| e.name == ENTRY_POINT && e.stage == naga::ShaderStage::Compute)
        .ok_or_else(|| KernelError::Msl {
            name: name.into(),
            detail: format!("no compute entry point {ENTRY_POINT:?}"),
        })
}

/// The `@group(0)` bindings that the compute entry point `main` of `p` uses (reads, writes
/// or queries, itself or in a function it calls), by naga's analysis: what wgpu-core keeps
/// in the bind group layout it derives from the module (a resource whose use by the entry
/// point is not empty).
pub fn used_bindings(
    name: &str,
    p: &Parsed,
) -> Result<std::collections::BTreeSet<u32>, KernelError> {
    let info = p.info.get_entry_point(entry_point_index(name, &p.module)?);
    Ok(p.module
        .global_variables
        .iter()
        .filter(|(h, _)| !info[*h].is_empty())
        .filter_map(|(_, var)| var.binding.as_ref())
        .filter(|rb| rb.group == 0)
        .map(|rb| rb.binding)
        .collect())
}

/// The buffer slots of a module's bindings (module doc) and the array-length buffer's slot.
fn buffer_slots(
    name: &str,
    module: &naga::Module,
) -> Result<(Vec<MslBuffer>, Option<u8>), KernelError> {
    let mut bindings = Vec::new();
    let mut any_storage = false;
    for (_, var) in module.global_variables.iter() {
        let Some(rb) = &var.binding else { continue };
        let mutable = match var.space {
            naga::AddressSpace::Uniform => false,
            naga::AddressSpace::Storage { access } => {
                any_storage = true;
                access.contains(naga::StorageAccess::STORE)
            }
            other => {
                return Err(KernelError::Msl {
                    name: name.into(),
                    detail: format!(
                        "@group({}) @binding({}) is in address space {other:?}; only uniform and storage buffers get Metal buffer slots here",
                        rb.group, rb.binding
                    ),
                })
            }
        };
        bindings.push((rb.group, rb.binding, mutable));
    }
    bindings.sort_unstable();
    let slots = bindings.len() + any_storage as usize;
    if slots > MAX_METAL_BUFFERS {
        return Err(KernelError::Msl {
            name: name.into(),
            detail: format!("{slots} buffer slots needed, Metal has {MAX_METAL_BUFFERS}"),
        });
    }
    let buffers = bindings
        .iter()
        .enumerate()
        .map(|(slot, &(group, binding, mutable))| MslBuffer {
            group,
            binding,
            slot: slot as u8,
            mutable,
        })
        .collect();
    Ok((buffers, any_storage.then_some(bindings.len() as u8)))
}

/// naga's options from a manifest's record; `None` names the field that holds a value this
/// build does not know.
fn naga_options(
    o: &MslOptions,
    buffers: &[MslBuffer],
    sizes_buffer: Option<u8>,
) -> Result<msl::Options, String> {
    let lang_version = o
        .lang_version
        .split_once('.')
        .and_then(|(a, b)| Some((a.parse::<u8>().ok()?, b.parse::<u8>().ok()?)))
        .ok_or_else(|| {
            format!(
                "options.lang_version {:?} is not MAJOR.MINOR",
                o.lang_version
            )
        })?;
    let policy = match o.bounds_checks.as_str() {
        "restrict" => BoundsCheckPolicy::Restrict,
        "read_zero_skip_write" => BoundsCheckPolicy::ReadZeroSkipWrite,
        "unchecked" => BoundsCheckPolicy::Unchecked,
        other => {
            return Err(format!(
                "options.bounds_checks {other:?} is not restrict, read_zero_skip_write or unchecked"
            ))
        }
    };
    let resources = buffers
        .iter()
        .map(|b| {
            (
                naga::ResourceBinding {
                    group: b.group,
                    binding: b.binding,
                },
                msl::BindTarget {
                    buffer: Some(b.slot),
                    mutable: b.mutable,
                    ..Default::default()
                },
            )
        })
        .collect();
    Ok(msl::Options {
        lang_version,
        per_entry_point_map: msl::EntryPointResourceMap::from([(
            ENTRY_POINT.to_string(),
            msl::EntryPointResources {
                resources,
                immediates_buffer: None,
                sizes_buffer,
            },
        )]),
        inline_samplers: Vec::new(),
        spirv_cross_compatibility: false,
        // A binding without a slot is an error, never invalid MSL.
        fake_missing_bindings: false,
        bounds_check_policies: BoundsCheckPolicies {
            index: policy,
            buffer: policy,
            image_load: policy,
            // wgpu-hal's Metal backend: no bounds checks on binding arrays.
            binding_array: BoundsCheckPolicy::Unchecked,
        },
        zero_initialize_workgroup_memory: o.zero_initialize_workgroup_memory,
        force_loop_bounding: o.force_loop_bounding,
        task_dispatch_limits: None,
        mesh_shader_primitive_indices_clamp: true,
        emit_int_div_checks: o.int_div_checks,
        ray_query_initialization_tracking: true,
    })
}

/// The MSL of a parsed module with `options` and the slots `buffers`/`sizes_buffer`, and the
/// MSL name of its entry point.
fn write_msl(
    name: &str,
    p: &Parsed,
    options: &MslOptions,
    buffers: &[MslBuffer],
    sizes_buffer: Option<u8>,
) -> Result<(String, String), KernelError> {
    let err = |detail: String| KernelError::Msl {
        name: name.into(),
        detail,
    };
    let opts = naga_options(options, buffers, sizes_buffer).map_err(err)?;
    let (module, info) = naga::back::pipeline_constants::process_overrides(
        &p.module,
        &p.info,
        Some((naga::ShaderStage::Compute, ENTRY_POINT)),
        &Default::default(),
    )
    .map_err(|e| err(format!("overrides: {e}")))?;
    let pipeline = msl::PipelineOptions {
        entry_point: Some((naga::ShaderStage::Compute, ENTRY_POINT.to_string())),
        allow_and_force_point_size: false,
        vertex_pulling_transform: false,
        vertex_buffer_mappings: Vec::new(),
        binding_array_length_map: Default::default(),
    };
    let (source, tinfo) =
        msl::write_string(&module, &info, &opts, &pipeline).map_err(|e| err(e.to_string()))?;
    let entry = match tinfo.entry_point_names.first() {
        Some(Ok(n)) => n.clone(),
        Some(Err(e)) => return Err(err(format!("entry point {ENTRY_POINT}: {e}"))),
        None => return Err(err(format!("no entry point {ENTRY_POINT} written"))),
    };
    Ok((source, entry))
}

/// A kernel file to write into a bundle and its manifest entry.
#[derive(Clone, Debug)]
pub struct KernelFile {
    pub entry: KernelEntry,
    pub bytes: Vec<u8>,
}

/// The WGSL and MSL files of `sources` (names unique and valid), sorted by name, then WGSL
/// before MSL. A module that does not parse, validate or translate is an error naming it.
pub fn translate_all(sources: &[KernelSource]) -> Result<Vec<KernelFile>, KernelError> {
    let mut sorted: Vec<&KernelSource> = sources.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = sorted.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(KernelError::Name {
            name: w[0].name.clone(),
            detail: "two modules of the registry have this name".into(),
        });
    }
    // One module per task (each is independent; about half a millisecond), joined in name
    // order, so the first error reported is the first module's by name.
    let per_module: Vec<Result<[KernelFile; 2], KernelError>> =
        sorted.par_iter().map(|k| translate_one(k)).collect();
    let mut out = Vec::with_capacity(2 * sorted.len());
    for r in per_module {
        out.extend(r?);
    }
    Ok(out)
}

/// The WGSL and MSL files of one module.
fn translate_one(k: &KernelSource) -> Result<[KernelFile; 2], KernelError> {
    if !valid_name(&k.name) {
        return Err(KernelError::Name {
            name: k.name.clone(),
            detail: format!(
                "a kernel name is [A-Za-z0-9_], 1 to {MAX_KERNEL_NAME} bytes (it names files)"
            ),
        });
    }
    let p = parse_and_validate(&k.name, &k.wgsl)?;
    let workgroup_size = entry_point(&k.name, &p.module)?.workgroup_size;
    let (buffers, sizes_buffer) = buffer_slots(&k.name, &p.module)?;
    let options = default_msl_options();
    let (source, entry_point) = write_msl(&k.name, &p, &options, &buffers, sizes_buffer)?;
    let file = |kind, bytes: Vec<u8>, msl| KernelFile {
        entry: KernelEntry {
            name: k.name.clone(),
            kind,
            file: kernel_path(&k.name, kind),
            bytes: bytes.len() as u64,
            sha256: crate::util::sha256_hex(&bytes),
            msl,
        },
        bytes,
    };
    Ok([
        file(KernelKind::Wgsl, k.wgsl.as_bytes().to_vec(), None),
        file(
            KernelKind::Msl,
            source.into_bytes(),
            Some(MslTranslation {
                from: kernel_path(&k.name, KernelKind::Wgsl),
                translator: "naga".into(),
                naga_version: NAGA_VERSION.into(),
                options,
                entry_point,
                workgroup_size,
                buffers,
                sizes_buffer,
            }),
        ),
    ])
}

/// The files of this binary's registry ([`crate::runtime::gpu::kernels::all`]).
pub fn current() -> Result<Vec<KernelFile>, KernelError> {
    translate_all(&crate::runtime::gpu::kernels::all())
}

/// The manifest's kernel entries that are not consistent in themselves or with `files`
/// (`paths`): a bad or repeated name, a file other than `kernels/{name}.{ext}` or not in the
/// file list, a malformed SHA256, a file over [`MAX_KERNEL_BYTES`], an MSL entry without its
/// translation record or WGSL, a file under `kernels/` that is no kernel's. For
/// [`super::reader::read_manifest`].
pub(crate) fn manifest_faults(m: &Manifest) -> Vec<String> {
    let mut v = Vec::new();
    if m.kernels.len() > MAX_KERNEL_ENTRIES {
        v.push(format!(
            "kernels: {} entries, more than the limit of {MAX_KERNEL_ENTRIES}",
            m.kernels.len()
        ));
        return v;
    }
    let paths: BTreeSet<&str> = m.files.iter().map(|f| f.path.as_str()).collect();
    let mut seen = BTreeSet::new();
    let wgsl: BTreeSet<&str> = m
        .kernels
        .iter()
        .filter(|k| k.kind == KernelKind::Wgsl)
        .map(|k| k.file.as_str())
        .collect();
    for k in &m.kernels {
        let what = format!("kernels entry {:?} ({})", k.name, k.kind.name());
        if !valid_name(&k.name) {
            v.push(format!(
                "{what}: a kernel name is [A-Za-z0-9_], 1 to {MAX_KERNEL_NAME} bytes"
            ));
            continue;
        }
        if !seen.insert((k.name.as_str(), k.kind)) {
            v.push(format!("{what}: listed twice"));
        }
        let want = kernel_path(&k.name, k.kind);
        if k.file != want {
            v.push(format!("{what}: file {:?}, expected {want:?}", k.file));
        } else if !paths.contains(k.file.as_str()) {
            v.push(format!("{what}: file {:?} is not in the file list", k.file));
        }
        if !is_sha256(&k.sha256) {
            v.push(format!(
                "{what}: malformed sha256 {:?} (expected 64 lowercase hex digits)",
                k.sha256
            ));
        }
        if k.bytes > MAX_KERNEL_BYTES {
            v.push(format!(
                "{what}: {} bytes is larger than the limit of {MAX_KERNEL_BYTES}",
                k.bytes
            ));
        }
        match (k.kind, &k.msl) {
            (KernelKind::Wgsl, Some(_)) => {
                v.push(format!("{what}: a WGSL entry has no msl record"))
            }
            (KernelKind::Msl, None) => v.push(format!("{what}: the msl record is missing")),
            (KernelKind::Msl, Some(t)) => {
                let from = kernel_path(&k.name, KernelKind::Wgsl);
                if t.from != from {
                    v.push(format!(
                        "{what}: translated from {:?}, expected the WGSL entry {from:?}",
                        t.from
                    ));
                } else if !wgsl.contains(from.as_str()) {
                    v.push(format!(
                        "{what}: translated from {from:?}, which the manifest does not list as a WGSL kernel"
                    ));
                }
            }
            (KernelKind::Wgsl, None) => {}
        }
    }
    let listed: BTreeSet<&str> = m.kernels.iter().map(|k| k.file.as_str()).collect();
    let prefix = format!("{KERNELS_DIR}/");
    for f in &m.files {
        if f.path.starts_with(&prefix) && !listed.contains(f.path.as_str()) {
            v.push(format!(
                "file {:?} is under {KERNELS_DIR}/ but is not in the kernels section",
                f.path
            ));
        }
    }
    v
}

/// Kernel entries whose size or SHA256 differs from the file list's, for
/// [`super::reader::check_integrity`] (the file list's are checked against the files).
pub(crate) fn integrity_faults(m: &Manifest) -> Vec<String> {
    let files: BTreeMap<&str, &FileEntry> = m.files.iter().map(|f| (f.path.as_str(), f)).collect();
    let mut v = Vec::new();
    for k in &m.kernels {
        if let Some(f) = files.get(k.file.as_str()) {
            if f.sha256.as_deref() != Some(k.sha256.as_str()) || f.size != k.bytes {
                v.push(format!(
                    "{}: the kernels section says {} bytes with sha256 {}, the file list {} bytes with sha256 {}",
                    k.file, k.bytes, k.sha256, f.size, f.sha256.as_deref().unwrap_or("(none)")
                ));
            }
        }
    }
    v
}

/// The command that adds this binary's kernels to the bundle at `dir`, ready to paste into a
/// POSIX shell.
pub fn add_kernels_command(dir: &Path) -> String {
    format!(
        "convert add-kernels {}",
        shell_word(&dir.display().to_string())
    )
}

/// `s` as one POSIX shell word: as it is when it holds only safe characters, else in single
/// quotes.
fn shell_word(s: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_-./+=:@,%".contains(c);
    if !s.is_empty() && s.chars().all(safe) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The WGSL modules a bundle carries, by name, after [`Bundle::open`]'s hash checks: what
/// [`crate::runtime::gpu::ContextOptions::sources`] takes. A bundle with none (made before
/// kernels shipped in bundles) is [`KernelError::NoKernels`], whose message gives the command
/// that adds them.
pub fn wgsl_sources(bundle: &Bundle) -> Result<HashMap<String, String>, KernelError> {
    let mut out = HashMap::new();
    for k in bundle
        .manifest
        .kernels
        .iter()
        .filter(|k| k.kind == KernelKind::Wgsl)
    {
        let bytes = bundle.file(&k.file).ok_or_else(|| KernelError::File {
            file: k.file.clone(),
            detail: "not among the opened bundle's files".into(),
        })?;
        let text = std::str::from_utf8(bytes).map_err(|e| KernelError::File {
            file: k.file.clone(),
            detail: format!("not UTF-8: {e}"),
        })?;
        out.insert(k.name.clone(), text.to_string());
    }
    if out.is_empty() {
        return Err(KernelError::NoKernels {
            bundle: bundle.dir.clone(),
            command: add_kernels_command(&bundle.dir),
        });
    }
    Ok(out)
}

/// One kernel file as `convert verify` judged it.
#[derive(Clone, Debug, Serialize)]
pub struct KernelCheck {
    pub name: String,
    /// `wgsl` or `msl`.
    pub kind: String,
    pub file: String,
    /// What was done: `parsed and validated` (WGSL), `re-derived` (MSL equal to naga's
    /// output with the recorded options), `not re-derived` (MSL from another naga version).
    pub check: String,
    pub passed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// `convert verify`'s kernel checks: every WGSL file parses and validates (with
/// [`CAPABILITIES`]); every MSL file equals what naga makes from its WGSL with the recorded
/// options and slots when the recorded naga version is this build's (else it is reported as
/// not re-derived). `file` gives a file's bytes (`None`: missing, already a failure of the
/// file checks). Returns the checks and notes (no kernels at all; kernels that differ from
/// this build's for the bundle's encodings), which are not failures.
pub fn check_kernels<'b>(
    m: &Manifest,
    bundle: &Path,
    file: &dyn Fn(&str) -> Option<&'b [u8]>,
) -> (Vec<KernelCheck>, Vec<String>) {
    let mut checks = Vec::new();
    let mut notes = Vec::new();
    if m.kernels.is_empty() {
        notes.push(format!(
            "no GPU kernels (a bundle made before kernels shipped in bundles): the CPU backend runs it, the GPU backend refuses it; add them with: {}",
            add_kernels_command(bundle)
        ));
        return (checks, notes);
    }
    // A file the file checks did not pass (missing, unreadable, or not the size or digest the
    // manifest lists) is not read here: that failure is reported once, above.
    const NOT_READ: &str =
        "not checked: the file is missing, unreadable or failed its size or digest check";
    let mut parsed: BTreeMap<&str, Parsed> = BTreeMap::new();
    let mut texts: BTreeMap<&str, &[u8]> = BTreeMap::new();
    let check = |k: &KernelEntry, what: &str, r: Result<(), String>| KernelCheck {
        name: k.name.clone(),
        kind: k.kind.name().into(),
        file: k.file.clone(),
        check: what.into(),
        passed: r.is_ok(),
        detail: r.err(),
    };
    for k in m.kernels.iter().filter(|k| k.kind == KernelKind::Wgsl) {
        let r = (|| {
            let bytes = file(&k.file).ok_or(NOT_READ)?;
            texts.insert(k.name.as_str(), bytes);
            let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
            let p = parse_and_validate(&k.name, text).map_err(|e| e.to_string())?;
            entry_point(&k.name, &p.module).map_err(|e| e.to_string())?;
            parsed.insert(k.name.as_str(), p);
            Ok(())
        })();
        checks.push(check(k, "parsed and validated", r));
    }
    for k in m.kernels.iter().filter(|k| k.kind == KernelKind::Msl) {
        let Some(t) = &k.msl else { continue };
        if t.naga_version != NAGA_VERSION {
            checks.push(check(k, "not re-derived", Ok(())));
            if let Some(c) = checks.last_mut() {
                c.detail = Some(format!(
                    "made by naga {}, this build has naga {NAGA_VERSION}",
                    t.naga_version
                ));
            }
            continue;
        }
        let r = (|| {
            let bytes = file(&k.file).ok_or(NOT_READ)?;
            let p = parsed
                .get(k.name.as_str())
                .ok_or_else(|| format!("its WGSL {} did not parse or validate", t.from))?;
            let ws = entry_point(&k.name, &p.module)
                .map_err(|e| e.to_string())?
                .workgroup_size;
            if ws != t.workgroup_size {
                return Err(format!(
                    "workgroup_size {:?} in the manifest, the WGSL says {ws:?}",
                    t.workgroup_size
                ));
            }
            let (source, entry) = write_msl(&k.name, p, &t.options, &t.buffers, t.sizes_buffer)
                .map_err(|e| e.to_string())?;
            if entry != t.entry_point {
                return Err(format!(
                    "entry_point {:?} in the manifest, naga names it {entry:?}",
                    t.entry_point
                ));
            }
            if source.as_bytes() != bytes {
                let at = source
                    .bytes()
                    .zip(bytes.iter())
                    .position(|(a, b)| a != *b)
                    .unwrap_or(source.len().min(bytes.len()));
                return Err(format!(
                    "differs from the MSL naga {NAGA_VERSION} makes from {} with the recorded options (first difference at byte {at}; {} bytes, naga's {})",
                    t.from,
                    bytes.len(),
                    source.len()
                ));
            }
            Ok(())
        })();
        checks.push(check(k, "re-derived", r));
    }
    // A WGSL module without its MSL: the bundle still runs through wgpu (which compiles the
    // WGSL), but a native Metal host has nothing to load. Informational, as below.
    let with_msl: std::collections::BTreeSet<&str> = m
        .kernels
        .iter()
        .filter(|k| k.kind == KernelKind::Msl)
        .map(|k| k.name.as_str())
        .collect();
    let no_msl: Vec<&str> = m
        .kernels
        .iter()
        .filter(|k| k.kind == KernelKind::Wgsl && !with_msl.contains(k.name.as_str()))
        .map(|k| k.name.as_str())
        .collect();
    if !no_msl.is_empty() {
        let shown = no_msl.len().min(3);
        notes.push(format!(
            "{} WGSL module(s) without their MSL ({}{}): wgpu runs the bundle, a native Metal host cannot load those; `convert add-kernels` writes them",
            no_msl.len(),
            no_msl[..shown].join(", "),
            if no_msl.len() > shown { ", ..." } else { "" }
        ));
    }
    // Against this build's kernels for the bundle's encodings (what `pack` would write):
    // informational (a bundle keeps the kernels it was made with; `add-kernels` replaces them).
    let registry = crate::runtime::gpu::kernels::for_tensors(&m.tensors);
    let mine: BTreeMap<&str, &[u8]> = registry
        .iter()
        .map(|k| (k.name.as_str(), k.wgsl.as_bytes()))
        .collect();
    let missing: Vec<&str> = mine
        .keys()
        .filter(|n| !texts.contains_key(*n))
        .copied()
        .collect();
    let extra: Vec<&str> = texts
        .keys()
        .filter(|n| !mine.contains_key(*n))
        .copied()
        .collect();
    let changed: Vec<&str> = texts
        .iter()
        .filter(|(n, b)| mine.get(*n).is_some_and(|m| m != *b))
        .map(|(n, _)| *n)
        .collect();
    if !(missing.is_empty() && extra.is_empty() && changed.is_empty()) {
        let part = |v: &[&str], what: &str| match v.len() {
            0 => format!("0 {what}"),
            n if n <= 3 => format!("{n} {what} ({})", v.join(", ")),
            n => format!("{n} {what} ({}, ...)", v[..3].join(", ")),
        };
        notes.push(format!(
            "the kernels differ from this build's for the bundle's encodings: {}, {}, {}; `convert add-kernels` replaces them with this build's",
            part(&missing, "missing"),
            part(&extra, "not among them"),
            part(&changed, "changed")
        ));
    }
    (checks, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_shell_words() {
        assert!(valid_name("ternary_matvec_r4_wg64_sg"));
        for bad in [
            "",
            "a.b",
            "../x",
            "a b",
            "é",
            &"x".repeat(MAX_KERNEL_NAME + 1),
        ] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        assert_eq!(shell_word("/tmp/a.bundle"), "/tmp/a.bundle");
        assert_eq!(shell_word("my model"), "'my model'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }

    #[test]
    fn every_registry_module_translates_and_lists_its_buffers() {
        let files = current().unwrap();
        let n = crate::runtime::gpu::kernels::all().len();
        assert_eq!(files.len(), 2 * n);
        for pair in files.chunks(2) {
            let (w, m) = (&pair[0], &pair[1]);
            assert_eq!(
                (w.entry.kind, m.entry.kind),
                (KernelKind::Wgsl, KernelKind::Msl)
            );
            let t = m.entry.msl.as_ref().unwrap();
            let text = std::str::from_utf8(&m.bytes).unwrap();
            assert!(
                text.contains(&format!("kernel void {}(", t.entry_point)),
                "{}",
                m.entry.name
            );
            assert!(text.starts_with("// language: metal2.3"));
            // Slots 0, 1, ... in (group, binding) order, the array-length buffer next.
            let mut order: Vec<(u32, u32)> =
                t.buffers.iter().map(|b| (b.group, b.binding)).collect();
            order.sort_unstable();
            assert_eq!(
                order,
                t.buffers
                    .iter()
                    .map(|b| (b.group, b.binding))
                    .collect::<Vec<_>>()
            );
            for (i, b) in t.buffers.iter().enumerate() {
                assert_eq!(b.slot as usize, i, "{}", m.entry.name);
                assert!(
                    text.contains(&format!("[[buffer({i})]]")),
                    "{}",
                    m.entry.name
                );
            }
            if let Some(s) = t.sizes_buffer {
                assert_eq!(s as usize, t.buffers.len(), "{}", m.entry.name);
            }
            let fused = ["_rms", "_swiglu"].iter().any(|f| m.entry.name.contains(f));
            if m.entry.name.starts_with("ternary_matvec_") && fused {
                // The fused decode variants (norm folded in: its weights too; SwiGLU over
                // the stacked gate/up rows); still exactly one buffer written.
                assert!(t.buffers.len() >= 5, "{}", m.entry.name);
                let written = t.buffers.iter().filter(|b| b.mutable).count();
                assert_eq!(written, 1, "{}", m.entry.name);
            } else if m.entry.name.starts_with("ternary_matvec_") {
                // Codes, scales, x, y, params; y the one it writes.
                assert_eq!(t.buffers.len(), 5, "{}", m.entry.name);
                let written: Vec<u32> = t
                    .buffers
                    .iter()
                    .filter(|b| b.mutable)
                    .map(|b| b.binding)
                    .collect();
                assert_eq!(written, [3], "{}", m.entry.name);
                assert_eq!(t.sizes_buffer, Some(5));
            }
        }
    }

    #[test]
    fn a_module_that_fails_is_an_error_naming_it() {
        let bad = |wgsl: &str| {
            translate_all(&[KernelSource {
                name: "broken_k".into(),
                wgsl: wgsl.into(),
            }])
            .unwrap_err()
        };
        let e = bad("fn main( {");
        assert!(matches!(e, KernelError::Parse { .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with("kernel broken_k: the WGSL does not parse"),
            "{e}"
        );
        let e = bad("@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }");
        assert!(
            matches!(e, KernelError::Parse { .. } | KernelError::Validate { .. }),
            "{e}"
        );
        let e = bad("@compute @workgroup_size(1) fn other() {}");
        assert!(
            e.to_string().contains("no compute entry point \"main\""),
            "{e}"
        );
        let e = translate_all(&[
            KernelSource {
                name: "k".into(),
                wgsl: "@compute @workgroup_size(1) fn main() {}".into(),
            },
            KernelSource {
                name: "k".into(),
                wgsl: "@compute @workgroup_size(1) fn main() {}".into(),
            },
        ])
        .unwrap_err();
        assert!(e.to_string().contains("two modules"), "{e}");
    }
}
