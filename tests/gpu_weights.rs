//! The GPU weight kernels (src/runtime/gpu/weights.rs) for every encoding a bundle carries,
//! against the CPU reference: the product `y = W x` for 1, 3, 16 and 70 tokens against the
//! dequantized rows dotted with x in f64, within `weights::matmul_tolerance` (the tiled
//! kernel from 32 tokens within `weights::matmul_tile_tolerance`, the ternary single-token
//! kernel within `gpu::tolerance`); the embedding gather against
//! `quant::dequantize` / `ternary::row_values` / `PaletteView::row`, bit for bit. Both
//! reductions, row chunks under a small binding cap, a 2-D grid, refusals, and a few rows of
//! one tensor of each type in the real models' bundles. Without an adapter the tests skip and
//! say so, unless `LOWBIT_REQUIRE_GPU=1`, where they fail.

mod common;

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use lowbit::ggml::GgmlType;
use lowbit::runtime::gpu::weights::{self, GpuWeight};
use lowbit::runtime::gpu::{self, context_for_tests, ContextOptions, GpuContext, GpuError};

fn lcg(seed: &mut u64) -> u32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*seed >> 33) as u32
}

/// One context per reduction, shared by the tests (pipelines compile once each): the
/// adapter's default (subgroups where present) and the workgroup reduction forced.
fn contexts() -> Vec<&'static GpuContext> {
    static SG: OnceLock<Option<GpuContext>> = OnceLock::new();
    static WG: OnceLock<Option<GpuContext>> = OnceLock::new();
    // The subgroup context compiles this binary's kernels without bounds checks, as the
    // backend does by default; the workgroup one keeps them (a bundle from another build).
    let sg = SG.get_or_init(|| {
        context_for_tests(&ContextOptions {
            unchecked_builtin: true,
            ..Default::default()
        })
    });
    let wg = WG.get_or_init(|| {
        context_for_tests(&ContextOptions {
            force_workgroup_reduction: true,
            ..Default::default()
        })
    });
    let mut v = Vec::new();
    if let Some(c) = sg {
        if std::env::var("LOWBIT_REQUIRE_GPU").as_deref() == Ok("1") {
            // CI's lavapipe has subgroups: the subgroup path must run there.
            assert!(c.has_subgroups(), "{}: no SUBGROUP feature", c.info.name);
        }
        if c.weight_reduction() == gpu::Reduction::Subgroup {
            v.push(c);
        } else {
            eprintln!(
                "note: {} has no SUBGROUP feature; the subgroup path is not run",
                c.info.name
            );
        }
    }
    if let Some(c) = wg {
        assert_eq!(c.weight_reduction(), gpu::Reduction::Workgroup);
        v.push(c);
    }
    v
}

/// The worst ratio |gpu - exact| / tolerance seen per encoding, printed by each test.
static WORST: Mutex<BTreeMap<String, f64>> = Mutex::new(BTreeMap::new());

fn note_worst(key: &str, ratio: f64) {
    let mut m = WORST.lock().unwrap_or_else(|e| e.into_inner());
    let e = m.entry(key.to_string()).or_insert(0.0);
    *e = e.max(ratio);
}

fn print_worst(keys: &[String]) {
    let m = WORST.lock().unwrap_or_else(|e| e.into_inner());
    for k in keys {
        if let Some(r) = m.get(k) {
            eprintln!("{k}: worst {r:.3e} of the tolerance");
        }
    }
}

/// A random f16 scale: normal values of either sign, zeros, subnormals, the largest f16.
fn random_scale(seed: &mut u64) -> u16 {
    let special = [
        0.0f32, -0.0, 65504.0, -65504.0, 1.0e-7, -6.1e-5, 0.5, -1.0, 0.0123,
    ];
    let r = lcg(seed);
    let v = if r.is_multiple_of(5) {
        special[(r / 5) as usize % special.len()]
    } else {
        ((r % 20001) as f32 / 10000.0 - 1.0) * 0.05
    };
    half::f16::from_f32(v).to_bits()
}

/// Any finite f16 (subnormals and +-65504 included).
fn random_f16_bits(seed: &mut u64) -> u16 {
    let b = (lcg(seed) & 0xffff) as u16;
    if b & 0x7c00 == 0x7c00 {
        b & !0x4000
    } else {
        b
    }
}

/// A finite f32 of magnitude 2^-20 .. 2^20, or a zero or subnormal now and then.
fn random_f32(seed: &mut u64) -> f32 {
    let r = lcg(seed);
    match r % 23 {
        0 => 0.0,
        1 => -0.0,
        2 => f32::from_bits(lcg(seed) & 0x807f_ffff), // subnormal
        _ => {
            let m = (lcg(seed) % 20001) as f32 / 10000.0 - 1.0;
            m * 2f32.powi((r % 41) as i32 - 20)
        }
    }
}

fn random_x(n: usize, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|i| match i % 61 {
            0 => 0.0,
            1 => -0.0,
            _ => (lcg(seed) % 2001) as f32 / 1000.0 - 1.0,
        })
        .collect()
}

/// Byte offsets of a GGML block's f16 fields, from the CPU dequantizer's block structs.
fn f16_fields(ty: GgmlType) -> Vec<usize> {
    use lowbit::quant::kquants::*;
    use lowbit::quant::legacy::*;
    use lowbit::quant::ternary::*;
    use std::mem::offset_of;
    match ty {
        GgmlType::Q4_0 => vec![offset_of!(BlockQ4_0, d)],
        GgmlType::Q4_1 => vec![offset_of!(BlockQ4_1, d), offset_of!(BlockQ4_1, m)],
        GgmlType::Q5_0 => vec![offset_of!(BlockQ5_0, d)],
        GgmlType::Q5_1 => vec![offset_of!(BlockQ5_1, d), offset_of!(BlockQ5_1, m)],
        GgmlType::Q8_0 => vec![offset_of!(BlockQ8_0, d)],
        GgmlType::Q2_K => vec![offset_of!(BlockQ2K, d), offset_of!(BlockQ2K, dmin)],
        GgmlType::Q3_K => vec![offset_of!(BlockQ3K, d)],
        GgmlType::Q4_K => vec![offset_of!(BlockQ4K, d), offset_of!(BlockQ4K, dmin)],
        GgmlType::Q5_K => vec![offset_of!(BlockQ5K, d), offset_of!(BlockQ5K, dmin)],
        GgmlType::Q6_K => vec![offset_of!(BlockQ6K, d)],
        GgmlType::TQ1_0 => vec![offset_of!(BlockTQ1_0, d)],
        GgmlType::TQ2_0 => vec![offset_of!(BlockTQ2_0, d)],
        _ => vec![],
    }
}

/// Random GGML blocks `[rows, cols]` of `ty`: random bytes, every f16 field a finite scale
/// ([`random_scale`]); F16, BF16 and F32 elements finite.
fn random_gguf(ty: GgmlType, rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
    let n = rows * cols;
    match ty {
        GgmlType::F16 => (0..n)
            .flat_map(|_| random_f16_bits(seed).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| ((random_f32(seed).to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        GgmlType::F32 => (0..n)
            .flat_map(|_| random_f32(seed).to_le_bytes())
            .collect(),
        _ => {
            let ts = ty.type_size();
            let mut bytes: Vec<u8> = (0..ty.bytes_for(n as u64).unwrap())
                .map(|_| lcg(seed) as u8)
                .collect();
            let fields = f16_fields(ty);
            assert!(!fields.is_empty(), "{ty}");
            for block in bytes.chunks_exact_mut(ts) {
                for &f in &fields {
                    block[f..f + 2].copy_from_slice(&random_scale(seed).to_le_bytes());
                }
            }
            bytes
        }
    }
}

/// A weight as the host holds it, with its CPU reference rows.
struct Host {
    name: String,
    /// The encoding's name in the printed summary of worst ratios.
    key: String,
    rows: usize,
    cols: usize,
    kind: HostKind,
}

enum HostKind {
    Gguf(GgmlType, Vec<u8>),
    Ternary(Vec<u32>, Vec<u16>),
    Palette {
        bits: u32,
        group_size: usize,
        tables: Vec<u8>,
        indices: Vec<u8>,
    },
}

/// A GGUF type or a palette (bits, rows a group), for the tests of the folded forms, which
/// every decoder of matvec_quads.wgsl has.
#[derive(Clone, Copy, Debug)]
enum Enc {
    Gguf(GgmlType),
    Palette(u32, usize),
}

impl From<GgmlType> for Enc {
    fn from(ty: GgmlType) -> Enc {
        Enc::Gguf(ty)
    }
}

impl Enc {
    /// A random weight of this encoding (a palette's rows a multiple of its group).
    fn host(self, rows: usize, cols: usize, seed: &mut u64) -> Host {
        match self {
            Enc::Gguf(ty) => Host::gguf(ty, rows, cols, seed),
            Enc::Palette(bits, group) => Host::palette(bits, group, rows, cols, seed),
        }
    }
}

impl Host {
    fn gguf(ty: GgmlType, rows: usize, cols: usize, seed: &mut u64) -> Host {
        Host {
            name: format!("{ty} [{rows}, {cols}]"),
            key: ty.name().to_string(),
            rows,
            cols,
            kind: HostKind::Gguf(ty, random_gguf(ty, rows, cols, seed)),
        }
    }

    /// Codes from the TQ2_0 quantizer of random values, packed by `ternary::pack_block`;
    /// scales the quantizer's, or special values now and then.
    fn ternary(rows: usize, cols: usize, seed: &mut u64) -> Host {
        let mut words = vec![0u32; rows * cols / 16];
        let mut scales = Vec::new();
        for (b, w) in words.chunks_exact_mut(16).enumerate() {
            let x: Vec<f32> = random_x(256, seed).iter().map(|v| v * 0.05).collect();
            let q = lowbit::ternary::quantize_tq2_0_block(&x).unwrap();
            lowbit::ternary::pack_block(&q.codes, w);
            scales.push(if b % 3 == 1 {
                random_scale(seed)
            } else {
                q.d_bits
            });
        }
        Host {
            name: format!("ternary2 [{rows}, {cols}]"),
            key: "ternary2".into(),
            rows,
            cols,
            kind: HostKind::Ternary(words, scales),
        }
    }

    /// Random finite f16 tables, random indices packed by `palette::pack_row`.
    fn palette(bits: u32, group_size: usize, rows: usize, cols: usize, seed: &mut u64) -> Host {
        let rb = lowbit::palette::row_bytes(cols as u64, bits) as usize;
        let mut indices = vec![0u8; rows * rb];
        for row in indices.chunks_exact_mut(rb) {
            let ix: Vec<u8> = (0..cols).map(|_| (lcg(seed) % (1 << bits)) as u8).collect();
            lowbit::palette::pack_row(&ix, bits, row);
        }
        let tables = (0..(rows / group_size) << bits)
            .flat_map(|_| random_f16_bits(seed).to_le_bytes())
            .collect();
        Host {
            name: format!("palette {bits}-bit G={group_size} [{rows}, {cols}]"),
            key: format!("palette {bits}-bit"),
            rows,
            cols,
            kind: HostKind::Palette {
                bits,
                group_size,
                tables,
                indices,
            },
        }
    }

    /// `parts` (one encoding and width) stacked: their rows one after another, as
    /// `GpuContext::upload_stacked` stacks a layer's Q, K and V.
    fn stack(parts: &[Host]) -> Host {
        let rows = parts.iter().map(|h| h.rows).sum();
        let kind = match &parts[0].kind {
            HostKind::Gguf(ty, _) => HostKind::Gguf(
                *ty,
                parts
                    .iter()
                    .flat_map(|h| match &h.kind {
                        HostKind::Gguf(_, b) => b.clone(),
                        _ => unreachable!(),
                    })
                    .collect(),
            ),
            HostKind::Ternary(..) => {
                let (mut w, mut s) = (Vec::new(), Vec::new());
                for h in parts {
                    if let HostKind::Ternary(hw, hs) = &h.kind {
                        w.extend_from_slice(hw);
                        s.extend_from_slice(hs);
                    }
                }
                HostKind::Ternary(w, s)
            }
            HostKind::Palette {
                bits, group_size, ..
            } => {
                let (mut t, mut ix) = (Vec::new(), Vec::new());
                for h in parts {
                    if let HostKind::Palette {
                        tables, indices, ..
                    } = &h.kind
                    {
                        t.extend_from_slice(tables);
                        ix.extend_from_slice(indices);
                    }
                }
                HostKind::Palette {
                    bits: *bits,
                    group_size: *group_size,
                    tables: t,
                    indices: ix,
                }
            }
        };
        Host {
            name: format!("stacked {}", parts[0].name),
            key: parts[0].key.clone(),
            rows,
            cols: parts[0].cols,
            kind,
        }
    }

    fn upload(&self, ctx: &GpuContext) -> Result<GpuWeight, GpuError> {
        let (rows, cols) = (self.rows, self.cols);
        match &self.kind {
            HostKind::Gguf(ty, b) => ctx.upload_gguf(&self.name, *ty, rows, cols, b),
            HostKind::Ternary(w, s) => ctx.upload_ternary_weight(
                &self.name,
                rows,
                cols,
                bytemuck::cast_slice(w),
                bytemuck::cast_slice(s),
            ),
            HostKind::Palette {
                bits,
                group_size,
                tables,
                indices,
            } => ctx.upload_palette(
                &self.name,
                rows,
                cols,
                *bits,
                *group_size,
                cols * *bits as usize / 8,
                tables,
                indices,
            ),
        }
    }

    /// Row `r` by the CPU dequantizers.
    fn row(&self, r: usize) -> Vec<f32> {
        let cols = self.cols;
        let mut out = vec![0f32; cols];
        match &self.kind {
            HostKind::Gguf(ty, b) => {
                let rb = ty.bytes_for(cols as u64).unwrap() as usize;
                lowbit::quant::dequantize(*ty, &b[r * rb..(r + 1) * rb], &mut out).unwrap();
            }
            HostKind::Ternary(w, s) => lowbit::ternary::row_values(
                &w[r * cols / 16..(r + 1) * cols / 16],
                &s[r * cols / 256..(r + 1) * cols / 256],
                &mut out,
            ),
            HostKind::Palette {
                bits,
                group_size,
                tables,
                indices,
            } => lowbit::palette::PaletteView {
                bits: *bits,
                group_size: *group_size,
                cols,
                row_bytes: cols * *bits as usize / 8,
                tables,
                indices,
            }
            .row(r, &mut out, &mut vec![0u8; cols]),
        }
        out
    }

    /// Per row, `sum_k |d_b(k) x_k|` over the ternary scales (the single-token ternary
    /// kernel's bound); `None` for other encodings.
    fn ternary_abs_dx(&self, x: &[f32]) -> Option<Vec<f64>> {
        let HostKind::Ternary(_, s) = &self.kind else {
            return None;
        };
        Some(
            s.chunks_exact(self.cols / 256)
                .map(|rs| {
                    rs.iter()
                        .zip(x.chunks_exact(256))
                        .map(|(&d, xb)| {
                            let d = half::f16::from_bits(d).to_f64().abs();
                            xb.iter().map(|v| d * v.abs() as f64).sum::<f64>()
                        })
                        .sum()
                })
                .collect(),
        )
    }
}

/// Checks `ctx`'s product of `w` with `n` tokens of random x against the f64 reference;
/// returns the outputs.
fn check_matmul(
    ctx: &GpuContext,
    host: &Host,
    w: &GpuWeight,
    n: usize,
    seed: &mut u64,
) -> Vec<f32> {
    let rows: Vec<Vec<f32>> = (0..host.rows).map(|r| host.row(r)).collect();
    check_matmul_rows(ctx, host, &rows, w, n, seed)
}

fn check_matmul_rows(
    ctx: &GpuContext,
    host: &Host,
    rows: &[Vec<f32>],
    w: &GpuWeight,
    n: usize,
    seed: &mut u64,
) -> Vec<f32> {
    let cols = host.cols;
    let x = random_x(n * cols, seed);
    let y = ctx.run_matmul(w, &x, n as u32).unwrap();
    assert_eq!(y.len(), n * host.rows);
    let what = format!(
        "{} n={n} {:?} on {}",
        host.name,
        ctx.weight_reduction(),
        ctx.info.name
    );
    // The tiled kernel from MATMUL_TILE_MIN_TOKENS tokens on (its own error bound).
    let tiled = ctx.matmul_tile_applies(w, n as u32);
    if n as u32 >= weights::MATMUL_TILE_MIN_TOKENS && !matches!(host.kind, HostKind::Ternary(..)) {
        assert!(tiled, "{what}: the tiled product does not apply");
    }
    let mut worst = (0.0f64, 0usize, 0usize);
    for t in 0..n {
        let xt = &x[t * cols..(t + 1) * cols];
        let dx = if n == 1 {
            host.ternary_abs_dx(xt)
        } else {
            None
        };
        for (r, wr) in rows.iter().enumerate() {
            let (exact, a) = wr.iter().zip(xt).fold((0f64, 0f64), |(s, a), (&w, &x)| {
                let p = w as f64 * x as f64;
                (s + p, a + p.abs())
            });
            let tol = match &dx {
                Some(d) => gpu::tolerance(cols, d[r]),
                None if tiled => weights::matmul_tile_tolerance(cols, a),
                None => weights::matmul_tolerance(cols, a),
            };
            let g = y[t * host.rows + r];
            assert!(g.is_finite(), "{what}: token {t} row {r} is {g}");
            let ratio = (g as f64 - exact).abs() / tol;
            assert!(
                ratio <= 1.0,
                "{what}: token {t} row {r}: gpu {g}, exact {exact}, |diff| {:e} > tolerance {tol:e} (sum |w x| {a:e})",
                (g as f64 - exact).abs()
            );
            if ratio > worst.0 {
                worst = (ratio, t, r);
            }
        }
    }
    let single_ternary = n == 1 && matches!(host.kind, HostKind::Ternary(..));
    note_worst(
        &if single_ternary {
            format!("{} (single token, gpu::tolerance)", host.key)
        } else {
            host.key.clone()
        },
        worst.0,
    );
    y
}

/// Gathers rows (every row, a repeated one, out-of-range ids clamped to the last row) and
/// checks them against the CPU rows bit for bit.
fn check_gather(ctx: &GpuContext, host: &Host, w: &GpuWeight) {
    let rows = host.rows as u32;
    let mut ids: Vec<u32> = (0..rows).rev().collect();
    ids.extend([0, rows / 2, rows / 2, rows, u32::MAX]);
    let out = ctx.run_gather(w, &ids).unwrap();
    for (t, &id) in ids.iter().enumerate() {
        let r = id.min(rows - 1) as usize;
        let want = host.row(r);
        let got = &out[t * host.cols..(t + 1) * host.cols];
        for (k, (g, c)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.to_bits() == c.to_bits(),
                "{} gather: token {t} (id {id}) element {k}: gpu {g:e} ({:#010x}), cpu {c:e} ({:#010x})",
                host.name,
                g.to_bits(),
                c.to_bits()
            );
        }
    }
}

/// Every check on one weight: products for 1, 3, 16 and 70 tokens (70: the tiled kernel,
/// two token tiles, the second partial) with each reduction, the gather on the first
/// context.
fn check_all(host: &Host, seed: &mut u64) {
    for (i, ctx) in contexts().into_iter().enumerate() {
        let w = host.upload(ctx).unwrap();
        assert_eq!(w.chunks.len(), 1);
        for n in [1, 3, 16, 70] {
            check_matmul(ctx, host, &w, n, seed);
        }
        if i == 0 {
            check_gather(ctx, host, &w);
        }
    }
}

#[test]
fn every_weight_kernel_validates() {
    let Some(ctx) = contexts().into_iter().next() else {
        return;
    };
    for k in weights::sources() {
        if k.name.ends_with("_sg") && !ctx.has_subgroups() {
            continue;
        }
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let _ = ctx
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(&k.name),
                source: wgpu::ShaderSource::Wgsl(k.wgsl.as_str().into()),
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            panic!("{}: {e}", k.name);
        }
    }
}

/// 32-element types: rows not a multiple of 4, K = 32 * odd.
#[test]
fn legacy_block_types_match_cpu() {
    let mut seed = 1u64;
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
    ];
    for ty in types {
        // The single-token product (matvec_quads.wgsl, Q8_0's matvec_q8_0.wgsl, all 64 invocations on
        // each row): one row a workgroup below 2048 rows (weights::matvec_split), two from
        // there (2049 rows: the last workgroup's second row past the weight).
        for (rows, cols) in [(13, 96), (37, 800), (7, 1120), (2049, 64)] {
            check_all(&Host::gguf(ty, rows, cols, &mut seed), &mut seed);
        }
    }
    print_worst(&types.map(|t| t.name().to_string()));
}

/// 256-element types: K = 768 and 256 (not multiples of 512), odd rows.
#[test]
fn k_quant_types_match_cpu() {
    let mut seed = 2u64;
    let types = [
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];
    for ty in types {
        // 1280 with 7 rows: one row a workgroup, matvec_q6_k.wgsl's too.
        for (rows, cols) in [(13, 256), (37, 768), (7, 1280)] {
            check_all(&Host::gguf(ty, rows, cols, &mut seed), &mut seed);
        }
    }
    print_worst(&types.map(|t| t.name().to_string()));
}

#[test]
fn float_and_ternary_types_match_cpu() {
    let mut seed = 3u64;
    for ty in [GgmlType::F16, GgmlType::BF16, GgmlType::F32] {
        for (rows, cols) in [(13, 96), (37, 800)] {
            check_all(&Host::gguf(ty, rows, cols, &mut seed), &mut seed);
        }
    }
    for ty in [GgmlType::TQ1_0, GgmlType::TQ2_0] {
        for (rows, cols) in [(13, 256), (37, 768)] {
            check_all(&Host::gguf(ty, rows, cols, &mut seed), &mut seed);
        }
    }
    for (rows, cols) in [(13, 256), (37, 768)] {
        check_all(&Host::ternary(rows, cols, &mut seed), &mut seed);
    }
    print_worst(
        &[
            "F16",
            "BF16",
            "F32",
            "TQ1_0",
            "TQ2_0",
            "ternary2",
            "ternary2 (single token, gpu::tolerance)",
        ]
        .map(String::from),
    );
}

#[test]
fn palettes_of_every_width_match_cpu() {
    let mut seed = 4u64;
    for bits in 1..=8 {
        // A table per 4 rows, per row, and per tensor.
        for (group_size, rows, cols) in [(4, 12, 96), (1, 5, 32), (37, 37, 800)] {
            check_all(
                &Host::palette(bits, group_size, rows, cols, &mut seed),
                &mut seed,
            );
        }
    }
    print_worst(
        &(1..=8)
            .map(|b| format!("palette {b}-bit"))
            .collect::<Vec<_>>(),
    );
}

/// A bundle made between the split per weight and the 2-row body carries the single-token
/// body as `weights_{enc}_matvec_r4_wg64_{sg|wg}` (4 accumulators an invocation, the split
/// read from its parameters): a context whose sources have only those runs them, within the
/// same tolerance, with both reductions. (Bundles from before the split carry `_r4_` kernels
/// that read no split; the host gives them 64 lanes and 4 rows. No such source is kept here to
/// test that path.)
#[test]
fn a_bundles_four_row_matvec_kernels_still_run() {
    // Every `_r2_` single-token kernel replaced by its `_r4_` form (the body expanded for 4
    // rows, `weights::legacy_matvec_sources`).
    let mut legacy: std::collections::HashMap<String, String> = gpu::kernels::all()
        .into_iter()
        .filter(|k| !k.name.contains("_matvec_r2_"))
        .map(|k| (k.name, k.wgsl))
        .collect();
    for k in weights::legacy_matvec_sources() {
        assert!(
            k.wgsl.contains("const ROWS: u32 = 4u;") && k.wgsl.contains("acc3"),
            "{}",
            k.name
        );
        legacy.insert(k.name, k.wgsl);
    }
    let mut seed = 9u64;
    for ctx in contexts_with_sources(&legacy) {
        for (ty, rows, cols) in [
            (GgmlType::Q8_0, 37, 800),
            (GgmlType::Q4_K, 7, 1280),
            (GgmlType::Q6_K, 37, 768),
        ] {
            let host = Host::gguf(ty, rows, cols, &mut seed);
            let w = host.upload(&ctx).unwrap();
            let xb = ctx.upload_bytes("x", &vec![0u8; cols * 4]).unwrap();
            let yb = ctx.vector_buffer("y", rows);
            let label = ctx.bind_matmul(&w, &xb, &yb, 1).unwrap().label;
            assert!(label.contains("_matvec_r4_"), "{label}");
            check_matmul(&ctx, &host, &w, 1, &mut seed);
        }
    }
}

/// Contexts (the subgroup and the workgroup reduction) compiling only `sources`, as a
/// bundle's kernels; none without an adapter.
fn contexts_with_sources(sources: &std::collections::HashMap<String, String>) -> Vec<GpuContext> {
    [false, true]
        .into_iter()
        .map_while(|force| {
            context_for_tests(&ContextOptions {
                sources: Some(sources.clone()),
                force_workgroup_reduction: force,
                ..Default::default()
            })
        })
        .collect()
}

/// A bundle made with the Q8_0 planes but before matvec_q8_0.wgsl carries its single-token
/// kernels with matvec_quads.wgsl's body (no `data4` binding) and no wide kernel: a head of
/// 65,539 rows runs its `_r2_` kernel, and the products equal the CPU's, on both reductions.
#[test]
fn a_bundles_quads_body_q8_0_kernels_still_run() {
    let mut older: std::collections::HashMap<String, String> = gpu::kernels::all()
        .into_iter()
        .map(|k| (k.name, k.wgsl))
        .collect();
    older.retain(|n, _| !weights::is_wide_matvec(n));
    let replaced = weights::q8_0_quads_body_sources();
    assert!(replaced.len() >= 8, "{}", replaced.len());
    for k in replaced {
        assert!(k.wgsl.contains("const QUAD_TASKS") && !k.wgsl.contains("data4"));
        assert!(older.insert(k.name, k.wgsl).is_some());
    }
    let mut seed = 29u64;
    let ctxs = contexts_with_sources(&older);
    // Where an adapter exists, such a set must give one (no silent pass).
    assert_eq!(ctxs.is_empty(), contexts().is_empty());
    for ctx in ctxs {
        for (rows, cols) in [(weights::WIDE_MATVEC_MIN_ROWS + 3, 640), (37, 800)] {
            let host = Host::gguf(GgmlType::Q8_0, rows, cols, &mut seed);
            let w = host.upload(&ctx).unwrap();
            let (x, y) = (ctx.vector_buffer("x", cols), ctx.vector_buffer("y", rows));
            let b = ctx.bind_matmul(&w, &x, &y, 1).unwrap();
            assert!(b.label.contains("_matvec_r2_"), "{}", b.label);
            check_matmul(&ctx, &host, &w, 1, &mut seed);
        }
    }
}

/// A bundle made before the single-token body put four invocations on a unit
/// (matvec_quads.wgsl) carries matvec.wgsl under the same `_r2_` names; the host tells the
/// two apart by their source and gives the older one its own split (`Params::lanes`: two rows
/// of 32 invocations at K = 800 and 96, where the current body takes one row a workgroup).
/// Either body is correct under either split, so this checks both: the grid each gets and
/// that such a bundle's products still match the CPU.
#[test]
fn a_bundles_whole_unit_matvec_kernels_still_run() {
    let mut older: std::collections::HashMap<String, String> = gpu::kernels::all()
        .into_iter()
        .map(|k| (k.name, k.wgsl))
        .collect();
    let replaced = weights::unit_matvec_sources();
    assert!(replaced.len() >= 16, "{}", replaced.len());
    // Nor had such a bundle the wide Q8_0 kernels.
    older.retain(|n, _| !weights::is_wide_matvec(n));
    for k in replaced {
        let current = older.get(&k.name).expect("a current kernel of that name");
        // matvec_quads.wgsl, or Q8_0's matvec_q8_0.wgsl (split the same way), replaced.
        let quads = |s: &str| s.contains("const QUAD_TASKS") || s.contains("const Q8_TASKS");
        assert!(quads(current) && !quads(&k.wgsl), "{}", k.name);
        older.insert(k.name, k.wgsl);
    }
    let Some(&current) = contexts().first() else {
        return;
    };
    let (mut seed, mut differ) = (17u64, false);
    for ctx in contexts_with_sources(&older) {
        for (ty, rows, cols) in [
            (Enc::Gguf(GgmlType::Q8_0), 37, 800),
            (Enc::Gguf(GgmlType::Q4_1), 13, 96),
            (Enc::Gguf(GgmlType::Q5_0), 7, 1120),
            (Enc::Gguf(GgmlType::F16), 5, 256),
            (Enc::Palette(5, 37), 37, 800),
            (Enc::Palette(4, 1), 13, 96),
        ] {
            let host = ty.host(rows, cols, &mut seed);
            let w = host.upload(&ctx).unwrap();
            // Each body's split from matvec_split (where they differ, e.g. 37 x 800: 19
            // workgroups of two rows of 32 lanes for matvec.wgsl, 37 of one row for quads).
            let grid = |c: &GpuContext, w: &GpuWeight| {
                let (x, y) = (c.vector_buffer("x", cols), c.vector_buffer("y", rows));
                c.bind_matmul(w, &x, &y, 1).unwrap().grids()
            };
            let older_rows = weights::matvec_split(rows, cols, false).1 as usize;
            let quads_rows = weights::matvec_split(rows, cols, true).1 as usize;
            differ |= older_rows != quads_rows;
            assert_eq!(
                grid(&ctx, &w),
                vec![[rows.div_ceil(older_rows) as u32, 1, 1]],
                "{ty:?} {rows} x {cols}: matvec.wgsl's split"
            );
            assert_eq!(
                grid(current, &host.upload(current).unwrap()),
                vec![[rows.div_ceil(quads_rows) as u32, 1, 1]],
                "{ty:?} {rows} x {cols}: the quads body's split"
            );
            check_matmul(&ctx, &host, &w, 1, &mut seed);
        }
    }
    assert!(differ, "no case where the two bodies' splits differ");
}

/// The Q8_0 and Q6_K kernels read a weight uploaded as planes (aligned words); a bundle made
/// before carries kernels that read the blocks as stored, and a context with those uploads
/// its Q8_0 and Q6_K weights as stored: its products (one token, several, the tiled prefill
/// product) and gather still equal the CPU's. A set with kernels of both kinds is refused.
#[test]
fn a_bundles_block_reading_kernels_still_run() {
    let Some(&current) = contexts().first() else {
        return;
    };
    let types = [GgmlType::Q8_0, GgmlType::Q6_K];
    for ty in types {
        assert!(current.reads_planes(ty).unwrap());
    }
    assert!(!current.reads_planes(GgmlType::Q4_K).unwrap());
    let mut older: std::collections::HashMap<String, String> = gpu::kernels::all()
        .into_iter()
        .map(|k| (k.name, k.wgsl))
        .collect();
    let replaced = weights::block_sources();
    assert!(replaced.len() >= 12, "{}", replaced.len());
    // Such a bundle has no Q8_0 or Q6_K kernel but these (none made since).
    let names: std::collections::HashSet<&String> = replaced.iter().map(|k| &k.name).collect();
    older.retain(|n, _| {
        !(n.starts_with("weights_q8_0_") || n.starts_with("weights_q6_k_")) || names.contains(n)
    });
    assert!(!older.keys().any(|n| weights::is_wide_matvec(n)));
    for k in replaced {
        let ty = if k.name.starts_with("weights_q8_0_") {
            GgmlType::Q8_0
        } else {
            GgmlType::Q6_K
        };
        let mark = weights::planes_mark(ty).unwrap();
        let now = older.get(&k.name).expect("a current kernel of that name");
        assert!(now.contains(mark) && !k.wgsl.contains(mark), "{}", k.name);
        // Today's Q8_0 single-token body reads the codes by 16-byte words (binding 9, which
        // the host binds only where a kernel declares it); the older one does not.
        let data4 = "var<storage, read> data4: array<vec4<u32>>";
        assert_eq!(
            now.contains(data4),
            ty == GgmlType::Q8_0 && k.name.contains("_matvec_"),
            "{}",
            k.name
        );
        assert!(!k.wgsl.contains(data4), "{}", k.name);
        older.insert(k.name, k.wgsl);
    }
    // One kernel of each kind: refused by name at the upload.
    for (ty, cols) in [(GgmlType::Q8_0, 64), (GgmlType::Q6_K, 256)] {
        let name = format!("weights_{}_gather_wg64", ty.name().to_ascii_lowercase());
        let now = gpu::kernels::all()
            .into_iter()
            .find(|k| k.name == name)
            .expect("the gather");
        let mut mixed = older.clone();
        mixed.insert(name.clone(), now.wgsl);
        if let Some(ctx) = contexts_with_sources(&mixed).into_iter().next() {
            let mut seed = 1u64;
            let host = Host::gguf(ty, 3, cols, &mut seed);
            let e = host.upload(&ctx).unwrap_err().to_string();
            assert!(e.contains(&name) && e.contains("two releases"), "{e}");
        }
    }
    let mut seed = 23u64;
    for ctx in contexts_with_sources(&older) {
        for (ty, cols) in [(GgmlType::Q8_0, 800), (GgmlType::Q6_K, 768)] {
            assert!(!ctx.reads_planes(ty).unwrap());
            let host = Host::gguf(ty, 37, cols, &mut seed);
            let w = host.upload(&ctx).unwrap();
            for n in [1, 3, 70] {
                check_matmul(&ctx, &host, &w, n, &mut seed);
            }
            check_gather(&ctx, &host, &w);
        }
    }
}

/// The palette kernels read the tables widened to f32 by the host; a bundle made before
/// carries kernels that read them as stored (f16), and a context with those uploads them so:
/// its products (one token, several, the tiled prefill product) and gather still equal the
/// CPU's at every width and group layout. A set with kernels of both kinds is refused.
#[test]
fn a_bundles_f16_table_palette_kernels_still_run() {
    let Some(&current) = contexts().first() else {
        return;
    };
    assert!(current.reads_f32_tables().unwrap());
    let mark = weights::PALETTE_F32_MARK;
    let mut older: std::collections::HashMap<String, String> = gpu::kernels::all()
        .into_iter()
        .map(|k| (k.name, k.wgsl))
        .collect();
    let replaced = weights::palette_f16_sources();
    // 8 widths, each with products, folds and gather.
    assert!(replaced.len() >= 8 * 6, "{}", replaced.len());
    for k in replaced {
        let now = older.get(&k.name).expect("a current kernel of that name");
        assert!(now.contains(mark) && !k.wgsl.contains(mark), "{}", k.name);
        older.insert(k.name, k.wgsl);
    }
    assert!(!older.values().any(|s| s.contains(mark)));
    let mut seed = 29u64;
    // One kernel of each kind: refused by name at the upload.
    let name = "weights_palette_b4_gather_wg64";
    let now = gpu::kernels::all()
        .into_iter()
        .find(|k| k.name == name)
        .expect("the gather");
    let mut mixed = older.clone();
    mixed.insert(name.to_string(), now.wgsl);
    if let Some(ctx) = contexts_with_sources(&mixed).into_iter().next() {
        let e = Host::palette(4, 4, 12, 96, &mut seed)
            .upload(&ctx)
            .unwrap_err()
            .to_string();
        assert!(e.contains(name) && e.contains("two releases"), "{e}");
    }
    for ctx in contexts_with_sources(&older) {
        assert!(!ctx.reads_f32_tables().unwrap());
        for (bits, group_size, rows, cols) in [
            (4, 4, 12, 96),
            (8, 37, 37, 800),
            (6, 1, 5, 64),
            (3, 8, 16, 96),
        ] {
            let host = Host::palette(bits, group_size, rows, cols, &mut seed);
            let w = host.upload(&ctx).unwrap();
            for n in [1, 3, 70] {
                check_matmul(&ctx, &host, &w, n, &mut seed);
            }
            check_gather(&ctx, &host, &w);
        }
    }
}

/// A binding cap of 8 KiB splits every weight into several row chunks (palette chunks that
/// start inside a group, ternary chunks at the offset alignment); the results equal the
/// whole weight's bit for bit (same kernel, same rows), the gather reads every chunk, and
/// nothing past the weight's rows is written.
#[test]
fn row_chunks_give_the_same_bits_as_one_chunk() {
    let Some(&whole) = contexts().first() else {
        return;
    };
    let Some(capped) = context_for_tests(&ContextOptions {
        max_binding_bytes: Some(8192),
        ..Default::default()
    }) else {
        return;
    };
    let mut seed = 5u64;
    for host in [
        Host::gguf(GgmlType::Q6_K, 70, 768, &mut seed),
        Host::gguf(GgmlType::Q8_0, 70, 800, &mut seed),
        Host::gguf(GgmlType::Q4_0, 70, 800, &mut seed),
        Host::gguf(GgmlType::F32, 70, 96, &mut seed),
        Host::palette(3, 8, 72, 800, &mut seed),
        Host::ternary(200, 256, &mut seed),
    ] {
        let a = host.upload(&capped).unwrap();
        let b = host.upload(whole).unwrap();
        assert!(
            a.chunks.len() > 1,
            "{}: {} chunk",
            host.name,
            a.chunks.len()
        );
        assert_eq!(b.chunks.len(), 1);
        assert_eq!(
            a.chunks.iter().map(|c| c.rows).sum::<usize>(),
            host.rows,
            "{}",
            host.name
        );
        for n in [1, 3] {
            let mut s1 = seed;
            let ya = check_matmul(&capped, &host, &a, n, &mut s1);
            let mut s2 = seed;
            let yb = check_matmul(whole, &host, &b, n, &mut s2);
            seed = s1;
            assert_eq!(
                ya.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                yb.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{} n={n}",
                host.name
            );
        }
        check_gather(&capped, &host, &a);
        // Outputs past the weight's rows (y of a larger buffer) stay untouched.
        let n = 3usize;
        let x = random_x(n * host.cols, &mut seed);
        let xb = capped.upload_bytes("x", bytemuck::cast_slice(&x)).unwrap();
        let len = n * host.rows + 64;
        let y = capped.vector_buffer("y", len);
        capped
            .queue
            .write_buffer(&y, 0, bytemuck::cast_slice(&vec![7.5f32; len]));
        let bound = capped.bind_matmul(&a, &xb, &y, n as u32).unwrap();
        assert_eq!(bound.dispatches(), a.chunks.len());
        let mut enc = capped
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            bound.encode(&mut pass);
        }
        capped.queue.submit([enc.finish()]);
        let got = capped.read_buffer(&y, (len * 4) as u64).unwrap();
        let got: &[f32] = bytemuck::cast_slice(&got);
        assert!(
            got[n * host.rows..].iter().all(|&v| v == 7.5),
            "{}: a value past the last row was written",
            host.name
        );
        assert!(got[..n * host.rows].iter().all(|&v| v != 7.5 || v.is_nan()));
    }
}

/// Runs `bound` and reads back `n` f32 of `y`.
fn run_read(ctx: &GpuContext, bound: &weights::Bound, y: &wgpu::Buffer, n: usize) -> Vec<f32> {
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

/// SwiGLU folded into the single-token product of a stacked gate/up GGUF weight
/// (rows_swiglu.wgsl, the decoders of matvec_quads.wgsl): F workgroups, one output a row,
/// `silu(g) * u` of the plain product's gate and up rows within WGSL's exp accuracy of the
/// CPU's formula on them (the end-to-end test in gpu_backend.rs compares it bit for bit with
/// the product followed by op_swiglu), both reductions, rows on both sides of 2048. Where it
/// does not apply (no four-invocation body, unequal parts, a bundle without the kernel) the
/// caller gets `None`.
#[test]
fn swiglu_folded_into_the_gguf_product_is_silu_of_gate_times_up() {
    let fuse = gpu::Fuse {
        rms_norm: false,
        swiglu: true,
    };
    let mut seed = 29u64;
    for ctx in contexts() {
        for (ty, f, cols) in [
            (Enc::Gguf(GgmlType::Q4_1), 40, 256),
            (Enc::Gguf(GgmlType::Q8_0), 1100, 96),
            (Enc::Gguf(GgmlType::Q5_0), 7, 576),
            (Enc::Gguf(GgmlType::F16), 9, 64),
            (Enc::Palette(4, 8), 40, 256),
            (Enc::Palette(5, 3), 9, 96),
        ] {
            let (host, mut w) = gate_up_stack(ctx, ty, f, cols, &mut seed);
            let what = format!("{ty:?} 2 x {f} x {cols} on {}", ctx.info.name);
            let x = random_x(cols, &mut seed);
            let plain = ctx.run_matmul(&w, &x, 1).unwrap();
            let xb = ctx.upload_bytes("x", bytemuck::cast_slice(&x)).unwrap();
            let yb = ctx.vector_buffer("y", f);
            let bound = ctx
                .bind_matvec_fused(&w, &xb, &gpu::ops::BufView::whole(&yb), fuse, None)
                .unwrap()
                .unwrap_or_else(|| panic!("{what}: no fused product"));
            assert!(
                bound.label.ends_with(&format!("_swiglu {}", host.name)),
                "{}",
                bound.label
            );
            assert_eq!(bound.grids(), vec![[f as u32, 1, 1]], "{what}");
            let got = run_read(ctx, &bound, &yb, f);
            for i in 0..f {
                let (g, u) = (plain[i], plain[f + i]);
                let want = (g / (1.0 + (-g).exp())) * u;
                // WGSL's exp is accurate to 3 + 2|x| ULP; the add, divide and multiply after it
                // round once each.
                let tol = (6.0 + 2.0 * g.abs()) * f32::EPSILON * want.abs() + f32::MIN_POSITIVE;
                assert!(
                    (got[i] - want).abs() <= tol,
                    "{what}: row {i}: gpu {} against silu({g}) * {u} = {want}",
                    got[i]
                );
            }
            // Unequal parts: not a gate/up stack.
            w.parts = vec![f - 1, f + 1];
            let none = ctx.bind_matvec_fused(&w, &xb, &gpu::ops::BufView::whole(&yb), fuse, None);
            assert!(none.unwrap().is_none(), "{what}: unequal parts");
        }
    }
    // The caller runs op_swiglu.
    glu_refusals("swiglu", GgmlType::Q4_1, &mut seed, &|ctx, w, x, y| {
        ctx.bind_matvec_fused(w, x, y, fuse, None).unwrap()
    });
}

/// op_rms_norm of one row `x` (`len` values) with weight `w` into a new buffer, on the GPU.
fn gpu_rms_norm(
    ctx: &GpuContext,
    x: &wgpu::Buffer,
    w: &wgpu::Buffer,
    len: usize,
    eps: f32,
) -> wgpu::Buffer {
    let out = ctx.vector_buffer("h", len);
    let p = ctx.uniform(
        "params",
        bytemuck::cast_slice(&[len as u32, eps.to_bits(), 1, 0]),
    );
    let st = ctx.uniform("step", bytemuck::cast_slice(&[0u32, 1, 0, 0]));
    let op = ctx
        .bind_op("op_rms_norm", &[x, w, &out, &p, &st], (1, 1, 1))
        .unwrap();
    let mut enc = ctx
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        op.encode(&mut pass);
    }
    ctx.queue.submit([enc.finish()]);
    out
}

/// The RMSNorm of x folded into the single-token GGUF products of matvec_quads.wgsl
/// (x_rms.wgsl, the `_rms` kernels): the plain product (store and bias epilogues) and the
/// SwiGLU one, bit for bit op_rms_norm followed by the product without the norm, at widths
/// under, at and past op_rms_norm's 256 partial sums and the 1024 values a pass of its
/// loads takes (64 to 4096), both reductions, up to `NORM_FOLD_MAX_WORKGROUPS`
/// workgroups. Where it does not apply (no four-invocation body, GELU gating, more
/// workgroups than that, a bundle without the kernels) `None`; a norm weight too short or a
/// bias that does not go with the epilogue is refused.
#[test]
fn a_norm_folded_into_the_gguf_product_keeps_the_bits_of_the_norm_then_the_product() {
    use gpu::ops::BufView;
    use gpu::Epilogue;
    let mut seed = 41u64;
    let eps = 1e-6f32;
    for ctx in contexts() {
        for (ty, rows, cols) in [
            (Enc::Gguf(GgmlType::Q5_0), 40, 896),
            (Enc::Gguf(GgmlType::Q4_1), 2048, 576),
            (Enc::Gguf(GgmlType::Q8_0), 9, 64),
            (Enc::Gguf(GgmlType::F16), 5, 4096),
            (Enc::Gguf(GgmlType::Q8_0), 3, 320),
            (Enc::Gguf(GgmlType::Q8_0), 7, 32),
            (Enc::Palette(4, 8), 40, 896),
            (Enc::Palette(6, 4), 8, 4096),
            (Enc::Palette(5, 3), 9, 320),
        ] {
            let what = format!("{ty:?} {rows} x {cols} on {}", ctx.info.name);
            let host = ty.host(rows, cols, &mut seed);
            let w = host.upload(ctx).unwrap();
            let x: Vec<f32> = random_x(cols, &mut seed).iter().map(|v| v * 7.0).collect();
            let nw: Vec<f32> = random_x(cols, &mut seed).iter().map(|v| 1.0 + v).collect();
            let bias = random_x(rows, &mut seed);
            let xb = ctx.upload_bytes("x", bytemuck::cast_slice(&x)).unwrap();
            let nb = ctx.upload_bytes("norm", bytemuck::cast_slice(&nw)).unwrap();
            let bb = ctx
                .upload_bytes("bias", bytemuck::cast_slice(&bias))
                .unwrap();
            let hb = gpu_rms_norm(ctx, &xb, &nb, cols, eps);
            for (epilogue, b) in [(Epilogue::Store, None), (Epilogue::Bias, Some(&bb))] {
                let (y1, y2) = (ctx.vector_buffer("y", rows), ctx.vector_buffer("y", rows));
                let plain = match b {
                    Some(b) => ctx.bind_matmul_bias(&w, &hb, &BufView::whole(&y1), 1, b),
                    None => ctx.bind_matmul(&w, &hb, &y1, 1),
                }
                .unwrap();
                let folded = ctx
                    .bind_matvec_norm(&w, &xb, &BufView::whole(&y2), epilogue, b, (&nb, eps))
                    .unwrap()
                    .unwrap_or_else(|| panic!("{what}: no folded product"));
                assert!(
                    folded.label.contains("_matvec_r2_wg64_"),
                    "{}",
                    folded.label
                );
                assert!(folded.label.contains("_rms "), "{}", folded.label);
                let (want, got) = (
                    run_read(ctx, &plain, &y1, rows),
                    run_read(ctx, &folded, &y2, rows),
                );
                for (r, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        e.to_bits(),
                        "{what} {epilogue:?}: row {r}: folded {g} against the norm then the product {e}"
                    );
                }
                // The products are not trivially equal: the plain one from x differs.
                let raw = ctx.run_matmul(&w, &x, 1).unwrap();
                assert!(raw.iter().zip(&want).any(|(a, b)| a != b), "{what}");
            }
            // SwiGLU with the norm: a gate/up stack of this type.
            let (_, gu) = gate_up_stack(ctx, ty, rows, cols, &mut seed);
            let (y1, y2) = (ctx.vector_buffer("y", rows), ctx.vector_buffer("y", rows));
            let plain = ctx
                .bind_gguf_glu(&gu, &hb, &BufView::whole(&y1), None)
                .unwrap()
                .expect("the SwiGLU product");
            let folded = ctx
                .bind_gguf_glu_norm(&gu, &xb, &BufView::whole(&y2), None, Some((&nb, eps)))
                .unwrap()
                .unwrap_or_else(|| panic!("{what}: no folded SwiGLU product"));
            assert!(folded.label.contains("_swiglu_rms "), "{}", folded.label);
            let (want, got) = (
                run_read(ctx, &plain, &y1, rows),
                run_read(ctx, &folded, &y2, rows),
            );
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: the folded SwiGLU product's bits differ"
            );
            // GELU gating has no `_rms` kernel; a short norm weight and a stray bias are
            // refused.
            let tb = ctx.vector_buffer("table", 65536 / 2);
            let y = BufView::whole(&y2);
            let geglu = ctx.bind_gguf_glu_norm(&gu, &xb, &y, Some(&tb), Some((&nb, eps)));
            assert!(geglu.unwrap().is_none(), "{what}: GELU gating with a norm");
            let short = ctx.vector_buffer("norm", cols - 4);
            let err = ctx
                .bind_matvec_norm(&w, &xb, &y, Epilogue::Store, None, (&short, eps))
                .err()
                .unwrap_or_else(|| panic!("{what}: a short norm weight bound"));
            assert!(err.to_string().contains("RMSNorm weight"), "{err}");
            let err = ctx
                .bind_matvec_norm(&w, &xb, &y, Epilogue::Store, Some(&bb), (&nb, eps))
                .err()
                .unwrap_or_else(|| panic!("{what}: a bias with the store epilogue bound"));
            assert!(err.to_string().contains("bias"), "{err}");
        }
    }
    // Exactly as many workgroups as the fold takes: folded (a gate/up stack of F rows has F
    // workgroups; a plain product of 2F rows two rows a workgroup, F).
    for ctx in contexts() {
        let f = weights::NORM_FOLD_MAX_WORKGROUPS;
        let (_, gu) = gate_up_stack(ctx, GgmlType::Q8_0, f, 32, &mut seed);
        let (xb, nb) = (ctx.vector_buffer("x", 32), ctx.vector_buffer("norm", 32));
        let yb = ctx.vector_buffer("y", 2 * f);
        let y = BufView::whole(&yb);
        let glu = ctx.bind_gguf_glu_norm(&gu, &xb, &y, None, Some((&nb, eps)));
        assert!(glu.unwrap().is_some(), "a SwiGLU stack of {f} rows");
        let plain = ctx.bind_matvec_norm(&gu, &xb, &y, Epilogue::Store, None, (&nb, eps));
        assert!(plain.unwrap().is_some(), "{} rows", 2 * f);
    }
    // More workgroups than the fold pays for: `None` (a gate/up stack of F rows has F).
    for ctx in contexts() {
        let f = weights::NORM_FOLD_MAX_WORKGROUPS + 1;
        let (_, gu) = gate_up_stack(ctx, GgmlType::Q8_0, f, 64, &mut seed);
        let (xb, nb) = (ctx.vector_buffer("x", 64), ctx.vector_buffer("norm", 64));
        let yb = ctx.vector_buffer("y", 2 * f);
        let y = BufView::whole(&yb);
        let glu = ctx.bind_gguf_glu_norm(&gu, &xb, &y, None, Some((&nb, eps)));
        assert!(glu.unwrap().is_none(), "a SwiGLU stack of {f} rows");
        // 2f rows, two a workgroup.
        let plain = ctx.bind_matvec_norm(&gu, &xb, &y, Epilogue::Store, None, (&nb, eps));
        assert!(plain.unwrap().is_none(), "{} rows", 2 * f);
    }
    // No four-invocation body, or a bundle without the `_rms` kernels: `None`.
    glu_refusals("swiglu_rms", GgmlType::Q4_1, &mut seed, &|ctx, w, x, y| {
        let n = ctx.vector_buffer("norm", w.cols);
        ctx.bind_gguf_glu_norm(w, x, y, None, Some((&n, eps)))
            .unwrap()
    });
    glu_refusals("rms", GgmlType::Q4_1, &mut seed, &|ctx, w, x, y| {
        let n = ctx.vector_buffer("norm", w.cols);
        ctx.bind_matvec_norm(w, x, y, Epilogue::Store, None, (&n, eps))
            .unwrap()
    });
}

/// A stacked gate/up weight of `enc`: two random parts of `f` rows x `cols` uploaded as one,
/// its parts set (`GpuWeight::is_gate_up_stack`).
fn gate_up_stack(
    ctx: &GpuContext,
    enc: impl Into<Enc>,
    f: usize,
    cols: usize,
    seed: &mut u64,
) -> (Host, GpuWeight) {
    let enc = enc.into();
    let parts = [enc.host(f, cols, seed), enc.host(f, cols, seed)];
    let host = Host::stack(&parts);
    let mut w = host.upload(ctx).unwrap();
    w.parts = vec![f, f];
    (host, w)
}

/// Where a folded gating's kernel does not apply, `bind` (x, y) gives `None` and the caller
/// runs the op: a Q4_K stack (no four-invocation body: matvec.wgsl) on every context, and a
/// stack of `ty` on contexts compiling every kernel but those named `weights_..._{suffix}`
/// (a bundle made before them).
fn glu_refusals(
    suffix: &str,
    ty: GgmlType,
    seed: &mut u64,
    bind: &dyn Fn(
        &GpuContext,
        &GpuWeight,
        &wgpu::Buffer,
        &gpu::ops::BufView,
    ) -> Option<weights::Bound>,
) {
    let none = |ctx: &GpuContext, ty: GgmlType, cols: usize, seed: &mut u64| {
        let (_, w) = gate_up_stack(ctx, ty, 8, cols, seed);
        let (xb, yb) = (ctx.vector_buffer("x", cols), ctx.vector_buffer("y", 8));
        bind(ctx, &w, &xb, &gpu::ops::BufView::whole(&yb)).is_none()
    };
    for ctx in contexts() {
        assert!(none(ctx, GgmlType::Q4_K, 256, seed), "Q4_K");
    }
    let older: std::collections::HashMap<String, String> = gpu::kernels::all()
        .into_iter()
        .filter(|k| !(k.name.starts_with("weights_") && k.name.ends_with(&format!("_{suffix}"))))
        .map(|k| (k.name, k.wgsl))
        .collect();
    for ctx in contexts_with_sources(&older) {
        assert!(none(&ctx, ty, 64, seed), "without the kernel");
    }
}

/// GELU-tanh gating folded into the single-token product of a stacked gate/up GGUF weight
/// (rows_geglu.wgsl): F workgroups, one output a row, bit for bit the CPU backend's
/// `geglu(g, u)` (ggml's f16 table) of the plain product's gate and up rows, every branch of
/// it taken (g at or below -10, at or above 10, between), both reductions, rows on both sides
/// of 2048. A table too short, another encoding and a bundle without the kernel: refused or
/// `None`.
#[test]
fn geglu_folded_into_the_gguf_product_is_the_cpu_table_gating() {
    let table = lowbit::runtime::cpu::gelu_table();
    let mut seed = 31u64;
    for ctx in contexts() {
        let tb = ctx
            .upload_bytes("gelu table", bytemuck::cast_slice(table))
            .unwrap();
        let (mut low, mut high, mut mid) = (0, 0, 0);
        for (ty, f, cols, scale) in [
            (Enc::Gguf(GgmlType::Q5_0), 40, 640, 1.0f32),
            (Enc::Gguf(GgmlType::Q5_0), 40, 640, 60.0),
            (Enc::Gguf(GgmlType::Q8_0), 1100, 96, 30.0),
            (Enc::Gguf(GgmlType::Q4_0), 7, 256, 8.0),
            (Enc::Gguf(GgmlType::BF16), 9, 64, 20.0),
            (Enc::Palette(8, 4), 40, 640, 1.0),
            (Enc::Palette(3, 8), 16, 96, 30.0),
        ] {
            let (host, mut w) = gate_up_stack(ctx, ty, f, cols, &mut seed);
            let what = format!(
                "{ty:?} 2 x {f} x {cols}, x times {scale} on {}",
                ctx.info.name
            );
            let x: Vec<f32> = random_x(cols, &mut seed)
                .into_iter()
                .map(|v| v * scale)
                .collect();
            let plain = ctx.run_matmul(&w, &x, 1).unwrap();
            let xb = ctx.upload_bytes("x", bytemuck::cast_slice(&x)).unwrap();
            let yb = ctx.vector_buffer("y", f);
            let y = gpu::ops::BufView::whole(&yb);
            let bound = ctx
                .bind_gguf_glu(&w, &xb, &y, Some(&tb))
                .unwrap()
                .unwrap_or_else(|| panic!("{what}: no fused product"));
            assert!(
                bound.label.ends_with(&format!("_geglu {}", host.name)),
                "{}",
                bound.label
            );
            assert_eq!(bound.grids(), vec![[f as u32, 1, 1]], "{what}");
            let got = run_read(ctx, &bound, &yb, f);
            for i in 0..f {
                let (g, u) = (plain[i], plain[f + i]);
                let want = lowbit::runtime::cpu::geglu(g, u, table);
                assert_eq!(
                    got[i].to_bits(),
                    want.to_bits(),
                    "{what}: row {i}: gpu {} against geglu({g}, {u}) = {want}",
                    got[i]
                );
                match g {
                    g if g <= -10.0 => low += 1,
                    g if g >= 10.0 => high += 1,
                    _ => mid += 1,
                }
            }
            // Unequal parts: not a gate/up stack.
            w.parts = vec![f - 1, f + 1];
            assert!(
                ctx.bind_gguf_glu(&w, &xb, &y, Some(&tb)).unwrap().is_none(),
                "{what}: unequal parts"
            );
            // A table of half the entries: a shape error naming the weight.
            w.parts = vec![f, f];
            let short = ctx.vector_buffer("short table", 1 << 14);
            match ctx.bind_gguf_glu(&w, &xb, &y, Some(&short)) {
                Err(e) => assert!(e.to_string().contains(&host.name), "{e}"),
                Ok(_) => panic!("{what}: a short table was bound"),
            }
        }
        assert!(
            low > 0 && high > 0 && mid > 0,
            "branches: {low} {high} {mid}"
        );
    }
    // The caller runs op_geglu.
    glu_refusals("geglu", GgmlType::Q5_0, &mut seed, &|ctx, w, x, y| {
        let tb = ctx
            .upload_bytes("gelu table", bytemuck::cast_slice(table))
            .unwrap();
        ctx.bind_gguf_glu(w, x, y, Some(&tb)).unwrap()
    });
}

/// A stacked weight (Q, K and V of a layer as one, `GpuWeight::parts`) stores each part's
/// products as its own `[n, rows_j]` block, part after part: bit for bit each part's own
/// product (a row's sum does not depend on the rows beside it), for one token (the tuned
/// ternary kernel) and for three (the prefill product; for ternary with int8 activations the
/// int8 prefill product), both reductions, one chunk and several. The residual epilogue (`Epilogue::Accumulate`) into a view at an offset gives
/// `y0 + product * scale` as the CPU's residual add computes it (bit for bit with scale 1,
/// within one rounding otherwise: the GPU may fuse the multiply-add) and leaves the rest of
/// the buffer alone.
#[test]
fn stacked_weights_and_the_residual_epilogue_match_the_parts() {
    let capped = context_for_tests(&ContextOptions {
        max_binding_bytes: Some(8192),
        ..Default::default()
    });
    // With int8 activations (where the adapter takes them) three ternary tokens run the int8
    // prefill product: each part's outputs bit for bit its own, as with f32.
    let int8 = context_for_tests(&ContextOptions {
        int8: true,
        ..Default::default()
    })
    .filter(|c| c.decodes_int8(512));
    let mut ctxs = contexts();
    ctxs.extend(capped.as_ref());
    ctxs.extend(int8.as_ref());
    for ctx in ctxs {
        let mut seed = 21u64;
        let cases: Vec<Vec<Host>> = vec![
            [64, 32, 32]
                .iter()
                .map(|&r| Host::ternary(r, 512, &mut seed))
                .collect(),
            [40, 8, 24]
                .iter()
                .map(|&r| Host::gguf(GgmlType::Q4_0, r, 256, &mut seed))
                .collect(),
            [48, 48]
                .iter()
                .map(|&r| Host::gguf(GgmlType::Q6_K, r, 256, &mut seed))
                .collect(),
            [16, 8, 8]
                .iter()
                .map(|&r| Host::palette(4, 8, r, 256, &mut seed))
                .collect(),
        ];
        for parts in cases {
            let host = Host::stack(&parts);
            let mut w = host.upload(ctx).unwrap();
            w.parts = parts.iter().map(|h| h.rows).collect();
            let what = format!(
                "{} on {} ({} chunks)",
                host.name,
                ctx.info.name,
                w.chunks.len()
            );
            for n in [1usize, 3] {
                let x = random_x(n * host.cols, &mut seed);
                let xb = ctx.upload_bytes("x", bytemuck::cast_slice(&x)).unwrap();
                let total = n * host.rows;
                let yb = ctx.vector_buffer("y", total);
                let bound = ctx.bind_matmul(&w, &xb, &yb, n as u32).unwrap();
                if n > 1 && host.key == "ternary2" && ctx.decodes_int8(host.cols) {
                    assert!(bound.label.contains("_mmq_"), "{what}: {}", bound.label);
                    assert_eq!(bound.dispatches(), 1 + w.chunks.len(), "{what}");
                }
                let y = run_read(ctx, &bound, &yb, total);
                let mut start = 0;
                for p in &parts {
                    let alone = ctx
                        .run_matmul(&p.upload(ctx).unwrap(), &x, n as u32)
                        .unwrap();
                    let got = &y[start * n..(start + p.rows) * n];
                    assert_eq!(
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{what} n={n}: part of {} rows",
                        p.rows
                    );
                    start += p.rows;
                }
                // The residual epilogue into a view at an offset.
                let align = ctx.limits.min_storage_buffer_offset_alignment as usize / 4;
                let len = align + total + 16;
                let y0: Vec<f32> = random_x(len, &mut seed);
                for scale in [1.0f32, 0.375] {
                    let yb = ctx.vector_buffer("y", len);
                    ctx.queue.write_buffer(&yb, 0, bytemuck::cast_slice(&y0));
                    let view = ctx
                        .view(&yb, (align * 4) as u64, (total * 4) as u64)
                        .unwrap();
                    let bound = ctx
                        .bind_matmul_with(
                            &w,
                            &xb,
                            &view,
                            n as u32,
                            gpu::Epilogue::Accumulate(scale),
                        )
                        .unwrap();
                    let got = run_read(ctx, &bound, &yb, len);
                    for i in 0..len {
                        let inside = (align..align + total).contains(&i);
                        if !inside {
                            assert_eq!(got[i].to_bits(), y0[i].to_bits(), "{what}: {i} written");
                            continue;
                        }
                        let want = y0[i] + y[i - align] * scale;
                        let fused = y[i - align].mul_add(scale, y0[i]);
                        assert!(
                            got[i] == want || (scale != 1.0 && got[i] == fused),
                            "{what} n={n} scale {scale}: y[{i}] = {} + {} * {scale}: gpu {}, cpu {want}",
                            y0[i],
                            y[i - align],
                            got[i]
                        );
                    }
                }
                // The bias epilogue (y = sum + bias[r], the stacked parts' biases in row
                // order): bit for bit the sums plus the bias, as op_bias_add adds them; the
                // ternary kernels refuse it.
                let bias = random_x(host.rows, &mut seed);
                let bb = ctx
                    .upload_bytes("bias", bytemuck::cast_slice(&bias))
                    .unwrap();
                let yb = ctx.vector_buffer("y", total);
                let r =
                    ctx.bind_matmul_bias(&w, &xb, &gpu::ops::BufView::whole(&yb), n as u32, &bb);
                if host.key == "ternary2" {
                    assert!(r.is_err(), "{what}: a ternary bias epilogue");
                    continue;
                }
                let got = run_read(ctx, &r.unwrap(), &yb, total);
                let mut start = 0;
                for p in &parts {
                    for t in 0..n {
                        for j in 0..p.rows {
                            let i = start * n + t * p.rows + j;
                            let want = y[i] + bias[start + j];
                            assert_eq!(
                                got[i].to_bits(),
                                want.to_bits(),
                                "{what} n={n}: bias epilogue, part row {j} of token {t}"
                            );
                        }
                    }
                    start += p.rows;
                }
            }
        }
    }
}

/// A Q8_0 weight of at least `WIDE_MATVEC_MIN_ROWS` rows (a head) takes the single-token
/// kernel of `WIDE_MATVEC_ROWS` rows a workgroup, one row fewer the `_r2_` one; both equal
/// the CPU's products (the last workgroup of the wide one partly past the weight: its rows
/// read the last row again, their sums never stored).
#[test]
fn q8_0_heads_take_the_wide_kernel() {
    let mut seed = 8u64;
    let min = weights::WIDE_MATVEC_MIN_ROWS;
    let wide = weights::WIDE_MATVEC_ROWS as usize;
    // K = 640 (Gemma 3's head): 40 tasks of 16 codes a row, 20 units.
    let cols = 640;
    for ctx in contexts() {
        for (rows, kernel, per_wg) in [(min + 3, "_matvec_r8_", wide), (min - 1, "_matvec_r2_", 2)]
        {
            let host = Host::gguf(GgmlType::Q8_0, rows, cols, &mut seed);
            let w = host.upload(ctx).unwrap();
            let (x, y) = (ctx.vector_buffer("x", cols), ctx.vector_buffer("y", rows));
            let b = ctx.bind_matmul(&w, &x, &y, 1).unwrap();
            assert!(b.label.contains(kernel), "{rows} rows: {}", b.label);
            assert_eq!(
                b.grids(),
                vec![[rows.div_ceil(per_wg) as u32, 1, 1]],
                "{rows} rows"
            );
            check_matmul(ctx, &host, &w, 1, &mut seed);
        }
    }
}

/// The host binds an optional resource (a bias, the weight's second view) where the kernel's
/// entry point uses it, by naga's analysis of the source, which is what wgpu's derived bind
/// group layout holds: a kernel that declares a binding and never reads it gets a layout
/// without it, and binding it would fail. Here the used set of four kernels that declare the
/// same bindings (reading the bias, reading only y, reading the bias in a called function,
/// querying data4's length), and a bind group of exactly that set accepted by the derived
/// layout of each.
#[test]
fn optional_bindings_follow_use_not_declaration() {
    let decl = "@group(0) @binding(3) var<storage, read_write> y: array<f32>;\n\
                @group(0) @binding(6) var<storage, read> bias: array<f32>;\n\
                @group(0) @binding(9) var<storage, read> data4: array<vec4<u32>>;\n";
    let sources: std::collections::HashMap<String, String> = [
        (
            "declares_all_reads_bias",
            format!("{decl}@compute @workgroup_size(1) fn main() {{ y[0] = bias[0]; }}\n"),
        ),
        (
            "declares_all_reads_y_only",
            format!("{decl}@compute @workgroup_size(1) fn main() {{ y[0] = 1.0; }}\n"),
        ),
        // A use inside a function the entry point calls, and one by arrayLength only: both
        // count (naga merges a callee's uses into its caller's; a length query is a use).
        (
            "reads_bias_in_a_helper",
            format!(
                "{decl}fn b() -> f32 {{ return bias[0]; }}\n\
                 @compute @workgroup_size(1) fn main() {{ y[0] = b(); }}\n"
            ),
        ),
        (
            "queries_data4_length",
            format!(
                "{decl}@compute @workgroup_size(1) fn main() {{ y[0] = f32(arrayLength(&data4)); }}\n"
            ),
        ),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_string(), s))
    .collect();
    let Some(ctx) = gpu::context_for_tests(&ContextOptions {
        sources: Some(sources),
        ..Default::default()
    }) else {
        return;
    };
    let buf = |label| ctx.vector_buffer(label, 4);
    for (name, want) in [
        ("declares_all_reads_bias", vec![3u32, 6]),
        ("declares_all_reads_y_only", vec![3]),
        ("reads_bias_in_a_helper", vec![3, 6]),
        ("queries_data4_length", vec![3, 9]),
    ] {
        let used: Vec<u32> = ctx.used_bindings(name).iter().copied().collect();
        assert_eq!(used, want, "{name}");
        let pipeline = ctx.pipeline_named(name, None).unwrap();
        let bufs: Vec<wgpu::Buffer> = used.iter().map(|_| buf("b")).collect();
        let entries: Vec<wgpu::BindGroupEntry> = used
            .iter()
            .zip(&bufs)
            .map(|(&binding, b)| wgpu::BindGroupEntry {
                binding,
                resource: b.as_entire_binding(),
            })
            .collect();
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let _ = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(name),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let err = pollster::block_on(scope.pop());
        assert!(err.is_none(), "{name}: {err:?}");
    }
    // A kernel not among the sources: nothing.
    assert!(ctx.used_bindings("no_such_kernel").is_empty());
}

/// More than 65,535 workgroups (4 rows each): a 2-D grid, for one and three tokens.
#[test]
fn tall_weights_use_a_2d_grid() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let rows: usize = 4 * 65_535 + 7;
    assert_eq!(gpu::grid(rows.div_ceil(4) as u64), Some((65_535, 2)));
    let mut seed = 6u64;
    let host = Host::gguf(GgmlType::Q4_0, rows, 32, &mut seed);
    let w = host.upload(ctx).unwrap();
    let all: Vec<Vec<f32>> = (0..rows).map(|r| host.row(r)).collect();
    for n in [1, 3] {
        check_matmul_rows(ctx, &host, &all, &w, n, &mut seed);
    }
    let ids = [0u32, 65_535 * 4 + 3, rows as u32 - 1];
    let out = ctx.run_gather(&w, &ids).unwrap();
    for (t, &id) in ids.iter().enumerate() {
        assert_eq!(&out[t * 32..(t + 1) * 32], &all[id as usize][..], "id {id}");
    }
}

#[test]
fn unsupported_encodings_and_bad_shapes_are_refused_by_name() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let e = ctx
        .upload_gguf("blk.0.ffn_up.weight", GgmlType::IQ4_NL, 2, 32, &[0; 36])
        .unwrap_err();
    let s = e.to_string();
    assert!(
        s.contains("blk.0.ffn_up.weight") && s.contains("IQ4_NL"),
        "{s}"
    );
    let e = ctx
        .upload_gguf("odd", GgmlType::F32, 2, 40, &[0; 320])
        .unwrap_err();
    assert!(e.to_string().contains("odd [2, 40]"), "{e}");
    assert!(e.to_string().contains("multiple of 32"), "{e}");
    let e = ctx
        .upload_gguf("short", GgmlType::Q4_0, 2, 64, &[0; 71])
        .unwrap_err();
    assert!(e.to_string().contains("short [2, 64]"), "{e}");
    let e = ctx
        .upload_gguf("k", GgmlType::Q4_K, 1, 96, &[0; 54])
        .unwrap_err();
    assert!(e.to_string().contains("256"), "{e}");
    let e = ctx
        .upload_palette("p", 4, 32, 9, 1, 36, &[0; 4096], &[0; 144])
        .unwrap_err();
    assert!(e.to_string().contains("bits 9"), "{e}");
    let e = ctx
        .upload_palette("p", 4, 32, 4, 3, 16, &[0; 64], &[0; 64])
        .unwrap_err();
    assert!(e.to_string().contains("group size 3"), "{e}");
    let w = ctx
        .upload_gguf("w", GgmlType::F32, 2, 32, &[0; 256])
        .unwrap();
    let x = ctx.vector_buffer("x", 32);
    let y = ctx.vector_buffer("y", 2);
    let e = ctx.bind_matmul(&w, &x, &y, 2).err().unwrap();
    assert!(
        e.to_string().contains("2 tokens need x of 256 bytes"),
        "{e}"
    );
    assert!(ctx.bind_matmul(&w, &x, &y, 0).is_err());
    assert!(ctx.bind_matmul(&w, &x, &y, 1).is_ok());
    let ids = ctx.vector_buffer("ids", 1);
    let e = ctx.bind_gather(&w, &ids, &y, 1).err().unwrap();
    assert!(e.to_string().contains("out of 128 bytes"), "{e}");
    assert_eq!(w.bytes(), 256);
}

/// A few rows of one tensor of each type in bundles of the real models (`convert pack`,
/// `convert palettize` of one tensor, the tiny ternary model): products and gathers.
#[test]
fn real_model_tensors_of_every_type_match_cpu() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    use lowbit::runtime::model::{Model, Weight, WeightKind};
    let dir = tempfile::tempdir().unwrap();
    let convert = |args: &[&str], out: &str| -> std::path::PathBuf {
        let out = dir.path().join(out);
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_convert"))
            .args(&args[..args.len() - 1])
            .arg("-q")
            .arg("-o")
            .arg(&out)
            .arg(args[args.len() - 1])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        out
    };
    let tiny = common::repo().join("testdata/ternary/minicpm-tiny-tq2_0.gguf");
    let tiny = tiny.to_str().unwrap();
    let mut bundles = vec![
        convert(&["pack", tiny], "tiny-pack.bundle"),
        convert(&["gguf-to-ternary", tiny], "tiny-ternary.bundle"),
    ];
    for m in [
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "gemma-3-270m-q4_k_m.gguf",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    ] {
        let Some(p) = common::model(m) else { continue };
        let p = p.to_str().unwrap().to_string();
        bundles.push(convert(&["pack", &p], &format!("{m}.pack.bundle")));
        if m.starts_with("SmolLM2") {
            bundles.push(convert(
                &[
                    "palettize",
                    "--bits",
                    "3",
                    "--mode",
                    "uniform",
                    "--group-size",
                    "16",
                    "--include",
                    "blk.0.ffn_down.weight",
                    &p,
                ],
                "smollm2-palette.bundle",
            ));
        }
    }
    let mut seed = 7u64;
    let mut seen = BTreeMap::new();
    for b in &bundles {
        let model = Model::new(lowbit::bundle::reader::Bundle::open(b).unwrap()).unwrap();
        let mut all: Vec<&Weight> = vec![&model.tok_embd, &model.output, &model.output_norm];
        for l in &model.layers {
            all.extend(l.matrices());
        }
        for w in all {
            let key = match &w.kind {
                WeightKind::Gguf { ty, .. } => ty.name().to_string(),
                WeightKind::Ternary { .. } => "ternary2".into(),
                WeightKind::Palette { bits, .. } => format!("palette {bits}-bit"),
            };
            let stem = b.file_name().unwrap().to_string_lossy().to_string();
            if seen.contains_key(&(stem.clone(), key.clone())) {
                continue;
            }
            // At most 37 rows from the middle of a GGUF tensor (its byte range narrowed);
            // ternary and palette tensors whole.
            let part = match w.kind {
                WeightKind::Gguf { ty, range } if w.rows > 37 => {
                    let rb = ty.bytes_for(w.cols as u64).unwrap();
                    let r0 = (w.rows / 2) as u64;
                    Weight {
                        name: format!("{}[{r0}..{}]", w.name, r0 + 37),
                        rows: 37,
                        kind: WeightKind::Gguf {
                            ty,
                            range: (range.0 + r0 * rb, 37 * rb),
                        },
                        ..w.clone()
                    }
                }
                _ => w.clone(),
            };
            let rows: Vec<Vec<f32>> = (0..part.rows)
                .map(|r| {
                    let mut v = vec![0f32; part.cols];
                    part.row_values(&model.bundle, r, &mut v);
                    v
                })
                .collect();
            let g = ctx.upload_model_weight(&model.bundle, &part).unwrap();
            let host = Host {
                name: format!("{stem}: {} ({key})", part.name),
                key: format!("real {key}"),
                rows: part.rows,
                cols: part.cols,
                kind: match &part.kind {
                    WeightKind::Ternary { codes, scales } => HostKind::Ternary(
                        bytemuck::cast_slice(part.bytes(&model.bundle, *codes)).to_vec(),
                        bytemuck::cast_slice(part.bytes(&model.bundle, *scales)).to_vec(),
                    ),
                    // Only the scales matter to check_matmul (ternary); rows come from
                    // row_values.
                    _ => HostKind::Gguf(GgmlType::F32, vec![]),
                },
            };
            for n in [1, 3] {
                let mut s = seed;
                check_matmul_rows(ctx, &host, &rows, &g, n, &mut s);
                seed = s;
            }
            let ids: Vec<u32> = vec![0, part.rows as u32 - 1, (part.rows / 2) as u32];
            let out = ctx.run_gather(&g, &ids).unwrap();
            for (t, &id) in ids.iter().enumerate() {
                let got = &out[t * part.cols..(t + 1) * part.cols];
                let want = &rows[id as usize];
                assert!(
                    got.iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{}: gather of row {id} differs",
                    host.name
                );
            }
            eprintln!("{}: [{}, {}] ok", host.name, part.rows, part.cols);
            seen.insert((stem, key), ());
        }
    }
    let kinds: std::collections::BTreeSet<_> = seen.keys().map(|(_, k)| k.clone()).collect();
    eprintln!("real tensors checked, by encoding: {kinds:?}");
    print_worst(
        &kinds
            .iter()
            .map(|k| format!("real {k}"))
            .collect::<Vec<_>>(),
    );
    print_worst(&["real ternary2 (single token, gpu::tolerance)".to_string()]);
    assert!(
        kinds.contains("ternary2") && kinds.contains("TQ2_0"),
        "{kinds:?}"
    );
}

/// Decode throughput on a large weight (`[65536, 4096]`, about an 8B model's FFN share per
/// token): weight bytes read per second by the single-token product, and by the 16-token
/// product per token. Not a correctness test and slow on a CPU adapter: run by hand on a real
/// GPU with `--ignored --nocapture throughput`.
#[test]
#[ignore]
fn throughput() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let (rows, cols) = (65_536usize, 4096usize);
    let mut seed = 8u64;
    let hosts = [
        Host::gguf(GgmlType::Q4_0, rows, cols, &mut seed),
        Host::gguf(GgmlType::Q4_K, rows, cols, &mut seed),
        Host::gguf(GgmlType::Q6_K, rows, cols, &mut seed),
        Host::gguf(GgmlType::Q8_0, rows, cols, &mut seed),
        Host::gguf(GgmlType::F16, rows, cols, &mut seed),
        Host::ternary(rows, cols, &mut seed),
        Host::palette(4, 64, rows, cols, &mut seed),
    ];
    eprintln!("adapter {} ({:?})", ctx.info.name, ctx.weight_reduction());
    for host in &hosts {
        let w = host.upload(ctx).unwrap();
        for n in [1u32, 16] {
            let x = ctx
                .upload_bytes(
                    "x",
                    bytemuck::cast_slice(&random_x(n as usize * cols, &mut seed)),
                )
                .unwrap();
            let y = ctx.vector_buffer("y", n as usize * rows);
            let bound = ctx.bind_matmul(&w, &x, &y, n).unwrap();
            let run = |iters: usize| {
                let mut enc = ctx
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
                {
                    let mut pass = enc.begin_compute_pass(&Default::default());
                    for _ in 0..iters {
                        bound.encode(&mut pass);
                    }
                }
                ctx.queue.submit([enc.finish()]);
                ctx.device
                    .poll(wgpu::PollType::wait_indefinitely())
                    .unwrap();
            };
            run(3);
            let iters = 200;
            let t = std::time::Instant::now();
            run(iters);
            let s = t.elapsed().as_secs_f64() / iters as f64;
            eprintln!(
                "{} n={n}: {:.1} us per product, {:.0} GB/s of weight ({:.0} GB/s per token)",
                host.name,
                s * 1e6,
                w.bytes() as f64 / s / 1e9,
                w.bytes() as f64 * n as f64 / s / 1e9
            );
        }
    }
}
