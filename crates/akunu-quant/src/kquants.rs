//! The k-quants: 256-element super-blocks with quantized per-sub-block scales (Q2_K to Q6_K),
//! and Q8_K, ggml's 8-bit intermediate for their dot products.
//!
//! Quantizers follow ggml's `quantize_row_*_ref`: fit each sub-block with a scale search from
//! [`crate::search`], quantize the sub-block scales against one `f16` super-scale, then
//! requantize every element against its now-rounded scale (sub-blocks whose rounded scale is
//! zero keep the levels of the search).

use crate::blocks::{
    scale_min_k4, BlockQ2_K, BlockQ3_K, BlockQ4_K, BlockQ5_K, BlockQ6_K, BlockQ8_K, F16Le, F32Le,
    I16Le, QK_K,
};
use crate::search::{
    make_q3_quants, make_qkx2_quants, make_qx_quants, nearest_int, Qkx2, GROUP_MAX_EPS,
};

/// Packs 2-bit levels: byte `l` of each 32-byte group holds elements `l`, `l + 32`, `l + 64` and
/// `l + 96` of its 128 elements, from the low bits up (Q2_K, and the low bits of Q3_K).
fn pack_2bit(levels: &[u8; QK_K]) -> [u8; QK_K / 4] {
    let mut qs = [0u8; QK_K / 4];
    for (half, out) in levels.chunks_exact(128).zip(qs.chunks_exact_mut(32)) {
        for l in 0..32 {
            out[l] = half[l] | (half[l + 32] << 2) | (half[l + 64] << 4) | (half[l + 96] << 6);
        }
    }
    qs
}

/// The 2-bit level of element `i` (0..256) as packed by [`pack_2bit`].
fn level_2bit(qs: &[u8; QK_K / 4], i: usize) -> u8 {
    (qs[i / 128 * 32 + i % 32] >> (2 * (i % 128 / 32))) & 3
}

/// The 6-bit scale of sub-block `j` (0..16) of a Q3_K block, before the −32 offset: low four bits
/// in the nibbles of bytes 0..8, the top two bits in bytes 8..12.
fn q3_k_scale(scales: &[u8; 12], j: usize) -> i32 {
    let low = if j < 8 {
        scales[j] & 0xF
    } else {
        scales[j - 8] >> 4
    };
    let high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    i32::from(low | (high << 4))
}

/// Packs eight 6-bit (scale, min) pairs the way [`scale_min_k4`] reads them.
fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
    s
}

/// The Q4_K/Q5_K recipe shared by both: an affine fit per 32-element sub-block weighted by
/// `rms + |x|`, 6-bit scales and mins against `max/63`, then every element requantized to
/// `0..=nmax`. Returns `(d, dmin, packed scales, levels)`.
fn quantize_k4_like(x: &[f32; QK_K], search: &Qkx2) -> (F16Le, F16Le, [u8; 12], [u8; QK_K]) {
    let mut levels = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for (j, (xs, ls)) in x
        .chunks_exact(32)
        .zip(levels.chunks_exact_mut(32))
        .enumerate()
    {
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let mut weights = [0.0f32; 32];
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        (scales[j], mins[j]) = make_qkx2_quants(search, xs, &weights, ls);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }

    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    // ggml stores the rounded value in a byte before clamping to 63.
    let ls = scales.map(|s| (nearest_int(inv_scale * s) as u8).min(63));
    let lm = mins.map(|m| (nearest_int(inv_min * m) as u8).min(63));
    let packed = pack_scale_min_k4(&ls, &lm);
    let d = F16Le::from_f32(max_scale / 63.0);
    let dmin = F16Le::from_f32(max_min / 63.0);

    let nmax = search.nmax;
    for (j, (xs, ls)) in x
        .chunks_exact(32)
        .zip(levels.chunks_exact_mut(32))
        .enumerate()
    {
        let (sc, m) = scale_min_k4(j, &packed);
        let d = d.to_f32() * f32::from(sc);
        if d == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * f32::from(m);
        for (l, &v) in ls.iter_mut().zip(xs) {
            *l = nearest_int((v + dm) / d).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, packed, levels)
}

impl BlockQ2_K {
    /// `y = d·(sc & 15)·q − dmin·(sc >> 4)` per 16-element sub-block.
    pub fn dequantize(&self, y: &mut [f32; QK_K]) {
        let (d, min) = (self.d.to_f32(), self.dmin.to_f32());
        for (j, ys) in y.chunks_exact_mut(16).enumerate() {
            let sc = self.scales[j];
            let dl = d * f32::from(sc & 0xF);
            let ml = min * f32::from(sc >> 4);
            for (k, y) in ys.iter_mut().enumerate() {
                *y = dl * f32::from(level_2bit(&self.qs, 16 * j + k)) - ml;
            }
        }
    }

    /// ggml's reference: an affine fit per sub-block minimising `|x|`-weighted absolute error,
    /// 4-bit scales and mins against `max/15`, then levels requantized to `0..=3`.
    pub fn quantize(x: &[f32; QK_K]) -> Self {
        const Q4SCALE: f32 = 15.0;
        let search = Qkx2 {
            nmax: 3,
            rmin: -0.5,
            rdelta: 0.1,
            nstep: 15,
            use_mad: true,
        };
        let mut levels = [0u8; QK_K];
        let mut scales = [0.0f32; 16];
        let mut mins = [0.0f32; 16];
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        for (j, (xs, ls)) in x
            .chunks_exact(16)
            .zip(levels.chunks_exact_mut(16))
            .enumerate()
        {
            let weights: [f32; 16] = std::array::from_fn(|l| xs[l].abs());
            (scales[j], mins[j]) = make_qkx2_quants(&search, xs, &weights, ls);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }

        let mut sc = [0u8; 16];
        let mut d = F16Le::from_f32(0.0);
        let mut dmin = F16Le::from_f32(0.0);
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for (b, &s) in sc.iter_mut().zip(&scales) {
                *b = nearest_int(iscale * s) as u8;
            }
            d = F16Le::from_f32(max_scale / Q4SCALE);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for (b, &m) in sc.iter_mut().zip(&mins) {
                *b |= (nearest_int(iscale * m) << 4) as u8;
            }
            dmin = F16Le::from_f32(max_min / Q4SCALE);
        }

        for (j, (xs, ls)) in x
            .chunks_exact(16)
            .zip(levels.chunks_exact_mut(16))
            .enumerate()
        {
            let dl = d.to_f32() * f32::from(sc[j] & 0xF);
            if dl == 0.0 {
                continue;
            }
            let dm = dmin.to_f32() * f32::from(sc[j] >> 4);
            for (l, &v) in ls.iter_mut().zip(xs) {
                *l = nearest_int((v + dm) / dl).clamp(0, 3) as u8;
            }
        }
        Self {
            scales: sc,
            qs: pack_2bit(&levels),
            d,
            dmin,
        }
    }
}

impl BlockQ3_K {
    /// `y = d·(s − 32)·(q − 4)` per 16-element sub-block, where the hmask bit set means the high
    /// bit of `q` is 1 (no −4).
    pub fn dequantize(&self, y: &mut [f32; QK_K]) {
        let d = self.d.to_f32();
        for (j, ys) in y.chunks_exact_mut(16).enumerate() {
            let dl = d * (q3_k_scale(&self.scales, j) - 32) as f32;
            for (k, y) in ys.iter_mut().enumerate() {
                let i = 16 * j + k;
                let high = self.hmask[i % 32] >> (i / 32) & 1;
                let q = i32::from(level_2bit(&self.qs, i)) - if high == 1 { 0 } else { 4 };
                *y = dl * q as f32;
            }
        }
    }

    /// ggml's `quantize_row_q3_K_ref`: a symmetric fit per sub-block refined by moving single
    /// levels (`make_q3_quants`), 6-bit signed scales against `max/−32`, then levels requantized
    /// to `−4..=3`.
    pub fn quantize(x: &[f32; QK_K]) -> Self {
        let mut levels = [0i8; QK_K];
        let (scales, max_scale) =
            fit_sub_blocks(x, &mut levels, |xs, ls| make_q3_quants(4, xs, ls));

        let mut sc = [0u8; 12];
        let mut d = F16Le::from_f32(0.0);
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for (j, &s) in scales.iter().enumerate() {
                // ggml narrows to a signed byte before clamping.
                let l = (i32::from(nearest_int(iscale * s) as i8).clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    sc[j] = l & 0xF;
                } else {
                    sc[j - 8] |= (l & 0xF) << 4;
                }
                sc[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
            }
            d = F16Le::from_f32(1.0 / iscale);
        }

        for (j, (xs, ls)) in x
            .chunks_exact(16)
            .zip(levels.chunks_exact_mut(16))
            .enumerate()
        {
            let dl = d.to_f32() * (q3_k_scale(&sc, j) - 32) as f32;
            if dl == 0.0 {
                continue;
            }
            for (l, &v) in ls.iter_mut().zip(xs) {
                *l = (nearest_int(v / dl).clamp(-4, 3) + 4) as i8;
            }
        }

        // Levels 4..8 set the high bit and keep the low two bits.
        let mut hmask = [0u8; QK_K / 8];
        let mut low = [0u8; QK_K];
        for (i, (&l, lo)) in levels.iter().zip(low.iter_mut()).enumerate() {
            let mut l = l as u8;
            if l > 3 {
                hmask[i % 32] |= 1 << (i / 32);
                l -= 4;
            }
            *lo = l;
        }
        Self {
            hmask,
            qs: pack_2bit(&low),
            scales: sc,
            d,
        }
    }
}

impl BlockQ4_K {
    /// `y = d·sc·q − dmin·m` per 32-element sub-block (`sc`, `m` from [`scale_min_k4`]).
    pub fn dequantize(&self, y: &mut [f32; QK_K]) {
        let (d, min) = (self.d.to_f32(), self.dmin.to_f32());
        for (c, (ys, qs)) in y
            .chunks_exact_mut(64)
            .zip(self.qs.chunks_exact(32))
            .enumerate()
        {
            let [(d1, m1), (d2, m2)] = chunk_scales(d, min, &self.scales, c);
            let (lo, hi) = ys.split_at_mut(32);
            for l in 0..32 {
                lo[l] = d1 * f32::from(qs[l] & 0xF) - m1;
                hi[l] = d2 * f32::from(qs[l] >> 4) - m2;
            }
        }
    }

    /// ggml's `quantize_row_q4_K_ref`: per sub-block an affine fit weighted by `rms + |x|` over
    /// 21 trial scales, 6-bit scales and mins against `max/63`, then levels requantized to
    /// `0..=15`.
    pub fn quantize(x: &[f32; QK_K]) -> Self {
        let search = Qkx2 {
            nmax: 15,
            rmin: -1.0,
            rdelta: 0.1,
            nstep: 20,
            use_mad: false,
        };
        let (d, dmin, scales, levels) = quantize_k4_like(x, &search);
        let mut qs = [0u8; QK_K / 2];
        for (ls, out) in levels.chunks_exact(64).zip(qs.chunks_exact_mut(32)) {
            for l in 0..32 {
                out[l] = ls[l] | (ls[l + 32] << 4);
            }
        }
        Self {
            d,
            dmin,
            scales,
            qs,
        }
    }
}

impl BlockQ5_K {
    /// As Q4_K with a fifth bit (+16) per element from `qh`.
    pub fn dequantize(&self, y: &mut [f32; QK_K]) {
        let (d, min) = (self.d.to_f32(), self.dmin.to_f32());
        for (c, (ys, qs)) in y
            .chunks_exact_mut(64)
            .zip(self.qs.chunks_exact(32))
            .enumerate()
        {
            let [(d1, m1), (d2, m2)] = chunk_scales(d, min, &self.scales, c);
            let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
            let (lo, hi) = ys.split_at_mut(32);
            for l in 0..32 {
                let h1 = if self.qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if self.qh[l] & u2 != 0 { 16 } else { 0 };
                lo[l] = d1 * f32::from((qs[l] & 0xF) + h1) - m1;
                hi[l] = d2 * f32::from((qs[l] >> 4) + h2) - m2;
            }
        }
    }

    /// ggml's `quantize_row_q5_K_ref`: as Q4_K with 16 trial scales and levels `0..=31`.
    pub fn quantize(x: &[f32; QK_K]) -> Self {
        let search = Qkx2 {
            nmax: 31,
            rmin: -0.5,
            rdelta: 0.1,
            nstep: 15,
            use_mad: false,
        };
        let (d, dmin, scales, levels) = quantize_k4_like(x, &search);
        let mut qh = [0u8; QK_K / 8];
        let mut qs = [0u8; QK_K / 2];
        for (c, (ls, out)) in levels
            .chunks_exact(64)
            .zip(qs.chunks_exact_mut(32))
            .enumerate()
        {
            for j in 0..32 {
                let (l1, l2) = (ls[j], ls[j + 32]);
                qh[j] |= (l1 >> 4) << (2 * c) | (l2 >> 4) << (2 * c + 1);
                out[j] = (l1 & 0xF) | ((l2 & 0xF) << 4);
            }
        }
        Self {
            d,
            dmin,
            scales,
            qh,
            qs,
        }
    }
}

impl BlockQ6_K {
    /// `y = d·sc·(q − 32)` per 16-element sub-block. Per 128 elements, `ql[l]` holds the low
    /// nibbles of elements `l` and `l + 64`, `ql[l + 32]` those of `l + 32` and `l + 96`, and
    /// `qh[l]` the top two bits of all four.
    pub fn dequantize(&self, y: &mut [f32; QK_K]) {
        let d = self.d.to_f32();
        for (n, ys) in y.chunks_exact_mut(128).enumerate() {
            let ql = &self.ql[64 * n..64 * n + 64];
            let qh = &self.qh[32 * n..32 * n + 32];
            let sc = &self.scales[8 * n..8 * n + 8];
            for l in 0..32 {
                let is = l / 16;
                let q1 = i32::from((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
                let q2 = i32::from((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                ys[l] = d * f32::from(sc[is]) * q1 as f32;
                ys[l + 32] = d * f32::from(sc[is + 2]) * q2 as f32;
                ys[l + 64] = d * f32::from(sc[is + 4]) * q3 as f32;
                ys[l + 96] = d * f32::from(sc[is + 6]) * q4 as f32;
            }
        }
    }

    /// ggml's `quantize_row_q6_K_ref`: a symmetric `x²`-weighted fit per sub-block over 19 trial
    /// scales (`make_qx_quants`), 8-bit signed scales against `max/−128`, then levels requantized
    /// to `−32..=31`. A block whose fitted scales are all (near) zero is written as zeros.
    pub fn quantize(x: &[f32; QK_K]) -> Self {
        let mut levels = [0i8; QK_K];
        let (scales, max_scale) =
            fit_sub_blocks(x, &mut levels, |xs, ls| make_qx_quants(32, xs, ls));
        if max_scale.abs() < GROUP_MAX_EPS {
            return bytemuck::Zeroable::zeroed();
        }

        let iscale = -128.0 / max_scale;
        let d = F16Le::from_f32(1.0 / iscale);
        let sc = scales.map(|s| nearest_int(iscale * s).min(127) as i8);
        for (j, (xs, ls)) in x
            .chunks_exact(16)
            .zip(levels.chunks_exact_mut(16))
            .enumerate()
        {
            let dl = d.to_f32() * f32::from(sc[j]);
            if dl == 0.0 {
                continue;
            }
            for (l, &v) in ls.iter_mut().zip(xs) {
                *l = (nearest_int(v / dl).clamp(-32, 31) + 32) as i8;
            }
        }

        let mut ql = [0u8; QK_K / 2];
        let mut qh = [0u8; QK_K / 4];
        for (n, ls) in levels.chunks_exact(128).enumerate() {
            let ls: [u8; 128] = std::array::from_fn(|i| ls[i] as u8);
            for l in 0..32 {
                let (a, b, c, e) = (ls[l], ls[l + 32], ls[l + 64], ls[l + 96]);
                ql[64 * n + l] = (a & 0xF) | ((c & 0xF) << 4);
                ql[64 * n + l + 32] = (b & 0xF) | ((e & 0xF) << 4);
                qh[32 * n + l] = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6);
            }
        }
        Self {
            ql,
            qh,
            scales: sc,
            d,
        }
    }
}

impl BlockQ8_K {
    /// `y = d·q` with the `f32` scale.
    pub fn dequantize(&self, y: &mut [f32; QK_K]) {
        let d = self.d.get();
        for (y, &q) in y.iter_mut().zip(&self.qs) {
            *y = d * f32::from(q);
        }
    }

    /// ggml's reference: the signed extreme maps to −127 (`d = max / −127`, kept as `f32`),
    /// levels rounded half to even, plus the sum of each 16 levels.
    pub fn quantize(x: &[f32; QK_K]) -> Self {
        let (mut max, mut amax) = (0.0f32, 0.0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            return bytemuck::Zeroable::zeroed();
        }
        let iscale = -127.0 / max;
        let qs = x.map(|v| nearest_int(iscale * v).min(127) as i8);
        let bsums = std::array::from_fn(|j| {
            I16Le::new(qs[16 * j..16 * j + 16].iter().map(|&q| i16::from(q)).sum())
        });
        Self {
            d: F32Le::new(1.0 / iscale),
            qs,
            bsums,
        }
    }
}

/// Fits every 16-value sub-block of a super-block with `fit`, which writes the sub-block's levels
/// and returns its scale. Returns the scales and the one of largest magnitude, sign kept (the
/// first such on ties), which sets the super-block scale of the symmetric K-quants.
fn fit_sub_blocks(
    x: &[f32; QK_K],
    levels: &mut [i8; QK_K],
    fit: impl Fn(&[f32], &mut [i8]) -> f32,
) -> ([f32; 16], f32) {
    let mut scales = [0.0f32; 16];
    let mut max_scale = 0.0f32;
    for ((scale, xs), ls) in scales
        .iter_mut()
        .zip(x.chunks_exact(16))
        .zip(levels.chunks_exact_mut(16))
    {
        *scale = fit(xs, ls);
        if scale.abs() > max_scale.abs() {
            max_scale = *scale;
        }
    }
    (scales, max_scale)
}

/// The effective (scale, min) of the two 32-element sub-blocks of 64-element chunk `c` of a
/// Q4_K or Q5_K block: `d·sc` and `dmin·m`, with `sc`, `m` from [`scale_min_k4`].
fn chunk_scales(d: f32, dmin: f32, scales: &[u8; 12], c: usize) -> [(f32, f32); 2] {
    [2 * c, 2 * c + 1].map(|j| {
        let (sc, m) = scale_min_k4(j, scales);
        (d * f32::from(sc), dmin * f32::from(m))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q2_k_element_order_and_scales() {
        let mut b: BlockQ2_K = bytemuck::Zeroable::zeroed();
        b.d = F16Le::from_f32(0.5);
        b.dmin = F16Le::from_f32(0.25);
        b.scales[2] = 0x34; // sub-block 2 (elements 32..48): scale 4, min 3
        b.qs[0] = 0b00_00_11_00; // element 32 (second 2-bit field of byte 0) = 3
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        assert_eq!(y[32], 0.5 * 4.0 * 3.0 - 0.25 * 3.0);
        assert_eq!(y[33], -0.75);
        assert_eq!(y[0], 0.0);
        assert_eq!(level_2bit(&b.qs, 32), 3);
    }

    #[test]
    fn q3_k_scales_and_high_bits() {
        let mut b: BlockQ3_K = bytemuck::Zeroable::zeroed();
        b.d = F16Le::from_f32(1.0);
        // Sub-block 9 (elements 144..160): low nibble in the high half of byte 1, top bits in
        // byte 9 at position 2·(9/4) = 4. Scale 0b10_0101 = 37 → 37 − 32 = 5.
        b.scales[1] = 0x50;
        b.scales[9] = 0b10 << 4;
        assert_eq!(q3_k_scale(&b.scales, 9), 37);
        // Element 150 = 128 + 22: low bits in byte 32 + 22, field 0; hmask byte 22, bit 4.
        b.qs[54] = 0b01;
        b.hmask[22] = 1 << 4;
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        assert_eq!(y[150], 5.0); // (1 + 4 − 4)·5
        assert_eq!(y[151], -20.0); // level 0 without the high bit: (0 − 4)·5
        assert_eq!(y[0], 128.0); // scale 0 − 32, level −4
    }

    #[test]
    fn q4_k_scale_packing_and_nibble_order() {
        let mut b: BlockQ4_K = bytemuck::Zeroable::zeroed();
        b.d = F16Le::from_f32(0.5);
        b.dmin = F16Le::from_f32(1.0);
        let ls = [1, 2, 3, 4, 33, 50, 63, 17];
        let lm = [5, 6, 7, 8, 40, 9, 62, 0];
        b.scales = pack_scale_min_k4(&ls, &lm);
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &b.scales), (ls[j], lm[j]));
        }
        b.qs[32] = 0x7A; // second 64: element 64 (low) = 10, element 96 (high) = 7
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        assert_eq!(y[64], 0.5 * 3.0 * 10.0 - 7.0);
        assert_eq!(y[96], 0.5 * 4.0 * 7.0 - 8.0);
        assert_eq!(y[65], -7.0);
    }

    #[test]
    fn q5_k_fifth_bit_per_chunk() {
        let mut b: BlockQ5_K = bytemuck::Zeroable::zeroed();
        b.d = F16Le::from_f32(1.0);
        b.scales = pack_scale_min_k4(&[1; 8], &[0; 8]);
        b.qh[3] = 0b0000_1000; // chunk 1, high nibble: element 64 + 32 + 3
        b.qs[32 + 3] = 0x21;
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        assert_eq!(y[64 + 3], 1.0);
        assert_eq!(y[96 + 3], 18.0);
    }

    #[test]
    fn q6_k_layout() {
        let mut b: BlockQ6_K = bytemuck::Zeroable::zeroed();
        b.d = F16Le::from_f32(0.5);
        b.scales = [2; 16];
        b.scales[8 + 6] = -3; // second 128, element 96 + l for l < 16
                              // Second half, l = 5: ql[64 + 5 + 32] high nibble and qh[32 + 5] bits 6..8 form element
                              // 128 + 96 + 5.
        b.ql[64 + 37] = 0xF0;
        b.qh[37] = 0b11 << 6;
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        assert_eq!(y[128 + 96 + 5], 0.5 * -3.0 * 31.0);
        assert_eq!(y[0], 0.5 * 2.0 * -32.0);
    }

    #[test]
    fn q8_k_sums_and_scale() {
        let mut x = [0.0f32; QK_K];
        x[0] = -2.0;
        x[1] = 1.0;
        x[17] = 0.5;
        let b = BlockQ8_K::quantize(&x);
        // The signed extreme −2 maps to −127, so the scale is 63.5 levels per unit.
        assert_eq!(b.qs[0], -127);
        assert_eq!(b.qs[1], 64); // 63.5 rounds to even
        assert_eq!(b.qs[17], 32); // 31.75
        assert_eq!(b.bsums[0].get(), -63);
        assert_eq!(b.bsums[1].get(), 32);
        assert_eq!(b.d.get(), 1.0 / 63.5);
    }
}
