// Token selection on the device: the argmax of a row of logits, and llama.cpp's sampler chain
// (penalties -> top-k -> top-p -> min-p -> temperature -> a seeded draw) with the semantics of
// akunu_core::sampling, so decode picks its next token without the host seeing the logits.
//
// Every kernel splits a row over a grid of blocks (blockIdx.x = slice, blockIdx.y = row). Each
// block reduces its slice and leaves a partial in scratch memory; the last block of the row to
// finish (a ticket taken after a __threadfence) reduces the partials and resets the ticket, so
// no launch needs another to clean up and a CUDA graph can replay them.
//
// Sampler, per row (sample_f32):
//   1. every block applies the repeat/frequency/presence penalties to the tokens of its slice
//      that are in the penalty window (a device ring buffer), in place, with the CPU's exact
//      f32 operations; then reduces its slice: raw argmax, largest and smallest usable logit.
//   2. fast path (0 < top_k <= KMAX, top_k < n): each block selects its slice's top-k and
//      writes them out sorted; the last block merges the lists' heads into the row's sorted
//      top-k with one warp (or, where a list gives more than its staged head, selects over
//      the whole lists and sorts), and cuts top-p / min-p on the sorted list, as the CPU does
//      with a small top-k.
//   3. exact path (top-k off or large): with `helpers`, sample_exact_hist histograms the row
//      by logit below the maximum (count and mass per bin, all blocks), which locates the
//      top-k and top-p cuts to a few bins, and sample_exact_draw draws from the tokens above
//      those bins while gathering the tokens in them, whose last block finds the exact cuts
//      and finishes the draw. Without helpers the last block of sample_f32 does it all alone
//      (exact but slow), as sample_exact_draw does when too many tokens share the cut's bins.
//   4. the draw is Gumbel-max: argmax over the survivors of (l - max) / T + Gumbel noise, the
//      noise from Philox-4x32-10 keyed by the seed, counted by (token id, step), so the draw is
//      one parallel pass and the same seed gives the same tokens.
//   5. the block that draws writes the token (into a decode chain too, as the argmax does),
//      appends it to the ring and advances the step.
//
// Selection ("the threshold key of the best `need` tokens", or "of the shortest best prefix
// holding a given probability mass") is a histogram search: keys are (logit, ~id) packed into
// 64 bits, so key order is the CPU's rank order (logit descending, then id ascending). A first
// histogram bins the logits below a reference into NBIN linear bins; the bin where the count
// (or mass) crosses the goal is refined by radix passes over the key bits until it holds at
// most CAPC tokens, which are gathered, sorted and walked. Masses are summed in 2^-40 fixed
// point (64-bit integer atomics), exact far below the f32 weights' own rounding.
#include "chain.cuh"

#define SAMPLE_THREADS 512
#define SAMPLE_WARPS (SAMPLE_THREADS / WARP)
#define ARGMAX_THREADS 256
// Largest top-k served by the per-block lists; larger ones take the exact path.
#define KMAX 128
// Most blocks per row of the sampler (the scratch holds this many partials and lists).
#define MAX_SPLITS 64
// List keys staged per thread in the threshold search: MAX_SPLITS * KMAX / SAMPLE_THREADS.
#define LIST_REGS 16
// Entries of each block's sorted list that the last block stages for its merge (dynamic shared
// memory of at least MERGE_HEAD * MAX_SPLITS keys, src/sample.rs), and per thread.
#define MERGE_HEAD 32
#define HEAD_REGS (MERGE_HEAD * MAX_SPLITS / SAMPLE_THREADS)
#define NBIN 256
// Tokens gathered and sorted once a histogram bin is small enough.
#define CAPC 256
// Bins of the exact path's row histogram, and most tokens it gathers from the cut's bins.
#define NB2 512
#define CAPG 4096
#define MASS_SCALE 1099511627776.0

#define F32_MAX 3.402823466e38f
#define F32_INF __int_as_float(0x7f800000)
// exp_nonpositive flushes below this to 0; such tokens can never be drawn on the CPU.
#define EXP_FLOOR (-87.3f)

// Per-row sampling parameters, written by the host once per generation (src/sample.rs).
struct SampleParams {
    float temperature;
    float top_p;
    float min_p_ln;  // ln(min_p), -inf when min-p is off
    float repeat_penalty;
    float frequency_penalty;
    float presence_penalty;
    u32 top_k;
    u32 window;    // penalty_last_n: the ring's length
    u32 penalize;  // whether the penalties change anything
    u32 seed_lo;
    u32 seed_hi;
    u32 pad[5];
};

// Per-row state that persists across launches (src/sample.rs). The tickets count the blocks
// of the current launch of each kernel that have finished; 0 between launches.
struct RowState {
    u32 step_lo;
    u32 step_hi;
    u32 ring_pos;  // next slot of the ring to write
    u32 ring_len;  // valid entries of the ring
    u32 ticket;
    u32 ticket_hist;
    u32 ticket_draw;
    u32 pad;
};

// One block's summary of its slice.
struct Partial {
    float max_raw;  // largest logit, NaN skipped, +inf kept
    u32 arg;        // its lowest index, ~0 when the slice is all NaN
    float max_v;    // largest usable logit (+inf read as F32_MAX; NaN and -inf skipped)
    float min_v;    // smallest usable logit
    u32 list_n;     // entries of the block's top-k list
    float list_min; // smallest logit on it
    u32 pad[2];
};

// Where the exact path's cuts lie, from sample_exact_hist for sample_exact_draw: bins below
// j_lo are kept whole, bins above j_hi dropped, and the tokens of [j_lo, j_hi] gathered.
struct ExactPlan {
    float per2;        // bins per nat below the maximum
    int j_lo, j_hi;
    int j_k;           // the bin holding the top-k cut, -1 without one
    u32 need_k;        // tokens of bin j_k inside the top-k
    u32 ncand;         // tokens gathered
    double w_below_k;  // mass (at temperature 1, relative to the maximum) of bins below j_k
    double w_all;      // mass of the whole row
    double w_above_lo; // mass of bins below j_lo
    u32 pad[4];
};
static_assert(sizeof(ExactPlan) == 64, "ExactPlan is 64 bytes of scratch");
static_assert(sizeof(Partial) == 32, "Partial is 32 bytes of scratch");

// Scratch per row, in bytes (ROW_SCRATCH in src/sample.rs).
#define OFF_LISTS (MAX_SPLITS * 32)
#define OFF_PLAN (OFF_LISTS + MAX_SPLITS * KMAX * 8)
#define OFF_DRAW (OFF_PLAN + 64)
#define OFF_HCNT (OFF_DRAW + MAX_SPLITS * 8)
#define OFF_HMASS (OFF_HCNT + NB2 * 4)
#define OFF_CANDS (OFF_HMASS + NB2 * 8)
#define ROW_SCRATCH (OFF_CANDS + CAPG * 8)

// ---------------------------------------------------------------------------------------------
// Small helpers

// Plain loads (through L1) for data this block wrote or an earlier kernel did.
__device__ __forceinline__ float ld(const float* p) {
    float v;
    asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ void ld4(const float* p, float* v) {
    asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3])
                 : "l"(p));
}
__device__ __forceinline__ u32 ldcg_u32(const u32* p) {
    u32 v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ u64 ldcg_u64(const u64* p) {
    u64 v;
    asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(p));
    return v;
}

// (v, i) beats (bv, bi): larger value, then lower index. NaN never wins.
__device__ __forceinline__ bool better(float v, u32 i, float bv, u32 bi) {
    return v > bv || (v == bv && i < bi);
}

__device__ __forceinline__ void warp_argmax(float& v, u32& i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        u32 oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (better(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
}

// Block-wide argmax; the result is valid in every thread. `sv`, `si` hold one entry per warp.
__device__ void block_argmax(float& v, u32& i, float* sv, u32* si) {
    const u32 lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
    warp_argmax(v, i);
    __syncthreads();
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = i;
    }
    __syncthreads();
    v = lane < nw ? sv[lane] : -F32_INF;
    i = lane < nw ? si[lane] : 0xffffffffu;
    warp_argmax(v, i);
}

__device__ __forceinline__ double shfl_up_d(double v, int d) {
    int lo = __double2loint(v), hi = __double2hiint(v);
    lo = __shfl_up_sync(0xffffffffu, lo, d);
    hi = __shfl_up_sync(0xffffffffu, hi, d);
    return __hiloint2double(hi, lo);
}
__device__ __forceinline__ double shfl_d(double v, int src) {
    int lo = __shfl_sync(0xffffffffu, __double2loint(v), src);
    int hi = __shfl_sync(0xffffffffu, __double2hiint(v), src);
    return __hiloint2double(hi, lo);
}

// akunu_core::sampling::exp_nonpositive, operation for operation (no contraction), so the
// top-p weights are the CPU's to the bit.
__device__ __forceinline__ float exp_nonpositive(float x) {
    const float LOG2E = 1.44269504088896341f;
    const float LN2_HI = 0.693359375f;
    const float LN2_LO = -2.12194440e-4f;
    const float ROUND = 12582912.0f;
    const bool under = x < EXP_FLOOR;
    x = under ? EXP_FLOOR : x;
    const float n = __fsub_rn(__fadd_rn(__fmul_rn(x, LOG2E), ROUND), ROUND);
    const float r = __fsub_rn(__fsub_rn(x, __fmul_rn(n, LN2_HI)), __fmul_rn(n, LN2_LO));
    float poly = __fadd_rn(__fmul_rn(1.9875691e-4f, r), 1.3982e-3f);
    poly = __fadd_rn(__fmul_rn(poly, r), 8.333452e-3f);
    poly = __fadd_rn(__fmul_rn(poly, r), 4.1665796e-2f);
    poly = __fadd_rn(__fmul_rn(poly, r), 1.6666665e-1f);
    poly = __fadd_rn(__fmul_rn(poly, r), 0.5f);
    const float er = __fadd_rn(__fadd_rn(__fmul_rn(__fmul_rn(poly, r), r), r), 1.0f);
    const float scaled = __fmul_rn(er, __uint_as_float((u32)(__float2int_rz(n) + 127) << 23));
    return under ? 0.0f : scaled;
}

// Philox-4x32-10; returns the first output word.
__device__ __forceinline__ u32 philox(u32 c0, u32 c1, u32 c2, u32 c3, u32 k0, u32 k1) {
#pragma unroll
    for (int r = 0; r < 10; r++) {
        const u32 hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const u32 hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return c0;
}

// Gumbel-max score of a token whose temperature-scaled log weight is `x`: x - ln(E) with E an
// Exp(1) variate of (seed, step, id). E = -ln(1 - V) for V uniform in (0, 1); small V (the
// draws that win) goes through a series, so E keeps its relative precision.
__device__ __forceinline__ float gumbel_score(float x, const SampleParams& P, u32 step_lo,
                                              u32 step_hi, u32 id) {
    const u32 r = philox(id, step_lo, step_hi, 0x73616d70u, P.seed_lo, P.seed_hi);
    const float v = fminf(fmaf((float)r, 2.3283064365386963e-10f, 1.1641532182693481e-10f),
                          0.99999994f);
    float e;
    if (v < 0.03125f) {
        e = v * (1.0f + v * (0.5f + v * (0.33333334f + v * 0.25f)));
    } else {
        e = -__logf(1.0f - v);
    }
    return x - __logf(e);
}

// ---------------------------------------------------------------------------------------------
// argmax

// The row's argmax (~0: none, read as token 0) into out[row], and into the chain.
__device__ __forceinline__ void choose(u32* out, u32 row, u32 bi, const Chain& chain) {
    record(out + row, bi == 0xffffffffu ? 0 : bi, chain);
}

// Grid (splits, m), ARGMAX_THREADS threads. Block b of row r reduces the slice
// [b * per_block, (b + 1) * per_block) with 16-byte loads when the row is aligned; with one
// block per row it writes out[r] itself, otherwise the last block of the row reduces the
// partials (scratch: part_v/part_i at [r * part_stride + b], one ticket per row). A chain's
// pointers (null without) only with one row.
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_f32(const float* __restrict__ logits, u32 n, u32 per_block, u32* __restrict__ out,
           float* part_v, u32* part_i, u32 part_stride, u32* tickets, u32* chain_positions,
           u32* chain_out, u32* chain_count) {
    pdl_begin();
    const Chain chain = {chain_positions, chain_out, chain_count};
    __shared__ float sv[ARGMAX_THREADS / WARP];
    __shared__ u32 si[ARGMAX_THREADS / WARP];
    __shared__ u32 last;
    const u32 row = blockIdx.y, b = blockIdx.x, splits = gridDim.x;
    const float* x = logits + (u64)row * n;
    const u32 lo = b * per_block;
    const u32 hi = min(n, lo + per_block);
    float bv = -F32_INF;
    u32 bi = 0xffffffffu;
    if ((((unsigned long long)x) & 15) == 0) {
        const u32 q0 = lo >> 2, q1 = hi >> 2;
        u32 q = q0 + threadIdx.x;
        for (; q + ARGMAX_THREADS < q1; q += 2 * ARGMAX_THREADS) {
            float a[4], c[4];
            ldcg4(x + 4 * q, a);
            ldcg4(x + 4 * (q + ARGMAX_THREADS), c);
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (better(a[j], 4 * q + j, bv, bi)) bv = a[j], bi = 4 * q + j;
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (better(c[j], 4 * (q + ARGMAX_THREADS) + j, bv, bi))
                    bv = c[j], bi = 4 * (q + ARGMAX_THREADS) + j;
        }
        for (; q < q1; q += ARGMAX_THREADS) {
            float a[4];
            ldcg4(x + 4 * q, a);
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (better(a[j], 4 * q + j, bv, bi)) bv = a[j], bi = 4 * q + j;
        }
        for (u32 i = max(lo, q1 << 2) + threadIdx.x; i < hi; i += ARGMAX_THREADS) {
            const float v = ldcg(x + i);
            if (better(v, i, bv, bi)) bv = v, bi = i;
        }
    } else {
        for (u32 i = lo + threadIdx.x; i < hi; i += ARGMAX_THREADS) {
            const float v = ldcg(x + i);
            if (better(v, i, bv, bi)) bv = v, bi = i;
        }
    }
    block_argmax(bv, bi, sv, si);
    if (splits == 1) {
        if (threadIdx.x == 0) choose(out, row, bi, chain);
        return;
    }
    if (threadIdx.x == 0) {
        part_v[row * part_stride + b] = bv;
        part_i[row * part_stride + b] = bi;
        __threadfence();
        last = atomicAdd(&tickets[row], 1u) == splits - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    bv = -F32_INF;
    bi = 0xffffffffu;
    for (u32 j = threadIdx.x; j < splits; j += ARGMAX_THREADS) {
        const float v = ldcg(part_v + row * part_stride + j);
        const u32 i = ldcg_u32(part_i + row * part_stride + j);
        if (better(v, i, bv, bi)) bv = v, bi = i;
    }
    block_argmax(bv, bi, sv, si);
    if (threadIdx.x == 0) {
        choose(out, row, bi, chain);
        tickets[row] = 0;
    }
}

// ---------------------------------------------------------------------------------------------
// Sampler: token sources
//
// A source hands each thread its share of the tokens as (key, logit) pairs; the selection runs
// over any of them.

// The tokens of [lo, hi) of a row whose logit (+inf read as F32_MAX) is at least `floor`
// (never NaN or -inf, as floor >= -F32_MAX) and whose key is at least `kmin`. With CG the
// loads bypass L1 (for a last block reading what other blocks penalised); `vec` (16-byte
// aligned row, lo % 4 == 0) uses 16-byte loads, four in flight per thread.
template <bool CG>
struct RangeSrc {
    const float* x;
    u32 lo, hi;
    float floor;
    u64 kmin;
    bool vec;

    static __device__ __forceinline__ float load(const float* p) { return CG ? ldcg(p) : ld(p); }
    static __device__ __forceinline__ void load4(const float* p, float* v) {
        if (CG) {
            ldcg4(p, v);
        } else {
            ld4(p, v);
        }
    }

    template <class F>
    __device__ __forceinline__ void each_raw(F&& f) const {
        if (vec) {
            const u32 q1 = hi >> 2;
            u32 q = (lo >> 2) + threadIdx.x;
            for (; q + 3 * SAMPLE_THREADS < q1; q += 4 * SAMPLE_THREADS) {
                float a[16];
#pragma unroll
                for (int u = 0; u < 4; u++) load4(x + 4 * (q + u * SAMPLE_THREADS), a + 4 * u);
#pragma unroll
                for (int u = 0; u < 4; u++)
#pragma unroll
                    for (int j = 0; j < 4; j++) f(a[4 * u + j], 4 * (q + u * SAMPLE_THREADS) + j);
            }
            for (; q < q1; q += SAMPLE_THREADS) {
                float a[4];
                load4(x + 4 * q, a);
#pragma unroll
                for (int j = 0; j < 4; j++) f(a[j], 4 * q + j);
            }
            for (u32 i = max(lo, q1 << 2) + threadIdx.x; i < hi; i += SAMPLE_THREADS)
                f(load(x + i), i);
        } else {
            for (u32 i = lo + threadIdx.x; i < hi; i += SAMPLE_THREADS) f(load(x + i), i);
        }
    }

    template <class F>
    __device__ __forceinline__ void each(F&& f) const {
        const float fl = floor;
        const u64 km = kmin;
        each_raw([&](float raw, u32 id) {
            const float l = raw == F32_INF ? F32_MAX : raw;
            if (!(l >= fl)) return;
            const u64 key = make_key(l, id);
            if (key < km) return;
            f(key, l);
        });
    }
};

// The blocks' top-k lists of a row, staged in registers once: thread t holds entries
// t + i * SAMPLE_THREADS of the lists laid end to end (list b at b * KMAX, cnt[b] long),
// 0 marking an empty slot; filtered by floor and kmin.
struct ListRegs {
    u64 k[LIST_REGS];
    float floor;
    u64 kmin;

    // Every slot of the first `splits` lists, stale ones included, so the loads need not wait
    // for the lengths; mask() then drops the slots past each list's length.
    __device__ __forceinline__ void load(const u64* lists, u32 splits) {
#pragma unroll
        for (int i = 0; i < LIST_REGS; i++) {
            const u32 q = threadIdx.x + i * SAMPLE_THREADS;
            k[i] = q / KMAX < splits ? ldcg_u64(lists + q) : 0;
        }
    }

    __device__ __forceinline__ void mask(const u32* cnt, u32 splits) {
#pragma unroll
        for (int i = 0; i < LIST_REGS; i++) {
            const u32 q = threadIdx.x + i * SAMPLE_THREADS;
            if (q / KMAX >= splits || q % KMAX >= cnt[q / KMAX]) k[i] = 0;
        }
    }

    template <class F>
    __device__ __forceinline__ void each(F&& f) const {
#pragma unroll
        for (int i = 0; i < LIST_REGS; i++) {
            const u64 key = k[i];
            if (!key) continue;
            const float l = key_val(key);
            if (l >= floor && key >= kmin) f(key, l);
        }
    }
};

// The exact path's bin of a usable logit: NB2 linear bins below the row's maximum. The same
// arithmetic in every kernel, so a token always lands in the same bin.
__device__ __forceinline__ u32 exact_bin(float l, float M, float per2) {
    return (u32)fminf(__fmul_rn(__fsub_rn(M, l), per2), (float)(NB2 - 1));
}

// Keys gathered in shared memory, at least kmin, and with only_bin >= 0 only those of that
// exact-path bin.
struct SmemSrc {
    const u64* keys;
    u32 n;
    u64 kmin;
    int only_bin;
    float M, per2;

    template <class F>
    __device__ __forceinline__ void each(F&& f) const {
        for (u32 i = threadIdx.x; i < n; i += SAMPLE_THREADS) {
            const u64 key = keys[i];
            if (key < kmin) continue;
            const float l = key_val(key);
            if (only_bin >= 0 && exact_bin(l, M, per2) != (u32)only_bin) continue;
            f(key, l);
        }
    }
};

// ---------------------------------------------------------------------------------------------
// Sampler: selection

__device__ __forceinline__ u64 fixed_mass(float w) {
    return __double2ull_rn((double)w * MASS_SCALE);
}
__device__ __forceinline__ double mass_of(u64 m) { return (double)m * (1.0 / MASS_SCALE); }

__device__ __forceinline__ u64 shfl_xor_u64(u64 v, int o) {
    const u32 lo = __shfl_xor_sync(0xffffffffu, (u32)v, o);
    const u32 hi = __shfl_xor_sync(0xffffffffu, (u32)(v >> 32), o);
    return ((u64)hi << 32) | lo;
}

struct SelSmem {
    u32 cnt[NBIN];
    u64 mass[NBIN];
    u64 cand[CAPC];
    u32 ncand;
    int bin;
    double above;
    double goal;
    u64 result;
};

// Warp-wide: the first entry i < n (in order) that is non-empty and where
// base + (values before i) + value(i) reaches `goal`; *above = base + values before i.
// -1 when there is none, unless `fallback`, which then returns the last non-empty entry.
// `get(i, &value)` returns whether entry i is non-empty. Lane l owns entries
// [EPL * l, EPL * (l + 1)).
template <int EPL, class G>
__device__ int warp_cross(u32 n, double base, double goal, bool fallback, G&& get,
                          double* above) {
    const u32 lane = threadIdx.x % WARP;
    double v[EPL];
    bool nz[EPL];
    double sum = 0.0;
#pragma unroll
    for (int j = 0; j < EPL; j++) {
        const u32 e = EPL * lane + j;
        v[j] = 0.0;
        nz[j] = e < n && get(e, &v[j]);
        sum += v[j];
    }
    double incl = sum;
#pragma unroll
    for (int d = 1; d < WARP; d <<= 1) {
        const double o = shfl_up_d(incl, d);
        if (lane >= (u32)d) incl += o;
    }
    const double excl = incl - sum;
    int hit = -1, last_nz = -1;
    double hit_above = 0.0, last_above = 0.0, acc = base + excl;
#pragma unroll
    for (int j = 0; j < EPL; j++) {
        if (nz[j]) {
            if (hit < 0 && acc + v[j] >= goal) {
                hit = j;
                hit_above = acc;
            }
            last_nz = j;
            last_above = acc;
        }
        acc += v[j];
    }
    const u32 hits = __ballot_sync(0xffffffffu, hit >= 0);
    if (hits) {
        const int src = __ffs(hits) - 1;
        *above = shfl_d(hit_above, src);
        return EPL * src + __shfl_sync(0xffffffffu, hit, src);
    }
    const u32 nzs = __ballot_sync(0xffffffffu, last_nz >= 0);
    if (!fallback || !nzs) return -1;
    const int src = 31 - __clz(nzs);
    *above = shfl_d(last_above, src);
    return EPL * src + __shfl_sync(0xffffffffu, last_nz, src);
}

// Sorts a[0..n) (distinct keys, n <= CAPC <= block size) descending, by counting ranks.
__device__ void rank_sort(u64* a, u32 n) {
    u64 mine = 0;
    u32 r = 0;
    if (threadIdx.x < n) {
        mine = a[threadIdx.x];
        for (u32 j = 0; j < n; j++) r += a[j] > mine;
    }
    __syncthreads();
    if (threadIdx.x < n) a[r] = mine;
    __syncthreads();
}

// The smallest key of the selected prefix of `src` in rank order: every token of the source
// with a key at least this is selected, and 0 selects them all.
//   MASS = false: the best `goal` tokens (all of them when there are fewer).
//   MASS = true:  the shortest prefix whose weight, exp(l - wref) per token, brings `base`
//                 (the weight of what ranks above the source) to `goal`; with frac >= 0 the
//                 goal is base + frac times the source's weight. All of the source when
//                 rounding keeps the goal out of reach.
// The first histogram bins the logits over [bref - span, bref] (bref at least every logit of
// the source); the crossing bin is then narrowed by radix passes over the key bits that vary
// inside a key interval surely holding it, its members told by their first bin. Every thread
// of the block must call it, and every thread gets the result.
template <bool MASS, class Src>
__device__ u64 select_threshold(const Src& src, double goal, float frac, double base, float bref,
                                float span, float wref, SelSmem& s) {
    const u32 tid = threadIdx.x;
    float per_nat = span > 0.0f ? (float)NBIN / span : 0.0f;
    if (!(per_nat < 1e30f)) per_nat = 0.0f;
    const auto first_bin = [=](float l) {
        return (u32)fminf(__fmul_rn(__fsub_rn(bref, l), per_nat), (float)(NBIN - 1));
    };
    for (u32 i = tid; i < NBIN; i += SAMPLE_THREADS) {
        s.cnt[i] = 0;
        s.mass[i] = 0;
    }
    __syncthreads();
    src.each([&](u64, float l) {
        const u32 bin = first_bin(l);
        atomicAdd(&s.cnt[bin], 1u);
        if (MASS) atomicAdd(&s.mass[bin], fixed_mass(exp_nonpositive(__fsub_rn(l, wref))));
    });
    __syncthreads();
    if (tid < WARP) {
        if (MASS && frac >= 0.0f) {
            u64 t = 0;
            for (u32 i = tid; i < NBIN; i += WARP) t += s.mass[i];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) t += shfl_xor_u64(t, o);
            goal = base + (double)frac * mass_of(t);
        }
        double above = 0.0;
        const int bin = warp_cross<8>(NBIN, base, goal, false,
                                      [&](u32 e, double* v) {
                                          *v = MASS ? mass_of(s.mass[e]) : (double)s.cnt[e];
                                          return s.cnt[e] > 0;
                                      },
                                      &above);
        if (tid == 0) {
            s.bin = bin;
            s.above = above;
            s.goal = goal;
        }
    }
    __syncthreads();
    const int bin0 = s.bin;
    if (bin0 < 0) return 0;
    // Bin j holds (bref - l) * per_nat in [j, j + 1), the last bin everything further down;
    // widened by a margin far above the rounding of that arithmetic.
    u64 klo = 0, khi = ~0ull;
    if (per_nat > 0.0f) {
        const float margin = 1e-4f * (fabsf(bref) + span) + 1e-30f;
        khi = make_key(bref - (float)bin0 / per_nat + margin, 0);
        if (bin0 < NBIN - 1) klo = make_key(bref - (float)(bin0 + 1) / per_nat - margin, ~0u);
    }
    u32 c = s.cnt[bin0];
    double above = s.above;
    goal = s.goal;
    __syncthreads();
    // Radix passes over the key bits that vary inside [klo, khi], 8 at a time, until the
    // crossing bin is small enough to sort.
    while (c > CAPC) {
        const int top = 63 - __clzll((long long)(klo ^ khi));
        const int shift = top >= 7 ? top - 7 : 0;
        for (u32 i = tid; i < NBIN; i += SAMPLE_THREADS) {
            s.cnt[i] = 0;
            s.mass[i] = 0;
        }
        __syncthreads();
        const u64 lo_k = klo, hi_k = khi;
        src.each([&](u64 key, float l) {
            if (key < lo_k || key > hi_k || first_bin(l) != (u32)bin0) return;
            const u32 bin = 255u - ((u32)(key >> shift) & 255u);
            atomicAdd(&s.cnt[bin], 1u);
            if (MASS) atomicAdd(&s.mass[bin], fixed_mass(exp_nonpositive(__fsub_rn(l, wref))));
        });
        __syncthreads();
        if (tid < WARP) {
            double ab = 0.0;
            const int bin = warp_cross<8>(NBIN, above, goal, true,
                                          [&](u32 e, double* v) {
                                              *v = MASS ? mass_of(s.mass[e]) : (double)s.cnt[e];
                                              return s.cnt[e] > 0;
                                          },
                                          &ab);
            if (tid == 0) {
                s.bin = bin;
                s.above = ab;
            }
        }
        __syncthreads();
        const int bin = s.bin;
        if (bin < 0) {
            // Nothing left in the interval (cannot happen with consistent counts): select all.
            __syncthreads();
            return 0;
        }
        above = s.above;
        const u32 digit = 255u - (u32)bin;
        c = s.cnt[bin];
        const u64 low = shift + 8 >= 64 ? ~0ull : ((1ull << (shift + 8)) - 1);
        const u64 nlo = (klo & ~low) | ((u64)digit << shift);
        const u64 nhi = nlo | ((1ull << shift) - 1);
        klo = max(klo, nlo);
        khi = min(khi, nhi);
        __syncthreads();
    }
    // Gather the crossing bin, sort it and walk it to the exact threshold.
    if (tid == 0) s.ncand = 0;
    __syncthreads();
    {
        const u64 lo_k = klo, hi_k = khi;
        src.each([&](u64 key, float l) {
            if (key < lo_k || key > hi_k || first_bin(l) != (u32)bin0) return;
            const u32 slot = atomicAdd(&s.ncand, 1u);
            if (slot < CAPC) s.cand[slot] = key;
        });
    }
    __syncthreads();
    const u32 nc = min(s.ncand, (u32)CAPC);
    rank_sort(s.cand, nc);
    if (tid < WARP) {
        int idx;
        if (MASS) {
            double ab = 0.0;
            idx = warp_cross<8>(nc, above, goal, true,
                                [&](u32 e, double* v) {
                                    *v = (double)exp_nonpositive(
                                        __fsub_rn(key_val(s.cand[e]), wref));
                                    return true;
                                },
                                &ab);
        } else {
            idx = (int)(goal - above) - 1;
        }
        idx = max(0, min(idx, (int)nc - 1));
        if (tid == 0) s.result = nc > 0 ? s.cand[idx] : 0;
    }
    __syncthreads();
    const u64 result = s.result;
    __syncthreads();
    return result;
}

// ---------------------------------------------------------------------------------------------
// Sampler: shared steps

// What a row's partials say.
struct RowSummary {
    float max_raw;  // the raw maximum and its first index (~0 for none)
    u32 arg;
    float M;        // largest usable logit, -inf for none
    float min_v;    // smallest usable logit
    float list_lo;  // smallest logit on any top-k list
    float t_lo;     // largest k-th logit of a full list: the row's top-k is at least this
};

__device__ __forceinline__ void ldcg4u(const u32* p, u32* v) {
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                 : "l"(p));
}

// Run by warp 0: reduces the row's `splits` partials into `out`, and stores the list lengths
// in `cnt` when it is not null. The caller synchronises before reading them.
__device__ void row_summary(const Partial* parts, u32 splits, u32 top_k, RowSummary& out,
                            u32* cnt) {
    const u32 lane = threadIdx.x % WARP;
    float mr = -F32_INF, mx = -F32_INF, mn = F32_INF, ll = F32_INF, tl = -F32_INF;
    u32 ai = 0xffffffffu;
    for (u32 j = lane; j < splits; j += WARP) {
        u32 a[4], c[4];
        ldcg4u((const u32*)(parts + j), a);
        ldcg4u((const u32*)(parts + j) + 4, c);
        const float v = __uint_as_float(a[0]);
        if (better(v, a[1], mr, ai)) mr = v, ai = a[1];
        mx = fmaxf(mx, __uint_as_float(a[2]));
        mn = fminf(mn, __uint_as_float(a[3]));
        const float lm = __uint_as_float(c[1]);
        if (cnt) cnt[j] = c[0];
        if (c[0]) ll = fminf(ll, lm);
        if (top_k && c[0] == top_k) tl = fmaxf(tl, lm);
    }
    warp_argmax(mr, ai);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
        ll = fminf(ll, __shfl_xor_sync(0xffffffffu, ll, o));
        tl = fmaxf(tl, __shfl_xor_sync(0xffffffffu, tl, o));
    }
    if (lane == 0) {
        out.max_raw = mr;
        out.arg = ai;
        out.M = mx;
        out.min_v = mn;
        out.list_lo = ll;
        out.t_lo = tl;
    }
}

// The row's cuts as the CPU computes them: the tail bound below the maximum M (tokens further
// down carry too little mass to matter), the min-p bar, and the floor every candidate clears.
struct Cuts {
    float tail, bar, floor;
    bool has_top_p;
};

__device__ __forceinline__ Cuts cuts_of(const SampleParams& P, float M, float ln_n17) {
    Cuts c;
    c.tail = __fmul_rn(ln_n17, fmaxf(P.temperature, 1.0f));
    c.has_top_p = P.top_p < 1.0f;
    c.bar = P.min_p_ln > -F32_INF ? __fadd_rn(M, P.min_p_ln) : -F32_INF;
    float floor = __fsub_rn(M, c.tail);
    if (!c.has_top_p) floor = fmaxf(floor, c.bar);
    c.floor = fmaxf(floor, -F32_MAX);
    return c;
}

// The row's top_k when it cuts anything, else 0.
__device__ __forceinline__ u32 top_k_of(const SampleParams& P, u32 n) {
    return P.top_k > 0 && P.top_k < n ? P.top_k : 0;
}

__device__ __forceinline__ bool fast_path(const SampleParams& P, u32 n) {
    const u32 k = top_k_of(P, n);
    return P.temperature > 0.0f && k > 0 && k <= KMAX;
}

// Whether the row takes the exact path (the caller also checks that it has a usable logit).
__device__ __forceinline__ bool exact_path(const SampleParams& P, u32 n) {
    return P.temperature > 0.0f && !fast_path(P, n);
}

// Keeps (score, id) of the token if it beats (bs, bt): Gumbel-max over survivors.
__device__ __forceinline__ void gumbel_consider(float l, u32 id, float M, const SampleParams& P,
                                                u32 step_lo, u32 step_hi, float& bs, u32& bt) {
    const float xt = __fdiv_rn(__fsub_rn(l, M), P.temperature);
    if (xt < EXP_FLOOR) return;
    const float sc = gumbel_score(xt, P, step_lo, step_hi, id);
    if (better(sc, id, bs, bt)) bs = sc, bt = id;
}

// The exact path in one block over the whole row: the top-k cut by count, the top-p cut by
// mass, then the draw. Every thread calls it; the token is valid in every thread (~0 never
// happens: the maximum always survives).
__device__ u32 exact_single_block(const float* x, u32 n, bool vec, const SampleParams& P,
                                  float M, float min_v, const Cuts& c, u32 step_lo, u32 step_hi,
                                  SelSmem& sel, float* red_v, u32* red_i) {
    const RangeSrc<true> all{x, 0, n, c.floor, 0, vec};
    const float span = fminf(c.tail, M - min_v);
    const u32 top_k = top_k_of(P, n);
    u64 cut = 0;
    if (top_k > 0) cut = select_threshold<false>(all, (double)top_k, -1.0f, 0.0, M, span, M, sel);
    if (c.has_top_p) {
        const RangeSrc<true> topk{x, 0, n, c.floor, cut, vec};
        cut = max(cut, select_threshold<true>(topk, 0.0, P.top_p, 0.0, M, span, M, sel));
    }
    const RangeSrc<true> survivors{x, 0, n, fmaxf(c.floor, c.bar), cut, vec};
    float bs = -F32_INF;
    u32 bt = 0xffffffffu;
    survivors.each([&](u64 key, float l) {
        gumbel_consider(l, key_id(key), M, P, step_lo, step_hi, bs, bt);
    });
    block_argmax(bs, bt, red_v, red_i);
    return bt;
}

// Run by one thread: publishes the row's token (into the chain too, where there is one),
// appends it to the penalty window, advances the step and resets the finishing kernel's ticket.
__device__ void finish_row(const SampleParams& P, RowState* st, u32* ring, u32 ring_cap,
                           u32* out, u32 token, u32* ticket, const Chain& chain) {
    record(out, token, chain);
    if (P.window > 0 && ring_cap > 0) {
        const u32 w = min(P.window, ring_cap);
        const u32 pos = st->ring_pos % w;
        ring[pos] = token;
        st->ring_pos = pos + 1 == w ? 0 : pos + 1;
        st->ring_len = min(st->ring_len + 1, w);
    }
    const u64 step = (((u64)st->step_hi << 32) | st->step_lo) + 1;
    st->step_lo = (u32)step;
    st->step_hi = (u32)(step >> 32);
    *ticket = 0;
}

// ---------------------------------------------------------------------------------------------
// Sampler: the kernels

struct SampleSmem {
    SelSmem sel;
    RowSummary sum;
    double weight[KMAX];  // the sorted top-k's top-p weights
    float score[KMAX];    // and Gumbel scores (-inf: weight 0 at temperature T)
    float red_v[SAMPLE_WARPS];
    u32 red_i[SAMPLE_WARPS];
    float red_max[SAMPLE_WARPS];
    float red_min[SAMPLE_WARPS];
    u32 list_cnt[MAX_SPLITS];
    u32 nwin;
    u32 nlist;
    u32 list_min;
    u32 last;
    u32 merged;  // the last block's merge of the lists' heads sufficed
    float max_raw, max_v, min_v;
    u32 arg;
    u32 token;
};

// The last block's merge of the blocks' sorted top-k lists: their first MERGE_HEAD entries
// (`head`, each thread's HEAD_REGS of them, list j's entry e at j * MERGE_HEAD + e) go to
// `staged`; warp 0 then takes the largest head top_k times (lane l heads lists l and l + 32),
// keys below `kfloor` left out, into sm.sel.cand[0, sm.sel.ncand) in rank order. False, with
// nothing taken, where a list would need more than its staged entries: the caller then
// selects over the whole lists. Every thread of the block calls it and gets the answer; the
// merged keys are visible to all on return.
__device__ bool merge_lists(const u64 (&head)[HEAD_REGS], u32 splits, u32 top_k, u64 kfloor,
                            u64* staged, SampleSmem& sm) {
    const u32 tid = threadIdx.x, lane = tid % WARP;
#pragma unroll
    for (int i = 0; i < HEAD_REGS; i++) {
        const u32 q = tid + i * SAMPLE_THREADS, j = q / MERGE_HEAD;
        if (j < splits) staged[q] = q % MERGE_HEAD < sm.list_cnt[j] ? head[i] : 0;
    }
    __syncthreads();
    if (tid < WARP) {
        const u32 j0 = lane, j1 = lane + WARP;
        const u32 n0 = j0 < splits ? sm.list_cnt[j0] : 0, n1 = j1 < splits ? sm.list_cnt[j1] : 0;
        u32 p0 = 0, p1 = 0;
        u64 h0 = n0 ? staged[j0 * MERGE_HEAD] : 0, h1 = n1 ? staged[j1 * MERGE_HEAD] : 0;
        // A head past the staged entries of a list that has more is unknown.
        bool unknown = false, ok = true;
        u32 taken = 0;
        for (; taken < top_k; taken++) {
            if (__any_sync(0xffffffffu, unknown)) {
                ok = false;
                break;
            }
            // The largest head in two warp reductions: its high word, then the low word
            // among the heads that share it.
            const u64 mine = max(h0, h1);
            const u32 hi = __reduce_max_sync(0xffffffffu, (u32)(mine >> 32));
            const u32 lo = __reduce_max_sync(0xffffffffu, (u32)(mine >> 32) == hi ? (u32)mine : 0u);
            const u64 w = ((u64)hi << 32) | lo;
            if (w < kfloor || w == 0) break;
            if (lane == 0) sm.sel.cand[taken] = w;
            // Keys are distinct: one head matches.
            if (h0 == w) {
                ++p0;
                unknown |= p0 == MERGE_HEAD && p0 < n0;
                h0 = p0 < min(n0, (u32)MERGE_HEAD) ? staged[j0 * MERGE_HEAD + p0] : 0;
            } else if (h1 == w) {
                ++p1;
                unknown |= p1 == MERGE_HEAD && p1 < n1;
                h1 = p1 < min(n1, (u32)MERGE_HEAD) ? staged[j1 * MERGE_HEAD + p1] : 0;
            }
        }
        if (lane == 0) {
            sm.sel.ncand = ok ? taken : 0;
            sm.merged = ok;
        }
    }
    __syncthreads();
    return sm.merged;
}

// Grid (splits, m), SAMPLE_THREADS threads, dynamic shared memory of ring_cap u32 (the
// penalty window's tokens that fall in the block's slice), at least MERGE_HEAD * MAX_SPLITS
// u64 (the last block's merge). Block b of row r owns the slice
// [b * per_block, (b + 1) * per_block) (per_block a multiple of 4) of row r: it penalises and
// reduces it, and on the fast path selects its top-k; the last block of the row to finish
// draws the token, except on the exact path with `helpers`, which sample_exact_hist and
// sample_exact_draw finish. ln_n17 = ln(n) + 17 in f32, computed on the host like the CPU's
// tail bound. A chain's pointers (null without) only with one row.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, 1)
sample_f32(float* logits, u32 n, u32 per_block, float ln_n17, const SampleParams* params,
           RowState* states, u32* rings, u32 ring_cap, unsigned char* scratch, u32* out,
           u32 helpers, u32* chain_positions, u32* chain_out, u32* chain_count) {
    pdl_begin();
    const Chain chain = {chain_positions, chain_out, chain_count};
    extern __shared__ u32 win[];
    __shared__ SampleSmem sm;
    const u32 tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const u32 row = blockIdx.y, b = blockIdx.x, splits = gridDim.x;
    const SampleParams P = params[row];
    RowState* st = states + row;
    float* x = logits + (u64)row * n;
    const bool vec = (((unsigned long long)x) & 15) == 0;
    const u32 lo = b * per_block;
    const u32 hi = min(n, lo + per_block);
    unsigned char* scr = scratch + (u64)row * ROW_SCRATCH;
    Partial* parts = (Partial*)scr;
    u64* lists = (u64*)(scr + OFF_LISTS);

    const bool greedy = !(P.temperature > 0.0f);
    const u32 top_k = top_k_of(P, n);
    const bool fast = fast_path(P, n);
    const float tail = __fmul_rn(ln_n17, fmaxf(P.temperature, 1.0f));

    // 1. Penalties on the window's tokens in [lo, hi), each distinct token once.
    if (P.penalize) {
        const u32 len = min(st->ring_len, ring_cap);
        const u32* ring = rings + (u64)row * ring_cap;
        if (tid == 0) sm.nwin = 0;
        __syncthreads();
        for (u32 i = tid; i < len; i += SAMPLE_THREADS) {
            const u32 t = ring[i];
            if (t >= lo && t < hi) win[atomicAdd(&sm.nwin, 1u)] = t;
        }
        __syncthreads();
        const u32 nw = sm.nwin;
        for (u32 i = tid; i < nw; i += SAMPLE_THREADS) {
            const u32 t = win[i];
            bool first = true;
            for (u32 j = 0; j < i && first; j++) first = win[j] != t;
            if (!first) continue;
            u32 count = 1;
            for (u32 j = i + 1; j < nw; j++) count += win[j] == t;
            float l = x[t];
            l = l <= 0.0f ? __fmul_rn(l, P.repeat_penalty) : __fdiv_rn(l, P.repeat_penalty);
            l = __fsub_rn(l, __fadd_rn(__fmul_rn((float)count, P.frequency_penalty),
                                       P.presence_penalty));
            x[t] = l;
        }
        __threadfence();
        __syncthreads();
    }

    // 2. The slice's raw argmax and usable range.
    const RangeSrc<false> slice{x, lo, hi, -F32_MAX, 0, vec};
    {
        float mr = -F32_INF, mx = -F32_INF, mn = F32_INF;
        u32 ai = 0xffffffffu;
        slice.each_raw([&](float raw, u32 id) {
            if (better(raw, id, mr, ai)) mr = raw, ai = id;
            const float l = raw == F32_INF ? F32_MAX : raw;
            if (l >= -F32_MAX) {
                mx = fmaxf(mx, l);
                mn = fminf(mn, l);
            }
        });
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
        }
        if (lane == 0) {
            sm.red_max[warp] = mx;
            sm.red_min[warp] = mn;
        }
        block_argmax(mr, ai, sm.red_v, sm.red_i);
        if (tid == 0) {
            for (u32 w = 0; w < SAMPLE_WARPS; w++) {
                mx = fmaxf(mx, sm.red_max[w]);
                mn = fminf(mn, sm.red_min[w]);
            }
            sm.max_raw = mr;
            sm.arg = ai;
            sm.max_v = mx;
            sm.min_v = mn;
            sm.nlist = 0;
            sm.list_min = 0xffffffffu;
        }
        __syncthreads();
    }

    // 3. Fast path: this slice's top-k, out to its list. Every token of the row's top-k in this
    // slice is in the slice's top-k, and the slice's maximum bounds the row's floor from below.
    if (fast && sm.max_v >= -F32_MAX) {
        const float mb = sm.max_v;
        const float floor_b = fmaxf(__fsub_rn(mb, tail), -F32_MAX);
        const RangeSrc<false> src{x, lo, hi, floor_b, 0, vec};
        const u64 kt = select_threshold<false>(src, (double)top_k, -1.0f, 0.0, mb,
                                               fminf(tail, mb - sm.min_v), mb, sm.sel);
        const RangeSrc<false> kept{x, lo, hi, floor_b, kt, vec};
        kept.each([&](u64 key, float) {
            const u32 slot = atomicAdd(&sm.nlist, 1u);
            if (slot < KMAX) sm.sel.cand[slot] = key;
            atomicMin(&sm.list_min, (u32)(key >> 32));
        });
        __syncthreads();
        // Out in rank order, for the last block's merge.
        const u32 nl = min(sm.nlist, (u32)KMAX);
        rank_sort(sm.sel.cand, nl);
        u64* list = lists + b * KMAX;
        for (u32 i = tid; i < nl; i += SAMPLE_THREADS) list[i] = sm.sel.cand[i];
    }

    // Hand the partial over; the last block of the row carries on.
    if (tid == 0) {
        Partial p;
        p.max_raw = sm.max_raw;
        p.arg = sm.arg;
        p.max_v = sm.max_v;
        p.min_v = sm.min_v;
        p.list_n = min(sm.nlist, (u32)KMAX);
        p.list_min = p.list_n ? val_of_ord(sm.list_min) : F32_INF;
        p.pad[0] = p.pad[1] = 0;
        parts[b] = p;
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) sm.last = atomicAdd(&st->ticket, 1u) == splits - 1;
    __syncthreads();
    if (!sm.last) return;
    __threadfence();

    // 4. The row's summary from the partials (and on the fast path the lists, loaded at the
    // same time).
    u64 head[HEAD_REGS];
    if (fast) {
#pragma unroll
        for (int i = 0; i < HEAD_REGS; i++) {
            const u32 q = tid + i * SAMPLE_THREADS, j = q / MERGE_HEAD;
            head[i] = j < splits ? ldcg_u64(lists + j * KMAX + q % MERGE_HEAD) : 0;
        }
    }
    if (warp == 0) row_summary(parts, splits, top_k, sm.sum, sm.list_cnt);
    __syncthreads();
    const float M = sm.sum.M;

    if (greedy || !(M >= -F32_MAX)) {
        // Greedy, or nothing to draw from: the first index of the raw maximum (0 if none).
        if (tid == 0) sm.token = sm.sum.arg == 0xffffffffu ? 0 : sm.sum.arg;
    } else if (fast) {
        // 5a. The row's top-k, sorted; top-p and min-p cut it in rank order.
        const Cuts c = cuts_of(P, M, ln_n17);
        if (!merge_lists(head, splits, top_k, make_key(c.floor, ~0u), (u64*)win, sm)) {
            // A list gave more of the top-k than its staged head: the threshold search over
            // every list. A full list's k-th logit bounds the row's k-th from below, so lower
            // entries are out.
            ListRegs lr;
            lr.load(lists, splits);
            lr.floor = fmaxf(c.floor, sm.sum.t_lo);
            lr.kmin = 0;
            lr.mask(sm.list_cnt, splits);
            const float lowest = fmaxf(lr.floor, sm.sum.list_lo);
            lr.kmin = select_threshold<false>(lr, (double)top_k, -1.0f, 0.0, M,
                                              fminf(c.tail, M - lowest), M, sm.sel);
            if (tid == 0) sm.sel.ncand = 0;
            __syncthreads();
            lr.each([&](u64 key, float) {
                const u32 slot = atomicAdd(&sm.sel.ncand, 1u);
                if (slot < CAPC) sm.sel.cand[slot] = key;
            });
            __syncthreads();
            rank_sort(sm.sel.cand, min(sm.sel.ncand, (u32)KMAX));
        }
        const u32 s = min(sm.sel.ncand, (u32)KMAX);
        const u64* cd = sm.sel.cand;
        // Each candidate's top-p weight and Gumbel score, one thread each.
        if (tid < s) {
            const float l = key_val(cd[tid]);
            sm.weight[tid] = (double)exp_nonpositive(__fsub_rn(l, M));
            float bs = -F32_INF;
            u32 bt = 0xffffffffu;
            gumbel_consider(l, key_id(cd[tid]), M, P, st->step_lo, st->step_hi, bs, bt);
            sm.score[tid] = bs;
        }
        __syncthreads();
        if (warp == 0) {
            u32 kept = s;
            if (c.has_top_p) {
                double z = 0.0;
                for (u32 i = lane; i < s; i += WARP) z += sm.weight[i];
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) z += shfl_d(z, lane ^ o);
                double ab = 0.0;
                const int i = warp_cross<8>(s, 0.0, (double)P.top_p * z, false,
                                            [&](u32 e, double* v) {
                                                *v = sm.weight[e];
                                                return true;
                                            },
                                            &ab);
                if (i >= 0) kept = (u32)i + 1;
            }
            // Min-p keeps a prefix of the sorted list (the first always passes).
            u32 pass = 0;
            for (u32 i = lane; i < kept; i += WARP) pass += key_val(cd[i]) >= c.bar;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) pass += __shfl_xor_sync(0xffffffffu, pass, o);
            kept = max(1u, pass);
            float bs = -F32_INF;
            u32 bt = 0xffffffffu;
            for (u32 i = lane; i < kept; i += WARP) {
                const u32 id = key_id(cd[i]);
                if (sm.score[i] > -F32_INF && better(sm.score[i], id, bs, bt)) {
                    bs = sm.score[i];
                    bt = id;
                }
            }
            warp_argmax(bs, bt);
            if (lane == 0) sm.token = bt == 0xffffffffu ? key_id(cd[0]) : bt;
        }
    } else if (helpers) {
        // 5b. sample_exact_hist and sample_exact_draw finish this row.
        if (tid == 0) st->ticket = 0;
        return;
    } else {
        // 5c. The exact path in this block alone.
        const Cuts c = cuts_of(P, M, ln_n17);
        const u32 t = exact_single_block(x, n, vec, P, M, sm.sum.min_v, c, st->step_lo,
                                         st->step_hi, sm.sel, sm.red_v, sm.red_i);
        if (tid == 0) sm.token = t == 0xffffffffu ? sm.sum.arg : t;
    }
    __syncthreads();

    // 6. Publish the token and advance the row's state.
    if (tid == 0)
        finish_row(P, st, rings + (u64)row * ring_cap, ring_cap, out + row, sm.token, &st->ticket,
                   chain);
}

// Grid (splits, m), SAMPLE_THREADS threads, after sample_f32 with helpers; only rows on the
// exact path with a usable logit work. Block b histograms its slice [b * per_block, ...) by
// logit below the row's maximum (NB2 bins down to the tail bound; count, and mass at
// temperature 1) into the row's histogram in scratch; the last block reads it back, clears it,
// and plans sample_exact_draw: the bin holding the top-k cut and the bins that may hold the
// top-p cut (the top-p goal depends on the top-k set's mass, known to within bin j_k).
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, 1)
sample_exact_hist(const float* logits, u32 n, u32 per_block, float ln_n17,
                  const SampleParams* params, RowState* states, unsigned char* scratch) {
    pdl_begin();
    __shared__ u32 hc[NB2];
    __shared__ u64 hm[NB2];
    __shared__ RowSummary sum;
    __shared__ u32 last;
    const u32 tid = threadIdx.x;
    const u32 row = blockIdx.y, b = blockIdx.x, splits = gridDim.x;
    const SampleParams P = params[row];
    if (!exact_path(P, n)) return;
    RowState* st = states + row;
    const float* x = logits + (u64)row * n;
    const bool vec = (((unsigned long long)x) & 15) == 0;
    const u32 lo = b * per_block;
    const u32 hi = min(n, lo + per_block);
    unsigned char* scr = scratch + (u64)row * ROW_SCRATCH;
    u32* gc = (u32*)(scr + OFF_HCNT);
    u64* gm = (u64*)(scr + OFF_HMASS);
    const u32 top_k = top_k_of(P, n);

    if (tid < WARP) row_summary((const Partial*)scr, splits, top_k, sum, nullptr);
    for (u32 i = tid; i < NB2; i += SAMPLE_THREADS) {
        hc[i] = 0;
        hm[i] = 0;
    }
    __syncthreads();
    const float M = sum.M;
    if (!(M >= -F32_MAX)) return;
    const Cuts c = cuts_of(P, M, ln_n17);
    const float span = fminf(c.tail, M - sum.min_v);
    float per2 = span > 0.0f ? __fdiv_rn((float)NB2, span) : 0.0f;
    if (!(per2 < 1e30f)) per2 = 0.0f;

    const RangeSrc<false> slice{x, lo, hi, c.floor, 0, vec};
    slice.each([&](u64, float l) {
        const u32 bin = exact_bin(l, M, per2);
        atomicAdd(&hc[bin], 1u);
        atomicAdd(&hm[bin], fixed_mass(exp_nonpositive(__fsub_rn(l, M))));
    });
    __syncthreads();
    for (u32 i = tid; i < NB2; i += SAMPLE_THREADS) {
        if (hc[i]) {
            atomicAdd(&gc[i], hc[i]);
            atomicAdd(&gm[i], hm[i]);
        }
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&st->ticket_hist, 1u) == splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (u32 i = tid; i < NB2; i += SAMPLE_THREADS) {
        hc[i] = ldcg_u32(gc + i);
        hm[i] = ldcg_u64(gm + i);
        gc[i] = 0;
        gm[i] = 0;
    }
    __syncthreads();
    if (tid < WARP) {
        const u32 lane = tid;
        auto count = [&](u32 e, double* v) {
            *v = (double)hc[e];
            return hc[e] > 0;
        };
        auto mass = [&](u32 e, double* v) {
            *v = mass_of(hm[e]);
            return hc[e] > 0;
        };
        u64 t = 0;
        for (u32 i = lane; i < NB2; i += WARP) t += hm[i];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t += shfl_xor_u64(t, o);
        const double w_all = mass_of(t);
        int j_k = -1;
        u32 need_k = 0;
        double w_below_k = 0.0;
        if (top_k) {
            double ab = 0.0;
            j_k = warp_cross<NB2 / WARP>(NB2, 0.0, (double)top_k, false, count, &ab);
            if (j_k >= 0) {
                need_k = top_k - (u32)ab;
                u64 wb = 0;
                for (u32 i = lane; i < (u32)j_k; i += WARP) wb += hm[i];
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) wb += shfl_xor_u64(wb, o);
                w_below_k = mass_of(wb);
            }
        }
        // Without cuts every bin is kept whole (j_lo = NB2).
        int j_lo = NB2, j_hi = NB2 - 1;
        double w_above_lo = 0.0;
        if (c.has_top_p) {
            const u32 lim = j_k >= 0 ? (u32)j_k + 1 : NB2;
            const double zlo = j_k >= 0 ? w_below_k : w_all;
            const double zhi = j_k >= 0 ? w_below_k + mass_of(hm[j_k]) : w_all;
            double ab_lo = 0.0, ab_hi = 0.0;
            const int p_lo = warp_cross<NB2 / WARP>(lim, 0.0, (double)P.top_p * zlo, true, mass,
                                                    &ab_lo);
            const int p_hi = warp_cross<NB2 / WARP>(lim, 0.0, (double)P.top_p * zhi, true, mass,
                                                    &ab_hi);
            if (p_lo >= 0) {
                j_lo = p_lo;
                j_hi = j_k >= 0 ? j_k : p_hi;
                w_above_lo = ab_lo;
            }
        } else if (j_k >= 0) {
            j_lo = j_hi = j_k;
            w_above_lo = w_below_k;
        }
        if (lane == 0) {
            ExactPlan plan;
            plan.per2 = per2;
            plan.j_lo = j_lo;
            plan.j_hi = j_hi;
            plan.j_k = j_k;
            plan.need_k = need_k;
            plan.ncand = 0;
            plan.w_below_k = w_below_k;
            plan.w_all = w_all;
            plan.w_above_lo = w_above_lo;
            for (int i = 0; i < 4; i++) plan.pad[i] = 0;
            *(ExactPlan*)(scr + OFF_PLAN) = plan;
            st->ticket_hist = 0;
        }
    }
}

struct DrawSmem {
    SelSmem sel;
    RowSummary sum;
    float red_v[SAMPLE_WARPS];
    u32 red_i[SAMPLE_WARPS];
    float red_max[SAMPLE_WARPS];
    float red_min[SAMPLE_WARPS];
    u64 zk;
    u32 last;
    u32 token;
    float cmax, cmin;
};

// Grid (splits, m), SAMPLE_THREADS threads, dynamic shared memory of CAPG u64, after
// sample_exact_hist; only rows on the exact path with a usable logit work. Block b draws
// (Gumbel-max) among the tokens of its slice in the bins the plan keeps whole and appends
// those of the uncertain bins [j_lo, j_hi] to the row's gather buffer. The last block loads the
// gathered tokens, finds the exact top-k cut among those of bin j_k and the exact top-p cut
// (its goal now exact), draws among the gathered survivors, keeps the better of that and the
// blocks' draws, and publishes the token. More than CAPG gathered tokens (a crowd of equal
// logits at the cut) sends the row to the one-block exact path.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, 1)
sample_exact_draw(const float* logits, u32 n, u32 per_block, float ln_n17,
                  const SampleParams* params, RowState* states, u32* rings, u32 ring_cap,
                  unsigned char* scratch, u32* out, u32* chain_positions, u32* chain_out,
                  u32* chain_count) {
    pdl_begin();
    const Chain chain = {chain_positions, chain_out, chain_count};
    extern __shared__ u64 ck[];
    __shared__ DrawSmem sm;
    const u32 tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const u32 row = blockIdx.y, b = blockIdx.x, splits = gridDim.x;
    const SampleParams P = params[row];
    if (!exact_path(P, n)) return;
    RowState* st = states + row;
    const float* x = logits + (u64)row * n;
    const bool vec = (((unsigned long long)x) & 15) == 0;
    const u32 lo = b * per_block;
    const u32 hi = min(n, lo + per_block);
    unsigned char* scr = scratch + (u64)row * ROW_SCRATCH;
    ExactPlan* plan_p = (ExactPlan*)(scr + OFF_PLAN);
    float2* draws = (float2*)(scr + OFF_DRAW);
    u64* cands = (u64*)(scr + OFF_CANDS);

    if (tid < WARP) row_summary((const Partial*)scr, splits, 0, sm.sum, nullptr);
    __syncthreads();
    const float M = sm.sum.M;
    if (!(M >= -F32_MAX)) return;
    const ExactPlan plan = *plan_p;
    const Cuts c = cuts_of(P, M, ln_n17);
    const float keep = fmaxf(c.floor, c.bar);
    const u32 slo = st->step_lo, shi = st->step_hi;

    float bs = -F32_INF;
    u32 bt = 0xffffffffu;
    const RangeSrc<false> slice{x, lo, hi, c.floor, 0, vec};
    slice.each([&](u64 key, float l) {
        const int bin = (int)exact_bin(l, M, plan.per2);
        if (bin < plan.j_lo) {
            if (l >= keep) gumbel_consider(l, key_id(key), M, P, slo, shi, bs, bt);
        } else if (bin <= plan.j_hi) {
            const u32 slot = atomicAdd(&plan_p->ncand, 1u);
            if (slot < CAPG) cands[slot] = key;
        }
    });
    block_argmax(bs, bt, sm.red_v, sm.red_i);
    if (tid == 0) draws[b] = make_float2(bs, __uint_as_float(bt));
    __threadfence();
    __syncthreads();
    if (tid == 0) sm.last = atomicAdd(&st->ticket_draw, 1u) == splits - 1;
    __syncthreads();
    if (!sm.last) return;
    __threadfence();

    // The best of the blocks' draws among the tokens kept whole.
    bs = -F32_INF;
    bt = 0xffffffffu;
    for (u32 j = tid; j < splits; j += SAMPLE_THREADS) {
        const float* d = (const float*)(draws + j);
        const float v = ldcg(d);
        const u32 i = __float_as_uint(ldcg(d + 1));
        if (better(v, i, bs, bt)) bs = v, bt = i;
    }
    const u32 total = ldcg_u32(&plan_p->ncand);
    if (total > CAPG) {
        const u32 t =
            exact_single_block(x, n, vec, P, M, sm.sum.min_v, c, slo, shi, sm.sel, sm.red_v,
                               sm.red_i);
        if (tid == 0) sm.token = t == 0xffffffffu ? sm.sum.arg : t;
    } else {
        float cmax = -F32_INF, cmin = F32_INF;
        for (u32 i = tid; i < total; i += SAMPLE_THREADS) {
            const u64 key = ldcg_u64(cands + i);
            ck[i] = key;
            cmax = fmaxf(cmax, key_val(key));
            cmin = fminf(cmin, key_val(key));
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, o));
            cmin = fminf(cmin, __shfl_xor_sync(0xffffffffu, cmin, o));
        }
        if (lane == 0) {
            sm.red_max[warp] = cmax;
            sm.red_min[warp] = cmin;
        }
        if (tid == 0) sm.zk = 0;
        __syncthreads();
        if (tid == 0) {
            for (u32 w = 0; w < SAMPLE_WARPS; w++) {
                cmax = fmaxf(cmax, sm.red_max[w]);
                cmin = fminf(cmin, sm.red_min[w]);
            }
            sm.cmax = cmax;
            sm.cmin = cmin;
        }
        __syncthreads();
        cmax = sm.cmax;
        const float cspan = cmax - sm.cmin;
        // The top-k cut inside bin j_k, and with it the top-k set's mass.
        u64 kk = 0;
        double z = plan.w_all;
        if (plan.j_k >= 0) {
            const SmemSrc bin_k{ck, total, 0, plan.j_k, M, plan.per2};
            kk = select_threshold<false>(bin_k, (double)plan.need_k, -1.0f, 0.0, cmax, cspan, M,
                                         sm.sel);
            const SmemSrc in_k{ck, total, kk, plan.j_k, M, plan.per2};
            in_k.each([&](u64, float l) {
                atomicAdd(&sm.zk, fixed_mass(exp_nonpositive(__fsub_rn(l, M))));
            });
            __syncthreads();
            z = plan.w_below_k + mass_of(sm.zk);
        }
        // The top-p cut among the gathered tokens of the top-k set.
        u64 kp = 0;
        if (c.has_top_p) {
            const SmemSrc topk{ck, total, kk, -1, M, plan.per2};
            kp = select_threshold<true>(topk, (double)P.top_p * z, -1.0f, plan.w_above_lo, cmax,
                                        cspan, M, sm.sel);
        }
        const SmemSrc survivors{ck, total, max(kk, kp), -1, M, plan.per2};
        survivors.each([&](u64 key, float l) {
            if (l >= keep) gumbel_consider(l, key_id(key), M, P, slo, shi, bs, bt);
        });
        block_argmax(bs, bt, sm.red_v, sm.red_i);
        if (tid == 0) sm.token = bt == 0xffffffffu ? sm.sum.arg : bt;
    }
    __syncthreads();
    if (tid == 0)
        finish_row(P, st, rings + (u64)row * ring_cap, ring_cap, out + row, sm.token,
                   &st->ticket_draw, chain);
}
