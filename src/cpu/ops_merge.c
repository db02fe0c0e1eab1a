/*
 * ops_merge.c — merging attention states (O, LSE) on the CPU.
 *
 * A state over a key subset is O [n, H, D] (normalised) with LSE [n, H] in
 * base 2. Two states merge as
 *   M = max(La, Lb), wa = 2^(La - M), wb = 2^(Lb - M)
 *   O = (wa Oa + wb Ob) / (wa + wb),  L = M + log2(wa + wb)
 * Non-finite values (docs/SEMANTICS.md): a state with LSE -inf is never
 * read, so whatever its O holds cannot leak; no state at all gives O = 0,
 * L = -inf; a state with LSE NaN or +inf makes the row's O and L NaN; every
 * other state is read whatever its weight, its O entering the weighted sum
 * in IEEE arithmetic (an infinity stays one, opposite ones or a NaN give
 * NaN). A chunk whose f32 sum is not finite is summed again in f64, so
 * finite states never overflow to an infinity. Rows (token, head) are
 * independent and are split across the thread pool; D is processed in f32
 * chunks.
 */
/* GCC's -O2 vectorises only loops of a known trip count; these row loops
 * have run-time lengths. Clang vectorises them at -O2 already. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("vect-cost-model=dynamic")
#endif
#include "cpu/convert.h"
#include "cpu/cpu.h"
#include "cpu/ops_rows.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

static inline fi_row row_at(const fi_tensor *t, int64_t offset, int32_t last_dim) {
    fi_row r = {fi_ops_at(t->data, t->dtype, offset), t->dtype, t->stride[last_dim]};
    return r;
}

/* The row advanced by d elements along it. */
static inline fi_row row_skip(fi_row r, int32_t d) {
    r.p = fi_ops_at(r.p, r.dtype, (int64_t)d * r.stride);
    return r;
}

static inline float *lse_at(const fi_tensor *s, int64_t offset) {
    return (float *)s->data + offset;
}

/* Write O = 0 (the state of an empty key set) into a row of D elements. */
static void store_zero_row(fi_ops_isa isa, fi_row out, int32_t dim) {
    float zero[FI_OPS_CHUNK];
    memset(zero, 0, sizeof zero);
    for (int32_t d0 = 0; d0 < dim; d0 += FI_OPS_CHUNK) {
        int32_t n = dim - d0 < FI_OPS_CHUNK ? dim - d0 : FI_OPS_CHUNK;
        fi_ops_store(isa, row_skip(out, d0), zero, n);
    }
}

/* Write O = NaN and L = NaN: a state with LSE NaN or +inf was merged. */
static void store_nan_row(fi_ops_isa isa, fi_row out, int32_t dim, float *lse) {
    float nan[FI_OPS_CHUNK];
    for (int32_t d = 0; d < FI_OPS_CHUNK; d++) nan[d] = NAN;
    for (int32_t d0 = 0; d0 < dim; d0 += FI_OPS_CHUNK) {
        int32_t n = dim - d0 < FI_OPS_CHUNK ? dim - d0 : FI_OPS_CHUNK;
        fi_ops_store(isa, row_skip(out, d0), nan, n);
    }
    *lse = NAN;
}

/* The f64 path of a chunk whose f32 sum came out not finite: exact_add
 * once per state read (w normalised), then exact_finish writes acc[0..n). */
typedef struct exact_sum {
    double sum[FI_OPS_CHUNK];
} exact_sum;

static void exact_add(exact_sum *e, fi_ops_isa isa, fi_row row, float w, int32_t n) {
    float x[FI_OPS_CHUNK];
    fi_ops_load(isa, x, row, n);
    for (int32_t d = 0; d < n; d++) e->sum[d] += (double)w * x[d];
}

static void exact_finish(const exact_sum *e, float *acc, int32_t n) {
    for (int32_t d = 0; d < n; d++) acc[d] = (float)e->sum[d];
}

/* ------------------------------------------------------- two states */

typedef struct merge2_job {
    const fi_tensor *va, *sa, *vb, *sb; /* [n, H, D], [n, H] */
    const fi_tensor *vo, *so;           /* may be va, sa (in place) */
    const fi_tensor *mask;              /* [n] u8, or NULL: every row */
    int64_t heads;
    int32_t dim;
    fi_ops_isa isa;
} merge2_job;

static void merge2_row(const merge2_job *j, int64_t i, int64_t h) {
    float la = *lse_at(j->sa, i * j->sa->stride[0] + h * j->sa->stride[1]);
    float lb = *lse_at(j->sb, i * j->sb->stride[0] + h * j->sb->stride[1]);
    fi_row a = row_at(j->va, i * j->va->stride[0] + h * j->va->stride[1], 2);
    fi_row b = row_at(j->vb, i * j->vb->stride[0] + h * j->vb->stride[1], 2);
    fi_row o = row_at(j->vo, i * j->vo->stride[0] + h * j->vo->stride[1], 2);
    float *lo = lse_at(j->so, i * j->so->stride[0] + h * j->so->stride[1]);

    if (!(la < INFINITY) || !(lb < INFINITY)) {
        store_nan_row(j->isa, o, j->dim, lo);
        return;
    }
    float m = fmaxf(la, lb);
    if (m == -INFINITY) {
        store_zero_row(j->isa, o, j->dim);
        *lo = -INFINITY;
        return;
    }
    float wa = exp2f(la - m), wb = exp2f(lb - m), sum = wa + wb;
    wa /= sum;
    wb /= sum;
    bool ra = la != -INFINITY, rb = lb != -INFINITY; /* read, whatever the weight */
    for (int32_t d0 = 0; d0 < j->dim; d0 += FI_OPS_CHUNK) {
        int32_t n = j->dim - d0 < FI_OPS_CHUNK ? j->dim - d0 : FI_OPS_CHUNK;
        float acc[FI_OPS_CHUNK];
        memset(acc, 0, (size_t)n * sizeof(float));
        if (ra) fi_ops_axpy(j->isa, acc, wa, row_skip(a, d0), n);
        if (rb) fi_ops_axpy(j->isa, acc, wb, row_skip(b, d0), n);
        if (!fi_all_finite(acc, n)) {
            exact_sum e = {{0}};
            if (ra) exact_add(&e, j->isa, row_skip(a, d0), wa, n);
            if (rb) exact_add(&e, j->isa, row_skip(b, d0), wb, n);
            exact_finish(&e, acc, n);
        }
        fi_ops_store(j->isa, row_skip(o, d0), acc, n);
    }
    *lo = m + log2f(sum);
}

static void merge2_rows(void *arg, int64_t begin, int64_t end) {
    const merge2_job *j = arg;
    const uint8_t *mask = j->mask ? j->mask->data : NULL;
    for (int64_t r = begin; r < end; r++) {
        int64_t i = r / j->heads, h = r % j->heads;
        if (mask && mask[i * j->mask->stride[0]] == 0) continue;
        merge2_row(j, i, h);
    }
}

static fi_status merge2_run(fi_context *ctx, merge2_job *j) {
    j->heads = j->va->shape[1];
    j->dim = (int32_t)j->va->shape[2];
    j->isa = fi_ops_isa_for(ctx);
    int64_t rows = j->va->shape[0] * j->heads;
    int64_t bytes = rows * j->dim *
                    (fi_ops_elem(j->va->dtype) + fi_ops_elem(j->vb->dtype) +
                     fi_ops_elem(j->vo->dtype));
    fi_ops_parallel_for(ctx, rows, bytes, merge2_rows, j);
    return FI_OK;
}

fi_status fi_cpu_merge_state(fi_context *ctx, const fi_tensor *v_a,
                             const fi_tensor *s_a, const fi_tensor *v_b,
                             const fi_tensor *s_b, fi_tensor *v_out,
                             fi_tensor *s_out, void *stream) {
    (void)stream;
    merge2_job j = {.va = v_a, .sa = s_a, .vb = v_b, .sb = s_b, .vo = v_out, .so = s_out};
    return merge2_run(ctx, &j);
}

fi_status fi_cpu_merge_state_in_place(fi_context *ctx, fi_tensor *v, fi_tensor *s,
                                      const fi_tensor *v_other,
                                      const fi_tensor *s_other,
                                      const fi_tensor *mask, void *stream) {
    (void)stream;
    merge2_job j = {.va = v, .sa = s, .vb = v_other, .sb = s_other, .vo = v, .so = s};
    j.mask = (mask && mask->data) ? mask : NULL;
    return merge2_run(ctx, &j);
}

/* ------------------------------------------------------- many states */

typedef struct merge_n_job {
    const fi_tensor *v, *s;   /* [n, S, H, D], [n, S, H] */
    const fi_tensor *vo, *so; /* [n, H, D], [n, H] */
    int64_t states, heads;
    int32_t dim;
    fi_ops_isa isa;
} merge_n_job;

static void merge_n_row(const merge_n_job *j, int64_t i, int64_t h) {
    const fi_tensor *v = j->v, *s = j->s;
    const float *ls = lse_at(s, i * s->stride[0] + h * s->stride[2]);
    fi_row o = row_at(j->vo, i * j->vo->stride[0] + h * j->vo->stride[1], 2);
    float *lo = lse_at(j->so, i * j->so->stride[0] + h * j->so->stride[1]);

    float m = -INFINITY;
    bool poisoned = false;
    for (int64_t k = 0; k < j->states; k++) {
        float l = ls[k * s->stride[1]];
        poisoned |= !(l < INFINITY);
        m = fmaxf(m, l);
    }
    if (poisoned) {
        store_nan_row(j->isa, o, j->dim, lo);
        return;
    }
    if (m == -INFINITY) {
        store_zero_row(j->isa, o, j->dim);
        *lo = -INFINITY;
        return;
    }
    float sum = 0.0f;
    for (int64_t k = 0; k < j->states; k++) sum += exp2f(ls[k * s->stride[1]] - m);
    float inv = 1.0f / sum;

    for (int32_t d0 = 0; d0 < j->dim; d0 += FI_OPS_CHUNK) {
        int32_t n = j->dim - d0 < FI_OPS_CHUNK ? j->dim - d0 : FI_OPS_CHUNK;
        float acc[FI_OPS_CHUNK];
        memset(acc, 0, (size_t)n * sizeof(float));
        for (int64_t k = 0; k < j->states; k++) { /* index order: deterministic */
            float l = ls[k * s->stride[1]];
            if (l == -INFINITY) continue; /* read whatever the weight, unless -inf */
            fi_row vk = row_at(v, i * v->stride[0] + k * v->stride[1] + h * v->stride[2], 3);
            fi_ops_axpy(j->isa, acc, exp2f(l - m), row_skip(vk, d0), n);
        }
        for (int32_t d = 0; d < n; d++) acc[d] *= inv;
        if (!fi_all_finite(acc, n)) {
            exact_sum e = {{0}};
            for (int64_t k = 0; k < j->states; k++) {
                float l = ls[k * s->stride[1]];
                if (l == -INFINITY) continue;
                fi_row vk = row_at(v, i * v->stride[0] + k * v->stride[1] + h * v->stride[2], 3);
                exact_add(&e, j->isa, row_skip(vk, d0), exp2f(l - m) * inv, n);
            }
            exact_finish(&e, acc, n);
        }
        fi_ops_store(j->isa, row_skip(o, d0), acc, n);
    }
    *lo = m + log2f(sum);
}

static void merge_n_rows(void *arg, int64_t begin, int64_t end) {
    const merge_n_job *j = arg;
    for (int64_t r = begin; r < end; r++) merge_n_row(j, r / j->heads, r % j->heads);
}

fi_status fi_cpu_merge_states(fi_context *ctx, const fi_tensor *v,
                              const fi_tensor *s, fi_tensor *v_out,
                              fi_tensor *s_out, void *stream) {
    (void)stream;
    merge_n_job j = {.v = v, .s = s, .vo = v_out, .so = s_out};
    j.states = v->shape[1];
    j.heads = v->shape[2];
    j.dim = (int32_t)v->shape[3];
    j.isa = fi_ops_isa_for(ctx);
    int64_t rows = v->shape[0] * j.heads;
    int64_t bytes = rows * j.dim *
                    (j.states * fi_ops_elem(v->dtype) +
                     fi_ops_elem(v_out->dtype));
    fi_ops_parallel_for(ctx, rows, bytes, merge_n_rows, &j);
    return FI_OK;
}
