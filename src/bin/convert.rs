//! `convert`: the lowbit command line. A thin layer over the `lowbit` library.
//!
//! Exit codes: 0 success, 1 a check failed, 2 usage, input or I/O error.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `println!` that returns the error of a closed or full stdout (`?`) instead of panicking:
/// `main` reports it (a closed pipe quietly, as `head` closing it is not an error).
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($t)*).map_err(stdout_error)?
    }};
}

/// `print!` as [`outln`] does it.
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout(), $($t)*).map_err(stdout_error)?
    }};
}

/// Stdout, locked, for a command's output: its write errors say "writing to stdout"
/// ([`stdout_error`]).
struct Stdout(std::io::StdoutLock<'static>);

impl std::io::Write for Stdout {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.write(b).map_err(stdout_error)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush().map_err(stdout_error)
    }
}

fn stdout() -> Stdout {
    Stdout(std::io::stdout().lock())
}

/// A failed write to stdout, saying so (a full disk behind `> FILE` reads "writing to
/// stdout: No space left on device"); the kind is kept, so a reader closing the pipe
/// (BrokenPipe) still ends the command quietly.
fn stdout_error(e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("writing to stdout: {e}"))
}

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
    /// Worker threads for parallel stages (default: all cores), 1 to 1024.
    #[arg(long, global = true, value_parser = thread_count)]
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
        /// Also write config.json (model configuration) and tokenizer.json beside the
        /// output, so `convert palettize` can take the safetensors file as a model.
        #[arg(long)]
        with_config: bool,
        /// No progress bar or summary.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Write a bundle whose weight matrices are palettized: per group of output channels
    /// (rows) a lookup table of 2^bits f16 entries, and a bits-bit index per weight.
    Palettize {
        /// A GGUF file, a safetensors file (config.json and tokenizer.json beside it, as
        /// `dequantize --with-config` writes), or a bundle directory (ternary tensors kept).
        input: PathBuf,
        /// Output bundle directory; must not exist.
        #[arg(short, long)]
        output: PathBuf,
        /// Bits per index: 8, 6, 4 (also 3, 2, 1).
        #[arg(long)]
        bits: u32,
        /// kmeans: globally optimal 1-D k-means per group; uniform: evenly spaced entries
        /// between the group's min and max (in f64, each weight on its nearest entry);
        /// uniform-coremltools: coremltools 9.0's UNIFORM operation by operation (its f16
        /// arithmetic and indices, for bit-compatibility).
        #[arg(long, value_enum, default_value_t = PalModeArg::Kmeans)]
        mode: PalModeArg,
        /// Consecutive rows sharing one table; default one table per tensor.
        #[arg(long)]
        group_size: Option<u64>,
        /// Worker threads (default: --threads, else all cores), 1 to 1024; the output does
        /// not depend on it.
        #[arg(long, value_parser = thread_count)]
        workers: Option<usize>,
        /// Palettize only matrices with more than this many elements.
        #[arg(long, default_value_t = lowbit::bundle::palettize::DEFAULT_MIN_ELEMENTS)]
        min_elements: u64,
        /// Palettize only tensors matching this glob (repeatable).
        #[arg(long, value_name = "GLOB")]
        include: Vec<String>,
        /// Never palettize tensors matching this glob (repeatable).
        #[arg(long, value_name = "GLOB")]
        exclude: Vec<String>,
        #[command(flatten)]
        common: BundleArgs,
    },
    /// Equivalence gate: run CANDIDATE and REFERENCE greedily over a prompt set and require,
    /// at every step, the same argmax, |p_cand - p_ref| of the reference's token within
    /// --max-prob-err, finite logits, and bit-identical repeated candidate runs. Exit 0
    /// passed, 1 failed, 2 error.
    Validate(ValidateArgs),
    /// Quality on real data: perplexity of a text (as llama-perplexity computes it), with
    /// --reference the KL-divergence statistics of llama-perplexity --kl-divergence, and
    /// BIG-bench tasks (multiple choice by log-likelihood, exact match by greedy generation)
    /// with 95% intervals; optional gates. Exit 0 passed, 1 a gate failed, 2 error.
    Eval(EvalArgs),
    /// Build the artifacts of recipes (TOML, schemas/recipe.v1.schema.json): check the pinned
    /// source, run the steps and the gates, compare each bundle digest with the recipe's
    /// expectation (--check, the default) or rewrite the expectations (--update), write
    /// provenance.json beside each bundle, and publish OUT/NAME only when everything passed.
    /// Exit 0 passed, 1 a gate failed or a digest drifted, 2 error.
    Build {
        /// Recipe files.
        #[arg(required = true)]
        recipes: Vec<PathBuf>,
        /// Output folder: each recipe's artifacts go to OUT/NAME (which must not exist).
        #[arg(short, long, default_value = "artifacts")]
        output: PathBuf,
        /// Fail when a digest differs from the recipe's expectation (the default).
        #[arg(long, conflicts_with = "update")]
        check: bool,
        /// Rewrite the recipe's expected digests (and its lock file) with those built.
        #[arg(long)]
        update: bool,
        /// Write the report (every step, gate, digest and drift) as JSON to this path.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Sign every bundle with this Ed25519 private key (`convert keygen`) before publishing
        /// (a recipe's `[sign] key_env` names one through the environment).
        #[arg(long)]
        key: Option<PathBuf>,
        /// No progress lines.
        #[arg(short, long)]
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
    /// Load a bundle (checking every file first) and generate text, streamed to stdout.
    Run(RunArgs),
    /// Measure prompt and decode speed (tokens/s) and peak resident memory of a bundle.
    Bench {
        /// The bundle directory.
        bundle: PathBuf,
        /// Prompt tokens (run as prefill chunks, see --prefill).
        #[arg(long, default_value_t = 64, value_parser = at_least_one)]
        prompt_tokens: usize,
        /// Generated tokens (greedy).
        #[arg(long, default_value_t = 32, value_parser = at_least_one)]
        gen_tokens: usize,
        /// Repetitions; the best is reported.
        #[arg(long, default_value_t = 1, value_parser = at_least_one)]
        repeats: usize,
        #[command(flatten)]
        rt: RuntimeArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Tokenize text as llama.cpp's llama-tokenize does: each token as `id -> 'piece'`, or with
    /// --ids the ids as a Python list. Special-token text is split out only with
    /// --parse-special (llama-tokenize parses it by default).
    Tokenize {
        /// A bundle directory or a GGUF file (a vocabulary-only GGUF with no tensors will do).
        model: PathBuf,
        /// The text, used verbatim (as llama-tokenize --no-escape).
        #[arg(long, short = 'p')]
        prompt: String,
        /// Print only the ids, as a Python list: [1, 2, 3].
        #[arg(long)]
        ids: bool,
        /// No BOS (and no EOS) even when the model adds them.
        #[arg(long)]
        no_bos: bool,
        /// Print JSON: {"n_tokens", "add_special", "parse_special", "ids", "pieces"}.
        #[arg(long, conflicts_with = "ids")]
        json: bool,
        /// Split special-token text (e.g. <|im_start|>) out as those tokens.
        #[arg(long)]
        parse_special: bool,
        /// Leave special-token text as text (the default; for llama-tokenize command lines).
        #[arg(long, conflicts_with = "parse_special")]
        no_parse_special: bool,
        /// Also print the total number of tokens (not with --json, which has n_tokens).
        #[arg(long, conflicts_with = "json")]
        show_count: bool,
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
        /// Require a signature by this public key (repeatable: any of them); an unsigned
        /// bundle, one signed by another key or changed after signing fails.
        #[arg(long = "trusted-key", value_name = "PUB")]
        trusted_keys: Vec<PathBuf>,
    },
    /// Make an Ed25519 key pair for `convert sign`: KEY (PKCS#8 PEM, mode 0600) and KEY.pub
    /// (SubjectPublicKeyInfo PEM). Neither may exist; both appear only when complete.
    Keygen {
        /// The private key file to write (the public key goes to KEY.pub).
        #[arg(short, long, value_name = "KEY")]
        output: PathBuf,
    },
    /// Sign a bundle (format version 2 or later): writes BUNDLE/signature.json, an Ed25519 signature
    /// over its bundle digest, manifest digest and file list, replacing an earlier one. The
    /// bundle must verify first. Check it with `verify --trusted-key KEY.pub`.
    Sign {
        /// The bundle directory.
        bundle: PathBuf,
        /// The private key (PKCS#8 PEM, as `convert keygen` writes it; group and others must
        /// have no access to it).
        #[arg(long, value_name = "KEY")]
        key: PathBuf,
    },
    /// Give a bundle this binary's GPU kernels for its tensors' encodings (each WGSL module and
    /// the MSL naga makes from it), added to a bundle made before kernels shipped in bundles or
    /// replacing the ones it carries (other encodings' kernels are removed); recomputes the manifest and the bundle digest. The bundle must verify first,
    /// but for kernels that are intact and do not parse or validate here (those it replaces).
    /// Without -o the bundle is replaced (staged beside it, then swapped in).
    AddKernels {
        /// The bundle directory.
        bundle: PathBuf,
        /// Write the result here (must not exist) and leave the bundle as it is.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Print only the summary line.
        #[arg(long, short)]
        quiet: bool,
    },
    /// List the GPU adapters wgpu finds (Vulkan, Metal, DX12): backend, driver, features,
    /// subgroup sizes and the limits the kernels depend on. No adapter is not an error.
    GpuInfo {
        /// Print JSON (one object per adapter, fixed key order).
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
struct SampleArgs {
    /// Sampling temperature; 0 is greedy (argmax).
    #[arg(long, default_value_t = 0.0, value_parser = finite_f32)]
    temperature: f32,
    /// Sample among the K most likely tokens (0: all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Sample among the smallest set of tokens whose probability reaches P.
    #[arg(long, default_value_t = 0.95, value_parser = finite_f32)]
    top_p: f32,
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(clap::Args)]
struct BundleArgs {
    /// Context length the bundle is built for (position_ids length, KV cache); default the
    /// smaller of 4096 and the trained context.
    #[arg(long)]
    context: Option<u64>,
    /// Prefill buckets: the static prompt-chunk lengths the bundle declares (its `prefill_S`
    /// functions), ascending, each at most the context; default 16,64,256 (those up to the
    /// context).
    #[arg(long, value_delimiter = ',', value_name = "S,S,...")]
    prefill_buckets: Option<Vec<u64>>,
    /// No progress bar or summary.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(clap::Args)]
struct ValidateArgs {
    /// The bundle under test (e.g. palettized).
    candidate: PathBuf,
    /// The bundle it must agree with (e.g. `convert pack` of the same model).
    #[arg(long)]
    reference: PathBuf,
    /// Prompt set: a JSON array of strings (default: the checked-in set,
    /// testdata/validate/prompts.json).
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Largest allowed |p_cand - p_ref| of the reference's greedy token at any step.
    #[arg(long, default_value_t = 0.02)]
    max_prob_err: f64,
    /// Candidate runs that must give bit-identical logits.
    #[arg(long, default_value_t = 2, value_parser = at_least_one)]
    repeats: usize,
    /// Greedy steps judged per prompt.
    #[arg(long, default_value_t = 16, value_parser = at_least_one)]
    gen_tokens: usize,
    /// Write the full report as JSON to this path.
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    rt: RuntimeArgs,
}

#[derive(clap::Args)]
struct EvalArgs {
    /// The bundle to measure.
    bundle: PathBuf,
    /// The bundle to compare with (same vocabulary), e.g. `convert pack` of the source GGUF:
    /// adds KL divergence, same-top share, Δp and the PPL ratio on the text, and the paired
    /// accuracy difference on each task.
    #[arg(long)]
    reference: Option<PathBuf>,
    /// A UTF-8 text for perplexity (e.g. Botchan, `make eval-data`).
    #[arg(long)]
    text: Option<PathBuf>,
    /// A BIG-bench task.json (repeatable).
    #[arg(long = "task")]
    tasks: Vec<PathBuf>,
    /// Tokens per perplexity chunk (llama-perplexity's -c); the second half of each chunk is
    /// scored.
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Score at most this many chunks of the text (llama-perplexity's --chunks).
    #[arg(long)]
    chunks: Option<usize>,
    /// Run at most N examples of each task, drawn with --seed (all when not given).
    #[arg(long)]
    limit: Option<usize>,
    /// Seed of the example subset (ChaCha8).
    #[arg(long, default_value_t = 1234)]
    seed: u64,
    /// Exact-match tasks: at most this many generated tokens per example.
    #[arg(long, default_value_t = 32, value_parser = at_least_one)]
    max_gen_tokens: usize,
    /// Gate: mean KL divergence (nats) against --reference at most F.
    #[arg(long, value_name = "F")]
    max_kld: Option<f64>,
    /// Gate: share of positions where the top token equals the reference's, at least F (0..1).
    #[arg(long, value_name = "F")]
    min_same_top: Option<f64>,
    /// Gate: PPL / PPL(reference) at most F.
    #[arg(long, value_name = "F")]
    max_ppl_ratio: Option<f64>,
    /// Gate: on every task, accuracy drop against --reference at most F (0..1), judged on
    /// the 95% interval of the paired difference: fails when its lower end is above F.
    #[arg(long, value_name = "F")]
    max_accuracy_drop: Option<f64>,
    /// Gate preset: `8bit` (--max-kld 0.01 --min-same-top 0.93 --max-ppl-ratio 1.02
    /// --max-accuracy-drop 0.05, from llama.cpp's Q8_0; README). Explicit gate flags override
    /// it; a preset's gate whose inputs are not given (no --task) is left out.
    #[arg(long, value_name = "NAME")]
    gate_preset: Option<String>,
    /// Write the full report as JSON to this path (replaced whole at the end).
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress bars.
    #[arg(short, long)]
    quiet: bool,
    #[command(flatten)]
    rt: RuntimeArgs,
}

/// How a command that runs a model runs it.
#[derive(clap::Args)]
struct RuntimeArgs {
    /// Backend: cpu, or gpu (wgpu: Vulkan, Metal or DX12; `convert gpu-info` lists the
    /// adapters).
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// GPU adapter by index (as `convert gpu-info` lists them) or by a case-insensitive
    /// substring of its name; the first discrete GPU when not given.
    #[arg(long, value_name = "INDEX|NAME")]
    gpu_adapter: Option<String>,
    /// GPU: reduce with workgroup memory even where the adapter has subgroup operations (the
    /// path adapters without them take).
    #[arg(long)]
    gpu_no_subgroups: bool,
    /// GPU: the device memory the model may take, in bytes or with a K, M, G or T suffix
    /// (powers of 1024); a model that needs more (weights, KV cache, RoPE tables) is refused
    /// before anything is uploaded. Default: the adapter's own figure where the driver gives
    /// one (Vulkan: its largest device-local heap); this replaces it.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    gpu_memory: Option<u64>,
    /// Matrix kernel: int8 activations (the default: exact integer block sums for ternary,
    /// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K weights, llama.cpp-like rounding of
    /// the activations; other encodings use f32) or f32 activations (the exact reference).
    #[arg(long, value_enum, default_value_t = KernelArg::Int8)]
    kernel: KernelArg,
    /// KV cache element type: f16 (the bundle's state type) or f32 (no rounding of K and V;
    /// twice the memory).
    #[arg(long, value_enum, default_value_t = KvArg::F16)]
    kv_cache: KvArg,
    /// Prompt processing: the bundle's prefill buckets (chunks of up to the largest bucket,
    /// each weight read once per chunk), or single decode steps (the reference the buckets
    /// are held to; the same logits, bit for bit).
    #[arg(long, value_enum, default_value_t = PrefillArg::Buckets)]
    prefill: PrefillArg,
    /// Load only a bundle signed by this public key (repeatable: any of them); an unsigned
    /// bundle, one signed by another key or changed after signing is refused (exit 1).
    #[arg(long = "trusted-key", value_name = "PUB")]
    trusted_keys: Vec<PathBuf>,
}

/// `--gpu-memory`: a byte count, optionally with a K, M, G or T suffix (powers of 1024).
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, shift) = match t.char_indices().last() {
        Some((i, c))
            if c.is_ascii_alphabetic() && i > 0 && t[..i].bytes().all(|b| b.is_ascii_digit()) =>
        {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("{s:?}: the suffix must be K, M, G or T")),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: not a byte count (e.g. 24G, 512M, 1000000)"))?;
    if n == 0 {
        return Err(format!("{s:?}: must be more than 0"));
    }
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?}: too large"))
}

/// A run's decode speed for the human-readable lines: `12.34 tok/s`, or what was not timed
/// where no decode step ran (the first generated token comes from the prompt's logits).
fn decode_rate(st: &lowbit::runtime::GenStats) -> String {
    if st.decode_steps == 0 {
        "(no decode step timed)".into()
    } else {
        format!("{:.2} tok/s", st.decode_tps())
    }
}

impl RuntimeArgs {
    fn backend(&self) -> anyhow::Result<lowbit::runtime::BackendKind> {
        Ok(self.backend.parse()?)
    }

    fn load_options(&self) -> anyhow::Result<lowbit::runtime::LoadOptions> {
        if matches!(self.backend(), Ok(lowbit::runtime::BackendKind::Cpu)) {
            let given: Vec<&str> = [
                ("--gpu-adapter", self.gpu_adapter.is_some()),
                ("--gpu-memory", self.gpu_memory.is_some()),
                ("--gpu-no-subgroups", self.gpu_no_subgroups),
            ]
            .into_iter()
            .filter_map(|(f, on)| on.then_some(f))
            .collect();
            if !given.is_empty() {
                eprintln!(
                    "warning: {} {} to --backend gpu only; ignored with the cpu backend",
                    given.join(", "),
                    if given.len() == 1 { "applies" } else { "apply" }
                );
            }
        }
        Ok(lowbit::runtime::LoadOptions {
            gpu_adapter: self.gpu_adapter.as_deref().map(str::parse).transpose()?,
            gpu_no_subgroups: self.gpu_no_subgroups,
            gpu_memory: self.gpu_memory,
            gpu_max_binding_bytes: None,
            gpu_sources: None,
            kernel: self.kernel.into(),
            kv: self.kv_cache.into(),
            buckets: match self.prefill {
                PrefillArg::Buckets => None,
                PrefillArg::Single => Some(vec![1]),
            },
            trusted_keys: read_trusted_keys(&self.trusted_keys)?,
        })
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum PrefillArg {
    Buckets,
    Single,
}

#[derive(Clone, Copy, ValueEnum)]
enum PalModeArg {
    Kmeans,
    Uniform,
    UniformCoremltools,
}

#[derive(Clone, Copy, ValueEnum)]
enum KernelArg {
    F32,
    Int8,
}

impl From<KernelArg> for lowbit::runtime::matvec::Kernel {
    fn from(k: KernelArg) -> Self {
        match k {
            KernelArg::F32 => lowbit::runtime::matvec::Kernel::F32,
            KernelArg::Int8 => lowbit::runtime::matvec::Kernel::Int8,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum KvArg {
    F16,
    F32,
}

impl From<KvArg> for lowbit::runtime::KvType {
    fn from(k: KvArg) -> Self {
        match k {
            KvArg::F16 => lowbit::runtime::KvType::F16,
            KvArg::F32 => lowbit::runtime::KvType::F32,
        }
    }
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

/// Reads the `--trusted-key` files.
fn read_trusted_keys(
    paths: &[PathBuf],
) -> Result<Vec<lowbit::bundle::sign::PublicKey>, lowbit::bundle::sign::SignError> {
    paths
        .iter()
        .map(|p| lowbit::bundle::sign::read_public_key(p))
        .collect()
}

/// Whether `e` is a bundle's failed signature check (`--trusted-key`): exit 1, as a failed
/// check, rather than 2.
fn is_untrusted(e: &anyhow::Error) -> bool {
    use lowbit::bundle::BundleError;
    use lowbit::runtime::{validate::ValidateError, RuntimeError};
    let sig = |b: &BundleError| matches!(b, BundleError::Signature { .. });
    e.chain().any(|c| {
        c.downcast_ref::<BundleError>().is_some_and(sig)
            || matches!(c.downcast_ref::<RuntimeError>(), Some(RuntimeError::Bundle(b)) if sig(b))
            || matches!(
                c.downcast_ref::<ValidateError>(),
                Some(ValidateError::Runtime(RuntimeError::Bundle(b))) if sig(b)
            )
    })
}

/// A number that is finite as an f32 (`1e39` overflows to infinity there: refused as typed,
/// not as `inf`).
fn finite_f32(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(_) => Err("not a finite number (f32)".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A count of at least 1 (`bench`'s and `validate`'s token and repeat counts, `eval
/// --max-gen-tokens`), checked when the command line is parsed, as [`thread_count`] does:
/// a usage error naming the flag and the value before anything is loaded.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// `MAX_THREADS`: `--threads` and `--workers` above this are refused (more than any machine's
/// cores; each thread costs a stack and a kernel task).
const MAX_THREADS: usize = 1024;

/// `--threads` / `--workers`: 1 to [`MAX_THREADS`], checked when the command line is parsed
/// (so a recipe's step with `--threads 0` is refused when the recipe is loaded, not when the
/// step runs).
fn thread_count(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(n),
        Ok(_) => Err(format!("must be between 1 and {MAX_THREADS}")),
        Err(e) => Err(e.to_string()),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // SIGINT, SIGTERM and SIGHUP: remove the `.NAME.*.partial` output being written, then exit
    // as the shell reports a signal (128 + SIGINT). Without a handler it would stay beside the
    // output.
    if let Err(e) = ctrlc::set_handler(|| lowbit::util::remove_partial_outputs_and_exit(130)) {
        eprintln!(
            "warning: no signal handler ({e}); an interrupted run may leave a .partial output"
        );
    }
    if let Some(n) = cli.threads {
        if n == 0 || n > MAX_THREADS {
            eprintln!("error: --threads {n}: must be between 1 and {MAX_THREADS}");
            return ExitCode::from(2);
        }
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
        // Output piped into `head` and closed early: not an error.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::from(if is_untrusted(&e) { 1 } else { 2 })
        }
    }
}

/// Whether `e` is a write to a pipe whose reader has gone: an io error of that kind, or one
/// that a JSON writer wrapped (serde_json's error does not give its io error as a source).
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    use std::io::ErrorKind::BrokenPipe;
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == BrokenPipe)
        || e.downcast_ref::<serde_json::Error>()
            .is_some_and(|j| j.io_error_kind() == Some(BrokenPipe))
}

/// The error and its causes on one line, `: `-separated, leaving out a cause whose text the
/// message already contains (errors that print their source, as `"{path}: {source}"` does,
/// would otherwise say it twice).
fn one_line(e: &anyhow::Error) -> String {
    let mut s = String::new();
    for c in e.chain() {
        let t = c.to_string();
        if s.contains(&t) {
            continue;
        }
        if !s.is_empty() {
            s.push_str(": ");
        }
        s.push_str(&t);
    }
    s
}

/// A bundle's tokenizer as `run` takes it, without opening the weights: the manifest read and
/// checked, tokenizer.json's size and SHA256 against it, its tokens against the model's
/// n_vocab.
fn tokenizer_of_bundle(dir: &std::path::Path) -> anyhow::Result<lowbit::tokenizer::Tokenizer> {
    use lowbit::bundle::manifest::TOKENIZER_FILE;
    let mf = lowbit::bundle::reader::open_manifest(dir)?;
    let m = &mf.manifest;
    let entry = m
        .files
        .iter()
        .find(|f| f.path == TOKENIZER_FILE)
        .ok_or_else(|| anyhow::anyhow!("the manifest lists no {TOKENIZER_FILE}"))?;
    let p = dir.join(TOKENIZER_FILE);
    let size = std::fs::metadata(&p)
        .with_context(|| p.display().to_string())?
        .len();
    if size != entry.size {
        anyhow::bail!(
            "{TOKENIZER_FILE}: {size} bytes, the manifest says {} (truncated or extended)",
            entry.size
        );
    }
    let sha = lowbit::util::sha256_file(&p).with_context(|| p.display().to_string())?;
    if entry.sha256.as_deref() != Some(sha.as_str()) {
        anyhow::bail!(
            "{TOKENIZER_FILE}: SHA256 {sha} is not the manifest's: changed after writing"
        );
    }
    Ok(lowbit::tokenizer::Tokenizer::for_model(
        dir,
        m.model.n_vocab as usize,
    )?)
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
        prefill_buckets: common.prefill_buckets.clone(),
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

/// `convert gpu-info`: every adapter, or a line saying there is none (exit 0 either way).
fn gpu_info(json: bool) -> anyhow::Result<ExitCode> {
    let reports = lowbit::runtime::gpu::adapter_reports();
    let mut out = stdout();
    if json {
        serde_json::to_writer_pretty(&mut out, &reports)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    if reports.is_empty() {
        // One line: the error's text (which says how to get an adapter) and the backends
        // searched.
        writeln!(
            out,
            "{} [wgpu backends searched: Vulkan, Metal, DX12]",
            lowbit::runtime::gpu::GpuError::NoAdapter
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    let yn = |b: bool| if b { "yes" } else { "no" };
    for a in &reports {
        let l = &a.limits;
        writeln!(
            out,
            "adapter {}: {}{}",
            a.index,
            a.name,
            if a.default { " (default)" } else { "" }
        )?;
        writeln!(out, "  backend:      {}", a.backend)?;
        writeln!(out, "  device type:  {}", a.device_type)?;
        writeln!(out, "  driver:       {} ({})", a.driver, a.driver_info)?;
        writeln!(
            out,
            "  vendor:       {:#06x}, device {:#06x}",
            a.vendor, a.device
        )?;
        writeln!(
            out,
            "  features:     SUBGROUP {}, SHADER_F16 {}, TIMESTAMP_QUERY {}",
            yn(a.subgroup),
            yn(a.shader_f16),
            yn(a.timestamp_query)
        )?;
        writeln!(
            out,
            "  subgroup:     {}..{} invocations",
            a.subgroup_min_size, a.subgroup_max_size
        )?;
        writeln!(
            out,
            "  memory:       {}",
            a.device_memory_bytes
                .map_or("not reported by this backend".to_string(), |b| format!(
                    "{b} bytes (largest device-local heap)"
                ))
        )?;
        writeln!(
            out,
            "  max_buffer_size:                       {}",
            l.max_buffer_size
        )?;
        writeln!(
            out,
            "  max_storage_buffer_binding_size:       {}",
            l.max_storage_buffer_binding_size
        )?;
        writeln!(
            out,
            "  max_compute_workgroup_size_x:          {}",
            l.max_compute_workgroup_size_x
        )?;
        writeln!(
            out,
            "  max_compute_invocations_per_workgroup: {}",
            l.max_compute_invocations_per_workgroup
        )?;
        writeln!(
            out,
            "  max_compute_workgroups_per_dimension:  {}",
            l.max_compute_workgroups_per_dimension
        )?;
        writeln!(
            out,
            "  max_compute_workgroup_storage_size:    {}",
            l.max_compute_workgroup_storage_size
        )?;
        writeln!(
            out,
            "  min_storage_buffer_offset_alignment:   {}",
            l.min_storage_buffer_offset_alignment
        )?;
        writeln!(out, "  all features: {}", a.features.join(" "))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::GpuInfo { json } => gpu_info(json),
        Command::Inspect { file, json } => {
            let f = GgufFile::open(&file)?;
            let mut out = stdout();
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
            with_config,
            quiet,
        } => {
            let opts = DequantizeOptions {
                dtype: dtype.into(),
                with_config,
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
                    // A damaged input bundle is an input error here, as in run and palettize.
                    eprintln!("error: dequantize {}: {e}", input.display());
                    return Ok(ExitCode::from(2));
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
        Command::Palettize {
            input,
            output,
            bits,
            mode,
            group_size,
            workers,
            min_elements,
            include,
            exclude,
            common,
        } => {
            let mode = match mode {
                PalModeArg::Kmeans => lowbit::palette::Mode::Kmeans,
                PalModeArg::Uniform => lowbit::palette::Mode::Uniform,
                PalModeArg::UniformCoremltools => lowbit::palette::Mode::UniformCoremltools,
            };
            let mut cl: Vec<String> = vec![
                "convert".into(),
                "palettize".into(),
                base(&input),
                "-o".into(),
                base(&output),
                "--bits".into(),
                bits.to_string(),
                "--mode".into(),
                mode.name().into(),
            ];
            if let Some(g) = group_size {
                cl.extend(["--group-size".into(), g.to_string()]);
            }
            cl.extend(["--min-elements".into(), min_elements.to_string()]);
            for g in &include {
                cl.extend(["--include".into(), g.clone()]);
            }
            for g in &exclude {
                cl.extend(["--exclude".into(), g.clone()]);
            }
            if let Some(c) = common.context {
                cl.extend(["--context".into(), c.to_string()]);
            }
            let opts = lowbit::bundle::palettize::PalettizeOptions {
                bits,
                mode,
                group_size,
                workers: workers.or(Some(rayon::current_num_threads())),
                min_elements,
                include,
                exclude,
                context: common.context,
                prefill_buckets: common.prefill_buckets.clone(),
                quiet: common.quiet,
            };
            let t0 = std::time::Instant::now();
            match lowbit::bundle::palettize::palettize(&input, &output, &opts, cl) {
                Ok(s) => {
                    if !common.quiet {
                        eprintln!(
                            "wrote {}: {} tensors ({} palettized, {}-bit {}), weights {} bytes, sse {:.6e}, max |err| {:.3e}, in {:.2}s; bundle digest {}",
                            output.display(),
                            s.tensors,
                            s.palettized,
                            bits,
                            mode.name(),
                            s.weights_bytes,
                            s.sse,
                            s.max_abs_err,
                            t0.elapsed().as_secs_f64(),
                            s.bundle_digest
                        );
                    }
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("error: palettize {}: {e}", input.display());
                    Ok(ExitCode::from(2))
                }
            }
        }
        Command::Tokenize {
            model,
            prompt,
            ids,
            no_bos,
            json,
            parse_special,
            no_parse_special: _,
            show_count,
        } => {
            use lowbit::tokenizer::llama_tokenize as lt;
            // A bundle is checked as `run` checks its tokenizer; a folder holding only a
            // tokenizer.json (no manifest to check it against) is read as it is.
            let bundle = model.join(lowbit::bundle::manifest::MANIFEST_FILE).exists();
            let tok = if model.is_dir() && bundle {
                tokenizer_of_bundle(&model)
            } else {
                lt::load(&model).map_err(anyhow::Error::from)
            }
            .with_context(|| format!("tokenize {}", model.display()))?;
            let opts = lt::TokenizeOptions {
                no_bos,
                parse_special,
            };
            let t = lt::tokenize(&tok, &prompt, opts);
            let mut out = std::io::BufWriter::new(stdout());
            if json {
                serde_json::to_writer(&mut out, &lt::to_json(&tok, &t))?;
                writeln!(out)?;
            } else if ids {
                lt::write_ids(&t.ids, &mut out)?;
            } else {
                lt::write_pieces(&tok, &t.ids, &mut out)?;
            }
            if show_count {
                lt::write_count(t.ids.len(), &mut out)?;
            }
            out.flush()?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Validate(args) => validate_cmd(args),
        Command::Eval(args) => eval_cmd(args),
        Command::Build {
            recipes,
            output,
            check: _,
            update,
            json,
            key,
            quiet,
        } => build_cmd(
            &recipes,
            &output,
            update,
            json.as_deref(),
            key.as_deref(),
            quiet,
        ),
        Command::Run(args) => run_cmd(args),
        Command::Bench {
            bundle,
            prompt_tokens,
            gen_tokens,
            repeats,
            rt,
            json,
        } => bench_cmd(bundle, prompt_tokens, gen_tokens, repeats, &rt, json),
        Command::AddKernels {
            bundle,
            output,
            quiet,
        } => {
            let t0 = std::time::Instant::now();
            let s = match writer::add_kernels(&bundle, output.as_deref()) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("error: add-kernels {}: {e}", bundle.display());
                    return Ok(ExitCode::from(2));
                }
            };
            let mut out = stdout();
            if !quiet {
                for (name, what) in &s.modules {
                    writeln!(out, "{what:<9} {name} (wgsl, msl)")?;
                }
                for name in &s.removed {
                    writeln!(out, "{:<9} {name}", "removed")?;
                }
            }
            let count = |w: &str| s.modules.iter().filter(|m| m.1 == w).count();
            writeln!(
                out,
                "{}: {} kernel modules ({} files, WGSL and MSL from naga {}): {} new, {} replaced, {} unchanged, {} removed, in {:.2}s; bundle digest {} -> {}",
                s.output.display(),
                s.modules.len(),
                s.files,
                lowbit::bundle::kernels::NAGA_VERSION,
                count("new"),
                count("replaced"),
                count("unchanged"),
                s.removed.len(),
                t0.elapsed().as_secs_f64(),
                s.old_digest,
                s.new_digest
            )?;
            if s.signature_dropped {
                writeln!(
                    out,
                    "note: the bundle's signature.json is not carried over (it covered the old digests); sign the result again with `convert sign`"
                )?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Keygen { output } => {
            use lowbit::bundle::sign;
            let written = sign::generate_key().and_then(|k| {
                let id = sign::key_id(&k.verifying_key());
                sign::write_key_pair(&k, &output).map(|p| (p, id))
            });
            match written {
                Ok(((key, public), id)) => {
                    outln!(
                        "wrote {} (private, PKCS#8 PEM, mode 0600) and {} (public); key id {id}",
                        key.display(),
                        public.display()
                    );
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("error: keygen: {e}");
                    Ok(ExitCode::from(e.exit_code()))
                }
            }
        }
        Command::Sign { bundle, key } => {
            use lowbit::bundle::sign;
            match sign::read_signing_key(&key).and_then(|k| sign::sign_bundle(&bundle, &k)) {
                Ok(s) => {
                    outln!(
                        "signed {} with key {}: {} ({}) over bundle digest {}, manifest digest {} and {} files",
                        bundle.display(),
                        s.key_id,
                        s.signature.display(),
                        if s.replaced { "replaced the earlier signature" } else { "new" },
                        s.bundle_digest,
                        s.manifest_digest,
                        s.files
                    );
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("error: sign {}: {e}", bundle.display());
                    Ok(ExitCode::from(e.exit_code()))
                }
            }
        }
        Command::Verify {
            bundle,
            source,
            maxerr,
            json,
            trusted_keys,
        } => {
            if maxerr.is_nan() || maxerr < 0.0 {
                eprintln!("error: --maxerr {maxerr} must be a number >= 0");
                return Ok(ExitCode::from(2));
            }
            let trusted_keys = match read_trusted_keys(&trusted_keys) {
                Ok(k) => k,
                Err(e) => {
                    eprintln!("error: verify {}: --trusted-key {e}", bundle.display());
                    return Ok(ExitCode::from(2));
                }
            };
            let opts = VerifyOptions {
                source,
                maxerr,
                trusted_keys,
            };
            let report = match verify::verify(&bundle, &opts) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("error: verify {}: {e}", bundle.display());
                    return Ok(ExitCode::from(2));
                }
            };
            let shown = (|| -> anyhow::Result<()> {
                let mut out = stdout();
                if json {
                    serde_json::to_writer_pretty(&mut out, &report)?;
                    writeln!(out)?;
                } else {
                    print_verify(&mut out, &report)?;
                }
                Ok(())
            })();
            verdict(report.passed, shown)
        }
    }
}

/// Peak resident set size of this process in bytes (`VmHWM`), if the OS reports it.
fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn bench_cmd(
    bundle: PathBuf,
    prompt_tokens: usize,
    gen_tokens: usize,
    repeats: usize,
    rt: &RuntimeArgs,
    json: bool,
) -> anyhow::Result<ExitCode> {
    use lowbit::runtime::{self, Sampler, SamplerConfig};
    // Arguments first (the counts are at least 1 from the parser): nothing is loaded for a
    // run that cannot happen.
    let backend = rt.backend()?;
    let manifest = lowbit::bundle::reader::read_manifest(&bundle)
        .with_context(|| format!("load {}", bundle.display()))?;
    lowbit::arch::check_config(&manifest.model)
        .with_context(|| format!("load {}", bundle.display()))?;
    if prompt_tokens.saturating_add(gen_tokens) as u64 > manifest.model.n_ctx {
        anyhow::bail!(
            "--prompt-tokens {prompt_tokens} plus --gen-tokens {gen_tokens} is more than the bundle's context n_ctx = {}",
            manifest.model.n_ctx
        );
    }
    let t_load = std::time::Instant::now();
    let mut be = runtime::load(backend, &bundle, &rt.load_options()?)
        .with_context(|| format!("load {}", bundle.display()))?;
    let load_s = t_load.elapsed().as_secs_f64();
    let n_vocab = be.n_vocab() as u32;
    // A fixed, deterministic prompt: token ids spread over the vocabulary.
    let prompt: Vec<u32> = (0..prompt_tokens as u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 7) % n_vocab)
        .collect();
    let (mut best_pp, mut best_tg): (Option<runtime::GenStats>, Option<runtime::GenStats>) =
        (None, None);
    for _ in 0..repeats {
        let mut sampler = Sampler::new(SamplerConfig::default())?;
        let (_, st) = runtime::generate(
            be.as_mut(),
            &prompt,
            gen_tokens,
            &mut sampler,
            &|_| false,
            &mut |_| true,
        )?;
        if best_pp
            .as_ref()
            .is_none_or(|b| st.prompt_tps() > b.prompt_tps())
        {
            best_pp = Some(st.clone());
        }
        if best_tg
            .as_ref()
            .is_none_or(|b| st.decode_tps() > b.decode_tps())
        {
            best_tg = Some(st);
        }
    }
    let (pp, st) = (
        best_pp.expect("at least one repeat"),
        best_tg.expect("at least one repeat"),
    );
    let info = be.info();
    let weights = info.weight_bytes;
    let kv = info.kv_cache_bytes;
    let per_token = info.decode_bytes_per_token;
    let rss = peak_rss_bytes();
    let timed = st.decode_steps > 0;
    // CPU time a decode step, where one was timed (as the speed).
    let cpu_ms = st
        .decode_cpu_seconds
        .filter(|_| timed)
        .map(|c| c * 1e3 / st.decode_steps as f64);
    let report = serde_json::json!({
        "bundle": bundle.display().to_string(),
        "info": info,
        "architecture": info.architecture,
        "backend": info.backend,
        "kernel": info.kernel,
        "cpu_level": info.cpu_level,
        "kv_cache": info.kv_cache,
        "threads": info.threads,
        "prompt_tokens": pp.prompt_tokens,
        "gen_tokens": st.generated,
        "load_seconds": load_s,
        "prompt_tokens_per_second": pp.prompt_tps(),
        // null where no decode step was timed (--gen-tokens 1: the first token comes from the
        // prompt's logits), not a speed of 0.
        "decode_tokens_per_second": timed.then(|| st.decode_tps()),
        "weight_bytes": weights,
        "kv_cache_bytes": kv,
        "peak_rss_bytes": rss,
        "rss_over_weights_plus_kv": rss.map(|r| r as f64 / (weights + kv) as f64),
        "decode_bytes_per_token": per_token,
        "decode_weight_read_gb_per_second": timed.then(|| per_token as f64 * st.decode_tps() / 1e9),
        "decode_cpu_ms_per_token": cpu_ms,
        "dispatches_per_token": info.dispatches_per_token,
        "device": info.device,
    });
    if json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        outln!(
            "{}: {} backend, {} kernel{}, {} threads, buckets {:?}; load {:.2}s; prompt {} tokens {:.2} tok/s; decode {} tokens {}; weights {:.1} MB, KV cache {:.1} MB, peak RSS {} MB ({:.2}x weights+KV); decode reads weights ({:.1} MB per token) at {}",
            bundle.display(),
            info.backend,
            info.kernel,
            info.cpu_level.map(|l| format!(" ({l})")).unwrap_or_default(),
            info.threads,
            info.buckets,
            load_s,
            pp.prompt_tokens,
            pp.prompt_tps(),
            st.generated,
            decode_rate(&st),
            weights as f64 / 1e6,
            kv as f64 / 1e6,
            rss.map(|r| format!("{:.1}", r as f64 / 1e6)).unwrap_or_else(|| "?".into()),
            rss.map(|r| r as f64 / (weights + kv) as f64).unwrap_or(f64::NAN),
            per_token as f64 / 1e6,
            if timed {
                format!("{:.2} GB/s", per_token as f64 * st.decode_tps() / 1e9)
            } else {
                "(no decode step timed)".into()
            }
        );
        if let Some(dev) = &info.device {
            outln!(
                "  device: {dev}; {} dispatches per decode step; CPU time {} per decode step",
                info.dispatches_per_token.unwrap_or(0),
                match (cpu_ms, timed) {
                    (Some(ms), _) => format!("{ms:.3} ms"),
                    (None, false) => "(no decode step timed)".into(),
                    (None, true) => "?".into(),
                }
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args)]
struct RunArgs {
    /// The bundle directory.
    bundle: PathBuf,
    /// The prompt text (tokenized with the bundle's tokenizer).
    #[arg(long, conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// The prompt as comma-separated token ids instead of text.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long, conflicts_with = "prompt_ids")]
    chat: bool,
    #[command(flatten)]
    sample: SampleArgs,
    #[command(flatten)]
    rt: RuntimeArgs,
    /// Never pick an end-of-generation token and keep generating to --max-tokens (as
    /// llama.cpp's --ignore-eos: their logits count as -inf).
    #[arg(long)]
    ignore_eos: bool,
    /// Print the generated token ids to stderr at the end.
    #[arg(long)]
    print_ids: bool,
    /// Write the first step's logits (after the prompt) as little-endian f32 to this file.
    #[arg(long)]
    dump_logits: Option<PathBuf>,
}

fn build_cmd(
    recipes: &[PathBuf],
    output: &Path,
    update: bool,
    json: Option<&Path>,
    key: Option<&Path>,
    quiet: bool,
) -> anyhow::Result<ExitCode> {
    use lowbit::build::{self, Mode, Recipe};
    use lowbit::bundle::sign::read_signing_key;
    // Every recipe and output checked before any work.
    let list = recipes
        .iter()
        .map(|p| Recipe::load(p))
        .collect::<Result<Vec<_>, _>>()?;
    // Keys read (and their file modes checked) before any work.
    let cli_key = key
        .map(|k| read_signing_key(k).with_context(|| format!("--key {}", k.display())))
        .transpose()?;
    let mut keys = Vec::new();
    for r in &list {
        keys.push(match (&cli_key, &r.sign) {
            (Some(k), _) => Some(k.clone()),
            (None, Some(s)) => {
                let p = std::env::var_os(&s.key_env).ok_or_else(|| {
                    anyhow::anyhow!(
                        "recipe {}: [sign] key_env = {:?}: that environment variable is not set (or give --key)",
                        r.path.display(),
                        s.key_env
                    )
                })?;
                Some(read_signing_key(Path::new(&p)).with_context(|| {
                    format!("recipe {}: the key ${}", r.path.display(), s.key_env)
                })?)
            }
            (None, None) => None,
        });
    }
    // Every step's and gate's flags, through the command-line parser, before any work: a
    // typo or a missing flag is the recipe's error (exit 2), not a gate failure after the
    // steps ran.
    for r in &list {
        for (what, argv) in r.planned_commands() {
            let full = std::iter::once("convert".to_string()).chain(argv);
            if let Err(e) = Cli::try_parse_from(full) {
                let msg = e.to_string();
                let first = msg.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
                anyhow::bail!(
                    "recipe {}: {what}: its flags do not parse: {}",
                    r.path.display(),
                    first.trim_start_matches("error: ")
                );
            }
        }
    }
    let mut names = std::collections::BTreeSet::new();
    for r in &list {
        if !names.insert(r.name.clone()) {
            anyhow::bail!(
                "two recipes are named {:?}: their outputs would collide",
                r.name
            );
        }
        lowbit::util::refuse_existing(&output.join(&r.name))?;
        r.check_source()?;
    }
    if let Some(p) = json {
        // Never over a recipe or a source, nor where a recipe's output goes.
        let sources: Vec<PathBuf> = list.iter().map(|r| r.source_path()).collect();
        let inputs: Vec<&Path> = list
            .iter()
            .map(|r| r.path.as_path())
            .chain(sources.iter().map(|p| p.as_path()))
            .chain(key)
            .collect();
        lowbit::util::check_report_path(p, &inputs).context("--json")?;
        // (OUT/NAME does not exist yet, checked above: a report inside it has no folder.)
        for r in &list {
            if p == output.join(&r.name) {
                anyhow::bail!(
                    "--json {}: that is where recipe {:?} publishes its artifacts",
                    p.display(),
                    r.name
                );
            }
        }
    }
    std::fs::create_dir_all(output).with_context(|| format!("{}", output.display()))?;
    let threads = Some(rayon::current_num_threads());
    let mode = if update { Mode::Update } else { Mode::Check };
    let mut reports = Vec::new();
    let mut shown: anyhow::Result<()> = Ok(());
    for (r, key) in list.iter().zip(&keys) {
        let rep = build::build(
            r,
            &output.join(&r.name),
            mode,
            threads,
            key.as_ref(),
            &mut |m| {
                if !quiet {
                    eprintln!("[{}] {m}", r.name);
                }
            },
        )?;
        // A report line that cannot be written (a closed or full stdout) stops no build:
        // the first such error is kept for the end.
        if shown.is_ok() {
            shown = show_build_report(r, &rep, update);
        }
        reports.push(rep);
    }
    if !quiet {
        build_summary(&list, &reports);
    }
    if let Some(p) = json {
        let mut j = serde_json::to_vec_pretty(&reports)?;
        j.push(b'\n');
        lowbit::util::replace_file(p, &j)?;
    }
    verdict(reports.iter().all(|r| r.passed), shown)
}

/// One recipe's report lines (steps, gates, digests, the outcome) on stdout.
fn show_build_report(
    r: &lowbit::build::Recipe,
    rep: &lowbit::build::Report,
    update: bool,
) -> anyhow::Result<()> {
    use lowbit::build;
    for s in rep.steps.iter().chain(&rep.gates) {
        outln!(
            "{} {}: {} ({:.1} s){}{}",
            r.name,
            s.what,
            if s.passed { "ok" } else { "FAILED" },
            s.seconds,
            if s.summary.is_empty() { "" } else { ": " },
            s.summary
        );
        if !s.passed {
            outln!(
                "  {}\n  {}",
                s.command.join(" "),
                s.output_tail.replace('\n', "\n  ")
            );
        }
    }
    for d in &rep.digests {
        let update = update && rep.passed;
        match (&d.expected, d.matches, update) {
            (Some(e), _, true) if *e != d.digest => {
                outln!(
                    "{} {}: expected {} -> {} (updated)",
                    r.name,
                    d.artifact,
                    e,
                    d.digest
                )
            }
            (None, _, true) => {
                outln!("{} {}: expected (new) {}", r.name, d.artifact, d.digest)
            }
            (None, _, false) => outln!(
                "{} {}: digest {} not checked: the recipe has no [expected] entry for it \
                 (`convert build --update` records it)",
                r.name,
                d.artifact,
                d.digest
            ),
            (_, true, _) => outln!("{} {}: digest {} ok", r.name, d.artifact, d.digest),
            (e, false, _) => {
                outln!(
                    "{} {}: DRIFT: digest {} expected {}",
                    r.name,
                    d.artifact,
                    d.digest,
                    e.as_deref().unwrap_or("?")
                );
                for x in &d.drift {
                    outln!("  {x}");
                }
                if d.drift.is_empty() {
                    outln!("  (no lock file entry to name what differs: run --update once to write {})", build::lock_path(&r.path).display());
                }
            }
        }
    }
    outln!(
        "{}: {}",
        r.name,
        if rep.published {
            format!("published {}", rep.output.display())
        } else {
            "FAILED, nothing published".into()
        }
    );
    Ok(())
}

/// A command's exit code from its verdict and whether its report reached stdout: a failed
/// verdict stays exit 1 even where the report could not be printed (a closed pipe must not
/// turn a failure into success); a passed one with an unwritable stdout is the write error
/// (exit 2, or 0 for a pipe its reader closed, as `main` treats one).
fn verdict(passed: bool, shown: anyhow::Result<()>) -> anyhow::Result<ExitCode> {
    match shown {
        Ok(()) if passed => Ok(ExitCode::SUCCESS),
        Ok(()) => Ok(ExitCode::from(1)),
        Err(e) if !passed => {
            eprintln!("warning: the report was not printed: {}", one_line(&e));
            Ok(ExitCode::from(1))
        }
        Err(e) => Err(e),
    }
}

/// Bytes of every file under `d` (a bundle's, kernels/ included); 0 for what cannot be read.
fn tree_bytes(d: &Path) -> u64 {
    std::fs::read_dir(d)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => tree_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// The closing table of `convert build`: per artifact, its digest and size, and what each
/// gate on it found (to stderr, after the per-command lines).
fn build_summary(list: &[lowbit::build::Recipe], reports: &[lowbit::build::Report]) {
    eprintln!("\nsummary");
    for (r, rep) in list.iter().zip(reports) {
        for d in &rep.digests {
            let bytes = tree_bytes(&rep.output.join(format!("{}.bundle", d.artifact)));
            let size = if rep.published {
                format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
            } else {
                "unpublished".into()
            };
            eprintln!(
                "  {}/{}  digest {}{}  {size}",
                r.name,
                d.artifact,
                &d.digest[..d.digest.len().min(16)],
                if d.matches { "" } else { " (DRIFT)" }
            );
            for (g, ran) in r.gates.iter().zip(&rep.gates) {
                if g.artifact == d.artifact {
                    eprintln!(
                        "      {:<9}{}{}{}",
                        format!("{:?}", g.op).to_lowercase(),
                        if ran.passed { "ok" } else { "FAILED" },
                        if ran.summary.is_empty() { "" } else { "  " },
                        ran.summary
                    );
                }
            }
        }
        eprintln!(
            "  {}: {}",
            r.name,
            if rep.published {
                "passed, published"
            } else {
                "FAILED, nothing published"
            }
        );
    }
}

/// `e`, with `what` (the text or task file and the bundle that ran it) in front where the
/// logits were not finite: the eval library names the row or example, the command the files.
fn name_non_finite(e: lowbit::eval::EvalError, what: impl FnOnce() -> String) -> anyhow::Error {
    match e {
        lowbit::eval::EvalError::NonFinite { .. } => anyhow::Error::new(e).context(what()),
        e => e.into(),
    }
}

fn eval_cmd(a: EvalArgs) -> anyhow::Result<ExitCode> {
    use lowbit::eval::{self, ppl, tasks, EvalError, Gates};
    use lowbit::runtime;
    let t0 = std::time::Instant::now();
    let mut gates = Gates {
        max_kld: a.max_kld,
        min_same_top: a.min_same_top,
        max_ppl_ratio: a.max_ppl_ratio,
        max_accuracy_drop: a.max_accuracy_drop,
    };
    if let Some(name) = &a.gate_preset {
        let mut p = Gates::preset(name)
            .ok_or_else(|| anyhow::anyhow!("--gate-preset {name:?}: unknown (known: 8bit)"))?;
        if a.reference.is_none() {
            anyhow::bail!("--gate-preset {name}: its gates compare with --reference");
        }
        // The preset's gates on inputs not given are left out.
        if a.text.is_none() {
            (p.max_kld, p.min_same_top, p.max_ppl_ratio) = (None, None, None);
        }
        if a.tasks.is_empty() {
            p.max_accuracy_drop = None;
        }
        gates = gates.or(&p);
    }
    // Every input checked before any model runs.
    if a.text.is_none() && a.tasks.is_empty() {
        anyhow::bail!("nothing to measure: give --text FILE and/or --task FILE");
    }
    gates.check_inputs(a.text.is_some(), !a.tasks.is_empty(), a.reference.is_some())?;
    for (name, v) in [
        ("--max-kld", a.max_kld),
        ("--min-same-top", a.min_same_top),
        ("--max-ppl-ratio", a.max_ppl_ratio),
        ("--max-accuracy-drop", a.max_accuracy_drop),
    ] {
        if v.is_some_and(|v| !v.is_finite() || v < 0.0) {
            anyhow::bail!("{name}: must be a finite number >= 0");
        }
    }
    // Fractions: above 1 no run could pass the gate (or, for the drop, fail it).
    for (name, v) in [
        ("--min-same-top", a.min_same_top),
        ("--max-accuracy-drop", a.max_accuracy_drop),
    ] {
        if let Some(v) = v.filter(|&v| v > 1.0) {
            anyhow::bail!("{name} {v}: a fraction, at most 1");
        }
    }
    if a.limit == Some(0) {
        anyhow::bail!("--limit 0: run at least one example");
    }
    if let Some(p) = &a.json {
        let mut inputs = vec![a.bundle.as_path()];
        inputs.extend(a.reference.as_deref());
        inputs.extend(a.text.as_deref());
        inputs.extend(a.tasks.iter().map(|t| t.as_path()));
        inputs.extend(a.rt.trusted_keys.iter().map(|k| k.as_path()));
        lowbit::util::check_report_path(p, &inputs).context("--json")?;
    }
    let text = match &a.text {
        Some(p) => {
            let bytes = lowbit::util::read_input(p).map_err(|e| EvalError::Text {
                path: p.clone(),
                detail: e.to_string(),
            })?;
            let s = String::from_utf8(bytes).map_err(|e| EvalError::Text {
                path: p.clone(),
                detail: format!("not UTF-8 (byte {})", e.utf8_error().valid_up_to()),
            })?;
            Some((p.clone(), s))
        }
        None => None,
    };
    let task_list = a
        .tasks
        .iter()
        .map(|p| tasks::Task::load(p))
        .collect::<Result<Vec<_>, _>>()?;
    let backend = a.rt.backend()?;
    let opts = a.rt.load_options()?;
    let load = |p: &std::path::Path| -> anyhow::Result<(
        Box<dyn runtime::Backend + Send>,
        lowbit::tokenizer::Tokenizer,
    )> {
        let be =
            runtime::load(backend, p, &opts).with_context(|| format!("load {}", p.display()))?;
        let tok = lowbit::tokenizer::Tokenizer::for_model(p, be.n_vocab())
            .with_context(|| format!("{}: the bundle's tokenizer", p.display()))?;
        Ok((be, tok))
    };
    let (mut model, tok) = load(&a.bundle)?;
    let mut reference = match &a.reference {
        Some(r) => {
            let (be, rtok) = load(r)?;
            let same = be.n_vocab() == model.n_vocab()
                && (0..tok.n_vocab() as u32).all(|i| tok.token_text(i) == rtok.token_text(i));
            if !same {
                anyhow::bail!(
                    "--reference {}: a different vocabulary ({} tokens) from {} ({} tokens); KL divergence and paired scores need the same tokens",
                    r.display(),
                    be.n_vocab(),
                    a.bundle.display(),
                    model.n_vocab()
                );
            }
            Some(be)
        }
        None => None,
    };
    let n_ctx = reference
        .as_ref()
        .map_or(model.n_ctx(), |r| r.n_ctx().min(model.n_ctx()));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut text_info = None;
    let mut text_report = None;
    if let Some((path, s)) = &text {
        if a.ctx > n_ctx {
            anyhow::bail!(
                "--ctx {}: larger than the bundle's context n_ctx = {n_ctx}{}",
                a.ctx,
                if a.reference.is_some() {
                    " (the smaller of the two bundles)"
                } else {
                    ""
                }
            );
        }
        let ids = tok.encode(s, true, false);
        let chunking = ppl::Chunking {
            ctx: a.ctx,
            max_chunks: a.chunks,
            bos: if tok.add_bos() { tok.bos() } else { None },
        };
        let n = ppl::n_chunks(ids.len(), &chunking).map_err(|e| EvalError::Text {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        if a.chunks == Some(0) {
            anyhow::bail!("--chunks 0: score at least one chunk");
        }
        let pb = lowbit::util::progress_bar(n as u64, a.quiet, false);
        pb.set_message("perplexity");
        let r = ppl::run(
            model.as_mut(),
            reference
                .as_deref_mut()
                .map(|r| r as &mut dyn runtime::Backend),
            &ids,
            &chunking,
            &stop,
            &mut |done, _, acc| {
                pb.set_position(done as u64);
                pb.set_message(format!("PPL {:.4}", acc.perplexity().ppl.value));
            },
        )
        .map_err(|e| {
            name_non_finite(e, || {
                format!(
                    "perplexity of {} with the model {}{}",
                    path.display(),
                    a.bundle.display(),
                    a.reference
                        .as_ref()
                        .map(|r| format!(" and the reference {}", r.display()))
                        .unwrap_or_default()
                )
            })
        })?;
        pb.finish_and_clear();
        text_info = Some(eval::TextInfo {
            file: path.clone(),
            bytes: s.len() as u64,
            sha256: lowbit::util::sha256_hex(s.as_bytes()),
        });
        text_report = Some(r);
    }
    let mut task_reports = Vec::new();
    for t in &task_list {
        let subset = t.subset(a.limit, a.seed);
        let run_one = |be: &mut dyn runtime::Backend, who: &str, path: &std::path::Path| {
            let pb = lowbit::util::progress_bar(subset.len() as u64, a.quiet, false);
            pb.set_message(format!("{} ({who})", t.name));
            let r = tasks::answer(
                be,
                &tok,
                t,
                &subset,
                a.max_gen_tokens,
                &stop,
                &mut |d, _| pb.set_position(d as u64),
            );
            pb.finish_and_clear();
            r.map_err(|e| {
                name_non_finite(e, || {
                    format!(
                        "task {} with the {who} {}",
                        t.path.display(),
                        path.display()
                    )
                })
            })
        };
        let ans = run_one(model.as_mut(), "model", &a.bundle)?;
        let ans_ref = match (reference.as_deref_mut(), &a.reference) {
            (Some(r), Some(p)) => Some(run_one(r, "reference", p)?),
            _ => None,
        };
        task_reports.push(tasks::report(t, &subset, a.seed, &ans, ans_ref.as_ref()));
    }
    let gate_results = eval::judge(&gates, text_report.as_ref(), &task_reports);
    let info = model.info();
    let report = eval::EvalReport {
        bundle: a.bundle.clone(),
        reference: a.reference.clone(),
        backend: info.backend.to_string(),
        kernel: info.kernel.to_string(),
        text: text_info,
        passed: gate_results.iter().all(|g| g.passed),
        perplexity: text_report,
        tasks: task_reports,
        gates: gate_results,
        seconds: t0.elapsed().as_secs_f64(),
    };
    if let Some(p) = &a.json {
        let mut j = serde_json::to_vec_pretty(&report)?;
        j.push(b'\n');
        lowbit::util::replace_file(p, &j)?;
    }
    let shown = print_eval(&report).map_err(anyhow::Error::from);
    verdict(report.passed, shown)
}

/// The human-readable eval report, in llama-perplexity's terms.
fn print_eval(r: &lowbit::eval::EvalReport) -> std::io::Result<()> {
    if let Some(p) = &r.perplexity {
        outln!(
            "perplexity: {} chunks of {} tokens ({} tokens, {} scored)",
            p.chunks,
            p.ctx,
            p.tokens,
            p.scored
        );
        outln!(
            "Final estimate: PPL = {:.4} +/- {:.5}",
            p.perplexity.ppl.value,
            p.perplexity.ppl.error
        );
        if let Some(d) = &p.reference {
            outln!(
                "Mean PPL(base)            : {:10.6} ± {:10.6}",
                d.ppl_reference.value,
                d.ppl_reference.error
            );
            outln!(
                "Mean PPL(Q)/PPL(base)     : {:10.6} ± {:10.6}",
                d.ppl_ratio.value,
                d.ppl_ratio.error
            );
            outln!(
                "Mean    KLD: {:10.6} ± {:10.6}   median {:.6}  90% {:.6}  95% {:.6}  99% {:.6}  99.9% {:.6}  max {:.6}",
                d.kld.value,
                d.kld.error,
                d.kld_quantiles.median,
                d.kld_quantiles.p90,
                d.kld_quantiles.p95,
                d.kld_quantiles.p99,
                d.kld_quantiles.p99_9,
                d.kld_quantiles.max
            );
            outln!(
                "RMS Δp    : {:6.3} ± {:5.3} %   max |Δp| {:.3} %",
                100.0 * d.p_diff_rms.value,
                100.0 * d.p_diff_rms.error,
                100.0
                    * d.p_diff_quantiles
                        .max
                        .abs()
                        .max(d.p_diff_quantiles.min.abs())
            );
            outln!(
                "Same top p: {:6.3} ± {:5.3} %",
                100.0 * d.same_top.value,
                100.0 * d.same_top.error
            );
        }
    }
    for t in &r.tasks {
        let pc = |p: &lowbit::eval::stats::Proportion| {
            format!("{:.3} [{:.3}, {:.3}]", p.value, p.low, p.high)
        };
        out!(
            "task {} ({:?}, {} of {}): acc {}",
            t.task,
            t.mode,
            t.examples,
            t.of,
            pc(&t.acc)
        );
        if let Some(n) = &t.acc_norm {
            out!("  acc_norm {}", pc(n));
        }
        outln!();
        if let Some(rf) = &t.reference {
            outln!(
                "  reference acc {}; paired difference {:+.3} [{:+.3}, {:+.3}], McNemar p = {:.4} ({} only the model, {} only the reference)",
                pc(&rf.acc),
                rf.paired.diff,
                rf.paired.diff_low,
                rf.paired.diff_high,
                rf.paired.mcnemar_p,
                rf.paired.only_model,
                rf.paired.only_reference
            );
        }
    }
    for g in &r.gates {
        outln!(
            "gate {}: {:.6} vs {} -> {}",
            g.gate,
            g.value,
            g.threshold,
            if g.passed { "pass" } else { "FAIL" }
        );
    }
    if !r.gates.is_empty() {
        outln!("passed: {}", r.passed);
    }
    Ok(())
}

fn validate_cmd(a: ValidateArgs) -> anyhow::Result<ExitCode> {
    use lowbit::runtime::validate;
    // (--repeats and --gen-tokens are at least 1 from the parser.)
    if a.max_prob_err.is_nan() || a.max_prob_err < 0.0 {
        eprintln!(
            "error: validate: --max-prob-err {}: must be at least 0",
            a.max_prob_err
        );
        return Ok(ExitCode::from(2));
    }
    if let Some(p) = &a.json {
        let mut inputs = vec![a.candidate.as_path(), a.reference.as_path()];
        inputs.extend(a.prompts.as_deref());
        inputs.extend(a.rt.trusted_keys.iter().map(|k| k.as_path()));
        lowbit::util::check_report_path(p, &inputs).context("--json")?;
    }
    let prompts = match &a.prompts {
        Some(p) => validate::read_prompts(p),
        None => validate::parse_prompts(validate::DEFAULT_PROMPTS.as_bytes()).map_err(|detail| {
            validate::ValidateError::Input {
                path: "testdata/validate/prompts.json".into(),
                detail,
            }
        }),
    };
    let prompts = match prompts {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: validate: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let backend = match a.rt.backend() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: validate: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let load = match a.rt.load_options() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: validate: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let opts = validate::ValidateOptions {
        backend,
        load,
        prompts,
        max_prob_err: a.max_prob_err,
        repeats: a.repeats,
        gen_tokens: a.gen_tokens,
    };
    let t0 = std::time::Instant::now();
    let r = match validate::validate(&a.candidate, &a.reference, &opts) {
        Ok(r) => r,
        Err(e) => {
            let untrusted = matches!(
                &e,
                validate::ValidateError::Runtime(lowbit::runtime::RuntimeError::Bundle(
                    lowbit::bundle::BundleError::Signature { .. }
                ))
            );
            eprintln!("error: validate: {e}");
            return Ok(ExitCode::from(if untrusted { 1 } else { 2 }));
        }
    };
    if let Some(p) = &a.json {
        let mut b = serde_json::to_vec_pretty(&r)?;
        b.push(b'\n');
        lowbit::util::replace_file(p, &b).context("--json")?;
    }
    let shown = (|| -> anyhow::Result<()> {
        outln!(
            "{}: {} prompts, {} steps; argmax agreement {:.4}; max |dp| {:.6} (limit {}); finite {}; repeats identical {} ({}x)",
            if r.passed { "PASSED" } else { "FAILED" },
            r.prompts_evaluated,
            r.steps,
            r.argmax_agreement,
            r.max_prob_err,
            r.threshold_max_prob_err,
            r.all_finite,
            r.repeats_identical,
            r.repeats
        );
        outln!(
            "not judged: max |logit diff| {:.4}, KL(ref||cand) mean {:.3e} max {:.3e} nats, top-1 agreement {:.4}; {:.1}s",
            r.max_abs_logit_diff,
            r.kl_mean,
            r.kl_max,
            r.top1_agreement_rate,
            t0.elapsed().as_secs_f64()
        );
        for f in r.failures.iter().take(10) {
            outln!("  {f}");
        }
        if r.failures_total > 10 {
            outln!("  ... {} more failures", r.failures_total - 10);
        }
        Ok(())
    })();
    verdict(r.passed, shown)
}

fn run_cmd(a: RunArgs) -> anyhow::Result<ExitCode> {
    use lowbit::runtime::{self, Sampler, SamplerConfig};
    let backend = a.rt.backend()?;
    if let Some(p) = &a.dump_logits {
        let mut inputs = vec![a.bundle.as_path()];
        inputs.extend(a.rt.trusted_keys.iter().map(|k| k.as_path()));
        lowbit::util::check_report_path(p, &inputs).context("--dump-logits")?;
    }
    let t_load = std::time::Instant::now();
    let mut be = runtime::load(backend, &a.bundle, &a.rt.load_options()?)
        .with_context(|| format!("load {}", a.bundle.display()))?;
    let load_s = t_load.elapsed().as_secs_f64();
    let tok_res = lowbit::tokenizer::Tokenizer::for_model(&a.bundle, be.n_vocab());
    let tok_err = tok_res.as_ref().err().map(|e| e.to_string());
    let mut tok = tok_res.ok();
    if let (Some(t), Ok(spec)) = (tok.as_mut(), lowbit::arch::lookup(&be.info().architecture)) {
        if let Some(tmpl) = spec.chat_template {
            t.set_fallback_chat_template(tmpl);
        }
    }
    let no_tokenizer = || {
        anyhow::anyhow!(
            "{}: the bundle's tokenizer is unusable: {}",
            a.bundle.display(),
            tok_err.as_deref().unwrap_or("?")
        )
    };
    if tok.is_none() {
        if a.ignore_eos || a.prompt.is_some() {
            return Err(no_tokenizer());
        }
        // --prompt-ids without a tokenizer: the ids still run, but nothing can be decoded.
        eprintln!(
            "warning: {}; generated text cannot be decoded (use --print-ids)",
            no_tokenizer()
        );
    }
    let banned = match (&tok, a.ignore_eos) {
        (Some(k), true) => k.eog_ids().collect(),
        _ => Vec::new(),
    };
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: a.sample.temperature,
        top_k: a.sample.top_k,
        top_p: a.sample.top_p,
        seed: a.sample.seed,
        banned,
    })?;
    let ids: Vec<u32> = match (&a.prompt_ids, &a.prompt) {
        (Some(ids), _) => ids.clone(),
        (None, Some(text)) => {
            let tok = tok.as_ref().ok_or_else(no_tokenizer)?;
            let text = if a.chat {
                tok.apply_chat_template(&[("user".to_string(), text.clone())], true)?
            } else {
                text.clone()
            };
            tok.encode(&text, true, a.chat)
        }
        (None, None) => anyhow::bail!("give --prompt TEXT or --prompt-ids IDS"),
    };
    let stop = |t: u32| !a.ignore_eos && tok.as_ref().map(|k| k.is_eog(t)).unwrap_or(false);
    let mut out = std::io::stdout().lock();
    let mut pending: Vec<u8> = Vec::new();
    // The first write error (a closed stdout among them) stops generation and is reported.
    let mut write_err: Option<std::io::Error> = None;
    let mut dump_err: Option<anyhow::Error> = None;
    let (gen, stats) = {
        let mut emit = |t: u32| {
            if let Some(k) = &tok {
                if k.is_eog(t) {
                    return true;
                }
                pending.extend_from_slice(&k.token_to_bytes(t));
                // Print the longest valid UTF-8 prefix; keep an incomplete tail for the next
                // token.
                let valid = match std::str::from_utf8(&pending) {
                    Ok(s) => s.len(),
                    Err(e) if e.error_len().is_none() => e.valid_up_to(),
                    Err(_) => pending.len(),
                };
                if let Err(e) = out.write_all(&pending[..valid]).and_then(|_| out.flush()) {
                    write_err = Some(e);
                    return false;
                }
                pending.drain(..valid);
            }
            true
        };
        // --dump-logits: the logits after the prompt are the ones the first token is picked
        // from; they are written from the same run, before that token is emitted.
        let mut dump = |logits: &[f32]| {
            let Some(p) = &a.dump_logits else { return };
            let mut bytes = Vec::with_capacity(logits.len() * 4);
            for v in logits {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            if let Err(e) = lowbit::util::replace_file(p, &bytes) {
                dump_err = Some(anyhow::Error::new(e).context("--dump-logits"));
            }
        };
        runtime::generate_with_hook(
            be.as_mut(),
            &ids,
            a.max_tokens,
            &mut sampler,
            &stop,
            &mut emit,
            a.dump_logits
                .is_some()
                .then_some(&mut dump as &mut dyn FnMut(&[f32])),
        )?
    };
    if let Some(e) = dump_err {
        return Err(e);
    }
    if let Some(e) = write_err {
        return Err(anyhow::Error::new(e).context("writing the generated text to stdout"));
    }
    out.write_all(&pending)
        .and_then(|_| writeln!(out))
        .context("writing the generated text to stdout")?;
    if a.print_ids {
        eprintln!("prompt ids: {ids:?}");
        eprintln!("generated ids: {gen:?}");
    }
    let info = be.info();
    eprintln!(
        "load {:.2}s; prompt {} tokens {:.2} tok/s; decode {} tokens {} ({} backend, {} kernel, {} threads)",
        load_s,
        stats.prompt_tokens,
        stats.prompt_tps(),
        stats.generated,
        decode_rate(&stats),
        info.backend,
        info.kernel,
        info.threads
    );
    Ok(ExitCode::SUCCESS)
}

fn print_verify(out: &mut impl Write, r: &verify::VerifyReport) -> std::io::Result<()> {
    writeln!(out, "bundle:  {}", r.bundle)?;
    writeln!(
        out,
        "source:  {}",
        r.source.as_deref().unwrap_or("(not given: integrity only)")
    )?;
    writeln!(
        out,
        "format:  version {}{}",
        r.format_version,
        if r.manifest_digest.is_some() {
            " (the digests cover the manifest)"
        } else {
            " (the manifest is not covered by the digest)"
        }
    )?;
    writeln!(out, "digest:  {}", r.bundle_digest)?;
    if let Some(d) = &r.manifest_digest {
        writeln!(out, "manifest digest: {d}")?;
    }
    let sig = &r.signature;
    writeln!(
        out,
        "signature: {}{}",
        sig.status,
        match (&sig.key_id, &sig.trusted_key) {
            (Some(id), Some(file)) => format!(" (key {id}, {file})"),
            (Some(id), None) => format!(" (key {id})"),
            _ => String::new(),
        }
    )?;
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
    let k = &r.kernels;
    if !k.is_empty() {
        let n = |kind: &str, check: &str| {
            k.iter()
                .filter(|c| c.kind == kind && c.check == check && c.passed)
                .count()
        };
        let wgsl = k.iter().filter(|c| c.kind == "wgsl").count();
        let msl = k.len() - wgsl;
        writeln!(
            out,
            "kernels: {wgsl} WGSL ({} parsed and validated by naga {}), {msl} MSL ({} re-derived identical, {} from another naga version not re-derived), {} failed",
            n("wgsl", "parsed and validated"),
            lowbit::bundle::kernels::NAGA_VERSION,
            n("msl", "re-derived"),
            n("msl", "not re-derived"),
            k.iter().filter(|c| !c.passed).count()
        )?;
    }
    for f in &r.notes {
        writeln!(out, "note: {f}")?;
    }
    for f in &r.failures {
        writeln!(out, "failure: {f}")?;
    }
    let tt = &r.totals;
    writeln!(
        out,
        "{} tensors ({} ternary, {} palettized, {} carried): {} passed; {} files; {} ternary elements compared, {} mismatched, max |diff| {} -> {}",
        tt.tensors,
        tt.ternary,
        tt.palettized,
        tt.carried,
        tt.passed,
        r.files_checked,
        tt.elements_compared,
        tt.mismatched,
        tt.max_abs_diff,
        if r.passed { "PASSED" } else { "FAILED" }
    )
}
