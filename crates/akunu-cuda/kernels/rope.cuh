// RoPE of one head row, shared by qk_rope_store (rope.cu) and decode attention (flash.cu).
// Angles follow the CPU backend: the f32 product position * inv_freq[i], then its sine and
// cosine to f32 accuracy (computed in f64: fast-math sinf would be far off for large angles).
#pragma once
#include "common.cuh"

// cos and sin of pair i at `pos`, whose frequency is `freq`, into cs[2i] and cs[2i + 1].
__device__ __forceinline__ void rope_angle(float* cs, u32 i, u32 pos, float freq) {
    double s, c;
    sincos((double)((float)pos * freq), &s, &c);
    cs[2 * i] = (float)c;
    cs[2 * i + 1] = (float)s;
}

// Element e (< n_rot) of a head row after RoPE: `hb` holds the row before it, `cs` the angles
// of its pairs. NeoX pairs split halves (i, i + n_rot / 2), the normal style adjacent elements.
__device__ __forceinline__ float rope_element(const float* hb, const float* cs, u32 e, u32 n_rot, bool neox) {
    const u32 half = n_rot / 2;
    u32 i, a, b;
    if (neox) {
        i = e < half ? e : e - half;
        a = i;
        b = i + half;
    } else {
        i = e / 2;
        a = 2 * i;
        b = 2 * i + 1;
    }
    const float c = cs[2 * i], s = cs[2 * i + 1];
    return e == a ? hb[a] * c - hb[b] * s : hb[a] * s + hb[b] * c;
}
