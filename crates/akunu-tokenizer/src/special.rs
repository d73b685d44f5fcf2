//! Splitting special tokens out of text before the model's algorithm sees it.
//!
//! The rule: longer special tokens win. Tokens are taken in order of decreasing text length
//! (ties by id); each takes, from left to right, every occurrence in the text not yet claimed
//! (a match never spans two unclaimed runs). One Aho-Corasick pass first finds which tokens
//! occur at all, so only those are searched for, one `memmem` scan of the unclaimed runs
//! each; memory stays proportional to the claims, however the matches overlap.
//! Control and unknown tokens are only split out when special parsing is asked for;
//! user-defined tokens always are. `lstrip`/`rstrip` tokens swallow adjacent ASCII whitespace.

use std::collections::BTreeMap;

use aho_corasick::{AhoCorasick, MatchKind};
use memchr::memmem;

use crate::error::invalid;
use crate::vocab::{TokenKind, Vocab};
use crate::{TokenId, TokenizerError};

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
    pub fn new(vocab: &Vocab) -> Result<Self, TokenizerError> {
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
        let matcher = if patterns.is_empty() {
            None
        } else {
            let built = AhoCorasick::builder()
                .match_kind(MatchKind::Standard)
                .build(&patterns);
            Some(built.map_err(|e| invalid(format!("special tokens: {e}")))?)
        };
        Ok(Self { ids, matcher })
    }

    pub fn partition(&self, vocab: &Vocab, text: &str, parse_special: bool) -> Vec<Fragment> {
        let bytes = text.as_bytes();
        // Claimed intervals: start -> (end, token).
        let mut claimed: BTreeMap<usize, (usize, TokenId)> = BTreeMap::new();
        if let Some(ac) = &self.matcher {
            let mut present = vec![false; self.ids.len()];
            let mut seen = 0;
            for m in ac.find_overlapping_iter(text) {
                let p = &mut present[m.pattern().as_usize()];
                if !*p {
                    *p = true;
                    seen += 1;
                    if seen == present.len() {
                        break;
                    }
                }
            }
            let mut found = Vec::new();
            for (rank, &id) in self.ids.iter().enumerate() {
                let token = &vocab.tokens[id as usize];
                if !present[rank] || !(parse_special || token.kind == TokenKind::UserDefined) {
                    continue;
                }
                let finder = memmem::Finder::new(token.text.as_bytes());
                found.clear();
                let mut gap_start = 0;
                let gaps = claimed
                    .iter()
                    .map(|(&s, &(e, _))| (s, e))
                    .chain([(bytes.len(), bytes.len())]);
                for (next_claim, claim_end) in gaps {
                    let gap_end = next_claim;
                    let mut pos = gap_start;
                    while let Some(off) = finder.find(&bytes[pos..gap_end]) {
                        let (mut s, mut e) = (pos + off, pos + off + finder.needle().len());
                        if token.lstrip {
                            while s > pos && c_space(bytes[s - 1]) {
                                s -= 1;
                            }
                        }
                        if token.rstrip {
                            while e < gap_end && c_space(bytes[e]) {
                                e += 1;
                            }
                        }
                        found.push((s, e));
                        pos = e;
                    }
                    gap_start = claim_end;
                }
                claimed.extend(found.iter().map(|&(s, e)| (s, (e, id))));
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
