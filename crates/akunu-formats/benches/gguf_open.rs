//! Time to open a GGUF file: map it, validate the header, metadata and tensor index.
//!
//! `cargo bench -p akunu-formats --bench gguf_open [-- FILE]`; with no FILE, `$AKUNU_MODEL`, else
//! a synthetic file with the default model's metadata shape (262,144-token vocabulary with scores
//! and types, 236 tensors).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use akunu_formats::gguf::{GgufFile, GgufWriter, MetaValue};
use akunu_formats::GgmlType;

fn synthetic(dir: &std::path::Path) -> PathBuf {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "gemma3").unwrap();
    let n = 262_144;
    w.add(
        "tokenizer.ggml.tokens",
        MetaValue::strings((0..n).map(|i| format!("▁tok{i}"))),
    )
    .unwrap();
    w.add(
        "tokenizer.ggml.scores",
        MetaValue::f32s((0..n).map(|i| -(i as f32))),
    )
    .unwrap();
    w.add(
        "tokenizer.ggml.token_type",
        MetaValue::i32s((0..n).map(|_| 1)),
    )
    .unwrap();
    for i in 0..236 {
        w.add_tensor(
            &format!("blk.{i}.w"),
            GgmlType::Q4_K,
            &[256, 4],
            vec![1u8; 576],
        )
        .unwrap();
    }
    let path = dir.join("synthetic.gguf");
    w.write_file(&path).unwrap();
    path
}

fn main() {
    let tmp = std::env::temp_dir().join("akunu-bench-gguf-open");
    std::fs::create_dir_all(&tmp).unwrap();
    let path = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("AKUNU_MODEL").map(PathBuf::from))
        .unwrap_or_else(|| synthetic(&tmp));
    let mut times: Vec<Duration> = (0..50)
        .map(|_| {
            let t = Instant::now();
            let file = GgufFile::open(&path).unwrap();
            std::hint::black_box(file.tensors().len());
            t.elapsed()
        })
        .collect();
    times.sort();
    let file = GgufFile::open(&path).unwrap();
    println!(
        "gguf_open {}: {} keys, {} tensors, {} bytes; median {:.3} ms, min {:.3} ms (50 runs)",
        path.display(),
        file.metadata_len(),
        file.tensors().len(),
        file.bytes().len(),
        times[25].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3
    );
}
