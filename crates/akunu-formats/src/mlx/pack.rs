//! MLX affine packing: the code bit stream and the reference dequantization.

use half::{bf16, f16};

use crate::safetensors::Dtype;

/// Bit widths of MLX's affine mode.
pub const SUPPORTED_BITS: [u32; 6] = [2, 3, 4, 5, 6, 8];

/// Group sizes of MLX's affine mode.
pub const SUPPORTED_GROUP_SIZES: [usize; 3] = [32, 64, 128];

/// The group size and bit width of one quantized tensor, restricted to the supported values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantParams {
    group_size: usize,
    bits: u32,
}

impl QuantParams {
    /// MLX's defaults for affine mode, used where a config leaves a field out.
    pub const DEFAULT: QuantParams = QuantParams {
        group_size: 64,
        bits: 4,
    };

    /// `None` unless `bits` is in [`SUPPORTED_BITS`] and `group_size` in [`SUPPORTED_GROUP_SIZES`].
    pub fn new(group_size: usize, bits: u32) -> Option<Self> {
        (SUPPORTED_BITS.contains(&bits) && SUPPORTED_GROUP_SIZES.contains(&group_size))
            .then_some(QuantParams { group_size, bits })
    }

    pub fn group_size(self) -> usize {
        self.group_size
    }

    pub fn bits(self) -> u32 {
        self.bits
    }

    /// Packed bytes holding one group's codes. Group sizes are multiples of 8 and 8 codes of
    /// `bits` bits fill exactly `bits` bytes, so groups start on byte (indeed u32) boundaries.
    pub fn group_bytes(self) -> usize {
        self.group_size / 8 * self.bits as usize
    }
}

/// The dtype of a tensor's scales and biases, which is also the dtype MLX dequantizes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleDtype {
    F16,
    Bf16,
    F32,
}

impl ScaleDtype {
    pub fn from_dtype(dtype: Dtype) -> Option<Self> {
        match dtype {
            Dtype::F16 => Some(ScaleDtype::F16),
            Dtype::Bf16 => Some(ScaleDtype::Bf16),
            Dtype::F32 => Some(ScaleDtype::F32),
            _ => None,
        }
    }

    /// Bytes per scale or bias.
    pub fn size(self) -> usize {
        match self {
            ScaleDtype::F16 | ScaleDtype::Bf16 => 2,
            ScaleDtype::F32 => 4,
        }
    }
}

/// Unpacks `out.len()` codes of `bits` bits from `packed`.
///
/// MLX stores a row's codes as one little-endian bit stream: code `i` occupies bits
/// `i*bits .. (i+1)*bits`, least significant bit first, with no padding. For 2, 4 and 8 bits this
/// is "32/bits codes per u32, lowest first"; for 3 and 6 bits a code may straddle bytes (8 codes
/// per 3 bytes, 4 codes per 3 bytes), and for 5 bits 8 codes fill 5 bytes.
///
/// # Panics
/// If `bits` is not in 1..=8 or `packed` holds fewer than `out.len() * bits` bits.
pub fn unpack_codes(packed: &[u8], bits: u32, out: &mut [u8]) {
    assert!(
        (1..=8).contains(&bits),
        "{bits}-bit codes are not supported"
    );
    let width = bits as usize;
    assert!(
        packed.len() * 8 >= out.len() * width,
        "{} packed bytes cannot hold {} {bits}-bit codes",
        packed.len(),
        out.len()
    );
    let mask = (1u64 << bits) - 1;
    // Eight codes always fill exactly `bits` whole bytes, so the bulk is unpacked from one u64.
    let whole = out.len() / 8;
    for (codes, bytes) in out.chunks_exact_mut(8).zip(packed.chunks_exact(width)) {
        let mut word = [0u8; 8];
        word[..width].copy_from_slice(bytes);
        let word = u64::from_le_bytes(word);
        for (i, code) in codes.iter_mut().enumerate() {
            *code = ((word >> (i * width)) & mask) as u8;
        }
    }
    for (i, code) in out.iter_mut().enumerate().skip(whole * 8) {
        let bit = i * width;
        let low = packed[bit / 8];
        let high = packed.get(bit / 8 + 1).copied().unwrap_or(0);
        *code = ((u64::from(u16::from_le_bytes([low, high])) >> (bit % 8)) & mask) as u8;
    }
}

/// One dequantized value `scale * q + bias`, rounded the way MLX's CPU kernel rounds it: the
/// product and then the sum are each rounded to the scale dtype. MLX's F16/BF16 types compute
/// each operation in f32 and round the result back, and so does this. No fused multiply-add is
/// used: MLX's x86-64 build does not fuse, and a fused result differs in the last bit of many F32
/// outputs (where the bias nearly cancels the product).
trait AffineScale: Copy {
    const SIZE: usize;
    fn read(bytes: &[u8]) -> Self;
    fn affine(scale: Self, bias: Self, code: u8) -> f32;
}

impl AffineScale for f32 {
    const SIZE: usize = 4;
    fn read(bytes: &[u8]) -> Self {
        f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }
    fn affine(scale: Self, bias: Self, code: u8) -> f32 {
        scale * f32::from(code) + bias
    }
}

impl AffineScale for f16 {
    const SIZE: usize = 2;
    fn read(bytes: &[u8]) -> Self {
        f16::from_le_bytes([bytes[0], bytes[1]])
    }
    fn affine(scale: Self, bias: Self, code: u8) -> f32 {
        let product = f16::from_f32(scale.to_f32() * f32::from(code));
        f16::from_f32(product.to_f32() + bias.to_f32()).to_f32()
    }
}

impl AffineScale for bf16 {
    const SIZE: usize = 2;
    fn read(bytes: &[u8]) -> Self {
        bf16::from_le_bytes([bytes[0], bytes[1]])
    }
    fn affine(scale: Self, bias: Self, code: u8) -> f32 {
        let product = bf16::from_f32(scale.to_f32() * f32::from(code));
        bf16::from_f32(product.to_f32() + bias.to_f32()).to_f32()
    }
}

/// Dequantizes one row of `out.len()` values to f32, bit for bit as `mx.dequantize` computes them
/// in the scale dtype (see [`ScaleDtype`]), then widened to f32, which is exact.
///
/// `packed` holds the row's codes, `scales` and `biases` its `out.len() / group_size`
/// little-endian elements of `dtype`.
///
/// # Panics
/// If `out.len()` is not a multiple of the group size or a slice has the wrong length.
pub fn dequantize_row(
    params: QuantParams,
    dtype: ScaleDtype,
    packed: &[u8],
    scales: &[u8],
    biases: &[u8],
    out: &mut [f32],
) {
    match dtype {
        ScaleDtype::F16 => dequantize_row_as::<f16>(params, packed, scales, biases, out),
        ScaleDtype::Bf16 => dequantize_row_as::<bf16>(params, packed, scales, biases, out),
        ScaleDtype::F32 => dequantize_row_as::<f32>(params, packed, scales, biases, out),
    }
}

fn dequantize_row_as<T: AffineScale>(
    params: QuantParams,
    packed: &[u8],
    scales: &[u8],
    biases: &[u8],
    out: &mut [f32],
) {
    let group = params.group_size;
    assert_eq!(
        out.len() % group,
        0,
        "row length is not a multiple of the group size"
    );
    let groups = out.len() / group;
    assert_eq!(
        packed.len(),
        groups * params.group_bytes(),
        "packed row length"
    );
    assert_eq!(scales.len(), groups * T::SIZE, "scales row length");
    assert_eq!(biases.len(), groups * T::SIZE, "biases row length");

    let levels = 1usize << params.bits;
    let mut codes = [0u8; 128];
    let mut table = [0f32; 256];
    let chunks = out
        .chunks_exact_mut(group)
        .zip(packed.chunks_exact(params.group_bytes()))
        .zip(
            scales
                .chunks_exact(T::SIZE)
                .zip(biases.chunks_exact(T::SIZE)),
        );
    for ((values, bytes), (scale, bias)) in chunks {
        let (scale, bias) = (T::read(scale), T::read(bias));
        let codes = &mut codes[..group];
        unpack_codes(bytes, params.bits, codes);
        // When a group has more values than there are codes, evaluating every code once and
        // looking results up is cheaper; the results are the same either way.
        if levels <= group {
            for (q, slot) in table[..levels].iter_mut().enumerate() {
                *slot = T::affine(scale, bias, q as u8);
            }
            for (v, &q) in values.iter_mut().zip(codes.iter()) {
                *v = table[usize::from(q)];
            }
        } else {
            for (v, &q) in values.iter_mut().zip(codes.iter()) {
                *v = T::affine(scale, bias, q);
            }
        }
    }
}
