//! Tokenizers over small random vocabularies, checked against naive reference implementations
//! of the same algorithms (quadratic scans written for clarity, not speed), plus the framing,
//! special-token and error rules on hand-made GGUF metadata.

use akunu_formats::gguf::{GgufFile, GgufWriter, MetaValue};
use akunu_tokenizer::{DecodeOptions, EncodeOptions, TokenKind, Tokenizer, TokenizerError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER: i32 = 4;
const BYTE: i32 = 6;

fn build(meta: Vec<(&str, MetaValue)>) -> Result<Tokenizer, TokenizerError> {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama").unwrap();
    for (k, v) in meta {
        w.add(k, v).unwrap();
    }
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    Tokenizer::from_gguf(&file)
}

/// An SPM vocabulary: <unk> <s> </s>, 256 byte tokens, the alphabet's characters, then up to
/// a few hundred random multi-character pieces, all with random scores.
fn spm_vocab(rng: &mut StdRng, alphabet: &[&str]) -> (Vec<String>, Vec<f32>, Vec<i32>) {
    let mut tokens = vec!["<unk>".to_owned(), "<s>".to_owned(), "</s>".to_owned()];
    let mut types = vec![UNKNOWN, CONTROL, CONTROL];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(BYTE);
    }
    for a in alphabet {
        tokens.push((*a).to_owned());
        types.push(NORMAL);
    }
    for _ in 0..2000 {
        let n = rng.random_range(2..=4);
        let t: String = (0..n)
            .map(|_| alphabet[rng.random_range(0..alphabet.len())])
            .collect();
        if !tokens.contains(&t) {
            tokens.push(t);
            types.push(NORMAL);
        }
    }
    let scores = (0..tokens.len())
        .map(|_| rng.random_range(-20.0..0.0f32))
        .collect();
    (tokens, scores, types)
}

/// SentencePiece BPE the slow way: scan all pairs, merge the best, repeat.
fn naive_spm(tokens: &[String], scores: &[f32], text: &str) -> Vec<u32> {
    let id = |s: &str| tokens.iter().rposition(|t| t == s).map(|i| i as u32);
    let escaped = text.replace(' ', "\u{2581}");
    let mut syms: Vec<String> = escaped.chars().map(String::from).collect();
    loop {
        let mut best: Option<(f32, usize)> = None;
        for i in 0..syms.len().saturating_sub(1) {
            if let Some(t) = id(&format!("{}{}", syms[i], syms[i + 1])) {
                let s = scores[t as usize];
                if best.is_none_or(|(bs, _)| s > bs) {
                    best = Some((s, i));
                }
            }
        }
        let Some((_, i)) = best else { break };
        let right = syms.remove(i + 1);
        syms[i].push_str(&right);
    }
    let mut out = Vec::new();
    for s in syms {
        match id(&s) {
            Some(t) => out.push(t),
            None => out.extend(s.bytes().map(|b| id(&format!("<0x{b:02X}>")).unwrap())),
        }
    }
    out
}

fn spm_meta(tokens: &[String], scores: &[f32], types: &[i32]) -> Vec<(&'static str, MetaValue)> {
    vec![
        ("tokenizer.ggml.model", "llama".into()),
        (
            "tokenizer.ggml.tokens",
            MetaValue::strings(tokens.iter().cloned()),
        ),
        (
            "tokenizer.ggml.scores",
            MetaValue::f32s(scores.iter().copied()),
        ),
        (
            "tokenizer.ggml.token_type",
            MetaValue::i32s(types.iter().copied()),
        ),
        ("tokenizer.ggml.add_space_prefix", false.into()),
    ]
}

#[test]
fn spm_matches_the_naive_algorithm() {
    let mut rng = StdRng::seed_from_u64(7);
    let alphabet = ["a", "b", "c", "\u{2581}", "é", "中"];
    let (tokens, scores, types) = spm_vocab(&mut rng, &alphabet);
    let tok = build(spm_meta(&tokens, &scores, &types)).unwrap();
    let plain = EncodeOptions {
        add_special: false,
        parse_special: false,
    };
    let chars = ['a', 'b', 'c', ' ', 'é', '中', 'z', '🎉'];
    for _ in 0..400 {
        let n = rng.random_range(0..40);
        let text: String = (0..n)
            .map(|_| chars[rng.random_range(0..chars.len())])
            .collect();
        assert_eq!(
            tok.encode(&text, plain),
            naive_spm(&tokens, &scores, &text),
            "{text:?}"
        );
        let ids = tok.encode(&text, plain);
        assert_eq!(
            tok.decode(&ids, DecodeOptions::default()),
            text,
            "round trip of {text:?}"
        );
    }
}

#[test]
fn spm_framing_and_space_prefix() {
    let mut rng = StdRng::seed_from_u64(1);
    let (tokens, scores, types) = spm_vocab(&mut rng, &["a", "b", "\u{2581}"]);
    let mut meta = spm_meta(&tokens, &scores, &types);
    meta.retain(|(k, _)| *k != "tokenizer.ggml.add_space_prefix");
    let tok = build(meta).unwrap();
    // Defaults for a "llama" file: BOS 1, a space prefix, no EOS.
    let ids = tok.encode("ab", EncodeOptions::default());
    assert_eq!(ids[0], 1);
    assert_eq!(ids[1..], naive_spm(&tokens, &scores, " ab")[..]);
    // The prefix space goes again when decoding starts at text, but stays after a removed BOS
    // (as llama.cpp's detokenizer does).
    let strip = DecodeOptions {
        remove_special: true,
        ..Default::default()
    };
    assert_eq!(tok.decode(&ids[1..], strip), "ab");
    assert_eq!(tok.decode(&ids, strip), " ab");
    // After a special token the space prefix comes back.
    let ids = tok.encode(
        "a</s>b",
        EncodeOptions {
            add_special: false,
            parse_special: true,
        },
    );
    let mut want = naive_spm(&tokens, &scores, " a");
    want.push(2);
    want.extend(naive_spm(&tokens, &scores, " b"));
    assert_eq!(ids, want);
    assert!(tok.is_eog(2));
}

/// Byte-level BPE the slow way: lowest-ranked pair first, leftmost on ties.
fn naive_bpe(merges: &[(String, String)], word: &[String]) -> Vec<String> {
    let mut syms = word.to_vec();
    loop {
        let mut best: Option<(usize, usize)> = None;
        for i in 0..syms.len().saturating_sub(1) {
            if let Some(r) = merges
                .iter()
                .position(|(a, b)| *a == syms[i] && *b == syms[i + 1])
            {
                if best.is_none_or(|(br, _)| r < br) {
                    best = Some((r, i));
                }
            }
        }
        let Some((_, i)) = best else { break };
        let right = syms.remove(i + 1);
        syms[i].push_str(&right);
    }
    syms
}

#[test]
fn byte_level_bpe_matches_the_naive_algorithm() {
    let mut rng = StdRng::seed_from_u64(3);
    // GPT-2's alphabet for the bytes used below: letters stand for themselves, space is Ġ.
    let letters = ["a", "b", "c", "d", "\u{120}"];
    let mut tokens: Vec<String> = letters.iter().map(|s| s.to_string()).collect();
    let mut merges: Vec<(String, String)> = Vec::new();
    while merges.len() < 60 {
        let a = tokens[rng.random_range(0..tokens.len())].clone();
        let b = tokens[rng.random_range(0..tokens.len())].clone();
        if a.chars().count() + b.chars().count() > 5 || merges.contains(&(a.clone(), b.clone())) {
            continue;
        }
        let ab = format!("{a}{b}");
        if !tokens.contains(&ab) {
            tokens.push(ab);
        }
        merges.push((a, b));
    }
    tokens.push("<|end|>".into());
    let mut types = vec![NORMAL; tokens.len()];
    *types.last_mut().unwrap() = CONTROL;
    let meta = vec![
        ("tokenizer.ggml.model", "gpt2".into()),
        ("tokenizer.ggml.pre", "gpt-2".into()),
        (
            "tokenizer.ggml.tokens",
            MetaValue::strings(tokens.iter().cloned()),
        ),
        (
            "tokenizer.ggml.token_type",
            MetaValue::i32s(types.iter().copied()),
        ),
        (
            "tokenizer.ggml.merges",
            MetaValue::strings(merges.iter().map(|(a, b)| format!("{a} {b}"))),
        ),
    ];
    let tok = build(meta).unwrap();
    let plain = EncodeOptions {
        add_special: false,
        parse_special: false,
    };
    for _ in 0..300 {
        let n = rng.random_range(1..12);
        let word: String = (0..n)
            .map(|_| ['a', 'b', 'c', 'd'][rng.random_range(0..4)])
            .collect();
        let text = format!(" {word}");
        let spelled: Vec<String> = text
            .chars()
            .map(|c| {
                if c == ' ' {
                    "\u{120}".into()
                } else {
                    c.to_string()
                }
            })
            .collect();
        let want: Vec<u32> = naive_bpe(&merges, &spelled)
            .iter()
            .map(|s| tokens.iter().rposition(|t| t == s).unwrap() as u32)
            .collect();
        assert_eq!(tok.encode(&text, plain), want, "{text:?}");
        assert_eq!(tok.decode(&want, DecodeOptions::default()), text);
    }
    // "<|end|>" is an end marker: forced to control, recognised only when parsing specials.
    let end = tokens.len() as u32 - 1;
    assert_eq!(tok.token_kind(end), Some(TokenKind::Control));
    assert!(tok.is_eog(end));
    assert_eq!(
        tok.encode(
            "a<|end|>",
            EncodeOptions {
                add_special: false,
                parse_special: true
            }
        )
        .last(),
        Some(&end)
    );
    assert!(!tok.encode("a<|end|>", plain).contains(&end));
}

#[test]
fn longer_special_tokens_win_and_user_defined_always_split() {
    let tokens: Vec<String> = [
        "<unk>", "<s>", "</s>", "ab", "bcd", "a", "b", "c", "d", "x", "<u>",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let types = [
        UNKNOWN, CONTROL, CONTROL, CONTROL, CONTROL, NORMAL, NORMAL, NORMAL, NORMAL, NORMAL, USER,
    ];
    let scores = vec![0.0; tokens.len()];
    let tok = build(spm_meta(&tokens, &scores, &types)).unwrap();
    let special = EncodeOptions {
        add_special: false,
        parse_special: true,
    };
    // "bcd" (longer) is claimed before "ab", though "ab" starts first.
    assert_eq!(tok.encode("abcd", special), [5, 4]);
    assert_eq!(tok.encode("abx", special), [3, 9]);
    let plain = EncodeOptions {
        add_special: false,
        parse_special: false,
    };
    assert_eq!(tok.encode("x<u>x", plain), [9, 10, 9]);
    assert_eq!(tok.encode("ba", plain), [6, 5]);
}

#[test]
fn wordpiece_greedy_longest_match() {
    let tokens: Vec<String> = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "\u{2581}un",
        "aff",
        "able",
        "\u{2581}the",
        "\u{2581},",
        "\u{2581}cafe",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let types = [
        CONTROL, UNKNOWN, CONTROL, CONTROL, NORMAL, NORMAL, NORMAL, NORMAL, NORMAL, NORMAL,
    ];
    let meta = vec![
        ("tokenizer.ggml.model", "bert".into()),
        (
            "tokenizer.ggml.tokens",
            MetaValue::strings(tokens.iter().cloned()),
        ),
        (
            "tokenizer.ggml.token_type",
            MetaValue::i32s(types.iter().copied()),
        ),
        ("tokenizer.ggml.unknown_token_id", 1u32.into()),
        ("tokenizer.ggml.cls_token_id", 2u32.into()),
        ("tokenizer.ggml.bos_token_id", 2u32.into()),
        ("tokenizer.ggml.seperator_token_id", 3u32.into()),
        ("tokenizer.ggml.padding_token_id", 0u32.into()),
        ("tokenizer.ggml.normalizer.lowercase", true.into()),
    ];
    let tok = build(meta).unwrap();
    assert_eq!(
        tok.encode("The UNAFFABLE, Café zzz", EncodeOptions::default()),
        [2, 7, 4, 5, 6, 8, 9, 1, 3]
    );
}

#[test]
fn bad_metadata_gives_clear_errors() {
    let err = |meta| build(meta).expect_err("refused").to_string();
    assert!(err(vec![]).contains("no tokenizer"));
    assert!(err(vec![("tokenizer.ggml.model", "t9".into())])
        .contains("unsupported tokenizer model 't9'"));
    let toks = MetaValue::strings(["a", "b"]);
    let e = err(vec![
        ("tokenizer.ggml.model", "gpt2".into()),
        ("tokenizer.ggml.tokens", toks.clone()),
        ("tokenizer.ggml.merges", MetaValue::strings(["a b"])),
        ("tokenizer.ggml.pre", "mystery".into()),
    ]);
    assert!(e.contains("unknown pre-tokenizer 'mystery'"), "{e}");
    let e = err(vec![
        ("tokenizer.ggml.model", "gpt2".into()),
        ("tokenizer.ggml.tokens", toks.clone()),
    ]);
    assert!(e.contains("merges"), "{e}");
    let e = err(vec![
        ("tokenizer.ggml.model", "llama".into()),
        ("tokenizer.ggml.tokens", toks.clone()),
        ("tokenizer.ggml.scores", MetaValue::f32s([0.0])),
    ]);
    assert!(e.contains("1 scores for 2 tokens"), "{e}");
    let e = err(vec![
        ("tokenizer.ggml.model", "llama".into()),
        ("tokenizer.ggml.tokens", 5u32.into()),
    ]);
    assert!(e.contains("not an array of strings"), "{e}");
    let dup = vec![
        ("tokenizer.ggml.model", "llama".into()),
        ("tokenizer.ggml.tokens", MetaValue::strings(["a", "b", "a"])),
    ];
    let e = err(dup);
    assert!(e.contains("token 2 (\"a\") is listed twice"), "{e}");
    // A one-token "llama" vocabulary has no id 1 for the default BOS it must add.
    let e = err(vec![
        ("tokenizer.ggml.model", "llama".into()),
        ("tokenizer.ggml.tokens", MetaValue::strings(["a"])),
    ]);
    assert!(e.contains("no BOS token"), "{e}");
}

#[test]
fn stream_equals_one_shot_decode_for_random_ids() {
    let mut rng = StdRng::seed_from_u64(11);
    let alphabet = ["a", "\u{2581}", "é", "中", "🎉"];
    let (tokens, scores, types) = spm_vocab(&mut rng, &alphabet);
    let tok = build(spm_meta(&tokens, &scores, &types)).unwrap();
    for _ in 0..300 {
        // Random ids include lone byte tokens, so pieces split characters and form invalid
        // sequences: both decoders must agree on where U+FFFD goes.
        let ids: Vec<u32> = (0..rng.random_range(0..30))
            .map(|_| rng.random_range(0..tokens.len() as u32))
            .collect();
        let mut s = tok.stream();
        let mut streamed: String = ids.iter().map(|&id| s.push(id)).collect();
        streamed.push_str(&s.finish());
        let once = tok.decode(
            &ids,
            DecodeOptions {
                remove_special: true,
                ..Default::default()
            },
        );
        assert_eq!(streamed, once, "{ids:?}");
    }
}

#[test]
fn stream_holds_back_split_characters() {
    let mut rng = StdRng::seed_from_u64(5);
    let (tokens, scores, types) = spm_vocab(&mut rng, &["a"]);
    let tok = build(spm_meta(&tokens, &scores, &types)).unwrap();
    let byte = |b: u8| {
        tokens
            .iter()
            .position(|t| *t == format!("<0x{b:02X}>"))
            .unwrap() as u32
    };
    let mut s = tok.stream();
    assert_eq!(s.push(byte(0xE4)), "");
    assert_eq!(s.push(byte(0xBD)), "");
    assert_eq!(s.push(byte(0xA0)), "你");
    assert_eq!(s.push(byte(b'H')), "H");
    assert_eq!(s.push(byte(0xBD)), "\u{FFFD}");
    assert_eq!(s.push(byte(0xF0)), "");
    assert_eq!(s.finish(), "\u{FFFD}");
}

#[test]
fn nested_special_tokens_claim_longest_first_over_long_runs() {
    // "a", "aa", ... "a"x50 all user-defined: a long run of "a" is cut into the longest ones,
    // without the work growing with the number of overlapping matches.
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    tokens.extend((1..=50).map(|n| "a".repeat(n)));
    let mut types = vec![UNKNOWN, CONTROL, CONTROL];
    types.extend([USER; 50]);
    let scores = vec![0.0; tokens.len()];
    let tok = build(spm_meta(&tokens, &scores, &types)).unwrap();
    let ids = tok.encode(
        &"a".repeat(200_020),
        EncodeOptions {
            add_special: false,
            parse_special: false,
        },
    );
    assert_eq!(ids.len(), 4001);
    assert!(ids[..4000].iter().all(|&id| id == 52));
    assert_eq!(ids[4000], 22);
}

#[test]
fn hostile_byte_level_token_text_stays_bounded() {
    // A normal token spelled outside GPT-2's alphabet decodes to visible markers, without
    // repeating the whole text once per character.
    let huge = "€".repeat(20_000);
    let meta = vec![
        ("tokenizer.ggml.model", "gpt2".into()),
        (
            "tokenizer.ggml.tokens",
            MetaValue::strings(["a".to_owned(), huge]),
        ),
        ("tokenizer.ggml.merges", MetaValue::strings(["a a"])),
    ];
    let tok = build(meta).unwrap();
    let piece = tok.piece(1, true);
    assert!(piece.starts_with(b"[UNK_BYTE_0xe282ac]"));
    assert_eq!(piece.len(), 20_000 * "[UNK_BYTE_0xe282ac]".len());
}

#[test]
fn tokenizer_json_prepend_normalizer_adds_the_space() {
    // Llama 2 style: Prepend("▁") then Replace(" ", "▁"), BPE with byte fallback.
    let json = serde_json::json!({
        "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>",
                  "vocab": {"<unk>": 0, "H": 1, "i": 2, "\u{2581}": 3, "Hi": 4, "\u{2581}Hi": 5},
                  "merges": ["H i", "\u{2581} Hi"]},
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u{2581}"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}]},
        "pre_tokenizer": null,
        "post_processor": null,
        "added_tokens": [],
    });
    let tok = Tokenizer::from_hf_json(&json, None).unwrap();
    let plain = EncodeOptions {
        add_special: false,
        parse_special: false,
    };
    assert_eq!(tok.encode("Hi Hi", plain), [5, 5]);
    let mut bad = json.clone();
    bad["normalizer"] = serde_json::json!({"type": "Lowercase"});
    let e = Tokenizer::from_hf_json(&bad, None)
        .expect_err("refused")
        .to_string();
    assert!(e.contains("normalizer \"Lowercase\""), "{e}");
}
