// What a dependency between two launches costs under programmatic dependent launch, the way a
// decode step chains its kernels: 64 launches in one CUDA graph, each reading all of the 4,096
// floats the previous one wrote (every block, one round of float4 loads) and writing its share
// of the next 4,096. Three ways for a launch to wait for its predecessor's output:
//   wait     griddepcontrol.wait (what the engine's kernels do), then the release;
//   counter  each block of the predecessor adds one to a counter with release semantics after
//            its stores, and the first thread of each block polls it with acquire loads
//            (optionally backing off with __nanosleep) before the block reads;
//   none     no wait at all (wrong results; the time of the launches alone).
// Printed: µs per launch, the graph replayed 200 times, for grids of 128, 264 and 528 blocks.
// Standalone, for the GPU machine:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/dependency_chain \
//     scripts/gpu/dependency_chain.cu && /tmp/dependency_chain
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
// Any CUDA error ends the run with its call.
static void check(cudaError_t e, const char* call) {
    if (e != cudaSuccess) {
        fprintf(stderr, "%s: %s\n", call, cudaGetErrorString(e));
        exit(1);
    }
}
#define CHECK(x) check((x), #x)

enum Mode { WAIT = 0, COUNTER = 1, NONE = 2 };
constexpr int N = 4096, LAUNCHES = 64, REPLAYS = 200, THREADS = 256;

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

template <int MODE>
__global__ void __launch_bounds__(THREADS) link(const float* x, float* y, const unsigned* ready,
                                                unsigned* done, unsigned blocks, int backoff_ns) {
    if (MODE == WAIT) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
    } else if (MODE == COUNTER) {
        if (threadIdx.x == 0 && ready) {
            while (ld_acquire(ready) < blocks) {
                if (backoff_ns) __nanosleep(backoff_ns);
            }
        }
        __syncthreads();
    }
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    float4 v[N / (4 * THREADS)];
#pragma unroll
    for (int u = 0; u < N / (4 * THREADS); u++)
        v[u] = ((const float4*)x)[threadIdx.x + THREADS * u];
    float s = 0.f;
#pragma unroll
    for (int u = 0; u < N / (4 * THREADS); u++) s += v[u].x + v[u].y + v[u].z + v[u].w;
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    __shared__ float warp_sums[THREADS / 32];
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = s;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < THREADS / 32; w++) total += warp_sums[w];
    const int per = (N + gridDim.x - 1) / gridDim.x;
    for (int i = threadIdx.x; i < per; i += THREADS) {
        const int j = blockIdx.x * per + i;
        if (j < N) y[j] = total * 1e-9f + x[j] * 0.5f;
    }
    if (MODE == COUNTER) {
        __syncthreads();
        if (threadIdx.x == 0)
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(done) : "memory");
    }
}

// µs per launch of a graph of LAUNCHES dependent launches of `grid` blocks.
static float time_chain(cudaStream_t stream, float* buf, unsigned* counters, int mode, int grid,
                        int backoff_ns) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemsetAsync(counters, 0, sizeof(unsigned) * LAUNCHES, stream));
    for (int k = 0; k < LAUNCHES; k++) {
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = grid;
        cfg.blockDim = THREADS;
        cfg.stream = stream;
        cfg.attrs = attr;
        cfg.numAttrs = k > 0 ? 1 : 0;
        const float* x = buf + (k & 1) * N;
        float* y = buf + ((k + 1) & 1) * N;
        const unsigned* ready = k > 0 ? counters + k - 1 : nullptr;
        const unsigned blocks = grid;
        if (mode == WAIT) CHECK(cudaLaunchKernelEx(&cfg, link<WAIT>, x, y, ready, counters + k, blocks, backoff_ns));
        if (mode == COUNTER) CHECK(cudaLaunchKernelEx(&cfg, link<COUNTER>, x, y, ready, counters + k, blocks, backoff_ns));
        if (mode == NONE) CHECK(cudaLaunchKernelEx(&cfg, link<NONE>, x, y, ready, counters + k, blocks, backoff_ns));
    }
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 20; i++) CHECK(cudaGraphLaunch(exec, stream));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < REPLAYS; i++) CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    return ms * 1000.f / REPLAYS / LAUNCHES;
}

int main() {
    float* buf;
    unsigned* counters;
    CHECK(cudaMalloc(&buf, sizeof(float) * 2 * N));
    CHECK(cudaMalloc(&counters, sizeof(unsigned) * LAUNCHES));
    CHECK(cudaMemset(buf, 0, sizeof(float) * 2 * N));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("%s: µs per dependent launch\n", prop.name);
    printf("| blocks | wait | counter | counter, 64 ns back-off | none |\n|---|---|---|---|---|\n");
    for (int grid : {128, 264, 528}) {
        printf("| %d | %.3f | %.3f | %.3f | %.3f |\n", grid, time_chain(stream, buf, counters, WAIT, grid, 0),
               time_chain(stream, buf, counters, COUNTER, grid, 0),
               time_chain(stream, buf, counters, COUNTER, grid, 64),
               time_chain(stream, buf, counters, NONE, grid, 0));
    }
    return 0;
}
