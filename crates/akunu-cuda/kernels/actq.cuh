// The int8 activation format the GEMVs read (gemv.cu), written by the quantize_act kernel and
// by the norms that feed products directly (norm.cu): per group of 32 values, d = amax / 127,
// levels round(v / d) in [-127, 127] (all zero when amax is 0), and the group's float4
// {d, d·Σq, d·Σq[0..16), d·Σq[16..32)}. quantize_group gives identical bits whether a lane
// holds 1, 2 or 4 of a group's values.
#pragma once
#include "common.cuh"

// The factor a group's values take to their levels: 127 / amax, or 0 for a group of zeros
// (every level 0).
__device__ __forceinline__ float act_inv(float amax) { return amax > 0.0f ? 127.0f / amax : 0.0f; }

// round(v · inv), half to even, as the bits of the float ACT_RAW_ZERO + level: adding 1.5·2^23
// to the scaled value rounds it (exact for |x| < 2^22) without a float-to-int conversion, which
// runs at a quarter of the FP32 rate. The product and the sum are separate roundings, so the
// levels are those of __float2int_rn. As |v| ≤ amax, |v · inv| < 127.5: the level needs no
// clamp, the raw bits' low byte is its int8 and a sum of n raw values is n · ACT_RAW_ZERO plus
// the levels' sum (mod 2^32).
constexpr u32 ACT_RAW_ZERO = 0x4B400000u;
__device__ __forceinline__ u32 act_raw(float v, float inv) {
    return __float_as_uint(__fadd_rn(__fmul_rn(v, inv), 12582912.0f));
}

// Four raw levels' int8 bytes, the first in the lowest byte.
__device__ __forceinline__ u32 pack_raw4(u32 a, u32 b, u32 c, u32 d) {
    return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
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
    const float inv = act_inv(amax);
    u32 raw[4] = {ACT_RAW_ZERO, ACT_RAW_ZERO, ACT_RAW_ZERO, ACT_RAW_ZERO};
#pragma unroll
    for (int i = 0; i < VALS; i++) raw[i] = act_raw(v[i], inv);
    const u32 packed = pack_raw4(raw[0], raw[1], raw[2], raw[3]);
    int half = (int)(raw[0] + raw[1] + raw[2] + raw[3] - 4 * ACT_RAW_ZERO);
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
