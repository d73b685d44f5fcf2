//! GGUF files: reader and writer.
