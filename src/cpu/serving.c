/*
 * serving.c — the CPU serving ops' common machinery (serving.h): the
 * kernel table of the context's SIMD level, rows across the pool with
 * per-worker scratch, and strided rows to and from f32.
 */
#include "cpu/serving.h"

#include "cpu/simd.h"
#include "core/checked.h"

#include <stdlib.h>
#include <string.h>

const fi_cpu_serving_kernels *fi_cpu_serving_for(const fi_context *ctx) {
    const fi_cpu_state *st = ctx->backend_state;
#if defined(__x86_64__) || defined(_M_X64)
    if (st && st->simd == &fi_cpu_simd_avx512) return &fi_cpu_serving_avx512;
    if (st && st->simd == &fi_cpu_simd_avx2) return &fi_cpu_serving_avx2;
#endif
    (void)st;
    return &fi_cpu_serving_generic;
}

typedef struct rows_job {
    fi_sv_rows_fn fn;
    void *arg;
    int64_t rows;
    char *scratch;
    size_t scratch_bytes;
    int32_t workers; /* the scratch slots: the rows go to pool workers [0, workers) */
} rows_job;

/* Pool worker `worker` of all of them: the rows of slot `worker` when it
 * has one (the pool may have more workers than the call has rows, and
 * scratch was made for `workers` slots only). */
static void rows_worker(void *arg, int32_t worker, int32_t num_workers) {
    const rows_job *j = arg;
    (void)num_workers;
    if (worker >= j->workers) return;
    int64_t begin = j->rows * worker / j->workers;
    int64_t end = j->rows * (worker + 1) / j->workers;
    if (begin < end) j->fn(j->arg, j->scratch + (size_t)worker * j->scratch_bytes, begin, end);
}

fi_status fi_sv_parallel_rows(const fi_context *ctx, int64_t rows, int64_t bytes,
                              size_t shared_bytes, fi_sv_prep_fn prep, size_t scratch_bytes,
                              fi_sv_rows_fn fn, void *arg) {
    fi_cpu_state *st = ctx->backend_state;
    if (rows <= 0) return FI_OK;
    if (!st) return fi_error(FI_STATUS_INTERNAL, "serving op: CPU context without state");
    fi_thread_pool *pool = st->pool;
    int32_t workers = pool ? fi_thread_pool_size(pool) : 1;
    if (rows < 2 || bytes < FI_OPS_PARALLEL_BYTES) workers = 1;
    if (workers > rows) workers = (int32_t)rows;
    scratch_bytes = (scratch_bytes + 63) & ~(size_t)63;
    shared_bytes = (shared_bytes + 63) & ~(size_t)63;
    size_t total;
    if (!fi_mul_size(scratch_bytes ? scratch_bytes : 64, (size_t)workers, &total) ||
        !fi_add_size(total, shared_bytes, &total))
        return fi_error(FI_STATUS_OUT_OF_MEMORY, "serving op scratch: size overflows");
    /* the context's scratch, grown to this call's need (one call at a time
     * per context, as every call on it) */
    if (st->serving_scratch_bytes < total) {
        free(st->serving_scratch);
        st->serving_scratch_bytes = 0;
        st->serving_scratch = aligned_alloc(64, total);
        if (!st->serving_scratch)
            return fi_error(FI_STATUS_OUT_OF_MEMORY,
                            "serving op scratch of %zu bytes: out of memory", total);
        st->serving_scratch_bytes = total;
    }
    char *scratch = (char *)st->serving_scratch + shared_bytes;
    if (prep) prep(arg, st->serving_scratch);
    rows_job job = {fn, arg, rows, scratch, scratch_bytes, workers};
    if (workers == 1) fn(arg, scratch, 0, rows);
    else fi_thread_pool_run(pool, rows_worker, &job);
    return FI_OK;
}

const float *fi_sv_load(fi_ops_isa isa, const fi_tensor *t, int64_t off, int64_t stride,
                        int64_t n, float *buf) {
    if (t->dtype == FI_DTYPE_F32 && (stride == 1 || n <= 1)) return (const float *)t->data + off;
    for (int64_t j = 0; j < n; j += FI_OPS_CHUNK) {
        int32_t c = n - j < FI_OPS_CHUNK ? (int32_t)(n - j) : FI_OPS_CHUNK;
        fi_row r = {fi_ops_at(t->data, t->dtype, off + j * stride), t->dtype, stride};
        fi_ops_load(isa, buf + j, r, c);
    }
    return buf;
}

float *fi_sv_dest(const fi_tensor *t, int64_t off, int64_t stride, float *buf) {
    if (t->dtype == FI_DTYPE_F32 && stride == 1) return (float *)t->data + off;
    return buf;
}

void fi_sv_store(fi_ops_isa isa, const fi_tensor *t, int64_t off, int64_t stride,
                 const float *src, int64_t n) {
    if (t->dtype == FI_DTYPE_F32 && stride == 1) {
        float *dst = (float *)t->data + off;
        if (dst != src) memmove(dst, src, (size_t)n * sizeof *dst);
        return;
    }
    for (int64_t j = 0; j < n; j += FI_OPS_CHUNK) {
        int32_t c = n - j < FI_OPS_CHUNK ? (int32_t)(n - j) : FI_OPS_CHUNK;
        fi_row r = {fi_ops_at(t->data, t->dtype, off + j * stride), t->dtype, stride};
        fi_ops_store(isa, r, src + j, c);
    }
}
