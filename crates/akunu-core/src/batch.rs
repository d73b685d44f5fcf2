//! Continuous batching: many sequences share every forward pass.
//!
//! Plan: a [`Scheduler`] owns a session with `n_slots` KV-cache slots and a queue of waiting
//! requests. Each [`Scheduler::step`] is one pass:
//!
//! 1. sequences whose listener has gone (a client disconnected) leave, freeing their slot;
//! 2. waiting requests take free slots, each the slot whose cached tokens share the longest
//!    prefix with its prompt (a prefix cache for free: a finished sequence's tokens stay in its
//!    slot until another takes it), then the least recently used;
//! 3. the pass holds one decode token of every generating sequence, then prompt chunks of the
//!    sequences still being prefilled, oldest first, up to the backend's batch size, so a long
//!    prompt never stops the others' decoding for more than one pass;
//! 4. every sequence whose last token got logits takes its next token, drawn on the device
//!    where the backend can draw with its parameters (its logits then stay there; a sequence
//!    reporting log-probabilities is sampled on the host), which goes through its streaming
//!    detokenizer and stop-string matcher to its listener, exactly as the single-sequence
//!    loop of [`crate::generate`] does.
//!
//! A sequence's tokens depend only on its prompt, its parameters and its logits, so with a
//! batch-invariant backend a request gets the same tokens alone or among many.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use akunu_tokenizer::{StreamDecoder, Tokenizer};

use crate::backend::Backend;
use crate::generate::{GenerateParams, StopReason};
use crate::sampling::Sampler;
use crate::session::{Part, Session};
use crate::stop::StopMatcher;
use crate::EngineError;

/// One request: a prompt to continue.
#[derive(Clone, Debug)]
pub struct SeqRequest {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    /// Report log-probabilities of the chosen tokens and of this many most likely ones.
    pub logprobs: Option<usize>,
}

/// Most alternatives [`SeqRequest::logprobs`] may ask for.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// The model's log-probability of a generated token, before any sampling transformation.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub logprob: f32,
    /// The most likely tokens at that position, most likely first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GeneratedToken {
    pub id: u32,
    pub logprob: Option<TokenLogprob>,
}

/// Timings and counts of a finished sequence.
#[derive(Clone, Debug)]
pub struct SeqSummary {
    pub reason: StopReason,
    pub prompt_tokens: usize,
    /// Prompt tokens found in the cache instead of being evaluated.
    pub reused: usize,
    pub completion_tokens: usize,
    /// From submission to taking a slot.
    pub queued: Duration,
    /// From taking a slot to the first token.
    pub prompt_time: Duration,
    /// From the first token to the end.
    pub gen_time: Duration,
}

/// What a sequence tells its listener.
#[derive(Clone, Debug)]
pub enum SeqEvent {
    /// Text that became final (possibly empty) and the tokens generated since the last event.
    Delta {
        text: String,
        tokens: Vec<GeneratedToken>,
    },
    Finished(SeqSummary),
    /// The engine failed; the sequence is over.
    Failed(String),
}

/// Receives a sequence's events; dropping out (returning `false`, or reporting
/// [`Listener::cancelled`]) ends the sequence and frees its slot.
pub trait Listener: Send {
    fn send(&mut self, event: SeqEvent) -> bool;
    /// Whether the receiver has gone; checked before every pass.
    fn cancelled(&self) -> bool;
}

/// Why a request was not queued.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SubmitError {
    #[error("the prompt has no tokens")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens, the context holds {n_ctx}")]
    PromptTooLong { prompt: usize, n_ctx: usize },
    #[error("the prompt ({prompt} tokens) plus max_tokens ({max_tokens}) exceeds the context of {n_ctx} tokens")]
    ContextExceeded {
        prompt: usize,
        max_tokens: usize,
        n_ctx: usize,
    },
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadToken { id: u32, n_vocab: usize },
    #[error("top_logprobs must be at most {MAX_TOP_LOGPROBS}, got {0}")]
    TooManyLogprobs(usize),
    #[error(transparent)]
    Sampling(#[from] crate::sampling::SamplingError),
}

/// What one pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepStats {
    pub decode_tokens: usize,
    pub prompt_tokens: usize,
}

struct Waiting {
    request: SeqRequest,
    sampler: Sampler,
    listener: Box<dyn Listener>,
    submitted: Instant,
}

struct Seq<'t> {
    listener: Box<dyn Listener>,
    sampler: Sampler,
    stream: StreamDecoder<'t>,
    stops: StopMatcher,
    prompt: Vec<u32>,
    params: GenerateParams,
    logprobs: Option<usize>,
    /// Prompt tokens already in the cache.
    prefilled: usize,
    reused: usize,
    /// The sampled token that the next pass evaluates.
    next: Option<u32>,
    generated: usize,
    queued: Duration,
    admitted: Instant,
    first_token: Option<Instant>,
}

pub struct Scheduler<'t, B: Backend> {
    session: Session<B>,
    tokenizer: &'t Tokenizer,
    slots: Vec<Option<Seq<'t>>>,
    /// When each slot was last given out, for least-recently-used choice.
    last_used: Vec<u64>,
    clock: u64,
    waiting: VecDeque<Waiting>,
    /// Admission order of the busy slots: prompt chunks go to the oldest first.
    order: VecDeque<usize>,
    row: Vec<f32>,
    raw: Vec<f32>,
}

impl<'t, B: Backend> Scheduler<'t, B> {
    /// A scheduler over every slot of `session`. The backend must take a decode token of every
    /// slot in one pass.
    pub fn new(session: Session<B>, tokenizer: &'t Tokenizer) -> Result<Self, EngineError> {
        let n = session.n_slots();
        if n == 0 || session.backend().max_batch() < n {
            return Err(EngineError::BadBatch(format!(
                "{n} slots need a batch size of at least {n}, the backend takes {}",
                session.backend().max_batch()
            )));
        }
        Ok(Self {
            row: vec![0.0; session.n_vocab()],
            raw: vec![0.0; session.n_vocab()],
            session,
            tokenizer,
            slots: (0..n).map(|_| None).collect(),
            last_used: vec![0; n],
            clock: 0,
            waiting: VecDeque::new(),
            order: VecDeque::new(),
        })
    }

    pub fn session(&self) -> &Session<B> {
        &self.session
    }

    pub fn n_ctx(&self) -> usize {
        self.session.n_ctx()
    }

    /// Sequences holding a slot.
    pub fn active(&self) -> usize {
        self.order.len()
    }

    /// Requests waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_idle(&self) -> bool {
        self.order.is_empty() && self.waiting.is_empty()
    }

    /// Queues a request after checking everything that can be checked without running it.
    pub fn submit(
        &mut self,
        request: SeqRequest,
        listener: Box<dyn Listener>,
    ) -> Result<(), SubmitError> {
        let (prompt, n_ctx) = (request.prompt.len(), self.session.n_ctx());
        if prompt == 0 {
            return Err(SubmitError::EmptyPrompt);
        }
        if prompt >= n_ctx {
            return Err(SubmitError::PromptTooLong { prompt, n_ctx });
        }
        if let Some(max_tokens) = request.params.max_tokens {
            if max_tokens > n_ctx - prompt {
                return Err(SubmitError::ContextExceeded {
                    prompt,
                    max_tokens,
                    n_ctx,
                });
            }
        }
        let n_vocab = self.session.n_vocab();
        if let Some(&id) = request.prompt.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(SubmitError::BadToken { id, n_vocab });
        }
        if let Some(n) = request.logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
            return Err(SubmitError::TooManyLogprobs(n));
        }
        let sampler = Sampler::new(request.params.sampler.clone(), n_vocab)?;
        self.waiting.push_back(Waiting {
            request,
            sampler,
            listener,
            submitted: Instant::now(),
        });
        Ok(())
    }

    /// Ends every sequence, waiting or running, with `Failed(why)`.
    pub fn abort_all(&mut self, why: &str) {
        for mut w in self.waiting.drain(..) {
            w.listener.send(SeqEvent::Failed(why.to_string()));
        }
        while let Some(slot) = self.order.pop_front() {
            if let Some(mut seq) = self.slots[slot].take() {
                seq.listener.send(SeqEvent::Failed(why.to_string()));
            }
        }
    }

    /// Runs one pass (see the module plan). Does nothing when idle.
    pub fn step(&mut self) -> StepStats {
        self.drop_cancelled();
        self.admit();
        let mut stats = StepStats::default();
        let budget = self.session.backend().max_batch();
        let mut parts: Vec<Part> = Vec::with_capacity(self.order.len());
        for &slot in &self.order {
            let seq = self.slots[slot].as_ref().expect("ordered slots are busy");
            if let Some(tok) = &seq.next {
                parts.push(Part {
                    slot,
                    tokens: std::slice::from_ref(tok),
                    logits: true,
                });
                stats.decode_tokens += 1;
            }
        }
        let mut room = budget - stats.decode_tokens;
        for &slot in &self.order {
            let seq = self.slots[slot].as_ref().expect("ordered slots are busy");
            let left = seq.prompt.len() - seq.prefilled;
            if room == 0 || left == 0 || seq.next.is_some() {
                continue;
            }
            let n = left.min(room);
            parts.push(Part {
                slot,
                tokens: &seq.prompt[seq.prefilled..seq.prefilled + n],
                logits: n == left,
            });
            room -= n;
            stats.prompt_tokens += n;
        }
        if parts.is_empty() {
            return stats;
        }
        // (slot, token count, logits) of each part, for the updates after the pass.
        let plan: Vec<(usize, usize, bool)> = parts
            .iter()
            .map(|p| (p.slot, p.tokens.len(), p.logits))
            .collect();
        let n_vocab = self.session.n_vocab();
        let n_ctx = self.session.n_ctx();
        // Tokens are drawn on the device where the backend can draw with the sequence's
        // parameters; a sequence reporting log-probabilities needs its logits on the host.
        let backend = self.session.backend();
        let draws: Vec<_> = plan
            .iter()
            .filter(|&&(_, _, wants)| wants)
            .map(|&(slot, _, _)| {
                let seq = self.slots[slot].as_ref().expect("planned slots are busy");
                let params = &seq.params.sampler;
                (seq.logprobs.is_none() && backend.samples_on_device(params)).then_some(params)
            })
            .collect();
        let drawn = match self.session.step_drawing(&parts, &draws) {
            Ok(drawn) => drawn,
            Err(e) => {
                let why = format!("forward pass failed: {e}");
                for (slot, _, _) in plan {
                    self.fail(slot, &why);
                }
                return StepStats::default();
            }
        };
        let mut rows = drawn.logits.chunks_exact(n_vocab);
        let mut tokens = drawn.tokens.into_iter();
        let mut ended = Vec::new();
        for (slot, n, wants) in plan {
            let seq = self.slots[slot].as_mut().expect("planned slots are busy");
            if seq.next.take().is_none() {
                seq.prefilled += n;
            }
            if wants {
                let token = tokens.next().expect("one token per part that asked");
                let row = rows.next();
                let next = match token {
                    Some(id) => Next::Drawn(id),
                    None => {
                        self.row
                            .copy_from_slice(row.expect("logits for every host draw"));
                        Next::Host(&mut self.row, &mut self.raw)
                    }
                };
                // Every generated token is now in the cache, after the whole prompt.
                let room = seq.prefilled + seq.generated < n_ctx;
                if let Some(reason) = seq.advance(next, self.tokenizer, room) {
                    ended.push((slot, reason));
                }
            }
        }
        for (slot, reason) in ended {
            self.finish(slot, reason);
        }
        stats
    }

    fn drop_cancelled(&mut self) {
        self.waiting.retain(|w| !w.listener.cancelled());
        let gone: Vec<usize> = self
            .order
            .iter()
            .copied()
            .filter(|&s| {
                self.slots[s]
                    .as_ref()
                    .is_some_and(|q| q.listener.cancelled())
            })
            .collect();
        for slot in gone {
            self.release(slot);
        }
    }

    /// Gives waiting requests free slots. A slot is worth taking for its cache when the
    /// prompt keeps at least half of what it holds; otherwise an empty slot, else the least
    /// recently used one, so unrelated prompts do not keep evicting each other's caches.
    fn admit(&mut self) {
        while !self.waiting.is_empty() {
            let prompt = &self.waiting[0].request.prompt;
            let score = |s: usize| {
                let have = self.session.tokens(s);
                let shared = have.iter().zip(prompt).take_while(|(a, b)| a == b).count();
                let hit = shared > 0 && 2 * shared >= have.len();
                (
                    if hit { shared } else { 0 },
                    have.is_empty(),
                    std::cmp::Reverse(self.last_used[s]),
                )
            };
            let free = (0..self.slots.len()).filter(|&s| self.slots[s].is_none());
            let Some(slot) = free.max_by_key(|&s| score(s)) else {
                return;
            };
            let w = self.waiting.pop_front().expect("checked non-empty");
            let reused = self
                .session
                .reuse_prefix(slot, &w.request.prompt)
                .expect("slot is in range");
            let mut sampler = w.sampler;
            for &t in &w.request.prompt {
                sampler.accept(t);
            }
            self.clock += 1;
            self.last_used[slot] = self.clock;
            self.slots[slot] = Some(Seq {
                listener: w.listener,
                sampler,
                stream: self.tokenizer.stream(),
                stops: StopMatcher::new(&w.request.params.stop),
                prompt: w.request.prompt,
                params: w.request.params,
                logprobs: w.request.logprobs,
                prefilled: reused,
                reused,
                next: None,
                generated: 0,
                queued: w.submitted.elapsed(),
                admitted: Instant::now(),
                first_token: None,
            });
            self.order.push_back(slot);
        }
    }

    fn finish(&mut self, slot: usize, reason: StopReason) {
        let Some(mut seq) = self.slots[slot].take() else {
            return;
        };
        self.order.retain(|&s| s != slot);
        if reason == StopReason::Cancelled {
            return;
        }
        if reason != StopReason::StopString {
            let mut tail = seq.stops.push(&seq.stream.finish()).text;
            tail.push_str(&seq.stops.finish());
            if !tail.is_empty() {
                seq.listener.send(SeqEvent::Delta {
                    text: tail,
                    tokens: Vec::new(),
                });
            }
        }
        let now = Instant::now();
        let first = seq.first_token.unwrap_or(now);
        seq.listener.send(SeqEvent::Finished(SeqSummary {
            reason,
            prompt_tokens: seq.prompt.len(),
            reused: seq.reused,
            completion_tokens: seq.generated,
            queued: seq.queued,
            prompt_time: first.duration_since(seq.admitted),
            gen_time: now.duration_since(first),
        }));
    }

    fn fail(&mut self, slot: usize, why: &str) {
        if let Some(mut seq) = self.slots[slot].take() {
            seq.listener.send(SeqEvent::Failed(why.to_string()));
        }
        self.order.retain(|&s| s != slot);
        // What the failed pass left in the cache is unknown.
        let _ = self.session.clear(slot);
    }

    /// Frees a slot whose listener left; its cached tokens stay for prefix reuse.
    fn release(&mut self, slot: usize) {
        self.slots[slot] = None;
        self.order.retain(|&s| s != slot);
    }
}

/// How a sequence gets its next token after a pass.
enum Next<'a> {
    /// Drawn on the device.
    Drawn(u32),
    /// To be sampled from the logits after the sequence's last token (the first slice), with
    /// scratch for their unsampled copy.
    Host(&'a mut [f32], &'a mut [f32]),
}

impl Seq<'_> {
    /// Takes the next token (`next`) and reports it; returns why the sequence ends, if it
    /// does. `room`: the cache can take another token.
    fn advance(&mut self, next: Next, tokenizer: &Tokenizer, room: bool) -> Option<StopReason> {
        if self.params.max_tokens.is_some_and(|m| self.generated >= m) {
            return Some(StopReason::MaxTokens);
        }
        if !room {
            // A token sampled now could not be evaluated: prompt and completion together
            // never exceed the context, the same bound that `submit` applies to `max_tokens`.
            return Some(StopReason::ContextFull);
        }
        let (id, logprob) = match next {
            Next::Drawn(id) => (id, None),
            Next::Host(row, raw) => {
                if self.logprobs.is_some() {
                    // The sampler rewrites the row; log-probabilities are the model's own.
                    raw.copy_from_slice(row);
                }
                let id = self.sampler.sample(row);
                (id, self.logprobs.map(|top| token_logprob(raw, id, top)))
            }
        };
        self.sampler.accept(id);
        if tokenizer.is_eog(id) && !self.params.ignore_eos {
            return Some(StopReason::EndOfGeneration);
        }
        let token = GeneratedToken { id, logprob };
        self.first_token.get_or_insert_with(Instant::now);
        self.generated += 1;
        let out = self.stops.push(&self.stream.push(id));
        if !self.listener.send(SeqEvent::Delta {
            text: out.text,
            tokens: vec![token],
        }) {
            Some(StopReason::Cancelled)
        } else if out.stop.is_some() {
            Some(StopReason::StopString)
        } else if self.params.max_tokens.is_some_and(|m| self.generated >= m) {
            Some(StopReason::MaxTokens)
        } else {
            self.next = Some(id);
            None
        }
    }
}

/// The log-probability of `tok` under the softmax of `raw`, and the `top` most likely tokens
/// (ties to the lower id).
fn token_logprob(raw: &[f32], tok: u32, top: usize) -> TokenLogprob {
    let max = raw
        .iter()
        .copied()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = raw
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| f64::from(l - max).exp())
        .sum();
    let log_norm = f64::from(max) + sum.ln();
    let lp = |l: f32| (f64::from(l) - log_norm) as f32;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (id, &l) in raw.iter().enumerate() {
            if l.is_nan() || (best.len() == top && l <= best[top - 1].1) {
                continue;
            }
            let at = best.partition_point(|&(_, b)| b >= l);
            best.insert(at, (id as u32, l));
            best.truncate(top);
        }
    }
    TokenLogprob {
        logprob: lp(raw[tok as usize]),
        top: best.into_iter().map(|(id, l)| (id, lp(l))).collect(),
    }
}
