//! The per-layer ops between the matrix products: RMSNorm, the fused residual add + RMSNorm,
//! the fused QK-norm + RoPE + KV-cache store, attention and the element-wise ops.
//!
//! Plan: [`LayerKernels::new`] resolves every kernel once and allocates the attention scratch
//! (partials of split attention), so a launch only validates its arguments and enqueues: no
//! compile, lookup, allocation or synchronization, as the decode step is captured into a
//! graph. Every function takes raw device pointers plus sizes and computes what the CPU
//! backend's op computes (`akunu_cpu::ops`), in f32:
//!
//! - `RmsNorm` → [`LayerKernels::rms_norm`] (a warp per small group, a block per large one);
//! - `[RmsNorm(Out)?, AddResidual, RmsNorm(Residual → Normed)]` → [`LayerKernels::add_rms_norm`],
//!   which in decode also writes Normed in the GEMVs' int8 form;
//! - `[RmsNorm(Q), RmsNorm(K)]?, Rope(Q), Rope(K), StoreKv` → [`LayerKernels::qk_rope_store`],
//!   which also rounds Q to f16 precision as attention reads it (or writes it as f16 for
//!   prefill attention);
//! - `Attention` → [`LayerKernels::attention`]: one block per (token, KV head, ≤ 8 query heads),
//!   online softmax over K/V tiles in shared memory; when there are too few such blocks to fill
//!   the GPU (decode), each query's positions are split over more blocks whose partials a
//!   second kernel merges. The split count is fixed per launch shape, and each split finds its
//!   slice from the token's position on the device, so a captured graph stays valid as the
//!   context grows. The partials live in one scratch buffer per [`LayerKernels`], so its
//!   attention launches must stay ordered on one stream (the [`Gpu`]'s).
//! - `GatedActivation`, `Logits`' soft-cap, `AddResidual`, `SelectOutputs` →
//!   [`LayerKernels::gated_act`], [`LayerKernels::softcap`], [`LayerKernels::add`],
//!   [`LayerKernels::gather_rows`].

use std::sync::Arc;

use akunu_core::{Activation, RopeStyle};

use crate::compile::ModuleSpec;
use crate::gpu::{Arg, DeviceBuffer, Gpu, Kernel};
use crate::CudaError;

/// Largest head size the RoPE and attention kernels take (their shared-memory tiles).
pub const MAX_HEAD_DIM: usize = 256;
/// Groups up to this size get a warp each in [`LayerKernels::rms_norm`]; larger, a block.
const NORM_WARP_MAX_GROUP: usize = 512;
const NORM_WARP_THREADS: u32 = 128;
const ROPE_THREADS: u32 = 256;
/// Heads of one token per RoPE block: a warp each.
const ROPE_HEADS_PER_BLOCK: usize = ROPE_THREADS as usize / 32;
const ELEMENTWISE_THREADS: u32 = 256;
// These match the `ATT_*` defines of attention.cu.
const ATT_THREADS: u32 = 128;
const ATT_TILE: usize = 64;
const ATT_GROUP: usize = 8;
const ATT_MAX_SPLITS: usize = 256;
const ATT_SPLIT_ALIGN: usize = 32;
/// Bytes of the split-attention partials; shapes that would need more use fewer splits.
const ATT_SCRATCH_BYTES: usize = 16 << 20;

/// Every kernel module (file, defines) this module can ask [`Gpu::kernel`] for.
pub fn modules() -> Vec<ModuleSpec> {
    ["norm.cu", "rope.cu", "attention.cu", "elementwise.cu"]
        .into_iter()
        .map(|f| (f, Vec::new()))
        .collect()
}

/// The fused QK-norm, RoPE and KV store of [`LayerKernels::qk_rope_store`].
#[derive(Clone, Copy, Debug)]
pub struct QkRopeStore {
    /// `m × n_head × head_dim` f32: normed, rotated and rounded to f16 precision in place,
    /// unless `q16` is given.
    pub q: u64,
    /// `m × n_head × head_dim` f16 bit patterns: where given, the rotated queries go here and
    /// `q` is left as it was.
    pub q16: Option<u64>,
    /// `m × n_head_kv × head_dim` f32 (read only).
    pub k: u64,
    /// `m × n_head_kv × head_dim_v` f32 (read only).
    pub v: u64,
    pub m: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub head_dim_v: usize,
    /// Per-head RMSNorm weights (`head_dim` f32) of Q and of K.
    pub q_norm: Option<u64>,
    pub k_norm: Option<u64>,
    pub eps: f32,
    pub style: RopeStyle,
    /// Leading dimensions of each head that rotate (even, at most `head_dim`).
    pub n_rot: usize,
    /// `n_rot / 2` f32: the angle of pair i at position p is `p * inv_freq[i]`.
    pub inv_freq: u64,
    /// `u32[m]` on the device: each token's position and sequence slot. Read before the kernel
    /// waits for its predecessor: written by an earlier launch or copy, not the one just before.
    pub positions: u64,
    pub slots: u64,
    /// The layer's cache, f16 bit patterns laid out `[slot][kv_head][position][dim]`.
    pub k_cache: u64,
    pub v_cache: u64,
    /// Positions per slot.
    pub n_ctx: usize,
}

/// The attention of [`LayerKernels::attention`].
#[derive(Clone, Copy, Debug)]
pub struct AttentionArgs {
    /// `m × n_head × head_dim` f32 queries (read at f16 precision).
    pub q: u64,
    /// The layer's cache, as in [`QkRopeStore`].
    pub k_cache: u64,
    pub v_cache: u64,
    /// `m × n_head × head_dim_v` f32 output.
    pub out: u64,
    pub m: usize,
    /// `u32[m]` on the device.
    pub slots: u64,
    pub positions: u64,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub head_dim_v: usize,
    pub n_ctx: usize,
    pub scale: f32,
    /// Keys at least this many positions behind the query are masked.
    pub window: Option<usize>,
    pub softcap: Option<f32>,
}

/// The per-layer kernels, resolved once, and the attention scratch.
pub struct LayerKernels {
    rms_norm_warp: Kernel,
    rms_norm_block: Kernel,
    add_rms_norm: Kernel,
    qk_rope_store: Kernel,
    attention: Kernel,
    attention_combine: Kernel,
    gated_silu: Kernel,
    gated_gelu: Kernel,
    add_inplace: Kernel,
    softcap: Kernel,
    gather_rows: Kernel,
    sm_count: usize,
    /// Partials of split attention: accumulators, then (max, sum) pairs.
    scratch: DeviceBuffer,
}

fn check_ptr(what: &str, p: u64, align: u64) -> Result<(), CudaError> {
    if p == 0 || !p.is_multiple_of(align) {
        return Err(CudaError::Bounds(format!(
            "{what}: device address {p:#x} is null or not {align}-byte aligned"
        )));
    }
    Ok(())
}

fn to_u32(what: &str, v: usize) -> Result<u32, CudaError> {
    u32::try_from(v).map_err(|_| CudaError::Bounds(format!("{what} = {v} exceeds u32")))
}

fn check_finite(what: &str, v: f32) -> Result<(), CudaError> {
    if !v.is_finite() {
        return Err(CudaError::Bounds(format!("{what} = {v} is not finite")));
    }
    Ok(())
}

/// The checks shared by the cache ops: metadata pointers, cache pointers (16-byte rows) and
/// head shapes.
#[allow(clippy::too_many_arguments)]
fn check_cache_op(
    m: usize,
    positions: u64,
    slots: u64,
    k_cache: u64,
    v_cache: u64,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    head_dim_v: usize,
    n_ctx: usize,
) -> Result<(), CudaError> {
    to_u32("m", m)?;
    check_ptr("positions", positions, 4)?;
    check_ptr("slots", slots, 4)?;
    check_ptr("K cache", k_cache, 16)?;
    check_ptr("V cache", v_cache, 16)?;
    for (what, d) in [("head_dim", head_dim), ("head_dim_v", head_dim_v)] {
        if d == 0 || !d.is_multiple_of(8) || d > MAX_HEAD_DIM {
            return Err(CudaError::Unsupported(format!(
                "{what} = {d}: a multiple of 8 up to {MAX_HEAD_DIM} is needed"
            )));
        }
    }
    if n_head == 0 || n_head_kv == 0 || !n_head.is_multiple_of(n_head_kv) {
        return Err(CudaError::Unsupported(format!(
            "{n_head} query heads over {n_head_kv} KV heads"
        )));
    }
    let heads = n_head
        .checked_add(n_head_kv.saturating_mul(2))
        .and_then(|h| h.checked_mul(head_dim.max(head_dim_v)));
    if heads.is_none_or(|h| h > u32::MAX as usize) {
        return Err(CudaError::Bounds(format!("{n_head} heads overflow")));
    }
    if n_ctx == 0 || n_ctx > i32::MAX as usize {
        return Err(CudaError::Bounds(format!("n_ctx = {n_ctx}")));
    }
    Ok(())
}

/// Threads of a block that strides one row of `width` floats, `per_thread` floats each
/// (whole warps, 128 to 1024): 16 for the norms that loop over the row, 4 for
/// `add_rms_norm`, which keeps a float4 of the row per thread in registers and so spreads a
/// decode step's one row over as many threads as it can use.
fn row_threads(width: usize, per_thread: usize) -> u32 {
    (width.div_ceil(per_thread).div_ceil(32) * 32).clamp(128, 1024) as u32
}

/// Dynamic shared memory of one attention block (see attention.cu).
fn attention_smem(d: usize, dv: usize) -> usize {
    4 * (ATT_TILE * dv / 2
        + ATT_TILE * (d / 2 + 1)
        + ATT_GROUP * d
        + ATT_GROUP * ATT_TILE
        + 3 * ATT_GROUP)
}

impl LayerKernels {
    pub fn new(gpu: &Arc<Gpu>) -> Result<LayerKernels, CudaError> {
        let k = |file: &str, name: &str| gpu.kernel(file, name, &[]);
        let attention = k("attention.cu", "attention")?;
        let max_smem = attention_smem(MAX_HEAD_DIM, MAX_HEAD_DIM);
        if max_smem > gpu.chip.smem_per_block {
            return Err(CudaError::Unsupported(format!(
                "attention needs {max_smem} bytes of shared memory per block, the GPU allows {}",
                gpu.chip.smem_per_block
            )));
        }
        attention.set_max_dynamic_smem(max_smem)?;
        Ok(LayerKernels {
            rms_norm_warp: k("norm.cu", "rms_norm_warp")?,
            rms_norm_block: k("norm.cu", "rms_norm_block")?,
            add_rms_norm: k("norm.cu", "add_rms_norm")?,
            qk_rope_store: k("rope.cu", "qk_rope_store")?,
            attention,
            attention_combine: k("attention.cu", "attention_combine")?,
            gated_silu: k("elementwise.cu", "gated_silu")?,
            gated_gelu: k("elementwise.cu", "gated_gelu")?,
            add_inplace: k("elementwise.cu", "add_inplace")?,
            softcap: k("elementwise.cu", "softcap")?,
            gather_rows: k("elementwise.cu", "gather_rows")?,
            sm_count: gpu.chip.sm_count.max(1),
            scratch: gpu.alloc(ATT_SCRATCH_BYTES)?,
        })
    }

    /// `dst = rms_norm(src) * weight` over `n_groups` consecutive groups of `group` floats
    /// (`src == dst` allowed); `weight` holds `group` floats.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(
        &self,
        gpu: &Gpu,
        src: u64,
        dst: u64,
        weight: u64,
        n_groups: usize,
        group: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        check_ptr("rms_norm src", src, 4)?;
        check_ptr("rms_norm dst", dst, 4)?;
        check_ptr("rms_norm weight", weight, 4)?;
        check_finite("eps", eps)?;
        if group == 0 {
            return Err(CudaError::Bounds("rms_norm group of 0".into()));
        }
        let (g, w) = (to_u32("n_groups", n_groups)?, to_u32("group", group)?);
        let args = [
            Arg::Ptr(src),
            Arg::Ptr(dst),
            Arg::Ptr(weight),
            Arg::U32(g),
            Arg::U32(w),
            Arg::F32(eps),
        ];
        if group <= NORM_WARP_MAX_GROUP {
            let blocks = g.div_ceil(NORM_WARP_THREADS / 32);
            let block = (NORM_WARP_THREADS, 1, 1);
            gpu.launch(&self.rms_norm_warp, (blocks, 1, 1), block, 0, &args)
        } else {
            let block = (row_threads(group, 16), 1, 1);
            gpu.launch(&self.rms_norm_block, (g, 1, 1), block, 0, &args)
        }
    }

    /// Per row of `width` floats: `add' = rms_norm(add) * post_weight` (or `add` without a
    /// post norm; `add` itself is not written), `residual += add'`, then
    /// `normed = rms_norm(residual) * next_weight`; with `quantized` (levels, sums), `normed`
    /// is also written in the GEMVs' int8 format there (`kernels/actq.cuh`, rows `width`
    /// levels and `width / 32` sums apart; `width` a multiple of 32).
    #[allow(clippy::too_many_arguments)]
    pub fn add_rms_norm(
        &self,
        gpu: &Gpu,
        residual: u64,
        add: u64,
        post_weight: Option<u64>,
        next_weight: u64,
        normed: u64,
        m: usize,
        width: usize,
        eps: f32,
        quantized: Option<(u64, u64)>,
    ) -> Result<(), CudaError> {
        check_ptr("residual", residual, 4)?;
        check_ptr("add", add, 4)?;
        check_ptr("next_weight", next_weight, 4)?;
        check_ptr("normed", normed, 4)?;
        if let Some(p) = post_weight {
            check_ptr("post_weight", p, 4)?;
        }
        check_finite("eps", eps)?;
        if width == 0 {
            return Err(CudaError::Bounds("add_rms_norm width of 0".into()));
        }
        if let Some((q, qs)) = quantized {
            check_ptr("quantized levels", q, 4)?;
            check_ptr("quantized sums", qs, 16)?;
            if !width.is_multiple_of(32) {
                return Err(CudaError::Bounds(format!(
                    "quantized add_rms_norm of width {width}: needs a multiple of 32"
                )));
            }
        }
        let (q, qs) = quantized.unwrap_or((0, 0));
        let (rows, w) = (to_u32("m", m)?, to_u32("width", width)?);
        gpu.launch(
            &self.add_rms_norm,
            (rows, 1, 1),
            (row_threads(width, 4), 1, 1),
            0,
            &[
                Arg::Ptr(residual),
                Arg::Ptr(add),
                Arg::Ptr(post_weight.unwrap_or(0)),
                Arg::Ptr(next_weight),
                Arg::Ptr(normed),
                Arg::U32(rows),
                Arg::U32(w),
                Arg::F32(eps),
                Arg::Ptr(q),
                Arg::Ptr(qs),
            ],
        )
    }

    /// QK-norm (where weights are given), RoPE of Q and K at each token's position, Q rounded
    /// to f16 precision in place, K and V stored as f16 at each token's (slot, position).
    /// Slots must be below the cache's slot count (the caller checks them on the host);
    /// tokens at a position of `n_ctx` or more are rotated but not stored.
    pub fn qk_rope_store(&self, gpu: &Gpu, r: &QkRopeStore) -> Result<(), CudaError> {
        check_cache_op(
            r.m,
            r.positions,
            r.slots,
            r.k_cache,
            r.v_cache,
            r.n_head,
            r.n_head_kv,
            r.head_dim,
            r.head_dim_v,
            r.n_ctx,
        )?;
        check_ptr("q", r.q, 4)?;
        if let Some(p) = r.q16 {
            check_ptr("q16", p, 2)?;
        }
        check_ptr("k", r.k, 4)?;
        check_ptr("v", r.v, 4)?;
        for (what, w) in [("q_norm", r.q_norm), ("k_norm", r.k_norm)] {
            if let Some(p) = w {
                check_ptr(what, p, 4)?;
            }
        }
        check_finite("eps", r.eps)?;
        if !r.n_rot.is_multiple_of(2) || r.n_rot > r.head_dim {
            return Err(CudaError::Unsupported(format!(
                "n_rot = {} with head_dim {}: an even count up to head_dim is needed",
                r.n_rot, r.head_dim
            )));
        }
        if r.n_rot > 0 {
            check_ptr("inv_freq", r.inv_freq, 4)?;
        }
        let head_blocks = (r.n_head + 2 * r.n_head_kv).div_ceil(ROPE_HEADS_PER_BLOCK);
        if head_blocks > u16::MAX as usize {
            return Err(CudaError::Unsupported(format!("{} query heads", r.n_head)));
        }
        gpu.launch(
            &self.qk_rope_store,
            (r.m as u32, head_blocks as u32, 1),
            (ROPE_THREADS, 1, 1),
            0,
            &[
                Arg::Ptr(r.q),
                Arg::Ptr(r.q16.unwrap_or(0)),
                Arg::Ptr(r.k),
                Arg::Ptr(r.v),
                Arg::Ptr(r.q_norm.unwrap_or(0)),
                Arg::Ptr(r.k_norm.unwrap_or(0)),
                Arg::F32(r.eps),
                Arg::Ptr(r.inv_freq),
                Arg::U32(r.n_rot as u32),
                Arg::U32(matches!(r.style, RopeStyle::Neox) as u32),
                Arg::Ptr(r.positions),
                Arg::Ptr(r.slots),
                Arg::Ptr(r.k_cache),
                Arg::Ptr(r.v_cache),
                Arg::U32(r.n_head as u32),
                Arg::U32(r.n_head_kv as u32),
                Arg::U32(r.head_dim as u32),
                Arg::U32(r.head_dim_v as u32),
                Arg::U32(r.n_ctx as u32),
            ],
        )
    }

    /// How many slices [`LayerKernels::attention`] splits each query's positions into for
    /// this shape (1: no split and no merge). Fixed per shape, so graphs can capture it.
    pub fn attention_splits(
        &self,
        m: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim_v: usize,
        n_ctx: usize,
        window: Option<usize>,
    ) -> usize {
        if m == 0 || n_head == 0 || n_head_kv == 0 {
            return 1;
        }
        let chunks = (n_head / n_head_kv).div_ceil(ATT_GROUP).max(1);
        let blocks = m.saturating_mul(n_head_kv).saturating_mul(chunks);
        let target = 4 * self.sm_count;
        if blocks.saturating_mul(2) >= target {
            return 1;
        }
        let span = window.map_or(n_ctx, |w| w.min(n_ctx));
        let per_split = m
            .saturating_mul(n_head)
            .saturating_mul(head_dim_v + 2)
            .saturating_mul(4)
            .saturating_add(16);
        target
            .div_ceil(blocks)
            .min(ATT_MAX_SPLITS)
            .min(span.div_ceil(ATT_SPLIT_ALIGN))
            .min(ATT_SCRATCH_BYTES / per_split)
            .max(1)
    }

    /// Causal attention of each token's query heads over its slot's cached positions
    /// `first..=position` (`first = position + 1 - window` under a window), query head h
    /// reading KV head `h / (n_head / n_head_kv)`. Slots must be below the cache's slot count
    /// (the caller checks them on the host); a token at a position of `n_ctx` or more gets
    /// zeros.
    pub fn attention(&self, gpu: &Gpu, a: &AttentionArgs) -> Result<(), CudaError> {
        check_cache_op(
            a.m,
            a.positions,
            a.slots,
            a.k_cache,
            a.v_cache,
            a.n_head,
            a.n_head_kv,
            a.head_dim,
            a.head_dim_v,
            a.n_ctx,
        )?;
        check_ptr("q", a.q, 4)?;
        check_ptr("attention out", a.out, 8)?;
        check_finite("scale", a.scale)?;
        let softcap = match a.softcap {
            Some(c) if !(c.is_finite() && c > 0.0) => {
                return Err(CudaError::Unsupported(format!("soft-cap {c}")))
            }
            Some(c) => c,
            None => 0.0,
        };
        let window = a.window.map_or(-1, |w| w.min(a.n_ctx) as i32);
        let rows = a.m * a.n_head;
        let blocks = to_u32("attention blocks", a.m * a.n_head_kv)?;
        let rows_u32 = to_u32("attention rows", rows)?;
        let chunks = (a.n_head / a.n_head_kv).div_ceil(ATT_GROUP);
        if chunks > u16::MAX as usize {
            return Err(CudaError::Unsupported(format!("{} query heads", a.n_head)));
        }
        let splits =
            self.attention_splits(a.m, a.n_head, a.n_head_kv, a.head_dim_v, a.n_ctx, a.window);
        let (part_acc, part_ml) = if splits > 1 {
            let acc_bytes = rows * splits * a.head_dim_v * 4;
            (
                self.scratch.ptr(),
                self.scratch.at(acc_bytes.next_multiple_of(16)),
            )
        } else {
            (0, 0)
        };
        gpu.launch(
            &self.attention,
            (blocks, chunks as u32, splits as u32),
            (ATT_THREADS, 1, 1),
            attention_smem(a.head_dim, a.head_dim_v) as u32,
            &[
                Arg::Ptr(a.q),
                Arg::Ptr(a.k_cache),
                Arg::Ptr(a.v_cache),
                Arg::Ptr(a.out),
                Arg::Ptr(part_acc),
                Arg::Ptr(part_ml),
                Arg::Ptr(a.positions),
                Arg::Ptr(a.slots),
                Arg::U32(a.n_head as u32),
                Arg::U32(a.n_head_kv as u32),
                Arg::U32(a.head_dim as u32),
                Arg::U32(a.head_dim_v as u32),
                Arg::U32(a.n_ctx as u32),
                Arg::F32(a.scale),
                Arg::I32(window),
                Arg::F32(softcap),
            ],
        )?;
        if splits > 1 {
            gpu.launch(
                &self.attention_combine,
                (rows_u32, 1, 1),
                (ATT_THREADS, 1, 1),
                0,
                &[
                    Arg::Ptr(part_acc),
                    Arg::Ptr(part_ml),
                    Arg::Ptr(a.out),
                    Arg::U32(rows_u32),
                    Arg::U32(a.head_dim_v as u32),
                    Arg::U32(splits as u32),
                ],
            )?;
        }
        Ok(())
    }

    /// A grid-stride launch over `n` floats.
    fn map(&self, gpu: &Gpu, k: &Kernel, n: usize, args: &[Arg]) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let blocks = n
            .div_ceil(4 * ELEMENTWISE_THREADS as usize)
            .clamp(1, self.sm_count * 16);
        gpu.launch(
            k,
            (blocks as u32, 1, 1),
            (ELEMENTWISE_THREADS, 1, 1),
            0,
            args,
        )
    }

    /// `gate = act(gate) * up` over `n` floats.
    pub fn gated_act(
        &self,
        gpu: &Gpu,
        gate: u64,
        up: u64,
        n: usize,
        act: Activation,
    ) -> Result<(), CudaError> {
        check_ptr("gate", gate, 4)?;
        check_ptr("up", up, 4)?;
        let k = match act {
            Activation::Silu => &self.gated_silu,
            Activation::GeluTanh => &self.gated_gelu,
        };
        self.map(
            gpu,
            k,
            n,
            &[Arg::Ptr(gate), Arg::Ptr(up), Arg::I64(n as i64)],
        )
    }

    /// `dst += src` over `n` floats.
    pub fn add(&self, gpu: &Gpu, dst: u64, src: u64, n: usize) -> Result<(), CudaError> {
        check_ptr("add dst", dst, 4)?;
        check_ptr("add src", src, 4)?;
        self.map(
            gpu,
            &self.add_inplace,
            n,
            &[Arg::Ptr(dst), Arg::Ptr(src), Arg::I64(n as i64)],
        )
    }

    /// `x = tanh(x / cap) * cap` over `n` floats.
    pub fn softcap(&self, gpu: &Gpu, buf: u64, n: usize, cap: f32) -> Result<(), CudaError> {
        check_ptr("softcap buffer", buf, 4)?;
        if !(cap.is_finite() && cap > 0.0) {
            return Err(CudaError::Unsupported(format!("soft-cap {cap}")));
        }
        self.map(
            gpu,
            &self.softcap,
            n,
            &[Arg::Ptr(buf), Arg::I64(n as i64), Arg::F32(cap)],
        )
    }

    /// `dst[r] = src[rows[r]]` for `r < n_rows`, rows of `width` floats; `rows` is a device
    /// `u32[n_rows]` of indices the caller has checked.
    pub fn gather_rows(
        &self,
        gpu: &Gpu,
        src: u64,
        dst: u64,
        rows: u64,
        n_rows: usize,
        width: usize,
    ) -> Result<(), CudaError> {
        check_ptr("gather src", src, 4)?;
        check_ptr("gather dst", dst, 4)?;
        check_ptr("gather rows", rows, 4)?;
        let (n, w) = (to_u32("n_rows", n_rows)?, to_u32("width", width)?);
        gpu.launch(
            &self.gather_rows,
            (n, 1, 1),
            (row_threads(width, 16), 1, 1),
            0,
            &[
                Arg::Ptr(src),
                Arg::Ptr(dst),
                Arg::Ptr(rows),
                Arg::U32(n),
                Arg::U32(w),
            ],
        )
    }
}
