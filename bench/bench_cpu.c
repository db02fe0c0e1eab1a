/*
 * bench_cpu.c — the CPU workloads (docs/BENCHMARKS.md) on the CPU backend: paged decode
 * (batch {1,16} x kv {1k,4k}, plus the 16 x 4096 target cell) and causal
 * prefill (1 x {512, 2048}), 32/8 heads, d 128, f32 and bf16 (q, kv, o alike),
 * beside the machine's measured read bandwidth and fp32 FMA peak.
 *
 *   build/bench_cpu [--json PATH] [--reps N] [--threads N]
 *
 * Prints one table; with --json writes every number for bench/run_cpu.sh.
 */
#include "common.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct cell {
    const char *kind; /* "decode" or "prefill" */
    int32_t batch, kv_len, qo_len;
    fi_dtype dtype;
} cell;

typedef struct result {
    double ms, gbs, gflops;
} result;

static int reps = 30;
static int threads = 0;

/* One plan, warm-up runs, then the median of `reps` timed runs. */
static int time_cell(fi_context *ctx, const cell *c, result *r) {
    bench_batch b;
    int32_t *lens = malloc(sizeof(int32_t) * (size_t)c->batch);
    for (int32_t i = 0; i < c->batch; i++) lens[i] = c->kv_len;
    if (bench_batch_make(&b, c->batch, lens, c->qo_len, 16, 32, 8, 128, c->dtype, c->dtype,
                         (uint64_t)c->batch * 7919u + (uint64_t)c->kv_len)) {
        fprintf(stderr, "out of memory for %s %d x %d\n", c->kind, c->batch, c->kv_len);
        free(lens);
        return -1;
    }
    free(lens);
    bool causal = strcmp(c->kind, "prefill") == 0;
    fi_attention_params p = bench_batch_params(&b, causal ? FI_MASK_CAUSAL : FI_MASK_NONE);
    fi_plan_config cfg = bench_batch_config(&b);
    fi_plan *plan = NULL;
    fi_batch view = bench_batch_view(&b);
    fi_run_args args = bench_batch_args(&b, 1);
    fi_status st = fi_plan_create(ctx, &p, &cfg, &plan);
    if (!st) st = fi_plan_update(plan, &view);
    for (int w = 0; w < 3 && !st; w++) st = fi_plan_run(plan, &args);
    double *t = malloc(sizeof(double) * (size_t)reps);
    for (int i = 0; i < reps && !st; i++) {
        double t0 = bench_now();
        st = fi_plan_run(plan, &args);
        t[i] = bench_now() - t0;
    }
    if (st) {
        fprintf(stderr, "%s %d x %d: %s: %s\n", c->kind, c->batch, c->kv_len,
                fi_status_string(st), fi_last_error());
    } else {
        double s = bench_median(t, reps);
        r->ms = s * 1e3;
        r->gbs = bench_batch_bytes(&b) / s / 1e9;
        r->gflops = bench_batch_flops(&b, causal) / s / 1e9;
    }
    free(t);
    fi_plan_destroy(plan);
    bench_batch_free(&b);
    return st ? -1 : 0;
}

int main(int argc, char **argv) {
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else { fprintf(stderr, "usage: %s [--json PATH] [--reps N] [--threads N]\n", argv[0]); return 2; }
    }
    if (reps < 1) reps = 1;
    fi_context_options opt;
    fi_context_options_init(&opt);
    opt.num_threads = threads;
    fi_context *ctx = NULL;
    if (fi_context_create(&opt, &ctx)) {
        fprintf(stderr, "context: %s\n", fi_last_error());
        return 1;
    }
    int nthreads = threads > 0 ? threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nthreads < 1) nthreads = 1;
    double bw = bench_read_bandwidth(nthreads);
    double peak = bench_fma_peak(nthreads);

    static const cell cells[] = {
        {"decode", 1, 1024, 1, FI_DTYPE_F32},   {"decode", 1, 4096, 1, FI_DTYPE_F32},
        {"decode", 16, 1024, 1, FI_DTYPE_F32},  {"decode", 16, 4096, 1, FI_DTYPE_F32},
        {"decode", 1, 1024, 1, FI_DTYPE_BF16},  {"decode", 1, 4096, 1, FI_DTYPE_BF16},
        {"decode", 16, 1024, 1, FI_DTYPE_BF16}, {"decode", 16, 4096, 1, FI_DTYPE_BF16},
        {"prefill", 1, 512, 512, FI_DTYPE_F32}, {"prefill", 1, 2048, 2048, FI_DTYPE_F32},
        {"prefill", 1, 512, 512, FI_DTYPE_BF16}, {"prefill", 1, 2048, 2048, FI_DTYPE_BF16},
    };
    int n = (int)(sizeof cells / sizeof cells[0]);
    result res[sizeof cells / sizeof cells[0]];
    memset(res, 0, sizeof res);

    printf("%s; read bandwidth %.1f GB/s, fp32 FMA peak %.0f GFLOP/s (measured)\n",
           fi_context_describe(ctx), bw, peak);
    printf("| workload | dtype | ms | GB/s | %% of read BW | GFLOP/s | %% of FMA peak |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < n; i++) {
        const cell *c = &cells[i];
        if (time_cell(ctx, c, &res[i])) continue;
        printf("| %s %d x %d | %s | %.3f | %.1f | %.0f%% | %.1f | %.0f%% |\n", c->kind, c->batch,
               c->kv_len, fi_dtype_name(c->dtype), res[i].ms, res[i].gbs, 100 * res[i].gbs / bw,
               res[i].gflops, 100 * res[i].gflops / peak);
    }
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) { perror(json); return 1; }
        fprintf(f, "{\n  \"machine\": \"%s\",\n  \"read_bandwidth_gbs\": %.2f,\n"
                   "  \"fma_peak_gflops\": %.1f,\n  \"threads\": %d,\n  \"cells\": [\n",
                fi_context_describe(ctx), bw, peak, nthreads);
        for (int i = 0; i < n; i++)
            fprintf(f, "    {\"kind\": \"%s\", \"batch\": %d, \"kv_len\": %d, \"qo_len\": %d, "
                       "\"dtype\": \"%s\", \"ms\": %.4f, \"gbs\": %.2f, \"gflops\": %.2f}%s\n",
                    cells[i].kind, cells[i].batch, cells[i].kv_len, cells[i].qo_len,
                    fi_dtype_name(cells[i].dtype), res[i].ms, res[i].gbs, res[i].gflops,
                    i + 1 < n ? "," : "");
        fprintf(f, "  ]\n}\n");
        fclose(f);
    }
    fi_context_destroy(ctx);
    return 0;
}
