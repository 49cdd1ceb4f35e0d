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

/// A file `make TARGET` puts at `rel` in the cache. When it is missing the test is skipped
/// with a message, unless `LOWBIT_REQUIRE_MODELS=1` (set by `make test` and CI), where a
/// missing file fails.
pub fn cache_file(rel: &str, target: &str) -> Option<PathBuf> {
    let p = cache_dir().join(rel);
    if p.exists() {
        return Some(p);
    }
    if std::env::var("LOWBIT_REQUIRE_MODELS").as_deref() == Ok("1") {
        panic!(
            "{} is missing and LOWBIT_REQUIRE_MODELS=1: run `make {target}`",
            p.display()
        );
    }
    eprintln!("skipping: {} not found (run `make {target}`)", p.display());
    None
}

/// A file of the BIG-bench sdist that `make eval-data` unpacks into `eval/bigbench` (e.g.
/// `benchmark_tasks/navigate/task.json`). Where the package index no longer has that sdist,
/// the Makefile leaves `eval/bigbench-unavailable.txt` (what pip answered) in its place: the
/// test is then skipped with that text, also under `LOWBIT_REQUIRE_MODELS=1` (no work of this
/// repository can fetch it); otherwise skipped or required as [`cache_file`].
pub fn bigbench_file(rel: &str) -> Option<PathBuf> {
    let p = cache_dir().join("eval/bigbench").join(rel);
    if p.exists() {
        return Some(p);
    }
    if let Ok(why) = std::fs::read_to_string(cache_dir().join("eval/bigbench-unavailable.txt")) {
        eprintln!("skipping: {} not found: {}", p.display(), why.trim());
        return None;
    }
    cache_file(&format!("eval/bigbench/{rel}"), "eval-data")
}

/// A real model from the cache (`make fetch`); skipped or required as [`cache_file`].
pub fn model(name: &str) -> Option<PathBuf> {
    cache_file(&format!("models/{name}"), "fetch")
}

/// A file of llama.cpp's source tree, which `make llama` (tests/ref/build_llama.sh) unpacks into
/// the cache, e.g. `models/ggml-vocab-qwen2.gguf` (vocabulary-only GGUF files llama.cpp ships
/// for its tokenizer tests). Skipped with a message when absent, also under
/// `LOWBIT_REQUIRE_MODELS=1`: `make test` does not build llama.cpp.
pub fn llama_src_file(rel: &str) -> Option<PathBuf> {
    let p = cache_dir().join("llama.cpp-11434/src").join(rel);
    if p.exists() {
        return Some(p);
    }
    eprintln!("skipping: {} not found (run `make llama`)", p.display());
    None
}

/// A Hugging Face checkpoint directory written by `make hf-checkpoints` into the cache
/// (`tests/ref/make_hf_checkpoint.py`); skipped or required as [`cache_file`].
pub fn hf_checkpoint(name: &str) -> Option<PathBuf> {
    cache_file(&format!("hf/{name}/config.json"), "hf-checkpoints")
        .map(|c| c.parent().expect("config.json has a folder").to_path_buf())
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

/// Copies the directory tree `from` (a bundle: its files and `kernels/`) to `to`, which must
/// not exist.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// A copy of bundle `b` (every file, `kernels/` included) in a new temporary directory, with
/// `edit` applied to its manifest's JSON and the digests recomputed over the result
/// ([`reseal_json`]), as a producer that wrote such a manifest would: for the checks behind
/// the digests (configuration, functions, kernel entries). Returns the directory and the
/// copy's path. [`tampered_copy`] leaves the digests as they were.
pub fn edited_copy(
    b: &Path,
    edit: impl FnOnce(&mut serde_json::Value),
) -> (tempfile::TempDir, PathBuf) {
    edit_copy(b, |m| {
        edit(m);
        reseal_json(m);
    })
}

/// A copy of bundle `b` with `edit` applied to its manifest's JSON and nothing recomputed:
/// what an edit after the bundle was written leaves.
pub fn tampered_copy(
    b: &Path,
    edit: impl FnOnce(&mut serde_json::Value),
) -> (tempfile::TempDir, PathBuf) {
    edit_copy(b, edit)
}

fn edit_copy(b: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t.bundle");
    copy_tree(b, &t);
    let mpath = t.join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&mpath).unwrap()).unwrap();
    edit(&mut m);
    std::fs::write(&mpath, serde_json::to_vec(&m).unwrap()).unwrap();
    (dir, t)
}

/// Recomputes a version-2 or -3 manifest's digests over its JSON as it is (any JSON, typed or
/// not); leaves other versions alone.
pub fn reseal_json(m: &mut serde_json::Value) {
    use lowbit::bundle::manifest::{
        content_digest, BUNDLE_DIGEST_EXCLUDES, MANIFEST_DIGEST_EXCLUDES,
    };
    if m["format_version"] != 2 && m["format_version"] != 3 {
        return;
    }
    m["bundle_digest"] = content_digest(m, &BUNDLE_DIGEST_EXCLUDES).into();
    m["manifest_digest"] = content_digest(m, &MANIFEST_DIGEST_EXCLUDES).into();
}

/// Recomputes `m`'s digests as a writer of its format version does: versions 2 and 3 both
/// digests over the manifest's content ([`Manifest::seal_as`]; version 3 a weight file's
/// `tensors_sha256` from its tensors first), version 1 the file list's.
///
/// [`Manifest::seal_as`]: lowbit::bundle::manifest::Manifest::seal_as
pub fn reseal(m: &mut lowbit::bundle::manifest::Manifest) {
    if m.format_version == 1 {
        m.bundle_digest = lowbit::util::sha256_hex(
            lowbit::bundle::manifest::canonical_file_list(&m.files).as_bytes(),
        );
    } else {
        for i in 0..m.files.len() {
            if m.files[i].tensors_sha256.is_some() {
                let (path, size) = (m.files[i].path.clone(), m.files[i].size);
                m.files[i] = m.weight_file_entry(&path, size);
            }
        }
        m.seal_as(m.format_version);
    }
}

/// Makes `m` (bundle `b`'s manifest, written as version 3) a manifest of format `version` (1
/// or 2) as those writers wrote it: every file listed by the SHA256 of its bytes, no
/// `manifest_digest` in version 1; the digests recomputed ([`reseal`]). The caller writes it.
pub fn as_version(b: &Path, m: &mut lowbit::bundle::manifest::Manifest, version: u32) {
    for f in m.files.iter_mut().filter(|f| f.tensors_sha256.is_some()) {
        f.tensors_sha256 = None;
        f.sha256 = Some(lowbit::util::sha256_hex(
            &std::fs::read(b.join(&f.path)).unwrap(),
        ));
    }
    m.format_version = version;
    if version == 1 {
        m.manifest_digest = None;
    }
    reseal(m);
}

/// [`as_version`] for a manifest as JSON (the members the typed manifest does not know are
/// kept).
pub fn as_version_json(b: &Path, m: &mut serde_json::Value, version: u32) {
    for f in m["files"].as_array_mut().unwrap() {
        let o = f.as_object_mut().unwrap();
        if o.remove("tensors_sha256").is_some() {
            let path = o["path"].as_str().unwrap().to_string();
            o.insert(
                "sha256".into(),
                lowbit::util::sha256_hex(&std::fs::read(b.join(path)).unwrap()).into(),
            );
        }
    }
    m["format_version"] = version.into();
    if version == 1 {
        m.as_object_mut().unwrap().remove("manifest_digest");
        let files: Vec<lowbit::bundle::manifest::FileEntry> =
            serde_json::from_value(m["files"].clone()).unwrap();
        m["bundle_digest"] = lowbit::util::sha256_hex(
            lowbit::bundle::manifest::canonical_file_list(&files).as_bytes(),
        )
        .into();
    } else {
        reseal_json(m);
    }
}

/// Replaces bundle `b`'s file `file` with `bytes` as a producer would write it: the SHA256s of
/// the file and of every tensor in it, the file's size and the bundle digest recomputed in
/// `m`, which is then written as the bundle's manifest.
pub fn write_rehashed(
    b: &Path,
    m: &mut lowbit::bundle::manifest::Manifest,
    file: &str,
    bytes: &[u8],
) {
    use lowbit::util::sha256_hex;
    std::fs::write(b.join(file), bytes).unwrap();
    for t in m.tensors.iter_mut().filter(|t| t.file == file) {
        t.sha256 = sha256_hex(&bytes[t.offset as usize..(t.offset + t.length) as usize]);
    }
    for f in m.files.iter_mut().filter(|f| f.path == file) {
        f.size = bytes.len() as u64;
        if f.sha256.is_some() {
            f.sha256 = Some(sha256_hex(bytes));
        }
    }
    reseal(m);
    std::fs::write(
        b.join("manifest.json"),
        serde_json::to_vec_pretty(m).unwrap(),
    )
    .unwrap();
}

/// Checks a bundle against its artifact's entry in the lock file of a recipe in `manifests/`
/// (`RECIPE.lock.json`, written by `convert build manifests/RECIPE.toml --update`): the same
/// bundle digest, else a failure naming the files, tensors and manifest fields that differ
/// (the producer's command line, which the digest does not cover, left out). The digest covers
/// the GPU kernels in `kernels/`, so a kernel change (a module added to `kernels::all()` for
/// one of the bundle's encodings or for none, a shader edited, another naga) changes it: the failure says whether only kernel files differ
/// (then rebuild the recipe with `--update`) or weights or tokenizer bytes do (a change in
/// conversion: find out why first).
pub fn check_lock(recipe: &str, artifact: &str, bundle: &Path) {
    let lock_path = repo().join(format!("manifests/{recipe}.lock.json"));
    let lock: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&lock_path).unwrap()).unwrap();
    let want = &lock[artifact];
    assert!(
        !want.is_null(),
        "{}: no artifact {artifact}",
        lock_path.display()
    );
    let got = lowbit::build::lock_entry(bundle).unwrap();
    if got["bundle_digest"] == want["bundle_digest"] {
        return;
    }
    let drift: Vec<String> = lowbit::build::drift(want, &got)
        .into_iter()
        .filter(|l| !l.contains("producer.") && !l.contains("bundle_digest"))
        .collect();
    let only_kernels = !drift.is_empty()
        && drift
            .iter()
            .all(|l| l.starts_with("file kernels/") || l.starts_with("manifest field kernels"));
    let update = format!("convert build manifests/{recipe}.toml -o $(mktemp -d)/out --update");
    panic!(
        "{recipe}/{artifact}: bundle digest {} differs from {} in {}: {}\n  {}",
        got["bundle_digest"],
        want["bundle_digest"],
        lock_path.display(),
        if only_kernels {
            format!("only GPU kernel files differ: the bundle digest covers the kernels; if the kernel change is intended, run: {update}")
        } else {
            format!("conversion output changed; find out why before running: {update}")
        },
        drift.join("\n  ")
    );
}

/// The offset just past metadata key `key`'s name in GGUF `bytes` (the key exactly, with
/// its u64 length before it: not a longer key it is the start of, as `head_count` is of
/// `head_count_kv`): the value's type (u32) follows, then the value, for tests that edit one
/// value in place.
pub fn gguf_key_end(bytes: &[u8], key: &str) -> usize {
    let mut k = (key.len() as u64).to_le_bytes().to_vec();
    k.extend_from_slice(key.as_bytes());
    let at = bytes
        .windows(k.len())
        .position(|w| w == k.as_slice())
        .unwrap_or_else(|| panic!("no metadata key {key}"));
    at + k.len()
}
