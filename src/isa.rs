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

/// Every level, in declaration order (a level's discriminant is its index).
const LEVELS: [Isa; 5] = [
    Isa::Portable,
    Isa::Avx2,
    Isa::Avx512Vnni,
    Isa::Neon,
    Isa::NeonDot,
];
const _: () = assert!(
    Isa::Portable as usize == 0
        && Isa::Avx2 as usize == 1
        && Isa::Avx512Vnni as usize == 2
        && Isa::Neon as usize == 3
        && Isa::NeonDot as usize == 4
);

/// Whether this CPU has every feature `level`'s kernels are compiled with (their
/// `target_feature` lists): AVX2, FMA and F16C; those and AVX-512 F, BW, VL and VNNI; NEON
/// (every aarch64 CPU); NEON and `dotprod`. Detected once per level.
pub fn has(level: Isa) -> bool {
    static HAS: std::sync::OnceLock<[bool; 5]> = std::sync::OnceLock::new();
    HAS.get_or_init(|| LEVELS.map(has_uncached))[level as usize]
}

fn has_uncached(level: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c");
        match level {
            Isa::Avx2 => return avx2,
            Isa::Avx512Vnni => {
                return avx2
                    && std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
                    && std::is_x86_feature_detected!("avx512vl")
                    && std::is_x86_feature_detected!("avx512vnni")
            }
            _ => {}
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        match level {
            Isa::Neon => return true,
            Isa::NeonDot => return std::arch::is_aarch64_feature_detected!("dotprod"),
            _ => {}
        }
    }
    level == Isa::Portable
}

impl Isa {
    /// The level's name as `LOWBIT_ISA` and `bench --json` (`info.cpu_level`) write it:
    /// `portable`, `avx2`, `avx512vnni`, `neon`, `neon-dot`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512vnni",
            Isa::Neon => "neon",
            Isa::NeonDot => "neon-dot",
        }
    }
}

/// `level`, or the best level below it that this CPU has ([`has`]): what a kernel entry point
/// handed any level runs, so that a level this CPU lacks runs a path it has instead of
/// faulting.
pub fn usable(level: Isa) -> Isa {
    match level {
        Isa::Avx512Vnni if has(Isa::Avx512Vnni) => Isa::Avx512Vnni,
        Isa::Avx512Vnni | Isa::Avx2 if has(Isa::Avx2) => Isa::Avx2,
        Isa::NeonDot if has(Isa::NeonDot) => Isa::NeonDot,
        Isa::NeonDot | Isa::Neon if has(Isa::Neon) => Isa::Neon,
        _ => Isa::Portable,
    }
}

/// The best implementation this CPU runs. `LOWBIT_ISA=portable|avx2` (x86-64) or
/// `portable|neon` (aarch64) caps it (for tests and comparisons); every choice gives the same
/// bits.
pub fn detect() -> Isa {
    static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        let cap = std::env::var("LOWBIT_ISA").unwrap_or_default();
        // This architecture's top level, and the one cap below it besides `portable`.
        let (top, lower) = if cfg!(target_arch = "x86_64") {
            (Isa::Avx512Vnni, ("avx2", Isa::Avx2))
        } else if cfg!(target_arch = "aarch64") {
            (Isa::NeonDot, ("neon", Isa::Neon))
        } else {
            (Isa::Portable, ("portable", Isa::Portable))
        };
        match cap.as_str() {
            "portable" => Isa::Portable,
            c if c == lower.0 => usable(lower.1),
            _ => usable(top),
        }
    })
}
