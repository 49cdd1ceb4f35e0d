//! Dequantization throughput, in GB/s of f32 output.
//!
//! Run by `make bench` through `benches/dequant_bench.py`, which also times gguf-py on the
//! same data in the same run and prints the comparison. By hand:
//!
//! ```sh
//! cargo bench --bench dequant -- --data DIR [--gguf FILE]... [--threads-list 1,2] \
//!     [--reps 5] [--min-secs 0.2] [--json OUT]
//! ```
//!
//! `--data DIR` holds `<TYPE>.bin` files of raw GGML blocks (whole blocks, as in a GGUF
//! tensor's data). Each one is timed two ways:
//!
//! * whole: one `quant::dequantize` call over the whole buffer on the calling thread, and
//!   `quant::dequantize_par` in a rayon pool of each thread count. With tens of MB of output
//!   this is bound by memory bandwidth on most machines.
//! * chunk: the same data in chunks of 64 KiB of output, each into one reused buffer (per
//!   thread), as `export::dequantize_tensor_bytes` works. The output stays in cache, so this
//!   is the code's own speed: serial on the detected path, on `Path::Scalar` and `Path::Avx2`
//!   (`quant::dequantize_with`), and in each pool.
//!
//! For each `--gguf FILE` it dequantizes every tensor into one reused buffer, serially and in
//! each pool, and reports the total output rate.
//!
//! Timing: one untimed warm-up call, then `reps` timed runs; a run repeats the work until at
//! least `min-secs` have passed and yields seconds per call. The best run is reported (noise
//! from other processes only ever adds time); the median is kept in the JSON too.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use lowbit::ggml::GgmlType;
use lowbit::gguf::GgufFile;
use lowbit::quant::{self, Path};
use rayon::prelude::*;
use serde_json::{json, Value};

/// Output elements per chunk in the in-cache measurements: 64 KiB of f32, the chunk size of
/// `quant::dequantize_par` and `export::dequantize_tensor_bytes`.
const CHUNK_ELEMENTS: usize = 16384;

struct Args {
    data: Option<PathBuf>,
    gguf: Vec<PathBuf>,
    threads: Vec<usize>,
    reps: usize,
    min_secs: f64,
    json: Option<PathBuf>,
}

const USAGE: &str = "usage: dequant [--data DIR] [--gguf FILE]... [--threads-list 1,2] \
                     [--reps 5] [--min-secs 0.2] [--json OUT]";

fn parse_args() -> Result<Args> {
    let mut a = Args {
        data: None,
        gguf: Vec::new(),
        threads: vec![1, 2],
        reps: 5,
        min_secs: 0.2,
        json: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            // cargo bench passes --bench to harness = false targets.
            "--bench" => {}
            "--data" => a.data = Some(val("--data")?.into()),
            "--gguf" => a.gguf.push(val("--gguf")?.into()),
            "--threads-list" => {
                a.threads = val("--threads-list")?
                    .split(',')
                    .map(|s| s.trim().parse::<usize>())
                    .collect::<Result<_, _>>()
                    .context("--threads-list: comma-separated thread counts")?;
                if a.threads.contains(&0) {
                    bail!("--threads-list: thread counts must be at least 1");
                }
            }
            "--reps" => a.reps = val("--reps")?.parse().context("--reps")?,
            "--min-secs" => a.min_secs = val("--min-secs")?.parse().context("--min-secs")?,
            "--json" => a.json = Some(val("--json")?.into()),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    if a.reps == 0 {
        bail!("--reps must be at least 1");
    }
    Ok(a)
}

/// Seconds per call of `f`: best and median over `reps` runs of at least `min_secs` each,
/// after one warm-up call.
fn time_it(reps: usize, min_secs: f64, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let mut per_call = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        let mut n = 0u32;
        loop {
            f();
            n += 1;
            let t = start.elapsed().as_secs_f64();
            if t >= min_secs {
                per_call.push(t / n as f64);
                break;
            }
        }
    }
    per_call.sort_by(f64::total_cmp);
    (per_call[0], per_call[per_call.len() / 2])
}

fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Best and median GB/s as JSON numbers.
fn rate(bytes: usize, (best, median): (f64, f64)) -> (f64, f64) {
    (round3(gbps(bytes, best)), round3(gbps(bytes, median)))
}

fn pools(threads: &[usize]) -> Result<Vec<(usize, rayon::ThreadPool)>> {
    threads
        .iter()
        .map(|&n| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .with_context(|| format!("building a rayon pool of {n} threads"))?;
            Ok((n, pool))
        })
        .collect()
}

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        cpuinfo
            .lines()
            .find(|l| l.split(':').next().map(str::trim) == Some(key))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    json!({
        "cpu": field("model name").unwrap_or_else(|| "unknown".into()),
        "cpu_family": field("cpu family"),
        "cpu_model": field("model"),
        "cores": cores,
        "avx2": quant::detected_path() == Path::Avx2,
    })
}

fn bench_types(
    dir: &std::path::Path,
    args: &Args,
    pools: &[(usize, rayon::ThreadPool)],
) -> Result<Value> {
    let mut names: Vec<(GgmlType, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = entry?.path();
        if p.extension().and_then(|e| e.to_str()) != Some("bin") {
            continue;
        }
        let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        let ty = GgmlType::from_name(stem)
            .with_context(|| format!("{}: not a GGML type name", p.display()))?;
        names.push((ty, p));
    }
    names.sort_by_key(|(ty, _)| ty.id());
    if names.is_empty() {
        bail!("{}: no <TYPE>.bin files", dir.display());
    }

    println!(
        "whole = one dequantize call over the buffer; chunk = 64 KiB output chunks into a \
         reused buffer (in cache, as export.rs works); GB/s, best of {}",
        args.reps
    );
    let pool_cols = |prefix: &str| {
        pools
            .iter()
            .map(|(n, _)| format!(" {:>9}", format!("{prefix}{n}")))
            .collect::<String>()
    };
    println!(
        "{:<7} {:>7} {:>8}{} {:>8} {:>8} {:>8}{}",
        "type",
        "MB out",
        "whole1t",
        pool_cols("whole"),
        "chunk1t",
        "scalar",
        "avx2",
        pool_cols("chunk"),
    );
    let mut out = serde_json::Map::new();
    for (ty, p) in names {
        let src = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
        let (bs, ts) = (ty.block_size(), ty.type_size());
        let n = src.len() / ts * bs;
        let bytes = n * 4;
        let mut dst = vec![0f32; n];
        // Fails here, not inside the timing loop, on a file that is not whole blocks.
        quant::dequantize(ty, &src, &mut dst).with_context(|| p.display().to_string())?;
        let t = |f: &mut dyn FnMut()| rate(bytes, time_it(args.reps, args.min_secs, f));

        // Whole buffer: output goes to memory (tens of MB), as when a tensor is dequantized
        // in one piece.
        let serial = t(&mut || quant::dequantize(ty, &src, &mut dst).unwrap());
        let mut par = BTreeMap::new();
        for (nt, pool) in pools {
            let r = pool.install(|| t(&mut || quant::dequantize_par(ty, &src, &mut dst).unwrap()));
            par.insert(*nt, r);
        }

        // Chunks of 64 KiB of output into one reused buffer per thread: the output stays in
        // cache, so this is the code's own speed (and how export.rs uses it).
        let chunk_blocks = (CHUNK_ELEMENTS / bs).max(1);
        let mut small = vec![0f32; chunk_blocks * bs];
        let mut chunked = |path: Path| {
            t(&mut || {
                for s in src.chunks(chunk_blocks * ts) {
                    let n = s.len() / ts * bs;
                    quant::dequantize_with(path, ty, s, &mut small[..n]).unwrap();
                }
            })
        };
        let c_serial = chunked(quant::detected_path());
        let c_scalar = chunked(Path::Scalar);
        let c_avx2 = (quant::detected_path() == Path::Avx2).then(|| chunked(Path::Avx2));
        let mut c_par = BTreeMap::new();
        for (nt, pool) in pools {
            let r = pool.install(|| {
                t(&mut || {
                    src.par_chunks(chunk_blocks * ts).for_each_init(
                        || vec![0f32; chunk_blocks * bs],
                        |buf, s| {
                            let n = s.len() / ts * bs;
                            quant::dequantize(ty, s, &mut buf[..n]).unwrap();
                        },
                    )
                })
            });
            c_par.insert(*nt, r);
        }

        let cols = |m: &BTreeMap<usize, (f64, f64)>| {
            m.values()
                .map(|r| format!(" {:>9.2}", r.0))
                .collect::<String>()
        };
        println!(
            "{:<7} {:>7.1} {:>8.2}{} {:>8.2} {:>8.2} {:>8}{}",
            ty.name(),
            bytes as f64 / 1e6,
            serial.0,
            cols(&par),
            c_serial.0,
            c_scalar.0,
            c_avx2.map_or("n/a".to_string(), |r| format!("{:.2}", r.0)),
            cols(&c_par),
        );
        let best = |m: &BTreeMap<usize, (f64, f64)>| {
            m.iter()
                .map(|(k, r)| (k.to_string(), json!(r.0)))
                .collect::<serde_json::Map<_, _>>()
        };
        let median = |m: &BTreeMap<usize, (f64, f64)>| {
            m.iter()
                .map(|(k, r)| (k.to_string(), json!(r.1)))
                .collect::<serde_json::Map<_, _>>()
        };
        out.insert(
            ty.name().to_string(),
            json!({
                "in_bytes": src.len(),
                "out_bytes": bytes,
                "serial_gbps": serial.0,
                "serial_gbps_median": serial.1,
                "gbps": best(&par),
                "gbps_median": median(&par),
                "chunk_out_bytes": chunk_blocks * bs * 4,
                "chunked_serial_gbps": c_serial.0,
                "chunked_serial_gbps_median": c_serial.1,
                "scalar_gbps": c_scalar.0,
                "avx2_gbps": c_avx2.map(|r| r.0),
                "chunked_gbps": best(&c_par),
                "chunked_gbps_median": median(&c_par),
            }),
        );
    }
    Ok(Value::Object(out))
}

fn bench_file(
    path: &std::path::Path,
    args: &Args,
    pools: &[(usize, rayon::ThreadPool)],
) -> Result<Value> {
    let file = GgufFile::open(path).with_context(|| path.display().to_string())?;
    let tensors: Vec<_> = file
        .tensors
        .iter()
        .filter(|t| t.ty.can_dequantize())
        .collect();
    let skipped = file.tensors.len() - tensors.len();
    let n_max = tensors.iter().map(|t| t.n_elements()).max().unwrap_or(0) as usize;
    let total: usize = tensors.iter().map(|t| t.n_elements() as usize).sum();
    let bytes = total * 4;
    let in_bytes: usize = tensors.iter().map(|t| t.n_bytes as usize).sum();
    let mut buf = vec![0f32; n_max];

    let serial = rate(
        bytes,
        time_it(args.reps, args.min_secs, || {
            for t in &tensors {
                let n = t.n_elements() as usize;
                quant::dequantize(t.ty, file.tensor_data(t), &mut buf[..n]).unwrap();
            }
        }),
    );
    let mut par = BTreeMap::new();
    for (nt, pool) in pools {
        let r = pool.install(|| {
            rate(
                bytes,
                time_it(args.reps, args.min_secs, || {
                    for t in &tensors {
                        let n = t.n_elements() as usize;
                        quant::dequantize_par(t.ty, file.tensor_data(t), &mut buf[..n]).unwrap();
                    }
                }),
            )
        });
        par.insert(*nt, r);
    }
    let mut types: BTreeMap<&str, usize> = BTreeMap::new();
    for t in &tensors {
        *types.entry(t.ty.name()).or_default() += 1;
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    println!(
        "{name}: {} tensors, {:.1} MB out; 1t {:.2} GB/s{}",
        tensors.len(),
        bytes as f64 / 1e6,
        serial.0,
        par.iter()
            .map(|(k, r)| format!("; pool{k} {:.2}", r.0))
            .collect::<String>()
    );
    Ok(json!({
        "path": path.display().to_string(),
        "tensors": tensors.len(),
        "skipped_tensors": skipped,
        "tensor_types": types,
        "in_bytes": in_bytes,
        "out_bytes": bytes,
        "serial_gbps": serial.0,
        "serial_gbps_median": serial.1,
        "gbps": par.iter().map(|(k, r)| (k.to_string(), json!(r.0))).collect::<serde_json::Map<_, _>>(),
        "gbps_median": par.iter().map(|(k, r)| (k.to_string(), json!(r.1))).collect::<serde_json::Map<_, _>>(),
    }))
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let pools = pools(&args.threads)?;
    let machine = machine();
    println!(
        "lowbit dequant bench: {} ({} cores), path {:?}, best of {} runs of >= {} s",
        machine["cpu"].as_str().unwrap_or("?"),
        machine["cores"],
        quant::detected_path(),
        args.reps,
        args.min_secs
    );
    let types = match &args.data {
        Some(dir) => bench_types(dir, &args, &pools)?,
        None => json!({}),
    };
    let mut files = serde_json::Map::new();
    for p in &args.gguf {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| p.display().to_string());
        files.insert(name, bench_file(p, &args, &pools)?);
    }
    let report = json!({
        "machine": machine,
        "timing": {
            "method": "warm-up, then best of reps runs; each run repeats until min_secs",
            "reps": args.reps,
            "min_secs": args.min_secs,
            "threads": args.threads,
            "unit": "GB/s of f32 output (1e9 bytes)",
        },
        "types": types,
        "files": files,
    });
    if let Some(out) = &args.json {
        std::fs::write(out, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}
