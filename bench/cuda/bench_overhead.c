/*
 * bench_overhead.c — the host cost of one decode step on the CUDA backend:
 * fi_plan_update + fi_plan_run for 256 requests (issue 4's target: < 20 us),
 * and the same step as a CUDA graph replayed after each fi_plan_update.
 * 32/8 heads, d 128, bf16, page 16, random pages; kv_len 1024 and 4096.
 *
 * Each of 300 steps (after 20 warm-up steps): host clock around
 * fi_plan_update, around fi_plan_run (launches only: the stream is drained
 * after the clock stops, by a blocking cuStreamSynchronize, and again with
 * the thread polling cuStreamQuery instead, so that it never sleeps
 * between steps), and around fi_plan_update + cuGraphLaunch of a
 * graph captured once around fi_plan_run; medians. Each with the page table
 * in host memory (fi_plan_update: validated and copied with the metadata)
 * and in device memory (a plan with fi_plan_config.device_page_table: the
 * host never reads it). The four cells run --rounds times (default 3), one
 * round after the other; a cell's number is the median of its rounds'
 * medians (each round's update + run is printed too).
 * For scale, the same
 * fi_plan_update on a CPU context with the same worker count (the
 * backend-independent part: validation and the schedule), and the device
 * time of the replayed step. Then what the driver calls of a step cost
 * here (the CUDA backend's update makes ~5, its run 2), and what a memcpy
 * into pinned memory costs when a copy has just read it (as staging is
 * rewritten every step), plain and write-combined: medians of 1000.
 *
 *   build/bench_overhead [--json FILE] [--steps N] [--rounds N]
 */
#include "flashinfer.h"
#include "../../tests/gpu/gpu_util.h"
#include "../../tests/util.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* POOL: kv 4096's pages, a batch never holding a page twice (gu_draw_pages) */
enum { B = 256, HQ = 32, HKV = 8, D = 128, PS = 16, POOL = 65536 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One step's update: the host table (dt = 0) or the device one (dt = 1, a
 * plan made with device_page_table). */
static int update(fi_plan *plan, const fi_batch *host, const fi_batch *dev, int dt) {
    return fi_plan_update(plan, dt ? dev : host) != FI_OK;
}

static float median(float *v, int n) {
    qsort(v, (size_t)n, sizeof v[0], gu_cmp_float);
    return v[n / 2];
}

enum { NCALL = 1000, MAX_ROUNDS = 9 };

/* Median host time (us) of one call of `what` on stream s (drained after
 * each call, outside the clock). */
static float call_us(int what, gu_stream s, gu_event ev, void *pinned, void *wc, void *host,
                     gu_ptr dev, size_t bytes) {
    static float t[NCALL];
    for (int i = 0; i < NCALL; i++) {
        int cap = 0, r = 0;
        gu_ctx popped;
        /* 6, 7: the buffer was just the source of a copy, as staging is
         * when fi_plan_update rewrites it */
        if (what >= 6 && (GU(gu.HtoDAsync(dev, what == 6 ? pinned : wc, bytes, s)) ||
                          GU(gu.StreamSynchronize(s))))
            return -1;
        double t0 = now();
        switch (what) {
        case 0: r = gu.StreamIsCapturing(s, &cap); break;
        case 1: r = gu.CtxPushCurrent(gu_primary) || gu.CtxPopCurrent(&popped); break;
        case 2: r = gu.EventRecord(ev, s); break;
        case 3: r = gu.EventSynchronize(ev); break; /* recorded and complete */
        case 4: memcpy(pinned, host, bytes); break;
        case 5: r = gu.HtoDAsync(dev, pinned, bytes, s); break;
        case 6: memcpy(pinned, host, bytes); break;
        default: memcpy(wc, host, bytes); break;
        }
        t[i] = (float)(1e6 * (now() - t0));
        if (r || gu.StreamSynchronize(s)) return -1;
    }
    return median(t, NCALL);
}

static int driver_costs(gu_stream s, FILE *jf) {
    gu_event ev = NULL;
    void *pinned = NULL, *wc = NULL;
    gu_ptr dev = 0;
    size_t maxb = (size_t)B * 256 * 4; /* the page table of 256 x 4096 keys */
    char *host = malloc(maxb);
    if (!host || GU(gu.EventCreate(&ev, 2 /* no timing */)) || GU(gu.MemAllocHost(&pinned, maxb)) ||
        GU(gu.MemHostAlloc(&wc, maxb, 4 /* CU_MEMHOSTALLOC_WRITECOMBINED */)) ||
        GU(gu.MemAlloc(&dev, maxb)) || GU(gu.EventRecord(ev, s)) || GU(gu.StreamSynchronize(s)))
        return 1;
    memset(host, 1, maxb);
    static const char *names[] = {"cuStreamIsCapturing", "cuCtxPushCurrent + cuCtxPopCurrent",
                                  "cuEventRecord", "cuEventSynchronize (complete)",
                                  "memcpy to pinned", "cuMemcpyHtoDAsync from pinned",
                                  "memcpy to pinned just copied from",
                                  "memcpy to write-combined pinned just copied from"};
    printf("\n| call | bytes | us |\n|---|---|---|\n");
    for (int w = 0; w < 8; w++)
        for (size_t bytes = maxb / 4; bytes <= (w >= 4 ? maxb : maxb / 4); bytes *= 4) {
            float us = call_us(w, s, ev, pinned, wc, host, dev, bytes);
            if (w >= 4) printf("| %s | %zu | %.2f |\n", names[w], bytes, us);
            else printf("| %s | - | %.2f |\n", names[w], us);
            if (jf)
                fprintf(jf, "{\"workload\":\"driver_call\",\"call\":\"%s\",\"bytes\":%zu,"
                        "\"us\":%.3f}\n", names[w], w >= 4 ? bytes : 0, us);
        }
    gu.MemFreeHost(pinned);
    gu.MemFreeHost(wc);
    gu.MemFree(dev);
    free(host);
    return 0;
}

/* One cell's medians (us): eager update, run, update + run; the same with
 * a spinning wait; update + graph launch; the CPU-context update; the
 * step's device time. */
typedef struct cell_times {
    float upd, run, both, spin_both, spin_upd, graph, cpu_upd, gpu;
    int items, split, workers;
} cell_times;

/* The fixed parts of a run: gu_bench's context, stream, events and
 * tensors; the CPU context; the parameters and run arguments. */
typedef struct bench_env {
    const gu_bench *bench;
    fi_context *cpu;
    fi_attention_params p;
    fi_run_args a;
} bench_env;

/* Times one cell: `steps` steps of each loop after 20 warm-up steps. Every
 * error path frees what was made (the `done` label). */
static int measure_cell(const bench_env *env, const fi_batch *fb, const fi_batch *fdev,
                        int32_t pages, int dt, int steps, cell_times *out) {
    int rc = 1;
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    cfg.max_batch_size = B, cfg.max_total_qo = B, cfg.max_total_kv = pages;
    cfg.device_page_table = dt;
    fi_plan *plan = NULL, *cplan = NULL;
    gu_graph g = NULL;
    gu_exec ex = NULL;
    float *upd = malloc(4 * (size_t)steps), *run = malloc(4 * (size_t)steps);
    float *both = malloc(4 * (size_t)steps), *graph = malloc(4 * (size_t)steps);
    float *cupd = malloc(4 * (size_t)steps), *dev = malloc(4 * (size_t)steps);
    if (!upd || !run || !both || !graph || !cupd || !dev) goto done;
    if (fi_plan_create(env->bench->ctx, &env->p, &cfg, &plan) || update(plan, fb, fdev, dt)) {
        printf("plan: %s\n", fi_last_error());
        goto done;
    }
    fi_plan_info info = {.struct_size = sizeof info};
    fi_plan_get_info(plan, &info);
    fi_plan_config ccfg = cfg;
    ccfg.num_workers = info.num_workers;
    if (fi_plan_create(env->cpu, &env->p, &ccfg, &cplan)) goto done;
    const fi_run_args *a = &env->a;
    gu_stream s = env->bench->s;
    gu_event e0 = env->bench->e0, e1 = env->bench->e1;
    /* eager: update, run; then the step is waited for by a blocking
     * cuStreamSynchronize (spin = 0), or by polling cuStreamQuery
     * (spin = 1: the thread stays on its core, as a serving loop that
     * spins on the step's results) */
    for (int spin = 0; spin < 2; spin++) {
        for (int t = -20; t < steps; t++) {
            double t0 = now();
            int bad = update(plan, fb, fdev, dt);
            double t1 = now();
            bad |= fi_plan_run(plan, a) != FI_OK;
            double t2 = now();
            int r = 0;
            if (spin)
                while ((r = gu.StreamQuery(s)) == 600 /* CUDA_ERROR_NOT_READY */) continue;
            else
                r = gu.StreamSynchronize(s);
            if (bad || GU(r)) {
                printf("step: %s\n", fi_last_error());
                goto done;
            }
            if (t >= 0) upd[t] = (float)(1e6 * (t1 - t0)), run[t] = (float)(1e6 * (t2 - t1)),
                        both[t] = (float)(1e6 * (t2 - t0));
        }
        if (spin) out->spin_both = median(both, steps), out->spin_upd = median(upd, steps);
        else out->upd = median(upd, steps), out->run = median(run, steps), out->both = median(both, steps);
    }
    GU(gu.BeginCapture(s, 0));
    fi_plan_run(plan, a);
    if (GU(gu.EndCapture(s, &g)) || GU(gu.GraphInstantiate(&ex, g, 0))) goto done;
    for (int t = -20; t < steps; t++) { /* graph: update, replay */
        double t0 = now();
        int bad = update(plan, fb, fdev, dt);
        bad |= GU(gu.EventRecord(e0, s)) || GU(gu.GraphLaunch(ex, s));
        double t1 = now();
        bad |= GU(gu.EventRecord(e1, s)) || GU(gu.EventSynchronize(e1));
        if (bad) goto done;
        if (t >= 0) {
            graph[t] = (float)(1e6 * (t1 - t0));
            GU(gu.EventElapsedTime(&dev[t], e0, e1));
            dev[t] *= 1e3f;
        }
    }
    for (int t = -20; t < steps; t++) { /* the same update on a CPU context */
        double t0 = now();
        if (update(cplan, fb, fb, dt)) goto done; /* CPU: device memory is host memory */
        if (t >= 0) cupd[t] = (float)(1e6 * (now() - t0));
    }
    out->graph = median(graph, steps), out->cpu_upd = median(cupd, steps);
    out->gpu = median(dev, steps);
    out->items = info.num_items, out->split = info.num_split_items, out->workers = info.num_workers;
    rc = 0;
done:
    free(upd), free(run), free(both), free(graph), free(cupd), free(dev);
    if (ex) gu.GraphExecDestroy(ex);
    if (g) gu.GraphDestroy(g);
    fi_plan_destroy(plan);
    fi_plan_destroy(cplan);
    return rc;
}

/* The median over rounds of one field (offset into cell_times). */
static float over_rounds(const cell_times *r, int rounds, size_t off) {
    float v[MAX_ROUNDS];
    for (int i = 0; i < rounds; i++) v[i] = *(const float *)((const char *)&r[i] + off);
    return median(v, rounds);
}

int main(int argc, char **argv) {
    const char *json = NULL;
    int steps = 300, rounds = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
    }
    if (steps < 30) steps = 30;
    if (rounds < 1) rounds = 1;
    if (rounds > MAX_ROUNDS) rounds = MAX_ROUNDS;
    gu_bench bench;
    int st = gu_bench_init(&bench, (size_t)B * HQ * D * 2, (size_t)POOL * PS * HKV * D * 2, 99,
                           "decode step of 256 requests");
    if (st) return st < 0;
    bench_env env;
    memset(&env, 0, sizeof env);
    env.bench = &bench;
    fi_context_options opt;
    fi_context_options_init(&opt);
    opt.num_threads = 1;
    if (fi_context_create(&opt, &env.cpu)) return 1;
    env.p = gu_bench_params(HQ, HKV, D, PS);
    int64_t ks[4] = {POOL, PS, HKV, D}, qs[3] = {B, HQ, D};
    env.a.q = fi_tensor_contiguous((void *)(uintptr_t)bench.q, FI_DTYPE_BF16, 3, qs);
    env.a.o = fi_tensor_contiguous((void *)(uintptr_t)bench.o, FI_DTYPE_BF16, 3, qs);
    env.a.k = fi_tensor_contiguous((void *)(uintptr_t)bench.k, FI_DTYPE_BF16, 4, ks);
    env.a.v = fi_tensor_contiguous((void *)(uintptr_t)bench.v, FI_DTYPE_BF16, 4, ks);
    env.a.stream = bench.s;
    /* the two batches (kv 1024, 4096), each with its page table in host
     * and in device memory */
    static const int lens[] = {1024, 4096};
    gu_batch b[2];
    fi_batch fb[2], fdev[2];
    gu_ptr dtab[2] = {0, 0};
    for (int li = 0; li < 2; li++) {
        int32_t qo[B], kv[B];
        for (int i = 0; i < B; i++) qo[i] = 1, kv[i] = lens[li];
        if (gu_batch_make(&b[li], B, qo, kv, PS, POOL, 0, &bench.rng)) return 1;
        fb[li] = fdev[li] = gu_batch_view(&b[li]);
        if (GU(gu.MemAlloc(&dtab[li], (size_t)b[li].pages * 4)) ||
            GU(gu.HtoD(dtab[li], fb[li].kv_indices, (size_t)b[li].pages * 4)))
            return 1;
        fdev[li].kv_indices = (const int32_t *)(uintptr_t)dtab[li];
    }
    /* every cell once per round, the rounds one after another: a host
     * that runs slower for a while (lent machines ran a whole first
     * second at half speed) moves one round, not one cell */
    static cell_times res[2][2][MAX_ROUNDS];
    for (int r = 0; r < rounds; r++)
        for (int li = 0; li < 2; li++)
            for (int dt = 0; dt < 2; dt++)
                if (measure_cell(&env, &fb[li], &fdev[li], b[li].pages, dt, steps, &res[li][dt][r]))
                    return 1;
    FILE *jf = json ? fopen(json, "w") : NULL;
    char table[4096];
    int tl = snprintf(table, sizeof table,
                      "| kv_len | page table | update (us) | run (us) | update + run (us) | update + run, "
                      "spin-wait (us) | update + graph launch (us) | update, CPU context (us) | "
                      "step on the GPU (us) |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int li = 0; li < 2; li++)
        for (int dt = 0; dt < 2; dt++) {
            const cell_times *rs = res[li][dt];
#define MED(field) over_rounds(rs, rounds, offsetof(cell_times, field))
            const float mu = MED(upd), mr = MED(run), mb = MED(both), sb = MED(spin_both),
                        su = MED(spin_upd), mg = MED(graph), mc = MED(cpu_upd), md = MED(gpu);
#undef MED
            const char *where = dt ? "device" : "host";
            printf("decode %d x %d, %s page table (%d items, %d split, %d workers): update %.1f us, "
                   "run %.1f us, update + run %.1f us (spin-wait: %.1f, update %.1f), update + graph "
                   "launch %.1f us; CPU-context update %.1f us; GPU step %.1f us; update + run per "
                   "round:",
                   B, lens[li], where, rs[0].items, rs[0].split, rs[0].workers, mu, mr, mb, sb, su, mg,
                   mc, md);
            for (int r = 0; r < rounds; r++) printf(" %.1f", rs[r].both);
            printf("\n");
            tl += snprintf(table + tl, sizeof table - (size_t)tl,
                           "| %d | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", lens[li],
                           where, mu, mr, mb, sb, mg, mc, md);
            if (jf)
                fprintf(jf,
                        "{\"workload\":\"overhead\",\"page_table\":\"%s\",\"batch\":%d,\"kv_len\":%d,\"items\":%d,"
                        "\"update_us\":%.2f,\"run_us\":%.2f,\"update_run_us\":%.2f,"
                        "\"update_run_spin_us\":%.2f,\"update_spin_us\":%.2f,"
                        "\"update_graph_us\":%.2f,\"update_cpu_ctx_us\":%.2f,\"gpu_step_us\":%.2f,"
                        "\"steps\":%d,\"rounds\":%d}\n",
                        where, B, lens[li], rs[0].items, mu, mr, mb, sb, su, mg, mc, md, steps, rounds);
        }
    for (int li = 0; li < 2; li++) gu.MemFree(dtab[li]), gu_batch_free(&b[li]);
    printf("\n%s", table);
    if (driver_costs(bench.s, jf)) return 1;
    if (jf) fclose(jf);
    fi_context_destroy(bench.ctx);
    fi_context_destroy(env.cpu);
    return 0;
}
