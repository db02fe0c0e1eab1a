/*
 * oracle_serving.h — fp64 references for the serving ops (norms, gated
 * activations, softmax, the sampling filters and draws, chain speculative
 * sampling, top-k), written from docs/SEMANTICS.md "Serving ops" with
 * plain loops and sorts, independently of the library: its own Philox
 * too. Arrays are contiguous row-major doubles.
 */
#ifndef FI_TESTS_ORACLE_SERVING_H
#define FI_TESTS_ORACLE_SERVING_H

#include "flashinfer.h"

#include <stdbool.h>
#include <stdint.h>

/* out = x / sqrt(mean x^2 + eps) * (gemma ? 1 + w : w), x [rows][h]. */
void oracle_rmsnorm(int64_t rows, int64_t h, const double *x, const double *w, double eps,
                    bool gemma, double *out);
/* out = (x - mean) / sqrt(var + eps) * g + b (biased variance). */
void oracle_layernorm(int64_t rows, int64_t h, const double *x, const double *g,
                      const double *b, double eps, double *out);
/* out [rows][d] = act(x[:, :d]) * x[:, d:], kind 0 silu, 1 gelu, 2 gelu_tanh. */
void oracle_gated_act(int kind, int64_t rows, int64_t d, const double *x, double *out);
/* x [r] turned by one row of a cos/sin cache, cs [r] = (cos [r/2], sin
 * [r/2]): pair i is (x[i], x[i + r/2]) when neox, else (x[2i], x[2i+1]);
 * (a, b) -> (a cos - b sin, b cos + a sin). */
void oracle_rope_cos_sin(int64_t r, bool neox, const double *x, const double *cs, double *y);
/* softmax(x / t) per row, x [rows][v]. */
void oracle_softmax(int64_t rows, int64_t v, const double *x, const double *t, double *out);

/* The filters of one row of weights p[v] >= 0 (docs/SEMANTICS.md): keep[i]
 * set where p[i] survives. top_k <= 0 or >= v: off; top_p >= 1: off;
 * min_p < 0: off. `rank` (NULL: p) orders top-k (the logits of a row
 * sampled from logits). joint: both filters on the whole row; else top-k
 * first and top-p over what it kept. Returns the kept count. */
int64_t oracle_filter(int64_t v, const double *p, const double *rank, int32_t top_k,
                      double top_p, double min_p, bool joint, bool *keep);

/* The token an inverse CDF over the kept p in index order gives for u in
 * [0, 1), and in *margin the distance of u x (kept mass) to the nearest
 * boundary between tokens, relative to the mass (a library that sums in
 * another order may differ only within rounding of a boundary). -1 when
 * nothing is kept with positive mass. */
int64_t oracle_draw(int64_t v, const double *p, const bool *keep, double u, double *margin);

/* Philox4x32-10 as the library's draws define it: key = seed, counter =
 * (offset low, offset high, row, draw); uniform = first 53 bits / 2^53. */
void oracle_philox(const uint32_t ctr[4], uint64_t seed, uint32_t out[4]);
double oracle_uniform(uint64_t seed, uint64_t offset, uint32_t row, uint32_t draw);

/* Chain speculative sampling of one request with the uniforms of row b:
 * draft [n][v], ids [n], target [n+1][v]. Writes out_ids [n+1], *accepted,
 * *emitted; *margin as oracle_draw's for the final draw. */
void oracle_chain_spec(int64_t n, int64_t v, const double *draft, const int32_t *ids,
                       const double *target, uint64_t seed, uint64_t offset, uint32_t b,
                       int32_t *out_ids, int32_t *accepted, int32_t *emitted, double *margin);

/* The k largest of x[len] by (value desc, index asc), NaN above all:
 * idx[k] (-1 past len). */
void oracle_top_k(int64_t len, const double *x, int32_t k, int32_t *idx);

/* The chi-square bound at p = 1e-6 for df degrees of freedom. */
double oracle_chi2_bound(int64_t df);
/* Whether counts[v] of n draws fit the distribution p over keep: no draw
 * outside it, chi-square under the bound (*chi2 = INFINITY for a draw
 * outside). */
bool oracle_fits(const int64_t *counts, int64_t n, int64_t v, const double *p, const bool *keep,
                 double *chi2);

#endif /* FI_TESTS_ORACLE_SERVING_H */
