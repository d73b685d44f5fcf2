//! Building a tokenizer from a Hugging Face `tokenizer.json` (and `tokenizer_config.json`).
//!
//! The file's pipeline (normalizer, pre-tokenizer, model, post-processor) is mapped onto the
//! same algorithms the GGUF path uses, the way GGUF converters translate these files:
//! added tokens become control (special) or user-defined tokens, and the pre-tokenizer regex
//! is recognised among the families implemented by hand. Anything else is refused with a message that names it,
//! rather than tokenized approximately.

use std::path::Path;

use serde_json::Value;

use crate::bpe::{Bpe, BpeSpec};
use crate::pretok::PreTokenizer;
use crate::roles::derive_roles;
use crate::tokenizer::{Model, Rules, Source, SpecialTokens, Tokenizer};
use crate::vocab::{Token, TokenKind, Vocab};
use crate::wpm::{Style, Wpm};
use crate::TokenizerError;

const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn unsupported(msg: impl Into<String>) -> TokenizerError {
    TokenizerError::UnsupportedJson(msg.into())
}

fn read_json(path: &Path) -> Result<Value, TokenizerError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.display().to_string(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| TokenizerError::Json {
        path: path.display().to_string(),
        source,
    })
}

impl Tokenizer {
    /// Reads `tokenizer.json` and, when present, `tokenizer_config.json` from a model
    /// directory (or a `tokenizer.json` path, with the config beside it).
    pub fn from_hf_path(path: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let path = path.as_ref();
        let (json, dir) = if path.is_dir() {
            (path.join("tokenizer.json"), path.to_path_buf())
        } else {
            (
                path.to_path_buf(),
                path.parent().map(Path::to_path_buf).unwrap_or_default(),
            )
        };
        let tokenizer = read_json(&json)?;
        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.is_file() {
            Some(read_json(&config_path)?)
        } else {
            None
        };
        Self::from_hf_json(&tokenizer, config.as_ref())
    }

    /// Builds from parsed `tokenizer.json` and optional `tokenizer_config.json` contents.
    pub fn from_hf_json(tokenizer: &Value, config: Option<&Value>) -> Result<Self, TokenizerError> {
        let model = tokenizer
            .get("model")
            .ok_or_else(|| unsupported("no \"model\""))?;
        let model_type = model.get("type").and_then(Value::as_str).unwrap_or("");
        let wordpiece = match model_type {
            "BPE" => false,
            "WordPiece" => true,
            other => {
                return Err(unsupported(format!(
                    "model type {other:?} (supported: BPE, WordPiece)"
                )))
            }
        };
        let byte_fallback = model
            .get("byte_fallback")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let unk_text = model.get("unk_token").and_then(Value::as_str);

        let vocab = build_vocab(tokenizer, model, byte_fallback, unk_text)?;
        let id_of = |name: Option<&str>| name.and_then(|n| vocab.id(n.as_bytes()));
        let mut special = SpecialTokens {
            unk: id_of(unk_text),
            ..SpecialTokens::default()
        };
        let mut rules = Rules::default();
        let config_token = |key: &str| -> Option<String> {
            let v = config?.get(key)?;
            v.as_str()
                .or_else(|| v.get("content").and_then(Value::as_str))
                .map(str::to_owned)
        };
        special.bos = id_of(config_token("bos_token").as_deref());
        special.eos = id_of(config_token("eos_token").as_deref());
        special.pad = id_of(config_token("pad_token").as_deref());
        if let Some(u) = id_of(config_token("unk_token").as_deref()) {
            special.unk = Some(u);
        }
        read_post_processor(
            tokenizer.get("post_processor"),
            &vocab,
            wordpiece,
            &mut special,
            &mut rules,
        )?;
        rules.clean_spaces = config
            .and_then(|c| c.get("clean_up_tokenization_spaces"))
            .and_then(Value::as_bool)
            .unwrap_or(false);

        let normalizer = read_normalizer(tokenizer.get("normalizer"), wordpiece)?;
        rules.nfc = normalizer.nfc;
        rules.escape_spaces = normalizer.spaces_to_metaspace;
        rules.add_space_prefix = normalizer.prepend_metaspace;

        let model = if wordpiece {
            let max_word_chars = model
                .get("max_input_chars_per_word")
                .and_then(Value::as_u64)
                .unwrap_or(100);
            let continuation = model
                .get("continuing_subword_prefix")
                .and_then(Value::as_str)
                .unwrap_or("##")
                .to_owned();
            let pre = tokenizer
                .get("pre_tokenizer")
                .and_then(|p| p.get("type"))
                .and_then(Value::as_str);
            if pre != Some("BertPreTokenizer") {
                return Err(unsupported(format!("WordPiece with pre-tokenizer {pre:?}")));
            }
            let style = Style::Hf {
                continuation,
                max_word_chars: max_word_chars as usize,
            };
            Model::Wpm(Wpm {
                lowercase: normalizer.lowercase,
                strip_accents: normalizer.strip_accents,
                style,
            })
        } else {
            let metaspace = rules.escape_spaces;
            let (pre, byte_level) = read_pre_tokenizer(tokenizer.get("pre_tokenizer"), metaspace)?;
            let merges = read_merges(model)?;
            let spec = BpeSpec {
                pre,
                ignore_merges: model
                    .get("ignore_merges")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                byte_level,
                byte_fallback,
                fuse_unk: model
                    .get("fuse_unk")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                merges: merges
                    .iter()
                    .map(|(a, b)| (a.as_str(), b.as_str()))
                    .collect(),
            };
            Model::Bpe(Box::new(Bpe::new(&vocab, spec)))
        };
        let mut vocab = vocab;
        let eog = derive_roles(&mut vocab, &mut special, [None; 6], false);
        let template = config.and_then(|c| chat_template_of(c.get("chat_template")?));
        Tokenizer::assemble(
            vocab,
            model,
            special,
            rules,
            eog,
            template,
            Source::TokenizerJson,
        )
    }
}

fn build_vocab(
    tokenizer: &Value,
    model: &Value,
    byte_fallback: bool,
    unk_text: Option<&str>,
) -> Result<Vocab, TokenizerError> {
    let entries = model
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or_else(|| unsupported("model.vocab is not an object"))?;
    let added = tokenizer
        .get("added_tokens")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let as_id = |v: &Value| {
        v.as_u64()
            .filter(|&id| id < u32::MAX as u64 / 2)
            .map(|id| id as usize)
    };
    let mut max_id = 0usize;
    for v in entries.values() {
        max_id =
            max_id.max(as_id(v).ok_or_else(|| {
                unsupported("a vocabulary id is not a small non-negative integer")
            })?);
    }
    for a in added {
        max_id = max_id.max(
            a.get("id")
                .and_then(as_id)
                .ok_or_else(|| unsupported("an added token has no valid id"))?,
        );
    }
    if max_id > entries.len() + added.len() + 1024 {
        return Err(unsupported(format!(
            "vocabulary ids reach {max_id} for {} entries",
            entries.len() + added.len()
        )));
    }
    let mut slots: Vec<Option<Token>> = vec![None; max_id + 1];
    for (text, id) in entries {
        let id = as_id(id).expect("checked above");
        let kind = if Some(text.as_str()) == unk_text {
            TokenKind::Unknown
        } else if byte_fallback && Vocab::byte_value(text).is_some() {
            TokenKind::Byte
        } else {
            TokenKind::Normal
        };
        slots[id] = Some(token(text.clone(), kind));
    }
    for a in added {
        let id = a.get("id").and_then(as_id).expect("checked above");
        let text = a
            .get("content")
            .and_then(Value::as_str)
            .ok_or_else(|| unsupported("an added token has no content"))?;
        let is_special = a.get("special").and_then(Value::as_bool).unwrap_or(false);
        let flag = |k: &str| a.get(k).and_then(Value::as_bool).unwrap_or(false);
        let kind = match () {
            _ if Some(text) == unk_text => TokenKind::Unknown,
            _ if is_special => TokenKind::Control,
            _ => TokenKind::UserDefined,
        };
        let mut t = token(text.to_owned(), kind);
        t.lstrip = flag("lstrip");
        t.rstrip = flag("rstrip");
        slots[id] = Some(t);
    }
    let tokens = slots
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.unwrap_or_else(|| token(format!("[UNUSED_{i}]"), TokenKind::Unused)))
        .collect();
    Ok(Vocab::new(tokens))
}

fn token(text: String, kind: TokenKind) -> Token {
    Token {
        text: text.into_boxed_str(),
        score: 0.0,
        kind,
        lstrip: false,
        rstrip: false,
    }
}

fn read_merges(model: &Value) -> Result<Vec<(String, String)>, TokenizerError> {
    let list = model
        .get("merges")
        .and_then(Value::as_array)
        .ok_or_else(|| unsupported("BPE without merges"))?;
    list.iter()
        .map(|m| match m {
            Value::String(s) => s
                .split_once(' ')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or_else(|| unsupported(format!("merge {s:?} has no space"))),
            Value::Array(pair) => match pair.as_slice() {
                [Value::String(a), Value::String(b)] => Ok((a.clone(), b.clone())),
                _ => Err(unsupported("a merge is not a pair of strings")),
            },
            _ => Err(unsupported("a merge is neither a string nor a pair")),
        })
        .collect()
}

#[derive(Default)]
struct Normalizer {
    nfc: bool,
    spaces_to_metaspace: bool,
    prepend_metaspace: bool,
    /// WordPiece (`BertNormalizer`) options.
    lowercase: bool,
    strip_accents: bool,
}

/// The parts of a pipeline stage: the list under `key` of a `Sequence`, else the stage itself.
fn steps<'a>(stage: &'a Value, key: &str) -> Vec<&'a Value> {
    match stage.get("type").and_then(Value::as_str) {
        Some("Sequence") => stage
            .get(key)
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default(),
        _ => vec![stage],
    }
}

fn read_normalizer(n: Option<&Value>, wordpiece: bool) -> Result<Normalizer, TokenizerError> {
    let mut out = Normalizer::default();
    let Some(n) = n.filter(|n| !n.is_null()) else {
        return Ok(out);
    };
    let kind = |v: &Value| {
        v.get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    if wordpiece {
        // Only a BertNormalizer doing all it can, as the WordPiece splitter assumes.
        let full = |k: &str| n.get(k).and_then(Value::as_bool) != Some(false);
        if kind(n) != "BertNormalizer" || !full("clean_text") || !full("handle_chinese_chars") {
            return Err(unsupported(format!("WordPiece normalizer {n}")));
        }
        let flag = |k: &str| n.get(k).and_then(Value::as_bool);
        out.lowercase = flag("lowercase").unwrap_or(false);
        out.strip_accents = flag("strip_accents").unwrap_or(out.lowercase);
        return Ok(out);
    }
    for s in steps(n, "normalizers") {
        match kind(s).as_str() {
            "NFC" => out.nfc = true,
            "Replace"
                if s.pointer("/pattern/String").and_then(Value::as_str) == Some(" ")
                    && s.get("content").and_then(Value::as_str) == Some("\u{2581}") =>
            {
                out.spaces_to_metaspace = true
            }
            "Prepend" if s.get("prepend").and_then(Value::as_str) == Some("\u{2581}") => {
                out.prepend_metaspace = true
            }
            other => return Err(unsupported(format!("normalizer {other:?}"))),
        }
    }
    if out.prepend_metaspace && !out.spaces_to_metaspace {
        return Err(unsupported(
            "Prepend(\"\u{2581}\") without Replace(\" \", \"\u{2581}\")",
        ));
    }
    Ok(out)
}

/// The pre-tokenizer and whether the model works in GPT-2's byte alphabet. Only the
/// combinations the hand-written splitters reproduce exactly are accepted.
fn read_pre_tokenizer(
    p: Option<&Value>,
    metaspace: bool,
) -> Result<(Option<PreTokenizer>, bool), TokenizerError> {
    let Some(p) = p.filter(|p| !p.is_null()) else {
        return Ok((None, false));
    };
    let parts = steps(p, "pretokenizers");
    let mut split: Option<PreTokenizer> = None;
    let mut byte_level_regex = false;
    let mut byte_level = false;
    let mut digits = false;
    for s in parts {
        match s.get("type").and_then(Value::as_str).unwrap_or("") {
            "ByteLevel" => {
                byte_level = true;
                if s.get("add_prefix_space").and_then(Value::as_bool) == Some(true) {
                    return Err(unsupported("ByteLevel with add_prefix_space"));
                }
                byte_level_regex |= s.get("use_regex").and_then(Value::as_bool).unwrap_or(true);
            }
            "Split" => {
                let behavior = s.get("behavior").and_then(Value::as_str).unwrap_or("");
                let inverted = s.get("invert").and_then(Value::as_bool) == Some(true);
                if let Some(re) = s.pointer("/pattern/Regex").and_then(Value::as_str) {
                    if behavior != "Isolated" || inverted || split.is_some() {
                        return Err(unsupported(format!(
                            "Split {re:?} ({behavior}{})",
                            if inverted { ", inverted" } else { "" }
                        )));
                    }
                    split = Some(match re {
                        GPT2_REGEX => PreTokenizer::gpt2(),
                        LLAMA3_REGEX => PreTokenizer::llama3(),
                        QWEN2_REGEX => PreTokenizer::qwen2(),
                        other => return Err(unsupported(format!("pre-tokenizer regex {other:?}"))),
                    });
                } else if s.pointer("/pattern/String").and_then(Value::as_str) == Some(" ")
                    && metaspace
                    && !inverted
                {
                    // Spaces already became `▁`, so there is nothing left to split at.
                } else {
                    return Err(unsupported(format!("Split {s}")));
                }
            }
            "Digits" if s.get("individual_digits").and_then(Value::as_bool) == Some(true) => {
                digits = true
            }
            other => return Err(unsupported(format!("pre-tokenizer {other:?}"))),
        }
    }
    let pre = match (split, byte_level_regex, digits) {
        (Some(_), true, _) => {
            return Err(unsupported("a Split regex and a ByteLevel regex together"))
        }
        (Some(_), _, true) => return Err(unsupported("Digits with a Split regex")),
        (Some(p), false, false) => Some(p),
        (None, true, true) => Some(PreTokenizer::smollm()),
        (None, true, false) => Some(PreTokenizer::gpt2()),
        (None, false, true) => return Err(unsupported("Digits without a ByteLevel regex")),
        (None, false, false) => None,
    };
    Ok((pre, byte_level))
}

/// Framing from the post-processor: tokens before and after a single sequence (BOS/CLS
/// before; after, EOS for BPE and SEP for WordPiece).
fn read_post_processor(
    p: Option<&Value>,
    vocab: &Vocab,
    wordpiece: bool,
    special: &mut SpecialTokens,
    rules: &mut Rules,
) -> Result<(), TokenizerError> {
    let Some(p) = p.filter(|p| !p.is_null()) else {
        return Ok(());
    };
    let id = |name: &str| {
        vocab.id(name.as_bytes()).ok_or_else(|| {
            unsupported(format!(
                "post-processor token {name:?} is not in the vocabulary"
            ))
        })
    };
    let mut frame = |before: Option<&str>, after: Option<&str>| -> Result<(), TokenizerError> {
        if let Some(b) = before {
            special.bos = Some(id(b)?);
            rules.add_bos = true;
        }
        if let Some(a) = after {
            let a = id(a)?;
            if wordpiece {
                special.sep = Some(a);
            } else {
                special.eos = Some(a);
                rules.add_eos = true;
            }
        }
        Ok(())
    };
    for p in steps(p, "processors") {
        match p.get("type").and_then(Value::as_str).unwrap_or("") {
            // Only moves offsets.
            "ByteLevel" => {}
            "TemplateProcessing" => {
                let single = p
                    .get("single")
                    .and_then(Value::as_array)
                    .ok_or_else(|| unsupported("template without single"))?;
                let seq = single
                    .iter()
                    .position(|x| x.get("Sequence").is_some())
                    .ok_or_else(|| unsupported("template without $A"))?;
                fn name(x: &Value) -> Option<&str> {
                    x.pointer("/SpecialToken/id").and_then(Value::as_str)
                }
                let before: Vec<&str> = single[..seq].iter().filter_map(name).collect();
                let after: Vec<&str> = single[seq + 1..].iter().filter_map(name).collect();
                if before.len() > 1 || after.len() > 1 {
                    return Err(unsupported("template with several tokens on one side"));
                }
                frame(before.first().copied(), after.first().copied())?;
            }
            "BertProcessing" | "RobertaProcessing" => {
                let tok = |k: &str| {
                    p.get(k)
                        .and_then(Value::as_array)
                        .and_then(|a| a.first())
                        .and_then(Value::as_str)
                };
                frame(tok("cls"), tok("sep"))?;
            }
            other => return Err(unsupported(format!("post-processor {other:?}"))),
        }
    }
    Ok(())
}

/// `chat_template` is a string, or a list of `{name, template}`: "default", else the first.
fn chat_template_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => {
            let named: Vec<(&str, &str)> = list
                .iter()
                .filter_map(|t| Some((t.get("name")?.as_str()?, t.get("template")?.as_str()?)))
                .collect();
            let pick = named
                .iter()
                .find(|(n, _)| *n == "default")
                .or(named.first());
            pick.map(|(_, t)| (*t).to_owned())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_regex_is_refused_by_name() {
        let p = serde_json::json!({"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated", "invert": false});
        let e = read_pre_tokenizer(Some(&p), false)
            .expect_err("refused")
            .to_string();
        assert!(e.contains("\\\\w+"), "{e}");
    }

    #[test]
    fn template_list_prefers_default() {
        let v = serde_json::json!([{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]);
        assert_eq!(chat_template_of(&v).as_deref(), Some("D"));
    }
}
