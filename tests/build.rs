//! `convert build`: recipes in manifests/ build to their expected digests, whatever the
//! thread count; drift is named; a failing gate publishes nothing; bad recipes are named
//! errors before any work; two builds on one output: one wins.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn convert(args: &[&str]) -> Output {
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

fn tiny() -> PathBuf {
    common::repo().join("testdata/ternary/minicpm-tiny-tq2_0.gguf")
}

/// A recipe on the tiny MiniCPM in `dir` with `body` after the header and source.
fn recipe(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(
        &p,
        format!(
            "format = \"lowbit-recipe/1\"\nname = \"{name}\"\n\n[source]\nfile = \"{}\"\nsize = 694112\nsha256 = \"f0ba90f0d9a84e571fad1896dfa082cde593ca750df3f394945612c9291e72bf\"\nobtain = \"committed\"\n\n{body}",
            tiny().display()
        ),
    )
    .unwrap();
    p
}

/// The committed recipe builds to its expected digests with 1 and 2 threads and on each CPU
/// path (`LOWBIT_ISA` caps it: portable, AVX2, the best this CPU has), byte for byte (every
/// artifact file and the provenance), and the provenance names the bundle's digest, the
/// recipe's SHA256 and the source's.
#[test]
fn committed_tiny_recipe_builds_to_its_digests_whatever_the_threads_and_isa() {
    let r = common::repo().join("manifests/minicpm-tiny.toml");
    let tmp = tempfile::tempdir().unwrap();
    let mut trees = Vec::new();
    for (threads, isa) in [("1", ""), ("2", ""), ("2", "portable"), ("2", "avx2")] {
        let out = tmp.path().join(format!("t{threads}{isa}"));
        let json = tmp.path().join(format!("t{threads}{isa}.json"));
        let o = Command::new(env!("CARGO_BIN_EXE_convert"))
            .env("LOWBIT_ISA", isa)
            .args([
                "--threads",
                threads,
                "build",
                r.to_str().unwrap(),
                "--check",
                "-q",
                "--json",
                json.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "threads {threads} isa {isa:?}: {}",
            text(&o)
        );
        trees.push(out.join("minicpm-tiny"));
    }
    let files = |d: &Path| -> Vec<(PathBuf, Vec<u8>)> {
        let mut v = Vec::new();
        let mut stack = vec![d.to_path_buf()];
        while let Some(p) = stack.pop() {
            for e in std::fs::read_dir(&p).unwrap() {
                let e = e.unwrap().path();
                if e.is_dir() {
                    stack.push(e);
                } else {
                    v.push((
                        e.strip_prefix(d).unwrap().to_path_buf(),
                        std::fs::read(&e).unwrap(),
                    ));
                }
            }
        }
        v.sort();
        v
    };
    let a = files(&trees[0]);
    for t in &trees[1..] {
        let b = files(t);
        assert_eq!(a.len(), b.len());
        for ((pa, ba), (pb, bb)) in a.iter().zip(&b) {
            assert_eq!(pa, pb);
            assert!(ba == bb, "{} differs in {}", pa.display(), t.display());
        }
    }
    let prov: serde_json::Value =
        serde_json::from_slice(&std::fs::read(trees[0].join("ternary.provenance.json")).unwrap())
            .unwrap();
    let recipe: toml::Table = toml::from_str(&std::fs::read_to_string(&r).unwrap()).unwrap();
    assert_eq!(prov["_type"], "https://in-toto.io/Statement/v1");
    assert_eq!(prov["predicateType"], "https://slsa.dev/provenance/v1");
    assert_eq!(
        prov["subject"][0]["digest"]["sha256"].as_str().unwrap(),
        recipe["expected"]["ternary"].as_str().unwrap()
    );
    assert_eq!(
        prov["predicate"]["buildDefinition"]["externalParameters"]["recipe"]["sha256"]
            .as_str()
            .unwrap(),
        lowbit::util::sha256_file(&r).unwrap()
    );
    assert_eq!(
        prov["predicate"]["buildDefinition"]["resolvedDependencies"][0]["digest"]["sha256"],
        "f0ba90f0d9a84e571fad1896dfa082cde593ca750df3f394945612c9291e72bf"
    );
    // The smoke gates ran: the text generated and the speeds measured are in the report.
    let rep: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("t1.json")).unwrap()).unwrap();
    let gates = rep[0]["gates"].as_array().unwrap();
    let bench = gates
        .iter()
        .find(|g| g["what"] == "gate bench ternary")
        .unwrap();
    assert!(
        bench["report"]["decode_tokens_per_second"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(
        bench["summary"].as_str().unwrap().contains("tok/s"),
        "{bench}"
    );
    let run = gates
        .iter()
        .find(|g| g["what"] == "gate run ternary")
        .unwrap();
    assert_eq!(run["passed"], true, "{run}");
}

/// --update writes the expectations and the lock file; a changed step then drifts under
/// --check: exit 1, the drift names the files and tensors that differ, nothing published.
#[test]
fn drift_is_named_and_nothing_is_published() {
    let tmp = tempfile::tempdir().unwrap();
    let step = |bits: &str| {
        format!(
            "[[step]]\nartifact = \"pal\"\nop = \"palettize\"\nargs = [\"--bits\", \"{bits}\", \"--min-elements\", \"0\", \"--group-size\", \"2\"]\n"
        )
    };
    let r = recipe(tmp.path(), "d", &step("8"));
    // No [expected] yet: the build passes and says the digest was not checked (not "ok").
    let out0 = tmp.path().join("o0");
    let o = convert(&[
        "build",
        r.to_str().unwrap(),
        "-q",
        "-o",
        out0.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("not checked: the recipe has no [expected] entry")
            && !text(&o).contains(" ok\n"),
        "{}",
        text(&o)
    );
    let out1 = tmp.path().join("o1");
    let o = convert(&[
        "build",
        r.to_str().unwrap(),
        "--update",
        "-q",
        "-o",
        out1.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let body = std::fs::read_to_string(&r).unwrap();
    assert!(
        body.contains("[expected]") && body.contains("pal = \""),
        "{body}"
    );
    assert!(tmp.path().join("d.lock.json").exists());
    // Same recipe: --check passes.
    let out2 = tmp.path().join("o2");
    let o = convert(&[
        "build",
        r.to_str().unwrap(),
        "-q",
        "-o",
        out2.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    // 6 bits instead of 8, the expectation kept.
    std::fs::write(&r, body.replace("\"8\"", "\"6\"")).unwrap();
    let out3 = tmp.path().join("o3");
    let rep = tmp.path().join("rep.json");
    let o = convert(&[
        "build",
        r.to_str().unwrap(),
        "-q",
        "-o",
        out3.to_str().unwrap(),
        "--json",
        rep.to_str().unwrap(),
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("DRIFT"), "{t}");
    assert!(t.contains("file weights.bin"), "{t}");
    assert!(t.contains("tensor blk.0."), "{t}");
    assert!(!out3.join("d").exists(), "a drifted build was published");
    let leftovers: Vec<_> = std::fs::read_dir(&out3).unwrap().collect();
    assert!(leftovers.is_empty(), "staging left behind: {leftovers:?}");
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&rep).unwrap()).unwrap();
    assert_eq!(j[0]["passed"], false);
    assert!(!j[0]["digests"][0]["drift"].as_array().unwrap().is_empty());
}

/// A failing gate: exit 1, `passed: false` with the gate's own report, nothing published, the
/// recipe's expectations untouched under --update.
#[test]
fn a_failing_gate_publishes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let body = "[[step]]\nartifact = \"pack\"\nop = \"pack\"\n\n[[step]]\nartifact = \"pal\"\nop = \"palettize\"\nargs = [\"--bits\", \"2\", \"--min-elements\", \"0\"]\n\n[[gate]]\nop = \"validate\"\nartifact = \"pal\"\nreference = \"pack\"\nargs = [\"--max-prob-err\", \"0.0001\", \"--gen-tokens\", \"4\"]\n";
    let r = recipe(tmp.path(), "g", body);
    let before = std::fs::read_to_string(&r).unwrap();
    let out = tmp.path().join("o");
    let rep = tmp.path().join("rep.json");
    let o = convert(&[
        "build",
        r.to_str().unwrap(),
        "--update",
        "-q",
        "-o",
        out.to_str().unwrap(),
        "--json",
        rep.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(!out.join("g").exists());
    assert_eq!(std::fs::read_to_string(&r).unwrap(), before);
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&rep).unwrap()).unwrap();
    assert_eq!(j[0]["passed"], false);
    assert_eq!(j[0]["gates"][0]["passed"], false);
    assert_eq!(
        j[0]["gates"][0]["report"]["passed"], false,
        "{}",
        j[0]["gates"][0]
    );
}

/// Bad recipes: each a named error (exit 2) before any work.
#[test]
fn bad_recipes_are_named_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let pack = "[[step]]\nartifact = \"a\"\nop = \"pack\"\n";
    let cases: Vec<(PathBuf, &str)> = vec![
        (recipe(d, "unknown", &format!("{pack}colour = \"red\"\n")), "unknown field `colour`"),
        (recipe(d, "input", "[[step]]\nartifact = \"a\"\nop = \"pack\"\ninput = \"b\"\n"), "input \"b\" is no artifact"),
        (
            recipe(d, "cycle", "[[step]]\nartifact = \"a\"\nop = \"palettize\"\ninput = \"b\"\n[[step]]\nartifact = \"b\"\nop = \"palettize\"\ninput = \"a\"\n"),
            "a cycle among the steps",
        ),
        (recipe(d, "twice", &format!("{pack}{pack}")), "two steps write the artifact \"a\""),
        (
            recipe(d, "gate", &format!("{pack}[[gate]]\nop = \"eval\"\nartifact = \"a\"\n")),
            "needs a reference artifact",
        ),
        (
            recipe(d, "bench", &format!("{pack}[[gate]]\nop = \"bench\"\nartifact = \"a\"\nreference = \"a\"\n")),
            "it runs one bundle and takes none",
        ),
        (
            recipe(d, "help", &format!("{pack}[[gate]]\nop = \"run\"\nartifact = \"a\"\nargs = [\"--help\"]\n")),
            "--help prints and exits without checking anything",
        ),
        (
            recipe(d, "flag", &format!("{pack}[[gate]]\nop = \"run\"\nartifact = \"a\"\nargs = [\"--prompt\", \"Hi\", \"--bogus\"]\n")),
            "gate run a: its flags do not parse: unexpected argument '--bogus'",
        ),
        (
            recipe(d, "stepflag", "[[step]]\nartifact = \"a\"\nop = \"palettize\"\nargs = [\"--bits\", \"9\", \"--colour\"]\n"),
            "step a: its flags do not parse",
        ),
        (
            recipe(d, "threads", &format!("{pack}[[gate]]\nop = \"bench\"\nartifact = \"a\"\nargs = [\"--threads\", \"0\"]\n")),
            "gate bench a: its flags do not parse: invalid value '0' for '--threads <THREADS>': must be between 1 and 1024",
        ),
        (
            recipe(d, "benchjson", &format!("{pack}[[gate]]\nop = \"bench\"\nartifact = \"a\"\nargs = [\"--json\"]\n")),
            "--json is set by the build",
        ),
        (
            recipe(d, "deq", &format!("{pack}[[step]]\nartifact = \"f\"\nop = \"dequantize\"\ninput = \"a\"\n[[gate]]\nop = \"bench\"\nartifact = \"f\"\n")),
            "is a dequantize step's safetensors file; gates take bundles",
        ),
        (recipe(d, "expect", &format!("{pack}[expected]\nz = \"00\"\n")), "expected.z: no such artifact"),
        (recipe(d, "output", "[[step]]\nartifact = \"a\"\nop = \"pack\"\nargs = [\"-o\", \"x\"]\n"), "-o is set by the build"),
        (recipe(d, "nosteps", ""), "no [[step]]"),
    ];
    for (r, want) in &cases {
        let out = d.join("out");
        let o = convert(&[
            "build",
            r.to_str().unwrap(),
            "-q",
            "-o",
            out.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(2), "{}: {}", r.display(), text(&o));
        assert!(text(&o).contains(want), "{}: {}", r.display(), text(&o));
        assert!(
            text(&o).contains(r.to_str().unwrap()),
            "names the recipe: {}",
            text(&o)
        );
    }
    // A name that is not one folder under -o (it would publish outside it, or nowhere):
    // refused before any work, nothing published.
    for (i, bad_name) in ["../escape", "/tmp/abs", "a/b", "", ".hidden"]
        .iter()
        .enumerate()
    {
        let r = recipe(d, &format!("badname{i}"), pack);
        let text_of = std::fs::read_to_string(&r).unwrap().replacen(
            &format!("name = \"badname{i}\""),
            &format!("name = {bad_name:?}"),
            1,
        );
        std::fs::write(&r, text_of).unwrap();
        let out = d.join(format!("nout{i}"));
        let o = convert(&[
            "build",
            r.to_str().unwrap(),
            "-q",
            "-o",
            out.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(2), "{bad_name:?}: {}", text(&o));
        assert!(
            text(&o).contains(&format!("name {bad_name:?}")),
            "{bad_name:?}: {}",
            text(&o)
        );
        assert!(
            !out.exists() && !d.join("escape").exists(),
            "{bad_name:?} published"
        );
    }
    // --json over the signing key given with --key: refused, the key untouched.
    let key = d.join("sk");
    let o = convert(&["keygen", "-o", key.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let before = std::fs::read(&key).unwrap();
    let r = recipe(d, "jsonkey", pack);
    let o = convert(&[
        "build",
        r.to_str().unwrap(),
        "-q",
        "-o",
        d.join("kout").to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
        "--json",
        key.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("is an input of this command"),
        "{}",
        text(&o)
    );
    assert_eq!(std::fs::read(&key).unwrap(), before, "the key was written");
    // --json over the recipe itself, or where a recipe publishes: refused before any work,
    // the recipe untouched.
    let r = recipe(d, "jsonover", pack);
    let before = std::fs::read(&r).unwrap();
    let out = d.join("jout");
    std::fs::create_dir(&out).unwrap();
    for (json, want) in [
        (r.clone(), "is an input of this command"),
        (
            out.join("jsonover"),
            "that is where recipe \"jsonover\" publishes",
        ),
    ] {
        let o = convert(&[
            "build",
            r.to_str().unwrap(),
            "-q",
            "-o",
            out.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains(want), "{}", text(&o));
        assert_eq!(std::fs::read(&r).unwrap(), before);
        assert!(!out.join("jsonover").exists());
    }
    // The source: missing, then another file.
    let r = recipe(d, "src", pack);
    let body = std::fs::read_to_string(&r).unwrap();
    std::fs::write(
        &r,
        body.replace(tiny().to_str().unwrap(), "/nonexistent/x.gguf"),
    )
    .unwrap();
    let o = convert(&[
        "build",
        r.to_str().unwrap(),
        "-o",
        d.join("o").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("obtain it with: committed"),
        "{}",
        text(&o)
    );
    std::fs::write(&r, body.replace("f0ba90f0", "f0ba90f1")).unwrap();
    let o = convert(&[
        "build",
        r.to_str().unwrap(),
        "-o",
        d.join("o").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("the recipe pins f0ba90f1"),
        "{}",
        text(&o)
    );
    // An output that exists.
    let r = recipe(d, "exists", pack);
    std::fs::create_dir_all(d.join("o2/exists")).unwrap();
    let o = convert(&[
        "build",
        r.to_str().unwrap(),
        "-o",
        d.join("o2").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("already exists"), "{}", text(&o));
}

/// Two builds of one recipe into one output at once: one publishes, the other fails; the
/// published tree is one build's, whole.
#[test]
fn two_builds_on_one_output_one_wins() {
    let tmp = tempfile::tempdir().unwrap();
    let r = recipe(
        tmp.path(),
        "race",
        "[[step]]\nartifact = \"a\"\nop = \"gguf-to-ternary\"\n",
    );
    let out = tmp.path().join("o");
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_convert"))
            .args([
                "build",
                r.to_str().unwrap(),
                "-q",
                "-o",
                out.to_str().unwrap(),
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let ok = [a.status.success(), b.status.success()];
    assert_eq!(
        ok.iter().filter(|&&x| x).count(),
        1,
        "{}\n{}",
        text(&a),
        text(&b)
    );
    let o = convert(&["verify", out.join("race/a.bundle").to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["race".to_string()], "leftovers: {names:?}");
}

/// Every recipe in manifests/ is valid under schemas/recipe.v1.schema.json and loads.
#[test]
fn committed_recipes_match_the_schema() {
    let repo = common::repo();
    let schema: serde_json::Value =
        serde_json::from_slice(&std::fs::read(repo.join("schemas/recipe.v1.schema.json")).unwrap())
            .unwrap();
    let v = jsonschema::validator_for(&schema).unwrap();
    let mut n = 0;
    for e in std::fs::read_dir(repo.join("manifests")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let t: toml::Value = toml::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            let j = serde_json::to_value(&t).unwrap();
            let errs: Vec<String> = v.iter_errors(&j).map(|e| e.to_string()).collect();
            assert!(errs.is_empty(), "{}: {errs:?}", p.display());
            let r = lowbit::build::Recipe::load(&p).unwrap();
            // The lock file beside it records the same digests, artifact for artifact.
            let lock: serde_json::Value =
                serde_json::from_slice(&std::fs::read(lowbit::build::lock_path(&p)).unwrap())
                    .unwrap();
            let locked: std::collections::BTreeMap<String, String> = lock
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v["bundle_digest"].as_str().unwrap().to_string()))
                .collect();
            assert_eq!(
                locked,
                r.expected,
                "{}: lock and [expected] differ",
                p.display()
            );
            n += 1;
        }
    }
    assert!(n >= 3);
}

/// `make test` builds the test models' recipes with --check: SmolLM2 packed (verified against
/// the GGUF) and palettized at 8 and 4 bits (each verified, gated by eval against the pack,
/// run and benched).
#[test]
fn smollm2_recipe_builds_to_its_digests() {
    let (Some(_), Some(_)) = (
        common::model("SmolLM2-135M-Instruct.Q4_1.gguf"),
        common::cache_file("eval/botchan.txt", "eval-data"),
    ) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let r = common::repo().join("manifests/smollm2.toml");
    let o = convert(&[
        "build",
        r.to_str().unwrap(),
        "--check",
        "-q",
        "-o",
        tmp.path().to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    eprintln!("{}", String::from_utf8_lossy(&o.stdout));
}

/// A change that touches only the manifest (`--context`) drifts too (the version-2 digest
/// covers the manifest), named by its dotted field.
#[test]
fn a_manifest_only_change_drifts_by_field() {
    let tmp = tempfile::tempdir().unwrap();
    let r = recipe(
        tmp.path(),
        "m",
        "[[step]]\nartifact = \"pack\"\nop = \"pack\"\n",
    );
    let o = convert(&[
        "build",
        r.to_str().unwrap(),
        "--update",
        "-q",
        "-o",
        tmp.path().join("o1").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let body = std::fs::read_to_string(&r).unwrap();
    std::fs::write(
        &r,
        body.replace(
            "op = \"pack\"\n",
            "op = \"pack\"\nargs = [\"--context\", \"256\"]\n",
        ),
    )
    .unwrap();
    let o = convert(&[
        "build",
        r.to_str().unwrap(),
        "-q",
        "-o",
        tmp.path().join("o2").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("manifest field model.n_ctx: 512 -> 256"),
        "{}",
        text(&o)
    );
}

/// `--key` signs every bundle before publishing: `verify --trusted-key` accepts each, another
/// key is refused; a recipe's `[sign] key_env` without the variable set is an error before any
/// work.
#[test]
fn build_signs_with_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let key = tmp.path().join("k");
    let o = convert(&["keygen", "-o", key.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let other = tmp.path().join("other");
    assert!(convert(&["keygen", "-o", other.to_str().unwrap()])
        .status
        .success());
    let r = recipe(
        tmp.path(),
        "s",
        "[[step]]\nartifact = \"pack\"\nop = \"pack\"\n",
    );
    let out = tmp.path().join("o");
    let o = convert(&[
        "build",
        r.to_str().unwrap(),
        "-q",
        "--key",
        key.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let b = out.join("s/pack.bundle");
    let pubk = format!("{}.pub", key.display());
    let o = convert(&["verify", b.to_str().unwrap(), "--trusted-key", &pubk]);
    assert!(o.status.success(), "{}", text(&o));
    let o = convert(&[
        "verify",
        b.to_str().unwrap(),
        "--trusted-key",
        &format!("{}.pub", other.display()),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    // [sign] key_env not set.
    let body = std::fs::read_to_string(&r).unwrap();
    std::fs::write(
        &r,
        format!("{body}\n[sign]\nkey_env = \"LOWBIT_TEST_NO_SUCH_KEY\"\n"),
    )
    .unwrap();
    let o = convert(&[
        "build",
        r.to_str().unwrap(),
        "-q",
        "-o",
        tmp.path().join("o2").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("LOWBIT_TEST_NO_SUCH_KEY"), "{}", text(&o));
    assert!(!tmp.path().join("o2/s").exists());
}

/// `make test` builds the gguf-py TQ2_0 of SmolLM2 (real weights through the ternary path) with
/// --check: recovered and packed, both verified bit for bit, validated against each other, run
/// and benched; the closing summary names every artifact and its figures.
#[test]
fn smollm2_tq2_recipe_builds_to_its_digests() {
    if common::cache_file("ternary/smollm2-tq2_0-gguf-py.gguf", "ternary-real").is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let r = common::repo().join("manifests/smollm2-tq2.toml");
    let o = convert(&[
        "build",
        r.to_str().unwrap(),
        "--check",
        "-o",
        tmp.path().to_str().unwrap(),
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for want in [
        "smollm2-tq2/ternary  digest 14c206f8d81aa2ed",
        "smollm2-tq2/pack  digest 75c7849269a6605a",
        "26542080 ternary elements compared, 0 mismatched, max |diff| 0 -> PASSED",
        "argmax agreement 1.0000",
        "generated at",
        "smollm2-tq2: passed, published",
    ] {
        assert!(t.contains(want), "expected {want:?} in:\n{t}");
    }
}

/// `run --max-tokens 0` runs the prompt and generates nothing (regression: the count
/// underflowed and generation ran on to the end of the context), so a run gate given it
/// reports what it did: no text.
#[test]
fn run_with_max_tokens_zero_generates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let b = tmp.path().join("t.bundle");
    let o = convert(&[
        "gguf-to-ternary",
        "-q",
        "-o",
        b.to_str().unwrap(),
        tiny().to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    for sampling in [&[][..], &["--temperature", "1", "--ignore-eos"][..]] {
        let mut a = vec![
            "run",
            b.to_str().unwrap(),
            "--prompt",
            "Hi",
            "--max-tokens",
            "0",
            "--print-ids",
        ];
        a.extend(sampling);
        let o = convert(&a);
        assert!(o.status.success(), "{}", text(&o));
        // (a newline ends the output, as after any generation)
        assert!(
            o.stdout.iter().all(|b| b.is_ascii_whitespace()),
            "{}",
            text(&o)
        );
        assert!(text(&o).contains("generated ids: []"), "{}", text(&o));
    }
}
