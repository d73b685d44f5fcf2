//! The element types of the safetensors format and their conversion to f32.

use std::fmt;

use half::{bf16, f16};

/// A safetensors element type, spelled in headers as [`Dtype::name`] returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    Bool,
    U8,
    I8,
    I16,
    U16,
    F16,
    Bf16,
    I32,
    U32,
    F32,
    F64,
    I64,
    U64,
    /// OCP FP8 E4M3 "fn" flavour: no infinities, `S.1111.111` is NaN, max 448.
    F8E4M3,
    /// OCP FP8 E5M2: the top byte of an IEEE binary16.
    F8E5M2,
}

impl Dtype {
    pub const ALL: [Dtype; 15] = [
        Dtype::Bool,
        Dtype::U8,
        Dtype::I8,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::Bf16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
        Dtype::F8E4M3,
        Dtype::F8E5M2,
    ];

    /// Parses the header spelling (`"BF16"`, `"F8_E4M3"`, ...).
    pub fn from_name(name: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The header spelling.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::Bf16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E5M2 => "F8_E5M2",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 | Dtype::F8E4M3 | Dtype::F8E5M2 => 1,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::F64 | Dtype::I64 | Dtype::U64 => 8,
        }
    }

    /// Whether views of this dtype convert to f32. The 32- and 64-bit integer types are refused:
    /// they hold indices or packed codes, and rounding them to f32 would hide that. F64 is
    /// accepted and rounds to nearest like any narrowing float cast.
    pub fn converts_to_f32(self) -> bool {
        f32_decoder(self).is_some()
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Decodes one F8_E4M3 byte. Every finite value is exactly representable in f32.
pub fn f8_e4m3_to_f32(byte: u8) -> f32 {
    let sign = if byte & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = i32::from((byte >> 3) & 0xF);
    let man = f32::from(byte & 0x7);
    match exp {
        15 if byte & 0x7 == 0x7 => f32::NAN,
        // Subnormals: man/8 * 2^(1-7).
        0 => sign * man * (-9f32).exp2(),
        _ => sign * (1.0 + man / 8.0) * ((exp - 7) as f32).exp2(),
    }
}

/// Decodes one F8_E5M2 byte, which is the high byte of the binary16 with the same value.
pub fn f8_e5m2_to_f32(byte: u8) -> f32 {
    f16::from_bits(u16::from(byte) << 8).to_f32()
}

/// Writes one f32 per slot of the output from the little-endian elements in the input.
pub(crate) type F32Decoder = fn(&[u8], &mut [f32]);

/// The f32 decoder for `dtype`, or `None` for the dtypes that [`Dtype::converts_to_f32`] refuses.
pub(crate) fn f32_decoder(dtype: Dtype) -> Option<F32Decoder> {
    fn each<const N: usize>(bytes: &[u8], out: &mut [f32], f: impl Fn([u8; N]) -> f32) {
        debug_assert_eq!(bytes.len(), out.len() * N);
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(N)) {
            let mut element = [0u8; N];
            element.copy_from_slice(c);
            *o = f(element);
        }
    }
    let decoder: F32Decoder = match dtype {
        Dtype::Bool => |b, o| each(b, o, |[b]| f32::from(u8::from(b != 0))),
        Dtype::U8 => |b, o| each(b, o, |[b]| f32::from(b)),
        Dtype::I8 => |b, o| each(b, o, |b| f32::from(i8::from_le_bytes(b))),
        Dtype::I16 => |b, o| each(b, o, |b| f32::from(i16::from_le_bytes(b))),
        Dtype::U16 => |b, o| each(b, o, |b| f32::from(u16::from_le_bytes(b))),
        Dtype::F16 => |b, o| each(b, o, |b| f16::from_le_bytes(b).to_f32()),
        Dtype::Bf16 => |b, o| each(b, o, |b| bf16::from_le_bytes(b).to_f32()),
        Dtype::F32 => |b, o| each(b, o, f32::from_le_bytes),
        Dtype::F64 => |b, o| each(b, o, |b| f64::from_le_bytes(b) as f32),
        Dtype::F8E4M3 => |b, o| each(b, o, |[b]| f8_e4m3_to_f32(b)),
        Dtype::F8E5M2 => |b, o| each(b, o, |[b]| f8_e5m2_to_f32(b)),
        Dtype::I32 | Dtype::U32 | Dtype::I64 | Dtype::U64 => return None,
    };
    Some(decoder)
}
