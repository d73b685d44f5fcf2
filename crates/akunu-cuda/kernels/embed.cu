// Embedding lookup: out[t][c] = dequant(table row tokens[t])[c] * scale, per weight type
// (-DQTYPE). A token id outside the table yields a zero row instead of reading past it.
#include "quant.cuh"

// grid (ceil(cols/32 / blockDim.x), m), block 1-D: thread g dequantizes group g (32 values) of
// token blockIdx.y's row and writes it with 16-byte stores.
extern "C" __global__ void embed(const u8* __restrict__ data, const u8* __restrict__ aux, int rows,
                                 int cols, const u32* __restrict__ tokens, int m,
                                 float* __restrict__ out, float scale) {
    pdl_begin();
    const int t = blockIdx.y;
    const int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= m || g >= cols / 32) return;
    const QMatrix w = {data, aux, rows, cols};
    const u32 tok = __ldg(tokens + t);
    float v[32];
    if (tok < (u32)rows) {
        dequant32(w, (int)tok, g, v);
    } else {
#pragma unroll
        for (int k = 0; k < 32; k++) v[k] = 0.0f;
    }
    float4* o = (float4*)(out + (size_t)t * cols + (size_t)g * 32);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        o[k] = make_float4(v[4 * k] * scale, v[4 * k + 1] * scale, v[4 * k + 2] * scale,
                           v[4 * k + 3] * scale);
    }
}
