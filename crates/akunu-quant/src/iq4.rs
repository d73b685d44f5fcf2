//! The 4-bit non-linear formats IQ4_NL and IQ4_XS: each nibble indexes [`KVALUES_IQ4NL`], a
//! fixed table denser near zero, times a scale.
//!
//! Both quantizers are ggml's search without an importance matrix, as `ggml_quantize_chunk` (and
//! so llama-quantize) runs it: per 32 elements, start from the scale that maps the signed extreme
//! to ±127, then try 15 scales around it and keep the best `x²`-weighted least-squares fit.

use crate::blocks::{BlockIQ4_NL, BlockIQ4_XS, F16Le, U16Le, QK32, QK_K};
use crate::search::{best_index_int8, nearest_int, GROUP_MAX_EPS};

/// The 16 levels of the non-linear 4-bit formats (ggml's `kvalues_iq4nl`).
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Trial scales on each side of the first guess (ggml's `ntry` for these formats).
const NTRY: i32 = 7;

/// The best scale for 32 values. Returns 0 for an all-(near-)zero group.
fn best_scale(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let v0 = f32::from(KVALUES_IQ4NL[0]);
    // Weighted sums of q·x and q² for the levels chosen with inverse scale `id`.
    let fit = |id: f32| {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for &v in x {
            let q = f32::from(KVALUES_IQ4NL[best_index_int8(&KVALUES_IQ4NL, id * v)]);
            let w = v * v;
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let d = -max / v0;
    let (sumqx, sumq2) = fit(1.0 / d);
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        let (sumqx, sumq2) = fit((itry + i32::from(KVALUES_IQ4NL[0])) as f32 / max);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Nibble indices of `x` under inverse scale `id`, packed as in Q4_0 (element `j` low, `j + 16`
/// high).
fn pack_levels(x: &[f32], id: f32) -> [u8; QK32 / 2] {
    let level = |v: f32| best_index_int8(&KVALUES_IQ4NL, id * v) as u8;
    std::array::from_fn(|j| level(x[j]) | (level(x[j + 16]) << 4))
}

fn dequantize_32(d: f32, qs: &[u8], y: &mut [f32]) {
    for j in 0..16 {
        y[j] = d * f32::from(KVALUES_IQ4NL[usize::from(qs[j] & 0xF)]);
        y[j + 16] = d * f32::from(KVALUES_IQ4NL[usize::from(qs[j] >> 4)]);
    }
}

impl BlockIQ4_NL {
    /// `y[j] = d·KVALUES_IQ4NL[q[j]]`.
    pub fn dequantize(&self, y: &mut [f32; QK32]) {
        dequantize_32(self.d.to_f32(), &self.qs, y);
    }

    /// The best scale is stored directly and the levels are chosen again against it (unrounded).
    pub fn quantize(x: &[f32; QK32]) -> Self {
        let d = best_scale(x);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        Self {
            d: F16Le::from_f32(d),
            qs: pack_levels(x, id),
        }
    }
}

impl BlockIQ4_XS {
    /// The 6-bit scale of sub-block `ib` (0..8), before the −32 offset.
    pub fn sub_scale(&self, ib: usize) -> i32 {
        let low = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
        let high = (self.scales_h.get() >> (2 * ib)) & 3;
        i32::from(low) | (i32::from(high) << 4)
    }

    /// `y = d·(s − 32)·KVALUES_IQ4NL[q]` per 32-element sub-block.
    pub fn dequantize(&self, y: &mut [f32; QK_K]) {
        let d = self.d.to_f32();
        for (ib, (ys, qs)) in y
            .chunks_exact_mut(32)
            .zip(self.qs.chunks_exact(16))
            .enumerate()
        {
            dequantize_32(d * (self.sub_scale(ib) - 32) as f32, qs, ys);
        }
    }

    /// Best scale per sub-block, then 6-bit signed sub-scales against `d = max / −32` and the
    /// levels chosen again against `d·l` (with the unrounded `d`).
    pub fn quantize(x: &[f32; QK_K]) -> Self {
        let mut scales = [0.0f32; 8];
        let (mut amax_scale, mut max_scale) = (0.0f32, 0.0f32);
        for (s, xs) in scales.iter_mut().zip(x.chunks_exact(32)) {
            *s = best_scale(xs);
            if s.abs() > amax_scale {
                amax_scale = s.abs();
                max_scale = *s;
            }
        }

        let d = -max_scale / 32.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut block = Self {
            d: F16Le::from_f32(d),
            scales_h: U16Le::new(0),
            scales_l: [0; 4],
            qs: [0; QK_K / 2],
        };
        let mut scales_h = 0u16;
        for (ib, (&s, xs)) in scales.iter().zip(x.chunks_exact(32)).enumerate() {
            let l = nearest_int(id * s).clamp(-32, 31);
            let dl = d * l as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            block.qs[16 * ib..16 * ib + 16].copy_from_slice(&pack_levels(xs, idl));
            let l = (l + 32) as u8;
            block.scales_l[ib / 2] |= (l & 0xF) << (4 * (ib % 2));
            scales_h |= u16::from(l >> 4) << (2 * ib);
        }
        block.scales_h = U16Le::new(scales_h);
        block
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iq4_nl_table_lookup() {
        let mut b = BlockIQ4_NL {
            d: F16Le::from_f32(0.5),
            qs: [0x88; 16],
        };
        b.qs[1] = 0xF0;
        let mut y = [0.0; QK32];
        b.dequantize(&mut y);
        assert_eq!(y[1], -63.5);
        assert_eq!(y[17], 56.5);
        assert_eq!(y[0], 0.5);
    }

    #[test]
    fn iq4_xs_sub_scales() {
        let mut b = BlockIQ4_XS {
            d: F16Le::from_f32(0.25),
            scales_h: U16Le::new(0b10 << 6),
            scales_l: [0, 0x70, 0, 0],
            qs: [0x99; QK_K / 2],
        };
        assert_eq!(b.sub_scale(3), 0b10_0111); // 39
        assert_eq!(b.sub_scale(2), 0);
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        assert_eq!(y[96], 0.25 * 7.0 * 13.0);
        assert_eq!(y[0], 0.25 * -32.0 * 13.0);
        b.scales_l[1] = 0;
        b.dequantize(&mut y);
        assert_eq!(y[96], 0.25 * 0.0 * 13.0);
    }

    #[test]
    fn iq4_nl_zero_block_uses_level_closest_to_zero() {
        let b = BlockIQ4_NL::quantize(&[0.0; QK32]);
        assert_eq!(b.d.to_f32(), 0.0);
        assert_eq!(b.qs, [0x88; 16]);
    }
}
