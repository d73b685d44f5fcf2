// Element-wise ops on f32 activations: gated activations (SiLU, GELU-tanh), soft-capping, the
// residual add and the gather of output rows. Grid-stride loops use 16-byte accesses when every
// pointer is 16-byte aligned, with a scalar tail.
#include "common.cuh"

struct Silu {
    __device__ __forceinline__ float operator()(float g, float u) const {
        return g / (1.f + __expf(-g)) * u;
    }
};

// GELU, tanh approximation, as x * sigmoid(2u) (the CPU backend's form of the same function).
struct Gelu {
    __device__ __forceinline__ float operator()(float g, float u) const {
        const float k = 0.7978845608f * g * (1.f + 0.044715f * g * g);
        return g / (1.f + __expf(-2.f * k)) * u;
    }
};

struct Add {
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

struct SoftCap {
    float cap;
    __device__ __forceinline__ float operator()(float x, float) const {
        return tanh_accurate(x / cap) * cap;
    }
};

// a[i] = f(a[i], b[i]) for i < n; b may be a (unary ops pass a twice).
template <class F>
__device__ __forceinline__ void map2(float* a, const float* b, u64 n, F f) {
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 step = (u64)gridDim.x * blockDim.x;
    u64 done = 0;
    if (((reinterpret_cast<u64>(a) | reinterpret_cast<u64>(b)) & 15) == 0) {
        float4* a4 = reinterpret_cast<float4*>(a);
        const float4* b4 = reinterpret_cast<const float4*>(b);
        const u64 n4 = n / 4;
        for (u64 i = tid; i < n4; i += step) {
            float4 x = a4[i];
            const float4 y = b4[i];
            x.x = f(x.x, y.x);
            x.y = f(x.y, y.y);
            x.z = f(x.z, y.z);
            x.w = f(x.w, y.w);
            a4[i] = x;
        }
        done = n4 * 4;
    }
    for (u64 i = done + tid; i < n; i += step) a[i] = f(a[i], b[i]);
}

// gate = silu(gate) * up. Work split: grid-stride over the n elements (4 per thread-step).
extern "C" __global__ void gated_silu(float* gate, const float* up, u64 n) {
    pdl_begin();
    map2(gate, up, n, Silu());
}

// gate = gelu_tanh(gate) * up. Work split: grid-stride over the n elements.
extern "C" __global__ void gated_gelu(float* gate, const float* up, u64 n) {
    pdl_begin();
    map2(gate, up, n, Gelu());
}

// dst += src. Work split: grid-stride over the n elements.
extern "C" __global__ void add_inplace(float* dst, const float* src, u64 n) {
    pdl_begin();
    map2(dst, src, n, Add());
}

// x = tanh(x / cap) * cap. Work split: grid-stride over the n elements.
extern "C" __global__ void softcap(float* x, u64 n, float cap) {
    pdl_begin();
    SoftCap f;
    f.cap = cap;
    map2(x, x, n, f);
}

// dst[r] = src[rows[r]] for r < n_rows, rows of `width` floats (indices checked by the caller).
// Work split: one block per output row (grid.x = n_rows), threads stride the row.
extern "C" __global__ void gather_rows(const float* src, float* dst, const u32* rows, u32 n_rows,
                                       u32 width) {
    pdl_begin();
    const u32 r = blockIdx.x;
    if (r >= n_rows) return;
    float* out = dst + (u64)r * width;
    const float* in = src + (u64)rows[r] * width;
    u32 done = 0;
    if ((width & 3) == 0 && ((reinterpret_cast<u64>(src) | reinterpret_cast<u64>(dst)) & 15) == 0) {
        const float4* in4 = reinterpret_cast<const float4*>(in);
        float4* out4 = reinterpret_cast<float4*>(out);
        for (u32 i = threadIdx.x; i < width / 4; i += blockDim.x) out4[i] = in4[i];
        done = width;
    }
    for (u32 i = done + threadIdx.x; i < width; i += blockDim.x) out[i] = in[i];
}
