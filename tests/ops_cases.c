/*
 * ops_cases.c — the inputs and checks shared by the CPU and CUDA tests of
 * the standalone ops (see ops_cases.h).
 */
#include "ops_cases.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const fi_dtype ops_float_dtypes[3] = {FI_DTYPE_F32, FI_DTYPE_F16, FI_DTYPE_BF16};

/* ================================================================== views */

int ops_view_alloc(tu_buf *b, fi_dtype dtype, int32_t ndim, const int64_t *shape, int strided,
                   tu_rng *rng) {
    if (!strided) {
        if (tu_buf_alloc(b, dtype, ndim, shape)) return -1;
        tu_buf_poison(b);
        return 0;
    }
    int32_t order[FI_MAX_DIMS];
    for (int32_t d = 0; d < ndim; d++) order[d] = d;
    for (int32_t d = ndim - 1; d > 0; d--) { /* shuffle */
        int32_t e = tu_rng_int(rng, 0, d), tmp = order[d];
        order[d] = order[e];
        order[e] = tmp;
    }
    int64_t stride[FI_MAX_DIMS];
    int64_t step = tu_rng_int(rng, 1, 2);
    for (int32_t k = ndim - 1; k >= 0; k--) {
        int32_t d = order[k];
        stride[d] = step;
        step *= shape[d] + tu_rng_int(rng, 0, 2);
    }
    size_t es = tu_dtype_size(dtype);
    if (tu_buf_alloc_bytes(b, (size_t)step * es + 1)) return -1;
    memset(&b->t, 0, sizeof b->t);
    b->t.data = b->base;
    b->t.dtype = dtype;
    b->t.ndim = ndim;
    for (int32_t d = 0; d < ndim; d++) {
        b->t.shape[d] = shape[d];
        b->t.stride[d] = stride[d];
    }
    tu_buf_poison(b);
    return 0;
}

void *ops_snapshot(const tu_buf *b) {
    void *s = malloc(b->bytes ? b->bytes : 1);
    if (s) memcpy(s, b->base, b->bytes);
    return s;
}

int ops_same_as_snapshot(const char *what, const tu_buf *b, const void *snap) {
    if (memcmp(b->base, snap, b->bytes) == 0) return 1;
    size_t i = 0;
    while (((const uint8_t *)b->base)[i] == ((const uint8_t *)snap)[i]) i++;
    tu_note("%s changed (first at byte %zu of %zu)", what, i, b->bytes);
    return 0;
}

void ops_fill_bytes(tu_rng *rng, const tu_buf *b) {
    uint8_t *p = b->base;
    for (size_t i = 0; i < b->bytes; i++) p[i] = (uint8_t)tu_rng_next(rng);
}

fi_tensor ops_view_on(const fi_tensor *t, const tu_buf *b, void *copy) {
    fi_tensor r = *t;
    r.data = (char *)copy + ((char *)t->data - (char *)b->base);
    return r;
}

/* ================================================================= checks */

int ops_check_view(const char *what, const fi_tensor *t, const double *ref, double rtol) {
    double *got = tu_view_read(t);
    tu_cmp c;
    int64_t bad = tu_compare(got, ref, tu_numel(t), rtol, rtol, &c);
    if (bad)
        tu_note("%s: %lld of %lld elements out of tolerance %g (%lld NaN); worst at %lld: "
                "got %.9g, expected %.9g", what, (long long)bad, (long long)c.n, rtol,
                (long long)c.nan, (long long)c.worst, c.worst_got, c.worst_ref);
    free(got);
    return bad == 0;
}

int ops_check_outside(const char *what, const tu_buf *b) {
    int64_t n = tu_buf_touched_outside(b);
    if (n) tu_note("%s: %lld bytes outside the view were written", what, (long long)n);
    return n == 0;
}

int ops_check_ok(fi_status st, const char *call) {
    if (st == FI_OK) return 1;
    tu_note("%s returned %s: %s", call, fi_status_string(st), fi_last_error());
    return 0;
}

/* ================================================================== merge */

double ops_lse_value(tu_rng *rng, int64_t r, int which) {
    int k = (int)(r % 8);
    if ((which == 0 && (k == 5 || k == 7)) || (which == 1 && (k == 6 || k == 7)))
        return -INFINITY;
    return tu_rng_range(rng, -20.0, 20.0);
}

void ops_fill_state(tu_rng *rng, const fi_tensor *v, const fi_tensor *s, int which,
                    int poison_empty) {
    tu_fill_uniform(rng, v, -2.0, 2.0, 0.0);
    int64_t rows = tu_numel(s), dim = v->shape[v->ndim - 1];
    for (int64_t r = 0; r < rows; r++) {
        double l = ops_lse_value(rng, r, which);
        tu_view_set(s, r, l);
        if (l == -INFINITY && poison_empty)
            for (int64_t d = 0; d < dim; d++) tu_view_set(v, r * dim + d, NAN);
    }
}

void ops_fill_states(tu_rng *rng, const fi_tensor *v, const fi_tensor *s) {
    const int64_t n = v->shape[0], states = v->shape[1], heads = v->shape[2], dim = v->shape[3];
    tu_fill_uniform(rng, v, -2.0, 2.0, 0.0);
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < heads; h++) {
            int kind = (int)((i * heads + h) % 6);
            int64_t one = tu_rng_int(rng, 0, (int32_t)(states > 0 ? states - 1 : 0));
            for (int64_t k = 0; k < states; k++) {
                int empty = kind == 4 || (kind == 5 && k != one) ||
                            (kind < 4 && tu_rng_int(rng, 0, 3) == 0);
                tu_view_set(s, (i * states + k) * heads + h,
                            empty ? -INFINITY : tu_rng_range(rng, -20.0, 20.0));
                if (empty)
                    for (int64_t d = 0; d < dim; d++)
                        tu_view_set(v, ((i * states + k) * heads + h) * dim + d, NAN);
            }
        }
}

/* ================================================================= append */

void ops_table_free(ops_append_table *t) {
    free(t->indptr), free(t->indices), free(t->last), free(t->old_len);
    free(t->new_len), free(t->batch_indices), free(t->positions);
}

int ops_table_make(tu_rng *rng, ops_append_shape shape, int32_t batch, int32_t page_size,
                   int32_t max_tokens, ops_append_table *t) {
    memset(t, 0, sizeof *t);
    int32_t B = batch, ps = page_size;
    t->batch = B;
    t->indptr = calloc((size_t)B + 1, sizeof(int32_t));
    t->last = calloc((size_t)B + 1, sizeof(int32_t));
    t->old_len = calloc((size_t)B + 1, sizeof(int32_t));
    t->new_len = calloc((size_t)B + 1, sizeof(int32_t));
    if (!t->indptr || !t->last || !t->old_len || !t->new_len) return -1;
    for (int32_t b = 0; b < B; b++) {
        int32_t add;
        if (shape == APPEND_DECODE) {
            t->old_len[b] = tu_rng_int(rng, 0, 40);
            add = 1;
        } else if (shape == APPEND_PREFILL) {
            t->old_len[b] = 0;
            add = tu_rng_int(rng, 0, max_tokens);
        } else {
            t->old_len[b] = tu_rng_int(rng, 0, 40);
            add = tu_rng_int(rng, 0, max_tokens);
        }
        t->new_len[b] = t->old_len[b] + add;
        int32_t pages = (t->new_len[b] + ps - 1) / ps;
        t->indptr[b + 1] = t->indptr[b] + pages;
        t->last[b] = pages ? t->new_len[b] - ps * (pages - 1) : 0;
        t->nnz += add;
    }
    int32_t used = t->indptr[B];
    t->num_indices = used;
    t->pages = used + tu_rng_int(rng, 1, 4); /* spare pages nobody owns */
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)t->pages);
    t->indices = malloc(sizeof(int32_t) * (size_t)(used + 1));
    t->batch_indices = malloc(sizeof(int32_t) * (size_t)(t->nnz + 1));
    t->positions = malloc(sizeof(int32_t) * (size_t)(t->nnz + 1));
    if (!perm || !t->indices || !t->batch_indices || !t->positions) {
        free(perm);
        return -1;
    }
    for (int32_t i = 0; i < t->pages; i++) perm[i] = i;
    for (int32_t i = t->pages - 1; i > 0; i--) {
        int32_t j = tu_rng_int(rng, 0, i), tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    memcpy(t->indices, perm, sizeof(int32_t) * (size_t)used);
    free(perm);
    int32_t n = 0;
    for (int32_t b = 0; b < B; b++)
        for (int32_t p = t->old_len[b]; p < t->new_len[b]; p++) {
            t->batch_indices[n] = b;
            t->positions[n] = p;
            n++;
        }
    for (int32_t i = t->nnz - 1; i > 0; i--) { /* any token order is valid */
        int32_t j = tu_rng_int(rng, 0, i);
        int32_t tb = t->batch_indices[i], tp = t->positions[i];
        t->batch_indices[i] = t->batch_indices[j], t->positions[i] = t->positions[j];
        t->batch_indices[j] = tb, t->positions[j] = tp;
    }
    return 0;
}

/* =================================================================== rope */

int ops_check_rope_out(const char *what, const tu_buf *out, const void *before,
                       const double *ref, const int64_t *pos, double rtol,
                       const char *unpositioned) {
    const fi_tensor *t = &out->t;
    int64_t row = t->shape[1] * t->shape[2], n = 0, bad_untouched = 0;
    double *got = tu_view_read(t);
    double *g = malloc((size_t)(tu_numel(t) + 1) * sizeof *g);
    double *r = malloc((size_t)(tu_numel(t) + 1) * sizeof *r);
    size_t es = tu_dtype_size(t->dtype);
    for (int64_t tok = 0; tok < t->shape[0]; tok++) {
        if (pos[tok] >= 0) {
            memcpy(g + n, got + tok * row, (size_t)row * sizeof *g);
            memcpy(r + n, ref + tok * row, (size_t)row * sizeof *r);
            n += row;
            continue;
        }
        for (int64_t hh = 0; hh < t->shape[1]; hh++)
            for (int64_t d = 0; d < t->shape[2]; d++) {
                int64_t idx[3] = {tok, hh, d};
                int64_t off = tu_offset(t, idx) * (int64_t)es;
                const char *now = (const char *)t->data + off;
                const char *then = (const char *)before + ((char *)t->data - (char *)out->base) + off;
                bad_untouched += memcmp(now, then, es) != 0;
            }
    }
    tu_cmp c;
    int64_t bad = tu_compare(g, r, n, 2 * rtol, rtol, &c);
    if (bad)
        tu_note("%s: %lld of %lld elements out of tolerance %g (%lld NaN); worst at %lld: "
                "got %.9g, expected %.9g", what, (long long)bad, (long long)n, rtol,
                (long long)c.nan, (long long)c.worst, c.worst_got, c.worst_ref);
    if (bad_untouched)
        tu_note("%s: %lld elements of tokens %s were written", what, (long long)bad_untouched,
                unpositioned);
    free(got), free(g), free(r);
    return bad == 0 && bad_untouched == 0;
}

/* ============================================================ non-finite */

void ops_put_nonfinite_states(const fi_tensor *va, const fi_tensor *sa, const fi_tensor *vb,
                              const fi_tensor *sb, fi_dtype out_dtype) {
    int64_t n = va->shape[0], heads = va->shape[1], dim = va->shape[2], d0 = 3 % dim;
    /* near the largest value of the dtypes involved: sums of two in f32
     * would pass FLT_MAX, the merge must not */
    int f16 = va->dtype == FI_DTYPE_F16 || vb->dtype == FI_DTYPE_F16 || out_dtype == FI_DTYPE_F16;
    double big = f16 ? 6.0e4 : 3.0e38;
    for (int64_t i = 0; i < n && i < 10; i++)
        for (int64_t h = 0; h < heads; h++) {
            int64_t r = i * heads + h, o = r * dim;
            double la = 0.5, lb = 0.5;
            switch (i) {
            case 0: la = INFINITY; break;
            case 1: la = NAN; break;
            case 2: /* not read */
                la = -INFINITY;
                for (int64_t d = 0; d < dim; d++) tu_view_set(va, o + d, NAN);
                break;
            case 3: /* read whatever its weight: 2^-300 */
                la = -299.0, lb = 1.0;
                tu_view_set(va, o + d0, NAN);
                break;
            case 4: tu_view_set(va, o + d0, INFINITY); break;
            case 5:
                tu_view_set(va, o + d0, INFINITY);
                tu_view_set(vb, o + d0, -INFINITY);
                break;
            case 6:
                for (int64_t d = 0; d < dim; d++) tu_view_set(va, o + d, big), tu_view_set(vb, o + d, big);
                break;
            case 7: la = lb = -INFINITY; break;
            case 8: lb = INFINITY; break;
            default: continue; /* row 9: as filled */
            }
            tu_view_set(sa, r, la);
            tu_view_set(sb, r, lb);
        }
}

fi_tensor ops_state_view(const fi_tensor *t, int64_t k) {
    fi_tensor v = *t;
    v.ndim = t->ndim - 1;
    for (int32_t d = 1; d < v.ndim; d++) v.shape[d] = t->shape[d + 1], v.stride[d] = t->stride[d + 1];
    v.data = (char *)t->data + k * t->stride[1] * (int64_t)tu_dtype_size(t->dtype);
    return v;
}

int ops_check_view_classes(const char *what, const fi_tensor *t, const double *ref, double rtol) {
    double *got = tu_view_read(t);
    int64_t n = tu_numel(t), bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int ok = isnan(ref[i]) ? isnan(got[i])
               : isinf(ref[i]) ? got[i] == ref[i]
               : isfinite(got[i]) && fabs(got[i] - ref[i]) <= rtol + rtol * fabs(ref[i]);
        if (!ok && bad++ == 0)
            tu_note("%s: element %lld got %.9g, expected %.9g", what, (long long)i, got[i], ref[i]);
    }
    if (bad) tu_note("%s: %lld of %lld elements differ", what, (long long)bad, (long long)n);
    free(got);
    return bad == 0;
}
