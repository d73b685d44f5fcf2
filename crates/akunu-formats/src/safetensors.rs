//! safetensors checkpoints.
