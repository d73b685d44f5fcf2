//! Token sampling: llama.cpp's default chain over one row of logits.
//!
//! The chain is penalties → top-k → top-p → min-p → temperature → softmax → a seeded draw
//! (`common/sampling.cpp`); a temperature `<= 0` takes the argmax after the penalties instead.
//! One [`Sampler::sample`] call over a vocabulary of `V` tokens:
//!
//! 1. penalises, in place, only the tokens of the penalty window (never a pass over `V`);
//! 2. finds the maximum logit `M`, then gathers the candidates that can still matter, skipping
//!    whole blocks of the vocabulary with one vectorised test each: tokens whose combined mass
//!    lies below `f32` resolution never enter, nor tokens under the min-p bar when that cut is
//!    exact (min-p is a logit threshold: `p_i >= min_p * p_max` ⟺ `l_i >= M + ln(min_p)`);
//! 3. with a small top-k (the default 40), a running threshold (the k-th best seen so far)
//!    rejects almost every token by one comparison, and top-p and min-p cut the sorted k;
//! 4. otherwise nothing is sorted wholesale: top-k selects on a copy, top-p finds its cut
//!    through a mass histogram over logit buckets and sorts only the bucket where `p` is
//!    crossed, and the survivors are kept in id order;
//! 5. the survivors are weighted by `exp((l - M) / T)` and one uniform draw picks a token.
//!
//! Every filter keeps a prefix of the total order "logit descending, then id ascending", so ties
//! go to the lowest id; survivors are visited in that order in case 3 and in id order in case
//! 4, so the token depends only on the logits, the window and the seed.
//! The buffers are sized for the vocabulary at construction; `sample` does not allocate.
//! NaN logits are never chosen; `-inf` marks a token as impossible.

use std::cmp::Ordering;
use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::time::{SystemTime, UNIX_EPOCH};

/// Tokens more than `ln(V) + TAIL_NATS` below the maximum (in temperature-scaled logits) carry
/// together less than `e^-17 ≈ 4.1e-8 < 2^-24` of the mass: adding them to a normaliser of at
/// least 1 cannot change it in `f32`, so they are dropped before any sorting or `exp`.
const TAIL_NATS: f32 = 17.0;

/// Up to this top-k the candidates are kept sorted (case 3 of the plan); beyond it, sorting
/// them would cost more than case 4's selections.
const SORTED_TOP_K: usize = 4096;

/// Logit buckets of top-p's mass histogram; only the bucket where the mass crosses `p` is
/// sorted.
const TOP_P_BUCKETS: usize = 4096;

/// Tokens per block in the scans over the vocabulary.
const CHUNK: usize = 64;

/// An invalid sampling parameter or vocabulary.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SamplingError {
    /// A parameter is NaN or infinite.
    #[error("sampling: {param} must be a finite number, got {value}")]
    NotFinite {
        /// The field of [`SamplerParams`].
        param: &'static str,
        /// The value given.
        value: f32,
    },
    /// A parameter is finite but outside its range.
    #[error("sampling: {param} = {value} is out of range, expected {expected}")]
    OutOfRange {
        /// The field of [`SamplerParams`].
        param: &'static str,
        /// The value given.
        value: f32,
        /// The accepted range, in words.
        expected: &'static str,
    },
    /// The vocabulary has no tokens.
    #[error("sampling: the vocabulary is empty")]
    EmptyVocabulary,
    /// The vocabulary has more tokens than 32-bit ids can name.
    #[error("sampling: a vocabulary of {0} tokens does not fit 32-bit token ids")]
    VocabularyTooLarge(usize),
}

/// Sampling settings. [`Default`] gives llama.cpp's defaults with a freshly drawn seed.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerParams {
    /// Divides the logits before the softmax; `<= 0` samples greedily. Default 0.8.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 turns it off. Default 40.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`, in
    /// `[0, 1]`; 1 turns it off. Default 0.95.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one, in `[0, 1]`; 0 turns it
    /// off. Default 0.05.
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of tokens in the penalty window, `> 0`;
    /// 1 turns it off. Default 1.0.
    pub repeat_penalty: f32,
    /// Subtracted from a window token's logit once per occurrence in the window. Default 0.0.
    pub frequency_penalty: f32,
    /// Subtracted once from the logit of every token present in the window. Default 0.0.
    pub presence_penalty: f32,
    /// How many of the most recently accepted tokens the penalties look at; 0 turns them off.
    /// Default 64.
    pub penalty_last_n: usize,
    /// Seed of the draw; the same seed, logits and accepted tokens give the same tokens from
    /// [`Sampler`] on every platform (a backend that draws on the device, as the CUDA one does,
    /// draws its own tokens from it). Default: drawn at random when the value is constructed.
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_last_n: 64,
            seed: random_seed(),
        }
    }
}

impl SamplerParams {
    /// Greedy decoding: the argmax of the logits, with every filter and penalty off.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_last_n: 0,
            seed: 0,
        }
    }

    /// Whether these settings take the argmax instead of drawing.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Checks every parameter's range.
    pub fn validate(&self) -> Result<(), SamplingError> {
        finite("temperature", self.temperature)?;
        unit_interval("top_p", self.top_p)?;
        unit_interval("min_p", self.min_p)?;
        finite("repeat_penalty", self.repeat_penalty)?;
        // The penalty divides positive logits, so its reciprocal must be finite too.
        if self.repeat_penalty <= 0.0 || !(1.0 / self.repeat_penalty).is_finite() {
            return Err(SamplingError::OutOfRange {
                param: "repeat_penalty",
                value: self.repeat_penalty,
                expected: "a number greater than 0 (1 is off)",
            });
        }
        finite("frequency_penalty", self.frequency_penalty)?;
        finite("presence_penalty", self.presence_penalty)?;
        Ok(())
    }

    /// Whether no repetition penalty changes the logits.
    pub fn penalties_off(&self) -> bool {
        self.penalty_last_n == 0
            || (self.repeat_penalty == 1.0
                && self.frequency_penalty == 0.0
                && self.presence_penalty == 0.0)
    }
}

fn finite(param: &'static str, value: f32) -> Result<(), SamplingError> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(SamplingError::NotFinite { param, value })
    }
}

fn unit_interval(param: &'static str, value: f32) -> Result<(), SamplingError> {
    finite(param, value)?;
    if (0.0..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(SamplingError::OutOfRange {
            param,
            value,
            expected: "a number in [0, 1]",
        })
    }
}

/// A seed from the process's hash randomness mixed with the clock.
fn random_seed() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    RandomState::new().hash_one(nanos)
}

/// One token still in the running.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    logit: f32,
    id: u32,
}

impl Candidate {
    fn new(logit: f32, index: usize) -> Self {
        Self {
            logit,
            id: index as u32,
        }
    }
}

/// The order every filter cuts a prefix of: logit descending, then id ascending. Candidates
/// never hold NaN, so this is a total order.
fn rank(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit
        .partial_cmp(&a.logit)
        .unwrap_or(Ordering::Equal)
        .then(a.id.cmp(&b.id))
}

/// Draws tokens from logits with llama.cpp's default sampler chain.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplerParams,
    n_vocab: usize,
    rng: Xoshiro256pp,
    /// The last `penalty_last_n` accepted tokens, oldest first.
    window: VecDeque<u32>,
    /// The window, sorted, to count occurrences without a vocabulary-sized table.
    window_sorted: Vec<u32>,
    /// The tokens still in the running.
    candidates: Vec<Candidate>,
    /// A copy of the candidates for top-k to reorder when the survivors keep their id order.
    ranked: Vec<Candidate>,
    /// Top-p's mass per logit bucket, and the candidates of the bucket where `p` is crossed.
    bucket_mass: Vec<f64>,
    crossing: Vec<Candidate>,
    /// The survivors' weights for the draw.
    weights: Vec<f32>,
}

impl Sampler {
    /// A sampler for logits of `n_vocab` tokens.
    pub fn new(params: SamplerParams, n_vocab: usize) -> Result<Self, SamplingError> {
        params.validate()?;
        if n_vocab == 0 {
            return Err(SamplingError::EmptyVocabulary);
        }
        if u32::try_from(n_vocab - 1).is_err() {
            return Err(SamplingError::VocabularyTooLarge(n_vocab));
        }
        // The window grows on demand past this, so a huge `penalty_last_n` costs nothing up front.
        let window_cap = params.penalty_last_n.min(1 << 16);
        Ok(Self {
            rng: Xoshiro256pp::seed_from_u64(params.seed),
            n_vocab,
            window: VecDeque::with_capacity(window_cap),
            window_sorted: Vec::with_capacity(window_cap),
            candidates: Vec::with_capacity(n_vocab),
            ranked: Vec::with_capacity(n_vocab),
            bucket_mass: Vec::with_capacity(TOP_P_BUCKETS),
            crossing: Vec::with_capacity(n_vocab),
            weights: Vec::with_capacity(n_vocab),
            params,
        })
    }

    /// The settings this sampler was built with.
    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// The vocabulary size this sampler was built for.
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// Whether [`Sampler::sample`] takes the argmax instead of drawing.
    pub fn is_greedy(&self) -> bool {
        self.params.is_greedy()
    }

    /// Records a token in the penalty window. Feed it the prompt tokens as well as every
    /// generated one, as llama.cpp's `common_sampler_accept` does.
    pub fn accept(&mut self, token: u32) {
        let last_n = self.params.penalty_last_n;
        if last_n == 0 {
            return;
        }
        if self.window.len() >= last_n {
            self.window.pop_front();
        }
        self.window.push_back(token);
    }

    /// Empties the penalty window and restarts the random stream from the seed.
    pub fn reset(&mut self) {
        self.window.clear();
        self.rng = Xoshiro256pp::seed_from_u64(self.params.seed);
    }

    /// Applies the repeat, frequency and presence penalties in place, as llama.cpp does: for a
    /// token seen `c > 0` times in the window, `l <= 0 ? l * repeat : l / repeat`, then
    /// `- c * frequency - presence`. Ids outside `logits` are ignored.
    pub fn apply_penalties(&mut self, logits: &mut [f32]) {
        if self.params.penalties_off() || self.window.is_empty() {
            return;
        }
        let p = &self.params;
        self.window_sorted.clear();
        self.window_sorted.extend(self.window.iter().copied());
        self.window_sorted.sort_unstable();
        for run in self.window_sorted.chunk_by(|a, b| a == b) {
            let Some(logit) = logits.get_mut(run[0] as usize) else {
                continue;
            };
            if *logit <= 0.0 {
                *logit *= p.repeat_penalty;
            } else {
                *logit /= p.repeat_penalty;
            }
            *logit -= run.len() as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }

    /// Picks the next token from one row of logits (`logits.len()` tokens, normally
    /// `n_vocab`), penalising them in place first.
    ///
    /// If every logit is NaN or `-inf` there is nothing to draw from and the lowest id whose
    /// logit is `-inf` is returned (0 when there is none, including an empty row). If some
    /// logits are `+inf`, the draw is uniform over those tokens.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        self.apply_penalties(logits);
        let mut max = max_logit(logits);
        if max == f32::NEG_INFINITY || self.is_greedy() {
            return first_index_of(logits, max);
        }
        if max == f32::INFINITY {
            // `exp(inf - inf)` is NaN; as the largest finite value the infinite tokens tie at
            // weight 1 and everything else underflows to 0.
            for l in logits.iter_mut().filter(|l| **l == f32::INFINITY) {
                *l = f32::MAX;
            }
            max = f32::MAX;
        }
        self.draw(logits, max)
    }

    /// Steps 2–5 of the module plan, for logits with a finite maximum `max`.
    fn draw(&mut self, logits: &[f32], max: f32) -> u32 {
        let p = &self.params;
        let n = logits.len();
        let top_k = if p.top_k > 0 && p.top_k < n {
            p.top_k
        } else {
            0
        };
        let top_p = (p.top_p < 1.0).then_some(p.top_p);
        let min_p_bar = if p.min_p > 0.0 {
            max + p.min_p.ln()
        } else {
            f32::NEG_INFINITY
        };
        // Top-p normalises over everything top-k kept (at temperature 1), and the draw over
        // everything at temperature T: the tail bound must hold for both.
        let tail_nats = ((n as f32).ln() + TAIL_NATS) * p.temperature.max(1.0);
        let mut floor = max - tail_nats;
        if top_p.is_none() {
            // Min-p only competes with prefix cuts that do not depend on it, so cutting first is
            // exact; top-p's normaliser would see fewer tokens if it ran after this cut.
            floor = floor.max(min_p_bar);
        }
        // `>= floor` never admits NaN, and `f32::MIN` keeps `-inf` out.
        let floor = floor.max(f32::MIN);

        let cands = &mut self.candidates;
        if top_k > 0 && top_k <= SORTED_TOP_K {
            gather_top_k(cands, logits, floor, top_k);
            let mut kept = cands.len();
            if let Some(top_p) = top_p {
                kept = top_p_sorted(cands, max, top_p);
            }
            // The first candidate is the maximum and always passes.
            kept = 1 + cands[1..kept]
                .iter()
                .take_while(|c| c.logit >= min_p_bar)
                .count();
            cands.truncate(kept);
        } else {
            gather(cands, logits, floor);
            // The cuts are found without reordering `cands`, so the survivors keep their id
            // order: `last` is the last survivor of top-k and top-p in rank order.
            let mut last = None;
            let mut set = &cands[..];
            if top_k > 0 && top_k < cands.len() {
                let ranked = &mut self.ranked;
                ranked.clear();
                ranked.extend_from_slice(cands);
                ranked.select_nth_unstable_by(top_k - 1, rank);
                last = Some(ranked[top_k - 1]);
                // Top-p normalises over the top-k set.
                set = &ranked[..top_k];
            }
            if let Some(top_p) = top_p {
                last = top_p_histogram(
                    set,
                    max,
                    top_p,
                    &mut self.weights,
                    &mut self.bucket_mass,
                    &mut self.crossing,
                );
            }
            if let Some(last) = last {
                // Branch-free compaction: about half survive, in no predictable pattern.
                let mut kept = 0;
                for i in 0..cands.len() {
                    let c = cands[i];
                    cands[kept] = c;
                    let ranks_in =
                        (c.logit > last.logit) | ((c.logit == last.logit) & (c.id <= last.id));
                    kept += usize::from(ranks_in & (c.logit >= min_p_bar));
                }
                cands.truncate(kept);
            }
        }
        let survivors = &self.candidates[..];

        // Dividing (not multiplying by 1/T) keeps the maximum's weight at exactly 1 even when
        // 1/T overflows.
        let temp = p.temperature;
        self.weights.clear();
        self.weights.extend(
            survivors
                .iter()
                .map(|c| exp_nonpositive((c.logit - max) / temp)),
        );
        let total: f64 = self.weights.iter().map(|&w| f64::from(w)).sum();
        let target = self.rng.next_f64() * total;
        let mut cumulative = 0.0f64;
        for (c, &w) in survivors.iter().zip(&self.weights) {
            cumulative += f64::from(w);
            if cumulative > target {
                return c.id;
            }
        }
        // Rounding left the target at the very top: take the last token with any weight (the
        // maximum has weight 1, so there is one).
        survivors
            .iter()
            .zip(&self.weights)
            .rev()
            .find(|(_, &w)| w > 0.0)
            .map_or(survivors[0].id, |(c, _)| c.id)
    }
}

/// Whether any of `chunk` is at least `bar`: a branch-free reduction that vectorises, so a
/// whole chunk of hopeless tokens costs a few instructions.
fn any_at_least(chunk: &[f32], bar: f32) -> bool {
    chunk.iter().fold(false, |any, &l| any | (l >= bar))
}

/// The largest logit, skipping NaN (`l > m` is false for it); `-inf` when there is none.
fn max_logit(logits: &[f32]) -> f32 {
    // Independent lanes let the loop vectorise.
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = logits.chunks_exact(lanes.len());
    let rest = chunks.remainder();
    for chunk in chunks {
        for (m, &l) in lanes.iter_mut().zip(chunk) {
            if l > *m {
                *m = l;
            }
        }
    }
    lanes
        .iter()
        .chain(rest)
        .fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m })
}

/// The lowest index holding `value`, or 0.
fn first_index_of(logits: &[f32], value: f32) -> u32 {
    logits
        .chunks(CHUNK)
        .position(|c| c.iter().fold(false, |any, &l| any | (l == value)))
        .and_then(|c| {
            let base = c * CHUNK;
            logits[base..]
                .iter()
                .position(|&l| l == value)
                .map(|i| base + i)
        })
        .unwrap_or(0) as u32
}

/// Fills `out` with every token at or above `floor`, in id order.
fn gather(out: &mut Vec<Candidate>, logits: &[f32], floor: f32) {
    out.clear();
    for (c, chunk) in logits.chunks(CHUNK).enumerate() {
        if !any_at_least(chunk, floor) {
            continue;
        }
        let base = c * CHUNK;
        for (i, &l) in chunk.iter().enumerate() {
            if l >= floor {
                out.push(Candidate::new(l, base + i));
            }
        }
    }
}

/// Fills `out` with the `k` best tokens at or above `floor`, sorted by [`rank`].
///
/// Candidates collect in a buffer of a few times `k`; whenever it fills, it is cut back to the
/// best `k` and the k-th logit becomes the bar. A later token must beat the bar outright, since
/// an equal logit loses to the earlier (lower) id, so most of the vocabulary is skipped a chunk
/// at a time.
fn gather_top_k(out: &mut Vec<Candidate>, logits: &[f32], floor: f32, k: usize) {
    let flush_at = 2 * k + 1024;
    let mut bar = floor;
    out.clear();
    for (c, chunk) in logits.chunks(CHUNK).enumerate() {
        if !any_at_least(chunk, bar) {
            continue;
        }
        let base = c * CHUNK;
        for (i, &l) in chunk.iter().enumerate() {
            // `>=`, not `!(l < bar)`: NaN must stay out, as `rank` needs a total order.
            if l >= bar {
                out.push(Candidate::new(l, base + i));
                if out.len() == flush_at {
                    out.select_nth_unstable_by(k - 1, rank);
                    out.truncate(k);
                    bar = bar.max(next_up(out[k - 1].logit));
                }
            }
        }
    }
    if out.len() > k {
        out.select_nth_unstable_by(k - 1, rank);
        out.truncate(k);
    }
    out.sort_unstable_by(rank);
}

/// The smallest `f32` above the finite `x` (`f32::next_up`, which is newer than the MSRV).
fn next_up(x: f32) -> f32 {
    let bits = x.to_bits();
    if x == 0.0 {
        f32::from_bits(1)
    } else if x > 0.0 {
        f32::from_bits(bits + 1)
    } else {
        f32::from_bits(bits - 1)
    }
}

/// Top-p over candidates sorted by [`rank`] (at temperature 1, normalised over all of them):
/// the length of the shortest prefix whose probability reaches `p`.
fn top_p_sorted(cands: &[Candidate], max: f32, p: f32) -> usize {
    let weight = |c: &Candidate| f64::from(exp_nonpositive(c.logit - max));
    let target = f64::from(p) * cands.iter().map(weight).sum::<f64>();
    let mut cumulative = 0.0f64;
    for (i, c) in cands.iter().enumerate() {
        cumulative += weight(c);
        if cumulative >= target {
            return i + 1;
        }
    }
    cands.len()
}

/// Top-p over unordered candidates: the last one, in [`rank`] order, of the shortest prefix
/// whose probability reaches `p` (at temperature 1, normalised over all of them); `None` when
/// there are no candidates.
///
/// Sorting what is often most of the vocabulary is avoided with a histogram: candidates fall
/// into [`TOP_P_BUCKETS`] buckets of equal logit width below `max`, one pass sums each bucket's
/// mass, the cumulative mass picks the bucket where `p` is crossed, and only that bucket's
/// candidates (collected into `crossing`) are sorted. A lower bucket index means a higher
/// logit, so every bucket ranks wholly above the next. `weights` is scratch.
fn top_p_histogram(
    cands: &[Candidate],
    max: f32,
    p: f32,
    weights: &mut Vec<f32>,
    bucket_mass: &mut Vec<f64>,
    crossing: &mut Vec<Candidate>,
) -> Option<Candidate> {
    let lowest = cands.iter().fold(max, |m, c| m.min(c.logit));
    // Rounding can only push an index up to the last bucket, never out of order.
    let per_nat = (TOP_P_BUCKETS as f32 - 1.0) / (max - lowest).max(f32::MIN_POSITIVE);
    let bucket = |c: &Candidate| (((max - c.logit) * per_nat) as usize).min(TOP_P_BUCKETS - 1);
    // The exponentials first, in a loop that vectorises, then the scatter into buckets.
    weights.clear();
    weights.extend(cands.iter().map(|c| exp_nonpositive(c.logit - max)));
    bucket_mass.clear();
    bucket_mass.resize(TOP_P_BUCKETS, 0.0);
    let mut total = 0.0f64;
    for (c, &w) in cands.iter().zip(weights.iter()) {
        bucket_mass[bucket(c)] += f64::from(w);
        total += f64::from(w);
    }
    let target = f64::from(p) * total;
    let mut before = 0.0f64;
    let mut cross = TOP_P_BUCKETS - 1;
    for (b, &m) in bucket_mass.iter().enumerate() {
        if before + m >= target {
            cross = b;
            break;
        }
        before += m;
    }
    crossing.clear();
    crossing.extend(cands.iter().filter(|c| bucket(c) == cross));
    crossing.sort_unstable_by(rank);
    for c in crossing.iter() {
        before += f64::from(exp_nonpositive(c.logit - max));
        if before >= target {
            return Some(*c);
        }
    }
    // Rounding kept the target out of reach: keep everything, down to the last in rank order.
    cands.iter().copied().max_by(rank)
}

/// `e^x` for `x <= 0` (NaN excluded), within a few ulp, without a libm call so that the loops
/// over hundreds of thousands of candidates stay cheap: `x = n ln 2 + r` with `|r| <= ln 2 / 2`,
/// a degree-7 polynomial for `e^r` (Cephes `expf`), and `2^n` built in the exponent bits.
/// Below `-87.3` the result would be subnormal and is flushed to 0.
fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that `n * LN2_HI` is exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Selects rather than an early return, so loops over it vectorise.
    let underflows = x < -87.3;
    let x = if underflows { -87.3 } else { x };
    // Adding and removing 1.5 * 2^23 rounds to the nearest integer in plain float arithmetic
    // (no SSE4.1 `roundps`, no libm call).
    const ROUND: f32 = 12_582_912.0;
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    // Horner without `mul_add`, which is a libm call on CPUs without FMA.
    let poly = ((((1.987_569_1e-4_f32 * r + 1.398_2e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
        * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let er = (poly * r * r) + r + 1.0;
    // n is in [-126, 0], so `n + 127` is a normal biased exponent.
    let scaled = er * f32::from_bits(((n as i32 + 127) as u32) << 23);
    if underflows {
        0.0
    } else {
        scaled
    }
}

/// xoshiro256++ seeded through splitmix64: small, fast, and fixed here so a seed means the
/// same stream on every platform and with every dependency version.
#[derive(Debug, Clone)]
struct Xoshiro256pp {
    s: [u64; 4],
}

impl Xoshiro256pp {
    fn seed_from_u64(seed: u64) -> Self {
        let mut state = seed;
        let mut splitmix = || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Self {
            s: [splitmix(), splitmix(), splitmix(), splitmix()],
        }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::Xoshiro256pp;
    use rand_xoshiro::rand_core::{RngCore, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    /// The generator is the published xoshiro256++ with splitmix64 seeding, the same stream as
    /// `rand_xoshiro` gives for `seed_from_u64`.
    #[test]
    fn xoshiro_matches_rand_xoshiro() {
        for seed in [0, 1, 42, 0xdead_beef_cafe_f00d, u64::MAX] {
            let mut ours = Xoshiro256pp::seed_from_u64(seed);
            let mut theirs = Xoshiro256PlusPlus::seed_from_u64(seed);
            for _ in 0..1000 {
                assert_eq!(ours.next_u64(), theirs.next_u64(), "seed {seed}");
            }
        }
    }

    #[test]
    fn next_up_steps_one_ulp() {
        use super::next_up;
        assert_eq!(next_up(1.0), 1.0 + f32::EPSILON);
        assert_eq!(next_up(-1.0), -1.0 + f32::EPSILON / 2.0);
        assert_eq!(next_up(0.0), f32::from_bits(1));
        assert_eq!(next_up(-0.0), f32::from_bits(1));
        assert_eq!(next_up(-f32::MIN_POSITIVE), -f32::from_bits(0x007f_ffff));
        assert_eq!(next_up(f32::MAX), f32::INFINITY);
    }

    #[test]
    fn exp_nonpositive_matches_f64_exp() {
        let mut worst = 0.0f64;
        for i in 0..=1_000_000 {
            let x = -87.0 * i as f32 / 1_000_000.0;
            let exact = f64::from(x).exp();
            let got = f64::from(super::exp_nonpositive(x));
            worst = worst.max((got - exact).abs() / exact);
        }
        // A few f32 ulp (2^-23 ≈ 1.2e-7).
        assert!(worst < 4e-7, "relative error {worst:e}");
        assert_eq!(super::exp_nonpositive(0.0), 1.0);
        assert_eq!(super::exp_nonpositive(-88.0), 0.0);
        assert_eq!(super::exp_nonpositive(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn next_f64_is_in_unit_interval() {
        let mut rng = Xoshiro256pp::seed_from_u64(7);
        let draws: Vec<f64> = (0..10_000).map(|_| rng.next_f64()).collect();
        assert!(draws.iter().all(|&u| (0.0..1.0).contains(&u)));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
    }
}
