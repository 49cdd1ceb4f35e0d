//! `convert dequantize`: GGUF (or, later, bundle) tensors to a safetensors file of f32, f16 or
//! bf16, streamed one tensor at a time.
//!
//! Memory: the safetensors header is computed from shapes alone; each tensor is dequantized
//! only when the writer asks for its bytes and dropped once written, so peak memory is about
//! one output tensor (plus 64 KiB per thread), not the model.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use indicatif::ProgressBar;
use rayon::prelude::*;
use safetensors::tensor::{Dtype, View};

use crate::bundle::manifest::{Encoding, TensorEntry};
use crate::bundle::reader::Bundle;
use crate::bundle::BundleError;
use crate::ggml::GgmlType;
use crate::gguf::{GgufError, GgufFile, TensorInfo};
use crate::quant;
use crate::util::{self, OutputError};

/// Element type of the output file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutDtype {
    F32,
    F16,
    Bf16,
}

impl OutDtype {
    pub fn size(self) -> usize {
        match self {
            OutDtype::F32 => 4,
            OutDtype::F16 | OutDtype::Bf16 => 2,
        }
    }
    fn safetensors(self) -> Dtype {
        match self {
            OutDtype::F32 => Dtype::F32,
            OutDtype::F16 => Dtype::F16,
            OutDtype::Bf16 => Dtype::BF16,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            OutDtype::F32 => "f32",
            OutDtype::F16 => "f16",
            OutDtype::Bf16 => "bf16",
        }
    }
}

/// Errors of [`dequantize_gguf`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(
        "{file}: tensor {tensor:?}: unsupported type {ty} (ggml type id {id}) for dequantization"
    )]
    Unsupported {
        file: PathBuf,
        tensor: String,
        ty: GgmlType,
        id: u32,
    },
    #[error("--tensor {glob:?}: {detail}")]
    BadGlob { glob: String, detail: String },
    #[error("{file}: --tensor {glob:?} matches no tensor")]
    NoMatch { file: PathBuf, glob: String },
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error("{path}: writing safetensors failed: {detail}")]
    Write { path: PathBuf, detail: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What to dequantize.
#[derive(Clone, Debug)]
pub struct DequantizeOptions {
    pub dtype: OutDtype,
    /// Also write `config.json` (the model configuration) and `tokenizer.json` beside the
    /// output, so `convert palettize` can read the safetensors file as a model.
    pub with_config: bool,
    /// Tensor-name globs; empty means every tensor. A tensor is kept if any glob matches.
    pub tensor_globs: Vec<String>,
    pub quiet: bool,
}

/// What [`dequantize_gguf`] wrote.
#[derive(Clone, Debug)]
pub struct DequantizeSummary {
    pub tensors: usize,
    pub elements: u64,
    pub bytes_written: u64,
    pub source_sha256: String,
}

/// Converts f32 values to the output element type, little-endian: f16 and bf16 round to
/// nearest, ties to even (`half::f16::from_f32`, `half::bf16::from_f32`).
pub fn encode_f32(values: &[f32], dtype: OutDtype, out: &mut [u8]) {
    match dtype {
        OutDtype::F32 => {
            for (v, o) in values.iter().zip(out.chunks_exact_mut(4)) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        OutDtype::F16 => {
            for (v, o) in values.iter().zip(out.chunks_exact_mut(2)) {
                o.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes());
            }
        }
        OutDtype::Bf16 => {
            for (v, o) in values.iter().zip(out.chunks_exact_mut(2)) {
                o.copy_from_slice(&half::bf16::from_f32(*v).to_le_bytes());
            }
        }
    }
}

/// Dequantizes one GGUF tensor's bytes into `dtype` bytes (row-major), in parallel chunks.
pub fn dequantize_tensor_bytes(
    ty: GgmlType,
    src: &[u8],
    dtype: OutDtype,
) -> Result<Vec<u8>, quant::DequantError> {
    let (bs, ts) = (ty.block_size(), ty.type_size());
    if !ty.can_dequantize() {
        return Err(quant::DequantError::Unsupported { ty, id: ty.id() });
    }
    let n = src.len() / ts * bs;
    let mut out = vec![0u8; n * dtype.size()];
    let blocks_per_chunk = (16384 / bs).max(1);
    src.par_chunks(blocks_per_chunk * ts)
        .zip(out.par_chunks_mut(blocks_per_chunk * bs * dtype.size()))
        .try_for_each(|(s, o)| {
            let mut buf = vec![0f32; s.len() / ts * bs];
            quant::dequantize(ty, s, &mut buf)?;
            encode_f32(&buf, dtype, o);
            Ok(())
        })?;
    Ok(out)
}

/// Where a lazily produced tensor comes from.
enum TensorSource<'a> {
    Gguf(&'a GgufFile, &'a TensorInfo),
    Bundle(&'a Bundle, &'a TensorEntry),
}

/// A tensor whose bytes are produced when the safetensors writer asks for them.
struct LazyTensor<'a> {
    source: TensorSource<'a>,
    dtype: OutDtype,
    shape: Vec<usize>,
    progress: &'a ProgressBar,
}

impl View for LazyTensor<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype.safetensors()
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        // Types were checked before writing began and lengths when the file was opened;
        // neither can fail here.
        let bytes = match self.source {
            TensorSource::Gguf(file, info) => {
                dequantize_tensor_bytes(info.ty, file.tensor_data(info), self.dtype)
                    .expect("tensor validated before writing")
            }
            TensorSource::Bundle(b, t) => {
                let values = b.tensor_f32(t).expect("tensor validated before writing");
                let mut out = vec![0u8; values.len() * self.dtype.size()];
                out.par_chunks_mut(16384 * self.dtype.size())
                    .zip(values.par_chunks(16384))
                    .for_each(|(o, v)| encode_f32(v, self.dtype, o));
                out
            }
        };
        self.progress.inc(bytes.len() as u64);
        Cow::Owned(bytes)
    }
    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }
}

/// Selects tensors by glob; every glob must match at least one tensor.
pub fn select_tensors<'a>(
    file: &Path,
    names: impl Iterator<Item = &'a str> + Clone,
    globs: &[String],
) -> Result<Vec<&'a str>, ExportError> {
    if globs.is_empty() {
        return Ok(names.collect());
    }
    let set = util::glob_set_matching(globs, names.clone()).map_err(|f| match f {
        util::GlobFault::Bad { glob, detail } => ExportError::BadGlob { glob, detail },
        util::GlobFault::NoMatch { glob } => ExportError::NoMatch {
            file: file.to_path_buf(),
            glob,
        },
    })?;
    Ok(names.filter(|n| set.is_match(n)).collect())
}

/// Dequantizes a GGUF file into a new safetensors file at `output` (which must not exist).
/// Shapes are row-major (GGML `ne` reversed). The header metadata names the source file and
/// its SHA256.
pub fn dequantize_gguf(
    input: &Path,
    output: &Path,
    opts: &DequantizeOptions,
) -> Result<DequantizeSummary, ExportError> {
    util::refuse_existing(output)?;
    let file = GgufFile::open(input)?;
    let sidecars = if opts.with_config {
        let model = crate::bundle::config::model_config(&file, None)?;
        let tok = crate::bundle::writer::tokenizer_ref(&file);
        let tb = crate::bundle::config::tokenizer_file_bytes(&file);
        Some(check_sidecars(output, &model, &tok, tb)?)
    } else {
        None
    };
    let names = select_tensors(
        input,
        file.tensors.iter().map(|t| t.name.as_str()),
        &opts.tensor_globs,
    )?;
    let infos: Vec<&TensorInfo> = names.iter().filter_map(|n| file.tensor(n)).collect();
    for t in &infos {
        if !t.ty.can_dequantize() {
            return Err(ExportError::Unsupported {
                file: input.to_path_buf(),
                tensor: t.name.clone(),
                ty: t.ty,
                id: t.ty.id(),
            });
        }
    }
    let source_sha256 = util::sha256_hex(file.bytes());
    let total: u64 = infos
        .iter()
        .map(|t| t.n_elements() * opts.dtype.size() as u64)
        .sum();
    let progress = util::progress_bar(total, opts.quiet, true);
    let views: Vec<(String, LazyTensor)> = infos
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                LazyTensor {
                    source: TensorSource::Gguf(&file, t),
                    dtype: opts.dtype,
                    shape: t.shape().iter().map(|&d| d as usize).collect(),
                    progress: &progress,
                },
            )
        })
        .collect();
    let mut meta = HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    meta.insert(
        "source_file".to_string(),
        input
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    meta.insert("source_sha256".to_string(), source_sha256.clone());
    meta.insert("source_gguf_version".to_string(), file.version.to_string());
    if let Some(a) = file.architecture() {
        meta.insert("source_architecture".to_string(), a);
    }
    meta.insert("dtype".to_string(), opts.dtype.name().to_string());
    meta.insert(
        "producer".to_string(),
        format!("lowbit {} convert dequantize", env!("CARGO_PKG_VERSION")),
    );
    let elements = infos.iter().map(|t| t.n_elements()).sum();
    let s = write_views(output, views, meta, &progress, elements, source_sha256)?;
    write_sidecars(sidecars)?;
    Ok(s)
}

/// Sidecar files to write beside a safetensors output: (path, bytes).
type Sidecars = Vec<(PathBuf, Vec<u8>)>;

fn check_sidecars(
    output: &Path,
    model: &crate::bundle::manifest::ModelConfig,
    tok: &crate::bundle::manifest::TokenizerRef,
    tokenizer_bytes: Vec<u8>,
) -> Result<Sidecars, ExportError> {
    let dir = util::parent_dir(output);
    let mut cfg = serde_json::to_vec_pretty(&crate::bundle::palettize::sidecar_config(model, tok))
        .expect("JSON values serialize");
    cfg.push(b'\n');
    let v = vec![
        (dir.join("config.json"), cfg),
        (
            dir.join(crate::bundle::manifest::TOKENIZER_FILE),
            tokenizer_bytes,
        ),
    ];
    for (p, _) in &v {
        util::refuse_existing(p)?;
    }
    Ok(v)
}

fn write_sidecars(s: Option<Sidecars>) -> Result<(), ExportError> {
    for (p, b) in s.into_iter().flatten() {
        util::write_file_atomically(&p, |tmp| {
            std::fs::write(tmp, &b).map_err(|source| ExportError::Io {
                path: p.clone(),
                source,
            })
        })??;
    }
    Ok(())
}

fn write_views(
    output: &Path,
    views: Vec<(String, LazyTensor)>,
    meta: HashMap<String, String>,
    progress: &ProgressBar,
    elements: u64,
    source_sha256: String,
) -> Result<DequantizeSummary, ExportError> {
    let n = views.len();
    let written = util::write_file_atomically(output, |tmp| {
        safetensors::serialize_to_file(views, Some(meta), tmp).map_err(|e| ExportError::Write {
            path: output.to_path_buf(),
            detail: e.to_string(),
        })
    })?;
    written?;
    progress.finish_and_clear();
    Ok(DequantizeSummary {
        tensors: n,
        elements,
        bytes_written: std::fs::metadata(output)
            .map_err(|source| ExportError::Io {
                path: output.to_path_buf(),
                source,
            })?
            .len(),
        source_sha256,
    })
}

/// Reconstructs a bundle's tensors exactly as the runtime defines them (ternary
/// `d * (code - 1)`, carried GGUF encodings dequantized) into a new safetensors file. The
/// bundle is fully checked against its manifest first. The header metadata names the bundle,
/// its digest and its source.
pub fn dequantize_bundle(
    input: &Path,
    output: &Path,
    opts: &DequantizeOptions,
) -> Result<DequantizeSummary, ExportError> {
    util::refuse_existing(output)?;
    util::refuse_output_inside(input, output)?;
    let bundle = Bundle::open(input)?;
    let m = &bundle.manifest;
    let sidecars = if opts.with_config {
        let tb = bundle.file(&m.tokenizer.file).unwrap_or_default().to_vec();
        Some(check_sidecars(output, &m.model, &m.tokenizer, tb)?)
    } else {
        None
    };
    let names = select_tensors(
        input,
        m.tensors.iter().map(|t| t.name.as_str()),
        &opts.tensor_globs,
    )?;
    let entries: Vec<&TensorEntry> = names.iter().filter_map(|n| bundle.tensor(n)).collect();
    for t in &entries {
        if let Encoding::Gguf { ggml_type, .. } = &t.encoding {
            let ty = GgmlType::from_name(ggml_type).unwrap_or(GgmlType::Q8_K);
            if !ty.can_dequantize() {
                return Err(ExportError::Unsupported {
                    file: input.to_path_buf(),
                    tensor: t.name.clone(),
                    ty,
                    id: ty.id(),
                });
            }
        }
    }
    let elements: u64 = entries
        .iter()
        .map(|t| t.shape.iter().product::<u64>())
        .sum();
    let progress = util::progress_bar(elements * opts.dtype.size() as u64, opts.quiet, true);
    let views: Vec<(String, LazyTensor)> = entries
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                LazyTensor {
                    source: TensorSource::Bundle(&bundle, t),
                    dtype: opts.dtype,
                    shape: t.shape.iter().map(|&d| d as usize).collect(),
                    progress: &progress,
                },
            )
        })
        .collect();
    let mut meta = HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    meta.insert(
        "bundle".to_string(),
        input
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    meta.insert("bundle_digest".to_string(), m.bundle_digest.clone());
    meta.insert("source_file".to_string(), m.source.file_name.clone());
    meta.insert("source_sha256".to_string(), m.source.sha256.clone());
    meta.insert("dtype".to_string(), opts.dtype.name().to_string());
    meta.insert(
        "producer".to_string(),
        format!("lowbit {} convert dequantize", env!("CARGO_PKG_VERSION")),
    );
    let sha = m.source.sha256.clone();
    let s = write_views(output, views, meta, &progress, elements, sha)?;
    write_sidecars(sidecars)?;
    Ok(s)
}
