//! The ggml tensor type enum as stored in GGUF files (`ggml.h` codes), with each type's block
//! geometry. Every code ggml has ever assigned a live type is recognised, so a file that uses an
//! exotic type is described precisely ("unsupported tensor type IQ2_XXS") instead of rejected as
//! garbage; `is_supported` says which ones this crate can dequantize.

use std::fmt;

macro_rules! ggml_types {
    ($( $variant:ident = $code:literal, $name:literal, $block:literal, $bytes:literal, $supported:literal; )*) => {
        /// A ggml tensor element type. Discriminants are the on-disk GGUF codes.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u32)]
        #[allow(non_camel_case_types)]
        pub enum GgmlType {
            $( $variant = $code, )*
        }

        impl GgmlType {
            /// Every type this crate recognises, in code order.
            pub const ALL: &'static [GgmlType] = &[$( GgmlType::$variant, )*];

            /// The type for a GGUF code, or `None` for a code ggml never used or has removed.
            pub fn from_code(code: u32) -> Option<Self> {
                match code {
                    $( $code => Some(GgmlType::$variant), )*
                    _ => None,
                }
            }

            /// ggml's name for the type (`"Q4_K"`, `"F16"`, ...).
            pub fn name(self) -> &'static str {
                match self { $( GgmlType::$variant => $name, )* }
            }

            /// Elements per block (1 for plain types).
            pub fn block_size(self) -> usize {
                match self { $( GgmlType::$variant => $block, )* }
            }

            /// Bytes per block.
            pub fn type_size(self) -> usize {
                match self { $( GgmlType::$variant => $bytes, )* }
            }

            /// Whether this crate has a reference dequantizer for the type.
            pub fn is_supported(self) -> bool {
                match self { $( GgmlType::$variant => $supported, )* }
            }
        }
    };
}

ggml_types! {
    F32 = 0, "F32", 1, 4, true;
    F16 = 1, "F16", 1, 2, true;
    Q4_0 = 2, "Q4_0", 32, 18, true;
    Q4_1 = 3, "Q4_1", 32, 20, true;
    Q5_0 = 6, "Q5_0", 32, 22, true;
    Q5_1 = 7, "Q5_1", 32, 24, true;
    Q8_0 = 8, "Q8_0", 32, 34, true;
    Q8_1 = 9, "Q8_1", 32, 36, true;
    Q2_K = 10, "Q2_K", 256, 84, true;
    Q3_K = 11, "Q3_K", 256, 110, true;
    Q4_K = 12, "Q4_K", 256, 144, true;
    Q5_K = 13, "Q5_K", 256, 176, true;
    Q6_K = 14, "Q6_K", 256, 210, true;
    Q8_K = 15, "Q8_K", 256, 292, true;
    IQ2_XXS = 16, "IQ2_XXS", 256, 66, false;
    IQ2_XS = 17, "IQ2_XS", 256, 74, false;
    IQ3_XXS = 18, "IQ3_XXS", 256, 98, false;
    IQ1_S = 19, "IQ1_S", 256, 50, false;
    IQ4_NL = 20, "IQ4_NL", 32, 18, true;
    IQ3_S = 21, "IQ3_S", 256, 110, false;
    IQ2_S = 22, "IQ2_S", 256, 82, false;
    IQ4_XS = 23, "IQ4_XS", 256, 136, true;
    I8 = 24, "I8", 1, 1, true;
    I16 = 25, "I16", 1, 2, true;
    I32 = 26, "I32", 1, 4, true;
    I64 = 27, "I64", 1, 8, true;
    F64 = 28, "F64", 1, 8, true;
    IQ1_M = 29, "IQ1_M", 256, 56, false;
    BF16 = 30, "BF16", 1, 2, true;
    TQ1_0 = 34, "TQ1_0", 256, 54, false;
    TQ2_0 = 35, "TQ2_0", 256, 66, false;
    MXFP4 = 39, "MXFP4", 32, 17, false;
    NVFP4 = 40, "NVFP4", 64, 36, false;
    Q1_0 = 41, "Q1_0", 128, 18, false;
}

impl GgmlType {
    /// The type with ggml's name, case-insensitively (`"q4_k"` finds `Q4_K`).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Bytes taken by `n_elements` elements, or `None` when `n_elements` is not a whole number of
    /// blocks or the size overflows `u64`.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let block = self.block_size() as u64;
        if !n_elements.is_multiple_of(block) {
            return None;
        }
        (n_elements / block).checked_mul(self.type_size() as u64)
    }

    /// True for types stored in blocks of more than one element.
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_removed_codes_are_unknown() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_code(t as u32), Some(t));
            assert_eq!(GgmlType::from_name(&t.name().to_lowercase()), Some(t));
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 42, 1000] {
            assert_eq!(GgmlType::from_code(removed), None);
        }
    }

    #[test]
    fn byte_sizes_match_ggml_and_reject_partial_blocks() {
        assert_eq!(GgmlType::Q4_0.bytes_for(4096 * 4096), Some(9_437_184));
        assert_eq!(GgmlType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4_K.bytes_for(300), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
    }
}
