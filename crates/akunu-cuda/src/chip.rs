//! ChipConfig: every tuning number of the CUDA backend, derived from the device's properties
//! in one place.
//!
//! Each number can be overridden for experiments with `AKUNU_CHIP_<NAME>` (upper case), e.g.
//! `AKUNU_CHIP_CHAIN=32`, so tuning never needs a rebuild.

use cudarc::driver::sys::CUdevice_attribute as A;
use cudarc::driver::CudaContext;

use crate::matmul::{mma_from_setting, mma_rows_setting};
use crate::CudaError;

#[derive(Clone, Debug)]
pub struct ChipConfig {
    pub name: String,
    pub compute_capability: (i32, i32),
    /// NVRTC architecture: `sm_90a` on Hopper (wgmma and TMA), `sm_XY` elsewhere.
    pub arch: String,
    pub sm_count: usize,
    pub l2_bytes: usize,
    /// Shared memory a block may opt into.
    pub smem_per_block: usize,
    pub total_memory: usize,
    /// Tokens decoded per chain (one host round trip per chain).
    pub chain: usize,
    /// Tokens of the first chain of a generation, so the first words show at once.
    pub first_chain: usize,
    /// Warps per block of the GEMV kernels (a power of two, at most 8).
    pub gemv_warps: usize,
    /// Warps per block of the single-token products whose rows are at most one chunk per lane
    /// (1,024 values of the 32-value types): measured faster at 8 than 4 on qwen3-0.6b
    /// (docs/perf/2026-11-23-narrow-products.md). 0: `gemv_warps`.
    pub gemv_narrow_warps: usize,
    /// Warps per SM a GEMV launch aims for: with fewer row groups than that, each row's
    /// columns are split over up to `gemv_warps` warps (0: never split). 4 against 8 on an
    /// H100: tg128 +0.9 % on llama3.2-1b q4_0, level (within ±0.15 %) on qwen3-0.6b q4_0,
    /// qwen3-4b q4_k and llama3.1-8b q4_0 and q4_k
    /// (docs/perf/2026-12-07-decode-attention-phases.md).
    pub gemv_fill_warps: usize,
    /// Products of one input (q, k and v) that share a GEMV launch, 1 to 3.
    pub gemv_parts: usize,
    /// GEMV warps request their first weights before waiting for the preceding kernel (under
    /// dependent launch).
    pub gemv_early_loads: bool,
    /// Single-token products whose rows are at most one chunk per lane let the next kernel
    /// start before they wait for the preceding one (under dependent launch): their own work
    /// after the wait is too short to cover the next kernel's start.
    pub gemv_narrow_release: bool,
    /// The products of one and two tokens with unsplit rows launch at most this many times the
    /// blocks the GPU holds at once, and their warps walk the rest (0: one block per row group).
    pub gemv_waves: usize,
    /// Greedy decode chains choose their token inside the output product
    /// (`matmul::gemv_argmax`) instead of in an argmax launch over the written logits: tg128
    /// +0.5 % (qwen3-0.6b), +0.4 % (llama3.2-1b) (docs/perf/2026-12-07-argmax-in-product.md).
    pub gemv_argmax: bool,
    /// Largest batch served by the GEMV kernels; larger batches use the tiled GEMM.
    pub gemv_max_m: usize,
    /// Smallest batch whose products run on tensor cores (`gemv_mma_*` in `kernels/gemv.cu`,
    /// Q4_0, Q4_K and Q6_K rows of a multiple of 128 values, compute capability 8.0 and later);
    /// 0: never (else at least 2).
    /// Default 5: from 5 to 16 tokens they measured 1.2–2.1x faster than the `dp4a` products,
    /// at 4 no faster on large matrices (docs/perf/2026-11-24-batched-products-mma.md).
    pub gemv_mma_from: usize,
    /// Below `gemv_mma_from`, the smallest batch whose products run on tensor cores where the
    /// launch suits them (`MatmulKernels::mma_for`: the layers' matrices, not the vocabulary;
    /// Q4_K's plain products from one token more); 0: none (else at least 2). Default 3.
    pub gemv_mma_small_from: usize,
    /// Weight rows per block of those products: 16 or 32 (Q6_K: always 16), or 0: 32 where
    /// a launch still has two blocks an SM with them, else 16 (more blocks fill the GPU, fewer
    /// share each activation load; docs/perf/2026-11-25-mma-activation-loads.md).
    pub gemv_mma_rows: usize,
    /// Single-token decode folds each block's residual add and the next RMSNorm into the
    /// output projection before it (`matmul::gemv_residual_norm`), where the block has no
    /// post-norm: no norm launches between blocks. The value is the most blocks (a thread
    /// block cluster, Hopper and later) that share a 32-row group of that product when there
    /// are too few groups to fill the GPU, up to 4; 0 keeps the norms apart.
    pub gemv_norm: usize,
    /// The smallest matrix whose `gemv_norm` product may share its groups over clusters.
    pub gemv_norm_split_bytes: usize,
    /// Where `gemv_norm` folds a norm into a product whose input is f32 (the FFN's down
    /// projection), each block of that product quantizes the input values it reads itself, so
    /// no quantize launch precedes it, if they are at most this many; 0: never.
    pub gemv_norm_quant: usize,
    /// Residual norm products launched on at most this many blocks (default: half the SMs)
    /// take a whole SM's shared memory per block, so no block of the next kernel, scheduled
    /// early under dependent launch, shares their SMs: with most SMs free, such a block only
    /// ends the next launch late. qwen3-0.6b tg128 +0.7 %, and +4.3 % once its residual norm
    /// product needed fewer registers and so left room for one
    /// (docs/perf/2026-11-24-row-dots-ring.md). Launches that fill the GPU keep the early start
    /// beside them. 0: never.
    pub gemv_norm_alone: usize,
    /// Which residual norm products over an input already quantized (the attention block's o
    /// projection) release the next kernel before their wait, as narrow products do: 0 none;
    /// 1 (default) those over Q4_0 weights whose blocks share SMs (not `gemv_norm_alone`);
    /// 2 all. On an H100, all against none: tg128 +1.7 % (llama3.2-1b q4_0), +1.8 %
    /// (llama3.1-8b q4_0), but −0.4 % on qwen3-0.6b q4_0 (its o blocks alone), −0.8 % on
    /// qwen3-4b q4_k and −0.9 % on llama3.1-8b q4_k
    /// (docs/perf/2026-12-06-o-product-release.md); the default against none again, +1.4 % and
    /// +1.8 % (docs/perf/2026-12-07-o-release-sweep.md).
    pub gemv_norm_release: usize,
    /// Decode steps launch their kernels with programmatic dependent launch (Hopper and later),
    /// so each one is scheduled while its predecessor drains; `AKUNU_CHIP_DEPENDENT_LAUNCH=0`
    /// turns it off.
    pub dependent_launch: bool,
    /// Head size from which decode attention does the token's QK-norm, RoPE and KV store
    /// itself (one launch fewer per layer); below it they keep a launch of their own. Default
    /// 0, every head size: at head size 64 the fused kernel first measured slower
    /// (docs/perf/2026-11-22-rope-in-attention.md), but with today's decode kernels llama3.2-1b
    /// gains 2.5–3.1 % tg128 from depth 0 to 16K on an H200 and 2.3–3.3 % on an H100
    /// (docs/perf/2026-11-24-rope-at-head-64.md). A large value: never.
    pub rope_in_attention_from: usize,
    /// Prefill attention runs on Hopper's warpgroup MMA (`flash_prefill_wg`) where the head
    /// sizes allow (64, 128 or 256, equal for K and V); `AKUNU_CHIP_WGMMA_ATTENTION=0` keeps
    /// the `mma.sync` kernel.
    pub wgmma_attention: bool,
    /// At most this many persistent blocks of `flash_prefill_wg` (0: one per SM). With fewer,
    /// each block takes more work items in turn, which is how the tests reach the hand-over
    /// from one item to the next on small problems. Split-KV launches (few tiles, long
    /// contexts) keep one block per item.
    pub wgmma_prefill_blocks: usize,
    /// Decode attention takes one block per SM: split counts are planned for one resident
    /// block per SM, and a launch of at most one block per SM asks for more than half an SM's
    /// shared memory, so the block scheduler cannot put two of its blocks on one SM (under
    /// dependent launch it did, on SMs with room while the previous kernel drained, and those
    /// SMs then ended the launch): tg128 on llama3.1-8b +1.4 % at depth 0 and +4–9 % at depth
    /// 4K–32K (docs/perf/2026-11-23-decode-spread.md). `AKUNU_CHIP_DECODE_SPREAD=0` plans and
    /// packs every block that fits.
    pub decode_spread: bool,
    /// Warps of every decode attention block, 4 or 8 (`FlashConfig::with_decode_warps`: 8
    /// only where head sizes up to 128 leave room for their rings); 0: the kernels' own choice,
    /// 8 wherever they fit.
    pub decode_warps: usize,
    /// Most blocks one row of logits is split over by the sampler (1 to 64; fewer where a
    /// launch's rows would not fit one wave of one block per SM).
    pub sample_splits: usize,
}

fn env_override(name: &str, default: usize) -> usize {
    std::env::var(format!("AKUNU_CHIP_{}", name.to_ascii_uppercase()))
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

impl ChipConfig {
    pub fn from_context(ctx: &CudaContext) -> Result<ChipConfig, CudaError> {
        let attr = |a: A, what: &str| {
            ctx.attribute(a)
                .map_err(|e| CudaError::driver(&format!("reading the device's {what}"), e))
        };
        let major = attr(
            A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            "compute capability",
        )?;
        let minor = attr(
            A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            "compute capability",
        )?;
        let sm_count = attr(
            A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            "multiprocessors",
        )? as usize;
        let l2_bytes = attr(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, "L2 size")? as usize;
        let smem_per_block = attr(
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            "shared memory",
        )? as usize;
        let name = ctx
            .name()
            .map_err(|e| CudaError::driver("reading the device's name", e))?;
        let total_memory = ctx
            .total_mem()
            .map_err(|e| CudaError::driver("reading the device's memory", e))?;
        Ok(ChipConfig::derive(
            name,
            (major, minor),
            sm_count,
            l2_bytes,
            smem_per_block,
            total_memory,
        ))
    }

    /// The tuning for a device with these properties.
    pub fn derive(
        name: String,
        compute_capability: (i32, i32),
        sm_count: usize,
        l2_bytes: usize,
        smem_per_block: usize,
        total_memory: usize,
    ) -> ChipConfig {
        let (major, minor) = compute_capability;
        let arch = if major == 9 && minor == 0 {
            "sm_90a".to_string()
        } else {
            format!("sm_{major}{minor}")
        };
        ChipConfig {
            name,
            compute_capability,
            wgmma_attention: arch == "sm_90a" && env_override("wgmma_attention", 1) != 0,
            wgmma_prefill_blocks: env_override("wgmma_prefill_blocks", 0),
            decode_spread: env_override("decode_spread", 1) != 0,
            decode_warps: env_override("decode_warps", 0),
            arch,
            sm_count,
            l2_bytes,
            smem_per_block,
            total_memory,
            chain: env_override("chain", 64),
            first_chain: env_override("first_chain", 4),
            gemv_warps: env_override("gemv_warps", 4)
                .clamp(1, 8)
                .next_power_of_two(),
            gemv_narrow_warps: env_override("gemv_narrow_warps", 8),
            gemv_fill_warps: env_override("gemv_fill_warps", 4),
            gemv_parts: env_override("gemv_parts", 3).clamp(1, crate::matmul::MAX_PARTS),
            gemv_early_loads: env_override("gemv_early_loads", 1) != 0,
            gemv_narrow_release: env_override("gemv_narrow_release", 1) != 0,
            gemv_waves: env_override("gemv_waves", 1),
            gemv_argmax: env_override("gemv_argmax", 1) != 0,
            gemv_max_m: env_override("gemv_max_m", crate::matmul::MAX_M)
                .clamp(1, crate::matmul::MAX_M),
            gemv_mma_from: mma_from_setting(env_override("gemv_mma_from", 5)),
            gemv_mma_small_from: mma_from_setting(env_override("gemv_mma_small_from", 3)),
            gemv_mma_rows: mma_rows_setting(env_override("gemv_mma_rows", 0)),
            gemv_norm: env_override("gemv_norm", 2).min(if major >= 9 { 4 } else { 1 }),
            gemv_norm_split_bytes: env_override("gemv_norm_split_bytes", 2 << 20),
            gemv_norm_quant: env_override("gemv_norm_quant", 16384),
            gemv_norm_alone: env_override("gemv_norm_alone", sm_count / 2),
            gemv_norm_release: env_override("gemv_norm_release", 1),
            dependent_launch: major >= 9 && env_override("dependent_launch", 1) != 0,
            rope_in_attention_from: env_override("rope_in_attention_from", 0),
            sample_splits: env_override("sample_splits", crate::sample::MAX_SPLITS)
                .clamp(1, crate::sample::MAX_SPLITS),
        }
    }
}
