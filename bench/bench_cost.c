/*
 * bench_cost.c — calibrates the scheduler's cost model on the CPU backend:
 * one work item (one request, one tile, split off, one thread) timed over a
 * grid of packed query rows x keys, 32/8 heads, d 128, bf16, and the least-
 * squares fits, per KV head, of
 *   t = a * rows + b * keys            (the model fi_schedule_input carries)
 *   t = a * rows + b * keys + c * rows * keys
 * Times are in ns; the scheduler only needs the ratio a / b (and c / b).
 *
 *   build/bench_cost [--reps N]
 */
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { H_QO = 32, H_KV = 8, G = H_QO / H_KV, D = 128, PAGE = 16 };

static double time_item(fi_context *ctx, int32_t qo, int32_t kv, int reps) {
    bench_batch b;
    if (bench_batch_make(&b, 1, &kv, qo, PAGE, H_QO, H_KV, D, FI_DTYPE_BF16, FI_DTYPE_BF16, 5))
        return -1;
    fi_attention_params p = bench_batch_params(&b, FI_MASK_NONE);
    fi_plan_config cfg = bench_batch_config(&b);
    cfg.num_workers = 1;
    cfg.disable_split_kv = 1;
    fi_plan *plan = NULL;
    fi_batch batch = bench_batch_view(&b);
    fi_run_args args = bench_batch_args(&b, 1);
    double *t = malloc(sizeof(double) * (size_t)reps), med = -1;
    fi_status st = t ? fi_plan_create(ctx, &p, &cfg, &plan) : FI_STATUS_OUT_OF_MEMORY;
    if (!st) st = fi_plan_update(plan, &batch);
    if (!st) {
        fi_plan_info info = {.struct_size = sizeof info};
        fi_plan_get_info(plan, &info);
        if (info.num_items != 1) fprintf(stderr, "bench_cost: %d items, not 1\n", info.num_items);
        st = fi_plan_run(plan, &args);
    }
    for (int r = 0; r < reps && !st; r++) {
        double t0 = bench_now();
        st = fi_plan_run(plan, &args);
        t[r] = (bench_now() - t0) * 1e9;
    }
    if (!st) med = bench_median(t, reps);
    else fprintf(stderr, "bench_cost: %s: %s\n", fi_status_string(st), fi_last_error());
    fi_plan_destroy(plan);
    bench_batch_free(&b);
    free(t);
    return med;
}

/* Least squares on k columns (k <= 3) by the normal equations. */
static void fit(const double (*x)[3], const double *y, int n, int k, double *coef) {
    double A[3][4] = {{0}};
    for (int i = 0; i < n; i++)
        for (int r = 0; r < k; r++) {
            for (int c = 0; c < k; c++) A[r][c] += x[i][r] * x[i][c];
            A[r][3] += x[i][r] * y[i];
        }
    for (int p = 0; p < k; p++) /* Gauss-Jordan, the system is tiny and well posed */
        for (int r = 0; r < k; r++) {
            if (r == p) continue;
            double f = A[r][p] / A[p][p];
            for (int c = 0; c < 4; c++) A[r][c] -= f * A[p][c];
        }
    for (int r = 0; r < k; r++) coef[r] = A[r][3] / A[r][r];
}

int main(int argc, char **argv) {
    int reps = 21;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else { fprintf(stderr, "usage: %s [--reps N]\n", argv[0]); return 2; }
    }
    fi_context_options opt;
    fi_context_options_init(&opt);
    opt.num_threads = 1;
    fi_context *ctx = NULL;
    if (fi_context_create(&opt, &ctx)) { fprintf(stderr, "%s\n", fi_last_error()); return 1; }
    printf("bench_cost — %s; one item, medians of %d runs, ns per KV head\n\n",
           fi_context_describe(ctx), reps);
    static const int32_t toks[] = {1, 4, 16, 32}, keys[] = {256, 1024, 4096, 16384};
    double x[16][3], y[16];
    int n = 0;
    printf("| packed rows | keys | ns / KV head | ns / key / KV head |\n|---|---|---|---|\n");
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            double t = time_item(ctx, toks[i], keys[j], reps);
            if (t < 0) continue;
            double rows = (double)toks[i] * G;
            x[n][0] = rows;
            x[n][1] = keys[j];
            x[n][2] = rows * keys[j];
            y[n] = t / H_KV;
            printf("| %.0f | %d | %.0f | %.3f |\n", rows, keys[j], y[n], y[n] / keys[j]);
            n++;
        }
    double c2[3] = {0}, c3[3] = {0};
    fit(x, y, n, 2, c2);
    fit(x, y, n, 3, c3);
    double e2 = 0, e3 = 0;
    for (int i = 0; i < n; i++) {
        e2 = fmax(e2, fabs(c2[0] * x[i][0] + c2[1] * x[i][1] - y[i]) / y[i]);
        e3 = fmax(e3, fabs(c3[0] * x[i][0] + c3[1] * x[i][1] + c3[2] * x[i][2] - y[i]) / y[i]);
    }
    printf("\nfit a*rows + b*keys:            a = %.2f ns, b = %.4f ns, a/b = %.1f; worst "
           "relative error %.0f%%\n", c2[0], c2[1], c2[0] / c2[1], 100 * e2);
    printf("fit a*rows + b*keys + c*r*k:    a = %.2f ns, b = %.4f ns, c = %.5f ns, a/b = %.1f, "
           "c/b = %.4f; worst relative error %.0f%%\n", c3[0], c3[1], c3[2], c3[0] / c3[1],
           c3[2] / c3[1], 100 * e3);
    fi_context_destroy(ctx);
    return 0;
}
