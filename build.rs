//! Records the git revision the binary was built from (`LOWBIT_GIT_REVISION`), for bundle
//! manifests. "unknown" outside a git checkout.
use std::process::Command;

fn main() {
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
