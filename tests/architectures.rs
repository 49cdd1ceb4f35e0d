//! The architectures end to end on real models (Qwen2.5-Coder-0.5B-Instruct Q4_K_M, Gemma 3
//! 270M Q4_K_M): pack, verify against the source bit for bit, run a chat prompt and judge the
//! answer against the task (not against our own output), palettize, dequantize; and the
//! refusals at pack time (an architecture the runtime does not implement, a bias of the wrong
//! length).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";

fn convert(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_convert"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let o = convert(args);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{args:?}: {}\n{text}",
        String::from_utf8_lossy(&o.stderr)
    );
    text
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A copy of `src` with every occurrence of `from` replaced by `to` (same length).
fn patched(src: &Path, from: &[u8], to: &[u8], dir: &Path) -> PathBuf {
    assert_eq!(from.len(), to.len());
    let mut b = std::fs::read(src).unwrap();
    let mut n = 0;
    let mut i = 0;
    while i + from.len() <= b.len() {
        if &b[i..i + from.len()] == from {
            b[i..i + from.len()].copy_from_slice(to);
            n += 1;
            i += from.len();
        } else {
            i += 1;
        }
    }
    assert!(n > 0, "pattern not found");
    let out = dir.join(src.file_name().unwrap());
    std::fs::write(&out, b).unwrap();
    out
}

#[test]
fn an_architecture_the_runtime_does_not_implement_is_refused_at_pack() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = common::repo().join("testdata/ternary/minicpm-tiny-tq2_0.gguf");
    // Every `minicpm` (the architecture and its `minicpm.*` keys) becomes `xyzcpm7`.
    let src = patched(&tiny, b"minicpm", b"xyzcpm7", dir.path());
    let out = dir.path().join("o.bundle");
    for args in [
        vec!["pack", "-q", s(&src), "-o", s(&out)],
        vec!["gguf-to-ternary", "-q", s(&src), "-o", s(&out)],
        vec!["palettize", "-q", "--bits", "8", s(&src), "-o", s(&out)],
    ] {
        let o = convert(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("\"xyzcpm7\" is not implemented")
                && err.contains("llama, minicpm, qwen2, gemma3"),
            "{args:?}: {err}"
        );
        assert!(!out.exists());
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "{args:?}"
        );
    }
}

#[test]
fn a_qwen2_bias_of_the_wrong_length_is_refused_at_pack() {
    let Some(src) = common::model(QWEN) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // The tensor info of blk.0.attn_q.bias: name, n_dims = 1, ne[0] = 896 -> 895 (the data
    // range shrinks, the file stays well-formed).
    let name = b"blk.0.attn_q.bias";
    let mut from = (name.len() as u64).to_le_bytes().to_vec();
    from.extend_from_slice(name);
    from.extend_from_slice(&1u32.to_le_bytes());
    let mut to = from.clone();
    from.extend_from_slice(&896u64.to_le_bytes());
    to.extend_from_slice(&895u64.to_le_bytes());
    let bad = patched(&src, &from, &to, dir.path());
    let out = dir.path().join("o.bundle");
    let o = convert(&["pack", "-q", s(&bad), "-o", s(&out)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("blk.0.attn_q.bias") && err.contains("expected [896], found [895]"),
        "{err}"
    );
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

/// Gemma 3's `attention.sliding_window` of 0 (a window of no positions: llama.cpp would mask
/// every key on those layers) is refused at pack naming the key, not run as global attention.
#[test]
fn a_gemma3_sliding_window_of_zero_is_refused_at_pack() {
    let Some(src) = common::model(GEMMA) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut b = std::fs::read(&src).unwrap();
    let at = common::gguf_key_end(&b, "gemma3.attention.sliding_window");
    // The value's type (u32 = 4), then the value.
    assert_eq!(u32::from_le_bytes(b[at..at + 4].try_into().unwrap()), 4);
    b[at + 4..at + 8].copy_from_slice(&0u32.to_le_bytes());
    let bad = dir.path().join("g.gguf");
    std::fs::write(&bad, b).unwrap();
    let out = dir.path().join("o.bundle");
    let o = convert(&["pack", "-q", s(&bad), "-o", s(&out)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("attention.sliding_window") && err.contains("0 is a window of no positions"),
        "{err}"
    );
    assert!(!out.exists());
}

/// pack, verify --source --maxerr 0, run the prompt (`--chat` for an instruction-tuned model),
/// palettize one layer and run it, dequantize one layer.
fn end_to_end(name: &str, chat: bool, prompt: &str, want: &[&str]) {
    let Some(src) = common::model(name) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let b = dir.path().join("m.bundle");
    ok(&["pack", "-q", s(&src), "-o", s(&b), "--context", "1024"]);
    let v = ok(&["verify", s(&b), "--source", s(&src), "--maxerr", "0"]);
    assert!(v.trim_end().ends_with("PASSED"), "{v}");
    let mut run = vec!["run", "--prompt", prompt, "--max-tokens", "48"];
    if chat {
        run.push("--chat");
    }
    let out = ok(&[&run[..], &[s(&b)]].concat());
    assert!(
        want.iter().any(|w| out.contains(w)),
        "{name}: {prompt:?} answered {out:?}, wanted one of {want:?}"
    );
    let p = dir.path().join("p.bundle");
    ok(&[
        "palettize",
        "-q",
        s(&src),
        "-o",
        s(&p),
        "--bits",
        "8",
        "--group-size",
        "32",
        "--include",
        "blk.0.*",
    ]);
    let v = ok(&["verify", s(&p), "--source", s(&src)]);
    assert!(v.trim_end().ends_with("PASSED"), "{v}");
    let out = ok(&[&run[..], &[s(&p)]].concat());
    assert!(
        want.iter().any(|w| out.contains(w)),
        "{name} palettized: answered {out:?}"
    );
    let st = dir.path().join("l0.safetensors");
    ok(&[
        "dequantize",
        "-q",
        s(&src),
        "-o",
        s(&st),
        "--tensor",
        "blk.0.*",
    ]);
    assert!(std::fs::metadata(&st).unwrap().len() > 1_000_000);
}

#[test]
fn qwen2_end_to_end_writes_code() {
    end_to_end(
        QWEN,
        true,
        "Write a Python function that reverses a string",
        &["def "],
    );
}

/// Gemma 3 270M here is the pretrained model (no instruction tuning, no chat template in the
/// file): a completion, not a chat.
#[test]
fn gemma3_end_to_end_answers_paris() {
    end_to_end(
        GEMMA,
        false,
        "The Eiffel Tower is located in the city of",
        &["Paris"],
    );
}
