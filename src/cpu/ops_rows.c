/*
 * ops_rows.c — row conversion and copy primitives of the standalone CPU ops,
 * and their split across the thread pool.
 *
 * The loop bodies are written once, branch-free, so the compiler vectorises
 * them; they are instantiated twice: for the baseline target and, on x86,
 * for AVX2+FMA+F16C (selected at run time; every AVX2 CPU has F16C), where
 * f16 rows also use the hardware converters.
 */
/* GCC's -O2 vectorises only loops of a known trip count; these row loops
 * have run-time lengths. Clang vectorises them at -O2 already. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("vect-cost-model=dynamic")
#endif
#include "cpu/ops_rows.h"

#include "cpu/convert.h"
#include "cpu/simd.h"

#include <string.h>

#if defined(__GNUC__)
#define FI_OPS_INLINE static inline __attribute__((always_inline))
#else
#define FI_OPS_INLINE static inline
#endif

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define FI_OPS_X86 1
#include <immintrin.h>
#define FI_OPS_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

/* Follow the level the context chose (its request, FI_CPU_SIMD, or the
 * CPU's best): the generic table stays portable; every x86 table above it
 * is only chosen on a CPU with AVX2, FMA and F16C. */
fi_ops_isa fi_ops_isa_for(const fi_context *ctx) {
    const fi_cpu_state *st = ctx->backend_state;
    if (!st || !st->simd || st->simd == &fi_cpu_simd_generic) return FI_OPS_ISA_GENERIC;
#ifdef FI_OPS_X86
    return FI_OPS_ISA_F16C;
#else
    return FI_OPS_ISA_GENERIC;
#endif
}

/* ------------------------------------------------- branch-free scalars */

/* cond ? a : b for cond in {0, 1}, as masks: GCC keeps a ?: as a branch,
 * which stops it vectorising the loop. */
FI_OPS_INLINE uint32_t select_u32(uint32_t cond, uint32_t a, uint32_t b) {
    uint32_t m = 0u - cond;
    return (a & m) | (b & ~m);
}

/* f16 bits -> f32: the exponent and mantissa shifted into place are an f32
 * 2^112 too small (subnormals included); Inf/NaN are fixed up by select. */
FI_OPS_INLINE float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t bits = fi_f32_to_bits(fi_bits_to_f32(em << 13) * 0x1p112f);
    bits = select_u32(em >= 0x7c00u, 0x7f800000u | ((em & 0x3ffu) << 13), bits);
    return fi_bits_to_f32(sign | bits);
}

/* f32 -> f16 bits, round to nearest even. Subnormal results: adding 0.5
 * puts |x| on a grid of 2^-24 (the ulp of [0.5, 1)), rounded by the FPU. */
FI_OPS_INLINE uint16_t f32_to_f16(float f) {
    uint32_t u = fi_f32_to_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    uint32_t normal = (a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
    uint32_t sub = fi_f32_to_bits(fi_bits_to_f32(a) + 0.5f) - 0x3f000000u;
    uint32_t r = select_u32(a < 0x38800000u, sub, normal);
    r = select_u32(a >= 0x477ff000u, 0x7c00u, r);
    r = select_u32(a > 0x7f800000u, 0x7e00u, r);
    return (uint16_t)(sign | r);
}

FI_OPS_INLINE uint16_t f32_to_bf16(float f) {
    uint32_t u = fi_f32_to_bits(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)select_u32((u & 0x7fffffffu) > 0x7f800000u, nan, rounded);
}

/* ------------------------------------------------------ loop bodies */

/* Each dtype gets a unit-stride loop (vectorised) and a strided one. */
#define FI_OPS_ROW_LOOP(stride, body)                                   \
    do {                                                                \
        if ((stride) == 1) {                                            \
            for (int32_t j = 0; j < n; j++) { const int64_t o = j; body; } \
        } else {                                                        \
            for (int32_t j = 0; j < n; j++) {                           \
                const int64_t o = (int64_t)j * (stride);                \
                body;                                                   \
            }                                                           \
        }                                                               \
    } while (0)

FI_OPS_INLINE void load_body(float *restrict dst, fi_row r, int32_t n) {
    switch (r.dtype) {
    case FI_DTYPE_F32: {
        const float *p = r.p;
        FI_OPS_ROW_LOOP(r.stride, dst[j] = p[o]);
        break;
    }
    case FI_DTYPE_F16: {
        const uint16_t *p = r.p;
        FI_OPS_ROW_LOOP(r.stride, dst[j] = f16_to_f32(p[o]));
        break;
    }
    case FI_DTYPE_BF16: {
        const uint16_t *p = r.p;
        FI_OPS_ROW_LOOP(r.stride, dst[j] = fi_bits_to_f32((uint32_t)p[o] << 16));
        break;
    }
    default: break;
    }
}

FI_OPS_INLINE void store_body(fi_row r, const float *restrict src, int32_t n) {
    switch (r.dtype) {
    case FI_DTYPE_F32: {
        float *p = (float *)r.p;
        FI_OPS_ROW_LOOP(r.stride, p[o] = src[j]);
        break;
    }
    case FI_DTYPE_F16: {
        uint16_t *p = (uint16_t *)r.p;
        FI_OPS_ROW_LOOP(r.stride, p[o] = f32_to_f16(src[j]));
        break;
    }
    case FI_DTYPE_BF16: {
        uint16_t *p = (uint16_t *)r.p;
        FI_OPS_ROW_LOOP(r.stride, p[o] = f32_to_bf16(src[j]));
        break;
    }
    default: break;
    }
}

FI_OPS_INLINE void axpy_body(float *restrict acc, float w, fi_row r, int32_t n) {
    switch (r.dtype) {
    case FI_DTYPE_F32: {
        const float *p = r.p;
        FI_OPS_ROW_LOOP(r.stride, acc[j] += w * p[o]);
        break;
    }
    case FI_DTYPE_F16: {
        const uint16_t *p = r.p;
        FI_OPS_ROW_LOOP(r.stride, acc[j] += w * f16_to_f32(p[o]));
        break;
    }
    case FI_DTYPE_BF16: {
        const uint16_t *p = r.p;
        FI_OPS_ROW_LOOP(r.stride, acc[j] += w * fi_bits_to_f32((uint32_t)p[o] << 16));
        break;
    }
    default: break;
    }
}

/* --------------------------------------------------- instantiations */

static void load_generic(float *dst, fi_row r, int32_t n) { load_body(dst, r, n); }
static void store_generic(fi_row r, const float *src, int32_t n) { store_body(r, src, n); }
static void axpy_generic(float *acc, float w, fi_row r, int32_t n) { axpy_body(acc, w, r, n); }

#ifdef FI_OPS_X86
/* f16 through the F16C converters, 8 lanes at a time; tails go scalar. */
FI_OPS_TARGET_AVX2 static void load_avx2(float *dst, fi_row r, int32_t n) {
    if (r.dtype != FI_DTYPE_F16 || r.stride != 1) {
        load_body(dst, r, n);
        return;
    }
    const uint16_t *p = r.p;
    int32_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + j))));
    for (; j < n; j++) dst[j] = f16_to_f32(p[j]);
}

FI_OPS_TARGET_AVX2 static void store_avx2(fi_row r, const float *src, int32_t n) {
    if (r.dtype != FI_DTYPE_F16 || r.stride != 1) {
        store_body(r, src, n);
        return;
    }
    uint16_t *p = (uint16_t *)r.p;
    int32_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm_storeu_si128((__m128i *)(p + j),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + j), _MM_FROUND_TO_NEAREST_INT));
    for (; j < n; j++) p[j] = f32_to_f16(src[j]);
}

FI_OPS_TARGET_AVX2 static void axpy_avx2(float *acc, float w, fi_row r, int32_t n) {
    if (r.dtype != FI_DTYPE_F16 || r.stride != 1) {
        axpy_body(acc, w, r, n);
        return;
    }
    const uint16_t *p = r.p;
    const __m256 vw = _mm256_set1_ps(w);
    int32_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + j)));
        _mm256_storeu_ps(acc + j, _mm256_fmadd_ps(vw, x, _mm256_loadu_ps(acc + j)));
    }
    for (; j < n; j++) acc[j] += w * f16_to_f32(p[j]);
}
#endif

void fi_ops_load(fi_ops_isa isa, float *dst, fi_row row, int32_t n) {
#ifdef FI_OPS_X86
    if (isa == FI_OPS_ISA_F16C) {
        load_avx2(dst, row, n);
        return;
    }
#endif
    (void)isa;
    load_generic(dst, row, n);
}

void fi_ops_store(fi_ops_isa isa, fi_row row, const float *src, int32_t n) {
#ifdef FI_OPS_X86
    if (isa == FI_OPS_ISA_F16C) {
        store_avx2(row, src, n);
        return;
    }
#endif
    (void)isa;
    store_generic(row, src, n);
}

void fi_ops_axpy(fi_ops_isa isa, float *acc, float w, fi_row row, int32_t n) {
#ifdef FI_OPS_X86
    if (isa == FI_OPS_ISA_F16C) {
        axpy_avx2(acc, w, row, n);
        return;
    }
#endif
    (void)isa;
    axpy_generic(acc, w, row, n);
}

/* ------------------------------------------------------------ copies */

void fi_ops_copy(void *dst, int64_t dst_stride, const void *src, int64_t src_stride,
                 int64_t n, size_t elem) {
    if (dst_stride == 1 && src_stride == 1) {
        memmove(dst, src, (size_t)n * elem);
        return;
    }
    char *d = dst;
    const char *s = src;
    for (int64_t j = 0; j < n; j++)
        memcpy(d + j * dst_stride * (int64_t)elem, s + j * src_stride * (int64_t)elem, elem);
}

/* ------------------------------------------------------------ threads */

typedef struct parallel_job {
    fi_ops_range_fn fn;
    void *arg;
    int64_t n;
} parallel_job;

static void parallel_worker(void *arg, int32_t worker, int32_t num_workers) {
    const parallel_job *job = arg;
    int64_t begin = job->n * worker / num_workers;
    int64_t end = job->n * (worker + 1) / num_workers;
    if (begin < end) job->fn(job->arg, begin, end);
}

void fi_ops_parallel_for(const fi_context *ctx, int64_t n, int64_t bytes,
                         fi_ops_range_fn fn, void *arg) {
    if (n <= 0) return;
    fi_thread_pool *pool = ctx->backend_state ? fi_cpu_pool(ctx) : NULL;
    if (!pool || n < 2 || bytes < FI_OPS_PARALLEL_BYTES || fi_thread_pool_size(pool) < 2) {
        fn(arg, 0, n);
        return;
    }
    parallel_job job = {fn, arg, n};
    fi_thread_pool_run(pool, parallel_worker, &job);
}
