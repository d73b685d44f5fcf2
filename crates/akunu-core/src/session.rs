//! Sessions: KV-cache slots over a backend, with prefill, decode and rollback.
//!
//! Plan: the session remembers, per slot, the tokens whose keys and values are in the cache.
//! Evaluating tokens appends them (in chunks of the backend's batch size, each a single forward
//! pass); rollback just forgets a suffix (the cache rows are overwritten by what comes next),
//! which is what prefix reuse and speculative decoding need. Context overflow and bad token ids
//! are refused before any work is done, so a failed call leaves the slot as it was.

use crate::backend::{Backend, Batch, Draw};
use crate::sampling::SamplerParams;
use crate::EngineError;

/// Which logits an evaluation returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None (the tokens only fill the cache).
    None,
    /// The last token's only: what generation needs.
    Last,
}

/// What a [`Session::step_drawing`] gives back.
#[derive(Debug)]
pub struct Drawn<'a> {
    /// Per part that asked for logits, in order: the token drawn on the device, or `None`
    /// where the caller draws from `logits`.
    pub tokens: Vec<Option<u32>>,
    /// The logits of every part that asked for them (as [`Session::step`] returns them) when
    /// some token is left to the caller; empty when the device drew them all.
    pub logits: &'a [f32],
}

/// The draw from output `row` of a slot holding `history`: the slot's last tokens as the
/// penalty window, the next position as the step.
fn draw_after<'a>(row: usize, params: &'a SamplerParams, history: &'a [u32]) -> Draw<'a> {
    Draw {
        row,
        params,
        recent: &history[history.len() - history.len().min(params.penalty_last_n)..],
        step: history.len() as u64,
    }
}

/// What one slot contributes to a [`Session::step`].
#[derive(Clone, Copy, Debug)]
pub struct Part<'a> {
    pub slot: usize,
    pub tokens: &'a [u32],
    /// Return the logits after the last of `tokens`.
    pub logits: bool,
}

pub struct Session<B: Backend> {
    backend: B,
    n_vocab: usize,
    history: Vec<Vec<u32>>,
    tokens: Vec<u32>,
    positions: Vec<u32>,
    slot_ids: Vec<u32>,
    outputs: Vec<u32>,
}

impl<B: Backend> Session<B> {
    pub fn new(backend: B, n_vocab: usize) -> Session<B> {
        let n_slots = backend.n_slots();
        Session {
            backend,
            n_vocab,
            history: vec![Vec::new(); n_slots],
            tokens: Vec::new(),
            positions: Vec::new(),
            slot_ids: Vec::new(),
            outputs: Vec::new(),
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    pub fn n_ctx(&self) -> usize {
        self.backend.n_ctx()
    }

    pub fn n_slots(&self) -> usize {
        self.history.len()
    }

    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// The tokens whose keys and values slot `slot` holds.
    pub fn tokens(&self, slot: usize) -> &[u32] {
        self.history.get(slot).map_or(&[], Vec::as_slice)
    }

    /// Forgets everything after the first `len` tokens of the slot.
    pub fn truncate(&mut self, slot: usize, len: usize) -> Result<(), EngineError> {
        self.check_slot(slot)?;
        self.history[slot].truncate(len);
        Ok(())
    }

    pub fn clear(&mut self, slot: usize) -> Result<(), EngineError> {
        self.truncate(slot, 0)
    }

    /// Keeps the longest prefix of the slot's tokens that `tokens` starts with, and returns its
    /// length: the tokens after it are what still has to be evaluated.
    pub fn reuse_prefix(&mut self, slot: usize, tokens: &[u32]) -> Result<usize, EngineError> {
        self.check_slot(slot)?;
        let have = &self.history[slot];
        let mut n = have.iter().zip(tokens).take_while(|(a, b)| a == b).count();
        // The last prompt token is always evaluated again so its logits are fresh.
        if n == tokens.len() && n > 0 {
            n -= 1;
        }
        self.history[slot].truncate(n);
        Ok(n)
    }

    /// Appends `tokens` to the slot, in passes of at most the backend's batch size. With
    /// [`Logits::Last`], returns the logits after the last token.
    pub fn eval(
        &mut self,
        slot: usize,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<&[f32], EngineError> {
        self.passes(slot, tokens, logits == Logits::Last)?;
        if logits == Logits::Last {
            self.last_output()
        } else {
            Ok(&[])
        }
    }

    /// Appends `tokens` to the slot in passes of at most the backend's batch size, the last
    /// token an output of the last pass if `last`.
    fn passes(&mut self, slot: usize, tokens: &[u32], last: bool) -> Result<(), EngineError> {
        self.check_append(slot, tokens)?;
        if tokens.is_empty() {
            return Err(EngineError::BadBatch("no tokens to evaluate".into()));
        }
        let chunk = self.backend.max_batch().max(1);
        let n_chunks = tokens.len().div_ceil(chunk);
        for (i, part) in tokens.chunks(chunk).enumerate() {
            let outputs = if last && i + 1 == n_chunks {
                part.len() - 1..part.len()
            } else {
                0..0
            };
            self.run(slot, part, outputs)?;
        }
        Ok(())
    }

    /// Appends `tokens` to the slot and calls `each(i, logits)` for every position `i` of
    /// `tokens` (the logits predicting token `i + 1`), in order. Passes hold at most
    /// `max_rows` tokens, which bounds the logits memory (`max_rows * n_vocab` floats).
    pub fn eval_all(
        &mut self,
        slot: usize,
        tokens: &[u32],
        max_rows: usize,
        mut each: impl FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        self.check_append(slot, tokens)?;
        let chunk = self.backend.max_batch().min(max_rows).max(1);
        let n_vocab = self.n_vocab;
        let mut done = 0;
        for part in tokens.chunks(chunk) {
            self.run(slot, part, 0..part.len())?;
            let out = self.last_output()?;
            for (j, row) in out.chunks_exact(n_vocab).enumerate() {
                each(done + j, row);
            }
            done += part.len();
        }
        Ok(())
    }

    /// Greedy chain decode ([`Backend::greedy_chain`]): appends `token` and the first `n - 1`
    /// chosen tokens to the slot and returns all `n` chosen tokens. `None` when the backend
    /// decodes through the host only.
    pub fn greedy_chain(
        &mut self,
        slot: usize,
        token: u32,
        n: usize,
    ) -> Option<Result<Vec<u32>, EngineError>> {
        self.backend.chain_lengths()?;
        Some(self.chain(slot, token, n, |b, pos, _| {
            b.greedy_chain(slot, token, pos, n)
        }))
    }

    /// Sampled chain decode ([`Backend::sampled_chain`]) with `params`: as
    /// [`Session::greedy_chain`], each token drawn on the device. `None` when the backend
    /// cannot draw with these parameters on the device.
    pub fn sampled_chain(
        &mut self,
        slot: usize,
        token: u32,
        n: usize,
        params: &SamplerParams,
    ) -> Option<Result<Vec<u32>, EngineError>> {
        self.backend.chain_lengths()?;
        if !self.backend.samples_on_device(params) {
            return None;
        }
        Some(self.chain(slot, token, n, |b, pos, history| {
            let keep = history.len().min(params.penalty_last_n.saturating_sub(1));
            let mut recent = history[history.len() - keep..].to_vec();
            recent.push(token);
            b.sampled_chain(slot, token, pos, n, params, &recent)
        }))
    }

    /// Checks and runs a chain of `n` tokens fed with `token` (`run` gets the backend, the
    /// position of `token` and the slot's tokens before it), then records its tokens.
    fn chain(
        &mut self,
        slot: usize,
        token: u32,
        n: usize,
        run: impl FnOnce(&mut B, usize, &[u32]) -> Result<Vec<u32>, EngineError>,
    ) -> Result<Vec<u32>, EngineError> {
        self.check_append(slot, &[token])?;
        let pos = self.history[slot].len();
        if n > self.backend.n_ctx().saturating_sub(pos) {
            return Err(EngineError::ContextFull {
                slot,
                have: pos,
                adding: n,
                n_ctx: self.backend.n_ctx(),
            });
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        let out = run(&mut self.backend, pos, &self.history[slot])?;
        if out.len() != n || out.iter().any(|&t| t as usize >= self.n_vocab) {
            return Err(EngineError::Backend(format!(
                "a chain returned {} tokens for {n}",
                out.len()
            )));
        }
        let h = &mut self.history[slot];
        h.push(token);
        h.extend_from_slice(&out[..n - 1]);
        Ok(out)
    }

    /// One token for each of several slots in a single pass (batched decode). Returns the
    /// logits of each, in the order given.
    pub fn decode_many(&mut self, steps: &[(usize, u32)]) -> Result<&[f32], EngineError> {
        let parts: Vec<Part> = steps
            .iter()
            .map(|(slot, tok)| Part {
                slot: *slot,
                tokens: std::slice::from_ref(tok),
                logits: true,
            })
            .collect();
        self.step(&parts)
    }

    /// One mixed pass: each part appends its tokens to its slot (a decode token of one
    /// sequence beside a prompt chunk of another, as continuous batching needs). Returns the
    /// logits after the last token of every part that asks for them, in the order given.
    /// Every part is checked before any work, so a refused step changes nothing.
    pub fn step(&mut self, parts: &[Part]) -> Result<&[f32], EngineError> {
        self.pass(parts)?;
        self.last_output()
    }

    /// The pass of a [`Session::step`], its logits left with the backend.
    fn pass(&mut self, parts: &[Part]) -> Result<(), EngineError> {
        let total: usize = parts.iter().map(|p| p.tokens.len()).sum();
        if parts.is_empty() || total == 0 || total > self.backend.max_batch() {
            return Err(EngineError::BadBatch(format!(
                "{total} tokens in {} parts (1..={} tokens per pass)",
                parts.len(),
                self.backend.max_batch()
            )));
        }
        for (i, part) in parts.iter().enumerate() {
            self.check_append(part.slot, part.tokens)?;
            if part.tokens.is_empty() {
                return Err(EngineError::BadBatch(format!(
                    "slot {}: no tokens to evaluate",
                    part.slot
                )));
            }
            if parts[..i].iter().any(|p| p.slot == part.slot) {
                return Err(EngineError::BadBatch(format!(
                    "slot {} appears twice",
                    part.slot
                )));
            }
        }
        self.tokens.clear();
        self.positions.clear();
        self.slot_ids.clear();
        self.outputs.clear();
        for part in parts {
            let start = self.history[part.slot].len() as u32;
            self.tokens.extend_from_slice(part.tokens);
            self.positions
                .extend(start..start + part.tokens.len() as u32);
            self.slot_ids.resize(self.tokens.len(), part.slot as u32);
            if part.logits {
                self.outputs.push(self.tokens.len() as u32 - 1);
            }
        }
        self.forward()?;
        for part in parts {
            self.history[part.slot].extend_from_slice(part.tokens);
        }
        Ok(())
    }

    /// [`Session::step`] whose parts' next tokens are drawn on the device where `draws` gives
    /// parameters (one entry per part that asks for logits, in order): their logits never
    /// leave the device unless another part's token is left to the caller. Each draw's
    /// penalty window is its slot's last tokens and its step the drawn token's position, as in
    /// [`Session::sampled_chain`]. Refused before any work where the backend cannot draw with
    /// some entry's parameters.
    pub fn step_drawing(
        &mut self,
        parts: &[Part],
        draws: &[Option<&SamplerParams>],
    ) -> Result<Drawn<'_>, EngineError> {
        let asking = parts.iter().filter(|p| p.logits).count();
        if draws.len() != asking {
            return Err(EngineError::BadBatch(format!(
                "{} draws for {asking} parts asking for logits",
                draws.len()
            )));
        }
        if let Some(p) = draws
            .iter()
            .flatten()
            .find(|p| !self.backend.samples_on_device(p))
        {
            return Err(EngineError::BadBatch(format!(
                "the backend cannot draw with {p:?} on the device"
            )));
        }
        self.pass(parts)?;
        let host = draws.iter().any(Option::is_none);
        if host {
            // Read before the draws, which penalise their rows in place.
            self.last_output()?;
        }
        let list: Vec<Draw> = parts
            .iter()
            .filter(|p| p.logits)
            .zip(draws)
            .enumerate()
            .filter_map(|(row, (part, d))| Some(draw_after(row, (*d)?, &self.history[part.slot])))
            .collect();
        let drawn = if list.is_empty() {
            Vec::new()
        } else {
            self.backend.draw(&list)?
        };
        self.check_drawn(&drawn, list.len())?;
        let mut drawn = drawn.into_iter();
        let tokens = draws.iter().map(|d| d.and_then(|_| drawn.next())).collect();
        let logits = if host { self.last_output()? } else { &[] };
        Ok(Drawn { tokens, logits })
    }

    /// [`Session::eval`] of `tokens`, then the next token drawn on the device with `params`
    /// (as [`Session::step_drawing`] draws), the logits left there. `None`, before any work,
    /// where the backend cannot draw with `params` on the device.
    pub fn eval_drawn(
        &mut self,
        slot: usize,
        tokens: &[u32],
        params: &SamplerParams,
    ) -> Option<Result<u32, EngineError>> {
        if !self.backend.samples_on_device(params) {
            return None;
        }
        Some(self.passes(slot, tokens, true).and_then(|()| {
            let draw = draw_after(0, params, &self.history[slot]);
            let drawn = self.backend.draw(&[draw])?;
            self.check_drawn(&drawn, 1)?;
            Ok(drawn[0])
        }))
    }

    /// Refuses a draw that did not give `n` tokens of the vocabulary.
    fn check_drawn(&self, drawn: &[u32], n: usize) -> Result<(), EngineError> {
        if drawn.len() != n || drawn.iter().any(|&t| t as usize >= self.n_vocab) {
            return Err(EngineError::Backend(format!(
                "a draw returned {drawn:?} for {n} tokens"
            )));
        }
        Ok(())
    }

    /// One pass of `part` appended to the slot, with logits for the rows in `outputs`. The
    /// batch buffers are reused, so a decode step allocates nothing here.
    fn run(
        &mut self,
        slot: usize,
        part: &[u32],
        outputs: std::ops::Range<usize>,
    ) -> Result<(), EngineError> {
        let start = self.history[slot].len() as u32;
        self.tokens.clear();
        self.tokens.extend_from_slice(part);
        self.positions.clear();
        self.positions.extend(start..start + part.len() as u32);
        self.slot_ids.clear();
        self.slot_ids.resize(part.len(), slot as u32);
        self.outputs.clear();
        self.outputs
            .extend(outputs.start as u32..outputs.end as u32);
        self.forward()?;
        self.history[slot].extend_from_slice(part);
        Ok(())
    }

    fn forward(&mut self) -> Result<(), EngineError> {
        let batch = Batch {
            tokens: &self.tokens,
            positions: &self.positions,
            slots: &self.slot_ids,
            outputs: &self.outputs,
        };
        self.backend.forward(&batch)?;
        Ok(())
    }

    /// The logits of the last forward pass.
    fn last_output(&mut self) -> Result<&[f32], EngineError> {
        let want = self.outputs.len() * self.n_vocab;
        let out = self.backend.logits()?;
        if out.len() != want {
            return Err(EngineError::Backend(format!(
                "backend returned {} logits, expected {want}",
                out.len()
            )));
        }
        Ok(out)
    }

    fn check_slot(&self, slot: usize) -> Result<(), EngineError> {
        if slot >= self.history.len() {
            return Err(EngineError::BadSlot {
                slot,
                n_slots: self.history.len(),
            });
        }
        Ok(())
    }

    fn check_append(&self, slot: usize, tokens: &[u32]) -> Result<(), EngineError> {
        self.check_slot(slot)?;
        let have = self.history[slot].len();
        let n_ctx = self.backend.n_ctx();
        if have + tokens.len() > n_ctx {
            return Err(EngineError::ContextFull {
                slot,
                have,
                adding: tokens.len(),
                n_ctx,
            });
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= self.n_vocab) {
            return Err(EngineError::BadToken {
                id,
                n_vocab: self.n_vocab,
            });
        }
        Ok(())
    }
}
