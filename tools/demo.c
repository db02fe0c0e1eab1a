/*
 * demo.c — `fi demo`: one serving step on the CPU, the way an engine calls
 * the library. A batch of 3 chunked-prefill requests and 29 decodes whose KV
 * cache lives in shuffled 16-token pages (8 of the decodes share a 1024-token
 * system prompt: the same page ids), LLaMA-like heads (32 query / 8 KV, d 128,
 * bf16, causal). The step is planned once and run for every layer; a sample
 * of requests is checked against attention computed here in fp64, straight
 * from its definition, and that naive reference is the baseline of the
 * comparison column: the sample timed both ways, the whole layer estimated
 * for the reference at its rate. Last, a picture of the schedule: one row
 * per worker (fi_plan_get_worker_loads), its load as a bar.
 */
#include "tools.h"

#include <getopt.h>
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
 * by more than the tolerance (NaN included), or is 1 when out of memory;
 * *seconds gets the reference's time. */
static double check_sample(const step *s, const fi_run_args *a, int *bad, double *seconds) {
    const uint16_t *q = a->q.data, *k = a->k.data, *v = a->v.data, *o = a->o.data;
    const int64_t n = (int64_t)s->qo_indptr[N_CHECKED] * H_QO * D;
    double *ref = malloc(sizeof(double) * (size_t)n), worst = 0.0;
    *bad = 0;
    double t0 = now();
    for (int32_t r = 0; r < N_CHECKED && ref; r++)
        if (reference_request(s, r, q, k, v, ref + (size_t)s->qo_indptr[r] * H_QO * D)) {
            free(ref);
            ref = NULL;
        }
    *seconds = now() - t0;
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

/* Visible (query, key) pairs of requests [0, n): what attention's cost,
 * the reference's included, is proportional to. */
static double visible_pairs(const step *s, int32_t n) {
    double pairs = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t lq = s->qo_indptr[i + 1] - s->qo_indptr[i];
        for (int32_t t = 0; t < lq; t++) pairs += s->kv_len[i] - lq + t + 1;
    }
    return pairs;
}

/* Ours on the checked sample alone (the same requests the reference
 * computed: a prefix of the batch, so the first rows of q and o): the plan
 * re-planned for it, the best of three runs. Returns seconds, or -1. */
static double time_sample(fi_plan *plan, const step *s, fi_run_args a) {
    fi_batch sample = {N_CHECKED, s->qo_indptr, s->kv_indptr, s->kv_indices, s->last, NULL};
    if (fi_plan_update(plan, &sample)) return -1;
    int64_t qs[3] = {s->qo_indptr[N_CHECKED], H_QO, D}, ls[2] = {s->qo_indptr[N_CHECKED], H_QO};
    a.q = fi_tensor_contiguous(a.q.data, FI_DTYPE_BF16, 3, qs);
    a.o = fi_tensor_contiguous(a.o.data, FI_DTYPE_BF16, 3, qs);
    a.lse = fi_tensor_contiguous(a.lse.data, FI_DTYPE_F32, 2, ls);
    double best = -1;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        if (fi_plan_run(plan, &a)) return -1;
        double t = now() - t0;
        if (best < 0 || t < best) best = t;
    }
    return best;
}

static void print_time(char *buf, size_t n, double seconds) {
    if (seconds < 1e-3) snprintf(buf, n, "%.1f us", seconds * 1e6);
    else if (seconds < 1.0) snprintf(buf, n, "%.2f ms", seconds * 1e3);
    else snprintf(buf, n, "%.2f s", seconds);
}

/* The schedule, one text row per worker (rows of several workers, their
 * mean, past MAX_ROWS): a bar of the cost model's load against the busiest
 * worker's, '#' for whole work items and '+' for split ones (in proportion
 * to their count), then the counts. */
static void print_schedule(const fi_plan *plan) {
    enum { MAX_ROWS = 16, WIDTH = 40, MAX_WORKERS = 4096 };
    int32_t workers = 0;
    if (fi_plan_get_worker_loads(plan, 0, NULL, NULL, NULL, &workers) || workers < 1) return;
    if (workers > MAX_WORKERS) workers = MAX_WORKERS;
    int32_t *items = malloc(sizeof(int32_t) * (size_t)workers);
    int32_t *split = malloc(sizeof(int32_t) * (size_t)workers);
    double *cost = malloc(sizeof(double) * (size_t)workers);
    if (!items || !split || !cost ||
        fi_plan_get_worker_loads(plan, workers, items, split, cost, NULL)) {
        free(items); free(split); free(cost);
        return;
    }
    int32_t per_row = (workers + MAX_ROWS - 1) / MAX_ROWS, rows = (workers + per_row - 1) / per_row;
    double most = 0, sum = 0;
    int32_t total = 0;
    for (int32_t w = 0; w < workers; w++)
        most = fmax(most, cost[w]), sum += cost[w], total += items[w];
    printf("\nschedule: %d work items on %d workers; bar = the cost model's load (busiest = "
           "full), # whole items, + split items\n", (int)total, (int)workers);
    for (int32_t r = 0; r < rows; r++) {
        int32_t w0 = r * per_row, w1 = w0 + per_row < workers ? w0 + per_row : workers;
        int32_t n_items = 0, n_split = 0;
        double load = 0;
        for (int32_t w = w0; w < w1; w++) n_items += items[w], n_split += split[w], load += cost[w];
        load /= (double)(w1 - w0);
        int fill = most > 0 ? (int)lround(WIDTH * load / most) : 0;
        int plus = n_items ? (int)lround((double)fill * n_split / n_items) : 0;
        char bar[WIDTH + 1], who[32];
        for (int i = 0; i < WIDTH; i++) bar[i] = i < fill - plus ? '#' : i < fill ? '+' : '.';
        bar[WIDTH] = 0;
        if (w1 - w0 == 1) snprintf(who, sizeof who, "worker %d", (int)w0);
        else snprintf(who, sizeof who, "workers %d-%d", (int)w0, (int)w1 - 1);
        printf("  %-14s |%s| %4d items, %3d split%s\n", who, bar, (int)n_items, (int)n_split,
               w1 - w0 > 1 ? " (mean load)" : "");
    }
    printf("  balance: the busiest worker's load is %.2fx the mean\n",
           sum > 0 ? most * workers / sum : 1.0);
    free(items); free(split); free(cost);
}

static int demo_usage(FILE *f) {
    if (f != stdout) {
        fprintf(f, "usage: fi demo [--layers N] [--threads N] (fi demo --help)\n");
        return FI_EXIT_USAGE;
    }
    fprintf(f, "usage: fi demo [--layers N] [--threads N]\n"
               "One serving step on the CPU: 3 chunked prefills and 29 decodes (8 sharing a\n"
               "prompt) in a paged bf16 KV cache, 32/8 heads, d 128, causal; planned once,\n"
               "run for N layers (default 4, at most 64) on N threads (default: one per\n"
               "core). Six requests are checked against attention computed in fp64, and\n"
               "timed against that naive reference; the schedule is drawn per worker.\n");
    return 0;
}

int fi_demo(int argc, char **argv) {
    int layers = 4, threads = 0;
    static const struct option options[] = {{"layers", required_argument, NULL, 'l'},
                                            {"threads", required_argument, NULL, 't'},
                                            {"help", no_argument, NULL, 'h'},
                                            {0, 0, 0, 0}};
    optind = 0; /* from the start: the tool's tests call this more than once */
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, ":l:t:h", options, NULL)) != -1;) {
        if (c == 'h') return demo_usage(stdout);
        if (c == 'l' && !fi_tool_number("demo", "--layers", optarg, 1, 64, &layers)) continue;
        if (c == 't' && !fi_tool_number("demo", "--threads", optarg, 0, 4096, &threads)) continue;
        if (c == ':') fprintf(stderr, "fi demo: %s needs a value\n", argv[optind - 1]);
        if (c == '?') fprintf(stderr, "fi demo: unknown option %s\n", argv[optind - 1]);
        return demo_usage(stderr);
    }
    if (optind < argc) {
        fprintf(stderr, "fi demo: unexpected argument %s\n", argv[optind]);
        return demo_usage(stderr);
    }
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
    double layer_ms[64] = {0}, worst = 0.0, ref_s = 0.0;
    int bad = 0;
    for (int l = 0; l < layers && !st; l++) {
        a.q = fi_tensor_contiguous(q + q_elems * (size_t)l, FI_DTYPE_BF16, 3, qs);
        a.k = fi_tensor_contiguous(kv + kv_elems * 2 * (size_t)l, FI_DTYPE_BF16, 4, ks);
        a.v = fi_tensor_contiguous(kv + kv_elems * (2 * (size_t)l + 1), FI_DTYPE_BF16, 4, ks);
        memset(o, 0xff, q_elems * 2); /* poison: NaN in bf16 */
        t0 = now();
        st = fi_plan_run(plan, &a);
        layer_ms[l] = (now() - t0) * 1e3;
        if (!st && l == 0) worst = check_sample(&s, &a, &bad, &ref_s);
    }
    if (st) {
        fprintf(stderr, "fi demo: %s: %s\n", fi_status_string(st), fi_last_error());
        return 1;
    }
    fi_plan_info info;
    fi_plan_info_init(&info);
    fi_plan_get_info(plan, &info);

    double keys = 0, pairs = visible_pairs(&s, N_REQ), sample_pairs = visible_pairs(&s, N_CHECKED);
    for (int32_t i = 0; i < N_REQ; i++) keys += s.kv_len[i];
    double total_ms = 0;
    for (int l = 0; l < layers; l++) total_ms += layer_ms[l];
    double per_layer = total_ms / layers * 1e-3;
    double bytes = 2.0 * keys * H_KV * D * 2 + 2.0 * total_q * H_QO * D * 2;
    double flop = 4.0 * H_QO * D; /* per visible pair: q.k and p.v, a multiply-add each */

    printf("fi demo — one serving step on the CPU (%s)\n", fi_context_describe(ctx));
    printf("batch: %d prefill chunks (%d/%d/%d queries), %d decodes (%d share a %d-token "
           "prefix), %d query tokens, %.0f keys, page %d, %d pages per layer\n",
           N_PREFILL, prefill_q[0], prefill_q[1], prefill_q[2], N_DECODE, N_SHARING,
           PREFIX_PAGES * PAGE, total_q, keys, PAGE, s.num_pages);
    printf("model: %d query / %d KV heads, d %d, bf16, causal, %d layers\n", H_QO, H_KV, D, layers);
    printf("baseline: attention in fp64 straight from its definition, one thread (the "
           "check's reference)\n\n");
    char ours[32], theirs[32], first[32];
    printf("| stage | flashinfer.c | naive fp64 reference | result |\n|---|---|---|---|\n");
    print_time(ours, sizeof ours, plan_us * 1e-6);
    print_time(first, sizeof first, first_plan_us * 1e-6);
    printf("| plan (once per step) | %s (first call %s) | - | %d items on %d workers, %d split, "
           "%d merged rows, q tile %d |\n", ours, first, info.num_items, info.num_workers,
           info.num_split_items, info.num_merge_rows, info.q_tile);
    double sample_s = time_sample(plan, &s, a); /* re-plans: after fi_plan_get_info */
    print_time(theirs, sizeof theirs, ref_s);
    if (sample_s > 0) {
        print_time(ours, sizeof ours, sample_s);
        printf("| requests 0-%d, layer 0 (%d query rows) | %s | %s | %.0fx faster; %s: max |err| "
               "%.2e |\n", N_CHECKED - 1, s.qo_indptr[N_CHECKED], ours, theirs, ref_s / sample_s,
               bad ? "FAIL" : "pass", worst);
    } else {
        printf("| requests 0-%d, layer 0 (%d query rows) | - | %s | %s: max |err| %.2e |\n",
               N_CHECKED - 1, s.qo_indptr[N_CHECKED], theirs, bad ? "FAIL" : "pass", worst);
    }
    double ref_layer = ref_s * pairs / sample_pairs; /* at the sample's rate */
    print_time(ours, sizeof ours, per_layer);
    print_time(theirs, sizeof theirs, ref_layer);
    printf("| run, per layer (mean of %d) | %s | ~%s (estimated) | %.0fx faster |\n", layers, ours,
           theirs, ref_layer / per_layer);
    printf("| throughput | %.1f GB/s KV+Q+O, %.1f GFLOP/s | %.2f GFLOP/s | |\n",
           bytes / per_layer / 1e9, flop * pairs / per_layer / 1e9,
           flop * sample_pairs / ref_s / 1e9);
    fi_plan_update(plan, &batch); /* the step's schedule again, for its picture */
    print_schedule(plan);

    fi_plan_destroy(plan);
    fi_context_destroy(ctx);
    free(q); free(o); free(kv); free(lse); free(s.kv_indices);
    return bad ? 1 : 0;
}
