// Causal attention of f32 queries over the f16 KV cache ([slot][kv_head][position][dim]), as the
// CPU backend computes it: queries rounded to f16 precision, scores q.k * scale, optional
// soft-cap cap * tanh(s / cap), softmax, weighted sum of V, all in f32 with an online softmax.
// A query at position p of slot s sees positions first..=p of slot s, first = p + 1 - window
// under a sliding window, else 0.
//
// One block serves up to ATT_GROUP query heads that share a KV head, so each K/V tile is read
// once for all of them. Long contexts with few (token, KV head) pairs are split over
// gridDim.z: each split handles a slice of the positions and writes an unnormalised partial
// (accumulator, running max, running sum) that attention_combine merges.
#include "common.cuh"

#define ATT_THREADS 128
#define ATT_TILE 64
#define ATT_GROUP 8
#define ATT_MAX_SPLITS 256
// Positions per split are rounded up to this, so splits see whole runs of positions.
#define ATT_SPLIT_ALIGN 32
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float lo_half(u32 w) { return f16_to_f32((u16)(w & 0xffffu)); }
__device__ __forceinline__ float hi_half(u32 w) { return f16_to_f32((u16)(w >> 16)); }

// dot[r] += q[hs + 2r] . k for r < R: one position's key row against R of the block's heads.
template <int R>
__device__ __forceinline__ void tile_dots(const u32* krow, const float* q_s, u32 d, u32 hs,
                                          float (&dot)[ATT_GROUP / 2]) {
    for (u32 c = 0; c < d / 2; ++c) {
        const u32 w = krow[c];
        const float k0 = lo_half(w), k1 = hi_half(w);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float2 qq = reinterpret_cast<const float2*>(q_s + (hs + 2 * r) * d)[c];
            dot[r] += qq.x * k0 + qq.y * k1;
        }
    }
}

// Work split: grid = (m * n_head_kv, ceil(group / ATT_GROUP), splits), ATT_THREADS threads.
// Block (t * n_head_kv + g, c, s) serves query heads g * group + c * ATT_GROUP + [0, ATT_GROUP)
// of token t over split s of its visible positions, in tiles of ATT_TILE positions staged in
// shared memory. With one split the block writes the normalised rows of `out`; with more it
// writes partials: part_acc[(t * n_head + h) * splits + s][head_dim_v] and part_ml[...][2]
// (running max, running sum).
//
// Dynamic shared memory (4-byte words): V tile ATT_TILE * dv/2, K tile ATT_TILE * (d/2 + 1)
// (padded so a warp reading one word of 32 rows hits 32 banks), queries ATT_GROUP * d,
// scores ATT_GROUP * ATT_TILE, and max/sum/correction 3 * ATT_GROUP.
// Needs d and dv multiples of 8 (16-byte rows) and at most 256.
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
attention(const float* q, const u16* kcache, const u16* vcache, float* out, float* part_acc,
          float* part_ml, const u32* positions, const u32* slots, u32 n_head, u32 n_head_kv,
          u32 d, u32 dv, u32 n_ctx, float scale, int window, float softcap) {
    pdl_begin();
    extern __shared__ uint4 smem[];
    const u32 kw = d / 2 + 1;
    const u32 vw = dv / 2;
    u32* v_s = reinterpret_cast<u32*>(smem);
    u32* k_s = v_s + ATT_TILE * vw;
    float* q_s = reinterpret_cast<float*>(k_s + ATT_TILE * kw);
    float* s_s = q_s + ATT_GROUP * d;
    float* m_s = s_s + ATT_GROUP * ATT_TILE;
    float* l_s = m_s + ATT_GROUP;
    float* c_s = l_s + ATT_GROUP;

    const u32 tid = threadIdx.x;
    const u32 t = blockIdx.x / n_head_kv, g = blockIdx.x % n_head_kv;
    const u32 group = n_head / n_head_kv;
    const u32 h_first = g * group + blockIdx.y * ATT_GROUP;
    const u32 gb = min((u32)ATT_GROUP, group - blockIdx.y * ATT_GROUP);
    const u32 split = blockIdx.z, n_split = gridDim.z;

    const u32 pos = positions[t], slot = slots[t];
    const bool valid = pos < n_ctx;
    u32 first = 0;
    if (window >= 0 && pos + 1 > (u32)window) first = pos + 1 - (u32)window;
    const u32 len = valid ? pos + 1 - first : 0;
    u32 chunk = (len + n_split - 1) / n_split;
    chunk = (chunk + ATT_SPLIT_ALIGN - 1) / ATT_SPLIT_ALIGN * ATT_SPLIT_ALIGN;
    const u32 begin = first + min(len, split * chunk);
    const u32 end = first + min(len, (split + 1) * chunk);

    // Queries at f16 precision; rows past gb are zeros (read by the score loop of an odd gb).
    for (u32 i = tid; i < ATT_GROUP * d; i += ATT_THREADS) {
        const u32 h = i / d, c = i % d;
        float x = 0.f;
        if (h < gb) x = f16_to_f32(f32_to_f16(q[((u64)t * n_head + h_first + h) * d + c]));
        q_s[i] = x;
    }
    if (tid < ATT_GROUP) {
        m_s[tid] = NEG_INF;
        l_s[tid] = 0.f;
    }
    __syncthreads();

    const u64 kv_row = ((u64)slot * n_head_kv + g) * n_ctx;
    const u16* kbase = kcache + kv_row * d;
    const u16* vbase = vcache + kv_row * dv;

    // Score phase: thread -> (position j, heads hs, hs + 2, hs + 4, hs + 6).
    const u32 sj = tid % ATT_TILE, hs = tid / ATT_TILE;
    // Value phase: thread -> (column pair cp, heads hl, hl + lanes, ...).
    const u32 pairs = dv / 2;
    const u32 lanes = ATT_THREADS / pairs;
    const u32 cp = tid % pairs, hl = tid / pairs;
    const u32 my_heads = hl < lanes && gb > hl ? (gb - hl + lanes - 1) / lanes : 0;
    float acc[ATT_GROUP][2];
#pragma unroll
    for (u32 k = 0; k < ATT_GROUP; ++k) acc[k][0] = acc[k][1] = 0.f;

    const u32 d8 = d / 8, dv8 = dv / 8;
    for (u32 p0 = begin; p0 < end; p0 += ATT_TILE) {
        const u32 tl = min((u32)ATT_TILE, end - p0);
        // Stage the tile: 16-byte loads; K rows re-laid with the padded stride.
        const uint4* kg = reinterpret_cast<const uint4*>(kbase + (u64)p0 * d);
#pragma unroll 4
        for (u32 i = tid; i < tl * d8; i += ATT_THREADS) {
            const uint4 x = __ldg(kg + i);
            u32* dst = k_s + (i / d8) * kw + (i % d8) * 4;
            dst[0] = x.x;
            dst[1] = x.y;
            dst[2] = x.z;
            dst[3] = x.w;
        }
        const uint4* vg = reinterpret_cast<const uint4*>(vbase + (u64)p0 * dv);
        uint4* vs4 = reinterpret_cast<uint4*>(v_s);
#pragma unroll 4
        for (u32 i = tid; i < tl * dv8; i += ATT_THREADS) vs4[i] = __ldg(vg + i);
        __syncthreads();

        if (sj < tl) {
            float dot[ATT_GROUP / 2] = {0.f, 0.f, 0.f, 0.f};
            const u32* krow = k_s + sj * kw;
            const u32 pairs_of_heads = (gb + 1) / 2;
            if (pairs_of_heads == 1) {
                tile_dots<1>(krow, q_s, d, hs, dot);
            } else if (pairs_of_heads == 2) {
                tile_dots<2>(krow, q_s, d, hs, dot);
            } else if (pairs_of_heads == 3) {
                tile_dots<3>(krow, q_s, d, hs, dot);
            } else {
                tile_dots<4>(krow, q_s, d, hs, dot);
            }
#pragma unroll
            for (u32 r = 0; r < ATT_GROUP / 2; ++r) {
                const u32 h = hs + 2 * r;
                if (h < gb) {
                    float s = dot[r] * scale;
                    if (softcap > 0.f) s = tanh_accurate(s / softcap) * softcap;
                    s_s[h * ATT_TILE + sj] = s;
                }
            }
        }
        __syncthreads();

        // Online softmax: warp w updates heads w and w + 4.
        {
            const u32 lane = tid & 31, warp = tid >> 5;
            for (u32 h = warp; h < gb; h += ATT_THREADS / 32) {
                float* row = s_s + h * ATT_TILE;
                const float s0 = lane < tl ? row[lane] : NEG_INF;
                const float s1 = lane + 32 < tl ? row[lane + 32] : NEG_INF;
                const float m_old = m_s[h];
                const float m_new = fmaxf(m_old, warp_max(fmaxf(s0, s1)));
                const float corr = __expf(m_old - m_new);
                const float p0v = lane < tl ? __expf(s0 - m_new) : 0.f;
                const float p1v = lane + 32 < tl ? __expf(s1 - m_new) : 0.f;
                if (lane < tl) row[lane] = p0v;
                if (lane + 32 < tl) row[lane + 32] = p1v;
                const float sum = warp_sum(p0v + p1v);
                __syncwarp();
                if (lane == 0) {
                    m_s[h] = m_new;
                    l_s[h] = l_s[h] * corr + sum;
                    c_s[h] = corr;
                }
            }
        }
        __syncthreads();

#pragma unroll
        for (u32 k = 0; k < ATT_GROUP; ++k) {
            if (k < my_heads) {
                const float corr = c_s[hl + k * lanes];
                acc[k][0] *= corr;
                acc[k][1] *= corr;
            }
        }
        if (my_heads > 0) {
            for (u32 j = 0; j < tl; ++j) {
                const u32 w = v_s[j * vw + cp];
                const float v0 = lo_half(w), v1 = hi_half(w);
#pragma unroll
                for (u32 k = 0; k < ATT_GROUP; ++k) {
                    if (k < my_heads) {
                        const float p = s_s[(hl + k * lanes) * ATT_TILE + j];
                        acc[k][0] += p * v0;
                        acc[k][1] += p * v1;
                    }
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (u32 k = 0; k < ATT_GROUP; ++k) {
        if (k < my_heads) {
            const u32 h = hl + k * lanes;
            const u64 row = (u64)t * n_head + h_first + h;
            if (n_split == 1) {
                const float l = l_s[h];
                const float inv = l > 0.f ? 1.f / l : 0.f;
                reinterpret_cast<float2*>(out + row * dv)[cp] =
                    make_float2(acc[k][0] * inv, acc[k][1] * inv);
            } else {
                reinterpret_cast<float2*>(part_acc + (row * n_split + split) * dv)[cp] =
                    make_float2(acc[k][0], acc[k][1]);
            }
        }
    }
    if (n_split > 1 && tid < gb) {
        const u64 row = (u64)t * n_head + h_first + tid;
        part_ml[(row * n_split + split) * 2] = m_s[tid];
        part_ml[(row * n_split + split) * 2 + 1] = l_s[tid];
    }
}

// Merges the splits' partials of each (token, query head) row into `out`.
// Work split: one block per row (grid.x = m * n_head), threads stride the dv columns.
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
attention_combine(const float* part_acc, const float* part_ml, float* out, u32 rows, u32 dv,
                  u32 n_split) {
    pdl_begin();
    __shared__ float weight[ATT_MAX_SPLITS];
    __shared__ float total;
    const u32 r = blockIdx.x;
    if (r >= rows) return;
    const float* ml = part_ml + (u64)r * n_split * 2;
    float m = NEG_INF;
    for (u32 s = 0; s < n_split; ++s) m = fmaxf(m, ml[2 * s]);
    for (u32 s = threadIdx.x; s < n_split; s += blockDim.x)
        weight[s] = m == NEG_INF ? 0.f : __expf(ml[2 * s] - m);
    __syncthreads();
    if (threadIdx.x == 0) {
        float l = 0.f;
        for (u32 s = 0; s < n_split; ++s) l += weight[s] * ml[2 * s + 1];
        total = l;
    }
    __syncthreads();
    const float inv = total > 0.f ? 1.f / total : 0.f;
    const float* acc = part_acc + (u64)r * n_split * dv;
    for (u32 c = threadIdx.x; c < dv; c += blockDim.x) {
        float x = 0.f;
        for (u32 s = 0; s < n_split; ++s) x += weight[s] * acc[(u64)s * dv + c];
        out[(u64)r * dv + c] = x * inv;
    }
}
