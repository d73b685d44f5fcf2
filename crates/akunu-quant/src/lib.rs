//! ggml tensor types and their block formats.
//!
//! Every supported quantized type has a `#[repr(C)]` block struct laid out exactly as ggml's
//! `ggml-common.h` (not as the book describes some of them), a reference dequantizer to `f32`
//! and, where ggml has one, a reference quantizer. These are the oracles the CPU and GPU kernels
//! are tested against, so they favour exactness over speed.

mod types;

pub use types::GgmlType;
