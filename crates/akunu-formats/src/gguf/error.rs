use std::path::PathBuf;

/// Why a GGUF file could not be read or written. Every variant names the part of the file at
/// fault, so a user can tell a truncated download from a corrupt or hostile file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("write failed: {0}")]
    Write(#[from] std::io::Error),
    #[error("not a GGUF file (magic {0:#010x}, expected 0x46554747 \"GGUF\")")]
    BadMagic(u32),
    #[error("GGUF version {0} is not supported (versions 2 and 3 are)")]
    UnsupportedVersion(u32),
    #[error("big-endian GGUF files are not supported")]
    BigEndian,
    #[error("file truncated in {what} at byte {offset}: needs {needed} bytes, {available} remain")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        available: u64,
    },
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 { what: String },
    #[error("metadata key {key:?} has unknown value type {code}")]
    BadValueType { key: String, code: u32 },
    #[error("metadata key {key:?} nests arrays deeper than {max}")]
    ArrayTooDeep { key: String, max: usize },
    #[error("metadata key {key:?} appears twice")]
    DuplicateKey { key: String },
    #[error("general.alignment must be a power of two u32, found {found}")]
    BadAlignment { found: String },
    #[error("tensor {name:?} appears twice")]
    DuplicateTensor { name: String },
    #[error("tensor {name:?}: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("tensor {name:?} has unknown ggml type code {code}")]
    UnknownTensorType { name: String, code: u32 },
    #[error("tensors {first:?} and {second:?} overlap in the data section")]
    OverlappingTensors { first: String, second: String },
    #[error("{0}")]
    Invalid(String),
}
