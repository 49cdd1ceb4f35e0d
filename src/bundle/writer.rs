//! Writes bundles: `convert pack` (every tensor carried in its source encoding) and
//! `convert gguf-to-ternary` (pack plus ternary recovery of TQ2_0/TQ1_0 tensors, and with
//! `--ternarize` quantization of other linear weights to ternary). One writer serves both.
//!
//! Streaming: the source is memory-mapped and read tensor by tensor; a ternary tensor is
//! processed in chunks of rows on the rayon pool and written before the next one starts, so
//! peak memory is about one packed tensor plus one chunk of f32 rows per thread.
//!
//! Determinism: tensors are written in source order, chunks are joined in row order, and
//! nothing depends on time or thread count; the same input and flags give the same bytes.
//!
//! Atomicity: everything is written into a temporary directory beside the output, which is
//! renamed into place only after the manifest is written; on any failure it is removed.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use super::config;
use super::kernels;
use super::manifest::*;
use super::BundleError;
use crate::direct_io::DirectWriter;
use crate::ggml::GgmlType;
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant;
use crate::ternary::{self, TernaryBlock, BLOCK, WORDS_PER_BLOCK};
use crate::util;

/// Which bundle to make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `convert pack`: every tensor carried in its source encoding.
    Pack,
    /// `convert gguf-to-ternary`: TQ2_0/TQ1_0 tensors recovered and repacked; with
    /// `ternarize`, other linear weights quantized to ternary too.
    Ternary { ternarize: bool },
}

#[derive(Clone, Debug)]
pub struct PackOptions {
    pub mode: Mode,
    /// Bundle context (`position_ids` length and KV cache); `None` = default.
    pub context: Option<u64>,
    /// Prefill buckets (`prefill_S` functions); `None` = the defaults up to the context.
    pub prefill_buckets: Option<Vec<u64>>,
    pub quiet: bool,
    /// Test hook: fail after writing this many tensors.
    #[doc(hidden)]
    pub fail_after_tensors: Option<usize>,
}

/// What [`write_bundle`] did.
#[derive(Clone, Debug)]
pub struct PackSummary {
    pub tensors: usize,
    pub ternary: usize,
    pub carried: usize,
    pub source_bytes: u64,
    pub bundle_bytes: u64,
    pub bundle_digest: String,
}

/// Names of the linear weights `--ternarize` quantizes (`blk.N.<name>.weight`).
const LINEAR_NAMES: &[&str] = &[
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_qkv",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

/// Whether `name` is a transformer linear weight (`blk.N.attn_q.weight`, ...).
pub fn is_linear_weight(name: &str) -> bool {
    let mut parts = name.split('.');
    matches!(
        (parts.next(), parts.next(), parts.next(), parts.next(), parts.next()),
        (Some("blk"), Some(n), Some(kind), Some("weight"), None)
            if n.parse::<u32>().is_ok() && LINEAR_NAMES.contains(&kind)
    )
}

/// How one source tensor goes into the bundle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    Carry,
    Recover,
    Ternarize,
}

fn plan(mode: Mode, t: &TensorInfo) -> Plan {
    match mode {
        Mode::Pack => Plan::Carry,
        Mode::Ternary { ternarize } => {
            if matches!(t.ty, GgmlType::TQ2_0 | GgmlType::TQ1_0) {
                Plan::Recover
            } else if ternarize && is_linear_weight(&t.name) {
                Plan::Ternarize
            } else {
                Plan::Carry
            }
        }
    }
}

/// The weight file's writer: counts what passes through (the offsets of the tensors). It
/// hashes nothing: in format version 3 the file is identified by its tensors' hashes, which
/// the callers take ([`super::manifest::tensor_table`]).
pub(crate) struct WeightWriter<W: Write> {
    pub(crate) inner: W,
    pub(crate) pos: u64,
}

impl WeightWriter<DirectWriter> {
    /// Creates `path` (the bundle's weight file) for writing around the page cache
    /// ([`DirectWriter`]: 8 MiB direct writes on a thread of their own).
    pub(crate) fn create(path: &Path) -> Result<Self, BundleError> {
        Ok(WeightWriter {
            inner: DirectWriter::create(path).map_err(io_err(path))?,
            pos: 0,
        })
    }

    /// Zero padding up to the next multiple of [`ALIGNMENT`]; returns the new position.
    pub(crate) fn align(&mut self, path: &Path) -> Result<u64, BundleError> {
        let pad = (ALIGNMENT - self.pos % ALIGNMENT) % ALIGNMENT;
        self.write_all(&[0u8; ALIGNMENT as usize][..pad as usize])
            .map_err(io_err(path))?;
        Ok(self.pos)
    }

    /// Writes the rest and syncs the file; returns its size in bytes.
    pub(crate) fn finish(self, path: &Path) -> Result<u64, BundleError> {
        let size = self.pos;
        self.inner.finish().map_err(io_err(path))?;
        Ok(size)
    }
}

/// A bundle being written: a temporary directory beside the output, renamed into place by
/// [`Staging::commit`] once the manifest is written, removed if dropped before that. Every
/// writer (`pack`, `gguf-to-ternary`, `palettize` from any input) goes through it, so every
/// bundle carries the GPU kernels: they are translated here, before any tensor is converted
/// (a kernel that cannot be shipped fails the write at once), and `commit` writes those its
/// tensors' encodings need (`runtime::gpu::kernels::needed`).
pub(crate) struct Staging {
    dir: util::StagingDir,
    output: PathBuf,
    kernels: Vec<kernels::KernelFile>,
}

impl Staging {
    pub(crate) fn new(output: &Path) -> Result<Staging, BundleError> {
        let kernels = kernels::current()?;
        Ok(Staging {
            dir: util::StagingDir::beside(output)?,
            output: output.to_path_buf(),
            kernels,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes the tokenizer, the kernels and the manifest (files sorted, the weight file of
    /// `weights_size` bytes listed by its tensor table, digests over them), then renames the
    /// directory into place. Returns the manifest and its length in bytes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn commit(
        mut self,
        weights_size: u64,
        tokenizer: TokenizerRef,
        tokenizer_bytes: &[u8],
        model: ModelConfig,
        source: Source,
        tensors: Vec<TensorEntry>,
        command_line: Vec<String>,
        buckets: &[u64],
    ) -> Result<(Manifest, u64), BundleError> {
        let tok_path = self.path().join(TOKENIZER_FILE);
        std::fs::write(&tok_path, tokenizer_bytes).map_err(io_err(&tok_path))?;
        let mut files = vec![FileEntry::hashed(
            TOKENIZER_FILE,
            tokenizer_bytes.len() as u64,
            util::sha256_hex(tokenizer_bytes),
        )];
        // The kernels of the tensors' encodings and those of none (kernels::needed).
        let stems = crate::runtime::gpu::kernels::encodings_of(&tensors);
        let kernels: Vec<kernels::KernelFile> = std::mem::take(&mut self.kernels)
            .into_iter()
            .filter(|k| crate::runtime::gpu::kernels::needed(&k.entry.name, &stems))
            .collect();
        files.extend(write_kernel_files(self.path(), &kernels)?);
        let functions = functions_for(&model, buckets);
        let mut manifest = Manifest {
            format: FORMAT.into(),
            format_version: FORMAT_VERSION,
            producer: Producer {
                tool: "lowbit".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                git_revision: option_env!("LOWBIT_GIT_REVISION")
                    .unwrap_or("unknown")
                    .into(),
                command_line,
            },
            source,
            model,
            functions,
            tensors,
            tokenizer,
            kernels: kernels.iter().map(|k| k.entry.clone()).collect(),
            files,
            bundle_digest: String::new(),
            manifest_digest: None,
        };
        let weights = manifest.weight_file_entry(WEIGHTS_FILE, weights_size);
        manifest.files.push(weights);
        manifest.files.sort_by(|a, b| a.path.cmp(&b.path));
        manifest.seal();
        let mlen = write_manifest(self.path(), &self.output, &manifest)?;
        self.dir
            .publish(|| rename_dir_noclobber(self.path(), &self.output))?;
        // The directory now lives at `output`; keep tempfile from removing it.
        self.dir.keep();
        Ok((manifest, mlen))
    }
}

/// Writes `kernels/` into the bundle directory `dir`; returns the files' entries.
fn write_kernel_files(
    dir: &Path,
    files: &[kernels::KernelFile],
) -> Result<Vec<FileEntry>, BundleError> {
    let kdir = dir.join(KERNELS_DIR);
    if !files.is_empty() {
        std::fs::create_dir(&kdir).map_err(io_err(&kdir))?;
    }
    let mut out = Vec::with_capacity(files.len());
    for k in files {
        let p = dir.join(&k.entry.file);
        std::fs::write(&p, &k.bytes).map_err(io_err(&p))?;
        out.push(FileEntry::hashed(
            k.entry.file.clone(),
            k.entry.bytes,
            k.entry.sha256.clone(),
        ));
    }
    Ok(out)
}

/// Writes `manifest.json` (pretty JSON and a newline) into `dir`; errors name it at `output`,
/// where it is going. Returns its length in bytes.
fn write_manifest(dir: &Path, output: &Path, manifest: &Manifest) -> Result<u64, BundleError> {
    let mut mbytes = serde_json::to_vec_pretty(manifest).map_err(|e| BundleError::Manifest {
        path: output.join(MANIFEST_FILE),
        detail: e.to_string(),
    })?;
    mbytes.push(b'\n');
    let mpath = dir.join(MANIFEST_FILE);
    std::fs::write(&mpath, &mbytes).map_err(io_err(&mpath))?;
    Ok(mbytes.len() as u64)
}

impl<W: Write> Write for WeightWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.pos += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Rows per parallel work item when packing a ternary tensor.
fn rows_per_chunk(k: u64) -> usize {
    // About 1 MiB of f32 per chunk.
    ((1 << 18) / k.max(1)).max(1) as usize
}

/// The (row, block in row, fault) of the first bad block of a chunk.
type ChunkFault = (u64, u64, ternary::BlockFault);

crate::multiversion! {
    /// Packs rows `r0..r1` into `codes` (their little-endian u32 words) and `scales` (their
    /// f16 scale bits, little-endian). A TQ2_0 source is recovered in the code domain
    /// ([`ternary::recover_tq2_0_words`]); a TQ1_0 source is dequantized and recovered from
    /// both routes ([`ternary::recover_block`]); otherwise (`--ternarize`) each block is
    /// quantized with the TQ2_0 rule.
    fn pack_rows(ty: GgmlType, recover: bool, data: &[u8], row_bytes: usize, k: usize, r0: usize, r1: usize, codes: &mut [u8], scales: &mut [u8]) -> Result<(), ChunkFault> {
        let blocks_per_row = k / BLOCK;
        let ts = ty.type_size();
        let mut words = [0u32; WORDS_PER_BLOCK];
        let mut put = |i: usize, d_bits: u16, words: &[u32; WORDS_PER_BLOCK]| {
            scales[2 * i..2 * i + 2].copy_from_slice(&d_bits.to_le_bytes());
            let out = &mut codes[i * 4 * WORDS_PER_BLOCK..(i + 1) * 4 * WORDS_PER_BLOCK];
            for (o, w) in out.chunks_exact_mut(4).zip(words) {
                o.copy_from_slice(&w.to_le_bytes());
            }
        };
        if recover && ty == GgmlType::TQ2_0 {
            for r in r0..r1 {
                let src = &data[r * row_bytes..(r + 1) * row_bytes];
                for (b, block) in src.chunks_exact(ts).enumerate() {
                    let d_bits = ternary::recover_tq2_0_words(block, &mut words)
                        .map_err(|f| (r as u64, b as u64, f))?;
                    put((r - r0) * blocks_per_row + b, d_bits, &words);
                }
            }
            return Ok(());
        }
        let mut row = vec![0f32; k];
        for r in r0..r1 {
            let src = &data[r * row_bytes..(r + 1) * row_bytes];
            // Whole blocks of a dequantizable type, checked by the caller.
            quant::dequantize_body_checked(ty, src, &mut row);
            for b in 0..blocks_per_row {
                let w = &row[b * BLOCK..(b + 1) * BLOCK];
                let blk: TernaryBlock = if recover {
                    match ternary::decode_block(ty, &src[b * ts..(b + 1) * ts]) {
                        Some((d_bits, codes)) => ternary::recover_block(d_bits, &codes, w),
                        None => Err(ternary::BlockFault::NonFiniteScale { d_bits: 0 }),
                    }
                } else {
                    ternary::quantize_tq2_0_block(w)
                }
                .map_err(|f| (r as u64, b as u64, f))?;
                ternary::pack_block(&blk.codes, &mut words);
                put((r - r0) * blocks_per_row + b, blk.d_bits, &words);
            }
        }
        Ok(())
    }
}

/// Packs one tensor to the ternary layout. Returns (codes: the u32 words as little-endian
/// bytes, scales: the f16 scale bits as little-endian bytes), both row-major.
fn pack_ternary(
    file: &GgufFile,
    t: &TensorInfo,
    p: Plan,
) -> Result<(Vec<u8>, Vec<u8>), BundleError> {
    let k = t.row_len();
    let n = t.n_rows();
    if !k.is_multiple_of(BLOCK as u64) {
        return Err(BundleError::KNotMultiple {
            file: file.path().to_path_buf(),
            tensor: t.name.clone(),
            k,
        });
    }
    if p == Plan::Ternarize && !t.ty.can_dequantize() {
        return Err(BundleError::Tensor {
            file: file.path().to_path_buf(),
            tensor: t.name.clone(),
            detail: format!("type {} cannot be dequantized for --ternarize", t.ty),
        });
    }
    let data = file.tensor_data(t);
    let blocks_per_row = (k / BLOCK as u64) as usize;
    let row_bytes = t.ty.bytes_for(k).unwrap_or(0) as usize;
    let chunk_rows = rows_per_chunk(k);
    let n_blocks = n as usize * blocks_per_row;
    // Every byte is written by exactly one chunk below.
    let mut codes = vec![0u8; n_blocks * 4 * WORDS_PER_BLOCK];
    let mut scales = vec![0u8; n_blocks * 2];
    let faults: Vec<ChunkFault> = codes
        .par_chunks_mut(chunk_rows * blocks_per_row * 4 * WORDS_PER_BLOCK)
        .zip(scales.par_chunks_mut(chunk_rows * blocks_per_row * 2))
        .enumerate()
        .filter_map(|(c, (codes, scales))| {
            let r0 = c * chunk_rows;
            let r1 = ((c + 1) * chunk_rows).min(n as usize);
            pack_rows(
                t.ty,
                p == Plan::Recover,
                data,
                row_bytes,
                k as usize,
                r0,
                r1,
                codes,
                scales,
            )
            .err()
        })
        .collect();
    // Chunks come back in row order: the first fault is the lowest row's.
    if let Some((row, b, fault)) = faults.into_iter().next() {
        return Err(BundleError::Block {
            file: file.path().to_path_buf(),
            tensor: t.name.clone(),
            block: row * blocks_per_row as u64 + b,
            row,
            start: b * BLOCK as u64,
            end: (b + 1) * BLOCK as u64,
            fault,
        });
    }
    Ok((codes, scales))
}

/// What the main thread hands to [`FileSink`]'s thread: a tensor carried from the source map
/// (released from memory once written), bytes it owns, or a run of zero padding.
enum Piece<'a> {
    Source(&'a GgufFile, &'a TensorInfo),
    Owned(Vec<u8>),
    Zeros(usize),
}

/// `weights.bin` written on a thread of its own (the copies into the direct-I/O buffers), so
/// that each tensor's hash (the caller's) and the source's hash run beside it. Pieces go
/// through a bounded channel (a few tensors' worth at most in flight). (Hashing the tensors on
/// this thread instead, beside the packing of the next, measured no faster on two cores.)
struct FileSink<'scope, 'a> {
    tx: Option<std::sync::mpsc::SyncSender<Piece<'a>>>,
    handle: Option<std::thread::ScopedJoinHandle<'scope, Result<u64, BundleError>>>,
    path: &'scope Path,
    pos: u64,
}

impl<'scope, 'a: 'scope> FileSink<'scope, 'a> {
    fn spawn<'env>(
        s: &'scope std::thread::Scope<'scope, 'env>,
        path: &'scope Path,
    ) -> Result<Self, BundleError> {
        let mut w = WeightWriter::create(path)?;
        let (tx, rx) = std::sync::mpsc::sync_channel::<Piece<'a>>(4);
        let handle = s.spawn(move || {
            let zeros = [0u8; ALIGNMENT as usize];
            for piece in rx {
                match piece {
                    Piece::Source(f, t) => w.write_all(f.tensor_data(t)).map(|()| f.release(t)),
                    Piece::Owned(b) => w.write_all(&b),
                    Piece::Zeros(n) => w.write_all(&zeros[..n]),
                }
                .map_err(io_err(path))?;
            }
            w.finish(path)
        });
        Ok(FileSink {
            tx: Some(tx),
            handle: Some(handle),
            path,
            pos: 0,
        })
    }

    /// Queues `piece`; on a send failure (the thread stopped on an error) returns that error.
    fn put(&mut self, piece: Piece<'a>) -> Result<(), BundleError> {
        let n = match &piece {
            Piece::Source(f, t) => f.tensor_data(t).len(),
            Piece::Owned(b) => b.len(),
            Piece::Zeros(n) => *n,
        };
        if n == 0 {
            return Ok(());
        }
        self.pos += n as u64;
        let sent = self
            .tx
            .as_ref()
            .map(|tx| tx.send(piece).is_ok())
            .unwrap_or(false);
        if sent {
            Ok(())
        } else {
            Err(self.join().err().unwrap_or_else(|| self.stopped()))
        }
    }

    /// Zero padding up to the next multiple of [`ALIGNMENT`]; returns the new position.
    fn align(&mut self) -> Result<u64, BundleError> {
        let pad = (ALIGNMENT - self.pos % ALIGNMENT) % ALIGNMENT;
        self.put(Piece::Zeros(pad as usize))?;
        Ok(self.pos)
    }

    /// Closes the channel and waits for the file to be written and synced; returns its size.
    fn join(&mut self) -> Result<u64, BundleError> {
        self.tx = None;
        match self.handle.take() {
            Some(h) => h.join().expect("weights writer thread"),
            None => Err(self.stopped()),
        }
    }

    /// The error for a sink whose thread was already joined (its own error went to the
    /// first caller).
    fn stopped(&self) -> BundleError {
        BundleError::Io {
            path: self.path.to_path_buf(),
            source: std::io::Error::other("the weight file's writer thread has stopped"),
        }
    }
}

pub(crate) fn io_err(path: &Path) -> impl Fn(std::io::Error) -> BundleError + '_ {
    move |source| BundleError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The tokenizer reference for a GGUF file's tokenizer (written as [`TOKENIZER_FILE`]).
pub(crate) fn tokenizer_ref(file: &GgufFile) -> TokenizerRef {
    TokenizerRef {
        file: TOKENIZER_FILE.into(),
        model: file
            .get("tokenizer.ggml.model")
            .and_then(|v| v.as_str())
            .map(|s| s.into_owned())
            .unwrap_or_else(|| "none".into()),
        pre: file
            .get("tokenizer.ggml.pre")
            .and_then(|v| v.as_str())
            .map(|s| s.into_owned()),
        n_vocab: match file.get("tokenizer.ggml.tokens") {
            Some(crate::gguf::Value::Array(_, t)) => t.len() as u64,
            _ => 0,
        },
    }
}

/// The `main` function contract: one decode step.
pub fn main_function(m: &ModelConfig) -> Function {
    let spec = |name: &str, dtype: &str, shape: Vec<u64>, dynamic: Vec<u64>, d: &str| TensorSpec {
        name: name.into(),
        dtype: dtype.into(),
        shape,
        dynamic_dims: dynamic,
        description: d.into(),
    };
    let cache = vec![m.n_layer, m.n_head_kv, m.n_ctx, m.head_dim];
    Function {
        inputs: vec![
            spec("input_ids", "int32", vec![1, 1], vec![], "the token at this step; static [1,1]"),
            spec(
                "position_ids",
                "int32",
                vec![1, m.n_ctx],
                vec![1],
                "positions 0..=p of every token so far; length p+1 <= n_ctx; the last is this step's position and KV slot",
            ),
        ],
        states: vec![
            spec("keyCache", "float16", cache.clone(), vec![], "[n_layer, n_head_kv, n_ctx, head_dim], keys after RoPE, mutated in place"),
            spec("valueCache", "float16", cache, vec![], "[n_layer, n_head_kv, n_ctx, head_dim], mutated in place"),
        ],
        outputs: vec![spec(
            "logits",
            "float32",
            vec![1, 1, m.n_vocab],
            vec![],
            "next-token logits for this step",
        )],
    }
}

/// `prefill_S`: one prompt chunk of a static length `S` against the same KV state as `main`.
pub fn prefill_function(m: &ModelConfig, s: u64) -> Function {
    let spec = |name: &str, dtype: &str, shape: Vec<u64>, d: &str| TensorSpec {
        name: name.into(),
        dtype: dtype.into(),
        shape,
        dynamic_dims: vec![],
        description: d.into(),
    };
    let cache = vec![m.n_layer, m.n_head_kv, m.n_ctx, m.head_dim];
    Function {
        inputs: vec![
            spec(
                "input_ids",
                "int32",
                vec![1, s],
                "the chunk's tokens; static [1,S]; entries past the prompt are padding (any id)",
            ),
            spec(
                "position_ids",
                "int32",
                vec![1, s],
                "each token's position, contiguous from the sequence's next position; -1 marks padding, which is masked and writes no KV slot",
            ),
        ],
        states: vec![
            spec("keyCache", "float16", cache.clone(), "[n_layer, n_head_kv, n_ctx, head_dim], keys after RoPE, rows of the chunk's real positions written in place"),
            spec("valueCache", "float16", cache, "[n_layer, n_head_kv, n_ctx, head_dim], rows of the chunk's real positions written in place"),
        ],
        outputs: vec![spec(
            "logits",
            "float32",
            vec![1, 1, m.n_vocab],
            "next-token logits of the chunk's last real position",
        )],
    }
}

/// The function table of a bundle: `main` and one `prefill_S` per bucket.
pub fn functions_for(m: &ModelConfig, buckets: &[u64]) -> BTreeMap<String, Function> {
    let mut f = BTreeMap::new();
    f.insert("main".to_string(), main_function(m));
    for &b in buckets {
        f.insert(format!("prefill_{b}"), prefill_function(m, b));
    }
    f
}

/// The prefill buckets a writer records: `requested` (`--prefill-buckets`) checked against the
/// context, or the defaults up to it. Errors name the option.
pub fn resolve_buckets(requested: Option<&[u64]>, n_ctx: u64) -> Result<Vec<u64>, BundleError> {
    match requested {
        None => Ok(super::manifest::default_prefill_buckets(n_ctx)),
        Some(b) => {
            super::manifest::check_prefill_buckets(b, n_ctx).map_err(|detail| {
                BundleError::Manifest {
                    path: PathBuf::from("--prefill-buckets"),
                    detail: format!("{b:?}: {detail}"),
                }
            })?;
            Ok(b.to_vec())
        }
    }
}

/// Writes a bundle for `input` at `output` (which must not exist). `command_line` is recorded
/// in the manifest as given (callers pass file names, not full paths).
pub fn write_bundle(
    input: &Path,
    output: &Path,
    opts: &PackOptions,
    command_line: Vec<String>,
) -> Result<PackSummary, BundleError> {
    util::refuse_existing(output)?;
    let file = GgufFile::open(input)?;
    let plans: Vec<Plan> = file.tensors.iter().map(|t| plan(opts.mode, t)).collect();
    if let Mode::Ternary { ternarize } = opts.mode {
        if !plans.iter().any(|p| *p != Plan::Carry) {
            return Err(BundleError::NoTernary {
                file: input.to_path_buf(),
            });
        }
        let _ = ternarize;
    }
    let model = config::model_config(&file, opts.context)?;
    let buckets = resolve_buckets(opts.prefill_buckets.as_deref(), model.n_ctx)?;
    // The tensors the architecture needs, with their shapes: checked before anything is
    // written (a bundle the runtime could not build is never made).
    let layout = crate::arch::Layout::new(&model, &|name| file.tensor(name).map(|t| t.shape()))
        .map_err(|e| super::layout_error(input, e))?;
    // Every tensor the runtime reads, carried as it is, must be of a type it has kernels for
    // (the dequantizable ones: the CPU's and the GPU's decoders are those).
    for r in layout.tensors() {
        if let Some((t, Plan::Carry)) = file
            .tensors
            .iter()
            .zip(&plans)
            .find(|(t, _)| t.name == r.name)
        {
            if !t.ty.can_dequantize() {
                return Err(BundleError::Tensor {
                    file: input.to_path_buf(),
                    tensor: t.name.clone(),
                    detail: format!(
                        "type {}: the runtime has no kernel for it (it runs {}); requantize the \
                         model to one of those (llama-quantize)",
                        t.ty,
                        GgmlType::all()
                            .filter(|ty| ty.can_dequantize())
                            .map(|ty| ty.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
            }
        }
    }

    let tmp = Staging::new(output)?;

    // Hash the source on another thread while the tensors are converted.
    let (source_sha256, written) = std::thread::scope(|s| {
        // Plain reads, not the map: hashing must not make the whole file resident.
        let hasher = s.spawn(|| util::sha256_file(input));
        let written = write_contents(&file, tmp.path(), &plans, opts);
        (hasher.join().expect("hash thread"), written)
    });
    let source_sha256 = source_sha256.map_err(io_err(input))?;
    let (tensors, weights_size) = written?;

    let tok_bytes = config::tokenizer_file_bytes(&file);
    let source = Source {
        file_name: input
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        size: file.file_len(),
        sha256: source_sha256,
        gguf_version: Some(file.version),
        format: None,
        architecture: model.architecture.clone(),
        tensor_count: file.tensors.len() as u64,
    };
    let (manifest, manifest_len) = tmp.commit(
        weights_size,
        tokenizer_ref(&file),
        &tok_bytes,
        model,
        source,
        tensors,
        command_line,
        &buckets,
    )?;
    Ok(PackSummary {
        tensors: manifest.tensors.len(),
        ternary: manifest
            .tensors
            .iter()
            .filter(|t| matches!(t.encoding, Encoding::Ternary2 { .. }))
            .count(),
        carried: manifest
            .tensors
            .iter()
            .filter(|t| matches!(t.encoding, Encoding::Gguf { .. }))
            .count(),
        source_bytes: file.file_len(),
        bundle_bytes: manifest.files.iter().map(|f| f.size).sum::<u64>() + manifest_len,
        bundle_digest: manifest.bundle_digest,
    })
}

/// Writes `weights.bin` into `dir`. Returns the tensor entries and the file's size.
///
/// Two streams of SHA256 run at once: the source's (the caller's thread) and each tensor's
/// (this thread); [`FileSink`] writes on a third. Each output byte is made once, hashed once
/// and handed on by move.
fn write_contents(
    file: &GgufFile,
    dir: &Path,
    plans: &[Plan],
    opts: &PackOptions,
) -> Result<(Vec<TensorEntry>, u64), BundleError> {
    let wpath = dir.join(WEIGHTS_FILE);
    std::thread::scope(|s| {
        let mut sink = FileSink::spawn(s, &wpath)?;
        let entries = write_tensors(file, plans, opts, &mut sink);
        let weights = sink.join();
        // A tensor's error comes first (the sink then only reports the closed channel).
        Ok((entries?, weights?))
    })
}

fn write_tensors<'s, 'a: 's>(
    file: &'a GgufFile,
    plans: &[Plan],
    opts: &PackOptions,
    w: &mut FileSink<'s, 'a>,
) -> Result<Vec<TensorEntry>, BundleError> {
    let total: u64 = file.tensors.iter().map(|t| t.n_bytes).sum();
    let pb = util::progress_bar(total, opts.quiet, true);
    let mut entries = Vec::with_capacity(file.tensors.len());
    for (i, (t, &p)) in file.tensors.iter().zip(plans).enumerate() {
        if opts.fail_after_tensors == Some(i) {
            return Err(BundleError::Injected(i));
        }
        pb.set_message(format!(
            "tensor {}/{} {}",
            i + 1,
            file.tensors.len(),
            t.name
        ));
        let offset = w.align()?;
        let mut th = Sha256::new();
        let (encoding, length) = match p {
            Plan::Carry => {
                let bytes = file.tensor_data(t);
                th.update(bytes);
                w.put(Piece::Source(file, t))?;
                (
                    Encoding::Gguf {
                        ggml_type: t.ty.name().into(),
                        ggml_type_id: t.ty.id(),
                        block_size: t.ty.block_size() as u64,
                        type_size: t.ty.type_size() as u64,
                    },
                    t.n_bytes,
                )
            }
            Plan::Recover | Plan::Ternarize => {
                let (codes, sbytes) = pack_ternary(file, t, p)?;
                file.release(t);
                let codes_len = codes.len() as u64;
                let gap = (ALIGNMENT - codes_len % ALIGNMENT) % ALIGNMENT;
                let scales_len = sbytes.len() as u64;
                th.update(&codes);
                th.update(&[0u8; ALIGNMENT as usize][..gap as usize]);
                th.update(&sbytes);
                w.put(Piece::Owned(codes))?;
                w.put(Piece::Zeros(gap as usize))?;
                w.put(Piece::Owned(sbytes))?;
                (
                    Encoding::Ternary2 {
                        block_size: BLOCK as u64,
                        codes_per_word: ternary::CODES_PER_WORD as u64,
                        origin: if p == Plan::Recover {
                            "recovered".into()
                        } else {
                            "ternarized".into()
                        },
                        codes_offset: 0,
                        codes_length: codes_len,
                        scales_offset: codes_len + gap,
                        scales_length: scales_len,
                        scale_dtype: "float16".into(),
                        fast_path: ternary::fast_path(t.n_rows(), t.row_len()),
                    },
                    codes_len + gap + scales_len,
                )
            }
        };
        entries.push(TensorEntry {
            name: t.name.clone(),
            shape: t.shape(),
            source_type: t.ty.name().into(),
            source_type_id: t.ty.id(),
            encoding,
            file: WEIGHTS_FILE.into(),
            offset,
            length,
            sha256: hex::encode(th.finalize()),
        });
        pb.inc(t.n_bytes);
    }
    pb.finish_and_clear();
    Ok(entries)
}

/// Renames a directory to a path that must not exist, atomically refusing to replace one
/// that appeared meanwhile (`renameat2(RENAME_NOREPLACE)` on Linux).
fn rename_dir_noclobber(from: &Path, to: &Path) -> Result<(), BundleError> {
    #[cfg(target_os = "linux")]
    {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let (Ok(f), Ok(t)) = (
            CString::new(from.as_os_str().as_bytes()),
            CString::new(to.as_os_str().as_bytes()),
        ) else {
            return Err(BundleError::Io {
                path: to.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains NUL"),
            });
        };
        // SAFETY: both are valid NUL-terminated paths.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                f.as_ptr(),
                libc::AT_FDCWD,
                t.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            return Err(util::OutputError::Exists(to.to_path_buf()).into());
        }
        if e.raw_os_error() != Some(libc::EINVAL) && e.raw_os_error() != Some(libc::ENOSYS) {
            return Err(BundleError::Io {
                path: to.to_path_buf(),
                source: e,
            });
        }
        // The file system has no RENAME_NOREPLACE: fall through to check-then-rename.
    }
    util::refuse_existing(to)?;
    std::fs::rename(from, to).map_err(|source| BundleError::Io {
        path: to.to_path_buf(),
        source,
    })
}

/// What [`add_kernels`] did.
#[derive(Clone, Debug)]
pub struct AddKernelsSummary {
    /// Where the bundle with the kernels is (the input, or `-o`).
    pub output: PathBuf,
    /// Every module of this build for the bundle's encodings and what happened to it: `new`
    /// (the bundle lacked it), `replaced` (its WGSL or MSL differed), `unchanged`.
    pub modules: Vec<(String, &'static str)>,
    /// Modules the bundle had that are not among those (another build's, or another
    /// encoding's): removed.
    pub removed: Vec<String>,
    /// Kernel files written (WGSL and MSL).
    pub files: usize,
    pub old_digest: String,
    pub new_digest: String,
    /// Whether the bundle had a signature, which the result does not carry (it covered the
    /// old digests).
    pub signature_dropped: bool,
}

/// `convert add-kernels`: gives the bundle at `bundle` this binary's GPU kernels for its
/// tensors' encodings (`runtime::gpu::kernels::for_tensors`; adds them to a bundle made before
/// kernels shipped in bundles, or replaces the ones it carries, other encodings' included) and
/// recomputes the manifest's `kernels`, `files` and digests (as format version 3, so a
/// version-1 or -2 bundle comes out as version 3, its weight file listed by its tensor table);
/// every other file and the rest of the manifest stay
/// byte for byte, so the result equals what this binary would have written. A signature
/// (`signature.json`) is left behind: it covers the old digests. The bundle must verify first (`convert verify` without a source), else nothing is
/// written, except that kernels whose files are intact but do not parse, validate or
/// re-derive here are no reason to refuse: they are what is replaced.
///
/// Never half-written: with `output` the new bundle is staged beside it (files copied) and
/// renamed into place, refusing an existing path or one inside the input; without, it is
/// staged beside the bundle (files hard-linked, copied where a link fails) and swapped with it
/// in one `renameat2(RENAME_EXCHANGE)` (on file systems without it: two renames under the
/// signal lock, the first undone if the second fails), then the old one is removed.
pub fn add_kernels(bundle: &Path, output: Option<&Path>) -> Result<AddKernelsSummary, BundleError> {
    // A path ending in `.` or `..` (`convert add-kernels .` inside the bundle) has no name to
    // stage a replacement beside: name the directory it resolves to.
    let named;
    let raw = bundle.as_os_str().as_encoded_bytes();
    let dots = [&b"."[..], b".."]
        .iter()
        .any(|d| raw == *d || raw.ends_with(&[b"/", *d].concat()));
    let bundle = if dots || bundle.file_name().is_none() {
        named = bundle.canonicalize().map_err(io_err(bundle))?;
        named.as_path()
    } else {
        bundle
    };
    if let Some(out) = output {
        util::refuse_existing(out)?;
        util::refuse_output_inside(bundle, out)?;
    }
    let report = super::verify::verify(bundle, &super::verify::VerifyOptions::default())?;
    // Kernels that are intact (every file its listed size and digest) but do not parse,
    // validate or re-derive here (made by another naga) are what this command replaces: only
    // the other failures refuse the bundle. Each failed kernel check is one failure.
    let kernel_faults: Vec<String> = report
        .kernels
        .iter()
        .filter(|k| !k.passed)
        .map(|k| format!("{}: {}", k.file, k.detail.as_deref().unwrap_or("failed")))
        .collect();
    let others: Vec<&str> = report
        .failures
        .iter()
        .filter(|f| !kernel_faults.contains(f))
        .map(String::as_str)
        .collect();
    // A kernel whose file failed its size or digest check is a file failure too (in
    // `others`), so a damaged bundle is still refused.
    if !others.is_empty() {
        const SHOWN: usize = 5;
        let f = &others;
        let mut detail = format!(
            "does not verify, so no kernels were added: {}",
            f[..f.len().min(SHOWN)].join("; ")
        );
        if f.len() > SHOWN {
            detail.push_str(&format!("; and {} more", f.len() - SHOWN));
        }
        detail.push_str(" (`convert verify` lists every failure)");
        return Err(BundleError::Integrity {
            path: bundle.to_path_buf(),
            detail,
        });
    }
    let old = super::reader::read_manifest(bundle)?;
    // This build's kernels for the bundle's encodings (translated here, only those): the
    // others a bundle made before carries are removed.
    let new_kernels =
        kernels::translate_all(&crate::runtime::gpu::kernels::for_tensors(&old.tensors))?;
    let signature_dropped = bundle.join(super::manifest::SIGNATURE_FILE).exists();

    // What changes, module by module.
    let old_files: BTreeMap<(&str, KernelKind), &str> = old
        .kernels
        .iter()
        .map(|k| ((k.name.as_str(), k.kind), k.sha256.as_str()))
        .collect();
    let mut modules = Vec::new();
    for pair in new_kernels.chunks(2) {
        let name = pair[0].entry.name.as_str();
        let same = pair
            .iter()
            .all(|k| old_files.get(&(name, k.entry.kind)) == Some(&k.entry.sha256.as_str()));
        let had = old_files.keys().any(|(n, _)| *n == name);
        modules.push((
            name.to_string(),
            match (had, same) {
                (false, _) => "new",
                (true, true) => "unchanged",
                (true, false) => "replaced",
            },
        ));
    }
    let removed: Vec<String> = old
        .kernels
        .iter()
        .map(|k| k.name.as_str())
        .filter(|n| !new_kernels.iter().any(|k| k.entry.name == *n))
        .collect::<BTreeSet<&str>>()
        .into_iter()
        .map(String::from)
        .collect();

    let old_kernel_files: BTreeSet<&str> = old.kernels.iter().map(|k| k.file.as_str()).collect();
    let kept: Vec<FileEntry> = old
        .files
        .iter()
        .filter(|f| !old_kernel_files.contains(f.path.as_str()))
        .cloned()
        .collect();
    let mut manifest = old.clone();
    manifest.kernels = new_kernels.iter().map(|k| k.entry.clone()).collect();
    manifest.files = Vec::with_capacity(kept.len() + new_kernels.len());
    for f in &kept {
        if !old.holds_tensors(&f.path) {
            manifest.files.push(f.clone());
            continue;
        }
        // A weight file of version 1 or 2 (listed by the SHA256 of its bytes) becomes a
        // version-3 entry (its tensor table), which requires zeros outside the tensors: every
        // writer pads with zeros, so only a hand-made file fails here.
        if f.tensors_sha256.is_none() {
            if let Some(at) = super::reader::nonzero_outside_tensors(bundle, &old, &f.path)? {
                return Err(BundleError::Integrity {
                    path: bundle.join(&f.path),
                    detail: format!(
                        "byte {at} lies outside every tensor and is not zero: format version {FORMAT_VERSION} lists a weight file by its tensors and requires zero padding, so this bundle cannot be rewritten (`convert pack` or `gguf-to-ternary` remakes it from its source)"
                    ),
                });
            }
        }
        manifest.files.push(old.weight_file_entry(&f.path, f.size));
    }
    manifest.files.extend(
        new_kernels.iter().map(|k| {
            FileEntry::hashed(k.entry.file.clone(), k.entry.bytes, k.entry.sha256.clone())
        }),
    );
    manifest.files.sort_by(|a, b| a.path.cmp(&b.path));
    // Written as this build writes bundles: format version 3, both digests over the content
    // (a version-1 or -2 bundle comes out as version 3). A signature is not carried over (the
    // digests it covers change); sign the result again.
    manifest.seal();

    let target = output.unwrap_or(bundle);
    let staging = util::StagingDir::beside(target)?;
    let new_dir = staging.path().join("bundle");
    std::fs::create_dir(&new_dir).map_err(io_err(&new_dir))?;
    let perms = std::fs::metadata(bundle)
        .map_err(io_err(bundle))?
        .permissions();
    std::fs::set_permissions(&new_dir, perms).map_err(io_err(&new_dir))?;
    for f in &kept {
        let (from, to) = (bundle.join(&f.path), new_dir.join(&f.path));
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        let linked = output.is_none() && std::fs::hard_link(&from, &to).is_ok();
        if !linked {
            std::fs::copy(&from, &to).map_err(io_err(&to))?;
        }
    }
    write_kernel_files(&new_dir, &new_kernels)?;
    write_manifest(&new_dir, target, &manifest)?;
    match output {
        Some(out) => staging.publish(|| rename_dir_noclobber(&new_dir, out))?,
        None => staging.publish(|| swap_dirs(&new_dir, bundle, &staging.path().join("old")))?,
    }
    // The staging directory now holds nothing (after a rename) or the old bundle (after a
    // swap); dropping it removes it.
    drop(staging);
    Ok(AddKernelsSummary {
        output: target.to_path_buf(),
        modules,
        removed,
        files: new_kernels.len(),
        old_digest: old.bundle_digest,
        new_digest: manifest.bundle_digest,
        signature_dropped,
    })
}

/// Swaps the directories `new` and `dest` (`renameat2(RENAME_EXCHANGE)` on Linux), so `dest`
/// is the new one and `new` the old. Where the file system or OS lacks the exchange, moves
/// `dest` to `aside`, then `new` to `dest`, and moves `dest` back if that fails.
fn swap_dirs(new: &Path, dest: &Path, aside: &Path) -> Result<(), BundleError> {
    #[cfg(target_os = "linux")]
    {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        if let (Ok(f), Ok(t)) = (
            CString::new(new.as_os_str().as_bytes()),
            CString::new(dest.as_os_str().as_bytes()),
        ) {
            // SAFETY: both are valid NUL-terminated paths.
            let rc = unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    f.as_ptr(),
                    libc::AT_FDCWD,
                    t.as_ptr(),
                    libc::RENAME_EXCHANGE,
                )
            };
            if rc == 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINVAL) && e.raw_os_error() != Some(libc::ENOSYS) {
                return Err(BundleError::Io {
                    path: dest.to_path_buf(),
                    source: e,
                });
            }
        }
    }
    swap_by_renames(new, dest, aside)
}

/// [`swap_dirs`] without an exchange: `dest` to `aside`, `new` to `dest` (undone on failure).
fn swap_by_renames(new: &Path, dest: &Path, aside: &Path) -> Result<(), BundleError> {
    std::fs::rename(dest, aside).map_err(io_err(dest))?;
    if let Err(e) = std::fs::rename(new, dest) {
        let _ = std::fs::rename(aside, dest);
        return Err(BundleError::Io {
            path: dest.to_path_buf(),
            source: e,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swaps_by_exchange_and_by_renames() {
        let d = tempfile::tempdir().unwrap();
        let (new, dest, aside) = (
            d.path().join("new"),
            d.path().join("dest"),
            d.path().join("aside"),
        );
        for (dir, tag) in [(&new, "new"), (&dest, "old")] {
            std::fs::create_dir(dir).unwrap();
            std::fs::write(dir.join("f"), tag).unwrap();
        }
        let tag = |p: &Path| std::fs::read_to_string(p.join("f")).unwrap();
        swap_dirs(&new, &dest, &aside).unwrap();
        assert_eq!((tag(&dest), tag(&new)), ("new".into(), "old".into()));
        swap_by_renames(&new, &dest, &aside).unwrap();
        assert_eq!((tag(&dest), tag(&aside)), ("old".into(), "new".into()));
        assert!(!new.exists());
        // A failed second rename (nothing at `new`) puts `dest` back.
        let e = swap_by_renames(&new, &dest, &d.path().join("aside2")).unwrap_err();
        assert!(matches!(e, BundleError::Io { .. }), "{e}");
        assert_eq!(tag(&dest), "old");
    }
}
