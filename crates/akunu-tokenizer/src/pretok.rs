//! Pre-tokenizers of byte-level BPE: the regex splits that decide where merges may not cross.
//!
//! Each pre-tokenizer is a list of steps applied in turn; a step splits every current piece
//! into its matches and the gaps between them (both kept). The three regexes that carry almost
//! every model (GPT-2, Llama 3 and Qwen 2) are hand-written scanners over character classes,
//! which is where the time goes; the rarer multi-regex pre-tokenizers use the `regex` crate for
//! the steps without look-around. The scanners follow the regex alternatives in order, with
//! `\s+(?!\S)` giving back the last whitespace character to the word that follows.

use std::ops::Range;

use regex::Regex;

use crate::unicode::{class, to_lower, Class};
use crate::TokenizerError;

/// A pre-tokenizer, named after the regex family it implements.
#[derive(Clone, Debug)]
pub struct PreTokenizer {
    name: &'static str,
    steps: Vec<Step>,
}

#[derive(Clone, Debug)]
enum Step {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
    Gpt2,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}| ?[^\s\p{L}\p{N}]+[\r\n]*|
    /// \s*[\r\n]+|\s+(?!\S)|\s+` with D = 3 (Llama 3) or 1 (Qwen 2).
    Llama3 {
        digits: usize,
    },
    /// Every number character on its own (`\p{N}`).
    EachNumber,
    Regex(Regex),
}

/// Settings a GGUF `tokenizer.ggml.pre` name implies besides the split itself.
#[derive(Clone, Debug)]
pub(crate) struct PreSettings {
    pub pre: PreTokenizer,
    /// A whole pre-token found in the vocabulary is taken as is, without merging.
    pub ignore_merges: bool,
    /// Whether detokenization tidies spaces before punctuation (`clean_up_tokenization_spaces`).
    pub clean_spaces: bool,
    /// The name forces a BOS token unless the file says otherwise.
    pub add_bos: Option<bool>,
}

const LLAMA3: &[&str] = &[
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
];
const GPT2: &[&str] = &[
    "gpt-2",
    "phi-2",
    "jina-es",
    "jina-de",
    "gigachat",
    "jina-v2-es",
    "jina-v2-de",
    "a.x-4.0",
    "mellum",
    "modern-bert",
    "mpt",
    "olmo",
    "jais",
    "exaone4",
];
const SMOLLM_CLEAN: &[&str] = &["starcoder", "refact", "codeshell", "exaone", "minerva-7b"];
const QWEN2: &[&str] = &["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"];

/// The names `pre_settings` knows, for error messages.
pub(crate) fn known_names() -> Vec<&'static str> {
    let mut v: Vec<&str> = [
        "default",
        "dbrx",
        "smaug-bpe",
        "deepseek-llm",
        "smollm",
        "command-r",
    ]
    .into_iter()
    .chain(LLAMA3.iter().copied())
    .chain(GPT2.iter().copied())
    .chain(SMOLLM_CLEAN.iter().copied())
    .chain(QWEN2.iter().copied())
    .chain(["megrez"])
    .collect();
    v.sort_unstable();
    v
}

pub(crate) fn pre_settings(name: &str) -> Result<PreSettings, TokenizerError> {
    let s = |pre, ignore_merges, clean_spaces, add_bos| PreSettings {
        pre,
        ignore_merges,
        clean_spaces,
        add_bos,
    };
    Ok(match name {
        "" | "default" => s(PreTokenizer::default_bpe(), false, true, None),
        n if LLAMA3.contains(&n) => s(PreTokenizer::llama3(), true, true, Some(true)),
        "dbrx" | "smaug-bpe" => s(PreTokenizer::llama3(), false, true, None),
        "deepseek-llm" => s(PreTokenizer::deepseek_llm(), false, false, None),
        n if GPT2.contains(&n) => s(PreTokenizer::gpt2(), false, true, None),
        n if SMOLLM_CLEAN.contains(&n) => s(PreTokenizer::smollm(), false, true, None),
        "smollm" | "command-r" => s(PreTokenizer::smollm(), false, false, None),
        n if QWEN2.contains(&n) => s(PreTokenizer::qwen2(), false, false, None),
        "megrez" => s(PreTokenizer::qwen2(), false, true, None),
        other => {
            return Err(TokenizerError::UnknownPreTokenizer {
                name: other.to_owned(),
                known: known_names().join(", "),
            })
        }
    })
}

impl PreTokenizer {
    pub fn gpt2() -> Self {
        Self {
            name: "gpt2",
            steps: vec![Step::Gpt2],
        }
    }

    pub fn llama3() -> Self {
        Self {
            name: "llama3",
            steps: vec![Step::Llama3 { digits: 3 }],
        }
    }

    pub fn qwen2() -> Self {
        Self {
            name: "qwen2",
            steps: vec![Step::Llama3 { digits: 1 }],
        }
    }

    pub fn smollm() -> Self {
        Self {
            name: "smollm",
            steps: vec![Step::EachNumber, Step::Gpt2],
        }
    }

    /// The fallback for BPE files that name no pre-tokenizer.
    pub fn default_bpe() -> Self {
        Self {
            name: "default",
            steps: vec![
                regex_step(r"[\p{P}$+<=>^~|]+"),
                Step::Gpt2,
                regex_step(r"\p{N}+"),
                regex_step(r"[0-9][0-9][0-9]"),
            ],
        }
    }

    /// DeepSeek LLM's five regexes (code points escaped: canonical equivalents of some of them
    /// would invert the ranges). Whitespace never matches inside the bracketed ranges, even
    /// where a range spans a space character (U+3000 in U+3000-U+3002, the spaces inside
    /// U+0800-U+4E00): the reference matches those after mapping every space to `\v`.
    pub fn deepseek_llm() -> Self {
        Self {
            name: "deepseek-llm",
            steps: vec![
                regex_step(r"[\r\n]"),
                regex_step(concat!(
                    r"\s?[",
                    r"A-Za-z\x{b5}\x{c0}-\x{d6}\x{d8}-\x{f6}\x{f8}-\x{1ba}\x{1bc}-\x{1bf}",
                    r"\x{1c4}-\x{293}\x{295}-\x{2af}\x{370}-\x{373}\x{376}\x{377}\x{37b}-\x{37d}",
                    r"\x{37f}\x{386}\x{388}-\x{38a}\x{38c}\x{38e}-\x{3a1}\x{3a3}-\x{3f5}",
                    r"\x{3f7}-\x{481}\x{48a}-\x{52f}\x{531}-\x{556}\x{10a0}-\x{10c5}\x{13a0}-\x{13f5}",
                    r"\x{13f8}-\x{13fd}\x{1c90}-\x{1cba}\x{1cbd}-\x{1cbf}\x{1d00}-\x{1d2b}",
                    r"\x{1d6b}-\x{1d77}\x{1d79}-\x{1d9a}\x{1e00}-\x{1f15}\x{1f18}-\x{1f1d}",
                    r"\x{1f20}-\x{1f45}\x{1f48}-\x{1f4d}\x{1f50}-\x{1f57}\x{1f59}\x{1f5b}\x{1f5d}",
                    r"\x{1f5f}-\x{1f7d}\x{1f80}-\x{1fb4}\x{1fb6}-\x{1fbc}\x{1fbe}\x{1fc2}-\x{1fc4}",
                    r"\x{1fc6}-\x{1fcc}\x{1fd0}-\x{1fd3}\x{1fd6}-\x{1fdb}\x{1fe0}-\x{1fec}",
                    r"\x{1ff2}-\x{1ff4}\x{1ff6}-\x{1ffc}\x{2102}\x{2107}\x{210a}-\x{2113}\x{2115}",
                    r"\x{2119}-\x{211d}\x{2124}\x{2126}\x{2128}\x{212a}-\x{212d}\x{212f}-\x{2134}",
                    r"\x{2139}\x{213c}-\x{213f}\x{2145}-\x{2149}\x{214e}\x{2183}\x{2184}",
                    r"\x{2c00}-\x{2c7b}\x{2c7e}-\x{2ce4}\x{2ceb}-\x{2cee}\x{2cf2}\x{2cf3}",
                    r"\x{a640}-\x{a66d}\x{a680}-\x{a69b}\x{a722}-\x{a76f}\x{a771}-\x{a787}",
                    r"\x{a78b}-\x{a78e}\x{ab70}-\x{abbf}\x{fb00}-\x{fb06}\x{fb13}-\x{fb17}",
                    r"\x{ff21}-\x{ff3a}\x{ff41}-\x{ff5a}\x{10400}-\x{1044f}\x{104b0}-\x{104d3}",
                    r"\x{104d8}-\x{104fb}\x{10c80}-\x{10cb2}\x{10cc0}-\x{10cf2}\x{118a0}-\x{118df}",
                    r"\x{1e900}-\x{1e943}",
                    r"]+"
                )),
                regex_step(
                    r"\s?[!-/:-~\x{ff01}-\x{ff0f}\x{ff1a}-\x{ff5e}\x{2018}-\x{201f}\x{3001}-\x{3002}]+",
                ),
                regex_step(r"\s+$"),
                regex_step(r"[[\x{4e00}-\x{9fa5}\x{800}-\x{4e00}\x{ac00}-\x{d7ff}]--\s]+"),
                regex_step(r"\p{N}+"),
            ],
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Splits `text` into pre-tokens, appended to `out` as byte ranges in order.
    pub fn split(&self, text: &str, out: &mut Vec<Range<usize>>) {
        if text.is_empty() {
            return;
        }
        let chars = Chars::new(text);
        let mut pieces = Vec::with_capacity(text.len() / 4 + 1);
        pieces.push(0..chars.len());
        let mut next = Vec::new();
        for step in &self.steps {
            next.clear();
            for piece in &pieces {
                match step {
                    Step::Gpt2 => gpt2(&chars, piece.clone(), &mut next),
                    Step::Llama3 { digits } => llama3(&chars, piece.clone(), *digits, &mut next),
                    Step::EachNumber => each_number(&chars, piece.clone(), &mut next),
                    Step::Regex(re) => by_regex(&chars, text, re, piece.clone(), &mut next),
                }
            }
            std::mem::swap(&mut pieces, &mut next);
        }
        out.extend(
            pieces
                .into_iter()
                .map(|r| chars.byte(r.start)..chars.byte(r.end)),
        );
    }
}

fn regex_step(pattern: &str) -> Step {
    Step::Regex(Regex::new(pattern).expect("built-in pre-tokenizer regexes compile"))
}

/// The text as characters with their classes and byte offsets (one extra offset at the end).
struct Chars {
    chars: Vec<char>,
    classes: Vec<Class>,
    offsets: Vec<usize>,
}

impl Chars {
    fn new(text: &str) -> Self {
        let n = text.len();
        let mut chars = Vec::with_capacity(n);
        let mut classes = Vec::with_capacity(n);
        let mut offsets = Vec::with_capacity(n + 1);
        for (i, c) in text.char_indices() {
            chars.push(c);
            classes.push(class(c));
            offsets.push(i);
        }
        offsets.push(n);
        Self {
            chars,
            classes,
            offsets,
        }
    }

    fn len(&self) -> usize {
        self.chars.len()
    }

    fn byte(&self, i: usize) -> usize {
        self.offsets[i]
    }

    fn char_at_byte(&self, b: usize) -> usize {
        self.offsets.partition_point(|&o| o < b)
    }
}

/// Character access bounded to one piece: outside it there is nothing (no class at all).
struct Window<'a> {
    t: &'a Chars,
    end: usize,
}

impl Window<'_> {
    fn ch(&self, i: usize) -> Option<char> {
        (i < self.end).then(|| self.t.chars[i])
    }
    fn cls(&self, i: usize) -> Option<Class> {
        (i < self.end).then(|| self.t.classes[i])
    }
    fn letter(&self, i: usize) -> bool {
        self.cls(i).is_some_and(Class::letter)
    }
    fn number(&self, i: usize) -> bool {
        self.cls(i).is_some_and(Class::number)
    }
    fn other(&self, i: usize) -> bool {
        self.cls(i).is_some_and(Class::other)
    }
    /// Length of the contraction (`'s`, `'ll`, ...) starting at `i`, if any.
    fn contraction(&self, i: usize, fold: bool) -> usize {
        if self.ch(i) != Some('\'') {
            return 0;
        }
        let low = |c: Option<char>| c.map(|c| if fold { to_lower(c) } else { c });
        match (low(self.ch(i + 1)), low(self.ch(i + 2))) {
            (Some('s' | 't' | 'm' | 'd'), _) => 2,
            (Some('r' | 'v'), Some('e')) | (Some('l'), Some('l')) => 3,
            _ => 0,
        }
    }
    /// Number of whitespace characters from `i`.
    fn space_run(&self, i: usize) -> usize {
        (i..self.end)
            .take_while(|&j| self.t.classes[j].space)
            .count()
    }
}

fn gpt2(t: &Chars, piece: Range<usize>, out: &mut Vec<Range<usize>>) {
    let w = Window { t, end: piece.end };
    let mut pos = piece.start;
    while pos < w.end {
        let start = pos;
        let c = t.chars[pos];
        let lead = usize::from(c == ' ');
        let n = w.contraction(pos, false);
        if n > 0 {
            pos += n;
        } else if w.letter(pos + lead) {
            pos += lead;
            while w.letter(pos) {
                pos += 1;
            }
        } else if w.number(pos + lead) {
            pos += lead;
            while w.number(pos) {
                pos += 1;
            }
        } else if w.other(pos + lead) {
            pos += lead;
            while w.other(pos) {
                pos += 1;
            }
        } else {
            pos += space_end(&w, pos);
        }
        out.push(start..pos);
    }
}

/// How much of a whitespace run `\s+(?!\S)|\s+` takes at `pos`: all of it at the end of the
/// piece, else all but the last character, which then leads the next word.
fn space_end(w: &Window, pos: usize) -> usize {
    match w.space_run(pos) {
        0 => 1,
        n if n > 1 && pos + n < w.end => n - 1,
        n => n,
    }
}

fn llama3(t: &Chars, piece: Range<usize>, digits: usize, out: &mut Vec<Range<usize>>) {
    let w = Window { t, end: piece.end };
    let newline = |c: Option<char>| matches!(c, Some('\r' | '\n'));
    let mut pos = piece.start;
    while pos < w.end {
        let start = pos;
        let c = t.chars[pos];
        let cls = t.classes[pos];
        let n = w.contraction(pos, true);
        if n > 0 {
            pos += n;
        } else if !newline(Some(c)) && !cls.number() && (cls.letter() || w.letter(pos + 1)) {
            // [^\r\n\p{L}\p{N}]?\p{L}+
            pos += 1;
            while w.letter(pos) {
                pos += 1;
            }
        } else if cls.number() {
            // \p{N}{1,D}, repeated: each group is its own piece.
            while w.number(pos) && pos - start < digits {
                pos += 1;
            }
        } else if c == ' ' && w.cls(pos + 1).is_none_or(Class::other) || c != ' ' && cls.other() {
            // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
            pos += usize::from(c == ' ');
            while w.other(pos) {
                pos += 1;
            }
            while newline(w.ch(pos)) {
                pos += 1;
            }
        } else {
            let run = w.space_run(pos);
            match (pos..pos + run).rev().find(|&j| newline(Some(t.chars[j]))) {
                // \s*[\r\n]+
                Some(last) => pos = last + 1,
                None => pos += space_end(&w, pos),
            }
        }
        out.push(start..pos);
    }
}

fn each_number(t: &Chars, piece: Range<usize>, out: &mut Vec<Range<usize>>) {
    let mut gap = piece.start;
    for i in piece.clone() {
        if t.classes[i].number() {
            if gap < i {
                out.push(gap..i);
            }
            out.push(i..i + 1);
            gap = i + 1;
        }
    }
    if gap < piece.end {
        out.push(gap..piece.end);
    }
}

fn by_regex(t: &Chars, text: &str, re: &Regex, piece: Range<usize>, out: &mut Vec<Range<usize>>) {
    let base = t.byte(piece.start);
    let hay = &text[base..t.byte(piece.end)];
    let mut gap = piece.start;
    for m in re.find_iter(hay) {
        let (s, e) = (
            t.char_at_byte(base + m.start()),
            t.char_at_byte(base + m.end()),
        );
        if gap < s {
            out.push(gap..s);
        }
        out.push(s..e);
        gap = e;
    }
    if gap < piece.end {
        out.push(gap..piece.end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pre: &PreTokenizer, text: &str) -> Vec<String> {
        let mut r = Vec::new();
        pre.split(text, &mut r);
        r.into_iter().map(|r| text[r].to_owned()).collect()
    }

    #[test]
    fn gpt2_pieces() {
        let p = PreTokenizer::gpt2();
        assert_eq!(
            split(&p, "Hello world's  end!!\n"),
            ["Hello", " world", "'s", " ", " end", "!!", "\n"]
        );
        assert_eq!(split(&p, "a   b"), ["a", "  ", " b"]);
        assert_eq!(split(&p, "x 123 ¾"), ["x", " 123", " ¾"]);
        assert_eq!(split(&p, "I'M"), ["I", "'", "M"]);
    }

    #[test]
    fn llama3_pieces() {
        let p = PreTokenizer::llama3();
        assert_eq!(
            split(&p, "I'M 1234567 ok"),
            ["I", "'M", " ", "123", "456", "7", " ok"]
        );
        assert_eq!(split(&p, "a \n\n b"), ["a", " \n\n", " b"]);
        assert_eq!(split(&p, "x!!\n\ny"), ["x", "!!\n\n", "y"]);
        assert_eq!(split(&p, "\thello  "), ["\thello", "  "]);
        let q = PreTokenizer::qwen2();
        assert_eq!(split(&q, "12ab"), ["1", "2", "ab"]);
    }

    #[test]
    fn regex_steps_keep_gaps() {
        let p = PreTokenizer::default_bpe();
        assert_eq!(split(&p, "a,b 1234"), ["a", ",", "b", " ", "123", "4"]);
        let d = PreTokenizer::deepseek_llm();
        assert_eq!(split(&d, "Hi 你好\n"), ["Hi", " ", "你好", "\n"]);
        let s = PreTokenizer::smollm();
        assert_eq!(split(&s, "ab12 c"), ["ab", "1", "2", " c"]);
    }

    #[test]
    fn unknown_name_is_a_clear_error() {
        let e = pre_settings("no-such-pre").unwrap_err().to_string();
        assert!(e.contains("no-such-pre") && e.contains("llama-bpe"), "{e}");
    }
}
