//! The model as the runtime sees it: configuration from the manifest and every weight located
//! in the bundle, checked against the shapes the architecture needs.

use crate::bundle::manifest::{Encoding, Manifest, ModelConfig, TensorEntry};
use crate::bundle::reader::Bundle;
use crate::ggml::GgmlType;

use super::matvec::WeightData;
use super::RuntimeError;

/// Where a weight lives in the bundle and how it is encoded.
#[derive(Clone, Debug)]
pub struct Weight {
    pub name: String,
    /// Row-major `[rows, cols]` (a vector is `[1, n]`).
    pub rows: usize,
    pub cols: usize,
    file: String,
    kind: WeightKind,
}

#[derive(Clone, Debug)]
enum WeightKind {
    Gguf {
        ty: GgmlType,
        range: (u64, u64),
    },
    Ternary {
        codes: (u64, u64),
        scales: (u64, u64),
    },
    Palette {
        bits: u32,
        group_size: usize,
        row_bytes: usize,
        tables: (u64, u64),
        indices: (u64, u64),
    },
}

#[derive(Clone, Debug)]
pub struct Layer {
    pub attn_norm: Weight,
    pub wq: Weight,
    pub wk: Weight,
    pub wv: Weight,
    pub wo: Weight,
    pub ffn_norm: Weight,
    pub w_gate: Weight,
    pub w_up: Weight,
    pub w_down: Weight,
}

/// Architectures this runtime runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    MiniCpm,
}

/// Everything the forward pass needs, resolved from a checked bundle.
pub struct Model {
    pub bundle: Bundle,
    pub arch: Arch,
    pub cfg: ModelConfig,
    pub tok_embd: Weight,
    pub output_norm: Weight,
    pub output: Weight,
    pub layers: Vec<Layer>,
    /// Frequency factors for RoPE (LongRoPE long or short, or rope_freqs), `n_rot / 2`.
    pub rope_factors: Option<Vec<f32>>,
    /// RoPE frequency scale (1 / rope.scaling.factor for linear scaling, else 1).
    pub rope_freq_scale: f32,
    /// RoPE cos/sin multiplier (`rope.scaling.attn_factor`, else 1).
    pub rope_attn_factor: f32,
}

impl Weight {
    fn from_entry(t: &TensorEntry) -> Result<Weight, RuntimeError> {
        let (rows, cols) = match t.shape.as_slice() {
            [n] => (1, *n as usize),
            [r, c] => (*r as usize, *c as usize),
            s => {
                return Err(RuntimeError::Shape {
                    tensor: t.name.clone(),
                    detail: format!("expected 1 or 2 dimensions, found {s:?}"),
                })
            }
        };
        let kind = match &t.encoding {
            Encoding::Gguf { ggml_type, .. } => {
                let ty = GgmlType::from_name(ggml_type).ok_or_else(|| RuntimeError::Encoding {
                    tensor: t.name.clone(),
                    detail: format!("unknown ggml type {ggml_type}"),
                })?;
                if !ty.can_dequantize() {
                    return Err(RuntimeError::Encoding {
                        tensor: t.name.clone(),
                        detail: format!("no kernel for {ty}"),
                    });
                }
                WeightKind::Gguf {
                    ty,
                    range: (t.offset, t.length),
                }
            }
            Encoding::Ternary2 {
                codes_offset,
                codes_length,
                scales_offset,
                scales_length,
                ..
            } => WeightKind::Ternary {
                codes: (t.offset + codes_offset, *codes_length),
                scales: (t.offset + scales_offset, *scales_length),
            },
            Encoding::Palette {
                bits,
                group_size,
                tables_offset,
                tables_length,
                indices_offset,
                indices_length,
                row_bytes,
                ..
            } => WeightKind::Palette {
                bits: *bits,
                group_size: *group_size as usize,
                row_bytes: *row_bytes as usize,
                tables: (t.offset + tables_offset, *tables_length),
                indices: (t.offset + indices_offset, *indices_length),
            },
        };
        Ok(Weight {
            name: t.name.clone(),
            rows,
            cols,
            file: t.file.clone(),
            kind,
        })
    }

    /// The weight's data in the bundle's memory map.
    pub fn data<'a>(&self, b: &'a Bundle) -> WeightData<'a> {
        // Ranges were checked against the files when the bundle was opened.
        let map = b.file(&self.file).unwrap_or_default();
        match self.kind {
            WeightKind::Gguf { ty, range } => WeightData::Gguf {
                ty,
                bytes: &map[range.0 as usize..(range.0 + range.1) as usize],
            },
            WeightKind::Ternary { codes, scales } => WeightData::Ternary {
                words: bytemuck::cast_slice(&map[codes.0 as usize..(codes.0 + codes.1) as usize]),
                scales: bytemuck::cast_slice(
                    &map[scales.0 as usize..(scales.0 + scales.1) as usize],
                ),
            },
            WeightKind::Palette {
                bits,
                group_size,
                row_bytes,
                tables,
                indices,
            } => WeightData::Palette(crate::palette::PaletteView {
                bits,
                group_size,
                cols: self.cols,
                row_bytes,
                tables: &map[tables.0 as usize..(tables.0 + tables.1) as usize],
                indices: &map[indices.0 as usize..(indices.0 + indices.1) as usize],
            }),
        }
    }

    /// A 1-D weight (norm, rope factors) as f32.
    pub fn vector(&self, b: &Bundle) -> Vec<f32> {
        let mut out = vec![0f32; self.cols];
        super::matvec::row(self.data(b), self.cols, 0, &mut out);
        out
    }
}

/// Resolved weights with their data slices, cached for the forward pass.
pub struct WeightRef<'a> {
    pub data: WeightData<'a>,
    pub rows: usize,
    pub cols: usize,
}

/// What [`Model::new`] resolves from the manifest alone, before any weight byte is read.
struct Layout {
    arch: Arch,
    cfg: ModelConfig,
    tok_embd: Weight,
    output_norm: Weight,
    output: Weight,
    layers: Vec<Layer>,
    rope_factors: Option<Weight>,
    rope_freq_scale: f32,
    rope_attn_factor: f32,
}

/// Whether the runtime can build a model from this manifest: the configuration's own checks
/// ([`ModelConfig::check`]), a supported architecture, every tensor it needs present with
/// the shape the configuration implies and an encoding a kernel reads. `convert verify`
/// runs this too, so a bundle that verifies has a configuration and layout the runtime
/// accepts (the values in its weights, such as palette entries, are checked at load).
pub fn check_manifest(m: &Manifest) -> Result<(), RuntimeError> {
    layout(m).map(|_| ())
}

fn layout(manifest: &Manifest) -> Result<Layout, RuntimeError> {
    let bundle = manifest;
    {
        let cfg = bundle.model.clone();
        cfg.check()
            .map_err(|(field, detail)| RuntimeError::Config { field, detail })?;
        let arch = match cfg.architecture.as_str() {
            "llama" => Arch::Llama,
            "minicpm" => Arch::MiniCpm,
            other => {
                return Err(RuntimeError::Architecture {
                    arch: other.to_string(),
                })
            }
        };
        let get = |name: &str| -> Result<Weight, RuntimeError> {
            let t = bundle
                .tensors
                .iter()
                .find(|t| t.name == name)
                .ok_or_else(|| RuntimeError::MissingTensor {
                    tensor: name.to_string(),
                })?;
            Weight::from_entry(t)
        };
        let expect = |w: &Weight, rows: u64, cols: u64| -> Result<(), RuntimeError> {
            if w.rows as u64 != rows || w.cols as u64 != cols {
                return Err(RuntimeError::Shape {
                    tensor: w.name.clone(),
                    detail: format!("expected [{rows}, {cols}], found [{}, {}]", w.rows, w.cols),
                });
            }
            Ok(())
        };
        let (e, hd) = (cfg.n_embd, cfg.head_dim);
        let tok_embd = get("token_embd.weight")?;
        expect(&tok_embd, cfg.n_vocab, e)?;
        let output_norm = get("output_norm.weight")?;
        expect(&output_norm, 1, e)?;
        let has_output = bundle.tensors.iter().any(|t| t.name == "output.weight");
        if cfg.tied_embeddings && has_output {
            return Err(RuntimeError::Config {
                field: "tied_embeddings".into(),
                detail: "true, but the bundle has an output.weight (the head would be ignored)"
                    .into(),
            });
        }
        let output = if cfg.tied_embeddings {
            tok_embd.clone()
        } else {
            get("output.weight")?
        };
        expect(&output, cfg.n_vocab, e)?;
        // Each layer needs its tensors: a count the manifest cannot back is refused below at the
        // first missing one, not allocated for here.
        let mut layers = Vec::with_capacity((cfg.n_layer as usize).min(bundle.tensors.len()));
        for i in 0..cfg.n_layer {
            let g = |s: &str| get(&format!("blk.{i}.{s}.weight"));
            let l = Layer {
                attn_norm: g("attn_norm")?,
                wq: g("attn_q")?,
                wk: g("attn_k")?,
                wv: g("attn_v")?,
                wo: g("attn_output")?,
                ffn_norm: g("ffn_norm")?,
                w_gate: g("ffn_gate")?,
                w_up: g("ffn_up")?,
                w_down: g("ffn_down")?,
            };
            expect(&l.attn_norm, 1, e)?;
            expect(&l.wq, cfg.n_head * hd, e)?;
            expect(&l.wk, cfg.n_head_kv * hd, e)?;
            expect(&l.wv, cfg.n_head_kv * hd, e)?;
            expect(&l.wo, e, cfg.n_head * hd)?;
            expect(&l.ffn_norm, 1, e)?;
            expect(&l.w_gate, cfg.n_ff, e)?;
            expect(&l.w_up, cfg.n_ff, e)?;
            expect(&l.w_down, e, cfg.n_ff)?;
            layers.push(l);
        }
        let rope = &cfg.rope;
        if rope.dimension_count > hd || !rope.dimension_count.is_multiple_of(2) {
            return Err(RuntimeError::Shape {
                tensor: "rope".into(),
                detail: format!(
                    "rope.dimension_count {} must be even and at most head_dim {hd}",
                    rope.dimension_count
                ),
            });
        }
        // llama.cpp (llama-model.cpp get_rope_factors): LongRoPE uses the long factors when the
        // context exceeds the original training context, else the short ones.
        let factors_name = match rope.scaling_type.as_str() {
            "longrope" => {
                let orig = rope.original_context_length.unwrap_or(cfg.n_ctx_train);
                if cfg.n_ctx > orig {
                    rope.factors_long.clone()
                } else {
                    rope.factors_short.clone()
                }
            }
            _ => rope.freq_factors.clone(),
        };
        let rope_factors = match factors_name {
            Some(n) => {
                let w = get(&n)?;
                expect(&w, 1, rope.dimension_count / 2)?;
                Some(w)
            }
            None => None,
        };
        let rope_freq_scale = match (rope.scaling_type.as_str(), rope.scaling_factor) {
            ("linear" | "yarn", Some(f)) if f > 0.0 => 1.0 / f as f32,
            _ => 1.0,
        };
        let rope_attn_factor = rope.attn_factor.map(|a| a as f32).unwrap_or(1.0);
        Ok(Layout {
            arch,
            cfg,
            tok_embd,
            output_norm,
            output,
            layers,
            rope_factors,
            rope_freq_scale,
            rope_attn_factor,
        })
    }
}

impl Model {
    /// Builds the model from an opened (and therefore checked) bundle: [`check_manifest`]'s
    /// checks, then the RoPE frequency factors read (each must be finite and positive).
    pub fn new(bundle: Bundle) -> Result<Model, RuntimeError> {
        let l = layout(&bundle.manifest)?;
        let rope_factors = match &l.rope_factors {
            Some(w) => {
                let v = w.vector(&bundle);
                if let Some((i, x)) = v
                    .iter()
                    .enumerate()
                    .find(|(_, x)| !(x.is_finite() && **x > 0.0))
                {
                    return Err(RuntimeError::Encoding {
                        tensor: w.name.clone(),
                        detail: format!(
                            "RoPE frequency factor {i} is {x}; must be finite and positive"
                        ),
                    });
                }
                Some(v)
            }
            None => None,
        };
        // Palette tables are small (2^bits f16 per group): a non-finite entry is named here,
        // not met as non-finite logits later; so are ternary scales.
        let mut all = vec![&l.tok_embd];
        if !l.cfg.tied_embeddings {
            all.push(&l.output);
        }
        for x in &l.layers {
            all.extend([&x.wq, &x.wk, &x.wv, &x.wo, &x.w_gate, &x.w_up, &x.w_down]);
        }
        for w in all {
            // Ternary block scales (one f16 per 256 weights: 1/128 of the bytes, which the
            // load has just hashed anyway).
            if let WeightData::Ternary { scales, .. } = w.data(&bundle) {
                if let Some(i) = scales
                    .iter()
                    .position(|&h| !half::f16::from_bits(h).is_finite())
                {
                    let blocks = w.cols.div_ceil(256).max(1);
                    return Err(RuntimeError::Encoding {
                        tensor: w.name.clone(),
                        detail: format!(
                            "scale d of row {}, block {}, is not finite",
                            i / blocks,
                            i % blocks
                        ),
                    });
                }
            }
            if let WeightData::Palette(v) = w.data(&bundle) {
                let e = 1usize << v.bits;
                if let Some(i) = v
                    .tables
                    .chunks_exact(2)
                    .position(|h| !half::f16::from_le_bytes([h[0], h[1]]).is_finite())
                {
                    return Err(RuntimeError::Encoding {
                        tensor: w.name.clone(),
                        detail: format!(
                            "palette table of group {}, entry {}, is not finite",
                            i / e,
                            i % e
                        ),
                    });
                }
            }
        }
        Ok(Model {
            bundle,
            arch: l.arch,
            cfg: l.cfg,
            tok_embd: l.tok_embd,
            output_norm: l.output_norm,
            output: l.output,
            layers: l.layers,
            rope_factors,
            rope_freq_scale: l.rope_freq_scale,
            rope_attn_factor: l.rope_attn_factor,
        })
    }

    pub fn weight<'a>(&'a self, w: &Weight) -> WeightRef<'a> {
        WeightRef {
            data: w.data(&self.bundle),
            rows: w.rows,
            cols: w.cols,
        }
    }

    /// Bytes of weights in the bundle (every tensor's stored length).
    pub fn weight_bytes(&self) -> u64 {
        self.bundle.manifest.tensors.iter().map(|t| t.length).sum()
    }

    /// Bytes of weights one decode step reads: every tensor, except that an untied embedding
    /// contributes one row (the head reads a tied one whole).
    pub fn decode_bytes_per_token(&self) -> u64 {
        let all = self.weight_bytes();
        if self.cfg.tied_embeddings {
            return all;
        }
        let emb = self
            .bundle
            .tensor(&self.tok_embd.name)
            .map(|t| t.length)
            .unwrap_or(0);
        all - emb + emb / self.tok_embd.rows.max(1) as u64
    }
}
