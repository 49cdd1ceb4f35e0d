//! GGUF metadata values (`gguf_metadata_value_type` in the GGUF specification).

use serde_json::json;

/// Metadata value type ids, as stored in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The smallest number of bytes one value of this type can occupy: fixed-size types their
    /// size, a string its 8-byte length, an array its 4-byte type and 8-byte count.
    pub fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
            String => 8,
            Array => 12,
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// One metadata value. Strings are kept as the raw bytes of the file (GGUF says UTF-8, but
/// tokenizer vocabularies in the wild contain byte sequences that are not).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(Vec<u8>),
    Array(ValueType, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// Arrays longer than this are summarized by [`Value::to_json_summary`].
pub const SUMMARY_ARRAY_LEN: usize = 8;

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v as i64),
            Value::I16(v) => Some(v as i64),
            Value::I32(v) => Some(v as i64),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float (floats and integers).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// A string value as text (lossy for invalid UTF-8).
    pub fn as_str(&self) -> Option<std::borrow::Cow<'_, str>> {
        match self {
            Value::String(b) => Some(String::from_utf8_lossy(b)),
            _ => None,
        }
    }

    /// A string value's raw bytes.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::String(b) => Some(b),
            _ => None,
        }
    }

    /// An array's elements.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(_, v) => Some(v),
            _ => None,
        }
    }

    /// Full JSON form (no summarizing). Non-finite floats become strings ("NaN", "inf").
    pub fn to_json(&self) -> serde_json::Value {
        self.to_json_limited(usize::MAX)
    }

    /// JSON form with arrays longer than [`SUMMARY_ARRAY_LEN`] summarized as
    /// `{"type": "array", "elem_type": ..., "len": N, "head": [first few]}`.
    pub fn to_json_summary(&self) -> serde_json::Value {
        self.to_json_limited(SUMMARY_ARRAY_LEN)
    }

    fn to_json_limited(&self, limit: usize) -> serde_json::Value {
        fn float(v: f64) -> serde_json::Value {
            if v.is_finite() {
                json!(v)
            } else {
                json!(v.to_string())
            }
        }
        match self {
            Value::U8(v) => json!(v),
            Value::I8(v) => json!(v),
            Value::U16(v) => json!(v),
            Value::I16(v) => json!(v),
            Value::U32(v) => json!(v),
            Value::I32(v) => json!(v),
            Value::U64(v) => json!(v),
            Value::I64(v) => json!(v),
            Value::F32(v) => float(*v as f64),
            Value::F64(v) => float(*v),
            Value::Bool(v) => json!(v),
            Value::String(b) => json!(String::from_utf8_lossy(b)),
            Value::Array(t, items) => {
                if items.len() <= limit {
                    serde_json::Value::Array(
                        items.iter().map(|v| v.to_json_limited(limit)).collect(),
                    )
                } else {
                    json!({
                        "type": "array",
                        "elem_type": t.name(),
                        "len": items.len(),
                        "head": items.iter().take(SUMMARY_ARRAY_LEN / 2).map(|v| v.to_json_limited(limit)).collect::<Vec<_>>(),
                    })
                }
            }
        }
    }
}
