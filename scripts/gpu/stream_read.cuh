// Shared by the standalone measurements (read_floor.cu, carveout.cu; fused_front.cu for the
// first two): the error check, the device's properties and a streaming read of every 16-byte
// word once.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

// Any CUDA error ends the run with its call.
static void check(cudaError_t e, const char* call) {
    if (e != cudaSuccess) {
        printf("%s: %s\n", call, cudaGetErrorString(e));
        exit(1);
    }
}
#define CK(x) check((x), #x)

// Device 0's properties (its SM count, L2 size and name).
static cudaDeviceProp device_props() {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    return prop;
}

constexpr int THREADS = 512, IN_FLIGHT = 8;

// Every 16-byte word of src once, IN_FLIGHT loads a thread outstanding; one word per block out
// so the loads stay. TAG tells apart instances whose launch attributes differ (carveout.cu).
template <int TAG = 0>
__global__ void __launch_bounds__(THREADS) stream_read(const uint4* __restrict__ src, size_t n, unsigned* out) {
    unsigned acc = 0;
    const size_t stride = (size_t)gridDim.x * THREADS;
    size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x;
    for (; i + (IN_FLIGHT - 1) * stride < n; i += IN_FLIGHT * stride) {
        uint4 v[IN_FLIGHT];
#pragma unroll
        for (int j = 0; j < IN_FLIGHT; ++j) v[j] = __ldcs(src + i + j * stride);
#pragma unroll
        for (int j = 0; j < IN_FLIGHT; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
    for (; i < n; i += stride) {
        const uint4 v = __ldcs(src + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) out[blockIdx.x] = acc;
}
