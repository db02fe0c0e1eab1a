/*
 * fuzz.h — what the libFuzzer targets of tests/fuzz/ share: reading the
 * input as a stream of choices, the CPU contexts (every SIMD level this
 * machine runs), test buffers, and the checks every target makes of a call:
 * a known status, a message on failure, and (on the small cases the targets
 * check) the fp64 oracle's answer. A failed check is a finding: it prints
 * what differed and traps.
 *
 * Inputs past their end read as zeros, so every input is valid and short
 * ones are the small, common cases. The "huge" choices reach the bounds the
 * API accepts (INT32_MAX bounds, block sizes up to 2^20) with small batches,
 * so that sizes are computed from them but never allocated.
 */
#ifndef FI_FUZZ_H
#define FI_FUZZ_H

#include "flashinfer.h"
#include "../util.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fz {
    const uint8_t *p;
    size_t n;
} fz;

static inline uint32_t fz_u32(fz *f) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        v = v << 8 | (f->n ? *f->p : 0);
        if (f->n) f->p++, f->n--;
    }
    return v;
}

static inline uint8_t fz_u8(fz *f) {
    uint8_t v = f->n ? *f->p : 0;
    if (f->n) f->p++, f->n--;
    return v;
}

/* An integer in [lo, hi] (hi >= lo). */
static inline int64_t fz_range(fz *f, int64_t lo, int64_t hi) {
    uint64_t span = (uint64_t)(hi - lo) + 1;
    uint64_t v = (uint64_t)fz_u32(f) << 32 | fz_u32(f);
    return span ? lo + (int64_t)(v % span) : lo + (int64_t)v;
}

/* One of n choices from one byte. */
static inline int fz_pick(fz *f, int n) { return fz_u8(f) % n; }

/* True with probability 1 / n. */
static inline int fz_one_in(fz *f, int n) { return fz_u8(f) % n == 0; }

/* A bound: mostly small, sometimes anything up to INT32_MAX. */
static inline int32_t fz_bound(fz *f, int32_t small) {
    switch (fz_pick(f, 8)) {
    case 0: return (int32_t)fz_range(f, 0, INT32_MAX);
    case 1: return INT32_MAX - (int32_t)fz_range(f, 0, 2);
    case 2: return (int32_t)fz_range(f, -3, 0);
    default: return (int32_t)fz_range(f, 1, small);
    }
}

/* A CPU context at one of the SIMD levels this machine runs (made once). */
fi_context *fz_context(fz *f);

/* A tensor of the test (tests/util.h buffers: guard pages on both sides)
 * filled with uniform values in [-a, a]. */
int fz_tensor(tu_buf *b, fi_dtype dtype, int32_t ndim, const int64_t *shape, tu_rng *rng,
              double a);

/* The call returned a status the header names, and a message with it. */
void fz_check_status(fi_status st, const char *call);

/* Element-wise: NaN reference wants NaN, infinite the same infinity, finite
 * within tol abs + rel. Traps on a difference (after printing it). */
void fz_compare(const char *what, const double *got, const double *ref, int64_t n, double tol);

/* A finding: print and trap. */
#define FZ_FAIL(...)                                                  \
    do {                                                              \
        fprintf(stderr, "fuzz finding: " __VA_ARGS__);                \
        fprintf(stderr, "\n");                                        \
        __builtin_trap();                                             \
    } while (0)

/* The tolerance of an output against the fp64 oracle: the loosest dtype's,
 * with room for the longest sums these targets make. */
static inline double fz_tol(fi_dtype q, fi_dtype kv, fi_dtype o) {
    fi_dtype ds[3] = {q, kv, o};
    double t = 1e-4;
    for (int i = 0; i < 3; i++) {
        double d = ds[i] == FI_DTYPE_F16 ? 4e-3 : ds[i] == FI_DTYPE_BF16 ? 3e-2
                 : (ds[i] == FI_DTYPE_E4M3 || ds[i] == FI_DTYPE_E5M2) ? 4e-3 : 1e-4;
        if (d > t) t = d;
    }
    return t;
}

#endif /* FI_FUZZ_H */

/* ------------------------------------------------------------- problems */

#define FZ_MAX_B 8

/* One attention batch and its tensors, as small as the fuzz cases are:
 * paged (page ids a random permutation of the pages plus spares; `share`
 * makes neighbours begin with the same pages, as shared prompts do) or
 * ragged, a packed custom mask when params ask for one. */
typedef struct fz_problem {
    int32_t B;
    int32_t qo_indptr[FZ_MAX_B + 1], kv_indptr[FZ_MAX_B + 1], last[FZ_MAX_B];
    int32_t *indices;
    int32_t num_pages;   /* pages (paged) or rows (ragged) the K/V tensors hold */
    int64_t mask_bytes;
    fi_batch batch;
    tu_buf q, k, v, o, lse, mask;
} fz_problem;

int fz_problem_make(const fi_attention_params *p, int32_t B, const int32_t *qo, const int32_t *kv,
                    int share, tu_rng *rng, fz_problem *pb);
fi_run_args fz_problem_args(const fz_problem *pb);
/* O and LSE against oracle_attention (traps on a difference). */
void fz_problem_check(const fi_attention_params *p, const fz_problem *pb, const char *what);
void fz_problem_free(fz_problem *pb);

/* Model-level params from the input: heads, dims, dtypes, masks and
 * variants of every kind the API takes (some invalid on purpose). */
void fz_params(fz *f, fi_attention_params *p, float *slopes);
/* The start of an attention target: a context, then params from the input. */
static inline fi_context *fz_attention(fz *f, fi_attention_params *p, float *slopes) {
    fi_context *ctx = fz_context(f);
    fz_params(f, p, slopes);
    return ctx;
}
/* Whether the oracle checks runs of these params (the dtypes and encodings
 * it and the tolerances cover). */
int fz_checkable(const fi_attention_params *p);
