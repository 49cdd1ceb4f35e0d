//! The CPU's int8 ceiling: how many `vpdpbusd` (512-bit: 64 u8 x i8 multiply-accumulates
//! each) a core retires per nanosecond, alone and with another 512-bit integer op issued
//! between them (`vpshufb`, the table lookup of LUT-style low-bit kernels, or `vpaddw`), on
//! every core at once. The ternary and GGUF prefill kernels (`q8::ternary_rows_tokens`,
//! `q8::gguf_rows_tokens`) are held to the first figure in BENCHMARKS.md; the second says
//! whether lookups could run beside the products (they cannot where they share ports).
//! Then the two exact table-lookup forms that could replace the products for ternary codes:
//! `vpermw` (a 27-entry i16 table of 3 columns' signed sums in a register, 32 rows' base-3
//! indices in the lanes: 96 multiply-accumulates with its `vpaddw`) and a table in memory
//! (3^g sums of 32 or 16 tokens per group of g columns, one `vpaddw` from the entry a row's
//! codes pick), each as MAC a nanosecond against `vpdpbusd`'s.
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

    /// 8 independent `vpermw` (32 i16 lanes, each picking one of 32 words: a 32-entry i16
    /// table in a register, indexed per lane) and 8 `vpaddw` accumulating them, a round.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn permw_paddw(rounds: u64) {
        for _ in 0..rounds {
            asm!(
                "vpermw zmm12, zmm30, zmm29",
                "vpermw zmm13, zmm31, zmm29",
                "vpermw zmm14, zmm30, zmm28",
                "vpermw zmm15, zmm31, zmm28",
                "vpermw zmm16, zmm30, zmm27",
                "vpermw zmm17, zmm31, zmm27",
                "vpermw zmm18, zmm30, zmm26",
                "vpermw zmm19, zmm31, zmm26",
                "vpaddw zmm0, zmm0, zmm12",
                "vpaddw zmm1, zmm1, zmm13",
                "vpaddw zmm2, zmm2, zmm14",
                "vpaddw zmm3, zmm3, zmm15",
                "vpaddw zmm4, zmm4, zmm16",
                "vpaddw zmm5, zmm5, zmm17",
                "vpaddw zmm6, zmm6, zmm18",
                "vpaddw zmm7, zmm7, zmm19",
                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _,
                out("zmm26") _, out("zmm27") _, out("zmm28") _, out("zmm29") _,
                out("zmm30") _, out("zmm31") _,
                options(nostack, nomem),
            );
        }
    }

    /// 8 independent `vpermw` a round, nothing else.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn permw(rounds: u64) {
        for _ in 0..rounds {
            asm!(
                "vpermw zmm12, zmm30, zmm29",
                "vpermw zmm13, zmm31, zmm29",
                "vpermw zmm14, zmm30, zmm28",
                "vpermw zmm15, zmm31, zmm28",
                "vpermw zmm16, zmm30, zmm27",
                "vpermw zmm17, zmm31, zmm27",
                "vpermw zmm18, zmm30, zmm26",
                "vpermw zmm19, zmm31, zmm26",
                out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _,
                out("zmm26") _, out("zmm27") _, out("zmm28") _, out("zmm29") _,
                out("zmm30") _, out("zmm31") _,
                options(nostack, nomem),
            );
        }
    }

    /// The table-lookup alternative to `vpdpbusd` for ternary weights (the "four Russians"
    /// method over tokens): for one activation group of `g` columns and 32 tokens, a table of
    /// the `3^g` signed sums `sum_i (c_i - 1) x_i` as i16 (exact: `|x| <= 127`, a 256-column
    /// block sums to at most 32,512); a row's `g` codes pick one entry, added to the row's
    /// 32 i16 accumulators by one `vpaddw zmm, zmm, [table + 64 * pattern]`. One lookup is
    /// `32 g` multiply-accumulates; its rate is bounded by the loads, not the adders. Returns
    /// the nanoseconds a lookup over `rows` rows and `groups` groups (table `groups * 3^g * 64`
    /// bytes), on one thread.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn lut_rows(table: &[i16], idx: &[u16], rows: usize, groups: usize, out: &mut [i16]) {
        use std::arch::x86_64::*;
        // Four rows at a time: four independent accumulators keep the adds off one chain.
        for r in (0..rows).step_by(4) {
            let mut acc = [_mm512_setzero_si512(); 4];
            for gi in 0..groups {
                for (k, a) in acc.iter_mut().enumerate() {
                    let p = *idx.get_unchecked((r + k) * groups + gi) as usize;
                    let t = _mm512_loadu_si512(table.as_ptr().add(p * 32) as *const _);
                    *a = _mm512_add_epi16(*a, t);
                }
            }
            for (k, a) in acc.iter().enumerate() {
                _mm512_storeu_si512(out.as_mut_ptr().add((r + k) * 32) as *mut _, *a);
            }
        }
    }

    /// [`lut_rows`] over 16 tokens: 32-byte entries (half a line), `vpaddw ymm`; two such
    /// loads issue a cycle where one 512-bit load does.
    #[target_feature(enable = "avx2")]
    unsafe fn lut_rows16(table: &[i16], idx: &[u16], rows: usize, groups: usize, out: &mut [i16]) {
        use std::arch::x86_64::*;
        for r in (0..rows).step_by(4) {
            let mut acc = [_mm256_setzero_si256(); 4];
            for gi in 0..groups {
                for (k, a) in acc.iter_mut().enumerate() {
                    let p = *idx.get_unchecked((r + k) * groups + gi) as usize;
                    let t = _mm256_loadu_si256(table.as_ptr().add(p * 16) as *const _);
                    *a = _mm256_add_epi16(*a, t);
                }
            }
            for (k, a) in acc.iter().enumerate() {
                _mm256_storeu_si256(out.as_mut_ptr().add((r + k) * 16) as *mut _, *a);
            }
        }
    }

    /// One table entry: 32 tokens' i16 sums, on a cache line of its own.
    #[repr(C, align(64))]
    struct Entry([i16; 32]);

    /// MAC a nanosecond a core of [`lut_rows`] with `g` columns a group and `groups` groups
    /// (so a table of `groups * 3^g * 64` bytes), every thread on its own table at once.
    fn lut_rate(threads: usize, g: u32, groups: usize, tokens: usize) -> (f64, usize) {
        let patterns = 3usize.pow(g);
        let rows = 4096;
        let bytes = groups * patterns * tokens * 2;
        let per: Vec<f64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    s.spawn(move || {
                        // 64-byte aligned entries: a load split over two lines costs twice.
                        let entries: Vec<Entry> = (0..groups * patterns)
                            .map(|e| Entry(std::array::from_fn(|i| (e * 32 + i) as i16 * 7)))
                            .collect();
                        // SAFETY: Entry is repr(C) [i16; 32] with no padding (64 bytes).
                        let table: &[i16] = unsafe {
                            std::slice::from_raw_parts(
                                entries.as_ptr() as *const i16,
                                entries.len() * 32,
                            )
                        };
                        let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
                        // Absolute entry per (row, group): group base plus a random pattern.
                        let idx: Vec<u16> = (0..rows * groups)
                            .map(|i| {
                                seed = seed
                                    .wrapping_mul(6_364_136_223_846_793_005)
                                    .wrapping_add(1_442_695_040_888_963_407);
                                let e = (i % groups) * patterns + (seed >> 33) as usize % patterns;
                                // In units of `tokens` i16: entry e of 32 tokens is unit 2e of 16.
                                (e * 32 / tokens) as u16
                            })
                            .collect();
                        let mut out = vec![0i16; rows * 32];
                        let reps = (400_000_000 / (rows * groups)).max(1);
                        let f = if tokens == 32 { lut_rows } else { lut_rows16 };
                        // SAFETY: main checked AVX-512 BW; every index is inside the table.
                        unsafe { f(table, &idx, rows, groups, &mut out) };
                        let t0 = Instant::now();
                        for _ in 0..reps {
                            unsafe { f(table, &idx, rows, groups, &mut out) };
                        }
                        std::hint::black_box(&out);
                        let ns = t0.elapsed().as_secs_f64() * 1e9;
                        (reps * rows * groups * tokens * g as usize) as f64 / ns
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        (per.into_iter().fold(f64::INFINITY, f64::min), bytes)
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
        let pw = timed(threads, rounds, permw) / 8.0;
        let pa = timed(threads, rounds, permw_paddw) / 8.0;
        println!(
            "vpermw zmm: {pw:.3} ns each alone, {pa:.3} ns with its vpaddw (a 27-entry table of \
             3 ternary columns' sums over 32 rows: {:.1} MAC/ns a core, {:.2}x vpdpbusd)",
            96.0 / pa,
            96.0 / pa / per_core
        );
        for (g, groups, tokens) in [
            (3u32, 18usize, 32usize),
            (3, 86, 32),
            (4, 6, 32),
            (4, 64, 32),
            (4, 12, 16),
            (4, 64, 16),
        ] {
            let (rate, bytes) = lut_rate(threads, g, groups, tokens);
            println!(
                "table lookup-add, {g} columns a lookup (3^{g} entries of {tokens} tokens as \
                 i16), table {} KiB: {rate:.1} MAC/ns a core ({:.2}x vpdpbusd)",
                bytes / 1024,
                rate / per_core
            );
        }
        if let Some(g) = gmac_per_token {
            println!(
                "ceiling at {g} GMAC a token: {:.1} tok/s (the products alone, every cycle a \
                 vpdpbusd); {:.1} tok/s with vpermw tables (every cycle a vpermw and its vpaddw)",
                per_core * threads as f64 / g,
                96.0 / pa * threads as f64 / g
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
