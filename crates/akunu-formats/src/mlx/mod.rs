//! MLX quantized checkpoints (affine mode, as written by mlx-lm).
//!
//! Plan:
//! - [`QuantConfig`] reads `quantization` / `quantization_config` from `config.json`, including
//!   per-module overrides and `false` entries.
//! - [`MlxModel`] opens the directory's safetensors weights through
//!   [`Checkpoint`](crate::safetensors::Checkpoint) and treats every `<module>.scales` as marking a
//!   quantized module with `<module>.weight` (U32 codes) and `<module>.biases`; dtypes and shapes
//!   are checked against the module's parameters at open.
//! - [`unpack_codes`] and [`dequantize_row`] are the reference decoding: MLX packs each row's codes
//!   as one LSB-first bit stream (3-bit: 8 codes per 3 bytes, 5-bit: 8 per 5, 6-bit: 4 per 3), and
//!   `w = scale * q + bias` is rounded in the scale dtype exactly as MLX's CPU kernel does, so the
//!   results match `mx.dequantize` bit for bit.

mod config;
mod model;
mod pack;

pub use config::{ConfigError, QuantConfig};
pub use model::{Error, MlxModel, QuantizedTensor};
pub use pack::{
    dequantize_row, unpack_codes, QuantParams, ScaleDtype, SUPPORTED_BITS, SUPPORTED_GROUP_SIZES,
};
