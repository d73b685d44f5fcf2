// Batched matrix-vector products y[t] = W·x[t] for m <= 16 tokens, one weight read for all.
//
// Compiled without QTYPE: only the activation quantizer, shared by every weight type.
// Compiled with -DQTYPE=<ggml type code>: the products for that weight type.
//
// Q4_0, Q4_K and Q6_K batches of 5 to 16 tokens run on tensor cores instead (gemv_mma_*, the
// last section).
//
// Quantized weights meet activations quantized to int8 per 32 values (d = amax/127, plus the
// level sums d·Σq per 16 and per 32 that the offset and min terms need), multiplied four
// values per __dp4a with int32 sums inside a sub-block and f32 across them. Float weights
// (F32, F16, BF16) meet the f32 activations directly.
//
// Work split: a row group of `ksplit` warps (a power of two dividing the block's warps; more
// than 1 only in the _split entries of m = 1) owns NR output rows (1 or 2 for m = 1 by type, 4
// for m = 4 and 8, else 2; the gated kernel: the gate and up rows of one output) and walks them
// in per-type "chunks" of 16 to 64 weight bytes: lane l of the group's warp k takes chunks
// 32k + l, 32k + l + 32·ksplit, ... so every weight load is 16 bytes, the group reads
// 512·ksplit contiguous bytes at a time, and each lane keeps UNROLL chunks in flight. A
// chunk's activations are loaded once per token and serve every row the warp owns. The
// per-lane partial sums of all (row, token) pairs are then reduced across the warp in one
// butterfly, and across the group's warps through shared memory. The host splits a row's
// columns over several warps when there are too few rows to fill the GPU (a 1024-row
// projection has 512 row pairs: four warps per SM), so every SM keeps enough weight bytes in
// flight. With more rows than the GPU holds at once, the products of 1 and 2 tokens run on a
// grid capped at what is resident, and each warp streams its row groups one after another
// without letting its loads drain (stream_rows).
#include "actq.cuh"

#ifndef QTYPE

// grid (ceil(cols/32 / 8), m), block 256: warp w quantizes group blockIdx.x*8 + w (32 values)
// of token blockIdx.y, one value per lane. Writes q (m x cols levels) and s (m x cols/32 of
// {d, d·Σq, d·Σq[0..16), d·Σq[16..32)}).
extern "C" __global__ void __launch_bounds__(256)
    quantize_act(const float* __restrict__ x, int x_stride, int m, int cols, i8* __restrict__ q,
                 float4* __restrict__ s) {
    pdl_begin();
    const int t = blockIdx.y;
    const int g = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (t >= m || g >= cols / 32) return;
    const float v[1] = {x[(size_t)t * x_stride + (size_t)g * 32 + lane]};
    float4 sums;
    store_levels<1>(q + (size_t)t * cols + (size_t)g * 32 + lane, quantize_group<1>(v, lane, sums));
    if (lane == 0) s[(size_t)t * (cols / 32) + g] = sums;
}

#else

#include "quant.cuh"
#include "chain.cuh"

#define FULL_MASK 0xffffffffu

// A 16-byte load of weights, which are read once: kept out of L1, which the activations use.
// Volatile, so the first ones stay ahead of the wait for the preceding kernel.
__device__ __forceinline__ uint4 ld_weights(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// The weights' scales (and Q4_1's and Q5's other per-block fields), also read once: kept out of
// L1 as well, so the activations every warp reads stay there (docs/perf/2026-11-24-scales-l1.md).
// Not volatile: like the __ldg they replace, free to move.
__device__ __forceinline__ u16 ld_aux(const u16* p) {
    u16 v;
    asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ u32 ld_aux(const u32* p) {
    u32 v;
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 ld_aux(const uint2* p) {
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
__device__ __forceinline__ uint4 ld_aux(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// The activations of the product, m token rows.
struct Acts {
    const i8* q;      // levels, cols per token
    const float4* s;  // cols/32 per token: {d, d·Σq, d·Σq[0..16), d·Σq[16..32)}
    const float* f;   // f32 values, fstride per token (float weights only)
    int cols;
    int fstride;
    // Input written by gemv_m1_norm (one token): the sums of squares of its cols/32 groups
    // and the norm's epsilon; null otherwise.
    const float* ssq;
    float eps;
};

// The factor every sum of a product takes: 1/rms of an input that gemv_m1_norm wrote before
// dividing by it (its groups' squares added in the same order by every warp, so every row
// sees the same factor), else 1. Call after the wait for the preceding kernel.
__device__ __forceinline__ float norm_scale(const Acts& x) {
    if (!x.ssq) return 1.0f;
    float s = 0.0f;
    for (int i = threadIdx.x & 31; i < x.cols / 32; i += 32) s += x.ssq[i];
    return rsqrtf(warp_sum(s) / (float)x.cols + x.eps);
}

// One 32-value activation group.
struct A32 {
    int4 lo, hi;
    float d, s;
};
__device__ __forceinline__ void load_a32(A32& a, const Acts& x, int t, int grp) {
    const int4* p = (const int4*)(x.q + (size_t)t * x.cols) + 2 * grp;
    a.lo = __ldg(p);
    a.hi = __ldg(p + 1);
    const float2 ds = __ldg((const float2*)(x.s + (size_t)t * (x.cols / 32) + grp));
    a.d = ds.x;
    a.s = ds.y;
}

// Half h (16 values) of a 32-value activation group; s is the level sum of that half.
struct A16 {
    int4 v;
    float d, s;
};
__device__ __forceinline__ void load_a16(A16& a, const Acts& x, int t, int grp, int h) {
    a.v = __ldg((const int4*)(x.q + (size_t)t * x.cols) + 2 * grp + h);
    const float4 s = __ldg(x.s + (size_t)t * (x.cols / 32) + grp);
    a.d = s.x;
    a.s = h ? s.w : s.z;
}

// An input the product quantized itself into shared memory (gemv_m1_norm_q): one token, the
// scratch's layout (levels at q[col], sums at s[group]), already divided by any RMS.
struct SmemActs {
    const i8* q;
    const float4* s;
};
__device__ __forceinline__ float norm_scale(const SmemActs&) { return 1.0f; }
__device__ __forceinline__ void load_a32(A32& a, const SmemActs& x, int, int grp) {
    const int4* p = (const int4*)x.q + 2 * grp;
    a.lo = p[0];
    a.hi = p[1];
    const float2 ds = *(const float2*)(x.s + grp);
    a.d = ds.x;
    a.s = ds.y;
}
__device__ __forceinline__ void load_a16(A16& a, const SmemActs& x, int, int grp, int h) {
    a.v = ((const int4*)x.q)[2 * grp + h];
    const float4 s = x.s[grp];
    a.d = s.x;
    a.s = h ? s.w : s.z;
}

__device__ __forceinline__ int dp4a(u32 a, int b, int c) { return __dp4a((int)a, b, c); }

// Bits 0..3 of b moved to bit 0 of bytes 0..3.
__device__ __forceinline__ u32 spread4(u32 b) { return (b * 0x00204081u) & 0x01010101u; }

// The IQ4 levels of the 8 nibbles of w (byte j: low nibble, high nibble): lo gets the levels of
// the low nibbles of bytes 0..3, hi those of the high nibbles, as signed bytes.
__device__ __forceinline__ void iq4_lookup(u32 w, u32& lo, u32& hi) {
    const u32 sel = w & 0x77777777u;
    const u32 upper = (w & 0x88888888u) >> 1;  // nibble bit 3 -> +4: the second table half
    const u32 a0 = __byte_perm(IQ4_T0, IQ4_T1, sel);
    const u32 b0 = __byte_perm(IQ4_T2, IQ4_T3, sel);
    const u32 a1 = __byte_perm(IQ4_T0, IQ4_T1, sel >> 16);
    const u32 b1 = __byte_perm(IQ4_T2, IQ4_T3, sel >> 16);
    const u32 r0 = __byte_perm(a0, b0, 0x3210u | (upper & 0xFFFFu));
    const u32 r1 = __byte_perm(a1, b1, 0x3210u | (upper >> 16));
    lo = __byte_perm(r0, r1, 0x6420u);
    hi = __byte_perm(r0, r1, 0x7531u);
}

__device__ __forceinline__ void words(uint4 v, u32 (&w)[4]) {
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
}
__device__ __forceinline__ void words(int4 v, int (&w)[4]) {
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
}

// Per type: CV values per chunk, UNROLL chunks in flight per lane, M1_ROWS rows per warp when
// m = 1 (must match matmul.rs), W (one row's chunk in registers), A (one token's activations
// for a chunk), load_w, load_a and dot.

#if QTYPE == GGML_Q4_0 || QTYPE == GGML_Q4_1 || QTYPE == GGML_Q5_0 || QTYPE == GGML_Q5_1 || \
    QTYPE == GGML_IQ4_NL
// Chunk = one block of 32.
#define CV 32
#define M1_ROWS 2
#define UNROLL 4
struct W {
    uint4 q;
    float d, m;
    u32 qh;
};
typedef A32 A;
__device__ __forceinline__ void load_w(W& w, const QMatrix& mat, int row, int ch) {
    const size_t i = qblock(mat, row, ch);
    w.q = ld_weights(mat.data + i * QB);
#if QTYPE == GGML_Q4_0 || QTYPE == GGML_IQ4_NL
    w.d = f16_to_f32(ld_aux((const u16*)mat.aux + i));
#elif QTYPE == GGML_Q4_1
    const u32 dm = ld_aux((const u32*)mat.aux + i);
    w.d = f16_to_f32((u16)(dm & 0xFFFFu));
    w.m = f16_to_f32((u16)(dm >> 16));
#else
    const uint2 a = ld_aux((const uint2*)mat.aux + i);
    w.d = f16_to_f32((u16)(a.x & 0xFFFFu));
    w.m = f16_to_f32((u16)(a.x >> 16));
    w.qh = a.y;
#endif
}
template <class X>
__device__ __forceinline__ void load_a(A& a, const X& x, int t, int ch) { load_a32(a, x, t, ch); }
__device__ __forceinline__ float dot(const W& w, const A& a) {
    u32 q[4];
    int al[4], ah[4];
    words(w.q, q);
    words(a.lo, al);
    words(a.hi, ah);
    int s = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        u32 lo, hi;
#if QTYPE == GGML_IQ4_NL
        iq4_lookup(q[k], lo, hi);
#else
        lo = q[k] & 0x0F0F0F0Fu;
        hi = (q[k] >> 4) & 0x0F0F0F0Fu;
#if QTYPE == GGML_Q5_0 || QTYPE == GGML_Q5_1
        lo |= spread4((w.qh >> (4 * k)) & 15u) << 4;
        hi |= spread4((w.qh >> (16 + 4 * k)) & 15u) << 4;
#endif
#endif
        s = dp4a(lo, al[k], s);
        s = dp4a(hi, ah[k], s);
    }
#if QTYPE == GGML_Q4_0
    return w.d * (a.d * (float)s - 8.0f * a.s);
#elif QTYPE == GGML_Q5_0
    return w.d * (a.d * (float)s - 16.0f * a.s);
#elif QTYPE == GGML_IQ4_NL
    return w.d * a.d * (float)s;
#else
    return w.d * a.d * (float)s + w.m * a.s;
#endif
}

#elif QTYPE == GGML_Q8_0
// Chunk = one block of 32 (two 16-byte loads).
#define CV 32
#define M1_ROWS 1
#define UNROLL 2
struct W {
    uint4 q0, q1;
    float d;
};
typedef A32 A;
__device__ __forceinline__ void load_w(W& w, const QMatrix& mat, int row, int ch) {
    const size_t i = qblock(mat, row, ch);
    w.q0 = ld_weights(mat.data + i * QB);
    w.q1 = ld_weights(mat.data + i * QB + 16);
    w.d = f16_to_f32(ld_aux((const u16*)mat.aux + i));
}
template <class X>
__device__ __forceinline__ void load_a(A& a, const X& x, int t, int ch) { load_a32(a, x, t, ch); }
__device__ __forceinline__ float dot(const W& w, const A& a) {
    u32 q0[4], q1[4];
    int al[4], ah[4];
    words(w.q0, q0);
    words(w.q1, q1);
    words(a.lo, al);
    words(a.hi, ah);
    int s = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        s = dp4a(q0[k], al[k], s);
        s = dp4a(q1[k], ah[k], s);
    }
    return w.d * a.d * (float)s;
}

#elif QTYPE == GGML_IQ4_XS
// Chunk = sub-block j = ch % 8 (32 values, 16 quant bytes) of block ch / 8.
#define CV 32
#define M1_ROWS 2
#define UNROLL 4
struct W {
    uint4 q;
    float d;
};
typedef A32 A;
__device__ __forceinline__ void load_w(W& w, const QMatrix& mat, int row, int ch) {
    const int j = ch & 7;
    const size_t i = qblock(mat, row, ch >> 3);
    w.q = ld_weights(mat.data + i * QB + 16 * j);
    const uint2 a = ld_aux((const uint2*)mat.aux + i);
    const int ls = (int)(((a.y >> (4 * j)) & 15u) | (((a.x >> (16 + 2 * j)) & 3u) << 4));
    w.d = f16_to_f32((u16)(a.x & 0xFFFFu)) * (float)(ls - 32);
}
template <class X>
__device__ __forceinline__ void load_a(A& a, const X& x, int t, int ch) { load_a32(a, x, t, ch); }
__device__ __forceinline__ float dot(const W& w, const A& a) {
    u32 q[4];
    int al[4], ah[4];
    words(w.q, q);
    words(a.lo, al);
    words(a.hi, ah);
    int s = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        u32 lo, hi;
        iq4_lookup(q[k], lo, hi);
        s = dp4a(lo, al[k], s);
        s = dp4a(hi, ah[k], s);
    }
    return w.d * a.d * (float)s;
}

#elif QTYPE == GGML_Q4_K || QTYPE == GGML_Q5_K
// Chunk c = ch % 4 of block ch / 4: quant bytes 32c..32c+32, whose low nibbles are sub-block
// 2c and high nibbles sub-block 2c+1 (activation groups 8b + 2c and 8b + 2c + 1). Q5_K adds
// the 32 qh bytes, bits 2c and 2c+1.
#define CV 64
#define M1_ROWS 2
#define UNROLL 2
struct W {
    uint4 q0, q1;
#if QTYPE == GGML_Q5_K
    uint4 h0, h1;  // qh shifted right by 2c: bit 0 / bit 1 extend the low / high nibble
#endif
    float d1, m1, d2, m2;
};
struct A {
    A32 a0, a1;
};
__device__ __forceinline__ uint4 shr4(uint4 v, int s) {
    return make_uint4(v.x >> s, v.y >> s, v.z >> s, v.w >> s);
}
__device__ __forceinline__ void load_w(W& w, const QMatrix& mat, int row, int ch) {
    const int c = ch & 3;
    const size_t i = qblock(mat, row, ch >> 2);
#if QTYPE == GGML_Q5_K
    const u8* q = mat.data + i * QB + 32 + 32 * c;
    w.h0 = shr4(ld_weights(mat.data + i * QB), 2 * c);
    w.h1 = shr4(ld_weights(mat.data + i * QB + 16), 2 * c);
#else
    const u8* q = mat.data + i * QB + 32 * c;
#endif
    w.q0 = ld_weights(q);
    w.q1 = ld_weights(q + 16);
    // Scales and mins of sub-blocks 2c and 2c+1 as byte pairs (ggml's get_scale_min_k4 for
    // two sub-blocks at once, without branches).
    const uint4 a = ld_aux((const uint4*)(mat.aux + i * AB));
    const int sh = 16 * (c & 1);
    const u32 y = a.y >> sh, z = a.z >> sh, x = a.w >> sh;
    const u32 sc = c < 2 ? (y & 0x3F3Fu) : ((x & 0x0F0Fu) | ((y >> 2) & 0x3030u));
    const u32 mn = c < 2 ? (z & 0x3F3Fu) : (((x >> 4) & 0x0F0Fu) | ((z >> 2) & 0x3030u));
    const float d = f16_to_f32((u16)(a.x & 0xFFFFu));
    const float dmin = f16_to_f32((u16)(a.x >> 16));
    w.d1 = d * (float)(sc & 0xFFu);
    w.d2 = d * (float)((sc >> 8) & 0xFFu);
    w.m1 = dmin * (float)(mn & 0xFFu);
    w.m2 = dmin * (float)((mn >> 8) & 0xFFu);
}
template <class X>
__device__ __forceinline__ void load_a(A& a, const X& x, int t, int ch) {
    const int grp = (ch >> 2) * 8 + 2 * (ch & 3);
    load_a32(a.a0, x, t, grp);
    load_a32(a.a1, x, t, grp + 1);
}
__device__ __forceinline__ float dot(const W& w, const A& a) {
    u32 q0[4], q1[4];
    int x0[4], x1[4], y0[4], y1[4];
    words(w.q0, q0);
    words(w.q1, q1);
    words(a.a0.lo, x0);
    words(a.a0.hi, x1);
    words(a.a1.lo, y0);
    words(a.a1.hi, y1);
#if QTYPE == GGML_Q5_K
    u32 h0[4], h1[4];
    words(w.h0, h0);
    words(w.h1, h1);
#endif
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        u32 l0 = q0[k] & 0x0F0F0F0Fu, l1 = q1[k] & 0x0F0F0F0Fu;
        u32 u0 = (q0[k] >> 4) & 0x0F0F0F0Fu, u1 = (q1[k] >> 4) & 0x0F0F0F0Fu;
#if QTYPE == GGML_Q5_K
        l0 |= (h0[k] & 0x01010101u) << 4;
        l1 |= (h1[k] & 0x01010101u) << 4;
        u0 |= (h0[k] & 0x02020202u) << 3;
        u1 |= (h1[k] & 0x02020202u) << 3;
#endif
        s0 = dp4a(l0, x0[k], s0);
        s0 = dp4a(l1, x1[k], s0);
        s1 = dp4a(u0, y0[k], s1);
        s1 = dp4a(u1, y1[k], s1);
    }
    return w.d1 * a.a0.d * (float)s0 - w.m1 * a.a0.s + w.d2 * a.a1.d * (float)s1 -
           w.m2 * a.a1.s;
}

#elif QTYPE == GGML_Q6_K
// Chunk k = ch % 4 = 2n + h of block ch / 4: values 128n + 32s + 16h + j (j < 16) for s = 0..3,
// that is half h of activation groups 4n + s. Their low four bits are the nibbles of ql bytes
// 64n + 16h + j (s = 0 low, s = 2 high) and 64n + 32 + 16h + j (s = 1 low, s = 3 high), their
// top two bits are bits 2s and 2s + 1 of qh byte 128 + 32n + 16h + j, and each s has one
// scale, byte 8n + 2s + h. So a chunk is 48 weight bytes, each read once, and the four scale
// bytes stay packed in one register until the dot.
#define CV 64
#define M1_ROWS 2
#define UNROLL 2
struct W {
    uint4 l0, l1, h;
    u32 sc;  // scale bytes of s = 0..3
    float d;
};
struct A {
    A16 a[4];
};
__device__ __forceinline__ void load_w(W& w, const QMatrix& mat, int row, int ch) {
    const int k = ch & 3, n = k >> 1, h = k & 1;
    const size_t i = qblock(mat, row, ch >> 2);
    const size_t nblocks = (size_t)mat.rows * (size_t)(mat.cols / QK);
    const u8* blk = mat.data + i * QB;
    w.l0 = ld_weights(blk + 64 * n + 16 * h);
    w.l1 = ld_weights(blk + 64 * n + 32 + 16 * h);
    w.h = ld_weights(blk + 128 + 32 * n + 16 * h);
    const uint2 sc = ld_aux((const uint2*)(mat.aux + i * AB + 8 * n));
    w.sc = __byte_perm(sc.x, sc.y, 0x6420u + 0x1111u * h);
    w.d = f16_to_f32(ld_aux((const u16*)(mat.aux + nblocks * AB) + i));
}
template <class X>
__device__ __forceinline__ void load_a(A& a, const X& x, int t, int ch) {
    const int k = ch & 3;
    const int grp = (ch >> 2) * 8 + 4 * (k >> 1);
#pragma unroll
    for (int s = 0; s < 4; s++) load_a16(a.a[s], x, t, grp + s, k & 1);
}
__device__ __forceinline__ float dot(const W& w, const A& a) {
    u32 l0[4], l1[4], h[4];
    int x0[4], x1[4], x2[4], x3[4];
    words(w.l0, l0);
    words(w.l1, l1);
    words(w.h, h);
    words(a.a[0].v, x0);
    words(a.a[1].v, x1);
    words(a.a[2].v, x2);
    words(a.a[3].v, x3);
    int s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        s0 = dp4a((l0[k] & 0x0F0F0F0Fu) | ((h[k] & 0x03030303u) << 4), x0[k], s0);
        s1 = dp4a((l1[k] & 0x0F0F0F0Fu) | ((h[k] & 0x0C0C0C0Cu) << 2), x1[k], s1);
        s2 = dp4a(((l0[k] >> 4) & 0x0F0F0F0Fu) | (h[k] & 0x30303030u), x2[k], s2);
        s3 = dp4a(((l1[k] >> 4) & 0x0F0F0F0Fu) | ((h[k] >> 2) & 0x30303030u), x3[k], s3);
    }
    const float sc0 = (float)(i8)byte_of(w.sc, 0), sc1 = (float)(i8)byte_of(w.sc, 1);
    const float sc2 = (float)(i8)byte_of(w.sc, 2), sc3 = (float)(i8)byte_of(w.sc, 3);
    return w.d * (sc0 * (a.a[0].d * (float)s0 - 32.0f * a.a[0].s) +
                  sc1 * (a.a[1].d * (float)s1 - 32.0f * a.a[1].s) +
                  sc2 * (a.a[2].d * (float)s2 - 32.0f * a.a[2].s) +
                  sc3 * (a.a[3].d * (float)s3 - 32.0f * a.a[3].s));
}

#elif QTYPE == GGML_Q2_K || QTYPE == GGML_Q3_K
// Chunk k = ch % 4 = 2n + h of block ch / 4: quant bytes 32n + 16h.. hold, at bits 2s, values
// 128n + 32s + 16h.. (s = 0..3): sub-block 8n + 2s + h, activation group 4n + s, half h.
// Q3_K adds hmask bytes 16h.., bit 4n + s.
#define CV 64
#define M1_ROWS 2
#define UNROLL 4
struct W {
    uint4 q;
#if QTYPE == GGML_Q2_K
    u32 sc;  // the four sub-block scale bytes (scale low nibble, min high nibble)
    float d, dmin;
#else
    uint4 hm;  // hmask bytes 16h.., shifted right by 4n
    float dl[4];
#endif
};
struct A {
    A16 a[4];
};
__device__ __forceinline__ void load_w(W& w, const QMatrix& mat, int row, int ch) {
    const int k = ch & 3, n = k >> 1, h = k & 1;
    const size_t i = qblock(mat, row, ch >> 2);
    const u8* blk = mat.data + i * QB;
#if QTYPE == GGML_Q2_K
    w.q = ld_weights(blk + 16 + 32 * n + 16 * h);
    const uint2 sc = ld_aux((const uint2*)(blk + 8 * n));
    w.sc = __byte_perm(sc.x, sc.y, (u32)(h | ((h + 2) << 4) | ((h + 4) << 8) | ((h + 6) << 12)));
    const u32 dd = ld_aux((const u32*)mat.aux + i);
    w.d = f16_to_f32((u16)(dd & 0xFFFFu));
    w.dmin = f16_to_f32((u16)(dd >> 16));
#else
    w.q = ld_weights(blk + 32 + 32 * n + 16 * h);
    const uint4 hm = ld_weights(blk + 16 * h);
    w.hm = make_uint4(hm.x >> (4 * n), hm.y >> (4 * n), hm.z >> (4 * n), hm.w >> (4 * n));
    const uint4 a = ld_aux((const uint4*)(mat.aux + i * AB));
    const float d = f16_to_f32((u16)(a.w & 0xFFFFu));
    // Sub-block 8n + 2s + h: low four bits in nibble n of scale byte 2s + h, top two bits at
    // 4n + 2*(s/2) in byte 8 + (2s + h) % 4.
    const u32 low4 =
        __byte_perm(a.x, a.y, (u32)(h | ((h + 2) << 4) | ((h + 4) << 8) | ((h + 6) << 12)));
#pragma unroll
    for (int s = 0; s < 4; s++) {
        const u32 lo = (byte_of(low4, s) >> (4 * n)) & 15u;
        const u32 hi = (byte_of(a.z, h + 2 * (s & 1)) >> (4 * n + 2 * (s >> 1))) & 3u;
        w.dl[s] = d * (float)((int)(lo | (hi << 4)) - 32);
    }
#endif
}
template <class X>
__device__ __forceinline__ void load_a(A& a, const X& x, int t, int ch) {
    const int k = ch & 3;
    const int grp = (ch >> 2) * 8 + 4 * (k >> 1);
#pragma unroll
    for (int s = 0; s < 4; s++) load_a16(a.a[s], x, t, grp + s, k & 1);
}
__device__ __forceinline__ float dot(const W& w, const A& a) {
    u32 q[4];
    words(w.q, q);
#if QTYPE == GGML_Q3_K
    u32 hm[4];
    words(w.hm, hm);
#endif
    float r = 0.0f;
#pragma unroll
    for (int s = 0; s < 4; s++) {
        int v[4];
        words(a.a[s].v, v);
        int isum = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            u32 lv = (q[k] >> (2 * s)) & 0x03030303u;
#if QTYPE == GGML_Q3_K
            lv |= ((hm[k] >> s) & 0x01010101u) << 2;
#endif
            isum = dp4a(lv, v[k], isum);
        }
#if QTYPE == GGML_Q2_K
        const u32 sc = byte_of(w.sc, s);
        r += w.d * (float)(sc & 15u) * a.a[s].d * (float)isum - w.dmin * (float)(sc >> 4) * a.a[s].s;
#else
        r += w.dl[s] * (a.a[s].d * (float)isum - 4.0f * a.a[s].s);
#endif
    }
    return r;
}

#elif QTYPE == GGML_F32
// Chunk = 4 values (16 bytes).
#define CV 4
#define M1_ROWS 1
#define UNROLL 4
struct W {
    uint4 q;
};
struct A {
    float4 v;
};
__device__ __forceinline__ void load_w(W& w, const QMatrix& mat, int row, int ch) {
    w.q = ld_weights(mat.data + ((size_t)row * mat.cols + (size_t)ch * 4) * 4);
}
__device__ __forceinline__ void load_a(A& a, const Acts& x, int t, int ch) {
    a.v = __ldg((const float4*)(x.f + (size_t)t * x.fstride) + ch);
}
__device__ __forceinline__ float dot(const W& w, const A& a) {
    return __uint_as_float(w.q.x) * a.v.x + __uint_as_float(w.q.y) * a.v.y +
           __uint_as_float(w.q.z) * a.v.z + __uint_as_float(w.q.w) * a.v.w;
}

#elif QTYPE == GGML_F16 || QTYPE == GGML_BF16
// Chunk = 8 values (16 bytes).
#define CV 8
#define M1_ROWS 1
#define UNROLL 4
struct W {
    uint4 q;
};
struct A {
    float4 v0, v1;
};
__device__ __forceinline__ void load_w(W& w, const QMatrix& mat, int row, int ch) {
    w.q = ld_weights(mat.data + ((size_t)row * mat.cols + (size_t)ch * 8) * 2);
}
__device__ __forceinline__ void load_a(A& a, const Acts& x, int t, int ch) {
    const float4* p = (const float4*)(x.f + (size_t)t * x.fstride) + 2 * ch;
    a.v0 = __ldg(p);
    a.v1 = __ldg(p + 1);
}
__device__ __forceinline__ float lo_half(u32 v) {
#if QTYPE == GGML_F16
    return f16_to_f32((u16)(v & 0xFFFFu));
#else
    return bf16_to_f32((u16)(v & 0xFFFFu));
#endif
}
__device__ __forceinline__ float hi_half(u32 v) {
#if QTYPE == GGML_F16
    return f16_to_f32((u16)(v >> 16));
#else
    return __uint_as_float(v & 0xFFFF0000u);
#endif
}
__device__ __forceinline__ float dot(const W& w, const A& a) {
    return lo_half(w.q.x) * a.v0.x + hi_half(w.q.x) * a.v0.y + lo_half(w.q.y) * a.v0.z +
           hi_half(w.q.y) * a.v0.w + lo_half(w.q.z) * a.v1.x + hi_half(w.q.z) * a.v1.y +
           lo_half(w.q.w) * a.v1.z + hi_half(w.q.w) * a.v1.w;
}
#endif

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }
__device__ __forceinline__ float gelu_tanh(float x) {
    const float u = 0.7978846f * x * (1.0f + 0.044715f * x * x);
    return x / (1.0f + __expf(-2.0f * u));
}
__device__ __forceinline__ float activate(int act, float x) { return act ? gelu_tanh(x) : silu(x); }

// Where a plain product's sum s of output `row` goes, by mode: 0 *out = s (+ bias[row]),
// 1 and 2 *out = silu(*out) · s and gelu(*out) · s.
__device__ __forceinline__ void store_plain(float* out, int mode, float s,
                                            const float* __restrict__ bias, int row) {
    if (mode == 0) {
        *out = s + (bias ? bias[row] : 0.0f);
    } else {
        *out = activate(mode - 1, *out) * s;
    }
}

template <int V>
struct Log2 {
    static constexpr int value = V <= 1 ? 0 : 1 + Log2<V / 2>::value;
};
template <>
struct Log2<1> {
    static constexpr int value = 0;
};

// One butterfly stage per level: with N values left of V, each lane keeps the half selected
// by its lane bit (offset 16·N/V) and adds its partner's copy of that half.
template <int V, int N>
__device__ __forceinline__ void butterfly(float (&v)[V], int lane) {
    if constexpr (N > 1) {
        constexpr int half = N / 2;
        constexpr int o = 16 * N / V;
        const bool upper = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < half; i++) {
            const float a = v[i], b = v[i + half];
            v[i] = (upper ? b : a) + __shfl_xor_sync(FULL_MASK, upper ? a : b, o);
        }
        butterfly<V, half>(v, lane);
    }
}

// Sums V = 2^L per-lane values across the warp with V - 1 + 5 - L shuffles. Lanes whose low
// 5 - L bits are zero return the total of value lane >> (5 - L).
template <int V>
__device__ __forceinline__ float reduce_values(float (&v)[V], int lane) {
    butterfly<V, V>(v, lane);
    float s = v[0];
#pragma unroll
    for (int o = 16 / V; o > 0; o >>= 1) s += __shfl_xor_sync(FULL_MASK, s, o);
    return s;
}

// How a product orders its first weight loads, the wait for its predecessor and the release of
// its successor (`early`, set by the host per launch): the wait first; the loads first (weights
// never depend on the predecessor, so under dependent launch they overlap its tail); or the
// release, then the loads, then the wait. The last lets the next kernel's blocks start their own
// work before the wait ahead, where a narrow product's work after it is too short to cover the
// next kernel's start (docs/perf/2026-11-24-early-release.md); otherwise a product releases only
// past its wait, so at most two grids share the SMs.
#define WAIT_FIRST 0
#define LOADS_FIRST 1
#define RELEASE_FIRST 2
template <class Loads>
__device__ __forceinline__ void start_product(int early, const Loads& first_loads) {
    if (early == RELEASE_FIRST) pdl_release();
    if (early == WAIT_FIRST) pdl_wait();
    first_loads();
    if (early != WAIT_FIRST) pdl_wait();
    if (early != RELEASE_FIRST) pdl_release();
}

// The dot products of NR rows (row[r] of mat[r]) with up to M tokens; every lane returns
// partial sums acc[r][t] over its chunks first, first + stride, ... (KS = 1: the stride is 32,
// known at compile time so the unrolled loads fold it into their offsets; KS = 0: `stride`),
// and the input's norm_scale, which the caller applies to the reduced sums.
// The first batch of weights is requested as `early` says (start_product); `ready` runs once
// the predecessor's writes are visible, before the first activation is read (every thread of
// the block calls row_dots alike).
struct NothingToPrepare {
    __device__ __forceinline__ void operator()() const {}
};
template <int M, int NR, int KS, class X = Acts, class Ready = NothingToPrepare>
__device__ __forceinline__ void row_dots(const QMatrix (&mat)[NR], const int (&row)[NR],
                                         const X& x, int m, int first, int stride, int early,
                                         float (&acc)[NR][M], float& scale,
                                         const Ready& ready = Ready{}) {
#pragma unroll
    for (int r = 0; r < NR; r++) {
#pragma unroll
        for (int t = 0; t < M; t++) acc[r][t] = 0.0f;
    }
    const int nch = mat[0].cols / CV;
    const int step = KS == 1 ? 32 : stride;
    // Chunks in flight per lane and row: fewer when a warp owns four rows.
    constexpr int U = NR >= 4 && UNROLL > 1 ? UNROLL / 2 : UNROLL;
    W w[U][NR];
    auto load_batch = [&](int c0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (c0 + step * u < nch) {
#pragma unroll
                for (int r = 0; r < NR; r++) load_w(w[u][r], mat[r], row[r], c0 + step * u);
            }
        }
    };
    start_product(early, [&] { load_batch(first); });
    ready();
    scale = norm_scale(x);
    // A lane with two chunks in flight (Q8_0 and the 64-value k-quant chunks) refills each slot
    // with its chunk of the next batch as soon as it is used, so rows longer than a batch do
    // not drain between batches; with four, the batched walk measured as fast or faster
    // (docs/perf/2026-11-24-row-dots-ring.md).
    constexpr bool refill = U <= 2;
    for (int c0 = first; c0 < nch; c0 += step * U) {
        if (!refill && c0 != first) load_batch(c0);
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (c0 + step * u < nch) {
#pragma unroll
                for (int t = 0; t < M; t++) {
                    if (t < m) {
                        A a;
                        load_a(a, x, t, c0 + step * u);
#pragma unroll
                        for (int r = 0; r < NR; r++) acc[r][t] += dot(w[u][r], a);
                    }
                }
                const int next = c0 + step * (U + u);
                if (refill && next < nch) {
#pragma unroll
                    for (int r = 0; r < NR; r++) load_w(w[u][r], mat[r], row[r], next);
                }
            }
        }
    }
}

// Where a warp works: its row group's index in the grid (groups of `ksplit` warps, ksplit a
// power of two dividing the block's warps) and its first chunk and chunk stride.
struct Split {
    int group, first, stride;
};
__device__ __forceinline__ Split split_of(int block, int ksplit) {
    const int warp = threadIdx.x >> 5;
    const int groups = (blockDim.x >> 5) / ksplit;
    return {block * groups + warp / ksplit, 32 * (warp & (ksplit - 1)) + (threadIdx.x & 31),
            32 * ksplit};
}

// Adds the other warps' totals of this warp's row group to `s`, in the lanes that hold one
// after reduce_values<V>. False in every warp but the group's first, which alone stores. Only
// the _split entries call it, so every warp of the block reaches the barrier.
template <int V>
__device__ __forceinline__ bool gather_group(float& s, int lane, int ksplit) {
    constexpr int SH = 5 - Log2<V>::value;
    __shared__ float part[8][V];
    const int warp = threadIdx.x >> 5;
    const bool holder = (lane & ((1 << SH) - 1)) == 0;
    if (holder) part[warp][lane >> SH] = s;
    __syncthreads();
    if (warp & (ksplit - 1)) return false;
    if (holder) {
        for (int k = 1; k < ksplit; k++) s += part[warp + k][lane >> SH];
    }
    return true;
}

// Plain product, `block` counted from the matrix's first block: row group g owns rows
// g*NR + r, r < NR (NR = M1_ROWS for m = 1, 4 for m = 4 and 8, else 2). Per mode: 0 y = W·x
// (+ bias), 1 y = silu(y)·(W·x), 2 y = gelu(y)·(W·x). Groups past the last row read the last
// row and store nothing: no warp may leave before the group's barrier. KS as in row_dots.
template <int M, int NR, int KS>
__device__ __forceinline__ void gemv_plain(const QMatrix& mat, const Acts& x, int m,
                                           float* __restrict__ y, int y_stride,
                                           const float* __restrict__ bias, int mode, int block,
                                           int ksplit, int early) {
    const int lane = threadIdx.x & 31;
    const Split sp = split_of(block, KS == 1 ? 1 : ksplit);
    const int row0 = sp.group * NR;
    QMatrix mats[NR];
    int rows[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) {
        mats[r] = mat;
        rows[r] = min(row0 + r, mat.rows - 1);
    }
    float acc[NR][M], scale;
    row_dots<M, NR, KS>(mats, rows, x, m, sp.first, sp.stride, early, acc, scale);
    float v[NR * M];
#pragma unroll
    for (int r = 0; r < NR; r++) {
#pragma unroll
        for (int t = 0; t < M; t++) v[r * M + t] = acc[r][t];
    }
    constexpr int SH = 5 - Log2<NR * M>::value;
    float s = reduce_values<NR * M>(v, lane) * scale;
    if (KS == 0 && !gather_group<NR * M>(s, lane, ksplit)) return;
    if ((lane & ((1 << SH) - 1)) == 0) {
        const int idx = lane >> SH;
        const int t = idx % M;
        const int row = row0 + idx / M;
        if (t < m && row < mat.rows) {
            store_plain(y + (size_t)t * y_stride + row, mode, s, bias, row);
        }
    }
}

// Gated product: row group g owns output row g, reading that row of the gate and of the up
// matrix: y = act(gate·x)·(up·x), act 0 silu, 1 gelu (tanh). KS as in row_dots.
template <int M, int KS>
__device__ __forceinline__ void gemv_gated(const QMatrix& gate, const QMatrix& up, const Acts& x,
                                           int m, float* __restrict__ y, int y_stride, int act,
                                           int ksplit, int early) {
    const int lane = threadIdx.x & 31;
    const Split sp = split_of(blockIdx.x, KS == 1 ? 1 : ksplit);
    const int row = min(sp.group, gate.rows - 1);
    const QMatrix mats[2] = {gate, up};
    const int rows[2] = {row, row};
    float acc[2][M], scale;
    row_dots<M, 2, KS>(mats, rows, x, m, sp.first, sp.stride, early, acc, scale);
    float v[2 * M];
#pragma unroll
    for (int t = 0; t < M; t++) {
        v[t] = acc[0][t];
        v[M + t] = acc[1][t];
    }
    // Value t (gate) and M + t (up) end 16 lanes apart.
    constexpr int SH = 5 - Log2<2 * M>::value;
    float s = reduce_values<2 * M>(v, lane) * scale;
    if (KS == 0 && !gather_group<2 * M>(s, lane, ksplit)) return;
    const float u = __shfl_down_sync(FULL_MASK, s, 16);
    if (lane < 16 && (lane & ((1 << SH) - 1)) == 0 && sp.group < gate.rows) {
        const int t = lane >> SH;
        if (t < m) y[(size_t)t * y_stride + row] = activate(act, s) * u;
    }
}

// The plain products of one launch: up to three matrices of the same type and width on one
// input (q, k and v), each with its own output. Matrix j owns the blocks from first_block.
struct GemvPart {
    const u8* data;
    const u8* aux;
    float* y;
    const float* bias;
    int rows, y_stride, first_block, pad;
};
struct GemvParams {
    GemvPart part[3];
    const i8* aq;
    const float4* as;
    const float* xf;
    int x_stride, cols, m, mode, ksplit, parts, early, blocks;
    const float* ssq;  // Acts::ssq
    float eps;
    int pad;
};

__device__ __forceinline__ Acts acts_of(const GemvParams& P) {
    return {P.aq, P.as, P.xf, P.cols, P.x_stride, P.ssq, P.eps};
}

__device__ __forceinline__ const GemvPart& part_of(const GemvParams& P, int b) {
    const int j = (P.parts > 1 && b >= P.part[1].first_block) +
                  (P.parts > 2 && b >= P.part[2].first_block);
    return j == 0 ? P.part[0] : (j == 1 ? P.part[1] : P.part[2]);
}

// Chunks in flight per lane in stream_rows: UNROLL, fewer where the ring beside row_dots in one
// kernel would spill (IQ4_NL at 80 registers; Q3_K, whose chunk alone takes 12 registers,
// keeps an 8-byte spill in its plain product even so). Fewer slots measured faster in decode,
// the fewer loads in flight notwithstanding: Q4_0 keeps three (at 64 registers, its gated
// product and its streamed plain one; tg128 +2.0–2.3 % on the Q4_0 models), Q4_K one (72
// registers instead of 80; tg128 +1.5 % on llama3.1-8b q4_k, +1.6 % on qwen3-4b q4_k)
// (docs/perf/2026-11-24-stream-ring.md).
#if QTYPE == GGML_Q3_K
#define RING 2
#elif QTYPE == GGML_IQ4_NL || QTYPE == GGML_Q4_0
#define RING 3
#elif QTYPE == GGML_Q4_K
#define RING 1
#else
#define RING UNROLL
#endif

// Unsplit rows, streamed, for up to M tokens (m of them): the warp's row groups are those of
// blocks blockIdx.x, blockIdx.x + gridDim.x, ... of `blocks` (the host caps the grid at what is
// resident at once, so each warp walks several), each read in `per` chunks per lane (the last
// ones may lie past the row). The RING slots of a lane form a ring: a slot is reloaded as soon
// as its chunk is used, with the lane's next chunk of the same row group or of its next one, so
// the weight stream does not drain while the warp computes, reduces and stores.
// `job.rows(b, mat, row)` names the NR rows the warp reads for block b; `job.store(b, s, lane)`
// stores after the warp's reduction, s holding in lane i << (5 - log2(NR·M)) the total of row
// i / M for token i % M.
template <int M, int NR, class Job>
__device__ __forceinline__ void stream_rows(const Job& job, const Acts& x, int m, int blocks,
                                            int early) {
    const int lane = threadIdx.x & 31;
    const int nch = x.cols / CV;
    const int per = (nch + 31) / 32;
    const int total = (blocks - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x * per;
    W w[RING][NR];
    int lb = blockIdx.x, lk = 0;
    QMatrix lm[NR];
    int lr[NR];
    job.rows(lb, lm, lr);
    auto refill = [&](W(&slot)[NR]) {
        const int ch = lane + 32 * lk;
        if (lb < blocks && ch < nch) {
#pragma unroll
            for (int r = 0; r < NR; r++) load_w(slot[r], lm[r], lr[r], ch);
        }
        if (++lk == per) {
            lk = 0;
            lb += gridDim.x;
            if (lb < blocks) job.rows(lb, lm, lr);
        }
    };
    start_product(early, [&] {
#pragma unroll
        for (int u = 0; u < RING; u++) refill(w[u]);
    });
    const float scale = norm_scale(x);
    int ck = 0, cb = blockIdx.x;
    float acc[NR * M];
#pragma unroll
    for (int i = 0; i < NR * M; i++) acc[i] = 0.0f;
    for (int i0 = 0; i0 < total; i0 += RING) {
#pragma unroll
        for (int u = 0; u < RING; u++) {
            if (i0 + u < total) {
                const int ch = lane + 32 * ck;
                if (ch < nch) {
#pragma unroll
                    for (int t = 0; t < M; t++) {
                        if (t < m) {
                            A a;
                            load_a(a, x, t, ch);
#pragma unroll
                            for (int r = 0; r < NR; r++) acc[r * M + t] += dot(w[u][r], a);
                        }
                    }
                }
                refill(w[u]);
                if (++ck == per) {
                    job.store(cb, reduce_values<NR * M>(acc, lane) * scale, lane);
#pragma unroll
                    for (int i = 0; i < NR * M; i++) acc[i] = 0.0f;
                    ck = 0;
                    cb += gridDim.x;
                }
            }
        }
    }
}

// The rows and stores of the streamed plain products: block b of part j holds row groups of
// NR rows; M tokens.
template <int M, int NR>
struct PlainJob {
    const GemvParams& P;
    __device__ __forceinline__ int row0(const GemvPart& p, int b) const {
        return split_of(b - p.first_block, 1).group * NR;
    }
    __device__ __forceinline__ void rows(int b, QMatrix (&mat)[NR], int (&row)[NR]) const {
        const GemvPart& p = part_of(P, b);
        const int r0 = row0(p, b);
#pragma unroll
        for (int r = 0; r < NR; r++) {
            mat[r] = {p.data, p.aux, p.rows, P.cols};
            row[r] = min(r0 + r, p.rows - 1);
        }
    }
    __device__ __forceinline__ void store(int b, float s, int lane) const {
        constexpr int SH = 5 - Log2<NR * M>::value;
        const GemvPart& p = part_of(P, b);
        const int i = lane >> SH, t = i % M;
        const int row = row0(p, b) + i / M;
        if ((lane & ((1 << SH) - 1)) == 0 && (M == 1 || t < P.m) && row < p.rows) {
            store_plain(p.y + (size_t)t * p.y_stride + row, P.mode, s, p.bias, row);
        }
    }
};

// The rows and stores of the streamed gated products: block b's warps own one output row each;
// M tokens.
template <int M>
struct GatedJob {
    QMatrix gate, up;
    float* y;
    int y_stride, m, act;
    __device__ __forceinline__ int row_of(int b) const { return split_of(b, 1).group; }
    __device__ __forceinline__ void rows(int b, QMatrix (&mat)[2], int (&row)[2]) const {
        mat[0] = gate;
        mat[1] = up;
        row[0] = row[1] = min(row_of(b), gate.rows - 1);
    }
    // Token t's gate total and its up total end 16 lanes apart.
    __device__ __forceinline__ void store(int b, float s, int lane) const {
        constexpr int SH = 5 - Log2<2 * M>::value;
        const float u = __shfl_down_sync(FULL_MASK, s, 16);
        const int row = row_of(b), t = M == 1 ? 0 : lane >> SH;
        const bool holder =
            M == 1 ? lane == 0 : lane < 16 && (lane & ((1 << SH) - 1)) == 0 && t < m;
        if (holder && row < gate.rows) {
            y[(size_t)t * y_stride + row] = activate(act, s) * u;
        }
    }
};

// Entries per batch variant M; KS = 0 makes the split entries of m = 1 (names ending in
// _split), whose row groups may have several warps; KS = 1 the others.
#define GEMV_ENTRIES(M, NR, MINB, MINBG, KS, SUFFIX)                                             \
    extern "C" __global__ void __launch_bounds__(256, MINB) gemv_m##M##SUFFIX(const GemvParams P) { \
        const int b = blockIdx.x;                                                                \
        const GemvPart& p = part_of(P, b);                                                       \
        const QMatrix mat = {p.data, p.aux, p.rows, P.cols};                                     \
        const Acts x = acts_of(P);                                                               \
        gemv_plain<M, NR, KS>(mat, x, P.m, p.y, p.y_stride, p.bias, P.mode, b - p.first_block,  \
                              P.ksplit, P.early);                                                \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(256, MINBG) gemv_gated_m##M##SUFFIX(           \
        const u8* __restrict__ data, const u8* __restrict__ aux, int rows, int cols,            \
        const u8* __restrict__ data2, const u8* __restrict__ aux2, const i8* __restrict__ aq,   \
        const float4* __restrict__ as, const float* __restrict__ xf, int x_stride, int m,       \
        float* __restrict__ y, int y_stride, int act, int ksplit, int early,                     \
        const float* __restrict__ ssq, float eps) {                                              \
        const QMatrix gate = {data, aux, rows, cols};                                            \
        const QMatrix up = {data2, aux2, rows, cols};                                            \
        const Acts x = {aq, as, xf, cols, x_stride, ssq, eps};                                   \
        gemv_gated<M, KS>(gate, up, x, m, y, y_stride, act, ksplit, early);                      \
    }

// Blocks per SM the register allocation must allow, for launch bounds of 256 threads (2, 3 and
// 4: 128, 80 and 64 registers a thread): m = 1 wants many warps in flight, larger batches need
// registers for their sums. For m = 1 each type takes the most blocks that neither spill nor
// measured slower in decode (docs/perf/2026-11-22-gemv-occupancy.md): the 4-bit block types'
// plain products fit 80 registers and Q4_0's gated product 64; Q4_K's plain and gated products
// fit 80, its split entries 128. The rest would spill.
#if QTYPE == GGML_Q4_0 || QTYPE == GGML_Q4_1 || QTYPE == GGML_IQ4_NL || QTYPE == GGML_IQ4_XS || \
    QTYPE == GGML_Q4_K
#define M1_MINB 3
#else
#define M1_MINB (M1_ROWS == 1 ? 4 : 2)
#endif
#define M1_MINB_GATED (QTYPE == GGML_Q4_0 ? 4 : M1_MINB == 4 ? 2 : M1_MINB)
#define M1_MINB_SPLIT (QTYPE == GGML_Q4_K ? 2 : M1_MINB)
// m = 1, unsplit rows. A grid of one block per row group (a product the GPU holds at once)
// takes the batched walk of row_dots: with a single row group per warp the ring has nothing to
// overlap, and its bookkeeping measured slower there (docs/perf/2026-11-22-gemv-streaming.md).
// On a grid capped at what the GPU holds, each warp streams its row groups through the ring
// (stream_rows): in this entry, or where STREAM_APART in gemv_m1_stream, whose register budget is
// then its own (Q4_0's fits 64 registers with its three ring slots: 32 warps an SM). The host's
// `streams_apart` (matmul.rs) must agree.
#define STREAM_APART (QTYPE == GGML_Q4_0)
extern "C" __global__ void __launch_bounds__(256, M1_MINB) gemv_m1(const GemvParams P) {
    const Acts x = acts_of(P);
    if (STREAM_APART || (int)gridDim.x >= P.blocks) {
        const int b = blockIdx.x;
        const GemvPart& p = part_of(P, b);
        const QMatrix mat = {p.data, p.aux, p.rows, P.cols};
        gemv_plain<1, M1_ROWS, 1>(mat, x, 1, p.y, p.y_stride, p.bias, P.mode, b - p.first_block,
                                  1, P.early);
        return;
    }
    stream_rows<1, M1_ROWS>(PlainJob<1, M1_ROWS>{P}, x, 1, P.blocks, P.early);
}
#if STREAM_APART
extern "C" __global__ void __launch_bounds__(256, 4) gemv_m1_stream(const GemvParams P) {
    stream_rows<1, M1_ROWS>(PlainJob<1, M1_ROWS>{P}, acts_of(P), 1, P.blocks, P.early);
}
#endif
// The output product of a greedy decode step with its argmax (no separate argmax launch, no
// logits written): every warp streams its row groups as gemv_m1_stream does and keeps the best
// of the totals it holds as a 64-bit key (argmax_key); each block offers its best to `key`
// (atomicMax), and the last block to take a ticket records the token into `out` and the chain,
// then zeroes `key` and `ticket` for the next launch. The same choice as sample.cu's argmax_f32
// over the written logits: the largest, ties to the lowest row, NaN skipped, token 0 when every
// total is NaN.

// A total's key: the sampler's rank key (chain.cuh: the larger value, of equal values the
// lower row), with denormals read as +0 as the flush-to-zero comparison of argmax_f32 has them;
// 0 is none (NaN, which no key of a number reaches).
__device__ __forceinline__ u64 argmax_key(float v, u32 row) {
    if (v != v) return 0;
    return make_key(fabsf(v) < 1.17549435e-38f ? 0.0f : v, row);
}

template <int NR>
struct ArgmaxJob {
    PlainJob<1, NR> plain;
    mutable u64 best;
    __device__ __forceinline__ void rows(int b, QMatrix (&mat)[NR], int (&row)[NR]) const {
        plain.rows(b, mat, row);
    }
    __device__ __forceinline__ void store(int b, float s, int lane) const {
        constexpr int SH = 5 - Log2<NR>::value;
        const GemvPart& p = part_of(plain.P, b);
        const int row = plain.row0(p, b) + (lane >> SH);
        if ((lane & ((1 << SH) - 1)) == 0 && row < p.rows) {
            const u64 k = argmax_key(s, (u32)row);
            if (k > best) best = k;
        }
    }
};

#define ARGMAX_MINB (STREAM_APART ? 4 : M1_MINB)
struct ArgmaxParams {
    GemvParams gemv;
    u64* key;
    u32* ticket;
    u32* out;
    Chain chain;
};
extern "C" __global__ void __launch_bounds__(256, ARGMAX_MINB) gemv_m1_argmax(const ArgmaxParams A) {
    __shared__ u64 warp_best[8];
    const GemvParams& P = A.gemv;
    const ArgmaxJob<M1_ROWS> job = {{P}, 0};
    stream_rows<1, M1_ROWS>(job, acts_of(P), 1, P.blocks, P.early);
    u64 best = job.best;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const u64 other = __shfl_xor_sync(FULL_MASK, best, o);
        if (other > best) best = other;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_best[warp] = best;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) best = warp_best[w] > best ? warp_best[w] : best;
    if (best) atomicMax(A.key, best);
    __threadfence();
    if (atomicAdd(A.ticket, 1u) != gridDim.x - 1) return;
    __threadfence();
    const u64 k = atomicExch(A.key, 0ull);
    *A.ticket = 0;
    record(A.out, k ? key_id(k) : 0u, A.chain);
}

// The streamed gated products of M tokens (the gated entries' parameters): every warp owns one
// output row at a time.
#define GATED_STREAM(NAME, M, MINB)                                                              \
    extern "C" __global__ void __launch_bounds__(256, MINB)                                      \
        NAME(const u8* __restrict__ data, const u8* __restrict__ aux, int rows, int cols,       \
             const u8* __restrict__ data2, const u8* __restrict__ aux2,                         \
             const i8* __restrict__ aq, const float4* __restrict__ as,                          \
             const float* __restrict__ xf, int x_stride, int m, float* __restrict__ y,          \
             int y_stride, int act, int ksplit, int early, const float* __restrict__ ssq,       \
             float eps) {                                                                        \
        const Acts x = {aq, as, xf, cols, x_stride, ssq, eps};                                   \
        const int mt = M == 1 ? 1 : m;                                                           \
        const GatedJob<M> job = {{data, aux, rows, cols}, {data2, aux2, rows, cols},             \
                                 y, y_stride, mt, act};                                          \
        stream_rows<M, 2>(job, x, mt, (rows + (blockDim.x >> 5) - 1) / (blockDim.x >> 5), early); \
    }
GATED_STREAM(gemv_gated_m1, 1, M1_MINB_GATED)
// m = 2 on a grid capped at what the GPU holds, each warp streaming its row groups as m = 1
// does: a block-per-group grid's warps own two rows and leave after one pass over them, so on
// large matrices its launch is mostly block turnover (docs/perf/2026-11-25-two-token-streams.md).
// Row groups of 2 rows, as gemv_m2's. The plain entry only where a single token's row groups
// are 2 rows too: Q8_0's measured 3-6 % slower than one block per group on the vocabularies.
// The host's `TypeKernels::stream` must agree.
#if M1_ROWS == 2
extern "C" __global__ void __launch_bounds__(256, 2) gemv_m2_stream(const GemvParams P) {
    stream_rows<2, 2>(PlainJob<2, 2>{P}, acts_of(P), P.m, P.blocks, P.early);
}
#endif
GATED_STREAM(gemv_gated_m2_stream, 2, 2)
// Where gemv_m1_norm leaves the residual stream and the next products' input.
struct NormOut {
    float* residual;       // rows f32, updated in place
    const float* weight;   // the next RMSNorm's weights
    float* xf;             // residual · weight, f32
    i8* q;                 // the same in the int8 format
    float4* qs;
    float* ssq;            // rows / 32 sums of squares of the residual
};
struct NormParams {
    GemvParams P;
    NormOut N;
};

#define QUANTIZED_ACTS (QTYPE != GGML_F32 && QTYPE != GGML_F16 && QTYPE != GGML_BF16)

#if QUANTIZED_ACTS
// The part of a one-token f32 input x that share `share` of `ks` blocks reads, quantized into
// shared memory at q and s in the scratch's layout (identical bits to quantize_act). Block
// `share` reads runs of 32 chunks (32·CV values: whole weight blocks of every type) j ≡ share
// (mod ks), so it quantizes those. A warp quantizes four groups (128 values, a float4 a lane)
// at a time, with up to 4 of them requested at once: one round trip for 8,192 values a block of
// 16 warps.
__device__ __forceinline__ void quantize_into_smem(const float* x, int cols, int share, int ks,
                                                   i8* q, float4* s) {
    constexpr int RUN = CV / 4;  // 4-group units per run
    constexpr int BATCH = QTYPE == GGML_Q3_K ? 1 : 4;  // Q3_K: more would spill
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int units = (cols + 127) / 128;
    for (int i0 = warp;; i0 += BATCH * nw) {
        float v[BATCH][4];
        int col[BATCH], unit = 0;
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            const int i = i0 + b * nw;
            unit = (i / RUN * ks + share) * RUN + i % RUN;
            col[b] = unit < units ? unit * 128 + 4 * lane : cols + 128;
            if (col[b] < cols) {
                ldcg4(x + col[b], v[b]);
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++) v[b][e] = 0.0f;
            }
        }
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            // Warp-uniform: the unit lies before the end of the row or not.
            if (col[b] - 4 * lane < cols) {
                float4 sums;
                const u32 levels = quantize_group<4>(v[b], lane, sums);
                if (col[b] < cols) {
                    store_levels<4>(q + col[b], levels);
                    if ((lane & 7) == 0) s[col[b] / 32] = sums;
                }
            }
        }
        // The units grow with i: none is left past the batch's last.
        if (unit >= units - 1) break;
    }
    __syncthreads();
}
#endif

// m = 1, the product that closes a decoder block (attention's or the FFN's output
// projection) with the residual add and the next RMSNorm folded in, so no norm launch sits
// between it and the products that read the norm. A block of 32 / M1_ROWS warps owns 32
// consecutive rows, one activation group of the next input; with too few groups to fill the
// GPU, a cluster of ksplit blocks (Hopper) shares them, block k taking every ksplit-th chunk
// from chunk k of each row. Each warp leaves its rows' sums in the first block's shared
// memory; after the barrier that block adds the rows to the residual and writes
// residual · weight (f32 and int8) and the group's sum of squares. Nothing crosses blocks or
// clusters. The division by the RMS is left to the readers (norm_scale): a positive factor
// does not change a group's int8 levels, only its scale, and every product is linear in it.
// KS = 1: one block per group (gemv_m1_norm), 0: clusters (gemv_m1_norm_split, Hopper only).
// QIN: the input is the f32 row P.xf, which each block quantizes itself into shared memory
// (quantize_into_smem, P.cols + P.cols / 2 bytes of dynamic shared memory) once the
// predecessor's writes are visible, so no quantize launch precedes the product
// (gemv_m1_norm_q, gemv_m1_norm_split_q).
template <int KS, bool QIN>
__device__ __forceinline__ void gemv_norm(const NormParams& Q) {
    const GemvParams& P = Q.P;
    const NormOut& N = Q.N;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 share = 0, group = blockIdx.x;
    if constexpr (KS == 0) {
        asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(share));
        asm("mov.u32 %0, %%clusterid.x;" : "=r"(group));
        // Announces that this block runs; its partners wait for that before writing to the
        // first block's shared memory.
        asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    }
    const int ks = KS == 1 ? 1 : P.ksplit;
    const int row0 = group * 32;
    const GemvPart& p = P.part[0];
    QMatrix mats[M1_ROWS];
    int rows[M1_ROWS];
#pragma unroll
    for (int r = 0; r < M1_ROWS; r++) {
        mats[r] = {p.data, p.aux, p.rows, P.cols};
        rows[r] = row0 + warp * M1_ROWS + r;
    }
    float acc[M1_ROWS][1], scale;
    if constexpr (QIN) {
#if QUANTIZED_ACTS
        extern __shared__ __align__(16) u8 act_smem[];
        i8* q = (i8*)act_smem;
        float4* qs = (float4*)(act_smem + P.cols);
        const auto ready = [&] { quantize_into_smem(P.xf, P.cols, share, ks, q, qs); };
        row_dots<1, M1_ROWS, KS>(mats, rows, SmemActs{q, qs}, 1, 32 * share + lane, 32 * ks,
                                 P.early, acc, scale, ready);
#endif
    } else {
        row_dots<1, M1_ROWS, KS>(mats, rows, acts_of(P), 1, 32 * share + lane, 32 * ks, P.early,
                                 acc, scale);
    }
    // The finishing warp's loads go out before the barrier.
    const bool finisher = share == 0 && warp == 0;
    const int row = row0 + lane;
    float res = 0.0f, g = 0.0f, bias = 0.0f;
    if (finisher) {
        res = N.residual[row];
        g = N.weight[row];
        if (p.bias) bias = p.bias[row];
    }
    float v[M1_ROWS];
#pragma unroll
    for (int r = 0; r < M1_ROWS; r++) v[r] = acc[r][0];
    constexpr int SH = 5 - Log2<M1_ROWS>::value;
    const float s = reduce_values<M1_ROWS>(v, lane) * scale;
    // part[share][row in the group], in the first block.
    __shared__ float part[4][32];
    const bool holder = (lane & ((1 << SH) - 1)) == 0;
    float* mine = &part[share][warp * M1_ROWS + (lane >> SH)];
    if constexpr (KS == 1) {
        if (holder) *mine = s;
        __syncthreads();
    } else {
        asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
        if (holder) {
            u32 remote;
            asm volatile("mapa.shared::cluster.u32 %0, %1, 0;"
                         : "=r"(remote)
                         : "r"((u32)__cvta_generic_to_shared(mine)));
            asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(s) : "memory");
        }
        asm volatile("barrier.cluster.arrive.release.aligned;\n"
                     "barrier.cluster.wait.acquire.aligned;" ::: "memory");
    }
    if (!finisher) return;
    float sum = part[0][lane];
    for (int k = 1; k < ks; k++) sum += part[k][lane];
    const float r = res + (sum + bias);
    N.residual[row] = r;
    const float val[1] = {r * g};
    N.xf[row] = val[0];
    float4 sums;
    store_levels<1>(N.q + row, quantize_group<1>(val, lane, sums));
    const float ss = warp_sum(r * r);
    if (lane == 0) {
        N.qs[group] = sums;
        N.ssq[group] = ss;
    }
}
extern "C" __global__ void __launch_bounds__(1024 / M1_ROWS, 1) gemv_m1_norm(const NormParams Q) {
    gemv_norm<1, false>(Q);
}
#if QUANTIZED_ACTS
extern "C" __global__ void __launch_bounds__(1024 / M1_ROWS, 1)
    gemv_m1_norm_q(const NormParams Q) {
    gemv_norm<1, true>(Q);
}
#endif
#if __CUDA_ARCH__ >= 900
extern "C" __global__ void __launch_bounds__(1024 / M1_ROWS, 1)
    gemv_m1_norm_split(const NormParams Q) {
    gemv_norm<0, false>(Q);
}
#if QUANTIZED_ACTS
extern "C" __global__ void __launch_bounds__(1024 / M1_ROWS, 1)
    gemv_m1_norm_split_q(const NormParams Q) {
    gemv_norm<0, true>(Q);
}
#endif
#endif
GEMV_ENTRIES(1, M1_ROWS, M1_MINB_SPLIT, M1_MINB_SPLIT == 4 ? 2 : M1_MINB_SPLIT, 0, _split)
GEMV_ENTRIES(2, 2, 2, 2, 1, )
GEMV_ENTRIES(4, 4, 1, 2, 1, )
GEMV_ENTRIES(8, 4, 1, 1, 1, )
GEMV_ENTRIES(16, 2, 1, 1, 1, )

#if (QTYPE == GGML_Q4_0 || QTYPE == GGML_Q4_K || QTYPE == GGML_Q6_K) && __CUDA_ARCH__ >= 800
// Batched products on tensor cores (m = 2..16 tokens, Q4_0, Q4_K and Q6_K rows of a multiple of
// 128 values; the int8 mma needs sm_80).
//
// The products above do an int8 dot per token and row and load each token's activations again
// for every weight chunk, so a 16-token product costs several times a 1-token one although both
// read the same weights. Here a warp multiplies 16 weight rows by 8 tokens with
// mma.sync.m16n8k32 (int8 in, int32 out), one 32-value block (Q4_0) or sub-block (Q4_K) of one
// scale per k-step (Q6_K: m16n8k16, its scales cover 16 values):
// - A (16 rows x 32 values): thread (g, t) holds values 4t..4t+3 (a0, a1) and 16+4t.. (a2, a3)
//   of rows g and g + 8: the nibbles of one word of the row's quants each (Q6_K: with two bits
//   of another), taken unsigned; which words and bits is the type's mma_a.
// - B (32 values x 8 tokens): words t and 4 + t of token g's int8 group (actq.cuh).
// - C holds each (row, token)'s exact sum of level · activation level over the k-step (|sum| ≤
//   16 · 63 · 127 < 2^22), which becomes f32 as in the dp4a products (Q4_0: y += d_w · (d_a · C
//   − 8 · d_a·Σq); Q4_K: y += d·sc · d_a · C − dmin·m · d_a·Σq). The mma adds the sum to the
//   bits of ACT_RAW_ZERO (1.5 · 2^23), which makes them the float 1.5 · 2^23 + sum, so one
//   subtraction converts it exactly, where the conversion unit runs at a quarter of the FP32
//   rate.
// A lane loads 16 bytes of a row at a time (the quad's row's 64 bytes of quants, four or eight
// k-steps) and a transpose inside the quad hands each lane its word of each 16 bytes; a token's
// 128 levels of a group come the same way (MmaActs), so each load reads whole 32-byte sectors
// and a group takes two loads a token tile, not eight. A block's 8 warps share its rows (MT
// tiles of 16; in the gated product the gate's and the up matrix's 16 rows) and take every 8th
// group of 128 values along the row; their sums meet in shared memory, where the block's
// threads add them up and store.
#define MMA_WARPS 8

// c = the bits of ACT_RAW_ZERO + A·B (see above), as floats.
__device__ __forceinline__ void mma_s8(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    u32 r[4];
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %10, %10, %10};"
        : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(ACT_RAW_ZERO));
#pragma unroll
    for (int i = 0; i < 4; i++) c[i] = __uint_as_float(r[i]);
}
// The same with 16-value k-steps (m16n8k16): a0 a1 rows g and g + 8, b0 values 4t..4t+3.
__device__ __forceinline__ void mma_s8_k16(float (&c)[4], const u32 (&a)[2], u32 b0) {
    u32 r[4];
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%7, %7, %7, %7};"
        : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
        : "r"(a[0]), "r"(a[1]), "r"(b0), "r"(ACT_RAW_ZERO));
#pragma unroll
    for (int i = 0; i < 4; i++) c[i] = __uint_as_float(r[i]);
}
#define MMA_RAW_ZERO 12582912.0f  // ACT_RAW_ZERO as a float

// Lane t of each quad holds words 0..3 of block t; afterwards v[j] is word t of block j. Two
// butterfly stages (partners t ^ 1, then t ^ 2), each swapping half of the words.
__device__ __forceinline__ void quad_transpose(u32 (&v)[4], int t) {
    const bool odd = t & 1, upper = t & 2;
#pragma unroll
    for (int k = 0; k < 4; k += 2) {
        const u32 y = __shfl_xor_sync(FULL_MASK, odd ? v[k] : v[k + 1], 1);
        if (odd) {
            v[k] = y;
        } else {
            v[k + 1] = y;
        }
    }
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const u32 y = __shfl_xor_sync(FULL_MASK, upper ? v[k] : v[k + 2], 2);
        if (upper) {
            v[k] = y;
        } else {
            v[k + 2] = y;
        }
    }
}

// Token g's levels of a group of 128 values as the lanes of quad t load them, 16 bytes at
// 16t and 64 + 16t (so each load reads the quad's token's 64 bytes whole), and after
// quad_transpose as the B fragments take them: v[h][i] is word 4·(i & 1) + t of block
// 2h + (i >> 1); s is the token's factors of block t, which the lanes of C's tokens take by
// shuffles (one load a group, where loading them per k-step read four tokens' lines a load).
#if QTYPE == GGML_Q6_K
typedef float4 MmaActScale;  // {d, d·Σq, the halves' d·Σq}
#else
typedef float2 MmaActScale;  // {d, d·Σq}
#endif
struct MmaActs {
    u32 v[2][4];
    MmaActScale s;
};
__device__ __forceinline__ void mma_acts_load(MmaActs& a, const Acts& x, u32 xq, u32 xs,
                                              int grp, int t) {
    const i8* q = x.q + xq + grp * 128;
    words(__ldg((const uint4*)q), a.v[0]);
    words(__ldg((const uint4*)(q + 64)), a.v[1]);
    a.s = __ldg((const MmaActScale*)(x.s + xs + 4 * grp + t));
}
__device__ __forceinline__ void mma_acts_ready(MmaActs& a, int t) {
    quad_transpose(a.v[0], t);
    quad_transpose(a.v[1], t);
}
// Word 4·hw + t of block blk.
__device__ __forceinline__ u32 mma_word(const MmaActs& a, int blk, int hw) {
    return a.v[blk >> 1][2 * (blk & 1) + hw];
}
// Value v of token 2t + i's factors of block blk (held by lane 4·(2t + i) + blk).
__device__ __forceinline__ float mma_factor(float v, int blk, int t, int i) {
    return __shfl_sync(FULL_MASK, v, 8 * t + 4 * i + blk);
}

// A 32-value k-step's B fragment (block blk: words t and 4 + t of token g) and the activation
// factors {d_a, d_a·Σq} of tokens 2t and 2t + 1.
struct MmaB32 {
    u32 b0, b1;
    float2 s0, s1;
};
__device__ __forceinline__ void mma_b(MmaB32& b, const MmaActs& a, int blk, int t) {
    b.b0 = mma_word(a, blk, 0);
    b.b1 = mma_word(a, blk, 1);
    b.s0 = make_float2(mma_factor(a.s.x, blk, t, 0), mma_factor(a.s.y, blk, t, 0));
    b.s1 = make_float2(mma_factor(a.s.x, blk, t, 1), mma_factor(a.s.y, blk, t, 1));
}
__device__ __forceinline__ void mma_mul(float (&c)[4], const u32 (&a)[4], const MmaB32& b) {
    mma_s8(c, a, b.b0, b.b1);
}
// The same for a 16-value k-step: half h of block blk (word 4h + t), the sums Σq of that half.
struct MmaB16 {
    u32 b0;
    float2 s0, s1;
};
#if QTYPE == GGML_Q6_K
__device__ __forceinline__ void mma_b(MmaB16& b, const MmaActs& a, int blk, int h, int t) {
    b.b0 = mma_word(a, blk, h);
    const float sum = h ? a.s.w : a.s.z;
    b.s0 = make_float2(mma_factor(a.s.x, blk, t, 0), mma_factor(sum, blk, t, 0));
    b.s1 = make_float2(mma_factor(a.s.x, blk, t, 1), mma_factor(sum, blk, t, 1));
}
#endif
__device__ __forceinline__ void mma_mul(float (&c)[4], const u32 (&a)[2], const MmaB16& b) {
    mma_s8_k16(c, a, b.b0);
}

// Per type, a row's weights for one group of 128 values (MmaRow), as a lane of quad t loads
// them (mma_load, 16 bytes at a time: "pseudo-block" t of four; `unit` is the row's first ggml
// block) and after mma_ready (quad_transpose: q[i] is word t of pseudo-block i); MMA_STEPS
// k-steps of MmaB's values; mma_b_of loads step j's B; mma_a gives step j's A fragment of rows
// g (r0) and g + 8 (r1); mma_scales step j's factors w of a row's sums and mma_term a sum's
// share of the product (C with ACT_RAW_ZERO, s = {d_a, d_a·Σq}).
#if QTYPE == GGML_Q4_0 || QTYPE == GGML_Q4_K
#define MMA_STEPS 4
typedef MmaB32 MmaB;
typedef u32 MmaA[4];
__device__ __forceinline__ void mma_b_of(MmaB& b, const MmaActs& a, int j, int t) {
    mma_b(b, a, j, t);
}
#endif
#if QTYPE == GGML_Q4_0
// Pseudo-block i is block 4·group + i; k-step j is block j: low nibbles values 0..15, high
// nibbles 16..31; the levels' offset of 8 is mma_term's.
struct MmaRow {
    u32 q[4];
    uint2 d;  // the four blocks' f16 scales
};
__device__ __forceinline__ void mma_load(MmaRow& r, const QMatrix& mat, u32 unit, int grp, int t) {
    const u32 blk = unit + grp * 4;
    words(ld_weights(mat.data + (size_t)(blk + t) * QB), r.q);
    r.d = ld_aux((const uint2*)((const u16*)mat.aux + blk));
}
__device__ __forceinline__ void mma_ready(MmaRow& r, int, int t) { quad_transpose(r.q, t); }
__device__ __forceinline__ void mma_a(const MmaRow& r0, const MmaRow& r1, int j, u32 (&a)[4]) {
    a[0] = r0.q[j] & 0x0F0F0F0Fu;
    a[1] = r1.q[j] & 0x0F0F0F0Fu;
    a[2] = (r0.q[j] >> 4) & 0x0F0F0F0Fu;
    a[3] = (r1.q[j] >> 4) & 0x0F0F0F0Fu;
}
__device__ __forceinline__ float mma_scales(const MmaRow& r, int j) {
    return f16_to_f32((u16)(((j < 2 ? r.d.x : r.d.y) >> (16 * (j & 1))) & 0xFFFFu));
}
__device__ __forceinline__ float mma_term(float d, float2 s, float c) {
    return d * (s.x * (c - MMA_RAW_ZERO) - 8.0f * s.y);
}
#elif QTYPE == GGML_Q4_K
// Q4_K: a group is half h of a superblock, its quant bytes 64h..64h+63 = chunks 2h and 2h + 1;
// pseudo-blocks 0 and 1 are chunk 2h's halves, 2 and 3 chunk 2h + 1's. K-step j is sub-block
// 4h + j: the low (j even) or high (j odd) nibbles of chunk 2h + j / 2, its words t (a0 a1) and
// 4 + t (a2 a3).
struct MmaRow {
    u32 q[4];
    // As loaded: d and dmin (f16), the 12 scale bytes; after mma_ready, y and z hold the four
    // sub-blocks' scales and mins as bytes.
    uint4 aux;
};
__device__ __forceinline__ void mma_load(MmaRow& r, const QMatrix& mat, u32 unit, int grp, int t) {
    const u32 sb = unit + (grp >> 1);
    words(ld_weights(mat.data + (size_t)sb * QB + 64 * (grp & 1) + 16 * t), r.q);
    r.aux = ld_aux((const uint4*)(mat.aux + (size_t)sb * AB));
}
// The 6-bit scales and mins of sub-blocks 4h..4h+3 (h = grp & 1), ggml's get_scale_min_k4 for
// four at once.
__device__ __forceinline__ void mma_ready(MmaRow& r, int grp, int t) {
    quad_transpose(r.q, t);
    const u32 y = r.aux.y, z = r.aux.z, w = r.aux.w;
    if (grp & 1) {
        r.aux.y = (w & 0x0F0F0F0Fu) | ((y >> 2) & 0x30303030u);
        r.aux.z = ((w >> 4) & 0x0F0F0F0Fu) | ((z >> 2) & 0x30303030u);
    } else {
        r.aux.y = y & 0x3F3F3F3Fu;
        r.aux.z = z & 0x3F3F3F3Fu;
    }
}
__device__ __forceinline__ void mma_a(const MmaRow& r0, const MmaRow& r1, int j, u32 (&a)[4]) {
    const int p = 2 * (j >> 1), sh = 4 * (j & 1);
    a[0] = (r0.q[p] >> sh) & 0x0F0F0F0Fu;
    a[1] = (r1.q[p] >> sh) & 0x0F0F0F0Fu;
    a[2] = (r0.q[p + 1] >> sh) & 0x0F0F0F0Fu;
    a[3] = (r1.q[p + 1] >> sh) & 0x0F0F0F0Fu;
}
// The sub-block's scale and min, d·sc and dmin·m.
__device__ __forceinline__ float2 mma_scales(const MmaRow& r, int j) {
    return make_float2(f16_to_f32((u16)(r.aux.x & 0xFFFFu)) * (float)byte_of(r.aux.y, j),
                       f16_to_f32((u16)(r.aux.x >> 16)) * (float)byte_of(r.aux.z, j));
}
__device__ __forceinline__ float mma_term(float2 w, float2 s, float c) {
    return w.x * (s.x * (c - MMA_RAW_ZERO)) - w.y * s.y;
}
#else
// Q6_K: a group is half n of a superblock: ql bytes 64n..64n+63 (the values' low four bits:
// pseudo-blocks 0..3), qh bytes 128 + 32n.. (their top two bits: pseudo-blocks 0 and 1, which
// lanes 2 and 3 load again), the scales 8n..8n+7 (int8, one per 16 values). K-step j = 2s + h
// is the 16 values 32s + 16h + i (i < 16) of the half, scale j: the nibble s >> 1 of ql bytes
// 32 (s & 1) + 16h + i and bits 2s, 2s + 1 of qh bytes 16h + i, activation group 4·grp + s,
// half h. Levels are 0..63 with an offset of 32.
#define MMA_STEPS 8
typedef MmaB16 MmaB;
typedef u32 MmaA[2];
__device__ __forceinline__ void mma_b_of(MmaB& b, const MmaActs& a, int j, int t) {
    mma_b(b, a, j >> 1, j & 1, t);
}
struct MmaRow {
    u32 ql[4], qh[4];
    uint2 sc;
    u32 d;  // the superblock's f16 scale
};
__device__ __forceinline__ void mma_load(MmaRow& r, const QMatrix& mat, u32 unit, int grp, int t) {
    const u32 sb = unit + (grp >> 1), n = grp & 1;
    const u8* blk = mat.data + (size_t)sb * QB;
    words(ld_weights(blk + 64 * n + 16 * t), r.ql);
    words(ld_weights(blk + 128 + 32 * n + 16 * (t & 1)), r.qh);
    r.sc = ld_aux((const uint2*)(mat.aux + (size_t)sb * AB + 8 * n));
    const size_t nblocks = (size_t)mat.rows * (size_t)(mat.cols / QK);
    r.d = ld_aux((const u16*)(mat.aux + nblocks * AB) + sb);
}
__device__ __forceinline__ void mma_ready(MmaRow& r, int, int t) {
    quad_transpose(r.ql, t);
    quad_transpose(r.qh, t);
}
__device__ __forceinline__ void mma_a(const MmaRow& r0, const MmaRow& r1, int j, u32 (&a)[2]) {
    const int s = j >> 1, h = j & 1, p = 2 * (s & 1) + h;
    const int lo = 4 * (s >> 1), hi = 2 * s;
    a[0] = ((r0.ql[p] >> lo) & 0x0F0F0F0Fu) | (((r0.qh[h] >> hi) & 0x03030303u) << 4);
    a[1] = ((r1.ql[p] >> lo) & 0x0F0F0F0Fu) | (((r1.qh[h] >> hi) & 0x03030303u) << 4);
}
__device__ __forceinline__ float mma_scales(const MmaRow& r, int j) {
    return f16_to_f32((u16)r.d) * (float)(i8)byte_of(j < 4 ? r.sc.x : r.sc.y, j & 3);
}
__device__ __forceinline__ float mma_term(float d, float2 s, float c) {
    return d * (s.x * (c - MMA_RAW_ZERO) - 32.0f * s.y);
}
#endif

// The sums of a block's rows: tile mt is rows row0[mt] + 0..15 of mat[mt] (rows past the
// matrix read its last row), times NT tiles of 8 tokens (tokens past m read token m − 1).
// acc[mt][nt] is this warp's share of the C fragment (c0 c1: row g, tokens 2t, 2t + 1; c2 c3:
// row g + 8), over its groups of 128 values; returns the input's norm_scale.
template <int NT, int MT>
__device__ __forceinline__ float mma_tiles(const QMatrix (&mat)[MT], const int (&row0)[MT],
                                           const Acts& x, int m, int early,
                                           float (&acc)[MT][NT][4]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    // Activation groups (32 values) per token; groups of 128 values (four k-steps) per row.
    const int agroups = x.cols / 32, groups = x.cols / 128;
    // Offsets from the matrices and the activations, 32-bit to save registers (a matrix has
    // fewer than 2^32 blocks): the first block of each of the lane's rows, the first level of its
    // token of B and the first group of its token's factors.
    u32 rblk[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            rblk[mt][h] = (u32)min(row0[mt] + g + 8 * h, mat[mt].rows - 1) * (x.cols / QK);
        }
    }
    u32 xq[NT], xs[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        xq[nt] = (u32)min(8 * nt + g, m - 1) * x.cols + 16 * t;
        xs[nt] = (u32)min(8 * nt + g, m - 1) * agroups;
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.0f;
        }
    }
    MmaRow cur[MT][2], next[MT][2];
    auto load = [&](MmaRow(&r)[MT][2], int grp) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int h = 0; h < 2; h++) mma_load(r[mt][h], mat[mt], rblk[mt][h], grp, t);
        }
    };
    start_product(early, [&] {
        if (warp < groups) load(cur, warp);
    });
    const float scale = norm_scale(x);
    for (int grp = warp; grp < groups; grp += MMA_WARPS) {
        MmaActs acts[NT];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) mma_acts_load(acts[nt], x, xq[nt], xs[nt], grp, t);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int h = 0; h < 2; h++) mma_ready(cur[mt][h], grp, t);
        }
        if (grp + MMA_WARPS < groups) load(next, grp + MMA_WARPS);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) mma_acts_ready(acts[nt], t);
#pragma unroll
        for (int j = 0; j < MMA_STEPS; j++) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                MmaB b;
                mma_b_of(b, acts[nt], j, t);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    MmaA a;
                    mma_a(cur[mt][0], cur[mt][1], j, a);
                    float c[4];
                    mma_mul(c, a, b);
                    const auto w0 = mma_scales(cur[mt][0], j), w1 = mma_scales(cur[mt][1], j);
                    acc[mt][nt][0] += mma_term(w0, b.s0, c[0]);
                    acc[mt][nt][1] += mma_term(w0, b.s1, c[1]);
                    acc[mt][nt][2] += mma_term(w1, b.s0, c[2]);
                    acc[mt][nt][3] += mma_term(w1, b.s1, c[3]);
                }
            }
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int h = 0; h < 2; h++) cur[mt][h] = next[mt][h];
        }
    }
    return scale;
}

// Leaves each warp's fragments in red[warp][e][lane], e = (mt · NT + nt) · 4 + i, and waits for
// the block's other warps to do the same.
template <int NT, int MT>
__device__ __forceinline__ void mma_gather(const float (&acc)[MT][NT][4],
                                           float (&red)[MMA_WARPS][MT * NT * 4][32]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int i = 0; i < 4; i++) red[warp][(mt * NT + nt) * 4 + i][lane] = acc[mt][nt][i];
        }
    }
    __syncthreads();
}

// The (row in the block's tiles, token) of fragment value e = (mt · NT + nt) · 4 + i of lane l.
template <int NT>
__device__ __forceinline__ int2 mma_coords(int e, int l) {
    const int i = e & 3, nt = (e >> 2) % NT, mt = (e >> 2) / NT;
    return make_int2(16 * mt + (l >> 2) + 8 * (i >> 1), 8 * nt + 2 * (l & 3) + (i & 1));
}

// Plain product (modes as gemv_plain): block b of its part owns rows 16·MT·b.. of it.
template <int NT, int MT>
__device__ __forceinline__ void gemv_mma_plain(const GemvParams& P) {
    const GemvPart& p = part_of(P, blockIdx.x);
    const int row0 = ((int)blockIdx.x - p.first_block) * 16 * MT;
    QMatrix mats[MT];
    int rows[MT];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        mats[mt] = {p.data, p.aux, p.rows, P.cols};
        rows[mt] = row0 + 16 * mt;
    }
    float acc[MT][NT][4];
    const float scale = mma_tiles<NT, MT>(mats, rows, acts_of(P), P.m, P.early, acc);
    constexpr int E = MT * NT * 4;
    __shared__ float red[MMA_WARPS][E][32];
    mma_gather<NT, MT>(acc, red);
    for (int o = threadIdx.x; o < E * 32; o += blockDim.x) {
        const int e = o >> 5, l = o & 31;
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < MMA_WARPS; k++) s += red[k][e][l];
        const int2 rt = mma_coords<NT>(e, l);
        const int row = row0 + rt.x;
        if (rt.y < P.m && row < p.rows) {
            store_plain(p.y + (size_t)rt.y * p.y_stride + row, P.mode, s * scale, p.bias, row);
        }
    }
}

// Gated product: block b owns output rows 16b.., tile 0 the gate's rows and tile 1 the up
// matrix's.
template <int NT>
__device__ __forceinline__ void gemv_mma_gated(const QMatrix& gate, const QMatrix& up,
                                               const Acts& x, int m, float* __restrict__ y,
                                               int y_stride, int act, int early) {
    const int row0 = blockIdx.x * 16;
    const QMatrix mats[2] = {gate, up};
    const int rows[2] = {row0, row0};
    float acc[2][NT][4];
    const float scale = mma_tiles<NT, 2>(mats, rows, x, m, early, acc);
    constexpr int E = 2 * NT * 4;
    __shared__ float red[MMA_WARPS][E][32];
    mma_gather<NT, 2>(acc, red);
    for (int o = threadIdx.x; o < E / 2 * 32; o += blockDim.x) {
        const int e = o >> 5, l = o & 31;
        float sg = 0.0f, su = 0.0f;
#pragma unroll
        for (int k = 0; k < MMA_WARPS; k++) {
            sg += red[k][e][l];
            su += red[k][e + E / 2][l];
        }
        const int2 rt = mma_coords<NT>(e, l);
        const int row = row0 + rt.x;
        if (rt.y < m && row < gate.rows) {
            y[(size_t)rt.y * y_stride + row] = activate(act, sg * scale) * (su * scale);
        }
    }
}

// Entries per tiles of 8 tokens: 16 rows a block; 32 rows a block and the gated product where
// they fit the registers (Q6_K's spill: its rows keep twice the words in flight).
#define MMA_R16(NT)                                                                              \
    extern "C" __global__ void __launch_bounds__(256, 2)                                         \
        gemv_mma_n##NT##_r16(const GemvParams P) {                                               \
        gemv_mma_plain<NT, 1>(P);                                                                \
    }
#define MMA_R32_GATED(NT)                                                                        \
    extern "C" __global__ void __launch_bounds__(256, 2)                                         \
        gemv_mma_n##NT##_r32(const GemvParams P) {                                               \
        gemv_mma_plain<NT, 2>(P);                                                                \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(256, 2) gemv_gated_mma_n##NT(                   \
        const u8* __restrict__ data, const u8* __restrict__ aux, int rows, int cols,            \
        const u8* __restrict__ data2, const u8* __restrict__ aux2, const i8* __restrict__ aq,   \
        const float4* __restrict__ as, const float* __restrict__ xf, int x_stride, int m,       \
        float* __restrict__ y, int y_stride, int act, int ksplit, int early,                     \
        const float* __restrict__ ssq, float eps) {                                              \
        const Acts x = {aq, as, xf, cols, x_stride, ssq, eps};                                   \
        gemv_mma_gated<NT>({data, aux, rows, cols}, {data2, aux2, rows, cols}, x, m, y, y_stride, \
                           act, early);                                                          \
    }
MMA_R16(1)
MMA_R16(2)
#if QTYPE != GGML_Q6_K
MMA_R32_GATED(1)
MMA_R32_GATED(2)
#endif
#endif

#endif
