/*
 * bench_mixed.c — the four mixed batches (docs/BENCHMARKS.md) on the CUDA backend, through
 * the public fi_plan_update / fi_plan_run (whatever kernels the library runs
 * for them): (kv_len, q_len) x count
 *   decode   (8192, 1) x 128
 *   prefill  (4096, 128) x 4
 *   hybrid   (600, 1) x 122 + (10000, 17) x 8
 *   chunked  (8192, 1) x 254 + (2048, 512) x 1
 * 32/8 heads, d 128, bf16, paged (page 16, NHD, pages drawn at random from an
 * 8 GiB pool of random values, none twice in a batch), causal (each request's queries are its last
 * q_len tokens), no LSE. FlashInfer's BatchAttention runs the same mixes in
 * bench/cuda/bench_flashinfer.py.
 *
 * Timing: a CUDA graph of one run, replayed; device events around each
 * replay, median of >= 30 after warm-up. Bytes = Q + K + V (once per KV
 * head) + O; FLOPs = 4 H_qo D x visible (query, key) pairs.
 *
 *   build/bench_mixed [--json FILE] [--reps N] [--mix NAME] [--schedule] [--workers N]
 *                     [--device-table] [--same-pages]
 *
 * --same-pages: every request reads the first request's pages (a
 * diagnostic: its K/V from L2 where they fit, what DRAM costs the kernels;
 * the requests of a group must not be longer than the first).
 * --device-table: the page table in device memory
 * (fi_plan_config.device_page_table: the kernels that clamp page ids).
 * --schedule: print each mix's schedule (every worker's items, the cost
 * model's load) as the plan built it, and time nothing. It runs on the
 * stand-in driver too (`make stub`; LD_LIBRARY_PATH=build/stub), which has
 * an H200's 132 SMs and two CTAs per SM, so a schedule can be read without
 * a GPU.
 *
 * --mix also takes the hybrid mix's two halves, which the default run
 * leaves out: hybrid-decode (600, 1) x 122 and hybrid-wide (10000, 17) x 8
 * (each alone on the whole GPU: what each half costs by itself), and three
 * of bench_decode's cells, decode-16x4096, decode-64x1024 and
 * decode-1x32768 (one plan each, through the mixed path; bench_decode
 * times them over several plans), and a short prefill, prefill-32x1024 (32
 * requests of 1024 queries over their 1024 keys: bench_prefill's short
 * cells).
 */
#include "flashinfer.h"
#include "../../tests/gpu/gpu_util.h"
#include "../../tests/util.h"
#include "core/internal.h" /* --schedule reads the plan's schedule */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* POOL: the largest mix's pages (chunked: 130176), a batch never holding a
 * page twice (gu_draw_pages) */
enum { HQ = 32, HKV = 8, D = 128, PS = 16, POOL = 131072, MAXG = 2 };

typedef struct mix {
    const char *name;
    int only_when_named; /* a diagnostic part of a mix: run by --mix NAME only */
    int ngroups;
    int kv[MAXG], q[MAXG], count[MAXG];
} mix;

static const mix mixes[] = {
    {"decode", 0, 1, {8192}, {1}, {128}},
    {"prefill", 0, 1, {4096}, {128}, {4}},
    {"hybrid", 0, 2, {600, 10000}, {1, 17}, {122, 8}},
    {"chunked", 0, 2, {8192, 2048}, {1, 512}, {254, 1}},
    {"hybrid-decode", 1, 1, {600}, {1}, {122}},
    {"hybrid-wide", 1, 1, {10000}, {17}, {8}},
    {"chunked-decode", 1, 1, {8192}, {1}, {254}},
    {"chunked-wide", 1, 1, {2048}, {512}, {1}},
    {"decode-16x4096", 1, 1, {4096}, {1}, {16}},
    {"decode-64x1024", 1, 1, {1024}, {1}, {64}},
    {"decode-1x32768", 1, 1, {32768}, {1}, {1}},
    {"prefill-32x1024", 1, 1, {1024}, {1024}, {32}},
};

/* A mix this run times: the named one, or with no name every mix but the
 * diagnostic ones. */
static int mix_selected(const mix *m, const char *only) {
    return only ? !strcmp(only, m->name) : !m->only_when_named;
}

/* Worker by worker: its cost-model load and items [request q0-q1 k0-k1],
 * '*' marking a split item (partial rows, merged after). */
static void print_schedule(const char *name, const fi_plan *plan) {
    const fi_schedule *s = &plan->schedule;
    printf("mix %s: %d items on %d workers (items in flight for splitting: %d), kv_chunk %d, "
           "%d partial rows, %d merge rows; load max %.0f, mean %.0f\n",
           name, s->num_items, s->num_workers, plan->policy.split_workers, s->kv_chunk,
           s->num_partial_rows, s->num_merge_rows, s->max_worker_cost,
           s->total_cost / (s->num_workers > 0 ? s->num_workers : 1));
    for (int32_t w = 0; w < s->num_workers; w++) {
        const int32_t ib = s->worker_indptr[w], ie = s->worker_indptr[w + 1];
        if (ib == ie) continue;
        printf("  w%-3d %8.0f:", (int)w, s->worker_cost[w]);
        for (int32_t n = ib; n < ie && n < ib + 6; n++) {
            const fi_work_item *it = &s->items[n];
            printf(" [r%d q%d-%d k%d-%d%s]", (int)it->request, (int)it->q_start, (int)it->q_end,
                   (int)it->kv_start, (int)it->kv_end, it->partial_row >= 0 ? "*" : "");
        }
        if (ie - ib > 6) printf(" ... (%d)", (int)(ie - ib));
        printf("\n");
    }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    const char *json = NULL, *only = NULL;
    int reps = 30, schedule = 0, workers = 0, dtable = 0, same_pages = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mix") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--schedule")) schedule = 1;
        else if (!strcmp(argv[i], "--workers") && i + 1 < argc) workers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--device-table")) dtable = 1;
        else if (!strcmp(argv[i], "--same-pages")) same_pages = 1;
    }
    if (reps < 30) reps = 30;
    /* Q and O for the largest selected mix's queries, no more: filled with
     * random values at start-up */
    int64_t maxq = 1;
    for (size_t mi = 0; mi < sizeof mixes / sizeof mixes[0]; mi++) {
        int64_t q = 0;
        for (int g = 0; g < mixes[mi].ngroups; g++) q += (int64_t)mixes[mi].q[g] * mixes[mi].count[g];
        if (mix_selected(&mixes[mi], only) && q > maxq) maxq = q;
    }
    gu_bench bench;
    int st = gu_bench_init(&bench, (size_t)maxq * HQ * D * 2, (size_t)POOL * PS * HKV * D * 2, 4242,
                           "mixed batches, causal, random pages");
    if (st) return st < 0;
    fi_attention_params p = gu_bench_params(HQ, HKV, D, PS);
    p.mask_mode = FI_MASK_CAUSAL;
    int64_t ks[4] = {POOL, PS, HKV, D};
    FILE *jf = json ? fopen(json, "w") : NULL;
    char table[4096];
    int tl = snprintf(table, sizeof table,
                      "| mix | requests | queries | time (us) | TB/s | TFLOP/s | items | split |"
                      " plan_update (us) |\n|---|---|---|---|---|---|---|---|---|\n");
    int status = 0;
    for (size_t mi = 0; mi < sizeof mixes / sizeof mixes[0]; mi++) {
        const mix *m = &mixes[mi];
        if (!mix_selected(m, only)) continue;
        int n = 0;
        int32_t qo[512], kv[512];
        double bytes = 0, flops = 0;
        for (int g = 0; g < m->ngroups; g++)
            for (int c = 0; c < m->count[g]; c++, n++) {
                qo[n] = m->q[g], kv[n] = m->kv[g];
                bytes += 2.0 * m->kv[g] * HKV * D * 2 + 2.0 * m->q[g] * HQ * D * 2;
                /* query t of q sees kv - q + t + 1 keys */
                double pairs = (double)m->q[g] * (m->kv[g] - m->q[g]) + m->q[g] * (m->q[g] + 1.0) / 2;
                flops += 4.0 * HQ * D * pairs;
            }
        gu_batch b;
        if (gu_batch_make(&b, n, qo, kv, PS, POOL, 0, &bench.rng)) return 1;
        if (same_pages) /* every request reads the first one's pages */
            for (int r = 1; r < n; r++)
                for (int j = b.kv_indptr[r]; j < b.kv_indptr[r + 1]; j++)
                    b.indices[j] = b.indices[j - b.kv_indptr[r]];
        fi_batch fb = gu_batch_view(&b);
        gu_ptr dtab = 0;
        if (dtable) {
            size_t tb = sizeof(int32_t) * (size_t)b.pages;
            if (GU(gu.MemAlloc(&dtab, tb)) || GU(gu.HtoD(dtab, b.indices, tb))) return 1;
            fb.kv_indices = (const int32_t *)(uintptr_t)dtab;
        }
        fi_plan_config cfg;
        fi_plan_config_init(&cfg);
        cfg.max_batch_size = n, cfg.max_total_qo = b.total_q, cfg.max_total_kv = b.pages;
        cfg.device_page_table = dtable;
        cfg.num_workers = workers; /* 0: the backend's choice */
        fi_plan *plan = NULL;
        fi_plan_info info = {.struct_size = sizeof info};
        if (fi_plan_create(bench.ctx, &p, &cfg, &plan) || fi_plan_update(plan, &fb) ||
            fi_plan_get_info(plan, &info)) {
            printf("mix %s: %s\n", m->name, fi_last_error());
            return 1;
        }
        if (schedule) {
            print_schedule(m->name, plan);
            fi_plan_destroy(plan);
            gu_batch_free(&b);
        if (dtab) gu.MemFree(dtab);
            continue;
        }
        float upd[21];
        for (int r = 0; r < 21; r++) { /* steady-state plan cost */
            double t0 = now();
            fi_plan_update(plan, &fb);
            upd[r] = (float)(1e6 * (now() - t0));
        }
        qsort(upd, 21, sizeof upd[0], gu_cmp_float);
        fi_run_args a;
        memset(&a, 0, sizeof a);
        int64_t qs[3] = {b.total_q, HQ, D};
        a.q = fi_tensor_contiguous((void *)(uintptr_t)bench.q, FI_DTYPE_BF16, 3, qs);
        a.o = fi_tensor_contiguous((void *)(uintptr_t)bench.o, FI_DTYPE_BF16, 3, qs);
        a.k = fi_tensor_contiguous((void *)(uintptr_t)bench.k, FI_DTYPE_BF16, 4, ks);
        a.v = fi_tensor_contiguous((void *)(uintptr_t)bench.v, FI_DTYPE_BF16, 4, ks);
        a.stream = bench.s;
        if (fi_plan_run(plan, &a)) {
            printf("run: %s\n", fi_last_error());
            return 1;
        }
        gu_graph graph = NULL;
        gu_exec ex = NULL;
        GU(gu.BeginCapture(bench.s, 0));
        fi_plan_run(plan, &a);
        if (GU(gu.EndCapture(bench.s, &graph)) || GU(gu.GraphInstantiate(&ex, graph, 0))) return 1;
        float *ms = malloc(sizeof(float) * reps);
        if (gu_replay_times(ex, bench.s, bench.e0, bench.e1, reps, ms)) return 1;
        double us = 1e3 * ms[reps / 2];
        double tbs = bytes / (us * 1e-6) / 1e12, tf = flops / (us * 1e-6) / 1e12;
        uint16_t o16[256]; /* a guard against timing garbage, not a test */
        GU(gu.DtoH(o16, bench.o + (gu_ptr)(b.total_q - 1) * HQ * D * 2, sizeof o16));
        int finite = 1;
        for (int i = 0; i < 256; i++) finite &= isfinite(tu_bf16_to_f32(o16[i]));
        if (!finite) status = 1;
        tl += snprintf(table + tl, sizeof table - (size_t)tl,
                       "| %s | %d | %d | %.1f | %.2f | %.1f | %d | %d | %.1f |%s\n", m->name, n,
                       b.total_q, us, tbs, tf, info.num_items, info.num_split_items, upd[10],
                       finite ? "" : " NON-FINITE OUTPUT");
        printf("mixed %-8s: %9.1f us %6.2f TB/s %6.1f TFLOP/s (%d items, %d split, min %.1f max "
               "%.1f us)\n", m->name, us, tbs, tf, info.num_items, info.num_split_items,
               1e3 * ms[0], 1e3 * ms[reps - 1]);
        if (jf)
            fprintf(jf,
                    "{\"workload\":\"mixed\",\"mix\":\"%s\",\"requests\":%d,\"queries\":%d,"
                    "\"h_qo\":%d,\"h_kv\":%d,\"d\":%d,\"page\":%d,\"dtype\":\"bf16\",\"causal\":1,"
                    "\"us\":%.2f,\"tb_s\":%.3f,\"tflops\":%.2f,\"bytes\":%.0f,\"flops\":%.0f,"
                    "\"items\":%d,\"split_items\":%d,\"plan_update_us\":%.1f,\"reps\":%d}\n",
                    m->name, n, b.total_q, HQ, HKV, D, PS, us, tbs, tf, bytes, flops,
                    info.num_items, info.num_split_items, upd[10], reps);
        free(ms);
        gu.GraphExecDestroy(ex);
        gu.GraphDestroy(graph);
        fi_plan_destroy(plan);
        gu_batch_free(&b);
        if (dtab) gu.MemFree(dtab);
    }
    if (jf) fclose(jf);
    if (!schedule) printf("\n%s", table);
    fi_context_destroy(bench.ctx);
    return status;
}
