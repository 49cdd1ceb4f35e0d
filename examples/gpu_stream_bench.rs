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
//! 4096 x 16384 and 32768 x 4096 ternary weights and its Q6_K head). The adapter is the one
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

fn main() -> anyhow::Result<()> {
    let sizes: Vec<f64> = match std::env::args().skip(1).map(|s| s.parse()).collect() {
        Ok(v) if !Vec::<f64>::is_empty(&v) => v,
        Ok(_) => vec![4.4, 17.4, 34.8, 247.0],
        Err(e) => anyhow::bail!("usage: gpu_stream_bench [MB ...]: {e}"),
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
    let dev = &ctx.device;
    println!(
        "timing: {}",
        if ctx.has_timestamps() {
            "timestamp queries around the pass"
        } else {
            "wall clock, submit to done"
        }
    );
    // (name, WG, L, looped workgroups)
    let mut layouts: Vec<(String, u32, u32, Option<u32>)> = Vec::new();
    for wg in [128u32, 256] {
        for l in [1u32, 2, 4, 8] {
            layouts.push((format!("tile_wg{wg}_l{l}"), wg, l, None));
        }
    }
    for groups in [132u32 * 4, 132 * 8, 132 * 16] {
        for l in [2u32, 4, 8] {
            layouts.push((format!("loop{groups}_wg256_l{l}"), 256, l, Some(groups)));
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
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let data: Vec<u32> = (0..n * 4)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u32
            })
            .collect();
        let want = data.iter().fold(0u32, |a, &v| a ^ v);
        let bufs: Vec<wgpu::Buffer> = (0..copies)
            .map(|i| ctx.upload_bytes(&format!("w{i}"), bytemuck::cast_slice(&data)))
            .collect::<Result<_, _>>()?;
        let outs: Vec<wgpu::Buffer> = (0..copies)
            .map(|i| ctx.vector_buffer(&format!("o{i}"), 1))
            .collect();
        for (name, wg, l, looped) in &layouts {
            let per = (*wg * *l) as usize;
            let groups = match looped {
                Some(g) => (*g as usize).min(n.div_ceil(per)),
                None => n.div_ceil(per),
            };
            let gx = groups.min(65_535);
            let gy = groups.div_ceil(gx);
            let params: [u32; 4] = [n as u32, gx as u32, groups as u32, 0];
            let ub = dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some("params"),
                size: 16,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            ctx.queue
                .write_buffer(&ub, 0, bytemuck::cast_slice(&params));
            let desc = wgpu::ShaderModuleDescriptor {
                label: Some(name),
                source: wgpu::ShaderSource::Wgsl(source(*wg, *l, looped.is_some()).into()),
            };
            // SAFETY: every load's index is clamped to `p.n - 1` (the buffer's last vector)
            // and the one store is to element 0: no access leaves its buffer. Compiled as
            // the backend compiles its own kernels (without wgpu's checks).
            let module = unsafe {
                dev.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
            };
            let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(name),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
            let layout = pipeline.get_bind_group_layout(0);
            let bind = |w: &wgpu::Buffer, o: &wgpu::Buffer| {
                dev.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: &layout,
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
            };
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
                            pass.dispatch_workgroups(gx as u32, gy as u32, 1);
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
