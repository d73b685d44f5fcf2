//! Any vocabulary a GGUF file can describe either builds a tokenizer or is refused, and any
//! text then encodes to in-range ids that decode, one-shot and streamed, to the same text.
//!
//! Input layout: byte 0 picks the model (SentencePiece, byte-level BPE, WordPiece) and byte 1
//! the token types; the rest, split at 0xFF bytes, is the token texts and, last, the text.
#![no_main]

use akunu_formats::gguf::{GgufFile, GgufWriter, MetaValue};
use akunu_tokenizer::{DecodeOptions, EncodeOptions, Tokenizer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [model, types, rest @ ..] = data else {
        return;
    };
    let mut parts: Vec<String> = rest
        .split(|&b| b == 0xff)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    let Some(text) = parts.pop() else { return };
    let tokens: Vec<String> = parts.into_iter().take(64).collect();
    let mut w = GgufWriter::new();
    let name = ["llama", "gpt2", "bert"][usize::from(*model % 3)];
    w.add("tokenizer.ggml.model", name).unwrap();
    w.add(
        "tokenizer.ggml.tokens",
        MetaValue::strings(tokens.iter().cloned()),
    )
    .unwrap();
    let kinds = tokens
        .iter()
        .enumerate()
        .map(|(i, _)| i32::from((types.rotate_left(i as u32) % 7) + 1));
    w.add("tokenizer.ggml.token_type", MetaValue::i32s(kinds))
        .unwrap();
    w.add(
        "tokenizer.ggml.scores",
        MetaValue::f32s((0..tokens.len()).map(|i| (i % 5) as f32 - 2.0)),
    )
    .unwrap();
    let merges = tokens.windows(2).map(|p| format!("{} {}", p[0], p[1]));
    w.add("tokenizer.ggml.merges", MetaValue::strings(merges))
        .unwrap();
    w.add("tokenizer.ggml.bos_token_id", 0u32).unwrap();
    w.add("tokenizer.ggml.eos_token_id", 0u32).unwrap();
    let Ok(bytes) = w.to_bytes() else { return };
    let file = GgufFile::from_bytes(bytes).expect("the writer's output parses");
    let Ok(tok) = Tokenizer::from_gguf(&file) else {
        return;
    };
    for (add_special, parse_special) in [(false, false), (true, true)] {
        let ids = tok.encode(
            &text,
            EncodeOptions {
                add_special,
                parse_special,
            },
        );
        assert!(ids.iter().all(|&id| (id as usize) < tok.n_vocab()));
        let once = tok.decode(
            &ids,
            DecodeOptions {
                remove_special: true,
                ..Default::default()
            },
        );
        let mut stream = tok.stream();
        let mut streamed: String = ids.iter().map(|&id| stream.push(id)).collect();
        streamed.push_str(&stream.finish());
        if !tok.add_eos() {
            assert_eq!(streamed, once);
        }
    }
});
