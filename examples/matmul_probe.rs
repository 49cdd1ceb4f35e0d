//! Kernel probe: CPU time (not wall time, so other load on the machine matters less) of a
//! ternary or GGML-type matrix product against `n` vectors, as decode (n matvecs) and as one
//! prefill matmul, with the multiply-accumulates per CPU-nanosecond.
//! Usage: cargo run --release --example matmul_probe -- [rows] [cols] [n] [f32|int8] [TYPE]
//! (`TYPE` a GGML type name such as Q4_K or Q8_0: random blocks of it with modest scales;
//! ternary without it).
use lowbit::runtime::matvec::{matmul_with, matvec_with, Kernel, WeightData};

fn cpu_seconds() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let rows: usize = a.get(1).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let cols: usize = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let n: usize = a.get(3).and_then(|s| s.parse().ok()).unwrap_or(64);
    let kernel = if a.get(4).map(|s| s.as_str()) == Some("f32") {
        Kernel::F32
    } else {
        Kernel::Int8
    };
    let mut seed = 1u64;
    let mut next = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as u32
    };
    let words: Vec<u32> = (0..rows * cols / 16)
        .map(|_| (0..16).fold(0u32, |w, j| w | ((next() % 3) << (2 * j))))
        .collect();
    let scales: Vec<u16> = (0..rows * cols / 256)
        .map(|_| half::f16::from_f32(0.01).to_bits())
        .collect();
    let xs: Vec<f32> = (0..n * cols)
        .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let ty = a.get(5).map(|s| {
        lowbit::ggml::GgmlType::from_name(s).unwrap_or_else(|| panic!("unknown type {s}"))
    });
    let mut bytes = Vec::new();
    if let Some(ty) = ty {
        let ts = ty.type_size();
        let nb = ty.bytes_for((rows * cols) as u64).expect("whole blocks") as usize;
        bytes = (0..nb).map(|_| next() as u8).collect();
        // Every f16 field a modest scale (random bytes could be NaN or huge).
        let d = half::f16::from_f32(0.01).to_le_bytes();
        let m = half::f16::from_f32(-0.02).to_le_bytes();
        for b in bytes.chunks_exact_mut(ts) {
            match ty.name() {
                "Q6_K" => b[208..210].copy_from_slice(&d),
                "Q4_1" | "Q5_1" | "Q4_K" | "Q5_K" => {
                    b[0..2].copy_from_slice(&d);
                    b[2..4].copy_from_slice(&m);
                }
                _ => b[0..2].copy_from_slice(&d),
            }
        }
    }
    let w = match ty {
        Some(ty) => WeightData::Gguf { ty, bytes: &bytes },
        None => WeightData::Ternary {
            words: &words,
            scales: &scales,
        },
    };
    let mut y = vec![0f32; n * rows];
    let macs = (rows * cols * n) as f64;
    for _ in 0..2 {
        let t0 = cpu_seconds();
        let w0 = std::time::Instant::now();
        // On a worker of the pool, as the runtime runs a step: each matvec's parallel loop
        // then starts without handing the call to the pool and sleeping on it (which cost
        // ~50 us a call, more than a small matrix's work).
        rayon::scope(|_| {
            for (x, yt) in xs.chunks_exact(cols).zip(y.chunks_exact_mut(rows)) {
                matvec_with(kernel, w, cols, x, yt);
            }
        });
        let (c, wall) = (cpu_seconds() - t0, w0.elapsed().as_secs_f64());
        println!(
            "decode  {n} matvecs: cpu {c:.3}s wall {wall:.3}s, {:.2} MAC/cpu-ns",
            macs / c / 1e9
        );
        let t0 = cpu_seconds();
        let w0 = std::time::Instant::now();
        matmul_with(kernel, w, cols, &xs, &mut y);
        let (c, wall) = (cpu_seconds() - t0, w0.elapsed().as_secs_f64());
        println!(
            "prefill 1 matmul:  cpu {c:.3}s wall {wall:.3}s, {:.2} MAC/cpu-ns",
            macs / c / 1e9
        );
    }
}
