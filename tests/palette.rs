//! Palettization: k-means against the weighted kmeans1d that coremltools 9.0 vendors, uniform
//! against coremltools' UNIFORM mode (vectors from `tests/ref/gen_palette_vectors.py`), and
//! `convert palettize` / `dequantize` / `verify` / `run` / `validate` end to end on the tiny
//! MiniCPM model and (with the cache) on SmolLM2.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use half::f16;
use lowbit::bundle::manifest::Encoding;
use lowbit::bundle::reader::Bundle;
use lowbit::palette::{self, kmeans, Arith, Mode};
use serde_json::Value;

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_convert"))
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The tiny MiniCPM with F16 linears (and F32 norms, F16 embedding).
fn tiny_f16() -> PathBuf {
    common::repo().join("testdata/ternary/minicpm-tiny-f16.gguf")
}

fn vectors() -> Value {
    serde_json::from_slice(
        &std::fs::read(common::repo().join("testdata/palette/vectors.json")).unwrap(),
    )
    .unwrap()
}

fn case_values(c: &Value) -> (Vec<f32>, Arith) {
    let raw = c["values"].as_array().unwrap();
    if c["dtype"] == "f16" {
        (
            raw.iter()
                .map(|v| f16::from_bits(v.as_u64().unwrap() as u16).to_f32())
                .collect(),
            Arith::F16,
        )
    } else {
        (
            raw.iter()
                .map(|v| f32::from_bits(v.as_u64().unwrap() as u32))
                .collect(),
            Arith::F32,
        )
    }
}

#[test]
fn kmeans_reaches_kmeans1d_optimum_and_coremltools_sse() {
    let v = vectors();
    let mut checked = 0;
    for c in v["cases"].as_array().unwrap() {
        let (vals, arith) = case_values(c);
        let (xs, ws) = palette::distinct_counts(&vals);
        for (bits, k) in c["kmeans"].as_object().unwrap() {
            let bits: u32 = bits.parse().unwrap();
            let want = k["optimal_sse"].as_f64().unwrap();
            let got = kmeans::optimal(&xs, &ws, 1 << bits).sse;
            assert!(
                (got - want).abs() <= 1e-9 * want.max(1e-30) + 1e-24,
                "{} {bits}-bit: optimal SSE {got:e}, kmeans1d {want:e}",
                c["name"]
            );
            // With f16 tables and nearest-entry indices we are never worse than coremltools'
            // (f16-cast centroids, kmeans1d labels).
            let g = palette::palettize_group(&vals, bits, Mode::Kmeans, arith).unwrap();
            let ct = k["coremltools_sse"].as_f64().unwrap();
            if arith == Arith::F16 {
                assert!(
                    g.sse <= ct * (1.0 + 1e-12) + 1e-30,
                    "{} {bits}-bit: our SSE {:e} > coremltools' {ct:e}",
                    c["name"],
                    g.sse
                );
            }
            if xs.len() <= 1 << bits && arith == Arith::F16 {
                assert_eq!(g.sse, 0.0, "{} {bits}-bit has few values", c["name"]);
            }
            checked += 1;
        }
    }
    assert!(checked >= 6 * 7, "only {checked} cases");
}

#[test]
fn uniform_matches_coremltools() {
    let v = vectors();
    for c in v["cases"].as_array().unwrap() {
        let (vals, arith) = case_values(c);
        for (bits, u) in c["uniform"].as_object().unwrap() {
            let bits: u32 = bits.parse().unwrap();
            let g = palette::palettize_group(&vals, bits, Mode::Uniform, arith).unwrap();
            let lut: Vec<u16> = u["lut"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| {
                    let b = x.as_u64().unwrap();
                    if arith == Arith::F16 {
                        b as u16
                    } else {
                        // Stored as f16 by us: coremltools' f32 entry rounded once more.
                        f16::from_f32(f32::from_bits(b as u32)).to_bits()
                    }
                })
                .collect();
            assert_eq!(g.table, lut, "{} {bits}-bit uniform table", c["name"]);
            let idx: Vec<u8> = u["indices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u8)
                .collect();
            assert_eq!(g.indices, idx, "{} {bits}-bit uniform indices", c["name"]);
        }
    }
}

#[test]
fn kmeans_is_deterministic_and_exact_for_f16_sources() {
    // Every f16 value of a small range: 2^B distinct values or fewer are exact.
    let vals: Vec<f32> = (0..64u16)
        .map(|i| f16::from_bits(0x3C00 + i * 3).to_f32())
        .cycle()
        .take(4096)
        .collect();
    let g = palette::palettize_group(&vals, 6, Mode::Kmeans, Arith::F16).unwrap();
    assert_eq!(g.sse, 0.0);
    let g2 = palette::palettize_group(&vals, 4, Mode::Kmeans, Arith::F16).unwrap();
    assert!(g2.sse > 0.0);
    assert_eq!(
        g2,
        palette::palettize_group(&vals, 4, Mode::Kmeans, Arith::F16).unwrap()
    );
}

fn palettize(input: &Path, extra: &[&str]) -> (tempfile::TempDir, PathBuf, Output) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.bundle");
    let mut args = vec!["palettize", s(input), "-o", s(&out), "-q"];
    if extra.contains(&"--group-size") {
        // The tiny model's vocabulary (474 rows) is not a multiple of the groups used here.
        args.extend([
            "--exclude",
            "output.weight",
            "--exclude",
            "token_embd.weight",
        ]);
    }
    args.extend_from_slice(extra);
    let o = run(&args);
    (dir, out, o)
}

/// Reconstructs a palettized tensor from the manifest and bytes by the schema's formula.
fn reconstruct(b: &Bundle, name: &str) -> Vec<f32> {
    let t = b.tensor(name).unwrap();
    let Encoding::Palette {
        bits,
        group_size,
        tables_offset,
        indices_offset,
        row_bytes,
        ..
    } = t.encoding.clone()
    else {
        panic!("{name} is not palettized")
    };
    let bytes = b.tensor_bytes(t);
    let (rows, cols) = (t.shape[0] as usize, t.shape[1] as usize);
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let row = &bytes[indices_offset as usize + r * row_bytes as usize..];
        for c in 0..cols {
            let mut ix = 0usize;
            for bit in 0..bits as usize {
                let p = c * bits as usize + bit;
                ix |= (((row[p / 8] >> (p % 8)) & 1) as usize) << bit;
            }
            let g = r / group_size as usize;
            let off = tables_offset as usize + (g * (1 << bits) + ix) * 2;
            out.push(f16::from_bits(u16::from_le_bytes([bytes[off], bytes[off + 1]])).to_f32());
        }
    }
    out
}

#[test]
fn tiny_palettize_reconstructs_records_errors_and_runs() {
    let src = tiny_f16();
    for (bits, mode) in [
        ("8", "kmeans"),
        ("4", "kmeans"),
        ("4", "uniform"),
        ("3", "kmeans"),
    ] {
        let (_d, out, o) = palettize(
            &src,
            &["--bits", bits, "--mode", mode, "--group-size", "16"],
        );
        assert!(o.status.success(), "{}", text(&o));
        let b = Bundle::open(&out).unwrap();
        let g = lowbit::gguf::GgufFile::open(&src).unwrap();
        let mut n_pal = 0;
        for t in &b.manifest.tensors {
            let Encoding::Palette {
                sse, max_abs_err, ..
            } = &t.encoding
            else {
                // Excluded (vocabulary rows not a multiple of 16), 1-D, norms or small.
                assert!(
                    t.name == "output.weight"
                        || t.name == "token_embd.weight"
                        || t.name.contains("norm")
                        || t.shape.len() == 1
                        || t.shape.iter().product::<u64>() <= 2048,
                    "{} not palettized",
                    t.name
                );
                continue;
            };
            n_pal += 1;
            // The schema's formula, our reader and the recorded errors agree.
            let rec = reconstruct(&b, &t.name);
            assert_eq!(b.tensor_f32(t).unwrap(), rec, "{}", t.name);
            let st = g.tensor(&t.name).unwrap();
            let mut want = vec![0f32; rec.len()];
            lowbit::quant::dequantize(st.ty, g.tensor_data(st), &mut want).unwrap();
            let e2: f64 = rec
                .iter()
                .zip(&want)
                .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
                .sum();
            let mx = rec
                .iter()
                .zip(&want)
                .map(|(a, b)| (*a as f64 - *b as f64).abs())
                .fold(0.0, f64::max);
            assert!(
                (e2 - sse).abs() <= 1e-9 * sse.max(1e-30),
                "{}: sse {e2} vs {sse}",
                t.name
            );
            assert_eq!(mx, *max_abs_err, "{}", t.name);
        }
        assert!(n_pal >= 7, "{n_pal} palettized");
        // verify against the source recomputes the recorded errors bit for bit.
        let o = run(&["verify", s(&out), "--source", s(&src)]);
        assert!(o.status.success(), "{}", text(&o));
        // It runs.
        let o = run(&["run", s(&out), "--prompt-ids", "1,2,3", "--max-tokens", "4"]);
        assert!(o.status.success(), "{}", text(&o));
    }
}

#[test]
fn output_does_not_depend_on_workers() {
    let src = tiny_f16();
    let (_a, o1, r1) = palettize(
        &src,
        &["--bits", "6", "--group-size", "8", "--workers", "1"],
    );
    let (_b, o2, r2) = palettize(
        &src,
        &["--bits", "6", "--group-size", "8", "--workers", "3"],
    );
    assert!(
        r1.status.success() && r2.status.success(),
        "{}{}",
        text(&r1),
        text(&r2)
    );
    for f in ["weights.bin", "manifest.json", "tokenizer.json"] {
        assert_eq!(
            std::fs::read(o1.join(f)).unwrap(),
            std::fs::read(o2.join(f)).unwrap(),
            "{f} differs between --workers 1 and 3"
        );
    }
}

#[test]
fn gguf_and_dequantized_safetensors_give_the_same_bundle() {
    let src = tiny_f16();
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("model.safetensors");
    let o = run(&["dequantize", s(&src), "-o", s(&st), "--with-config", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    // One table per tensor, so every matrix is palettized and the carried tensors (F32
    // norms) have the same type in both inputs.
    let (_a, from_gguf, r1) = palettize(&src, &["--bits", "4"]);
    let (_b, from_st, r2) = palettize(&st, &["--bits", "4"]);
    assert!(
        r1.status.success() && r2.status.success(),
        "{}{}",
        text(&r1),
        text(&r2)
    );
    for f in ["weights.bin", "tokenizer.json"] {
        assert!(
            std::fs::read(from_gguf.join(f)).unwrap() == std::fs::read(from_st.join(f)).unwrap(),
            "{f} differs"
        );
    }
    let (a, b) = (
        Bundle::open(&from_gguf).unwrap(),
        Bundle::open(&from_st).unwrap(),
    );
    assert_eq!(a.manifest.bundle_digest, b.manifest.bundle_digest);
    assert_eq!(a.manifest.model, b.manifest.model);
    assert_eq!(b.manifest.source.format.as_deref(), Some("safetensors"));
    // And from the palettized bundle itself: its palette tensors are kept.
    let (_c, again, r3) = palettize(&from_gguf, &["--bits", "8"]);
    assert!(r3.status.success(), "{}", text(&r3));
    let c = Bundle::open(&again).unwrap();
    for t in &c.manifest.tensors {
        assert_eq!(
            t.encoding,
            a.tensor(&t.name).unwrap().encoding,
            "{}",
            t.name
        );
    }
}

#[test]
fn bad_input_is_refused_with_names() {
    let src = tiny_f16();
    // Rows not divisible by the group size: names the tensor and both numbers.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.bundle");
    let o = run(&[
        "palettize",
        s(&src),
        "-o",
        s(&out),
        "--bits",
        "4",
        "--group-size",
        "7",
    ]);
    let d = dir;
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("474 rows are not divisible by --group-size 7") && t.contains("output.weight"),
        "{t}"
    );
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(d.path()).unwrap().count(),
        0,
        "left files behind"
    );
    // Unsupported bit width.
    let (_d, _o, o) = palettize(&src, &["--bits", "5"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("--bits 5"), "{}", text(&o));
    // A glob that matches nothing.
    let (_d, _o, o) = palettize(&src, &["--bits", "4", "--exclude", "nope.*"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("matches no tensor"), "{}", text(&o));
    // A NaN weight in a safetensors input: names the tensor and the group.
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("model.safetensors");
    let o = run(&["dequantize", s(&src), "-o", s(&st), "--with-config", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let mut bytes = std::fs::read(&st).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let hdr: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let off = hdr["blk.1.ffn_up.weight"]["data_offsets"][0]
        .as_u64()
        .unwrap() as usize;
    let at = 8 + n + off + 4 * 100;
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&st, bytes).unwrap();
    let (_d, out, o) = palettize(&st, &["--bits", "4"]);
    assert_eq!(o.status.code(), Some(2));
    let t = text(&o);
    assert!(
        t.contains("blk.1.ffn_up.weight") && t.contains("non-finite"),
        "{t}"
    );
    assert!(!out.exists());
    // A safetensors file without config.json beside it.
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    let (_d, _o, o) = palettize(&st, &["--bits", "4"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("config.json"), "{}", text(&o));
}

#[test]
fn more_bad_input_is_refused_with_names() {
    let src = tiny_f16();
    // A glob that is not a glob names the flag and the glob.
    let (_d, _o, o) = palettize(&src, &["--bits", "4", "--include", "blk.[0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("--include \"blk.[0\""), "{}", text(&o));
    // Safetensors inputs: sidecars missing or foreign, an unsupported dtype.
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("model.safetensors");
    let o = run(&["dequantize", s(&src), "-o", s(&st), "--with-config", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    // --with-config refuses to replace existing sidecars, and leaves no output behind.
    let st2 = dir.path().join("again.safetensors");
    let o = run(&["dequantize", s(&src), "-o", s(&st2), "--with-config", "-q"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("config.json"), "{}", text(&o));
    assert!(!st2.exists());
    let tok = dir.path().join("tokenizer.json");
    let tok_bytes = std::fs::read(&tok).unwrap();
    std::fs::remove_file(&tok).unwrap();
    let (_d, _o, o) = palettize(&st, &["--bits", "4"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("tokenizer.json"), "{}", text(&o));
    std::fs::write(&tok, tok_bytes).unwrap();
    let cfg = dir.path().join("config.json");
    std::fs::write(&cfg, r#"{"hidden_size": 64}"#).unwrap();
    let (_d, _o, o) = palettize(&st, &["--bits", "4"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("config.json")
            && text(&o).contains("neither a Hugging Face configuration"),
        "{}",
        text(&o)
    );
    // A Hugging Face configuration missing a key names the file and the key.
    std::fs::write(&cfg, r#"{"model_type": "llama", "hidden_size": 64}"#).unwrap();
    let (_d, _o, o) = palettize(&st, &["--bits", "4"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("config.json: num_hidden_layers: missing"),
        "{}",
        text(&o)
    );
}

/// `convert palettize input -o <tmp>/p.bundle -q args...`.
fn palettize_plain(input: &Path, args: &[&str]) -> (tempfile::TempDir, PathBuf, Output) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.bundle");
    let mut a = vec!["palettize", s(input), "-o", s(&out), "-q"];
    a.extend_from_slice(args);
    let o = run(&a);
    (dir, out, o)
}

/// Copies a Hugging Face checkpoint directory (so a test may edit it).
fn copy_dir(from: &Path) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), d.path().join(e.file_name())).unwrap();
    }
    d
}

fn tokenizer_metadata(bundle: &Path) -> Value {
    let v: Value =
        serde_json::from_slice(&std::fs::read(bundle.join("tokenizer.json")).unwrap()).unwrap();
    v["metadata"].clone()
}

/// SmolLM2 as a Hugging Face checkpoint (f32 safetensors, config.json, tokenizer.json,
/// tokenizer_config.json; written by tests/ref/make_hf_checkpoint.py and checked there with
/// the `tokenizers` library and a Hugging Face-style forward pass against llama.cpp): the
/// same weights, model configuration and tokenizer as palettizing the GGUF, and it runs; and
/// `convert dequantize --with-config`'s safetensors of the GGUF gives the GGUF's bundle.
#[test]
fn smollm2_hugging_face_checkpoint_gives_the_gguf_bundle() {
    let (Some(src), Some(hf)) = (
        common::model("SmolLM2-135M-Instruct.Q4_1.gguf"),
        common::hf_checkpoint("smollm2-f32"),
    ) else {
        return;
    };
    let args = ["--bits", "4", "--group-size", "32", "--context", "512"];
    let (_a, from_gguf, r1) = palettize_plain(&src, &args);
    let (_b, from_hf, r2) = palettize_plain(&hf.join("model.safetensors"), &args);
    assert!(
        r1.status.success() && r2.status.success(),
        "{}{}",
        text(&r1),
        text(&r2)
    );
    assert!(
        std::fs::read(from_gguf.join("weights.bin")).unwrap()
            == std::fs::read(from_hf.join("weights.bin")).unwrap(),
        "weights.bin differs"
    );
    let (a, b) = (
        Bundle::open(&from_gguf).unwrap(),
        Bundle::open(&from_hf).unwrap(),
    );
    assert_eq!(a.manifest.model, b.manifest.model);
    assert_eq!(tokenizer_metadata(&from_gguf), tokenizer_metadata(&from_hf));
    assert_eq!(
        b.manifest.source.format.as_deref(),
        Some("huggingface-safetensors")
    );
    // And from `convert dequantize --with-config`'s safetensors of the GGUF: the same bundle,
    // byte for byte but for the manifest's source and command line.
    let d = tempfile::tempdir().unwrap();
    let st = d.path().join("model.safetensors");
    let o = run(&["dequantize", s(&src), "-o", s(&st), "--with-config", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let (_c, from_st, r3) = palettize_plain(&st, &args);
    assert!(r3.status.success(), "{}", text(&r3));
    for f in ["weights.bin", "tokenizer.json"] {
        assert!(
            std::fs::read(from_gguf.join(f)).unwrap() == std::fs::read(from_st.join(f)).unwrap(),
            "{f} differs"
        );
    }
    let c = Bundle::open(&from_st).unwrap();
    assert_eq!(a.manifest.bundle_digest, c.manifest.bundle_digest);
    assert_eq!(a.manifest.model, c.manifest.model);
    // Both run, and generate the same text (4-bit is too coarse for this model to stay on
    // "Paris"; identical weights, configuration and tokenizer give identical output).
    let gen = |b: &Path| {
        let o = run(&[
            "run",
            s(b),
            "--prompt",
            "The capital of France is",
            "--max-tokens",
            "8",
        ]);
        assert!(o.status.success(), "{}", text(&o));
        o.stdout
    };
    assert_eq!(gen(&from_gguf), gen(&from_hf));
}

/// The tiny MiniCPM as a sharded Hugging Face checkpoint (two safetensors files and their
/// index, tokenizer.model, LongRoPE factors in config.json): the same weights as the GGUF.
#[test]
fn tiny_minicpm_sharded_hugging_face_checkpoint_gives_the_gguf_weights() {
    let Some(hf) = common::hf_checkpoint("minicpm-tiny-sharded") else {
        return;
    };
    let src = common::repo().join("testdata/ternary/minicpm-tiny-tq2_0.gguf");
    let args = ["--bits", "4", "--group-size", "2"];
    let (_a, from_gguf, r1) = palettize_plain(&src, &args);
    let idx = hf.join("model.safetensors.index.json");
    let (_b, from_hf, r2) = palettize_plain(&idx, &args);
    assert!(
        r1.status.success() && r2.status.success(),
        "{}{}",
        text(&r1),
        text(&r2)
    );
    assert!(
        std::fs::read(from_gguf.join("weights.bin")).unwrap()
            == std::fs::read(from_hf.join("weights.bin")).unwrap(),
        "weights.bin differs"
    );
    let (a, b) = (
        Bundle::open(&from_gguf).unwrap(),
        Bundle::open(&from_hf).unwrap(),
    );
    // The tiny GGUF has no minicpm.vocab_size key (convert_hf_to_gguf writes one); the rest
    // of the configuration, LongRoPE factors and mscale included, is the same.
    let (mut ma, mut mb) = (a.manifest.model.clone(), b.manifest.model.clone());
    mb.hparams.remove("minicpm.vocab_size");
    ma.hparams.remove("minicpm.vocab_size");
    assert_eq!(ma, mb);
    let (mut ta, mut tb) = (tokenizer_metadata(&from_gguf), tokenizer_metadata(&from_hf));
    // sentencepiece's add_dummy_prefix (true, llama.cpp's default when the key is absent)
    assert_eq!(tb["ggml.add_space_prefix"], true);
    ta.as_object_mut().unwrap().remove("ggml.add_space_prefix");
    tb.as_object_mut().unwrap().remove("ggml.add_space_prefix");
    assert_eq!(ta, tb);
}

#[test]
fn hugging_face_bad_input_is_refused_with_names() {
    let Some(hf) = common::hf_checkpoint("minicpm-tiny-sharded") else {
        return;
    };
    let idx = |d: &Path| d.join("model.safetensors.index.json");
    // An architecture this tool does not map.
    let d = copy_dir(&hf);
    let cfg = d.path().join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    c["model_type"] = "qwen3".into();
    std::fs::write(&cfg, serde_json::to_vec(&c).unwrap()).unwrap();
    let (_o, out, o) = palettize(&idx(d.path()), &["--bits", "4"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("model_type: \"qwen3\" is not supported"),
        "{}",
        text(&o)
    );
    assert!(!out.exists());
    // LongRoPE factors of the wrong length name the key and both numbers.
    let d = copy_dir(&hf);
    let cfg = d.path().join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    c["rope_scaling"]["long_factor"] = serde_json::json!([1.0, 2.0]);
    std::fs::write(&cfg, serde_json::to_vec(&c).unwrap()).unwrap();
    let (_o, _out, o) = palettize(&idx(d.path()), &["--bits", "4"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("rope_scaling.long_factor: 2 factors, expected head_dim / 2 = 32"),
        "{}",
        text(&o)
    );
    // A shard the index names is missing.
    let d = copy_dir(&hf);
    std::fs::remove_file(d.path().join("model-00002-of-00002.safetensors")).unwrap();
    let (_o, _out, o) = palettize(&idx(d.path()), &["--bits", "4"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("model-00002-of-00002.safetensors"),
        "{}",
        text(&o)
    );
    // An index pointing outside its directory.
    let d = copy_dir(&hf);
    std::fs::write(
        idx(d.path()),
        r#"{"weight_map": {"model.norm.weight": "../x.safetensors"}}"#,
    )
    .unwrap();
    let (_o, _out, o) = palettize(&idx(d.path()), &["--bits", "4"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("is not a file beside the index"),
        "{}",
        text(&o)
    );
    // A truncated tokenizer.model names the file.
    let d = copy_dir(&hf);
    let tm = d.path().join("tokenizer.model");
    let b = std::fs::read(&tm).unwrap();
    std::fs::write(&tm, &b[..b.len() - 3]).unwrap();
    let (_o, _out, o) = palettize(&idx(d.path()), &["--bits", "4"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("tokenizer.model") && text(&o).contains("past the end"),
        "{}",
        text(&o)
    );
    // A tensor name outside the mapping.
    let d = copy_dir(&hf);
    let shard = d.path().join("model-00001-of-00002.safetensors");
    std::fs::remove_file(&shard).unwrap();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &[0u8; 8]).unwrap();
    safetensors::serialize_to_file([("model.layers.0.mystery.weight", view)], None, &shard)
        .unwrap();
    // (listed in the index as that shard's only tensor, so the name mapping is what refuses it)
    let ip = idx(d.path());
    let mut iv: Value = serde_json::from_slice(&std::fs::read(&ip).unwrap()).unwrap();
    let wm = iv["weight_map"].as_object_mut().unwrap();
    wm.retain(|_, f| f != "model-00001-of-00002.safetensors");
    wm.insert(
        "model.layers.0.mystery.weight".into(),
        "model-00001-of-00002.safetensors".into(),
    );
    std::fs::write(&ip, serde_json::to_vec(&iv).unwrap()).unwrap();
    let (_o, _out, o) = palettize(&idx(d.path()), &["--bits", "4"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("model.layers.0.mystery.weight") && text(&o).contains("this tool maps"),
        "{}",
        text(&o)
    );
}

#[test]
fn unsupported_safetensors_dtype_names_the_tensor() {
    let src = tiny_f16();
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("model.safetensors");
    let o = run(&["dequantize", s(&src), "-o", s(&st), "--with-config", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    std::fs::remove_file(&st).unwrap();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::I32, vec![2, 2], &[0u8; 16])
            .unwrap();
    safetensors::serialize_to_file([("blk.0.ffn_up.weight", view)], None, &st).unwrap();
    let (_d, out, o) = palettize(&st, &["--bits", "4"]);
    assert_eq!(o.status.code(), Some(2));
    let t = text(&o);
    assert!(
        t.contains("blk.0.ffn_up.weight") && t.contains("I32"),
        "{t}"
    );
    assert!(!out.exists());
}

#[test]
fn verify_catches_a_palette_error_the_manifest_misstates() {
    let src = tiny_f16();
    let (_d, out, o) = palettize(&src, &["--bits", "4"]);
    assert!(o.status.success(), "{}", text(&o));
    // The manifest is not among the hashed files: edit a recorded SSE; the integrity check
    // still passes, the comparison with the source must not.
    let mpath = out.join("manifest.json");
    let mut m: Value = serde_json::from_slice(&std::fs::read(&mpath).unwrap()).unwrap();
    let t = m["tensors"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|t| t["name"] == "blk.0.ffn_up.weight")
        .unwrap();
    let sse = t["encoding"]["sse"].as_f64().unwrap();
    t["encoding"]["sse"] = serde_json::json!(sse * 0.5);
    std::fs::write(&mpath, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    let o = run(&["verify", s(&out), "--source", s(&src)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("blk.0.ffn_up.weight") && t.contains("differs from the manifest"),
        "{t}"
    );
}

/// The errors recorded in the manifest read back bit for bit: `verify --source` passes a
/// genuine bundle at settings where a parse that is not correctly rounded (serde_json without
/// `float_roundtrip`) was 1 ULP off in some tensors' SSE.
#[test]
fn verify_source_passes_genuine_palettized_bundles() {
    let src = tiny_f16();
    for extra in [
        &["--bits", "4", "--group-size", "2"][..],
        &["--bits", "8", "--group-size", "2"],
        &["--bits", "4", "--mode", "uniform", "--group-size", "2"],
        &["--bits", "2", "--group-size", "1"],
    ] {
        let (_d, out, o) = palettize(&src, extra);
        assert!(o.status.success(), "{extra:?}: {}", text(&o));
        let o = run(&["verify", s(&out), "--source", s(&src)]);
        assert!(o.status.success(), "{extra:?}: {}", text(&o));
    }
}

#[test]
fn validate_refuses_a_prompt_longer_than_the_context() {
    let src = tiny_f16();
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("ref.bundle");
    let o = run(&["pack", s(&src), "-o", s(&reference), "-q", "--context", "8"]);
    assert!(o.status.success(), "{}", text(&o));
    let prompts = dir.path().join("prompts.json");
    std::fs::write(
        &prompts,
        r#"["one two three four five six seven eight nine ten"]"#,
    )
    .unwrap();
    let o = run(&[
        "validate",
        s(&reference),
        "--reference",
        s(&reference),
        "--prompts",
        s(&prompts),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("exceed the context 8"), "{}", text(&o));
}

/// `convert validate CAND --reference REF [--prompts P] --gen-tokens 8 --json REPORT`: the
/// process output and the JSON report.
fn validate(
    cand: &Path,
    reference: &Path,
    prompts: Option<&Path>,
    report: &Path,
) -> (Output, Value) {
    let mut args = vec!["validate", s(cand), "--reference", s(reference)];
    if let Some(p) = prompts {
        args.extend(["--prompts", s(p)]);
    }
    args.extend(["--gen-tokens", "8", "--json", s(report)]);
    let o = run(&args);
    let r = serde_json::from_slice(&std::fs::read(report).unwrap()).unwrap_or(Value::Null);
    (o, r)
}

#[test]
fn validate_passes_identical_and_fails_perturbed_candidates() {
    let src = tiny_f16();
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("ref.bundle");
    let o = run(&["pack", s(&src), "-o", s(&reference), "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let prompts = dir.path().join("prompts.json");
    std::fs::write(&prompts, r#"["hello world", "a b c d e f g", "x"]"#).unwrap();
    let report = dir.path().join("r.json");
    // The reference against itself passes with zero error.
    let (o, r) = validate(&reference, &reference, Some(&prompts), &report);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(r["passed"], true);
    assert_eq!(r["max_prob_err"], 0.0);
    assert_eq!(r["steps"], 24);
    assert_eq!(r["repeats_identical"], true);
    // 1-bit palettization is far off: the gate fails and says why, exit 1.
    let (_d, cand, o) = palettize(&src, &["--bits", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    let (o, r) = validate(&cand, &reference, Some(&prompts), &report);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(r["passed"], false);
    assert!(
        r["max_prob_err"].as_f64().unwrap() > 0.02 || r["argmax_agreement"].as_f64().unwrap() < 1.0
    );
    assert!(!r["failures"].as_array().unwrap().is_empty());
    assert!(r["kl_mean"].as_f64().unwrap() > 0.0);
    // A malformed prompt file is a usage error.
    std::fs::write(&prompts, "[]").unwrap();
    let o = run(&[
        "validate",
        s(&cand),
        "--reference",
        s(&reference),
        "--prompts",
        s(&prompts),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// SmolLM2 (real weights): 8-bit k-means G=32 against `convert pack` of the same file. The
/// gate's verdict is whatever the figures say (README: it fails |dp| <= 0.02 narrowly on
/// this model); the report must be consistent with the exit code, decisions must mostly
/// agree, repeats must be bit-identical, and the model must still answer Paris.
#[test]
fn smollm2_8bit_kmeans_validate_report_and_paris() {
    let Some(src) = common::model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("ref.bundle");
    let o = run(&[
        "pack",
        s(&src),
        "-o",
        s(&reference),
        "-q",
        "--context",
        "512",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let cand = dir.path().join("p8.bundle");
    let o = run(&[
        "palettize",
        s(&src),
        "-o",
        s(&cand),
        "-q",
        "--bits",
        "8",
        "--group-size",
        "32",
        "--context",
        "512",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let report = dir.path().join("r.json");
    let (o, r) = validate(&cand, &reference, None, &report);
    let passed = r["passed"].as_bool().unwrap();
    assert_eq!(
        o.status.code(),
        Some(if passed { 0 } else { 1 }),
        "{}",
        text(&o)
    );
    assert!(r["argmax_agreement"].as_f64().unwrap() >= 0.9, "{r:#}");
    assert!(r["max_prob_err"].as_f64().unwrap() < 0.2, "{r:#}");
    assert_eq!(r["repeats_identical"], true);
    assert_eq!(r["all_finite"], true);
    assert_eq!(r["steps"], 80);
    let o = run(&[
        "run",
        s(&cand),
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "8",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("Paris"),
        "{}",
        text(&o)
    );
}

/// Edits `config.json` of a copy of the tiny sharded checkpoint and palettizes it.
fn hf_with_config(hf: &Path, edit: impl FnOnce(&mut Value)) -> Output {
    let d = copy_dir(hf);
    let cfg = d.path().join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    edit(&mut c);
    std::fs::write(&cfg, serde_json::to_vec(&c).unwrap()).unwrap();
    let (_o, out, o) = palettize_plain(
        &d.path().join("model.safetensors.index.json"),
        &["--bits", "4"],
    );
    assert!(!out.exists());
    o
}

/// Regressions from an adversarial pass over Hugging Face inputs: each used to panic, hang,
/// allocate without bound or write a bundle that could not run.
#[test]
fn hugging_face_config_is_checked_against_the_tensors() {
    let Some(hf) = common::hf_checkpoint("minicpm-tiny-sharded") else {
        return;
    };
    type Edit = Box<dyn FnOnce(&mut Value)>;
    let cases: Vec<(Edit, &str)> = vec![
        // a huge vocabulary used to be allocated (and padded) before anything was checked
        (
            Box::new(|c| c["vocab_size"] = 1_000_000.into()),
            "vocab_size 1000000 and hidden_size 256 do not match model.embed_tokens.weight [474, 256]",
        ),
        (
            Box::new(|c| c["vocab_size"] = 1_000_000_000_000u64.into()),
            "vocab_size: 1000000000000 is not between 1 and",
        ),
        // a huge layer count used to pass palettize and abort `run` allocating layers
        (
            Box::new(|c| c["num_hidden_layers"] = 4_000_000_000u64.into()),
            "\"blk.2.attn_norm.weight\": missing",
        ),
        (
            Box::new(|c| c["num_hidden_layers"] = 1.into()),
            "a layer past config.json's num_hidden_layers 1",
        ),
        // the wrong head count used to permute q/k with the wrong head dim
        (
            Box::new(|c| c["num_attention_heads"] = 8.into()),
            "shape [256, 256], but config.json implies [512, 256]",
        ),
        // non-finite values used to become null in the manifest
        (
            Box::new(|c| c["rms_norm_eps"] = 1e300.into()),
            "rms_norm_eps: 1e300 is not a positive finite f32 value",
        ),
        (
            Box::new(|c| c["dim_model_base"] = 0.into()),
            "dim_model_base: 0.0 is not a positive finite f32 value",
        ),
        (
            Box::new(|c| c["max_position_embeddings"] = 0.into()),
            "max_position_embeddings: is 0",
        ),
        (
            Box::new(|c| c["rope_scaling"] = "longrope".into()),
            "rope_scaling: expected an object or null",
        ),
        // transformers would tie the head and ignore lm_head.weight; this used to use it
        (
            Box::new(|c| c["tie_word_embeddings"] = true.into()),
            "tie_word_embeddings: true, but the checkpoint has an lm_head.weight",
        ),
    ];
    for (edit, needle) in cases {
        let o = hf_with_config(&hf, edit);
        assert_eq!(o.status.code(), Some(2), "{needle}: {}", text(&o));
        assert!(text(&o).contains(needle), "{needle}: {}", text(&o));
    }
    // A special token id outside the vocabulary (config.json's, with no tokenizer_config.json
    // naming the token) used to give a bundle whose tokenizer could not be built.
    let d = copy_dir(&hf);
    std::fs::remove_file(d.path().join("tokenizer_config.json")).unwrap();
    let cfg = d.path().join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    c["bos_token_id"] = 99999.into();
    std::fs::write(&cfg, serde_json::to_vec(&c).unwrap()).unwrap();
    let (_o, out, o) = palettize_plain(
        &d.path().join("model.safetensors.index.json"),
        &["--bits", "4"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("bos_token_id: 99999 is not below the vocabulary size 474"),
        "{}",
        text(&o)
    );
    assert!(!out.exists());
}

#[test]
fn hugging_face_index_and_shards_must_agree() {
    let Some(hf) = common::hf_checkpoint("minicpm-tiny-sharded") else {
        return;
    };
    let edit_index = |f: &dyn Fn(&mut Value)| {
        let d = copy_dir(&hf);
        let idx = d.path().join("model.safetensors.index.json");
        let mut v: Value = serde_json::from_slice(&std::fs::read(&idx).unwrap()).unwrap();
        f(&mut v);
        std::fs::write(&idx, serde_json::to_vec(&v).unwrap()).unwrap();
        let (_o, out, o) = palettize_plain(&idx, &["--bits", "4"]);
        assert!(!out.exists());
        o
    };
    // An empty weight_map used to panic (index out of bounds).
    let o = edit_index(&|v| v["weight_map"] = serde_json::json!({}));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("names no tensor"), "{}", text(&o));
    // A tensor listed under the wrong shard, or every tensor under one shard.
    let o = edit_index(&|v| {
        for (_, f) in v["weight_map"].as_object_mut().unwrap() {
            *f = "model-00001-of-00002.safetensors".into();
        }
    });
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("but in no shard"), "{}", text(&o));
    let o = edit_index(&|v| {
        v["weight_map"]["model.layers.9.mlp.up_proj.weight"] =
            "model-00001-of-00002.safetensors".into();
    });
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("model.layers.9.mlp.up_proj.weight"),
        "{}",
        text(&o)
    );
    // --workers beyond the cap (100000 used to spawn that many threads).
    let (_o, _out, o) = palettize_plain(
        &hf.join("model.safetensors.index.json"),
        &["--bits", "4", "--workers", "100000"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--workers 100000 must be between 1 and 1024"),
        "{}",
        text(&o)
    );
}

/// SIGTERM or SIGINT during a palettize or a dequantize: the `.NAME.*.partial` directory being
/// written is removed with everything in it, nothing appears at the output path, and the exit
/// status is 130.
#[test]
fn a_signal_removes_the_partial_output() {
    let Some(src) = common::model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    // dequantize stages safetensors' own temporary file inside its partial directory.
    for (signal, cmd) in [
        (libc::SIGTERM, "palettize"),
        (libc::SIGINT, "palettize"),
        (libc::SIGTERM, "dequantize"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let mut c = Command::new(env!("CARGO_BIN_EXE_convert"));
        c.args([cmd, s(&src), "-o", s(&out), "-q"]);
        if cmd == "palettize" {
            c.args(["--bits", "8"]);
        }
        let mut child = c.spawn().unwrap();
        let partial = |d: &Path| {
            std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".partial"))
                .count()
        };
        // Wait until the staging directory exists and holds the file being written.
        let t0 = std::time::Instant::now();
        loop {
            let staged = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .any(|p| p.is_dir() && std::fs::read_dir(&p).unwrap().next().is_some());
            if staged {
                break;
            }
            assert!(
                child.try_wait().unwrap().is_none(),
                "{cmd} ended before it was signalled"
            );
            assert!(
                t0.elapsed().as_secs() < 120,
                "no staging directory appeared"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(partial(dir.path()), 1);
        unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        let status = child.wait().unwrap();
        assert_eq!(
            status.code(),
            Some(130),
            "{cmd} signal {signal}: {status:?}"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "{cmd} signal {signal}: left {left:?}");
    }
}

/// Outputs that would damage the input or fail only after the work: an output inside the
/// input bundle is refused (palettize, dequantize) and the input still verifies; a report
/// path that is a directory or in a missing directory is refused before any step is run; an
/// existing report is replaced whole.
#[test]
fn outputs_inside_the_input_and_bad_report_paths_are_refused_early() {
    let src = tiny_f16();
    let (d, b, o) = palettize(&src, &["--bits", "4"]);
    assert!(o.status.success(), "{}", text(&o));
    let inside = b.join("sub.bundle");
    for args in [
        vec!["palettize", s(&b), "-o", s(&inside), "--bits", "4", "-q"],
        vec!["dequantize", s(&b), "-o", s(&inside), "-q"],
    ] {
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains("inside the input bundle"), "{}", text(&o));
        assert!(!inside.exists());
    }
    // Reports over a file of the input bundle, or over the prompt set being read.
    let prompts = d.path().join("prompts.json");
    std::fs::write(&prompts, br#"["Hello"]"#).unwrap();
    for (flag, target) in [
        ("--json", b.join("manifest.json")),
        ("--json", b.join("r.json")),
        ("--json", prompts.clone()),
        ("--dump-logits", b.join("weights.bin")),
    ] {
        let o = if flag == "--json" {
            run(&[
                "validate",
                s(&b),
                "--reference",
                s(&b),
                "--prompts",
                s(&prompts),
                "--gen-tokens",
                "1",
                flag,
                s(&target),
            ])
        } else {
            run(&[
                "run",
                s(&b),
                "--prompt-ids",
                "1",
                "--max-tokens",
                "1",
                flag,
                s(&target),
            ])
        };
        assert_eq!(o.status.code(), Some(2), "{flag} {target:?}: {}", text(&o));
        assert!(
            text(&o).contains("inside the input bundle") || text(&o).contains("is an input"),
            "{}",
            text(&o)
        );
    }
    assert_eq!(std::fs::read(&prompts).unwrap(), br#"["Hello"]"#);
    let o = run(&["verify", s(&b)]);
    assert!(o.status.success(), "{}", text(&o));
    let missing = d.path().join("no/such/dir/r.json");
    for p in [d.path(), missing.as_path()] {
        let t0 = std::time::Instant::now();
        let o = run(&[
            "validate",
            s(&b),
            "--reference",
            s(&b),
            "--gen-tokens",
            "200",
            "--json",
            s(p),
        ]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains("--json"), "{}", text(&o));
        assert!(t0.elapsed().as_secs() < 20, "refused only after the run");
        let o = run(&[
            "run",
            s(&b),
            "--prompt-ids",
            "1,2",
            "--max-tokens",
            "1",
            "--dump-logits",
            s(p),
        ]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains("--dump-logits"), "{}", text(&o));
    }
    let report = d.path().join("r.json");
    std::fs::write(&report, b"old").unwrap();
    let o = run(&[
        "validate",
        s(&b),
        "--reference",
        s(&b),
        "--gen-tokens",
        "1",
        "--json",
        s(&report),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["passed"], true);
}

/// A palette table entry that is NaN, in a bundle whose hashes were all recomputed (a buggy
/// producer): the runtime refuses to load it, naming the tensor and the group.
#[test]
fn a_non_finite_palette_entry_is_refused_at_load() {
    use lowbit::bundle::manifest::Manifest;
    let src = tiny_f16();
    let (_d, b, o) = palettize(&src, &["--bits", "4"]);
    assert!(o.status.success(), "{}", text(&o));
    let mpath = b.join("manifest.json");
    let mut m: Manifest = serde_json::from_slice(&std::fs::read(&mpath).unwrap()).unwrap();
    let mut w = std::fs::read(b.join("weights.bin")).unwrap();
    let t = m
        .tensors
        .iter_mut()
        .find(|t| t.name == "blk.1.ffn_up.weight")
        .unwrap();
    let Encoding::Palette { tables_offset, .. } = t.encoding else {
        panic!("not palettized")
    };
    let at = (t.offset + tables_offset) as usize + 2 * 3;
    w[at..at + 2].copy_from_slice(&f16::NAN.to_le_bytes());
    common::write_rehashed(&b, &mut m, "weights.bin", &w);
    let o = run(&["verify", s(&b)]);
    assert!(
        o.status.success(),
        "the hashes are consistent: {}",
        text(&o)
    );
    let o = run(&["run", s(&b), "--prompt-ids", "1,2", "--max-tokens", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("blk.1.ffn_up.weight") && t.contains("group 0, entry 3, is not finite"),
        "{t}"
    );
}

/// Rewrites safetensors file `path` so that its header lists `name` twice: the copy right
/// after the original, pointing at the bytes of `offsets_of` (`name` itself: the same bytes).
fn duplicate_in_header(path: &Path, name: &str, offsets_of: &str) {
    let b = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let h: serde_json::Map<String, Value> = serde_json::from_slice(&b[8..8 + n]).unwrap();
    let mut parts = Vec::new();
    for (k, v) in &h {
        parts.push(format!("{}:{v}", Value::from(k.as_str())));
        if k == name {
            let mut d = v.clone();
            d["data_offsets"] = h[offsets_of]["data_offsets"].clone();
            parts.push(format!("{}:{d}", Value::from(k.as_str())));
        }
    }
    let mut text = format!("{{{}}}", parts.join(","));
    while text.len() % 8 != 0 {
        text.push(' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&b[8 + n..]);
    std::fs::write(path, out).unwrap();
}

/// Issue 16 item 7 (the safetensors crate lets the last of two same-named header entries
/// win): a header listing `output_norm.weight` twice, at the same bytes and at another
/// tensor's bytes, is refused by `palettize` naming the tensor and the file, with nothing
/// written; the same for a shard of the sharded Hugging Face checkpoint (with the cache).
#[test]
fn issue16_7_duplicate_tensor_names_in_safetensors_are_refused() {
    let src = tiny_f16();
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("model.safetensors");
    let o = run(&["dequantize", s(&src), "-o", s(&st), "--with-config", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let clean = std::fs::read(&st).unwrap();
    for other in ["output_norm.weight", "blk.0.attn_norm.weight"] {
        std::fs::write(&st, &clean).unwrap();
        duplicate_in_header(&st, "output_norm.weight", other);
        let (d, out, o) = palettize(&st, &["--bits", "4"]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{t}");
        for n in [
            s(&st),
            "tensor \"output_norm.weight\"",
            "listed twice in the safetensors header",
        ] {
            assert!(t.contains(n), "{t:?} should name {n:?}");
        }
        assert!(!out.exists());
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "{t}");
    }
    let Some(hf) = common::hf_checkpoint("minicpm-tiny-sharded") else {
        return;
    };
    let copy = copy_dir(&hf);
    let idx: Value = serde_json::from_slice(
        &std::fs::read(copy.path().join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    let shard = idx["weight_map"]["model.norm.weight"].as_str().unwrap();
    let shard = copy.path().join(shard);
    duplicate_in_header(&shard, "model.norm.weight", "model.norm.weight");
    let (d, out, o) = palettize_plain(
        &copy.path().join("model.safetensors.index.json"),
        &["--bits", "4"],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    for n in [
        s(&shard),
        "tensor \"model.norm.weight\"",
        "listed twice in the safetensors header",
    ] {
        assert!(t.contains(n), "{t:?} should name {n:?}");
    }
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "{t}");
}
