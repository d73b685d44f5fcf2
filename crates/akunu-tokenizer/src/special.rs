//! Splitting special tokens out of text before the model's algorithm sees it.
//!
//! The rule: longer special tokens win. Tokens are taken in order of decreasing text length
//! (ties by id); each takes, from left to right, every occurrence that does not overlap text
//! already claimed. Occurrences of all tokens are found in one Aho-Corasick pass (overlapping
//! matches), then claimed in that priority order against a map of claimed intervals, so the
//! cost does not grow with the number of special tokens as a per-token search would.
//! Control and unknown tokens are only split out when special parsing is asked for;
//! user-defined tokens always are. `lstrip`/`rstrip` tokens swallow adjacent ASCII whitespace.

use std::collections::BTreeMap;

use aho_corasick::{AhoCorasick, MatchKind};

use crate::vocab::{TokenKind, Vocab};
use crate::TokenId;

/// A run of raw text or a special token, in text order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    Text(usize, usize),
    Token(TokenId),
}

#[derive(Clone, Debug)]
pub(crate) struct Specials {
    /// The candidates in priority order (length desc, id asc); pattern index = priority.
    ids: Vec<TokenId>,
    matcher: Option<AhoCorasick>,
}

impl Specials {
    pub fn new(vocab: &Vocab) -> Self {
        let mut ids: Vec<TokenId> = (0..vocab.len() as TokenId)
            .filter(|&id| {
                let t = &vocab.tokens[id as usize];
                !t.text.is_empty()
                    && matches!(
                        t.kind,
                        TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
                    )
            })
            .collect();
        ids.sort_by_key(|&id| (std::cmp::Reverse(vocab.text(id).len()), id));
        let patterns: Vec<&str> = ids.iter().map(|&id| vocab.text(id)).collect();
        let matcher = (!patterns.is_empty()).then(|| {
            AhoCorasick::builder()
                .match_kind(MatchKind::Standard)
                .build(&patterns)
                .expect("special token automaton")
        });
        Self { ids, matcher }
    }

    pub fn partition(&self, vocab: &Vocab, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut claimed: BTreeMap<usize, (usize, TokenId)> = BTreeMap::new();
        if let Some(ac) = &self.matcher {
            let mut found: Vec<(usize, usize, usize)> = ac
                .find_overlapping_iter(text)
                .filter(|m| {
                    let id = self.ids[m.pattern().as_usize()];
                    parse_special || vocab.tokens[id as usize].kind == TokenKind::UserDefined
                })
                .map(|m| (m.pattern().as_usize(), m.start(), m.end()))
                .collect();
            found.sort_unstable();
            for (rank, start, end) in found {
                let id = self.ids[rank];
                let free_left = claimed
                    .range(..end)
                    .next_back()
                    .is_none_or(|(_, &(e, _))| e <= start);
                if !free_left {
                    continue;
                }
                let token = &vocab.tokens[id as usize];
                let (mut s, mut e) = (start, end);
                let bytes = text.as_bytes();
                let left_bound = claimed
                    .range(..start)
                    .next_back()
                    .map_or(0, |(_, &(e, _))| e);
                let right_bound = claimed.range(end..).next().map_or(text.len(), |(&s, _)| s);
                if token.lstrip {
                    while s > left_bound && c_space(bytes[s - 1]) {
                        s -= 1;
                    }
                }
                if token.rstrip {
                    while e < right_bound && c_space(bytes[e]) {
                        e += 1;
                    }
                }
                claimed.insert(s, (e, id));
            }
        }
        let mut out = Vec::with_capacity(claimed.len() * 2 + 1);
        let mut pos = 0;
        for (start, (end, id)) in claimed {
            if start > pos {
                out.push(Fragment::Text(pos, start));
            }
            out.push(Fragment::Token(id));
            pos = end;
        }
        if pos < text.len() {
            out.push(Fragment::Text(pos, text.len()));
        }
        out
    }
}

/// C's `isspace`: unlike `u8::is_ascii_whitespace` it includes vertical tab.
fn c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}
