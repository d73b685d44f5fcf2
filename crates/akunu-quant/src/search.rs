//! The scale searches shared by ggml's reference quantizers.
//!
//! Each routine follows ggml's arithmetic operation for operation: the same `f32` products and
//! sums in the same order (integers converted to `f32` where C promotes them, no fused
//! multiply-adds), because a different rounding anywhere can flip a comparison and change the
//! bytes written. Only the variants ggml's reference quantizers call are provided.

/// Below this a group's largest magnitude counts as zero (ggml's `GROUP_MAX_EPS`).
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// Round to nearest, ties to even, for `|x| < 2^22`: adding 1.5·2^23 leaves the rounded integer
/// in the low mantissa bits. Out-of-range inputs give an arbitrary value, never a panic.
pub(crate) fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Index of the entry of the ascending table `values` closest to `x`; ties go to the higher
/// entry.
pub(crate) fn best_index_int8(values: &[i8; 16], x: f32) -> usize {
    let n = values.len();
    if x <= f32::from(values[0]) {
        return 0;
    }
    if x >= f32::from(values[n - 1]) {
        return n - 1;
    }
    let (mut lo, mut hi) = (0, n - 1);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < f32::from(values[mid]) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - f32::from(values[hi - 1]) < f32::from(values[hi]) - x {
        hi - 1
    } else {
        hi
    }
}

/// The element of largest magnitude (the first one on ties) and that magnitude.
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// Symmetric quantization of `x` to `l ∈ [−nmax, nmax)` minimising the error weighted by `x²`
/// (ggml's `make_qx_quants` with `rmse_type = 1` and no importance weights). Starts from the scale
/// mapping the largest magnitude to `−nmax`, then tries 18 nearby scales and keeps the best by
/// least squares. Writes `l + nmax` into `out` and returns the scale.
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], out: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        out.fill(0);
        return 0.0;
    }
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let l = quant(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };

    let mut iscale = -(nmax as f32) / max;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (quant(iscale, v) + nmax) as i8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = (quant(iscale, v) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Symmetric quantization to `l ∈ [−nmax, nmax)` for Q3_K (ggml's `make_q3_quants` with
/// `do_rmse`): start from the max-magnitude scale, then up to five sweeps that move single values
/// to the level that lowers the `x²`-weighted error of the least-squares fit. Writes `l + nmax`
/// into `out` and returns the fitted scale.
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], out: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        out.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (o, &v) in out.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *o = l as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (o, &v) in out.iter_mut().zip(x) {
            let w = v * v;
            let old = f32::from(*o);
            let mut slx = sumlx - w * v * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != i32::from(*o) {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *o = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for o in out.iter_mut() {
        *o += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Settings of the affine scale search [`make_qkx2_quants`].
pub(crate) struct Qkx2 {
    /// Largest quantized level (levels are `0..=nmax`).
    pub nmax: i32,
    /// Offset of the first trial scale, in levels.
    pub rmin: f32,
    /// Step between trial scales, in levels.
    pub rdelta: f32,
    /// Number of steps after the first trial (so `nstep + 1` trials).
    pub nstep: i32,
    /// Minimise weighted absolute error instead of weighted squared error.
    pub use_mad: bool,
}

/// Affine quantization `x ≈ scale·l − min_out` with `l ∈ [0, nmax]` and `min_out ≥ 0` (ggml's
/// `make_qkx2_quants`): starts from the min/max mapping, then for each trial scale fits scale and
/// offset by weighted least squares and keeps the fit with the lowest weighted error. Writes the
/// levels into `out` and returns `(scale, min_out)`.
pub(crate) fn make_qkx2_quants(p: &Qkx2, x: &[f32], weights: &[f32], out: &mut [u8]) -> (f32, f32) {
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for (&v, &w) in x.iter().zip(weights).skip(1) {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
        sum_w += w;
        sum_x += w * v;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        out.fill(0);
        return (0.0, -min);
    }
    let nmax = p.nmax;
    let level =
        |iscale: f32, v: f32, min: f32| nearest_int(iscale * (v - min)).clamp(0, nmax) as u8;
    let error = |scale: f32, min: f32, levels: &[u8]| {
        let mut err = 0.0f32;
        for ((&l, &v), &w) in levels.iter().zip(x).zip(weights) {
            let diff = scale * f32::from(l) + min - v;
            err += w * if p.use_mad { diff.abs() } else { diff * diff };
        }
        err
    };

    let iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = level(iscale, v, min);
    }
    let mut best_error = error(scale, min, out);

    let n = x.len();
    let mut aux = [0u8; 32];
    let aux = &mut aux[..n];
    for is in 0..=p.nstep {
        let iscale = (p.rmin + p.rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for ((a, &v), &w) in aux.iter_mut().zip(x).zip(weights) {
            *a = level(iscale, v, min);
            let l = f32::from(*a);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let cur_error = error(this_scale, this_min, aux);
            if cur_error < best_error {
                out.copy_from_slice(aux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        let cases = [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (2.4999, 2),
            (-7.6, -8),
        ];
        for (x, want) in cases {
            assert_eq!(nearest_int(x), want, "nearest_int({x})");
        }
        assert_eq!(nearest_int(4_194_303.0), 4_194_303);
        // Garbage in, garbage out, but no panic.
        let _ = nearest_int(f32::NAN) + nearest_int(f32::INFINITY) + nearest_int(-1e30);
    }

    #[test]
    fn best_index_picks_closest_level() {
        let v: [i8; 16] = [
            -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
        ];
        assert_eq!(best_index_int8(&v, -500.0), 0);
        assert_eq!(best_index_int8(&v, 500.0), 15);
        assert_eq!(best_index_int8(&v, 0.0), 8); // 1 is closer than -10
        assert_eq!(best_index_int8(&v, -4.5), 8); // equidistant from -10 and 1: the higher wins
        assert_eq!(best_index_int8(&v, -4.6), 7);
        assert_eq!(best_index_int8(&v, 100.0), 14);
        assert_eq!(best_index_int8(&v, f32::NAN), 15);
    }

    #[test]
    fn qx_quants_scale_reconstructs_input() {
        let x: Vec<f32> = (0..16)
            .map(|i| ((i * 7 % 16) as f32 - 7.3) * 0.01)
            .collect();
        let mut l = [0i8; 16];
        let scale = make_qx_quants(32, &x, &mut l);
        assert!(l.iter().all(|&q| (0..64).contains(&q)));
        for (&v, &q) in x.iter().zip(&l) {
            assert!((scale * f32::from(q - 32) - v).abs() <= scale.abs() * 0.5 + 1e-7);
        }
    }

    #[test]
    fn qkx2_quants_fits_offset_data() {
        let x: Vec<f32> = (0..32)
            .map(|i| 1.0 + 0.1 * (i as f32 * 1.7).sin())
            .collect();
        let w: Vec<f32> = x.iter().map(|v| v.abs()).collect();
        let mut l = [0u8; 32];
        let p = Qkx2 {
            nmax: 15,
            rmin: -1.0,
            rdelta: 0.1,
            nstep: 20,
            use_mad: false,
        };
        let (scale, min) = make_qkx2_quants(&p, &x, &w, &mut l);
        // All values are positive: the search starts from a zero offset, and a positive fitted
        // offset (a negative `min`) is clamped to zero, so `min` comes back non-negative.
        assert!(min >= 0.0 && scale > 0.0);
        assert!(l.iter().all(|&q| q <= 15) && l.iter().any(|&q| q != l[0]));
        for (&v, &q) in x.iter().zip(&l) {
            assert!(
                (scale * f32::from(q) - min - v).abs() <= 0.5 * scale,
                "{v} vs {q}·{scale}"
            );
        }
    }
}
