//! The GPU ternary matvec against the CPU f32 reference (`runtime::matvec::matvec`, the exact
//! f32 kernel), on whatever adapter wgpu finds (lavapipe in CI). Without an adapter the tests
//! skip and say so, unless `LOWBIT_REQUIRE_GPU=1` (set by `make test`), where they fail.
//!
//! Tolerance (src/runtime/gpu/mod.rs): `|y_gpu - y_cpu| <= 4 * K * 2^-24 * sum_k |d x_k|` per
//! row; the tests print the largest fraction of it seen.

mod common;

use lowbit::runtime::gpu::{
    self, context_for_tests, ContextOptions, GpuContext, GpuError, GpuTernary, MatvecConfig,
    MatvecKernel, Reduction,
};
use lowbit::runtime::matvec::{matvec, WeightData};

fn lcg(seed: &mut u64) -> u32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*seed >> 33) as u32
}

/// A random ternary weight `[rows, cols]`: every code 0..2, scales drawn from normal,
/// negative, zero, subnormal, tiny and the largest f16 values.
fn random_weight(rows: usize, cols: usize, seed: &mut u64) -> (Vec<u32>, Vec<u16>) {
    let words = (0..rows * cols / 16)
        .map(|_| {
            let mut w = 0u32;
            for j in 0..16 {
                w |= (lcg(seed) % 3) << (2 * j);
            }
            w
        })
        .collect();
    let special = [
        0.0f32, -0.0, 65504.0, -65504.0, 1.0e-7, -6.1e-5, 0.5, -1.0, 0.0123,
    ];
    let scales = (0..rows * cols / 256)
        .map(|_| {
            let r = lcg(seed);
            let v = if r.is_multiple_of(4) {
                special[(r / 4) as usize % special.len()]
            } else {
                ((r % 20001) as f32 / 10000.0 - 1.0) * 0.05
            };
            half::f16::from_f32(v).to_bits()
        })
        .collect();
    (words, scales)
}

/// Uploads a weight of [`random_weight`]'s form as `w`.
fn upload(ctx: &GpuContext, rows: usize, cols: usize, words: &[u32], scales: &[u16]) -> GpuTernary {
    ctx.upload_ternary(
        "w",
        rows,
        cols,
        bytemuck::cast_slice(words),
        bytemuck::cast_slice(scales),
    )
    .unwrap()
}

fn random_x(cols: usize, seed: &mut u64) -> Vec<f32> {
    (0..cols)
        .map(|i| match i % 61 {
            0 => 0.0,
            1 => -0.0,
            _ => (lcg(seed) % 2001) as f32 / 1000.0 - 1.0,
        })
        .collect()
}

/// `sum_k |d_b(k) x_k|` per row, in f64.
fn abs_dx(scales: &[u16], cols: usize, x: &[f32]) -> Vec<f64> {
    scales
        .chunks_exact(cols / 256)
        .map(|rs| {
            rs.iter()
                .zip(x.chunks_exact(256))
                .map(|(&s, xb)| {
                    let d = half::f16::from_bits(s).to_f64().abs();
                    xb.iter().map(|v| d * v.abs() as f64).sum::<f64>()
                })
                .sum()
        })
        .collect()
}

fn cpu(words: &[u32], scales: &[u16], cols: usize, x: &[f32]) -> Vec<f32> {
    let mut y = vec![0f32; scales.len() / (cols / 256)];
    matvec(WeightData::Ternary { words, scales }, cols, x, &mut y);
    y
}

/// Checks `gpu` against `cpu` row by row; returns the largest |diff| / tolerance.
fn check(what: &str, gpu: &[f32], cpu: &[f32], tol_sums: &[f64], cols: usize) -> f64 {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths");
    let mut worst = (0.0f64, 0usize);
    for (r, ((g, c), a)) in gpu.iter().zip(cpu).zip(tol_sums).enumerate() {
        assert!(g.is_finite(), "{what}: row {r} is {g}");
        let tol = gpu::tolerance(cols, *a);
        let ratio = (*g as f64 - *c as f64).abs() / tol;
        if ratio > worst.0 {
            worst = (ratio, r);
        }
        assert!(
            ratio <= 1.0,
            "{what}: row {r}: gpu {g} cpu {c}, |diff| {} > tolerance {tol} (sum|dx| {a})",
            (*g as f64 - *c as f64).abs()
        );
    }
    eprintln!(
        "{what}: worst row {} at {:.2e} of the tolerance",
        worst.1, worst.0
    );
    worst.0
}

fn configs(ctx: &GpuContext) -> Vec<MatvecConfig> {
    let mut v = Vec::new();
    for reduction in [Reduction::Subgroup, Reduction::Workgroup] {
        if reduction == Reduction::Subgroup && !ctx.has_subgroups() {
            eprintln!(
                "note: {} has no SUBGROUP feature; the subgroup path is not run",
                ctx.info.name
            );
            continue;
        }
        for (rows_per_workgroup, workgroup_size) in [(1, 32), (4, 64), (7, 128), (8, 256)] {
            v.push(MatvecConfig::split(
                rows_per_workgroup,
                workgroup_size,
                reduction,
            ));
        }
    }
    if ctx.has_subgroups() {
        // The subgroup-rows kernel: the decode default, one row per subgroup, rows per
        // workgroup that leave subgroups idle or make them loop (whatever the subgroup size),
        // every rows-per-pass and units-in-flight value, a workgroup of 32 (one partial
        // subgroup where subgroups are wider).
        v.push(gpu::decode_matvec_config(Reduction::Subgroup));
        for (rows, wg, rs, p) in [
            (1, 64, 1, 1),
            (5, 64, 1, 2),
            (6, 128, 2, 4),
            (24, 256, 8, 1),
            (12, 32, 3, 2),
            (56, 64, 7, 4),
        ] {
            v.push(MatvecConfig::subgroup_rows(rows, wg, rs, p));
        }
        // x staged in workgroup memory: one tile, several tiles (tiles of 4 units: a chunk
        // wider than the tile), a last tile shorter than the others.
        for (rows, wg, rs, p, xt) in [
            (16, 128, 4, 2, 4096),
            (6, 64, 2, 4, 256),
            (12, 32, 3, 1, 512),
            (24, 256, 8, 2, 1024),
        ] {
            v.push(MatvecConfig::subgroup_rows_tiled(rows, wg, rs, p, xt));
        }
    }
    v
}

#[test]
fn ternary_matvec_matches_cpu_f32_on_both_reductions() {
    let Some(ctx) = context_for_tests(&ContextOptions::default()) else {
        return;
    };
    eprintln!(
        "adapter: {} ({:?}, {}, subgroups {}..{})",
        ctx.info.name,
        ctx.info.backend,
        ctx.info.driver_info,
        ctx.info.subgroup_min_size,
        ctx.info.subgroup_max_size
    );
    if std::env::var("LOWBIT_REQUIRE_GPU").as_deref() == Ok("1") {
        // CI's lavapipe has subgroups: the subgroup path must run there.
        assert!(
            ctx.has_subgroups(),
            "{}: no SUBGROUP feature",
            ctx.info.name
        );
    }
    let mut seed = 0x9e3779b97f4a7c15u64;
    // (rows, cols): fast path (K % 512 == 0, N % 32 == 0), then odd shapes.
    for (rows, cols) in [
        (64, 512),
        (96, 2048),
        (37, 768),
        (1, 256),
        (5, 256),
        (33, 1280),
    ] {
        let (words, scales) = random_weight(rows, cols, &mut seed);
        let x = random_x(cols, &mut seed);
        let want = cpu(&words, &scales, cols, &x);
        let sums = abs_dx(&scales, cols, &x);
        let w = upload(&ctx, rows, cols, &words, &scales);
        for cfg in configs(&ctx) {
            let y = ctx.matvec(&w, &x, &cfg).unwrap();
            check(
                &format!("[{rows}, {cols}] {}", cfg.name()),
                &y,
                &want,
                &sums,
                cols,
            );
        }
    }
}

#[test]
fn row_chunks_and_2d_grids_give_the_same_rows() {
    // A binding cap of 40 rows' codes forces chunks; 1 row per workgroup and more than
    // 65,535 rows force a 2-D grid.
    let (rows, cols) = (70_001usize, 256usize);
    let probe = context_for_tests(&ContextOptions::default());
    let Some(probe) = probe else { return };
    let step = (probe.limits.min_storage_buffer_offset_alignment as u64 / 4).max(2);
    drop(probe);
    let cap = (cols as u64 / 4) * (40 + step);
    let Some(ctx) = context_for_tests(&ContextOptions {
        max_binding_bytes: Some(cap),
        ..Default::default()
    }) else {
        return;
    };
    let Some(whole) = context_for_tests(&ContextOptions::default()) else {
        return;
    };
    let mut seed = 5u64;
    let (words, scales) = random_weight(300, cols, &mut seed);
    let x = random_x(cols, &mut seed);
    let want = cpu(&words, &scales, cols, &x);
    let sums = abs_dx(&scales, cols, &x);
    let wb: &[u8] = bytemuck::cast_slice(&words);
    let sb: &[u8] = bytemuck::cast_slice(&scales);
    let chunked = ctx.upload_ternary("w", 300, cols, wb, sb).unwrap();
    assert!(chunked.chunks.len() > 1, "{} chunks", chunked.chunks.len());
    let one = whole.upload_ternary("w", 300, cols, wb, sb).unwrap();
    assert_eq!(one.chunks.len(), 1);
    let cfg = ctx.default_matvec_config();
    let a = ctx.matvec(&chunked, &x, &cfg).unwrap();
    let b = whole.matvec(&one, &x, &cfg).unwrap();
    check("chunked", &a, &want, &sums, cols);
    // The same kernel on the same rows: the same bits, however the rows are chunked.
    assert_eq!(
        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );

    let (words, scales) = random_weight(rows, cols, &mut seed);
    let want = cpu(&words, &scales, cols, &x);
    let sums = abs_dx(&scales, cols, &x);
    let w = whole
        .upload_ternary(
            "tall",
            rows,
            cols,
            bytemuck::cast_slice(&words),
            bytemuck::cast_slice(&scales),
        )
        .unwrap();
    assert_eq!(gpu::grid(rows as u64), Some((65_535, 2)));
    let mut one_row = vec![MatvecConfig::split(1, 64, whole.weight_reduction())];
    if whole.has_subgroups() {
        one_row.push(MatvecConfig::subgroup_rows(1, 64, 1, 2));
    }
    for cfg in one_row {
        let y = whole.matvec(&w, &x, &cfg).unwrap();
        check(&format!("2-D grid {}", cfg.name()), &y, &want, &sums, cols);
    }
}

#[test]
fn chunked_bindings_match_for_every_decode_kernel() {
    // Row chunks (a binding cap of about 24 rows' codes) with K = 256 * odd, each decode
    // kernel: the same bits as one binding, within the tolerance of the CPU.
    let (rows, cols) = (101usize, 1280usize);
    let Some(whole) = context_for_tests(&ContextOptions::default()) else {
        return;
    };
    let step = (whole.limits.min_storage_buffer_offset_alignment as u64 / 4).max(2);
    let Some(ctx) = context_for_tests(&ContextOptions {
        max_binding_bytes: Some((cols as u64 / 4) * (24 + step)),
        ..Default::default()
    }) else {
        return;
    };
    let mut seed = 77u64;
    let (words, scales) = random_weight(rows, cols, &mut seed);
    let x = random_x(cols, &mut seed);
    let want = cpu(&words, &scales, cols, &x);
    let sums = abs_dx(&scales, cols, &x);
    let wb: &[u8] = bytemuck::cast_slice(&words);
    let sb: &[u8] = bytemuck::cast_slice(&scales);
    let chunked = ctx.upload_ternary("w", rows, cols, wb, sb).unwrap();
    assert!(chunked.chunks.len() > 2, "{} chunks", chunked.chunks.len());
    let one = whole.upload_ternary("w", rows, cols, wb, sb).unwrap();
    for cfg in configs(&whole) {
        let a = ctx.matvec(&chunked, &x, &cfg).unwrap();
        let b = whole.matvec(&one, &x, &cfg).unwrap();
        check(&format!("chunked {}", cfg.name()), &a, &want, &sums, cols);
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{}",
            cfg.name()
        );
    }
}

#[test]
fn decode_default_is_the_subgroup_rows_kernel_where_subgroups_exist() {
    let Some(ctx) = context_for_tests(&ContextOptions::default()) else {
        return;
    };
    let Some(wg) = context_for_tests(&ContextOptions {
        force_workgroup_reduction: true,
        ..Default::default()
    }) else {
        return;
    };
    let split_wg = MatvecConfig::split(4, 64, Reduction::Workgroup);
    assert_eq!(wg.default_matvec_config(), split_wg);
    let fast = gpu::decode_matvec_config(Reduction::Subgroup);
    assert!(matches!(fast.kernel, MatvecKernel::SubgroupRows { .. }));
    assert!(
        gpu::kernels::all().iter().any(|k| k.name == fast.name()),
        "{} is not in the registry",
        fast.name()
    );
    if !ctx.has_subgroups() {
        assert_eq!(ctx.default_matvec_config(), split_wg);
        return;
    }
    assert_eq!(ctx.default_matvec_config(), fast);
    // Sources without it (a bundle that ships older kernels): the split kernel.
    let Some(old) = context_for_tests(&ContextOptions {
        sources: Some(
            gpu::kernels::all()
                .into_iter()
                .filter(|k| k.name != fast.name())
                .map(|k| (k.name, k.wgsl))
                .collect(),
        ),
        ..Default::default()
    }) else {
        return;
    };
    assert_eq!(
        old.default_matvec_config(),
        MatvecConfig::split(4, 64, Reduction::Subgroup)
    );
    // Both decode paths of the weight product (subgroup rows, split with workgroup memory)
    // against the CPU, through bind_matmul with one token, odd rows and K = 256 * odd.
    let (rows, cols) = (45usize, 768usize);
    let mut seed = 3u64;
    let (words, scales) = random_weight(rows, cols, &mut seed);
    let x = random_x(cols, &mut seed);
    let want = cpu(&words, &scales, cols, &x);
    let sums = abs_dx(&scales, cols, &x);
    for (what, c) in [("sg", &ctx), ("wg", &wg)] {
        let w = c
            .upload_ternary_weight(
                "w",
                rows,
                cols,
                bytemuck::cast_slice(&words),
                bytemuck::cast_slice(&scales),
            )
            .unwrap();
        let y = c.run_matmul(&w, &x, 1).unwrap();
        check(
            &format!("bind_matmul one token, {what}"),
            &y,
            &want,
            &sums,
            cols,
        );
    }
}

#[test]
fn real_bundle_tensors_match_cpu() {
    let Some(ctx) = context_for_tests(&ContextOptions::default()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny.bundle");
    lowbit::bundle::writer::write_bundle(
        &common::repo().join("testdata/ternary/minicpm-tiny-tq2_0.gguf"),
        &out,
        &lowbit::bundle::writer::PackOptions {
            mode: lowbit::bundle::writer::Mode::Ternary { ternarize: false },
            context: None,
            prefill_buckets: None,
            quiet: true,
            fail_after_tensors: None,
        },
        vec![],
    )
    .unwrap();
    let bundle = lowbit::bundle::reader::Bundle::open(&out).unwrap();
    let model = lowbit::runtime::model::Model::new(bundle).unwrap();
    let mut seed = 11u64;
    let mut n = 0;
    for layer in &model.layers {
        for w in layer.matrices() {
            let lowbit::runtime::model::WeightKind::Ternary { codes, scales } = &w.kind else {
                continue;
            };
            let words: &[u32] = bytemuck::cast_slice(w.bytes(&model.bundle, *codes));
            let sc: &[u16] = bytemuck::cast_slice(w.bytes(&model.bundle, *scales));
            let x = random_x(w.cols, &mut seed);
            let want = cpu(words, sc, w.cols, &x);
            let sums = abs_dx(sc, w.cols, &x);
            let g = ctx.upload_weight(&model.bundle, w).unwrap();
            for cfg in configs(&ctx) {
                let y = ctx.matvec(&g, &x, &cfg).unwrap();
                check(
                    &format!("{} {}", w.name, cfg.name()),
                    &y,
                    &want,
                    &sums,
                    w.cols,
                );
            }
            n += 1;
        }
    }
    assert!(n > 0, "no ternary tensor in the tiny bundle");
}

#[test]
fn bad_configs_and_shapes_are_refused() {
    let Some(ctx) = context_for_tests(&ContextOptions::default()) else {
        return;
    };
    let base = ctx.default_matvec_config();
    for bad in [
        MatvecConfig {
            rows_per_workgroup: 0,
            ..base
        },
        MatvecConfig {
            workgroup_size: 48,
            ..base
        },
        MatvecConfig::split(33, 64, Reduction::Workgroup),
        MatvecConfig::subgroup_rows(257, 64, 1, 1),
        MatvecConfig::subgroup_rows(6, 64, 4, 1),
        MatvecConfig::subgroup_rows(9, 64, 9, 1),
        MatvecConfig::subgroup_rows(8, 64, 2, 3),
        MatvecConfig::subgroup_rows_tiled(8, 64, 2, 2, 300),
        MatvecConfig::subgroup_rows_tiled(8, 64, 2, 2, 32768),
        MatvecConfig {
            reduction: Reduction::Workgroup,
            ..MatvecConfig::subgroup_rows(8, 64, 2, 2)
        },
    ] {
        let e = ctx.pipeline(&bad).unwrap_err();
        assert!(matches!(e, GpuError::Shape { .. }), "{e}");
    }
    if !ctx.has_subgroups() {
        for cfg in [
            MatvecConfig {
                reduction: Reduction::Subgroup,
                ..base
            },
            gpu::decode_matvec_config(Reduction::Subgroup),
        ] {
            let e = ctx.pipeline(&cfg).unwrap_err();
            assert!(matches!(e, GpuError::MissingFeature { .. }), "{e}");
        }
    }
    let e = ctx
        .upload_ternary("w", 2, 100, &[0; 100], &[0; 2])
        .unwrap_err();
    assert!(e.to_string().contains("w [2, 100]"), "{e}");
    let w = ctx.upload_ternary("w", 2, 256, &[0; 128], &[0; 4]).unwrap();
    let e = ctx.matvec(&w, &[0.0; 255], &base).unwrap_err();
    assert!(e.to_string().contains("x has 255 values"), "{e}");
}

#[test]
fn gpu_info_lists_adapters_or_says_there_are_none() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_convert"))
        .args(["gpu-info", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let list = v.as_array().unwrap();
    if std::env::var("LOWBIT_REQUIRE_GPU").as_deref() == Ok("1") {
        assert!(!list.is_empty(), "no adapter and LOWBIT_REQUIRE_GPU=1");
    }
    for a in list {
        for key in [
            "name",
            "backend",
            "driver",
            "subgroup_min_size",
            "subgroup_max_size",
        ] {
            assert!(a.get(key).is_some(), "{key} missing in {a}");
        }
        assert!(
            a["limits"]["max_storage_buffer_binding_size"]
                .as_u64()
                .unwrap()
                > 0
        );
    }
    let text = std::process::Command::new(env!("CARGO_BIN_EXE_convert"))
        .arg("gpu-info")
        .output()
        .unwrap();
    assert!(text.status.success());
    let t = String::from_utf8_lossy(&text.stdout);
    assert!(
        t.contains("adapter 0:") || t.contains("no GPU adapter found"),
        "{t}"
    );
}

/// Runs `bound` once and reads back `n` f32 of `y`.
fn run_bound(ctx: &GpuContext, bound: &gpu::BoundMatvec, y: &wgpu::Buffer, n: usize) -> Vec<f32> {
    let mut enc = ctx
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        bound.encode(&mut pass);
    }
    ctx.queue.submit([enc.finish()]);
    bytemuck::cast_slice::<u8, f32>(&ctx.read_buffer(y, (n * 4) as u64).unwrap()).to_vec()
}

/// The decode kernel with ops folded in (`gpu::Fuse`) against the CPU's separate ops: the
/// RMSNorm (`cpu::rms_norm`, then the CPU f32 matvec of the normalized x) and SwiGLU
/// (`cpu::silu(gate) * up` of the CPU's two products), alone and together, for the
/// registered decode variants and for tiled configurations whose x takes several tiles (the
/// last one shorter). Tolerances: the matvec's own ([`gpu::tolerance`] over the normalized
/// x) plus `K * 2^-24 * sum|d h|` for the norm's scale (its sum of squares added in another
/// order than the CPU's f64 sum: f32 rounding of `K` positive terms); for SwiGLU, the
/// products' bounds carried through `silu` (slope at most 1.1) and the product, plus 8 ulps
/// of the result for `exp` (as the SwiGLU op's test).
#[test]
fn fused_rms_norm_and_swiglu_match_the_cpu_ops() {
    let Some(ctx) = context_for_tests(&ContextOptions::default()) else {
        return;
    };
    if !ctx.has_subgroups() {
        eprintln!(
            "note: {} has no SUBGROUP feature: no fused kernels",
            ctx.info.name
        );
        return;
    }
    let d = gpu::decode_matvec_config(Reduction::Subgroup);
    let mut seed = 31u64;
    let eps = 1e-5f32;
    for (base, cols) in [
        (d, 1024usize),
        (MatvecConfig::subgroup_rows_tiled(8, 64, 2, 2, 256), 1024),
        (MatvecConfig::subgroup_rows_tiled(6, 128, 3, 1, 512), 1280),
    ] {
        for (rms_norm, swiglu) in [(true, false), (false, true), (true, true)] {
            let cfg = base.fused(gpu::Fuse { rms_norm, swiglu });
            let half = 40usize;
            let rows = if swiglu { 2 * half } else { half };
            let (words, scales) = random_weight(rows, cols, &mut seed);
            let w = upload(&ctx, rows, cols, &words, &scales);
            let x: Vec<f32> = random_x(cols, &mut seed).iter().map(|v| v * 3.0).collect();
            let nw: Vec<f32> = (0..cols)
                .map(|i| 0.5 + (lcg(&mut seed) % 1000) as f32 / 1000.0 - (i % 7 == 0) as u8 as f32)
                .collect();
            let mut h = x.clone();
            if rms_norm {
                lowbit::runtime::cpu::rms_norm(&x, &nw, eps, &mut h);
            }
            let y_rows = cpu(&words, &scales, cols, &h);
            let a = abs_dx(&scales, cols, &h);
            let row_tol = |r: usize| {
                gpu::tolerance(cols, a[r])
                    + if rms_norm {
                        cols as f64 * f32::EPSILON as f64 / 2.0 * a[r]
                    } else {
                        0.0
                    }
            };
            let xb = ctx.upload_bytes("x", bytemuck::cast_slice(&x)).unwrap();
            let nb = ctx.upload_bytes("norm", bytemuck::cast_slice(&nw)).unwrap();
            let out = if swiglu { half } else { rows };
            let yb = ctx.vector_buffer("y", out);
            let bound = ctx
                .bind_ternary_fused(
                    &w,
                    &xb,
                    &gpu::ops::BufView::whole(&yb),
                    &cfg,
                    gpu::Epilogue::Store,
                    rms_norm.then_some((&nb, eps)),
                )
                .unwrap();
            let got = run_bound(&ctx, &bound, &yb, out);
            let what = format!("{} K={cols}", cfg.name());
            let mut worst = 0f64;
            for i in 0..out {
                let (want, tol) = if swiglu {
                    let (g, u) = (y_rows[i], y_rows[i + half]);
                    let (tg, tu) = (row_tol(i), row_tol(i + half));
                    let s = lowbit::runtime::cpu::silu(g) as f64;
                    let want = (lowbit::runtime::cpu::silu(g) * u) as f64;
                    (
                        want,
                        1.1 * tg * (u.abs() as f64 + tu)
                            + s.abs() * tu
                            + 8.0 * f32::EPSILON as f64 * want.abs()
                            + 1e-30,
                    )
                } else {
                    (y_rows[i] as f64, row_tol(i))
                };
                let g = got[i] as f64;
                assert!(got[i].is_finite(), "{what}: output {i} is {g}");
                let ratio = (g - want).abs() / tol;
                assert!(
                    ratio <= 1.0,
                    "{what}: output {i}: gpu {g} cpu {want}, |diff| {:e} > tolerance {tol:e}",
                    (g - want).abs()
                );
                worst = worst.max(ratio);
            }
            eprintln!("{what}: worst output at {worst:.2e} of the tolerance");
        }
    }
    // A fused configuration needs x staged; SwiGLU needs one chunk; the norm its weight.
    let e = ctx
        .pipeline(&MatvecConfig::subgroup_rows(8, 128, 2, 2).fused(gpu::Fuse {
            rms_norm: true,
            swiglu: false,
        }))
        .unwrap_err();
    assert!(matches!(e, GpuError::Shape { .. }), "{e}");
}

/// The int8-activation decode kernel (`MatvecKernel::Q8`, `--kernel int8`) against the CPU's
/// int8 arithmetic: x (or its RMSNorm, `cpu::rms_norm`) quantized per block of 256 by
/// `q8::quantize`, each row `sum_b d_b * da_b * (sum c*q - sum q)` in f64. Tolerance per row:
/// f32 rounding of the GPU's unit terms and their sum, `4 * (K/64 + 64) * 2^-24 * S` with
/// `S = sum_k |d da (c - 1) q|`, plus `|d_b * da_b|` for every element whose `x / da` lies
/// within `delta` of a rounding tie (the GPU's division may round `1 / da` to a neighbouring
/// f32, and with the norm folded in its normalized x differs from the CPU's in the last bits,
/// so such an element may round to the other integer): `delta = 1e-4` without the norm,
/// `|t| * 4 * K * 2^-24 + 1e-4` with it. SwiGLU and the residual epilogue carry the bounds
/// through as the f32 kernel's test does. Prints the worst fraction of the tolerance and how many
/// elements were near a tie.
#[test]
fn int8_decode_kernel_matches_the_cpu_int8_arithmetic() {
    use lowbit::runtime::q8;
    let Some(ctx) = context_for_tests(&ContextOptions::default()) else {
        return;
    };
    if !ctx.has_subgroups() {
        eprintln!(
            "note: {} has no SUBGROUP feature: no int8 kernel",
            ctx.info.name
        );
        return;
    }
    let mut seed = 47u64;
    let eps = 1e-5f32;
    let registered = gpu::decode_q8_config(4096, 4096, false).unwrap();
    assert!(gpu::kernels::all()
        .iter()
        .any(|k| k.name == registered.name()));
    for (base, cols) in [
        (registered, 4096usize),
        (gpu::decode_q8_config(32768, 1280, true).unwrap(), 1280),
        (gpu::decode_q8_config(16384, 2048, false).unwrap(), 2048),
        (MatvecConfig::q8(8, 64, 1, 1, 2048), 256),
        (MatvecConfig::q8(6, 128, 3, 4, 1536), 1536),
        // x quantized once before the product: the registered defaults, other splits.
        (gpu::decode_q8_pre_config(4096, 4096, false).unwrap(), 4096),
        (
            gpu::decode_q8_pre_config(4096, 16384, false).unwrap(),
            16384,
        ),
        // The whole workgroup on each pass's rows: K past one chunk, a partial chunk, one
        // row a pass, rows past the end of the dispatch.
        (MatvecConfig::q8_pre_wg(4, 64, 2, 1), 4352),
        (MatvecConfig::q8_pre_wg(3, 32, 1, 4), 1280),
        (MatvecConfig::q8_pre_wg(8, 128, 4, 2), 256),
        // The f16 scales of bundles made before (both splits).
        (gpu::q8_pre_subgroup_rows().with_f16_scales(), 1280),
        (
            MatvecConfig::q8_pre_wg(4, 128, 4, 2).with_f16_scales(),
            4352,
        ),
        (MatvecConfig::q8_pre(16, 128, 2, 2), 1280),
        (MatvecConfig::q8_pre(8, 64, 1, 1), 256),
        (MatvecConfig::q8_pre(6, 128, 3, 4), 4352),
        (MatvecConfig::q8_pre(64, 512, 2, 2), 16384),
        // The norm applied at the end of the product (`rms_late`; the same as the above
        // where no norm is folded in): the registered default, x over two quantize
        // workgroups (K = 4352: two sums of x^2 added), the whole-workgroup split.
        (
            gpu::decode_q8_pre_config(4096, 4096, false)
                .unwrap()
                .with_rms_late(),
            4096,
        ),
        (MatvecConfig::q8_pre(6, 128, 3, 4).with_rms_late(), 4352),
        (MatvecConfig::q8_pre_wg(4, 64, 2, 1).with_rms_late(), 4352),
    ] {
        for (rms_norm, swiglu, accumulate) in [
            (false, false, false),
            (false, false, true),
            (true, false, false),
            (false, true, false),
            (true, true, false),
        ] {
            let cfg = base.fused(gpu::Fuse { rms_norm, swiglu });
            let half = 37usize;
            let rows = if swiglu { 2 * half } else { half };
            let (words, scales) = random_weight(rows, cols, &mut seed);
            let w = upload(&ctx, rows, cols, &words, &scales);
            // x with an all-zero block, a block of one tiny value and blocks of other scales.
            let mut x: Vec<f32> = random_x(cols, &mut seed)
                .iter()
                .enumerate()
                .map(|(i, v)| v * [3.0, 0.01, 250.0, 1.0][(i / 256) % 4])
                .collect();
            if cols >= 1024 {
                x[256..512].fill(0.0);
                x[512..768].fill(0.0);
                x[600] = 1.0e-30;
            }
            let nw: Vec<f32> = (0..cols)
                .map(|i| 0.5 + (lcg(&mut seed) % 1000) as f32 / 1000.0 - (i % 7 == 0) as u8 as f32)
                .collect();
            let mut h = x.clone();
            if rms_norm {
                lowbit::runtime::cpu::rms_norm(&x, &nw, eps, &mut h);
            }
            let qa = q8::quantize(&h, 256);
            let blocks = cols / 256;
            let mut near = 0usize;
            // Row r: the f64 value and the tolerance.
            let row = |r: usize, near: &mut usize| -> (f64, f64) {
                let (mut sum, mut s_abs, mut flips) = (0f64, 0f64, 0f64);
                for b in 0..blocks {
                    let d = half::f16::from_bits(scales[r * blocks + b]).to_f64() * qa.d[b] as f64;
                    let mut isum = 0i64;
                    for k in b * 256..(b + 1) * 256 {
                        let c = (words[(r * cols + k) / 16] >> (2 * (k % 16))) & 3;
                        let q = qa.q[k] as i64;
                        isum += (c as i64 - 1) * q;
                        s_abs += (d * ((c as i64 - 1) * q) as f64).abs();
                        if qa.d[b] > 0.0 {
                            let t = h[k] as f64 / qa.d[b] as f64;
                            let delta = if rms_norm {
                                t.abs() * 4.0 * cols as f64 * f32::EPSILON as f64 / 2.0 + 1e-4
                            } else {
                                1e-4
                            };
                            if ((t.abs().fract()) - 0.5).abs() < delta {
                                flips += d.abs();
                                *near += 1;
                            }
                        }
                    }
                    sum += d * isum as f64;
                }
                let tol = 4.0 * (cols / 64 + 64) as f64 * f32::EPSILON as f64 / 2.0 * s_abs
                    + flips
                    + 1e-30;
                (sum, tol)
            };
            let xb = ctx.upload_bytes("x", bytemuck::cast_slice(&x)).unwrap();
            let nb = ctx.upload_bytes("norm", bytemuck::cast_slice(&nw)).unwrap();
            let out = if swiglu { half } else { rows };
            let y0: Vec<f32> = (0..out).map(|i| i as f32 * 0.25 - 3.0).collect();
            let yb = ctx.vector_buffer("y", out);
            ctx.queue.write_buffer(&yb, 0, bytemuck::cast_slice(&y0));
            let epilogue = if accumulate {
                gpu::Epilogue::Accumulate(0.5)
            } else {
                gpu::Epilogue::Store
            };
            let bound = ctx
                .bind_ternary_fused(
                    &w,
                    &xb,
                    &gpu::ops::BufView::whole(&yb),
                    &cfg,
                    epilogue,
                    rms_norm.then_some((&nb, eps)),
                )
                .unwrap();
            let got = run_bound(&ctx, &bound, &yb, out);
            let what = format!(
                "{} K={cols} rms={rms_norm} accumulate={accumulate}",
                cfg.name()
            );
            let mut worst = 0f64;
            for i in 0..out {
                let (want, tol) = if swiglu {
                    let ((g, tg), (u, tu)) = (row(i, &mut near), row(i + half, &mut near));
                    let s = lowbit::runtime::cpu::silu(g as f32) as f64;
                    let want = s * u;
                    (
                        want,
                        1.1 * tg * (u.abs() + tu)
                            + s.abs() * tu
                            + 8.0 * f32::EPSILON as f64 * want.abs()
                            + 1e-30,
                    )
                } else if accumulate {
                    let (v, t) = row(i, &mut near);
                    let want = y0[i] as f64 + v * 0.5;
                    (want, 0.5 * t + 2.0 * f32::EPSILON as f64 * want.abs())
                } else {
                    row(i, &mut near)
                };
                let g = got[i] as f64;
                assert!(got[i].is_finite(), "{what}: output {i} is {g}");
                let ratio = (g - want).abs() / tol;
                assert!(
                    ratio <= 1.0,
                    "{what}: output {i}: gpu {g} want {want}, |diff| {:e} > tolerance {tol:e}",
                    (g - want).abs()
                );
                worst = worst.max(ratio);
            }
            eprintln!(
                "{what}: worst output at {worst:.2e} of the tolerance ({near} elements near a tie)"
            );
        }
    }
    // A NaN in x makes every row it touches NaN (the f32 kernels' behaviour), not a finite
    // value with the NaN quantized away; an inf makes them non-finite too.
    let (words, scales) = random_weight(40, 1024, &mut seed);
    let w = upload(&ctx, 40, 1024, &words, &scales);
    for cfg in [
        gpu::decode_q8_config(64, 1024, false).unwrap(),
        gpu::decode_q8_pre_config(64, 1024, false).unwrap(),
        MatvecConfig::q8_pre_wg(4, 128, 4, 2),
    ] {
        for (k, bad) in [(300usize, f32::NAN), (700, f32::INFINITY)] {
            let mut x = random_x(1024, &mut seed);
            x[k] = bad;
            let y = ctx.matvec(&w, &x, &cfg).unwrap();
            let b = k / 256;
            for (r, v) in y.iter().enumerate() {
                let d = half::f16::from_bits(scales[r * 4 + b]).to_f32();
                assert!(
                    !v.is_finite() || d == 0.0,
                    "{}: x[{k}] = {bad}: row {r} is {v} (block scale {d})",
                    cfg.name()
                );
            }
        }
    }
    // Row chunks (several bindings) give the same bits as one binding.
    let Some(small) = context_for_tests(&ContextOptions {
        max_binding_bytes: Some(16 * 1024),
        ..Default::default()
    }) else {
        return;
    };
    let (words, scales) = random_weight(70, 4096, &mut seed);
    let x = random_x(4096, &mut seed);
    let up = |c: &GpuContext| upload(c, 70, 4096, &words, &scales);
    let (chunked, whole) = (up(&small), up(&ctx));
    assert!(chunked.chunks.len() > 1);
    for cfg in [
        registered,
        MatvecConfig::q8(6, 128, 3, 4, 4096),
        gpu::decode_q8_pre_config(70, 4096, false).unwrap(),
        MatvecConfig::q8_pre_wg(4, 128, 4, 2),
    ] {
        let a = small.matvec(&chunked, &x, &cfg).unwrap();
        let b = ctx.matvec(&whole, &x, &cfg).unwrap();
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{} in {} chunks",
            cfg.name(),
            chunked.chunks.len()
        );
    }
    // K past the kernel's width is refused at bind time.
    let (words, scales) = random_weight(8, 4096, &mut seed);
    let w = upload(&ctx, 8, 4096, &words, &scales);
    let xb = ctx.vector_buffer("x", 4096);
    let yb = ctx.vector_buffer("y", 8);
    let Err(e) = ctx.bind_matvec(&w, &xb, &yb, &MatvecConfig::q8(8, 64, 1, 1, 2048)) else {
        panic!("K = 4096 bound to a kernel built for 2048");
    };
    assert!(matches!(e, GpuError::Shape { .. }), "{e}");
}

/// The int8 prefill product of a ternary weight (`weights::mmq_name`, x quantized once by
/// `weights::Q8_QUANTIZE`; what `bind_matmul` binds for two or more tokens with `int8`)
/// against the CPU's int8 arithmetic, token by token: each token's x quantized per block of
/// 256 by `q8::quantize`, each row `sum_b d_b * da_b * (sum c*q - sum q)` in f64. Tolerance
/// per output: f32 rounding of the block terms and their sequential sum,
/// `4 * (K/256 + 4) * 2^-24 * S` with `S = sum_k |d da (c - 1) q|`, plus `|d_b * da_b|` for
/// every element whose `x / da` lies within 1e-4 of a rounding tie (the GPU's `1 / da` may
/// round to a neighbouring f32). Both workgroup shapes (16 and 64 tokens), token counts that
/// leave a partial workgroup, rows past one workgroup's 128, the residual epilogue, and row
/// chunks over several bindings (the same bits as one binding). A token with an inf or a NaN
/// in x comes out non-finite in every row.
#[test]
fn int8_prefill_product_matches_the_cpu_int8_arithmetic() {
    use lowbit::runtime::gpu::weights;
    use lowbit::runtime::q8;
    let int8 = ContextOptions {
        int8: true,
        ..Default::default()
    };
    let Some(ctx) = context_for_tests(&int8) else {
        return;
    };
    if !ctx.decodes_int8(4096) {
        eprintln!(
            "note: {} takes no int8 ternary products (no SUBGROUP feature)",
            ctx.info.name
        );
        return;
    }
    // Bindings of 64 KiB: several row chunks at K = 1280 and 4096 (ternary chunks are whole
    // multiples of the storage offset alignment / 4 rows, up to 64 on some adapters).
    let cap = 64 * 1024;
    let small = context_for_tests(&ContextOptions {
        max_binding_bytes: Some(cap),
        ..int8.clone()
    })
    .unwrap();
    let registered: Vec<String> = gpu::kernels::all().into_iter().map(|k| k.name).collect();
    for tt in weights::MMQ_TOKENS_PER_INVOCATION {
        assert!(registered.contains(&weights::mmq_name(tt)));
    }
    assert!(registered.iter().any(|n| n == weights::Q8_QUANTIZE));
    let mut seed = 53u64;
    for (rows, cols, ns) in [
        (37usize, 256usize, &[2usize, 17][..]),
        (300, 1280, &[5, 64, 70][..]),
        (130, 4096, &[16, 130][..]),
    ] {
        let (words, scales) = random_weight(rows, cols, &mut seed);
        let up = |c: &GpuContext| {
            c.upload_ternary_weight(
                "w",
                rows,
                cols,
                bytemuck::cast_slice(&words),
                bytemuck::cast_slice(&scales),
            )
            .unwrap()
        };
        let (w, chunked) = (up(&ctx), up(&small));
        let blocks = cols / 256;
        for &n in ns {
            let mut x: Vec<f32> = Vec::with_capacity(n * cols);
            for t in 0..n {
                let scale = [3.0f32, 0.01, 250.0, 1.0][t % 4];
                x.extend(random_x(cols, &mut seed).iter().map(|v| v * scale));
            }
            // An all-zero block in one token.
            x[cols..cols + 256].fill(0.0);
            let mut near = 0usize;
            let mut worst = 0f64;
            let y = ctx.run_matmul(&w, &x, n as u32).unwrap();
            let yc = small.run_matmul(&chunked, &x, n as u32).unwrap();
            assert!(chunked.chunks.len() > 1 || rows * cols / 4 <= cap as usize);
            assert_eq!(
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                yc.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "[{rows}, {cols}] n={n}: {} chunks against one",
                chunked.chunks.len()
            );
            for t in 0..n {
                let h = &x[t * cols..(t + 1) * cols];
                let qa = q8::quantize(h, 256);
                for r in 0..rows {
                    let (mut sum, mut s_abs, mut flips) = (0f64, 0f64, 0f64);
                    for b in 0..blocks {
                        let d =
                            half::f16::from_bits(scales[r * blocks + b]).to_f64() * qa.d[b] as f64;
                        let mut isum = 0i64;
                        for k in b * 256..(b + 1) * 256 {
                            let c = (words[(r * cols + k) / 16] >> (2 * (k % 16))) & 3;
                            let q = qa.q[k] as i64;
                            isum += (c as i64 - 1) * q;
                            s_abs += (d * ((c as i64 - 1) * q) as f64).abs();
                            if qa.d[b] > 0.0 {
                                let v = h[k] as f64 / qa.d[b] as f64;
                                if (v.abs().fract() - 0.5).abs() < 1e-4 {
                                    flips += d.abs();
                                    near += 1;
                                }
                            }
                        }
                        sum += d * isum as f64;
                    }
                    let tol = 4.0 * (blocks + 4) as f64 * f32::EPSILON as f64 / 2.0 * s_abs
                        + flips
                        + 1e-30;
                    let g = y[t * rows + r] as f64;
                    let ratio = (g - sum).abs() / tol;
                    assert!(
                        ratio <= 1.0,
                        "[{rows}, {cols}] n={n}: token {t} row {r}: gpu {g} want {sum}, |diff| {:e} > tolerance {tol:e}",
                        (g - sum).abs()
                    );
                    worst = worst.max(ratio);
                }
            }
            eprintln!(
                "int8 prefill [{rows}, {cols}] n={n}: worst output at {worst:.2e} of the tolerance ({near} elements near a tie)"
            );
            // The residual epilogue: y0 + product * 0.5.
            let xb = ctx.upload_bytes("x", bytemuck::cast_slice(&x)).unwrap();
            let y0: Vec<f32> = (0..n * rows).map(|i| i as f32 * 0.25 - 3.0).collect();
            let yb = ctx.vector_buffer("y", n * rows);
            ctx.queue.write_buffer(&yb, 0, bytemuck::cast_slice(&y0));
            let bound = ctx
                .bind_matmul_with(
                    &w,
                    &xb,
                    &gpu::ops::BufView::whole(&yb),
                    n as u32,
                    gpu::Epilogue::Accumulate(0.5),
                )
                .unwrap();
            assert_eq!(
                bound.dispatches(),
                2,
                "the quantization pass and the product"
            );
            let mut enc = ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                bound.encode(&mut pass);
            }
            ctx.queue.submit([enc.finish()]);
            let acc: Vec<f32> =
                bytemuck::cast_slice(&ctx.read_buffer(&yb, (n * rows * 4) as u64).unwrap())
                    .to_vec();
            for i in 0..n * rows {
                let want = y0[i] + y[i] * 0.5;
                let fused = y[i].mul_add(0.5, y0[i]);
                assert!(
                    acc[i] == want || acc[i] == fused,
                    "[{rows}, {cols}] n={n}: accumulated y[{i}] = {}, want {want}",
                    acc[i]
                );
            }
        }
    }
    // An inf in one token's x makes that token's every row non-finite (da = inf, the block's
    // q all 0: (d * da) * 0 is NaN), the other tokens' rows stay finite.
    let (rows, cols, n) = (40usize, 1024usize, 3usize);
    let (words, scales) = random_weight(rows, cols, &mut seed);
    let w = ctx
        .upload_ternary_weight(
            "w",
            rows,
            cols,
            bytemuck::cast_slice(&words),
            bytemuck::cast_slice(&scales),
        )
        .unwrap();
    // A NaN likewise: its block's da is NaN on the GPU (the decode kernel's rule), so every
    // row of that token comes out NaN.
    for bad in [f32::INFINITY, f32::NAN] {
        let mut x = random_x(n * cols, &mut seed);
        x[cols + 700] = bad;
        let y = ctx.run_matmul(&w, &x, n as u32).unwrap();
        for t in 0..n {
            for r in 0..rows {
                let v = y[t * rows + r];
                if t == 1 {
                    assert!(!v.is_finite(), "x = {bad}: token 1 row {r}: {v}");
                } else {
                    assert!(v.is_finite(), "x = {bad}: token {t} row {r}: {v}");
                }
            }
        }
    }
}

/// x per 16-element group as the `_y16` products write it (`gpu::Q16_LAYOUT`), from the
/// host: per group `da = max|x| / 127`, `q = round(x / da)` (half away from zero, clamped to
/// +-127), the group words, then per unit the four `da` and the four `da * sum q`. Returns
/// the words and `(q, da)`.
fn q16_host(x: &[f32]) -> (Vec<u32>, Vec<i8>, Vec<f32>) {
    let k = x.len();
    let mut q = vec![0i8; k];
    let mut da = vec![0f32; k / 16];
    let mut words = vec![0u32; (k + k / 2) / 4];
    for g in 0..k / 16 {
        let xs = &x[16 * g..16 * g + 16];
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (i, &v) in xs.iter().enumerate() {
            let t = (v * id).round().clamp(-127.0, 127.0) as i8;
            q[16 * g + i] = t;
            sum += t as i32;
        }
        da[g] = d;
        for kk in 0..4 {
            let b = |j: usize| q[16 * g + 4 * j + kk] as u8 as u32;
            words[4 * g + kk] = b(0) | (b(1) << 8) | (b(2) << 16) | (b(3) << 24);
        }
        let mu = k / 16 + 2 * (g / 4);
        words[4 * mu + g % 4] = d.to_bits();
        words[4 * mu + 4 + g % 4] = (d * sum as f32).to_bits();
    }
    (words, q, da)
}

/// The int8 decode products that read x per 16-element group (`_x16`: the down product after
/// a `_y16` gate/up, no quantize dispatch) against the exact arithmetic in f64 on the same
/// int8 x: each row `sum_b d_b * sum_g da_g * sum_k (c - 1) q`, within the int8 kernel's
/// rounding bound `4 * (K/64 + 64) * 2^-24 * S`; both splits, several K, the residual
/// epilogue. And the `_y16` gate/up products: their x for the down product is the host's
/// per-16 quantization of their own f32 outputs (the same configuration without `_y16`), the
/// int8 values equal except within 1e-4 of a rounding tie (the GPU's `1 / da` may round to a
/// neighbouring f32), `da` within 3 ulps, `da * sum q` the product of the two it stored.
#[test]
fn per_16_group_int8_x_matches_the_exact_arithmetic() {
    let Some(ctx) = context_for_tests(&ContextOptions::default()) else {
        return;
    };
    if !ctx.has_subgroups() {
        eprintln!(
            "note: {} has no SUBGROUP feature: no int8 kernel",
            ctx.info.name
        );
        return;
    }
    let mut seed = 91u64;
    for (cfg, cols, accumulate) in [
        (
            gpu::decode_q8_pre_config(64, 4096, false).unwrap(),
            4096usize,
            false,
        ),
        (
            gpu::decode_q8_pre_config(64, 16384, false).unwrap(),
            16384,
            true,
        ),
        (MatvecConfig::q8_pre(6, 128, 3, 4), 1280, true),
        (MatvecConfig::q8_pre_wg(4, 64, 2, 1), 4352, false),
    ] {
        let cfg = cfg.with_q16(true, false);
        assert!(cfg.name().ends_with("_x16"), "{}", cfg.name());
        assert_eq!(MatvecConfig::parse(&cfg.name()), Some(cfg));
        assert_eq!(cfg.pre_kernel(), None);
        let rows = 37usize;
        let (wd, scales) = random_weight(rows, cols, &mut seed);
        let w = upload(&ctx, rows, cols, &wd, &scales);
        let x: Vec<f32> = random_x(cols, &mut seed)
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v * [3.0, 0.01, 250.0, 1.0][(i / 16) % 4] * ((i / 16) % 9 != 5) as u8 as f32
            })
            .collect();
        let (words, q, da) = q16_host(&x);
        let xb = ctx
            .upload_bytes("x16", bytemuck::cast_slice(&words))
            .unwrap();
        let y0: Vec<f32> = (0..rows).map(|i| i as f32 * 0.25 - 3.0).collect();
        let yb = ctx.vector_buffer("y", rows);
        ctx.queue.write_buffer(&yb, 0, bytemuck::cast_slice(&y0));
        let ep = if accumulate {
            gpu::Epilogue::Accumulate(0.5)
        } else {
            gpu::Epilogue::Store
        };
        let bound = ctx
            .bind_ternary_fused(&w, &xb, &gpu::ops::BufView::whole(&yb), &cfg, ep, None)
            .unwrap();
        assert_eq!(bound.dispatches(), 1);
        let got = run_bound(&ctx, &bound, &yb, rows);
        let blocks = cols / 256;
        let mut worst = 0f64;
        for r in 0..rows {
            let (mut sum, mut s_abs) = (0f64, 0f64);
            for k in 0..cols {
                let c = (wd[(r * cols + k) / 16] >> (2 * (k % 16))) & 3;
                let d = half::f16::from_bits(scales[r * blocks + k / 256]).to_f64();
                let t = d * da[k / 16] as f64 * ((c as i64 - 1) * q[k] as i64) as f64;
                sum += t;
                s_abs += t.abs();
            }
            let mut tol = 4.0 * (cols / 64 + 64) as f64 * f32::EPSILON as f64 / 2.0 * s_abs + 1e-30;
            let want = if accumulate {
                tol = 0.5 * tol + 2.0 * f32::EPSILON as f64 * (y0[r] as f64 + 0.5 * sum).abs();
                y0[r] as f64 + 0.5 * sum
            } else {
                sum
            };
            let ratio = (got[r] as f64 - want).abs() / tol;
            assert!(
                ratio <= 1.0,
                "{} K={cols}: row {r}: gpu {} want {want} (tolerance {tol:e})",
                cfg.name(),
                got[r]
            );
            worst = worst.max(ratio);
        }
        eprintln!(
            "{} K={cols}: worst row at {worst:.2e} of the tolerance",
            cfg.name()
        );
    }
    // The gate/up products that write it.
    let eps = 1e-5f32;
    for (base, cols, half) in [
        (
            gpu::decode_q8_pre_config(64, 4096, true).unwrap(),
            1024usize,
            256usize,
        ),
        (MatvecConfig::q8_pre(32, 128, 2, 2), 512, 512),
    ] {
        for rms_norm in [false, true] {
            let plain = base.fused(gpu::Fuse {
                rms_norm,
                swiglu: true,
            });
            let plain = if rms_norm {
                plain.with_rms_late()
            } else {
                plain
            };
            let cfg = plain.with_q16(false, true);
            assert_eq!(
                MatvecConfig::parse(&cfg.name()),
                Some(cfg),
                "{}",
                cfg.name()
            );
            let (wd, scales) = random_weight(2 * half, cols, &mut seed);
            let w = upload(&ctx, 2 * half, cols, &wd, &scales);
            let x: Vec<f32> = random_x(cols, &mut seed).iter().map(|v| v * 3.0).collect();
            let nw: Vec<f32> = (0..cols)
                .map(|_| 0.5 + (lcg(&mut seed) % 1000) as f32 / 1000.0)
                .collect();
            let xb = ctx.upload_bytes("x", bytemuck::cast_slice(&x)).unwrap();
            let nb = ctx.upload_bytes("norm", bytemuck::cast_slice(&nw)).unwrap();
            let norm = rms_norm.then_some((&nb, eps));
            let yb = ctx.vector_buffer("y", half);
            let b = ctx
                .bind_ternary_fused(
                    &w,
                    &xb,
                    &gpu::ops::BufView::whole(&yb),
                    &plain,
                    gpu::Epilogue::Store,
                    norm,
                )
                .unwrap();
            let y = run_bound(&ctx, &b, &yb, half);
            let (want_words, want_q, want_da) = q16_host(&y);
            let qb = ctx.vector_buffer("q16", (half + half / 2) / 4);
            let b = ctx
                .bind_ternary_fused(
                    &w,
                    &xb,
                    &gpu::ops::BufView::whole(&qb),
                    &cfg,
                    gpu::Epilogue::Store,
                    norm,
                )
                .unwrap();
            let got: Vec<u32> =
                bytemuck::cast_slice::<f32, u32>(&run_bound(&ctx, &b, &qb, (half + half / 2) / 4))
                    .to_vec();
            let mut near = 0;
            for g in 0..half / 16 {
                let mu = half / 16 + 2 * (g / 4);
                let d = f32::from_bits(got[4 * mu + g % 4]);
                let ulps = (d.to_bits() as i64 - want_da[g].to_bits() as i64).abs();
                assert!(
                    ulps <= 3,
                    "{} group {g}: da {d} want {}",
                    cfg.name(),
                    want_da[g]
                );
                let mut sum = 0i32;
                for i in 0..16 {
                    let (kk, j) = (i % 4, i / 4);
                    let gq = (got[4 * g + kk] >> (8 * j)) as u8 as i8;
                    let wq = want_q[16 * g + 4 * j + kk];
                    sum += gq as i32;
                    if gq != wq {
                        let t = y[16 * g + 4 * j + kk] as f64 / want_da[g] as f64;
                        assert!(
                            (gq as i32 - wq as i32).abs() == 1
                                && ((t.abs().fract()) - 0.5).abs() < 1e-4,
                            "{} group {g} element {}: q {gq} want {wq} (t = {t})",
                            cfg.name(),
                            4 * j + kk
                        );
                        near += 1;
                    }
                }
                assert_eq!(
                    got[4 * mu + 4 + g % 4],
                    (d * sum as f32).to_bits(),
                    "{} group {g}",
                    cfg.name()
                );
            }
            assert_eq!(want_words.len(), got.len());
            eprintln!(
                "{} K={cols}: {} groups, {near} int8 values at a tie",
                cfg.name(),
                half / 16
            );
            // A `_y16` product stores no f32 sums: no residual epilogue.
            let e = ctx
                .bind_ternary_fused(
                    &w,
                    &xb,
                    &gpu::ops::BufView::whole(&qb),
                    &cfg,
                    gpu::Epilogue::Accumulate(1.0),
                    norm,
                )
                .err()
                .expect("a _y16 product with the residual epilogue");
            assert!(matches!(e, GpuError::Shape { .. }), "{e}");
        }
    }
    // Refused: an `_x16` product with a norm (it has no quantize dispatch to fold one into),
    // a `_y16` one without SwiGLU or on the whole-workgroup split.
    let x16 = gpu::decode_q8_pre_config(64, 4096, false)
        .unwrap()
        .with_q16(true, false);
    for bad in [
        x16.fused(gpu::Fuse {
            rms_norm: true,
            swiglu: false,
        }),
        gpu::decode_q8_pre_config(64, 4096, false)
            .unwrap()
            .with_q16(false, true),
        MatvecConfig::q8_pre_wg(16, 128, 4, 1)
            .fused(gpu::Fuse {
                rms_norm: false,
                swiglu: true,
            })
            .with_q16(false, true),
    ] {
        let e = ctx
            .pipeline(&bad)
            .err()
            .unwrap_or_else(|| panic!("{} was accepted", bad.name()));
        assert!(matches!(e, GpuError::Shape { .. }), "{}: {e}", bad.name());
    }
}

/// The `_y16` gate/up product and the `_x16` down product end to end, held to what the f32
/// SwiGLU outputs give, not to the layout: the down product of gate/up's own f32 outputs `s`
/// (the same configuration without `_y16`) in f64, within the per-16-group rounding of `s`
/// (`sum_k |d_k (c_k - 1)| * da_g / 2`, `da_g = max|s| / 127` of k's group, plus a ulp of
/// `da`) and the int8 kernel's f32 bound. A layout that producer and consumer misread alike
/// (a swapped `da`, a group at the wrong place) fails here.
#[test]
fn gate_up_writes_what_the_down_product_reads() {
    let Some(ctx) = context_for_tests(&ContextOptions::default()) else {
        return;
    };
    if !ctx.has_subgroups() {
        eprintln!(
            "note: {} has no SUBGROUP feature: no int8 kernel",
            ctx.info.name
        );
        return;
    }
    let mut seed = 123u64;
    let (cols, half, rows) = (512usize, 512usize, 40usize);
    let glu = gpu::Fuse {
        rms_norm: true,
        swiglu: true,
    };
    let plain = gpu::decode_q8_pre_config(64, cols, true)
        .unwrap()
        .fused(glu);
    let y16 = plain.with_q16(false, true);
    for down_cfg in [
        gpu::decode_q8_pre_config(rows, half, false).unwrap(),
        MatvecConfig::q8_pre_wg(4, 64, 2, 1),
    ] {
        let x16 = down_cfg.with_q16(true, false);
        let (wg, sg) = random_weight(2 * half, cols, &mut seed);
        let (wd, sd) = random_weight(rows, half, &mut seed);
        let gu = upload(&ctx, 2 * half, cols, &wg, &sg);
        let dn = upload(&ctx, rows, half, &wd, &sd);
        let x: Vec<f32> = random_x(cols, &mut seed).iter().map(|v| v * 3.0).collect();
        let nw: Vec<f32> = (0..cols)
            .map(|_| 0.5 + (lcg(&mut seed) % 1000) as f32 / 1000.0)
            .collect();
        let xb = ctx.upload_bytes("x", bytemuck::cast_slice(&x)).unwrap();
        let nb = ctx.upload_bytes("norm", bytemuck::cast_slice(&nw)).unwrap();
        let norm = Some((&nb, 1e-5f32));
        let view = |b: &wgpu::Buffer| gpu::ops::BufView::whole(b);
        // s: the SwiGLU outputs in f32.
        let sb = ctx.vector_buffer("s", half);
        let b = ctx
            .bind_ternary_fused(&gu, &xb, &view(&sb), &plain, gpu::Epilogue::Store, norm)
            .unwrap();
        let s = run_bound(&ctx, &b, &sb, half);
        // The pair.
        let qb = ctx.vector_buffer("q16", (half + half / 2) / 4);
        let yb = ctx.vector_buffer("y", rows);
        let a = ctx
            .bind_ternary_fused(&gu, &xb, &view(&qb), &y16, gpu::Epilogue::Store, norm)
            .unwrap();
        let b = ctx
            .bind_ternary_fused(&dn, &qb, &view(&yb), &x16, gpu::Epilogue::Store, None)
            .unwrap();
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            a.encode(&mut pass);
            b.encode(&mut pass);
        }
        ctx.queue.submit([enc.finish()]);
        let got: Vec<f32> =
            bytemuck::cast_slice::<u8, f32>(&ctx.read_buffer(&yb, (rows * 4) as u64).unwrap())
                .to_vec();
        let da: Vec<f64> = s
            .chunks(16)
            .map(|g| g.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0)
            .collect();
        let blocks = half / 256;
        let mut worst = 0f64;
        for r in 0..rows {
            let (mut want, mut round, mut s_abs) = (0f64, 0f64, 0f64);
            for k in 0..half {
                let c = (wd[(r * half + k) / 16] >> (2 * (k % 16))) & 3;
                let dw = half::f16::from_bits(sd[r * blocks + k / 256]).to_f64() * (c as f64 - 1.0);
                want += dw * s[k] as f64;
                round += dw.abs() * da[k / 16] * (0.5 + 4.0 * f32::EPSILON as f64);
                s_abs += (dw * s[k] as f64).abs();
            }
            let tol = round
                + 4.0 * (half / 64 + 64) as f64 * f32::EPSILON as f64 / 2.0 * (s_abs + round)
                + 1e-30;
            let ratio = (got[r] as f64 - want).abs() / tol;
            assert!(
                ratio <= 1.0,
                "{} -> {}: row {r}: gpu {} want {want} (tolerance {tol:e})",
                y16.name(),
                x16.name(),
                got[r]
            );
            worst = worst.max(ratio);
        }
        eprintln!(
            "{} -> {}: worst row at {worst:.2e} of the rounding bound",
            y16.name(),
            x16.name()
        );
    }
}
