// RMSNorm of row groups, and the fused residual add + RMSNorm that joins two decoder blocks.
// Numerics follow the CPU backend: squares summed in f32, `x * rsqrt(mean + eps) * w`.
// Rows are read with 16-byte loads when the width is a multiple of 4 and every pointer is
// 16-byte aligned, else element by element. In-place use (src == dst) is safe: every element is
// read and written by the same thread, after the reduction that needs the old values.
#include "common.cuh"

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

// Sum over the block; every thread gets the total. `red` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* red) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < (blockDim.x >> 5) ? red[lane] : 0.f;
    v = warp_sum(v);
    __syncthreads();
    return v;
}

__device__ __forceinline__ float inv_rms(float sum_sq, u32 n, float eps) {
    return rsqrtf(sum_sq / (float)n + eps);
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

template <bool VEC>
__device__ __forceinline__ void add_rms_row(float* res, const float* add, const float* post_w,
                                            const float* next_w, float* normed, u32 width,
                                            float eps, float* red) {
    const u32 i0 = threadIdx.x, step = blockDim.x;
    float post_scale = 1.f;
    if (post_w) post_scale = inv_rms(block_sum(sum_squares<VEC>(add, width, i0, step), red), width, eps);
    float ss = 0.f;
    if (VEC) {
        const float4* a4 = reinterpret_cast<const float4*>(add);
        const float4* p4 = reinterpret_cast<const float4*>(post_w);
        float4* r4 = reinterpret_cast<float4*>(res);
        for (u32 i = i0; i < width / 4; i += step) {
            float4 a = a4[i];
            if (post_w) {
                float4 p = p4[i];
                a = make_float4(a.x * post_scale * p.x, a.y * post_scale * p.y,
                                a.z * post_scale * p.z, a.w * post_scale * p.w);
            }
            float4 r = r4[i];
            r = make_float4(r.x + a.x, r.y + a.y, r.z + a.z, r.w + a.w);
            r4[i] = r;
            ss += r.x * r.x + r.y * r.y + r.z * r.z + r.w * r.w;
        }
    } else {
        for (u32 i = i0; i < width; i += step) {
            float a = add[i];
            if (post_w) a = a * post_scale * post_w[i];
            float r = res[i] + a;
            res[i] = r;
            ss += r * r;
        }
    }
    float scale = inv_rms(block_sum(ss, red), width, eps);
    scale_rows<VEC>(res, next_w, normed, scale, width, i0, step);
}

// Per row: optionally add = rms_norm(add) * post_w (not written back), then residual += add,
// then normed = rms_norm(residual) * next_w. post_w == 0 skips the first norm.
// Work split: one block per row (grid.x = rows), the block's threads stride the row.
extern "C" __global__ void add_rms_norm(float* residual, const float* add, const float* post_w,
                                        const float* next_w, float* normed, u32 rows, u32 width,
                                        float eps) {
    pdl_begin();
    __shared__ float red[32];
    const u32 r = blockIdx.x;
    if (r >= rows) return;
    float* res = residual + (u64)r * width;
    const float* a = add + (u64)r * width;
    float* out = normed + (u64)r * width;
    const bool vec = (width & 3) == 0 && aligned16(residual, add, normed) &&
                     aligned16(next_w, post_w, residual);
    if (vec) {
        add_rms_row<true>(res, a, post_w, next_w, out, width, eps, red);
    } else {
        add_rms_row<false>(res, a, post_w, next_w, out, width, eps, red);
    }
}
