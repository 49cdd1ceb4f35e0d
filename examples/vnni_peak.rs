//! The CPU's int8 ceiling: how many `vpdpbusd` (512-bit: 64 u8 x i8 multiply-accumulates
//! each) a core retires per nanosecond, alone and with another 512-bit integer op issued
//! between them (`vpshufb`, the table lookup of LUT-style low-bit kernels, or `vpaddw`), on
//! every core at once. The ternary and GGUF prefill kernels (`q8::ternary_rows_tokens`,
//! `q8::gguf_rows_tokens`) are held to the first figure in BENCHMARKS.md; the second says
//! whether lookups could run beside the products (they cannot where they share ports).
//! Usage: cargo run --release --example vnni_peak -- [threads] [gmac_per_token]
//! (`gmac_per_token`: the model's multiply-accumulates per prompt token, e.g. 7.58 for the
//! MiniCPM4-8B shape's linears, to print the tok/s the ceiling allows).

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;
    use std::time::Instant;

    /// 12 independent `vpdpbusd zmm` a round (more than its latency times its throughput).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn dpbusd(rounds: u64) {
        for _ in 0..rounds {
            asm!(
                "vpdpbusd zmm0, zmm30, zmm31",
                "vpdpbusd zmm1, zmm30, zmm31",
                "vpdpbusd zmm2, zmm30, zmm31",
                "vpdpbusd zmm3, zmm30, zmm31",
                "vpdpbusd zmm4, zmm30, zmm31",
                "vpdpbusd zmm5, zmm30, zmm31",
                "vpdpbusd zmm6, zmm30, zmm31",
                "vpdpbusd zmm7, zmm30, zmm31",
                "vpdpbusd zmm8, zmm30, zmm31",
                "vpdpbusd zmm9, zmm30, zmm31",
                "vpdpbusd zmm10, zmm30, zmm31",
                "vpdpbusd zmm11, zmm30, zmm31",
                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                out("zmm30") _, out("zmm31") _,
                options(nostack, nomem),
            );
        }
    }

    /// 8 `vpdpbusd` and 8 independent `vpshufb` a round.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn dpbusd_pshufb(rounds: u64) {
        for _ in 0..rounds {
            asm!(
                "vpdpbusd zmm0, zmm30, zmm31",
                "vpshufb zmm12, zmm29, zmm30",
                "vpdpbusd zmm1, zmm30, zmm31",
                "vpshufb zmm13, zmm29, zmm30",
                "vpdpbusd zmm2, zmm30, zmm31",
                "vpshufb zmm14, zmm29, zmm30",
                "vpdpbusd zmm3, zmm30, zmm31",
                "vpshufb zmm15, zmm29, zmm30",
                "vpdpbusd zmm4, zmm30, zmm31",
                "vpshufb zmm16, zmm29, zmm30",
                "vpdpbusd zmm5, zmm30, zmm31",
                "vpshufb zmm17, zmm29, zmm30",
                "vpdpbusd zmm6, zmm30, zmm31",
                "vpshufb zmm18, zmm29, zmm30",
                "vpdpbusd zmm7, zmm30, zmm31",
                "vpshufb zmm19, zmm29, zmm30",
                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _,
                out("zmm29") _, out("zmm30") _, out("zmm31") _,
                options(nostack, nomem),
            );
        }
    }

    /// 8 `vpdpbusd` and 8 independent `vpaddw` a round.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn dpbusd_paddw(rounds: u64) {
        for _ in 0..rounds {
            asm!(
                "vpdpbusd zmm0, zmm30, zmm31",
                "vpaddw zmm12, zmm12, zmm30",
                "vpdpbusd zmm1, zmm30, zmm31",
                "vpaddw zmm13, zmm13, zmm30",
                "vpdpbusd zmm2, zmm30, zmm31",
                "vpaddw zmm14, zmm14, zmm30",
                "vpdpbusd zmm3, zmm30, zmm31",
                "vpaddw zmm15, zmm15, zmm30",
                "vpdpbusd zmm4, zmm30, zmm31",
                "vpaddw zmm16, zmm16, zmm30",
                "vpdpbusd zmm5, zmm30, zmm31",
                "vpaddw zmm17, zmm17, zmm30",
                "vpdpbusd zmm6, zmm30, zmm31",
                "vpaddw zmm18, zmm18, zmm30",
                "vpdpbusd zmm7, zmm30, zmm31",
                "vpaddw zmm19, zmm19, zmm30",
                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _,
                out("zmm30") _, out("zmm31") _,
                options(nostack, nomem),
            );
        }
    }

    /// Nanoseconds per round of `f` on each of `threads` threads at once (the slowest).
    fn timed(threads: usize, rounds: u64, f: unsafe fn(u64)) -> f64 {
        let ns: Vec<f64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(move || {
                        let t = Instant::now();
                        // SAFETY: main checked the CPU features.
                        unsafe { f(rounds) };
                        t.elapsed().as_secs_f64() * 1e9 / rounds as f64
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        ns.into_iter().fold(0.0, f64::max)
    }

    pub fn main(threads: usize, gmac_per_token: Option<f64>) {
        if !(std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vnni"))
        {
            println!("no AVX-512 VNNI on this CPU: the prefill kernels' 512-bit path does not run");
            return;
        }
        let rounds = 50_000_000;
        // Warm the clock up.
        timed(threads, rounds / 5, dpbusd);
        let alone = timed(threads, rounds, dpbusd) / 12.0;
        let per_core = 64.0 / alone;
        println!(
            "vpdpbusd zmm: {:.3} ns each, {:.1} MAC/ns a core, {:.1} GMAC/s on {threads} threads",
            alone,
            per_core,
            per_core * threads as f64
        );
        for (name, f) in [
            ("vpshufb", dpbusd_pshufb as unsafe fn(u64)),
            ("vpaddw", dpbusd_paddw),
        ] {
            let both = timed(threads, rounds, f);
            println!(
                "8 vpdpbusd + 8 {name}: {:.2} ns a round against {:.2} for the 8 vpdpbusd alone \
                 ({:.2}x: {})",
                both,
                8.0 * alone,
                both / (8.0 * alone),
                if both < 8.5 * alone {
                    "they run beside the products"
                } else {
                    "they take the products' ports"
                }
            );
        }
        if let Some(g) = gmac_per_token {
            println!(
                "ceiling at {g} GMAC a token: {:.1} tok/s (the products alone, every cycle a \
                 vpdpbusd)",
                per_core * threads as f64 / g
            );
        }
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let threads: usize = a
        .get(1)
        .and_then(|s| s.parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let gmac: Option<f64> = a.get(2).and_then(|s| s.parse().ok());
    #[cfg(target_arch = "x86_64")]
    x86::main(threads, gmac);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (threads, gmac);
        println!("x86-64 only");
    }
}
