//! Building a tokenizer from GGUF `tokenizer.ggml.*` metadata.
//!
//! The algorithm comes from `tokenizer.ggml.model` (`llama` = SentencePiece, `gpt2` =
//! byte-level BPE, `bert` = WordPiece) and, for BPE, the pre-tokenizer from
//! `tokenizer.ggml.pre`, never from the architecture name. Defaults for missing keys are the
//! ones GGUF converters and llama.cpp assume, so files that omit a key behave as they do there.
//! Roles the metadata does not state (end of turn, end of message) are recognised by token
//! text, and every such end marker is forced to be a control token.

use std::path::Path;

use akunu_formats::gguf::{GgufFile, Value};

use crate::bpe::{Bpe, BpeSpec};
use crate::error::invalid;
use crate::pretok::pre_settings;
use crate::roles::derive_roles;
use crate::tokenizer::{Model, Rules, Source, SpecialTokens, Tokenizer};
use crate::vocab::{Token, TokenKind, Vocab};
use crate::wpm::{Style, Wpm};
use crate::{TokenId, TokenizerError};

const KEY: &str = "tokenizer.ggml.";

impl Tokenizer {
    /// Reads only the metadata of a GGUF file (vocabulary-only files work too).
    pub fn from_gguf_path(path: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let path = path.as_ref();
        let file = GgufFile::open(path)
            .map_err(|e| TokenizerError::Invalid(format!("{}: {e}", path.display())))?;
        Self::from_gguf(&file)
    }

    pub fn from_gguf(file: &GgufFile) -> Result<Self, TokenizerError> {
        let get = |k: &str| file.get(&format!("{KEY}{k}"));
        let model_name = get("model").ok_or(TokenizerError::NoTokenizer)?;
        let model_name = model_name
            .as_str()
            .ok_or_else(|| invalid("tokenizer.ggml.model is not a string"))?;
        let pre_name = match get("pre") {
            Some(v) => v
                .as_str()
                .ok_or_else(|| invalid("tokenizer.ggml.pre is not a string"))?,
            None => "",
        };
        let flag = |k: &str| -> Result<Option<bool>, TokenizerError> {
            get(k)
                .map(|v| {
                    v.as_bool()
                        .ok_or_else(|| invalid(format!("{KEY}{k} is not a bool")))
                })
                .transpose()
        };

        match model_name {
            "llama" | "gpt2" | "bert" => {}
            "no_vocab" | "none" => return Err(TokenizerError::NoVocabulary(model_name.to_owned())),
            other => return Err(TokenizerError::UnsupportedModel(other.to_owned())),
        }
        let vocab = read_vocab(file)?;
        let n = vocab.len();
        let mut special = SpecialTokens::default();
        let mut rules = Rules::default();
        let model = match model_name {
            "llama" => {
                special.bos = Some(1);
                special.eos = Some(2);
                special.unk = Some(0);
                rules.add_space_prefix = true;
                rules.escape_spaces = true;
                rules.add_bos = true;
                Model::Spm
            }
            "gpt2" => {
                let pre = pre_settings(pre_name)?;
                special.bos = Some(11);
                special.eos = Some(11);
                rules.clean_spaces = pre.clean_spaces;
                rules.add_bos = pre.add_bos.unwrap_or(false);
                let merges = read_merges(file)?;
                let spec = BpeSpec {
                    pre: Some(pre.pre),
                    ignore_merges: pre.ignore_merges,
                    byte_level: true,
                    byte_fallback: false,
                    fuse_unk: false,
                    merges: merges
                        .iter()
                        .map(|(a, b)| (a.as_str(), b.as_str()))
                        .collect(),
                };
                Model::Bpe(Box::new(Bpe::new(&vocab, spec)))
            }
            "bert" => {
                special.bos = Some(101);
                special.unk = Some(100);
                special.sep = Some(102);
                special.pad = Some(0);
                special.mask = Some(103);
                rules.add_bos = true;
                rules.clean_spaces = true;
                let lowercase = flag("normalizer.lowercase")?.unwrap_or(false);
                let strip_accents = flag("normalizer.strip_accents")?.unwrap_or(lowercase);
                Model::Wpm(Wpm {
                    lowercase,
                    strip_accents,
                    style: Style::Gguf,
                })
            }
            _ => unreachable!("model names are checked above"),
        };
        if let Some(v) = flag("add_space_prefix")? {
            rules.add_space_prefix = v;
        }

        // Defaults past the end of the vocabulary are dropped; a file value out of range keeps
        // the default.
        for slot in [
            &mut special.bos,
            &mut special.eos,
            &mut special.unk,
            &mut special.sep,
            &mut special.pad,
            &mut special.mask,
        ] {
            if slot.is_some_and(|id| id as usize >= n) {
                *slot = None;
            }
        }
        let ids = [
            ("bos_token_id", &mut special.bos),
            ("eos_token_id", &mut special.eos),
            ("eot_token_id", &mut special.eot),
            ("eom_token_id", &mut special.eom),
            ("unknown_token_id", &mut special.unk),
            ("seperator_token_id", &mut special.sep),
            ("padding_token_id", &mut special.pad),
            ("mask_token_id", &mut special.mask),
        ];
        for (k, slot) in ids {
            if let Some(v) = get(k) {
                let id = v.as_int().filter(|_| v.as_bool().is_none());
                let id = id.ok_or_else(|| invalid(format!("{KEY}{k} is not an integer")))?;
                if (0..n as i128).contains(&id) {
                    *slot = Some(id as TokenId);
                }
            }
        }
        if let Some(v) = flag("add_bos_token")? {
            rules.add_bos = v;
        }
        if let Some(v) = flag("add_eos_token")? {
            rules.add_eos = v;
        }
        // Fill-in-the-middle roles: pre, suf, mid, pad, rep, sep (then the deprecated names).
        let mut fim = [None; 6];
        let fim_keys = [
            ("fim_pre_token_id", 0),
            ("fim_suf_token_id", 1),
            ("fim_mid_token_id", 2),
            ("fim_pad_token_id", 3),
            ("fim_rep_token_id", 4),
            ("fim_sep_token_id", 5),
            ("prefix_token_id", 0),
            ("suffix_token_id", 1),
            ("middle_token_id", 2),
        ];
        for (k, slot) in fim_keys {
            if let Some(id) = get(k)
                .and_then(|v| v.as_int().filter(|_| v.as_bool().is_none()))
                .filter(|id| (0..n as i128).contains(id))
            {
                fim[slot] = Some(id as TokenId);
            }
        }
        let mut vocab = vocab;
        let eog = derive_roles(&mut vocab, &mut special, fim, true);
        let name = file.get_str("general.name").unwrap_or("").to_lowercase();
        strip_attributes(
            &mut vocab,
            &name,
            pre_name,
            file.architecture().unwrap_or(""),
        );
        let template = file
            .get("tokenizer.chat_template")
            .and_then(|v| v.as_str().map(str::to_owned));
        if rules.add_bos && special.bos.is_none() {
            return Err(TokenizerError::MissingSpecial("BOS"));
        }
        if rules.add_eos && special.eos.is_none() {
            return Err(TokenizerError::MissingSpecial("EOS"));
        }
        Tokenizer::assemble(vocab, model, special, rules, eog, template, Source::Gguf)
    }
}

fn read_vocab(file: &GgufFile) -> Result<Vocab, TokenizerError> {
    let list = file
        .get("tokenizer.ggml.tokens")
        .ok_or_else(|| invalid("no tokenizer.ggml.tokens"))?
        .as_array()
        .filter(|a| a.strings().is_some())
        .ok_or_else(|| invalid("tokenizer.ggml.tokens is not an array of strings"))?;
    let n = list.len();
    if n == 0 {
        return Err(invalid("tokenizer.ggml.tokens is empty"));
    }
    if n > u32::MAX as usize / 2 {
        return Err(invalid(format!("{n} tokens is more than ids can address")));
    }
    let scores: Option<Vec<f32>> = match file.get("tokenizer.ggml.scores") {
        None => None,
        Some(v) => {
            let a = v
                .as_array()
                .ok_or_else(|| invalid("tokenizer.ggml.scores is not an array"))?;
            let s = a
                .to_f32_vec()
                .or_else(|| {
                    a.to_i32_vec()
                        .map(|v| v.into_iter().map(|x| x as f32).collect())
                })
                .ok_or_else(|| invalid("tokenizer.ggml.scores is not f32 or i32"))?;
            if s.len() < n {
                return Err(invalid(format!("{} scores for {n} tokens", s.len())));
            }
            Some(s)
        }
    };
    let types: Option<Vec<i32>> = match file.get("tokenizer.ggml.token_type") {
        None => None,
        Some(v) => {
            let t = v
                .as_array()
                .and_then(|a| a.to_i32_vec())
                .ok_or_else(|| invalid("tokenizer.ggml.token_type is not an i32 array"))?;
            if t.len() < n {
                return Err(invalid(format!("{} token types for {n} tokens", t.len())));
            }
            Some(t)
        }
    };
    let mut tokens = Vec::with_capacity(n);
    for (i, v) in list.iter().enumerate() {
        let text = match v {
            Value::String("") => format!("[EMPTY_{i}]"),
            Value::String(s) => s.to_owned(),
            _ => return Err(invalid(format!("token {i} is not a string"))),
        };
        tokens.push(Token {
            text: text.into_boxed_str(),
            score: scores.as_ref().map_or(0.0, |s| s[i]),
            kind: types
                .as_ref()
                .map_or(TokenKind::Normal, |t| TokenKind::from_gguf(t[i])),
            lstrip: false,
            rstrip: false,
        });
    }
    if tokens.len() != n {
        return Err(invalid(format!(
            "tokenizer.ggml.tokens lists {n} tokens but only {} could be read (invalid UTF-8?)",
            tokens.len()
        )));
    }
    let vocab = Vocab::new(tokens);
    if vocab.index.len() != vocab.len() {
        let mut seen = rustc_hash::FxHashSet::default();
        let dup = vocab
            .tokens
            .iter()
            .position(|t| !seen.insert(&t.text))
            .unwrap_or(0);
        return Err(invalid(format!(
            "token {dup} ({:?}) is listed twice",
            vocab.tokens[dup].text
        )));
    }
    Ok(vocab)
}

/// Token attributes GGUF cannot express but some models were trained with, keyed (as in
/// llama.cpp) by model, pre-tokenizer and architecture names: Phi-3's markup swallows the
/// whitespace after it, and some embedding models' mask token the whitespace before it.
fn strip_attributes(vocab: &mut Vocab, model_name: &str, pre: &str, arch: &str) {
    fn set(vocab: &mut Vocab, text: &str, f: fn(&mut Token)) {
        if let Some(id) = vocab.id(text.as_bytes()) {
            f(&mut vocab.tokens[id as usize]);
        }
    }
    if ["jina-v2-de", "jina-v2-es", "jina-v2-code"]
        .iter()
        .any(|p| pre.contains(p))
        || ["nomic-bert-moe", "jina-bert-v3"]
            .iter()
            .any(|a| arch.contains(a))
    {
        set(vocab, "<mask>", |t| t.lstrip = true);
    } else if model_name.contains("phi-3") || model_name.contains("phi3") {
        for t in &mut vocab.tokens {
            if matches!(
                t.kind,
                TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
            ) {
                t.rstrip = true;
            }
        }
        set(vocab, "</s>", |t| t.rstrip = true);
        for text in ["<unk>", "<s>", "<|endoftext|>"] {
            set(vocab, text, |t| t.rstrip = false);
        }
    } else if model_name.contains("modern-bert") {
        set(vocab, "[MASK]", |t| t.lstrip = true);
    }
}

fn read_merges(file: &GgufFile) -> Result<Vec<(String, String)>, TokenizerError> {
    let merges = file
        .get("tokenizer.ggml.merges")
        .ok_or_else(|| invalid("a gpt2 tokenizer needs tokenizer.ggml.merges"))?;
    let list = merges
        .as_array()
        .filter(|a| a.strings().is_some())
        .ok_or_else(|| invalid("tokenizer.ggml.merges is not an array of strings"))?;
    let mut out = Vec::with_capacity(list.len());
    for v in list.iter() {
        let s = v
            .as_str()
            .ok_or_else(|| invalid("a merge is not a string"))?;
        // Split at the first space after the first byte, so a merge of a space token works.
        let split = s.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1);
        match split {
            Some(p) => out.push((s[..p].to_owned(), s[p + 1..].to_owned())),
            None => out.push((String::new(), String::new())),
        }
    }
    if out.len() != list.len() {
        return Err(invalid(
            "tokenizer.ggml.merges could not be read in full (invalid UTF-8?)",
        ));
    }
    Ok(out)
}
