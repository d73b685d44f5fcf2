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
//      t >> 1 into f16 (WGroup below: loaded at the top of a step, converted after its multiply).
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

// Packed f16x2 arithmetic, each result rounded once (.rn: never contracted into an fma).
__device__ __forceinline__ u32 hsub2(u32 a, u32 b) {
    u32 r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
    u32 r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
    u32 r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
__device__ __forceinline__ u32 splat_f16(float v) { return pack_f16x2(v, v); }

// f16 1024 + v in each half, for v < 1024 in bits 0..9 of each half of `v2`: the integer part
// of an f16 in [1024, 2048) is its mantissa, so this is a conversion without the (quarter-rate)
// conversion unit. Subtracting 1024 + offset afterwards is exact.
#define F16_1024 0x64006400u
__device__ __forceinline__ u32 magic_f16(u32 v2) { return v2 | F16_1024; }
// Bytes 0 and 1 (lo = true) or 2 and 3 of w in the low byte of each half.
__device__ __forceinline__ u32 byte_pair(u32 w, bool lo) {
    return __byte_perm(w, 0u, lo ? 0x4140u : 0x4342u);
}

// One thread's weight group per step (32 elements of one row): `load` issues the global loads
// (zeroing the scales of a group past the matrix, so it converts to zeros), `to_f16` turns the
// group into 16 packed f16 pairs (elements 2i and 2i + 1 in h[i]) after the step's multiply.
// The common types convert with f16x2 arithmetic (magic_f16) into exactly-rounded products of
// the f16-rounded block scale; the others go through quant.cuh's f32 dequant32.
#if QTYPE == GGML_Q4_0 || QTYPE == GGML_Q4_1
struct WGroup {
    uint4 q;
    float d, m;
    __device__ __forceinline__ void load(const QMatrix& mat, int row, int g, bool ok) {
        const size_t i = qblock(mat, row, g);
        q = __ldg((const uint4*)(mat.data + i * QB));
#if QTYPE == GGML_Q4_1
        const u32 dm = __ldg((const u32*)(mat.aux + i * AB));
        d = f16_to_f32((u16)(dm & 0xFFFFu));
        m = f16_to_f32((u16)(dm >> 16));
#else
        d = f16_to_f32(__ldg((const u16*)(mat.aux + i * AB)));
        m = 0.0f;
#endif
        d = ok ? d : 0.0f;
        m = ok ? m : 0.0f;
    }
    // Elements 0..15 are the low nibbles of bytes 0..15, elements 16..31 the high nibbles.
    __device__ __forceinline__ void to_f16(u32 (&h)[16]) const {
        const u32 w[4] = {q.x, q.y, q.z, q.w};
        const u32 d2 = splat_f16(d);
#if QTYPE == GGML_Q4_1
        const u32 m2 = splat_f16(m), zero = F16_1024;
#else
        const u32 zero = 0x64086408u;  // 1024 + 8: Q4_0's offset
#endif
#pragma unroll
        for (int k = 0; k < 4; k++) {
#pragma unroll
            for (int p = 0; p < 2; p++) {
                const u32 b = byte_pair(w[k], p == 0);
                const u32 lo = hsub2(magic_f16(b & 0x000F000Fu), zero);
                const u32 hi = hsub2(magic_f16((b >> 4) & 0x000F000Fu), zero);
#if QTYPE == GGML_Q4_1
                h[2 * k + p] = hfma2(lo, d2, m2);
                h[8 + 2 * k + p] = hfma2(hi, d2, m2);
#else
                h[2 * k + p] = hmul2(lo, d2);
                h[8 + 2 * k + p] = hmul2(hi, d2);
#endif
            }
        }
    }
};
#elif QTYPE == GGML_Q8_0
struct WGroup {
    uint4 q0, q1;
    float d;
    __device__ __forceinline__ void load(const QMatrix& mat, int row, int g, bool ok) {
        const size_t i = qblock(mat, row, g);
        q0 = __ldg((const uint4*)(mat.data + i * QB));
        q1 = __ldg((const uint4*)(mat.data + i * QB) + 1);
        d = f16_to_f32(__ldg((const u16*)(mat.aux + i * AB)));
        d = ok ? d : 0.0f;
    }
    // A signed byte with its sign bit flipped is q + 128 in 0..255.
    __device__ __forceinline__ void to_f16(u32 (&h)[16]) const {
        const u32 w[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
        const u32 d2 = splat_f16(d);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const u32 u = w[k] ^ 0x80808080u;
#pragma unroll
            for (int p = 0; p < 2; p++)
                h[2 * k + p] = hmul2(hsub2(magic_f16(byte_pair(u, p == 0)), 0x64806480u), d2);
        }
    }
};
#elif QTYPE == GGML_Q4_K
struct WGroup {
    uint4 q0, q1;
    float dl, ml;
    int shift;  // 4 for the high nibbles
    // Group g is sub-block j = g % 8 of its block: quant bytes 32 (j / 2).., the low nibbles
    // for even j; element = dl·q − ml.
    __device__ __forceinline__ void load(const QMatrix& mat, int row, int g, bool ok) {
        const int j = g & 7;
        const size_t i = qblock(mat, row, g >> 3);
        const uint4 a = __ldg((const uint4*)(mat.aux + i * AB));
        const uint4* qp = (const uint4*)(mat.data + i * QB + 32 * (j >> 1));
        q0 = __ldg(qp);
        q1 = __ldg(qp + 1);
        float sc, mn;
        scale_min_k4(j, a.y, a.z, a.w, sc, mn);
        dl = ok ? f16_to_f32((u16)(a.x & 0xFFFFu)) * sc : 0.0f;
        ml = ok ? f16_to_f32((u16)(a.x >> 16)) * mn : 0.0f;
        shift = 4 * (j & 1);
    }
    __device__ __forceinline__ void to_f16(u32 (&h)[16]) const {
        const u32 w[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
        const u32 d2 = splat_f16(dl), m2 = splat_f16(-ml);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const u32 v = w[k] >> shift;
#pragma unroll
            for (int p = 0; p < 2; p++) {
                const u32 q = hsub2(magic_f16(byte_pair(v, p == 0) & 0x000F000Fu), F16_1024);
                h[2 * k + p] = hfma2(q, d2, m2);
            }
        }
    }
};
#elif QTYPE == GGML_Q6_K
struct WGroup {
    uint4 l0, l1, h0, h1;
    float d0, d1;
    int p;
    // Group g is part p = j % 4 of 128-element half n = j / 4 (j = g % 8): ql bytes
    // 64n + 32 (p & 1) (low nibbles for p < 2), qh bytes 128 + 32n at bit 2p, and one scale
    // per 16 elements; element = d·scale·(q − 32).
    __device__ __forceinline__ void load(const QMatrix& mat, int row, int g, bool ok) {
        const int j = g & 7, n = j >> 2;
        p = j & 3;
        const size_t i = qblock(mat, row, g >> 3);
        const size_t nblocks = (size_t)mat.rows * (size_t)(mat.cols / QK);
        const u8* blk = mat.data + i * QB;
        const float d = f16_to_f32(__ldg((const u16*)(mat.aux + nblocks * AB) + i));
        const u32 sc = __ldg((const u16*)(mat.aux + i * AB + 8 * n + 2 * p));
        const uint4* qp = (const uint4*)(blk + 64 * n + 32 * (p & 1));
        const uint4* hp = (const uint4*)(blk + 128 + 32 * n);
        l0 = __ldg(qp);
        l1 = __ldg(qp + 1);
        h0 = __ldg(hp);
        h1 = __ldg(hp + 1);
        d0 = ok ? d * (float)(i8)(sc & 0xFFu) : 0.0f;
        d1 = ok ? d * (float)(i8)(sc >> 8) : 0.0f;
    }
    __device__ __forceinline__ void to_f16(u32 (&h)[16]) const {
        const u32 lw[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
        const u32 hw[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        const int lshift = 4 * (p >> 1);
        const u32 d2[2] = {splat_f16(d0), splat_f16(d1)};
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const u32 lo = lw[k] >> lshift;
            const u32 hi = (hw[k] >> (2 * p)) << 4;
#pragma unroll
            for (int s = 0; s < 2; s++) {
                const u32 q = (byte_pair(lo, s == 0) & 0x000F000Fu) |
                              (byte_pair(hi, s == 0) & 0x00300030u);
                h[2 * k + s] = hmul2(hsub2(magic_f16(q), 0x64206420u), d2[k >> 2]);  // 1024 + 32
            }
        }
    }
};
#elif QTYPE == GGML_F16
struct WGroup {
    uint4 v[4];
    __device__ __forceinline__ void load(const QMatrix& mat, int row, int g, bool ok) {
        const uint4* p = (const uint4*)(mat.data + ((size_t)row * mat.cols + (size_t)g * 32) * 2);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[k] = __ldg(p + k);
            if (!ok) v[k] = make_uint4(0u, 0u, 0u, 0u);
        }
    }
    __device__ __forceinline__ void to_f16(u32 (&h)[16]) const {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            h[4 * k] = v[k].x;
            h[4 * k + 1] = v[k].y;
            h[4 * k + 2] = v[k].z;
            h[4 * k + 3] = v[k].w;
        }
    }
};
#else
struct WGroup {
    float v[32];
    __device__ __forceinline__ void load(const QMatrix& mat, int row, int g, bool ok) {
        dequant32(mat, row, g, v);
#pragma unroll
        for (int i = 0; i < 32; ++i) v[i] = ok ? v[i] : 0.0f;
    }
    __device__ __forceinline__ void to_f16(u32 (&h)[16]) const {
#pragma unroll
        for (int i = 0; i < 16; ++i) h[i] = pack_f16x2(v[2 * i], v[2 * i + 1]);
    }
};
#endif

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

// Block tile (blockIdx.x, tile_row): tokens [BM·blockIdx.x, +BM) x weight rows
// [128·tile_row, +128); block: 256 threads; dynamic shared memory 2 * (BM + 128) * 128 bytes.
// MT = m16 tiles per warp, BM = 32 * MT tokens per block.
template <int MT>
__device__ __forceinline__ void gemm_tile(const u8* data, const u8* aux, int rows, int cols,
                                          const u16* xh, const float* xscale, int m, float* y,
                                          long long y_stride, const float* bias, int tile_row) {
    constexpr int BM = 32 * MT;
    constexpr u32 X_BYTES = BM * 128;
    constexpr u32 STAGE = X_BYTES + GEMM_BN * 128;
    extern __shared__ __align__(128) u8 smem[];
    const u32 base = smem_addr(smem);

    const QMatrix q = {data, aux, rows, cols};
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int m0 = blockIdx.x * BM, n0 = tile_row * GEMM_BN;
    const int k = cols, groups = cols / 32, steps = (cols + GEMM_BK - 1) / GEMM_BK;

    // This thread's dequantization job: group (2 * step + dg) of weight row n0 + dr. Rows past
    // the matrix and groups past K load a valid group with zero scales.
    const int dr = tid >> 1, dg = tid & 1, wrow = n0 + dr;
    WGroup w;

    auto fetch_w = [&](int step) {
        const int g = step * 2 + dg;
        w.load(q, min(wrow, rows - 1), min(g, groups - 1), wrow < rows && g < groups);
    };
    auto store_w = [&](int stage) {
        u32 h[16];
        w.to_f16(h);
        const u32 dst = base + stage * STAGE + X_BYTES;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst + swz(dr, dg * 4 + j)),
                         "r"(h[4 * j]), "r"(h[4 * j + 1]), "r"(h[4 * j + 2]), "r"(h[4 * j + 3])
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

// The products of one launch (up to 3, one weight type, one prepared input): part j covers
// grid rows [first_tile, next part's first_tile) with tiles of its own matrix. Matches
// GemmParams in gemm.rs.
struct GemmPart {
    const u8* data;
    const u8* aux;
    float* y;
    const float* bias;
    long long y_stride;
    int rows, first_tile;
};
struct GemmParams {
    GemmPart part[3];
    const u16* xh;
    const float* xscale;
    int m, cols, parts, pad;
};

// Launch bounds: one 128-token block per SM may use up to 255 registers, which lets the
// compiler keep the next step's weights in flight longest; grids of more than one wave run
// better as two such blocks per SM in 128 registers (gemm_m128_pair), and the 64-token kernel
// fits two blocks per SM in 128 registers with the same schedule.
#define GEMM_ENTRY(NAME, MINB, MT)                                                              \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS, MINB) NAME(const GemmParams P) { \
        pdl_begin();                                                                            \
        const int by = blockIdx.y;                                                              \
        const int j = (P.parts > 1 && by >= P.part[1].first_tile) +                             \
                      (P.parts > 2 && by >= P.part[2].first_tile);                              \
        const GemmPart& p = j == 0 ? P.part[0] : (j == 1 ? P.part[1] : P.part[2]);              \
        gemm_tile<MT>(p.data, p.aux, p.rows, P.cols, P.xh, P.xscale, P.m, p.y, p.y_stride,      \
                      p.bias, by - p.first_tile);                                               \
    }
GEMM_ENTRY(gemm_m128, 1, 4)
GEMM_ENTRY(gemm_m128_pair, 2, 4)
GEMM_ENTRY(gemm_m64, 2, 2)
