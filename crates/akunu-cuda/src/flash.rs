//! FlashAttention on the GPU (`kernels/flash.cu`): prefill, chunked prefill onto a cache,
//! decode and tree-masked verification, through one launcher.
//!
//! Plan: [`FlashKernels::new`] compiles one module per element type (f16, bf16), head sizes and
//! input/output precision. [`FlashKernels::run`] validates the problem (layout, alignment,
//! sizes) on the host, picks the variant, tiles the queries and the split count, and enqueues:
//!
//! - `flash_decode` (one warp, 16 rows) when every token is its own tile and a token's query
//!   heads fit 16 rows: decode and short batches. Nothing is read from the host per call, so a
//!   captured graph replays as positions advance: each split finds its slice of the keys from
//!   the token's position on the device.
//! - `flash_prefill` (four warps, 64 rows) for runs of tokens of one sequence: tiles of
//!   `64 / group` tokens (the query heads of a KV head are packed as rows), uploaded as a
//!   (first token, count) list, the latest tokens first so the longest tiles start first.
//! - Split-KV when the tiles alone cannot fill the GPU: each split writes normalised partial
//!   rows and their log-sum-exp into the scratch, and `flash_combine` merges them. The split
//!   count is bounded by the scratch, so a launch never fails for lack of it.
//!
//! Masks: causal (`j <= position`, which also covers a query chunk that starts past existing
//! keys), sliding window, the stored length of each sequence, segment ids (packed varlen) and a
//! 64-bit tree mask per token for speculative verification. See `akunu_cpu::flash` for the
//! reference semantics.

use bytemuck::{Pod, Zeroable};

use crate::gpu::{DeviceBuffer, Gpu, Kernel};
use crate::CudaError;

/// Largest split count (`FLASH_MAX_SPLITS` in flash.cu).
pub const MAX_SPLITS: usize = 256;
/// Head sizes the kernels are built for.
pub const HEAD_DIMS: [usize; 4] = [32, 64, 128, 256];
const DECODE_ROWS: usize = 16;
const PREFILL_ROWS: usize = 64;
const COMBINE_THREADS: u32 = 128;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlashDtype {
    F16,
    Bf16,
}

/// One compiled family: element type, head sizes, and whether queries and outputs are f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlashConfig {
    pub dtype: FlashDtype,
    pub head_dim: usize,
    pub head_dim_v: usize,
    /// Queries are f32, rounded to the element type as they are loaded.
    pub q_f32: bool,
    /// Output rows are f32 (else the element type).
    pub out_f32: bool,
    /// Build with the per-step dump of the first block's state (see [`FlashArgs::debug`]).
    pub debug: bool,
}

impl FlashConfig {
    fn defines(&self) -> Vec<(&'static str, String)> {
        let mut d = vec![
            ("HEAD_DIM", self.head_dim.to_string()),
            ("HEAD_DIM_V", self.head_dim_v.to_string()),
            (
                "KV_BF16",
                u8::from(self.dtype == FlashDtype::Bf16).to_string(),
            ),
            ("Q_F32", u8::from(self.q_f32).to_string()),
            ("OUT_F32", u8::from(self.out_f32).to_string()),
        ];
        if self.debug {
            d.push(("FLASH_DEBUG", "1".into()));
        }
        d
    }

    /// Keys per step (`BN` in flash.cu).
    pub fn keys_per_step(&self) -> usize {
        if self.head_dim > 128 || self.head_dim_v > 128 {
            32
        } else {
            64
        }
    }

    /// Floats per step of the debug dump: scores and probabilities [16][BN], running max and
    /// sum [16], unnormalised output [16][head_dim_v].
    pub fn debug_step_floats(&self) -> usize {
        2 * 16 * self.keys_per_step() + 32 + 16 * self.head_dim_v
    }

    fn smem(&self, rows: usize) -> usize {
        let bn = self.keys_per_step();
        rows * self.head_dim * 2 + 2 * bn * (self.head_dim + self.head_dim_v) * 2
    }
}

/// Every module the engine and the benchmark use, for the NVRTC test.
pub fn modules() -> Vec<(&'static str, Vec<(&'static str, String)>)> {
    let mut configs = Vec::new();
    for d in HEAD_DIMS {
        configs.push(FlashConfig {
            dtype: FlashDtype::F16,
            head_dim: d,
            head_dim_v: d,
            q_f32: true,
            out_f32: true,
            debug: false,
        });
    }
    for d in [64, 128] {
        configs.push(FlashConfig {
            dtype: FlashDtype::Bf16,
            head_dim: d,
            head_dim_v: d,
            q_f32: false,
            out_f32: false,
            debug: false,
        });
    }
    configs.push(FlashConfig {
        dtype: FlashDtype::F16,
        head_dim: 128,
        head_dim_v: 128,
        q_f32: false,
        out_f32: false,
        debug: true,
    });
    configs
        .into_iter()
        .map(|c| ("flash.cu", c.defines()))
        .collect()
}

/// One attention problem on the device. Element strides; queries `[token][head][dim]`, K and V
/// `[sequence][kv head][position][dim]`, output `[token][head][dim_v]`.
#[derive(Clone, Copy, Debug, Default)]
pub struct FlashArgs {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub out: u64,
    /// f32 `[token][head]` natural log-sum-exp of each row's scores, or 0.
    pub lse: u64,
    pub n_tokens: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Key capacity per sequence.
    pub n_ctx: usize,
    pub q_stride: [usize; 2],
    pub k_stride: [usize; 3],
    pub v_stride: [usize; 3],
    pub out_stride: [usize; 2],
    /// u32 per token: absolute position and sequence.
    pub q_pos: u64,
    pub q_seq: u64,
    /// u32 per sequence: keys stored, or 0 for `n_ctx` everywhere.
    pub kv_len: u64,
    pub causal: bool,
    pub window: Option<usize>,
    pub softcap: Option<f32>,
    pub scale: f32,
    /// (i32 per token, i32 `[sequence][n_ctx]`): a key is visible only in its query's segment.
    pub segments: Option<(u64, u64)>,
    /// (u64 mask per token, u32 base per token): keys at `base + i` (i < 64) are visible only
    /// where bit i is set.
    pub tree: Option<(u64, u64)>,
    /// With a [`FlashConfig::debug`] build: f32 buffer for `debug_steps` steps of the state of
    /// the first block's first 16 rows (layout in [`FlashConfig::debug_step_floats`]).
    pub debug: u64,
    pub debug_steps: usize,
}

/// How the queries are tiled.
#[derive(Clone, Copy, Debug)]
pub enum Queries<'a> {
    /// Every token its own tile (decode; nothing uploaded, so graph capture is fine).
    PerToken,
    /// Runs (first token, count) of consecutive tokens of one sequence (prefill).
    Runs(&'a [(usize, usize)]),
}

/// Device scratch for split partials and the tile list.
pub struct FlashScratch {
    buf: DeviceBuffer,
}

impl FlashScratch {
    pub fn new(gpu: &Gpu, bytes: usize) -> Result<FlashScratch, CudaError> {
        Ok(FlashScratch {
            buf: gpu.alloc(bytes)?,
        })
    }

    pub fn bytes(&self) -> usize {
        self.buf.bytes()
    }
}

/// The kernel's parameter block; mirrors `FlashParams` in flash.cu field for field.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct FlashParams {
    q: u64,
    k: u64,
    v: u64,
    out: u64,
    lse: u64,
    q_pos: u64,
    q_seq: u64,
    kv_len: u64,
    q_seg: u64,
    k_seg: u64,
    tree_mask: u64,
    tree_base: u64,
    tiles: u64,
    part_o: u64,
    part_lse: u64,
    debug: u64,
    q_tok: i64,
    q_head: i64,
    k_seq: i64,
    k_head: i64,
    k_pos: i64,
    v_seq: i64,
    v_head: i64,
    v_pos: i64,
    o_tok: i64,
    o_head: i64,
    n_tokens: u32,
    n_head: u32,
    n_head_kv: u32,
    n_ctx: u32,
    causal: i32,
    window: i32,
    softcap: f32,
    scale: f32,
    n_split: u32,
    debug_tiles: u32,
}

/// How one call is launched.
struct Launch {
    decode: bool,
    rows: usize,
    tiles: Vec<u32>,
    n_tiles: usize,
    chunks: usize,
    splits: usize,
}

pub struct FlashKernels {
    cfg: FlashConfig,
    prefill: Kernel,
    decode: Kernel,
    combine: Kernel,
    sm_count: usize,
}

fn bad(msg: String) -> CudaError {
    CudaError::Unsupported(msg)
}

fn to_u32(what: &str, v: usize) -> Result<u32, CudaError> {
    u32::try_from(v).map_err(|_| CudaError::Bounds(format!("{what} {v} does not fit 32 bits")))
}

fn to_i64(what: &str, v: usize) -> Result<i64, CudaError> {
    i64::try_from(v).map_err(|_| CudaError::Bounds(format!("{what} {v} does not fit 64 bits")))
}

impl FlashKernels {
    pub fn new(gpu: &Gpu, cfg: FlashConfig) -> Result<FlashKernels, CudaError> {
        for (what, d) in [("head_dim", cfg.head_dim), ("head_dim_v", cfg.head_dim_v)] {
            if d == 0 || d % 16 != 0 || d > 256 {
                return Err(bad(format!(
                    "attention {what} {d}: must be a multiple of 16 up to 256"
                )));
            }
        }
        let defines = cfg.defines();
        let prefill = gpu.kernel("flash.cu", "flash_prefill", &defines)?;
        let decode = gpu.kernel("flash.cu", "flash_decode", &defines)?;
        let combine = gpu.kernel("flash.cu", "flash_combine", &defines)?;
        let limit = gpu.chip.smem_per_block;
        for (k, rows) in [(&prefill, PREFILL_ROWS), (&decode, DECODE_ROWS)] {
            let smem = cfg.smem(rows);
            if smem > limit {
                return Err(bad(format!(
                    "attention with head sizes {}/{} needs {smem} bytes of shared memory; the \
                     GPU allows {limit}",
                    cfg.head_dim, cfg.head_dim_v
                )));
            }
            k.set_max_dynamic_smem(smem)?;
        }
        Ok(FlashKernels {
            cfg,
            prefill,
            decode,
            combine,
            sm_count: gpu.chip.sm_count,
        })
    }

    pub fn config(&self) -> &FlashConfig {
        &self.cfg
    }

    /// Scratch bytes the preferred split count of this call would use (a smaller scratch
    /// gives fewer splits).
    pub fn scratch_bytes(&self, a: &FlashArgs, q: &Queries, max_kv: usize) -> usize {
        match self.plan(a, q, max_kv, usize::MAX) {
            Ok(l) => self.layout(a, &l).2,
            Err(_) => 0,
        }
    }

    /// Byte offsets of the tile list, the partial log-sum-exps and the partial rows, and the
    /// total.
    fn layout(&self, a: &FlashArgs, l: &Launch) -> (usize, usize, usize) {
        let tiles = (l.tiles.len() * 4).next_multiple_of(256);
        let rows = a.n_tokens * a.n_head;
        if l.splits <= 1 {
            return (tiles, tiles, tiles);
        }
        let lse = (l.splits * rows * 4).next_multiple_of(256);
        (
            tiles,
            tiles + lse,
            tiles + lse + l.splits * rows * self.cfg.head_dim_v * 4,
        )
    }

    fn plan(
        &self,
        a: &FlashArgs,
        q: &Queries,
        max_kv: usize,
        scratch: usize,
    ) -> Result<Launch, CudaError> {
        let group = a.n_head / a.n_head_kv.max(1);
        let decode = matches!(q, Queries::PerToken) && group <= DECODE_ROWS;
        let rows = if decode { DECODE_ROWS } else { PREFILL_ROWS };
        let chunks = group.div_ceil(rows);
        let per_tile = (rows / group.min(rows)).max(1);
        let mut tiles = Vec::new();
        let n_tiles = match q {
            Queries::PerToken => a.n_tokens,
            Queries::Runs(runs) => {
                for &(first, count) in runs.iter() {
                    if count == 0 || first.checked_add(count).is_none_or(|e| e > a.n_tokens) {
                        return Err(CudaError::Bounds(format!(
                            "query run ({first}, {count}) outside {} tokens",
                            a.n_tokens
                        )));
                    }
                    let mut t = first;
                    while t < first + count {
                        let n = per_tile.min(first + count - t);
                        tiles.push(to_u32("token", t)?);
                        tiles.push(n as u32);
                        t += n;
                    }
                }
                // Latest tiles of each run see the most keys: start them first.
                let mut pairs: Vec<[u32; 2]> = tiles.chunks(2).map(|c| [c[0], c[1]]).collect();
                pairs.reverse();
                tiles = pairs.concat();
                tiles.len() / 2
            }
        };
        let blocks = n_tiles * a.n_head_kv * chunks;
        let per_sm = if decode { 4 } else { 2 };
        let target = self.sm_count * per_sm;
        let bn = self.cfg.keys_per_step();
        let mut splits = 1;
        if blocks > 0 && blocks * 2 < target {
            splits = target
                .div_ceil(blocks)
                .min(max_kv.div_ceil(2 * bn))
                .clamp(1, MAX_SPLITS);
        }
        let rows_total = a.n_tokens * a.n_head;
        let tile_bytes = (tiles.len() * 4).next_multiple_of(256);
        while splits > 1 {
            let need = tile_bytes
                + (splits * rows_total * 4).next_multiple_of(256)
                + splits * rows_total * self.cfg.head_dim_v * 4;
            if need <= scratch {
                break;
            }
            splits -= 1;
        }
        Ok(Launch {
            decode,
            rows,
            tiles,
            n_tiles,
            chunks,
            splits,
        })
    }

    fn check(&self, a: &FlashArgs) -> Result<(), CudaError> {
        let c = &self.cfg;
        if a.n_tokens == 0 {
            return Ok(());
        }
        if a.n_head == 0 || a.n_head_kv == 0 || !a.n_head.is_multiple_of(a.n_head_kv) {
            return Err(bad(format!(
                "{} query heads over {} KV heads",
                a.n_head, a.n_head_kv
            )));
        }
        for (what, p) in [
            ("q", a.q),
            ("k", a.k),
            ("v", a.v),
            ("out", a.out),
            ("positions", a.q_pos),
            ("sequences", a.q_seq),
        ] {
            if p == 0 {
                return Err(bad(format!("attention {what} is a null pointer")));
            }
        }
        // cp.async moves 16 bytes: element rows must start 16-byte aligned.
        let mut aligned16 = vec![
            ("k", a.k, a.k_stride.to_vec()),
            ("v", a.v, a.v_stride.to_vec()),
        ];
        if !c.q_f32 {
            aligned16.push(("q", a.q, a.q_stride.to_vec()));
        }
        for (what, p, strides) in aligned16 {
            if !p.is_multiple_of(16) || strides.iter().any(|s| !s.is_multiple_of(8)) {
                return Err(bad(format!(
                    "attention {what}: rows must start at 16-byte boundaries"
                )));
            }
        }
        if !a.q.is_multiple_of(4)
            || !a.out.is_multiple_of(8)
            || a.out_stride.iter().any(|s| !s.is_multiple_of(2))
        {
            return Err(bad(
                "attention q and out must be aligned and out strides even".into(),
            ));
        }
        if a.segments.is_some_and(|(q, k)| q == 0 || k == 0)
            || a.tree.is_some_and(|(m, b)| m == 0 || b == 0)
        {
            return Err(bad("attention mask arrays must not be null".into()));
        }
        if let Some(cap) = a.softcap {
            if !(cap.is_finite() && cap > 0.0) {
                return Err(bad(format!("soft-cap {cap}")));
            }
        }
        if !a.scale.is_finite() {
            return Err(bad(format!("attention scale {}", a.scale)));
        }
        if a.window == Some(0) {
            return Err(bad("a sliding window of 0 keys".into()));
        }
        if a.n_ctx == 0 {
            return Err(bad("attention over a cache of 0 keys".into()));
        }
        Ok(())
    }

    /// Enqueues attention for `a` on the GPU's stream. `max_kv` bounds the keys a token can
    /// see (it only chooses the split count).
    pub fn run(
        &self,
        gpu: &Gpu,
        a: &FlashArgs,
        q: Queries,
        max_kv: usize,
        scratch: &FlashScratch,
    ) -> Result<(), CudaError> {
        self.check(a)?;
        if a.n_tokens == 0 {
            return Ok(());
        }
        let l = self.plan(a, &q, max_kv, scratch.bytes())?;
        let (lse_at, o_at, end) = self.layout(a, &l);
        if end > scratch.bytes() {
            return Err(CudaError::Bounds(format!(
                "attention needs {end} bytes of scratch, has {}",
                scratch.bytes()
            )));
        }
        if !l.tiles.is_empty() {
            gpu.write(&scratch.buf, 0, &l.tiles)?;
        }
        let split = l.splits > 1;
        let p = FlashParams {
            q: a.q,
            k: a.k,
            v: a.v,
            out: a.out,
            lse: a.lse,
            q_pos: a.q_pos,
            q_seq: a.q_seq,
            kv_len: a.kv_len,
            q_seg: a.segments.map_or(0, |s| s.0),
            k_seg: a.segments.map_or(0, |s| s.1),
            tree_mask: a.tree.map_or(0, |t| t.0),
            tree_base: a.tree.map_or(0, |t| t.1),
            tiles: if l.tiles.is_empty() {
                0
            } else {
                scratch.buf.ptr()
            },
            part_o: if split { scratch.buf.at(o_at) } else { 0 },
            part_lse: if split { scratch.buf.at(lse_at) } else { 0 },
            debug: if self.cfg.debug { a.debug } else { 0 },
            q_tok: to_i64("q stride", a.q_stride[0])?,
            q_head: to_i64("q stride", a.q_stride[1])?,
            k_seq: to_i64("k stride", a.k_stride[0])?,
            k_head: to_i64("k stride", a.k_stride[1])?,
            k_pos: to_i64("k stride", a.k_stride[2])?,
            v_seq: to_i64("v stride", a.v_stride[0])?,
            v_head: to_i64("v stride", a.v_stride[1])?,
            v_pos: to_i64("v stride", a.v_stride[2])?,
            o_tok: to_i64("out stride", a.out_stride[0])?,
            o_head: to_i64("out stride", a.out_stride[1])?,
            n_tokens: to_u32("tokens", a.n_tokens)?,
            n_head: to_u32("heads", a.n_head)?,
            n_head_kv: to_u32("KV heads", a.n_head_kv)?,
            n_ctx: to_u32("context", a.n_ctx)?,
            causal: i32::from(a.causal),
            window: a.window.map_or(Ok(-1), |w| {
                i32::try_from(w.min(a.n_ctx)).map_err(|_| CudaError::Bounds(format!("window {w}")))
            })?,
            softcap: a.softcap.unwrap_or(0.0),
            scale: a.scale,
            n_split: l.splits as u32,
            debug_tiles: to_u32("debug steps", a.debug_steps)?,
        };
        let kernel = if l.decode {
            &self.decode
        } else {
            &self.prefill
        };
        let grid = (
            to_u32("attention tiles", l.n_tiles)?,
            to_u32("attention heads", a.n_head_kv * l.chunks)?,
            l.splits as u32,
        );
        if grid.1 > u16::MAX as u32 {
            return Err(bad(format!("{} KV heads", a.n_head_kv)));
        }
        gpu.launch_with(
            kernel,
            grid,
            (32 * (l.rows / 16) as u32, 1, 1),
            self.cfg.smem(l.rows) as u32,
            &p,
        )?;
        if split {
            gpu.launch_with(
                &self.combine,
                (to_u32("attention rows", a.n_tokens * a.n_head)?, 1, 1),
                (COMBINE_THREADS, 1, 1),
                0,
                &p,
            )?;
        }
        Ok(())
    }
}
