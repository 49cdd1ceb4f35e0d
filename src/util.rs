//! Small shared helpers: hashing, progress bars, output paths that are never half-written.

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sha2::{Digest, Sha256};

/// `s` for a terminal: as it is unless it holds a control character (a name read from a file
/// could carry escape sequences or line breaks that forge output), then Rust's escaped form
/// (`\u{1b}`, `\n`) without quotes.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    if s.chars().any(char::is_control) {
        std::borrow::Cow::Owned(s.escape_debug().to_string())
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

/// Lowercase hex SHA256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Warnings printed so far ([`warn_once`]).
static WARNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Prints `warning: {msg}` on stderr, once per distinct message per process: for what a
/// library call finds worth a user's attention without failing (a bundle of format version 1,
/// whose manifest no digest covers). Returns whether it printed.
pub fn warn_once(msg: &str) -> bool {
    let mut seen = WARNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if seen.iter().any(|m| m == msg) {
        return false;
    }
    seen.push(msg.to_string());
    eprintln!("warning: {msg}");
    true
}

/// Opens an input file for reading, refusing anything that is not a regular file (a
/// directory, a FIFO, a device, a socket) with an `InvalidInput` error that says what it is,
/// instead of blocking on a FIFO or failing later with "No such device". Opened with
/// `O_NONBLOCK` on Unix, so a FIFO never blocks the open; for regular files it changes nothing.
pub fn open_input(path: &Path) -> std::io::Result<std::fs::File> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NONBLOCK);
    }
    let f = o.open(path)?;
    let t = f.metadata()?.file_type();
    if t.is_file() {
        return Ok(f);
    }
    let what = if t.is_dir() {
        "a directory"
    } else {
        "not a regular file (a FIFO, device or socket)"
    };
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("is {what}; expected a regular file"),
    ))
}

/// The whole of an input file, through [`open_input`] (a FIFO or directory is an error).
pub fn read_input(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut f = open_input(path)?;
    let mut v = Vec::new();
    f.read_to_end(&mut v)?;
    Ok(v)
}

/// Lowercase hex SHA256 of a file's contents, read in 1 MiB pieces.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = open_input(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// A progress bar on stderr, drawn only when stderr is a terminal and `quiet` is false.
pub fn progress_bar(len: u64, quiet: bool, bytes: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let template = if bytes {
        "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}) {msg}"
    } else {
        "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        pb.set_style(style);
    }
    pb
}

/// Temporary outputs (`.NAME.*.partial` files and directories) being written now, so that a
/// signal handler can remove them: see [`remove_partial_outputs_and_exit`].
static PARTIAL_OUTPUTS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

fn partial_outputs() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    PARTIAL_OUTPUTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Registers a temporary output for removal by [`remove_partial_outputs_and_exit`] while it
/// lives; dropping it unregisters the path. Its owner removes the files on every normal path
/// and must drop them before this (a struct declares it after its `TempDir`).
pub(crate) struct PartialOutput(PathBuf);

impl PartialOutput {
    /// Creates the temporary output with `make` and registers `path(&made)`, under the
    /// registry's lock: a signal arriving meanwhile is handled after the registration, so the
    /// new directory or file is removed too.
    pub(crate) fn create<T, E>(
        make: impl FnOnce() -> Result<T, E>,
        path: impl FnOnce(&T) -> &Path,
    ) -> Result<(T, PartialOutput), E> {
        let mut list = partial_outputs();
        let made = make()?;
        let p = path(&made).to_path_buf();
        list.push(p.clone());
        Ok((made, PartialOutput(p)))
    }

    /// Runs `publish` (the rename or link of the temporary output into place) under the
    /// registry's lock, so that a signal handler runs before it (and the output never
    /// appears) or after it. The path stays registered until drop: after a link the staging
    /// directory still exists and the handler removes it; after a rename it is gone.
    pub(crate) fn publish<R>(&self, publish: impl FnOnce() -> R) -> R {
        let _list = partial_outputs();
        publish()
    }
}

impl Drop for PartialOutput {
    fn drop(&mut self) {
        partial_outputs().retain(|p| p != &self.0);
    }
}

/// Removes every temporary output being written (see [`PartialOutput`]) and exits the process
/// with `code`, without returning. For a SIGINT/SIGTERM/SIGHUP handler: call it from the
/// handler's thread (the `convert` binary installs one with the `ctrlc` crate), not from an
/// async-signal context. It holds the registry's lock until exit, so no output is published
/// after it starts.
pub fn remove_partial_outputs_and_exit(code: i32) -> ! {
    let list = partial_outputs();
    for p in list.iter() {
        let remove = || {
            let r = match p.symlink_metadata() {
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
                Ok(_) => std::fs::remove_file(p),
                Err(_) => Ok(()),
            };
            // NotFound: published by a rename, or its owner removed it meanwhile.
            r.or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
        };
        // Other threads may still be creating files in a staging directory ("Directory not
        // empty"); once it is gone they cannot, so a few retries settle it.
        let mut r = remove();
        for _ in 0..50 {
            if r.is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
            r = remove();
        }
        if let Err(e) = r {
            eprintln!("error: removing the partial output {}: {e}", p.display());
        }
    }
    // `_exit`, not `exit`: the main thread may be inside a GPU driver (lavapipe's LLVM JIT,
    // a Vulkan queue), whose atexit handlers and static destructors `exit` would run under it
    // (a segfault was seen once on a Ctrl-C during a GPU run). Stdout is line-buffered and
    // stderr unbuffered, so at most a partial line of output is lost; the outputs are gone.
    #[cfg(unix)]
    // SAFETY: `_exit` ends the process at once; nothing after it runs.
    unsafe {
        libc::_exit(code)
    }
    #[cfg(not(unix))]
    std::process::exit(code)
}

/// Errors from [`write_file_atomically`].
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("{0}: output already exists; refusing to overwrite it")]
    Exists(PathBuf),
    #[error("{output}: inside the input bundle {input}; write it elsewhere")]
    InsideInput { output: PathBuf, input: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Checks, before any work, that a report file (`--json`, `--dump-logits`) can be written at
/// `out`: its directory exists and `out` is not a directory. Reports, unlike bundles and
/// checkpoints, replace an existing file ([`replace_file`]).
/// `inputs` are the command's inputs: a report may not be written inside an input bundle
/// directory nor over an input file.
pub fn check_report_path(out: &Path, inputs: &[&Path]) -> Result<(), OutputError> {
    // A symlink is checked as what it names, which the report replaces (a dangling link's
    // target included): the path the user gave, and the target where they differ.
    let target = follow_links(out).map_err(|source| OutputError::Io {
        path: out.to_path_buf(),
        source,
    })?;
    let shown = if target == out {
        out.to_path_buf()
    } else {
        PathBuf::from(format!(
            "{} (a link to {})",
            out.display(),
            target.display()
        ))
    };
    let parent = parent_dir(&target);
    let bad = |detail: &str| OutputError::Io {
        path: shown.clone(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, detail.to_string()),
    };
    if target.is_dir() {
        return Err(bad("is a directory"));
    }
    if !parent.is_dir() {
        return Err(bad("its directory does not exist"));
    }
    for i in inputs {
        if i.is_dir() {
            refuse_output_inside(i, &target).map_err(|e| match e {
                OutputError::InsideInput { input, .. } => OutputError::InsideInput {
                    output: shown.clone(),
                    input,
                },
                e => e,
            })?;
        } else if let (Ok(a), Ok(b)) = (i.canonicalize(), target.canonicalize()) {
            if a == b {
                return Err(bad("is an input of this command"));
            }
        }
    }
    Ok(())
}

/// Writes `bytes` to `out` through a temporary file beside it renamed over `out`: readers see
/// the old file or the new one, never a part. Check `out` with [`check_report_path`] first.
///
/// What is at `out` is kept: a symlink to a regular file has its target replaced the same way
/// and a dangling one its target created (the link stays, followed as
/// [`check_report_path`] checks it); anything else that is not a regular file (a character device such as
/// `/dev/stdout` or `/dev/null`, a FIFO, a socket, or a link to one) is written through, in
/// place, as a shell's `>` would, since renaming over it would replace the device node or
/// the FIFO with a file.
pub fn replace_file(out: &Path, bytes: &[u8]) -> Result<(), OutputError> {
    use std::io::Write;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| OutputError::Io { path, source }
    };
    // A symlink's target is what is replaced (or created, for a dangling link), the link
    // kept.
    let resolved = follow_links(out).map_err(io(out))?;
    let out = resolved.as_path();
    if let Ok(m) = std::fs::metadata(out) {
        if !m.is_file() {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(out)
                .map_err(io(out))?;
            return f.write_all(bytes).and_then(|()| f.flush()).map_err(io(out));
        }
    }
    let dir = parent_dir(out);
    let (made, partial) = PartialOutput::create(
        || {
            tempfile::Builder::new()
                .prefix(".report.")
                .suffix(".partial")
                .tempfile_in(&dir)
        },
        |t| t.path(),
    )
    .map_err(io(&dir))?;
    // Declared after `partial`, so removed (on an error) before the registration ends.
    let mut tmp = made;
    tmp.write_all(bytes).map_err(io(out))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(io(out))?;
    }
    partial
        .publish(|| tmp.persist(out))
        .map_err(|e| io(out)(e.error))?;
    Ok(())
}

/// What a report written at `path` replaces: `path` itself where it is not a symlink or
/// names something that is not a regular file (the kernel resolves it: `/dev/stdout` through
/// `/proc/self/fd/1` to a pipe is written through as given); a link to a regular file, that
/// file ([`std::fs::canonicalize`]); a dangling link, the path its links end at, followed by
/// hand (a relative target from the link's directory; at most 40 links, the kernel's own
/// limit).
fn follow_links(path: &Path) -> std::io::Result<PathBuf> {
    match (std::fs::symlink_metadata(path), std::fs::metadata(path)) {
        (Ok(l), _) if !l.file_type().is_symlink() => return Ok(path.to_path_buf()),
        (Err(_), _) => return Ok(path.to_path_buf()),
        (Ok(_), Ok(m)) if m.is_file() => return path.canonicalize(),
        (Ok(_), Ok(_)) => return Ok(path.to_path_buf()),
        (Ok(_), Err(_)) => {}
    }
    let mut p = path.to_path_buf();
    for _ in 0..=40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let t = std::fs::read_link(&p)?;
                p = if t.is_absolute() {
                    t
                } else {
                    parent_dir(&p).join(t)
                };
            }
            _ => return Ok(p),
        }
    }
    Err(std::io::Error::other("too many levels of symbolic links"))
}

/// Refuses an output path inside the bundle directory `input` (it would add a file the
/// input's manifest does not list, and the input would no longer verify). Paths are compared
/// after resolving symlinks; an output whose parent does not exist is left to the writer.
pub fn refuse_output_inside(input: &Path, out: &Path) -> Result<(), OutputError> {
    let parent = parent_dir(out);
    if let (Ok(i), Ok(p)) = (input.canonicalize(), parent.canonicalize()) {
        if p.starts_with(&i) {
            return Err(OutputError::InsideInput {
                output: out.to_path_buf(),
                input: input.to_path_buf(),
            });
        }
    }
    Ok(())
}

/// Refuses an output path that already exists (file, directory or dangling symlink).
pub fn refuse_existing(out: &Path) -> Result<(), OutputError> {
    if out.symlink_metadata().is_ok() {
        return Err(OutputError::Exists(out.to_path_buf()));
    }
    Ok(())
}

/// Creates `out` by writing it inside a temporary directory beside it (`.NAME.XXXXXX.partial`)
/// with `write`, and linking it into place only after `write` succeeded. `out` must not exist;
/// if it appears meanwhile the link refuses to replace it. After any failure, or SIGINT/SIGTERM
/// in the `convert` binary ([`remove_partial_outputs_and_exit`]), nothing is left at `out` and
/// the temporary directory is removed, with whatever `write` put there (a writer that stages
/// its own temporary file beside the path it is given, as `safetensors::serialize_to_file`
/// does, stages it inside that directory). The file is made mode 0644 on Unix.
pub fn write_file_atomically<E>(
    out: &Path,
    write: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<Result<(), E>, OutputError> {
    refuse_existing(out)?;
    let staging = StagingDir::beside(out)?;
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let staged = staging
        .path()
        .join(if name.is_empty() { "out" } else { &name });
    if let Err(e) = write(&staged) {
        return Ok(Err(e));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o644)).map_err(
            |source| OutputError::Io {
                path: staged.clone(),
                source,
            },
        )?;
    }
    // A hard link never replaces an existing path; the staged name goes with the directory.
    staging
        .publish(|| std::fs::hard_link(&staged, out))
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                OutputError::Exists(out.to_path_buf())
            } else {
                OutputError::Io {
                    path: out.to_path_buf(),
                    source: e,
                }
            }
        })?;
    Ok(Ok(()))
}

/// The directory `out` is (to be) in: its parent, or `.` for a bare name.
pub(crate) fn parent_dir(out: &Path) -> PathBuf {
    match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// How long a staging directory must have been left untouched before another run may remove
/// it ([`remove_stale_partials`]).
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// `HOST-PID` of this process, part of its staging directories' names
/// (`.NAME.HOST-PID.XXXXXX.partial`) so that a later run can tell a directory left by a killed
/// run on this host from one being written now ([`remove_stale_partials`]). Characters other
/// than ASCII letters, digits and `-` in the host name become `_`.
fn process_tag() -> String {
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut host = [0u8; 256];
    #[cfg(unix)]
    // SAFETY: the buffer is valid for its length; gethostname writes at most that many bytes.
    let ok = unsafe { libc::gethostname(host.as_mut_ptr().cast(), host.len()) } == 0;
    #[cfg(not(unix))]
    let ok = false;
    let end = host.iter().position(|&b| b == 0).unwrap_or(host.len());
    // At most 32 bytes of the host name, so that the staging name stays short.
    let host: String = if ok {
        &host[..end.min(32)]
    } else {
        &b"host"[..]
    }
    .iter()
    .map(|&b| {
        if b.is_ascii_alphanumeric() || b == b'-' {
            b as char
        } else {
            '_'
        }
    })
    .collect();
    format!("{host}-{}", std::process::id())
}

/// Whether process `pid` is gone (`kill(pid, 0)` fails with ESRCH). Unknown: not gone.
fn process_gone(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        // SAFETY: signal 0 sends nothing; it only checks that the process exists.
        let r = unsafe { libc::kill(pid, 0) };
        r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        false
    }
}

/// Removes the staging directories for output `name` in `parent` that a run on this host left
/// behind when it was killed (SIGKILL, the OOM killer, a power cut: no handler runs). A
/// directory is removed only if all of these hold: its name is exactly
/// `.NAME.HOST-PID.XXXXXX.partial` (PID digits, `XXXXXX` six letters or digits, as
/// [`StagingDir`] makes them) with this host's `HOST`; process `PID` does not exist here; it
/// was last modified more than a minute ago; and its advisory lock, which a live run holds
/// for as long as its staging directory exists, can be taken (a run in another PID namespace
/// of this kernel, a container sharing the host name, still holds it). Anything else is left
/// alone: another host's (a shared file system), a live run's, names in the older form
/// without `HOST-PID`, files. Best effort: errors are ignored.
pub(crate) fn remove_stale_partials(parent: &Path, name: &str, tag: &str) {
    let Some((host, _)) = tag.rsplit_once('-') else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let prefix = format!(".{name}.{host}-");
    for e in entries.flatten() {
        let file_name = e.file_name();
        let Some(rest) = file_name
            .to_str()
            .and_then(|f| f.strip_prefix(&prefix))
            .and_then(|r| r.strip_suffix(STAGING_SUFFIX))
        else {
            continue;
        };
        // rest = PID.XXXXXX, nothing else.
        let Some((pid, random)) = rest.split_once('.') else {
            continue;
        };
        let exact = !pid.is_empty()
            && pid.bytes().all(|b| b.is_ascii_digit())
            && random.len() == STAGING_RANDOM_LEN
            && random.bytes().all(|b| b.is_ascii_alphanumeric());
        let Some(pid) = pid.parse::<u32>().ok().filter(|_| exact) else {
            continue;
        };
        if pid == std::process::id() || !process_gone(pid) {
            continue;
        }
        // A directory (not a symlink to one), untouched for a while, whose lock is free.
        let path = e.path();
        let Ok(meta) = path.symlink_metadata() else {
            continue;
        };
        let old = meta
            .modified()
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= STALE_AFTER);
        if !meta.is_dir() || !old {
            continue;
        }
        let Ok(lock) = std::fs::File::open(&path) else {
            continue;
        };
        if lock.try_lock().is_ok() {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// A `.NAME.XXXXXX.partial` directory beside an output, registered for the signal handler
/// ([`PartialOutput`]) and removed when dropped, unless [`StagingDir::keep`] says it was
/// renamed into place.
pub(crate) struct StagingDir {
    dir: tempfile::TempDir,
    /// Declared after `dir`, so the directory is removed before its registration ends.
    partial: PartialOutput,
    /// The directory opened and locked (advisory, exclusive) while it exists: another run's
    /// [`remove_stale_partials`] leaves a locked directory alone. The kernel drops the lock
    /// when this process ends, however it ends.
    _lock: Option<std::fs::File>,
}

/// Random characters in a staging directory's name (`XXXXXX` of `.NAME.HOST-PID.XXXXXX.partial`).
const STAGING_RANDOM_LEN: usize = 6;
/// The end of a staging directory's name.
const STAGING_SUFFIX: &str = ".partial";

impl StagingDir {
    /// Creates the staging directory beside `out`.
    pub(crate) fn beside(out: &Path) -> Result<StagingDir, OutputError> {
        let parent = parent_dir(out);
        let name = out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tag = process_tag();
        let bad = |kind: std::io::ErrorKind, detail: String| OutputError::Io {
            path: out.to_path_buf(),
            source: std::io::Error::new(kind, detail),
        };
        match std::fs::metadata(&parent) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(bad(
                    std::io::ErrorKind::NotADirectory,
                    format!("{} is not a directory", parent.display()),
                ))
            }
            Err(_) => {
                return Err(bad(
                    std::io::ErrorKind::NotFound,
                    format!("the directory {} does not exist", parent.display()),
                ))
            }
        }
        let prefix = format!(".{name}.{tag}.");
        // The staging name must fit a file name (255 bytes on the usual file systems), or the
        // error would name the staging path instead of the output.
        let staged_len = prefix.len() + STAGING_RANDOM_LEN + STAGING_SUFFIX.len();
        if staged_len > 255 {
            return Err(bad(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "the name is {} bytes; at most {} here (it is staged beside itself as \
                     .NAME.{tag}.XXXXXX{STAGING_SUFFIX}, a name of at most 255 bytes)",
                    name.len(),
                    255 - (staged_len - name.len())
                ),
            ));
        }
        remove_stale_partials(&parent, &name, &tag);
        let (dir, partial) = PartialOutput::create(
            || {
                tempfile::Builder::new()
                    .prefix(&prefix)
                    .rand_bytes(STAGING_RANDOM_LEN)
                    .suffix(STAGING_SUFFIX)
                    .tempdir_in(&parent)
            },
            |t| t.path(),
        )
        .map_err(|source| OutputError::Io {
            path: parent.clone(),
            source,
        })?;
        // Not every file system locks directories; without the lock the name's host and
        // process still protect it from other runs on this host.
        let lock = std::fs::File::open(dir.path())
            .ok()
            .filter(|f| f.try_lock().is_ok());
        Ok(StagingDir {
            dir,
            partial,
            _lock: lock,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// [`PartialOutput::publish`]: runs the rename or link into place.
    pub(crate) fn publish<R>(&self, publish: impl FnOnce() -> R) -> R {
        self.partial.publish(publish)
    }

    /// The directory was renamed into place: do not remove it.
    pub(crate) fn keep(self) {
        let _ = self.dir.keep();
    }
}

/// Why [`glob_set_matching`] refused a list of tensor-name globs.
#[derive(Debug)]
pub enum GlobFault {
    /// `glob` is not a valid glob (or the set could not be built: `glob` lists them all).
    Bad { glob: String, detail: String },
    /// `glob` matches none of the names.
    NoMatch { glob: String },
}

/// The set of `globs`, each of which must match at least one of `names`.
pub fn glob_set_matching<'a>(
    globs: &[String],
    names: impl Iterator<Item = &'a str> + Clone,
) -> Result<globset::GlobSet, GlobFault> {
    let mut b = globset::GlobSetBuilder::new();
    for g in globs {
        b.add(globset::Glob::new(g).map_err(|e| GlobFault::Bad {
            glob: g.clone(),
            detail: e.kind().to_string(),
        })?);
    }
    let set = b.build().map_err(|e| GlobFault::Bad {
        glob: globs.join(", "),
        detail: e.to_string(),
    })?;
    for (i, g) in globs.iter().enumerate() {
        if !names.clone().any(|n| set.matches(n).contains(&i)) {
            return Err(GlobFault::NoMatch { glob: g.clone() });
        }
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A staging directory left by a killed run on this host is removed when the next run
    /// stages the same output; a live process's, a locked one, a fresh one, another host's,
    /// another output's, look-alike names, files and old-style names stay.
    #[test]
    fn stale_partials_of_dead_processes_are_removed() {
        let dir = std::env::temp_dir().join(format!("lowbit-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let tag = process_tag();
        let host = tag.rsplit_once('-').unwrap().0.to_string();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let me = std::process::id();
        let name = "out.bundle";
        let at = |n: String| dir.join(n);
        let stale = at(format!(".{name}.{host}-{dead}.Ab12Cd.partial"));
        let keep = [
            // a live process's (this one)
            at(format!(".{name}.{tag}.Ef34Gh.partial")),
            // another host's
            at(format!(".{name}.{host}x-{dead}.Ij56Kl.partial")),
            // old style, no HOST-PID
            at(format!(".{name}.Mn78Op.partial")),
            // another output's
            at(format!(".other.{host}-{dead}.Qr90St.partial")),
            // output `out.bundle.HOST-DEAD`'s staging directory of a live run: not ours
            at(format!(".{name}.{host}-{dead}.{host}-{me}.Uv12Wx.partial")),
            // a look-alike name that is not a staging directory
            at(format!(".{name}.{host}-{dead}.my notes.partial")),
            // dead process, but touched just now
            at(format!(".{name}.{host}-{dead}.Yz34Ab.partial")),
            // dead process here, but locked (a run in another PID namespace)
            at(format!(".{name}.{host}-{dead}.Cd56Ef.partial")),
        ];
        let old = std::time::SystemTime::now() - 2 * STALE_AFTER;
        for (i, d) in std::iter::once(&stale).chain(&keep).enumerate() {
            std::fs::create_dir_all(d.join("sub")).unwrap();
            std::fs::write(d.join("sub/weights.bin"), b"x").unwrap();
            if i != 7 {
                std::fs::File::open(d).unwrap().set_modified(old).unwrap();
            }
        }
        let stale_file = at(format!(".{name}.{host}-{dead}.Zz99yy.partial"));
        std::fs::write(&stale_file, b"x").unwrap();
        std::fs::File::open(&stale_file)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let held = std::fs::File::open(&keep[7]).unwrap();
        held.try_lock().unwrap();
        let staging = StagingDir::beside(&dir.join(name)).unwrap();
        let made = staging
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(made.starts_with(&format!(".{name}.{tag}.")) && made.ends_with(".partial"));
        assert!(!stale.exists());
        for d in keep.iter().chain([&stale_file]) {
            assert!(d.exists(), "{} was removed", d.display());
        }
        // The new staging directory is locked while it exists.
        assert!(std::fs::File::open(staging.path())
            .unwrap()
            .try_lock()
            .is_err());
        drop((staging, held));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A report path that is a FIFO, a character device or a symlink is written through (the
    /// node stays what it was); a symlink to a regular file keeps the link and replaces its
    /// target; a regular file is replaced.
    #[cfg(unix)]
    #[test]
    fn reports_write_through_fifos_devices_and_links() {
        use std::os::unix::fs::FileTypeExt;
        let dir = tempfile::tempdir().unwrap();
        // A FIFO, read by a thread: it gets the bytes, and it is still a FIFO.
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let f2 = fifo.clone();
        let reader = std::thread::spawn(move || std::fs::read(&f2).unwrap());
        replace_file(&fifo, b"through the fifo").unwrap();
        assert_eq!(reader.join().unwrap(), b"through the fifo");
        assert!(std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo());
        // A character device (and a link to it): still a device.
        let null = Path::new("/dev/null");
        if null.exists() {
            replace_file(null, b"x").unwrap();
            assert!(std::fs::symlink_metadata(null)
                .unwrap()
                .file_type()
                .is_char_device());
            let link = dir.path().join("to-null");
            std::os::unix::fs::symlink(null, &link).unwrap();
            replace_file(&link, b"x").unwrap();
            assert!(std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink());
        }
        // A pipe reached through /proc/self/fd (what /dev/stdout is when stdout is a pipe):
        // the link's text is `pipe:[N]`, no path; the kernel's resolution finds the pipe and
        // the bytes go through it.
        let mut fds = [0i32; 2];
        // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
        if Path::new("/proc/self/fd").is_dir() && unsafe { libc::pipe(fds.as_mut_ptr()) } == 0 {
            let via = PathBuf::from(format!("/proc/self/fd/{}", fds[1]));
            check_report_path(&via, &[]).unwrap();
            replace_file(&via, b"piped").unwrap();
            let mut got = [0u8; 5];
            // SAFETY: reads at most 5 bytes into `got`, then closes both descriptors.
            let n = unsafe { libc::read(fds[0], got.as_mut_ptr().cast(), 5) };
            unsafe {
                libc::close(fds[0]);
                libc::close(fds[1]);
            }
            assert_eq!((n, &got), (5, b"piped"));
        }
        // A link to a regular file: the link stays, the target is replaced.
        let target = dir.path().join("target.json");
        std::fs::write(&target, b"old").unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        replace_file(&link, b"new").unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        // A regular file is replaced; nothing else is left in the directory.
        replace_file(&target, b"newer").unwrap();
        assert_eq!(std::fs::read(&link).unwrap(), b"newer");
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["fifo", "link.json", "target.json", "to-null"]);
    }

    /// A report path that is a symlink is checked and written as what it names: a link into
    /// an input bundle is refused (naming the link and its target) and nothing is written
    /// there; a dangling link (relative, through a second link) gets its target created and
    /// stays a link; a dangling link into a missing directory is refused naming the target.
    #[cfg(unix)]
    #[test]
    fn report_links_are_checked_and_written_as_their_targets() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("in.bundle");
        std::fs::create_dir(&bundle).unwrap();
        std::fs::write(bundle.join("weights.bin"), b"weights").unwrap();
        let into = dir.path().join("into");
        symlink(bundle.join("weights.bin"), &into).unwrap();
        let err = check_report_path(&into, &[&bundle])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("inside the input bundle") && err.contains("a link to"),
            "{err}"
        );
        assert!(err.contains("weights.bin"), "{err}");
        assert_eq!(
            std::fs::read(bundle.join("weights.bin")).unwrap(),
            b"weights"
        );
        // Dangling, relative, through a second link.
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        symlink("out/new.json", dir.path().join("first")).unwrap();
        let link = dir.path().join("second");
        symlink("first", &link).unwrap();
        check_report_path(&link, &[&bundle]).unwrap();
        replace_file(&link, b"report").unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(out.join("new.json")).unwrap(), b"report");
        // Dangling into a directory that does not exist.
        let lost = dir.path().join("lost");
        symlink(dir.path().join("nodir/x.json"), &lost).unwrap();
        let err = check_report_path(&lost, &[]).unwrap_err().to_string();
        assert!(
            err.contains("nodir") && err.contains("directory does not exist"),
            "{err}"
        );
        // A loop of links is an error, not a hang.
        symlink("loop-b", dir.path().join("loop-a")).unwrap();
        symlink("loop-a", dir.path().join("loop-b")).unwrap();
        assert!(check_report_path(&dir.path().join("loop-a"), &[]).is_err());
    }
}
