// What one event-timed launch can reach: a plain streaming read of the bytes each decode row of
// `flash-bench` reads (GQA 32/8, head size 128, f16 K and V: 4K, 32K and 128K keys), timed as
// flash-bench times decode (a flush before each run, one launch between two events, median of
// 20), beside an empty launch, and the same reads as eight launches over eight buffers between
// one pair of events (launch latency then overlaps the previous launch). Two flushes: a
// streaming read of twice the L2's size, which leaves L2 clean, and flash-bench's write flush
// (twice the L2's size copied, BENCHMARKS.md's method), which leaves it dirty, so the timed read
// also waits for those lines' write-back.
// Standalone, for the GPU machine:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/read_floor \
//     scripts/gpu/read_floor.cu && /tmp/read_floor
#include <algorithm>
#include <vector>
#include "stream_read.cuh"

__global__ void empty() {}

int main() {
    const cudaDeviceProp prop = device_props();
    const int sms = prop.multiProcessorCount, l2 = prop.l2CacheSize;
    const size_t rows[3] = {4096, 32768, 131072};
    const size_t max_bytes = rows[2] * 8 * 128 * 2 * 2;
    const int copies = 8;
    std::vector<uint4*> bufs(copies);
    for (auto& b : bufs) {
        CK(cudaMalloc(&b, max_bytes));
        CK(cudaMemset(b, 1, max_bytes));
    }
    // The read flush streams the first half; the write flush copies it over the second.
    uint4* flush;
    const size_t flush_bytes = (size_t)l2 * 2;
    CK(cudaMalloc(&flush, flush_bytes * 2));
    CK(cudaMemset(flush, 2, flush_bytes * 2));
    unsigned* out;
    CK(cudaMalloc(&out, 1 << 20));
    const int grid = sms * 4;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto median = [](std::vector<float> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    };
    enum Flush { READ, WRITE };
    auto time_one = [&](auto launch, Flush f = READ) {
        std::vector<float> t;
        for (int it = 0; it < 23; ++it) {
            if (f == READ)
                stream_read<0><<<grid, THREADS>>>(flush, flush_bytes / 16, out);
            else
                CK(cudaMemcpyAsync((char*)flush + flush_bytes, flush, flush_bytes, cudaMemcpyDeviceToDevice));
            CK(cudaEventRecord(e0));
            launch();
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (it >= 3) t.push_back(ms * 1e3f);
        }
        return median(t);
    };
    printf("%s, %d SMs, L2 %d MB\n", prop.name, sms, l2 >> 20);
    printf("empty launch: %.1f us\n", time_one([&] { empty<<<1, 32>>>(); }));
    for (size_t keys : rows) {
        const size_t bytes = keys * 8 * 128 * 2 * 2;
        const auto read = [&] { stream_read<0><<<grid, THREADS>>>(bufs[0], bytes / 16, out); };
        const float one = time_one(read), dirty = time_one(read, WRITE);
        const float eight = time_one([&] {
            for (int c = 0; c < copies; ++c) stream_read<0><<<grid, THREADS>>>(bufs[c], bytes / 16, out);
        }) / copies;
        printf("%6zu keys, %6.1f MB: one launch %6.1f us (%.2f TB/s), after a write flush %6.1f us (%.2f TB/s), "
               "of eight back to back %6.1f us (%.2f TB/s)\n",
               keys, bytes / 1e6, one, bytes / one / 1e6, dirty, bytes / dirty / 1e6, eight, bytes / eight / 1e6);
    }
    CK(cudaGetLastError());
    return 0;
}
