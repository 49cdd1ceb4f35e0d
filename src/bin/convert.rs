//! `convert`: the lowbit command line. A thin layer over the `lowbit` library.
//!
//! Exit codes: 0 success, 1 a check failed, 2 usage, input or I/O error.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

use lowbit::export::{self, DequantizeOptions, OutDtype};
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
        /// The GGUF file.
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
            let s = export::dequantize_gguf(&input, &output, &opts)
                .with_context(|| format!("dequantize {}", input.display()))?;
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
    }
}
