//! `convert eval`: quality measured on real text and real tasks.
//!
//! - [`ppl`]: perplexity of a text as `llama-perplexity` computes it, and with a reference
//!   model the statistics of `llama-perplexity --kl-divergence` on the same tokens.
//! - [`tasks`]: BIG-bench `task.json` tasks, multiple choice by log-likelihood (`acc`,
//!   `acc_norm`) and exact match by greedy generation, with 95% intervals and, against a
//!   reference, the paired difference and McNemar's test.
//! - [`Gates`]: thresholds on those figures; [`EvalReport::passed`].
//!
//! `validate` checks that two runs are equivalent step by step; `eval` measures how good a
//! model is on free input. Every backend runs through [`crate::runtime::Backend`]; scoring
//! reads the logits of every position of a prefill chunk ([`Backend::prefill_logits`]).

pub mod ppl;
pub mod stats;
pub mod tasks;

use std::path::PathBuf;

use serde::Serialize;

use crate::runtime::{plan_chunks, Backend, RuntimeError};

/// Eval errors: setup errors (exit 2) name the file, option or example.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EvalError {
    #[error("{0}")]
    Setup(String),
    #[error("{path}: {detail}")]
    Text { path: PathBuf, detail: String },
    #[error("task {path}: {detail}")]
    Task { path: PathBuf, detail: String },
    #[error("non-finite logits at {what}")]
    NonFinite { what: String },
    #[error("interrupted")]
    Interrupted,
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// Runs `tokens` at positions `start..` in spans of at most the backend's largest prefill
/// bucket and appends the logits of the positions `start + from ..` to `out` (row-major,
/// `n_vocab` per row); spans before `from` run without logits. `from == tokens.len()` runs
/// the tokens and scores nothing.
pub fn run_scored(
    be: &mut dyn Backend,
    tokens: &[u32],
    start: usize,
    from: usize,
    out: &mut Vec<f32>,
) -> Result<(), RuntimeError> {
    let buckets = be.info().buckets;
    let mut off = 0;
    for (len, _) in plan_chunks(&buckets, tokens.len()) {
        let span = &tokens[off..off + len];
        if off + len <= from {
            be.prefill(span, start + off)?;
        } else {
            be.prefill_logits(span, start + off, from.saturating_sub(off), out)?;
        }
        off += len;
    }
    Ok(())
}

/// Thresholds; a gate left `None` is not judged.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Gates {
    /// Mean KL divergence against the reference, nats.
    pub max_kld: Option<f64>,
    /// Share of positions with the reference's top token, 0..1.
    pub min_same_top: Option<f64>,
    /// PPL / PPL(reference).
    pub max_ppl_ratio: Option<f64>,
    /// Accuracy drop against the reference on each task, judged on the interval: it fails
    /// when the lower end of the drop's 95% interval is above the threshold (the data show a
    /// drop larger than it), not on the point estimate.
    pub max_accuracy_drop: Option<f64>,
}

/// The "8-bit" preset (`--gate-preset 8bit`): a conversion meant to be as good as 8 bits per
/// weight. Set from llama.cpp's Q8_0 of SmolLM2-135M against its Q4_1 source on Botchan
/// (2026-12-02, README, 1020 scored positions): mean KLD 0.0052, same top 96.0%, PPL ratio
/// 1.0026; the KLD threshold leaves Q8_0 a 2x margin, and llama.cpp's Q4_K_M of the same
/// weights (KLD 0.050, same top 86%, PPL ratio 1.042) fails every text gate. The PPL ratio is
/// a point estimate whose error is about 0.009 on 254 positions and 0.004 on 1020: score at
/// least about 1000 positions (e.g. `--ctx 512 --chunks 4`) with this preset.
pub const PRESET_8BIT: Gates = Gates {
    max_kld: Some(0.01),
    min_same_top: Some(0.93),
    max_ppl_ratio: Some(1.02),
    max_accuracy_drop: Some(0.05),
};

impl Gates {
    /// A named preset: `8bit` ([`PRESET_8BIT`]).
    pub fn preset(name: &str) -> Option<Gates> {
        match name {
            "8bit" => Some(PRESET_8BIT),
            _ => None,
        }
    }

    /// These gates, each one left `None` taken from `base`.
    pub fn or(self, base: &Gates) -> Gates {
        Gates {
            max_kld: self.max_kld.or(base.max_kld),
            min_same_top: self.min_same_top.or(base.min_same_top),
            max_ppl_ratio: self.max_ppl_ratio.or(base.max_ppl_ratio),
            max_accuracy_drop: self.max_accuracy_drop.or(base.max_accuracy_drop),
        }
    }

    pub fn any(&self) -> bool {
        self.max_kld.is_some()
            || self.min_same_top.is_some()
            || self.max_ppl_ratio.is_some()
            || self.max_accuracy_drop.is_some()
    }
    /// Gates on the text need `--text` and `--reference`; on tasks, `--task` and
    /// `--reference`.
    pub fn check_inputs(&self, text: bool, tasks: bool, reference: bool) -> Result<(), EvalError> {
        let on_text =
            self.max_kld.is_some() || self.min_same_top.is_some() || self.max_ppl_ratio.is_some();
        if on_text && !(text && reference) {
            return Err(EvalError::Setup(
                "--max-kld, --min-same-top and --max-ppl-ratio need --text and --reference".into(),
            ));
        }
        if self.max_accuracy_drop.is_some() && !(tasks && reference) {
            return Err(EvalError::Setup(
                "--max-accuracy-drop needs --task and --reference".into(),
            ));
        }
        Ok(())
    }
}

/// One judged gate.
#[derive(Clone, Debug, Serialize)]
pub struct GateResult {
    pub gate: String,
    pub threshold: f64,
    /// The figure judged.
    pub value: f64,
    pub passed: bool,
}

/// The whole report (`--json`).
#[derive(Clone, Debug, Serialize)]
pub struct EvalReport {
    pub bundle: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference: Option<PathBuf>,
    pub backend: String,
    pub kernel: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<TextInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub perplexity: Option<ppl::TextReport>,
    pub tasks: Vec<tasks::TaskReport>,
    pub gates: Vec<GateResult>,
    pub passed: bool,
    pub seconds: f64,
}

/// The text scored.
#[derive(Clone, Debug, Serialize)]
pub struct TextInfo {
    pub file: PathBuf,
    pub bytes: u64,
    pub sha256: String,
}

/// Judges `gates` against the figures.
pub fn judge(
    gates: &Gates,
    text: Option<&ppl::TextReport>,
    tasks: &[tasks::TaskReport],
) -> Vec<GateResult> {
    let mut out = Vec::new();
    let d = text.and_then(|t| t.reference.as_ref());
    let mut g = |gate: &str, threshold: f64, value: f64, passed: bool| {
        out.push(GateResult {
            gate: gate.into(),
            threshold,
            value,
            passed,
        })
    };
    if let (Some(t), Some(d)) = (gates.max_kld, d) {
        g("max_kld", t, d.kld.value, d.kld.value <= t);
    }
    if let (Some(t), Some(d)) = (gates.min_same_top, d) {
        g("min_same_top", t, d.same_top.value, d.same_top.value >= t);
    }
    if let (Some(t), Some(d)) = (gates.max_ppl_ratio, d) {
        g(
            "max_ppl_ratio",
            t,
            d.ppl_ratio.value,
            d.ppl_ratio.value <= t,
        );
    }
    if let Some(t) = gates.max_accuracy_drop {
        for r in tasks {
            if let Some(rf) = &r.reference {
                // drop = acc_ref - acc; its interval is [-diff_high, -diff_low].
                let low = -rf.paired.diff_high + 0.0; // no "-0"
                g(&format!("max_accuracy_drop[{}]", r.task), t, low, low <= t);
            }
        }
    }
    out
}
