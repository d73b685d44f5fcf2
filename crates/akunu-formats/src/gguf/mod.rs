//! GGUF files: a validating reader over a memory map, and a writer.
//!
//! Plan: the reader walks the header, the metadata and the tensor index once, checking every
//! count, length and offset against the bytes that remain (overflow-safe), and records where
//! each value lies instead of copying it. Metadata values are decoded on request from those
//! spans; tensor data is handed out as slices of the map. Nothing is allocated in proportion to
//! a count read from the file before the file is known to hold that many bytes, so a hostile
//! file costs at most a pass over its own bytes. Versions 2 and 3 (little-endian) are read;
//! version 1 and big-endian files are refused by name.
//!
//! Layout (all little-endian): magic `GGUF`, version u32, tensor count u64, KV count u64; the
//! KVs (string key, u32 value type, value); the tensor infos (string name, u32 n_dims, u64 dims,
//! u32 ggml type, u64 offset relative to the data section); zero padding up to
//! `general.alignment` (default 32); the data section.

mod cursor;
mod error;
mod reader;
mod value;
mod writer;

pub use error::GgufError;
pub use reader::{GgufFile, TensorInfo};
pub use value::{Array, MetaArray, MetaValue, Value, ValueType};
pub use writer::GgufWriter;

/// `"GGUF"` read as a little-endian u32.
pub const GGUF_MAGIC: u32 = 0x4655_4747;
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml keeps at most four dimensions per tensor.
pub const MAX_DIMS: usize = 4;
/// Arrays of arrays deeper than this are refused: real files nest at most once, and a bound
/// keeps a hostile file from exhausting the stack.
pub const MAX_ARRAY_DEPTH: usize = 8;
