//! Building a tokenizer from a Hugging Face `tokenizer.json` (and `tokenizer_config.json`).
//!
//! The file's pipeline (normalizer, pre-tokenizer, model, post-processor) is mapped onto the
//! same algorithms the GGUF path uses, the way GGUF converters translate these files:
//! added tokens become control (special) or user-defined tokens, and the pre-tokenizer regex
//! is recognised among the families implemented by hand. Anything else is refused with a message that names it,
//! rather than tokenized approximately.

use std::path::Path;

use rustc_hash::FxHashMap;
use serde_json::Value;

use crate::bpe::{Bpe, BpeSpec};
use crate::pretok::PreTokenizer;
use crate::roles::derive_roles;
use crate::tokenizer::{Model, Rules, SpecialTokens, Tokenizer};
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
            &mut special,
            &mut rules,
        )?;
        rules.clean_spaces = config
            .and_then(|c| c.get("clean_up_tokenization_spaces"))
            .and_then(Value::as_bool)
            .unwrap_or(false);

        let normalizer = read_normalizer(tokenizer.get("normalizer"))?;
        rules.nfc = normalizer.nfc;
        rules.escape_spaces = normalizer.spaces_to_metaspace;
        rules.add_space_prefix = normalizer.prepend_metaspace;

        let model = if wordpiece {
            let n = tokenizer.get("normalizer").filter(|n| !n.is_null());
            let lowercase = n
                .and_then(|n| n.get("lowercase"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let strip_accents = n
                .and_then(|n| n.get("strip_accents"))
                .and_then(Value::as_bool)
                .unwrap_or(lowercase);
            let max_word_chars = model
                .get("max_input_chars_per_word")
                .and_then(Value::as_u64)
                .unwrap_or(100);
            let continuation = model
                .get("continuing_subword_prefix")
                .and_then(Value::as_str)
                .unwrap_or("##")
                .to_owned();
            special.sep = special.sep.or_else(|| vocab.id(b"[SEP]"));
            let style = Style::Hf {
                continuation,
                max_word_chars: max_word_chars as usize,
            };
            Model::Wpm(Wpm {
                lowercase,
                strip_accents,
                style,
            })
        } else {
            let (pre, byte_level) = read_pre_tokenizer(tokenizer.get("pre_tokenizer"))?;
            let merges = read_merges(model)?;
            let spec = BpeSpec {
                pre,
                ignore_merges: model
                    .get("ignore_merges")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                byte_level,
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
        Ok(Tokenizer::assemble(
            vocab,
            model,
            special,
            rules,
            eog,
            template,
            "tokenizer.json",
        ))
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
}

fn read_normalizer(n: Option<&Value>) -> Result<Normalizer, TokenizerError> {
    let mut out = Normalizer::default();
    let Some(n) = n.filter(|n| !n.is_null()) else {
        return Ok(out);
    };
    let steps: Vec<&Value> = match n.get("type").and_then(Value::as_str) {
        Some("Sequence") => n
            .get("normalizers")
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default(),
        _ => vec![n],
    };
    for s in steps {
        match s.get("type").and_then(Value::as_str).unwrap_or("") {
            "NFC" => out.nfc = true,
            // WordPiece options are read with the model.
            "BertNormalizer" => {}
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
    Ok(out)
}

/// The pre-tokenizer and whether the model works in GPT-2's byte alphabet.
fn read_pre_tokenizer(p: Option<&Value>) -> Result<(Option<PreTokenizer>, bool), TokenizerError> {
    let Some(p) = p.filter(|p| !p.is_null()) else {
        return Ok((None, false));
    };
    let steps: Vec<&Value> = match p.get("type").and_then(Value::as_str) {
        Some("Sequence") => p
            .get("pretokenizers")
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default(),
        _ => vec![p],
    };
    let mut pre = None;
    let mut byte_level = false;
    let mut digits = false;
    for s in steps {
        match s.get("type").and_then(Value::as_str).unwrap_or("") {
            "ByteLevel" => {
                byte_level = true;
                if s.get("add_prefix_space").and_then(Value::as_bool) == Some(true) {
                    return Err(unsupported("ByteLevel with add_prefix_space"));
                }
                if s.get("use_regex").and_then(Value::as_bool).unwrap_or(true) {
                    pre.get_or_insert_with(PreTokenizer::gpt2);
                }
            }
            "Split" => {
                if let Some(re) = s.pointer("/pattern/Regex").and_then(Value::as_str) {
                    let behavior = s.get("behavior").and_then(Value::as_str).unwrap_or("");
                    if behavior != "Isolated"
                        || s.get("invert").and_then(Value::as_bool) == Some(true)
                    {
                        return Err(unsupported(format!("Split behavior {behavior:?}")));
                    }
                    pre = Some(match re {
                        GPT2_REGEX => PreTokenizer::gpt2(),
                        LLAMA3_REGEX => PreTokenizer::llama3(),
                        QWEN2_REGEX => PreTokenizer::qwen2(),
                        other => return Err(unsupported(format!("pre-tokenizer regex {other:?}"))),
                    });
                } else if s.pointer("/pattern/String").and_then(Value::as_str) == Some(" ") {
                    // Splitting at spaces after spaces became `▁` finds nothing to split.
                } else {
                    return Err(unsupported("Split pattern"));
                }
            }
            "Digits" if s.get("individual_digits").and_then(Value::as_bool) == Some(true) => {
                digits = true
            }
            other => return Err(unsupported(format!("pre-tokenizer {other:?}"))),
        }
    }
    if digits {
        match pre {
            Some(p) if p.name() == "gpt2" => pre = Some(PreTokenizer::smollm()),
            _ => return Err(unsupported("Digits with this pre-tokenizer")),
        }
    }
    Ok((pre, byte_level))
}

/// Framing from the post-processor: BOS/CLS before and EOS/SEP after a single sequence.
fn read_post_processor(
    p: Option<&Value>,
    vocab: &Vocab,
    special: &mut SpecialTokens,
    rules: &mut Rules,
) -> Result<(), TokenizerError> {
    let Some(p) = p.filter(|p| !p.is_null()) else {
        return Ok(());
    };
    let id = |name: &str| vocab.id(name.as_bytes());
    match p.get("type").and_then(Value::as_str).unwrap_or("") {
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
            let name = |x: &Value| {
                x.pointer("/SpecialToken/id")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            let before: Vec<String> = single[..seq].iter().filter_map(name).collect();
            let after: Vec<String> = single[seq + 1..].iter().filter_map(name).collect();
            if before.len() > 1 || after.len() > 1 {
                return Err(unsupported("template with several tokens on one side"));
            }
            if let Some(b) = before.first() {
                special.bos = Some(id(b).ok_or_else(|| {
                    unsupported(format!("template token {b:?} is not in the vocabulary"))
                })?);
                rules.add_bos = true;
            }
            if let Some(e) = after.first() {
                let eid = id(e).ok_or_else(|| {
                    unsupported(format!("template token {e:?} is not in the vocabulary"))
                })?;
                if e == "[SEP]"
                    || e == "</s>"
                        && before.first().is_some_and(|b| b == "<s>")
                        && special.eos.is_none()
                {
                    special.sep = Some(eid);
                } else {
                    special.eos = Some(eid);
                    rules.add_eos = true;
                }
            }
        }
        "BertProcessing" | "RobertaProcessing" => {
            let tok = |k: &str| {
                p.get(k)
                    .and_then(Value::as_array)
                    .and_then(|a| a.first())
                    .and_then(Value::as_str)
                    .and_then(id)
            };
            special.bos = tok("cls");
            special.sep = tok("sep");
            rules.add_bos = special.bos.is_some();
        }
        other => return Err(unsupported(format!("post-processor {other:?}"))),
    }
    Ok(())
}

/// `chat_template` is a string, or a list of `{name, template}` of which "default" is used.
fn chat_template_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => {
            let named: FxHashMap<&str, &str> = list
                .iter()
                .filter_map(|t| Some((t.get("name")?.as_str()?, t.get("template")?.as_str()?)))
                .collect();
            named
                .get("default")
                .or_else(|| named.values().next())
                .map(|s| (*s).to_owned())
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
        let e = read_pre_tokenizer(Some(&p))
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
