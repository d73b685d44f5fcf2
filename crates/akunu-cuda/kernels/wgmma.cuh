// Hopper warpgroup MMA (wgmma, sm_90a only) as inline PTX: shared-memory matrix descriptors,
// the fences and group waits, and the shapes the FlashAttention prefill uses. The including
// file defines WG_T, the element type's PTX name ("f16" or "bf16").
//
// Shared-memory operands use the 128-byte swizzle: a matrix is stored as column blocks of 64
// elements (128 bytes a row), each block's rows 128 bytes apart, 16-byte chunk c of row r at
// chunk c ^ (r % 8), every block starting on a 1024-byte boundary (the hardware applies the
// swizzle to address bits 4-6 from bits 7-9). One wgmma reads 16 elements of K: a K-major
// operand (Q, K) advances its start address 32 bytes per K step inside a block and moves to
// the next block every four steps; an MN-major operand (V, rows are keys) advances 16 rows.
// Accumulator fragments are those of mma.m16n8 per warp (warp w of the group owns rows
// 16w..16w+15): d[j][0..1] row lane / 4, d[j][2..3] row lane / 4 + 8, columns 8j + 2 (lane % 4).
#pragma once
#include "common.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define AKUNU_WGMMA 1

// Descriptor of a 128-byte-swizzled operand at shared address `addr`: `lbo` is the byte
// distance between column blocks along M or N (MN-major operands; unused for K-major), `sbo`
// between groups of 8 rows.
__device__ __forceinline__ u64 wgmma_desc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)((lbo & 0x3FFFF) >> 4) << 16) |
           ((u64)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

// The descriptor of the operand `bytes` past descriptor d's: its start address, in 16-byte
// units in the low 14 bits, takes the offset without carrying out while the operand lies in
// the 256 KiB that shared memory addresses span. A loop's descriptors are then one add each.
__device__ __forceinline__ u64 wgmma_desc_at(u64 d, u32 bytes) { return d + (bytes >> 4); }

// Before the first wgmma that reads registers written by ordinary instructions.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N of this warpgroup's committed groups are still running.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Tells the compiler the accumulators may change here (an asynchronous wgmma writes them until
// its wait), so it neither reads them early nor moves them across.
template <int NT>
__device__ __forceinline__ void wgmma_fence_regs(float (&d)[NT][4]) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}
// The same for A fragments in registers: a wgmma reads them until its wait, but to the compiler
// they are dead once it is issued, and ptxas reuses their registers for other values.
template <int NK>
__device__ __forceinline__ void wgmma_fence_operands(const u32 (&a)[NK][4]) {
#pragma unroll
    for (int k = 0; k < NK; ++k)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" ::"r"(a[k][e]) : "memory");
}
// Shared memory written by ordinary stores or cp.async, next read by the tensor cores: each
// writing thread fences before the barrier that publishes it.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Shared-memory barriers (mbarrier) for producer and consumer warps: `count` arrivals complete
// a phase; a waiter names the parity of the phase it waits for.
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Arrives on the barrier once every cp.async this thread issued so far has landed (counted
// in the barrier's arrivals).
__device__ __forceinline__ void mbar_arrive_cp_async(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Holds the barrier's phase until every cp.async this thread issued so far has landed, without
// counting as one of its arrivals.
__device__ __forceinline__ void mbar_arrive_cp_async_inc(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done = 0;
    while (!done)
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
}

// Arrives on the barrier and adds `bytes` to the bytes its phase waits for (tensor copies).
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}

// A box of a 4-dimensional tensor at coordinates (c0 innermost .. c3) into shared memory at
// dst by the tensor memory accelerator, described by the tensor map at `map` (a kernel
// parameter declared __grid_constant__); its bytes count against the barrier's phase as they
// land. The map's swizzle lays the box out as the wgmma operands expect.
__device__ __forceinline__ void tma_load_4d(u32 dst, const void* map, int c0, int c1, int c2, int c3, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
        "%5}], [%6];\n" ::"r"(dst),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}

// A warpgroup's register budget, raised or lowered (the kernel needs __launch_bounds__(n, 1)).
template <int N>
__device__ __forceinline__ void regs_raise() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void regs_lower() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }

// The accumulators as operands: the instruction's registers %0.. (WG_REGS_N*) and d[j][e] in
// the same order, four per group of 8 columns (WG_ACC_N*); the other operands follow them.
#define WG_REGS_N64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_REGS_N128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WG_REGS_N256 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define WG_D4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define WG_ACC_N64 WG_D4(0), WG_D4(1), WG_D4(2), WG_D4(3), WG_D4(4), WG_D4(5), WG_D4(6), WG_D4(7)
#define WG_ACC_N128 WG_ACC_N64, WG_D4(8), WG_D4(9), WG_D4(10), WG_D4(11), WG_D4(12), WG_D4(13), WG_D4(14), WG_D4(15)
#define WG_ACC_N256                                                                                              \
    WG_ACC_N128, WG_D4(16), WG_D4(17), WG_D4(18), WG_D4(19), WG_D4(20), WG_D4(21), WG_D4(22), WG_D4(23), WG_D4(24), \
        WG_D4(25), WG_D4(26), WG_D4(27), WG_D4(28), WG_D4(29), WG_D4(30), WG_D4(31)

// d (64 x 64) = A (64 x 16, shared, K-major) * B (16 x 64, shared, K-major), plus d if `accumulate`.
__device__ __forceinline__ void wgmma_ss64(float (&d)[8][4], u64 da, u64 db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." WG_T "." WG_T "\n" WG_REGS_N64 ",\n"
                 "%32, %33, p, 1, 1, 0, 0;\n}\n"
                 : WG_ACC_N64
                 : "l"(da), "l"(db), "r"(accumulate));
}

// d (64 x 64) += A (64 x 16, registers) * B (16 x 64, shared, MN-major).
__device__ __forceinline__ void wgmma_rs64_mn(float (&d)[8][4], const u32 (&a)[4], u64 db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." WG_T "." WG_T "\n" WG_REGS_N64 ",\n"
                 "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : WG_ACC_N64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// d (64 x 128) = A (64 x 16, shared, K-major) * B (16 x 128, shared, K-major), plus d if `accumulate`.
__device__ __forceinline__ void wgmma_ss128(float (&d)[16][4], u64 da, u64 db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." WG_T "." WG_T "\n" WG_REGS_N128 ",\n"
                 "%64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WG_ACC_N128
                 : "l"(da), "l"(db), "r"(accumulate));
}

// d (64 x 128) += A (64 x 16, registers) * B (16 x 128, shared, MN-major).
__device__ __forceinline__ void wgmma_rs128_mn(float (&d)[16][4], const u32 (&a)[4], u64 db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." WG_T "." WG_T "\n" WG_REGS_N128 ",\n"
                 "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : WG_ACC_N128
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// d (64 x 256) += A (64 x 16, registers) * B (16 x 256, shared, MN-major).
__device__ __forceinline__ void wgmma_rs256_mn(float (&d)[32][4], const u32 (&a)[4], u64 db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." WG_T "." WG_T "\n" WG_REGS_N256 ",\n"
                 "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
                 : WG_ACC_N256
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

#endif
