//! Dequantization against gguf-py's own output on the reference vectors in
//! `testdata/dequant/` (written by `tests/ref/gen_dequant_vectors.py` with the pinned gguf-py).
//! Bits must match exactly; NaN matches any NaN.

mod common;

use lowbit::ggml::GgmlType;
use lowbit::quant::{self, Path};
use serde_json::Value;

fn load(ty: &str) -> (Value, Vec<u8>, Vec<f32>) {
    let dir = common::repo().join("testdata/dequant");
    let index: Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    let entry = index["types"][ty].clone();
    assert!(entry.is_object(), "{ty} missing from index.json");
    let bin = std::fs::read(dir.join(format!("{ty}.bin"))).unwrap();
    let f32s: Vec<f32> = std::fs::read(dir.join(format!("{ty}.f32")))
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (entry, bin, f32s)
}

/// Compares case by case and reports the first differing element of the worst case.
fn check(ty_name: &str, path: Path) {
    let ty = GgmlType::from_name(ty_name).unwrap();
    let (entry, bin, want) = load(ty_name);
    assert_eq!(entry["type_id"].as_u64().unwrap() as u32, ty.id());
    assert_eq!(
        entry["block_size"].as_u64().unwrap() as usize,
        ty.block_size()
    );
    assert_eq!(
        entry["type_size"].as_u64().unwrap() as usize,
        ty.type_size()
    );
    let n_blocks = entry["n_blocks"].as_u64().unwrap() as usize;
    assert_eq!(bin.len(), n_blocks * ty.type_size());
    assert_eq!(want.len(), n_blocks * ty.block_size());

    let mut got = vec![0f32; want.len()];
    quant::dequantize_with(path, ty, &bin, &mut got).unwrap();
    let mut failures = Vec::new();
    for case in entry["cases"].as_array().unwrap() {
        let first = case["first_block"].as_u64().unwrap() as usize * ty.block_size();
        let n = case["n_blocks"].as_u64().unwrap() as usize * ty.block_size();
        let bad: Vec<usize> = (first..first + n)
            .filter(|&i| !common::same_bits(got[i], want[i]))
            .collect();
        if let Some(&i) = bad.first() {
            failures.push(format!(
                "case {:?}: {} of {} elements differ; first at element {} (block {}): got {:#010x} ({}), gguf-py {:#010x} ({})",
                case["name"].as_str().unwrap(),
                bad.len(),
                n,
                i,
                i / ty.block_size(),
                got[i].to_bits(),
                got[i],
                want[i].to_bits(),
                want[i]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{ty_name} {path:?}:\n{}",
        failures.join("\n")
    );

    // The parallel entry point gives the same bits.
    let mut par = vec![0f32; want.len()];
    quant::dequantize_par(ty, &bin, &mut par).unwrap();
    assert!(got
        .iter()
        .zip(&par)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
}

macro_rules! vector_tests {
    ($($name:ident => $ty:literal,)*) => {
        mod scalar { $( #[test] fn $name() { super::check($ty, super::Path::Scalar); } )* }
        mod simd { $( #[test] fn $name() { super::check($ty, super::Path::Avx2); } )* }
    };
}

vector_tests! {
    f32 => "F32",
    f16 => "F16",
    bf16 => "BF16",
    q4_0 => "Q4_0",
    q4_1 => "Q4_1",
    q5_0 => "Q5_0",
    q5_1 => "Q5_1",
    q8_0 => "Q8_0",
    q2_k => "Q2_K",
    q3_k => "Q3_K",
    q4_k => "Q4_K",
    q5_k => "Q5_K",
    q6_k => "Q6_K",
    tq1_0 => "TQ1_0",
    tq2_0 => "TQ2_0",
}

#[test]
fn every_dequantizable_type_has_vectors() {
    let index: Value = serde_json::from_slice(
        &std::fs::read(common::repo().join("testdata/dequant/index.json")).unwrap(),
    )
    .unwrap();
    for ty in GgmlType::all().filter(|t| t.can_dequantize()) {
        assert!(index["types"][ty.name()].is_object(), "no vectors for {ty}");
    }
}

#[test]
fn unsupported_type_is_an_error_naming_it() {
    let mut out = vec![0f32; 256];
    let err = quant::dequantize(GgmlType::IQ2_XXS, &[0u8; 66], &mut out).unwrap_err();
    assert!(err.to_string().contains("IQ2_XXS"), "{err}");
    assert!(err.to_string().contains("16"), "{err}");
}

#[test]
fn partial_block_is_an_error() {
    let mut out = vec![0f32; 32];
    let err = quant::dequantize(GgmlType::Q4_0, &[0u8; 17], &mut out).unwrap_err();
    assert!(matches!(err, quant::DequantError::Length { .. }), "{err}");
}
