// A decode chain's device state, advanced by whichever kernel chooses the token (the argmax,
// the sampler, or the output product with its argmax: gemv.cu's gemv_m1_argmax).
#pragma once
#include "common.cuh"

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
