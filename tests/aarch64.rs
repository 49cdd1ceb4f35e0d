//! The aarch64 build gives this build's bits: the same logits after a prompt (`--dump-logits`)
//! and the same greedy continuation, on the ternary, F16-and-palette and real GGUF models,
//! with the int8 kernel on NEON with `sdot` and without it, and with the f32 kernel.
//!
//! The aarch64 `convert` runs under an emulator: `LOWBIT_AARCH64_CONVERT` names the binary
//! and `LOWBIT_AARCH64_RUNNER` the emulator command (e.g. `qemu-aarch64 -L
//! /usr/aarch64-linux-gnu`; a CPU is picked with `-cpu`). `make test-aarch64` builds it and
//! sets both. Without them the test says so and passes, unless `LOWBIT_REQUIRE_AARCH64=1`
//! (also set by `make test-aarch64`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// How to run the aarch64 binary: the emulator's words, then the binary.
fn aarch64_command() -> Option<Vec<String>> {
    let bin = std::env::var("LOWBIT_AARCH64_CONVERT").ok();
    let runner = std::env::var("LOWBIT_AARCH64_RUNNER").ok();
    match (bin, runner) {
        (Some(bin), Some(runner)) => {
            let mut v: Vec<String> = runner.split_whitespace().map(String::from).collect();
            v.push(bin);
            Some(v)
        }
        _ => {
            assert!(
                std::env::var("LOWBIT_REQUIRE_AARCH64").as_deref() != Ok("1"),
                "LOWBIT_REQUIRE_AARCH64=1 but LOWBIT_AARCH64_CONVERT or LOWBIT_AARCH64_RUNNER is unset"
            );
            eprintln!(
                "skipping: LOWBIT_AARCH64_CONVERT / LOWBIT_AARCH64_RUNNER unset (run `make test-aarch64`)"
            );
            None
        }
    }
}

/// `cmd` (a program and its first arguments) with `args` and `env`; its dumped logits and the
/// "generated ids" line of its stderr.
fn run_dump(
    cmd: &[String],
    env: &[(&str, &str)],
    bundle: &Path,
    ids: &str,
    kernel: &str,
    dump: &Path,
) -> (Vec<u8>, String) {
    let mut c = Command::new(&cmd[0]);
    c.args(&cmd[1..]);
    c.args([
        "run",
        bundle.to_str().unwrap(),
        "--prompt-ids",
        ids,
        "--max-tokens",
        "6",
        "--kernel",
        kernel,
        "--print-ids",
        "--dump-logits",
        dump.to_str().unwrap(),
    ]);
    // The caller's LOWBIT_ISA would cap both builds alike: each run gets only `env`'s.
    c.env_remove("LOWBIT_ISA");
    for (k, v) in env {
        c.env(k, v);
    }
    let _ = std::fs::remove_file(dump);
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{cmd:?} {env:?} {kernel}: {err}");
    let gen = err
        .lines()
        .find(|l| l.starts_with("generated ids"))
        .unwrap_or_else(|| panic!("{cmd:?}: no generated ids in {err}"))
        .to_string();
    (std::fs::read(dump).unwrap(), gen)
}

fn make(src: &Path, sub: &str, extra: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.bundle");
    let o = Command::new(env!("CARGO_BIN_EXE_convert"))
        .args([
            sub,
            "-q",
            "-o",
            out.to_str().unwrap(),
            src.to_str().unwrap(),
        ])
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    (dir, out)
}

/// Both builds on `bundle`: the host's (its detected path) against the aarch64 one with its
/// detected path and with `LOWBIT_ISA=neon` (`smull`/`sadalp` in place of `sdot`).
fn same_as_host(arm: &[String], bundle: &Path, kernels: &[&str]) {
    let n_vocab = lowbit::bundle::reader::read_manifest(bundle)
        .unwrap()
        .model
        .n_vocab as u32;
    let ids: Vec<String> = (0..21u32)
        .map(|i| ((i.wrapping_mul(2654435761) >> 7) % n_vocab).to_string())
        .collect();
    let ids = ids.join(",");
    let dir = tempfile::tempdir().unwrap();
    let host = vec![env!("CARGO_BIN_EXE_convert").to_string()];
    for &kernel in kernels {
        let want = run_dump(&host, &[], bundle, &ids, kernel, &dir.path().join("h.bin"));
        for env in [&[][..], &[("LOWBIT_ISA", "neon")][..]] {
            let got = run_dump(arm, env, bundle, &ids, kernel, &dir.path().join("a.bin"));
            assert!(
                got.0 == want.0,
                "{}: {kernel} logits of the aarch64 build ({env:?}) differ from this build's",
                bundle.display()
            );
            assert_eq!(got.1, want.1, "{}: {kernel} {env:?}", bundle.display());
        }
    }
}

#[test]
fn aarch64_build_gives_this_builds_bits() {
    let Some(arm) = aarch64_command() else {
        return;
    };
    let tiny = |n: &str| common::repo().join("testdata/ternary").join(n);
    let (_t, b) = make(&tiny("minicpm-tiny-tq2_0.gguf"), "gguf-to-ternary", &[]);
    same_as_host(&arm, &b, &["int8", "f32"]);
    let (_f, b) = make(&tiny("minicpm-tiny-f16.gguf"), "pack", &[]);
    same_as_host(&arm, &b, &["int8", "f32"]);
    let (_p, b) = make(
        &tiny("minicpm-tiny-f16.gguf"),
        "palettize",
        &["--bits", "4", "--min-elements", "0"],
    );
    same_as_host(&arm, &b, &["int8"]);
    let (_p6, b) = make(
        &tiny("minicpm-tiny-f16.gguf"),
        "palettize",
        &["--bits", "6", "--min-elements", "0"],
    );
    same_as_host(&arm, &b, &["int8"]);
    // Q4_1 and Q8_0 (SmolLM2); Q4_K, Q5_0, Q6_K and Q8_0 (Qwen2.5, Gemma 3); gguf-py's Q4_0,
    // Q8_0 and TQ2_0 of SmolLM2 (made by `make test`).
    let models = [
        ("models/SmolLM2-135M-Instruct.Q4_1.gguf", "fetch", "pack"),
        (
            "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            "fetch",
            "pack",
        ),
        ("models/gemma-3-270m-q4_k_m.gguf", "fetch", "pack"),
        ("requant/smollm2-q4_0-gguf-py.gguf", "requant-real", "pack"),
        ("requant/smollm2-q8_0-gguf-py.gguf", "requant-real", "pack"),
        (
            "ternary/smollm2-tq2_0-gguf-py.gguf",
            "ternary-real",
            "gguf-to-ternary",
        ),
    ];
    for (rel, target, sub) in models {
        let Some(src) = common::cache_file(rel, target) else {
            continue;
        };
        let (_d, b) = make(&src, sub, &["--context", "256"]);
        same_as_host(&arm, &b, &["int8"]);
    }
}
