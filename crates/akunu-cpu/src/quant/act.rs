//! Activation rows quantized once per product, in the form the weight type's dot product wants.
//!
//! The legacy types' levels follow ggml exactly, so that products track llama.cpp's: Q8_0 as its
//! x86 `quantize_row_q8_0` (`id = 127/amax`, round half to even, the `f16`-rounded scale used in
//! the dot product). The k-quants take the same 32-element blocks with the scale kept in `f32`
//! rather than ggml's Q8_K (one scale per 256), see [`ActFormat::Q8_0F32`]. Per group of 16 or
//! 32 levels the scale `sx`, the level sum `Σq` and `s = sx·Σq` are kept for the offset and min
//! corrections of [`super::decode`]. Each row is quantized on its own, so a token's levels do
//! not depend on the other rows of the batch.

use akunu_quant::{blocks::F16Le, GgmlType};
use rayon::prelude::*;

use super::decode::{act_layout, ActFormat};

/// Values per activation block, every format.
const BLOCK: usize = 32;

/// Rows with at least this many elements in all are quantized in parallel.
const PAR_MIN_ELEMS: usize = 1 << 16;

/// What the activations were prepared for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Prepared {
    /// Plain `f32` copies (F32, F16 and BF16 weights).
    Float,
    /// Quantized levels with per-group scales and sums.
    Quant { format: ActFormat, group: usize },
}

/// `m` input rows of length `k`, converted once for the dot product of one weight type.
///
/// Built by [`Activations::quantize_for`] and reused across calls without reallocating: the
/// buffers only grow. The same activations serve every weight type with the same layout (e.g.
/// Q4_0, Q5_0, Q8_0 and IQ4_NL share Q8_0 blocks); [`super::matmul`] checks it.
#[derive(Debug, Default)]
pub struct Activations {
    pub(crate) prepared: Option<Prepared>,
    pub(crate) m: usize,
    pub(crate) k: usize,
    /// `m·k` values for float weights.
    pub(crate) f: Vec<f32>,
    /// `m·k` levels, row-major.
    pub(crate) q: Vec<i8>,
    /// `m·k/group` scales, one per group, row-major.
    pub(crate) sx: Vec<f32>,
    /// `m·k/group` level sums `Σq` per group (integers, exact in `f32`).
    pub(crate) xsum: Vec<f32>,
    /// `m·k/group` values `sx·Σq` per group.
    pub(crate) s: Vec<f32>,
}

impl Activations {
    /// Empty activations; the first [`Activations::quantize_for`] allocates.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether these activations, as last prepared, serve products with weights of type `ty`
    /// (every type with the same activation layout shares them).
    pub fn serves(&self, ty: GgmlType) -> bool {
        self.prepared.is_some() && self.prepared == Self::layout(ty)
    }

    /// The preparation weights of type `ty` need.
    pub(crate) fn layout(ty: GgmlType) -> Option<Prepared> {
        match act_layout(ty) {
            Some((format, group)) => Some(Prepared::Quant { format, group }),
            None => Some(Prepared::Float),
        }
    }

    /// Rows held.
    pub fn m(&self) -> usize {
        self.m
    }

    /// Row length.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Converts `x` (`m` rows of `k`, row-major) for products with weights of type `ty`.
    ///
    /// # Panics
    /// If `x.len() != m·k`, or if `k` is not a whole number of activation blocks (32
    /// elements); a weight matrix of a quantized type with `k` columns cannot exist. Types without a kernel are prepared as `f32` and refused by
    /// [`super::matmul`].
    pub fn quantize_for(&mut self, ty: GgmlType, x: &[f32], m: usize, k: usize) {
        assert_eq!(
            x.len(),
            m * k,
            "activations: {m}x{k} needs {} values",
            m * k
        );
        self.m = m;
        self.k = k;
        let Some((format, group)) = act_layout(ty) else {
            self.prepared = Some(Prepared::Float);
            self.f.clear();
            self.f.extend_from_slice(x);
            return;
        };
        assert!(
            k.is_multiple_of(BLOCK),
            "activations: k = {k} is not a multiple of {BLOCK} ({ty})"
        );
        self.prepared = Some(Prepared::Quant { format, group });
        self.q.resize(m * k, 0);
        self.sx.resize(m * k / group, 0.0);
        self.xsum.resize(m * k / group, 0.0);
        self.s.resize(m * k / group, 0.0);
        if m == 0 || k == 0 {
            return;
        }
        let ng = k / group;
        // One task when the work is small: splitting it costs more than it saves.
        let min_len = if m * k >= PAR_MIN_ELEMS { 1 } else { m };
        x.par_chunks_exact(k)
            .zip(self.q.par_chunks_exact_mut(k))
            .zip(self.sx.par_chunks_exact_mut(ng))
            .zip(self.xsum.par_chunks_exact_mut(ng))
            .zip(self.s.par_chunks_exact_mut(ng))
            .with_min_len(min_len)
            .for_each(|((((x, q), sx), xsum), s)| {
                quantize_row(format, x, q, group, sx);
                for (((q, sx), xsum), s) in q.chunks_exact(group).zip(sx).zip(xsum).zip(s) {
                    let sum: i32 = q.iter().map(|&v| i32::from(v)).sum();
                    *xsum = sum as f32;
                    *s = *sx * sum as f32;
                }
            });
    }
}

/// `x` rounded to the nearest integer, ties to even, for `|x| < 2²²` (ggml's `nearest_int`):
/// adding 1.5·2²³ leaves the rounded integer in the low mantissa bits. Unlike
/// `f32::round_ties_even`, which is a library call without SSE4.1, this vectorizes anywhere.
#[inline(always)]
fn round_half_even(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// One row in blocks of [`BLOCK`]: `id = 127/amax`, levels rounded half to even, and the scale
/// `amax/127`, rounded to `f16` for Q8_0 (as ggml's x86 `quantize_row_q8_0`) or kept in `f32`,
/// repeated for each `group` (16 or 32) levels.
fn quantize_row(format: ActFormat, x: &[f32], q: &mut [i8], group: usize, sx: &mut [f32]) {
    for ((x, q), sx) in x
        .chunks_exact(BLOCK)
        .zip(q.chunks_exact_mut(BLOCK))
        .zip(sx.chunks_exact_mut(BLOCK / group))
    {
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        for (q, &v) in q.iter_mut().zip(x) {
            *q = round_half_even(v * id) as i8;
        }
        let d = amax / 127.0;
        sx.fill(match format {
            ActFormat::Q8_0 => F16Le::from_f32(d).to_f32(),
            ActFormat::Q8_0F32 => d,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Vec<f32> {
        let mut s = 12345u32;
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32 - 0.5) * (1.0 + (i % 7) as f32)
            })
            .collect()
    }

    /// Every 32 values get their own scale, so a large value leaves the small ones of the
    /// next block intact (Q8_K's single scale per 256 would round them to zero).
    #[test]
    fn k_quant_blocks_have_their_own_f32_scale() {
        let mut x = data(512);
        x[3] = 1000.0;
        let mut a = Activations::new();
        a.quantize_for(GgmlType::Q6_K, &x, 1, 512);
        assert_eq!(a.sx.len(), 32);
        for (b, xs) in x.chunks_exact(32).enumerate() {
            let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for j in 0..2 {
                let g = 2 * b + j;
                assert_eq!(a.sx[g], amax / 127.0);
                let levels = &a.q[16 * g..16 * g + 16];
                for (&l, &v) in levels.iter().zip(&xs[16 * j..16 * j + 16]) {
                    assert_eq!(l, (v * (127.0 / amax)).round_ties_even() as i8);
                }
                let sum: i32 = levels.iter().map(|&v| i32::from(v)).sum();
                assert_eq!(a.xsum[g], sum as f32);
                assert_eq!(a.s[g], a.sx[g] * sum as f32);
            }
        }
        assert!(a.q[32..].iter().any(|&l| l.unsigned_abs() > 60));
    }

    #[test]
    fn q8_0_rounds_half_to_even_with_f16_scale() {
        let mut x = vec![0.0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -3.5;
        let mut a = Activations::new();
        a.quantize_for(GgmlType::Q5_0, &x, 1, 32);
        assert_eq!(&a.q[..3], &[127, 2, -4]);
        assert_eq!(a.sx[0], 1.0);
        assert_eq!(a.xsum[0], 125.0);
        assert_eq!(a.s[0], 125.0);
    }
}
