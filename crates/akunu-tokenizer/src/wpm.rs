//! WordPiece (`tokenizer.ggml.model = "bert"`, Hugging Face `WordPiece`).
//!
//! Text is normalised (control characters dropped, optionally lowercased and stripped of
//! accents), split on whitespace, and every punctuation mark, ASCII symbol and CJK ideograph
//! becomes a word of its own. Each word is covered greedily by the longest matching piece from
//! left to right; a word with any uncovered position becomes the unknown token.
//!
//! The two sources spell pieces differently and differ in small normalisation details, so both
//! are kept exact: GGUF files mark word-initial pieces with a `▁` prefix and leave
//! continuations bare (the word is matched with a `▁` in front), while `tokenizer.json` leaves
//! word starts bare and prefixes continuations (`##`).

use unicode_general_category::{get_general_category, GeneralCategory};
use unicode_normalization::char::decompose_canonical;

use crate::unicode::{class, to_lower, Kind};
use crate::vocab::Vocab;
use crate::TokenId;

#[derive(Clone, Debug)]
pub(crate) struct Wpm {
    pub lowercase: bool,
    pub strip_accents: bool,
    pub style: Style,
}

#[derive(Clone, Debug)]
pub(crate) enum Style {
    /// As llama.cpp reads GGUF: spaces are checked before control characters, accents are
    /// stripped by keeping the first character of the canonical decomposition, lowercase is
    /// the simple mapping.
    Gguf,
    /// As Hugging Face's `BertNormalizer`/`BertPreTokenizer`/`WordPiece`: control characters
    /// go before spaces are looked at, accents are nonspacing marks of the full decomposition,
    /// lowercase is the full mapping, long words are unknown outright.
    Hf {
        continuation: String,
        max_word_chars: usize,
    },
}

impl Wpm {
    pub fn encode(&self, vocab: &Vocab, unk: Option<TokenId>, text: &str, out: &mut Vec<TokenId>) {
        let mut buf = String::new();
        for w in self.words(text) {
            let start = out.len();
            let covered = match &self.style {
                Style::Gguf => {
                    buf.clear();
                    buf.push('\u{2581}');
                    buf.push_str(&w);
                    cover(vocab, &buf, "", out)
                }
                Style::Hf {
                    continuation,
                    max_word_chars,
                } => w.chars().count() <= *max_word_chars && cover(vocab, &w, continuation, out),
            };
            if !covered {
                out.truncate(start);
                out.extend(unk);
            }
        }
    }

    fn words(&self, text: &str) -> Vec<String> {
        let hf = matches!(self.style, Style::Hf { .. });
        let mut words = vec![String::new()];
        let push = |words: &mut Vec<String>, c: char| {
            let cls = class(c);
            let dropped = |c: char| {
                c == '\0'
                    || c == '\u{fffd}'
                    || (cls.kind == Kind::Control && !matches!(c, '\t' | '\n' | '\r'))
            };
            if hf && dropped(c) {
                return;
            }
            if cls.space {
                if !words.last().is_some_and(String::is_empty) {
                    words.push(String::new());
                }
                return;
            }
            if dropped(c) {
                return;
            }
            let nonspacing = || get_general_category(c) == GeneralCategory::NonspacingMark;
            if self.strip_accents && cls.kind == Kind::Mark && (!hf || nonspacing()) {
                return;
            }
            let alone = cls.kind == Kind::Punctuation
                || (c.is_ascii() && cls.kind == Kind::Symbol)
                || is_cjk(c);
            if alone && !words.last().is_some_and(String::is_empty) {
                words.push(String::new());
            }
            let last = words.last_mut().expect("never empty");
            match (self.lowercase, hf) {
                (false, _) => last.push(c),
                (true, false) => last.push(to_lower(c)),
                (true, true) => last.extend(c.to_lowercase()),
            }
            if alone {
                words.push(String::new());
            }
        };
        for c in text.chars() {
            if !self.strip_accents {
                push(&mut words, c);
            } else if hf {
                decompose_canonical(c, |d| push(&mut words, d));
            } else {
                let mut first = None;
                decompose_canonical(c, |d| {
                    first.get_or_insert(d);
                });
                push(&mut words, first.unwrap_or(c));
            }
        }
        words.retain(|w| !w.is_empty());
        words
    }
}

/// Greedy longest-match cover of `word`; pieces after the first carry `continuation` in front.
/// False when some position has no piece.
fn cover(vocab: &Vocab, word: &str, continuation: &str, out: &mut Vec<TokenId>) -> bool {
    let mut key = String::new();
    let mut i = 0;
    while i < word.len() {
        let prefix = if i > 0 { continuation } else { "" };
        let found = vocab
            .lengths
            .iter()
            .filter_map(|&len| {
                len.checked_sub(prefix.len())
                    .filter(|&n| n > 0)
                    .map(|n| i + n)
            })
            .filter(|&j| j <= word.len() && word.is_char_boundary(j))
            .find_map(|j| {
                key.clear();
                key.push_str(prefix);
                key.push_str(&word[i..j]);
                vocab.id(key.as_bytes()).map(|id| (id, j))
            });
        match found {
            Some((id, j)) => {
                out.push(id);
                i = j;
            }
            None => return false,
        }
    }
    true
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}
