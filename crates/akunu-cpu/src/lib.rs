//! The CPU backend: the plan executed over memory-mapped weights with SIMD quantized dot
//! products on a rayon pool. It is also the numerical reference the GPU kernels are tested
//! against.

pub mod backend;
pub mod flash;
mod multiversion;
pub mod ops;
pub mod quant;

pub use backend::{CpuBackend, CpuOptions};
