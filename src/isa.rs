//! The one switch for CPU features: which implementation of the SIMD kernels runs (the int8
//! matrix kernels, palettization's k-means), detected once per process, with one override for
//! tests and comparisons (`LOWBIT_ISA`). Every choice gives the same bits.

/// Which implementation runs (detected once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Portable,
    Avx2,
    /// AVX2 plus AVX-512 VNNI on 256-bit vectors (`vpdpbusd`).
    Avx512Vnni,
    /// aarch64's NEON (every aarch64 CPU): int8 products by `smull` and `sadalp`.
    Neon,
    /// NEON with the `dotprod` extension (`sdot`; ARMv8.2-A and later, e.g. Apple M1 on).
    NeonDot,
}

/// The best implementation this CPU runs. `LOWBIT_ISA=portable|avx2` (x86-64) or
/// `portable|neon` (aarch64) caps it (for tests and comparisons); every choice gives the same
/// bits.
pub fn detect() -> Isa {
    static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        let cap = std::env::var("LOWBIT_ISA").unwrap_or_default();
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c");
            let vnni = avx2
                && std::is_x86_feature_detected!("avx512vnni")
                && std::is_x86_feature_detected!("avx512vl");
            match cap.as_str() {
                "portable" => return Isa::Portable,
                "avx2" if avx2 => return Isa::Avx2,
                _ if vnni => return Isa::Avx512Vnni,
                _ if avx2 => return Isa::Avx2,
                _ => {}
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            return match cap.as_str() {
                "portable" => Isa::Portable,
                "neon" => Isa::Neon,
                _ if std::arch::is_aarch64_feature_detected!("dotprod") => Isa::NeonDot,
                _ => Isa::Neon,
            };
        }
        #[allow(unreachable_code)]
        {
            let _ = cap;
            Isa::Portable
        }
    })
}
