/* simd.c — choose the attention kernel's SIMD table by run-time CPU detection. */
#include "cpu/simd.h"

#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>

/* CPUID and XCR0 directly: clang 14's __builtin_cpu_supports lacks some of
 * these names. The OS must also save the wider registers (XCR0). */
typedef struct x86_features {
    bool avx2, fma, f16c, avx512;
} x86_features;

static x86_features x86_detect(void) {
    x86_features f = {false, false, false, false};
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    bool osxsave = (c >> 27) & 1;
    f.fma = (c >> 12) & 1;
    f.f16c = (c >> 29) & 1;
    if (!osxsave) return f;
    unsigned xa, xd;
    __asm__ __volatile__("xgetbv" : "=a"(xa), "=d"(xd) : "c"(0));
    bool ymm = (xa & 0x6) == 0x6, zmm = (xa & 0xe6) == 0xe6;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
    f.avx2 = ymm && ((b >> 5) & 1);
    /* F (16), DQ (17), BW (30), VL (31). The kernels use no BF16
     * instructions (docs/CPU_KERNELS.md), so AVX512_BF16 is not required. */
    f.avx512 = zmm && ((b >> 16) & 1) && ((b >> 17) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1);
    return f;
}

static bool has_avx512(void) {
    x86_features f = x86_detect();
    return f.avx512 && f.fma && f.f16c;
}

static bool has_avx2(void) {
    x86_features f = x86_detect();
    return f.avx2 && f.fma && f.f16c;
}
#endif

/* Whether `name` is wanted and its table is built (a table without kernels
 * is a placeholder). */
static bool wanted(const char *request, const fi_cpu_simd *t, const char *name) {
    bool any = !request || !request[0] || strcmp(request, "auto") == 0;
    return t->qk && (any || strcmp(request, name) == 0);
}

const fi_cpu_simd *fi_cpu_simd_select(const char *request) {
#if defined(__x86_64__) || defined(_M_X64)
    if (wanted(request, &fi_cpu_simd_avx512, "avx512") && has_avx512()) return &fi_cpu_simd_avx512;
    if (wanted(request, &fi_cpu_simd_avx2, "avx2") && has_avx2()) return &fi_cpu_simd_avx2;
#endif
#if defined(__aarch64__)
    /* Advanced SIMD is part of the AArch64 base architecture. */
    if (wanted(request, &fi_cpu_simd_neon, "neon")) return &fi_cpu_simd_neon;
#endif
    if (wanted(request, &fi_cpu_simd_generic, "generic")) return &fi_cpu_simd_generic;
    return NULL;
}

static bool base_dim(int32_t d) { return d == 64 || d == 128 || d == 256; }

const fi_cpu_simd *fi_cpu_simd_for_dims(const fi_cpu_simd *table, int32_t dqk, int32_t dvo) {
    if ((base_dim(dqk) && base_dim(dvo)) || table == &fi_cpu_simd_generic) return table;
#if defined(__x86_64__) || defined(_M_X64)
    /* AVX2 steps 16 elements of a head: every dim here. AVX-512 steps 64
     * (tested: 192, 512 right; 80, 96 wrong), so it hands the others to AVX2. */
    if (table == &fi_cpu_simd_avx2) return table;
    if (table == &fi_cpu_simd_avx512) {
        if (dqk % 64 == 0 && dvo % 64 == 0) return table;
        if (fi_cpu_simd_avx2.qk && has_avx2()) return &fi_cpu_simd_avx2;
    }
#endif
    /* NEON: only the base dims are tested; the generic table runs any dim. */
    return &fi_cpu_simd_generic;
}
