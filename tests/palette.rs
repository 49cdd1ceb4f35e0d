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
            let got = kmeans::optimal(&xs, &ws, 1 << bits).unwrap().sse;
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

/// `--mode uniform-coremltools` is coremltools 9.0's UNIFORM bit for bit (tables and
/// indices), f16 arithmetic included.
#[test]
fn uniform_matches_coremltools() {
    let v = vectors();
    for c in v["cases"].as_array().unwrap() {
        let (vals, arith) = case_values(c);
        for (bits, u) in c["uniform"].as_object().unwrap() {
            let bits: u32 = bits.parse().unwrap();
            let g = palette::palettize_group(&vals, bits, Mode::UniformCoremltools, arith).unwrap();
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
    // The same files (the bundle digests differ: they cover the manifest, whose source and
    // tensors' source types differ).
    assert_eq!(a.manifest.files, b.manifest.files);
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

/// Qwen2.5-Coder-0.5B as a Hugging Face `Qwen2ForCausalLM` checkpoint (f32, written by
/// tests/ref/make_hf_checkpoint.py from the GGUF and checked there with `tokenizers` against
/// llama-tokenize and an HF-style forward pass against llama.cpp's f32 path): palettizing two
/// of its layers gives every palettized tensor and every F32 tensor (norms, Q/K/V biases) of
/// palettizing the GGUF bit for bit (no q/k row permutation for this architecture), the same
/// model configuration's shapes and scales, the same tokenizer, and the bundle answers.
#[test]
fn qwen2_hugging_face_checkpoint_gives_the_gguf_tensors() {
    let (Some(src), Some(hf)) = (
        common::model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
        common::hf_checkpoint("qwen2.5-coder-0.5b-f32"),
    ) else {
        return;
    };
    let args = [
        "--bits",
        "8",
        "--group-size",
        "32",
        "--context",
        "512",
        "--include",
        "blk.0.*",
        "--include",
        "blk.23.*",
    ];
    let (_a, from_gguf, r1) = palettize_plain(&src, &args);
    let (_b, from_hf, r2) = palettize_plain(&hf.join("model.safetensors"), &args);
    assert!(
        r1.status.success() && r2.status.success(),
        "{}{}",
        text(&r1),
        text(&r2)
    );
    let (a, b) = (
        Bundle::open(&from_gguf).unwrap(),
        Bundle::open(&from_hf).unwrap(),
    );
    let mut compared = 0;
    for t in &a.manifest.tensors {
        let u = b
            .manifest
            .tensors
            .iter()
            .find(|u| u.name == t.name)
            .unwrap_or_else(|| panic!("{} missing from the Hugging Face bundle", t.name));
        assert_eq!(t.shape, u.shape, "{}", t.name);
        let exact = matches!(
            t.encoding,
            lowbit::bundle::manifest::Encoding::Palette { .. }
        ) || t.source_type == "F32";
        if exact {
            assert_eq!(t.sha256, u.sha256, "{}", t.name);
            compared += 1;
        }
    }
    // 7 palettized matrices in each of two layers; 2 norms and 3 biases (F32) in each of 24
    // layers, and output_norm.
    assert_eq!(compared, 2 * 7 + 24 * 5 + 1);
    let (ma, mb) = (&a.manifest.model, &b.manifest.model);
    assert_eq!(
        (
            ma.architecture.as_str(),
            ma.n_layer,
            ma.n_embd,
            ma.n_ff,
            ma.n_head,
            ma.n_head_kv
        ),
        (
            mb.architecture.as_str(),
            mb.n_layer,
            mb.n_embd,
            mb.n_ff,
            mb.n_head,
            mb.n_head_kv
        )
    );
    assert_eq!(
        (ma.head_dim, ma.n_vocab, ma.n_ctx),
        (mb.head_dim, mb.n_vocab, mb.n_ctx)
    );
    assert_eq!(ma.rope, mb.rope);
    assert_eq!(ma.norm_eps, mb.norm_eps);
    assert_eq!(ma.special_tokens, mb.special_tokens);
    assert_eq!(a.manifest.tokenizer.pre.as_deref(), Some("qwen2"));
    assert_eq!(a.manifest.tokenizer, b.manifest.tokenizer);
    let o = run(&[
        "run",
        s(&from_hf),
        "--chat",
        "--prompt",
        "Write a Python function that reverses a string",
        "--max-tokens",
        "40",
    ]);
    assert!(
        o.status.success() && text(&o).contains("def "),
        "{}",
        text(&o)
    );
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
    assert_eq!(a.manifest.files, c.manifest.files);
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

/// A safetensors header entry the format refuses (a dtype it does not know, a shape whose
/// bytes are not its span, a span that overlaps the one before) is refused naming the
/// tensor and the field, where the safetensors crate's own errors name none.
#[test]
fn a_bad_safetensors_header_entry_names_the_tensor() {
    let src = tiny_f16();
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("model.safetensors");
    let o = run(&["dequantize", s(&src), "-o", s(&st), "--with-config", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let clean = std::fs::read(&st).unwrap();
    let edit = |f: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        let n = u64::from_le_bytes(clean[..8].try_into().unwrap()) as usize;
        let mut h: serde_json::Map<String, Value> =
            serde_json::from_slice(&clean[8..8 + n]).unwrap();
        f(&mut h);
        write_with_header(&st, serde_json::to_string(&h).unwrap(), &clean[8 + n..]);
    };
    let t = "blk.0.ffn_up.weight";
    type Edit<'a> = &'a dyn Fn(&mut serde_json::Map<String, Value>);
    let cases: [(Edit, &str); 3] = [
        (
            &|h| h[t]["dtype"] = "F12".into(),
            "dtype: unknown variant `F12`",
        ),
        (
            &|h| h[t]["shape"][0] = (h[t]["shape"][0].as_u64().unwrap() + 1).into(),
            "hold",
        ),
        (
            &|h| {
                let (a, b) = (
                    h[t]["data_offsets"][0].as_u64().unwrap(),
                    h[t]["data_offsets"][1].as_u64().unwrap(),
                );
                h[t]["data_offsets"] = serde_json::json!([a + 2, b + 2]);
            },
            "do not start where the tensor before ends",
        ),
    ];
    for (f, want) in cases {
        edit(f);
        let (_d, out, o) = palettize(&st, &["--bits", "4"]);
        let msg = text(&o);
        assert_eq!(o.status.code(), Some(2), "{msg}");
        assert!(
            msg.contains(&format!("tensor \"{t}\"")) && msg.contains(want) && msg.contains(s(&st)),
            "{msg}"
        );
        assert!(!out.exists());
    }
}

/// Options that select no tensor (every matrix under `--min-elements`, or `--exclude`
/// taking all that are left) are refused naming the options, with nothing written: a bundle
/// that palettizes nothing is not what `palettize` was asked for.
#[test]
fn palettizing_nothing_is_refused() {
    let src = tiny_f16();
    for args in [
        vec!["--bits", "4", "--min-elements", "100000000"],
        vec!["--bits", "4", "--exclude", "*.weight"],
    ] {
        let (d, out, o) = palettize(&src, &args);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{t}");
        assert!(t.contains("no tensor to palettize"), "{t}");
        assert!(t.contains("--min-elements"), "{t}");
        assert!(!out.exists());
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "{t}");
    }
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
        text(&o).contains(
            "invalid value '100000' for '--workers <WORKERS>': must be between 1 and 1024"
        ),
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
    write_with_header(path, format!("{{{}}}", parts.join(",")), &b[8 + n..]);
}

/// Writes a safetensors file at `path`: header `text` (padded with spaces to 8 bytes, as the
/// format's writers do) and the data bytes `data`.
fn write_with_header(path: &Path, mut text: String, data: &[u8]) {
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(data);
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

/// Deterministic N(0, sigma) values (Box-Muller on a 64-bit LCG), rounded to f16 when `f16`.
fn normal_values(n: usize, sigma: f64, seed: u64, f16: bool) -> Vec<f32> {
    let mut s = seed;
    let mut u = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let z = (-2.0 * u().ln()).sqrt() * (std::f64::consts::TAU * u()).cos();
            let v = (z * sigma) as f32;
            if f16 {
                half::f16::from_f32(v).to_f32()
            } else {
                v
            }
        })
        .collect()
}

/// Distance from each weight to its stored entry minus the distance to its nearest entry.
fn not_nearest(vals: &[f32], g: &palette::Group) -> usize {
    let t: Vec<f64> = g
        .table
        .iter()
        .map(|&h| f16::from_bits(h).to_f64())
        .collect();
    vals.iter()
        .zip(&g.indices)
        .filter(|(&v, &i)| {
            let d = (t[i as usize] - v as f64).abs();
            t.iter().any(|&e| (e - v as f64).abs() < d)
        })
        .count()
}

/// Issue 16 item 3 (coremltools' UNIFORM does not store the nearest entry): an f16
/// `[64, 512]` tensor of N(0, 0.05) at 8 bits: `uniform` puts every weight on its nearest entry
/// and has a lower SSE than coremltools' order, which `uniform-coremltools` keeps (1,000-odd
/// weights off their nearest entry here, as the report found); on every reference case every
/// weight is on its nearest entry, and at 8 bits the SSE is at most coremltools'.
#[test]
fn issue16_3_uniform_mode_does_not_store_the_nearest_entry() {
    let vals = normal_values(64 * 512, 0.05, 16, true);
    let g = palette::palettize_group(&vals, 8, Mode::Uniform, Arith::F16).unwrap();
    let c = palette::palettize_group(&vals, 8, Mode::UniformCoremltools, Arith::F16).unwrap();
    assert_eq!(not_nearest(&vals, &g), 0);
    let off = not_nearest(&vals, &c);
    assert!(
        off > 500,
        "coremltools' order left only {off} off their nearest entry"
    );
    assert!(g.sse <= c.sse, "uniform {} > coremltools {}", g.sse, c.sse);
    for case in vectors()["cases"].as_array().unwrap() {
        let (vals, arith) = case_values(case);
        for (bits, u) in case["uniform"].as_object().unwrap() {
            let bits: u32 = bits.parse().unwrap();
            let g = palette::palettize_group(&vals, bits, Mode::Uniform, arith).unwrap();
            assert_eq!(not_nearest(&vals, &g), 0, "{} {bits}", case["name"]);
            // coremltools' own result (its LUT as f16, its indices) against the input.
            let lut: Vec<f64> = u["lut"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| {
                    let b = x.as_u64().unwrap();
                    if arith == Arith::F16 {
                        f16::from_bits(b as u16).to_f64()
                    } else {
                        f16::from_f32(f32::from_bits(b as u32)).to_f64()
                    }
                })
                .collect();
            let ct: f64 = vals
                .iter()
                .zip(u["indices"].as_array().unwrap())
                .map(|(&v, i)| (lut[i.as_u64().unwrap() as usize] - v as f64).powi(2))
                .sum();
            // Its table is the exact grid rounded once, not the grid of coremltools' scale
            // rounded to f16, so below 8 bits the two tables differ and either may fit a
            // group's clumps better (clumps_f16 at 6 bits: 1% higher); at 8 bits the indices
            // decide, and nearest ones are never worse.
            if bits < 8 {
                continue;
            }
            assert!(
                g.sse <= ct,
                "{} {bits}-bit: uniform SSE {:e} > coremltools' {ct:e}",
                case["name"],
                g.sse
            );
        }
    }
}

/// Issue 16 item 4 (uniform in f16 arithmetic loses small and constant groups): a row of
/// values about 1e-6 (N(0, 1e-6), f32 and f16 sources) keeps its spread (relative error well
/// below 1, where coremltools' order puts every entry on the minimum, worse than zeros), and
/// `[[9, 9], [-9, -9]]` at 8 bits with one table is exact (coremltools' order: 9.0078), as is
/// any group of at most 2^B distinct values.
#[test]
fn issue16_4_uniform_f16_arithmetic_loses_small_and_constant_groups() {
    let rel = |vals: &[f32], g: &palette::Group| {
        let norm: f64 = vals.iter().map(|&v| (v as f64).powi(2)).sum();
        (g.sse / norm).sqrt()
    };
    for f16 in [false, true] {
        let vals = normal_values(512, 1e-6, 4, f16);
        let arith = if f16 { Arith::F16 } else { Arith::F32 };
        for bits in [4, 8] {
            let g = palette::palettize_group(&vals, bits, Mode::Uniform, arith).unwrap();
            let r = rel(&vals, &g);
            assert!(r < 0.2, "f16 {f16} {bits}-bit: relative error {r}");
            if f16 && bits == 8 {
                // Fewer than 256 distinct f16 values (subnormals): exact.
                assert_eq!(g.sse, 0.0);
                let c =
                    palette::palettize_group(&vals, bits, Mode::UniformCoremltools, arith).unwrap();
                let rc = rel(&vals, &c);
                assert!(rc > 1.0, "coremltools' order: relative error {rc}");
            }
        }
    }
    let v = [9f32, 9.0, -9.0, -9.0];
    let g = palette::palettize_group(&v, 8, Mode::Uniform, Arith::F16).unwrap();
    assert_eq!(g.sse, 0.0);
    assert_eq!(f16::from_bits(g.table[g.indices[0] as usize]).to_f32(), 9.0);
    let c = palette::palettize_group(&v, 8, Mode::UniformCoremltools, Arith::F16).unwrap();
    assert_eq!(
        f16::from_bits(c.table[c.indices[0] as usize]).to_f32(),
        9.0078125
    );
}

/// Issue 16 item 5 (a misleading overflow message): f16 `[[-60000, 60000, 0, 1]] x 2` at 4
/// bits makes a table with every entry finite (and with 20 spread values too); f32 weights
/// past f16's range are refused naming the entry (and, through `convert`, the group); only
/// coremltools' f16 order refuses the range, saying so.
#[test]
fn issue16_5_misleading_overflow_message() {
    let v: Vec<f32> = [-60000f32, 60000.0, 0.0, 1.0].repeat(2);
    let g = palette::palettize_group(&v, 4, Mode::Uniform, Arith::F16).unwrap();
    assert_eq!(g.sse, 0.0);
    let spread: Vec<f32> = (0..=20)
        .map(|i| half::f16::from_f32(-60000.0 + i as f32 * 6000.0).to_f32())
        .collect();
    let g = palette::palettize_group(&spread, 4, Mode::Uniform, Arith::F16).unwrap();
    assert!(g.table.iter().all(|&h| f16::from_bits(h).is_finite()));
    let e = palette::palettize_group(&spread, 4, Mode::UniformCoremltools, Arith::F16).unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("range max - min = 120000") && m.contains("--mode uniform"),
        "{m}"
    );
    let big: Vec<f32> = (0..40).map(|i| -1e5 + i as f32 * 5e3).collect();
    let e = palette::palettize_group(&big, 4, Mode::Uniform, Arith::F32).unwrap_err();
    assert_eq!(
        e,
        palette::GroupFault::TableOverflow {
            entry: 0,
            value: -1e5
        }
    );
    assert_eq!(
        e.to_string(),
        "table entry 0 = -100000 does not fit float16 (largest finite 65504)"
    );
}

/// Issue 16 item 6 (the padding rule is stated only in a source comment): the README and the
/// manifest schema state it, and a group of 3 distinct values at 3 bits follows it (the values
/// ascending, then the largest repeated; no index past the first copy), in both modes.
#[test]
fn issue16_6_padding_rule_for_groups_with_fewer_than_2b_values() {
    let readme = std::fs::read_to_string(common::repo().join("README.md")).unwrap();
    assert!(
        readme.contains("then the largest repeated until the table has 2^B entries"),
        "README.md does not state the padding rule"
    );
    let schema =
        std::fs::read_to_string(common::repo().join("schemas/bundle-manifest.v3.schema.json"))
            .unwrap();
    assert!(schema.contains("then the largest repeated until the table has 2^bits entries"));
    let v = [0.5f32, -0.25, 2.0, 0.5, 2.0];
    for mode in [Mode::Kmeans, Mode::Uniform] {
        let g = palette::palettize_group(&v, 3, mode, Arith::F32).unwrap();
        let t: Vec<f32> = g
            .table
            .iter()
            .map(|&h| f16::from_bits(h).to_f32())
            .collect();
        assert_eq!(t, [-0.25, 0.5, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0], "{mode:?}");
        assert_eq!(g.indices, [1, 0, 2, 1, 2], "{mode:?}");
    }
}

/// Issue 16 item 2 (palettize output depends on the CPU: `half`'s software f64 -> f16 drops
/// low significand bits before rounding): the conversion rounds every midpoint between
/// adjacent f16 values to even and its neighbours one f64 ulp away to the nearer side, agrees
/// with `half`'s f32 conversion on f32 inputs, and `palettize --bits 8 --group-size 2` of the
/// F16 tiny model gives the same `weights.bin` with the solver's vector paths and with the
/// portable path forced (`LOWBIT_ISA=portable`).
#[test]
fn issue16_2_palettize_output_depends_on_the_cpu() {
    for h in 0u16..0x7C00 {
        for sign in [0u16, 0x8000] {
            let lo = f16::from_bits(h).to_f64();
            let hi = if h == 0x7BFF {
                65536.0
            } else {
                f16::from_bits(h + 1).to_f64()
            };
            let mid = (lo + hi) / 2.0;
            let sg = if sign == 0 { 1.0 } else { -1.0 };
            let f = |x: f64| palette::f64_to_f16_bits(sg * x);
            let even = if h & 1 == 0 { h } else { h + 1 };
            assert_eq!(f(lo), sign | h, "{lo}");
            assert_eq!(f(mid), sign | even, "midpoint {mid}");
            assert_eq!(f(mid.next_up()), sign | (h + 1), "above {mid}");
            assert_eq!(f(mid.next_down()), sign | h, "below {mid}");
        }
    }
    assert_eq!(palette::f64_to_f16_bits(1e-300), 0);
    assert_eq!(palette::f64_to_f16_bits(-1e300), 0xFC00);
    assert_eq!(palette::f64_to_f16_bits(2f64.powi(-25)), 0);
    assert_eq!(palette::f64_to_f16_bits(2f64.powi(-25).next_up()), 1);
    let mut seed = 1u64;
    for _ in 0..1_000_000 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let x = f32::from_bits((seed >> 32) as u32);
        if x.is_finite() {
            assert_eq!(
                palette::f32_to_f16_bits(x),
                f16::from_f32(x).to_bits(),
                "{x}"
            );
        }
    }
    let src = tiny_f16();
    let mut outs = Vec::new();
    for isa in [None, Some("portable")] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("p.bundle");
        let mut c = Command::new(env!("CARGO_BIN_EXE_convert"));
        c.args(["palettize", s(&src), "-o", s(&out), "-q", "--bits", "8"]);
        c.args(["--group-size", "2", "--exclude", "output.weight"]);
        c.args(["--exclude", "token_embd.weight"]);
        if let Some(i) = isa {
            c.env("LOWBIT_ISA", i);
        } else {
            c.env_remove("LOWBIT_ISA");
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        outs.push(std::fs::read(out.join("weights.bin")).unwrap());
    }
    assert!(
        outs[0] == outs[1],
        "weights.bin differs with LOWBIT_ISA=portable"
    );
}

/// `model.safetensors` (with `config.json` and `tokenizer.json`) of the tiny model in `dir`,
/// plus an F32 `blk.0.big.weight` of `rows x cols` N(0, 1) values (nearly all distinct).
fn tiny_with_big_tensor(dir: &Path, rows: usize, cols: usize) -> PathBuf {
    use safetensors::tensor::{Dtype, TensorView};
    let st = dir.join("model.safetensors");
    let o = run(&[
        "dequantize",
        s(&tiny_f16()),
        "-o",
        s(&st),
        "--with-config",
        "-q",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let bytes = std::fs::read(&st).unwrap();
    let t = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let big: Vec<u8> = normal_values(rows * cols, 1.0, 7, false)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut views: Vec<(String, TensorView)> = t
        .tensors()
        .into_iter()
        .map(|(n, v)| (n.to_string(), v))
        .collect();
    views.push((
        "blk.0.big.weight".into(),
        TensorView::new(Dtype::F32, vec![rows, cols], &big).unwrap(),
    ));
    let out = safetensors::serialize(views, None).unwrap();
    std::fs::write(&st, out).unwrap();
    st
}

/// `convert palettize` under an address-space limit of `limit_mb` MiB (`ulimit -v`).
fn palettize_limited(input: &Path, out: &Path, limit_mb: u64, args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {}; exec \"$0\" \"$@\"", limit_mb * 1024))
        .arg(env!("CARGO_BIN_EXE_convert"))
        .args(["palettize", s(input), "-o", s(out), "-q", "--workers", "1"])
        .args(args)
        .env("MALLOC_ARENA_MAX", "1")
        .output()
        .unwrap()
}

/// Issue 16 item 1 (coremltools #2551: k-means memory grows as clusters x distinct values).
/// The linear-memory solver, forced all the way down, reaches kmeans1d's optimum on every
/// reference case; one 4-bit table over an F32 `[1024, 2048]` tensor of about 2 M distinct
/// values, whose back-pointers alone would take 128 MiB (and 2 GiB at 8 bits), completes in a
/// 640 MiB address space; in 160 MiB the failed allocation is an error naming the tensor and
/// group, exit 2, with no staging directory left beside the output.
#[test]
fn issue16_1_kmeans_memory_grows_as_clusters_x_distinct_values() {
    for c in vectors()["cases"].as_array().unwrap() {
        let (vals, _) = case_values(c);
        let (xs, ws) = palette::distinct_counts(&vals);
        for (bits, k) in c["kmeans"].as_object().unwrap() {
            let bits: u32 = bits.parse().unwrap();
            let want = k["optimal_sse"].as_f64().unwrap();
            let got = kmeans::optimal_with_limit(&xs, &ws, 1 << bits, 0)
                .unwrap()
                .sse;
            assert!(
                (got - want).abs() <= 1e-9 * want.max(1e-30) + 1e-24,
                "{} {bits}-bit: linear-memory SSE {got:e}, kmeans1d {want:e}",
                c["name"]
            );
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let st = tiny_with_big_tensor(dir.path(), 1024, 2048);
    let args = ["--bits", "4", "--include", "blk.0.big.weight"];
    let outdir = tempfile::tempdir().unwrap();
    let out = outdir.path().join("big.bundle");
    let o = palettize_limited(&st, &out, 640, &args);
    assert!(o.status.success(), "{}", text(&o));
    let b = Bundle::open(&out).unwrap();
    let Encoding::Palette { sse, .. } = b.tensor("blk.0.big.weight").unwrap().encoding else {
        panic!("not palettized")
    };
    // 16 levels on N(0, 1): the optimal quantizer's MSE is about 0.0095 (Lloyd-Max).
    let mse = sse / (1024.0 * 2048.0);
    assert!(mse > 0.008 && mse < 0.011, "MSE {mse}");
    std::fs::remove_dir_all(&out).unwrap();
    let o = palettize_limited(&st, &out, 160, &args);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    for n in [
        "tensor \"blk.0.big.weight\"",
        "group 0 (rows 0..1024)",
        "out of memory: cannot allocate",
    ] {
        assert!(t.contains(n), "{t:?} should name {n:?}");
    }
    assert_eq!(std::fs::read_dir(outdir.path()).unwrap().count(), 0, "{t}");
}
