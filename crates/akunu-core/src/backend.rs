//! What a backend provides: execute the plan for a batch of tokens against its KV cache.
//!
//! A backend owns its device memory (weights in the form it computes with, activation
//! scratch, the KV cache of every slot) and lowers the plan once when it is created. The
//! [`crate::Session`] owns the bookkeeping: which positions of which slot hold valid keys and
//! values. A batch never asks for a position whose predecessors in the same slot are not
//! already in the cache or earlier in the same batch, so rollback is only a matter of the
//! session forgetting positions; the backend keeps no per-slot lengths.

use crate::sampling::SamplerParams;
use crate::EngineError;

/// One forward pass: `tokens[i]` goes to `positions[i]` of slot `slots[i]`. `outputs` lists,
/// in ascending order, the rows whose logits are wanted.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    pub tokens: &'a [u32],
    pub positions: &'a [u32],
    pub slots: &'a [u32],
    pub outputs: &'a [u32],
}

/// A token to draw on the device from one output row of the last pass ([`Backend::draw`]).
#[derive(Clone, Copy, Debug)]
pub struct Draw<'a> {
    /// The row's index in the pass's `outputs`.
    pub row: usize,
    pub params: &'a SamplerParams,
    /// The tokens the penalty window sees, oldest first (the row's slot, up to its last token).
    pub recent: &'a [u32],
    /// The drawn token's position in its slot, which numbers the draw as a chain numbers its
    /// draws ([`Backend::sampled_chain`]), so a seed gives the same tokens either way.
    pub step: u64,
}

impl Batch<'_> {
    /// Checks the batch against a backend's sizes: 1..=`max_batch` tokens with a position and
    /// slot each, ids inside the vocabulary, slots and positions inside the cache, outputs
    /// ascending rows of the batch. Backends call it before any work.
    pub fn check(
        &self,
        max_batch: usize,
        n_vocab: usize,
        n_slots: usize,
        n_ctx: usize,
    ) -> Result<(), EngineError> {
        let n = self.tokens.len();
        if n == 0 || n > max_batch {
            return Err(EngineError::BadBatch(format!(
                "{n} tokens (1..={max_batch} per pass)"
            )));
        }
        if self.positions.len() != n || self.slots.len() != n {
            return Err(EngineError::BadBatch(
                "tokens, positions and slots differ in length".into(),
            ));
        }
        for i in 0..n {
            if self.tokens[i] as usize >= n_vocab {
                return Err(EngineError::BadToken {
                    id: self.tokens[i],
                    n_vocab,
                });
            }
            if self.slots[i] as usize >= n_slots {
                return Err(EngineError::BadSlot {
                    slot: self.slots[i] as usize,
                    n_slots,
                });
            }
            if self.positions[i] as usize >= n_ctx {
                return Err(EngineError::BadBatch(format!(
                    "position {} is outside the context of {}",
                    self.positions[i], n_ctx
                )));
            }
        }
        if self.outputs.windows(2).any(|w| w[0] >= w[1])
            || self.outputs.last().is_some_and(|&o| o as usize >= n)
        {
            return Err(EngineError::BadBatch(
                "outputs must be ascending row indices of the batch".into(),
            ));
        }
        Ok(())
    }
}

pub trait Backend {
    /// One line for logs and statistics (`"CPU, 2 threads, avx512vnni"`).
    fn describe(&self) -> String;
    /// Most tokens one [`Backend::forward`] accepts.
    fn max_batch(&self) -> usize;
    /// Positions per slot.
    fn n_ctx(&self) -> usize;
    fn n_slots(&self) -> usize;
    /// Runs the plan for `batch`.
    fn forward(&mut self, batch: &Batch) -> Result<(), EngineError>;
    /// The logits of the last pass's `outputs` rows, `outputs.len() * n_vocab` values (a
    /// device backend reads them back on the first call after the pass).
    fn logits(&mut self) -> Result<&[f32], EngineError>;
    /// Token counts of greedy chains, `(first, later)`, for backends that decode on the device
    /// ([`Backend::greedy_chain`]); `None` when every token goes through the host.
    fn chain_lengths(&self) -> Option<(usize, usize)> {
        None
    }
    /// Greedy chain decode in one slot: feeds `token` at `pos`, then each argmax at the next
    /// position, for `n` passes, choosing tokens on the device. Returns the `n` chosen tokens
    /// (the last is not yet in the cache). Only called when [`Backend::chain_lengths`] is
    /// `Some` and `pos + n <= n_ctx`.
    fn greedy_chain(
        &mut self,
        slot: usize,
        token: u32,
        pos: usize,
        n: usize,
    ) -> Result<Vec<u32>, EngineError> {
        let _ = (slot, token, pos, n);
        Err(EngineError::Backend(
            "this backend has no device-side decode".into(),
        ))
    }
    /// Whether [`Backend::sampled_chain`] can draw with `params` on the device (then chains
    /// also serve sampled decode, and greedy decode with penalties).
    fn samples_on_device(&self, params: &SamplerParams) -> bool {
        let _ = params;
        false
    }
    /// Sampled chain decode in one slot: as [`Backend::greedy_chain`], each token drawn on the
    /// device by the chain of [`crate::sampling::Sampler`] (penalties, top-k, top-p, min-p,
    /// temperature) with the device's own seeded draw: a seed gives the same tokens on every
    /// run of the backend, however the generation is cut into chains, but not the CPU
    /// sampler's tokens. `recent` ends with `token`, after the slot's tokens the penalty
    /// window sees. Only called when [`Backend::samples_on_device`] holds for `params`.
    fn sampled_chain(
        &mut self,
        slot: usize,
        token: u32,
        pos: usize,
        n: usize,
        params: &SamplerParams,
        recent: &[u32],
    ) -> Result<Vec<u32>, EngineError> {
        let _ = (slot, token, pos, n, params, recent);
        Err(EngineError::Backend(
            "this backend has no device-side sampling".into(),
        ))
    }
    /// Draws the next token of each listed output row of the last pass on the device, with
    /// the device's seeded draw as in [`Backend::sampled_chain`], without the logits leaving
    /// the device; `draws` name distinct rows in ascending order. The drawn rows' logits are
    /// penalised in place: [`Backend::logits`] gives them only if read before. Only called
    /// when [`Backend::samples_on_device`] holds for every draw's parameters.
    fn draw(&mut self, draws: &[Draw]) -> Result<Vec<u32>, EngineError> {
        let _ = draws;
        Err(EngineError::Backend(
            "this backend has no device-side sampling".into(),
        ))
    }
}

/// A KV cache as a backend's errors name it: "the KV cache (N positions × S slots)", without
/// the slots for one.
pub fn kv_cache_name(n_ctx: usize, n_slots: usize) -> String {
    if n_slots > 1 {
        format!("the KV cache ({n_ctx} positions × {n_slots} slots)")
    } else {
        format!("the KV cache ({n_ctx} positions)")
    }
}

/// What to lower when a KV cache of `n_slots` slots does not fit.
pub fn kv_cache_advice(n_slots: usize) -> &'static str {
    if n_slots > 1 {
        "lower the context size or the slots"
    } else {
        "lower the context size"
    }
}
