//! What a backend provides: execute the plan for a batch of tokens against its KV cache.
//!
//! A backend owns its device memory (weights in the form it computes with, activation
//! scratch, the KV cache of every slot) and lowers the plan once when it is created. The
//! [`crate::Session`] owns the bookkeeping: which positions of which slot hold valid keys and
//! values. A batch never asks for a position whose predecessors in the same slot are not
//! already in the cache or earlier in the same batch, so rollback is only a matter of the
//! session forgetting positions; the backend keeps no per-slot lengths.

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
    /// The logits of the last pass's `outputs` rows, `outputs.len() * n_vocab` values.
    fn logits(&self) -> &[f32];
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
}
