// FlashAttention on tensor cores: mma.sync m16n8k16 (f16 or bf16 in, f32 accumulate), one kernel
// family for prefill, chunked prefill, decode and speculative verification.
//
// Compiled per element type and head sizes: -DHEAD_DIM, -DHEAD_DIM_V (16..256, multiples of
// 16), -DKV_BF16 (K, V and Q are bf16, else f16), -DQ_F32 (queries are read as f32 and rounded to
// the element type), -DOUT_F32 (output rows are f32, else the element type), -DFLASH_DEBUG.
//
// Plan:
// 1. Rows, not heads: a block owns BM = 16 * NW query rows of one KV head, packed as (token,
//    query head of the group) pairs, so each K/V tile is read once for every query head that
//    shares it (GQA) and a decode token fills a 16-row tile with its group's heads. A tile of
//    tokens is a run of consecutive tokens of one sequence (host list, prefill) or one token
//    (decode, so a captured graph needs no host data). Groups wider than the tile are split
//    into head chunks (gridDim.y = n_head_kv * chunks).
// 2. The block walks the keys its rows can see (the union of their causal and window ranges,
//    so whole masked tiles are never loaded), BN keys per step, with cp.async double
//    buffering of K and V into XOR-swizzled shared memory (conflict-free ldmatrix). Split-KV
//    (gridDim.z) gives each split a slice of that range and writes normalised partial rows
//    with their log2-sum-exp; flash_combine merges them.
// 3. Per step and warp: S = Q K^T (ldmatrix for Q and K), scale (and soft-cap), the per-element
//    mask only where the warp's rows are not all fully visible (causal edge, window edge,
//    segments, tree), online softmax in the log2 domain with per-thread partial row sums, then
//    P (re-packed from the S accumulators as A fragments, FA2) times V (ldmatrix.trans).
// 4. Rows without a visible key give zeros and lse = -inf, never NaN: the running max stays
//    -inf and exponentials are taken against 0 instead.
#include "common.cuh"
#include "mma.cuh"

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

#define FLASH_NEG_INF __int_as_float(0xff800000)
#define FLASH_LOG2E 1.4426950408889634f
#define FLASH_LN2 0.6931471805599453f
#define FLASH_MAX_SPLITS 256

constexpr int D = HEAD_DIM;
constexpr int DV = HEAD_DIM_V;
// Keys per step: 64, or 32 when a row is wider than 256 bytes (keeps two stages in 64 KiB).
constexpr int BN = (D > 128 || DV > 128) ? 32 : 64;
constexpr u32 QROW = D * 2, KROW = D * 2, VROW = DV * 2;

// Kernel parameters, passed by value; the host mirrors this layout (`FlashParams` in
// src/flash.rs): 8-byte fields first, then 4-byte ones.
struct FlashParams {
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
    float* debug;
    long long q_tok, q_head;
    long long k_seq, k_head, k_pos;
    long long v_seq, v_head, v_pos;
    long long o_tok, o_head;
    u32 n_tokens, n_head, n_head_kv, n_ctx;
    int causal, window;
    float softcap, scale;
    u32 n_split, debug_tiles;
};

// Byte offset of 16-byte chunk c of row r in a tile of `row_bytes` rows: chunks XOR-swizzled by
// the low bits of r inside each 128-byte group (inside the row when it is shorter), so the 8
// rows of an ldmatrix hit different bank groups.
__device__ __forceinline__ u32 fswz(u32 row_bytes, int r, int c) {
    const int mask = row_bytes >= 128 ? 7 : (int)(row_bytes / 16) - 1;
    return (u32)r * row_bytes + ((u32)(c ^ (r & mask)) << 4);
}

__device__ __forceinline__ u32 pack2(float lo, float hi) {
#if KV_BF16
    return pack_bf16x2(lo, hi);
#else
    return pack_f16x2(lo, hi);
#endif
}

__device__ __forceinline__ void mma(float (&acc)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if KV_BF16
    mma_16816_bf16(acc, a, b0, b1);
#else
    mma_16816(acc, a, b0, b1);
#endif
}

// What one query row may see: keys in [lo, hi), then the segment and tree tests.
struct RowMask {
    u32 lo, hi;
    int seg;
    u64 tree;
    u32 tree_base;
    bool valid;
};

__device__ __forceinline__ bool visible(const FlashParams& p, const RowMask& m, u32 seq, u32 j) {
    if (!m.valid || j < m.lo || j >= m.hi) return false;
    if (p.q_seg && p.k_seg[(u64)seq * p.n_ctx + j] != m.seg) return false;
    if (p.tree_mask && j >= m.tree_base) {
        const u32 d = j - m.tree_base;
        if (d >= 64 || !((m.tree >> d) & 1ull)) return false;
    }
    return true;
}

template <int NW>
__device__ __forceinline__ void flash_tile(const FlashParams& p) {
    constexpr int BM = 16 * NW;
    constexpr int THREADS = 32 * NW;
    constexpr u32 Q_BYTES = BM * QROW;
    constexpr u32 K_BYTES = BN * KROW;
    constexpr u32 STAGE = K_BYTES + BN * VROW;
    extern __shared__ __align__(128) u8 smem[];
    __shared__ int row_tok[BM], row_head[BM];
    __shared__ u32 block_range[2];
    const u32 base = smem_addr(smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    const u32 group = p.n_head / p.n_head_kv;
    const u32 g = blockIdx.y % p.n_head_kv, chunk = blockIdx.y / p.n_head_kv;
    const u32 per_token = min(group, (u32)BM), tokens_per_tile = BM / per_token;
    u32 t0 = blockIdx.x, ntok = 1;
    if (p.tiles) {
        t0 = p.tiles[2 * blockIdx.x];
        ntok = p.tiles[2 * blockIdx.x + 1];
    }
    const u32 seq = p.q_seq[t0];
    const u32 kv_len = p.kv_len ? min(p.kv_len[seq], p.n_ctx) : p.n_ctx;

    // Rows of the tile and the union of their key ranges.
    for (int r = tid; r < BM; r += THREADS) {
        const u32 tl = r / per_token, hg = chunk * BM + r % per_token;
        const bool ok = (u32)r < tokens_per_tile * per_token && tl < ntok && hg < group;
        row_tok[r] = ok ? (int)(t0 + tl) : -1;
        row_head[r] = ok ? (int)(g * group + hg) : 0;
    }
    if (warp == 0) {
        u32 lo = 0xffffffffu, hi = 0;
        for (u32 i = lane; i < ntok; i += 32) {
            const u32 pos = p.q_pos[t0 + i];
            u32 h = kv_len, l = 0;
            if (p.causal) h = min(h, pos + 1);
            if (p.window > 0 && pos + 1 > (u32)p.window) l = pos + 1 - (u32)p.window;
            lo = min(lo, l);
            hi = max(hi, h);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
            hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
        }
        if (lane == 0) {
            block_range[0] = min(lo, hi);
            block_range[1] = hi;
        }
    }
    __syncthreads();

    // This split's slice of the keys, in whole steps.
    const u32 blo = block_range[0], bhi = block_range[1];
    u32 per_split = (bhi - blo + p.n_split - 1) / p.n_split;
    per_split = (per_split + BN - 1) / BN * BN;
    const u32 kb = min(bhi, blo + blockIdx.z * per_split);
    const u32 ke = min(bhi, kb + per_split);
    const int steps = (int)((ke - kb + BN - 1) / BN);

    // This thread's two rows (C fragment rows group and group + 8 of its warp).
    const int rows[2] = {warp * 16 + (lane >> 2), warp * 16 + (lane >> 2) + 8};
    RowMask rm[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int t = row_tok[rows[i]];
        RowMask& m = rm[i];
        m.valid = t >= 0;
        m.lo = 0;
        m.hi = 0;
        m.seg = 0;
        m.tree = 0;
        m.tree_base = 0xffffffffu;
        if (m.valid) {
            const u32 pos = p.q_pos[t];
            m.hi = p.causal ? min(kv_len, pos + 1) : kv_len;
            if (p.window > 0 && pos + 1 > (u32)p.window) m.lo = pos + 1 - (u32)p.window;
            if (p.q_seg) m.seg = p.q_seg[t];
            if (p.tree_mask) {
                m.tree = p.tree_mask[t];
                m.tree_base = p.tree_base[t];
            }
        }
    }

    // Queries: 16-byte chunks, zeros for rows past the tile.
    {
        constexpr int CH = D / 8;
        for (int i = tid; i < BM * CH; i += THREADS) {
            const int r = i / CH, c = i % CH;
            const int t = row_tok[r];
            const u32 dst = base + fswz(QROW, r, c);
#if Q_F32
            uint4 h = make_uint4(0, 0, 0, 0);
            if (t >= 0) {
                const float* src = (const float*)p.q + t * p.q_tok + row_head[r] * p.q_head + c * 8;
                h.x = pack2(src[0], src[1]);
                h.y = pack2(src[2], src[3]);
                h.z = pack2(src[4], src[5]);
                h.w = pack2(src[6], src[7]);
            }
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(h.x),
                         "r"(h.y), "r"(h.z), "r"(h.w)
                         : "memory");
#else
            const u16* src = (const u16*)p.q + (t >= 0 ? t * p.q_tok + row_head[r] * p.q_head + c * 8 : 0);
            cp_async16(dst, src, t >= 0 ? 16 : 0);
#endif
        }
    }

    const u16* kg = p.k + seq * p.k_seq + g * p.k_head;
    const u16* vg = p.v + seq * p.v_seq + g * p.v_head;
    auto load_kv = [&](int stage, u32 k0) {
        const u32 ks = base + Q_BYTES + stage * STAGE, vs = ks + K_BYTES;
        constexpr int KC = D / 8, VC = DV / 8;
        for (int i = tid; i < BN * KC; i += THREADS) {
            const int r = i / KC, c = i % KC;
            const bool ok = k0 + r < ke;
            cp_async16(ks + fswz(KROW, r, c), ok ? kg + (k0 + r) * p.k_pos + c * 8 : kg, ok ? 16 : 0);
        }
        for (int i = tid; i < BN * VC; i += THREADS) {
            const int r = i / VC, c = i % VC;
            const bool ok = k0 + r < ke;
            cp_async16(vs + fswz(VROW, r, c), ok ? vg + (k0 + r) * p.v_pos + c * 8 : vg, ok ? 16 : 0);
        }
    };

    float o[DV / 8][4];
#pragma unroll
    for (int i = 0; i < DV / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float row_max[2] = {FLASH_NEG_INF, FLASH_NEG_INF}, row_sum[2] = {0.f, 0.f};
    const float scale_log2 = p.scale * FLASH_LOG2E;

    if (steps > 0) load_kv(0, kb);
    cp_async_commit();
    for (int it = 0; it < steps; ++it) {
        const u32 k0 = kb + it * BN;
        if (it + 1 < steps) load_kv((it + 1) & 1, k0 + BN);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const u32 ks = base + Q_BYTES + (it & 1) * STAGE, vs = ks + K_BYTES;

        float s[BN / 8][4];
#pragma unroll
        for (int i = 0; i < BN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            u32 a[4];
            ldsm_x4(a, base + fswz(QROW, warp * 16 + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
            for (int np = 0; np < BN / 16; ++np) {
                u32 b[4];
                ldsm_x4(b, ks + fswz(KROW, np * 16 + (lane & 7) + ((lane >> 4) << 3),
                                     2 * kk + ((lane >> 3) & 1)));
                mma(s[2 * np], a, b[0], b[1]);
                mma(s[2 * np + 1], a, b[2], b[3]);
            }
        }

        // Scores in the log2 domain; the per-element mask only where some row of the warp does
        // not see the whole step.
        bool whole = !p.q_seg && !p.tree_mask;
#pragma unroll
        for (int i = 0; i < 2; ++i)
            whole = whole && (!rm[i].valid || (k0 >= rm[i].lo && k0 + BN <= rm[i].hi));
        whole = __all_sync(0xffffffffu, whole);
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float x = s[nt][e];
                if (p.softcap > 0.f)
                    x = p.softcap * tanh_accurate(x * p.scale / p.softcap) * FLASH_LOG2E;
                else
                    x *= scale_log2;
                if (!whole && !visible(p, rm[e >> 1], seq, k0 + nt * 8 + 2 * (lane & 3) + (e & 1)))
                    x = FLASH_NEG_INF;
                s[nt][e] = x;
            }
        }
#ifdef FLASH_DEBUG
        // Per-step state of the first block's first warp, in natural-log units:
        // scores[16][BN], probs[16][BN], running max[16], running sum[16], unnormalised out[16][DV].
        constexpr int DEBUG_STEP = 2 * 16 * BN + 32 + 16 * DV;
        const bool dump = p.debug && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 &&
                          warp == 0 && (u32)it < p.debug_tiles;
        float* dbg = p.debug + (u64)it * DEBUG_STEP;
        if (dump) {
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    dbg[((lane >> 2) + 8 * (e >> 1)) * BN + nt * 8 + 2 * (lane & 3) + (e & 1)] =
                        s[nt][e] * FLASH_LN2;
        }
#endif

        float use_max[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            float mx = row_max[i];
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * i], s[nt][2 * i + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float corr = mx == FLASH_NEG_INF ? 1.f : exp2f(row_max[i] - mx);
            row_max[i] = mx;
            use_max[i] = mx == FLASH_NEG_INF ? 0.f : mx;
            row_sum[i] *= corr;
#pragma unroll
            for (int dt = 0; dt < DV / 8; ++dt) {
                o[dt][2 * i] *= corr;
                o[dt][2 * i + 1] *= corr;
            }
        }
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float pr = exp2f(s[nt][e] - use_max[e >> 1]);
                s[nt][e] = pr;
                row_sum[e >> 1] += pr;
            }
        }

#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            const u32 a[4] = {pack2(s[2 * kk][0], s[2 * kk][1]), pack2(s[2 * kk][2], s[2 * kk][3]),
                              pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dp = 0; dp < DV / 16; ++dp) {
                u32 b[4];
                ldsm_x4_trans(b, vs + fswz(VROW, kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                           2 * dp + (lane >> 4)));
                mma(o[2 * dp], a, b[0], b[1]);
                mma(o[2 * dp + 1], a, b[2], b[3]);
            }
        }

#ifdef FLASH_DEBUG
        if (dump) {
#pragma unroll
            for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    dbg[16 * BN + ((lane >> 2) + 8 * (e >> 1)) * BN + nt * 8 + 2 * (lane & 3) + (e & 1)] =
                        s[nt][e];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                float l = row_sum[i];
                l += __shfl_xor_sync(0xffffffffu, l, 1);
                l += __shfl_xor_sync(0xffffffffu, l, 2);
                const int r = (lane >> 2) + 8 * i;
                if ((lane & 3) == 0) {
                    dbg[2 * 16 * BN + r] = row_max[i] * FLASH_LN2;
                    dbg[2 * 16 * BN + 16 + r] = l;
                }
#pragma unroll
                for (int dt = 0; dt < DV / 8; ++dt) {
                    const int c = dt * 8 + 2 * (lane & 3);
                    dbg[2 * 16 * BN + 32 + r * DV + c] = o[dt][2 * i];
                    dbg[2 * 16 * BN + 32 + r * DV + c + 1] = o[dt][2 * i + 1];
                }
            }
        }
#endif
        __syncthreads();
    }
    cp_async_wait_all();

#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float l = row_sum[i];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int t = row_tok[rows[i]];
        if (t < 0) continue;
        const int h = row_head[rows[i]];
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const float lse2 = l > 0.f ? row_max[i] + __log2f(l) : FLASH_NEG_INF;
        if (p.n_split > 1) {
            float* dst = p.part_o + (((u64)blockIdx.z * p.n_tokens + t) * p.n_head + h) * DV;
#pragma unroll
            for (int dt = 0; dt < DV / 8; ++dt)
                *(float2*)(dst + dt * 8 + 2 * (lane & 3)) = make_float2(o[dt][2 * i] * inv, o[dt][2 * i + 1] * inv);
            if ((lane & 3) == 0) p.part_lse[((u64)blockIdx.z * p.n_tokens + t) * p.n_head + h] = lse2;
        } else {
            const long long off = t * p.o_tok + h * p.o_head;
#pragma unroll
            for (int dt = 0; dt < DV / 8; ++dt) {
                const int c = dt * 8 + 2 * (lane & 3);
#if OUT_F32
                *(float2*)((float*)p.out + off + c) = make_float2(o[dt][2 * i] * inv, o[dt][2 * i + 1] * inv);
#else
                *(u32*)((u16*)p.out + off + c) = pack2(o[dt][2 * i] * inv, o[dt][2 * i + 1] * inv);
#endif
            }
            if (p.lse && (lane & 3) == 0) p.lse[(u64)t * p.n_head + h] = lse2 * FLASH_LN2;
        }
    }
}

// Prefill and chunked prefill: 4 warps, 64 rows. Grid (tiles, n_head_kv * chunks, splits).
extern "C" __global__ void __launch_bounds__(128) flash_prefill(const FlashParams p) { flash_tile<4>(p); }

// Decode and short batches: 1 warp, 16 rows (one token's group). Grid (tokens, n_head_kv, splits).
extern "C" __global__ void __launch_bounds__(32) flash_decode(const FlashParams p) { flash_tile<1>(p); }

// Merges the splits' partial rows: one block per (token, head), threads over the columns.
extern "C" __global__ void __launch_bounds__(128) flash_combine(const FlashParams p) {
    __shared__ float weight[FLASH_MAX_SPLITS];
    __shared__ float total, lmax;
    const u32 row = blockIdx.x, t = row / p.n_head, h = row % p.n_head;
    const u64 stride = (u64)p.n_tokens * p.n_head;
    if (threadIdx.x == 0) {
        float m = FLASH_NEG_INF;
        for (u32 z = 0; z < p.n_split; ++z) m = fmaxf(m, p.part_lse[z * stride + row]);
        float sum = 0.f;
        for (u32 z = 0; z < p.n_split; ++z) {
            const float w = m == FLASH_NEG_INF ? 0.f : exp2f(p.part_lse[z * stride + row] - m);
            weight[z] = w;
            sum += w;
        }
        total = sum;
        lmax = m;
    }
    __syncthreads();
    const float inv = total > 0.f ? 1.f / total : 0.f;
    const long long off = t * p.o_tok + h * p.o_head;
    for (u32 c = threadIdx.x; c < (u32)DV; c += blockDim.x) {
        float x = 0.f;
        for (u32 z = 0; z < p.n_split; ++z) x += weight[z] * p.part_o[(z * stride + row) * DV + c];
        x *= inv;
#if OUT_F32
        ((float*)p.out)[off + c] = x;
#else
#if KV_BF16
        ((u16*)p.out)[off + c] = (u16)(pack_bf16x2(x, 0.f) & 0xffffu);
#else
        ((u16*)p.out)[off + c] = f32_to_f16(x);
#endif
#endif
    }
    if (p.lse && threadIdx.x == 0)
        p.lse[(u64)t * p.n_head + h] = total > 0.f ? (lmax + __log2f(total)) * FLASH_LN2 : FLASH_NEG_INF;
}
