//! The model as every backend sees it: the architecture's [`Layout`] resolved from the
//! manifest, and where each weight lives in the bundle and how it is encoded. Device-neutral:
//! nothing here is a kernel's view of the bytes (each backend maps a [`Weight`] to its own),
//! and the only values read are the small vectors the graph needs as f32 (norms, biases,
//! RoPE factors), decoded by the bit-exact dequantizers.

use crate::arch::{Layout, TensorRef};
use crate::bundle::manifest::{Encoding, TensorEntry};
use crate::bundle::reader::Bundle;
use crate::ggml::GgmlType;

use super::RuntimeError;

/// Where a weight lives in the bundle and how it is encoded.
#[derive(Clone, Debug)]
pub struct Weight {
    pub name: String,
    /// Row-major `[rows, cols]` (a vector is `[1, n]`).
    pub rows: usize,
    pub cols: usize,
    /// The bundle file holding it.
    pub file: String,
    pub kind: WeightKind,
}

/// A weight's encoding and its byte ranges `(offset, length)` in [`Weight::file`].
#[derive(Clone, Debug)]
pub enum WeightKind {
    /// GGML blocks, `rows * bytes_per_row` bytes.
    Gguf { ty: GgmlType, range: (u64, u64) },
    /// `rows * cols / 16` little-endian u32 words of 2-bit codes, `rows * cols / 256` f16
    /// scales.
    Ternary {
        codes: (u64, u64),
        scales: (u64, u64),
    },
    /// Per group of `group_size` rows a table of `2^bits` f16 entries; `row_bytes` of
    /// `bits`-bit indices per row.
    Palette {
        bits: u32,
        group_size: usize,
        row_bytes: usize,
        tables: (u64, u64),
        indices: (u64, u64),
    },
}

/// One layer's weights: the architecture's [`crate::arch::LayerLayout`], located.
pub type Layer = crate::arch::LayerLayout<Weight>;

/// Everything a forward pass needs, resolved from a checked bundle.
pub struct Model {
    pub bundle: Bundle,
    pub layout: Layout,
    pub tok_embd: Weight,
    pub output_norm: Weight,
    pub output: Weight,
    pub layers: Vec<Layer>,
    /// RoPE frequency factors, `n_rot / 2` (finite and positive, checked at load).
    pub rope_factors: Option<Vec<f32>>,
}

impl Weight {
    fn from_entry(t: &TensorEntry) -> Result<Weight, RuntimeError> {
        let (rows, cols) = match t.shape.as_slice() {
            [n] => (1, *n as usize),
            [r, c] => (*r as usize, *c as usize),
            s => {
                return Err(RuntimeError::Encoding {
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

    /// The bytes of `range` in this weight's file (ranges were checked against the files when
    /// the bundle was opened).
    pub fn bytes<'a>(&self, b: &'a Bundle, range: (u64, u64)) -> &'a [u8] {
        let map = b.file(&self.file).unwrap_or_default();
        &map[range.0 as usize..(range.0 + range.1) as usize]
    }

    /// Row `r` as f32, by the bit-exact dequantizers (ternary `d * (code - 1)`, palette entries
    /// widened from f16, GGML types as gguf-py).
    pub fn row_values(&self, b: &Bundle, r: usize, out: &mut [f32]) {
        let cols = self.cols;
        match self.kind {
            WeightKind::Gguf { ty, range } => {
                let bytes = self.bytes(b, range);
                let rb = ty.bytes_for(cols as u64).unwrap_or(0) as usize;
                let _ = crate::quant::dequantize(ty, &bytes[r * rb..(r + 1) * rb], out);
            }
            WeightKind::Ternary { codes, scales } => {
                let words: &[u32] = bytemuck::cast_slice(self.bytes(b, codes));
                let sc: &[u16] = bytemuck::cast_slice(self.bytes(b, scales));
                crate::ternary::row_values(
                    &words[r * cols / 16..(r + 1) * cols / 16],
                    &sc[r * cols / 256..(r + 1) * cols / 256],
                    out,
                )
            }
            WeightKind::Palette { .. } => {
                if let Some(v) = self.palette_view(b) {
                    v.row(r, out, &mut vec![0u8; cols])
                }
            }
        }
    }

    /// A 1-D weight (norm, bias, RoPE factors) as f32.
    pub fn vector(&self, b: &Bundle) -> Vec<f32> {
        let mut out = vec![0f32; self.cols];
        self.row_values(b, 0, &mut out);
        out
    }

    /// The palette layout over the bundle's bytes (`None` for other encodings).
    pub fn palette_view<'a>(&self, b: &'a Bundle) -> Option<crate::palette::PaletteView<'a>> {
        match self.kind {
            WeightKind::Palette {
                bits,
                group_size,
                row_bytes,
                tables,
                indices,
            } => Some(crate::palette::PaletteView {
                bits,
                group_size,
                cols: self.cols,
                row_bytes,
                tables: self.bytes(b, tables),
                indices: self.bytes(b, indices),
            }),
            _ => None,
        }
    }
}

impl Model {
    /// Builds the model from an opened (and therefore checked) bundle: the architecture's
    /// layout ([`Layout::of_manifest`]), each weight's encoding, then the values checked here
    /// because a kernel would only meet them as non-finite logits: RoPE factors finite and
    /// positive, ternary block scales and palette table entries finite.
    pub fn new(bundle: Bundle) -> Result<Model, RuntimeError> {
        let layout = Layout::of_manifest(&bundle.manifest)?;
        let m = &bundle.manifest;
        let w = |t: &TensorRef| -> Result<Weight, RuntimeError> {
            let e = m.tensors.iter().find(|e| e.name == t.name).ok_or_else(|| {
                crate::arch::ArchError::MissingTensor {
                    tensor: t.name.clone(),
                }
            })?;
            Weight::from_entry(e)
        };
        let layers = layout
            .layers
            .iter()
            .map(|l| l.map(w))
            .collect::<Result<Vec<Layer>, RuntimeError>>()?;
        let tok_embd = w(&layout.tok_embd)?;
        let output_norm = w(&layout.output_norm)?;
        let output = w(&layout.output)?;
        let rope_factors = match &layout.rope_factors {
            Some(t) => {
                let wt = w(t)?;
                let v = wt.vector(&bundle);
                if let Some((i, x)) = v
                    .iter()
                    .enumerate()
                    .find(|(_, x)| !(x.is_finite() && **x > 0.0))
                {
                    return Err(RuntimeError::Encoding {
                        tensor: wt.name.clone(),
                        detail: format!(
                            "RoPE frequency factor {i} is {x}; must be finite and positive"
                        ),
                    });
                }
                Some(v)
            }
            None => None,
        };
        let mut all = vec![&tok_embd];
        if !layout.cfg.tied_embeddings {
            all.push(&output);
        }
        for l in &layers {
            all.extend(l.matrices());
        }
        for wt in all {
            check_values(wt, &bundle)?;
        }
        Ok(Model {
            bundle,
            layout,
            tok_embd,
            output_norm,
            output,
            layers,
            rope_factors,
        })
    }

    /// Bytes of weights in the bundle (every tensor's stored length).
    pub fn weight_bytes(&self) -> u64 {
        self.bundle.manifest.tensors.iter().map(|t| t.length).sum()
    }

    /// Bytes of weights one decode step reads: every tensor, except that an untied embedding
    /// contributes one row (the head reads a tied one whole).
    pub fn decode_bytes_per_token(&self) -> u64 {
        let all = self.weight_bytes();
        if self.layout.cfg.tied_embeddings {
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

/// Ternary block scales (one f16 per 256 weights: 1/128 of the bytes, which the load has just
/// hashed anyway) and palette tables (`2^bits` f16 per group) must be finite: named here, not
/// met as non-finite logits later.
fn check_values(w: &Weight, b: &Bundle) -> Result<(), RuntimeError> {
    match w.kind {
        WeightKind::Ternary { scales, .. } => {
            let sc: &[u16] = bytemuck::cast_slice(w.bytes(b, scales));
            if let Some(i) = sc
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
        WeightKind::Palette { bits, tables, .. } => {
            let e = 1usize << bits;
            if let Some(i) = w
                .bytes(b, tables)
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
        WeightKind::Gguf { .. } => {}
    }
    Ok(())
}
