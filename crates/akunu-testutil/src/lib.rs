//! Test support shared by the crates' reference tests.
//!
//! Reference data (outputs of the `gguf` Python package, ggml, safetensors and mlx) is generated
//! by `scripts/test.sh` into `$AKUNU_REFDATA`; the real default model's path is in
//! `$AKUNU_MODEL`. A plain `cargo test` without them skips the reference tests with a note;
//! `scripts/test.sh` (and so CI) sets `AKUNU_REQUIRE_REFDATA=1`, which turns a missing input
//! into a failure, so a reference test can never pass by not running.

use std::path::PathBuf;

const HINT: &str = "run scripts/test.sh to generate it";

fn required() -> bool {
    std::env::var("AKUNU_REQUIRE_REFDATA").as_deref() == Ok("1")
}

fn skip(what: &str) -> Option<PathBuf> {
    assert!(!required(), "{what} is not set: {HINT}");
    eprintln!("skipped: {what} is not set ({HINT})");
    None
}

/// `$AKUNU_REFDATA/<sub>`, or `None` when the variable is unset and references are optional.
pub fn refdata(sub: &str) -> Option<PathBuf> {
    let Some(root) = std::env::var_os("AKUNU_REFDATA") else {
        return skip("AKUNU_REFDATA");
    };
    let dir = PathBuf::from(root).join(sub);
    assert!(dir.exists(), "{} is missing: {HINT}", dir.display());
    Some(dir)
}

/// The real default model (`$AKUNU_MODEL`), or `None` when unset and references are optional.
pub fn model() -> Option<PathBuf> {
    let Some(path) = std::env::var_os("AKUNU_MODEL") else {
        return skip("AKUNU_MODEL");
    };
    let path = PathBuf::from(path);
    assert!(path.is_file(), "{} is missing: {HINT}", path.display());
    Some(path)
}

/// The Python interpreter with the reference packages (`$AKUNU_PYTHON`).
pub fn python() -> Option<PathBuf> {
    match std::env::var_os("AKUNU_PYTHON") {
        Some(p) => Some(PathBuf::from(p)),
        None => skip("AKUNU_PYTHON"),
    }
}

/// The workspace root, for scripts the tests call.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root exists")
}
