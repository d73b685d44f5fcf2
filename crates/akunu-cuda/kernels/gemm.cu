// Prefill matrix products on tensor cores: Y[t][r] = sum_c W[r][c] * X[t][c] (+ bias[r]).
//
// Compiled once per weight type (-DQTYPE); the weights stay quantized in global memory.
//
// Plan:
// 1. gemm_prep_x converts X (f32, any row stride) once to a dense f16 scratch [m][K], each token
//    row divided by a power of two that keeps it inside f16's range (the factor, 1 for ordinary
//    activations, is kept per token and multiplied back in the epilogue).
// 2. gemm_m128 / gemm_m64 compute one block tile of BM tokens x 128 weight rows, stepping K by
//    64 (two 32-element groups). Per step and per stage, shared memory holds
//      X tile [BM][64] f16, filled with cp.async (16-byte chunks, zero-filled past m and K);
//      W tile [128][64] f16, dequantized by the block: thread t turns group (t & 1) of tile row
//      t >> 1 into f16 with quant.cuh's dequant32.
//    Both tiles are K-major with 128-byte rows whose 16-byte chunks are XOR-swizzled by
//    (row & 7), so cp.async, the dequant stores and ldmatrix are all free of bank conflicts.
//    Two stages: while the warps multiply stage s, the X chunks of step s+1 are in flight
//    (cp.async) and each thread's weights for step s+1 sit in registers, stored to the other
//    stage after the multiply; one __syncthreads per step.
//    8 warps as 2 (tokens) x 4 (weight rows); a warp owns (BM/2) tokens x 32 rows, i.e. BM/32
//    m16 tiles x 4 n8 tiles, and per k16 slice loads its fragments with ldmatrix.x4 and issues
//    mma.sync.m16n8k16 (f16 in, f32 accumulate) for every pair.
#include "common.cuh"
#include "mma.cuh"
#include "quant.cuh"

#define GEMM_THREADS 256
#define GEMM_BN 128
#define GEMM_BK 64
// Largest |x| kept unscaled: f16's largest finite value is 65504.
#define GEMM_X_LIMIT 16384.0f

// Byte offset of 16-byte chunk `c` (0..7) of row `r` in a K-major tile of 128-byte rows.
__device__ __forceinline__ u32 swz(int r, int c) { return (u32)(r * 128 + ((c ^ (r & 7)) << 4)); }

// One block of 256 threads per token row: pass 1 finds the row's largest magnitude, pass 2
// writes the row to xh as f16 (8 elements, one 16-byte store per thread and iteration) after
// dividing by the power of two xscale[t]. VEC: x is 16-byte aligned with a stride that is a
// multiple of 4, so each thread reads its 8 elements as two float4.
template <bool VEC>
__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
    if (VEC) {
        const float4 a = *(const float4*)p;
        const float4 b = *(const float4*)(p + 4);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = p[i];
    }
}

template <bool VEC>
__device__ __forceinline__ void prep_row(const float* x, long long x_stride, int k, u16* xh,
                                         float* xscale) {
    __shared__ float red[GEMM_THREADS / WARP];
    const int t = blockIdx.x;
    const float* row = x + (long long)t * x_stride;
    const int chunks = k / 8;
    float amax = 0.0f;
    for (int c = threadIdx.x; c < chunks; c += GEMM_THREADS) {
        float v[8];
        load8<VEC>(row + c * 8, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
    }
    amax = warp_max(amax);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
    __syncthreads();
    amax = red[0];
#pragma unroll
    for (int w = 1; w < GEMM_THREADS / WARP; ++w) amax = fmaxf(amax, red[w]);
    // Powers of two, so the division and the epilogue's multiplication are exact.
    float s = 1.0f, inv = 1.0f;
    while (amax > GEMM_X_LIMIT * s && s < 1.0e30f) {
        s *= 2.0f;
        inv *= 0.5f;
    }
    if (threadIdx.x == 0) xscale[t] = s;
    u16* out = xh + (long long)t * k;
    for (int c = threadIdx.x; c < chunks; c += GEMM_THREADS) {
        float v[8];
        load8<VEC>(row + c * 8, v);
        uint4 h;
        h.x = pack_f16x2(v[0] * inv, v[1] * inv);
        h.y = pack_f16x2(v[2] * inv, v[3] * inv);
        h.z = pack_f16x2(v[4] * inv, v[5] * inv);
        h.w = pack_f16x2(v[6] * inv, v[7] * inv);
        *(uint4*)(out + c * 8) = h;
    }
}

// Grid: one block per token row (gridDim.x = m), 256 threads. k is a multiple of 32.
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    gemm_prep_x(const float* x, long long x_stride, int k, int vec, u16* xh, float* xscale) {
    pdl_begin();
    if (vec)
        prep_row<true>(x, x_stride, k, xh, xscale);
    else
        prep_row<false>(x, x_stride, k, xh, xscale);
}

// Grid: (ceil(m / BM), ceil(rows / 128)); block: 256 threads; dynamic shared memory
// 2 * (BM + 128) * 128 bytes. MT = m16 tiles per warp, BM = 32 * MT tokens per block.
template <int MT>
__device__ __forceinline__ void gemm_tile(const u8* data, const u8* aux, int rows, int cols,
                                          const u16* xh, const float* xscale, int m, float* y,
                                          long long y_stride, const float* bias) {
    constexpr int BM = 32 * MT;
    constexpr u32 X_BYTES = BM * 128;
    constexpr u32 STAGE = X_BYTES + GEMM_BN * 128;
    extern __shared__ __align__(128) u8 smem[];
    const u32 base = smem_addr(smem);

    const QMatrix q = {data, aux, rows, cols};
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * GEMM_BN;
    const int k = cols, groups = cols / 32, steps = (cols + GEMM_BK - 1) / GEMM_BK;

    // This thread's dequantization job: group (2 * step + dg) of weight row n0 + dr.
    const int dr = tid >> 1, dg = tid & 1, wrow = n0 + dr;
    float w[32];

    // Branch-free, so the compiler can overlap the loads with the previous step's multiply:
    // rows past the matrix and groups past K dequantize a valid group and are zeroed.
    auto fetch_w = [&](int step) {
        const int g = step * 2 + dg;
        const bool ok = wrow < rows && g < groups;
        dequant32(q, min(wrow, rows - 1), min(g, groups - 1), w);
#pragma unroll
        for (int i = 0; i < 32; ++i) w[i] = ok ? w[i] : 0.0f;
    };
    auto store_w = [&](int stage) {
        const u32 dst = base + stage * STAGE + X_BYTES;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 a = pack_f16x2(w[8 * j + 0], w[8 * j + 1]);
            const u32 b = pack_f16x2(w[8 * j + 2], w[8 * j + 3]);
            const u32 c = pack_f16x2(w[8 * j + 4], w[8 * j + 5]);
            const u32 d = pack_f16x2(w[8 * j + 6], w[8 * j + 7]);
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst + swz(dr, dg * 4 + j)),
                         "r"(a), "r"(b), "r"(c), "r"(d)
                         : "memory");
        }
    };
    // BM rows x 8 chunks of X per step: MT chunks per thread; 8 consecutive threads copy one
    // token's 128 contiguous bytes.
    auto fetch_x = [&](int step, int stage) {
        const u32 dst = base + stage * STAGE;
#pragma unroll
        for (int i = 0; i < MT; ++i) {
            const int c = tid + i * GEMM_THREADS;
            const int r = c >> 3, ch = c & 7;
            const int t = m0 + r, kk = step * GEMM_BK + ch * 8;
            const bool ok = t < m && kk < k;
            const u16* src = ok ? xh + (long long)t * k + kk : xh;
            cp_async16(dst + swz(r, ch), src, ok ? 16 : 0);
        }
        cp_async_commit();
    };

    float acc[MT][4][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    // ldmatrix rows: A (tokens) lanes 0-15 rows 0-15 at k chunk 0, lanes 16-31 at chunk 1;
    // B (weight rows) matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
    const int wm = warp >> 2, wn = warp & 3;
    const int arow = wm * (16 * MT) + (lane & 15), achunk = lane >> 4;
    const int brow = wn * 32 + (lane & 7) + ((lane >> 4) << 3), bchunk = (lane >> 3) & 1;

    fetch_x(0, 0);
    fetch_w(0);
    store_w(0);
    cp_async_wait_all();
    __syncthreads();

    for (int step = 0; step < steps; ++step) {
        const int stage = step & 1;
        // After the last step these fetch a step past K: zeros into the unused stage.
        fetch_x(step + 1, stage ^ 1);
        fetch_w(step + 1);
        const u32 xs = base + stage * STAGE, ws = xs + X_BYTES;
#pragma unroll
        for (int ks = 0; ks < GEMM_BK / 16; ++ks) {
            u32 a[MT][4], b[2][4];
#pragma unroll
            for (int i = 0; i < MT; ++i) ldsm_x4(a[i], xs + swz(arow + 16 * i, 2 * ks + achunk));
#pragma unroll
            for (int p = 0; p < 2; ++p) ldsm_x4(b[p], ws + swz(brow + 16 * p, 2 * ks + bchunk));
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    mma_16816(acc[i][j], a[i], b[j >> 1][(j & 1) * 2], b[j >> 1][(j & 1) * 2 + 1]);
        }
        store_w(stage ^ 1);
        cp_async_wait_all();
        __syncthreads();
    }

    // acc[i][j] holds tokens (lane >> 2) and (lane >> 2) + 8 of m16 tile i, weight rows
    // 2 * (lane & 3) and +1 of n8 tile j: stored as one float2 where Y's layout allows.
    const bool pairs = (((size_t)y | ((size_t)y_stride * 4)) & 7) == 0;
#pragma unroll
    for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int t = m0 + wm * (16 * MT) + 16 * i + (lane >> 2) + 8 * h;
            if (t >= m) continue;
            const float s = xscale[t];
            float* yrow = y + (long long)t * y_stride;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int r = n0 + wn * 32 + 8 * j + 2 * (lane & 3);
                float v0 = acc[i][j][2 * h] * s, v1 = acc[i][j][2 * h + 1] * s;
                if (bias) {
                    if (r < rows) v0 += bias[r];
                    if (r + 1 < rows) v1 += bias[r + 1];
                }
                if (pairs && r + 1 < rows) {
                    float2 p;
                    p.x = v0;
                    p.y = v1;
                    *(float2*)(yrow + r) = p;
                } else {
                    if (r < rows) yrow[r] = v0;
                    if (r + 1 < rows) yrow[r + 1] = v1;
                }
            }
        }
    }
}

#define GEMM_PARAMS                                                                            \
    const u8 *data, const u8 *aux, int rows, int cols, const u16 *xh, const float *xscale,     \
        int m, float *y, long long y_stride, const float *bias
#define GEMM_ARGS data, aux, rows, cols, xh, xscale, m, y, y_stride, bias

// Launch bounds: one 128-token block per SM may use up to 255 registers, which lets the
// compiler issue the next step's weight loads at the top of the step and decode them after the
// multiply; the 64-token kernel fits two blocks per SM in 128 registers with the same schedule.
extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1) gemm_m128(GEMM_PARAMS) {
    pdl_begin();
    gemm_tile<4>(GEMM_ARGS);
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 2) gemm_m64(GEMM_PARAMS) {
    pdl_begin();
    gemm_tile<2>(GEMM_ARGS);
}
