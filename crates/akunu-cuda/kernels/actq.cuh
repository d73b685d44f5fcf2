// The int8 activation format the GEMVs read (gemv.cu), written by the quantize_act kernel and
// by the norms that feed products directly (norm.cu): per group of 32 values, d = amax / 127,
// levels round(v / d) in [-127, 127] (all zero when amax is 0), and the group's float4
// {d, d·Σq, d·Σq[0..16), d·Σq[16..32)}. Both writers below give identical bits.
#pragma once
#include "common.cuh"

__device__ __forceinline__ int act_level(float v, float amax) {
    return amax > 0.0f ? max(-127, min(127, __float2int_rn(v * (127.0f / amax)))) : 0;
}

__device__ __forceinline__ float4 act_group_sums(float amax, int first_half, int second_half) {
    const float d = amax / 127.0f;
    return make_float4(d, d * (float)(first_half + second_half), d * (float)first_half,
                       d * (float)second_half);
}

// One value per lane: the whole warp quantizes one group, `q` and `s` pointing at the group's
// levels and sums.
__device__ __forceinline__ void quantize_group32(float v, int lane, i8* q, float4* s) {
    const float amax = warp_max(fabsf(v));
    const int level = act_level(v, amax);
    q[lane] = (i8)level;
    int half = level;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) half += __shfl_xor_sync(0xffffffffu, half, o);
    const int other = __shfl_xor_sync(0xffffffffu, half, 16);
    if (lane == 0) *s = act_group_sums(amax, half, other);
}

// Four values per lane: lanes 8j..8j+7 of the warp quantize group j of their float4s, `q4`
// pointing at this lane's four levels and `s` at the group's sums. Every lane must call it.
__device__ __forceinline__ void quantize_group8x4(float4 v, int lane, u32* q4, float4* s) {
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const int l0 = act_level(v.x, amax), l1 = act_level(v.y, amax);
    const int l2 = act_level(v.z, amax), l3 = act_level(v.w, amax);
    *q4 = (u32)(l0 & 0xFF) | ((u32)(l1 & 0xFF) << 8) | ((u32)(l2 & 0xFF) << 16) |
          ((u32)(l3 & 0xFF) << 24);
    int half = l0 + l1 + l2 + l3;
    half += __shfl_xor_sync(0xffffffffu, half, 1);
    half += __shfl_xor_sync(0xffffffffu, half, 2);
    const int other = __shfl_xor_sync(0xffffffffu, half, 4);
    if ((lane & 7) == 0) *s = act_group_sums(amax, half, other);
}
