//! The GPU kernels a bundle carries (issue 12): every writer puts each module of
//! `kernels::all()` that its tensors' encodings need (`kernels::for_tensors`) in `kernels/` as WGSL and as the MSL naga makes from it, listed and hashed
//! in the manifest and covered by the bundle digest; `from_bundle` gives the GPU backend
//! exactly those; a bundle made before kernels shipped runs on the CPU, is refused by
//! `from_bundle` with the command that fixes it, and `convert add-kernels` makes it what a
//! fresh write gives; `convert verify` checks every kernel file.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use lowbit::bundle::kernels::{self as bk, KernelError};
use lowbit::bundle::manifest::{KernelKind, Manifest};
use lowbit::bundle::reader::Bundle;
use lowbit::runtime::gpu::kernels::{self, KernelSource};
use lowbit::util::sha256_hex;

/// The digest `convert gguf-to-ternary` gave the tiny MiniCPM before kernels shipped in
/// bundles (`manifests/minicpm-tiny-tq2_0.gguf-to-ternary.json` at commit 0b0618a): a bundle
/// stripped of its kernels here must be that bundle, file for file.
const DIGEST_BEFORE_KERNELS: &str =
    "0373459239f92bd9efd7a114824a74e8eb55262c04a88d21a104be2cac6ca727";

fn tiny() -> PathBuf {
    common::repo().join("testdata/ternary/minicpm-tiny-tq2_0.gguf")
}

fn convert(args: &[&str], paths: &[&Path]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_convert"));
    c.args(args);
    for p in paths {
        c.arg(p);
    }
    c.output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A fresh `gguf-to-ternary` bundle of the tiny MiniCPM at `dir/name` (bundles to compare
/// manifests of share a name: the manifest records the output's file name).
fn written(dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let o = convert(&["gguf-to-ternary", "-q", "-o"], &[&out, &tiny()]);
    assert!(o.status.success(), "{}", text(&o));
    out
}

fn manifest(b: &Path) -> Manifest {
    serde_json::from_slice(&std::fs::read(b.join("manifest.json")).unwrap()).unwrap()
}

/// Writes `m` as the writer of its format version does (pretty JSON and a newline), the file
/// list sorted and the digests recomputed.
fn write_manifest(b: &Path, m: &mut Manifest) {
    m.files.sort_by(|a, b| a.path.cmp(&b.path));
    common::reseal(m);
    let mut bytes = serde_json::to_vec_pretty(m).unwrap();
    bytes.push(b'\n');
    std::fs::write(b.join("manifest.json"), bytes).unwrap();
}

/// Turns bundle `b` into one made before kernels shipped: format version 1 (as bundles were
/// then), no `kernels` section, no kernel files, the digest recomputed the way that writer
/// computed it.
fn strip_kernels(b: &Path) {
    let mut m = manifest(b);
    m.kernels.clear();
    m.files.retain(|f| !f.path.starts_with("kernels/"));
    common::as_version(b, &mut m, 1);
    write_manifest(b, &mut m);
    std::fs::remove_dir_all(b.join("kernels")).unwrap();
}

/// Replaces kernel file `file` of bundle `b` with `bytes` and rehashes it everywhere (its
/// kernel entry, the file list, the digest), as a producer would.
fn rewrite_kernel(b: &Path, file: &str, bytes: &[u8]) {
    std::fs::write(b.join(file), bytes).unwrap();
    let mut m = manifest(b);
    for k in m.kernels.iter_mut().filter(|k| k.file == file) {
        k.bytes = bytes.len() as u64;
        k.sha256 = sha256_hex(bytes);
    }
    for f in m.files.iter_mut().filter(|f| f.path == file) {
        f.size = bytes.len() as u64;
        f.sha256 = Some(sha256_hex(bytes));
    }
    write_manifest(b, &mut m);
}

/// Whether two bundles' manifests are byte-identical.
fn same_manifest(a: &Path, b: &Path) -> bool {
    std::fs::read(a.join("manifest.json")).unwrap()
        == std::fs::read(b.join("manifest.json")).unwrap()
}

/// This build's kernels for the bundle at `b` (its tensors' encodings).
fn ours(b: &Path) -> Vec<KernelSource> {
    kernels::for_tensors(&manifest(b).tensors)
}

fn registry(b: &Path) -> HashMap<String, String> {
    ours(b).into_iter().map(|k| (k.name, k.wgsl)).collect()
}

#[test]
fn written_bundle_lists_and_hashes_every_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let b = written(dir.path(), "t.bundle");
    let m = manifest(&b);
    let all = ours(&b);
    assert!(!all.is_empty());
    assert_eq!(m.kernels.len(), 2 * all.len());
    // Sorted by name, WGSL before MSL; every file in the file list with the same size and hash.
    let order: Vec<(String, KernelKind)> =
        m.kernels.iter().map(|k| (k.name.clone(), k.kind)).collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted);
    for k in &m.kernels {
        let bytes = std::fs::read(b.join(&k.file)).unwrap();
        assert_eq!(k.file, format!("kernels/{}.{}", k.name, k.kind.extension()));
        assert_eq!(
            (k.bytes, k.sha256.as_str()),
            (bytes.len() as u64, &*sha256_hex(&bytes))
        );
        let f = m.files.iter().find(|f| f.path == k.file).unwrap();
        assert_eq!(
            (f.size, f.sha256.as_deref()),
            (k.bytes, Some(k.sha256.as_str())),
            "{}",
            k.file
        );
    }
    for src in &all {
        let wgsl = std::fs::read(b.join(format!("kernels/{}.wgsl", src.name))).unwrap();
        assert_eq!(wgsl, src.wgsl.as_bytes(), "{}", src.name);
        let msl_entry = m
            .kernels
            .iter()
            .find(|k| k.name == src.name && k.kind == KernelKind::Msl)
            .unwrap();
        let t = msl_entry.msl.as_ref().unwrap();
        assert_eq!(t.from, format!("kernels/{}.wgsl", src.name));
        assert_eq!(
            (t.translator.as_str(), t.naga_version.as_str()),
            ("naga", bk::NAGA_VERSION)
        );
        assert_eq!(t.options, bk::default_msl_options());
        let msl = std::fs::read_to_string(b.join(&msl_entry.file)).unwrap();
        assert!(!msl.is_empty());
        assert!(msl.starts_with("// language: metal2.3\n"), "{}", src.name);
        // WGSL's `main` is a reserved name in Metal: naga calls it `main_`.
        assert_eq!(t.entry_point, "main_");
        assert!(
            msl.contains("kernel void main_("),
            "{}: no kernel entry point",
            src.name
        );
        for buf in &t.buffers {
            assert!(
                msl.contains(&format!("[[buffer({})]]", buf.slot)),
                "{}: slot {}",
                src.name,
                buf.slot
            );
        }
    }
    // The manifest fits the version-3 schema, and one of a bundle made before kernels shipped
    // (format version 1) the version-1 schema.
    let validator = |version: u32| {
        let schema: serde_json::Value = serde_json::from_slice(
            &std::fs::read(
                common::repo().join(format!("schemas/bundle-manifest.v{version}.schema.json")),
            )
            .unwrap(),
        )
        .unwrap();
        jsonschema::validator_for(&schema).unwrap()
    };
    let v = validator(3);
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(b.join("manifest.json")).unwrap()).unwrap();
    let errors: Vec<String> = v.iter_errors(&json).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?}");
    // The weight file listed by its tensor table, the other files by their bytes' SHA256.
    let weights = json["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "weights.bin")
        .unwrap();
    assert!(weights.get("sha256").is_none() && weights["tensors_sha256"].is_string());
    let mut both = json.clone();
    both["files"][0]["sha256"] = json["bundle_digest"].clone();
    both["files"][0]["tensors_sha256"] = json["bundle_digest"].clone();
    assert!(!v.is_valid(&both), "a file with both digests");
    // The same manifest as version 2 wrote it fits the version-2 schema only.
    let mut v2 = json.clone();
    common::as_version_json(&b, &mut v2, 2);
    let errors: Vec<String> = validator(2)
        .iter_errors(&v2)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    assert!(!v.is_valid(&v2), "version 2 is not version 3");
    let mut old = json.clone();
    old.as_object_mut().unwrap().remove("kernels");
    common::as_version_json(&b, &mut old, 1);
    assert!(validator(1).is_valid(&old));
    assert!(!v.is_valid(&old), "version 1 is not version 3");
    let mut bad = json.clone();
    bad["kernels"][1].as_object_mut().unwrap().remove("msl");
    assert!(
        !v.is_valid(&bad),
        "an msl entry without its translation record"
    );
}

/// A bundle carries the kernels of its matrices' encodings and every kernel of none (ops, the
/// prefill quantize), no other encoding's: the tiny MiniCPM has ternary products (with the
/// kernels only their int8 form uses: decode quantize, the combine that writes their x), an
/// F16 embedding and a Q8_0 head (and F32 vectors, which run no weight kernel), so its kernels
/// are those three encodings' and the others of no encoding, 134 modules of the registry's
/// 372.
#[test]
fn a_bundle_carries_the_kernels_of_its_encodings_only() {
    use lowbit::runtime::gpu::weights::kernel_encoding;
    // The classification, on names written out here.
    for (name, enc) in [
        ("ternary_matvec_q8g4_r16_wg128_sgrows4_p1", Some("ternary2")),
        ("weights_ternary2_matmul_r4_t8_wg64_sg", Some("ternary2")),
        ("weights_q4_k_matvec_r2_wg64_sg", Some("q4_k")),
        ("weights_q4_0_gather_wg64", Some("q4_0")),
        ("weights_palette_b4_matvec_r2_wg64_wg", Some("palette_b4")),
        ("weights_q8_quantize_wg64", None),
        ("ternary_q8_quantize_rms", Some("ternary2")),
        ("op_attention_combine_q8", Some("ternary2")),
        ("op_attention_decode_combine_q8", Some("ternary2")),
        ("op_attention_decode", None),
        ("op_rms_norm", None),
    ] {
        assert_eq!(kernel_encoding(name).as_deref(), enc, "{name}");
    }
    let dir = tempfile::tempdir().unwrap();
    let b = written(dir.path(), "t.bundle");
    let m = manifest(&b);
    let carried: std::collections::BTreeSet<&str> =
        m.kernels.iter().map(|k| k.name.as_str()).collect();
    let mut by_encoding: std::collections::BTreeMap<Option<String>, (usize, usize)> =
        Default::default();
    for k in kernels::all() {
        let e = by_encoding.entry(kernel_encoding(&k.name)).or_default();
        e.0 += 1;
        e.1 += carried.contains(k.name.as_str()) as usize;
    }
    for (enc, (all, kept)) in &by_encoding {
        let want = match enc.as_deref() {
            None | Some("ternary2" | "f16" | "q8_0") => *all,
            Some(_) => 0,
        };
        assert_eq!(*kept, want, "{enc:?}: {kept} of {all} carried");
    }
    assert_eq!(carried.len(), 134);
    assert_eq!(kernels::all().len(), 372);
    // And nothing else: every carried name is a registry kernel.
    assert_eq!(
        carried.len(),
        by_encoding.values().map(|v| v.1).sum::<usize>()
    );
}

#[test]
fn the_digest_covers_the_kernels() {
    let dir = tempfile::tempdir().unwrap();
    let b = written(dir.path(), "t.bundle");
    let name = &ours(&b)[0].name;
    let file = format!("kernels/{name}.wgsl");
    // One byte of a kernel: opening (every backend, the CPU's included) and verify fail,
    // naming the file.
    let mut bytes = std::fs::read(b.join(&file)).unwrap();
    bytes[10] ^= 1;
    std::fs::write(b.join(&file), &bytes).unwrap();
    let e = Bundle::open(&b)
        .err()
        .expect("a changed kernel byte must fail open");
    assert!(e.to_string().contains(&format!("{file}: sha256")), "{e}");
    let o = convert(&["verify"], &[&b]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("failure: {file}: sha256")),
        "{}",
        text(&o)
    );

    // The kernel entry and the file list must agree: rehashing only the file list is caught.
    let b2 = written(dir.path(), "t2.bundle");
    let mut m = manifest(&b2);
    let wgsl = format!("{}// edited\n", ours(&b)[0].wgsl);
    std::fs::write(b2.join(&file), &wgsl).unwrap();
    for f in m.files.iter_mut().filter(|f| f.path == file) {
        f.size = wgsl.len() as u64;
        f.sha256 = Some(sha256_hex(wgsl.as_bytes()));
    }
    write_manifest(&b2, &mut m);
    let e = Bundle::open(&b2).err().unwrap();
    assert!(
        e.to_string()
            .contains(&format!("{file}: the kernels section says")),
        "{e}"
    );

    // Rehashed everywhere, a comment-only edit verifies (naga's MSL has no comments, so the
    // MSL is still what naga makes from it); verify notes that the WGSL is not this build's.
    rewrite_kernel(&b2, &file, wgsl.as_bytes());
    Bundle::open(&b2).unwrap();
    let o = convert(&["verify"], &[&b2]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("1 changed ({name})")),
        "{}",
        text(&o)
    );
    // Another module under the same name, rehashed: the bundle opens, but its MSL is not what
    // naga makes from the WGSL, and verify says so, naming the MSL file.
    let ws = manifest(&b2)
        .kernels
        .iter()
        .find(|k| &k.name == name && k.kind == KernelKind::Msl)
        .unwrap()
        .msl
        .clone()
        .unwrap()
        .workgroup_size;
    let other = format!(
        "@compute @workgroup_size({}, {}, {}) fn main() {{}}\n",
        ws[0], ws[1], ws[2]
    );
    rewrite_kernel(&b2, &file, other.as_bytes());
    Bundle::open(&b2).unwrap();
    let o = convert(&["verify"], &[&b2]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "failure: kernels/{name}.metal: differs from the MSL naga {} makes from {file}",
            bk::NAGA_VERSION
        )),
        "{}",
        text(&o)
    );

    // A WGSL file that does not parse, rehashed: verify names it.
    rewrite_kernel(&b2, &file, b"fn main( {");
    let o = convert(&["verify", "--json"], &[&b2]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let failures = r["failures"].to_string();
    assert!(
        failures.contains(&format!("{file}: kernel {name}: the WGSL does not parse")),
        "{failures}"
    );
    let check = r["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["file"] == file.as_str())
        .unwrap();
    assert_eq!(check["passed"], false);
}

#[test]
fn a_manifest_with_inconsistent_kernel_entries_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let b = written(dir.path(), "t.bundle");
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit); 4] = [
        ("listed twice", |m| {
            let k = m["kernels"][0].clone();
            m["kernels"].as_array_mut().unwrap().push(k);
        }),
        ("expected \"kernels/", |m| {
            m["kernels"][0]["file"] = "weights.bin".into();
        }),
        ("the msl record is missing", |m| {
            m["kernels"][1].as_object_mut().unwrap().remove("msl");
        }),
        ("is under kernels/ but is not in the kernels section", |m| {
            let k = m["kernels"].as_array_mut().unwrap();
            k.remove(1);
            k.remove(0);
        }),
    ];
    for (needle, edit) in cases {
        let (_d, t) = common::edited_copy(&b, edit);
        let o = convert(&["verify"], &[&t]);
        assert_eq!(o.status.code(), Some(2), "{needle}: {}", text(&o));
        assert!(text(&o).contains(needle), "{needle}: {}", text(&o));
    }
}

#[test]
fn from_bundle_returns_exactly_the_registry() {
    let dir = tempfile::tempdir().unwrap();
    let b = Bundle::open(written(dir.path(), "t.bundle")).unwrap();
    assert_eq!(kernels::from_bundle(&b).unwrap(), registry(&b.dir));
}

#[test]
fn old_bundle_runs_on_the_cpu_and_add_kernels_makes_it_a_fresh_write() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = written(dir.path(), "fresh/t.bundle");
    let old = written(dir.path(), "old/t.bundle");
    strip_kernels(&old);
    // The stripped bundle is the bundle this file gave before kernels shipped.
    assert_eq!(manifest(&old).bundle_digest, DIGEST_BEFORE_KERNELS);

    // Valid: verify passes and says what is missing, and that its manifest is not covered
    // (format version 1); the CPU backend runs it, warning the same.
    let o = convert(&["verify"], &[&old]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("note: no GPU kernels (a bundle made before kernels shipped in bundles)"),
        "{}",
        text(&o)
    );
    let v1 = "manifest format_version 1: its bundle digest covers the files but not manifest.json";
    assert!(
        text(&o).contains(&format!("note: {}: {v1}", old.display())),
        "{}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!("warning: {}: {v1}", old.display()))
    );
    let o = convert(
        &[
            "run",
            "--backend",
            "cpu",
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "4",
            "--print-ids",
        ],
        &[&old],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(v1),
        "{}",
        text(&o)
    );
    let o_fresh = convert(
        &[
            "run",
            "--backend",
            "cpu",
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "4",
            "--print-ids",
        ],
        &[&fresh],
    );
    assert_eq!(
        o.stdout, o_fresh.stdout,
        "the same tokens with and without kernels"
    );

    // The GPU side refuses it, giving the command that fixes it.
    let e = kernels::from_bundle(&Bundle::open(&old).unwrap()).unwrap_err();
    assert!(matches!(e, KernelError::NoKernels { .. }), "{e}");
    let msg = e.to_string();
    let command = format!("convert add-kernels {}", old.display());
    assert_eq!(
        msg,
        format!(
            "bundle {} carries no GPU kernels (made before kernels shipped in bundles); add them with: {command}",
            old.display()
        )
    );

    // So does `--backend gpu`, before it looks for an adapter.
    let o = convert(
        &[
            "run",
            "--backend",
            "gpu",
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "1",
        ],
        &[&old],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains(&msg), "{}", text(&o));

    // `-o`: a new bundle, the input untouched.
    let copy = dir.path().join("copy/t.bundle");
    std::fs::create_dir(copy.parent().unwrap()).unwrap();
    let o = convert(&["add-kernels", "-q", "-o"], &[&copy, &old]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(manifest(&old).bundle_digest, DIGEST_BEFORE_KERNELS);
    assert!(!old.join("kernels").exists());

    // The command from the message, as given: in place.
    let args: Vec<&str> = command.split(' ').collect();
    assert_eq!(args[..2], ["convert", "add-kernels"]);
    let o = convert(&args[1..], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    let n = ours(&fresh).len();
    assert!(
        out.contains(&format!("{n} kernel modules ({} files", 2 * n))
            && out.contains(&format!("{n} new, 0 replaced, 0 unchanged, 0 removed")),
        "{out}"
    );
    assert!(
        out.contains(&format!("new       {} (wgsl, msl)", ours(&fresh)[0].name)),
        "{out}"
    );
    // Byte for byte what a fresh write gives: manifest (digest included) and every file.
    for b in [&old, &copy] {
        assert!(same_manifest(b, &fresh), "{}", b.display());
        for k in manifest(b).kernels {
            assert_eq!(
                std::fs::read(b.join(&k.file)).unwrap(),
                std::fs::read(fresh.join(&k.file)).unwrap()
            );
        }
        let o = convert(&["verify"], &[b]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        assert!(!text(&o).contains("note:"), "{}", text(&o));
    }
    assert_eq!(
        kernels::from_bundle(&Bundle::open(&old).unwrap()).unwrap(),
        registry(&fresh)
    );
    // Nothing left beside the bundles (no staging directory, no old copy).
    for d in ["old", "copy"] {
        let names: Vec<String> = std::fs::read_dir(dir.path().join(d))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["t.bundle"], "{d}");
    }

    // Again on a bundle that has them: nothing changes.
    let o = convert(&["add-kernels", "-q"], &[&old]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("0 new, 0 replaced, {n} unchanged")),
        "{}",
        text(&o)
    );
    assert_eq!(manifest(&old).bundle_digest, manifest(&fresh).bundle_digest);
}

/// A WGSL module whose MSL is gone from the manifest and the files (digests rewritten): the
/// bundle still verifies, with a note naming it; `add-kernels` writes the MSL again.
#[test]
fn a_wgsl_module_without_its_msl_is_noted() {
    let dir = tempfile::tempdir().unwrap();
    let b = written(dir.path(), "t.bundle");
    let ours = ours(&b);
    let mut m = manifest(&b);
    let name = ours[0].name.clone();
    m.kernels
        .retain(|k| !(k.name == name && k.kind == KernelKind::Msl));
    m.files
        .retain(|f| f.path != format!("kernels/{name}.metal"));
    std::fs::remove_file(b.join(format!("kernels/{name}.metal"))).unwrap();
    write_manifest(&b, &mut m);
    let o = convert(&["verify"], &[&b]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "note: 1 WGSL module(s) without their MSL ({name})"
        )),
        "{}",
        text(&o)
    );
    let o = convert(&["add-kernels"], &[&b]);
    assert!(o.status.success(), "{}", text(&o));
    let o = convert(&["verify"], &[&b]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!text(&o).contains("without their MSL"), "{}", text(&o));
    assert!(b.join(format!("kernels/{name}.metal")).is_file());
}

#[test]
fn add_kernels_replaces_kernels_of_another_build() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = written(dir.path(), "fresh/t.bundle");
    let b = written(dir.path(), "t.bundle");
    // Another build's set: one module of ours missing, one we do not have.
    let ours = ours(&b);
    let extra = bk::translate_all(&[KernelSource {
        name: "zz_other_build".into(),
        wgsl: "@group(0) @binding(0) var<storage, read_write> y: array<f32>;\n@compute @workgroup_size(32) fn main(@builtin(global_invocation_id) i: vec3<u32>) { y[i.x] = 1.0; }\n".into(),
    }])
    .unwrap();
    let mut m = manifest(&b);
    let gone = &ours[0].name;
    m.kernels.retain(|k| &k.name != gone);
    m.files
        .retain(|f| !f.path.starts_with(&format!("kernels/{gone}.")));
    std::fs::remove_file(b.join(format!("kernels/{gone}.wgsl"))).unwrap();
    std::fs::remove_file(b.join(format!("kernels/{gone}.metal"))).unwrap();
    for k in &extra {
        std::fs::write(b.join(&k.entry.file), &k.bytes).unwrap();
        m.kernels.push(k.entry.clone());
        m.files.push(lowbit::bundle::manifest::FileEntry::hashed(
            k.entry.file.clone(),
            k.entry.bytes,
            k.entry.sha256.clone(),
        ));
    }
    write_manifest(&b, &mut m);
    let o = convert(&["verify"], &[&b]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "note: the kernels differ from this build's for the bundle's encodings: 1 missing ({gone}), 1 not among them (zz_other_build), 0 changed"
        )),
        "{}",
        text(&o)
    );
    let o = convert(&["add-kernels"], &[&b]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(
        out.contains(&format!("new       {gone} (wgsl, msl)")),
        "{out}"
    );
    assert!(out.contains("removed   zz_other_build"), "{out}");
    assert!(
        out.contains(&format!(
            "1 new, 0 replaced, {} unchanged, 1 removed",
            ours.len() - 1
        )),
        "{out}"
    );
    assert!(same_manifest(&b, &fresh));
    assert!(!b.join("kernels/zz_other_build.wgsl").exists());
}

/// A bundle made before bundles carried only their encodings' kernels holds every module of
/// the registry: verify notes the others, and `add-kernels` removes them, giving what a fresh
/// write gives.
#[test]
fn add_kernels_removes_the_kernels_of_other_encodings() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = written(dir.path(), "fresh/t.bundle");
    let b = written(dir.path(), "t.bundle");
    let mine: std::collections::BTreeSet<String> = ours(&b).into_iter().map(|k| k.name).collect();
    let others: Vec<KernelSource> = kernels::all()
        .into_iter()
        .filter(|k| !mine.contains(&k.name))
        .collect();
    assert!(others.len() > 100, "{}", others.len());
    let mut m = manifest(&b);
    for k in bk::translate_all(&others).unwrap() {
        std::fs::write(b.join(&k.entry.file), &k.bytes).unwrap();
        m.kernels.push(k.entry.clone());
        m.files.push(lowbit::bundle::manifest::FileEntry::hashed(
            k.entry.file.clone(),
            k.entry.bytes,
            k.entry.sha256.clone(),
        ));
    }
    m.kernels
        .sort_by(|a, b| (&a.name, a.kind).cmp(&(&b.name, b.kind)));
    m.files.sort_by(|a, b| a.path.cmp(&b.path));
    write_manifest(&b, &mut m);
    let o = convert(&["verify"], &[&b]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "0 missing, {} not among them ({}, ...), 0 changed",
            others.len(),
            others[..3]
                .iter()
                .map(|k| k.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        "{}",
        text(&o)
    );
    let o = convert(&["add-kernels"], &[&b]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(
        out.contains(&format!(
            "0 new, 0 replaced, {} unchanged, {} removed",
            mine.len(),
            others.len()
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("removed   {}", others[0].name)),
        "{out}"
    );
    assert!(same_manifest(&b, &fresh));
    assert!(!b.join(format!("kernels/{}.wgsl", others[0].name)).exists());
    let o = convert(&["verify"], &[&b]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!text(&o).contains("note:"), "{}", text(&o));
}

/// `convert add-kernels .` from inside the bundle (and `DIR/.`) replaces it in place: the
/// path is resolved to the directory's name before a replacement is staged beside it.
#[test]
fn add_kernels_takes_dot_for_the_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let b = written(dir.path(), "t.bundle");
    let o = Command::new(env!("CARGO_BIN_EXE_convert"))
        .args(["add-kernels", "-q", "."])
        .current_dir(&b)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let o = convert(&["add-kernels", "-q"], &[&b.join(".")]);
    assert!(o.status.success(), "{}", text(&o));
    let o = convert(&["verify"], &[&b]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // Nothing left beside it but the bundle.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["t.bundle"], "{names:?}");
}

/// A signed bundle's signature is not carried over by add-kernels, and the output says so.
#[test]
fn add_kernels_says_the_signature_is_not_carried_over() {
    let dir = tempfile::tempdir().unwrap();
    let b = written(dir.path(), "t.bundle");
    let key = dir.path().join("k.pem");
    assert!(convert(&["keygen", "-o"], &[&key]).status.success());
    let o = convert(&["sign", "--key"], &[&key, &b]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(b.join("signature.json").exists());
    let o = convert(&["add-kernels", "-q"], &[&b]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("signature.json is not carried over"),
        "{}",
        text(&o)
    );
    assert!(!b.join("signature.json").exists());
    // Unsigned: no such note.
    let o = convert(&["add-kernels", "-q"], &[&b]);
    assert!(!text(&o).contains("signature"), "{}", text(&o));
}

/// Intact kernels that do not parse here (as another naga's output might not) are what
/// add-kernels replaces: the bundle fails verify only for them, and add-kernels makes it
/// this build's again. A kernel file that fails its digest still refuses the bundle.
#[test]
fn add_kernels_replaces_kernels_that_do_not_parse() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = written(dir.path(), "fresh/t.bundle");
    let b = written(dir.path(), "t.bundle");
    rewrite_kernel(&b, "kernels/op_argmax.wgsl", b"fn main( { not wgsl");
    let o = convert(&["verify"], &[&b]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let o = convert(&["add-kernels", "-q"], &[&b]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(same_manifest(&b, &fresh));
    let o = convert(&["verify"], &[&b]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // The same text without the rehash: a file failure, refused, nothing changed.
    std::fs::write(b.join("kernels/op_argmax.wgsl"), b"fn main( { not wgsl").unwrap();
    let before = std::fs::read(b.join("manifest.json")).unwrap();
    let o = convert(&["add-kernels", "-q"], &[&b]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("does not verify, so no kernels were added: kernels/op_argmax.wgsl"),
        "{}",
        text(&o)
    );
    assert_eq!(std::fs::read(b.join("manifest.json")).unwrap(), before);
}

#[test]
fn add_kernels_refuses_a_bundle_that_does_not_verify() {
    let dir = tempfile::tempdir().unwrap();
    let b = written(dir.path(), "t.bundle");
    strip_kernels(&b);
    let mut w = std::fs::read(b.join("weights.bin")).unwrap();
    w[1000] ^= 1;
    std::fs::write(b.join("weights.bin"), &w).unwrap();
    let before = std::fs::read(b.join("manifest.json")).unwrap();
    for args in [&["add-kernels"][..], &["add-kernels", "-o", "x.bundle"][..]] {
        let mut c = Command::new(env!("CARGO_BIN_EXE_convert"));
        c.current_dir(dir.path()).args(args).arg(&b);
        let o = c.output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(
            text(&o).contains("does not verify, so no kernels were added: weights.bin: sha256"),
            "{}",
            text(&o)
        );
    }
    assert_eq!(std::fs::read(b.join("manifest.json")).unwrap(), before);
    assert!(!b.join("kernels").exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    // An output inside the input, or one that exists, is refused before anything is read.
    let fresh = written(dir.path(), "fresh.bundle");
    let inside = fresh.join("sub.bundle");
    let o = convert(&["add-kernels", "-o"], &[&inside, &fresh]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("inside the input bundle"), "{}", text(&o));
    let o = convert(&["add-kernels", "-o"], &[&b, &fresh]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("exists"), "{}", text(&o));
}

/// The GPU context compiles from the bundle's sources alone: the matvec from the bundle's
/// WGSL, and a module the bundle lacks is refused with the add-kernels hint. Skipped without
/// an adapter (lavapipe runs it on any CPU).
#[test]
fn gpu_context_compiles_what_the_bundle_carries() {
    use lowbit::runtime::gpu::{context_for_tests, ContextOptions};
    let dir = tempfile::tempdir().unwrap();
    let b = Bundle::open(written(dir.path(), "t.bundle")).unwrap();
    let mut sources = kernels::from_bundle(&b).unwrap();
    let Some(probe) = context_for_tests(&ContextOptions::default()) else {
        return;
    };
    let cfg = probe.default_matvec_config();
    drop(probe);
    sources.remove(&cfg.name());
    let ctx = context_for_tests(&ContextOptions {
        sources: Some(kernels::from_bundle(&b).unwrap()),
        ..Default::default()
    })
    .unwrap();
    ctx.pipeline(&cfg).unwrap();
    let ctx = context_for_tests(&ContextOptions {
        sources: Some(sources),
        ..Default::default()
    })
    .unwrap();
    let e = ctx.pipeline(&cfg).err().unwrap().to_string();
    assert!(e.contains("convert add-kernels"), "{e}");
    drop(ctx);
    // The GPU backend runs the bundle from its own kernels.
    let o = convert(
        &[
            "run",
            "--backend",
            "gpu",
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "2",
            "--print-ids",
        ],
        &[&b.dir],
    );
    assert!(o.status.success(), "{}", text(&o));
}

/// The host reads the decode attention's cluster size from the kernel a bundle carries: a
/// bundle made before clusters of 4 carries `LANES = 8`, which needs subgroups of 8.
#[test]
fn the_decode_attention_cluster_size_comes_from_the_carried_source() {
    use lowbit::runtime::gpu::{context_for_tests, ops, ContextOptions};
    let dir = tempfile::tempdir().unwrap();
    let b = Bundle::open(written(dir.path(), "t.bundle")).unwrap();
    let Some(builtin) = context_for_tests(&ContextOptions::default()) else {
        return;
    };
    assert_eq!(
        builtin.source_constant("op_attention_decode", "LANES"),
        None
    );
    drop(builtin);
    let mut sources = kernels::from_bundle(&b).unwrap();
    let ctx = context_for_tests(&ContextOptions {
        sources: Some(sources.clone()),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        ctx.source_constant("op_attention_decode", "LANES"),
        Some(ops::DECODE_ATTENTION_LANES)
    );
    assert_eq!(ctx.source_constant("op_attention_decode", "NO_SUCH"), None);
    assert_eq!(ctx.source_constant("op_no_such_kernel", "LANES"), None);
    drop(ctx);
    let old = sources.get_mut("op_attention_decode").unwrap();
    *old = old.replace(
        &format!("const LANES: u32 = {}u;", ops::DECODE_ATTENTION_LANES),
        "const LANES: u32 = 8u;",
    );
    let ctx = context_for_tests(&ContextOptions {
        sources: Some(sources),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(ctx.source_constant("op_attention_decode", "LANES"), Some(8));
}
