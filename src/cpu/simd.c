/* simd.c — choose the attention kernel's SIMD table by run-time CPU detection. */
#include "cpu/simd.h"

#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
static bool has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
}

static bool has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
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
