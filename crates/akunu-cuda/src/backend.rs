//! The CUDA backend: the plan lowered once to fused kernel launches over device buffers.
//!
//! Plan: at creation, upload every weight the plan uses (matrices still quantized, norm
//! weights, biases and RoPE tables as f32), allocate the activation rows for the largest batch,
//! the f16 KV cache of every slot and the logits, and lower the op list to `Step`s, fusing
//! what the plan spells out as several ops:
//! - q/k/v (and any products of one input) share one activation preparation;
//! - gate and up with the gated activation are one kernel for decode-sized batches;
//! - QK-norm, RoPE of Q and K, and the KV-cache write are one kernel, and in decode passes
//!   with one token per slot part of the attention kernel;
//! - a block's optional post-norm, its residual add and the next norm are one kernel; in
//!   single-token decode, where the block has no post-norm, they are part of the block's
//!   output projection (`matmul::gemv_residual_norm`), whose readers divide by the RMS.
//!
//! A pass copies the batch's token ids, positions, slots and output rows into one device
//! buffer and runs the steps; kernels read that metadata on the device, so the launches of a
//! pass depend only on its token and output counts. Passes of decode size (at most
//! `gemv_max_m` tokens) are captured once per (tokens, outputs) shape as a CUDA graph and
//! replayed, their kernels joined by programmatic dependent launch on Hopper (each kernel is
//! scheduled while its predecessor drains). Chain decode (`Backend::greedy_chain`) replays the
//! one-token graph with the next token chosen on the device (for greedy chains by the output
//! product itself, `matmul::gemv_argmax`, which writes no logits), reading tokens back once per
//! chain.
//! A pass's logits stay on the device until asked for, so tokens drawn there after a pass
//! (`Backend::draw`: a batched decode step, the token after a prompt) cost one small read.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use akunu_core::backend::{kv_cache_advice, kv_cache_name};
use akunu_core::sampling::SamplerParams;
use akunu_core::{
    Activation, Backend, Batch, Buf, Draw, EngineError, Model, Op, RopeStyle, WeightId,
};
use akunu_quant::GgmlType;
use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaEvent, CudaGraph};

use crate::chip::ChipConfig;
use crate::compile::ModuleSpec;
use crate::flash::{
    FlashArgs, FlashConfig, FlashDtype, FlashKernels, FlashRope, FlashScratch, Queries,
};
use crate::gemm::{GemmKernels, GemmScratch};
use crate::gpu::{DeviceBuffer, Gpu};
use crate::layers::LayerKernels;
use crate::matmul::{ActScratch, ArgmaxTarget, DeviceMatrix, MatmulKernels};
use crate::sample::{Chain, RowSetup, SampleKernels, SamplerState, MAX_WINDOW};
use crate::CudaError;

/// How the backend is sized.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    /// Positions per slot.
    pub n_ctx: usize,
    pub n_slots: usize,
    /// Most tokens per pass.
    pub max_batch: usize,
}

struct Product {
    w: usize,
    bias: Option<DeviceBuffer>,
    dst: Buf,
}

enum Step {
    Embed {
        table: usize,
        scale: f32,
    },
    Norm {
        src: Buf,
        dst: Buf,
        weight: DeviceBuffer,
        group: usize,
        eps: f32,
    },
    Products {
        src: Buf,
        items: Vec<Product>,
    },
    /// `Gate = act(gate · src) * (up · src)`.
    Gated {
        src: Buf,
        gate: usize,
        up: usize,
        act: Activation,
    },
    QkRopeStore {
        layer: usize,
        rope: LayerRope,
    },
    Attention {
        layer: usize,
        scale: f32,
        window: Option<usize>,
        softcap: Option<f32>,
        /// The step of this layer's QK-norm, RoPE and KV store just before, which decode
        /// attention does itself where it can ([`CudaBackend::rope_in_attention`]).
        rope: Option<usize>,
    },
    /// `Out = norm(Out)·post` (if any); `Residual += Out`; `Normed = norm(Residual)·next`;
    /// then, with `select`, the output rows of `Normed` are gathered for the logits.
    ResidualNorm {
        post: Option<DeviceBuffer>,
        next: DeviceBuffer,
        eps: f32,
        select: bool,
    },
    Logits {
        w: usize,
        softcap: Option<f32>,
    },
}

/// A layer's rotation of Q and K: the QK-norm weights (if any), then RoPE.
struct LayerRope {
    q_norm: Option<DeviceBuffer>,
    k_norm: Option<DeviceBuffer>,
    eps: f32,
    style: RopeStyle,
    n_rot: usize,
    inv_freq: DeviceBuffer,
}

/// A captured pass.
struct Graph(CudaGraph);

// SAFETY: a graph is only launched through `&mut CudaBackend`, so from one thread at a time,
// and every launch binds the backend's context to the calling thread first.
unsafe impl Send for Graph {}

/// One layer's cache: `[slot][kv_head][position][dim]` f16 for K and for V.
struct LayerKv {
    k: DeviceBuffer,
    v: DeviceBuffer,
}

/// Offsets (in u32s) of the batch metadata inside [`CudaBackend::meta`].
struct MetaLayout {
    tokens: usize,
    positions: usize,
    slots: usize,
    outputs: usize,
    len: usize,
}

pub struct CudaBackend {
    gpu: Arc<Gpu>,
    model: Arc<Model>,
    opts: CudaOptions,
    steps: Vec<Step>,
    labels: Vec<String>,
    /// Uploaded matrices by weight index (`None` for tensors that are not matrices).
    matrices: Vec<Option<DeviceMatrix>>,
    bufs: Vec<DeviceBuffer>,
    widths: Vec<usize>,
    /// The output rows of `Normed`, gathered for the logits.
    selected: DeviceBuffer,
    /// Activations prepared for the GEMV kernels (written by one step, read by the next ones).
    acts: RefCell<ActScratch>,
    gemm_x: GemmScratch,
    kv: Vec<LayerKv>,
    meta: DeviceBuffer,
    meta_layout: MetaLayout,
    meta_host: Vec<u32>,
    logits_dev: DeviceBuffer,
    /// The last pass's logits as the host has them.
    logits: Vec<f32>,
    host_logits: HostLogits,
    /// Output rows of the last pass whose logits are on the device untouched by a draw.
    drawable: usize,
    mm: MatmulKernels,
    gemm: GemmKernels,
    layers: LayerKernels,
    /// FlashAttention, where the head sizes allow it (multiples of 16 up to 256); else the
    /// simple kernel of [`LayerKernels::attention`].
    flash: Option<Flash>,
    /// Runs of tokens of one slot in the current batch, for prefill attention tiles.
    runs: Vec<(usize, usize)>,
    /// Whether every token of the current batch is the only one of its slot.
    one_per_slot: bool,
    /// The most keys a token of the current batch sees (its position + 1).
    batch_keys: usize,
    sampler: SampleKernels,
    /// The sampled chains' parameters, step and penalty window (one row), made on first use.
    chain_sampler: Option<SamplerState>,
    /// The state and tokens of draws after a pass (a row per draw), made and grown on use.
    draws: Option<Draws>,
    /// Captured passes by (tokens, outputs, the chain's choice, one token per slot).
    graphs: HashMap<(usize, usize, Pick, bool), Graph>,
    /// The tokens a chain chose (one per position of the context at most) and their count.
    chain_out: DeviceBuffer,
    chain_counter: DeviceBuffer,
    /// The scratch of greedy chains' argmax inside the output product.
    argmax_scratch: DeviceBuffer,
    use_graphs: bool,
    /// Per-step GPU time when profiling (events around each step, no graphs).
    op_times: Option<Vec<f64>>,
}

/// Refuses a KV cache of `bytes` larger than the GPU's free memory (the weights already
/// uploaded) with an error that names the cache and what to lower, where the allocation would
/// only say how many bytes it could not get.
fn check_kv_fits(gpu: &Gpu, opts: &CudaOptions, bytes: f64) -> Result<(), CudaError> {
    let (free, _) = gpu.memory()?;
    if bytes <= free as f64 {
        return Ok(());
    }
    Err(CudaError::Bounds(format!(
        "{} needs {:.1} GB, more than the {:.1} GB the GPU has free after the weights; {}",
        kv_cache_name(opts.n_ctx, opts.n_slots),
        bytes / 1e9,
        free as f64 / 1e9,
        kv_cache_advice(opts.n_slots)
    )))
}

/// Whether the host has the last pass's logits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum HostLogits {
    /// Read (or no pass yet).
    Read,
    /// On the device only: `n` rows to read on the first ask.
    OnDevice(usize),
    /// Gone: a draw penalised them in place, or a chain replaced them, before any read.
    Spent,
}

/// Draws after a pass ([`Backend::draw`]): sampler rows and the tokens they draw.
struct Draws {
    state: SamplerState,
    out: DeviceBuffer,
}

/// How a pass ends: with its logits, or choosing a decode chain's next token on the device.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Pick {
    Logits,
    Argmax,
    /// The sampler (`chain_sampler`), with or without its exact path's two launches.
    Sample {
        exact: bool,
    },
}

/// Bytes of the FlashAttention scratch: split partials (fewer splits when they would need
/// more) and a prefill tile list.
const FLASH_SCRATCH_BYTES: usize = 16 << 20;

/// The engine's FlashAttention: f32 queries for decode-sized passes (whose kernel can norm and
/// rotate the queries itself), f16 queries for prefill attention right after `qk_rope_store`,
/// which writes them into `queries`, and the prefill kernels copy into their tiles as they are
/// (converting f32 queries there held up the first key step of every tile); any other
/// attention step reads f32 queries. One scratch serves both modules: launches are ordered on
/// the stream.
struct Flash {
    decode: FlashKernels,
    prefill: FlashKernels,
    scratch: FlashScratch,
    /// `max_batch × n_head × head_dim` f16.
    queries: DeviceBuffer,
}

/// The FlashAttention build for the model's head sizes, where it has one.
fn flash_config(chip: &ChipConfig, c: &akunu_core::ModelConfig) -> Option<FlashConfig> {
    (FlashConfig::supports(c.head_dim) && FlashConfig::supports(c.head_dim_v))
        .then(|| FlashConfig::new(FlashDtype::F16, c.head_dim, c.head_dim_v).for_chip(chip))
}

fn flash_kernels(
    gpu: &Gpu,
    c: &akunu_core::ModelConfig,
    max_batch: usize,
) -> Result<Option<Flash>, CudaError> {
    let Some(config) = flash_config(&gpu.chip, c) else {
        return Ok(None);
    };
    Ok(Some(Flash {
        decode: FlashKernels::new(gpu, config.f32_io())?,
        prefill: FlashKernels::new(gpu, config.f32_out())?,
        scratch: FlashScratch::new(gpu, FLASH_SCRATCH_BYTES + max_batch * 8)?,
        queries: gpu.alloc(max_batch * c.n_head * c.head_dim * 2)?,
    }))
}

/// The weights the plan reads as matrices (embedding tables, products, logits), in the plan's
/// order, repeats included.
fn matrix_ids(model: &Model) -> impl Iterator<Item = WeightId> + '_ {
    model.plan.ops.iter().filter_map(|op| match op {
        Op::Embed { table, .. } => Some(*table),
        Op::MatMul { weight, .. } | Op::Logits { weight, .. } => Some(*weight),
        _ => None,
    })
}

/// The weight types of the matrices the plan reads, each once, in the plan's order.
fn matrix_types(model: &Model) -> Vec<GgmlType> {
    let weights = model.weights();
    let mut types: Vec<GgmlType> = Vec::new();
    for id in matrix_ids(model) {
        let ty = weights[id.0 as usize].ty;
        if !types.contains(&ty) {
            types.push(ty);
        }
    }
    types
}

/// Every kernel module a backend for `model` loads on a GPU of this chip config.
/// [`CudaBackend::new`] compiles the missing ones together; a caller can ask
/// [`Gpu::uncompiled`] beforehand whether it will have to.
pub fn kernel_modules(chip: &ChipConfig, model: &Model) -> Vec<ModuleSpec> {
    modules_of(&matrix_types(model), chip, &model.config)
}

/// [`kernel_modules`] given the model's matrix types.
fn modules_of(
    types: &[GgmlType],
    chip: &ChipConfig,
    c: &akunu_core::ModelConfig,
) -> Vec<ModuleSpec> {
    let mut v = crate::matmul::modules_for(types);
    v.extend(crate::gemm::modules_for(types));
    v.extend(crate::layers::modules());
    v.extend(crate::sample::modules());
    if let Some(f) = flash_config(chip, c) {
        v.push(f.f32_io().module());
        v.push(f.f32_out().module());
    }
    v
}

fn backend_err(e: CudaError) -> EngineError {
    EngineError::Backend(e.to_string())
}

impl CudaBackend {
    pub fn new(
        gpu: Arc<Gpu>,
        model: Arc<Model>,
        opts: CudaOptions,
    ) -> Result<CudaBackend, EngineError> {
        if opts.n_ctx == 0 || opts.n_slots == 0 || opts.max_batch == 0 {
            return Err(EngineError::Backend(format!(
                "context {}, slots {} and batch {} must all be positive",
                opts.n_ctx, opts.n_slots, opts.max_batch
            )));
        }
        Self::build(gpu, model, opts).map_err(backend_err)
    }

    fn build(
        gpu: Arc<Gpu>,
        model: Arc<Model>,
        opts: CudaOptions,
    ) -> Result<CudaBackend, CudaError> {
        let c = model.config.clone();
        let types = matrix_types(&model);
        gpu.prepare(&modules_of(&types, &gpu.chip, &c))?;
        let weights = model.weights();
        let mut matrices: Vec<Option<DeviceMatrix>> = (0..weights.len()).map(|_| None).collect();
        for id in matrix_ids(&model) {
            let i = id.0 as usize;
            if matrices[i].is_none() {
                let w = &weights[i];
                let m = DeviceMatrix::upload(&gpu, w.ty, model.weight_bytes(id), w.rows, w.cols)
                    .map_err(|e| CudaError::Unsupported(format!("{}: {e}", w.name)))?;
                matrices[i] = Some(m);
            }
        }
        let mm = MatmulKernels::new(&gpu, &types)?;
        let gemm = GemmKernels::new(&gpu, &types)?;
        let layers = LayerKernels::new(&gpu)?;
        let sampler = SampleKernels::new(&gpu)?;
        let flash = flash_kernels(&gpu, &c, opts.max_batch)?;

        let f32_weight = |id| -> Result<DeviceBuffer, CudaError> {
            let v = model
                .weight_f32(id)
                .map_err(|e| CudaError::Unsupported(e.to_string()))?;
            gpu.upload(&v)
        };
        let (steps, labels) = lower(&model, &f32_weight, &gpu)?;

        let widths: Vec<usize> = Buf::ALL.iter().map(|b| b.width(&c)).collect();
        let bufs = widths
            .iter()
            .map(|w| gpu.alloc(w * opts.max_batch * 4))
            .collect::<Result<Vec<_>, _>>()?;
        let selected = gpu.alloc(c.n_embd * opts.max_batch * 4)?;
        let max_cols = widths.iter().copied().max().unwrap_or(0);
        let acts = RefCell::new(ActScratch::new(&gpu, gpu.chip.gemv_max_m, max_cols)?);
        let gemm_x = GemmScratch::new(&gpu, opts.max_batch, max_cols)?;
        let kv_bytes = |dim: usize| -> Result<usize, CudaError> {
            opts.n_slots
                .checked_mul(c.n_head_kv)
                .and_then(|n| n.checked_mul(opts.n_ctx))
                .and_then(|n| n.checked_mul(dim * 2))
                .ok_or_else(|| CudaError::Bounds("KV cache size overflows".into()))
        };
        let (kb, vb) = (kv_bytes(c.head_dim)?, kv_bytes(c.head_dim_v)?);
        check_kv_fits(&gpu, &opts, (kb + vb) as f64 * c.n_layer as f64)?;
        let kv = (0..c.n_layer)
            .map(|_| {
                Ok(LayerKv {
                    k: gpu.alloc(kb)?,
                    v: gpu.alloc(vb)?,
                })
            })
            .collect::<Result<Vec<_>, CudaError>>()?;
        let mb = opts.max_batch;
        let meta_layout = MetaLayout {
            tokens: 0,
            positions: mb,
            slots: 2 * mb,
            outputs: 3 * mb,
            len: 4 * mb,
        };
        let meta = gpu.alloc(meta_layout.len * 4)?;
        let logits_dev = gpu.alloc(mb * c.n_vocab * 4)?;
        let chain_out = gpu.alloc(opts.n_ctx * 4)?;
        let chain_counter = gpu.alloc(4)?;
        let argmax_scratch = gpu.alloc(crate::matmul::ARGMAX_SCRATCH_BYTES)?;
        Ok(CudaBackend {
            gpu,
            model,
            opts,
            steps,
            labels,
            matrices,
            bufs,
            widths,
            selected,
            acts,
            gemm_x,
            kv,
            meta,
            meta_host: vec![0; meta_layout.len],
            meta_layout,
            logits_dev,
            logits: Vec::new(),
            host_logits: HostLogits::Read,
            drawable: 0,
            mm,
            gemm,
            layers,
            flash,
            runs: Vec::new(),
            batch_keys: 0,
            one_per_slot: false,
            sampler,
            chain_sampler: None,
            draws: None,
            graphs: HashMap::new(),
            chain_out,
            chain_counter,
            argmax_scratch,
            use_graphs: std::env::var("AKUNU_NO_GRAPHS").is_err(),
            op_times: None,
        })
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Bytes of weights on the device.
    pub fn weight_bytes(&self) -> usize {
        self.matrices
            .iter()
            .flatten()
            .map(|m| m.device_bytes())
            .sum()
    }

    /// Starts (or stops) timing every step with device events; passes then run without graphs.
    pub fn set_profiling(&mut self, on: bool) {
        self.op_times = on.then(|| vec![0.0; self.steps.len()]);
    }

    /// A label per lowered step, in execution order.
    pub fn op_labels(&self) -> &[String] {
        &self.labels
    }

    /// Milliseconds of GPU time per step since profiling was turned on.
    pub fn op_times_ms(&self) -> Option<&[f64]> {
        self.op_times.as_deref()
    }

    fn upload_meta(&mut self, batch: &Batch) -> Result<(), CudaError> {
        let l = &self.meta_layout;
        let n = batch.tokens.len();
        self.meta_host[l.tokens..l.tokens + n].copy_from_slice(batch.tokens);
        self.meta_host[l.positions..l.positions + n].copy_from_slice(batch.positions);
        self.meta_host[l.slots..l.slots + n].copy_from_slice(batch.slots);
        let o = batch.outputs.len();
        self.meta_host[l.outputs..l.outputs + o].copy_from_slice(batch.outputs);
        self.runs.clear();
        for (t, &slot) in batch.slots.iter().enumerate() {
            match self.runs.last_mut() {
                Some((first, count)) if batch.slots[*first] == slot => *count += 1,
                _ => self.runs.push((t, 1)),
            }
        }
        self.batch_keys = batch.positions.iter().max().map_or(0, |&p| p as usize + 1);
        self.one_per_slot = batch
            .slots
            .iter()
            .enumerate()
            .all(|(t, s)| !batch.slots[..t].contains(s));
        self.gpu.write(&self.meta, 0, &self.meta_host)
    }

    fn meta_ptr(&self, offset: usize) -> u64 {
        self.meta.at(offset * 4)
    }

    fn buf(&self, b: Buf) -> u64 {
        self.bufs[b as usize].ptr()
    }

    /// An event recorded on the stream now, for per-step profiles.
    fn mark(&self) -> Result<CudaEvent, CudaError> {
        let ev = self
            .gpu
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| CudaError::driver("creating an event", e))?;
        ev.record(self.gpu.stream())
            .map_err(|e| CudaError::driver("recording an event", e))?;
        Ok(ev)
    }

    /// Launches every step for `m` tokens and `n_out` output rows.
    fn launch_pass(&mut self, m: usize, n_out: usize, pick: Pick) -> Result<(), CudaError> {
        let profiling = self.op_times.is_some();
        self.acts.borrow_mut().forget_written();
        let mut events = Vec::new();
        for i in 0..self.steps.len() {
            if profiling {
                events.push(self.mark()?);
            }
            self.launch_step(i, m, n_out, pick)?;
        }
        if profiling {
            events.push(self.mark()?);
            self.gpu.sync()?;
            let times = self.op_times.as_mut().expect("profiling");
            for (i, w) in events.windows(2).enumerate() {
                times[i] += w[0]
                    .elapsed_ms(&w[1])
                    .map_err(|e| CudaError::driver("reading an event", e))?
                    as f64;
            }
        }
        Ok(())
    }

    /// Whether decode attention does the QK-norm, RoPE and KV store of an `m`-token pass
    /// itself: a decode-sized pass with one token per slot, on the FlashAttention kernels,
    /// with heads as wide as the chip config asks.
    fn rope_in_attention(&self, m: usize) -> bool {
        let c = &self.model.config;
        m <= self.gpu.chip.gemv_max_m
            && self.one_per_slot
            && c.head_dim >= self.gpu.chip.rope_in_attention_from
            && self.flash.as_ref().is_some_and(|f| {
                f.decode
                    .fuses_rope(&Queries::PerToken, c.n_head, c.n_head_kv)
            })
    }

    /// Where the `QkRopeStore` step `rope_step` of an `m`-token pass writes its rotated queries
    /// as f16: for the FlashAttention prefill that reads them right after it (past decode
    /// sizes). `None` leaves them f32 in `Q`. Both steps ask here, so they agree.
    fn prefill_queries(&self, rope_step: usize, m: usize) -> Option<u64> {
        let read_next = matches!(
            self.steps.get(rope_step + 1),
            Some(Step::Attention { rope: Some(r), .. }) if *r == rope_step
        );
        self.flash
            .as_ref()
            .filter(|_| read_next && m > self.gpu.chip.gemv_max_m)
            .map(|f| f.queries.ptr())
    }

    /// The norm weights and epsilon of the `ResidualNorm` step after the `Products` step `i`
    /// when the product takes it into its kernel in an `m`-token pass: one decode token, a
    /// single output projection of the block into `Out`, quantized products, and a norm with
    /// no post-norm that feeds products.
    fn norm_in_product(&self, i: usize, m: usize) -> Option<(&DeviceBuffer, f32)> {
        let n_embd = self.model.config.n_embd;
        let (
            Some(Step::Products { items, .. }),
            Some(Step::ResidualNorm {
                post: None,
                next,
                eps,
                select: false,
            }),
        ) = (self.steps.get(i), self.steps.get(i + 1))
        else {
            return None;
        };
        let fits = m == 1
            && self.mm.folds_norms()
            && self.mm.quantizes()
            && n_embd.is_multiple_of(32)
            && matches!(items.as_slice(), [p] if p.dst == Buf::Out
                && self.matrix(p.w).rows() == n_embd);
        fits.then_some((next, *eps))
    }

    /// The weights and epsilon of the RMSNorm after the `Embed` step `i`, where the lookup
    /// applies it ([`crate::matmul::embed_norm`]): a norm of whole rows of the residual into
    /// `Normed`, of a width the lookup takes ([`crate::matmul::embed_norm_fits`]).
    fn norm_after_embed(&self, i: usize) -> Option<(&DeviceBuffer, f32)> {
        let n_embd = self.model.config.n_embd;
        let (
            Some(Step::Embed { .. }),
            Some(Step::Norm {
                src: Buf::Residual,
                dst: Buf::Normed,
                weight,
                group,
                eps,
            }),
        ) = (self.steps.get(i), self.steps.get(i + 1))
        else {
            return None;
        };
        let fits = *group == n_embd
            && self.widths[Buf::Normed as usize] == n_embd
            && crate::matmul::embed_norm_fits(n_embd);
        fits.then_some((weight, *eps))
    }

    /// The rotation of the `QkRopeStore` step `i`, for the attention kernel.
    fn flash_rope(&self, i: usize) -> Option<FlashRope> {
        let Step::QkRopeStore { rope: r, .. } = self.steps.get(i)? else {
            return None;
        };
        Some(FlashRope {
            k_new: self.buf(Buf::K),
            v_new: self.buf(Buf::V),
            q_norm: r.q_norm.as_ref().map_or(0, |b| b.ptr()),
            k_norm: r.k_norm.as_ref().map_or(0, |b| b.ptr()),
            eps: r.eps,
            neox: r.style == RopeStyle::Neox,
            n_rot: r.n_rot,
            inv_freq: r.inv_freq.ptr(),
        })
    }

    fn matrix(&self, w: usize) -> &DeviceMatrix {
        self.matrices[w]
            .as_ref()
            .expect("lowered steps name uploaded matrices")
    }

    fn launch_step(&self, i: usize, m: usize, n_out: usize, pick: Pick) -> Result<(), CudaError> {
        let c = &self.model.config;
        let gpu = &self.gpu;
        let l = &self.meta_layout;
        let small = m <= gpu.chip.gemv_max_m;
        let step = &self.steps[i];
        // Without output rows, nothing after the last layer's attention block is needed.
        if n_out == 0
            && matches!(
                step,
                Step::Logits { .. } | Step::ResidualNorm { select: true, .. }
            )
        {
            return Ok(());
        }
        match step {
            Step::Embed { table, scale } => {
                let (table, tokens) = (self.matrix(*table), self.meta_ptr(l.tokens));
                let residual = self.buf(Buf::Residual);
                let Some((weight, eps)) = self.norm_after_embed(i) else {
                    return crate::matmul::embed(gpu, &self.mm, table, tokens, m, residual, *scale);
                };
                // The first products take the norm's int8 form from here in decode.
                let normed = self.buf(Buf::Normed);
                let fuse = small && self.mm.quantizes();
                let norm = crate::matmul::EmbedNorm {
                    weight: weight.ptr(),
                    eps,
                    normed,
                };
                self.acts
                    .borrow_mut()
                    .written_by(fuse, normed, m, c.n_embd, |quantized| {
                        crate::matmul::embed_norm(
                            gpu, &self.mm, table, tokens, m, residual, *scale, &norm, quantized,
                        )
                    })
            }
            Step::Norm {
                src,
                dst,
                weight,
                group,
                eps,
            } => {
                if i > 0 && self.norm_after_embed(i - 1).is_some() {
                    return Ok(());
                }
                let width = self.widths[*dst as usize];
                self.layers.rms_norm(
                    gpu,
                    self.buf(*src),
                    self.buf(*dst),
                    weight.ptr(),
                    m * width / group,
                    *group,
                    *eps,
                )
            }
            Step::Products { src, items } => {
                let width = self.widths[*src as usize];
                if !small {
                    crate::gemm::prepare(
                        gpu,
                        &self.gemm,
                        self.buf(*src),
                        width,
                        m,
                        width,
                        &self.gemm_x,
                    )?;
                }
                let norm = self.norm_in_product(i, m);
                if small {
                    let mut acts = self.acts.borrow_mut();
                    let x = self.buf(*src);
                    let quantizes_itself = norm.is_some()
                        && matches!(items.as_slice(), [p]
                            if crate::matmul::residual_norm_quantizes(gpu, &self.mm, self.matrix(p.w)));
                    if quantizes_itself {
                        acts.prepare_unquantized(gpu, x, width, m, width)?;
                    } else {
                        acts.prepare(gpu, &self.mm, x, width, m, width)?;
                    }
                }
                let products: Vec<crate::matmul::Product> = items
                    .iter()
                    .map(|p| crate::matmul::Product {
                        w: self.matrix(p.w),
                        y: self.buf(p.dst),
                        y_stride: self.widths[p.dst as usize],
                        bias: p.bias.as_ref().map(|b| b.ptr()),
                    })
                    .collect();
                if let Some((next, eps)) = norm {
                    let p = &products[0];
                    return crate::matmul::gemv_residual_norm(
                        gpu,
                        &self.mm,
                        p.w,
                        p.bias,
                        &mut self.acts.borrow_mut(),
                        &crate::matmul::ResidualNorm {
                            residual: self.buf(Buf::Residual),
                            weight: next.ptr(),
                            eps,
                            normed: self.buf(Buf::Normed),
                        },
                    );
                }
                if small {
                    let acts = self.acts.borrow();
                    return crate::matmul::gemv_many(gpu, &self.mm, &products, &acts, m);
                }
                crate::gemm::gemm_many(gpu, &self.gemm, &products, &self.gemm_x)
            }
            Step::Gated { src, gate, up, act } => {
                let width = self.widths[*src as usize];
                let (g, u) = (self.matrix(*gate), self.matrix(*up));
                if small {
                    self.acts.borrow_mut().prepare(
                        gpu,
                        &self.mm,
                        self.buf(*src),
                        width,
                        m,
                        width,
                    )?;
                    crate::matmul::gemv_gated(
                        gpu,
                        &self.mm,
                        g,
                        u,
                        &self.acts.borrow(),
                        m,
                        self.buf(Buf::Gate),
                        c.n_ff,
                        *act,
                    )
                } else {
                    let x = self.buf(*src);
                    let s = &self.gemm_x;
                    crate::gemm::prepare(gpu, &self.gemm, x, width, m, width, s)?;
                    let product = |w, y| crate::matmul::Product {
                        w,
                        y,
                        y_stride: c.n_ff,
                        bias: None,
                    };
                    let products = [
                        product(g, self.buf(Buf::Gate)),
                        product(u, self.buf(Buf::Up)),
                    ];
                    crate::gemm::gemm_many(gpu, &self.gemm, &products, s)?;
                    self.layers.gated_act(
                        gpu,
                        self.buf(Buf::Gate),
                        self.buf(Buf::Up),
                        m * c.n_ff,
                        *act,
                    )
                }
            }
            Step::QkRopeStore { layer, rope: r } => {
                if let Some(Step::Attention { rope: Some(_), .. }) = self.steps.get(i + 1) {
                    if self.rope_in_attention(m) {
                        return Ok(());
                    }
                }
                let kv = &self.kv[*layer];
                self.layers.qk_rope_store(
                    gpu,
                    &crate::layers::QkRopeStore {
                        q: self.buf(Buf::Q),
                        q16: self.prefill_queries(i, m),
                        k: self.buf(Buf::K),
                        v: self.buf(Buf::V),
                        m,
                        n_head: c.n_head,
                        n_head_kv: c.n_head_kv,
                        head_dim: c.head_dim,
                        head_dim_v: c.head_dim_v,
                        q_norm: r.q_norm.as_ref().map(|b| b.ptr()),
                        k_norm: r.k_norm.as_ref().map(|b| b.ptr()),
                        eps: r.eps,
                        style: r.style,
                        n_rot: r.n_rot,
                        inv_freq: r.inv_freq.ptr(),
                        positions: self.meta_ptr(l.positions),
                        slots: self.meta_ptr(l.slots),
                        k_cache: kv.k.ptr(),
                        v_cache: kv.v.ptr(),
                        n_ctx: self.opts.n_ctx,
                    },
                )
            }
            Step::Attention {
                layer,
                scale,
                window,
                softcap,
                rope,
            } => {
                let kv = &self.kv[*layer];
                let (q, k, v, out) = (
                    self.buf(Buf::Q),
                    kv.k.ptr(),
                    kv.v.ptr(),
                    self.buf(Buf::Attn),
                );
                let (positions, slots) = (self.meta_ptr(l.positions), self.meta_ptr(l.slots));
                let n_ctx = self.opts.n_ctx;
                let Some(fa) = &self.flash else {
                    return self.layers.attention(
                        gpu,
                        &crate::layers::AttentionArgs {
                            q,
                            k_cache: k,
                            v_cache: v,
                            out,
                            m,
                            slots,
                            positions,
                            n_head: c.n_head,
                            n_head_kv: c.n_head_kv,
                            head_dim: c.head_dim,
                            head_dim_v: c.head_dim_v,
                            n_ctx,
                            scale: *scale,
                            window: *window,
                            softcap: *softcap,
                        },
                    );
                };
                let (d, dv, kvh) = (c.head_dim, c.head_dim_v, c.n_head_kv);
                let (flash, q) = match rope.and_then(|r| self.prefill_queries(r, m)) {
                    Some(q16) => (&fa.prefill, q16),
                    None => (&fa.decode, q),
                };
                let args = FlashArgs {
                    q,
                    k,
                    v,
                    out,
                    n_tokens: m,
                    n_head: c.n_head,
                    n_head_kv: kvh,
                    n_ctx,
                    q_stride: [c.n_head * d, d],
                    k_stride: [kvh * n_ctx * d, n_ctx * d, d],
                    v_stride: [kvh * n_ctx * dv, n_ctx * dv, dv],
                    out_stride: [c.n_head * dv, dv],
                    q_pos: positions,
                    q_seq: slots,
                    causal: true,
                    window: *window,
                    softcap: *softcap,
                    scale: *scale,
                    rope: match rope {
                        Some(r) if self.rope_in_attention(m) => self.flash_rope(*r),
                        _ => None,
                    },
                    ..FlashArgs::default()
                };
                // Passes that graphs capture must not upload: one tile per token there.
                let queries = if small {
                    Queries::PerToken
                } else {
                    Queries::Runs(&self.runs)
                };
                // In decode the output projection takes the int8 form from here.
                let width = c.n_head * dv;
                let fuse =
                    small && self.mm.quantizes() && flash.writes_int8(&queries, c.n_head, kvh);
                // A decode-sized pass is captured and replayed at later positions, so its plan
                // must hold for any; a larger one plans for the keys its tokens see (prefill
                // splits the keys only as far as they go).
                let keys = if small {
                    n_ctx
                } else {
                    self.batch_keys.min(n_ctx)
                };
                let max_kv = window.map_or(keys, |w| w.min(keys));
                self.acts
                    .borrow_mut()
                    .written_by(fuse, out, m, width, |int8_out| {
                        let args = FlashArgs { int8_out, ..args };
                        flash.run(gpu, &args, queries, max_kv, &fa.scratch)
                    })
            }
            Step::ResidualNorm {
                post,
                next,
                eps,
                select,
            } => {
                if i > 0 && self.norm_in_product(i - 1, m).is_some() {
                    return Ok(());
                }
                // In decode the products that read the norm take its int8 form from here.
                let normed = self.buf(Buf::Normed);
                let fuse = small && !*select && self.mm.quantizes() && c.n_embd.is_multiple_of(32);
                self.acts
                    .borrow_mut()
                    .written_by(fuse, normed, m, c.n_embd, |quantized| {
                        self.layers.add_rms_norm(
                            gpu,
                            self.buf(Buf::Residual),
                            self.buf(Buf::Out),
                            post.as_ref().map(|b| b.ptr()),
                            next.ptr(),
                            normed,
                            m,
                            c.n_embd,
                            *eps,
                            quantized,
                        )
                    })?;
                if *select {
                    self.layers.gather_rows(
                        gpu,
                        self.buf(Buf::Normed),
                        self.selected.ptr(),
                        self.meta_ptr(l.outputs),
                        n_out,
                        c.n_embd,
                    )?;
                }
                Ok(())
            }
            Step::Logits { w, softcap } => {
                let w = self.matrix(*w);
                let n_vocab = c.n_vocab;
                if n_out <= gpu.chip.gemv_max_m {
                    self.acts.borrow_mut().prepare(
                        gpu,
                        &self.mm,
                        self.selected.ptr(),
                        c.n_embd,
                        n_out,
                        c.n_embd,
                    )?;
                    if let Some(target) = self.argmax_in_product(pick, n_out) {
                        return crate::matmul::gemv_argmax(
                            gpu,
                            &self.mm,
                            w,
                            &self.acts.borrow(),
                            &target,
                        );
                    }
                    crate::matmul::gemv(
                        gpu,
                        &self.mm,
                        w,
                        &self.acts.borrow(),
                        n_out,
                        self.logits_dev.ptr(),
                        n_vocab,
                        None,
                    )?;
                } else {
                    crate::gemm::gemm(
                        gpu,
                        &self.gemm,
                        w,
                        self.selected.ptr(),
                        c.n_embd,
                        n_out,
                        self.logits_dev.ptr(),
                        n_vocab,
                        None,
                        &self.gemm_x,
                    )?;
                }
                if let Some(cap) = softcap {
                    self.layers
                        .softcap(gpu, self.logits_dev.ptr(), n_out * n_vocab, *cap)?;
                }
                Ok(())
            }
        }
    }

    /// The chain's state on the device, for the kernel that chooses its token.
    fn chain_state(&self) -> Chain {
        Chain {
            positions: self.meta_ptr(self.meta_layout.positions),
            out: self.chain_out.ptr(),
            count: self.chain_counter.ptr(),
        }
    }

    /// Where the output product chooses the token itself (`matmul::gemv_argmax`, the chip
    /// config's `gemv_argmax`): a greedy chain's single output row, its logits not soft-capped
    /// (the cap is applied to the written logits). No logits are written then.
    fn argmax_in_product(&self, pick: Pick, n_out: usize) -> Option<ArgmaxTarget> {
        let capped = self.model.arch.final_softcap.is_some();
        (pick == Pick::Argmax && n_out == 1 && !capped && self.gpu.chip.gemv_argmax).then(|| {
            ArgmaxTarget {
                out: self.meta_ptr(self.meta_layout.tokens),
                chain: self.chain_state(),
                scratch: self.argmax_scratch.ptr(),
            }
        })
    }

    /// Launches the pass, plus the device-side token choice `pick`, which also records the
    /// token in the chain and moves the position on.
    fn launch_all(&mut self, m: usize, n_out: usize, pick: Pick) -> Result<(), CudaError> {
        self.launch_pass(m, n_out, pick)?;
        if self.argmax_in_product(pick, n_out).is_some() {
            return Ok(());
        }
        let chain = self.chain_state();
        let l = &self.meta_layout;
        let (logits, n_vocab, token) = (
            self.logits_dev.ptr(),
            self.model.config.n_vocab,
            self.meta_ptr(l.tokens),
        );
        match pick {
            Pick::Logits => Ok(()),
            Pick::Argmax => self
                .sampler
                .argmax(&self.gpu, logits, 1, n_vocab, token, Some(&chain)),
            Pick::Sample { exact } => {
                let state = self.chain_sampler.as_ref().ok_or_else(|| {
                    CudaError::Unsupported("a sampled chain without its parameters".into())
                })?;
                self.sampler
                    .sample_chain(&self.gpu, logits, n_vocab, state, token, exact, &chain)
            }
        }
    }

    /// Runs the pass for the metadata already on the device, replaying a captured graph when
    /// the pass is decode-sized.
    fn run(&mut self, m: usize, n_out: usize, pick: Pick) -> Result<(), CudaError> {
        let graphable = self.use_graphs
            && self.op_times.is_none()
            && m <= self.gpu.chip.gemv_max_m
            && n_out <= self.gpu.chip.gemv_max_m;
        if !graphable {
            return self.launch_all(m, n_out, pick);
        }
        let key = (m, n_out, pick, self.one_per_slot);
        if !self.graphs.contains_key(&key) {
            let stream = self.gpu.stream().clone();
            stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(|e| CudaError::driver("starting graph capture", e))?;
            self.gpu.set_dependent_launch(true);
            let launched = self.launch_all(m, n_out, pick);
            self.gpu.set_dependent_launch(false);
            let graph = stream
                .end_capture(CUgraphInstantiate_flags(0))
                .map_err(|e| CudaError::driver("ending graph capture", e))?;
            launched?;
            let graph = graph
                .ok_or_else(|| CudaError::Unsupported("graph capture gave no graph".into()))?;
            self.graphs.insert(key, Graph(graph));
        }
        self.gpu.bind()?;
        self.graphs[&key]
            .0
            .launch()
            .map_err(|e| CudaError::driver("replaying a decode graph", e))
    }

    /// Refuses a chain of `n` tokens fed with `token` at `pos` in `slot` that does not fit.
    fn check_chain(
        &self,
        slot: usize,
        token: u32,
        pos: usize,
        n: usize,
    ) -> Result<(), EngineError> {
        if n > self.opts.n_ctx.saturating_sub(pos)
            || slot >= self.opts.n_slots
            || token as usize >= self.model.config.n_vocab
        {
            return Err(EngineError::BadBatch(format!(
                "chain of {n} from position {pos} in slot {slot} does not fit"
            )));
        }
        Ok(())
    }

    /// Feeds `token` at `pos` in `slot`, then each token chosen by `pick`, for `n` passes.
    fn chain(
        &mut self,
        slot: usize,
        token: u32,
        pos: usize,
        n: usize,
        pick: Pick,
    ) -> Result<Vec<u32>, CudaError> {
        let batch = Batch {
            tokens: &[token],
            positions: &[pos as u32],
            slots: &[slot as u32],
            outputs: &[0],
        };
        self.upload_meta(&batch)?;
        self.host_logits = HostLogits::Spent;
        self.drawable = 0;
        self.gpu.write(&self.chain_counter, 0, &[0u32])?;
        for _ in 0..n {
            self.run(1, 1, pick)?;
        }
        let mut tokens = vec![0u32; n];
        self.gpu.read(&self.chain_out, 0, &mut tokens)?;
        Ok(tokens)
    }
}

impl Backend for CudaBackend {
    fn describe(&self) -> String {
        format!(
            "CUDA, {} ({} SMs, {})",
            self.gpu.chip.name, self.gpu.chip.sm_count, self.gpu.chip.arch
        )
    }

    fn max_batch(&self) -> usize {
        self.opts.max_batch
    }

    fn n_ctx(&self) -> usize {
        self.opts.n_ctx
    }

    fn n_slots(&self) -> usize {
        self.opts.n_slots
    }

    fn forward(&mut self, batch: &Batch) -> Result<(), EngineError> {
        batch.check(
            self.opts.max_batch,
            self.model.config.n_vocab,
            self.opts.n_slots,
            self.opts.n_ctx,
        )?;
        let (m, n_out) = (batch.tokens.len(), batch.outputs.len());
        self.upload_meta(batch).map_err(backend_err)?;
        self.host_logits = HostLogits::Spent;
        self.drawable = 0;
        self.run(m, n_out, Pick::Logits).map_err(backend_err)?;
        self.host_logits = HostLogits::OnDevice(n_out);
        self.drawable = n_out;
        Ok(())
    }

    fn logits(&mut self) -> Result<&[f32], EngineError> {
        match self.host_logits {
            HostLogits::Read => {}
            HostLogits::OnDevice(n_out) => {
                self.logits.resize(n_out * self.model.config.n_vocab, 0.0);
                self.gpu
                    .read(&self.logits_dev, 0, &mut self.logits)
                    .map_err(backend_err)?;
                self.host_logits = HostLogits::Read;
            }
            HostLogits::Spent => {
                return Err(EngineError::Backend(
                    "the last pass's logits were used on the device before being read".into(),
                ))
            }
        }
        Ok(&self.logits)
    }

    fn chain_lengths(&self) -> Option<(usize, usize)> {
        let c = &self.gpu.chip;
        Some((c.first_chain.max(1), c.chain.max(1)))
    }

    /// Feeds `token` at `pos`, then each argmax (chosen on the device) at the following
    /// positions; the host reads the `n` tokens back once.
    fn greedy_chain(
        &mut self,
        slot: usize,
        token: u32,
        pos: usize,
        n: usize,
    ) -> Result<Vec<u32>, EngineError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        self.check_chain(slot, token, pos, n)?;
        self.chain(slot, token, pos, n, Pick::Argmax)
            .map_err(backend_err)
    }

    fn samples_on_device(&self, params: &SamplerParams) -> bool {
        params.penalty_last_n <= MAX_WINDOW
    }

    /// Sets the sampler's row to `params`, a penalty window of `recent` and the step of the
    /// position drawn first (`pos + 1`), then chains as [`Backend::greedy_chain`] with the
    /// sampler in place of the argmax (and the exact path's launches where `params` need
    /// them, a graph of their own).
    fn sampled_chain(
        &mut self,
        slot: usize,
        token: u32,
        pos: usize,
        n: usize,
        params: &SamplerParams,
        recent: &[u32],
    ) -> Result<Vec<u32>, EngineError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        self.check_chain(slot, token, pos, n)?;
        let n_vocab = self.model.config.n_vocab;
        let state = match &mut self.chain_sampler {
            Some(s) => s,
            None => self
                .chain_sampler
                .insert(SamplerState::new(&self.gpu, 1, MAX_WINDOW).map_err(backend_err)?),
        };
        state
            .set_params_at(0, params, recent, pos as u64 + 1)
            .map_err(backend_err)?;
        let exact = state.needs_exact_launches(1, n_vocab);
        self.chain(slot, token, pos, n, Pick::Sample { exact })
            .map_err(backend_err)
    }

    /// Sets a sampler row per draw, then draws each run of consecutive output rows in one
    /// launch (a run of rows with its run of sampler rows) and reads the tokens back once.
    fn draw(&mut self, draws: &[Draw]) -> Result<Vec<u32>, EngineError> {
        if draws.is_empty() {
            return Ok(Vec::new());
        }
        let ascending = draws.windows(2).all(|w| w[0].row < w[1].row);
        if !ascending || draws[draws.len() - 1].row >= self.drawable {
            return Err(EngineError::BadBatch(format!(
                "draws from rows {:?} of a pass whose {} output rows can be drawn from",
                draws.iter().map(|d| d.row).collect::<Vec<_>>(),
                self.drawable
            )));
        }
        if let Some(d) = draws.iter().find(|d| !self.samples_on_device(d.params)) {
            return Err(EngineError::BadBatch(format!(
                "no device draw with {:?}",
                d.params
            )));
        }
        self.drawable = 0;
        if self.host_logits != HostLogits::Read {
            self.host_logits = HostLogits::Spent;
        }
        self.draw_rows(draws).map_err(backend_err)
    }
}

impl CudaBackend {
    fn draw_rows(&mut self, draws: &[Draw]) -> Result<Vec<u32>, CudaError> {
        let n = draws.len();
        if self.draws.as_ref().is_none_or(|d| d.state.n_rows() < n) {
            // A row per slot (a batched decode step's draws) from the first draw on.
            let rows = n.max(self.opts.n_slots.min(self.opts.max_batch));
            self.draws = Some(Draws {
                state: SamplerState::new(&self.gpu, rows, MAX_WINDOW)?,
                out: self.gpu.alloc(rows * 4)?,
            });
        }
        let Draws { state, out } = self.draws.as_mut().expect("made above");
        let rows: Vec<RowSetup> = draws
            .iter()
            .map(|d| RowSetup {
                params: d.params,
                history: d.recent,
                step: d.step,
            })
            .collect();
        state.set_rows(0, &rows)?;
        let n_vocab = self.model.config.n_vocab;
        let mut start = 0;
        while start < n {
            let mut end = start + 1;
            while end < n && draws[end].row == draws[end - 1].row + 1 {
                end += 1;
            }
            self.sampler.sample_rows(
                &self.gpu,
                self.logits_dev.at(draws[start].row * n_vocab * 4),
                end - start,
                n_vocab,
                state,
                start,
                out.at(start * 4),
            )?;
            start = end;
        }
        let mut tokens = vec![0u32; n];
        self.gpu.read(out, 0, &mut tokens)?;
        Ok(tokens)
    }
}

/// Lowers the plan to fused steps; returns them with a label each.
fn lower(
    model: &Model,
    f32_weight: &dyn Fn(akunu_core::WeightId) -> Result<DeviceBuffer, CudaError>,
    gpu: &Gpu,
) -> Result<(Vec<Step>, Vec<String>), CudaError> {
    let ops = &model.plan.ops;
    let names = &model.plan.labels;
    let mut steps = Vec::new();
    let mut labels = Vec::new();
    let order = |i: usize, what: &str| {
        CudaError::Unsupported(format!(
            "the CUDA backend expects {what} at op {i} ({})",
            names.get(i).map_or("end", String::as_str)
        ))
    };
    let mut i = 0;
    while i < ops.len() {
        let label = names[i].clone();
        match &ops[i] {
            Op::Embed { table, scale } => {
                steps.push(Step::Embed {
                    table: table.0 as usize,
                    scale: *scale,
                });
                labels.push(label);
                i += 1;
            }
            Op::RmsNorm {
                src: Buf::Residual,
                dst: Buf::Normed,
                weight,
                group,
                eps,
            } => {
                steps.push(Step::Norm {
                    src: Buf::Residual,
                    dst: Buf::Normed,
                    weight: f32_weight(*weight)?,
                    group: *group,
                    eps: *eps,
                });
                labels.push(label);
                i += 1;
            }
            Op::MatMul { src, .. } => {
                let src = *src;
                let mut j = i;
                let mut items = Vec::new();
                while let Some(Op::MatMul {
                    weight,
                    bias,
                    src: s,
                    dst,
                }) = ops.get(j)
                {
                    if *s != src {
                        break;
                    }
                    items.push(Product {
                        w: weight.0 as usize,
                        bias: bias.map(f32_weight).transpose()?,
                        dst: *dst,
                    });
                    j += 1;
                }
                let joined = names[i..j]
                    .iter()
                    .map(|n| n.rsplit('.').next().unwrap_or(n))
                    .collect::<Vec<_>>()
                    .join("+");
                let prefix = label.rsplit_once('.').map_or("", |(p, _)| p);
                let label = if prefix.is_empty() {
                    joined
                } else {
                    format!("{prefix}.{joined}")
                };
                let gated = match (items.as_slice(), ops.get(j)) {
                    ([g, u], Some(Op::GatedActivation { act }))
                        if g.dst == Buf::Gate
                            && u.dst == Buf::Up
                            && g.bias.is_none()
                            && u.bias.is_none() =>
                    {
                        Some((g.w, u.w, *act))
                    }
                    _ => None,
                };
                if let Some((gate, up, act)) = gated {
                    steps.push(Step::Gated { src, gate, up, act });
                    labels.push(format!("{label}+act"));
                    i = j + 1;
                } else {
                    steps.push(Step::Products { src, items });
                    labels.push(label);
                    i = j;
                }
            }
            Op::RmsNorm { src: Buf::Q, .. } | Op::Rope { .. } => {
                let mut j = i;
                let mut q_norm = None;
                let mut k_norm = None;
                let mut eps = 1e-6;
                while let Some(Op::RmsNorm {
                    src,
                    dst,
                    weight,
                    group,
                    eps: e,
                }) = ops.get(j)
                {
                    if src != dst || *group != model.config.head_dim {
                        return Err(order(j, "a per-head QK-norm"));
                    }
                    match src {
                        Buf::Q => q_norm = Some(f32_weight(*weight)?),
                        Buf::K => k_norm = Some(f32_weight(*weight)?),
                        _ => return Err(order(j, "a QK-norm of Q or K")),
                    }
                    eps = *e;
                    j += 1;
                }
                match (ops.get(j), ops.get(j + 1), ops.get(j + 2)) {
                    (
                        Some(Op::Rope { buf: Buf::Q, rope }),
                        Some(Op::Rope {
                            buf: Buf::K,
                            rope: rk,
                        }),
                        Some(Op::StoreKv { layer }),
                    ) if rope == rk && rope.head_dim == model.config.head_dim => {
                        steps.push(Step::QkRopeStore {
                            layer: *layer,
                            rope: LayerRope {
                                q_norm,
                                k_norm,
                                eps,
                                style: rope.style,
                                n_rot: rope.n_rot,
                                inv_freq: gpu.upload(&rope.inv_freq)?,
                            },
                        });
                        labels.push(format!("blk.{layer}.qk_rope_kv"));
                    }
                    _ => return Err(order(j, "RoPE of Q and K, then the KV store")),
                }
                i = j + 3;
            }
            Op::Attention {
                layer,
                scale,
                window,
                softcap,
            } => {
                let rope = match steps.last() {
                    Some(Step::QkRopeStore { layer: l, .. }) if l == layer => Some(steps.len() - 1),
                    _ => None,
                };
                steps.push(Step::Attention {
                    layer: *layer,
                    scale: *scale,
                    window: *window,
                    softcap: *softcap,
                    rope,
                });
                labels.push(label);
                i += 1;
            }
            Op::RmsNorm { src: Buf::Out, .. } | Op::AddResidual { .. } => {
                let mut j = i;
                let mut post = None;
                let mut eps = None;
                if let Op::RmsNorm {
                    src: Buf::Out,
                    dst: Buf::Out,
                    weight,
                    eps: e,
                    ..
                } = &ops[j]
                {
                    post = Some(f32_weight(*weight)?);
                    eps = Some(*e);
                    j += 1;
                }
                if !matches!(ops.get(j), Some(Op::AddResidual { src: Buf::Out })) {
                    return Err(order(j, "the residual add of the block output"));
                }
                j += 1;
                let select = matches!(ops.get(j), Some(Op::SelectOutputs));
                if select {
                    j += 1;
                }
                let Some(Op::RmsNorm {
                    src: Buf::Residual,
                    dst: Buf::Normed,
                    weight,
                    eps: e,
                    ..
                }) = ops.get(j)
                else {
                    return Err(order(j, "a norm after the residual add"));
                };
                if eps.is_some_and(|p| p != *e) {
                    return Err(order(j, "one epsilon for the fused norms"));
                }
                steps.push(Step::ResidualNorm {
                    post,
                    next: f32_weight(*weight)?,
                    eps: *e,
                    select,
                });
                labels.push(format!(
                    "{label}+{}",
                    names[j].rsplit('.').next().unwrap_or("")
                ));
                i = j + 1;
            }
            Op::Logits { weight, softcap } => {
                steps.push(Step::Logits {
                    w: weight.0 as usize,
                    softcap: *softcap,
                });
                labels.push(label);
                i += 1;
            }
            _ => return Err(order(i, "an op this backend fuses")),
        }
    }
    Ok((steps, labels))
}
