//! Token selection on the device: argmax, and the sampler chain of
//! [`akunu_core::sampling`] with a seeded counter-based draw.
//!
//! Plan: decode replays one CUDA graph per token, so the next token is chosen on the device and
//! the host reads tokens back once per chain. Every launch splits each row of logits over a
//! grid of blocks; the last block of a row to finish (a ticket in device memory, reset by that
//! block) reduces the blocks' partials, so the launches allocate and synchronize nothing and
//! replay as they were captured.
//!
//! - [`SampleKernels::argmax`]: the index of the largest logit per row, ties to the lowest
//!   index (NaN never wins; an all-NaN row gives 0), as greedy sampling on the CPU.
//! - [`SampleKernels::sample`]: penalties (in place on the logits, as the CPU does) → top-k →
//!   top-p → min-p → temperature → draw, choosing from exactly the tokens the CPU keeps with
//!   the same probabilities. With `0 < top_k <= FAST_TOP_K` each block selects its slice's
//!   top-k and the last block finishes on the merged lists (one launch). Otherwise (top-k off
//!   or large) two more launches histogram the row to find the bins holding the top-k and
//!   top-p cuts, then draw among the tokens above them while the tokens in them are gathered
//!   and cut exactly; without those launches the last block does the exact path alone
//!   (correct, much slower). The draw is Gumbel-max with Philox noise keyed by the seed and
//!   counted by (token, step), so a seed gives the same tokens on every run, but not the CPU's
//!   tokens.
//! - [`SamplerState`]: per row, the parameters (written once per chain by
//!   [`SamplerState::set_params_at`], or for all of a pass's draws at once by
//!   [`SamplerState::set_rows`]), the step counter and the penalty window, a ring buffer the
//!   sampler appends each chosen token to; so a graph replays the sampler unchanged.
//!   [`SampleKernels::sample_rows`] draws a run of logits rows with a run of state rows.

use std::sync::Arc;

use akunu_core::sampling::SamplerParams;

use crate::compile::ModuleSpec;
use crate::gpu::{Arg, DeviceBuffer, Gpu, Kernel};
use crate::CudaError;

/// Largest top-k served by the fast path; a larger one is still exact, but slower.
pub const FAST_TOP_K: usize = 128;
/// Largest penalty window (`penalty_last_n`) a [`SamplerState`] can hold.
pub const MAX_WINDOW: usize = 4096;

/// Threads per block of `sample_f32` (SAMPLE_THREADS in sample.cu).
const SAMPLE_THREADS: u32 = 512;
/// Most blocks per row of `sample_f32` (MAX_SPLITS in sample.cu); fewer where the rows would
/// not fit one wave.
pub const MAX_SPLITS: usize = 64;
/// Fewest logits per block of `sample_f32` worth a block of their own.
const SAMPLE_SLICE: usize = 2048;
/// Scratch per row (ROW_SCRATCH in sample.cu): the blocks' partials and top-k lists, the exact
/// path's plan (64 bytes), the blocks' draws, its histogram (NB2 = 512 bins of u32 count and
/// u64 mass) and its gathered tokens (CAPG = 4096 keys).
const ROW_SCRATCH: usize =
    MAX_SPLITS * 32 + MAX_SPLITS * FAST_TOP_K * 8 + 64 + MAX_SPLITS * 8 + 512 * 12 + 4096 * 8;
/// Entries of each block's sorted top-k list the last block stages (MERGE_HEAD in sample.cu).
const MERGE_HEAD: usize = 32;
/// Dynamic shared memory `sample_f32` needs besides the penalty window: the last block's
/// staged list heads.
const MERGE_SMEM: usize = MERGE_HEAD * MAX_SPLITS * 8;
/// Dynamic shared memory of `sample_exact_draw`: the gathered tokens (CAPG keys).
const EXACT_DRAW_SMEM: u32 = 4096 * 8;

/// Threads per block of `argmax_f32` (ARGMAX_THREADS).
const ARGMAX_THREADS: u32 = 256;
/// Fewest logits per block of `argmax_f32`.
const ARGMAX_SLICE: usize = 2048;
/// Most blocks per row of `argmax_f32`.
const ARGMAX_MAX_SPLITS: usize = 128;
/// Rows whose argmax may be split over several blocks; more rows get one block each.
const ARGMAX_SPLIT_ROWS: usize = 64;

/// Every kernel module this file compiles.
pub fn modules() -> Vec<ModuleSpec> {
    vec![("sample.cu", Vec::new())]
}

/// Per-row parameters as `sample_f32` reads them (SampleParams in sample.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct DeviceParams {
    temperature: f32,
    top_p: f32,
    min_p_ln: f32,
    repeat_penalty: f32,
    frequency_penalty: f32,
    presence_penalty: f32,
    top_k: u32,
    window: u32,
    penalize: u32,
    seed_lo: u32,
    seed_hi: u32,
    pad: [u32; 5],
}

/// Per-row state that persists across launches (RowState in sample.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct DeviceRowState {
    step_lo: u32,
    step_hi: u32,
    ring_pos: u32,
    ring_len: u32,
    ticket: u32,
    ticket_hist: u32,
    ticket_draw: u32,
    pad: u32,
}

const PARAMS_BYTES: usize = std::mem::size_of::<DeviceParams>();
const STATE_BYTES: usize = std::mem::size_of::<DeviceRowState>();

/// A greedy decode chain's state on the device, which [`SampleKernels::argmax`] advances with
/// the token it chooses: `out[count] = token`, `count += 1`, `positions[0] += 1` (all `u32`), so a
/// captured decode step can be replayed for the next token.
#[derive(Clone, Copy, Debug)]
pub struct Chain {
    pub positions: u64,
    pub out: u64,
    pub count: u64,
}

/// The sampling kernels, resolved once, and the argmax's scratch (partials and tickets).
///
/// The scratch is shared by every argmax launched through this value, which is sound because
/// they all run in order on the GPU's one stream.
pub struct SampleKernels {
    argmax: Kernel,
    sample: Kernel,
    exact_hist: Kernel,
    exact_draw: Kernel,
    argmax_scratch: DeviceBuffer,
    /// Most blocks a row is split over (`ChipConfig::sample_splits`).
    max_splits: usize,
}

/// What [`SamplerState::set_rows`] writes into one row.
#[derive(Clone, Copy, Debug)]
pub struct RowSetup<'a> {
    pub params: &'a SamplerParams,
    /// The tokens the penalty window starts with (its last `penalty_last_n` are kept).
    pub history: &'a [u32],
    /// The number of the row's next draw.
    pub step: u64,
}

/// Parameters, step counters, penalty windows and scratch for `n_rows` sequences sampled
/// together; row `r` samples row `r` of the logits.
pub struct SamplerState {
    gpu: Arc<Gpu>,
    n_rows: usize,
    window: usize,
    /// Each row's temperature and top-k, to tell which path it takes.
    modes: Vec<(f32, usize)>,
    params: DeviceBuffer,
    states: DeviceBuffer,
    rings: DeviceBuffer,
    scratch: DeviceBuffer,
}

fn check_shape(m: usize, n_vocab: usize) -> Result<u32, CudaError> {
    if n_vocab == 0 {
        return Err(CudaError::Bounds(
            "sampling: the vocabulary is empty".into(),
        ));
    }
    let n = u32::try_from(n_vocab).map_err(|_| {
        CudaError::Unsupported(format!("sampling: {n_vocab} tokens do not fit 32-bit ids"))
    })?;
    if m > u16::MAX as usize || m.checked_mul(n_vocab).is_none() {
        return Err(CudaError::Unsupported(format!(
            "sampling: {m} rows of {n_vocab} logits"
        )));
    }
    Ok(n)
}

/// Blocks per row and logits per block (a multiple of 4, so every block's slice starts on a
/// 16-byte boundary of an aligned row) for `n` logits split into at most `max_splits` slices of
/// at least `slice`.
fn split(n: usize, slice: usize, max_splits: usize) -> (u32, u32) {
    let want = n.div_ceil(slice).clamp(1, max_splits);
    let per_block = n.div_ceil(want).next_multiple_of(4);
    (n.div_ceil(per_block) as u32, per_block as u32)
}

impl SampleKernels {
    pub fn new(gpu: &Arc<Gpu>) -> Result<SampleKernels, CudaError> {
        let argmax = gpu.kernel("sample.cu", "argmax_f32", &[])?;
        let sample = gpu.kernel("sample.cu", "sample_f32", &[])?;
        let exact_hist = gpu.kernel("sample.cu", "sample_exact_hist", &[])?;
        let exact_draw = gpu.kernel("sample.cu", "sample_exact_draw", &[])?;
        let argmax_scratch = gpu.alloc(ARGMAX_SPLIT_ROWS * (ARGMAX_MAX_SPLITS * 8 + 4))?;
        Ok(SampleKernels {
            argmax,
            sample,
            exact_hist,
            exact_draw,
            argmax_scratch,
            max_splits: gpu.chip.sample_splits,
        })
    }

    /// The same kernels splitting a row over at most `n` blocks (1 to 64), for comparing
    /// splits in one process.
    pub fn with_max_splits(mut self, n: usize) -> SampleKernels {
        self.max_splits = n.clamp(1, MAX_SPLITS);
        self
    }

    /// Writes to `out` (`u32[m]`) the index of the largest of each row of `logits`
    /// (`f32[m][n_vocab]`); ties go to the lowest index, NaN is skipped, and a row of NaN gives 0.
    /// With `chain` (one row) the token is also appended to the chain ([`Chain`]).
    pub fn argmax(
        &self,
        gpu: &Gpu,
        logits: u64,
        m: usize,
        n_vocab: usize,
        out: u64,
        chain: Option<&Chain>,
    ) -> Result<(), CudaError> {
        let n = check_shape(m, n_vocab)?;
        if m == 0 {
            return Ok(());
        }
        let c = chain_args(m, chain)?;
        let (splits, per_block) = if m <= ARGMAX_SPLIT_ROWS {
            split(n_vocab, ARGMAX_SLICE, ARGMAX_MAX_SPLITS)
        } else {
            (1, n_vocab.next_multiple_of(4) as u32)
        };
        let parts = ARGMAX_SPLIT_ROWS * ARGMAX_MAX_SPLITS;
        let part_v = self.argmax_scratch.ptr();
        let part_i = self.argmax_scratch.at(parts * 4);
        let tickets = self.argmax_scratch.at(parts * 8);
        gpu.launch(
            &self.argmax,
            (splits, m as u32, 1),
            (ARGMAX_THREADS, 1, 1),
            0,
            &[
                Arg::Ptr(logits),
                Arg::U32(n),
                Arg::U32(per_block),
                Arg::Ptr(out),
                Arg::Ptr(part_v),
                Arg::Ptr(part_i),
                Arg::U32(ARGMAX_MAX_SPLITS as u32),
                Arg::Ptr(tickets),
                Arg::Ptr(c.positions),
                Arg::Ptr(c.out),
                Arg::Ptr(c.count),
            ],
        )
    }

    /// Draws one token per row of `logits` (`f32[m][n_vocab]`, penalised in place) into
    /// `out_tokens` (`u32[m]`) with row `r`'s parameters and state in `state`, appends it to the
    /// row's penalty window and advances the row's step. Rows never configured with
    /// [`SamplerState::set_params`] sample greedily.
    ///
    /// The exact path's two extra launches are made when a row needs them
    /// ([`SamplerState::needs_exact_launches`]), so a graph captured from this call keeps the
    /// launches of the parameters at capture; see [`SampleKernels::sample_with`] to fix them.
    pub fn sample(
        &self,
        gpu: &Gpu,
        logits: u64,
        m: usize,
        n_vocab: usize,
        state: &SamplerState,
        out_tokens: u64,
    ) -> Result<(), CudaError> {
        self.sample_rows(gpu, logits, m, n_vocab, state, 0, out_tokens)
    }

    /// [`SampleKernels::sample`] with the exact path's launches made or not, whatever the
    /// rows' parameters: any choice samples correctly, so a graph captured with
    /// `exact_launches` serves any later parameters. Without them a row on the exact path is
    /// sampled by one block (about 0.5 ms for 262144 tokens); with them a row on the fast path
    /// pays for two launches that return at once.
    #[allow(clippy::too_many_arguments)]
    pub fn sample_with(
        &self,
        gpu: &Gpu,
        logits: u64,
        m: usize,
        n_vocab: usize,
        state: &SamplerState,
        out_tokens: u64,
        exact_launches: bool,
    ) -> Result<(), CudaError> {
        self.launch_sample(
            gpu,
            logits,
            m,
            n_vocab,
            (state, 0),
            out_tokens,
            exact_launches,
            None,
        )
    }

    /// [`SampleKernels::sample`] of `m` rows of `logits` with the state's rows from `first`
    /// (logits row `r` with state row `first + r`), the tokens to `out_tokens` (`u32[m]`):
    /// rows drawn together need not be the first rows of a state.
    #[allow(clippy::too_many_arguments)]
    pub fn sample_rows(
        &self,
        gpu: &Gpu,
        logits: u64,
        m: usize,
        n_vocab: usize,
        state: &SamplerState,
        first: usize,
        out_tokens: u64,
    ) -> Result<(), CudaError> {
        let exact = state.needs_exact_rows(first, m, n_vocab);
        self.launch_sample(
            gpu,
            logits,
            m,
            n_vocab,
            (state, first),
            out_tokens,
            exact,
            None,
        )
    }

    /// [`SampleKernels::sample_with`] for one row in a decode chain, as
    /// [`SampleKernels::argmax`] with a [`Chain`]: the token also goes to `chain.out[count]`,
    /// `count` and `positions[0]` move on, so a captured decode step samples the next token
    /// when replayed.
    #[allow(clippy::too_many_arguments)]
    pub fn sample_chain(
        &self,
        gpu: &Gpu,
        logits: u64,
        n_vocab: usize,
        state: &SamplerState,
        out_token: u64,
        exact_launches: bool,
        chain: &Chain,
    ) -> Result<(), CudaError> {
        self.launch_sample(
            gpu,
            logits,
            1,
            n_vocab,
            (state, 0),
            out_token,
            exact_launches,
            Some(chain),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn launch_sample(
        &self,
        gpu: &Gpu,
        logits: u64,
        m: usize,
        n_vocab: usize,
        (state, first): (&SamplerState, usize),
        out_tokens: u64,
        exact_launches: bool,
        chain: Option<&Chain>,
    ) -> Result<(), CudaError> {
        let n = check_shape(m, n_vocab)?;
        let c = chain_args(m, chain)?;
        if first + m > state.n_rows {
            return Err(CudaError::Bounds(format!(
                "sampling {m} rows from row {first} of a state for {}",
                state.n_rows
            )));
        }
        if m == 0 {
            return Ok(());
        }
        let params = state.params.at(first * PARAMS_BYTES);
        let states = state.states.at(first * STATE_BYTES);
        let rings = state.rings.at(first * state.window * 4);
        let scratch = state.scratch.at(first * ROW_SCRATCH);
        // One wave for all the rows: more blocks than SMs wait for a second wave, which costs
        // more than fewer, longer slices (defaults, 16 rows of 151,936 logits on an H100:
        // 67.4 µs at 64 splits a row, 31.2 at 8; docs/perf/2026-11-24-batched-draws.md).
        let cap = self.max_splits.min((gpu.chip.sm_count / m).max(1));
        let (splits, per_block) = split(n_vocab, SAMPLE_SLICE, cap);
        // The CPU's tail bound, ln(V) + 17, in the same f32 arithmetic.
        let ln_n17 = (n_vocab as f32).ln() + 17.0;
        let grid = (splits, m as u32, 1);
        let block = (SAMPLE_THREADS, 1, 1);
        gpu.launch(
            &self.sample,
            grid,
            block,
            (state.window * 4).max(MERGE_SMEM) as u32,
            &[
                Arg::Ptr(logits),
                Arg::U32(n),
                Arg::U32(per_block),
                Arg::F32(ln_n17),
                Arg::Ptr(params),
                Arg::Ptr(states),
                Arg::Ptr(rings),
                Arg::U32(state.window as u32),
                Arg::Ptr(scratch),
                Arg::Ptr(out_tokens),
                Arg::U32(u32::from(exact_launches)),
                Arg::Ptr(c.positions),
                Arg::Ptr(c.out),
                Arg::Ptr(c.count),
            ],
        )?;
        if !exact_launches {
            return Ok(());
        }
        gpu.launch(
            &self.exact_hist,
            grid,
            block,
            0,
            &[
                Arg::Ptr(logits),
                Arg::U32(n),
                Arg::U32(per_block),
                Arg::F32(ln_n17),
                Arg::Ptr(params),
                Arg::Ptr(states),
                Arg::Ptr(scratch),
            ],
        )?;
        gpu.launch(
            &self.exact_draw,
            grid,
            block,
            EXACT_DRAW_SMEM,
            &[
                Arg::Ptr(logits),
                Arg::U32(n),
                Arg::U32(per_block),
                Arg::F32(ln_n17),
                Arg::Ptr(params),
                Arg::Ptr(states),
                Arg::Ptr(rings),
                Arg::U32(state.window as u32),
                Arg::Ptr(scratch),
                Arg::Ptr(out_tokens),
                Arg::Ptr(c.positions),
                Arg::Ptr(c.out),
                Arg::Ptr(c.count),
            ],
        )
    }
}

/// A chain's pointers for a launch of `m` rows (nulls without one); a chain takes one row and
/// three non-null pointers.
fn chain_args(m: usize, chain: Option<&Chain>) -> Result<Chain, CudaError> {
    match chain {
        Some(c) if m != 1 || c.positions == 0 || c.out == 0 || c.count == 0 => {
            Err(CudaError::Bounds(format!(
                "a chain's token choice over {m} rows with {c:?}: needs one row and non-null \
                 pointers"
            )))
        }
        Some(c) => Ok(*c),
        None => Ok(Chain {
            positions: 0,
            out: 0,
            count: 0,
        }),
    }
}

impl SamplerState {
    /// State for `n_rows` sequences with penalty windows of up to `window` tokens
    /// (at most [`MAX_WINDOW`]). Every row starts greedy, without penalties.
    pub fn new(gpu: &Arc<Gpu>, n_rows: usize, window: usize) -> Result<SamplerState, CudaError> {
        if n_rows == 0 || n_rows > u16::MAX as usize {
            return Err(CudaError::Unsupported(format!(
                "a sampler state for {n_rows} rows"
            )));
        }
        if window > MAX_WINDOW {
            return Err(CudaError::Unsupported(format!(
                "a penalty window of {window} tokens (at most {MAX_WINDOW})"
            )));
        }
        Ok(SamplerState {
            gpu: gpu.clone(),
            n_rows,
            window,
            modes: vec![(0.0, 0); n_rows],
            params: gpu.alloc(n_rows * PARAMS_BYTES)?,
            states: gpu.alloc(n_rows * STATE_BYTES)?,
            rings: gpu.alloc(n_rows * window * 4)?,
            scratch: gpu.alloc(n_rows * ROW_SCRATCH)?,
        })
    }

    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// The largest `penalty_last_n` the rows accept.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Whether any of the first `m` rows, sampled over `n_vocab` tokens, takes the exact path
    /// (a temperature above 0 with top-k off, at least `n_vocab`, or above [`FAST_TOP_K`]),
    /// which [`SampleKernels::sample`] then serves with two more launches.
    pub fn needs_exact_launches(&self, m: usize, n_vocab: usize) -> bool {
        self.needs_exact_rows(0, m, n_vocab)
    }

    /// [`SamplerState::needs_exact_launches`] for rows `first..first + m`.
    pub fn needs_exact_rows(&self, first: usize, m: usize, n_vocab: usize) -> bool {
        let mut rows = self.modes.iter().skip(first).take(m);
        rows.any(|&(temperature, top_k)| {
            temperature > 0.0 && !(top_k > 0 && top_k < n_vocab && top_k <= FAST_TOP_K)
        })
    }

    /// Starts a generation on `row`: its parameters (seed included), step 0, and a penalty
    /// window holding the last `penalty_last_n` tokens of `history` (the prompt, as the CPU
    /// sampler is fed with `accept`). Waits for the GPU's queued work first.
    pub fn set_params(
        &mut self,
        row: usize,
        params: &SamplerParams,
        history: &[u32],
    ) -> Result<(), CudaError> {
        self.set_params_at(row, params, history, 0)
    }

    /// [`SamplerState::set_params`] at `step`, which numbers the row's draws (a token's noise
    /// depends on the seed, its id and the step; each draw moves it on by one). A decode chain
    /// starts at the position of the token it draws first, so a seed gives the same tokens
    /// however a generation is cut into chains.
    pub fn set_params_at(
        &mut self,
        row: usize,
        params: &SamplerParams,
        history: &[u32],
        step: u64,
    ) -> Result<(), CudaError> {
        self.set_rows(
            row,
            &[RowSetup {
                params,
                history,
                step,
            }],
        )
    }

    /// [`SamplerState::set_params_at`] for rows `first..first + rows.len()`, in one write of
    /// the parameters and one of the steps (and one per penalised row's window).
    pub fn set_rows(&mut self, first: usize, rows: &[RowSetup]) -> Result<(), CudaError> {
        if first + rows.len() > self.n_rows {
            return Err(CudaError::Bounds(format!(
                "sampler rows {first}..{} of {}",
                first + rows.len(),
                self.n_rows
            )));
        }
        let mut dps = Vec::with_capacity(rows.len());
        let mut sts = Vec::with_capacity(rows.len());
        let mut windows = Vec::new();
        for (i, r) in rows.iter().enumerate() {
            let (dp, st, kept) = self.encode(r.params, r.history, r.step)?;
            dps.push(dp);
            sts.push(st);
            if !kept.is_empty() {
                windows.push((first + i, kept));
            }
        }
        self.gpu.write(&self.params, first * PARAMS_BYTES, &dps)?;
        for (row, kept) in windows {
            self.gpu.write(&self.rings, row * self.window * 4, kept)?;
        }
        self.gpu.write(&self.states, first * STATE_BYTES, &sts)?;
        for (i, r) in rows.iter().enumerate() {
            self.modes[first + i] = (r.params.temperature, r.params.top_k);
        }
        Ok(())
    }

    /// A row's parameters and state on the device for `params` at `step`, and the penalty
    /// window to write into its ring (empty where no penalty applies: the kernels then never
    /// read it).
    fn encode<'h>(
        &self,
        params: &SamplerParams,
        history: &'h [u32],
        step: u64,
    ) -> Result<(DeviceParams, DeviceRowState, &'h [u32]), CudaError> {
        params
            .validate()
            .map_err(|e| CudaError::Unsupported(e.to_string()))?;
        if params.penalty_last_n > self.window {
            return Err(CudaError::Unsupported(format!(
                "penalty_last_n = {} is over this sampler's window of {}",
                params.penalty_last_n, self.window
            )));
        }
        let window = params.penalty_last_n;
        let penalize = window > 0
            && !(params.repeat_penalty == 1.0
                && params.frequency_penalty == 0.0
                && params.presence_penalty == 0.0);
        let dp = DeviceParams {
            temperature: params.temperature,
            top_p: params.top_p,
            min_p_ln: if params.min_p > 0.0 {
                params.min_p.ln()
            } else {
                f32::NEG_INFINITY
            },
            repeat_penalty: params.repeat_penalty,
            frequency_penalty: params.frequency_penalty,
            presence_penalty: params.presence_penalty,
            top_k: u32::try_from(params.top_k).unwrap_or(u32::MAX),
            window: window as u32,
            penalize: u32::from(penalize),
            seed_lo: params.seed as u32,
            seed_hi: (params.seed >> 32) as u32,
            pad: [0; 5],
        };
        let kept = &history[history.len() - history.len().min(window)..];
        let st = DeviceRowState {
            step_lo: step as u32,
            step_hi: (step >> 32) as u32,
            ring_pos: if window > 0 {
                (kept.len() % window) as u32
            } else {
                0
            },
            ring_len: kept.len() as u32,
            ticket: 0,
            ticket_hist: 0,
            ticket_draw: 0,
            pad: 0,
        };
        Ok((dp, st, if penalize { kept } else { &[] }))
    }
}
