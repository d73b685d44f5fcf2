//! Unicode classes the pre-tokenizers split on, and GPT-2's byte-to-character table.
//!
//! The classes follow the pre-tokenizer regexes: `\p{L}`, `\p{N}`, `\p{P}`, `\p{M}` are the
//! Unicode general categories; `\s` is the Unicode `White_Space` property. ASCII is answered
//! from a table because it dominates ordinary text.

use unicode_general_category::{get_general_category, GeneralCategory as Gc};

/// The general-category family of a character, plus whether it is `White_Space`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Class {
    pub kind: Kind,
    pub space: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Letter,
    Number,
    Mark,
    Punctuation,
    Symbol,
    Separator,
    Control,
    Unassigned,
}

impl Class {
    pub fn letter(self) -> bool {
        self.kind == Kind::Letter
    }
    pub fn number(self) -> bool {
        self.kind == Kind::Number
    }
    /// `[^\s\p{L}\p{N}]`: anything that is neither whitespace, letter nor number.
    pub fn other(self) -> bool {
        !self.space && !matches!(self.kind, Kind::Letter | Kind::Number)
    }
}

const ASCII: [Class; 128] = {
    let mut t = [Class {
        kind: Kind::Control,
        space: false,
    }; 128];
    let mut i = 0;
    while i < 128 {
        let c = i as u8;
        let kind = if c.is_ascii_alphabetic() {
            Kind::Letter
        } else if c.is_ascii_digit() {
            Kind::Number
        } else if c == b' ' {
            Kind::Separator
        } else if c < 0x20 || c == 0x7f {
            Kind::Control
        } else if matches!(
            c,
            b'$' | b'+' | b'<' | b'=' | b'>' | b'^' | b'`' | b'|' | b'~'
        ) {
            Kind::Symbol
        } else {
            Kind::Punctuation
        };
        t[i] = Class {
            kind,
            space: matches!(c, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' '),
        };
        i += 1;
    }
    t
};

pub(crate) fn is_white_space(c: char) -> bool {
    matches!(
        c,
        '\t'..='\r'
            | ' '
            | '\u{85}'
            | '\u{a0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200a}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202f}'
            | '\u{205f}'
            | '\u{3000}'
    )
}

pub(crate) fn class(c: char) -> Class {
    if c.is_ascii() {
        return ASCII[c as usize];
    }
    let kind = match get_general_category(c) {
        Gc::UppercaseLetter
        | Gc::LowercaseLetter
        | Gc::TitlecaseLetter
        | Gc::ModifierLetter
        | Gc::OtherLetter => Kind::Letter,
        Gc::DecimalNumber | Gc::LetterNumber | Gc::OtherNumber => Kind::Number,
        Gc::NonspacingMark | Gc::SpacingMark | Gc::EnclosingMark => Kind::Mark,
        Gc::ConnectorPunctuation
        | Gc::DashPunctuation
        | Gc::OpenPunctuation
        | Gc::ClosePunctuation
        | Gc::InitialPunctuation
        | Gc::FinalPunctuation
        | Gc::OtherPunctuation => Kind::Punctuation,
        Gc::MathSymbol | Gc::CurrencySymbol | Gc::ModifierSymbol | Gc::OtherSymbol => Kind::Symbol,
        Gc::SpaceSeparator | Gc::LineSeparator | Gc::ParagraphSeparator => Kind::Separator,
        Gc::Control | Gc::Format | Gc::Surrogate | Gc::PrivateUse => Kind::Control,
        // Unassigned, and any category a later Unicode version adds.
        _ => Kind::Unassigned,
    };
    Class {
        kind,
        space: is_white_space(c),
    }
}

/// Simple (one-to-one) lowercase mapping, as in UnicodeData.txt.
pub(crate) fn to_lower(c: char) -> char {
    if c.is_ascii() {
        return c.to_ascii_lowercase();
    }
    // The only character whose full lowercase mapping is longer than its simple one.
    if c == '\u{130}' {
        return 'i';
    }
    let mut it = c.to_lowercase();
    match (it.next(), it.next()) {
        (Some(l), None) => l,
        _ => c,
    }
}

/// GPT-2's reversible map from bytes to printable characters: printable Latin-1 bytes stand for
/// themselves, the other 68 (controls, space, DEL, NBSP, soft hyphen) take U+0100 onwards in
/// byte order.
pub(crate) struct ByteLevel {
    to_char: [char; 256],
}

impl ByteLevel {
    pub fn new() -> Self {
        let mut to_char = ['\0'; 256];
        let mut next = 0x100u32;
        for (b, slot) in to_char.iter_mut().enumerate() {
            let printable = matches!(b, 0x21..=0x7e | 0xa1..=0xac | 0xae..=0xff);
            let cp = if printable {
                b as u32
            } else {
                next += 1;
                next - 1
            };
            *slot = char::from_u32(cp).expect("below U+0200");
        }
        Self { to_char }
    }

    #[cfg(test)]
    pub fn char_of(&self, b: u8) -> char {
        self.to_char[b as usize]
    }

    /// The byte a character of the alphabet stands for.
    pub fn byte_of(&self, c: char) -> Option<u8> {
        let cp = c as u32;
        match cp {
            0x21..=0x7e | 0xa1..=0xac | 0xae..=0xff => Some(cp as u8),
            0x100..=0x143 => self.to_char.iter().position(|&x| x == c).map(|b| b as u8),
            _ => None,
        }
    }

    /// Decodes a token text written in the alphabet back to bytes; `None` when a character is
    /// outside it.
    pub fn decode(&self, text: &str) -> Option<Vec<u8>> {
        text.chars().map(|c| self.byte_of(c)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_matches_gpt2_layout() {
        let bl = ByteLevel::new();
        assert_eq!(bl.char_of(b'!'), '!');
        assert_eq!(bl.char_of(0x00), '\u{100}');
        assert_eq!(bl.char_of(b' '), '\u{120}');
        assert_eq!(bl.char_of(0x7f), '\u{121}');
        assert_eq!(bl.char_of(0xa0), '\u{142}');
        assert_eq!(bl.char_of(0xad), '\u{143}');
        assert_eq!(bl.char_of(b'\n'), '\u{10a}');
        for b in 0..=255u8 {
            assert_eq!(bl.byte_of(bl.char_of(b)), Some(b));
        }
        assert_eq!(bl.byte_of('\u{144}'), None);
        assert_eq!(bl.byte_of('\u{a0}'), None);
    }

    #[test]
    fn classes() {
        assert!(class('a').letter() && class('Ж').letter() && class('中').letter());
        assert!(class('7').number() && class('٣').number() && class('½').number());
        assert!(class(' ').space && class('\u{3000}').space && class('\u{85}').space);
        assert!(!class('\u{200b}').space && class('\u{200b}').other());
        assert_eq!(class('\u{301}').kind, Kind::Mark);
        assert_eq!(class('$').kind, Kind::Symbol);
        assert_eq!(class('!').kind, Kind::Punctuation);
        for c in (0u8..128).map(char::from) {
            let slow = {
                let kind = match get_general_category(c) {
                    Gc::UppercaseLetter | Gc::LowercaseLetter => Kind::Letter,
                    Gc::DecimalNumber => Kind::Number,
                    Gc::SpaceSeparator => Kind::Separator,
                    Gc::Control => Kind::Control,
                    Gc::MathSymbol | Gc::CurrencySymbol | Gc::ModifierSymbol => Kind::Symbol,
                    _ => Kind::Punctuation,
                };
                Class {
                    kind,
                    space: c.is_whitespace(),
                }
            };
            assert_eq!(class(c), slow, "{c:?}");
        }
    }

    #[test]
    fn lowercase_is_simple() {
        assert_eq!(to_lower('S'), 's');
        assert_eq!(to_lower('\u{130}'), 'i');
        assert_eq!(to_lower('Ω'), 'ω');
        assert_eq!(to_lower('ß'), 'ß');
    }
}
