/*
 * bench_plan.c — the host cost of planning: fi_plan_update latency (public
 * API, CPU context) for decode and mixed batches of 1 .. 4096 requests, the
 * scheduler's share of it (fi_schedule_build alone), and the workspace a
 * plan holds for each benchmark workload (docs/BENCHMARKS.md) beside the bounds that size it.
 *
 *   build/bench_plan [--json PATH] [--reps N]
 *
 * Latencies are medians of N single calls (default 501). Two worker counts:
 * the CPU context's own (one per thread) and 264 (an H200: 132 SMs x 2 CTAs),
 * which the CPU plan accepts through fi_plan_config.num_workers.
 */
#include "common.h"
#include "core/internal.h"
#include "core/schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { H_QO = 32, H_KV = 8, D = 128, PAGE = 16, GPU_WORKERS = 264 };

static uint64_t rng(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int32_t uniform(uint64_t *s, int32_t lo, int32_t hi) {
    return lo + (int32_t)(rng(s) % (uint64_t)(hi - lo + 1));
}

/* A paged batch: host metadata only (planning never reads K/V). */
typedef struct host_batch {
    int32_t B, total_qo, total_pages;
    int32_t *qo_indptr, *kv_indptr, *kv_indices, *last;
} host_batch;

/* decode: 1 query, kv ~ U(1024, 4096). mixed: every 16th request is a
 * 128-token prefill chunk with kv ~ U(2048, 8192), the rest decode. */
static int make_batch(host_batch *h, int32_t B, int mixed, uint64_t seed) {
    memset(h, 0, sizeof *h);
    h->B = B;
    h->qo_indptr = calloc((size_t)B + 1, sizeof(int32_t));
    h->kv_indptr = calloc((size_t)B + 1, sizeof(int32_t));
    h->last = calloc((size_t)B + 1, sizeof(int32_t));
    if (!h->qo_indptr || !h->kv_indptr || !h->last) return -1;
    for (int32_t i = 0; i < B; i++) {
        int prefill = mixed && i % 16 == 15;
        int32_t qo = prefill ? 128 : 1;
        int32_t kv = prefill ? uniform(&seed, 2048, 8192) : uniform(&seed, 1024, 4096);
        int32_t pages = (kv + PAGE - 1) / PAGE;
        h->qo_indptr[i + 1] = h->qo_indptr[i] + qo;
        h->kv_indptr[i + 1] = h->kv_indptr[i] + pages;
        h->last[i] = kv - (pages - 1) * PAGE;
    }
    h->total_qo = h->qo_indptr[B];
    h->total_pages = h->kv_indptr[B];
    h->kv_indices = malloc(sizeof(int32_t) * (size_t)h->total_pages + 4);
    if (!h->kv_indices) return -1;
    for (int32_t j = 0; j < h->total_pages; j++) h->kv_indices[j] = j;
    for (int32_t j = h->total_pages - 1; j > 0; j--) { /* shuffled, as a free list */
        int32_t r = (int32_t)(rng(&seed) % (uint64_t)(j + 1)), t = h->kv_indices[j];
        h->kv_indices[j] = h->kv_indices[r];
        h->kv_indices[r] = t;
    }
    return 0;
}

static void free_batch(host_batch *h) {
    free(h->qo_indptr); free(h->kv_indptr); free(h->kv_indices); free(h->last);
}

static void model(fi_attention_params *p, int32_t h_qo, int32_t h_kv, fi_kv_format fmt,
                  int32_t page, bool causal) {
    fi_attention_params_init(p);
    p->num_qo_heads = h_qo;
    p->num_kv_heads = h_kv;
    p->head_dim_qk = p->head_dim_vo = D;
    p->kv_format = fmt;
    p->page_size = page;
    p->q_dtype = p->kv_dtype = p->o_dtype = FI_DTYPE_BF16;
    p->mask_mode = causal ? FI_MASK_CAUSAL : FI_MASK_NONE;
}

typedef struct lat_row {
    const char *kind;
    int32_t B, total_qo, total_pages;
    double update_us[2];   /* CPU workers, GPU_WORKERS */
    double schedule_us[2]; /* fi_schedule_build alone */
    int32_t items[2], splits[2];
} lat_row;

/* The scheduler's input for the plan's last batch, as fi_plan_update makes it. */
static fi_schedule_input schedule_input(const fi_plan *plan) {
    const fi_backend *be = plan->ctx->backend;
    fi_schedule_input in = {
        .batch_size = plan->batch_size, .qo_indptr = plan->qo_indptr,
        .kv_len = plan->kv_len, .group_size = plan->group_size,
        .num_kv_heads = plan->params.num_kv_heads,
        .causal = plan->params.mask_mode == FI_MASK_CAUSAL,
        .window_left = plan->params.window_left, .num_workers = plan->config.num_workers,
        .policy = be->policy,
        .disable_split_kv = plan->config.disable_split_kv != 0,
        .fixed_split_size = plan->config.fixed_split_size};
    return in;
}

static int time_update(fi_context *ctx, const host_batch *h, int32_t workers, int reps,
                       double *update_us, double *schedule_us, int32_t *items, int32_t *splits) {
    fi_attention_params p;
    model(&p, H_QO, H_KV, FI_KV_FORMAT_PAGED, PAGE, true);
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    cfg.max_batch_size = h->B;
    cfg.max_total_qo = h->total_qo;
    cfg.max_total_kv = h->total_pages;
    cfg.num_workers = workers;
    fi_plan *plan = NULL;
    fi_batch batch = {h->B, h->qo_indptr, h->kv_indptr, h->kv_indices, h->last, NULL};
    double *t = malloc(sizeof(double) * (size_t)reps);
    fi_status st = t ? fi_plan_create(ctx, &p, &cfg, &plan) : FI_STATUS_OUT_OF_MEMORY;
    for (int r = 0; r < reps && !st; r++) {
        double t0 = bench_now();
        st = fi_plan_update(plan, &batch);
        t[r] = (bench_now() - t0) * 1e6;
    }
    if (!st) {
        *update_us = bench_median(t, reps);
        fi_schedule_input in = schedule_input(plan);
        for (int r = 0; r < reps && !st; r++) {
            double t0 = bench_now();
            st = fi_schedule_build(&plan->schedule, &in);
            t[r] = (bench_now() - t0) * 1e6;
        }
        *schedule_us = bench_median(t, reps);
        fi_plan_info info = {.struct_size = sizeof info};
        fi_plan_get_info(plan, &info);
        *items = info.num_items;
        *splits = info.num_split_items;
    }
    if (st) fprintf(stderr, "bench_plan: %s: %s\n", fi_status_string(st), fi_last_error());
    fi_plan_destroy(plan);
    free(t);
    return st ? -1 : 0;
}

/* ------------------------------------------------------------ workspace */

typedef struct workload {
    char name[48];
    int32_t h_qo, h_kv, page; /* page 0 = ragged */
    bool causal;
    int32_t count[2], qo[2], kv[2]; /* up to two groups of identical requests */
} workload;

typedef struct ws_row {
    workload w;
    int32_t B, total_qo, total_kv;
    size_t bytes[2];
    int32_t partial_rows[2];
} ws_row;

static int32_t add_workloads(workload *w) {
    int32_t n = 0;
    static const int32_t dec_b[] = {1, 16, 64, 256}, dec_kv[] = {1024, 4096, 16384, 32768};
    for (int32_t g = 0; g < 2; g++)
        for (int32_t i = 0; i < 4; i++)
            for (int32_t j = 0; j < 4; j++, n++) {
                w[n] = (workload){.h_qo = 32, .h_kv = g ? 4 : 8, .page = 16, .causal = true,
                                  .count = {dec_b[i], 0}, .qo = {1, 0}, .kv = {dec_kv[j], 0}};
                snprintf(w[n].name, sizeof w[n].name, "decode 32/%d %d x %d", g ? 4 : 8,
                         dec_b[i], dec_kv[j]);
            }
    static const int32_t pre[5][2] = {{128, 1024}, {64, 2048}, {32, 4096}, {16, 8192}, {1, 32768}};
    static const int32_t pages[3] = {0, 1, 16};
    for (int32_t f = 0; f < 3; f++)
        for (int32_t i = 0; i < 5; i++, n++) {
            w[n] = (workload){.h_qo = 32, .h_kv = 8, .page = pages[f], .causal = true,
                              .count = {pre[i][0], 0}, .qo = {pre[i][1], 0}, .kv = {pre[i][1], 0}};
            snprintf(w[n].name, sizeof w[n].name, "prefill %s %d x %d",
                     f == 0 ? "ragged" : f == 1 ? "page 1" : "page 16", pre[i][0], pre[i][1]);
        }
    const workload mixed[] = {
        {"mixed decode (8192,1)x128", 32, 8, 16, true, {128, 0}, {1, 0}, {8192, 0}},
        {"mixed prefill (4096,128)x4", 32, 8, 16, true, {4, 0}, {128, 0}, {4096, 0}},
        {"mixed hybrid", 32, 8, 16, true, {122, 8}, {1, 17}, {600, 10000}},
        {"mixed chunked", 32, 8, 16, true, {254, 1}, {1, 512}, {8192, 2048}},
        {"balance U(4k,16k) x16", 32, 8, 16, true, {16, 0}, {1, 0}, {16384, 0}},
        {"balance U(4k,16k) x64", 32, 8, 16, true, {64, 0}, {1, 0}, {16384, 0}},
    };
    for (size_t i = 0; i < sizeof mixed / sizeof mixed[0]; i++) w[n++] = mixed[i];
    static const int32_t cas_b[] = {16, 64}, cas_p[] = {1024, 8192, 32768};
    for (int32_t i = 0; i < 2; i++)
        for (int32_t j = 0; j < 3; j++, n++) {
            w[n] = (workload){.h_qo = 32, .h_kv = 32, .page = 16, .causal = true,
                              .count = {cas_b[i], 0}, .qo = {1, 0}, .kv = {cas_p[j] + 128, 0}};
            snprintf(w[n].name, sizeof w[n].name, "cascade flat %d x %d+128", cas_b[i], cas_p[j]);
        }
    return n;
}

/* The bounds of a workload are the workload itself. */
static int measure_workspace(fi_context *ctx, const workload *w, int32_t cpu_workers, ws_row *r) {
    memset(r, 0, sizeof *r);
    r->w = *w;
    int64_t kv = 0;
    for (int32_t g = 0; g < 2; g++) {
        int32_t per = w->page ? (w->kv[g] + w->page - 1) / w->page : w->kv[g];
        r->B += w->count[g];
        r->total_qo += w->count[g] * w->qo[g];
        kv += (int64_t)w->count[g] * per;
    }
    r->total_kv = (int32_t)kv;
    fi_attention_params p;
    model(&p, w->h_qo, w->h_kv, w->page ? FI_KV_FORMAT_PAGED : FI_KV_FORMAT_RAGGED,
          w->page ? w->page : 1, w->causal);
    for (int32_t k = 0; k < 2; k++) {
        fi_plan_config cfg;
        fi_plan_config_init(&cfg);
        cfg.max_batch_size = r->B;
        cfg.max_total_qo = r->total_qo;
        cfg.max_total_kv = r->total_kv;
        cfg.num_workers = k ? GPU_WORKERS : cpu_workers;
        fi_plan *plan = NULL;
        fi_status st = fi_plan_create(ctx, &p, &cfg, &plan);
        if (st) {
            fprintf(stderr, "bench_plan: %s: %s\n", w->name, fi_last_error());
            return -1;
        }
        r->bytes[k] = fi_plan_workspace_size(plan);
        r->partial_rows[k] = plan->schedule.limits.max_partial_rows;
        fi_plan_destroy(plan);
    }
    return 0;
}

/* ------------------------------------------------------------ main */

static void write_json(const char *path, fi_context *ctx, const lat_row *lat, int nl,
                       const ws_row *ws, int nw, int32_t cpu_workers) {
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); return; }
    fprintf(f, "{\n  \"machine\": \"%s\",\n  \"cpu_workers\": %d,\n  \"gpu_workers\": %d,\n"
               "  \"latency\": [\n", fi_context_describe(ctx), cpu_workers, GPU_WORKERS);
    for (int i = 0; i < nl; i++)
        fprintf(f, "    {\"kind\": \"%s\", \"batch\": %d, \"total_qo\": %d, \"pages\": %d, "
                   "\"update_us\": [%.3f, %.3f], \"schedule_us\": [%.3f, %.3f], "
                   "\"items\": [%d, %d], \"split_items\": [%d, %d]}%s\n",
                lat[i].kind, lat[i].B, lat[i].total_qo, lat[i].total_pages,
                lat[i].update_us[0], lat[i].update_us[1], lat[i].schedule_us[0],
                lat[i].schedule_us[1], lat[i].items[0], lat[i].items[1], lat[i].splits[0],
                lat[i].splits[1], i + 1 < nl ? "," : "");
    fprintf(f, "  ],\n  \"workspace\": [\n");
    for (int i = 0; i < nw; i++)
        fprintf(f, "    {\"workload\": \"%s\", \"max_batch_size\": %d, \"max_total_qo\": %d, "
                   "\"max_total_kv\": %d, \"bytes\": [%zu, %zu], \"max_partial_rows\": [%d, %d]}%s\n",
                ws[i].w.name, ws[i].B, ws[i].total_qo, ws[i].total_kv, ws[i].bytes[0],
                ws[i].bytes[1], ws[i].partial_rows[0], ws[i].partial_rows[1],
                i + 1 < nw ? "," : "");
    fprintf(f, "  ]\n}\n");
    fclose(f);
}

int main(int argc, char **argv) {
    const char *json = NULL;
    int reps = 501;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else { fprintf(stderr, "usage: %s [--json PATH] [--reps N]\n", argv[0]); return 2; }
    }
    if (reps < 1) reps = 1;
    fi_context_options opt;
    fi_context_options_init(&opt);
    fi_context *ctx = NULL;
    if (fi_context_create(&opt, &ctx)) { fprintf(stderr, "%s\n", fi_last_error()); return 1; }
    int32_t cpu_workers = ctx->backend->num_workers(ctx);
    printf("bench_plan — %s; medians of %d calls\n\n", fi_context_describe(ctx), reps);

    static const int32_t sizes[] = {1, 64, 256, 1024, 4096};
    lat_row lat[10];
    int nl = 0;
    printf("| batch | requests | query tokens | pages | fi_plan_update us (N=%d / %d) | "
           "schedule only us (N=%d / %d) | items (N=%d / %d) | split |\n|---|---|---|---|---|---|---|---|\n",
           cpu_workers, GPU_WORKERS, cpu_workers, GPU_WORKERS, cpu_workers, GPU_WORKERS);
    for (int mixed = 0; mixed < 2; mixed++)
        for (int i = 0; i < 5; i++) {
            host_batch h;
            lat_row *r = &lat[nl];
            memset(r, 0, sizeof *r);
            r->kind = mixed ? "mixed" : "decode";
            if (make_batch(&h, sizes[i], mixed, 7 + (uint64_t)i)) return 1;
            r->B = h.B;
            r->total_qo = h.total_qo;
            r->total_pages = h.total_pages;
            int bad = 0;
            for (int k = 0; k < 2; k++)
                bad |= time_update(ctx, &h, k ? GPU_WORKERS : cpu_workers, reps, &r->update_us[k],
                                   &r->schedule_us[k], &r->items[k], &r->splits[k]);
            free_batch(&h);
            if (bad) continue;
            printf("| %s | %d | %d | %d | %.2f / %.2f | %.2f / %.2f | %d / %d | %d / %d |\n",
                   r->kind, r->B, r->total_qo, r->total_pages, r->update_us[0], r->update_us[1],
                   r->schedule_us[0], r->schedule_us[1], r->items[0], r->items[1], r->splits[0],
                   r->splits[1]);
            nl++;
        }

    workload w[80];
    ws_row ws[80];
    int nw = 0, n = add_workloads(w);
    printf("\n| workload | max_batch_size | max_total_qo | max_total_kv | workspace MB (N=%d) | "
           "workspace MB (N=%d) | max_partial_rows (N=%d) |\n|---|---|---|---|---|---|---|\n",
           cpu_workers, GPU_WORKERS, GPU_WORKERS);
    for (int i = 0; i < n; i++) {
        if (measure_workspace(ctx, &w[i], cpu_workers, &ws[nw])) continue;
        const ws_row *r = &ws[nw++];
        printf("| %s | %d | %d | %d | %.2f | %.2f | %d |\n", r->w.name, r->B, r->total_qo,
               r->total_kv, r->bytes[0] / 1048576.0, r->bytes[1] / 1048576.0, r->partial_rows[1]);
    }
    size_t worst = 0;
    for (int i = 0; i < nw; i++) worst = ws[i].bytes[1] > worst ? ws[i].bytes[1] : worst;
    printf("\nlargest workspace (N=%d): %.2f MB (target: <= 32 MB)\n", GPU_WORKERS, worst / 1048576.0);
    if (json) write_json(json, ctx, lat, nl, ws, nw, cpu_workers);
    fi_context_destroy(ctx);
    return 0;
}
