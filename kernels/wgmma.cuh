/*
 * wgmma.cuh — the sm_90a warpgroup matrix instructions the Hopper prefill
 * kernel (attention_wg.cuh) issues, as inline PTX (they have no C form):
 * D[64 x N] (+)= A[64 x 16] B[16 x N], f32 accumulators, A and B f16 or bf16
 * (FI_WG_AB, from FI_QT).
 *
 *   fi_wg_ss<N>(d, desc_a, desc_b, acc)  A and B in shared memory (K-major)
 *   fi_wg_rs<N>(d, a, desc_b)            A in registers (4 x b32, the
 *                                        mma.sync m16k16 fragment per warp),
 *                                        B in shared memory, MN-major
 *
 * Accumulator d[4 j + 2 h + e] of thread t (warp w = t / 32 of the
 * warpgroup, lane l) is row 16 w + l / 4 + 8 h, column 8 j + 2 (l % 4) + e.
 * Shared-memory operands are named by descriptors (fi_wg_desc): a tile of
 * 128-byte rows (64 16-bit elements), 128-byte swizzle (16-byte chunk c of
 * row r at chunk c ^ (r & 7), atoms of 8 rows 1024-byte aligned).
 * The instructions run asynchronously: fi_wg_fence before the first of a
 * group (registers written since must be settled), fi_wg_commit after the
 * last, fi_wg_wait<N> until at most N groups are in flight; the operand
 * registers must not be touched in between (fi_wg_pin keeps the compiler
 * from moving their uses across).
 */
#ifndef FI_WGMMA_CUH
#define FI_WGMMA_CUH

#include "prelude.cuh"

#if FI_QT == FI_T_BF16
#define FI_WG_AB "bf16"
#else
#define FI_WG_AB "f16"
#endif

/* A shared-memory matrix descriptor: start address, leading and stride
 * byte offsets (16-byte units), 128-byte swizzle. K-major: the stride is
 * between 8-row groups, the leading offset unused (1). MN-major: the stride
 * is between groups of 8 K-rows, the leading offset between 64-element
 * panels of the MN dimension. */
FI_DEV uint64_t fi_wg_desc(uint32_t addr, uint32_t lead, uint32_t stride) {
    return (uint64_t)((addr & 0x3ffff) >> 4) | ((uint64_t)(lead >> 4) << 16) |
           ((uint64_t)(stride >> 4) << 32) | (1ull << 62);
}

FI_DEV void fi_wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
FI_DEV void fi_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
FI_DEV void fi_wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* The accumulators stay where they are across an asynchronous group. */
template <int N>
FI_DEV void fi_wg_pin(float *d) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

#define FI_WG_F4(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define FI_WG_F16(d, i) FI_WG_F4(d, i), FI_WG_F4(d, i + 4), FI_WG_F4(d, i + 8), FI_WG_F4(d, i + 12)
#define FI_WG_F32(d, i) FI_WG_F16(d, i), FI_WG_F16(d, i + 16)
#define FI_WG_F64(d, i) FI_WG_F32(d, i), FI_WG_F32(d, i + 32)

/* D (+)= A B, both from shared memory (K-major); acc = 0: D = A B. */
template <int N>
FI_DEV void fi_wg_ss(float *d, uint64_t da, uint64_t db, int acc) {
    static_assert(N == 64 || N == 128, "N");
    if constexpr (N == 64) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." FI_WG_AB "." FI_WG_AB " "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                     "%32, %33, p, 1, 1, 0, 0;\n}"
                     : FI_WG_F32(d, 0)
                     : "l"(da), "l"(db), "r"(acc));
    } else {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." FI_WG_AB "." FI_WG_AB " "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                     "%64, %65, p, 1, 1, 0, 0;\n}"
                     : FI_WG_F64(d, 0)
                     : "l"(da), "l"(db), "r"(acc));
    }
}

/* D += A B, A from registers, B from shared memory (MN-major). */
template <int N>
FI_DEV void fi_wg_rs(float *d, const uint32_t *a, uint64_t db) {
    static_assert(N == 64 || N == 128 || N == 256, "N");
    if constexpr (N == 64) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." FI_WG_AB "." FI_WG_AB " "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                     "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}"
                     : FI_WG_F32(d, 0)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
    } else if constexpr (N == 128) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." FI_WG_AB "." FI_WG_AB " "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                     "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}"
                     : FI_WG_F64(d, 0)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
    } else {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32." FI_WG_AB "." FI_WG_AB " "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
                     "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}"
                     : FI_WG_F64(d, 0), FI_WG_F64(d, 64)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
    }
}

#endif /* FI_WGMMA_CUH */
