//! Both real models, every tensor, against gguf-py's dequantization (golden SHA256s of the f32
//! bytes in `testdata/golden/`, written by `tests/ref/gen_golden_real.py`), and the header
//! against an independent parser (gguf-rs-lib).

mod common;

use std::fs::File;
use std::io::BufReader;

use lowbit::gguf::GgufFile;
use lowbit::quant;
use serde_json::Value;

const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";

fn golden(file: &str) -> Value {
    let stem = file.trim_end_matches(".gguf");
    let p = common::repo().join(format!("testdata/golden/{stem}.json"));
    serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap()
}

fn check_model(file: &str) {
    let Some(path) = common::model(file) else {
        return;
    };
    let g = golden(file);
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.file_len(), g["file_size"].as_u64().unwrap());
    let tensors = g["tensors"].as_object().unwrap();
    assert_eq!(f.tensors.len(), tensors.len(), "tensor count");
    let mut mismatches = Vec::new();
    for t in &f.tensors {
        let want = &tensors[&t.name];
        assert_eq!(t.ty.name(), want["type"].as_str().unwrap(), "{}", t.name);
        let ne: Vec<u64> = serde_json::from_value(want["ne"].clone()).unwrap();
        assert_eq!(t.ne, ne, "{} ne", t.name);
        let shape: Vec<u64> = serde_json::from_value(want["shape"].clone()).unwrap();
        assert_eq!(t.shape(), shape, "{} shape", t.name);
        assert_eq!(
            t.abs_offset,
            want["data_offset"].as_u64().unwrap(),
            "{}",
            t.name
        );
        let raw = f.tensor_data(t);
        assert_eq!(
            lowbit::util::sha256_hex(raw),
            want["raw_sha256"].as_str().unwrap(),
            "{} raw bytes",
            t.name
        );
        let mut out = vec![0f32; t.n_elements() as usize];
        quant::dequantize_par(t.ty, raw, &mut out).unwrap();
        if common::sha256_f32(&out) != want["f32_sha256"].as_str().unwrap() {
            mismatches.push(format!("{} ({})", t.name, t.ty));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{file}: {} tensors differ from gguf-py: {:?}",
        mismatches.len(),
        mismatches
    );
}

#[test]
fn smollm2_every_tensor_matches_gguf_py() {
    check_model(SMOLLM2);
}

#[test]
fn gemma3_every_tensor_matches_gguf_py() {
    check_model(GEMMA);
}

/// The header as gguf-rs-lib reads it (its strict synchronous v3 reader) agrees with ours.
fn cross_check_with_gguf_rs_lib(file: &str) {
    let Some(path) = common::model(file) else {
        return;
    };
    let ours = GgufFile::open(&path).unwrap();
    let theirs =
        gguf_rs_lib::reader::GGUFFileReader::new(BufReader::new(File::open(&path).unwrap()))
            .unwrap();
    assert_eq!(theirs.tensor_count(), ours.tensors.len());
    assert_eq!(theirs.metadata().len(), ours.metadata.len());
    assert_eq!(theirs.tensor_data_offset(), ours.data_offset);
    for t in &ours.tensors {
        let o = theirs.get_tensor_info(&t.name).unwrap();
        assert_eq!(o.shape().dims(), t.ne.as_slice(), "{}", t.name);
        assert_eq!(o.tensor_type() as u32, t.ty.id(), "{}", t.name);
        assert_eq!(o.data_offset(), t.offset, "{}", t.name);
    }
    for (k, _) in &ours.metadata {
        assert!(theirs.metadata().get(k).is_some(), "{k}");
    }
}

#[test]
fn smollm2_header_agrees_with_gguf_rs_lib() {
    cross_check_with_gguf_rs_lib(SMOLLM2);
}

#[test]
fn gemma3_header_agrees_with_gguf_rs_lib() {
    cross_check_with_gguf_rs_lib(GEMMA);
}
