//! The element-wise and attention ops of the plan, on plain slices, one row (or one head) at a
//! time. The backend decides how rows are spread over threads; these functions only compute.
//!
//! Numerics follow llama.cpp's CPU backend where it matters for matching its logits: RMSNorm
//! sums squares in f32 then divides, GELU is the tanh approximation, attention runs in f32 over
//! an f16 cache with a running (online) softmax.

use akunu_core::{Activation, RopeStyle};
use half::f16;

use crate::multiversion::multiversion;

multiversion! {
    /// `dst = src / sqrt(mean(src²) + eps) * weight`, over one group (a row or a head).
    pub fn rms_norm(src: &[f32], weight: &[f32], eps: f32, dst: &mut [f32]) {
        let scale = 1.0 / (sum_squares(src) / src.len() as f32 + eps).sqrt();
        for ((d, &x), &w) in dst.iter_mut().zip(src).zip(weight) {
            *d = x * scale * w;
        }
    }
}

multiversion! {
    /// [`rms_norm`] in place.
    pub fn rms_norm_inplace(x: &mut [f32], weight: &[f32], eps: f32) {
        let scale = 1.0 / (sum_squares(x) / x.len() as f32 + eps).sqrt();
        for (v, &w) in x.iter_mut().zip(weight) {
            *v *= scale * w;
        }
    }
}

/// Lanes of the vectorised reductions: one AVX-512 register, two AVX2 ones.
const LANES: usize = 16;

#[inline(always)]
fn sum_squares(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
    for c in chunks {
        for l in 0..LANES {
            acc[l] += c[l] * c[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `y += a * x`.
#[inline(always)]
pub(crate) fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// The cosine and sine of each pair's angle at `pos`: `cos_sin[2i], cos_sin[2i+1]`.
pub fn rope_angles(pos: u32, inv_freq: &[f32], cos_sin: &mut [f32]) {
    for (i, &f) in inv_freq.iter().enumerate() {
        let (s, c) = (pos as f32 * f).sin_cos();
        cos_sin[2 * i] = c;
        cos_sin[2 * i + 1] = s;
    }
}

/// Rotates the first `n_rot` dimensions of one head by precomputed angles.
pub fn rope_head(head: &mut [f32], n_rot: usize, style: RopeStyle, cos_sin: &[f32]) {
    let half = n_rot / 2;
    for i in 0..half {
        let (c, s) = (cos_sin[2 * i], cos_sin[2 * i + 1]);
        let (a, b) = match style {
            RopeStyle::Normal => (2 * i, 2 * i + 1),
            RopeStyle::Neox => (i, i + half),
        };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * c - x1 * s;
        head[b] = x0 * s + x1 * c;
    }
}

/// `e^x` to about 2 ulp, in straight-line code the compiler vectorises (the C library's `expf`
/// is a call per element). Below -87 it returns 0, above 88 infinity.
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so `x - n ln 2` stays exact for |n| < 2^8.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.3, 89.0);
    // Adding and subtracting 1.5·2²³ rounds to the nearest integer with plain adds, which
    // vectorise on every x86-64 (`round` needs SSE4.1).
    const ROUND: f32 = 12_582_912.0;
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    // Minimax polynomial for e^r on [-ln2/2, ln2/2] (Cephes expf).
    let p = 1.987_569_1e-4f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.500_000_06;
    let e = p * r * r + r + 1.0;
    // n is in -126..=128 after the clamp; scaling in two steps keeps 2^n representable.
    let n = n as i32;
    let half = n / 2;
    let s1 = f32::from_bits(((half + 127) as u32) << 23);
    let s2 = f32::from_bits(((n - half + 127) as u32) << 23);
    let y = e * s1 * s2;
    if x <= -87.3 {
        0.0
    } else {
        y
    }
}

/// GELU, tanh approximation, written as `x · sigmoid(2u)` (the same function) so it needs one
/// exponential and no `tanh`.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let u = SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x * x);
    x / (1.0 + fast_exp(-2.0 * u))
}

#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + fast_exp(-x))
}

multiversion! {
    /// `gate = act(gate) * up`.
    pub fn gated_activation(act: Activation, gate: &mut [f32], up: &[f32]) {
        match act {
            Activation::Silu => {
                for (g, &u) in gate.iter_mut().zip(up) {
                    *g = silu(*g) * u;
                }
            }
            Activation::GeluTanh => {
                for (g, &u) in gate.iter_mut().zip(up) {
                    *g = gelu(*g) * u;
                }
            }
        }
    }
}

multiversion! {
    /// `x = tanh(x / cap) * cap`.
    pub fn softcap(x: &mut [f32], cap: f32) {
        for v in x {
            *v = fast_tanh(*v / cap) * cap;
        }
    }
}

/// `tanh` through one exponential: `1 - 2 / (e^{2x} + 1)`, exact at the limits.
#[inline(always)]
pub fn fast_tanh(x: f32) -> f32 {
    1.0 - 2.0 / (fast_exp(2.0 * x) + 1.0)
}

/// The query heads that share one key/value head, against a run of cached positions.
pub struct AttnGroup<'a> {
    /// `heads * head_dim` query values, head after head.
    pub q: &'a [f32],
    pub heads: usize,
    /// Keys of the visible positions, `n * head_dim` f16 bit patterns, oldest first.
    pub k: &'a [u16],
    /// Values of the same positions, `n * head_dim_v`.
    pub v: &'a [u16],
    pub scale: f32,
    pub softcap: Option<f32>,
}

/// Positions converted per step of the online softmax: large enough to amortise the f16
/// conversion, small enough to stay in L1.
const KV_TILE: usize = 32;

multiversion! {
/// `out[h] = softmax(q[h]·Kᵀ · scale) · V` for every head of the group, with an online softmax
/// over tiles of positions; each tile of K and V is converted to f32 once for all the group's
/// heads. `out` holds `heads * head_dim_v` values. An empty run gives zeros.
pub fn attend_group(g: &AttnGroup, out: &mut [f32], scratch: &mut Vec<f32>) {
    let heads = g.heads;
    let d = g.q.len() / heads;
    let dv = out.len() / heads;
    let n = g.k.len() / d.max(1);
    out.fill(0.0);
    scratch.resize(KV_TILE * (d + dv) + heads * (KV_TILE + 2), 0.0);
    let (kt, rest) = scratch.split_at_mut(KV_TILE * d);
    let (vt, rest) = rest.split_at_mut(KV_TILE * dv);
    let (scores, state) = rest.split_at_mut(heads * KV_TILE);
    let (maxes, sums) = state.split_at_mut(heads);
    maxes.fill(f32::NEG_INFINITY);
    sums.fill(0.0);
    let mut start = 0;
    while start < n {
        let len = KV_TILE.min(n - start);
        to_f32(&g.k[start * d..(start + len) * d], &mut kt[..len * d]);
        to_f32(&g.v[start * dv..(start + len) * dv], &mut vt[..len * dv]);
        for h in 0..heads {
            let q = &g.q[h * d..(h + 1) * d];
            let sc = &mut scores[h * KV_TILE..h * KV_TILE + len];
            let mut tile_max = f32::NEG_INFINITY;
            for (j, s) in sc.iter_mut().enumerate() {
                let mut x = dot(q, &kt[j * d..(j + 1) * d]) * g.scale;
                if let Some(cap) = g.softcap {
                    x = fast_tanh(x / cap) * cap;
                }
                *s = x;
                tile_max = tile_max.max(x);
            }
            let o = &mut out[h * dv..(h + 1) * dv];
            if tile_max > maxes[h] {
                let correction = fast_exp(maxes[h] - tile_max);
                sums[h] *= correction;
                o.iter_mut().for_each(|x| *x *= correction);
                maxes[h] = tile_max;
            }
            let m = maxes[h];
            for s in sc.iter_mut() {
                *s = fast_exp(*s - m);
            }
            sums[h] += sc.iter().sum::<f32>();
            for (j, &p) in sc.iter().enumerate() {
                axpy(o, p, &vt[j * dv..(j + 1) * dv]);
            }
        }
        start += len;
    }
    for h in 0..heads {
        if sums[h] > 0.0 {
            let inv = 1.0 / sums[h];
            out[h * dv..(h + 1) * dv].iter_mut().for_each(|x| *x *= inv);
        }
    }
}
}

fn to_f32(src: &[u16], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    let src: &[f16] = bytemuck::cast_slice(src);
    src.convert_to_f32_slice(dst);
}

/// Rounds values to the nearest f16 (kept as f32).
pub fn round_to_f16(x: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    let mut tmp = [f16::ZERO; 64];
    for chunk in x.chunks_mut(64) {
        let t = &mut tmp[..chunk.len()];
        t.convert_from_f32_slice(chunk);
        t.convert_to_f32_slice(chunk);
    }
}

/// Stores f32 values as f16 bit patterns (round to nearest even, as ggml's conversion).
pub fn store_f16(src: &[f32], dst: &mut [u16]) {
    use half::slice::HalfFloatSliceExt;
    let dst: &mut [f16] = bytemuck::cast_slice_mut(dst);
    dst.convert_from_f32_slice(src);
}
