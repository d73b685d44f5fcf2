//! The vocabulary: token texts, scores and attributes, and the text-to-id index.

use rustc_hash::FxHashMap;

use crate::TokenId;

/// What kind of token an id is. Mirrors GGUF's `tokenizer.ggml.token_type` values, which come
/// from SentencePiece's piece types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenKind {
    Normal,
    Unknown,
    /// Markup the model was trained with (`<bos>`, `<|im_start|>`): parsed out of text only
    /// when asked, and not printed in plain decoding.
    Control,
    /// Added tokens that are always split out of text before the model's algorithm runs.
    UserDefined,
    Unused,
    /// A `<0xXX>` byte-fallback token.
    Byte,
    Undefined,
}

impl TokenKind {
    pub(crate) fn from_gguf(code: i32) -> Self {
        match code {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Undefined,
        }
    }

    /// Special in the sense of decoding: hidden unless special tokens are rendered.
    pub fn is_special(self) -> bool {
        matches!(self, Self::Control | Self::Unknown)
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Token {
    pub text: Box<str>,
    pub score: f32,
    pub kind: TokenKind,
    /// Whitespace next to the token is swallowed when it is split out of text.
    pub lstrip: bool,
    pub rstrip: bool,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Vocab {
    pub tokens: Vec<Token>,
    /// Text to id; a text listed twice maps to its last id.
    pub index: FxHashMap<Box<[u8]>, TokenId>,
    /// The distinct token lengths in bytes, longest first: greedy longest-match only tries
    /// lengths some token has.
    pub lengths: Vec<usize>,
}

impl Vocab {
    pub fn new(tokens: Vec<Token>) -> Self {
        let mut index = FxHashMap::default();
        index.reserve(tokens.len());
        let mut lengths = Vec::new();
        for (id, t) in tokens.iter().enumerate() {
            lengths.push(t.text.len());
            index.insert(Box::<[u8]>::from(t.text.as_bytes()), id as TokenId);
        }
        lengths.sort_unstable_by(|a, b| b.cmp(a));
        lengths.dedup();
        Self {
            tokens,
            index,
            lengths,
        }
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn id(&self, text: &[u8]) -> Option<TokenId> {
        self.index.get(text).copied()
    }

    pub fn get(&self, id: TokenId) -> Option<&Token> {
        self.tokens.get(id as usize)
    }

    pub fn text(&self, id: TokenId) -> &str {
        &self.tokens[id as usize].text
    }

    /// The `<0xXX>` byte-fallback token for `b`.
    pub fn byte_token(&self, b: u8) -> Option<TokenId> {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        let name = [
            b'<',
            b'0',
            b'x',
            HEX[usize::from(b >> 4)],
            HEX[usize::from(b & 15)],
            b'>',
        ];
        self.id(&name)
    }

    /// The byte a `<0xXX>` token stands for.
    pub fn byte_value(text: &str) -> Option<u8> {
        let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
        (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
    }
}
