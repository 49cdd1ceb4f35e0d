//! Perplexity (and, with a reference, KL divergence) over a text, chunked as
//! `llama-perplexity` does.
//!
//! The text is tokenized whole (BOS first when the model adds one). It is cut into
//! `n_chunk = min(--chunks, n_tokens / ctx)` chunks of `ctx` tokens; each chunk runs from an
//! empty KV cache, its first token replaced by BOS when the model adds one, and only the
//! second half is scored: the logits at positions `ctx/2 ..= ctx - 2` predict the tokens at
//! `ctx/2 + 1 ..= ctx - 1` (`ctx - 1 - ctx/2` predictions per chunk). A text needs at least
//! `2 * ctx` tokens. Source: llama.cpp b11434, tools/perplexity/perplexity.cpp,
//! `perplexity()` and `kl_divergence()`.

use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;
use serde::Serialize;

use super::stats::{self, Accumulator, Divergence, Perplexity};
use super::{run_scored, EvalError};
use crate::runtime::Backend;

/// How a text is cut.
#[derive(Clone, Copy, Debug)]
pub struct Chunking {
    /// Tokens per chunk (`--ctx`).
    pub ctx: usize,
    /// At most this many chunks (`--chunks`); all that fit when `None`.
    pub max_chunks: Option<usize>,
    /// The model's BOS id when it adds one (replaces each chunk's first token).
    pub bos: Option<u32>,
}

/// The perplexity report.
#[derive(Clone, Debug, Serialize)]
pub struct TextReport {
    pub ctx: usize,
    pub chunks: usize,
    pub tokens: usize,
    /// Positions scored: `chunks * (ctx - 1 - ctx/2)`.
    pub scored: usize,
    #[serde(flatten)]
    pub perplexity: Perplexity,
    /// With `--reference`: the KL-divergence statistics.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference: Option<Divergence>,
}

/// The number of chunks a text of `n_tokens` gives, or the error llama-perplexity gives.
pub fn n_chunks(n_tokens: usize, c: &Chunking) -> Result<usize, EvalError> {
    if c.ctx < 4 {
        return Err(EvalError::Setup(format!(
            "--ctx {}: at least 4 tokens per chunk",
            c.ctx
        )));
    }
    if n_tokens < 2 * c.ctx {
        return Err(EvalError::Setup(format!(
            "the text tokenizes to {n_tokens} tokens; perplexity with --ctx {} needs at least {} (two chunks)",
            c.ctx,
            2 * c.ctx
        )));
    }
    let max = n_tokens / c.ctx;
    Ok(c.max_chunks.map_or(max, |m| m.min(max)))
}

/// Perplexity of `model` over `tokens` (and the KL statistics against `reference`), calling
/// `progress(chunks_done, chunks)` after each chunk. Stops with [`EvalError::Interrupted`]
/// when `stop` is set.
pub fn run(
    model: &mut dyn Backend,
    mut reference: Option<&mut dyn Backend>,
    tokens: &[u32],
    c: &Chunking,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(usize, usize, &Accumulator),
) -> Result<TextReport, EvalError> {
    let n_chunk = n_chunks(tokens.len(), c)?;
    let (ctx, first) = (c.ctx, c.ctx / 2);
    let nv = model.n_vocab();
    let mut acc = Accumulator::new(reference.is_some());
    let mut rows = Vec::new();
    let mut rows_ref = Vec::new();
    for i in 0..n_chunk {
        if stop.load(Ordering::Relaxed) {
            return Err(EvalError::Interrupted);
        }
        let mut chunk = tokens[i * ctx..(i + 1) * ctx].to_vec();
        if let Some(b) = c.bos {
            chunk[0] = b;
        }
        // Rows first..=ctx-2 are scored: the last position predicts nothing in the chunk.
        let run_len = ctx - 1;
        rows.clear();
        model.reset();
        run_scored(model, &chunk[..run_len], 0, first, &mut rows)?;
        if let Some(r) = reference.as_deref_mut() {
            rows_ref.clear();
            r.reset();
            run_scored(r, &chunk[..run_len], 0, first, &mut rows_ref)?;
        }
        let with_ref = reference.is_some();
        let scored: Vec<stats::Position> = (first..run_len)
            .into_par_iter()
            .map(|p| {
                let j = p - first;
                let row = &rows[j * nv..(j + 1) * nv];
                let row_ref = with_ref.then(|| &rows_ref[j * nv..(j + 1) * nv]);
                stats::position(row, row_ref, chunk[p + 1])
            })
            .collect();
        if let Some(j) = scored
            .iter()
            .position(|p| !(p.nll.is_finite() && p.nll_ref.is_finite() && p.kld.is_finite()))
        {
            // Chunks counted from 1, as llama-perplexity prints them. Whose row: the one with
            // a non-finite logit; both finite and the KL divergence infinite, the model's
            // (a token it gives probability 0 that the reference does not).
            let finite = |r: &[f32]| r.iter().all(|v| v.is_finite());
            let row = &rows[j * nv..(j + 1) * nv];
            let row_ref_ok = !with_ref || finite(&rows_ref[j * nv..(j + 1) * nv]);
            let whose = match (finite(row), row_ref_ok) {
                (false, _) => "the model's",
                (true, false) => "the reference's",
                (true, true) => "the model's (probability 0 where the reference's is not)",
            };
            return Err(EvalError::NonFinite {
                what: format!(
                    "{whose} row at chunk {} of {n_chunk} (counted from 1), position {} in it",
                    i + 1,
                    first + j
                ),
            });
        }
        scored.into_iter().for_each(|p| acc.push(p));
        progress(i + 1, n_chunk, &acc);
    }
    Ok(TextReport {
        ctx,
        chunks: n_chunk,
        tokens: tokens.len(),
        scored: acc.count(),
        perplexity: acc.perplexity(),
        reference: acc.divergence(),
    })
}
