/*
 * bench_cuda_cascade.c — the cascade workload (docs/BENCHMARKS.md) and
 * block-sparse attention on the CUDA backend (docs/CASCADE.md "Numbers (CUDA)").
 *
 * Cascade: decode (one query per request), shared prefix P x batch B, each
 * request a unique suffix S, 32/32 heads, d 128, page 16, NHD, bf16:
 *   single   one paged plan over each request's whole table (prefix + suffix)
 *   cascade  fi_cascade_create, 2 levels: the prefix as one request holding
 *            all B queries, then the suffixes; merged
 *   auto     fi_cascade_create_auto (detection AUTO) on the single batch
 * Cells: P {1024, 8192, 32768} x B {16, 64}, S 128, and three with little
 * sharing (the planner must not lose there). Before timing, the cascade's
 * and auto's O are checked against single's (bf16 tolerance).
 *
 * Block-sparse: M = N = 4096, 128 x 64 blocks (a block row fills one
 * tensor-core query tile), 32/32 heads, d 128, bf16;
 * densities 10%, 30%, 100% (each block row keeps that share of its block
 * columns, chosen at random): time, and TFLOP/s over the visible pairs.
 *
 * Pages are random distinct pages of a pool of random values. A cell whose
 * bytes fit in L2 is replicated R times on other pages (R runs per timed
 * graph) so ~200 MB is read per replay. Timing: CUDA graph of the R runs,
 * device events, median of >= 30 replays after warm-up, per run = / R.
 *
 *   build/bench_cuda_cascade [--json FILE] [--reps N] [--no-bsr]
 */
#include "flashinfer.h"
#include "core/internal.h"
#include "../../tests/gpu/gpu_util.h"
#include "../../tests/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { H = 32, D = 128, PS = 16, POOL = 32768, MAXR = 8 };

static gu_stream stream;
static gu_event ev0, ev1;
static int reps = 30;

/* A run of something the bench times: a plan, a cascade or a bsr. */
typedef struct runner {
    fi_plan *plan;
    fi_cascade *cas;
    fi_bsr *bsr;
    fi_run_args args;
} runner;

static fi_status run_one(runner *r) {
    if (r->plan) return fi_plan_run(r->plan, &r->args);
    if (r->cas) return fi_cascade_run(r->cas, &r->args);
    return fi_bsr_run(r->bsr, &r->args);
}

/* Median microseconds of one run over n runners replayed as one graph. */
static double time_graph(runner *rs, int n) {
    for (int i = 0; i < n; i++) /* eager first: orders the stream after every upload */
        if (run_one(&rs[i])) {
            printf("run: %s\n", fi_last_error());
            return -1;
        }
    gu_graph g = NULL;
    gu_exec ex = NULL;
    if (GU(gu.BeginCapture(stream, 0))) return -1;
    for (int i = 0; i < n; i++) run_one(&rs[i]);
    if (GU(gu.EndCapture(stream, &g)) || GU(gu.GraphInstantiate(&ex, g, 0))) return -1;
    float *ms = malloc(sizeof(float) * (size_t)reps);
    double us = gu_replay_times(ex, stream, ev0, ev1, reps, ms) ? -1 : 1e3 * ms[reps / 2] / n;
    free(ms);
    gu.GraphExecDestroy(ex);
    gu.GraphDestroy(g);
    return us;
}

/* Largest |a - b| / (tol + tol |b|) over the first `rows` of each of R
 * slots of `slot` rows (H x D bf16 each) on the device; NaN counts as
 * failing (returns INFINITY). */
static double compare_bf16(gu_ptr a, gu_ptr b, int R, int slot, int rows) {
    size_t n = (size_t)R * slot * H * D;
    uint16_t *x = malloc(n * 2), *y = malloc(n * 2);
    double worst = 0, tol = 2e-2;
    if (GU(gu.CtxSynchronize()) || GU(gu.DtoH(x, a, n * 2)) || GU(gu.DtoH(y, b, n * 2))) worst = INFINITY;
    for (size_t i = 0; i < n && worst < INFINITY; i++) {
        if ((int)(i / ((size_t)H * D) % (size_t)slot) >= rows) continue;
        double u = tu_bf16_to_f32(x[i]), v = tu_bf16_to_f32(y[i]);
        double r = fabs(u - v) / (tol + tol * fabs(v));
        if (!isfinite(u) || !isfinite(v)) r = INFINITY;
        if (r > worst) worst = r;
    }
    free(x);
    free(y);
    return worst;
}

static int32_t perm[POOL], perm_at;

/* The next distinct random page of the pool (a shuffled order, wrapping). */
static int32_t next_page(void) {
    int32_t p = perm[perm_at];
    perm_at = (perm_at + 1) % POOL;
    return p;
}

typedef struct cell {
    int P, B, S;
} cell;

/* One copy of a cell: page tables for single, the two levels, q/o. */
typedef struct copy {
    int32_t qo[65], kv[65], last[64], *idx;      /* single */
    int32_t l0_qo[2], l0_kv[2], l0_last[1], *l0_idx;
    int32_t l1_kv[65], l1_last[64], *l1_idx;
    runner single, cascade, autoc;
} copy;

static void print_plan(const char *what, fi_plan *plan) {
    fi_plan_info info = {.struct_size = sizeof info};
    if (plan && !fi_plan_get_info(plan, &info))
        printf("    %-14s q_tile %3d rows, kv_chunk %5d, %4d items (%d split), %d merge rows\n",
               what, info.q_tile, info.kv_chunk, info.num_items, info.num_split_items,
               info.num_merge_rows);
}

int main(int argc, char **argv) {
    const char *json = NULL;
    int do_bsr = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-bsr")) do_bsr = 0;
    }
    if (reps < 30) reps = 30;
    fi_context *ctx = NULL;
    int open = gu_bench_context(&ctx);
    if (open) return open < 0;
    printf("%s\n", fi_context_describe(ctx));
    tu_rng rng;
    tu_rng_seed(&rng, 7);
    size_t kvbytes = (size_t)POOL * PS * H * D * 2, qbytes = (size_t)MAXR * 64 * H * D * 2;
    gu_ptr dk = 0, dv = 0, dq = 0, o_single = 0, o_cas = 0, o_auto = 0;
    if (GU(gu.MemAlloc(&dk, kvbytes)) || GU(gu.MemAlloc(&dv, kvbytes)) ||
        GU(gu.MemAlloc(&dq, qbytes)) || GU(gu.MemAlloc(&o_single, qbytes)) ||
        GU(gu.MemAlloc(&o_cas, qbytes)) || GU(gu.MemAlloc(&o_auto, qbytes)) ||
        gu_fill_random_bf16(dk, kvbytes, &rng) || gu_fill_random_bf16(dv, kvbytes, &rng) ||
        gu_fill_random_bf16(dq, qbytes, &rng))
        return 1;
    GU(gu.StreamCreate(&stream, 1));
    GU(gu.EventCreate(&ev0, 0));
    GU(gu.EventCreate(&ev1, 0));
    for (int i = 0; i < POOL; i++) perm[i] = i;
    for (int i = POOL - 1; i > 0; i--) {
        int j = tu_rng_int(&rng, 0, i), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }

    fi_attention_params p;
    fi_attention_params_init(&p);
    p.num_qo_heads = p.num_kv_heads = H, p.head_dim_qk = p.head_dim_vo = D;
    p.page_size = PS;
    p.q_dtype = p.kv_dtype = p.o_dtype = FI_DTYPE_BF16;
    int64_t ks[4] = {POOL, PS, H, D};
    fi_tensor tk = fi_tensor_contiguous((void *)(uintptr_t)dk, FI_DTYPE_BF16, 4, ks);
    fi_tensor tv = fi_tensor_contiguous((void *)(uintptr_t)dv, FI_DTYPE_BF16, 4, ks);

    FILE *jf = json ? fopen(json, "w") : NULL;
    static const cell cells[] = {{1024, 16, 128}, {1024, 64, 128}, {8192, 16, 128},
                                 {8192, 64, 128}, {32768, 16, 128}, {32768, 64, 128},
                                 /* little sharing */
                                 {16, 64, 1024}, {64, 16, 4096}, {256, 64, 4096}};
    char table[8192];
    int tl = snprintf(table, sizeof table,
                      "| prefix | batch | suffix | single us | cascade us | speedup | auto us | "
                      "auto/single | auto levels | copies |\n|---|---|---|---|---|---|---|---|---|---|\n");
    int status = 0;
    for (size_t ci = 0; ci < sizeof cells / sizeof cells[0]; ci++) {
        int P = cells[ci].P, B = cells[ci].B, S = cells[ci].S;
        int pp = P / PS, sp = S / PS;
        double unique = ((double)P + (double)B * S) * H * D * 4; /* K + V bytes, cascade */
        int R = (int)ceil(200e6 / unique);
        if (R > MAXR) R = MAXR;
        if (R < 1) R = 1;
        if ((int64_t)R * (pp + B * sp) > POOL) R = POOL / (pp + B * sp);
        copy *cp = calloc((size_t)R, sizeof *cp);
        fi_plan_config cfg;
        fi_plan_config_init(&cfg);
        cfg.max_batch_size = B, cfg.max_total_qo = B, cfg.max_total_kv = B * (pp + sp);
        fi_plan_config lc[2];
        lc[0] = lc[1] = cfg;
        lc[0].max_batch_size = 1, lc[0].max_total_kv = pp;
        lc[1].max_total_kv = B * sp;
        int bad = 0;
        fi_cascade_info ainfo;
        fi_cascade_info_init(&ainfo);
        for (int r = 0; r < R && !bad; r++) {
            copy *c = &cp[r];
            c->idx = malloc(sizeof(int32_t) * (size_t)B * (pp + sp));
            c->l0_idx = malloc(sizeof(int32_t) * (size_t)pp);
            c->l1_idx = malloc(sizeof(int32_t) * (size_t)B * sp);
            for (int j = 0; j < pp; j++) c->l0_idx[j] = next_page();
            c->qo[0] = c->kv[0] = c->l1_kv[0] = 0;
            for (int i = 0; i < B; i++) {
                for (int j = 0; j < sp; j++) c->l1_idx[i * sp + j] = next_page();
                memcpy(c->idx + c->kv[i], c->l0_idx, sizeof(int32_t) * (size_t)pp);
                memcpy(c->idx + c->kv[i] + pp, c->l1_idx + i * sp, sizeof(int32_t) * (size_t)sp);
                c->qo[i + 1] = i + 1;
                c->kv[i + 1] = c->kv[i] + pp + sp;
                c->l1_kv[i + 1] = (i + 1) * sp;
                c->last[i] = c->l1_last[i] = PS;
            }
            c->l0_qo[0] = 0, c->l0_qo[1] = B, c->l0_kv[0] = 0, c->l0_kv[1] = pp;
            c->l0_last[0] = PS;
            fi_batch single = {B, c->qo, c->kv, c->idx, c->last, NULL};
            fi_batch levels[2] = {{1, c->l0_qo, c->l0_kv, c->l0_idx, c->l0_last, NULL},
                                  {B, c->qo, c->l1_kv, c->l1_idx, c->l1_last, NULL}};
            fi_cascade_options co;
            fi_cascade_options_init(&co);
            bad = fi_plan_create(ctx, &p, &cfg, &c->single.plan) ||
                  fi_plan_update(c->single.plan, &single) ||
                  fi_cascade_create(ctx, &p, 2, lc, &co, &c->cascade.cas) ||
                  fi_cascade_update(c->cascade.cas, levels) ||
                  fi_cascade_create_auto(ctx, &p, &cfg, &co, &c->autoc.cas) ||
                  fi_cascade_update_batch(c->autoc.cas, &single);
            if (bad) break;
            if (r == 0) fi_cascade_get_info(c->autoc.cas, &ainfo);
            int64_t qs[3] = {B, H, D};
            size_t qoff = (size_t)r * 64 * H * D * 2;
            runner *rs[3] = {&c->single, &c->cascade, &c->autoc};
            gu_ptr outs[3] = {o_single, o_cas, o_auto};
            for (int k = 0; k < 3; k++) {
                fi_run_args *a = &rs[k]->args;
                memset(a, 0, sizeof *a);
                a->q = fi_tensor_contiguous((void *)(uintptr_t)(dq + qoff), FI_DTYPE_BF16, 3, qs);
                a->o = fi_tensor_contiguous((void *)(uintptr_t)(outs[k] + qoff), FI_DTYPE_BF16, 3, qs);
                a->k = tk;
                a->v = tv;
                a->stream = stream;
            }
        }
        if (bad) {
            printf("cell %d x %d: %s\n", P, B, fi_last_error());
            return 1;
        }
        printf("prefix %5d x batch %2d, suffix %4d (%d cop%s):\n", P, B, S, R, R > 1 ? "ies" : "y");
        print_plan("single", cp[0].single.plan);
        print_plan("cascade L0", fi_cascade_level_plan(cp[0].cascade.cas, 0));
        print_plan("cascade L1", fi_cascade_level_plan(cp[0].cascade.cas, 1));
        printf("    auto: %s, %d levels, cost %.3g vs single %.3g\n",
               ainfo.split ? "split" : "one level", ainfo.num_levels, ainfo.cost_cascade,
               ainfo.cost_single);
        /* validate before timing: cascade and auto against single */
        runner rs[MAXR];
        double us[3];
        for (int k = 0; k < 3; k++) {
            for (int r = 0; r < R; r++) rs[r] = k == 0 ? cp[r].single : k == 1 ? cp[r].cascade : cp[r].autoc;
            GU(gu.MemsetD8(k == 0 ? o_single : k == 1 ? o_cas : o_auto, 0xFF, qbytes));
            us[k] = time_graph(rs, R);
            if (us[k] < 0) return 1;
        }
        double e_cas = compare_bf16(o_cas, o_single, R, 64, B);
        double e_auto = compare_bf16(o_auto, o_single, R, 64, B);
        int ok = e_cas <= 1 && e_auto <= 1;
        if (!ok) status = 1;
        printf("    single %9.1f us, cascade %8.1f us (%.1fx), auto %8.1f us (%.2f of single)"
               "  check: cascade %.2f auto %.2f of tolerance%s\n",
               us[0], us[1], us[0] / us[1], us[2], us[2] / us[0], e_cas, e_auto,
               ok ? "" : "  MISMATCH");
        tl += snprintf(table + tl, sizeof table - (size_t)tl,
                       "| %d | %d | %d | %.1f | %.1f | %.1fx | %.1f | %.2f | %d | %d |%s\n", P, B, S,
                       us[0], us[1], us[0] / us[1], us[2], us[2] / us[0], ainfo.num_levels, R,
                       ok ? "" : " MISMATCH");
        if (jf)
            fprintf(jf,
                    "{\"workload\":\"cascade\",\"prefix\":%d,\"batch\":%d,\"suffix\":%d,\"h_qo\":%d,"
                    "\"h_kv\":%d,\"d\":%d,\"page\":%d,\"dtype\":\"bf16\",\"single_us\":%.2f,"
                    "\"cascade_us\":%.2f,\"auto_us\":%.2f,\"auto_levels\":%d,\"speedup\":%.2f,"
                    "\"auto_over_single\":%.3f,\"copies\":%d,\"check_ok\":%s,\"reps\":%d}\n",
                    P, B, S, H, H, D, PS, us[0], us[1], us[2], ainfo.num_levels, us[0] / us[1],
                    us[2] / us[0], R, ok ? "true" : "false", reps);
        for (int r = 0; r < R; r++) {
            fi_plan_destroy(cp[r].single.plan);
            fi_cascade_destroy(cp[r].cascade.cas);
            fi_cascade_destroy(cp[r].autoc.cas);
            free(cp[r].idx), free(cp[r].l0_idx), free(cp[r].l1_idx);
        }
        free(cp);
    }
    printf("\n%s", table);

    if (do_bsr) {
        enum { M = 4096, N = 4096, BR = 128, BC = 64 };
        int MB = M / BR, NB = N / BC;
        int64_t qs[3] = {M, H, D}, kvs[3] = {N, H, D};
        size_t qb = (size_t)M * H * D * 2;
        gu_ptr bq = 0, bo = 0;
        if (GU(gu.MemAlloc(&bq, qb)) || GU(gu.MemAlloc(&bo, qb)) || gu_fill_random_bf16(bq, qb, &rng))
            return 1;
        static const double dens[] = {0.1, 0.3, 1.0};
        char bt[2048];
        int bl = snprintf(bt, sizeof bt, "| density | blocks | us | TFLOP/s | us per 100 blocks |\n"
                                         "|---|---|---|---|---|\n");
        for (int di = 0; di < 3; di++) {
            int per = (int)ceil(dens[di] * NB);
            int32_t *indptr = malloc(sizeof(int32_t) * (MB + 1)), *ind = malloc(sizeof(int32_t) * MB * NB);
            uint8_t *take = malloc((size_t)NB);
            indptr[0] = 0;
            for (int r = 0; r < MB; r++) {
                memset(take, 0, (size_t)NB);
                for (int k = 0; k < per;) {
                    int c = tu_rng_int(&rng, 0, NB - 1);
                    if (!take[c]) take[c] = 1, k++;
                }
                int at = indptr[r];
                for (int c = 0; c < NB; c++)
                    if (take[c]) ind[at++] = c;
                indptr[r + 1] = at;
            }
            fi_bsr_config bc;
            fi_bsr_config_init(&bc);
            bc.block_rows = BR, bc.block_cols = BC, bc.max_qo_len = M, bc.max_kv_len = N;
            bc.max_nnz = MB * NB;
            runner rb;
            memset(&rb, 0, sizeof rb);
            if (fi_bsr_create(ctx, &p, &bc, &rb.bsr) ||
                fi_bsr_update(rb.bsr, M, N, indptr, ind, NULL)) {
                printf("bsr: %s\n", fi_last_error());
                return 1;
            }
            rb.args.q = fi_tensor_contiguous((void *)(uintptr_t)bq, FI_DTYPE_BF16, 3, qs);
            rb.args.o = fi_tensor_contiguous((void *)(uintptr_t)bo, FI_DTYPE_BF16, 3, qs);
            rb.args.k = fi_tensor_contiguous((void *)(uintptr_t)dk, FI_DTYPE_BF16, 3, kvs);
            rb.args.v = fi_tensor_contiguous((void *)(uintptr_t)dv, FI_DTYPE_BF16, 3, kvs);
            rb.args.stream = stream;
            double t = time_graph(&rb, 1);
            if (t < 0) return 1;
            int nnz = indptr[MB];
            double flops = 4.0 * H * D * (double)nnz * BR * BC;
            printf("bsr %dx%d blocks, density %3.0f%%: %4d blocks, %8.1f us, %6.1f TFLOP/s\n", BR,
                   BC, 100 * dens[di], nnz, t, flops / (t * 1e-6) / 1e12);
            bl += snprintf(bt + bl, sizeof bt - (size_t)bl, "| %.0f%% | %d | %.1f | %.1f | %.2f |\n",
                           100 * dens[di], nnz, t, flops / (t * 1e-6) / 1e12, 100 * t / nnz);
            if (jf)
                fprintf(jf,
                        "{\"workload\":\"bsr\",\"M\":%d,\"N\":%d,\"R\":%d,\"C\":%d,\"h_qo\":%d,"
                        "\"h_kv\":%d,\"d\":%d,\"dtype\":\"bf16\",\"density\":%.2f,\"blocks\":%d,"
                        "\"us\":%.2f,\"tflops\":%.2f,\"reps\":%d}\n",
                        M, N, BR, BC, H, H, D, dens[di], nnz, t, flops / (t * 1e-6) / 1e12, reps);
            fi_bsr_destroy(rb.bsr);
            free(indptr), free(ind), free(take);
        }
        printf("\n%s", bt);
    }
    if (jf) fclose(jf);
    fi_context_destroy(ctx);
    return status;
}
