/*
 * oracle_serving.c — fp64 references for the serving ops (oracle_serving.h).
 * Filters are computed from their definitions by sorting: what a radix
 * select must agree with.
 */
#include "oracle_serving.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void oracle_rmsnorm(int64_t rows, int64_t h, const double *x, const double *w, double eps,
                    bool gemma, double *out) {
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * h;
        double ss = 0.0;
        for (int64_t i = 0; i < h; i++) ss += xr[i] * xr[i];
        double inv = 1.0 / sqrt(ss / (double)h + eps);
        for (int64_t i = 0; i < h; i++)
            out[r * h + i] = xr[i] * inv * (gemma ? 1.0 + w[i] : w[i]);
    }
}

void oracle_layernorm(int64_t rows, int64_t h, const double *x, const double *g,
                      const double *b, double eps, double *out) {
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * h;
        double mean = 0.0, var = 0.0;
        for (int64_t i = 0; i < h; i++) mean += xr[i];
        mean /= (double)h;
        for (int64_t i = 0; i < h; i++) var += (xr[i] - mean) * (xr[i] - mean);
        double inv = 1.0 / sqrt(var / (double)h + eps);
        for (int64_t i = 0; i < h; i++) out[r * h + i] = (xr[i] - mean) * inv * g[i] + b[i];
    }
}

void oracle_gated_act(int kind, int64_t rows, int64_t d, const double *x, double *out) {
    const double pi = 3.14159265358979323846;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < d; i++) {
            double a = x[r * 2 * d + i], u = x[r * 2 * d + d + i], y;
            if (kind == 0) y = a / (1.0 + exp(-a));
            else if (kind == 1) y = 0.5 * a * (1.0 + erf(a / sqrt(2.0)));
            else y = 0.5 * a * (1.0 + tanh(sqrt(2.0 / pi) * (a + 0.044715 * a * a * a)));
            out[r * d + i] = y * u;
        }
}

void oracle_rope_cos_sin(int64_t r, bool neox, const double *x, const double *cs, double *y) {
    const int64_t half = r / 2;
    for (int64_t i = 0; i < half; i++) {
        int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        y[a] = x[a] * cs[i] - x[b] * cs[half + i];
        y[b] = x[b] * cs[i] + x[a] * cs[half + i];
    }
}

void oracle_softmax(int64_t rows, int64_t v, const double *x, const double *t, double *out) {
    for (int64_t r = 0; r < rows; r++) {
        double m = -INFINITY, sum = 0.0;
        for (int64_t i = 0; i < v; i++) m = fmax(m, x[r * v + i]);
        for (int64_t i = 0; i < v; i++) sum += exp((x[r * v + i] - m) / t[r]);
        for (int64_t i = 0; i < v; i++) out[r * v + i] = exp((x[r * v + i] - m) / t[r]) / sum;
    }
}

/* ------------------------------------------------------------ filters */

/* Indices of the kept p sorted by descending value. */
static const double *sort_key;

static int by_value_desc(const void *a, const void *b) {
    double x = sort_key[*(const int64_t *)a], y = sort_key[*(const int64_t *)b];
    return x < y ? 1 : x > y ? -1 : 0;
}

/* keep[i] &= (fewer than k values of rank above rank[i]), among keep:
 * walking the distinct ranks from the top, a group is kept while the
 * values above it number fewer than k. */
static void apply_top_k(int64_t v, const double *rank, int32_t k, bool *keep) {
    if (k <= 0 || k >= v) return;
    int64_t *order = malloc((size_t)v * sizeof *order), n = 0;
    for (int64_t i = 0; i < v; i++)
        if (keep[i]) order[n++] = i;
    sort_key = rank;
    qsort(order, (size_t)n, sizeof *order, by_value_desc);
    for (int64_t a = 0; a < n;) {
        int64_t e = a;
        while (e < n && rank[order[e]] == rank[order[a]]) e++;
        for (int64_t i = a; i < e; i++) keep[order[i]] = a < k;
        a = e;
    }
    free(order);
}

/* keep[i] &= (the kept mass of larger values < top_p x the kept mass). */
static void apply_top_p(int64_t v, const double *p, double top_p, bool *keep) {
    if (top_p >= 1.0) return;
    double total = 0.0;
    for (int64_t i = 0; i < v; i++) total += keep[i] ? p[i] : 0.0;
    int64_t *order = malloc((size_t)v * sizeof *order), n = 0;
    for (int64_t i = 0; i < v; i++)
        if (keep[i]) order[n++] = i;
    sort_key = p;
    qsort(order, (size_t)n, sizeof *order, by_value_desc);
    /* walk distinct values from the top: a value is kept while the mass
     * strictly above it is below top_p x total */
    double above = 0.0;
    for (int64_t a = 0; a < n;) {
        int64_t e = a;
        double group = 0.0;
        while (e < n && p[order[e]] == p[order[a]]) group += p[order[e++]];
        bool kept = above < top_p * total || a == 0;
        for (int64_t i = a; i < e; i++) keep[order[i]] = kept;
        above += group;
        a = e;
    }
    free(order);
}

int64_t oracle_filter(int64_t v, const double *p, const double *rank, int32_t top_k,
                      double top_p, double min_p, bool joint, bool *keep) {
    if (!rank) rank = p;
    for (int64_t i = 0; i < v; i++) keep[i] = true;
    if (min_p >= 0.0) {
        double mx = 0.0;
        for (int64_t i = 0; i < v; i++) mx = fmax(mx, p[i]);
        /* the threshold min_p x max is an f32 product (docs/SEMANTICS.md) */
        double t = (double)((float)min_p * (float)mx);
        for (int64_t i = 0; i < v; i++) keep[i] = p[i] >= t;
    }
    if (joint) {
        bool *kp = malloc((size_t)v);
        memcpy(kp, keep, (size_t)v);
        apply_top_k(v, rank, top_k, keep);
        apply_top_p(v, p, top_p, kp);
        for (int64_t i = 0; i < v; i++) keep[i] = keep[i] && kp[i];
        free(kp);
    } else {
        apply_top_k(v, rank, top_k, keep);
        apply_top_p(v, p, top_p, keep);
    }
    int64_t n = 0;
    for (int64_t i = 0; i < v; i++) n += keep[i];
    return n;
}

int64_t oracle_draw(int64_t v, const double *p, const bool *keep, double u, double *margin) {
    double total = 0.0;
    for (int64_t i = 0; i < v; i++) total += keep[i] ? p[i] : 0.0;
    *margin = 1.0;
    if (!(total > 0.0)) return -1;
    double target = u * total, cum = 0.0;
    int64_t pick = -1;
    for (int64_t i = 0; i < v; i++) {
        if (!keep[i] || !(p[i] > 0.0)) continue;
        *margin = fmin(*margin, fabs(cum - target) / total);
        cum += p[i];
        *margin = fmin(*margin, fabs(cum - target) / total);
        if (pick < 0 && cum > target) pick = i;
        if (pick >= 0) break;
    }
    if (pick < 0) /* target at the very end: the last kept token */
        for (int64_t i = v - 1; i >= 0 && pick < 0; i--)
            if (keep[i] && p[i] > 0.0) pick = i;
    return pick;
}

/* --------------------------------------------------------------- RNG */

void oracle_philox(const uint32_t ctr[4], uint64_t seed, uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        if (round) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
        uint64_t a = (uint64_t)c0 * 0xD2511F53u, b = (uint64_t)c2 * 0xCD9E8D57u;
        uint32_t n0 = (uint32_t)(b >> 32) ^ c1 ^ k0, n1 = (uint32_t)b;
        uint32_t n2 = (uint32_t)(a >> 32) ^ c3 ^ k1, n3 = (uint32_t)a;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

double oracle_uniform(uint64_t seed, uint64_t offset, uint32_t row, uint32_t draw) {
    uint32_t ctr[4] = {(uint32_t)offset, (uint32_t)(offset >> 32), row, draw}, r[4];
    oracle_philox(ctr, seed, r);
    return (double)((((uint64_t)r[0] << 32) | r[1]) >> 11) / 9007199254740992.0;
}

void oracle_chain_spec(int64_t n, int64_t v, const double *draft, const int32_t *ids,
                       const double *target, uint64_t seed, uint64_t offset, uint32_t b,
                       int32_t *out_ids, int32_t *accepted, int32_t *emitted, double *margin) {
    *accepted = 0;
    *emitted = -1;
    for (int64_t i = 0; i < n; i++) {
        double u = oracle_uniform(seed, offset, b, (uint32_t)i);
        bool ok = u * draft[i * v + ids[i]] < target[i * v + ids[i]];
        *accepted += ok;
        if (!ok && *emitted < 0) *emitted = (int32_t)i;
    }
    if (*emitted < 0) *emitted = (int32_t)n;
    const int64_t j = *emitted;
    double *w = malloc((size_t)v * sizeof *w);
    bool *keep = malloc((size_t)v);
    double mass = 0.0;
    for (int64_t x = 0; x < v; x++) {
        w[x] = j < n ? fmax(target[j * v + x] - draft[j * v + x], 0.0) : target[j * v + x];
        keep[x] = true;
        mass += w[x];
    }
    if (!(mass > 0.0))
        for (int64_t x = 0; x < v; x++) w[x] = target[j * v + x];
    int64_t tok = oracle_draw(v, w, keep, oracle_uniform(seed, offset, b, (uint32_t)n), margin);
    for (int64_t i = 0; i <= n; i++)
        out_ids[i] = i < j ? ids[i] : i == j ? (int32_t)(tok < 0 ? 0 : tok) : -1;
    free(w);
    free(keep);
}

/* ------------------------------------------------------------ top-k */

static const double *topk_x;

static int topk_cmp(const void *a, const void *b) {
    int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    double x = topk_x[i], y = topk_x[j];
    bool nx = isnan(x), ny = isnan(y);
    if (nx != ny) return nx ? -1 : 1;
    if (!nx && x != y) return x > y ? -1 : 1;
    return i < j ? -1 : 1;
}

void oracle_top_k(int64_t len, const double *x, int32_t k, int32_t *idx) {
    int64_t *order = malloc((size_t)(len + 1) * sizeof *order);
    for (int64_t i = 0; i < len; i++) order[i] = i;
    topk_x = x;
    qsort(order, (size_t)len, sizeof *order, topk_cmp);
    for (int32_t c = 0; c < k; c++) idx[c] = c < len ? (int32_t)order[c] : -1;
    free(order);
}

/* The chi-square bound at p = 1e-6 for df degrees of freedom (Wilson and
 * Hilferty's normal approximation, z = 4.753). */
double oracle_chi2_bound(int64_t df) {
    double d = (double)df, z = 4.753, a = 2.0 / (9.0 * d);
    double c = 1.0 - a + z * sqrt(a);
    return d * c * c * c;
}

/* Whether counts[v] of n draws fit the distribution p over keep: no draw
 * outside it, chi-square under the bound. *chi2 = INFINITY for a draw
 * outside. */
bool oracle_fits(const int64_t *counts, int64_t n, int64_t v, const double *p, const bool *keep,
                 double *chi2) {
    double mass = 0.0;
    int64_t support = 0;
    for (int64_t i = 0; i < v; i++)
        if (keep[i] && p[i] > 0.0) mass += p[i], support++;
    double x = 0.0;
    for (int64_t i = 0; i < v; i++) {
        if (!(keep[i] && p[i] > 0.0)) {
            if (counts[i]) {
                *chi2 = INFINITY;
                return false;
            }
            continue;
        }
        double e = (double)n * p[i] / mass;
        x += ((double)counts[i] - e) * ((double)counts[i] - e) / e;
    }
    *chi2 = x;
    return support <= 1 || x < oracle_chi2_bound(support - 1);
}
