//! The tokenizer: one vocabulary, one algorithm, the special tokens and the framing rules.

use rustc_hash::{FxHashMap, FxHashSet};
use unicode_normalization::UnicodeNormalization;

use crate::bpe::Bpe;
use crate::special::{Fragment, Specials};
use crate::stream::StreamDecoder;
use crate::unicode::ByteLevel;
use crate::vocab::{TokenKind, Vocab};
use crate::wpm::{Style, Wpm};
use crate::{TokenId, TokenizerError};

/// The segmentation algorithm.
#[derive(Clone, Debug)]
pub(crate) enum Model {
    /// SentencePiece BPE by scores.
    Spm,
    Bpe(Box<Bpe>),
    Wpm(Wpm),
}

/// Where a tokenizer was built from; the two differ in small, documented ways (see
/// [`Tokenizer::from_gguf`] and [`Tokenizer::from_hf_json`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Gguf,
    TokenizerJson,
}

/// Ids of the tokens with a role, where the model has them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<TokenId>,
    pub eos: Option<TokenId>,
    /// End of turn (`<end_of_turn>`, `<|eot_id|>`, `<|im_end|>`).
    pub eot: Option<TokenId>,
    /// End of message (Llama 3.1's `<|eom_id|>`).
    pub eom: Option<TokenId>,
    pub unk: Option<TokenId>,
    pub sep: Option<TokenId>,
    pub pad: Option<TokenId>,
    pub mask: Option<TokenId>,
}

/// Framing and normalisation rules that come with a vocabulary.
#[derive(Clone, Debug, Default)]
pub(crate) struct Rules {
    pub add_bos: bool,
    pub add_eos: bool,
    /// SentencePiece: a space before text that starts the input or follows a special token.
    pub add_space_prefix: bool,
    /// Spaces become `▁` before the model sees them (SentencePiece-style vocabularies).
    pub escape_spaces: bool,
    /// NFC-normalise text before splitting (Hugging Face `NFC` normalizer).
    pub nfc: bool,
    /// Tidy spaces around punctuation when decoding, if asked to.
    pub clean_spaces: bool,
}

/// How to encode.
#[derive(Clone, Copy, Debug)]
pub struct EncodeOptions {
    /// Add the model's framing tokens (BOS/EOS/CLS/SEP) where the model asks for them.
    pub add_special: bool,
    /// Recognise control tokens written in the text (`<|im_start|>`), rather than spelling
    /// them out as ordinary text. User-defined tokens are always recognised.
    pub parse_special: bool,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        Self {
            add_special: true,
            parse_special: false,
        }
    }
}

/// How to decode.
#[derive(Clone, Copy, Debug, Default)]
pub struct DecodeOptions {
    /// Drop a leading BOS and trailing EOS that framing added.
    pub remove_special: bool,
    /// Render control tokens as their text instead of hiding them.
    pub render_special: bool,
    /// Remove spaces before punctuation and contractions (`clean_up_tokenization_spaces`).
    /// Off: decoding is the exact inverse. llama.cpp's detokenizer applies the model's own
    /// setting, [`Tokenizer::cleans_spaces`]; pass that to decode as it does.
    pub clean_spaces: bool,
}

/// A tokenizer built from GGUF metadata or a Hugging Face `tokenizer.json`.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    pub(crate) vocab: Vocab,
    pub(crate) model: Model,
    pub(crate) specials: Specials,
    pub(crate) special: SpecialTokens,
    pub(crate) rules: Rules,
    /// What each token prints as when special tokens are rendered.
    pub(crate) pieces: Vec<Box<[u8]>>,
    pub(crate) eog: FxHashSet<TokenId>,
    pub(crate) chat_template: Option<String>,
    pub(crate) source: Source,
}

impl Tokenizer {
    pub(crate) fn assemble(
        vocab: Vocab,
        model: Model,
        special: SpecialTokens,
        rules: Rules,
        eog: FxHashSet<TokenId>,
        chat_template: Option<String>,
        source: Source,
    ) -> Result<Self, TokenizerError> {
        let json = source == Source::TokenizerJson;
        let pieces = render_pieces(&vocab, &model, rules.escape_spaces, json);
        let specials = Specials::new(&vocab)?;
        Ok(Self {
            vocab,
            model,
            specials,
            special,
            rules,
            pieces,
            eog,
            chat_template,
            source,
        })
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }

    /// The algorithm: "spm", "bpe" or "wordpiece".
    pub fn algorithm(&self) -> &'static str {
        match self.model {
            Model::Spm => "spm",
            Model::Bpe(_) => "bpe",
            Model::Wpm(_) => "wordpiece",
        }
    }

    /// The pre-tokenizer's name, for BPE vocabularies that have one.
    pub fn pre_tokenizer(&self) -> Option<&'static str> {
        match &self.model {
            Model::Bpe(b) => b.pre.as_ref().map(|p| p.name()),
            _ => None,
        }
    }

    /// Where the tokenizer came from.
    pub fn source(&self) -> Source {
        self.source
    }

    pub fn special_tokens(&self) -> SpecialTokens {
        self.special
    }

    /// Whether encoding with `add_special` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.rules.add_bos
    }

    pub fn add_eos(&self) -> bool {
        self.rules.add_eos
    }

    /// The Jinja chat template shipped with the model, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The token's text as stored in the vocabulary.
    pub fn token_text(&self, id: TokenId) -> Option<&str> {
        self.vocab.get(id).map(|t| &*t.text)
    }

    pub fn token_kind(&self, id: TokenId) -> Option<TokenKind> {
        self.vocab.get(id).map(|t| t.kind)
    }

    /// The id of a token by its exact vocabulary text.
    pub fn token_id(&self, text: &str) -> Option<TokenId> {
        self.vocab.id(text.as_bytes())
    }

    /// Whether generating `id` ends the turn (EOS, end-of-turn and the like).
    pub fn is_eog(&self, id: TokenId) -> bool {
        self.eog.contains(&id)
    }

    /// All end-of-generation ids, sorted.
    pub fn eog_ids(&self) -> Vec<TokenId> {
        let mut v: Vec<TokenId> = self.eog.iter().copied().collect();
        v.sort_unstable();
        v
    }

    /// Adds `text` to the end-of-generation set when it is a single special token (the
    /// end-of-turn marker of a chat template). Returns its id.
    pub(crate) fn add_end_of_turn_text(&mut self, text: &str) -> Option<TokenId> {
        let ids = self.encode(
            text.trim(),
            EncodeOptions {
                add_special: false,
                parse_special: true,
            },
        );
        match ids.as_slice() {
            &[id] if self.vocab.tokens[id as usize].kind != TokenKind::Normal => {
                self.eog.insert(id);
                Some(id)
            }
            _ => None,
        }
    }

    /// Text to token ids.
    pub fn encode(&self, text: &str, opts: EncodeOptions) -> Vec<TokenId> {
        let normalized;
        let text = if self.rules.nfc {
            normalized = text.nfc().collect::<String>();
            normalized.as_str()
        } else {
            text
        };
        let fragments = self
            .specials
            .partition(&self.vocab, text, opts.parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        let unk = self.special.unk;
        let (bos, eos) = (
            opts.add_special && self.rules.add_bos,
            opts.add_special && self.rules.add_eos,
        );
        match &self.model {
            Model::Spm => {
                if bos {
                    out.extend(self.special.bos);
                }
                let mut after_special = true;
                let mut buf = Vec::new();
                for f in fragments {
                    match f {
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                        Fragment::Text(s, e) => {
                            buf.clear();
                            if self.rules.add_space_prefix && after_special {
                                buf.extend_from_slice("\u{2581}".as_bytes());
                            }
                            escape_spaces(&text[s..e], &mut buf);
                            crate::spm::encode(&self.vocab, unk, &buf, &mut out);
                            after_special = false;
                        }
                    }
                }
                if eos {
                    out.extend(self.special.eos);
                }
            }
            Model::Bpe(bpe) => {
                if bos {
                    out.extend(self.special.bos);
                }
                let mut cache = FxHashMap::default();
                let mut escaped = String::new();
                for f in fragments {
                    match f {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(s, e) if self.rules.escape_spaces => {
                            escaped.clear();
                            // Every text run follows the start or a special token, which is where
                            // a `Prepend("▁")` normalizer adds its space.
                            if self.rules.add_space_prefix {
                                escaped.push('\u{2581}');
                            }
                            escaped.extend(text[s..e].chars().map(|c| {
                                if c == ' ' {
                                    '\u{2581}'
                                } else {
                                    c
                                }
                            }));
                            bpe.encode(&self.vocab, unk, &escaped, &mut cache, &mut out);
                        }
                        Fragment::Text(s, e) => {
                            bpe.encode(&self.vocab, unk, &text[s..e], &mut cache, &mut out)
                        }
                    }
                }
                if eos {
                    out.extend(self.special.eos);
                }
            }
            Model::Wpm(wpm) => {
                // GGUF WordPiece always frames with CLS and SEP when asked (as llama.cpp does);
                // tokenizer.json frames as its post-processor says.
                let cls = opts.add_special && (self.source == Source::Gguf || self.rules.add_bos);
                if cls {
                    out.extend(self.special.bos);
                }
                for f in fragments {
                    match f {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(s, e) => wpm.encode(&self.vocab, unk, &text[s..e], &mut out),
                    }
                }
                if opts.add_special {
                    out.extend(self.special.sep);
                }
            }
        }
        out
    }

    /// What `id` prints as: empty for control tokens unless `render_special`, and for ids out
    /// of range. May be part of a UTF-8 character (byte tokens).
    pub fn piece(&self, id: TokenId, render_special: bool) -> &[u8] {
        match self.vocab.get(id) {
            Some(t) if render_special || !t.kind.is_special() => &self.pieces[id as usize],
            _ => &[],
        }
    }

    /// Token ids to bytes (which need not be UTF-8 when the ids were not made by `encode`).
    pub fn decode_bytes(&self, ids: &[TokenId], opts: DecodeOptions) -> Vec<u8> {
        let mut ids = ids;
        let mut strip_space = self.rules.add_space_prefix;
        if opts.remove_special
            && self.rules.add_bos
            && ids.first().is_some_and(|&t| Some(t) == self.special.bos)
        {
            ids = &ids[1..];
            strip_space = false;
        }
        if opts.remove_special
            && self.rules.add_eos
            && ids.last().is_some_and(|&t| Some(t) == self.special.eos)
        {
            ids = &ids[..ids.len() - 1];
        }
        let mut out = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let mut p = self.piece(id, opts.render_special);
            if i == 0 && strip_space {
                p = p.strip_prefix(b" ").unwrap_or(p);
            }
            out.extend_from_slice(p);
        }
        if opts.clean_spaces {
            clean_spaces(&mut out);
        }
        out
    }

    /// Token ids to text; invalid UTF-8 (from ids that split a character) becomes U+FFFD.
    pub fn decode(&self, ids: &[TokenId], opts: DecodeOptions) -> String {
        match String::from_utf8(self.decode_bytes(ids, opts)) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    /// Whether decoding tidies spaces by default for this model (`clean_up_tokenization_spaces`).
    pub fn cleans_spaces(&self) -> bool {
        self.rules.clean_spaces
    }

    /// An incremental decoder that yields only complete UTF-8 text.
    pub fn stream(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }
}

fn escape_spaces(text: &str, out: &mut Vec<u8>) {
    for &b in text.as_bytes() {
        if b == b' ' {
            out.extend_from_slice("\u{2581}".as_bytes());
        } else {
            out.push(b);
        }
    }
}

/// What each token prints as. GGUF pieces follow llama.cpp: markup as written, `▁` as a
/// space in normal SentencePiece/WordPiece pieces, GPT-2's alphabet decoded. `tokenizer.json`
/// pieces follow the file's decoder, which also applies to added tokens (`▁` in them is a
/// space) and joins WordPiece continuations without a space.
fn render_pieces(vocab: &Vocab, model: &Model, escape_spaces: bool, json: bool) -> Vec<Box<[u8]>> {
    let bl = ByteLevel::new();
    let byte_level = matches!(model, Model::Bpe(b) if b.byte_level);
    let continuation = match model {
        Model::Wpm(Wpm {
            style: Style::Hf { continuation, .. },
            ..
        }) => Some(continuation.as_str()),
        _ => None,
    };
    let spaces = |text: &str| -> Box<[u8]> { text.replace('\u{2581}', " ").into_bytes().into() };
    vocab
        .tokens
        .iter()
        .map(|t| -> Box<[u8]> {
            match t.kind {
                TokenKind::Control | TokenKind::Unknown | TokenKind::UserDefined => {
                    if json && escape_spaces {
                        spaces(&t.text)
                    } else {
                        t.text.as_bytes().into()
                    }
                }
                TokenKind::Normal if byte_level && !escape_spaces => {
                    byte_level_text(&bl, &t.text).into()
                }
                TokenKind::Normal => match continuation {
                    Some(c) => match t.text.strip_prefix(c) {
                        Some(rest) => rest.as_bytes().into(),
                        None => format!(" {}", t.text).into_bytes().into(),
                    },
                    None => spaces(&t.text),
                },
                TokenKind::Byte => {
                    let hex = t
                        .text
                        .get(3..5)
                        .and_then(|h| u8::from_str_radix(h, 16).ok());
                    vec![hex.unwrap_or(0)].into()
                }
                TokenKind::Unused | TokenKind::Undefined => Box::default(),
            }
        })
        .collect()
}

/// A normal token's text in GPT-2's alphabet back to bytes; characters outside the alphabet
/// are spelled out in a visible marker rather than dropped.
fn byte_level_text(bl: &ByteLevel, text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match bl.byte_of(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                // llama.cpp appends the whole token text to every marker; a hostile vocabulary
                // could make that quadratic, so long texts get the marker alone.
                if text.len() <= 256 {
                    out.extend_from_slice(text.as_bytes());
                }
                out.push(b']');
            }
        }
    }
    out
}

/// `clean_up_tokenization_spaces`: " ?", " !", " .", " ," lose the space; a lone " ' " loses
/// both; " 's", " 'm", " 're", " 've" lose the space.
fn clean_spaces(t: &mut Vec<u8>) {
    let mut out: Vec<u8> = Vec::with_capacity(t.len());
    for (i, &x) in t.iter().enumerate() {
        if i > 0 && t[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            out.pop();
        }
        out.push(x);
    }
    // The space after a lone apostrophe is dropped by blanking it, so it no longer counts as
    // the space before the next character.
    let mut t2 = std::mem::take(&mut out);
    let mut i = 0;
    while i < t2.len() {
        let x = t2[i];
        if i > 0 && x == b'\'' && i + 1 < t2.len() && t2[i - 1] == b' ' && t2[i + 1] == b' ' {
            out.pop();
            out.push(x);
            t2[i + 1] = 0;
            i += 2;
            continue;
        }
        out.push(x);
        i += 1;
    }
    let t3 = std::mem::take(&mut out);
    for (i, &x) in t3.iter().enumerate() {
        if i > 0 && t3[i - 1] == b' ' && x == b'\'' && i + 1 < t3.len() {
            let (x1, x2) = (t3[i + 1], t3.get(i + 2).copied());
            let drop = matches!(x1, b's' | b'm')
                || matches!((x1, x2), (b'r', Some(b'e')) | (b'v', Some(b'e')));
            if drop {
                out.pop();
            }
        }
        out.push(x);
    }
    *t = out;
}
