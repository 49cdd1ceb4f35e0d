//! `convert`: the lowbit command line. A thin layer over the `lowbit` library.
//!
//! Exit codes: 0 success, 1 a check failed, 2 usage, input or I/O error.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

use lowbit::bundle::verify::{self, VerifyOptions};
use lowbit::bundle::writer::{self, Mode, PackOptions};
use lowbit::export::{self, DequantizeOptions, ExportError, OutDtype};
use lowbit::gguf::GgufFile;
use lowbit::inspect;

#[derive(Parser)]
#[command(
    name = "convert",
    version,
    about = "lowbit: GGUF to low-bit bundles, verified bit for bit"
)]
struct Cli {
    /// Worker threads for parallel stages (default: all cores).
    #[arg(long, global = true)]
    threads: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a GGUF file's header, metadata, tensors and totals by type.
    Inspect {
        /// The GGUF file.
        file: PathBuf,
        /// Print stable JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Dequantize tensors to a new safetensors file (row-major shapes).
    Dequantize {
        /// A GGUF file, or a bundle directory (tensors reconstructed as the runtime
        /// defines them).
        input: PathBuf,
        /// Output .safetensors path; must not exist.
        #[arg(short, long)]
        output: PathBuf,
        /// Element type of the output.
        #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
        dtype: DtypeArg,
        /// Only tensors whose name matches this glob (repeatable; any match keeps a tensor).
        #[arg(long = "tensor", value_name = "GLOB")]
        tensors: Vec<String>,
        /// No progress bar or summary.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Write a bundle with every tensor carried in its source encoding, byte for byte.
    Pack {
        /// The GGUF file.
        input: PathBuf,
        /// Output bundle directory; must not exist.
        #[arg(short, long)]
        output: PathBuf,
        #[command(flatten)]
        common: BundleArgs,
    },
    /// Write a bundle with TQ2_0/TQ1_0 tensors recovered to 2-bit ternary codes and f16 block
    /// scales for the matvec kernel; every other tensor carried in its source encoding.
    GgufToTernary {
        /// The GGUF file.
        input: PathBuf,
        /// Output bundle directory; must not exist.
        #[arg(short, long)]
        output: PathBuf,
        /// Also quantize non-ternary linear weights (blk.N.attn_*/ffn_*.weight) to ternary
        /// with the TQ2_0 rule (absmax per 256-block, round half away from zero).
        #[arg(long)]
        ternarize: bool,
        #[command(flatten)]
        common: BundleArgs,
    },
    /// Check a bundle's files and digest against its manifest and, with --source, every
    /// tensor against the GGUF it came from. Exit 0 passed, 1 a check failed, 2 error.
    Verify {
        /// The bundle directory.
        bundle: PathBuf,
        /// The GGUF file the bundle was made from.
        #[arg(long)]
        source: Option<PathBuf>,
        /// Largest allowed |bundle - source| per element; 0 means bit-identical.
        #[arg(long, default_value_t = 0.0)]
        maxerr: f64,
        /// Print the JSON report instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
struct BundleArgs {
    /// Context length the bundle is built for (position_ids length, KV cache); default the
    /// smaller of 4096 and the trained context.
    #[arg(long)]
    context: Option<u64>,
    /// No progress bar or summary.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum DtypeArg {
    F32,
    F16,
    Bf16,
}

impl From<DtypeArg> for OutDtype {
    fn from(d: DtypeArg) -> Self {
        match d {
            DtypeArg::F32 => OutDtype::F32,
            DtypeArg::F16 => OutDtype::F16,
            DtypeArg::Bf16 => OutDtype::Bf16,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(n) = cli.threads {
        if let Err(e) = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
        {
            eprintln!("error: --threads {n}: {e}");
            return ExitCode::from(2);
        }
    }
    match run(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// File name of a path, for the manifest's command line.
fn base(p: &std::path::Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn pack(
    input: PathBuf,
    output: PathBuf,
    mode: Mode,
    common: BundleArgs,
    mut command_line: Vec<String>,
) -> anyhow::Result<ExitCode> {
    command_line.extend([base(&input), "-o".into(), base(&output)]);
    if let Some(c) = common.context {
        command_line.extend(["--context".into(), c.to_string()]);
    }
    let opts = PackOptions {
        mode,
        context: common.context,
        quiet: common.quiet,
        fail_after_tensors: None,
    };
    let t0 = std::time::Instant::now();
    match writer::write_bundle(&input, &output, &opts, command_line) {
        Ok(s) => {
            if !common.quiet {
                eprintln!(
                    "wrote {}: {} tensors ({} ternary, {} carried), {} bytes from {} ({:.2}x) in {:.2}s; bundle digest {}",
                    output.display(),
                    s.tensors,
                    s.ternary,
                    s.carried,
                    s.bundle_bytes,
                    s.source_bytes,
                    s.source_bytes as f64 / s.bundle_bytes.max(1) as f64,
                    t0.elapsed().as_secs_f64(),
                    s.bundle_digest
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode::from(e.exit_code()))
        }
    }
}

fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Inspect { file, json } => {
            let f = GgufFile::open(&file)?;
            let mut out = std::io::stdout().lock();
            if json {
                serde_json::to_writer_pretty(&mut out, &inspect::report_json(&f))?;
                writeln!(out)?;
            } else {
                out.write_all(inspect::report_text(&f).as_bytes())?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Dequantize {
            input,
            output,
            dtype,
            tensors,
            quiet,
        } => {
            let opts = DequantizeOptions {
                dtype: dtype.into(),
                tensor_globs: tensors,
                quiet,
            };
            let t0 = std::time::Instant::now();
            let s = if input.is_dir() {
                export::dequantize_bundle(&input, &output, &opts)
            } else {
                export::dequantize_gguf(&input, &output, &opts)
            };
            let s = match s {
                Ok(s) => s,
                Err(ExportError::Bundle(e)) => {
                    eprintln!("error: dequantize {}: {e}", input.display());
                    return Ok(ExitCode::from(e.exit_code()));
                }
                Err(e) => return Err(e).with_context(|| format!("dequantize {}", input.display())),
            };
            if !quiet {
                eprintln!(
                    "wrote {}: {} tensors, {} elements, {} bytes ({}) in {:.2}s; source sha256 {}",
                    output.display(),
                    s.tensors,
                    s.elements,
                    s.bytes_written,
                    opts.dtype.name(),
                    t0.elapsed().as_secs_f64(),
                    s.source_sha256
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Pack {
            input,
            output,
            common,
        } => pack(
            input,
            output,
            Mode::Pack,
            common,
            vec!["convert".into(), "pack".into()],
        ),
        Command::GgufToTernary {
            input,
            output,
            ternarize,
            common,
        } => {
            let mut cl = vec!["convert".to_string(), "gguf-to-ternary".into()];
            if ternarize {
                cl.push("--ternarize".into());
            }
            pack(input, output, Mode::Ternary { ternarize }, common, cl)
        }
        Command::Verify {
            bundle,
            source,
            maxerr,
            json,
        } => {
            if !(maxerr >= 0.0) {
                eprintln!("error: --maxerr {maxerr} must be a number >= 0");
                return Ok(ExitCode::from(2));
            }
            let opts = VerifyOptions { source, maxerr };
            let report = match verify::verify(&bundle, &opts) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("error: verify {}: {e}", bundle.display());
                    return Ok(ExitCode::from(2));
                }
            };
            let mut out = std::io::stdout().lock();
            if json {
                serde_json::to_writer_pretty(&mut out, &report)?;
                writeln!(out)?;
            } else {
                print_verify(&mut out, &report)?;
            }
            Ok(if report.passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

fn print_verify(out: &mut impl Write, r: &verify::VerifyReport) -> std::io::Result<()> {
    writeln!(out, "bundle:  {}", r.bundle)?;
    writeln!(
        out,
        "source:  {}",
        r.source.as_deref().unwrap_or("(not given: integrity only)")
    )?;
    writeln!(out, "digest:  {}", r.bundle_digest)?;
    writeln!(out, "maxerr:  {}", r.maxerr)?;
    writeln!(
        out,
        "{:<44} {:<14} {:<10} {:>12} {:>10} {:>12}  result",
        "tensor", "encoding", "compared", "elements", "mismatch", "max|diff|"
    )?;
    for t in &r.tensors {
        writeln!(
            out,
            "{:<44} {:<14} {:<10} {:>12} {:>10} {:>12}  {}",
            t.name,
            t.encoding,
            t.compared,
            t.elements,
            t.mismatched,
            t.max_abs_diff,
            if t.passed { "ok" } else { "FAILED" }
        )?;
    }
    for f in &r.failures {
        writeln!(out, "failure: {f}")?;
    }
    let tt = &r.totals;
    writeln!(
        out,
        "{} tensors ({} ternary, {} carried): {} passed; {} files; {} ternary elements compared, {} mismatched, max |diff| {} -> {}",
        tt.tensors,
        tt.ternary,
        tt.carried,
        tt.passed,
        r.files_checked,
        tt.elements_compared,
        tt.mismatched,
        tt.max_abs_diff,
        if r.passed { "PASSED" } else { "FAILED" }
    )
}
