// Would one launch for a decode layer's q·k·v product and its attention save the layer a
// dependency? The front of a layer as the engine chains it at short context (tg128), against the
// same work in one launch of thread block clusters, each launch under dependent launch in one
// CUDA graph:
//   apart  the q·k·v product (a block per 1/CS of a KV head's rows: weights requested before
//          griddepcontrol.wait, the input after it), then attention (a block per KV head: its
//          cached keys requested before the wait, the head's q, k and v rows after it), the
//          next layer's product waiting on attention's output;
//   fused  a cluster of CS blocks per KV head: the same product rows, sent to the first block's
//          shared memory (distributed shared memory), one cluster barrier, then the first block
//          attends as above. One launch and no global round trip between the two. Its blocks
//          either take the shared memory they need (the scheduler may then pack a cluster onto
//          a few SMs) or over half an SM's ("a block an SM").
// Weights are Q4_0 (ggml's block: 32 values as 16 nibble bytes, low nibbles first, and an f16
// scale; nibbles and scales kept apart here so each lane reads 16 bytes), the input f32, the
// K/V cache f16. Every layer has its own weights and cache: 32 layers take more than L2.
// Printed: the largest active cluster count, the two outputs against a CPU f64 reference, and µs
// per layer over the graph's replays, with and without dependent launch (cached keys -1: every
// launch returns at once), for llama3.2-1b's shapes (2048 in, 8 KV heads of 64, GQA 4) and
// qwen3-0.6b's (1024 in, 8 KV heads of 128, GQA 2).
// Standalone, for the GPU machine:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/fused_front \
//     scripts/gpu/fused_front.cu && /tmp/fused_front
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cmath>
#include <string>
#include <vector>
#include "stream_read.cuh"

namespace cg = cooperative_groups;

static std::string table;  // the timing rows, printed last

constexpr int KVH = 8, BLOCK = 256, WARPS = BLOCK / 32, LAYERS = 32, REPLAYS = 100, MAX_KEYS = 128;

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_release() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ void cp_async16(void* smem, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(smem)), "l"(src)
                 : "memory");
}

// One layer's tensors: q·k·v weights (head h's R rows at h * R: GQA query heads, then k, then v),
// the K and V caches ([head][position][dim] f16, room for the new key at `keys`).
struct Layer {
    const uint4* nib;
    const __half* scale;
    __half* k_cache;
    __half* v_cache;
};

template <int IN, int HD, int GQA, int CS_>
struct Shape {
    static constexpr int CS = CS_;            // blocks a KV head's rows
    static constexpr int R = (GQA + 2) * HD;  // a KV head's rows
    static constexpr int RB = R / CS_;        // a block's rows
    static constexpr int RW = RB / WARPS;     // a warp's rows
    static constexpr int C = IN / 32;         // Q4_0 blocks a row
    static constexpr int CL = C / 32;         // a lane's
    static_assert(RB % WARPS == 0 && C % 32 == 0 && GQA * HD == BLOCK, "shape");
    // Shared memory: the input (padded), the head's rows, the scores, then the cached K and V
    // (the product alone: the input).
    static constexpr int SCORES = (GQA * (MAX_KEYS + 1) + 3) / 4 * 4;  // floats, so K and V stay 16-byte aligned
    static constexpr int XS = IN / 32 * 33;  // the padded input's floats
    static constexpr size_t SMEM = (XS + R + SCORES) * 4 + 2 * MAX_KEYS * HD * 2;
    static constexpr size_t PRODUCT_SMEM = XS * 4;
    // Fused blocks asking for over half an SM's shared memory have an SM each: the cluster
    // scheduler may otherwise pack a cluster's blocks onto a few SMs of its GPC.
    static constexpr size_t ALONE_SMEM = SMEM > 116 * 1024 ? SMEM : 116 * 1024;
};

// The block's weights, requested before the dependency wait.
template <class S>
struct Rows {
    uint4 w[S::RW][S::CL];
    __half s[S::RW][S::CL];
    __device__ __forceinline__ void load(const Layer& L, int h, int j, int warp, int lane) {
#pragma unroll
        for (int r = 0; r < S::RW; ++r) {
            const size_t row = (size_t)h * S::R + j * S::RB + warp * S::RW + r;
#pragma unroll
            for (int c = 0; c < S::CL; ++c) {
                w[r][c] = __ldg(L.nib + row * S::C + lane + 32 * c);
                s[r][c] = L.scale[row * S::C + lane + 32 * c];
            }
        }
    }
    // Row r's dot with x (shared memory), the whole warp's sum.
    __device__ __forceinline__ float dot(int r, const float* x, int lane) const {
        float acc = 0.f;
#pragma unroll
        for (int c = 0; c < S::CL; ++c) {
            const float* xb = x + (lane + 32 * c) * 33;
            const unsigned q[4] = {w[r][c].x, w[r][c].y, w[r][c].z, w[r][c].w};
            float part = 0.f;
#pragma unroll
            for (int b = 0; b < 16; ++b) {
                const unsigned byte = (q[b / 4] >> (8 * (b % 4))) & 0xffu;
                part += (float)((int)(byte & 15u) - 8) * xb[b] + (float)((int)(byte >> 4) - 8) * xb[b + 16];
            }
            acc += part * __half2float(s[r][c]);
        }
        return warp_sum(acc);
    }
};

// The layer's input (the previous attention's first IN outputs) into shared memory, a float of
// padding after every 32 so that the lanes' Q4_0 blocks (32 values apart) fall in distinct banks.
template <int IN>
__device__ __forceinline__ void input_to_smem(const float* x_in, float* x) {
    for (int i = threadIdx.x; i < IN; i += BLOCK) x[i + i / 32] = x_in[i];
    __syncthreads();
}

// Head h's cached keys and values [0, keys) into shared memory, 16 bytes a copy.
template <int HD>
__device__ __forceinline__ void cache_to_smem(const Layer& L, int h, int keys, __half* kc, __half* vc) {
    const size_t at = (size_t)h * (MAX_KEYS + 1) * HD;
    for (int i = threadIdx.x; i < keys * HD / 8; i += BLOCK) {
        cp_async16(kc + i * 8, L.k_cache + at + i * 8);
        cp_async16(vc + i * 8, L.v_cache + at + i * 8);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// Attention of head h's GQA query rows over its `keys` cached keys and the new one (in qkv, R
// floats: queries, key, value), output rows to out; the new key and value stored in the cache.
template <int HD, int GQA>
__device__ void attend(const Layer& L, int h, int keys, const float* qkv, const __half* kc, const __half* vc,
                       float* scores, float* out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n = keys + 1;
    const float* kn = qkv + GQA * HD;
    const float* vn = kn + HD;
    if (threadIdx.x < HD) {
        const size_t at = ((size_t)h * (MAX_KEYS + 1) + keys) * HD + threadIdx.x;
        L.k_cache[at] = __float2half(kn[threadIdx.x]);
        L.v_cache[at] = __float2half(vn[threadIdx.x]);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    const float scale = rsqrtf((float)HD);
    for (int key = warp; key < n; key += WARPS)
#pragma unroll
        for (int g = 0; g < GQA; ++g) {
            float s = 0.f;
            for (int d = lane; d < HD; d += 32)
                s += qkv[g * HD + d] * (key < keys ? __half2float(kc[key * HD + d]) : kn[d]);
            s = warp_sum(s);
            if (lane == 0) scores[g * (MAX_KEYS + 1) + key] = s * scale;
        }
    __syncthreads();
    if (warp < GQA) {
        float* sg = scores + warp * (MAX_KEYS + 1);
        float mx = -INFINITY;
        for (int key = lane; key < n; key += 32) mx = fmaxf(mx, sg[key]);
        for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float l = 0.f;
        for (int key = lane; key < n; key += 32) {
            const float p = __expf(sg[key] - mx);
            sg[key] = p;
            l += p;
        }
        l = warp_sum(l);
        for (int key = lane; key < n; key += 32) sg[key] /= l;
    }
    __syncthreads();
    const int g = threadIdx.x / HD, d = threadIdx.x % HD;
    const float* pg = scores + g * (MAX_KEYS + 1);
    float o = pg[keys] * vn[d];
    for (int key = 0; key < keys; ++key) o += pg[key] * __half2float(vc[key * HD + d]);
    out[h * GQA * HD + threadIdx.x] = o;
}

template <class S>
__global__ void __launch_bounds__(BLOCK) product(Layer L, int keys, const float* x_in, float* qkv_out) {
    if (keys < 0) return;  // launches alone
    extern __shared__ float smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, h = blockIdx.x / S::CS, j = blockIdx.x % S::CS;
    Rows<S> rows;
    rows.load(L, h, j, warp, lane);
    pdl_wait();
    pdl_release();
    input_to_smem<S::C * 32>(x_in, smem);
#pragma unroll
    for (int r = 0; r < S::RW; ++r) {
        const float v = rows.dot(r, smem, lane);
        if (lane == 0) qkv_out[h * S::R + j * S::RB + warp * S::RW + r] = v;
    }
}

// The attending block's shared memory past the input: its head's rows, scores, K and V.
template <class S, int HD, int GQA>
struct HeadSmem {
    float *qkv, *scores;
    __half *kc, *vc;
    __device__ __forceinline__ explicit HeadSmem(float* smem)
        : qkv(smem + S::XS), scores(qkv + S::R), kc((__half*)(scores + S::SCORES)), vc(kc + MAX_KEYS * HD) {}
};

template <class S, int HD, int GQA>
__global__ void __launch_bounds__(BLOCK) attention(Layer L, int keys, const float* qkv_in, float* out) {
    if (keys < 0) return;
    extern __shared__ float smem[];
    const HeadSmem<S, HD, GQA> m(smem);
    const int h = blockIdx.x;
    cache_to_smem<HD>(L, h, keys, m.kc, m.vc);
    pdl_wait();
    pdl_release();
    for (int i = threadIdx.x; i < S::R; i += BLOCK) m.qkv[i] = qkv_in[h * S::R + i];
    attend<HD, GQA>(L, h, keys, m.qkv, m.kc, m.vc, m.scores, out);
}

template <class S, int HD, int GQA>
__global__ void __launch_bounds__(BLOCK) fused(Layer L, int keys, const float* x_in, float* out) {
    if (keys < 0) return;
    extern __shared__ float smem[];
    const HeadSmem<S, HD, GQA> m(smem);
    cg::cluster_group cluster = cg::this_cluster();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, j = (int)cluster.block_rank(), h = blockIdx.x / S::CS;
    Rows<S> rows;
    rows.load(L, h, j, warp, lane);
    if (j == 0) cache_to_smem<HD>(L, h, keys, m.kc, m.vc);
    pdl_wait();
    pdl_release();
    input_to_smem<S::C * 32>(x_in, smem);
    // No cluster barrier before these remote stores, which the CUDA Programming Guide asks for
    // (every block of the cluster started): the fused times measured without it are a lower
    // bound.
    float* lead = cluster.map_shared_rank(m.qkv, 0);
#pragma unroll
    for (int r = 0; r < S::RW; ++r) {
        const float v = rows.dot(r, smem, lane);
        if (lane == 0) lead[j * S::RB + warp * S::RW + r] = v;
    }
    cluster.sync();
    if (j == 0) attend<HD, GQA>(L, h, keys, m.qkv, m.kc, m.vc, m.scores, out);
}

// Random bits: a hash of the index.
__global__ void fill_random(unsigned* p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned x = (unsigned)i * 2654435761u ^ seed;
        x ^= x >> 15;
        x *= 2246822519u;
        x ^= x >> 13;
        p[i] = x;
    }
}
// f16 values in [lo, hi) from random bits.
__global__ void to_half(__half* p, size_t n, float lo, float hi) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const unsigned short b = ((const unsigned short*)p)[i];
        p[i] = __float2half(lo + (hi - lo) * (b / 65536.f));
    }
}

template <int IN, int HD, int GQA, int CS>
void run(const char* name, bool alone, cudaStream_t stream) {
    using S = Shape<IN, HD, GQA, CS>;
    constexpr int BLOCKS = KVH * CS, OUT = KVH * GQA * HD;
    static_assert(OUT >= IN, "the next layer reads the first IN outputs");
    const size_t rows = (size_t)KVH * S::R, nib_n = rows * S::C, cache_n = (size_t)KVH * (MAX_KEYS + 1) * HD;
    std::vector<Layer> layers(LAYERS);
    for (int l = 0; l < LAYERS; ++l) {
        uint4* nib;
        __half *scale, *kc, *vc;
        CK(cudaMalloc(&nib, nib_n * 16));
        CK(cudaMalloc(&scale, nib_n * 2));
        CK(cudaMalloc(&kc, cache_n * 2));
        CK(cudaMalloc(&vc, cache_n * 2));
        fill_random<<<256, 256>>>((unsigned*)nib, nib_n * 4, 11 + l);
        fill_random<<<256, 256>>>((unsigned*)scale, nib_n / 2, 101 + l);
        to_half<<<256, 256>>>(scale, nib_n, 0.5f / sqrtf((float)IN), 1.f / sqrtf((float)IN));
        fill_random<<<256, 256>>>((unsigned*)kc, cache_n / 2, 1001 + l);
        fill_random<<<256, 256>>>((unsigned*)vc, cache_n / 2, 2001 + l);
        to_half<<<256, 256>>>(kc, cache_n, -1.f, 1.f);
        to_half<<<256, 256>>>(vc, cache_n, -1.f, 1.f);
        layers[l] = Layer{nib, scale, kc, vc};
    }
    float *x, *qkv, *outs;
    CK(cudaMalloc(&x, OUT * 4));
    CK(cudaMalloc(&qkv, rows * 4));
    CK(cudaMalloc(&outs, 2 * OUT * 4));
    std::vector<float> hx(OUT);
    for (int i = 0; i < OUT; ++i) hx[i] = sinf(0.37f * i + 1.f);
    CK(cudaMemcpy(x, hx.data(), OUT * 4, cudaMemcpyHostToDevice));
    auto* prod = product<S>;
    auto* att = attention<S, HD, GQA>;
    auto* fus = fused<S, HD, GQA>;
    CK(cudaFuncSetAttribute(prod, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)S::SMEM));
    CK(cudaFuncSetAttribute(att, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)S::SMEM));
    CK(cudaFuncSetAttribute(fus, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)S::ALONE_SMEM));
    const size_t fused_smem = alone ? S::ALONE_SMEM : S::SMEM;
    if (CS > 8) CK(cudaFuncSetAttribute(fus, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));

    auto launch = [&](auto kernel, size_t smem, int grid, int cluster, bool dependent, auto... args) {
        cudaLaunchAttribute attr[2];
        int n = 0;
        if (dependent) {
            attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr[n++].val.programmaticStreamSerializationAllowed = 1;
        }
        if (cluster > 1) {
            attr[n].id = cudaLaunchAttributeClusterDimension;
            attr[n++].val.clusterDim = {(unsigned)cluster, 1, 1};
        }
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = grid;
        cfg.blockDim = BLOCK;
        cfg.dynamicSmemBytes = smem;
        cfg.stream = stream;
        cfg.attrs = attr;
        cfg.numAttrs = n;
        CK(cudaLaunchKernelEx(&cfg, kernel, args...));
    };
    {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = BLOCKS;
        cfg.blockDim = BLOCK;
        cfg.dynamicSmemBytes = fused_smem;
        cudaLaunchAttribute attr;
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim = {(unsigned)CS, 1, 1};
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        int clusters = 0;
        CK(cudaOccupancyMaxActiveClusters(&clusters, fus, &cfg));
        printf("%s, clusters of %d%s: at most %d active (%d needed), %zu B shared a block\n", name, CS,
               alone ? ", a block an SM" : "", clusters, KVH, fused_smem);
        if (clusters < KVH) return;
    }
    // One layer each way on layer 0's tensors and x, against the CPU.
    const int check_keys = 100;
    float* outs2 = outs + OUT;
    launch(prod, S::PRODUCT_SMEM, BLOCKS, 1, false, layers[0], check_keys, (const float*)x, qkv);
    launch(att, S::SMEM, KVH, 1, false, layers[0], check_keys, (const float*)qkv, outs);
    launch(fus, fused_smem, BLOCKS, CS, false, layers[0], check_keys, (const float*)x, outs2);
    CK(cudaStreamSynchronize(stream));
    std::vector<float> apart(OUT), one(OUT);
    CK(cudaMemcpy(apart.data(), outs, OUT * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(one.data(), outs2, OUT * 4, cudaMemcpyDeviceToHost));
    std::vector<unsigned char> nib(nib_n * 16);
    std::vector<__half> scale(nib_n), kc(cache_n), vc(cache_n);
    CK(cudaMemcpy(nib.data(), layers[0].nib, nib_n * 16, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(scale.data(), layers[0].scale, nib_n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(kc.data(), layers[0].k_cache, cache_n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(vc.data(), layers[0].v_cache, cache_n * 2, cudaMemcpyDeviceToHost));
    double err_apart = 0, err_one = 0, mag = 0;
    for (int h = 0; h < KVH; ++h) {
        std::vector<double> r(S::R);
        for (int i = 0; i < S::R; ++i) {
            const size_t row = (size_t)h * S::R + i;
            double acc = 0;
            for (int c = 0; c < S::C; ++c) {
                const unsigned char* b = nib.data() + (row * S::C + c) * 16;
                double part = 0;
                for (int e = 0; e < 16; ++e)
                    part += ((b[e] & 15) - 8) * (double)hx[c * 32 + e] + ((b[e] >> 4) - 8) * (double)hx[c * 32 + e + 16];
                acc += part * (double)__half2float(scale[row * S::C + c]);
            }
            r[i] = acc;
        }
        const double* kn = r.data() + GQA * HD;
        const double* vn = kn + HD;
        const size_t at = (size_t)h * (MAX_KEYS + 1) * HD;
        for (int g = 0; g < GQA; ++g) {
            std::vector<double> p(check_keys + 1);
            double mx = -INFINITY, l = 0;
            for (int key = 0; key <= check_keys; ++key) {
                double s = 0;
                for (int d = 0; d < HD; ++d)
                    s += r[g * HD + d] * (key < check_keys ? (double)__half2float(kc[at + key * HD + d]) : kn[d]);
                p[key] = s / std::sqrt((double)HD);
                mx = std::fmax(mx, p[key]);
            }
            for (auto& e : p) l += (e = std::exp(e - mx));
            for (int d = 0; d < HD; ++d) {
                double o = p[check_keys] * vn[d];
                for (int key = 0; key < check_keys; ++key) o += p[key] * (double)__half2float(vc[at + key * HD + d]);
                o /= l;
                const int i = h * GQA * HD + g * HD + d;
                err_apart = std::fmax(err_apart, std::fabs(apart[i] - o));
                err_one = std::fmax(err_one, std::fabs(one[i] - o));
                mag = std::fmax(mag, std::fabs(o));
            }
        }
    }
    printf("  one layer at %d keys against f64: apart %.2e, fused %.2e (largest output %.3f)\n", check_keys, err_apart,
           err_one, mag);

    // µs a layer: LAYERS layers a graph, each reading the previous layer's output.
    auto time_graph = [&](bool one_launch, int keys, bool dependent) {
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        for (int l = 0; l < LAYERS; ++l) {
            const float* in = outs + ((l + 1) & 1) * OUT;
            float* out = outs + (l & 1) * OUT;
            if (one_launch) {
                launch(fus, fused_smem, BLOCKS, CS, dependent && l > 0, layers[l], keys, in, out);
            } else {
                launch(prod, S::PRODUCT_SMEM, BLOCKS, 1, dependent && l > 0, layers[l], keys, in, qkv);
                launch(att, S::SMEM, KVH, 1, dependent, layers[l], keys, (const float*)qkv, out);
            }
        }
        CK(cudaStreamEndCapture(stream, &graph));
        CK(cudaGraphInstantiate(&exec, graph, 0));
        for (int i = 0; i < 10; ++i) CK(cudaGraphLaunch(exec, stream));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        CK(cudaEventRecord(e0, stream));
        for (int i = 0; i < REPLAYS; ++i) CK(cudaGraphLaunch(exec, stream));
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
        return ms * 1000.f / REPLAYS / LAYERS;
    };
    for (int keys : {-1, 0, 128}) {
        const float apart_us = time_graph(false, keys, true), one_us = time_graph(true, keys, true);
        char line[200];
        snprintf(line, sizeof line, "| %s | %d%s | %d | %.2f | %.2f | %.2f | %.2f | %.2f |\n", name, CS,
                 alone ? ", a block an SM" : "", keys, apart_us,
                 one_us, apart_us - one_us, time_graph(false, keys, false), time_graph(true, keys, false));
        table += line;
    }
    for (auto& L : layers) {
        CK(cudaFree((void*)L.nib));
        CK(cudaFree((void*)L.scale));
        CK(cudaFree(L.k_cache));
        CK(cudaFree(L.v_cache));
    }
    CK(cudaFree(x));
    CK(cudaFree(qkv));
    CK(cudaFree(outs));
}

int main() {
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const cudaDeviceProp prop = device_props();
    printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
    run<2048, 64, 4, 16>("llama3.2-1b", false, stream);
    run<2048, 64, 4, 8>("llama3.2-1b", false, stream);
    run<2048, 64, 4, 8>("llama3.2-1b", true, stream);
    run<1024, 128, 2, 16>("qwen3-0.6b", false, stream);
    run<1024, 128, 2, 8>("qwen3-0.6b", false, stream);
    run<1024, 128, 2, 8>("qwen3-0.6b", true, stream);
    CK(cudaGetLastError());
    printf("\n| shapes | cluster | cached keys | apart µs a layer | fused | saved | apart, no dependent launch | fused, "
           "none |\n|---|---|---|---|---|---|---|---|\n%s",
           table.c_str());
    return 0;
}
