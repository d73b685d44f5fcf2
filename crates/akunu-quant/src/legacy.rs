//! The 32-element formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.
//!
//! Every format stores element `j` and element `j + 16` in the low and high nibble of byte `j`
//! (the 8-bit ones store bytes in order). Quantizers follow ggml's `quantize_row_*_ref`.

use crate::blocks::{
    BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, F16Le, QK32,
};

const HALF: usize = QK32 / 2;

/// The element of largest magnitude, with its sign (the first one on ties).
fn signed_absmax(x: &[f32; QK32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32; QK32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn inverse_or_zero(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// Splits a 5-bit value table into low nibbles (as Q4 bytes) and the fifth bits (as `qh`).
fn pack5(q: &[u8; QK32]) -> ([u8; HALF], [u8; 4]) {
    let mut qs = [0u8; HALF];
    let mut qh = 0u32;
    for j in 0..HALF {
        qs[j] = (q[j] & 0x0F) | ((q[j + HALF] & 0x0F) << 4);
        qh |= u32::from(q[j] >> 4 & 1) << j;
        qh |= u32::from(q[j + HALF] >> 4 & 1) << (j + HALF);
    }
    (qs, qh.to_le_bytes())
}

/// The 5-bit values of elements `j` and `j + 16` of a Q5 block.
fn unpack5(qs: &[u8; HALF], qh: [u8; 4], j: usize) -> (i32, i32) {
    let qh = u32::from_le_bytes(qh);
    let lo = i32::from(qs[j] & 0x0F) | (((qh >> j) & 1) << 4) as i32;
    let hi = i32::from(qs[j] >> 4) | (((qh >> (j + HALF)) & 1) << 4) as i32;
    (lo, hi)
}

impl BlockQ4_0 {
    /// `y[j] = d·(q[j] − 8)`.
    pub fn dequantize(&self, y: &mut [f32; QK32]) {
        let d = self.d.to_f32();
        for j in 0..HALF {
            y[j] = ((self.qs[j] & 0x0F) as i32 - 8) as f32 * d;
            y[j + HALF] = ((self.qs[j] >> 4) as i32 - 8) as f32 * d;
        }
    }

    /// ggml's reference: the signed extreme maps to level 0 (`d = max / −8`) and the opposite
    /// side is clamped at level 15; levels are truncated after adding 8.5, i.e. rounded half up.
    pub fn quantize(x: &[f32; QK32]) -> Self {
        let d = signed_absmax(x) / -8.0;
        let id = inverse_or_zero(d);
        let level = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
        let mut qs = [0u8; HALF];
        for j in 0..HALF {
            qs[j] = level(x[j]) | (level(x[j + HALF]) << 4);
        }
        Self {
            d: F16Le::from_f32(d),
            qs,
        }
    }
}

impl BlockQ4_1 {
    /// `y[j] = d·q[j] + m`.
    pub fn dequantize(&self, y: &mut [f32; QK32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for j in 0..HALF {
            y[j] = (self.qs[j] & 0x0F) as f32 * d + m;
            y[j + HALF] = (self.qs[j] >> 4) as f32 * d + m;
        }
    }

    /// ggml's reference: `m = min`, `d = (max − min) / 15`, levels rounded half up.
    pub fn quantize(x: &[f32; QK32]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = inverse_or_zero(d);
        let level = |v: f32| (((v - min) * id + 0.5) as i8).min(15) as u8;
        let mut qs = [0u8; HALF];
        for j in 0..HALF {
            qs[j] = level(x[j]) | (level(x[j + HALF]) << 4);
        }
        Self {
            d: F16Le::from_f32(d),
            m: F16Le::from_f32(min),
            qs,
        }
    }
}

impl BlockQ5_0 {
    /// `y[j] = d·(q[j] − 16)`.
    pub fn dequantize(&self, y: &mut [f32; QK32]) {
        let d = self.d.to_f32();
        for j in 0..HALF {
            let (lo, hi) = unpack5(&self.qs, self.qh, j);
            y[j] = (lo - 16) as f32 * d;
            y[j + HALF] = (hi - 16) as f32 * d;
        }
    }

    /// ggml's reference: as Q4_0 with `d = max / −16` and 32 levels.
    pub fn quantize(x: &[f32; QK32]) -> Self {
        let d = signed_absmax(x) / -16.0;
        let id = inverse_or_zero(d);
        let q = x.map(|v| ((v * id + 16.5) as i8).min(31) as u8);
        let (qs, qh) = pack5(&q);
        Self {
            d: F16Le::from_f32(d),
            qh,
            qs,
        }
    }
}

impl BlockQ5_1 {
    /// `y[j] = d·q[j] + m`.
    pub fn dequantize(&self, y: &mut [f32; QK32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for j in 0..HALF {
            let (lo, hi) = unpack5(&self.qs, self.qh, j);
            y[j] = lo as f32 * d + m;
            y[j + HALF] = hi as f32 * d + m;
        }
    }

    /// ggml's reference: as Q4_1 with `d = (max − min) / 31`. ggml does not clamp the level
    /// here; `(x − min)·id + 0.5` stays below 32 for finite inputs, and the bits above the fifth
    /// are dropped by the packing either way.
    pub fn quantize(x: &[f32; QK32]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = inverse_or_zero(d);
        let q = x.map(|v| ((v - min) * id + 0.5) as u8);
        let (qs, qh) = pack5(&q);
        Self {
            d: F16Le::from_f32(d),
            m: F16Le::from_f32(min),
            qh,
            qs,
        }
    }
}

/// Symmetric 8-bit levels: `d = amax / 127`, `q = round(x / d)` (half away from zero).
fn quantize_q8(x: &[f32; QK32]) -> (f32, [i8; QK32]) {
    let amax = x
        .iter()
        .fold(0.0f32, |a, v| if a > v.abs() { a } else { v.abs() });
    let d = amax / 127.0;
    let id = inverse_or_zero(d);
    (d, x.map(|v| (v * id).round() as i8))
}

impl BlockQ8_0 {
    /// `y[j] = d·q[j]`.
    pub fn dequantize(&self, y: &mut [f32; QK32]) {
        let d = self.d.to_f32();
        for (y, &q) in y.iter_mut().zip(&self.qs) {
            *y = f32::from(q) * d;
        }
    }

    /// ggml's reference: `d = amax / 127`, levels rounded half away from zero.
    pub fn quantize(x: &[f32; QK32]) -> Self {
        let (d, qs) = quantize_q8(x);
        Self {
            d: F16Le::from_f32(d),
            qs,
        }
    }
}

impl BlockQ8_1 {
    /// `y[j] = d·q[j]`; `s` only serves dot products.
    pub fn dequantize(&self, y: &mut [f32; QK32]) {
        let d = self.d.to_f32();
        for (y, &q) in y.iter_mut().zip(&self.qs) {
            *y = f32::from(q) * d;
        }
    }

    /// ggml's reference: Q8_0's levels, plus `s = Σq · d` with the unrounded `d`.
    pub fn quantize(x: &[f32; QK32]) -> Self {
        let (d, qs) = quantize_q8(x);
        let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
        Self {
            d: F16Le::from_f32(d),
            s: F16Le::from_f32(sum as f32 * d),
            qs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_nibble_order_and_offset() {
        let mut b = BlockQ4_0 {
            d: F16Le::from_f32(0.5),
            qs: [0x88; HALF],
        };
        b.qs[0] = 0xA3;
        let mut y = [0.0; QK32];
        b.dequantize(&mut y);
        assert_eq!(y[0], -2.5); // low nibble 3: (3 − 8)·0.5
        assert_eq!(y[16], 1.0); // high nibble 10: (10 − 8)·0.5
        assert_eq!(y[1], 0.0);
    }

    #[test]
    fn q4_0_quantize_maps_signed_extreme_to_level_zero() {
        let mut x = [0.0f32; QK32];
        x[3] = -4.0;
        x[20] = 3.0;
        x[5] = 1.2;
        let b = BlockQ4_0::quantize(&x);
        assert_eq!(b.d.to_f32(), 0.5);
        assert_eq!(b.qs[3] & 0xF, 0); // −4 / 0.5 + 8 = 0
        assert_eq!(b.qs[4] >> 4, 14); // element 20: 3 / 0.5 + 8
        assert_eq!(b.qs[5] & 0xF, 10); // 1.2 / 0.5 + 8.5 = 10.9, truncated
        assert_eq!(b.qs[0], 0x88);
    }

    #[test]
    fn q5_0_high_bits_come_from_qh() {
        let mut b = BlockQ5_0 {
            d: F16Le::from_f32(1.0),
            qh: [0; 4],
            qs: [0; HALF],
        };
        b.qs[2] = 0x5F; // element 2: low 15, element 18: low 5
        b.qh = (1u32 << 2 | 1u32 << 18 | 1u32 << 31).to_le_bytes();
        let mut y = [0.0; QK32];
        b.dequantize(&mut y);
        assert_eq!(y[2], 15.0); // 31 − 16
        assert_eq!(y[18], 5.0); // 21 − 16
        assert_eq!(y[31], 0.0); // 16 − 16
        assert_eq!(y[15], -16.0);
    }

    #[test]
    fn q5_1_and_q4_1_add_the_min() {
        let b = BlockQ5_1 {
            d: F16Le::from_f32(0.25),
            m: F16Le::from_f32(-1.0),
            qh: 1u32.to_le_bytes(),
            qs: [0x21; HALF],
        };
        let mut y = [0.0; QK32];
        b.dequantize(&mut y);
        assert_eq!(y[0], 17.0 * 0.25 - 1.0);
        assert_eq!(y[1], 0.25 - 1.0);
        assert_eq!(y[16], 0.5 - 1.0);
        let b = BlockQ4_1 {
            d: F16Le::from_f32(2.0),
            m: F16Le::from_f32(3.0),
            qs: [0xF0; HALF],
        };
        b.dequantize(&mut y);
        assert_eq!((y[0], y[16]), (3.0, 33.0));
    }

    #[test]
    fn q8_1_sum_uses_levels() {
        let mut x = [0.0f32; QK32];
        x[0] = 127.0;
        x[1] = -63.6;
        x[2] = 0.5; // rounds away from zero to 1
        let b = BlockQ8_1::quantize(&x);
        assert_eq!(b.d.to_f32(), 1.0);
        assert_eq!(&b.qs[..3], &[127, -64, 1]);
        assert_eq!(b.s.to_f32(), 64.0);
    }
}
