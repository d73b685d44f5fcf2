// Chain decode bookkeeping, run after the token of a decode step has been chosen on the device
// (written to tokens[0]): records it as the chain's next output and moves the position on, so
// the same captured graph can be replayed for the next token. One thread.
#include "common.cuh"

extern "C" __global__ void chain_advance(const u32* tokens, u32* positions, u32* out, u32* counter) {
    pdl_begin();
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        u32 i = *counter;
        out[i] = tokens[0];
        positions[0] += 1;
        *counter = i + 1;
    }
}
