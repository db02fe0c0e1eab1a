/*
 * ops_cases.h — what the two tests of the standalone ops share: the CPU one
 * (tests/test_ops.c) and the CUDA one (tests/gpu/test_cuda_ops.c) build the
 * same inputs from the same seeds and check the outputs the same way, so a
 * case name means the same inputs on either backend.
 *
 * Views are host memory (tests/util.h buffers); the CUDA test mirrors them on
 * the device itself. Every check returns 1 when it holds, else 0 after a
 * tu_note() saying what differed.
 */
#ifndef FI_TESTS_OPS_CASES_H
#define FI_TESTS_OPS_CASES_H

#include "flashinfer.h"
#include "util.h"

#include <stdint.h>

/* f32, f16, bf16: the dtypes the ops' float inputs and outputs are crossed over. */
extern const fi_dtype ops_float_dtypes[3];

/* ------------------------------------------------------------------ views */

/* A poisoned view of `shape`. Not strided: contiguous (tu_buf_alloc).
 * Strided: the dims laid out in memory in a random order, each padded by
 * 0-2 elements, the innermost 1 or 2 elements apart, so rows need not be
 * contiguous (the ops' element path). Returns 0 on success. */
int ops_view_alloc(tu_buf *b, fi_dtype dtype, int32_t ndim, const int64_t *shape, int strided,
                   tu_rng *rng);

/* A malloc'd copy of b's whole allocation, to check inputs are unchanged. */
void *ops_snapshot(const tu_buf *b);
int ops_same_as_snapshot(const char *what, const tu_buf *b, const void *snap);

/* Fill every byte of b's allocation with random bits (an old KV cache). */
void ops_fill_bytes(tu_rng *rng, const tu_buf *b);
/* The view t of buffer b moved onto `copy`, a copy of b's bytes. */
fi_tensor ops_view_on(const fi_tensor *t, const tu_buf *b, void *copy);

/* ----------------------------------------------------------------- checks */

/* The view against ref (row-major doubles) with atol = rtol = `rtol`. */
int ops_check_view(const char *what, const fi_tensor *t, const double *ref, double rtol);
/* No byte of b outside its view changed from the poison. */
int ops_check_outside(const char *what, const tu_buf *b);
/* The call returned FI_OK (else notes the status and fi_last_error()). */
int ops_check_ok(fi_status st, const char *call);

/* ------------------------------------------------------------------ merge */

/* The LSE of row r of state `which` (0 = a, 1 = b): finite in [-20, 20), or
 * -inf in a pattern over r % 8 that gives every combination (a only, b only,
 * both) across the rows of a case. */
double ops_lse_value(tu_rng *rng, int64_t r, int which);
/* Over rows 0..9 of two states (after ops_fill_state), every head, the
 * non-finite cases of docs/SEMANTICS.md: LSE +inf or NaN in a, a's LSE
 * -inf over a NaN O (never read), a NaN in a's O at a weight that
 * underflows, +inf in a's O, +inf against -inf, values near the dtype's
 * largest of the dtypes and `out_dtype` (no overflow to infinity), both
 * LSE -inf, LSE +inf in b. Rows past 9 keep their values. For
 * fi_merge_states pass states 0 and 1 of a [n, S, H, D] tensor as a and b. */
void ops_put_nonfinite_states(const fi_tensor *va, const fi_tensor *sa, const fi_tensor *vb,
                              const fi_tensor *sb, fi_dtype out_dtype);
/* State k of a [n, S, H, D] (or [n, S, H]) tensor as [n, H, D] ([n, H]). */
fi_tensor ops_state_view(const fi_tensor *t, int64_t k);
/* The view against ref (row-major doubles): a NaN reference wants a NaN,
 * an infinity the same infinity, a finite value within `rtol` abs+rel. */
int ops_check_view_classes(const char *what, const fi_tensor *t, const double *ref, double rtol);

/* Fill v uniformly in [-2, 2) and s [rows] by ops_lse_value; with
 * poison_empty, the rows of v whose LSE is -inf become NaN: a state that
 * contributes nothing must not be read. */
void ops_fill_state(tu_rng *rng, const fi_tensor *v, const fi_tensor *s, int which,
                    int poison_empty);

/* The [n, states, heads, dim] v and [n, states, heads] s of
 * fi_merge_states: v uniform in [-2, 2); per (token, head), rows with every
 * state -inf, with one finite state, and with about a quarter of them -inf.
 * Empty states' O is NaN. */
void ops_fill_states(tu_rng *rng, const fi_tensor *v, const fi_tensor *s);

/* ----------------------------------------------------------------- append */

typedef enum ops_append_shape { APPEND_DECODE, APPEND_PREFILL, APPEND_MIXED } ops_append_shape;

/* A page table for `batch` requests after appending: old and new lengths
 * per request (decode: 0-40 old + 1; prefill: 0 old + 0..max_tokens;
 * mixed: both random); kv_indices a random subset of the cache's pages,
 * with 1-4 spare pages nobody owns; the appended tokens shuffled (any order
 * is valid). */
typedef struct ops_append_table {
    int32_t batch, pages, nnz, num_indices;
    int32_t *indptr, *indices, *last, *old_len, *new_len;
    int32_t *batch_indices, *positions; /* [nnz], shuffled */
} ops_append_table;

/* Returns 0 on success; free with ops_table_free either way. */
int ops_table_make(tu_rng *rng, ops_append_shape shape, int32_t batch, int32_t page_size,
                   int32_t max_tokens, ops_append_table *t);
void ops_table_free(ops_append_table *t);

/* ------------------------------------------------------------------- rope */

/* Compare the rows [tokens][heads][dim] of `out` of tokens with a position
 * (pos[tok] >= 0) to ref with atol 2 rtol, rtol; the rows of tokens without
 * one must be bit for bit as in `before` (a snapshot of out's allocation).
 * `unpositioned` names those tokens in the failure note. */
int ops_check_rope_out(const char *what, const tu_buf *out, const void *before,
                       const double *ref, const int64_t *pos, double rtol,
                       const char *unpositioned);

#endif /* FI_TESTS_OPS_CASES_H */
