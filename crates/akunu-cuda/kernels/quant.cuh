// Device layout of weight matrices and the per-type dequantizer of 32 elements.
// Compiled per weight type with -DQTYPE=<ggml type code>.
//
// A matrix has `rows` rows of `cols` elements; row r is cols/QK ggml blocks, and block b of
// row r is block i = r*(cols/QK) + b of the matrix (N = rows*cols/QK blocks in all). At upload
// each ggml block is split into two planes so that the bulk of it is 16-byte aligned:
//   data: N * QB bytes, block i at data + i*QB (the quants; QB is a multiple of 16)
//   aux:  N * AB bytes, block i at aux + i*AB  (scales and other small fields; may be null)
// Per type (ggml field order in brackets, bytes):
//   Q4_0, IQ4_NL  data qs[16]                     aux d[2]
//   Q4_1          data qs[16]                     aux d[2] m[2]
//   Q5_0          data qs[16]                     aux d[2] 0[2] qh[4]
//   Q5_1          data qs[16]                     aux d[2] m[2] qh[4]
//   Q8_0          data qs[32]                     aux d[2]
//   Q2_K          data scales[16] qs[64]          aux d[2] dmin[2]
//   Q3_K          data hmask[32] qs[64]           aux scales[12] d[2] 0[2]
//   Q4_K          data qs[128]                    aux d[2] dmin[2] scales[12]
//   Q5_K          data qh[32] qs[128]             aux d[2] dmin[2] scales[12]
//   Q6_K          data ql[128] qh[64]             aux scales[16]; then a second plane of
//                                                 d[2] per block at aux + N*16
//   IQ4_XS        data qs[128]                    aux d[2] scales_h[2] scales_l[4]
//   F32, F16, BF16  data = the rows as stored (QK = 1), no aux.
// Every field keeps ggml's bytes, so ggml's bit layout inside each field holds.
#pragma once
#include "common.cuh"

#define GGML_F32 0
#define GGML_F16 1
#define GGML_Q4_0 2
#define GGML_Q4_1 3
#define GGML_Q5_0 6
#define GGML_Q5_1 7
#define GGML_Q8_0 8
#define GGML_Q2_K 10
#define GGML_Q3_K 11
#define GGML_Q4_K 12
#define GGML_Q5_K 13
#define GGML_Q6_K 14
#define GGML_IQ4_NL 20
#define GGML_IQ4_XS 23
#define GGML_BF16 30

#ifndef QTYPE
#error "quant.cuh needs -DQTYPE=<ggml type code>"
#endif

#if QTYPE == GGML_Q4_0 || QTYPE == GGML_IQ4_NL
#define QK 32
#define QB 16
#define AB 2
#elif QTYPE == GGML_Q4_1
#define QK 32
#define QB 16
#define AB 4
#elif QTYPE == GGML_Q5_0 || QTYPE == GGML_Q5_1
#define QK 32
#define QB 16
#define AB 8
#elif QTYPE == GGML_Q8_0
#define QK 32
#define QB 32
#define AB 2
#elif QTYPE == GGML_Q2_K
#define QK 256
#define QB 80
#define AB 4
#elif QTYPE == GGML_Q3_K
#define QK 256
#define QB 96
#define AB 16
#elif QTYPE == GGML_Q4_K
#define QK 256
#define QB 128
#define AB 16
#elif QTYPE == GGML_Q5_K
#define QK 256
#define QB 160
#define AB 16
#elif QTYPE == GGML_Q6_K
#define QK 256
#define QB 192
#define AB 16
#elif QTYPE == GGML_IQ4_XS
#define QK 256
#define QB 128
#define AB 8
#elif QTYPE == GGML_F32
#define QK 1
#define QB 4
#define AB 0
#elif QTYPE == GGML_F16 || QTYPE == GGML_BF16
#define QK 1
#define QB 2
#define AB 0
#else
#error "unsupported QTYPE"
#endif

struct QMatrix {
    const u8* data;
    const u8* aux;
    int rows;
    int cols;
};

// Index of block b of row `row` among the matrix's blocks.
__device__ __forceinline__ size_t qblock(const QMatrix& m, int row, int b) {
    return (size_t)row * (size_t)(m.cols / QK) + (size_t)b;
}

__device__ __forceinline__ u32 byte_of(u32 w, int i) { return (w >> (8 * i)) & 0xFFu; }

// Byte idx (0..12, may vary per thread) of the 12 bytes w0, w1, w2, without local memory.
__device__ __forceinline__ u32 byte12(u32 w0, u32 w1, u32 w2, int idx) {
    return byte_of(idx < 4 ? w0 : (idx < 8 ? w1 : w2), idx & 3);
}

// The 16 levels of IQ4_NL / IQ4_XS (ggml's kvalues_iq4nl) as four little-endian words of
// signed bytes.
#define IQ4_T0 0xBFAD9881u
#define IQ4_T1 0xF6EADDCFu
#define IQ4_T2 0x26190D01u
#define IQ4_T3 0x71594535u

__device__ __forceinline__ int iq4_level(u32 nibble) {
    const u32 w = __byte_perm(nibble & 8u ? IQ4_T2 : IQ4_T0, nibble & 8u ? IQ4_T3 : IQ4_T1,
                              nibble & 7u);
    return (int)(i8)(w & 0xFFu);
}

// Writes out[0..16) from the low nibbles and out[16..32) from the high nibbles of 16 bytes
// (the Q4_0 order), mapping each nibble through `f`.
template <typename F>
__device__ __forceinline__ void unpack_nibbles32(uint4 q, float* out, F f) {
    const u32 w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const u32 v = byte_of(w[k], b);
            out[4 * k + b] = f(v & 15u, 4 * k + b);
            out[16 + 4 * k + b] = f(v >> 4, 16 + 4 * k + b);
        }
    }
}

// The 6-bit scale and min of sub-block j (0..8) of a Q4_K/Q5_K block (ggml's
// get_scale_min_k4); w0..w2 hold the 12 scale bytes.
__device__ __forceinline__ void scale_min_k4(int j, u32 w0, u32 w1, u32 w2, float& sc,
                                             float& mn) {
    if (j < 4) {
        sc = (float)(byte12(w0, w1, w2, j) & 63u);
        mn = (float)(byte12(w0, w1, w2, j + 4) & 63u);
    } else {
        const u32 s4 = byte12(w0, w1, w2, j + 4);
        sc = (float)((s4 & 0xFu) | ((byte12(w0, w1, w2, j - 4) >> 6) << 4));
        mn = (float)((s4 >> 4) | ((byte12(w0, w1, w2, j) >> 6) << 4));
    }
}

// Elements [32*g, 32*g + 32) of row `row`, dequantized to f32 exactly as ggml does.
__device__ __forceinline__ void dequant32(const QMatrix& m, int row, int g, float* out) {
#if QTYPE == GGML_F32
    const float4* p = (const float4*)(m.data + ((size_t)row * m.cols + (size_t)g * 32) * 4);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const float4 v = __ldg(p + k);
        out[4 * k] = v.x;
        out[4 * k + 1] = v.y;
        out[4 * k + 2] = v.z;
        out[4 * k + 3] = v.w;
    }
#elif QTYPE == GGML_F16 || QTYPE == GGML_BF16
    const uint4* p = (const uint4*)(m.data + ((size_t)row * m.cols + (size_t)g * 32) * 2);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint4 v = __ldg(p + k);
        const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
#if QTYPE == GGML_F16
            out[8 * k + 2 * i] = f16_to_f32((u16)(w[i] & 0xFFFFu));
            out[8 * k + 2 * i + 1] = f16_to_f32((u16)(w[i] >> 16));
#else
            out[8 * k + 2 * i] = bf16_to_f32((u16)(w[i] & 0xFFFFu));
            out[8 * k + 2 * i + 1] = bf16_to_f32((u16)(w[i] >> 16));
#endif
        }
    }
#elif QTYPE == GGML_Q4_0 || QTYPE == GGML_IQ4_NL || QTYPE == GGML_Q4_1
    const size_t i = qblock(m, row, g);
    const uint4 q = __ldg((const uint4*)(m.data + i * QB));
#if QTYPE == GGML_Q4_1
    const u32 dm = __ldg((const u32*)(m.aux + i * AB));
    const float d = f16_to_f32((u16)(dm & 0xFFFFu));
    const float mn = f16_to_f32((u16)(dm >> 16));
    unpack_nibbles32(q, out, [&](u32 v, int) { return d * (float)v + mn; });
#else
    const float d = f16_to_f32(__ldg((const u16*)(m.aux + i * AB)));
#if QTYPE == GGML_Q4_0
    unpack_nibbles32(q, out, [&](u32 v, int) { return d * (float)((int)v - 8); });
#else
    unpack_nibbles32(q, out, [&](u32 v, int) { return d * (float)iq4_level(v); });
#endif
#endif
#elif QTYPE == GGML_Q5_0 || QTYPE == GGML_Q5_1
    const size_t i = qblock(m, row, g);
    const uint4 q = __ldg((const uint4*)(m.data + i * QB));
    const uint2 a = __ldg((const uint2*)(m.aux + i * AB));
    const float d = f16_to_f32((u16)(a.x & 0xFFFFu));
    const u32 qh = a.y;
#if QTYPE == GGML_Q5_1
    const float mn = f16_to_f32((u16)(a.x >> 16));
    unpack_nibbles32(q, out, [&](u32 v, int j) {
        return d * (float)(v | (((qh >> j) & 1u) << 4)) + mn;
    });
#else
    unpack_nibbles32(q, out, [&](u32 v, int j) {
        return d * (float)((int)(v | (((qh >> j) & 1u) << 4)) - 16);
    });
#endif
#elif QTYPE == GGML_Q8_0
    const size_t i = qblock(m, row, g);
    const float d = f16_to_f32(__ldg((const u16*)(m.aux + i * AB)));
    const int4* p = (const int4*)(m.data + i * QB);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int4 v = __ldg(p + h);
        const int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
#pragma unroll
            for (int b = 0; b < 4; b++) out[16 * h + 4 * k + b] = d * (float)(i8)byte_of((u32)w[k], b);
        }
    }
#elif QTYPE == GGML_Q2_K
    // Group g is elements 32j.. of block b: quant byte 32n + l (n = j/4) at bit 2*(j%4);
    // sub-blocks 2j and 2j+1 of 16.
    const int j = g & 7;
    const size_t i = qblock(m, row, g >> 3);
    const u8* blk = m.data + i * QB;
    const u32 dd = __ldg((const u32*)(m.aux + i * AB));
    const float d = f16_to_f32((u16)(dd & 0xFFFFu));
    const float dmin = f16_to_f32((u16)(dd >> 16));
    const u32 sc2 = __ldg((const u16*)(blk + 2 * j));
    const int shift = 2 * (j & 3);
    const uint4* qp = (const uint4*)(blk + 16 + 32 * (j >> 2));
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint4 v = __ldg(qp + h);
        const u32 w[4] = {v.x, v.y, v.z, v.w};
        const u32 sc = byte_of(sc2, h);
        const float dl = d * (float)(sc & 15u);
        const float ml = dmin * (float)(sc >> 4);
#pragma unroll
        for (int k = 0; k < 4; k++) {
#pragma unroll
            for (int b = 0; b < 4; b++) {
                out[16 * h + 4 * k + b] = dl * (float)((byte_of(w[k], b) >> shift) & 3u) - ml;
            }
        }
    }
#elif QTYPE == GGML_Q3_K
    // As Q2_K for the low two bits; bit j of hmask[l] is the high bit (set: no −4 offset).
    const int j = g & 7;
    const size_t i = qblock(m, row, g >> 3);
    const u8* blk = m.data + i * QB;
    const uint4 a = __ldg((const uint4*)(m.aux + i * AB));
    const float d = f16_to_f32((u16)(a.w & 0xFFFFu));
    const int shift = 2 * (j & 3);
    const uint4* qp = (const uint4*)(blk + 32 + 32 * (j >> 2));
    const uint4* hp = (const uint4*)blk;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint4 v = __ldg(qp + h);
        const uint4 hv = __ldg(hp + h);
        const u32 w[4] = {v.x, v.y, v.z, v.w};
        const u32 hw[4] = {hv.x, hv.y, hv.z, hv.w};
        const int sub = 2 * j + h;
        const int low = (int)(sub < 8 ? (byte12(a.x, a.y, a.z, sub) & 15u)
                                      : (byte12(a.x, a.y, a.z, sub - 8) >> 4));
        const int high = (int)((byte_of(a.z, sub & 3) >> (2 * (sub >> 2))) & 3u);
        const float dl = d * (float)((low | (high << 4)) - 32);
#pragma unroll
        for (int k = 0; k < 4; k++) {
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int lo = (int)((byte_of(w[k], b) >> shift) & 3u);
                const int hb = (int)((byte_of(hw[k], b) >> j) & 1u);
                out[16 * h + 4 * k + b] = dl * (float)(lo - (hb ? 0 : 4));
            }
        }
    }
#elif QTYPE == GGML_Q4_K || QTYPE == GGML_Q5_K
    // Group g is sub-block j of block b: quant bytes 32*(j/2).. , low nibble for even j.
    const int j = g & 7;
    const size_t i = qblock(m, row, g >> 3);
    const uint4 a = __ldg((const uint4*)(m.aux + i * AB));
    float sc, mn;
    scale_min_k4(j, a.y, a.z, a.w, sc, mn);
    const float dl = f16_to_f32((u16)(a.x & 0xFFFFu)) * sc;
    const float ml = f16_to_f32((u16)(a.x >> 16)) * mn;
    const int shift = 4 * (j & 1);
#if QTYPE == GGML_Q5_K
    const u8* blk = m.data + i * QB;
    const uint4* qp = (const uint4*)(blk + 32 + 32 * (j >> 1));
    const uint4* hp = (const uint4*)blk;
#else
    const uint4* qp = (const uint4*)(m.data + i * QB + 32 * (j >> 1));
#endif
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint4 v = __ldg(qp + h);
        const u32 w[4] = {v.x, v.y, v.z, v.w};
#if QTYPE == GGML_Q5_K
        const uint4 hv = __ldg(hp + h);
        const u32 hw[4] = {hv.x, hv.y, hv.z, hv.w};
#endif
#pragma unroll
        for (int k = 0; k < 4; k++) {
#pragma unroll
            for (int b = 0; b < 4; b++) {
                u32 q = (byte_of(w[k], b) >> shift) & 15u;
#if QTYPE == GGML_Q5_K
                q |= ((byte_of(hw[k], b) >> j) & 1u) << 4;
#endif
                out[16 * h + 4 * k + b] = dl * (float)q - ml;
            }
        }
    }
#elif QTYPE == GGML_Q6_K
    // Group g is part p = j%4 of 128-element half n = j/4: ql bytes 64n + 32*(p&1) (low
    // nibble for p < 2), qh bytes 128 + 32n at bit 2p, scales 8n + l/16 + 2p.
    const int j = g & 7;
    const int n = j >> 2, p = j & 3;
    const int b0 = g >> 3;
    const size_t i = qblock(m, row, b0);
    const size_t nblocks = (size_t)m.rows * (size_t)(m.cols / QK);
    const u8* blk = m.data + i * QB;
    const float d = f16_to_f32(__ldg((const u16*)(m.aux + nblocks * AB) + i));
    const uint2 sc8 = __ldg((const uint2*)(m.aux + i * AB + 8 * n));
    const uint4* qp = (const uint4*)(blk + 64 * n + 32 * (p & 1));
    const uint4* hp = (const uint4*)(blk + 128 + 32 * n);
    const int qshift = 4 * (p >> 1);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint4 v = __ldg(qp + h);
        const uint4 hv = __ldg(hp + h);
        const u32 w[4] = {v.x, v.y, v.z, v.w};
        const u32 hw[4] = {hv.x, hv.y, hv.z, hv.w};
        const int si = h + 2 * p;
        const float dl = d * (float)(i8)byte_of(si < 4 ? sc8.x : sc8.y, si & 3);
#pragma unroll
        for (int k = 0; k < 4; k++) {
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int q = (int)(((byte_of(w[k], b) >> qshift) & 15u) |
                                    (((byte_of(hw[k], b) >> (2 * p)) & 3u) << 4));
                out[16 * h + 4 * k + b] = dl * (float)(q - 32);
            }
        }
    }
#elif QTYPE == GGML_IQ4_XS
    const int j = g & 7;
    const size_t i = qblock(m, row, g >> 3);
    const uint2 a = __ldg((const uint2*)(m.aux + i * AB));
    const int ls = (int)(((a.y >> (4 * j)) & 15u) | (((a.x >> (16 + 2 * j)) & 3u) << 4));
    const float d = f16_to_f32((u16)(a.x & 0xFFFFu)) * (float)(ls - 32);
    const uint4 q = __ldg((const uint4*)(m.data + i * QB + 16 * j));
    unpack_nibbles32(q, out, [&](u32 v, int) { return d * (float)iq4_level(v); });
#endif
}
