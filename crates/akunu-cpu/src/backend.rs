//! The CPU backend: executes the plan over memory-mapped weights on a rayon pool.
//!
//! Plan: at creation, lower every op once (norm weights and biases converted to f32, weight
//! views resolved to byte ranges of the map, RoPE tables copied) and allocate the scratch rows
//! for the largest batch and the f16 KV cache of every slot (zeroed pages, so memory is only
//! touched as positions fill; a size the allocator refuses, or a cache larger than the
//! machine's memory, is an error, not an abort). A pass then walks the lowered ops in order.
//! Matrix products quantize their input rows once per buffer (reused by q/k/v and gate/up,
//! which read the same rows) and split output rows over the pool; row-wise ops run in parallel
//! when the batch is large enough to pay for it; attention runs one (token, head) pair per
//! task.
//!
//! A token's arithmetic does not depend on what else is in the pass: products are batch
//! invariant (see [`crate::quant`]), row-wise ops work on each row alone, and attention reads
//! only the token's query and its own slot's cache. So a sequence gets the same logits, to the
//! bit, alone or batched with other slots' decode tokens and prompt chunks, and whatever the
//! prompt's split into passes.

use std::sync::Arc;

use akunu_core::backend::{kv_cache_advice, kv_cache_name};
use akunu_core::plan::Rope;
use akunu_core::{Activation, Backend, Batch, Buf, EngineError, Model, Op};
use rayon::prelude::*;

use crate::ops;
use crate::quant::{self, Activations, WeightMatrix};

/// How the backend is sized.
#[derive(Clone, Debug)]
pub struct CpuOptions {
    /// Positions per slot.
    pub n_ctx: usize,
    pub n_slots: usize,
    /// Most tokens per pass.
    pub max_batch: usize,
    pub threads: usize,
}

/// Rows below which row-wise ops stay on the calling thread.
const PAR_ROWS: usize = 8;

enum Lowered {
    Embed {
        w: usize,
        scale: f32,
    },
    RmsNorm {
        src: Buf,
        dst: Buf,
        weight: Vec<f32>,
        group: usize,
        eps: f32,
    },
    /// Products of one input with several weights (q/k/v, gate/up) that share its prepared
    /// activations; they run concurrently, so a decode step waits on fewer joins.
    MatMuls {
        src: Buf,
        items: Vec<Product>,
    },
    Rope {
        buf: Buf,
        rope: Rope,
    },
    StoreKv {
        layer: usize,
    },
    Attention {
        layer: usize,
        scale: f32,
        window: Option<usize>,
        softcap: Option<f32>,
    },
    Gated {
        act: Activation,
    },
    AddResidual {
        src: Buf,
    },
    SelectOutputs,
    Logits {
        w: usize,
        softcap: Option<f32>,
    },
}

struct Product {
    w: usize,
    bias: Option<Vec<f32>>,
    dst: Buf,
}

/// One layer's cache: `[slot][kv_head][position][dim]` f16 bit patterns for K and for V.
struct LayerKv {
    k: Vec<u16>,
    v: Vec<u16>,
}

pub struct CpuBackend {
    model: Arc<Model>,
    opts: CpuOptions,
    pool: Arc<rayon::ThreadPool>,
    ops: Vec<Lowered>,
    /// What each lowered op computes, for profiles (`blk.3.attn_q+attn_k+attn_v`).
    labels: Vec<String>,
    /// Scratch rows per [`Buf`], `max_batch * width` each.
    bufs: Vec<Vec<f32>>,
    widths: Vec<usize>,
    acts: Activations,
    /// Which buffer `acts` holds (prepared for the types it [`Activations::serves`]).
    acts_of: Option<Buf>,
    kv: Vec<LayerKv>,
    logits: Vec<f32>,
    /// Per-task attention scratch, one per pool thread.
    attn_scratch: Vec<std::sync::Mutex<Vec<f32>>>,
    rope_scratch: Vec<f32>,
    /// Accumulated time per op when profiling is on.
    op_times: Option<Vec<std::time::Duration>>,
}

impl CpuBackend {
    pub fn new(model: Arc<Model>, opts: CpuOptions) -> Result<CpuBackend, EngineError> {
        if opts.n_ctx == 0 || opts.n_slots == 0 || opts.max_batch == 0 || opts.threads == 0 {
            return Err(EngineError::Backend(format!(
                "context {}, slots {}, batch {} and threads {} must all be positive",
                opts.n_ctx, opts.n_slots, opts.max_batch, opts.threads
            )));
        }
        let c = &model.config;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(opts.threads)
            .build()
            .map_err(|e| EngineError::Backend(format!("thread pool: {e}")))?;
        let pool = Arc::new(pool);
        let mut lowered = Vec::with_capacity(model.plan.ops.len());
        let mut labels: Vec<String> = Vec::with_capacity(model.plan.ops.len());
        for (op, label) in model.plan.ops.iter().zip(&model.plan.labels) {
            let f32s = |id| {
                model
                    .weight_f32(id)
                    .map_err(|e| EngineError::Backend(e.to_string()))
            };
            let next = match op {
                Op::Embed { table, scale } => Lowered::Embed {
                    w: table.0 as usize,
                    scale: *scale,
                },
                Op::RmsNorm {
                    src,
                    dst,
                    weight,
                    group,
                    eps,
                } => Lowered::RmsNorm {
                    src: *src,
                    dst: *dst,
                    weight: f32s(*weight)?,
                    group: *group,
                    eps: *eps,
                },
                Op::MatMul {
                    weight,
                    bias,
                    src,
                    dst,
                } => {
                    let ty = matrix(&model, weight.0 as usize)?.ty();
                    let item = Product {
                        w: weight.0 as usize,
                        bias: bias.map(f32s).transpose()?,
                        dst: *dst,
                    };
                    if let Some(Lowered::MatMuls { src: prev, items }) = lowered.last_mut() {
                        let first = &model.weights()[items[0].w];
                        if prev == src && quant::share_activations(first.ty, ty) {
                            items.push(item);
                            if let Some(l) = labels.last_mut() {
                                l.push('+');
                                l.push_str(label.rsplit('.').next().unwrap_or(label));
                            }
                            continue;
                        }
                    }
                    Lowered::MatMuls {
                        src: *src,
                        items: vec![item],
                    }
                }
                Op::Rope { buf, rope } => Lowered::Rope {
                    buf: *buf,
                    rope: rope.clone(),
                },
                Op::StoreKv { layer } => Lowered::StoreKv { layer: *layer },
                Op::Attention {
                    layer,
                    scale,
                    window,
                    softcap,
                } => Lowered::Attention {
                    layer: *layer,
                    scale: *scale,
                    window: *window,
                    softcap: *softcap,
                },
                Op::GatedActivation { act } => Lowered::Gated { act: *act },
                Op::AddResidual { src } => Lowered::AddResidual { src: *src },
                Op::SelectOutputs => Lowered::SelectOutputs,
                Op::Logits { weight, softcap } => {
                    matrix(&model, weight.0 as usize)?;
                    Lowered::Logits {
                        w: weight.0 as usize,
                        softcap: *softcap,
                    }
                }
            };
            lowered.push(next);
            labels.push(label.clone());
        }
        let widths: Vec<usize> = Buf::ALL.iter().map(|b| b.width(c)).collect();
        // An absurd batch, context or slot count is an error, not the abort of `vec![0; n]`;
        // the pages are still asked for zeroed, so they are touched only as written.
        let too_big = |what: String, bytes: f64, beyond: &str| {
            EngineError::Backend(format!(
                "{what} needs {:.1} GB, more than {beyond}",
                bytes / 1e9
            ))
        };
        let scratch_err = || {
            let floats = widths.iter().sum::<usize>() as f64 * opts.max_batch as f64;
            too_big(
                format!("scratch for a batch of {}", opts.max_batch),
                floats * 4.0,
                "can be allocated",
            )
        };
        let bufs = widths
            .iter()
            .map(|w| {
                w.checked_mul(opts.max_batch)
                    .and_then(|n| bytemuck::allocation::try_zeroed_vec::<f32>(n).ok())
                    .ok_or_else(scratch_err)
            })
            .collect::<Result<_, _>>()?;
        // f16 keys and values of every layer.
        let cache_bytes = 2.0
            * opts.n_slots as f64
            * c.n_head_kv as f64
            * opts.n_ctx as f64
            * (c.head_dim + c.head_dim_v) as f64
            * c.n_layer as f64;
        let cache_what = || kv_cache_name(opts.n_ctx, opts.n_slots);
        let cache_err = || too_big(cache_what(), cache_bytes, "can be allocated");
        // The zeroed pages are granted lazily, so a cache larger than the machine's memory
        // would be allocated, and the process killed once the context filled it.
        if let Some(memory) = physical_memory().filter(|&m| cache_bytes > m as f64) {
            let beyond = format!(
                "this machine's {:.1} GB of memory; {}",
                memory as f64 / 1e9,
                kv_cache_advice(opts.n_slots),
            );
            return Err(too_big(cache_what(), cache_bytes, &beyond));
        }
        let kv_len = |dim: usize| {
            opts.n_slots
                .checked_mul(c.n_head_kv)
                .and_then(|n| n.checked_mul(opts.n_ctx))
                .and_then(|n| n.checked_mul(dim))
                .ok_or_else(cache_err)
        };
        let (k_len, v_len) = (kv_len(c.head_dim)?, kv_len(c.head_dim_v)?);
        let zeroed = |n| bytemuck::allocation::try_zeroed_vec::<u16>(n).map_err(|()| cache_err());
        let kv = (0..c.n_layer)
            .map(|_| {
                Ok(LayerKv {
                    k: zeroed(k_len)?,
                    v: zeroed(v_len)?,
                })
            })
            .collect::<Result<_, EngineError>>()?;
        let attn_scratch = (0..opts.threads)
            .map(|_| std::sync::Mutex::new(Vec::new()))
            .collect();
        Ok(CpuBackend {
            model,
            opts,
            pool,
            ops: lowered,
            labels,
            bufs,
            widths,
            acts: Activations::new(),
            acts_of: None,
            kv,
            logits: Vec::new(),
            attn_scratch,
            rope_scratch: Vec::new(),
            op_times: None,
        })
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Starts (or stops) timing every op; times accumulate over passes.
    pub fn set_profiling(&mut self, on: bool) {
        self.op_times = on.then(|| vec![std::time::Duration::ZERO; self.ops.len()]);
    }

    /// A label per lowered op, in execution order.
    pub fn op_labels(&self) -> &[String] {
        &self.labels
    }

    /// Time spent in each lowered op since profiling was turned on.
    pub fn op_times(&self) -> Option<&[std::time::Duration]> {
        self.op_times.as_deref()
    }

    fn run(&mut self, batch: &Batch) -> Result<(), EngineError> {
        let mut rows = batch.tokens.len();
        self.acts_of = None;
        let ops = std::mem::take(&mut self.ops);
        let mut result = Ok(());
        for (i, op) in ops.iter().enumerate() {
            if rows == 0 {
                self.logits.clear();
                break;
            }
            let started = self.op_times.is_some().then(std::time::Instant::now);
            let step = self.exec(op, batch, &mut rows);
            if let (Some(t), Some(times)) = (started, self.op_times.as_mut()) {
                times[i] += t.elapsed();
            }
            match step {
                Ok(written) => {
                    // Quantized rows go stale when their buffer is rewritten, and all of them
                    // when the row set shrinks to the outputs.
                    let stale = matches!(op, Lowered::SelectOutputs)
                        || matches!((self.acts_of, written), (Some(held), Some(w)) if held == w);
                    if stale {
                        self.acts_of = None;
                    }
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.ops = ops;
        result
    }

    /// Executes one op; returns the buffer it wrote, if any.
    fn exec(
        &mut self,
        op: &Lowered,
        batch: &Batch,
        rows: &mut usize,
    ) -> Result<Option<Buf>, EngineError> {
        let n = *rows;
        let model = self.model.clone();
        let c = &model.config;
        let par = n >= PAR_ROWS;
        match op {
            Lowered::Embed { w, scale } => {
                let m = matrix(&model, *w)?;
                let width = c.n_embd;
                let out = &mut self.bufs[Buf::Residual as usize][..n * width];
                let scale = *scale;
                let embed_row = |(t, row): (usize, &mut [f32])| {
                    let tok = batch.tokens[t] as usize;
                    // Rows and types were validated when the backend was built.
                    let _ = quant::dequantize_row(m.ty(), m.row(tok), row);
                    if scale != 1.0 {
                        row.iter_mut().for_each(|x| *x *= scale);
                    }
                };
                if par {
                    self.pool
                        .install(|| out.par_chunks_mut(width).enumerate().for_each(embed_row));
                } else {
                    out.chunks_mut(width).enumerate().for_each(embed_row);
                }
                Ok(Some(Buf::Residual))
            }
            Lowered::RmsNorm {
                src,
                dst,
                weight,
                group,
                eps,
            } => {
                let (src, dst, group, eps) = (*src, *dst, *group, *eps);
                let width = self.widths[dst as usize];
                if src == dst {
                    let buf = &mut self.bufs[dst as usize][..n * width];
                    let f = |g: &mut [f32]| ops::rms_norm_inplace(g, weight, eps);
                    if par {
                        self.pool.install(|| buf.par_chunks_mut(group).for_each(f));
                    } else {
                        buf.chunks_mut(group).for_each(f);
                    }
                } else {
                    let mut out = std::mem::take(&mut self.bufs[dst as usize]);
                    let inp = &self.bufs[src as usize][..n * width];
                    let f = |(o, x): (&mut [f32], &[f32])| ops::rms_norm(x, weight, eps, o);
                    if par {
                        self.pool.install(|| {
                            out[..n * width]
                                .par_chunks_mut(group)
                                .zip(inp.par_chunks(group))
                                .for_each(f)
                        });
                    } else {
                        out[..n * width]
                            .chunks_mut(group)
                            .zip(inp.chunks(group))
                            .for_each(f);
                    }
                    self.bufs[dst as usize] = out;
                }
                Ok(Some(dst))
            }
            Lowered::MatMuls { src, items } => {
                let src = *src;
                let first = matrix(&model, items[0].w)?;
                self.product(&first, src, n);
                let acts = &self.acts;
                let mut outs: Vec<(Vec<f32>, &Product)> = items
                    .iter()
                    .map(|p| (std::mem::take(&mut self.bufs[p.dst as usize]), p))
                    .collect();
                let widths = &self.widths;
                let run = |(out, p): &mut (Vec<f32>, &Product)| -> Result<(), EngineError> {
                    let m = matrix(&model, p.w)?;
                    let width = widths[p.dst as usize];
                    let out = &mut out[..n * width];
                    quant::matmul(&m, acts, out, width)
                        .map_err(|e| EngineError::Backend(e.to_string()))?;
                    if let Some(b) = &p.bias {
                        for row in out.chunks_mut(width) {
                            row.iter_mut().zip(b).for_each(|(x, b)| *x += b);
                        }
                    }
                    Ok(())
                };
                let results: Vec<Result<(), EngineError>> = if outs.len() == 1 {
                    vec![self.pool.install(|| run(&mut outs[0]))]
                } else {
                    self.pool.install(|| outs.par_iter_mut().map(run).collect())
                };
                let mut written = None;
                for (out, p) in outs {
                    self.bufs[p.dst as usize] = out;
                    written = Some(p.dst);
                }
                results.into_iter().collect::<Result<Vec<()>, _>>()?;
                // Every destination differs from the source, so `acts` stays valid.
                Ok(written)
            }
            Lowered::Rope { buf, rope } => {
                let buf = *buf;
                let width = self.widths[buf as usize];
                let data = &mut self.bufs[buf as usize][..n * width];
                let cs = &mut self.rope_scratch;
                cs.resize(rope.inv_freq.len() * 2, 0.0);
                for (t, row) in data.chunks_mut(width).enumerate() {
                    ops::rope_angles(batch.positions[t], &rope.inv_freq, cs);
                    for head in row.chunks_mut(rope.head_dim) {
                        ops::rope_head(head, rope.n_rot, rope.style, cs);
                    }
                }
                Ok(Some(buf))
            }
            Lowered::StoreKv { layer } => {
                let (hk, d, dv, n_ctx) = (c.n_head_kv, c.head_dim, c.head_dim_v, self.opts.n_ctx);
                let kv = &mut self.kv[*layer];
                let kbuf = &self.bufs[Buf::K as usize];
                let vbuf = &self.bufs[Buf::V as usize];
                for t in 0..n {
                    let (slot, pos) = (batch.slots[t] as usize, batch.positions[t] as usize);
                    for g in 0..hk {
                        let at = (slot * hk + g) * n_ctx + pos;
                        ops::store_f16(
                            &kbuf[(t * hk + g) * d..(t * hk + g + 1) * d],
                            &mut kv.k[at * d..(at + 1) * d],
                        );
                        ops::store_f16(
                            &vbuf[(t * hk + g) * dv..(t * hk + g + 1) * dv],
                            &mut kv.v[at * dv..(at + 1) * dv],
                        );
                    }
                }
                Ok(None)
            }
            Lowered::Attention {
                layer,
                scale,
                window,
                softcap,
            } => {
                // Queries meet the f16 cache at f16 precision, as in llama.cpp's and the GPU's
                // attention kernels, so all of them see the same scores.
                let w = self.widths[Buf::Q as usize];
                ops::round_to_f16(&mut self.bufs[Buf::Q as usize][..n * w]);
                self.attention(*layer, *scale, *window, *softcap, batch, n);
                Ok(Some(Buf::Attn))
            }
            Lowered::Gated { act } => {
                let act = *act;
                let width = c.n_ff;
                let mut gate = std::mem::take(&mut self.bufs[Buf::Gate as usize]);
                let up = &self.bufs[Buf::Up as usize][..n * width];
                let f = |(g, u): (&mut [f32], &[f32])| ops::gated_activation(act, g, u);
                if par {
                    self.pool.install(|| {
                        gate[..n * width]
                            .par_chunks_mut(width)
                            .zip(up.par_chunks(width))
                            .for_each(f)
                    });
                } else {
                    f((&mut gate[..n * width], up));
                }
                self.bufs[Buf::Gate as usize] = gate;
                Ok(Some(Buf::Gate))
            }
            Lowered::AddResidual { src } => {
                let width = c.n_embd;
                let mut res = std::mem::take(&mut self.bufs[Buf::Residual as usize]);
                let add = &self.bufs[*src as usize][..n * width];
                res[..n * width]
                    .iter_mut()
                    .zip(add)
                    .for_each(|(r, a)| *r += a);
                self.bufs[Buf::Residual as usize] = res;
                Ok(Some(Buf::Residual))
            }
            Lowered::SelectOutputs => {
                let width = c.n_embd;
                let res = &mut self.bufs[Buf::Residual as usize];
                for (dst, &src) in batch.outputs.iter().enumerate() {
                    let src = src as usize;
                    if src != dst {
                        res.copy_within(src * width..(src + 1) * width, dst * width);
                    }
                }
                *rows = batch.outputs.len();
                Ok(Some(Buf::Residual))
            }
            Lowered::Logits { w, softcap } => {
                let softcap = *softcap;
                let m = matrix(&model, *w)?;
                self.product(&m, Buf::Normed, n);
                let n_vocab = c.n_vocab;
                self.logits.resize(n * n_vocab, 0.0);
                let (acts, out) = (&self.acts, &mut self.logits);
                self.pool
                    .install(|| quant::matmul(&m, acts, out, n_vocab))
                    .map_err(|e| EngineError::Backend(e.to_string()))?;
                if let Some(cap) = softcap {
                    ops::softcap(&mut self.logits, cap);
                }
                Ok(None)
            }
        }
    }

    /// Prepares `acts` to multiply `src`'s first `n` rows by `m`, unless they already hold
    /// those rows in a form `m` can use.
    fn product(&mut self, m: &WeightMatrix, src: Buf, n: usize) {
        if self.acts_of == Some(src) && self.acts.serves(m.ty()) {
            return;
        }
        let width = self.widths[src as usize];
        let x = &self.bufs[src as usize][..n * width];
        let acts = &mut self.acts;
        self.pool.install(|| acts.quantize_for(m.ty(), x, n, width));
        self.acts_of = Some(src);
    }

    fn attention(
        &mut self,
        layer: usize,
        scale: f32,
        window: Option<usize>,
        softcap: Option<f32>,
        batch: &Batch,
        n: usize,
    ) {
        let c = &self.model.config;
        let (nh, hk, d, dv, n_ctx) = (
            c.n_head,
            c.n_head_kv,
            c.head_dim,
            c.head_dim_v,
            self.opts.n_ctx,
        );
        let group = nh / hk;
        let mut out = std::mem::take(&mut self.bufs[Buf::Attn as usize]);
        let q = &self.bufs[Buf::Q as usize];
        let kv = &self.kv[layer];
        let scratch = &self.attn_scratch;
        // One task per (token, key/value head): the group's query heads are adjacent in both
        // the Q and the Attn rows.
        let task = |(i, o): (usize, &mut [f32])| {
            let (t, g) = (i / hk, i % hk);
            let (slot, pos) = (batch.slots[t] as usize, batch.positions[t] as usize);
            let first = match window {
                Some(w) if pos + 1 > w => pos + 1 - w,
                _ => 0,
            };
            let base = (slot * hk + g) * n_ctx;
            let q0 = (t * nh + g * group) * d;
            let heads = ops::AttnGroup {
                q: &q[q0..q0 + group * d],
                heads: group,
                k: &kv.k[(base + first) * d..(base + pos + 1) * d],
                v: &kv.v[(base + first) * dv..(base + pos + 1) * dv],
                scale,
                softcap,
            };
            let idx = rayon::current_thread_index().unwrap_or(0) % scratch.len();
            let mut s = scratch[idx].lock().unwrap_or_else(|e| e.into_inner());
            ops::attend_group(&heads, o, &mut s);
        };
        let items = &mut out[..n * nh * dv];
        if n * hk > 1 {
            self.pool
                .install(|| items.par_chunks_mut(group * dv).enumerate().for_each(task));
        } else {
            items.chunks_mut(group * dv).enumerate().for_each(task);
        }
        self.bufs[Buf::Attn as usize] = out;
    }
}

/// The machine's physical memory in bytes, where the system says.
fn physical_memory() -> Option<u64> {
    #[cfg(unix)]
    {
        // SAFETY: sysconf only reads system constants.
        let (pages, page) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        (pages > 0 && page > 0).then(|| pages as u64 * page as u64)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

fn matrix(model: &Model, w: usize) -> Result<WeightMatrix<'_>, EngineError> {
    let info = &model.weights()[w];
    WeightMatrix::new(
        info.ty,
        model.weight_bytes(akunu_core::WeightId(w as u32)),
        info.rows,
        info.cols,
    )
    .map_err(|e| EngineError::Backend(format!("{}: {e}", info.name)))
}

impl Backend for CpuBackend {
    fn describe(&self) -> String {
        format!(
            "CPU, {} threads, {}",
            self.opts.threads,
            quant::simd_level()
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
        // The pass runs on a pool thread, so the parallel ops inside start on the pool
        // directly instead of each handing work over from the caller's thread and back (a
        // wake-up per op, about 3 ms per decode step on the default model).
        let pool = self.pool.clone();
        pool.install(|| self.run(batch))
    }

    fn logits(&mut self) -> Result<&[f32], EngineError> {
        Ok(&self.logits)
    }
}
