/*
 * bench_cascade.c — composable formats on the CPU (docs/CASCADE.md).
 *
 *   build/bench_cascade [--reps N] [--quick]
 *
 * 1. the cascade workload (docs/BENCHMARKS.md) scaled to the CPU: decode, a shared prefix
 *    of {1024, 8192} tokens x batch {16, 64}, a unique 128-token suffix per
 *    request, 32/32 heads, D 128, page 16, f16. Times one step of
 *      single    one plan over the plain batch (each request reads the prefix)
 *      cascade   fi_cascade_create with 2 explicit levels (prefix read once by
 *                a query tile of all the batch's tokens, suffixes, merge)
 *      auto      fi_cascade_create_auto on the plain batch (detection AUTO)
 *    and prints the auto cascade's decision.
 * 2. Block-sparse: M = 512 queries, N = 4096 keys, 64 x 64 blocks, 32/32
 *    heads, D 128, f16, at 10%, 30%, 100% of the blocks.
 * Medians of N runs after one warm-up (default 5).
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { H = 32, D = 128, PS = 16, SUFFIX = 128 };

static uint64_t seed_state = 12345;
static uint64_t next_rand(void) {
    uint64_t z = (seed_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill_f16(uint16_t *p, size_t n) {
    /* random halves in about [-1, 1]: sign, exponent 14..15 region, mantissa */
    for (size_t i = 0; i < n; i++) {
        uint64_t r = next_rand();
        p[i] = (uint16_t)(((r & 1) << 15) | ((13 + (r >> 1) % 2) << 10) | ((r >> 8) & 0x3FF));
    }
}

static fi_tensor t4(void *d, int64_t a, int64_t b, int64_t c, int64_t e) {
    int64_t s[4] = {a, b, c, e};
    return fi_tensor_contiguous(d, FI_DTYPE_F16, 4, s);
}
static fi_tensor t3(void *d, fi_dtype dt, int64_t a, int64_t b, int64_t c) {
    int64_t s[3] = {a, b, c};
    return fi_tensor_contiguous(d, dt, 3, s);
}

static int reps = 5;

#define CHECK(x)                                                                       \
    do {                                                                               \
        fi_status st_ = (x);                                                           \
        if (st_) {                                                                     \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, fi_last_error()); \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

typedef fi_status (*run_fn)(void *obj, const fi_run_args *a);
static fi_status run_plan(void *o, const fi_run_args *a) { return fi_plan_run(o, a); }
static fi_status run_cascade(void *o, const fi_run_args *a) { return fi_cascade_run(o, a); }
static fi_status run_bsr(void *o, const fi_run_args *a) { return fi_bsr_run(o, a); }

static double time_it(run_fn f, void *obj, const fi_run_args *a) {
    double t[64];
    CHECK(f(obj, a));
    int n = reps < 64 ? reps : 64;
    for (int i = 0; i < n; i++) {
        double t0 = bench_now();
        CHECK(f(obj, a));
        t[i] = bench_now() - t0;
    }
    return bench_median(t, n);
}

static void cascade_cell(fi_context *ctx, int32_t prefix, int32_t B) {
    int32_t pp = prefix / PS, sp = SUFFIX / PS, pages = pp + B * sp;
    size_t page_elems = (size_t)PS * H * D;
    uint16_t *k = malloc((size_t)pages * page_elems * 2), *v = malloc((size_t)pages * page_elems * 2);
    uint16_t *q = malloc((size_t)B * H * D * 2), *o = malloc((size_t)B * H * D * 2);
    float *lse = malloc((size_t)B * H * 4);
    fill_f16(k, (size_t)pages * page_elems);
    fill_f16(v, (size_t)pages * page_elems);
    fill_f16(q, (size_t)B * H * D);
    /* page ids: shared prefix first, suffix pages shuffled after it */
    int32_t *perm = malloc((size_t)B * sp * sizeof(int32_t));
    for (int32_t i = 0; i < B * sp; i++) perm[i] = pp + i;
    for (int32_t i = B * sp - 1; i > 0; i--) {
        int32_t j = (int32_t)(next_rand() % (uint64_t)(i + 1)), x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    int32_t *qo = malloc((size_t)(B + 1) * 4), *kv = malloc((size_t)(B + 1) * 4);
    int32_t *idx = malloc((size_t)B * (pp + sp) * 4), *last = malloc((size_t)B * 4);
    int32_t *skv = malloc((size_t)(B + 1) * 4), *sidx = malloc((size_t)B * sp * 4);
    int32_t pqo[2] = {0, B}, pkv[2] = {0, pp}, plast[1] = {PS}, *pidx = malloc((size_t)pp * 4);
    for (int32_t j = 0; j < pp; j++) pidx[j] = j;
    qo[0] = kv[0] = skv[0] = 0;
    for (int32_t i = 0; i < B; i++) {
        qo[i + 1] = i + 1;
        for (int32_t j = 0; j < pp; j++) idx[kv[i] + j] = j;
        for (int32_t j = 0; j < sp; j++) {
            idx[kv[i] + pp + j] = perm[i * sp + j];
            sidx[skv[i] + j] = perm[i * sp + j];
        }
        kv[i + 1] = kv[i] + pp + sp;
        skv[i + 1] = skv[i] + sp;
        last[i] = PS;
    }
    fi_attention_params p;
    fi_attention_params_init(&p);
    p.num_qo_heads = p.num_kv_heads = H;
    p.head_dim_qk = p.head_dim_vo = D;
    p.page_size = PS;
    p.q_dtype = p.kv_dtype = p.o_dtype = FI_DTYPE_F16;
    fi_run_args a;
    memset(&a, 0, sizeof a);
    a.q = t3(q, FI_DTYPE_F16, B, H, D);
    a.k = t4(k, pages, PS, H, D);
    a.v = t4(v, pages, PS, H, D);
    a.o = t3(o, FI_DTYPE_F16, B, H, D);
    int64_t ls[2] = {B, H};
    a.lse = fi_tensor_contiguous(lse, FI_DTYPE_F32, 2, ls);

    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    cfg.max_batch_size = B;
    cfg.max_total_qo = B;
    cfg.max_total_kv = B * (pp + sp);
    fi_batch plain = {B, qo, kv, idx, last, NULL};
    fi_plan *plan;
    CHECK(fi_plan_create(ctx, &p, &cfg, &plan));
    CHECK(fi_plan_update(plan, &plain));
    double t_single = time_it(run_plan, plan, &a);

    fi_plan_config lc[2] = {cfg, cfg};
    fi_cascade *cas;
    CHECK(fi_cascade_create(ctx, &p, 2, lc, NULL, &cas));
    fi_batch levels[2] = {{1, pqo, pkv, pidx, plast, NULL}, {B, qo, skv, sidx, last, NULL}};
    CHECK(fi_cascade_update(cas, levels));
    double t_cascade = time_it(run_cascade, cas, &a);

    fi_cascade *aut;
    CHECK(fi_cascade_create_auto(ctx, &p, &cfg, NULL, &aut));
    double u0 = bench_now();
    CHECK(fi_cascade_update_batch(aut, &plain));
    double t_update = bench_now() - u0;
    fi_cascade_info info;
    fi_cascade_info_init(&info);
    CHECK(fi_cascade_get_info(aut, &info));
    double t_auto = time_it(run_cascade, aut, &a);
    printf("| %6d | %3d | %9.3f | %9.3f | %7.1fx | %9.3f | %-5s | %8.3f |\n", prefix, B,
           t_single * 1e3, t_cascade * 1e3, t_single / t_cascade, t_auto * 1e3,
           info.split ? "split" : "one", t_update * 1e3);
    fflush(stdout);
    fi_cascade_destroy(aut);
    fi_cascade_destroy(cas);
    fi_plan_destroy(plan);
    free(k), free(v), free(q), free(o), free(lse), free(perm), free(qo), free(kv);
    free(idx), free(last), free(skv), free(sidx), free(pidx);
}

static void bsr_cell(fi_context *ctx, double density, double *t_dense) {
    enum { M = 512, N = 4096, R = 64, C = 64 };
    int32_t MB = M / R, NB = N / C;
    uint16_t *q = malloc((size_t)M * H * D * 2), *k = malloc((size_t)N * H * D * 2);
    uint16_t *v = malloc((size_t)N * H * D * 2), *o = malloc((size_t)M * H * D * 2);
    fill_f16(q, (size_t)M * H * D);
    fill_f16(k, (size_t)N * H * D);
    fill_f16(v, (size_t)N * H * D);
    int32_t indptr[MB + 1], *indices = malloc((size_t)MB * NB * 4);
    indptr[0] = 0;
    int32_t want = (int32_t)(density * NB + 0.5);
    for (int32_t r = 0; r < MB; r++) {
        /* `want` columns of each row, spread evenly */
        int32_t n = indptr[r];
        for (int32_t j = 0; j < want; j++) indices[n++] = (int32_t)((int64_t)j * NB / want);
        indptr[r + 1] = n;
    }
    fi_attention_params p;
    fi_attention_params_init(&p);
    p.num_qo_heads = p.num_kv_heads = H;
    p.head_dim_qk = p.head_dim_vo = D;
    p.q_dtype = p.kv_dtype = p.o_dtype = FI_DTYPE_F16;
    fi_bsr_config c;
    fi_bsr_config_init(&c);
    c.block_rows = R;
    c.block_cols = C;
    c.max_qo_len = M;
    c.max_kv_len = N;
    fi_bsr *b;
    CHECK(fi_bsr_create(ctx, &p, &c, &b));
    CHECK(fi_bsr_update(b, M, N, indptr, indices, NULL));
    fi_run_args a;
    memset(&a, 0, sizeof a);
    a.q = t3(q, FI_DTYPE_F16, M, H, D);
    a.k = t3(k, FI_DTYPE_F16, N, H, D);
    a.v = t3(v, FI_DTYPE_F16, N, H, D);
    a.o = t3(o, FI_DTYPE_F16, M, H, D);
    double t = time_it(run_bsr, b, &a);
    if (density >= 1.0) *t_dense = t;
    double flops = 4.0 * H * D * (double)indptr[MB] * R * C;
    printf("| %4.0f%% | %5d | %9.3f | %7.1f |\n", density * 100, (int)indptr[MB], t * 1e3,
           flops / t * 1e-9);
    fflush(stdout);
    fi_bsr_destroy(b);
    free(q), free(k), free(v), free(o), free(indices);
}

int main(int argc, char **argv) {
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else {
            fprintf(stderr, "usage: %s [--reps N] [--quick]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    fi_context_options opt;
    fi_context_options_init(&opt);
    fi_context *ctx;
    CHECK(fi_context_create(&opt, &ctx));
    printf("%s; median of %d runs\n\n", fi_context_describe(ctx), reps);
    printf("Cascade decode: 32/32 heads, D 128, page 16, f16, unique suffix %d\n\n", SUFFIX);
    printf("| prefix | B   | single ms | cascade ms | speedup | auto ms   | auto  | plan ms  |\n");
    printf("|--------|-----|-----------|-----------|---------|-----------|-------|----------|\n");
    static const int32_t prefixes[2] = {1024, 8192}, batches[2] = {16, 64};
    for (int pi = 0; pi < 2; pi++)
        for (int bi = 0; bi < 2; bi++) {
            if (quick && (pi || bi)) continue;
            cascade_cell(ctx, prefixes[pi], batches[bi]);
        }
    printf("\nBlock-sparse: M 512, N 4096, 64x64 blocks, 32/32 heads, D 128, f16\n\n");
    printf("| density | blocks | ms        | GFLOP/s |\n|---------|--------|-----------|---------|\n");
    double dense = 0;
    static const double dens[3] = {0.1, 0.3, 1.0};
    for (int i = 0; i < 3; i++) bsr_cell(ctx, dens[i], &dense);
    fi_context_destroy(ctx);
    return 0;
}
