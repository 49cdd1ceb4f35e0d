//! `convert dequantize` end to end on SmolLM2: output readable by the safetensors crate, shapes
//! row-major, values equal to gguf-py's, metadata naming the source; never overwrites and
//! leaves nothing behind on failure.

mod common;

use std::process::Command;

use safetensors::SafeTensors;
use serde_json::Value;

fn convert() -> Command {
    Command::new(env!("CARGO_BIN_EXE_convert"))
}

fn golden() -> Value {
    let p = common::repo().join("testdata/golden/SmolLM2-135M-Instruct.Q4_1.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

#[test]
fn dequantize_subset_matches_gguf_py_and_names_source() {
    let Some(model) = common::model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("blk0.safetensors");
    let st = convert()
        .args([
            "dequantize",
            "--quiet",
            "--tensor",
            "blk.0.*",
            "--tensor",
            "token_embd.weight",
            "-o",
        ])
        .arg(&out)
        .arg(&model)
        .status()
        .unwrap();
    assert!(st.success());
    let bytes = std::fs::read(&out).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let info = meta.metadata().as_ref().unwrap();
    let g = golden();
    assert_eq!(info["source_file"], "SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(info["source_sha256"], g["file_sha256"].as_str().unwrap());
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let names = st.names();
    assert_eq!(names.len(), 10, "{names:?}");
    for (name, view) in st.tensors() {
        let want = &g["tensors"][&name];
        let shape: Vec<usize> = serde_json::from_value(want["shape"].clone()).unwrap();
        assert_eq!(view.shape(), shape.as_slice(), "{name}");
        assert_eq!(view.dtype(), safetensors::Dtype::F32);
        assert_eq!(
            lowbit::util::sha256_hex(view.data()),
            want["f32_sha256"].as_str().unwrap(),
            "{name}"
        );
    }
}

#[test]
fn dequantize_f16_rounds_each_value_to_nearest_even() {
    let Some(model) = common::model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let f32_out = dir.path().join("a.safetensors");
    let f16_out = dir.path().join("b.safetensors");
    for (out, dtype) in [(&f32_out, "f32"), (&f16_out, "f16")] {
        let st = convert()
            .args([
                "dequantize",
                "-q",
                "--tensor",
                "blk.3.attn_q.weight",
                "--dtype",
                dtype,
                "-o",
            ])
            .arg(out)
            .arg(&model)
            .status()
            .unwrap();
        assert!(st.success());
    }
    let a = std::fs::read(&f32_out).unwrap();
    let b = std::fs::read(&f16_out).unwrap();
    let a = SafeTensors::deserialize(&a).unwrap();
    let b = SafeTensors::deserialize(&b).unwrap();
    let ta = a.tensor("blk.3.attn_q.weight").unwrap();
    let tb = b.tensor("blk.3.attn_q.weight").unwrap();
    assert_eq!(tb.dtype(), safetensors::Dtype::F16);
    assert_eq!(ta.shape(), tb.shape());
    for (x, y) in ta.data().chunks_exact(4).zip(tb.data().chunks_exact(2)) {
        let x = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
        let y = u16::from_le_bytes([y[0], y[1]]);
        assert_eq!(half::f16::from_f32(x).to_bits(), y);
    }
}

#[test]
fn refuses_to_overwrite_and_leaves_nothing_on_failure() {
    let Some(model) = common::model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("exists.safetensors");
    std::fs::write(&out, b"precious").unwrap();
    let o = convert()
        .args(["dequantize", "-q", "-o"])
        .arg(&out)
        .arg(&model)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), b"precious");

    // A glob that matches nothing fails before anything is written.
    let out2 = dir.path().join("none.safetensors");
    let o = convert()
        .args(["dequantize", "-q", "--tensor", "no.such.*", "-o"])
        .arg(&out2)
        .arg(&model)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("no.such.*") && err.contains("matches no tensor"),
        "{err}"
    );
    // Nothing at the output path, no temporary left in the directory.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "{left:?}");
}

#[test]
fn missing_input_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let o = convert()
        .args(["dequantize", "/nonexistent/model.gguf", "-o"])
        .arg(dir.path().join("x.safetensors"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
}
