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
//! dispatch its own output: the reads overlap). The weights (2.26 GB) pass through L2 once a
//! step, so they come from memory.
//!
//! `gpu_stream_bench persistent [G ...]` (default 132 264 528): `step`'s table, then the same
//! reads as the phases of one dispatch of G workgroups with a grid-wide barrier between
//! phases ([`persistent_source`]): the floor of a decode step run as one persistent kernel.
//! The barrier assumes every workgroup is resident at once (WGSL and Vulkan do not promise
//! it, wgpu cannot tell): a spin that waits too long gives up, and the row says how many
//! did ("barriers void"; the time is then meaningless). `LOWBIT_STREAM_LAYERS` = N shortens
//! the step (a smoke test; lavapipe runs it, with void or miscounted barriers at G > 1).
//!
//! The adapter is the one `convert run --backend gpu` picks (`LOWBIT_GPU_ADAPTER`: an index or a name substring).
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

/// The compute pipeline of `wgsl` (entry point `main`), compiled as the backend compiles its
/// own kernels: without wgpu's bounds checks.
///
/// # Safety
/// Every access the kernel makes stays inside the buffer it indexes.
unsafe fn unchecked_pipeline(
    dev: &wgpu::Device,
    label: &str,
    wgsl: String,
) -> wgpu::ComputePipeline {
    let desc = wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(wgsl.into()),
    };
    // SAFETY: the caller's promise.
    let module =
        unsafe { dev.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) };
    dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(label),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    })
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
        let wgsl = source(self.wg, self.l, self.looped.is_some());
        // SAFETY: every load's index is clamped to `p.n - 1` (the buffer's last vector) and
        // the one store is to element 0: no access leaves its buffer.
        unsafe { unchecked_pipeline(dev, label, wgsl) }
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
fn step_reads(layers: usize) -> Vec<(u64, bool)> {
    // Ternary: 2 bits a weight and one f32 scale per 256-block (the q8g4 kernels' scales).
    let tern = |rows: u64, cols: u64| rows * cols / 4 + rows * (cols / 256) * 4;
    let x = 4096 * 4; // one f32 activation vector
    let kv = 2 * 2 * 128 * 512 * 2; // K and V, 2 KV heads, head_dim 128, 512 positions, f16
    let partials = 32 * 17 * (128 + 2) * 4; // 32 heads, 17 splits of (128 values, max, sum)
    let mut v = vec![(4096 * 144 / 256, false)]; // the embedding row (Q4_K)
    for _ in 0..layers {
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
    let mut reads = step_reads(32);
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

/// Buffers the persistent kernel binds its phases' bytes from (each at most the adapter's
/// largest binding and 1 GiB).
const PERSIST_BUFFERS: usize = 4;

/// The persistent read kernel (`gpu_stream_bench persistent`): `p.groups` workgroups of 256
/// invocations walk the phases in `ph` in order, each phase's vectors striding over the
/// workgroups with 8 loads in flight an invocation (`loop` of the table), and between two
/// phases (where `p.barriers` is set) a grid-wide barrier: every workgroup publishes
/// (`storageBarrier`), its invocation 0 adds one to `sync[0]` and spins until the count shows
/// every workgroup arrived (`(k + 1) * groups` past `p.base`, the count before this
/// dispatch), and the workgroup then acquires (`workgroupBarrier`, `storageBarrier`). A spin
/// gives up after `MAX_SPIN` loads and counts itself in `sync[1]` (the workgroups were not all
/// resident at once: the figure is then void), and every spin stops once one has (the host
/// clears `sync[1]` before each form). With `prefetch`, each workgroup issues its
/// first 8 loads of the next phase after its publish and before its arrival, so they are in
/// flight while it waits, where that phase is a weight product's (`weight`: weights do not
/// depend on the phase before; x, the KV cache and the partials do, and are read after the
/// barrier). The fold of every
/// vector read is XORed into `sync[2]`.
fn persistent_source(prefetch: bool, flag: bool) -> String {
    let mut s = String::from(
        "const WG: u32 = 256u;\n\
         const MAX_SPIN: u32 = 1048576u;\n\
         struct Ph { buf: u32, off: u32, n: u32, weight: u32 }\n\
         struct P { phases: u32, groups: u32, base: u32, barriers: u32, gbase: u32, p0: u32, p1: u32, p2: u32 }\n",
    );
    for b in 0..PERSIST_BUFFERS {
        s.push_str(&format!(
            "@group(0) @binding({b}) var<storage, read> w{b}: array<vec4<u32>>;\n"
        ));
    }
    let nb = PERSIST_BUFFERS;
    s.push_str(&format!(
        "@group(0) @binding({nb}) var<storage, read> ph: array<Ph>;\n\
         @group(0) @binding({}) var<storage, read_write> sync: array<atomic<u32>>;\n\
         @group(0) @binding({}) var<uniform> p: P;\n",
        nb + 1,
        nb + 2
    ));
    // Vector i (clamped to the phase) of phase d.
    s.push_str("fn rd(d: Ph, i: u32) -> vec4<u32> {\n    let j = d.off + min(i, d.n - 1u);\n    switch d.buf {\n");
    for b in 0..PERSIST_BUFFERS {
        let case = if b + 1 == PERSIST_BUFFERS {
            "default".to_string()
        } else {
            format!("case {b}u")
        };
        s.push_str(&format!("        {case}: {{ return w{b}[j]; }}\n"));
    }
    s.push_str("    }\n}\n");
    // 8 loads from `i`, 256 apart, zero past the phase's end.
    s.push_str(
        "fn load8(d: Ph, i: u32) -> array<vec4<u32>, 8> {\n\
         \x20   var v: array<vec4<u32>, 8>;\n",
    );
    for j in 0..8 {
        s.push_str(&format!(
            "    if i + {j}u * WG < d.n {{\n        v[{j}] = rd(d, i + {j}u * WG);\n    }}\n"
        ));
    }
    s.push_str("    return v;\n}\n");
    s.push_str(
        "fn fold8(v: array<vec4<u32>, 8>) -> vec4<u32> {\n\
         \x20   return ((v[0] ^ v[1]) ^ (v[2] ^ v[3])) ^ ((v[4] ^ v[5]) ^ (v[6] ^ v[7]));\n}\n",
    );
    s.push_str(
        "@compute @workgroup_size(WG)\n\
         fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {\n\
         \x20   let first = wid.x * WG * 8u + lid;\n\
         \x20   let stride = p.groups * WG * 8u;\n\
         \x20   var acc = vec4<u32>(0u);\n",
    );
    if prefetch {
        s.push_str("    var pre = load8(ph[0], first);\n    var have = true;\n");
    }
    s.push_str(
        "    for (var k = 0u; k < p.phases; k++) {\n\
         \x20       let d = ph[k];\n\
         \x20       var i = first;\n",
    );
    if prefetch {
        s.push_str("        if have {\n            acc ^= fold8(pre);\n            i += stride;\n        }\n");
    }
    s.push_str(
        "        for (; i < d.n; i += stride) {\n\
         \x20           acc ^= fold8(load8(d, i));\n\
         \x20       }\n\
         \x20       if p.barriers != 0u && k + 1u < p.phases {\n\
         \x20           storageBarrier();\n",
    );
    if prefetch {
        s.push_str(
            "            have = ph[k + 1u].weight != 0u;\n\
             \x20           if have {\n\
             \x20               pre = load8(ph[k + 1u], first);\n\
             \x20           }\n",
        );
    }
    // The arrival, and what the spin waits for: the count itself, or (`flag`) a generation
    // word in another 128-byte line that the last workgroup to arrive moves on.
    let (arrive, done) = if flag {
        (
            "if atomicAdd(&sync[0], 1u) - p.base == want - 1u {\n\
             \x20                   atomicAdd(&sync[32], 1u);\n\
             \x20               }",
            "atomicLoad(&sync[32]) - p.gbase >= k + 1u",
        )
    } else {
        (
            "atomicAdd(&sync[0], 1u);",
            "atomicLoad(&sync[0]) - p.base >= want",
        )
    };
    s.push_str(&format!(
        "            if lid == 0u {{\n\
         \x20               let want = (k + 1u) * p.groups;\n\
         \x20               {arrive}\n\
         \x20               var spins = 0u;\n\
         \x20               loop {{\n\
         \x20                   if {done} {{\n\
         \x20                       break;\n\
         \x20                   }}\n\
         \x20                   spins += 1u;\n\
         \x20                   if (spins & 1023u) == 0u && (spins >= MAX_SPIN || atomicLoad(&sync[1]) != 0u) {{\n\
         \x20                       if spins >= MAX_SPIN {{\n\
         \x20                           atomicAdd(&sync[1], 1u);\n\
         \x20                       }}\n\
         \x20                       break;\n\
         \x20                   }}\n\
         \x20               }}\n\
         \x20           }}\n\
         \x20           workgroupBarrier();\n\
         \x20           storageBarrier();\n\
         \x20       }}"
    ));
    if prefetch {
        s.push_str(
            " else if k + 1u < p.phases {\n\
             \x20           have = ph[k + 1u].weight != 0u;\n\
             \x20           if have {\n\
             \x20               pre = load8(ph[k + 1u], first);\n\
             \x20           }\n\
             \x20       }\n",
        );
    } else {
        s.push('\n');
    }
    s.push_str(
        "    }\n\
         \x20   let f = (acc.x ^ acc.y) ^ (acc.z ^ acc.w);\n\
         \x20   if f != 0u {\n        atomicXor(&sync[2], f);\n    }\n}\n",
    );
    s
}

/// `gpu_stream_bench persistent [G ...]`: the step's reads (`step_reads`) as the phases of one
/// dispatch of G workgroups with a grid-wide barrier between phases (`persistent_source`),
/// with and without each workgroup's next weights in flight across the barrier, beside the
/// same reads without the barriers; every op's phases and the weight products' only.
/// `LOWBIT_STREAM_LAYERS` = N (default 32) shortens the step (a smoke test on a small
/// adapter). Run after `step`'s table, in the same process.
fn persistent(ctx: &GpuContext, groups: &[u32]) -> anyhow::Result<()> {
    let dev = &ctx.device;
    let layers = match std::env::var("LOWBIT_STREAM_LAYERS") {
        Ok(v) => v
            .parse::<usize>()
            .ok()
            .filter(|&n| (1..=32).contains(&n))
            .ok_or_else(|| anyhow::anyhow!("LOWBIT_STREAM_LAYERS={v}: 1 to 32"))?,
        Err(_) => 32,
    };
    let cap = ctx.max_binding_bytes.min(1 << 30) / 16 * 16;
    let mut reads = step_reads(layers);
    for r in reads.iter_mut().filter(|r| r.0 > cap) {
        println!("a read of {} bytes cut to {cap}", r.0);
        r.0 = cap;
    }
    // Phases packed into buffers in step order: [buf, offset, n, weight] in vectors.
    let mut table: Vec<[u32; 4]> = Vec::new();
    let mut sizes = vec![0u64];
    for &(bytes, weight) in &reads {
        let b = bytes.div_ceil(16) * 16;
        if sizes.last().copied().unwrap_or(0) + b > cap {
            sizes.push(0);
        }
        let i = sizes.len() - 1;
        anyhow::ensure!(
            i < PERSIST_BUFFERS,
            "the step's {} bytes need more than {PERSIST_BUFFERS} buffers of {cap} bytes",
            reads.iter().map(|r| r.0).sum::<u64>()
        );
        table.push([
            i as u32,
            (sizes[i] / 16) as u32,
            (b / 16) as u32,
            weight as u32,
        ]);
        sizes[i] += b;
    }
    let mut seed = 0x51_7cc1_b727_220au64;
    let mut want_all = 0u32;
    let mut want_weights = 0u32;
    let mut bufs = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let words = random_words((size / 4).max(4) as usize, &mut seed);
        for t in table.iter().filter(|t| t[0] as usize == i) {
            let f = words[t[1] as usize * 4..(t[1] + t[2]) as usize * 4]
                .iter()
                .fold(0u32, |a, &v| a ^ v);
            want_all ^= f;
            if t[3] != 0 {
                want_weights ^= f;
            }
        }
        bufs.push(ctx.upload_bytes(&format!("w{i}"), bytemuck::cast_slice(&words))?);
    }
    while bufs.len() < PERSIST_BUFFERS {
        bufs.push(ctx.vector_buffer("unused", 4));
    }
    let weights: Vec<[u32; 4]> = table.iter().copied().filter(|t| t[3] != 0).collect();
    let tables = [
        ctx.upload_bytes("phases", bytemuck::cast_slice(&table))?,
        ctx.upload_bytes("weight phases", bytemuck::cast_slice(&weights))?,
    ];
    let counts = [table.len() as u32, weights.len() as u32];
    let total: u64 = reads.iter().map(|r| r.0).sum();
    let weight_bytes: u64 = reads.iter().filter(|r| r.1).map(|r| r.0).sum();
    let sync = ctx.vector_buffer("sync", 64);
    let ub = dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some("params"),
        size: 32,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    println!(
        "persistent: {} phases ({} weight products) of {layers} layers, {:.3} GB in {} buffers",
        table.len(),
        weights.len(),
        total as f64 / 1e9,
        sizes.len()
    );
    println!(
        "| workgroups | form | phases | barriers void | fold | count | step us (median of 9) | tok/s | GB/s |"
    );
    println!("|---:|---|---:|---:|---|---|---:|---:|---:|");
    // The count `sync[0]` keeps rising across dispatches: `base` is its value before one.
    let mut base = 0u32;
    // The generation word's value before a dispatch (the `flag` barrier's).
    let mut gbase = 0u32;
    for (prefetch, flag) in [(false, false), (true, false), (true, true)] {
        // SAFETY: every load's index is clamped into its phase, which lies inside its buffer
        // (the table is built above from the buffers' sizes); the stores are to words 0-2 and
        // 32 of `sync` (64 words).
        let pipeline = unsafe {
            unchecked_pipeline(dev, "persistent read", persistent_source(prefetch, flag))
        };
        for (t, table_buf) in tables.iter().enumerate() {
            let mut entries: Vec<wgpu::BindGroupEntry> = bufs
                .iter()
                .enumerate()
                .map(|(i, b)| wgpu::BindGroupEntry {
                    binding: i as u32,
                    resource: b.as_entire_binding(),
                })
                .collect();
            for (i, b) in [table_buf, &sync, &ub].into_iter().enumerate() {
                entries.push(wgpu::BindGroupEntry {
                    binding: (PERSIST_BUFFERS + i) as u32,
                    resource: b.as_entire_binding(),
                });
            }
            let bg = dev.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &pipeline.get_bind_group_layout(0),
                entries: &entries,
            });
            for &g in groups {
                for barriers in [true, false] {
                    if !barriers && (prefetch || flag) {
                        continue;
                    }
                    ctx.queue.write_buffer(&sync, 4, &[0u8; 4]);
                    let mut ts = Vec::new();
                    // 10 timed passes (the first a warm-up), then one more with the fold
                    // cleared before it, whose fold must be the table's.
                    for rep in 0..11 {
                        if rep == 10 {
                            ctx.queue.write_buffer(&sync, 8, &[0u8; 4]);
                        }
                        let params = [counts[t], g, base, u32::from(barriers), gbase, 0, 0, 0];
                        ctx.queue
                            .write_buffer(&ub, 0, bytemuck::cast_slice(&params));
                        let pt = ctx.time_pass(&mut |pass| {
                            pass.set_pipeline(&pipeline);
                            pass.set_bind_group(0, &bg, &[]);
                            pass.dispatch_workgroups(g, 1, 1);
                        })?;
                        if barriers {
                            base = base.wrapping_add((counts[t] - 1) * g);
                            if flag {
                                gbase = gbase.wrapping_add(counts[t] - 1);
                            }
                        }
                        if (1..10).contains(&rep) {
                            ts.push(pt.ns / 1e3);
                        }
                    }
                    let raw = ctx.read_buffer(&sync, 33 * 4)?;
                    let raw: &[u32] = bytemuck::cast_slice(&raw);
                    let fold_ok = raw[2] == if t == 0 { want_all } else { want_weights };
                    // The count and the generation word where the barriers put them; a void
                    // form may leave the generation word behind (a workgroup past a barrier
                    // it gave up on takes another's last arrival): the host follows the GPU.
                    let count_ok = raw[0] == base && raw[32] == gbase;
                    base = raw[0];
                    gbase = raw[32];
                    let void = raw[1];
                    ts.sort_by(f64::total_cmp);
                    let us = ts[ts.len() / 2];
                    let form = format!(
                        "{}, {}",
                        if t == 0 {
                            "every op"
                        } else {
                            "weight products only"
                        },
                        match (barriers, prefetch, flag) {
                            (false, _, _) => "no barriers",
                            (true, false, _) => "grid barriers",
                            (true, true, false) => "grid barriers, next weights in flight",
                            (true, true, true) => {
                                "grid barriers (generation word), next weights in flight"
                            }
                        }
                    );
                    let b = if t == 0 { total } else { weight_bytes };
                    let ok = |b: bool| if b { "ok" } else { "MISMATCH" };
                    println!(
                        "| {g} | {form} | {} | {void} | {} | {} | {us:.1} | {:.0} | {:.0} |",
                        counts[t],
                        ok(fold_ok),
                        ok(count_ok),
                        1e6 / us,
                        b as f64 / us / 1e3
                    );
                }
            }
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let mode = std::env::args().nth(1);
    let step = mode.as_deref() == Some("step");
    let persist = mode.as_deref() == Some("persistent");
    let groups: Vec<u32> = if persist {
        let g: Vec<u32> = std::env::args()
            .skip(2)
            .map(|s| s.parse::<u32>())
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow::anyhow!("usage: gpu_stream_bench persistent [G ...]: {e}"))?;
        anyhow::ensure!(
            g.iter().all(|&g| (1..=65_535).contains(&g)),
            "persistent: workgroup counts from 1 to 65,535"
        );
        if g.is_empty() {
            vec![132, 264, 528]
        } else {
            g
        }
    } else {
        Vec::new()
    };
    let sizes: Vec<f64> = match std::env::args().skip(1).map(|s| s.parse()).collect() {
        _ if step || persist => Vec::new(),
        Ok(v) if !Vec::<f64>::is_empty(&v) => v,
        Ok(_) => vec![4.4, 17.4, 34.8, 247.0],
        Err(e) => {
            anyhow::bail!("usage: gpu_stream_bench [MB ...] | step | persistent [G ...]: {e}")
        }
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
    if persist {
        if std::env::var("LOWBIT_STREAM_LAYERS").is_err() {
            step_floor(&ctx)?;
        }
        return persistent(&ctx, &groups);
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
