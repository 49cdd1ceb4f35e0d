//! `convert verify`: a bundle against its manifest and, with `--source`, against the GGUF it
//! came from.
//!
//! Ternary tensors are rebuilt as the kernel defines them (`f32(d) * (code - 1)` from the
//! packed words, [`crate::ternary::row_values`]) and compared element by element with the
//! source dequantized by [`crate::quant`] (bit-exact with gguf-py). `maxerr = 0` means
//! bit-identical; otherwise `max |difference| <= maxerr`. Tensors carried in their source
//! encoding must be byte-identical. Palettized tensors are lossy by design: their
//! reconstruction error against the source is recomputed (groups in order, elements in order,
//! f64) and must equal the SSE and max error the manifest records, bit for bit; `maxerr` does
//! not apply to them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::Serialize;

use super::manifest::*;
use super::reader::{check_integrity_visiting, open_manifest};
use super::sign;
use super::BundleError;
use crate::ggml::GgmlType;
use crate::gguf::GgufFile;
use crate::quant;
use crate::ternary;
use crate::util;

#[derive(Clone, Debug, Default)]
pub struct VerifyOptions {
    pub source: Option<PathBuf>,
    pub maxerr: f64,
    /// `--trusted-key`: the bundle must be signed by one of these
    /// ([`sign::check_signature`]); a signature is reported but not judged when empty.
    pub trusted_keys: Vec<sign::PublicKey>,
}

/// The signature's part of the report.
#[derive(Clone, Debug, Serialize)]
pub struct SignatureCheck {
    /// `absent` (no `signature.json`), `present` (not checked: no trusted key given),
    /// `trusted` (verified with a trusted key, the bundle unchanged since), `failed` (with
    /// `key_id` when the signature verified but the files do not match the signed manifest).
    pub status: &'static str,
    /// The key id the signature names (`present`), or of the trusted key that verified it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// The trusted key file that verified it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trusted_key: Option<String>,
}

/// One tensor's result.
#[derive(Clone, Debug, Serialize)]
pub struct TensorCheck {
    pub name: String,
    pub encoding: String,
    /// `bytes` (carried, compared byte for byte), `values` (ternary, compared element by
    /// element), `codes` (recovered from TQ2_0: each block's `d` bits and codes compared with
    /// the source block, by value where they differ; the same verdict as `values`),
    /// `integrity` (no source given: SHA256 and code range only).
    pub compared: String,
    pub elements: u64,
    /// Elements (or bytes, for `bytes`) whose bits differ.
    pub mismatched: u64,
    /// JSON: a number, or the string `"inf"` / `"nan"` (JSON has no such numbers).
    #[serde(serialize_with = "number_or_word")]
    pub max_abs_diff: f64,
    /// For `ternarized` tensors: max |bundle - original source value| (quantization error,
    /// informational, not judged).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "opt_number_or_word"
    )]
    pub max_abs_diff_vs_unquantized: Option<f64>,
    pub passed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The whole report (`--json` writes it).
#[derive(Clone, Debug, Serialize)]
pub struct VerifyReport {
    pub passed: bool,
    pub bundle: String,
    pub source: Option<String>,
    #[serde(serialize_with = "number_or_word")]
    pub maxerr: f64,
    pub format_version: u32,
    pub bundle_digest: String,
    /// Format versions 2 and 3: the manifest digest (see [`super::manifest`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest_digest: Option<String>,
    pub signature: SignatureCheck,
    pub files_checked: usize,
    /// Everything that failed, in words.
    pub failures: Vec<String>,
    /// What is worth knowing but not a failure (a bundle without GPU kernels; kernels that
    /// differ from this build's).
    pub notes: Vec<String>,
    pub tensors: Vec<TensorCheck>,
    /// Every kernel file (WGSL parsed and validated, MSL re-derived).
    pub kernels: Vec<super::kernels::KernelCheck>,
    pub totals: Totals,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Totals {
    pub tensors: usize,
    pub passed: usize,
    pub ternary: usize,
    pub palettized: usize,
    pub carried: usize,
    pub elements_compared: u64,
    pub mismatched: u64,
    #[serde(serialize_with = "number_or_word")]
    pub max_abs_diff: f64,
}

/// [`number_or_word`] for a present value (absent ones are skipped).
fn opt_number_or_word<S: serde::Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => number_or_word(v, s),
        None => s.serialize_none(),
    }
}

/// A finite `f64` as a JSON number; `inf`, `-inf` and `nan` as those strings (serde_json
/// would write `null`, which reads as "no difference measured").
fn number_or_word<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if v.is_finite() {
        s.serialize_f64(*v)
    } else if v.is_nan() {
        s.serialize_str("nan")
    } else if *v > 0.0 {
        s.serialize_str("inf")
    } else {
        s.serialize_str("-inf")
    }
}

/// Where the manifest's description of the tokenizer (`tokenizer` object, the model's
/// `special_tokens`) differs from the tokenizer file the runtime reads.
fn tokenizer_ref_faults(m: &Manifest, tok: &crate::tokenizer::Tokenizer) -> Vec<String> {
    let r = &m.tokenizer;
    let mut v = Vec::new();
    if r.file != TOKENIZER_FILE {
        v.push(format!(
            "manifest.json tokenizer.file is {:?}; the runtime reads {TOKENIZER_FILE:?}",
            r.file
        ));
    }
    if r.model != tok.model() {
        v.push(format!(
            "manifest.json tokenizer.model is {:?}, {TOKENIZER_FILE} says {:?}",
            r.model,
            tok.model()
        ));
    }
    if r.pre.as_deref().unwrap_or("") != tok.pre() {
        v.push(format!(
            "manifest.json tokenizer.pre is {:?}, {TOKENIZER_FILE} says {:?}",
            r.pre,
            tok.pre()
        ));
    }
    if r.n_vocab as usize != tok.n_vocab() {
        v.push(format!(
            "manifest.json tokenizer.n_vocab is {}, {TOKENIZER_FILE} has {} tokens",
            r.n_vocab,
            tok.n_vocab()
        ));
    }
    for (name, &id) in &m.model.special_tokens {
        // The ids the runtime uses come from the tokenizer file; the manifest must say the same.
        let used = match name.as_str() {
            "bos" => tok.bos(),
            "eos" => tok.eos(),
            "eot" => tok.eot(),
            "unknown" => tok.unk(),
            _ => None,
        };
        if let Some(u) = used {
            if u64::from(u) != id {
                v.push(format!(
                    "manifest.json model.special_tokens.{name} is {id}, {TOKENIZER_FILE} says {u}"
                ));
            }
        }
        if id >= m.model.n_vocab {
            v.push(format!(
                "manifest.json model.special_tokens.{name} = {id} is outside the vocabulary (n_vocab = {})",
                m.model.n_vocab
            ));
        }
    }
    v
}

/// Runs every check. `Err` is for problems that stop verification before it can judge
/// (unreadable or malformed manifest, unreadable source); a bundle that fails a check gives
/// `Ok` with `passed: false`.
pub fn verify(bundle: &Path, opts: &VerifyOptions) -> Result<VerifyReport, BundleError> {
    let mf = open_manifest(bundle)?;
    // The source's SHA256 on a thread of its own, beside the bundle's hashes and the
    // comparisons (plain reads: hashing must not make the whole file resident).
    let source_hash = opts
        .source
        .clone()
        .map(|p| std::thread::spawn(move || util::sha256_file(&p)));
    let source = match &opts.source {
        Some(p) => Some(GgufFile::open(p)?),
        None => None,
    };
    // Each tensor is checked as the integrity pass's single read of its file reaches its end
    // (see `check_integrity_visiting`); a tensor that pass could not hand over (its file has
    // the wrong size, it runs past the end, it overlaps another) is checked from the map below.
    let mut checked: BTreeMap<String, TensorCheck> = BTreeMap::new();
    let (maps, mut failures) = check_integrity_visiting(
        bundle,
        &mf,
        Some(&mut |t: &TensorEntry, bytes: &[u8]| {
            checked.insert(
                t.name.clone(),
                check_tensor(t, bytes, source.as_ref(), opts.maxerr),
            );
            if let Some((src, st)) = source.as_ref().and_then(|s| Some((s, s.tensor(&t.name)?))) {
                src.release(st);
            }
        }),
    )?;
    let integrity_failed = !failures.is_empty();
    let m = mf.manifest.clone();
    // Integrity failures that name a tensor (its SHA256, its place in the file) fail that
    // tensor's row too, not only the bundle.
    let integrity_of = |name: &str| -> Option<String> {
        let prefix = format!("tensor {name:?}: ");
        failures
            .iter()
            .find_map(|f| f.strip_prefix(&prefix).map(|d| d.to_string()))
    };
    let bad_integrity: BTreeMap<String, String> = m
        .tensors
        .iter()
        .filter_map(|t| integrity_of(&t.name).map(|d| (t.name.clone(), d)))
        .collect();
    // A bundle that verifies is one every backend can build: an implemented architecture,
    // the model configuration, the tensors' shapes against it, and the tokenizer.
    match crate::arch::check_manifest(&m) {
        Ok(()) => {
            // The tokenizer the runtime would load, of the model's vocabulary size.
            match crate::tokenizer::Tokenizer::for_model(bundle, m.model.n_vocab as usize) {
                Err(e) => failures.push(format!("the runtime cannot use the tokenizer: {e}")),
                Ok(tok) => failures.extend(tokenizer_ref_faults(&m, &tok)),
            }
        }
        Err(e) => failures.push(format!("the runtime cannot build the model: {e}")),
    }
    failures.extend(function_table_faults(&m));
    let (kernels, mut notes) =
        super::kernels::check_kernels(&m, bundle, &|path: &str| maps.get(path).map(|map| &map[..]));
    for k in kernels.iter().filter(|k| !k.passed) {
        failures.push(format!(
            "{}: {}",
            k.file,
            k.detail.as_deref().unwrap_or("failed")
        ));
    }
    if let Some(src) = &source {
        // The model configuration is not hashed: it must be what the source's metadata gives
        // (at the bundle's n_ctx, the one value chosen at conversion).
        match super::config::model_config(src, Some(m.model.n_ctx)) {
            Ok(want) => {
                let (a, b) = (serde_json::to_value(&m.model), serde_json::to_value(&want));
                if let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) = (a, b)
                {
                    let keys: std::collections::BTreeSet<&String> =
                        a.keys().chain(b.keys()).collect();
                    let show = |v: Option<&serde_json::Value>| {
                        let t = v.map(|v| v.to_string()).unwrap_or_else(|| "absent".into());
                        match t.char_indices().nth(120) {
                            Some((i, _)) => format!("{}...", &t[..i]),
                            None => t,
                        }
                    };
                    for k in keys {
                        if a.get(k) != b.get(k) {
                            failures.push(format!(
                                "manifest.json model.{k} is {}, the source's metadata gives {}",
                                show(a.get(k)),
                                show(b.get(k))
                            ));
                        }
                    }
                }
            }
            Err(e) => failures.push(format!("the source's model configuration: {e}")),
        }
        for t in &src.tensors {
            if !m.tensors.iter().any(|b| b.name == t.name) {
                failures.push(format!(
                    "tensor {:?} of the source is missing from the bundle",
                    t.name
                ));
            }
        }
    }
    let mut checks = Vec::with_capacity(m.tensors.len());
    for t in &m.tensors {
        let stored = maps.get(&t.file).and_then(|map| {
            let end = t.offset.checked_add(t.length)?;
            map.get(t.offset as usize..end as usize)
        });
        let check = match (checked.remove(&t.name), stored) {
            (Some(c), _) => c,
            (None, None) => TensorCheck {
                name: t.name.clone(),
                encoding: encoding_name(&t.encoding),
                compared: "none".into(),
                elements: 0,
                mismatched: 0,
                max_abs_diff: 0.0,
                max_abs_diff_vs_unquantized: None,
                passed: false,
                detail: Some(format!("file {} is missing or damaged", t.file)),
            },
            (None, Some(bytes)) => check_tensor(t, bytes, source.as_ref(), opts.maxerr),
        };
        let check = match bad_integrity.get(&t.name) {
            Some(d) => TensorCheck {
                passed: false,
                detail: Some(d.clone()),
                ..check
            },
            None => check,
        };
        // Verification reads each tensor once: let its pages go.
        if let Some(map) = maps.get(&t.file) {
            crate::gguf::release_range(map, t.offset, t.length);
        }
        if let Some(src) = source.as_ref() {
            if let Some(st) = src.tensor(&t.name) {
                src.release(st);
            }
        }
        if !check.passed && !bad_integrity.contains_key(&t.name) {
            failures.push(format!(
                "tensor {:?}: {}",
                t.name,
                check.detail.clone().unwrap_or_else(|| format!(
                    "{} of {} elements differ, max |diff| {}",
                    check.mismatched, check.elements, check.max_abs_diff
                ))
            ));
        }
        checks.push(check);
    }
    // Joined after the comparisons, which ran meanwhile.
    if let Some(src) = &source {
        let h = source_hash
            .expect("started with the source")
            .join()
            .expect("source hash thread")
            .map_err(|e| BundleError::Io {
                path: src.path().to_path_buf(),
                source: e,
            })?;
        if h != m.source.sha256 {
            failures.push(format!(
                "source {} has sha256 {h}, the bundle was made from {} with sha256 {}",
                src.path().display(),
                m.source.file_name,
                m.source.sha256
            ));
        }
    }
    let mut totals = Totals {
        tensors: checks.len(),
        ..Default::default()
    };
    for c in &checks {
        totals.passed += c.passed as usize;
        if c.encoding == "ternary2" {
            totals.ternary += 1;
        } else if c.encoding.starts_with("palette:") {
            totals.palettized += 1;
        } else {
            totals.carried += 1;
        }
        if c.compared == "values" || c.compared == "codes" {
            totals.elements_compared += c.elements;
        }
        totals.mismatched += c.mismatched;
        totals.max_abs_diff = totals.max_abs_diff.max(c.max_abs_diff);
    }
    if mf.computed.is_none() {
        notes.push(super::reader::version_1_warning(bundle));
    }
    let signature = if opts.trusted_keys.is_empty() {
        let present = bundle.join(SIGNATURE_FILE).symlink_metadata().is_ok();
        match (present, sign::signature_key_id(bundle)) {
            (false, _) => SignatureCheck {
                status: "absent",
                key_id: None,
                trusted_key: None,
            },
            (true, id) => {
                notes.push(match &id {
                    Some(id) => format!("{SIGNATURE_FILE}: signed by key {id}; not checked (give --trusted-key)"),
                    None => format!("{SIGNATURE_FILE}: not a lowbit signature; not checked (give --trusted-key)"),
                });
                SignatureCheck {
                    status: "present",
                    key_id: id,
                    trusted_key: None,
                }
            }
        }
    } else {
        match sign::check_signature(bundle, &m, mf.computed.as_ref(), &opts.trusted_keys) {
            // The signed manifest is this one, but the files do not match it.
            Ok(s) if integrity_failed => {
                failures.push(format!(
                    "signature: changed after signing: the files named above do not match the manifest key {} signed",
                    s.key_id
                ));
                SignatureCheck {
                    status: "failed",
                    key_id: Some(s.key_id),
                    trusted_key: Some(s.key_file),
                }
            }
            Ok(s) => SignatureCheck {
                status: "trusted",
                key_id: Some(s.key_id),
                trusted_key: Some(s.key_file),
            },
            Err(detail) => {
                failures.push(format!("signature: {detail}"));
                SignatureCheck {
                    status: "failed",
                    key_id: None,
                    trusted_key: None,
                }
            }
        }
    };
    Ok(VerifyReport {
        passed: failures.is_empty(),
        bundle: bundle.display().to_string(),
        source: opts.source.as_ref().map(|p| p.display().to_string()),
        maxerr: opts.maxerr,
        format_version: m.format_version,
        bundle_digest: m.bundle_digest.clone(),
        manifest_digest: m.manifest_digest.clone(),
        signature,
        files_checked: m.files.len(),
        failures,
        notes,
        tensors: checks,
        kernels,
        totals,
    })
}

fn encoding_name(e: &Encoding) -> String {
    match e {
        Encoding::Gguf { ggml_type, .. } => format!("gguf:{ggml_type}"),
        Encoding::Ternary2 { .. } => "ternary2".into(),
        Encoding::Palette { bits, mode, .. } => format!("palette:{mode}:{bits}"),
    }
}

/// Row-wise comparison result: (elements, bit mismatches, max |diff|, max |diff| vs the
/// unquantized source).
type Cmp = (u64, u64, f64, f64);

crate::multiversion! {
    /// One row: the source dequantized (for `ternarized` tensors, then put through the TQ2_0
    /// rule) against the kernel's definition from the packed words. Returns (elements,
    /// elements whose bits differ, max |diff|, max |diff| against the unquantized source).
    fn compare_row(ty: GgmlType, src_row: &[u8], ternarized: bool, words: &[u32], scales: &[u16], want: &mut [f32], got: &mut [f32]) -> Cmp {
        let k = want.len();
        quant::dequantize_body_checked(ty, src_row, want);
        let mut vs_unq = 0f64;
        if ternarized {
            for blk in want.chunks_exact_mut(ternary::BLOCK) {
                let orig: Vec<f32> = blk.to_vec();
                match ternary::quantize_tq2_0_block(&orig) {
                    Ok(q) => {
                        let d = half::f16::from_bits(q.d_bits).to_f32();
                        for (o, code) in blk.iter_mut().zip(q.codes) {
                            *o = d * (code as i8 - 1) as f32;
                        }
                        for (a, b) in blk.iter().zip(&orig) {
                            vs_unq = vs_unq.max((*a as f64 - *b as f64).abs());
                        }
                    }
                    Err(_) => blk.fill(f32::NAN),
                }
            }
        }
        ternary::row_values(words, scales, got);
        let (mism, maxd) = bit_diffs(got, want);
        (k as u64, mism, maxd, vs_unq)
    }
}

/// Elements whose bits differ, and the largest |difference| among them (infinite where one is
/// NaN). Counted branch-free; the largest difference is looked for only when there are any.
#[inline(always)]
fn bit_diffs(got: &[f32], want: &[f32]) -> (u64, f64) {
    let mism = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a.to_bits() != b.to_bits()) as u64)
        .sum::<u64>();
    let mut maxd = 0f64;
    if mism > 0 {
        for (a, b) in got.iter().zip(want) {
            if a.to_bits() != b.to_bits() {
                let d = (*a as f64 - *b as f64).abs();
                maxd = maxd.max(if d.is_nan() { f64::INFINITY } else { d });
            }
        }
    }
    (mism, maxd)
}

crate::multiversion! {
    /// One row of a tensor recovered from TQ2_0, compared in the code domain: each block of
    /// the bundle (16 words and a scale) is put back in the TQ2_0 byte layout
    /// ([`ternary::tq2_0_qs_lanes_from_words`], the inverse of what `gguf-to-ternary` ran) and
    /// compared with the source block. Equal bytes mean equal `d` bits and codes, so every
    /// value `f32(d) * (code - 1)` equals the source's dequantization bit for bit. A block
    /// whose bytes differ is compared by value, as [`compare_row`] does (values can agree with
    /// different bytes, e.g. codes 1 and 2 under `d = +0`).
    fn compare_row_tq2_0(src_row: &[u8], words: &[u32], scales: &[u16], want: &mut [f32], got: &mut [f32]) -> Cmp {
        const TS: usize = 66;
        let (mut elements, mut mism, mut maxd) = (0u64, 0u64, 0f64);
        for (b, block) in src_row.chunks_exact(TS).enumerate() {
            let wb = &words[b * ternary::WORDS_PER_BLOCK..(b + 1) * ternary::WORDS_PER_BLOCK];
            elements += ternary::BLOCK as u64;
            let qs = ternary::tq2_0_qs_lanes_from_words(wb);
            let same_qs = qs
                .iter()
                .zip(block[..64].chunks_exact(8))
                .fold(true, |a, (&x, c)| a & (x.to_le_bytes() == c));
            if same_qs && scales[b].to_le_bytes() == block[64..66] {
                continue;
            }
            let (want, got) = (&mut want[..ternary::BLOCK], &mut got[..ternary::BLOCK]);
            quant::dequantize_body_checked(GgmlType::TQ2_0, block, want);
            ternary::row_values(wb, &scales[b..b + 1], got);
            let (m, d) = bit_diffs(got, want);
            mism += m;
            maxd = maxd.max(d);
        }
        (elements, mism, maxd, 0.0)
    }
}

fn check_tensor(
    t: &TensorEntry,
    bytes: &[u8],
    source: Option<&GgufFile>,
    maxerr: f64,
) -> TensorCheck {
    let mut c = TensorCheck {
        name: t.name.clone(),
        encoding: encoding_name(&t.encoding),
        compared: "integrity".into(),
        elements: t.shape.iter().product(),
        mismatched: 0,
        max_abs_diff: 0.0,
        max_abs_diff_vs_unquantized: None,
        passed: true,
        detail: None,
    };
    let fail = |mut c: TensorCheck, d: String| {
        c.passed = false;
        c.detail = Some(d);
        c
    };
    if let Err(e) = super::reader::check_tensor_layout(t) {
        return fail(c, e);
    }
    let ternary = super::reader::ternary_parts(t, bytes);
    if let Some((words, _)) = &ternary {
        // Code 3 would make the kernel compute +2d: never valid in a bundle.
        // Both bits of a field set, 16 fields per word at once; OR-reduced per 4096 words
        // (a loop that vectorizes), the word found only when some field is 3.
        let three = |w: &u32| w & (w >> 1) & 0x5555_5555 != 0;
        let any = words
            .chunks(4096)
            .any(|c| c.iter().fold(0u32, |a, w| a | (w & (w >> 1))) & 0x5555_5555 != 0);
        if let Some(i) = any.then(|| words.iter().position(three)).flatten() {
            return fail(
                c,
                format!("packed word {i} holds code 3, which is not ternary"),
            );
        }
    }
    let Some(src) = source else {
        return c;
    };
    let Some(st) = src.tensor(&t.name) else {
        return fail(c, "not in the source".into());
    };
    if st.shape() != t.shape || st.ty.name() != t.source_type {
        return fail(
            c,
            format!(
                "source has {} {:?}, the manifest says {} {:?}",
                st.ty,
                st.shape(),
                t.source_type,
                t.shape
            ),
        );
    }
    let sbytes = src.tensor_data(st);
    match (&t.encoding, ternary) {
        (Encoding::Gguf { .. }, _) => {
            c.compared = "bytes".into();
            c.elements = sbytes.len() as u64;
            c.mismatched = if sbytes.len() != bytes.len() {
                sbytes.len().max(bytes.len()) as u64
            } else {
                sbytes.iter().zip(bytes).filter(|(a, b)| a != b).count() as u64
            };
            if c.mismatched != 0 {
                let d = format!("{} bytes differ from the source", c.mismatched);
                return fail(c, d);
            }
            c
        }
        (Encoding::Ternary2 { origin, .. }, Some((words, scales))) => {
            let k = st.row_len() as usize;
            let row_bytes = st.ty.bytes_for(k as u64).unwrap_or(0) as usize;
            let ternarized = origin == "ternarized";
            let by_codes = !ternarized && st.ty == GgmlType::TQ2_0;
            c.compared = if by_codes { "codes" } else { "values" }.into();
            let rows = st.n_rows() as usize;
            let cmp: Cmp = (0..rows)
                .into_par_iter()
                .map_init(
                    || (vec![0f32; k], vec![0f32; k]),
                    |(want, got), r| {
                        let (src_row, words, scales) = (
                            &sbytes[r * row_bytes..(r + 1) * row_bytes],
                            &words[r * k / 16..(r + 1) * k / 16],
                            &scales[r * k / 256..(r + 1) * k / 256],
                        );
                        if by_codes {
                            compare_row_tq2_0(src_row, words, scales, want, got)
                        } else {
                            compare_row(st.ty, src_row, ternarized, words, scales, want, got)
                        }
                    },
                )
                .reduce(
                    || (0, 0, 0.0, 0.0),
                    |a, b| (a.0 + b.0, a.1 + b.1, a.2.max(b.2), a.3.max(b.3)),
                );
            c.elements = cmp.0;
            c.mismatched = cmp.1;
            c.max_abs_diff = cmp.2;
            if ternarized {
                c.max_abs_diff_vs_unquantized = Some(cmp.3);
            }
            let ok = if maxerr == 0.0 {
                c.mismatched == 0
            } else {
                c.max_abs_diff <= maxerr
            };
            if !ok {
                let d = format!(
                    "{} of {} elements differ from the source, max |diff| {} > maxerr {}",
                    c.mismatched, c.elements, c.max_abs_diff, maxerr
                );
                return fail(c, d);
            }
            c
        }
        (Encoding::Ternary2 { .. }, None) => fail(c, "ternary parts out of range".into()),
        (
            Encoding::Palette {
                group_size,
                sse,
                max_abs_err,
                ..
            },
            _,
        ) => {
            // Lossy by design: the bundle must be what its manifest says, i.e. the error
            // recomputed against the source equals the recorded one bit for bit.
            c.compared = "palette-error".into();
            let Some(v) = super::reader::palette_view(t, bytes) else {
                return fail(c, "palette parts out of range".into());
            };
            let k = st.row_len() as usize;
            let row_bytes = st.ty.bytes_for(k as u64).unwrap_or(0) as usize;
            let g = *group_size as usize;
            let groups: Vec<(f64, f64)> = (0..st.n_rows() as usize / g)
                .into_par_iter()
                .map_init(
                    || (vec![0f32; k], vec![0f32; k], vec![0u8; k]),
                    |(want, got, idx), gi| {
                        let (mut s2, mut mx) = (0f64, 0f64);
                        let table = v.table_f32(gi * g);
                        for r in gi * g..(gi + 1) * g {
                            quant::dequantize_body_checked(
                                st.ty,
                                &sbytes[r * row_bytes..(r + 1) * row_bytes],
                                want,
                            );
                            v.row_with_table(&table, r, got, idx);
                            for (a, b) in got.iter().zip(want.iter()) {
                                let e = (*a as f64 - *b as f64).abs();
                                s2 += e * e;
                                mx = mx.max(e);
                            }
                        }
                        (s2, mx)
                    },
                )
                .collect();
            let total = groups.iter().fold(0f64, |a, g| a + g.0);
            let maxd = groups.iter().fold(0f64, |a, g| a.max(g.1));
            c.max_abs_diff = maxd;
            if total.to_bits() != sse.to_bits() || maxd.to_bits() != max_abs_err.to_bits() {
                let d = format!(
                    "reconstruction error against the source (sse {total}, max {maxd}) differs from the manifest's (sse {sse}, max {max_abs_err})"
                );
                return fail(c, d);
            }
            c
        }
    }
}

/// What is wrong with a manifest's function table: it must hold `main` and a `prefill_S` for
/// each bucket it declares (a valid bucket list for the context), each with the shapes the
/// model implies, and nothing else. The runtime refuses a bundle with any of these faults.
pub fn function_table_faults(m: &super::manifest::Manifest) -> Vec<String> {
    let mut failures = Vec::new();
    let buckets = super::manifest::prefill_buckets(&m.functions);
    let well_named = |k: &str| {
        k == "main"
            || k.strip_prefix("prefill_")
                .and_then(|s| s.parse::<u64>().ok())
                .is_some_and(|b| format!("prefill_{b}") == k)
    };
    if let Some(name) = m.functions.keys().find(|k| !well_named(k)) {
        failures.push(format!(
            "manifest.json functions: {name:?} is neither \"main\" nor \"prefill_S\""
        ));
    } else if !buckets.is_empty() {
        if let Err(detail) = super::manifest::check_prefill_buckets(&buckets, m.model.n_ctx) {
            failures.push(format!(
                "manifest.json functions: prefill buckets {buckets:?}: {detail}"
            ));
        }
    }
    let want = super::writer::functions_for(&m.model, &buckets);
    for (name, f) in &want {
        if m.functions.get(name) != Some(f) {
            failures.push(format!(
                "manifest.json functions.{name}: not the function the model implies (shapes, n_ctx, n_vocab)"
            ));
        }
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An infinite or NaN difference reads as such in `--json`, not as `null`.
    #[test]
    fn json_reports_infinite_differences_as_words() {
        let mut c = TensorCheck {
            name: "t".into(),
            encoding: "ternary".into(),
            compared: "values".into(),
            elements: 4,
            mismatched: 1,
            max_abs_diff: f64::INFINITY,
            max_abs_diff_vs_unquantized: None,
            passed: false,
            detail: None,
        };
        let j = |c: &TensorCheck| serde_json::to_value(c).unwrap()["max_abs_diff"].clone();
        assert_eq!(j(&c), serde_json::json!("inf"));
        c.max_abs_diff = f64::NAN;
        assert_eq!(j(&c), serde_json::json!("nan"));
        c.max_abs_diff = 0.5;
        assert_eq!(j(&c), serde_json::json!(0.5));
        c.max_abs_diff_vs_unquantized = Some(f64::INFINITY);
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["max_abs_diff_vs_unquantized"], "inf");
        let t = Totals {
            max_abs_diff: f64::NEG_INFINITY,
            ..Totals::default()
        };
        assert_eq!(serde_json::to_value(&t).unwrap()["max_abs_diff"], "-inf");
    }
}
