//! `convert build`: declarative artifact recipes for CI (TOML, `schemas/recipe.v1.schema.json`).
//!
//! A recipe names a pinned source (file, size, SHA256, how to obtain it: the build never
//! downloads), the steps that make named artifacts from it or from each other (`pack`,
//! `gguf-to-ternary`, `palettize`, `dequantize`), the gates that must pass (`verify`,
//! `validate`, `eval`, and the smoke gates `run` and `bench`: the bundle loads and generates),
//! and each artifact's expected bundle digest. [`Recipe::load`] checks
//! everything it can before any work: unknown keys, the format, artifact names (unique, no
//! step writes two), inputs that exist, no cycle, gate and expectation references, the SHA256
//! syntax. [`build`] checks the source, runs the steps in dependency order and the gates into
//! a staging directory beside the output, and publishes the directory only when every gate
//! passed and (under `--check`) every digest matched: a failure publishes nothing.
//!
//! Each step and gate runs the `convert` binary itself (`std::env::current_exe`) with the
//! flags the recipe gives, so a recipe step is exactly a documented command line; the report
//! records each command.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

/// The recipe format this build reads.
pub const FORMAT: &str = "lowbit-recipe/1";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    #[error("recipe {path}: {detail}")]
    Recipe { path: PathBuf, detail: String },
    #[error("recipe {recipe}: source {path}: {detail}")]
    Source {
        recipe: PathBuf,
        path: PathBuf,
        detail: String,
    },
    #[error("{0}")]
    Output(#[from] crate::util::OutputError),
    #[error("{what}: {detail}")]
    Step { what: String, detail: String },
}

/// A recipe file.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    pub format: String,
    pub name: String,
    pub source: Source,
    #[serde(default, rename = "step")]
    pub steps: Vec<Step>,
    #[serde(default, rename = "gate")]
    pub gates: Vec<Gate>,
    /// Sign every bundle with the Ed25519 key whose file the environment variable `key_env`
    /// names (the key itself is never in a recipe); `convert build --key` does the same.
    #[serde(default)]
    pub sign: Option<SignSpec>,
    /// Artifact name -> expected bundle digest (SHA256 hex).
    #[serde(default)]
    pub expected: BTreeMap<String, String>,
    #[serde(skip)]
    pub path: PathBuf,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SignSpec {
    /// The environment variable holding the private key file's path (`convert keygen`).
    pub key_env: String,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// The file: absolute, relative to the recipe's folder, or starting with `$LOWBIT_CACHE/`.
    pub file: String,
    pub size: u64,
    pub sha256: String,
    /// How to obtain it (a make target or a package spec), for the error when it is missing.
    pub obtain: String,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    Pack,
    GgufToTernary,
    Palettize,
    Dequantize,
}

/// One step: makes `artifact` from `input` (`source` or an earlier artifact).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub artifact: String,
    pub op: Op,
    #[serde(default = "source_name")]
    pub input: String,
    /// Further `convert` flags of the step, e.g. `["--bits", "8", "--group-size", "32"]`
    /// (never `-o` or the input: the build sets them).
    #[serde(default)]
    pub args: Vec<String>,
}

fn source_name() -> String {
    "source".into()
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum GateOp {
    Verify,
    Validate,
    Eval,
    /// `convert run BUNDLE ARGS`: passes when the bundle loads and generates (exit 0); the
    /// report keeps the text.
    Run,
    /// `convert bench BUNDLE --json ARGS`: passes when it runs; the report keeps the speeds
    /// (never a timed assertion: speed gates live in the benchmarks).
    Bench,
}

/// One gate on an artifact, against the source (`verify --source`) or another artifact
/// (`validate`/`eval --reference`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Gate {
    pub op: GateOp,
    pub artifact: String,
    /// verify: `source` (compare with the source file); validate/eval: an artifact; run/bench:
    /// none.
    #[serde(default)]
    pub reference: Option<String>,
    /// Further flags, e.g. `["--maxerr", "0"]` or `["--text", "$LOWBIT_CACHE/eval/botchan.txt",
    /// "--max-kld", "0.01"]` (`$LOWBIT_CACHE/` expands).
    #[serde(default)]
    pub args: Vec<String>,
}

fn bad(path: &Path, detail: impl Into<String>) -> BuildError {
    BuildError::Recipe {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LOWBIT_CACHE") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    Path::new(&home).join(".cache/lowbit")
}

/// A step's or gate's flag with a leading `$LOWBIT_CACHE/` or `$RECIPE_DIR/` (the recipe's
/// folder) expanded.
fn expand_arg(a: &str, recipe_dir: &Path) -> String {
    if let Some(rest) = a.strip_prefix("$LOWBIT_CACHE/") {
        cache_dir().join(rest).to_string_lossy().into_owned()
    } else if let Some(rest) = a.strip_prefix("$RECIPE_DIR/") {
        recipe_dir.join(rest).to_string_lossy().into_owned()
    } else {
        a.to_string()
    }
}

/// `$LOWBIT_CACHE/...` expanded; other relative paths are relative to `base`.
fn expand(p: &str, base: &Path) -> PathBuf {
    if let Some(rest) = p.strip_prefix("$LOWBIT_CACHE/") {
        cache_dir().join(rest)
    } else if Path::new(p).is_absolute() {
        PathBuf::from(p)
    } else {
        base.join(p)
    }
}

impl Recipe {
    /// Reads and checks a recipe (see the module doc); every error names the recipe and what
    /// is wrong in it.
    pub fn load(path: &Path) -> Result<Recipe, BuildError> {
        let text = std::fs::read_to_string(path).map_err(|e| bad(path, e.to_string()))?;
        let mut r: Recipe = toml::from_str(&text).map_err(|e| bad(path, e.to_string()))?;
        r.path = path.to_path_buf();
        r.check()?;
        Ok(r)
    }

    fn check(&self) -> Result<(), BuildError> {
        let p = &self.path;
        if self.format != FORMAT {
            return Err(bad(
                p,
                format!("format {:?}: this build reads {FORMAT:?}", self.format),
            ));
        }
        if !is_sha256(&self.source.sha256) {
            return Err(bad(p, "source.sha256: not 64 lowercase hex digits"));
        }
        // The name is the folder published under `-o`: one path component of its own.
        if !valid_name(&self.name) {
            return Err(bad(
                p,
                format!(
                    "name {:?}: use letters, digits, '-', '_', '.' (it names the folder under -o; \
                     not starting with '.')",
                    self.name
                ),
            ));
        }
        if self.steps.is_empty() {
            return Err(bad(p, "no [[step]]: a recipe builds at least one artifact"));
        }
        let mut names = BTreeSet::new();
        for s in &self.steps {
            if s.artifact == "source" || !valid_name(&s.artifact) {
                return Err(bad(
                    p,
                    format!(
                        "artifact name {:?}: use letters, digits, '-', '_', '.' (not \"source\")",
                        s.artifact
                    ),
                ));
            }
            if !names.insert(s.artifact.clone()) {
                return Err(bad(
                    p,
                    format!("two steps write the artifact {:?}", s.artifact),
                ));
            }
            if let Some(a) = s
                .args
                .iter()
                .find(|a| matches!(a.as_str(), "-o" | "--output") || a.starts_with("--output="))
            {
                return Err(bad(
                    p,
                    format!("step {:?}: {a} is set by the build", s.artifact),
                ));
            }
            if let Some(a) = s.args.iter().find(|a| is_info_flag(a)) {
                return Err(bad(
                    p,
                    format!(
                        "step {:?}: {a} prints and exits without building anything",
                        s.artifact
                    ),
                ));
            }
        }
        for s in &self.steps {
            if s.input != "source" && !names.contains(&s.input) {
                return Err(bad(
                    p,
                    format!(
                        "step {:?}: input {:?} is no artifact of this recipe",
                        s.artifact, s.input
                    ),
                ));
            }
        }
        self.order()?;
        for g in &self.gates {
            if !names.contains(&g.artifact) {
                return Err(bad(
                    p,
                    format!("gate {:?}: no artifact {:?}", g.op, g.artifact),
                ));
            }
            for a in [Some(&g.artifact), g.reference.as_ref()]
                .into_iter()
                .flatten()
            {
                if self.step(a).map(|s| s.op) == Some(Op::Dequantize) {
                    return Err(bad(
                        p,
                        format!(
                            "{:?} gate on {:?}: {a:?} is a dequantize step's safetensors file; gates take bundles",
                            g.op, g.artifact
                        ),
                    ));
                }
            }
            if let Some(a) = g.args.iter().find(|a| {
                is_info_flag(a)
                    || (a.as_str() == "--json" || a.starts_with("--json="))
                        && g.op != GateOp::Verify
            }) {
                return Err(bad(
                    p,
                    format!(
                        "{:?} gate on {:?}: {a} {}",
                        g.op,
                        g.artifact,
                        if is_info_flag(a) {
                            "prints and exits without checking anything"
                        } else {
                            "is set by the build"
                        }
                    ),
                ));
            }
            match (g.op, g.reference.as_deref()) {
                (GateOp::Verify, None | Some("source")) => {}
                (GateOp::Run | GateOp::Bench, None) => {}
                (GateOp::Run | GateOp::Bench, Some(r)) => {
                    return Err(bad(
                        p,
                        format!("{:?} gate on {:?}: reference {r:?}: it runs one bundle and takes none", g.op, g.artifact),
                    ))
                }
                (GateOp::Verify, Some(r)) => {
                    return Err(bad(
                        p,
                        format!("verify gate on {:?}: reference {r:?}: verify compares with the source only", g.artifact),
                    ))
                }
                (_, None) => {
                    return Err(bad(
                        p,
                        format!("{:?} gate on {:?}: needs a reference artifact", g.op, g.artifact),
                    ))
                }
                (_, Some(r)) if !names.contains(r) => {
                    return Err(bad(
                        p,
                        format!("{:?} gate on {:?}: no artifact {r:?}", g.op, g.artifact),
                    ))
                }
                _ => {}
            }
        }
        for (a, d) in &self.expected {
            if !names.contains(a) {
                return Err(bad(p, format!("expected.{a}: no such artifact")));
            }
            if !is_sha256(d) {
                return Err(bad(p, format!("expected.{a}: not 64 lowercase hex digits")));
            }
            if self.step(a).map(|s| s.op) == Some(Op::Dequantize) {
                return Err(bad(
                    p,
                    format!(
                        "expected.{a}: a dequantize step makes a safetensors file, not a bundle"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn step(&self, artifact: &str) -> Option<&Step> {
        self.steps.iter().find(|s| s.artifact == artifact)
    }

    /// The steps in dependency order (each after its input); a cycle is an error naming it.
    pub fn order(&self) -> Result<Vec<&Step>, BuildError> {
        let mut done: BTreeSet<&str> = BTreeSet::new();
        let mut out = Vec::new();
        while out.len() < self.steps.len() {
            let before = out.len();
            for s in &self.steps {
                if !done.contains(s.artifact.as_str())
                    && (s.input == "source" || done.contains(s.input.as_str()))
                {
                    done.insert(&s.artifact);
                    out.push(s);
                }
            }
            if out.len() == before {
                let left: Vec<&str> = self
                    .steps
                    .iter()
                    .filter(|s| !done.contains(s.artifact.as_str()))
                    .map(|s| s.artifact.as_str())
                    .collect();
                return Err(bad(
                    &self.path,
                    format!("a cycle among the steps {left:?} (each is an input of another)"),
                ));
            }
        }
        Ok(out)
    }

    fn base(&self) -> PathBuf {
        crate::util::parent_dir(&self.path)
    }

    /// The source file's path.
    pub fn source_path(&self) -> PathBuf {
        expand(&self.source.file, &self.base())
    }

    /// Checks the source's size and SHA256 (the file read once).
    pub fn check_source(&self) -> Result<PathBuf, BuildError> {
        let p = self.source_path();
        let err = |detail: String| BuildError::Source {
            recipe: self.path.clone(),
            path: p.clone(),
            detail,
        };
        let m = std::fs::metadata(&p)
            .map_err(|e| err(format!("{e}; obtain it with: {}", self.source.obtain)))?;
        if m.len() != self.source.size {
            return Err(err(format!(
                "{} bytes, the recipe pins {}",
                m.len(),
                self.source.size
            )));
        }
        let got = crate::util::sha256_file(&p).map_err(|e| err(e.to_string()))?;
        if got != self.source.sha256 {
            return Err(err(format!(
                "SHA256 {got}, the recipe pins {}",
                self.source.sha256
            )));
        }
        Ok(p)
    }
}

/// `--help` and `--version` (and their short forms): a command given one prints and exits 0
/// without doing its work, so a step or gate holding one would pass having done nothing.
fn is_info_flag(a: &str) -> bool {
    matches!(a, "-h" | "--help" | "-V" | "--version")
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// How the digests are judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A digest that differs from the recipe's expectation fails the build.
    Check,
    /// The recipe's expectations are rewritten with the digests built.
    Update,
}

/// One command the build ran.
#[derive(Clone, Debug, Serialize)]
pub struct Ran {
    pub what: String,
    pub command: Vec<String>,
    pub passed: bool,
    pub seconds: f64,
    /// The last lines of its output.
    pub output_tail: String,
    /// A gate's JSON report, when it writes one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<serde_json::Value>,
    /// A gate's figures in one line (verify: its verdict; validate: agreement and the largest
    /// probability error; eval: KLD, same-top and perplexity ratio; run: the text; bench:
    /// tokens/s), empty for a step.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub summary: String,
    /// A run gate's generated text (its standard output, whole; bytes that are not UTF-8 as
    /// U+FFFD).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// An artifact's digest against the recipe.
#[derive(Clone, Debug, Serialize)]
pub struct Digest {
    pub artifact: String,
    pub digest: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    pub matches: bool,
    /// What differs from the expectation: files, tensors and manifest fields, named (from the
    /// lock file `NAME.lock.json` beside the recipe, written by `--update`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub drift: Vec<String>,
}

/// The report of one recipe.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub recipe: PathBuf,
    pub recipe_sha256: String,
    pub name: String,
    pub source_sha256: String,
    pub output: PathBuf,
    pub steps: Vec<Ran>,
    pub gates: Vec<Ran>,
    pub digests: Vec<Digest>,
    /// Published: every step ran, every gate passed, every digest matched (`--check`).
    pub passed: bool,
    pub published: bool,
    /// Every bundle signed (`signature.json`) before publishing.
    pub signed: bool,
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// What the build keeps of a command's output beside its tail: a JSON report in a file it
/// writes or on its standard output, or its standard output as text (a run gate's).
enum ReportAt<'a> {
    None,
    File(&'a Path),
    Stdout,
    Text,
}

fn run(what: String, exe: &Path, args: Vec<String>, report: ReportAt) -> Ran {
    let t = std::time::Instant::now();
    let o = Command::new(exe).args(&args).output();
    let (passed, out, stdout) = match o {
        Ok(o) => (
            o.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            o.stdout,
        ),
        Err(e) => (
            false,
            format!("cannot run {}: {e}", exe.display()),
            Vec::new(),
        ),
    };
    let text =
        matches!(report, ReportAt::Text).then(|| String::from_utf8_lossy(&stdout).into_owned());
    let report = match report {
        ReportAt::None | ReportAt::Text => None,
        ReportAt::File(p) => std::fs::read(p).ok(),
        ReportAt::Stdout => Some(stdout),
    }
    .and_then(|b| serde_json::from_slice(&b).ok());
    let mut command = vec!["convert".to_string()];
    command.extend(args);
    Ran {
        what,
        command,
        passed,
        seconds: t.elapsed().as_secs_f64(),
        output_tail: tail(&out, 12),
        report,
        summary: String::new(),
        text,
    }
}

/// A gate's figures in one line, from its JSON report or its output (see [`Ran::summary`]).
fn gate_summary(op: GateOp, r: &Ran) -> String {
    if !r.passed {
        // What it failed with: its last line of output (an error, or a gate's verdict).
        let last = r
            .output_tail
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output")
            .trim()
            .to_string();
        if op != GateOp::Eval && op != GateOp::Validate || r.report.is_none() {
            return last;
        }
    }
    let j = r.report.as_ref();
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    match (op, j) {
        (GateOp::Verify, _) => r
            .output_tail
            .lines()
            .rev()
            .find(|l| l.contains("tensors ("))
            .unwrap_or("")
            .trim()
            .to_string(),
        (GateOp::Validate, Some(j)) => format!(
            "argmax agreement {:.4} over {} steps, max |dp| {:.2e}",
            f(&j["argmax_agreement"]),
            j["steps"],
            f(&j["max_prob_err"])
        ),
        (GateOp::Eval, Some(j)) => {
            let mut v = Vec::new();
            let p = &j["perplexity"];
            if !p.is_null() {
                let rf = &p["reference"];
                v.push(format!(
                    "ppl {:.3} ({} positions)",
                    f(&p["ppl"]["value"]),
                    p["scored"]
                ));
                if !rf.is_null() {
                    v.push(format!(
                        "KLD {:.5}, same top {:.2}%, ppl ratio {:.4}",
                        f(&rf["kld"]["value"]),
                        100.0 * f(&rf["same_top"]["value"]),
                        f(&rf["ppl_ratio"]["value"])
                    ));
                }
            }
            if let Some(ts) = j["tasks"].as_array() {
                for t in ts {
                    v.push(format!(
                        "{} accuracy {:.3} ({} examples)",
                        t["task"].as_str().unwrap_or("?"),
                        f(&t["acc"]["value"]),
                        t["examples"]
                    ));
                }
            }
            v.join("; ")
        }
        (GateOp::Bench, Some(j)) => format!(
            "{} prompt tokens at {:.1} tok/s, {} generated at {:.1} tok/s ({}, {} kernel, {} threads)",
            j["prompt_tokens"],
            f(&j["prompt_tokens_per_second"]),
            j["gen_tokens"],
            f(&j["decode_tokens_per_second"]),
            j["backend"].as_str().unwrap_or("?"),
            j["kernel"].as_str().unwrap_or("?"),
            j["threads"]
        ),
        (GateOp::Run, _) => {
            let t = r.text.as_deref().unwrap_or("");
            let t: String = t.split_whitespace().collect::<Vec<_>>().join(" ");
            let mut c: Vec<char> = t.chars().collect();
            if c.len() > 80 {
                c.truncate(80);
                c.push('…');
            }
            format!("{:?}", c.into_iter().collect::<String>())
        }
        _ => String::new(),
    }
}

/// A step's command line after `convert` (and the build's `--threads`).
fn step_argv(s: &Step, recipe_dir: &Path, output: String, input: String) -> Vec<String> {
    let mut a = vec![op_name(s.op).to_string()];
    if s.op != Op::Dequantize {
        a.push("-q".into());
    }
    a.extend(s.args.iter().map(|x| expand_arg(x, recipe_dir)));
    a.extend(["-o".into(), output, input]);
    a
}

/// A gate's command line after `convert` (and the build's `--threads`); `path` gives the file
/// of `source` or an artifact, `json` where a validate or eval gate writes its report.
fn gate_argv(
    g: &Gate,
    recipe_dir: &Path,
    path: &dyn Fn(&str) -> String,
    json: String,
) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    match g.op {
        GateOp::Verify => {
            a.extend(["verify".into(), path(&g.artifact)]);
            if g.reference.is_some() {
                a.extend(["--source".into(), path("source")]);
            }
        }
        GateOp::Validate | GateOp::Eval => {
            a.push(
                if g.op == GateOp::Eval {
                    "eval"
                } else {
                    "validate"
                }
                .into(),
            );
            a.push(path(&g.artifact));
            a.push("--reference".into());
            a.push(path(g.reference.as_deref().expect("checked at load")));
            a.extend(["--json".into(), json]);
            if g.op == GateOp::Eval {
                a.push("-q".into());
            }
        }
        GateOp::Run => a.extend(["run".into(), path(&g.artifact)]),
        GateOp::Bench => a.extend(["bench".into(), path(&g.artifact), "--json".into()]),
    }
    a.extend(g.args.iter().map(|x| expand_arg(x, recipe_dir)));
    a
}

impl Recipe {
    /// Every command the build would run, with placeholder paths (`ARTIFACT.bundle`,
    /// `SOURCE.gguf`, `REPORT.json`): for checking the flags with the command-line parser
    /// before any work. Each as (what, argv after `convert`).
    pub fn planned_commands(&self) -> Vec<(String, Vec<String>)> {
        let dir = self.base();
        let name = |n: &str| -> String {
            match self.step(n) {
                None => "SOURCE.gguf".into(),
                Some(s) if s.op == Op::Dequantize => format!("{n}.safetensors"),
                Some(_) => format!("{n}.bundle"),
            }
        };
        let mut v = Vec::new();
        for s in &self.steps {
            v.push((
                format!("step {}", s.artifact),
                step_argv(s, &dir, name(&s.artifact), name(&s.input)),
            ));
        }
        for g in &self.gates {
            v.push((
                format!("gate {:?} {}", g.op, g.artifact).to_lowercase(),
                gate_argv(g, &dir, &|n: &str| name(n), "REPORT.json".into()),
            ));
        }
        v
    }
}

fn artifact_file(stage: &Path, s: &Step) -> PathBuf {
    match s.op {
        Op::Dequantize => stage.join(format!("{}.safetensors", s.artifact)),
        _ => stage.join(format!("{}.bundle", s.artifact)),
    }
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Pack => "pack",
        Op::GgufToTernary => "gguf-to-ternary",
        Op::Palettize => "palettize",
        Op::Dequantize => "dequantize",
    }
}

/// The lock file beside a recipe: per artifact, the files, tensors and manifest fields a
/// drift report names.
pub fn lock_path(recipe: &Path) -> PathBuf {
    let stem = recipe
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    crate::util::parent_dir(recipe).join(format!("{stem}.lock.json"))
}

/// What the lock file keeps of a bundle: file and tensor SHA256s and the manifest's fields
/// other than those lists.
pub fn lock_entry(bundle: &Path) -> Result<serde_json::Value, BuildError> {
    let m: serde_json::Value = std::fs::read(bundle.join("manifest.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| BuildError::Step {
            what: bundle.display().to_string(),
            detail: "no readable manifest.json".into(),
        })?;
    let mut files = serde_json::Map::new();
    for f in m["files"].as_array().into_iter().flatten() {
        // A format-version-3 weight file is listed by its tensor table's SHA256.
        let digest = f.get("sha256").or_else(|| f.get("tensors_sha256"));
        files.insert(
            f["path"].as_str().unwrap_or("?").to_string(),
            digest.cloned().unwrap_or_default(),
        );
    }
    let mut tensors = serde_json::Map::new();
    for t in m["tensors"].as_array().into_iter().flatten() {
        tensors.insert(
            t["name"].as_str().unwrap_or("?").to_string(),
            t["sha256"].clone(),
        );
    }
    // Manifest fields by dotted path (`model.n_ctx`, `producer.command_line`), so a drift
    // report names the leaf that changed.
    fn flatten(
        prefix: &str,
        v: &serde_json::Value,
        out: &mut serde_json::Map<String, serde_json::Value>,
    ) {
        match v {
            serde_json::Value::Object(o) => {
                for (k, x) in o {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    flatten(&key, x, out);
                }
            }
            other => {
                out.insert(prefix.to_string(), other.clone());
            }
        }
    }
    let mut fields = serde_json::Map::new();
    if let Some(o) = m.as_object() {
        for (k, v) in o {
            if !matches!(k.as_str(), "files" | "tensors" | "kernels") {
                flatten(k, v, &mut fields);
            }
        }
    }
    Ok(serde_json::json!({
        "bundle_digest": m["bundle_digest"],
        "files": files,
        "tensors": tensors,
        "manifest": fields,
    }))
}

/// Names what differs between two lock entries.
pub fn drift(want: &serde_json::Value, got: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for (kind, key) in [
        ("file", "files"),
        ("tensor", "tensors"),
        ("manifest field", "manifest"),
    ] {
        let (w, g) = (want[key].as_object(), got[key].as_object());
        let (Some(w), Some(g)) = (w, g) else { continue };
        for (k, v) in w {
            match g.get(k) {
                None => out.push(format!("{kind} {k}: missing (was {})", short(v))),
                Some(u) if u != v => out.push(format!("{kind} {k}: {} -> {}", short(v), short(u))),
                _ => {}
            }
        }
        for (k, u) in g {
            if !w.contains_key(k) {
                out.push(format!("{kind} {k}: new ({})", short(u)));
            }
        }
    }
    out
}

fn short(v: &serde_json::Value) -> String {
    let s = match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if s.len() > 200 {
        format!("{}...", &s[..197])
    } else {
        s
    }
}

/// The in-toto Statement v1 with a SLSA Provenance v1 predicate for one bundle: subject the
/// bundle (its digest), external parameters the recipe (path and SHA256) and the artifact,
/// resolved dependencies the source file, builder lowbit's version and git revision. No
/// timestamps: the same recipe and binary give the same bytes.
pub fn provenance(
    recipe: &Recipe,
    recipe_sha256: &str,
    artifact: &str,
    digest: &str,
) -> serde_json::Value {
    serde_json::json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{
            "name": format!("{artifact}.bundle"),
            "digest": {"sha256": digest},
        }],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": "urn:lowbit:recipe:v1",
                "externalParameters": {
                    "recipe": {
                        "path": recipe.path.file_name().map(|n| n.to_string_lossy().into_owned()),
                        "sha256": recipe_sha256,
                    },
                    "artifact": artifact,
                },
                "resolvedDependencies": [{
                    "name": Path::new(&recipe.source.file).file_name().map(|n| n.to_string_lossy().into_owned()),
                    "digest": {"sha256": recipe.source.sha256},
                }],
            },
            "runDetails": {
                "builder": {
                    "id": "urn:lowbit:convert-build",
                    "version": {
                        "lowbit": env!("CARGO_PKG_VERSION"),
                        "git_revision": env!("LOWBIT_GIT_REVISION"),
                    },
                },
                "metadata": {},
            },
        },
    })
}

/// Builds `recipe` into `out` (which must not exist): source check, steps, gates, digests,
/// provenance, then one rename of the staging directory into place. `threads` is passed to
/// every command (`--threads`). Returns the report; [`Report::published`] says whether `out`
/// now holds the artifacts.
pub fn build(
    recipe: &Recipe,
    out: &Path,
    mode: Mode,
    threads: Option<usize>,
    key: Option<&ed25519_dalek::SigningKey>,
    progress: &mut dyn FnMut(&str),
) -> Result<Report, BuildError> {
    crate::util::refuse_existing(out)?;
    let recipe_bytes = std::fs::read(&recipe.path).map_err(|e| bad(&recipe.path, e.to_string()))?;
    let recipe_sha256 = crate::util::sha256_hex(&recipe_bytes);
    let order = recipe.order()?;
    progress("checking the source");
    let src = recipe.check_source()?;
    let exe = std::env::current_exe().map_err(|e| BuildError::Step {
        what: "convert".into(),
        detail: e.to_string(),
    })?;
    let recipe_dir = recipe.base();
    let stage = crate::util::StagingDir::beside(out)?;
    let sp = stage.path().to_path_buf();
    let pre = |v: &mut Vec<String>| {
        if let Some(t) = threads {
            v.push("--threads".into());
            v.push(t.to_string());
        }
    };
    let mut report = Report {
        recipe: recipe.path.clone(),
        recipe_sha256: recipe_sha256.clone(),
        name: recipe.name.clone(),
        source_sha256: recipe.source.sha256.clone(),
        output: out.to_path_buf(),
        steps: Vec::new(),
        gates: Vec::new(),
        digests: Vec::new(),
        passed: false,
        published: false,
        signed: false,
    };
    let path_of = |name: &str| -> PathBuf {
        if name == "source" {
            src.clone()
        } else {
            artifact_file(&sp, recipe.step(name).expect("checked at load"))
        }
    };
    for s in &order {
        progress(&format!("step {} ({})", s.artifact, op_name(s.op)));
        let mut a = Vec::new();
        pre(&mut a);
        a.extend(step_argv(
            s,
            &recipe_dir,
            path_of(&s.artifact).to_string_lossy().into_owned(),
            path_of(&s.input).to_string_lossy().into_owned(),
        ));
        let r = run(format!("step {}", s.artifact), &exe, a, ReportAt::None);
        let ok = r.passed;
        report.steps.push(r);
        if !ok {
            return Ok(report);
        }
    }
    for (i, g) in recipe.gates.iter().enumerate() {
        progress(&format!("gate {:?} on {}", g.op, g.artifact));
        let json = sp.join(format!(".gate-{i}.json"));
        let mut a = Vec::new();
        pre(&mut a);
        a.extend(gate_argv(
            g,
            &recipe_dir,
            &|n: &str| path_of(n).to_string_lossy().into_owned(),
            json.to_string_lossy().into_owned(),
        ));
        let at = match g.op {
            GateOp::Validate | GateOp::Eval => ReportAt::File(&json),
            GateOp::Bench => ReportAt::Stdout,
            GateOp::Run => ReportAt::Text,
            GateOp::Verify => ReportAt::None,
        };
        let mut r = run(
            format!("gate {:?} {}", g.op, g.artifact).to_lowercase(),
            &exe,
            a,
            at,
        );
        if g.op == GateOp::Bench && r.passed && r.report.is_none() {
            // Exit 0 without a report: it did not bench (the build's own check, beside the
            // load-time refusal of --help).
            r.passed = false;
            r.output_tail.push_str("\nno bench report on stdout");
        }
        r.summary = gate_summary(g.op, &r);
        let _ = std::fs::remove_file(&json);
        report.gates.push(r);
    }
    let lock_file = lock_path(&recipe.path);
    let lock: serde_json::Value = std::fs::read(&lock_file)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null);
    let mut new_lock = serde_json::Map::new();
    for s in &order {
        if s.op == Op::Dequantize {
            continue;
        }
        let b = path_of(&s.artifact);
        let entry = lock_entry(&b)?;
        let digest = entry["bundle_digest"].as_str().unwrap_or("").to_string();
        let expected = recipe.expected.get(&s.artifact).cloned();
        let matches = match mode {
            Mode::Update => true,
            Mode::Check => expected.as_deref().is_none_or(|e| e == digest),
        };
        let drift_list = if matches || lock[&s.artifact].is_null() {
            Vec::new()
        } else {
            drift(&lock[&s.artifact], &entry)
        };
        std::fs::write(
            sp.join(format!("{}.provenance.json", s.artifact)),
            serde_json::to_vec_pretty(&provenance(recipe, &recipe_sha256, &s.artifact, &digest))
                .expect("json"),
        )
        .map_err(|e| BuildError::Step {
            what: format!("provenance of {}", s.artifact),
            detail: e.to_string(),
        })?;
        new_lock.insert(s.artifact.clone(), entry);
        report.digests.push(Digest {
            artifact: s.artifact.clone(),
            digest,
            expected,
            matches,
            drift: drift_list,
        });
    }
    report.passed = report.steps.iter().all(|r| r.passed)
        && report.gates.iter().all(|r| r.passed)
        && report.digests.iter().all(|d| d.matches);
    if !report.passed {
        return Ok(report);
    }
    if let Some(k) = key {
        for d in &report.digests {
            progress(&format!("signing {}", d.artifact));
            crate::bundle::sign::sign_bundle(&sp.join(format!("{}.bundle", d.artifact)), k)
                .map_err(|e| BuildError::Step {
                    what: format!("signing {}", d.artifact),
                    detail: e.to_string(),
                })?;
        }
        report.signed = true;
    }
    if mode == Mode::Update {
        update_recipe(recipe, &report.digests)?;
        let mut j = serde_json::to_vec_pretty(&serde_json::Value::Object(new_lock)).expect("json");
        j.push(b'\n');
        crate::util::replace_file(&lock_file, &j)?;
    }
    stage.publish(|| std::fs::rename(&sp, out)).map_err(|e| {
        BuildError::Output(crate::util::OutputError::Io {
            path: out.to_path_buf(),
            source: e,
        })
    })?;
    stage.keep();
    report.published = true;
    Ok(report)
}

/// Rewrites the recipe's `[expected]` table with the digests built (other text unchanged),
/// through a temporary file renamed over it.
fn update_recipe(recipe: &Recipe, digests: &[Digest]) -> Result<(), BuildError> {
    let text =
        std::fs::read_to_string(&recipe.path).map_err(|e| bad(&recipe.path, e.to_string()))?;
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .map_err(|e: toml_edit::TomlError| bad(&recipe.path, e.to_string()))?;
    if doc.get("expected").is_none() {
        doc["expected"] = toml_edit::table();
    }
    for d in digests {
        doc["expected"][&d.artifact] = toml_edit::value(d.digest.clone());
    }
    crate::util::replace_file(&recipe.path, doc.to_string().as_bytes())?;
    Ok(())
}
