//! Exactness against the references, on real vocabularies (Gemma 3, Llama 3, Qwen 3 and a
//! WordPiece vocabulary) and a corpus of hard strings plus 400 KB of prose:
//! - GGUF path: ids, pieces, detokenization and end-of-generation ids identical to llama.cpp
//!   (`scripts/ref/tok_ref.cpp` over libllama, itself cross-checked against `llama-tokenize`);
//! - `tokenizer.json` path: ids identical to Hugging Face `tokenizers`;
//! - decode(encode(s)) == s, and streaming equals one-shot decoding.
//!
//! The data comes from `scripts/ref/tokenizer_fixtures.py` (run by `scripts/test.sh`).

use std::path::{Path, PathBuf};

use akunu_tokenizer::{DecodeOptions, EncodeOptions, Source, Tokenizer};
use serde_json::Value;
use unicode_normalization::UnicodeNormalization;

struct Refs {
    dir: PathBuf,
    manifest: Value,
    hard: Vec<String>,
    prose: String,
}

fn refs() -> Option<Refs> {
    let dir = akunu_testutil::refdata("tok")?;
    let read =
        |p: &str| std::fs::read_to_string(dir.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    let manifest: Value = serde_json::from_str(&read("manifest.json")).unwrap();
    let hard: Vec<String> = serde_json::from_str(&read("corpus/hard.json")).unwrap();
    let prose = read("corpus/prose.txt");
    Some(Refs {
        dir,
        manifest,
        hard,
        prose,
    })
}

impl Refs {
    fn names(&self) -> Vec<String> {
        self.manifest["vocabs"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    }

    fn entry(&self, name: &str, path: &[&str]) -> PathBuf {
        let mut v = &self.manifest["vocabs"][name];
        for p in path {
            v = &v[*p];
        }
        self.dir.join(
            v.as_str()
                .unwrap_or_else(|| panic!("manifest has no {name}/{path:?}")),
        )
    }

    fn gguf(&self, name: &str) -> Tokenizer {
        // The Gemma vocabulary is the default model's own.
        let path = if name == "gemma3" {
            akunu_testutil::model().unwrap()
        } else {
            self.entry(name, &["gguf"])
        };
        Tokenizer::from_gguf_path(&path).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    fn hf(&self, name: &str) -> Tokenizer {
        let json = self.entry(name, &["tokenizer_json"]);
        Tokenizer::from_hf_path(&json).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    fn corpus(&self, which: &str) -> Vec<&str> {
        match which {
            "hard" => self.hard.iter().map(String::as_str).collect(),
            _ => vec![self.prose.as_str()],
        }
    }
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Compares every case; reports up to five differing cases before failing.
/// `framing` says whether "with_special" adds the framing tokens (llama-tokenize adds them only
/// when the vocabulary adds BOS; Hugging Face always applies its post-processor).
fn compare_ids(
    label: &str,
    tok: &Tokenizer,
    texts: &[&str],
    expected: &[Value],
    parse_special: bool,
    framing: bool,
) {
    assert_eq!(texts.len(), expected.len(), "{label}: case count");
    let mut bad = Vec::new();
    let mut total = 0;
    for (text, exp) in texts.iter().zip(expected) {
        for (key, add_special) in [("with_special", true), ("without_special", false)] {
            let add_special = add_special && framing;
            let got = tok.encode(
                text,
                EncodeOptions {
                    add_special,
                    parse_special,
                },
            );
            let want = ids(&exp[key]);
            total += want.len();
            if got != want {
                bad.push(format!(
                    "{key} {:?}\n   want {want:?}\n    got {got:?}",
                    truncate(text)
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{label}: {} of {} encodings differ:\n{}",
        bad.len(),
        2 * texts.len(),
        bad[..bad.len().min(5)].join("\n")
    );
    eprintln!("{label}: {} cases, {total} tokens identical", texts.len());
}

fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

#[test]
fn gguf_ids_match_llama_cpp() {
    let Some(r) = refs() else { return };
    for name in r.names() {
        let tok = r.gguf(&name);
        for corpus in ["hard", "prose"] {
            for (mode, parse) in [("special", true), ("nospecial", false)] {
                let expected = lines(&r.entry(&name, &["llama", corpus, mode]));
                let label = format!("{name} gguf {corpus} {mode}");
                compare_ids(
                    &label,
                    &tok,
                    &r.corpus(corpus),
                    &expected,
                    parse,
                    tok.add_bos(),
                );
            }
        }
    }
}

#[test]
fn tokenizer_json_ids_match_hugging_face() {
    let Some(r) = refs() else { return };
    for name in r.names() {
        let tok = r.hf(&name);
        for corpus in ["hard", "prose"] {
            for (mode, parse) in [("hf", true), ("hf_nospecial", false)] {
                let expected = lines(&r.entry(&name, &["hf", corpus, mode]));
                let label = format!("{name} json {corpus} {mode}");
                compare_ids(&label, &tok, &r.corpus(corpus), &expected, parse, true);
            }
        }
    }
}

#[test]
fn pieces_match_llama_cpp() {
    let Some(r) = refs() else { return };
    for name in r.names() {
        let tok = r.gguf(&name);
        let expected = lines(&r.entry(&name, &["pieces"]));
        assert_eq!(expected.len(), tok.n_vocab(), "{name}: vocabulary size");
        for (id, e) in expected.iter().enumerate() {
            let id = id as u32;
            assert_eq!(
                tok.piece(id, true),
                hex(e["s"].as_str().unwrap()),
                "{name} token {id} (special)"
            );
            assert_eq!(
                tok.piece(id, false),
                hex(e["n"].as_str().unwrap()),
                "{name} token {id}"
            );
        }
    }
}

#[test]
fn detokenization_matches_llama_cpp() {
    let Some(r) = refs() else { return };
    for name in r.names() {
        let tok = r.gguf(&name);
        for e in lines(&r.entry(&name, &["detok"])) {
            let ids = ids(&e["ids"]);
            for (key, remove_special, render_special) in [
                ("r0u0", false, false),
                ("r0u1", false, true),
                ("r1u0", true, false),
                ("r1u1", true, true),
            ] {
                let opts = DecodeOptions {
                    remove_special,
                    render_special,
                    clean_spaces: tok.cleans_spaces(),
                };
                let got = tok.decode_bytes(&ids, opts);
                assert_eq!(got, hex(e[key].as_str().unwrap()), "{name} {key} {ids:?}");
            }
        }
    }
}

#[test]
fn end_of_generation_ids_match_llama_cpp() {
    let Some(r) = refs() else { return };
    for name in r.names() {
        let tok = r.gguf(&name);
        let info: Value =
            serde_json::from_str(&std::fs::read_to_string(r.entry(&name, &["info"])).unwrap())
                .unwrap();
        assert_eq!(tok.eog_ids(), ids(&info["eog"]), "{name}");
        let role = |k: &str| info[k].as_i64().filter(|&v| v >= 0).map(|v| v as u32);
        let s = tok.special_tokens();
        assert_eq!(
            (s.bos, s.eos, s.eot, s.sep),
            (role("bos"), role("eos"), role("eot"), role("sep")),
            "{name}"
        );
        assert_eq!(
            (tok.add_bos(), tok.add_eos()),
            (
                info["add_bos"].as_bool().unwrap(),
                info["add_eos"].as_bool().unwrap()
            )
        );
    }
}

#[test]
fn decode_inverts_encode_and_streaming_equals_decode() {
    let Some(r) = refs() else { return };
    for name in ["gemma3", "llama3", "qwen3"] {
        for tok in [r.gguf(name), r.hf(name)] {
            let exact = DecodeOptions {
                remove_special: true,
                render_special: true,
                clean_spaces: false,
            };
            for text in r.corpus("hard").into_iter().chain(r.corpus("prose")) {
                let ids = tok.encode(
                    text,
                    EncodeOptions {
                        add_special: true,
                        parse_special: true,
                    },
                );
                // SentencePiece-style vocabularies read a literal `▁` as a space, and Qwen's
                // tokenizer.json normalises to NFC.
                let lossless = name != "gemma3" || !text.contains('\u{2581}');
                let nfc = tok.source() == Source::TokenizerJson && name == "qwen3";
                let want: String = if nfc {
                    text.nfc().collect()
                } else {
                    text.to_owned()
                };
                if lossless {
                    assert_eq!(
                        tok.decode(&ids, exact),
                        want,
                        "{name} ({:?}) round trip",
                        tok.source()
                    );
                }

                let plain = DecodeOptions {
                    remove_special: true,
                    ..Default::default()
                };
                let mut stream = tok.stream();
                let mut streamed: String = ids.iter().map(|&id| stream.push(id)).collect();
                streamed.push_str(&stream.finish());
                assert_eq!(
                    streamed,
                    tok.decode(&ids, plain),
                    "{name} ({:?}) stream of {:?}",
                    tok.source(),
                    truncate(text)
                );
            }
        }
    }
}

#[test]
fn tokenizer_json_decoding_matches_hugging_face() {
    let Some(r) = refs() else { return };
    for name in ["gemma3", "llama3", "qwen3"] {
        let tok = r.hf(name);
        let encoded = lines(&r.entry(name, &["hf", "hard", "hf"]));
        let decoded = lines(&r.entry(name, &["hf_decode"]));
        let opts = DecodeOptions {
            remove_special: false,
            render_special: true,
            clean_spaces: false,
        };
        for (e, d) in encoded.iter().zip(&decoded) {
            for key in ["with_special", "without_special"] {
                let ids = ids(&e[key]);
                assert_eq!(
                    tok.decode(&ids, opts),
                    d[key].as_str().unwrap(),
                    "{name} {key} {ids:?}"
                );
            }
        }
    }
}

#[test]
fn chat_templates_and_end_of_turn_come_from_the_model() {
    let Some(r) = refs() else { return };
    // Gemma's file has no template: the built-in Gemma one is chosen from its vocabulary.
    for (name, arch, marker) in [
        ("gemma3", "gemma3", "<end_of_turn>"),
        ("llama3", "llama", "<|eot_id|>"),
        ("qwen3", "qwen3", "<|im_end|>"),
    ] {
        let mut tok = r.gguf(name);
        let template = tok.chat_template_for(arch).unwrap();
        let id = tok.learn_end_of_turn(&template).unwrap();
        assert_eq!(id, tok.token_id(marker), "{name}");
        assert!(tok.is_eog(id.unwrap()), "{name}");
        let messages = vec![serde_json::json!({"role": "user", "content": "Hi"})];
        let prompt = template
            .render(&akunu_tokenizer::ChatRequest::new(messages))
            .unwrap();
        // The rendered prompt parses into the model's own markup tokens.
        let ids = tok.encode(
            &prompt,
            EncodeOptions {
                add_special: false,
                parse_special: true,
            },
        );
        assert!(
            ids.iter()
                .any(|&t| tok.token_kind(t) == Some(akunu_tokenizer::TokenKind::Control)),
            "{name}: {prompt:?}"
        );
        if let Some(bos) = tok.special_tokens().bos.filter(|_| tok.add_bos()) {
            assert_eq!(ids[0], bos, "{name}: the template writes BOS itself");
        }
    }
}
