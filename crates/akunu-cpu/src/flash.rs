//! Attention with general masks on the CPU: the reference the GPU FlashAttention kernels are
//! checked against, and a fast path the CPU backend can run.
//!
//! Plan:
//! - [`Problem`] holds one attention problem on the host: queries of several tokens, a
//!   key/value cache of several sequences, grouped-query heads, and the masks (causal, sliding
//!   window, packed-sequence segments, speculative-decoding trees) as plain data. A key is
//!   visible to a query token when every mask that is set lets it through.
//! - [`reference_f64`] is the definition written out: each mask tested literally, scores and a
//!   two-pass softmax in f64. Apart from [`Problem::check`] it shares no code with the rest,
//!   so that it can judge it.
//! - [`attention`] is the fast path: f32 online softmax over tiles of keys, one rayon task per
//!   (token, key/value head) so a tile of K and V is read once for all the query heads that
//!   share it. Causality, the window, `kv_len` and the tree's 64-key reach bound the visible
//!   keys to one range, so the tiles outside it are never touched; segments and the tree's
//!   bits are tested key by key. Exponentials and the softcap's tanh are the backend's
//!   [`fast_exp`] and [`fast_tanh`], as in its own attention.
//! - [`intermediates`] replays the same online softmax for one (token, head) row over every
//!   tile of a given size and records its state after each, to compare a GPU kernel's debug
//!   dump tile by tile and find where the two part.
//!
//! A row that sees no key gives zeros and a log-sum-exp of -inf: nothing is divided by a zero
//! sum, so no NaN appears.

use rayon::prelude::*;

use crate::multiversion::multiversion;
use crate::ops::{axpy, dot, fast_exp, fast_tanh};

/// One attention problem, host side. Values are f32 (already rounded to the kernel's storage
/// dtype by whoever builds it).
///
/// Key `j` of sequence `s = q_seq[t]` is visible to query token `t` when all of these hold:
/// - `j < kv_len[s]`;
/// - if `causal`: `j <= q_pos[t]`;
/// - if `window = Some(w)`: `j + w > q_pos[t]` (the last `w` positions up to `q_pos[t]`);
/// - if segments are set: `k_seg[s * n_ctx + j] == q_seg[t]`;
/// - if `tree = Some((mask, base))`: `j < base[t]`, or `j - base[t] < 64` and bit
///   `j - base[t]` of `mask[t]` is set.
///
/// The score of a visible key is `x = scale · q·k`, then `x = c · tanh(x / c)` with a softcap
/// `c`; the output is the softmax-weighted sum of the visible values, and the log-sum-exp is
/// `ln Σ exp(x)` (natural log).
#[derive(Clone, Debug)]
pub struct Problem {
    pub n_tokens: usize,
    pub n_head: usize,
    /// `n_head % n_head_kv == 0`; query head `h` reads key/value head
    /// `h / (n_head / n_head_kv)`.
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub head_dim_v: usize,
    pub n_seq: usize,
    /// Key capacity per sequence.
    pub n_ctx: usize,
    /// `[n_tokens][n_head][head_dim]`.
    pub q: Vec<f32>,
    /// `[n_seq][n_head_kv][n_ctx][head_dim]`.
    pub k: Vec<f32>,
    /// `[n_seq][n_head_kv][n_ctx][head_dim_v]`.
    pub v: Vec<f32>,
    /// Absolute position of each query token.
    pub q_pos: Vec<u32>,
    /// Sequence of each query token (`< n_seq`).
    pub q_seq: Vec<u32>,
    /// Per sequence: keys `0..kv_len` are stored (`<= n_ctx`); the rest is never read.
    pub kv_len: Vec<u32>,
    pub causal: bool,
    /// `w >= 1`.
    pub window: Option<usize>,
    pub softcap: Option<f32>,
    pub scale: f32,
    /// Segment id of each token; set together with `k_seg`.
    pub q_seg: Option<Vec<i32>>,
    /// `[n_seq][n_ctx]` segment id of each key; set together with `q_seg`.
    pub k_seg: Option<Vec<i32>>,
    /// Per token: `(bitmask, base)`.
    pub tree: Option<(Vec<u64>, Vec<u32>)>,
}

impl Problem {
    /// Checks every length and range the computations index by, so that they cannot go out of
    /// bounds; says what is wrong otherwise.
    pub fn check(&self) -> Result<(), String> {
        if self.n_head == 0 || self.n_head_kv == 0 || !self.n_head.is_multiple_of(self.n_head_kv) {
            return Err(format!(
                "n_head {} must be a positive multiple of n_head_kv {}",
                self.n_head, self.n_head_kv
            ));
        }
        if self.head_dim == 0 || self.head_dim_v == 0 {
            return Err(format!(
                "head_dim {} and head_dim_v {} must be positive",
                self.head_dim, self.head_dim_v
            ));
        }
        let (t, s, c) = (self.n_tokens, self.n_seq, self.n_ctx);
        let (h, hk, d, dv) = (self.n_head, self.n_head_kv, self.head_dim, self.head_dim_v);
        expect_len("q", self.q.len(), &[t, h, d])?;
        expect_len("k", self.k.len(), &[s, hk, c, d])?;
        expect_len("v", self.v.len(), &[s, hk, c, dv])?;
        expect_len("q_pos", self.q_pos.len(), &[t])?;
        expect_len("q_seq", self.q_seq.len(), &[t])?;
        expect_len("kv_len", self.kv_len.len(), &[s])?;
        if let Some((i, &x)) = self
            .q_seq
            .iter()
            .enumerate()
            .find(|&(_, &x)| x as usize >= s)
        {
            return Err(format!("q_seq[{i}] = {x} is not below n_seq {s}"));
        }
        if let Some((i, &x)) = self
            .kv_len
            .iter()
            .enumerate()
            .find(|&(_, &x)| x as usize > c)
        {
            return Err(format!("kv_len[{i}] = {x} exceeds n_ctx {c}"));
        }
        if self.window == Some(0) {
            return Err("window must be at least 1".into());
        }
        if let Some(cap) = self.softcap {
            if !(cap.is_finite() && cap > 0.0) {
                return Err(format!("softcap {cap} must be positive and finite"));
            }
        }
        if !self.scale.is_finite() {
            return Err(format!("scale {} must be finite", self.scale));
        }
        match (&self.q_seg, &self.k_seg) {
            (None, None) => {}
            (Some(qs), Some(ks)) => {
                expect_len("q_seg", qs.len(), &[t])?;
                expect_len("k_seg", ks.len(), &[s, c])?;
            }
            _ => return Err("q_seg and k_seg must be both set or both unset".into()),
        }
        if let Some((mask, base)) = &self.tree {
            expect_len("tree mask", mask.len(), &[t])?;
            expect_len("tree base", base.len(), &[t])?;
        }
        Ok(())
    }

    fn group(&self) -> usize {
        self.n_head / self.n_head_kv
    }

    /// Index of the first cached position of key/value head `g` of sequence `s`.
    fn kv_row(&self, s: usize, g: usize) -> usize {
        (s * self.n_head_kv + g) * self.n_ctx
    }
}

fn expect_len(what: &str, got: usize, dims: &[usize]) -> Result<(), String> {
    let want = dims
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .ok_or_else(|| format!("{what}: the size {dims:?} overflows"))?;
    if got == want {
        Ok(())
    } else {
        Err(format!(
            "{what} has {got} values, expected {want} ({dims:?})"
        ))
    }
}

/// The attention of every (token, head) in f64 with a two-pass softmax: `out` is
/// `[n_tokens][n_head][head_dim_v]`, `lse` is `[n_tokens][n_head]`.
///
/// # Panics
/// If [`Problem::check`] fails.
pub fn reference_f64(p: &Problem) -> (Vec<f64>, Vec<f64>) {
    if let Err(e) = p.check() {
        panic!("reference_f64: {e}");
    }
    let (d, dv) = (p.head_dim, p.head_dim_v);
    let mut out = vec![0.0; p.n_tokens * p.n_head * dv];
    let mut lse = vec![f64::NEG_INFINITY; p.n_tokens * p.n_head];
    for t in 0..p.n_tokens {
        let s = p.q_seq[t] as usize;
        let pos = p.q_pos[t] as u64;
        let visible = |j: usize| {
            let j64 = j as u64;
            let mut ok = j < p.kv_len[s] as usize;
            if p.causal {
                ok &= j64 <= pos;
            }
            if let Some(w) = p.window {
                ok &= j64 + w as u64 > pos;
            }
            if let (Some(qs), Some(ks)) = (&p.q_seg, &p.k_seg) {
                ok &= ks[s * p.n_ctx + j] == qs[t];
            }
            if let Some((mask, base)) = &p.tree {
                let b = base[t] as u64;
                ok &= j64 < b || (j64 - b < 64 && (mask[t] >> (j64 - b)) & 1 == 1);
            }
            ok
        };
        let keys: Vec<usize> = (0..p.n_ctx).filter(|&j| visible(j)).collect();
        if keys.is_empty() {
            continue;
        }
        for h in 0..p.n_head {
            let g = h / (p.n_head / p.n_head_kv);
            let kv = (s * p.n_head_kv + g) * p.n_ctx;
            let q = &p.q[(t * p.n_head + h) * d..][..d];
            let x: Vec<f64> = keys
                .iter()
                .map(|&j| {
                    let k = &p.k[(kv + j) * d..][..d];
                    let dot: f64 = q.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let x = p.scale as f64 * dot;
                    match p.softcap {
                        Some(c) => c as f64 * (x / c as f64).tanh(),
                        None => x,
                    }
                })
                .collect();
            let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = x.iter().map(|&x| (x - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            lse[t * p.n_head + h] = max + sum.ln();
            let o = &mut out[(t * p.n_head + h) * dv..][..dv];
            for (&j, &e) in keys.iter().zip(&e) {
                let v = &p.v[(kv + j) * dv..][..dv];
                for (o, &v) in o.iter_mut().zip(v) {
                    *o += e / sum * v as f64;
                }
            }
        }
    }
    (out, lse)
}

/// Keys per step of the online softmax: a tile of K and V (32 KiB each at head_dim 256) stays
/// in L1/L2 while every head of the group goes over it.
const TILE: usize = 32;

/// Computes [`Problem`]'s attention in f32 into `out` (`[n_tokens][n_head][head_dim_v]`) and
/// `lse` (`[n_tokens][n_head]`), on the rayon pool. Refuses an invalid problem or wrongly
/// sized outputs, writing nothing.
pub fn attention(p: &Problem, out: &mut [f32], lse: &mut [f32]) -> Result<(), String> {
    p.check()?;
    expect_len("out", out.len(), &[p.n_tokens, p.n_head, p.head_dim_v])?;
    expect_len("lse", lse.len(), &[p.n_tokens, p.n_head])?;
    let group = p.group();
    out.par_chunks_mut(group * p.head_dim_v)
        .zip(lse.par_chunks_mut(group))
        .enumerate()
        .for_each_init(Vec::new, |scratch, (i, (o, l))| {
            attend_group(p, i / p.n_head_kv, i % p.n_head_kv, o, l, scratch);
        });
    Ok(())
}

/// The keys one query token sees: causality, the window, `kv_len` and the tree's reach bound
/// them to `lo..hi`, which is what lets whole tiles be skipped; segments and the tree's bits
/// are then tested key by key.
struct RowMask<'a> {
    lo: usize,
    hi: usize,
    /// The token's segment and its sequence's key segments.
    seg: Option<(i32, &'a [i32])>,
    /// The token's tree bits and base.
    tree: Option<(u64, usize)>,
}

impl<'a> RowMask<'a> {
    fn new(p: &'a Problem, t: usize) -> Self {
        let s = p.q_seq[t] as usize;
        let pos = p.q_pos[t] as usize;
        let mut hi = p.kv_len[s] as usize;
        if p.causal {
            hi = hi.min(pos + 1);
        }
        let tree = p
            .tree
            .as_ref()
            .map(|(mask, base)| (mask[t], base[t] as usize));
        if let Some((_, base)) = tree {
            hi = hi.min(base + 64);
        }
        let lo = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let seg = match (&p.q_seg, &p.k_seg) {
            (Some(qs), Some(ks)) => Some((qs[t], &ks[s * p.n_ctx..(s + 1) * p.n_ctx])),
            _ => None,
        };
        Self { lo, hi, seg, tree }
    }

    fn is_empty(&self) -> bool {
        self.lo >= self.hi
    }

    #[inline(always)]
    fn visible(&self, j: usize) -> bool {
        // Below `hi`, `j - base < 64`, so the shift cannot overflow.
        (self.lo..self.hi).contains(&j)
            && self.seg.is_none_or(|(id, keys)| keys[j] == id)
            && self
                .tree
                .is_none_or(|(mask, base)| j < base || (mask >> (j - base)) & 1 == 1)
    }
}

multiversion! {
    /// The query heads of key/value head `g` at token `t`: `out` holds their
    /// `group * head_dim_v` outputs, `lse` their `group` log-sum-exps.
    fn attend_group(
        p: &Problem,
        t: usize,
        g: usize,
        out: &mut [f32],
        lse: &mut [f32],
        scratch: &mut Vec<f32>,
    ) {
        let (d, dv, group) = (p.head_dim, p.head_dim_v, p.group());
        let mask = RowMask::new(p, t);
        out.fill(0.0);
        lse.fill(f32::NEG_INFINITY);
        if mask.is_empty() {
            return;
        }
        let kv = p.kv_row(p.q_seq[t] as usize, g);
        let q = &p.q[(t * p.n_head + g * group) * d..][..group * d];
        scratch.clear();
        scratch.resize(group * (TILE + 2), 0.0);
        let (scores, state) = scratch.split_at_mut(group * TILE);
        let (maxes, sums) = state.split_at_mut(group);
        maxes.fill(f32::NEG_INFINITY);
        // Tiles start at multiples of TILE, as `intermediates` walks them.
        for start in (mask.lo / TILE * TILE..mask.hi).step_by(TILE) {
            let end = (start + TILE).min(mask.hi);
            for (i, j) in (start..end).enumerate() {
                let column = scores[i..].iter_mut().step_by(TILE);
                if mask.visible(j) {
                    let k = &p.k[(kv + j) * d..][..d];
                    for (s, q) in column.zip(q.chunks_exact(d)) {
                        *s = score(q, k, p.scale, p.softcap);
                    }
                } else {
                    column.for_each(|s| *s = f32::NEG_INFINITY);
                }
            }
            let n = end - start;
            for (h, o) in out.chunks_exact_mut(dv).enumerate() {
                fold(&mut scores[h * TILE..h * TILE + n], &mut maxes[h], &mut sums[h], o);
            }
            for (i, j) in (start..end).enumerate() {
                let v = &p.v[(kv + j) * dv..][..dv];
                for (o, &prob) in out.chunks_exact_mut(dv).zip(scores[i..].iter().step_by(TILE)) {
                    // Keys hidden by segments or the tree, and those whose weight underflowed,
                    // add nothing.
                    if prob != 0.0 {
                        axpy(o, prob, v);
                    }
                }
            }
        }
        let rows = out.chunks_exact_mut(dv).zip(lse);
        for ((o, l), (&max, &sum)) in rows.zip(maxes.iter().zip(&*sums)) {
            // The largest visible score contributes exp(0) = 1, so a zero sum means no
            // visible key: the row keeps its zeros and -inf.
            if sum > 0.0 {
                o.iter_mut().for_each(|x| *x /= sum);
                *l = max + sum.ln();
            }
        }
    }
}

/// The online-softmax state of one (token, head) row after one tile of keys.
#[derive(Clone, Debug, PartialEq)]
pub struct TileState {
    /// The tile's scaled (softcapped) scores; masked keys are -inf.
    pub scores: Vec<f32>,
    /// `exp(score - row_max)`; masked keys are 0.
    pub probs: Vec<f32>,
    /// Running max of the visible scores so far; -inf before any visible key.
    pub row_max: f32,
    /// Running sum of `exp(score - row_max)` so far; 0 before any visible key.
    pub row_sum: f32,
    /// Running unnormalised output `Σ exp(score - row_max) · v` (`head_dim_v` values).
    pub out: Vec<f32>,
}

/// The state of [`attention`]'s online softmax for query head `head` of token `token` after
/// each tile of `tile` keys over `0..kv_len` of its sequence, every tile included (fully masked
/// ones leave the state as it was). The last state, divided by its `row_sum`, is the output,
/// and `row_max + ln(row_sum)` the log-sum-exp.
///
/// # Panics
/// If [`Problem::check`] fails, `token` or `head` is out of range, or `tile` is 0.
pub fn intermediates(p: &Problem, token: usize, head: usize, tile: usize) -> Vec<TileState> {
    if let Err(e) = p.check() {
        panic!("intermediates: {e}");
    }
    assert!(
        token < p.n_tokens && head < p.n_head && tile > 0,
        "intermediates: token {token} of {}, head {head} of {}, tile {tile}",
        p.n_tokens,
        p.n_head
    );
    let (d, dv) = (p.head_dim, p.head_dim_v);
    let s = p.q_seq[token] as usize;
    let kv = p.kv_row(s, head / p.group());
    let q = &p.q[(token * p.n_head + head) * d..][..d];
    let mask = RowMask::new(p, token);
    let n = p.kv_len[s] as usize;
    let (mut row_max, mut row_sum, mut out) = (f32::NEG_INFINITY, 0.0, vec![0.0; dv]);
    (0..n)
        .step_by(tile)
        .map(|start| {
            let keys = start..(start + tile).min(n);
            let scores: Vec<f32> = keys
                .clone()
                .map(|j| {
                    if mask.visible(j) {
                        score(q, &p.k[(kv + j) * d..][..d], p.scale, p.softcap)
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect();
            let mut probs = scores.clone();
            fold(&mut probs, &mut row_max, &mut row_sum, &mut out);
            for (j, &prob) in keys.zip(&probs) {
                if prob != 0.0 {
                    axpy(&mut out, prob, &p.v[(kv + j) * dv..][..dv]);
                }
            }
            TileState {
                scores,
                probs,
                row_max,
                row_sum,
                out: out.clone(),
            }
        })
        .collect()
}

/// Folds one tile of scores into a row's running max, sum and unnormalised output, leaving
/// the tile's probabilities relative to the new max in `scores`; the caller adds them times V.
#[inline(always)]
fn fold(scores: &mut [f32], max: &mut f32, sum: &mut f32, out: &mut [f32]) {
    let tile_max = scores.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    if tile_max > *max {
        let correction = fast_exp(*max - tile_max);
        *sum *= correction;
        out.iter_mut().for_each(|x| *x *= correction);
        *max = tile_max;
    }
    if *max == f32::NEG_INFINITY {
        // No visible key yet: exp(-inf - -inf) would be NaN.
        scores.fill(0.0);
        return;
    }
    let m = *max;
    scores.iter_mut().for_each(|s| *s = fast_exp(*s - m));
    *sum += scores.iter().sum::<f32>();
}

#[inline(always)]
fn score(q: &[f32], k: &[f32], scale: f32, softcap: Option<f32>) -> f32 {
    let x = dot(q, k) * scale;
    match softcap {
        Some(cap) => fast_tanh(x / cap) * cap,
        None => x,
    }
}
