/*
 * bench_mixed.c — BENCH.md's four mixed batches on the CUDA backend, through
 * the public fi_plan_update / fi_plan_run (whatever kernels the library runs
 * for them): (kv_len, q_len) x count
 *   decode   (8192, 1) x 128
 *   prefill  (4096, 128) x 4
 *   hybrid   (600, 1) x 122 + (10000, 17) x 8
 *   chunked  (8192, 1) x 254 + (2048, 512) x 1
 * 32/8 heads, d 128, bf16, paged (page 16, NHD, pages drawn at random from an
 * 8 GiB pool of random values, none twice in a batch), causal (each request's queries are its last
 * q_len tokens), no LSE. FlashInfer's BatchAttention runs the same mixes in
 * tests/gpu/bench_flashinfer.py.
 *
 * Timing: a CUDA graph of one run, replayed; device events around each
 * replay, median of >= 30 after warm-up. Bytes = Q + K + V (once per KV
 * head) + O; FLOPs = 4 H_qo D x visible (query, key) pairs.
 *
 *   build/bench_mixed [--json FILE] [--reps N] [--mix NAME] [--schedule] [--workers N]
 *                     [--device-table] [--same-pages] [--trace FILE]
 *
 * --same-pages: every request reads the first request's pages (a
 * diagnostic: its K/V from L2 where they fit, what DRAM costs the kernels;
 * the requests of a group must not be longer than the first).
 * --trace FILE: with FLASHINFER_CUDA_DEFINES=-DFI_TRACE=65536 (the
 * persistent kernel, or for a prefill-only batch the standalone
 * tensor-core one, records each item's start and end), one eager run per
 * mix traced: CSV rows (mix, worker, KV head, SM, item, rows, k0, k1, start
 * ns, end ns) appended to FILE and a summary printed (trace_run).
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
 * decode-1x32768 (to trace them; bench_decode times them over several
 * plans), and a short prefill, prefill-32x1024 (32 requests of 1024
 * queries over their 1024 keys: bench_prefill's short cells, to trace).
 */
#include "flashinfer.h"
#include "gpu_util.h"
#include "../util.h"
#include "core/internal.h" /* --schedule reads the plan's schedule */
#include "cuda/cuda_backend.h" /* --trace finds the kernel's module */

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
           name, s->num_items, s->num_workers, plan->split_workers, s->kv_chunk,
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

/* --trace: one eager run of a build with FLASHINFER_CUDA_DEFINES=-DFI_TRACE=N
 * (the persistent kernel, or the standalone tensor-core one, keeps a record
 * per (item, KV head): worker, head, SM, start and end; work.cuh). Writes the records as CSV and prints where the run's
 * time went: the makespan, how busy the CTA slots were, the items per
 * kind, and how many records had ended by each tenth of the makespan. */
static int trace_run(fi_plan *plan, const fi_run_args *a, gu_stream s, const char *name,
                     FILE *csv) {
    const fi_cuda_plan *ps = plan->backend_state;
    void *mod = NULL;
    if (fi_plan_run(plan, a) || GU(gu.CtxSynchronize())) return 1; /* loads the kernel */
    /* the persistent kernel's form, or (a prefill-only batch) the
     * standalone tensor-core kernel */
    const CUfunction fn = ps->last_form ? ps->last_form : ps->attn_tc;
    for (const fi_cuda_module *m = ps->cc->modules; m; m = m->next)
        if (fn && m->function == fn) mod = m->module;
    gu_ptr rec = 0, cnt = 0;
    size_t rb = 0, cb = 0;
    if (!mod || gu.ModuleGetGlobal(&rec, &rb, mod, "fi_trace") ||
        gu.ModuleGetGlobal(&cnt, &cb, mod, "fi_trace_count")) {
        printf("--trace %s: no traced kernel ran (build it with "
               "FLASHINFER_CUDA_DEFINES=-DFI_TRACE=65536)\n", name);
        return 1;
    }
    if (GU(gu.MemsetD8(cnt, 0, 4)) || fi_plan_run(plan, a) || GU(gu.StreamSynchronize(s))) return 1;
    uint32_t n = 0;
    if (GU(gu.DtoH(&n, cnt, 4))) return 1;
    if ((size_t)n * 32 > rb) n = (uint32_t)(rb / 32);
    uint64_t *r = malloc((size_t)n * 32 + 32);
    if (!r || GU(gu.DtoH(r, rec, (size_t)n * 32))) {
        free(r);
        return 1;
    }
    uint64_t t0 = UINT64_MAX, t1 = 0;
    for (uint32_t i = 0; i < n; i++) {
        t0 = r[4 * i + 2] < t0 ? r[4 * i + 2] : t0;
        t1 = r[4 * i + 3] > t1 ? r[4 * i + 3] : t1;
    }
    const fi_schedule *sc = &plan->schedule;
    double busy = 0, wide_ns = 0, wide_tiles = 0, dec_ns = 0;
    int nwide = 0, ndec = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint64_t *x = r + 4 * i;
        int w = (int)(x[0] >> 32), h = (int)(x[0] >> 16 & 0xffff), sm = (int)(x[0] & 0xffff);
        int item = (int)(x[1] >> 32), rows = (int)(x[1] & 0xffffffff);
        const fi_work_item *it = &sc->items[item];
        double d = (double)(x[3] - x[2]);
        busy += d;
        if (rows > FI_CUDA_DTC_MAX_ROWS) { /* the 128-row path's items, in 64-key tiles */
            nwide++, wide_ns += d;
            wide_tiles += (it->kv_end - it->kv_start + 63) / 64;
        } else {
            ndec++, dec_ns += d;
        }
        if (csv)
            fprintf(csv, "%s,%d,%d,%d,%d,%d,%d,%d,%.0f,%.0f\n", name, w, h, sm, item, rows,
                    (int)it->kv_start, (int)it->kv_end, (double)(x[2] - t0), (double)(x[3] - t0));
    }
    double span = (double)(t1 - t0);
    int slots = ps->cc->sm_count * ps->blocks_per_sm;
    printf("trace %s: %u records, first start to last end %.1f us; slots busy %.0f%% (%d slots); "
           "wide items %d: %.1f us each, %.2f us per 64-key tile; small items %d: %.1f us each\n",
           name, n, span * 1e-3, 100.0 * busy / (span * slots), slots, nwide,
           nwide ? wide_ns / nwide * 1e-3 : 0.0, wide_tiles > 0 ? wide_ns / wide_tiles * 1e-3 : 0.0,
           ndec, ndec ? dec_ns / ndec * 1e-3 : 0.0);
    /* the end time of each 10% of the records, by end */
    printf("trace %s: records ended by (us):", name);
    for (int q = 1; q <= 10; q++) {
        uint64_t lim = t0 + (uint64_t)(span * q / 10);
        int c = 0;
        for (uint32_t i = 0; i < n; i++) c += r[4 * i + 3] <= lim;
        printf(" %.0f:%d", span * q / 10 * 1e-3, c);
    }
    printf("\n");
    free(r);
    return 0;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    const char *json = NULL, *only = NULL, *trace = NULL;
    int reps = 30, schedule = 0, workers = 0, dtable = 0, same_pages = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mix") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--schedule")) schedule = 1;
        else if (!strcmp(argv[i], "--workers") && i + 1 < argc) workers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--device-table")) dtable = 1;
        else if (!strcmp(argv[i], "--same-pages")) same_pages = 1;
        else if (!strcmp(argv[i], "--trace") && i + 1 < argc) trace = argv[++i];
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
        if (trace) {
            FILE *tf = fopen(trace, "a");
            int bad = trace_run(plan, &a, bench.s, m->name, tf);
            if (tf) fclose(tf);
            if (bad) return 1;
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
