// What a launch pays when the kernel before it left the SMs with another split of L1 and shared
// memory. Each timed launch follows a flush of L2 (as flash-bench times decode: flush, event,
// one launch, event; median of 20) by one of four flushes: a streaming read kernel with no
// shared memory, the same asking the driver for the largest shared-memory carveout, the same
// launched with 129 KB of dynamic shared memory (the decode attention's request), and device
// copies of 1 MiB windows (flash-bench's read flush). The timed launches: an empty one, an empty
// one of 132 blocks with 129 KB each, and a streaming read of the 32K-key decode row's bytes
// (134.2 MB) without and with 129 KB a block.
// Standalone, for the GPU machine:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/carveout \
//     scripts/gpu/carveout.cu && /tmp/carveout
#include <algorithm>
#include <vector>
#include "stream_read.cuh"

constexpr int SMEM = 129 * 1024;

template <int TAG>
__global__ void empty() {}

int main() {
    const cudaDeviceProp prop = device_props();
    const int sms = prop.multiProcessorCount, l2 = prop.l2CacheSize;
    // Tags keep each role's attributes apart: 0 flush, 1 flush preferring shared memory,
    // 2 flush with 129 KB, 3 timed read, 4 timed read with 129 KB.
    CK(cudaFuncSetAttribute(stream_read<1>, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    CK(cudaFuncSetAttribute(stream_read<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    CK(cudaFuncSetAttribute(stream_read<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    CK(cudaFuncSetAttribute(empty<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    const size_t bytes = (size_t)32768 * 8 * 128 * 2 * 2;
    uint4* buf;
    CK(cudaMalloc(&buf, bytes));
    CK(cudaMemset(buf, 1, bytes));
    const size_t window = 1 << 20, flush_bytes = ((size_t)l2 * 2 + window - 1) / window * window;
    uint4* flush;
    CK(cudaMalloc(&flush, flush_bytes + window));
    CK(cudaMemset(flush, 2, flush_bytes + window));
    unsigned* out;
    CK(cudaMalloc(&out, 1 << 20));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const char* flush_names[4] = {"read kernel", "read kernel, carveout 100", "read kernel, 129 KB", "1 MiB copies"};
    auto run_flush = [&](int f) {
        const size_t n = flush_bytes / 16;
        switch (f) {
        case 0: stream_read<0><<<sms * 4, THREADS>>>(flush, n, out); break;
        case 1: stream_read<1><<<sms * 4, THREADS>>>(flush, n, out); break;
        case 2: stream_read<2><<<sms, THREADS, SMEM>>>(flush, n, out); break;
        default:
            for (size_t at = window; at < window + flush_bytes; at += window)
                CK(cudaMemcpyAsync(flush, (char*)flush + at, window, cudaMemcpyDeviceToDevice));
        }
    };
    const char* timed_names[4] = {"empty, 1 block", "empty, 132 blocks of 129 KB", "32K read, no shared",
                                  "32K read, 129 KB a block"};
    auto run_timed = [&](int t) {
        switch (t) {
        case 0: empty<0><<<1, 32>>>(); break;
        case 1: empty<1><<<sms, 256, SMEM>>>(); break;
        case 2: stream_read<3><<<sms, THREADS>>>(buf, bytes / 16, out); break;
        default: stream_read<4><<<sms, THREADS, SMEM>>>(buf, bytes / 16, out);
        }
    };
    printf("%s, %d SMs, L2 %d MB; us, median of 20 (the 32K reads: one block of 512 threads per SM)\n", prop.name, sms,
           l2 >> 20);
    printf("| timed launch | after %s | after %s | after %s | after %s |\n|---|---|---|---|---|\n", flush_names[0],
           flush_names[1], flush_names[2], flush_names[3]);
    for (int t = 0; t < 4; ++t) {
        printf("| %s |", timed_names[t]);
        for (int f = 0; f < 4; ++f) {
            std::vector<float> us;
            for (int it = 0; it < 23; ++it) {
                run_flush(f);
                CK(cudaEventRecord(e0));
                run_timed(t);
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (it >= 3) us.push_back(ms * 1e3f);
            }
            std::sort(us.begin(), us.end());
            printf(" %.1f |", us[us.size() / 2]);
        }
        printf("\n");
    }
    CK(cudaGetLastError());
    return 0;
}
