//! Plain element types: IEEE half and bfloat16 conversions with ggml's rounding, and the value
//! casts used to read integer and `f64` tensors as `f32`.

use half::f16;

/// The exact `f32` value of half bits (every half is representable). A NaN keeps its payload
/// and comes out quiet, as from ggml's `GGML_FP16_TO_FP32`. Plain integer code, so that it is
/// cheap in unoptimised builds and vectorizes in optimised ones.
pub(crate) fn f16_bits_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits & 0x8000) << 16;
    let exp = u32::from(bits >> 10) & 0x1F;
    let man = u32::from(bits & 0x03FF);
    let magnitude = match exp {
        // Zero and subnormals: man·2^-24, exact in f32.
        0 => (man as f32 * f32::from_bits(0x3380_0000)).to_bits(),
        0x1F if man == 0 => 0x7F80_0000,
        0x1F => 0x7FC0_0000 | (man << 13),
        // Rebias the exponent from 15 to 127 and widen the mantissa.
        _ => ((exp + 112) << 23) | (man << 13),
    };
    f32::from_bits(sign | magnitude)
}

/// Half bits of `x`, rounded to nearest-even, overflowing to infinity, subnormals kept. NaN becomes
/// the canonical quiet NaN `0x7E00` with `x`'s sign and no payload, as ggml's `GGML_FP32_TO_FP16`
/// writes it.
pub(crate) fn f32_to_f16_bits(x: f32) -> u16 {
    if x.is_nan() {
        let sign = ((x.to_bits() >> 16) & 0x8000) as u16;
        sign | 0x7E00
    } else {
        f16::from_f32(x).to_bits()
    }
}

/// bfloat16 bits of `x` as ggml's `ggml_compute_fp32_to_bf16`: round to nearest-even on the low 16
/// bits; a NaN keeps its top bits and is forced quiet (bit 6 of the result), never rounded into an
/// infinity.
pub(crate) fn f32_to_bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    // The largest non-NaN pattern is 0xFF80_0000, so adding at most 0x8000 cannot overflow.
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

/// The exact `f32` value of bfloat16 bits (the top half of an `f32`).
pub(crate) fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Decodes `N`-byte little-endian elements with `f`; `src.len() == N * dst.len()` is checked by
/// the caller.
pub(crate) fn convert_row<const N: usize>(src: &[u8], dst: &mut [f32], f: impl Fn([u8; N]) -> f32) {
    let elems: &[[u8; N]] = bytemuck::cast_slice(src);
    for (y, &e) in dst.iter_mut().zip(elems) {
        *y = f(e);
    }
}

/// Encodes `f32` values into `N`-byte little-endian elements with `f`.
pub(crate) fn encode_row<const N: usize>(src: &[f32], dst: &mut [u8], f: impl Fn(f32) -> [u8; N]) {
    let elems: &mut [[u8; N]] = bytemuck::cast_slice_mut(dst);
    for (e, &x) in elems.iter_mut().zip(src) {
        *e = f(x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_rounds_to_nearest_even_and_keeps_subnormals() {
        // 1 + 2^-11 is halfway between 1 and the next half (1 + 2^-10): ties go to even (1.0).
        assert_eq!(f32_to_f16_bits(1.0 + f32::powi(2.0, -11)), 0x3C00);
        // 1 + 3·2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
        assert_eq!(f32_to_f16_bits(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3C02);
        assert_eq!(f32_to_f16_bits(65504.0), 0x7BFF);
        assert_eq!(f32_to_f16_bits(65520.0), 0x7C00); // rounds up to infinity
        assert_eq!(f32_to_f16_bits(-1e6), 0xFC00);
        assert_eq!(f32_to_f16_bits(f32::powi(2.0, -24)), 0x0001); // smallest subnormal
        assert_eq!(f32_to_f16_bits(f32::powi(2.0, -26)), 0x0000); // below half of it
        assert_eq!(f32_to_f16_bits(-0.0), 0x8000);
        assert_eq!(f16_bits_to_f32(0x0001), f32::powi(2.0, -24));
        assert_eq!(f16_bits_to_f32(0xC500), -5.0);
    }

    #[test]
    fn f16_to_f32_is_exact_for_every_half() {
        for bits in 0..=u16::MAX {
            let got = f16_bits_to_f32(bits);
            assert_eq!(
                got.to_bits(),
                f16::from_bits(bits).to_f32().to_bits(),
                "{bits:#06x}"
            );
            if !got.is_nan() {
                // Round trip through ggml's rounding is the identity on non-NaN halves.
                assert_eq!(f32_to_f16_bits(got), bits, "{bits:#06x}");
            }
        }
        // A signalling NaN is quieted with its payload kept.
        assert_eq!(f16_bits_to_f32(0xFC01).to_bits(), 0xFFC0_2000);
    }

    #[test]
    fn f16_nan_is_canonical_with_sign() {
        assert_eq!(f32_to_f16_bits(f32::from_bits(0x7F80_0001)), 0x7E00);
        assert_eq!(f32_to_f16_bits(f32::from_bits(0xFFC1_2345)), 0xFE00);
    }

    #[test]
    fn bf16_rounds_to_nearest_even_and_quiets_nan() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3F80);
        // Low half exactly 0x8000: a tie, rounds to the even neighbour.
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F80_8000)), 0x3F80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F80_8001)), 0x3F81);
        // The largest finite f32 rounds up to infinity; infinities stay.
        assert_eq!(f32_to_bf16_bits(f32::MAX), 0x7F80);
        assert_eq!(f32_to_bf16_bits(f32::NEG_INFINITY), 0xFF80);
        // A signalling NaN whose payload sits in the low half would otherwise become infinity.
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x7F80_0001)), 0x7FC0);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0xFFFF_FFFF)), 0xFFFF);
        assert_eq!(bf16_bits_to_f32(0xC0A0), -5.0);
    }
}
