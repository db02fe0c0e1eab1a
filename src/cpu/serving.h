/*
 * serving.h — what the CPU serving ops share (ops_norm.c, ops_sample.c):
 * the vector kernel table of each SIMD level (serving_kern.h), rows split
 * across the thread pool with per-worker scratch, and strided rows of any
 * float dtype read into / written from contiguous f32.
 */
#ifndef FI_CPU_SERVING_H
#define FI_CPU_SERVING_H

#include "cpu/cpu.h"
#include "cpu/ops_rows.h"

#include <stdint.h>
#include <string.h>

/* What fi_cpu_serving_kernels.stats finds in a row. */
#define FI_SV_NEGATIVE 1u
#define FI_SV_NAN 2u
#define FI_SV_POS_INF 4u

/* An order-preserving key of a float: -0 as +0 (its flipped bits plus
 * one), every NaN above +inf (all ones). Arithmetic, not selects: GCC
 * vectorises a max over these keys only then. */
static inline uint32_t fi_sv_key(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t key = u ^ ((uint32_t)((int32_t)u >> 31) | 0x80000000u);
    key += (uint32_t)(u == 0x80000000u);
    return key | (0u - (uint32_t)((u & 0x7fffffffu) > 0x7f800000u));
}

/* Kernels over contiguous f32 (serving_kern.h says what each computes);
 * every level's table gives bitwise the same results. */
typedef struct fi_cpu_serving_kernels {
    const char *name;
    float (*sum_sq)(const float *x, int64_t n);
    float (*sum)(const float *x, int64_t n);
    float (*sum_sq_dev)(const float *x, float m, int64_t n);
    float (*masked_sum)(const float *x, float t, int64_t n);
    float (*exp_sum)(float *y, const float *x, float m, float s, float t, int64_t n);
    void (*stats)(const float *x, int64_t n, float *max, uint32_t *kinds);
    void (*add)(float *y, const float *a, const float *b, int64_t n);
    void (*masked_scale)(float *y, const float *x, float t, float s, int64_t n);
    void (*rms_apply)(float *y, const float *x, const float *w, float r, int64_t n);
    void (*rotate)(float *y, const float *x, const float *c, const float *s, int64_t half,
                   int neox);
    void (*ln_apply)(float *y, const float *x, const float *w, const float *b, float m,
                     float r, int64_t n);
    void (*to_fp8)(uint8_t *y, const float *x, float s, int e5m2, int64_t n);
    void (*act)(int kind, float *y, const float *a, const float *b, int64_t n);
    /* bf16 rows (uint16_t bits) read and written directly: the values of
     * the f32 kernels above, rounded once as fi_sv_store rounds */
    void (*act_bf16)(int kind, uint16_t *y, const uint16_t *a, const uint16_t *b, int64_t n);
    float (*sum_sq_bf16)(const uint16_t *x, int64_t n);
    void (*rms_apply_bf16)(uint16_t *y, const uint16_t *xb, const float *xf, const float *w,
                           float r, int64_t n);
    void (*add_bf16)(float *sum, uint16_t *res, const uint16_t *x, int64_t n);
    void (*block_max_keys)(const float *x, int64_t n, int64_t b, uint32_t *out);
} fi_cpu_serving_kernels;

extern const fi_cpu_serving_kernels fi_cpu_serving_generic;
#if defined(__x86_64__) || defined(_M_X64)
extern const fi_cpu_serving_kernels fi_cpu_serving_avx2;
extern const fi_cpu_serving_kernels fi_cpu_serving_avx512;
#endif

/* The backend's entries (fi_backend: norm ... rope_cos_sin). */
fi_status fi_cpu_norm(fi_context *ctx, const fi_norm_args *a, void *stream);
fi_status fi_cpu_gated_act(fi_context *ctx, const fi_act_args *a, void *stream);
fi_status fi_cpu_softmax(fi_context *ctx, const fi_softmax_args *a, void *stream);
fi_status fi_cpu_sample(fi_context *ctx, const fi_sample_args *a, void *stream);
fi_status fi_cpu_filter(fi_context *ctx, const fi_filter_args *a, void *stream);
fi_status fi_cpu_chain_speculative(fi_context *ctx, const fi_spec_args *a, void *stream);
fi_status fi_cpu_top_k(fi_context *ctx, const fi_topk_args *a, void *stream);
fi_status fi_cpu_rope_cos_sin(fi_context *ctx, const fi_rope_cache_args *a, void *stream);
fi_status fi_cpu_rope_quant(fi_context *ctx, const fi_rq_args *a, void *stream);

/* The table of the context's SIMD level. */
const fi_cpu_serving_kernels *fi_cpu_serving_for(const fi_context *ctx);

/* Elements per block of the sampling sums: a block's f32 lane sum, then
 * blocks added in f64 in order. */
#define FI_SV_BLOCK 1024

/* fn(arg, scratch, begin, end) over rows [0, rows), split evenly across the
 * context's pool when `bytes` (moved in all) makes it worth it; `scratch`
 * is the worker's own `scratch_bytes` (64-byte aligned, uninitialised).
 * First prep(arg, shared) (when not NULL) fills `shared_bytes` that every
 * worker reads. The memory is the context's, kept between calls.
 * FI_STATUS_OUT_OF_MEMORY when it cannot be had (nothing run). */
typedef void (*fi_sv_rows_fn)(void *arg, void *scratch, int64_t begin, int64_t end);
typedef void (*fi_sv_prep_fn)(void *arg, void *shared);
fi_status fi_sv_parallel_rows(const fi_context *ctx, int64_t rows, int64_t bytes,
                              size_t shared_bytes, fi_sv_prep_fn prep, size_t scratch_bytes,
                              fi_sv_rows_fn fn, void *arg);

/* Row `off` (element offset) of t, n elements `stride` apart, as f32: a
 * pointer into t itself when it is f32 and contiguous, else converted into
 * buf. */
const float *fi_sv_load(fi_ops_isa isa, const fi_tensor *t, int64_t off, int64_t stride,
                        int64_t n, float *buf);
/* Write n f32 values into row `off` of t (rounded to its dtype), unless
 * src already is that memory. */
void fi_sv_store(fi_ops_isa isa, const fi_tensor *t, int64_t off, int64_t stride,
                 const float *src, int64_t n);
/* Where a kernel can write row `off` of t directly (f32, contiguous), else
 * buf (then fi_sv_store it). */
float *fi_sv_dest(const fi_tensor *t, int64_t off, int64_t stride, float *buf);

/* Bytes of scratch for `floats` f32 values, rounded up to 64. */
static inline size_t fi_sv_floats(int64_t floats) {
    return ((size_t)floats * sizeof(float) + 63) & ~(size_t)63;
}

#endif /* FI_CPU_SERVING_H */
