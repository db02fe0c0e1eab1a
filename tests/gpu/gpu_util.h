/*
 * gpu_util.h — what the GPU test and benchmark programs need from the CUDA
 * driver, loaded with dlopen (so they build without CUDA headers): memory,
 * copies, streams, events, graphs; and the benchmarks' random device fill.
 * Header-only; each program includes it once.
 */
#ifndef FI_GPU_UTIL_H
#define FI_GPU_UTIL_H

#include "flashinfer.h"
#include "../util.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long gu_ptr;
typedef void *gu_stream, *gu_event, *gu_graph, *gu_exec, *gu_ctx;

static struct {
    int (*Init)(unsigned);
    int (*DeviceGet)(int *, int);
    int (*DeviceGetCount)(int *);
    int (*PrimaryCtxRetain)(gu_ctx *, int);
    int (*PrimaryCtxRelease)(int);
    int (*CtxSetCurrent)(gu_ctx);
    int (*MemAlloc)(gu_ptr *, size_t);
    int (*MemFree)(gu_ptr);
    int (*HtoD)(gu_ptr, const void *, size_t);
    int (*DtoH)(void *, gu_ptr, size_t);
    int (*MemsetD8)(gu_ptr, unsigned char, size_t);
    int (*MemsetD8Async)(gu_ptr, unsigned char, size_t, gu_stream);
    int (*StreamCreate)(gu_stream *, unsigned);
    int (*StreamDestroy)(gu_stream);
    int (*StreamSynchronize)(gu_stream);
    int (*CtxSynchronize)(void);
    int (*EventCreate)(gu_event *, unsigned);
    int (*EventRecord)(gu_event, gu_stream);
    int (*EventSynchronize)(gu_event);
    int (*EventElapsedTime)(float *, gu_event, gu_event);
    int (*BeginCapture)(gu_stream, int);
    int (*EndCapture)(gu_stream, gu_graph *);
    int (*GraphInstantiate)(gu_exec *, gu_graph, unsigned long long);
    int (*GraphLaunch)(gu_exec, gu_stream);
    int (*GraphDestroy)(gu_graph);
    int (*GraphExecDestroy)(gu_exec);
    int (*GetErrorName)(int, const char **);
    int (*MemAllocHost)(void **, size_t);
    int (*MemHostAlloc)(void **, size_t, unsigned);
    int (*MemFreeHost)(void *);
    int (*HtoDAsync)(gu_ptr, const void *, size_t, gu_stream);
    int (*StreamIsCapturing)(gu_stream, int *);
    int (*CtxPushCurrent)(gu_ctx);
    int (*CtxPopCurrent)(gu_ctx *);
    int (*EventQuery)(gu_event);
    int (*StreamQuery)(gu_stream);
    int (*ModuleGetGlobal)(gu_ptr *, size_t *, void *, const char *);
} gu;
static gu_ctx gu_primary; /* the context gu_init made current */

static int gu_sym(void *lib, const char *name, void *slot) {
    void *p = dlsym(lib, name);
    memcpy(slot, &p, sizeof p);
    if (!p) fprintf(stderr, "gpu_util: libcuda lacks %s\n", name);
    return p != NULL;
}

/* Load the driver and make device `ordinal`'s primary context current. */
static int gu_init(int ordinal) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) return -1;
    int ok = 1;
    ok &= gu_sym(lib, "cuInit", &gu.Init);
    ok &= gu_sym(lib, "cuDeviceGet", &gu.DeviceGet);
    ok &= gu_sym(lib, "cuDeviceGetCount", &gu.DeviceGetCount);
    ok &= gu_sym(lib, "cuDevicePrimaryCtxRetain", &gu.PrimaryCtxRetain);
    ok &= gu_sym(lib, "cuDevicePrimaryCtxRelease_v2", &gu.PrimaryCtxRelease);
    ok &= gu_sym(lib, "cuCtxSetCurrent", &gu.CtxSetCurrent);
    ok &= gu_sym(lib, "cuMemAlloc_v2", &gu.MemAlloc);
    ok &= gu_sym(lib, "cuMemFree_v2", &gu.MemFree);
    ok &= gu_sym(lib, "cuMemcpyHtoD_v2", &gu.HtoD);
    ok &= gu_sym(lib, "cuMemcpyDtoH_v2", &gu.DtoH);
    ok &= gu_sym(lib, "cuMemsetD8_v2", &gu.MemsetD8);
    ok &= gu_sym(lib, "cuMemsetD8Async", &gu.MemsetD8Async);
    ok &= gu_sym(lib, "cuStreamCreate", &gu.StreamCreate);
    ok &= gu_sym(lib, "cuStreamDestroy_v2", &gu.StreamDestroy);
    ok &= gu_sym(lib, "cuStreamSynchronize", &gu.StreamSynchronize);
    ok &= gu_sym(lib, "cuCtxSynchronize", &gu.CtxSynchronize);
    ok &= gu_sym(lib, "cuEventCreate", &gu.EventCreate);
    ok &= gu_sym(lib, "cuEventRecord", &gu.EventRecord);
    ok &= gu_sym(lib, "cuEventSynchronize", &gu.EventSynchronize);
    ok &= gu_sym(lib, "cuEventElapsedTime", &gu.EventElapsedTime);
    ok &= gu_sym(lib, "cuStreamBeginCapture_v2", &gu.BeginCapture);
    ok &= gu_sym(lib, "cuStreamEndCapture", &gu.EndCapture);
    ok &= gu_sym(lib, "cuGraphInstantiateWithFlags", &gu.GraphInstantiate);
    ok &= gu_sym(lib, "cuGraphLaunch", &gu.GraphLaunch);
    ok &= gu_sym(lib, "cuGraphDestroy", &gu.GraphDestroy);
    ok &= gu_sym(lib, "cuGraphExecDestroy", &gu.GraphExecDestroy);
    ok &= gu_sym(lib, "cuGetErrorName", &gu.GetErrorName);
    ok &= gu_sym(lib, "cuMemAllocHost_v2", &gu.MemAllocHost);
    ok &= gu_sym(lib, "cuMemHostAlloc", &gu.MemHostAlloc);
    ok &= gu_sym(lib, "cuMemFreeHost", &gu.MemFreeHost);
    ok &= gu_sym(lib, "cuMemcpyHtoDAsync_v2", &gu.HtoDAsync);
    ok &= gu_sym(lib, "cuStreamIsCapturing", &gu.StreamIsCapturing);
    ok &= gu_sym(lib, "cuCtxPushCurrent_v2", &gu.CtxPushCurrent);
    ok &= gu_sym(lib, "cuCtxPopCurrent_v2", &gu.CtxPopCurrent);
    ok &= gu_sym(lib, "cuEventQuery", &gu.EventQuery);
    ok &= gu_sym(lib, "cuStreamQuery", &gu.StreamQuery);
    ok &= gu_sym(lib, "cuModuleGetGlobal_v2", &gu.ModuleGetGlobal);
    if (!ok) return -1;
    int dev, n = 0;
    gu_ctx ctx;
    if (gu.Init(0) || gu.DeviceGetCount(&n) || ordinal >= n || gu.DeviceGet(&dev, ordinal) ||
        gu.PrimaryCtxRetain(&ctx, dev) || gu.CtxSetCurrent(ctx))
        return -1;
    gu_primary = ctx;
    return 0;
}

static int gu_check(int r, const char *what, int line) {
    if (r == 0) return 0;
    const char *name = "?";
    gu.GetErrorName(r, &name);
    fprintf(stderr, "CUDA call failed at line %d: %s: %s (%d)\n", line, what, name, r);
    return r;
}
#define GU(call) gu_check((call), #call, __LINE__)

/* ------------------------------------------------------ device mirrors */

/* A host buffer's bytes on the device, between two guard zones of 0xA5;
 * `shift` extra guard bytes before the data misalign it on purpose. */
#define GU_GUARD 512
typedef struct gu_mirror {
    gu_ptr dev;
    size_t shift, bytes;
} gu_mirror;

static inline int gu_mirror_up(gu_mirror *m, const tu_buf *b, size_t shift) {
    memset(m, 0, sizeof *m);
    m->shift = shift, m->bytes = b->bytes;
    const size_t total = 2 * GU_GUARD + shift + b->bytes;
    if (GU(gu.MemAlloc(&m->dev, total))) return m->dev = 0, 0;
    if (GU(gu.MemsetD8(m->dev, 0xA5, total))) return 0;
    return !b->bytes || !GU(gu.HtoD(m->dev + GU_GUARD + shift, b->base, b->bytes));
}

/* The device bytes back into b; guard bytes that changed are a failure
 * (noted with `what`). */
static inline int gu_mirror_down(const gu_mirror *m, tu_buf *b, const char *what) {
    const size_t total = 2 * GU_GUARD + m->shift + m->bytes;
    uint8_t *all = malloc(total);
    if (!all || GU(gu.DtoH(all, m->dev, total))) {
        free(all);
        tu_note("%s: copy back failed", what);
        return 0;
    }
    memcpy(b->base, all + GU_GUARD + m->shift, m->bytes);
    size_t bad = 0;
    for (size_t i = 0; i < GU_GUARD + m->shift; i++) bad += all[i] != 0xA5;
    for (size_t i = GU_GUARD + m->shift + m->bytes; i < total; i++) bad += all[i] != 0xA5;
    free(all);
    if (bad) tu_note("%s: %zu guard bytes around the buffer were written", what, bad);
    return bad == 0;
}

static inline void gu_mirror_free(gu_mirror *m) {
    if (m->dev) gu.MemFree(m->dev);
    m->dev = 0;
}

/* ------------------------------------------------------------ benchmarks */

/* The driver loaded and a CUDA context of the library on device 0, for the
 * benchmark programs. Returns 1 when there is no CUDA device (the caller
 * prints nothing more and exits 0), -1 on a failure (printed), else 0. */
static inline int gu_bench_context(fi_context **ctx) {
    *ctx = NULL;
    if (!fi_device_available(FI_DEVICE_CUDA) || gu_init(0)) {
        printf("no CUDA device\n");
        return 1;
    }
    fi_context_options opt;
    fi_context_options_init(&opt);
    opt.device = FI_DEVICE_CUDA;
    if (fi_context_create(&opt, ctx)) {
        printf("context: %s\n", fi_last_error());
        return -1;
    }
    return 0;
}

/* Fill `bytes` of device memory with random bf16 in [-1, 1) (a repeated
 * 64 MiB random block, shifted per copy: cheap for multi-GiB caches, and
 * no two copies alike). Returns 0, or -1 if out of memory or a copy failed. */
static inline int gu_fill_random_bf16(gu_ptr dst, size_t bytes, tu_rng *rng) {
    size_t block = (size_t)64 << 20;
    uint16_t *h = malloc(block + 4096);
    if (!h) return -1;
    for (size_t i = 0; i < (block + 4096) / 2; i++)
        h[i] = tu_f32_to_bf16((float)tu_rng_range(rng, -1.0, 1.0));
    for (size_t at = 0, k = 0; at < bytes; at += block, k++) {
        size_t n = bytes - at < block ? bytes - at : block;
        if (GU(gu.HtoD(dst + at, (const char *)h + (k * 64) % 4096, n))) {
            free(h);
            return -1;
        }
    }
    free(h);
    return 0;
}

/* Fill `bytes` of device memory with random FP8 values of `dtype` (E4M3 or
 * E5M2) in (-2, 2): a random sign, exponent and mantissa below the format's
 * exponent bias + 1, never a NaN or infinity (the same repeated block as
 * gu_fill_random_bf16). */
static inline int gu_fill_random_fp8(gu_ptr dst, size_t bytes, fi_dtype dtype, tu_rng *rng) {
    size_t block = (size_t)64 << 20;
    uint8_t *h = malloc(block + 4096);
    if (!h) return -1;
    const int e4 = dtype == FI_DTYPE_E4M3, mbits = e4 ? 3 : 2, ebias = e4 ? 7 : 15;
    for (size_t i = 0; i < block + 4096; i++) {
        const int32_t r = tu_rng_int(rng, 0, INT32_MAX);
        const int sign = r & 1, e = (r >> 1) % (ebias + 1), m = (r >> 8) & ((1 << mbits) - 1);
        h[i] = (uint8_t)(sign << 7 | e << mbits | m);
    }
    for (size_t at = 0, k = 0; at < bytes; at += block, k++) {
        size_t n = bytes - at < block ? bytes - at : block;
        if (GU(gu.HtoD(dst + at, (const char *)h + (k * 64) % 4096, n))) {
            free(h);
            return -1;
        }
    }
    free(h);
    return 0;
}

/* n request lengths drawn from U(lo, hi) (all lo when lo == hi), the same
 * for the same (n, lo, hi) in every program: length i = lo + splitmix64(seed
 * + i + 1) mod (hi - lo + 1), seed = n x 2^40 + lo x 2^20 + hi, as
 * bench/cuda/bench_flashinfer.py's draw_lengths (the peers time the same
 * requests). */
static inline void gu_draw_lengths(int32_t *len, int n, int32_t lo, int32_t hi) {
    const uint64_t seed = ((uint64_t)n << 40) + ((uint64_t)lo << 20) + (uint64_t)hi;
    for (int i = 0; i < n; i++) {
        uint64_t z = seed + (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        len[i] = lo + (int32_t)(z % (uint64_t)(hi - lo + 1));
    }
}

/* The page ids of a batch whose request i holds entries [kv_indptr[i],
 * kv_indptr[i+1]) of `indices`: no page twice in a batch, as a serving
 * engine's requests own their pages (pages shared across requests would
 * turn some reads into L2 hits, favouring a kernel whose CTAs reach a page's
 * sharers close together: Nsight Compute showed FlashInfer's decode at a
 * 4.7% L2 hit rate on such a pool, ours at 1.3%, docs/BENCHMARKS.md).
 * Random: the first pages of a random permutation of the pool;
 * `contiguous`: the requests' runs back to back from a random start
 * (FlashInfer's benchmark layout). Needs pool >= kv_indptr[n]; returns -1
 * (printed) otherwise or when out of memory. */
static inline int gu_draw_pages(int32_t *indices, int n, const int32_t *kv_indptr, int32_t pool,
                                int contiguous, tu_rng *rng) {
    const int32_t total = kv_indptr[n];
    if (total > pool) {
        printf("gu_draw_pages: %d pages from a pool of %d\n", (int)total, (int)pool);
        return -1;
    }
    if (contiguous) {
        int32_t start = tu_rng_int(rng, 0, pool - 1);
        for (int32_t j = 0; j < total; j++) indices[j] = (int32_t)(((int64_t)start + j) % pool);
        return 0;
    }
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)pool);
    if (!perm) return -1;
    for (int32_t i = 0; i < pool; i++) perm[i] = i;
    for (int32_t i = 0; i < total; i++) { /* Fisher-Yates, the first `total` places */
        int32_t j = tu_rng_int(rng, i, pool - 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
        indices[i] = perm[i];
    }
    free(perm);
    return 0;
}

/* A paged batch over a pool of `pool` pages: request i has qo[i] queries and
 * kv[i] keys; its pages drawn by gu_draw_pages. */
typedef struct gu_batch {
    int32_t n, total_q, pages;
    int32_t *qo_indptr, *kv_indptr, *indices, *last;
} gu_batch;

static inline void gu_batch_free(gu_batch *b) {
    free(b->qo_indptr), free(b->kv_indptr), free(b->indices), free(b->last);
    memset(b, 0, sizeof *b);
}

static inline int gu_batch_make(gu_batch *b, int n, const int32_t *qo, const int32_t *kv,
                                int page, int32_t pool, int contiguous, tu_rng *rng) {
    memset(b, 0, sizeof *b);
    b->n = n;
    b->qo_indptr = calloc((size_t)n + 1, 4), b->kv_indptr = calloc((size_t)n + 1, 4);
    b->last = calloc((size_t)n + 1, 4);
    if (!b->qo_indptr || !b->kv_indptr || !b->last) return -1;
    for (int i = 0; i < n; i++) {
        int32_t pages = (kv[i] + page - 1) / page;
        b->qo_indptr[i + 1] = b->qo_indptr[i] + qo[i];
        b->kv_indptr[i + 1] = b->kv_indptr[i] + pages;
        b->last[i] = pages ? kv[i] - page * (pages - 1) : 0;
    }
    b->total_q = b->qo_indptr[n], b->pages = b->kv_indptr[n];
    b->indices = malloc(sizeof(int32_t) * ((size_t)b->pages + 1));
    if (!b->indices) return -1;
    return gu_draw_pages(b->indices, n, b->kv_indptr, pool, contiguous, rng);
}

static inline fi_batch gu_batch_view(const gu_batch *b) {
    fi_batch v = {b->n, b->qo_indptr, b->kv_indptr, b->indices, b->last, NULL};
    return v;
}

/* qsort comparator of floats (the timings whose median is reported). */
static inline int gu_cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Replay `ex` reps times on `s` (after 3 warm-up replays), each between
 * events e0 and e1: the sorted milliseconds into ms[reps]. Returns 0, or -1
 * when a call failed (printed). */
static inline int gu_replay_times(gu_exec ex, gu_stream s, gu_event e0, gu_event e1, int reps,
                                  float *ms) {
    for (int w = 0; w < 3; w++)
        if (GU(gu.GraphLaunch(ex, s))) return -1;
    for (int t = 0; t < reps; t++) {
        if (GU(gu.EventRecord(e0, s)) || GU(gu.GraphLaunch(ex, s)) || GU(gu.EventRecord(e1, s)) ||
            GU(gu.EventSynchronize(e1)) || GU(gu.EventElapsedTime(&ms[t], e0, e1)))
            return -1;
    }
    qsort(ms, (size_t)reps, sizeof ms[0], gu_cmp_float);
    return 0;
}

/* What the benchmark programs start with: gu_bench_context (its status),
 * the context described on stdout after `what`, q and o of qbytes and k and
 * v of kvbytes on the device, all but o random bf16 from `seed`, a
 * non-blocking stream and two timing events. */
typedef struct gu_bench {
    fi_context *ctx;
    tu_rng rng;
    gu_ptr q, o, k, v;
    gu_stream s;
    gu_event e0, e1;
} gu_bench;

static inline int gu_bench_init(gu_bench *b, size_t qbytes, size_t kvbytes, uint64_t seed,
                                const char *what) {
    memset(b, 0, sizeof *b);
    int open = gu_bench_context(&b->ctx);
    if (open) return open;
    printf("%s; %s\n", fi_context_describe(b->ctx), what);
    tu_rng_seed(&b->rng, seed);
    if (GU(gu.MemAlloc(&b->k, kvbytes)) || GU(gu.MemAlloc(&b->v, kvbytes)) ||
        GU(gu.MemAlloc(&b->q, qbytes)) || GU(gu.MemAlloc(&b->o, qbytes)) ||
        gu_fill_random_bf16(b->k, kvbytes, &b->rng) || gu_fill_random_bf16(b->v, kvbytes, &b->rng) ||
        gu_fill_random_bf16(b->q, qbytes, &b->rng) || GU(gu.StreamCreate(&b->s, 1)) ||
        GU(gu.EventCreate(&b->e0, 0)) || GU(gu.EventCreate(&b->e1, 0)))
        return -1;
    return 0;
}

/* Params of the benchmarks' model: bf16, hq/hkv heads, head dim d, page ps. */
static inline fi_attention_params gu_bench_params(int hq, int hkv, int d, int ps) {
    fi_attention_params p;
    fi_attention_params_init(&p);
    p.num_qo_heads = hq, p.num_kv_heads = hkv, p.head_dim_qk = p.head_dim_vo = d;
    p.page_size = ps;
    p.q_dtype = p.kv_dtype = p.o_dtype = FI_DTYPE_BF16;
    return p;
}

/* ----------------------------------------------------------------- tests */

/* The tests' failure counter and check (message, then fi_last_error()). */
static inline int *gu_failures(void) {
    static int n;
    return &n;
}
/* The last line of a test program; its exit status. */
static inline int gu_summary(const char *program) {
    int n = *gu_failures();
    printf("%s: %s (%d failure%s)\n", program, n ? "FAILED" : "passed", n, n == 1 ? "" : "s");
    return n ? 1 : 0;
}
#define CHECK(cond, ...)                                \
    do {                                                \
        if (!(cond)) {                                  \
            (*gu_failures())++;                         \
            printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            printf(__VA_ARGS__);                        \
            printf(" [%s]\n", fi_last_error());         \
        }                                               \
    } while (0)

#endif
