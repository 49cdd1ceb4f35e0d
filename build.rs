//! Records the git revision the binary was built from (`LOWBIT_GIT_REVISION`), for bundle
//! manifests ("unknown" outside a git checkout), and the version of naga in Cargo.lock
//! (`LOWBIT_NAGA_VERSION`), which bundle manifests record beside the MSL it translated.
use std::process::Command;

/// The version of the one `naga` package in `Cargo.lock` (wgpu's and ours are the same crate).
/// Panics, failing the build, when the lock holds none or more than one: a second naga would
/// mean the MSL in bundles no longer comes from the translator wgpu compiles shaders with.
fn naga_version() -> String {
    let lock = std::fs::read_to_string("Cargo.lock").expect("build.rs: read Cargo.lock");
    let mut versions = Vec::new();
    let mut lines = lock.lines();
    while let Some(l) = lines.next() {
        if l.trim() == "name = \"naga\"" {
            let v = lines
                .next()
                .and_then(|v| v.trim().strip_prefix("version = \""))
                .and_then(|v| v.strip_suffix('"'))
                .expect("build.rs: Cargo.lock: naga without a version line");
            versions.push(v.to_string());
        }
    }
    assert!(
        versions.len() == 1,
        "build.rs: Cargo.lock must hold exactly one naga (the one wgpu uses), found {versions:?}"
    );
    versions.remove(0)
}

fn main() {
    println!("cargo:rustc-env=LOWBIT_NAGA_VERSION={}", naga_version());
    println!("cargo:rerun-if-changed=Cargo.lock");
    let rev = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    let rev = if dirty { format!("{rev}-dirty") } else { rev };
    println!("cargo:rustc-env=LOWBIT_GIT_REVISION={rev}");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/index");
}
