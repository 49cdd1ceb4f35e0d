//! Batched prefill in buckets: a prompt run as chunks gives the same bits as the same tokens
//! run as single decode steps, on every encoding real models carry (ternary, palette 8/6/4,
//! F16, F32, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K), with both kernels, on the portable, AVX2 and
//! AVX-512 paths (forced per process with `LOWBIT_ISA`); and the bucket list's rules at pack,
//! verify and load.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use lowbit::runtime::{self, Backend, Kernel, LoadOptions};

fn convert(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_convert"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn make(src: &Path, sub: &str, extra: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.bundle");
    let mut args = vec![
        sub,
        "-q",
        "-o",
        out.to_str().unwrap(),
        src.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = convert(&args, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    (dir, out)
}

fn tiny(name: &str) -> PathBuf {
    common::repo().join("testdata/ternary").join(name)
}

/// A prompt of `n` ids spread over the vocabulary.
fn prompt(n: usize, n_vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 7) % n_vocab as u32)
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The logits after the prompt and after each of `steps` greedy decode steps.
fn trajectory(be: &mut dyn Backend, ids: &[u32], steps: usize) -> Vec<Vec<u32>> {
    be.reset();
    runtime::run_prompt(be, ids, 0).unwrap();
    let mut out = vec![bits(be.logits().unwrap())];
    for pos in ids.len()..ids.len() + steps {
        let t = be.argmax(&[]).unwrap().unwrap();
        be.decode(t, pos).unwrap();
        out.push(bits(be.logits().unwrap()));
    }
    out
}

/// In one process: chunks (the bundle's buckets) against single steps (bucket `[1]`), for
/// both kernels; the decode steps after the prompt read the KV cache the chunks wrote.
fn same_as_single_steps(bundle: &Path, n_prompt: usize) {
    for kernel in [Kernel::F32, Kernel::Int8] {
        let load = |buckets: Option<Vec<usize>>| {
            runtime::load_cpu_with(
                bundle,
                &LoadOptions {
                    kernel,
                    buckets,
                    ..Default::default()
                },
            )
            .unwrap()
        };
        let mut chunked = load(None);
        let mut single = load(Some(vec![1]));
        let info = chunked.info();
        assert_eq!(info.buckets_from, "bundle", "{info:?}");
        let ids = prompt(n_prompt, chunked.n_vocab());
        // More than one chunk, the last one short of its bucket.
        let plan = runtime::plan_chunks(&info.buckets, ids.len());
        assert!(
            plan.len() >= 2 && plan.last().unwrap().0 < plan.last().unwrap().1,
            "{plan:?}"
        );
        let a = trajectory(&mut chunked, &ids, 3);
        let b = trajectory(&mut single, &ids, 3);
        assert!(
            a == b,
            "{} {kernel:?}: prefill differs from single steps",
            bundle.display()
        );
    }
}

/// Across processes: every ISA path and both prompt modes give the same logits after the
/// prompt (`--dump-logits`) and the same greedy continuation.
fn same_on_every_path(bundle: &Path, ids: &[u32]) {
    let idstr: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    let idstr = idstr.join(",");
    let dir = tempfile::tempdir().unwrap();
    let paths: [&[(&str, &str)]; 3] = [
        &[],
        &[("LOWBIT_ISA", "avx2")],
        &[("LOWBIT_ISA", "portable")],
    ];
    for kernel in ["f32", "int8"] {
        let mut first: Option<(Vec<u8>, String)> = None;
        for (pi, env) in paths.iter().enumerate() {
            for prefill in ["single", "buckets"] {
                let dump = dir.path().join(format!("{kernel}-{pi}-{prefill}.bin"));
                let o = convert(
                    &[
                        "run",
                        bundle.to_str().unwrap(),
                        "--prompt-ids",
                        &idstr,
                        "--max-tokens",
                        "4",
                        "--kernel",
                        kernel,
                        "--prefill",
                        prefill,
                        "--print-ids",
                        "--dump-logits",
                        dump.to_str().unwrap(),
                    ],
                    env,
                );
                let err = String::from_utf8_lossy(&o.stderr).into_owned();
                assert!(o.status.success(), "{env:?} {kernel} {prefill}: {err}");
                let gen = err
                    .lines()
                    .find(|l| l.starts_with("generated ids"))
                    .unwrap()
                    .to_string();
                let got = (std::fs::read(&dump).unwrap(), gen);
                match &first {
                    None => first = Some(got),
                    Some(f) => assert!(
                        *f == got,
                        "{}: {kernel} on {env:?} with --prefill {prefill} differs from the first path",
                        bundle.display()
                    ),
                }
            }
        }
    }
}

#[test]
fn prefill_equals_single_steps_on_ternary() {
    let (_d, b) = make(
        &tiny("minicpm-tiny-tq2_0.gguf"),
        "gguf-to-ternary",
        &["--prefill-buckets", "4,16"],
    );
    same_as_single_steps(&b, 21);
    same_on_every_path(&b, &prompt(21, 474));
}

#[test]
fn prefill_equals_single_steps_on_f16_and_palettes() {
    let src = tiny("minicpm-tiny-f16.gguf");
    let (_d, b) = make(&src, "pack", &["--prefill-buckets", "4,16"]);
    same_as_single_steps(&b, 21);
    // Groups of 2 rows, and a table per row (the two rows of a row pair of the AVX-512
    // multi-token palette kernel on different tables).
    for (bits, group) in [("8", "2"), ("6", "2"), ("4", "2"), ("6", "1")] {
        let (_p, b) = make(
            &src,
            "palettize",
            &[
                "--bits",
                bits,
                "--group-size",
                group,
                "--min-elements",
                "0",
                "--prefill-buckets",
                "4,16",
            ],
        );
        same_as_single_steps(&b, 21);
        same_on_every_path(&b, &prompt(21, 474));
    }
}

#[test]
fn prefill_equals_single_steps_on_real_models() {
    for (name, n) in [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", 21),
        ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 21),
        ("gemma-3-270m-q4_k_m.gguf", 21),
    ] {
        let Some(src) = common::model(name) else {
            continue;
        };
        let (_d, b) = make(
            &src,
            "pack",
            &["--context", "512", "--prefill-buckets", "8,16"],
        );
        same_as_single_steps(&b, n);
        let n_vocab = lowbit::bundle::reader::read_manifest(&b)
            .unwrap()
            .model
            .n_vocab as usize;
        same_on_every_path(&b, &prompt(n, n_vocab));
    }
}

#[test]
fn chunks_are_the_fewest_with_the_last_padded() {
    assert_eq!(runtime::plan_chunks(&[16, 64, 256], 1), vec![(1, 16)]);
    assert_eq!(runtime::plan_chunks(&[16, 64, 256], 16), vec![(16, 16)]);
    assert_eq!(runtime::plan_chunks(&[16, 64, 256], 17), vec![(17, 64)]);
    assert_eq!(runtime::plan_chunks(&[16, 64, 256], 70), vec![(70, 256)]);
    assert_eq!(
        runtime::plan_chunks(&[16, 64, 256], 600),
        vec![(256, 256), (256, 256), (88, 256)]
    );
    assert_eq!(runtime::plan_chunks(&[1], 3), vec![(1, 1), (1, 1), (1, 1)]);
}

#[test]
fn bad_bucket_lists_are_refused_before_anything_is_written() {
    let src = tiny("minicpm-tiny-tq2_0.gguf");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.bundle");
    for (list, needle) in [
        ("0,16", "a bucket of 0 tokens"),
        ("64,16", "not strictly ascending (64 then 16)"),
        ("16,16", "not strictly ascending"),
        ("16,100000", "larger than the context"),
    ] {
        let o = convert(
            &[
                "gguf-to-ternary",
                "-q",
                "-o",
                out.to_str().unwrap(),
                src.to_str().unwrap(),
                "--prefill-buckets",
                list,
            ],
            &[],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{list}: {err}");
        assert!(
            err.contains("--prefill-buckets") && err.contains(needle),
            "{list}: {err}"
        );
        assert!(!out.exists(), "{list}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "{list}");
    }
}

#[test]
fn a_prefill_function_that_disagrees_with_the_model_is_refused() {
    let (_d, b) = make(&tiny("minicpm-tiny-tq2_0.gguf"), "gguf-to-ternary", &[]);
    let m = lowbit::bundle::reader::read_manifest(&b).unwrap();
    assert_eq!(
        lowbit::bundle::manifest::prefill_buckets(&m.functions),
        lowbit::bundle::manifest::default_prefill_buckets(m.model.n_ctx)
    );
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let edits: [(&str, Edit); 3] = [
        (
            "functions.prefill_16",
            Box::new(|v| v["functions"]["prefill_16"]["inputs"][0]["shape"][1] = 15.into()),
        ),
        (
            "\"prefill_x\" is neither",
            Box::new(|v| {
                let f = v["functions"]["prefill_16"].clone();
                v["functions"]["prefill_x"] = f;
            }),
        ),
        (
            "larger than the context",
            Box::new(|v| {
                let mut f = v["functions"]["prefill_16"].clone();
                f["inputs"][0]["shape"][1] = 99999.into();
                f["inputs"][1]["shape"][1] = 99999.into();
                v["functions"]["prefill_99999"] = f;
            }),
        ),
    ];
    for (needle, edit) in edits {
        let (_t, c) = common::edited_copy(&b, edit);
        let o = convert(&["verify", c.to_str().unwrap()], &[]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(1), "{needle}: {out}");
        assert!(out.contains(needle), "{needle}: {out}");
        let o = convert(
            &[
                "run",
                c.to_str().unwrap(),
                "--prompt-ids",
                "1,2",
                "--max-tokens",
                "1",
            ],
            &[],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{needle}: {err}");
        assert!(err.contains(needle), "{needle}: {err}");
    }
}

#[test]
fn spans_are_checked_before_any_work() {
    let (_d, b) = make(
        &tiny("minicpm-tiny-tq2_0.gguf"),
        "gguf-to-ternary",
        &["--prefill-buckets", "4,16"],
    );
    let mut be = runtime::load_cpu(&b).unwrap();
    let e = be.prefill(&[1; 17], 0).unwrap_err();
    assert!(e.to_string().contains("largest prefill bucket 16"), "{e}");
    let e = be.prefill(&[], 0).unwrap_err();
    assert!(matches!(e, runtime::RuntimeError::EmptyPrompt), "{e}");
    let e = be.prefill(&[1, 2], 3).unwrap_err();
    assert!(
        matches!(e, runtime::RuntimeError::NonContiguous { .. }),
        "{e}"
    );
    let e = be.prefill(&[1, 474], 0).unwrap_err();
    assert!(
        matches!(e, runtime::RuntimeError::TokenOutOfRange { .. }),
        "{e}"
    );
    assert_eq!(be.position(), 0);
    assert!(be.logits().is_err(), "no logits before anything ran");
    be.prefill(&[1, 2, 3], 0).unwrap();
    assert_eq!(be.position(), 3);
}

/// `prefill_logits`: every row of a chunk equals the logits of the same token run as a single
/// decode step, bit for bit, both kernels; `rewind` then running again gives the same rows.
fn rows_equal_single_steps(bundle: &Path, n: usize, from: usize) {
    for kernel in [Kernel::F32, Kernel::Int8] {
        let opts = LoadOptions {
            kernel,
            ..Default::default()
        };
        let mut chunked = runtime::load_cpu_with(bundle, &opts).unwrap();
        let mut single = runtime::load_cpu_with(bundle, &opts).unwrap();
        let nv = chunked.n_vocab();
        let ids = prompt(n, nv);
        let mut rows = Vec::new();
        lowbit::eval::run_scored(&mut chunked, &ids, 0, from, &mut rows).unwrap();
        assert_eq!(rows.len(), (n - from) * nv);
        for (i, &t) in ids.iter().enumerate() {
            single.decode(t, i).unwrap();
            if i >= from {
                let r = &rows[(i - from) * nv..(i - from + 1) * nv];
                assert_eq!(
                    bits(r),
                    bits(single.logits().unwrap()),
                    "{kernel:?}: row {i} of the chunk differs from the single step"
                );
            }
        }
        // Rewind to the middle and run the tail again: the same rows.
        let mid = from + (n - from) / 2;
        chunked.rewind(mid).unwrap();
        assert!(chunked.logits().is_err(), "no logits after a rewind");
        let mut again = Vec::new();
        lowbit::eval::run_scored(&mut chunked, &ids[mid..], mid, 0, &mut again).unwrap();
        assert_eq!(bits(&again), bits(&rows[(mid - from) * nv..]), "{kernel:?}");
        assert!(chunked.rewind(n + 1).is_err(), "a rewind past the sequence");
    }
}

#[test]
fn prefill_logits_rows_equal_single_steps() {
    let (_d, b) = make(
        &tiny("minicpm-tiny-tq2_0.gguf"),
        "gguf-to-ternary",
        &["--prefill-buckets", "4,16"],
    );
    rows_equal_single_steps(&b, 37, 5);
    rows_equal_single_steps(&b, 20, 0);
    if let Some(src) = common::model("SmolLM2-135M-Instruct.Q4_1.gguf") {
        let (_d, b) = make(&src, "pack", &[]);
        rows_equal_single_steps(&b, 40, 17);
    }
}
