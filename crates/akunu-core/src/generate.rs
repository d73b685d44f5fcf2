//! The decode loop: prompt in, streamed text out.
//!
//! Plan: keep whatever prefix of the prompt the slot already holds (chat turns and repeated
//! prompts skip their shared prefix), evaluate the rest in batches, then alternate sampling
//! and single-token passes. Each token goes through the streaming detokenizer (complete UTF-8
//! only) and the stop-string matcher (which holds back text that might begin a stop string)
//! before the caller sees it. Generation ends at an end-of-generation token of the model, a
//! stop string, the token limit, a full context, or when the caller asks.

use std::time::{Duration, Instant};

use akunu_tokenizer::Tokenizer;

use crate::backend::Backend;
use crate::sampling::{Sampler, SamplerParams};
use crate::session::{Logits, Session};
use crate::stop::StopMatcher;
use crate::EngineError;

#[derive(Clone, Debug)]
pub struct GenerateParams {
    /// Most tokens to generate; `None` runs until another reason stops generation.
    pub max_tokens: Option<usize>,
    pub sampler: SamplerParams,
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens (benchmarks, debugging).
    pub ignore_eos: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    EndOfGeneration,
    StopString,
    MaxTokens,
    ContextFull,
    Cancelled,
}

#[derive(Clone, Debug)]
pub struct GenerateOutput {
    pub tokens: Vec<u32>,
    pub reason: StopReason,
    /// Prompt tokens taken from the slot's cache instead of being evaluated.
    pub reused: usize,
    pub prompt_tokens: usize,
    pub prompt_time: Duration,
    pub gen_time: Duration,
}

impl GenerateOutput {
    /// Evaluated prompt tokens per second.
    pub fn prompt_tps(&self) -> f64 {
        rate(self.prompt_tokens - self.reused, self.prompt_time)
    }

    /// Generated tokens per second (the first token's sampling counts as generation).
    pub fn gen_tps(&self) -> f64 {
        rate(self.tokens.len(), self.gen_time)
    }
}

fn rate(n: usize, t: Duration) -> f64 {
    if t.is_zero() {
        0.0
    } else {
        n as f64 / t.as_secs_f64()
    }
}

/// Continues `prompt` (the slot's whole token sequence, prefix included) and calls `on_text`
/// with each piece of text as it becomes final; `on_text` returns `false` to stop.
pub fn generate<B: Backend>(
    session: &mut Session<B>,
    slot: usize,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    params: &GenerateParams,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<GenerateOutput, EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::BadBatch("the prompt has no tokens".into()));
    }
    let mut sampler = Sampler::new(params.sampler.clone(), session.n_vocab())?;
    let start = Instant::now();
    let reused = session.reuse_prefix(slot, prompt)?;
    for &t in prompt {
        sampler.accept(t);
    }
    // Decode can choose tokens on the device, a chain of them per host round trip: by argmax
    // for greedy decode without penalties, else by the device's sampler where the backend has
    // one for these parameters. `pending` holds the chosen tokens not yet handed out. They
    // are already in the cache except the last, so the slot is trimmed back if generation
    // stops early. The token after the prompt is drawn on the device too where it can be.
    let argmax = sampler.is_greedy() && params.sampler.penalties_off();
    let chain = session
        .backend()
        .chain_lengths()
        .filter(|_| argmax || session.backend().samples_on_device(&params.sampler));
    let mut chains = 0usize;
    let mut pending = std::collections::VecDeque::new();
    let mut logits = Vec::new();
    // Not with `max_tokens` 0: the loop would stop before taking the drawn token, and the trim
    // at the end would drop a prompt token for it.
    let draw_first = chain.is_some() && params.max_tokens != Some(0);
    let first = draw_first
        .then(|| session.eval_drawn(slot, &prompt[reused..], &params.sampler))
        .flatten();
    match first {
        Some(first) => pending.push_back(first?),
        None => {
            logits = session
                .eval(slot, &prompt[reused..], Logits::Last)?
                .to_vec()
        }
    }
    let prompt_time = start.elapsed();

    let gen_start = Instant::now();
    let mut stream = tokenizer.stream();
    let mut stops = StopMatcher::new(&params.stop);
    let mut tokens = Vec::new();
    let reason = loop {
        if params.max_tokens.is_some_and(|m| tokens.len() >= m) {
            break StopReason::MaxTokens;
        }
        let tok = match pending.pop_front() {
            Some(t) => t,
            None => sampler.sample(&mut logits),
        };
        sampler.accept(tok);
        if tokenizer.is_eog(tok) && !params.ignore_eos {
            break StopReason::EndOfGeneration;
        }
        tokens.push(tok);
        let out = stops.push(&stream.push(tok));
        if !out.text.is_empty() && !on_text(&out.text) {
            break StopReason::Cancelled;
        }
        if out.stopped() {
            break StopReason::StopString;
        }
        let held = session.tokens(slot).len() - pending.len();
        if held >= session.n_ctx() {
            break StopReason::ContextFull;
        }
        if !pending.is_empty() {
            continue;
        }
        let want = match chain {
            Some((first, later)) => {
                let len = if chains == 0 { first } else { later };
                let left = params.max_tokens.map_or(usize::MAX, |m| m - tokens.len());
                len.min(left).min(session.n_ctx() - held)
            }
            None => 0,
        };
        if want > 0 {
            let next = if argmax {
                session.greedy_chain(slot, tok, want)
            } else {
                session.sampled_chain(slot, tok, want, &params.sampler)
            };
            if let Some(next) = next {
                pending.extend(next?);
                chains += 1;
                continue;
            }
        } else if chain.is_some() {
            // No tokens left to generate: the next turn stops without a pass.
            continue;
        }
        let next = session.eval(slot, &[tok], Logits::Last)?;
        logits.clear();
        logits.extend_from_slice(next);
    };
    if !pending.is_empty() {
        let keep = session.tokens(slot).len() - pending.len();
        session.truncate(slot, keep)?;
    }
    if !matches!(reason, StopReason::StopString | StopReason::Cancelled) {
        let mut tail = stops.push(&stream.finish()).text;
        tail.push_str(&stops.finish());
        if !tail.is_empty() {
            on_text(&tail);
        }
    }
    Ok(GenerateOutput {
        tokens,
        reason,
        reused,
        prompt_tokens: prompt.len(),
        prompt_time,
        gen_time: gen_start.elapsed(),
    })
}
