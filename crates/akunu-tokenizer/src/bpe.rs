//! BPE with ranked merges: byte-level (`tokenizer.ggml.model = "gpt2"`, Hugging Face
//! `ByteLevel`) or over characters with byte fallback (Hugging Face BPE converted from
//! SentencePiece, e.g. Gemma's `tokenizer.json`).
//!
//! Plan: everything is resolved to integer symbols at load. Byte-level vocabularies are indexed
//! by the raw bytes their texts stand for, so input is never re-spelled in GPT-2's alphabet.
//! A merge `a b` becomes `(id(a), id(b)) -> (rank, id(ab))`; a merge side or result that is not
//! itself a token gets a virtual id past the vocabulary so that the rank order stays exact.
//! Each pre-token starts as its initial symbols, and the lowest-ranked adjacent pair (leftmost
//! on ties) merges until none applies, through a binary heap over a linked list. Pre-tokens
//! repeat a lot in real text, so results are memoised for the length of one encode call.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Range;

use rustc_hash::FxHashMap;

use crate::pretok::PreTokenizer;
use crate::spm::utf8_len;
use crate::unicode::ByteLevel;
use crate::vocab::Vocab;
use crate::TokenId;

#[derive(Clone, Debug)]
pub(crate) struct Bpe {
    pub pre: Option<PreTokenizer>,
    pub ignore_merges: bool,
    /// GPT-2 byte alphabet; otherwise raw UTF-8 characters.
    pub byte_level: bool,
    byte_fallback: bool,
    fuse_unk: bool,
    /// Symbol ids by the bytes they stand for: vocabulary tokens first, then virtual symbols.
    symbols: FxHashMap<Box<[u8]>, u32>,
    /// Bytes of each virtual symbol (id - vocabulary size).
    virtual_bytes: Vec<Box<[u8]>>,
    n_vocab: u32,
    merges: FxHashMap<(u32, u32), (u32, u32)>,
    /// Byte-level: the symbol of each single byte.
    byte_symbol: [Option<u32>; 256],
}

/// Input of `Bpe::new`: merges as pairs of token texts, in rank order.
pub(crate) struct BpeSpec<'a> {
    pub pre: Option<PreTokenizer>,
    pub ignore_merges: bool,
    pub byte_level: bool,
    /// Characters missing from the vocabulary become `<0xXX>` tokens (else the unknown token).
    pub byte_fallback: bool,
    /// Consecutive unknown tokens become one.
    pub fuse_unk: bool,
    pub merges: Vec<(&'a str, &'a str)>,
}

impl Bpe {
    pub fn new(vocab: &Vocab, spec: BpeSpec) -> Self {
        let bl = ByteLevel::new();
        let n_vocab = vocab.len() as u32;
        let key = |text: &str| -> Option<Vec<u8>> {
            if spec.byte_level {
                bl.decode(text)
            } else {
                Some(text.as_bytes().to_vec())
            }
        };
        let mut symbols: FxHashMap<Box<[u8]>, u32> = FxHashMap::default();
        symbols.reserve(vocab.len());
        for (id, t) in vocab.tokens.iter().enumerate() {
            if let Some(k) = key(&t.text) {
                symbols.insert(k.into_boxed_slice(), id as u32);
            }
        }
        let mut virtual_bytes: Vec<Box<[u8]>> = Vec::new();
        let mut intern = |symbols: &mut FxHashMap<Box<[u8]>, u32>, bytes: Vec<u8>| -> u32 {
            let next = n_vocab + virtual_bytes.len() as u32;
            *symbols
                .entry(bytes.into_boxed_slice())
                .or_insert_with_key(|k| {
                    virtual_bytes.push(k.clone());
                    next
                })
        };
        let mut merges = FxHashMap::default();
        merges.reserve(spec.merges.len());
        for (rank, (a, b)) in spec.merges.iter().enumerate() {
            let (Some(ka), Some(kb)) = (key(a), key(b)) else {
                continue;
            };
            let joined = [ka.as_slice(), kb.as_slice()].concat();
            let (ia, ib) = (intern(&mut symbols, ka), intern(&mut symbols, kb));
            let ij = intern(&mut symbols, joined);
            // The first listing of a pair decides its rank.
            merges.entry((ia, ib)).or_insert((rank as u32, ij));
        }
        let mut byte_symbol = [None; 256];
        if spec.byte_level {
            for (b, slot) in byte_symbol.iter_mut().enumerate() {
                *slot = Some(intern(&mut symbols, vec![b as u8]));
            }
        }
        Self {
            pre: spec.pre,
            ignore_merges: spec.ignore_merges,
            byte_level: spec.byte_level,
            byte_fallback: spec.byte_fallback,
            fuse_unk: spec.fuse_unk,
            symbols,
            virtual_bytes,
            n_vocab,
            merges,
            byte_symbol,
        }
    }

    /// Appends the tokens of `text` to `out`. `cache` memoises pre-tokens within one call.
    pub fn encode(
        &self,
        vocab: &Vocab,
        unk: Option<TokenId>,
        text: &str,
        cache: &mut FxHashMap<Box<[u8]>, Vec<TokenId>>,
        out: &mut Vec<TokenId>,
    ) {
        let mut words: Vec<Range<usize>> = Vec::new();
        match &self.pre {
            Some(pre) => pre.split(text, &mut words),
            None => words.push(0..text.len()),
        }
        let mut work = Work::default();
        for w in words {
            let word = &text.as_bytes()[w];
            if word.is_empty() {
                continue;
            }
            if let Some(ids) = cache.get(word) {
                out.extend_from_slice(ids);
                continue;
            }
            let start = out.len();
            self.encode_word(vocab, unk, word, &mut work, out);
            if word.len() <= 256 {
                cache.insert(word.into(), out[start..].to_vec());
            }
        }
    }

    fn encode_word(
        &self,
        vocab: &Vocab,
        unk: Option<TokenId>,
        word: &[u8],
        work: &mut Work,
        out: &mut Vec<TokenId>,
    ) {
        if self.ignore_merges {
            if let Some(&id) = self.symbols.get(word) {
                if id < self.n_vocab {
                    out.push(id);
                    return;
                }
            }
        }
        work.syms.clear();
        if self.byte_level {
            work.syms.extend(
                word.iter()
                    .map(|&b| self.byte_symbol[b as usize].expect("byte symbols")),
            );
        } else {
            let mut pos = 0;
            while pos < word.len() {
                let len = utf8_len(word[pos]).min(word.len() - pos);
                let ch = &word[pos..pos + len];
                match self.symbols.get(ch) {
                    Some(&id) => work.syms.push(id),
                    None => {
                        // Byte fallback: every byte as `<0xXX>`, or the unknown token when
                        // one of them is missing.
                        let bytes: Option<Vec<TokenId>> = match self.byte_fallback {
                            true => ch.iter().map(|&b| vocab.byte_token(b)).collect(),
                            false => None,
                        };
                        match (bytes, unk) {
                            (Some(b), _) => work.syms.extend(b),
                            (None, Some(u)) if self.fuse_unk && work.syms.last() == Some(&u) => {}
                            (None, Some(u)) => work.syms.push(u),
                            (None, None) => {}
                        }
                    }
                }
                pos += len;
            }
        }
        self.merge(work);
        for s in work.live() {
            if s < self.n_vocab {
                out.push(s);
                continue;
            }
            // A virtual symbol (its text is not a token): spell it byte by byte.
            for &b in self.virtual_bytes[(s - self.n_vocab) as usize].iter() {
                let id = if self.byte_level {
                    self.byte_symbol[b as usize].filter(|&id| id < self.n_vocab)
                } else {
                    vocab.byte_token(b)
                };
                if let Some(id) = id {
                    out.push(id);
                }
            }
        }
    }

    fn merge(&self, w: &mut Work) {
        let n = w.syms.len();
        w.next.clear();
        w.next.extend(1..=n);
        w.prev.clear();
        w.prev.extend((0..n).map(|i| i.wrapping_sub(1)));
        w.heap.clear();
        for i in 1..n {
            if let Some(&(rank, _)) = self.merges.get(&(w.syms[i - 1], w.syms[i])) {
                w.heap
                    .push(Reverse((rank, i - 1, w.syms[i - 1], w.syms[i])));
            }
        }
        while let Some(Reverse((_, left, a, b))) = w.heap.pop() {
            // Stale when either side has changed since the pair was queued (a merged-away
            // symbol has no successor).
            let right = w.next[left];
            if right >= n || w.syms[left] != a || w.syms[right] != b {
                continue;
            }
            let (_, merged) = self.merges[&(a, b)];
            w.syms[left] = merged;
            let after = w.next[right];
            w.next[left] = after;
            w.next[right] = usize::MAX;
            if after < n {
                w.prev[after] = left;
            }
            let before = w.prev[left];
            if before != usize::MAX {
                self.candidate(w, before, left);
            }
            if after < n {
                self.candidate(w, left, after);
            }
        }
    }

    fn candidate(&self, w: &mut Work, left: usize, right: usize) {
        let pair = (w.syms[left], w.syms[right]);
        if let Some(&(rank, _)) = self.merges.get(&pair) {
            w.heap.push(Reverse((rank, left, pair.0, pair.1)));
        }
    }
}

/// Scratch space reused across the pre-tokens of one call.
#[derive(Default)]
struct Work {
    syms: Vec<u32>,
    next: Vec<usize>,
    prev: Vec<usize>,
    heap: BinaryHeap<Reverse<(u32, usize, u32, u32)>>,
}

impl Work {
    /// The symbols left after merging, in order.
    fn live(&self) -> impl Iterator<Item = u32> + '_ {
        let mut i = 0;
        std::iter::from_fn(move || {
            let s = *self.syms.get(i)?;
            i = self.next[i];
            Some(s)
        })
    }
}
