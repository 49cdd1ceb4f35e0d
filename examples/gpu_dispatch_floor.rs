//! The GPU's cost of one dependent dispatch: a chain of K dispatches in one compute pass, each
//! reading the buffer the one before wrote (`b = a + 1`, then `a = b + 1`, ...; wgpu puts a
//! barrier between each two), over n f32 values (n / 256 workgroups), timed for K = 1 and K =
//! 1024 from the same submission path; the slope is what each dispatch of a decode step's
//! chain costs at least, whatever its work. With the step's dispatch count this bounds the
//! decode speed the one-op-per-dispatch design can reach (a step of D dependent dispatches
//! takes at least D times the slope). The chain's result is checked (every value = K). Beside
//! it, up to 65,536 values, the same number of independent dispatches (each writing a buffer
//! of its own, so wgpu puts no barrier between them): where those cost much less, the barrier
//! is the cost, not the launch.
//!
//! Usage: `gpu_dispatch_floor [N_VALUES ...]` (default 256 4096 1048576); the adapter is the
//! one `convert run --backend gpu` picks without `--gpu-adapter` (`LOWBIT_GPU_ADAPTER`: an
//! index or a name substring). Times from timestamp queries around the pass where the adapter
//! has them, else the wall clock from submit to done.

use lowbit::runtime::gpu::{AdapterSelector, ContextOptions, GpuContext};

const SRC: &str = r#"
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if id.x < arrayLength(&b) {
        b[id.x] = a[id.x] + 1.0;
    }
}
"#;

fn main() -> anyhow::Result<()> {
    let sizes: Vec<usize> = match std::env::args().skip(1).map(|s| s.parse()).collect() {
        Ok(v) if !Vec::<usize>::is_empty(&v) => v,
        Ok(_) => vec![256, 4096, 1 << 20],
        Err(e) => anyhow::bail!("usage: gpu_dispatch_floor [N_VALUES ...]: {e}"),
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
    let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("chain"),
        source: wgpu::ShaderSource::Wgsl(SRC.into()),
    });
    let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("chain"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    println!(
        "timing: {}",
        if ctx.has_timestamps() {
            "timestamp queries around the pass"
        } else {
            "wall clock, submit to done"
        }
    );
    println!("| values | workgroups | dispatches | pass us | us a dependent dispatch (slope from 1) | us an independent one | CPU encode us a dispatch |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for &n in &sizes {
        anyhow::ensure!(n > 0, "N_VALUES must be positive");
        let groups = n.div_ceil(256);
        anyhow::ensure!(groups <= 65_535, "{n} values: more than 65,535 workgroups");
        let bytes = (n * 4) as u64;
        let buf = |label| {
            dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        let (a, b) = (buf("a"), buf("b"));
        let layout = pipeline.get_bind_group_layout(0);
        let bind = |src: &wgpu::Buffer, dst: &wgpu::Buffer| {
            dev.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &layout,
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: src.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: dst.as_entire_binding(),
                    },
                ],
            })
        };
        let (ab, ba) = (bind(&a, &b), bind(&b, &a));
        // Independent dispatches: each reads `a` and writes a buffer of its own (no hazard, so
        // no barrier between them), where 1024 buffers of n values take at most 256 MiB.
        let k = 1024;
        let own: Vec<(wgpu::Buffer, wgpu::BindGroup)> = if n <= 65_536 {
            (0..k)
                .map(|_| {
                    let d = buf("own");
                    let g = bind(&a, &d);
                    (d, g)
                })
                .collect()
        } else {
            Vec::new()
        };
        // Microseconds of a pass of k dispatches (the best of 5), and the CPU encode time;
        // `indep`: each dispatch on its own buffer instead of the chain.
        let run = |k: usize, indep: bool| -> anyhow::Result<(f64, f64)> {
            let mut best = (f64::INFINITY, f64::INFINITY);
            for _ in 0..5 {
                ctx.queue.write_buffer(&a, 0, &vec![0u8; n * 4]);
                let t = ctx.time_pass(&mut |pass| {
                    pass.set_pipeline(&pipeline);
                    // `i` picks the chain's buffer pair too, not only `own`'s entry.
                    #[allow(clippy::needless_range_loop)]
                    for i in 0..k {
                        let g = match indep {
                            true => &own[i].1,
                            false if i % 2 == 0 => &ab,
                            false => &ba,
                        };
                        pass.set_bind_group(0, g, &[]);
                        pass.dispatch_workgroups(groups as u32, 1, 1);
                    }
                })?;
                let (us, enc_us) = (t.ns / 1e3, t.encode_ns / 1e3);
                best = (best.0.min(us), best.1.min(enc_us));
            }
            // The result: the chain's k additions of 1 to zeros, or 1 in every own buffer.
            let (last, want) = match indep {
                true => (&own[k - 1].0, 1.0),
                false if k % 2 == 1 => (&b, k as f32),
                false => (&a, k as f32),
            };
            let got: Vec<f32> = bytemuck::cast_slice(&ctx.read_buffer(last, bytes)?).to_vec();
            anyhow::ensure!(
                got.iter().all(|&v| v == want),
                "{n} values, {k} dispatches (independent: {indep}): wrong result (first value {})",
                got[0]
            );
            Ok(best)
        };
        let (t1, _) = run(1, false)?;
        let (tk, enc) = run(k, false)?;
        let indep = if own.is_empty() {
            "-".to_string()
        } else {
            let (ti, _) = run(k, true)?;
            format!("{:.2}", (ti - t1) / (k - 1) as f64)
        };
        println!(
            "| {n} | {groups} | {k} | {tk:.1} | {:.2} | {indep} | {:.2} |",
            (tk - t1) / (k - 1) as f64,
            enc / k as f64
        );
    }
    Ok(())
}
