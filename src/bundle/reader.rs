//! Opens bundles: reads and validates the manifest, checks every file and tensor against it,
//! and gives access to tensors as stored or reconstructed as the runtime defines them.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Component, Path, PathBuf};

use memmap2::Mmap;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

use super::manifest::*;
use super::BundleError;
use crate::ggml::GgmlType;
use crate::palette;
use crate::quant;
use crate::ternary;
use crate::util;

/// The largest manifest accepted (a manifest holds no tensor data; real ones are < 1 MiB).
pub const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// A typed parse error with the path of the field it is about (`tensors[3].ne: invalid type:
/// string "x", expected u64`), or without one where the document itself is the problem.
pub(crate) fn field_error(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    field_error_under("", e)
}

/// [`field_error`] for a document found under `prefix` (`lowbit.model.n_layer: ...`).
pub(crate) fn field_error_under(
    prefix: &str,
    e: &serde_path_to_error::Error<serde_json::Error>,
) -> String {
    let path = e.path().to_string();
    let path = if path == "." { "" } else { path.as_str() };
    match (prefix, path) {
        ("", "") => e.inner().to_string(),
        (pre, "") | ("", pre) => format!("{pre}: {}", e.inner()),
        (pre, p) => format!("{pre}.{p}: {}", e.inner()),
    }
}

fn manifest_err(path: &Path, detail: impl Into<String>) -> BundleError {
    BundleError::Manifest {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

/// Checks that a manifest path stays inside the bundle: relative, `/`-separated, no `.`/`..`,
/// no empty components, no backslashes or NULs.
pub fn safe_relative_path(p: &str) -> bool {
    if p.is_empty() || p.contains('\\') || p.contains('\0') || p.starts_with('/') {
        return false;
    }
    let path = Path::new(p);
    path.components().all(|c| matches!(c, Component::Normal(_)))
        && p.split('/').all(|s| !s.is_empty() && s != "." && s != "..")
}

/// A manifest as read from a bundle, with what its content hashes to.
#[derive(Clone, Debug)]
pub struct ManifestFile {
    pub manifest: Manifest,
    /// Versions 2 and 3: both digests computed from the JSON read (the bytes the manifest was parsed
    /// from), for [`check_integrity`] to compare with the stored ones and [`super::sign`] with
    /// a signature. `None` for version 1, whose manifest no digest covers.
    pub computed: Option<Digests>,
}

/// The warning a reader gives for a version-1 bundle.
pub fn version_1_warning(dir: &Path) -> String {
    format!(
        "{}: manifest format_version 1: its bundle digest covers the files but not manifest.json, so an edited model configuration, tokenizer reference or kernel entry goes unnoticed; `convert add-kernels {}` rewrites it as version {FORMAT_VERSION}, which covers the manifest",
        dir.display(),
        dir.display()
    )
}

/// Reads `manifest.json` ([`open_manifest`]) and returns the manifest alone.
pub fn read_manifest(dir: &Path) -> Result<Manifest, BundleError> {
    open_manifest(dir).map(|m| m.manifest)
}

/// Reads `manifest.json`, checks its format and version (3, 2, or 1 with a warning on stderr,
/// [`version_1_warning`]), parses it strictly, checks that every hash is well formed, that
/// every file is listed by the digest its version gives it (version 3: `tensors_sha256` for a
/// file holding tensors, `sha256` for the others; before: `sha256` for all) and that every
/// path stays inside the bundle, and computes its digests (versions 2 and 3) from the JSON read. Errors
/// here mean the manifest is unusable ([`BundleError::Manifest`]); whether the digests match
/// is [`check_integrity`]'s to say.
pub fn open_manifest(dir: &Path) -> Result<ManifestFile, BundleError> {
    let mpath = dir.join(MANIFEST_FILE);
    let meta = std::fs::symlink_metadata(dir).map_err(|source| BundleError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    if meta.file_type().is_symlink() {
        return Err(manifest_err(
            dir,
            "a symbolic link: a bundle is opened only as the directory itself (give the path it points to)",
        ));
    }
    if !meta.is_dir() {
        return Err(manifest_err(dir, "not a bundle directory"));
    }
    let mmeta = std::fs::symlink_metadata(&mpath).map_err(|source| BundleError::Io {
        path: mpath.clone(),
        source,
    })?;
    if !mmeta.is_file() {
        return Err(manifest_err(
            &mpath,
            "not a regular file (symlinks are refused)",
        ));
    }
    if mmeta.len() > MAX_MANIFEST_BYTES {
        return Err(manifest_err(
            &mpath,
            format!(
                "{} bytes is larger than the limit of {MAX_MANIFEST_BYTES}",
                mmeta.len()
            ),
        ));
    }
    let bytes = std::fs::read(&mpath).map_err(|source| BundleError::Io {
        path: mpath.clone(),
        source,
    })?;
    let json: Json = serde_json::from_slice(&bytes)
        .map_err(|e| manifest_err(&mpath, format!("not valid JSON: {e}")))?;
    // One member name twice in an object: serde_json keeps the last, another reader the
    // first, and the digests cover what this reader kept.
    super::canonical::check_unique_members(&bytes).map_err(|e| manifest_err(&mpath, e))?;
    match json.get("format").and_then(|v| v.as_str()) {
        Some(FORMAT) => {}
        other => {
            return Err(manifest_err(
                &mpath,
                format!("format is {other:?}, expected {FORMAT:?}: not a lowbit bundle manifest"),
            ))
        }
    }
    let version = match json.get("format_version").and_then(|v| v.as_u64()) {
        Some(v) if (FORMAT_VERSION_1 as u64..=FORMAT_VERSION as u64).contains(&v) => v as u32,
        other => {
            return Err(manifest_err(
                &mpath,
                format!(
                    "unsupported format_version {}: this build reads versions {FORMAT_VERSION_1} to {FORMAT_VERSION}",
                    match json.get("format_version") {
                        None => "(missing)".to_string(),
                        Some(raw) => other
                            .map(|v| v.to_string())
                            .unwrap_or_else(|| format!("{raw} (not an unsigned integer)")),
                    }
                ),
            ))
        }
    };
    let computed = (version >= FORMAT_VERSION_2).then(|| digests_of_json(&json));
    let m: Manifest = serde_path_to_error::deserialize(json)
        .map_err(|e| manifest_err(&mpath, format!("malformed manifest: {}", field_error(&e))))?;
    let bad_hash = |what: String, h: &str| -> Result<(), BundleError> {
        if is_sha256(h) {
            Ok(())
        } else {
            Err(manifest_err(
                &mpath,
                format!("{what}: malformed sha256 {h:?} (expected 64 lowercase hex digits)"),
            ))
        }
    };
    bad_hash("bundle_digest".into(), &m.bundle_digest)?;
    match (&m.manifest_digest, version >= FORMAT_VERSION_2) {
        (Some(d), true) => bad_hash("manifest_digest".into(), d)?,
        (None, true) => {
            return Err(manifest_err(
                &mpath,
                format!("manifest_digest is missing (required in format_version {version})"),
            ))
        }
        (Some(_), false) => {
            return Err(manifest_err(
                &mpath,
                format!("manifest_digest is not a member of format_version {version} (it came with version {FORMAT_VERSION_2})"),
            ))
        }
        (None, false) => {}
    }
    bad_hash("source.sha256".into(), &m.source.sha256)?;
    let mut paths = BTreeSet::new();
    for f in &m.files {
        if !safe_relative_path(&f.path) || f.path == MANIFEST_FILE || f.path == SIGNATURE_FILE {
            return Err(manifest_err(
                &mpath,
                format!(
                    "file path {:?} escapes the bundle, is not a plain relative path, or is {MANIFEST_FILE} or {SIGNATURE_FILE} (never listed)",
                    f.path
                ),
            ));
        }
        if !paths.insert(f.path.as_str()) {
            return Err(manifest_err(
                &mpath,
                format!("file {:?} listed twice", f.path),
            ));
        }
        let holds_tensors = m.holds_tensors(&f.path);
        match (&f.sha256, &f.tensors_sha256) {
            (Some(h), None) if version < FORMAT_VERSION || !holds_tensors => {
                bad_hash(format!("file {:?}", f.path), h)?
            }
            (None, Some(h)) if version >= FORMAT_VERSION && holds_tensors => {
                bad_hash(format!("file {:?}: tensors_sha256", f.path), h)?
            }
            _ => {
                let want = if version >= FORMAT_VERSION && holds_tensors {
                    "tensors_sha256 (the SHA256 of its tensor table), and no sha256, as a file holding tensors"
                } else if version >= FORMAT_VERSION {
                    "sha256, and no tensors_sha256, as a file holding no tensor"
                } else {
                    "sha256, and no tensors_sha256 (which came with version 3)"
                };
                return Err(manifest_err(
                    &mpath,
                    format!(
                        "file {:?}: format_version {version} lists it with {want}",
                        f.path
                    ),
                ));
            }
        }
    }
    let mut names = BTreeSet::new();
    for t in &m.tensors {
        if !names.insert(t.name.as_str()) {
            return Err(manifest_err(
                &mpath,
                format!("tensor {:?} listed twice", t.name),
            ));
        }
        bad_hash(format!("tensor {:?}", t.name), &t.sha256)?;
        if !paths.contains(t.file.as_str()) {
            return Err(manifest_err(
                &mpath,
                format!(
                    "tensor {:?}: file {:?} is not in the file list",
                    t.name, t.file
                ),
            ));
        }
    }
    if !paths.contains(m.tokenizer.file.as_str()) {
        return Err(manifest_err(
            &mpath,
            format!(
                "tokenizer file {:?} is not in the file list",
                m.tokenizer.file
            ),
        ));
    }
    if let Some(fault) = super::kernels::manifest_faults(&m).into_iter().next() {
        return Err(manifest_err(&mpath, fault));
    }
    if version == FORMAT_VERSION_1 {
        util::warn_once(&version_1_warning(dir));
    }
    Ok(ManifestFile {
        manifest: m,
        computed,
    })
}

/// Resolves a manifest path inside `dir`, refusing symlinks anywhere along it.
fn resolve(dir: &Path, rel: &str) -> Result<PathBuf, String> {
    let mut p = dir.to_path_buf();
    for part in rel.split('/') {
        p.push(part);
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(format!("{rel}: is or passes through a symlink; refused"))
            }
            Ok(_) => {}
            Err(_) => return Err(format!("{rel}: missing")),
        }
    }
    Ok(p)
}

/// Every regular file and symlink under `dir`, as `/`-separated relative paths.
fn list_files(dir: &Path, rel: &str, out: &mut Vec<String>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let r = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let ft = e.file_type()?;
        if ft.is_dir() {
            list_files(&e.path(), &r, out)?;
        } else {
            out.push(r);
        }
    }
    Ok(())
}

/// A file's hashes, fed its bytes front to back in windows: the whole file's SHA256 (`whole`,
/// format versions 1 and 2) and each of `ranges`' (sorted by offset, not overlapping), both
/// per window at once on two rayon workers; without `whole` (version 3), the first byte
/// outside every range that is not zero. With `hold`, each range's bytes are also kept until
/// the windows pass its end and then handed to the caller's visitor.
struct WindowHasher<'r> {
    ranges: &'r [(u64, u64)],
    whole: Option<Sha256>,
    hashers: Vec<Sha256>,
    /// Each range's bytes so far (`hold`), reserved at most up to `size`: a range's length
    /// comes from the manifest, which may claim more than the file holds.
    held: Option<Vec<Vec<u8>>>,
    /// Buffers of visited ranges, for the next ranges to hold.
    spare: Vec<Vec<u8>>,
    size: u64,
    /// The first range the windows have not passed yet.
    first: usize,
    /// Without `whole`: the offset of the first non-zero byte outside the ranges.
    nonzero: Option<u64>,
}

impl<'r> WindowHasher<'r> {
    fn new(ranges: &'r [(u64, u64)], size: u64, whole: bool, hold: bool) -> Self {
        // Without `whole`, ranges are hashed as they complete, from the held bytes.
        debug_assert!(
            whole || hold,
            "a range hash without the whole file's needs hold"
        );
        WindowHasher {
            ranges,
            whole: whole.then(Sha256::new),
            hashers: ranges.iter().map(|_| Sha256::new()).collect(),
            held: hold.then(|| vec![Vec::new(); ranges.len()]),
            spare: Vec::new(),
            size,
            first: 0,
            nonzero: None,
        }
    }

    /// Hashes the window of bytes `pos ..`; calls `visit(i, bytes)` (with `hold`) for each
    /// range `i` that ends inside it.
    fn window(&mut self, pos: u64, chunk: &[u8], visit: &mut dyn FnMut(usize, &[u8])) {
        let end = pos + chunk.len() as u64;
        let WindowHasher {
            ranges,
            whole,
            hashers,
            held,
            spare,
            size,
            first,
            nonzero,
        } = self;
        // Without the whole file's hash, a (held) range is hashed once complete, beside its
        // visit (below), not window by window on this thread.
        let hash_whole_ranges = whole.is_none();
        let mut ranges_part = || {
            for (i, &(off, rlen)) in ranges.iter().enumerate().skip(*first) {
                if off >= end {
                    break;
                }
                let a = off.max(pos);
                let b = (off + rlen).min(end);
                if b > a {
                    let part = &chunk[(a - pos) as usize..(b - pos) as usize];
                    if !hash_whole_ranges {
                        hashers[i].update(part);
                    }
                    if let Some(held) = held.as_mut() {
                        if held[i].is_empty() {
                            held[i] = spare.pop().unwrap_or_default();
                            held[i].clear();
                            held[i].reserve_exact(rlen.min(size.saturating_sub(off)) as usize);
                        }
                        held[i].extend_from_slice(part);
                    }
                }
            }
        };
        match whole.as_mut() {
            Some(w) => {
                rayon::join(|| w.update(chunk), ranges_part);
            }
            None => {
                if nonzero.is_none() {
                    *nonzero = first_nonzero_outside(ranges, pos, chunk);
                }
                ranges_part();
            }
        }
        while *first < ranges.len() && ranges[*first].0 + ranges[*first].1 <= end {
            if let Some(held) = held.as_mut() {
                let bytes = std::mem::take(&mut held[*first]);
                if hash_whole_ranges {
                    // The range's SHA256 on a thread of its own while the visitor compares it.
                    let h = std::mem::take(&mut hashers[*first]);
                    hashers[*first] = std::thread::scope(|s| {
                        let h = s.spawn(|| h.chain_update(&bytes));
                        visit(*first, &bytes);
                        h.join().expect("hashing does not panic")
                    });
                } else {
                    visit(*first, &bytes);
                }
                // The buffer is reused for a later range (no fresh pages to fault in).
                if spare.len() < 2 {
                    spare.push(bytes);
                }
            }
            *first += 1;
        }
    }

    /// The file's SHA256 (when taken) and each range's (`None` for a range past `len`, the
    /// bytes hashed), and the first non-zero byte outside the ranges (when checked).
    fn finish(self, len: u64) -> FileHashes {
        let ranges = self
            .ranges
            .iter()
            .zip(self.hashers)
            .map(|(&(off, rlen), h)| (off + rlen <= len).then(|| hex::encode(h.finalize())))
            .collect();
        FileHashes {
            whole: self.whole.map(|h| hex::encode(h.finalize())),
            ranges,
            nonzero: self.nonzero,
        }
    }
}

/// What [`WindowHasher`] and [`hash_map_and_ranges`] found in one file.
struct FileHashes {
    /// The whole file's SHA256 (format versions 1 and 2).
    whole: Option<String>,
    /// Each range's SHA256; `None` for one that runs past the end of the file.
    ranges: Vec<Option<String>>,
    /// Version 3: the offset of the first non-zero byte outside every range.
    nonzero: Option<u64>,
}

/// The offset of the first non-zero byte of `chunk` (the file's bytes from `pos`) that lies
/// outside every one of `ranges` (sorted by offset, not overlapping).
fn first_nonzero_outside(ranges: &[(u64, u64)], pos: u64, chunk: &[u8]) -> Option<u64> {
    let end = pos + chunk.len() as u64;
    // The first range ending after `pos`.
    let mut i = ranges.partition_point(|&(off, len)| off.saturating_add(len) <= pos);
    let mut at = pos;
    while at < end {
        let (gap_end, next) = match ranges.get(i) {
            Some(&(off, len)) if off < end => (off.max(at), off.saturating_add(len).max(at)),
            _ => (end, end),
        };
        if gap_end > at {
            let gap = &chunk[(at - pos) as usize..(gap_end - pos) as usize];
            if let Some(j) = gap.iter().position(|&b| b != 0) {
                return Some(at + j as u64);
            }
        }
        at = next.min(end);
        i += 1;
    }
    None
}

/// The offset of the first byte of the bundle file `path` (of `m`'s files, in `dir`) that lies
/// outside every tensor and is not zero; what a version-1 or -2 weight file must not have to be
/// listed as version 3 ([`super::writer::add_kernels`] checks it before rewriting a bundle).
pub(crate) fn nonzero_outside_tensors(
    dir: &Path,
    m: &Manifest,
    path: &str,
) -> Result<Option<u64>, BundleError> {
    let p = dir.join(path);
    let file = File::open(&p).map_err(|source| BundleError::Io {
        path: p.clone(),
        source,
    })?;
    // SAFETY: read-only map; bundles must not be modified while open.
    let map = unsafe { Mmap::map(&file) }.map_err(|source| BundleError::Io { path: p, source })?;
    let mut ranges: Vec<(u64, u64)> = m
        .tensors
        .iter()
        .filter(|t| t.file == path)
        .map(|t| (t.offset, t.length))
        .collect();
    ranges.sort_unstable();
    Ok(first_nonzero_outside(&ranges, 0, &map))
}

/// Reads a file once, front to back, with direct I/O ([`crate::direct_io::read_windows`]),
/// hashing it (`whole`) and each of `ranges` ([`WindowHasher`]), and calls `visit(i, bytes)`
/// with range `i`'s bytes once the read has passed its end (a range that runs past the end of
/// the file gets `None` and no visit). Memory: the windows in flight and the range in progress.
fn scan_file(
    path: &Path,
    ranges: &[(u64, u64)],
    whole: bool,
    visit: &mut dyn FnMut(usize, &[u8]),
) -> std::io::Result<FileHashes> {
    let size = std::fs::metadata(path)?.len();
    let mut h = WindowHasher::new(ranges, size, whole, true);
    let len = crate::direct_io::read_windows(path, |pos, chunk| {
        h.window(pos, chunk, visit);
        Ok(())
    })?;
    Ok(h.finish(len))
}

/// Hashes a mapped file's `ranges` (sorted by offset, not overlapping) and, with `whole`, the
/// whole file. With `whole` (format versions 1 and 2) the map is read once front to back
/// ([`WindowHasher`]); without (version 3) the ranges are hashed in parallel on the rayon
/// pool, each by itself, and the bytes outside them checked for zeros. Each 8 MiB window is
/// dropped from this process's resident set once hashed, so memory stays flat and no byte is
/// copied.
fn hash_map_and_ranges(map: &Mmap, ranges: &[(u64, u64)], whole: bool) -> FileHashes {
    const WINDOW: usize = 8 << 20;
    let len = map.len() as u64;
    if whole {
        let mut h = WindowHasher::new(ranges, len, true, false);
        for (wi, chunk) in map.chunks(WINDOW).enumerate() {
            let pos = (wi * WINDOW) as u64;
            h.window(pos, chunk, &mut |_, _| {});
            crate::gguf::release_range(map, pos, chunk.len() as u64);
        }
        return h.finish(len);
    }
    use rayon::prelude::*;
    let hashes = ranges
        .par_iter()
        .map(|&(off, rlen)| {
            let end = off.checked_add(rlen).filter(|&e| e <= len)?;
            let mut h = Sha256::new();
            let mut at = off;
            while at < end {
                let b = (at + WINDOW as u64).min(end);
                h.update(&map[at as usize..b as usize]);
                crate::gguf::release_range(map, at, b - at);
                at = b;
            }
            Some(hex::encode(h.finalize()))
        })
        .collect();
    // The bytes outside the ranges, a window at a time, each window's pages dropped after (a
    // file padded with gigabytes of zeros is read once, not kept resident).
    let mut nonzero = None;
    for (wi, chunk) in map.chunks(WINDOW).enumerate() {
        let pos = (wi * WINDOW) as u64;
        nonzero = first_nonzero_outside(ranges, pos, chunk);
        crate::gguf::release_range(map, pos, chunk.len() as u64);
        if nonzero.is_some() {
            break;
        }
    }
    FileHashes {
        whole: None,
        ranges: hashes,
        nonzero,
    }
}

/// Checks the bundle against its manifest: every listed file present, regular, of the listed
/// size and SHA256 (the kernel files among them, whose `kernels` entries must agree with the
/// file list); no unlisted file; the bundle digest; every tensor inside its file, aligned,
/// consistent with its encoding and shape, not overlapping another, and of the listed SHA256.
/// A version-3 weight file instead of its SHA256: its `tensors_sha256` equal to its tensor
/// table's, and zeros outside its tensors. Files are memory-mapped and hashed through the
/// map (a version-3 weight file's tensors in parallel, each hashed once), each window dropped
/// from the resident set after it is hashed (so checking a multi-GB bundle does not make it
/// resident). Returns the maps and every failure found (empty when the bundle is intact).
///
/// The digests: for versions 2 and 3, the ones [`open_manifest`] computed from the manifest's content
/// against `bundle_digest` and `manifest_digest`; for version 1, the SHA256 of
/// [`canonical_file_list`] against `bundle_digest`. The only file a version-2 or -3 bundle may hold
/// besides its listed files and the manifest is [`SIGNATURE_FILE`] (at the top level).
pub fn check_integrity(
    dir: &Path,
    mf: &ManifestFile,
) -> Result<(BTreeMap<String, Mmap>, Vec<String>), BundleError> {
    check_integrity_visiting(dir, mf, None)
}

/// A tensor's bytes as [`check_integrity_visiting`] reads them.
pub type TensorVisitor<'v> = &'v mut dyn FnMut(&TensorEntry, &[u8]);

/// [`check_integrity`], and with `visit`, each tensor's bytes handed to `visit` in file order
/// as the single read of its file reaches its end (`convert verify` compares it then). A file
/// holding tensors is then read with direct I/O ([`crate::direct_io::read_windows`]) instead
/// of through the map, so a bundle that is not in the page cache is read from disk once, at
/// disk speed, and not again for the comparisons. Tensors of a file whose size is wrong, that
/// run past its end or that overlap are not visited.
pub fn check_integrity_visiting(
    dir: &Path,
    mf: &ManifestFile,
    mut visit: Option<TensorVisitor<'_>>,
) -> Result<(BTreeMap<String, Mmap>, Vec<String>), BundleError> {
    let m = &mf.manifest;
    let mut failures = super::kernels::integrity_faults(m);
    let mut maps = BTreeMap::new();
    for t in &m.tensors {
        if let Err(e) = check_tensor_layout(t) {
            failures.push(format!("tensor {:?}: {e}", t.name));
        }
    }
    for f in &m.files {
        let p = match resolve(dir, &f.path) {
            Ok(p) => p,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        let io = |source| BundleError::Io {
            path: p.clone(),
            source,
        };
        let meta = std::fs::symlink_metadata(&p).map_err(io)?;
        if !meta.is_file() {
            failures.push(format!("{}: not a regular file", f.path));
            continue;
        }
        if meta.len() != f.size {
            failures.push(format!(
                "{}: {} bytes, the manifest says {} (truncated or extended)",
                f.path,
                meta.len(),
                f.size
            ));
            continue;
        }
        // A tensor whose end overflows 64 bits is a layout failure (above) and takes no part
        // in hashing, the overlap check or the zeros check: its range cannot be computed.
        let mut in_file: Vec<&TensorEntry> = m
            .tensors
            .iter()
            .filter(|t| t.file == f.path && t.offset.checked_add(t.length).is_some())
            .collect();
        in_file.sort_by_key(|t| (t.offset, t.length));
        let mut ranges = Vec::with_capacity(in_file.len());
        let mut prev_end = 0u64;
        let mut prev_name = "";
        for t in &in_file {
            if t.offset < prev_end {
                failures.push(format!(
                    "tensor {:?} at bytes {}.. overlaps tensor {prev_name:?} ending at {prev_end}",
                    t.name, t.offset
                ));
            }
            if t.offset + t.length > prev_end {
                prev_end = t.offset + t.length;
                prev_name = &t.name;
            }
            ranges.push((t.offset, t.length));
        }
        let overlapping = failures.iter().any(|e| e.contains("overlaps"));
        // Version 3 (a file holding tensors): after the last tensor a writer leaves at most
        // the zero padding to the next multiple of ALIGNMENT. More is refused before any
        // byte is read: a sparse file claiming gigabytes of "padding" would otherwise be
        // scanned for zeros end to end.
        let tail = f.size.saturating_sub(prev_end);
        if f.tensors_sha256.is_some() && tail >= ALIGNMENT {
            failures.push(format!(
                "{}: {tail} bytes after the last tensor (which ends at byte {prev_end}); a bundle \
                 pads a tensor file to a multiple of {ALIGNMENT} bytes at most",
                f.path
            ));
            continue;
        }
        let file = File::open(&p).map_err(io)?;
        // SAFETY: read-only map; bundles must not be modified while open.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        // Version 3 (a file holding tensors): the tensors' hashes and zeros elsewhere stand
        // for the file's hash; the table they make must be the one the entry lists.
        let whole = f.tensors_sha256.is_none();
        if let Some(listed) = &f.tensors_sha256 {
            let table = util::sha256_hex(tensor_table(&m.tensors, &f.path).as_bytes());
            if &table != listed {
                failures.push(format!(
                    "{}: tensors_sha256 {listed} does not match {table}, the SHA256 of its tensor table (each tensor's offset, length and sha256 in the manifest)",
                    f.path
                ));
            }
        }
        let hashes = match visit.as_mut() {
            Some(v) if !overlapping && !in_file.is_empty() => {
                scan_file(&p, &ranges, whole, &mut |i, bytes| v(in_file[i], bytes)).map_err(io)?
            }
            // Overlapping tensors: no range is hashed (each is failed above); the whole file
            // still is where its entry lists its SHA256.
            _ if overlapping => FileHashes {
                whole: whole
                    .then(|| hash_map_and_ranges(&map, &[], true).whole)
                    .flatten(),
                ranges: vec![None; ranges.len()],
                nonzero: None,
            },
            _ => hash_map_and_ranges(&map, &ranges, whole),
        };
        if let (Some(h), Some(listed)) = (&hashes.whole, &f.sha256) {
            if h != listed {
                failures.push(format!(
                    "{}: sha256 {h} does not match the manifest's {listed}",
                    f.path
                ));
            }
        }
        if let Some(at) = hashes.nonzero {
            failures.push(format!(
                "{}: byte {at} lies outside every tensor and is not zero (format version {} requires zero padding between tensors)",
                f.path, m.format_version
            ));
        }
        if !overlapping {
            for (t, th) in in_file.iter().zip(hashes.ranges) {
                match th {
                    Some(th) if th == t.sha256 => {}
                    Some(th) => failures.push(format!(
                        "tensor {:?}: sha256 {th} does not match the manifest's {}",
                        t.name, t.sha256
                    )),
                    None => failures.push(format!(
                        "tensor {:?}: bytes {}..{} run past the end of {} ({} bytes)",
                        t.name,
                        t.offset,
                        t.offset.saturating_add(t.length),
                        t.file,
                        f.size
                    )),
                }
            }
        }
        maps.insert(f.path.clone(), map);
    }
    let mut present = Vec::new();
    list_files(dir, "", &mut present).map_err(|source| BundleError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let listed: BTreeSet<&str> = m.files.iter().map(|f| f.path.as_str()).collect();
    for p in present {
        // A version-2 or -3 bundle's signature: a regular file (a symlink is an extra file).
        let signature = p == SIGNATURE_FILE
            && mf.computed.is_some()
            && std::fs::symlink_metadata(dir.join(&p)).is_ok_and(|m| m.is_file());
        if p != MANIFEST_FILE && !signature && !listed.contains(p.as_str()) {
            failures.push(format!("{p}: extra file not listed in the manifest"));
        }
    }
    match &mf.computed {
        Some(c) => {
            if c.bundle_digest != m.bundle_digest {
                failures.push(format!(
                    "{MANIFEST_FILE}: bundle digest {} over its canonical content (producer left out) does not match its bundle_digest {}: the model configuration, functions, tensors, tokenizer reference, kernels or file list were changed after it was written",
                    c.bundle_digest, m.bundle_digest
                ));
            }
            let stored = m.manifest_digest.as_deref().unwrap_or("");
            if c.manifest_digest != stored {
                failures.push(format!(
                    "{MANIFEST_FILE}: manifest digest {} over its canonical content does not match its manifest_digest {stored}: the manifest was changed after it was written{}",
                    c.manifest_digest,
                    if c.bundle_digest == m.bundle_digest { " (its producer or bundle_digest, as the bundle digest matches)" } else { "" }
                ));
            }
        }
        None => {
            let digest = util::sha256_hex(canonical_file_list(&m.files).as_bytes());
            if digest != m.bundle_digest {
                failures.push(format!(
                    "bundle digest {digest} over the file list does not match the manifest's {}",
                    m.bundle_digest
                ));
            }
        }
    }
    Ok((maps, failures))
}

/// Elements of a row-major shape, checked.
fn n_elements(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))
}

/// Checks that a tensor's length, alignment and encoding parameters agree with its shape.
pub fn check_tensor_layout(t: &TensorEntry) -> Result<(), String> {
    if t.offset.checked_add(t.length).is_none() {
        return Err(format!(
            "offset {} + length {} overflows 64 bits (no file holds those bytes)",
            t.offset, t.length
        ));
    }
    if !t.offset.is_multiple_of(ALIGNMENT) {
        return Err(format!(
            "offset {} is not a multiple of {ALIGNMENT}",
            t.offset
        ));
    }
    let n = n_elements(&t.shape).ok_or("shape overflows")?;
    let k = t.shape.last().copied().unwrap_or(1);
    match &t.encoding {
        Encoding::Gguf {
            ggml_type,
            ggml_type_id,
            block_size,
            type_size,
        } => {
            let ty =
                GgmlType::from_name(ggml_type).ok_or(format!("unknown ggml type {ggml_type:?}"))?;
            if ty.id() != *ggml_type_id
                || ty.block_size() as u64 != *block_size
                || ty.type_size() as u64 != *type_size
            {
                return Err(format!("type {ggml_type} does not match id/block/type size {ggml_type_id}/{block_size}/{type_size}"));
            }
            if k % *block_size != 0 {
                return Err(format!(
                    "row length {k} is not a multiple of the {ggml_type} block size"
                ));
            }
            let want = ty.bytes_for(n).ok_or("size overflows")?;
            if want != t.length {
                return Err(format!(
                    "length {} but {ggml_type} of shape {:?} needs {want}",
                    t.length, t.shape
                ));
            }
        }
        Encoding::Ternary2 {
            block_size,
            codes_per_word,
            codes_offset,
            codes_length,
            scales_offset,
            scales_length,
            scale_dtype,
            ..
        } => {
            if *block_size != ternary::BLOCK as u64
                || *codes_per_word != ternary::CODES_PER_WORD as u64
                || scale_dtype != "float16"
            {
                return Err("ternary2 parameters must be block_size 256, codes_per_word 16, scale_dtype float16".into());
            }
            if k % 256 != 0 {
                return Err(format!("row length {k} is not a multiple of 256"));
            }
            if *codes_offset != 0 || *codes_length != n / 4 {
                return Err(format!(
                    "codes at {codes_offset} of length {codes_length}, expected 0 and {}",
                    n / 4
                ));
            }
            if *scales_length != n / 256 * 2
                || *scales_offset < *codes_length
                || *scales_offset % ALIGNMENT != 0
            {
                return Err(format!(
                    "scales at {scales_offset} of length {scales_length} do not fit the layout"
                ));
            }
            if scales_offset.checked_add(*scales_length) != Some(t.length) {
                return Err(format!(
                    "length {} does not end at the scales' end",
                    t.length
                ));
            }
        }
        Encoding::Palette {
            bits,
            mode,
            group_size,
            table_dtype,
            tables_offset,
            tables_length,
            indices_offset,
            indices_length,
            row_bytes,
            sse,
            max_abs_err,
        } => {
            if !palette::SUPPORTED_BITS.contains(bits) {
                return Err(format!(
                    "palette bits {bits} is not one of {:?}",
                    palette::SUPPORTED_BITS
                ));
            }
            if palette::Mode::from_name(mode).is_none() || table_dtype != "float16" {
                return Err(format!(
                    "palette mode {mode:?} / table_dtype {table_dtype:?}: expected kmeans or uniform / float16"
                ));
            }
            let [rows, cols] = t.shape[..] else {
                return Err(format!("palette tensor must be 2-D, shape {:?}", t.shape));
            };
            if *group_size == 0 || rows % *group_size != 0 {
                return Err(format!(
                    "{rows} rows are not a whole number of groups of {group_size}"
                ));
            }
            let want_tables = (rows / group_size)
                .checked_mul(2u64 << bits)
                .ok_or("size overflows")?;
            let want_rb = palette::row_bytes(cols, *bits);
            let want_idx = rows.checked_mul(want_rb).ok_or("size overflows")?;
            if *indices_offset != 0 || *row_bytes != want_rb || *indices_length != want_idx {
                return Err(format!(
                    "indices at {indices_offset} of length {indices_length} ({row_bytes} bytes per row), expected 0 and {want_idx} ({want_rb} bytes per row)"
                ));
            }
            if *tables_length != want_tables
                || *tables_offset < *indices_length
                || *tables_offset % ALIGNMENT != 0
                || tables_offset.checked_add(*tables_length) != Some(t.length)
            {
                return Err(format!(
                    "tables at {tables_offset} of length {tables_length} do not fit the layout ({want_tables} bytes after the indices, ending at the tensor length {})",
                    t.length
                ));
            }
            if !(sse.is_finite() && *sse >= 0.0 && max_abs_err.is_finite() && *max_abs_err >= 0.0) {
                return Err(format!(
                    "palette errors sse {sse} / max_abs_err {max_abs_err} must be finite and >= 0"
                ));
            }
        }
    }
    Ok(())
}

/// A palettized tensor's view over its stored bytes; `None` for other encodings or parts that
/// do not fit in `bytes`.
pub fn palette_view<'a>(t: &TensorEntry, bytes: &'a [u8]) -> Option<palette::PaletteView<'a>> {
    let Encoding::Palette {
        bits,
        group_size,
        tables_offset,
        tables_length,
        indices_offset,
        indices_length,
        row_bytes,
        ..
    } = &t.encoding
    else {
        return None;
    };
    let tables =
        bytes.get(*tables_offset as usize..tables_offset.checked_add(*tables_length)? as usize)?;
    let indices = bytes
        .get(*indices_offset as usize..indices_offset.checked_add(*indices_length)? as usize)?;
    Some(palette::PaletteView {
        bits: *bits,
        group_size: *group_size as usize,
        cols: *t.shape.last()? as usize,
        row_bytes: *row_bytes as usize,
        tables,
        indices,
    })
}

/// A ternary tensor's codes (u32 words) and scales (f16 bits), borrowed from the bundle's
/// bytes where they can be.
pub type TernaryParts<'a> = (Cow<'a, [u32]>, Cow<'a, [u16]>);

/// A ternary tensor's packed words and f16 scale bits from its stored bytes; `None` for other
/// encodings or parts that do not fit in `bytes`.
pub fn ternary_parts<'a>(t: &TensorEntry, bytes: &'a [u8]) -> Option<TernaryParts<'a>> {
    let Encoding::Ternary2 {
        codes_offset,
        codes_length,
        scales_offset,
        scales_length,
        ..
    } = &t.encoding
    else {
        return None;
    };
    let codes =
        bytes.get(*codes_offset as usize..codes_offset.checked_add(*codes_length)? as usize)?;
    let scales =
        bytes.get(*scales_offset as usize..scales_offset.checked_add(*scales_length)? as usize)?;
    // Read in place where the bytes are aligned and the machine is little-endian (the map of a
    // bundle, whose tensors start at 64-byte offsets); copied otherwise.
    let words: Cow<'a, [u32]> = match bytemuck::try_cast_slice(codes) {
        Ok(w) if cfg!(target_endian = "little") => Cow::Borrowed(w),
        _ => Cow::Owned(
            codes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
    };
    let scales: Cow<'a, [u16]> = match bytemuck::try_cast_slice(scales) {
        Ok(s) if cfg!(target_endian = "little") => Cow::Borrowed(s),
        _ => Cow::Owned(
            scales
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect(),
        ),
    };
    Some((words, scales))
}

/// The first few failures, `; `-separated (`convert verify` lists them all).
fn summarize(failures: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut detail = failures[..failures.len().min(SHOWN)].join("; ");
    if failures.len() > SHOWN {
        detail.push_str(&format!(
            "; and {} more (`convert verify` lists them)",
            failures.len() - SHOWN
        ));
    }
    detail
}

/// An opened, checked bundle.
pub struct Bundle {
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// Version 2: the digests of the manifest's content as read (equal to the stored ones:
    /// checked at open). `None` for version 1.
    pub digests: Option<Digests>,
    maps: BTreeMap<String, Mmap>,
}

impl Bundle {
    /// Opens a bundle and checks it completely (manifest, every file's SHA256, the digests
    /// (versions 2 and 3: over the manifest's content too), every tensor) before returning; any
    /// failure is an error. Does not look at a signature: [`super::sign::verify_signature`]
    /// does, for callers that trust keys.
    pub fn open(dir: impl AsRef<Path>) -> Result<Bundle, BundleError> {
        let dir = dir.as_ref();
        let mf = open_manifest(dir)?;
        let (maps, failures) = check_integrity(dir, &mf)?;
        if !failures.is_empty() {
            return Err(BundleError::Integrity {
                path: dir.to_path_buf(),
                detail: summarize(&failures),
            });
        }
        Ok(Bundle {
            dir: dir.to_path_buf(),
            manifest: mf.manifest,
            digests: mf.computed,
            maps,
        })
    }

    /// [`Bundle::open`] for a caller that trusts only bundles signed by one of `trusted`
    /// (`--trusted-key`); with no key it is `open`. The signature is checked first
    /// ([`super::sign::check_signature`]: over the manifest's digests as read here), then every
    /// file as `open` checks them; any failure is a [`BundleError::Signature`] (a file that
    /// does not match the signed manifest was changed after signing).
    pub fn open_trusted(
        dir: impl AsRef<Path>,
        trusted: &[super::sign::PublicKey],
    ) -> Result<Bundle, BundleError> {
        let dir = dir.as_ref();
        if trusted.is_empty() {
            return Bundle::open(dir);
        }
        let mf = open_manifest(dir)?;
        let untrusted = |detail: String| BundleError::Signature {
            path: dir.to_path_buf(),
            detail,
        };
        super::sign::check_signature(dir, &mf.manifest, mf.computed.as_ref(), trusted)
            .map_err(untrusted)?;
        let (maps, failures) = check_integrity(dir, &mf)?;
        if !failures.is_empty() {
            return Err(untrusted(format!(
                "changed after signing: {}",
                summarize(&failures)
            )));
        }
        Ok(Bundle {
            dir: dir.to_path_buf(),
            manifest: mf.manifest,
            digests: mf.computed,
            maps,
        })
    }

    /// A file's bytes (checked at open).
    pub fn file(&self, path: &str) -> Option<&[u8]> {
        self.maps.get(path).map(|m| &m[..])
    }

    /// A tensor entry by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorEntry> {
        self.manifest.tensors.iter().find(|t| t.name == name)
    }

    /// Drops a tensor's pages from the resident set (see [`crate::gguf::release_range`]).
    pub fn release(&self, t: &TensorEntry) {
        if let Some(map) = self.maps.get(&t.file) {
            crate::gguf::release_range(map, t.offset, t.length);
        }
    }

    /// A tensor's stored bytes.
    pub fn tensor_bytes(&self, t: &TensorEntry) -> &[u8] {
        // Range checked at open.
        &self.maps[&t.file][t.offset as usize..(t.offset + t.length) as usize]
    }

    /// A ternary tensor's packed words and f16 scale bits.
    pub fn ternary_parts(&self, t: &TensorEntry) -> Option<TernaryParts<'_>> {
        ternary_parts(t, self.tensor_bytes(t))
    }

    /// A tensor's values as the runtime defines them, row-major: ternary `d * (code - 1)`,
    /// GGUF encodings dequantized as gguf-py does.
    pub fn tensor_f32(&self, t: &TensorEntry) -> Result<Vec<f32>, quant::DequantError> {
        let n = n_elements(&t.shape).unwrap_or(0) as usize;
        let mut out = vec![0f32; n];
        match &t.encoding {
            Encoding::Gguf { ggml_type, .. } => {
                let ty = GgmlType::from_name(ggml_type).expect("checked at open");
                quant::dequantize_par(ty, self.tensor_bytes(t), &mut out)?;
            }
            Encoding::Ternary2 { .. } => {
                let (words, scales) = self.ternary_parts(t).expect("ternary");
                let k = t.shape.last().copied().unwrap_or(1) as usize;
                use rayon::prelude::*;
                out.par_chunks_mut(k)
                    .zip(words.par_chunks(k / 16))
                    .zip(scales.par_chunks(k / 256))
                    .for_each(|((o, w), s)| ternary::row_values(w, s, o));
            }
            Encoding::Palette { .. } => {
                let v = palette_view(t, self.tensor_bytes(t)).expect("checked at open");
                use rayon::prelude::*;
                out.par_chunks_mut(v.cols.max(1))
                    .enumerate()
                    .for_each_init(|| vec![0u8; v.cols], |idx, (r, o)| v.row(r, o, idx));
            }
        }
        Ok(out)
    }
}
