//! Tokenizer ids against llama.cpp's `llama-tokenize` (testdata/tokenizer/<model>.json, made
//! by tests/ref/gen_tokenizer_vectors.py), decoding, chat templates and malformed input.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use lowbit::bundle::config::tokenizer_json;
use lowbit::gguf::GgufFile;
use lowbit::tokenizer::{attr, Tokenizer, TokenizerError, TokenizerKind, Utf8Stream};
use serde_json::{json, Value as Json};

fn tiny_path() -> PathBuf {
    common::repo().join("testdata/ternary/minicpm-tiny-tq2_0.gguf")
}

fn tok_json(path: &Path) -> Json {
    tokenizer_json(&GgufFile::open(path).unwrap())
}

fn load(path: &Path) -> Tokenizer {
    Tokenizer::from_json(&tok_json(path)).unwrap()
}

fn read_json(rel: &str) -> Json {
    let p = common::repo().join(rel);
    serde_json::from_str(
        &std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
    )
    .unwrap()
}

fn texts() -> HashMap<String, String> {
    read_json("testdata/tokenizer/texts.json")["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                t["text"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Compares every text of `testdata/tokenizer/<name>.json`; panics listing all mismatches.
fn check_vectors(tok: &Tokenizer, name: &str) {
    let texts = texts();
    let doc = read_json(&format!("testdata/tokenizer/{name}.json"));
    let cases = doc["cases"].as_array().unwrap();
    assert_eq!(
        cases.len(),
        texts.len(),
        "{name}.json is stale: regenerate it"
    );
    let mut failures = Vec::new();
    let add = tok.add_bos();
    for case in cases {
        let cname = case["name"].as_str().unwrap();
        let text = &texts[cname];
        for (variant, add_special, parse_special) in [
            ("special", add, true),
            ("plain", add, false),
            ("nobos", false, true),
        ] {
            let want = ids(&case[variant]);
            let got = tok.encode(text, add_special, parse_special);
            if got != want {
                failures.push(format!(
                    "{cname} [{variant}] {text:?}\n    llama.cpp {want:?}\n    lowbit    {got:?}"
                ));
            }
        }
        // pieces (token_to_piece with special = true) of the llama.cpp ids
        let want_ids = ids(&case["special"]);
        let pieces = case
            .get("pieces_hex")
            .and_then(Json::as_array)
            .map_or(&[][..], Vec::as_slice);
        for (id, hex) in want_ids.iter().zip(pieces) {
            let got = hex::encode(tok.token_to_piece(*id, true));
            if got != hex.as_str().unwrap() {
                failures.push(format!(
                    "{cname}: piece of {id}: llama.cpp {hex} lowbit {got}"
                ));
            }
        }
    }
    // BOS / EOS handling of the empty text
    assert_eq!(
        tok.encode("", add, true),
        ids(&doc["empty_with_special"]),
        "{name}: empty text"
    );
    assert_eq!(
        tok.encode("", false, true),
        ids(&doc["empty_without_special"]),
        "{name}: empty text"
    );
    // special ids as llama.cpp's loader reports them
    let info = &doc["vocab_info"];
    let opt = |k: &str| info.get(k).and_then(Json::as_u64).map(|x| x as u32);
    let sp = tok.special_tokens();
    assert_eq!(sp.bos, opt("bos"), "{name}: bos");
    assert_eq!(sp.eos, opt("eos"), "{name}: eos");
    assert_eq!(sp.eot, opt("eot"), "{name}: eot");
    assert_eq!(sp.eom, opt("eom"), "{name}: eom");
    assert_eq!(sp.unk, opt("unk"), "{name}: unk");
    assert_eq!(sp.pad, opt("pad"), "{name}: pad");
    assert_eq!(sp.fim_rep, opt("fim_rep"), "{name}: fim_rep");
    assert_eq!(
        tok.eog_ids().collect::<Vec<_>>(),
        ids(&info["eog"]),
        "{name}: eog"
    );
    assert_eq!(
        tok.special_token_ids().len() as u64,
        info["special_cache_size"].as_u64().unwrap(),
        "{name}: special token count"
    );
    assert!(
        failures.is_empty(),
        "{name}: {} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!("{name}: {} texts x 3 variants match llama.cpp", cases.len());
}

/// decode(encode(text)) == text, for every text where the ids carry the whole text: not
/// when the ids contain tokens that render as nothing (CONTROL / UNKNOWN, e.g. `<s>` parsed
/// as BOS) or an unknown-token fallback.
fn check_round_trips(tok: &Tokenizer, name: &str) {
    let mut failures = Vec::new();
    let mut n = 0;
    for (cname, text) in texts() {
        // without parsing special tokens, every text round-trips unless it holds the text
        // of a CONTROL token that is split out anyway (USER_DEFINED made CONTROL, e.g.
        // Gemma's "</s>")
        let plain = tok.encode(&text, false, false);
        let silent = plain
            .iter()
            .any(|&i| tok.token_attr(i).unwrap() & (attr::CONTROL | attr::UNKNOWN) != 0);
        if !silent {
            n += 1;
            let got = tok.decode(&plain);
            if got != text {
                failures.push(format!("{cname}: decode(encode({text:?})) = {got:?}"));
            }
        }
        // with special tokens parsed and rendered back; not with a space prefix, which
        // SentencePiece adds after every special token (llama.cpp does the same)
        let special = tok.encode(&text, false, true);
        let back = String::from_utf8_lossy(&tok.detokenize(&special, false, true)).into_owned();
        let prefixed =
            tok.add_space_prefix() && special.iter().any(|i| tok.special_token_ids().contains(i));
        if back != text && !prefixed && !special.iter().any(|&i| Some(i) == tok.unk()) {
            failures.push(format!(
                "{cname}: detokenize(encode({text:?}, special), special) = {back:?}"
            ));
        }
        // streaming: pieces joined through Utf8Stream give the same text as decode
        let mut s = Utf8Stream::new();
        let mut streamed = String::new();
        for (k, &id) in plain.iter().enumerate() {
            let mut piece = tok.token_to_bytes(id);
            if k == 0 && tok.add_space_prefix() && piece.first() == Some(&b' ') {
                piece.remove(0);
            }
            streamed.push_str(&s.push(&piece));
        }
        streamed.push_str(&s.finish());
        if streamed != tok.decode(&plain) {
            failures.push(format!(
                "{cname}: streamed {streamed:?} != decoded {:?}",
                tok.decode(&plain)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: round trips:\n{}",
        failures.join("\n")
    );
    eprintln!("{name}: {n} plain round trips");
}

#[test]
fn minicpm_tiny_matches_llama_cpp() {
    let tok = load(&tiny_path());
    assert_eq!(tok.kind(), TokenizerKind::Spm);
    assert!(tok.add_bos() && !tok.add_eos() && tok.add_space_prefix());
    check_vectors(&tok, "minicpm-tiny");
    check_round_trips(&tok, "minicpm-tiny");
}

#[test]
fn smollm2_matches_llama_cpp() {
    let Some(p) = common::model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let tok = load(&p);
    assert_eq!(tok.kind(), TokenizerKind::Bpe);
    assert_eq!(tok.pre(), "smollm");
    assert!(!tok.add_bos());
    check_vectors(&tok, "smollm2");
    check_round_trips(&tok, "smollm2");
    assert!(tok.is_eog(tok.token_id("<|im_end|>").unwrap()));
    assert!(tok.is_eog(tok.token_id("<|endoftext|>").unwrap()));
    assert!(!tok.is_eog(tok.token_id("<|im_start|>").unwrap()));
}

/// SmolLM2's vocabulary under the llama3 / qwen2 pre-tokenizers (vectors from a copy of the
/// GGUF with `tokenizer.ggml.pre` replaced).
fn check_synthetic(name: &str, pre: &str) {
    let Some(p) = common::model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let mut v = tok_json(&p);
    v["metadata"]["ggml.pre"] = json!(pre);
    let tok = Tokenizer::from_json(&v).unwrap();
    assert_eq!(tok.pre(), pre);
    check_vectors(&tok, name);
}

#[test]
fn llama3_pre_tokenizer_matches_llama_cpp() {
    check_synthetic("smollm2-as-llama3", "llama-bpe");
}

#[test]
fn qwen2_pre_tokenizer_matches_llama_cpp() {
    check_synthetic("smollm2-as-qwen2", "qwen2");
}

#[test]
fn gemma3_matches_llama_cpp() {
    let Some(p) = common::model("gemma-3-270m-q4_k_m.gguf") else {
        return;
    };
    let tok = load(&p);
    assert_eq!(tok.kind(), TokenizerKind::Spm);
    assert!(!tok.add_space_prefix());
    check_vectors(&tok, "gemma3");
    check_round_trips(&tok, "gemma3");
    assert!(tok.is_eog(tok.token_id("<end_of_turn>").unwrap()));
    // no chat_template in this GGUF
    assert!(matches!(
        tok.apply_chat_template(&[("user", "hi")], true),
        Err(TokenizerError::NoChatTemplate)
    ));
}

#[test]
fn qwen2_5_matches_llama_cpp() {
    let Some(p) = common::model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") else {
        return;
    };
    let tok = load(&p);
    assert_eq!(tok.kind(), TokenizerKind::Bpe);
    assert_eq!(tok.pre(), "qwen2");
    assert_eq!(tok.n_vocab(), 151_936);
    assert!(!tok.add_bos() && !tok.add_eos());
    check_vectors(&tok, "qwen2.5");
    check_round_trips(&tok, "qwen2.5");
    for t in [
        "<|im_end|>",
        "<|endoftext|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    ] {
        assert!(tok.is_eog(tok.token_id(t).unwrap()), "{t}");
    }
    assert!(!tok.is_eog(tok.token_id("<|im_start|>").unwrap()));
}

/// The chat prompts of testdata/llama/*.f32path.json: lowbit renders Qwen's template to the
/// recorded prompt text, and tokenizes both chat prompts to llama-tokenize's ids.
#[test]
fn f32path_chat_prompts_match_llama_cpp() {
    for (file, stem, template) in [
        (
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            "qwen2.5-coder-0.5b-instruct-q4_k_m",
            true,
        ),
        ("gemma-3-270m-q4_k_m.gguf", "gemma-3-270m-q4_k_m", false),
    ] {
        let Some(p) = common::model(file) else {
            continue;
        };
        let tok = load(&p);
        let doc = read_json(&format!("testdata/llama/{stem}.f32path.json"));
        let case = doc["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c.get("chat").is_some())
            .expect("a chat case");
        let prompt = case["prompt"].as_str().unwrap();
        if template {
            let user = case["chat"]["messages"][0][1].as_str().unwrap();
            let got = tok.apply_chat_template(&[("user", user)], true).unwrap();
            assert_eq!(got, prompt, "{stem}");
        }
        assert_eq!(
            tok.encode(prompt, tok.add_bos(), true),
            ids(&case["prompt_ids"]),
            "{stem}"
        );
    }
}

/// llama.cpp's own vocabulary-only test file for the qwen2 pre-tokenizer (no tensors).
#[test]
fn llama_cpp_vocab_only_qwen2_matches_llama_cpp() {
    let Some(p) = common::llama_src_file("models/ggml-vocab-qwen2.gguf") else {
        return;
    };
    let f = GgufFile::open(&p).unwrap();
    assert!(f.tensors.is_empty());
    let tok = Tokenizer::from_json(&tokenizer_json(&f)).unwrap();
    assert_eq!(tok.pre(), "qwen2");
    check_vectors(&tok, "ggml-vocab-qwen2");
    check_round_trips(&tok, "ggml-vocab-qwen2");
}

#[test]
fn chat_templates_match_jinja2() {
    let doc = read_json("testdata/tokenizer/chat_templates.json");
    let mut checked = 0;
    for (name, t) in doc["templates"].as_object().unwrap() {
        let tok = match name.as_str() {
            "minicpm-tiny" => load(&tiny_path()),
            "qwen2.5" => match common::model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") {
                Some(p) => load(&p),
                None => continue,
            },
            "smollm2" => match common::model("SmolLM2-135M-Instruct.Q4_1.gguf") {
                Some(p) => load(&p),
                None => continue,
            },
            other => panic!("unknown template {other}"),
        };
        for case in t["cases"].as_array().unwrap() {
            let msgs: Vec<(String, String)> = case["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    (
                        m[0].as_str().unwrap().to_string(),
                        m[1].as_str().unwrap().to_string(),
                    )
                })
                .collect();
            let gen = case["add_generation_prompt"].as_bool().unwrap();
            let got = tok.apply_chat_template(&msgs, gen).unwrap();
            assert_eq!(
                got,
                case["rendered"].as_str().unwrap(),
                "{name} / {}",
                case["name"]
            );
            checked += 1;
        }
    }
    assert!(checked > 0);
}

#[test]
fn smollm2_chat_prompt_tokens() {
    let Some(p) = common::model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let tok = load(&p);
    let prompt = tok.apply_chat_template(&[("user", "Hi")], true).unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = tok.encode(&prompt, true, true);
    // the prompt llama.cpp builds for the same chat: `llama-completion -m SmolLM2-135M-Instruct.Q4_1.gguf
    // --jinja -cnv -st -p Hi -n 1 --verbose-prompt` (build 11434) lists these 31 tokens
    let llama_cpp = [
        1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
        407, 19712, 8182, 2, 198, 1, 4093, 198, 26843, 2, 198, 1, 520, 9531, 198,
    ];
    assert_eq!(ids, llama_cpp);
    assert_eq!(tok.detokenize(&ids, false, true), prompt.as_bytes());
}

#[test]
fn bundle_dir_loads() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("tokenizer.json"),
        serde_json::to_vec(&tok_json(&tiny_path())).unwrap(),
    )
    .unwrap();
    let tok = Tokenizer::from_bundle_dir(dir.path()).unwrap();
    assert_eq!(tok.n_vocab(), 474);
    // "Hello world" ids from testdata/tokenizer/minicpm-tiny.json
    assert_eq!(tok.encode("Hello world", true, false), [1, 273, 286]);
    assert_eq!(tok.decode(&[273, 286]), "Hello world");
    // as llama.cpp's detokenize: the space-prefix strip applies to the first token, here BOS
    assert_eq!(tok.decode(&[1, 273, 286]), " Hello world");
    assert_eq!(tok.detokenize(&[1, 273, 286], true, false), b" Hello world");
    assert_eq!(
        tok.detokenize(&[1, 273, 286], false, true),
        b"<s> Hello world"
    );

    let missing = Tokenizer::from_bundle_dir(&dir.path().join("nope")).unwrap_err();
    assert!(matches!(missing, TokenizerError::Io { .. }), "{missing}");
    std::fs::write(dir.path().join("tokenizer.json"), b"{not json").unwrap();
    let bad = Tokenizer::from_bundle_dir(dir.path()).unwrap_err();
    assert!(matches!(bad, TokenizerError::Json { .. }), "{bad}");
}

/// A small GPT-2-style tokenizer.json: bytes a..z as tokens, a few merges.
fn small_bpe() -> Json {
    let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<|im_end|>".into()];
    tokens.extend("abcdefghijklmnopqrstuvwxyzĠ".chars().map(String::from));
    tokens.extend(["he", "ll", "hell", "hello", "Ġw", "Ġwo"].map(String::from));
    let mut types = vec![3, 3];
    types.resize(tokens.len(), 1);
    json!({
        "format": "lowbit-tokenizer",
        "format_version": 1,
        "metadata": {
            "ggml.model": "gpt2",
            "ggml.pre": "gpt-2",
            "ggml.tokens": tokens,
            "ggml.token_type": types,
            "ggml.merges": ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o"],
            "ggml.bos_token_id": 0,
            "ggml.eos_token_id": 1,
        }
    })
}

#[test]
fn small_bpe_works() {
    let tok = Tokenizer::from_json(&small_bpe()).unwrap();
    let id = |t: &str| tok.token_id(t).unwrap();
    assert_eq!(
        tok.encode("hello wo", false, false),
        [id("hello"), id("Ġwo")]
    );
    assert_eq!(
        tok.decode(&tok.encode("hello wo", false, false)),
        "hello wo"
    );
    // parse_special splits out the control token; without it, its characters are tokenized
    assert_eq!(tok.encode("he<|im_end|>", false, true), [id("he"), 1]);
    assert_ne!(tok.encode("he<|im_end|>", false, false), [id("he"), 1]);
    assert!(tok.is_eog(1) && tok.is_eog(0));
    // characters with no token are dropped (llama.cpp does the same)
    assert_eq!(tok.encode("h!", false, false), [id("h")]);
}

fn expect_field_error(v: &Json, field: &str, detail: &str) {
    match Tokenizer::from_json(v) {
        Err(e @ TokenizerError::Field { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(field) && msg.contains(detail), "{msg}");
        }
        Err(e) => panic!("expected a field error about {field}, got {e}"),
        Ok(_) => panic!("expected a field error about {field}"),
    }
}

#[test]
fn malformed_tokenizer_json_is_an_error() {
    let good = small_bpe();
    let with = |path: &[&str], val: Json| {
        let mut v = good.clone();
        let mut cur = &mut v;
        for p in &path[..path.len() - 1] {
            cur = cur.get_mut(*p).unwrap();
        }
        cur[path[path.len() - 1]] = val;
        v
    };
    let without = |key: &str| {
        let mut v = good.clone();
        v["metadata"].as_object_mut().unwrap().remove(key);
        v
    };
    expect_field_error(&json!([]), "(root)", "expected an object");
    expect_field_error(
        &with(&["format"], json!("other")),
        "format",
        "lowbit-tokenizer",
    );
    expect_field_error(
        &with(&["format_version"], json!(2)),
        "format_version",
        "expected 1, found 2",
    );
    expect_field_error(
        &with(&["metadata"], json!(3)),
        "metadata",
        "expected an object",
    );
    expect_field_error(&without("ggml.model"), "metadata ggml.model", "missing");
    expect_field_error(&without("ggml.tokens"), "metadata ggml.tokens", "missing");
    expect_field_error(&without("ggml.merges"), "metadata ggml.merges", "missing");
    expect_field_error(
        &with(&["metadata", "ggml.tokens"], json!([])),
        "metadata ggml.tokens",
        "is empty",
    );
    expect_field_error(
        &with(&["metadata", "ggml.tokens"], json!(["a", 5])),
        "metadata ggml.tokens",
        "entry 1: expected a string",
    );
    expect_field_error(
        &with(
            &["metadata", "ggml.merges"],
            json!(["h e", "l l", "nospace"]),
        ),
        "metadata ggml.merges",
        "entry 2 has no space",
    );
    expect_field_error(
        &with(&["metadata", "ggml.token_type"], json!([1, 1])),
        "metadata ggml.token_type",
        "has 2 entries for 35 tokens",
    );
    expect_field_error(
        &with(&["metadata", "ggml.scores"], json!([0.5])),
        "metadata ggml.scores",
        "has 1 entries",
    );
    expect_field_error(
        &with(&["metadata", "ggml.bos_token_id"], json!(-1)),
        "metadata ggml.bos_token_id",
        "expected an unsigned 32-bit integer, found -1",
    );
    expect_field_error(
        &with(&["metadata", "ggml.add_bos_token"], json!("yes")),
        "metadata ggml.add_bos_token",
        "expected a boolean",
    );
    expect_field_error(
        &with(&["metadata", "ggml.pre"], json!(7)),
        "metadata ggml.pre",
        "expected a string",
    );
    let e = Tokenizer::from_json(&with(&["metadata", "ggml.model"], json!("bert"))).unwrap_err();
    assert!(
        matches!(e, TokenizerError::UnsupportedModel(ref m) if m == "bert"),
        "{e}"
    );
    let e = Tokenizer::from_json(&with(&["metadata", "ggml.pre"], json!("default"))).unwrap_err();
    assert!(
        matches!(e, TokenizerError::UnsupportedPre(ref m) if m == "default"),
        "{e}"
    );
    assert!(e.to_string().contains("metadata ggml.pre"), "{e}");
    // an out-of-range special id keeps the default (BPE: 11), as in llama.cpp; not an error
    let tok =
        Tokenizer::from_json(&with(&["metadata", "ggml.bos_token_id"], json!(100000))).unwrap();
    assert_eq!(tok.bos(), Some(11));
}

#[test]
fn hex_tokens_and_odd_input_do_not_panic() {
    let mut v = tok_json(&tiny_path());
    // a token that is not UTF-8, as config.rs writes it
    v["metadata"]["ggml.tokens"][400] = json!({"hex": "ff80"});
    let tok = Tokenizer::from_json(&v).unwrap();
    assert_eq!(tok.token_text(400), Some(&[0xff, 0x80][..]));
    assert!(tok.token_text(474).is_none());
    assert!(tok.token_to_piece(u32::MAX, true).is_empty());
    let _ = tok.decode(&[0, 1, 2, 3, 400, 473, 9999, u32::MAX]);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..200 {
        let mut s = String::new();
        for _ in 0..(state % 40) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let c = match state % 6 {
                0 => char::from_u32((state >> 8) as u32 % 0x11_0000).unwrap_or('x'),
                1 => ' ',
                2 => '\n',
                3 => '<',
                _ => char::from(b'a' + (state >> 20) as u8 % 26),
            };
            s.push(c);
        }
        for (a, p) in [(true, true), (false, false)] {
            let ids = tok.encode(&s, a, p);
            assert!(ids.iter().all(|&i| (i as usize) < tok.n_vocab()));
            let _ = tok.decode(&ids);
        }
    }
}

#[test]
fn tokenizer_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
}

#[test]
fn utf8_stream_joins_split_characters() {
    let mut s = Utf8Stream::new();
    let bytes = "é🦀".as_bytes();
    let mut out = String::new();
    for b in bytes {
        out.push_str(&s.push(&[*b]));
    }
    assert_eq!(out, "é🦀");
    assert_eq!(s.push(&[0xff, b'a']), "\u{FFFD}a");
    assert_eq!(s.push(&[0xe2, 0x82]), "");
    assert_eq!(s.finish(), "\u{FFFD}");
}
