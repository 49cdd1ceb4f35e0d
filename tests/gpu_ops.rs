//! The GPU backend's ops (src/runtime/gpu/ops.rs) against the CPU backend's code, each with
//! its stated tolerance. On a machine without an adapter these skip and say so, unless
//! `LOWBIT_REQUIRE_GPU=1` (set by `make test`), where they fail.

use lowbit::runtime::cpu;
use lowbit::runtime::gpu::ops::{self, Bindable, Step};
use lowbit::runtime::gpu::{context_for_tests, ContextOptions, GpuContext};

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

fn lcg_u32(seed: &mut u64) -> u32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*seed >> 32) as u32
}

fn buf(ctx: &GpuContext, v: &[f32]) -> wgpu::Buffer {
    let b = ctx.vector_buffer("t", v.len());
    ctx.queue.write_buffer(&b, 0, bytemuck::cast_slice(v));
    b
}

fn u32buf(ctx: &GpuContext, v: &[u32]) -> wgpu::Buffer {
    let b = ctx.vector_buffer("t", v.len());
    ctx.queue.write_buffer(&b, 0, bytemuck::cast_slice(v));
    b
}

fn read(ctx: &GpuContext, b: &wgpu::Buffer, n: usize) -> Vec<f32> {
    bytemuck::cast_slice::<u8, f32>(&ctx.read_buffer(b, (n * 4) as u64).unwrap()).to_vec()
}

fn read_u32(ctx: &GpuContext, b: &wgpu::Buffer, n: usize) -> Vec<u32> {
    bytemuck::cast_slice::<u8, u32>(&ctx.read_buffer(b, (n * 4) as u64).unwrap()).to_vec()
}

fn step(ctx: &GpuContext, pos0: u32, n: u32) -> wgpu::Buffer {
    ctx.uniform(
        "step",
        bytemuck::bytes_of(&Step {
            pos0,
            n,
            _pad: [0; 2],
        }),
    )
}

fn params(ctx: &GpuContext, v: &[u32]) -> wgpu::Buffer {
    ctx.uniform("params", bytemuck::cast_slice(v))
}

fn run(ctx: &GpuContext, name: &'static str, bufs: &[&dyn Bindable], grid: (u32, u32, u32)) {
    let op = ctx.bind_op(name, bufs, grid).unwrap();
    let mut enc = ctx
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: None,
        });
        op.encode(&mut pass);
    }
    ctx.queue.submit([enc.finish()]);
}

/// This binary's kernels without bounds checks, as the backend compiles them by default.
fn ctx() -> Option<GpuContext> {
    context_for_tests(&ContextOptions {
        unchecked_builtin: true,
        ..Default::default()
    })
}

/// Relative error of `got` against `want`, scaled by `scale` (plus the smallest normal).
fn check(what: &str, got: &[f32], want: &[f32], scale: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    let mut worst = 0f32;
    for (i, ((g, w), s)) in got.iter().zip(want).zip(scale).enumerate() {
        let r = (g - w).abs() / (s.abs() + f32::MIN_POSITIVE);
        assert!(
            r <= tol,
            "{what}[{i}]: gpu {g} cpu {w} (error {:.2e} of scale {s}, tolerance {tol:.1e})",
            (g - w).abs()
        );
        worst = worst.max(r);
    }
    eprintln!("{what}: worst relative error {worst:.2e} (tolerance {tol:.1e})");
}

#[test]
fn every_op_module_compiles() {
    let Some(ctx) = ctx() else { return };
    for k in lowbit::runtime::gpu::ops::sources() {
        if ops::SUBGROUP_OPS.contains(&k.name.as_str())
            && (!ctx.has_subgroups() || !ctx.has_f16_in_f32())
        {
            eprintln!(
                "note: {} needs subgroups and unpack2x16float, which this adapter lacks",
                k.name
            );
            continue;
        }
        ctx.pipeline_named(&k.name, None)
            .unwrap_or_else(|e| panic!("{}: {e}", k.name));
    }
}

#[test]
fn kv_store_rounds_to_nearest_even_like_the_cpu() {
    let Some(ctx) = ctx() else { return };
    // Values that test every branch: ties, subnormals, overflow, signs, NaN/inf.
    let mut vals: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        65504.0,
        65519.99,
        65520.0,
        1e6,
        -1e6,
        f32::INFINITY,
        f32::NEG_INFINITY,
        6.0e-8,
        2.98e-8,
        2.9802322e-8,
        2.9802326e-8,
        5.96e-8,
        1.0e-5,
        6.1e-5,
        6.103515e-5,
        1.0 + 2f32.powi(-10),
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        -std::f32::consts::PI,
    ];
    let mut seed = 7u64;
    while vals.len() < 4096 {
        let m = lcg(&mut seed);
        let e = (lcg(&mut seed) * 30.0) as i32;
        vals.push(m * 2f32.powi(e));
    }
    for v in vals.iter_mut().step_by(7) {
        // exact ties between neighbouring f16 values
        let h = half::f16::from_f32(*v);
        let next = half::f16::from_bits(h.to_bits().wrapping_add(1));
        if h.is_finite() && next.is_finite() {
            *v = (h.to_f32() as f64 / 2.0 + next.to_f32() as f64 / 2.0) as f32;
        }
    }
    // One token, one kv head of head_dim = vals.len(), n_ctx = 1.
    let hd = vals.len();
    let k = buf(&ctx, &vals);
    let v = buf(&ctx, &vals);
    let kc = ctx.vector_buffer("kc", hd / 2);
    let vc = ctx.vector_buffer("vc", hd / 2);
    let p = params(&ctx, &[1, hd as u32, 1, 0]);
    let st = step(&ctx, 0, 1);
    run(
        &ctx,
        "op_kv_store",
        &[&k, &v, &kc, &vc, &p, &st],
        ((hd / 2).div_ceil(64) as u32, 1, 1),
    );
    let got = read_u32(&ctx, &kc, hd / 2);
    for (i, x) in vals.iter().enumerate() {
        let g = (got[i / 2] >> ((i % 2) * 16)) & 0xffff;
        let w = half::f16::from_f32(*x).to_bits() as u32;
        assert_eq!(g, w, "f16 of {x:e} (bits {:#x})", x.to_bits());
    }
    let mut nan = vec![f32::NAN, 1.0];
    nan.resize(2, 0.0);
    let kb = buf(&ctx, &nan);
    let p = params(&ctx, &[1, 2, 1, 0]);
    let kc2 = ctx.vector_buffer("kc", 1);
    run(
        &ctx,
        "op_kv_store",
        &[&kb, &kb, &kc2, &vc, &p, &st],
        (1, 1, 1),
    );
    let g = read_u32(&ctx, &kc2, 1)[0] & 0xffff;
    assert!(half::f16::from_bits(g as u16).is_nan(), "{g:#x}");
}

#[test]
fn rms_norm_matches_the_cpu_and_the_last_row_mode() {
    let Some(ctx) = ctx() else { return };
    let mut seed = 1u64;
    // Up to 5000: more values than the 256 invocations take 16 at a time.
    for (len, rows) in [
        (576usize, 3usize),
        (64, 40),
        (896, 1),
        (1000, 2),
        (4096, 2),
        (5000, 2),
    ] {
        let x: Vec<f32> = (0..len * rows).map(|_| lcg(&mut seed) * 3.0).collect();
        let w: Vec<f32> = (0..len).map(|_| lcg(&mut seed) + 1.0).collect();
        let mut want = vec![0f32; len * rows];
        for r in 0..rows {
            cpu::rms_norm(
                &x[r * len..(r + 1) * len],
                &w,
                1e-5,
                &mut want[r * len..(r + 1) * len],
            );
        }
        let (xb, wb, ob) = (
            buf(&ctx, &x),
            buf(&ctx, &w),
            ctx.vector_buffer("o", len * rows),
        );
        let p = params(&ctx, &[len as u32, 1e-5f32.to_bits(), rows as u32, 0]);
        let st = step(&ctx, 0, rows as u32);
        run(
            &ctx,
            "op_rms_norm",
            &[&xb, &wb, &ob, &p, &st],
            (rows as u32, 1, 1),
        );
        // The sum of squares in f32 (len terms) against the CPU's f64: relative error of the
        // scale below len * 2^-24, plus a few roundings of the products.
        let tol = (len as f32 + 8.0) * f32::EPSILON;
        check("rms_norm", &read(&ctx, &ob, len * rows), &want, &want, tol);
        // last-row mode: the chunk's last real token (step.n - 1) into row 0.
        let p = params(&ctx, &[len as u32, 1e-5f32.to_bits(), 1, 1]);
        let n = rows.max(2) as u32 - 1;
        let st = step(&ctx, 0, n);
        let ob1 = ctx.vector_buffer("o", len);
        run(&ctx, "op_rms_norm", &[&xb, &wb, &ob1, &p, &st], (1, 1, 1));
        let r = n as usize - 1;
        check(
            "rms_norm last row",
            &read(&ctx, &ob1, len),
            &want[r * len..(r + 1) * len],
            &want[r * len..(r + 1) * len],
            tol,
        );
    }
}

/// `op_rms_norm_add` (Gemma 3's post-norms): the post-norm of y added into x and the next
/// norm of the new x, bit for bit what `op_rms_norm`, `op_add` and `op_rms_norm` give one
/// after another, and within rms_norm's tolerance of the CPU; with `next` 0, h untouched.
#[test]
fn rms_norm_add_equals_the_norm_the_add_and_the_next_norm() {
    let Some(ctx) = ctx() else { return };
    let mut seed = 5u64;
    for (len, rows, s) in [
        (640usize, 1usize, 1.0f32),
        (576, 3, 1.0),
        (1000, 2, 0.5),
        (5000, 2, 1.0),
    ] {
        let x: Vec<f32> = (0..len * rows).map(|_| lcg(&mut seed) * 3.0).collect();
        let y: Vec<f32> = (0..len * rows).map(|_| lcg(&mut seed) * 20.0).collect();
        let w: Vec<f32> = (0..len).map(|_| lcg(&mut seed) + 1.0).collect();
        let w2: Vec<f32> = (0..len).map(|_| lcg(&mut seed) + 1.0).collect();
        let eps = 1e-6f32;
        // The three ops.
        let (xb, yb, wb, w2b) = (buf(&ctx, &x), buf(&ctx, &y), buf(&ctx, &w), buf(&ctx, &w2));
        let (ob, hb) = (
            ctx.vector_buffer("o", len * rows),
            ctx.vector_buffer("h", len * rows),
        );
        let st = step(&ctx, 0, rows as u32);
        let p = params(&ctx, &[len as u32, eps.to_bits(), rows as u32, 0]);
        run(
            &ctx,
            "op_rms_norm",
            &[&yb, &wb, &ob, &p, &st],
            (rows as u32, 1, 1),
        );
        let n = (len * rows) as u32;
        let gx = n.div_ceil(256);
        let pa = params(&ctx, &[n, gx, s.to_bits(), 0]);
        run(&ctx, "op_add", &[&xb, &ob, &pa], (gx, 1, 1));
        run(
            &ctx,
            "op_rms_norm",
            &[&xb, &w2b, &hb, &p, &st],
            (rows as u32, 1, 1),
        );
        let (x3, h3) = (read(&ctx, &xb, len * rows), read(&ctx, &hb, len * rows));
        // The fused op, with and without the next norm.
        for next in [1u32, 0] {
            let xf = buf(&ctx, &x);
            let hf = buf(&ctx, &vec![7.0f32; len * rows]);
            let pf = params(
                &ctx,
                &[
                    len as u32,
                    eps.to_bits(),
                    rows as u32,
                    next,
                    s.to_bits(),
                    0,
                    0,
                    0,
                ],
            );
            run(
                &ctx,
                "op_rms_norm_add",
                &[&xf, &yb, &wb, &w2b, &hf, &pf],
                (rows as u32, 1, 1),
            );
            let (xg, hg) = (read(&ctx, &xf, len * rows), read(&ctx, &hf, len * rows));
            for i in 0..len * rows {
                assert_eq!(
                    xg[i].to_bits(),
                    x3[i].to_bits(),
                    "x at {i} (len {len}, next {next})"
                );
                if next == 1 {
                    assert_eq!(hg[i].to_bits(), h3[i].to_bits(), "h at {i} (len {len})");
                } else {
                    assert_eq!(hg[i], 7.0, "h written without next at {i}");
                }
            }
        }
        // Against the CPU: x + rms_norm(y) * s, then rms_norm of that.
        let tol = (len as f32 + 8.0) * f32::EPSILON;
        let mut wantx = x.clone();
        let mut wanth = vec![0f32; len * rows];
        let mut o = vec![0f32; len];
        for r in 0..rows {
            let rr = r * len..(r + 1) * len;
            cpu::rms_norm(&y[rr.clone()], &w, eps, &mut o);
            for (i, v) in o.iter().enumerate() {
                wantx[r * len + i] += v * s;
            }
            cpu::rms_norm(&wantx[rr.clone()], &w2, eps, &mut wanth[rr]);
        }
        let scale: Vec<f32> = x3.iter().map(|v| v.abs() + 20.0).collect();
        check("rms_norm_add x", &x3, &wantx, &scale, tol);
        // h against its row's largest value (an element of x near 0 after the add keeps the
        // absolute error of the add, not a relative one).
        let hscale: Vec<f32> = (0..len * rows)
            .map(|i| {
                let r = i / len;
                wanth[r * len..(r + 1) * len]
                    .iter()
                    .fold(0f32, |m, v| m.max(v.abs()))
            })
            .collect();
        check("rms_norm_add h", &h3, &wanth, &hscale, 4.0 * tol);
    }
}

#[test]
fn rope_rotates_with_the_cpu_table_norm_and_neox() {
    let Some(ctx) = ctx() else { return };
    let mut seed = 2u64;
    for (neox, heads, hd, n_rot, scale) in [
        (false, 3usize, 64usize, 64usize, 1.0f32),
        (true, 2, 128, 128, 0.0625),
        (true, 2, 64, 32, 1.0),
        (false, 1, 64, 48, 0.5),
    ] {
        let (n_ctx, tokens, pos0) = (40usize, 5usize, 30u32);
        let n = 4u32; // the fifth token is padding
        let factors: Vec<f32> = (0..n_rot / 2).map(|i| 1.0 + i as f32 * 0.25).collect();
        let mut table = vec![0f32; n_ctx * n_rot];
        for (pos, row) in table.chunks_exact_mut(n_rot).enumerate() {
            cpu::rope_cache(pos, n_rot, 10000.0, 0.5, 1.25, Some(&factors), row);
        }
        let x: Vec<f32> = (0..tokens * heads * hd).map(|_| lcg(&mut seed)).collect();
        let mut want = x.clone();
        for t in 0..n as usize {
            let pos = pos0 as usize + t;
            let cs = &table[pos * n_rot..(pos + 1) * n_rot];
            for h in 0..heads {
                let v = &mut want[(t * heads + h) * hd..(t * heads + h + 1) * hd];
                for i in 0..n_rot / 2 {
                    let (a, b) = if neox {
                        (i, i + n_rot / 2)
                    } else {
                        (2 * i, 2 * i + 1)
                    };
                    let (x0, x1) = (v[a], v[b]);
                    v[a] = x0 * cs[2 * i] - x1 * cs[2 * i + 1];
                    v[b] = x0 * cs[2 * i + 1] + x1 * cs[2 * i];
                }
                v.iter_mut().for_each(|e| *e *= scale);
            }
        }
        let xb = buf(&ctx, &x);
        let tb = buf(&ctx, &table);
        let p = params(
            &ctx,
            &[
                heads as u32,
                hd as u32,
                n_rot as u32,
                neox as u32,
                scale.to_bits(),
                tokens as u32,
                0,
                0,
            ],
        );
        let st = step(&ctx, pos0, n);
        run(
            &ctx,
            "op_rope",
            &[&xb, &tb, &p, &st],
            ((heads * hd / 2).div_ceil(64) as u32, tokens as u32, 1),
        );
        // Two products and a sum per element (a fused multiply-add may round once less).
        let got = read(&ctx, &xb, x.len());
        let mag: Vec<f32> = x.iter().map(|v| v.abs().max(1.0) * scale).collect();
        check("rope", &got, &want, &mag, 4.0 * f32::EPSILON);
    }
}

/// The fused RoPE + KV store (`op_rope_kv`, what a decode step runs instead of op_rope on Q,
/// op_rope on K and op_kv_store) against the CPU: Q rotated and scaled in place within the
/// rope test's tolerance; the cache holds the f16 of the CPU-rotated K within that tolerance
/// plus the f16 rounding, and the f16 of V bit for bit (round to nearest even); padding
/// tokens and the cache's other positions untouched; Q, K and V bound as the three parts of
/// one buffer, as the backend binds a stacked Q/K/V product's output.
#[test]
fn rope_kv_rotates_q_and_stores_the_rotated_k_and_v_like_the_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut seed = 12u64;
    for (neox, heads, kv_heads, hd, n_rot, q_scale) in [
        (false, 4usize, 2usize, 64usize, 64usize, 1.0f32),
        (true, 4, 1, 128, 128, 0.0625),
        (true, 2, 2, 64, 32, 1.0),
        (false, 2, 1, 64, 48, 0.5),
    ] {
        let (n_ctx, tokens, pos0) = (40usize, 5usize, 30u32);
        let n = 4u32; // the fifth token is padding
        let factors: Vec<f32> = (0..n_rot / 2).map(|i| 1.0 + i as f32 * 0.25).collect();
        let mut table = vec![0f32; n_ctx * n_rot];
        for (pos, row) in table.chunks_exact_mut(n_rot).enumerate() {
            cpu::rope_cache(pos, n_rot, 10000.0, 0.5, 1.25, Some(&factors), row);
        }
        let (nq, nk) = (heads * hd, kv_heads * hd);
        let qkv: Vec<f32> = (0..tokens * (nq + 2 * nk))
            .map(|_| lcg(&mut seed))
            .collect();
        let (q, rest) = qkv.split_at(tokens * nq);
        let (k, v) = rest.split_at(tokens * nk);
        // The CPU: rotate (NORM or NEOX pairs), scale.
        let rotate = |x: &[f32], nheads: usize, scale: f32| {
            let mut out = x.to_vec();
            for t in 0..n as usize {
                let pos = pos0 as usize + t;
                let cs = &table[pos * n_rot..(pos + 1) * n_rot];
                for h in 0..nheads {
                    let o = &mut out[(t * nheads + h) * hd..(t * nheads + h + 1) * hd];
                    for i in 0..n_rot / 2 {
                        let (a, b) = if neox {
                            (i, i + n_rot / 2)
                        } else {
                            (2 * i, 2 * i + 1)
                        };
                        let (x0, x1) = (o[a], o[b]);
                        o[a] = x0 * cs[2 * i] - x1 * cs[2 * i + 1];
                        o[b] = x0 * cs[2 * i + 1] + x1 * cs[2 * i];
                    }
                    o.iter_mut().for_each(|e| *e *= scale);
                }
            }
            out
        };
        let want_q = rotate(q, heads, q_scale);
        let want_k = rotate(k, kv_heads, 1.0);
        let qkv_b = buf(&ctx, &qkv);
        let part = |off: usize, len: usize| {
            ctx.view(&qkv_b, (off * 4) as u64, (len * 4) as u64)
                .expect("parts at multiples of 256 bytes")
        };
        let (qv, kv, vv) = (
            part(0, tokens * nq),
            part(tokens * nq, tokens * nk),
            part(tokens * (nq + nk), tokens * nk),
        );
        let tb = buf(&ctx, &table);
        let cache = vec![0x7e007e00u32; kv_heads * n_ctx * hd / 2];
        let (kc, vc) = (u32buf(&ctx, &cache), u32buf(&ctx, &cache));
        let p = params(
            &ctx,
            &[
                heads as u32,
                kv_heads as u32,
                hd as u32,
                n_rot as u32,
                neox as u32,
                q_scale.to_bits(),
                n_ctx as u32,
                0,
            ],
        );
        let st = step(&ctx, pos0, n);
        run(
            &ctx,
            "op_rope_kv",
            &[&qv, &kv, &vv, &tb, &kc, &vc, &p, &st],
            (
                ((heads + kv_heads) * hd / 2).div_ceil(64) as u32,
                tokens as u32,
                1,
            ),
        );
        let what = format!("rope_kv neox={neox} heads={heads}/{kv_heads} hd={hd} n_rot={n_rot}");
        let got = read(&ctx, &qkv_b, qkv.len());
        let mag: Vec<f32> = q.iter().map(|v| v.abs().max(1.0) * q_scale).collect();
        check(&what, &got[..q.len()], &want_q, &mag, 4.0 * f32::EPSILON);
        // K and V themselves are left as they were.
        assert_eq!(&got[q.len()..], rest, "{what}: k or v written");
        let (kc, vc) = (
            read_u32(&ctx, &kc, cache.len()),
            read_u32(&ctx, &vc, cache.len()),
        );
        let f16_at = |c: &[u32], h: usize, pos: usize, e: usize| {
            half::f16::from_bits((c[(h * n_ctx + pos) * hd / 2 + e / 2] >> ((e % 2) * 16)) as u16)
        };
        for h in 0..kv_heads {
            for pos in 0..n_ctx {
                let t = pos as i64 - pos0 as i64;
                for e in 0..hd {
                    let (gk, gv) = (f16_at(&kc, h, pos, e), f16_at(&vc, h, pos, e));
                    if t < 0 || t >= n as i64 {
                        assert_eq!(
                            (gk.to_bits(), gv.to_bits()),
                            (0x7e00, 0x7e00),
                            "{what}: position {pos} written"
                        );
                        continue;
                    }
                    let i = (t as usize * kv_heads + h) * hd + e;
                    assert_eq!(
                        gv.to_bits(),
                        half::f16::from_f32(v[i]).to_bits(),
                        "{what}: v head {h} pos {pos} dim {e}"
                    );
                    // The f16 of a value within the rope tolerance of the CPU's.
                    let w = want_k[i];
                    let tol = 4.0 * f32::EPSILON * k[i].abs().max(1.0)
                        + w.abs() * 2f32.powi(-11) * 1.01
                        + 2f32.powi(-24);
                    assert!(
                        (gk.to_f32() - w).abs() <= tol,
                        "{what}: k head {h} pos {pos} dim {e}: gpu {gk} cpu {w}"
                    );
                }
            }
        }
    }
}

/// The decode attention with RoPE and the KV store folded in (`op_attention_decode`, what a
/// decode step runs where subgroups hold its clusters) against what it replaces: op_rope_kv,
/// then op_attention, each with the combine. RoPE tables with LongRoPE factors, NORM and
/// NEOX pairs, a partial rotation, Gemma's Q scale; a cache filled for the earlier positions.
/// The outputs agree within the attention tolerance, and both caches come out bit for bit
/// the same (the token's key rotated and rounded, its value rounded, every other row as it
/// was).
#[test]
fn decode_attention_folds_rope_and_the_kv_store() {
    let Some(ctx) = ctx() else { return };
    if !ctx.subgroup_ops(ops::DECODE_ATTENTION_LANES) || !ctx.has_f16_in_f32() {
        eprintln!(
            "note: no subgroups of {} or more or no unpack2x16float here: op_attention_decode not run",
            ops::DECODE_ATTENTION_LANES
        );
        return;
    }
    let mut seed = 21u64;
    for (neox, heads, kv_heads, hd, n_rot, q_scale, window, pos0) in [
        (
            false, 32usize, 2usize, 128usize, 128usize, 1.0f32, 0usize, 150usize,
        ),
        (true, 4, 1, 256, 256, 0.0625, 0, 255),
        (true, 9, 3, 64, 64, 1.0, 0, 0),
        (false, 4, 2, 64, 48, 0.5, 40, 77),
        // one split of 256: its positions in tiles of 16, the token's own in the last
        (false, 8, 2, 128, 128, 1.0, 0, 200),
        // head_dim 96: 12 words a row, 5 value groups, 4 invocations idle; the token's own
        // position first in its tile (position 64 of splits of 32)
        (false, 4, 2, 96, 96, 1.0, 0, 64),
        // head_dim 80 (10 words, a partial rotation) and 16 (2 words: fewer than a cluster's
        // 4 lanes)
        (true, 6, 3, 80, 64, 1.0, 0, 130),
        (false, 2, 1, 16, 16, 1.0, 0, 33),
    ] {
        let (n_ctx, splits) = (256usize, if pos0 == 200 { 1 } else { 4 });
        let chunk = n_ctx.div_ceil(splits);
        let factors: Vec<f32> = (0..n_rot / 2).map(|i| 1.0 + i as f32 * 0.25).collect();
        let mut table = vec![0f32; n_ctx * n_rot];
        for (pos, row) in table.chunks_exact_mut(n_rot).enumerate() {
            cpu::rope_cache(pos, n_rot, 10000.0, 0.5, 1.25, Some(&factors), row);
        }
        let tb = buf(&ctx, &table);
        let (nq, nk) = (heads * hd, kv_heads * hd);
        // Earlier positions' keys and values, stored as they are.
        let old_k: Vec<f32> = (0..pos0.max(1) * nk)
            .map(|_| lcg(&mut seed) * 2.0)
            .collect();
        let old_v: Vec<f32> = (0..pos0.max(1) * nk).map(|_| lcg(&mut seed)).collect();
        let cache = |seed: &mut u64| {
            let fill: Vec<u32> = (0..kv_heads * n_ctx * hd / 2)
                .map(|_| 0x3c003c00 ^ (lcg_u32(seed) & 0x03ff03ff))
                .collect();
            let (kc, vc) = (u32buf(&ctx, &fill), u32buf(&ctx, &fill));
            if pos0 > 0 {
                let p = params(&ctx, &[kv_heads as u32, hd as u32, n_ctx as u32, 0]);
                let (kb, vb) = (buf(&ctx, &old_k), buf(&ctx, &old_v));
                run(
                    &ctx,
                    "op_kv_store",
                    &[&kb, &vb, &kc, &vc, &p, &step(&ctx, 0, pos0 as u32)],
                    ((kv_heads * hd / 2).div_ceil(64) as u32, pos0 as u32, 1),
                );
            }
            (kc, vc)
        };
        let mut s1 = seed;
        let (kc_a, vc_a) = cache(&mut s1);
        let mut s2 = seed;
        let (kc_b, vc_b) = cache(&mut s2);
        seed = s1;
        let q: Vec<f32> = (0..nq).map(|_| lcg(&mut seed)).collect();
        let k: Vec<f32> = (0..nk).map(|_| lcg(&mut seed) * 2.0).collect();
        let v: Vec<f32> = (0..nk).map(|_| lcg(&mut seed)).collect();
        let st = step(&ctx, pos0 as u32, 1);
        let kq_scale = 1.0 / (hd as f32).sqrt();
        let attn_params = |grain: u32| {
            params(
                &ctx,
                &[
                    heads as u32,
                    kv_heads as u32,
                    hd as u32,
                    n_ctx as u32,
                    splits as u32,
                    chunk as u32,
                    window as u32,
                    kq_scale.to_bits(),
                    grain,
                    n_rot as u32,
                    neox as u32,
                    q_scale.to_bits(),
                ],
            )
        };
        let combine = |part: &wgpu::Buffer, grain: u32| {
            let out = ctx.vector_buffer("out", nq);
            let p = params(
                &ctx,
                &[
                    heads as u32,
                    hd as u32,
                    splits as u32,
                    chunk as u32,
                    grain,
                    0,
                    0,
                    0,
                ],
            );
            run(
                &ctx,
                "op_attention_combine",
                &[part, &out, &p, &st],
                (heads as u32, 1, 1),
            );
            read(&ctx, &out, nq)
        };
        // A: op_rope_kv (Q rotated in place, K and V stored), op_attention, the combine.
        let (qa, ka, va) = (buf(&ctx, &q), buf(&ctx, &k), buf(&ctx, &v));
        let pr = params(
            &ctx,
            &[
                heads as u32,
                kv_heads as u32,
                hd as u32,
                n_rot as u32,
                neox as u32,
                q_scale.to_bits(),
                n_ctx as u32,
                0,
            ],
        );
        run(
            &ctx,
            "op_rope_kv",
            &[&qa, &ka, &va, &tb, &kc_a, &vc_a, &pr, &st],
            (((heads + kv_heads) * hd / 2).div_ceil(64) as u32, 1, 1),
        );
        let part_a = ctx.vector_buffer("part", heads * splits * (hd + 2));
        run(
            &ctx,
            "op_attention",
            &[&qa, &kc_a, &vc_a, &part_a, &attn_params(0), &st],
            (heads as u32, splits as u32, 1),
        );
        let want = combine(&part_a, 0);
        // B: the folded kernel on the unrotated Q, K and V.
        let (qb, kb, vb) = (buf(&ctx, &q), buf(&ctx, &k), buf(&ctx, &v));
        let part_b = ctx.vector_buffer("part", heads * splits * (hd + 2));
        run(
            &ctx,
            "op_attention_decode",
            &[
                &qb,
                &kb,
                &vb,
                &tb,
                &kc_b,
                &vc_b,
                &part_b,
                &attn_params(ops::DECODE_SPLIT_GRAIN),
                &st,
            ],
            (heads as u32, splits as u32, 1),
        );
        let got = combine(&part_b, ops::DECODE_SPLIT_GRAIN);
        let what = format!(
            "decode attention neox={neox} h{heads}/{kv_heads} hd{hd} n_rot {n_rot} q_scale {q_scale} window {window} pos {pos0}"
        );
        let n = kv_heads * n_ctx * hd / 2;
        assert!(
            read_u32(&ctx, &kc_a, n) == read_u32(&ctx, &kc_b, n),
            "{what}: K caches differ"
        );
        assert!(
            read_u32(&ctx, &vc_a, n) == read_u32(&ctx, &vc_b, n),
            "{what}: V caches differ"
        );
        let tol = (hd as f32 + (pos0 + 1) as f32) * 4.0 * f32::EPSILON;
        check(&what, &got, &want, &vec![1.0; nq], tol);
    }
}

/// The decode attention with its combine done by the last workgroup of each block
/// (`op_attention_decode_combine_q8`) against what it replaces: `op_attention_decode`, then
/// `op_attention_combine_q8`, on the same inputs. The partials, both caches, the merged
/// values and the int8 x come out bit for bit the same, and every count is back at 0 after
/// each dispatch (the next layer's dispatch reuses them: here the same counts serve three
/// dispatches in a row at different positions). Head dims 64, 96 (blocks that straddle
/// heads: a workgroup may merge two), 128 (the 8B shape's 32 heads over 2 KV heads) and 256;
/// splits with and without positions; a sliding window.
#[test]
fn decode_attention_merges_in_its_last_workgroup() {
    use lowbit::runtime::gpu::kernels::{ATTENTION_COMBINE_Q8, COMBINE_Q8};
    let Some(ctx) = ctx() else { return };
    if !ctx.subgroup_ops(ops::DECODE_ATTENTION_LANES)
        || !ctx.has_f16_in_f32()
        || !ctx.merges_decode_attention()
    {
        eprintln!(
            "note: no subgroups of {} or more, no unpack2x16float, or not a Vulkan adapter with \
             MEMORY_DECORATION_COHERENT and 10 storage bindings here: {ATTENTION_COMBINE_Q8} not run",
            ops::DECODE_ATTENTION_LANES
        );
        return;
    }
    let mut seed = 77u64;
    // (heads, kv_heads, head_dim, n_ctx, splits, window, positions)
    for (heads, kv_heads, hd, n_ctx, splits, window, positions) in [
        (
            32usize,
            2usize,
            128usize,
            1024usize,
            64usize,
            0usize,
            [512u32, 3, 700],
        ),
        (4, 1, 64, 256, 8, 0, [100, 0, 255]),
        (8, 2, 96, 256, 4, 0, [64, 200, 1]),
        (2, 1, 256, 128, 2, 0, [127, 40, 64]),
        (4, 2, 64, 256, 8, 48, [150, 30, 255]),
    ] {
        let chunk = n_ctx.div_ceil(splits);
        let (nq, nk) = (heads * hd, kv_heads * hd);
        let n_rot = hd;
        let mut table = vec![0f32; n_ctx * n_rot];
        for (pos, row) in table.chunks_exact_mut(n_rot).enumerate() {
            cpu::rope_cache(pos, n_rot, 10000.0, 1.0, 1.0, None, row);
        }
        let tb = buf(&ctx, &table);
        // Both caches start from the same random f16 rows.
        let fill: Vec<u32> = (0..kv_heads * n_ctx * hd / 2)
            .map(|_| 0x3c003c00 ^ (lcg_u32(&mut seed) & 0x03ff03ff))
            .collect();
        let (kc_a, vc_a) = (u32buf(&ctx, &fill), u32buf(&ctx, &fill));
        let (kc_b, vc_b) = (u32buf(&ctx, &fill), u32buf(&ctx, &fill));
        let blocks = nq / 256;
        let done = u32buf(&ctx, &vec![0u32; blocks]);
        let kq_scale = 1.0 / (hd as f32).sqrt();
        for pos in positions {
            let grain = ops::DECODE_SPLIT_GRAIN;
            let what =
                format!("h{heads}/{kv_heads} hd{hd} splits {splits} window {window} pos {pos}");
            let st = step(&ctx, pos, 1);
            let ap = params(
                &ctx,
                &[
                    heads as u32,
                    kv_heads as u32,
                    hd as u32,
                    n_ctx as u32,
                    splits as u32,
                    chunk as u32,
                    window as u32,
                    kq_scale.to_bits(),
                    grain,
                    n_rot as u32,
                    0,
                    1f32.to_bits(),
                ],
            );
            let cp = params(
                &ctx,
                &[
                    heads as u32,
                    hd as u32,
                    splits as u32,
                    chunk as u32,
                    grain,
                    0,
                    0,
                    0,
                ],
            );
            let q: Vec<f32> = (0..nq).map(|_| lcg(&mut seed)).collect();
            let k: Vec<f32> = (0..nk).map(|_| lcg(&mut seed) * 2.0).collect();
            let v: Vec<f32> = (0..nk).map(|_| lcg(&mut seed)).collect();
            let (qb, kb, vb) = (buf(&ctx, &q), buf(&ctx, &k), buf(&ctx, &v));
            let xq_len = (nq + nq / 8) / 4;
            // A: the attention, then the combine.
            let part_a = ctx.vector_buffer("part a", heads * splits * (hd + 2));
            let (out_a, xq_a) = (
                ctx.vector_buffer("out a", nq),
                ctx.vector_buffer("xq a", xq_len),
            );
            run(
                &ctx,
                "op_attention_decode",
                &[&qb, &kb, &vb, &tb, &kc_a, &vc_a, &part_a, &ap, &st],
                (heads as u32, splits as u32, 1),
            );
            run(
                &ctx,
                COMBINE_Q8,
                &[&part_a, &out_a, &xq_a, &cp, &st],
                (blocks as u32, 1, 1),
            );
            // B: one dispatch.
            let part_b = ctx.vector_buffer("part b", heads * splits * (hd + 2));
            let (out_b, xq_b) = (
                ctx.vector_buffer("out b", nq),
                ctx.vector_buffer("xq b", xq_len),
            );
            run(
                &ctx,
                ATTENTION_COMBINE_Q8,
                &[
                    &qb, &kb, &vb, &tb, &kc_b, &vc_b, &part_b, &ap, &st, &out_b, &xq_b, &done,
                ],
                (heads as u32, splits as u32, 1),
            );
            let n = kv_heads * n_ctx * hd / 2;
            assert!(
                read_u32(&ctx, &kc_a, n) == read_u32(&ctx, &kc_b, n),
                "{what}: K caches"
            );
            assert!(
                read_u32(&ctx, &vc_a, n) == read_u32(&ctx, &vc_b, n),
                "{what}: V caches"
            );
            let np = heads * splits * (hd + 2);
            let bits = |b: &wgpu::Buffer, n: usize| -> Vec<u32> {
                read(&ctx, b, n).iter().map(|v| v.to_bits()).collect()
            };
            assert!(bits(&part_a, np) == bits(&part_b, np), "{what}: partials");
            let (a, b) = (bits(&out_a, nq), bits(&out_b, nq));
            let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
            assert_eq!(differ, 0, "{what}: {differ} of {nq} merged values differ");
            assert_eq!(
                read_u32(&ctx, &xq_a, xq_len),
                read_u32(&ctx, &xq_b, xq_len),
                "{what}: int8 x"
            );
            assert_eq!(
                read_u32(&ctx, &done, blocks),
                vec![0u32; blocks],
                "{what}: counts"
            );
            assert!(
                read(&ctx, &out_b, nq).iter().any(|v| v.abs() > 1e-3),
                "{what}"
            );
        }
    }
}

/// Attention of `tokens` queries at `pos0..` over a cache filled for positions
/// `0..pos0 + n`, against an f64 softmax over the same f16-rounded keys and values.
#[allow(clippy::too_many_arguments)]
fn attention_case(
    ctx: &GpuContext,
    heads: usize,
    kv_heads: usize,
    hd: usize,
    n_ctx: usize,
    pos0: usize,
    n: usize,
    splits: usize,
    window: usize,
    seed: &mut u64,
) {
    let total = pos0 + n;
    let kv: Vec<f32> = (0..total * kv_heads * hd)
        .map(|_| lcg(seed) * 2.0)
        .collect();
    let vv: Vec<f32> = (0..total * kv_heads * hd).map(|_| lcg(seed)).collect();
    // Fill the cache with kv_store one chunk (all positions) at a time.
    let kc = ctx.vector_buffer("kc", kv_heads * n_ctx * hd / 2);
    let vc = ctx.vector_buffer("vc", kv_heads * n_ctx * hd / 2);
    let (kb, vb) = (buf(ctx, &kv), buf(ctx, &vv));
    let p = params(ctx, &[kv_heads as u32, hd as u32, n_ctx as u32, 0]);
    let st = step(ctx, 0, total as u32);
    run(
        ctx,
        "op_kv_store",
        &[&kb, &vb, &kc, &vc, &p, &st],
        ((kv_heads * hd / 2).div_ceil(64) as u32, total as u32, 1),
    );
    let q: Vec<f32> = (0..n * heads * hd).map(|_| lcg(seed)).collect();
    let chunk = n_ctx.div_ceil(splits);
    let part = ctx.vector_buffer("part", n * heads * splits * (hd + 2));
    let out = ctx.vector_buffer("out", n * heads * hd);
    let qb = buf(ctx, &q);
    let kq_scale = 1.0 / (hd as f32).sqrt();
    let st = step(ctx, pos0 as u32, n as u32);
    // op_attention and every grouped (prefill) variant whose group divides heads / kv_heads:
    // each head's result against the reference below (one workgroup takes `g` heads of one
    // KV head).
    let per_kv = heads / kv_heads;
    let groups: Vec<usize> = (1..=ops::MAX_ATTENTION_GROUP)
        .filter(|&g| per_kv.is_multiple_of(g))
        .collect();
    assert_eq!(
        *groups.last().unwrap(),
        ops::attention_group(heads, kv_heads)
    );
    // (kernel, heads per workgroup, split grain): op_attention_decode too where it runs.
    let mut kernels: Vec<(&'static str, usize, u32)> = groups
        .iter()
        .map(|&g| (ops::attention_name(g), g, 0))
        .collect();
    // op_attention_decode (one token; RoPE folded in, here an identity table: cos 1, sin 0,
    // which leaves every value as it is; its own key and value from k and v, the cache row
    // of its position rewritten with the same bits).
    if !ctx.subgroup_ops(ops::DECODE_ATTENTION_LANES) || !ctx.has_f16_in_f32() {
        eprintln!(
            "note: no subgroups of {} or more or no unpack2x16float here: op_attention_decode not run",
            ops::DECODE_ATTENTION_LANES
        );
    } else if n == 1 {
        kernels.push(("op_attention_decode", 1, ops::DECODE_SPLIT_GRAIN));
    }
    // The tiled prefill attention (group 0 here) where it runs, for any token count.
    match ctx.attention_tile(hd) {
        Some(name) => kernels.push((name, 0, 0)),
        None => eprintln!("note: no tiled attention for head_dim {hd} here: not run"),
    }
    let fresh = |x: &[f32]| buf(ctx, &x[pos0 * kv_heads * hd..(pos0 + 1) * kv_heads * hd]);
    let (kf, vf) = (fresh(&kv), fresh(&vv));
    let identity = buf(ctx, &[1.0, 0.0].repeat(n_ctx * hd / 2));
    let outs: Vec<(&'static str, Vec<f32>)> = kernels
        .iter()
        .map(|&(name, g, grain)| {
            let p = params(
                ctx,
                &[
                    heads as u32,
                    kv_heads as u32,
                    hd as u32,
                    n_ctx as u32,
                    splits as u32,
                    chunk as u32,
                    window as u32,
                    kq_scale.to_bits(),
                    grain,
                    hd as u32,
                    0,
                    1f32.to_bits(),
                ],
            );
            if name == "op_attention_decode" {
                run(
                    ctx,
                    name,
                    &[&qb, &kf, &vf, &identity, &kc, &vc, &part, &p, &st],
                    (heads as u32, splits as u32, 1),
                );
            } else {
                // g == 0: the tiled kernel's grid.
                let grid = match heads.checked_div(g) {
                    Some(per_group) => (per_group as u32, splits as u32, n as u32),
                    None => (
                        ops::attention_tile_workgroups(n, heads, kv_heads, hd) as u32,
                        splits as u32,
                        kv_heads as u32,
                    ),
                };
                run(ctx, name, &[&qb, &kc, &vc, &part, &p, &st], grid);
            }
            // chunk: the combine reads only the splits up to each token's position (with a
            // grain, of the position-dependent size).
            let p2 = params(
                ctx,
                &[
                    heads as u32,
                    hd as u32,
                    splits as u32,
                    chunk as u32,
                    grain,
                    0,
                    0,
                    0,
                ],
            );
            run(
                ctx,
                "op_attention_combine",
                &[&part, &out, &p2, &st],
                (heads as u32, n as u32, 1),
            );
            let got = read(ctx, &out, n * heads * hd);
            // Clear the partials so that a variant that skipped a head cannot pass on the
            // previous variant's values.
            let nans = buf(ctx, &vec![f32::NAN; n * heads * splits * (hd + 2)]);
            let mut enc = ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            enc.copy_buffer_to_buffer(&nans, 0, &part, 0, part.size());
            ctx.queue.submit([enc.finish()]);
            (name, got)
        })
        .collect();
    let r16 = |x: f32| half::f16::from_f32(x).to_f32() as f64;
    let group = heads / kv_heads;
    let mut want = vec![0f32; n * heads * hd];
    let mut mag = vec![0f32; n * heads * hd];
    for t in 0..n {
        let pos = pos0 + t;
        let lo = if window > 0 {
            (pos + 1).saturating_sub(window)
        } else {
            0
        };
        for h in 0..heads {
            let kh = h / group;
            let qh = &q[(t * heads + h) * hd..(t * heads + h + 1) * hd];
            let scores: Vec<f64> = (lo..=pos)
                .map(|j| {
                    let kr = &kv[(j * kv_heads + kh) * hd..(j * kv_heads + kh + 1) * hd];
                    qh.iter()
                        .zip(kr)
                        .map(|(a, b)| *a as f64 * r16(*b))
                        .sum::<f64>()
                        * kq_scale as f64
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let sum: f64 = w.iter().sum();
            for d in 0..hd {
                let mut acc = 0f64;
                let mut am = 0f64;
                for (j, wj) in (lo..=pos).zip(&w) {
                    let x = r16(vv[(j * kv_heads + kh) * hd + d]);
                    acc += wj * x;
                    am = am.max(x.abs());
                }
                want[(t * heads + h) * hd + d] = (acc / sum) as f32;
                mag[(t * heads + h) * hd + d] = am as f32;
            }
        }
    }
    // Scores of hd terms, exp, and a weighted sum: relative to the largest |v|, errors of a
    // few hundred ulps at these sizes (the softmax amplifies a score error e by e * |v|).
    let tol = (hd as f32 + (total as f32)) * 4.0 * f32::EPSILON;
    // The grouped kernels do each head's arithmetic in the same order as op_attention: print
    // how far they are from it (0 where the compiler contracts both alike).
    // (op_attention_decode sums in another order: its distance is printed too.)
    for (name, got) in &outs[1..] {
        let d = got
            .iter()
            .zip(&outs[0].1)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!("{name} against op_attention: max |diff| {d:e}");
    }
    for (name, got) in &outs {
        check(
            &format!("{name} h{heads}/{kv_heads} hd{hd} pos0 {pos0} n {n} splits {splits} window {window}"),
            got,
            &want,
            &mag,
            tol,
        );
    }
}

#[test]
fn split_attention_matches_an_f64_softmax() {
    let Some(ctx) = ctx() else { return };
    let mut seed = 3u64;
    // decode over a long range with many splits, GQA
    attention_case(&ctx, 16, 2, 64, 600, 517, 1, 8, 0, &mut seed);
    // a prefill chunk with causal masking inside it, one split
    attention_case(&ctx, 2, 1, 128, 64, 0, 20, 1, 0, &mut seed);
    // decode with the decode graph's split count for a 8192-position context (128 splits of
    // 64 positions, as `attention_splits` gives), GQA, head_dim 128 (MiniCPM4)
    attention_case(&ctx, 4, 2, 128, 8192, 700, 1, 128, 0, &mut seed);
    // a sliding window, head_dim 256 (Gemma 3)
    attention_case(&ctx, 4, 1, 256, 300, 200, 3, 4, 64, &mut seed);
    // SmolLM2's 9 query heads over 3 KV heads (groups of 3), a prefill chunk over two splits
    attention_case(&ctx, 9, 3, 64, 96, 40, 5, 2, 0, &mut seed);
    // The decode graph of the 8B shape (64 splits of 64 over 4096 positions): the first
    // position, two where op_attention_decode's splits hold 32 positions each (two tiles of
    // 16; the last split partial, its last tile partial with the token's own position inside
    // it), and the last, where they hold the full 64
    attention_case(&ctx, 32, 2, 128, 4096, 0, 1, 64, 0, &mut seed);
    attention_case(&ctx, 32, 2, 128, 4096, 515, 1, 64, 0, &mut seed);
    attention_case(&ctx, 32, 2, 128, 4096, 520, 1, 64, 0, &mut seed);
    attention_case(&ctx, 4, 2, 128, 4096, 4095, 1, 64, 0, &mut seed);
    // decode with a sliding window that starts inside a split, head_dim 256 and 64
    attention_case(&ctx, 4, 1, 256, 1024, 700, 1, 16, 100, &mut seed);
    attention_case(&ctx, 9, 3, 64, 2048, 1500, 1, 32, 0, &mut seed);
    // splits of many tiles (op_attention_decode's are 456 positions here, as in a context
    // past 8192 with 128 splits): the online softmax across tiles
    attention_case(&ctx, 4, 2, 64, 2048, 1800, 1, 4, 0, &mut seed);
}

/// An overflowed value (inf in the f16 cache) at the chunk's last position reaches only the
/// rows that attend to it: the tiled attention runs the earlier tokens' rows over that
/// position too (one workgroup holds several tokens) and must skip it there, as
/// `op_attention` (one workgroup per token and head) never reads it.
#[test]
fn tiled_attention_keeps_an_inf_value_to_the_rows_that_attend_to_it() {
    let Some(ctx) = ctx() else { return };
    let (heads, kv_heads, hd, n_ctx, n) = (4usize, 2usize, 64usize, 64usize, 20usize);
    let Some(tile) = ctx.attention_tile(hd) else {
        eprintln!("note: no tiled attention here: not run");
        return;
    };
    let mut seed = 6u64;
    let kv: Vec<f32> = (0..n * kv_heads * hd).map(|_| lcg(&mut seed)).collect();
    let mut vv: Vec<f32> = (0..n * kv_heads * hd).map(|_| lcg(&mut seed)).collect();
    for x in &mut vv[(n - 1) * kv_heads * hd..] {
        *x = 1e6; // past f16's largest finite value: stored as inf
    }
    let kc = ctx.vector_buffer("kc", kv_heads * n_ctx * hd / 2);
    let vc = ctx.vector_buffer("vc", kv_heads * n_ctx * hd / 2);
    let (kb, vb) = (buf(&ctx, &kv), buf(&ctx, &vv));
    let p = params(&ctx, &[kv_heads as u32, hd as u32, n_ctx as u32, 0]);
    let st = step(&ctx, 0, n as u32);
    run(
        &ctx,
        "op_kv_store",
        &[&kb, &vb, &kc, &vc, &p, &st],
        ((kv_heads * hd / 2).div_ceil(64) as u32, n as u32, 1),
    );
    let q: Vec<f32> = (0..n * heads * hd).map(|_| lcg(&mut seed)).collect();
    let qb = buf(&ctx, &q);
    let part = ctx.vector_buffer("part", n * heads * (hd + 2));
    let out = ctx.vector_buffer("out", n * heads * hd);
    let kq = (1.0 / (hd as f32).sqrt()).to_bits();
    let pa = params(
        &ctx,
        &[
            heads as u32,
            kv_heads as u32,
            hd as u32,
            n_ctx as u32,
            1,
            n_ctx as u32,
            0,
            kq,
        ],
    );
    let pc = params(
        &ctx,
        &[heads as u32, hd as u32, 1, n_ctx as u32, 0, 0, 0, 0],
    );
    let mut outs = Vec::new();
    for (name, grid) in [
        ("op_attention", (heads as u32, 1, n as u32)),
        (
            tile,
            (
                ops::attention_tile_workgroups(n, heads, kv_heads, hd) as u32,
                1,
                kv_heads as u32,
            ),
        ),
    ] {
        run(&ctx, name, &[&qb, &kc, &vc, &part, &pa, &st], grid);
        run(
            &ctx,
            "op_attention_combine",
            &[&part, &out, &pc, &st],
            (heads as u32, n as u32, 1),
        );
        outs.push(read(&ctx, &out, n * heads * hd));
    }
    let (want, got) = (&outs[0], &outs[1]);
    let earlier = (n - 1) * heads * hd;
    assert!(want[..earlier].iter().all(|x| x.is_finite()));
    assert!(
        got[..earlier].iter().all(|x| x.is_finite()),
        "{tile}: an earlier token's row took the inf of a later position"
    );
    let d = got[..earlier]
        .iter()
        .zip(&want[..earlier])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(d < 1e-5, "{tile} against op_attention: {d}");
    // The last token attends to its own position: not finite with either kernel.
    assert!(want[earlier..].iter().all(|x| !x.is_finite()));
    assert!(got[earlier..].iter().all(|x| !x.is_finite()), "{tile}");
}

/// Prefill chunks as the tiled attention takes them: rows of several tokens in one
/// workgroup with their own causal ends, rows past the chunk's last token, groups that do not
/// divide a workgroup's rows (Qwen2.5's 7 heads a KV head), splits a row has no position in,
/// tiles cut by a split's end and by a sliding window.
#[test]
fn prefill_attention_in_tiles_matches_an_f64_softmax() {
    let Some(ctx) = ctx() else { return };
    let mut seed = 5u64;
    // the 8B shape: 16 query heads a KV head, head_dim 128 (2 tokens a workgroup), a chunk
    // at position 300 over splits of 128 positions
    attention_case(&ctx, 32, 2, 128, 1024, 300, 37, 8, 0, &mut seed);
    // Qwen2.5: 7 heads a KV head, head_dim 64 (64 rows: 9.1 tokens a workgroup)
    attention_case(&ctx, 14, 2, 64, 512, 45, 29, 4, 0, &mut seed);
    // SmolLM2: 3 heads a KV head, from position 0 (the first tile partial)
    attention_case(&ctx, 9, 3, 64, 256, 0, 64, 2, 0, &mut seed);
    // Gemma 3: head_dim 256 (16 rows a workgroup, tiles of 16), a sliding window of 40
    // that starts inside tiles and splits
    attention_case(&ctx, 4, 1, 256, 512, 100, 50, 4, 40, &mut seed);
    // one query head per KV head (no grouping), head_dim 128
    attention_case(&ctx, 2, 2, 128, 128, 10, 16, 1, 0, &mut seed);
}

#[test]
fn activations_and_adds_match_the_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut seed = 4u64;
    let n = 5000usize;
    let g: Vec<f32> = (0..n).map(|_| lcg(&mut seed) * 14.0).collect();
    let u: Vec<f32> = (0..n).map(|_| lcg(&mut seed) * 2.0).collect();
    let (gx, gy) = lowbit::runtime::gpu::ops::grid_1d(n, 256).unwrap();
    let p = params(&ctx, &[n as u32, gx, 0, 0]);
    // GeGLU: the same table and f16 rounding: bit for bit.
    let table = cpu::gelu_table();
    let tb = ctx
        .upload_bytes("gelu", bytemuck::cast_slice(table))
        .unwrap();
    let (gb, ub) = (buf(&ctx, &g), buf(&ctx, &u));
    run(&ctx, "op_geglu", &[&gb, &ub, &tb, &p], (gx, gy, 1));
    let got = read(&ctx, &gb, n);
    for i in 0..n {
        assert_eq!(
            got[i].to_bits(),
            cpu::geglu(g[i], u[i], table).to_bits(),
            "geglu({}, {})",
            g[i],
            u[i]
        );
    }
    // SwiGLU: exp differs by a few ulps between libm and the GPU.
    let gb = buf(&ctx, &g);
    run(&ctx, "op_swiglu", &[&gb, &ub, &p], (gx, gy, 1));
    let want: Vec<f32> = g.iter().zip(&u).map(|(a, b)| cpu::silu(*a) * b).collect();
    check(
        "swiglu",
        &read(&ctx, &gb, n),
        &want,
        &want,
        8.0 * f32::EPSILON,
    );
    // add with a scale, bias over rows, scale with a soft cap.
    let gb = buf(&ctx, &g);
    let p = params(&ctx, &[n as u32, gx, 0.5f32.to_bits(), 0]);
    run(&ctx, "op_add", &[&gb, &ub, &p], (gx, gy, 1));
    let want: Vec<f32> = g.iter().zip(&u).map(|(a, b)| a + b * 0.5).collect();
    check("add", &read(&ctx, &gb, n), &want, &want, f32::EPSILON);
    let gb = buf(&ctx, &g);
    let b: Vec<f32> = (0..100).map(|_| lcg(&mut seed)).collect();
    let bb = buf(&ctx, &b);
    let p = params(&ctx, &[n as u32, gx, 100, 0]);
    run(&ctx, "op_bias_add", &[&gb, &bb, &p], (gx, gy, 1));
    let got = read(&ctx, &gb, n);
    for i in 0..n {
        assert_eq!(got[i], g[i] + b[i % 100], "bias at {i}");
    }
    let gb = buf(&ctx, &g);
    let p = params(&ctx, &[n as u32, gx, 2.0f32.to_bits(), 5.0f32.to_bits()]);
    run(&ctx, "op_scale", &[&gb, &p], (gx, gy, 1));
    let want: Vec<f32> = g.iter().map(|a| (a * 2.0 / 5.0).tanh() * 5.0).collect();
    // WGSL's tanh is held to an absolute error near 0 (lavapipe: 1.5e-7 at 0.003), so the
    // soft cap is checked relative to the cap, the scale of the logits it bounds.
    let cap = vec![5.0f32; n];
    check(
        "scale + softcap",
        &read(&ctx, &gb, n),
        &want,
        &cap,
        8.0 * f32::EPSILON,
    );
}

#[test]
fn argmax_takes_the_lowest_id_on_ties_skips_banned_and_flags_non_finite() {
    let Some(ctx) = ctx() else { return };
    let n = 70_000usize;
    let mut seed = 5u64;
    let mut l: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
    l[40_000] = 3.0;
    l[50_001] = 3.0;
    l[7] = 3.0;
    let go = |l: &[f32], banned: &[u32]| -> u32 {
        let lb = buf(&ctx, l);
        let mut bn = banned.to_vec();
        bn.resize(64, 0);
        let bb = u32buf(&ctx, &bn);
        let ids = ctx.vector_buffer("ids", 1);
        let res = ctx.vector_buffer("res", 1);
        let p = params(&ctx, &[l.len() as u32, banned.len() as u32, 0, 0]);
        run(&ctx, "op_argmax", &[&lb, &bb, &ids, &res, &p], (1, 1, 1));
        let r = read_u32(&ctx, &res, 1)[0];
        let i = read_u32(&ctx, &ids, 1)[0];
        assert_eq!(i, if r == u32::MAX { 0 } else { r });
        r
    };
    assert_eq!(go(&l, &[]), 7);
    assert_eq!(go(&l, &[7]), 40_000);
    assert_eq!(go(&l, &[7, 40_000]), 50_001);
    l[69_999] = f32::NAN;
    assert_eq!(go(&l, &[]), u32::MAX);
    l[69_999] = f32::INFINITY;
    assert_eq!(go(&l, &[]), u32::MAX);
}

/// `op_attention_combine_q8` (the decode combine with the output product's quantization
/// folded in) against `op_attention_combine` and `ternary_q8_quantize` run one after the
/// other: the merged values within f32 rounding of the combine's (the same operations in the
/// same order; a driver may contract differently), and its int8 x bit for bit what the
/// quantize kernel makes of its own merged values. Head dims 64, 96 (blocks of 256 that
/// straddle heads), 128 and 256; splits with and without positions; both split chunkings.
#[test]
fn combine_q8_equals_the_combine_then_the_quantize() {
    let Some(ctx) = ctx() else { return };
    if !ctx.has_source(lowbit::runtime::gpu::kernels::COMBINE_Q8) {
        panic!("the built-in kernels carry op_attention_combine_q8");
    }
    let mut seed = 91u64;
    for (heads, hd, splits, chunk, pos, grain) in [
        (32usize, 128usize, 64usize, 64usize, 512u32, 8u32),
        (4, 64, 8, 64, 300, 0),
        (8, 96, 16, 64, 1000, 8),
        (2, 256, 128, 32, 4000, 0),
        (4, 64, 64, 64, 5, 8),
    ] {
        let k = heads * hd;
        let stride = hd + 2;
        // Partials: m in [-4, 4], l > 0 for most splits (a few empty), values in [-1, 1].
        let mut part = vec![0f32; heads * splits * stride];
        for h in 0..heads {
            for sp in 0..splits {
                let o = (h * splits + sp) * stride;
                part[o] = 4.0 * lcg(&mut seed);
                part[o + 1] = if lcg_u32(&mut seed).is_multiple_of(7) {
                    0.0
                } else {
                    1.0 + 3.0 * lcg(&mut seed).abs()
                };
                for d in 0..hd {
                    part[o + 2 + d] = lcg(&mut seed);
                }
            }
        }
        let pb = buf(&ctx, &part);
        let st = step(&ctx, pos, 1);
        let p = params(
            &ctx,
            &[
                heads as u32,
                hd as u32,
                splits as u32,
                chunk as u32,
                grain,
                0,
                0,
                0,
            ],
        );
        // A: the combine, then the quantize kernel on its output.
        let out_a = ctx.vector_buffer("out a", k);
        run(
            &ctx,
            "op_attention_combine",
            &[&pb, &out_a, &p, &st],
            (heads as u32, 1, 1),
        );
        // B: the folded kernel.
        let out_b = ctx.vector_buffer("out b", k);
        let xq_b = ctx.vector_buffer("xq b", (k + k / 8) / 4);
        run(
            &ctx,
            lowbit::runtime::gpu::kernels::COMBINE_Q8,
            &[&pb, &out_b, &xq_b, &p, &st],
            ((k / 256) as u32, 1, 1),
        );
        let (a, b) = (read(&ctx, &out_a, k), read(&ctx, &out_b, k));
        let what = format!("combine_q8 heads {heads} hd {hd} pos {pos} grain {grain}");
        let scale: Vec<f32> = a.iter().map(|v| v.abs().max(1e-3)).collect();
        check(&what, &b, &a, &scale, 1e-5);
        // The quantize kernel on B's own values gives B's int8 x bit for bit.
        let xq_ref = ctx.vector_buffer("xq ref", (k + k / 8) / 4);
        let qp = ctx.uniform("q params", bytemuck::cast_slice(&[k as u32, 0, 0, 0]));
        run(
            &ctx,
            "ternary_q8_quantize",
            &[&out_b, &xq_ref, &qp],
            (
                (k / 16).div_ceil(lowbit::runtime::gpu::Q8_QUANTIZE_WG as usize) as u32,
                1,
                1,
            ),
        );
        let (got, want) = (
            read_u32(&ctx, &xq_b, (k + k / 8) / 4),
            read_u32(&ctx, &xq_ref, (k + k / 8) / 4),
        );
        assert_eq!(got, want, "{what}: int8 x");
        // And the values are not all zero (the merge did happen).
        assert!(b.iter().any(|v| v.abs() > 1e-3), "{what}");
    }
}
