//! MLX quantized checkpoints.
