/*
 * ops_rows.h — what the standalone CPU ops (merge, append, RoPE) share:
 * strided rows of f32/f16/bf16 loaded into f32 chunks and stored back, raw
 * element copies, and a row range split across the thread pool.
 */
#ifndef FI_CPU_OPS_ROWS_H
#define FI_CPU_OPS_ROWS_H

#include "cpu/cpu.h"

#include <stdbool.h>
#include <stdint.h>

/* Elements of a row handled at once: the f32 chunks live on the stack. */
#define FI_OPS_CHUNK 256

/* Work below this many bytes moved stays on the calling thread. */
#define FI_OPS_PARALLEL_BYTES (1 << 20)

/* How rows are converted: plain C (auto-vectorised) or, on x86 with F16C,
 * hardware f16 conversion. Chosen once per call from the context. */
typedef enum fi_ops_isa { FI_OPS_ISA_GENERIC = 0, FI_OPS_ISA_F16C = 1 } fi_ops_isa;

fi_ops_isa fi_ops_isa_for(const fi_context *ctx);

/* A row of n elements of `dtype` starting at `p`, `stride` elements apart. */
typedef struct fi_row {
    const void *p;
    fi_dtype dtype;
    int64_t stride;
} fi_row;

/* dst[j] = row[j] for j < n (n <= FI_OPS_CHUNK). */
void fi_ops_load(fi_ops_isa isa, float *dst, fi_row row, int32_t n);
/* row[j] = src[j], rounded to the row's dtype; row.p is written. */
void fi_ops_store(fi_ops_isa isa, fi_row row, const float *src, int32_t n);
/* acc[j] += w * row[j]. */
void fi_ops_axpy(fi_ops_isa isa, float *acc, float w, fi_row row, int32_t n);

/* Copy n elements of `elem` bytes, bit for bit, between strided rows. */
void fi_ops_copy(void *dst, int64_t dst_stride, const void *src, int64_t src_stride,
                 int64_t n, size_t elem);

/* Bytes per element, inline: it is needed per row. */
static inline int64_t fi_ops_elem(fi_dtype dtype) {
    switch (dtype) {
    case FI_DTYPE_F32: case FI_DTYPE_I32: return 4;
    case FI_DTYPE_F16: case FI_DTYPE_BF16: return 2;
    default: return 1;
    }
}

/* Address of element `offset` (in elements) of a buffer of `dtype`. */
static inline const void *fi_ops_at(const void *base, fi_dtype dtype, int64_t offset) {
    return (const char *)base + offset * fi_ops_elem(dtype);
}

/* fn(arg, begin, end) over [0, n), split evenly across the context's pool
 * when `bytes` is large enough to be worth it, else on this thread. */
typedef void (*fi_ops_range_fn)(void *arg, int64_t begin, int64_t end);
void fi_ops_parallel_for(const fi_context *ctx, int64_t n, int64_t bytes,
                         fi_ops_range_fn fn, void *arg);

#endif /* FI_CPU_OPS_ROWS_H */
