// Shared by every kernel: fixed-width types, f16/bf16 conversions and warp reductions.
// NVRTC compiles without any CUDA header: use these helpers and inline PTX, never <cuda_*.h>.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed char i8;

#define WARP 32

// Programmatic dependent launch (Hopper; `Gpu::launch_raw`): a kernel may be scheduled while its
// predecessor on the stream drains. Every kernel starts with pdl_begin: wait until the
// predecessor's writes are visible (so transitively every earlier kernel's), then let the
// successor's blocks be scheduled as this grid's blocks finish. A kernel with work that needs
// nothing from its predecessor (the GEMVs' first weight loads, decode attention's stored keys)
// issues that work first, then calls pdl_wait and pdl_release. Every kernel waits before it
// releases, except the narrow single-token products (start_product in gemv.cu), which release
// first, so the kernel after one of those may run beside the one before it. Hence what a kernel
// reads before its wait must come from no launch that may still run: the products read only
// weights there, decode attention the step's positions and keys stored by earlier steps.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_release() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_begin() {
    pdl_wait();
    pdl_release();
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
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

// The RMSNorm factor of n values whose squares sum to sum_sq.
__device__ __forceinline__ float inv_rms(float sum_sq, u32 n, float eps) {
    return rsqrtf(sum_sq / (float)n + eps);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Loads through L2 only (not L1), for data other blocks of the same launch wrote.
__device__ __forceinline__ float ldcg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ void ldcg4(const float* p, float* v) {
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3])
                 : "l"(p));
}

// NVRTC ships no CUDA headers, so half precision goes through PTX conversions on raw bits.
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }

// tanh with a few ulp of relative error everywhere (fast-math tanhf may use tanh.approx), for
// soft-capping, which must match the CPU backend closely.
__device__ __forceinline__ float tanh_accurate(float x) {
    const float a = fabsf(x);
    float t = 1.f;
    if (a < 9.f) {
        const float e = expm1f(2.f * a);
        t = e / (e + 2.f);
    }
    return copysignf(t, x);
}
