// RMSNorm of row groups, and the fused residual add + RMSNorm that joins two decoder blocks.
// Numerics follow the CPU backend: squares summed in f32, `x * rsqrt(mean + eps) * w`.
// Rows are read with 16-byte loads when the width is a multiple of 4 and every pointer is
// 16-byte aligned, else element by element. In-place use (src == dst) is safe: every element is
// read and written by the same thread, after the reduction that needs the old values.
// The fused residual add + RMSNorm can also write its output in the GEMVs' int8 format
// (actq.cuh), which saves decode the quantize_act launch before the products it feeds.
#include "actq.cuh"

__device__ __forceinline__ bool aligned16(const void* a, const void* b, const void* c) {
    return ((reinterpret_cast<u64>(a) | reinterpret_cast<u64>(b) | reinterpret_cast<u64>(c)) &
            15) == 0;
}

// Sum of squares of x[0..n) over the elements i0, i0 + step, ... (float4 units when VEC).
template <bool VEC>
__device__ __forceinline__ float sum_squares(const float* x, u32 n, u32 i0, u32 step) {
    float s = 0.f;
    if (VEC) {
        const float4* x4 = reinterpret_cast<const float4*>(x);
        for (u32 i = i0; i < n / 4; i += step) {
            float4 v = x4[i];
            s += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    } else {
        for (u32 i = i0; i < n; i += step) s += x[i] * x[i];
    }
    return s;
}

// y = x * scale * w over the same elements as sum_squares.
template <bool VEC>
__device__ __forceinline__ void scale_rows(const float* x, const float* w, float* y, float scale,
                                           u32 n, u32 i0, u32 step) {
    if (VEC) {
        const float4* x4 = reinterpret_cast<const float4*>(x);
        const float4* w4 = reinterpret_cast<const float4*>(w);
        float4* y4 = reinterpret_cast<float4*>(y);
        for (u32 i = i0; i < n / 4; i += step) {
            float4 v = x4[i], g = w4[i];
            y4[i] = make_float4(v.x * scale * g.x, v.y * scale * g.y, v.z * scale * g.z,
                                v.w * scale * g.w);
        }
    } else {
        for (u32 i = i0; i < n; i += step) y[i] = x[i] * scale * w[i];
    }
}

// dst[g] = rms_norm(src[g]) * w for n_groups groups of `group` floats (small groups).
// Work split: one warp per group, blockDim.x / 32 warps per block; grid.x = ceil(groups / warps).
extern "C" __global__ void rms_norm_warp(const float* src, float* dst, const float* w,
                                         u32 n_groups, u32 group, float eps) {
    pdl_begin();
    const u32 g = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (g >= n_groups) return;
    const u32 lane = threadIdx.x & 31;
    const float* x = src + (u64)g * group;
    float* y = dst + (u64)g * group;
    if ((group & 3) == 0 && aligned16(src, dst, w)) {
        float scale = inv_rms(warp_sum(sum_squares<true>(x, group, lane, 32)), group, eps);
        scale_rows<true>(x, w, y, scale, group, lane, 32);
    } else {
        float scale = inv_rms(warp_sum(sum_squares<false>(x, group, lane, 32)), group, eps);
        scale_rows<false>(x, w, y, scale, group, lane, 32);
    }
}

// The same for large groups.
// Work split: one block per group (grid.x = n_groups), the block's threads stride the group.
extern "C" __global__ void rms_norm_block(const float* src, float* dst, const float* w,
                                          u32 n_groups, u32 group, float eps) {
    pdl_begin();
    __shared__ float red[32];
    const u32 g = blockIdx.x;
    if (g >= n_groups) return;
    const float* x = src + (u64)g * group;
    float* y = dst + (u64)g * group;
    if ((group & 3) == 0 && aligned16(src, dst, w)) {
        float scale = inv_rms(block_sum(sum_squares<true>(x, group, threadIdx.x, blockDim.x), red),
                              group, eps);
        scale_rows<true>(x, w, y, scale, group, threadIdx.x, blockDim.x);
    } else {
        float scale = inv_rms(
            block_sum(sum_squares<false>(x, group, threadIdx.x, blockDim.x), red), group, eps);
        scale_rows<false>(x, w, y, scale, group, threadIdx.x, blockDim.x);
    }
}

// Float4s of a row each thread keeps in registers in add_rms_row_regs (the launcher gives a
// row up to 1024 threads, so rows up to 8192 wide; 1024 threads leave 64 registers each).
#define ADD_NORM_VECS 2

// The row in registers: every load is issued before the first reduction (the weights too), so a
// decode step's single row costs one memory round trip, not one per pass. Needs 16-byte
// alignment and width <= 4 * ADD_NORM_VECS * blockDim.x.
__device__ __forceinline__ void add_rms_row_regs(float* res, const float* add, const float* post_w,
                                                 const float* next_w, float* normed, u32 width,
                                                 float eps, float* red, i8* q, float4* qs) {
    const u32 n4 = width / 4, i0 = threadIdx.x, step = blockDim.x;
    float4 a[ADD_NORM_VECS], r[ADD_NORM_VECS], g[ADD_NORM_VECS];
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int k = 0; k < ADD_NORM_VECS; ++k) {
        const u32 i = i0 + k * step;
        const bool in = i < n4;
        a[k] = in ? reinterpret_cast<const float4*>(add)[i] : zero;
        r[k] = in ? reinterpret_cast<const float4*>(res)[i] : zero;
        g[k] = in ? reinterpret_cast<const float4*>(next_w)[i] : zero;
    }
    if (post_w) {
        float ps = 0.f;
#pragma unroll
        for (int k = 0; k < ADD_NORM_VECS; ++k) ps += a[k].x * a[k].x + a[k].y * a[k].y + a[k].z * a[k].z + a[k].w * a[k].w;
        const float post_scale = inv_rms(block_sum(ps, red), width, eps);
#pragma unroll
        for (int k = 0; k < ADD_NORM_VECS; ++k) {
            const u32 i = i0 + k * step;
            const float4 p = i < n4 ? reinterpret_cast<const float4*>(post_w)[i] : zero;
            a[k] = make_float4(a[k].x * post_scale * p.x, a[k].y * post_scale * p.y, a[k].z * post_scale * p.z,
                               a[k].w * post_scale * p.w);
        }
    }
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < ADD_NORM_VECS; ++k) {
        r[k] = make_float4(r[k].x + a[k].x, r[k].y + a[k].y, r[k].z + a[k].z, r[k].w + a[k].w);
        ss += r[k].x * r[k].x + r[k].y * r[k].y + r[k].z * r[k].z + r[k].w * r[k].w;
    }
    const float scale = inv_rms(block_sum(ss, red), width, eps);
#pragma unroll
    for (int k = 0; k < ADD_NORM_VECS; ++k) {
        const u32 i = i0 + k * step;
        const float4 y = make_float4(r[k].x * scale * g[k].x, r[k].y * scale * g[k].y,
                                     r[k].z * scale * g[k].z, r[k].w * scale * g[k].w);
        if (i < n4) {
            reinterpret_cast<float4*>(res)[i] = r[k];
            reinterpret_cast<float4*>(normed)[i] = y;
        }
        // A group of 32 is 8 consecutive float4s: 8 lanes of one warp (step is whole warps,
        // and the launcher asks for quantization only when width is a multiple of 32).
        if (q) {
            const float v[4] = {y.x, y.y, y.z, y.w};
            float4 sums;
            const u32 levels = quantize_group<4>(v, threadIdx.x & 31, sums);
            if (i < n4) {
                store_levels<4>(q + 4 * i, levels);
                if ((i & 7) == 0) qs[i / 8] = sums;
            }
        }
    }
}

// The general path's quantization: normed is re-read after the block's writes, one group of 32
// per warp at a time.
__device__ __forceinline__ void quantize_row(const float* normed, u32 width, i8* q, float4* qs) {
    __syncthreads();
    const u32 lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (u32 g = threadIdx.x >> 5; g < width / 32; g += warps) {
        const float v[1] = {normed[g * 32 + lane]};
        float4 sums;
        store_levels<1>(q + g * 32 + lane, quantize_group<1>(v, lane, sums));
        if (lane == 0) qs[g] = sums;
    }
}

// The general case (unaligned rows, odd widths): three passes over the row.
__device__ __forceinline__ void add_rms_row(float* res, const float* add, const float* post_w,
                                            const float* next_w, float* normed, u32 width,
                                            float eps, float* red) {
    const u32 i0 = threadIdx.x, step = blockDim.x;
    float post_scale = 1.f;
    if (post_w) post_scale = inv_rms(block_sum(sum_squares<false>(add, width, i0, step), red), width, eps);
    float ss = 0.f;
    for (u32 i = i0; i < width; i += step) {
        float a = add[i];
        if (post_w) a = a * post_scale * post_w[i];
        float r = res[i] + a;
        res[i] = r;
        ss += r * r;
    }
    float scale = inv_rms(block_sum(ss, red), width, eps);
    scale_rows<false>(res, next_w, normed, scale, width, i0, step);
}

// Per row: optionally add = rms_norm(add) * post_w (not written back), then residual += add,
// then normed = rms_norm(residual) * next_w; with q (width a multiple of 32), normed also in
// the GEMVs' int8 format: levels at q + row·width, sums at qs + row·width/32. post_w == 0
// skips the first norm.
// Work split: one block per row (grid.x = rows), a float4 of the row per thread (the launcher
// picks the block size).
extern "C" __global__ void __launch_bounds__(1024)
    add_rms_norm(float* residual, const float* add, const float* post_w, const float* next_w, float* normed,
                 u32 rows, u32 width, float eps, i8* q, float4* qs) {
    pdl_begin();
    __shared__ float red[32];
    const u32 r = blockIdx.x;
    if (r >= rows) return;
    float* res = residual + (u64)r * width;
    const float* a = add + (u64)r * width;
    float* out = normed + (u64)r * width;
    const bool vec = (width & 3) == 0 && aligned16(residual, add, normed) &&
                     aligned16(next_w, post_w, residual) && width <= 4 * ADD_NORM_VECS * blockDim.x;
    i8* row_q = q ? q + (u64)r * width : nullptr;
    float4* row_qs = q ? qs + (u64)r * (width / 32) : nullptr;
    if (vec) {
        add_rms_row_regs(res, a, post_w, next_w, out, width, eps, red, row_q, row_qs);
    } else {
        add_rms_row(res, a, post_w, next_w, out, width, eps, red);
        if (q) quantize_row(out, width, row_q, row_qs);
    }
}
