/*
 * bench_balance.c — what load balancing buys on the CPU backend: decode with
 * kv_len ~ U(4096, 16384) (the load-balance workload of docs/BENCHMARKS.md), 32/8 heads,
 * d 128, bf16 Q/KV, pages of 16, with the scheduler's split-KV on and off,
 * beside the ideal time (KV bytes / this machine's read bandwidth, measured
 * here with the same thread count). Batch 1 and 2 are added: with few
 * requests and N workers, splitting is what keeps every worker busy.
 *
 *   build/bench_balance [--json PATH] [--reps N] [--threads N]
 */
#include "common.h"
#include "core/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { H_QO = 32, H_KV = 8, D = 128, PAGE = 16 };

typedef struct result {
    int32_t batch;
    double keys, bytes;
    double ms[2];          /* split on, off */
    double model_ratio[2]; /* the cost model's max worker load / (total / N) */
    int32_t items[2], split_items[2];
} result;

static int run_mode(fi_context *ctx, bench_batch *b, int disable, int reps, double *ms,
                    double *ratio, int32_t *items, int32_t *split) {
    fi_attention_params p = bench_batch_params(b, FI_MASK_CAUSAL);
    fi_plan_config cfg = bench_batch_config(b);
    cfg.disable_split_kv = disable;
    fi_plan *plan = NULL;
    fi_batch batch = bench_batch_view(b);
    fi_run_args args = bench_batch_args(b, 1);
    double *t = malloc(sizeof(double) * (size_t)reps);
    fi_status st = t ? fi_plan_create(ctx, &p, &cfg, &plan) : FI_STATUS_OUT_OF_MEMORY;
    if (!st) st = fi_plan_update(plan, &batch);
    if (!st) st = fi_plan_run(plan, &args); /* warm-up */
    for (int r = 0; r < reps && !st; r++) {
        double t0 = bench_now();
        st = fi_plan_run(plan, &args);
        t[r] = (bench_now() - t0) * 1e3;
    }
    if (!st) {
        fi_plan_info info = {.struct_size = sizeof info};
        fi_plan_get_info(plan, &info);
        *ms = bench_median(t, reps);
        *ratio = info.total_cost > 0 ? info.max_worker_cost * info.num_workers / info.total_cost : 1;
        *items = info.num_items;
        *split = info.num_split_items;
    } else {
        fprintf(stderr, "bench_balance: %s: %s\n", fi_status_string(st), fi_last_error());
    }
    fi_plan_destroy(plan);
    free(t);
    return st ? -1 : 0;
}

int main(int argc, char **argv) {
    const char *json = NULL;
    int reps = 15, threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--json PATH] [--reps N] [--threads N]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    fi_context_options opt;
    fi_context_options_init(&opt);
    opt.num_threads = threads;
    fi_context *ctx = NULL;
    if (fi_context_create(&opt, &ctx)) { fprintf(stderr, "%s\n", fi_last_error()); return 1; }
    int nthreads = ctx->num_threads;
    double bw = bench_read_bandwidth(nthreads);
    printf("bench_balance — %s; read bandwidth %.1f GB/s (%d threads); medians of %d runs\n\n",
           fi_context_describe(ctx), bw, nthreads, reps);
    printf("| batch | keys | split on ms | split off ms | ideal ms | on / ideal | off / ideal | "
           "model max/mean on / off | items on (split) / off |\n"
           "|---|---|---|---|---|---|---|---|---|\n");
    static const int32_t batches[] = {1, 2, 16, 64};
    result res[4];
    int n = 0;
    for (int i = 0; i < 4; i++) {
        result *r = &res[n];
        memset(r, 0, sizeof *r);
        r->batch = batches[i];
        int32_t *kv = malloc(sizeof(int32_t) * (size_t)r->batch);
        uint64_t s = 1234 + (uint64_t)i;
        for (int32_t j = 0; j < r->batch; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            kv[j] = 4096 + (int32_t)((s >> 33) % (16384 - 4096 + 1));
            r->keys += kv[j];
        }
        bench_batch b;
        int bad = !kv || bench_batch_make(&b, r->batch, kv, 1, PAGE, H_QO, H_KV, D,
                                          FI_DTYPE_BF16, FI_DTYPE_BF16, 99 + (uint64_t)i);
        free(kv);
        if (bad) { fprintf(stderr, "bench_balance: out of memory\n"); return 1; }
        r->bytes = 2.0 * r->keys * H_KV * D * 2; /* K and V, bf16 */
        for (int m = 0; m < 2 && !bad; m++)
            bad = run_mode(ctx, &b, m, reps, &r->ms[m], &r->model_ratio[m], &r->items[m],
                           &r->split_items[m]);
        bench_batch_free(&b);
        if (bad) continue;
        double ideal = r->bytes / (bw * 1e9) * 1e3;
        printf("| %d | %.0f | %.3f | %.3f | %.3f | %.2f | %.2f | %.3f / %.3f | %d (%d) / %d |\n",
               r->batch, r->keys, r->ms[0], r->ms[1], ideal, r->ms[0] / ideal, r->ms[1] / ideal,
               r->model_ratio[0], r->model_ratio[1], r->items[0], r->split_items[0], r->items[1]);
        n++;
    }
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) { perror(json); return 1; }
        fprintf(f, "{\n  \"machine\": \"%s\",\n  \"threads\": %d,\n  \"read_bandwidth_gbs\": %.2f,\n"
                   "  \"reps\": %d,\n  \"rows\": [\n", fi_context_describe(ctx), nthreads, bw, reps);
        for (int i = 0; i < n; i++)
            fprintf(f, "    {\"batch\": %d, \"keys\": %.0f, \"kv_bytes\": %.0f, \"split_ms\": %.4f, "
                       "\"nosplit_ms\": %.4f, \"ideal_ms\": %.4f, \"items\": [%d, %d], "
                       "\"split_items\": %d}%s\n",
                    res[i].batch, res[i].keys, res[i].bytes, res[i].ms[0], res[i].ms[1],
                    res[i].bytes / (bw * 1e9) * 1e3, res[i].items[0], res[i].items[1],
                    res[i].split_items[0], i + 1 < n ? "," : "");
        fprintf(f, "  ]\n}\n");
        fclose(f);
    }
    fi_context_destroy(ctx);
    return 0;
}
