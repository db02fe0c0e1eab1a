/*
 * test_bsr.c — fi_bsr_* (block-sparse attention) against the fp64 oracle
 * run with the equivalent dense custom mask: one request of M queries over
 * N ragged keys whose [M, N] bit matrix is the block pattern (and element
 * mask) spelled out.
 *
 * Categories of the summary:
 *   fixed      R x C in {1x1, 4x1 (vector-sparse), 16x16, 3x5, 64x16, 7x32}
 *              with M, N not multiples of R, C (partial last blocks) x
 *              densities 0 / 10% / 50% / 100% x element mask on/off x dtypes
 *              x GQA
 *   variable   per-KV-head block sizes (rows and columns differ by head,
 *              zero-size blocks, granularity 1 and 4) x densities; the
 *              oracle runs per KV head on head-sliced views
 *   bad_input  indices out of range / not increasing, bad indptr, sizes
 *              that do not sum, granularity, bounds, misuse: named messages
 *
 * K/V end at a guard page (a read past key N faults), O/LSE are poisoned
 * before each run, NaN never passes.
 */
#include "flashinfer.h"
#include "device.h"
#include "oracle.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the CPU SIMD levels, then CUDA (device.h) */
static tu_cpu_backend backends[TU_NUM_CPU_BACKENDS + 1];

static void set_bit(uint8_t *bits, int64_t i) { bits[i / 8] |= (uint8_t)(1u << (i % 8)); }

/* Host buffers and what the library reads and writes (device copies on
 * CUDA; the buffers themselves on the CPU). */
typedef struct tensors {
    tu_buf q, k, v, o, lse;
    tu_mirror mq, mk, mv, mo, ml;
    const tu_cpu_backend *be;
} tensors;

static int tensors_alloc(tensors *t, const tu_cpu_backend *be, tu_rng *rng, int32_t M,
                         int32_t N, int32_t hq, int32_t hk, int32_t d, fi_dtype dt) {
    memset(t, 0, sizeof *t);
    t->be = be;
    int64_t qs[3] = {M, hq, d}, ks[3] = {N, hk, d}, ls[2] = {M, hq};
    if (tu_buf_alloc(&t->q, dt, 3, qs) || tu_buf_alloc(&t->k, dt, 3, ks) ||
        tu_buf_alloc(&t->v, dt, 3, ks) || tu_buf_alloc(&t->o, dt, 3, qs) ||
        tu_buf_alloc(&t->lse, FI_DTYPE_F32, 2, ls))
        return -1;
    tu_fill_uniform(rng, &t->q.t, -2, 2, 0);
    tu_fill_uniform(rng, &t->k.t, -2, 2, 0);
    tu_fill_uniform(rng, &t->v.t, -1, 1, 0);
    tu_buf_poison(&t->o);
    tu_buf_poison(&t->lse);
    return tu_mirror_up(be, &t->q, &t->mq) || tu_mirror_up(be, &t->k, &t->mk) ||
           tu_mirror_up(be, &t->v, &t->mv) || tu_mirror_up(be, &t->o, &t->mo) ||
           tu_mirror_up(be, &t->lse, &t->ml);
}

/* O and LSE as the run left them, back on the host. */
static int tensors_fetch(tensors *t) {
    return tu_mirror_down(t->be, &t->mo, &t->o) || tu_mirror_down(t->be, &t->ml, &t->lse);
}

static void tensors_free(tensors *t) {
    tu_mirror_free(&t->mq);
    tu_mirror_free(&t->mk);
    tu_mirror_free(&t->mv);
    tu_mirror_free(&t->mo);
    tu_mirror_free(&t->ml);
    tu_buf_free(&t->q);
    tu_buf_free(&t->k);
    tu_buf_free(&t->v);
    tu_buf_free(&t->o);
    tu_buf_free(&t->lse);
}

static fi_run_args args_of(const tensors *t) {
    fi_run_args a;
    memset(&a, 0, sizeof a);
    a.q = t->mq.t;
    a.k = t->mk.t;
    a.v = t->mv.t;
    a.o = t->mo.t;
    a.lse = t->ml.t;
    return a;
}

/* Oracle of one request, [M, N] custom mask `bits`, over heads
 * [h0, h0 + hq) reading KV heads [k0, k0 + hk), into o/lse (full-width rows
 * of H_qo heads). */
static int oracle_dense(const fi_attention_params *base, const tensors *t, int32_t M, int32_t N,
                        const uint8_t *bits, int32_t h0, int32_t hq, int32_t k0, int32_t hk,
                        int32_t H, double *o, double *lse) {
    fi_attention_params p = *base;
    p.num_qo_heads = hq;
    p.num_kv_heads = hk;
    p.kv_format = FI_KV_FORMAT_RAGGED;
    p.kv_layout = FI_KV_LAYOUT_NHD;
    p.mask_mode = FI_MASK_CUSTOM;
    int32_t qo[2] = {0, M}, kv[2] = {0, N};
    fi_batch b = {1, qo, kv, NULL, NULL, NULL};
    fi_tensor q = t->q.t, k = t->k.t, v = t->v.t;
    size_t es = tu_dtype_size(q.dtype);
    q.shape[1] = hq;
    q.data = (char *)q.data + (size_t)h0 * (size_t)q.stride[1] * es;
    k.shape[1] = v.shape[1] = hk;
    k.data = (char *)k.data + (size_t)k0 * (size_t)k.stride[1] * es;
    v.data = (char *)v.data + (size_t)k0 * (size_t)v.stride[1] * es;
    int32_t D = base->head_dim_vo;
    double *os = malloc(((size_t)M * hq * D + 1) * sizeof(double));
    double *ls = malloc(((size_t)M * hq + 1) * sizeof(double));
    int r = oracle_attention(&p, &b, &q, &k, &v, bits, os, ls);
    for (int64_t i = 0; i < M; i++)
        for (int32_t h = 0; h < hq; h++) {
            lse[i * H + h0 + h] = ls[i * hq + h];
            for (int32_t x = 0; x < D; x++)
                o[(i * H + h0 + h) * D + x] = os[(i * hq + h) * D + x];
        }
    free(os);
    free(ls);
    return r;
}

static int compare(const tensors *t, const double *o, const double *lse, int64_t M, int32_t H,
                   int32_t D, double tol) {
    int64_t n = M * H * D;
    double *got = malloc((size_t)(n + 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) got[i] = tu_load(t->o.t.data, t->o.t.dtype, i);
    tu_cmp c;
    int bad = 0;
    if (tu_compare(got, o, n, tol, tol, &c)) {
        tu_note("O: %lld of %lld out of tolerance %g, %lld NaN; worst [%lld] got %g want %g",
                (long long)c.bad, (long long)n, tol, (long long)c.nan, (long long)c.worst,
                c.worst_got, c.worst_ref);
        bad = 1;
    }
    for (int64_t i = 0; i < M * H; i++) got[i] = ((const float *)t->lse.t.data)[i];
    if (tu_compare(got, lse, M * H, 2e-5, 2e-5, &c)) {
        tu_note("LSE: %lld of %lld out of tolerance; worst [%lld] got %g want %g",
                (long long)c.bad, (long long)(M * H), (long long)c.worst, c.worst_got,
                c.worst_ref);
        bad = 1;
    }
    free(got);
    return bad;
}

static fi_attention_params make_params(int32_t hq, int32_t hk, int32_t d, fi_dtype dt) {
    fi_attention_params p;
    fi_attention_params_init(&p);
    p.num_qo_heads = hq;
    p.num_kv_heads = hk;
    p.head_dim_qk = p.head_dim_vo = d;
    p.q_dtype = p.kv_dtype = p.o_dtype = dt;
    return p;
}

/* ================================================================ fixed */

typedef struct fcase {
    int32_t R, C, M, N, hq, hk, d;
    double density;
    int32_t element_mask;
    fi_dtype dt;
} fcase;

static void run_fixed(tu_cpu_backend *be, const fcase *c, const char *name) {
    uint64_t seed = tu_case_seed(name);
    tu_crash_context(name, seed);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    int32_t R = c->R, C = c->C, M = c->M, N = c->N;
    int32_t MB = (M + R - 1) / R, NB = (N + C - 1) / C;
    int32_t *indptr = calloc((size_t)MB + 1, sizeof(int32_t));
    int32_t *indices = malloc(((size_t)MB * NB + 1) * sizeof(int32_t));
    for (int32_t r = 0; r < MB; r++) {
        int32_t n = indptr[r];
        for (int32_t j = 0; j < NB; j++)
            if (tu_rng_uniform(&rng) < c->density) indices[n++] = j;
        indptr[r + 1] = n;
    }
    int32_t nnz = indptr[MB];
    uint8_t *bmask = c->element_mask ? malloc((size_t)nnz * R * C + 1) : NULL;
    for (int64_t i = 0; bmask && i < (int64_t)nnz * R * C; i++)
        bmask[i] = tu_rng_uniform(&rng) < 0.7;
    /* the equivalent dense mask */
    uint8_t *dense = calloc((size_t)((int64_t)M * N + 7) / 8 + 1, 1);
    for (int32_t r = 0; r < MB; r++)
        for (int32_t j = indptr[r]; j < indptr[r + 1]; j++)
            for (int32_t i = 0; i < R && r * R + i < M; i++)
                for (int32_t x = 0; x < C && indices[j] * C + x < N; x++)
                    if (!bmask || bmask[((int64_t)j * R + i) * C + x])
                        set_bit(dense, (int64_t)(r * R + i) * N + indices[j] * C + x);
    tensors t;
    int fail = tensors_alloc(&t, be, &rng, M, N, c->hq, c->hk, c->d, c->dt);
    fi_attention_params p = make_params(c->hq, c->hk, c->d, c->dt);
    int64_t rows = (int64_t)M * c->hq;
    double *o = malloc((size_t)(rows * c->d + 1) * sizeof(double));
    double *lse = malloc((size_t)(rows + 1) * sizeof(double));
    fail |= oracle_dense(&p, &t, M, N, dense, 0, c->hq, 0, c->hk, c->hq, o, lse);
    fi_bsr_config cfg;
    fi_bsr_config_init(&cfg);
    cfg.block_rows = R;
    cfg.block_cols = C;
    cfg.max_qo_len = M;
    cfg.max_kv_len = N;
    cfg.max_nnz = nnz > 0 ? nnz : 1;
    cfg.element_mask = c->element_mask;
    fi_bsr *bsr = NULL;
    fi_status st = fail ? FI_STATUS_INTERNAL : fi_bsr_create(be->ctx, &p, &cfg, &bsr);
    if (!st) st = fi_bsr_update(bsr, M, N, indptr, indices, bmask);
    fi_run_args a = args_of(&t);
    if (!st) st = fi_bsr_run(bsr, &a);
    fail |= tensors_fetch(&t);
    if (st) {
        tu_note("%s: %s", fi_status_string(st), fi_last_error());
        fail = 1;
    } else {
        fail |= compare(&t, o, lse, M, c->hq, c->d, tu_dtype_tol(c->dt));
    }
    tu_record("fixed", name, fail ? TU_FAIL : TU_PASS);
    fi_bsr_destroy(bsr);
    tensors_free(&t);
    free(o);
    free(lse);
    free(dense);
    free(bmask);
    free(indptr);
    free(indices);
    tu_crash_context(NULL, 0);
}

static void fixed_cases(tu_cpu_backend *be) {
    static const int32_t blocks[][4] = {{1, 1, 37, 53},   {4, 1, 45, 77},   {16, 16, 70, 200},
                                        {3, 5, 31, 64},   {64, 16, 130, 96}, {7, 32, 50, 300}};
    static const double dens[] = {0.0, 0.1, 0.5, 1.0};
    static const fi_dtype dts[] = {FI_DTYPE_F32, FI_DTYPE_F16, FI_DTYPE_BF16};
    static const int32_t heads[][2] = {{4, 4}, {8, 2}};
    int count = 0;
    for (int bi = 0; bi < 6; bi++)
        for (int di = 0; di < 4; di++)
            for (int em = 0; em < 2; em++)
                for (int ti = 0; ti < 3; ti++)
                    for (int hi = 0; hi < 2; hi++) {
                        int k = count++;
                        /* one SIMD level each, --quick 1 in 4; CUDA: every
                         * other one (--quick: 1 in 8) */
                        if (tu_is_cuda(be) ? k % (tu_opt.quick ? 8 : 2) != 0
                                           : k % TU_NUM_CPU_BACKENDS != be->index ||
                                                 (tu_opt.quick && (k / TU_NUM_CPU_BACKENDS) % 4))
                            continue;
                        fcase c = {blocks[bi][0], blocks[bi][1], blocks[bi][2], blocks[bi][3],
                                   heads[hi][0], heads[hi][1], (bi + ti) % 2 ? 128 : 64,
                                   dens[di], em, dts[ti]};
                        char name[200];
                        snprintf(name, sizeof name, "%s/fixed/R%dC%d/M%dN%d/dens%d/%s/%s/d%d/h%d:%d",
                                 be->name, (int)c.R, (int)c.C, (int)c.M, (int)c.N,
                                 (int)(c.density * 100), em ? "elem-mask" : "full-blocks",
                                 tu_dtype_name(c.dt), (int)c.d, (int)c.hq, (int)c.hk);
                        if (!tu_begin_case(name)) continue;
                        run_fixed(be, &c, name);
                    }
}

/* ============================================================= variable */

typedef struct vcase {
    int32_t M, N, hq, hk, d, MB, NB, gran;
    double density;
    fi_dtype dt;
} vcase;

/* n sizes summing to total, multiples of g (total a multiple of g), zeros allowed. */
static void random_sizes(tu_rng *rng, int32_t *sz, int32_t n, int32_t total, int32_t g) {
    int32_t units = total / g;
    for (int32_t i = 0; i < n; i++) sz[i] = 0;
    for (int32_t u = 0; u < units; u++) sz[tu_rng_int(rng, 0, n - 1)] += g;
}

static void run_variable(tu_cpu_backend *be, const vcase *c, const char *name) {
    uint64_t seed = tu_case_seed(name);
    tu_crash_context(name, seed);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    int32_t M = c->M, N = c->N, MB = c->MB, NB = c->NB, hk = c->hk, g = c->hq / c->hk;
    int32_t *rs = malloc((size_t)hk * MB * sizeof(int32_t));
    int32_t *cs = malloc((size_t)hk * NB * sizeof(int32_t));
    uint8_t *map = malloc((size_t)hk * MB * NB);
    for (int32_t h = 0; h < hk; h++) {
        random_sizes(&rng, rs + h * MB, MB, M, 1);
        random_sizes(&rng, cs + h * NB, NB, N, c->gran);
    }
    for (int64_t i = 0; i < (int64_t)hk * MB * NB; i++) map[i] = tu_rng_uniform(&rng) < c->density;
    tensors t;
    int fail = tensors_alloc(&t, be, &rng, M, N, c->hq, hk, c->d, c->dt);
    fi_attention_params p = make_params(c->hq, hk, c->d, c->dt);
    int64_t rows = (int64_t)M * c->hq;
    double *o = malloc((size_t)(rows * c->d + 1) * sizeof(double));
    double *lse = malloc((size_t)(rows + 1) * sizeof(double));
    uint8_t *dense = malloc((size_t)((int64_t)M * N + 7) / 8 + 1);
    for (int32_t h = 0; h < hk; h++) {
        memset(dense, 0, (size_t)((int64_t)M * N + 7) / 8 + 1);
        int32_t r0 = 0;
        for (int32_t r = 0; r < MB; r++) {
            int32_t c0 = 0;
            for (int32_t j = 0; j < NB; j++) {
                if (map[((int64_t)h * MB + r) * NB + j])
                    for (int32_t i = r0; i < r0 + rs[h * MB + r]; i++)
                        for (int32_t x = c0; x < c0 + cs[h * NB + j]; x++)
                            set_bit(dense, (int64_t)i * N + x);
                c0 += cs[h * NB + j];
            }
            r0 += rs[h * MB + r];
        }
        fail |= oracle_dense(&p, &t, M, N, dense, h * g, g, h, 1, c->hq, o, lse);
    }
    fi_bsr_config cfg;
    fi_bsr_config_init(&cfg);
    cfg.variable_blocks = 1;
    cfg.max_qo_len = M;
    cfg.max_kv_len = N;
    cfg.max_block_rows = MB;
    cfg.col_granularity = c->gran;
    fi_bsr *bsr = NULL;
    fi_status st = fail ? FI_STATUS_INTERNAL : fi_bsr_create(be->ctx, &p, &cfg, &bsr);
    if (!st) st = fi_bsr_update_variable(bsr, M, N, MB, NB, rs, cs, map);
    fi_run_args a = args_of(&t);
    if (!st) st = fi_bsr_run(bsr, &a);
    fail |= tensors_fetch(&t);
    if (st) {
        tu_note("%s: %s", fi_status_string(st), fi_last_error());
        fail = 1;
    } else {
        fail |= compare(&t, o, lse, M, c->hq, c->d, tu_dtype_tol(c->dt));
    }
    tu_record("variable", name, fail ? TU_FAIL : TU_PASS);
    fi_bsr_destroy(bsr);
    tensors_free(&t);
    free(o);
    free(lse);
    free(dense);
    free(rs);
    free(cs);
    free(map);
    tu_crash_context(NULL, 0);
}

static void variable_cases(tu_cpu_backend *be) {
    static const int32_t shapes[][4] = {{40, 64, 5, 6}, {33, 120, 4, 9}, {64, 256, 8, 16}};
    static const double dens[] = {0.1, 0.3, 1.0};
    static const fi_dtype dts[] = {FI_DTYPE_F32, FI_DTYPE_F16, FI_DTYPE_BF16};
    static const int32_t heads[][2] = {{4, 4}, {8, 2}, {4, 1}};
    int count = 0;
    for (int si = 0; si < 3; si++)
        for (int di = 0; di < 3; di++)
            for (int gi = 0; gi < 2; gi++)
                for (int ti = 0; ti < 3; ti++)
                    for (int hi = 0; hi < 3; hi++) {
                        int k = count++;
                        /* one SIMD level each, --quick 1 in 4; CUDA: every
                         * other one (--quick: 1 in 8) */
                        if (tu_is_cuda(be) ? k % (tu_opt.quick ? 8 : 2) != 0
                                           : k % TU_NUM_CPU_BACKENDS != be->index ||
                                                 (tu_opt.quick && (k / TU_NUM_CPU_BACKENDS) % 4))
                            continue;
                        vcase c = {shapes[si][0], shapes[si][1], heads[hi][0], heads[hi][1],
                                   (si + ti) % 2 ? 128 : 64, shapes[si][2], shapes[si][3],
                                   gi ? 4 : 1, dens[di], dts[ti]};
                        char name[200];
                        snprintf(name, sizeof name, "%s/variable/M%dN%d/MB%dNB%d/g%d/dens%d/%s/d%d/h%d:%d",
                                 be->name, (int)c.M, (int)c.N, (int)c.MB, (int)c.NB, (int)c.gran,
                                 (int)(c.density * 100), tu_dtype_name(c.dt), (int)c.d,
                                 (int)c.hq, (int)c.hk);
                        if (!tu_begin_case(name)) continue;
                        run_variable(be, &c, name);
                    }
}

/* ============================================================ bad input */

/* The caller's lse right after k in one allocation, kv_len not a multiple
 * of the block width: the inner plans' views, padded to whole blocks, reach
 * into lse, which is no overlap; the run must succeed and give what it gives
 * with the tensors apart (CPU backends: host memory). */
static void adjacent_lse(tu_cpu_backend *be) {
    char name[128];
    snprintf(name, sizeof name, "%s/fixed/lse_after_k", be->name);
    if (!tu_begin_case(name)) return;
    tu_rng rng;
    tu_rng_seed(&rng, tu_case_seed(name));
    enum { M = 20, N = 37, R = 4, C = 16, HQ = 4, HK = 2, D = 64 };
    fi_attention_params p = make_params(HQ, HK, D, FI_DTYPE_F32);
    fi_bsr_config cfg;
    fi_bsr_config_init(&cfg);
    cfg.block_rows = R, cfg.block_cols = C, cfg.max_qo_len = M, cfg.max_kv_len = N;
    int32_t indptr[M / R + 1], indices[(M / R) * 3];
    for (int r = 0; r <= M / R; r++) indptr[r] = 3 * r;
    for (int i = 0; i < (M / R) * 3; i++) indices[i] = i % 3; /* every block */
    tensors t;
    int fail = tensors_alloc(&t, be, &rng, M, N, HQ, HK, D, FI_DTYPE_F32);
    float *kl = malloc(sizeof(float) * ((size_t)N * HK * D + (size_t)M * HQ));
    fi_bsr *b = NULL;
    fi_status st = fail || !kl ? FI_STATUS_INTERNAL : fi_bsr_create(be->ctx, &p, &cfg, &b);
    if (!st) st = fi_bsr_update(b, M, N, indptr, indices, NULL);
    fi_run_args a = args_of(&t);
    if (!st) st = fi_bsr_run(b, &a); /* apart */
    if (!st) {
        memcpy(kl, t.k.t.data, sizeof(float) * N * HK * D);
        float *lse2 = kl + (size_t)N * HK * D;
        for (int i = 0; i < M * HQ; i++) lse2[i] = NAN;
        int64_t ks[3] = {N, HK, D}, ls[2] = {M, HQ};
        fi_run_args a2 = a;
        a2.k = fi_tensor_contiguous(kl, FI_DTYPE_F32, 3, ks);
        a2.lse = fi_tensor_contiguous(lse2, FI_DTYPE_F32, 2, ls);
        st = fi_bsr_run(b, &a2);
        const float *lse1 = t.lse.t.data;
        for (int i = 0; !st && i < M * HQ; i++) fail |= lse1[i] != lse2[i];
    }
    if (st) tu_note("%s: %s", fi_status_string(st), fi_last_error());
    tu_record("fixed", name, st || fail ? TU_FAIL : TU_PASS);
    fi_bsr_destroy(b);
    tensors_free(&t);
    free(kl);
}

static void bad_input(tu_cpu_backend *be) {
    char name[128];
    snprintf(name, sizeof name, "%s/bad_input/bsr", be->name);
    if (!tu_begin_case(name)) return;
    tu_rng rng;
    tu_rng_seed(&rng, tu_case_seed(name));
    int fail = 0;
    fi_attention_params p = make_params(4, 2, 64, FI_DTYPE_F32);
    fi_bsr_config cfg;
    fi_bsr_config_init(&cfg);
    cfg.block_rows = 4;
    cfg.block_cols = 8;
    cfg.max_qo_len = 16;
    cfg.max_kv_len = 32;
    fi_bsr *b = NULL;
    fi_bsr_config bad = cfg;
    bad.block_cols = 0;
    fail |= tu_expect_status(fi_bsr_create(be->ctx, &p, &bad, &b), FI_STATUS_INVALID_ARGUMENT,
                             "block_cols=0", "C = 0");
    bad = cfg;
    bad.struct_size = 5;
    fail |= tu_expect_status(fi_bsr_create(be->ctx, &p, &bad, &b), FI_STATUS_INVALID_ARGUMENT,
                             "struct_size=5", "config size");
    fi_attention_params causal = p;
    causal.mask_mode = FI_MASK_CAUSAL;
    fail |= tu_expect_status(fi_bsr_create(be->ctx, &causal, &cfg, &b), FI_STATUS_UNSUPPORTED,
                             "mask_mode=1", "causal");
    fi_attention_params rope = p;
    rope.pos_encoding = FI_POS_ROPE_LLAMA;
    fail |= tu_expect_status(fi_bsr_create(be->ctx, &rope, &cfg, &b), FI_STATUS_UNSUPPORTED,
                             "pos_encoding=1", "rope");
    fi_attention_params heads = p;
    heads.num_qo_heads = 5;
    fail |= tu_expect_status(fi_bsr_create(be->ctx, &heads, &cfg, &b), FI_STATUS_INVALID_ARGUMENT,
                             "5", "heads");
    if (fi_bsr_create(be->ctx, &p, &cfg, &b)) {
        tu_note("create: %s", fi_last_error());
        tu_record("bad_input", name, TU_FAIL);
        return;
    }
    tensors t;
    tensors_alloc(&t, be, &rng, 16, 32, 4, 2, 64, FI_DTYPE_F32);
    fi_run_args a = args_of(&t);
    fail |=
        tu_expect_status(fi_bsr_run(b, &a), FI_STATUS_NOT_PLANNED, "fi_bsr_update", "run first");
    int32_t indptr[5] = {0, 1, 2, 3, 4}, indices[4] = {0, 1, 2, 3};
    int32_t ip_bad[5] = {17, 1, 2, 3, 4};
    fail |= tu_expect_status(fi_bsr_update(b, 16, 32, ip_bad, indices, NULL),
                             FI_STATUS_INVALID_ARGUMENT, "indptr[0]=17", "indptr start");
    int32_t ip_dec[5] = {0, 2, 1, 3, 4};
    fail |= tu_expect_status(fi_bsr_update(b, 16, 32, ip_dec, indices, NULL),
                             FI_STATUS_INVALID_ARGUMENT, "indptr[1]=2 > bsr indptr[2]=1",
                             "indptr decreasing");
    int32_t idx_oob[4] = {0, 1, 99, 3};
    fail |= tu_expect_status(fi_bsr_update(b, 16, 32, indptr, idx_oob, NULL),
                             FI_STATUS_INVALID_ARGUMENT, "indices[2]=99", "index out of range");
    int32_t idx_neg[4] = {0, -4, 2, 3};
    fail |= tu_expect_status(fi_bsr_update(b, 16, 32, indptr, idx_neg, NULL),
                             FI_STATUS_INVALID_ARGUMENT, "indices[1]=-4", "negative index");
    int32_t ip2[5] = {0, 2, 2, 2, 2}, idx_rev[2] = {3, 1};
    fail |= tu_expect_status(fi_bsr_update(b, 16, 32, ip2, idx_rev, NULL),
                             FI_STATUS_INVALID_ARGUMENT, "indices[1]=1 after 3", "not increasing");
    fail |= tu_expect_status(fi_bsr_update(b, 17, 32, indptr, indices, NULL),
                             FI_STATUS_BOUND_EXCEEDED, "qo_len=17", "M bound");
    fail |= tu_expect_status(fi_bsr_update(b, 16, 33, indptr, indices, NULL),
                             FI_STATUS_BOUND_EXCEEDED, "kv_len=33", "N bound");
    uint8_t m[4 * 4 * 8] = {0};
    fail |=
        tu_expect_status(fi_bsr_update(b, 16, 32, indptr, indices, m), FI_STATUS_INVALID_ARGUMENT,
                         "element_mask is 0", "mask without element_mask");
    fail |= tu_expect_status(fi_bsr_update_variable(b, 16, 32, 1, 1, indptr, indptr, m),
                             FI_STATUS_INVALID_ARGUMENT, "fixed blocks", "variable on fixed");
    fail |= tu_expect_status(fi_bsr_update(b, 16, 32, indptr, indices, NULL), FI_OK, NULL,
                             "good update");
    a.k.shape[0] = 31;
    fail |=
        tu_expect_status(fi_bsr_run(b, &a), FI_STATUS_INVALID_ARGUMENT, "k.shape[0]=31", "short k");
    a = args_of(&t);
    a.q.shape[1] = 3;
    fail |= tu_expect_status(fi_bsr_run(b, &a), FI_STATUS_INVALID_ARGUMENT, "q", "q heads");
    a = args_of(&t);
    fail |= tu_expect_status(fi_bsr_run(b, &a), FI_OK, NULL, "good run");
    fi_bsr_destroy(b);
    fi_bsr_destroy(NULL);
    /* variable */
    fi_bsr_config vc;
    fi_bsr_config_init(&vc);
    vc.variable_blocks = 1;
    vc.max_qo_len = 16;
    vc.max_kv_len = 32;
    vc.max_block_rows = 4;
    vc.col_granularity = 4;
    if (!fi_bsr_create(be->ctx, &p, &vc, &b)) {
        int32_t rs[2][2] = {{8, 8}, {10, 6}}, cs[2][2] = {{16, 16}, {12, 20}};
        uint8_t map[2][2][2] = {{{1, 0}, {1, 1}}, {{0, 1}, {1, 0}}};
        int32_t rs_bad[2][2] = {{8, 8}, {10, 7}};
        fail |= tu_expect_status(
            fi_bsr_update_variable(b, 16, 32, 2, 2, &rs_bad[0][0], &cs[0][0], &map[0][0][0]),
            FI_STATUS_INVALID_ARGUMENT, "block_row_sz[1] sums to 17", "row sums");
        int32_t cs_bad[2][2] = {{16, 16}, {13, 19}};
        fail |= tu_expect_status(
            fi_bsr_update_variable(b, 16, 32, 2, 2, &rs[0][0], &cs_bad[0][0], &map[0][0][0]),
            FI_STATUS_INVALID_ARGUMENT, "block_col_sz[1][0]=13", "granularity");
        fail |= tu_expect_status(
            fi_bsr_update_variable(b, 16, 32, 5, 2, &rs[0][0], &cs[0][0], &map[0][0][0]),
            FI_STATUS_BOUND_EXCEEDED, "num_block_rows=5", "block rows bound");
        fail |=
            tu_expect_status(fi_bsr_update(b, 16, 32, indptr, indices, NULL),
                             FI_STATUS_INVALID_ARGUMENT, "variable blocks", "fixed on variable");
        fail |= tu_expect_status(
            fi_bsr_update_variable(b, 16, 32, 2, 2, &rs[0][0], &cs[0][0], &map[0][0][0]), FI_OK,
            NULL, "good variable update");
        tu_buf_poison(&t.o);
        a = args_of(&t);
        fail |= tu_expect_status(fi_bsr_run(b, &a), FI_OK, NULL, "good variable run");
        fi_bsr_destroy(b);
    } else {
        tu_note("variable create: %s", fi_last_error());
        fail = 1;
    }
    vc.col_granularity = 0;
    fail |= tu_expect_status(fi_bsr_create(be->ctx, &p, &vc, &b), FI_STATUS_INVALID_ARGUMENT,
                             "col_granularity=0", "granularity 0");
    tensors_free(&t);
    tu_record("bad_input", name, fail ? TU_FAIL : TU_PASS);
}

int main(int argc, char **argv) {
    if (tu_parse_args(argc, argv, "fi_bsr_* against the fp64 oracle (dense custom mask)")) return 2;
    for (int i = 0; i <= TU_CUDA_INDEX; i++) {
        if (i < TU_CUDA_INDEX ? tu_cpu_backend_open(&backends[i], i, 3)
                              : tu_cuda_backend_open(&backends[i]))
            continue;
        fixed_cases(&backends[i]);
        variable_cases(&backends[i]);
        /* the core's validation, the same on every backend: CPU only */
        if (i < TU_CUDA_INDEX) bad_input(&backends[i]);
        if (i < TU_CUDA_INDEX) adjacent_lse(&backends[i]);
    }
    for (int i = 0; i <= TU_CUDA_INDEX; i++) fi_context_destroy(backends[i].ctx);
    return tu_summary("test_bsr");
}
