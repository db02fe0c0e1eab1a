/*
 * oracle_ops.h — fp64 references for the standalone ops: merging attention
 * states, appending to a paged KV cache, RoPE; and a one-head attention that
 * produces the states the merge property is checked with. Plain loops over
 * contiguous row-major double arrays (the append reference works on the
 * test's tensors, since it copies bits).
 */
#ifndef FI_TESTS_ORACLE_OPS_H
#define FI_TESTS_ORACLE_OPS_H

#include "flashinfer.h"

#include <stdint.h>

/* Two states to one: va, vb, vo [n][H][D]; sa, sb, so [n][H] (LSE base 2).
 * A state whose LSE is -inf is not read; none left gives O = 0, LSE -inf; a
 * state with LSE NaN or +inf makes the row's O and LSE NaN; the others are
 * read whatever their weight, in IEEE arithmetic (docs/SEMANTICS.md). */
void oracle_merge_state(int64_t n, int64_t heads, int64_t dim, const double *va,
                        const double *sa, const double *vb, const double *sb,
                        double *vo, double *so);

/* num_states states to one: v [n][S][H][D], s [n][S][H]; vo [n][H][D],
 * so [n][H]. Same rules as oracle_merge_state. */
void oracle_merge_states(int64_t n, int64_t states, int64_t heads, int64_t dim,
                         const double *v, const double *s, double *vo, double *so);

/* One head's attention state over the keys j with use[j] != 0 (use NULL:
 * all keys): q [nq][D], k [nk][D], v [nk][Dv]; o [nq][Dv] normalised, lse
 * [nq] = log2 sum_j exp(sm_scale q.k_j). No key: o = 0, lse = -inf. */
void oracle_attention_state(int64_t nq, int64_t nk, int64_t dim, int64_t dim_v,
                            const double *q, const double *k, const double *v,
                            const uint8_t *use, double sm_scale, double *o, double *lse);

/* Paged KV append: for each token n, request batch_indices[n] at position
 * positions[n] goes to page kv_indices[kv_indptr[b] + p / page_size], slot
 * p % page_size; rows [nnz, H, D] are copied bit for bit into `cache`
 * (NHD [pages, ps, H, D] or HND [pages, H, ps, D], any strides). */
void oracle_append_paged(const fi_tensor *rows, const fi_tensor *cache, fi_kv_layout layout,
                         const int32_t *batch_indices, const int32_t *positions,
                         const int32_t *kv_indices, const int32_t *kv_indptr);

/* Frequency of pair i, FlashInfer's formula: theta^(-2i/rotary_dim), scaled
 * by 1/rope_scale, or with LLaMA-3.1 smoothing between the two. */
double oracle_rope_freq(const fi_rope_params *p, int32_t rotary_dim, int32_t i);

/* Position of every token from indptr [B+1] and offsets [B]: token t of
 * request b is at offsets[b] + t - indptr[b]; -1 for tokens past indptr[B]. */
void oracle_rope_positions(int32_t batch, const int32_t *indptr, const int32_t *offsets,
                           int64_t nnz, int64_t *pos);

/* RoPE of x [nnz][H][D] into out (same shape); rotary_dim 0 = D. Rows of a
 * token with pos < 0 are not written. */
void oracle_rope(const fi_rope_params *p, int64_t nnz, int64_t heads, int64_t dim,
                 const double *x, const int64_t *pos, double *out);

#endif /* FI_TESTS_ORACLE_OPS_H */
