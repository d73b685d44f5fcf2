// A decode chain's device state, advanced by whichever kernel chooses the token (the argmax,
// the sampler, or the output product with its argmax: gemv.cu's gemv_m1_argmax), and the key
// that ranks candidate tokens for both.
#pragma once
#include "common.cuh"

// Keys: the logit's bits mapped to an unsigned order (-0 read as +0, as the CPU compares them
// equal) above the inverted id, so a larger key ranks first and every key is distinct.
__device__ __forceinline__ u32 ord_of(float l) {
    u32 b = __float_as_uint(l);
    if (b == 0x80000000u) b = 0;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float val_of_ord(u32 o) {
    return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}
__device__ __forceinline__ u64 make_key(float l, u32 id) {
    return ((u64)ord_of(l) << 32) | (u64)(~id);
}
__device__ __forceinline__ float key_val(u64 k) { return val_of_ord((u32)(k >> 32)); }
__device__ __forceinline__ u32 key_id(u64 k) { return ~(u32)k; }

// Where a decode chain keeps its state (one row; greedy or sampled): the token chosen is also
// appended to out[*count] and positions[0] moves on, so the captured step replays for the next
// token.
struct Chain {
    u32* positions;
    u32* out;
    u32* count;
};

// A row's token into *out, and into the chain where there is one.
__device__ __forceinline__ void record(u32* out, u32 token, const Chain& chain) {
    *out = token;
    if (chain.out) {
        const u32 i = *chain.count;
        chain.out[i] = token;
        chain.positions[0] += 1;
        *chain.count = i + 1;
    }
}
