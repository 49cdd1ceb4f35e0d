//! `convert pack` and `convert verify` on SmolLM2: schema, verification against the source,
//! determinism across thread counts, golden digest, tampering, and atomic output.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use lowbit::bundle::writer::{self, Mode, PackOptions};
use serde_json::Value;

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn convert() -> Command {
    Command::new(env!("CARGO_BIN_EXE_convert"))
}

fn run(args: &[&str], paths: &[&Path]) -> Output {
    let mut c = convert();
    c.args(args);
    for p in paths {
        c.arg(p);
    }
    c.output().unwrap()
}

/// One packed SmolLM2 bundle shared by the tests (they copy it before changing it).
fn packed() -> Option<&'static (PathBuf, PathBuf)> {
    static B: OnceLock<Option<(tempfile::TempDir, PathBuf, PathBuf)>> = OnceLock::new();
    B.get_or_init(|| {
        let model = common::model(MODEL)?;
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("smollm2.bundle");
        let o = run(&["pack", "-q", "-o"], &[&out, &model]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        Some((dir, out, model))
    })
    .as_ref()
    .map(|(_, b, m)| {
        // Leak a stable reference to the pair.
        let pair: &'static (PathBuf, PathBuf) = Box::leak(Box::new((b.clone(), m.clone())));
        pair
    })
}

fn copy_dir(from: &Path, to: &Path) {
    common::copy_tree(from, to);
}

fn manifest(b: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(b.join("manifest.json")).unwrap()).unwrap()
}

fn write_manifest(b: &Path, m: &Value) {
    std::fs::write(
        b.join("manifest.json"),
        serde_json::to_vec_pretty(m).unwrap(),
    )
    .unwrap();
}

fn schema() -> jsonschema::Validator {
    let s: Value = serde_json::from_slice(
        &std::fs::read(common::repo().join("schemas/bundle-manifest.v3.schema.json")).unwrap(),
    )
    .unwrap();
    jsonschema::validator_for(&s).unwrap()
}

#[test]
fn manifest_validates_against_schema() {
    let Some((b, _)) = packed() else { return };
    let m = manifest(b);
    let v = schema();
    let errors: Vec<String> = v.iter_errors(&m).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:#?}");
    // The schema is not vacuous: a broken manifest fails it.
    let mut bad = m.clone();
    bad["tensors"][0]["sha256"] = Value::from("xyz");
    bad["files"][0]["path"] = Value::from("../weights.bin");
    assert!(v.iter_errors(&bad).count() >= 2);
    assert_eq!(m["format"], "lowbit-bundle");
    assert_eq!(m["source"]["file_name"], MODEL);
    assert_eq!(m["model"]["architecture"], "llama");
    assert_eq!(m["model"]["n_layer"], 30);
    assert_eq!(m["model"]["n_head_kv"], 3);
    assert_eq!(m["model"]["tied_embeddings"], true);
    let main = &m["functions"]["main"];
    assert_eq!(main["inputs"][0]["name"], "input_ids");
    assert_eq!(main["inputs"][0]["shape"], serde_json::json!([1, 1]));
    assert_eq!(main["states"][0]["name"], "keyCache");
    assert_eq!(
        main["outputs"][0]["shape"],
        serde_json::json!([1, 1, 49152])
    );
    assert_eq!(m["tensors"].as_array().unwrap().len(), 272);
}

#[test]
fn verify_against_source_passes_with_maxerr_zero() {
    let Some((b, model)) = packed() else { return };
    let o = run(
        &["verify", "--json", "--maxerr", "0", "--source"],
        &[model, b],
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["passed"], true);
    assert_eq!(r["totals"]["tensors"], 272);
    assert_eq!(r["totals"]["passed"], 272);
    assert!(r["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t["compared"] == "bytes" && t["mismatched"] == 0));
}

/// Same input, same flags: byte-identical bundles whatever the thread count, and the bundle
/// digest recorded for the `pack` artifact of `manifests/smollm2.toml` (its lock file names
/// what differs when it does not match; see `common::check_lock`).
#[test]
fn deterministic_across_thread_counts_and_matches_recipe_lock() {
    let Some((b, model)) = packed() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("smollm2.bundle");
    let o = run(&["--threads", "1", "pack", "-q", "-o"], &[&out, model]);
    assert!(o.status.success());
    for f in ["manifest.json", "weights.bin", "tokenizer.json"] {
        assert!(
            std::fs::read(b.join(f)).unwrap() == std::fs::read(out.join(f)).unwrap(),
            "{f} differs between thread counts"
        );
    }
    common::check_lock("smollm2", "pack", b);
}

fn tampered(f: impl FnOnce(&Path)) -> Option<(tempfile::TempDir, PathBuf, PathBuf)> {
    let (b, model) = packed()?;
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("t.bundle");
    copy_dir(b, &copy);
    f(&copy);
    Some((dir, copy, model.clone()))
}

fn verify_fails(copy: &Path, code: i32, needles: &[&str]) {
    let o = run(&["verify"], &[copy]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(code), "{text}");
    for n in needles {
        assert!(text.contains(n), "expected {n:?} in:\n{text}");
    }
}

#[test]
fn flipped_byte_is_caught() {
    let Some((_d, copy, _)) = tampered(|b| {
        let p = b.join("weights.bin");
        let mut w = std::fs::read(&p).unwrap();
        w[12345] ^= 0x01;
        std::fs::write(&p, w).unwrap();
    }) else {
        return;
    };
    // Format version 3: the tensor holding the byte is named (its SHA256 covers it).
    verify_fails(
        &copy,
        1,
        &["tensor \"token_embd.weight\": sha256", "FAILED"],
    );
    // The tensor holding the byte fails in the per-tensor report too (regression: its row
    // said "ok" and the totals counted it as passed while a failure named its SHA256).
    let o = run(&["verify", "--json"], &[&copy]);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let failed: Vec<&Value> = r["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["passed"] == false)
        .collect();
    assert_eq!(failed.len(), 1, "{r:#}");
    assert!(
        failed[0]["detail"].as_str().unwrap().contains("sha256"),
        "{r:#}"
    );
    assert_eq!(
        r["totals"]["passed"].as_u64().unwrap() + 1,
        r["totals"]["tensors"].as_u64().unwrap()
    );
}

#[test]
fn truncated_file_is_caught() {
    let Some((_d, copy, _)) = tampered(|b| {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(b.join("weights.bin"))
            .unwrap();
        f.set_len(1000).unwrap();
    }) else {
        return;
    };
    verify_fails(&copy, 1, &["weights.bin", "truncated"]);
}

#[test]
fn extra_file_is_caught() {
    let Some((_d, copy, _)) = tampered(|b| std::fs::write(b.join("extra.bin"), b"x").unwrap())
    else {
        return;
    };
    verify_fails(&copy, 1, &["extra.bin", "extra file"]);
}

#[test]
fn missing_file_is_caught() {
    let Some((_d, copy, _)) = tampered(|b| std::fs::remove_file(b.join("tokenizer.json")).unwrap())
    else {
        return;
    };
    verify_fails(&copy, 1, &["tokenizer.json", "missing"]);
}

#[test]
fn symlinked_file_is_refused() {
    let Some((_d, copy, _)) = tampered(|b| {
        let t = b.join("tokenizer.json");
        let elsewhere = b.parent().unwrap().join("tok-elsewhere.json");
        std::fs::rename(&t, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &t).unwrap();
    }) else {
        return;
    };
    verify_fails(&copy, 1, &["tokenizer.json", "symlink"]);
}

/// A symlink to a bundle directory is refused as a symlink (by name), not as "not a bundle".
#[test]
fn symlinked_bundle_directory_is_refused_by_name() {
    let Some((d, copy, _)) = tampered(|_| {}) else {
        return;
    };
    let link = d.path().join("link.bundle");
    std::os::unix::fs::symlink(&copy, &link).unwrap();
    let o = run(&["verify"], &[&link]);
    let text = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{text}");
    assert!(
        text.contains("link.bundle") && text.contains("a symbolic link"),
        "{text}"
    );
    // The directory it points to verifies.
    assert_eq!(run(&["verify"], &[&copy]).status.code(), Some(0));
}

#[test]
fn escaping_paths_are_refused() {
    for bad in [
        "../weights.bin",
        "/etc/passwd",
        "a/../../x",
        "./weights.bin",
    ] {
        let Some((_d, copy, _)) = tampered(|b| {
            let mut m = manifest(b);
            m["files"][1]["path"] = Value::from(bad);
            write_manifest(b, &m);
        }) else {
            return;
        };
        verify_fails(&copy, 2, &["escapes the bundle", bad]);
    }
}

#[test]
fn unknown_format_version_is_refused() {
    let Some((_d, copy, _)) = tampered(|b| {
        let mut m = manifest(b);
        m["format_version"] = Value::from(4);
        write_manifest(b, &m);
    }) else {
        return;
    };
    verify_fails(&copy, 2, &["unsupported format_version 4"]);
}

#[test]
fn malformed_hash_is_refused() {
    let Some((_d, copy, _)) = tampered(|b| {
        let mut m = manifest(b);
        m["files"][0]["sha256"] = Value::from("ABC");
        write_manifest(b, &m);
    }) else {
        return;
    };
    verify_fails(&copy, 2, &["malformed sha256", "ABC"]);
}

#[test]
fn edited_manifest_breaks_the_digest() {
    let Some((_d, copy, _)) = tampered(|b| {
        // A consistent-looking edit: change a file's recorded hash to another valid hash.
        let mut m = manifest(b);
        m["files"][0]["sha256"] = Value::from("0".repeat(64));
        write_manifest(b, &m);
    }) else {
        return;
    };
    verify_fails(&copy, 1, &["bundle digest", "does not match"]);
}

#[test]
fn wrong_source_is_caught() {
    let Some((b, _)) = packed() else { return };
    let Some(other) = common::model("gemma-3-270m-q4_k_m.gguf") else {
        return;
    };
    let o = run(&["verify", "--source"], &[&other, b]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("the bundle was made from SmolLM2"), "{out}");
}

#[test]
fn refuses_existing_output_and_leaves_nothing_after_a_failure() {
    let Some(model) = common::model(MODEL) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.bundle");
    std::fs::create_dir(&out).unwrap();
    let o = run(&["pack", "-q", "-o"], &[&out, &model]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("already exists"));
    std::fs::remove_dir(&out).unwrap();

    // A failure injected mid-write (after 100 of 272 tensors): nothing at the output path,
    // no temporary directory left beside it.
    let opts = PackOptions {
        mode: Mode::Pack,
        context: None,
        prefill_buckets: None,
        quiet: true,
        fail_after_tensors: Some(100),
    };
    let err = writer::write_bundle(&model, &out, &opts, vec!["test".into()]).unwrap_err();
    assert!(
        err.to_string().contains("injected failure after 100"),
        "{err}"
    );
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn dequantize_bundle_equals_dequantize_source() {
    let Some((b, model)) = packed() else { return };
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.safetensors");
    let c = dir.path().join("b.safetensors");
    assert!(
        run(&["dequantize", "-q", "--tensor", "blk.1*", "-o"], &[&a, b])
            .status
            .success()
    );
    assert!(run(
        &["dequantize", "-q", "--tensor", "blk.1*", "-o"],
        &[&c, model]
    )
    .status
    .success());
    let a = std::fs::read(a).unwrap();
    let c = std::fs::read(c).unwrap();
    let a = safetensors::SafeTensors::deserialize(&a).unwrap();
    let c = safetensors::SafeTensors::deserialize(&c).unwrap();
    assert_eq!(a.len(), 99);
    for (name, t) in a.tensors() {
        assert_eq!(t.data(), c.tensor(&name).unwrap().data(), "{name}");
    }
}

/// Inputs that are not regular files: a FIFO is refused at once (it used to block every
/// command forever), a directory where a file is expected is named as one.
#[test]
fn fifo_and_directory_inputs_are_refused() {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.gguf");
    let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let out = dir.path().join("out");
    let o = out.to_str().unwrap();
    let f = fifo.to_str().unwrap();
    for args in [
        vec!["inspect", f],
        vec!["pack", f, "-o", o],
        vec!["palettize", f, "-o", o, "--bits", "8"],
        vec!["dequantize", f, "-o", o],
    ] {
        let mut child = convert()
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if t0.elapsed().as_secs() > 30 {
                child.kill().unwrap();
                panic!("{args:?}: still running after 30 s (blocked on the FIFO)");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let o = child.wait_with_output().unwrap();
        let t = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {t}");
        assert!(
            t.contains("fifo.gguf") && t.contains("not a regular file"),
            "{args:?}: {t}"
        );
        assert!(!out.exists());
    }
    let o = convert()
        .args(["inspect", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    let t = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("is a directory"), "{t}");
}

/// Issue 16 item 9 (special token ids outside the vocabulary): the tiny MiniCPM GGUF (474
/// tokens) with `tokenizer.ggml.bos_token_id` set to 5000 is refused by `pack`, naming the
/// key, the id and `n_vocab`, with nothing written; a bundle whose manifest and tokenizer
/// (rehashed, so integrity holds) say 5000 fails `verify`, naming the same facts.
#[test]
fn issue16_9_special_token_ids_outside_the_vocabulary_are_refused() {
    let src = common::repo().join("testdata/ternary/minicpm-tiny-tq2_0.gguf");
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(&src).unwrap();
    let key = b"tokenizer.ggml.bos_token_id";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("the tiny model has a bos id")
        + key.len();
    // Value type 4 (u32), then the value.
    assert_eq!(bytes[at..at + 4], 4u32.to_le_bytes());
    bytes[at + 4..at + 8].copy_from_slice(&5000u32.to_le_bytes());
    let bad = dir.path().join("bos5000.gguf");
    std::fs::write(&bad, &bytes).unwrap();
    let out = dir.path().join("x.bundle");
    let o = run(&["pack", "-q", "-o"], &[&out, &bad]);
    let t = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{t}");
    for n in ["tokenizer.ggml.bos_token_id", "5000", "n_vocab = 474"] {
        assert!(t.contains(n), "{t:?} should name {n:?}");
    }
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

    // The same id in a bundle (manifest and tokenizer agree; hashes recomputed).
    let good = dir.path().join("good.bundle");
    let o = run(&["pack", "-q", "-o"], &[&good, &src]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut m: lowbit::bundle::manifest::Manifest =
        serde_json::from_slice(&std::fs::read(good.join("manifest.json")).unwrap()).unwrap();
    m.model.special_tokens.insert("bos".into(), 5000);
    let mut tok: Value =
        serde_json::from_slice(&std::fs::read(good.join("tokenizer.json")).unwrap()).unwrap();
    tok["metadata"]["ggml.bos_token_id"] = 5000.into();
    let tb = serde_json::to_vec_pretty(&tok).unwrap();
    common::write_rehashed(&good, &mut m, "tokenizer.json", &tb);
    let o = run(&["verify"], &[&good]);
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(1), "{t}");
    for n in ["special_tokens.bos", "5000", "n_vocab = 474"] {
        assert!(t.contains(n), "{t:?} should name {n:?}");
    }
}

/// A tensor the runtime reads, of a type it has no kernel for (IQ2_XXS: the tiny model's
/// TQ2_0 `blk.0.attn_q.weight` retyped in place, both 66 bytes a 256-block), is refused by
/// `pack` naming the file, the tensor and the type, with the types it runs; nothing is
/// written. (Before, `pack` made the bundle and `run` failed on it.)
#[test]
fn a_tensor_type_without_a_kernel_is_refused_at_pack() {
    let src = common::repo().join("testdata/ternary/minicpm-tiny-tq2_0.gguf");
    let mut b = std::fs::read(&src).unwrap();
    let name = b"blk.0.attn_q.weight";
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend_from_slice(name);
    let at = b
        .windows(key.len())
        .position(|w| w == key.as_slice())
        .expect("the tensor's info")
        + key.len();
    let n_dims = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    let ty = at + 4 + 8 * n_dims;
    assert_eq!(
        u32::from_le_bytes(b[ty..ty + 4].try_into().unwrap()),
        35,
        "TQ2_0"
    );
    b[ty..ty + 4].copy_from_slice(&16u32.to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("iq.gguf");
    std::fs::write(&gguf, &b).unwrap();
    let out = dir.path().join("iq.bundle");
    let o = run(&["pack", "-q", "-o"], &[&out, &gguf]);
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(2), "{t}");
    for want in [
        "iq.gguf",
        "blk.0.attn_q.weight",
        "type IQ2_XXS: the runtime has no kernel for it",
        "Q4_K",
    ] {
        assert!(t.contains(want), "{t:?} should contain {want:?}");
    }
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "{t}");
}

/// An output in a directory that does not exist, or with a name too long to stage beside it
/// (`.NAME.HOST-PID.XXXXXX.partial` past 255 bytes), is refused naming the output and why
/// (the error named the staging path before), with nothing written.
#[test]
fn an_output_that_cannot_be_staged_is_refused_naming_it() {
    let src = common::repo().join("testdata/ternary/minicpm-tiny-tq2_0.gguf");
    let dir = tempfile::tempdir().unwrap();
    let long = format!("{}.bundle", "a".repeat(240));
    for (out, want) in [
        (dir.path().join("no-such-dir/x.bundle"), "does not exist"),
        (dir.path().join(&long), "bytes; at most"),
    ] {
        let o = run(&["pack", "-q", "-o"], &[&out, &src]);
        let t = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{t}");
        assert!(
            t.contains(&out.display().to_string()) && t.contains(want) && !t.contains(".partial:"),
            "{t}"
        );
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
