// FlashAttention on tensor cores: mma.sync m16n8k16 (f16 or bf16 in, f32 accumulate), one kernel
// family for prefill, chunked prefill, decode and speculative verification.
//
// Compiled per element type and head sizes: -DHEAD_DIM, -DHEAD_DIM_V (16..256, multiples of
// 16), -DKV_BF16 (K, V and Q are bf16, else f16), -DQ_F32 (queries are read as f32 and rounded to
// the element type), -DOUT_F32 (output rows are f32, else the element type), -DFLASH_DEBUG,
// -DFLASH_TIMELINE (flash_prefill_wg's per-step and flash_decode's per-phase timelines, see
// Timeline).
//
// Plan:
// 1. Rows, not heads: a block owns query rows of one KV head, packed as (token, query head of
//    the group) pairs, so each K/V tile is read once for every query head that shares it (GQA)
//    and a decode token fills a 16-row tile with its group's heads. A tile of tokens is a run of
//    consecutive tokens of one sequence (host list, prefill) or one token (decode, so a captured
//    graph needs no host data). Groups wider than the tile are split into head chunks
//    (gridDim.y = n_head_kv * chunks).
// 2. The block walks the keys its rows can see (the union of their causal and window ranges,
//    so whole masked tiles are never loaded). Split-KV (gridDim.z) gives each split a slice of
//    that range; a split writes normalised partial rows with their log2-sum-exp, and the last
//    split of a tile to finish (a counter per tile; in decode, the last to finish its steps,
//    once the others' rows are stored) merges them, so no second launch is needed.
// 3. A warp step over a K/V tile in shared memory: S = Q K^T (Q fragments kept in registers for
//    head sizes up to 128), scale (and soft-cap), the per-element mask only where some row of
//    the warp does not see the whole step (causal edge, window edge, segments, tree), online
//    softmax in the log2 domain with per-thread partial row sums, then P (re-packed from the S
//    accumulators as A fragments, FA2) times V (ldmatrix.trans). Tiles are XOR-swizzled so
//    ldmatrix is conflict-free.
// 4. Prefill (flash_prefill): four warps own two 16-row tiles each (one for head sizes past
//    128), so each K or V fragment feeds two MMAs per tile, and share BN-key tiles, double
//    buffered with cp.async. On Hopper, head sizes 64 and 128 prefill on wgmma instead
//    (flash_prefill_wg: persistent blocks of a producer warpgroup and two consumer
//    warpgroups, see there).
//    Decode (flash_decode): one 16-row tile, the block's keys cut into
//    four contiguous ranges, one per warp, each warp streaming its own range through a
//    three-stage cp.async ring of 16-key tiles with no block-wide barrier; the warps' states
//    merge through shared memory at the end. Decode is bound by memory: many warps, each with
//    two tiles in flight, keep enough bytes moving.
// 5. Rows without a visible key give zeros and lse = -inf, never NaN: the running max stays
//    -inf and exponentials are taken against 0 instead.
// 6. Decode with f32 output can also write its rows in the GEMVs' int8 form (actq.cuh), which
//    saves the output projection its quantize launch.
// 7. Decode with f32 queries can also do the token's QK-norm, RoPE and KV-cache store
//    (DecodeRope), which saves the engine the launch of qk_rope_store (rope.cu).
#include "common.cuh"
#include "mma.cuh"
#include "actq.cuh"
#include "rope.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef HEAD_DIM_V
#define HEAD_DIM_V HEAD_DIM
#endif
#ifndef KV_BF16
#define KV_BF16 0
#endif
#ifndef Q_F32
#define Q_F32 0
#endif
#ifndef OUT_F32
#define OUT_F32 0
#endif
#if KV_BF16
#define WG_T "bf16"
#else
#define WG_T "f16"
#endif
#include "wgmma.cuh"

#define FLASH_NEG_INF __int_as_float(0xff800000)
#define FLASH_LOG2E 1.4426950408889634f
#define FLASH_LN2 0.6931471805599453f

constexpr int D = HEAD_DIM;
constexpr int DV = HEAD_DIM_V;
constexpr u32 QROW = D * 2, KROW = D * 2, VROW = DV * 2;
// Bytes of an output value.
constexpr u32 OUT_BYTES = OUT_F32 ? 4 : 2;
// Prefill: keys per step, 64, or 32 when a row is wider than 256 bytes (two stages in 64 KiB).
constexpr int BN = (D > 128 || DV > 128) ? 32 : 64;
constexpr int PREFILL_WARPS = 4;
// Row tiles of 16 per prefill warp: two where the registers allow (each K or V fragment then
// feeds twice the MMAs, halving shared-memory traffic per MMA), else one.
constexpr int PREFILL_MT = (D > 128 || DV > 128) ? 1 : 2;
// Prefill K/V stages (a third measured no faster: the loop is bound by the tensor cores and
// shared memory, not by the loads).
constexpr int PREFILL_STAGES = 2;
// Decode: warps per block, keys per warp step, and stages of each warp's ring (8 warps of two
// stages, or 4 of three: the host's FlashConfig::with_decode_warps).
#ifndef DECODE_WARPS
#define DECODE_WARPS 4
#endif
#ifndef DECODE_STAGES
#define DECODE_STAGES 3
#endif
constexpr int DEC_WARPS = DECODE_WARPS;
constexpr int DEC_KEYS = 16;
constexpr int DEC_STAGES = DECODE_STAGES;
// The split rule's step: four warps' keys whatever DEC_WARPS (the host's SPLIT_STEP_KEYS).
constexpr int SPLIT_KEYS = 4 * DEC_KEYS;
static_assert(DEC_WARPS == 4 || DEC_WARPS == 8, "decode blocks of 4 or 8 warps");


// A CUDA tensor map (CUtensorMap): 128 opaque bytes, aligned as CUDA 13 aligns them.
struct alignas(128) TensorMap {
    u64 bits[16];
};

// Kernel parameters, passed by value; the host mirrors this layout (`FlashParams` in
// src/flash.rs): the tensor maps, 8-byte fields, then 4-byte ones.
struct FlashParams {
    // K and V caches as tensors (head dim, position, KV head, sequence) for wgmma prefill's
    // tensor copies, boxes of 64 elements by WG_BN keys; valid where `tma` is set.
    TensorMap tma_k, tma_v;
    const void* q;
    const u16* k;
    const u16* v;
    void* out;
    float* lse;
    const u32* q_pos;
    const u32* q_seq;
    const u32* kv_len;
    const int* q_seg;
    const int* k_seg;
    const u64* tree_mask;
    const u32* tree_base;
    const u32* tiles;
    float* part_o;
    float* part_lse;
    u32* counters;
    float* debug;
    // Decode with OUT_F32 and heads DV apart: each token's n_head * DV outputs also as int8
    // levels (act_q, a row per token) and group sums (act_s), or null.
    i8* act_q;
    float4* act_s;
    // Decode with RoPE fused (flash_decode, each token the only one of its sequence): the
    // tokens' unrotated K and V rows (f32, [token][kv head][dim]), the QK-norm weights (or
    // null) and the rotation's frequencies; k_new null turns it off.
    const float* k_new;
    const float* v_new;
    const float* q_norm;
    const float* k_norm;
    const float* inv_freq;
    long long q_tok, q_head;
    long long k_seq, k_head, k_pos;
    long long v_seq, v_head, v_pos;
    long long o_tok, o_head;
    u32 n_tokens, n_head, n_head_kv, n_ctx;
    int causal, window;
    float softcap, scale;
    u32 n_split, debug_tiles;
    u32 n_rot, neox;
    float eps;
    u32 tma;
    // flash_prefill_wg: the tiles and head chunks its work items span, and the runs of tile
    // lengths it hands them out in (wg_work).
    u32 wg_tiles, wg_heads, wg_length_runs;
    // Decode: the splits that fill the wave, which a token takes once each gets a step per
    // warp; 0: never (see decode()).
    u32 fill_splits;
};

// Byte offset of 16-byte chunk c of row r in a tile of `row_bytes` rows: chunks XOR-swizzled by
// the low bits of r inside each 128-byte group (inside the row when it is shorter), so the 8
// rows of an ldmatrix hit different bank groups.
__device__ __forceinline__ u32 fswz(u32 row_bytes, int r, int c) {
    const int mask = row_bytes >= 128 ? 7 : (int)(row_bytes / 16) - 1;
    return (u32)r * row_bytes + ((u32)(c ^ (r & mask)) << 4);
}

// The same for a tile of `rows` rows laid out for wgmma (wgmma.cuh): column blocks of 64
// elements, 128-byte rows, chunks swizzled by the row's low three bits.
__device__ __forceinline__ u32 wswz(u32 rows, int r, int c) {
    return (u32)(c >> 3) * rows * 128 + (u32)r * 128 + ((u32)((c & 7) ^ (r & 7)) << 4);
}

// Chunk c of row r of a tile: the mma.sync layout (fswz), or with WG the wgmma one (wswz).
template <bool WG, u32 ROW, u32 ROWS>
__device__ __forceinline__ u32 tile_at(int r, int c) {
    if constexpr (WG) return wswz(ROWS, r, c);
    else return fswz(ROW, r, c);
}

__device__ __forceinline__ u32 pack2(float lo, float hi) {
#if KV_BF16
    return pack_bf16x2(lo, hi);
#else
    return pack_f16x2(lo, hi);
#endif
}

// One value in the element type's bits.
__device__ __forceinline__ u16 to_elem(float x) {
    return (u16)(pack2(x, 0.f) & 0xffffu);
}

__device__ __forceinline__ void mma(float (&acc)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if KV_BF16
    mma_16816_bf16(acc, a, b0, b1);
#else
    mma_16816(acc, a, b0, b1);
#endif
}

// What one query row may see: keys in [lo, hi), then its token's segment and tree tests
// (read when needed: they are rare, and registers are not).
struct RowMask {
    u32 lo, hi;
    int t;  // the row's token, or -1
    __device__ __forceinline__ bool valid() const { return t >= 0; }
};

// The keys [lo, hi) a query at `pos` may see: causal and window limits within the stored ones.
__device__ __forceinline__ void key_range(const FlashParams& p, u32 pos, u32 kv_len, u32& lo, u32& hi) {
    hi = p.causal ? min(kv_len, pos + 1) : kv_len;
    lo = p.window > 0 && pos + 1 > (u32)p.window ? pos + 1 - (u32)p.window : 0;
}

__device__ __forceinline__ RowMask row_mask(const FlashParams& p, int t, u32 kv_len) {
    RowMask m;
    m.t = t;
    m.lo = 0;
    m.hi = 0;
    if (t >= 0) key_range(p, p.q_pos[t], kv_len, m.lo, m.hi);
    return m;
}

__device__ __forceinline__ bool visible(const FlashParams& p, const RowMask& m, u32 seq, u32 j) {
    if (!m.valid() || j < m.lo || j >= m.hi) return false;
    if (p.q_seg && p.k_seg[(u64)seq * p.n_ctx + j] != p.q_seg[m.t]) return false;
    if (p.tree_mask) {
        const u32 base = p.tree_base[m.t];
        if (j >= base && (j - base >= 64 || !((p.tree_mask[m.t] >> (j - base)) & 1ull))) return false;
    }
    return true;
}

// What a block works on: tile x of the host's list (or token x), head chunk y of `heads`
// (KV head y % n_head_kv, chunk y / n_head_kv), split z. The launch grid's coordinates, except
// in flash_prefill_wg, whose blocks take several.
struct Work {
    u32 x, y, z, heads;
};
__device__ __forceinline__ Work grid_work() { return Work{blockIdx.x, blockIdx.y, blockIdx.z, gridDim.y}; }

// The tile's query rows (token and head, -1 past the tile) and the union of their key ranges,
// and with `row_keys` each row's range (empty past the tile), in shared memory, by THREADS
// threads (tid from 0). Synchronise them before reading.
template <int BM, int THREADS>
__device__ __forceinline__ void tile_rows(const FlashParams& p, const Work& w, u32 t0, u32 ntok, u32 kv_len,
                                          int* row_tok, int* row_head, u32* range, int tid,
                                          u32 (*row_keys)[2] = nullptr) {
    const int lane = tid & 31;
    const u32 group = p.n_head / p.n_head_kv;
    const u32 g = w.y % p.n_head_kv, chunk = w.y / p.n_head_kv;
    const u32 per_token = min(group, (u32)BM), tokens_per_tile = BM / per_token;
    for (int r = tid; r < BM; r += THREADS) {
        const u32 tl = r / per_token, hg = chunk * BM + r % per_token;
        const bool ok = (u32)r < tokens_per_tile * per_token && tl < ntok && hg < group;
        row_tok[r] = ok ? (int)(t0 + tl) : -1;
        row_head[r] = ok ? (int)(g * group + hg) : 0;
        if (row_keys) {
            u32 lo = 0, hi = 0;
            if (ok) key_range(p, p.q_pos[t0 + tl], kv_len, lo, hi);
            row_keys[r][0] = lo;
            row_keys[r][1] = hi;
        }
    }
    if (tid < 32) {
        u32 lo = 0xffffffffu, hi = 0;
        for (u32 i = lane; i < ntok; i += 32) {
            u32 l, h;
            key_range(p, p.q_pos[t0 + i], kv_len, l, h);
            lo = min(lo, l);
            hi = max(hi, h);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
            hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
        }
        if (lane == 0) {
            range[0] = min(lo, hi);
            range[1] = hi;
        }
    }
}

// Split z's slice [kb, ke) of the keys [blo, bhi) cut in n_split, in whole multiples of
// `gran` keys from blo, so a step never straddles two slices.
__device__ __forceinline__ void split_slice(u32 n_split, u32 z, u32 blo, u32 bhi, u32 gran, u32& kb, u32& ke) {
    u32 per_split = (bhi - blo + n_split - 1) / n_split;
    per_split = (per_split + gran - 1) / gran * gran;
    kb = min(bhi, blo + z * per_split);
    ke = min(bhi, kb + per_split);
}

// Queries of the tile into shared memory as 16-byte chunks, zeros for rows past the tile.
template <int BM, int THREADS, bool WG = false>
__device__ __forceinline__ void load_q(const FlashParams& p, u32 base, const int* row_tok,
                                       const int* row_head, int tid) {
    constexpr int CH = D / 8;
#if Q_F32
    // f32 queries are rounded to 16 bits on the way. Each pass reads two chunks as float4
    // pairs, four loads in flight: enough for wgmma prefill's preparing warps, which have few
    // registers (one chunk at a time left them waiting on each load).
    const auto src = [&](int i) -> const float4* {
        const int r = i / CH, t = row_tok[r];
        return t >= 0 ? (const float4*)((const float*)p.q + t * p.q_tok + row_head[r] * p.q_head + i % CH * 8)
                      : nullptr;
    };
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int i = tid; i < BM * CH; i += 2 * THREADS) {
        float4 lo[2], hi[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const float4* q = i + k * THREADS < BM * CH ? src(i + k * THREADS) : nullptr;
            lo[k] = q ? q[0] : zero;
            hi[k] = q ? q[1] : zero;
        }
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int j = i + k * THREADS;
            if (j >= BM * CH) break;
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(base + tile_at<WG, QROW, BM>(j / CH, j % CH)),
                         "r"(pack2(lo[k].x, lo[k].y)), "r"(pack2(lo[k].z, lo[k].w)), "r"(pack2(hi[k].x, hi[k].y)),
                         "r"(pack2(hi[k].z, hi[k].w))
                         : "memory");
        }
    }
#else
    for (int i = tid; i < BM * CH; i += THREADS) {
        const int r = i / CH, c = i % CH;
        const int t = row_tok[r];
        const u16* src = (const u16*)p.q + (t >= 0 ? t * p.q_tok + row_head[r] * p.q_head + c * 8 : 0);
        cp_async16(base + tile_at<WG, QROW, BM>(r, c), src, t >= 0 ? 16 : 0);
    }
#endif
}

// KEYS rows of CH 16-byte chunks from `src` (row stride `stride` elements) into a swizzled tile
// at dst, by THREADS threads. Where CH divides THREADS, thread tid always moves chunk tid % CH of
// rows tid / CH + j * THREADS / CH, so each copy costs an add and the swizzle. Rows at or past
// `avail` read as zeros (they are masked, or belong to no query). ONCE: rows read once in the
// launch (decode's keys), marked evict-first in L2.
template <int THREADS, int KEYS, int CH, u32 ROW, bool WG = false, bool ONCE = false>
__device__ __forceinline__ void load_rows(u32 dst, const u16* src, long long stride, u32 avail, int tid) {
    constexpr int RPP = THREADS / CH;  // rows per pass
    const auto copy = [](u32 to, const u16* from, int bytes) {
        if constexpr (ONCE) cp_async16(to, from, bytes, l2_evict_first());
        else cp_async16(to, from, bytes);
    };
    if constexpr (THREADS % CH == 0 && KEYS % RPP == 0) {
        const int r0 = tid / CH, c = tid % CH;
        const u16* s = src + r0 * stride + c * 8;
        // Fully unrolled where the loads share the compute warps' registers; a few at a time
        // in wgmma prefill's producer, which has few registers.
        constexpr int UNROLL = WG ? 2 : KEYS / RPP;
#pragma unroll UNROLL
        for (int j = 0; j < KEYS / RPP; ++j) {
            const int r = r0 + j * RPP;
            const bool ok = (u32)r < avail;
            copy(dst + tile_at<WG, ROW, KEYS>(r, c), ok ? s + j * RPP * stride : src, ok ? 16 : 0);
        }
    } else {
        for (int i = tid; i < KEYS * CH; i += THREADS) {
            const int r = i / CH, c = i % CH;
            const bool ok = (u32)r < avail;
            copy(dst + tile_at<WG, ROW, KEYS>(r, c), ok ? src + r * stride + c * 8 : src, ok ? 16 : 0);
        }
    }
}

// KEYS keys of K and V from key k0 (before `end`) into the tiles at ks and vs (ONCE: see
// load_rows).
template <int THREADS, int KEYS, bool ONCE = false>
__device__ __forceinline__ void load_kv(const u16* kg, const u16* vg, const FlashParams& p, u32 ks,
                                        u32 vs, u32 k0, u32 end, int tid) {
    load_rows<THREADS, KEYS, D / 8, KROW, false, ONCE>(ks, kg + k0 * p.k_pos, p.k_pos, end - k0, tid);
    load_rows<THREADS, KEYS, DV / 8, VROW, false, ONCE>(vs, vg + k0 * p.v_pos, p.v_pos, end - k0, tid);
}

// A warp's 16 query rows as mma A fragments: in registers (REGS), or read from the shared tile
// at each use where registers are short (large heads, two row tiles per warp).
template <bool REGS>
struct QTile {
    u32 f[REGS ? D / 16 : 1][4];
    u32 rows;
    __device__ __forceinline__ void init(u32 rows_at, int lane) {
        rows = rows_at;
        if constexpr (REGS) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) ldsm_x4(f[kk], rows_at + fswz(QROW, lane & 15, 2 * kk + (lane >> 4)));
        }
    }
    __device__ __forceinline__ void frag(int kk, int lane, u32 (&a)[4]) const {
        if constexpr (REGS) {
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = f[kk][i];
        } else {
            ldsm_x4(a, rows + fswz(QROW, lane & 15, 2 * kk + (lane >> 4)));
        }
    }
};

// One warp's online-softmax state for its 16 rows: this thread's C-fragment rows (lane / 4 and
// lane / 4 + 8), the running max (log2 domain) and this thread's part of the row sums.
struct WarpState {
    float o[DV / 8][4];
    float row_max[2], row_sum[2];
    __device__ __forceinline__ void init() {
#pragma unroll
        for (int i = 0; i < DV / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
        row_max[0] = row_max[1] = FLASH_NEG_INF;
        row_sum[0] = row_sum[1] = 0.f;
    }
    // The whole row sum, on every lane of the quad.
    __device__ __forceinline__ float sum(int i) const {
        float l = row_sum[i];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        return l;
    }
};

// Floats per step of the debug dump: scores[16][KN], probs[16][KN], running max[16], running
// sum[16], unnormalised out[16][DV], in natural-log units.
template <int KN>
constexpr int debug_step_floats() {
    return 2 * 16 * KN + 32 + 16 * DV;
}

#ifdef FLASH_DEBUG
// A 16 x KN C-fragment tile (times `unit`) into dst, row-major.
template <int KN>
__device__ __forceinline__ void dump_tile(float* dst, const float (&s)[KN / 8][4], float unit, int lane) {
#pragma unroll
    for (int nt = 0; nt < KN / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dst[((lane >> 2) + 8 * (e >> 1)) * KN + nt * 8 + 2 * (lane & 3) + (e & 1)] = s[nt][e] * unit;
}
#endif

// Whether every row of the warp sees all KN keys from k0 by its key range alone (no segments,
// no tree mask), so that the step's scores need no mask.
template <int KN, int MT>
__device__ __forceinline__ bool whole_step(const FlashParams& p, const RowMask (&rm)[MT][2], u32 k0) {
    bool whole = !p.q_seg && !p.tree_mask;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int i = 0; i < 2; ++i)
            whole = whole && (!rm[m][i].valid() || (k0 >= rm[m][i].lo && k0 + KN <= rm[m][i].hi));
    return __all_sync(0xffffffffu, whole);
}

// A step's scores, -inf where masked (the per-element mask only where the step is not `whole`
// for the warp, whole_step), soft-capped into the log2 domain where asked for. Returns the
// factor that takes them to the log2 domain: the scale, folded into softmax_probs' exponent,
// or 1 after soft-capping.
template <int KN, int MT>
__device__ __forceinline__ float mask_scores(const FlashParams& p, float (&s)[MT][KN / 8][4],
                                            const RowMask (&rm)[MT][2], u32 k0, u32 seq, int lane, bool whole) {
    // Uniform branches outside the element loops, so the common path is straight-line code.
    float unit = p.scale * FLASH_LOG2E;
    if (p.softcap > 0.f) {
        const float inv_cap = p.scale / p.softcap, cap_log2 = p.softcap * FLASH_LOG2E;
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int nt = 0; nt < KN / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[m][nt][e] = cap_log2 * tanh_accurate(s[m][nt][e] * inv_cap);
        unit = 1.f;
    }
    if (!whole && !p.q_seg && !p.tree_mask) {
        // Key ranges only (causal, window, stored length): a compare and a select per score,
        // no branches. A row past the tile has the empty range.
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int nt = 0; nt < KN / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const u32 j = k0 + nt * 8 + 2 * (lane & 3) + (e & 1);
                    const RowMask& r = rm[m][e >> 1];
                    s[m][nt][e] = j >= r.lo && j < r.hi ? s[m][nt][e] : FLASH_NEG_INF;
                }
    } else if (!whole) {
        // Segments or a tree mask (rare): every score's test in a loop that is not unrolled, so
        // the hot loop's code stays small. Bit i of `seen` is score i in (m, nt, e) order.
        constexpr int N = MT * KN / 2;
        static_assert(N <= 64, "one bit per score of the thread");
        static_assert(MT <= 2, "row masks picked for at most two row tiles");
        u64 seen = 0;
#pragma unroll 1
        for (int i = 0; i < N; ++i) {
            const int m = i / (KN / 2), nt = i / 4 % (KN / 8), e = i % 4;
            const RowMask& r0 = MT > 1 && m > 0 ? rm[MT - 1][0] : rm[0][0];
            const RowMask& r1 = MT > 1 && m > 0 ? rm[MT - 1][1] : rm[0][1];
            if (visible(p, e >> 1 ? r1 : r0, seq, k0 + nt * 8 + 2 * (lane & 3) + (e & 1))) seen |= 1ull << i;
        }
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int nt = 0; nt < KN / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (!((seen >> ((m * (KN / 8) + nt) * 4 + e)) & 1)) s[m][nt][e] = FLASH_NEG_INF;
    }
    return unit;
}

// How far (log2 units) the kernels let a row's running maximum lag behind its scores: the
// probabilities stay below 2^8, and the output is rescaled on few steps.
constexpr int SOFTMAX_SLACK = 8;

// The online-softmax update of a step whose scores times `unit` (positive) are in the log2
// domain: running maxima, the scores turned into probabilities and added to the row sums, and
// in `corr` the factors the output must be rescaled by (all ones when the function returns
// true, so the rescale can be skipped).
//
// A row keeps its maximum until a step's scores exceed it by more than SLACK (FA4's lazy
// rescale; SLACK = 0 is the exact update): the probabilities stay below 2^SLACK, and the
// output and sum, scaled alike, need rescaling only on the rare steps that move a maximum that
// far. Each thread first reduces its own scores' maxima (a tree) and the warp votes whether any
// exceeds its row's maximum plus SLACK; only then do the rows' maxima cross the quad and the
// factors follow. With SLACK > 0 nearly every step skips that part.
template <int KN, int MT, int SLACK>
__device__ __forceinline__ bool softmax_probs(WarpState (&st)[MT], float (&s)[MT][KN / 8][4], float (&corr)[MT][2],
                                              float unit) {
    float mx[MT][2];
    bool over = false;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            float v[KN / 8];
#pragma unroll
            for (int nt = 0; nt < KN / 8; ++nt) v[nt] = fmaxf(s[m][nt][2 * i], s[m][nt][2 * i + 1]);
#pragma unroll
            for (int w = KN / 16; w > 0; w /= 2)
#pragma unroll
                for (int k = 0; k < KN / 16; ++k)
                    if (k < w) v[k] = fmaxf(v[k], v[k + w]);
            mx[m][i] = v[0] * unit;
            over = over || mx[m][i] > st[m].row_max[i] + (float)SLACK;
            corr[m][i] = 1.f;
        }
    bool same = true;
    if (__any_sync(0xffffffffu, over)) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                float r = fmaxf(mx[m][i], __shfl_xor_sync(0xffffffffu, mx[m][i], 1));
                r = fmaxf(r, __shfl_xor_sync(0xffffffffu, r, 2));
                const float old = st[m].row_max[i];
                if (r > old + (float)SLACK) {
                    corr[m][i] = exp2f(old - r);
                    st[m].row_max[i] = r;
                    st[m].row_sum[i] *= corr[m][i];
                }
            }
        // Once the maxima settle, most steps leave them unchanged.
#pragma unroll
        for (int m = 0; m < MT; ++m) same = same && corr[m][0] == 1.f && corr[m][1] == 1.f;
        same = __all_sync(0xffffffffu, same);
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        // A row without a maximum yet has only masked scores so far.
        const float base[2] = {st[m].row_max[0] == FLASH_NEG_INF ? 0.f : st[m].row_max[0],
                               st[m].row_max[1] == FLASH_NEG_INF ? 0.f : st[m].row_max[1]};
#pragma unroll
        for (int nt = 0; nt < KN / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float pr = exp2f(fmaf(s[m][nt][e], unit, -base[e >> 1]));
                s[m][nt][e] = pr;
                st[m].row_sum[e >> 1] += pr;
            }
    }
    return same;
}

// The output rows times the step's rescale factors (softmax_probs), unless they are all ones.
template <int MT>
__device__ __forceinline__ void rescale_out(WarpState (&st)[MT], const float (&corr)[MT][2], bool same) {
    if (same) return;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int dt = 0; dt < DV / 8; ++dt) {
            st[m].o[dt][0] *= corr[m][0];
            st[m].o[dt][1] *= corr[m][0];
            st[m].o[dt][2] *= corr[m][1];
            st[m].o[dt][3] *= corr[m][1];
        }
}

// Probabilities of keys 16kk..16kk+15 as an A fragment (the C fragments' layout matches, FA2).
template <int KN>
__device__ __forceinline__ void prob_frag(const float (&s)[KN / 8][4], int kk, u32 (&a)[4]) {
    a[0] = pack2(s[2 * kk][0], s[2 * kk][1]);
    a[1] = pack2(s[2 * kk][2], s[2 * kk][3]);
    a[2] = pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// One warp step over KN keys from k0, whose K and V tiles are at ks and vs, for MT tiles of 16
// rows (each K or V fragment feeds MT MMAs). `dbg` (debug builds) receives the first row
// tile's state after this step, or is null.
template <int KN, int MT, bool QREGS>
__device__ __forceinline__ void attend(const FlashParams& p, WarpState (&st)[MT], const QTile<QREGS> (&q)[MT],
                                       u32 ks, u32 vs, u32 k0, const RowMask (&rm)[MT][2], u32 seq, int lane,
                                       float* dbg) {
    // The scores' MMAs form MT * KN / 8 chains, each D / 16 long. With fewer than four (decode:
    // one row tile, 16 keys) a warp, alone on its scheduler, waits out each link: the odd
    // head-dim steps then accumulate apart (s2) and are added at the end, halving the chains'
    // length (decode at 4K keys +0.9 % tg on qwen3-0.6b, docs/perf/2026-11-23-narrow-products.md).
    constexpr bool TWO_CHAINS = MT * KN / 8 < 4;
    float s[MT][KN / 8][4] = {}, s2[KN / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        u32 a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) q[m].frag(kk, lane, a[m]);
#pragma unroll
        for (int np = 0; np < KN / 16; ++np) {
            u32 b[4];
            ldsm_x4(b, ks + fswz(KROW, np * 16 + (lane & 7) + ((lane >> 4) << 3), 2 * kk + ((lane >> 3) & 1)));
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                float(&acc)[KN / 8][4] = TWO_CHAINS && (kk & 1) ? s2 : s[m];
                mma(acc[2 * np], a[m], b[0], b[1]);
                mma(acc[2 * np + 1], a[m], b[2], b[3]);
            }
        }
    }
    if constexpr (TWO_CHAINS) {
#pragma unroll
        for (int i = 0; i < KN / 8; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[0][i][e] += s2[i][e];
    }

    const float unit = mask_scores<KN, MT>(p, s, rm, k0, seq, lane, whole_step<KN, MT>(p, rm, k0));
#ifdef FLASH_DEBUG
    if (dbg) dump_tile<KN>(dbg, s[0], unit * FLASH_LN2, lane);
#endif
    float corr[MT][2];
#ifdef FLASH_DEBUG
    // The dumps hold the running maxima, compared with the reference's exact ones.
    const bool same = softmax_probs<KN, MT, 0>(st, s, corr, unit);
#else
    const bool same = softmax_probs<KN, MT, SOFTMAX_SLACK>(st, s, corr, unit);
#endif
    rescale_out<MT>(st, corr, same);

#pragma unroll
    for (int kk = 0; kk < KN / 16; ++kk) {
        u32 a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) prob_frag<KN>(s[m], kk, a[m]);
#pragma unroll
        for (int dp = 0; dp < DV / 16; ++dp) {
            u32 b[4];
            ldsm_x4_trans(b, vs + fswz(VROW, kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), 2 * dp + (lane >> 4)));
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                mma(st[m].o[2 * dp], a[m], b[0], b[1]);
                mma(st[m].o[2 * dp + 1], a[m], b[2], b[3]);
            }
        }
    }

#ifdef FLASH_DEBUG
    if (dbg) {
        dump_tile<KN>(dbg + 16 * KN, s[0], 1.f, lane);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const float l = st[0].sum(i);
            const int r = (lane >> 2) + 8 * i;
            if ((lane & 3) == 0) {
                dbg[2 * 16 * KN + r] = st[0].row_max[i] * FLASH_LN2;
                dbg[2 * 16 * KN + 16 + r] = l;
            }
#pragma unroll
            for (int dt = 0; dt < DV / 8; ++dt) {
                const int c = dt * 8 + 2 * (lane & 3);
                dbg[2 * 16 * KN + 32 + r * DV + c] = st[0].o[dt][2 * i];
                dbg[2 * 16 * KN + 32 + r * DV + c + 1] = st[0].o[dt][2 * i + 1];
            }
        }
    }
#else
    (void)dbg;
#endif
}

// A finished row's normaliser 1 / l and log2-sum-exp from its sum l and maximum mx (log2
// domain); a row without a visible key gets 0 and -inf, so its output is zeros, never NaN.
__device__ __forceinline__ void row_finish(float l, float mx, float& inv, float& lse2) {
    inv = l > 0.f ? 1.f / l : 0.f;
    lse2 = l > 0.f ? mx + __log2f(l) : FLASH_NEG_INF;
}

// Row (t, h)'s natural log-sum-exp from its log2 form, for callers that asked for it.
__device__ __forceinline__ void store_lse(const FlashParams& p, int t, int h, float lse2) {
    p.lse[(u64)t * p.n_head + h] = lse2 * FLASH_LN2;
}

// Two finished output values, columns c and c + 1 of row (t, h), with the row's log2-sum-exp
// (written once per row, by the caller that passes `first`): into split z's partials
// (`partial`), or into the output.
__device__ __forceinline__ void store2(const FlashParams& p, bool partial, u32 z, int t, int h, int c,
                                       float x, float y, float lse2, bool first) {
    if (partial) {
        const u64 row = ((u64)z * p.n_tokens + t) * p.n_head + h;
        *(float2*)(p.part_o + row * DV + c) = make_float2(x, y);
        if (first) p.part_lse[row] = lse2;
        return;
    }
    const long long off = t * p.o_tok + h * p.o_head + c;
#if OUT_F32
    *(float2*)((float*)p.out + off) = make_float2(x, y);
#else
    *(u32*)((u16*)p.out + off) = pack2(x, y);
#endif
    if (p.lse && first) store_lse(p, t, h, lse2);
}

// VALS finished output values of row (t, h) from column c in the GEMVs' int8 form, when asked
// for (the host asks only with DV a multiple of 64, so a warp's values never straddle a row
// and every group is whole). Every lane of the warp calls it; `valid` lanes store.
template <int VALS>
__device__ __forceinline__ void store_act(const FlashParams& p, bool valid, int t, int h, int c,
                                          const float (&v)[VALS]) {
    if (DV % 64 != 0 || !p.act_q) return;
    const u64 at = ((u64)t * p.n_head + h) * DV + c;
    float4 sums;
    const u32 levels = quantize_group<VALS>(v, threadIdx.x & 31, sums);
    if (!valid) return;
    store_levels<VALS>(p.act_q + at, levels);
    if (at % 32 == 0) p.act_s[at / 32] = sums;
}

// A barrier over the block (BAR 0), or over the THREADS threads that use named barrier BAR.
// Named barriers are the unaligned form: a warp may reach them with its lanes apart (after a
// lane-0 branch or a spin on an mbarrier), and the aligned form then counts the warp early.
template <int THREADS, int BAR>
__device__ __forceinline__ void sync_threads() {
    if constexpr (BAR == 0) __syncthreads();
    else asm volatile("barrier.sync %0, %1;\n" ::"n"(BAR), "n"(THREADS) : "memory");
}
// This thread's arrival at named barrier BAR (of THREADS threads), without waiting for it.
template <int THREADS, int BAR>
__device__ __forceinline__ void arrive_threads() {
    asm volatile("barrier.arrive %0, %1;\n" ::"n"(BAR), "n"(THREADS) : "memory");
}
// sync_threads<THREADS, BAR>, returning whether any of the threads passed true.
template <int THREADS, int BAR>
__device__ __forceinline__ bool sync_threads_or(bool v) {
    if constexpr (BAR == 0) return __syncthreads_or(v);
    u32 any;
    asm volatile("{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbarrier.red.or.pred q, %2, %3, p;\nselp.u32 %0, 1, 0, q;\n}\n"
                 : "=r"(any)
                 : "r"((u32)v), "n"(BAR), "n"(THREADS)
                 : "memory");
    return any != 0;
}

// The tile's n_split splits' partial rows merged into the output, by the block that found
// them all stored, which then re-arms the tile's counter (for the next launch, a graph replay
// included). One pass over the splits, rescaling as the maximum grows; UNROLL splits' loads
// are in flight together (each round is an L2 round trip).
template <int BM, int THREADS, int UNROLL>
__device__ void merge_rows(const FlashParams& p, u32 n_split, const Work& w, const int* row_tok, const int* row_head,
                           int tid) {
    const u32 slot = w.x * w.heads + w.y;
    const u64 stride = (u64)p.n_tokens * p.n_head;
    constexpr int C4 = DV / 4;
    for (int i = tid; i < BM * C4; i += THREADS) {
        const int r = i / C4, c = (i % C4) * 4;
        // Padding rows compute on token 0's row and store nothing: the int8 form needs every
        // lane of the warp. A warp with no valid row skips (with GQA groups smaller than the
        // tile most rows are padding, and each pass of this loop is a round trip per split).
        const bool valid = row_tok[r] >= 0;
        if (!__any_sync(0xffffffffu, valid)) continue;
        const int t = valid ? row_tok[r] : 0;
        const int h = row_head[r];
        const u64 row = (u64)t * p.n_head + h;
        float mx = FLASH_NEG_INF, sum = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
        // Branch-free, so the unrolled iterations' loads issue together.
#pragma unroll UNROLL
        for (u32 z = 0; z < n_split; ++z) {
            const float x = ldcg(p.part_lse + z * stride + row);
            float v[4];
            ldcg4(p.part_o + (z * stride + row) * DV + c, v);
            const float nm = fmaxf(mx, x);
            const float f = nm == mx ? 1.f : exp2f(mx - nm);
            const float w = x == FLASH_NEG_INF ? 0.f : exp2f(x - nm);
            sum = sum * f + w;
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[e] = acc[e] * f + w * v[e];
            mx = nm;
        }
        float inv, lse2;
        row_finish(sum, mx, inv, lse2);
        if (valid) {
            store2(p, false, 0, t, h, c, acc[0] * inv, acc[1] * inv, lse2, c == 0);
            store2(p, false, 0, t, h, c + 2, acc[2] * inv, acc[3] * inv, lse2, false);
        }
        const float out[4] = {acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv};
        store_act<4>(p, valid, t, h, c, out);
    }
    if (tid == 0) p.counters[slot] = 0;
}

// After every thread stored this split's partial rows: the last of the tile's n_split splits to
// get here merges them (merge_rows). One thread counts the split with an acquire-release
// atomic after the barrier, which orders the block's stores before the count and the merge's
// loads after it (a fence in every thread cost more: docs/perf/2026-11-23-split-merge.md).
// Prefill's; decode counts its splits earlier (decode()).
template <int BM, int THREADS, int BAR = 0>
__device__ void merge_splits(const FlashParams& p, u32 n_split, const Work& w, const int* row_tok,
                             const int* row_head, int tid) {
    sync_threads<THREADS, BAR>();
    u32 done = 0;
    if (tid == 0)
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(done) : "l"(p.counters + w.x * w.heads + w.y) : "memory");
    if (sync_threads_or<THREADS, BAR>(tid == 0 && done == n_split - 1)) merge_rows<BM, THREADS, 8>(p, n_split, w, row_tok, row_head, tid);
}

// A prefill warp's finished rows (rows[m][i] of the tile: C-fragment rows lane / 4 and
// lane / 4 + 8 of its row tiles), normalised, into the output or the split's partials.
template <int MT>
__device__ __forceinline__ void store_rows(const FlashParams& p, u32 z, const WarpState (&st)[MT],
                                           const int (&rows)[MT][2], const int* row_tok, const int* row_head,
                                           int lane) {
    const bool partial = p.n_split > 1;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const float l = st[m].sum(i);
            const int t = row_tok[rows[m][i]];
            if (t < 0) continue;
            float inv, lse2;
            row_finish(l, st[m].row_max[i], inv, lse2);
#pragma unroll
            for (int dt = 0; dt < DV / 8; ++dt)
                store2(p, partial, z, t, row_head[rows[m][i]], dt * 8 + 2 * (lane & 3), st[m].o[dt][2 * i] * inv,
                       st[m].o[dt][2 * i + 1] * inv, lse2, dt == 0 && (lane & 3) == 0);
        }
}

// A prefill block's tokens: a listed run (first token, count), or one token per block (groups
// too wide for flash_decode); their sequence and its stored keys.
struct PrefillTile {
    u32 t0, ntok, seq, kv_len;
};
__device__ __forceinline__ PrefillTile prefill_tile(const FlashParams& p, u32 x) {
    PrefillTile t;
    t.t0 = p.tiles ? p.tiles[2 * x] : x;
    t.ntok = p.tiles ? p.tiles[2 * x + 1] : 1;
    t.seq = p.q_seq[t.t0];
    t.kv_len = p.kv_len ? min(p.kv_len[t.seq], p.n_ctx) : p.n_ctx;
    return t;
}

// Prefill and chunked prefill: 4 warps of 16 * PREFILL_MT rows share BN-key tiles; two blocks
// per SM (their shared memory allows no more at head size 128). Grid (tiles, n_head_kv *
// chunks, splits); dynamic shared memory: the Q tile and PREFILL_STAGES K/V stages.
extern "C" __global__ void __launch_bounds__(128, 2) flash_prefill(const FlashParams p) {
    pdl_begin();
    constexpr int MT = PREFILL_MT, BM = 16 * MT * PREFILL_WARPS, THREADS = 32 * PREFILL_WARPS;
    constexpr bool QREGS = MT == 1 && D <= 128;
    constexpr u32 Q_BYTES = BM * QROW, K_BYTES = BN * KROW, STAGE = K_BYTES + BN * VROW;
    extern __shared__ __align__(128) u8 smem[];
    __shared__ int row_tok[BM], row_head[BM];
    __shared__ u32 block_range[2];
    const u32 base = smem_addr(smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    const Work w = grid_work();
    const PrefillTile tile = prefill_tile(p, w.x);
    const u32 t0 = tile.t0, ntok = tile.ntok, seq = tile.seq, kv_len = tile.kv_len;
    tile_rows<BM, THREADS>(p, w, t0, ntok, kv_len, row_tok, row_head, block_range, tid);
    __syncthreads();
    u32 kb, ke;
    split_slice(p.n_split, w.z, block_range[0], block_range[1], BN, kb, ke);
    const int steps = (int)((ke - kb + BN - 1) / BN);
    // This thread's rows: C-fragment rows lane / 4 and lane / 4 + 8 of each of the warp's tiles.
    int rows[MT][2];
    RowMask rm[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            rows[m][i] = (warp * MT + m) * 16 + (lane >> 2) + 8 * i;
            rm[m][i] = row_mask(p, row_tok[rows[m][i]], kv_len);
        }

    const u32 g = w.y % p.n_head_kv;
    const u16* kg = p.k + seq * p.k_seq + g * p.k_head;
    const u16* vg = p.v + seq * p.v_seq + g * p.v_head;
    // One commit group per step (the queries ride with the first), so waiting for all but the
    // newest PREFILL_STAGES - 1 groups waits for the step's tiles.
    load_q<BM, THREADS>(p, base, row_tok, row_head, tid);
#pragma unroll
    for (int s = 0; s < PREFILL_STAGES - 1; ++s) {
        if (s < steps) {
            const u32 ks = base + Q_BYTES + s * STAGE;
            load_kv<THREADS, BN>(kg, vg, p, ks, ks + K_BYTES, kb + s * BN, ke, tid);
        }
        cp_async_commit();
    }

    WarpState st[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) st[m].init();
    QTile<QREGS> q[MT];
    for (int it = 0; it < steps; ++it) {
        const u32 k0 = kb + it * BN;
        const int ahead = it + PREFILL_STAGES - 1;
        if (ahead < steps) {
            const u32 ks = base + Q_BYTES + (ahead % PREFILL_STAGES) * STAGE;
            load_kv<THREADS, BN>(kg, vg, p, ks, ks + K_BYTES, kb + ahead * BN, ke, tid);
        }
        cp_async_commit();
        cp_async_wait<PREFILL_STAGES - 1>();
        __syncthreads();
        if (it == 0) {
#pragma unroll
            for (int m = 0; m < MT; ++m) q[m].init(base + (warp * MT + m) * 16 * QROW, lane);
        }
        const u32 ks = base + Q_BYTES + (it % PREFILL_STAGES) * STAGE;
        float* dbg = nullptr;
#ifdef FLASH_DEBUG
        if (p.debug && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && warp == 0 && (u32)it < p.debug_tiles)
            dbg = p.debug + (u64)it * debug_step_floats<BN>();
#endif
        attend<BN, MT, QREGS>(p, st, q, ks, ks + K_BYTES, k0, rm, seq, lane, dbg);
        __syncthreads();
    }
    cp_async_wait_all();

    store_rows<MT>(p, w.z, st, rows, row_tok, row_head, lane);
    if (p.n_split > 1) merge_splits<BM, THREADS>(p, p.n_split, w, row_tok, row_head, tid);
}

// Timeline builds (-DFLASH_TIMELINE; flash-bench --timeline): in flash_prefill_wg one thread of
// each consumer warpgroup (streams 0 and 1), of the loading warp (stream 2) and of the
// preparing warps (stream 3), in flash_decode the block's first thread (stream 0), writes pairs
// of 32-bit words, (SM clock, event << 24 | value), into p.debug: WG_TIMELINE_RECORDS pairs a
// stream, four streams a block, for blocks below p.debug_tiles (decode: by the block's index
// in its grid, x fastest). The
// host clears the buffer, so a stream ends at its first zero pair; a stream that fills up drops
// the rest. MARK_NS pairs hold the global timer's low 32 bits (ns) in place of the clock, to
// convert cycles to time. The host mirrors these numbers (`TIMELINE_*` in src/flash.rs).
constexpr u32 WG_TIMELINE_RECORDS = 16384, WG_TIMELINE_STREAMS = 4;
enum WgMark : u32 {
    MARK_START = 1,  // the stream begins (value 0)
    MARK_NS,         // global timer (value 0)
    MARK_ITEM,       // a work item begins (value: the item)
    MARK_WAIT_K,     // step j begins: waiting for K_j and the turn (value: j)
    MARK_ISSUE,      // S_j (and P_{j-1} V_{j-1}) about to be issued
    MARK_SCORES,     // S_j has landed
    MARK_STEP,       // step j's probabilities packed
    MARK_LAST_PV,    // the item's last P V has landed (value: the item's steps)
    MARK_STORED,     // the item's rows are stored (value: the item)
    MARK_END,        // no item left (value: items taken)
    MARK_LOAD_K,     // the loading warp issues K_n (value: n, the block's steps so far)
    MARK_LOAD_V,     // ... and V_n
    MARK_PREP,       // a preparing warp finds the m-th item's slot free (value: m)
    MARK_PREP_ITEM,  // ... has the item's index (value: the item)
    MARK_PREP_Q,     // ... has its rows and issued its queries (value: the item)
    // flash_decode (MARK_START, then these, then MARK_END with value 1 where the block merged
    // the splits):
    MARK_DEC_SM,       // the block's SM (value: its %smid)
    MARK_DEC_RANGE,    // the rows and their key range known (value: the block's split)
    MARK_DEC_FIRST,    // the first warp's first tile landed (value: its steps)
    MARK_DEC_LOOP,     // the first warp's steps done
    MARK_DEC_WARPS,    // every warp's steps done
    MARK_DEC_STATES,   // the warps' states in shared memory
    MARK_DEC_STORED,   // the block's rows stored (the split's partials, or the output)
    MARK_DEC_COUNTED,  // the split counted (value: 1 where this block merges)
    MARK_DEC_SPUN,     // the merging block saw every split's rows stored (value: counter reads)
};
struct Timeline {
#ifdef FLASH_TIMELINE
    u32* at = nullptr;
    u32 n = 0;
    __device__ __forceinline__ Timeline(const FlashParams& p, u32 stream, bool writer, u32 block = blockIdx.x) {
        if (writer && p.debug && block < p.debug_tiles)
            at = (u32*)p.debug + 2ull * WG_TIMELINE_RECORDS * (block * WG_TIMELINE_STREAMS + stream);
    }
    __device__ __forceinline__ void put(u32 word, u32 event, u32 value) {
        if (at && n < WG_TIMELINE_RECORDS)
            asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(at + 2 * n), "r"(word),
                         "r"(event << 24 | (value & 0xffffffu))
                         : "memory");
        ++n;
    }
    __device__ __forceinline__ void mark(u32 event, u32 value) {
        u32 t;
        asm volatile("mov.u32 %0, %%clock;" : "=r"(t)::"memory");
        put(t, event, value);
    }
    __device__ __forceinline__ void global_time() {
        u64 t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
        put((u32)t, MARK_NS, 0);
    }
    __device__ __forceinline__ void sm() {
        u32 id;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
        mark(MARK_DEC_SM, id);
    }
#else
    __device__ __forceinline__ Timeline(const FlashParams&, u32, bool, u32 = 0) {}
    __device__ __forceinline__ void mark(u32, u32) {}
    __device__ __forceinline__ void global_time() {}
    __device__ __forceinline__ void sm() {}
#endif
    __device__ __forceinline__ void begin() {
        mark(MARK_START, 0);
        global_time();
    }
    __device__ __forceinline__ void end(u32 items) {
        mark(MARK_END, items);
        global_time();
    }
};

#if defined(AKUNU_WGMMA) && (HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256) && HEAD_DIM_V == HEAD_DIM && \
    !defined(FLASH_DEBUG)
// Prefill on Hopper's warpgroup MMA (sm_90a, head sizes 64, 128 and 256), warp-specialised and
// persistent: at most one block per SM, each taking work items (a 128-row tile of one head
// chunk, or one split of it) until none is left (wg_next_item, wg_work). Per block:
// - three producer warps prepare each item: its rows, each row's keys and the item's key
//   range, and its queries into one of two slots, up to two items ahead, so an item's set-up
//   overlaps the one before (at head size 256 one query slot, refilled once the consumers'
//   last S = Q K^T of the item is done); the block's first item, which nothing overlaps, all
//   the block's threads prepare together before they take their roles;
// - a loading warp streams WG_BN-key tiles of K and of V into two rings of WG_STAGES stages in
//   wgmma's swizzled layout, by tensor copies (one lane issues a tile; the host passes tensor
//   maps of the caches) or, for a slice's partial last tile and where the host has no maps, by
//   cp.async; each stage has a "full" mbarrier (the copies landed) and an "empty" one (the
//   consumers are done with it);
// - two consumer warpgroups of 64 rows each. Step j issues S_j = Q K_j^T and then
//   O += P_{j-1} V_{j-1} (P from registers), waits for S_j, runs flash_prefill's masking and
//   online softmax, waits for P_{j-1} V_{j-1}, rescales O where a maximum moved and packs P_j.
//   The rows' maxima lag by up to SOFTMAX_SLACK (softmax_probs): nearly every step needs
//   neither the rows' maxima across the quad nor a rescale. Whether a step needs masks comes
//   from the keys all of a warp's rows see, found once per item. K_j is released after S_j,
//   V_j a step later.
// The consumers take turns to issue their products (FA3's ping-pong: named barriers
// WG_TURN + w, "warpgroup w may issue"), so one warpgroup's softmax runs while the tensor cores
// work on the other's products; without turns both warpgroups wait for the same K tile, issue
// together and then both leave the tensor cores idle during their softmax. (ptxas places the
// wait for P_{j-1} V_{j-1} after the rows' vote, before the exponentials: keeping them ahead of
// it needs registers the consumers lack, docs/perf/2026-11-23-prefill-item-handover.md.) No
// block-wide barrier in the loop. The producer gives its registers to the consumers
// (setmaxnreg). With two query slots, a warpgroup stages its finished rows in its own rows of
// the item's slot and stores them whole (wg_store_staged). The ring's "empty" barriers and
// q_read count one arrival per consumer warp: only the tensor cores read those tiles, and the
// warp's wgmma wait precedes its arrival.
// Keys per step and query slots: at head size 256 a warpgroup's 64 x 256 output takes 128
// accumulator registers a thread, which leaves room for 64-key scores only, and two K/V stages
// of 64 keys with one 128-row query slot fill 192 KiB of shared memory.
constexpr int WG_BN = D > 128 ? 64 : 128;
// Rows of a work item's tile (the host's WG_ROWS).
constexpr int WG_ROWS = 128;
constexpr int WG_QSLOTS = D > 128 ? 1 : 2;
constexpr int WG_STAGES = 2;
// The block starts with 168 registers a thread (384 threads, one block per SM). The consumers'
// increase takes exactly what the producers release, (168 - 40) * 128 = (232 - 168) * 256: a
// larger producer budget leaves setmaxnreg.inc waiting for registers forever.
constexpr int WG_PRODUCER_REGS = 40, WG_CONSUMER_REGS = 232;
// Threads: the producer warpgroup (a loading warp and three preparing ones), then the two
// consumer warpgroups.
constexpr int WG_PRODUCERS = 128, WG_CONSUMERS = 256, WG_THREADS = WG_PRODUCERS + WG_CONSUMERS;
constexpr int WG_LOADERS = 32, WG_PREPARERS = WG_PRODUCERS - WG_LOADERS;
// Named barriers of the consumers' turns (barrier 1 is the consumers' own) and the producer's.
constexpr int WG_TURN = 2, WG_PRODUCER_BAR = 4;
// Each consumer warpgroup's own named barrier, WG_STAGE_BAR + its index (wg_store_staged).
constexpr int WG_STAGE_BAR = 5;
// A barrier over the warpgroup's 128 threads on named barrier `bar` (a register: one code path
// for both warpgroups, since ptxas serialises every wgmma of a kernel that reads accumulators
// in code only some warps run).
__device__ __forceinline__ void sync_warpgroup(int bar) {
    asm volatile("barrier.sync %0, 128;\n" ::"r"(bar) : "memory");
}

// Consumer warpgroup cw waits for its turn to issue, or hands the turn to the other one.
__device__ __forceinline__ void wg_take_turn(int cw) {
    if (cw == 0) sync_threads<WG_CONSUMERS, WG_TURN>();
    else sync_threads<WG_CONSUMERS, WG_TURN + 1>();
}
__device__ __forceinline__ void wg_pass_turn(int cw) {
    if (cw == 0) arrive_threads<WG_CONSUMERS, WG_TURN + 1>();
    else arrive_threads<WG_CONSUMERS, WG_TURN>();
}

template <int N>
__device__ __forceinline__ void wg_qk(float (&d)[N / 8][4], u64 da, u64 db, int accumulate) {
    if constexpr (N == 64) wgmma_ss64(d, da, db, accumulate);
    else wgmma_ss128(d, da, db, accumulate);
}
template <int N>
__device__ __forceinline__ void wg_pv(float (&d)[N / 8][4], const u32 (&a)[4], u64 db) {
    if constexpr (N == 64) wgmma_rs64_mn(d, a, db);
    else if constexpr (N == 128) wgmma_rs128_mn(d, a, db);
    else wgmma_rs256_mn(d, a, db);
}

// O += P V for one step's probabilities `a` and V tile at vs (issued, not waited for).
template <int BN_>
__device__ __forceinline__ void wg_issue_pv(WarpState& st, const u32 (&a)[BN_ / 16][4], u32 vs) {
    const u64 vd = wgmma_desc(vs, BN_ * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < BN_ / 16; ++kk) wg_pv<DV>(st.o, a[kk], wgmma_desc_at(vd, kk * 16 * 128));
}

// The phase parity of step j's use of its ring slot (its (j / WG_STAGES)-th use).
__device__ __forceinline__ u32 ring_parity(int j) { return (u32)(j / WG_STAGES) & 1; }

// Step j's tiles are whole (WG_BN keys before the slice's end): with tensor maps the producer
// then copies them by the tensor memory accelerator, else (and for a slice's last, partial
// tile, whose rows past the end must read as zeros) with cp.async.
__device__ __forceinline__ bool wg_by_tma(const FlashParams& p, u32 k0, u32 ke) { return p.tma && ke - k0 >= WG_BN; }

// The loading warp's copy of one ring's tile of step j (keys k0.., rows `stride` elements apart
// in the cache at src) into `tile`, arriving on `full`. A tensor copy is issued by lane 0,
// which also announces its bytes; the others only arrive, so either way the phase counts
// WG_LOADERS arrivals.
template <int CH, u32 ROW>
__device__ __forceinline__ void wg_load_tile(const FlashParams& p, const TensorMap& map, u32 tile, const u16* src,
                                             long long stride, u32 k0, u32 ke, u32 g, u32 seq, u32 full, int tid) {
    if (wg_by_tma(p, k0, ke)) {
        if (tid == 0) {
            mbar_arrive_expect_tx(full, WG_BN * ROW);
#pragma unroll
            for (int col = 0; col < CH / 8; ++col)
                tma_load_4d(tile + col * WG_BN * 128, &map, col * 64, (int)k0, (int)g, (int)seq, full);
        } else {
            mbar_arrive(full);
        }
    } else {
        load_rows<WG_LOADERS, WG_BN, CH, ROW, true>(tile, src + k0 * stride, stride, ke - k0, tid);
        mbar_arrive_cp_async(full);
    }
}

// The last two of the scratch's counters (the host's COUNTERS; split merges use the first
// ones, fewer than that): the next work item to hand out, and the blocks that found none left.
constexpr u32 WG_NEXT_ITEM = 4094, WG_BLOCKS_DONE = 4095;

// The next work item of a block that has taken `m` so far. Without split-KV the blocks take
// items from one counter as they free up: the host lists the longest tiles first, so the
// longest items start first and the short ones fill in at the end. The block that finds none
// left last re-arms the counters for the next launch. With split-KV the host launches a block
// per item, and a block's item is its index.
__device__ __forceinline__ u32 wg_next_item(const FlashParams& p, u32 m, u32 n_items) {
    if (p.n_split > 1) return m == 0 ? blockIdx.x : n_items;
    const u32 i = atomicAdd(&p.counters[WG_NEXT_ITEM], 1u);
    if (i >= n_items && atomicAdd(&p.counters[WG_BLOCKS_DONE], 1u) == gridDim.x - 1) {
        p.counters[WG_NEXT_ITEM] = 0;
        p.counters[WG_BLOCKS_DONE] = 0;
    }
    return i;
}

// Work item i: the tiles, longest first (as the host lists them), cut into p.wg_length_runs
// runs (the host's choice: length_runs in src/flash.rs); each run in bands of head chunks: the
// run's tiles of a band's heads, longest first, each tile's heads together, then the next band.
// Blocks running together share the K and V of a band's few heads, which stay in L2 (a band
// holds at least a quarter of the heads). The runs bound how long an item handed out near the
// end can be. The last of several runs is one band: its tiles are the shortest, with the fewest
// keys, and handed out strictly longest first they leave the blocks' ends closest together.
// Splits are outermost.
__device__ __forceinline__ Work wg_work(const FlashParams& p, u32 i) {
    const u32 per_split = p.wg_tiles * p.wg_heads, z = i / per_split, in_split = i % per_split;
    const u32 length_runs = max(1u, p.wg_length_runs);
    const u32 per_run = (p.wg_tiles + length_runs - 1) / length_runs;
    const u32 c = in_split / (per_run * p.wg_heads), r = in_split - c * per_run * p.wg_heads;
    const bool last_run = length_runs > 1 && (c + 1) * per_run >= p.wg_tiles;
    const u32 band_heads = last_run ? p.wg_heads : max(4u, (p.wg_heads + 3) / 4);
    const u32 t0 = c * per_run, tiles = min(per_run, p.wg_tiles - t0);
    const u32 band = r / (band_heads * tiles), in_band = r % (band_heads * tiles);
    const u32 heads = min(band_heads, p.wg_heads - band * band_heads);
    return Work{t0 + in_band / heads, band * band_heads + in_band % heads, z, p.wg_heads};
}

// The warpgroup's finished rows into the output (not a split's partials) through its own rows
// of the item's query slot, which no S = Q K^T reads any more: each thread writes its fragments
// into 16-byte chunks swizzled by row (conflict-free), then the warpgroup copies whole rows out
// with 16-byte stores, a warp two rows of 256 bytes at a time. Each thread used to store 4 or 8
// bytes of 8 rows a store, and an item's stores took 2.2 us (docs/perf/2026-12-06-prefill-timeline.md).
// Rows wider than the slot's (f32 output) go in passes of QROW bytes. Needs DV == D and 16-byte
// aligned output rows.
__device__ __forceinline__ void wg_store_staged(const FlashParams& p, const WarpState& st, u32 slot, int cw,
                                                const int (&rows)[2], const int* row_tok, const int* row_head,
                                                int lane, int wtid) {
    constexpr u32 CHUNKS = QROW / 16, COLS = QROW / OUT_BYTES;
    constexpr u32 PASSES = DV * OUT_BYTES / QROW;
    static_assert(DV == D && PASSES * QROW == DV * OUT_BYTES, "rows of whole slot rows");
    float inv[2], lse2[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) row_finish(st.sum(i), st.row_max[i], inv[i], lse2[i]);
#pragma unroll
    for (u32 pass = 0; pass < PASSES; ++pass) {
        if (pass > 0) sync_warpgroup(WG_STAGE_BAR + cw);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (u32 dl = 0; dl < COLS / 8; ++dl) {
                const u32 dt = pass * (COLS / 8) + dl;
                const float x = st.o[dt][2 * i] * inv[i], y = st.o[dt][2 * i + 1] * inv[i];
                const u32 byte = dl * 8 * OUT_BYTES + (lane & 3) * 2 * OUT_BYTES;
                const u32 at = slot + wswz(WG_ROWS, rows[i], byte / 16) + byte % 16;
#if OUT_F32
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(x), "f"(y) : "memory");
#else
                asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(at), "r"(pack2(x, y)) : "memory");
#endif
            }
        sync_warpgroup(WG_STAGE_BAR + cw);
#pragma unroll
        for (u32 k = 0; k < 64 * CHUNKS / 128; ++k) {
            const u32 idx = k * 128 + wtid, r = cw * 64 + idx / CHUNKS, c = idx % CHUNKS;
            const int t = row_tok[r];
            if (t < 0) continue;
            uint4 v;
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                         : "r"(slot + wswz(WG_ROWS, r, c)));
            u8* dst = (u8*)p.out + (t * p.o_tok + row_head[r] * p.o_head) * OUT_BYTES + pass * QROW + c * 16;
            *(uint4*)dst = v;
        }
    }
    if (p.lse && (lane & 3) == 0)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int t = row_tok[rows[i]];
            if (t >= 0) store_lse(p, t, row_head[rows[i]], lse2[i]);
        }
}

// What the producer tells the consumers about an item, with its queries (a slot per item in
// flight).
struct WgItem {
    int row_tok[128], row_head[128];
    u32 row_keys[128][2];  // each row's keys [lo, hi) (row_mask's), so consumers read no q_pos
    u32 range[2];
    u32 seq, kv_len;
    u32 index;  // the work item, n_items when none is left
    // What it is (wg_work) and its keys [kb, ke) (its split's slice of range): worked out once,
    // where the preparing warps have time, not by every consumer thread as the item starts.
    Work work;
    u32 kb, ke;
};

// The thread of tile_rows that wrote the item's range (tid 0) completes the item's fields.
__device__ __forceinline__ void wg_item_fields(const FlashParams& p, WgItem& it, const Work& w, const PrefillTile& tile) {
    it.seq = tile.seq;
    it.kv_len = tile.kv_len;
    it.work = w;
    split_slice(p.n_split, w.z, it.range[0], it.range[1], WG_BN, it.kb, it.ke);
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1) flash_prefill_wg(const __grid_constant__ FlashParams p) {
    pdl_begin();
    constexpr int BM = WG_ROWS, BN_ = WG_BN;
    constexpr u32 Q_BYTES = BM * QROW, K_BYTES = BN_ * KROW, V_BYTES = BN_ * VROW;
    extern __shared__ __align__(128) u8 smem[];
    __shared__ WgItem items[2];
    // full[0..S) and empty[0..S) for K, then the same for V; an item slot's queries and rows
    // are ready (q_full) or done with (q_empty: the consumers and the loading warp); with one
    // query slot, the consumers are done with an item's queries (q_read).
    __shared__ __align__(8) u64 full[2 * WG_STAGES], empty[2 * WG_STAGES], q_full[2], q_empty[2], q_read;
    // Swizzle atoms start on 1024-byte boundaries (the host adds the slack).
    const u32 base = (smem_addr(smem) + 1023u) & ~1023u;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = warp >> 2;
    const u32 n_items = p.wg_tiles * p.wg_heads * p.n_split;

    if (threadIdx.x < 2 * WG_STAGES) {
        mbar_init(smem_addr(&full[threadIdx.x]), WG_LOADERS);
        mbar_init(smem_addr(&empty[threadIdx.x]), WG_CONSUMERS / 32);
    }
    if (threadIdx.x < 2) {
        mbar_init(smem_addr(&q_full[threadIdx.x]), WG_PREPARERS);
        mbar_init(smem_addr(&q_empty[threadIdx.x]), WG_CONSUMERS + WG_LOADERS);
    }
    if (threadIdx.x == 2) mbar_init(smem_addr(&q_read), WG_CONSUMERS / 32);
    // Timeline streams: the consumer warpgroups 0 and 1, the loading warp 2, the preparing warps 3.
    const u32 stream = wg > 0 ? wg - 1 : warp > 0 ? 3 : 2;
    Timeline tl(p, stream, threadIdx.x % 128 == 0 || threadIdx.x == WG_LOADERS);
    tl.begin();
    __syncthreads();
    // The queries of the m-th item, then the K and V rings.
    const auto q_tile = [&](u32 m) { return base + m % WG_QSLOTS * Q_BYTES; };
    constexpr u32 KV_AT = WG_QSLOTS * Q_BYTES;
    const auto k_tile = [&](u32 n) { return base + KV_AT + n % WG_STAGES * K_BYTES; };
    const auto v_tile = [&](u32 n) { return base + KV_AT + WG_STAGES * K_BYTES + n % WG_STAGES * V_BYTES; };
    const u32 full_at = smem_addr(full), empty_at = smem_addr(empty);
    const auto bar = [&](u32 ring_bars, int ring, u32 n) { return ring_bars + 8 * (ring * WG_STAGES + n % WG_STAGES); };
    // The m-th item, once the preparing warps filled its slot (n_items when none is left).
    const auto wait_item = [&](u32 m) {
        mbar_wait(smem_addr(&q_full[m & 1]), (m >> 1) & 1);
        return items[m & 1].index;
    };

    // The block's first item, prepared by all its threads before they take their roles: nothing
    // overlaps it, and the three preparing warps alone took 9,000 cycles for its rows and
    // queries (docs/perf/2026-12-07-prefill-last-run.md). Its rows are visible to every thread
    // after the barrier, so the loading warp starts on its keys without waiting for the queries.
    // (A first item by block index, without the atomic, makes ptxas serialise the wgmma at head
    // size 256.)
    if (stream == 3) tl.mark(MARK_PREP, 0);
    if (threadIdx.x == 0) items[0].index = wg_next_item(p, 0, n_items);
    __syncthreads();
    const u32 first = items[0].index;
    if (first < n_items) {
        WgItem& it = items[0];
        if (stream == 3) tl.mark(MARK_PREP_ITEM, first);
        const Work w = wg_work(p, first);
        const PrefillTile tile = prefill_tile(p, w.x);
        tile_rows<BM, WG_THREADS>(p, w, tile.t0, tile.ntok, tile.kv_len, it.row_tok, it.row_head, it.range,
                                  threadIdx.x, it.row_keys);
        if (threadIdx.x == 0) wg_item_fields(p, it, w, tile);
        __syncthreads();
        load_q<BM, WG_THREADS, true>(p, q_tile(0), it.row_tok, it.row_head, threadIdx.x);
        if (stream == 3) tl.mark(MARK_PREP_Q, first);
        mbar_arrive_cp_async_inc(smem_addr(&q_full[0]));
    }
    // Every thread's copies are counted before the preparing warps' arrivals can fill the slot.
    __syncthreads();
    if (stream == 3) mbar_arrive(smem_addr(&q_full[0]));

    if (wg == 0) {
        // Producer warpgroup: warps 1-3 prepare each later item (its rows and queries into the
        // item's slot, once the consumers are done with the item two before), up to two items
        // ahead of the consumers; warp 0 streams K_j and V_j into their rings once the
        // consumers released the tiles WG_STAGES steps before (wg_load_tile).
        regs_lower<WG_PRODUCER_REGS>();
        u32 m = 0;  // items so far
        if (warp > 0) {
            const int tid = threadIdx.x - WG_LOADERS;
            for (m = 1; first < n_items; ++m) {
                const u32 slot = m & 1;
                WgItem& it = items[slot];
                if (m >= 2) mbar_wait(smem_addr(&q_empty[slot]), ((m >> 1) & 1) ^ 1);
                tl.mark(MARK_PREP, m);
                if (tid == 0) it.index = wg_next_item(p, m, n_items);
                sync_threads<WG_PREPARERS, WG_PRODUCER_BAR>();
                const u32 i = it.index;
                tl.mark(MARK_PREP_ITEM, i);
                if (i >= n_items) {
                    mbar_arrive(smem_addr(&q_full[slot]));
                    break;
                }
                const Work w = wg_work(p, i);
                const PrefillTile tile = prefill_tile(p, w.x);
                tile_rows<BM, WG_PREPARERS>(p, w, tile.t0, tile.ntok, tile.kv_len, it.row_tok, it.row_head, it.range,
                                            tid, it.row_keys);
                if (tid == 0) wg_item_fields(p, it, w, tile);
                sync_threads<WG_PREPARERS, WG_PRODUCER_BAR>();
                if constexpr (WG_QSLOTS == 1)
                    if (m >= 1) mbar_wait(smem_addr(&q_read), (m - 1) & 1);
                load_q<BM, WG_PREPARERS, true>(p, q_tile(m), it.row_tok, it.row_head, tid);
                tl.mark(MARK_PREP_Q, i);
                // The queries' copies land before the slot reads as full; the rows and any
                // queries stored directly are released by the arrival itself.
                mbar_arrive_cp_async_inc(smem_addr(&q_full[slot]));
                mbar_arrive(smem_addr(&q_full[slot]));
            }
            tl.end(m);
        } else {
            u32 n = 0;  // steps so far
            for (;; ++m) {
                const u32 i = m == 0 ? first : wait_item(m);
                if (i >= n_items) break;
                const WgItem& it = items[m & 1];
                const Work w = it.work;
                const u32 seq = it.seq, kb = it.kb, ke = it.ke;
                const u32 g = w.y % p.n_head_kv;
                const u16* kg = p.k + seq * p.k_seq + g * p.k_head;
                const u16* vg = p.v + seq * p.v_seq + g * p.v_head;
                // Done with the slot: an item without keys lets the consumers release it
                // before this warp has read it.
                mbar_arrive(smem_addr(&q_empty[m & 1]));
                for (u32 k0 = kb; k0 < ke; k0 += BN_, ++n) {
                    if (n >= WG_STAGES) mbar_wait(bar(empty_at, 0, n), ring_parity(n) ^ 1);
                    tl.mark(MARK_LOAD_K, n);
                    wg_load_tile<D / 8, KROW>(p, p.tma_k, k_tile(n), kg, p.k_pos, k0, ke, g, seq, bar(full_at, 0, n), lane);
                    if (n >= WG_STAGES) mbar_wait(bar(empty_at, 1, n), ring_parity(n) ^ 1);
                    tl.mark(MARK_LOAD_V, n);
                    wg_load_tile<DV / 8, VROW>(p, p.tma_v, v_tile(n), vg, p.v_pos, k0, ke, g, seq, bar(full_at, 1, n), lane);
                }
            }
            tl.end(m);
        }
        cp_async_wait_all();
    } else {
        regs_raise<WG_CONSUMER_REGS>();
        const int tid = threadIdx.x - WG_PRODUCERS, cw = wg - 1;
        // Warpgroup 0 issues first. Each warpgroup passes the turn after each issue; the one
        // pass left over at the end is taken by warpgroup 0 after its last step.
        if (cw == 1) wg_pass_turn(cw);
        int rows[1][2];
#pragma unroll
        for (int i = 0; i < 2; ++i) rows[0][i] = cw * 64 + (warp & 3) * 16 + (lane >> 2) + 8 * i;
        // This warpgroup's 64 rows inside each 128-row column block of Q.
        const u32 q_rows = cw * 64 * 128;
        u32 n = 0, m = 0;
        Work last{};
        const bool staged_out = p.n_split == 1 && (p.o_tok * OUT_BYTES) % 16 == 0 && (p.o_head * OUT_BYTES) % 16 == 0 &&
                                (u64)p.out % 16 == 0;
        for (;; ++m) {
            const u32 i = wait_item(m);
            if (i >= n_items) break;
            tl.mark(MARK_ITEM, i);
            const u32 slot = m & 1;
            const WgItem& it = items[slot];
            const Work w = it.work;
            fence_async_shared();
            const u32 seq = it.seq;
            RowMask rm[1][2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = rows[0][r];
                rm[0][r] = RowMask{it.row_keys[row][0], it.row_keys[row][1], it.row_tok[row]};
            }
            // The keys every row of the warp sees: whole_step's test once per item, not per step
            // (per step, its vote cost 1-2 % at head size 128 and 7 % at 64).
            u32 see_lo = 0, see_hi = ~0u;
#pragma unroll
            for (int r = 0; r < 2; ++r)
                if (rm[0][r].valid()) {
                    see_lo = max(see_lo, rm[0][r].lo);
                    see_hi = min(see_hi, rm[0][r].hi);
                }
            see_lo = __reduce_max_sync(0xffffffffu, see_lo);
            see_hi = __reduce_min_sync(0xffffffffu, see_hi);
            const bool by_range = !p.q_seg && !p.tree_mask;
            const u32 kb = it.kb, ke = it.ke;
            const int steps = (int)((ke - kb + BN_ - 1) / BN_);
            const u64 q_desc = wgmma_desc(q_tile(m) + q_rows, 16, 1024);

            WarpState st[1];
            st[0].init();
            // The accumulators just zeroed are the item's first P V's operands.
            wgmma_fence();
            u32 a[BN_ / 16][4];
            for (int j = 0; j < steps; ++j, ++n) {
                // cp.async writes through the generic proxy, wgmma reads through the async one
                // (as tensor copies write).
                tl.mark(MARK_WAIT_K, j);
                mbar_wait(bar(full_at, 0, n), ring_parity(n));
                if (!wg_by_tma(p, kb + j * BN_, ke)) fence_async_shared();
                wg_take_turn(cw);
                tl.mark(MARK_ISSUE, j);
                const u64 k_desc = wgmma_desc(k_tile(n), 16, 1024);
                float s[1][BN_ / 8][4];
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk) {
                    const u32 col = kk >> 2, within = (kk & 3) * 32u;
                    wg_qk<BN_>(s[0], wgmma_desc_at(q_desc, col * BM * 128 + within),
                               wgmma_desc_at(k_desc, col * BN_ * 128 + within), kk > 0);
                }
                wgmma_commit();
                // The turn passes before the waits. ptxas keeps the wgmmas pipelined only while
                // each wait sits in the branch that issued the group (a wait after the branches
                // join serialises every wgmma of the kernel).
                if (j > 0) {
                    mbar_wait(bar(full_at, 1, n - 1), ring_parity(n - 1));
                    if (!wg_by_tma(p, kb + (j - 1) * BN_, ke)) fence_async_shared();
                    wg_issue_pv<BN_>(st[0], a, v_tile(n - 1));
                    wgmma_commit();
                    wg_pass_turn(cw);
                    wgmma_wait<1>();
                } else {
                    wg_pass_turn(cw);
                    wgmma_wait<0>();
                }
                wgmma_fence_regs(s[0]);
                if (lane == 0) mbar_arrive(bar(empty_at, 0, n));
                tl.mark(MARK_SCORES, j);

                const u32 k0 = kb + j * BN_;
                const bool whole = by_range && k0 >= see_lo && k0 + BN_ <= see_hi;
                const float unit = mask_scores<BN_, 1>(p, s, rm, k0, seq, lane, whole);
                float corr[1][2];
                const bool same = softmax_probs<BN_, 1, SOFTMAX_SLACK>(st, s, corr, unit);
                wgmma_wait<0>();
                wgmma_fence_regs(st[0].o);
                wgmma_fence_operands(a);
                if (j > 0 && lane == 0) mbar_arrive(bar(empty_at, 1, n - 1));
                rescale_out<1>(st, corr, same);
#pragma unroll
                for (int kk = 0; kk < BN_ / 16; ++kk) prob_frag<BN_>(s[0], kk, a[kk]);
                tl.mark(MARK_STEP, j);
            }
            // Every S = Q K^T of the item was waited for: the queries' slot may be refilled.
            if constexpr (WG_QSLOTS == 1)
                if (lane == 0) mbar_arrive(smem_addr(&q_read));
            if (steps > 0) {
                mbar_wait(bar(full_at, 1, n - 1), ring_parity(n - 1));
                if (!wg_by_tma(p, kb + (steps - 1) * BN_, ke)) fence_async_shared();
                wgmma_fence();
                wg_issue_pv<BN_>(st[0], a, v_tile(n - 1));
                wgmma_commit();
                wgmma_wait<0>();
                wgmma_fence_regs(st[0].o);
                wgmma_fence_operands(a);
                if (lane == 0) mbar_arrive(bar(empty_at, 1, n - 1));
                tl.mark(MARK_LAST_PV, steps);
            }

            // With two query slots the item's own is free for staging its rows.
            if (WG_QSLOTS == 2 && staged_out) {
                wg_store_staged(p, st[0], q_tile(m), cw, rows[0], it.row_tok, it.row_head, lane, tid & 127);
            } else {
                store_rows<1>(p, w.z, st, rows, it.row_tok, it.row_head, lane);
            }
            tl.mark(MARK_STORED, i);
            // Every consumer thread arrives after its own last read of the slot, which the
            // preparing warps rewrite once the phase completes: the release then covers each
            // read without leaning on the warp barrier before a lane-0 arrival (ptxas compiles
            // that barrier to nothing here; racecheck, tracking arrivals per thread, flagged it).
            mbar_arrive(smem_addr(&q_empty[slot]));
            last = w;
        }
        tl.end(m);
        if (cw == 0) wg_take_turn(cw);
        // Split-KV launches give each block one item (the host), whose slot no later item
        // reuses. The merge stays out of the item loop: inside it, ptxas serialises every
        // wgmma of the kernel.
        if (p.n_split > 1 && m > 0)
            merge_splits<BM, WG_CONSUMERS, 1>(p, p.n_split, last, items[0].row_tok, items[0].row_head, tid);
    }
}
#endif

// One warp's ring of DEC_STAGES tiles of DEC_KEYS keys, filled by cp.async: one commit group
// per step, so waiting for all but the newest DEC_STAGES - 1 groups waits for the oldest tile.
struct DecodeRing {
    static constexpr u32 K_BYTES = DEC_KEYS * KROW, STAGE = K_BYTES + DEC_KEYS * VROW;
    u32 at;
    const u16 *kg, *vg;
    u32 end;     // keys at or past it are not this warp's
    u32 stored;  // keys at or past it are read as zeros (the fused RoPE patches its own key)

    __device__ __forceinline__ u32 k(int stage) const { return at + stage * STAGE; }
    __device__ __forceinline__ u32 v(int stage) const { return k(stage) + K_BYTES; }

    // Fills `stage` with keys k0.. (rows at or past `end` or `stored` read as zeros) and closes
    // the group; `k0` past the warp's keys closes an empty group, which keeps the count. The
    // lines are marked evict-first in L2: in a decode step each key is read once. Where tokens
    // of a pass share a sequence their blocks read the same keys, but close together: evict-first
    // measured faster there too (docs/perf/2026-12-07-l2-policies.md).
    __device__ __forceinline__ void fill(const FlashParams& p, int stage, u32 k0, int lane) const {
        if (k0 < end) load_kv<32, DEC_KEYS, true>(kg, vg, p, k(stage), v(stage), k0, max(k0, min(end, stored)), lane);
        cp_async_commit();
    }

    // The tile of the oldest open group has landed; the newer DEC_STAGES - 1 may still fly.
    __device__ __forceinline__ void wait() const {
        cp_async_wait<DEC_STAGES - 1>();
        __syncwarp();
    }
};

// RoPE inside decode (p.k_new set): each block rotates its token's query rows into the Q tile
// and its KV head's new key, computing what qk_rope_store (rope.cu) computes, and puts the new
// key and value into its ring where a step covers the token's position; one block per (token,
// KV head) also stores them in the cache. With the cache row read nowhere in the launch, the
// stored keys can be requested before the wait for the predecessor (the q/k/v product): the
// launch's sequences have one token each, so every stored key came from an earlier pass.
// After the wait, every value the block needs is requested at once (one round trip), then
// normed and rotated in registers and shared memory.
constexpr int ROPE_PER = (D + 31) / 32, ROPE_PER_V = (DV + 31) / 32;

struct DecodeRope {
    float cs[D];                // cos, sin of each rotated pair at the token's position
    float row[DEC_WARPS][D];    // a warp's head row, normed, before rotation
    __align__(16) u16 k[D];     // the new key and value in the element type
    __align__(16) u16 v[DV];

    // First thing in the kernel (these loads overlap the tile's): the QK-norm weights (element
    // e at [e / 32] on lane e % 32; ones without a norm) and this thread's frequency (a pair
    // per thread: n_rot / 2 <= 128).
    __device__ __forceinline__ void load(const FlashParams& p, int lane, float (&wq)[ROPE_PER], float (&wk)[ROPE_PER],
                                         float& freq) const {
#pragma unroll
        for (int j = 0; j < ROPE_PER; ++j) {
            const int e = lane + 32 * j;
            wq[j] = p.q_norm && e < D ? p.q_norm[e] : 1.f;
            wk[j] = p.k_norm && e < D ? p.k_norm[e] : 1.f;
        }
        freq = threadIdx.x < p.n_rot / 2 ? p.inv_freq[threadIdx.x] : 0.f;
    }

    // This thread's pair's cos and sin at `pos`, before the wait.
    __device__ __forceinline__ void angles(const FlashParams& p, u32 pos, float freq) {
        if (threadIdx.x < p.n_rot / 2) rope_angle(cs, threadIdx.x, pos, freq);
    }

    // Head row x (element e at x[e / 32] on lane e % 32) normed with w (if `norm`) and
    // rotated, by one warp, into y (same layout).
    __device__ __forceinline__ void rotate(const FlashParams& p, const float (&x)[ROPE_PER], const float (&w)[ROPE_PER],
                                           bool norm, int warp, int lane, float (&y)[ROPE_PER]) {
        float* hb = row[warp];
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < ROPE_PER; ++j) ss += x[j] * x[j];
        const float scale = norm ? rsqrtf(warp_sum(ss) / (float)D + p.eps) : 1.f;
#pragma unroll
        for (int j = 0; j < ROPE_PER; ++j) {
            const int e = lane + 32 * j;
            if (e < D) hb[e] = norm ? x[j] * scale * w[j] : x[j];
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < ROPE_PER; ++j) {
            const u32 e = lane + 32 * j;
            y[j] = e < p.n_rot ? rope_element(hb, cs, e, p.n_rot, p.neox) : e < (u32)D ? hb[e] : x[j];
        }
        __syncwarp();
    }

    // The tile's query rows, rotated, into the Q tile at `qs`; the new key and value into k
    // and v. Call __syncthreads() before reading them.
    __device__ __forceinline__ void prepare(const FlashParams& p, u32 qs, const int* row_tok, const int* row_head,
                                            u32 t, u32 g, int warp, int lane, const float (&wq)[ROPE_PER],
                                            const float (&wk)[ROPE_PER]) {
        constexpr int ROWS = 16 / DEC_WARPS;
        float x[ROWS][ROPE_PER], xk[ROPE_PER], xv[ROPE_PER_V];
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            const int r = warp + DEC_WARPS * i, tok = row_tok[r];
            const float* src = (const float*)p.q + (tok >= 0 ? tok * p.q_tok + row_head[r] * p.q_head : 0);
#pragma unroll
            for (int j = 0; j < ROPE_PER; ++j) {
                const int e = lane + 32 * j;
                x[i][j] = tok >= 0 && e < D ? src[e] : 0.f;
            }
        }
        const float* ks = p.k_new + ((u64)t * p.n_head_kv + g) * D;
        const float* vs = p.v_new + ((u64)t * p.n_head_kv + g) * DV;
#pragma unroll
        for (int j = 0; j < ROPE_PER; ++j) xk[j] = warp == DEC_WARPS - 1 && lane + 32 * j < D ? ks[lane + 32 * j] : 0.f;
#pragma unroll
        for (int j = 0; j < ROPE_PER_V; ++j) xv[j] = warp == DEC_WARPS - 2 && lane + 32 * j < DV ? vs[lane + 32 * j] : 0.f;

        float y[ROPE_PER];
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            const int r = warp + DEC_WARPS * i, tok = row_tok[r];
            if (tok >= 0) rotate(p, x[i], wq, p.q_norm != nullptr, warp, lane, y);
#pragma unroll
            for (int j = 0; j < ROPE_PER; ++j) {
                const int e = lane + 32 * j;
                if (e >= D) break;
                const u16 h = tok >= 0 ? to_elem(y[j]) : 0;
                asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(qs + fswz(QROW, r, e / 8) + (e % 8) * 2), "h"(h) : "memory");
            }
        }
        if (warp == DEC_WARPS - 1) {
            rotate(p, xk, wk, p.k_norm != nullptr, warp, lane, y);
#pragma unroll
            for (int j = 0; j < ROPE_PER; ++j)
                if (lane + 32 * j < D) k[lane + 32 * j] = to_elem(y[j]);
        } else if (warp == DEC_WARPS - 2) {
#pragma unroll
            for (int j = 0; j < ROPE_PER_V; ++j)
                if (lane + 32 * j < DV) v[lane + 32 * j] = to_elem(xv[j]);
        }
    }

    // The new key and value into cache row `pos` of K and V rows at kg, vg.
    __device__ __forceinline__ void store(const FlashParams& p, u16* kg, u16* vg, u32 pos) const {
        for (int c = threadIdx.x; c < D / 8; c += blockDim.x) *(uint4*)(kg + pos * p.k_pos + c * 8) = *(const uint4*)(k + c * 8);
        for (int c = threadIdx.x; c < DV / 8; c += blockDim.x) *(uint4*)(vg + pos * p.v_pos + c * 8) = *(const uint4*)(v + c * 8);
    }

    // The new key and value into row r of the K and V tiles at ks and vs, by one warp.
    __device__ __forceinline__ void patch(u32 ks, u32 vs, int r, int lane) const {
        for (int c = lane; c < D / 8; c += 32) {
            const uint4 x = *(const uint4*)(k + c * 8);
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(ks + fswz(KROW, r, c)), "r"(x.x), "r"(x.y), "r"(x.z), "r"(x.w) : "memory");
        }
        for (int c = lane; c < DV / 8; c += 32) {
            const uint4 x = *(const uint4*)(v + c * 8);
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(vs + fswz(VROW, r, c)), "r"(x.x), "r"(x.y), "r"(x.z), "r"(x.w) : "memory");
        }
    }
};

// Decode and short batches: one token's group (16 rows) per block, DEC_WARPS warps each
// streaming a contiguous share of the block's keys through its own ring. With TURNS, a slice of
// at least eight steps a warp (the host's turn_keys) goes to the warps by turns instead (warp w
// takes steps w, w + DEC_WARPS, ...), so the block's tiles in flight are consecutive keys: DRAM
// then serves fewer, longer runs (batch 8 at 8K keys 4-9 % faster); on short slices the
// contiguous shares measured faster. The host launches flash_decode_turns only where the launch's slices can be that long,
// so other launches run no extra instruction (docs/perf/2026-11-23-split-merge.md).
// Grid (tokens, n_head_kv, splits); dynamic shared memory: the Q tile and each warp's ring.
// The tile's rows, key ranges and split are worked out before waiting for the predecessor
// (dependent launch) from q_seq, kv_len and q_pos: those must come from a copy or launch before
// the step's first kernel, never the kernels just before (a narrow q·k·v product releases this
// launch before its own wait, common.cuh). With RoPE fused (DecodeRope) the rotation's angles and
// the first stored keys are requested before that wait too.
template <bool TURNS>
__device__ __forceinline__ void decode(const FlashParams& p) {
    constexpr int BM = 16, THREADS = 32 * DEC_WARPS;
    constexpr u32 Q_BYTES = BM * QROW;
    extern __shared__ __align__(128) u8 dec_smem[];
    __shared__ int row_tok[BM], row_head[BM];
    __shared__ u32 block_range[2];
    u8* smem = dec_smem;
    const u32 base = smem_addr(smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    Timeline tl(p, 0, tid == 0, blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
    tl.begin();
    tl.sm();

    __shared__ DecodeRope rope;
    const bool fused = p.k_new != nullptr;
    float wq[ROPE_PER], wk[ROPE_PER], freq;
    if (fused) rope.load(p, lane, wq, wk, freq);
    const Work work = grid_work();
    const u32 t0 = work.x;
    const u32 seq = p.q_seq[t0];
    const u32 kv_len = p.kv_len ? min(p.kv_len[seq], p.n_ctx) : p.n_ctx;
    tile_rows<BM, THREADS>(p, work, t0, 1, kv_len, row_tok, row_head, block_range, tid);
    __syncthreads();
    tl.mark(MARK_DEC_RANGE, work.z);
    // The launch's split count suits the longest context it may see (a captured graph replays
    // it as the context grows) and what one wave holds. A block's token uses all of the wave's
    // (fill_splits) where each gets at least one step per warp; otherwise up to eight splits of
    // at least two steps per warp and past that splits of at least four: more, shorter splits
    // that leave SMs idle cost more in the merge than they save
    // (docs/perf/2026-11-22-decode-splits.md, docs/perf/2026-11-24-decode-split-fill.md; the
    // host's decode_splits mirrors this rule). The blocks past them leave at once and the
    // merge waits for no more.
    constexpr u32 STEP_KEYS = DEC_WARPS * DEC_KEYS;
    const u32 keys = block_range[1] - block_range[0];
    const u32 by_keys = p.fill_splits > 0 && keys / SPLIT_KEYS >= p.fill_splits
                            ? p.fill_splits
                            : max(min(keys / (2 * SPLIT_KEYS), 8u), keys / (4 * SPLIT_KEYS));
    const u32 n_split = max(1u, min(p.n_split, by_keys));
    if (work.z >= n_split) {
        tl.end(0);
        return;
    }
    u32 kb, ke;
    split_slice(n_split, work.z, block_range[0], block_range[1], SPLIT_KEYS, kb, ke);
#ifdef FLASH_DEBUG
    // Every key to the first warp, so its dump is the state over consecutive steps.
    const bool turns = false;
    const u32 wb = warp == 0 ? kb : ke, we = ke;
#else
    const u32 per_warp = (ke - kb + STEP_KEYS - 1) / STEP_KEYS * DEC_KEYS;
    const bool turns = TURNS && ke - kb >= 8 * STEP_KEYS;
    const u32 wb = min(ke, kb + warp * (turns ? DEC_KEYS : per_warp));
    const u32 we = turns ? ke : min(ke, wb + per_warp);
#endif
    const u32 wstep = turns ? STEP_KEYS : DEC_KEYS;
    // Two divisions by constants, not one by wstep: a division by a run-time value on every
    // block's start cost short decode steps measurably (docs/perf/2026-11-23-split-merge.md).
    const int steps = (int)(turns ? (we - wb + STEP_KEYS - 1) / STEP_KEYS : (we - wb + DEC_KEYS - 1) / DEC_KEYS);
    const RowMask rm[1][2] = {{row_mask(p, row_tok[lane >> 2], kv_len), row_mask(p, row_tok[(lane >> 2) + 8], kv_len)}};

    const u32 g = work.y % p.n_head_kv;
    DecodeRing ring;
    ring.at = base + Q_BYTES + warp * DEC_STAGES * DecodeRing::STAGE;
    ring.kg = p.k + seq * p.k_seq + g * p.k_head;
    ring.vg = p.v + seq * p.v_seq + g * p.v_head;
    ring.end = we;
    ring.stored = we;
    const u32 pos = p.q_pos[t0];
    if (fused) {
        ring.stored = min(we, pos);
        rope.angles(p, pos, freq);
#pragma unroll
        for (int s = 0; s < DEC_STAGES - 1; ++s) ring.fill(p, s, wb + s * wstep, lane);
        pdl_begin();
        __syncthreads();  // the angles
        rope.prepare(p, base, row_tok, row_head, t0, g, warp, lane, wq, wk);
        __syncthreads();
        if (work.y < p.n_head_kv && kb <= pos && pos < ke && pos < p.n_ctx)
            rope.store(p, (u16*)ring.kg, (u16*)ring.vg, pos);
    } else {
        pdl_begin();
        load_q<BM, THREADS>(p, base, row_tok, row_head, tid);
        cp_async_commit();
#pragma unroll
        for (int s = 0; s < DEC_STAGES - 1; ++s) ring.fill(p, s, wb + s * wstep, lane);
        cp_async_wait<DEC_STAGES - 1>();  // the queries
        __syncthreads();
    }
    constexpr bool QREGS = D <= 128;
    QTile<QREGS> q[1];
    q[0].init(base, lane);

    WarpState st[1];
    st[0].init();
    for (int it = 0; it < steps; ++it) {
        const int ahead = it + DEC_STAGES - 1;
        ring.fill(p, ahead % DEC_STAGES, wb + ahead * wstep, lane);
        ring.wait();
        if (it == 0) tl.mark(MARK_DEC_FIRST, steps);
        float* dbg = nullptr;
#ifdef FLASH_DEBUG
        if (p.debug && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && warp == 0 && (u32)it < p.debug_tiles)
            dbg = p.debug + (u64)it * debug_step_floats<DEC_KEYS>();
#endif
        const int stage = it % DEC_STAGES;
        const u32 k0 = wb + it * wstep;
        if (fused && pos >= k0 && pos - k0 < DEC_KEYS && pos < we) {
            rope.patch(ring.k(stage), ring.v(stage), pos - k0, lane);
            __syncwarp();
        }
        attend<DEC_KEYS, 1, QREGS>(p, st, q, ring.k(stage), ring.v(stage), k0, rm, seq, lane, dbg);
        __syncwarp();
    }
    tl.mark(MARK_DEC_LOOP, 0);
    cp_async_wait_all();
    __syncthreads();
    tl.mark(MARK_DEC_WARPS, 0);
    // The split counts its arrival now, while the block combines and stores its rows: the
    // split that arrives last merges, once every other split has also counted its rows stored
    // (the counter's high half, each added with release after the block's stores). So the
    // last split's merge waits for no round trip of its own stores or its count, as it did
    // with one acquire-release count after the stores (merge_splits; this chain ends every
    // layer's attention in the engine: docs/perf/2026-12-07-decode-timeline.md).
    const bool partial = n_split > 1;
    u32* const counter = p.counters + work.x * work.heads + work.y;
    constexpr u32 STORED = 1u << 16;
    u32 seen = 0;
    // An increment that never wraps (the count stays below 2^32 - 2), not an add: ptxas turns a
    // one-lane add (or an increment with a constant bound of 2^32 - 1) into a warp's
    // aggregated add whose result is shuffled out at once, so the warp would wait for the
    // round trip here. A bound it cannot fold keeps the increment.
    const u32 bound = 0xfffffffeu | (n_split & 1u);
    if (partial && tid == 0) asm volatile("atom.relaxed.gpu.global.inc.u32 %0, [%1], %2;" : "=r"(seen) : "l"(counter), "r"(bound) : "memory");

    // The warps' states through shared memory (over the rings): per warp the running max and
    // sum of each row, then the unnormalised rows, padding rows left out. Rows are DV + 8
    // floats apart, so the 64-bit stores of a half warp (four rows, eight floats each) hit
    // 32 distinct banks.
    float* part = (float*)(smem + Q_BYTES);
    constexpr int OROW = DV + 8, WSTATE = 32 + BM * OROW;
    static_assert(DEC_WARPS * WSTATE * 4 <= DEC_WARPS * DEC_STAGES * DecodeRing::STAGE, "warp states over the rings");
    {
        float* w = part + warp * WSTATE;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int r = (lane >> 2) + 8 * i;
            const float l = st[0].sum(i);  // every lane: a quad shuffle
            if (row_tok[r] < 0) continue;
            if ((lane & 3) == 0) {
                w[r] = st[0].row_max[i];
                w[16 + r] = l;
            }
#pragma unroll
            for (int dt = 0; dt < DV / 8; ++dt)
                *(float2*)(w + 32 + r * OROW + dt * 8 + 2 * (lane & 3)) = make_float2(st[0].o[dt][2 * i], st[0].o[dt][2 * i + 1]);
        }
    }
    __syncthreads();
    tl.mark(MARK_DEC_STATES, 0);
    constexpr int C2 = DV / 2;
    // Only up to the last real row: past it (14 of 16 rows at GQA 2) each pass would cost a
    // shared-memory load and a branch on the launch's critical path. A multiple of 32 passes
    // when store_act quantizes (DV a multiple of 64), so its warps stay whole.
    const int live = 32 - __clz(__ballot_sync(0xffffffffu, lane < BM && row_tok[lane] >= 0));
    for (int i = tid; i < live * C2; i += THREADS) {
        const int r = i / C2, c = (i % C2) * 2;
        const int t = row_tok[r];
        // Where store_act quantizes (DV a multiple of 64) a warp's pairs lie in one row, so
        // this is warp-uniform there.
        if (t < 0) continue;
        float mx = FLASH_NEG_INF;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; ++w) mx = fmaxf(mx, part[w * WSTATE + r]);
        float l = 0.f, x = 0.f, y = 0.f;
        if (mx != FLASH_NEG_INF) {
#pragma unroll
            for (int w = 0; w < DEC_WARPS; ++w) {
                const float* ws = part + w * WSTATE;
                const float f = exp2f(ws[r] - mx);
                l += f * ws[16 + r];
                x += f * ws[32 + r * OROW + c];
                y += f * ws[32 + r * OROW + c + 1];
            }
        }
        float inv, lse2;
        row_finish(l, mx, inv, lse2);
        store2(p, partial, work.z, t, row_head[r], c, x * inv, y * inv, lse2, c == 0);
        if (!partial) {
            const float out[2] = {x * inv, y * inv};
            store_act<2>(p, true, t, row_head[r], c, out);
        }
    }
    tl.mark(MARK_DEC_STORED, 0);
    if (!partial) {
        tl.end(0);
        return;
    }
    const bool last = sync_threads_or<THREADS, 0>(tid == 0 && (seen & (STORED - 1)) == n_split - 1);
    tl.mark(MARK_DEC_COUNTED, last);
    if (!last) {
        if (tid == 0) asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(counter), "r"(STORED) : "memory");
        tl.end(0);
        return;
    }
    if (tid == 0) {
        u32 reads = 0;
        for (; seen / STORED < n_split - 1; ++reads)
            asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
        // The acquire half alone where PTX has it (sm_90, CUDA 12.8): it does not wait for
        // this block's own stores, as an acquire-release fence does.
#if __CUDA_ARCH__ >= 900 && (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 8))
        asm volatile("fence.acquire.gpu;" ::: "memory");
#else
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
#endif
        tl.mark(MARK_DEC_SPUN, reads);
    }
    __syncthreads();
    // Decode has the most splits (up to one per resident block), and its merge ends the
    // launch: twice prefill's loads per round. This block's own rows are read back as stored
    // (the barrier orders them within the block).
    merge_rows<BM, THREADS, 16>(p, n_split, work, row_tok, row_head, tid);
    tl.end(1);
}

extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS) flash_decode(const FlashParams p) { decode<false>(p); }
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS) flash_decode_turns(const FlashParams p) { decode<true>(p); }
