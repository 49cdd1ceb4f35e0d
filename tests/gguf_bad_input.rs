//! The GGUF parser against bad input: one test per malformed-file case, each built from literal
//! bytes by the small [`Gguf`] builder below and checked for the exact error variant, its
//! fields, the byte offset of the offending field, and a message that names the file, the
//! field/key/tensor and the offset.
//!
//! The first tests prove the builder writes files the parser (and gguf-rs-lib, an independent
//! parser) accepts, so that each bad-input test differs from a valid file only in the bad field.

use std::path::Path;
use std::process::Command;

use lowbit::ggml::GgmlType;
use lowbit::gguf::{self, ErrorKind, GgufError, GgufFile, Header, Value, ValueType};
use lowbit::gguf::{MAX_ARRAY_DEPTH, MAX_DIMS};

/// The path every in-memory file is parsed under (it appears only in errors).
const FILE: &str = "bad-input.gguf";

// ---------------------------------------------------------------------------------------------
// Builder
// ---------------------------------------------------------------------------------------------

/// Where the fields of one metadata entry start.
#[derive(Clone, Debug)]
struct KvAt {
    key: u64,
    vtype: u64,
    value: u64,
}

/// Where the fields of one tensor info start.
#[derive(Clone, Debug)]
struct TensorAt {
    info: u64,
    n_dims: u64,
    ne: Vec<u64>,
    ty: u64,
    offset: u64,
}

/// A GGUF byte builder. Every method appends; the `*At` results record where fields start.
struct Gguf {
    buf: Vec<u8>,
}

impl Gguf {
    /// `GGUF`, version, tensor_count, metadata_kv_count: 24 bytes.
    fn new(version: u32, tensor_count: u64, kv_count: u64) -> Gguf {
        let mut g = Gguf { buf: Vec::new() };
        g.raw(b"GGUF").u32(version).u64(tensor_count).u64(kv_count);
        g
    }

    fn pos(&self) -> u64 {
        self.buf.len() as u64
    }

    fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }

    fn u32(&mut self, v: u32) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }

    fn u64(&mut self, v: u64) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }

    /// A GGUF string: u64 length, then the bytes.
    fn string(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64).raw(s)
    }

    /// A key and a value type id; the caller writes the value (or something else).
    fn key(&mut self, key: &[u8], type_id: u32) -> KvAt {
        let key_at = self.pos();
        self.string(key);
        let vtype = self.pos();
        self.u32(type_id);
        KvAt {
            key: key_at,
            vtype,
            value: self.pos(),
        }
    }

    /// A whole metadata entry.
    fn kv(&mut self, key: &str, v: &Value) -> KvAt {
        let at = self.key(key.as_bytes(), v.value_type() as u32);
        self.value(v);
        at
    }

    /// A value's payload, without its type id. Arrays: element type, count, elements.
    fn value(&mut self, v: &Value) -> &mut Self {
        match v {
            Value::U8(x) => self.raw(&x.to_le_bytes()),
            Value::I8(x) => self.raw(&x.to_le_bytes()),
            Value::U16(x) => self.raw(&x.to_le_bytes()),
            Value::I16(x) => self.raw(&x.to_le_bytes()),
            Value::U32(x) => self.raw(&x.to_le_bytes()),
            Value::I32(x) => self.raw(&x.to_le_bytes()),
            Value::F32(x) => self.raw(&x.to_le_bytes()),
            Value::Bool(b) => self.raw(&[*b as u8]),
            Value::String(s) => self.string(s),
            Value::U64(x) => self.raw(&x.to_le_bytes()),
            Value::I64(x) => self.raw(&x.to_le_bytes()),
            Value::F64(x) => self.raw(&x.to_le_bytes()),
            Value::Array(et, items) => {
                self.u32(*et as u32).u64(items.len() as u64);
                for it in items {
                    self.value(it);
                }
                self
            }
        }
    }

    /// A tensor info with a raw name and type id.
    fn tensor_raw(&mut self, name: &[u8], ne: &[u64], type_id: u32, offset: u64) -> TensorAt {
        let info = self.pos();
        self.string(name);
        let n_dims = self.pos();
        self.u32(ne.len() as u32);
        let mut ne_at = Vec::new();
        for &d in ne {
            ne_at.push(self.pos());
            self.u64(d);
        }
        let ty = self.pos();
        self.u32(type_id);
        let offset_at = self.pos();
        self.u64(offset);
        TensorAt {
            info,
            n_dims,
            ne: ne_at,
            ty,
            offset: offset_at,
        }
    }

    fn tensor(&mut self, name: &str, ne: &[u64], ty: GgmlType, offset: u64) -> TensorAt {
        self.tensor_raw(name.as_bytes(), ne, ty.id(), offset)
    }

    /// Zero bytes up to the next multiple of `align`; returns the new position.
    fn pad(&mut self, align: u64) -> u64 {
        let to = self.pos().next_multiple_of(align);
        self.zeros(to - self.pos());
        to
    }

    fn zeros(&mut self, n: u64) -> &mut Self {
        self.buf.resize(self.buf.len() + n as usize, 0);
        self
    }

    /// `n` bytes of tensor data (a recognizable pattern).
    fn data(&mut self, n: u64) -> &mut Self {
        for i in 0..n {
            self.buf.push((i % 251) as u8 ^ 0x5a);
        }
        self
    }

    fn bytes(&self) -> Vec<u8> {
        self.buf.clone()
    }
}

/// Bytes a tensor of this type and shape occupies.
fn n_bytes(ty: GgmlType, ne: &[u64]) -> u64 {
    ne.iter().product::<u64>() / ty.block_size() as u64 * ty.type_size() as u64
}

type TensorSpec<'a> = (&'a str, &'a [u64], GgmlType);

/// A complete valid file and where everything in it lies.
struct Built {
    bytes: Vec<u8>,
    kvs: Vec<KvAt>,
    tensors: Vec<TensorAt>,
    /// End of the last tensor info (start of the padding).
    header_end: u64,
    data_offset: u64,
    /// Tensor offsets relative to `data_offset`.
    offsets: Vec<u64>,
}

/// Header, metadata, tensor infos with offsets packed at `align`, padding, data. The last
/// tensor's data ends the file (no trailing padding), so cutting any byte makes it invalid.
fn build(version: u32, kvs: &[(&str, Value)], tensors: &[TensorSpec], align: u64) -> Built {
    let mut g = Gguf::new(version, tensors.len() as u64, kvs.len() as u64);
    let kv_at = kvs.iter().map(|(k, v)| g.kv(k, v)).collect();
    let mut offsets = Vec::new();
    let mut next = 0;
    for &(_, ne, ty) in tensors {
        offsets.push(next);
        next = (next + n_bytes(ty, ne)).next_multiple_of(align);
    }
    let t_at = tensors
        .iter()
        .zip(&offsets)
        .map(|(&(name, ne, ty), &off)| g.tensor(name, ne, ty, off))
        .collect();
    let header_end = g.pos();
    let data_offset = g.pad(align);
    for (&(_, ne, ty), &off) in tensors.iter().zip(&offsets) {
        g.zeros(data_offset + off - g.pos());
        g.data(n_bytes(ty, ne));
    }
    Built {
        bytes: g.bytes(),
        kvs: kv_at,
        tensors: t_at,
        header_end,
        data_offset,
        offsets,
    }
}

/// One scalar of each non-array value type, the u64 last.
fn scalars() -> Vec<Value> {
    vec![
        Value::U8(200),
        Value::I8(-100),
        Value::U16(60_000),
        Value::I16(-30_000),
        Value::U32(4_000_000_000),
        Value::I32(-2_000_000_000),
        Value::F32(1.5),
        Value::Bool(true),
        Value::String("h\u{e9}llo".as_bytes().to_vec()),
        Value::I64(i64::MIN),
        Value::F64(-2.25),
        Value::U64(u64::MAX),
    ]
}

/// Metadata with every value type: arrays of every element type, an empty array and a nested
/// array (array of arrays) first, then one scalar of each type, ending with a u64.
fn every_value_type() -> Vec<(String, Value)> {
    let mut kvs = vec![(
        "general.architecture".to_string(),
        Value::String(b"llama".to_vec()),
    )];
    for v in scalars() {
        let t = v.value_type();
        kvs.push((
            format!("test.array.{}", t.name()),
            Value::Array(t, vec![v.clone(), v]),
        ));
    }
    kvs.push((
        "test.array.empty".into(),
        Value::Array(ValueType::F32, vec![]),
    ));
    kvs.push((
        "test.array.nested".into(),
        Value::Array(
            ValueType::Array,
            vec![
                Value::Array(ValueType::I8, vec![Value::I8(1), Value::I8(-2)]),
                Value::Array(ValueType::I8, vec![]),
                Value::Array(ValueType::String, vec![Value::String(b"x".to_vec())]),
            ],
        ),
    ));
    for v in scalars() {
        kvs.push((format!("test.{}", v.value_type().name()), v));
    }
    assert_eq!(kvs.last().unwrap().1.value_type(), ValueType::U64);
    kvs
}

/// Tensors of several types and ranks (1-D to 4-D), the last one 4-D.
const TENSORS: &[TensorSpec] = &[
    ("token_embd.weight", &[64, 4], GgmlType::Q4_0),
    ("output_norm.weight", &[64], GgmlType::F32),
    ("blk.0.ffn_down.weight", &[256, 2], GgmlType::Q4_K),
    ("blk.0.attn_k.bias", &[4, 3, 2, 2], GgmlType::F16),
];

/// The full valid file: every value type and [`TENSORS`].
fn rich(version: u32) -> Built {
    let kvs = every_value_type();
    let kvs: Vec<(&str, Value)> = kvs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    build(version, &kvs, TENSORS, 32)
}

fn parse(bytes: &[u8]) -> Result<Header, GgufError> {
    gguf::parse(Path::new(FILE), bytes)
}

/// Parses `bytes`, expects exactly `kind` at `offset`, and checks that the message names the
/// file, the offset and each of `names`.
#[track_caller]
fn assert_err(bytes: &[u8], offset: u64, kind: ErrorKind, names: &[&str]) -> GgufError {
    let e = parse(bytes).expect_err("parse should fail");
    assert_eq!(e.kind, kind, "{e}");
    assert_eq!(e.offset, offset, "offset of {e}");
    assert_eq!(e.file, Path::new(FILE));
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("{FILE}: ")), "{msg}");
    assert!(
        msg.ends_with(&format!(" (at byte offset {offset})")),
        "{msg}"
    );
    for n in names {
        assert!(msg.contains(n), "{msg:?} should name {n:?}");
    }
    e
}

/// A file with one tensor info and `data_len` bytes of data after the padding.
fn one_tensor(
    name: &[u8],
    ne: &[u64],
    type_id: u32,
    offset: u64,
    data_len: u64,
) -> (Vec<u8>, TensorAt, u64) {
    let mut g = Gguf::new(3, 1, 0);
    let at = g.tensor_raw(name, ne, type_id, offset);
    let data_offset = g.pad(32);
    g.data(data_len);
    (g.bytes(), at, data_offset)
}

// ---------------------------------------------------------------------------------------------
// The builder makes valid files
// ---------------------------------------------------------------------------------------------

#[track_caller]
fn assert_rich_parses(version: u32) {
    let b = rich(version);
    let h = parse(&b.bytes).unwrap_or_else(|e| panic!("v{version}: {e}"));
    assert_eq!(h.version, version);
    assert_eq!(h.metadata, every_value_type());
    assert_eq!(h.alignment, 32);
    assert_eq!(h.data_offset, b.data_offset);
    assert_eq!(h.data_offset, b.header_end.next_multiple_of(32));
    assert_eq!(h.tensors.len(), TENSORS.len());
    for (i, (t, &(name, ne, ty))) in h.tensors.iter().zip(TENSORS).enumerate() {
        assert_eq!(t.name, name);
        assert_eq!(t.ne, ne);
        assert_eq!(t.shape(), ne.iter().rev().copied().collect::<Vec<_>>());
        assert_eq!(t.ty, ty);
        assert_eq!(t.offset, b.offsets[i]);
        assert_eq!(t.abs_offset, b.data_offset + b.offsets[i]);
        assert_eq!(t.n_bytes, n_bytes(ty, ne));
        assert_eq!(t.info_offset, b.tensors[i].info);
    }
    let last = h.tensors.last().unwrap();
    assert_eq!(last.abs_offset + last.n_bytes, b.bytes.len() as u64);
}

#[test]
fn builder_makes_valid_v2_file_with_every_value_type() {
    assert_rich_parses(2);
}

#[test]
fn builder_makes_valid_v3_file_with_every_value_type() {
    assert_rich_parses(3);
}

#[test]
fn builder_file_is_accepted_by_gguf_rs_lib() {
    // An independent parser agrees with the builder (gguf-rs-lib reads version 3 only).
    let b = rich(3);
    let r = gguf_rs_lib::prelude::GGUFFileReader::new(std::io::Cursor::new(b.bytes.clone()))
        .expect("gguf-rs-lib reads the built file");
    assert_eq!(r.header().version, 3);
    assert_eq!(r.metadata().len(), every_value_type().len());
    assert_eq!(r.tensor_data_offset(), b.data_offset);
    let names: Vec<&str> = TENSORS.iter().map(|t| t.0).collect();
    assert_eq!(r.tensor_names(), names);
    for (t, &off) in r.tensor_infos().iter().zip(&b.offsets) {
        assert_eq!(t.data_offset(), off, "{}", t.name());
    }
}

#[test]
fn builder_file_opens_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("valid.gguf");
    let b = rich(3);
    std::fs::write(&path, &b.bytes).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.file_len(), b.bytes.len() as u64);
    let t = f.tensor("output_norm.weight").unwrap();
    let start = (b.data_offset + b.offsets[1]) as usize;
    assert_eq!(f.tensor_data(t), &b.bytes[start..start + 256]);
}

#[test]
fn arrays_nested_to_max_depth_are_accepted() {
    let mut v = Value::Array(ValueType::U8, vec![Value::U8(7)]);
    for _ in 1..MAX_ARRAY_DEPTH {
        v = Value::Array(ValueType::Array, vec![v]);
    }
    let b = build(3, &[("nested", v.clone())], &[], 32);
    assert_eq!(
        parse(&b.bytes).unwrap().metadata,
        vec![("nested".into(), v)]
    );
}

#[test]
fn custom_alignment_64_is_accepted_and_data_offset_rounded() {
    let kvs = [
        ("general.alignment", Value::U32(64)),
        ("general.name", Value::String(b"x".to_vec())),
    ];
    let ts: &[TensorSpec] = &[("a", &[8], GgmlType::F32), ("b", &[8], GgmlType::F32)];
    let b = build(3, &kvs, ts, 64);
    // The header ends where 32- and 64-byte rounding differ, so the test tells them apart.
    assert_ne!(
        b.header_end.next_multiple_of(32),
        b.header_end.next_multiple_of(64)
    );
    let h = parse(&b.bytes).unwrap();
    assert_eq!(h.alignment, 64);
    assert_eq!(h.data_offset, b.header_end.next_multiple_of(64));
    assert_eq!(h.data_offset % 64, 0);
    assert_eq!(h.tensors[1].offset, 64);
    assert_eq!(h.tensors[1].abs_offset, h.data_offset + 64);
}

// ---------------------------------------------------------------------------------------------
// Magic and version
// ---------------------------------------------------------------------------------------------

#[test]
fn bad_magic() {
    let mut bytes = Gguf::new(3, 0, 0).bytes();
    bytes[..4].copy_from_slice(b"GGML");
    assert_err(
        &bytes,
        0,
        ErrorKind::BadMagic {
            found: b"GGML".to_vec(),
        },
        &["bad magic", "[47, 47, 4d, 4c]"],
    );
}

#[test]
fn version_1_is_unsupported() {
    let bytes = Gguf::new(1, 0, 0).bytes();
    assert_err(&bytes, 4, ErrorKind::UnsupportedVersion(1), &["version 1"]);
}

#[test]
fn version_4_is_unsupported() {
    let bytes = Gguf::new(4, 0, 0).bytes();
    assert_err(&bytes, 4, ErrorKind::UnsupportedVersion(4), &["version 4"]);
}

#[test]
fn byte_swapped_v3_header_is_big_endian() {
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&[0, 0, 0, 3]);
    bytes.extend_from_slice(&1u64.to_be_bytes());
    bytes.extend_from_slice(&2u64.to_be_bytes());
    assert_err(
        &bytes,
        4,
        ErrorKind::BigEndian {
            raw: 0x0300_0000,
            swapped: 3,
        },
        &["version", "big-endian version 3"],
    );
}

// ---------------------------------------------------------------------------------------------
// Truncation
// ---------------------------------------------------------------------------------------------

#[test]
fn truncation_at_every_length_is_an_error_never_a_panic() {
    for version in [2, 3] {
        let b = rich(version);
        for len in 0..b.bytes.len() {
            let cut = &b.bytes[..len];
            let r = std::panic::catch_unwind(|| parse(cut))
                .unwrap_or_else(|_| panic!("v{version}: parse panicked on a file cut to {len}"));
            let e = match r {
                Ok(_) => panic!("v{version}: a file cut to {len} bytes parsed"),
                Err(e) => e,
            };
            assert!(e.offset <= len as u64, "cut to {len}: {e}");
            assert_eq!(e.file, Path::new(FILE));
        }
    }
}

#[test]
fn truncated_inside_tensor_count() {
    let b = rich(3);
    assert_err(
        &b.bytes[..12],
        8,
        ErrorKind::Truncated {
            field: "tensor_count".into(),
            needed: 8,
            available: 4,
        },
        &["tensor_count"],
    );
}

#[test]
fn truncated_inside_metadata_kv_count() {
    let b = rich(3);
    assert_err(
        &b.bytes[..21],
        16,
        ErrorKind::Truncated {
            field: "metadata_kv_count".into(),
            needed: 8,
            available: 5,
        },
        &["metadata_kv_count"],
    );
}

/// The last key: late enough that `metadata_kv_count` entries still fit in a file cut there.
fn last_key(b: &Built) -> (usize, &KvAt) {
    let i = b.kvs.len() - 1;
    let at = &b.kvs[i];
    assert!(b.kvs.len() as u64 * 13 <= at.key - 24, "fixture too small");
    (i, at)
}

#[test]
fn truncated_inside_key_length() {
    let b = rich(3);
    let (i, at) = last_key(&b);
    let field = format!("metadata key #{i}");
    assert_err(
        &b.bytes[..at.key as usize + 3],
        at.key,
        ErrorKind::Truncated {
            field: format!("{field} (length)"),
            needed: 8,
            available: 3,
        },
        &[field.as_str()],
    );
}

#[test]
fn truncated_inside_key_bytes_is_length_past_end() {
    let b = rich(3);
    let (i, at) = last_key(&b);
    let field = format!("metadata key #{i}");
    let key_len = at.vtype - at.key - 8;
    assert_err(
        &b.bytes[..at.key as usize + 8 + 2],
        at.key,
        ErrorKind::LengthPastEnd {
            field: field.clone(),
            len: key_len,
            remaining: 2,
        },
        &[field.as_str()],
    );
}

#[test]
fn truncated_inside_value() {
    let b = rich(3);
    let (_, at) = last_key(&b);
    assert_err(
        &b.bytes[..at.value as usize + 5],
        at.value,
        ErrorKind::Truncated {
            field: "value of metadata key \"test.u64\"".into(),
            needed: 8,
            available: 5,
        },
        &["\"test.u64\""],
    );
}

/// The last tensor: late enough that `tensor_count` infos still fit in a file cut inside it.
fn last_tensor(b: &Built) -> &TensorAt {
    let at = b.tensors.last().unwrap();
    let infos_start = b.tensors[0].info;
    assert!(b.tensors.len() as u64 * 25 <= at.info + 13 - infos_start);
    at
}

#[test]
fn truncated_inside_tensor_name_is_length_past_end() {
    let b = rich(3);
    let at = last_tensor(&b);
    let name = TENSORS.last().unwrap().0;
    assert_err(
        &b.bytes[..at.info as usize + 13],
        at.info,
        ErrorKind::LengthPastEnd {
            field: "name of tensor #3".into(),
            len: name.len() as u64,
            remaining: 5,
        },
        &["name of tensor #3"],
    );
}

#[test]
fn truncated_inside_tensor_ne() {
    let b = rich(3);
    let at = last_tensor(&b);
    assert_err(
        &b.bytes[..at.ne[1] as usize + 5],
        at.ne[1],
        ErrorKind::Truncated {
            field: "ne[1] of tensor \"blk.0.attn_k.bias\"".into(),
            needed: 8,
            available: 5,
        },
        &["ne[1]", "\"blk.0.attn_k.bias\""],
    );
}

#[test]
fn truncated_inside_tensor_offset() {
    let b = rich(3);
    let at = last_tensor(&b);
    assert_err(
        &b.bytes[..at.offset as usize + 7],
        at.offset,
        ErrorKind::Truncated {
            field: "offset of tensor \"blk.0.attn_k.bias\"".into(),
            needed: 8,
            available: 7,
        },
        &["offset of tensor \"blk.0.attn_k.bias\""],
    );
}

#[test]
fn file_cut_right_after_header_leaves_tensor_data_short() {
    let b = rich(3);
    let d = b.data_offset;
    let first = n_bytes(TENSORS[0].2, TENSORS[0].1);
    assert_err(
        &b.bytes[..d as usize],
        b.tensors[0].info,
        ErrorKind::DataPastEnd {
            tensor: "token_embd.weight".into(),
            start: d,
            end: d + first,
            file_len: d,
        },
        &["\"token_embd.weight\""],
    );
}

#[test]
fn file_cut_inside_last_tensor_data() {
    let b = rich(3);
    let len = b.bytes.len() as u64 - 1;
    let (_, ne, ty) = *TENSORS.last().unwrap();
    let start = b.data_offset + b.offsets[3];
    assert_err(
        &b.bytes[..len as usize],
        b.tensors[3].info,
        ErrorKind::DataPastEnd {
            tensor: "blk.0.attn_k.bias".into(),
            start,
            end: start + n_bytes(ty, ne),
            file_len: len,
        },
        &["\"blk.0.attn_k.bias\""],
    );
}

// ---------------------------------------------------------------------------------------------
// Counts and lengths
// ---------------------------------------------------------------------------------------------

#[test]
fn tensor_count_u64_max_is_count_too_large() {
    let mut g = Gguf::new(3, u64::MAX, 1);
    g.kv("general.name", &Value::String(b"x".to_vec()));
    g.zeros(64);
    assert_err(
        &g.bytes(),
        8,
        ErrorKind::CountTooLarge {
            field: "tensor_count".into(),
            count: u64::MAX,
            remaining: 64,
            min_entry_size: 25,
        },
        &["tensor_count", &u64::MAX.to_string()],
    );
}

#[test]
fn metadata_kv_count_2_pow_40_is_count_too_large() {
    let mut g = Gguf::new(3, 0, 1 << 40);
    g.zeros(64);
    let t = std::time::Instant::now();
    assert_err(
        &g.bytes(),
        16,
        ErrorKind::CountTooLarge {
            field: "metadata_kv_count".into(),
            count: 1 << 40,
            remaining: 64,
            min_entry_size: 13,
        },
        &["metadata_kv_count", "1099511627776"],
    );
    // Refused before any per-entry work: fast, whatever the machine's load.
    assert!(t.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn key_string_length_past_eof() {
    let mut g = Gguf::new(3, 0, 1);
    g.u64(1000).raw(b"general.na");
    assert_err(
        &g.bytes(),
        24,
        ErrorKind::LengthPastEnd {
            field: "metadata key #0".into(),
            len: 1000,
            remaining: 10,
        },
        &["metadata key #0", "1000"],
    );
}

#[test]
fn value_string_length_past_eof() {
    let mut g = Gguf::new(3, 0, 1);
    let at = g.key(b"general.name", ValueType::String as u32);
    g.u64(u64::MAX).raw(b"abc");
    assert_err(
        &g.bytes(),
        at.value,
        ErrorKind::LengthPastEnd {
            field: "value of metadata key \"general.name\"".into(),
            len: u64::MAX,
            remaining: 3,
        },
        &["\"general.name\""],
    );
}

#[test]
fn array_count_past_eof() {
    // A count whose byte size overflows u64: refused by the length cap before any size math.
    let mut g = Gguf::new(3, 0, 1);
    let at = g.key(b"tokenizer.ggml.scores", ValueType::Array as u32);
    g.u32(ValueType::U32 as u32).u64(1 << 62).zeros(16);
    assert_err(
        &g.bytes(),
        at.value + 4,
        ErrorKind::ArrayTooLong {
            key: "tokenizer.ggml.scores".into(),
            len: 1 << 62,
        },
        &["\"tokenizer.ggml.scores\"", "exceeds the limit"],
    );
    // Just past the cap.
    let mut g = Gguf::new(3, 0, 1);
    let at = g.key(b"k", ValueType::Array as u32);
    g.u32(ValueType::U8 as u32)
        .u64(lowbit::gguf::MAX_ARRAY_LEN + 1)
        .zeros(16);
    assert_err(
        &g.bytes(),
        at.value + 4,
        ErrorKind::ArrayTooLong {
            key: "k".into(),
            len: lowbit::gguf::MAX_ARRAY_LEN + 1,
        },
        &["\"k\""],
    );
    // One element more than the bytes that remain.
    let mut g = Gguf::new(3, 0, 1);
    let at = g.key(b"k", ValueType::Array as u32);
    g.u32(ValueType::U8 as u32).u64(17).zeros(16);
    assert_err(
        &g.bytes(),
        at.value + 4,
        ErrorKind::LengthPastEnd {
            field: "array of metadata key \"k\"".into(),
            len: 17,
            remaining: 16,
        },
        &["\"k\""],
    );
}

#[test]
fn arrays_nested_deeper_than_max_depth() {
    let mut v = Value::Array(ValueType::U8, vec![Value::U8(7)]);
    for _ in 0..MAX_ARRAY_DEPTH {
        v = Value::Array(ValueType::Array, vec![v]);
    }
    let mut g = Gguf::new(3, 0, 1);
    let at = g.kv("deep", &v);
    // Each enclosing array header is 12 bytes (element type + count); the array one level too
    // deep starts after MAX_ARRAY_DEPTH of them.
    assert_err(
        &g.bytes(),
        at.value + 12 * MAX_ARRAY_DEPTH as u64,
        ErrorKind::NestingTooDeep { key: "deep".into() },
        &["\"deep\"", "nested deeper"],
    );
}

// ---------------------------------------------------------------------------------------------
// Type ids
// ---------------------------------------------------------------------------------------------

#[test]
fn unknown_value_type_for_value() {
    let mut g = Gguf::new(3, 0, 1);
    let at = g.key(b"general.name", 13);
    g.u64(0);
    assert_err(
        &g.bytes(),
        at.vtype,
        ErrorKind::UnknownValueType {
            key: "general.name".into(),
            type_id: 13,
        },
        &["\"general.name\"", "value type 13"],
    );
}

#[test]
fn unknown_value_type_for_array_element() {
    let mut g = Gguf::new(3, 0, 1);
    let at = g.key(b"tokenizer.ggml.tokens", ValueType::Array as u32);
    g.u32(13).u64(1).u64(0);
    assert_err(
        &g.bytes(),
        at.value,
        ErrorKind::UnknownValueType {
            key: "tokenizer.ggml.tokens".into(),
            type_id: 13,
        },
        &["\"tokenizer.ggml.tokens\"", "value type 13"],
    );
}

#[test]
fn unknown_ggml_type_200() {
    let (bytes, at, _) = one_tensor(b"w", &[32], 200, 0, 128);
    assert_err(
        &bytes,
        at.ty,
        ErrorKind::UnknownGgmlType {
            tensor: "w".into(),
            type_id: 200,
        },
        &["\"w\"", "type id 200"],
    );
}

#[test]
fn removed_ggml_type_4() {
    let (bytes, at, _) = one_tensor(b"w", &[32], 4, 0, 128);
    assert_err(
        &bytes,
        at.ty,
        ErrorKind::RemovedGgmlType {
            tensor: "w".into(),
            type_id: 4,
            name: "Q4_2",
        },
        &["\"w\"", "type id 4", "Q4_2"],
    );
}

#[test]
fn removed_ggml_type_31() {
    let (bytes, at, _) = one_tensor(b"w", &[32], 31, 0, 128);
    assert_err(
        &bytes,
        at.ty,
        ErrorKind::RemovedGgmlType {
            tensor: "w".into(),
            type_id: 31,
            name: "Q4_0_4_4",
        },
        &["\"w\"", "type id 31", "Q4_0_4_4"],
    );
}

// ---------------------------------------------------------------------------------------------
// Shapes
// ---------------------------------------------------------------------------------------------

#[test]
fn n_dims_5_is_too_many() {
    assert_eq!(MAX_DIMS, 4);
    let (bytes, at, _) = one_tensor(b"w", &[1; 5], GgmlType::F32.id(), 0, 4);
    assert_err(
        &bytes,
        at.n_dims,
        ErrorKind::TooManyDims {
            tensor: "w".into(),
            n_dims: 5,
        },
        &["\"w\"", "n_dims = 5"],
    );
}

#[test]
fn dimension_product_overflow_is_shape_overflow() {
    let ne = [1 << 32, 1 << 32, 2];
    let (bytes, at, _) = one_tensor(b"w", &ne, GgmlType::F32.id(), 0, 64);
    assert_err(
        &bytes,
        at.ne[0],
        ErrorKind::ShapeOverflow {
            tensor: "w".into(),
            ne: ne.to_vec(),
        },
        &["\"w\"", "ne = [4294967296, 4294967296, 2]", "overflows"],
    );
}

#[test]
fn element_count_above_i64_max_is_shape_overflow() {
    let ne = [1 << 62, 2];
    let (bytes, at, _) = one_tensor(b"w", &ne, GgmlType::I8.id(), 0, 64);
    assert_err(
        &bytes,
        at.ne[0],
        ErrorKind::ShapeOverflow {
            tensor: "w".into(),
            ne: ne.to_vec(),
        },
        &["\"w\"", "overflows"],
    );
}

#[test]
fn byte_size_overflow_is_shape_overflow() {
    // 2^62 elements fit, 2^62 * 4 bytes do not.
    let ne = [1 << 62];
    let (bytes, at, _) = one_tensor(b"w", &ne, GgmlType::F32.id(), 0, 64);
    assert_err(
        &bytes,
        at.ne[0],
        ErrorKind::ShapeOverflow {
            tensor: "w".into(),
            ne: ne.to_vec(),
        },
        &["\"w\"", "overflows"],
    );
}

#[test]
fn ne_above_i64_max_is_dim_too_large() {
    let ne = [32, 1 << 63];
    let (bytes, at, _) = one_tensor(b"w", &ne, GgmlType::F32.id(), 0, 128);
    assert_err(
        &bytes,
        at.ne[1],
        ErrorKind::DimTooLarge {
            tensor: "w".into(),
            dim: 1,
            value: 1 << 63,
        },
        &["\"w\"", "ne[1] = 9223372036854775808"],
    );
}

#[test]
fn q4_0_ne0_33_is_not_block_multiple() {
    let (bytes, at, _) = one_tensor(b"w", &[33, 2], GgmlType::Q4_0.id(), 0, 64);
    assert_err(
        &bytes,
        at.ne[0],
        ErrorKind::NotBlockMultiple {
            tensor: "w".into(),
            ty: "Q4_0",
            ne0: 33,
            block_size: 32,
        },
        &["\"w\"", "ne[0] = 33", "Q4_0 block size 32"],
    );
}

// ---------------------------------------------------------------------------------------------
// Data ranges
// ---------------------------------------------------------------------------------------------

#[test]
fn tensor_data_past_eof() {
    // 32 bytes of F32 at offset 32, but only 32 bytes of data.
    let (bytes, at, d) = one_tensor(b"w", &[8], GgmlType::F32.id(), 32, 32);
    assert_err(
        &bytes,
        at.info,
        ErrorKind::DataPastEnd {
            tensor: "w".into(),
            start: d + 32,
            end: d + 64,
            file_len: d + 32,
        },
        &["\"w\"", &format!("file is {} bytes long", d + 32)],
    );
}

#[test]
fn tensor_offset_near_u64_max_is_data_past_end() {
    let offset = !31u64; // the largest multiple of 32
    let (bytes, at, d) = one_tensor(b"w", &[8], GgmlType::F32.id(), offset, 32);
    assert_err(
        &bytes,
        at.info,
        ErrorKind::DataPastEnd {
            tensor: "w".into(),
            start: u64::MAX,
            end: u64::MAX,
            file_len: d + 32,
        },
        &["\"w\""],
    );
}

#[test]
fn overlapping_tensors() {
    // a: 64 bytes at 0; b: 64 bytes at 32.
    let mut g = Gguf::new(3, 2, 0);
    g.tensor("a", &[16], GgmlType::F32, 0);
    let b = g.tensor("b", &[16], GgmlType::F32, 32);
    let d = g.pad(32);
    g.data(96);
    assert_err(
        &g.bytes(),
        b.info,
        ErrorKind::Overlap {
            tensor: "b".into(),
            start: d + 32,
            end: d + 96,
            other: "a".into(),
            other_start: d,
            other_end: d + 64,
        },
        &["\"b\"", "\"a\"", "overlap"],
    );
}

#[test]
fn misaligned_tensor_offset() {
    let (bytes, at, _) = one_tensor(b"w", &[8], GgmlType::F32.id(), 16, 64);
    assert_err(
        &bytes,
        at.offset,
        ErrorKind::Misaligned {
            tensor: "w".into(),
            offset: 16,
            alignment: 32,
        },
        &["\"w\"", "offset 16", "alignment 32"],
    );
}

#[test]
fn offset_aligned_to_32_but_not_custom_64_is_misaligned() {
    let mut g = Gguf::new(3, 1, 1);
    g.kv("general.alignment", &Value::U32(64));
    let at = g.tensor("w", &[8], GgmlType::F32, 32);
    g.pad(64);
    g.data(64);
    assert_err(
        &g.bytes(),
        at.offset,
        ErrorKind::Misaligned {
            tensor: "w".into(),
            offset: 32,
            alignment: 64,
        },
        &["\"w\"", "alignment 64"],
    );
}

// ---------------------------------------------------------------------------------------------
// general.alignment
// ---------------------------------------------------------------------------------------------

#[track_caller]
fn assert_bad_alignment(v: Value, detail: &str) {
    let mut g = Gguf::new(3, 0, 2);
    g.kv("general.name", &Value::String(b"x".to_vec()));
    let at = g.kv("general.alignment", &v);
    assert_err(
        &g.bytes(),
        at.key,
        ErrorKind::BadAlignment {
            detail: detail.into(),
        },
        &["\"general.alignment\"", detail],
    );
}

#[test]
fn alignment_zero() {
    assert_bad_alignment(Value::U32(0), "alignment is 0");
}

#[test]
fn alignment_48_not_a_power_of_two() {
    assert_bad_alignment(Value::U32(48), "alignment 48 is not a power of two");
}

#[test]
fn alignment_stored_as_u64() {
    assert_bad_alignment(Value::U64(32), "must be a u32, found a u64 value");
}

#[test]
fn alignment_stored_as_string() {
    assert_bad_alignment(
        Value::String(b"32".to_vec()),
        "must be a u32, found a string value",
    );
}

// ---------------------------------------------------------------------------------------------
// Names and keys
// ---------------------------------------------------------------------------------------------

#[test]
fn duplicate_metadata_key() {
    let mut g = Gguf::new(3, 0, 3);
    g.kv("general.name", &Value::String(b"x".to_vec()));
    g.kv("general.file_type", &Value::U32(2));
    let second = g.kv("general.name", &Value::String(b"y".to_vec()));
    assert_err(
        &g.bytes(),
        second.key,
        ErrorKind::DuplicateKey {
            key: "general.name".into(),
        },
        &["duplicate metadata key \"general.name\""],
    );
}

#[test]
fn duplicate_tensor_name() {
    let mut g = Gguf::new(3, 2, 0);
    g.tensor("w", &[8], GgmlType::F32, 0);
    let second = g.tensor("w", &[8], GgmlType::F32, 32);
    g.pad(32);
    g.data(64);
    assert_err(
        &g.bytes(),
        second.info,
        ErrorKind::DuplicateTensor { name: "w".into() },
        &["duplicate tensor name \"w\""],
    );
}

/// Issue 16 item 8 (ggml's `GGML_MAX_NAME`; llama.cpp refuses "tensor name 0 is too long:
/// 300 >= 64"): a 300-byte name and a 64-byte name are refused at the name's offset; 63 bytes
/// are accepted.
#[test]
fn issue16_8_gguf_tensor_names_of_64_bytes_or_more_are_refused() {
    for len in [300usize, 64] {
        let name = "n".repeat(len);
        let mut g = Gguf::new(3, 2, 0);
        g.tensor("a", &[8], GgmlType::F32, 0);
        let second = g.tensor(&name, &[8], GgmlType::F32, 32);
        g.pad(32);
        g.data(64);
        assert_err(
            &g.bytes(),
            second.info,
            ErrorKind::TensorNameTooLong {
                index: 1,
                name: name.clone(),
                len,
            },
            &[
                "tensor #1",
                &format!("name is {len} bytes long"),
                "GGML_MAX_NAME 64",
            ],
        );
    }
    let name = "n".repeat(63);
    let mut g = Gguf::new(3, 1, 0);
    g.tensor(&name, &[8], GgmlType::F32, 0);
    g.pad(32);
    g.data(32);
    assert_eq!(parse(&g.bytes()).unwrap().tensors[0].name, name);
}

#[test]
fn empty_tensor_name() {
    let mut g = Gguf::new(3, 2, 0);
    g.tensor("a", &[8], GgmlType::F32, 0);
    let second = g.tensor("", &[8], GgmlType::F32, 32);
    g.pad(32);
    g.data(64);
    assert_err(
        &g.bytes(),
        second.info,
        ErrorKind::EmptyTensorName { index: 1 },
        &["tensor #1", "empty name"],
    );
}

#[test]
fn key_invalid_utf8() {
    let mut g = Gguf::new(3, 0, 2);
    g.kv("general.name", &Value::String(b"x".to_vec()));
    let at = g.key(b"general.\xff\xfe", ValueType::U8 as u32);
    g.raw(&[1]);
    assert_err(
        &g.bytes(),
        at.key,
        ErrorKind::InvalidUtf8 {
            field: "metadata key #1".into(),
        },
        &["metadata key #1", "not valid UTF-8"],
    );
}

#[test]
fn tensor_name_invalid_utf8() {
    let (bytes, at, _) = one_tensor(b"w\xc3", &[8], GgmlType::F32.id(), 0, 32);
    assert_err(
        &bytes,
        at.info,
        ErrorKind::InvalidUtf8 {
            field: "name of tensor #0".into(),
        },
        &["name of tensor #0", "not valid UTF-8"],
    );
}

// ---------------------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------------------

#[test]
fn cli_inspect_bad_file_exits_2_naming_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("misaligned.gguf");
    let (bytes, at, _) = one_tensor(b"w", &[8], GgmlType::F32.id(), 16, 64);
    std::fs::write(&path, bytes).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_convert"))
        .arg("inspect")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(out.stdout.is_empty());
    assert!(stderr.contains(&path.display().to_string()), "{stderr}");
    assert!(
        stderr.contains(&format!("(at byte offset {})", at.offset)),
        "{stderr}"
    );
    assert!(stderr.contains("\"w\""), "{stderr}");
}

/// A tensor name with an escape sequence or a line break is printed escaped by `inspect`
/// (text form), so a file cannot forge lines or colour a terminal.
#[test]
fn cli_inspect_escapes_control_characters_in_names() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("esc.gguf");
    let (bytes, _, _) = one_tensor(b"w\x1b[2Jx\nfake", &[8], GgmlType::F32.id(), 0, 32);
    std::fs::write(&path, bytes).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_convert"))
        .arg("inspect")
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("w\\u{1b}[2Jx\\nfake"), "{stdout}");
    assert!(!stdout.contains('\x1b') && !stdout.lines().any(|l| l.starts_with("fake")));
}

#[test]
fn cli_inspect_json_on_valid_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("valid.gguf");
    let b = rich(3);
    std::fs::write(&path, &b.bytes).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_convert"))
        .args(["inspect", "--json"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    assert_eq!(j["gguf_version"], 3);
    assert_eq!(j["tensor_count"], TENSORS.len());
    assert_eq!(j["data_offset"], b.data_offset);
    let t = &j["tensors"][0];
    assert_eq!(t["name"], "token_embd.weight");
    assert_eq!(t["type"], "Q4_0");
    assert_eq!(t["ne"], serde_json::json!([64, 4]));
    assert_eq!(t["shape"], serde_json::json!([4, 64]));
    assert_eq!(j["metadata"]["test.u32"]["value"], 4_000_000_000u64);
}

// ---------------------------------------------------------------------------------------------
// Fuzzing seeds
// ---------------------------------------------------------------------------------------------

/// Small valid files the fuzzer (`fuzz/`, target `gguf_parse`) starts from.
fn fuzz_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let kvs = every_value_type();
    let kvs: Vec<(&str, Value)> = kvs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let tiny: &[TensorSpec] = &[
        ("token_embd.weight", &[32, 2], GgmlType::Q4_0),
        ("output_norm.weight", &[4], GgmlType::F32),
        ("blk.0.ffn_down.weight", &[256], GgmlType::Q4_K),
        ("blk.0.attn_k.bias", &[2, 1, 1, 2], GgmlType::F16),
    ];
    let v2 = [
        ("general.architecture", Value::String(b"llama".to_vec())),
        ("llama.block_count", Value::U32(1)),
    ];
    let v2_tensors: &[TensorSpec] = &[("a", &[4, 2], GgmlType::F32), ("b", &[32], GgmlType::Q8_0)];
    let tokens = ["<s>", "</s>", "a", "b"];
    let align64 = [
        ("general.alignment", Value::U32(64)),
        (
            "tokenizer.ggml.tokens",
            Value::Array(
                ValueType::String,
                tokens
                    .iter()
                    .map(|t| Value::String(t.as_bytes().to_vec()))
                    .collect(),
            ),
        ),
        (
            "test.nested",
            Value::Array(
                ValueType::Array,
                vec![Value::Array(
                    ValueType::U16,
                    vec![Value::U16(1), Value::U16(2)],
                )],
            ),
        ),
    ];
    let align64_tensors: &[TensorSpec] =
        &[("x", &[8], GgmlType::BF16), ("y", &[2, 2], GgmlType::F32)];
    vec![
        ("v3_every_type.gguf", build(3, &kvs, tiny, 32).bytes),
        ("v2_small.gguf", build(2, &v2, v2_tensors, 32).bytes),
        (
            "v3_align64_nested.gguf",
            build(3, &align64, align64_tensors, 64).bytes,
        ),
    ]
}

fn seeds_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds")
}

#[test]
fn fuzz_seeds_are_valid_and_current() {
    for (name, bytes) in fuzz_seeds() {
        assert!(bytes.len() < 2048, "{name}: {} bytes", bytes.len());
        parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let path = seeds_dir().join(name);
        let on_disk = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; regenerate with `cargo test --test gguf_bad_input -- --ignored write_fuzz_seeds`",
                path.display()
            )
        });
        assert!(
            on_disk == bytes,
            "{} is stale; regenerate it",
            path.display()
        );
    }
}

/// Regenerates `fuzz/seeds/`: `cargo test --test gguf_bad_input -- --ignored write_fuzz_seeds`.
#[test]
#[ignore]
fn write_fuzz_seeds() {
    std::fs::create_dir_all(seeds_dir()).unwrap();
    for (name, bytes) in fuzz_seeds() {
        std::fs::write(seeds_dir().join(name), bytes).unwrap();
    }
}
