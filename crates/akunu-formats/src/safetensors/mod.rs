//! safetensors checkpoints: single files and sharded directories.
//!
//! Plan:
//! - [`SafetensorsFile`] memory-maps one file, parses the JSON header and validates the whole layout
//!   before any tensor is handed out, so that every later access is an in-bounds slice of the map.
//! - [`TensorView`] is a zero-copy view (name, dtype, shape, bytes) with f32 conversion for the
//!   float dtypes and the small integer ones.
//! - [`Checkpoint`] opens a file, a directory or a `model.safetensors.index.json` and cross-checks
//!   the index against the shards (missing shards, tensors absent from their shard, duplicates).
//!
//! The layout rules are the Hugging Face reader's: offsets are relative to the data section, sorted
//! by offset they must tile it exactly (no overlap, no gap, no trailing bytes), and each tensor's
//! byte length must equal its element count times its dtype size. Validation is done here rather
//! than through the `safetensors` crate so that every error can name the offending file and tensor;
//! the tests check that both readers accept and reject the same files.

mod checkpoint;
mod dtype;
mod file;

use std::path::PathBuf;

pub use checkpoint::Checkpoint;
pub use dtype::{f8_e4m3_to_f32, f8_e5m2_to_f32, Dtype};
pub use file::{SafetensorsFile, TensorView, MAX_HEADER_LEN};

/// Everything that can go wrong while reading safetensors files. Each variant names the file and,
/// where one is involved, the tensor.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {len} bytes is too short for the 8-byte header length", path.display())]
    TooSmall { path: PathBuf, len: u64 },
    #[error("{}: header length {declared} runs past the {available} bytes that follow it", path.display())]
    HeaderPastEnd {
        path: PathBuf,
        declared: u64,
        available: u64,
    },
    #[error("{}: header length {declared} exceeds the {limit}-byte limit", path.display())]
    HeaderTooLarge {
        path: PathBuf,
        declared: u64,
        limit: u64,
    },
    #[error("{}: header is not UTF-8: {source}", path.display())]
    HeaderNotUtf8 {
        path: PathBuf,
        #[source]
        source: std::str::Utf8Error,
    },
    #[error("{}: malformed header: {source}", path.display())]
    HeaderJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: tensor `{tensor}` has unsupported dtype `{dtype}`", path.display())]
    UnsupportedDtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },
    #[error("{}: tensor `{tensor}`: the size of shape {shape:?} overflows", path.display())]
    ShapeOverflow {
        path: PathBuf,
        tensor: String,
        shape: Vec<u64>,
    },
    #[error("{}: tensor `{tensor}`: data_offsets [{start}, {end}] run backwards", path.display())]
    ReversedOffsets {
        path: PathBuf,
        tensor: String,
        start: u64,
        end: u64,
    },
    #[error(
        "{}: tensor `{tensor}`: data_offsets [{start}, {end}] exceed the {data_len}-byte data section",
        path.display()
    )]
    OffsetsOutOfBounds {
        path: PathBuf,
        tensor: String,
        start: u64,
        end: u64,
        data_len: u64,
    },
    #[error(
        "{}: tensor `{tensor}`: {dtype} {shape:?} needs {expected} bytes but its data_offsets span {actual}",
        path.display()
    )]
    SizeMismatch {
        path: PathBuf,
        tensor: String,
        dtype: Dtype,
        shape: Vec<u64>,
        expected: u64,
        actual: u64,
    },
    #[error("{}: tensors `{tensor}` and `{other}` overlap", path.display())]
    Overlap {
        path: PathBuf,
        tensor: String,
        other: String,
    },
    #[error("{}: bytes {start}..{end} of the data section belong to no tensor", path.display())]
    Gap { path: PathBuf, start: u64, end: u64 },
    #[error("{}: malformed index: {source}", path.display())]
    IndexJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: {len}-byte index exceeds the {limit}-byte limit", path.display())]
    IndexTooLarge { path: PathBuf, len: u64, limit: u64 },
    #[error(
        "{}: tensor `{tensor}` is mapped to `{shard}`, which is not a file name inside the index's directory",
        path.display()
    )]
    BadShardName {
        path: PathBuf,
        tensor: String,
        shard: String,
    },
    #[error("{}: shard {} does not exist", index.display(), shard.display())]
    MissingShard { index: PathBuf, shard: PathBuf },
    #[error("{}: tensor `{tensor}` is not in its shard {}", index.display(), shard.display())]
    MissingFromShard {
        index: PathBuf,
        tensor: String,
        shard: PathBuf,
    },
    #[error("tensor `{tensor}` is stored in both {} and {}", first.display(), second.display())]
    DuplicateTensor {
        tensor: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("{}: no model.safetensors.index.json and no model*.safetensors file", path.display())]
    NoWeights { path: PathBuf },
    #[error("{}: no tensor `{tensor}`", path.display())]
    TensorNotFound { path: PathBuf, tensor: String },
    #[error("tensor `{tensor}`: {dtype} values are not exactly representable as f32")]
    NotConvertible { tensor: String, dtype: Dtype },
}
