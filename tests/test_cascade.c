/*
 * test_cascade.c — fi_cascade_* against the fp64 oracle.
 *
 * Categories of the summary:
 *   levels     explicit cascades of 1-4 levels (a prefix shared by all, group
 *              prefixes, unique suffixes) x causal/none/window/custom x GQA x
 *              dtypes x decode/prefill, with empty levels and empty requests:
 *              against (a) the oracle of each level merged in fp64, and (b)
 *              where the two mean the same, the oracle and a plan of the
 *              same batch as one format (pages concatenated)
 *   detect     fi_cascade_create_auto on radix-tree-like batches (all share,
 *              groups share, nested, a 3-deep tree, none, a shared page that
 *              is some request's partial last page, causal chunks whose
 *              queries sit inside the prefix) with detection ALWAYS / AUTO /
 *              OFF: each against the oracle, and ALWAYS against OFF; ALWAYS
 *              keeps every level of the tree (3 for nested, 4 for the tree)
 *   bad_input  named messages for every misuse; O untouched by failed runs
 *
 * Backends: the CPU SIMD levels, and CUDA (--backend cuda; inputs and
 * poisoned outputs mirrored in device memory, tests/device.h).
 *
 * Every case: fresh seeded inputs, unused KV slots NaN, O/LSE (and their
 * padding rows) poisoned before the run; NaN never passes.
 */
#include "flashinfer.h"
#include "device.h"
#include "oracle.h"
#include "util.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the CPU SIMD levels, then CUDA (device.h) */
static tu_cpu_backend backends[TU_NUM_CPU_BACKENDS + 1];

/* ------------------------------------------------------------ the pool */

#define MAX_REQ 64
#define MAX_PAGES 2048

/* A paged pool: pages handed out in a random order; slot s of page p is
 * valid iff s < valid[p]; every other slot is NaN. */
typedef struct pool {
    int32_t num_pages, page_size, next;
    int32_t order[MAX_PAGES];
    int32_t valid[MAX_PAGES];
    tu_buf k, v;
} pool;

static void pool_init(pool *p, tu_rng *rng, int32_t pages, int32_t ps) {
    memset(p, 0, sizeof *p);
    p->num_pages = pages;
    p->page_size = ps;
    for (int32_t i = 0; i < pages; i++) p->order[i] = i;
    for (int32_t i = pages - 1; i > 0; i--) {
        int32_t j = tu_rng_int(rng, 0, i), t = p->order[i];
        p->order[i] = p->order[j];
        p->order[j] = t;
    }
}

static int32_t pool_page(pool *p, int32_t used) {
    int32_t id = p->order[p->next++];
    if (used > p->valid[id]) p->valid[id] = used;
    return id;
}

static int pool_fill(pool *p, tu_rng *rng, fi_dtype kv_dt, int32_t h_kv, int32_t d) {
    int64_t shape[4] = {p->num_pages, p->page_size, h_kv, d};
    if (tu_buf_alloc(&p->k, kv_dt, 4, shape) || tu_buf_alloc(&p->v, kv_dt, 4, shape)) return -1;
    tu_fill_uniform(rng, &p->k.t, -2, 2, 0);
    tu_fill_uniform(rng, &p->v.t, -1, 1, 0);
    for (int32_t pg = 0; pg < p->num_pages; pg++)
        for (int32_t s = p->valid[pg]; s < p->page_size; s++)
            for (int32_t h = 0; h < h_kv; h++)
                for (int32_t x = 0; x < d; x++) {
                    int64_t idx[4] = {pg, s, h, x};
                    tu_store(p->k.t.data, kv_dt, tu_offset(&p->k.t, idx), NAN);
                    tu_store(p->v.t.data, kv_dt, tu_offset(&p->v.t, idx), NAN);
                }
    return 0;
}

static void pool_free(pool *p) {
    tu_buf_free(&p->k);
    tu_buf_free(&p->v);
}

/* A batch owned by the test. */
typedef struct tbatch {
    int32_t n;
    int32_t qo[MAX_REQ + 1], kv[MAX_REQ + 1], last[MAX_REQ];
    int32_t idx[MAX_PAGES];
} tbatch;

static fi_batch tb_view(const tbatch *b) {
    fi_batch f = {.batch_size = b->n, .qo_indptr = b->qo, .kv_indptr = b->kv,
                  .kv_indices = b->idx, .kv_last_page_len = b->last, .mask_indptr = NULL};
    return f;
}

static int64_t tb_kv_len(const tbatch *b, int32_t i, int32_t ps) {
    int32_t n = b->kv[i + 1] - b->kv[i];
    return n ? (int64_t)ps * (n - 1) + b->last[i] : 0;
}

/* A random packed custom mask for a batch (request segments back to back). */
static int64_t make_mask(tu_rng *rng, const tbatch *b, int32_t ps, uint8_t *bits, int64_t cap) {
    int64_t off = 0;
    for (int32_t i = 0; i < b->n; i++) {
        int64_t q = b->qo[i + 1] - b->qo[i], kv = tb_kv_len(b, i, ps);
        int64_t bytes = (q * kv + 7) / 8;
        if (off + bytes > cap) return -1;
        for (int64_t x = 0; x < bytes; x++) bits[off + x] = (uint8_t)tu_rng_int(rng, 0, 255);
        off += bytes;
    }
    return off;
}

/* ------------------------------------------------------- output checks */

typedef struct outputs {
    tu_buf o, lse;
    tu_mirror mo, ml; /* what the library writes (device copies on CUDA) */
    int64_t rows; /* token rows the batch has; the buffers have 2 more */
} outputs;

/* The inputs as the library sees them on the backend under test. */
typedef struct lib_in {
    tu_mirror q, k, v, mask;
} lib_in;

static int lib_in_up(const tu_cpu_backend *be, lib_in *in, const tu_buf *q, const pool *p,
                     const tu_buf *mask) {
    memset(in, 0, sizeof *in);
    return tu_mirror_up(be, q, &in->q) || tu_mirror_up(be, &p->k, &in->k) ||
           tu_mirror_up(be, &p->v, &in->v) || (mask && tu_mirror_up(be, mask, &in->mask));
}

static void lib_in_free(lib_in *in) {
    tu_mirror_free(&in->q);
    tu_mirror_free(&in->k);
    tu_mirror_free(&in->v);
    tu_mirror_free(&in->mask);
}

/* Poison O and LSE (padding rows included) where the library writes. */
static int outputs_poison(const tu_cpu_backend *be, outputs *out) {
    tu_buf_poison(&out->o);
    tu_buf_poison(&out->lse);
    tu_mirror_free(&out->mo);
    tu_mirror_free(&out->ml);
    return tu_mirror_up(be, &out->o, &out->mo) || tu_mirror_up(be, &out->lse, &out->ml);
}

/* What the library wrote, back on the host for the checks. */
static int outputs_fetch(const tu_cpu_backend *be, outputs *out) {
    return tu_mirror_down(be, &out->mo, &out->o) || tu_mirror_down(be, &out->ml, &out->lse);
}

static int outputs_alloc(outputs *out, int64_t rows, int32_t h, int32_t d, fi_dtype o_dt) {
    memset(out, 0, sizeof *out);
    out->rows = rows;
    int64_t os[3] = {rows + 2, h, d}, ls[2] = {rows + 2, h};
    return tu_buf_alloc(&out->o, o_dt, 3, os) || tu_buf_alloc(&out->lse, FI_DTYPE_F32, 2, ls);
}

static void outputs_free(outputs *out) {
    tu_mirror_free(&out->mo);
    tu_mirror_free(&out->ml);
    tu_buf_free(&out->o);
    tu_buf_free(&out->lse);
}

static fi_run_args run_args(const lib_in *in, outputs *out, int with_lse, int with_mask) {
    fi_run_args a;
    memset(&a, 0, sizeof a);
    a.q = in->q.t;
    a.k = in->k.t;
    a.v = in->v.t;
    a.o = out->mo.t;
    if (with_lse) a.lse = out->ml.t;
    if (with_mask) a.custom_mask = in->mask.t;
    return a;
}

/* Compare O (and LSE) rows [0, rows) with the reference; rows past the batch
 * and an unrequested LSE must still be poison. */
static int check_out(const outputs *out, const double *o_ref, const double *lse_ref,
                     int32_t h, int32_t d, double tol, int with_lse, const char *what) {
    int64_t n = out->rows * h * d;
    double *got = malloc((size_t)(n + 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) got[i] = tu_load(out->o.t.data, out->o.t.dtype, i);
    tu_cmp c;
    int bad = 0;
    if (tu_compare(got, o_ref, n, tol, tol, &c)) {
        tu_note("%s: O: %lld of %lld out of tolerance %g, %lld NaN; worst [%lld] got %g want %g",
                what, (long long)c.bad, (long long)n, tol, (long long)c.nan, (long long)c.worst,
                c.worst_got, c.worst_ref);
        bad = 1;
    }
    if (with_lse) {
        int64_t m = out->rows * h;
        const float *l = out->lse.t.data;
        for (int64_t i = 0; i < m; i++) got[i] = l[i];
        if (tu_compare(got, lse_ref, m, 2e-5, 2e-5, &c)) {
            tu_note("%s: LSE: %lld of %lld out of tolerance, worst [%lld] got %g want %g", what,
                    (long long)c.bad, (long long)m, (long long)c.worst, c.worst_got,
                    c.worst_ref);
            bad = 1;
        }
    }
    free(got);
    size_t es = tu_dtype_size(out->o.t.dtype);
    const uint8_t *tail = (const uint8_t *)out->o.t.data + (size_t)n * es;
    for (size_t i = 0; i < 2 * (size_t)h * (size_t)d * es; i++)
        if (tail[i] != 0xFF) {
            tu_note("%s: O padding row written (byte %zu)", what, i);
            bad = 1;
            break;
        }
    const uint8_t *lt = out->lse.t.data;
    size_t lbytes = (size_t)(with_lse ? out->rows : 0) * (size_t)h * 4;
    for (size_t i = lbytes; i < (size_t)(out->rows + 2) * (size_t)h * 4; i++)
        if (lt[i] != 0xFF) {
            tu_note("%s: LSE written where it must not be (byte %zu)", what, i);
            bad = 1;
            break;
        }
    return bad;
}

/* Merge per-level fp64 states (o[l], lse[l]) in level order. */
static void merge_ref(double **o, double **lse, int32_t L, int64_t rows, int32_t h, int32_t d,
                      double *o_out, double *lse_out) {
    for (int64_t r = 0; r < rows * h; r++) {
        double m = -INFINITY;
        for (int32_t l = 0; l < L; l++)
            if (lse[l][r] > m) m = lse[l][r];
        if (m == -INFINITY) {
            lse_out[r] = -INFINITY;
            for (int32_t x = 0; x < d; x++) o_out[r * d + x] = 0;
            continue;
        }
        double den = 0;
        for (int32_t x = 0; x < d; x++) o_out[r * d + x] = 0;
        for (int32_t l = 0; l < L; l++) {
            if (lse[l][r] == -INFINITY) continue;
            double w = exp2(lse[l][r] - m);
            den += w;
            for (int32_t x = 0; x < d; x++) o_out[r * d + x] += w * o[l][r * d + x];
        }
        for (int32_t x = 0; x < d; x++) o_out[r * d + x] /= den;
        lse_out[r] = m + log2(den);
    }
}

/* ===================================================== explicit levels */

typedef struct lcase {
    int32_t levels, batch, h_qo, h_kv, d, ps;
    fi_mask_mode mask;
    int32_t window;
    fi_dtype q_dt, kv_dt, o_dt;
    int32_t max_qo;           /* 1 = decode */
    int32_t empty;            /* 1: an empty middle level; 2: empty requests too */
    int32_t partial_mid;      /* a middle level whose groups end in a partial page */
    int32_t with_lse;
} lcase;

static void run_level_case(tu_cpu_backend *be, const lcase *c, const char *name) {
    uint64_t seed = tu_case_seed(name);
    tu_crash_context(name, seed);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    int32_t L = c->levels, B = c->batch, ps = c->ps;
    pool p;
    pool_init(&p, &rng, 192, ps);
    static tbatch lv[FI_CASCADE_MAX_LEVELS], single;
    memset(lv, 0, sizeof lv);
    memset(&single, 0, sizeof single);
    /* groups: level 0 one group, the last level one per request, middle
     * levels consecutive groups nested in the level above */
    int32_t group_of[FI_CASCADE_MAX_LEVELS][MAX_REQ];
    for (int32_t i = 0; i < B; i++) group_of[0][i] = L == 1 ? i : 0;
    for (int32_t l = 1; l < L; l++) {
        int32_t g = 0;
        for (int32_t i = 0; i < B; i++) {
            if (i > 0 && (l == L - 1 || group_of[l - 1][i] != group_of[l - 1][i - 1] ||
                          tu_rng_int(&rng, 0, 2) == 0))
                g++;
            group_of[l][i] = g;
        }
    }
    int32_t qo[MAX_REQ + 1];
    qo[0] = 0;
    for (int32_t i = 0; i < B; i++) {
        int32_t q = c->max_qo == 1 ? 1 : tu_rng_int(&rng, 1, c->max_qo);
        if (c->empty == 2 && i % 4 == 1) q = 0;
        qo[i + 1] = qo[i] + q;
    }
    int32_t total = qo[B];
    bool single_ok = !c->partial_mid;
    for (int32_t l = 0; l < L; l++) {
        tbatch *b = &lv[l];
        int32_t ng = group_of[l][B - 1] + 1;
        b->n = ng;
        b->qo[0] = b->kv[0] = 0;
        int32_t i = 0;
        for (int32_t g = 0; g < ng; g++) {
            int32_t first = i;
            while (i < B && group_of[l][i] == g) i++;
            b->qo[g + 1] = qo[i];
            int32_t pages, last;
            if (l == L - 1) {
                /* the suffix: enough keys that causal means the same merged */
                int32_t need = (qo[i] - qo[first]) - 1;
                int32_t keys = tu_rng_int(&rng, need > 0 ? need : 0, 3 * ps + 5);
                if (c->empty == 2 && g % 5 == 2) keys = 0;
                if (keys < need && c->mask != FI_MASK_NONE) single_ok = false;
                pages = (keys + ps - 1) / ps;
                last = pages ? keys - (pages - 1) * ps : 0;
            } else if (c->empty && l == 1 && L > 2) {
                pages = 0;
                last = 0;
            } else {
                pages = tu_rng_int(&rng, l == 0 ? 1 : 0, l == 0 ? 6 : 3);
                last = pages ? ps : 0;
                if (c->partial_mid && pages) last = tu_rng_int(&rng, 1, ps);
            }
            for (int32_t k = 0; k < pages; k++)
                b->idx[b->kv[g] + k] = pool_page(&p, k == pages - 1 ? last : ps);
            b->kv[g + 1] = b->kv[g] + pages;
            b->last[g] = last;
        }
    }
    /* the same batch in one format: each request's pages level by level */
    single.n = B;
    single.qo[0] = single.kv[0] = 0;
    for (int32_t i = 0; i < B; i++) {
        int32_t at = single.kv[i], last = 0;
        for (int32_t l = 0; l < L; l++) {
            const tbatch *b = &lv[l];
            int32_t g = group_of[l][i];
            for (int32_t k = b->kv[g]; k < b->kv[g + 1]; k++) single.idx[at++] = b->idx[k];
            if (b->kv[g + 1] > b->kv[g]) last = b->last[g];
        }
        single.kv[i + 1] = at;
        single.last[i] = last;
        single.qo[i + 1] = qo[i + 1];
    }
    if (c->window >= 0) single_ok = false; /* a window over a shared level differs */

    fi_attention_params params;
    fi_attention_params_init(&params);
    params.num_qo_heads = c->h_qo;
    params.num_kv_heads = c->h_kv;
    params.head_dim_qk = params.head_dim_vo = c->d;
    params.page_size = ps;
    params.q_dtype = c->q_dt;
    params.kv_dtype = c->kv_dt;
    params.o_dtype = c->o_dt;
    params.mask_mode = c->mask;
    params.window_left = c->window;

    tu_buf q, mask;
    memset(&mask, 0, sizeof mask);
    outputs out;
    int64_t qs[3] = {total > 0 ? total : 1, c->h_qo, c->d};
    int fail = tu_buf_alloc(&q, c->q_dt, 3, qs) || pool_fill(&p, &rng, c->kv_dt, c->h_kv, c->d) ||
               outputs_alloc(&out, total, c->h_qo, c->d, c->o_dt);
    tu_fill_uniform(&rng, &q.t, -2, 2, 0);
    if (c->mask == FI_MASK_CUSTOM) {
        uint8_t *tmp = malloc(1 << 16);
        int64_t bytes = make_mask(&rng, &lv[L - 1], ps, tmp, 1 << 16);
        if (bytes < 1) bytes = 1;
        fail |= tu_buf_alloc_bytes(&mask, (size_t)bytes);
        memcpy(mask.base, tmp, (size_t)bytes);
        free(tmp);
        mask.t = fi_tensor_contiguous(mask.base, FI_DTYPE_U8, 1, &bytes);
        single_ok = false;
    }
    lib_in in;
    fail |= lib_in_up(be, &in, &q, &p, c->mask == FI_MASK_CUSTOM ? &mask : NULL);

    int64_t rows = (int64_t)total * c->h_qo;
    double *lo[FI_CASCADE_MAX_LEVELS], *ll[FI_CASCADE_MAX_LEVELS];
    double *o_ref = calloc((size_t)(rows * c->d + 1), sizeof(double));
    double *lse_ref = calloc((size_t)(rows + 1), sizeof(double));
    for (int32_t l = 0; l < L; l++) {
        lo[l] = calloc((size_t)(rows * c->d + 1), sizeof(double));
        ll[l] = calloc((size_t)(rows + 1), sizeof(double));
        fi_attention_params lp = params;
        if (l < L - 1) {
            lp.mask_mode = FI_MASK_NONE;
            lp.window_left = -1;
        }
        fi_batch fb = tb_view(&lv[l]);
        fail |= oracle_attention(&lp, &fb, &q.t, &p.k.t, &p.v.t, mask.t.data, lo[l], ll[l]);
    }
    merge_ref(lo, ll, L, total, c->h_qo, c->d, o_ref, lse_ref);

    fi_plan_config cfg[FI_CASCADE_MAX_LEVELS];
    for (int32_t l = 0; l < L; l++) {
        fi_plan_config_init(&cfg[l]);
        cfg[l].max_batch_size = B;
        cfg[l].max_total_qo = total > 0 ? total : 1;
        cfg[l].max_total_kv = MAX_PAGES;
    }
    fi_cascade *cas = NULL;
    fi_status st = fail ? FI_STATUS_INTERNAL : fi_cascade_create(be->ctx, &params, L, cfg, NULL, &cas);
    fi_batch fbs[FI_CASCADE_MAX_LEVELS];
    for (int32_t l = 0; l < L; l++) fbs[l] = tb_view(&lv[l]);
    if (!st) st = fi_cascade_update(cas, fbs);
    fail |= outputs_poison(be, &out);
    fi_run_args a = run_args(&in, &out, c->with_lse, c->mask == FI_MASK_CUSTOM);
    if (!st) st = fi_cascade_run(cas, &a);
    fail |= outputs_fetch(be, &out);
    double tol = tu_dtype_tol(c->q_dt);
    if (tu_dtype_tol(c->kv_dt) > tol) tol = tu_dtype_tol(c->kv_dt);
    if (tu_dtype_tol(c->o_dt) > tol) tol = tu_dtype_tol(c->o_dt);
    if (st) {
        tu_note("cascade: %s: %s", fi_status_string(st), fi_last_error());
        fail = 1;
    } else {
        fail |= check_out(&out, o_ref, lse_ref, c->h_qo, c->d, tol, c->with_lse, "levels vs merged oracle");
    }
    if (!fail && single_ok) {
        /* the oracle of the batch in one format, and a plan of it */
        fi_batch sb = tb_view(&single);
        double *o1 = calloc((size_t)(rows * c->d + 1), sizeof(double));
        double *l1 = calloc((size_t)(rows + 1), sizeof(double));
        fail |= oracle_attention(&params, &sb, &q.t, &p.k.t, &p.v.t, NULL, o1, l1);
        fail |= check_out(&out, o1, l1, c->h_qo, c->d, tol, c->with_lse, "levels vs one-format oracle");
        fi_plan *plan = NULL;
        fi_plan_config pc = cfg[0];
        outputs o2;
        outputs_alloc(&o2, total, c->h_qo, c->d, c->o_dt);
        fail |= outputs_poison(be, &o2);
        fi_run_args a2 = run_args(&in, &o2, c->with_lse, 0);
        st = fi_plan_create(be->ctx, &params, &pc, &plan);
        if (!st) st = fi_plan_update(plan, &sb);
        if (!st) st = fi_plan_run(plan, &a2);
        fail |= outputs_fetch(be, &o2);
        if (st) {
            tu_note("single plan: %s", fi_last_error());
            fail = 1;
        } else {
            /* the one-format plan, read back as the reference */
            int64_t n = rows * c->d;
            for (int64_t i = 0; i < n; i++) o1[i] = tu_load(o2.o.t.data, c->o_dt, i);
            for (int64_t i = 0; i < rows; i++) l1[i] = ((float *)o2.lse.t.data)[i];
            fail |= check_out(&out, o1, l1, c->h_qo, c->d, 2 * tol, c->with_lse,
                              "levels vs one-format plan");
        }
        fi_plan_destroy(plan);
        outputs_free(&o2);
        free(o1);
        free(l1);
    }
    tu_record("levels", name, fail ? TU_FAIL : TU_PASS);
    fi_cascade_destroy(cas);
    for (int32_t l = 0; l < L; l++) {
        free(lo[l]);
        free(ll[l]);
    }
    free(o_ref);
    free(lse_ref);
    lib_in_free(&in);
    tu_buf_free(&q);
    tu_buf_free(&mask);
    outputs_free(&out);
    pool_free(&p);
    tu_crash_context(NULL, 0);
}

static void level_cases(tu_cpu_backend *be) {
    static const fi_dtype dts[][3] = {{FI_DTYPE_F32, FI_DTYPE_F32, FI_DTYPE_F32},
                                      {FI_DTYPE_F16, FI_DTYPE_F16, FI_DTYPE_F16},
                                      {FI_DTYPE_BF16, FI_DTYPE_BF16, FI_DTYPE_BF16},
                                      {FI_DTYPE_F16, FI_DTYPE_F16, FI_DTYPE_F32}};
    static const int32_t heads[][2] = {{4, 4}, {8, 2}, {4, 1}};
    static const struct {
        const char *name;
        fi_mask_mode mask;
        int32_t window;
    } masks[] = {{"none", FI_MASK_NONE, -1}, {"causal", FI_MASK_CAUSAL, -1},
                 {"causal+window7", FI_MASK_CAUSAL, 7}, {"custom", FI_MASK_CUSTOM, -1}};
    int count = 0;
    for (int32_t L = 1; L <= 4; L++)
        for (int mi = 0; mi < 4; mi++)
            for (int hi = 0; hi < 3; hi++)
                for (int di = 0; di < 4; di++)
                    for (int shape = 0; shape < 2; shape++)
                        for (int var = 0; var < 3; var++) {
                            /* each combination on one SIMD level in turn; --quick: 1 in 8;
                             * CUDA: 1 in 6 (--quick: 1 in 24) */
                            int k = count++;
                            if (tu_is_cuda(be) ? k % (tu_opt.quick ? 24 : 6) != 0
                                               : k % TU_NUM_CPU_BACKENDS != be->index ||
                                                     (tu_opt.quick && (k / TU_NUM_CPU_BACKENDS) % 8))
                                continue;
                            lcase c = {.levels = L, .batch = 6 + var * 5, .h_qo = heads[hi][0],
                                       .h_kv = heads[hi][1], .d = (hi + di) % 2 ? 128 : 64,
                                       .ps = var == 2 ? 7 : 16, .mask = masks[mi].mask,
                                       .window = masks[mi].window, .q_dt = dts[di][0],
                                       .kv_dt = dts[di][1], .o_dt = dts[di][2],
                                       .max_qo = shape ? 5 : 1, .empty = var,
                                       .partial_mid = var == 1 && L > 2, .with_lse = var != 2};
                            char name[256];
                            snprintf(name, sizeof name,
                                     "%s/levels/L%d/%s/%s_%s_%s/d%d/h%d:%d/%s/ps%d/%s%s%s",
                                     be->name, (int)L, masks[mi].name, tu_dtype_name(c.q_dt),
                                     tu_dtype_name(c.kv_dt), tu_dtype_name(c.o_dt), (int)c.d,
                                     (int)c.h_qo, (int)c.h_kv, shape ? "prefill" : "decode",
                                     (int)c.ps, var == 0 ? "plain" : var == 1 ? "empty-level" : "empty-requests",
                                     c.partial_mid ? "+partial-mid" : "", c.with_lse ? "" : "/no-lse");
                            if (!tu_begin_case(name)) continue;
                            run_level_case(be, &c, name);
                        }
}

/* ==================================================== prefix detection */

typedef enum shape_kind {
    SH_ALL = 0,      /* every request shares P pages */
    SH_GROUPS = 1,   /* consecutive groups share their own prefixes */
    SH_NESTED = 2,   /* all share a little, pairs share more (a radix tree) */
    SH_NONE = 3,     /* nothing shared */
    SH_PARTIAL = 4,  /* a shared page that is one request's partial last page */
    SH_CHUNK = 5,    /* causal chunks whose first queries sit inside the prefix */
    SH_TREE = 6,     /* a deeper radix tree: all share, quads share more, pairs more */
    SH_COUNT = 7
} shape_kind;

static const char *shape_names[SH_COUNT] = {"all", "groups", "nested", "none", "partial", "chunk", "tree"};

static void build_radix(tu_rng *rng, pool *p, tbatch *b, shape_kind sk, int32_t B,
                        int32_t max_qo) {
    int32_t ps = p->page_size;
    int32_t common[6], ncommon = tu_rng_int(rng, 2, 5);
    for (int32_t k = 0; k < ncommon; k++) common[k] = pool_page(p, ps);
    int32_t pair[6], npair = 0, grp[6], ngrp = 0, quad[6], nquad = 0;
    b->n = B;
    b->qo[0] = b->kv[0] = 0;
    for (int32_t i = 0; i < B; i++) {
        int32_t q = max_qo == 1 ? 1 : tu_rng_int(rng, 1, max_qo);
        b->qo[i + 1] = b->qo[i] + q;
        int32_t at = b->kv[i];
        if (sk == SH_ALL || sk == SH_NESTED || sk == SH_CHUNK || sk == SH_PARTIAL ||
            sk == SH_TREE)
            for (int32_t k = 0; k < ncommon; k++) b->idx[at++] = common[k];
        if (sk == SH_GROUPS) {
            if (i % 3 == 0) {
                ngrp = tu_rng_int(rng, 1, 4);
                for (int32_t k = 0; k < ngrp; k++) grp[k] = pool_page(p, ps);
            }
            for (int32_t k = 0; k < ngrp; k++) b->idx[at++] = grp[k];
        }
        if (sk == SH_TREE) {
            if (i % 4 == 0) {
                nquad = tu_rng_int(rng, 1, 3);
                for (int32_t k = 0; k < nquad; k++) quad[k] = pool_page(p, ps);
            }
            for (int32_t k = 0; k < nquad; k++) b->idx[at++] = quad[k];
        }
        if (sk == SH_NESTED || sk == SH_TREE) {
            if (i % 2 == 0) {
                npair = tu_rng_int(rng, 1, 4);
                for (int32_t k = 0; k < npair; k++) pair[k] = pool_page(p, ps);
            }
            for (int32_t k = 0; k < npair; k++) b->idx[at++] = pair[k];
        }
        int32_t keys = tu_rng_int(rng, sk == SH_CHUNK ? 0 : q, 2 * ps + 3);
        if (sk == SH_PARTIAL && i % 3 == 1) {
            /* this request ends inside the last common page */
            b->last[i] = tu_rng_int(rng, 1, ps - 1);
            b->kv[i + 1] = at;
            if (b->qo[i + 1] - b->qo[i] > 1) b->qo[i + 1] = b->qo[i] + 1;
            continue;
        }
        if (sk == SH_CHUNK && max_qo > 1) {
            /* a chunk longer than its unique keys: causal queries inside the prefix */
            int32_t ql = tu_rng_int(rng, keys + 1, keys + ps + 4);
            b->qo[i + 1] = b->qo[i] + ql;
        }
        int32_t pages = (keys + ps - 1) / ps;
        for (int32_t k = 0; k < pages; k++)
            b->idx[at++] = pool_page(p, k == pages - 1 ? keys - (pages - 1) * ps : ps);
        b->kv[i + 1] = at;
        b->last[i] = pages ? keys - (pages - 1) * ps : ps;
        if (at == b->kv[i]) b->last[i] = 0;
    }
}

typedef struct dcase {
    shape_kind shape;
    int32_t batch, h_qo, h_kv, d, ps, max_qo;
    fi_mask_mode mask;
    fi_dtype dt;
} dcase;

static void run_detect_case(tu_cpu_backend *be, const dcase *c, const char *name) {
    uint64_t seed = tu_case_seed(name);
    tu_crash_context(name, seed);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    pool p;
    pool_init(&p, &rng, 160, c->ps);
    static tbatch b;
    memset(&b, 0, sizeof b);
    build_radix(&rng, &p, &b, c->shape, c->batch, c->max_qo);
    int32_t total = b.qo[b.n];
    fi_attention_params params;
    fi_attention_params_init(&params);
    params.num_qo_heads = c->h_qo;
    params.num_kv_heads = c->h_kv;
    params.head_dim_qk = params.head_dim_vo = c->d;
    params.page_size = c->ps;
    params.q_dtype = params.kv_dtype = params.o_dtype = c->dt;
    params.mask_mode = c->mask;
    tu_buf q;
    outputs out[3];
    int64_t qs[3] = {total, c->h_qo, c->d};
    int fail = tu_buf_alloc(&q, c->dt, 3, qs) || pool_fill(&p, &rng, c->dt, c->h_kv, c->d);
    for (int m = 0; m < 3; m++) fail |= outputs_alloc(&out[m], total, c->h_qo, c->d, c->dt);
    tu_fill_uniform(&rng, &q.t, -2, 2, 0);
    lib_in in;
    fail |= lib_in_up(be, &in, &q, &p, NULL);
    int64_t rows = (int64_t)total * c->h_qo;
    double *o_ref = calloc((size_t)(rows * c->d), sizeof(double));
    double *l_ref = calloc((size_t)rows, sizeof(double));
    fi_batch fb = tb_view(&b);
    fail |= oracle_attention(&params, &fb, &q.t, &p.k.t, &p.v.t, NULL, o_ref, l_ref);
    double tol = tu_dtype_tol(c->dt);
    static const fi_prefix_detection modes[3] = {FI_PREFIX_DETECTION_ALWAYS,
                                                 FI_PREFIX_DETECTION_AUTO,
                                                 FI_PREFIX_DETECTION_OFF};
    static const char *mode_names[3] = {"always", "auto", "off"};
    int split_always = 0;
    for (int m = 0; m < 3 && !fail; m++) {
        fi_plan_config cfg;
        fi_plan_config_init(&cfg);
        cfg.max_batch_size = c->batch;
        cfg.max_total_qo = total;
        cfg.max_total_kv = b.kv[b.n] > 0 ? b.kv[b.n] : 1;
        fi_cascade_options opt;
        fi_cascade_options_init(&opt);
        opt.prefix_detection = modes[m];
        fi_cascade *cas = NULL;
        fi_status st = fi_cascade_create_auto(be->ctx, &params, &cfg, &opt, &cas);
        if (!st) st = fi_cascade_update_batch(cas, &fb);
        fi_cascade_info info;
        fi_cascade_info_init(&info);
        if (!st) st = fi_cascade_get_info(cas, &info);
        fail |= outputs_poison(be, &out[m]);
        fi_run_args a = run_args(&in, &out[m], 1, 0);
        if (!st) st = fi_cascade_run(cas, &a);
        fail |= outputs_fetch(be, &out[m]);
        /* twice: a second run on the same plan gives the same bits */
        if (!st) {
            outputs again;
            outputs_alloc(&again, total, c->h_qo, c->d, c->dt);
            fail |= outputs_poison(be, &again);
            fi_run_args a2 = run_args(&in, &again, 1, 0);
            st = fi_cascade_run(cas, &a2);
            fail |= outputs_fetch(be, &again);
            if (!st && memcmp(again.o.t.data, out[m].o.t.data,
                              (size_t)rows * c->d * tu_dtype_size(c->dt))) {
                tu_note("%s: a second run differs", mode_names[m]);
                fail = 1;
            }
            outputs_free(&again);
        }
        fi_cascade_destroy(cas);
        if (st) {
            tu_note("%s: %s: %s", mode_names[m], fi_status_string(st), fi_last_error());
            fail = 1;
            break;
        }
        if (m == 0) split_always = info.split;
        if (m == 2 && info.split) {
            tu_note("detection off but split");
            fail = 1;
        }
        if (m == 0 && (c->shape == SH_NONE) != !info.split && c->shape != SH_CHUNK) {
            tu_note("always: split=%d for shape %s (groups %d)", info.split,
                    shape_names[c->shape], info.num_groups);
            fail = 1;
        }
        /* ALWAYS keeps every level of the tree: nested is global + pairs,
         * tree is global + quads + pairs (each over its suffixes) */
        int want = c->shape == SH_NESTED ? 3 : c->shape == SH_TREE ? 4 : 0;
        if (m == 0 && want && info.num_levels != want) {
            tu_note("always: %d levels for shape %s, want %d", info.num_levels,
                    shape_names[c->shape], want);
            fail = 1;
        }
        char what[64];
        snprintf(what, sizeof what, "detection %s (split %d, %d levels)", mode_names[m],
                 info.split, info.num_levels);
        fail |= check_out(&out[m], o_ref, l_ref, c->h_qo, c->d, tol, 1, what);
    }
    if (!fail) {
        /* ALWAYS against OFF, element by element */
        int64_t n = rows * c->d;
        double *x = malloc((size_t)n * sizeof(double)), *y = malloc((size_t)rows * sizeof(double));
        for (int64_t i = 0; i < n; i++) x[i] = tu_load(out[2].o.t.data, c->dt, i);
        for (int64_t i = 0; i < rows; i++) y[i] = ((float *)out[2].lse.t.data)[i];
        fail |= check_out(&out[0], x, y, c->h_qo, c->d, 2 * tol, 1, "always vs off");
        free(x);
        free(y);
    }
    (void)split_always;
    tu_record("detect", name, fail ? TU_FAIL : TU_PASS);
    free(o_ref);
    free(l_ref);
    lib_in_free(&in);
    tu_buf_free(&q);
    for (int m = 0; m < 3; m++) outputs_free(&out[m]);
    pool_free(&p);
    tu_crash_context(NULL, 0);
}

static void detect_cases(tu_cpu_backend *be) {
    static const int32_t heads[][2] = {{4, 4}, {8, 2}};
    static const fi_dtype dts[] = {FI_DTYPE_F32, FI_DTYPE_F16, FI_DTYPE_BF16};
    int count = 0;
    for (int s = 0; s < SH_COUNT; s++)
        for (int mk = 0; mk < 2; mk++)
            for (int qo = 0; qo < 2; qo++)
                for (int hi = 0; hi < 2; hi++)
                    for (int di = 0; di < 3; di++) {
                        int k = count++;
                        if (tu_opt.quick && (k % 4) != be->index % 4) continue;
                        dcase c = {.shape = (shape_kind)s, .batch = 8 + 4 * hi + di,
                                   .h_qo = heads[hi][0], .h_kv = heads[hi][1],
                                   .d = di == 1 ? 128 : 64, .ps = hi ? 16 : 8,
                                   .max_qo = qo ? 6 : 1,
                                   .mask = mk ? FI_MASK_CAUSAL : FI_MASK_NONE, .dt = dts[di]};
                        char name[200];
                        snprintf(name, sizeof name, "%s/detect/%s/%s/%s/%s/h%d:%d/ps%d",
                                 be->name, shape_names[s], mk ? "causal" : "none",
                                 qo ? "prefill" : "decode", tu_dtype_name(c.dt), (int)c.h_qo,
                                 (int)c.h_kv, (int)c.ps);
                        if (!tu_begin_case(name)) continue;
                        run_detect_case(be, &c, name);
                    }
}

/* =========================================================== bad input */

static void bad_input_cases(tu_cpu_backend *be) {
    char name[128];
    snprintf(name, sizeof name, "%s/bad_input/cascade", be->name);
    if (!tu_begin_case(name)) return;
    tu_rng rng;
    tu_rng_seed(&rng, tu_case_seed(name));
    int fail = 0;
    fi_attention_params params;
    fi_attention_params_init(&params);
    params.num_qo_heads = params.num_kv_heads = 4;
    params.head_dim_qk = params.head_dim_vo = 64;
    params.page_size = 4;
    params.q_dtype = params.kv_dtype = params.o_dtype = FI_DTYPE_F32;
    fi_plan_config cfg[2];
    for (int l = 0; l < 2; l++) {
        fi_plan_config_init(&cfg[l]);
        cfg[l].max_batch_size = 4;
        cfg[l].max_total_qo = 4;
        cfg[l].max_total_kv = 8;
    }
    fi_cascade *c = NULL;
    fail |= tu_expect_status(fi_cascade_create(be->ctx, &params, 0, cfg, NULL, &c),
                             FI_STATUS_INVALID_ARGUMENT, "num_levels=0", "zero levels");
    fail |= tu_expect_status(fi_cascade_create(be->ctx, &params, 9, cfg, NULL, &c),
                             FI_STATUS_INVALID_ARGUMENT, "num_levels=9", "nine levels");
    fail |= tu_expect_status(fi_cascade_create(be->ctx, &params, 2, NULL, NULL, &c),
                             FI_STATUS_INVALID_ARGUMENT, "level_configs", "NULL configs");
    fi_attention_params rope = params;
    rope.pos_encoding = FI_POS_ROPE_LLAMA;
    fail |= tu_expect_status(fi_cascade_create(be->ctx, &rope, 2, cfg, NULL, &c),
                             FI_STATUS_UNSUPPORTED, "pos_encoding=1", "RoPE over levels");
    fi_attention_params ragged = params;
    ragged.kv_format = FI_KV_FORMAT_RAGGED;
    fail |= tu_expect_status(fi_cascade_create(be->ctx, &ragged, 2, cfg, NULL, &c),
                             FI_STATUS_UNSUPPORTED, "kv_format=1", "ragged");
    fi_cascade_options opt;
    fi_cascade_options_init(&opt);
    opt.struct_size = 3;
    fail |= tu_expect_status(fi_cascade_create(be->ctx, &params, 2, cfg, &opt, &c),
                             FI_STATUS_INVALID_ARGUMENT, "struct_size=3", "options size");
    fi_cascade_options_init(&opt);
    static _Alignas(64) uint8_t small_ws[128];
    opt.workspace = small_ws;
    opt.workspace_bytes = sizeof small_ws;
    fail |= tu_expect_status(fi_cascade_create(be->ctx, &params, 2, cfg, &opt, &c),
                             FI_STATUS_INVALID_ARGUMENT, "workspace_bytes=128", "small workspace");
    fi_plan_config odd[2] = {cfg[0], cfg[1]};
    odd[1].max_total_qo = 5;
    fail |= tu_expect_status(fi_cascade_create(be->ctx, &params, 2, odd, NULL, &c),
                             FI_STATUS_INVALID_ARGUMENT, "level_configs[1].max_total_qo=5",
                             "qo bounds");
    odd[1] = cfg[1];
    odd[1].max_total_kv = -3;
    fail |= tu_expect_status(fi_cascade_create(be->ctx, &params, 2, odd, NULL, &c),
                             FI_STATUS_INVALID_ARGUMENT, "cascade level 1", "level 1 config");
    if (fi_cascade_create(be->ctx, &params, 2, cfg, NULL, &c)) {
        tu_note("create: %s", fi_last_error());
        tu_record("bad_input", name, TU_FAIL);
        return;
    }
    /* pages 0..7 of 4 slots, every slot valid */
    int64_t ks[4] = {8, 4, 4, 64}, qsh[3] = {4, 4, 64};
    tu_buf k, v, q;
    outputs out;
    tu_buf_alloc(&k, FI_DTYPE_F32, 4, ks);
    tu_buf_alloc(&v, FI_DTYPE_F32, 4, ks);
    tu_buf_alloc(&q, FI_DTYPE_F32, 3, qsh);
    outputs_alloc(&out, 4, 4, 64, FI_DTYPE_F32);
    tu_fill_uniform(&rng, &k.t, -1, 1, 0);
    tu_fill_uniform(&rng, &v.t, -1, 1, 0);
    tu_fill_uniform(&rng, &q.t, -1, 1, 0);
    fi_run_args a;
    memset(&a, 0, sizeof a);
    a.q = q.t;
    a.k = k.t;
    a.v = v.t;
    a.o = out.o.t;
    a.lse = out.lse.t;
    fail |= tu_expect_status(fi_cascade_run(c, &a), FI_STATUS_NOT_PLANNED, "fi_cascade_update",
                             "run first");
    int32_t qo0[2] = {0, 4}, kv0[2] = {0, 2}, idx0[2] = {0, 1}, last0[1] = {4};
    int32_t qo1[5] = {0, 1, 2, 3, 4}, kv1[5] = {0, 1, 2, 3, 4}, idx1[4] = {2, 3, 4, 5};
    int32_t last1[4] = {1, 2, 3, 4};
    fi_batch lv[2] = {{1, qo0, kv0, idx0, last0, NULL}, {4, qo1, kv1, idx1, last1, NULL}};
    int32_t qo_bad[5] = {17, 1, 2, 3, 4};
    lv[1].qo_indptr = qo_bad;
    fail |= tu_expect_status(fi_cascade_update(c, lv), FI_STATUS_INVALID_ARGUMENT,
                             "cascade level 1: qo_indptr[0]=17", "level 1 qo_indptr");
    int32_t qo_short[5] = {0, 1, 2, 3, 3};
    lv[1].qo_indptr = qo_short;
    fail |= tu_expect_status(fi_cascade_update(c, lv), FI_STATUS_INVALID_ARGUMENT,
                             "qo_indptr[4]=3 != 4", "levels cover other tokens");
    lv[1].qo_indptr = qo1;
    int32_t kv_dec[5] = {0, 2, 1, 3, 4};
    lv[1].kv_indptr = kv_dec;
    fail |= tu_expect_status(fi_cascade_update(c, lv), FI_STATUS_INVALID_ARGUMENT,
                             "kv_indptr[1]=2 > kv_indptr[2]=1", "decreasing kv_indptr");
    lv[1].kv_indptr = kv1;
    int32_t last_bad[4] = {1, 2, 9, 4};
    lv[1].kv_last_page_len = last_bad;
    fail |= tu_expect_status(fi_cascade_update(c, lv), FI_STATUS_INVALID_ARGUMENT,
                             "kv_last_page_len[2]=9", "last page len");
    lv[1].kv_last_page_len = last1;
    int32_t kv_big[5] = {0, 1, 2, 3, 9};
    int32_t idx_big[9] = {0};
    lv[1].kv_indptr = kv_big;
    lv[1].kv_indices = idx_big;
    fail |= tu_expect_status(fi_cascade_update(c, lv), FI_STATUS_BOUND_EXCEEDED, "max_total_kv=8",
                             "level page bound");
    lv[1].kv_indptr = kv1;
    int32_t idx_oob[4] = {2, 3, 1000, 5};
    lv[1].kv_indices = idx_oob;
    fail |= tu_expect_status(fi_cascade_update(c, lv), FI_OK, NULL, "update with a far page");
    tu_buf_poison(&out.o);
    fail |= tu_expect_status(fi_cascade_run(c, &a), FI_STATUS_INVALID_ARGUMENT, "cascade level 1",
                             "page past the pool");
    if (!strstr(fi_last_error(), "1001")) {
        tu_note("page past the pool: message \"%s\" does not name page 1000", fi_last_error());
        fail = 1;
    }
    const uint8_t *ob = out.o.t.data;
    for (size_t i = 0; i < out.o.bytes; i++)
        if (ob[i] != 0xFF) {
            tu_note("a failed run wrote O");
            fail = 1;
            break;
        }
    int32_t idx_neg[4] = {2, -5, 4, 5};
    lv[1].kv_indices = idx_neg;
    fi_cascade_update(c, lv);
    fail |= tu_expect_status(fi_cascade_run(c, &a), FI_STATUS_INVALID_ARGUMENT, "kv_indices[1]=-5",
                             "negative page");
    lv[1].kv_indices = idx1;
    fail |= tu_expect_status(fi_cascade_update_batch(c, &lv[1]), FI_STATUS_INVALID_ARGUMENT,
                             "fi_cascade_update", "update_batch on explicit levels");
    fail |= tu_expect_status(fi_cascade_update(c, lv), FI_OK, NULL, "good update");
    a.o.shape[0] = 3;
    fail |= tu_expect_status(fi_cascade_run(c, &a), FI_STATUS_INVALID_ARGUMENT, "o.shape[0]=3",
                             "small o");
    a.o = out.o.t;
    a.lse.shape[1] = 3;
    fail |= tu_expect_status(fi_cascade_run(c, &a), FI_STATUS_INVALID_ARGUMENT, "lse", "lse heads");
    a.lse = out.lse.t;
    fail |= tu_expect_status(fi_cascade_run(c, &a), FI_OK, NULL, "good run");
    fi_cascade_info info;
    fi_cascade_info_init(&info);
    fail |= tu_expect_status(fi_cascade_get_info(c, &info), FI_OK, NULL, "info");
    if (info.num_levels != 2) {
        tu_note("info.num_levels=%d", info.num_levels);
        fail = 1;
    }
    fi_cascade_destroy(c);
    fi_cascade_destroy(NULL);
    /* automatic cascades */
    fail |= tu_expect_status(fi_cascade_create_auto(be->ctx, &params, NULL, NULL, &c),
                             FI_STATUS_INVALID_ARGUMENT, "config is NULL", "auto NULL config");
    fi_cascade_options_init(&opt);
    opt.prefix_detection = (fi_prefix_detection)7;
    fail |= tu_expect_status(fi_cascade_create_auto(be->ctx, &params, &cfg[1], &opt, &c),
                             FI_STATUS_INVALID_ARGUMENT, "prefix_detection=7", "bad mode");
    if (!fi_cascade_create_auto(be->ctx, &params, &cfg[1], NULL, &c)) {
        fail |= tu_expect_status(fi_cascade_update(c, lv), FI_STATUS_INVALID_ARGUMENT,
                                 "fi_cascade_update_batch", "update on auto");
        lv[1].qo_indptr = qo_bad;
        fail |= tu_expect_status(fi_cascade_update_batch(c, &lv[1]), FI_STATUS_INVALID_ARGUMENT,
                                 "qo_indptr[0]=17", "auto bad indptr");
        fail |= tu_expect_status(fi_cascade_run(c, &a), FI_STATUS_NOT_PLANNED, NULL,
                                 "auto run after failed update");
        lv[1].qo_indptr = qo1;
        fi_cascade_destroy(c);
    } else {
        tu_note("auto create: %s", fi_last_error());
        fail = 1;
    }
    tu_record("bad_input", name, fail ? TU_FAIL : TU_PASS);
    tu_buf_free(&k);
    tu_buf_free(&v);
    tu_buf_free(&q);
    outputs_free(&out);
}

int main(int argc, char **argv) {
    if (tu_parse_args(argc, argv, "fi_cascade_* against the fp64 oracle")) return 2;
    for (int i = 0; i < TU_NUM_CPU_BACKENDS; i++) tu_cpu_backend_open(&backends[i], i, 3);
    tu_cuda_backend_open(&backends[TU_CUDA_INDEX]);
    for (int i = 0; i <= TU_CUDA_INDEX; i++) {
        if (!backends[i].ctx) continue;
        level_cases(&backends[i]);
        detect_cases(&backends[i]);
        /* the core's validation, the same on every backend: CPU only */
        if (!tu_is_cuda(&backends[i])) bad_input_cases(&backends[i]);
    }
    for (int i = 0; i <= TU_CUDA_INDEX; i++) fi_context_destroy(backends[i].ctx);
    return tu_summary("test_cascade");
}
