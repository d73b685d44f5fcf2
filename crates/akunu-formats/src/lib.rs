//! Model file formats: GGUF (read and write), safetensors and MLX quantized checkpoints.

pub use akunu_quant::GgmlType;
