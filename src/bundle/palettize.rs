//! `convert palettize`: a bundle whose weight matrices are palettized ([`crate::palette`]).
//!
//! Inputs:
//! - a GGUF file: every tensor dequantized (bit-exact with gguf-py) before palettization;
//! - a safetensors file (F32, F16, BF16) with `config.json` and `tokenizer.json` beside it, as
//!   `convert dequantize --with-config` writes them (GGUF tensor names; the model
//!   configuration and tokenizer in lowbit's form);
//! - a bundle: its non-ternary matrices are palettized, ternary and already-palettized
//!   tensors are kept as they are.
//!
//! Tensors are written in a canonical order (tensors outside `blk.N.` first, then by layer,
//! each by name), so the same values give the same bundle whatever the input's order:
//! palettizing a GGUF and `convert dequantize`'s safetensors of it give byte-identical
//! `weights.bin` and `tokenizer.json` (the same `files`); the manifests differ in `source`,
//! `producer.command_line` and each tensor's `source_type`, so their bundle digests, which
//! cover the manifest, differ.
//!
//! Selection (as coremltools' `weight_threshold`): 2-D `*.weight` tensors with more than
//! `min_elements` elements, not norms or RoPE factors, matching `--include` (if any) and no
//! `--exclude` glob. Others are carried unchanged (safetensors values as GGML F32/F16/BF16).
//!
//! Layout of a palettized tensor: indices first (`rows * row_bytes`, offset 0), zero padding
//! to [`ALIGNMENT`], then the tables (`n_groups * 2^bits` f16). Groups are processed on a
//! rayon pool of `workers` threads in batches joined in order, so the output does not depend
//! on `workers`; memory is the packed indices of one batch plus its f32 rows.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use rayon::prelude::*;
use safetensors::tensor::{Dtype, Metadata};
use safetensors::SafeTensors;
use sha2::{Digest, Sha256};

use super::manifest::*;
use super::reader::Bundle;
use super::writer::{io_err, Staging, WeightWriter};
use super::{config, hf, BundleError};
use crate::ggml::GgmlType;
use crate::gguf::GgufFile;
use crate::palette::{self, Arith, Mode};
use crate::quant;
use crate::util;

/// `MAX_WORKERS`: more palettization threads than this are refused (more than any machine's
/// cores; each thread costs a stack and a kernel task).
pub const MAX_WORKERS: usize = 1024;

/// `--min-elements` default: coremltools' `weight_threshold` default (2048).
pub const DEFAULT_MIN_ELEMENTS: u64 = 2048;

#[derive(Clone, Debug)]
pub struct PalettizeOptions {
    pub bits: u32,
    pub mode: Mode,
    /// Rows per table; `None`: one table per tensor.
    pub group_size: Option<u64>,
    /// Threads (`None`: rayon's default, one per core).
    pub workers: Option<usize>,
    pub min_elements: u64,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    pub context: Option<u64>,
    /// Prefill buckets (`prefill_S` functions); `None` = the defaults up to the context.
    pub prefill_buckets: Option<Vec<u64>>,
    pub quiet: bool,
}

/// What [`palettize`] did.
#[derive(Clone, Debug)]
pub struct PalettizeSummary {
    pub tensors: usize,
    pub palettized: usize,
    pub sse: f64,
    pub max_abs_err: f64,
    pub weights_bytes: u64,
    pub bundle_digest: String,
}

/// One input tensor, by its GGUF name, row-major shape.
struct InTensor {
    name: String,
    shape: Vec<u64>,
    source_type: GgmlType,
    loc: Loc,
    /// Where a mapped tensor comes from (`"<Hugging Face name> in <shard>"`), for messages.
    origin: Option<String>,
}

impl InTensor {
    /// The name for messages: the GGUF name, and the checkpoint's when it was mapped.
    fn label(&self) -> String {
        match &self.origin {
            Some(o) => format!("{} ({o})", self.name),
            None => self.name.clone(),
        }
    }
}

enum Loc {
    Gguf(usize),
    /// Bytes `start..end` of shard `shard`; `permute`: a Hugging Face q/k weight whose rows are
    /// permuted for this many heads ([`hf::permuted_row`]).
    Safetensors {
        shard: usize,
        start: usize,
        end: usize,
        permute: Option<usize>,
    },
    /// A tensor a Hugging Face checkpoint keeps in `config.json` (F32 bytes).
    Extra(usize),
    Bundle(usize),
}

/// One safetensors file of a checkpoint.
struct Shard {
    path: PathBuf,
    map: Mmap,
    data_start: usize,
    meta: Metadata,
}

#[allow(clippy::large_enum_variant)]
enum Input {
    Gguf(GgufFile),
    Safetensors {
        shards: Vec<Shard>,
        model: ModelConfig,
        tokenizer: TokenizerRef,
        tokenizer_bytes: Vec<u8>,
        /// Hugging Face tensor names (mapped to GGUF's), with the head counts of q and k and
        /// whether their rows are permuted.
        hf: Option<(usize, usize, bool)>,
        /// GGUF-named F32 tensors made from config.json.
        extra: Vec<(String, Vec<u8>)>,
    },
    Bundle(Bundle),
}

fn terr(file: &Path, tensor: &str, detail: impl Into<String>) -> BundleError {
    BundleError::Tensor {
        file: file.to_path_buf(),
        tensor: tensor.to_string(),
        detail: detail.into(),
    }
}

/// Canonical order: non-block tensors by name, then `blk.N.*` by N, then name.
fn order_key(name: &str) -> (u64, String) {
    let mut p = name.split('.');
    if let (Some("blk"), Some(n)) = (p.next(), p.next()) {
        if let Ok(n) = n.parse::<u64>() {
            return (n + 1, name.to_string());
        }
    }
    (0, name.to_string())
}

/// The set of `--include` or `--exclude` globs (`flag`); each must match a tensor.
fn glob_set(
    input: &Path,
    tensors: &[InTensor],
    globs: &[String],
    flag: &str,
) -> Result<globset::GlobSet, BundleError> {
    util::glob_set_matching(globs, tensors.iter().map(|t| t.name.as_str())).map_err(|f| match f {
        util::GlobFault::Bad { glob, detail } => BundleError::Manifest {
            path: PathBuf::from(flag),
            detail: format!("{flag} {glob:?}: {detail}"),
        },
        util::GlobFault::NoMatch { glob } => BundleError::Manifest {
            path: input.to_path_buf(),
            detail: format!("{flag} {glob:?} matches no tensor"),
        },
    })
}

/// The `config.json` `convert dequantize --with-config` writes beside a safetensors file.
pub fn sidecar_config(model: &ModelConfig, tokenizer: &TokenizerRef) -> serde_json::Value {
    serde_json::json!({
        "model_type": model.architecture,
        "hidden_size": model.n_embd,
        "intermediate_size": model.n_ff,
        "num_hidden_layers": model.n_layer,
        "num_attention_heads": model.n_head,
        "num_key_value_heads": model.n_head_kv,
        "vocab_size": model.n_vocab,
        "tie_word_embeddings": model.tied_embeddings,
        "lowbit": { "model": model, "tokenizer": tokenizer },
    })
}

/// A safetensors file's JSON header: the bytes after its 8-byte little-endian length, where
/// the file holds them.
fn header_bytes(map: &[u8]) -> Option<&[u8]> {
    let n = u64::from_le_bytes(map.get(..8)?.try_into().ok()?);
    let end = usize::try_from(n).ok()?.checked_add(8)?;
    map.get(8..end)
}

/// The first name a safetensors header lists twice, if any. The `safetensors` crate reads
/// the header into a map, where the last of two entries wins (and when they point at
/// different bytes its offset check then blames a neighbouring tensor), so the header's keys
/// are walked here first. A header that is not a JSON object, or is cut short, gives `None`:
/// the crate's own reader reports that.
fn duplicate_header_name(map: &[u8]) -> Option<String> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    struct Keys;
    impl<'de> Visitor<'de> for Keys {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a safetensors header object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Option<String>, A::Error> {
            // Read to the end (serde_json checks that the object is closed), keep the first.
            let mut seen = std::collections::HashSet::new();
            let mut first = None;
            while let Some(k) = m.next_key::<String>()? {
                m.next_value::<IgnoredAny>()?;
                if !seen.insert(k.clone()) && first.is_none() {
                    first = Some(k);
                }
            }
            Ok(first)
        }
    }
    serde_json::Deserializer::from_slice(header_bytes(map)?)
        .deserialize_map(Keys)
        .ok()
        .flatten()
}

/// The first tensor of a safetensors header that the format refuses, and why, for the
/// errors of `SafeTensors::read_metadata` that name none (a dtype it does not know, a shape
/// whose bytes are not its span, a span that leaves a gap or overlaps the one before, a size
/// that overflows): entries in the order of their offsets, as the crate checks them. `None`
/// where the header is not a JSON object or every entry passes (the error is the file's).
fn header_culprit(map: &[u8]) -> Option<(String, String)> {
    use safetensors::tensor::TensorInfo;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(header_bytes(map)?).ok()?;
    let mut infos = Vec::new();
    for (name, v) in header.into_iter().filter(|(k, _)| k != "__metadata__") {
        match serde_path_to_error::deserialize::<_, TensorInfo>(v) {
            Ok(info) => infos.push((name, info)),
            Err(e) => return Some((name, super::reader::field_error(&e))),
        }
    }
    infos.sort_by_key(|(_, i)| i.data_offsets);
    let mut at = 0usize;
    for (name, i) in infos {
        let (s, e) = i.data_offsets;
        if s != at || e < s {
            return Some((
                name,
                format!("data_offsets [{s}, {e}] do not start where the tensor before ends ({at})"),
            ));
        }
        at = e;
        let bits = i
            .shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(i.dtype.bitsize()));
        match bits {
            None => return Some((name, format!("shape {:?} overflows", i.shape))),
            Some(b) if b % 8 != 0 || b / 8 != e - s => {
                return Some((
                    name,
                    format!(
                        "shape {:?} of {:?} is {b} bits; data_offsets [{s}, {e}] hold {} bytes",
                        i.shape,
                        i.dtype,
                        e - s
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    None
}

fn open_shard(path: &Path) -> Result<Shard, BundleError> {
    let f = util::open_input(path).map_err(io_err(path))?;
    // SAFETY: read-only map of a file we do not modify; see crate::gguf for the caveat.
    let map = unsafe { Mmap::map(&f) }.map_err(io_err(path))?;
    if let Some(name) = duplicate_header_name(&map) {
        return Err(terr(
            path,
            &name,
            "listed twice in the safetensors header (a reader keeps only one of them)",
        ));
    }
    let (n, meta) = SafeTensors::read_metadata(&map).map_err(|e| match header_culprit(&map) {
        Some((name, detail)) => terr(path, &name, format!("{detail} ({e})")),
        None => BundleError::Manifest {
            path: path.to_path_buf(),
            detail: format!("not a valid safetensors file: {e}"),
        },
    })?;
    Ok(Shard {
        path: path.to_path_buf(),
        map,
        data_start: 8 + n,
        meta,
    })
}

/// The safetensors files of a checkpoint: `path` itself, or for a sharded checkpoint's
/// `*.safetensors.index.json` every file its `weight_map` names (beside it), sorted.
#[allow(clippy::type_complexity)]
fn shard_paths(
    path: &Path,
    dir: &Path,
) -> Result<(Vec<PathBuf>, Option<BTreeMap<String, String>>), BundleError> {
    if !path.to_string_lossy().ends_with(".index.json") {
        return Ok((vec![path.to_path_buf()], None));
    }
    let bad = |detail: String| BundleError::Manifest {
        path: path.to_path_buf(),
        detail,
    };
    let bytes = crate::util::read_input(path).map_err(io_err(path))?;
    let idx: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
    let map = idx
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no \"weight_map\" object".into()))?;
    let mut files = std::collections::BTreeSet::new();
    let mut names = BTreeMap::new();
    for (name, f) in map {
        let f = f
            .as_str()
            .ok_or_else(|| bad(format!("weight_map[{name:?}] is not a file name")))?;
        if f.is_empty() || f.contains('/') || f.contains('\\') || f == "." || f == ".." {
            return Err(bad(format!(
                "weight_map[{name:?}] = {f:?} is not a file beside the index"
            )));
        }
        files.insert(f.to_string());
        names.insert(name.clone(), f.to_string());
    }
    if files.is_empty() {
        return Err(bad("the weight_map names no tensor (no shards)".into()));
    }
    Ok((
        files.into_iter().map(|f| dir.join(f)).collect(),
        Some(names),
    ))
}

/// Every tensor of every shard is where the index says, and every tensor the index lists is
/// in its shard.
fn check_weight_map(
    index: &Path,
    shards: &[Shard],
    map: &BTreeMap<String, String>,
) -> Result<(), BundleError> {
    let bad = |detail: String| BundleError::Manifest {
        path: index.to_path_buf(),
        detail,
    };
    let mut seen = std::collections::BTreeSet::new();
    for sh in shards {
        let file = sh
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for (name, _) in sh.meta.tensors() {
            match map.get(&name) {
                Some(f) if *f == file => {}
                Some(f) => {
                    return Err(bad(format!(
                        "{name:?} is in {file}, but the weight_map says {f}"
                    )))
                }
                None => {
                    return Err(bad(format!(
                        "{name:?} is in {file}, but not in the weight_map"
                    )))
                }
            }
            if !seen.insert(name.clone()) {
                return Err(bad(format!("{name:?} is in more than one shard")));
            }
        }
    }
    if let Some(name) = map.keys().find(|n| !seen.contains(*n)) {
        return Err(bad(format!(
            "{name:?} is in the weight_map but in no shard ({})",
            map[name]
        )));
    }
    Ok(())
}

fn open_safetensors(path: &Path, context: Option<u64>) -> Result<Input, BundleError> {
    let dir = util::parent_dir(path);
    let (paths, weight_map) = shard_paths(path, &dir)?;
    let shards = paths
        .iter()
        .map(|p| open_shard(p))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(map) = &weight_map {
        check_weight_map(path, &shards, map)?;
    }
    let cpath = dir.join("config.json");
    let cbytes = crate::util::read_input(&cpath).map_err(|e| BundleError::Manifest {
        path: cpath.clone(),
        detail: format!("a safetensors input needs config.json beside it ({e})"),
    })?;
    let cjson: serde_json::Value =
        serde_json::from_slice(&cbytes).map_err(|e| BundleError::Manifest {
            path: cpath.clone(),
            detail: e.to_string(),
        })?;
    let Some(lb) = cjson.get("lowbit") else {
        if !hf::is_hf_config(&cjson) {
            return Err(BundleError::Manifest {
                path: cpath.clone(),
                detail: "neither a Hugging Face configuration (model_type, architectures) nor one written by `convert dequantize --with-config` (a \"lowbit\" section)".into(),
            });
        }
        let embedding = shards.iter().find_map(|s| {
            s.meta
                .tensors()
                .into_iter()
                .find(|(n, _)| n == "model.embed_tokens.weight")
                .and_then(|(_, i)| match i.shape.as_slice() {
                    [r, c] => Some((*r as u64, *c as u64)),
                    _ => None,
                })
        });
        let mut m = hf::load(&dir, &cpath, &cjson, context, embedding)?;
        // As in the GGUF: tied when there is no separate head.
        let has_head = shards
            .iter()
            .any(|s| s.meta.tensors().iter().any(|(n, _)| n == "lm_head.weight"));
        if m.model.tied_embeddings && has_head {
            // transformers would tie the head to the embedding and ignore lm_head.weight.
            return Err(BundleError::HfConfig {
                file: cpath.clone(),
                key: "tie_word_embeddings".into(),
                detail: "true, but the checkpoint has an lm_head.weight (transformers would ignore it); remove the tensor or set tie_word_embeddings to false".into(),
            });
        }
        m.model.tied_embeddings = !has_head;
        let extra = m
            .extra
            .iter()
            .map(|(n, v)| (n.clone(), v.iter().flat_map(|x| x.to_le_bytes()).collect()))
            .collect();
        return Ok(Input::Safetensors {
            shards,
            model: m.model,
            tokenizer: m.tokenizer,
            tokenizer_bytes: m.tokenizer_bytes,
            hf: Some((m.n_head, m.n_head_kv, m.permute_qk)),
            extra,
        });
    };
    let parse = |key: &str| {
        lb.get(key).cloned().ok_or_else(|| BundleError::Manifest {
            path: cpath.clone(),
            detail: format!("lowbit.{key} missing"),
        })
    };
    let model: ModelConfig =
        serde_path_to_error::deserialize(parse("model")?).map_err(|e| BundleError::Manifest {
            path: cpath.clone(),
            detail: super::reader::field_error_under("lowbit.model", &e),
        })?;
    let tokenizer: TokenizerRef =
        serde_path_to_error::deserialize(parse("tokenizer")?).map_err(|e| {
            BundleError::Manifest {
                path: cpath.clone(),
                detail: super::reader::field_error_under("lowbit.tokenizer", &e),
            }
        })?;
    let tpath = dir.join(TOKENIZER_FILE);
    let tokenizer_bytes = crate::util::read_input(&tpath).map_err(|e| BundleError::Manifest {
        path: tpath.clone(),
        detail: format!("a safetensors input needs tokenizer.json beside it ({e})"),
    })?;
    Ok(Input::Safetensors {
        shards,
        model,
        tokenizer,
        tokenizer_bytes,
        hf: None,
        extra: Vec::new(),
    })
}

/// A sharded checkpoint's fingerprint: the SHA256 of one line `"<sha256> <size> <file>\n"`
/// per shard, sorted by file name (as a bundle digest lists its files).
fn shards_digest(paths: &[PathBuf]) -> std::io::Result<String> {
    let mut lines = Vec::new();
    for p in paths {
        let size = std::fs::metadata(p)?.len();
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        lines.push(format!("{} {size} {name}\n", util::sha256_file(p)?));
    }
    lines.sort();
    Ok(util::sha256_hex(lines.concat().as_bytes()))
}

/// A Hugging Face checkpoint's tensors against its config.json: every tensor the architecture
/// needs for layers `0..num_hidden_layers`, each of the shape the configuration implies, and
/// no layer past the last, before anything is read or written.
fn check_hf_tensors(
    input: &Path,
    m: &ModelConfig,
    tensors: &[InTensor],
) -> Result<(), BundleError> {
    let by: BTreeMap<&str, &InTensor> = tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let (e, hd, ff) = (m.n_embd, m.head_dim, m.n_ff);
    let (q, kv) = (m.n_head * hd, m.n_head_kv * hd);
    let want = |name: &str, shape: &[u64]| -> Result<(), BundleError> {
        match by.get(name) {
            None => Err(terr(
                input,
                name,
                format!(
                    "missing (config.json: {} layers, hidden_size {e}, {} heads, {} KV heads, head_dim {hd})",
                    m.n_layer, m.n_head, m.n_head_kv
                ),
            )),
            Some(t) if t.shape != shape => Err(terr(
                input,
                &t.label(),
                format!("shape {:?}, but config.json implies {shape:?}", t.shape),
            )),
            Some(_) => Ok(()),
        }
    };
    want("token_embd.weight", &[m.n_vocab, e])?;
    want("output_norm.weight", &[e])?;
    if by.contains_key("output.weight") {
        want("output.weight", &[m.n_vocab, e])?;
    }
    for l in 0..m.n_layer {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        want(&n("attn_norm"), &[e])?;
        want(&n("ffn_norm"), &[e])?;
        want(&n("attn_q"), &[q, e])?;
        want(&n("attn_k"), &[kv, e])?;
        want(&n("attn_v"), &[kv, e])?;
        want(&n("attn_output"), &[e, q])?;
        want(&n("ffn_gate"), &[ff, e])?;
        want(&n("ffn_up"), &[ff, e])?;
        want(&n("ffn_down"), &[e, ff])?;
    }
    if let Some(t) = tensors.iter().find(|t| order_key(&t.name).0 > m.n_layer) {
        return Err(terr(
            input,
            &t.label(),
            format!("a layer past config.json's num_hidden_layers {}", m.n_layer),
        ));
    }
    Ok(())
}

/// Names a Hugging Face checkpoint may hold that the model does not use (buffers).
fn hf_ignored(name: &str) -> bool {
    name.ends_with(".rotary_emb.inv_freq")
}

impl Input {
    fn open(path: &Path, context: Option<u64>) -> Result<Input, BundleError> {
        if path.is_dir() {
            return Ok(Input::Bundle(Bundle::open(path)?));
        }
        let mut magic = [0u8; 4];
        {
            use std::io::Read;
            let mut f = util::open_input(path).map_err(io_err(path))?;
            let _ = f.read(&mut magic).map_err(io_err(path))?;
        }
        if &magic == b"GGUF" {
            Ok(Input::Gguf(GgufFile::open(path)?))
        } else {
            open_safetensors(path, context)
        }
    }

    fn tensors(&self) -> Result<Vec<InTensor>, BundleError> {
        let mut v = match self {
            Input::Gguf(f) => f
                .tensors
                .iter()
                .enumerate()
                .map(|(i, t)| InTensor {
                    name: t.name.clone(),
                    shape: t.shape(),
                    source_type: t.ty,
                    loc: Loc::Gguf(i),
                    origin: None,
                })
                .collect(),
            Input::Bundle(b) => {
                let mut v = Vec::new();
                for (i, t) in b.manifest.tensors.iter().enumerate() {
                    v.push(InTensor {
                        name: t.name.clone(),
                        shape: t.shape.clone(),
                        source_type: GgmlType::from_name(&t.source_type).unwrap_or(GgmlType::F32),
                        loc: Loc::Bundle(i),
                        origin: None,
                    });
                }
                v
            }
            Input::Safetensors {
                shards, hf, extra, ..
            } => {
                let mut v = Vec::new();
                for (si, sh) in shards.iter().enumerate() {
                    for (name, info) in sh.meta.tensors() {
                        let ty = match info.dtype {
                            Dtype::F32 => GgmlType::F32,
                            Dtype::F16 => GgmlType::F16,
                            Dtype::BF16 => GgmlType::BF16,
                            d => {
                                return Err(terr(
                                    &sh.path,
                                    &name,
                                    format!("dtype {d:?} is not supported (F32, F16, BF16)"),
                                ))
                            }
                        };
                        let shape: Vec<u64> = info.shape.iter().map(|&d| d as u64).collect();
                        let (gname, permute) = match hf {
                            None => (name.clone(), None),
                            Some(_) if hf_ignored(&name) => continue,
                            Some((nh, nkv, permute)) => match hf::gguf_name(&name, *nh, *nkv, *permute) {
                                Some((g, hf::Source::Tensor(_))) => (g, None),
                                Some((g, hf::Source::Permuted { heads, .. })) => {
                                    let rows = shape.first().copied().unwrap_or(0) as usize;
                                    if shape.len() != 2 || !rows.is_multiple_of(2 * heads) {
                                        return Err(terr(
                                            &sh.path,
                                            &name,
                                            format!("shape {shape:?}: rows are not a multiple of 2 x {heads} heads"),
                                        ));
                                    }
                                    (g, Some(heads))
                                }
                                None => {
                                    return Err(terr(
                                        &sh.path,
                                        &name,
                                        "not a tensor of LlamaForCausalLM / MiniCPMForCausalLM / Qwen2ForCausalLM this tool maps",
                                    ))
                                }
                            },
                        };
                        let file = sh
                            .path
                            .file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_default();
                        let origin =
                            (hf.is_some() || shards.len() > 1).then(|| format!("{name} in {file}"));
                        v.push(InTensor {
                            origin,
                            name: gname,
                            shape,
                            source_type: ty,
                            loc: Loc::Safetensors {
                                shard: si,
                                start: sh.data_start + info.data_offsets.0,
                                end: sh.data_start + info.data_offsets.1,
                                permute,
                            },
                        });
                    }
                }
                for (i, (name, bytes)) in extra.iter().enumerate() {
                    v.push(InTensor {
                        name: name.clone(),
                        shape: vec![(bytes.len() / 4) as u64],
                        source_type: GgmlType::F32,
                        loc: Loc::Extra(i),
                        origin: Some("config.json rope_scaling".into()),
                    });
                }
                v
            }
        };
        v.sort_by_key(|t| order_key(&t.name));
        Ok(v)
    }

    /// A tensor's stored bytes, and their GGML type when they are a GGML encoding (every
    /// GGUF and safetensors tensor; a bundle's `gguf`-encoded ones, not ternary or palette).
    fn stored<'a>(&'a self, t: &InTensor) -> (Option<GgmlType>, &'a [u8]) {
        match (&t.loc, self) {
            (Loc::Gguf(i), Input::Gguf(f)) => {
                let ti = &f.tensors[*i];
                (Some(ti.ty), f.tensor_data(ti))
            }
            (
                Loc::Safetensors {
                    shard, start, end, ..
                },
                Input::Safetensors { shards, .. },
            ) => (Some(t.source_type), &shards[*shard].map[*start..*end]),
            (Loc::Extra(i), Input::Safetensors { extra, .. }) => {
                (Some(GgmlType::F32), extra[*i].1.as_slice())
            }
            (Loc::Bundle(i), Input::Bundle(b)) => {
                let te = &b.manifest.tensors[*i];
                let ty = match &te.encoding {
                    Encoding::Gguf { ggml_type, .. } => GgmlType::from_name(ggml_type),
                    _ => None,
                };
                (ty, b.tensor_bytes(te))
            }
            _ => unreachable!("tensor from another input"),
        }
    }

    /// Rows `r0..r1` of a 2-D GGML-encoded tensor as f32 (`out` is `(r1 - r0) * cols`).
    fn rows_f32(&self, t: &InTensor, r0: usize, r1: usize, out: &mut [f32]) {
        let cols = *t.shape.last().unwrap_or(&1);
        let (Some(ty), bytes) = self.stored(t) else {
            unreachable!("only GGML-encoded tensors are palettized")
        };
        let rb = ty.bytes_for(cols).unwrap_or(0) as usize;
        match t.loc {
            Loc::Safetensors {
                permute: Some(heads),
                ..
            } => {
                let rows = t.shape[0] as usize;
                for (r, o) in (r0..r1).zip(out.chunks_exact_mut(cols as usize)) {
                    let s = hf::permuted_row(r, rows, heads);
                    quant::dequantize_body_checked(ty, &bytes[s * rb..(s + 1) * rb], o);
                }
            }
            _ => quant::dequantize_body_checked(ty, &bytes[r0 * rb..r1 * rb], out),
        }
    }

    /// Drops a tensor's pages from the resident set once it is written (as `pack` does).
    fn release(&self, t: &InTensor) {
        match (&t.loc, self) {
            (Loc::Gguf(i), Input::Gguf(f)) => f.release(&f.tensors[*i]),
            (
                Loc::Safetensors {
                    shard, start, end, ..
                },
                Input::Safetensors { shards, .. },
            ) => crate::gguf::release_range(
                &shards[*shard].map,
                *start as u64,
                (*end - *start) as u64,
            ),
            (Loc::Extra(_), _) => {}
            (Loc::Bundle(i), Input::Bundle(b)) => b.release(&b.manifest.tensors[*i]),
            _ => unreachable!("tensor from another input"),
        }
    }

    /// Drops rows `r0..r1` of a palettized tensor's source pages from the resident set once
    /// their groups are written, so that a tensor larger than memory (a 128 K-row embedding is
    /// 1 GB in f16) is not held whole; [`Input::release`] drops the rest at the tensor's end.
    fn release_rows(&self, t: &InTensor, r0: usize, r1: usize) {
        let cols = *t.shape.last().unwrap_or(&1);
        let rb = t.source_type.bytes_for(cols).unwrap_or(0);
        self.release_part(t, r0 as u64 * rb, (r1 - r0) as u64 * rb);
    }

    /// Bytes `offset..offset + len` of a tensor's stored data dropped from the resident set
    /// (GGUF and unpermuted safetensors sources; the others keep their pages until
    /// [`Input::release`]).
    fn release_part(&self, t: &InTensor, offset: u64, len: u64) {
        match (&t.loc, self) {
            (Loc::Gguf(i), Input::Gguf(f)) => f.release_part(&f.tensors[*i], offset, len),
            (
                Loc::Safetensors {
                    shard,
                    start,
                    end,
                    permute: None,
                },
                Input::Safetensors { shards, .. },
            ) => {
                let n = (*end - *start) as u64;
                let len = len.min(n - offset.min(n));
                crate::gguf::release_range(&shards[*shard].map, *start as u64 + offset, len)
            }
            _ => {}
        }
    }

    /// A tensor carried unchanged: its encoding and bytes (a Hugging Face q/k weight's rows
    /// permuted into GGUF's order).
    fn carry<'a>(&'a self, t: &InTensor) -> (Encoding, std::borrow::Cow<'a, [u8]>) {
        if let (Loc::Bundle(i), Input::Bundle(b)) = (&t.loc, self) {
            let te = &b.manifest.tensors[*i];
            return (te.encoding.clone(), b.tensor_bytes(te).into());
        }
        let (ty, bytes) = self.stored(t);
        let ty = ty.expect("GGUF and safetensors tensors have a GGML type");
        if let Loc::Safetensors {
            permute: Some(heads),
            ..
        } = t.loc
        {
            let rows = t.shape[0] as usize;
            let rb = bytes.len() / rows.max(1);
            let mut out = Vec::with_capacity(bytes.len());
            for r in 0..rows {
                let s = hf::permuted_row(r, rows, heads);
                out.extend_from_slice(&bytes[s * rb..(s + 1) * rb]);
            }
            return (gguf_encoding(ty), out.into());
        }
        (gguf_encoding(ty), bytes.into())
    }
}

fn gguf_encoding(ty: GgmlType) -> Encoding {
    Encoding::Gguf {
        ggml_type: ty.name().into(),
        ggml_type_id: ty.id(),
        block_size: ty.block_size() as u64,
        type_size: ty.type_size() as u64,
    }
}

/// Whether a tensor is palettized (before `--include`/`--exclude`).
fn eligible(t: &InTensor, min_elements: u64) -> bool {
    let n: u64 = t.shape.iter().product();
    t.shape.len() == 2
        && n > min_elements
        && t.name.ends_with(".weight")
        && !t.name.contains("norm")
        && !t.name.contains("rope")
}

/// Groups per parallel batch.
fn batch_groups(group_rows: usize, cols: usize, threads: usize) -> usize {
    // About 4 Mi f32 values per batch, and at least two groups per thread.
    let per = (1usize << 22) / (group_rows * cols).max(1);
    per.max(2 * threads).max(1)
}

/// One batch of palettized groups `g0..g1` of a tensor: each group's table and errors, and its
/// rows' packed indices.
struct Batch {
    groups: Vec<(palette::Group, Vec<u8>)>,
    g0: usize,
    g1: usize,
}

/// Group `gi` (rows `gi * g .. (gi + 1) * g`) of tensor `t`, palettized, with its rows' packed
/// indices.
fn palettize_one(
    inp: &Input,
    input: &Path,
    t: &InTensor,
    opts: &PalettizeOptions,
    g: usize,
    gi: usize,
) -> Result<(palette::Group, Vec<u8>), BundleError> {
    let cols = t.shape[1] as usize;
    let rb = palette::row_bytes(cols as u64, opts.bits) as usize;
    let arith = if t.source_type == GgmlType::F16 {
        Arith::F16
    } else {
        Arith::F32
    };
    let group_err = |e: &dyn std::fmt::Display| {
        terr(
            input,
            &t.label(),
            format!("group {gi} (rows {}..{}): {e}", gi * g, (gi + 1) * g),
        )
    };
    // A group as large as a whole tensor (one table) is allocated fallibly: running out of
    // memory is an error that removes the staging directory, not an abort.
    let n = g
        .checked_mul(cols)
        .ok_or_else(|| group_err(&"rows x cols overflows"))?;
    let mut vals = palette::kmeans::try_filled(n, 0f32, "the group's values")
        .map_err(|e| group_err(&palette::GroupFault::Alloc(e)))?;
    inp.rows_f32(t, gi * g, (gi + 1) * g, &mut vals);
    let grp =
        palette::palettize_group(&vals, opts.bits, opts.mode, arith).map_err(|e| group_err(&e))?;
    drop(vals);
    let mut packed = palette::kmeans::try_filled(g * rb, 0u8, "the group's packed indices")
        .map_err(|e| group_err(&palette::GroupFault::Alloc(e)))?;
    for (r, out) in packed.chunks_exact_mut(rb).enumerate() {
        palette::pack_row(&grp.indices[r * cols..(r + 1) * cols], opts.bits, out);
    }
    Ok((grp, packed))
}

/// Palettizes `input` into a new bundle at `output` (which must not exist).
pub fn palettize(
    input: &Path,
    output: &Path,
    opts: &PalettizeOptions,
    command_line: Vec<String>,
) -> Result<PalettizeSummary, BundleError> {
    util::refuse_existing(output)?;
    if !palette::SUPPORTED_BITS.contains(&opts.bits) {
        return Err(BundleError::Manifest {
            path: PathBuf::from("--bits"),
            detail: format!(
                "--bits {} is not one of {:?}",
                opts.bits,
                palette::SUPPORTED_BITS
            ),
        });
    }
    if let Some(w) = opts.workers.filter(|&w| w == 0 || w > MAX_WORKERS) {
        return Err(BundleError::Manifest {
            path: PathBuf::from("--workers"),
            detail: format!("--workers {w} must be between 1 and {MAX_WORKERS}"),
        });
    }
    if opts.group_size == Some(0) {
        return Err(BundleError::Manifest {
            path: PathBuf::from("--group-size"),
            detail: "--group-size must be at least 1".into(),
        });
    }
    if input.is_dir() {
        util::refuse_output_inside(input, output)?;
    }
    let inp = Input::open(input, opts.context)?;
    let tensors = inp.tensors()?;
    {
        let mut seen = std::collections::BTreeMap::new();
        for t in &tensors {
            if let Some(first) = seen.insert(t.name.as_str(), t.label()) {
                return Err(terr(
                    input,
                    &t.label(),
                    format!("appears twice (also {first})"),
                ));
            }
        }
    }
    if let Input::Safetensors {
        hf: Some(_), model, ..
    } = &inp
    {
        check_hf_tensors(input, model, &tensors)?;
    }
    let include = glob_set(input, &tensors, &opts.include, "--include")?;
    let exclude = glob_set(input, &tensors, &opts.exclude, "--exclude")?;
    let selected: Vec<bool> = tensors
        .iter()
        .map(|t| {
            eligible(t, opts.min_elements)
                && (opts.include.is_empty() || include.is_match(&t.name))
                && !exclude.is_match(&t.name)
                && inp.stored(t).0.is_some_and(|ty| ty.can_dequantize())
        })
        .collect();
    // Nothing selected from an input whose matrices are all GGUF-typed: the bundle would
    // palettize nothing. (A palettized or ternary bundle's own tensors are kept as they are,
    // so such an input may select nothing new.)
    if !selected.iter().any(|&s| s) && tensors.iter().all(|t| inp.stored(t).0.is_some()) {
        return Err(BundleError::Manifest {
            path: input.to_path_buf(),
            detail: format!(
                "no tensor to palettize: of {} tensors none has more than --min-elements {} \
                 elements{}{}, is a matrix (norms and RoPE factors never are) and is of a type \
                 that can be dequantized; nothing written",
                tensors.len(),
                opts.min_elements,
                if opts.include.is_empty() {
                    ""
                } else {
                    ", matches --include"
                },
                if opts.exclude.is_empty() {
                    ""
                } else {
                    ", escapes --exclude"
                },
            ),
        });
    }
    // Check every selected tensor before writing anything.
    for (t, _) in tensors.iter().zip(&selected).filter(|(_, s)| **s) {
        let rows = t.shape[0];
        let g = opts.group_size.unwrap_or(rows);
        if rows % g != 0 {
            return Err(terr(
                input,
                &t.label(),
                format!("{rows} rows are not divisible by --group-size {g}"),
            ));
        }
    }
    let (model, tokenizer, tokenizer_bytes, mut source) = describe_input(&inp, input, opts)?;
    // The tensors the architecture needs, with their shapes, before anything is written.
    crate::arch::Layout::new(&model, &|name| {
        tensors
            .iter()
            .find(|t| t.name == name)
            .map(|t| t.shape.clone())
    })
    .map_err(|e| super::layout_error(input, e))?;
    // The input file's SHA256 on a thread of its own (plain reads, not the map, so that
    // hashing does not make the whole file resident), overlapping the palettization.
    let source_hash = match &inp {
        Input::Bundle(_) => None,
        Input::Safetensors { shards, .. } if shards.len() > 1 => {
            let paths: Vec<PathBuf> = shards.iter().map(|s| s.path.clone()).collect();
            Some(std::thread::spawn(move || shards_digest(&paths)))
        }
        Input::Safetensors { shards, .. } => {
            let path = shards[0].path.clone();
            Some(std::thread::spawn(move || util::sha256_file(&path)))
        }
        Input::Gguf(_) => {
            let path = input.to_path_buf();
            Some(std::thread::spawn(move || util::sha256_file(&path)))
        }
    };

    let pool = {
        let mut b = rayon::ThreadPoolBuilder::new();
        if let Some(n) = opts.workers {
            b = b.num_threads(n);
        }
        b.build().map_err(|e| BundleError::Manifest {
            path: PathBuf::from("--workers"),
            detail: e.to_string(),
        })?
    };

    let buckets = super::writer::resolve_buckets(opts.prefill_buckets.as_deref(), model.n_ctx)?;
    let tmp = Staging::new(output)?;
    let wpath = tmp.path().join(WEIGHTS_FILE);
    let mut w = WeightWriter::create(&wpath)?;
    let total: u64 = tensors
        .iter()
        .map(|t| t.shape.iter().product::<u64>())
        .sum();
    let pb = util::progress_bar(total, opts.quiet, false);
    let zeros = [0u8; ALIGNMENT as usize];
    let mut entries = Vec::with_capacity(tensors.len());
    let (mut all_sse, mut all_max, mut n_pal) = (0f64, 0f64, 0usize);
    // Palettized groups are computed on the pool by a producer thread, batch by batch in the
    // order they are written, at most two batches ahead of the writer (this thread), which
    // meanwhile copies carried tensors: computing overlaps writing, memory stays a few batches.
    let threads = pool.current_num_threads();
    std::thread::scope(|sc| -> Result<(), BundleError> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Batch, BundleError>>(2);
        let (inp_ref, pool_ref) = (&inp, &pool);
        let jobs: Vec<&InTensor> = tensors
            .iter()
            .zip(&selected)
            .filter(|(_, s)| **s)
            .map(|(t, _)| t)
            .collect();
        sc.spawn(move || {
            for t in jobs {
                let rows = t.shape[0] as usize;
                let cols = t.shape[1] as usize;
                let g = opts.group_size.map(|g| g as usize).unwrap_or(rows);
                let n_groups = rows / g;
                let per_batch = batch_groups(g, cols, threads);
                let mut g0 = 0;
                while g0 < n_groups {
                    let g1 = (g0 + per_batch).min(n_groups);
                    let r = pool_ref.install(|| {
                        (g0..g1)
                            .into_par_iter()
                            .map(|gi| palettize_one(inp_ref, input, t, opts, g, gi))
                            .collect::<Result<Vec<_>, BundleError>>()
                    });
                    let failed = r.is_err();
                    if tx.send(r.map(|groups| Batch { groups, g0, g1 })).is_err() || failed {
                        return;
                    }
                    g0 = g1;
                }
            }
        });
        for (i, (t, &sel)) in tensors.iter().zip(&selected).enumerate() {
            pb.set_message(format!("tensor {}/{} {}", i + 1, tensors.len(), t.name));
            let offset = w.align(&wpath)?;
            let mut th = Sha256::new();
            let mut put = |w: &mut WeightWriter<crate::direct_io::DirectWriter>, b: &[u8]| {
                th.update(b);
                w.write_all(b).map_err(io_err(&wpath))
            };
            let (encoding, length) = if sel {
                n_pal += 1;
                let rows = t.shape[0] as usize;
                let cols = t.shape[1] as usize;
                let g = opts.group_size.map(|g| g as usize).unwrap_or(rows);
                let n_groups = rows / g;
                let rb = palette::row_bytes(cols as u64, opts.bits) as usize;
                let mut tables: Vec<u16> = Vec::with_capacity(n_groups << opts.bits);
                let (mut sse, mut maxe) = (0f64, 0f64);
                let mut written = 0u64;
                let mut done = 0;
                while done < n_groups {
                    let batch = rx.recv().map_err(|_| BundleError::Manifest {
                        path: input.to_path_buf(),
                        detail: "palettization stopped early".into(),
                    })??;
                    debug_assert_eq!(batch.g0, done);
                    for (grp, packed) in batch.groups {
                        sse += grp.sse;
                        maxe = maxe.max(grp.max_abs_err);
                        tables.extend_from_slice(&grp.table);
                        put(&mut w, &packed)?;
                        written += packed.len() as u64;
                    }
                    pb.inc(((batch.g1 - batch.g0) * g * cols) as u64);
                    inp.release_rows(t, batch.g0 * g, batch.g1 * g);
                    done = batch.g1;
                }
                let gap = (ALIGNMENT - written % ALIGNMENT) % ALIGNMENT;
                put(&mut w, &zeros[..gap as usize])?;
                let tb: Vec<u8> = tables.iter().flat_map(|h| h.to_le_bytes()).collect();
                put(&mut w, &tb)?;
                all_sse += sse;
                all_max = all_max.max(maxe);
                (
                    Encoding::Palette {
                        bits: opts.bits,
                        mode: opts.mode.name().into(),
                        group_size: g as u64,
                        table_dtype: "float16".into(),
                        indices_offset: 0,
                        indices_length: written,
                        row_bytes: rb as u64,
                        tables_offset: written + gap,
                        tables_length: tb.len() as u64,
                        sse,
                        max_abs_err: maxe,
                    },
                    written + gap + tb.len() as u64,
                )
            } else {
                let (enc, bytes) = inp.carry(t);
                let bytes: &[u8] = &bytes;
                if bytes.len() >= 1 << 20 {
                    // The tensor's hash on a second thread while this one copies the chunk
                    // into the weight file, a chunk at a time, each chunk's source pages
                    // dropped after.
                    const CHUNK: usize = 64 << 20;
                    for (c, chunk) in bytes.chunks(CHUNK).enumerate() {
                        let h = std::mem::take(&mut th);
                        th = std::thread::scope(|sc| -> Result<Sha256, BundleError> {
                            let h = sc.spawn(move || h.chain_update(chunk));
                            w.write_all(chunk).map_err(io_err(&wpath))?;
                            Ok(h.join().expect("hashing does not panic"))
                        })?;
                        inp.release_part(t, (c * CHUNK) as u64, chunk.len() as u64);
                    }
                } else {
                    put(&mut w, bytes)?;
                }
                pb.inc(t.shape.iter().product::<u64>());
                (enc, bytes.len() as u64)
            };
            entries.push(TensorEntry {
                name: t.name.clone(),
                shape: t.shape.clone(),
                source_type: t.source_type.name().into(),
                source_type_id: t.source_type.id(),
                encoding,
                file: WEIGHTS_FILE.into(),
                offset,
                length,
                sha256: hex::encode(th.finalize()),
            });
            inp.release(t);
        }
        Ok(())
    })?;
    let weights_bytes = w.finish(&wpath)?;
    pb.finish_and_clear();
    if let Some(h) = source_hash {
        source.sha256 = h
            .join()
            .expect("hashing does not panic")
            .map_err(io_err(input))?;
    }
    let (manifest, _) = tmp.commit(
        weights_bytes,
        tokenizer,
        &tokenizer_bytes,
        model,
        source,
        entries,
        command_line,
        &buckets,
    )?;
    Ok(PalettizeSummary {
        tensors: manifest.tensors.len(),
        palettized: n_pal,
        sse: all_sse,
        max_abs_err: all_max,
        weights_bytes,
        bundle_digest: manifest.bundle_digest,
    })
}

/// Model configuration, tokenizer (reference and bytes) and source record of an input.
fn describe_input(
    inp: &Input,
    path: &Path,
    opts: &PalettizeOptions,
) -> Result<(ModelConfig, TokenizerRef, Vec<u8>, Source), BundleError> {
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let with_context = |mut m: ModelConfig| -> Result<ModelConfig, BundleError> {
        if let Some(c) = opts.context {
            if c == 0 || c > m.n_ctx_train {
                return Err(BundleError::Manifest {
                    path: PathBuf::from("--context"),
                    detail: format!(
                        "--context {c} must be between 1 and the trained context {}",
                        m.n_ctx_train
                    ),
                });
            }
            m.n_ctx = c;
        }
        // A bundle or a `dequantize --with-config` checkpoint carries its configuration
        // verbatim: held to the same rules as one read from GGUF metadata.
        super::check_model(path, &m)?;
        Ok(m)
    };
    match inp {
        Input::Gguf(f) => {
            let model = config::model_config(f, opts.context)?;
            let tb = config::tokenizer_file_bytes(f);
            let tokenizer = super::writer::tokenizer_ref(f);
            let source = Source {
                format: None,
                file_name,
                size: f.file_len(),
                // Filled in by the hashing thread (see `palettize`).
                sha256: String::new(),
                gguf_version: Some(f.version),
                architecture: model.architecture.clone(),
                tensor_count: f.tensors.len() as u64,
            };
            Ok((model, tokenizer, tb, source))
        }
        Input::Safetensors {
            shards,
            model,
            tokenizer,
            tokenizer_bytes,
            hf,
            ..
        } => Ok((
            with_context(model.clone())?,
            tokenizer.clone(),
            tokenizer_bytes.clone(),
            Source {
                format: Some(
                    if hf.is_some() {
                        "huggingface-safetensors"
                    } else {
                        "safetensors"
                    }
                    .into(),
                ),
                file_name,
                size: shards.iter().map(|s| s.map.len() as u64).sum(),
                // Filled in by the hashing thread (see `palettize`).
                sha256: String::new(),
                gguf_version: None,
                architecture: model.architecture.clone(),
                tensor_count: shards.iter().map(|s| s.meta.tensors().len() as u64).sum(),
            },
        )),
        Input::Bundle(b) => {
            let m = &b.manifest;
            let tb = b.file(&m.tokenizer.file).unwrap_or_default().to_vec();
            Ok((
                with_context(m.model.clone())?,
                m.tokenizer.clone(),
                tb,
                Source {
                    format: Some(FORMAT.into()),
                    file_name,
                    size: m.files.iter().map(|f| f.size).sum(),
                    sha256: m.bundle_digest.clone(),
                    gguf_version: None,
                    architecture: m.model.architecture.clone(),
                    tensor_count: m.tensors.len() as u64,
                },
            ))
        }
    }
}

#[cfg(test)]
mod header_tests {
    use super::duplicate_header_name;

    fn file(header: &str) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v
    }

    #[test]
    fn a_name_listed_twice_is_found() {
        let t = r#"{"__metadata__":{"a":"b"},"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}  "#;
        assert_eq!(duplicate_header_name(&file(t)), Some("x".into()));
        let t = r#"{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
        assert_eq!(duplicate_header_name(&file(t)), None);
        assert_eq!(duplicate_header_name(b"\x05\0\0\0\0\0\0\0{\"a\""), None);
    }
}
