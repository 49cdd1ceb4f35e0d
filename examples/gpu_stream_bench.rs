//! What one dispatch that only reads a weight-sized buffer achieves through wgpu on this
//! adapter: the roofline the decode products are held against. Each size is uploaded as many
//! times as it takes to pass 1 GiB (many times the largest L2) and the dispatches cycle
//! through the copies, so every read comes from device memory, as the products' does in
//! `gpu_matvec_bench`. The kernel reads `vec4<u32>`s and folds them by XOR (a data-dependent
//! store keeps the reads from being removed; the fold is checked against the CPU's).
//!
//! Two ways to lay out the reads:
//! - `tile`: workgroup `g` of `WG` invocations reads the `WG * L` vectors from `g * WG * L`,
//!   invocation `i` the vectors `i, i + WG, ...` (each load instruction of a subgroup is
//!   coalesced), all `L` loads issued before any is used; one pass, as many workgroups as the
//!   size needs (a 2-D grid past 65,535).
//! - `loop`: `G` workgroups (a multiple of the adapter's SM count is the usual choice) stride
//!   over the buffer, `L` loads in flight per invocation per iteration.
//!
//! Two figures per size and layout (GB/s = bytes read / time): `chain` (the dispatches back to
//! back in one pass, each writing the same output, so wgpu puts a barrier between each two, as
//! between the dependent products of a decode step; span / count) and `overlap` (each writing
//! its own output: no barriers, the read throughput with the launch gaps hidden).
//!
//! Usage: `gpu_stream_bench [MB ...]` (default 4.4 17.4 34.8 247: the 8B shape's 4096 x 4096,
//! 4096 x 16384 and 32768 x 4096 ternary weights and its Q6_K head).
//!
//! `gpu_stream_bench step`: the floor of a one-op-per-dispatch decode step of the 8B ternary
//! shape (MiniCPM4-8B: 32 layers, 4096 x 4096 output, 4608 x 4096 Q/K/V, 32768 x 4096
//! gate/up, 4096 x 16384 down at 2 bits with f32 block scales, a 73,448 x 4096 Q6_K head)
//! on this stack: the step's 261 dispatches in their order (per layer: quantize, Q/K/V,
//! attention, combine, output, quantize, gate/up, down; then the norm, the head, the scales),
//! each only reading its own buffer of the bytes that op reads (the weights; x, the KV cache
//! at position 512, the attention's partials for the small ops) with the fastest layout of
//! the table above for its size, one pass, every dispatch writing the same output so wgpu
//! puts a barrier between each two, as between the step's dependent ops. Also the 129
//! weight reads alone (every small op fused away), and both without barriers (each
//! dispatch its own output: the reads overlap). The weights (2.26 GB) pass through L2 once a step, so they come from memory. The adapter is the one
//! `convert run --backend gpu` picks (`LOWBIT_GPU_ADAPTER`: an index or a name substring).
//! Times from timestamp queries around the pass where the adapter has them, else wall clock.
use lowbit::runtime::gpu::{AdapterSelector, ContextOptions, GpuContext};

fn source(wg: u32, l: u32, looped: bool) -> String {
    let mut s = format!(
        "const WG: u32 = {wg}u;\nconst L: u32 = {l}u;\n\
         struct P {{ n: u32, groups_x: u32, groups: u32, pad: u32 }}\n\
         @group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;\n\
         @group(0) @binding(1) var<storage, read_write> out: array<u32>;\n\
         @group(0) @binding(2) var<uniform> p: P;\n\
         @compute @workgroup_size(WG)\n\
         fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{\n\
         \x20   let g = wid.y * p.groups_x + wid.x;\n\
         \x20   var acc = vec4<u32>(0u);\n"
    );
    let loads = |s: &mut String, ind: &str| {
        for j in 0..l {
            s.push_str(&format!(
                "{ind}let i{j} = base + {j}u * WG;\n{ind}let v{j} = select(vec4<u32>(0u), w[min(i{j}, p.n - 1u)], i{j} < p.n);\n"
            ));
        }
        for j in 0..l {
            s.push_str(&format!("{ind}acc ^= v{j};\n"));
        }
    };
    if looped {
        s.push_str(
            "    for (var base = g * WG * L + lid; base < p.n; base += p.groups * WG * L) {\n",
        );
        loads(&mut s, "        ");
        s.push_str("    }\n");
    } else {
        s.push_str("    let base = g * WG * L + lid;\n");
        loads(&mut s, "    ");
    }
    s.push_str(
        "    let f = (acc.x ^ acc.y) ^ (acc.z ^ acc.w);\n\
         \x20   if f != 0u {\n        atomicXor(&outa[0], f);\n    }\n}\n",
    );
    // One u32 XOR-accumulated by every invocation whose fold is not zero.
    s.replace(
        "var<storage, read_write> out: array<u32>;",
        "var<storage, read_write> outa: array<atomic<u32>>;",
    )
}

/// A read kernel's layout: `wg` invocations a workgroup, `l` loads in flight each, and
/// `looped`: that many workgroups striding over the buffer (else one pass, `tile`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Layout {
    wg: u32,
    l: u32,
    looped: Option<u32>,
}

impl Layout {
    /// The workgroups that read `n` vectors, and the grid (x, y) holding them (y past 65,535).
    fn grid(self, n: usize) -> (usize, u32, u32) {
        let per = (self.wg * self.l) as usize;
        let groups = match self.looped {
            Some(g) => (g as usize).min(n.div_ceil(per)),
            None => n.div_ceil(per),
        };
        let gx = groups.min(65_535);
        (groups, gx as u32, groups.div_ceil(gx) as u32)
    }

    /// The kernel's pipeline.
    fn pipeline(self, dev: &wgpu::Device, label: &str) -> wgpu::ComputePipeline {
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(label),
            source: wgpu::ShaderSource::Wgsl(source(self.wg, self.l, self.looped.is_some()).into()),
        };
        // SAFETY: every load's index is clamped to `p.n - 1` (the buffer's last vector) and
        // the one store is to element 0: no access leaves its buffer. Compiled as the backend
        // compiles its own kernels (without wgpu's checks).
        let module = unsafe {
            dev.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
        };
        dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        })
    }

    /// The kernel's parameters for `n` vectors, as its uniform buffer.
    fn params(self, ctx: &GpuContext, n: usize) -> wgpu::Buffer {
        let (groups, gx, _) = self.grid(n);
        let params: [u32; 4] = [n as u32, gx, groups as u32, 0];
        let ub = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params"),
            size: 16,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        ctx.queue
            .write_buffer(&ub, 0, bytemuck::cast_slice(&params));
        ub
    }
}

/// A read kernel's bind group: the buffer `w` it reads, the word `o` it XORs into, its
/// parameters `ub`.
fn bind(
    dev: &wgpu::Device,
    pipeline: &wgpu::ComputePipeline,
    w: &wgpu::Buffer,
    o: &wgpu::Buffer,
    ub: &wgpu::Buffer,
) -> wgpu::BindGroup {
    dev.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: w.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: o.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: ub.as_entire_binding(),
            },
        ],
    })
}

/// `n` pseudo-random words (xorshift64 from `seed`, which moves on): the contents do not
/// change a read's time, but the fold checks them.
fn random_words(n: usize, seed: &mut u64) -> Vec<u32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed as u32
        })
        .collect()
}

/// The bytes each dispatch of the 8B shape's decode step reads at position 512, in step
/// order, and whether it is a weight product.
fn step_reads() -> Vec<(u64, bool)> {
    // Ternary: 2 bits a weight and one f32 scale per 256-block (the q8g4 kernels' scales).
    let tern = |rows: u64, cols: u64| rows * cols / 4 + rows * (cols / 256) * 4;
    let x = 4096 * 4; // one f32 activation vector
    let kv = 2 * 2 * 128 * 512 * 2; // K and V, 2 KV heads, head_dim 128, 512 positions, f16
    let partials = 32 * 17 * (128 + 2) * 4; // 32 heads, 17 splits of (128 values, max, sum)
    let mut v = vec![(4096 * 144 / 256, false)]; // the embedding row (Q4_K)
    for _ in 0..32 {
        v.extend([
            (x, false),
            (tern(4608, 4096), true),
            (kv, false),
            (partials, false),
            (tern(4096, 4096), true),
            (x, false),
            (tern(32768, 4096), true),
            (tern(4096, 16384), true),
        ]);
    }
    v.push((x, false)); // the final norm
    v.push((73_448 * 4096 / 256 * 210, true)); // the Q6_K head
    v.push((73_448 * 4, false)); // the logits' scale (MiniCPM's logit multiplier)
    v.push((x, false)); // the embedding scale (first in the real step; its bytes here)
    v
}

/// `gpu_stream_bench step` (the module's doc).
fn step_floor(ctx: &GpuContext) -> anyhow::Result<()> {
    let dev = &ctx.device;
    // A read past the adapter's largest binding (the Q6_K head on an adapter of 128 MiB
    // bindings) is cut to it, and said.
    let cap = ctx.max_binding_bytes / 16 * 16;
    let mut reads = step_reads();
    for r in reads.iter_mut().filter(|r| r.0 > cap) {
        println!(
            "a read of {} bytes cut to the adapter's largest binding, {cap}",
            r.0
        );
        r.0 = cap;
    }
    let total: u64 = reads.iter().map(|r| r.0).sum();
    println!(
        "8B step: {} dispatches ({} weight products), {:.3} GB read",
        reads.len(),
        reads.iter().filter(|r| r.1).count(),
        total as f64 / 1e9
    );
    // The layout by size: the fastest of the table's at 4.4, 17.4, 34.8 and 247 MB on an
    // H200 (BENCHMARKS.md), one load an invocation below 1 MB.
    let layout = |bytes: u64| -> Layout {
        let (wg, l, looped) = match bytes {
            b if b < 1 << 20 => (128, 1, None),
            b if b < 10_000_000 => (256, 8, None),
            b if b < 100_000_000 => (256, 4, Some(528)),
            _ => (256, 8, Some(528)),
        };
        Layout { wg, l, looped }
    };
    let mut pipelines = std::collections::HashMap::new();
    for &(b, _) in &reads {
        let lay = layout(b);
        pipelines
            .entry(lay)
            .or_insert_with(|| lay.pipeline(dev, "step read"));
    }
    // Each dispatch: its layout, grid, its buffer, its params, its own output.
    struct D {
        lay: Layout,
        grid: (u32, u32),
        w: wgpu::Buffer,
        p: wgpu::Buffer,
        own: wgpu::Buffer,
        weight: bool,
    }
    let mut ds = Vec::with_capacity(reads.len());
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for (i, &(bytes, weight)) in reads.iter().enumerate() {
        let n = (bytes as usize).div_ceil(16);
        let data = random_words(n * 4, &mut seed);
        let lay = layout(bytes);
        let (_, gx, gy) = lay.grid(n);
        ds.push(D {
            lay,
            grid: (gx, gy),
            w: ctx.upload_bytes(&format!("w{i}"), bytemuck::cast_slice(&data))?,
            p: lay.params(ctx, n),
            own: ctx.vector_buffer(&format!("o{i}"), 1),
            weight,
        });
    }
    let shared = ctx.vector_buffer("out", 1);
    let bind = |d: &D, o: &wgpu::Buffer| bind(dev, &pipelines[&d.lay], &d.w, o, &d.p);
    let chain: Vec<wgpu::BindGroup> = ds.iter().map(|d| bind(d, &shared)).collect();
    let own: Vec<wgpu::BindGroup> = ds.iter().map(|d| bind(d, &d.own)).collect();
    // Median of 9 passes of one step each (after one to warm up), us.
    let time = |groups: &[wgpu::BindGroup], weights_only: bool| -> anyhow::Result<(f64, usize)> {
        let mut ts = Vec::new();
        let mut count = 0;
        for rep in 0..10 {
            count = 0;
            let t = ctx.time_pass(&mut |pass| {
                for (d, g) in ds.iter().zip(groups) {
                    if weights_only && !d.weight {
                        continue;
                    }
                    pass.set_pipeline(&pipelines[&d.lay]);
                    pass.set_bind_group(0, g, &[]);
                    pass.dispatch_workgroups(d.grid.0, d.grid.1, 1);
                    count += 1;
                }
            })?;
            if rep > 0 {
                ts.push(t.ns / 1e3);
            }
        }
        ts.sort_by(f64::total_cmp);
        Ok((ts[ts.len() / 2], count))
    };
    println!("| form | dispatches | step us (median of 9) | tok/s at that step | GB/s |");
    println!("|---|---:|---:|---:|---:|");
    let weight_bytes: u64 = reads.iter().filter(|r| r.1).map(|r| r.0).sum();
    for (name, groups, weights_only) in [
        ("every op, barriers (the design's floor)", &chain, false),
        ("weight products only, barriers", &chain, true),
        ("every op, no barriers", &own, false),
        ("weight products only, no barriers", &own, true),
    ] {
        let (us, count) = time(groups, weights_only)?;
        let b = if weights_only { weight_bytes } else { total };
        println!(
            "| {name} | {count} | {us:.1} | {:.0} | {:.0} |",
            1e6 / us,
            b as f64 / us / 1e3
        );
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let step = std::env::args().nth(1).as_deref() == Some("step");
    let sizes: Vec<f64> = match std::env::args().skip(1).map(|s| s.parse()).collect() {
        _ if step => Vec::new(),
        Ok(v) if !Vec::<f64>::is_empty(&v) => v,
        Ok(_) => vec![4.4, 17.4, 34.8, 247.0],
        Err(e) => anyhow::bail!("usage: gpu_stream_bench [MB ...] | step: {e}"),
    };
    let adapter = match std::env::var("LOWBIT_GPU_ADAPTER") {
        Ok(s) => Some(s.parse::<AdapterSelector>()?),
        Err(_) => None,
    };
    let ctx = GpuContext::new(&ContextOptions {
        adapter,
        ..Default::default()
    })?;
    println!(
        "adapter: {} ({:?}, driver {} {})",
        ctx.info.name, ctx.info.backend, ctx.info.driver, ctx.info.driver_info
    );
    if step {
        return step_floor(&ctx);
    }
    let dev = &ctx.device;
    println!(
        "timing: {}",
        if ctx.has_timestamps() {
            "timestamp queries around the pass"
        } else {
            "wall clock, submit to done"
        }
    );
    // (name, layout)
    let mut layouts: Vec<(String, Layout)> = Vec::new();
    for wg in [128u32, 256] {
        for l in [1u32, 2, 4, 8] {
            let lay = Layout {
                wg,
                l,
                looped: None,
            };
            layouts.push((format!("tile_wg{wg}_l{l}"), lay));
        }
    }
    for groups in [132u32 * 4, 132 * 8, 132 * 16] {
        for l in [2u32, 4, 8] {
            let lay = Layout {
                wg: 256,
                l,
                looped: Some(groups),
            };
            layouts.push((format!("loop{groups}_wg256_l{l}"), lay));
        }
    }
    println!("| MB | layout | workgroups | chain us | chain GB/s | overlap us | overlap GB/s |");
    println!("|---:|---|---:|---:|---:|---:|---:|");
    for &mb in &sizes {
        anyhow::ensure!(
            mb > 0.0 && mb <= 1024.0,
            "{mb}: sizes are in MB, up to 1024"
        );
        let n = ((mb * 1e6) as usize / 16).max(1);
        let bytes = (n * 16) as u64;
        let copies = (1u64 << 30).div_ceil(bytes).clamp(1, 256) as usize;
        let data = random_words(n * 4, &mut 0x2545_f491_4f6c_dd1du64);
        let want = data.iter().fold(0u32, |a, &v| a ^ v);
        let bufs: Vec<wgpu::Buffer> = (0..copies)
            .map(|i| ctx.upload_bytes(&format!("w{i}"), bytemuck::cast_slice(&data)))
            .collect::<Result<_, _>>()?;
        let outs: Vec<wgpu::Buffer> = (0..copies)
            .map(|i| ctx.vector_buffer(&format!("o{i}"), 1))
            .collect();
        for (name, lay) in &layouts {
            let (groups, gx, gy) = lay.grid(n);
            let ub = lay.params(&ctx, n);
            let pipeline = lay.pipeline(dev, name);
            let bind = |w: &wgpu::Buffer, o: &wgpu::Buffer| bind(dev, &pipeline, w, o, &ub);
            let chain: Vec<wgpu::BindGroup> = bufs.iter().map(|b| bind(b, &outs[0])).collect();
            let own: Vec<wgpu::BindGroup> =
                bufs.iter().zip(&outs).map(|(b, o)| bind(b, o)).collect();
            let k = (copies * 4).max(64);
            // Microseconds a dispatch over a pass of k (the best of 3).
            let run = |groups: &[wgpu::BindGroup]| -> anyhow::Result<f64> {
                let mut best = f64::INFINITY;
                for _ in 0..3 {
                    let t = ctx.time_pass(&mut |pass| {
                        pass.set_pipeline(&pipeline);
                        for i in 0..k {
                            pass.set_bind_group(0, &groups[i % groups.len()], &[]);
                            pass.dispatch_workgroups(gx, gy, 1);
                        }
                    })?;
                    best = best.min(t.ns / 1e3 / k as f64);
                }
                Ok(best)
            };
            for o in &outs {
                ctx.queue.write_buffer(o, 0, &[0u8; 4]);
            }
            let tc = run(&chain)?;
            let to = run(&own)?;
            // Check: the last copy's own output XORs every pass over that copy (each gives
            // the data's fold), so it holds the fold or zero by the count's parity (with one
            // copy the chain's passes wrote it too).
            let mut times = 3 * (k / copies + usize::from(copies - 1 < k % copies));
            if copies == 1 {
                times += 3 * k;
            }
            let got = u32::from_le_bytes(ctx.read_buffer(&outs[copies - 1], 4)?[..4].try_into()?);
            let expect = if times % 2 == 1 { want } else { 0 };
            anyhow::ensure!(
                got == expect,
                "{name} at {mb} MB: fold {got:#x}, expected {expect:#x} after {times} passes"
            );
            let gbs = |us: f64| bytes as f64 / us / 1e3;
            println!(
                "| {mb} | {name} | {groups} | {tc:.2} | {:.0} | {to:.2} | {:.0} |",
                gbs(tc),
                gbs(to)
            );
        }
    }
    Ok(())
}
