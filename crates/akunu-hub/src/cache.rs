//! On-disk cache bookkeeping.
//!
//! Layout next to every cached file `F`:
//! - `F.meta.json`: `{"sha256": ..., "size": ...}` recorded after the content
//!   was verified, so a later lookup can trust `F` without re-hashing it.
//!   Written (through `F.meta.json.tmp`) only by the holder of `F.lock`.
//! - `F.partial`: an unfinished download, renamed to `F` only once verified,
//!   so `F` itself is never half-written. `F.partial.validator` keeps the
//!   `If-Range` validator of that download.
//! - `F.lock`: an advisory lock held for the whole fetch, so two processes
//!   asking for the same model neither interleave writes nor download twice.
//!   Lock files are left in place: deleting them would race with a process
//!   that has just opened one.
//!
//! Because these names are derived from `F`'s, a cached file must not itself
//! be called like one of them: [`reserved_suffix`] tells callers which names
//! to refuse.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::HubError;

/// Suffix of an unfinished download.
pub(crate) const PARTIAL: &str = ".partial";
const META: &str = ".meta.json";
const META_TMP: &str = ".meta.json.tmp";
/// Appended to the partial file's name, not the cached file's.
const VALIDATOR: &str = ".validator";
const LOCK: &str = ".lock";

/// The bookkeeping suffix `name` ends with, if any. A cached file with such a
/// name would share its path with another file's sidecar, partial download or
/// lock, and the two would overwrite each other.
pub(crate) fn reserved_suffix(name: &str) -> Option<&'static str> {
    [META, META_TMP, PARTIAL, VALIDATOR, LOCK]
        .into_iter()
        .find(|suffix| name.ends_with(suffix))
}

/// Path with `suffix` appended to the file name (`a.gguf` → `a.gguf.partial`).
pub(crate) fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

pub(crate) fn create_dir_all(dir: &Path) -> Result<(), HubError> {
    fs::create_dir_all(dir).map_err(|e| HubError::io(dir, e))
}

/// Remove a file, treating "already gone" as success.
pub(crate) fn remove_if_exists(path: &Path) -> Result<(), HubError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(HubError::io(path, e)),
    }
}

/// Where the `If-Range` validator of a `.partial` download is kept.
pub(crate) fn validator_path(partial: &Path) -> PathBuf {
    sibling(partial, VALIDATOR)
}

/// Length of `path`, or `None` if it does not exist.
pub(crate) fn file_len(path: &Path) -> Result<Option<u64>, HubError> {
    match fs::metadata(path) {
        Ok(m) => Ok(Some(m.len())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(HubError::io(path, e)),
    }
}

/// Lowercase hex sha256 of a whole file.
pub(crate) fn sha256_file(path: &Path) -> Result<String, HubError> {
    let mut file = File::open(path).map_err(|e| HubError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| HubError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Normalise a user-supplied digest to lowercase hex, rejecting anything else.
pub(crate) fn normalize_sha256(s: &str) -> Result<String, HubError> {
    let t = s.trim();
    if t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(t.to_ascii_lowercase())
    } else {
        Err(HubError::BadSha256(s.to_string()))
    }
}

/// What we remember about a verified cached file.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
struct Meta {
    sha256: String,
    size: u64,
}

fn meta_path(path: &Path) -> PathBuf {
    sibling(path, META)
}

fn read_meta(path: &Path) -> Option<Meta> {
    // A missing or unreadable sidecar only costs a re-hash, so errors are
    // deliberately treated as "no record".
    let text = fs::read(meta_path(path)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Record that `path` holds content with this digest and size. Only the
/// holder of the [`CacheLock`] guarding `path` (its own, or the model's for
/// the files of a chunked fetch) may call this: a sidecar written by anyone
/// else could vouch for content that the lock holder has just replaced.
pub(crate) fn write_meta(path: &Path, sha256: &str, size: u64) -> Result<(), HubError> {
    let meta = Meta {
        sha256: sha256.to_string(),
        size,
    };
    let target = meta_path(path);
    let tmp = sibling(path, META_TMP);
    let text = serde_json::to_vec(&meta).unwrap_or_default();
    fs::write(&tmp, text).map_err(|e| HubError::io(&tmp, e))?;
    fs::rename(&tmp, &target).map_err(|e| HubError::io(&target, e))
}

/// Move verified content from `partial` into place as `dest` and record it.
///
/// The old sidecar goes first: between the rename and the new sidecar, `dest`
/// is merely unrecorded (a later check re-hashes it) instead of being vouched
/// for by the digest of the content it replaced.
pub(crate) fn install(
    partial: &Path,
    dest: &Path,
    sha256: &str,
    size: u64,
) -> Result<(), HubError> {
    remove_if_exists(&meta_path(dest))?;
    fs::rename(partial, dest).map_err(|e| HubError::io(dest, e))?;
    write_meta(dest, sha256, size)
}

/// Verify a finished `.partial` download and move it into place as `dest`.
///
/// On a digest mismatch the partial file is deleted (a resume would only
/// extend bad data) and `ShaMismatch` names `dest`, the file the caller asked
/// for. Without an expected digest the content is still hashed so the
/// sidecar lets later lookups skip hashing.
pub(crate) fn commit(partial: &Path, dest: &Path, expected: Option<&str>) -> Result<(), HubError> {
    let actual = sha256_file(partial)?;
    let validator = validator_path(partial);
    if let Some(want) = expected {
        if want != actual {
            remove_if_exists(partial)?;
            remove_if_exists(&validator)?;
            return Err(HubError::ShaMismatch {
                path: dest.to_path_buf(),
                expected: want.to_string(),
                actual,
            });
        }
    }
    let size = file_len(partial)?.unwrap_or(0);
    install(partial, dest, &actual, size)?;
    remove_if_exists(&validator)
}

/// Remove a cached file together with its sidecar.
pub(crate) fn remove_cached(path: &Path) -> Result<(), HubError> {
    remove_if_exists(path)?;
    remove_if_exists(&meta_path(path))
}

/// A cached file as its sidecar describes it.
struct Found {
    len: u64,
    /// The recorded digest, if there is a sidecar.
    recorded: Option<String>,
    /// The sidecar alone is enough to accept the file (see [`is_cached`]).
    agrees: bool,
}

/// `None` when `path` is missing, not a file, or not the size its sidecar
/// records.
fn inspect(path: &Path, expected: Option<&str>) -> Result<Option<Found>, HubError> {
    let Some(len) = file_len(path)? else {
        return Ok(None);
    };
    if !path.is_file() {
        return Ok(None);
    }
    let meta = read_meta(path);
    if meta.as_ref().is_some_and(|m| m.size != len) {
        return Ok(None);
    }
    let recorded = meta.map(|m| m.sha256);
    let agrees = match (expected, recorded.as_deref()) {
        (Some(e), Some(r)) => e == r,
        (Some(_), None) => false,
        (None, _) => true,
    };
    Ok(Some(Found {
        len,
        recorded,
        agrees,
    }))
}

/// Is `path` a usable cached copy on its sidecar's word alone? Never hashes
/// and never writes, so it needs no lock; `false` only means that
/// [`is_cached`] has to look closer.
pub(crate) fn is_recorded(path: &Path, expected: Option<&str>) -> Result<bool, HubError> {
    Ok(inspect(path, expected)?.is_some_and(|found| found.agrees))
}

/// Is `path` a usable cached copy? Must be called while holding the
/// [`CacheLock`] guarding `path`, since it may write the sidecar.
///
/// - With an `expected` digest: the sidecar must record that digest and the
///   current size; otherwise the file is re-hashed once (and the sidecar
///   refreshed on success).
/// - Without one: existence is enough, unless the sidecar's size disagrees.
/// - `verify` forces a re-hash against the best known digest.
///
/// Never deletes the file itself: a stale file is simply replaced by the
/// next successful download's atomic rename.
pub(crate) fn is_cached(
    path: &Path,
    expected: Option<&str>,
    verify: bool,
) -> Result<bool, HubError> {
    let Some(found) = inspect(path, expected)? else {
        return Ok(false);
    };
    if found.agrees && !verify {
        return Ok(true);
    }
    let actual = sha256_file(path)?;
    match expected.or(found.recorded.as_deref()) {
        Some(want) if want != actual => Ok(false),
        _ => {
            write_meta(path, &actual, found.len)?;
            Ok(true)
        }
    }
}

/// An exclusive advisory lock on `<path>.lock`, released on drop.
pub(crate) struct CacheLock {
    _file: File,
}

impl CacheLock {
    /// Take the lock, calling `on_wait` once if another process holds it.
    pub(crate) fn acquire(path: &Path, on_wait: impl FnOnce()) -> Result<Self, HubError> {
        let lock_path = sibling(path, LOCK);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| HubError::io(&lock_path, e))?;
        // Called through the trait path: newer std has inherent methods with
        // the same names, and the inherent ones would shadow these.
        match fs4::FileExt::try_lock(&file) {
            Ok(()) => {}
            Err(fs4::TryLockError::WouldBlock) => {
                on_wait();
                fs4::FileExt::lock(&file).map_err(|e| HubError::io(&lock_path, e))?;
            }
            Err(fs4::TryLockError::Error(e)) => return Err(HubError::io(&lock_path, e)),
        }
        Ok(CacheLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha_normalisation() {
        let up = "A5FD3B62230AA5EC60212297DC9D20EAA70578AC519E00D93A17E44C087A6818";
        assert_eq!(normalize_sha256(up).unwrap(), up.to_ascii_lowercase());
        assert!(normalize_sha256("abc").is_err());
        assert!(normalize_sha256(&"g".repeat(64)).is_err());
    }

    #[test]
    fn cached_checks() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("m.bin");
        assert!(!is_cached(&f, None, false).unwrap());
        fs::write(&f, b"hello").unwrap();
        let sha = sha256_file(&f).unwrap();
        assert_eq!(
            sha,
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        // No sidecar and no digest: existence is enough.
        assert!(is_cached(&f, None, false).unwrap());
        // Wrong digest: not cached, and the file is left alone.
        assert!(!is_cached(&f, Some(&"0".repeat(64)), false).unwrap());
        assert!(f.exists());
        // Right digest: re-hashed once, then recorded.
        assert!(is_cached(&f, Some(&sha), false).unwrap());
        assert_eq!(read_meta(&f).unwrap().sha256, sha);
        // A changed size is noticed through the sidecar without hashing.
        fs::write(&f, b"hello!").unwrap();
        assert!(!is_cached(&f, None, false).unwrap());
    }

    #[test]
    fn replacing_a_file_drops_its_sidecar_first() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("m.bin");
        let partial = sibling(&dest, PARTIAL);
        fs::write(&partial, b"new content").unwrap();
        // A directory in the way makes the rename fail, stopping the commit
        // between its steps: the old sidecar must already be gone by then,
        // or it would vouch for whatever ends up at `dest`.
        fs::create_dir(&dest).unwrap();
        write_meta(&dest, &"0".repeat(64), 11).unwrap();
        assert!(commit(&partial, &dest, None).is_err());
        assert!(read_meta(&dest).is_none());
    }

    #[test]
    fn reserved_names() {
        for name in [
            "a.meta.json",
            "a.meta.json.tmp",
            "a.partial",
            "a.partial.validator",
            "a.lock",
        ] {
            assert!(reserved_suffix(name).is_some(), "{name}");
        }
        for name in ["a.gguf", "meta.json.gguf", "a.locked", "partial"] {
            assert_eq!(reserved_suffix(name), None, "{name}");
        }
    }

    #[test]
    fn lock_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("m.bin");
        let first = CacheLock::acquire(&f, || {}).unwrap();
        drop(first);
        let mut waited = false;
        let _second = CacheLock::acquire(&f, || waited = true).unwrap();
        assert!(!waited);
    }
}
