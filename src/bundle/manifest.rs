//! The bundle manifest (`manifest.json`), format `lowbit-bundle` version 3 (versions 1 and 2
//! are still read).
//!
//! The JSON Schemas are `schemas/bundle-manifest.v3.schema.json` (written),
//! `schemas/bundle-manifest.v2.schema.json` and `schemas/bundle-manifest.v1.schema.json`; these
//! types are their Rust form and refuse unknown fields when reading.
//!
//! # What the digests cover
//!
//! - **Version 3** (every writer): as version 2, except for a file that holds tensors (the
//!   weight file). Its `files` entry has no `sha256`; it has `tensors_sha256`, the SHA256 of
//!   its tensor table ([`tensor_table`]: one line `"<offset> <length> <sha256>\n"` per tensor
//!   in the file, by offset then length, each tensor's own SHA256 as its entry lists it), and every byte
//!   of the file outside its tensors must be zero. The file's content is then fixed by the
//!   tensor entries and the size alone, and each byte is hashed once (for its tensor), not
//!   twice (for its tensor and for the whole file, as in version 2); tensors can be hashed
//!   in parallel. Every other file (tokenizer, kernels) keeps its plain `sha256`.
//! - **Version 2**: `bundle_digest` is the SHA256 of the canonical content
//!   ([`super::canonical`]: RFC 8785 JSON canonicalization, integers kept exact) of the
//!   manifest without its `producer`, `bundle_digest` and `manifest_digest` members: the model
//!   configuration, functions, tensors, tokenizer reference, kernels and the file list with
//!   every file's size and SHA256, so it identifies what the bundle is and does not change
//!   with the lowbit revision that wrote it. `manifest_digest` is the SHA256 of the canonical
//!   content of the manifest without its `manifest_digest` member: everything, the producer
//!   and the bundle digest included. Both are recomputed by every reader
//!   ([`super::reader::open_manifest`]), so an edited manifest fails to open.
//! - **Version 1**: `bundle_digest` is the SHA256 of [`canonical_file_list`]; the manifest
//!   itself is covered by nothing (readers warn).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

/// `format` of every bundle manifest.
pub const FORMAT: &str = "lowbit-bundle";
/// The manifest format version this build writes (it also reads [`FORMAT_VERSION_2`] and
/// [`FORMAT_VERSION_1`]).
pub const FORMAT_VERSION: u32 = 3;
/// The second format version: digests over the manifest's content, and the weight file
/// listed with the plain SHA256 of its bytes.
pub const FORMAT_VERSION_2: u32 = 2;
/// The first format version: the bundle digest covers the files, not the manifest.
pub const FORMAT_VERSION_1: u32 = 1;
/// Every tensor, and the scales inside a ternary tensor, start at a multiple of this many
/// bytes in its weight file (wgpu's `min_storage_buffer_offset_alignment` is at most 256).
pub const ALIGNMENT: u64 = 256;
/// Name of the manifest inside a bundle directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Name of the weight file.
pub const WEIGHTS_FILE: &str = "weights.bin";
/// Name of the signature file (`convert sign`, [`super::sign`]): in the bundle directory but
/// never in `files`, so no digest covers it.
pub const SIGNATURE_FILE: &str = "signature.json";
/// Name of the tokenizer file.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub format_version: u32,
    pub producer: Producer,
    pub source: Source,
    pub model: ModelConfig,
    pub functions: BTreeMap<String, Function>,
    pub tensors: Vec<TensorEntry>,
    pub tokenizer: TokenizerRef,
    /// The GPU kernels the bundle carries (`kernels/`), sorted by name, then kind. Empty (the
    /// key absent) in bundles made before kernels shipped in bundles: those stay valid, run on
    /// the CPU, and get kernels from `convert add-kernels`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<KernelEntry>,
    pub files: Vec<FileEntry>,
    /// Versions 2 and 3: SHA256 of the canonical content of the manifest without `producer`,
    /// `bundle_digest` and `manifest_digest` ([`Manifest::digests`]). Version 1: SHA256 of
    /// [`canonical_file_list`] over `files`.
    pub bundle_digest: String,
    /// Versions 2 and 3: SHA256 of the canonical content of the manifest without
    /// `manifest_digest` ([`Manifest::digests`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_digest: Option<String>,
}

/// Top-level manifest members the version-2 `bundle_digest` leaves out: the producer (tool,
/// version, git revision, command line: how the bundle was made, not what it is) and the
/// digests themselves.
pub const BUNDLE_DIGEST_EXCLUDES: [&str; 3] = ["producer", "bundle_digest", "manifest_digest"];
/// Top-level manifest members the `manifest_digest` leaves out.
pub const MANIFEST_DIGEST_EXCLUDES: [&str; 1] = ["manifest_digest"];

/// The two digests of a version-2 or -3 manifest, computed from its content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Digests {
    pub bundle_digest: String,
    pub manifest_digest: String,
}

/// SHA256 of the canonical content of the JSON object `manifest` without the top-level
/// members named in `exclude`.
pub fn content_digest(manifest: &Json, exclude: &[&str]) -> String {
    let mut v = manifest.clone();
    if let Json::Object(o) = &mut v {
        for k in exclude {
            o.remove(*k);
        }
    }
    crate::util::sha256_hex(&super::canonical::to_vec(&v))
}

/// Both digests (versions 2 and 3) of a manifest given as JSON (as read from `manifest.json`).
pub fn digests_of_json(manifest: &Json) -> Digests {
    Digests {
        bundle_digest: content_digest(manifest, &BUNDLE_DIGEST_EXCLUDES),
        manifest_digest: content_digest(manifest, &MANIFEST_DIGEST_EXCLUDES),
    }
}

impl Manifest {
    /// Both digests (versions 2 and 3) of this manifest's content (whatever its stored digests say).
    pub fn digests(&self) -> Digests {
        let json = serde_json::to_value(self).expect("a manifest serializes to JSON");
        let bundle_digest = content_digest(&json, &BUNDLE_DIGEST_EXCLUDES);
        let mut json = json;
        json["bundle_digest"] = Json::String(bundle_digest.clone());
        Digests {
            bundle_digest,
            manifest_digest: content_digest(&json, &MANIFEST_DIGEST_EXCLUDES),
        }
    }

    /// Makes this a version-3 manifest and sets both digests from its content; what every
    /// writer does last, after the files are listed (each file holding tensors listed by its
    /// `tensors_sha256`, [`Manifest::weight_file_entry`]).
    pub fn seal(&mut self) {
        self.seal_as(FORMAT_VERSION);
    }

    /// [`Manifest::seal`] with the given version (2 or 3) recorded; the file entries must
    /// already be in that version's form. Tests write version-2 bundles with it.
    pub fn seal_as(&mut self, version: u32) {
        self.format_version = version;
        let d = self.digests();
        self.bundle_digest = d.bundle_digest;
        self.manifest_digest = Some(d.manifest_digest);
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Producer {
    pub tool: String,
    pub version: String,
    pub git_revision: String,
    /// The command that made the bundle, with input and output reduced to file names so the
    /// manifest does not depend on where the files were.
    pub command_line: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// `safetensors` or `lowbit-bundle` for those inputs; absent for a GGUF file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// The input's name (a file, or a bundle directory).
    pub file_name: String,
    /// Bytes of the input file (a bundle: of its files).
    pub size: u64,
    /// SHA256 of the input file (a bundle: its `bundle_digest`).
    pub sha256: String,
    /// Absent for inputs that are not GGUF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gguf_version: Option<u32>,
    pub architecture: String,
    pub tensor_count: u64,
}

/// Everything the runtime needs to build the model. Values come from the GGUF metadata
/// (`{arch}.*` keys); `hparams` keeps every one of those keys verbatim.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub architecture: String,
    pub n_layer: u64,
    pub n_embd: u64,
    pub n_ff: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub head_dim: u64,
    pub n_vocab: u64,
    /// `{arch}.context_length`: the context the model was trained for.
    pub n_ctx_train: u64,
    /// The context this bundle is built for: the `L` of `position_ids` and the KV cache.
    pub n_ctx: u64,
    pub norm_eps: f64,
    pub rope: RopeConfig,
    /// MiniCPM (and Granite-style) scales; absent for architectures without them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding_scale: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residual_scale: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_scale: Option<f64>,
    /// True when there is no `output.weight` and the head reuses `token_embd.weight`.
    pub tied_embeddings: bool,
    pub special_tokens: BTreeMap<String, u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    pub hparams: BTreeMap<String, Json>,
}

/// Largest `n_ctx` a bundle may declare (2^24 positions): the KV cache is allocated for all of
/// them when a bundle is loaded.
pub const MAX_CONTEXT: u64 = 1 << 24;

impl ModelConfig {
    /// The configuration's own consistency, before any tensor is looked at: dimensions of at
    /// least 1 (and small enough for their products to fit 64 bits), `n_head_kv` dividing
    /// `n_head`, `1 <= n_ctx <= min(n_ctx_train, MAX_CONTEXT)`, a finite positive `norm_eps`,
    /// RoPE values (finite positive base, even `dimension_count` of at most `head_dim`) and
    /// finite non-zero scales, a RoPE scaling type the runtime implements. On failure returns the field's name (as in the manifest's
    /// `model` object) and what is wrong. The shapes of the tensors against these values are
    /// checked where the model is built (`runtime::model::Model::new`, `verify`).
    pub fn check(&self) -> Result<(), (String, String)> {
        let bad = |field: &str, detail: String| Err((field.to_string(), detail));
        // 2^32 bounds each dimension so that products of two or three never overflow u64.
        let dim_cap = 1u64 << 32;
        for (field, v) in [
            ("n_layer", self.n_layer),
            ("n_embd", self.n_embd),
            ("n_ff", self.n_ff),
            ("n_head", self.n_head),
            ("n_head_kv", self.n_head_kv),
            ("head_dim", self.head_dim),
            ("n_vocab", self.n_vocab),
            ("n_ctx_train", self.n_ctx_train),
        ] {
            if v == 0 || v > dim_cap {
                return bad(field, format!("{v} must be between 1 and 2^32"));
            }
        }
        if !self.n_head.is_multiple_of(self.n_head_kv) {
            return bad(
                "n_head_kv",
                format!("{} does not divide n_head {}", self.n_head_kv, self.n_head),
            );
        }
        if self.n_ctx == 0 || self.n_ctx > self.n_ctx_train || self.n_ctx > MAX_CONTEXT {
            return bad(
                "n_ctx",
                format!(
                    "{} must be between 1 and the trained context n_ctx_train = {} (and at most 2^24)",
                    self.n_ctx, self.n_ctx_train
                ),
            );
        }
        if !(self.norm_eps.is_finite() && self.norm_eps > 0.0) {
            return bad(
                "norm_eps",
                format!("{} must be finite and positive", self.norm_eps),
            );
        }
        let r = &self.rope;
        if !(r.freq_base.is_finite() && r.freq_base > 0.0) {
            return bad(
                "rope.freq_base",
                format!("{} must be finite and positive", r.freq_base),
            );
        }
        if r.dimension_count == 0
            || r.dimension_count > self.head_dim
            || !r.dimension_count.is_multiple_of(2)
        {
            return bad(
                "rope.dimension_count",
                format!(
                    "{} must be even, at least 2 and at most head_dim {}",
                    r.dimension_count, self.head_dim
                ),
            );
        }
        if !matches!(r.scaling_type.as_str(), "none" | "linear" | "longrope") {
            return bad(
                "rope.scaling_type",
                format!(
                    "{:?} is not supported (none, linear, longrope; YaRN's ramp and mscale are not implemented)",
                    r.scaling_type
                ),
            );
        }
        for (field, v) in [
            ("rope.scaling_factor", r.scaling_factor),
            ("rope.attn_factor", r.attn_factor),
        ] {
            if let Some(v) = v {
                if !(v.is_finite() && v > 0.0) {
                    return bad(field, format!("{v} must be finite and positive"));
                }
            }
        }
        if r.original_context_length == Some(0) {
            return bad(
                "rope.original_context_length",
                "0 must be at least 1".into(),
            );
        }
        for (name, &id) in &self.special_tokens {
            if id >= self.n_vocab {
                return bad(
                    &format!("special_tokens.{name}"),
                    format!(
                        "{id} is outside the vocabulary (n_vocab = {})",
                        self.n_vocab
                    ),
                );
            }
        }
        for (field, v) in [
            ("embedding_scale", self.embedding_scale),
            ("residual_scale", self.residual_scale),
            ("logit_scale", self.logit_scale),
        ] {
            if let Some(v) = v {
                if !(v.is_finite() && v != 0.0) {
                    return bad(field, format!("{v} must be finite and non-zero"));
                }
            }
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RopeConfig {
    pub freq_base: f64,
    /// Rotated dimensions per head (`n_rot`).
    pub dimension_count: u64,
    /// `none`, `linear` or `longrope` (others, `yarn` among them, are refused).
    pub scaling_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling_factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_context_length: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_factor: Option<f64>,
    /// Tensor names of the LongRoPE frequency factors, when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factors_long: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factors_short: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freq_factors: Option<String>,
}

/// Default prefill buckets (`--prefill-buckets`): the lengths `S` of the bundle's
/// `prefill_S` functions, the static chunk lengths a prompt is run in.
pub const DEFAULT_PREFILL_BUCKETS: [u64; 3] = [16, 64, 256];

/// `MAX_PREFILL_BUCKETS`: prefill functions a bundle may declare (each is one compiled graph
/// on a static-shape device).
pub const MAX_PREFILL_BUCKETS: usize = 16;

/// A prefill bucket list valid for a context: non-empty, at most [`MAX_PREFILL_BUCKETS`],
/// strictly ascending, each between 1 and `n_ctx`. On failure, what is wrong.
pub fn check_prefill_buckets(buckets: &[u64], n_ctx: u64) -> Result<(), String> {
    if buckets.is_empty() {
        return Err("the list is empty".into());
    }
    if buckets.len() > MAX_PREFILL_BUCKETS {
        return Err(format!("more than {MAX_PREFILL_BUCKETS} buckets"));
    }
    if buckets.contains(&0) {
        return Err("a bucket of 0 tokens".into());
    }
    if let Some(w) = buckets.windows(2).find(|w| w[0] >= w[1]) {
        return Err(format!("not strictly ascending ({} then {})", w[0], w[1]));
    }
    if let Some(b) = buckets.iter().find(|&&b| b > n_ctx) {
        return Err(format!(
            "bucket {b} is larger than the context n_ctx = {n_ctx}"
        ));
    }
    Ok(())
}

/// [`DEFAULT_PREFILL_BUCKETS`] up to `n_ctx` (`[n_ctx]` when the context is shorter than the
/// smallest).
pub fn default_prefill_buckets(n_ctx: u64) -> Vec<u64> {
    let v: Vec<u64> = DEFAULT_PREFILL_BUCKETS
        .iter()
        .copied()
        .filter(|&b| b <= n_ctx)
        .collect();
    if v.is_empty() {
        vec![n_ctx]
    } else {
        v
    }
}

/// The lengths `S` of the `prefill_S` functions, ascending.
pub fn prefill_buckets(functions: &BTreeMap<String, Function>) -> Vec<u64> {
    let mut v: Vec<u64> = functions
        .keys()
        .filter_map(|k| k.strip_prefix("prefill_")?.parse().ok())
        .collect();
    v.sort_unstable();
    v
}

/// A function the bundle exposes: `main` (one decode step) and `prefill_S` (one chunk of `S`
/// tokens), each with its static shapes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Function {
    pub inputs: Vec<TensorSpec>,
    pub states: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: String,
    /// The largest shape.
    pub shape: Vec<u64>,
    /// Dimensions that may be smaller than `shape` at run time (1 up to the value in
    /// `shape`); empty for a fully static tensor.
    #[serde(default)]
    pub dynamic_dims: Vec<u64>,
    pub description: String,
}

/// One tensor in the bundle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorEntry {
    pub name: String,
    /// Row-major shape (GGML `ne` reversed).
    pub shape: Vec<u64>,
    /// The GGML type in the source file.
    pub source_type: String,
    pub source_type_id: u32,
    pub encoding: Encoding,
    pub file: String,
    /// Byte offset in `file`, a multiple of [`ALIGNMENT`].
    pub offset: u64,
    pub length: u64,
    pub sha256: String,
}

/// How a tensor's bytes encode its values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", deny_unknown_fields)]
pub enum Encoding {
    /// The source's GGML encoding, byte for byte.
    #[serde(rename = "gguf")]
    Gguf {
        ggml_type: String,
        ggml_type_id: u32,
        block_size: u64,
        type_size: u64,
    },
    /// 2-bit ternary codes and f16 block scales (layout in [`crate::ternary`]).
    #[serde(rename = "ternary2")]
    Ternary2 {
        /// Elements per scale (256).
        block_size: u64,
        /// Codes per little-endian u32 word (16).
        codes_per_word: u64,
        /// `recovered` from a TQ2_0/TQ1_0 source, or `ternarized` by `--ternarize`.
        origin: String,
        /// Offset and length of the codes, relative to the tensor's offset.
        codes_offset: u64,
        codes_length: u64,
        /// Offset and length of the f16 scales, relative to the tensor's offset.
        scales_offset: u64,
        scales_length: u64,
        scale_dtype: String,
        /// K % 512 == 0 and N % 32 == 0.
        fast_path: bool,
    },
    /// Palettized (`convert palettize`, layout in [`crate::palette`]): `2^bits` f16 entries
    /// per group of `group_size` rows, and one `bits`-bit index per weight.
    #[serde(rename = "palette")]
    Palette {
        bits: u32,
        /// `kmeans` or `uniform`.
        mode: String,
        /// Consecutive rows sharing one table.
        group_size: u64,
        table_dtype: String,
        /// Tables `[rows / group_size, 2^bits]` f16, relative to the tensor's offset (0).
        tables_offset: u64,
        tables_length: u64,
        /// Indices `[rows, row_bytes]`, relative to the tensor's offset.
        indices_offset: u64,
        indices_length: u64,
        /// `ceil(cols * bits / 8)`.
        row_bytes: u64,
        /// Sum over every weight of (reconstructed - source)^2, in f64.
        sse: f64,
        /// Max |reconstructed - source|.
        max_abs_err: f64,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerRef {
    pub file: String,
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece), ...
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre: Option<String>,
    pub n_vocab: u64,
}

/// Folder of a bundle's GPU kernels; it holds nothing but the files of the `kernels` section.
pub const KERNELS_DIR: &str = "kernels";

/// One file of a bundle's GPU kernels (`crate::bundle::kernels`): a WGSL module of the
/// registry ([`crate::runtime::gpu::kernels::all`]) or the MSL naga translated it to. The
/// file is also listed in `files`, so the bundle digest covers it as it covers the weights.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelEntry {
    /// The module's name, `[A-Za-z0-9_]` only, carrying its parameters
    /// (`ternary_matvec_r4_wg64_sg`).
    pub name: String,
    pub kind: KernelKind,
    /// `kernels/{name}.wgsl` or `kernels/{name}.metal`.
    pub file: String,
    /// The file's size in bytes (as in `files`).
    pub bytes: u64,
    /// The file's SHA256 (as in `files`).
    pub sha256: String,
    /// How the MSL was made; present exactly when `kind` is `msl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub msl: Option<MslTranslation>,
}

/// What a kernel file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelKind {
    /// WGSL, what wgpu compiles on every backend (Vulkan, Metal, DX12).
    Wgsl,
    /// Metal Shading Language for native Metal hosts, translated from the WGSL by naga.
    Msl,
}

impl KernelKind {
    /// The file extension: `wgsl`, `metal`.
    pub fn extension(self) -> &'static str {
        match self {
            KernelKind::Wgsl => "wgsl",
            KernelKind::Msl => "metal",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KernelKind::Wgsl => "wgsl",
            KernelKind::Msl => "msl",
        }
    }
}

/// How an MSL kernel was translated: with these, the same naga version makes the same bytes
/// from the WGSL (`convert verify` checks that).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MslTranslation {
    /// The WGSL file it was translated from (`kernels/{name}.wgsl`).
    pub from: String,
    /// `naga`.
    pub translator: String,
    /// The naga version (the one wgpu compiles shaders with, from `Cargo.lock`).
    pub naga_version: String,
    pub options: MslOptions,
    /// The MSL function's name: naga renames WGSL's entry point `main` (reserved in Metal's
    /// C++) to `main_`.
    pub entry_point: String,
    /// Threads per threadgroup `[x, y, z]` (WGSL's `@workgroup_size`), which a Metal host
    /// passes at dispatch.
    pub workgroup_size: [u32; 3],
    /// Where each WGSL binding is in the MSL: `[[buffer(slot)]]`.
    pub buffers: Vec<MslBuffer>,
    /// The `[[buffer(slot)]]` of the array-length buffer naga's bounds checks read (one
    /// `uint` per storage buffer, in `buffers` order); absent when the kernel has no storage
    /// buffer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sizes_buffer: Option<u8>,
}

/// naga's MSL writer options that change its output, as recorded in a manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MslOptions {
    /// Metal Shading Language version, `"2.3"`.
    pub lang_version: String,
    /// naga's bounds-check policy for indices and buffers: `restrict` (clamp, wgpu's default
    /// with runtime checks), `read_zero_skip_write` or `unchecked`.
    pub bounds_checks: String,
    /// Workgroup memory zeroed at the start (wgpu's default).
    pub zero_initialize_workgroup_memory: bool,
    /// Loops made provably finite for the Metal compiler (wgpu's default).
    pub force_loop_bounding: bool,
    /// Integer division and remainder guarded against zero and overflow (wgpu's default).
    pub int_div_checks: bool,
}

/// One WGSL binding of an MSL kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MslBuffer {
    pub group: u32,
    pub binding: u32,
    pub slot: u8,
    /// A storage buffer the kernel writes (`read_write`).
    pub mutable: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Relative path inside the bundle, `/`-separated, no `..`.
    pub path: String,
    pub size: u64,
    /// SHA256 of the file's bytes: every file of versions 1 and 2; in version 3 every file
    /// that holds no tensor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Version 3, a file that holds tensors: SHA256 of its [`tensor_table`]; every byte outside
    /// its tensors is zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensors_sha256: Option<String>,
}

impl FileEntry {
    /// An entry with the plain SHA256 of the file's bytes.
    pub fn hashed(path: impl Into<String>, size: u64, sha256: impl Into<String>) -> FileEntry {
        FileEntry {
            path: path.into(),
            size,
            sha256: Some(sha256.into()),
            tensors_sha256: None,
        }
    }

    /// What identifies the content, for messages: `sha256 HEX` or `tensors_sha256 HEX`.
    pub fn digest_text(&self) -> String {
        match (&self.sha256, &self.tensors_sha256) {
            (Some(h), _) => format!("sha256 {h}"),
            (None, Some(h)) => format!("tensors_sha256 {h}"),
            (None, None) => "no digest".into(),
        }
    }
}

impl Manifest {
    /// Whether some tensor lives in the bundle file `path` (a weight file).
    pub fn holds_tensors(&self, path: &str) -> bool {
        self.tensors.iter().any(|t| t.file == path)
    }

    /// The version-3 entry of `path`, a file of `size` bytes holding tensors: its
    /// `tensors_sha256` over this manifest's entries of the tensors in it.
    pub fn weight_file_entry(&self, path: &str, size: u64) -> FileEntry {
        FileEntry {
            path: path.into(),
            size,
            sha256: None,
            tensors_sha256: Some(crate::util::sha256_hex(
                tensor_table(&self.tensors, path).as_bytes(),
            )),
        }
    }
}

/// The text a version-3 file entry's `tensors_sha256` is the SHA256 of: one line per tensor
/// whose `file` is `path`, sorted by offset (then length),
/// `"<offset> <length> <sha256>\n"` (decimal byte offset and length in the file, the tensor
/// entry's lowercase hex SHA256).
pub fn tensor_table(tensors: &[TensorEntry], path: &str) -> String {
    let mut rows: Vec<&TensorEntry> = tensors.iter().filter(|t| t.file == path).collect();
    rows.sort_by_key(|t| (t.offset, t.length));
    let mut s = String::new();
    for t in rows {
        s.push_str(&format!("{} {} {}\n", t.offset, t.length, t.sha256));
    }
    s
}

/// The text the version-1 bundle digest is the SHA256 of: one line per file, sorted by path,
/// `"<sha256> <size> <path>\n"`. `manifest.json` itself is not in the list.
pub fn canonical_file_list(files: &[FileEntry]) -> String {
    let mut sorted: Vec<&FileEntry> = files.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    let mut s = String::new();
    for f in sorted {
        s.push_str(&format!(
            "{} {} {}\n",
            f.sha256.as_deref().unwrap_or_default(),
            f.size,
            f.path
        ));
    }
    s
}

/// Whether `s` is a lowercase hex SHA256.
pub fn is_sha256(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}
