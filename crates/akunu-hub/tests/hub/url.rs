//! Plain URL downloads: verification, resuming, caching, locking.

use std::fs;
use std::time::Duration;

use akunu_hub::{resolve, FetchOptions, HubError};

use crate::server::{find_file, options, random_bytes, sha256_hex, Route, Server};

const BODY_LEN: usize = 300_000;

#[test]
fn fetch_verify_and_cache_hit_without_network() {
    let server = Server::start();
    let body = random_bytes(BODY_LEN, 1);
    server.route("/models/m.gguf", Route::ok(body.clone()));
    let cache = tempfile::tempdir().unwrap();
    let mut opts = options(cache.path(), &server);
    opts.sha256 = Some(sha256_hex(&body).to_uppercase());
    let url = server.url("/models/m.gguf");

    let path = resolve(Some(&url), &opts).unwrap();
    assert!(path.starts_with(cache.path().join("models").join("url")));
    assert_eq!(path.file_name().unwrap(), "m.gguf");
    assert!(fs::read(&path).unwrap() == body, "content differs");
    assert!(!path.with_extension("gguf.partial").exists());
    assert_eq!(server.hits().len(), 1);

    // Second time: straight from the cache, no request at all.
    assert_eq!(resolve(Some(&url), &opts).unwrap(), path);
    opts.sha256 = None;
    assert_eq!(resolve(Some(&url), &opts).unwrap(), path);
    assert_eq!(server.hits().len(), 1);
}

#[test]
fn sha_mismatch_deletes_the_download() {
    let server = Server::start();
    server.route("/m.gguf", Route::ok(random_bytes(BODY_LEN, 2)));
    let cache = tempfile::tempdir().unwrap();
    let mut opts = options(cache.path(), &server);
    let wrong = "0".repeat(64);
    opts.sha256 = Some(wrong.clone());

    let err = resolve(Some(&server.url("/m.gguf")), &opts).unwrap_err();
    let HubError::ShaMismatch {
        path,
        expected,
        actual,
    } = err
    else {
        panic!("expected ShaMismatch, got {err:?}");
    };
    assert_eq!(expected, wrong);
    assert_eq!(actual, sha256_hex(&random_bytes(BODY_LEN, 2)));
    assert!(!path.exists());
    let leftovers: Vec<_> = fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.ends_with(".lock"))
        .collect();
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
}

#[test]
fn bad_sha_option_is_rejected() {
    let server = Server::start();
    let cache = tempfile::tempdir().unwrap();
    let mut opts = options(cache.path(), &server);
    opts.sha256 = Some("abc".into());
    let err = resolve(Some(&server.url("/x")), &opts).unwrap_err();
    assert!(matches!(err, HubError::BadSha256(_)), "{err:?}");
    assert!(server.hits().is_empty());
}

#[test]
fn http_error_names_status_and_url() {
    let server = Server::start();
    let cache = tempfile::tempdir().unwrap();
    let url = server.url("/missing.gguf");
    let err = resolve(Some(&url), &options(cache.path(), &server)).unwrap_err();
    assert!(
        matches!(&err, HubError::HttpStatus { status: 404, url: u, .. } if *u == url),
        "{err:?}"
    );
    assert!(err.to_string().contains("404"));
}

#[test]
fn connection_refused_is_a_network_error() {
    // Bind then drop to get a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = Server::start();
    let cache = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{port}/m.gguf");
    let err = resolve(Some(&url), &options(cache.path(), &server)).unwrap_err();
    assert!(matches!(err, HubError::Network { .. }), "{err:?}");
}

#[test]
fn interrupted_transfer_resumes_with_range_on_next_call() {
    let server = Server::start();
    let body = random_bytes(BODY_LEN, 3);
    let mut route = Route::ok(body.clone()).header("ETag", "\"v1\"");
    route.drop_after = Some(100_000);
    server.route("/m.gguf", route);
    let cache = tempfile::tempdir().unwrap();
    let mut opts = options(cache.path(), &server);
    opts.sha256 = Some(sha256_hex(&body));
    let url = server.url("/m.gguf");

    let err = resolve(Some(&url), &opts).unwrap_err();
    assert!(
        matches!(err, HubError::Network { .. } | HubError::Truncated { .. }),
        "{err:?}"
    );
    let partial = find_file(cache.path(), "m.gguf.partial").expect("partial kept");
    let have = fs::metadata(&partial).unwrap().len();
    assert!(have > 0 && have <= 100_000, "partial has {have} bytes");

    let path = resolve(Some(&url), &opts).unwrap();
    assert!(fs::read(&path).unwrap() == body, "content differs");
    let hits = server.hits_for("/m.gguf");
    assert_eq!(hits.len(), 2);
    assert_eq!(
        hits[1].headers.get("range").map(String::as_str),
        Some(format!("bytes={have}-").as_str())
    );
    assert_eq!(
        hits[1].headers.get("if-range").map(String::as_str),
        Some("\"v1\"")
    );
    assert!(!partial.exists());
}

#[test]
fn retries_resume_within_one_call() {
    let server = Server::start();
    let body = random_bytes(BODY_LEN, 4);
    let mut route = Route::ok(body.clone());
    route.drop_after = Some(50_000);
    server.route("/m.gguf", route);
    let cache = tempfile::tempdir().unwrap();
    let mut opts = options(cache.path(), &server);
    opts.retries = 2;
    opts.sha256 = Some(sha256_hex(&body));

    let path = resolve(Some(&server.url("/m.gguf")), &opts).unwrap();
    assert!(fs::read(&path).unwrap() == body, "content differs");
    let hits = server.hits_for("/m.gguf");
    assert_eq!(hits.len(), 2);
    assert!(!hits[0].headers.contains_key("range"));
    assert!(hits[1].headers.contains_key("range"));
}

#[test]
fn server_ignoring_range_restarts_cleanly() {
    let server = Server::start();
    let body = random_bytes(BODY_LEN, 5);
    let mut route = Route::ok(body.clone());
    route.drop_after = Some(120_000);
    server.route("/m.gguf", route.clone());
    let cache = tempfile::tempdir().unwrap();
    let mut opts = options(cache.path(), &server);
    opts.sha256 = Some(sha256_hex(&body));
    let url = server.url("/m.gguf");
    assert!(resolve(Some(&url), &opts).is_err());

    route.drop_after = None;
    route.ignore_range = true;
    server.route("/m.gguf", route);
    let path = resolve(Some(&url), &opts).unwrap();
    // Not the partial bytes followed by the whole file again.
    assert!(fs::read(&path).unwrap() == body, "content differs");
    let hits = server.hits_for("/m.gguf");
    assert_eq!(hits.len(), 2);
    assert!(hits[1].headers.contains_key("range"));
}

#[test]
fn changed_file_is_restarted_through_if_range() {
    let server = Server::start();
    let old = random_bytes(BODY_LEN, 6);
    let new = random_bytes(BODY_LEN + 1000, 7);
    let mut route = Route::ok(old).header("ETag", "\"old\"");
    route.drop_after = Some(100_000);
    server.route("/m.gguf", route);
    let cache = tempfile::tempdir().unwrap();
    let opts = options(cache.path(), &server);
    let url = server.url("/m.gguf");
    assert!(resolve(Some(&url), &opts).is_err());

    server.route("/m.gguf", Route::ok(new.clone()).header("ETag", "\"new\""));
    // No digest given: only If-Range stops old and new bytes being spliced.
    let path = resolve(Some(&url), &opts).unwrap();
    assert!(fs::read(&path).unwrap() == new, "content differs");
}

#[test]
fn concurrent_requests_download_once() {
    let server = Server::start();
    let body = random_bytes(BODY_LEN, 8);
    let mut route = Route::ok(body.clone());
    route.throttle = Some(Duration::from_millis(5));
    server.route("/m.gguf", route);
    let cache = tempfile::tempdir().unwrap();
    let mut opts = options(cache.path(), &server);
    opts.sha256 = Some(sha256_hex(&body));
    let url = server.url("/m.gguf");

    let paths: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|_| s.spawn(|| resolve(Some(&url), &opts).unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(paths.windows(2).all(|w| w[0] == w[1]));
    assert!(fs::read(&paths[0]).unwrap() == body, "content differs");
    assert_eq!(server.hits_for("/m.gguf").len(), 1);
}

#[test]
fn local_path_is_returned_as_is() {
    let server = Server::start();
    let cache = tempfile::tempdir().unwrap();
    let file = cache.path().join("mine.gguf");
    fs::write(&file, b"GGUF").unwrap();
    let got = resolve(
        Some(file.to_str().unwrap()),
        &options(cache.path(), &server),
    )
    .unwrap();
    assert_eq!(got, file);
    assert!(!cache.path().join("models").exists());
    assert!(server.hits().is_empty());
}

#[test]
fn bad_spec_makes_no_request() {
    let server = Server::start();
    let cache = tempfile::tempdir().unwrap();
    let err = resolve(Some("not-a-model"), &options(cache.path(), &server)).unwrap_err();
    assert!(matches!(err, HubError::BadSpec { .. }), "{err:?}");
    assert!(server.hits().is_empty());
}

#[test]
fn verify_cached_refetches_a_damaged_file() {
    let server = Server::start();
    let body = random_bytes(BODY_LEN, 9);
    server.route("/m.gguf", Route::ok(body.clone()));
    let cache = tempfile::tempdir().unwrap();
    let mut opts = options(cache.path(), &server);
    let url = server.url("/m.gguf");
    let path = resolve(Some(&url), &opts).unwrap();

    // Same size, different bytes: only a re-hash can tell.
    let mut damaged = body.clone();
    damaged[1234] ^= 0xff;
    fs::write(&path, &damaged).unwrap();
    assert_eq!(resolve(Some(&url), &opts).unwrap(), path);
    assert_eq!(server.hits().len(), 1);

    opts.verify_cached = true;
    assert_eq!(resolve(Some(&url), &opts).unwrap(), path);
    assert!(fs::read(&path).unwrap() == body, "content differs");
    assert_eq!(server.hits().len(), 2);
}

/// Cut a download of `body` short, leaving a partial file; returns its length.
fn interrupt(server: &Server, cache: &std::path::Path, opts: &FetchOptions, body: &[u8]) -> u64 {
    let mut route = Route::ok(body.to_vec());
    route.drop_after = Some(100_000);
    server.route("/m.gguf", route);
    assert!(resolve(Some(&server.url("/m.gguf")), opts).is_err());
    let partial = find_file(cache, "m.gguf.partial").expect("partial kept");
    let have = fs::metadata(&partial).unwrap().len();
    assert!(have > 0, "nothing arrived before the cut");
    have
}

#[test]
fn overflowing_length_of_a_resumed_range_is_a_bad_response() {
    let server = Server::start();
    let body = random_bytes(BODY_LEN, 20);
    let cache = tempfile::tempdir().unwrap();
    let mut opts = options(cache.path(), &server);
    // The digest is what allows resuming without a validator.
    opts.sha256 = Some(sha256_hex(&body));
    let have = interrupt(&server, cache.path(), &opts, &body);

    server.route(
        "/m.gguf",
        Route::raw(&format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {have}-{}/*\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            have + 4,
            u64::MAX
        )),
    );
    let err = resolve(Some(&server.url("/m.gguf")), &opts).unwrap_err();
    assert!(
        matches!(&err, HubError::BadResponse { reason, .. } if reason.contains("overflows")),
        "{err:?}"
    );
    let hits = server.hits_for("/m.gguf");
    assert_eq!(
        hits[1].headers.get("range").map(String::as_str),
        Some(format!("bytes={have}-").as_str())
    );
}

#[test]
fn resume_without_validator_or_digest_starts_over() {
    let server = Server::start();
    let old = random_bytes(BODY_LEN, 21);
    let new = random_bytes(BODY_LEN, 22);
    let cache = tempfile::tempdir().unwrap();
    let opts = options(cache.path(), &server);
    interrupt(&server, cache.path(), &opts, &old);

    // No ETag, no Last-Modified, no digest: a resumed range of the new file
    // would be spliced onto the old bytes unnoticed.
    server.route("/m.gguf", Route::ok(new.clone()));
    let path = resolve(Some(&server.url("/m.gguf")), &opts).unwrap();
    assert!(fs::read(&path).unwrap() == new, "content differs");
    let hits = server.hits_for("/m.gguf");
    assert_eq!(hits.len(), 2);
    assert!(!hits[1].headers.contains_key("range"));
}

#[test]
fn unrequested_partial_content_is_handled() {
    let server = Server::start();
    let cache = tempfile::tempdir().unwrap();
    let opts = options(cache.path(), &server);
    let reply = |range: &str, body: &str| {
        Route::raw(&format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {range}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ))
    };

    // A range from byte 0 is the whole file, however it is labelled.
    server.route("/a.gguf", reply("0-9/10", "0123456789"));
    let path = resolve(Some(&server.url("/a.gguf")), &opts).unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"0123456789");

    // Any other range cannot be used.
    server.route("/b.gguf", reply("5-9/10", "56789"));
    let err = resolve(Some(&server.url("/b.gguf")), &opts).unwrap_err();
    assert!(matches!(err, HubError::BadResponse { .. }), "{err:?}");
}
