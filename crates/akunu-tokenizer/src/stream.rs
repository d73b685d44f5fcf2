//! Streaming detokenization: text out as tokens arrive, never half a character.
//!
//! Token pieces go into a byte buffer; whatever prefix of it is complete UTF-8 is returned
//! and removed. An incomplete sequence at the end waits for the next token; a sequence that
//! can never complete becomes U+FFFD exactly where one-shot `decode` would put one, so the
//! concatenated stream equals `decode` of the same ids with `remove_special` and without
//! `clean_spaces` (which needs to see past a token's end). A trailing EOS, which `decode`
//! drops for models that add one, is hidden by the stream only when special tokens are not
//! rendered.

use crate::tokenizer::Tokenizer;
use crate::TokenId;

pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    pending: Vec<u8>,
    render_special: bool,
    /// No token seen yet since the start or the last reset.
    at_start: bool,
}

impl<'a> StreamDecoder<'a> {
    pub(crate) fn new(tok: &'a Tokenizer) -> Self {
        Self {
            tok,
            pending: Vec::new(),
            render_special: false,
            at_start: true,
        }
    }

    /// Print control tokens as their text (off by default).
    pub fn render_special(mut self, yes: bool) -> Self {
        self.render_special = yes;
        self
    }

    /// Adds one token; returns the text it completes (often empty for byte tokens).
    pub fn push(&mut self, id: TokenId) -> String {
        let tok = self.tok;
        let mut piece = tok.piece(id, self.render_special);
        if std::mem::take(&mut self.at_start) {
            // As `decode` with `remove_special`: a leading BOS is dropped, and the token after
            // it keeps its space.
            if tok.rules.add_bos && Some(id) == tok.special.bos {
                return String::new();
            }
            if tok.rules.add_space_prefix {
                piece = piece.strip_prefix(b" ").unwrap_or(piece);
            }
        }
        self.pending.extend_from_slice(piece);
        self.take_complete()
    }

    /// Flushes what is left; an unfinished character becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }

    /// Starts over, for a new conversation turn.
    pub fn reset(&mut self) {
        self.pending.clear();
        self.at_start = true;
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut consumed = 0;
        loop {
            let rest = &self.pending[consumed..];
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    consumed = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&rest[..valid]).expect("validated prefix"));
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            consumed += valid + bad;
                        }
                        None => {
                            consumed += valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..consumed);
        out
    }
}
