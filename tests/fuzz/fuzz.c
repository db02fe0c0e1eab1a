/* fuzz.c — the shared pieces of the fuzz targets (fuzz.h). */
#include "fuzz.h"

/* Allocations for huge bounds (INT32_MAX) fail with FI_STATUS_OUT_OF_MEMORY
 * rather than abort the sanitizer; past 256 MB they fail at once, so that
 * the sanitizer's shadow of a lazily mapped one does not fill the memory. */
__attribute__((visibility("default"))) const char *__asan_default_options(void);
const char *__asan_default_options(void) {
    return "allocator_may_return_null=1:max_allocation_size_mb=256";
}

fi_context *fz_context(fz *f) {
    static fi_context *ctx[4];
    static int n = -1;
    if (n < 0) {
        static const char *const simd[] = {"generic", "avx2", "avx512", "neon"};
        n = 0;
        for (int i = 0; i < 4; i++) {
            fi_context_options o;
            fi_context_options_init(&o);
            o.num_threads = i == 0 ? 2 : 1; /* one context with a thread pool */
            o.cpu_simd = simd[i];
            if (fi_context_create(&o, &ctx[n]) == FI_OK) n++;
        }
        if (n == 0) FZ_FAIL("no CPU context: %s", fi_last_error());
    }
    return ctx[fz_pick(f, n)];
}

int fz_tensor(tu_buf *b, fi_dtype dtype, int32_t ndim, const int64_t *shape, tu_rng *rng,
              double a) {
    memset(b, 0, sizeof *b);
    if (tu_buf_alloc(b, dtype, ndim, shape)) return -1;
    double scale = dtype == FI_DTYPE_E4M3 || dtype == FI_DTYPE_E5M2 ? 1.0 : 0.0;
    if (dtype == FI_DTYPE_U8 || dtype == FI_DTYPE_I32) {
        for (size_t i = 0; i < b->bytes; i++) ((uint8_t *)b->base)[i] = (uint8_t)tu_rng_next(rng);
        return 0;
    }
    tu_fill_uniform(rng, &b->t, -a, a, scale);
    return 0;
}

void fz_check_status(fi_status st, const char *call) {
    if ((int)st < FI_OK || (int)st > FI_STATUS_COMPILE_ERROR)
        FZ_FAIL("%s returned %d, not an fi_status", call, (int)st);
    if (st != FI_OK && !fi_last_error()[0]) FZ_FAIL("%s failed (%s) with no message", call,
                                                   fi_status_string(st));
}

void fz_compare(const char *what, const double *got, const double *ref, int64_t n, double tol) {
    for (int64_t i = 0; i < n; i++) {
        int ok = isnan(ref[i]) ? isnan(got[i])
               : isinf(ref[i]) ? got[i] == ref[i]
               : isfinite(got[i]) && fabs(got[i] - ref[i]) <= tol + tol * fabs(ref[i]);
        if (!ok) FZ_FAIL("%s[%lld] = %.9g, the oracle says %.9g (tol %g)", what, (long long)i,
                         got[i], ref[i], tol);
    }
}

/* ------------------------------------------------------------- problems */

#include "../oracle.h"

void fz_params(fz *f, fi_attention_params *p, float *slopes) {
    static const fi_dtype qdt[] = {FI_DTYPE_F32, FI_DTYPE_F16, FI_DTYPE_BF16};
    static const fi_dtype kvdt[] = {FI_DTYPE_F32, FI_DTYPE_F16, FI_DTYPE_BF16, FI_DTYPE_E4M3,
                                    FI_DTYPE_E5M2};
    static const int32_t dims[] = {64, 128, 256, 64, 64, 96};
    fi_attention_params_init(p);
    p->num_kv_heads = (int32_t)fz_range(f, 1, 3);
    p->num_qo_heads = p->num_kv_heads * (int32_t)fz_range(f, 1, 4);
    if (fz_one_in(f, 32)) p->num_qo_heads = (int32_t)fz_range(f, -2, 9); /* maybe not divisible */
    p->head_dim_qk = dims[fz_pick(f, 6)];
    p->head_dim_vo = fz_one_in(f, 4) ? dims[fz_pick(f, 6)] : p->head_dim_qk;
    p->kv_format = fz_one_in(f, 3) ? FI_KV_FORMAT_RAGGED : FI_KV_FORMAT_PAGED;
    p->kv_layout = fz_one_in(f, 2) ? FI_KV_LAYOUT_HND : FI_KV_LAYOUT_NHD;
    p->page_size = fz_one_in(f, 16) ? (int32_t)fz_range(f, -1, 1 << 20) : (int32_t)fz_range(f, 1, 17);
    p->q_dtype = qdt[fz_pick(f, 3)];
    p->o_dtype = qdt[fz_pick(f, 3)];
    p->kv_dtype = fz_one_in(f, 4) ? kvdt[fz_pick(f, 5)] : p->q_dtype;
    p->mask_mode = (fi_mask_mode)fz_pick(f, 3);
    p->window_left = fz_one_in(f, 3) ? (int32_t)fz_range(f, -1, 40) : -1;
    p->logits_soft_cap = fz_one_in(f, 4) ? (float)fz_range(f, 0, 50) : 0.0f;
    p->sm_scale = fz_one_in(f, 4) ? (float)fz_range(f, 0, 100) / 100.0f : 0.0f;
    p->pos_encoding = fz_one_in(f, 4) ? (fi_pos_encoding)fz_pick(f, 3) : FI_POS_NONE;
    if (p->kv_dtype == FI_DTYPE_E4M3 || p->kv_dtype == FI_DTYPE_E5M2) {
        p->k_scale = (float)fz_range(f, 1, 8) / 4.0f;
        p->v_scale = (float)fz_range(f, 1, 8) / 4.0f;
    }
    if (p->pos_encoding == FI_POS_ALIBI && fz_one_in(f, 2) && p->num_qo_heads > 0 &&
        p->num_qo_heads <= 16) {
        for (int32_t h = 0; h < p->num_qo_heads; h++) slopes[h] = (float)fz_range(f, 1, 100) / 64.0f;
        p->alibi_slopes = slopes;
    }
}

int fz_checkable(const fi_attention_params *p) {
    /* soft-cap with ALiBi: the kernels add the bias before the cap, the
     * oracle (docs/SEMANTICS.md) after it; the attention harness never
     * combines the two either */
    return !(p->pos_encoding == FI_POS_ALIBI && p->logits_soft_cap > 0.0f);
}

int fz_problem_make(const fi_attention_params *p, int32_t B, const int32_t *qo, const int32_t *kv,
                    int share, tu_rng *rng, fz_problem *pb) {
    memset(pb, 0, sizeof *pb);
    bool paged = p->kv_format == FI_KV_FORMAT_PAGED;
    int32_t ps = paged ? p->page_size : 1;
    pb->B = B;
    int32_t pages = 0;
    for (int32_t i = 0; i < B; i++) {
        pb->qo_indptr[i + 1] = pb->qo_indptr[i] + qo[i];
        int32_t n = paged ? (kv[i] + ps - 1) / ps : kv[i];
        pb->kv_indptr[i + 1] = pb->kv_indptr[i] + n;
        pb->last[i] = paged && n ? kv[i] - ps * (n - 1) : 0;
        pages += n;
        pb->mask_bytes += ((int64_t)qo[i] * kv[i] + 7) / 8;
    }
    pb->num_pages = pages + 4; /* spares; also entries past kv_indptr[B] for a fault's room */
    if (paged) {
        pb->indices = malloc(sizeof(int32_t) * (size_t)(pb->num_pages));
        for (int32_t i = 0; i < pb->num_pages; i++) pb->indices[i] = i;
        for (int32_t i = pb->num_pages - 1; i > 0; i--) {
            int32_t j = tu_rng_int(rng, 0, i), t = pb->indices[i];
            pb->indices[i] = pb->indices[j], pb->indices[j] = t;
        }
        /* shared prompts: request i starts with request i - 1's first pages */
        for (int32_t i = 1; share && i < B; i++) {
            int32_t a = pb->kv_indptr[i] - pb->kv_indptr[i - 1];
            int32_t b = pb->kv_indptr[i + 1] - pb->kv_indptr[i];
            int32_t s = tu_rng_int(rng, 0, a < b ? a : b);
            for (int32_t k = 0; k < s; k++)
                pb->indices[pb->kv_indptr[i] + k] = pb->indices[pb->kv_indptr[i - 1] + k];
        }
    }
    pb->batch = (fi_batch){B, pb->qo_indptr, pb->kv_indptr, pb->indices,
                           paged ? pb->last : NULL, NULL};
    int32_t tq = pb->qo_indptr[B];
    int64_t qs[3] = {tq, p->num_qo_heads, p->head_dim_qk}, os[3] = {tq, p->num_qo_heads, p->head_dim_vo};
    int64_t ls[2] = {tq, p->num_qo_heads}, ms[1] = {pb->mask_bytes > 0 ? pb->mask_bytes : 1};
    int64_t ks[4], vs[4];
    int32_t nd = paged ? 4 : 3;
    bool nhd = p->kv_layout == FI_KV_LAYOUT_NHD;
    if (paged) {
        int64_t a[4] = {pb->num_pages, nhd ? ps : p->num_kv_heads, nhd ? p->num_kv_heads : ps,
                        p->head_dim_qk};
        memcpy(ks, a, sizeof a), memcpy(vs, a, sizeof a);
        vs[3] = p->head_dim_vo;
    } else {
        int64_t a[3] = {nhd ? pb->num_pages : p->num_kv_heads, nhd ? p->num_kv_heads : pb->num_pages,
                        p->head_dim_qk};
        memcpy(ks, a, sizeof a), memcpy(vs, a, sizeof a);
        vs[2] = p->head_dim_vo;
    }
    if (fz_tensor(&pb->q, p->q_dtype, 3, qs, rng, 2.0) || fz_tensor(&pb->k, p->kv_dtype, nd, ks, rng, 2.0) ||
        fz_tensor(&pb->v, p->kv_dtype, nd, vs, rng, 1.0) || fz_tensor(&pb->o, p->o_dtype, 3, os, rng, 1.0) ||
        fz_tensor(&pb->lse, FI_DTYPE_F32, 2, ls, rng, 1.0) ||
        fz_tensor(&pb->mask, FI_DTYPE_U8, 1, ms, rng, 0.0))
        return -1;
    return 0;
}

fi_run_args fz_problem_args(const fz_problem *pb) {
    fi_run_args a;
    memset(&a, 0, sizeof a);
    a.q = pb->q.t, a.k = pb->k.t, a.v = pb->v.t, a.o = pb->o.t, a.lse = pb->lse.t;
    a.custom_mask = pb->mask.t;
    return a;
}

void fz_problem_check(const fi_attention_params *p, const fz_problem *pb, const char *what) {
    int64_t no = tu_numel(&pb->o.t), nl = tu_numel(&pb->lse.t);
    double *ro = malloc(sizeof(double) * (size_t)(no + 1)), *rl = malloc(sizeof(double) * (size_t)(nl + 1));
    if (oracle_attention(p, &pb->batch, &pb->q.t, &pb->k.t, &pb->v.t, pb->mask.base, ro, rl))
        FZ_FAIL("%s: the oracle refused a batch the library planned", what);
    double *go = tu_view_read(&pb->o.t), *gl = tu_view_read(&pb->lse.t);
    char name[64];
    snprintf(name, sizeof name, "%s: O", what);
    fz_compare(name, go, ro, no, fz_tol(p->q_dtype, p->kv_dtype, p->o_dtype));
    snprintf(name, sizeof name, "%s: LSE", what);
    double ltol = 1e-3, t = fz_tol(p->q_dtype, p->kv_dtype, p->o_dtype);
    if (p->pos_encoding == FI_POS_ROPE_LLAMA && t > ltol) ltol = t; /* rotated q/k rounded */
    fz_compare(name, gl, rl, nl, ltol);
    free(ro), free(rl), free(go), free(gl);
}

void fz_problem_free(fz_problem *pb) {
    free(pb->indices);
    tu_buf *b[] = {&pb->q, &pb->k, &pb->v, &pb->o, &pb->lse, &pb->mask};
    for (int i = 0; i < 6; i++) tu_buf_free(b[i]);
    memset(pb, 0, sizeof *pb);
}
