/*
 * util.h — what every C test shares: a seeded random generator, dtype
 * conversions written independently of the library's, test-owned buffers
 * (guard pages, poisoning, padded strides), comparison with tolerances,
 * command-line filters and pass/fail/skip counting by category.
 *
 * Only the public header is used; nothing here knows the library's
 * internals, so a bug there cannot hide behind a shared helper.
 */
#ifndef FI_TESTS_UTIL_H
#define FI_TESTS_UTIL_H

#include "flashinfer.h"

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define TU_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TU_PRINTF(a, b)
#endif

/* ------------------------------------------------------------------ random */

/* splitmix64: small, seedable, the same sequence on every machine. */
typedef struct tu_rng {
    uint64_t state;
} tu_rng;

void tu_rng_seed(tu_rng *rng, uint64_t seed);
uint64_t tu_rng_next(tu_rng *rng);
double tu_rng_uniform(tu_rng *rng);                   /* [0, 1) */
double tu_rng_range(tu_rng *rng, double lo, double hi); /* [lo, hi) */
int32_t tu_rng_int(tu_rng *rng, int32_t lo, int32_t hi); /* [lo, hi] */
double tu_rng_normal(tu_rng *rng);                    /* N(0, 1) */

/* FNV-1a of a string: a per-case seed derived from the case name. */
uint64_t tu_hash(const char *s);

/* ----------------------------------------------------------------- dtypes */

/* Round-to-nearest-even encoders and exact decoders. E4M3 is the "FN"
 * variant (no infinities, S.1111.111 is NaN; out-of-range values saturate
 * to +-448 here); E5M2 has infinities like f16. */
uint16_t tu_f32_to_f16(float x);
float tu_f16_to_f32(uint16_t h);
uint16_t tu_f32_to_bf16(float x);
float tu_bf16_to_f32(uint16_t h);
uint8_t tu_f32_to_e4m3(float x);
float tu_e4m3_to_f32(uint8_t b);
uint8_t tu_f32_to_e5m2(float x);
float tu_e5m2_to_f32(uint8_t b);

size_t tu_dtype_size(fi_dtype dtype);     /* 0 for an unknown dtype */
/* The tolerance an output of `dtype` gets against an fp64 reference for
 * values of size ~1, used as both atol and rtol: 1e-3 for f16, 1e-2 for
 * bf16, 1e-5 otherwise (f32: accumulation order only). */
double tu_dtype_tol(fi_dtype dtype);
const char *tu_dtype_name(fi_dtype dtype); /* "f32", "f16", "bf16", "e4m3" ... */
/* x rounded to what `dtype` can hold (f32/f16/bf16/e4m3/e5m2). */
double tu_round(fi_dtype dtype, double x);
/* Element i (in elements from base) of a buffer of `dtype`, as double. */
double tu_load(const void *base, fi_dtype dtype, int64_t i);
/* Store x, rounded to `dtype`, as element i of a buffer. */
void tu_store(void *base, fi_dtype dtype, int64_t i, double x);

/* ---------------------------------------------------------------- tensors */

/* Element offset of index idx[ndim] in a strided tensor. */
int64_t tu_offset(const fi_tensor *t, const int64_t *idx);
double tu_get(const fi_tensor *t, const int64_t *idx);
void tu_set(const fi_tensor *t, const int64_t *idx, double x);
/* Elements of the view (product of the shape). */
int64_t tu_numel(const fi_tensor *t);
/* The view's elements as doubles, row-major over its shape, whatever its
 * strides: a malloc'd array to free (NULL if out of memory; a 1-element
 * array for an empty view), ready for tu_compare against a reference. */
double *tu_view_read(const fi_tensor *t);
/* Set element i of the view, counted row-major over its shape, to x
 * (rounded to its dtype as tu_store does). */
void tu_view_set(const fi_tensor *t, int64_t i, double x);

/* Memory a test owns, viewed as an fi_tensor. The allocation sits right
 * before a PROT_NONE guard page (and after one), so a read past either end
 * faults even without ASan (which reports the fault as a SEGV with a stack). */
typedef struct tu_buf {
    void *base;      /* first byte of the usable allocation */
    size_t bytes;    /* usable bytes (every element of every padded stride) */
    void *map;       /* the mapping (or malloc block) to release */
    size_t map_bytes;
    fi_tensor t;     /* the view */
} tu_buf;

/* Contiguous row-major [shape]. Returns 0 on success. */
int tu_buf_alloc(tu_buf *b, fi_dtype dtype, int32_t ndim, const int64_t *shape);
/* Row-major with padded strides: dimension d occupies shape[d] + pad[d]
 * elements in memory (pad may be NULL = 0), so the view is non-contiguous
 * whenever an inner pad is non-zero. The view starts at element 0. */
int tu_buf_alloc_padded(tu_buf *b, fi_dtype dtype, int32_t ndim,
                        const int64_t *shape, const int64_t *pad);
/* Raw bytes (for hand-built views and bad-input tests), 16-byte aligned. */
int tu_buf_alloc_bytes(tu_buf *b, size_t bytes);
/* Raw bytes aligned to `align` (a power of two) and ending exactly at the
 * trailing guard page when bytes is a multiple of align: reading even one
 * element past the end faults. */
int tu_buf_alloc_tail(tu_buf *b, size_t bytes, size_t align);
void tu_buf_free(tu_buf *b);

/* Fill every byte of the allocation with 0xFF: NaN in f32, f16 and bf16. */
void tu_buf_poison(tu_buf *b);
/* Bytes of the allocation outside the view's elements that are no longer
 * 0xFF (a write through the wrong stride). Call after tu_buf_poison + run. */
int64_t tu_buf_touched_outside(const tu_buf *b);

/* Fill the view with uniform values in [lo, hi), rounded to its dtype. For
 * FP8 the stored value is the rounded x / scale (scale 0 means 1). */
void tu_fill_uniform(tu_rng *rng, const fi_tensor *t, double lo, double hi,
                     double scale);

/* ------------------------------------------------------------- comparison */

typedef struct tu_cmp {
    int64_t n;           /* elements compared */
    int64_t bad;         /* elements out of tolerance (NaN included) */
    int64_t nan;         /* NaN in the result where the reference is not NaN */
    int64_t worst;       /* index of the largest error/bound ratio */
    double worst_got, worst_ref;
    double max_abs_err;  /* over finite pairs */
    double max_ratio;    /* max |got - ref| / (atol + rtol |ref|) */
} tu_cmp;

/* Element i passes iff got and ref are the same infinity, or both finite and
 * |got - ref| <= atol + rtol * |ref|. A NaN never passes. Returns c->bad. */
int64_t tu_compare(const double *got, const double *ref, int64_t n,
                   double atol, double rtol, tu_cmp *c);

/* --------------------------------------------------- options and counting */

#define TU_MAX_FILTERS 8

typedef struct tu_options {
    const char *backend;                   /* NULL = every backend */
    const char *filter[TU_MAX_FILTERS];    /* a case runs if it contains any */
    int32_t num_filters;
    int32_t quick;                         /* representative subset */
    int32_t verbose;                       /* -v: print every case */
    int32_t list;                          /* --list: print names, run nothing */
    int32_t has_seed;                      /* --seed N given */
    uint64_t seed;
} tu_options;

extern tu_options tu_opt;

/* Parse --backend NAME, --filter SUBSTR (repeatable), --quick, -v, --list,
 * --seed N, --help. Unknown options print usage and return non-zero. */
int tu_parse_args(int argc, char **argv, const char *program_help);
/* Whether a case named `name` passes the --filter options. */
int tu_selected(const char *name);
/* Whether case `name` runs: selected by the filters, and not --list (which
 * prints the name instead). */
int tu_begin_case(const char *name);
/* Whether the backend called `name` ("cpu", "cuda") passes --backend. */
int tu_backend_selected(const char *name);

/* The CPU SIMD levels as the backends of case names, for tests that run
 * every case on each: index 0 "cpu-generic", 1 "cpu-avx2", 2 "cpu-avx512"
 * (fi_context_options.cpu_simd "generic", "avx2", "avx512"). A test may
 * spread its cases over the levels by `index`. */
#define TU_NUM_CPU_BACKENDS 3
typedef struct tu_cpu_backend {
    const char *name; /* in case names */
    const char *simd;
    fi_context *ctx; /* NULL when skipped */
    int index;
} tu_cpu_backend;

/* Fill *be for level `index` and create its context with `num_threads`
 * threads. Returns 0 if it is ready; otherwise ctx is NULL, the line
 * "skip NAME: why" is printed (the level not built or not on this CPU, or
 * "not selected" when --backend excludes "cpu") and -1 is returned. */
int tu_cpu_backend_open(tu_cpu_backend *be, int index, int32_t num_threads);

/* The seed of a case: --seed if given, else a hash of its name. */
uint64_t tu_case_seed(const char *name);

typedef enum tu_result { TU_PASS = 0, TU_FAIL = 1, TU_SKIP = 2 } tu_result;

/* Count one case under `category`; prints FAIL lines always, PASS/SKIP with
 * -v. `name` should be enough to rerun it with --filter. */
void tu_record(const char *category, const char *name, tu_result result);
/* Printf-style detail for the current failure (indented under its line). */
void tu_note(const char *fmt, ...) TU_PRINTF(1, 2);
/* Print the table of counts by category, then one "tu-skip N REASON" line
 * per reason for skips (a skipped case's first note line) and
 * "tu-summary passed=N failed=N skipped=N" (read by tests/run.sh); returns
 * the process exit code (1 if any case failed, else 0). */
int tu_summary(const char *title);
/* A bad-input check: status `got` must be `want` and, unless needle is
 * NULL, fi_last_error() must contain `needle`. Returns 0 if both hold, else
 * 1 after a tu_note naming `what`, so checks accumulate as
 * fail |= tu_expect_status(...). */
int tu_expect_status(fi_status got, fi_status want, const char *needle, const char *what);
/* Total failures so far. */
int64_t tu_failures(void);

/* Point the kernel cache ($FLASHINFER_CACHE_DIR) of this process at a fresh
 * temporary directory, removed at exit, so tests neither read nor fill the
 * user's cache; $FI_TEST_CACHE_DIR names a directory to use (and keep)
 * instead, to reuse compiled kernels across runs. Returns the directory. */
const char *tu_temp_cache_dir(void);
/* Name the case now running (NULL when none): if the process crashes
 * (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) its name and seed are printed
 * to stderr before the previous handler (ASan's, or the default) runs. */
void tu_crash_context(const char *name, uint64_t seed);

#endif /* FI_TESTS_UTIL_H */
