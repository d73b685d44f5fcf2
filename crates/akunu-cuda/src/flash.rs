//! FlashAttention on the GPU (`kernels/flash.cu`): prefill, chunked prefill onto a cache,
//! decode and tree-masked verification, through one launcher.
//!
//! Plan: [`FlashKernels::new`] compiles one module per element type (f16, bf16), head sizes and
//! input/output precision. [`FlashKernels::run`] validates the problem (layout, alignment,
//! sizes) on the host, picks the variant, tiles the queries and the split count, and enqueues:
//!
//! - `flash_decode` (16 rows; eight warps with two-step rings where head sizes up to 128 allow,
//!   else four with three, each warp streaming its share of the keys) when every token is its
//!   own tile and a token's query heads fit 16 rows: decode and short batches. Where the keys
//!   a launch plans for over its split count reach eight steps a warp, `flash_decode_turns`,
//!   whose warps take a long slice's steps by turns, so a block's loads in flight are
//!   consecutive keys.
//!   Nothing is read from the host per call, so a captured graph replays as positions advance:
//!   each split finds its slice of the keys from the token's position on the device. Decode is
//!   bound by memory, so it splits the keys until every SM holds a block; a launch of at most
//!   one block per SM asks for enough shared memory to keep it so (`ChipConfig::decode_spread`:
//!   under dependent launch the scheduler otherwise put two on SMs with room).
//! - `flash_prefill` (four warps of 32 rows, or 16 for head sizes past 128) for runs of tokens
//!   of one sequence: tiles of `rows / group` tokens (the query heads of a KV head are packed
//!   as rows), uploaded as a (first token, count) list, the latest tile of every run first
//!   (then the next latest of every run, ...) so the longest tiles start first. On Hopper with
//!   head sizes 64, 128 or 256, tiles of 128 rows (64 at 256 in launches too small to fill the
//!   GPU) go to `flash_prefill_wg` instead: up to one block per SM, each taking (tile, head chunk)
//!   items in turn from a counter in the scratch; a producer warpgroup prepares the items and
//!   streams K and V by tensor copies (tensor maps built here), two consumer warpgroups of 64
//!   rows run wgmma, 128-key steps (64 at head size 256).
//! - Split-KV when the tiles alone cannot fill the GPU: each split writes normalised partial
//!   rows and their log-sum-exp into the scratch, and the last split of each tile to finish
//!   merges them (a counter per tile in the scratch, re-armed by that split). The split count
//!   is bounded by the scratch, so a launch never fails for lack of it.
//!
//! Masks: causal (`j <= position`, which also covers a query chunk that starts past existing
//! keys), sliding window, the stored length of each sequence, segment ids (packed varlen) and a
//! 64-bit tree mask per token for speculative verification. See `akunu_cpu::flash` for the
//! reference semantics.

use bytemuck::{Pod, Zeroable};

use crate::chip::ChipConfig;
use crate::compile::ModuleSpec;
use crate::gpu::{DeviceBuffer, Gpu, Kernel, TensorMap};
use crate::CudaError;

/// Largest split count.
pub const MAX_SPLITS: usize = 256;
/// Head sizes the kernels are built for.
pub const HEAD_DIMS: [usize; 4] = [32, 64, 128, 256];
/// Rows of a decode block (one token's query heads) and keys per warp step there
/// (`DEC_KEYS`); its warps (`DEC_WARPS`: [`FlashConfig::decode_warps`]) each keep a ring of
/// steps (`DEC_STAGES`: `FlashConfig::decode_stages`).
const DECODE_ROWS: usize = 16;
const DECODE_KEYS: usize = 16;
/// The split rule counts keys in steps of four warps (`SPLIT_KEYS` in flash.cu) whatever the
/// block's warps: it was measured at four, and at eight the same splits keep the SMs as busy.
const SPLIT_STEP_KEYS: usize = 4 * DECODE_KEYS;
const PREFILL_STAGES: usize = 2;
/// The `mma.sync` prefill kernel runs four warps.
const THREADS: u32 = 128;
/// `flash_prefill_wg`: a producer warpgroup and two consumer warpgroups of 64 rows (a tile of
/// `WG_ROWS` at every head size),
/// `WG_STAGES` stages each of K and V, and 1 KiB of slack to align the swizzled tiles. Keys per
/// step and query slots depend on the head size ([`FlashConfig::wg_keys`]).
const WG_THREADS: u32 = 384;
const WG_ROWS: usize = 128;
const WG_STAGES: usize = 2;
const WG_ALIGN: usize = 1024;
/// Split counters (one per tile and head chunk) at the start of the scratch; a launch with
/// more tiles than this never splits (it fills the GPU without). Without splits,
/// `flash_prefill_wg` uses the last two to hand out its work items (`WG_NEXT_ITEM` in
/// flash.cu).
const COUNTERS: usize = 4096;
const COUNTER_BYTES: usize = COUNTERS * 4;

/// A timeline build's records a stream and streams a block (`WG_TIMELINE_*` in flash.cu).
pub const TIMELINE_RECORDS: usize = 16384;
pub const TIMELINE_STREAMS: usize = 4;

/// Bytes of the timeline buffer for `blocks` blocks (see [`FlashArgs::debug`]).
pub fn timeline_bytes(blocks: usize) -> usize {
    blocks * TIMELINE_STREAMS * TIMELINE_RECORDS * 8
}

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
    /// Build `flash_prefill_wg` with its per-step timeline (see [`FlashArgs::debug`]).
    pub timeline: bool,
    /// Warps of a decode block, 8 or 4 ([`FlashConfig::with_decode_warps`]).
    pub decode_warps: usize,
}

impl FlashConfig {
    /// f16 or bf16 queries, keys, values and output, head sizes `head_dim` (Q, K) and
    /// `head_dim_v` (V).
    /// Decode blocks take 8 warps where the head sizes allow
    /// ([`FlashConfig::with_decode_warps`]).
    pub fn new(dtype: FlashDtype, head_dim: usize, head_dim_v: usize) -> FlashConfig {
        FlashConfig {
            dtype,
            head_dim,
            head_dim_v,
            q_f32: false,
            out_f32: false,
            debug: false,
            timeline: false,
            decode_warps: 4,
        }
        .with_decode_warps(8)
    }

    /// Decode blocks of `warps` warps: 8 (rings of two steps a warp) where head sizes up to 128
    /// leave room for them, else 4 (rings of three). Eight warps put two on each scheduler, so
    /// one warp's latencies hide behind the other's work; with three steps a warp their rings
    /// took 200 KB of an SM at head size 128, and the products beside them lost more than
    /// attention gained (docs/perf/2026-11-25-decode-warps.md).
    pub fn with_decode_warps(self, warps: usize) -> FlashConfig {
        let eight = warps >= 8 && self.head_dim <= 128 && self.head_dim_v <= 128;
        FlashConfig {
            decode_warps: if eight { 8 } else { 4 },
            ..self
        }
    }

    /// This build with the decode block size a chip config sets (`ChipConfig::decode_warps`;
    /// 0 keeps the build's).
    pub fn for_chip(self, chip: &ChipConfig) -> FlashConfig {
        match chip.decode_warps {
            0 => self,
            warps => self.with_decode_warps(warps),
        }
    }

    /// Steps in each decode warp's ring: two at eight warps, three at four.
    fn decode_stages(&self) -> usize {
        if self.decode_warps == 8 {
            2
        } else {
            3
        }
    }

    /// Slices of at least this many keys may go to a decode block's warps by turns
    /// (`flash_decode_turns`): eight steps a warp.
    fn turn_keys(&self) -> usize {
        8 * self.decode_warps * DECODE_KEYS
    }

    /// Threads of a decode block.
    fn decode_threads(&self) -> u32 {
        32 * self.decode_warps as u32
    }

    /// f32 queries and output (rounded to the element type as they are read).
    pub fn f32_io(self) -> FlashConfig {
        FlashConfig {
            q_f32: true,
            out_f32: true,
            ..self
        }
    }

    /// f32 output, queries in the element type: the engine's prefill, whose queries
    /// `qk_rope_store` writes so, and whose query tiles are then copied without a conversion.
    pub fn f32_out(self) -> FlashConfig {
        FlashConfig {
            q_f32: false,
            out_f32: true,
            ..self
        }
    }

    /// With the per-step dump (see [`FlashArgs::debug`]).
    pub fn with_debug(self) -> FlashConfig {
        FlashConfig {
            debug: true,
            ..self
        }
    }

    /// With `flash_prefill_wg`'s timeline (see [`FlashArgs::debug`]).
    pub fn with_timeline(self) -> FlashConfig {
        FlashConfig {
            timeline: true,
            ..self
        }
    }

    /// Whether the kernels are built for a head size: a multiple of 16 up to 256.
    pub fn supports(head_dim: usize) -> bool {
        head_dim > 0 && head_dim.is_multiple_of(16) && head_dim <= 256
    }

    /// The kernel module [`FlashKernels::new`] compiles for this build.
    pub fn module(&self) -> ModuleSpec {
        ("flash.cu", self.defines())
    }

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
            ("DECODE_WARPS", self.decode_warps.to_string()),
            ("DECODE_STAGES", self.decode_stages().to_string()),
        ];
        if self.debug {
            d.push(("FLASH_DEBUG", "1".into()));
        }
        if self.timeline {
            d.push(("FLASH_TIMELINE", "1".into()));
        }
        d
    }

    /// Rows of a prefill block: four warps of one or (head sizes up to 128) two 16-row tiles
    /// (`PREFILL_MT` in flash.cu).
    fn prefill_rows(&self) -> usize {
        if self.head_dim > 128 || self.head_dim_v > 128 {
            64
        } else {
            128
        }
    }

    /// Keys per warp step: `DEC_KEYS` in decode, `BN` in prefill.
    pub fn keys_per_step(&self, decode: bool) -> usize {
        if decode {
            DECODE_KEYS
        } else if self.head_dim > 128 || self.head_dim_v > 128 {
            32
        } else {
            64
        }
    }

    /// Floats per step of the debug dump: scores and probabilities `[16][keys]`, running max
    /// and sum `[16]`, unnormalised output `[16][head_dim_v]`.
    pub fn debug_step_floats(&self, decode: bool) -> usize {
        2 * 16 * self.keys_per_step(decode) + 32 + 16 * self.head_dim_v
    }

    /// Whether `flash_prefill_wg` is built for these head sizes (wgmma.cuh's shapes).
    fn has_wgmma_prefill(&self) -> bool {
        self.head_dim == self.head_dim_v && matches!(self.head_dim, 64 | 128 | 256) && !self.debug
    }

    /// Keys per step of `flash_prefill_wg` (`WG_BN`): 64 at head size 256, whose output
    /// accumulators leave registers for 64-key scores only, else 128.
    fn wg_keys(&self) -> usize {
        if self.head_dim > 128 {
            64
        } else {
            128
        }
    }

    /// Dynamic shared memory of `flash_prefill_wg`: alignment slack, the 128-row query tiles
    /// (`WG_QSLOTS`: one per work item in flight, two, or one at head size 256) and the K/V
    /// stages.
    fn wgmma_smem(&self) -> usize {
        let q_slots = if self.head_dim > 128 { 1 } else { 2 };
        WG_ALIGN
            + q_slots * WG_ROWS * self.head_dim * 2
            + WG_STAGES * self.wg_keys() * (self.head_dim + self.head_dim_v) * 2
    }

    /// Dynamic shared memory: the query tile, then the K/V stages.
    fn smem(&self, decode: bool) -> usize {
        let (rows, stages) = if decode {
            (DECODE_ROWS, self.decode_warps * self.decode_stages())
        } else {
            (self.prefill_rows(), PREFILL_STAGES)
        };
        let key = (self.head_dim + self.head_dim_v) * 2;
        rows * self.head_dim * 2 + stages * self.keys_per_step(decode) * key
    }
}

/// Every module the engine and the benchmark use, for the NVRTC test.
pub fn modules() -> Vec<ModuleSpec> {
    let mut configs = Vec::new();
    for d in HEAD_DIMS {
        configs.push(FlashConfig::new(FlashDtype::F16, d, d).f32_io());
        configs.push(FlashConfig::new(FlashDtype::F16, d, d).f32_out());
    }
    for d in [64, 128] {
        configs.push(FlashConfig::new(FlashDtype::Bf16, d, d));
    }
    configs.push(FlashConfig::new(FlashDtype::F16, 128, 128).with_debug());
    configs.push(FlashConfig::new(FlashDtype::Bf16, 128, 128).with_timeline());
    for d in [32, 64, 128] {
        configs.push(
            FlashConfig::new(FlashDtype::F16, d, d)
                .f32_io()
                .with_decode_warps(4),
        );
        configs.push(
            FlashConfig::new(FlashDtype::F16, d, d)
                .f32_out()
                .with_decode_warps(4),
        );
    }
    configs.iter().map(FlashConfig::module).collect()
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
    /// u32 per sequence: keys stored, or 0 for `n_ctx` everywhere. The decode kernel reads
    /// these three before it waits for its predecessor: they must be written by an earlier
    /// launch or copy, not by the kernel launched just before.
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
    /// the first block's first 16 rows (layout in [`FlashConfig::debug_step_floats`]). In such
    /// a build, decode gives all of a block's keys to its first warp, so the steps are
    /// consecutive. With a [`FlashConfig::timeline`] build: a zeroed buffer of
    /// [`timeline_bytes`]`(debug_steps)` that the first `debug_steps` blocks of
    /// `flash_prefill_wg` or `flash_decode` fill with their timelines ([`TIMELINE_STREAMS`] streams a block of
    /// [`TIMELINE_RECORDS`] (clock, event) pairs of u32, as `Timeline` in flash.cu writes them).
    pub debug: u64,
    pub debug_steps: usize,
    /// (levels, sums): the outputs also in the GEMVs' int8 form (`kernels/actq.cuh`), a row of
    /// `n_head * head_dim_v` per token, as [`crate::matmul::ActScratch::written_by`] hands
    /// them out. Only where [`FlashKernels::writes_int8`] says so.
    pub int8_out: Option<(u64, u64)>,
    /// QK-norm, RoPE and the KV-cache store of the decode token done by the decode kernel
    /// itself (see [`FlashRope`]); `q` then holds the unrotated queries.
    pub rope: Option<FlashRope>,
}

/// What [`FlashArgs::rope`] needs: the rotation of [`crate::layers::QkRopeStore`], whose
/// launch it replaces in decode. Only for decode queries ([`FlashKernels::fuses_rope`]) where
/// every token is the only one of its sequence in the launch, whose cache holds the keys
/// before the token's position (the kernel stores the token's own, and reads none of the
/// stored ones after its predecessor: it requests them before waiting for it), with `kv_len`
/// 0 (each token sees the keys up to its position).
#[derive(Clone, Copy, Debug)]
pub struct FlashRope {
    /// `n_tokens × n_head_kv × head_dim` f32 keys and `n_tokens × n_head_kv × head_dim_v` f32
    /// values, as the products wrote them.
    pub k_new: u64,
    pub v_new: u64,
    /// Per-head RMSNorm weights (`head_dim` f32) of Q and of K, or 0.
    pub q_norm: u64,
    pub k_norm: u64,
    pub eps: f32,
    pub neox: bool,
    /// Leading dimensions of each head that rotate (even, at most `head_dim`).
    pub n_rot: usize,
    /// `n_rot / 2` f32: the angle of pair i at position p is `p * inv_freq[i]`.
    pub inv_freq: u64,
}

/// How the queries are tiled.
#[derive(Clone, Copy, Debug)]
pub enum Queries<'a> {
    /// Every token its own tile (decode; nothing uploaded, so graph capture is fine).
    PerToken,
    /// Runs (first token, count) of consecutive tokens of one sequence (prefill).
    Runs(&'a [(usize, usize)]),
}

/// Device scratch for split partials and the tile list, after the split counters (which
/// start zeroed and which every merging split re-arms).
pub struct FlashScratch {
    buf: DeviceBuffer,
}

impl FlashScratch {
    /// `bytes` for partials and tiles (the counters come on top).
    pub fn new(gpu: &Gpu, bytes: usize) -> Result<FlashScratch, CudaError> {
        Ok(FlashScratch {
            buf: gpu.alloc(COUNTER_BYTES + bytes)?,
        })
    }

    /// Bytes for partials and tiles.
    pub fn bytes(&self) -> usize {
        self.buf.bytes() - COUNTER_BYTES
    }

    fn at(&self, offset: usize) -> u64 {
        self.buf.at(COUNTER_BYTES + offset)
    }
}

/// The kernel's parameter block; mirrors `FlashParams` in flash.cu field for field (`tail`
/// is the padding C++ adds to its tensor maps' alignment).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct FlashParams {
    tma_k: TensorMap,
    tma_v: TensorMap,
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
    counters: u64,
    debug: u64,
    act_q: u64,
    act_s: u64,
    k_new: u64,
    v_new: u64,
    q_norm: u64,
    k_norm: u64,
    inv_freq: u64,
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
    n_rot: u32,
    neox: u32,
    eps: f32,
    tma: u32,
    wg_tiles: u32,
    wg_heads: u32,
    wg_length_runs: u32,
    fill_splits: u32,
    tail: [u32; 10],
}

/// Whether queries run on the decode kernel: one token per tile, a token's query heads of one
/// KV head within its 16 rows.
fn is_decode(q: &Queries, n_head: usize, n_head_kv: usize) -> bool {
    matches!(q, Queries::PerToken) && n_head / n_head_kv.max(1) <= DECODE_ROWS
}

/// Decode launches whose wave holds at most this many splits of a tile use them all once each
/// gets a step per warp (measured at 16, eight KV heads on 132 SMs:
/// docs/perf/2026-11-24-decode-split-fill.md). Wider waves (fewer KV heads) keep the older
/// rule: their merge of up to a wave's partials in one block is unmeasured.
const FILL_SPLITS_MAX: usize = 16;

/// The splits `flash_decode` gives a token's `keys` keys: with `fill` (a wave's splits, 0 for
/// none) all of them where each gets at least one step per warp; otherwise up to eight of at
/// least two steps, past that splits of at least four. A wave left partly idle gains less from
/// more splits than their merge costs (docs/perf/2026-11-22-decode-splits.md,
/// docs/perf/2026-11-24-decode-split-fill.md).
fn decode_splits(keys: usize, fill: usize) -> usize {
    let step = SPLIT_STEP_KEYS;
    if fill > 0 && keys / step >= fill {
        return fill;
    }
    (keys / (2 * step)).min(8).max(keys / (4 * step))
}

/// How one call is launched.
struct Launch {
    decode: bool,
    tiles: Vec<u32>,
    n_tiles: usize,
    chunks: usize,
    splits: usize,
    /// Decode: the splits that fill the wave, which a token takes once each gets a step per
    /// warp (`decode_splits`); 0: never.
    fill: usize,
    /// Decode whose planned keys per split (`max_kv` over the splits) reach
    /// `FlashConfig::turn_keys`:
    /// launched as `flash_decode_turns`.
    turns: bool,
    /// The wgmma prefill: runs of tile lengths its work items go out in (`length_runs`).
    length_runs: u32,
}

pub struct FlashKernels {
    cfg: FlashConfig,
    prefill: Kernel,
    /// `flash_prefill_wg`, where the GPU and the head sizes allow.
    prefill_wg: Option<Kernel>,
    decode: Kernel,
    /// `flash_decode` whose warps take a long slice's steps by turns.
    decode_turns: Kernel,
    sm_count: usize,
    /// Persistent blocks of `prefill_wg` at most (`ChipConfig::wgmma_prefill_blocks`).
    wg_blocks: usize,
    /// Decode blocks per SM that split counts are planned for: one with
    /// `ChipConfig::decode_spread`, else as many as shared memory and registers allow.
    decode_per_sm: usize,
    /// Shared memory that keeps a decode launch of at most one block per SM to one block per
    /// SM (`ChipConfig::decode_spread`).
    spread_smem: Option<usize>,
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
    /// The kernels of `cfg`, with the decode block size the chip config sets, if any
    /// ([`FlashConfig::for_chip`]).
    pub fn new(gpu: &Gpu, cfg: FlashConfig) -> Result<FlashKernels, CudaError> {
        let cfg = cfg.for_chip(&gpu.chip);
        for (what, d) in [("head_dim", cfg.head_dim), ("head_dim_v", cfg.head_dim_v)] {
            if !FlashConfig::supports(d) {
                return Err(bad(format!(
                    "attention {what} {d}: must be a multiple of 16 up to 256"
                )));
            }
        }
        let defines = cfg.defines();
        let prefill = gpu.kernel("flash.cu", "flash_prefill", &defines)?;
        let decode = gpu.kernel("flash.cu", "flash_decode", &defines)?;
        let decode_turns = gpu.kernel("flash.cu", "flash_decode_turns", &defines)?;
        let limit = gpu.chip.smem_per_block;
        // A block asking for more than half an SM's shared memory has the SM to itself.
        let spread_smem = gpu.chip.decode_spread.then(|| limit / 2 + 1024);
        for (k, is_decode) in [(&prefill, false), (&decode, true), (&decode_turns, true)] {
            let smem = cfg.smem(is_decode);
            if smem > limit {
                return Err(bad(format!(
                    "attention with head sizes {}/{} needs {smem} bytes of shared memory; the \
                     GPU allows {limit}",
                    cfg.head_dim, cfg.head_dim_v
                )));
            }
            let spread = if is_decode { spread_smem } else { None };
            k.set_max_dynamic_smem(smem.max(spread.unwrap_or(0)))?;
        }
        let prefill_wg =
            if gpu.chip.wgmma_attention && cfg.has_wgmma_prefill() && cfg.wgmma_smem() <= limit {
                let k = gpu.kernel("flash.cu", "flash_prefill_wg", &defines)?;
                k.set_max_dynamic_smem(cfg.wgmma_smem())?;
                Some(k)
            } else {
                None
            };
        let decode_per_sm = if gpu.chip.decode_spread {
            1
        } else {
            gpu.blocks_per_sm(&decode, cfg.decode_threads(), cfg.smem(true))?
                .max(1)
        };
        Ok(FlashKernels {
            cfg,
            prefill,
            prefill_wg,
            decode,
            decode_turns,
            sm_count: gpu.chip.sm_count,
            wg_blocks: match gpu.chip.wgmma_prefill_blocks {
                0 => gpu.chip.sm_count,
                n => n.min(gpu.chip.sm_count),
            },
            decode_per_sm,
            spread_smem,
        })
    }

    pub fn config(&self) -> &FlashConfig {
        &self.cfg
    }

    /// Rows of a prefill tile. `flash_prefill_wg` takes 128, a consumer warpgroup's 64 each,
    /// except at head size 256 in launches whose tiles of 128 rows leave some of its blocks
    /// without a tile: there it takes tiles of 64 (the second warpgroup's rows empty), twice as
    /// many. At 256 a block's one query slot is loaded while no keys stream, and a split's
    /// partial rows are 1 KiB each: those per-tile costs grow with the rows and run in the
    /// tile's own block, so where the launch cannot fill the GPU more tiles of fewer rows end
    /// sooner than fewer tiles cut into more splits. At head sizes 64 and 128 the same rule
    /// gained 1.5 % and lost 4 % (docs/perf/2026-11-23-prefill-tile-rows.md). Groups past 64
    /// heads fill a tile per token either way.
    fn prefill_rows(&self, q: &Queries, n_head_kv: usize, group: usize) -> usize {
        if self.prefill_wg.is_none() {
            return self.cfg.prefill_rows();
        }
        let Queries::Runs(runs) = q else {
            return WG_ROWS;
        };
        if self.cfg.head_dim <= 128 || group > WG_ROWS / 2 {
            return WG_ROWS;
        }
        let tiles = runs.iter().fold(0usize, |t, &(_, n)| {
            t.saturating_add(n.div_ceil(WG_ROWS / group))
        });
        if tiles.saturating_mul(n_head_kv) < self.wg_blocks {
            WG_ROWS / 2
        } else {
            WG_ROWS
        }
    }

    /// Keys per step of the prefill kernel in use.
    fn prefill_keys(&self) -> usize {
        if self.prefill_wg.is_some() {
            self.cfg.wg_keys()
        } else {
            self.cfg.keys_per_step(false)
        }
    }

    /// Scratch bytes the preferred split count of this call would use (a smaller scratch
    /// gives fewer splits).
    pub fn scratch_bytes(&self, a: &FlashArgs, q: &Queries, max_kv: usize) -> usize {
        match self.plan(a, q, max_kv, usize::MAX) {
            Ok(l) => self.layout(a, &l).2,
            Err(_) => 0,
        }
    }

    /// Tensor maps of the K and V caches for `flash_prefill_wg`'s tensor copies: each cache as
    /// a tensor (head dim, position, KV head, sequence), copied in boxes of 64 elements by
    /// a step's keys. None where the layout rules them out (a base or a stride that is
    /// not a multiple of 16 bytes, or a zero stride): the kernel then copies with cp.async.
    fn cache_maps(
        &self,
        gpu: &Gpu,
        a: &FlashArgs,
    ) -> Result<Option<(TensorMap, TensorMap)>, CudaError> {
        // Sequence indices come from the device (`q_seq`), as the other kernels read them; the
        // map spans every index a 32-bit coordinate can name.
        const SEQUENCES: u64 = 1 << 31;
        let map = |base: u64, d: usize, stride: [usize; 3]| {
            let bytes = stride.map(|s| s as u64 * 2);
            if !base.is_multiple_of(16)
                || bytes
                    .iter()
                    .any(|&b| b == 0 || !b.is_multiple_of(16) || b >= 1 << 40)
            {
                return Ok(None);
            }
            let dims = [d as u64, a.n_ctx as u64, a.n_head_kv as u64, SEQUENCES];
            let boxes = [64, self.cfg.wg_keys() as u32, 1, 1];
            gpu.tensor_map_u16(base, dims, [bytes[2], bytes[1], bytes[0]], boxes)
                .map(Some)
        };
        let k = map(a.k, self.cfg.head_dim, a.k_stride)?;
        let v = map(a.v, self.cfg.head_dim_v, a.v_stride)?;
        Ok(k.zip(v))
    }

    /// Byte offsets (past the counters) of the partial log-sum-exps and the partial rows, and
    /// the total; the tile list comes first.
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
        // `run` checks the arguments first; `scratch_bytes` comes here directly.
        if a.n_head_kv == 0 || a.n_head < a.n_head_kv {
            return Err(bad(format!(
                "{} query heads over {} KV heads",
                a.n_head, a.n_head_kv
            )));
        }
        let group = a.n_head / a.n_head_kv;
        let decode = is_decode(q, a.n_head, a.n_head_kv);
        let rows = if decode {
            DECODE_ROWS
        } else {
            self.prefill_rows(q, a.n_head_kv, group)
        };
        let chunks = group.div_ceil(rows);
        let per_tile = (rows / group.min(rows)).max(1);
        let mut tiles = Vec::new();
        let n_tiles = match q {
            Queries::PerToken => a.n_tokens,
            Queries::Runs(runs) => {
                // Each run's tiles, latest first: they see the most keys.
                let mut per_run: Vec<Vec<[u32; 2]>> = Vec::with_capacity(runs.len());
                for &(first, count) in runs.iter() {
                    if count == 0 || first.checked_add(count).is_none_or(|e| e > a.n_tokens) {
                        return Err(CudaError::Bounds(format!(
                            "query run ({first}, {count}) outside {} tokens",
                            a.n_tokens
                        )));
                    }
                    let mut run = Vec::new();
                    let mut t = first;
                    while t < first + count {
                        let n = per_tile.min(first + count - t);
                        run.push([to_u32("token", t)?, n as u32]);
                        t += n;
                    }
                    run.reverse();
                    per_run.push(run);
                }
                // The latest tile of every run, then the next latest of every run, ...: blocks
                // start in this order, so the longest tiles start first and the short ones fill
                // in at the end.
                let rounds = per_run.iter().map(Vec::len).max().unwrap_or(0);
                for r in 0..rounds {
                    for tile in per_run.iter().filter_map(|run| run.get(r)) {
                        tiles.extend_from_slice(tile);
                    }
                }
                tiles.len() / 2
            }
        };
        let blocks = n_tiles * a.n_head_kv * chunks;
        let (mut splits, mut fill) = (1, 0);
        if blocks > 0 && blocks <= COUNTERS {
            splits = if decode {
                // Memory-bound: one wave over every resident slot, and no more than the kernel
                // uses for `max_kv` keys (it may use fewer for fewer keys).
                let wave = self.sm_count * self.decode_per_sm / blocks;
                if wave <= FILL_SPLITS_MAX {
                    fill = wave;
                }
                wave.min(decode_splits(max_kv, fill))
            } else if blocks < self.sm_count {
                (2 * self.sm_count)
                    .div_ceil(blocks)
                    .min(max_kv.div_ceil(2 * self.prefill_keys()))
            } else {
                1
            };
            splits = splits.clamp(1, MAX_SPLITS);
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
        if splits < fill {
            fill = 0;
        }
        let length_runs = match q {
            Queries::Runs(runs) if splits == 1 && self.prefill_wg.is_some() => {
                let heads = a.n_head_kv * chunks;
                length_runs(a.causal, a.window, runs, per_tile, heads, self.wg_blocks)
            }
            _ => 1,
        };
        Ok(Launch {
            decode,
            tiles,
            n_tiles,
            chunks,
            splits,
            fill,
            turns: decode && max_kv.div_ceil(splits) >= self.cfg.turn_keys(),
            length_runs,
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
        // Rows move in 16-byte pieces (cp.async, or float4 loads of f32 queries): they must
        // start at 16-byte boundaries. Strides count elements.
        let q_elems_per_16 = if c.q_f32 { 4 } else { 8 };
        for (what, p, strides, per_16) in [
            ("k", a.k, &a.k_stride[..], 8),
            ("v", a.v, &a.v_stride[..], 8),
            ("q", a.q, &a.q_stride[..], q_elems_per_16),
        ] {
            if !p.is_multiple_of(16) || strides.iter().any(|s| !s.is_multiple_of(per_16)) {
                return Err(bad(format!(
                    "attention {what}: rows must start at 16-byte boundaries"
                )));
            }
        }
        if !a.out.is_multiple_of(8) || a.out_stride.iter().any(|s| !s.is_multiple_of(2)) {
            return Err(bad(
                "attention out must be aligned and its strides even".into()
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

    /// Whether [`FlashKernels::run`] can also write its outputs in the GEMVs' int8 form
    /// ([`FlashArgs::int8_out`]) for these queries: the decode kernel (one token per tile, a
    /// group of at most 16 query heads), f32 output, value heads a multiple of 64 wide.
    pub fn writes_int8(&self, q: &Queries, n_head: usize, n_head_kv: usize) -> bool {
        self.cfg.out_f32
            && self.cfg.head_dim_v.is_multiple_of(64)
            && is_decode(q, n_head, n_head_kv)
    }

    /// Whether [`FlashKernels::run`] can do the decode token's RoPE and KV store itself
    /// ([`FlashArgs::rope`]) for these queries: the decode kernel with f32 queries.
    pub fn fuses_rope(&self, q: &Queries, n_head: usize, n_head_kv: usize) -> bool {
        self.cfg.q_f32 && is_decode(q, n_head, n_head_kv)
    }

    fn check_rope(&self, a: &FlashArgs, q: &Queries, r: &FlashRope) -> Result<(), CudaError> {
        if !self.fuses_rope(q, a.n_head, a.n_head_kv) || a.kv_len != 0 {
            return Err(bad(
                "RoPE in attention: needs decode queries, f32 queries and no key counts".into(),
            ));
        }
        if !r.n_rot.is_multiple_of(2) || r.n_rot > self.cfg.head_dim {
            return Err(bad(format!(
                "RoPE of {} dimensions in heads of {}",
                r.n_rot, self.cfg.head_dim
            )));
        }
        if !r.eps.is_finite() || r.eps < 0.0 {
            return Err(bad(format!("QK-norm epsilon {}", r.eps)));
        }
        let norms = [r.q_norm, r.k_norm].into_iter().filter(|&p| p != 0);
        for p in [r.k_new, r.v_new, r.inv_freq].into_iter().chain(norms) {
            if p == 0 || !p.is_multiple_of(4) {
                return Err(bad(format!(
                    "RoPE in attention: device address {p:#x} is null or misaligned"
                )));
            }
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
        if let Some((levels, sums)) = a.int8_out {
            let dense = a.out_stride == [a.n_head * self.cfg.head_dim_v, self.cfg.head_dim_v];
            if !self.writes_int8(&q, a.n_head, a.n_head_kv) || !dense {
                return Err(bad(format!(
                    "int8 attention output: needs decode queries, f32 output, dense heads and a \
                     value head size that is a multiple of 64 (head_dim_v {}, out stride {:?})",
                    self.cfg.head_dim_v, a.out_stride
                )));
            }
            if levels == 0 || sums == 0 || !sums.is_multiple_of(16) || !levels.is_multiple_of(4) {
                return Err(CudaError::Bounds(format!(
                    "int8 attention output at {levels:#x} / {sums:#x}"
                )));
            }
        }
        if let Some(r) = &a.rope {
            self.check_rope(a, &q, r)?;
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
            gpu.write(&scratch.buf, COUNTER_BYTES, &l.tiles)?;
        }
        let split = l.splits > 1;
        let maps = match (l.decode, &self.prefill_wg) {
            (false, Some(_)) => self.cache_maps(gpu, a)?,
            _ => None,
        };
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
            tiles: if l.tiles.is_empty() { 0 } else { scratch.at(0) },
            part_o: if split { scratch.at(o_at) } else { 0 },
            part_lse: if split { scratch.at(lse_at) } else { 0 },
            counters: scratch.buf.ptr(),
            debug: if self.cfg.debug || self.cfg.timeline {
                a.debug
            } else {
                0
            },
            act_q: a.int8_out.map_or(0, |o| o.0),
            act_s: a.int8_out.map_or(0, |o| o.1),
            k_new: a.rope.map_or(0, |r| r.k_new),
            v_new: a.rope.map_or(0, |r| r.v_new),
            q_norm: a.rope.map_or(0, |r| r.q_norm),
            k_norm: a.rope.map_or(0, |r| r.k_norm),
            inv_freq: a.rope.map_or(0, |r| r.inv_freq),
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
            n_rot: a.rope.map_or(0, |r| r.n_rot as u32),
            neox: a.rope.map_or(0, |r| u32::from(r.neox)),
            eps: a.rope.map_or(0.0, |r| r.eps),
            tma: u32::from(maps.is_some()),
            wg_tiles: to_u32("attention tiles", l.n_tiles)?,
            wg_heads: to_u32("attention heads", a.n_head_kv * l.chunks)?,
            wg_length_runs: l.length_runs,
            fill_splits: l.fill as u32,
            tail: [0; 10],
            tma_k: maps.map_or(TensorMap::zeroed(), |m| m.0),
            tma_v: maps.map_or(TensorMap::zeroed(), |m| m.1),
        };
        let grid = (p.wg_tiles, p.wg_heads, l.splits as u32);
        if grid.1 > u16::MAX as u32 {
            return Err(bad(format!("{} KV heads", a.n_head_kv)));
        }
        let (kernel, threads, smem, grid) = match (l.decode, &self.prefill_wg) {
            (true, _) => {
                let k = if l.turns {
                    &self.decode_turns
                } else {
                    &self.decode
                };
                // One block per SM wherever the launch fits that way (every split launch does,
                // by `decode_per_sm`); larger ones pack as many as fit.
                let blocks = grid.0 as usize * grid.1 as usize * grid.2 as usize;
                let smem = match self.spread_smem {
                    Some(s) if blocks <= self.sm_count => s.max(self.cfg.smem(true)),
                    _ => self.cfg.smem(true),
                };
                (k, self.cfg.decode_threads(), smem, grid)
            }
            (false, Some(wg)) => {
                // Up to one block per SM, each taking (tile, head chunk, split) items in turn;
                // with split-KV one item per block (the kernel merges after its item loop).
                let items = l.n_tiles * a.n_head_kv * l.chunks * l.splits;
                let blocks = if l.splits > 1 {
                    items
                } else {
                    items.min(self.wg_blocks)
                };
                let blocks = to_u32("attention work items", blocks)?;
                (wg, WG_THREADS, self.cfg.wgmma_smem(), (blocks, 1, 1))
            }
            (false, None) => (&self.prefill, THREADS, self.cfg.smem(false), grid),
        };
        gpu.launch_with(kernel, grid, (threads, 1, 1), smem as u32, &p)
    }
}

/// Runs of tile lengths the wgmma prefill hands its work items out in, longest first
/// (`wg_work` in flash.cu), for query `runs` cut into tiles of `per_tile` tokens, each tile
/// `heads` items, on up to `blocks` blocks: four where a longest item is over a sixth of a
/// block's share of the steps, else one. Handed out in one run, such items start so late that
/// the blocks' ends spread over one of them (4096 causal tokens: 6.6 % of the launch); each run
/// costs the blocks running together some sharing of K and V in L2 (4096 full and 16384 causal
/// tokens lost 1.4 and 0.9 % to four runs, 8192 at head size 64 4 %:
/// docs/perf/2026-12-06-prefill-timeline.md). A tile's steps are estimated from its place in
/// its run, as if the run started its sequence: every key of the run without a causal mask, the
/// keys up to its own under one, at most the window's.
fn length_runs(
    causal: bool,
    window: Option<usize>,
    runs: &[(usize, usize)],
    per_tile: usize,
    heads: usize,
    blocks: usize,
) -> u32 {
    if !causal || per_tile == 0 {
        return 1;
    }
    let cap = window.map_or(usize::MAX, |w| w.div_ceil(per_tile) + 1);
    let (mut longest, mut steps, mut tiles) = (0usize, 0usize, 0usize);
    for &(_, count) in runs {
        let n = count.div_ceil(per_tile);
        longest = longest.max(n.min(cap));
        tiles = tiles.saturating_add(n);
        steps = (1..=n).fold(steps, |s, i| s.saturating_add(i.min(cap)));
    }
    let blocks = tiles.saturating_mul(heads).min(blocks).max(1);
    let share = steps.saturating_mul(heads) / blocks;
    if longest.saturating_mul(6) > share {
        4
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::{decode_splits, length_runs, FlashConfig, FlashDtype};

    #[test]
    fn eight_warp_decode_blocks_only_where_their_rings_fit() {
        let warps = |d, dv, w| {
            FlashConfig::new(FlashDtype::F16, d, dv)
                .with_decode_warps(w)
                .decode_warps
        };
        assert_eq!(warps(128, 128, 8), 8);
        assert_eq!(warps(64, 64, 8), 8);
        assert_eq!(warps(256, 256, 8), 4);
        assert_eq!(warps(192, 128, 8), 4);
        assert_eq!(warps(128, 128, 4), 4);
        assert_eq!(warps(128, 128, 16), 8);
        assert_eq!(FlashConfig::new(FlashDtype::F16, 128, 128).decode_warps, 8);
        assert_eq!(FlashConfig::new(FlashDtype::F16, 256, 256).decode_warps, 4);
        // The shared memory the host sizes: the query tile, then eight rings of two 16-key
        // steps at 128 (four rings of three at four warps).
        let c = FlashConfig::new(FlashDtype::F16, 128, 128);
        assert_eq!(c.smem(true), 16 * 128 * 2 + 8 * 2 * 16 * 512);
        assert_eq!(c.decode_threads(), 256);
        assert_eq!(c.turn_keys(), 8 * 8 * 16);
        let c = c.with_decode_warps(4);
        assert_eq!(c.smem(true), 16 * 128 * 2 + 4 * 3 * 16 * 512);
        assert_eq!(c.decode_threads(), 128);
    }

    #[test]
    fn decode_fills_the_wave_once_every_split_gets_a_step_per_warp() {
        // A wave of 16 splits (eight KV heads on 132 SMs): from 1,024 keys all of them.
        assert_eq!(decode_splits(1024, 16), 16);
        assert_eq!(decode_splits(3000, 16), 16);
        // Below that, up to eight splits of at least 128 keys, then of at least 256.
        assert_eq!(decode_splits(1023, 16), 7);
        assert_eq!(decode_splits(512, 16), 4);
        assert_eq!(decode_splits(100, 16), 0);
        // Without a fill (a wave too wide), the same rule at every length.
        assert_eq!(decode_splits(3000, 0), 11);
        assert_eq!(decode_splits(16_384, 0), 64);
    }

    #[test]
    fn length_runs_where_a_longest_item_outlasts_a_sixth_of_a_blocks_steps() {
        // The prefill rows of BENCHMARKS.md on 132 blocks, tiles of 128 tokens (64 at head
        // size 256), 32 heads (16): four runs at 4096 causal tokens and at head size 256, one
        // for 4 x 2048, 16384 and 8192 causal tokens and without the mask.
        let runs = |b: usize, s: usize| (0..b).map(|i| (i * s, s)).collect::<Vec<_>>();
        assert_eq!(length_runs(true, None, &runs(1, 4096), 128, 32, 132), 4);
        assert_eq!(length_runs(true, None, &runs(1, 4096), 64, 16, 132), 4);
        assert_eq!(length_runs(true, None, &runs(4, 2048), 128, 32, 132), 1);
        assert_eq!(length_runs(true, None, &runs(1, 16384), 128, 32, 132), 1);
        assert_eq!(length_runs(true, None, &runs(1, 8192), 128, 32, 132), 1);
        assert_eq!(length_runs(false, None, &runs(1, 4096), 128, 32, 132), 1);
        // A window of 512 keys makes every item short: one run.
        assert_eq!(
            length_runs(true, Some(512), &runs(1, 4096), 128, 32, 132),
            1
        );
        // Fewer items than blocks: each block takes one, and the longest outlasts the share.
        assert_eq!(length_runs(true, None, &runs(1, 512), 128, 8, 132), 4);
    }
}
