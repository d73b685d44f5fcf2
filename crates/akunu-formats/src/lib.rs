//! Model file formats: GGUF (read and write), safetensors and MLX quantized checkpoints.

pub mod gguf;
pub mod mlx;
pub mod safetensors;

pub use akunu_quant::GgmlType;
