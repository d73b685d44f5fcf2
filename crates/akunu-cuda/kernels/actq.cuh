// The int8 activation format the GEMVs read (gemv.cu), written by the quantize_act kernel and
// by the norms that feed products directly (norm.cu): per group of 32 values, d = amax / 127,
// levels round(v / d) in [-127, 127] (all zero when amax is 0), and the group's float4
// {d, d·Σq, d·Σq[0..16), d·Σq[16..32)}. quantize_group gives identical bits whether a lane
// holds 1, 2 or 4 of a group's values.
#pragma once
#include "common.cuh"

// round(v · 127 / amax), half to even, clamped to ±127. The rounding adds 1.5·2^23 (exact
// for |x| < 2^22, as the scaled values are) instead of a float-to-int conversion, which runs at
// a quarter of the FP32 rate and dominated the quantizers; the product and the sum stay
// separate roundings, so the levels are those of __float2int_rn.
__device__ __forceinline__ int act_level(float v, float amax) {
    const float x = __fmul_rn(v, 127.0f / amax);
    const int level = __float_as_int(__fadd_rn(x, 12582912.0f)) - 0x4B400000;
    return amax > 0.0f ? max(-127, min(127, level)) : 0;
}

__device__ __forceinline__ float4 act_group_sums(float amax, int first_half, int second_half) {
    const float d = amax / 127.0f;
    return make_float4(d, d * (float)(first_half + second_half), d * (float)first_half,
                       d * (float)second_half);
}

// VALS (1, 2 or 4) consecutive values per lane: the 32 / VALS consecutive lanes that hold a
// group (starting at a multiple of 32 / VALS) quantize it. Returns this lane's levels packed
// a byte each (for store_levels) and, in the group's first lane, the group's sums in `sums`.
// Every lane of the warp must call it.
template <int VALS>
__device__ __forceinline__ u32 quantize_group(const float (&v)[VALS], int lane, float4& sums) {
    constexpr int LANES = 32 / VALS;
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < VALS; i++) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
    for (int o = 1; o < LANES; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    u32 packed = 0;
    int half = 0;
#pragma unroll
    for (int i = 0; i < VALS; i++) {
        const int level = act_level(v[i], amax);
        packed |= (u32)(level & 0xFF) << (8 * i);
        half += level;
    }
    // The first 16 values are in the group's first LANES / 2 lanes.
#pragma unroll
    for (int o = 1; o < LANES / 2; o <<= 1) half += __shfl_xor_sync(0xffffffffu, half, o);
    const int other = __shfl_xor_sync(0xffffffffu, half, LANES / 2);
    if ((lane & (LANES - 1)) == 0) sums = act_group_sums(amax, half, other);
    return packed;
}

// The VALS levels of quantize_group at q (aligned to VALS bytes).
template <int VALS>
__device__ __forceinline__ void store_levels(i8* q, u32 packed) {
    if (VALS == 4) {
        *(u32*)q = packed;
    } else if (VALS == 2) {
        *(u16*)q = (u16)packed;
    } else {
        *q = (i8)packed;
    }
}
