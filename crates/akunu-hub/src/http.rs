//! HTTP transfers: resumable downloads, JSON fetches, retries.
//!
//! Redirects are followed by hand rather than by the client because
//! Hugging Face puts the file's sha256 (`X-Linked-Etag`) on the redirect
//! response, which an automatic redirect would hide, and because the bearer
//! token must only go to the host it was meant for.
//!
//! A download appends to `<file>.partial`. A retry or a later run asks for the
//! rest with `Range`, guarded by `If-Range` with the validator (`ETag` or
//! `Last-Modified`) saved when the transfer first started, so a file that
//! changed on the server is restarted instead of silently spliced. Without a
//! saved validator a resume is only attempted when the caller will check the
//! result against a known sha256 (a splice then fails that check); otherwise
//! the download starts over. A server that ignores `Range` answers 200 and the
//! partial file is simply truncated.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use serde::de::DeserializeOwned;
use ureq::http::{HeaderMap, Response, Uri};
use ureq::Body;

use crate::cache::{file_len, remove_if_exists, validator_path};
use crate::error::HubError;
use crate::progress::Progress;

const MAX_REDIRECTS: usize = 10;
/// First retry delay; doubled on each further attempt.
const RETRY_BASE_DELAY: Duration = Duration::from_millis(500);
const RETRY_MAX_DELAY: Duration = Duration::from_secs(8);
/// Package index answers are small; this only guards against a runaway body.
const JSON_LIMIT: u64 = 64 << 20;
const COPY_BUF: usize = 256 << 10;

/// Connection settings taken from [`crate::FetchOptions`].
pub(crate) struct ClientConfig {
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub retries: u32,
}

/// A failed attempt, and whether trying again could help.
struct Failed {
    error: HubError,
    transient: bool,
}

impl From<HubError> for Failed {
    fn from(error: HubError) -> Self {
        Failed {
            error,
            transient: false,
        }
    }
}

fn transient(error: HubError) -> Failed {
    Failed {
        error,
        transient: true,
    }
}

fn network_error(url: &str, e: ureq::Error) -> Failed {
    let retry = matches!(
        e,
        ureq::Error::Io(_)
            | ureq::Error::Timeout(_)
            | ureq::Error::HostNotFound
            | ureq::Error::ConnectionFailed
            | ureq::Error::Protocol(_)
    );
    Failed {
        error: HubError::Network {
            url: url.to_string(),
            source: Box::new(e),
        },
        transient: retry,
    }
}

fn status_error(url: &str, status: u16) -> Failed {
    Failed {
        error: HubError::HttpStatus {
            status,
            url: url.to_string(),
            hint: String::new(),
        },
        transient: status >= 500 || status == 408 || status == 429,
    }
}

/// The final (non-redirect) response of a request.
struct Reply {
    url: String,
    response: Response<Body>,
    /// A sha256 advertised by the server through `X-Linked-Etag` or `ETag`
    /// on any hop of the redirect chain.
    etag_sha256: Option<String>,
}

impl Reply {
    fn status(&self) -> u16 {
        self.response.status().as_u16()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.response.headers().get(name)?.to_str().ok()
    }

    fn content_length(&self) -> Option<u64> {
        self.header("content-length")?.trim().parse().ok()
    }
}

/// Result of a completed download into a `.partial` file.
pub(crate) struct Downloaded {
    /// See [`Reply::etag_sha256`].
    pub etag_sha256: Option<String>,
}

pub(crate) struct Client {
    agent: ureq::Agent,
    retries: u32,
}

impl Client {
    pub(crate) fn new(cfg: &ClientConfig) -> Self {
        // The platform verifier reads the system trust store (honouring
        // SSL_CERT_FILE / SSL_CERT_DIR), which is what proxies and mirrors
        // with private CAs rely on.
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::PlatformVerifier)
            .build();
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_connect(Some(cfg.connect_timeout))
            // A per-read limit, not a total one: a 250 MB download may take
            // minutes, but a silent connection should not hang forever.
            .timeout_per_read(Some(cfg.read_timeout))
            .user_agent(concat!("akunu/", env!("CARGO_PKG_VERSION")))
            .tls_config(tls)
            .build()
            .new_agent();
        Client {
            agent,
            retries: cfg.retries,
        }
    }

    /// GET `url`, following redirects by hand. `bearer` is only sent to the
    /// scheme and host of the original URL.
    fn send(
        &self,
        url: &str,
        bearer: Option<&str>,
        headers: &[(&str, String)],
    ) -> Result<Reply, Failed> {
        let origin = origin_of(url);
        let mut current = url.to_string();
        let mut linked = None;
        let mut plain = None;
        for _ in 0..=MAX_REDIRECTS {
            let mut req = self.agent.get(&current);
            for (name, value) in headers {
                req = req.header(*name, value);
            }
            if let Some(token) = bearer {
                if origin.is_some() && origin_of(&current) == origin {
                    req = req.header("Authorization", format!("Bearer {token}"));
                }
            }
            let response = req.call().map_err(|e| network_error(&current, e))?;
            let hdrs = response.headers();
            linked = linked.or_else(|| sha_from_etag(hdrs, "x-linked-etag"));
            plain = plain.or_else(|| sha_from_etag(hdrs, "etag"));
            let status = response.status().as_u16();
            if matches!(status, 301 | 302 | 303 | 307 | 308) {
                let location = hdrs
                    .get("location")
                    .and_then(|v| v.to_str().ok())
                    .ok_or_else(|| HubError::BadResponse {
                        url: current.clone(),
                        reason: format!("HTTP {status} without a Location header"),
                    })?;
                current = join_url(&current, location).ok_or_else(|| HubError::BadResponse {
                    url: current.clone(),
                    reason: format!("unusable Location {location:?}"),
                })?;
                continue;
            }
            return Ok(Reply {
                url: current,
                response,
                etag_sha256: linked.or(plain),
            });
        }
        Err(HubError::BadResponse {
            url: url.to_string(),
            reason: format!("more than {MAX_REDIRECTS} redirects"),
        }
        .into())
    }

    /// Run `attempt` until it succeeds, fails for good, or retries run out.
    /// `state` is handed to both closures so that an attempt can update the
    /// progress display that `note` also writes to.
    fn retrying<S, T>(
        &self,
        state: &mut S,
        note: impl Fn(&S, &str),
        mut attempt: impl FnMut(&mut S) -> Result<T, Failed>,
    ) -> Result<T, HubError> {
        let mut tries = 0;
        loop {
            match attempt(state) {
                Ok(v) => return Ok(v),
                Err(f) if f.transient && tries < self.retries => {
                    tries += 1;
                    let delay = RETRY_BASE_DELAY
                        .saturating_mul(1 << (tries - 1).min(16))
                        .min(RETRY_MAX_DELAY);
                    note(
                        state,
                        &format!(
                            "{}; retrying in {:.1}s ({tries}/{})",
                            f.error,
                            delay.as_secs_f64(),
                            self.retries
                        ),
                    );
                    std::thread::sleep(delay);
                }
                Err(f) => return Err(f.error),
            }
        }
    }

    /// GET a JSON document.
    pub(crate) fn get_json<T: DeserializeOwned>(
        &self,
        url: &str,
        note: &dyn Fn(&str),
    ) -> Result<T, HubError> {
        self.retrying(
            &mut (),
            |_, msg| note(msg),
            |_| {
                let mut reply = self.send(url, None, &[])?;
                if reply.status() != 200 {
                    return Err(status_error(&reply.url, reply.status()));
                }
                let bytes = reply
                    .response
                    .body_mut()
                    .with_config()
                    .limit(JSON_LIMIT)
                    .read_to_vec()
                    .map_err(|e| network_error(&reply.url, e))?;
                serde_json::from_slice(&bytes).map_err(|e| {
                    HubError::BadIndex {
                        url: url.to_string(),
                        reason: format!("invalid JSON: {e}"),
                    }
                    .into()
                })
            },
        )
    }

    /// Download `url` into `partial`, resuming whatever is already there.
    /// The caller verifies and renames the result; `digest_known` says that
    /// it will check a sha256 it knows already (see the module docs).
    pub(crate) fn download(
        &self,
        url: &str,
        bearer: Option<&str>,
        partial: &Path,
        digest_known: bool,
        progress: &mut Progress,
    ) -> Result<Downloaded, HubError> {
        self.retrying(progress, Progress::note, |progress| {
            self.attempt_download(url, bearer, partial, digest_known, progress)
        })
    }

    fn attempt_download(
        &self,
        url: &str,
        bearer: Option<&str>,
        partial: &Path,
        digest_known: bool,
        progress: &mut Progress,
    ) -> Result<Downloaded, Failed> {
        let vpath = validator_path(partial);
        let mut offset = file_len(partial)?.unwrap_or(0);
        let saved = fs::read_to_string(&vpath)
            .ok()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty());
        if offset > 0 && saved.is_none() && !digest_known {
            // Nothing could tell whether the server's file is still the one
            // the partial bytes came from. Asking from byte 0 makes the
            // answer overwrite them.
            progress.note("cannot tell whether the file changed; restarting from the beginning");
            offset = 0;
        }
        let mut headers = Vec::new();
        if offset > 0 {
            headers.push(("Range", format!("bytes={offset}-")));
            if let Some(v) = saved {
                headers.push(("If-Range", v));
            }
        }
        let reply = self.send(url, bearer, &headers)?;
        let etag_sha256 = reply.etag_sha256.clone();
        let (file, start, total) = match reply.status() {
            206 => {
                let (start, total) = reply
                    .header("content-range")
                    .and_then(parse_content_range)
                    .unwrap_or((u64::MAX, None));
                if start != offset {
                    // A range we did not ask for: start over on the next try.
                    remove_if_exists(partial)?;
                    return Err(transient(HubError::BadResponse {
                        url: reply.url.clone(),
                        reason: format!("asked for bytes from {offset}, got a different range"),
                    }));
                }
                let total = match (total, reply.content_length()) {
                    (Some(total), _) => Some(total),
                    (None, Some(n)) => {
                        Some(n.checked_add(offset).ok_or_else(|| HubError::BadResponse {
                            url: reply.url.clone(),
                            reason: format!("Content-Length {n} past byte {offset} overflows"),
                        })?)
                    }
                    (None, None) => None,
                };
                let file = if offset == 0 {
                    // Not asked for a range, yet one from byte 0: as good as
                    // a 200.
                    start_fresh(partial, &vpath, reply.response.headers())?
                } else {
                    OpenOptions::new()
                        .append(true)
                        .open(partial)
                        .map_err(|e| HubError::io(partial, e))?
                };
                (file, offset, total)
            }
            200 => {
                if offset > 0 {
                    progress.note("server sent the whole file; restarting from the beginning");
                }
                let file = start_fresh(partial, &vpath, reply.response.headers())?;
                (file, 0, reply.content_length())
            }
            416 if offset > 0 => {
                let remote_len = reply
                    .header("content-range")
                    .and_then(|v| v.trim().strip_prefix("bytes */"))
                    .and_then(|n| n.trim().parse::<u64>().ok());
                if remote_len == Some(offset) {
                    // Everything had already arrived before the interruption.
                    progress.begin_file(Some(offset), offset);
                    return Ok(Downloaded { etag_sha256 });
                }
                remove_if_exists(partial)?;
                return self.attempt_download(url, bearer, partial, digest_known, progress);
            }
            status => return Err(status_error(&reply.url, status)),
        };
        progress.begin_file(total, start);
        let written = copy_body(reply, file, partial, progress)?;
        let got = start + written;
        if let Some(expected) = total {
            if got != expected {
                return Err(transient(HubError::Truncated {
                    url: url.to_string(),
                    got,
                    expected,
                }));
            }
        }
        Ok(Downloaded { etag_sha256 })
    }
}

/// Truncate `partial` for a download from byte 0 and keep the reply's
/// validator (or drop a stale one) for resuming it.
fn start_fresh(partial: &Path, vpath: &Path, headers: &HeaderMap) -> Result<File, HubError> {
    let file = File::create(partial).map_err(|e| HubError::io(partial, e))?;
    match validator(headers) {
        Some(v) => fs::write(vpath, v).map_err(|e| HubError::io(vpath, e))?,
        None => remove_if_exists(vpath)?,
    }
    Ok(file)
}

/// Stream the body into `file`, keeping read (network) and write (disk)
/// failures apart because only the former is worth retrying.
fn copy_body(
    reply: Reply,
    mut file: File,
    path: &Path,
    progress: &mut Progress,
) -> Result<u64, Failed> {
    let url = reply.url;
    let mut reader = reply.response.into_body().into_reader();
    let mut buf = vec![0u8; COPY_BUF];
    let mut written = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // What arrived so far stays in the file for the next attempt.
            Err(e) => return Err(network_error(&url, ureq::Error::from(e))),
        };
        file.write_all(&buf[..n])
            .map_err(|e| HubError::io(path, e))?;
        written += n as u64;
        progress.advance(n as u64);
    }
    file.sync_all().map_err(|e| HubError::io(path, e))?;
    Ok(written)
}

/// `bytes START-END/TOTAL` → `(START, Some(TOTAL))`; `TOTAL` may be `*`.
fn parse_content_range(v: &str) -> Option<(u64, Option<u64>)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (start, _end) = range.split_once('-')?;
    let start = start.trim().parse().ok()?;
    let total = total.trim().parse().ok();
    Some((start, total))
}

/// The value to send back in `If-Range`: a strong `ETag`, else `Last-Modified`.
fn validator(headers: &HeaderMap) -> Option<String> {
    let get = |name| headers.get(name).and_then(|v| v.to_str().ok());
    match get("etag") {
        Some(etag) if !etag.starts_with("W/") => Some(etag.to_string()),
        _ => get("last-modified").map(str::to_string),
    }
}

/// A header value that is a quoted or bare 64-digit hex sha256.
fn sha_from_etag(headers: &HeaderMap, name: &str) -> Option<String> {
    let v = headers.get(name)?.to_str().ok()?.trim();
    let v = v.strip_prefix("W/").unwrap_or(v).trim_matches('"');
    (v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit())).then(|| v.to_ascii_lowercase())
}

/// `scheme://authority` of a URL, used to keep the bearer token on its host.
fn origin_of(url: &str) -> Option<String> {
    let uri: Uri = url.parse().ok()?;
    Some(format!(
        "{}://{}",
        uri.scheme_str()?.to_ascii_lowercase(),
        uri.authority()?.as_str().to_ascii_lowercase()
    ))
}

/// Resolve a `Location` header against the URL it came from.
fn join_url(base: &str, location: &str) -> Option<String> {
    let location = location.trim();
    if location.starts_with("http://") || location.starts_with("https://") {
        return Some(location.to_string());
    }
    let uri: Uri = base.parse().ok()?;
    let scheme = uri.scheme_str()?;
    let authority = uri.authority()?.as_str();
    if let Some(rest) = location.strip_prefix("//") {
        return Some(format!("{scheme}://{rest}"));
    }
    if location.starts_with('/') {
        return Some(format!("{scheme}://{authority}{location}"));
    }
    let path = uri.path();
    let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
    let dir = if dir.is_empty() { "/" } else { dir };
    Some(format!("{scheme}://{authority}{dir}{location}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range() {
        assert_eq!(parse_content_range("bytes 10-19/20"), Some((10, Some(20))));
        assert_eq!(parse_content_range("bytes 10-19/*"), Some((10, None)));
        assert_eq!(parse_content_range("items 1-2/3"), None);
    }

    #[test]
    fn joining() {
        let base = "https://h.example/a/b/c?x=1";
        assert_eq!(join_url(base, "https://o/x").unwrap(), "https://o/x");
        assert_eq!(join_url(base, "//cdn/x").unwrap(), "https://cdn/x");
        assert_eq!(join_url(base, "/r/x").unwrap(), "https://h.example/r/x");
        assert_eq!(join_url(base, "d").unwrap(), "https://h.example/a/b/d");
    }

    #[test]
    fn origins() {
        assert_eq!(
            origin_of("https://HF.co:443/a").as_deref(),
            Some("https://hf.co:443")
        );
        assert_ne!(origin_of("http://a/x"), origin_of("https://a/x"));
    }

    #[test]
    fn etag_sha() {
        let sha = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";
        let mut h = HeaderMap::new();
        h.insert("x-linked-etag", format!("\"{sha}\"").parse().unwrap());
        h.insert("etag", "\"0123456789abcdef\"".parse().unwrap());
        assert_eq!(sha_from_etag(&h, "x-linked-etag").as_deref(), Some(sha));
        assert_eq!(sha_from_etag(&h, "etag"), None);
        assert_eq!(validator(&h).as_deref(), Some("\"0123456789abcdef\""));
    }
}
