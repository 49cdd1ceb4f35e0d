//! `convert tokenize` against llama.cpp's `llama-tokenize`: the exact stdout that tool printed
//! (testdata/tokenizer/llama_tokenize_cli.json, made by tests/ref/gen_tokenizer_vectors.py
//! --cli) for the same model, prompt and flags.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use lowbit::bundle::config::tokenizer_json;
use lowbit::gguf::GgufFile;
use serde_json::{json, Value as Json};

fn convert(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_convert"))
        .args(args)
        .output()
        .unwrap()
}

fn doc() -> Json {
    let p = common::repo().join("testdata/tokenizer/llama_tokenize_cli.json");
    serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap()
}

fn vocab_only_gguf() -> PathBuf {
    common::repo().join("testdata/tokenizer/minicpm-tiny-vocab.gguf")
}

/// The model file a run's `model` names, or None (skipped with a message) when absent.
fn model_path(name: &str) -> Option<PathBuf> {
    match name {
        "minicpm-tiny-vocab" => Some(vocab_only_gguf()),
        "ggml-vocab-qwen2" => common::llama_src_file("models/ggml-vocab-qwen2.gguf"),
        "qwen2.5" => common::model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
        "gemma3" => common::model("gemma-3-270m-q4_k_m.gguf"),
        "smollm2" => common::model("SmolLM2-135M-Instruct.Q4_1.gguf"),
        other => panic!("unknown model {other} in llama_tokenize_cli.json"),
    }
}

fn expected_stdout(run: &Json) -> Vec<u8> {
    match (run.get("stdout"), run.get("stdout_hex")) {
        (Some(s), None) => s.as_str().unwrap().as_bytes().to_vec(),
        (None, Some(h)) => hex::decode(h.as_str().unwrap()).unwrap(),
        _ => panic!("run without stdout: {run}"),
    }
}

/// `convert tokenize` arguments for a llama-tokenize run: llama-tokenize parses special tokens
/// unless `--no-parse-special`; `convert tokenize` only with `--parse-special`.
fn our_args(model: &Path, prompt: &str, llama_flags: &[&str]) -> Vec<String> {
    let mut a = vec![
        "tokenize".to_string(),
        model.display().to_string(),
        "--prompt".to_string(),
        prompt.to_string(),
    ];
    if !llama_flags.contains(&"--no-parse-special") {
        a.push("--parse-special".into());
    }
    for f in llama_flags {
        match *f {
            "--no-parse-special" => {}
            "--ids" | "--no-bos" | "--show-count" => a.push(f.to_string()),
            other => panic!("unmapped llama-tokenize flag {other}"),
        }
    }
    a
}

/// Every recorded run of the models at hand (`models` by name, or the recorded file when
/// None), checked through `convert tokenize`; returns how many ran.
fn check_runs(only: Option<(&str, &Path)>) -> usize {
    let d = doc();
    let prompts: Vec<&str> = d["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    let mut failures = Vec::new();
    let mut n = 0;
    for (name, info) in d["models"].as_object().unwrap() {
        let path = match only {
            Some((want, p)) if want == name => p.to_path_buf(),
            Some(_) => continue,
            None => match model_path(name) {
                Some(p) => {
                    if p.is_file() {
                        let sha = lowbit::util::sha256_hex(&std::fs::read(&p).unwrap());
                        assert_eq!(sha, info["sha256"].as_str().unwrap(), "{}", p.display());
                    }
                    p
                }
                None => continue,
            },
        };
        for run in d["runs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["model"] == name.as_str())
        {
            let prompt = prompts[run["prompt"].as_u64().unwrap() as usize];
            let flags: Vec<&str> = run["flags"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f.as_str().unwrap())
                .collect();
            let args = our_args(&path, prompt, &flags);
            let out = Command::new(env!("CARGO_BIN_EXE_convert"))
                .args(&args)
                .output()
                .unwrap();
            n += 1;
            let want = expected_stdout(run);
            if !out.status.success() || out.stdout != want {
                failures.push(format!(
                    "{name} {flags:?} {prompt:?}: exit {:?} {}\n  llama-tokenize {:?}\n  convert        {:?}",
                    out.status.code(),
                    String::from_utf8_lossy(&out.stderr),
                    String::from_utf8_lossy(&want),
                    String::from_utf8_lossy(&out.stdout)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    n
}

#[test]
fn stdout_equals_llama_tokenize() {
    let n = check_runs(None);
    // the vocabulary-only GGUF in the repository is always there
    assert!(n >= 18, "{n} runs");
    eprintln!("{n} llama-tokenize runs reproduced byte for byte");
}

/// A bundle directory (its tokenizer.json) tokenizes as the GGUF it came from.
#[test]
fn bundle_dir_equals_llama_tokenize() {
    let dir = tempfile::tempdir().unwrap();
    let f = GgufFile::open(vocab_only_gguf()).unwrap();
    std::fs::write(
        dir.path().join("tokenizer.json"),
        serde_json::to_vec(&tokenizer_json(&f)).unwrap(),
    )
    .unwrap();
    assert!(check_runs(Some(("minicpm-tiny-vocab", dir.path()))) >= 18);
}

#[test]
fn vocab_only_gguf_has_no_tensors() {
    let f = GgufFile::open(vocab_only_gguf()).unwrap();
    assert!(f.tensors.is_empty());
    assert!(f.get("tokenizer.ggml.tokens").is_some());
}

/// --json: ids as llama-tokenize --ids printed them, pieces as its default output shows them.
#[test]
fn json_matches_llama_tokenize() {
    let d = doc();
    let mut checked = 0;
    for (name, _) in d["models"].as_object().unwrap() {
        let Some(path) = model_path(name) else {
            continue;
        };
        for (pi, prompt) in d["prompts"].as_array().unwrap().iter().enumerate() {
            let prompt = prompt.as_str().unwrap();
            let find = |flags: Json| {
                d["runs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|r| {
                        r["model"] == name.as_str() && r["prompt"] == pi && r["flags"] == flags
                    })
                    .map(expected_stdout)
                    .unwrap()
            };
            let want_ids: Vec<u64> = serde_json::from_slice(&find(json!(["--ids"]))).unwrap();
            let want_text = find(json!([]));
            let out = convert(&[
                "tokenize",
                path.to_str().unwrap(),
                "--prompt",
                prompt,
                "--parse-special",
                "--json",
            ]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(out.stdout.last(), Some(&b'\n'));
            let v: Json = serde_json::from_slice(&out.stdout).unwrap();
            let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
            assert_eq!(
                keys,
                ["n_tokens", "add_special", "parse_special", "ids", "pieces"]
            );
            assert_eq!(v["parse_special"], true);
            let ids: Vec<u64> = v["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect();
            assert_eq!(ids, want_ids, "{name} {prompt:?}");
            assert_eq!(v["n_tokens"], ids.len());
            let mut text = Vec::new();
            for (id, p) in ids.iter().zip(v["pieces"].as_array().unwrap()) {
                text.extend_from_slice(format!("{id:6} -> '").as_bytes());
                match p {
                    Json::String(s) => text.extend_from_slice(s.as_bytes()),
                    other => text.extend(hex::decode(other["hex"].as_str().unwrap()).unwrap()),
                }
                text.extend_from_slice(b"'\n");
            }
            assert_eq!(
                String::from_utf8_lossy(&text),
                String::from_utf8_lossy(&want_text),
                "{name} {prompt:?}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 3);
}

fn bundle_with(edit: impl FnOnce(&mut Json)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut v = tokenizer_json(&GgufFile::open(vocab_only_gguf()).unwrap());
    edit(&mut v);
    std::fs::write(
        dir.path().join("tokenizer.json"),
        serde_json::to_vec(&v).unwrap(),
    )
    .unwrap();
    dir
}

fn expect_exit_2(args: &[&str], needle: &str) {
    let out = convert(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty());
    assert!(err.contains(needle), "{err}");
}

#[test]
fn unsupported_tokenizers_are_named_exit_2() {
    let bert = bundle_with(|v| v["metadata"]["ggml.model"] = json!("bert"));
    expect_exit_2(
        &["tokenize", bert.path().to_str().unwrap(), "-p", "hi"],
        "unsupported tokenizer model \"bert\"",
    );
    let pre = bundle_with(|v| {
        let m = &mut v["metadata"];
        m["ggml.model"] = json!("gpt2");
        m["ggml.pre"] = json!("deepseek-coder");
        m["ggml.merges"] = json!([]);
    });
    expect_exit_2(
        &["tokenize", pre.path().to_str().unwrap(), "-p", "hi"],
        "unsupported pre-tokenizer \"deepseek-coder\"",
    );
    // llama.cpp's own vocabulary-only files of tokenizers lowbit does not implement
    if let Some(p) = common::llama_src_file("models/ggml-vocab-bert-bge.gguf") {
        expect_exit_2(&["tokenize", p.to_str().unwrap(), "-p", "hi"], "\"bert\"");
    }
    if let Some(p) = common::llama_src_file("models/ggml-vocab-deepseek-coder.gguf") {
        expect_exit_2(
            &["tokenize", p.to_str().unwrap(), "-p", "hi"],
            "\"deepseek-coder\"",
        );
    }
}

#[test]
fn bad_inputs_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    // A GGUF with no metadata at all (header only): the file and its missing key named as
    // the GGUF spells it, not as a bundle's tokenizer.json would.
    let bare = dir.path().join("bare.gguf");
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    std::fs::write(&bare, b).unwrap();
    expect_exit_2(
        &["tokenize", bare.to_str().unwrap(), "-p", "hi"],
        "bare.gguf: metadata tokenizer.ggml.model: missing",
    );
    let missing = dir.path().join("nope.gguf");
    expect_exit_2(
        &["tokenize", missing.to_str().unwrap(), "-p", "hi"],
        "nope.gguf",
    );
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"not a gguf file at all").unwrap();
    expect_exit_2(
        &["tokenize", junk.to_str().unwrap(), "-p", "hi"],
        "bad magic",
    );
    // a directory without tokenizer.json
    expect_exit_2(
        &["tokenize", dir.path().to_str().unwrap(), "-p", "hi"],
        "tokenizer.json",
    );
    // no tokenizer model in the metadata
    let no_tok = bundle_with(|v| {
        v["metadata"].as_object_mut().unwrap().remove("ggml.model");
    });
    expect_exit_2(
        &["tokenize", no_tok.path().to_str().unwrap(), "-p", "hi"],
        "ggml.model: missing",
    );
    // usage errors
    let out = convert(&["tokenize", "x.gguf"]);
    assert_eq!(out.status.code(), Some(2));
    let out = convert(&["tokenize", "x.gguf", "-p", "a", "--ids", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let out = convert(&[
        "tokenize",
        "x.gguf",
        "-p",
        "a",
        "--parse-special",
        "--no-parse-special",
    ]);
    assert_eq!(out.status.code(), Some(2));
}

/// A GGUF whose `tokenizer.chat_template` is not UTF-8 (one byte of the tiny MiniCPM's
/// template made 0xff): `pack` writes a bundle that verifies and runs, `tokenize` works,
/// and only `run --chat` is refused, naming the key and the byte.
#[test]
fn a_chat_template_that_is_not_utf8_refuses_only_chat() {
    let src = common::repo().join("testdata/ternary/minicpm-tiny-tq2_0.gguf");
    let mut bytes = std::fs::read(&src).unwrap();
    // After the key: the value's type (u32) and length (u64), then its bytes.
    let value = common::gguf_key_end(&bytes, "tokenizer.chat_template") + 4 + 8;
    bytes[value] = 0xff;
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("t.gguf");
    std::fs::write(&gguf, &bytes).unwrap();
    let b = dir.path().join("t.bundle");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let text = |o: &Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let o = convert(&["pack", "-q", "-o", &s(&b), &s(&gguf)]);
    assert!(o.status.success(), "{}", text(&o));
    let o = convert(&["verify", &s(&b)]);
    assert!(o.status.success(), "{}", text(&o));
    for m in [s(&gguf), s(&b)] {
        let o = convert(&["tokenize", &m, "--prompt", "hi", "--ids"]);
        assert!(o.status.success(), "{m}: {}", text(&o));
    }
    let run = ["run", &s(&b), "--prompt", "hi", "--max-tokens", "1"];
    let o = convert(&run);
    assert!(o.status.success(), "{}", text(&o));
    let o = convert(&[&run[..], &["--chat"]].concat());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("metadata chat_template: not valid UTF-8 (byte 0 of"),
        "{}",
        text(&o)
    );
}

/// A bundle's tokenizer.json changed after writing: `tokenize` refuses it as `run` does (the
/// manifest's size and SHA256), instead of tokenizing with the edited file.
#[test]
fn an_edited_bundle_tokenizer_is_refused() {
    let src = common::repo().join("testdata/ternary/minicpm-tiny-tq2_0.gguf");
    let dir = tempfile::tempdir().unwrap();
    let b = dir.path().join("t.bundle");
    let bs = b.to_str().unwrap();
    let o = convert(&["gguf-to-ternary", "-q", "-o", bs, src.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = convert(&["tokenize", bs, "--prompt", "hi", "--ids"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let t = b.join("tokenizer.json");
    let mut bytes = std::fs::read(&t).unwrap();
    bytes.push(b'\n');
    std::fs::write(&t, &bytes).unwrap();
    expect_exit_2(
        &["tokenize", bs, "--prompt", "hi", "--ids"],
        "tokenizer.json: ",
    );
    let o = convert(&["tokenize", bs, "--prompt", "hi"]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("the manifest says"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
