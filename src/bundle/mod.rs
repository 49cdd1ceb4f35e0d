//! Static-[1,1] bundles: a directory of weight files, a tokenizer and `manifest.json`.
//!
//! ```text
//! OUT.bundle/
//!   manifest.json    format, producer, source fingerprint, model config, the decode function
//!                    contract "main", every tensor (shape, encoding, file, offset, length,
//!                    SHA256), every file's SHA256, the bundle digest and the manifest
//!                    digest (versions 2 and 3: both over the manifest's canonical content,
//!                    [`manifest`] says exactly what each covers)
//!   weights.bin      every tensor, each starting at a multiple of 256 bytes, little-endian
//!   tokenizer.json   the GGUF tokenizer.* metadata, verbatim
//!   kernels/         the GPU kernels: NAME.wgsl for every module of the registry that the
//!                    tensors' encodings need and NAME.metal, the MSL naga translates it
//!                    to (in `files` and the digest)
//!   signature.json   optional, `convert sign`: an Ed25519 signature over both digests and
//!                    every file's SHA256 (not in `files`, not covered by the digests) ([`sign`])
//! ```
//!
//! [`writer`] makes bundles (`convert pack`, `convert gguf-to-ternary`) and adds kernels to
//! existing ones (`convert add-kernels`), [`kernels`] makes and checks the kernel files,
//! [`reader`] opens and checks bundles, [`verify`] compares them with their source
//! (`convert verify`), [`sign`] makes keys, signs bundles and checks signatures, and
//! [`canonical`] is the JSON canonicalization the manifest digests are computed over.

pub mod canonical;
pub mod config;
pub mod hf;
pub mod kernels;
pub mod manifest;
pub mod palettize;
pub mod reader;
pub mod sign;
pub mod verify;
pub mod writer;

use std::path::PathBuf;

use crate::gguf::GgufError;
use crate::ternary::BlockFault;
use crate::util::OutputError;

/// Errors of bundle writing and reading.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BundleError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// `gguf-to-ternary` on a file with no TQ2_0/TQ1_0 tensor.
    #[error("{file}: no TQ2_0 or TQ1_0 tensor; to quantize its linear weights to ternary pass --ternarize, or to compress them with lookup tables use `convert palettize`; `convert pack` carries a model unchanged")]
    NoTernary { file: PathBuf },
    /// A weight whose K (`ne[0]`) is not a multiple of 256 cannot be ternary-packed.
    #[error("{file}: tensor {tensor:?}: K = ne[0] = {k} is not a multiple of the ternary block size 256")]
    KNotMultiple {
        file: PathBuf,
        tensor: String,
        k: u64,
    },
    /// A block that is not ternary, or whose two recovery routes disagree.
    #[error("{file}: tensor {tensor:?}: block {block} (row {row}, elements {start}..{end} of the row): {fault}")]
    Block {
        file: PathBuf,
        tensor: String,
        block: u64,
        row: u64,
        start: u64,
        end: u64,
        fault: BlockFault,
    },
    /// A tensor that `--ternarize` would quantize is not a 2-D matrix or has an unsupported type.
    #[error("{file}: tensor {tensor:?}: {detail}")]
    Tensor {
        file: PathBuf,
        tensor: String,
        detail: String,
    },
    /// Metadata the model configuration needs is missing or malformed.
    #[error("{file}: metadata key {key:?}: {detail}")]
    Config {
        file: PathBuf,
        key: String,
        detail: String,
    },
    /// A Hugging Face checkpoint's configuration or tokenizer file lacks a key or holds a
    /// value this tool cannot map.
    #[error("{file}: {key}: {detail}")]
    HfConfig {
        file: PathBuf,
        key: String,
        detail: String,
    },
    /// A model configuration value out of range ([`manifest::ModelConfig::check`]).
    #[error("{path}: model.{field}: {detail}")]
    ModelConfig {
        path: PathBuf,
        field: String,
        detail: String,
    },
    /// The manifest cannot be read or is not a manifest this build understands.
    #[error("{path}: {detail}")]
    Manifest { path: PathBuf, detail: String },
    /// The bundle does not match its manifest (a flipped byte, a missing, extra or truncated
    /// file, a wrong digest).
    #[error("{path}: {detail}")]
    Integrity { path: PathBuf, detail: String },
    /// The bundle's signature does not check out against the trusted keys
    /// ([`sign::check_signature`]: unsigned, signed by another key, changed after signing).
    #[error("{path}: signature check failed: {detail}")]
    Signature { path: PathBuf, detail: String },
    /// A GPU kernel of the registry that cannot be shipped (does not parse, validate or
    /// translate to MSL).
    #[error(transparent)]
    Kernel(#[from] kernels::KernelError),
    /// Test hook: a failure injected after the given number of tensors.
    #[error("injected failure after {0} tensors")]
    Injected(usize),
}

impl BundleError {
    /// Exit code for the command line: 1 when the bundle failed a check, 2 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            BundleError::Integrity { .. } | BundleError::Signature { .. } => 1,
            _ => 2,
        }
    }
}

/// The configuration checks every writer runs before anything is written
/// ([`crate::arch::check_config`]: the configuration's own ranges, an architecture the runtime
/// implements, that architecture's hyper-parameters), as an error naming `path`.
pub(crate) fn check_model(
    path: &std::path::Path,
    m: &manifest::ModelConfig,
) -> Result<(), BundleError> {
    crate::arch::check_config(m)
        .map(|_| ())
        .map_err(|e| layout_error(path, e))
}

/// An architecture error about the model in `path`.
pub(crate) fn layout_error(path: &std::path::Path, e: crate::arch::ArchError) -> BundleError {
    match e {
        crate::arch::ArchError::Config { field, detail } => BundleError::ModelConfig {
            path: path.to_path_buf(),
            field,
            detail,
        },
        e @ crate::arch::ArchError::Unsupported { .. } => BundleError::ModelConfig {
            path: path.to_path_buf(),
            field: "architecture".into(),
            detail: e.to_string(),
        },
        other => BundleError::ModelConfig {
            path: path.to_path_buf(),
            field: "tensors".into(),
            detail: other.to_string(),
        },
    }
}
