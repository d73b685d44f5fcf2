//! SentencePiece BPE by scores (`tokenizer.ggml.model = "llama"`).
//!
//! The text (spaces already replaced by `▁`) starts as one symbol per UTF-8 character. Every
//! adjacent pair whose concatenation is a vocabulary token is a candidate, ranked by that
//! token's score (higher first; the leftmost pair breaks ties). The best candidate merges, its
//! neighbours form new candidates, and stale ones (a side already merged away) are skipped when
//! popped. Symbols are byte ranges of the input, so a candidate's text is a slice and checking
//! it needs no allocation. A symbol left that is not a token is spelled with `<0xXX>` byte
//! tokens. A binary heap over a linked list makes this O(n log n) in the text length.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::vocab::Vocab;
use crate::TokenId;

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: usize,
    next: usize,
}

const NONE: usize = usize::MAX;

struct Candidate {
    score: f32,
    left: usize,
    len: usize,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Candidate {}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        // As C++'s `<` on floats: -0.0 ties with 0.0, and NaN ties with everything.
        let by_score = self
            .score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal);
        by_score.then_with(|| other.left.cmp(&self.left))
    }
}

/// Appends the tokens of `text` (already whitespace-escaped) to `out`.
pub(crate) fn encode(vocab: &Vocab, unk: Option<TokenId>, text: &[u8], out: &mut Vec<TokenId>) {
    let mut syms: Vec<Symbol> = Vec::with_capacity(text.len());
    let mut pos = 0;
    while pos < text.len() {
        let len = utf8_len(text[pos]).min(text.len() - pos);
        let i = syms.len();
        syms.push(Symbol {
            start: pos,
            len,
            prev: i.wrapping_sub(1),
            next: i + 1,
        });
        pos += len;
    }
    let Some(last) = syms.last_mut() else { return };
    last.next = NONE;

    let mut heap = BinaryHeap::with_capacity(syms.len());
    let push = |heap: &mut BinaryHeap<Candidate>, syms: &[Symbol], left: usize, right: usize| {
        if left == NONE || right == NONE {
            return;
        }
        let (l, r) = (syms[left], syms[right]);
        let slice = &text[l.start..r.start + r.len];
        if let Some(id) = vocab.id(slice) {
            heap.push(Candidate {
                score: vocab.tokens[id as usize].score,
                left,
                len: slice.len(),
            });
        }
    };
    for i in 1..syms.len() {
        push(&mut heap, &syms, i - 1, i);
    }
    while let Some(c) = heap.pop() {
        let left = syms[c.left];
        if left.len == 0 || left.next == NONE {
            continue;
        }
        let right = syms[left.next];
        if left.len + right.len != c.len {
            continue;
        }
        let right_idx = left.next;
        syms[c.left].len += right.len;
        syms[c.left].next = right.next;
        syms[right_idx].len = 0;
        if right.next != NONE {
            syms[right.next].prev = c.left;
        }
        push(&mut heap, &syms, left.prev, c.left);
        push(&mut heap, &syms, c.left, right.next);
    }

    let mut i = 0;
    while i != NONE {
        let s = syms[i];
        let piece = &text[s.start..s.start + s.len];
        match vocab.id(piece) {
            Some(id) => out.push(id),
            None => {
                for &b in piece {
                    if let Some(id) = vocab.byte_token(b).or_else(|| vocab.id(&[b])).or(unk) {
                        out.push(id);
                    }
                }
            }
        }
        i = s.next;
    }
}

/// Length of the UTF-8 sequence a lead byte announces (1 for stray continuation bytes).
pub(crate) fn utf8_len(lead: u8) -> usize {
    match lead >> 4 {
        0xc | 0xd => 2,
        0xe => 3,
        0xf => 4,
        _ => 1,
    }
}
