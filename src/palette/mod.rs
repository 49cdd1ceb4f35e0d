//! Palettization: each group of `G` consecutive rows (output channels) of a weight matrix
//! shares one lookup table (palette) of `2^B` f16 entries, and every weight is stored as a
//! `B`-bit index into its group's table. As coremltools' `OpPalettizerConfig` with
//! `granularity="per_grouped_channel"` (or `per_tensor` when one group spans every row).
//!
//! Modes:
//! - `kmeans`: the globally optimal 1-D k-means of the group's values ([`kmeans::optimal`] on
//!   the sorted distinct values weighted by their counts). Entries are the clusters' means
//!   rounded to f16 once ([`f64_to_f16_bits`]: round to nearest, ties to even, the same on
//!   every CPU); each weight takes the nearest entry (ties: the lower index), which is never
//!   further than its cluster's entry.
//! - `uniform`: `2^B` evenly spaced entries from the group's minimum to its maximum, computed
//!   in f64 (`entry[i] = min + i * (max - min) / (2^B - 1)`, the last entry `max`) and rounded
//!   to f16 once; each weight takes the nearest entry (ties: the lower index).
//! - `uniform-coremltools`: coremltools 9.0 `palettize_weights._get_lut_and_indices` mode
//!   `UNIFORM`, reproduced operation by operation for bit-compatibility, in the source's
//!   precision (f16 sources in f16 arithmetic, as numpy evaluates it; others in f32):
//!   `scale = (max - min) / (2^B - 1)`,
//!   `index = round_half_even((w - min) / (max - min) * (2^B - 1))`,
//!   `entry[i] = i * scale + min` (evaluated in f64, rounded to the source dtype, then to f16).
//!   Indices are not always the nearest entry, small ranges lose precision in f16, and a range
//!   that overflows f16 arithmetic is refused. A group whose values are all equal gets index 0
//!   everywhere (coremltools divides by zero).
//!
//! Few distinct values (`kmeans` and `uniform`): a group with at most `2^B` distinct values
//! keeps them all (exact when they are f16 values). Its table holds them in ascending order,
//! then repeats the largest until it has `2^B` entries (kmeans1d returns fewer centroids than
//! asked for, coremltools pads the same way); no index points past the first copy.
//!
//! Storage ([`pack_row`]): indices of a row packed LSB-first at `B` bits each into
//! `ceil(cols * B / 8)` bytes (index `c` occupies bits `c*B .. c*B + B` of the row's
//! little-endian bit stream); rows follow each other; tables are `n_groups * 2^B` f16,
//! little-endian.
//!
//! Errors: a NaN or infinite weight, a table entry outside f16's finite range (|x| > 65504
//! after rounding; the error names the entry), a range that overflows coremltools' f16
//! arithmetic, or memory that cannot be allocated, refuses the tensor (naming the group).

pub mod kmeans;

use half::f16;

/// Bit widths `convert palettize` accepts.
pub const SUPPORTED_BITS: &[u32] = &[1, 2, 3, 4, 6, 8];

/// How the table of a group is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Kmeans,
    Uniform,
    /// coremltools 9.0's UNIFORM, operation by operation (module docs).
    UniformCoremltools,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Kmeans => "kmeans",
            Mode::Uniform => "uniform",
            Mode::UniformCoremltools => "uniform-coremltools",
        }
    }
    pub fn from_name(s: &str) -> Option<Mode> {
        match s {
            "kmeans" => Some(Mode::Kmeans),
            "uniform" => Some(Mode::Uniform),
            "uniform-coremltools" => Some(Mode::UniformCoremltools),
            _ => None,
        }
    }
}

/// The precision `uniform-coremltools` computes in (the source tensor's element type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arith {
    F32,
    F16,
}

/// Why a group could not be palettized.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum GroupFault {
    #[error("non-finite weight {value} at element {index} of the group")]
    NonFinite { index: usize, value: f32 },
    #[error("table entry {entry} = {value} does not fit float16 (largest finite 65504)")]
    TableOverflow { entry: usize, value: f64 },
    #[error("the range max - min = {range} (from {min} to {max}) overflows the float16 arithmetic of coremltools' UNIFORM order (largest finite 65504); --mode uniform computes it in f64")]
    RangeOverflow { min: f32, max: f32, range: f64 },
    #[error("out of memory: {0}")]
    Alloc(#[from] kmeans::AllocFailed),
}

/// One palettized group: `2^B` f16 table entries (bits), one index per weight, and the
/// reconstruction error against the input (sum of squared errors and max abs error, f64).
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub table: Vec<u16>,
    pub indices: Vec<u8>,
    pub sse: f64,
    pub max_abs_err: f64,
}

/// Orders f32 bit patterns as the numbers they encode (finite values only).
#[inline(always)]
fn order_key(v: f32) -> u32 {
    let b = v.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

#[inline(always)]
fn from_key(k: u32) -> f32 {
    f32::from_bits(if k & 0x8000_0000 != 0 {
        k & 0x7FFF_FFFF
    } else {
        !k
    })
}

/// A group's sorted distinct values (`-0.0` and `0.0` count as one), their counts, and for
/// every weight the index of its value among them.
pub struct Distinct {
    pub xs: Vec<f64>,
    pub ws: Vec<f64>,
    pub index: Vec<u32>,
}

/// [`Distinct`] of `v`. Values that are all exact f16 (a half-precision checkpoint) are
/// counted in 65536 bins of their f16 bits, in numeric order; others are sorted. Both give the
/// same result.
pub fn distinct(v: &[f32]) -> Result<Distinct, kmeans::AllocFailed> {
    use half::slice::HalfFloatSliceExt;
    // Only whether each value is an exact f16 is read from this conversion (any correct
    // rounding path gives exact values back exactly and others not), not its rounding.
    let mut bits = kmeans::try_filled(v.len(), f16::ZERO, "distinct values")?;
    bits.convert_from_f32_slice(v);
    let bits: Vec<u16> = bits.iter().map(|h| h.to_bits()).collect();
    let exact_f16 = bits
        .iter()
        .zip(v)
        .all(|(&b, &x)| crate::quant::f16_bits_to_f32(b).to_bits() == x.to_bits());
    if exact_f16 {
        // 16-bit order keys: negative values reversed below 0x8000, +0 (and -0) at 0x8000.
        let key = |b: u16| -> usize {
            let b = if b == 0x8000 { 0 } else { b };
            (if b & 0x8000 != 0 { !b } else { b | 0x8000 }) as usize
        };
        let mut counts = vec![0u32; 1 << 16];
        let (mut kmin, mut kmax) = (usize::MAX, 0usize);
        for &b in &bits {
            let k = key(b);
            counts[k] += 1;
            kmin = kmin.min(k);
            kmax = kmax.max(k);
        }
        let mut slot = vec![0u32; 1 << 16];
        let (mut xs, mut ws) = (Vec::new(), Vec::new());
        for k in kmin..=kmax.max(kmin) {
            if counts[k] > 0 {
                slot[k] = xs.len() as u32;
                let b = if k & 0x8000 != 0 {
                    (k & 0x7FFF) as u16
                } else {
                    !(k as u16)
                };
                xs.push(f16::from_bits(b).to_f64());
                ws.push(counts[k] as f64);
            }
        }
        let index = bits.iter().map(|&b| slot[key(b)]).collect();
        return Ok(Distinct { xs, ws, index });
    }
    drop(bits);
    let mut keys: Vec<u64> = Vec::new();
    kmeans::try_reserve(&mut keys, v.len(), "distinct values")?;
    keys.extend(
        v.iter()
            .enumerate()
            .map(|(i, &x)| ((order_key(if x == 0.0 { 0.0 } else { x }) as u64) << 32) | i as u64),
    );
    keys.sort_unstable();
    let n_distinct = 1 + keys.windows(2).filter(|p| p[0] >> 32 != p[1] >> 32).count();
    let mut xs: Vec<f64> = Vec::new();
    let mut ws: Vec<f64> = Vec::new();
    kmeans::try_reserve(&mut xs, n_distinct, "distinct values")?;
    kmeans::try_reserve(&mut ws, n_distinct, "distinct values")?;
    let mut index = kmeans::try_filled(v.len(), 0u32, "distinct values")?;
    let mut last = None;
    for k in keys {
        let kv = (k >> 32) as u32;
        if last != Some(kv) {
            xs.push(from_key(kv) as f64);
            ws.push(0.0);
            last = Some(kv);
        }
        *ws.last_mut().expect("pushed above") += 1.0;
        index[(k & 0xFFFF_FFFF) as usize] = (xs.len() - 1) as u32;
    }
    Ok(Distinct { xs, ws, index })
}

/// Sorted distinct values of `v` (`-0.0` and `0.0` count as one) with their counts.
pub fn distinct_counts(v: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let mut keys: Vec<u32> = v.iter().map(|&x| order_key(x)).collect();
    keys.sort_unstable();
    let mut xs: Vec<f64> = Vec::new();
    let mut ws: Vec<f64> = Vec::new();
    for k in keys {
        let x = from_key(k) as f64;
        match xs.last() {
            Some(&l) if l == x => *ws.last_mut().expect("same length") += 1.0,
            _ => {
                xs.push(x);
                ws.push(1.0);
            }
        }
    }
    (xs, ws)
}

/// `x` rounded to binary16 (bits): round to nearest, ties to even, from all 53 bits of the
/// significand, in integer arithmetic (the same bits on every CPU; `half`'s software
/// `f16::from_f64` drops the low 32 bits of the significand before rounding, and its F16C
/// path differs from it). Overflow gives infinity, NaN a quiet NaN.
pub fn f64_to_f16_bits(x: f64) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 48) & 0x8000) as u16;
    let exp = ((b >> 52) & 0x7FF) as i32;
    let man = b & 0x000F_FFFF_FFFF_FFFF;
    if exp == 0x7FF {
        return if man == 0 {
            sign | 0x7C00
        } else {
            sign | 0x7E00 | ((man >> 42) as u16 & 0x1FF)
        };
    }
    let e = exp - 1023;
    if e > 15 {
        return sign | 0x7C00;
    }
    // Below half the smallest subnormal (2^-25), or exactly half (a tie, to even: zero).
    if e < -25 {
        return sign;
    }
    // value = sig * 2^(e - 52); binary16 keeps 11 bits at e >= -14, fewer below.
    let sig = man | (1u64 << 52);
    let shift = (42 + (-14 - e).max(0)) as u32;
    let q = sig >> shift;
    let rem = sig & ((1u64 << shift) - 1);
    let half = 1u64 << (shift - 1);
    let q = if rem > half || (rem == half && q & 1 == 1) {
        q + 1
    } else {
        q
    };
    // Normal: biased exponent e + 15 above the implicit bit (a carry out of the significand
    // moves into the exponent, up to infinity); subnormal: q itself (2^10 is the smallest
    // normal).
    let bits = if e >= -14 {
        (((e + 14) as u64) << 10) + q
    } else {
        q
    };
    sign | bits as u16
}

/// [`f64_to_f16_bits`] of an f32 (widening is exact, so this is correctly rounded too).
#[inline(always)]
pub fn f32_to_f16_bits(x: f32) -> u16 {
    f64_to_f16_bits(x as f64)
}

/// Table entry `entry` of value `x` rounded to f16, or [`GroupFault::TableOverflow`].
fn f16_entry(entry: usize, x: f64) -> Result<u16, GroupFault> {
    let h = f64_to_f16_bits(x);
    if h & 0x7C00 == 0x7C00 {
        return Err(GroupFault::TableOverflow { entry, value: x });
    }
    Ok(h)
}

/// Rounds through f16 as numpy's float16 arithmetic does (the f32 result of one operation on
/// f16 operands, rounded to f16).
#[inline(always)]
fn r16(x: f32) -> f32 {
    crate::quant::f16_bits_to_f32(f32_to_f16_bits(x))
}

/// Palettizes one group of weights (any order; typically `G` rows of `K`). `arith` matters to
/// `uniform-coremltools` only.
pub fn palettize_group(
    values: &[f32],
    bits: u32,
    mode: Mode,
    arith: Arith,
) -> Result<Group, GroupFault> {
    if let Some((index, &value)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(GroupFault::NonFinite { index, value });
    }
    let n_entries = 1usize << bits;
    let (table, indices) = match mode {
        Mode::Kmeans | Mode::Uniform => {
            let d = distinct(values)?;
            let entries: Vec<f64> = if d.xs.len() <= n_entries {
                d.xs.clone()
            } else if mode == Mode::Kmeans {
                kmeans::optimal(&d.xs, &d.ws, n_entries)?.means
            } else {
                let (min, max) = (d.xs[0], d.xs[d.xs.len() - 1]);
                let levels = (n_entries - 1) as f64;
                (0..n_entries)
                    .map(|i| {
                        if i == n_entries - 1 {
                            max
                        } else {
                            min + i as f64 * ((max - min) / levels)
                        }
                    })
                    .collect()
            };
            let mut table = Vec::with_capacity(n_entries);
            for (i, &e) in entries.iter().enumerate() {
                table.push(f16_entry(i, e)?);
            }
            // Pad with the largest entry so the table stays sorted (module docs).
            let last = *table.last().expect("a group is never empty");
            table.resize(n_entries, last);
            let tv: Vec<f64> = table
                .iter()
                .map(|&h| crate::quant::f16_bits_to_f32(h) as f64)
                .collect();
            let used = entries.len();
            // The nearest entry of each distinct value (ascending, so one merge walk), then
            // of each weight through its value's index.
            let near = nearest_sorted(&tv[..used], &d.xs);
            let mut indices = Vec::new();
            kmeans::try_reserve(&mut indices, values.len(), "palette indices")?;
            indices.extend(d.index.iter().map(|&i| near[i as usize]));
            (table, indices)
        }
        Mode::UniformCoremltools => uniform_coremltools(values, bits, arith)?,
    };
    let mut sse = 0f64;
    let mut max_abs_err = 0f64;
    let tv: Vec<f64> = table
        .iter()
        .map(|&h| crate::quant::f16_bits_to_f32(h) as f64)
        .collect();
    for (&v, &i) in values.iter().zip(&indices) {
        let e = (tv[i as usize] - v as f64).abs();
        sse += e * e;
        max_abs_err = max_abs_err.max(e);
    }
    Ok(Group {
        table,
        indices,
        sse,
        max_abs_err,
    })
}

/// [`nearest`] of every value of ascending `xs` in sorted `t`, by one merge walk (the same
/// indices as a binary search per value).
fn nearest_sorted(t: &[f64], xs: &[f64]) -> Vec<u8> {
    let mut p = 0;
    xs.iter()
        .map(|&v| {
            while p < t.len() && t[p] < v {
                p += 1;
            }
            let i = if p == 0 {
                0
            } else if p == t.len() || v - t[p - 1] <= t[p] - v {
                p - 1
            } else {
                p
            };
            i as u8
        })
        .collect()
}

/// Index of the entry of sorted `t` nearest to `v` (ties: the lower index).
#[inline(always)]
#[cfg_attr(not(test), allow(dead_code))]
fn nearest(t: &[f64], v: f64) -> usize {
    let p = t.partition_point(|&e| e < v);
    if p == 0 {
        return 0;
    }
    if p == t.len() {
        return t.len() - 1;
    }
    if v - t[p - 1] <= t[p] - v {
        p - 1
    } else {
        p
    }
}

/// coremltools' UNIFORM mode, operation by operation (see the module docs).
fn uniform_coremltools(
    values: &[f32],
    bits: u32,
    arith: Arith,
) -> Result<(Vec<u16>, Vec<u8>), GroupFault> {
    let levels = ((1u32 << bits) - 1) as f32;
    let r = |x: f32| match arith {
        Arith::F16 => r16(x),
        Arith::F32 => x,
    };
    let min = values.iter().copied().fold(f32::INFINITY, f32::min);
    let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let range = r(max - min);
    let scale = r(range / levels);
    if !range.is_finite() {
        return Err(GroupFault::RangeOverflow {
            min,
            max,
            range: max as f64 - min as f64,
        });
    }
    let indices = values
        .iter()
        .map(|&v| {
            if range == 0.0 {
                0
            } else {
                r(r(r(v - min) / range) * levels).round_ties_even() as u8
            }
        })
        .collect();
    let mut table = Vec::with_capacity(1 << bits);
    for i in 0..(1u32 << bits) {
        let e = i as f64 * scale as f64 + min as f64;
        let e = match arith {
            Arith::F16 => crate::quant::f16_bits_to_f32(f64_to_f16_bits(e)) as f64,
            Arith::F32 => e as f32 as f64,
        };
        table.push(f16_entry(i as usize, e)?);
    }
    Ok((table, indices))
}

/// Bytes of one packed row of `cols` indices at `bits` each.
pub fn row_bytes(cols: u64, bits: u32) -> u64 {
    (cols * bits as u64).div_ceil(8)
}

/// Packs `indices` (each `< 2^bits`) LSB-first into `out` (`row_bytes(len, bits)` bytes).
pub fn pack_row(indices: &[u8], bits: u32, out: &mut [u8]) {
    out.iter_mut().for_each(|b| *b = 0);
    if bits == 8 {
        out.copy_from_slice(indices);
        return;
    }
    let mut bit = 0usize;
    for &ix in indices {
        let v = (ix as u16) << (bit % 8);
        out[bit / 8] |= v as u8;
        if bit % 8 + bits as usize > 8 {
            out[bit / 8 + 1] |= (v >> 8) as u8;
        }
        bit += bits as usize;
    }
}

/// Unpacks `out.len()` indices packed by [`pack_row`]. Whole groups of indices that fill
/// whole bytes (2 per byte at 4 bits, 4 per byte at 2, 8 at 1, 4 per 3 bytes at 6, 8 per 3
/// at 3) are split from those bytes directly; the rest goes bit by bit.
#[inline]
pub fn unpack_row(packed: &[u8], bits: u32, out: &mut [u8]) {
    if bits == 8 {
        out.copy_from_slice(&packed[..out.len()]);
        return;
    }
    let done = match bits {
        4 => unpack_whole::<2, 1, 4>(packed, out),
        2 => unpack_whole::<4, 1, 2>(packed, out),
        1 => unpack_whole::<8, 1, 1>(packed, out),
        6 => unpack_whole::<4, 3, 6>(packed, out),
        3 => unpack_whole::<8, 3, 3>(packed, out),
        _ => 0,
    };
    for (k, o) in out.iter_mut().enumerate().skip(done) {
        *o = index_at(packed, bits, k);
    }
}

/// Index `k` of a row packed by [`pack_row`] at `bits` (1 to 8) bits each.
#[inline]
pub fn index_at(packed: &[u8], bits: u32, k: usize) -> u8 {
    let bit = k * bits as usize;
    let lo = packed[bit / 8] as u16;
    let hi = if bit % 8 + bits as usize > 8 {
        packed[bit / 8 + 1] as u16
    } else {
        0
    };
    (((lo | (hi << 8)) >> (bit % 8)) & ((1u16 << bits) - 1)) as u8
}

/// The whole groups of [`unpack_row`]: `PER` indices of `BITS` bits from each `BYTES` bytes;
/// returns how many indices it wrote.
#[inline(always)]
fn unpack_whole<const PER: usize, const BYTES: usize, const BITS: u32>(
    packed: &[u8],
    out: &mut [u8],
) -> usize {
    let whole = out.len() / PER;
    for (o, b) in out[..whole * PER]
        .chunks_exact_mut(PER)
        .zip(packed.chunks_exact(BYTES))
    {
        let w = if BYTES == 1 {
            b[0] as u32
        } else {
            u32::from_le_bytes([b[0], b[1], b[2], 0])
        };
        for (j, o) in o.iter_mut().enumerate() {
            *o = ((w >> (j as u32 * BITS)) & ((1 << BITS) - 1)) as u8;
        }
    }
    whole * PER
}

/// A palettized matrix in a bundle: `[rows, cols]`, `tables` `[rows / group_size, 2^bits]`
/// f16 little-endian bytes, `indices` `[rows, row_bytes]` packed by [`pack_row`].
#[derive(Clone, Copy, Debug)]
pub struct PaletteView<'a> {
    pub bits: u32,
    pub group_size: usize,
    pub cols: usize,
    pub row_bytes: usize,
    pub tables: &'a [u8],
    pub indices: &'a [u8],
}

impl PaletteView<'_> {
    /// The f16 table of row `r`'s group, as bytes.
    #[inline]
    pub fn table_bytes(&self, r: usize) -> &[u8] {
        let e = 1usize << self.bits;
        let g = r / self.group_size;
        &self.tables[g * e * 2..(g + 1) * e * 2]
    }

    /// The table of row `r`'s group widened to f32 (entries past `2^bits` are 0).
    #[inline]
    pub fn table_f32(&self, r: usize) -> [f32; 256] {
        let mut t = [0f32; 256];
        for (o, b) in t.iter_mut().zip(self.table_bytes(r).chunks_exact(2)) {
            *o = crate::quant::f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
        }
        t
    }

    /// Row `r` reconstructed: `out[c] = f32(table[index[r, c]])`; `idx` is scratch of
    /// `cols` bytes.
    #[inline]
    pub fn row(&self, r: usize, out: &mut [f32], idx: &mut [u8]) {
        self.row_with_table(&self.table_f32(r), r, out, idx)
    }

    /// [`Self::row`] with the group's table already widened ([`Self::table_f32`]), for
    /// callers that walk several rows of one group.
    #[inline]
    pub fn row_with_table(&self, t: &[f32; 256], r: usize, out: &mut [f32], idx: &mut [u8]) {
        unpack_row(
            &self.indices[r * self.row_bytes..(r + 1) * self.row_bytes],
            self.bits,
            &mut idx[..self.cols],
        );
        for (o, &i) in out.iter_mut().zip(idx.iter()) {
            *o = t[i as usize];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_paths_agree_and_index_every_weight() {
        let mut seed = 3u64;
        let mut lcg = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let f32s: Vec<f32> = (0..5000).map(|_| lcg() * 0.1).collect();
        let mut f16s: Vec<f32> = f32s.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
        f16s[7] = -0.0;
        f16s[8] = 0.0;
        f16s[9] = f16::from_bits(1).to_f32(); // smallest subnormal
        for (name, v) in [("f32", &f32s), ("f16", &f16s)] {
            let d = distinct(v).unwrap();
            let (xs, ws) = distinct_counts(v);
            assert_eq!(d.xs, xs, "{name}");
            assert_eq!(d.ws, ws, "{name}");
            for (x, &i) in v.iter().zip(&d.index) {
                assert_eq!(d.xs[i as usize], *x as f64, "{name}");
            }
        }
        // The bins and the sort agree on f16 values too.
        let sorted = {
            let mut keys: Vec<u64> = f16s
                .iter()
                .enumerate()
                .map(|(i, &x)| {
                    ((order_key(if x == 0.0 { 0.0 } else { x }) as u64) << 32) | i as u64
                })
                .collect();
            keys.sort_unstable();
            keys.dedup_by_key(|k| *k >> 32);
            keys.iter()
                .map(|k| from_key((*k >> 32) as u32) as f64)
                .collect::<Vec<_>>()
        };
        assert_eq!(distinct(&f16s).unwrap().xs, sorted);
    }

    #[test]
    fn merge_walk_equals_binary_search() {
        let t = [-1.0, -0.5, -0.5, 0.0, 0.25, 2.0];
        let xs: Vec<f64> = (-30..=30)
            .map(|i| i as f64 * 0.1)
            .chain([-0.75, 0.125])
            .collect();
        let mut xs = xs;
        xs.sort_by(f64::total_cmp);
        let near = nearest_sorted(&t, &xs);
        for (v, n) in xs.iter().zip(&near) {
            assert_eq!(*n as usize, nearest(&t, *v), "{v}");
        }
    }

    #[test]
    fn pack_roundtrip_every_width() {
        for &bits in SUPPORTED_BITS {
            for cols in [1usize, 3, 7, 8, 9, 31, 64, 577] {
                let idx: Vec<u8> = (0..cols)
                    .map(|i| ((i * 37 + 11) % (1 << bits)) as u8)
                    .collect();
                let mut packed = vec![0u8; row_bytes(cols as u64, bits) as usize];
                pack_row(&idx, bits, &mut packed);
                let mut back = vec![0u8; cols];
                unpack_row(&packed, bits, &mut back);
                assert_eq!(back, idx, "bits {bits} cols {cols}");
            }
        }
    }

    #[test]
    fn pack_is_lsb_first() {
        let mut p = [0u8; 3];
        pack_row(&[1, 2, 3, 4], 6, &mut p);
        // 1 | 2 << 6 | 3 << 12 | 4 << 18
        let v = 1u32 | (2 << 6) | (3 << 12) | (4 << 18);
        assert_eq!(p, [v as u8, (v >> 8) as u8, (v >> 16) as u8]);
    }

    #[test]
    fn few_distinct_values_are_exact() {
        let v: Vec<f32> = (0..1000)
            .map(|i| [0.5f32, -0.25, 0.0, 1.0][i % 4])
            .collect();
        for bits in [2, 4, 8] {
            let g = palettize_group(&v, bits, Mode::Kmeans, Arith::F32).unwrap();
            assert_eq!(g.sse, 0.0);
            assert_eq!(g.max_abs_err, 0.0);
        }
        let g = palettize_group(&v, 1, Mode::Kmeans, Arith::F32).unwrap();
        assert!(g.sse > 0.0);
    }

    #[test]
    fn non_finite_is_refused() {
        let v = [0.0f32, f32::NAN, 1.0];
        assert!(matches!(
            palettize_group(&v, 4, Mode::Kmeans, Arith::F32),
            Err(GroupFault::NonFinite { index: 1, .. })
        ));
        let v = [0.0f32, 1.0, f32::NEG_INFINITY];
        assert!(matches!(
            palettize_group(&v, 4, Mode::Uniform, Arith::F32),
            Err(GroupFault::NonFinite { index: 2, .. })
        ));
    }

    #[test]
    fn overflowing_entry_is_refused() {
        let v = [1e6f32, -1e6, 0.0, 5.0, 7.0];
        assert!(matches!(
            palettize_group(&v, 1, Mode::Kmeans, Arith::F32),
            Err(GroupFault::TableOverflow { .. })
        ));
    }

    #[test]
    fn constant_group_uniform_is_exact() {
        let v = [0.125f32; 64];
        for mode in [Mode::Uniform, Mode::UniformCoremltools] {
            let g = palettize_group(&v, 4, mode, Arith::F16).unwrap();
            assert_eq!(g.sse, 0.0);
            assert!(g.indices.iter().all(|&i| i == 0));
        }
    }
}
