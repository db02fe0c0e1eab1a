/*
 * demo.c — `fi demo`: one serving step on the CPU, the way an engine calls
 * the library. A batch of 3 chunked-prefill requests and 29 decodes whose KV
 * cache lives in shuffled 16-token pages (8 of the decodes share a 1024-token
 * system prompt: the same page ids), LLaMA-like heads (32 query / 8 KV, d 128,
 * bf16, causal). The step is planned once and run for every layer; a sample
 * of requests is checked against attention computed here in fp64, straight
 * from its definition.
 */
#include "tools.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { H_QO = 32, H_KV = 8, D = 128, PAGE = 16, N_PREFILL = 3, N_DECODE = 29,
       N_REQ = N_PREFILL + N_DECODE, PREFIX_PAGES = 64, N_SHARING = 8,
       N_CHECKED = 6 /* requests [0, N_CHECKED) are checked */ };

static const int32_t prefill_q[N_PREFILL] = {128, 256, 512};    /* chunk lengths */
static const int32_t prefill_kv[N_PREFILL] = {640, 1536, 3000}; /* keys, chunk included */

typedef struct step {
    int32_t qo_indptr[N_REQ + 1], kv_indptr[N_REQ + 1], last[N_REQ], kv_len[N_REQ];
    int32_t *kv_indices;
    int32_t num_pages; /* pages in each layer's pool */
} step;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t next(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}

/* Uniform bf16 values in [-1, 1): never zeros. */
static void fill_bf16(uint16_t *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        float x = (float)(next(&seed) >> 40) * 0x1.0p-23f - 1.0f;
        uint32_t u;
        memcpy(&u, &x, 4);
        p[i] = (uint16_t)(u >> 16);
    }
}

/* Request order: prefill chunk 0, the decodes (the first N_SHARING share the
 * prompt), then prefill chunks 1 and 2; the checked sample is a prefix of it. */
static int32_t prefill_chunk(int32_t i) {
    return i == 0 ? 0 : i >= N_REQ - (N_PREFILL - 1) ? i - (N_REQ - N_PREFILL) : -1;
}
static bool shares_prefix(int32_t i) { return i >= 1 && i < 1 + N_SHARING; }

/* Lengths, then a page table: the sharing decodes point at pool pages
 * [0, PREFIX_PAGES) for their prompt; every other page is a fresh pool page,
 * handed out in shuffled order as a long-running engine's free list would. */
static int make_step(step *s, uint64_t seed) {
    s->qo_indptr[0] = s->kv_indptr[0] = 0;
    int32_t fresh = 0;
    for (int32_t i = 0; i < N_REQ; i++) {
        int32_t c = prefill_chunk(i);
        bool prefill = c >= 0;
        int32_t kv = prefill ? prefill_kv[c]
                             : (shares_prefix(i) ? PREFIX_PAGES * PAGE : 0) + 128 +
                                   (int32_t)(next(&seed) % 3968);
        int32_t pages = (kv + PAGE - 1) / PAGE;
        s->kv_len[i] = kv;
        s->last[i] = kv - (pages - 1) * PAGE;
        s->qo_indptr[i + 1] = s->qo_indptr[i] + (prefill ? prefill_q[c] : 1);
        s->kv_indptr[i + 1] = s->kv_indptr[i] + pages;
        fresh += pages - (shares_prefix(i) ? PREFIX_PAGES : 0);
    }
    int32_t *pool = malloc(sizeof(int32_t) * (size_t)fresh);
    s->kv_indices = malloc(sizeof(int32_t) * (size_t)s->kv_indptr[N_REQ]);
    if (!pool || !s->kv_indices) { free(pool); return -1; }
    for (int32_t j = 0; j < fresh; j++) pool[j] = PREFIX_PAGES + j;
    for (int32_t j = fresh - 1; j > 0; j--) {
        int32_t r = (int32_t)(next(&seed) % (uint64_t)(j + 1)), t = pool[j];
        pool[j] = pool[r]; pool[r] = t;
    }
    int32_t k = 0;
    for (int32_t i = 0; i < N_REQ; i++)
        for (int32_t j = s->kv_indptr[i]; j < s->kv_indptr[i + 1]; j++) {
            int32_t p = j - s->kv_indptr[i];
            s->kv_indices[j] = shares_prefix(i) && p < PREFIX_PAGES ? p : pool[k++];
        }
    s->num_pages = PREFIX_PAGES + fresh;
    free(pool);
    return 0;
}

static double bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Causal attention of request r in fp64, as the definition reads. Its query
 * token t (of lq) sees keys 0 .. kv_len - lq + t; key j lives at slot
 * j % PAGE of page kv_indices[kv_indptr[r] + j / PAGE]; query head h reads
 * KV head h / (H_QO / H_KV). out: [lq, H_QO, D]. Returns 0, or -1 when out
 * of memory. */
static int reference_request(const step *s, int32_t r, const uint16_t *q, const uint16_t *k,
                             const uint16_t *v, double *out) {
    const int32_t q0 = s->qo_indptr[r], lq = s->qo_indptr[r + 1] - q0, kv_len = s->kv_len[r];
    const int32_t *pages = s->kv_indices + s->kv_indptr[r];
    const double scale = 1.0 / sqrt((double)D);
    double *p = malloc(sizeof(double) * (size_t)kv_len); /* scores, then weights */
    if (!p) return -1;
    for (int32_t t = 0; t < lq; t++)
        for (int32_t h = 0; h < H_QO; h++) {
            const uint16_t *qt = q + ((size_t)(q0 + t) * H_QO + h) * D;
            const int32_t kh = h / (H_QO / H_KV), keys = kv_len - lq + t + 1;
            double max = -INFINITY, sum = 0.0;
            for (int32_t j = 0; j < keys; j++) {
                size_t row = ((size_t)pages[j / PAGE] * PAGE + (size_t)(j % PAGE)) * H_KV + kh;
                double dot = 0.0;
                for (int32_t d = 0; d < D; d++)
                    dot += bf16_value(qt[d]) * bf16_value(k[row * D + d]);
                p[j] = dot * scale;
                if (p[j] > max) max = p[j];
            }
            for (int32_t j = 0; j < keys; j++) sum += p[j] = exp(p[j] - max);
            double *o = out + ((size_t)t * H_QO + h) * D;
            for (int32_t d = 0; d < D; d++) o[d] = 0.0;
            for (int32_t j = 0; j < keys; j++) {
                size_t row = ((size_t)pages[j / PAGE] * PAGE + (size_t)(j % PAGE)) * H_KV + kh;
                for (int32_t d = 0; d < D; d++) o[d] += p[j] / sum * bf16_value(v[row * D + d]);
            }
        }
    free(p);
    return 0;
}

/* Requests [0, N_CHECKED) of layer 0 against the reference: their rows of o
 * are the first ones. Returns the largest error; *bad counts elements off
 * by more than the tolerance (NaN included), or is 1 when out of memory. */
static double check_sample(const step *s, const fi_run_args *a, int *bad) {
    const uint16_t *q = a->q.data, *k = a->k.data, *v = a->v.data, *o = a->o.data;
    const int64_t n = (int64_t)s->qo_indptr[N_CHECKED] * H_QO * D;
    double *ref = malloc(sizeof(double) * (size_t)n), worst = 0.0;
    *bad = 0;
    for (int32_t r = 0; r < N_CHECKED && ref; r++)
        if (reference_request(s, r, q, k, v, ref + (size_t)s->qo_indptr[r] * H_QO * D)) {
            free(ref);
            ref = NULL;
        }
    if (!ref) {
        *bad = 1;
        return NAN;
    }
    /* bf16 rounding of o (2^-9 relative) and f32 sums, with room; a key
     * too many or too few for a query moves its outputs by more */
    for (int64_t e = 0; e < n; e++) {
        double err = fabs(bf16_value(o[e]) - ref[e]);
        if (!(err <= 2e-3 + 1e-2 * fabs(ref[e]))) (*bad)++; /* NaN fails too */
        if (err > worst || isnan(err)) worst = err;
    }
    free(ref);
    return worst;
}

int fi_demo(int argc, char **argv) {
    int layers = 4, threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else { fprintf(stderr, "usage: fi demo [--layers N] [--threads N]\n"); return 2; }
    }
    if (layers < 1) layers = 1;
    step s;
    if (make_step(&s, 42)) { fprintf(stderr, "fi demo: out of memory\n"); return 1; }
    int32_t total_q = s.qo_indptr[N_REQ];
    size_t page_elems = (size_t)PAGE * H_KV * D, q_elems = (size_t)total_q * H_QO * D;
    size_t kv_elems = (size_t)s.num_pages * page_elems;
    uint16_t *q = malloc(q_elems * 2 * (size_t)layers), *o = malloc(q_elems * 2);
    uint16_t *kv = malloc(kv_elems * 2 * 2 * (size_t)layers); /* K and V per layer */
    float *lse = malloc(sizeof(float) * (size_t)total_q * H_QO);
    if (!q || !o || !kv || !lse) { fprintf(stderr, "fi demo: out of memory\n"); return 1; }
    fill_bf16(q, q_elems * (size_t)layers, 1);
    fill_bf16(kv, kv_elems * 2 * (size_t)layers, 2);

    fi_context_options opt;
    fi_context_options_init(&opt);
    opt.num_threads = threads;
    fi_context *ctx = NULL;
    fi_attention_params p;
    fi_attention_params_init(&p);
    p.num_qo_heads = H_QO; p.num_kv_heads = H_KV; p.head_dim_qk = p.head_dim_vo = D;
    p.page_size = PAGE;
    p.q_dtype = p.kv_dtype = p.o_dtype = FI_DTYPE_BF16;
    p.mask_mode = FI_MASK_CAUSAL;
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    cfg.max_batch_size = 256; cfg.max_total_qo = 4096; cfg.max_total_kv = 1 << 16;
    fi_plan *plan = NULL;
    fi_batch batch = {N_REQ, s.qo_indptr, s.kv_indptr, s.kv_indices, s.last, NULL};
    fi_status st = fi_context_create(&opt, &ctx);
    if (!st) st = fi_plan_create(ctx, &p, &cfg, &plan);
    /* The first update also faults in the fresh workspace; an engine plans
     * every step, so the second call is the steady-state cost. */
    double t0 = now();
    if (!st) st = fi_plan_update(plan, &batch);
    double first_plan_us = (now() - t0) * 1e6;
    t0 = now();
    if (!st) st = fi_plan_update(plan, &batch);
    double plan_us = (now() - t0) * 1e6;

    int64_t qs[3] = {total_q, H_QO, D}, ks[4] = {s.num_pages, PAGE, H_KV, D}, ls[2] = {total_q, H_QO};
    fi_run_args a;
    memset(&a, 0, sizeof a);
    a.o = fi_tensor_contiguous(o, FI_DTYPE_BF16, 3, qs);
    a.lse = fi_tensor_contiguous(lse, FI_DTYPE_F32, 2, ls);
    double layer_ms[64] = {0}, worst = 0.0;
    int bad = 0;
    for (int l = 0; l < layers && !st; l++) {
        a.q = fi_tensor_contiguous(q + q_elems * (size_t)l, FI_DTYPE_BF16, 3, qs);
        a.k = fi_tensor_contiguous(kv + kv_elems * 2 * (size_t)l, FI_DTYPE_BF16, 4, ks);
        a.v = fi_tensor_contiguous(kv + kv_elems * (2 * (size_t)l + 1), FI_DTYPE_BF16, 4, ks);
        memset(o, 0xff, q_elems * 2); /* poison: NaN in bf16 */
        t0 = now();
        st = fi_plan_run(plan, &a);
        if (l < 64) layer_ms[l] = (now() - t0) * 1e3;
        if (!st && l == 0) worst = check_sample(&s, &a, &bad);
    }
    if (st) {
        fprintf(stderr, "fi demo: %s: %s\n", fi_status_string(st), fi_last_error());
        return 1;
    }
    fi_plan_info info;
    fi_plan_info_init(&info);
    fi_plan_get_info(plan, &info);

    double keys = 0, pairs = 0;
    for (int32_t i = 0; i < N_REQ; i++) {
        int32_t lq = s.qo_indptr[i + 1] - s.qo_indptr[i];
        keys += s.kv_len[i];
        for (int32_t t = 0; t < lq; t++) pairs += s.kv_len[i] - lq + t + 1;
    }
    double total_ms = 0;
    for (int l = 0; l < layers && l < 64; l++) total_ms += layer_ms[l];
    double per_layer = total_ms / (layers < 64 ? layers : 64) * 1e-3;
    double bytes = 2.0 * keys * H_KV * D * 2 + 2.0 * total_q * H_QO * D * 2;

    printf("fi demo — one serving step on the CPU (%s)\n", fi_context_describe(ctx));
    printf("batch: %d prefill chunks (%d/%d/%d queries), %d decodes (%d share a %d-token "
           "prefix), %d query tokens, %.0f keys, page %d, %d pages per layer\n",
           N_PREFILL, prefill_q[0], prefill_q[1], prefill_q[2], N_DECODE, N_SHARING,
           PREFIX_PAGES * PAGE, total_q, keys, PAGE, s.num_pages);
    printf("model: %d query / %d KV heads, d %d, bf16, causal, %d layers\n\n", H_QO, H_KV, D, layers);
    printf("| stage | result |\n|---|---|\n");
    printf("| plan (once per step) | %.1f us (first call %.1f us): %d items on %d workers, %d split, "
           "%d merged rows, q tile %d |\n",
           plan_us, first_plan_us, info.num_items, info.num_workers, info.num_split_items, info.num_merge_rows,
           info.q_tile);
    printf("| run, per layer | %.2f ms mean over %d layers |\n", per_layer * 1e3, layers);
    printf("| throughput | %.1f GB/s KV+Q+O, %.1f GFLOP/s |\n", bytes / per_layer / 1e9,
           4.0 * H_QO * D * pairs / per_layer / 1e9);
    printf("| fp64 reference check (requests 0-%d, layer 0) | %s: max |err| %.2e over %d rows |\n",
           N_CHECKED - 1, bad ? "FAIL" : "pass", worst, s.qo_indptr[N_CHECKED]);

    fi_plan_destroy(plan);
    fi_context_destroy(ctx);
    free(q); free(o); free(kv); free(lse); free(s.kv_indices);
    return bad ? 1 : 0;
}
