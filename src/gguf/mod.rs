//! GGUF reader: header, metadata and tensor infos, with tensor data memory-mapped.
//!
//! Format: `ggml/docs/gguf.md` in llama.cpp. All integers little-endian:
//!
//! ```text
//! magic "GGUF" | version u32 | tensor_count u64 | metadata_kv_count u64
//! metadata_kv_count x (key: string, value_type: u32, value)
//! tensor_count x (name: string, n_dims: u32, ne: [u64; n_dims], type: u32, offset: u64)
//! padding to general.alignment (default 32)
//! tensor data; each tensor at data_start + offset
//! string = len u64 + bytes; array = elem_type u32 + count u64 + values
//! ```
//!
//! Why not gguf-rs-lib: its synchronous reader reads only version 3, and its memory-mapped
//! reader checks only the magic and the version. This reader parses versions 2 and 3 from a
//! memory map and checks every count, length, shape, type id and data range against the file
//! before anything is allocated or read, reporting the byte offset of the offending field.
//! gguf-rs-lib stays in the test suite as an independent parser to cross-check against.

mod error;
mod value;

pub use error::{ErrorKind, GgufError};
pub use value::{Value, ValueType, SUMMARY_ARRAY_LEN};

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::ggml::{GgmlType, TypeId};

/// `GGML_MAX_DIMS`: tensors have at most four dimensions.
pub const MAX_DIMS: usize = 4;
/// Arrays of arrays deeper than this are refused. ggml's own reader accepts no nesting at all;
/// gguf-py can write one level; two is generous and keeps recursion bounded.
pub const MAX_ARRAY_DEPTH: usize = 2;
/// Metadata arrays longer than this are refused. Each element is held as a 32-byte [`Value`],
/// so an array of one-byte values costs 32 bytes of memory per byte of file; the cap bounds
/// that at 512 MiB per array. Real vocabularies have at most about a million entries.
pub const MAX_ARRAY_LEN: u64 = 1 << 24;
/// `GGML_MAX_NAME`: ggml keeps a tensor name in a `char[64]` with its terminating NUL, so
/// names of 64 bytes or more are refused (llama.cpp's loader: "tensor name 0 is too long:
/// 300 >= 64").
pub const MAX_TENSOR_NAME_LEN: usize = 64;
/// `GGUF_DEFAULT_ALIGNMENT`.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The GGUF magic, as bytes.
pub const MAGIC: &[u8; 4] = b"GGUF";

/// Smallest possible metadata entry: key length (8) + value type (4) + a 1-byte value.
const MIN_KV_SIZE: u64 = 8 + 4 + 1;
/// Smallest possible tensor info: name length (8) + 1-byte name + n_dims (4) + type (4) +
/// offset (8).
const MIN_TENSOR_INFO_SIZE: u64 = 8 + 1 + 4 + 4 + 8;

/// One tensor's header entry, validated against the file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// GGML `ne`: `ne[0]` is the innermost (contiguous) dimension. Length = `n_dims`.
    pub ne: Vec<u64>,
    pub ty: GgmlType,
    /// Offset relative to the start of the data section, as stored in the file.
    pub offset: u64,
    /// Absolute byte offset of the data in the file.
    pub abs_offset: u64,
    /// Bytes of data: `n_elements / block_size * type_size`.
    pub n_bytes: u64,
    /// Absolute byte offset of this tensor's info entry in the header (for error reports).
    pub info_offset: u64,
}

impl TensorInfo {
    /// Row-major shape: `ne` reversed (`[rows, cols]` for a matrix, `cols == ne[0]`).
    pub fn shape(&self) -> Vec<u64> {
        self.ne.iter().rev().copied().collect()
    }

    /// Number of elements (product of `ne`; 1 for a 0-dimensional tensor).
    pub fn n_elements(&self) -> u64 {
        // Checked when the file was opened.
        self.ne.iter().product()
    }

    /// `ne[0]`, the length of one row (1 for a 0-dimensional tensor).
    pub fn row_len(&self) -> u64 {
        self.ne.first().copied().unwrap_or(1)
    }

    /// Number of rows: every dimension but `ne[0]` multiplied together.
    pub fn n_rows(&self) -> u64 {
        self.ne.iter().skip(1).product()
    }
}

/// An open GGUF file: parsed header and a memory map of the whole file.
///
/// The map is read-only; like every memory-mapped reader it assumes the file is not modified
/// while it is open.
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    pub version: u32,
    /// Metadata in file order. Keys are unique.
    pub metadata: Vec<(String, Value)>,
    /// Tensor infos in file order. Names are unique and non-empty.
    pub tensors: Vec<TensorInfo>,
    /// `general.alignment`, or [`DEFAULT_ALIGNMENT`].
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and validates a GGUF file. Nothing but the header is read; tensor data stays
    /// in the map until asked for.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io = |e: std::io::Error| GgufError::new(path, 0, ErrorKind::Io(e.to_string()));
        let file = crate::util::open_input(path).map_err(io)?;
        // SAFETY: the map is read-only; we document that the file must not change while open.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        #[cfg(unix)]
        {
            let _ = map.advise(memmap2::Advice::Sequential);
        }
        let header = parse(path, &map)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            map,
            version: header.version,
            metadata: header.metadata,
            tensors: header.tensors,
            alignment: header.alignment,
            data_offset: header.data_offset,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size of the file in bytes.
    pub fn file_len(&self) -> u64 {
        self.map.len() as u64
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// A metadata value by key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// A tensor info by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// A tensor's raw bytes (`n_bytes` long), as stored.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        // Range checked against the file length when the file was opened.
        &self.map[t.abs_offset as usize..(t.abs_offset + t.n_bytes) as usize]
    }

    /// Tells the kernel this process is done with a tensor's pages for now, so that reading
    /// a large file once, front to back, does not keep all of it resident. The data stays
    /// valid: a later read maps the pages in again from the file.
    pub fn release(&self, t: &TensorInfo) {
        release_range(&self.map, t.abs_offset, t.n_bytes);
    }

    /// [`GgufFile::release`] for bytes `offset..offset + len` of a tensor's data (clamped to it).
    pub fn release_part(&self, t: &TensorInfo, offset: u64, len: u64) {
        let len = len.min(t.n_bytes.saturating_sub(offset));
        release_range(&self.map, t.abs_offset + offset.min(t.n_bytes), len);
    }

    /// `general.architecture`, if present.
    pub fn architecture(&self) -> Option<String> {
        self.get("general.architecture")
            .and_then(|v| v.as_str())
            .map(|s| s.into_owned())
    }
}

/// Drops a range of a read-only file map from this process's resident set (whole pages
/// inside the range only). Best effort; errors are ignored.
pub fn release_range(map: &Mmap, offset: u64, len: u64) {
    #[cfg(unix)]
    {
        const PAGE: u64 = 4096;
        let start = offset.div_ceil(PAGE) * PAGE;
        let end = (offset + len) / PAGE * PAGE;
        if end > start && end <= map.len() as u64 {
            // SAFETY: the map is read-only and backed by a file, so MADV_DONTNEED only drops
            // pages that are read back from the file on the next access.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start as usize,
                    (end - start) as usize,
                )
            };
        }
    }
    #[cfg(not(unix))]
    let _ = (map, offset, len);
}

/// What [`parse`] finds in a header.
#[derive(Debug)]
pub struct Header {
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
}

/// Parses and validates a whole GGUF file held in memory. `path` is used only in errors.
///
/// This is the fuzzing entry point: it never panics and never allocates more than the input's
/// size justifies.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor {
        path,
        bytes,
        pos: 0,
    };
    let magic = c.take(4, "magic")?;
    if magic != MAGIC {
        return Err(c.err_at(
            0,
            ErrorKind::BadMagic {
                found: magic.to_vec(),
            },
        ));
    }
    let version = c.u32("version")?;
    if version != 2 && version != 3 {
        let swapped = version.swap_bytes();
        let kind = if (1..=3).contains(&swapped) {
            ErrorKind::BigEndian {
                raw: version,
                swapped,
            }
        } else {
            ErrorKind::UnsupportedVersion(version)
        };
        return Err(c.err_at(4, kind));
    }
    let tensor_count_at = c.pos;
    let tensor_count = c.u64("tensor_count")?;
    let kv_count_at = c.pos;
    let kv_count = c.u64("metadata_kv_count")?;
    c.check_count("metadata_kv_count", kv_count_at, kv_count, MIN_KV_SIZE)?;

    let mut metadata: Vec<(String, Value)> = Vec::new();
    let mut keys = HashSet::new();
    let mut alignment_at = 0;
    for i in 0..kv_count {
        let key_at = c.pos;
        let key = c.utf8_string(&format!("metadata key #{i}"))?;
        let vt_at = c.pos;
        let vt = c.u32(&format!("value type of metadata key {key:?}"))?;
        let vt = ValueType::from_id(vt).ok_or_else(|| {
            c.err_at(
                vt_at,
                ErrorKind::UnknownValueType {
                    key: key.clone(),
                    type_id: vt,
                },
            )
        })?;
        let value = c.value(&key, vt, 0)?;
        if !keys.insert(key.clone()) {
            return Err(c.err_at(key_at, ErrorKind::DuplicateKey { key }));
        }
        if key == "general.alignment" {
            alignment_at = key_at;
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if *a != 0 && a.is_power_of_two() => *a as u64,
        Some((_, v)) => {
            let detail = match v {
                Value::U32(0) => "alignment is 0".to_string(),
                Value::U32(a) => format!("alignment {a} is not a power of two"),
                other => format!("must be a u32, found a {} value", other.value_type().name()),
            };
            return Err(c.err_at(alignment_at, ErrorKind::BadAlignment { detail }));
        }
    };

    c.check_count(
        "tensor_count",
        tensor_count_at,
        tensor_count,
        MIN_TENSOR_INFO_SIZE,
    )?;
    let mut tensors: Vec<TensorInfo> = Vec::new();
    let mut names = HashSet::new();
    for i in 0..tensor_count {
        let info_offset = c.pos;
        let name = c.utf8_string(&format!("name of tensor #{i}"))?;
        if name.is_empty() {
            return Err(c.err_at(info_offset, ErrorKind::EmptyTensorName { index: i }));
        }
        if name.len() >= MAX_TENSOR_NAME_LEN {
            let len = name.len();
            return Err(c.err_at(
                info_offset,
                ErrorKind::TensorNameTooLong {
                    index: i,
                    name,
                    len,
                },
            ));
        }
        let nd_at = c.pos;
        let n_dims = c.u32(&format!("n_dims of tensor {name:?}"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(c.err_at(
                nd_at,
                ErrorKind::TooManyDims {
                    tensor: name,
                    n_dims,
                },
            ));
        }
        let ne_at = c.pos;
        let mut ne = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims as usize {
            let at = c.pos;
            let v = c.u64(&format!("ne[{d}] of tensor {name:?}"))?;
            if v > i64::MAX as u64 {
                return Err(c.err_at(
                    at,
                    ErrorKind::DimTooLarge {
                        tensor: name,
                        dim: d,
                        value: v,
                    },
                ));
            }
            ne.push(v);
        }
        let ty_at = c.pos;
        let type_id = c.u32(&format!("type of tensor {name:?}"))?;
        let ty = match GgmlType::from_id(type_id) {
            TypeId::Known(t) => t,
            TypeId::Removed(old) => {
                return Err(c.err_at(
                    ty_at,
                    ErrorKind::RemovedGgmlType {
                        tensor: name,
                        type_id,
                        name: old,
                    },
                ))
            }
            TypeId::Unknown => {
                return Err(c.err_at(
                    ty_at,
                    ErrorKind::UnknownGgmlType {
                        tensor: name,
                        type_id,
                    },
                ))
            }
        };
        let offset_at = c.pos;
        let offset = c.u64(&format!("offset of tensor {name:?}"))?;
        let n_elements = ne.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        let Some(n_elements) = n_elements.filter(|n| *n <= i64::MAX as u64) else {
            return Err(c.err_at(ne_at, ErrorKind::ShapeOverflow { tensor: name, ne }));
        };
        let ne0 = ne.first().copied().unwrap_or(1);
        if ne0 % ty.block_size() as u64 != 0 {
            return Err(c.err_at(
                ne_at,
                ErrorKind::NotBlockMultiple {
                    tensor: name,
                    ty: ty.name(),
                    ne0,
                    block_size: ty.block_size(),
                },
            ));
        }
        let Some(n_bytes) = ty.bytes_for(n_elements) else {
            return Err(c.err_at(ne_at, ErrorKind::ShapeOverflow { tensor: name, ne }));
        };
        if offset % alignment != 0 {
            return Err(c.err_at(
                offset_at,
                ErrorKind::Misaligned {
                    tensor: name,
                    offset,
                    alignment,
                },
            ));
        }
        if !names.insert(name.clone()) {
            return Err(c.err_at(info_offset, ErrorKind::DuplicateTensor { name }));
        }
        tensors.push(TensorInfo {
            name,
            ne,
            ty,
            offset,
            abs_offset: 0,
            n_bytes,
            info_offset: info_offset as u64,
        });
    }

    let header_end = c.pos as u64;
    let data_offset = header_end.div_ceil(alignment) * alignment;
    let file_len = bytes.len() as u64;

    for t in tensors.iter_mut() {
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(s), Some(e)) if e <= file_len => {
                t.abs_offset = s;
            }
            _ => {
                return Err(GgufError::new(
                    path,
                    t.info_offset,
                    ErrorKind::DataPastEnd {
                        tensor: t.name.clone(),
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        file_len,
                    },
                ))
            }
        }
    }

    // Overlap: sort non-empty tensors by start and compare neighbours.
    let mut order: Vec<usize> = (0..tensors.len())
        .filter(|&i| tensors[i].n_bytes > 0)
        .collect();
    order.sort_by_key(|&i| (tensors[i].abs_offset, i));
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        if a.abs_offset + a.n_bytes > b.abs_offset {
            // Report the tensor that comes later in the header.
            let (t, o) = if w[0] < w[1] { (b, a) } else { (a, b) };
            return Err(GgufError::new(
                path,
                t.info_offset,
                ErrorKind::Overlap {
                    tensor: t.name.clone(),
                    start: t.abs_offset,
                    end: t.abs_offset + t.n_bytes,
                    other: o.name.clone(),
                    other_start: o.abs_offset,
                    other_end: o.abs_offset + o.n_bytes,
                },
            ));
        }
    }

    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// A bounds-checked little-endian reader over the file bytes.
struct Cursor<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn err_at(&self, offset: usize, kind: ErrorKind) -> GgufError {
        GgufError::new(self.path, offset as u64, kind)
    }

    fn take(&mut self, n: u64, field: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(self.err_at(
                self.pos,
                ErrorKind::Truncated {
                    field: field.to_string(),
                    needed: n,
                    available: self.remaining(),
                },
            ));
        }
        let s = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, field: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// Refuses a count whose entries, at `min_entry_size` bytes each, cannot fit in what
    /// remains of the file: this bounds every allocation by the file size.
    fn check_count(
        &self,
        field: &str,
        at: usize,
        count: u64,
        min_entry_size: u64,
    ) -> Result<(), GgufError> {
        if count.saturating_mul(min_entry_size) > self.remaining() {
            return Err(self.err_at(
                at,
                ErrorKind::CountTooLarge {
                    field: field.to_string(),
                    count,
                    remaining: self.remaining(),
                    min_entry_size,
                },
            ));
        }
        Ok(())
    }

    fn raw_string(&mut self, field: &str) -> Result<&'a [u8], GgufError> {
        let at = self.pos;
        let len = self.u64(&format!("{field} (length)"))?;
        if len > self.remaining() {
            return Err(self.err_at(
                at,
                ErrorKind::LengthPastEnd {
                    field: field.to_string(),
                    len,
                    remaining: self.remaining(),
                },
            ));
        }
        self.take(len, field)
    }

    fn utf8_string(&mut self, field: &str) -> Result<String, GgufError> {
        let at = self.pos;
        let raw = self.raw_string(field)?;
        std::str::from_utf8(raw).map(str::to_string).map_err(|_| {
            self.err_at(
                at,
                ErrorKind::InvalidUtf8 {
                    field: field.to_string(),
                },
            )
        })
    }

    fn value(&mut self, key: &str, vt: ValueType, depth: usize) -> Result<Value, GgufError> {
        let f = || format!("value of metadata key {key:?}");
        Ok(match vt {
            ValueType::U8 => Value::U8(self.array::<1>(&f())?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(&f())?[0] as i8),
            ValueType::Bool => Value::Bool(self.array::<1>(&f())?[0] != 0),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(&f())?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(&f())?)),
            ValueType::U32 => Value::U32(self.u32(&f())?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(&f())?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(&f())?)),
            ValueType::U64 => Value::U64(self.u64(&f())?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(&f())?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(&f())?)),
            ValueType::String => Value::String(self.raw_string(&f())?.to_vec()),
            ValueType::Array => {
                let at = self.pos;
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err_at(
                        at,
                        ErrorKind::NestingTooDeep {
                            key: key.to_string(),
                        },
                    ));
                }
                let et_id = self.u32(&format!("array element type of metadata key {key:?}"))?;
                let et = ValueType::from_id(et_id).ok_or_else(|| {
                    self.err_at(
                        at,
                        ErrorKind::UnknownValueType {
                            key: key.to_string(),
                            type_id: et_id,
                        },
                    )
                })?;
                let count_at = self.pos;
                let count = self.u64(&format!("array length of metadata key {key:?}"))?;
                if count > MAX_ARRAY_LEN {
                    return Err(self.err_at(
                        count_at,
                        ErrorKind::ArrayTooLong {
                            key: key.to_string(),
                            len: count,
                        },
                    ));
                }
                if count.saturating_mul(et.min_size()) > self.remaining() {
                    return Err(self.err_at(
                        count_at,
                        ErrorKind::LengthPastEnd {
                            field: format!("array of metadata key {key:?}"),
                            len: count,
                            remaining: self.remaining(),
                        },
                    ));
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(key, et, depth + 1)?);
                }
                Value::Array(et, items)
            }
        })
    }
}
