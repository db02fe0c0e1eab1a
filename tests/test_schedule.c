/*
 * test_schedule.c — the scheduler (src/core/schedule.c), two ways:
 *  1. internal: thousands of random batches through fi_schedule_build, each
 *     result checked for exact coverage, the reduction map, the bounds, the
 *     LPT guarantee, determinism and fixed-split batch invariance;
 *  2. public API on the CPU backend: split, unsplit and fixed-split runs
 *     against the fp64 oracle, run-to-run bit equality, and batch
 *     invariance of a request's output bits under fixed_split_size.
 */
#include "core/internal.h"
#include "core/schedule.h"
#include "oracle.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ batches */

enum { MAX_B = 700 };

typedef struct rbatch {
    int32_t B;
    int32_t qo_indptr[MAX_B + 1];
    int32_t kv_len[MAX_B];
} rbatch;

/* Mixed lengths: empty requests, decodes, short and long prefills, no keys. */
static void random_lengths(tu_rng *g, int32_t *qo, int32_t *kv) {
    int32_t kind = tu_rng_int(g, 0, 9);
    if (kind <= 4) *qo = 1;
    else if (kind == 5) *qo = 0;
    else if (kind <= 7) *qo = tu_rng_int(g, 2, 40);
    else *qo = tu_rng_int(g, 41, 400);
    int32_t k = tu_rng_int(g, 0, 9);
    *kv = k == 0 ? tu_rng_int(g, 0, 8) : k <= 6 ? tu_rng_int(g, 0, 3000) : tu_rng_int(g, 3000, 40000);
    if (tu_rng_int(g, 0, 3) > 0 && *kv < *qo) *kv = *qo + tu_rng_int(g, 0, 50); /* usual */
}

static void random_batch(tu_rng *g, rbatch *b) {
    int32_t big = tu_rng_int(g, 0, 9);
    b->B = big == 0 ? tu_rng_int(g, 100, MAX_B) : tu_rng_int(g, 0, 24);
    b->qo_indptr[0] = 0;
    for (int32_t r = 0; r < b->B; r++) {
        int32_t qo, kv;
        random_lengths(g, &qo, &kv);
        b->qo_indptr[r + 1] = b->qo_indptr[r] + qo;
        b->kv_len[r] = kv;
    }
}

static const int32_t tile_sets[4][4] = {{1, 16, 64, 128}, {16, 64, 128, 0}, {4, 0, 0, 0}, {8, 32, 0, 0}};
static const int32_t tile_counts[4] = {4, 3, 1, 2};

typedef struct scenario {
    rbatch b;
    fi_schedule_input in;
    int32_t max_kv;
} scenario;

static void random_scenario(tu_rng *g, scenario *sc) {
    random_batch(g, &sc->b);
    fi_schedule_input *in = &sc->in;
    memset(in, 0, sizeof *in);
    int32_t t = tu_rng_int(g, 0, 3);
    static const int32_t groups[] = {1, 2, 4, 7, 8};
    in->batch_size = sc->b.B;
    in->qo_indptr = sc->b.qo_indptr;
    in->kv_len = sc->b.kv_len;
    in->group_size = groups[tu_rng_int(g, 0, 4)];
    in->num_kv_heads = tu_rng_int(g, 1, 8);
    in->causal = tu_rng_int(g, 0, 1);
    in->window_left = tu_rng_int(g, 0, 3) == 0 ? tu_rng_int(g, 0, 3000) : -1;
    in->num_workers = tu_rng_int(g, 0, 2) == 0 ? tu_rng_int(g, 1, 4) : tu_rng_int(g, 1, 264);
    fi_sched_policy *pol = &in->policy;
    pol->split_workers = tu_rng_int(g, 0, 3) == 0 ? tu_rng_int(g, 1, in->num_workers) : 0;
    pol->split_max_chunks = tu_rng_int(g, 0, 3) == 0 ? tu_rng_int(g, 1, 128) : 0;
    memcpy(pol->q_tiles, tile_sets[t], sizeof pol->q_tiles);
    pol->num_q_tiles = tile_counts[t];
    pol->cost_per_q_row = tu_rng_int(g, 0, 4) == 0 ? 0.0 : tu_rng_range(g, 0.0, 10.0);
    pol->cost_per_key = tu_rng_range(g, 0.1, 2.0);
    int32_t mode = tu_rng_int(g, 0, 9);
    static const int32_t splits[] = {64, 100, 256, 1024, 4096};
    in->disable_split_kv = mode == 0;
    in->fixed_split_size = mode == 1 ? splits[tu_rng_int(g, 0, 4)] : 0;
    sc->max_kv = 0;
    for (int32_t r = 0; r < sc->b.B; r++)
        if (sc->b.kv_len[r] > sc->max_kv) sc->max_kv = sc->b.kv_len[r];
}

/* Limits for a scenario, the way a plan sizes them, with some slack. */
static void scenario_limits(tu_rng *g, const scenario *sc, fi_schedule_limits *lim) {
    int32_t B = sc->b.B + tu_rng_int(g, 0, 3) * tu_rng_int(g, 0, 50);
    int32_t Q = sc->b.qo_indptr[sc->b.B] + tu_rng_int(g, 0, 3) * tu_rng_int(g, 0, 100);
    int32_t N = sc->in.num_workers + tu_rng_int(g, 0, 1) * tu_rng_int(g, 0, 8);
    if (sc->in.fixed_split_size > 0)
        fi_schedule_limits_for_fixed_split(lim, B, Q, sc->max_kv, N, sc->in.fixed_split_size);
    else
        fi_schedule_limits_for(lim, B, Q, N);
}

/* ------------------------------------------------------------ checks */

#define FAIL(...) do { tu_note(__VA_ARGS__); return 1; } while (0)

/* Keys token t of a request (qo queries, kv keys) sees: [*lo, *hi). */
static void visible(const fi_schedule_input *in, int32_t qo, int32_t kv, int32_t t,
                    int32_t *lo, int32_t *hi) {
    int64_t l = 0, h = kv;
    if (in->causal) h = (int64_t)kv - qo + t + 1;
    if (in->window_left >= 0) l = (int64_t)kv - qo + t - in->window_left;
    if (l < 0) l = 0;
    if (h > kv) h = kv;
    if (h < l) h = l;
    *lo = (int32_t)l;
    *hi = (int32_t)h;
}

/* The cost model: rows above cost_rows_exact count as whole blocks of
 * cost_rows_block in the row x key term. */
static double pair_rows(const fi_schedule_input *in, int32_t t) {
    int64_t rows = (int64_t)t * in->group_size, b = in->policy.cost_rows_block;
    return (double)(b > 0 && rows > in->policy.cost_rows_exact ? (rows + b - 1) / b * b : rows);
}

static double item_cost(const fi_schedule_input *in, const fi_work_item *it) {
    double heads = in->num_kv_heads, t = it->q_end - it->q_start, keys = it->kv_end - it->kv_start;
    return heads * in->policy.cost_per_q_row * in->group_size * t + heads * in->policy.cost_per_key * keys +
           heads * in->policy.cost_per_row_key * pair_rows(in, it->q_end - it->q_start) * keys;
}

/* Items alone: shapes, ranges, tiles, chunk sizes. */
static int check_items(const fi_schedule *s, const fi_schedule_input *in) {
    const fi_schedule_limits *l = &s->limits;
    int32_t N = in->num_workers, F = in->disable_split_kv ? 0 : in->fixed_split_size;
    int32_t T = s->q_tile_rows / in->group_size > 1 ? s->q_tile_rows / in->group_size : 1;
    bool tile_ok = false;
    for (int32_t i = 0; i < in->policy.num_q_tiles; i++) tile_ok |= in->policy.q_tiles[i] == s->q_tile_rows;
    if (!tile_ok) FAIL("q_tile_rows %d is not a supported tile", s->q_tile_rows);
    if (s->num_workers != N || s->worker_indptr[0] != 0 || s->worker_indptr[N] != s->num_items)
        FAIL("worker_indptr: [0]=%d [N]=%d items %d", s->worker_indptr[0],
             s->worker_indptr[N], s->num_items);
    if (s->num_items > l->max_items || s->num_partial_rows > l->max_partial_rows)
        FAIL("items %d / partial rows %d over the limits %d / %d", s->num_items,
             s->num_partial_rows, l->max_items, l->max_partial_rows);
    for (int32_t w = 0; w < N; w++)
        if (s->worker_indptr[w + 1] < s->worker_indptr[w]) FAIL("worker_indptr decreases");
    for (int32_t i = 0; i < s->num_items; i++) {
        const fi_work_item *it = &s->items[i];
        if (it->request < 0 || it->request >= in->batch_size) FAIL("item %d: request %d", i, it->request);
        int32_t qo = in->qo_indptr[it->request + 1] - in->qo_indptr[it->request];
        int32_t kv = in->kv_len[it->request];
        if (it->q_start < 0 || it->q_end > qo || it->q_end <= it->q_start ||
            it->q_end - it->q_start > T || it->q_start % T != 0)
            FAIL("item %d: tokens [%d,%d) of %d, tile %d tokens", i, it->q_start, it->q_end, qo, T);
        if (it->kv_start < 0 || it->kv_end > kv || it->kv_end < it->kv_start)
            FAIL("item %d: keys [%d,%d) of %d", i, it->kv_start, it->kv_end, kv);
        if (it->partial_row < -1 ||
            (it->partial_row >= 0 && it->partial_row + it->q_end - it->q_start > s->num_partial_rows))
            FAIL("item %d: partial_row %d of %d", i, it->partial_row, s->num_partial_rows);
        if (it->partial_row >= 0 && in->disable_split_kv) FAIL("split with split-KV disabled");
        if (it->partial_row >= 0 && F == 0 &&
            it->kv_end - it->kv_start > FI_SCHEDULE_MAX_PIECE(s->kv_chunk))
            FAIL("item %d: %d keys > kv_chunk %d + 1/8", i, it->kv_end - it->kv_start, s->kv_chunk);
        if (it->partial_row >= 0 && F > 0 &&
            (it->kv_start / F != (it->kv_end - 1) / F))
            FAIL("item %d: keys [%d,%d) cross a %d-key boundary", i, it->kv_start, it->kv_end, F);
    }
    return 0;
}

/* Costs, loads, and LPT: queues longest first; the busiest worker's last
 * item went to a worker that was then the least loaded, so its load minus
 * that item is at most every other worker's final load. */
static int check_loads(const fi_schedule *s, const fi_schedule_input *in, double *ratio) {
    int32_t N = in->num_workers;
    double total = 0, max_item = 0, max_load = 0;
    int32_t busiest = 0;
    for (int32_t w = 0; w < N; w++) {
        double load = 0, prev = INFINITY;
        for (int32_t i = s->worker_indptr[w]; i < s->worker_indptr[w + 1]; i++) {
            double c = item_cost(in, &s->items[i]);
            if (c > prev && N > 1) FAIL("worker %d: queue not longest first", w);
            prev = c;
            load += c;
            if (c > max_item) max_item = c;
        }
        if (fabs(load - s->worker_cost[w]) > 1e-9 * (1 + load))
            FAIL("worker %d: cost %g, items add to %g", w, s->worker_cost[w], load);
        total += load;
        if (load > max_load) { max_load = load; busiest = w; }
    }
    if (fabs(total - s->total_cost) > 1e-9 * (1 + total) ||
        fabs(s->max_worker_cost - max_load) > 1e-9 * (1 + max_load))
        FAIL("total %g / max %g, expected %g / %g", s->total_cost, s->max_worker_cost, total, max_load);
    int32_t e = s->worker_indptr[busiest + 1];
    if (e > s->worker_indptr[busiest]) {
        double before = max_load - item_cost(in, &s->items[e - 1]);
        for (int32_t w = 0; w < N; w++)
            if (before > s->worker_cost[w] * (1 + 1e-12) + 1e-9)
                FAIL("LPT: worker %d ends at %g below the busiest's start %g of its last item",
                     w, s->worker_cost[w], before);
    }
    double lb = fmax(total / N, max_item);
    *ratio = lb > 0 ? max_load / lb : 1.0;
    return 0;
}

typedef struct cover {
    int32_t *count, *first, *list; /* per token: items [first, first + count) of list */
    int32_t *merge_of;             /* per token: its merge row or -1 */
    int32_t *written;              /* per partial row: writes, then reads */
} cover;

static void cover_free(cover *c) {
    free(c->count); free(c->first); free(c->list); free(c->merge_of); free(c->written);
    memset(c, 0, sizeof *c);
}

/* Per token, the items that cover it (CSR). */
static int cover_build(cover *c, const fi_schedule *s, const fi_schedule_input *in) {
    int32_t Q = in->batch_size ? in->qo_indptr[in->batch_size] : 0;
    int64_t inc = 0;
    memset(c, 0, sizeof *c);
    for (int32_t i = 0; i < s->num_items; i++) inc += s->items[i].q_end - s->items[i].q_start;
    c->count = calloc((size_t)Q + 1, sizeof(int32_t));
    c->first = calloc((size_t)Q + 1, sizeof(int32_t));
    c->list = calloc((size_t)inc + 1, sizeof(int32_t));
    c->merge_of = malloc(((size_t)Q + 1) * sizeof(int32_t));
    c->written = calloc((size_t)s->num_partial_rows + 1, sizeof(int32_t));
    if (!c->count || !c->first || !c->list || !c->merge_of || !c->written) return -1;
    for (int32_t i = 0; i < s->num_items; i++) {
        const fi_work_item *it = &s->items[i];
        for (int32_t t = it->q_start; t < it->q_end; t++) c->count[in->qo_indptr[it->request] + t]++;
    }
    for (int32_t t = 1; t <= Q; t++) c->first[t] = c->first[t - 1] + c->count[t - 1];
    int32_t *fill = calloc((size_t)Q + 1, sizeof(int32_t));
    if (!fill) return -1;
    for (int32_t i = 0; i < s->num_items; i++) {
        const fi_work_item *it = &s->items[i];
        for (int32_t t = it->q_start; t < it->q_end; t++) {
            int32_t g = in->qo_indptr[it->request] + t;
            c->list[c->first[g] + fill[g]++] = i;
        }
    }
    free(fill);
    for (int32_t t = 0; t < Q; t++) c->merge_of[t] = -1;
    return 0;
}

/* The merge map: each output row once, each partial row read once. */
static int check_merge_map(cover *c, const fi_schedule *s, const fi_schedule_input *in) {
    int32_t Q = in->batch_size ? in->qo_indptr[in->batch_size] : 0;
    if (s->merge_indptr[0] != 0 || s->merge_indptr[s->num_merge_rows] != s->num_partial_rows)
        FAIL("merge_indptr ends at %d, partial rows %d", s->merge_indptr[s->num_merge_rows],
             s->num_partial_rows);
    for (int32_t m = 0; m < s->num_merge_rows; m++) {
        int32_t o = s->merge_out_row[m];
        if (o < 0 || o >= Q || c->merge_of[o] >= 0) FAIL("merge row %d: output %d (again?)", m, o);
        c->merge_of[o] = m;
        if (s->merge_indptr[m + 1] - s->merge_indptr[m] < 2) FAIL("merge row %d of < 2 parts", m);
        for (int32_t j = s->merge_indptr[m]; j < s->merge_indptr[m + 1]; j++) {
            int32_t p = s->merge_src[j];
            if (p < 0 || p >= s->num_partial_rows || c->written[p]++)
                FAIL("merge row %d: partial row %d out of range or read twice", m, p);
        }
    }
    for (int32_t i = 0; i < s->num_items; i++) { /* every partial row written once */
        const fi_work_item *it = &s->items[i];
        if (it->partial_row < 0) continue;
        for (int32_t t = it->q_start; t < it->q_end; t++)
            if (c->written[it->partial_row + t - it->q_start]++ != 1)
                FAIL("partial row %d: not read once, or written twice", it->partial_row);
    }
    for (int32_t p = 0; p < s->num_partial_rows; p++)
        if (c->written[p] != 2) FAIL("partial row %d never written", p);
    return 0;
}

static const fi_schedule *sort_sched; /* qsort has no context argument */

static int by_kv(const void *x, const void *y) {
    int32_t a = sort_sched->items[*(const int32_t *)x].kv_start;
    int32_t b = sort_sched->items[*(const int32_t *)y].kv_start;
    return (a > b) - (a < b);
}

static void sort_by_kv(const fi_schedule *s, int32_t *ids, int32_t n) {
    sort_sched = s;
    qsort(ids, (size_t)n, sizeof *ids, by_kv);
}

/* Per token: its visible keys covered exactly once; written once, either by
 * one write-through item or by a merge row of its partials in key order. */
static int check_tokens(cover *c, const fi_schedule *s, const fi_schedule_input *in) {
    for (int32_t r = 0; r < in->batch_size; r++) {
        int32_t qo = in->qo_indptr[r + 1] - in->qo_indptr[r], kv = in->kv_len[r];
        for (int32_t t = 0; t < qo; t++) {
            int32_t g = in->qo_indptr[r] + t, n = c->count[g], *ids = c->list + c->first[g];
            int32_t lo, hi;
            visible(in, qo, kv, t, &lo, &hi);
            if (n < 1) FAIL("request %d token %d: no item", r, t);
            sort_by_kv(s, ids, n);
            int64_t seen = 0;
            for (int32_t k = 0; k < n; k++) {
                const fi_work_item *it = &s->items[ids[k]];
                if (k > 0 && it->kv_start < s->items[ids[k - 1]].kv_end)
                    FAIL("request %d token %d: items overlap at key %d", r, t, it->kv_start);
                int32_t a = it->kv_start > lo ? it->kv_start : lo;
                int32_t b = it->kv_end < hi ? it->kv_end : hi;
                seen += b > a ? b - a : 0;
                if ((n == 1) != (it->partial_row < 0))
                    FAIL("request %d token %d: %d items, partial_row %d", r, t, n, it->partial_row);
            }
            if (seen != hi - lo)
                FAIL("request %d token %d: %lld of keys [%d,%d) covered", r, t, (long long)seen, lo, hi);
            int32_t m = c->merge_of[g];
            if (n == 1) {
                if (m >= 0) FAIL("request %d token %d: write-through but merged", r, t);
                continue;
            }
            if (m < 0 || s->merge_indptr[m + 1] - s->merge_indptr[m] != n)
                FAIL("request %d token %d: split in %d but merge row %d", r, t, n, m);
            for (int32_t k = 0; k < n; k++) {
                const fi_work_item *it = &s->items[ids[k]];
                if (s->merge_src[s->merge_indptr[m] + k] != it->partial_row + t - it->q_start)
                    FAIL("request %d token %d: merge sources not in key order", r, t);
            }
        }
    }
    return 0;
}

static int check_schedule(const fi_schedule *s, const fi_schedule_input *in, double *ratio) {
    if (check_items(s, in) || check_loads(s, in, ratio)) return 1;
    cover c;
    int bad = cover_build(&c, s, in) ? (tu_note("out of memory"), 1) : 0;
    bad = bad || check_merge_map(&c, s, in) || check_tokens(&c, s, in);
    cover_free(&c);
    return bad;
}

static int same_schedule(const fi_schedule *a, const fi_schedule *b) {
    int32_t N = a->num_workers;
    return a->num_items == b->num_items && a->num_merge_rows == b->num_merge_rows &&
           a->num_partial_rows == b->num_partial_rows && a->kv_chunk == b->kv_chunk &&
           a->q_tile_rows == b->q_tile_rows && N == b->num_workers &&
           !memcmp(a->items, b->items, sizeof *a->items * (size_t)a->num_items) &&
           !memcmp(a->worker_indptr, b->worker_indptr, sizeof(int32_t) * (size_t)(N + 1)) &&
           !memcmp(a->worker_cost, b->worker_cost, sizeof(double) * (size_t)N) &&
           !memcmp(a->merge_out_row, b->merge_out_row, sizeof(int32_t) * (size_t)a->num_merge_rows) &&
           !memcmp(a->merge_indptr, b->merge_indptr, sizeof(int32_t) * (size_t)(a->num_merge_rows + 1)) &&
           !memcmp(a->merge_src, b->merge_src, sizeof(int32_t) * (size_t)a->num_partial_rows);
}

/* ------------------------------------------------------------ cases */

/* The exact optimum of assigning the items' costs to N workers (tiny n). */
static double brute_opt(const double *c, int32_t n, int32_t N, double *load, int32_t i) {
    if (i == n) {
        double m = 0;
        for (int32_t w = 0; w < N; w++) m = fmax(m, load[w]);
        return m;
    }
    double best = INFINITY;
    for (int32_t w = 0; w < N; w++) {
        load[w] += c[i];
        best = fmin(best, brute_opt(c, n, N, load, i + 1));
        load[w] -= c[i];
        if (load[w] == 0) break; /* empty workers are interchangeable */
    }
    return best;
}

static int check_opt(const fi_schedule *s, const fi_schedule_input *in) {
    double c[10], load[8] = {0};
    int32_t n = s->num_items, N = in->num_workers;
    if (n > 10 || N > 8) return 0;
    for (int32_t i = 0; i < n; i++) c[i] = item_cost(in, &s->items[i]);
    double opt = brute_opt(c, n, N, load, 0);
    if (s->max_worker_cost > opt * 4.0 / 3.0 * (1 + 1e-12) + 1e-12)
        FAIL("LPT makespan %g > 4/3 of the optimum %g", s->max_worker_cost, opt);
    return 0;
}

static void case_properties(int32_t count, uint64_t seed0) {
    char name[64];
    double worst_ratio = 0;
    int32_t splits = 0;
    for (int32_t k = 0; k < count; k++) {
        snprintf(name, sizeof name, "property/%d", (int)k);
        if (!tu_selected(name)) continue;
        tu_rng g;
        tu_rng_seed(&g, seed0 + tu_case_seed(name));
        scenario sc;
        random_scenario(&g, &sc);
        fi_schedule_limits lim;
        scenario_limits(&g, &sc, &lim);
        fi_schedule a, b;
        int bad = fi_schedule_init(&a, &lim) || fi_schedule_init(&b, &lim);
        double ratio = 0;
        fi_status st = bad ? FI_STATUS_OUT_OF_MEMORY : fi_schedule_build(&a, &sc.in);
        if (st) tu_note("build: %s: %s", fi_status_string(st), fi_last_error());
        bad = bad || st || check_schedule(&a, &sc.in, &ratio) || check_opt(&a, &sc.in);
        if (!bad) { /* determinism: a fresh schedule, and a reused one after another batch */
            fi_work_item *items = a.items;
            scenario other;
            random_scenario(&g, &other);
            other.in.num_workers = sc.in.num_workers;
            other.in.fixed_split_size = 0;
            fi_schedule_build(&a, &other.in); /* may fail on bounds: fine */
            bad = fi_schedule_build(&a, &sc.in) || fi_schedule_build(&b, &sc.in) ||
                  !same_schedule(&a, &b) || a.items != items;
            if (bad) tu_note("not deterministic, or arrays moved");
        }
        splits += a.num_partial_rows > 0;
        if (ratio > worst_ratio) worst_ratio = ratio;
        if (bad)
            tu_note("B %d, workers %d, group %d, causal %d, window %d, disable %d, fixed %d",
                    sc.in.batch_size, sc.in.num_workers, sc.in.group_size, sc.in.causal,
                    sc.in.window_left, sc.in.disable_split_kv, sc.in.fixed_split_size);
        tu_record("schedule properties", name, bad ? TU_FAIL : TU_PASS);
        fi_schedule_free(&a);
        fi_schedule_free(&b);
    }
    if (tu_opt.verbose)
        printf("  %d batches, %d split; worst max-load / max(total/N, max item) = %.3f\n",
               (int)count, (int)splits, worst_ratio);
}

/* Small batches, few items: the makespan against the brute-force optimum. */
static void case_lpt_optimum(int32_t count) {
    char name[64];
    for (int32_t k = 0; k < count; k++) {
        snprintf(name, sizeof name, "lpt-optimum/%d", (int)k);
        if (!tu_selected(name)) continue;
        tu_rng g;
        tu_rng_seed(&g, tu_case_seed(name));
        scenario sc;
        random_scenario(&g, &sc);
        sc.b.B = tu_rng_int(&g, 1, 9);
        for (int32_t r = 0; r < sc.b.B; r++) {
            sc.b.qo_indptr[r + 1] = sc.b.qo_indptr[r] + tu_rng_int(&g, 0, 1);
            sc.b.kv_len[r] = tu_rng_int(&g, 0, 3) ? tu_rng_int(&g, 1, 5000) : 3000;
        }
        sc.in.batch_size = sc.b.B;
        sc.in.num_workers = tu_rng_int(&g, 2, 4);
        sc.in.disable_split_kv = tu_rng_int(&g, 0, 1);
        sc.in.fixed_split_size = 0;
        fi_schedule_limits lim;
        fi_schedule_limits_for(&lim, sc.b.B, sc.b.qo_indptr[sc.b.B], sc.in.num_workers);
        fi_schedule s;
        double ratio;
        int bad = fi_schedule_init(&s, &lim) || fi_schedule_build(&s, &sc.in) ||
                  check_schedule(&s, &sc.in, &ratio) || check_opt(&s, &sc.in);
        tu_record("LPT within 4/3 of optimum", name, bad ? TU_FAIL : TU_PASS);
        fi_schedule_free(&s);
    }
}

static int by_row(const void *x, const void *y) { return memcmp(x, y, 5 * sizeof(int32_t)); }

/* The items of request r, in (q_start, kv_start) order, as comparable rows
 * (request index and partial row numbers removed). */
static int32_t request_items(const fi_schedule *s, int32_t r, int32_t (*out)[5], int32_t cap) {
    int32_t n = 0;
    for (int32_t i = 0; i < s->num_items && n < cap; i++) {
        const fi_work_item *it = &s->items[i];
        if (it->request != r) continue;
        int32_t row[5] = {it->q_start, it->q_end, it->kv_start, it->kv_end, it->partial_row >= 0};
        memcpy(out[n++], row, sizeof row);
    }
    qsort(out, (size_t)n, sizeof out[0], by_row);
    return n;
}

/* fixed_split_size: a request's items do not depend on the rest of the batch. */
static void case_fixed_split_invariance(int32_t count) {
    enum { CAP = 1 << 17 };
    static int32_t ia[CAP][5], ib[CAP][5];
    char name[64];
    for (int32_t k = 0; k < count; k++) {
        snprintf(name, sizeof name, "fixed-split-invariance/%d", (int)k);
        if (!tu_selected(name)) continue;
        tu_rng g;
        tu_rng_seed(&g, tu_case_seed(name));
        scenario sa, sb;
        random_scenario(&g, &sa);
        random_scenario(&g, &sb);
        int32_t pq, pk, F = 64 << tu_rng_int(&g, 0, 6);
        if (sa.b.B > 24) sa.b.B = 24;
        if (sb.b.B > 24) sb.b.B = 24;
        random_lengths(&g, &pq, &pk);
        sb.in = sa.in; /* same model, another batch and worker count */
        sb.in.qo_indptr = sb.b.qo_indptr;
        sb.in.kv_len = sb.b.kv_len;
        sb.in.num_workers = tu_rng_int(&g, 1, 264);
        sa.in.fixed_split_size = sb.in.fixed_split_size = F;
        sa.in.disable_split_kv = sb.in.disable_split_kv = false;
        scenario *both[2] = {&sa, &sb};
        int32_t at[2];
        for (int32_t j = 0; j < 2; j++) { /* insert the probe request at a random place */
            rbatch *b = &both[j]->b;
            if (b->B == MAX_B) b->B--;
            int32_t p = at[j] = tu_rng_int(&g, 0, b->B);
            for (int32_t r = b->B; r > p; r--) {
                b->kv_len[r] = b->kv_len[r - 1];
                b->qo_indptr[r + 1] = b->qo_indptr[r] + pq;
            }
            b->kv_len[p] = pk;
            b->qo_indptr[p + 1] = b->qo_indptr[p] + pq;
            b->B++;
            both[j]->in.batch_size = b->B;
            both[j]->max_kv = pk > both[j]->max_kv ? pk : both[j]->max_kv;
        }
        fi_schedule x, y;
        fi_schedule_limits la, lb;
        scenario_limits(&g, &sa, &la);
        scenario_limits(&g, &sb, &lb);
        int bad = fi_schedule_init(&x, &la) || fi_schedule_init(&y, &lb) ||
                  fi_schedule_build(&x, &sa.in) || fi_schedule_build(&y, &sb.in);
        if (bad) tu_note("build: %s", fi_last_error());
        int32_t na = bad ? 0 : request_items(&x, at[0], ia, CAP);
        int32_t nb = bad ? 0 : request_items(&y, at[1], ib, CAP);
        if (!bad && (na != nb || memcmp(ia, ib, sizeof ia[0] * (size_t)na) ||
                     x.q_tile_rows != y.q_tile_rows)) {
            tu_note("probe (%d queries, %d keys, F %d): %d vs %d items", pq, pk, F, na, nb);
            bad = 1;
        }
        tu_record("fixed split batch-invariant", name, bad ? TU_FAIL : TU_PASS);
        fi_schedule_free(&x);
        fi_schedule_free(&y);
    }
}

static int expect_bound(fi_schedule *s, const fi_schedule_input *in, const char *bound) {
    fi_status st = fi_schedule_build(s, in);
    if (st != FI_STATUS_BOUND_EXCEEDED || !strstr(fi_last_error(), bound))
        FAIL("expected a bound error naming %s, got %s: %s", bound, fi_status_string(st),
             fi_last_error());
    return 0;
}

/* Over a bound: FI_STATUS_BOUND_EXCEEDED naming it, the last schedule kept. */
static void case_bounds(void) {
    if (!tu_selected("bounds")) return;
    static int32_t qo[MAX_B + 1], kv[MAX_B];
    for (int32_t r = 0; r < MAX_B; r++) { qo[r + 1] = qo[r] + 1; kv[r] = 5000; }
    fi_schedule_input in = {.batch_size = 8, .qo_indptr = qo, .kv_len = kv, .group_size = 4,
                            .num_kv_heads = 8, .causal = true, .window_left = -1, .num_workers = 4,
                            .policy = {.q_tiles = {1, 16, 64, 128}, .num_q_tiles = 4,
                                       .cost_per_q_row = 1, .cost_per_key = 1}};
    fi_schedule_limits lim;
    fi_schedule_limits_for(&lim, 8, 8, 4);
    fi_schedule s, keep;
    int bad = fi_schedule_init(&s, &lim) || fi_schedule_init(&keep, &lim) ||
              fi_schedule_build(&s, &in) || fi_schedule_build(&keep, &in);
    in.batch_size = 9;
    bad = bad || expect_bound(&s, &in, "max_batch_size");
    in.batch_size = 8;
    qo[8] = 9;
    bad = bad || expect_bound(&s, &in, "max_total_qo");
    qo[8] = 8;
    in.num_workers = 5;
    bad = bad || expect_bound(&s, &in, "max_workers");
    in.num_workers = 4;
    in.fixed_split_size = 16; /* 5000 keys in 313 chunks: over the auto limits */
    bad = bad || expect_bound(&s, &in, "max_items");
    lim.max_items = 1 << 20;
    fi_schedule big;
    bad = bad || fi_schedule_init(&big, &lim) || expect_bound(&big, &in, "max_partial_rows");
    fi_schedule_free(&big);
    if (!bad && !same_schedule(&s, &keep)) {
        tu_note("a failed build changed the schedule");
        bad = 1;
    }
    tu_record("bounds named", "bounds", bad ? TU_FAIL : TU_PASS);
    fi_schedule_free(&s);
    fi_schedule_free(&keep);
}

/* Decode batches always get the full chunk bound: the partial-row budget of
 * fi_schedule_limits_for never binds for them (the proof in schedule.c). */
static void case_decode_budget(int32_t count) {
    static int32_t qo[MAX_B + 1], kv[MAX_B];
    char name[64];
    for (int32_t k = 0; k < count; k++) {
        snprintf(name, sizeof name, "decode-budget/%d", (int)k);
        if (!tu_selected(name)) continue;
        tu_rng g;
        tu_rng_seed(&g, tu_case_seed(name));
        int32_t B = tu_rng_int(&g, 1, k % 2 ? 8 : MAX_B), N = tu_rng_int(&g, 1, 264);
        int64_t S = 0;
        for (int32_t r = 0; r < B; r++) {
            qo[r + 1] = qo[r] + 1;
            kv[r] = tu_rng_int(&g, 0, 3) ? tu_rng_int(&g, 1, 2000) : tu_rng_int(&g, 1, 200000);
            S += kv[r];
        }
        fi_schedule_input in = {.batch_size = B, .qo_indptr = qo, .kv_len = kv, .group_size = 4,
                                .num_kv_heads = 8, .causal = true, .window_left = -1,
                                .num_workers = N, .policy = {.q_tiles = {1, 16, 64, 128},
                                                             .num_q_tiles = 4, .cost_per_q_row = 1,
                                                             .cost_per_key = 1}};
        fi_schedule_limits lim;
        fi_schedule_limits_for(&lim, B, B, N);
        fi_schedule s;
        int64_t L = (S + N - 1) / N;
        /* the floor: 256 keys, 128 where 256-key chunks fill under N / 4 slots */
        const int64_t least = 4 * S < 256 * (int64_t)N ? 128 : 256;
        L = L < least ? least : (L + 15) / 16 * 16;
        double ratio;
        int bad = fi_schedule_init(&s, &lim) || fi_schedule_build(&s, &in) ||
                  check_schedule(&s, &in, &ratio);
        if (!bad && s.kv_chunk != 0 && s.kv_chunk != L) {
            tu_note("B %d, N %d: chunk %d, expected %lld", B, N, s.kv_chunk, (long long)L);
            bad = 1;
        }
        tu_record("decode never hits the row budget", name, bad ? TU_FAIL : TU_PASS);
        fi_schedule_free(&s);
    }
}

/* policy.split_max_chunks: no decode request is cut into more chunks than
 * that, however many slots there are (a merge reads each chunk in turn). */
static void case_max_chunks(int32_t count) {
    static int32_t qo[MAX_B + 1], kv[MAX_B], chunks[MAX_B];
    char name[64];
    for (int32_t k = 0; k < count; k++) {
        snprintf(name, sizeof name, "max-chunks/%d", (int)k);
        if (!tu_selected(name)) continue;
        tu_rng g;
        tu_rng_seed(&g, tu_case_seed(name));
        int32_t B = tu_rng_int(&g, 1, k % 2 ? 4 : 64), N = tu_rng_int(&g, 1, 528);
        int32_t cap = tu_rng_int(&g, 1, 128);
        for (int32_t r = 0; r < B; r++) {
            qo[r + 1] = qo[r] + 1;
            kv[r] = tu_rng_int(&g, 0, 1) ? tu_rng_int(&g, 1, 4000) : tu_rng_int(&g, 1, 300000);
            chunks[r] = 0;
        }
        fi_schedule_input in = {.batch_size = B, .qo_indptr = qo, .kv_len = kv, .group_size = 8,
                                .num_kv_heads = 1, .causal = true, .window_left = -1,
                                .num_workers = N, .policy = {.q_tiles = {128}, .num_q_tiles = 1,
                                                             .cost_per_q_row = 1, .cost_per_key = 1,
                                                             .split_max_chunks = cap}};
        fi_schedule_limits lim;
        fi_schedule_limits_for(&lim, B, B, N);
        fi_schedule s;
        double ratio;
        int bad = fi_schedule_init(&s, &lim) || fi_schedule_build(&s, &in) ||
                  check_schedule(&s, &in, &ratio);
        for (int32_t i = 0; !bad && i < s.num_items; i++) chunks[s.items[i].request]++;
        for (int32_t r = 0; !bad && r < B; r++)
            if (chunks[r] > cap) {
                tu_note("B %d, N %d, cap %d: request %d (%d keys) in %d chunks", B, N, cap, r,
                        kv[r], chunks[r]);
                bad = 1;
            }
        tu_record("split_max_chunks bounds a request's chunks", name, bad ? TU_FAIL : TU_PASS);
        fi_schedule_free(&s);
    }
}

/* Build `in`'s schedule with no budget on partial rows (the chunk bound
 * alone decides the splits) and check it; non-zero on failure. */
static int build_unbudgeted(fi_schedule *s, const fi_schedule_input *in) {
    const int32_t total_qo = in->qo_indptr[in->batch_size];
    fi_schedule_limits lim;
    fi_schedule_limits_for(&lim, in->batch_size, total_qo, in->num_workers);
    lim.max_partial_rows = total_qo * in->num_workers;
    double ratio;
    return fi_schedule_init(s, &lim) || fi_schedule_build(s, in) || check_schedule(s, in, &ratio);
}

/* A wide tile's chunks are shorter than a decode's by its key weight (the
 * cost of one of its keys over a one-token tile's), so that its chunks cost
 * about what a decode's full chunk does: decodes beside a few wide tiles,
 * tensor-core-like costs (key 1, row x key 0.007, group 4; half the cases
 * count rows above 16 as whole 128-row blocks). Every split
 * chunk of a t-token tile holds at most ceil(kv_chunk / w(t)) keys (aligned,
 * at least FI_SCHEDULE_MIN_CHUNK) plus a spread remainder (at most an
 * eighth more, FI_SCHEDULE_MAX_PIECE); so does a tile left whole. */
static void case_weighted_chunks(int32_t count) {
    static int32_t qo[MAX_B + 1], kv[MAX_B];
    char name[64];
    for (int32_t k = 0; k < count; k++) {
        snprintf(name, sizeof name, "weighted-chunks/%d", (int)k);
        if (!tu_selected(name)) continue;
        tu_rng g;
        tu_rng_seed(&g, tu_case_seed(name));
        int32_t B = tu_rng_int(&g, 20, 200), W = tu_rng_int(&g, 1, 8), N = tu_rng_int(&g, 16, 64);
        for (int32_t r = 0; r < B; r++) {
            int32_t q = r < W ? tu_rng_int(&g, 2, 40) : 1;
            qo[r + 1] = qo[r] + q;
            kv[r] = r < W ? tu_rng_int(&g, 4000, 20000) : tu_rng_int(&g, 100, 2000);
        }
        fi_schedule_input in = {.batch_size = B, .qo_indptr = qo, .kv_len = kv, .group_size = 4,
                                .num_kv_heads = 8, .causal = true, .window_left = -1,
                                .num_workers = N, .policy = {.q_tiles = {128}, .num_q_tiles = 1,
                                                             .cost_per_q_row = 1,
                                                             .cost_per_key = 1,
                                                             .cost_per_row_key = 0.007,
                                                             .cost_rows_exact = 16,
                                                             .cost_rows_block = k % 2 ? 128 : 0}};
        fi_schedule s;
        int bad = build_unbudgeted(&s, &in);
        /* with a chunk bound, every item (split or whole) keeps within its
         * tile's: a longer tile would have been split */
        for (int32_t i = 0; !bad && s.kv_chunk > 0 && i < s.num_items; i++) {
            const fi_work_item *it = &s.items[i];
            int32_t t = it->q_end - it->q_start, keys = it->kv_end - it->kv_start;
            double w = (1.0 + 0.007 * pair_rows(&in, t)) / (1.0 + 0.007 * pair_rows(&in, 1));
            int64_t bound = t > 1 ? (int64_t)ceil(s.kv_chunk / w) : s.kv_chunk;
            bound = bound < FI_SCHEDULE_MIN_CHUNK ? FI_SCHEDULE_MIN_CHUNK : (bound + 15) / 16 * 16;
            bound = FI_SCHEDULE_MAX_PIECE(bound);
            if (keys > bound) {
                tu_note("item %d (%s): %d tokens x %d keys > bound %lld (chunk %d)", (int)i,
                        it->partial_row >= 0 ? "split" : "whole", (int)t, (int)keys,
                        (long long)bound, s.kv_chunk);
                bad = 1;
            }
        }
        tu_record("wide tiles split by key weight", name, bad ? TU_FAIL : TU_PASS);
        fi_schedule_free(&s);
    }
}

/* How a decode's span is cut (one-token tiles weigh 1, so the chunk bound
 * is kv_chunk): chunks of kv_chunk keys from its start and the remainder
 * last; a sliver spread over the others (not checked here); and, when
 * fewer items run at once than there are workers (split_workers <
 * num_workers, as on a GPU), a remainder of at least half a chunk makes k
 * near-equal pieces of ceil(len / k) keys rounded up to 16, the last one
 * shorter. */
static void case_equal_pieces(int32_t count) {
    static int32_t qo[MAX_B + 1], kv[MAX_B];
    char name[64];
    for (int32_t k = 0; k < count; k++) {
        snprintf(name, sizeof name, "equal-pieces/%d", (int)k);
        if (!tu_selected(name)) continue;
        tu_rng g;
        tu_rng_seed(&g, tu_case_seed(name));
        const int32_t B = tu_rng_int(&g, 1, 40), N = tu_rng_int(&g, 16, 264);
        const bool equal = k % 2 == 0;
        for (int32_t r = 0; r < B; r++) {
            qo[r + 1] = qo[r] + 1;
            kv[r] = tu_rng_int(&g, 1, 30000);
        }
        fi_schedule_input in = {.batch_size = B, .qo_indptr = qo, .kv_len = kv, .group_size = 4,
                                .num_kv_heads = 8, .causal = true, .window_left = -1,
                                .num_workers = N, .policy = {.q_tiles = {1}, .num_q_tiles = 1,
                                                             .cost_per_q_row = 1,
                                                             .cost_per_key = 1,
                                                             .split_workers = equal ? tu_rng_int(&g, 1, N / 4) : 0}};
        fi_schedule s;
        int bad = build_unbudgeted(&s, &in);
        const int64_t L = s.kv_chunk;
        for (int32_t r = 0; !bad && L > 0 && r < B; r++) {
            const int64_t len = kv[r], k0 = (len + L - 1) / L, rem = len - (k0 - 1) * L;
            if (k0 < 2 || (rem < FI_SCHEDULE_MIN_CHUNK && 8 * rem <= L)) continue;
            int64_t p = L;
            if (equal && 2 * rem >= L) p = ((len + k0 - 1) / k0 + 15) / 16 * 16;
            for (int32_t i = 0; i < s.num_items; i++) {
                const fi_work_item *it = &s.items[i];
                if (it->request != r) continue;
                const int64_t c = it->kv_start / p;
                const int64_t want = c < k0 - 1 ? p : len - (k0 - 1) * p;
                if (it->kv_start % p || it->kv_end - it->kv_start != want) {
                    tu_note("B %d, N %d, split_workers %d, request %d (%lld keys, chunk %lld): "
                            "piece [%d, %d), want %lld keys from a multiple of %lld", (int)B, (int)N,
                            (int)in.policy.split_workers, (int)r, (long long)len, (long long)L,
                            (int)it->kv_start, (int)it->kv_end, (long long)want, (long long)p);
                    bad = 1;
                    break;
                }
            }
        }
        tu_record(equal ? "near-equal pieces" : "chunks from the start",
                  name, bad ? TU_FAIL : TU_PASS);
        fi_schedule_free(&s);
    }
}

/* The assignment against a plain LPT written here: items by cost, longest
 * first, ties in generation order (request, token, key), each to the first
 * least-loaded worker, with the scheduler's cost formula. The scheduler's
 * fast paths (a scan for few workers, rounds over the sorted workers, a
 * tournament tree when rounds get short) must give the same queues and
 * the same load bits. Batches: random, equal lengths, and long prefill
 * tiles followed by many short decodes (the case that hands work to the
 * tree). */
static const fi_schedule_input *ref_in;
static const fi_work_item *ref_items;
static const double *ref_cost;

static int by_cost_then_gen(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    if (ref_cost[a] != ref_cost[b]) return ref_cost[a] < ref_cost[b] ? 1 : -1;
    const fi_work_item *p = &ref_items[a], *q = &ref_items[b];
    if (p->request != q->request) return p->request < q->request ? -1 : 1;
    if (p->q_start != q->q_start) return p->q_start < q->q_start ? -1 : 1;
    return (p->kv_start > q->kv_start) - (p->kv_start < q->kv_start);
}

static int check_reference_lpt(const fi_schedule *s, const fi_schedule_input *in) {
    int32_t n = s->num_items, N = in->num_workers;
    double heads = in->num_kv_heads, rc = heads * in->policy.cost_per_q_row * in->group_size;
    double kc = heads * in->policy.cost_per_key, pc = heads * in->policy.cost_per_row_key;
    double *cost = malloc(sizeof(double) * ((size_t)n + 1)), *load = calloc((size_t)N, sizeof(double));
    int32_t *ids = malloc(sizeof(int32_t) * ((size_t)n + 1)), *at = calloc((size_t)N, sizeof(int32_t));
    int bad = !cost || !load || !ids || !at;
    for (int32_t i = 0; i < n && !bad; i++) {
        const fi_work_item *it = &s->items[i];
        int32_t t = it->q_end - it->q_start, k = it->kv_end - it->kv_start;
        cost[i] = rc * t + kc * k + pc * pair_rows(in, t) * (double)k;
        ids[i] = i;
    }
    ref_in = in;
    ref_items = s->items;
    ref_cost = cost;
    if (!bad && N > 1) qsort(ids, (size_t)n, sizeof *ids, by_cost_then_gen);
    if (!bad && N == 1) { /* one worker: nothing sorted, the queue in generation order */
        double *zero = calloc((size_t)n + 1, sizeof(double));
        ref_cost = zero;
        if (zero) qsort(ids, (size_t)n, sizeof *ids, by_cost_then_gen);
        else bad = 1;
        free(zero);
    }
    for (int32_t w = 0; w < N && !bad; w++) at[w] = s->worker_indptr[w];
    for (int32_t r = 0; r < n && !bad; r++) {
        int32_t i = ids[r], w = 0;
        for (int32_t v = 1; v < N; v++) w = load[v] < load[w] ? v : w;
        load[w] += cost[i];
        if (at[w] >= s->worker_indptr[w + 1] || memcmp(&s->items[at[w]], &s->items[i], sizeof *s->items)) {
            tu_note("item %d of the reference order: not next on worker %d", (int)r, (int)w);
            bad = 1;
        }
        at[w]++;
    }
    for (int32_t w = 0; w < N && !bad; w++)
        if (memcmp(&load[w], &s->worker_cost[w], sizeof(double))) {
            tu_note("worker %d: load %.17g, reference %.17g", (int)w, s->worker_cost[w], load[w]);
            bad = 1;
        }
    free(cost); free(load); free(ids); free(at);
    return bad;
}

static void case_reference_lpt(int32_t count) {
    static int32_t qo[MAX_B + 1], kv[MAX_B];
    char name[64];
    for (int32_t k = 0; k < count; k++) {
        snprintf(name, sizeof name, "reference-lpt/%d", (int)k);
        if (!tu_selected(name)) continue;
        tu_rng g;
        tu_rng_seed(&g, tu_case_seed(name));
        int32_t B = tu_rng_int(&g, 1, MAX_B), shape = k % 3, N = tu_rng_int(&g, 1, 300);
        for (int32_t r = 0; r < B; r++) {
            int32_t q = 1, x = tu_rng_int(&g, 1, 4096);
            if (shape == 1) x = 2048 + 512 * (r % 2); /* two lengths: many equal costs */
            if (shape == 2 && r < B / 16) { q = 128; x = tu_rng_int(&g, 2048, 8192); }
            qo[r + 1] = qo[r] + q;
            kv[r] = x;
        }
        if (shape == 2) /* prefill requests first in the batch, then decodes */
            for (int32_t r = 0; r < B; r++) qo[r + 1] = qo[r] + (r < B / 16 ? 128 : 1);
        fi_schedule_input in = {.batch_size = B, .qo_indptr = qo, .kv_len = kv, .group_size = 4,
                                .num_kv_heads = 8, .causal = true, .window_left = -1,
                                .num_workers = N, .disable_split_kv = tu_rng_int(&g, 0, 3) == 0,
                                .policy = {.q_tiles = {16, 64, 128}, .num_q_tiles = 3,
                                           .cost_per_q_row = tu_rng_int(&g, 0, 1),
                                           .cost_per_key = 1,
                                           .cost_per_row_key = 0.1 * tu_rng_int(&g, 0, 1)}};
        fi_schedule_limits lim;
        fi_schedule_limits_for(&lim, B, qo[B], N);
        fi_schedule s;
        double ratio;
        int bad = fi_schedule_init(&s, &lim) || fi_schedule_build(&s, &in) ||
                  check_schedule(&s, &in, &ratio) ||
                  check_reference_lpt(&s, &in);
        if (bad) tu_note("B %d, N %d, shape %d", (int)B, (int)N, (int)shape);
        tu_record("LPT equals a plain reference", name, bad ? TU_FAIL : TU_PASS);
        fi_schedule_free(&s);
    }
}

/* Queues in request order (the CUDA backend's): the same workers hold the
 * same items as with longest-first queues, each queue in generation order
 * (request, tokens, keys). */
static int item_order(const void *x, const void *y) {
    const fi_work_item *a = x, *b = y;
    if (a->request != b->request) return a->request < b->request ? -1 : 1;
    if (a->q_start != b->q_start) return a->q_start < b->q_start ? -1 : 1;
    if (a->kv_start != b->kv_start) return a->kv_start < b->kv_start ? -1 : 1;
    return 0;
}

/* A random batch of B requests for the queue-order cases: one in `every` a
 * prefill of 2..max_len tokens, the rest decodes; 1..8192 keys each. */
static void random_queue_batch(tu_rng *g, int32_t B, int32_t every, int32_t max_len, int32_t *qo,
                               int32_t *kv) {
    for (int32_t r = 0; r < B; r++) {
        qo[r + 1] = qo[r] + (tu_rng_int(g, 0, every - 1) == 0 ? tu_rng_int(g, 2, max_len) : 1);
        kv[r] = tu_rng_int(g, 1, 8192);
    }
}

/* 0 when schedules a and b have as many items and workers (else a note) */
static int same_counts(const fi_schedule *a, const fi_schedule *b) {
    if (a->num_items == b->num_items && a->num_workers == b->num_workers) return 0;
    tu_note("%d / %d items, %d / %d workers", (int)a->num_items, (int)b->num_items,
            (int)a->num_workers, (int)b->num_workers);
    return 1;
}

static void case_request_order(int32_t count) {
    static int32_t qo[MAX_B + 1], kv[MAX_B];
    char name[64];
    for (int32_t k = 0; k < count; k++) {
        snprintf(name, sizeof name, "request-order/%d", (int)k);
        if (!tu_selected(name)) continue;
        tu_rng g;
        tu_rng_seed(&g, tu_case_seed(name));
        int32_t B = tu_rng_int(&g, 1, MAX_B), N = tu_rng_int(&g, 1, 300);
        random_queue_batch(&g, B, 4, 300, qo, kv);
        fi_schedule_input in = {.batch_size = B, .qo_indptr = qo, .kv_len = kv, .group_size = 4,
                                .num_kv_heads = 8, .causal = k % 2 == 0, .window_left = -1,
                                .num_workers = N, .policy = {.q_tiles = {16, 64, 128},
                                                             .num_q_tiles = 3, .cost_per_q_row = 1,
                                                             .cost_per_key = 1,
                                                             .cost_per_row_key = 0.007,
                                                             .split_workers = tu_rng_int(&g, 0, N)}};
        fi_schedule_limits lim;
        fi_schedule_limits_for(&lim, B, qo[B], N);
        fi_schedule a, b;
        int bad = fi_schedule_init(&a, &lim) || fi_schedule_init(&b, &lim) ||
                  fi_schedule_build(&a, &in);
        in.policy.queues_in_request_order = true;
        bad = bad || fi_schedule_build(&b, &in);
        bad = bad || same_counts(&a, &b);
        for (int32_t w = 0; !bad && w < a.num_workers; w++) {
            const int32_t i0 = a.worker_indptr[w], i1 = a.worker_indptr[w + 1];
            if (b.worker_indptr[w] != i0 || b.worker_indptr[w + 1] != i1 ||
                a.worker_cost[w] != b.worker_cost[w]) {
                tu_note("worker %d: a different range or cost", (int)w);
                bad = 1;
                break;
            }
            for (int32_t i = i0 + 1; i < i1 && !bad; i++)
                if (item_order(&b.items[i - 1], &b.items[i]) >= 0) {
                    tu_note("worker %d: item %d not after item %d in request order", (int)w, (int)i,
                            (int)i - 1);
                    bad = 1;
                }
            /* the same items: a's queue sorted equals b's */
            qsort(a.items + i0, (size_t)(i1 - i0), sizeof a.items[0], item_order);
            if (!bad && memcmp(a.items + i0, b.items + i0, (size_t)(i1 - i0) * sizeof a.items[0])) {
                tu_note("worker %d: other items than the longest-first queue's", (int)w);
                bad = 1;
            }
        }
        if (bad) tu_note("B %d, N %d", (int)B, (int)N);
        tu_record("queues in request order", name, bad ? TU_FAIL : TU_PASS);
        fi_schedule_free(&a);
        fi_schedule_free(&b);
    }
}

/* Wide items first (the CUDA backend's wide_first_rows): the same queues
 * as without, the workers holding an item of more packed rows than the
 * bound first (each group in id order, costs with their queues), and in
 * each queue those items first, both parts in their old order. */
static void case_wide_first(int32_t count) {
    static int32_t qo[MAX_B + 1], kv[MAX_B];
    char name[64];
    for (int32_t k = 0; k < count; k++) {
        snprintf(name, sizeof name, "wide-first/%d", (int)k);
        if (!tu_selected(name)) continue;
        tu_rng g;
        tu_rng_seed(&g, tu_case_seed(name));
        int32_t B = tu_rng_int(&g, 1, MAX_B), N = tu_rng_int(&g, 1, 300);
        random_queue_batch(&g, B, 8, 600, qo, kv);
        fi_schedule_input in = {.batch_size = B, .qo_indptr = qo, .kv_len = kv, .group_size = 4,
                                .num_kv_heads = 8, .causal = k % 2 == 0, .window_left = -1,
                                .num_workers = N, .policy = {.q_tiles = {16, 64, 128},
                                                             .num_q_tiles = 3, .cost_per_q_row = 1,
                                                             .cost_per_key = 1,
                                                             .cost_per_row_key = 0.007,
                                                             .cost_rows_exact = 16,
                                                             .cost_rows_block = 128,
                                                             .split_workers = tu_rng_int(&g, 0, N),
                                                             .queues_in_request_order = k % 3 != 0}};
        const int32_t wide_rows = 16;
        fi_schedule_limits lim;
        fi_schedule_limits_for(&lim, B, qo[B], N);
        fi_schedule a, b;
        int bad = fi_schedule_init(&a, &lim) || fi_schedule_init(&b, &lim) ||
                  fi_schedule_build(&a, &in);
        in.policy.wide_first_rows = wide_rows;
        bad = bad || fi_schedule_build(&b, &in);
        bad = bad || same_counts(&a, &b);
#define IS_WIDE(it) ((int64_t)((it).q_end - (it).q_start) * in.group_size > wide_rows)
        /* the expected slots: workers with a wide item, then the rest, in id order */
        int32_t *perm = malloc(sizeof(int32_t) * (size_t)N), *wide = calloc((size_t)N, sizeof(int32_t));
        int32_t first = 0;
        bad = bad || !perm || !wide;
        for (int32_t w = 0; !bad && w < N; w++) {
            for (int32_t i = a.worker_indptr[w]; i < a.worker_indptr[w + 1]; i++) wide[w] |= IS_WIDE(a.items[i]);
            first += wide[w];
        }
        for (int32_t w = 0, at = 0, rest = first; !bad && w < N; w++) perm[wide[w] ? at++ : rest++] = w;
        for (int32_t slot = 0; !bad && slot < N; slot++) {
            const int32_t w = perm[slot], i0 = a.worker_indptr[w], n = a.worker_indptr[w + 1] - i0;
            const int32_t j0 = b.worker_indptr[slot];
            if (b.worker_indptr[slot + 1] - j0 != n || b.worker_cost[slot] != a.worker_cost[w]) {
                tu_note("slot %d: not worker %d's queue (length or cost)", (int)slot, (int)w);
                bad = 1;
                break;
            }
            int32_t j = j0; /* a's queue, wide items first, each part in order */
            for (int pass = 0; pass < 2 && !bad; pass++)
                for (int32_t i = i0; i < i0 + n && !bad; i++) {
                    if (IS_WIDE(a.items[i]) != (pass == 0)) continue;
                    if (memcmp(&a.items[i], &b.items[j++], sizeof a.items[0])) {
                        tu_note("slot %d (worker %d): item %d out of place", (int)slot, (int)w,
                                (int)(j - 1 - j0));
                        bad = 1;
                    }
                }
        }
#undef IS_WIDE
        free(perm);
        free(wide);
        if (bad) tu_note("B %d, N %d", (int)B, (int)N);
        tu_record("wide items and their workers first", name, bad ? TU_FAIL : TU_PASS);
        fi_schedule_free(&a);
        fi_schedule_free(&b);
    }
}

/* ------------------------------------------------ through the public API */

enum { A_HQO = 8, A_HKV = 2, A_D = 64, A_MAXB = 16 };

/* A request's data is a function of its id, so the same request can be put
 * in different batches with the same bits. */
typedef struct areq {
    int32_t qo, kv, id;
} areq;

typedef struct abatch {
    int32_t B, total_q, total_kv;
    int32_t qo_indptr[A_MAXB + 1], kv_indptr[A_MAXB + 1];
    float *q, *k, *v, *o, *lse;
} abatch;

static void fill(float *p, int64_t n, uint64_t seed) {
    tu_rng g;
    tu_rng_seed(&g, seed);
    for (int64_t i = 0; i < n; i++) p[i] = (float)tu_rng_range(&g, -1.0, 1.0);
}

static int abatch_make(abatch *b, const areq *reqs, int32_t n) {
    memset(b, 0, sizeof *b);
    b->B = n;
    for (int32_t r = 0; r < n; r++) {
        b->qo_indptr[r + 1] = b->qo_indptr[r] + reqs[r].qo;
        b->kv_indptr[r + 1] = b->kv_indptr[r] + reqs[r].kv;
    }
    b->total_q = b->qo_indptr[n];
    b->total_kv = b->kv_indptr[n];
    size_t qn = (size_t)b->total_q * A_HQO * A_D, kn = (size_t)b->total_kv * A_HKV * A_D;
    b->q = malloc(qn * sizeof(float) + 4);
    b->o = malloc(qn * sizeof(float) + 4);
    b->k = malloc(kn * sizeof(float) + 4);
    b->v = malloc(kn * sizeof(float) + 4);
    b->lse = malloc((size_t)b->total_q * A_HQO * sizeof(float) + 4);
    if (!b->q || !b->o || !b->k || !b->v || !b->lse) return -1;
    for (int32_t r = 0; r < n; r++) {
        uint64_t s = 1000003u * (uint64_t)reqs[r].id;
        fill(b->q + (size_t)b->qo_indptr[r] * A_HQO * A_D, (int64_t)reqs[r].qo * A_HQO * A_D, s + 1);
        fill(b->k + (size_t)b->kv_indptr[r] * A_HKV * A_D, (int64_t)reqs[r].kv * A_HKV * A_D, s + 2);
        fill(b->v + (size_t)b->kv_indptr[r] * A_HKV * A_D, (int64_t)reqs[r].kv * A_HKV * A_D, s + 3);
    }
    return 0;
}

static void abatch_free(abatch *b) {
    free(b->q); free(b->k); free(b->v); free(b->o); free(b->lse);
}

static fi_batch abatch_view(const abatch *b) {
    fi_batch x = {b->B, b->qo_indptr, b->kv_indptr, NULL, NULL, NULL};
    return x;
}

static fi_run_args abatch_args(abatch *b) {
    fi_run_args a;
    memset(&a, 0, sizeof a);
    int64_t qs[3] = {b->total_q, A_HQO, A_D}, ks[3] = {b->total_kv, A_HKV, A_D};
    int64_t ls[2] = {b->total_q, A_HQO};
    a.q = fi_tensor_contiguous(b->q, FI_DTYPE_F32, 3, qs);
    a.k = fi_tensor_contiguous(b->k, FI_DTYPE_F32, 3, ks);
    a.v = fi_tensor_contiguous(b->v, FI_DTYPE_F32, 3, ks);
    a.o = fi_tensor_contiguous(b->o, FI_DTYPE_F32, 3, qs);
    a.lse = fi_tensor_contiguous(b->lse, FI_DTYPE_F32, 2, ls);
    return a;
}

static void api_params(fi_attention_params *p, bool causal, int32_t window) {
    fi_attention_params_init(p);
    p->num_qo_heads = A_HQO;
    p->num_kv_heads = A_HKV;
    p->head_dim_qk = p->head_dim_vo = A_D;
    p->kv_format = FI_KV_FORMAT_RAGGED;
    p->kv_layout = FI_KV_LAYOUT_NHD;
    p->q_dtype = p->kv_dtype = p->o_dtype = FI_DTYPE_F32;
    p->mask_mode = causal ? FI_MASK_CAUSAL : FI_MASK_NONE;
    p->window_left = window;
}

/* Plan and run one batch; O and LSE land in b->o, b->lse (poisoned first). */
static fi_status api_run(fi_context *ctx, const fi_attention_params *p, int32_t disable,
                         int32_t fixed, abatch *b, fi_plan_info *info) {
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    cfg.max_batch_size = A_MAXB;
    cfg.max_total_qo = 512;
    cfg.max_total_kv = 1 << 16;
    cfg.disable_split_kv = disable;
    cfg.fixed_split_size = fixed;
    fi_plan *plan = NULL;
    fi_batch batch = abatch_view(b);
    fi_run_args a = abatch_args(b);
    memset(b->o, 0xff, (size_t)b->total_q * A_HQO * A_D * sizeof(float));
    memset(b->lse, 0xff, (size_t)b->total_q * A_HQO * sizeof(float));
    fi_status st = fi_plan_create(ctx, p, &cfg, &plan);
    if (!st) st = fi_plan_update(plan, &batch);
    if (!st) st = fi_plan_run(plan, &a);
    if (!st && info) {
        memset(info, 0, sizeof *info);
        info->struct_size = sizeof *info;
        st = fi_plan_get_info(plan, info);
    }
    fi_plan_destroy(plan);
    return st;
}

static int against_oracle(const fi_attention_params *p, abatch *b) {
    int64_t n = (int64_t)b->total_q * A_HQO * A_D, nl = (int64_t)b->total_q * A_HQO;
    double *ro = malloc(sizeof(double) * (size_t)(n + 1)), *rl = malloc(sizeof(double) * (size_t)(nl + 1));
    double *go = malloc(sizeof(double) * (size_t)(n + 1)), *gl = malloc(sizeof(double) * (size_t)(nl + 1));
    fi_batch batch = abatch_view(b);
    fi_run_args a = abatch_args(b);
    int bad = !ro || !rl || !go || !gl || oracle_attention(p, &batch, &a.q, &a.k, &a.v, NULL, ro, rl);
    tu_cmp c1, c2;
    if (!bad) {
        for (int64_t i = 0; i < n; i++) go[i] = b->o[i];
        for (int64_t i = 0; i < nl; i++) gl[i] = b->lse[i];
        bad = tu_compare(go, ro, n, 2e-5, 2e-5, &c1) || tu_compare(gl, rl, nl, 2e-5, 2e-5, &c2);
        if (bad)
            tu_note("vs oracle: O worst %g (ref %g), LSE worst %g (ref %g)", c1.worst_got,
                    c1.worst_ref, c2.worst_got, c2.worst_ref);
    }
    free(ro); free(rl); free(go); free(gl);
    return bad;
}

static tu_result api_outcome(fi_status st, const char *what) {
    if (st == FI_STATUS_UNSUPPORTED || st == FI_STATUS_NOT_PLANNED) {
        tu_note("%s: %s: %s (backend not ready?)", what, fi_status_string(st), fi_last_error());
        return TU_SKIP;
    }
    if (st) tu_note("%s: %s: %s", what, fi_status_string(st), fi_last_error());
    return st ? TU_FAIL : TU_PASS;
}

/* Split, unsplit and fixed-split runs equal the oracle; split runs repeat
 * bit for bit. */
static void case_api_split(fi_context *ctx, bool causal, int32_t window) {
    char name[64];
    snprintf(name, sizeof name, "api/split/%s/w%d", causal ? "causal" : "full", (int)window);
    if (!tu_selected(name)) return;
    static const areq reqs[] = {{1, 9000, 1}, {37, 300, 2}, {1, 10, 3}, {0, 100, 4},
                                {1, 0, 5},   {3, 2500, 6}, {1, 700, 7}};
    fi_attention_params p;
    api_params(&p, causal, window);
    abatch b;
    size_t on = 0;
    float *o1 = NULL, *l1 = NULL;
    fi_plan_info info;
    int bad = abatch_make(&b, reqs, (int32_t)(sizeof reqs / sizeof reqs[0]));
    fi_status st = bad ? FI_STATUS_OUT_OF_MEMORY : api_run(ctx, &p, 0, 0, &b, &info);
    tu_result res = api_outcome(st, "split run");
    if (res == TU_PASS) {
        on = (size_t)b.total_q * A_HQO;
        o1 = malloc(on * A_D * sizeof(float));
        l1 = malloc(on * sizeof(float));
        memcpy(o1, b.o, on * A_D * sizeof(float));
        memcpy(l1, b.lse, on * sizeof(float));
        if (info.num_split_items == 0 && window < 0) {
            tu_note("nothing was split (kv_chunk %d, %d workers)", info.kv_chunk, info.num_workers);
            res = TU_FAIL;
        }
        if (against_oracle(&p, &b)) res = TU_FAIL;
        st = api_run(ctx, &p, 0, 0, &b, NULL);
        if (st || memcmp(o1, b.o, on * A_D * sizeof(float)) || memcmp(l1, b.lse, on * sizeof(float))) {
            tu_note("second split run differs (%s)", fi_status_string(st));
            res = TU_FAIL;
        }
        for (int32_t mode = 0; mode < 2 && res == TU_PASS; mode++) {
            st = api_run(ctx, &p, mode == 0, mode == 1 ? 128 : 0, &b, NULL);
            if (st || against_oracle(&p, &b)) {
                tu_note("%s run: %s", mode ? "fixed-split" : "unsplit", fi_last_error());
                res = TU_FAIL;
            }
        }
    }
    tu_record("api: split equals oracle, repeats bitwise", name, res);
    free(o1); free(l1);
    abatch_free(&b);
}

/* fixed_split_size: the probe request's O and LSE bits do not depend on the
 * other requests of its batch, nor on its place in it. */
static void case_api_invariance(fi_context *ctx) {
    const char *name = "api/fixed-split-invariance";
    if (!tu_selected(name)) return;
    static const areq ra[] = {{1, 4000, 100}, {20, 900, 2}, {1, 50, 3}};
    static const areq rb[] = {{1, 9000, 9}, {5, 3000, 8}, {1, 20, 7}, {1, 4000, 100}, {1, 6000, 6}};
    fi_attention_params p;
    api_params(&p, true, -1);
    abatch a, b;
    int bad = abatch_make(&a, ra, 3) | abatch_make(&b, rb, 5);
    fi_status st = bad ? FI_STATUS_OUT_OF_MEMORY : api_run(ctx, &p, 0, 512, &a, NULL);
    if (!st) st = api_run(ctx, &p, 0, 512, &b, NULL);
    tu_result res = api_outcome(st, "fixed-split run");
    size_t row = A_HQO * A_D, at = (size_t)b.qo_indptr[3]; /* the probe's token in b */
    if (res == TU_PASS && (memcmp(a.o, b.o + at * row, row * sizeof(float)) ||
                           memcmp(a.lse, b.lse + at * A_HQO, A_HQO * sizeof(float)))) {
        double worst = 0;
        for (size_t i = 0; i < row; i++) worst = fmax(worst, fabs(a.o[i] - b.o[at * row + i]));
        tu_note("the probe's output bits depend on the batch (max |diff| %g)", worst);
        res = TU_FAIL;
    }
    tu_record("api: fixed split batch-invariant bitwise", name, res);
    abatch_free(&a);
    abatch_free(&b);
}

/* The plan's split budget (fi_plan_split_rows): the prefill mix (docs/BENCHMARKS.md),
 * 4 requests of 128 causal queries over 4096 keys, 32/8 heads, planned for
 * 132 workers: its 16 wide tiles split, every tile in at least two chunks,
 * where the schedule limits alone (min(3 N, max_total_qo + N) rows) let 4
 * of them split; the budget is 2 N / H_kv tiles of the widest tile's
 * tokens. */
static void case_api_budget(fi_context *ctx) {
    const char *name = "api/split-budget";
    if (!tu_selected(name)) return;
    fi_attention_params p;
    fi_attention_params_init(&p);
    p.num_qo_heads = 32, p.num_kv_heads = 8, p.head_dim_qk = p.head_dim_vo = 128;
    p.kv_format = FI_KV_FORMAT_PAGED, p.page_size = 16;
    p.q_dtype = p.kv_dtype = p.o_dtype = FI_DTYPE_BF16;
    p.mask_mode = FI_MASK_CAUSAL;
    enum { B = 4, Q = 128, KV = 4096 };
    int32_t qo[B + 1], kv[B + 1], last[B], *idx = malloc(sizeof(int32_t) * B * KV / 16);
    for (int32_t r = 0; r <= B; r++) qo[r] = r * Q, kv[r] = r * KV / 16;
    for (int32_t r = 0; r < B; r++) last[r] = 16;
    for (int32_t i = 0; idx && i < B * KV / 16; i++) idx[i] = i;
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    cfg.max_batch_size = B, cfg.max_total_qo = B * Q, cfg.max_total_kv = B * KV / 16;
    cfg.num_workers = 132;
    fi_plan *plan = NULL;
    fi_batch fb = {B, qo, kv, idx, last, NULL};
    fi_status st = idx ? fi_plan_create(ctx, &p, &cfg, &plan) : FI_STATUS_OUT_OF_MEMORY;
    if (!st) st = fi_plan_update(plan, &fb);
    tu_result res = api_outcome(st, "plan");
    if (res == TU_PASS) {
        const fi_schedule *s = &plan->schedule;
        int32_t T = 128 / 4, tiles = B * Q / T, k = 2 * 132 / 8;
        int32_t want = k * (plan->ctx->backend->policy.q_tiles[plan->ctx->backend->policy.num_q_tiles - 1] / 4);
        int32_t *chunks = calloc((size_t)tiles, sizeof(int32_t));
        for (int32_t i = 0; chunks && i < s->num_items; i++) {
            const fi_work_item *it = &s->items[i];
            chunks[it->request * (Q / T) + it->q_start / T]++;
        }
        int32_t unsplit = 0;
        for (int32_t t = 0; chunks && t < tiles; t++) unsplit += chunks[t] < 2;
        if (!chunks || s->limits.max_partial_rows < want || unsplit > 0) {
            tu_note("max_partial_rows %d (want >= %d), %d of %d tiles not split (tile %d rows)",
                    (int)s->limits.max_partial_rows, (int)want, (int)unsplit, (int)tiles,
                    (int)s->q_tile_rows);
            res = TU_FAIL;
        }
        free(chunks);
    }
    tu_record("api: split budget", name, res);
    fi_plan_destroy(plan);
    free(idx);
}

/* fi_plan_get_worker_loads: per worker, the items, split items and cost of
 * the plan's schedule, which add up to fi_plan_get_info's figures; a short
 * capacity writes that many workers; NULL arrays, a negative capacity, an
 * unplanned plan. */
static void case_api_worker_loads(fi_context *ctx) {
    const char *name = "api/worker-loads";
    if (!tu_selected(name)) return;
    enum { W = 5, B = 6 };
    fi_attention_params p;
    api_params(&p, true, -1);
    p.kv_format = FI_KV_FORMAT_PAGED, p.page_size = 16;
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    cfg.max_batch_size = B, cfg.max_total_qo = 256, cfg.max_total_kv = 4096;
    cfg.num_workers = W;
    int32_t qo[B + 1] = {0, 1, 2, 66, 67, 68, 100}, kv[B + 1], last[B], idx[4096];
    static const int32_t pages[B] = {300, 2, 40, 1, 120, 9};
    kv[0] = 0;
    for (int32_t r = 0; r < B; r++) kv[r + 1] = kv[r] + pages[r], last[r] = 16 - r;
    for (int32_t i = 0; i < kv[B]; i++) idx[i] = i;
    fi_batch fb = {B, qo, kv, idx, last, NULL};
    fi_plan *plan = NULL;
    int32_t items[W + 1], split[W + 1], n = -1, bad = 0;
    double cost[W + 1];
    fi_status st = fi_plan_create(ctx, &p, &cfg, &plan);
    if (!st) {
        bad |= tu_expect_status(fi_plan_get_worker_loads(plan, W, items, split, cost, &n),
                                FI_STATUS_NOT_PLANNED, "no batch planned", "before an update");
        st = fi_plan_update(plan, &fb);
    }
    tu_result res = api_outcome(st, "plan");
    if (res == TU_PASS) {
        fi_plan_info info;
        fi_plan_info_init(&info);
        st = fi_plan_get_info(plan, &info);
        for (int32_t w = 0; w <= W; w++) items[w] = split[w] = -7, cost[w] = -7.0;
        if (!st) st = fi_plan_get_worker_loads(plan, W + 1, items, split, cost, &n);
        const fi_schedule *s = &plan->schedule;
        int32_t sum_items = 0, sum_split = 0;
        double sum_cost = 0, most = 0;
        for (int32_t w = 0; w < n && w < W; w++) {
            int32_t want_split = 0;
            for (int32_t i = s->worker_indptr[w]; i < s->worker_indptr[w + 1]; i++)
                want_split += s->items[i].partial_row >= 0;
            if (items[w] != s->worker_indptr[w + 1] - s->worker_indptr[w] ||
                split[w] != want_split || cost[w] != s->worker_cost[w]) {
                tu_note("worker %d: %d items, %d split, cost %g; the schedule: %d, %d, %g", (int)w,
                        (int)items[w], (int)split[w], cost[w],
                        (int)(s->worker_indptr[w + 1] - s->worker_indptr[w]), (int)want_split,
                        s->worker_cost[w]);
                bad = 1;
            }
            sum_items += items[w], sum_split += split[w], sum_cost += cost[w];
            most = cost[w] > most ? cost[w] : most;
        }
        if (st || n != W || n != info.num_workers || items[W] != -7 || split[W] != -7 ||
            sum_items != info.num_items || sum_split != info.num_split_items ||
            most != info.max_worker_cost || fabs(sum_cost - info.total_cost) > 1e-9 * info.total_cost) {
            tu_note("%s: %d workers (info %d), items %d (%d), split %d (%d), max cost %g (%g), "
                    "total %g (%g)", fi_status_string(st), (int)n, (int)info.num_workers,
                    (int)sum_items, (int)info.num_items, (int)sum_split,
                    (int)info.num_split_items, most, info.max_worker_cost, sum_cost,
                    info.total_cost);
            bad = 1;
        }
        if (info.num_split_items == 0) tu_note("nothing was split: a weak case"), bad = 1;
        /* capacity 2: workers 0 and 1 only; NULL arrays; bad arguments */
        for (int32_t w = 0; w <= W; w++) items[w] = -7;
        bad |= tu_expect_status(fi_plan_get_worker_loads(plan, 2, items, NULL, NULL, NULL), FI_OK,
                                NULL, "capacity 2");
        if (items[0] < 0 || items[1] < 0 || items[2] != -7) tu_note("capacity 2 wrote past 2"), bad = 1;
        bad |= tu_expect_status(fi_plan_get_worker_loads(plan, 0, NULL, NULL, NULL, &n), FI_OK,
                                NULL, "count only");
        bad |= n != W;
        bad |= tu_expect_status(fi_plan_get_worker_loads(plan, -3, items, NULL, NULL, NULL),
                                FI_STATUS_INVALID_ARGUMENT, "-3", "negative capacity");
        bad |= tu_expect_status(fi_plan_get_worker_loads(NULL, W, items, NULL, NULL, NULL),
                                FI_STATUS_INVALID_ARGUMENT, "plan", "NULL plan");
        if (bad) res = TU_FAIL;
    } else if (bad) {
        res = TU_FAIL;
    }
    tu_record("api: worker loads", name, res);
    fi_plan_destroy(plan);
}

static void api_cases(void) {
    fi_context_options opt;
    fi_context_options_init(&opt);
    opt.num_threads = 2;
    fi_context *ctx = NULL;
    if (fi_context_create(&opt, &ctx)) {
        tu_note("fi_context_create: %s", fi_last_error());
        tu_record("api", "api/context", TU_FAIL);
        return;
    }
    case_api_split(ctx, true, -1);
    case_api_split(ctx, false, -1);
    case_api_split(ctx, true, 700);
    case_api_invariance(ctx);
    case_api_budget(ctx);
    case_api_worker_loads(ctx);
    fi_context_destroy(ctx);
}

int main(int argc, char **argv) {
    if (tu_parse_args(argc, argv, "the scheduler: properties of random schedules, and "
                                  "split runs through the public API"))
        return 2;
    int32_t n = tu_opt.quick ? 300 : 4000;
    case_properties(n, tu_opt.has_seed ? tu_opt.seed : 0);
    case_lpt_optimum(n / 2);
    case_fixed_split_invariance(n / 4);
    case_bounds();
    case_decode_budget(n / 10);
    case_max_chunks(n / 10);
    case_weighted_chunks(n / 20);
    case_equal_pieces(n / 20);
    case_reference_lpt(n / 20);
    case_request_order(n / 20);
    case_wide_first(n / 20);
    api_cases();
    return tu_summary("test_schedule");
}
