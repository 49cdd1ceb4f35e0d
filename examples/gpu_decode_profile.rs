//! Times one GPU decode step op by op, from timestamp queries
//! (`GpuBackend::profile_decode`): after a prompt of P tokens, S decode steps are each run
//! once as one compute pass (the step's GPU time) and once with every dispatch-list item in a
//! pass of its own; the items are grouped by label (kernel and weight, layer numbers as `#`)
//! and printed by total time, with the dispatches per step. A pass per item adds its start
//! and end, so the items add up to more than the step: the difference is the cost of the
//! extra passes, not work the step does.
//!
//! Usage: `gpu_decode_profile BUNDLE [PROMPT_TOKENS=512] [STEPS=8]` (the bundle's kernels, or
//! with `LOWBIT_PROFILE_BUILTIN=1` the ones built in; the adapter needs TIMESTAMP_QUERY).
//! With `LOWBIT_PROFILE_PREFILL=N` each "step" is instead a prefill chunk of N tokens (the
//! smallest bucket that holds them), the chunks one after another from position
//! PROMPT_TOKENS, so the table is per chunk. With `LOWBIT_PROFILE_SKIP=op_attention_combine`
//! (label substrings, comma-separated) the one-pass step leaves those items out (wrong
//! outputs; their cost inside the chain is the difference to the full step).
//!
//! Kernel variants (a development knob, for this example only; `convert` compiles only what
//! a bundle carries): `LOWBIT_PROFILE_DUMP=DIR` writes the kernels the profile would compile,
//! `DIR/NAME.wgsl`, and exits; `LOWBIT_PROFILE_SOURCES=DIR` compiles each `DIR/NAME.wgsl` in
//! place of kernel NAME (a name the sources lack is an error), and first compares the logits
//! of one decode step after the prompt with the variants against those without (bit for bit,
//! or the largest difference), so a variant meant to keep every bit is checked where it is
//! timed. Compare with `LOWBIT_GPU_UNCHECKED=1` on both sides (a replaced kernel is not the
//! binary's own and would otherwise keep wgpu's bounds checks).
use std::collections::BTreeMap;

use lowbit::runtime::gpu::backend::GpuBackend;
use lowbit::runtime::{self, Backend, LoadOptions};

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let Some(path) = a.get(1) else {
        anyhow::bail!("usage: gpu_decode_profile BUNDLE [PROMPT_TOKENS] [STEPS]");
    };
    let prompt: usize = a.get(2).map_or(Ok(512), |s| s.parse())?;
    let steps: usize = a.get(3).map_or(Ok(8), |s| s.parse())?;
    let model = runtime::open_model(std::path::Path::new(path))?;
    use anyhow::Context;
    use std::collections::HashMap;
    // The bundle's own kernels, as `convert run` compiles them (LOWBIT_PROFILE_BUILTIN=1: the
    // ones built into this binary, `None`: the context then also generates the variants it
    // makes on demand).
    let gpu_sources = if std::env::var_os("LOWBIT_PROFILE_BUILTIN").is_some() {
        None
    } else {
        Some(lowbit::runtime::gpu::kernels::from_bundle(&model.bundle)?)
    };
    let listed = || -> HashMap<String, String> {
        match &gpu_sources {
            Some(m) => m.clone(),
            None => lowbit::runtime::gpu::kernels::all()
                .into_iter()
                .map(|k| (k.name, k.wgsl))
                .collect(),
        }
    };
    if let Some(dir) = std::env::var_os("LOWBIT_PROFILE_DUMP") {
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("LOWBIT_PROFILE_DUMP: {}", dir.display()))?;
        let all = listed();
        for (name, wgsl) in &all {
            let f = dir.join(format!("{name}.wgsl"));
            std::fs::write(&f, wgsl)
                .with_context(|| format!("LOWBIT_PROFILE_DUMP: {}", f.display()))?;
        }
        println!("{} kernels written to {}", all.len(), dir.display());
        return Ok(());
    }
    // The variants: the sources with each DIR/NAME.wgsl in place of NAME's (with
    // LOWBIT_PROFILE_BUILTIN=1 the built-in kernels as a fixed set: those the binary makes on
    // demand, such as LOWBIT_GPU_Q8G's, are then absent).
    let variants = match std::env::var_os("LOWBIT_PROFILE_SOURCES") {
        None => None,
        Some(dir) => {
            let dir = std::path::PathBuf::from(dir);
            let ctx = || format!("LOWBIT_PROFILE_SOURCES: {}", dir.display());
            let mut sources = listed();
            let mut names = Vec::new();
            for e in std::fs::read_dir(&dir).with_context(ctx)? {
                let path = e.with_context(ctx)?.path();
                let Some(name) = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.strip_suffix(".wgsl"))
                else {
                    continue;
                };
                anyhow::ensure!(
                    sources.contains_key(name),
                    "{}: no kernel {name} in the sources",
                    path.display()
                );
                let wgsl = std::fs::read_to_string(&path)
                    .with_context(|| format!("LOWBIT_PROFILE_SOURCES: {}", path.display()))?;
                sources.insert(name.to_string(), wgsl);
                names.push(name.to_string());
            }
            anyhow::ensure!(!names.is_empty(), "{}: no NAME.wgsl files in it", ctx());
            names.sort();
            println!("variants: {}", names.join(", "));
            Some(sources)
        }
    };
    drop(model);
    let load = |sources: Option<HashMap<String, String>>| {
        let model = runtime::open_model(std::path::Path::new(path))?;
        GpuBackend::new(
            model,
            &LoadOptions {
                gpu_sources: sources,
                ..Default::default()
            },
        )
        .map_err(anyhow::Error::from)
    };
    let ids = |vocab: u32| -> Vec<u32> {
        (0..prompt as u32)
            .map(|i| (i * 7919 + 13) % vocab)
            .collect()
    };
    // One decode step's logits after the prompt (then the backend reset).
    let first = |be: &mut GpuBackend| -> anyhow::Result<Vec<f32>> {
        let ids = ids(be.n_vocab() as u32);
        runtime::run_prompt(be, &ids, 0)?;
        be.decode(ids[0], prompt)?;
        let l = be.logits()?.to_vec();
        be.reset();
        Ok(l)
    };
    let mut be = match variants {
        None => load(gpu_sources.clone())?,
        Some(sources) => {
            // Without the variants first, dropped before the variants load (one model on
            // the device at a time).
            let without = {
                let mut b0 = load(gpu_sources.clone())?;
                first(&mut b0)?
            };
            let mut be = load(Some(sources))?;
            let with = first(&mut be)?;
            let differ = with
                .iter()
                .zip(&without)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            let worst = with
                .iter()
                .zip(&without)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, |m, d| {
                    if d.is_nan() || m.is_nan() {
                        f32::NAN
                    } else {
                        m.max(d)
                    }
                });
            println!(
                "logits of the decode step at position {prompt} with the variants against \
                 without: {} ({differ} of {} differ, largest difference {worst:e})",
                if differ == 0 {
                    "identical"
                } else {
                    "DIFFERENT"
                },
                with.len()
            );
            be
        }
    };
    let ids = ids(be.n_vocab() as u32);
    runtime::run_prompt(&mut be, &ids, 0)?;
    let mut step_ns = Vec::new();
    let mut by_label: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    let mut items_ns = 0.0;
    let chunk: Option<usize> = std::env::var("LOWBIT_PROFILE_PREFILL")
        .ok()
        .map(|s| s.parse())
        .transpose()?;
    for i in 0..steps {
        let (step, items) = match chunk {
            Some(c) => {
                let span: Vec<u32> = (0..c).map(|j| ids[(i + j) % ids.len()]).collect();
                be.profile_span(&span, prompt + i * c)?
            }
            None => be.profile_decode(ids[i % ids.len()], prompt + i)?,
        };
        step_ns.push(step);
        for (label, ns) in items {
            // The kernel's name as it is, the weight's layer numbers as `#`.
            let (kernel, weight) = label.split_once(' ').unwrap_or((&label, ""));
            let weight: String = weight
                .chars()
                .map(|c| if c.is_ascii_digit() { '#' } else { c })
                .collect();
            let key = format!("{kernel} {weight}").trim_end().to_string();
            let e = by_label.entry(key).or_default();
            e.0 += ns / steps as f64;
            e.1 += 1;
            items_ns += ns / steps as f64;
        }
    }
    step_ns.sort_by(f64::total_cmp);
    println!(
        "device: {}\ndispatches per step: {}\nstep (one pass), median of {steps}: {:.1} us; items in passes of their own add up to {:.1} us",
        be.info().device.unwrap_or_default(),
        be.dispatches_per_token(),
        step_ns[steps / 2] / 1e3,
        items_ns / 1e3
    );
    let mut rows: Vec<_> = by_label.into_iter().collect();
    rows.sort_by(|x, y| y.1 .0.total_cmp(&x.1 .0));
    println!("| item (layers as #) | per step | us per step | us each |");
    println!("|---|---:|---:|---:|");
    for (label, (ns, count)) in rows {
        let per = count / steps;
        println!(
            "| {label} | {per} | {:.1} | {:.2} |",
            ns / 1e3,
            ns / 1e3 / per.max(1) as f64
        );
    }
    Ok(())
}
