//! Hugging Face specs against the local server standing in for the endpoint.

use std::fs;

use akunu_hub::{resolve, HubError};

use crate::server::{options, random_bytes, sha256_hex, Route, Server};

const TOKEN: &str = "hf_test_token";

/// The endpoint redirects to a "CDN" on another origin, as the real one
/// does, advertising the sha256 in `X-Linked-Etag`.
fn setup(hf: &Server, cdn: &Server, resolve_path: &str, body: &[u8], etag_sha: &str) {
    let mut route = Route::default().header("X-Linked-Etag", &format!("\"{etag_sha}\""));
    route.redirect = Some(cdn.url("/blob/abc"));
    route.bearer = Some(TOKEN.into());
    hf.route(resolve_path, route);
    cdn.route("/blob/abc", Route::ok(body.to_vec()));
}

#[test]
fn hf_spec_fetches_with_token_and_verifies_linked_etag() {
    let (hf, cdn) = (Server::start(), Server::start());
    let body = random_bytes(200_000, 10);
    setup(
        &hf,
        &cdn,
        "/owner/repo/resolve/main/sub/m.gguf",
        &body,
        &sha256_hex(&body),
    );
    let cache = tempfile::tempdir().unwrap();
    let mut opts = options(cache.path(), &hf);
    opts.hf_token = Some(TOKEN.into());

    let path = resolve(Some("owner/repo/sub/m.gguf"), &opts).unwrap();
    assert_eq!(
        path,
        cache.path().join("models/hf/owner/repo/main/sub/m.gguf")
    );
    assert!(fs::read(&path).unwrap() == body, "content differs");
    // The token went to the endpoint but not across the redirect.
    let to_cdn = cdn.hits_for("/blob/abc");
    assert_eq!(to_cdn.len(), 1);
    assert!(!to_cdn[0].headers.contains_key("authorization"));

    // Same file through the hf:// form: cached, no further requests.
    assert_eq!(
        resolve(Some("hf://owner/repo/sub/m.gguf"), &opts).unwrap(),
        path
    );
    assert_eq!(hf.hits().len(), 1);
    assert_eq!(cdn.hits().len(), 1);
}

#[test]
fn hf_linked_etag_mismatch_is_caught() {
    let (hf, cdn) = (Server::start(), Server::start());
    let body = random_bytes(50_000, 11);
    let wrong = "f".repeat(64);
    setup(&hf, &cdn, "/owner/repo/resolve/main/m.gguf", &body, &wrong);
    let cache = tempfile::tempdir().unwrap();
    let mut opts = options(cache.path(), &hf);
    opts.hf_token = Some(TOKEN.into());

    let err = resolve(Some("owner/repo/m.gguf"), &opts).unwrap_err();
    assert!(
        matches!(&err, HubError::ShaMismatch { expected, path, .. } if *expected == wrong && !path.exists()),
        "{err:?}"
    );
}

#[test]
fn hf_revision_and_missing_token() {
    let (hf, cdn) = (Server::start(), Server::start());
    let body = random_bytes(10_000, 12);
    setup(
        &hf,
        &cdn,
        "/o/r/resolve/v2/m.gguf",
        &body,
        &sha256_hex(&body),
    );
    let cache = tempfile::tempdir().unwrap();
    let mut opts = options(cache.path(), &hf);

    let err = resolve(Some("o/r/m.gguf@v2"), &opts).unwrap_err();
    assert!(
        matches!(&err, HubError::HttpStatus { status: 401, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("HF_TOKEN"), "{err}");

    opts.hf_token = Some(TOKEN.into());
    let path = resolve(Some("o/r/m.gguf@v2"), &opts).unwrap();
    assert_eq!(path, cache.path().join("models/hf/o/r/v2/m.gguf"));
    assert!(fs::read(&path).unwrap() == body, "content differs");
}

#[test]
fn explicit_sha_wins_over_etag() {
    let (hf, cdn) = (Server::start(), Server::start());
    let body = random_bytes(10_000, 13);
    setup(
        &hf,
        &cdn,
        "/o/r/resolve/main/m.gguf",
        &body,
        &sha256_hex(&body),
    );
    let cache = tempfile::tempdir().unwrap();
    let mut opts = options(cache.path(), &hf);
    opts.hf_token = Some(TOKEN.into());
    opts.sha256 = Some("1".repeat(64));
    let err = resolve(Some("o/r/m.gguf"), &opts).unwrap_err();
    assert!(matches!(err, HubError::ShaMismatch { .. }), "{err:?}");
}

#[test]
fn names_of_bookkeeping_files_are_refused() {
    let (hf, cdn) = (Server::start(), Server::start());
    let body = random_bytes(10_000, 14);
    setup(
        &hf,
        &cdn,
        "/o/r/resolve/main/m.gguf.meta.json",
        &body,
        &sha256_hex(&body),
    );
    let cache = tempfile::tempdir().unwrap();
    let mut opts = options(cache.path(), &hf);
    opts.hf_token = Some(TOKEN.into());

    // Cached, this file would be the sidecar of `o/r/m.gguf`.
    for spec in [
        "o/r/m.gguf.meta.json",
        "o/r/m.gguf.partial",
        "o/r/m.gguf.lock",
        "o/r/m.gguf.lock/x.gguf",
    ] {
        let err = resolve(Some(spec), &opts).unwrap_err();
        assert!(
            matches!(&err, HubError::BadSpec { reason, .. } if reason.contains("reserves")),
            "{spec}: {err:?}"
        );
    }
    assert!(hf.hits().is_empty());
}
