//! Block structs laid out byte for byte as ggml's `ggml-common.h`.
//!
//! Multi-byte fields are stored as little-endian byte arrays ([`F16Le`], [`F32Le`], ...), so every
//! block has alignment 1: a slice of blocks can be viewed in place from any `&[u8]`, such as an
//! mmapped GGUF tensor whose rows start at arbitrary offsets, and the layout is the on-disk one on
//! any host. Field names and order follow ggml; the size of each struct is asserted at compile
//! time.

use bytemuck::{Pod, Zeroable};

use crate::float::{f16_bits_to_f32, f32_to_f16_bits};

/// Elements in a super-block of the k-quants and IQ4_XS (`QK_K`).
pub const QK_K: usize = 256;
/// Elements in a block of the legacy formats and IQ4_NL.
pub const QK32: usize = 32;

/// An IEEE binary16 value stored little-endian.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(transparent)]
pub struct F16Le(pub [u8; 2]);

impl F16Le {
    /// The raw half bits.
    pub fn to_bits(self) -> u16 {
        u16::from_le_bytes(self.0)
    }

    /// A half from its raw bits.
    pub fn from_bits(bits: u16) -> Self {
        Self(bits.to_le_bytes())
    }

    /// The exact `f32` value.
    pub fn to_f32(self) -> f32 {
        f16_bits_to_f32(self.to_bits())
    }

    /// `x` rounded to nearest-even as ggml's `GGML_FP32_TO_FP16` does.
    pub fn from_f32(x: f32) -> Self {
        Self::from_bits(f32_to_f16_bits(x))
    }
}

/// An IEEE binary32 value stored little-endian.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(transparent)]
pub struct F32Le(pub [u8; 4]);

impl F32Le {
    /// The value.
    pub fn get(self) -> f32 {
        f32::from_le_bytes(self.0)
    }

    /// Stores `x`.
    pub fn new(x: f32) -> Self {
        Self(x.to_le_bytes())
    }
}

/// A `u16` stored little-endian.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(transparent)]
pub struct U16Le(pub [u8; 2]);

impl U16Le {
    /// The value.
    pub fn get(self) -> u16 {
        u16::from_le_bytes(self.0)
    }

    /// Stores `x`.
    pub fn new(x: u16) -> Self {
        Self(x.to_le_bytes())
    }
}

/// An `i16` stored little-endian.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(transparent)]
pub struct I16Le(pub [u8; 2]);

impl I16Le {
    /// The value.
    pub fn get(self) -> i16 {
        i16::from_le_bytes(self.0)
    }

    /// Stores `x`.
    pub fn new(x: i16) -> Self {
        Self(x.to_le_bytes())
    }
}

/// Q4_0: `y = d·(q − 8)`, 4-bit `q`. Byte `j` of `qs` holds element `j` (low nibble) and element
/// `j + 16` (high nibble).
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct BlockQ4_0 {
    pub d: F16Le,
    pub qs: [u8; QK32 / 2],
}

/// Q4_1: `y = d·q + m`, 4-bit `q`, nibbles as in Q4_0.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct BlockQ4_1 {
    pub d: F16Le,
    pub m: F16Le,
    pub qs: [u8; QK32 / 2],
}

/// Q5_0: `y = d·(q − 16)`, 5-bit `q`; bit `j` of the little-endian `u32` in `qh` is the fifth bit
/// of element `j`.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct BlockQ5_0 {
    pub d: F16Le,
    pub qh: [u8; 4],
    pub qs: [u8; QK32 / 2],
}

/// Q5_1: `y = d·q + m`, 5-bit `q` packed as in Q5_0.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct BlockQ5_1 {
    pub d: F16Le,
    pub m: F16Le,
    pub qh: [u8; 4],
    pub qs: [u8; QK32 / 2],
}

/// Q8_0: `y = d·q`, `q` a signed byte.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct BlockQ8_0 {
    pub d: F16Le,
    pub qs: [i8; QK32],
}

/// Q8_1: Q8_0 plus `s = d·Σq` for dot products against asymmetric formats.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct BlockQ8_1 {
    pub d: F16Le,
    pub s: F16Le,
    pub qs: [i8; QK32],
}

/// Q2_K: 16 sub-blocks of 16, `y = d·(sc & 15)·q − dmin·(sc >> 4)` with 2-bit `q`. Byte `l` of
/// each 32-byte half of `qs` holds elements `l`, `l + 32`, `l + 64`, `l + 96` of a 128-element
/// half, two bits each from the bottom.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct BlockQ2_K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: F16Le,
    pub dmin: F16Le,
}

/// Q3_K: 16 sub-blocks of 16, `y = d·(s − 32)·(q − 4)` with 6-bit `s` and 3-bit `q`. The low two
/// bits of `q` are packed as in Q2_K; bit `b` of `hmask[l]` is the high bit of element `l + 32·b`.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct BlockQ3_K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: F16Le,
}

/// Q4_K: 8 sub-blocks of 32, `y = d·s·q − dmin·m` with 6-bit `s`, `m` (see [`scale_min_k4`]) and
/// 4-bit `q`. Each 32 bytes of `qs` hold 64 elements: 32 low nibbles, then 32 high nibbles.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct BlockQ4_K {
    pub d: F16Le,
    pub dmin: F16Le,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}

/// Q5_K: Q4_K with a fifth bit per element; bits `2i` and `2i + 1` of `qh[l]` extend the low and
/// high nibble of `qs[32i + l]`.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct BlockQ5_K {
    pub d: F16Le,
    pub dmin: F16Le,
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// Q6_K: 16 sub-blocks of 16, `y = d·s·(q − 32)` with signed 8-bit `s` and 6-bit `q`.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct BlockQ6_K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: F16Le,
}

/// Q8_K: `y = d·q` with an `f32` scale and per-16 sums of `q`; ggml's intermediate format for
/// k-quant dot products.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct BlockQ8_K {
    pub d: F32Le,
    pub qs: [i8; QK_K],
    pub bsums: [I16Le; QK_K / 16],
}

/// IQ4_NL: `y = d·KVALUES_IQ4NL[q]`, 4-bit `q`, nibbles as in Q4_0.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct BlockIQ4_NL {
    pub d: F16Le,
    pub qs: [u8; QK32 / 2],
}

/// IQ4_XS: 8 IQ4_NL sub-blocks of 32 sharing `d`, each scaled by a 6-bit `s − 32`: low four bits
/// in `scales_l` (nibble `ib % 2` of byte `ib / 2`), high two bits at `2·ib` in `scales_h`.
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct BlockIQ4_XS {
    pub d: F16Le,
    pub scales_h: U16Le,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);
const _: () = assert!(std::mem::size_of::<BlockQ2_K>() == 84);
const _: () = assert!(std::mem::size_of::<BlockQ3_K>() == 110);
const _: () = assert!(std::mem::size_of::<BlockQ4_K>() == 144);
const _: () = assert!(std::mem::size_of::<BlockQ5_K>() == 176);
const _: () = assert!(std::mem::size_of::<BlockQ6_K>() == 210);
const _: () = assert!(std::mem::size_of::<BlockQ8_K>() == 292);
const _: () = assert!(std::mem::size_of::<BlockIQ4_NL>() == 18);
const _: () = assert!(std::mem::size_of::<BlockIQ4_XS>() == 136);
const _: () = assert!(std::mem::align_of::<BlockQ8_K>() == 1);
const _: () = assert!(std::mem::align_of::<BlockIQ4_XS>() == 1);

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K or Q5_K block (ggml's
/// `get_scale_min_k4`). Sub-blocks 0..4 keep theirs in the low six bits of bytes `j` and `j + 4`;
/// sub-blocks 4..8 keep the low four bits in the nibbles of byte `j + 4` and the top two bits in
/// the spare top bits of bytes `j − 4` (scale) and `j` (min).
pub fn scale_min_k4(j: usize, scales: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_min_k4_unpacks_both_layouts() {
        // Sub-blocks 0..4: six low bits of bytes j and j + 4, top bits belong to 4..8.
        let mut s = [0u8; 12];
        s[1] = 0b10_101010; // scale 1 = 42, top bits 0b10 go to the scale of sub-block 5
        s[5] = 0b01_010101; // min 1 = 21, top bits 0b01 go to the min of sub-block 5
        s[9] = 0xC3; // sub-block 5: scale low nibble 3, min low nibble 12
        assert_eq!(scale_min_k4(1, &s), (42, 21));
        assert_eq!(scale_min_k4(5, &s), (0b10_0011, 0b01_1100));
        assert_eq!(scale_min_k4(0, &s), (0, 0));
        assert_eq!(scale_min_k4(4, &s), (0, 0));
    }

    #[test]
    fn little_endian_fields() {
        assert_eq!(F16Le([0x00, 0x3C]).to_f32(), 1.0);
        assert_eq!(F16Le([0x00, 0xB8]).to_f32(), -0.5);
        assert_eq!(F32Le([0x00, 0x00, 0x80, 0x3F]).get(), 1.0);
        assert_eq!(U16Le([0x34, 0x12]).get(), 0x1234);
        assert_eq!(I16Le([0xFE, 0xFF]).get(), -2);
        assert_eq!(I16Le::new(-300).get(), -300);
        assert_eq!(F16Le::from_f32(-2.0).0, [0x00, 0xC0]);
    }
}
