//! Tasks in BIG-bench's `task.json` format (bigbench 1.0.0, `bigbench/api/json_task.py`).
//!
//! # The prompt
//! `task_prefix + example_input_prefix + input + example_output_prefix`, zero-shot, with
//! BIG-bench's defaults (`"\nQ: "`, `"\nA: "`). When `append_choices_to_input` is true (its
//! default) a multiple-choice prompt lists the choices after the input, each after
//! `choice_prefix` (default `"\n  choice: "`), in sorted order: BIG-bench permutes them with
//! numpy's seeded generator, which lowbit does not reproduce. Exact-match prompts never list
//! choices.
//!
//! # Multiple choice (`target_scores`)
//! Each choice is scored by its log-likelihood after the prompt, split as
//! lm-evaluation-harness's `_encode_pair` does: trailing whitespace of the prompt moves to the
//! front of the continuation, the context is `encode(context)` (BOS first when the model adds
//! one) and the continuation is `encode(context + choice)[len(context ids)..]`. `acc`: the
//! choice of highest log-likelihood (the first on ties) is correct when its score is the
//! example's highest; `acc_norm`: the same with each log-likelihood divided by the choice's
//! length in characters (lm-evaluation-harness's `acc_norm`).
//!
//! # Exact match (`target`)
//! Greedy generation from the prompt, at most `max_gen_tokens` tokens, stopping at an
//! end-of-generation token, after the task's `stop_string`, or at a newline once the output
//! holds non-whitespace text (every BIG-bench example begins with a newline). The output is
//! post-processed as BIG-bench's `postprocess_output`: cut after the first `stop_string`
//! (found past index 0), then the first match of `output_regex` (default
//! `[^\.\?\!\;\n]+` when the task gives neither); correct when it equals one of the targets.
//! A task is exact-match when its `preferred_score` is `exact_str_match` or no example has
//! `target_scores`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde_json::Value;

use super::stats::{self, Paired, Proportion};
use super::{run_scored, EvalError};
use crate::runtime::Backend;
use crate::tokenizer::Tokenizer;

/// BIG-bench's default output regex (`json_task.py`, `_DEFAULT_REGEX`).
pub const DEFAULT_REGEX: &str = r"[^\.\?\!\;\n]+";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    MultipleChoice,
    ExactMatch,
}

/// One example.
#[derive(Clone, Debug)]
pub struct Example {
    pub input: String,
    /// `target_scores` in the file's order.
    pub choices: Vec<(String, f64)>,
    pub targets: Vec<String>,
}

/// A parsed task.
#[derive(Clone, Debug)]
pub struct Task {
    pub name: String,
    pub path: PathBuf,
    pub sha256: String,
    pub mode: Mode,
    task_prefix: String,
    input_prefix: String,
    output_prefix: String,
    choice_prefix: String,
    append_choices: bool,
    stop_string: Option<String>,
    output_regex: regex::Regex,
    pub examples: Vec<Example>,
}

fn bad(path: &Path, detail: impl Into<String>) -> EvalError {
    EvalError::Task {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

impl Task {
    /// Reads and checks a BIG-bench `task.json`: every example has a string `input`, and the
    /// choices (multiple choice: a non-empty `target_scores` object of numbers with one score
    /// above the rest) or the `target` (exact match: a string or a list of strings) its mode
    /// needs. Errors name the file and the example.
    pub fn load(path: &Path) -> Result<Task, EvalError> {
        let bytes = crate::util::read_input(path).map_err(|e| bad(path, e.to_string()))?;
        let v: Value =
            serde_json::from_slice(&bytes).map_err(|e| bad(path, format!("not JSON: {e}")))?;
        let o = v
            .as_object()
            .ok_or_else(|| bad(path, "not a BIG-bench task: the top level is not an object"))?;
        let s = |k: &str, def: &str| -> Result<String, EvalError> {
            match o.get(k) {
                None => Ok(def.to_string()),
                Some(Value::String(x)) => Ok(x.clone()),
                Some(_) => Err(bad(path, format!("field {k:?} is not a string"))),
            }
        };
        let examples_v =
            match o.get("examples") {
                Some(Value::Array(a)) if !a.is_empty() => a,
                Some(Value::Array(_)) | None if o.contains_key("subtasks") => return Err(bad(
                    path,
                    "a task of subtasks with no examples of its own: give a subtask's task.json",
                )),
                Some(Value::Array(_)) => return Err(bad(path, "\"examples\" is empty")),
                _ => return Err(bad(path, "not a BIG-bench task: no \"examples\" array")),
            };
        let mut examples = Vec::with_capacity(examples_v.len());
        for (i, e) in examples_v.iter().enumerate() {
            let eb = |d: &str| bad(path, format!("example {i}: {d}"));
            let input = e
                .get("input")
                .and_then(Value::as_str)
                .ok_or_else(|| eb("no string \"input\""))?
                .to_string();
            let choices = match e.get("target_scores") {
                None => Vec::new(),
                Some(Value::Object(m)) => m
                    .iter()
                    .map(|(k, v)| {
                        v.as_f64()
                            .map(|x| (k.clone(), x))
                            .ok_or_else(|| eb(&format!("target_scores[{k:?}] is not a number")))
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err(eb("\"target_scores\" is not an object")),
            };
            let targets = match e.get("target") {
                None => Vec::new(),
                Some(Value::String(t)) => vec![t.clone()],
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|t| {
                        t.as_str()
                            .map(str::to_string)
                            .ok_or_else(|| eb("\"target\" list holds a non-string"))
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err(eb("\"target\" is neither a string nor a list")),
            };
            examples.push(Example {
                input,
                choices,
                targets,
            });
        }
        let preferred = s("preferred_score", "")?;
        let mode =
            if preferred == "exact_str_match" || examples.iter().all(|e| e.choices.is_empty()) {
                Mode::ExactMatch
            } else {
                Mode::MultipleChoice
            };
        for (i, e) in examples.iter().enumerate() {
            match mode {
                Mode::MultipleChoice => {
                    if e.choices.is_empty() {
                        return Err(bad(
                            path,
                            format!("example {i}: no \"target_scores\" (choices)"),
                        ));
                    }
                    let max = e.choices.iter().map(|c| c.1).fold(f64::MIN, f64::max);
                    let min = e.choices.iter().map(|c| c.1).fold(f64::MAX, f64::min);
                    if e.choices.len() > 1 && max <= min || e.choices.len() == 1 && max == 0.0 {
                        return Err(bad(
                            path,
                            format!("example {i}: no choice scores above the others"),
                        ));
                    }
                    if let Some((c, _)) = e.choices.iter().find(|c| c.0.is_empty()) {
                        return Err(bad(path, format!("example {i}: empty choice {c:?}")));
                    }
                }
                Mode::ExactMatch => {
                    if e.targets.is_empty() {
                        return Err(bad(path, format!("example {i}: no \"target\"")));
                    }
                }
            }
        }
        let stop_string = match o.get("stop_string") {
            None | Some(Value::Null) => None,
            Some(Value::String(x)) => Some(x.clone()),
            Some(_) => return Err(bad(path, "\"stop_string\" is not a string")),
        };
        let regex_src = match o.get("output_regex") {
            Some(Value::String(x)) => x.clone(),
            None | Some(Value::Null) if stop_string.is_none() => DEFAULT_REGEX.to_string(),
            None | Some(Value::Null) => String::new(),
            Some(_) => return Err(bad(path, "\"output_regex\" is not a string")),
        };
        let output_regex = regex::Regex::new(&regex_src)
            .map_err(|e| bad(path, format!("output_regex {regex_src:?}: {e}")))?;
        if output_regex.captures_len() > 2 {
            return Err(bad(
                path,
                format!(
                    "output_regex {regex_src:?} has more than one group (BIG-bench refuses it)"
                ),
            ));
        }
        let name = match o.get("name").and_then(Value::as_str) {
            Some(n) => n.to_string(),
            None => path
                .parent()
                .and_then(Path::file_name)
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "task".into()),
        };
        let append_choices = match o.get("append_choices_to_input") {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(bad(path, "\"append_choices_to_input\" is not a boolean")),
        };
        Ok(Task {
            name,
            path: path.to_path_buf(),
            sha256: crate::util::sha256_hex(&bytes),
            mode,
            task_prefix: s("task_prefix", "")?,
            input_prefix: s("example_input_prefix", "\nQ: ")?,
            output_prefix: s("example_output_prefix", "\nA: ")?,
            choice_prefix: s("choice_prefix", "\n  choice: ")?,
            append_choices,
            stop_string,
            output_regex,
            examples,
        })
    }

    /// The zero-shot prompt of example `e` (see the module doc).
    pub fn prompt(&self, e: &Example) -> String {
        let mut input = e.input.clone();
        if self.mode == Mode::MultipleChoice && self.append_choices {
            let mut c: Vec<&str> = e.choices.iter().map(|c| c.0.as_str()).collect();
            c.sort_unstable();
            input.push_str(&self.choice_prefix);
            input.push_str(&c.join(&self.choice_prefix));
        }
        format!(
            "{}{}{}{}",
            self.task_prefix, self.input_prefix, input, self.output_prefix
        )
    }

    /// BIG-bench's `postprocess_output` of a generated text.
    pub fn postprocess(&self, text: &str) -> String {
        let mut t = text;
        if let Some(s) = self.stop_string.as_deref().filter(|s| !s.is_empty()) {
            if let Some(i) = t.find(s).filter(|&i| i > 0) {
                t = &t[..i + s.len()];
            }
        }
        if self.output_regex.as_str().is_empty() {
            return t.to_string();
        }
        match self.output_regex.captures(t) {
            None => String::new(),
            Some(c) if c.len() == 2 => c.get(1).map_or("", |m| m.as_str()).to_string(),
            Some(c) => c[0].to_string(),
        }
    }

    /// The examples to run: all, or `limit` of them drawn without replacement by a ChaCha8
    /// generator seeded with `seed`, in file order.
    pub fn subset(&self, limit: Option<usize>, seed: u64) -> Vec<usize> {
        let n = self.examples.len();
        match limit {
            Some(k) if k < n => {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let mut v = rand::seq::index::sample(&mut rng, n, k).into_vec();
                v.sort_unstable();
                v
            }
            _ => (0..n).collect(),
        }
    }
}

/// One model's answers on a task.
#[derive(Clone, Debug)]
pub struct Answers {
    pub correct: Vec<bool>,
    /// Multiple choice: correctness with length-normalized log-likelihoods.
    pub correct_norm: Vec<bool>,
}

/// lm-evaluation-harness's split of a context and a continuation: the context's trailing
/// whitespace moves to the continuation.
pub fn split_pair(context: &str, continuation: &str) -> (String, String) {
    let trimmed = context.trim_end();
    let moved = &context[trimmed.len()..];
    (trimmed.to_string(), format!("{moved}{continuation}"))
}

fn log_softmax_at(row: &[f32], t: u32) -> f64 {
    let n = stats::row_norm(row);
    row[t as usize] as f64 - n.log_z
}

/// Non-finite logits in example `idx` of `task` (counted from 0, as the subset's indices).
fn non_finite(task: &Task, idx: usize) -> EvalError {
    EvalError::NonFinite {
        what: format!("{} example {idx} (counted from 0)", task.name),
    }
}

/// Scores one multiple-choice example: the log-likelihood of each choice.
fn choice_log_likelihoods(
    be: &mut dyn Backend,
    tok: &Tokenizer,
    task: &Task,
    idx: usize,
) -> Result<Vec<f64>, EvalError> {
    let e = &task.examples[idx];
    let prompt = task.prompt(e);
    let nv = be.n_vocab();
    let mut wholes = Vec::with_capacity(e.choices.len());
    let (ctx_s, _) = split_pair(&prompt, "");
    let ctx_ids = tok.encode(&ctx_s, true, false);
    let ctx_len = ctx_ids.len();
    let ex_err = |d: String| bad(&task.path, format!("example {idx}: {d}"));
    if ctx_len == 0 {
        return Err(ex_err(
            "the prompt is empty and the model adds no BOS".into(),
        ));
    }
    for (c, _) in &e.choices {
        let (a, b) = split_pair(&prompt, c);
        let whole = tok.encode(&format!("{a}{b}"), true, false);
        if whole.len() <= ctx_len {
            return Err(ex_err(format!("choice {c:?} adds no token to the prompt")));
        }
        if whole.len() > be.n_ctx() {
            return Err(ex_err(format!(
                "prompt and choice {c:?} are {} tokens, more than the bundle's n_ctx = {}",
                whole.len(),
                be.n_ctx()
            )));
        }
        wholes.push(whole);
    }
    // The tokens every choice shares, at most the context but its last token (whose logits
    // score the first continuation token), run once.
    let mut shared = ctx_len - 1;
    for w in &wholes {
        let lcp = w.iter().zip(&wholes[0]).take_while(|(a, b)| a == b).count();
        shared = shared.min(lcp);
    }
    be.reset();
    let mut rows = Vec::new();
    if shared > 0 {
        run_scored(be, &wholes[0][..shared], 0, shared, &mut rows)?;
    }
    let mut out = Vec::with_capacity(wholes.len());
    for w in &wholes {
        be.rewind(shared)?;
        rows.clear();
        let from = ctx_len - 1 - shared;
        run_scored(be, &w[shared..w.len() - 1], shared, from, &mut rows)?;
        let ll: f64 = w[ctx_len..]
            .iter()
            .enumerate()
            .map(|(j, &t)| log_softmax_at(&rows[j * nv..(j + 1) * nv], t))
            .sum();
        if !ll.is_finite() {
            return Err(non_finite(task, idx));
        }
        out.push(ll);
    }
    Ok(out)
}

fn first_argmax(v: impl Iterator<Item = f64>) -> usize {
    let mut best = (0, f64::NEG_INFINITY);
    for (i, x) in v.enumerate() {
        if x > best.1 {
            best = (i, x);
        }
    }
    best.0
}

/// Greedy generation from the prompt of example `idx`, stopped as the module doc says.
pub fn generate(
    be: &mut dyn Backend,
    tok: &Tokenizer,
    task: &Task,
    idx: usize,
    max_gen_tokens: usize,
) -> Result<String, EvalError> {
    let prompt = task.prompt(&task.examples[idx]);
    let ids = tok.encode(&prompt, true, false);
    if ids.is_empty() {
        return Err(bad(
            &task.path,
            format!("example {idx}: the prompt is empty"),
        ));
    }
    let max = max_gen_tokens.min(be.n_ctx().saturating_sub(ids.len()));
    if max == 0 {
        return Err(bad(
            &task.path,
            format!(
                "example {idx}: the prompt is {} tokens, no room to generate in n_ctx = {}",
                ids.len(),
                be.n_ctx()
            ),
        ));
    }
    be.reset();
    crate::runtime::run_prompt(be, &ids, 0)?;
    let mut out: Vec<u32> = Vec::new();
    let mut tok_id = be.argmax(&[])?.ok_or_else(|| non_finite(task, idx))?;
    let stop = task.stop_string.as_deref().filter(|s| !s.is_empty());
    let done = |out: &[u32]| -> bool {
        let text = String::from_utf8_lossy(&tok.detokenize(out, true, false)).into_owned();
        if stop.is_some_and(|s| text.find(s).is_some_and(|i| i > 0)) {
            return true;
        }
        // A newline after some non-whitespace output ends the answer.
        let mut seen = false;
        for ch in text.chars() {
            if ch == '\n' && seen {
                return true;
            }
            seen |= !ch.is_whitespace();
        }
        false
    };
    let mut pos = ids.len();
    loop {
        if tok.is_eog(tok_id) {
            break;
        }
        out.push(tok_id);
        if out.len() >= max || done(&out) {
            break;
        }
        be.decode(tok_id, pos)?;
        pos += 1;
        tok_id = be.argmax(&[])?.ok_or_else(|| non_finite(task, idx))?;
    }
    Ok(String::from_utf8_lossy(&tok.detokenize(&out, true, false)).into_owned())
}

/// Runs `task` on the examples `subset`, calling `progress(done, total)` after each.
pub fn answer(
    be: &mut dyn Backend,
    tok: &Tokenizer,
    task: &Task,
    subset: &[usize],
    max_gen_tokens: usize,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Answers, EvalError> {
    let mut correct = Vec::with_capacity(subset.len());
    let mut correct_norm = Vec::new();
    for (k, &i) in subset.iter().enumerate() {
        if stop.load(Ordering::Relaxed) {
            return Err(EvalError::Interrupted);
        }
        let e = &task.examples[i];
        match task.mode {
            Mode::MultipleChoice => {
                let ll = choice_log_likelihoods(be, tok, task, i)?;
                let best = e.choices.iter().map(|c| c.1).fold(f64::MIN, f64::max);
                let a = first_argmax(ll.iter().copied());
                let an = first_argmax(
                    ll.iter()
                        .zip(&e.choices)
                        .map(|(l, c)| l / c.0.chars().count() as f64),
                );
                correct.push(e.choices[a].1 == best);
                correct_norm.push(e.choices[an].1 == best);
            }
            Mode::ExactMatch => {
                let text = generate(be, tok, task, i, max_gen_tokens)?;
                let r = task.postprocess(&text);
                correct.push(e.targets.contains(&r));
            }
        }
        progress(k + 1, subset.len());
    }
    Ok(Answers {
        correct,
        correct_norm,
    })
}

/// A task's report.
#[derive(Clone, Debug, Serialize)]
pub struct TaskReport {
    pub task: String,
    pub file: PathBuf,
    pub sha256: String,
    pub mode: Mode,
    /// Examples run, of `of` in the file (a subset drawn with `seed` when fewer).
    pub examples: usize,
    pub of: usize,
    pub seed: u64,
    /// Accuracy with its 95% Wilson interval.
    pub acc: Proportion,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acc_norm: Option<Proportion>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference: Option<TaskReference>,
    /// The examples run (indices into the file's list) and, per example, 1 when the model
    /// answered correctly.
    pub indices: Vec<usize>,
    pub correct: String,
}

/// The reference's accuracy on the same examples and the paired difference.
#[derive(Clone, Debug, Serialize)]
pub struct TaskReference {
    pub acc: Proportion,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acc_norm: Option<Proportion>,
    pub paired: Paired,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paired_norm: Option<Paired>,
    pub correct: String,
}

fn bits(v: &[bool]) -> String {
    v.iter().map(|&b| if b { '1' } else { '0' }).collect()
}

fn prop(v: &[bool]) -> Proportion {
    stats::wilson(v.iter().filter(|&&b| b).count(), v.len())
}

/// The report of `model` (and `reference`) answers on `subset` of `task`.
pub fn report(
    task: &Task,
    subset: &[usize],
    seed: u64,
    model: &Answers,
    reference: Option<&Answers>,
) -> TaskReport {
    let mc = task.mode == Mode::MultipleChoice;
    TaskReport {
        task: task.name.clone(),
        file: task.path.clone(),
        sha256: task.sha256.clone(),
        mode: task.mode,
        examples: subset.len(),
        of: task.examples.len(),
        seed,
        acc: prop(&model.correct),
        acc_norm: mc.then(|| prop(&model.correct_norm)),
        reference: reference.map(|r| TaskReference {
            acc: prop(&r.correct),
            acc_norm: mc.then(|| prop(&r.correct_norm)),
            paired: stats::paired(&model.correct, &r.correct),
            paired_norm: mc.then(|| stats::paired(&model.correct_norm, &r.correct_norm)),
            correct: bits(&r.correct),
        }),
        indices: subset.to_vec(),
        correct: bits(&model.correct),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lm_eval_moves_trailing_whitespace_to_the_continuation() {
        assert_eq!(
            split_pair("\nQ: x\nA: ", "Yes"),
            ("\nQ: x\nA:".to_string(), " Yes".to_string())
        );
        assert_eq!(split_pair("ab", "c"), ("ab".to_string(), "c".to_string()));
    }
}
