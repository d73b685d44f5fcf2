//! The element-wise and attention ops of the CPU backend against `f64` references written here,
//! on random inputs of varied sign and magnitude (never all zeros) and odd lengths, so that
//! the vectorised main loops, their remainders and the tiling of attention are all exercised.
//! Tolerances follow from `f32` arithmetic: a few units in the last place per element, plus
//! what the op's own documented approximation costs (f32 angles in RoPE, the one-exponential
//! `tanh`).

use akunu_core::{Activation, RopeStyle};
use akunu_cpu::ops::{self, AttnGroup};
use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A value of random sign whose magnitude is spread log-uniformly over `10^lo..10^hi`.
fn varied(rng: &mut StdRng, lo: f32, hi: f32) -> f32 {
    let mag = 10f32.powf(rng.random_range(lo..hi));
    if rng.random_bool(0.5) {
        mag
    } else {
        -mag
    }
}

fn vec_varied(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| varied(rng, lo, hi)).collect()
}

/// Fails with the first element of `got` farther from `want` than `tol(i, want[i])`.
fn assert_close(what: &str, got: &[f32], want: &[f64], tol: impl Fn(usize, f64) -> f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        let t = tol(i, w);
        assert!(
            err <= t,
            "{what}: element {i}: got {g:e}, want {w:e} (error {err:e}, tolerance {t:e})"
        );
    }
}

const EPS: f64 = f32::EPSILON as f64;

// ---------------------------------------------------------------------------------------------
// RMSNorm

fn rms_norm_ref(x: &[f32], w: &[f32], eps: f32) -> Vec<f64> {
    let ms = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / x.len() as f64;
    let scale = 1.0 / (ms + eps as f64).sqrt();
    x.iter()
        .zip(w)
        .map(|(&v, &w)| v as f64 * scale * w as f64)
        .collect()
}

/// Both variants over one group, against the reference: the sum of squares is an `f32` sum
/// in 16 lanes, so its relative error stays far below 1e-5 for these lengths.
fn check_rms(what: &str, x: &[f32], w: &[f32], eps: f32) {
    let want = rms_norm_ref(x, w, eps);
    let tol = |_, v: f64| 1e-5 * v.abs() + 1e-37;
    let mut out = vec![f32::NAN; x.len()];
    ops::rms_norm(x, w, eps, &mut out);
    assert_close(&format!("rms_norm {what}"), &out, &want, tol);
    let mut inplace = x.to_vec();
    ops::rms_norm_inplace(&mut inplace, w, eps);
    assert_close(&format!("rms_norm_inplace {what}"), &inplace, &want, tol);
}

#[test]
fn rms_norm_matches_reference_over_rows() {
    let mut rng = StdRng::seed_from_u64(1);
    // Row magnitudes from well below the epsilon (where it dominates) to large activations.
    for &len in &[1usize, 3, 15, 16, 17, 33, 255, 896, 2049, 4099] {
        for &(lo, hi) in &[
            (-5.0, -3.0),
            (-3.0, 0.0),
            (-1.0, 1.0),
            (1.0, 3.0),
            (4.0, 6.0),
        ] {
            for &eps in &[1e-5f32, 1e-6] {
                let x = vec_varied(&mut rng, len, lo, hi);
                let w = vec_varied(&mut rng, len, -1.0, 0.5);
                check_rms(
                    &format!("row of {len}, 1e{lo}..1e{hi}, eps {eps}"),
                    &x,
                    &w,
                    eps,
                );
            }
        }
    }
}

#[test]
fn rms_norm_per_head_matches_reference() {
    // QK-norm: each head of a row is normalised on its own with one shared head-wide weight,
    // as the backend does by chunking rows into groups.
    let mut rng = StdRng::seed_from_u64(2);
    for &(heads, head_dim) in &[(1usize, 64usize), (3, 64), (8, 128), (5, 256), (7, 80)] {
        let row = vec_varied(&mut rng, heads * head_dim, -2.0, 2.0);
        let w = vec_varied(&mut rng, head_dim, -1.0, 0.5);
        let mut out = vec![f32::NAN; row.len()];
        for (o, x) in out.chunks_mut(head_dim).zip(row.chunks(head_dim)) {
            ops::rms_norm(x, &w, 1e-6, o);
        }
        let mut inplace = row.clone();
        inplace
            .chunks_mut(head_dim)
            .for_each(|g| ops::rms_norm_inplace(g, &w, 1e-6));
        for h in 0..heads {
            let range = h * head_dim..(h + 1) * head_dim;
            let want = rms_norm_ref(&row[range.clone()], &w, 1e-6);
            let what = format!("{heads}x{head_dim} head {h}");
            let tol = |_, v: f64| 1e-5 * v.abs() + 1e-37;
            assert_close(&format!("rms_norm {what}"), &out[range.clone()], &want, tol);
            assert_close(
                &format!("rms_norm_inplace {what}"),
                &inplace[range],
                &want,
                tol,
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// RoPE

/// Indices of the two dimensions pair `i` rotates.
fn pair(style: RopeStyle, i: usize, n_rot: usize) -> (usize, usize) {
    match style {
        RopeStyle::Normal => (2 * i, 2 * i + 1),
        RopeStyle::Neox => (i, i + n_rot / 2),
    }
}

#[test]
fn rope_rotates_pairs_by_position_times_frequency() {
    let mut rng = StdRng::seed_from_u64(3);
    let positions = [0u32, 1, 2, 7, 100, 4095, 30_000, 131_071];
    for style in [RopeStyle::Normal, RopeStyle::Neox] {
        for &(head_dim, n_rot) in &[
            (64usize, 64usize),
            (128, 128),
            (256, 256),
            (128, 64),
            (80, 24),
        ] {
            for &(base, scale) in &[
                (10_000.0f32, 1.0f32),
                (1_000_000.0, 1.0),
                (500_000.0, 0.125),
            ] {
                let inv_freq = akunu_core::plan::inv_freq(n_rot, base, scale, None);
                assert_eq!(inv_freq.len(), n_rot / 2);
                let mut cos_sin = vec![f32::NAN; n_rot];
                for &pos in &positions {
                    let what =
                        format!("{style:?} head {head_dim} rot {n_rot} base {base} pos {pos}");
                    let head = vec_varied(&mut rng, head_dim, -2.0, 1.0);
                    let mut got = head.clone();
                    ops::rope_angles(pos, &inv_freq, &mut cos_sin);
                    ops::rope_head(&mut got, n_rot, style, &cos_sin);
                    // Dimensions past n_rot pass through bit for bit.
                    assert_eq!(
                        got[n_rot..].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        head[n_rot..]
                            .iter()
                            .map(|v| v.to_bits())
                            .collect::<Vec<_>>(),
                        "{what}: unrotated tail changed"
                    );
                    for (i, &f) in inv_freq.iter().enumerate() {
                        let (a, b) = pair(style, i, n_rot);
                        let (x0, x1) = (head[a] as f64, head[b] as f64);
                        let mag = x0.abs() + x1.abs();
                        let rotate = |theta: f64| {
                            let (s, c) = theta.sin_cos();
                            (x0 * c - x1 * s, x0 * s + x1 * c)
                        };
                        // The angle is an f32 product, as in llama.cpp; with that angle the
                        // rotation itself is exact to a few ulp of the pair's magnitude.
                        let theta32 = (pos as f32 * f) as f64;
                        let (r0, r1) = rotate(theta32);
                        let tight = 8.0 * EPS * mag;
                        for (d, g, w) in [(a, got[a], r0), (b, got[b], r1)] {
                            assert!(
                                (g as f64 - w).abs() <= tight,
                                "{what}: pair {i} dim {d}: got {g}, want {w} at the f32 angle"
                            );
                        }
                        // Against the exact angle, the f32 product may be off by half an ulp
                        // of the angle, which moves the rotated point by that arc.
                        let theta = pos as f64 * f as f64;
                        let (e0, e1) = rotate(theta);
                        let loose = tight + theta.abs() * EPS * mag;
                        for (d, g, w) in [(a, got[a], e0), (b, got[b], e1)] {
                            assert!(
                                (g as f64 - w).abs() <= loose,
                                "{what}: pair {i} dim {d}: got {g}, want {w} at the exact angle"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn rope_at_position_zero_is_the_identity() {
    let mut rng = StdRng::seed_from_u64(4);
    let inv_freq = akunu_core::plan::inv_freq(64, 10_000.0, 1.0, None);
    let mut cos_sin = vec![0.0; 64];
    ops::rope_angles(0, &inv_freq, &mut cos_sin);
    for style in [RopeStyle::Normal, RopeStyle::Neox] {
        let head = vec_varied(&mut rng, 96, -3.0, 3.0);
        let mut got = head.clone();
        ops::rope_head(&mut got, 64, style, &cos_sin);
        assert_eq!(got, head, "{style:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Exponential, activations, soft-capping

#[test]
fn fast_exp_is_accurate_where_exp_is_a_normal_float() {
    // From the underflow threshold of the implementation (-87.3, above the smallest normal
    // float's logarithm) to just below ln(f32::MAX), densely, plus the integers.
    let (lo, hi) = (-87.3f64, 88.7f64);
    let n = 400_000;
    let mut worst = (0.0f64, 0.0f64);
    let xs = (0..=n)
        .map(|i| lo + (hi - lo) * i as f64 / n as f64)
        .chain((-87..=88).map(|i| i as f64));
    for x in xs {
        let x = x as f32;
        if x <= -87.3 {
            continue;
        }
        let got = ops::fast_exp(x) as f64;
        let want = (x as f64).exp();
        let rel = (got - want).abs() / want;
        if rel > worst.0 {
            worst = (rel, x as f64);
        }
    }
    // "About 2 ulp": allow 4 ulp of relative error.
    assert!(
        worst.0 <= 4.0 * EPS,
        "fast_exp: relative error {:e} at x = {} (bound {:e})",
        worst.0,
        worst.1,
        4.0 * EPS
    );
}

#[test]
fn fast_exp_underflows_to_zero_and_never_gives_nan() {
    let n = 200_000;
    for i in 0..=n {
        let x = -100.0 + 200.0 * i as f32 / n as f32;
        let y = ops::fast_exp(x);
        assert!(!y.is_nan(), "fast_exp({x}) is NaN");
        assert!(y >= 0.0, "fast_exp({x}) = {y} is negative");
        if x <= -87.3 {
            assert_eq!(y, 0.0, "fast_exp({x}) below the underflow threshold");
        }
    }
    for x in [f32::MIN, -1e30, -1000.0, -87.31] {
        assert_eq!(ops::fast_exp(x), 0.0, "fast_exp({x})");
    }
    // Monotone across the ends of its range, where the clamp and the polynomial meet.
    let mut prev = 0.0f32;
    for i in 0..=2000 {
        let x = 86.0 + 3.0 * i as f32 / 2000.0;
        let y = ops::fast_exp(x);
        assert!(y >= prev, "fast_exp is not monotone at {x}: {y} < {prev}");
        prev = y;
    }
}

#[test]
fn fast_exp_overflows_to_infinity_like_exp() {
    // The documented contract (and `f32::exp`): past ln(f32::MAX) = 88.72284 the result is
    // infinite, and just below it the value is still accurate. Callers rely on this for the
    // limits of `x / (1 + e^-x)` at very negative x.
    for x in [88.71f32, 88.72] {
        let want = (x as f64).exp();
        let got = ops::fast_exp(x) as f64;
        assert!(
            (got - want).abs() <= 4.0 * EPS * want,
            "fast_exp({x}) = {got:e}, want {want:e}"
        );
    }
    for x in [88.73f32, 89.0, 100.0, 1e30, f32::MAX] {
        assert_eq!(ops::fast_exp(x), f32::INFINITY, "fast_exp({x})");
    }
}

fn silu_ref(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// `0.5·x·(1 + tanh(u))`, written as the identical `x · sigmoid(2u)`: the tanh form cancels
/// to zero in f64 for negative x long before the true value leaves the f32 range.
fn gelu_tanh_ref(x: f64) -> f64 {
    let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    x / (1.0 + (-2.0 * u).exp())
}

#[test]
fn gated_activations_match_reference() {
    let mut rng = StdRng::seed_from_u64(5);
    for (act, f) in [
        (Activation::Silu, silu_ref as fn(f64) -> f64),
        (Activation::GeluTanh, gelu_tanh_ref),
    ] {
        for &len in &[1usize, 7, 16, 17, 63, 1001, 5003] {
            // Gates up to ±80 (where e^-x is still a normal float for both functions' inner
            // exponentials) and down to 1e-3; ups of any size.
            let gate = vec_varied(&mut rng, len, -3.0, 1.9);
            let up = vec_varied(&mut rng, len, -2.0, 2.0);
            let want: Vec<f64> = gate
                .iter()
                .zip(&up)
                .map(|(&g, &u)| f(g as f64) * u as f64)
                .collect();
            let mut got = gate.clone();
            ops::gated_activation(act, &mut got, &up);
            // The exponential's argument (x for SiLU, 2u for GELU) is itself an f32 with a
            // relative error of an ulp, and e^a turns an absolute error δ of a into a relative
            // error δ: so a few ulp plus |a| ulp. Where e^-a leaves the f32 range the op
            // returns x·up / 3.3e38 instead of the true (smaller) value: the floor accepts any
            // result below 1e-30, which is zero for every practical purpose.
            let arg = |x: f64| match act {
                Activation::Silu => x,
                Activation::GeluTanh => {
                    2.0 * (2.0 / std::f64::consts::PI).sqrt() * x * (1.0 + 0.044715 * x * x)
                }
            };
            assert_close(&format!("{act:?} len {len}"), &got, &want, |i, v| {
                (8.0 + 2.0 * arg(gate[i] as f64).abs()) * EPS * v.abs() + 1e-30
            });
        }
    }
}

#[test]
fn activations_reach_their_limits() {
    for x in [20.0f32, 50.0, 88.0, 100.0, 1e4, 1e20, 1e30] {
        let s = ops::silu(x);
        let g = ops::gelu(x);
        assert!((s - x).abs() <= x * 1e-6, "silu({x}) = {s}");
        assert!((g - x).abs() <= x * 1e-6, "gelu({x}) = {g}");
        let (s, g) = (ops::silu(-x), ops::gelu(-x));
        assert!(s <= 0.0 && s > -1e-6, "silu({}) = {s}", -x);
        assert!(g <= 0.0 && g > -1e-6, "gelu({}) = {g}", -x);
    }
    // The tanh GELU dips below zero with its minimum near x = -0.75; SiLU's near -1.28.
    assert!((ops::gelu(-0.75) as f64 - gelu_tanh_ref(-0.75)).abs() < 1e-6);
    assert!((ops::silu(-1.278_464_5) as f64 - silu_ref(-1.278_464_5)).abs() < 1e-6);
}

#[test]
fn activations_vanish_at_the_most_negative_floats() {
    // x / (1 + e^-x) -> 0 as x -> -inf. That needs e^-x to overflow to infinity: an
    // exponential that stopped at a finite 3.3e38 would leave x / 3.3e38, which reaches -1
    // near -f32::MAX.
    for x in [-1e37f32, -1e38, f32::MIN / 2.0, f32::MIN] {
        for (name, y) in [("silu", ops::silu(x)), ("gelu", ops::gelu(x))] {
            assert!(y <= 0.0 && y > -1e-6, "{name}({x}) = {y}, want about 0");
        }
    }
}

#[test]
fn fast_tanh_is_accurate_and_saturates() {
    let n = 100_000;
    for i in 0..=n {
        let x = -20.0 + 40.0 * i as f32 / n as f32;
        let got = ops::fast_tanh(x) as f64;
        let want = (x as f64).tanh();
        // 1 - 2/(e^2x + 1) loses relative accuracy near 0 but stays within a few ulp of 1.
        assert!(
            (got - want).abs() <= 4.0 * EPS,
            "fast_tanh({x}) = {got}, want {want}"
        );
    }
    for x in [20.0f32, 100.0, 1e10, f32::MAX] {
        assert_eq!(ops::fast_tanh(x), 1.0, "fast_tanh({x})");
        assert_eq!(ops::fast_tanh(-x), -1.0, "fast_tanh({})", -x);
    }
}

#[test]
fn softcap_matches_reference() {
    let mut rng = StdRng::seed_from_u64(6);
    for &cap in &[3.0f32, 10.0, 30.0, 50.0] {
        for &len in &[1usize, 17, 333, 1025] {
            let x = vec_varied(&mut rng, len, -3.0, 4.0);
            let want: Vec<f64> = x
                .iter()
                .map(|&v| (v as f64 / cap as f64).tanh() * cap as f64)
                .collect();
            let mut got = x.clone();
            ops::softcap(&mut got, cap);
            // The tanh is within a few ulp of 1 in absolute terms, so the capped value is
            // within a few ulp of the cap.
            assert_close(&format!("softcap {cap} len {len}"), &got, &want, |_, v| {
                4.0 * EPS * v.abs() + 8.0 * EPS * cap as f64
            });
            assert!(
                got.iter().all(|v| v.abs() <= cap),
                "softcap {cap} exceeds the cap"
            );
        }
        let mut limits = [1e6f32, -1e6, 1e30, -1e30, f32::MAX, f32::MIN];
        ops::softcap(&mut limits, cap);
        assert_eq!(
            limits,
            [cap, -cap, cap, -cap, cap, -cap],
            "softcap {cap} limits"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// f16 storage

#[test]
fn f16_storage_rounds_to_nearest_even() {
    let mut rng = StdRng::seed_from_u64(7);
    // Normal, subnormal and overflowing magnitudes of f16; lengths around the 64-wide chunks.
    for &len in &[1usize, 63, 64, 65, 200] {
        let mut x = vec_varied(&mut rng, len, -8.0, 5.0);
        x[0] = 65_519.0; // rounds down to f16::MAX
        if len > 1 {
            x[1] = -65_520.0; // rounds to -inf
        }
        let mut bits = vec![0u16; len];
        ops::store_f16(&x, &mut bits);
        let mut rounded = x.clone();
        ops::round_to_f16(&mut rounded);
        for i in 0..len {
            let want = f16::from_f32(x[i]);
            assert_eq!(bits[i], want.to_bits(), "store_f16({})", x[i]);
            assert_eq!(
                rounded[i].to_bits(),
                want.to_f32().to_bits(),
                "round_to_f16({})",
                x[i]
            );
        }
        assert_eq!(f16::from_bits(bits[0]), f16::MAX);
        if len > 1 {
            assert_eq!(f16::from_bits(bits[1]), f16::NEG_INFINITY);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Attention

/// `softmax(q·Kᵀ · scale) · V` per head, in f64 on the f16 values the op reads.
fn attend_ref(
    q: &[f32],
    heads: usize,
    k: &[u16],
    v: &[u16],
    dv: usize,
    scale: f32,
    softcap: Option<f32>,
) -> Vec<f64> {
    let d = q.len() / heads;
    let n = k.len() / d;
    let kf: Vec<f64> = k.iter().map(|&b| f16::from_bits(b).to_f64()).collect();
    let vf: Vec<f64> = v.iter().map(|&b| f16::from_bits(b).to_f64()).collect();
    let mut out = vec![0.0f64; heads * dv];
    for h in 0..heads {
        let qh = &q[h * d..(h + 1) * d];
        let scores: Vec<f64> = (0..n)
            .map(|j| {
                let s = qh
                    .iter()
                    .zip(&kf[j * d..(j + 1) * d])
                    .map(|(&a, &b)| a as f64 * b)
                    .sum::<f64>()
                    * scale as f64;
                match softcap {
                    Some(c) => (s / c as f64).tanh() * c as f64,
                    None => s,
                }
            })
            .collect();
        let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let sum: f64 = p.iter().sum();
        for j in 0..n {
            for c in 0..dv {
                out[h * dv + c] += p[j] / sum * vf[j * dv + c];
            }
        }
    }
    out
}

fn f16_bits(x: &[f32]) -> Vec<u16> {
    x.iter().map(|&v| f16::from_f32(v).to_bits()).collect()
}

struct AttnCase {
    heads: usize,
    d: usize,
    dv: usize,
    n: usize,
    softcap: Option<f32>,
    /// Spread of the scores (about their standard deviation).
    spread: f32,
    /// Keys grow with position, so later tiles of the online softmax hold larger maxima and
    /// the running sums must be rescaled.
    ramp: bool,
}

fn check_attention(case: &AttnCase, rng: &mut StdRng, scratch: &mut Vec<f32>) {
    let AttnCase {
        heads,
        d,
        dv,
        n,
        softcap,
        spread,
        ramp,
    } = *case;
    let what = format!(
        "{heads} heads, d {d}, dv {dv}, {n} positions, softcap {softcap:?}, spread {spread}, ramp {ramp}"
    );
    // Queries and keys of unit size per element; `scale` sets the score spread.
    let q: Vec<f32> = (0..heads * d)
        .map(|_| rng.random_range(-1.7f32..1.7))
        .collect();
    let mut k: Vec<f32> = (0..n * d).map(|_| rng.random_range(-1.7f32..1.7)).collect();
    if ramp {
        for (j, row) in k.chunks_mut(d).enumerate() {
            let f = 0.2 + 2.0 * j as f32 / n as f32;
            row.iter_mut().for_each(|x| *x *= f);
        }
    }
    let v = vec_varied(rng, n * dv, -2.0, 1.0);
    let (k, v) = (f16_bits(&k), f16_bits(&v));
    let scale = spread / (d as f32).sqrt();
    let g = AttnGroup {
        q: &q,
        heads,
        k: &k,
        v: &v,
        scale,
        softcap,
    };
    let mut out = vec![f32::NAN; heads * dv];
    ops::attend_group(&g, &mut out, scratch);
    let want = attend_ref(&q, heads, &k, &v, dv, scale, softcap);
    // The output is a convex combination of value rows: errors in the probabilities (from
    // the f32 scores and exponentials, and the capped tanh's absolute error times the cap)
    // show up relative to the largest value of the head.
    let vmax: Vec<f64> = (0..dv)
        .map(|c| {
            (0..n)
                .map(|j| f16::from_bits(v[j * dv + c]).to_f64().abs())
                .fold(0.0, f64::max)
        })
        .collect();
    let score_err = 64.0 * EPS * (spread as f64 * 4.0 + softcap.map_or(0.0, |c| c as f64));
    assert_close(&what, &out, &want, |i, _| {
        (1e-5 + score_err) * vmax[i % dv] + 1e-30
    });
}

#[test]
fn attention_matches_softmax_reference() {
    let mut rng = StdRng::seed_from_u64(8);
    // One scratch for every call, as the backend keeps one per thread: stale contents from a
    // larger earlier call must not leak into a later one.
    let mut scratch = Vec::new();
    for &heads in &[1usize, 2, 4, 8] {
        for &d in &[64usize, 128, 256] {
            for &n in &[1usize, 31, 32, 33, 100, 700] {
                for softcap in [None, Some(50.0f32), Some(3.0)] {
                    let case = AttnCase {
                        heads,
                        d,
                        dv: d,
                        n,
                        softcap,
                        spread: 1.0,
                        ramp: false,
                    };
                    check_attention(&case, &mut rng, &mut scratch);
                }
            }
        }
    }
}

#[test]
fn attention_handles_peaked_and_growing_scores() {
    let mut rng = StdRng::seed_from_u64(9);
    let mut scratch = Vec::new();
    for &n in &[33usize, 100, 700] {
        for &(spread, ramp) in &[(8.0f32, false), (30.0, false), (2.0, true), (12.0, true)] {
            for softcap in [None, Some(30.0f32)] {
                let case = AttnCase {
                    heads: 4,
                    d: 128,
                    dv: 128,
                    n,
                    softcap,
                    spread,
                    ramp,
                };
                check_attention(&case, &mut rng, &mut scratch);
            }
        }
    }
}

#[test]
fn attention_with_narrower_values() {
    let mut rng = StdRng::seed_from_u64(10);
    let mut scratch = Vec::new();
    for &(d, dv) in &[(128usize, 64usize), (64, 128), (256, 32)] {
        for &n in &[1usize, 32, 65] {
            let case = AttnCase {
                heads: 2,
                d,
                dv,
                n,
                softcap: None,
                spread: 1.5,
                ramp: false,
            };
            check_attention(&case, &mut rng, &mut scratch);
        }
    }
}

#[test]
fn attention_over_an_empty_run_gives_zeros() {
    let mut rng = StdRng::seed_from_u64(11);
    let mut scratch = Vec::new();
    for &(heads, d) in &[(1usize, 64usize), (4, 128), (8, 256)] {
        // A non-empty call first leaves state in the scratch.
        let case = AttnCase {
            heads,
            d,
            dv: d,
            n: 40,
            softcap: None,
            spread: 1.0,
            ramp: false,
        };
        check_attention(&case, &mut rng, &mut scratch);
        let q = vec_varied(&mut rng, heads * d, -1.0, 1.0);
        for softcap in [None, Some(50.0)] {
            let g = AttnGroup {
                q: &q,
                heads,
                k: &[],
                v: &[],
                scale: 0.1,
                softcap,
            };
            let mut out = vec![f32::NAN; heads * d];
            ops::attend_group(&g, &mut out, &mut scratch);
            assert!(
                out.iter().all(|&x| x == 0.0),
                "{heads} heads of {d}: empty run gave {:?}",
                &out[..4]
            );
        }
    }
}

#[test]
fn attention_over_one_position_returns_its_value() {
    // softmax over a single score is 1 whatever the score, so the output is the value row.
    let mut rng = StdRng::seed_from_u64(12);
    let mut scratch = Vec::new();
    for &(heads, d) in &[(1usize, 64usize), (8, 128)] {
        let q = vec_varied(&mut rng, heads * d, -1.0, 2.0);
        let k = f16_bits(&vec_varied(&mut rng, d, -1.0, 2.0));
        let v = f16_bits(&vec_varied(&mut rng, d, -3.0, 3.0));
        let g = AttnGroup {
            q: &q,
            heads,
            k: &k,
            v: &v,
            scale: 1.0,
            softcap: None,
        };
        let mut out = vec![f32::NAN; heads * d];
        ops::attend_group(&g, &mut out, &mut scratch);
        for h in 0..heads {
            for c in 0..d {
                assert_eq!(
                    out[h * d + c],
                    f16::from_bits(v[c]).to_f32(),
                    "head {h} dim {c}"
                );
            }
        }
    }
}
