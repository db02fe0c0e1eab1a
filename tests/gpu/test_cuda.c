/*
 * test_cuda.c — CUDA-only checks that the attention harness
 * (tests/test_attention.c, which covers formats x variants x dtypes on every
 * backend) does not make. Runs on the GPU machine (tests/gpu/run_device.sh).
 *
 *   jit     one configuration compiled cold by NVRTC into an empty disk
 *           cache, then loaded warm from it by a fresh context (both with
 *           FLASHINFER_AOT=0), then from the library's AOT table: the times
 *   graph   a CUDA graph captured around fi_plan_run on a non-blocking
 *           stream, replayed after fi_plan_update with other batches within
 *           the plan's bounds (decode, mixed, one long split request,
 *           prefill-heavy, prefill only), each twice: every replay matches
 *           the fp64 oracle, and bitwise the eager run of the same batch
 *           where both take the same kernel;
 *           with the persistent kernel (one launch, fused merge: its decode
 *           form captured on the decode batch, replaying the wide items of
 *           the mixed batches in 16-row slices; eager, the mixed batch takes
 *           the 64-row-block full form, the prefill-heavy one the 128-row;
 *           and captured on the prefill-only batch, whose run takes the
 *           separate kernels, eager or captured), without the decode form
 *           (FLASHINFER_CUDA_KERNELS=full-form), the separate kernels
 *           (FLASHINFER_CUDA_KERNELS=separate), and with each batch's page table
 *           in its own device buffer
 *           (fi_plan_config.device_page_table): a replay reads the table
 *           of the latest update, wherever it lives
 *   table   device page tables: bitwise a host-table plan's runs; ids out of
 *           range (negative, past the cache) clamped, the other requests'
 *           rows bitwise unchanged; a host address or a range past its
 *           allocation refused. `test_cuda --table` runs only this (for
 *           compute-sanitizer memcheck: the clamped ids stay in the cache)
 *   merge   one decode split into 8, 16, 21, 32, 33 and 47 chunks
 *           (fi_plan_config.fixed_split_size), so the merge's rounds of up
 *           to 32 sources take every path of its loop (32, 16 and 8 at a
 *           time): each against the oracle, in the persistent kernel's
 *           fused merge and in the separate merge kernel
 *   chain   runs that feed each other on one stream, no host wait between
 *           (run k's query is run k - 1's output): with programmatic
 *           dependent launch (sm_90 on) each run waits in the kernel for the
 *           one before; every step against the oracle, on the persistent
 *           kernel and the separate kernels
 *   steps   a serving loop with no host wait: update, run, update, run on
 *           one stream behind a slow memset, each run into its own
 *           output, some steps updated twice with no run between (the
 *           upload's staging is rewritten while earlier steps are queued:
 *           after the word the kernels write, or the copy's event); every
 *           step against the oracle, on the persistent kernel and the
 *           separate kernels
 *   device  device_id out of range gives FI_STATUS_NO_DEVICE; with two or
 *           more GPUs, tensors on device 1 and a context of device_id 1: the
 *           graph test's five batches, eager, against the oracle
 */
#include "flashinfer.h"
#include "cuda/cuda_backend.h"
#include "gpu_util.h"
#include "../oracle.h"
#include "../util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { HQ = 8, HKV = 2, D = 128, PS = 16, POOL = 512, MAXB = 8, MAXQ = 64 };


static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static fi_attention_params make_params(void) {
    fi_attention_params p;
    fi_attention_params_init(&p);
    p.num_qo_heads = HQ;
    p.num_kv_heads = HKV;
    p.head_dim_qk = p.head_dim_vo = D;
    p.page_size = PS;
    p.q_dtype = p.kv_dtype = p.o_dtype = FI_DTYPE_BF16;
    return p;
}

/* --------------------------------------------------------------- jit */

static void test_jit(void) {
    fi_attention_params p = make_params();
    p.mask_mode = FI_MASK_CAUSAL; /* a configuration of its own */
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    double ms[3] = {0, 0, 0};
    /* passes 0, 1: NVRTC (the AOT table bypassed), cold then warm; pass 2:
     * the library's AOT table, where it was built with one */
    for (int pass = 0; pass < 3; pass++) {
        fi_context_options opt;
        fi_context_options_init(&opt);
        opt.device = FI_DEVICE_CUDA;
        fi_context *ctx = NULL;
        fi_plan *plan = NULL;
        if (pass < 2) setenv("FLASHINFER_AOT", "0", 1);
        CHECK(fi_context_create(&opt, &ctx) == FI_OK, "context");
        unsetenv("FLASHINFER_AOT");
        if (!ctx) return;
        double t0 = now();
        CHECK(fi_plan_create(ctx, &p, &cfg, &plan) == FI_OK, "plan create");
        ms[pass] = 1e3 * (now() - t0);
        fi_cuda_jit_stats s = fi_cuda_jit_get_stats(ctx);
        if (pass == 0)
            printf("jit: cold: %d kernels compiled by NVRTC in %.1f ms (plan create %.1f ms)\n",
                   s.compiled, 1e3 * s.compile_seconds, ms[0]);
        else if (pass == 1)
            printf("jit: warm: %d kernels loaded from the disk cache in %.2f ms (plan create "
                   "%.2f ms), %d compiled\n",
                   s.disk_loads, 1e3 * s.disk_load_seconds, ms[1], s.compiled);
        else
            printf("jit: AOT: %d kernels loaded from the library's table in %.2f ms (plan create "
                   "%.2f ms; %d kernels in the table)\n",
                   s.aot_loads, 1e3 * s.aot_load_seconds, ms[2], fi_cuda_aot_count());
        /* the plan's table: at most one kernel per form (select.c) */
        if (pass == 1)
            CHECK(s.compiled == 0 && s.disk_loads >= 1 && s.disk_loads <= FI_CUDA_FORM_COUNT,
                  "warm pass should only load");
        if (pass == 2 && fi_cuda_aot_count() > 0) /* bf16 d 128 group 4 causal paged: in the set */
            CHECK(s.compiled == 0 && s.disk_loads == 0 && s.aot_loads >= 1,
                  "the AOT pass should take every kernel from the table");
        fi_plan_destroy(plan);
        fi_context_destroy(ctx);
    }
}

/* ------------------------------------------------------------- graph */

typedef struct batch {
    int32_t n, qo[MAXB], kv[MAXB];
    int32_t qo_indptr[MAXB + 1], kv_indptr[MAXB + 1], last[MAXB], indices[POOL];
    fi_batch view;
    gu_ptr table; /* the page table on the device (device-table modes) */
} batch;

/* The batch's page table into its own device buffer. */
static int upload_table(batch *b) {
    size_t n = (size_t)b->kv_indptr[b->n] * 4;
    return GU(gu.MemAlloc(&b->table, n ? n : 4)) || (n && GU(gu.HtoD(b->table, b->indices, n)));
}

/* fi_plan_update with the batch's page table in host memory, or (a plan
 * with device_page_table) b->table. */
static fi_status update(fi_plan *plan, const batch *b, int device_table) {
    if (!device_table) return fi_plan_update(plan, &b->view);
    fi_batch v = b->view;
    v.kv_indices = (const int32_t *)(uintptr_t)b->table;
    return fi_plan_update(plan, &v);
}

static void make_batch(batch *b, int n, const int32_t *qo, const int32_t *kv, tu_rng *rng) {
    memset(b, 0, sizeof *b);
    b->n = n;
    int32_t perm[POOL];
    for (int i = 0; i < POOL; i++) perm[i] = i;
    for (int i = POOL - 1; i > 0; i--) {
        int j = tu_rng_int(rng, 0, i), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int used = 0;
    for (int i = 0; i < n; i++) {
        b->qo[i] = qo[i], b->kv[i] = kv[i];
        int pages = (kv[i] + PS - 1) / PS;
        b->qo_indptr[i + 1] = b->qo_indptr[i] + qo[i];
        b->kv_indptr[i + 1] = b->kv_indptr[i] + pages;
        b->last[i] = pages ? kv[i] - PS * (pages - 1) : 0;
        for (int j = 0; j < pages; j++) b->indices[used + j] = perm[used + j];
        used += pages;
    }
    b->view = (fi_batch){n, b->qo_indptr, b->kv_indptr, b->indices, b->last, NULL};
}

typedef struct bufs {
    tu_buf q, k, v;            /* host */
    gu_ptr dq, dk, dv, do_, dl;/* device */
    size_t qb, kb, ob, lb;
} bufs;

static int bufs_init(bufs *B, tu_rng *rng) {
    int64_t qs[3] = {MAXQ, HQ, D}, ks[4] = {POOL, PS, HKV, D};
    if (tu_buf_alloc(&B->q, FI_DTYPE_BF16, 3, qs) || tu_buf_alloc(&B->k, FI_DTYPE_BF16, 4, ks) ||
        tu_buf_alloc(&B->v, FI_DTYPE_BF16, 4, ks))
        return -1;
    tu_fill_uniform(rng, &B->k.t, -1, 1, 0);
    tu_fill_uniform(rng, &B->v.t, -1, 1, 0);
    B->qb = B->q.bytes, B->kb = B->k.bytes, B->ob = B->q.bytes, B->lb = MAXQ * HQ * 4;
    if (GU(gu.MemAlloc(&B->dq, B->qb)) || GU(gu.MemAlloc(&B->dk, B->kb)) ||
        GU(gu.MemAlloc(&B->dv, B->kb)) || GU(gu.MemAlloc(&B->do_, B->ob)) ||
        GU(gu.MemAlloc(&B->dl, B->lb)) || GU(gu.HtoD(B->dk, B->k.base, B->kb)) ||
        GU(gu.HtoD(B->dv, B->v.base, B->kb)))
        return -1;
    return 0;
}

/* What bufs_init allocated (in the context current then). */
static void bufs_free(bufs *B) {
    gu_ptr *dev[] = {&B->dq, &B->dk, &B->dv, &B->do_, &B->dl};
    for (int i = 0; i < 5; i++)
        if (*dev[i]) gu.MemFree(*dev[i]), *dev[i] = 0;
    tu_buf_free(&B->q), tu_buf_free(&B->k), tu_buf_free(&B->v);
}

static fi_run_args run_args(const bufs *B, gu_stream s) {
    fi_run_args a;
    memset(&a, 0, sizeof a);
    int64_t qs[3] = {MAXQ, HQ, D}, ks[4] = {POOL, PS, HKV, D}, ls[2] = {MAXQ, HQ};
    a.q = fi_tensor_contiguous((void *)(uintptr_t)B->dq, FI_DTYPE_BF16, 3, qs);
    a.k = fi_tensor_contiguous((void *)(uintptr_t)B->dk, FI_DTYPE_BF16, 4, ks);
    a.v = fi_tensor_contiguous((void *)(uintptr_t)B->dv, FI_DTYPE_BF16, 4, ks);
    a.o = fi_tensor_contiguous((void *)(uintptr_t)B->do_, FI_DTYPE_BF16, 3, qs);
    a.lse = fi_tensor_contiguous((void *)(uintptr_t)B->dl, FI_DTYPE_F32, 2, ls);
    a.stream = s;
    return a;
}

/* Fresh q for batch b; poisoned outputs. */
static void prepare(bufs *B, const batch *b, tu_rng *rng) {
    tu_fill_uniform(rng, &B->q.t, -1, 1, 0);
    GU(gu.HtoD(B->dq, B->q.base, B->qb));
    GU(gu.MemsetD8(B->do_, 0xff, B->ob));
    GU(gu.MemsetD8(B->dl, 0xff, B->lb));
    GU(gu.CtxSynchronize()); /* the legacy stream does not order `s` */
    (void)b;
}

/* Download O, LSE; compare with the oracle. Returns the raw O bytes. */
static void check_oracle(const char *what, bufs *B, const batch *b, uint16_t *o_bits) {
    fi_attention_params p = make_params();
    int nq = b->qo_indptr[b->n];
    float *lse = malloc((size_t)nq * HQ * 4);
    double *ref = malloc((size_t)nq * HQ * D * 8), *got = malloc((size_t)nq * HQ * D * 8);
    double *lref = malloc((size_t)nq * HQ * 8), *lgot = malloc((size_t)nq * HQ * 8);
    GU(gu.CtxSynchronize());
    GU(gu.DtoH(o_bits, B->do_, (size_t)nq * HQ * D * 2));
    GU(gu.DtoH(lse, B->dl, (size_t)nq * HQ * 4));
    oracle_attention(&p, &b->view, &B->q.t, &B->k.t, &B->v.t, NULL, ref, lref);
    for (int64_t i = 0; i < (int64_t)nq * HQ * D; i++) got[i] = tu_load(o_bits, FI_DTYPE_BF16, i);
    for (int64_t i = 0; i < (int64_t)nq * HQ; i++) lgot[i] = lse[i];
    tu_cmp c, cl;
    int64_t bad = tu_compare(got, ref, (int64_t)nq * HQ * D, 1e-2, 2e-2, &c);
    int64_t badl = tu_compare(lgot, lref, (int64_t)nq * HQ, 1e-3, 1e-3, &cl);
    printf("graph: %-34s O max err %.2e, LSE max err %.2e: %s\n", what, c.max_abs_err,
           cl.max_abs_err, bad || badl ? "FAIL" : "ok");
    CHECK(!bad && !badl, "%s: %lld O and %lld LSE values off (worst O %g vs %g)", what,
          (long long)bad, (long long)badl, c.worst_got, c.worst_ref);
    free(lse), free(ref), free(got), free(lref), free(lgot);
}

/* The kernel the plan's last run launched: a form of the persistent kernel
 * (decode, full, or full with 64-row blocks for mostly-decode mixes), or
 * NULL for the separate kernels. A graph replays the form it captured,
 * bitwise the eager run of a batch that takes the same form (another form's
 * arithmetic differs: e.g. a decode-form graph runs wide items in 16-row
 * slices). */
static CUfunction last_form(const fi_plan *plan) {
    return ((const fi_cuda_plan *)plan->backend_state)->last_form;
}

/* A CUDA context and the buffers of bufs_init; NULL (counted) on failure. */
static fi_context *open_cuda(bufs *B, tu_rng *rng) {
    fi_context_options opt;
    fi_context_options_init(&opt);
    opt.device = FI_DEVICE_CUDA;
    fi_context *ctx = NULL;
    CHECK(fi_context_create(&opt, &ctx) == FI_OK, "context");
    if (!ctx) return NULL;
    memset(B, 0, sizeof *B);
    if (bufs_init(B, rng)) {
        CHECK(0, "buffers");
        return NULL;
    }
    return ctx;
}

/* A plan of make_params() with the buffers' bounds; device_table: its
 * updates take the page table in device memory. NULL (counted) on failure. */
static fi_plan *bounds_plan(fi_context *ctx, int device_table) {
    fi_attention_params p = make_params();
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    cfg.max_batch_size = MAXB;
    cfg.max_total_qo = MAXQ;
    cfg.max_total_kv = POOL;
    cfg.device_page_table = device_table;
    fi_plan *plan = NULL;
    CHECK(fi_plan_create(ctx, &p, &cfg, &plan) == FI_OK, "%s plan: %s",
          device_table ? "device-table" : "host-table", fi_last_error());
    return plan;
}

/* The batches of the graph and device tests, in this order. The mixed
 * batch's wide item is a small part of its work (the 64-row block full
 * form), the prefill-heavy one's most of it (128-row blocks). */
enum { NB = 5 };
static const char *const names[NB] = {"decode 3 requests", "mixed 5 requests",
                                      "one long request (split)", "prefill-heavy 2 requests",
                                      "prefill only"};
static void make_batches(batch bs[NB], tu_rng *rng) {
    int32_t qa[] = {1, 1, 1}, ka[] = {700, 35, 1500};
    int32_t qb[] = {1, 4, 1, 1, 9}, kb[] = {2000, 40, 300, 17, 640}; /* the last: 10 key tiles on tensor cores */
    int32_t qc[] = {1}, kc[] = {7000};
    int32_t qd[] = {1, 15}, kd[] = {100, 1000};
    int32_t qe[] = {40, 20}, ke[] = {700, 1200}; /* tensor-core items only */
    make_batch(&bs[0], 3, qa, ka, rng);
    make_batch(&bs[1], 5, qb, kb, rng);
    make_batch(&bs[2], 1, qc, kc, rng);
    make_batch(&bs[3], 2, qd, kd, rng);
    make_batch(&bs[4], 2, qe, ke, rng);
}

/* Graph capture and replay across make_batches' batches, captured on batch
 * `first`'s run. */
static void test_graph(const char *mode, int device_table, int first) {
    tu_rng rng;
    tu_rng_seed(&rng, 1234);
    bufs B;
    fi_context *ctx = open_cuda(&B, &rng);
    if (!ctx) return;
    printf("graph (%s): %s\n", mode, fi_context_describe(ctx));
    fi_plan *plan = bounds_plan(ctx, device_table);
    if (!plan) return;

    batch bs[NB];
    make_batches(bs, &rng);
    for (int i = 0; device_table && i < NB; i++) CHECK(!upload_table(&bs[i]), "table %d", i);
    size_t obytes = (size_t)MAXQ * HQ * D * 2;
    uint16_t *eager = malloc(obytes), *replay = malloc(obytes);

    gu_stream s = NULL;
    GU(gu.StreamCreate(&s, 1 /* non-blocking */));
    fi_run_args a = run_args(&B, s);
    gu_exec exec = NULL;
    CUfunction captured = NULL;
    /* The plan's first update goes on the default stream; the graph is
     * captured on `s` after the first batch's eager run. Every batch twice:
     * the fused merge's counts must be back to zero after each replay. */
    for (int round = 0; round < 2 * NB; round++) {
        int i = (first + round) % NB;
        batch *b = &bs[i];
        CHECK(update(plan, b, device_table) == FI_OK, "update %d: %s", i, fi_last_error());
        fi_plan_info info = {.struct_size = sizeof info};
        fi_plan_get_info(plan, &info);
        prepare(&B, b, &rng);
        CHECK(fi_plan_run(plan, &a) == FI_OK, "eager run");
        char what[96];
        snprintf(what, sizeof what, "eager %s (%d items, %d split)", names[i], info.num_items,
                 info.num_split_items);
        check_oracle(what, &B, b, eager);
        CUfunction form = last_form(plan);
        if (!exec) {
            gu_graph g = NULL;
            int r1 = GU(gu.BeginCapture(s, 0));
            CHECK(fi_plan_run(plan, &a) == FI_OK, "captured run");
            int r2 = GU(gu.EndCapture(s, &g));
            CHECK(!r1 && !r2 && g && !GU(gu.GraphInstantiate(&exec, g, 0)), "capture");
            captured = last_form(plan);
            const fi_cuda_plan *ps = plan->backend_state;
            if (i == 4 && ps->prefill_separate)
                CHECK(!captured, "prefill-only capture: not the separate kernels");
            if (g) gu.GraphDestroy(g);
            if (!exec) break;
        }
        GU(gu.MemsetD8(B.do_, 0xff, B.ob));
        GU(gu.MemsetD8(B.dl, 0xff, B.lb));
        GU(gu.CtxSynchronize());
        GU(gu.GraphLaunch(exec, s));
        snprintf(what, sizeof what, "replay %s", names[i]);
        check_oracle(what, &B, b, replay);
        int nq = b->qo_indptr[b->n];
        if (form != captured) {
            printf("graph: replay %s: the other form than its eager run (oracle only)\n", names[i]);
            continue;
        }
        CHECK(!memcmp(eager, replay, (size_t)nq * HQ * D * 2), "replay of %s is not bitwise the "
              "eager run", names[i]);
    }
    if (exec) gu.GraphExecDestroy(exec);
    fi_plan_destroy(plan);
    fi_context_destroy(ctx);
    for (int i = 0; i < NB; i++)
        if (bs[i].table) gu.MemFree(bs[i].table);
    free(eager), free(replay);
}

/* ------------------------------------------------------------- table */

static void test_table(void) {
    tu_rng rng;
    tu_rng_seed(&rng, 99);
    bufs B;
    fi_context *ctx = open_cuda(&B, &rng);
    if (!ctx) return;
    /* a host table's plan, a device table's */
    fi_plan *hplan = bounds_plan(ctx, 0), *plan = bounds_plan(ctx, 1);
    if (!plan || !hplan) return;
    gu_stream s = NULL;
    GU(gu.StreamCreate(&s, 1));
    fi_run_args a = run_args(&B, s);
    size_t obytes = (size_t)MAXQ * HQ * D * 2;
    uint16_t *host = malloc(obytes), *dev = malloc(obytes);
    /* decodes, a split long one, a prefill chunk: every kernel path */
    int32_t q[] = {1, 1, 1, 12, 1}, k[] = {300, 3000, 45, 800, 1};
    batch b;
    make_batch(&b, 5, q, k, &rng);
    CHECK(!upload_table(&b), "table");
    prepare(&B, &b, &rng);
    CHECK(update(hplan, &b, 0) == FI_OK && fi_plan_run(hplan, &a) == FI_OK, "host table run");
    check_oracle("table: host table", &B, &b, host);
    GU(gu.MemsetD8(B.do_, 0xff, B.ob));
    GU(gu.CtxSynchronize());
    CHECK(update(plan, &b, 1) == FI_OK && fi_plan_run(plan, &a) == FI_OK, "device table run: %s",
          fi_last_error());
    check_oracle("table: device table", &B, &b, dev);
    int nq = b.qo_indptr[b.n];
    CHECK(!memcmp(host, dev, (size_t)nq * HQ * D * 2), "device table run not bitwise the host's");

    /* request 1's ids out of range: its rows are some pages' attention
     * (finite), every other row bitwise as before */
    int32_t bad[POOL];
    memcpy(bad, b.indices, sizeof bad);
    for (int j = b.kv_indptr[1]; j < b.kv_indptr[2]; j++) bad[j] = j % 2 ? -7 - j : POOL + 1000 * j;
    GU(gu.HtoD(b.table, bad, (size_t)b.kv_indptr[b.n] * 4));
    GU(gu.MemsetD8(B.do_, 0xff, B.ob));
    GU(gu.CtxSynchronize());
    CHECK(update(plan, &b, 1) == FI_OK && fi_plan_run(plan, &a) == FI_OK, "bad ids run: %s",
          fi_last_error());
    GU(gu.CtxSynchronize());
    GU(gu.DtoH(dev, B.do_, (size_t)nq * HQ * D * 2));
    int finite = 1, same = 1;
    for (int t = 0; t < nq; t++)
        for (int i = 0; i < HQ * D; i++) {
            size_t e = (size_t)t * HQ * D + (size_t)i;
            if (t == b.qo_indptr[1]) finite &= isfinite(tu_load(dev, FI_DTYPE_BF16, (int64_t)e)) != 0;
            else same &= dev[e] == host[e];
        }
    printf("table: ids out of range in request 1: its rows %s, the others %s\n",
           finite ? "finite" : "NOT FINITE", same ? "bitwise unchanged" : "CHANGED");
    CHECK(finite && same, "ids out of range");

    /* refused: a host address, a range past the allocation */
    fi_batch v = b.view;
    fi_status st = fi_plan_update(plan, &v);
    printf("table: host address -> %s: \"%s\"\n", fi_status_string(st), fi_last_error());
    CHECK(st == FI_STATUS_INVALID_ARGUMENT, "host address accepted");
    gu_ptr small = 0;
    GU(gu.MemAlloc(&small, 64));
    v.kv_indices = (const int32_t *)(uintptr_t)small;
    st = fi_plan_update(plan, &v);
    printf("table: 16 entries for %d -> %s: \"%s\"\n", (int)b.kv_indptr[b.n],
           fi_status_string(st), fi_last_error());
    CHECK(st == FI_STATUS_INVALID_ARGUMENT, "short table accepted");
    CHECK(fi_plan_run(plan, &a) == FI_STATUS_NOT_PLANNED, "run after a failed update");
    gu.MemFree(small);
    gu.MemFree(b.table);
    free(host), free(dev);
    fi_plan_destroy(plan);
    fi_plan_destroy(hplan);
    fi_context_destroy(ctx);
}

/* ------------------------------------------------------------ merge */

static void test_merge_widths(const char *mode) {
    tu_rng rng;
    tu_rng_seed(&rng, 4242);
    bufs B;
    fi_context *ctx = open_cuda(&B, &rng);
    if (!ctx) return;
    enum { CHUNK = 128 };
    const int32_t sources[] = {8, 16, 21, 32, 33, 47}; /* 47 * 128 keys: within POOL */
    gu_stream s = NULL;
    GU(gu.StreamCreate(&s, 1));
    fi_run_args a = run_args(&B, s);
    uint16_t *o = malloc((size_t)MAXQ * HQ * D * 2);
    for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++) {
        fi_attention_params p = make_params();
        fi_plan_config cfg;
        fi_plan_config_init(&cfg);
        cfg.max_batch_size = 1, cfg.max_total_qo = 1, cfg.max_total_kv = POOL;
        cfg.fixed_split_size = CHUNK;
        fi_plan *plan = NULL;
        int32_t q[] = {1}, k[] = {sources[i] * CHUNK};
        batch b;
        make_batch(&b, 1, q, k, &rng);
        prepare(&B, &b, &rng);
        fi_plan_info info = {.struct_size = sizeof info};
        CHECK(fi_plan_create(ctx, &p, &cfg, &plan) == FI_OK && fi_plan_update(plan, &b.view) == FI_OK &&
                  fi_plan_get_info(plan, &info) == FI_OK && fi_plan_run(plan, &a) == FI_OK,
              "merge plan/run: %s", fi_last_error());
        CHECK(info.num_split_items == sources[i], "%d sources planned as %d split items",
              (int)sources[i], (int)info.num_split_items);
        char what[64];
        snprintf(what, sizeof what, "merge: %s, %d sources", mode, (int)sources[i]);
        check_oracle(what, &B, &b, o);
        fi_plan_destroy(plan);
    }
    free(o);
    gu.StreamDestroy(s);
    fi_context_destroy(ctx);
}

/* ------------------------------------------------------------- chain */

/* Runs that feed each other on one stream with no host wait between them:
 * run k's query is run k - 1's output (buffers X[k] -> X[k + 1], the later
 * ones poisoned). With programmatic dependent launch a run's CTAs start
 * while the run before still writes its output; each must wait for it
 * (kernels/prelude.cuh, fi_pdl_wait) before reading its query. Every step
 * against the oracle on the query it should have read. */
static void test_chain(const char *mode) {
    tu_rng rng;
    tu_rng_seed(&rng, 777);
    bufs B;
    fi_context *ctx = open_cuda(&B, &rng);
    if (!ctx) return;
    enum { STEPS = 4 };
    /* a long split decode beside short ones, and one with a prefill chunk
     * (the full form, or the separate tensor-core kernel) */
    int32_t qa[] = {1, 1, 1}, ka[] = {5000, 300, 1200};
    int32_t qb[] = {1, 9, 1}, kb[] = {3000, 640, 2000};
    batch bs[2];
    make_batch(&bs[0], 3, qa, ka, &rng);
    make_batch(&bs[1], 3, qb, kb, &rng);
    fi_plan *plan = bounds_plan(ctx, 0);
    gu_stream s = NULL;
    GU(gu.StreamCreate(&s, 1));
    gu_ptr x[STEPS + 1] = {0};
    size_t xb = B.qb;
    uint16_t *host[STEPS + 1];
    for (int k = 0; k <= STEPS; k++) {
        GU(gu.MemAlloc(&x[k], xb));
        host[k] = malloc(xb);
    }
    for (int bi = 0; plan && bi < 2; bi++) {
        batch *b = &bs[bi];
        CHECK(update(plan, b, 0) == FI_OK, "chain update: %s", fi_last_error());
        tu_fill_uniform(&rng, &B.q.t, -1, 1, 0);
        GU(gu.HtoD(x[0], B.q.base, xb));
        for (int k = 1; k <= STEPS; k++) GU(gu.MemsetD8(x[k], 0xff, xb));
        GU(gu.CtxSynchronize());
        fi_run_args a = run_args(&B, s);
        for (int k = 0; k < STEPS; k++) {
            a.q.data = (void *)(uintptr_t)x[k];
            a.o.data = (void *)(uintptr_t)x[k + 1];
            CHECK(fi_plan_run(plan, &a) == FI_OK, "chain run %d: %s", k, fi_last_error());
        }
        GU(gu.StreamSynchronize(s));
        for (int k = 0; k <= STEPS; k++) GU(gu.DtoH(host[k], x[k], xb));
        fi_attention_params p = make_params();
        int nq = b->qo_indptr[b->n];
        int64_t n = (int64_t)nq * HQ * D;
        double *ref = malloc((size_t)n * 8), *got = malloc((size_t)n * 8);
        for (int k = 0; k < STEPS; k++) {
            memcpy(B.q.base, host[k], xb); /* the query run k read */
            oracle_attention(&p, &b->view, &B.q.t, &B.k.t, &B.v.t, NULL, ref, NULL);
            for (int64_t i = 0; i < n; i++) got[i] = tu_load(host[k + 1], FI_DTYPE_BF16, i);
            tu_cmp c;
            int64_t bad = tu_compare(got, ref, n, 1e-2, 2e-2, &c);
            printf("chain (%s): batch %d step %d O max err %.2e: %s\n", mode, bi, k + 1,
                   c.max_abs_err, bad ? "FAIL" : "ok");
            CHECK(!bad, "chain (%s) batch %d step %d: %lld values off (worst %g vs %g)", mode, bi,
                  k + 1, (long long)bad, c.worst_got, c.worst_ref);
        }
        free(ref), free(got);
    }
    for (int k = 0; k <= STEPS; k++) {
        gu.MemFree(x[k]);
        free(host[k]);
    }
    gu.StreamDestroy(s);
    fi_plan_destroy(plan);
    fi_context_destroy(ctx);
}

/* ------------------------------------------------------------- steps */

/* Steps of a serving loop queued behind a slow memset on one stream, the
 * host never waiting: each update rewrites the plan's staging while the
 * copies and runs before it may still be queued. It may do so once a run
 * has read the last copy (the kernels write its number to a pinned word,
 * src/cuda/plan.c) or after waiting for that copy's event, as every third
 * step makes it, updated twice with no run between. Each step runs
 * make_batches' batches in turn into its own output, on one query. */
static void test_steps(const char *mode) {
    tu_rng rng;
    tu_rng_seed(&rng, 4242);
    bufs B;
    fi_context *ctx = open_cuda(&B, &rng);
    if (!ctx) return;
    enum { STEPS = 3 * NB };
    fi_plan *plan = bounds_plan(ctx, 0);
    batch bs[NB];
    make_batches(bs, &rng);
    gu_stream s = NULL;
    gu_ptr o[STEPS] = {0}, l[STEPS] = {0}, slow = 0;
    const size_t slow_bytes = (size_t)1 << 30; /* ~0.3 ms of memset on an H200 */
    int ok = plan && !GU(gu.StreamCreate(&s, 1)) && !GU(gu.MemAlloc(&slow, slow_bytes));
    for (int k = 0; ok && k < STEPS; k++)
        ok = !GU(gu.MemAlloc(&o[k], B.ob)) && !GU(gu.MemAlloc(&l[k], B.lb)) &&
             !GU(gu.MemsetD8(o[k], 0xff, B.ob)) && !GU(gu.MemsetD8(l[k], 0xff, B.lb));
    tu_fill_uniform(&rng, &B.q.t, -1, 1, 0);
    ok = ok && !GU(gu.HtoD(B.dq, B.q.base, B.qb)) && !GU(gu.CtxSynchronize());
    CHECK(ok, "steps (%s): plan, stream or buffers", mode);
    fi_run_args a = run_args(&B, s);
    /* a first run puts the plan's copies on s */
    ok = ok && update(plan, &bs[0], 0) == FI_OK && fi_plan_run(plan, &a) == FI_OK &&
         !GU(gu.MemsetD8Async(slow, 0, slow_bytes, s));
    CHECK(ok, "steps (%s): first run: %s", mode, fi_last_error());
    for (int k = 0; ok && k < STEPS; k++) {
        const int i = k % NB;
        if (k % 3 == 2) /* an update no run reads */
            CHECK(update(plan, &bs[(i + 1) % NB], 0) == FI_OK, "steps: update: %s",
                  fi_last_error());
        CHECK(update(plan, &bs[i], 0) == FI_OK, "steps: update: %s", fi_last_error());
        a.o.data = (void *)(uintptr_t)o[k];
        a.lse.data = (void *)(uintptr_t)l[k];
        CHECK(fi_plan_run(plan, &a) == FI_OK, "steps: run %d: %s", k, fi_last_error());
    }
    GU(gu.StreamSynchronize(s));
    uint16_t *bits = malloc(B.ob);
    for (int k = 0; ok && bits && k < STEPS; k++) {
        bufs Bk = B; /* check_oracle reads do_ and dl */
        Bk.do_ = o[k], Bk.dl = l[k];
        char what[96];
        snprintf(what, sizeof what, "steps (%s) %d: %s", mode, k, names[k % NB]);
        check_oracle(what, &Bk, &bs[k % NB], bits);
    }
    free(bits);
    for (int k = 0; k < STEPS; k++) {
        if (o[k]) gu.MemFree(o[k]);
        if (l[k]) gu.MemFree(l[k]);
    }
    if (slow) gu.MemFree(slow);
    if (s) gu.StreamDestroy(s);
    fi_plan_destroy(plan);
    fi_context_destroy(ctx);
    bufs_free(&B);
}

/* ------------------------------------------------------------ device */

static void test_device(void) {
    int n = 0;
    gu.DeviceGetCount(&n);
    fi_context_options opt;
    fi_context_options_init(&opt);
    opt.device = FI_DEVICE_CUDA;
    opt.device_id = n;
    fi_context *ctx = NULL;
    CHECK(fi_context_create(&opt, &ctx) == FI_STATUS_NO_DEVICE, "device_id=%d of %d", n, n);
    printf("device: device_id=%d -> \"%s\"\n", n, fi_last_error());
    if (n < 2) {
        printf("device: one GPU here; device_id 1 not checked\n");
        return;
    }
    /* Tensors on device 1: its primary context current while the test
     * allocates them and makes its stream; a context of device_id 1 runs
     * make_batches' batches against the oracle. */
    int dev1 = 0;
    gu_ctx c1 = NULL;
    if (GU(gu.DeviceGet(&dev1, 1)) || GU(gu.PrimaryCtxRetain(&c1, dev1))) {
        CHECK(0, "device 1: its primary context");
        return;
    }
    if (GU(gu.CtxPushCurrent(c1))) {
        CHECK(0, "device 1: making its primary context current");
        GU(gu.PrimaryCtxRelease(dev1));
        return;
    }
    tu_rng rng;
    tu_rng_seed(&rng, 77);
    bufs B;
    memset(&B, 0, sizeof B);
    opt.device_id = 1;
    CHECK(fi_context_create(&opt, &ctx) == FI_OK, "device 1: %s", fi_last_error());
    gu_stream s = NULL;
    if (ctx && !bufs_init(&B, &rng) && !GU(gu.StreamCreate(&s, 1 /* non-blocking */))) {
        printf("device: %s\n", fi_context_describe(ctx));
        fi_plan *plan = bounds_plan(ctx, 0);
        batch bs[NB];
        make_batches(bs, &rng);
        uint16_t *o = malloc((size_t)MAXQ * HQ * D * 2);
        fi_run_args a = run_args(&B, s);
        for (int i = 0; plan && o && i < NB; i++) {
            char what[96];
            snprintf(what, sizeof what, "device 1: %s", names[i]);
            CHECK(update(plan, &bs[i], 0) == FI_OK, "%s: update: %s", what, fi_last_error());
            prepare(&B, &bs[i], &rng);
            CHECK(fi_plan_run(plan, &a) == FI_OK, "%s: run: %s", what, fi_last_error());
            check_oracle(what, &B, &bs[i], o);
        }
        free(o);
        fi_plan_destroy(plan);
    } else {
        CHECK(0, "device 1: context, buffers or stream");
    }
    CHECK(!s || !GU(gu.StreamDestroy(s)), "device 1: destroying its stream");
    bufs_free(&B);
    fi_context_destroy(ctx);
    CHECK(!GU(gu.CtxPopCurrent(&c1)), "device 1: popping its primary context");
    CHECK(!GU(gu.PrimaryCtxRelease(dev1)), "device 1: releasing its primary context");
}

int main(int argc, char **argv) {
    if (!fi_device_available(FI_DEVICE_CUDA) || gu_init(0)) {
        printf("no CUDA device: nothing to test\n");
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--table")) {
        test_table();
        return gu_summary("test_cuda --table");
    }
    test_jit();
    test_device();
    test_table();
    test_merge_widths("fused");
    test_graph("persistent kernel", 0, 0);
    test_graph("persistent kernel, device page tables", 1, 0);
    /* a prefill-only batch's run, captured, holds the separate kernels */
    test_graph("captured on a prefill-only batch", 0, 4);
    /* the settings are read when a context is created (each test makes its own) */
    setenv("FLASHINFER_CUDA_KERNELS", "full-form", 1);
    test_graph("persistent kernel, no decode form", 0, 0);
    unsetenv("FLASHINFER_CUDA_KERNELS");
    test_chain("persistent kernel");
    test_steps("persistent kernel");
    setenv("FLASHINFER_CUDA_KERNELS", "separate", 1);
    test_chain("separate kernels");
    test_steps("separate kernels");
    test_merge_widths("merge kernel");
    test_graph("separate kernels", 0, 0);
    test_graph("separate kernels, device page tables", 1, 0);
    unsetenv("FLASHINFER_CUDA_KERNELS");
    return gu_summary("test_cuda");
}
