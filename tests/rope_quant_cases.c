/*
 * rope_quant_cases.c — the shared cases of fi_rope_quantize_fp8 and its
 * append form (rope_quant_cases.h).
 */
#include "rope_quant_cases.h"

#include "ops_cases.h"
#include "oracle_serving.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool mla(const rq_case *k) { return k->c.hk == 0; }
static int64_t heads_k(const rq_case *k) { return mla(k) ? 1 : k->c.hk; }

/* Shape of an input or output row tensor: [nnz, H, W], or MLA K [nnz, W]. */
static int32_t row_shape(const rq_case *k, bool is_k, int64_t w, int64_t *s) {
    s[0] = k->c.nnz;
    if (is_k && mla(k)) {
        s[1] = w;
        return 2;
    }
    s[1] = is_k ? k->c.hk : k->c.hq, s[2] = w;
    return 3;
}

/* A GQA cache [pages, page_size, H_k, D] (HND: H_k, page_size); MLA [pages, page_size, D]. */
static int32_t cache_shape(const rq_case *k, int64_t d, int64_t *s) {
    s[0] = k->pages, s[1] = k->c.page_size;
    if (mla(k)) {
        s[2] = d;
        return 3;
    }
    s[2] = k->c.hk, s[3] = d;
    if (k->c.hnd) s[1] = k->c.hk, s[2] = k->c.page_size;
    return 4;
}

static int alloc(tu_buf *b, fi_dtype dt, int32_t ndim, const int64_t *shape, int strided,
                 tu_rng *rng) {
    return ops_view_alloc(b, dt, ndim, shape, strided, rng);
}

static int unused(tu_buf *b) {
    const int64_t one = 1;
    return tu_buf_alloc(b, FI_DTYPE_U8, 1, &one);
}

/* The page table: token t of request b = t * B / nnz at the position after
 * the request's earlier tokens (0 .. 2 pages of them); pages of each
 * request (and a spare) from a shuffled list of the cache's pages. */
static void page_table(rq_case *k, tu_rng *rng, int32_t *idx) {
    const int64_t nnz = k->c.nnz, ps = k->c.page_size, B = k->batch;
    int32_t *bi = idx + k->off_batch, *pos = idx + k->off_pos, *ptr = idx + k->off_indptr;
    int32_t *ids = idx + k->off_indices;
    int32_t *perm = malloc((size_t)k->pages * sizeof *perm);
    int64_t *order = malloc((size_t)nnz * sizeof *order);
    for (int64_t i = 0; i < k->pages; i++) perm[i] = (int32_t)i;
    for (int64_t i = k->pages - 1; i > 0; i--) {
        int64_t j = tu_rng_int(rng, 0, (int32_t)i);
        int32_t x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    for (int64_t i = 0; i < nnz; i++) order[i] = i;
    for (int64_t i = nnz - 1; i > 0; i--) {
        int64_t j = tu_rng_int(rng, 0, (int32_t)i), x = order[i];
        order[i] = order[j], order[j] = x;
    }
    ptr[0] = 0;
    int64_t t = 0;
    for (int64_t b = 0; b < B; b++) {
        const int64_t first = t, pre = tu_rng_int(rng, 0, (int32_t)(2 * ps));
        while (t < nnz && t * B / nnz == b) {
            bi[order[t]] = (int32_t)b;
            pos[order[t]] = (int32_t)(pre + t - first);
            t++;
        }
        const int64_t len = pre + (t - first), pages = (len + ps - 1) / ps + 1;
        ptr[b + 1] = ptr[b] + (int32_t)pages;
    }
    for (int64_t j = 0; j < k->num_indices; j++) ids[j] = perm[j];
    free(perm), free(order);
}

int rq_case_alloc(rq_case *k, const rq_cfg *c, tu_buf *b, tu_rng *rng) {
    memset(k, 0, sizeof *k);
    memset(b, 0, RQ_NBUF * sizeof *b);
    k->c = *c;
    k->max_pos = 2048;
    const int64_t nnz = c->nnz, R = c->rot, N = c->nope, st = c->strided;
    if (c->append) {
        /* at most (2 + nnz) / page_size + 2 pages a request */
        k->batch = nnz < 3 ? nnz : 3;
        k->num_indices = k->batch * ((2 * c->page_size + nnz) / c->page_size + 2) + 1;
        k->pages = k->num_indices + 2;
    }
    k->off_batch = nnz, k->off_pos = 2 * nnz, k->off_indptr = 3 * nnz;
    k->off_indices = k->off_indptr + k->batch + 1;
    int64_t s[4];
    int32_t n;
    int f = 0;
    n = row_shape(k, false, R, s), f |= alloc(&b[RQ_Q_ROPE], c->xt, n, s, st, rng);
    n = row_shape(k, true, R, s), f |= alloc(&b[RQ_K_ROPE], c->xt, n, s, st, rng);
    n = row_shape(k, false, N, s);
    f |= N ? alloc(&b[RQ_Q_NOPE], c->xt, n, s, st, rng) : unused(&b[RQ_Q_NOPE]);
    n = row_shape(k, true, N, s);
    f |= N ? alloc(&b[RQ_K_NOPE], c->xt, n, s, st, rng) : unused(&b[RQ_K_NOPE]);
    n = row_shape(k, true, R + N, s);
    f |= c->append && !mla(k) ? alloc(&b[RQ_V], c->xt, n, s, st, rng) : unused(&b[RQ_V]);
    const int64_t cs[2] = {k->max_pos, R}, ni = k->off_indices + k->num_indices;
    f |= alloc(&b[RQ_COS_SIN], FI_DTYPE_F32, 2, cs, st, rng);
    f |= alloc(&b[RQ_INDEX], FI_DTYPE_I32, 1, &ni, st, rng);
    const bool one_q = c->sliced || !N, one_k = c->sliced || !N;
    n = row_shape(k, false, one_q ? R + N : R, s), f |= alloc(&b[RQ_Q_OUT], c->ot, n, s, st, rng);
    n = row_shape(k, false, N, s);
    f |= one_q ? unused(&b[RQ_Q_NOPE_OUT]) : alloc(&b[RQ_Q_NOPE_OUT], c->ot, n, s, st, rng);
    if (c->append) {
        n = cache_shape(k, mla(k) ? N : R + N, s), f |= alloc(&b[RQ_K_OUT], c->ot, n, s, st, rng);
        n = cache_shape(k, mla(k) ? R : R + N, s), f |= alloc(&b[RQ_K2_OUT], c->ot, n, s, st, rng);
    } else {
        n = row_shape(k, true, one_k ? R + N : R, s);
        f |= alloc(&b[RQ_K_OUT], c->ot, n, s, st, rng);
        n = row_shape(k, true, N, s);
        f |= one_k ? unused(&b[RQ_K2_OUT]) : alloc(&b[RQ_K2_OUT], c->ot, n, s, st, rng);
    }
    if (f) return -1;
    for (int i = RQ_Q_ROPE; i <= RQ_V; i++)
        if (b[i].t.dtype == c->xt) tu_fill_uniform(rng, &b[i].t, -2, 2, 0.0);
    for (int64_t p = 0; p < k->max_pos; p++) /* vLLM's cache: theta 1e4 */
        for (int64_t i = 0; i < R / 2; i++) {
            const double ang = (double)p * pow(1e4, -2.0 * (double)i / (double)R);
            tu_view_set(&b[RQ_COS_SIN].t, p * R + i, cos(ang));
            tu_view_set(&b[RQ_COS_SIN].t, p * R + R / 2 + i, sin(ang));
        }
    int32_t *idx = calloc((size_t)ni, sizeof *idx);
    if (!idx) return -1;
    for (int64_t t = 0; t < nnz; t++) idx[t] = tu_rng_int(rng, 0, (int32_t)k->max_pos - 1);
    if (c->append) {
        page_table(k, rng, idx);
        ops_fill_bytes(rng, &b[RQ_K_OUT]), ops_fill_bytes(rng, &b[RQ_K2_OUT]);
    }
    for (int64_t i = 0; i < ni; i++) tu_view_set(&b[RQ_INDEX].t, i, idx[i]);
    free(idx);
    return 0;
}

/* Entries [off, off + n) of a 1-D view. */
static fi_tensor sub1(const fi_tensor *t, int64_t off, int64_t n) {
    fi_tensor v = *t;
    v.data = (int32_t *)t->data + off * t->stride[0];
    v.shape[0] = n;
    return v;
}

/* Columns [col, col + w) of an FP8 view's last dim. */
static fi_tensor cols(const fi_tensor *t, int64_t col, int64_t w) {
    fi_tensor v = *t;
    const int last = t->ndim - 1;
    v.data = (uint8_t *)t->data + col * t->stride[last];
    v.shape[last] = w;
    return v;
}

/* The views an op call points at, kept together for its duration. */
typedef struct rq_views {
    fi_tensor qo, qno, ko, kno, pos, bi, sp, ptr, ids;
} rq_views;

static void build_args(const rq_case *k, const fi_tensor *t, rq_views *w, fi_rope_quant_args *a) {
    const rq_cfg *c = &k->c;
    const int64_t R = c->rot, N = c->nope;
    fi_rope_quant_args_init(a);
    a->q_rope = &t[RQ_Q_ROPE], a->k_rope = &t[RQ_K_ROPE];
    a->q_nope = N ? &t[RQ_Q_NOPE] : NULL, a->k_nope = N ? &t[RQ_K_NOPE] : NULL;
    a->cos_sin_cache = &t[RQ_COS_SIN];
    w->pos = sub1(&t[RQ_INDEX], 0, c->nnz), a->pos_ids = &w->pos;
    a->is_neox = c->neox;
    a->quant_scale_q = c->sq, a->quant_scale_kv = c->skv;
    const bool one = c->sliced || !N;
    w->qo = one ? cols(&t[RQ_Q_OUT], 0, R) : t[RQ_Q_OUT];
    w->qno = one ? cols(&t[RQ_Q_OUT], R, N) : t[RQ_Q_NOPE_OUT];
    a->q_rope_out = &w->qo, a->q_nope_out = N ? &w->qno : NULL;
    if (!c->append) {
        w->ko = one ? cols(&t[RQ_K_OUT], 0, R) : t[RQ_K_OUT];
        w->kno = one ? cols(&t[RQ_K_OUT], R, N) : t[RQ_K2_OUT];
        a->k_rope_out = &w->ko, a->k_nope_out = N ? &w->kno : NULL;
        return;
    }
    if (mla(k)) {
        a->ckv_cache = (fi_tensor *)&t[RQ_K_OUT], a->kpe_cache = (fi_tensor *)&t[RQ_K2_OUT];
    } else {
        a->k_cache = (fi_tensor *)&t[RQ_K_OUT], a->v_cache = (fi_tensor *)&t[RQ_K2_OUT];
        a->v = &t[RQ_V];
    }
    a->layout = c->hnd ? FI_KV_LAYOUT_HND : FI_KV_LAYOUT_NHD;
    w->bi = sub1(&t[RQ_INDEX], k->off_batch, c->nnz);
    w->sp = sub1(&t[RQ_INDEX], k->off_pos, c->nnz);
    w->ptr = sub1(&t[RQ_INDEX], k->off_indptr, k->batch + 1);
    w->ids = sub1(&t[RQ_INDEX], k->off_indices, k->num_indices);
    a->batch_indices = &w->bi, a->positions = &w->sp;
    a->kv_indptr = &w->ptr, a->kv_indices = &w->ids;
}

fi_status rq_case_call(fi_context *ctx, const rq_case *k, const fi_tensor *t, void *stream) {
    rq_views w;
    fi_rope_quant_args a;
    build_args(k, t, &w, &a);
    return k->c.append ? fi_rope_quantize_fp8_append_paged_kv_cache(ctx, &a, stream)
                       : fi_rope_quantize_fp8(ctx, &a, stream);
}

/* ----------------------------------------------------------------- check */

/* One tensor the op reads rows from and where each row goes. */
typedef struct rq_part {
    int src, dst;   /* buffers */
    int64_t heads, width, col; /* col: first column of the row in dst */
    bool rope, is_q, paged;
} rq_part;

static int parts(const rq_case *k, rq_part *p) {
    const rq_cfg *c = &k->c;
    const int64_t R = c->rot, N = c->nope, hk = heads_k(k);
    const bool one = c->sliced || !N;
    int n = 0;
    p[n++] = (rq_part){RQ_Q_ROPE, RQ_Q_OUT, c->hq, R, 0, true, true, false};
    if (N) p[n++] = (rq_part){RQ_Q_NOPE, one ? RQ_Q_OUT : RQ_Q_NOPE_OUT, c->hq, N, one ? R : 0,
                              false, true, false};
    if (!c->append) {
        p[n++] = (rq_part){RQ_K_ROPE, RQ_K_OUT, hk, R, 0, true, false, false};
        if (N) p[n++] = (rq_part){RQ_K_NOPE, one ? RQ_K_OUT : RQ_K2_OUT, hk, N, one ? R : 0,
                                  false, false, false};
    } else if (mla(k)) {
        p[n++] = (rq_part){RQ_K_ROPE, RQ_K2_OUT, 1, R, 0, true, false, true};
        if (N) p[n++] = (rq_part){RQ_K_NOPE, RQ_K_OUT, 1, N, 0, false, false, true};
    } else {
        p[n++] = (rq_part){RQ_K_ROPE, RQ_K_OUT, hk, R, 0, true, false, true};
        if (N) p[n++] = (rq_part){RQ_K_NOPE, RQ_K_OUT, hk, N, R, false, false, true};
        p[n++] = (rq_part){RQ_V, RQ_K2_OUT, hk, R + N, 0, false, false, true};
    }
    return n;
}

/* The byte of element (t, h, i) of part p in its dst buffer. */
static uint8_t *dst_at(const rq_case *k, const tu_buf *b, const rq_part *p, const int32_t *idx,
                       int64_t t, int64_t h, int64_t i) {
    const fi_tensor *d = &b[p->dst].t;
    int64_t at[4];
    if (!p->paged) {
        at[0] = t;
        if (d->ndim == 2) at[1] = p->col + i;
        else at[1] = h, at[2] = p->col + i;
    } else {
        const int32_t r = idx[k->off_batch + t], q = idx[k->off_pos + t];
        const int32_t page = idx[k->off_indices + idx[k->off_indptr + r] + q / k->c.page_size];
        at[0] = page, at[1] = q % k->c.page_size;
        if (d->ndim == 3) at[2] = i;
        else at[2] = h, at[3] = p->col + i;
        if (d->ndim == 4 && k->c.hnd) at[1] = h, at[2] = q % k->c.page_size;
    }
    return (uint8_t *)d->data + tu_offset(d, at);
}

/* got is the FP8 rounding of v, or of a value within `err` of it: f32
 * arithmetic on inputs of size 2 (|x c| + |x' s| <= 4) may land on the
 * other side of a rounding boundary after cancellation. */
static bool fp8_near(fi_dtype dt, double got, double v, double err) {
    const double m = dt == FI_DTYPE_E4M3 ? 448.0 : 57344.0;
    const double e = err + 1e-5 * fabs(v);
    for (int k = -1; k <= 1; k++) {
        const double x = v + k * e;
        if (got == tu_round(dt, x > m ? m : x < -m ? -m : x)) return true;
    }
    return false;
}

int rq_case_check(const rq_case *k, const tu_buf *b, void *const *before, const uint8_t *skip) {
    const rq_cfg *c = &k->c;
    const int64_t R = c->rot;
    double *cs = tu_view_read(&b[RQ_COS_SIN].t), *idxd = tu_view_read(&b[RQ_INDEX].t);
    const int64_t ni = tu_numel(&b[RQ_INDEX].t);
    int32_t *idx = malloc((size_t)ni * sizeof *idx);
    uint8_t *touched[RQ_NBUF] = {0};
    int ok = cs && idxd && idx;
    for (int i = 0; i < RQ_NBUF && ok; i++) ok = (touched[i] = calloc(b[i].bytes, 1)) != NULL;
    if (!ok) {
        tu_note("allocation failed");
        ok = 0;
        goto done;
    }
    for (int64_t i = 0; i < ni; i++) idx[i] = (int32_t)idxd[i];
    rq_part p[5];
    const int np = parts(k, p);
    for (int pi = 0; pi < np && ok; pi++) {
        const rq_part *q = &p[pi];
        const int64_t w = q->width;
        double *x = tu_view_read(&b[q->src].t), *y = malloc((size_t)(w + 1) * sizeof *y);
        const double scale = q->is_q ? c->sq : c->skv;
        for (int64_t t = 0; t < c->nnz && ok && x && y; t++)
            for (int64_t h = 0; h < q->heads && ok; h++) {
                if (skip && (skip[t] == RQ_SKIP_ALL || (skip[t] == RQ_SKIP_KV && q->paged)))
                    break;
                const double *row = x + (t * q->heads + h) * w;
                if (q->rope) oracle_rope_cos_sin(R, c->neox, row, cs + idx[t] * R, y);
                else memcpy(y, row, (size_t)w * sizeof *y);
                for (int64_t i = 0; i < w; i++) {
                    uint8_t *at = dst_at(k, b, q, idx, t, h, i);
                    const double got = tu_load(at, c->ot, 0);
                    touched[q->dst][at - (uint8_t *)b[q->dst].base] = 1;
                    if (!fp8_near(c->ot, got, y[i] * scale, 4e-6 * scale)) {
                        tu_note("buffer %d (from %d), token %lld head %lld [%lld]: %g, expected "
                                "fp8(%.9g)",
                                q->dst, q->src, (long long)t, (long long)h, (long long)i, got,
                                y[i] * scale);
                        ok = 0;
                        break;
                    }
                }
            }
        if (!x || !y) ok = 0;
        free(x), free(y);
    }
    for (int i = 0; i < RQ_NBUF && ok; i++) {
        const uint8_t *now = b[i].base, *was = before[i];
        for (size_t j = 0; j < b[i].bytes; j++)
            if (!touched[i][j] && now[j] != was[j]) {
                tu_note("buffer %d: byte %zu changed, but the op writes no element there", i, j);
                ok = 0;
                break;
            }
    }
done:
    for (int i = 0; i < RQ_NBUF; i++) free(touched[i]);
    free(cs), free(idxd), free(idx);
    return ok;
}

void rq_case_name(const rq_cfg *c, char *out, size_t size) {
    char form[48] = "plain";
    if (c->append)
        snprintf(form, sizeof form, "append_%s_p%d", c->hk == 0 ? "mla" : c->hnd ? "hnd" : "nhd",
                 c->page_size);
    snprintf(out, size, "%s_h%lld_%lld_r%lld_n%lld/%s_%s/%s/%s/s%g_%g%s%s",
             c->hk == 0 ? "mla" : c->hq == c->hk ? "mha" : "gqa", (long long)c->hq,
             (long long)c->hk, (long long)c->rot, (long long)c->nope, tu_dtype_name(c->xt),
             tu_dtype_name(c->ot), c->neox ? "neox" : "gptj", form, (double)c->sq, (double)c->skv,
             c->strided ? "/strided" : "", c->sliced ? "/sliced" : "");
}

/* ------------------------------------------------------------ bad input */

typedef struct rq_bad {
    const char *name;
    int append;  /* the case it breaks: 0 plain GQA, 1 append GQA, 2 append MLA */
    int device_value;
    const char *message;
} rq_bad;

static const rq_bad bad_cases[] = {
    {"struct_size", 0, 0, "struct_size=0"},
    {"null_q_rope", 0, 0, "q_rope: tensor is NULL"},
    {"rotary_odd", 0, 0, "it must be even"},
    {"k_rope_dtype", 0, 0, "the inputs share one dtype"},
    {"k_rope_heads_mismatch_k_nope", 0, 0, "k_nope.shape[1]"},
    {"cache_width", 0, 0, "cos_sin_cache.shape[1]=6, expected 8"},
    {"cache_f16", 0, 0, "cos_sin_cache.dtype is f16"},
    {"scale_q_zero", 0, 0, "quant_scale_q=0 must be finite and > 0"},
    {"scale_kv_nan", 0, 0, "quant_scale_kv=nan"},
    {"q_out_bf16", 0, 0, "q_rope_out.dtype is bf16, expected e4m3 or e5m2"},
    {"k_out_e5m2", 0, 0, "k_rope_out.dtype is e5m2, expected e4m3"},
    {"q_nope_out_missing", 0, 0, "q_nope_out: tensor is NULL"},
    {"q_out_overlaps_q", 0, 0, "overlaps q_rope"},
    {"k_out_is_q_out", 0, 0, "overlaps"},
    {"plain_with_cache", 0, 0, "writes no paged cache"},
    {"plain_with_v", 0, 0, "only fi_rope_quantize_fp8_append_paged_kv_cache takes v"},
    {"pos_past_cache", 0, 1, "pos_ids[0]=2048 is not a row of cos_sin_cache"},
    {"v_missing", 1, 0, "v is absent"},
    {"k_out_in_append", 1, 0, "writes K into the paged cache"},
    {"k_cache_width", 1, 0, "k_cache.shape[3]"},
    {"v_cache_e5m2", 1, 0, "v_cache.dtype is e5m2"},
    {"layout", 1, 0, "layout=7 is neither NHD nor HND"},
    {"indptr_short", 1, 0, "kv_indptr has 0 entries"},
    {"batch_index_past", 1, 1, "batch_indices[0]=9 is outside the batch"},
    {"position_past_pages", 1, 1, "positions[0]=100000 is outside request"},
    {"page_id_past_cache", 1, 1, "is not a page of the cache"},
    {"indptr_decreasing", 1, 1, "indptr must not decrease"},
    {"mla_with_v", 2, 0, "MLA"},
    {"mla_with_k_cache", 2, 0, "k_rope is 2-D (MLA)"},
    {"mla_k_nope_missing", 2, 0, "k_nope is absent"},
};

/* Break case c's arguments as bad case `name` says (index values in idx,
 * restored by the caller). */
static void rq_break(const char *n, rq_views *w, fi_rope_quant_args *a, fi_tensor *t,
                     int32_t *idx, const rq_case *k) {
    static fi_tensor scratch[2];
    if (!strcmp(n, "struct_size")) a->struct_size = 0;
    if (!strcmp(n, "null_q_rope")) a->q_rope = NULL;
    if (!strcmp(n, "rotary_odd")) t[RQ_Q_ROPE].shape[2] = 7;
    if (!strcmp(n, "k_rope_dtype")) t[RQ_K_ROPE].dtype = FI_DTYPE_F16;
    if (!strcmp(n, "k_rope_heads_mismatch_k_nope")) t[RQ_K_NOPE].shape[1] = 1;
    if (!strcmp(n, "cache_width")) t[RQ_COS_SIN].shape[1] = 6;
    if (!strcmp(n, "cache_f16")) t[RQ_COS_SIN].dtype = FI_DTYPE_F16;
    if (!strcmp(n, "scale_q_zero")) a->quant_scale_q = 0.0f;
    if (!strcmp(n, "scale_kv_nan")) a->quant_scale_kv = NAN;
    if (!strcmp(n, "q_out_bf16")) w->qo.dtype = FI_DTYPE_BF16;
    if (!strcmp(n, "k_out_e5m2")) w->ko.dtype = FI_DTYPE_E5M2;
    if (!strcmp(n, "q_nope_out_missing")) a->q_nope_out = NULL;
    if (!strcmp(n, "q_out_overlaps_q")) w->qo.data = t[RQ_Q_ROPE].data;
    if (!strcmp(n, "k_out_is_q_out")) w->ko = w->qo, w->ko.shape[1] = 2;
    if (!strcmp(n, "plain_with_cache")) a->k_cache = &t[RQ_V];
    if (!strcmp(n, "plain_with_v")) a->v = &t[RQ_K_NOPE];
    if (!strcmp(n, "pos_past_cache")) idx[0] = (int32_t)k->max_pos;
    if (!strcmp(n, "v_missing")) a->v = NULL;
    if (!strcmp(n, "k_out_in_append")) scratch[0] = t[RQ_Q_OUT], a->k_rope_out = &scratch[0];
    if (!strcmp(n, "k_cache_width")) t[RQ_K_OUT].shape[3] -= 1;
    if (!strcmp(n, "v_cache_e5m2")) t[RQ_K2_OUT].dtype = FI_DTYPE_E5M2;
    if (!strcmp(n, "layout")) a->layout = (fi_kv_layout)7;
    if (!strcmp(n, "indptr_short")) w->ptr.shape[0] = 0;
    if (!strcmp(n, "batch_index_past")) idx[k->off_batch] = 9;
    if (!strcmp(n, "position_past_pages")) idx[k->off_pos] = 100000;
    if (!strcmp(n, "page_id_past_cache")) idx[k->off_indices] = (int32_t)k->pages;
    if (!strcmp(n, "indptr_decreasing")) idx[k->off_indptr + 1] = -1;
    if (!strcmp(n, "mla_with_v")) a->v = &t[RQ_K_NOPE];
    if (!strcmp(n, "mla_with_k_cache")) scratch[1] = t[RQ_K_OUT], a->k_cache = &scratch[1];
    if (!strcmp(n, "mla_k_nope_missing")) a->k_nope = NULL;
}

void rq_bad_input(fi_context *ctx, const char *bname, bool device) {
    /* GQA 4 / 2 heads, R 8, N 8, f32 into e4m3; the MLA case: 4 heads */
    static const rq_cfg base[3] = {
        {3, 4, 2, 8, 8, FI_DTYPE_F32, FI_DTYPE_E4M3, 1, 0, 0, 4, 0, 0, 1.0f, 1.0f},
        {3, 4, 2, 8, 8, FI_DTYPE_F32, FI_DTYPE_E4M3, 1, 1, 0, 4, 0, 0, 1.0f, 1.0f},
        {3, 4, 0, 8, 8, FI_DTYPE_F32, FI_DTYPE_E4M3, 1, 1, 0, 4, 0, 0, 1.0f, 1.0f}};
    char name[160];
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const rq_bad *bc = &bad_cases[i];
        snprintf(name, sizeof name, "bad_input/%s/rope_quant/%s", bname, bc->name);
        if ((device && bc->device_value) || !tu_begin_case(name)) continue;
        tu_rng rng;
        tu_rng_seed(&rng, tu_hash(name));
        rq_case k;
        tu_buf b[RQ_NBUF];
        void *snap[RQ_NBUF] = {0};
        int ok = !rq_case_alloc(&k, &base[bc->append], b, &rng);
        fi_tensor t[RQ_NBUF];
        for (int j = 0; j < RQ_NBUF && ok; j++) t[j] = b[j].t, snap[j] = ops_snapshot(&b[j]);
        if (ok) {
            const int64_t ni = tu_numel(&b[RQ_INDEX].t);
            double *was = tu_view_read(&b[RQ_INDEX].t);
            int32_t *idx = malloc((size_t)ni * sizeof *idx);
            for (int64_t j = 0; j < ni; j++) idx[j] = (int32_t)was[j];
            rq_views w;
            fi_rope_quant_args a;
            build_args(&k, t, &w, &a);
            rq_break(bc->name, &w, &a, t, idx, &k);
            for (int64_t j = 0; j < ni; j++) tu_view_set(&b[RQ_INDEX].t, j, idx[j]);
            memcpy(snap[RQ_INDEX], b[RQ_INDEX].base, b[RQ_INDEX].bytes);
            fi_status st = k.c.append ? fi_rope_quantize_fp8_append_paged_kv_cache(ctx, &a, NULL)
                                      : fi_rope_quantize_fp8(ctx, &a, NULL);
            ok = !tu_expect_status(st, FI_STATUS_INVALID_ARGUMENT, bc->message, bc->name);
            for (int j = 0; j < RQ_NBUF; j++)
                if (memcmp(b[j].base, snap[j], b[j].bytes)) {
                    tu_note("buffer %d was written by a refused call", j);
                    ok = 0;
                }
            free(was), free(idx);
        } else {
            tu_note("allocation failed");
        }
        for (int j = 0; j < RQ_NBUF; j++) free(snap[j]), tu_buf_free(&b[j]);
        tu_record("bad_input", name, ok ? TU_PASS : TU_FAIL);
    }
}
