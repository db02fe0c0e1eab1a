/*
 * util.c — test support shared by every C test: random numbers, dtype
 * conversions (independent of src/cpu/convert.h), guarded buffers,
 * comparison, filters and counting. See util.h for the contracts.
 */
#include "util.h"

#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------------ random */

void tu_rng_seed(tu_rng *rng, uint64_t seed) { rng->state = seed; }

uint64_t tu_rng_next(tu_rng *rng) {
    uint64_t z = (rng->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double tu_rng_uniform(tu_rng *rng) {
    return (double)(tu_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
}

double tu_rng_range(tu_rng *rng, double lo, double hi) {
    return lo + (hi - lo) * tu_rng_uniform(rng);
}

int32_t tu_rng_int(tu_rng *rng, int32_t lo, int32_t hi) {
    if (hi <= lo) return lo;
    uint64_t span = (uint64_t)((int64_t)hi - lo + 1);
    return (int32_t)(lo + (int64_t)(tu_rng_next(rng) % span));
}

double tu_rng_normal(tu_rng *rng) {
    /* Box-Muller; u1 in (0, 1] so the log is finite. */
    double u1 = 1.0 - tu_rng_uniform(rng), u2 = tu_rng_uniform(rng);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t tu_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* ----------------------------------------------------------------- dtypes */

/* A small float format: `ebits` exponent bits, `mbits` mantissa bits.
 * fn: the E4M3 "FN" encoding (top exponent holds normal numbers, only
 * S.1111.111 is NaN, no infinities). Written with frexp/ldexp on doubles,
 * not bit tricks, so it shares nothing with the library's converters. */
typedef struct tu_format {
    int ebits, mbits;
    int fn;
} tu_format;

static const tu_format FMT_F16 = {5, 10, 0};
static const tu_format FMT_BF16 = {8, 7, 0};
static const tu_format FMT_E4M3 = {4, 3, 1};
static const tu_format FMT_E5M2 = {5, 2, 0};

static int fmt_bias(tu_format f) { return (1 << (f.ebits - 1)) - 1; }

static double fmt_max_finite(tu_format f) {
    int bias = fmt_bias(f);
    int emax_field = (1 << f.ebits) - (f.fn ? 1 : 2);
    /* FN: the top exponent's largest mantissa is NaN, so one less. */
    double top_man = f.fn ? (double)((1 << f.mbits) - 2) : (double)((1 << f.mbits) - 1);
    return ldexp(1.0 + top_man / (double)(1 << f.mbits), emax_field - bias);
}

static double fmt_decode(tu_format f, uint32_t bits) {
    int bias = fmt_bias(f);
    uint32_t man = bits & ((1u << f.mbits) - 1);
    uint32_t exp = (bits >> f.mbits) & ((1u << f.ebits) - 1);
    int neg = (bits >> (f.mbits + f.ebits)) & 1;
    uint32_t exp_all = (1u << f.ebits) - 1;
    double v;
    if (f.fn && exp == exp_all && man == (1u << f.mbits) - 1) {
        v = NAN;
    } else if (!f.fn && exp == exp_all) {
        v = man ? NAN : INFINITY;
    } else if (exp == 0) {
        v = ldexp((double)man, 1 - bias - f.mbits);
    } else {
        v = ldexp(1.0 + (double)man / (double)(1u << f.mbits), (int)exp - bias);
    }
    return neg ? -v : v;
}

/* Round |x| to the format's grid (nearest, ties to even); may exceed max. */
static double fmt_round_abs(tu_format f, double a) {
    if (a == 0.0) return 0.0;
    int bias = fmt_bias(f);
    int e;
    frexp(a, &e);       /* a = m * 2^e, m in [0.5, 1) */
    int E = e - 1;      /* a in [2^E, 2^(E+1)) */
    if (E < 1 - bias) E = 1 - bias; /* subnormal: fixed quantum */
    double quantum = ldexp(1.0, E - f.mbits);
    return nearbyint(a / quantum) * quantum; /* a / quantum is exact */
}

static uint32_t fmt_encode(tu_format f, double x) {
    int bias = fmt_bias(f);
    uint32_t sign = signbit(x) ? 1u << (f.ebits + f.mbits) : 0u;
    uint32_t exp_all = (1u << f.ebits) - 1;
    if (isnan(x)) /* all exponent and mantissa bits set: NaN in every format */
        return sign | (exp_all << f.mbits) | ((1u << f.mbits) - 1);
    double q = fmt_round_abs(f, fabs(x));
    /* computed once per format: ldexp per element is slow under ASan */
    static double maxf_cache[16][16];
    double *slot = &maxf_cache[f.ebits & 15][f.mbits & 15];
    if (*slot == 0.0) *slot = fmt_max_finite(f);
    double maxf = *slot;
    if (q > maxf) {
        if (f.fn) q = maxf; /* saturate (documented in util.h) */
        else return sign | (exp_all << f.mbits); /* infinity */
    }
    if (q == 0.0) return sign;
    int e;
    frexp(q, &e);
    int E = e - 1;
    if (E < 1 - bias) /* subnormal */
        return sign | (uint32_t)ldexp(q, bias - 1 + f.mbits);
    double man = (ldexp(q, -E) - 1.0) * (double)(1u << f.mbits);
    return sign | ((uint32_t)(E + bias) << f.mbits) | (uint32_t)man;
}

/* Decoding is a table lookup, the tables filled from fmt_decode on first
 * use (the oracle decodes millions of elements per run; frexp/ldexp per
 * element would dominate the test's time, under ASan most of all). */
static float *decode_table(tu_format f, float **table) {
    if (!*table) {
        size_t n = (size_t)1 << (1 + f.ebits + f.mbits);
        float *t = malloc(n * sizeof(float));
        if (!t) return NULL;
        for (size_t i = 0; i < n; i++) t[i] = (float)fmt_decode(f, (uint32_t)i);
        *table = t; /* tests are single-threaded */
    }
    return *table;
}

static float *tab_f16, *tab_bf16, *tab_e4m3, *tab_e5m2;

uint16_t tu_f32_to_f16(float x) { return (uint16_t)fmt_encode(FMT_F16, x); }
float tu_f16_to_f32(uint16_t h) {
    float *t = decode_table(FMT_F16, &tab_f16);
    return t ? t[h] : (float)fmt_decode(FMT_F16, h);
}
uint16_t tu_f32_to_bf16(float x) { return (uint16_t)fmt_encode(FMT_BF16, x); }
float tu_bf16_to_f32(uint16_t h) {
    float *t = decode_table(FMT_BF16, &tab_bf16);
    return t ? t[h] : (float)fmt_decode(FMT_BF16, h);
}
uint8_t tu_f32_to_e4m3(float x) { return (uint8_t)fmt_encode(FMT_E4M3, x); }
float tu_e4m3_to_f32(uint8_t b) {
    float *t = decode_table(FMT_E4M3, &tab_e4m3);
    return t ? t[b] : (float)fmt_decode(FMT_E4M3, b);
}
uint8_t tu_f32_to_e5m2(float x) { return (uint8_t)fmt_encode(FMT_E5M2, x); }
float tu_e5m2_to_f32(uint8_t b) {
    float *t = decode_table(FMT_E5M2, &tab_e5m2);
    return t ? t[b] : (float)fmt_decode(FMT_E5M2, b);
}

size_t tu_dtype_size(fi_dtype dtype) {
    switch (dtype) {
    case FI_DTYPE_F32: case FI_DTYPE_I32: return 4;
    case FI_DTYPE_F16: case FI_DTYPE_BF16: return 2;
    case FI_DTYPE_E4M3: case FI_DTYPE_E5M2: case FI_DTYPE_U8: return 1;
    default: return 0;
    }
}

double tu_dtype_tol(fi_dtype dtype) {
    switch (dtype) {
    case FI_DTYPE_F16: return 1e-3;
    case FI_DTYPE_BF16: return 1e-2;
    default: return 1e-5;
    }
}

const char *tu_dtype_name(fi_dtype dtype) {
    switch (dtype) {
    case FI_DTYPE_F32: return "f32";
    case FI_DTYPE_F16: return "f16";
    case FI_DTYPE_BF16: return "bf16";
    case FI_DTYPE_E4M3: return "e4m3";
    case FI_DTYPE_E5M2: return "e5m2";
    case FI_DTYPE_I32: return "i32";
    case FI_DTYPE_U8: return "u8";
    default: return "?";
    }
}

double tu_round(fi_dtype dtype, double x) {
    switch (dtype) {
    case FI_DTYPE_F32: return (double)(float)x;
    case FI_DTYPE_F16: return tu_f16_to_f32(tu_f32_to_f16((float)x));
    case FI_DTYPE_BF16: return tu_bf16_to_f32(tu_f32_to_bf16((float)x));
    case FI_DTYPE_E4M3: return tu_e4m3_to_f32(tu_f32_to_e4m3((float)x));
    case FI_DTYPE_E5M2: return tu_e5m2_to_f32(tu_f32_to_e5m2((float)x));
    default: return x;
    }
}

double tu_load(const void *base, fi_dtype dtype, int64_t i) {
    switch (dtype) {
    case FI_DTYPE_F32: return ((const float *)base)[i];
    case FI_DTYPE_F16: return tu_f16_to_f32(((const uint16_t *)base)[i]);
    case FI_DTYPE_BF16: return tu_bf16_to_f32(((const uint16_t *)base)[i]);
    case FI_DTYPE_E4M3: return tu_e4m3_to_f32(((const uint8_t *)base)[i]);
    case FI_DTYPE_E5M2: return tu_e5m2_to_f32(((const uint8_t *)base)[i]);
    case FI_DTYPE_I32: return ((const int32_t *)base)[i];
    case FI_DTYPE_U8: return ((const uint8_t *)base)[i];
    default: return NAN;
    }
}

void tu_store(void *base, fi_dtype dtype, int64_t i, double x) {
    switch (dtype) {
    case FI_DTYPE_F32: ((float *)base)[i] = (float)x; break;
    case FI_DTYPE_F16: ((uint16_t *)base)[i] = tu_f32_to_f16((float)x); break;
    case FI_DTYPE_BF16: ((uint16_t *)base)[i] = tu_f32_to_bf16((float)x); break;
    case FI_DTYPE_E4M3: ((uint8_t *)base)[i] = tu_f32_to_e4m3((float)x); break;
    case FI_DTYPE_E5M2: ((uint8_t *)base)[i] = tu_f32_to_e5m2((float)x); break;
    case FI_DTYPE_I32: ((int32_t *)base)[i] = (int32_t)x; break;
    case FI_DTYPE_U8: ((uint8_t *)base)[i] = (uint8_t)x; break;
    default: break;
    }
}

/* ---------------------------------------------------------------- tensors */

int64_t tu_offset(const fi_tensor *t, const int64_t *idx) {
    int64_t off = 0;
    for (int32_t d = 0; d < t->ndim; d++) off += idx[d] * t->stride[d];
    return off;
}

double tu_get(const fi_tensor *t, const int64_t *idx) {
    return tu_load(t->data, t->dtype, tu_offset(t, idx));
}

void tu_set(const fi_tensor *t, const int64_t *idx, double x) {
    tu_store(t->data, t->dtype, tu_offset(t, idx), x);
}

int64_t tu_numel(const fi_tensor *t) {
    int64_t n = 1;
    for (int32_t d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

/* Advance a row-major multi-index; 0 when it wraps past the end. */
static int next_index(int64_t *idx, const int64_t *shape, int32_t ndim) {
    for (int32_t d = ndim - 1; d >= 0; d--) {
        if (++idx[d] < shape[d]) return 1;
        idx[d] = 0;
    }
    return 0;
}

double *tu_view_read(const fi_tensor *t) {
    int64_t n = tu_numel(t);
    double *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    if (!x || n == 0) return x;
    int64_t idx[FI_MAX_DIMS] = {0}, i = 0;
    do x[i++] = tu_get(t, idx);
    while (next_index(idx, t->shape, t->ndim));
    return x;
}

void tu_view_set(const fi_tensor *t, int64_t i, double x) {
    int64_t idx[FI_MAX_DIMS];
    for (int32_t d = t->ndim - 1; d >= 0; d--) {
        idx[d] = t->shape[d] ? i % t->shape[d] : 0;
        i = t->shape[d] ? i / t->shape[d] : 0;
    }
    tu_set(t, idx, x);
}

int tu_buf_alloc_bytes(tu_buf *b, size_t bytes) { return tu_buf_alloc_tail(b, bytes, 16); }

int tu_buf_alloc_tail(tu_buf *b, size_t bytes, size_t align) {
    memset(b, 0, sizeof *b);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (align == 0) align = 1;
    /* The start is `align`-aligned, so at most align - 1 bytes of slack lie
     * between the last element and the trailing guard page. */
    size_t rounded = (bytes + align - 1) & ~(align - 1);
    size_t body = (rounded + page - 1) / page * page;
    size_t total = body + 2 * page;
    char *map = mmap(NULL, total, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return -1;
    mprotect(map, page, PROT_NONE);
    mprotect(map + page + body, page, PROT_NONE);
    b->map = map;
    b->map_bytes = total;
    b->base = map + page + body - rounded;
    b->bytes = bytes;
    return 0;
}

int tu_buf_alloc_padded(tu_buf *b, fi_dtype dtype, int32_t ndim,
                        const int64_t *shape, const int64_t *pad) {
    int64_t extent[FI_MAX_DIMS];
    int64_t elems = 1;
    for (int32_t d = 0; d < ndim; d++) {
        extent[d] = shape[d] + (pad ? pad[d] : 0);
        elems *= extent[d];
    }
    if (tu_buf_alloc_bytes(b, (size_t)elems * tu_dtype_size(dtype) + (elems == 0))) return -1;
    fi_tensor *t = &b->t;
    memset(t, 0, sizeof *t);
    t->data = b->base;
    t->dtype = dtype;
    t->ndim = ndim;
    int64_t stride = 1;
    for (int32_t d = ndim - 1; d >= 0; d--) {
        t->shape[d] = shape[d];
        t->stride[d] = stride;
        stride *= extent[d];
    }
    return 0;
}

int tu_buf_alloc(tu_buf *b, fi_dtype dtype, int32_t ndim, const int64_t *shape) {
    return tu_buf_alloc_padded(b, dtype, ndim, shape, NULL);
}

void tu_buf_free(tu_buf *b) {
    if (b->map) munmap(b->map, b->map_bytes);
    memset(b, 0, sizeof *b);
}

void tu_buf_poison(tu_buf *b) {
    if (b->base) memset(b->base, 0xFF, b->bytes);
}

int64_t tu_buf_touched_outside(const tu_buf *b) {
    const fi_tensor *t = &b->t;
    size_t es = tu_dtype_size(t->dtype);
    if (!b->base || tu_numel(t) == 0) return 0;
    uint8_t *inside = calloc(b->bytes ? b->bytes : 1, 1);
    if (!inside) return -1;
    int64_t idx[FI_MAX_DIMS] = {0};
    const char *start = (const char *)t->data;
    int64_t base_off = start - (const char *)b->base;
    do {
        int64_t off = base_off + tu_offset(t, idx) * (int64_t)es;
        for (size_t k = 0; k < es; k++)
            if (off + (int64_t)k >= 0 && off + (int64_t)k < (int64_t)b->bytes)
                inside[off + (int64_t)k] = 1;
    } while (next_index(idx, t->shape, t->ndim));
    int64_t touched = 0;
    const uint8_t *p = b->base;
    for (size_t i = 0; i < b->bytes; i++)
        if (!inside[i] && p[i] != 0xFF) touched++;
    free(inside);
    return touched;
}

void tu_fill_uniform(tu_rng *rng, const fi_tensor *t, double lo, double hi,
                     double scale) {
    if (tu_numel(t) == 0) return;
    if (scale == 0.0) scale = 1.0;
    /* row by row along the last dimension */
    int64_t idx[FI_MAX_DIMS] = {0};
    int32_t last = t->ndim - 1;
    int64_t n = t->shape[last], step = t->stride[last];
    do {
        int64_t off = tu_offset(t, idx);
        for (int64_t i = 0; i < n; i++)
            tu_store(t->data, t->dtype, off + i * step, tu_rng_range(rng, lo, hi) / scale);
    } while (next_index(idx, t->shape, last));
}

/* ------------------------------------------------------------- comparison */

int64_t tu_compare(const double *got, const double *ref, int64_t n,
                   double atol, double rtol, tu_cmp *c) {
    memset(c, 0, sizeof *c);
    c->n = n;
    c->worst = -1;
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        double ratio;
        if (isnan(g)) {
            if (!isnan(r)) c->nan++;
            ratio = INFINITY;
        } else if (isinf(g) || isinf(r)) {
            ratio = (g == r) ? 0.0 : INFINITY;
        } else {
            double err = fabs(g - r);
            if (err > c->max_abs_err) c->max_abs_err = err;
            double bound = atol + rtol * fabs(r);
            ratio = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0.0);
        }
        if (!(ratio <= 1.0)) c->bad++;
        if (c->worst < 0 || ratio > c->max_ratio) {
            c->max_ratio = ratio;
            c->worst = i;
            c->worst_got = g;
            c->worst_ref = r;
        }
    }
    return c->bad;
}

/* --------------------------------------------------- options and counting */

tu_options tu_opt;

static void usage(const char *prog, const char *help) {
    fprintf(stderr,
            "usage: %s [--backend cpu|cuda] [--filter SUBSTR]... [--quick] [-v]\n"
            "          [--list] [--seed N]\n%s%s",
            prog, help ? help : "", help ? "\n" : "");
}

int tu_parse_args(int argc, char **argv, const char *program_help) {
    memset(&tu_opt, 0, sizeof tu_opt);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--backend") && i + 1 < argc) {
            tu_opt.backend = argv[++i];
        } else if (!strcmp(a, "--filter") && i + 1 < argc) {
            if (tu_opt.num_filters < TU_MAX_FILTERS)
                tu_opt.filter[tu_opt.num_filters++] = argv[++i];
            else
                i++;
        } else if (!strcmp(a, "--quick")) {
            tu_opt.quick = 1;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            tu_opt.verbose = 1;
        } else if (!strcmp(a, "--list")) {
            tu_opt.list = 1;
        } else if (!strcmp(a, "--seed") && i + 1 < argc) {
            tu_opt.has_seed = 1;
            tu_opt.seed = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(argv[0], program_help);
            return 2;
        } else {
            fprintf(stderr, "%s: unknown option '%s'\n", argv[0], a);
            usage(argv[0], program_help);
            return 2;
        }
    }
    return 0;
}

int tu_selected(const char *name) {
    if (tu_opt.num_filters == 0) return 1;
    for (int32_t i = 0; i < tu_opt.num_filters; i++)
        if (strstr(name, tu_opt.filter[i])) return 1;
    return 0;
}

int tu_begin_case(const char *name) {
    if (!tu_selected(name)) return 0;
    if (tu_opt.list) {
        printf("%s\n", name);
        return 0;
    }
    return 1;
}

int tu_backend_selected(const char *name) {
    return !tu_opt.backend || !strcmp(tu_opt.backend, name);
}

int tu_cpu_backend_open(tu_cpu_backend *be, int index, int32_t num_threads) {
    static const char *const names[TU_NUM_CPU_BACKENDS] = {"cpu-generic", "cpu-avx2", "cpu-avx512"};
    static const char *const simd[TU_NUM_CPU_BACKENDS] = {"generic", "avx2", "avx512"};
    be->name = names[index];
    be->simd = simd[index];
    be->ctx = NULL;
    be->index = index;
    fi_context_options opt;
    fi_context_options_init(&opt);
    opt.num_threads = num_threads;
    opt.cpu_simd = be->simd;
    if (!tu_backend_selected("cpu") || fi_context_create(&opt, &be->ctx) != FI_OK) {
        printf("skip %s: %s\n", be->name,
               tu_backend_selected("cpu") ? fi_last_error() : "not selected");
        be->ctx = NULL;
        return -1;
    }
    return 0;
}

uint64_t tu_case_seed(const char *name) {
    return tu_opt.has_seed ? tu_opt.seed : tu_hash(name);
}

#define TU_MAX_CATEGORIES 64

typedef struct tu_category {
    char name[48];
    int64_t count[3];
} tu_category;

static tu_category categories[TU_MAX_CATEGORIES];
static int32_t num_categories;
static int64_t total_failures;
static char note_buf[8192];
static size_t note_len;

/* Why cases were skipped: the first line of each skipped case's note (or
 * its category when it has none), counted, so the summary says it once. */
#define TU_MAX_SKIP_REASONS 16

typedef struct tu_skip_reason {
    char text[160];
    int64_t count;
} tu_skip_reason;

static tu_skip_reason skip_reasons[TU_MAX_SKIP_REASONS + 1]; /* the last: "other reasons" */
static int32_t num_skip_reasons;

static void count_skip(const char *category) {
    char text[160];
    size_t len = strcspn(note_buf, "\n");
    if (len) snprintf(text, sizeof text, "%.*s", (int)len, note_buf);
    else snprintf(text, sizeof text, "%s: no reason given", category);
    tu_skip_reason *r = NULL;
    for (int32_t i = 0; i < num_skip_reasons && !r; i++)
        if (!strcmp(skip_reasons[i].text, text)) r = &skip_reasons[i];
    if (!r && num_skip_reasons < TU_MAX_SKIP_REASONS) {
        r = &skip_reasons[num_skip_reasons++];
        snprintf(r->text, sizeof r->text, "%s", text);
    }
    if (!r) {
        r = &skip_reasons[TU_MAX_SKIP_REASONS];
        snprintf(r->text, sizeof r->text, "other reasons");
    }
    r->count++;
}

void tu_note(const char *fmt, ...) {
    if (note_len >= sizeof note_buf - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(note_buf + note_len, sizeof note_buf - note_len, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    note_len += (size_t)n;
    if (note_len >= sizeof note_buf - 1) note_len = sizeof note_buf - 1;
    else note_buf[note_len++] = '\n', note_buf[note_len] = 0;
}

void tu_record(const char *category, const char *name, tu_result result) {
    tu_category *c = NULL;
    for (int32_t i = 0; i < num_categories; i++)
        if (!strcmp(categories[i].name, category)) c = &categories[i];
    if (!c && num_categories < TU_MAX_CATEGORIES) {
        c = &categories[num_categories++];
        snprintf(c->name, sizeof c->name, "%s", category);
    }
    if (c) c->count[result]++;
    if (result == TU_FAIL) total_failures++;
    if (result == TU_SKIP) count_skip(category);
    static const char *const words[3] = {"ok  ", "FAIL", "skip"};
    if (result == TU_FAIL || tu_opt.verbose) {
        printf("%s %s\n", words[result], name);
        if (note_len && (result == TU_FAIL || tu_opt.verbose)) {
            /* indent each note line under its case */
            const char *p = note_buf;
            while (*p) {
                const char *e = strchr(p, '\n');
                int len = e ? (int)(e - p) : (int)strlen(p);
                printf("     %.*s\n", len, p);
                p += len + (e ? 1 : 0);
            }
        }
        fflush(stdout);
    }
    note_len = 0;
    note_buf[0] = 0;
}

int tu_expect_status(fi_status got, fi_status want, const char *needle, const char *what) {
    if (got == want && (!needle || strstr(fi_last_error(), needle))) return 0;
    tu_note("%s: got %s \"%s\", want %s containing \"%s\"", what, fi_status_string(got),
            fi_last_error(), fi_status_string(want), needle ? needle : "");
    return 1;
}

int64_t tu_failures(void) { return total_failures; }

int tu_summary(const char *title) {
    int64_t tot[3] = {0, 0, 0};
    printf("%s\n  %-28s %8s %8s %8s\n", title, "category", "passed", "failed", "skipped");
    for (int32_t i = 0; i < num_categories; i++) {
        tu_category *c = &categories[i];
        printf("  %-28s %8lld %8lld %8lld\n", c->name, (long long)c->count[TU_PASS],
               (long long)c->count[TU_FAIL], (long long)c->count[TU_SKIP]);
        for (int k = 0; k < 3; k++) tot[k] += c->count[k];
    }
    printf("  %-28s %8lld %8lld %8lld\n", "total", (long long)tot[TU_PASS],
           (long long)tot[TU_FAIL], (long long)tot[TU_SKIP]);
    /* the reasons for the skips, then the counts in one fixed form that
     * tests/run.sh (make test) sums over every test program */
    for (int32_t i = 0; i <= TU_MAX_SKIP_REASONS; i++)
        if (skip_reasons[i].count)
            printf("tu-skip %lld %s\n", (long long)skip_reasons[i].count, skip_reasons[i].text);
    printf("tu-summary passed=%lld failed=%lld skipped=%lld\n", (long long)tot[TU_PASS],
           (long long)tot[TU_FAIL], (long long)tot[TU_SKIP]);
    fflush(stdout);
    return tot[TU_FAIL] ? 1 : 0;
}

/* ------------------------------------------------------------ crash context */

static char crash_name[300];
static const int crash_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
#define NUM_CRASH_SIGNALS ((int)(sizeof crash_signals / sizeof crash_signals[0]))
static struct sigaction crash_old[NUM_CRASH_SIGNALS];
static int crash_installed;

static void crash_handler(int sig) {
    /* async-signal-safe: write(2) of a prepared buffer, then hand the
     * signal back to the previous handler by restoring it; a fault
     * re-executes and reaches it, a raised signal is raised again */
    if (crash_name[0]) {
        ssize_t r = write(2, crash_name, strlen(crash_name));
        (void)r;
    }
    for (int i = 0; i < NUM_CRASH_SIGNALS; i++)
        if (crash_signals[i] == sig) sigaction(sig, &crash_old[i], NULL);
    if (sig == SIGABRT || sig == SIGFPE) raise(sig);
}

void tu_crash_context(const char *name, uint64_t seed) {
    if (!crash_installed) {
        crash_installed = 1;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = crash_handler;
        sigemptyset(&sa.sa_mask);
        for (int i = 0; i < NUM_CRASH_SIGNALS; i++)
            sigaction(crash_signals[i], &sa, &crash_old[i]);
    }
    if (!name) {
        crash_name[0] = 0;
        return;
    }
    snprintf(crash_name, sizeof crash_name, "\nCRASH during %s (seed %llu)\n", name,
             (unsigned long long)seed);
}

/* ------------------------------------------------------ temporary cache */

static char temp_cache[64];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *f) {
    (void)st, (void)flag, (void)f;
    return remove(path);
}

static void remove_temp_cache(void) {
    if (temp_cache[0]) nftw(temp_cache, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *tu_temp_cache_dir(void) {
    const char *keep = getenv("FI_TEST_CACHE_DIR");
    if (keep && keep[0]) {
        setenv("FLASHINFER_CACHE_DIR", keep, 1);
        return keep;
    }
    if (!temp_cache[0]) {
        snprintf(temp_cache, sizeof temp_cache, "/tmp/fi-test-cache-XXXXXX");
        if (!mkdtemp(temp_cache)) {
            temp_cache[0] = 0;
            return getenv("FLASHINFER_CACHE_DIR");
        }
        atexit(remove_temp_cache);
    }
    setenv("FLASHINFER_CACHE_DIR", temp_cache, 1);
    return temp_cache;
}
