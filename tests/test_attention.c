/*
 * test_attention.c — every backend, KV format, variant and dtype of batched
 * attention against the fp64 oracle, ggml test-backend-ops style.
 *
 * A case is a point in (backend x format x variant x dtype x head dim x GQA
 * x batch shape x plan options). Each gets fresh seeded random inputs, its
 * outputs poisoned with NaN before every run, and a tolerance by dtype; the
 * seed and the command to rerun it are printed on failure. Suites (the
 * categories of the summary) cross a few dimensions each rather than the
 * full product, which would take hours:
 *   oracle      the oracle against hand-computed answers
 *   format      paged NHD/HND, ragged NHD/HND, one [pages,2,...] tensor,
 *               padded strides, page sizes
 *   variant     masks, window, soft-cap, ALiBi, RoPE, custom mask, sm_scale
 *   dtype       q/kv/o in f32/f16/bf16, FP8 KV with scales
 *   headdim     64/128/256 (and qk != vo) x GQA group 1/4/8; d 256 decodes
 *               (16-bit and FP8 K/V, pages 1/16/64, groups 1-16); 80/96/192/512
 *               (and 192x128, 96x64) x dtypes, FP8, RoPE, masks, split-KV
 *   plan        split-KV on/off, fixed split, workers, layers, re-plan
 *   edge        empty requests, fully masked rows, 65536 keys, huge logits
 *   determinism bitwise reruns; fixed_split_size batch invariance
 * See tests/README.md for the options and the tolerances.
 */
#include "flashinfer.h"
#include "oracle.h"
#include "util.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_BATCH 16

/* ================================================================ backends */

/* A backend is a dimension of every case: the CPU at each SIMD level, and
 * CUDA (memory moved through the driver, loaded at run time, so this file
 * builds without CUDA). A backend that cannot be used is skipped. */
typedef struct backend {
    const char *name;        /* in case names: "cpu-avx2", "cuda" */
    const char *device_name; /* what --backend matches */
    fi_device_type device;
    const char *simd;
    fi_context *ctx;
    int tried;
    char why_not[200];       /* reason when ctx is NULL */
} backend;

static backend backends[] = {
    {"cpu-generic", "cpu", FI_DEVICE_CPU, "generic", NULL, 0, ""},
    {"cpu-avx2", "cpu", FI_DEVICE_CPU, "avx2", NULL, 0, ""},
    {"cpu-avx512", "cpu", FI_DEVICE_CPU, "avx512", NULL, 0, ""},
    {"cuda", "cuda", FI_DEVICE_CUDA, NULL, NULL, 0, ""},
};
#define NUM_BACKENDS ((int)(sizeof backends / sizeof backends[0]))

/* The few CUDA driver calls the harness needs to move test data, looked up
 * with dlsym in libcuda (the driver, present wherever a GPU is). Memory is
 * allocated in device 0's primary context, the one the library uses. */
typedef unsigned long long cu_ptr;
static struct {
    int tried, ok;
    int (*init)(unsigned);
    int (*device_get)(int *, int);
    int (*primary_retain)(void **, int);
    int (*set_current)(void *);
    int (*mem_alloc)(cu_ptr *, size_t);
    int (*mem_free)(cu_ptr);
    int (*htod)(cu_ptr, const void *, size_t);
    int (*dtoh)(void *, cu_ptr, size_t);
    int (*sync)(void);
    /* streams and graphs, for the replay test */
    int (*stream_create)(void **, unsigned);
    int (*stream_destroy)(void *);
    int (*stream_sync)(void *);
    int (*begin_capture)(void *, int);
    int (*end_capture)(void *, void **);
    int (*graph_instantiate)(void **, void *, unsigned long long);
    int (*graph_launch)(void *, void *);
    int (*graph_exec_destroy)(void *);
    int (*graph_destroy)(void *);
} cu;

static int cuda_load(void) {
    if (cu.tried) return cu.ok;
    cu.tried = 1;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) h = dlopen("libcuda.so", RTLD_NOW);
    if (!h) return 0;
    *(void **)&cu.init = dlsym(h, "cuInit");
    *(void **)&cu.device_get = dlsym(h, "cuDeviceGet");
    *(void **)&cu.primary_retain = dlsym(h, "cuDevicePrimaryCtxRetain");
    *(void **)&cu.set_current = dlsym(h, "cuCtxSetCurrent");
    *(void **)&cu.mem_alloc = dlsym(h, "cuMemAlloc_v2");
    *(void **)&cu.mem_free = dlsym(h, "cuMemFree_v2");
    *(void **)&cu.htod = dlsym(h, "cuMemcpyHtoD_v2");
    *(void **)&cu.dtoh = dlsym(h, "cuMemcpyDtoH_v2");
    *(void **)&cu.sync = dlsym(h, "cuCtxSynchronize");
    *(void **)&cu.stream_create = dlsym(h, "cuStreamCreate");
    *(void **)&cu.stream_destroy = dlsym(h, "cuStreamDestroy_v2");
    *(void **)&cu.stream_sync = dlsym(h, "cuStreamSynchronize");
    *(void **)&cu.begin_capture = dlsym(h, "cuStreamBeginCapture_v2");
    *(void **)&cu.end_capture = dlsym(h, "cuStreamEndCapture");
    *(void **)&cu.graph_instantiate = dlsym(h, "cuGraphInstantiateWithFlags");
    *(void **)&cu.graph_launch = dlsym(h, "cuGraphLaunch");
    *(void **)&cu.graph_exec_destroy = dlsym(h, "cuGraphExecDestroy");
    *(void **)&cu.graph_destroy = dlsym(h, "cuGraphDestroy");
    if (!cu.init || !cu.device_get || !cu.primary_retain || !cu.set_current || !cu.mem_alloc ||
        !cu.mem_free || !cu.htod || !cu.dtoh || !cu.sync)
        return 0;
    int dev = 0;
    void *ctx = NULL;
    if (cu.init(0) || cu.device_get(&dev, 0) || cu.primary_retain(&ctx, dev) || cu.set_current(ctx))
        return 0;
    cu.ok = 1;
    return 1;
}

/* The backend's context, created on first use; NULL (with why_not) if the
 * backend is absent here. */
static fi_context *backend_context(backend *be) {
    if (be->tried) return be->ctx;
    be->tried = 1;
    if (!fi_device_available(be->device)) {
        snprintf(be->why_not, sizeof be->why_not, "no %s device (fi_device_available(%s) = 0)",
                 be->device_name, be->device_name);
        printf("backend %s: skipped: %s\n", be->name, be->why_not);
        return NULL;
    }
    if (be->device == FI_DEVICE_CUDA && !cuda_load()) {
        snprintf(be->why_not, sizeof be->why_not, "the CUDA driver (libcuda) could not be loaded");
        printf("backend %s: skipped: %s\n", be->name, be->why_not);
        return NULL;
    }
    fi_context_options opt;
    fi_context_options_init(&opt);
    opt.device = be->device;
    opt.cpu_simd = be->simd;
    fi_status st = fi_context_create(&opt, &be->ctx);
    if (st != FI_OK) {
        snprintf(be->why_not, sizeof be->why_not, "fi_context_create: %s: %s",
                 fi_status_string(st), fi_last_error());
        be->ctx = NULL;
        printf("backend %s: skipped: %s\n", be->name, be->why_not);
        return NULL;
    }
    printf("backend %s: %s\n", be->name, fi_context_describe(be->ctx));
    return be->ctx;
}

/* ================================================= buffers on the backend */

/* A tensor the test owns on the host (guarded, poisonable) and its mirror
 * on the backend; `dev` is the view the library gets. On the CPU both are
 * the same memory. Up/downloads copy the whole allocation, padding included,
 * so the padding's poison is checked on every backend. */
typedef struct dbuf {
    tu_buf h;
    void *dev_base;
    fi_tensor dev;
} dbuf;

static int dbuf_alloc(const backend *be, dbuf *d, fi_dtype dt, int32_t ndim,
                      const int64_t *shape, const int64_t *pad) {
    memset(d, 0, sizeof *d);
    if (tu_buf_alloc_padded(&d->h, dt, ndim, shape, pad)) return -1;
    tu_buf_poison(&d->h);
    d->dev = d->h.t;
    d->dev_base = d->h.base;
    if (be->device == FI_DEVICE_CUDA) {
        cu_ptr p = 0;
        if (cu.mem_alloc(&p, d->h.bytes ? d->h.bytes : 1)) return -1;
        d->dev_base = (void *)(uintptr_t)p;
        d->dev.data = d->dev_base;
    }
    return 0;
}

/* A view of part of the allocation (K or V of a combined tensor) on both
 * sides: host view `h`, and its device twin. */
static fi_tensor dbuf_dev_view(const dbuf *d, const fi_tensor *host_view) {
    fi_tensor t = *host_view;
    t.data = (char *)d->dev_base + ((char *)host_view->data - (char *)d->h.base);
    return t;
}

static int dbuf_upload(const backend *be, dbuf *d) {
    if (be->device != FI_DEVICE_CUDA) return 0;
    /* synchronise: a pageable copy may still be in flight on return, and
     * runs on other streams are not ordered after it */
    return cu.htod((cu_ptr)(uintptr_t)d->dev_base, d->h.base, d->h.bytes) || cu.sync();
}

static int dbuf_download(const backend *be, dbuf *d) {
    if (be->device != FI_DEVICE_CUDA) return 0;
    cu.sync();
    return cu.dtoh(d->h.base, (cu_ptr)(uintptr_t)d->dev_base, d->h.bytes);
}

static void dbuf_free(const backend *be, dbuf *d) {
    if (be->device == FI_DEVICE_CUDA && d->dev_base) cu.mem_free((cu_ptr)(uintptr_t)d->dev_base);
    tu_buf_free(&d->h);
    memset(d, 0, sizeof *d);
}

static uint64_t buf_checksum(const tu_buf *b) {
    uint64_t h = 0xcbf29ce484222325ull;
    const uint8_t *p = b->base;
    for (size_t i = 0; i < b->bytes; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* ================================================================== cases */

typedef struct case_spec {
    const char *suite;
    backend *be;
    /* KV format */
    fi_kv_format format;
    fi_kv_layout layout;
    int32_t combined;   /* one [pages, 2, ...] tensor, split by fi_tensor_split_kv */
    int32_t pad;        /* > 0: padded strides (pad elements on the head-dim
                           extent, 1 on the others): a non-contiguous view */
    int32_t page_size;
    /* variant */
    fi_mask_mode mask;
    int32_t window_left;
    float soft_cap;
    float sm_scale;
    fi_pos_encoding pos;
    float rope_scale, rope_theta;
    int32_t custom_slopes;
    int32_t mask_indptr; /* custom mask segments placed by mask_indptr, with gaps */
    /* dtypes */
    fi_dtype q_dt, kv_dt, o_dt;
    float k_scale, v_scale;
    /* heads */
    int32_t dqk, dvo, hq, hkv;
    /* batch: a named shape, or explicit lengths when batch > 0 */
    const char *shape;
    int32_t batch;
    int32_t qo_len[MAX_BATCH], kv_len[MAX_BATCH];
    /* plan */
    int32_t disable_split, fixed_split, workers;
    int32_t layers;       /* runs of one plan with fresh Q/K/V */
    int32_t second_batch; /* re-plan with another batch and run again */
    int32_t device_table; /* paged: fi_plan_config.device_page_table, the
                             table in the backend's memory */
    int32_t no_lse;
    double amplitude;     /* q, k uniform in [-a, a] */
    int32_t extreme;      /* huge logits: check finiteness, not closeness */
    int32_t nonfinite;    /* a NaN or infinity put into q, k or v (NF_*) */
    int32_t determinism;  /* run twice, outputs bitwise equal */
    int32_t quick;        /* part of --quick */
} case_spec;

static case_spec default_spec(const char *suite, backend *be) {
    case_spec c;
    memset(&c, 0, sizeof c);
    c.suite = suite;
    c.be = be;
    c.format = FI_KV_FORMAT_PAGED;
    c.layout = FI_KV_LAYOUT_NHD;
    c.page_size = 16;
    c.mask = FI_MASK_NONE;
    c.window_left = -1;
    c.rope_scale = 1.0f;
    c.rope_theta = 1e4f;
    c.q_dt = c.kv_dt = c.o_dt = FI_DTYPE_F16;
    c.k_scale = c.v_scale = 1.0f;
    c.dqk = c.dvo = 128;
    c.hq = 8;
    c.hkv = 2;
    c.shape = "mixed";
    c.layers = 1;
    c.amplitude = 2.0;
    return c;
}

static const char *format_name(const case_spec *c) {
    static char buf[64];
    const char *lay = c->layout == FI_KV_LAYOUT_NHD ? "nhd" : "hnd";
    if (c->format == FI_KV_FORMAT_RAGGED)
        snprintf(buf, sizeof buf, "ragged_%s%s", lay, c->pad ? "_strided" : "");
    else
        snprintf(buf, sizeof buf, "paged_%s%s%s_ps%d", lay, c->combined ? "_kv2" : "",
                 c->pad ? "_strided" : "", (int)c->page_size);
    return buf;
}

static void variant_name(const case_spec *c, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = 0;
#define ADD(...) len += (size_t)snprintf(buf + len, len < n ? n - len : 0, __VA_ARGS__)
    if (c->mask == FI_MASK_CAUSAL) ADD("causal+");
    if (c->mask == FI_MASK_CUSTOM) ADD(c->mask_indptr ? "custom_indptr+" : "custom+");
    if (c->window_left >= 0) ADD("window%d+", (int)c->window_left);
    if (c->soft_cap > 0) ADD("softcap%g+", (double)c->soft_cap);
    if (c->pos == FI_POS_ALIBI) ADD(c->custom_slopes ? "alibi_slopes+" : "alibi+");
    if (c->pos == FI_POS_ROPE_LLAMA) {
        if (c->rope_scale != 1.0f || c->rope_theta != 1e4f)
            ADD("rope%g_%g+", (double)c->rope_scale, (double)c->rope_theta);
        else
            ADD("rope+");
    }
    if (c->sm_scale > 0) ADD("sm%g+", (double)c->sm_scale);
    if (len == 0) ADD("none+");
    if (len > 0 && len < n) buf[len - 1] = 0; /* drop the last '+' */
#undef ADD
}

/* One non-finite value put into the inputs (suite "nonfinite"). */
enum { NF_NONE, NF_Q_NAN, NF_Q_INF, NF_K_NAN, NF_K_INF, NF_V_NAN, NF_V_INF, NF_COUNT };

static const char *nonfinite_name(int kind) {
    static const char *const names[NF_COUNT] = {"", "q_nan", "q_inf", "k_nan", "k_inf",
                                                "v_nan", "v_inf"};
    return kind > 0 && kind < NF_COUNT ? names[kind] : "?";
}

static void case_name(const case_spec *c, char *buf, size_t n) {
    char var[128], plan[96] = "";
    variant_name(c, var, sizeof var);
    size_t len = 0;
    if (c->disable_split) len += (size_t)snprintf(plan + len, sizeof plan - len, "/nosplit");
    if (c->fixed_split) len += (size_t)snprintf(plan + len, sizeof plan - len, "/split%d", (int)c->fixed_split);
    if (c->workers) len += (size_t)snprintf(plan + len, sizeof plan - len, "/w%d", (int)c->workers);
    if (c->layers > 1) len += (size_t)snprintf(plan + len, sizeof plan - len, "/layers%d", (int)c->layers);
    if (c->second_batch) len += (size_t)snprintf(plan + len, sizeof plan - len, "/replan");
    if (c->no_lse) len += (size_t)snprintf(plan + len, sizeof plan - len, "/nolse");
    if (c->extreme) len += (size_t)snprintf(plan + len, sizeof plan - len, "/extreme");
    if (c->nonfinite)
        len += (size_t)snprintf(plan + len, sizeof plan - len, "/%s", nonfinite_name(c->nonfinite));
    if (c->determinism) len += (size_t)snprintf(plan + len, sizeof plan - len, "/rerun");
    char dt[48];
    if (c->kv_dt == FI_DTYPE_E4M3 || c->kv_dt == FI_DTYPE_E5M2)
        snprintf(dt, sizeof dt, "%s_%sk%gv%g_%s", tu_dtype_name(c->q_dt), tu_dtype_name(c->kv_dt),
                 (double)c->k_scale, (double)c->v_scale, tu_dtype_name(c->o_dt));
    else
        snprintf(dt, sizeof dt, "%s_%s_%s", tu_dtype_name(c->q_dt), tu_dtype_name(c->kv_dt),
                 tu_dtype_name(c->o_dt));
    char dims[24];
    if (c->dqk == c->dvo) snprintf(dims, sizeof dims, "d%d", (int)c->dqk);
    else snprintf(dims, sizeof dims, "d%dx%d", (int)c->dqk, (int)c->dvo);
    snprintf(buf, n, "%s/%s/%s/%s/%s/%s/h%d:%d/%s%s", c->be->name, c->suite, format_name(c),
             var, dt, dims, (int)c->hq, (int)c->hkv, c->shape, plan);
}

/* ============================================================ batch shape */

/* Lengths of the named shapes. Modest sizes keep the full run to minutes. */
static void make_lengths(const case_spec *c, tu_rng *rng, int32_t *B, int32_t *qo, int32_t *kv) {
    if (!strcmp(c->shape, "empty_batch")) { /* batch_size 0: nothing to do, nothing written */
        *B = 0;
        return;
    }
    if (c->batch > 0) {
        *B = c->batch;
        memcpy(qo, c->qo_len, sizeof(int32_t) * (size_t)c->batch);
        memcpy(kv, c->kv_len, sizeof(int32_t) * (size_t)c->batch);
        return;
    }
    const char *s = c->shape;
    if (!strcmp(s, "decode")) { /* one new token per request */
        *B = 5;
        for (int32_t i = 0; i < *B; i++) { qo[i] = 1; kv[i] = tu_rng_int(rng, 1, 300); }
    } else if (!strcmp(s, "prefill")) { /* fresh prompts: qo_len == kv_len */
        *B = 3;
        for (int32_t i = 0; i < *B; i++) qo[i] = kv[i] = tu_rng_int(rng, 1, 80);
    } else if (!strcmp(s, "append")) { /* chunked prefill onto a cached prefix */
        *B = 3;
        for (int32_t i = 0; i < *B; i++) {
            qo[i] = tu_rng_int(rng, 2, 40);
            kv[i] = qo[i] + tu_rng_int(rng, 0, 150);
        }
    } else { /* "mixed": decode, append and prefill in one batch */
        *B = 4;
        qo[0] = 1;                         kv[0] = tu_rng_int(rng, 100, 400);
        qo[1] = tu_rng_int(rng, 5, 30);    kv[1] = qo[1] + tu_rng_int(rng, 1, 120);
        qo[2] = 1;                         kv[2] = tu_rng_int(rng, 1, 20);
        qo[3] = tu_rng_int(rng, 10, 50);   kv[3] = qo[3];
    }
}

/* ================================================================ problem */

/* One batch and its tensors: host batch arrays, Q/K/V/O/LSE/mask buffers,
 * host views for the oracle and device views for the library. */
typedef struct problem {
    int32_t B;
    int32_t qo_indptr[MAX_BATCH + 1], kv_indptr[MAX_BATCH + 1];
    int32_t last_page_len[MAX_BATCH], mask_indptr[MAX_BATCH + 1];
    int32_t *kv_indices;
    int32_t total_q, total_kv;   /* total_kv: tokens (ragged) or pages used (paged) */
    int32_t num_pages;           /* pages (paged) or token rows (ragged) in K/V */
    int64_t mask_bytes;
    fi_batch batch;
    cu_ptr table;                    /* kv_indices on the device (device_table) */
    dbuf q, k, v, kvc, o, lse, mask; /* kvc: the combined tensor */
    fi_tensor qh, kh, vh;            /* host views */
    fi_tensor qd, kd, vd;            /* device views */
} problem;

static void problem_free(const backend *be, problem *p) {
    free(p->kv_indices);
    if (p->table) cu.mem_free(p->table);
    dbuf_free(be, &p->q); dbuf_free(be, &p->k); dbuf_free(be, &p->v);
    dbuf_free(be, &p->kvc); dbuf_free(be, &p->o); dbuf_free(be, &p->lse);
    dbuf_free(be, &p->mask);
    memset(p, 0, sizeof *p);
}

/* Pad of one dimension: the head-dim extent gets c->pad, the others 1. */
static void fill_pad(const case_spec *c, int32_t ndim, int64_t *pad) {
    for (int32_t d = 0; d < ndim; d++) pad[d] = c->pad ? 1 : 0;
    if (c->pad) { pad[0] = 0; pad[ndim - 1] = c->pad; }
}

/* Shape of K or V (head dim D) in the case's format. */
static int32_t kv_shape(const case_spec *c, int32_t rows, int32_t D, int64_t *shape) {
    if (c->format == FI_KV_FORMAT_RAGGED) {
        if (c->layout == FI_KV_LAYOUT_NHD) { shape[0] = rows; shape[1] = c->hkv; }
        else { shape[0] = c->hkv; shape[1] = rows; }
        shape[2] = D;
        return 3;
    }
    shape[0] = rows;
    if (c->layout == FI_KV_LAYOUT_NHD) { shape[1] = c->page_size; shape[2] = c->hkv; }
    else { shape[1] = c->hkv; shape[2] = c->page_size; }
    shape[3] = D;
    return 4;
}

/* Byte-poison the K/V slots no request uses (unreferenced pages, the tail of
 * each last page, spare ragged rows): NaN there must never reach O. */
static void poison_unused_kv(const case_spec *c, problem *p, const fi_tensor *t) {
    size_t es = tu_dtype_size(t->dtype);
    int32_t D = (int32_t)t->shape[t->ndim - 1];
    uint8_t *used = calloc((size_t)p->num_pages * (size_t)(c->format == FI_KV_FORMAT_PAGED ? c->page_size : 1), 1);
    for (int32_t b = 0; b < p->B; b++) {
        int64_t len = oracle_kv_len(&(fi_attention_params){.kv_format = c->format,
                                                           .page_size = c->page_size},
                                    &p->batch, b);
        for (int64_t j = 0; j < len; j++) {
            if (c->format == FI_KV_FORMAT_PAGED)
                used[(int64_t)p->kv_indices[p->kv_indptr[b] + j / c->page_size] * c->page_size +
                     j % c->page_size] = 1;
            else
                used[p->kv_indptr[b] + j] = 1;
        }
    }
    int32_t slots = c->format == FI_KV_FORMAT_PAGED ? c->page_size : 1;
    for (int32_t pg = 0; pg < p->num_pages; pg++)
        for (int32_t s = 0; s < slots; s++) {
            if (used[(int64_t)pg * slots + s]) continue;
            for (int32_t h = 0; h < c->hkv; h++)
                for (int32_t d = 0; d < D; d++) {
                    int64_t idx[4];
                    if (c->format == FI_KV_FORMAT_PAGED) {
                        idx[0] = pg; idx[3] = d;
                        if (c->layout == FI_KV_LAYOUT_NHD) { idx[1] = s; idx[2] = h; }
                        else { idx[1] = h; idx[2] = s; }
                    } else {
                        if (c->layout == FI_KV_LAYOUT_NHD) { idx[0] = pg; idx[1] = h; }
                        else { idx[0] = h; idx[1] = pg; }
                        idx[2] = d;
                    }
                    memset((char *)t->data + tu_offset(t, idx) * (int64_t)es, 0xFF, es);
                }
        }
    free(used);
}

/* The non-finite value of a "nonfinite" case, into the host views: in the
 * request with the most queries, at key kv_len - qo_len / 2 - 1 (seen by
 * about half its queries under causal), KV head 0 (or query head 1 of its
 * middle query), element 3. The oracle says what each row then holds. */
static void put_nonfinite(const case_spec *c, problem *p) {
    int32_t b = 0;
    for (int32_t i = 1; i < p->B; i++)
        if (p->qo_indptr[i + 1] - p->qo_indptr[i] > p->qo_indptr[b + 1] - p->qo_indptr[b]) b = i;
    if (p->B == 0) return;
    int32_t qo = p->qo_indptr[b + 1] - p->qo_indptr[b];
    int64_t kv = oracle_kv_len(&(fi_attention_params){.kv_format = c->format,
                                                     .page_size = c->page_size},
                               &p->batch, b);
    double val = (c->nonfinite == NF_Q_NAN || c->nonfinite == NF_K_NAN ||
                  c->nonfinite == NF_V_NAN) ? NAN : INFINITY;
    if (c->nonfinite == NF_Q_NAN || c->nonfinite == NF_Q_INF) {
        int64_t idx[3] = {p->qo_indptr[b] + qo / 2, c->hq > 1 ? 1 : 0, 3};
        tu_set(&p->qh, idx, val);
        return;
    }
    int64_t j = kv - qo / 2 - 1, idx[4];
    if (j < 0) j = 0;
    if (c->format == FI_KV_FORMAT_PAGED) {
        int64_t page = p->kv_indices[p->kv_indptr[b] + j / c->page_size], slot = j % c->page_size;
        idx[0] = page;
        idx[1] = c->layout == FI_KV_LAYOUT_NHD ? slot : 0;
        idx[2] = c->layout == FI_KV_LAYOUT_NHD ? 0 : slot;
        idx[3] = 3;
    } else {
        int64_t row = p->kv_indptr[b] + j;
        idx[0] = c->layout == FI_KV_LAYOUT_NHD ? row : 0;
        idx[1] = c->layout == FI_KV_LAYOUT_NHD ? 0 : row;
        idx[2] = 3;
    }
    tu_set(c->nonfinite == NF_K_NAN || c->nonfinite == NF_K_INF ? &p->kh : &p->vh, idx, val);
}

/* Fresh random Q, K, V and custom mask for the problem's batch. */
static void problem_fill(const case_spec *c, tu_rng *rng, problem *p) {
    double a = c->amplitude;
    tu_fill_uniform(rng, &p->qh, -a, a, 0);
    /* FP8 stores x / scale so the dequantised values span [-a, a] */
    double ks = (c->kv_dt == FI_DTYPE_E4M3 || c->kv_dt == FI_DTYPE_E5M2) ? c->k_scale : 1.0;
    double vs = (c->kv_dt == FI_DTYPE_E4M3 || c->kv_dt == FI_DTYPE_E5M2) ? c->v_scale : 1.0;
    tu_fill_uniform(rng, &p->kh, -a, a, ks);
    tu_fill_uniform(rng, &p->vh, -1.0, 1.0, vs);
    poison_unused_kv(c, p, &p->kh);
    poison_unused_kv(c, p, &p->vh);
    if (c->nonfinite) put_nonfinite(c, p);
    if (c->mask == FI_MASK_CUSTOM) {
        uint8_t *m = p->mask.h.base;
        for (int64_t i = 0; i < p->mask_bytes; i++) m[i] = (uint8_t)tu_rng_next(rng);
        /* A fully masked row in every request with >= 2 queries: O = 0, LSE = -inf. */
        for (int32_t b = 0; b < p->B; b++) {
            int64_t qo = p->qo_indptr[b + 1] - p->qo_indptr[b];
            int64_t kv = oracle_kv_len(&(fi_attention_params){.kv_format = c->format,
                                                              .page_size = c->page_size},
                                       &p->batch, b);
            if (qo < 2) continue;
            for (int64_t j = 0; j < kv; j++) {
                int64_t bit = (qo - 1) * kv + j; /* the last row */
                m[p->mask_indptr[b] + (bit >> 3)] &= (uint8_t)~(1u << (bit & 7));
            }
        }
    }
    if (dbuf_upload(c->be, &p->q) || dbuf_upload(c->be, &p->mask)) return;
    if (c->combined) dbuf_upload(c->be, &p->kvc);
    else { dbuf_upload(c->be, &p->k); dbuf_upload(c->be, &p->v); }
}

/* fi_plan_update; for a device_table case with the page table in the
 * backend's memory (uploaded once per problem). */
static fi_status plan_update(const case_spec *c, fi_plan *plan, problem *p) {
    if (!c->device_table || c->format != FI_KV_FORMAT_PAGED) return fi_plan_update(plan, &p->batch);
    fi_batch b = p->batch;
    if (c->be->device == FI_DEVICE_CUDA) {
        size_t n = (size_t)p->kv_indptr[p->B] * sizeof(int32_t);
        if (!p->table && (cu.mem_alloc(&p->table, n ? n : 4) ||
                          (n && (cu.htod(p->table, p->kv_indices, n) || cu.sync())))) {
            tu_note("could not upload the page table");
            return FI_STATUS_OUT_OF_MEMORY;
        }
        b.kv_indices = (const int32_t *)(uintptr_t)p->table;
    }
    return fi_plan_update(plan, &b);
}

/* Build the batch arrays and allocate the tensors of a problem. */
static int problem_build(const case_spec *c, tu_rng *rng, int32_t B, const int32_t *qo,
                         const int32_t *kv, problem *p) {
    const backend *be = c->be;
    memset(p, 0, sizeof *p);
    p->B = B;
    p->qo_indptr[0] = p->kv_indptr[0] = p->mask_indptr[0] = 0;
    int32_t pages = 0;
    for (int32_t b = 0; b < B; b++) {
        p->qo_indptr[b + 1] = p->qo_indptr[b] + qo[b];
        if (c->format == FI_KV_FORMAT_PAGED) {
            int32_t n = (kv[b] + c->page_size - 1) / c->page_size;
            p->kv_indptr[b + 1] = p->kv_indptr[b] + n;
            p->last_page_len[b] = n ? kv[b] - c->page_size * (n - 1) : 0;
            pages += n;
        } else {
            p->kv_indptr[b + 1] = p->kv_indptr[b] + kv[b];
        }
        /* segments byte-aligned; with mask_indptr, a few garbage bytes between */
        int64_t seg = ((int64_t)qo[b] * kv[b] + 7) / 8;
        p->mask_indptr[b + 1] = p->mask_indptr[b] + (int32_t)seg + (c->mask_indptr ? 3 : 0);
    }
    p->total_q = p->qo_indptr[B];
    p->total_kv = p->kv_indptr[B];
    p->mask_bytes = p->mask_indptr[B];
    if (c->format == FI_KV_FORMAT_PAGED) {
        /* A pool with spare pages, handed out in a random order. */
        p->num_pages = pages + 3;
        int32_t *perm = malloc(sizeof(int32_t) * (size_t)p->num_pages);
        for (int32_t i = 0; i < p->num_pages; i++) perm[i] = i;
        for (int32_t i = p->num_pages - 1; i > 0; i--) {
            int32_t j = tu_rng_int(rng, 0, i), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        p->kv_indices = perm; /* the first `pages` entries are used */
    } else {
        p->num_pages = p->total_kv + 2; /* two spare rows */
        p->kv_indices = NULL;
    }
    p->batch.batch_size = B;
    p->batch.qo_indptr = p->qo_indptr;
    p->batch.kv_indptr = p->kv_indptr;
    p->batch.kv_indices = p->kv_indices;
    p->batch.kv_last_page_len = c->format == FI_KV_FORMAT_PAGED ? p->last_page_len : NULL;
    p->batch.mask_indptr = (c->mask == FI_MASK_CUSTOM && c->mask_indptr) ? p->mask_indptr : NULL;

    int64_t shape[6], pad[6];
    int64_t qshape[3] = {p->total_q, c->hq, c->dqk};
    fill_pad(c, 3, pad);
    if (dbuf_alloc(be, &p->q, c->q_dt, 3, qshape, pad)) return -1;
    int64_t oshape[3] = {p->total_q, c->hq, c->dvo};
    if (dbuf_alloc(be, &p->o, c->o_dt, 3, oshape, pad)) return -1;
    int64_t lshape[2] = {p->total_q, c->hq};
    int64_t lpad[2] = {0, c->pad ? 2 : 0};
    if (dbuf_alloc(be, &p->lse, FI_DTYPE_F32, 2, lshape, lpad)) return -1;
    int64_t mshape[1] = {p->mask_bytes};
    if (dbuf_alloc(be, &p->mask, FI_DTYPE_U8, 1, mshape, NULL)) return -1;
    p->qh = p->q.h.t;
    p->qd = p->q.dev;

    if (c->combined) {
        /* [pages, 2, ...]: K is index 0 of dim 1, V index 1 */
        int32_t nd = kv_shape(c, p->num_pages, c->dqk, shape);
        for (int32_t d = nd; d > 1; d--) shape[d] = shape[d - 1];
        shape[1] = 2;
        fill_pad(c, nd + 1, pad);
        pad[1] = 0;
        if (dbuf_alloc(be, &p->kvc, c->kv_dt, nd + 1, shape, pad)) return -1;
        fi_tensor all = p->kvc.h.t, kh, vh;
        kh.data = all.data;
        kh.dtype = all.dtype;
        kh.ndim = nd;
        for (int32_t d = 0, e = 0; d < nd + 1; d++) {
            if (d == 1) continue;
            kh.shape[e] = all.shape[d];
            kh.stride[e] = all.stride[d];
            e++;
        }
        vh = kh;
        vh.data = (char *)all.data + all.stride[1] * (int64_t)tu_dtype_size(all.dtype);
        p->kh = kh;
        p->vh = vh;
        /* The library's split of the device view must give the same views. */
        fi_tensor ks, vs;
        fi_status st = fi_tensor_split_kv(&p->kvc.dev, &ks, &vs);
        fi_tensor kexp = dbuf_dev_view(&p->kvc, &kh), vexp = dbuf_dev_view(&p->kvc, &vh);
        if (st != FI_OK) {
            tu_note("fi_tensor_split_kv: %s: %s", fi_status_string(st), fi_last_error());
            return -2;
        }
        if (ks.data != kexp.data || vs.data != vexp.data || ks.ndim != nd || vs.ndim != nd ||
            memcmp(ks.shape, kexp.shape, sizeof(int64_t) * (size_t)nd) ||
            memcmp(ks.stride, kexp.stride, sizeof(int64_t) * (size_t)nd) ||
            memcmp(vs.shape, vexp.shape, sizeof(int64_t) * (size_t)nd) ||
            memcmp(vs.stride, vexp.stride, sizeof(int64_t) * (size_t)nd)) {
            tu_note("fi_tensor_split_kv gave views other than [:,0] and [:,1]");
            return -2;
        }
        p->kd = ks;
        p->vd = vs;
    } else {
        int32_t nd = kv_shape(c, p->num_pages, c->dqk, shape);
        fill_pad(c, nd, pad);
        if (dbuf_alloc(be, &p->k, c->kv_dt, nd, shape, pad)) return -1;
        nd = kv_shape(c, p->num_pages, c->dvo, shape);
        if (dbuf_alloc(be, &p->v, c->kv_dt, nd, shape, pad)) return -1;
        p->kh = p->k.h.t;
        p->vh = p->v.h.t;
        p->kd = p->k.dev;
        p->vd = p->v.dev;
    }
    problem_fill(c, rng, p);
    return 0;
}

/* ================================================================ running */

static fi_attention_params case_params(const case_spec *c, float *slopes) {
    fi_attention_params pa;
    fi_attention_params_init(&pa);
    pa.num_qo_heads = c->hq;
    pa.num_kv_heads = c->hkv;
    pa.head_dim_qk = c->dqk;
    pa.head_dim_vo = c->dvo;
    pa.kv_format = c->format;
    pa.page_size = c->page_size;
    pa.kv_layout = c->layout;
    pa.q_dtype = c->q_dt;
    pa.kv_dtype = c->kv_dt;
    pa.o_dtype = c->o_dt;
    pa.mask_mode = c->mask;
    pa.window_left = c->window_left;
    pa.logits_soft_cap = c->soft_cap;
    pa.sm_scale = c->sm_scale;
    pa.pos_encoding = c->pos;
    pa.rope_scale = c->rope_scale;
    pa.rope_theta = c->rope_theta;
    pa.k_scale = c->k_scale;
    pa.v_scale = c->v_scale;
    if (c->pos == FI_POS_ALIBI && c->custom_slopes) {
        for (int32_t h = 0; h < c->hq; h++) slopes[h] = 0.05f + 0.11f * (float)((h * 5) % 7);
        pa.alibi_slopes = slopes;
    }
    return pa;
}

static double dtype_tol(fi_dtype t) {
    switch (t) {
    case FI_DTYPE_F32: return 1e-5;
    case FI_DTYPE_F16: return 1e-3;
    case FI_DTYPE_BF16: return 1e-2;
    default: return 1e-3; /* FP8 KV: the oracle reads the same FP8 values,
                             only the kernel's f16-or-better arithmetic remains */
    }
}

/* Tolerance of a case: the loosest dtype it touches, widened for fused RoPE
 * (the kernel's f32 angles lose ~pos * 2^-24 radians) and long sums. */
static double case_tol(const case_spec *c, const problem *p) {
    double tol = dtype_tol(c->q_dt);
    if (dtype_tol(c->kv_dt) > tol) tol = dtype_tol(c->kv_dt);
    if (dtype_tol(c->o_dt) > tol) tol = dtype_tol(c->o_dt);
    int32_t max_kv = 0;
    for (int32_t b = 0; b < p->B; b++) {
        int64_t len = oracle_kv_len(&(fi_attention_params){.kv_format = c->format,
                                                           .page_size = c->page_size},
                                    &p->batch, b);
        if (len > max_kv) max_kv = (int32_t)len;
    }
    if (c->pos == FI_POS_ROPE_LLAMA) {
        double rope_tol = 1e-5 + 1e-7 * max_kv / c->rope_scale;
        if (rope_tol > tol) tol = rope_tol;
    }
    if (max_kv > 4096 && tol < 4e-5) tol = 4e-5;
    return tol;
}

/* Tolerance of LSE (f32, log2 units). Logits come from the stored q/k
 * values, exact in f32, with f32 accumulation (docs/SEMANTICS.md), so whatever the
 * dtypes only f32 rounding remains, except with fused RoPE, where a kernel
 * may round the rotated q/k back to their dtype (FP8 K to f16). */
static double case_lse_tol(const case_spec *c, const problem *p) {
    double tol = 1e-5;
    if (c->pos == FI_POS_ROPE_LLAMA) {
        double t = case_tol(c, p), tq = dtype_tol(c->q_dt);
        double tk = (c->kv_dt == FI_DTYPE_E4M3 || c->kv_dt == FI_DTYPE_E5M2) ? dtype_tol(FI_DTYPE_F16)
                                                                             : dtype_tol(c->kv_dt);
        if (dtype_tol(c->o_dt) >= t) t = 0; /* the o dtype alone does not touch LSE */
        if (t > tol) tol = t;
        if (tq > tol) tol = tq;
        if (tk > tol) tol = tk;
    }
    for (int32_t b = 0; b < p->B; b++)
        if (p->kv_indptr[b + 1] - p->kv_indptr[b] > 4096 / (c->format == FI_KV_FORMAT_PAGED ? c->page_size : 1))
            if (tol < 4e-5) tol = 4e-5;
    return tol;
}

/* Run the plan on the problem (poisoned outputs first), then compare O and
 * LSE with the oracle. Returns 0 if everything holds; notes say what not. */
/* How a run is launched: NULL = fi_plan_run; else e.g. a CUDA graph replay. */
typedef struct runner {
    fi_status (*run)(void *self, fi_plan *plan, const fi_run_args *args);
    void *self;
} runner;

static int run_and_check_with(const case_spec *c, fi_plan *plan, const fi_attention_params *pa,
                              problem *p, const char *what, const runner *rn);

static int run_and_check(const case_spec *c, fi_plan *plan, const fi_attention_params *pa,
                         problem *p, const char *what) {
    return run_and_check_with(c, plan, pa, p, what, NULL);
}

/* A "nonfinite" case's elements: a NaN reference wants a NaN, an infinite
 * one the same infinity, a finite one a finite value within tol abs+rel.
 * Returns the mismatches, the first noted. */
static int64_t compare_classes(const char *what, const char *name, const double *got,
                               const double *ref, int64_t n, double tol) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int ok = isnan(ref[i]) ? isnan(got[i])
               : isinf(ref[i]) ? got[i] == ref[i]
               : isfinite(got[i]) && fabs(got[i] - ref[i]) <= tol + tol * fabs(ref[i]);
        if (!ok && bad++ == 0)
            tu_note("%s: %s[%lld] got %.9g want %.9g", what, name, (long long)i, got[i], ref[i]);
    }
    if (bad) tu_note("%s: %s: %lld of %lld elements differ", what, name, (long long)bad, (long long)n);
    return bad;
}

static int run_and_check_with(const case_spec *c, fi_plan *plan, const fi_attention_params *pa,
                              problem *p, const char *what, const runner *rn) {
    const backend *be = c->be;
    tu_buf_poison(&p->o.h);
    tu_buf_poison(&p->lse.h);
    if (c->nonfinite) {
        /* an expected NaN must not pass for untouched poison: the views get a
         * finite value first (their padding keeps the poison) */
        for (int64_t i = 0; i < tu_numel(&p->o.h.t); i++) tu_view_set(&p->o.h.t, i, 7.0);
        for (int64_t i = 0; i < tu_numel(&p->lse.h.t); i++) tu_view_set(&p->lse.h.t, i, 7.0);
    }
    dbuf_upload(be, &p->o);
    dbuf_upload(be, &p->lse);
    uint64_t sum_q = buf_checksum(&p->q.h);
    uint64_t sum_k = buf_checksum(c->combined ? &p->kvc.h : &p->k.h);
    uint64_t sum_v = c->combined ? 0 : buf_checksum(&p->v.h);

    fi_run_args args;
    memset(&args, 0, sizeof args);
    args.q = p->qd;
    args.k = p->kd;
    args.v = p->vd;
    args.o = p->o.dev;
    args.lse = p->lse.dev;
    if (c->no_lse) args.lse.data = NULL;
    if (c->mask == FI_MASK_CUSTOM) args.custom_mask = p->mask.dev;
    fi_status st = rn ? rn->run(rn->self, plan, &args) : fi_plan_run(plan, &args);
    if (st != FI_OK) {
        tu_note("%s: fi_plan_run: %s: %s", what, fi_status_string(st), fi_last_error());
        return -1;
    }
    dbuf_download(be, &p->o);
    dbuf_download(be, &p->lse);
    int bad = 0;

    /* Inputs are read-only (checked on the host copies: the device ones
     * were uploaded from them and are not read back). */
    if (be->device == FI_DEVICE_CPU &&
        (buf_checksum(&p->q.h) != sum_q ||
         buf_checksum(c->combined ? &p->kvc.h : &p->k.h) != sum_k ||
         (!c->combined && buf_checksum(&p->v.h) != sum_v))) {
        tu_note("%s: the run modified Q, K or V", what);
        bad = 1;
    }
    int64_t touched = tu_buf_touched_outside(&p->o.h);
    if (touched) {
        tu_note("%s: %lld bytes of O outside the view were written", what, (long long)touched);
        bad = 1;
    }
    if (c->no_lse) {
        uint8_t *l = p->lse.h.base;
        for (size_t i = 0; i < p->lse.h.bytes; i++)
            if (l[i] != 0xFF) { tu_note("%s: LSE written though not asked for", what); bad = 1; break; }
    } else if ((touched = tu_buf_touched_outside(&p->lse.h)) != 0) {
        tu_note("%s: %lld bytes of LSE outside the view were written", what, (long long)touched);
        bad = 1;
    }

    /* The oracle on the host copies. */
    int64_t no = (int64_t)p->total_q * c->hq * c->dvo, nl = (int64_t)p->total_q * c->hq;
    double *ref_o = malloc(sizeof(double) * (size_t)(no + 1));
    double *ref_l = malloc(sizeof(double) * (size_t)(nl + 1));
    double *got_o = malloc(sizeof(double) * (size_t)(no + 1));
    double *got_l = malloc(sizeof(double) * (size_t)(nl + 1));
    const uint8_t *mask = c->mask == FI_MASK_CUSTOM ? p->mask.h.base : NULL;
    if (oracle_attention(pa, &p->batch, &p->qh, &p->kh, &p->vh, mask, ref_o, ref_l)) {
        tu_note("%s: the oracle rejected the batch (test bug)", what);
        bad = 1;
    }
    for (int64_t t = 0; t < p->total_q; t++)
        for (int64_t h = 0; h < c->hq; h++) {
            int64_t il[2] = {t, h};
            got_l[t * c->hq + h] = tu_get(&p->lse.h.t, il);
            for (int64_t d = 0; d < c->dvo; d++) {
                int64_t io[3] = {t, h, d};
                got_o[(t * c->hq + h) * c->dvo + d] = tu_get(&p->o.h.t, io);
            }
        }
    /* V is uniform in [-1, 1] after dequantisation: errors scale with 1. */
    double tol = case_tol(c, p), ltol = case_lse_tol(c, p), vmax = 1.0;
    tu_cmp co, cl;
    if (c->extreme) {
        /* Near one-hot softmax: O must stay finite and inside V's range,
         * LSE finite and close in relative terms. */
        for (int64_t i = 0; i < no; i++)
            if (!isfinite(got_o[i]) || fabs(got_o[i]) > vmax * 1.01) {
                tu_note("%s: O[%lld] = %g with huge logits (expected finite, |O| <= 1)", what,
                        (long long)i, got_o[i]);
                bad = 1;
                break;
            }
        /* logits ~1e5 carry f32 errors ~0.1 (or a capped tanh's ~1e-3
         * relative), so LSE is held to 1e-3 relative here */
        if (!c->no_lse && tu_compare(got_l, ref_l, nl, 1e-2, 1e-3, &cl)) {
            tu_note("%s: LSE: %lld of %lld out of tolerance; worst [%lld] got %.9g want %.9g",
                    what, (long long)cl.bad, (long long)cl.n, (long long)cl.worst, cl.worst_got,
                    cl.worst_ref);
            bad = 1;
        }
    } else if (c->nonfinite) {
        if (compare_classes(what, "O", got_o, ref_o, no, tol)) bad = 1;
        if (!c->no_lse && compare_classes(what, "LSE", got_l, ref_l, nl, ltol)) bad = 1;
    } else {
        if (tu_compare(got_o, ref_o, no, tol * vmax, tol, &co)) {
            int64_t w = co.worst, d = w % c->dvo, h = (w / c->dvo) % c->hq, t = w / c->dvo / c->hq;
            tu_note("%s: O: %lld of %lld out of tolerance (%g abs+rel), %lld NaN; worst "
                    "[token %lld, head %lld, dim %lld] got %.9g want %.9g (%.3gx the bound)",
                    what, (long long)co.bad, (long long)co.n, tol, (long long)co.nan,
                    (long long)t, (long long)h, (long long)d, co.worst_got, co.worst_ref,
                    co.max_ratio);
            bad = 1;
        }
        if (!c->no_lse && tu_compare(got_l, ref_l, nl, ltol, ltol, &cl)) {
            int64_t w = cl.worst;
            tu_note("%s: LSE: %lld of %lld out of tolerance (%g abs+rel), %lld NaN; worst [token %lld, "
                    "head %lld] got %.9g want %.9g", what, (long long)cl.bad, (long long)cl.n,
                    ltol, (long long)cl.nan, (long long)(w / c->hq), (long long)(w % c->hq),
                    cl.worst_got, cl.worst_ref);
            bad = 1;
        }
    }
    if (tu_opt.verbose && !bad && c->extreme)
        tu_note("%s: O finite and within V's range; LSE max err %.3g (%.3gx bound 1e-2 + 1e-3 |lse|)",
                what, c->no_lse ? 0 : cl.max_abs_err, c->no_lse ? 0 : cl.max_ratio);
    else if (tu_opt.verbose && !bad && !c->nonfinite)
        tu_note("%s: tol %g, O max err %.3g (%.3gx bound); LSE tol %g, max err %.3g (%.3gx bound)",
                what, tol, c->extreme ? 0 : co.max_abs_err, c->extreme ? 0 : co.max_ratio, ltol,
                c->no_lse ? 0 : cl.max_abs_err, c->no_lse ? 0 : cl.max_ratio);

    if (c->determinism && !bad) {
        /* Same inputs, same plan: the same bits. */
        size_t ob = p->o.h.bytes, lb = p->lse.h.bytes;
        uint8_t *o1 = malloc(ob), *l1 = malloc(lb);
        memcpy(o1, p->o.h.base, ob);
        memcpy(l1, p->lse.h.base, lb);
        tu_buf_poison(&p->o.h);
        tu_buf_poison(&p->lse.h);
        dbuf_upload(be, &p->o);
        dbuf_upload(be, &p->lse);
        st = fi_plan_run(plan, &args);
        dbuf_download(be, &p->o);
        dbuf_download(be, &p->lse);
        if (st != FI_OK || memcmp(o1, p->o.h.base, ob) || memcmp(l1, p->lse.h.base, lb)) {
            tu_note("%s: a second run gave different bits (status %s)", what, fi_status_string(st));
            bad = 1;
        }
        free(o1);
        free(l1);
    }
    free(ref_o); free(ref_l); free(got_o); free(got_l);
    return bad ? -1 : 0;
}

static fi_plan_config case_config(const case_spec *c, const problem *a, const problem *b) {
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    /* Bounds exactly as large as the batches need: a plan must fit them. */
    cfg.max_batch_size = a->B;
    cfg.max_total_qo = a->total_q;
    cfg.max_total_kv = a->total_kv;
    if (b) {
        if (b->B > cfg.max_batch_size) cfg.max_batch_size = b->B;
        if (b->total_q > cfg.max_total_qo) cfg.max_total_qo = b->total_q;
        if (b->total_kv > cfg.max_total_kv) cfg.max_total_kv = b->total_kv;
    }
    if (cfg.max_batch_size < 1) cfg.max_batch_size = 1;
    if (cfg.max_total_qo < 1) cfg.max_total_qo = 1;
    if (cfg.max_total_kv < 1) cfg.max_total_kv = 1;
    cfg.device_page_table = c->device_table && c->format == FI_KV_FORMAT_PAGED;
    cfg.num_workers = c->workers;
    cfg.disable_split_kv = c->disable_split;
    cfg.fixed_split_size = c->fixed_split;
    return cfg;
}

static tu_result run_case(const case_spec *c, const char *name) {
    fi_context *ctx = backend_context(c->be);
    if (!ctx) {
        tu_note("backend %s: %s", c->be->name, c->be->why_not);
        return TU_SKIP;
    }
    uint64_t seed = tu_case_seed(name);
    tu_crash_context(name, seed);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    int32_t B, qo[MAX_BATCH], kv[MAX_BATCH];
    make_lengths(c, &rng, &B, qo, kv);

    problem p1, p2;
    memset(&p2, 0, sizeof p2);
    int bad = 0;
    tu_result result = TU_PASS;
    fi_plan *plan = NULL;
    float slopes[64];
    fi_attention_params pa = case_params(c, slopes);
    int rc = problem_build(c, &rng, B, qo, kv, &p1);
    if (!rc && c->second_batch) {
        int32_t B2, qo2[MAX_BATCH], kv2[MAX_BATCH];
        case_spec c2 = *c;
        c2.batch = 0;
        c2.shape = strcmp(c->shape, "decode") ? "decode" : "mixed";
        make_lengths(&c2, &rng, &B2, qo2, kv2);
        rc = problem_build(c, &rng, B2, qo2, kv2, &p2);
    }
    if (rc) {
        if (rc == -1) tu_note("test could not allocate its buffers");
        bad = 1;
        goto done;
    }
    fi_plan_config cfg = case_config(c, &p1, c->second_batch ? &p2 : NULL);
    fi_status st = fi_plan_create(ctx, &pa, &cfg, &plan);
    if (st == FI_STATUS_UNSUPPORTED) {
        tu_note("fi_plan_create: unsupported here: %s", fi_last_error());
        result = TU_SKIP;
        goto done;
    }
    if (st != FI_OK) {
        tu_note("fi_plan_create: %s: %s", fi_status_string(st), fi_last_error());
        bad = 1;
        goto done;
    }
    st = plan_update(c, plan, &p1);
    if (st != FI_OK) {
        tu_note("fi_plan_update: %s: %s", fi_status_string(st), fi_last_error());
        bad = 1;
        goto done;
    }
    if (c->fixed_split > 0) {
        /* The header promises chunks of exactly fixed_split_size keys. */
        fi_plan_info info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        int32_t longest = 0;
        for (int32_t b = 0; b < B; b++) if (kv[b] > longest) longest = kv[b];
        if (fi_plan_get_info(plan, &info) == FI_OK && longest > c->fixed_split &&
            !c->disable_split && info.kv_chunk != c->fixed_split) {
            tu_note("fixed_split_size=%d but the plan's kv_chunk=%d", (int)c->fixed_split,
                    (int)info.kv_chunk);
            bad = 1;
        }
    }
    for (int32_t layer = 0; layer < c->layers; layer++) {
        char what[32];
        snprintf(what, sizeof what, "batch 1 layer %d", (int)layer);
        if (layer > 0) problem_fill(c, &rng, &p1); /* a new layer: new Q/K/V */
        if (run_and_check(c, plan, &pa, &p1, what)) { bad = 1; break; }
    }
    if (!bad && c->second_batch) {
        st = plan_update(c, plan, &p2);
        if (st != FI_OK) {
            tu_note("fi_plan_update (batch 2): %s: %s", fi_status_string(st), fi_last_error());
            bad = 1;
        } else if (run_and_check(c, plan, &pa, &p2, "batch 2")) {
            bad = 1;
        }
    }
done:
    fi_plan_destroy(plan);
    problem_free(c->be, &p1);
    problem_free(c->be, &p2);
    if (bad) {
        tu_note("seed %llu; rerun: build/test_attention --filter '%s'", (unsigned long long)seed, name);
        return TU_FAIL;
    }
    return result;
}

/* Filter, name and run (or list) one case. */
static void submit(case_spec c) {
    char name[256];
    case_name(&c, name, sizeof name);
    if (!tu_backend_selected(c.be->device_name) || (tu_opt.quick && !c.quick)) return;
    if (!tu_begin_case(name)) return;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    tu_result r = run_case(&c, name);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (tu_opt.verbose)
        tu_note("%.1f ms", (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6);
    tu_record(c.suite, name, r);
}

/* =========================================================== oracle checks */

/* The oracle itself against answers worked out by hand, so a wrong oracle
 * cannot pass a wrong library. */
static void oracle_self_checks(void) {
    if (!tu_selected("oracle/") || tu_opt.list) return;
    fi_attention_params pa;
    fi_attention_params_init(&pa);
    pa.num_qo_heads = 2; pa.num_kv_heads = 1; pa.head_dim_qk = pa.head_dim_vo = 64;
    pa.kv_format = FI_KV_FORMAT_RAGGED; pa.q_dtype = pa.kv_dtype = pa.o_dtype = FI_DTYPE_F32;
    pa.k_scale = pa.v_scale = 1.0f;
    enum { L = 5, D = 64 };
    static float q[3][2][D], k[L][1][D], v[L][1][D];
    int32_t qo_indptr[2] = {0, 3}, kv_indptr[2] = {0, L};
    fi_batch batch = {1, qo_indptr, kv_indptr, NULL, NULL, NULL};
    int64_t qs[3] = {3, 2, D}, ks[3] = {L, 1, D};
    fi_tensor qt = fi_tensor_contiguous(q, FI_DTYPE_F32, 3, qs);
    fi_tensor kt = fi_tensor_contiguous(k, FI_DTYPE_F32, 3, ks);
    fi_tensor vt = fi_tensor_contiguous(v, FI_DTYPE_F32, 3, ks);
    double o[3 * 2 * D], lse[3 * 2];
    int ok;

    /* Equal keys: uniform weights; O = mean of V, LSE = log2(n) + s log2 e. */
    memset(q, 0, sizeof q); memset(k, 0, sizeof k);
    for (int d = 0; d < D; d++) { q[0][0][d] = 0.5f; for (int j = 0; j < L; j++) k[j][0][d] = 0.25f; }
    for (int j = 0; j < L; j++) for (int d = 0; d < D; d++) v[j][0][d] = (float)(j + 1) + 0.01f * d;
    ok = !oracle_attention(&pa, &batch, &qt, &kt, &vt, NULL, o, lse);
    double s = 0.5 * 0.25 * D / sqrt((double)D);
    ok = ok && fabs(o[0] - 3.0) < 1e-12 && fabs(o[5] - 3.05) < 1e-6 &&
         fabs(lse[0] - (log2((double)L) + s / log(2.0))) < 1e-12;
    /* Query 1 (head 0) is all zeros: same uniform weights, LSE = log2(L). */
    ok = ok && fabs(o[(1 * 2 + 0) * D] - 3.0) < 1e-12 && fabs(lse[2] - log2((double)L)) < 1e-12;
    tu_record("oracle", "oracle/uniform_weights", ok ? TU_PASS : TU_FAIL);

    /* Causal bottom-right with qo_len 3 < kv_len 5: query i sees j <= 2 + i.
     * With all-zero logits O is the mean of V over visible keys. */
    memset(q, 0, sizeof q);
    pa.mask_mode = FI_MASK_CAUSAL;
    ok = !oracle_attention(&pa, &batch, &qt, &kt, &vt, NULL, o, lse);
    for (int i = 0; i < 3; i++) { /* visible keys 0..2+i: mean of (j + 1) */
        double mean = (3.0 + i + 1.0) / 2.0;
        ok = ok && fabs(o[(i * 2 + 1) * D] - mean) < 1e-12 && fabs(lse[i * 2] - log2(3.0 + i)) < 1e-12;
    }
    /* Window 1 on top: query i sees j in [1 + i, 2 + i]. */
    pa.window_left = 1;
    ok = ok && !oracle_attention(&pa, &batch, &qt, &kt, &vt, NULL, o, lse);
    for (int i = 0; i < 3; i++) ok = ok && fabs(o[(i * 2) * D] - (i + 2.5)) < 1e-12;
    tu_record("oracle", "oracle/causal_window", ok ? TU_PASS : TU_FAIL);
    pa.window_left = -1;

    /* qo_len > kv_len under causal: rows with no key give O = 0, LSE = -inf. */
    int32_t kv_short[2] = {0, 1};
    fi_batch b2 = {1, qo_indptr, kv_short, NULL, NULL, NULL};
    ok = !oracle_attention(&pa, &b2, &qt, &kt, &vt, NULL, o, lse);
    ok = ok && o[0] == 0.0 && isinf(lse[0]) && lse[0] < 0 && isinf(lse[3]) &&
         fabs(o[(2 * 2) * D] - 1.0) < 1e-12 && fabs(lse[4]) < 1e-12;
    tu_record("oracle", "oracle/empty_rows", ok ? TU_PASS : TU_FAIL);

    /* ALiBi with zero logits: weights 2^... ; two keys, query at position 1
     * of kv_len 2: logits slope*(j-1) = {-m, 0}. H=2: slopes 2^-4, 2^-8. */
    pa.mask_mode = FI_MASK_NONE;
    pa.pos_encoding = FI_POS_ALIBI;
    int32_t q1[2] = {0, 1}, kv2[2] = {0, 2};
    fi_batch b3 = {1, q1, kv2, NULL, NULL, NULL};
    ok = !oracle_attention(&pa, &b3, &qt, &kt, &vt, NULL, o, lse);
    for (int h = 0; h < 2; h++) {
        double m = h == 0 ? 1.0 / 16 : 1.0 / 256, w0 = exp(-m), w1 = 1.0;
        double want = (w0 * 1.0 + w1 * 2.0) / (w0 + w1);
        ok = ok && fabs(o[h * D] - want) < 1e-12 && fabs(lse[h] - log2(w0 + w1)) < 1e-12;
    }
    ok = ok && fabs(oracle_alibi_slope(8, 12) - pow(2.0, -0.5)) < 1e-15 &&
         fabs(oracle_alibi_slope(11, 12) - pow(2.0, -3.5)) < 1e-15;
    tu_record("oracle", "oracle/alibi", ok ? TU_PASS : TU_FAIL);

    /* RoPE: a rotation keeps norms, and q.k depends only on the position
     * difference. With q = k at positions 2 and 2 the logit equals |k|^2. */
    pa.pos_encoding = FI_POS_ROPE_LLAMA;
    memset(q, 0, sizeof q); memset(k, 0, sizeof k);
    for (int d = 0; d < D; d++) { q[0][0][d] = k[2][0][d] = (float)((d % 7) - 3) * 0.1f; }
    int32_t q1b[2] = {0, 1}, kv3[2] = {0, 3}; /* query at position 2, key 2 at position 2 */
    fi_batch b4 = {1, q1b, kv3, NULL, NULL, NULL};
    pa.mask_mode = FI_MASK_CUSTOM;
    uint8_t bits = 0x4; /* only key 2 */
    ok = !oracle_attention(&pa, &b4, &qt, &kt, &vt, &bits, o, lse);
    double n2 = 0;
    for (int d = 0; d < D; d++) n2 += (double)q[0][0][d] * k[2][0][d];
    ok = ok && fabs(lse[0] - n2 / sqrt((double)D) / log(2.0)) < 1e-9 && fabs(o[0] - 3.0) < 1e-12;
    tu_record("oracle", "oracle/rope_custom_mask", ok ? TU_PASS : TU_FAIL);
}

/* ================================================================= suites */

static int quick_counter;
/* Every n-th case of a suite joins --quick. */
static int every(int n) { return (quick_counter++ % n) == 0; }

static void suite_format(backend *be) {
    /* formats x mask x shape, f16, d128, GQA 4 */
    struct { fi_kv_format f; fi_kv_layout l; int comb, pad, ps; } fm[] = {
        {FI_KV_FORMAT_PAGED, FI_KV_LAYOUT_NHD, 0, 0, 16},
        {FI_KV_FORMAT_PAGED, FI_KV_LAYOUT_HND, 0, 0, 16},
        {FI_KV_FORMAT_RAGGED, FI_KV_LAYOUT_NHD, 0, 0, 16},
        {FI_KV_FORMAT_RAGGED, FI_KV_LAYOUT_HND, 0, 0, 16},
        {FI_KV_FORMAT_PAGED, FI_KV_LAYOUT_NHD, 1, 0, 16},
        {FI_KV_FORMAT_PAGED, FI_KV_LAYOUT_HND, 1, 0, 16},
        {FI_KV_FORMAT_PAGED, FI_KV_LAYOUT_NHD, 0, 8, 16},
        {FI_KV_FORMAT_PAGED, FI_KV_LAYOUT_HND, 0, 8, 16},
        {FI_KV_FORMAT_RAGGED, FI_KV_LAYOUT_NHD, 0, 8, 16},
        {FI_KV_FORMAT_PAGED, FI_KV_LAYOUT_HND, 1, 8, 16},
        {FI_KV_FORMAT_PAGED, FI_KV_LAYOUT_NHD, 0, 0, 1},
        {FI_KV_FORMAT_PAGED, FI_KV_LAYOUT_HND, 0, 0, 7},
        {FI_KV_FORMAT_PAGED, FI_KV_LAYOUT_NHD, 0, 0, 64},
    };
    const char *shapes[] = {"decode", "prefill", "mixed"};
    for (size_t i = 0; i < sizeof fm / sizeof fm[0]; i++)
        for (int m = 0; m < 2; m++)
            for (int s = 0; s < 3; s++) {
                case_spec c = default_spec("format", be);
                c.format = fm[i].f; c.layout = fm[i].l; c.combined = fm[i].comb;
                c.pad = fm[i].pad; c.page_size = fm[i].ps;
                c.mask = m ? FI_MASK_CAUSAL : FI_MASK_NONE;
                c.shape = shapes[s];
                c.quick = every(7);
                submit(c);
            }
    /* An odd pad: rows aligned only to the element (f32, stride 131). */
    case_spec c = default_spec("format", be);
    c.q_dt = c.kv_dt = c.o_dt = FI_DTYPE_F32;
    c.pad = 3;
    c.mask = FI_MASK_CAUSAL;
    c.quick = 1;
    submit(c);
}

static void set_variant(case_spec *c, int v) {
    switch (v) {
    case 0: break;
    case 1: c->mask = FI_MASK_CAUSAL; break;
    case 2: c->window_left = 13; break;
    case 3: c->mask = FI_MASK_CAUSAL; c->window_left = 13; break;
    case 4: c->mask = FI_MASK_CAUSAL; c->window_left = 0; break;
    case 5: c->soft_cap = 2.5f; break;
    case 6: c->mask = FI_MASK_CAUSAL; c->soft_cap = 2.5f; break;
    case 7: c->pos = FI_POS_ALIBI; break;
    case 8: c->mask = FI_MASK_CAUSAL; c->pos = FI_POS_ALIBI; break;
    case 9: c->pos = FI_POS_ALIBI; c->custom_slopes = 1; break;
    case 10: c->mask = FI_MASK_CAUSAL; c->pos = FI_POS_ALIBI; c->hq = 12; c->hkv = 4; break;
    case 11: c->pos = FI_POS_ROPE_LLAMA; break;
    case 12: c->mask = FI_MASK_CAUSAL; c->pos = FI_POS_ROPE_LLAMA; break;
    case 13: c->mask = FI_MASK_CAUSAL; c->pos = FI_POS_ROPE_LLAMA; c->rope_scale = 2.5f; c->rope_theta = 5e5f; break;
    case 14: c->mask = FI_MASK_CUSTOM; break;
    case 15: c->mask = FI_MASK_CUSTOM; c->mask_indptr = 1; break;
    case 16: c->mask = FI_MASK_CUSTOM; c->window_left = 20; break;
    case 17: c->sm_scale = 0.3f; break;
    case 18: c->mask = FI_MASK_CAUSAL; c->window_left = 9; c->soft_cap = 3.0f; break;
    case 19: c->mask = FI_MASK_CAUSAL; c->window_left = 30; c->pos = FI_POS_ROPE_LLAMA; c->sm_scale = 0.05f; break;
    case 20: c->mask = FI_MASK_CAUSAL; c->window_left = 40; c->pos = FI_POS_ALIBI; break;
    case 21: c->mask = FI_MASK_CUSTOM; c->soft_cap = 1.5f; c->sm_scale = 0.2f; break;
    }
}
#define NUM_VARIANTS 22

static void suite_variant(backend *be) {
    struct { fi_kv_format f; fi_kv_layout l; } fm[] = {
        {FI_KV_FORMAT_PAGED, FI_KV_LAYOUT_NHD},
        {FI_KV_FORMAT_PAGED, FI_KV_LAYOUT_HND},
        {FI_KV_FORMAT_RAGGED, FI_KV_LAYOUT_NHD},
    };
    const char *shapes[] = {"decode", "mixed"};
    fi_dtype dts[] = {FI_DTYPE_F32, FI_DTYPE_BF16};
    for (int v = 0; v < NUM_VARIANTS; v++)
        for (size_t f = 0; f < 3; f++)
            for (int s = 0; s < 2; s++)
                for (int t = 0; t < 2; t++) {
                    case_spec c = default_spec("variant", be);
                    c.format = fm[f].f; c.layout = fm[f].l;
                    c.shape = shapes[s];
                    c.q_dt = c.kv_dt = c.o_dt = dts[t];
                    set_variant(&c, v);
                    c.quick = every(9);
                    submit(c);
                }
}

static void suite_dtype(backend *be) {
    struct { fi_dtype q, kv, o; float ks, vs; } dt[] = {
        {FI_DTYPE_F32, FI_DTYPE_F32, FI_DTYPE_F32, 1, 1},
        {FI_DTYPE_F16, FI_DTYPE_F16, FI_DTYPE_F16, 1, 1},
        {FI_DTYPE_BF16, FI_DTYPE_BF16, FI_DTYPE_BF16, 1, 1},
        {FI_DTYPE_F16, FI_DTYPE_F16, FI_DTYPE_F32, 1, 1},
        {FI_DTYPE_BF16, FI_DTYPE_BF16, FI_DTYPE_F32, 1, 1},
        {FI_DTYPE_F32, FI_DTYPE_F32, FI_DTYPE_BF16, 1, 1},
        {FI_DTYPE_F32, FI_DTYPE_F16, FI_DTYPE_F32, 1, 1},
        {FI_DTYPE_F16, FI_DTYPE_BF16, FI_DTYPE_F16, 1, 1},
        {FI_DTYPE_F16, FI_DTYPE_E4M3, FI_DTYPE_F16, 0.5f, 0.25f},
        {FI_DTYPE_F16, FI_DTYPE_E5M2, FI_DTYPE_F16, 0.5f, 2.0f},
        {FI_DTYPE_BF16, FI_DTYPE_E4M3, FI_DTYPE_BF16, 1.0f, 1.0f},
        {FI_DTYPE_BF16, FI_DTYPE_E5M2, FI_DTYPE_BF16, 0.125f, 0.0625f},
        {FI_DTYPE_F32, FI_DTYPE_E4M3, FI_DTYPE_F32, 0.02f, 0.01f},
        {FI_DTYPE_F32, FI_DTYPE_E5M2, FI_DTYPE_F32, 1.0f, 1.0f},
    };
    const char *shapes[] = {"decode", "prefill", "append"};
    for (size_t i = 0; i < sizeof dt / sizeof dt[0]; i++)
        for (int m = 0; m < 2; m++)
            for (int s = 0; s < 3; s++) {
                case_spec c = default_spec("dtype", be);
                c.q_dt = dt[i].q; c.kv_dt = dt[i].kv; c.o_dt = dt[i].o;
                c.k_scale = dt[i].ks; c.v_scale = dt[i].vs;
                c.mask = m ? FI_MASK_CAUSAL : FI_MASK_NONE;
                c.layout = (i % 2) ? FI_KV_LAYOUT_HND : FI_KV_LAYOUT_NHD;
                c.shape = shapes[s];
                c.quick = every(5);
                submit(c);
            }
    /* FP8 K/V across head dims and GQA groups (1 to 16), paged and ragged,
     * decode and mixed batches: the decode path (on CUDA, decode version 3
     * widening the FP8 tiles) and the prefill path beside it */
    struct { int32_t dqk, dvo, hq, hkv; } f8[] = {
        {64, 64, 8, 1}, {128, 128, 8, 8}, {128, 64, 16, 1}, {64, 128, 8, 2}, {128, 128, 14, 2}};
    for (size_t i = 0; i < sizeof f8 / sizeof f8[0]; i++)
        for (int e = 0; e < 2; e++)
            for (int s = 0; s < 2; s++) {
                case_spec c = default_spec("dtype", be);
                c.dqk = f8[i].dqk; c.dvo = f8[i].dvo; c.hq = f8[i].hq; c.hkv = f8[i].hkv;
                c.q_dt = c.o_dt = e ? FI_DTYPE_F16 : FI_DTYPE_BF16;
                c.kv_dt = e ? FI_DTYPE_E5M2 : FI_DTYPE_E4M3;
                c.k_scale = e ? 0.25f : 0.5f; c.v_scale = e ? 0.5f : 2.0f;
                c.mask = s ? FI_MASK_CAUSAL : FI_MASK_NONE;
                c.format = i % 2 ? FI_KV_FORMAT_RAGGED : FI_KV_FORMAT_PAGED;
                c.shape = s ? "mixed" : "decode";
                c.quick = every(4);
                submit(c);
            }
}

/* Head dims beyond 64/128/256 that models use (80, 96: Phi, StarCoder-like;
 * 192 x 128: DeepSeek's prefill; 512: latent-attention decode), part of the
 * headdim suite on every backend: the CPU's SIMD tables (80, 96: AVX2 or
 * generic; 192, 512: every table) and CUDA's CUDA-core kernel (lanes of 5,
 * 6, 3 or 16 elements, kernels/attention.cuh), against the oracle. Then per
 * dim the variants whose code follows the lane layout: FP8 K/V (rows of
 * 80 bytes at e4m3 d 80), fused RoPE (pairs d, d + D/2: 40 apart at d 80),
 * soft-cap + window on HND ragged KV, ALiBi + custom mask, a fixed
 * split-KV (the merge of partial rows of D_vo floats), FP8 prefill; and
 * at d 512 GQA-16 decodes (one KV head, 16 query heads: rows per block
 * capped at 4 on CUDA). */
static void headdim_wide(backend *be) {
    int32_t dims[][2] = {{80, 80}, {96, 96}, {192, 192}, {512, 512}, {192, 128}, {96, 64}};
    const size_t n = sizeof dims / sizeof dims[0];
    fi_dtype dts[] = {FI_DTYPE_F32, FI_DTYPE_F16, FI_DTYPE_BF16};
    for (size_t d = 0; d < n; d++)
        for (int t = 0; t < 3; t++)
            for (int s = 0; s < 2; s++) {
                case_spec c = default_spec("headdim", be);
                c.dqk = dims[d][0]; c.dvo = dims[d][1];
                c.hq = 8; c.hkv = 2;
                c.q_dt = c.kv_dt = c.o_dt = dts[t];
                c.mask = FI_MASK_CAUSAL;
                c.format = s ? FI_KV_FORMAT_RAGGED : FI_KV_FORMAT_PAGED;
                c.shape = s ? "mixed" : "decode";
                c.quick = every(3);
                submit(c);
            }
    for (size_t d = 0; d < n; d++)
        for (int v = 0; v < 6; v++) {
            case_spec c = default_spec("headdim", be);
            c.dqk = dims[d][0]; c.dvo = dims[d][1];
            switch (v) {
            case 0: /* FP8 decode, GQA 8 */
                c.q_dt = c.o_dt = FI_DTYPE_BF16; c.kv_dt = FI_DTYPE_E4M3;
                c.k_scale = 0.5f; c.v_scale = 2.0f;
                c.hq = 16; c.hkv = 2; c.shape = "decode";
                break;
            case 1: /* fused RoPE, causal */
                c.mask = FI_MASK_CAUSAL; c.pos = FI_POS_ROPE_LLAMA;
                break;
            case 2: /* soft-cap and window, HND ragged, MHA */
                c.mask = FI_MASK_CAUSAL; c.soft_cap = 2.5f; c.window_left = 13;
                c.format = FI_KV_FORMAT_RAGGED; c.layout = FI_KV_LAYOUT_HND;
                c.hq = c.hkv = 4;
                break;
            case 3: /* ALiBi and a custom mask, f32 */
                c.mask = FI_MASK_CUSTOM; c.pos = FI_POS_ALIBI;
                c.q_dt = c.kv_dt = c.o_dt = FI_DTYPE_F32;
                break;
            case 4: /* split-KV with a fixed split: partial rows merged */
                c.q_dt = c.kv_dt = c.o_dt = FI_DTYPE_BF16;
                c.fixed_split = 32; c.shape = "decode";
                break;
            default: /* FP8 prefill, GQA 8 */
                c.kv_dt = FI_DTYPE_E5M2; c.k_scale = 0.25f; c.v_scale = 0.5f;
                c.mask = FI_MASK_CAUSAL; c.hq = 8; c.hkv = 1; c.shape = "append";
                break;
            }
            c.quick = every(3);
            submit(c);
        }
    for (int t = 0; t < 2; t++) { /* latent-attention-like decode: 16 query heads, 1 KV head */
        case_spec c = default_spec("headdim", be);
        c.dqk = c.dvo = 512;
        c.hq = 16; c.hkv = 1;
        c.q_dt = c.o_dt = FI_DTYPE_BF16;
        c.kv_dt = t ? FI_DTYPE_E4M3 : FI_DTYPE_BF16;
        if (t) { c.k_scale = 0.5f; c.v_scale = 0.25f; }
        c.shape = "decode";
        c.quick = 1;
        submit(c);
    }
}

/* Head dim 256 decodes, part of the headdim suite: on CUDA decode version
 * 3's split-O form (kernels/decode_tc.cuh SPLIT: 32-key tiles, S shared
 * through shared memory, each warp a quarter of O's columns). 16-bit and
 * FP8 K/V x page sizes 1, 16, 64 x GQA groups 1 to 16 (one token's rows
 * up to the whole m16 tile), each with a split (chunks of one tile, or of
 * 2.5), no split or the plan's own, and a mask or window; then long
 * requests (the stage ring wrapping), speculative tokens (several tokens'
 * rows in the tile), HND, f32 output without LSE, and qk != vo. */
static void headdim_decode256(backend *be) {
    struct { fi_dtype q, kv; float ks, vs; } dt[] = {
        {FI_DTYPE_BF16, FI_DTYPE_BF16, 1, 1},
        {FI_DTYPE_BF16, FI_DTYPE_E4M3, 0.5f, 2.0f},
        {FI_DTYPE_F16, FI_DTYPE_E5M2, 0.25f, 0.5f},
    };
    int32_t ps[] = {1, 16, 64};
    int32_t heads[][2] = {{2, 2}, {6, 2}, {8, 2}, {16, 2}, {16, 1}}; /* groups 1, 3, 4, 8, 16 */
    int n = 0;
    for (size_t d = 0; d < 3; d++)
        for (size_t p = 0; p < 3; p++)
            for (size_t h = 0; h < 5; h++, n++) {
                case_spec c = default_spec("headdim", be);
                c.dqk = c.dvo = 256;
                c.q_dt = c.o_dt = dt[d].q; c.kv_dt = dt[d].kv;
                c.k_scale = dt[d].ks; c.v_scale = dt[d].vs;
                c.page_size = ps[p];
                c.hq = heads[h][0]; c.hkv = heads[h][1];
                c.shape = "decode";
                switch (n % 4) {
                case 0: c.fixed_split = 32; break;
                case 1: c.fixed_split = 80; c.mask = FI_MASK_CAUSAL; break;
                case 2: c.disable_split = 1; c.window_left = 40; break;
                default: c.mask = FI_MASK_CAUSAL; c.window_left = 100; break;
                }
                c.quick = every(6);
                submit(c);
            }
    for (size_t d = 0; d < 3; d++)
        for (int v = 0; v < 4; v++) {
            case_spec c = default_spec("headdim", be);
            c.dqk = c.dvo = 256;
            c.q_dt = c.o_dt = dt[d].q; c.kv_dt = dt[d].kv;
            c.k_scale = dt[d].ks; c.v_scale = dt[d].vs;
            c.hq = 16; c.hkv = 2;
            if (v == 0) { /* long requests: many tiles, the stages wrap */
                int32_t qo[] = {1, 1, 1}, kv[] = {2049, 1000, 5};
                c.batch = 3;
                memcpy(c.qo_len, qo, sizeof qo); memcpy(c.kv_len, kv, sizeof kv);
                c.shape = "decode_long"; c.page_size = 64;
                c.fixed_split = d == 1 ? 0 : 512;
            } else if (v == 1) { /* speculative tokens: 2 x 4 and 4 x 4 rows, causal */
                int32_t qo[] = {2, 4, 1}, kv[] = {100, 333, 64};
                c.batch = 3;
                memcpy(c.qo_len, qo, sizeof qo); memcpy(c.kv_len, kv, sizeof kv);
                c.hq = 8; c.hkv = 2; c.mask = FI_MASK_CAUSAL;
                c.shape = "decode_spec";
            } else if (v == 2) { /* HND, f32 output, no LSE */
                c.layout = FI_KV_LAYOUT_HND; c.o_dt = FI_DTYPE_F32; c.no_lse = 1;
                c.shape = "decode";
            } else { /* qk != vo */
                c.dqk = d == 2 ? 128 : 256; c.dvo = d == 2 ? 256 : 128;
                c.hq = 8; c.hkv = 1; c.fixed_split = 48;
                c.shape = "decode";
            }
            c.quick = every(3);
            submit(c);
        }
}

static void suite_headdim(backend *be) {
    int32_t dims[][2] = {{64, 64}, {128, 128}, {256, 256}, {128, 64}, {64, 128}, {256, 128}};
    int32_t groups[][2] = {{4, 4}, {8, 2}, {8, 1}, {16, 2}};
    fi_dtype dts[] = {FI_DTYPE_F32, FI_DTYPE_BF16};
    for (size_t d = 0; d < 6; d++)
        for (size_t g = 0; g < 4; g++)
            for (int t = 0; t < 2; t++) {
                case_spec c = default_spec("headdim", be);
                c.dqk = dims[d][0]; c.dvo = dims[d][1];
                c.hq = groups[g][0]; c.hkv = groups[g][1];
                c.q_dt = c.kv_dt = c.o_dt = dts[t];
                c.mask = FI_MASK_CAUSAL;
                c.format = (g % 2) ? FI_KV_FORMAT_RAGGED : FI_KV_FORMAT_PAGED;
                c.quick = every(7);
                submit(c);
            }
    headdim_wide(be);
    headdim_decode256(be);
}

static void suite_plan(backend *be) {
    struct { int dis, fix, w, layers, second, nolse; const char *shape; } pl[] = {
        {0, 0, 0, 1, 0, 0, "mixed"},
        {1, 0, 0, 1, 0, 0, "mixed"},
        {1, 0, 1, 1, 0, 0, "mixed"},
        {0, 0, 1, 1, 0, 0, "mixed"},
        {0, 0, 2, 1, 0, 0, "decode"},
        {0, 0, 7, 1, 0, 0, "mixed"},
        {0, 0, 64, 1, 0, 0, "decode"},
        {0, 16, 0, 1, 0, 0, "mixed"},
        {0, 64, 3, 1, 0, 0, "decode"},
        {0, 1, 0, 1, 0, 0, "append"},
        {0, 0, 0, 3, 0, 0, "mixed"},
        {0, 0, 5, 1, 1, 0, "mixed"},
        {0, 32, 0, 2, 1, 0, "decode"},
        {0, 0, 0, 1, 0, 1, "mixed"},
        {1, 0, 0, 1, 1, 1, "prefill"},
    };
    for (size_t i = 0; i < sizeof pl / sizeof pl[0]; i++)
        for (int m = 0; m < 2; m++) {
            case_spec c = default_spec("plan", be);
            c.disable_split = pl[i].dis; c.fixed_split = pl[i].fix; c.workers = pl[i].w;
            c.layers = pl[i].layers; c.second_batch = pl[i].second; c.no_lse = pl[i].nolse;
            c.shape = pl[i].shape;
            c.mask = m ? FI_MASK_CAUSAL : FI_MASK_NONE;
            if (m) c.q_dt = c.kv_dt = c.o_dt = FI_DTYPE_F32;
            c.quick = every(4);
            submit(c);
        }
}

static case_spec edge_spec(backend *be, int32_t B, const int32_t *qo, const int32_t *kv) {
    case_spec c = default_spec("edge", be);
    c.shape = "explicit";
    c.batch = B;
    for (int32_t i = 0; i < B; i++) { c.qo_len[i] = qo[i]; c.kv_len[i] = kv[i]; }
    c.quick = every(2);
    return c;
}

static void suite_edge(backend *be) {
    /* Empty requests: kv_len 0 (rows with no key) and qo_len 0 (no rows). */
    {
        int32_t qo[] = {3, 0, 1, 2, 0}, kv[] = {0, 10, 33, 0, 0};
        for (int f = 0; f < 2; f++) {
            case_spec c = edge_spec(be, 5, qo, kv);
            c.shape = "empty_requests";
            c.format = f ? FI_KV_FORMAT_RAGGED : FI_KV_FORMAT_PAGED;
            submit(c);
            c.mask = FI_MASK_CAUSAL;
            c.quick = every(2);
            submit(c);
            c.mask = FI_MASK_CUSTOM;
            c.quick = every(2);
            submit(c);
        }
    }
    /* Causal with qo_len > kv_len: the first rows see nothing. */
    {
        int32_t qo[] = {20, 5, 1}, kv[] = {7, 1, 1};
        case_spec c = edge_spec(be, 3, qo, kv);
        c.shape = "qo_gt_kv";
        c.mask = FI_MASK_CAUSAL;
        submit(c);
        c.q_dt = c.kv_dt = c.o_dt = FI_DTYPE_F32;
        c.format = FI_KV_FORMAT_RAGGED;
        c.quick = every(2);
        submit(c);
        c.window_left = 2;
        c.quick = every(2);
        submit(c);
    }
    /* Page size 1, and last pages exactly full vs partial. */
    {
        int32_t qo[] = {1, 4, 16, 1}, kv[] = {16, 32, 48, 17};
        case_spec c = edge_spec(be, 4, qo, kv);
        c.shape = "full_last_pages";
        submit(c);
        c.mask = FI_MASK_CAUSAL;
        c.layout = FI_KV_LAYOUT_HND;
        c.quick = every(2);
        submit(c);
        c.page_size = 1;
        c.shape = "page_size1";
        c.quick = every(2);
        submit(c);
        c.layout = FI_KV_LAYOUT_NHD;
        c.mask = FI_MASK_NONE;
        c.quick = every(2);
        submit(c);
    }
    /* One request with 65536 keys: decode, and a short causal chunk. */
    {
        int32_t qo[] = {1}, kv[] = {65536};
        case_spec c = edge_spec(be, 1, qo, kv);
        c.shape = "kv65536";
        c.hq = 4; c.hkv = 1;
        c.q_dt = c.kv_dt = c.o_dt = FI_DTYPE_F32;
        c.quick = 0; /* seconds under ASan; these test long sums, not memory */
        submit(c);
        c.q_dt = c.kv_dt = c.o_dt = FI_DTYPE_BF16;
        c.page_size = 64;
        c.layout = FI_KV_LAYOUT_HND;
        submit(c);
        int32_t qo2[] = {7, 1}, kv2[] = {65536, 100};
        c = edge_spec(be, 2, qo2, kv2);
        c.shape = "kv65536_chunk";
        c.hq = 2; c.hkv = 1; c.dqk = c.dvo = 64;
        c.mask = FI_MASK_CAUSAL;
        c.quick = 0;
        submit(c);
    }
    /* Huge logits: q, k of magnitude 100 (softmax one-hot; no NaN/inf). */
    {
        fi_dtype dts[] = {FI_DTYPE_F32, FI_DTYPE_F16, FI_DTYPE_BF16};
        for (int t = 0; t < 3; t++) {
            case_spec c = default_spec("edge", be);
            c.q_dt = c.kv_dt = c.o_dt = dts[t];
            c.amplitude = 100.0;
            c.extreme = 1;
            c.quick = 1;
            submit(c);
            c.mask = FI_MASK_CAUSAL;
            c.soft_cap = 30.0f;
            c.quick = t == 0;
            submit(c);
        }
        case_spec c = default_spec("edge", be);
        c.kv_dt = FI_DTYPE_E4M3; c.k_scale = 2.0f; c.v_scale = 1.0f;
        c.amplitude = 100.0; /* stored k = 50: within E4M3's 448 */
        c.extreme = 1;
        c.quick = 1;
        submit(c);
    }
    /* A batch of no requests at all. */
    {
        case_spec c = default_spec("edge", be);
        c.shape = "empty_batch";
        c.quick = 1;
        submit(c);
    }
    /* Long prefill: many query tiles, causal, with a long cached prefix. */
    {
        int32_t qo[] = {300, 129}, kv[] = {300, 1000};
        case_spec c = edge_spec(be, 2, qo, kv);
        c.shape = "long_prefill";
        c.mask = FI_MASK_CAUSAL;
        c.q_dt = c.kv_dt = c.o_dt = FI_DTYPE_F32;
        c.hq = 4; c.hkv = 1;
        c.quick = 0;
        submit(c);
        c.window_left = 100;
        c.q_dt = c.kv_dt = c.o_dt = FI_DTYPE_BF16;
        submit(c);
    }
    /* One-token requests everywhere; a batch of 16 tiny requests. */
    {
        int32_t qo[MAX_BATCH], kv[MAX_BATCH];
        for (int i = 0; i < MAX_BATCH; i++) { qo[i] = 1 + i % 3; kv[i] = 1 + (i * 7) % 11; }
        case_spec c = edge_spec(be, MAX_BATCH, qo, kv);
        c.shape = "tiny16";
        c.mask = FI_MASK_CAUSAL;
        submit(c);
        c.fixed_split = 2;
        c.quick = every(2);
        submit(c);
    }
}

/* fixed_split_size: a request's output bits do not depend on the rest of the
 * batch. Run request R alone and inside a larger batch; compare bits. */
static void batch_invariance(backend *be, fi_dtype dt, int causal) {
    case_spec c = default_spec("determinism", be);
    c.q_dt = c.kv_dt = c.o_dt = dt;
    c.mask = causal ? FI_MASK_CAUSAL : FI_MASK_NONE;
    c.fixed_split = 32;
    c.shape = "batch_invariance";
    c.quick = 1;
    char name[256];
    case_name(&c, name, sizeof name);
    if (!tu_backend_selected(be->device_name) || (tu_opt.quick && !c.quick)) return;
    if (!tu_begin_case(name)) return;
    fi_context *ctx = backend_context(be);
    if (!ctx) { tu_note("backend %s: %s", be->name, be->why_not); tu_record(c.suite, name, TU_SKIP); return; }

    uint64_t seed = tu_case_seed(name);
    tu_crash_context(name, seed);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    /* Request R = (qo 5, kv 150), placed last in a batch of three. */
    int32_t qo_big[3] = {1, 9, 5}, kv_big[3] = {300, 40, 150};
    int32_t qo_one[1] = {5}, kv_one[1] = {150};
    problem big, one;
    memset(&one, 0, sizeof one);
    int bad = problem_build(&c, &rng, 3, qo_big, kv_big, &big) != 0 ||
              problem_build(&c, &rng, 1, qo_one, kv_one, &one) != 0;
    float slopes[64];
    fi_attention_params pa = case_params(&c, slopes);
    fi_plan *plan = NULL;
    if (!bad) {
        /* Copy R's Q and K/V from the big problem into the single one. */
        for (int64_t t = 0; t < 5; t++)
            for (int64_t h = 0; h < c.hq; h++)
                for (int64_t d = 0; d < c.dqk; d++) {
                    int64_t is[3] = {big.qo_indptr[2] + t, h, d}, id[3] = {t, h, d};
                    tu_set(&one.qh, id, tu_get(&big.qh, is));
                }
        for (int64_t j = 0; j < 150; j++)
            for (int64_t h = 0; h < c.hkv; h++)
                for (int64_t d = 0; d < c.dqk; d++) {
                    int64_t ps = c.page_size;
                    int64_t is[4] = {big.kv_indices[big.kv_indptr[2] + j / ps], j % ps, h, d};
                    int64_t id[4] = {one.kv_indices[j / ps], j % ps, h, d};
                    tu_set(&one.kh, id, tu_get(&big.kh, is));
                    tu_set(&one.vh, id, tu_get(&big.vh, is));
                }
        dbuf_upload(be, &one.q); dbuf_upload(be, &one.k); dbuf_upload(be, &one.v);
        fi_plan_config cfg = case_config(&c, &big, &one);
        fi_status st = fi_plan_create(ctx, &pa, &cfg, &plan);
        if (st == FI_OK) st = fi_plan_update(plan, &big.batch);
        if (st == FI_OK) bad |= run_and_check(&c, plan, &pa, &big, "batch of 3") != 0;
        if (st == FI_OK) st = fi_plan_update(plan, &one.batch);
        if (st == FI_OK) bad |= run_and_check(&c, plan, &pa, &one, "alone") != 0;
        if (st != FI_OK) {
            tu_note("plan: %s: %s", fi_status_string(st), fi_last_error());
            bad = 1;
        }
        if (!bad) {
            for (int64_t t = 0; t < 5 && !bad; t++)
                for (int64_t h = 0; h < c.hq && !bad; h++) {
                    int64_t ib[2] = {big.qo_indptr[2] + t, h}, io[2] = {t, h};
                    if (memcmp((char *)big.lse.h.t.data + tu_offset(&big.lse.h.t, ib) * 4,
                               (char *)one.lse.h.t.data + tu_offset(&one.lse.h.t, io) * 4, 4))
                        bad = 1;
                    for (int64_t d = 0; d < c.dvo; d++) {
                        int64_t jb[3] = {ib[0], h, d}, jo[3] = {t, h, d};
                        size_t es = tu_dtype_size(c.o_dt);
                        if (memcmp((char *)big.o.h.t.data + tu_offset(&big.o.h.t, jb) * (int64_t)es,
                                   (char *)one.o.h.t.data + tu_offset(&one.o.h.t, jo) * (int64_t)es, es))
                            bad = 1;
                    }
                }
            if (bad) tu_note("request alone and in a batch gave different bits with fixed_split_size=32");
        }
    }
    fi_plan_destroy(plan);
    problem_free(be, &big);
    problem_free(be, &one);
    if (bad) tu_note("seed %llu; rerun: build/test_attention --filter '%s'", (unsigned long long)seed, name);
    tu_record(c.suite, name, bad ? TU_FAIL : TU_PASS);
}

/* ============================================================ CUDA graphs */

typedef struct graph_runner {
    void *stream, *exec;
} graph_runner;

static fi_status graph_replay(void *self, fi_plan *plan, const fi_run_args *args) {
    graph_runner *g = self;
    (void)plan; (void)args; /* both were captured */
    int r = cu.graph_launch(g->exec, g->stream);
    if (!r) r = cu.stream_sync(g->stream);
    if (r) tu_note("cuGraphLaunch / cuStreamSynchronize: CUresult %d", r);
    return r ? FI_STATUS_BACKEND_ERROR : FI_OK;
}

/* Point dst's device views at src's device memory (same shapes): a graph
 * captured on src's tensors then reads dst's data once it is uploaded. */
static void alias_device(const backend *be, problem *dst, const problem *src) {
    dbuf *d[] = {&dst->q, &dst->k, &dst->v, &dst->o, &dst->lse, &dst->mask};
    const dbuf *s[] = {&src->q, &src->k, &src->v, &src->o, &src->lse, &src->mask};
    for (int i = 0; i < 6; i++) {
        if (be->device == FI_DEVICE_CUDA && d[i]->dev_base) cu.mem_free((cu_ptr)(uintptr_t)d[i]->dev_base);
        d[i]->dev_base = s[i]->dev_base;
        d[i]->dev = s[i]->dev;
    }
    dst->qd = src->qd;
    dst->kd = src->kd;
    dst->vd = src->vd;
}

/* docs/SEMANTICS.md: run reads only fixed addresses and a fixed grid, so a graph
 * captured once replays correctly after fi_plan_update with another batch.
 * Warm-up run (JIT), capture on a stream, replay; re-plan a batch of the
 * same totals but other lengths into the same buffers, replay again. */
static void graph_case(backend *be, fi_mask_mode mask, fi_dtype dt, int device_table) {
    case_spec c = default_spec("graph", be);
    c.mask = mask;
    c.q_dt = c.kv_dt = c.o_dt = dt;
    c.device_table = device_table;
    c.shape = device_table ? "replay_after_replan_device_table" : "replay_after_replan";
    c.quick = 1;
    char name[256];
    case_name(&c, name, sizeof name);
    if (!tu_backend_selected(be->device_name) || !tu_begin_case(name)) return;
    fi_context *ctx = backend_context(be);
    if (!ctx) { tu_note("backend %s: %s", be->name, be->why_not); tu_record(c.suite, name, TU_SKIP); return; }
    if (!cu.stream_create || !cu.begin_capture || !cu.graph_instantiate || !cu.graph_launch) {
        tu_note("this driver lacks the graph API");
        tu_record(c.suite, name, TU_SKIP);
        return;
    }
    uint64_t seed = tu_case_seed(name);
    tu_crash_context(name, seed);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    /* same total_q (29) and pages at page_size 16 (27), other lengths */
    int32_t qo1[4] = {1, 7, 1, 20}, kv1[4] = {300, 50, 17, 20};
    int32_t qo2[4] = {10, 1, 17, 1}, kv2[4] = {40, 280, 17, 50};
    problem p1, p2;
    memset(&p2, 0, sizeof p2);
    float slopes[64];
    fi_attention_params pa = case_params(&c, slopes);
    fi_plan *plan = NULL;
    graph_runner g = {NULL, NULL};
    void *graph = NULL;
    int bad = problem_build(&c, &rng, 4, qo1, kv1, &p1) != 0 || problem_build(&c, &rng, 4, qo2, kv2, &p2) != 0;
    fi_status st = FI_OK;
    if (!bad) {
        fi_plan_config cfg = case_config(&c, &p1, &p2);
        st = fi_plan_create(ctx, &pa, &cfg, &plan);
        if (st == FI_OK) st = plan_update(&c, plan, &p1);
        if (st == FI_OK) bad |= run_and_check(&c, plan, &pa, &p1, "batch 1 warm-up") != 0;
    }
    if (!bad && st == FI_OK) {
        fi_run_args args;
        memset(&args, 0, sizeof args);
        args.q = p1.qd; args.k = p1.kd; args.v = p1.vd;
        args.o = p1.o.dev; args.lse = p1.lse.dev;
        if (c.mask == FI_MASK_CUSTOM) args.custom_mask = p1.mask.dev;
        int r = cu.stream_create(&g.stream, 1 /* non-blocking */);
        if (!r) r = cu.begin_capture(g.stream, 2 /* relaxed */);
        if (!r) {
            args.stream = g.stream;
            st = fi_plan_run(plan, &args);
            r = cu.end_capture(g.stream, &graph);
        }
        if (!r && st == FI_OK) r = cu.graph_instantiate(&g.exec, graph, 0);
        if (r || st != FI_OK) {
            tu_note("capture: CUresult %d, fi_plan_run %s: %s", r, fi_status_string(st),
                    st ? fi_last_error() : "");
            bad = 1;
        }
    }
    runner rn = {graph_replay, &g};
    if (!bad && st == FI_OK) bad |= run_and_check_with(&c, plan, &pa, &p1, "batch 1 replay", &rn) != 0;
    if (!bad && st == FI_OK) {
        alias_device(be, &p2, &p1);
        st = plan_update(&c, plan, &p2); /* a device table: at another address */
        if (st == FI_OK) {
            problem_fill(&c, &rng, &p2); /* uploads batch 2's data into the captured buffers */
            bad |= run_and_check_with(&c, plan, &pa, &p2, "batch 2 replay after re-plan", &rn) != 0;
        }
    }
    if (st != FI_OK) {
        tu_note("plan: %s: %s", fi_status_string(st), fi_last_error());
        bad = 1;
    }
    if (g.exec) cu.graph_exec_destroy(g.exec);
    if (graph) cu.graph_destroy(graph);
    if (g.stream) cu.stream_destroy(g.stream);
    fi_plan_destroy(plan);
    /* p2 borrows p1's device memory once aliased: drop its pointers first */
    if (p2.q.dev_base == p1.q.dev_base) {
        dbuf *d[] = {&p2.q, &p2.k, &p2.v, &p2.o, &p2.lse, &p2.mask};
        for (int i = 0; i < 6; i++) d[i]->dev_base = NULL;
    }
    problem_free(be, &p1);
    problem_free(be, &p2);
    if (bad) tu_note("seed %llu; rerun: build/test_attention --filter '%s'", (unsigned long long)seed, name);
    tu_record(c.suite, name, bad ? TU_FAIL : TU_PASS);
}

static void suite_graph(backend *be) {
    if (be->device != FI_DEVICE_CUDA) return; /* graphs are a CUDA feature */
    graph_case(be, FI_MASK_CAUSAL, FI_DTYPE_F16, 0);
    graph_case(be, FI_MASK_NONE, FI_DTYPE_BF16, 0);
    graph_case(be, FI_MASK_CUSTOM, FI_DTYPE_F16, 0);
    graph_case(be, FI_MASK_CAUSAL, FI_DTYPE_BF16, 1);
}

/* Page tables in the backend's memory (fi_plan_config.device_page_table): the
 * layouts, page sizes (a power of two or not), dtypes and shapes that take
 * different kernel paths, a re-plan onto another table. */
static void suite_table(backend *be) {
    const char *shapes[] = {"decode", "mixed", "prefill"};
    for (int s = 0; s < 3; s++)
        for (int v = 0; v < 6; v++) {
            case_spec c = default_spec("table", be);
            c.device_table = 1;
            c.shape = shapes[s];
            if (v == 1) {
                c.layout = FI_KV_LAYOUT_HND;
                c.page_size = 1;
                c.q_dt = c.kv_dt = c.o_dt = FI_DTYPE_BF16;
                c.mask = FI_MASK_CAUSAL;
            } else if (v == 2) {
                c.page_size = 5;
                c.q_dt = c.kv_dt = c.o_dt = FI_DTYPE_BF16;
                c.mask = FI_MASK_CAUSAL;
            } else if (v == 3) {
                c.combined = 1;
                c.window_left = 20;
                c.second_batch = 1;
            } else if (v >= 4) { /* d 256 (decode version 3's split-O form), 16-bit and FP8 */
                c.dqk = c.dvo = 256;
                c.hq = 16; c.hkv = 2;
                c.q_dt = c.kv_dt = c.o_dt = FI_DTYPE_BF16;
                c.page_size = v == 4 ? 64 : 1;
                if (v == 5) { c.kv_dt = FI_DTYPE_E4M3; c.k_scale = 0.5f; c.v_scale = 2.0f; }
                c.mask = FI_MASK_CAUSAL;
            }
            c.quick = every(3);
            submit(c);
        }
}

/* One NaN or infinity in q, k or v (put_nonfinite) against the oracle's
 * reading of docs/SEMANTICS.md "Non-finite values": rows that see it, rows
 * that do not (causal), other heads, split chunks merged (fixed_split),
 * soft-cap (which makes an infinite logit finite), f32 and bf16. The same
 * answers on every backend. */
static void suite_nonfinite(backend *be) {
    const char *shapes[] = {"decode", "mixed", "prefill"};
    int n = 0;
    for (int kind = NF_Q_NAN; kind < NF_COUNT; kind++)
        for (int causal = 0; causal < 2; causal++)
            for (int s = 0; s < 3; s++, n++) {
                case_spec c = default_spec("nonfinite", be);
                c.nonfinite = kind;
                c.mask = causal ? FI_MASK_CAUSAL : FI_MASK_NONE;
                c.shape = shapes[s];
                c.q_dt = c.kv_dt = c.o_dt = n % 2 ? FI_DTYPE_BF16 : FI_DTYPE_F32;
                if (n % 3 == 1) c.fixed_split = 16;
                if (n % 4 == 3) {
                    c.format = FI_KV_FORMAT_RAGGED;
                    c.layout = FI_KV_LAYOUT_HND;
                }
                c.quick = every(2);
                submit(c);
            }
    /* each kernel family's masks and formats: a window, custom bits, ALiBi,
     * fused RoPE, FP8 K/V, one-token pages, a device page table, head dims
     * 64 and 256 (the NaN sits where some rows do not see it) */
    for (int v = 0; v < 9; v++)
        for (int s = 0; s < 3; s++) {
            case_spec c = default_spec("nonfinite", be);
            static const int kinds[9] = {NF_K_NAN, NF_V_NAN, NF_K_INF, NF_Q_NAN, NF_V_NAN,
                                         NF_V_NAN, NF_K_NAN, NF_V_INF, NF_V_NAN};
            c.nonfinite = kinds[v];
            c.mask = v == 1 ? FI_MASK_CUSTOM : FI_MASK_CAUSAL;
            c.shape = shapes[s];
            c.q_dt = c.kv_dt = c.o_dt = FI_DTYPE_BF16;
            if (v == 0) c.window_left = 24;
            if (v == 2) c.pos = FI_POS_ALIBI;
            if (v == 3) c.pos = FI_POS_ROPE_LLAMA;
            if (v == 4) c.kv_dt = FI_DTYPE_E4M3, c.k_scale = 0.5f, c.v_scale = 2.0f;
            if (v == 5) c.page_size = 1;
            if (v == 6) c.device_table = 1;
            if (v == 7) c.dqk = c.dvo = 64;
            if (v == 8) c.dqk = c.dvo = 256;
            if (s == 1) c.fixed_split = 16;
            c.quick = every(3);
            submit(c);
        }
    static const int capped[2] = {NF_K_INF, NF_Q_INF};
    for (int i = 0; i < 2; i++) { /* soft-cap: the infinite logits become finite */
        case_spec c = default_spec("nonfinite", be);
        c.nonfinite = capped[i];
        c.soft_cap = 30.0f;
        c.mask = FI_MASK_CAUSAL;
        c.q_dt = c.kv_dt = c.o_dt = FI_DTYPE_F32;
        c.quick = 1;
        submit(c);
    }
}

static void suite_determinism(backend *be) {
    const char *shapes[] = {"decode", "mixed"};
    for (int s = 0; s < 2; s++)
        for (int split = 0; split < 2; split++) {
            case_spec c = default_spec("determinism", be);
            c.shape = shapes[s];
            c.determinism = 1;
            c.disable_split = !split;
            c.mask = FI_MASK_CAUSAL;
            c.quick = 1;
            submit(c);
        }
    batch_invariance(be, FI_DTYPE_F32, 0);
    batch_invariance(be, FI_DTYPE_BF16, 1);
}

int main(int argc, char **argv) {
    int rc = tu_parse_args(argc, argv,
                           "Attention on every backend, format, variant and dtype against the fp64 "
                           "oracle.\nCase names: backend/suite/format/variant/q_kv_o/dims/heads/"
                           "shape[/plan]; --filter matches any substring.");
    if (rc) return rc;
    oracle_self_checks();
    for (int b = 0; b < NUM_BACKENDS; b++) {
        backend *be = &backends[b];
        quick_counter = 0;
        suite_format(be);
        suite_variant(be);
        suite_dtype(be);
        suite_headdim(be);
        suite_plan(be);
        suite_edge(be);
        suite_determinism(be);
        suite_graph(be);
        suite_table(be);
        suite_nonfinite(be);
    }
    if (tu_opt.list) return 0;
    for (int b = 0; b < NUM_BACKENDS; b++) fi_context_destroy(backends[b].ctx);
    return tu_summary("test_attention");
}
