//! Integration tests: every fetch path against a local server on 127.0.0.1.

mod chunked;
mod hf;
mod server;
mod url;
