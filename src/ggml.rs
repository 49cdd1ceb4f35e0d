//! GGML tensor types: the one table of truth for type ids, block sizes and byte sizes.
//!
//! Source: `GGML_QUANT_SIZES` and `GGMLQuantizationType` in gguf-py 0.19.0
//! (`gguf/constants.py`), which mirror `ggml_type` and `type_traits` in ggml
//! (`ggml/include/ggml.h`, `ggml/src/ggml.c`).
//!
//! A *block* is the unit a type is stored in: `block_size` consecutive elements along
//! `ne[0]` (the innermost, fastest-varying dimension) packed into `type_size` bytes.
//! Plain float and integer types have `block_size == 1`.

use std::fmt;

/// A GGML tensor type known to this crate.
///
/// Every type ggml still defines is listed so that files using any of them can be parsed and
/// inspected; [`GgmlType::can_dequantize`] says which ones `dequantize` supports.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
}

/// `QK_K`: elements per super-block of the k-quants and ternary types.
pub const QK_K: usize = 256;

/// One row of the table: id, name, elements per block, bytes per block, dequantizable.
struct Traits {
    ty: GgmlType,
    id: u32,
    name: &'static str,
    block_size: usize,
    type_size: usize,
    dequant: bool,
}

macro_rules! traits {
    ($($ty:ident = $id:literal, $bs:expr, $ts:expr, $dq:literal;)*) => {
        const TABLE: &[Traits] = &[
            $(Traits { ty: GgmlType::$ty, id: $id, name: stringify!($ty), block_size: $bs, type_size: $ts, dequant: $dq },)*
        ];
    };
}

traits! {
    F32 = 0, 1, 4, true;
    F16 = 1, 1, 2, true;
    Q4_0 = 2, 32, 2 + 16, true;
    Q4_1 = 3, 32, 2 + 2 + 16, true;
    Q5_0 = 6, 32, 2 + 4 + 16, true;
    Q5_1 = 7, 32, 2 + 2 + 4 + 16, true;
    Q8_0 = 8, 32, 2 + 32, true;
    Q8_1 = 9, 32, 4 + 4 + 32, false;
    Q2_K = 10, QK_K, 2 + 2 + QK_K / 16 + QK_K / 4, true;
    Q3_K = 11, QK_K, 2 + QK_K / 4 + QK_K / 8 + 12, true;
    Q4_K = 12, QK_K, 2 + 2 + QK_K / 2 + 12, true;
    Q5_K = 13, QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12, true;
    Q6_K = 14, QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16, true;
    Q8_K = 15, QK_K, 4 + QK_K + QK_K / 8, false;
    IQ2_XXS = 16, QK_K, 2 + QK_K / 4, false;
    IQ2_XS = 17, QK_K, 2 + QK_K / 4 + QK_K / 32, false;
    IQ3_XXS = 18, QK_K, 2 + QK_K / 4 + QK_K / 8, false;
    IQ1_S = 19, QK_K, 2 + QK_K / 8 + QK_K / 16, false;
    IQ4_NL = 20, 32, 2 + 16, false;
    IQ3_S = 21, QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4, false;
    IQ2_S = 22, QK_K, 2 + QK_K / 4 + QK_K / 16, false;
    IQ4_XS = 23, QK_K, 2 + 2 + QK_K / 2 + QK_K / 64, false;
    I8 = 24, 1, 1, false;
    I16 = 25, 1, 2, false;
    I32 = 26, 1, 4, false;
    I64 = 27, 1, 8, false;
    F64 = 28, 1, 8, false;
    IQ1_M = 29, QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32, false;
    BF16 = 30, 1, 2, true;
    TQ1_0 = 34, QK_K, 2 + 4 * 13, true;
    TQ2_0 = 35, QK_K, 2 + 64, true;
    MXFP4 = 39, 32, 1 + 16, false;
    NVFP4 = 40, 64, 4 + 32, false;
    Q1_0 = 41, 128, 2 + 16, false;
}

/// Type ids that ggml once defined and has since removed. Files using them cannot be read by
/// current ggml either; they must be re-quantized.
const REMOVED: &[(u32, &str)] = &[
    (4, "Q4_2"),
    (5, "Q4_3"),
    (31, "Q4_0_4_4"),
    (32, "Q4_0_4_8"),
    (33, "Q4_0_8_8"),
    (36, "IQ4_NL_4_4"),
    (37, "IQ4_NL_4_8"),
    (38, "IQ4_NL_8_8"),
];

/// What a raw type id read from a file turned out to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TypeId {
    Known(GgmlType),
    /// Defined by ggml once, removed since; carries the old name.
    Removed(&'static str),
    Unknown,
}

impl GgmlType {
    fn traits(self) -> &'static Traits {
        // The table is in enum order, checked by `table_is_in_enum_order`.
        &TABLE[self as usize]
    }

    /// Resolves a raw `ggml_type` id.
    pub fn from_id(id: u32) -> TypeId {
        if let Some(t) = TABLE.iter().find(|t| t.id == id) {
            return TypeId::Known(t.ty);
        }
        match REMOVED.iter().find(|(rid, _)| *rid == id) {
            Some((_, name)) => TypeId::Removed(name),
            None => TypeId::Unknown,
        }
    }

    /// Looks a type up by its ggml name (`"Q4_K"`, case-insensitive).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TABLE
            .iter()
            .find(|t| t.name.eq_ignore_ascii_case(name))
            .map(|t| t.ty)
    }

    /// The `ggml_type` id stored in GGUF tensor infos.
    pub fn id(self) -> u32 {
        self.traits().id
    }

    /// ggml's name for the type (`"Q4_K"`).
    pub fn name(self) -> &'static str {
        self.traits().name
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        self.traits().block_size
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.traits().type_size
    }

    /// Whether [`crate::quant::dequantize`] supports this type.
    pub fn can_dequantize(self) -> bool {
        self.traits().dequant
    }

    /// Every type in the table, in id order.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|t| t.ty)
    }

    /// Bytes needed by `n_elements` elements, or `None` if `n_elements` is not a multiple of
    /// the block size or the product overflows.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n_elements.is_multiple_of(bs) {
            return None;
        }
        (n_elements / bs).checked_mul(self.type_size() as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_in_enum_order() {
        for (i, t) in TABLE.iter().enumerate() {
            assert_eq!(t.ty as usize, i, "{}", t.name);
            assert_eq!(format!("{:?}", t.ty), t.name);
        }
    }

    #[test]
    fn ids_resolve() {
        assert_eq!(GgmlType::from_id(12), TypeId::Known(GgmlType::Q4_K));
        assert_eq!(GgmlType::from_id(35), TypeId::Known(GgmlType::TQ2_0));
        assert_eq!(GgmlType::from_id(4), TypeId::Removed("Q4_2"));
        assert_eq!(GgmlType::from_id(31), TypeId::Removed("Q4_0_4_4"));
        assert_eq!(GgmlType::from_id(1000), TypeId::Unknown);
        assert_eq!(GgmlType::from_name("q6_k"), Some(GgmlType::Q6_K));
    }

    #[test]
    fn sizes_match_ggml() {
        assert_eq!(GgmlType::Q4_K.type_size(), 144);
        assert_eq!(GgmlType::Q6_K.type_size(), 210);
        assert_eq!(GgmlType::Q3_K.type_size(), 110);
        assert_eq!(GgmlType::Q2_K.type_size(), 84);
        assert_eq!(GgmlType::Q5_K.type_size(), 176);
        assert_eq!(GgmlType::TQ1_0.type_size(), 54);
        assert_eq!(GgmlType::TQ2_0.type_size(), 66);
        assert_eq!(GgmlType::Q4_0.bytes_for(64), Some(36));
        assert_eq!(GgmlType::Q4_0.bytes_for(33), None);
    }
}
