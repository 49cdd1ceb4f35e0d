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
}

/// The best implementation this CPU runs. `LOWBIT_ISA=portable|avx2` caps it (for tests and
/// comparisons); every choice gives the same bits.
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
        let _ = cap;
        Isa::Portable
    })
}
