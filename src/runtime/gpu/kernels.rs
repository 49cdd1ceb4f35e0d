//! The registry of WGSL modules: every kernel the GPU backend may compile, each a complete
//! module (parameters already substituted) with a name that carries its parameters.
//!
//! This list, less the kernels of encodings its tensors lack ([`for_tensors`]), is what a
//! bundle ships in `kernels/`; all of it is what [`super::GpuContext`] compiles from when no
//! bundle's sources are given (tests, benchmarks). A kernel generated from a
//! template (the ternary matvec for each rows-per-workgroup, workgroup size and reduction) is
//! listed once per variant the backend can pick.

use std::collections::HashMap;

use super::{MatvecConfig, Reduction};
use crate::bundle::reader::Bundle;

pub use crate::bundle::kernels::KernelError;

/// One WGSL module: `kernels/{name}.wgsl` in a bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSource {
    pub name: String,
    pub wgsl: String,
}

/// The ternary matvec variants the backend may pick: the split kernel with 1, 2, 4 and 8
/// rows per workgroup, 32 to 256 invocations, both reductions; the subgroup-rows kernel with
/// x staged 4096 elements at a time in workgroup memory, 1, 2 or 4 rows per subgroup pass, 1
/// or 2 units in flight, 128 or 256 invocations and `rows per pass * invocations / 32` rows per
/// workgroup (one pass per subgroup where subgroups have 32 lanes), among them the decode
/// default ([`super::decode_matvec_config`]); the subgroup-rows kernel reading x from the
/// storage buffer (no workgroup memory, no barrier) with 2 or 4 rows per pass; and the decode
/// default with ops folded in ([`super::Fuse`]: `_rms`, `_swiglu`, `_rms_swiglu`).
pub fn ternary_matvec_configs() -> Vec<MatvecConfig> {
    let mut v = Vec::new();
    for reduction in [Reduction::Subgroup, Reduction::Workgroup] {
        for rows_per_workgroup in [1, 2, 4, 8] {
            for workgroup_size in [32, 64, 128, 256] {
                v.push(MatvecConfig::split(
                    rows_per_workgroup,
                    workgroup_size,
                    reduction,
                ));
            }
        }
    }
    for rows_per_subgroup in [1, 2, 4] {
        for units_in_flight in [1, 2] {
            for workgroup_size in [128, 256] {
                v.push(MatvecConfig::subgroup_rows_tiled(
                    rows_per_subgroup * workgroup_size / 32,
                    workgroup_size,
                    rows_per_subgroup,
                    units_in_flight,
                    4096,
                ));
            }
        }
    }
    for rows_per_subgroup in [2, 4] {
        v.push(MatvecConfig::subgroup_rows(
            rows_per_subgroup * 4,
            128,
            rows_per_subgroup,
            2,
        ));
    }
    // The decode default with the RMSNorm and SwiGLU folded in (Q/K/V: the norm; gate/up:
    // both).
    let d = super::decode_matvec_config(Reduction::Subgroup);
    for (rms_norm, swiglu) in [(true, false), (false, true), (true, true)] {
        v.push(d.fused(super::Fuse { rms_norm, swiglu }));
    }
    // The int8-activation decode kernels, for each width of x, plain and fused.
    v.extend(super::decode_q8_configs());
    v
}

/// The decode attention's combine with the output product's quantization folded in
/// ([`super::combine_q8_source`]).
pub const COMBINE_Q8: &str = "op_attention_combine_q8";

/// The decode attention with [`COMBINE_Q8`] done by the last workgroup of each block of 256
/// outputs ([`super::attention_decode_combine_q8_source`]): one dispatch for both.
pub const ATTENTION_COMBINE_Q8: &str = "op_attention_decode_combine_q8";

/// Whether `wgsl` is this binary's own source of kernel `name` ([`all`], byte for byte).
pub fn is_builtin(name: &str, wgsl: &str) -> bool {
    static BUILTIN: std::sync::OnceLock<HashMap<String, String>> = std::sync::OnceLock::new();
    BUILTIN
        .get_or_init(|| all().into_iter().map(|k| (k.name, k.wgsl)).collect())
        .get(name)
        .is_some_and(|s| s == wgsl)
}

/// Whether a bundle whose tensors have the encodings `stems` ([`super::weights::encoding_stem`])
/// needs kernel `name`: a kernel of one weight encoding ([`super::weights::kernel_encoding`])
/// where a tensor has that encoding, every other kernel always. Every choice the backend makes
/// among a weight's kernels (reduction, rows, fused forms, the tiled prefill product, older
/// forms) is among the kernels of the weight's own encoding, so a bundle carries what any
/// adapter needs to run it and no other encoding's kernels (a SmolLM2 Q4_1 bundle: 1.8 MB of
/// WGSL and MSL instead of the registry's 11.2).
pub fn needed(name: &str, stems: &std::collections::BTreeSet<String>) -> bool {
    super::weights::kernel_encoding(name).is_none_or(|s| stems.contains(&s))
}

/// The encodings of the matrices among `tensors`, as [`needed`] takes them. A vector (norm
/// weights, biases, RoPE factors: one dimension) goes to the GPU as a plain f32 buffer,
/// decoded on the host, and runs no weight kernel: the F32 norms of a Q4_1 model bring no
/// `weights_f32_*` kernel (0.5 MB of SmolLM2's 2.4).
pub fn encodings_of(
    tensors: &[crate::bundle::manifest::TensorEntry],
) -> std::collections::BTreeSet<String> {
    tensors
        .iter()
        .filter(|t| t.shape.len() >= 2)
        .map(|t| super::weights::encoding_stem(&t.encoding))
        .collect()
}

/// The modules a bundle of `tensors` carries ([`all`] as [`needed`] filters it): what `pack`,
/// `gguf-to-ternary`, `palettize` and `add-kernels` write.
pub fn for_tensors(tensors: &[crate::bundle::manifest::TensorEntry]) -> Vec<KernelSource> {
    let stems = encodings_of(tensors);
    all()
        .into_iter()
        .filter(|k| needed(&k.name, &stems))
        .collect()
}

/// Every module, sorted by name.
pub fn all() -> Vec<KernelSource> {
    let mut v: Vec<KernelSource> = ternary_matvec_configs()
        .iter()
        .map(|c| KernelSource {
            name: c.name(),
            wgsl: c.source(),
        })
        .collect();
    for rms in [false, true] {
        v.push(KernelSource {
            name: super::q8_quantize_name(rms).to_string(),
            wgsl: super::q8_quantize_source(rms),
        });
    }
    v.push(KernelSource {
        name: COMBINE_Q8.to_string(),
        wgsl: super::combine_q8_source(),
    });
    v.push(KernelSource {
        name: ATTENTION_COMBINE_Q8.to_string(),
        wgsl: super::attention_decode_combine_q8_source(),
    });
    v.extend(super::ops::sources());
    v.extend(super::weights::sources());
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

/// The WGSL modules `bundle` carries, by name (its `kernels/NAME.wgsl`, after the hash checks
/// of [`Bundle::open`]): what [`super::ContextOptions::sources`] takes, so the GPU backend
/// compiles only what the bundle ships. A bundle with no kernels (made before kernels shipped
/// in bundles; the CPU backend still runs it) is [`KernelError::NoKernels`], whose message
/// gives the command that adds them (`convert add-kernels DIR`).
pub fn from_bundle(bundle: &Bundle) -> Result<HashMap<String, String>, KernelError> {
    crate::bundle::kernels::wgsl_sources(bundle)
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_unique_and_sources_complete() {
        let all = super::all();
        let mut names: Vec<_> = all.iter().map(|k| k.name.as_str()).collect();
        names.dedup();
        assert_eq!(names.len(), all.len());
        assert!(all.iter().all(|k| k.wgsl.contains("fn main")));
        for reduction in [super::Reduction::Subgroup, super::Reduction::Workgroup] {
            let d = super::super::decode_matvec_config(reduction).name();
            assert!(all.iter().any(|k| k.name == d), "{d} not registered");
        }
    }

    /// Only this binary's own source of a kernel, byte for byte, counts as built in (the
    /// sources compiled without bounds checks by default).
    #[test]
    fn only_this_binarys_own_sources_are_built_in() {
        let all = super::all();
        for k in [&all[0], &all[all.len() / 2], &all[all.len() - 1]] {
            assert!(super::is_builtin(&k.name, &k.wgsl), "{}", k.name);
            assert!(
                !super::is_builtin(&k.name, &format!("{}\n", k.wgsl)),
                "{}",
                k.name
            );
            assert!(
                !super::is_builtin(&format!("{}_", k.name), &k.wgsl),
                "{}",
                k.name
            );
        }
    }
}
