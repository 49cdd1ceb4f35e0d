//! `convert gguf-to-ternary`: recovery on TQ2_0 files made by gguf-py (tiny synthetic MiniCPM)
//! and from real weights, the packed layout against the source bytes, the TQ2_0 quantizer
//! against gguf-py's bytes, and bad blocks.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use lowbit::bundle::manifest::Encoding;
use lowbit::bundle::reader::Bundle;
use lowbit::ggml::GgmlType;
use lowbit::gguf::GgufFile;
use lowbit::ternary;
use serde_json::Value;

fn tiny() -> PathBuf {
    common::repo().join("testdata/ternary/minicpm-tiny-tq2_0.gguf")
}

fn run(args: &[&str], paths: &[&Path]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_convert"));
    c.args(args);
    for p in paths {
        c.arg(p);
    }
    c.output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn to_ternary(src: &Path, extra: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.bundle");
    let mut args = vec!["gguf-to-ternary", "-q"];
    args.extend_from_slice(extra);
    args.push("-o");
    let o = run(&args, &[&out, src]);
    assert!(o.status.success(), "{}", text(&o));
    (dir, out)
}

/// The row of tensor `name` in a `verify --json` report.
fn report_tensor(r: &Value, name: &str) -> Value {
    r["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in the report"))
        .clone()
}

/// The bundle's ternary tensor rewritten in TQ2_0 byte layout, to compare with a source or
/// with gguf-py's quantizer output.
fn as_tq2_0_bytes(b: &Bundle, name: &str) -> Vec<u8> {
    let t = b.tensor(name).unwrap();
    let (words, scales) = b.ternary_parts(t).unwrap();
    let mut out = Vec::new();
    for (blk_words, &d_bits) in words.chunks_exact(16).zip(scales.iter()) {
        let mut codes = [0u8; 256];
        for (i, c) in codes.iter_mut().enumerate() {
            *c = ((blk_words[i / 16] >> (2 * (i % 16))) & 3) as u8;
        }
        out.extend_from_slice(&ternary::tq2_0_bytes(&ternary::TernaryBlock {
            d_bits,
            codes,
        }));
    }
    out
}

#[test]
fn tiny_minicpm_recovers_and_verifies_bit_exactly() {
    let (_d, b) = to_ternary(&tiny(), &[]);
    let o = run(
        &["verify", "--json", "--maxerr", "0", "--source"],
        &[&tiny(), &b],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["passed"], true);
    assert_eq!(r["totals"]["ternary"], 14);
    assert_eq!(r["totals"]["carried"], 9);
    assert_eq!(r["totals"]["mismatched"], 0);
    assert_eq!(r["totals"]["elements_compared"], 1179648);

    let m = json(&b.join("manifest.json"));
    assert_eq!(m["model"]["architecture"], "minicpm");
    assert_eq!(m["model"]["embedding_scale"], 10.0);
    assert_eq!(
        m["model"]["residual_scale"].as_f64().unwrap() as f32,
        0.35f32
    );
    assert_eq!(m["model"]["logit_scale"], 0.25);
    assert_eq!(m["model"]["tied_embeddings"], false);
    assert_eq!(m["model"]["n_head_kv"], 2);
    assert_eq!(m["model"]["rope"]["scaling_type"], "longrope");
    assert_eq!(
        m["model"]["rope"]["factors_long"],
        "rope_factors_long.weight"
    );
    assert_eq!(
        m["model"]["rope"]["factors_short"],
        "rope_factors_short.weight"
    );
    let tensors = m["tensors"].as_array().unwrap();
    let by = |n: &str| tensors.iter().find(|t| t["name"] == n).unwrap().clone();
    assert_eq!(by("blk.0.attn_q.weight")["encoding"]["kind"], "ternary2");
    assert_eq!(by("blk.0.attn_q.weight")["encoding"]["origin"], "recovered");
    assert_eq!(by("blk.0.attn_q.weight")["encoding"]["fast_path"], false); // K = 256
    assert_eq!(by("blk.0.ffn_down.weight")["encoding"]["fast_path"], true); // K = 512, N = 256
    assert_eq!(by("token_embd.weight")["encoding"]["ggml_type"], "F16");
    assert_eq!(by("output.weight")["encoding"]["ggml_type"], "Q8_0");
    assert_eq!(
        by("rope_factors_long.weight")["encoding"]["ggml_type"],
        "F32"
    );

    let schema: Value = json(&common::repo().join("schemas/bundle-manifest.v3.schema.json"));
    let v = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = v.iter_errors(&m).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:#?}");
}

/// Reconstructed as the kernel defines it, every tensor equals gguf-py's dequantization of the
/// source (golden SHA256s written by tests/ref/gen_golden_real.py).
#[test]
fn tiny_bundle_dequantizes_to_gguf_py_values() {
    let (_d, b) = to_ternary(&tiny(), &[]);
    let golden = json(&common::repo().join("testdata/ternary/minicpm-tiny-tq2_0.json"));
    let bundle = Bundle::open(&b).unwrap();
    for t in &bundle.manifest.tensors {
        let values = bundle.tensor_f32(t).unwrap();
        assert_eq!(
            common::sha256_f32(&values),
            golden["tensors"][&t.name]["f32_sha256"].as_str().unwrap(),
            "{}",
            t.name
        );
    }
}

/// The packed codes and scales are the source blocks' own codes and d, so rewriting them in
/// TQ2_0 layout gives the source bytes back, byte for byte (d = 0 blocks included).
#[test]
fn packed_layout_round_trips_to_the_source_bytes() {
    let (_d, b) = to_ternary(&tiny(), &[]);
    let bundle = Bundle::open(&b).unwrap();
    let src = GgufFile::open(tiny()).unwrap();
    let mut n = 0;
    for t in src.tensors.iter().filter(|t| t.ty == GgmlType::TQ2_0) {
        assert_eq!(
            as_tq2_0_bytes(&bundle, &t.name),
            src.tensor_data(t),
            "{}",
            t.name
        );
        n += 1;
    }
    assert_eq!(n, 14);
}

/// gguf-py's TQ2_0 quantizer, block by block (testdata/ternary/tq2_0_quant.*): same bytes, and
/// an error where gguf-py would write a non-finite scale.
#[test]
fn tq2_0_quantizer_matches_gguf_py() {
    let dir = common::repo().join("testdata/ternary");
    let index = json(&dir.join("tq2_0_quant.json"));
    let x: Vec<f32> = std::fs::read(dir.join("tq2_0_quant.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let want = std::fs::read(dir.join("tq2_0_quant.bin")).unwrap();
    let mut compared = 0;
    for case in index["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let first = case["first_block"].as_u64().unwrap() as usize;
        let n = case["n_blocks"].as_u64().unwrap() as usize;
        if case["platform_cast"] == true && !cfg!(target_arch = "x86_64") {
            continue;
        }
        for b in first..first + n {
            let input = &x[b * 256..(b + 1) * 256];
            let got = ternary::quantize_tq2_0_block(input);
            // Where gguf-py writes a non-finite scale (max|x| past f16, or a non-finite
            // input), the quantizer refuses instead.
            let d =
                half::f16::from_bits(u16::from_le_bytes([want[b * 66 + 64], want[b * 66 + 65]]));
            if !d.is_finite() || input.iter().any(|v| !v.is_finite()) {
                assert!(got.is_err(), "{name} block {b} should be refused");
                continue;
            }
            let got = got.unwrap_or_else(|e| panic!("{name} block {b}: {e}"));
            assert_eq!(
                &ternary::tq2_0_bytes(&got)[..],
                &want[b * 66..(b + 1) * 66],
                "{name} block {b}"
            );
            compared += 1;
        }
    }
    assert!(compared >= 60, "{compared}");
}

/// TQ1_0 blocks from gguf-py's quantizer recover to the same values through the packed layout.
#[test]
fn tq1_0_blocks_recover_exactly() {
    let dir = common::repo().join("testdata/ternary");
    let bin = std::fs::read(dir.join("tq1_0_quant.bin")).unwrap();
    let mut ok = 0;
    for (i, blk) in bin.chunks_exact(54).enumerate() {
        let mut w = [0f32; 256];
        lowbit::quant::dequantize(GgmlType::TQ1_0, blk, &mut w).unwrap();
        let (d_bits, codes) = ternary::decode_block(GgmlType::TQ1_0, blk).unwrap();
        match ternary::recover_block(d_bits, &codes, &w) {
            Ok(r) => {
                let mut words = [0u32; 16];
                ternary::pack_block(&r.codes, &mut words);
                let mut got = [0f32; 256];
                ternary::row_values(&words, &[r.d_bits], &mut got);
                for (a, b) in got.iter().zip(&w) {
                    assert_eq!(a.to_bits(), b.to_bits(), "block {i}");
                }
                ok += 1;
            }
            // Blocks with a non-finite scale (from gguf-py's overflow cases) are refused.
            Err(ternary::BlockFault::NonFiniteScale { .. }) => {}
            Err(e) => panic!("block {i}: {e}"),
        }
    }
    assert!(ok >= 50, "{ok}");
}

/// `--ternarize` on unquantized (F16) linears gives gguf-py's TQ2_0 bytes.
#[test]
fn ternarize_matches_gguf_py_quantizer() {
    let src = common::repo().join("testdata/ternary/minicpm-tiny-f16.gguf");
    let refs = json(&common::repo().join("testdata/ternary/minicpm-tiny-f16.gguf.tq2_ref.json"));
    let (_d, b) = to_ternary(&src, &["--ternarize"]);
    let bundle = Bundle::open(&b).unwrap();
    let refs = refs["tq2_0_sha256"].as_object().unwrap();
    assert_eq!(refs.len(), 14);
    for (name, sha) in refs {
        let t = bundle.tensor(name).unwrap();
        assert!(
            matches!(&t.encoding, Encoding::Ternary2 { origin, .. } if origin == "ternarized"),
            "{name}"
        );
        assert_eq!(
            lowbit::util::sha256_hex(&as_tq2_0_bytes(&bundle, name)),
            sha.as_str().unwrap(),
            "{name}"
        );
    }
    let o = run(
        &["verify", "--maxerr", "0", "--json", "--source"],
        &[&src, &b],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let t = report_tensor(&r, "blk.0.attn_q.weight");
    assert!(t["max_abs_diff_vs_unquantized"].as_f64().unwrap() > 0.0);
}

/// Real weights: SmolLM2's ffn_down (K = 1536) quantized by our TQ2_0 rule equals gguf-py's
/// quantization of the same dequantized values (tests/ref/make_tq2_from_real.py).
#[test]
fn quantizer_on_real_weights_matches_gguf_py() {
    let Some(model) = common::model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let refs = json(&common::repo().join("testdata/ternary/smollm2-tq2_0-gguf-py.json"));
    let f = GgufFile::open(&model).unwrap();
    let tensors = refs["tensors"].as_object().unwrap();
    assert_eq!(tensors.len(), 30);
    for (name, r) in tensors {
        let t = f.tensor(name).unwrap();
        let mut x = vec![0f32; t.n_elements() as usize];
        lowbit::quant::dequantize(t.ty, f.tensor_data(t), &mut x).unwrap();
        assert_eq!(
            common::sha256_f32(&x),
            r["f32_sha256"].as_str().unwrap(),
            "{name}"
        );
        let mut bytes = Vec::new();
        for blk in x.chunks_exact(256) {
            bytes.extend_from_slice(&ternary::tq2_0_bytes(
                &ternary::quantize_tq2_0_block(blk).unwrap(),
            ));
        }
        assert_eq!(
            lowbit::util::sha256_hex(&bytes),
            r["tq2_sha256"].as_str().unwrap(),
            "{name}"
        );
    }
}

/// TQ2_0 made from real weights (gguf-py's quantizer, `make ternary-real`) recovers bit-exactly.
#[test]
fn real_weight_tq2_0_file_verifies_with_maxerr_zero() {
    let Some(p) = common::cache_file("ternary/smollm2-tq2_0-gguf-py.gguf", "ternary-real") else {
        return;
    };
    let (_d, b) = to_ternary(&p, &[]);
    let o = run(&["verify", "--json", "--source"], &[&p, &b]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["totals"]["ternary"], 30);
    assert_eq!(r["totals"]["mismatched"], 0);
}

#[test]
fn no_ternary_tensor_is_an_error_pointing_at_the_alternatives() {
    let src = common::repo().join("testdata/ternary/minicpm-tiny-f16.gguf");
    let dir = tempfile::tempdir().unwrap();
    let o = run(&["gguf-to-ternary", "-o"], &[&dir.path().join("x"), &src]);
    assert_eq!(o.status.code(), Some(2));
    let t = text(&o);
    assert!(
        t.contains("no TQ2_0 or TQ1_0 tensor")
            && t.contains("--ternarize")
            && t.contains("palettize"),
        "{t}"
    );
    assert!(t.contains("minicpm-tiny-f16.gguf"), "{t}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn ternarize_refuses_k_not_multiple_of_256() {
    let Some(model) = common::model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let o = run(
        &["gguf-to-ternary", "--ternarize", "-o"],
        &[&dir.path().join("x"), &model],
    );
    assert_eq!(o.status.code(), Some(2));
    let t = text(&o);
    assert!(
        t.contains("blk.0.attn_k.weight") || t.contains("blk.0."),
        "{t}"
    );
    assert!(
        t.contains("K = ne[0] = 576 is not a multiple of the ternary block size 256"),
        "{t}"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Writes a copy of the tiny model with one block of `tensor` changed.
fn corrupt(tensor: &str, block: usize, f: impl FnOnce(&mut [u8])) -> (tempfile::TempDir, PathBuf) {
    let g = GgufFile::open(tiny()).unwrap();
    let t = g.tensor(tensor).unwrap();
    let mut bytes = std::fs::read(tiny()).unwrap();
    let at = t.abs_offset as usize + block * 66;
    f(&mut bytes[at..at + 66]);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.gguf");
    std::fs::write(&p, bytes).unwrap();
    (dir, p)
}

fn refused(src: &Path, needles: &[&str]) {
    let out = src.with_extension("bundle");
    let o = run(&["gguf-to-ternary", "-q", "-o"], &[&out, src]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    for n in needles {
        assert!(t.contains(n), "expected {n:?} in {t}");
    }
    assert!(!out.exists());
}

#[test]
fn code_three_is_refused_naming_tensor_and_block() {
    // blk.0.attn_q.weight: K = 256, so block 5 is row 5.
    let (_d, p) = corrupt("blk.0.attn_q.weight", 5, |b| b[3] = 0xC0 | (b[3] & 0x3F));
    refused(
        &p,
        &[
            "blk.0.attn_q.weight",
            "block 5 (row 5",
            "code 3",
            "element 99",
        ],
    );
}

#[test]
fn nan_and_inf_scales_are_refused() {
    for (bits, what) in [(0x7e00u16, "NaN"), (0x7c00, "Inf"), (0xfc00, "-Inf")] {
        let (_d, p) = corrupt("blk.1.ffn_up.weight", 3, |b| {
            b[64..66].copy_from_slice(&bits.to_le_bytes())
        });
        let _ = what;
        refused(
            &p,
            &["blk.1.ffn_up.weight", "block 3", "scale d is not finite"],
        );
    }
}

#[test]
fn d_zero_blocks_are_legal() {
    // The tiny model has d = 0 blocks (blk.0.attn_k.weight row 5); it converts and verifies in
    // the other tests. Here a d = 0 block with nonzero codes: still legal, all values zero.
    let (_d, p) = corrupt("blk.0.attn_v.weight", 2, |b| {
        b[64] = 0;
        b[65] = 0;
    });
    let (_d2, b) = to_ternary(&p, &[]);
    let o = run(&["verify", "--source"], &[&p, &b]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// `verify` compares recovered TQ2_0 tensors in the code domain and falls back to values
/// where the bytes differ: a source whose codes differ but whose values are the same bits
/// (codes 1 and 2 under d = +0) passes that tensor; codes 0 under d = +0 (values -0) do not.
#[test]
fn verify_compares_codes_and_falls_back_to_values() {
    let with = |qs: u8| {
        corrupt("blk.0.attn_v.weight", 2, move |b| {
            b[..64].fill(qs);
            b[64] = 0;
            b[65] = 0;
        })
    };
    let (_da, a) = with(0x55); // every code 1
    let (_db, b_src) = with(0xAA); // every code 2: the same +0 values
    let (_dc, c_src) = with(0x00); // every code 0: -0
    let (_d, bundle) = to_ternary(&a, &[]);
    let row = |src: &Path| {
        let o = run(
            &["verify", "--json", "--maxerr", "0", "--source"],
            &[src, &bundle],
        );
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        let t = report_tensor(&r, "blk.0.attn_v.weight");
        (o.status.code(), r, t)
    };
    let (code, r, t) = row(&a);
    assert_eq!(code, Some(0), "{r}");
    assert_eq!(t["compared"], "codes");
    let (code, r, t) = row(&b_src);
    // The file differs (its SHA256), the tensor's values do not.
    assert_eq!(code, Some(1), "{r}");
    assert_eq!(
        (t["passed"].clone(), t["mismatched"].clone()),
        (Value::Bool(true), 0.into()),
        "{t}"
    );
    let (code, _, t) = row(&c_src);
    assert_eq!(code, Some(1));
    assert_eq!(t["passed"], false, "{t}");
    assert_eq!(t["mismatched"], 256, "{t}");
}

/// A manifest that gives the weight file's last tensor a length far beyond the file (the
/// digests then fail too) is a failure naming the tensor, not an allocation of that length.
#[test]
fn verify_survives_a_huge_tensor_length() {
    let (_d, b) = to_ternary(&tiny(), &[]);
    let mpath = b.join("manifest.json");
    let mut m = json(&mpath);
    let last = m["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .max_by_key(|(_, t)| t["offset"].as_u64().unwrap())
        .map(|(i, _)| i)
        .unwrap();
    let name = m["tensors"][last]["name"].as_str().unwrap().to_string();
    for huge in [1u64 << 40, 1 << 63] {
        m["tensors"][last]["length"] = huge.into();
        std::fs::write(&mpath, serde_json::to_vec(&m).unwrap()).unwrap();
        let o = run(&["verify"], &[&b]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(text(&o).contains(&name), "{}", text(&o));
    }
}

/// A manifest field of the wrong type or range is refused with the field's path, so the
/// user sees which of hundreds of values is wrong.
#[test]
fn a_malformed_manifest_field_is_named_by_its_path() {
    let (_d, b) = to_ternary(&tiny(), &[]);
    let mpath = b.join("manifest.json");
    let m0 = json(&mpath);
    type Edit = fn(&mut Value);
    let cases: [(Edit, &str); 3] = [
        (
            |m| m["tensors"][3]["offset"] = "12".into(),
            "tensors[3].offset: invalid type: string \"12\", expected u64",
        ),
        (
            |m| m["model"]["n_layer"] = (-2).into(),
            "model.n_layer: invalid value: integer `-2`",
        ),
        (
            |m| m["model"]["rope"]["freq_base"] = "x".into(),
            "model.rope.freq_base: invalid type: string",
        ),
    ];
    for (edit, want) in cases {
        let mut m = m0.clone();
        edit(&mut m);
        std::fs::write(&mpath, serde_json::to_vec(&m).unwrap()).unwrap();
        let o = run(&["verify"], &[&b]);
        // Exit 2: the bundle cannot be read (1 is a verification that ran and failed).
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains(want), "{}", text(&o));
    }
}

/// Same input, same flags: byte-identical bundles whatever the thread count, and the bundle
/// digest recorded for the `ternary` artifact of `manifests/minicpm-tiny.toml` (its lock file
/// names what differs when it does not match; see `common::check_lock`).
#[test]
fn deterministic_and_matches_recipe_lock() {
    let (_d1, a) = to_ternary(&tiny(), &[]);
    let dir = tempfile::tempdir().unwrap();
    let b = dir.path().join("t.bundle");
    let o = run(
        &["--threads", "1", "gguf-to-ternary", "-q", "-o"],
        &[&b, &tiny()],
    );
    assert!(o.status.success());
    for f in ["manifest.json", "weights.bin", "tokenizer.json"] {
        assert!(
            std::fs::read(a.join(f)).unwrap() == std::fs::read(b.join(f)).unwrap(),
            "{f}"
        );
    }
    common::check_lock("minicpm-tiny", "ternary", &a);
}
