//! Shared test helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `$LOWBIT_CACHE` or `~/.cache/lowbit`, where `make fetch` puts the real models.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LOWBIT_CACHE") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    Path::new(&home).join(".cache/lowbit")
}

/// A real model from the cache. When it is missing the test is skipped with a message, unless
/// `LOWBIT_REQUIRE_MODELS=1` (set by `make test` and CI), where a missing model fails.
pub fn model(name: &str) -> Option<PathBuf> {
    let p = cache_dir().join("models").join(name);
    if p.exists() {
        return Some(p);
    }
    if std::env::var("LOWBIT_REQUIRE_MODELS").as_deref() == Ok("1") {
        panic!(
            "{} is missing and LOWBIT_REQUIRE_MODELS=1: run `make fetch`",
            p.display()
        );
    }
    eprintln!("skipping: {} not found (run `make fetch`)", p.display());
    None
}

/// A Hugging Face checkpoint directory written by `make hf-checkpoints` into the cache
/// (`tests/ref/make_hf_checkpoint.py`); skipped or required as [`model`].
pub fn hf_checkpoint(name: &str) -> Option<PathBuf> {
    let p = cache_dir().join("hf").join(name);
    if p.join("config.json").exists() {
        return Some(p);
    }
    if std::env::var("LOWBIT_REQUIRE_MODELS").as_deref() == Ok("1") {
        panic!(
            "{} is missing and LOWBIT_REQUIRE_MODELS=1: run `make hf-checkpoints`",
            p.display()
        );
    }
    eprintln!(
        "skipping: {} not found (run `make hf-checkpoints`)",
        p.display()
    );
    None
}

/// Bitwise equality, except that any NaN equals any NaN.
pub fn same_bits(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

pub fn sha256_f32(v: &[f32]) -> String {
    let mut bytes = Vec::with_capacity(v.len() * 4);
    for x in v {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    lowbit::util::sha256_hex(&bytes)
}
