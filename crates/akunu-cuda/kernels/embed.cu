// Embedding lookup: out[t][c] = dequant(table row tokens[t])[c] * scale, per weight type
// (-DQTYPE). A token id outside the table yields a zero row instead of reading past it.
// embed_norm also applies the first block's RMSNorm, optionally writing the int8 form of its
// output, so a pass starts with one launch where it took three (lookup, norm, quantizer).
#include "actq.cuh"
#include "quant.cuh"

// Group g (32 values) of token t's row of the table, times scale; zeros for a token id outside
// the table.
__device__ __forceinline__ void lookup_group(const QMatrix& table, const u32* __restrict__ tokens,
                                             int t, int g, float scale, float (&v)[32]) {
    const u32 tok = __ldg(tokens + t);
    if (tok < (u32)table.rows) {
        dequant32(table, (int)tok, g, v);
    } else {
#pragma unroll
        for (int k = 0; k < 32; k++) v[k] = 0.0f;
    }
#pragma unroll
    for (int k = 0; k < 32; k++) v[k] *= scale;
}

// 32 values to `out` (16-byte aligned) in eight 16-byte stores.
__device__ __forceinline__ void store_group(float* __restrict__ out, const float (&v)[32]) {
    float4* o = (float4*)out;
#pragma unroll
    for (int k = 0; k < 8; k++)
        o[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
}

// grid (ceil(cols/32 / blockDim.x), m), block 1-D: thread g looks up group g (32 values) of
// token blockIdx.y's row.
extern "C" __global__ void embed(const u8* __restrict__ data, const u8* __restrict__ aux, int rows,
                                 int cols, const u32* __restrict__ tokens, int m,
                                 float* __restrict__ out, float scale) {
    pdl_begin();
    const int t = blockIdx.y;
    const int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= m || g >= cols / 32) return;
    float v[32];
    lookup_group({data, aux, rows, cols}, tokens, t, g, scale, v);
    store_group(out + (size_t)t * cols + (size_t)g * 32, v);
}

// grid (m), block of at least cols/32 threads, a multiple of 32: thread g dequantizes group g
// (32 values) of token blockIdx.x's row into registers and writes it to `residual` (·scale);
// then normed = residual · inv_rms · w, as norm.cu's rms_norm computes it, and with q the
// int8 form of normed (actq.cuh: levels at q + t·cols, sums at qs + t·cols/32), quantized in
// the thread to the same bits as quantize_group.
extern "C" __global__ void __launch_bounds__(1024)
    embed_norm(const u8* __restrict__ data, const u8* __restrict__ aux, int rows, int cols,
               const u32* __restrict__ tokens, int m, float* __restrict__ residual, float scale,
               const float* __restrict__ w, float eps, float* __restrict__ normed,
               i8* __restrict__ q, float4* __restrict__ qs) {
    pdl_begin();
    __shared__ float red[32];
    const int t = blockIdx.x, g = threadIdx.x, groups = cols / 32;
    if (t >= m) return;
    const bool mine = g < groups;
    float v[32];
    const size_t at = (size_t)t * cols + (size_t)g * 32;
    float ss = 0.0f;
    if (mine) {
        lookup_group({data, aux, rows, cols}, tokens, t, g, scale, v);
        store_group(residual + at, v);
#pragma unroll
        for (int k = 0; k < 32; k++) ss += v[k] * v[k];
    }
    const float r = inv_rms(block_sum(ss, red), (u32)cols, eps);
    if (!mine) return;
    const float4* w4 = (const float4*)(w + (size_t)g * 32);
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float4 gk = w4[k];
        v[4 * k] = v[4 * k] * r * gk.x;
        v[4 * k + 1] = v[4 * k + 1] * r * gk.y;
        v[4 * k + 2] = v[4 * k + 2] * r * gk.z;
        v[4 * k + 3] = v[4 * k + 3] * r * gk.w;
#pragma unroll
        for (int e = 0; e < 4; e++) amax = fmaxf(amax, fabsf(v[4 * k + e]));
    }
    store_group(normed + at, v);
    if (!q) return;
    const float inv = act_inv(amax);
    u32 packed[8];
    u32 raw_sum[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 8; k++) {
        u32 raw[4];
#pragma unroll
        for (int e = 0; e < 4; e++) raw[e] = act_raw(v[4 * k + e], inv);
        packed[k] = pack_raw4(raw[0], raw[1], raw[2], raw[3]);
        raw_sum[k / 4] += raw[0] + raw[1] + raw[2] + raw[3];
    }
    const int half[2] = {(int)(raw_sum[0] - 16 * ACT_RAW_ZERO),
                         (int)(raw_sum[1] - 16 * ACT_RAW_ZERO)};
    uint4* q4 = (uint4*)(q + at);
    q4[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    q4[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
    qs[(size_t)t * groups + g] = act_group_sums(amax, half[0], half[1]);
}
