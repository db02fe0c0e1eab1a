/*
 * ops_sample.c — sampling (top-k / top-p / min-p), the filters,
 * chain speculative sampling and top-k on the CPU.
 *
 * Every filter is a threshold on one row: the kept values are those >= t
 * (ties at the boundary are all kept, docs/SEMANTICS.md "Sampling"). t is
 * found exactly by a radix select over the values' order-preserving 32-bit
 * keys: 11, 11 and 10 key bits per level, each level a histogram of counts
 * (top-k) or of f64 masses (top-p) over the candidates the level before
 * left, read from the top down to the bucket where the running sum reaches
 * the target. No sort, O(V) per row.
 *
 * A draw is an exact inverse CDF over the kept values: block sums
 * (FI_SV_BLOCK elements, lane sums of the level's kernels, then f64 in
 * block order), the block where u x total falls, then that block in index
 * order. Every sum has a fixed order and every kernel level computes the
 * same bits (serving_kern.h), so a draw depends only on the inputs and on
 * (seed, offset, output row), whatever the threads or SIMD level.
 */
#include "cpu/serving.h"

#include "cpu/convert.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- keys */

static inline float value_of(uint32_t key) {
    return fi_bits_to_f32(key & 0x80000000u ? key & 0x7fffffffu : ~key);
}

/* --------------------------------------------------------- scratch */

#define SEL_BUCKETS 2048

/* One worker's memory for one row: the row as f32, a second row (weights
 * or a difference), candidates of the select, block sums, histograms. */
typedef struct row_scratch {
    float *x, *w;
    int32_t *cand;
    double *blocks;
    double *mass;    /* [SEL_BUCKETS] */
    uint32_t *count; /* [SEL_BUCKETS] */
    uint64_t *pairs; /* [k] top-k: (key, index) packed for sorting */
} row_scratch;

static size_t scratch_bytes(int64_t v, int64_t k) {
    int64_t blocks = v / FI_SV_BLOCK + 1;
    return 3 * fi_sv_floats(v) + fi_sv_floats(2 * blocks) + fi_sv_floats(2 * SEL_BUCKETS) +
           fi_sv_floats(SEL_BUCKETS) + fi_sv_floats(2 * k);
}

static row_scratch scratch_at(void *base, int64_t v) {
    char *p = base;
    row_scratch s;
    int64_t blocks = v / FI_SV_BLOCK + 1;
    s.x = (float *)p, p += fi_sv_floats(v);
    s.w = (float *)p, p += fi_sv_floats(v);
    s.cand = (int32_t *)p, p += fi_sv_floats(v);
    s.blocks = (double *)p, p += fi_sv_floats(2 * blocks);
    s.mass = (double *)p, p += fi_sv_floats(2 * SEL_BUCKETS);
    s.count = (uint32_t *)p, p += fi_sv_floats(SEL_BUCKETS);
    s.pairs = (uint64_t *)p;
    return s;
}

/* ---------------------------------------------------------- select */

/* The boundary bucket of one level, from the top: the first non-empty b
 * with *above + S(b) >= target, S the mass (mass != NULL) or count; *above
 * gets the sum of the buckets over it. -1 when the buckets sum below the
 * target. */
static int boundary(const double *mass, const uint32_t *count, int buckets, double target,
                    double *above) {
    for (int b = buckets - 1; b >= 0; b--) {
        if (!count[b]) continue;
        double s = mass ? mass[b] : (double)count[b];
        if (*above + s >= target) return b;
        *above += s;
    }
    return -1;
}

/* The key t with S(key > t) < X <= S(key >= t) over the values whose key
 * is >= lo, S counting them (w NULL) or summing their weights w; X is
 * `count` (w NULL) or frac x the included mass. *all when the included
 * values sum below X (then every one of them is kept: t = lo). */
static uint32_t select_key_from(const float *keys, const float *w, int64_t n, bool listed,
                                uint32_t lo, double count, double frac, row_scratch *s, bool *all) {
    static const int shift[3] = {21, 10, 0}, bits[3] = {11, 11, 10};
    double above = 0.0, target = count;
    uint32_t prefix = 0;
    int64_t m = n; /* candidates: every index (or s->cand when listed), then s->cand */
    *all = false;
    for (int lvl = 0; lvl < 3; lvl++) {
        const int nb = 1 << bits[lvl];
        const uint32_t mask = (uint32_t)nb - 1;
        memset(s->count, 0, (size_t)nb * sizeof *s->count);
        if (w) memset(s->mass, 0, (size_t)nb * sizeof *s->mass);
        for (int64_t c = 0; c < m; c++) {
            int64_t i = lvl || listed ? s->cand[c] : c;
            uint32_t key = fi_sv_key(keys[i]);
            if (key < lo) continue;
            uint32_t b = (key >> shift[lvl]) & mask;
            s->count[b]++;
            if (w) s->mass[b] += (double)w[i];
        }
        if (lvl == 0 && w) { /* the mass target: frac of what is included */
            double total = 0.0;
            for (int b = 0; b < nb; b++) total += s->mass[b];
            target = frac * total;
        }
        int b = boundary(w ? s->mass : NULL, s->count, nb, target, &above);
        if (b < 0) {
            *all = true;
            return lo;
        }
        prefix |= (uint32_t)b << shift[lvl];
        if (lvl == 2) break;
        /* the candidates of bucket b go on to the next level */
        int64_t kept = 0;
        for (int64_t c = 0; c < m; c++) {
            int64_t i = lvl || listed ? s->cand[c] : c;
            uint32_t key = fi_sv_key(keys[i]);
            if (key >= lo && ((key >> shift[lvl]) & mask) == (uint32_t)b)
                s->cand[kept++] = (int32_t)i;
        }
        m = kept;
    }
    return prefix;
}

static uint32_t select_key(const float *keys, const float *w, int64_t n, uint32_t lo, double count,
                           double frac, row_scratch *s, bool *all) {
    return select_key_from(keys, w, n, false, lo, count, frac, s, all);
}

/* The r-th largest (0-based) of a[0 .. n), reordering a (quickselect,
 * middle pivot: the sample it runs on is unordered). */
static uint32_t nth_largest(uint32_t *a, int64_t n, int64_t r) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        uint32_t p = a[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] > p) i++;
            while (a[j] < p) j--;
            if (i <= j) {
                uint32_t t = a[i];
                a[i++] = a[j];
                a[j--] = t;
            }
        }
        if (r <= j)
            hi = j;
        else if (r >= i)
            lo = i;
        else
            return a[r];
    }
    return a[r];
}

/* Values per block of kth_key's bound: about 2048 blocks in a row. */
static int64_t bound_block(int64_t n) {
    int64_t b = 64;
    while (n / b > 2048) b *= 2;
    return b;
}

/* The key of the k-th largest of x[n] (1 <= k <= n), and in *list / *m a
 * list of indices, in index order, holding every value whose key is >=
 * it (*list NULL: all n). Small k of a long row: the k-th largest of the
 * blocks' maxima is a bound no larger than the k-th largest value (those k
 * maxima are k values of the row), so only the blocks whose maximum
 * reaches it can hold the top k, and they hold at least k values at or
 * above it; the exact select runs on those values (a quickselect when
 * they are few). The list lives in s->w (this row's second buffer, unused
 * by the callers meanwhile). */
static uint32_t kth_key(const fi_cpu_serving_kernels *kern, const float *x, int64_t n, int64_t k,
                        row_scratch *s, const int32_t **list, int64_t *m) {
    bool all;
    *list = NULL, *m = n;
    const int64_t bs = bound_block(n), nb = (n + bs - 1) / bs;
    if (n < 8192 || 4 * k > nb) return select_key(x, NULL, n, 0, (double)k, 0.0, s, &all);
    uint32_t *max = (uint32_t *)s->cand, *sel = max + nb; /* 2 nb <= n */
    kern->block_max_keys(x, n, bs, max);
    memcpy(sel, max, (size_t)nb * sizeof *sel);
    const uint32_t bound = nth_largest(sel, nb, k - 1);
    int32_t *keep = (int32_t *)s->w;
    int64_t got = 0;
    for (int64_t b = 0; b < nb; b++) {
        if (max[b] < bound) continue;
        const int64_t end = (b + 1) * bs < n ? (b + 1) * bs : n;
        for (int64_t i = b * bs; i < end; i++) {
            keep[got] = (int32_t)i;
            got += fi_sv_key(x[i]) >= bound;
        }
    }
    *list = keep, *m = got;
    if (got <= 4096) {
        uint32_t *keys = (uint32_t *)s->cand;
        for (int64_t c = 0; c < got; c++) keys[c] = fi_sv_key(x[keep[c]]);
        return nth_largest(keys, got, k - 1);
    }
    memcpy(s->cand, keep, (size_t)got * sizeof *keep);
    return select_key_from(x, NULL, got, true, 0, (double)k, 0.0, s, &all);
}

/* Threshold of top-k on values x (k <= 0 or >= n: none, -inf). */
static float top_k_threshold(const fi_cpu_serving_kernels *kern, const float *x, int64_t n,
                             int32_t k, row_scratch *s) {
    if (k <= 0 || k >= n) return -INFINITY;
    const int32_t *list;
    int64_t m;
    return value_of(kth_key(kern, x, n, k, s, &list, &m));
}

/* Threshold of top-p on weights w >= 0 among those >= lo (p >= 1: lo). */
static float top_p_threshold(const float *w, int64_t n, float p, float lo, row_scratch *s) {
    if (p >= 1.0f) return lo;
    bool all;
    uint32_t t = select_key(w, w, n, fi_sv_key(lo), 0.0, (double)p, s, &all);
    return all ? lo : value_of(t);
}

/* ------------------------------------------------------------ draws */

/* The index drawn by u in [0, 1) from the w >= t (w >= 0); false when
 * they have no positive finite mass. */
static bool draw(const fi_cpu_serving_kernels *k, const float *w, int64_t n, float t, double u,
                 double *blocks, int32_t *out) {
    const int64_t nb = (n + FI_SV_BLOCK - 1) / FI_SV_BLOCK;
    double total = 0.0;
    for (int64_t b = 0; b < nb; b++) {
        int64_t len = n - b * FI_SV_BLOCK < FI_SV_BLOCK ? n - b * FI_SV_BLOCK : FI_SV_BLOCK;
        blocks[b] = (double)k->masked_sum(w + b * FI_SV_BLOCK, t, len);
        total += blocks[b];
    }
    if (!(total > 0.0) || !isfinite(total)) return false;
    const double target = u * total;
    double cum = 0.0;
    int64_t b = 0, last = -1;
    for (; b < nb; b++) {
        if (blocks[b] > 0.0) last = b;
        if (cum + blocks[b] > target) break;
        cum += blocks[b];
    }
    double stop = target;
    if (b == nb) { /* rounding: u x total at the blocks' sum: the last kept value */
        b = last;
        stop = INFINITY;
    }
    int64_t lo = b * FI_SV_BLOCK, hi = lo + FI_SV_BLOCK < n ? lo + FI_SV_BLOCK : n;
    int64_t pick = -1;
    for (int64_t i = lo; i < hi; i++) {
        float v = w[i];
        if (!(v >= t && v > 0.0f)) continue;
        pick = i;
        cum += (double)v;
        if (cum > stop) break;
    }
    *out = (int32_t)pick;
    return pick >= 0;
}

/* ------------------------------------------------------- parameters */

static float param_f32(const fi_param_f32 *p, int64_t b) {
    return p->arr ? ((const float *)p->arr->data)[b * p->arr->stride[0]] : p->val;
}

static int32_t param_i32(const fi_param_i32 *p, int64_t b) {
    return p->arr ? ((const int32_t *)p->arr->data)[b * p->arr->stride[0]] : p->val;
}

/* Row sums as draw() makes them: lane sums per block, f64 in block order. */
static double block_total(const fi_cpu_serving_kernels *k, const float *w, int64_t n, float t) {
    double total = 0.0;
    for (int64_t b = 0; b < n; b += FI_SV_BLOCK)
        total += (double)k->masked_sum(w + b, t, n - b < FI_SV_BLOCK ? n - b : FI_SV_BLOCK);
    return total;
}

/* --------------------------------------------------------- sampling */

typedef struct sample_job {
    const fi_sample_args *a;
    const fi_cpu_serving_kernels *k;
    fi_ops_isa isa;
} sample_job;

/* Output row b: the token drawn, or false when the filtered distribution
 * has no mass (or the row holds values that are no distribution). */
static bool sample_row(const sample_job *j, row_scratch *s, int64_t b, int32_t *token) {
    const fi_sample_args *a = j->a;
    const fi_cpu_serving_kernels *k = j->k;
    const fi_tensor *in = a->input;
    const int64_t v = in->shape[1];
    const int64_t row =
        a->indices ? ((const int32_t *)a->indices->data)[b * a->indices->stride[0]] : b;
    const float *x = fi_sv_load(j->isa, in, row * in->stride[0], in->stride[1], v, s->x);
    float m;
    uint32_t kinds;
    k->stats(x, v, &m, &kinds);
    const int32_t top_k = a->use_top_k ? param_i32(&a->top_k, b) : 0;
    const float top_p = a->use_top_p ? param_f32(&a->top_p, b) : 1.0f;
    const bool joint = a->use_top_k && a->order == FI_FILTER_JOINT;
    const float *w = x;
    float t = 0.0f; /* kept: w >= t */
    if (a->logits) {
        if ((kinds & (FI_SV_NAN | FI_SV_POS_INF)) || m == -INFINITY) return false;
        /* top-k ranks the logits; top-p the softmax weights after it
         * (top-k first) or of the whole row (joint) */
        const float tk = top_k_threshold(k, x, v, top_k, s);
        float *e = s->w;
        for (int64_t o = 0; o < v; o += FI_SV_BLOCK)
            k->exp_sum(e + o, x + o, m, 1.0f, joint ? -INFINITY : tk,
                       v - o < FI_SV_BLOCK ? v - o : FI_SV_BLOCK);
        if (top_p < 1.0f) t = top_p_threshold(e, v, top_p, 0.0f, s);
        if (joint && tk > -INFINITY)
            for (int64_t i = 0; i < v; i++) e[i] = x[i] >= tk ? e[i] : 0.0f;
        w = e;
    } else {
        if (kinds) return false;
        const float tk = top_k_threshold(k, x, v, top_k, s);
        t = tk > 0.0f ? tk : 0.0f;
        if (a->use_min_p) {
            float mp = param_f32(&a->min_p, b) * m;
            t = mp > t ? mp : t;
        }
        if (top_p < 1.0f) {
            float tp = top_p_threshold(x, v, top_p, joint ? 0.0f : t, s);
            t = tp > t ? tp : t;
        }
    }
    double u = fi_uniform(a->seed, a->offset, (uint32_t)b, 0);
    return draw(k, w, v, t, u, s->blocks, token);
}

static void sample_rows(void *arg, void *scratch, int64_t begin, int64_t end) {
    const sample_job *j = arg;
    const fi_sample_args *a = j->a;
    row_scratch s = scratch_at(scratch, a->input->shape[1]);
    for (int64_t b = begin; b < end; b++) {
        int32_t token = 0;
        bool ok = sample_row(j, &s, b, &token);
        ((int32_t *)a->samples->data)[b * a->samples->stride[0]] = ok ? token : 0;
        if (a->valid) ((uint8_t *)a->valid->data)[b * a->valid->stride[0]] = ok;
    }
}

fi_status fi_cpu_sample(fi_context *ctx, const fi_sample_args *a, void *stream) {
    (void)stream;
    sample_job j = {a, fi_cpu_serving_for(ctx), fi_ops_isa_for(ctx)};
    const int64_t v = a->input->shape[1];
    return fi_sv_parallel_rows(ctx, a->batch, a->batch * v * 8, 0, NULL, scratch_bytes(v, 0),
                               sample_rows, &j);
}

/* ---------------------------------------------------------- filters */

typedef struct filter_job {
    const fi_filter_args *a;
    const fi_cpu_serving_kernels *k;
    fi_ops_isa isa;
} filter_job;

/* Logits outside the top-k of row r become -inf, in the row's own dtype;
 * the kept ones are copied bit for bit (left alone in place). */
static void mask_row(const filter_job *j, row_scratch *s, int64_t r) {
    const fi_tensor *in = j->a->input, *out = j->a->out;
    const int64_t v = in->shape[1];
    const float *x = fi_sv_load(j->isa, in, r * in->stride[0], in->stride[1], v, s->x);
    const int32_t k = param_i32(&j->a->top_k, r);
    uint32_t t = 0;
    bool all = k <= 0 || k >= v;
    if (!all) {
        const int32_t *list;
        int64_t m;
        t = kth_key(j->k, x, v, k, s, &list, &m);
    }
    const size_t es = fi_dtype_size(in->dtype);
    const uint32_t ninf32 = 0xff800000u;
    const uint16_t ninf16 = in->dtype == FI_DTYPE_F16 ? 0xfc00u : 0xff80u;
    const char *src = (const char *)in->data + r * in->stride[0] * (int64_t)es;
    char *dst = (char *)out->data + r * out->stride[0] * (int64_t)es;
    const bool same = src == dst && in->stride[1] == out->stride[1];
    for (int64_t i = 0; i < v; i++) {
        char *d = dst + i * out->stride[1] * (int64_t)es;
        if (!all && fi_sv_key(x[i]) < t) {
            if (es == 4)
                memcpy(d, &ninf32, 4);
            else
                memcpy(d, &ninf16, 2);
        } else if (!same) {
            memcpy(d, src + i * in->stride[1] * (int64_t)es, es);
        }
    }
}

static void filter_rows(void *arg, void *scratch, int64_t begin, int64_t end) {
    const filter_job *j = arg;
    const fi_filter_args *a = j->a;
    const fi_tensor *in = a->input, *out = a->out;
    const int64_t v = in->shape[1];
    row_scratch s = scratch_at(scratch, v);
    for (int64_t r = begin; r < end; r++) {
        if (a->op == FI_FILTER_TOP_K_MASK) {
            mask_row(j, &s, r);
            continue;
        }
        const float *x = fi_sv_load(j->isa, in, r * in->stride[0], in->stride[1], v, s.x);
        float *y = fi_sv_dest(out, r * out->stride[0], out->stride[1], s.w);
        float m;
        uint32_t kinds;
        j->k->stats(x, v, &m, &kinds);
        if (kinds) {
            for (int64_t i = 0; i < v; i++) y[i] = NAN;
        } else {
            float t = a->op == FI_FILTER_TOP_K_RENORM
                          ? top_k_threshold(j->k, x, v, param_i32(&a->top_k, r), &s)
                          : top_p_threshold(x, v, param_f32(&a->top_p, r), 0.0f, &s);
            double total = block_total(j->k, x, v, t);
            float inv = total > 0.0 ? (float)(1.0 / total) : 0.0f;
            j->k->masked_scale(y, x, t, inv, v);
        }
        fi_sv_store(j->isa, out, r * out->stride[0], out->stride[1], y, v);
    }
}

fi_status fi_cpu_filter(fi_context *ctx, const fi_filter_args *a, void *stream) {
    (void)stream;
    filter_job j = {a, fi_cpu_serving_for(ctx), fi_ops_isa_for(ctx)};
    const int64_t rows = a->input->shape[0], v = a->input->shape[1];
    return fi_sv_parallel_rows(ctx, rows, rows * v * 8, 0, NULL, scratch_bytes(v, 0), filter_rows,
                               &j);
}

/* ------------------------------------------------ chain speculative */

typedef struct spec_job {
    const fi_spec_args *a;
    const fi_cpu_serving_kernels *k;
    fi_ops_isa isa;
} spec_job;

/* Element [b, i, t] of a [B, n, V] probability tensor as f32. */
static float prob_at(const fi_tensor *p, int64_t b, int64_t i, int64_t t) {
    return fi_load_f32(p->data, p->dtype, b * p->stride[0] + i * p->stride[1] + t * p->stride[2]);
}

static int32_t *i32_at(const fi_tensor *t, int64_t i, int64_t j) {
    return (int32_t *)t->data + i * t->stride[0] + j * t->stride[1];
}

static void spec_rows(void *arg, void *scratch, int64_t begin, int64_t end) {
    const spec_job *j = arg;
    const fi_spec_args *a = j->a;
    const fi_tensor *dp = a->draft_probs, *tp = a->target_probs;
    const int64_t n = dp->shape[1], v = dp->shape[2];
    row_scratch s = scratch_at(scratch, v);
    for (int64_t b = begin; b < end; b++) {
        int32_t accepted = 0, emitted = -1;
        for (int64_t i = 0; i < n; i++) {
            int32_t tok = *i32_at(a->draft_ids, b, i);
            double u = fi_uniform(a->seed, a->offset, (uint32_t)b, (uint32_t)i);
            bool ok = u * (double)prob_at(dp, b, i, tok) < (double)prob_at(tp, b, i, tok);
            accepted += ok;
            if (!ok && emitted < 0) emitted = (int32_t)i;
        }
        if (emitted < 0) emitted = (int32_t)n;
        /* the token at position `emitted`: from max(target - draft, 0) after
         * a rejection, from the target (the bonus) after none */
        const float *t = fi_sv_load(j->isa, tp, b * tp->stride[0] + emitted * tp->stride[1],
                                    tp->stride[2], v, s.x);
        const float *w = t;
        if (emitted < n) {
            const float *d = fi_sv_load(j->isa, dp, b * dp->stride[0] + emitted * dp->stride[1],
                                        dp->stride[2], v, s.w);
            float *diff = s.w;
            for (int64_t x = 0; x < v; x++) {
                float e = t[x] - d[x];
                diff[x] = e > 0.0f ? e : 0.0f;
            }
            w = diff;
        }
        double u = fi_uniform(a->seed, a->offset, (uint32_t)b, (uint32_t)n);
        int32_t tok = 0;
        bool ok = draw(j->k, w, v, 0.0f, u, s.blocks, &tok);
        if (!ok && w != t) ok = draw(j->k, t, v, 0.0f, u, s.blocks, &tok);
        if (!ok) tok = 0;
        for (int64_t i = 0; i <= n; i++)
            *i32_at(a->out_ids, b, i) = i < emitted    ? *i32_at(a->draft_ids, b, i)
                                        : i == emitted ? tok
                                                       : -1;
        if (a->accepted) ((int32_t *)a->accepted->data)[b * a->accepted->stride[0]] += accepted;
        if (a->emitted) ((int32_t *)a->emitted->data)[b * a->emitted->stride[0]] += emitted;
    }
}

fi_status fi_cpu_chain_speculative(fi_context *ctx, const fi_spec_args *a, void *stream) {
    (void)stream;
    spec_job j = {a, fi_cpu_serving_for(ctx), fi_ops_isa_for(ctx)};
    const int64_t batch = a->draft_probs->shape[0], v = a->draft_probs->shape[2];
    return fi_sv_parallel_rows(ctx, batch, batch * v * 16, 0, NULL, scratch_bytes(v, 0), spec_rows,
                               &j);
}

/* ------------------------------------------------------------ top-k */

typedef struct topk_job {
    const fi_topk_args *a;
    const fi_cpu_serving_kernels *k;
    fi_ops_isa isa;
    int64_t cols; /* the longest row */
} topk_job;

/* Descending key, then ascending index: (key, ~index) packed, descending. */
static int pair_desc(const void *pa, const void *pb) {
    uint64_t x = *(const uint64_t *)pa, y = *(const uint64_t *)pb;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void topk_row(const topk_job *j, row_scratch *s, int64_t r) {
    const fi_topk_args *a = j->a;
    const fi_tensor *in = a->input;
    int64_t base, len, stride;
    if (a->indptr) {
        const int32_t *ip = a->indptr->data;
        const int64_t st = a->indptr->stride[0];
        base = ip[r * st] * in->stride[0];
        len = ip[(r + 1) * st] - ip[r * st];
        stride = in->stride[0];
    } else {
        base = r * in->stride[0];
        len = a->lengths ? ((const int32_t *)a->lengths->data)[r * a->lengths->stride[0]]
                         : in->shape[1];
        stride = in->stride[1];
    }
    const int32_t off =
        a->offsets ? ((const int32_t *)a->offsets->data)[r * a->offsets->stride[0]] : 0;
    const float *x = fi_sv_load(j->isa, in, base, stride, len, s->x);
    const int64_t kk = len < a->k ? len : a->k;
    int64_t got = 0;
    if (kk > 0) {
        const int32_t *list;
        int64_t m;
        uint32_t t = kth_key(j->k, x, len, kk, s, &list, &m);
        int64_t equal_left = kk;
        for (int64_t c = 0; c < m; c++)
            if (fi_sv_key(x[list ? list[c] : c]) > t) equal_left--;
        for (int64_t c = 0; c < m && got < kk; c++) {
            int64_t i = list ? list[c] : c;
            uint32_t key = fi_sv_key(x[i]);
            if (key > t || (key == t && equal_left-- > 0))
                s->pairs[got++] = (uint64_t)key << 32 | (uint32_t) ~(uint32_t)i;
        }
        qsort(s->pairs, (size_t)got, sizeof *s->pairs, pair_desc);
    }
    const size_t es = fi_dtype_size(in->dtype);
    for (int64_t c = 0; c < a->k; c++) {
        int32_t idx = -1;
        if (c < got) idx = (int32_t) ~(uint32_t)s->pairs[c];
        *i32_at(a->indices, r, c) = idx < 0 ? -1 : idx + off;
        if (!a->values) continue;
        char *d = (char *)a->values->data +
                  (r * a->values->stride[0] + c * a->values->stride[1]) * (int64_t)es;
        if (idx >= 0) {
            memcpy(d, (const char *)in->data + (base + idx * stride) * (int64_t)es, es);
        } else if (es == 4) {
            const uint32_t ninf = 0xff800000u;
            memcpy(d, &ninf, 4);
        } else {
            const uint16_t ninf = in->dtype == FI_DTYPE_F16 ? 0xfc00u : 0xff80u;
            memcpy(d, &ninf, 2);
        }
    }
}

static void topk_rows(void *arg, void *scratch, int64_t begin, int64_t end) {
    const topk_job *j = arg;
    row_scratch s = scratch_at(scratch, j->cols);
    for (int64_t r = begin; r < end; r++) topk_row(j, &s, r);
}

fi_status fi_cpu_top_k(fi_context *ctx, const fi_topk_args *a, void *stream) {
    (void)stream;
    topk_job j = {a, fi_cpu_serving_for(ctx), fi_ops_isa_for(ctx), 1};
    if (a->indptr) {
        const int32_t *ip = a->indptr->data;
        for (int64_t r = 0; r < a->rows; r++) {
            int64_t len = ip[(r + 1) * a->indptr->stride[0]] - ip[r * a->indptr->stride[0]];
            j.cols = len > j.cols ? len : j.cols;
        }
    } else if (a->input->shape[1] > 1) {
        j.cols = a->input->shape[1];
    }
    const int64_t bytes = a->rows * j.cols * 4;
    return fi_sv_parallel_rows(ctx, a->rows, bytes, 0, NULL, scratch_bytes(j.cols, a->k), topk_rows,
                               &j);
}
