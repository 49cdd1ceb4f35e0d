//! Typed errors for GGUF parsing. Every error carries the file and the byte offset at which
//! the offending field starts, and names the field, key or tensor.

use std::fmt;
use std::path::{Path, PathBuf};

use super::MAX_ARRAY_DEPTH;
use super::MAX_ARRAY_LEN;
use super::MAX_DIMS;
use super::MAX_TENSOR_NAME_LEN;

/// A GGUF file could not be read. `offset` is the absolute byte offset in `file` of the field
/// that was being read when the problem was found.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufError {
    pub file: PathBuf,
    pub offset: u64,
    pub kind: ErrorKind,
}

impl GgufError {
    pub(crate) fn new(file: &Path, offset: u64, kind: ErrorKind) -> Self {
        GgufError {
            file: file.to_path_buf(),
            offset,
            kind,
        }
    }
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} (at byte offset {})",
            self.file.display(),
            self.kind,
            self.offset
        )
    }
}

impl std::error::Error for GgufError {}

/// What went wrong. Field names follow the GGUF specification
/// (`ggml/docs/gguf.md` in llama.cpp): `tensor_count`, `metadata_kv_count`, `n_dims`, `ne`, ...
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The file could not be opened or mapped.
    #[error("cannot read file: {0}")]
    Io(String),
    /// The first four bytes are not `GGUF`.
    #[error("bad magic: expected \"GGUF\" (47 47 55 46), found {found:02x?}")]
    BadMagic { found: Vec<u8> },
    /// A version other than 2 or 3 (v1 used 32-bit counts and is obsolete).
    #[error("unsupported GGUF version {0} (this reader supports versions 2 and 3)")]
    UnsupportedVersion(u32),
    /// The version field reads as a valid version only when byte-swapped: a big-endian file.
    #[error("byte-swapped GGUF: version reads as {raw:#010x}, i.e. big-endian version {swapped}; only little-endian GGUF files are supported")]
    BigEndian { raw: u32, swapped: u32 },
    /// The file ends inside a field.
    #[error("truncated: {field} needs {needed} bytes but only {available} remain")]
    Truncated {
        field: String,
        needed: u64,
        available: u64,
    },
    /// A count that cannot possibly fit in the bytes that remain.
    #[error("{field} = {count} cannot fit: {remaining} bytes remain and each entry needs at least {min_entry_size}")]
    CountTooLarge {
        field: String,
        count: u64,
        remaining: u64,
        min_entry_size: u64,
    },
    /// A string or array length that runs past the end of the file.
    #[error("{field}: length {len} runs past end of file ({remaining} bytes remain)")]
    LengthPastEnd {
        field: String,
        len: u64,
        remaining: u64,
    },
    /// An array longer than [`MAX_ARRAY_LEN`] elements.
    #[error("metadata key {key:?}: array of {len} elements exceeds the limit of {MAX_ARRAY_LEN}")]
    ArrayTooLong { key: String, len: u64 },
    /// Arrays of arrays nested deeper than [`MAX_ARRAY_DEPTH`].
    #[error("metadata key {key:?}: arrays nested deeper than {MAX_ARRAY_DEPTH} levels")]
    NestingTooDeep { key: String },
    /// A metadata value type id outside 0..=12.
    #[error("metadata key {key:?}: unknown value type {type_id}")]
    UnknownValueType { key: String, type_id: u32 },
    /// A key or tensor name that is not valid UTF-8.
    #[error("{field}: not valid UTF-8")]
    InvalidUtf8 { field: String },
    /// The same metadata key twice.
    #[error("duplicate metadata key {key:?}")]
    DuplicateKey { key: String },
    /// `general.alignment` is not a u32, is 0, or is not a power of two.
    #[error("metadata key \"general.alignment\": {detail}")]
    BadAlignment { detail: String },
    /// A tensor with an empty name.
    #[error("tensor #{index}: empty name")]
    EmptyTensorName { index: u64 },
    /// A tensor name of [`MAX_TENSOR_NAME_LEN`] bytes or more (ggml's `GGML_MAX_NAME`, which
    /// counts the terminating NUL).
    #[error("tensor #{index} {name:?}: name is {len} bytes long, ggml's limit is {} (GGML_MAX_NAME {MAX_TENSOR_NAME_LEN} with its NUL)", MAX_TENSOR_NAME_LEN - 1)]
    TensorNameTooLong {
        index: u64,
        name: String,
        len: usize,
    },
    /// Two tensors with the same name.
    #[error("duplicate tensor name {name:?}")]
    DuplicateTensor { name: String },
    /// More than [`MAX_DIMS`] dimensions.
    #[error("tensor {tensor:?}: n_dims = {n_dims} exceeds the maximum of {MAX_DIMS}")]
    TooManyDims { tensor: String, n_dims: u32 },
    /// A dimension larger than `i64::MAX` (ggml stores `ne` as `int64_t`).
    #[error("tensor {tensor:?}: ne[{dim}] = {value} is larger than i64::MAX")]
    DimTooLarge {
        tensor: String,
        dim: usize,
        value: u64,
    },
    /// The element count or byte size overflows 64 bits.
    #[error("tensor {tensor:?}: size of ne = {ne:?} overflows")]
    ShapeOverflow { tensor: String, ne: Vec<u64> },
    /// A type id that no ggml version defined.
    #[error("tensor {tensor:?}: unknown ggml type id {type_id}")]
    UnknownGgmlType { tensor: String, type_id: u32 },
    /// A type id that ggml removed.
    #[error("tensor {tensor:?}: ggml type id {type_id} ({name}) was removed from ggml; re-quantize the model with a current llama.cpp")]
    RemovedGgmlType {
        tensor: String,
        type_id: u32,
        name: &'static str,
    },
    /// `ne[0]` is not a multiple of the type's block size.
    #[error(
        "tensor {tensor:?}: ne[0] = {ne0} is not a multiple of the {ty} block size {block_size}"
    )]
    NotBlockMultiple {
        tensor: String,
        ty: &'static str,
        ne0: u64,
        block_size: usize,
    },
    /// A tensor's offset is not a multiple of the alignment.
    #[error(
        "tensor {tensor:?}: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    Misaligned {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    /// A tensor's data runs past the end of the file (the file is shorter than its type and
    /// shape need).
    #[error("tensor {tensor:?}: data occupies bytes {start}..{end} but the file is {file_len} bytes long")]
    DataPastEnd {
        tensor: String,
        start: u64,
        end: u64,
        file_len: u64,
    },
    /// Two tensors' data ranges overlap.
    #[error("tensor {tensor:?}: data bytes {start}..{end} overlap tensor {other:?} at bytes {other_start}..{other_end}")]
    Overlap {
        tensor: String,
        start: u64,
        end: u64,
        other: String,
        other_start: u64,
        other_end: u64,
    },
}
