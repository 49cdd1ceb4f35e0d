//! `convert validate`: an equivalence gate between a candidate bundle (typically palettized)
//! and a reference bundle of the same model. It is not a quality measurement: it says the
//! candidate decides as the reference does on a prompt set, nothing about task accuracy.
//!
//! For every prompt, both bundles run the prompt (tokenized by the reference's tokenizer),
//! then `gen_tokens` greedy steps in which both are fed the reference's argmax (teacher
//! forcing, so one early difference does not cascade). At every generated step the gate
//! requires: the same argmax; `|p_cand(t) - p_ref(t)| <= max_prob_err` for the reference's
//! chosen token `t` (softmax in f64); finite logits from both. The candidate's whole run is
//! then repeated `repeats - 1` more times and its logits must be bit-identical each time.
//!
//! Reported but not judged: max |logit difference|, KL(ref || cand) (mean and max over steps,
//! nats), top-1 agreement rate.

use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::{argmax, load, run_prompt, BackendKind, LoadOptions, RuntimeError};
use crate::tokenizer::Tokenizer;

/// The checked-in default prompt set (`testdata/validate/prompts.json`).
pub const DEFAULT_PROMPTS: &str = include_str!("../../testdata/validate/prompts.json");

#[derive(Clone, Debug)]
pub struct ValidateOptions {
    /// Backend and kernel both bundles run on.
    pub backend: BackendKind,
    pub load: LoadOptions,
    pub prompts: Vec<String>,
    pub max_prob_err: f64,
    pub repeats: usize,
    pub gen_tokens: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct PromptReport {
    pub prompt: String,
    pub prompt_tokens: usize,
    pub steps: usize,
    pub argmax_agreements: usize,
    pub max_prob_err: f64,
    pub max_abs_logit_diff: f64,
    pub kl_mean: f64,
    pub kl_max: f64,
    /// The reference's greedy continuation (token ids).
    pub reference_tokens: Vec<u32>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ValidateReport {
    pub passed: bool,
    pub gate: &'static str,
    pub candidate: String,
    pub candidate_digest: String,
    pub reference: String,
    pub reference_digest: String,
    pub threshold_max_prob_err: f64,
    pub repeats: usize,
    pub gen_tokens: usize,
    pub prompts_evaluated: usize,
    pub steps: usize,
    /// Judged: every step's argmax equal.
    pub argmax_agreement: f64,
    /// Judged: max over steps of |p_cand - p_ref| of the reference's token.
    pub max_prob_err: f64,
    /// Judged: logits finite everywhere.
    pub all_finite: bool,
    /// Judged: repeated candidate runs bit-identical.
    pub repeats_identical: bool,
    /// Not judged.
    pub max_abs_logit_diff: f64,
    pub kl_mean: f64,
    pub kl_max: f64,
    pub top1_agreement_rate: f64,
    /// Every failure counted; the first [`MAX_LISTED_FAILURES`] in words.
    pub failures_total: usize,
    pub failures: Vec<String>,
    pub per_prompt: Vec<PromptReport>,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ValidateError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("{path}: {detail}")]
    Input { path: PathBuf, detail: String },
}

/// Reads a prompt file: a JSON array of strings.
pub fn read_prompts(path: &Path) -> Result<Vec<String>, ValidateError> {
    let bytes = crate::util::read_input(path).map_err(|e| ValidateError::Input {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })?;
    parse_prompts(&bytes).map_err(|detail| ValidateError::Input {
        path: path.to_path_buf(),
        detail,
    })
}

/// Parses a JSON array of non-empty strings.
pub fn parse_prompts(bytes: &[u8]) -> Result<Vec<String>, String> {
    let v: Vec<String> = serde_json::from_slice(bytes)
        .map_err(|e| format!("expected a JSON array of prompt strings: {e}"))?;
    if v.is_empty() || v.iter().any(|p| p.is_empty()) {
        return Err("the prompt set is empty or holds an empty prompt".into());
    }
    Ok(v)
}

/// Softmax in f64.
fn softmax(l: &[f32]) -> Vec<f64> {
    let m = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let e: Vec<f64> = l.iter().map(|&x| (x as f64 - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

fn all_finite(l: &[f32]) -> bool {
    l.iter().all(|x| x.is_finite())
}

/// `MAX_LISTED_FAILURES`: failures listed in words in the report (all are counted).
pub const MAX_LISTED_FAILURES: usize = 1000;

/// Runs the gate. Errors are setup failures (a bundle that does not load, mismatched
/// vocabularies, a prompt too long for the context); a failed gate is `passed: false`.
pub fn validate(
    candidate: &Path,
    reference: &Path,
    opts: &ValidateOptions,
) -> Result<ValidateReport, ValidateError> {
    let load = |p: &Path| {
        load(opts.backend, p, &opts.load).map_err(|e| match e {
            // A failed signature check keeps its type (the command line exits 1 for it).
            e @ RuntimeError::Bundle(crate::bundle::BundleError::Signature { .. }) => {
                ValidateError::Runtime(e)
            }
            e => ValidateError::Input {
                path: p.to_path_buf(),
                detail: e.to_string(),
            },
        })
    };
    let mut cand = load(candidate)?;
    let mut refb = load(reference)?;
    let digest = |p: &Path| -> Result<String, ValidateError> {
        crate::bundle::reader::read_manifest(p)
            .map(|m| m.bundle_digest)
            .map_err(|e| ValidateError::Input {
                path: p.to_path_buf(),
                detail: e.to_string(),
            })
    };
    let cdig = digest(candidate)?;
    let rdig = digest(reference)?;
    if cand.n_vocab() != refb.n_vocab() {
        return Err(ValidateError::Input {
            path: candidate.to_path_buf(),
            detail: format!(
                "n_vocab {} differs from the reference's {}",
                cand.n_vocab(),
                refb.n_vocab()
            ),
        });
    }
    let tok =
        Tokenizer::for_model(reference, refb.n_vocab()).map_err(|e| ValidateError::Input {
            path: reference.to_path_buf(),
            detail: format!("tokenizer: {e}"),
        })?;
    let n_ctx = cand.n_ctx().min(refb.n_ctx());
    let mut failures = Vec::new();
    let mut per_prompt = Vec::new();
    let mut cand_hash = Sha256::new();
    let mut finite = true;
    let (mut steps, mut agree, mut kl_sum) = (0usize, 0usize, 0f64);
    let (mut max_perr, mut max_ldiff, mut kl_max) = (0f64, 0f64, 0f64);
    let mut prompt_ids = Vec::new();
    for (pi, prompt) in opts.prompts.iter().enumerate() {
        let ids = tok.encode(prompt, true, false);
        if ids.is_empty()
            || ids
                .len()
                .checked_add(opts.gen_tokens)
                .is_none_or(|t| t > n_ctx)
        {
            return Err(ValidateError::Input {
                path: reference.to_path_buf(),
                detail: format!(
                    "prompt {pi}: {} tokens plus {} generated exceed the context {n_ctx}",
                    ids.len(),
                    opts.gen_tokens
                ),
            });
        }
        cand.reset();
        refb.reset();
        let mut pr = PromptReport {
            prompt: prompt.clone(),
            prompt_tokens: ids.len(),
            steps: 0,
            argmax_agreements: 0,
            max_prob_err: 0.0,
            max_abs_logit_diff: 0.0,
            kl_mean: 0.0,
            kl_max: 0.0,
            reference_tokens: Vec::new(),
        };
        let mut feed = ids.clone();
        let mut kl_p = 0f64;
        // The prompt as prefill chunks (the logits of its last position are step 0), then
        // gen_tokens - 1 fed greedy tokens: gen_tokens judged steps.
        let mut ran =
            run_prompt(cand.as_mut(), &ids, 0).and_then(|_| run_prompt(refb.as_mut(), &ids, 0));
        let mut pos = ids.len() - 1;
        loop {
            if let Err(e) = ran {
                return Err(e.into());
            }
            let lc = cand.logits()?.to_vec();
            let lr = refb.logits()?.to_vec();
            for v in &lc {
                cand_hash.update(v.to_le_bytes());
            }
            if !all_finite(&lc) || !all_finite(&lr) {
                finite = false;
                failures.push(format!("prompt {pi}: non-finite logits at position {pos}"));
                break;
            }
            let (ac, ar) = (argmax(&lc), argmax(&lr));
            let (pc, prr) = (softmax(&lc), softmax(&lr));
            let perr = (pc[ar] - prr[ar]).abs();
            let ldiff = lc
                .iter()
                .zip(&lr)
                .map(|(a, b)| (*a as f64 - *b as f64).abs())
                .fold(0f64, f64::max);
            let kl: f64 = prr
                .iter()
                .zip(&pc)
                .filter(|(r, _)| **r > 0.0)
                .map(|(r, c)| r * (r / c.max(f64::MIN_POSITIVE)).ln())
                .sum::<f64>()
                .max(0.0);
            pr.steps += 1;
            steps += 1;
            if ac == ar {
                pr.argmax_agreements += 1;
                agree += 1;
            } else {
                failures.push(format!(
                    "prompt {pi} step {}: argmax {ac} differs from the reference's {ar}",
                    pr.steps - 1
                ));
            }
            if perr > opts.max_prob_err {
                failures.push(format!(
                    "prompt {pi} step {}: |dp| {perr:.6} of token {ar} > {}",
                    pr.steps - 1,
                    opts.max_prob_err
                ));
            }
            pr.max_prob_err = pr.max_prob_err.max(perr);
            pr.max_abs_logit_diff = pr.max_abs_logit_diff.max(ldiff);
            pr.kl_max = pr.kl_max.max(kl);
            kl_p += kl;
            pr.reference_tokens.push(ar as u32);
            if pr.steps == opts.gen_tokens {
                break;
            }
            feed.push(ar as u32);
            pos += 1;
            ran = cand
                .decode(ar as u32, pos)
                .and_then(|_| refb.decode(ar as u32, pos));
        }
        pr.kl_mean = if pr.steps > 0 {
            kl_p / pr.steps as f64
        } else {
            0.0
        };
        max_perr = max_perr.max(pr.max_prob_err);
        max_ldiff = max_ldiff.max(pr.max_abs_logit_diff);
        kl_max = kl_max.max(pr.kl_max);
        kl_sum += kl_p;
        prompt_ids.push((ids.len(), feed));
        per_prompt.push(pr);
    }
    drop(refb);
    // Repeat the candidate on the same token sequences; its logits must not change.
    let first = cand_hash.finalize();
    let mut repeats_identical = true;
    for rep in 1..opts.repeats {
        let mut h = Sha256::new();
        for (n_prompt, feed) in &prompt_ids {
            cand.reset();
            if run_prompt(cand.as_mut(), &feed[..*n_prompt], 0).is_err() {
                continue;
            }
            for (i, &t) in feed.iter().enumerate().skip(*n_prompt - 1) {
                if i >= *n_prompt && cand.decode(t, i).is_err() {
                    break;
                }
                match cand.logits() {
                    Ok(l) => l.iter().for_each(|v| h.update(v.to_le_bytes())),
                    Err(_) => break,
                }
            }
        }
        if h.finalize() != first {
            repeats_identical = false;
            failures.push(format!(
                "repeat {rep}: candidate logits differ from the first run"
            ));
        }
    }
    let argmax_agreement = if steps > 0 {
        agree as f64 / steps as f64
    } else {
        0.0
    };
    Ok(ValidateReport {
        passed: failures.is_empty() && steps > 0,
        failures_total: failures.len(),
        gate:
            "equivalence (same argmax, |dp| bound, finite, repeatable); not a quality measurement",
        candidate: candidate.display().to_string(),
        candidate_digest: cdig,
        reference: reference.display().to_string(),
        reference_digest: rdig,
        threshold_max_prob_err: opts.max_prob_err,
        repeats: opts.repeats,
        gen_tokens: opts.gen_tokens,
        prompts_evaluated: per_prompt.len(),
        steps,
        argmax_agreement,
        max_prob_err: max_perr,
        all_finite: finite,
        repeats_identical,
        max_abs_logit_diff: max_ldiff,
        kl_mean: if steps > 0 {
            kl_sum / steps as f64
        } else {
            0.0
        },
        kl_max,
        top1_agreement_rate: argmax_agreement,
        failures: failures.into_iter().take(MAX_LISTED_FAILURES).collect(),
        per_prompt,
    })
}
