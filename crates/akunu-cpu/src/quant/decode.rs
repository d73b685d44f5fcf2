//! Every supported quantized block decoded into one shape: unsigned byte levels `q`, a constant
//! offset [`Format::OFF`] per type and, per group of [`Format::GROUP`] elements, a scale `sw` and
//! a min `mw`, with `w = sw·(q − OFF) + mw` as the `akunu-quant` reference dequantizes.
//!
//! The dot product of a group with activation levels `x` (scale `sx`) is then
//! `sw·sx·(Σq·x − OFF·Σx) + mw·sx·Σx`: one unsigned-by-signed byte product whatever the weight
//! type, which is what `vpdpbusd` computes, corrected by the level sum the activations carry. The
//! correction is exact in integers (or in `f32`, where every term is an integer below 2²⁴), so
//! the offset costs no precision; only the formats with a min (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) have
//! the `mw` term.
//! The format types keep ggml's names.

#![allow(non_camel_case_types)]

use akunu_quant::{
    scale_min_k4, BlockIQ4_NL, BlockIQ4_XS, BlockQ2_K, BlockQ3_K, BlockQ4_0, BlockQ4_1, BlockQ4_K,
    BlockQ5_0, BlockQ5_1, BlockQ5_K, BlockQ6_K, BlockQ8_0, GgmlType, KVALUES_IQ4NL, QK_K,
};
use bytemuck::Pod;

/// Which activation quantization the weight type's dot product uses (as ggml's `vec_dot_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActFormat {
    /// 32-element blocks with an `f16` scale, ggml's `quantize_row_q8_0`.
    Q8_0,
    /// 32-element blocks with an `f32` scale (the GPU backend's format), for the k-quants.
    /// ggml pairs them with Q8_K, one scale per 256 elements; on a model whose residual stream
    /// has a few channels orders of magnitude above the rest (Gemma 3) that scale rounds the
    /// small channels of a block away, which moved Gemma 3 270M's perplexity 0.6 % from exact
    /// arithmetic where per-32 scales leave 0.03 % (`docs/perf/2026-11-22-activation-blocks.md`).
    Q8_0F32,
}

/// A quantized weight format as the kernels see it.
pub(crate) trait Format {
    /// The ggml type.
    const TY: GgmlType;
    /// Elements per block.
    const BLOCK: usize;
    /// Bytes per block.
    const BYTES: usize;
    /// Elements sharing one `(sw, c)` pair: 16 or 32.
    const GROUP: usize;
    /// The activation format.
    const ACT: ActFormat;
    /// The level that means zero.
    const OFF: u8;
    /// Whether groups have a min `mw` (otherwise it is zero).
    const HAS_MIN: bool = false;
    /// Whether levels use all eight bits (`OFF` is 128), which `vpmaddubsw` cannot multiply
    /// without saturating.
    const WIDE: bool = false;
    /// Decodes one block: `q[..BLOCK]`, `sw[..BLOCK / GROUP]`, `mw[..BLOCK / GROUP]`.
    fn decode(block: &[u8], q: &mut [u8], sw: &mut [f32], mw: &mut [f32]);
}

/// The value of a stored half, inlined (unlike the reference's exact but out-of-line decoder).
trait HalfValue {
    fn f32(self) -> f32;
}

impl HalfValue for akunu_quant::blocks::F16Le {
    #[inline(always)]
    fn f32(self) -> f32 {
        half::f16::from_le_bytes(self.0).to_f32()
    }
}

/// Reads a block struct in place (blocks have alignment 1).
#[inline(always)]
fn view<B: Pod>(block: &[u8]) -> &B {
    bytemuck::from_bytes(&block[..std::mem::size_of::<B>()])
}

/// IQ4_NL levels shifted by 128 into unsigned bytes.
pub(crate) const KVALUES_U8: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (KVALUES_IQ4NL[i] as i16 + 128) as u8;
        i += 1;
    }
    t
};

/// Low nibbles of `qs` are elements `0..16`, high nibbles `16..32`.
fn nibbles32(qs: &[u8; 16], q: &mut [u8]) {
    let (lo, hi) = q[..32].split_at_mut(16);
    for ((l, h), &b) in lo.iter_mut().zip(hi.iter_mut()).zip(qs) {
        *l = b & 0xF;
        *h = b >> 4;
    }
}

/// Adds the fifth bit (bit `j` of `qh` for element `j`) as 16, eight elements per step: the
/// byte of bits is copied to all eight bytes, byte `i` keeps bit `i`, and adding `0x7F` carries
/// into the top bit of a byte exactly when its bit is set.
fn fifth_bits(qh: [u8; 4], q: &mut [u8]) {
    for (&bits, out) in qh.iter().zip(q[..32].chunks_exact_mut(8)) {
        let one = u64::from(bits).wrapping_mul(0x0101_0101_0101_0101) & 0x8040_2010_0804_0201;
        let sixteens = ((one + 0x7F7F_7F7F_7F7F_7F7F) & 0x8080_8080_8080_8080) >> 3;
        let v = u64::from_le_bytes(out.try_into().unwrap()) | sixteens;
        out.copy_from_slice(&v.to_le_bytes());
    }
}

pub(crate) struct Q4_0;
impl Format for Q4_0 {
    const TY: GgmlType = GgmlType::Q4_0;
    const BLOCK: usize = 32;
    const BYTES: usize = 18;
    const GROUP: usize = 32;
    const ACT: ActFormat = ActFormat::Q8_0;
    const OFF: u8 = 8;
    #[inline(always)]
    fn decode(block: &[u8], q: &mut [u8], sw: &mut [f32], _mw: &mut [f32]) {
        let b: &BlockQ4_0 = view(block);
        nibbles32(&b.qs, q);
        sw[0] = b.d.f32();
    }
}

pub(crate) struct Q4_1;
impl Format for Q4_1 {
    const TY: GgmlType = GgmlType::Q4_1;
    const BLOCK: usize = 32;
    const BYTES: usize = 20;
    const GROUP: usize = 32;
    const ACT: ActFormat = ActFormat::Q8_0;
    const OFF: u8 = 0;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn decode(block: &[u8], q: &mut [u8], sw: &mut [f32], mw: &mut [f32]) {
        let b: &BlockQ4_1 = view(block);
        nibbles32(&b.qs, q);
        sw[0] = b.d.f32();
        mw[0] = b.m.f32();
    }
}

pub(crate) struct Q5_0;
impl Format for Q5_0 {
    const TY: GgmlType = GgmlType::Q5_0;
    const BLOCK: usize = 32;
    const BYTES: usize = 22;
    const GROUP: usize = 32;
    const ACT: ActFormat = ActFormat::Q8_0;
    const OFF: u8 = 16;
    #[inline(always)]
    fn decode(block: &[u8], q: &mut [u8], sw: &mut [f32], _mw: &mut [f32]) {
        let b: &BlockQ5_0 = view(block);
        nibbles32(&b.qs, q);
        fifth_bits(b.qh, q);
        sw[0] = b.d.f32();
    }
}

pub(crate) struct Q5_1;
impl Format for Q5_1 {
    const TY: GgmlType = GgmlType::Q5_1;
    const BLOCK: usize = 32;
    const BYTES: usize = 24;
    const GROUP: usize = 32;
    const ACT: ActFormat = ActFormat::Q8_0;
    const OFF: u8 = 0;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn decode(block: &[u8], q: &mut [u8], sw: &mut [f32], mw: &mut [f32]) {
        let b: &BlockQ5_1 = view(block);
        nibbles32(&b.qs, q);
        fifth_bits(b.qh, q);
        sw[0] = b.d.f32();
        mw[0] = b.m.f32();
    }
}

pub(crate) struct Q8_0;
impl Format for Q8_0 {
    const TY: GgmlType = GgmlType::Q8_0;
    const BLOCK: usize = 32;
    const BYTES: usize = 34;
    const GROUP: usize = 32;
    const ACT: ActFormat = ActFormat::Q8_0;
    const OFF: u8 = 128;
    const WIDE: bool = true;
    #[inline(always)]
    fn decode(block: &[u8], q: &mut [u8], sw: &mut [f32], _mw: &mut [f32]) {
        let b: &BlockQ8_0 = view(block);
        for (v, &s) in q[..32].iter_mut().zip(&b.qs) {
            *v = (s as u8) ^ 0x80;
        }
        sw[0] = b.d.f32();
    }
}

pub(crate) struct IQ4_NL;
impl Format for IQ4_NL {
    const TY: GgmlType = GgmlType::IQ4_NL;
    const BLOCK: usize = 32;
    const BYTES: usize = 18;
    const GROUP: usize = 32;
    const ACT: ActFormat = ActFormat::Q8_0;
    const OFF: u8 = 128;
    const WIDE: bool = true;
    #[inline(always)]
    fn decode(block: &[u8], q: &mut [u8], sw: &mut [f32], _mw: &mut [f32]) {
        let b: &BlockIQ4_NL = view(block);
        nibbles32(&b.qs, q);
        for v in &mut q[..32] {
            *v = KVALUES_U8[usize::from(*v)];
        }
        sw[0] = b.d.f32();
    }
}

/// 2-bit levels: byte `l` of each 32 bytes holds elements `l + 32·s` of its 128, two bits each.
fn two_bits(qs: &[u8; QK_K / 4], q: &mut [u8]) {
    for (half, out) in qs.chunks_exact(32).zip(q.chunks_exact_mut(128)) {
        for (s, o) in out.chunks_exact_mut(32).enumerate() {
            for (v, &b) in o.iter_mut().zip(half) {
                *v = (b >> (2 * s)) & 3;
            }
        }
    }
}

pub(crate) struct Q2_K;
impl Format for Q2_K {
    const TY: GgmlType = GgmlType::Q2_K;
    const BLOCK: usize = 256;
    const BYTES: usize = 84;
    const GROUP: usize = 16;
    const ACT: ActFormat = ActFormat::Q8_0F32;
    const OFF: u8 = 0;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn decode(block: &[u8], q: &mut [u8], sw: &mut [f32], mw: &mut [f32]) {
        let b: &BlockQ2_K = view(block);
        two_bits(&b.qs, q);
        let (d, dmin) = (b.d.f32(), b.dmin.f32());
        for (j, &sc) in b.scales.iter().enumerate() {
            sw[j] = d * f32::from(sc & 0xF);
            mw[j] = -(dmin * f32::from(sc >> 4));
        }
    }
}

pub(crate) struct Q3_K;
impl Format for Q3_K {
    const TY: GgmlType = GgmlType::Q3_K;
    const BLOCK: usize = 256;
    const BYTES: usize = 110;
    const GROUP: usize = 16;
    const ACT: ActFormat = ActFormat::Q8_0F32;
    const OFF: u8 = 4;
    #[inline(always)]
    fn decode(block: &[u8], q: &mut [u8], sw: &mut [f32], _mw: &mut [f32]) {
        let b: &BlockQ3_K = view(block);
        two_bits(&b.qs, q);
        // Bit `i / 32` of `hmask[i % 32]` adds 4 to element `i` (the level is `q − 4`).
        for (i, v) in q[..QK_K].iter_mut().enumerate() {
            *v |= ((b.hmask[i % 32] >> (i / 32)) & 1) << 2;
        }
        let d = b.d.f32();
        for (j, sw) in sw[..16].iter_mut().enumerate() {
            let low = if j < 8 {
                b.scales[j] & 0xF
            } else {
                b.scales[j - 8] >> 4
            };
            let high = (b.scales[8 + j % 4] >> (2 * (j / 4))) & 3;
            *sw = d * (i32::from(low | (high << 4)) - 32) as f32;
        }
    }
}

/// Q4_K and Q5_K: per 64 elements, 32 low nibbles then 32 high nibbles; 6-bit scales and mins.
fn k4_like(
    d: f32,
    dmin: f32,
    scales: &[u8; 12],
    qs: &[u8; QK_K / 2],
    q: &mut [u8],
    sw: &mut [f32],
    mw: &mut [f32],
) {
    for (qs, out) in qs.chunks_exact(32).zip(q.chunks_exact_mut(64)) {
        let (lo, hi) = out.split_at_mut(32);
        for ((l, h), &b) in lo.iter_mut().zip(hi.iter_mut()).zip(qs) {
            *l = b & 0xF;
            *h = b >> 4;
        }
    }
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, scales);
        sw[j] = d * f32::from(sc);
        mw[j] = -(dmin * f32::from(m));
    }
}

pub(crate) struct Q4_K;
impl Format for Q4_K {
    const TY: GgmlType = GgmlType::Q4_K;
    const BLOCK: usize = 256;
    const BYTES: usize = 144;
    const GROUP: usize = 32;
    const ACT: ActFormat = ActFormat::Q8_0F32;
    const OFF: u8 = 0;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn decode(block: &[u8], q: &mut [u8], sw: &mut [f32], mw: &mut [f32]) {
        let b: &BlockQ4_K = view(block);
        k4_like(b.d.f32(), b.dmin.f32(), &b.scales, &b.qs, q, sw, mw);
    }
}

pub(crate) struct Q5_K;
impl Format for Q5_K {
    const TY: GgmlType = GgmlType::Q5_K;
    const BLOCK: usize = 256;
    const BYTES: usize = 176;
    const GROUP: usize = 32;
    const ACT: ActFormat = ActFormat::Q8_0F32;
    const OFF: u8 = 0;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn decode(block: &[u8], q: &mut [u8], sw: &mut [f32], mw: &mut [f32]) {
        let b: &BlockQ5_K = view(block);
        k4_like(b.d.f32(), b.dmin.f32(), &b.scales, &b.qs, q, sw, mw);
        // Bit `2c` of `qh[l]` extends element `64c + l`, bit `2c + 1` element `64c + 32 + l`.
        for (i, v) in q[..QK_K].iter_mut().enumerate() {
            *v |= ((b.qh[i % 32] >> (i / 32)) & 1) << 4;
        }
    }
}

pub(crate) struct Q6_K;
impl Format for Q6_K {
    const TY: GgmlType = GgmlType::Q6_K;
    const BLOCK: usize = 256;
    const BYTES: usize = 210;
    const GROUP: usize = 16;
    const ACT: ActFormat = ActFormat::Q8_0F32;
    const OFF: u8 = 32;
    #[inline(always)]
    fn decode(block: &[u8], q: &mut [u8], sw: &mut [f32], _mw: &mut [f32]) {
        let b: &BlockQ6_K = view(block);
        for (n, out) in q[..QK_K].chunks_exact_mut(128).enumerate() {
            let ql = &b.ql[64 * n..64 * n + 64];
            let qh = &b.qh[32 * n..32 * n + 32];
            for l in 0..32 {
                out[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
                out[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
                out[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                out[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
            }
        }
        let d = b.d.f32();
        for (j, &sc) in b.scales.iter().enumerate() {
            sw[j] = d * f32::from(sc);
        }
    }
}

pub(crate) struct IQ4_XS;
impl Format for IQ4_XS {
    const TY: GgmlType = GgmlType::IQ4_XS;
    const BLOCK: usize = 256;
    const BYTES: usize = 136;
    const GROUP: usize = 32;
    const ACT: ActFormat = ActFormat::Q8_0F32;
    const OFF: u8 = 128;
    const WIDE: bool = true;
    #[inline(always)]
    fn decode(block: &[u8], q: &mut [u8], sw: &mut [f32], _mw: &mut [f32]) {
        let b: &BlockIQ4_XS = view(block);
        let d = b.d.f32();
        for (ib, (qs, out)) in
            b.qs.chunks_exact(16)
                .zip(q[..QK_K].chunks_exact_mut(32))
                .enumerate()
        {
            for (j, &byte) in qs.iter().enumerate() {
                out[j] = KVALUES_U8[usize::from(byte & 0xF)];
                out[j + 16] = KVALUES_U8[usize::from(byte >> 4)];
            }
            sw[ib] = d * (b.sub_scale(ib) - 32) as f32;
        }
    }
}

/// Calls `$body` with `$F` bound to the [`Format`] of `$ty`; `$other` for the rest.
macro_rules! with_format {
    ($ty:expr, $F:ident => $body:expr, _ => $other:expr) => {{
        use akunu_quant::GgmlType as T;
        use $crate::quant::decode as fmt;
        match $ty {
            T::Q4_0 => {
                type $F = fmt::Q4_0;
                $body
            }
            T::Q4_1 => {
                type $F = fmt::Q4_1;
                $body
            }
            T::Q5_0 => {
                type $F = fmt::Q5_0;
                $body
            }
            T::Q5_1 => {
                type $F = fmt::Q5_1;
                $body
            }
            T::Q8_0 => {
                type $F = fmt::Q8_0;
                $body
            }
            T::IQ4_NL => {
                type $F = fmt::IQ4_NL;
                $body
            }
            T::Q2_K => {
                type $F = fmt::Q2_K;
                $body
            }
            T::Q3_K => {
                type $F = fmt::Q3_K;
                $body
            }
            T::Q4_K => {
                type $F = fmt::Q4_K;
                $body
            }
            T::Q5_K => {
                type $F = fmt::Q5_K;
                $body
            }
            T::Q6_K => {
                type $F = fmt::Q6_K;
                $body
            }
            T::IQ4_XS => {
                type $F = fmt::IQ4_XS;
                $body
            }
            _ => $other,
        }
    }};
}
pub(crate) use with_format;

/// The activation format and group size a quantized weight type needs, or `None` for types
/// without a quantized kernel.
pub(crate) fn act_layout(ty: GgmlType) -> Option<(ActFormat, usize)> {
    with_format!(ty, F => Some((F::ACT, F::GROUP)), _ => None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decoding and reassembling `sw·q + c` must give the reference dequantization bit for bit
    /// up to the one rounding of the product.
    fn check<F: Format>(seed: u32) {
        let mut bytes = vec![0u8; F::BYTES];
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        for b in bytes.iter_mut() {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            *b = s as u8;
        }
        // Keep the f16 scales finite: clear the top exponent bit of every f16 field.
        for off in f16_offsets(F::TY) {
            bytes[off + 1] &= 0x3F;
        }
        let mut want = vec![0f32; F::BLOCK];
        akunu_quant::dequantize(F::TY, &bytes, &mut want).unwrap();
        let (mut q, mut sw, mut mw) = (vec![0u8; F::BLOCK], vec![0f32; 16], vec![0f32; 16]);
        F::decode(&bytes, &mut q, &mut sw, &mut mw);
        for (i, &w) in want.iter().enumerate() {
            let g = i / F::GROUP;
            let level = i32::from(q[i]) - i32::from(F::OFF);
            let got = sw[g] * level as f32 + mw[g];
            assert!(
                (got - w).abs() <= 1e-6 * (w.abs() + mw[g].abs()),
                "{} element {i}: {got} vs {w}",
                F::TY
            );
        }
    }

    fn f16_offsets(ty: GgmlType) -> Vec<usize> {
        use GgmlType as T;
        match ty {
            T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4_NL | T::IQ4_XS => vec![0],
            T::Q4_1 | T::Q5_1 | T::Q4_K | T::Q5_K => vec![0, 2],
            T::Q2_K => vec![80, 82],
            T::Q3_K => vec![108],
            T::Q6_K => vec![208],
            _ => unreachable!(),
        }
    }

    #[test]
    fn decode_matches_reference() {
        for seed in 0..20 {
            check::<Q4_0>(seed);
            check::<Q4_1>(seed);
            check::<Q5_0>(seed);
            check::<Q5_1>(seed);
            check::<Q8_0>(seed);
            check::<IQ4_NL>(seed);
            check::<Q2_K>(seed);
            check::<Q3_K>(seed);
            check::<Q4_K>(seed);
            check::<Q5_K>(seed);
            check::<Q6_K>(seed);
            check::<IQ4_XS>(seed);
        }
    }
}
