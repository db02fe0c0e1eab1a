/*
 * schedule.c — the inspector: tiles a batch, splits long KV spans, assigns
 * work items to workers longest-first (LPT) and emits the reduction map.
 * Everything it writes lives in arrays sized once by fi_schedule_init; the
 * build allocates nothing. docs/SCHEDULER.md explains the algorithm.
 *
 * Shape of the result (see fi_schedule in internal.h):
 *   items[worker_indptr[w] .. worker_indptr[w+1])  worker w's queue
 *   an item = (request, tokens [q_start, q_end), keys [kv_start, kv_end))
 *   partial_row = -1: write-through; else rows partial_row + (t - q_start)
 *   merge row r: O row merge_out_row[r] = merge of partial rows
 *                merge_src[merge_indptr[r] .. merge_indptr[r+1]), key order
 *
 * An item with kv_start == kv_end covers tokens that see no key at all
 * (causal with qo_len > kv_len, empty requests with queries); it is a
 * write-through item, so the executor writes those rows (O = 0, LSE = -inf)
 * and every output row is written exactly once: by one write-through item
 * or by one merge row.
 *
 * Bounds (why fi_schedule_limits_for's figures always suffice):
 *  - tiles: a tile holds >= 1 token of one request, so tiles <= total_qo.
 *  - auto split: with S the sum of the tiles' spans weighted by key_weight
 *    (1 for one-token tiles) and L >= S / N the chunk bound, a tile of span
 *    s and weight w has chunks of L_t >= L / w keys, so it becomes
 *    k = ceil(s / L_t) chunks and k - 1 < s w / L; summed, extra chunks
 *    < S / L <= N. So items <= total_qo + N - 1. Tiles with s > L_t (so
 *    s w > L) number fewer than N too.
 *  - partial rows (auto): a split tile of t tokens in k chunks uses k * t
 *    rows. With t = 1 (decode) a split tile has k <= 2 (k - 1), so rows
 *    < 2 N, and rows <= (split tiles) + N - 1 <= total_qo + N - 1. Wider
 *    tiles could need up to ~N * t rows, so the scheduler treats
 *    max_partial_rows as a budget: when the chunk bound L would need more,
 *    it takes the smallest longer L (a multiple of 16) that fits. Rows are
 *    non-increasing in L and zero at L = the longest span, so one exists.
 *  - fixed split (F keys, aligned at key 0): a span touches at most
 *    ceil(kv_len / F) aligned blocks; nothing can be adapted, so a batch
 *    over the limits gets FI_STATUS_BOUND_EXCEEDED naming the bound.
 */
#include "core/checked.h"
#include "core/schedule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- limits */

void fi_schedule_limits_for(fi_schedule_limits *lim, int32_t max_batch_size,
                            int32_t max_total_qo, int32_t num_workers) {
    int64_t n = num_workers > 0 ? num_workers : 1;
    int64_t q = max_total_qo > 0 ? max_total_qo : 0;
    int64_t items = q + n, rows = 3 * n < q + n ? 3 * n : q + n;
    memset(lim, 0, sizeof *lim);
    lim->max_batch_size = max_batch_size;
    lim->max_total_qo = max_total_qo;
    lim->max_workers = (int32_t)n;
    lim->max_items = (int32_t)(items < INT32_MAX / 2 ? items : INT32_MAX / 2);
    lim->max_partial_rows = (int32_t)(rows < INT32_MAX / 2 ? rows : INT32_MAX / 2);
}

void fi_schedule_limits_for_fixed_split(fi_schedule_limits *lim,
                                        int32_t max_batch_size,
                                        int32_t max_total_qo, int64_t max_kv_len,
                                        int32_t num_workers,
                                        int32_t fixed_split_size) {
    fi_schedule_limits_for(lim, max_batch_size, max_total_qo, num_workers);
    if (fixed_split_size <= 0) return;
    int64_t blocks = max_kv_len / fixed_split_size + (max_kv_len % fixed_split_size != 0);
    int64_t worst;
    if (!fi_mul_i64(max_total_qo > 0 ? max_total_qo : 0, blocks > 1 ? blocks : 1, &worst) ||
        worst > INT32_MAX / 2)
        worst = INT32_MAX / 2;
    if (worst > lim->max_items) lim->max_items = (int32_t)worst;
    if (worst > lim->max_partial_rows) lim->max_partial_rows = (int32_t)worst;
}

/* ------------------------------------------------------------- memory */

/* Bits per counting pass of the longest-first sort (at most). */
#define FI_SORT_DIGIT_MAX 11
/* Up to this many items, one counting pass of ~n buckets (fewer passes
 * beat finer keys there). */
#define FI_SORT_ONE_PASS 1024

/* The scheduler's working memory; lives inside the one allocation. */
typedef struct scratch {
    fi_work_item *gen; /* [max_items] items in generation order */
    double *cost;      /* [max_items] */
    uint32_t *key;     /* [max_items] radix keys: the top 32 bits of ~cost */
    int32_t *order;    /* [max_items] item indices, longest first */
    int32_t *tmp;      /* [max_items] radix ping-pong */
    int32_t *worker;   /* [max_items] worker of the i-th item of order[] */
    int32_t *next;     /* [max_workers] LPT buckets: next worker in the list */
    uint32_t *hist;    /* [2 << FI_SORT_DIGIT_MAX] at most: counting passes */
    int32_t leaves;    /* power of two >= max_workers */
    int32_t *tree;     /* [2 * leaves] tournament tree: winners' worker ids */
    uint64_t *val;     /* [2 * leaves] winners' loads (bits of doubles >= 0,
                        * which order as integers); leaf P + w is worker w */
    int32_t *cursor;   /* [max_workers] emission cursors */
    int32_t *cand_len; /* [max_workers] tiles longer than the chunk bound */
    int32_t *cand_tok; /* [max_workers] their token counts */
    int32_t *mark;     /* [max_workers] LPT: the last round that fed worker w */
    void *mem;         /* the allocation, for free() */
} scratch;

/* Bits per counting pass of the longest-first sort of n items: 8 .. 11,
 * about log2(n) / 2 + 4, so its two passes key on 256 .. 4096 values per item
 * while the buckets stay few beside n. */
static int sort_digit_bits(int64_t n) {
    int d = 8;
    while (d < FI_SORT_DIGIT_MAX && ((int64_t)1 << (2 * d - 8)) < n) d++;
    return d;
}

typedef struct layout {
    size_t items, indptr, wcost, mout, mindptr, msrc;
    size_t sc, gen, cost, key, order, tmp, worker, next, hist, tree, val, cursor, cand_len,
        cand_tok, mark;
    int32_t leaves;
    size_t total;
    bool overflow;         /* the total does not fit in size_t */
} layout;

/* The offset of n elements of `size` bytes, 64-byte aligned, after `sum`. */
static size_t take(fi_size_sum *sum, size_t n, size_t size) {
    fi_size_sum_add(sum, 0, 1, 64);
    size_t off = sum->bytes;
    fi_size_sum_add(sum, n, size, 1);
    return off;
}

static void make_layout(const fi_schedule_limits *l, layout *o) {
    fi_size_sum at = {0, false};
    size_t ni = (size_t)l->max_items, nw = (size_t)l->max_workers;
    size_t nq = (size_t)l->max_total_qo, np = (size_t)l->max_partial_rows;
    o->items = take(&at, ni, sizeof(fi_work_item));
    o->indptr = take(&at, nw + 1, sizeof(int32_t));
    o->wcost = take(&at, nw, sizeof(double));
    o->mout = take(&at, nq, sizeof(int32_t));
    o->mindptr = take(&at, nq + 1, sizeof(int32_t));
    o->msrc = take(&at, np, sizeof(int32_t));
    o->sc = take(&at, 1, sizeof(scratch));
    o->gen = take(&at, ni, sizeof(fi_work_item));
    o->cost = take(&at, ni, sizeof(double));
    o->key = take(&at, ni, sizeof(uint32_t));
    o->order = take(&at, ni, sizeof(int32_t));
    o->tmp = take(&at, ni, sizeof(int32_t));
    o->worker = take(&at, ni, sizeof(int32_t));
    o->next = take(&at, nw, sizeof(int32_t));
    int d = sort_digit_bits(l->max_items);
    o->hist = take(&at, (size_t)2 << (d > 9 ? d : 9), sizeof(uint32_t));
    o->leaves = 1;
    while (o->leaves < l->max_workers) o->leaves *= 2;
    o->tree = take(&at, 2 * (size_t)o->leaves, sizeof(int32_t));
    o->val = take(&at, 2 * (size_t)o->leaves, sizeof(uint64_t));
    o->cursor = take(&at, nw, sizeof(int32_t));
    o->cand_len = take(&at, nw, sizeof(int32_t));
    o->cand_tok = take(&at, nw, sizeof(int32_t));
    o->mark = take(&at, nw, sizeof(int32_t));
    fi_size_sum_add(&at, 64, 1, 1); /* malloc's alignment may be 16: room to align to 64 */
    o->total = at.bytes;
    o->overflow = at.overflow;
}

size_t fi_schedule_bytes(const fi_schedule_limits *limits) {
    layout o;
    make_layout(limits, &o);
    return o.overflow ? SIZE_MAX : o.total;
}

fi_status fi_schedule_init(fi_schedule *s, const fi_schedule_limits *limits) {
    memset(s, 0, sizeof *s);
    const fi_schedule_limits *l = limits;
    if (l->max_batch_size < 0 || l->max_total_qo < 0 || l->max_workers < 1 ||
        l->max_items < 0 || l->max_partial_rows < 0)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "schedule limits: batch %d, total_qo %d, workers %d, items %d, "
                        "partial rows %d: need workers >= 1 and the rest >= 0",
                        (int)l->max_batch_size, (int)l->max_total_qo, (int)l->max_workers,
                        (int)l->max_items, (int)l->max_partial_rows);
    layout o;
    make_layout(l, &o);
    if (o.overflow)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "schedule limits: %d work items, %d query tokens, %d partial rows, %d "
                        "workers overflow the address range", (int)l->max_items,
                        (int)l->max_total_qo, (int)l->max_partial_rows, (int)l->max_workers);
    char *mem = calloc(1, o.total);
    if (!mem)
        return fi_error(FI_STATUS_OUT_OF_MEMORY, "schedule: out of memory (%zu bytes)",
                        o.total);
    char *base = (char *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    s->limits = *l;
    s->items = (fi_work_item *)(base + o.items);
    s->worker_indptr = (int32_t *)(base + o.indptr);
    s->worker_cost = (double *)(base + o.wcost);
    s->merge_out_row = (int32_t *)(base + o.mout);
    s->merge_indptr = (int32_t *)(base + o.mindptr);
    s->merge_src = (int32_t *)(base + o.msrc);
    scratch *sc = (scratch *)(base + o.sc);
    sc->gen = (fi_work_item *)(base + o.gen);
    sc->cost = (double *)(base + o.cost);
    sc->key = (uint32_t *)(base + o.key);
    sc->order = (int32_t *)(base + o.order);
    sc->tmp = (int32_t *)(base + o.tmp);
    sc->worker = (int32_t *)(base + o.worker);
    sc->next = (int32_t *)(base + o.next);
    sc->hist = (uint32_t *)(base + o.hist);
    sc->leaves = o.leaves;
    sc->tree = (int32_t *)(base + o.tree);
    sc->val = (uint64_t *)(base + o.val);
    sc->cursor = (int32_t *)(base + o.cursor);
    sc->cand_len = (int32_t *)(base + o.cand_len);
    sc->cand_tok = (int32_t *)(base + o.cand_tok);
    sc->mark = (int32_t *)(base + o.mark);
    sc->mem = mem;
    s->scratch = sc;
    s->num_workers = 1;
    return FI_OK;
}

void fi_schedule_free(fi_schedule *s) {
    if (!s) return;
    if (s->scratch) free(((scratch *)s->scratch)->mem);
    memset(s, 0, sizeof *s);
}

/* ------------------------------------------------------------- tiles */

/* Keys visible to tokens [q0, q1) of a request whose qo query tokens are the
 * last qo of its kv keys' positions: [*a, *b), possibly empty. Causal: token
 * q sees keys < kv - qo + q + 1; a window sees keys >= kv - qo + q - w. */
static inline void span_of(bool causal, int32_t window, int32_t qo, int32_t kv, int32_t q0,
                           int32_t q1, int32_t *a, int32_t *b) {
    int64_t off = (int64_t)kv - qo, lo = 0, hi = kv;
    if (causal) hi = off + q1;
    if (window >= 0) lo = off + q0 - window;
    if (hi > kv) hi = kv;
    if (hi < 0) hi = 0;
    if (lo < 0) lo = 0;
    if (lo > hi) lo = hi;
    *a = (int32_t)lo;
    *b = (int32_t)hi;
}

static inline void tile_span(const fi_schedule_input *in, int32_t qo, int32_t kv,
                             int32_t q0, int32_t q1, int32_t *a, int32_t *b) {
    span_of(in->causal, in->window_left, qo, kv, q0, q1, a, b);
}

/* Items that run at once, for automatic split-KV: split_workers where it is
 * set and below the workers (a GPU: resident CTAs / H_kv), else the workers. */
static inline int32_t split_slots(const fi_schedule_input *in) {
    const int32_t sw = in->policy.split_workers;
    return sw > 0 && sw < in->num_workers ? sw : in->num_workers;
}

/* A span of len > L keys cut into chunks of L keys from its start, the
 * remainder last. (Near-equal pieces would look tidier but balance worse:
 * L is the ideal load per worker, S / N, so a full chunk fills a worker and
 * the remainders are the small items LPT fills the gaps with.) Except,
 * with `equal`, when the remainder is at least L / 2: the span becomes k
 * near-equal pieces (aligned). `equal` is set when fewer items run at once
 * than there are workers (split_workers < num_workers: a GPU, where each
 * item runs as H_kv CTAs and the workers outnumber the resident slots four
 * to one), so no worker packs a remainder beside a full chunk, and the
 * span's longest chunk is what the batch waits for (measured faster on a
 * GPU; on a CPU's workers the same pieces balance worse, hence only with
 * `equal`: docs/SCHEDULER.md). And a sliver, a remainder shorter than
 * FI_SCHEDULE_MIN_CHUNK and at most L / 8, is spread over the other chunks
 * (pieces of up to L + L / 8, aligned): on a GPU it is a CTA of its own
 * that pays an item's whole fixed cost (its pipeline's fill, its partial
 * row, a merge source) for a few keys, after the full chunks took every
 * resident slot (measured faster; spreading longer remainders cost time,
 * hence the bounds: docs/SCHEDULER.md). */
static inline int32_t auto_chunks(int32_t len, int32_t L, bool equal, int32_t *piece) {
    int32_t k = (int32_t)(((int64_t)len + L - 1) / L);
    const int64_t rem = (int64_t)len - (int64_t)(k - 1) * L;
    *piece = L;
    int32_t pieces = 0; /* cut into this many near-equal pieces instead */
    if (k > 1 && rem < FI_SCHEDULE_MIN_CHUNK && 8 * rem <= L) pieces = k - 1; /* a sliver */
    else if (equal && k > 1 && 2 * rem >= L) pieces = k;
    if (pieces > 0) {
        const int64_t al = FI_SCHEDULE_CHUNK_ALIGN;
        int64_t p = ((int64_t)len + pieces - 1) / pieces;
        p = (p + al - 1) / al * al;
        *piece = (int32_t)p;
        k = (int32_t)(((int64_t)len + p - 1) / p);
    }
    return k;
}

/* Aligned blocks of F keys that [a, b) touches (1 for an empty span). */
static inline int32_t fixed_chunks(int32_t a, int32_t b, int32_t F) {
    if (b <= a) return 1;
    return (int32_t)(((int64_t)b + F - 1) / F - a / F);
}

static inline uint64_t dbits(double x) {
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}
static inline double bitsd(uint64_t b) {
    double x;
    memcpy(&x, &b, sizeof x);
    return x;
}

typedef struct gen_state {
    fi_schedule *s;
    scratch *sc;
    int32_t n;        /* items so far */
    double row_cost;  /* cost of one token's packed rows, all KV heads */
    double key_cost;  /* cost of one key, all KV heads */
    double pair_cost; /* cost of one (packed row, key) pair, all KV heads */
    int32_t group, rows_exact, rows_block; /* pair_rows' */
    bool equal_pieces; /* auto_chunks' `equal` */
    /* Facts for the sort, as bits of the costs (doubles >= 0 order as their
     * bits): the last cost, whether no cost so far exceeded its
     * predecessor, the smallest nonzero cost minus 1 and the largest. */
    uint64_t last, nz_min1, max;
    bool desc;
} gen_state;

/* Packed rows of a t-token item as the cost model's pair term counts them:
 * above rows_exact, whole blocks of rows_block (a tensor-core block
 * computes all its rows). */
static inline double pair_rows(int32_t t, int32_t group, int32_t exact, int32_t block) {
    int64_t rows = (int64_t)t * group;
    if (block > 0 && rows > exact) rows = (rows + block - 1) / block * block;
    return (double)rows;
}

static inline double item_cost(const gen_state *g, int32_t t, int32_t keys) {
    return g->row_cost * t + g->key_cost * keys +
           g->pair_cost * pair_rows(t, g->group, g->rows_exact, g->rows_block) * (double)keys;
}

/* A key's cost in an item of `rows` pair rows (key and pair terms). */
static inline double key_cost_at(double key_cost, double pair_cost, double rows) {
    return key_cost + pair_cost * rows;
}

static inline void gen_reset(gen_state *g) {
    g->n = 0;
    g->last = UINT64_MAX;
    g->nz_min1 = UINT64_MAX;
    g->max = 0;
    g->desc = true;
}

static inline void emit(gen_state *g, int32_t r, int32_t q0, int32_t q1, int32_t a,
                        int32_t b, int32_t partial_row) {
    fi_work_item *it = &g->sc->gen[g->n];
    it->request = r;
    it->q_start = q0;
    it->q_end = q1;
    it->kv_start = a;
    it->kv_end = b;
    it->partial_row = partial_row;
    double c = item_cost(g, q1 - q0, b - a);
    g->sc->cost[g->n++] = c;
    uint64_t k = dbits(c);
    g->desc &= k <= g->last;
    g->last = k;
    g->nz_min1 = k - 1 < g->nz_min1 ? k - 1 : g->nz_min1; /* 0 - 1 wraps: ignored */
    g->max = k > g->max ? k : g->max;
}

/* A key of a tile of t tokens costs key_weight(t) >= 1 keys of a one-token
 * tile (the cost model's key and pair terms). Automatic split-KV measures
 * spans in one-token keys: a chunk bound L is L keys for a one-token tile
 * and about L / key_weight(t) for a tile of t tokens, so that a wide tile's
 * chunk costs what a decode's full chunk does (on a GPU a 128-row block's
 * key costs more than a decode's). Batches whose tiles are all alike get
 * the plain bound. */
static inline double key_weight(const gen_state *g, int32_t t) {
    double one = key_cost_at(g->key_cost, g->pair_cost,
                             pair_rows(1, g->group, g->rows_exact, g->rows_block));
    if (t <= 1 || one <= 0) return 1.0;
    return key_cost_at(g->key_cost, g->pair_cost,
                       pair_rows(t, g->group, g->rows_exact, g->rows_block)) / one;
}

/* The chunk bound of a t-token tile under the one-token bound L (aligned,
 * at least FI_SCHEDULE_MIN_CHUNK, at most L). */
static inline int32_t tile_chunk(const gen_state *g, int32_t L, int32_t t) {
    if (t <= 1 || L <= 0) return L;
    const int64_t al = FI_SCHEDULE_CHUNK_ALIGN;
    int64_t c = (int64_t)ceil((double)L / key_weight(g, t));
    c = (c + al - 1) / al * al;
    if (c < FI_SCHEDULE_MIN_CHUNK) c = FI_SCHEDULE_MIN_CHUNK;
    return (int32_t)(c < L ? c : L);
}

/* Per-batch facts gathered in one pass over the tiles. */
typedef struct survey {
    int64_t tiles, span_sum;
    int32_t max_span;
    double wspan_sum, max_wspan;     /* spans x key_weight (automatic split) */
    int64_t fixed_items, fixed_rows; /* fixed split only */
} survey;

/* Fixed split: the tiles, their span and the items and rows they need. */
static void survey_fixed(const fi_schedule_input *in, int32_t T, int32_t F, survey *sv) {
    memset(sv, 0, sizeof *sv);
    for (int32_t r = 0; r < in->batch_size; r++) {
        int32_t qo = in->qo_indptr[r + 1] - in->qo_indptr[r], kv = in->kv_len[r];
        for (int32_t q0 = 0; q0 < qo; q0 += T) {
            int32_t q1 = qo - q0 > T ? q0 + T : qo, a, b;
            tile_span(in, qo, kv, q0, q1, &a, &b);
            sv->tiles++;
            sv->span_sum += b - a;
            if (b - a > sv->max_span) sv->max_span = b - a;
            int32_t k = fixed_chunks(a, b, F);
            sv->fixed_items += k;
            if (k > 1) sv->fixed_rows += (int64_t)k * (q1 - q0);
        }
    }
}

/* Automatic split or none: the tiles and their spans, and every tile emitted
 * as a write-through item (the final items when nothing needs splitting),
 * at most cap of them. All the state lives in locals, which the stores of
 * the items cannot alias. The sort's facts about the costs are taken in a
 * second pass: in this one their four chains ran out of registers and went
 * through the stack (two passes measured slightly faster: docs/SCHEDULER.md). */
static void survey_batch(const fi_schedule_input *in, int32_t T, survey *sv, gen_state *g,
                         int32_t cap) {
    fi_work_item *gen = g->sc->gen;
    double *cost = g->sc->cost;
    const double rc = g->row_cost, kc = g->key_cost, pc = g->pair_cost;
    const int32_t grp = g->group, rexact = g->rows_exact, rblock = g->rows_block;
    const double pr1 = pair_rows(1, grp, rexact, rblock), wone = key_cost_at(kc, pc, pr1);
    const int32_t *qo_indptr = in->qo_indptr, *kv_len = in->kv_len;
    int32_t n = g->n, max_span = 0, B = in->batch_size, window = in->window_left;
    const bool causal = in->causal;
    int64_t tiles = 0, span_sum = 0;
    double wspan_sum = 0, max_wspan = 0;
    const int32_t n0 = n;
#define SURVEY_TILE(Q0, Q1)                                                                  \
    do {                                                                                     \
        int32_t q0_ = (Q0), q1_ = (Q1), a, b;                                                \
        span_of(causal, window, qo, kv, q0_, q1_, &a, &b);                                   \
        tiles++;                                                                             \
        span_sum += b - a;                                                                   \
        max_span = b - a > max_span ? b - a : max_span;                                      \
        const bool one_ = q1_ - q0_ == 1;                                                    \
        double pr_ = one_ ? pr1 : pair_rows(q1_ - q0_, grp, rexact, rblock);                 \
        double ws_ = !one_ && wone > 0 ? (double)(b - a) * key_cost_at(kc, pc, pr_) / wone   \
                                       : (double)(b - a); /* (b - a) x key_weight */         \
        wspan_sum += ws_;                                                                    \
        max_wspan = ws_ > max_wspan ? ws_ : max_wspan;                                       \
        if (n >= cap) break;                                                                 \
        fi_work_item *it = &gen[n];                                                          \
        it->request = r;                                                                     \
        it->q_start = q0_;                                                                   \
        it->q_end = q1_;                                                                     \
        it->kv_start = a;                                                                    \
        it->kv_end = b;                                                                      \
        it->partial_row = -1;                                                                \
        cost[n++] = rc * (q1_ - q0_) + kc * (b - a) + pc * pr_ * (double)(b - a);            \
    } while (0)
    for (int32_t r = 0; r < B; r++) {
        int32_t qo = qo_indptr[r + 1] - qo_indptr[r], kv = kv_len[r];
        if (qo == 1) { /* decode: one tile, made simpler by the constants */
            SURVEY_TILE(0, 1);
            continue;
        }
        for (int32_t q0 = 0; q0 < qo; q0 += T) SURVEY_TILE(q0, qo - q0 > T ? q0 + T : qo);
    }
#undef SURVEY_TILE
    uint64_t last = g->last, nz_min1 = g->nz_min1, max = g->max;
    bool desc = g->desc;
    for (int32_t i = n0; i < n; i++) {
        uint64_t k = dbits(cost[i]);
        desc &= k <= last;
        last = k;
        nz_min1 = k - 1 < nz_min1 ? k - 1 : nz_min1; /* 0 - 1 wraps: ignored */
        max = k > max ? k : max;
    }
    memset(sv, 0, sizeof *sv);
    sv->tiles = tiles;
    sv->span_sum = span_sum;
    sv->max_span = max_span;
    sv->wspan_sum = wspan_sum;
    sv->max_wspan = max_wspan;
    g->n = n;
    g->last = last;
    g->nz_min1 = nz_min1;
    g->max = max;
    g->desc = desc;
}

/* The tiles whose span exceeds their chunk bound under L0, as (span,
 * tokens); fewer than N exist because L0 >= sum of weighted spans / N.
 * Returns how many (capped at cap). */
static int32_t collect_long(const fi_schedule_input *in, int32_t T, int32_t L0,
                            const gen_state *g, int32_t cap) {
    scratch *sc = g->sc;
    int32_t n = 0;
    for (int32_t r = 0; r < in->batch_size; r++) {
        int32_t qo = in->qo_indptr[r + 1] - in->qo_indptr[r], kv = in->kv_len[r];
        if (kv <= tile_chunk(g, L0, qo < T ? qo : T)) continue; /* its tiles' least bound */
        for (int32_t q0 = 0; q0 < qo; q0 += T) {
            int32_t q1 = qo - q0 > T ? q0 + T : qo, a, b;
            tile_span(in, qo, kv, q0, q1, &a, &b);
            if (b - a > tile_chunk(g, L0, q1 - q0) && n < cap) {
                sc->cand_len[n] = b - a;
                sc->cand_tok[n++] = q1 - q0;
            }
        }
    }
    return n;
}

/* Partial rows and extra items the long tiles need with chunk bound L. */
static int64_t split_rows(const gen_state *g, int32_t n, int32_t L, int64_t *extra) {
    const scratch *sc = g->sc;
    int64_t rows = 0, more = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t Lt = tile_chunk(g, L, sc->cand_tok[i]);
        if (sc->cand_len[i] <= Lt) continue;
        int32_t piece, k = auto_chunks(sc->cand_len[i], Lt, g->equal_pieces, &piece);
        if (k == 1) continue; /* one chunk and a sliver: left whole */
        rows += (int64_t)k * sc->cand_tok[i];
        more += k - 1;
    }
    if (extra) *extra = more;
    return rows;
}

/* The chunk bound of automatic split-KV: ceil(S / N) one-token keys, S the
 * spans weighted by key_weight (at least fi_schedule_min_chunk, aligned),
 * lengthened until the partial rows fit the budget. Returns 0 when nothing
 * is split; *extra = items added by splits. */
static int32_t choose_chunk(const fi_schedule_input *in, int32_t T, const survey *sv,
                            const gen_state *g, int32_t budget, int32_t cap, int64_t *extra) {
    const int64_t al = FI_SCHEDULE_CHUNK_ALIGN;
    int64_t N = split_slots(in);
    int64_t L0 = sv->wspan_sum == (double)sv->span_sum /* exact for alike tiles */
                     ? (sv->span_sum + N - 1) / N
                     : (int64_t)ceil(sv->wspan_sum / (double)N);
    const int64_t least = fi_schedule_min_chunk(sv->wspan_sum, N);
    if (L0 < least) L0 = least;
    const int32_t most = in->policy.split_max_chunks;
    if (most > 0 && L0 < (int64_t)ceil(sv->max_wspan / most)) L0 = (int64_t)ceil(sv->max_wspan / most);
    L0 = (L0 + al - 1) / al * al;
    *extra = 0;
    if (sv->max_wspan <= (double)L0 || L0 > INT32_MAX / 2) return 0;
    int32_t n = collect_long(in, T, (int32_t)L0, g, cap);
    if (split_rows(g, n, (int32_t)L0, extra) <= budget) return *extra > 0 ? (int32_t)L0 : 0;
    /* rows(L) is non-increasing and 0 once every tile's bound reaches its
     * span (L >= the largest weighted span): bisect on L / al */
    int64_t lo = L0 / al, hi = ((int64_t)ceil(sv->max_wspan) + al - 1) / al;
    if (hi > INT32_MAX / 2 / al) hi = INT32_MAX / 2 / al;
    while (lo + 1 < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (split_rows(g, n, (int32_t)(mid * al), NULL) <= budget) hi = mid;
        else lo = mid;
    }
    int32_t L = (int32_t)(hi * al);
    split_rows(g, n, L, extra);
    return *extra > 0 ? L : 0;
}

/* ------------------------------------------------------------- items */

/* Tokens [q0, q1) of request r were cut into k chunks whose partial rows
 * start at `base`, chunk c at base + c * t: one merge row per token. */
static void merge_rows(fi_schedule *s, int32_t out0, int32_t t, int32_t k, int32_t base) {
    for (int32_t u = 0; u < t; u++) {
        int32_t m = s->num_merge_rows++, at = s->merge_indptr[m];
        s->merge_out_row[m] = out0 + u;
        for (int32_t c = 0; c < k; c++) s->merge_src[at + c] = base + c * t + u;
        s->merge_indptr[m + 1] = at + k;
    }
}

/* One tile: write-through, or k chunks (auto: near-equal pieces of at most L
 * keys; fixed: the aligned blocks of F keys) with partial rows and merges. */
static void emit_tile(gen_state *g, const fi_schedule_input *in, int32_t r, int32_t q0,
                      int32_t q1, int32_t a, int32_t b, int32_t L, int32_t F) {
    fi_schedule *s = g->s;
    int32_t t = q1 - q0, piece = 0, k = 1;
    if (F > 0) k = fixed_chunks(a, b, F);
    else if (L > 0 && b - a > L) k = auto_chunks(b - a, L, g->equal_pieces, &piece);
    if (k == 1) {
        emit(g, r, q0, q1, a, b, -1);
        return;
    }
    int32_t base = s->num_partial_rows;
    s->num_partial_rows += k * t;
    for (int32_t c = 0, x = a; c < k; c++) {
        int32_t y = F > 0 ? (x / F + 1) * F : x + piece;
        if (y > b) y = b;
        emit(g, r, q0, q1, x, y, base + c * t);
        x = y;
    }
    merge_rows(s, in->qo_indptr[r] + q0, t, k, base);
}

static void generate(gen_state *g, const fi_schedule_input *in, int32_t T, int32_t L,
                     int32_t F) {
    for (int32_t r = 0; r < in->batch_size; r++) {
        int32_t qo = in->qo_indptr[r + 1] - in->qo_indptr[r], kv = in->kv_len[r];
        for (int32_t q0 = 0; q0 < qo; q0 += T) {
            int32_t q1 = qo - q0 > T ? q0 + T : qo, a, b;
            tile_span(in, qo, kv, q0, q1, &a, &b);
            emit_tile(g, in, r, q0, q1, a, b, F > 0 ? L : tile_chunk(g, L, q1 - q0), F);
        }
    }
}

/* ------------------------------------------------------------- LPT */

/* order[] = item indices by cost, longest first; ties keep generation order
 * (request, token, key). This one is the fallback of sort_longest_first:
 * a stable LSD radix sort on the top 32 bits (skipping the bytes where every
 * key agrees), then the runs of equal top bits, whose costs differ by less
 * than 2^-20 relative, are put in exact order by a stable insertion sort. */
static void sort_radix(scratch *sc, int32_t n) {
    uint32_t hist[4][256];
    memset(hist, 0, sizeof hist);
    for (int32_t i = 0; i < n; i++) {
        uint32_t k = ~(uint32_t)(dbits(sc->cost[i]) >> 32);
        sc->key[i] = k;
        sc->order[i] = i;
        hist[0][k & 255]++;
        hist[1][(k >> 8) & 255]++;
        hist[2][(k >> 16) & 255]++;
        hist[3][k >> 24]++;
    }
    int32_t *src = sc->order, *dst = sc->tmp;
    for (int d = 0; d < 4 && n > 1; d++) {
        if (hist[d][(sc->key[0] >> (8 * d)) & 255] == (uint32_t)n) continue;
        uint32_t pos[256], sum = 0;
        for (int v = 0; v < 256; v++) {
            pos[v] = sum;
            sum += hist[d][v];
        }
        for (int32_t i = 0; i < n; i++) {
            int32_t j = src[i];
            dst[pos[(sc->key[j] >> (8 * d)) & 255]++] = j;
        }
        int32_t *x = src;
        src = dst;
        dst = x;
    }
    for (int32_t i = 1; i < n; i++) { /* exact order within equal top bits */
        int32_t j = src[i], p = i;
        while (p > 0 && sc->key[src[p - 1]] == sc->key[j] && sc->cost[src[p - 1]] < sc->cost[j]) {
            src[p] = src[p - 1];
            p--;
        }
        src[p] = j;
    }
    if (src != sc->order) memcpy(sc->order, src, (size_t)n * sizeof *src);
}

/* order[] = item indices by cost, longest first; ties keep generation order
 * (request, token, key): the one stable order, whatever computes it.
 * g: the generation's facts. Already non-increasing: the identity. Else a
 * stable LSD radix sort, two counting passes of 2^d buckets (one when the
 * keys fit d bits), on a 2d-bit key: (max - bits) >> shift over the nonzero
 * costs' range, zero costs last under a key of their own. The bits of
 * doubles >= 0 grow with the value and their top bits with its logarithm,
 * so a key is a narrow ratio of costs (2^(2d) keys, 256 to 4096 per item)
 * and a smaller key holds only larger costs. An insertion pass then orders
 * equal keys exactly; it holds the last cost in a register, so an item in
 * place costs one predicted compare. Should it move items more than ~8
 * times per item (costs bunched by a wide range), the radix sort above
 * redoes the work. */
static void sort_longest_first(scratch *sc, int32_t n, const gen_state *g) {
    int32_t *order = sc->order, *tmp = sc->tmp;
    const double *cost = sc->cost;
    if (g->desc || g->max == 0) {
        for (int32_t i = 0; i < n; i++) order[i] = i;
        return;
    }
    int d = sort_digit_bits(n), bits = 2 * d;
    if (n <= FI_SORT_ONE_PASS) { /* one pass of ~n buckets, as few items need */
        for (d = 4; ((int64_t)1 << d) < n; d++) continue;
        bits = d;
    }
    uint32_t nb = 1u << d, mask = nb - 1;
    uint64_t span = g->max - (g->nz_min1 + 1);
    int shift = 0;
    while ((span >> shift) >= ((uint64_t)1 << bits) - 1) shift++;
    uint32_t zero = (uint32_t)(span >> shift) + 1; /* the key of zero costs */
    bool two = zero >= nb;
    uint32_t *h0 = sc->hist, *h1 = sc->hist + nb, *key = sc->key;
    memset(h0, 0, (size_t)nb * (two ? 2 : 1) * sizeof *h0);
    for (int32_t i = 0; i < n; i++) {
        uint64_t b = dbits(cost[i]);
        uint32_t k = b ? (uint32_t)((g->max - b) >> shift) : zero;
        key[i] = k;
        h0[k & mask]++;
        if (two) h1[k >> d]++;
    }
    for (uint32_t v = 0, s0 = 0, s1 = 0; v < nb; v++) {
        uint32_t c0 = h0[v];
        h0[v] = s0;
        s0 += c0;
        if (two) {
            uint32_t c1 = h1[v];
            h1[v] = s1;
            s1 += c1;
        }
    }
    if (two) {
        for (int32_t i = 0; i < n; i++) tmp[h0[key[i] & mask]++] = i;
        for (int32_t i = 0; i < n; i++) {
            int32_t j = tmp[i];
            order[h1[key[j] >> d]++] = j;
        }
    } else {
        for (int32_t i = 0; i < n; i++) order[h0[key[i]]++] = i;
    }
    int64_t budget = 8 * (int64_t)n + 1024;
    double last = cost[order[0]];
    for (int32_t i = 1; i < n; i++) {
        int32_t j = order[i], p = i;
        double c = cost[j];
        if (!(last < c)) {
            last = c;
            continue;
        }
        do { /* stops at the start of j's key */
            order[p] = order[p - 1];
            p--;
        } while (p > 0 && cost[order[p - 1]] < c);
        order[p] = j;
        if ((budget -= i - p) < 0) {
            sort_radix(sc, n);
            return;
        }
    }
}

/* Each item, longest first, to the least-loaded worker, the lowest id on
 * ties, i.e. to the worker of the smallest (load, id). worker[i] is the
 * worker of item order[i], cursor[w] worker w's item count and wcost[w] its
 * load; every load is the same chain of additions in item order, whichever
 * path below picks the worker, so they all give the same schedule.
 *
 * While workers are idle, item i goes to worker i. Then, with few workers,
 * a scan of the loads; with more, rounds: with the workers sorted by
 * (load, id) in A, the next items go to A[0], A[1], ... for as long as A[k]
 * is below every load this round has made (A[k] is then the least of all);
 * longest first, LPT keeps the loads level, so a round is usually all N
 * workers. The loads it made are sorted (listed by worker id, a stable
 * radix sort on their top bits, an insertion pass for the rest) and merged
 * with the rest of A: O(1) per item and O(N) per round. A round shorter than N / 4
 * (loads far apart, as when long items give way to short ones) hands the
 * next N items to a tournament tree, O(log N) each, and A is sorted anew. */
static void assign_tree(scratch *sc, int32_t from, int32_t to, int32_t N, double *wcost);

static inline bool pair_less(uint64_t a, int32_t ia, uint64_t b, int32_t ib) {
    return a < b || (a == b && ia < ib);
}

/* perm[0 .. k) = 0 .. k-1 ordered by the top 16 bits of ld[j] - lo (ld
 * within [lo, hi]), stably: an LSD radix sort, two counting passes of 256
 * buckets (one when the range fits 8 bits). The callers list the loads by
 * worker id, so equal loads come out by id, and fix_loads finishes. */
static void sort_loads(scratch *sc, const uint64_t *ld, int32_t k, uint64_t lo, uint64_t hi,
                       int32_t *perm) {
    uint32_t *key = (uint32_t *)sc->cand_len;
    int32_t *tmp = sc->cand_tok;
    int shift = 0;
    while (((hi - lo) >> shift) >= 65536) shift++;
    bool two = ((hi - lo) >> shift) >= 256;
    uint32_t h0[256], h1[256];
    memset(h0, 0, sizeof h0);
    memset(h1, 0, sizeof h1);
    for (int32_t j = 0; j < k; j++) {
        uint32_t x = (uint32_t)((ld[j] - lo) >> shift);
        key[j] = x;
        h0[x & 255]++;
        h1[x >> 8]++;
    }
    for (uint32_t v = 0, s0 = 0, s1 = 0; v < 256; v++) {
        uint32_t c0 = h0[v], c1 = h1[v];
        h0[v] = s0;
        h1[v] = s1;
        s0 += c0;
        s1 += c1;
    }
    int32_t *first = two ? tmp : perm;
    for (int32_t j = 0; j < k; j++) first[h0[key[j] & 255]++] = j;
    if (!two) return;
    for (int32_t j = 0; j < k; j++) {
        int32_t x = tmp[j];
        perm[h1[key[x] >> 8]++] = x;
    }
}

/* Insertion passes that put sorted-by-key loads in exact (load, id) order;
 * the last element rides in registers, so one already in place costs one
 * predicted compare. fix_loads: arrays ld/id; fix_perm: through perm. */
static void fix_loads(uint64_t *ld, int32_t *id, int32_t k) {
    uint64_t pl = ld[0];
    int32_t pi = id[0];
    for (int32_t j = 1; j < k; j++) {
        uint64_t xl = ld[j];
        int32_t xi = id[j], p = j;
        if (!pair_less(xl, xi, pl, pi)) {
            pl = xl;
            pi = xi;
            continue;
        }
        do {
            ld[p] = ld[p - 1];
            id[p] = id[p - 1];
            p--;
        } while (p > 0 && pair_less(xl, xi, ld[p - 1], id[p - 1]));
        ld[p] = xl;
        id[p] = xi;
    }
}

static void fix_perm(const uint64_t *ld, const int32_t *id, int32_t *perm, int32_t k) {
    uint64_t pl = ld[perm[0]];
    int32_t pi = id[perm[0]];
    for (int32_t j = 1; j < k; j++) {
        int32_t x = perm[j], xi = id[x], p = j;
        uint64_t xl = ld[x];
        if (!pair_less(xl, xi, pl, pi)) {
            pl = xl;
            pi = xi;
            continue;
        }
        do {
            perm[p] = perm[p - 1];
            p--;
        } while (p > 0 && pair_less(xl, xi, ld[perm[p - 1]], id[perm[p - 1]]));
        perm[p] = x;
    }
}

/* A = all N workers by (load, id), from the loads in wcost; bl: scratch. */
static void sort_all(scratch *sc, const double *wcost, int32_t N, uint64_t lo, uint64_t hi,
                     uint64_t *ld, int32_t *id, uint64_t *bl, int32_t *perm) {
    for (int32_t w = 0; w < N; w++) bl[w] = dbits(wcost[w]);
    sort_loads(sc, bl, N, lo, hi, perm);
    for (int32_t j = 0; j < N; j++) {
        int32_t w = perm[j];
        ld[j] = bl[w];
        id[j] = w;
    }
    fix_loads(ld, id, N);
}

static void assign_lpt(scratch *sc, int32_t n, int32_t N, double *wcost) {
    const int32_t *order = sc->order;
    const double *cost = sc->cost;
    int32_t *worker = sc->worker, *cnt = sc->cursor, m = 0;
    for (; m < n && m < N && cost[order[m]] > 0; m++) {
        worker[m] = m;
        wcost[m] = cost[order[m]];
        cnt[m] = 1;
    }
    for (int32_t w = m; w < N; w++) {
        wcost[w] = 0;
        cnt[w] = 0;
    }
    if (m == n) return;
    if (N == 2) { /* the scan below, with both loads in registers */
        double l0 = wcost[0], l1 = wcost[1];
        int32_t n1 = 0;
        for (int32_t i = m; i < n; i++) {
            bool one = l1 < l0;
            double x = (one ? l1 : l0) + cost[order[i]];
            l0 = one ? l0 : x;
            l1 = one ? x : l1;
            worker[i] = one;
            n1 += one;
        }
        cnt[1] += n1;
        cnt[0] += n - m - n1;
        wcost[0] = l0;
        wcost[1] = l1;
        return;
    }
    if (N <= 8) { /* a scan: the first of the least loads */
        for (int32_t i = m; i < n; i++) {
            int32_t best = 0;
            for (int32_t w = 1; w < N; w++) best = wcost[w] < wcost[best] ? w : best;
            worker[i] = best;
            cnt[best]++;
            wcost[best] += cost[order[i]];
        }
        return;
    }
    /* A: idle workers, then workers m-1 .. 0 (loads not increasing with the
     * id), each run of equal loads by increasing id. B follows A. */
    uint64_t *ld = sc->val;
    int32_t *id = sc->tree, *perm = sc->next, t = 0;
    for (int32_t w = m; w < N; w++) ld[t] = 0, id[t++] = w;
    for (int32_t e = m; e > 0;) {
        int32_t b = e - 1;
        while (b > 0 && wcost[b - 1] == wcost[e - 1]) b--;
        for (int32_t w = b; w < e; w++) ld[t] = dbits(wcost[w]), id[t++] = w;
        e = b;
    }
    uint64_t *bl = ld + N;
    int32_t *bid = id + N, *mark = sc->mark;
    for (int32_t w = 0; w < N; w++) mark[w] = 0;
    for (int32_t i = m, round = 1; i < n; round++) {
        int32_t R = n - i < N ? n - i : N, k = 0;
        uint64_t run = UINT64_MAX, lo = UINT64_MAX, hi = 0;
        int32_t run_id = INT32_MAX;
        for (; k < R && pair_less(ld[k], id[k], run, run_id); k++) {
            int32_t w = id[k];
            double x = bitsd(ld[k]) + cost[order[i + k]];
            uint64_t xb = dbits(x);
            worker[i + k] = w;
            cnt[w]++;
            wcost[w] = x;
            mark[w] = round;
            if (pair_less(xb, w, run, run_id)) run = xb, run_id = w;
            lo = xb < lo ? xb : lo;
            hi = xb > hi ? xb : hi;
        }
        i += k;
        if (i == n) return;
        if (k == N) { /* a full round: A = its new loads, sorted */
            sort_all(sc, wcost, N, lo, hi, ld, id, bl, perm);
            continue;
        }
        if (4 * k < N) { /* a short round: N items by the tree, then sort A anew */
            int32_t to = n - i < N ? n : i + N;
            assign_tree(sc, i, to, N, wcost);
            i = to;
            if (i == n) return;
            lo = UINT64_MAX, hi = 0;
            for (int32_t w = 0; w < N; w++) {
                uint64_t x = dbits(wcost[w]);
                lo = x < lo ? x : lo;
                hi = x > hi ? x : hi;
            }
            sort_all(sc, wcost, N, lo, hi, ld, id, bl, perm);
            continue;
        }
        /* B: the round's workers by id, sorted by (load, id) through perm */
        for (int32_t w = 0, c = 0; w < N; w++)
            if (mark[w] == round) bl[c] = dbits(wcost[w]), bid[c++] = w;
        sort_loads(sc, bl, k, lo, hi, perm);
        fix_perm(bl, bid, perm, k);
        /* merge B (by perm) with A[k ..] into A, in place from the front */
        int32_t a = k, c = 0, o = 0;
        while (c < k && a < N) {
            int32_t j = perm[c];
            if (pair_less(bl[j], bid[j], ld[a], id[a])) ld[o] = bl[j], id[o++] = bid[j], c++;
            else ld[o] = ld[a], id[o++] = id[a++];
        }
        for (; c < k; c++) ld[o] = bl[perm[c]], id[o++] = bid[perm[c]];
    }
}

/* Items order[from .. n) by a tournament tree over P >= N leaves (padding
 * leaves load +inf), starting from the loads in wcost: node v holds the
 * winner of its subtree, and a left subtree's ids are all below the right
 * one's, so "left wins ties" is "lowest id wins". After a worker's load
 * grows, only its path is replayed, carrying the winner in registers: each
 * step reads a sibling that did not change, and selects with masks, as a
 * branch there would be mispredicted half the time. */
static void assign_tree(scratch *sc, int32_t from, int32_t n, int32_t N, double *wcost) {
    int32_t P = sc->leaves, *id = sc->tree;
    uint64_t *val = sc->val;
    for (int32_t w = 0; w < P; w++) {
        val[P + w] = w < N ? dbits(wcost[w]) : dbits(INFINITY);
        id[P + w] = w;
    }
    for (int32_t v = P - 1; v >= 1; v--) {
        int32_t c = val[2 * v + 1] < val[2 * v] ? 2 * v + 1 : 2 * v;
        val[v] = val[c];
        id[v] = id[c];
    }
    /* The root's winner and load ride in registers from item to item, so
     * the loop-carried chain is only the compares and selects. */
    int32_t w = id[1];
    uint64_t root = val[1];
    for (int32_t i = from; i < n; i++) {
        int32_t win = w;
        sc->worker[i] = w;
        sc->cursor[w]++;
        uint64_t x = dbits(bitsd(root) + sc->cost[sc->order[i]]);
        val[P + w] = x;
        for (int32_t v = P + w; v > 1; v >>= 1) {
            uint64_t y = val[v ^ 1];
            /* the sibling wins if lighter; a left sibling (v odd) also on ties */
            uint64_t mask = (uint64_t)0 - (uint64_t)(y < x + (uint64_t)(v & 1));
            x = (y & mask) | (x & ~mask);
            win = (int32_t)(((uint32_t)id[v ^ 1] & (uint32_t)mask) |
                            ((uint32_t)win & ~(uint32_t)mask));
            val[v >> 1] = x;
            id[v >> 1] = win;
        }
        w = win;
        root = x;
    }
    for (int32_t k = 0; k < N; k++) wcost[k] = bitsd(val[P + k]);
}

/* Items grouped by worker, each queue longest first, or with
 * request_order in generation order (request, tokens, keys: a GPU's
 * workers then sweep the batch's requests together, and the causal tiles
 * of a request, which read the same keys, run close in time and share
 * them in L2); cursor[w] arrives as worker w's item count.
 *
 * With wide_rows > 0, items of more packed rows than that (a GPU's
 * tensor-core blocks: compute-bound where the narrow ones, decodes, are
 * bandwidth-bound) lead their queues, and the workers holding any lead
 * the worker order (each group in id order). LPT hands the wide items of a
 * mostly-decode batch to the least-loaded workers, the last ids, which a
 * GPU runs last: their math then formed the launch's tail alone; run
 * first, it overlaps the decodes' reads (measured faster on a GPU's
 * chunked mix: docs/SCHEDULER.md). Worker order changes no result:
 * partial rows and merges do not depend on it. */
static inline bool wide_item(const fi_work_item *it, int32_t group, int32_t wide_rows) {
    return wide_rows > 0 && (int64_t)(it->q_end - it->q_start) * group > wide_rows;
}

static void emit_queues(fi_schedule *s, scratch *sc, int32_t n, int32_t N, bool request_order,
                        int32_t wide_rows, int32_t group) {
    int32_t *ptr = s->worker_indptr;
    if (request_order) /* tmp[g]: the worker of generated item g */
        for (int32_t i = 0; i < n; i++) sc->tmp[sc->order[i]] = sc->worker[i];
    int32_t *wide = sc->mark, *perm = sc->next; /* [N]: LPT is done with both */
    int32_t first = 0;                           /* workers holding a wide item */
    for (int32_t w = 0; w < N; w++) wide[w] = 0;
    if (wide_rows > 0)
        for (int32_t i = 0; i < n; i++)
            if (wide_item(&sc->gen[sc->order[i]], group, wide_rows)) wide[sc->worker[i]] = 1;
    for (int32_t w = 0; w < N; w++) first += wide[w];
    if (first == 0 || first == N) { /* one group: the ids as they are */
        for (int32_t w = 0; w < N; w++) perm[w] = w;
    } else {
        int32_t a = 0, b = first;
        for (int32_t w = 0; w < N; w++) perm[wide[w] ? a++ : b++] = w;
        /* the queues' costs follow their queues */
        double *cost = sc->cost; /* [max_items >= max_workers]: the sort is done */
        for (int32_t w = 0; w < N; w++) cost[w] = s->worker_cost[perm[w]];
        for (int32_t w = 0; w < N; w++) s->worker_cost[w] = cost[w];
    }
    /* slot k holds worker perm[k]'s queue; cursor[w]: where w's next item goes */
    ptr[0] = 0;
    for (int32_t k = 0; k < N; k++) {
        const int32_t w = perm[k], cnt = sc->cursor[w];
        sc->cursor[w] = ptr[k];
        ptr[k + 1] = ptr[k] + cnt;
    }
    /* with wide items, two passes: those, then the rest (the arrays in
     * locals: through s and sc, the stores of the items made every
     * iteration reload them) */
    fi_work_item *restrict out = s->items;
    const fi_work_item *restrict gen = sc->gen;
    const int32_t *restrict order = sc->order;
    const int32_t *restrict worker = request_order ? sc->tmp : sc->worker;
    int32_t *restrict cursor = sc->cursor;
    for (int pass = first > 0 ? 0 : 1; pass < 2; pass++)
        for (int32_t i = 0; i < n; i++) {
            const fi_work_item *it = &gen[request_order ? i : order[i]];
            if ((first > 0 && wide_item(it, group, wide_rows)) != (pass == 0)) continue;
            out[cursor[worker[i]]++] = *it;
        }
}

/* ------------------------------------------------------------- build */

static fi_status check_input(const fi_schedule *s, const fi_schedule_input *in) {
    const fi_schedule_limits *l = &s->limits;
    if (!s->scratch) return fi_error(FI_STATUS_INVALID_ARGUMENT, "schedule: not initialised");
    if (in->batch_size < 0 || (in->batch_size > 0 && (!in->qo_indptr || !in->kv_len)))
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "schedule: batch_size %d, indptr %p",
                        (int)in->batch_size, (const void *)in->qo_indptr);
    if (in->batch_size > l->max_batch_size)
        return fi_error(FI_STATUS_BOUND_EXCEEDED, "batch size %d > max_batch_size %d",
                        (int)in->batch_size, (int)l->max_batch_size);
    int32_t total = in->batch_size ? in->qo_indptr[in->batch_size] : 0;
    if (total > l->max_total_qo)
        return fi_error(FI_STATUS_BOUND_EXCEEDED, "query tokens %d > max_total_qo %d",
                        (int)total, (int)l->max_total_qo);
    if (in->num_workers < 1 || in->num_workers > l->max_workers)
        return fi_error(in->num_workers < 1 ? FI_STATUS_INVALID_ARGUMENT
                                            : FI_STATUS_BOUND_EXCEEDED,
                        "workers %d: expected 1 .. max_workers %d", (int)in->num_workers,
                        (int)l->max_workers);
    const fi_sched_policy *pol = &in->policy;
    const int32_t nt = pol->num_q_tiles, max_tiles = (int32_t)(sizeof pol->q_tiles / 4);
    if (in->group_size < 1 || in->num_kv_heads < 1 || nt < 1 || nt > max_tiles)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "schedule: group_size %d, num_kv_heads %d, %d query tiles (1 .. %d)",
                        (int)in->group_size, (int)in->num_kv_heads, (int)nt, (int)max_tiles);
    for (int32_t i = 0; i < nt; i++)
        if (pol->q_tiles[i] < 1 || (i > 0 && pol->q_tiles[i] <= pol->q_tiles[i - 1]))
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "schedule: query tiles must be positive and ascending");
    const double a = pol->cost_per_q_row, b = pol->cost_per_key, c = pol->cost_per_row_key;
    if (!(a >= 0 && b >= 0 && c >= 0 && a < 1e30 && b < 1e30 && c < 1e30))
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "schedule: cost constants %g, %g, %g must be finite and >= 0", a, b, c);
    if (in->fixed_split_size < 0)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "schedule: fixed_split_size %d < 0",
                        (int)in->fixed_split_size);
    if (pol->cost_rows_exact < 0 || pol->cost_rows_block < 0)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "schedule: cost_rows_exact %d, cost_rows_block %d must be >= 0",
                        (int)pol->cost_rows_exact, (int)pol->cost_rows_block);
    return FI_OK;
}

/* Packed query rows per tile: the smallest supported tile holding the
 * batch's average packed rows per request (empty requests count, so no
 * pass over the batch is needed), else the largest. Fixed split uses the
 * largest always, so that a request's items do not depend on the batch. */
static int32_t choose_q_tile(const fi_schedule_input *in, bool fixed) {
    int32_t last = in->policy.q_tiles[in->policy.num_q_tiles - 1], B = in->batch_size;
    if (fixed || B == 0) return last;
    int64_t rows = (int64_t)(in->qo_indptr[B] - in->qo_indptr[0]) * in->group_size;
    for (int32_t i = 0; i < in->policy.num_q_tiles; i++)
        if ((int64_t)in->policy.q_tiles[i] * B >= rows) return in->policy.q_tiles[i];
    return last;
}

static fi_status over(const char *what, int64_t need, const char *bound, int32_t have,
                      int32_t F) {
    return fi_error(FI_STATUS_BOUND_EXCEEDED, "%s %lld > %s %d%s", what, (long long)need,
                    bound, (int)have, F > 0 ? " (fixed_split_size in use)" : "");
}

fi_status fi_schedule_build(fi_schedule *s, const fi_schedule_input *in) {
    fi_status st = check_input(s, in);
    if (st) return st;
    const fi_schedule_limits *l = &s->limits;
    scratch *sc = s->scratch;
    int32_t N = in->num_workers, F = in->disable_split_kv ? 0 : in->fixed_split_size;
    int32_t tile = choose_q_tile(in, F > 0);
    int32_t T = tile / in->group_size > 1 ? tile / in->group_size : 1;
    double heads = in->num_kv_heads;
    const fi_sched_policy *pol = &in->policy;
    gen_state g = {.s = s, .sc = sc, .row_cost = heads * pol->cost_per_q_row * in->group_size,
                   .key_cost = heads * pol->cost_per_key,
                   .pair_cost = heads * pol->cost_per_row_key, .group = in->group_size,
                   .rows_exact = pol->cost_rows_exact, .rows_block = pol->cost_rows_block,
                   .equal_pieces = split_slots(in) < in->num_workers};
    gen_reset(&g);
    survey sv;
    if (F > 0) survey_fixed(in, T, F, &sv);
    else survey_batch(in, T, &sv, &g, l->max_items);

    int64_t items = sv.tiles, rows = 0, extra = 0;
    int32_t L = 0;
    if (F > 0) {
        items = sv.fixed_items;
        rows = sv.fixed_rows;
    } else if (!in->disable_split_kv && sv.span_sum > 0) {
        L = choose_chunk(in, T, &sv, &g, l->max_partial_rows, l->max_workers, &extra);
        items += extra;
    }
    if (items > l->max_items) return over("work items", items, "max_items", l->max_items, F);
    if (rows > l->max_partial_rows)
        return over("partial rows", rows, "max_partial_rows", l->max_partial_rows, F);

    s->num_workers = N;
    s->q_tile_rows = tile;
    s->num_partial_rows = 0;
    s->num_merge_rows = 0;
    s->merge_indptr[0] = 0;
    if (F > 0 || L > 0) { /* else the survey's write-through items stand */
        gen_reset(&g);
        generate(&g, in, T, L, F);
    }
    s->num_items = g.n;
    s->kv_chunk = s->num_partial_rows > 0 ? (F > 0 ? F : L) : 0;

    if (N > 1) sort_longest_first(sc, g.n, &g);
    else for (int32_t i = 0; i < g.n; i++) sc->order[i] = i;
    assign_lpt(sc, g.n, N, s->worker_cost);
    emit_queues(s, sc, g.n, N, in->policy.queues_in_request_order, in->policy.wide_first_rows,
                in->group_size);
    double total = 0.0, most = 0.0; /* in registers: through s, each sum waited on a store */
    for (int32_t w = 0; w < N; w++) {
        total += s->worker_cost[w];
        most = s->worker_cost[w] > most ? s->worker_cost[w] : most;
    }
    s->total_cost = total;
    s->max_worker_cost = most;
    return FI_OK;
}
