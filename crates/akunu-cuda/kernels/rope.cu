// The fused step between the q/k/v projections and attention: per token, optional RMSNorm of
// every Q and K head (QK-norm), RoPE of Q and K, Q rounded to f16 precision in place (the
// precision attention reads it at) or, given q16, written there as f16 (prefill attention then
// copies its query tiles without converting them), and K and V written as f16 into the cache at
// the token's (slot, position). The cache is [slot][kv_head][position][dim]. The rotation is
// rope.cuh's.
#include "common.cuh"
#include "rope.cuh"

#define ROPE_THREADS 256
#define ROPE_WARPS (ROPE_THREADS / 32)
#define ROPE_MAX_DIM 256

// Work split: grid = (m, ceil((n_head + 2 * n_head_kv) / 8)); block (t, y) takes heads
// 8y .. 8y + 7 of token t in the order Q heads, K heads, V heads, one warp per head, lanes
// striding the head. Each block computes the token's angles it needs.
// Before waiting for its predecessor (dependent launch) a block reads what only earlier launches
// or copies write: the token's position and slot, the frequencies and the norm weights, and
// computes the angles; so positions and slots must never come from the kernel just before.
extern "C" __global__ void __launch_bounds__(ROPE_THREADS)
qk_rope_store(float* q, u16* q16, const float* k, const float* v, const float* q_norm, const float* k_norm,
              float eps, const float* inv_freq, u32 n_rot, u32 neox, const u32* positions,
              const u32* slots, u16* kcache, u16* vcache, u32 n_head, u32 n_head_kv,
              u32 head_dim, u32 head_dim_v, u32 n_ctx) {
    __shared__ float cos_sin[ROPE_MAX_DIM];
    __shared__ float head[ROPE_WARPS][ROPE_MAX_DIM];
    constexpr u32 PER_LANE = ROPE_MAX_DIM / 32;
    const u32 t = blockIdx.x;
    const u32 pos = positions[t], slot = slots[t];
    const bool store = pos < n_ctx;
    const u32 half = n_rot / 2;
    for (u32 i = threadIdx.x; i < half; i += blockDim.x) rope_angle(cos_sin, i, pos, inv_freq[i]);
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 hh = blockIdx.y * ROPE_WARPS + warp;
    const bool is_q = hh < n_head;
    const float* w = hh < n_head + n_head_kv ? (is_q ? q_norm : k_norm) : nullptr;
    float wv[PER_LANE];
#pragma unroll
    for (u32 j = 0; j < PER_LANE; ++j) {
        const u32 e = lane + 32 * j;
        wv[j] = w && e < head_dim ? w[e] : 0.f;
    }
    pdl_begin();
    __syncthreads();

    float* hb = head[warp];
    if (hh >= n_head + 2 * n_head_kv) return;
    if (hh >= n_head + n_head_kv) {
        // V head: converted and stored, nothing else.
        const u32 g = hh - n_head - n_head_kv;
        if (!store) return;
        const float* src = v + ((u64)t * n_head_kv + g) * head_dim_v;
        u16* dst = vcache + (((u64)slot * n_head_kv + g) * n_ctx + pos) * head_dim_v;
        for (u32 e = lane; e < head_dim_v; e += 32) dst[e] = f32_to_f16(src[e]);
        return;
    }
    const u32 g = is_q ? hh : hh - n_head;
    // The query head's place, in q and in q16.
    const u64 q_at = ((u64)t * n_head + g) * head_dim;
    const float* src = is_q ? q + q_at : k + ((u64)t * n_head_kv + g) * head_dim;
    float ss = 0.f;
    for (u32 e = lane; e < head_dim; e += 32) {
        const float x = src[e];
        hb[e] = x;
        ss += x * x;
    }
    if (w) {
        const float scale = rsqrtf(warp_sum(ss) / (float)head_dim + eps);
#pragma unroll
        for (u32 j = 0; j < PER_LANE; ++j) {
            const u32 e = lane + 32 * j;
            if (e < head_dim) hb[e] = hb[e] * scale * wv[j];
        }
    }
    __syncwarp();
    // Partners come from the staged head, so the results can go straight out.
    u16* k_dst = kcache + (((u64)slot * n_head_kv + g) * n_ctx + pos) * head_dim;
    if (!is_q && !store) return;
    for (u32 e = lane; e < head_dim; e += 32) {
        const float y = e < n_rot ? rope_element(hb, cos_sin, e, n_rot, neox) : hb[e];
        if (!is_q) {
            k_dst[e] = f32_to_f16(y);
        } else if (q16) {
            q16[q_at + e] = f32_to_f16(y);
        } else {
            q[q_at + e] = f16_to_f32(f32_to_f16(y));
        }
    }
}
