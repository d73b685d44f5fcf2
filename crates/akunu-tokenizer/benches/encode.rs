//! Encoding speed: one model file (GGUF or tokenizer.json), one text, N timed encodes.
//!
//! `cargo bench -p akunu-tokenizer --bench encode -- MODEL FILE ITERS [--no-parse-special]`
//!
//! Encodes as `llama-tokenize` does (framing when the vocabulary adds BOS, special tokens
//! parsed) and prints one JSON line in the format of `tok_ref bench`, so
//! `scripts/bench/tokenizer.sh` can put the two side by side.

use std::time::Instant;

use akunu_tokenizer::{EncodeOptions, Tokenizer};

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let parse_special = !args.iter().any(|a| a == "--no-parse-special");
    let pos: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let [model, file, iters] = pos[..] else {
        eprintln!("usage: encode MODEL FILE ITERS [--no-parse-special]");
        std::process::exit(2);
    };
    let iters: usize = iters.parse().expect("ITERS is a number");
    let path = std::path::Path::new(model);
    let tok = if path.extension().is_some_and(|e| e == "json") {
        Tokenizer::from_hf_path(path)
    } else {
        Tokenizer::from_gguf_path(path)
    }
    .expect("a tokenizer");
    let text = std::fs::read_to_string(file).expect("a UTF-8 text file");
    let opts = EncodeOptions {
        add_special: tok.add_bos(),
        parse_special,
    };
    let n = tok.encode(&text, opts).len();
    let mut ms: Vec<f64> = (0..iters.max(1))
        .map(|_| {
            let t = Instant::now();
            let ids = tok.encode(&text, opts);
            let dt = t.elapsed().as_secs_f64() * 1e3;
            assert_eq!(ids.len(), n, "encoding is deterministic");
            dt
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    let k = ms.len();
    let median = if k % 2 == 1 {
        ms[k / 2]
    } else {
        (ms[k / 2 - 1] + ms[k / 2]) / 2.0
    };
    println!(
        "{{\"tokens\":{n},\"bytes\":{},\"iters\":{k},\"min_ms\":{:.4},\"median_ms\":{median:.4}}}",
        text.len(),
        ms[0]
    );
}
