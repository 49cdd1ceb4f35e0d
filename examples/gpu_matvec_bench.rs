//! Times the GPU ternary matvec at given shapes and configurations, with timestamp queries
//! where the adapter has them (else host time over many dispatches), and checks each
//! configuration's result against the CPU f32 kernel first.
//!
//! ```text
//! cargo build --release --example gpu_matvec_bench
//! target/release/examples/gpu_matvec_bench [--shapes 4096x4096,256x4096,16384x4096,4096x16384]
//!     [--configs r4_wg64_sg,r16_wg128_sgrows4_p2,...] [--min-bytes 1073741824]
//!     [--reps 4] [--adapter INDEX|NAME] [--json FILE] [--unchecked] [--probe x0|w0|alu|s1]
//! target/release/examples/gpu_matvec_bench --configs r16_wg128_sgrows4_p2 --print-source
//! ```
//!
//! `--configs` takes [`MatvecConfig::name`]s without the `ternary_matvec_` prefix (`q8g_r16_wg128_sgrows4_p1`: x quantized once
//! by its own dispatch, which the chain figure includes and `product chain` leaves out; `r4_wg64_sg`
//! split kernel with subgroups, `r4_wg64_wg` with workgroup memory, `r16_wg128_sgrows4_p2`
//! subgroup rows, `r8_wg128_sgrows2_p2_xs4096` with x staged in workgroup memory); the
//! default sweeps the former and current decode defaults and their neighbours. Configurations
//! the adapter refuses (no SUBGROUP) are skipped.
//!
//! Each shape is uploaded as many times as it takes to pass `--min-bytes` (1 GiB: many times
//! the largest L2 cache), and the dispatches cycle through the copies, so every matvec reads
//! its weight from device memory, as a decode step does. Three figures per configuration:
//! `kernel` (median of per-pass timestamps, one dispatch per pass: the pass's own overhead
//! included), `chain` (the same dispatches back to back in one pass, all writing one y, so
//! wgpu puts a barrier between each two, as between dependent matvecs of a decode step; the
//! pass's span divided by their number) and `overlap` (the same, each copy writing its own y:
//! no barriers, dispatches may overlap; the throughput of the kernel itself, launch gaps
//! hidden). GB/s counts the codes, scales, x and y bytes of one matvec.
//!
//! `--probe` times a `q8g` product with part of its memory traffic taken away (its results
//! are wrong, and the error column says so): `x0` makes every unit read unit 0's activations
//! (x stays in the nearest cache), `w0` makes every row read row 0's codes (the weight stays
//! in L2), `alu` replaces each unit's 16 dot products by one (all loads kept), `s1` replaces
//! the block scales' loads and f16 decodes by 1.0. Against the plain figure, they say how
//! much of the time x's loads, the weight's stream, the arithmetic and the scales take.
use std::time::Instant;

use lowbit::runtime::gpu::{
    tolerance, BoundMatvec, ContextOptions, GpuContext, GpuTernary, MatvecConfig, Reduction,
};
use lowbit::runtime::matvec::{matvec, WeightData};

/// Timestamp queries per query set that wgpu accepts (`QUERY_SET_MAX_QUERIES`).
const MAX_QUERIES: usize = 4096;

struct Args {
    shapes: Vec<(usize, usize)>,
    configs: Vec<MatvecConfig>,
    min_bytes: u64,
    reps: usize,
    adapter: Option<String>,
    json: Option<String>,
    unchecked: bool,
    probe: Option<String>,
}

fn die(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(2)
}

/// The default sweep: the split kernel's former decode default (`r4_wg64`, both reductions),
/// the subgroup-rows kernel reading x from storage (2 and 4 rows per pass), and with x staged
/// in workgroup memory: the decode default `r8_wg128_sgrows2_p2_xs4096` and its neighbours
/// (1, 2, 4 rows per pass, 1 or 2 units in flight, 128 or 256 invocations), as registered.
fn default_configs() -> Vec<MatvecConfig> {
    let mut v = vec![
        MatvecConfig::split(4, 64, Reduction::Subgroup),
        MatvecConfig::split(4, 64, Reduction::Workgroup),
        MatvecConfig::subgroup_rows(8, 128, 2, 2),
        MatvecConfig::subgroup_rows(16, 128, 4, 2),
    ];
    for rs in [1, 2, 4] {
        for p in [1, 2] {
            for wg in [128, 256] {
                v.push(MatvecConfig::subgroup_rows_tiled(
                    rs * wg / 32,
                    wg,
                    rs,
                    p,
                    4096,
                ));
            }
        }
    }
    v
}

fn parse() -> Args {
    let mut a = Args {
        shapes: vec![(4096, 4096), (256, 4096), (16384, 4096), (4096, 16384)],
        configs: default_configs(),
        min_bytes: 1 << 30,
        reps: 4,
        adapter: None,
        json: None,
        unchecked: false,
        probe: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        if k == "--unchecked" {
            a.unchecked = true;
            continue;
        }
        if k == "--print-source" {
            // The WGSL of each configuration named so far, then exit.
            for c in &a.configs {
                println!("{}", c.source());
            }
            std::process::exit(0);
        }
        let v = it
            .next()
            .unwrap_or_else(|| die(&format!("{k} needs a value")));
        match k.as_str() {
            "--shapes" => {
                a.shapes = v
                    .split(',')
                    .map(|s| {
                        let (r, c) = s.split_once('x').unwrap_or_else(|| die("shape RxC"));
                        (
                            r.parse().unwrap_or_else(|_| die("shape rows")),
                            c.parse().unwrap_or_else(|_| die("shape cols")),
                        )
                    })
                    .collect()
            }
            "--configs" => {
                a.configs = v
                    .split(',')
                    .map(|s| {
                        MatvecConfig::parse(s.trim())
                            .unwrap_or_else(|| die(&format!("bad config {s:?}")))
                    })
                    .collect()
            }
            "--min-bytes" => a.min_bytes = v.parse().unwrap_or_else(|_| die("--min-bytes")),
            "--reps" => a.reps = v.parse().unwrap_or_else(|_| die("--reps")),
            "--adapter" => a.adapter = Some(v),
            "--json" => a.json = Some(v),
            "--probe" if ["x0", "w0", "alu", "s1"].contains(&v.as_str()) => a.probe = Some(v),
            _ => die(&format!("unknown option {k}")),
        }
    }
    a
}

fn lcg(seed: &mut u64) -> u32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*seed >> 33) as u32
}

/// Timestamps of `passes` one-dispatch passes (ns each), or `None` without TIMESTAMP_QUERY.
fn time_passes(ctx: &GpuContext, bound: &[BoundMatvec], passes: usize) -> Option<Vec<f64>> {
    if !ctx.has_timestamps() {
        return None;
    }
    let passes = passes.min(MAX_QUERIES / 2);
    let qs = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
        label: Some("matvec timestamps"),
        ty: wgpu::QueryType::Timestamp,
        count: (2 * passes) as u32,
    });
    let resolve = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("timestamps"),
        size: (16 * passes) as u64,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let mut enc = ctx
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
    for i in 0..passes {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                query_set: &qs,
                beginning_of_pass_write_index: Some(2 * i as u32),
                end_of_pass_write_index: Some(2 * i as u32 + 1),
            }),
        });
        bound[i % bound.len()].encode(&mut pass);
    }
    enc.resolve_query_set(&qs, 0..(2 * passes) as u32, &resolve, 0);
    ctx.queue.submit([enc.finish()]);
    let bytes = ctx.read_buffer(&resolve, (16 * passes) as u64).ok()?;
    let t: &[u64] = bytemuck::cast_slice(&bytes);
    let period = ctx.queue.get_timestamp_period() as f64;
    Some(
        t.chunks_exact(2)
            .map(|p| p[1].saturating_sub(p[0]) as f64 * period)
            .collect(),
    )
}

/// ns per matvec of `n` dispatches back to back in one pass: from the pass's timestamps
/// where present, else host time around the submission.
fn time_stream(ctx: &GpuContext, bound: &[BoundMatvec], n: usize) -> (f64, &'static str) {
    time_stream_with(ctx, bound, n, false)
}

/// [`time_stream`]; `product_only`: without the quantize dispatch of a `q8g` configuration
/// (x quantized by the first matvec's and left in place).
fn time_stream_with(
    ctx: &GpuContext,
    bound: &[BoundMatvec],
    n: usize,
    product_only: bool,
) -> (f64, &'static str) {
    let t = ctx
        .time_pass(&mut |pass| {
            for i in 0..n {
                if product_only && i > 0 {
                    bound[i % bound.len()].encode_product(pass);
                } else {
                    bound[i % bound.len()].encode(pass);
                }
            }
        })
        .unwrap_or_else(|e| die(&e.to_string()));
    let how = if t.timestamps { "timestamps" } else { "host" };
    (t.ns / n as f64, how)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args = parse();
    // With --probe: the built-in kernels, each q8g product's source rewritten.
    let sources = args.probe.as_deref().map(|probe| {
        let mut m: std::collections::HashMap<String, String> =
            lowbit::runtime::gpu::kernels::all()
                .into_iter()
                .map(|k| (k.name, k.wgsl))
                .collect();
        for c in args.configs.iter().filter(|c| c.pre_kernel().is_some()) {
            let src = c.source();
            let probed = match probe {
                "x0" => src
                    .replace("let xi = 4u * u", "let xi = 0u * u")
                    .replace("x[groups + u", "x[groups + 0u * u"),
                "w0" => src.replace("codes[row", "codes[0u * row"),
                "alu" => src.replace(
                    "f32(unit_dot(",
                    "f32(unit_dot_probe(",
                ) + "\nfn unit_dot_probe(w: vec4<u32>, xa: vec4<u32>, xb: vec4<u32>, xc: vec4<u32>, xd: vec4<u32>) -> i32 {\n    return dot4I8Packed(w.x ^ w.y ^ w.z ^ w.w, xa.x ^ xb.y ^ xc.z ^ xd.w);\n}\n",
                _ => src.replace("= scale_at(row", "= 1.0 + 0.0 * f32(row"),
            };
            assert_ne!(probed, src, "{}: nothing to probe", c.name());
            m.insert(c.name(), probed);
        }
        m
    });
    let ctx = GpuContext::new(&ContextOptions {
        sources,
        adapter: args
            .adapter
            .as_deref()
            .map(|s| s.parse().unwrap_or_else(|e| die(&format!("{e}")))),
        unchecked_shaders: args.unchecked,
        ..Default::default()
    })
    .unwrap_or_else(|e| die(&e.to_string()));
    println!(
        "bounds checks: {}",
        if args.unchecked { "off" } else { "on" }
    );
    println!(
        "adapter: {} ({:?}, {:?}, driver {} {}), subgroups {}..{}, SUBGROUP {}, TIMESTAMP_QUERY {}",
        ctx.info.name,
        ctx.info.backend,
        ctx.info.device_type,
        ctx.info.driver,
        ctx.info.driver_info,
        ctx.info.subgroup_min_size,
        ctx.info.subgroup_max_size,
        ctx.has_subgroups(),
        ctx.has_timestamps()
    );
    let mut results = Vec::new();
    let mut seed = 1u64;
    for &(rows, cols) in &args.shapes {
        let words: Vec<u32> = (0..rows * cols / 16)
            .map(|_| {
                let mut w = 0u32;
                for j in 0..16 {
                    w |= (lcg(&mut seed) % 3) << (2 * j);
                }
                w
            })
            .collect();
        let scales: Vec<u16> = (0..rows * cols / 256)
            .map(|_| half::f16::from_f32((lcg(&mut seed) % 1000) as f32 / 1e4 - 0.05).to_bits())
            .collect();
        let x: Vec<f32> = (0..cols)
            .map(|_| (lcg(&mut seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        let mut want = vec![0f32; rows];
        matvec(
            WeightData::Ternary {
                words: &words,
                scales: &scales,
            },
            cols,
            &x,
            &mut want,
        );
        let abs: Vec<f64> = scales
            .chunks_exact(cols / 256)
            .map(|rs| {
                rs.iter()
                    .zip(x.chunks_exact(256))
                    .map(|(&s, xb)| {
                        half::f16::from_bits(s).to_f64().abs()
                            * xb.iter().map(|v| v.abs() as f64).sum::<f64>()
                    })
                    .sum()
            })
            .collect();
        // The int8 kernels' reference: x quantized as the CPU's int8 kernel does, each row's
        // exact value in f64 and its sum of |terms| (the error is reported relative to it).
        let qa = lowbit::runtime::q8::quantize(&x, 256);
        let (want8, abs8): (Vec<f64>, Vec<f64>) = (0..rows)
            .map(|r| {
                let (mut v, mut a) = (0f64, 0f64);
                for (b, da) in qa.d.iter().enumerate() {
                    let d =
                        half::f16::from_bits(scales[r * (cols / 256) + b]).to_f64() * *da as f64;
                    let mut isum = 0i64;
                    for k in b * 256..(b + 1) * 256 {
                        let c = (words[(r * cols + k) / 16] >> (2 * (k % 16))) & 3;
                        isum += (c as i64 - 1) * qa.q[k] as i64;
                    }
                    v += d * isum as f64;
                    a += (d * isum as f64).abs();
                }
                (v, a)
            })
            .unzip();
        let wbytes = (rows * cols / 4 + rows * cols / 128) as u64;
        let copies = args.min_bytes.div_ceil(wbytes).clamp(1, 1024) as usize;
        let t0 = Instant::now();
        let weights: Vec<GpuTernary> = (0..copies)
            .map(|i| {
                ctx.upload_ternary(
                    &format!("w{i}"),
                    rows,
                    cols,
                    bytemuck::cast_slice(&words),
                    bytemuck::cast_slice(&scales),
                )
                .unwrap_or_else(|e| die(&e.to_string()))
            })
            .collect();
        let xb = ctx
            .upload_bytes("x", bytemuck::cast_slice(&x))
            .unwrap_or_else(|e| die(&e.to_string()));
        let yb = ctx.vector_buffer("y", rows);
        println!(
            "[{rows}, {cols}]: {copies} copies of {wbytes} bytes uploaded in {:.2}s",
            t0.elapsed().as_secs_f64()
        );
        // One y per copy for the overlap figure.
        let ys: Vec<wgpu::Buffer> = (0..copies)
            .map(|i| ctx.vector_buffer(&format!("y{i}"), rows))
            .collect();
        let moved = wbytes + (cols * 4 + rows * 4) as u64;
        for cfg in &args.configs {
            if cfg.reduction == Reduction::Subgroup && !ctx.has_subgroups() {
                println!("  {}: no SUBGROUP feature, skipped", cfg.name());
                continue;
            }
            // Correct first: the first copy against the CPU.
            let y = match ctx.matvec(&weights[0], &x, cfg) {
                Ok(y) => y,
                Err(e) => {
                    println!("  {}: {e}", cfg.name());
                    continue;
                }
            };
            // f32 kernels: the largest fraction of the tolerance against the CPU f32 kernel;
            // int8 kernels: the largest |diff| / sum|terms| against the int8 reference.
            let worst = if cfg.is_int8() {
                y.iter()
                    .zip(&want8)
                    .zip(&abs8)
                    .map(|((g, c), a)| (*g as f64 - c).abs() / a.max(1e-30))
                    .fold(0.0f64, f64::max)
            } else {
                y.iter()
                    .zip(&want)
                    .zip(&abs)
                    .map(|((g, c), a)| (*g as f64 - *c as f64).abs() / tolerance(cols, *a))
                    .fold(0.0f64, f64::max)
            };
            let bound: Vec<BoundMatvec> = weights
                .iter()
                .map(|w| ctx.bind_matvec(w, &xb, &yb, cfg).unwrap())
                .collect();
            let bound_own: Vec<BoundMatvec> = weights
                .iter()
                .zip(&ys)
                .map(|(w, y)| ctx.bind_matvec(w, &xb, y, cfg).unwrap())
                .collect();
            let passes = (copies * args.reps).max(64);
            // Warm-up: every copy once.
            let _ = time_stream(&ctx, &bound, copies);
            let kernel = time_passes(&ctx, &bound, passes).map(|mut v| median(&mut v));
            let (chain, how) = time_stream(&ctx, &bound, passes);
            let (overlap, _) = time_stream(&ctx, &bound_own, passes);
            // q8g: the product alone in a chain (x quantized once), and the quantize kernel's
            // share of the chain figure.
            let product = cfg
                .pre_kernel()
                .map(|_| time_stream_with(&ctx, &bound, passes, true).0);
            let gbs = |ns: f64| moved as f64 / ns;
            println!(
                "  {:<36} kernel {:>7} ns {:>6} GB/s | chain {:>7.0} ns {:>6.1} GB/s | overlap {:>7.0} ns {:>6.1} GB/s {:>4.1}% ({how}){} | err {:.1e} ({})",
                cfg.name(),
                kernel.map(|k| format!("{k:.0}")).unwrap_or("-".into()),
                kernel.map(|k| format!("{:.1}", gbs(k))).unwrap_or("-".into()),
                chain,
                gbs(chain),
                overlap,
                gbs(overlap),
                100.0 * gbs(overlap) / 4800.0,
                product
                    .map(|p| format!(" | product chain {p:.0} ns {:.1} GB/s", gbs(p)))
                    .unwrap_or_default(),
                worst,
                if cfg.is_int8() { "rel. to int8 ref" } else { "of f32 tol" }
            );
            results.push(serde_json::json!({
                "rows": rows, "cols": cols, "config": cfg.name(),
                "bytes": moved, "copies": copies,
                "kernel_ns": kernel, "kernel_gbs": kernel.map(gbs),
                "chain_ns": chain, "chain_gbs": gbs(chain),
                "overlap_ns": overlap, "overlap_gbs": gbs(overlap), "stream_timing": how,
                "product_chain_ns": product,
                "max_err_over_tol": worst,
            }));
        }
    }
    if let Some(p) = args.json {
        let doc = serde_json::json!({
            "adapter": ctx.info.name, "backend": format!("{:?}", ctx.info.backend),
            "driver": ctx.info.driver, "driver_info": ctx.info.driver_info,
            "subgroup": ctx.has_subgroups(), "timestamp_query": ctx.has_timestamps(),
            "bounds_checks": !args.unchecked,
            "results": results,
        });
        std::fs::write(&p, serde_json::to_string_pretty(&doc).unwrap() + "\n")
            .unwrap_or_else(|e| die(&format!("{p}: {e}")));
    }
}
