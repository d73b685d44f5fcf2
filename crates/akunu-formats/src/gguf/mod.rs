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

/// Element count and byte size of a tensor, or why the shape is invalid. Reader and writer share
/// it, so a written file always reads back. As in ggml, every dimension and every partial product
/// must fit in an i64 (a zero dimension counts as one for that check, so a later dimension cannot
/// overflow a product that a zero would hide), and the innermost dimension must hold whole blocks.
pub(crate) fn tensor_extent(ty: akunu_quant::GgmlType, dims: &[u64]) -> Result<(u64, u64), String> {
    if dims.len() > MAX_DIMS {
        return Err(format!(
            "{} dimensions, at most {MAX_DIMS} allowed",
            dims.len()
        ));
    }
    dims.iter()
        .try_fold(1u64, |acc, &d| {
            acc.checked_mul(d.max(1)).filter(|&n| n <= i64::MAX as u64)
        })
        .ok_or_else(|| format!("element count of dimensions {dims:?} overflows"))?;
    let n_elements: u64 = dims.iter().product();
    let ne0 = dims.first().copied().unwrap_or(1);
    let block = ty.block_size() as u64;
    if ne0 % block != 0 {
        return Err(format!(
            "first dimension {ne0} is not a multiple of the {ty} block size {block}"
        ));
    }
    let n_bytes = ty
        .bytes_for(n_elements)
        .ok_or_else(|| format!("size of {n_elements} {ty} elements overflows"))?;
    Ok((n_elements, n_bytes))
}
