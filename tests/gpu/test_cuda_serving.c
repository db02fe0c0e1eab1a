/*
 * test_cuda_serving.c — the serving ops on the CUDA backend against the CPU
 * backend (which tests/test_serving_ops.c checks against the fp64 oracle):
 * norms, gated activations, RoPE from a cos/sin cache, softmax, every
 * sampler, the filters, chain speculative sampling and top-k. Runs on the
 * GPU machine (tests/gpu/run_device.sh).
 *
 * Each case builds fresh seeded inputs in host buffers (outputs poisoned
 * with 0xFF = NaN), runs the op on a CPU context, copies the inputs and
 * poisoned outputs to the device between two guard zones of 0xA5, runs the
 * op there on a non-blocking stream, twice from the same inputs (the two
 * runs must be bitwise equal), and checks: values against the CPU's
 * (norms, activations, softmax, renorm, RoPE within the output dtype's
 * tolerance, FP8 within one code; NaN only where the CPU has NaN; tokens,
 * valid flags, speculative outputs, top-k indices and values, masked
 * logits bit for bit), nothing written outside an output view, guard zones
 * intact. Layouts: contiguous and aligned (the vector paths), strided
 * (dims permuted and padded: the element paths), misaligned by one element.
 *
 * Categories:
 *   norm       the seven norm forms; hidden 1 .. 20000 (register-held and
 *              re-read rows), dtypes mixed, FP8 out, 3-D input, in place
 *   act        silu / gelu / gelu_tanh _and_mul, d 1 .. 8192
 *   rope_cache NeoX and GPT-J, rotary_dim < head_dim, in place, q and k of
 *              different dtypes
 *   qk_norm_rope fi_qk_rmsnorm_rope and its Gemma form: the same crossed
 *              with weight dtypes, odd head dims, D up to 256
 *   rope_quant fi_rope_quantize_fp8 and its append form (tests/rope_quant_cases.c):
 *              MLA / GQA / MHA, R 32 .. 128, N 0 .. 512, NHD / HND, page size
 *              1 / 16 / 32, e4m3 / e5m2, scales != 1, sliced outputs, all three
 *              layouts: bit for bit the CPU's and within the oracle's rounding;
 *              device values the CPU refuses (a pos_id past the cache, a bad
 *              request, position or page id): the token's rows skipped as
 *              kernels/rope_quant.cuh says
 *   softmax    scalar and per-row temperature, non-finite rows, vocab to 256k
 *   sample     every sampler, scalar / per-row / indices, ties and zeros,
 *              vocab 1 .. 262144: the CPU's tokens, bit for bit
 *   stats      GPU draws' frequencies against the filtered distribution
 *              (chi-square at p = 1e-6); wrong filters (mutants) must fail
 *   filter     top_k / top_p renorm, top_k_mask_logits (in place too)
 *   spec       chain speculative sampling
 *   topk       fi_top_k (lengths, offsets, ties, NaN, k past one band of
 *              4096) and fi_top_k_ragged
 *   graph      the ops captured in a CUDA graph (warm, and cold: compiled
 *              inside the capture), replayed on new inputs
 *   bad_input  the statuses and messages of the CPU on invalid arguments;
 *              values in device tensors the CPU refuses: the CUDA kernels'
 *              documented handling (kernels/sampling.cuh)
 *
 * Without a CUDA device every case still runs its CPU half and is then
 * counted as skipped; the exit status is 0.
 */
#include "flashinfer.h"
#include "gpu_util.h"
#include "../ops_cases.h"
#include "../oracle_serving.h"
#include "../rope_quant_cases.h"
#include "../util.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SKIP = -1, MAXB = 12 };
enum { CONTIG = 0, STRIDED = 1, MISALIGNED = 2 };
static const char *const layout_names[] = {"contiguous", "strided", "misaligned"};
static const fi_dtype fdt[3] = {FI_DTYPE_F32, FI_DTYPE_F16, FI_DTYPE_BF16};

static fi_context *g_cpu, *g_cuda;
static gu_stream g_stream;
static int g_device; /* a CUDA device and context are ready */

/* ======================================================= device mirrors */

static int device_sync(void) { return GU(gu.CtxSynchronize()) == 0; }

/* New bytes into m's data (tests/gpu/gpu_util.h's mirrors). */
static int dm_write(const gu_mirror *m, const void *bytes) {
    return !m->bytes || !GU(gu.HtoD(m->dev + GU_GUARD + m->shift, bytes, m->bytes));
}

/* ============================================================ case bufs */

/* One case's buffers: the host ones (inputs, poisoned outputs), their
 * bytes before any run and after the CPU's, and device mirrors. */
typedef struct cbufs {
    tu_buf b[MAXB];
    int n, misalign;
    gu_mirror dm[MAXB];
    void *orig[MAXB], *cpu[MAXB];
    fi_tensor host[MAXB], dev[MAXB];
} cbufs;

typedef fi_status (*op_fn)(fi_context *ctx, const fi_tensor *t, const void *cfg, void *stream);

static int cb_add(cbufs *c, fi_dtype dt, int32_t ndim, const int64_t *shape, int strided,
                  tu_rng *rng) {
    if (c->n >= MAXB || ops_view_alloc(&c->b[c->n], dt, ndim, shape, strided, rng)) return -1;
    return c->n++;
}

static void cb_free(cbufs *c) {
    for (int i = 0; i < c->n; i++) {
        gu_mirror_free(&c->dm[i]);
        free(c->orig[i]), free(c->cpu[i]);
        tu_buf_free(&c->b[i]);
    }
    memset(c, 0, sizeof *c);
}

/* Device views of every buffer: inputs and poisoned outputs uploaded. */
static int cb_upload(cbufs *c) {
    int ok = 1;
    for (int i = 0; i < c->n && ok; i++) {
        const size_t shift = c->misalign ? tu_dtype_size(c->b[i].t.dtype) : 0;
        ok = gu_mirror_up(&c->dm[i], &c->b[i], shift);
        c->dev[i] = c->b[i].t;
        c->dev[i].data = (void *)(uintptr_t)(c->dm[i].dev + GU_GUARD + shift +
                                             (size_t)((char *)c->b[i].t.data - (char *)c->b[i].base));
    }
    return ok;
}

static int cb_download(cbufs *c) {
    int ok = 1;
    for (int i = 0; i < c->n; i++) ok &= gu_mirror_down(&c->dm[i], &c->b[i], "a buffer");
    return ok;
}

/* fn on the CPU with host views, then on the GPU with device views, twice
 * from the same inputs (bitwise the same bytes). Afterwards c->b holds the
 * GPU's bytes, c->cpu the CPU's. 1, 0 (noted) or SKIP. */
static int cb_run(cbufs *c, op_fn fn, const void *cfg) {
    for (int i = 0; i < c->n; i++) {
        c->orig[i] = ops_snapshot(&c->b[i]);
        c->host[i] = c->b[i].t;
    }
    if (!ops_check_ok(fn(g_cpu, c->host, cfg, NULL), "the op on the CPU")) return 0;
    for (int i = 0; i < c->n; i++) {
        c->cpu[i] = ops_snapshot(&c->b[i]);
        memcpy(c->b[i].base, c->orig[i], c->b[i].bytes);
    }
    if (!g_device) return SKIP;
    if (!cb_upload(c) || !device_sync()) return 0;
    if (!ops_check_ok(fn(g_cuda, c->dev, cfg, g_stream), "the op on CUDA") || !device_sync() ||
        !cb_download(c))
        return 0;
    void *first[MAXB];
    int ok = 1;
    for (int i = 0; i < c->n; i++) first[i] = ops_snapshot(&c->b[i]);
    for (int i = 0; i < c->n && ok; i++) ok = dm_write(&c->dm[i], c->orig[i]);
    ok = ok && device_sync() && ops_check_ok(fn(g_cuda, c->dev, cfg, g_stream), "second run") &&
         device_sync() && cb_download(c);
    for (int i = 0; i < c->n; i++) {
        if (ok && memcmp(first[i], c->b[i].base, c->b[i].bytes)) {
            tu_note("buffer %d: a second run from the same inputs differs", i);
            ok = 0;
        }
        free(first[i]);
    }
    return ok;
}

/* The CPU's view of buffer i. */
static fi_tensor cb_cpu_view(const cbufs *c, int i) {
    return ops_view_on(&c->b[i].t, &c->b[i], c->cpu[i]);
}

/* Buffer i against the CPU's within tol (atol = rtol); a NaN passes only
 * where the CPU has one, an infinity only as the same infinity. */
static int cb_float(const cbufs *c, int i, const char *what, double tol) {
    fi_tensor ct = cb_cpu_view(c, i);
    double *got = tu_view_read(&c->b[i].t), *ref = tu_view_read(&ct);
    const int64_t n = tu_numel(&ct);
    int64_t bad = 0, same = 0, worst = -1;
    for (int64_t e = 0; e < n; e++) {
        const double g = got[e], r = ref[e];
        bool ok = isnan(r) ? isnan(g) : isinf(r) ? g == r : fabs(g - r) <= tol * (1 + fabs(r));
        same += g == r || (isnan(g) && isnan(r));
        if (!ok && bad++ == 0) worst = e;
    }
    if (bad)
        tu_note("%s: %lld of %lld out of tolerance %g; first at %lld: %.9g, the CPU %.9g", what,
                (long long)bad, (long long)n, tol, (long long)worst, got[worst], ref[worst]);
    else if (tu_opt.verbose)
        printf("  %s: %lld of %lld bitwise the CPU's\n", what, (long long)same, (long long)n);
    free(got), free(ref);
    return bad == 0 && ops_check_outside(what, &c->b[i]);
}

/* Buffer i byte for byte the CPU's (inside and outside its view). */
static int cb_bits(const cbufs *c, int i, const char *what) {
    if (!memcmp(c->b[i].base, c->cpu[i], c->b[i].bytes)) return 1;
    fi_tensor ct = cb_cpu_view(c, i);
    double *got = tu_view_read(&c->b[i].t), *ref = tu_view_read(&ct);
    const int64_t n = tu_numel(&ct);
    int64_t bad = 0;
    for (int64_t e = 0; e < n; e++)
        if (!(got[e] == ref[e] || (isnan(got[e]) && isnan(ref[e]))) && bad++ < 3)
            tu_note("%s[%lld]: %.9g, the CPU %.9g", what, (long long)e, got[e], ref[e]);
    tu_note("%s: %lld of %lld elements differ from the CPU's (or bytes outside the view)", what,
            (long long)bad, (long long)n);
    free(got), free(ref);
    return 0;
}

/* FP8 buffer i: the CPU's code or the next one (f32 sums in another order
 * may round the other way at a code boundary). */
static int cb_fp8(const cbufs *c, int i, const char *what) {
    fi_tensor ct = cb_cpu_view(c, i);
    double *got = tu_view_read(&c->b[i].t), *ref = tu_view_read(&ct);
    const bool e4 = ct.dtype == FI_DTYPE_E4M3;
    const double rel = e4 ? 0.125 : 0.25, sub = e4 ? 0x1p-9 : 0x1p-16;
    int64_t bad = 0, n = tu_numel(&ct);
    for (int64_t e = 0; e < n; e++) {
        bool ok = got[e] == ref[e] || fabs(got[e] - ref[e]) <= rel * fabs(ref[e]) + sub;
        if (!ok && bad++ == 0)
            tu_note("%s[%lld]: %g, the CPU %g", what, (long long)e, got[e], ref[e]);
    }
    free(got), free(ref);
    return bad == 0 && ops_check_outside(what, &c->b[i]);
}

/* ================================================================ cases */

typedef int (*case_fn)(tu_rng *rng, const void *cfg);

/* One case, named "<category>/<fmt...>" (its seed comes from the name). */
static void run_case(const char *category, case_fn fn, const void *cfg, const char *fmt, ...)
    TU_PRINTF(4, 5);
static void run_case(const char *category, case_fn fn, const void *cfg, const char *fmt, ...) {
    char name[192];
    const int n = snprintf(name, sizeof name, "%s/", category);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name + n, sizeof name - (size_t)n, fmt, ap);
    va_end(ap);
    if (!tu_begin_case(name)) return;
    const uint64_t seed = tu_case_seed(name);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    tu_crash_context(name, seed);
    const int r = fn(&rng, cfg);
    tu_crash_context(NULL, 0);
    if (r == 0) tu_note("seed %llu; rerun: --filter '%s'", (unsigned long long)seed, name);
    if (r == SKIP) tu_note("no CUDA device: the CPU half ran alone");
    tu_record(category, name, r == SKIP ? TU_SKIP : r ? TU_PASS : TU_FAIL);
}

/* A suite's cases as nested loops over up to GRID_MAX indices, the first
 * outermost: for (grid g = {.ext = {7, 8, 3}}; grid_next(&g);) visits
 * g.i[0] x g.i[1] x g.i[2] in [0, 7) x [0, 8) x [0, 3), the last fastest.
 * The extents end at the first 0. */
enum { GRID_MAX = 5 };
typedef struct grid {
    int ext[GRID_MAX], i[GRID_MAX];
    bool started;
} grid;

static bool grid_next(grid *g) {
    int n = 0;
    while (n < GRID_MAX && g->ext[n] > 0) n++;
    if (!g->started) {
        g->started = true;
        return n > 0;
    }
    for (int d = n - 1; d >= 0; d--) {
        if (++g->i[d] < g->ext[d]) return true;
        g->i[d] = 0;
    }
    return false;
}

#define LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* A fill of buffer i's view, uniform in [lo, hi). */
static void fill(tu_rng *rng, cbufs *c, int i, double lo, double hi) {
    tu_fill_uniform(rng, &c->b[i].t, lo, hi, 0.0);
}

/* ================================================================= norm */

typedef enum norm_op { N_RMS, N_GEMMA, N_FUSED, N_GEMMA_FUSED, N_LAYER, N_QUANT, N_FUSED_QUANT } norm_op;
static const char *const norm_names[] = {"rmsnorm", "gemma_rmsnorm", "fused_add_rmsnorm",
                                         "gemma_fused_add_rmsnorm", "layernorm", "rmsnorm_quant",
                                         "fused_add_rmsnorm_quant"};

typedef struct norm_cfg {
    norm_op op;
    int64_t rows, heads, hidden; /* heads > 0: [rows, heads, hidden] */
    fi_dtype xt, wt, ot;         /* ot: FP8 for the quant forms */
    int layout, in_place;
    int x, w, r, b, o;           /* buffer slots (set by the case) */
} norm_cfg;

static bool norm_fused(norm_op op) { return op == N_FUSED || op == N_GEMMA_FUSED || op == N_FUSED_QUANT; }

static fi_status norm_fn(fi_context *ctx, const fi_tensor *t, const void *p, void *s) {
    const norm_cfg *c = p;
    fi_tensor x = t[c->x], w = t[c->w], r = c->r >= 0 ? t[c->r] : x, b = c->b >= 0 ? t[c->b] : x;
    fi_tensor o = c->o >= 0 ? t[c->o] : x;
    const float eps = 1e-6f, scale = 0.37f;
    switch (c->op) {
    case N_RMS: return fi_rmsnorm(ctx, &x, &w, eps, &o, s);
    case N_GEMMA: return fi_gemma_rmsnorm(ctx, &x, &w, eps, &o, s);
    case N_FUSED: return fi_fused_add_rmsnorm(ctx, &x, &r, &w, eps, s);
    case N_GEMMA_FUSED: return fi_gemma_fused_add_rmsnorm(ctx, &x, &r, &w, eps, s);
    case N_LAYER: return fi_layernorm(ctx, &x, &w, &b, eps, &o, s);
    case N_QUANT: return fi_rmsnorm_quant(ctx, &x, &w, scale, eps, &o, s);
    case N_FUSED_QUANT: return fi_fused_add_rmsnorm_quant(ctx, &x, &r, &w, scale, eps, &o, s);
    }
    return FI_STATUS_INTERNAL;
}

static int case_norm(tu_rng *rng, const void *p) {
    norm_cfg c = *(const norm_cfg *)p;
    const bool fused = norm_fused(c.op), quant = c.op == N_QUANT || c.op == N_FUSED_QUANT;
    const bool writes_input = c.op == N_FUSED || c.op == N_GEMMA_FUSED;
    const int32_t nd = c.heads ? 3 : 2;
    const int64_t s3[3] = {c.rows, c.heads, c.hidden}, s2[2] = {c.rows, c.hidden};
    const int64_t *sh = c.heads ? s3 : s2, hs[1] = {c.hidden};
    const int strided = c.layout == STRIDED;
    cbufs b;
    memset(&b, 0, sizeof b);
    b.misalign = c.layout == MISALIGNED;
    c.x = cb_add(&b, c.xt, nd, sh, strided, rng);
    c.w = cb_add(&b, c.wt, 1, hs, strided, rng);
    c.r = fused ? cb_add(&b, c.xt == FI_DTYPE_F32 ? FI_DTYPE_BF16 : c.xt, nd, sh, strided, rng) : -1;
    c.b = c.op == N_LAYER ? cb_add(&b, FI_DTYPE_F32, 1, hs, 0, rng) : -1;
    c.o = writes_input || c.in_place ? -1 : cb_add(&b, c.ot, nd, sh, strided, rng);
    if (c.x < 0 || c.w < 0 || (fused && c.r < 0) || (c.op == N_LAYER && c.b < 0) ||
        (!writes_input && !c.in_place && c.o < 0)) {
        tu_note("allocation failed");
        cb_free(&b);
        return 0;
    }
    fill(rng, &b, c.x, -2, 2), fill(rng, &b, c.w, -1.5, 1.5);
    if (fused) fill(rng, &b, c.r, -2, 2);
    if (c.b >= 0) fill(rng, &b, c.b, -1, 1);
    int ok = cb_run(&b, norm_fn, &c);
    if (ok == 1) {
        const int out = c.o >= 0 ? c.o : c.x;
        const fi_dtype odt = b.b[out].t.dtype;
        ok = quant ? cb_fp8(&b, out, "out") : cb_float(&b, out, "out", 2 * tu_dtype_tol(odt));
        if (fused) ok &= cb_float(&b, c.r, "residual", tu_dtype_tol(b.b[c.r].t.dtype));
        ok &= cb_bits(&b, c.w, "weight");
    }
    cb_free(&b);
    return ok;
}

static void suite_norm(void) {
    static const int64_t hiddens[] = {1, 7, 8, 100, 4097, 16384, 16392, 20000};
    for (grid g = {.ext = {LEN(norm_names), LEN(hiddens), LEN(fdt), LEN(layout_names)}};
         grid_next(&g);) {
        const int op = g.i[0], hi = g.i[1], di = g.i[2], layout = g.i[3];
        if (tu_opt.quick && (layout != (hi + di) % 3 || hi == 6)) continue;
        if (hiddens[hi] >= 16384 && layout == STRIDED && di) continue;
        const bool quant = op == N_QUANT || op == N_FUSED_QUANT;
        norm_cfg c = {(norm_op)op, hiddens[hi] >= 4097 ? 3 : 9, 0, hiddens[hi],
                      fdt[di], fdt[(di + layout) % 3],
                      quant ? (di == 2 ? FI_DTYPE_E5M2 : FI_DTYPE_E4M3) : fdt[(di + hi) % 3],
                      layout, 0, 0, 0, 0, 0, 0};
        run_case("norm", case_norm, &c, "%s/x%s_w%s_to_%s/h%lld/%s", norm_names[op],
                 tu_dtype_name(c.xt), tu_dtype_name(c.wt), tu_dtype_name(c.ot),
                 (long long)c.hidden, layout_names[layout]);
    }
    for (int di = 0; di < 3; di++) { /* per-head norm of [tokens, heads, dim]; out = input */
        norm_cfg c = {N_RMS, 5, 3, 64, fdt[di], fdt[di], fdt[di], di == 1, 0, 0, 0, 0, 0, 0};
        run_case("norm", case_norm, &c, "rmsnorm/%s/3d_heads", tu_dtype_name(c.xt));
        norm_cfg d = {di == 2 ? N_LAYER : N_RMS, 6, 0, 136, fdt[di], fdt[di], fdt[di], di == 1,
                      1, 0, 0, 0, 0, 0};
        run_case("norm", case_norm, &d, "%s/%s/h136/in_place", norm_names[d.op],
                 tu_dtype_name(d.xt));
    }
    norm_cfg big = {N_FUSED, 40, 0, 16384, FI_DTYPE_BF16, FI_DTYPE_BF16, FI_DTYPE_BF16, 0, 0,
                    0, 0, 0, 0, 0};
    run_case("norm", case_norm, &big, "fused_add_rmsnorm/bf16/large_r40_h16384");
}

/* ================================================================== act */

typedef struct act_cfg {
    int kind;
    int64_t rows, d;
    fi_dtype xt, ot;
    int layout;
} act_cfg;

static fi_status act_fn(fi_context *ctx, const fi_tensor *t, const void *p, void *s) {
    const act_cfg *c = p;
    return c->kind == 0   ? fi_silu_and_mul(ctx, &t[0], (fi_tensor *)&t[1], s)
           : c->kind == 1 ? fi_gelu_and_mul(ctx, &t[0], (fi_tensor *)&t[1], s)
                          : fi_gelu_tanh_and_mul(ctx, &t[0], (fi_tensor *)&t[1], s);
}

static int case_act(tu_rng *rng, const void *p) {
    const act_cfg *c = p;
    const int64_t is[2] = {c->rows, 2 * c->d}, os[2] = {c->rows, c->d};
    cbufs b;
    memset(&b, 0, sizeof b);
    b.misalign = c->layout == MISALIGNED;
    if (cb_add(&b, c->xt, 2, is, c->layout == STRIDED, rng) < 0 ||
        cb_add(&b, c->ot, 2, os, c->layout == STRIDED, rng) < 0) {
        cb_free(&b);
        return 0;
    }
    fill(rng, &b, 0, -6, 6);
    int ok = cb_run(&b, act_fn, c);
    if (ok == 1) ok = cb_float(&b, 1, "out", 2 * tu_dtype_tol(c->ot)) & cb_bits(&b, 0, "input");
    cb_free(&b);
    return ok;
}

static void suite_act(void) {
    static const char *const kinds[] = {"silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"};
    static const int64_t ds[] = {1, 7, 256, 4097, 8192};
    for (grid g = {.ext = {LEN(kinds), LEN(fdt), LEN(ds), LEN(layout_names)}}; grid_next(&g);) {
        const int k = g.i[0], di = g.i[1], dd = g.i[2], layout = g.i[3];
        if (tu_opt.quick && layout != (dd + di) % 3) continue;
        act_cfg c = {k, dd >= 3 ? 5 : 13, ds[dd], fdt[di], fdt[(di + layout) % 3], layout};
        run_case("act", case_act, &c, "%s/%s_to_%s/d%lld/%s", kinds[k], tu_dtype_name(c.xt),
                 tu_dtype_name(c.ot), (long long)c.d, layout_names[layout]);
    }
}

/* =========================================================== rope cache */

typedef struct rope_cfg {
    int64_t nnz, hq, hk, dim, rot;
    fi_dtype qt, kt;
    int neox, layout, in_place;
    int norm;         /* fi_qk_rmsnorm_rope: 1 RMSNorm, 2 Gemma; 0 plain RoPE */
    fi_dtype qwt, kwt; /* its weights */
} rope_cfg;

static fi_status rope_fn(fi_context *ctx, const fi_tensor *t, const void *p, void *s) {
    const rope_cfg *c = p; /* q, k, pos, cache[, q_weight, k_weight][, q_out, k_out] */
    const int o = c->in_place ? 0 : c->norm ? 6 : 4;
    fi_tensor *qo = (fi_tensor *)&t[o], *ko = (fi_tensor *)&t[o + 1];
    if (c->norm == 2)
        return fi_gemma_qk_rmsnorm_rope(ctx, &t[2], &t[0], &t[1], &t[4], &t[5], 1e-6f, &t[3],
                                        c->neox, qo, ko, s);
    if (c->norm)
        return fi_qk_rmsnorm_rope(ctx, &t[2], &t[0], &t[1], &t[4], &t[5], 1e-6f, &t[3], c->neox,
                                  qo, ko, s);
    return fi_rope_apply_cos_sin_cache(ctx, &t[2], &t[0], &t[1], &t[3], c->neox, qo, ko, s);
}

static int case_rope(tu_rng *rng, const void *p) {
    const rope_cfg *c = p;
    const int64_t qs[3] = {c->nnz, c->hq, c->dim}, ks[3] = {c->nnz, c->hk, c->dim};
    const int64_t max_pos = 4096, cs[2] = {max_pos, c->rot}, ps[1] = {c->nnz};
    const int st = c->layout == STRIDED;
    cbufs b;
    memset(&b, 0, sizeof b);
    b.misalign = c->layout == MISALIGNED;
    int ok = cb_add(&b, c->qt, 3, qs, st, rng) >= 0 && cb_add(&b, c->kt, 3, ks, st, rng) >= 0 &&
             cb_add(&b, FI_DTYPE_I32, 1, ps, st, rng) >= 0 &&
             cb_add(&b, FI_DTYPE_F32, 2, cs, st, rng) >= 0;
    if (ok && c->norm)
        ok = cb_add(&b, c->qwt, 1, &c->dim, st, rng) >= 0 &&
             cb_add(&b, c->kwt, 1, &c->dim, st, rng) >= 0;
    if (ok && !c->in_place)
        ok = cb_add(&b, c->qt, 3, qs, st, rng) >= 0 && cb_add(&b, c->kt, 3, ks, st, rng) >= 0;
    if (!ok) {
        cb_free(&b);
        return 0;
    }
    fill(rng, &b, 0, -2, 2), fill(rng, &b, 1, -2, 2);
    if (c->norm) fill(rng, &b, 4, -0.5, 1.5), fill(rng, &b, 5, -0.5, 1.5);
    for (int64_t t = 0; t < c->nnz; t++) tu_view_set(&b.b[2].t, t, tu_rng_int(rng, 0, max_pos - 1));
    for (int64_t pp = 0; pp < max_pos; pp++)
        for (int64_t i = 0; i < c->rot / 2; i++) {
            double ang = (double)pp * pow(1e4, -2.0 * (double)i / (double)c->rot);
            tu_view_set(&b.b[3].t, pp * c->rot + i, cos(ang));
            tu_view_set(&b.b[3].t, pp * c->rot + c->rot / 2 + i, sin(ang));
        }
    ok = cb_run(&b, rope_fn, c);
    if (ok == 1) {
        const int qo = c->in_place ? 0 : c->norm ? 6 : 4, ko = qo + 1;
        /* normalised values reach ~3: the rounding of one store of them */
        const double f = c->norm ? 3 : 1;
        ok = cb_float(&b, qo, "q_out", f * tu_dtype_tol(c->qt)) &
             cb_float(&b, ko, "k_out", f * tu_dtype_tol(c->kt));
    }
    cb_free(&b);
    return ok;
}

static void suite_rope(void) {
    static const int64_t shapes[][5] = {
        {1, 1, 1, 2, 2}, {7, 4, 2, 64, 64}, {5, 3, 1, 128, 64}, {9, 8, 8, 130, 96}, {300, 32, 8, 128, 128}};
    for (grid g = {.ext = {LEN(shapes), LEN(fdt), 5}}; grid_next(&g);) {
        const int si = g.i[0], di = g.i[1], mode = g.i[2];
        if (tu_opt.quick && (mode + si + di) % 3) continue;
        rope_cfg c = {shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3], shapes[si][4],
                      fdt[di], fdt[(di + mode) % 3], mode & 1,
                      mode == 4 ? MISALIGNED : mode >= 2 ? STRIDED : CONTIG, mode == 3,
                      0, FI_DTYPE_F32, FI_DTYPE_F32};
        run_case("rope_cache", case_rope, &c, "q%s_k%s/h%lld_%lld_d%lld_r%lld/%s_%s%s",
                 tu_dtype_name(c.qt), tu_dtype_name(c.kt), (long long)c.hq, (long long)c.hk,
                 (long long)c.dim, (long long)c.rot, c.neox ? "neox" : "gptj",
                 layout_names[c.layout], c.in_place ? "_in_place" : "");
    }
}

/* fi_qk_rmsnorm_rope / its Gemma form: head dims 2 .. 256 (odd, R < D,
 * more than 32 pairs a warp), q, k and weights of mixed dtypes, every
 * layout, in place. */
static void suite_qk_norm_rope(void) {
    static const int64_t shapes[][5] = {{1, 1, 1, 2, 2},    {7, 4, 2, 64, 64},
                                        {4, 2, 1, 67, 32},  {9, 8, 8, 130, 96},
                                        {5, 16, 2, 256, 256}, {300, 32, 8, 128, 128}};
    for (grid g = {.ext = {LEN(shapes), LEN(fdt), 5, 2}}; grid_next(&g);) {
        const int si = g.i[0], di = g.i[1], mode = g.i[2], form = g.i[3] + 1;
        if (tu_opt.quick && (mode + si + di + form) % 3) continue;
        rope_cfg c = {shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3], shapes[si][4],
                      fdt[di], fdt[(di + mode) % 3], (mode + form) & 1,
                      mode == 4 ? MISALIGNED : mode >= 2 ? STRIDED : CONTIG, mode == 3,
                      form, fdt[(di + form) % 3], fdt[(di + mode + 1) % 3]};
        run_case("qk_norm_rope", case_rope, &c, "%s/q%s_k%s_w%s%s/h%lld_%lld_d%lld_r%lld/%s_%s%s",
                 form == 2 ? "gemma" : "rms", tu_dtype_name(c.qt), tu_dtype_name(c.kt),
                 tu_dtype_name(c.qwt), tu_dtype_name(c.kwt), (long long)c.hq, (long long)c.hk,
                 (long long)c.dim, (long long)c.rot, c.neox ? "neox" : "gptj",
                 layout_names[c.layout], c.in_place ? "_in_place" : "");
    }
}

/* =========================================================== rope quant */

typedef struct rq_gpu_cfg {
    rq_cfg c;
    int layout;
    int device_values; /* break index values the CPU refuses (GPU only) */
} rq_gpu_cfg;

static fi_status rq_fn(fi_context *ctx, const fi_tensor *t, const void *p, void *s) {
    return rq_case_call(ctx, p, t, s);
}

/* Index values of k the CPU refuses, broken in the host buffer: token 0's
 * pos_id past the cache, token 1's request, token 2's position, and the
 * page id token 3 lands on; skip[t] says what each token still writes. */
static void break_indices(const rq_case *k, const tu_buf *ix, uint8_t *skip) {
    const fi_tensor *t = &ix->t;
    tu_view_set(t, 0, (double)k->max_pos), skip[0] = RQ_SKIP_ALL;
    tu_view_set(t, k->off_batch + 1, 99), skip[1] = RQ_SKIP_KV;
    tu_view_set(t, k->off_pos + 2, 1e6), skip[2] = RQ_SKIP_KV;
    double *v = tu_view_read(t);
    const int64_t ps = k->c.page_size;
#define RQ_ENTRY(n) ((int64_t)v[k->off_indptr + (int64_t)v[k->off_batch + (n)]] + \
                     (int64_t)v[k->off_pos + (n)] / ps)
    const int64_t bad = RQ_ENTRY(3);
    tu_view_set(t, k->off_indices + bad, (double)(k->pages + 5));
    for (int64_t n = 3; n < k->c.nnz; n++)
        if (RQ_ENTRY(n) == bad) skip[n] = RQ_SKIP_KV;
#undef RQ_ENTRY
    free(v);
}

static int case_rope_quant(tu_rng *rng, const void *p) {
    const rq_gpu_cfg *g = p;
    rq_case k;
    cbufs b;
    memset(&b, 0, sizeof b);
    b.misalign = g->layout == MISALIGNED;
    uint8_t skip[64] = {0};
    int ok = !rq_case_alloc(&k, &g->c, b.b, rng);
    b.n = RQ_NBUF;
    if (!ok) {
        cb_free(&b);
        return 0;
    }
    if (!g->device_values) {
        ok = cb_run(&b, rq_fn, &k);
        for (int i = RQ_Q_OUT; i < RQ_NBUF && ok == 1; i++) ok = cb_bits(&b, i, "an output");
        if (ok == 1) ok = rq_case_check(&k, b.b, b.orig, NULL);
        cb_free(&b);
        return ok;
    }
    break_indices(&k, &b.b[RQ_INDEX], skip);
    for (int i = 0; i < b.n; i++) b.orig[i] = ops_snapshot(&b.b[i]);
    if (!g_device) {
        cb_free(&b);
        return SKIP;
    }
    ok = cb_upload(&b) && device_sync() &&
         ops_check_ok(rq_fn(g_cuda, b.dev, &k, g_stream), "the op on CUDA") && device_sync() &&
         cb_download(&b) && rq_case_check(&k, b.b, b.orig, skip);
    cb_free(&b);
    return ok;
}

static void suite_rope_quant(void) {
    /* (nnz, H_q, H_k (0: MLA), R, N) */
    static const int64_t shapes[][5] = {
        {1, 1, 1, 32, 0},     {7, 4, 2, 64, 0},  {5, 3, 3, 128, 64}, {9, 8, 2, 64, 96},
        {13, 16, 0, 64, 512}, {6, 5, 0, 32, 96}, {3, 2, 1, 128, 512}, {300, 32, 8, 128, 0},
        {40, 128, 0, 64, 512}};
    static const int page_sizes[3] = {1, 16, 32};
    static const float scales[4][2] = {{1, 1}, {0.5f, 4}, {3, 0.25f}, {1, 1}};
    char cfg[160];
    for (grid g = {.ext = {LEN(shapes), 3, 4, 3}}; grid_next(&g);) {
        const int si = g.i[0], form = g.i[1], v = g.i[2], lay = g.i[3];
        const int64_t *s = shapes[si];
        if ((s[2] == 0 && form == 2) || (tu_opt.quick && (si + form + v + lay) % 3)) continue;
        rq_gpu_cfg c = {{s[0], s[1], s[2], s[3], s[4], fdt[(si + v) % 3],
                         v & 1 ? FI_DTYPE_E5M2 : FI_DTYPE_E4M3, !((v + lay) & 1), form > 0,
                         form == 2, page_sizes[(si + v) % 3], lay == STRIDED, v >= 2,
                         scales[v][0], scales[v][1]},
                        lay, 0};
        rq_case_name(&c.c, cfg, sizeof cfg);
        run_case("rope_quant", case_rope_quant, &c, "%s/%s", cfg, layout_names[lay]);
    }
    for (int mla = 0; mla < 2; mla++) /* values the CPU refuses */
        for (int lay = 0; lay < 2; lay++) {
            rq_gpu_cfg c = {{20, 4, mla ? 0 : 2, 64, mla ? 512 : 64, FI_DTYPE_BF16, FI_DTYPE_E4M3,
                             1, 1, 0, 4, lay == STRIDED, 0, 1.0f, 1.0f},
                            lay, 1};
            rq_case_name(&c.c, cfg, sizeof cfg);
            run_case("rope_quant", case_rope_quant, &c, "device_values/%s/%s", cfg,
                     layout_names[lay]);
        }
}

/* ============================================================== softmax */

typedef struct softmax_cfg {
    int64_t rows, v;
    fi_dtype xt, ot;
    int layout, per_row, nonfinite;
} softmax_cfg;

static fi_status softmax_fn(fi_context *ctx, const fi_tensor *t, const void *p, void *s) {
    const softmax_cfg *c = p; /* x, out[, temperature] */
    return fi_softmax(ctx, &t[0], c->per_row ? &t[2] : NULL, 0.7f, (fi_tensor *)&t[1], s);
}

static int case_softmax(tu_rng *rng, const void *p) {
    const softmax_cfg *c = p;
    const int64_t shape[2] = {c->rows, c->v}, rs[1] = {c->rows};
    cbufs b;
    memset(&b, 0, sizeof b);
    b.misalign = c->layout == MISALIGNED;
    const int st = c->layout == STRIDED;
    if (cb_add(&b, c->xt, 2, shape, st, rng) < 0 || cb_add(&b, c->ot, 2, shape, st, rng) < 0 ||
        (c->per_row && cb_add(&b, FI_DTYPE_F32, 1, rs, st, rng) < 0)) {
        cb_free(&b);
        return 0;
    }
    fill(rng, &b, 0, -8, 8);
    if (c->per_row) fill(rng, &b, 2, 0.2, 3.0);
    if (c->nonfinite) /* row 0: a NaN; row 1: +inf; row 2: all -inf; row 3: some -inf */
        for (int64_t i = 0; i < c->v; i++) {
            if (i == c->v / 2) tu_view_set(&b.b[0].t, i, NAN);
            if (i == 0) tu_view_set(&b.b[0].t, c->v + i, INFINITY);
            tu_view_set(&b.b[0].t, 2 * c->v + i, -INFINITY);
            if (i % 2) tu_view_set(&b.b[0].t, 3 * c->v + i, -INFINITY);
        }
    int ok = cb_run(&b, softmax_fn, c);
    if (ok == 1) ok = cb_float(&b, 1, "probs", tu_dtype_tol(c->ot));
    cb_free(&b);
    return ok;
}

static void suite_softmax(void) {
    static const int64_t vs[] = {1, 7, 1000, 5000, 131072, 262144};
    static const char *const modes[] = {"scalar", "per_row_strided", "nonfinite", "misaligned"};
    for (grid g = {.ext = {LEN(vs), LEN(fdt), LEN(modes)}}; grid_next(&g);) {
        const int vi = g.i[0], di = g.i[1], mode = g.i[2];
        if ((mode == 2 && vs[vi] < 7) || (tu_opt.quick && (vi + di + mode) % 2)) continue;
        softmax_cfg c = {vi >= 4 ? 2 : 6, vs[vi], fdt[di],
                         di == 0 ? FI_DTYPE_F32 : fdt[(di + mode) % 3],
                         mode == 1 ? STRIDED : mode == 3 ? MISALIGNED : CONTIG, mode == 1, mode == 2};
        if (c.nonfinite) c.rows = 6;
        run_case("softmax", case_softmax, &c, "%s_to_%s/v%lld/%s", tu_dtype_name(c.xt),
                 tu_dtype_name(c.ot), (long long)c.v, modes[mode]);
    }
}

/* ============================================================= sampling */

typedef enum sample_op { S_PROBS, S_LOGITS, S_TOP_K, S_TOP_P, S_MIN_P, S_TOP_K_TOP_P, S_TOP_K_TOP_P_LOGITS } sample_op;
static const char *const sample_names[] = {"sampling_from_probs", "sampling_from_logits",
                                           "top_k_sampling", "top_p_sampling", "min_p_sampling",
                                           "top_k_top_p_from_probs", "top_k_top_p_from_logits"};

typedef struct sample_cfg {
    sample_op op;
    int64_t rows, v;
    fi_dtype dtype;
    int layout, per_row, use_indices, zeros;
    fi_filter_order order;
    int64_t batch;                       /* set by the case */
    uint64_t seed, offset;
    int x, idx, tk, tp, mp, out, valid; /* buffer slots */
    int32_t k_val;
    float p_val, m_val;
} sample_cfg;

static bool sample_logits(sample_op op) { return op == S_LOGITS || op == S_TOP_K_TOP_P_LOGITS; }

static fi_status sample_fn(fi_context *ctx, const fi_tensor *t, const void *p, void *s) {
    const sample_cfg *c = p;
    const fi_tensor *in = &t[c->x], *idx = c->idx >= 0 ? &t[c->idx] : NULL;
    const fi_tensor *tk = c->per_row ? &t[c->tk] : NULL, *tp = c->per_row ? &t[c->tp] : NULL;
    const fi_tensor *mp = c->per_row ? &t[c->mp] : NULL;
    fi_tensor *out = (fi_tensor *)&t[c->out], *valid = c->valid >= 0 ? (fi_tensor *)&t[c->valid] : NULL;
    switch (c->op) {
    case S_PROBS: return fi_sampling_from_probs(ctx, in, idx, c->seed, c->offset, out, valid, s);
    case S_LOGITS: return fi_sampling_from_logits(ctx, in, idx, c->seed, c->offset, out, valid, s);
    case S_TOP_K:
        return fi_top_k_sampling_from_probs(ctx, in, idx, tk, c->k_val, c->seed, c->offset, out,
                                            valid, s);
    case S_TOP_P:
        return fi_top_p_sampling_from_probs(ctx, in, idx, tp, c->p_val, c->seed, c->offset, out,
                                            valid, s);
    case S_MIN_P:
        return fi_min_p_sampling_from_probs(ctx, in, idx, mp, c->m_val, c->seed, c->offset, out,
                                            valid, s);
    case S_TOP_K_TOP_P:
        return fi_top_k_top_p_sampling_from_probs(ctx, in, idx, tk, c->k_val, tp, c->p_val,
                                                  c->order, c->seed, c->offset, out, valid, s);
    case S_TOP_K_TOP_P_LOGITS:
        return fi_top_k_top_p_sampling_from_logits(ctx, in, idx, tk, c->k_val, tp, c->p_val,
                                                   c->order, c->seed, c->offset, out, valid, s);
    }
    return FI_STATUS_INTERNAL;
}

/* Per-row parameters as tests/test_serving_ops.c draws them: k of 1, 2, 5,
 * V, 0 (off) or past V; top_p 0, 1 or in (0.05, 0.95); min_p in [0, 0.6). */
static void fill_params(tu_rng *rng, cbufs *b, const sample_cfg *c) {
    static const float ps[] = {0.0f, 0.3f, 0.6f, 0.9f, 1.0f};
    for (int64_t r = 0; r < c->batch; r++) {
        const int32_t kc[] = {1, 2, 5, (int32_t)c->v, 0, (int32_t)c->v + 3};
        tu_view_set(&b->b[c->tk].t, r, kc[tu_rng_int(rng, 0, 5)]);
        tu_view_set(&b->b[c->tp].t, r, r % 3 ? tu_rng_range(rng, 0.05, 0.95) : ps[tu_rng_int(rng, 0, 4)]);
        tu_view_set(&b->b[c->mp].t, r, tu_rng_range(rng, 0.0, 0.6));
    }
}

/* Rows of weights in [0, 1) (probs) or logits in [-4, 4), with ties (a
 * value repeated 3 places on) and, for probs, zeros. */
static void fill_rows(tu_rng *rng, cbufs *b, int i, int64_t rows, int64_t v, bool logits, bool zeros) {
    fill(rng, b, i, logits ? -4 : 0, logits ? 4 : 1);
    double *x = tu_view_read(&b->b[i].t);
    for (int64_t e = 0; e < rows * v; e++) {
        const int64_t col = e % v;
        if (!logits && zeros && col % 5 == 1) tu_view_set(&b->b[i].t, e, 0.0);
        else if (col % 7 == 3 && col > 3) tu_view_set(&b->b[i].t, e, x[e - 3]);
    }
    free(x);
}

static int case_sample(tu_rng *rng, const void *p) {
    sample_cfg c = *(const sample_cfg *)p;
    const bool logits = sample_logits(c.op);
    const int64_t shape[2] = {c.rows, c.v};
    c.batch = c.use_indices ? 2 * c.rows + 3 : c.rows;
    const int64_t bs[1] = {c.batch};
    const int st = c.layout == STRIDED;
    cbufs b;
    memset(&b, 0, sizeof b);
    b.misalign = c.layout == MISALIGNED;
    c.x = cb_add(&b, c.dtype, 2, shape, st, rng);
    c.idx = c.use_indices ? cb_add(&b, FI_DTYPE_I32, 1, bs, st, rng) : -1;
    c.tk = cb_add(&b, FI_DTYPE_I32, 1, bs, st, rng);
    c.tp = cb_add(&b, FI_DTYPE_F32, 1, bs, st, rng);
    c.mp = cb_add(&b, FI_DTYPE_F32, 1, bs, st, rng);
    c.out = cb_add(&b, FI_DTYPE_I32, 1, bs, st, rng);
    c.valid = cb_add(&b, FI_DTYPE_U8, 1, bs, st, rng);
    if (c.x < 0 || (c.use_indices && c.idx < 0) || c.valid < 0) {
        cb_free(&b);
        return 0;
    }
    fill_rows(rng, &b, c.x, c.rows, c.v, logits, c.zeros);
    for (int64_t r = 0; c.idx >= 0 && r < c.batch; r++)
        tu_view_set(&b.b[c.idx].t, r, tu_rng_int(rng, 0, (int32_t)c.rows - 1));
    fill_params(rng, &b, &c);
    c.k_val = c.v > 4 ? 4 : 1, c.p_val = 0.7f, c.m_val = 0.2f;
    c.seed = tu_rng_next(rng), c.offset = (uint64_t)tu_rng_int(rng, 0, 1000);
    int ok = cb_run(&b, sample_fn, &c);
    if (ok == 1) ok = cb_bits(&b, c.out, "samples") & cb_bits(&b, c.valid, "valid");
    cb_free(&b);
    return ok;
}

static void suite_sample(void) {
    static const int64_t vs[] = {1, 5, 37, 1000, 4100, 20000, 131072, 262144};
    static const char *const modes[] = {"scalar", "per_row_strided", "per_row_indices",
                                        "per_row_misaligned"};
    /* the filter order: both for the top-k + top-p pairs, else top-k first alone */
    for (grid g = {.ext = {LEN(sample_names), LEN(vs), LEN(fdt), LEN(modes), 2}}; grid_next(&g);) {
        const int op = g.i[0], vi = g.i[1], di = g.i[2], mode = g.i[3], order = g.i[4];
        const bool pair = op == S_TOP_K_TOP_P || op == S_TOP_K_TOP_P_LOGITS;
        if (order && !pair) continue;
        if (vi >= 6 && (mode == 1 || (vi + di + order + op) % 3)) continue;
        if (tu_opt.quick && ((mode + di + vi + order) % 3 || (vi == 7 && op % 2))) continue;
        sample_cfg c;
        memset(&c, 0, sizeof c);
        c.op = (sample_op)op, c.rows = vi >= 5 ? 5 : 13, c.v = vs[vi];
        c.dtype = fdt[di];
        c.layout = mode == 1 ? STRIDED : mode == 3 ? MISALIGNED : CONTIG;
        c.per_row = mode >= 1, c.use_indices = mode == 2, c.zeros = di != 2;
        c.order = (fi_filter_order)order;
        run_case("sample", case_sample, &c, "%s%s/%s/v%lld/%s", sample_names[op],
                 pair ? (order ? "/joint" : "/top_k_first") : "", tu_dtype_name(c.dtype),
                 (long long)c.v, modes[mode]);
    }
}

/* ================================================================ stats */

typedef struct stats_cfg {
    sample_op op;
    int32_t k;
    float p, m;
    fi_filter_order order;
    const int32_t *flips; /* -1 terminated: one mutant per token */
} stats_cfg;

/* Weights 1..9 with ties: 69 in all (tests/test_serving_ops.c's). */
static const double stats_w[16] = {9, 1, 7, 3, 7, 2, 5, 8, 4, 6, 2, 3, 1, 5, 4, 2};

static int case_stats(tu_rng *rng, const void *p) {
    const stats_cfg *s = p;
    const int64_t v = 16, n = tu_opt.quick ? 20000 : 60000, shape[2] = {1, v}, bs[1] = {n};
    const bool logits = sample_logits(s->op);
    sample_cfg c;
    memset(&c, 0, sizeof c);
    c.op = s->op, c.rows = 1, c.v = v, c.dtype = FI_DTYPE_F32, c.use_indices = 1;
    c.order = s->order, c.batch = n;
    cbufs b;
    memset(&b, 0, sizeof b);
    c.x = cb_add(&b, FI_DTYPE_F32, 2, shape, 0, rng);
    c.idx = cb_add(&b, FI_DTYPE_I32, 1, bs, 0, rng);
    c.tk = c.tp = c.mp = c.valid = -1;
    c.out = cb_add(&b, FI_DTYPE_I32, 1, bs, 0, rng);
    if (c.out < 0) return cb_free(&b), 0;
    for (int i = 0; i < 16; i++) tu_view_set(&b.b[c.x].t, i, logits ? log(stats_w[i]) : stats_w[i]);
    memset(b.b[c.idx].base, 0, b.b[c.idx].bytes); /* every draw from row 0 */
    c.k_val = s->k, c.p_val = s->p, c.m_val = s->m;
    c.seed = tu_rng_next(rng), c.offset = 7;
    int ok = cb_run(&b, sample_fn, &c);
    if (ok == 1) ok = cb_bits(&b, c.out, "samples");
    int64_t counts[16] = {0};
    const int32_t *got = b.b[c.out].base;
    for (int64_t d = 0; d < n && ok == 1; d++) {
        if (got[d] < 0 || got[d] >= v) {
            tu_note("draw %lld: token %d", (long long)d, got[d]);
            ok = 0;
        } else {
            counts[got[d]]++;
        }
    }
    /* the filtered distribution (the oracle's), as tests/test_serving_ops.c */
    double w[16], q[16], mass = 0.0, m = -INFINITY;
    bool keep[16];
    for (int i = 0; i < 16; i++) w[i] = logits ? (double)(float)log(stats_w[i]) : stats_w[i];
    for (int i = 0; i < 16; i++) m = fmax(m, w[i]);
    for (int i = 0; i < 16; i++) mass += logits ? exp(w[i] - m) : w[i];
    for (int i = 0; i < 16; i++) q[i] = logits ? exp(w[i] - m) / mass : w[i];
    const int32_t k = s->op == S_TOP_K || s->op >= S_TOP_K_TOP_P ? s->k : 0;
    const double tp = s->op == S_TOP_P || s->op >= S_TOP_K_TOP_P ? s->p : 1.0;
    if (s->op == S_TOP_K_TOP_P_LOGITS && s->order == FI_FILTER_TOP_K_FIRST) {
        bool kk[16];
        double r[16], kept = 0.0;
        oracle_filter(v, q, w, k, 1.0, -1.0, false, kk);
        for (int i = 0; i < 16; i++) kept += kk[i] ? q[i] : 0.0;
        for (int i = 0; i < 16; i++) r[i] = kk[i] ? q[i] / kept : 0.0;
        oracle_filter(v, r, NULL, 0, tp, -1.0, false, keep);
        for (int i = 0; i < 16; i++) keep[i] = keep[i] && kk[i];
    } else {
        oracle_filter(v, q, logits ? w : NULL, k, tp, s->op == S_MIN_P ? s->m : -1.0,
                      s->order == FI_FILTER_JOINT, keep);
    }
    double chi2;
    if (ok == 1 && !oracle_fits(counts, n, v, q, keep, &chi2)) {
        tu_note("GPU draws do not fit the filtered distribution: chi2 %.1f", chi2);
        ok = 0;
    }
    for (int f = 0; ok == 1 && s->flips && s->flips[f] >= 0; f++) {
        bool mutant[16];
        memcpy(mutant, keep, sizeof mutant);
        mutant[s->flips[f]] = !mutant[s->flips[f]];
        if (oracle_fits(counts, n, v, q, mutant, &chi2)) {
            tu_note("a mutant filter (token %d flipped) fits the draws too (chi2 %.1f)",
                    s->flips[f], chi2);
            ok = 0;
        }
    }
    cb_free(&b);
    return ok;
}

static void suite_stats(void) {
    static const int32_t k_flips[] = {4, 9, -1}, p_flips[] = {9, 6, -1}, m_flips[] = {3, 5, -1};
    static const int32_t kp_flips[] = {9, -1}, none[] = {-1};
    const stats_cfg cases[] = {
        {S_PROBS, 0, 1.0f, 0.0f, FI_FILTER_TOP_K_FIRST, none},
        {S_LOGITS, 0, 1.0f, 0.0f, FI_FILTER_TOP_K_FIRST, none},
        {S_TOP_K, 3, 1.0f, 0.0f, FI_FILTER_TOP_K_FIRST, k_flips},
        {S_TOP_P, 0, 0.5f, 0.0f, FI_FILTER_TOP_K_FIRST, p_flips},
        {S_MIN_P, 0, 1.0f, 0.25f, FI_FILTER_TOP_K_FIRST, m_flips},
        {S_TOP_K_TOP_P, 5, 0.6f, 0.0f, FI_FILTER_TOP_K_FIRST, kp_flips},
        {S_TOP_K_TOP_P, 5, 0.6f, 0.0f, FI_FILTER_JOINT, kp_flips},
        {S_TOP_K_TOP_P_LOGITS, 5, 0.6f, 0.0f, FI_FILTER_TOP_K_FIRST, kp_flips},
        {S_TOP_K_TOP_P_LOGITS, 5, 0.6f, 0.0f, FI_FILTER_JOINT, kp_flips},
    };
    for (int i = 0; i < LEN(cases); i++) {
        const bool pair = cases[i].op >= S_TOP_K_TOP_P;
        run_case("stats", case_stats, &cases[i], "%s%s", sample_names[cases[i].op],
                 pair ? (cases[i].order ? "/joint" : "/top_k_first") : "");
    }
}

/* =============================================================== filter */

enum { F_TOP_K_RENORM, F_TOP_P_RENORM, F_TOP_K_MASK };

typedef struct filter_cfg {
    int op; /* F_* */
    int64_t rows, v;
    fi_dtype dtype;
    int layout, per_row, in_place;
} filter_cfg;

static fi_status filter_fn(fi_context *ctx, const fi_tensor *t, const void *p, void *s) {
    const filter_cfg *c = p; /* x, top_k, top_p[, out] */
    fi_tensor *out = (fi_tensor *)&t[c->in_place ? 0 : 3];
    const fi_tensor *tk = c->per_row ? &t[1] : NULL, *tp = c->per_row ? &t[2] : NULL;
    const int32_t k = c->v > 4 ? 4 : 1;
    if (c->op == F_TOP_K_RENORM) return fi_top_k_renorm_probs(ctx, &t[0], tk, k, out, s);
    if (c->op == F_TOP_P_RENORM) return fi_top_p_renorm_probs(ctx, &t[0], tp, 0.7f, out, s);
    return fi_top_k_mask_logits(ctx, &t[0], tk, k, out, s);
}

static int case_filter(tu_rng *rng, const void *p) {
    const filter_cfg *c = p;
    const bool mask = c->op == F_TOP_K_MASK;
    const int64_t shape[2] = {c->rows, c->v}, rs[1] = {c->rows};
    const int st = c->layout == STRIDED;
    cbufs b;
    memset(&b, 0, sizeof b);
    b.misalign = c->layout == MISALIGNED;
    if (cb_add(&b, c->dtype, 2, shape, st, rng) < 0 || cb_add(&b, FI_DTYPE_I32, 1, rs, st, rng) < 0 ||
        cb_add(&b, FI_DTYPE_F32, 1, rs, st, rng) < 0 ||
        (!c->in_place && cb_add(&b, mask ? c->dtype : FI_DTYPE_F32, 2, shape, st, rng) < 0)) {
        cb_free(&b);
        return 0;
    }
    fill_rows(rng, &b, 0, c->rows, c->v, mask, !mask);
    if (mask && c->rows > 1) tu_view_set(&b.b[0].t, c->v, NAN); /* NaN ranks above +inf */
    sample_cfg pc;
    memset(&pc, 0, sizeof pc);
    pc.rows = pc.batch = c->rows, pc.v = c->v, pc.tk = 1, pc.tp = 2, pc.mp = 2;
    fill_params(rng, &b, &pc);
    for (int64_t r = 0; r < c->rows; r++) /* min_p's draw overwrote top_p */
        tu_view_set(&b.b[2].t, r, r % 3 ? tu_rng_range(rng, 0.05, 0.95) : (r % 2 ? 1.0 : 0.0));
    int ok = cb_run(&b, filter_fn, c);
    const int out = c->in_place ? 0 : 3;
    if (ok == 1) ok = mask ? cb_bits(&b, out, "out") : cb_float(&b, out, "out", tu_dtype_tol(b.b[out].t.dtype));
    cb_free(&b);
    return ok;
}

static void suite_filter(void) {
    static const char *const names[] = {"top_k_renorm_probs", "top_p_renorm_probs", "top_k_mask_logits"};
    static const int64_t vs[] = {1, 9, 600, 20000, 262144};
    for (grid g = {.ext = {LEN(names), LEN(vs), LEN(fdt), 4}}; grid_next(&g);) {
        const int op = g.i[0], vi = g.i[1], di = g.i[2], mode = g.i[3];
        if ((vi == 4 && (mode == 1 || (op + di + mode) % 3)) || (tu_opt.quick && (vi + di + mode) % 3))
            continue;
        const filter_cfg c = {op, vi == 4 ? 2 : 6, vs[vi], fdt[di],
                              mode == 1 ? STRIDED : mode == 3 ? MISALIGNED : CONTIG, mode >= 1,
                              mode == 2 && (op == F_TOP_K_MASK || di == 0)};
        run_case("filter", case_filter, &c, "%s/%s/v%lld/%s%s", names[op], tu_dtype_name(c.dtype),
                 (long long)c.v, mode == 0 ? "scalar" : "per_row_",
                 mode == 0 ? "" : mode == 1 ? "strided" : mode == 3 ? "misaligned"
                 : c.in_place ? "in_place" : "contiguous");
    }
}

/* ================================================================= spec */

typedef struct spec_cfg {
    int64_t batch, n, v;
    fi_dtype dt, tt;
    int layout;
    uint64_t seed;
} spec_cfg;

static fi_status spec_fn(fi_context *ctx, const fi_tensor *t, const void *p, void *s) {
    const spec_cfg *c = p; /* draft, target, ids, out, accepted, emitted */
    return fi_chain_speculative_sampling(ctx, &t[0], &t[2], &t[1], c->seed, 3, (fi_tensor *)&t[3],
                                         (fi_tensor *)&t[4], (fi_tensor *)&t[5], s);
}

/* Rows of distributions (a fifth of the entries 0), normalised. */
static void fill_dists(tu_rng *rng, cbufs *b, int i, int64_t rows, int64_t v) {
    double *w = malloc((size_t)v * sizeof *w);
    for (int64_t r = 0; r < rows; r++) {
        double s = 0.0;
        for (int64_t x = 0; x < v; x++) s += w[x] = tu_rng_uniform(rng) < 0.2 ? 0.0 : tu_rng_uniform(rng);
        if (s == 0.0) w[0] = s = 1.0;
        for (int64_t x = 0; x < v; x++) tu_view_set(&b->b[i].t, r * v + x, w[x] / s);
    }
    free(w);
}

static int case_spec(tu_rng *rng, const void *p) {
    spec_cfg c = *(const spec_cfg *)p;
    const int64_t B = c.batch, n = c.n, v = c.v;
    const int64_t ds[3] = {B, n, v}, ts[3] = {B, n + 1, v}, is[2] = {B, n}, os[2] = {B, n + 1};
    const int64_t bs[1] = {B};
    const int st = c.layout == STRIDED;
    cbufs b;
    memset(&b, 0, sizeof b);
    b.misalign = c.layout == MISALIGNED;
    if (cb_add(&b, c.dt, 3, ds, st, rng) < 0 || cb_add(&b, c.tt, 3, ts, st, rng) < 0 ||
        cb_add(&b, FI_DTYPE_I32, 2, is, st, rng) < 0 || cb_add(&b, FI_DTYPE_I32, 2, os, st, rng) < 0 ||
        cb_add(&b, FI_DTYPE_I32, 1, bs, st, rng) < 0 || cb_add(&b, FI_DTYPE_I32, 1, bs, st, rng) < 0) {
        cb_free(&b);
        return 0;
    }
    fill_dists(rng, &b, 0, B * n, v), fill_dists(rng, &b, 1, B * (n + 1), v);
    double *d = tu_view_read(&b.b[0].t);
    for (int64_t r = 0; r < B; r++)
        for (int64_t i = 0; i < n; i++) {
            int32_t id = tu_rng_int(rng, 0, (int32_t)v - 1);
            for (int64_t x = 0; x < v && d[(r * n + i) * v + id] == 0.0; x++) id = (int32_t)x;
            tu_view_set(&b.b[2].t, r * n + i, id);
            if (r == 0) /* request 0: target = draft, all accepted */
                for (int64_t x = 0; x < v; x++) tu_view_set(&b.b[1].t, i * v + x, d[i * v + x]);
            if (r == 1 && i == 0) /* request 1: its first draft has target 0 */
                tu_view_set(&b.b[1].t, (n + 1) * v + id, 0.0);
        }
    free(d);
    for (int64_t r = 0; r < B; r++) tu_view_set(&b.b[4].t, r, (double)r), tu_view_set(&b.b[5].t, r, 100);
    c.seed = tu_rng_next(rng);
    int ok = cb_run(&b, spec_fn, &c);
    if (ok == 1)
        ok = cb_bits(&b, 3, "output_token_ids") & cb_bits(&b, 4, "accepted_num") &
             cb_bits(&b, 5, "emitted_num");
    cb_free(&b);
    return ok;
}

static void suite_spec(void) {
    static const int64_t shapes[][3] = {{3, 1, 4}, {9, 3, 50}, {5, 5, 1000}, {2, 0, 7}, {4, 3, 131072}};
    for (grid g = {.ext = {LEN(shapes), LEN(fdt), LEN(layout_names)}}; grid_next(&g);) {
        const int si = g.i[0], di = g.i[1], layout = g.i[2];
        if ((si == 4 || tu_opt.quick) && (di + layout + si) % 3) continue;
        spec_cfg c = {shapes[si][0], shapes[si][1], shapes[si][2], fdt[di], fdt[(di + layout) % 3],
                      layout, 0};
        run_case("spec", case_spec, &c, "d%s_t%s/b%lld_n%lld_v%lld/%s", tu_dtype_name(c.dt),
                 tu_dtype_name(c.tt), (long long)c.batch, (long long)c.n, (long long)c.v,
                 layout_names[layout]);
    }
}

/* ================================================================= topk */

typedef struct topk_cfg {
    int64_t rows, cols;
    int32_t k;
    fi_dtype dtype;
    int layout, ragged, lengths, nan;
} topk_cfg;

static fi_status topk_fn(fi_context *ctx, const fi_tensor *t, const void *p, void *s) {
    const topk_cfg *c = p; /* x, values, indices, lengths, offsets, indptr */
    fi_tensor *vals = (fi_tensor *)&t[1], *idx = (fi_tensor *)&t[2];
    if (c->ragged) return fi_top_k_ragged(ctx, &t[0], &t[5], c->k, vals, idx, s);
    return fi_top_k(ctx, &t[0], c->k, c->lengths ? &t[3] : NULL, c->lengths ? &t[4] : NULL, vals,
                    idx, s);
}

static int case_topk(tu_rng *rng, const void *p) {
    const topk_cfg *c = p;
    const int64_t R = c->rows, ks[2] = {R, c->k}, rs[1] = {R}, ps[1] = {R + 1};
    int32_t *len = malloc((size_t)R * sizeof *len), total = 0;
    for (int64_t r = 0; r < R; r++) {
        len[r] = c->lengths || c->ragged ? tu_rng_int(rng, 0, (int32_t)c->cols) : (int32_t)c->cols;
        total += len[r];
    }
    const int64_t s2[2] = {R, c->cols}, s1[1] = {total + 2};
    const int st = c->layout == STRIDED;
    cbufs b;
    memset(&b, 0, sizeof b);
    b.misalign = c->layout == MISALIGNED;
    int ok = cb_add(&b, c->dtype, c->ragged ? 1 : 2, c->ragged ? s1 : s2, st, rng) >= 0 &&
             cb_add(&b, c->dtype, 2, ks, st, rng) >= 0 && cb_add(&b, FI_DTYPE_I32, 2, ks, st, rng) >= 0 &&
             cb_add(&b, FI_DTYPE_I32, 1, rs, st, rng) >= 0 && cb_add(&b, FI_DTYPE_I32, 1, rs, st, rng) >= 0 &&
             cb_add(&b, FI_DTYPE_I32, 1, ps, st, rng) >= 0;
    if (!ok) {
        free(len);
        cb_free(&b);
        return 0;
    }
    fill(rng, &b, 0, -3, 3);
    const int64_t n = tu_numel(&b.b[0].t);
    double *x = tu_view_read(&b.b[0].t);
    for (int64_t e = 3; e < n; e += 5) tu_view_set(&b.b[0].t, e, x[e - 3]); /* ties */
    free(x);
    if (c->nan && n > 4) tu_view_set(&b.b[0].t, 4, NAN);
    int32_t at = 0;
    tu_view_set(&b.b[5].t, 0, 0);
    for (int64_t r = 0; r < R; r++) {
        tu_view_set(&b.b[3].t, r, len[r]);
        tu_view_set(&b.b[4].t, r, c->lengths ? tu_rng_int(rng, 0, 1000) : 0);
        tu_view_set(&b.b[5].t, r + 1, at += len[r]);
    }
    free(len);
    ok = cb_run(&b, topk_fn, c);
    if (ok == 1) ok = cb_bits(&b, 2, "indices") & cb_bits(&b, 1, "values");
    cb_free(&b);
    return ok;
}

static void suite_topk(void) {
    static const int64_t shapes[][2] = {{3, 1}, {5, 40}, {4, 3000}, {3, 20000}, {2, 262144}};
    static const int32_t ks[] = {1, 5, 45, 2048, 5000};
    static const char *const modes[] = {"dense_nan", "strided", "lengths_offsets", "ragged",
                                        "misaligned"};
    for (grid g = {.ext = {LEN(shapes), LEN(ks), LEN(fdt), LEN(modes)}}; grid_next(&g);) {
        const int si = g.i[0], ki = g.i[1], di = g.i[2], mode = g.i[3];
        if ((si == 4 && (mode == 1 || (ki + di + mode) % 3)) ||
            (tu_opt.quick && (si + ki + di + mode) % 3))
            continue;
        topk_cfg c = {shapes[si][0], shapes[si][1], ks[ki], fdt[di],
                      mode == 1 ? STRIDED : mode == 4 ? MISALIGNED : CONTIG, mode == 3, mode == 2,
                      di == 0 && mode == 0};
        run_case("topk", case_topk, &c, "%s/r%lld_n%lld_k%d/%s", tu_dtype_name(c.dtype),
                 (long long)c.rows, (long long)c.cols, c.k, modes[mode]);
    }
}

/* ================================================================ graph */

/* One layer's serving ops in a row: RMSNorm, fused add + RMSNorm (in
 * place), SiLU-and-mul, softmax, top-k/top-p sampling from logits, top-k. */
enum { GT = 8, GH = 4096, GD = 1376, GV = 32000, GK = 50 };

static fi_status graph_fn(fi_context *ctx, const fi_tensor *t, const void *p, void *s) {
    (void)p;
    fi_tensor *v = (fi_tensor *)t;
    fi_status st = fi_rmsnorm(ctx, &v[0], &v[1], 1e-6f, &v[3], s);
    if (!st) st = fi_fused_add_rmsnorm(ctx, &v[0], &v[2], &v[1], 1e-6f, s);
    if (!st) st = fi_silu_and_mul(ctx, &v[4], &v[5], s);
    if (!st) st = fi_softmax(ctx, &v[6], NULL, 0.9f, &v[7], s);
    if (!st)
        st = fi_top_k_top_p_sampling_from_logits(ctx, &v[6], NULL, NULL, 40, NULL, 0.9f,
                                                 FI_FILTER_JOINT, 1234, 5, &v[8], NULL, s);
    if (!st) st = fi_top_k(ctx, &v[7], GK, NULL, NULL, &v[10], &v[9], s);
    return st;
}

static void graph_fill(tu_rng *rng, cbufs *b) {
    fill(rng, b, 0, -2, 2), fill(rng, b, 1, -1, 1), fill(rng, b, 2, -2, 2);
    fill(rng, b, 4, -4, 4), fill(rng, b, 6, -6, 6);
}

static int graph_check(const cbufs *b, const char *when) {
    int ok = cb_float(b, 3, "rmsnorm", 2e-2) & cb_float(b, 0, "fused_add_rmsnorm", 2e-2) &
             cb_float(b, 2, "residual", 1e-2) & cb_float(b, 5, "silu_and_mul", 2e-2) &
             cb_float(b, 7, "softmax", 1e-5) & cb_bits(b, 8, "samples") &
             cb_bits(b, 9, "top_k indices") & cb_bits(b, 10, "top_k values");
    if (!ok) tu_note("%s", when);
    return ok;
}

static int case_graph(tu_rng *rng, const void *p) {
    const int cold = *(const int *)p; /* a fresh context: compiled inside the capture */
    const int64_t x2[2] = {GT, GH}, h1[1] = {GH}, a2[2] = {GT, 2 * GD}, o2[2] = {GT, GD};
    const int64_t l2[2] = {GT, GV}, b1[1] = {GT}, k2[2] = {GT, GK};
    cbufs b;
    memset(&b, 0, sizeof b);
    const int ok0 = cb_add(&b, FI_DTYPE_BF16, 2, x2, 0, rng) >= 0 && cb_add(&b, FI_DTYPE_BF16, 1, h1, 0, rng) >= 0 &&
                    cb_add(&b, FI_DTYPE_BF16, 2, x2, 0, rng) >= 0 && cb_add(&b, FI_DTYPE_BF16, 2, x2, 0, rng) >= 0 &&
                    cb_add(&b, FI_DTYPE_BF16, 2, a2, 0, rng) >= 0 && cb_add(&b, FI_DTYPE_BF16, 2, o2, 0, rng) >= 0 &&
                    cb_add(&b, FI_DTYPE_F32, 2, l2, 0, rng) >= 0 && cb_add(&b, FI_DTYPE_F32, 2, l2, 0, rng) >= 0 &&
                    cb_add(&b, FI_DTYPE_I32, 1, b1, 0, rng) >= 0 && cb_add(&b, FI_DTYPE_I32, 2, k2, 0, rng) >= 0 &&
                    cb_add(&b, FI_DTYPE_F32, 2, k2, 0, rng) >= 0;
    if (!ok0) return cb_free(&b), 0;
    graph_fill(rng, &b);
    int ok = cb_run(&b, graph_fn, NULL); /* the CPU, and eager CUDA runs */
    if (ok == 1) ok = graph_check(&b, "eager runs");
    if (ok != 1) return cb_free(&b), ok;
    void *eager[MAXB];
    for (int i = 0; i < b.n; i++) eager[i] = ops_snapshot(&b.b[i]);
    fi_context *ctx = g_cuda;
    if (cold) {
        fi_context_options opt;
        fi_context_options_init(&opt);
        opt.device = FI_DEVICE_CUDA;
        ok = ops_check_ok(fi_context_create(&opt, &ctx), "fi_context_create");
    }
    gu_graph graph = NULL;
    gu_exec exec = NULL;
    for (int i = 0; i < b.n && ok; i++) ok = dm_write(&b.dm[i], b.orig[i]);
    if (ok && device_sync()) {
        ok = !GU(gu.BeginCapture(g_stream, 0 /* global mode */));
        const fi_status st = ok ? graph_fn(ctx, b.dev, NULL, g_stream) : FI_OK;
        const int end = GU(gu.EndCapture(g_stream, &graph));
        ok = ok && ops_check_ok(st, "the ops inside a capture") && !end &&
             !GU(gu.GraphInstantiate(&exec, graph, 0));
    }
    /* the capture ran nothing: replay on the captured inputs (bitwise the
     * eager run), then twice on fresh inputs (the CPU's results) */
    for (int round = 0; round < 3 && ok; round++) {
        if (round > 0) {
            for (int i = 0; i < b.n; i++) memcpy(b.b[i].base, b.orig[i], b.b[i].bytes);
            graph_fill(rng, &b);
            for (int i = 0; i < b.n; i++) {
                free(b.orig[i]);
                b.orig[i] = ops_snapshot(&b.b[i]);
                b.host[i] = b.b[i].t;
            }
            ok = ops_check_ok(graph_fn(g_cpu, b.host, NULL, NULL), "the ops on the CPU");
            for (int i = 0; i < b.n; i++) {
                free(b.cpu[i]);
                b.cpu[i] = ops_snapshot(&b.b[i]);
            }
        }
        for (int i = 0; i < b.n && ok; i++) ok = dm_write(&b.dm[i], b.orig[i]);
        ok = ok && device_sync() && !GU(gu.GraphLaunch(exec, g_stream)) && device_sync() &&
             cb_download(&b);
        if (ok && round == 0)
            for (int i = 0; i < b.n; i++)
                if (memcmp(b.b[i].base, eager[i], b.b[i].bytes)) {
                    tu_note("graph replay: buffer %d is not bitwise the eager run's", i);
                    ok = 0;
                }
        if (ok && round > 0) ok = graph_check(&b, "a replay on new inputs");
    }
    if (exec) gu.GraphExecDestroy(exec);
    if (graph) gu.GraphDestroy(graph);
    if (cold && ctx != g_cuda) fi_context_destroy(ctx);
    for (int i = 0; i < b.n; i++) free(eager[i]);
    cb_free(&b);
    return ok;
}

static void suite_graph(void) {
    static const int warm = 0, cold = 1;
    run_case("graph", case_graph, &warm, "warm/norms+act+softmax+sampling+top_k");
    run_case("graph", case_graph, &cold, "cold_jit_inside_capture/norms+act+softmax+sampling+top_k");
}

/* ============================================================ bad input */

/* Valid arguments for every op, host and device copies; each case breaks
 * one the same way on both and expects the CPU's status and message. */
enum {
    B_X, B_RES, B_W, B_OUT, B_Q8, B_AO, B_PR, B_SA, B_VA, B_IDX, B_TK, B_TP, B_REN, B_DP, B_T3,
    B_IDS, B_OI, B_ACC, B_VL, B_KI, B_PTR, B_CACHE, B_POS, B_Q, B_K, B_QO, B_KO, NBAD
};

typedef struct bad_env {
    tu_buf b[NBAD];
    gu_mirror dm[NBAD];
    fi_tensor host[NBAD], dev[NBAD];
} bad_env;

static int bad_env_alloc(bad_env *e, tu_rng *rng) {
    static const int64_t shapes[NBAD][4] = {
        {2, 4, 8}, {2, 4, 8}, {1, 8}, {2, 4, 8}, {2, 4, 8}, {2, 4, 4}, {2, 4, 8}, {1, 4}, {1, 4},
        {1, 4}, {1, 4}, {1, 4}, {2, 4, 8}, {3, 4, 2, 8}, {3, 4, 3, 8}, {2, 4, 2}, {2, 4, 3},
        {1, 4}, {2, 4, 3}, {2, 4, 3}, {1, 5}, {2, 4, 4}, {1, 4}, {3, 4, 2, 4}, {3, 4, 1, 4},
        {3, 4, 2, 4}, {3, 4, 1, 4}};
    static const fi_dtype dts[NBAD] = {
        FI_DTYPE_F32, FI_DTYPE_F32, FI_DTYPE_F32, FI_DTYPE_F32, FI_DTYPE_E4M3, FI_DTYPE_F32,
        FI_DTYPE_F32, FI_DTYPE_I32, FI_DTYPE_U8, FI_DTYPE_I32, FI_DTYPE_I32, FI_DTYPE_F32,
        FI_DTYPE_F32, FI_DTYPE_F32, FI_DTYPE_F32, FI_DTYPE_I32, FI_DTYPE_I32, FI_DTYPE_I32,
        FI_DTYPE_F32, FI_DTYPE_I32, FI_DTYPE_I32, FI_DTYPE_F32, FI_DTYPE_I32, FI_DTYPE_F32,
        FI_DTYPE_F32, FI_DTYPE_F32, FI_DTYPE_F32};
    for (int i = 0; i < NBAD; i++) {
        if (tu_buf_alloc(&e->b[i], dts[i], (int32_t)shapes[i][0], &shapes[i][1])) return -1;
        tu_buf_poison(&e->b[i]);
    }
    tu_fill_uniform(rng, &e->b[B_X].t, -1, 1, 0), tu_fill_uniform(rng, &e->b[B_RES].t, -1, 1, 0);
    tu_fill_uniform(rng, &e->b[B_W].t, -1, 1, 0), tu_fill_uniform(rng, &e->b[B_PR].t, 0, 1, 0);
    tu_fill_uniform(rng, &e->b[B_DP].t, 0, 1, 0), tu_fill_uniform(rng, &e->b[B_T3].t, 0, 1, 0);
    tu_fill_uniform(rng, &e->b[B_CACHE].t, -1, 1, 0), tu_fill_uniform(rng, &e->b[B_Q].t, -1, 1, 0);
    tu_fill_uniform(rng, &e->b[B_K].t, -1, 1, 0);
    for (int i = 0; i < 4; i++) {
        tu_view_set(&e->b[B_IDX].t, i, 3 - i), tu_view_set(&e->b[B_TK].t, i, i + 1);
        tu_view_set(&e->b[B_TP].t, i, 0.25 * (i + 1)), tu_view_set(&e->b[B_ACC].t, i, 0);
        tu_view_set(&e->b[B_POS].t, i, 3 - i);
    }
    for (int i = 0; i < 8; i++) tu_view_set(&e->b[B_IDS].t, i, i % 8);
    static const int32_t ptr[5] = {0, 3, 3, 8, 8};
    for (int i = 0; i < 5; i++) tu_view_set(&e->b[B_PTR].t, i, ptr[i]);
    for (int i = 0; i < NBAD; i++) {
        e->host[i] = e->b[i].t;
        if (!g_device) continue;
        if (!gu_mirror_up(&e->dm[i], &e->b[i], 0)) return -1;
        e->dev[i] = e->b[i].t;
        e->dev[i].data = (void *)(uintptr_t)(e->dm[i].dev + GU_GUARD);
    }
    return 0;
}

static void bad_env_free(bad_env *e) {
    for (int i = 0; i < NBAD; i++) {
        gu_mirror_free(&e->dm[i]);
        tu_buf_free(&e->b[i]);
    }
}

typedef struct bad_case {
    const char *name;
    const char *message;
} bad_case;

/* Refused by the core's checks on both backends (FI_STATUS_INVALID_ARGUMENT). */
static const bad_case bad_cases[] = {
    {"rmsnorm/null_input", "input: tensor is NULL"},
    {"rmsnorm/input_i32", "input.dtype is i32"},
    {"rmsnorm/weight_len", "weight.shape[0]=7, expected 8"},
    {"rmsnorm/out_shape", "out.shape[0]=3, expected 4"},
    {"rmsnorm/out_overlaps_weight", "weight"},
    {"rmsnorm/eps_negative", "eps=-1"},
    {"rmsnorm/misaligned", "not aligned"},
    {"rmsnorm/out_fp8", "out.dtype is e4m3"},
    {"fused_add/residual_is_input", "residual"},
    {"quant/out_f32", "expected e4m3 or e5m2"},
    {"quant/scale_zero", "scale=0"},
    {"act/odd_last_dim", "must be even"},
    {"act/out_overlaps_input", "input"},
    {"softmax/temperature_zero", "temperature=0"},
    {"softmax/probs_shape", "probs.shape[1]=7"},
    {"sample/samples_f32", "samples.dtype is f32"},
    {"sample/samples_broadcast", "samples"},
    {"sample/probs_3d", "probs.ndim is 3, expected 2"},
    {"top_p/above_one", "top_p=1.5 is outside [0, 1]"},
    {"top_k_top_p/order", "order=5"},
    {"renorm/out_overlaps_probs", "probs"},
    {"mask/out_dtype", "bit for bit"},
    {"spec/target_tokens", "target_probs.shape[1]=2, expected 3"},
    {"spec/out_is_accepted", "accepted_num"},
    {"top_k/k_zero", "k=0 must be >= 1"},
    {"top_k/values_dtype", "values.dtype is f16 but input.dtype is f32"},
    {"rope_cache/rotary_odd", "must be even"},
    {"rope_cache/cache_f16", "cos_sin_cache.dtype is f16"},
    {"rope_cache/k_out_is_q", "k_out"},
};
#define NUM_BAD ((int)(sizeof bad_cases / sizeof bad_cases[0]))

static fi_status bad_call(const char *n, fi_context *ctx, const fi_tensor *v) {
    fi_tensor x = v[B_X], w = v[B_W], out = v[B_OUT], q8 = v[B_Q8], ao = v[B_AO];
    fi_tensor pr = v[B_PR], sa = v[B_SA], va = v[B_VA], rn = v[B_REN], dp = v[B_DP], t3 = v[B_T3];
    fi_tensor ids = v[B_IDS], oi = v[B_OI], ac = v[B_ACC], vl = v[B_VL], ki = v[B_KI];
    fi_tensor cache = v[B_CACHE], pos = v[B_POS], q = v[B_Q], k = v[B_K], qo = v[B_QO], ko = v[B_KO];
    if (!strcmp(n, "rmsnorm/null_input")) return fi_rmsnorm(ctx, NULL, &w, 1e-6f, &out, NULL);
    if (!strcmp(n, "rmsnorm/input_i32")) x.dtype = FI_DTYPE_I32;
    if (!strcmp(n, "rmsnorm/weight_len")) w.shape[0] = 7;
    if (!strcmp(n, "rmsnorm/out_shape")) out.shape[0] = 3;
    if (!strcmp(n, "rmsnorm/out_overlaps_weight")) out.data = w.data;
    if (!strcmp(n, "rmsnorm/misaligned")) x.data = (char *)x.data + 2;
    if (!strncmp(n, "rmsnorm/", 8))
        return fi_rmsnorm(ctx, &x, &w, !strcmp(n, "rmsnorm/eps_negative") ? -1.0f : 1e-6f,
                          !strcmp(n, "rmsnorm/out_fp8") ? &q8 : &out, NULL);
    if (!strcmp(n, "fused_add/residual_is_input")) return fi_fused_add_rmsnorm(ctx, &x, &x, &w, 1e-6f, NULL);
    if (!strcmp(n, "quant/out_f32")) return fi_rmsnorm_quant(ctx, &x, &w, 1.0f, 1e-6f, &out, NULL);
    if (!strcmp(n, "quant/scale_zero")) return fi_rmsnorm_quant(ctx, &x, &w, 0.0f, 1e-6f, &q8, NULL);
    if (!strcmp(n, "act/odd_last_dim")) x.shape[1] = 7;
    if (!strcmp(n, "act/out_overlaps_input")) ao.data = x.data;
    if (!strncmp(n, "act/", 4)) return fi_silu_and_mul(ctx, &x, &ao, NULL);
    if (!strcmp(n, "softmax/probs_shape")) rn.shape[1] = 7;
    if (!strncmp(n, "softmax/", 8))
        return fi_softmax(ctx, &pr, NULL, !strcmp(n, "softmax/temperature_zero") ? 0.0f : 1.0f, &rn, NULL);
    if (!strcmp(n, "sample/samples_f32")) sa.dtype = FI_DTYPE_F32;
    if (!strcmp(n, "sample/samples_broadcast")) sa.stride[0] = 0;
    if (!strcmp(n, "sample/probs_3d")) pr = dp;
    if (!strncmp(n, "sample/", 7)) return fi_sampling_from_probs(ctx, &pr, NULL, 1, 2, &sa, &va, NULL);
    if (!strcmp(n, "top_p/above_one"))
        return fi_top_p_sampling_from_probs(ctx, &pr, NULL, NULL, 1.5f, 1, 2, &sa, NULL, NULL);
    if (!strcmp(n, "top_k_top_p/order"))
        return fi_top_k_top_p_sampling_from_probs(ctx, &pr, NULL, NULL, 2, NULL, 0.5f,
                                                  (fi_filter_order)5, 1, 2, &sa, NULL, NULL);
    if (!strcmp(n, "renorm/out_overlaps_probs")) {
        rn = pr, rn.data = (float *)pr.data + 8, rn.shape[0] = 3, pr.shape[0] = 3;
        return fi_top_k_renorm_probs(ctx, &pr, NULL, 3, &rn, NULL);
    }
    if (!strcmp(n, "mask/out_dtype")) {
        rn.dtype = FI_DTYPE_F16;
        return fi_top_k_mask_logits(ctx, &pr, NULL, 3, &rn, NULL);
    }
    if (!strcmp(n, "spec/target_tokens")) t3.shape[1] = 2;
    if (!strcmp(n, "spec/out_is_accepted")) ac.data = oi.data;
    if (!strncmp(n, "spec/", 5))
        return fi_chain_speculative_sampling(ctx, &dp, &ids, &t3, 1, 2, &oi, &ac, NULL, NULL);
    if (!strcmp(n, "top_k/values_dtype")) vl.dtype = FI_DTYPE_F16;
    if (!strncmp(n, "top_k/", 6))
        return fi_top_k(ctx, &x, !strcmp(n, "top_k/k_zero") ? 0 : 3, NULL, NULL, &vl, &ki, NULL);
    if (!strcmp(n, "rope_cache/rotary_odd")) cache.shape[1] = 3;
    if (!strcmp(n, "rope_cache/cache_f16")) cache.dtype = FI_DTYPE_F16;
    if (!strcmp(n, "rope_cache/k_out_is_q")) ko = q, ko.shape[1] = 1;
    if (!strncmp(n, "rope_cache/", 11))
        return fi_rope_apply_cos_sin_cache(ctx, &pos, &q, &k, &cache, 1, &qo, &ko, NULL);
    return FI_STATUS_INTERNAL;
}

/* Values in device tensors that the CPU refuses (it reads them on the
 * host) but CUDA cannot see without a sync: the CPU's status, and on CUDA
 * the kernels' documented handling (kernels/sampling.cuh, serving.cuh). */
static int device_value_cases(bad_env *e, const char *name) {
    fi_tensor *h = e->host, *d = e->dev;
    int bad = 0;
    char what[160];
    /* each: set the bad value on host and device, the CPU refuses, CUDA runs */
    struct { const char *case_name; int buf; int64_t at; double bad, good; const char *needle; } dv[] = {
        {"sample/index_past_rows", B_IDX, 1, 4, 2, "indices[1]=4 is outside [0, 3]"},
        {"top_p/row_negative", B_TP, 3, -0.5, 1.0, "top_p[3]=-0.5"},
        {"softmax/temperature_row_negative", B_TP, 2, -1, 0.75, "temperature[2]=-1"},
        {"spec/draft_id_past_vocab", B_IDS, 2, 8, 2, "draft_token_ids[1][0]=8"},
        {"top_k/length_past_cols", B_TK, 2, 9, 3, "lengths[2]=9 is outside [0, 8]"},
        {"rope_cache/position_past_cache", B_POS, 1, 4, 2, "positions[1]=4 is not a row"},
        {"qk_norm_rope/position_past_cache", B_POS, 1, 4, 2, "positions[1]=4 is not a row"},
    };
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++) {
        snprintf(what, sizeof what, "%s/%s", name, dv[i].case_name);
        if (!tu_begin_case(what)) continue;
        tu_buf *b = &e->b[dv[i].buf];
        tu_view_set(&b->t, dv[i].at, dv[i].bad);
        int ok = 1;
        for (int ctx_i = 0; ctx_i < 2 && ok; ctx_i++) {
            const bool cuda = ctx_i == 1;
            if (cuda && !g_device) break;
            fi_context *ctx = cuda ? g_cuda : g_cpu;
            fi_tensor *v = cuda ? d : h;
            if (cuda) {
                for (int j = 0; j < NBAD; j++) ok &= dm_write(&e->dm[j], e->b[j].base);
                ok &= device_sync();
            }
            const char *c = dv[i].case_name;
            fi_tensor sa = v[B_SA], va = v[B_VA], pr = v[B_PR], rn = v[B_REN], oi = v[B_OI];
            fi_status st;
            if (!strcmp(c, "sample/index_past_rows"))
                st = fi_sampling_from_probs(ctx, &pr, &v[B_IDX], 1, 2, &sa, &va, cuda ? g_stream : NULL);
            else if (!strcmp(c, "top_p/row_negative"))
                st = fi_top_p_sampling_from_probs(ctx, &pr, NULL, &v[B_TP], 0, 1, 2, &sa, &va,
                                                  cuda ? g_stream : NULL);
            else if (!strcmp(c, "softmax/temperature_row_negative"))
                st = fi_softmax(ctx, &pr, &v[B_TP], 1.0f, &rn, cuda ? g_stream : NULL);
            else if (!strcmp(c, "spec/draft_id_past_vocab"))
                st = fi_chain_speculative_sampling(ctx, &v[B_DP], &v[B_IDS], &v[B_T3], 1, 2, &oi,
                                                   &v[B_ACC], NULL, cuda ? g_stream : NULL);
            else if (!strcmp(c, "top_k/length_past_cols"))
                st = fi_top_k(ctx, &v[B_X], 3, &v[B_TK], NULL, &v[B_VL], &v[B_KI], cuda ? g_stream : NULL);
            else if (!strcmp(c, "qk_norm_rope/position_past_cache")) {
                fi_tensor w4 = v[B_W]; /* the weights [head_dim 4] */
                w4.shape[0] = 4;
                st = fi_qk_rmsnorm_rope(ctx, &v[B_POS], &v[B_Q], &v[B_K], &w4, &w4, 1e-6f,
                                        &v[B_CACHE], 1, &v[B_QO], &v[B_KO], cuda ? g_stream : NULL);
            } else
                st = fi_rope_apply_cos_sin_cache(ctx, &v[B_POS], &v[B_Q], &v[B_K], &v[B_CACHE], 1,
                                                 &v[B_QO], &v[B_KO], cuda ? g_stream : NULL);
            if (!cuda) {
                ok = !tu_expect_status(st, FI_STATUS_INVALID_ARGUMENT, dv[i].needle, c);
                continue;
            }
            ok &= ops_check_ok(st, c) && device_sync();
            for (int j = 0; j < NBAD && ok; j++) ok &= gu_mirror_down(&e->dm[j], &e->b[j], "a buffer");
            if (!ok) break;
            const int32_t *smp = e->b[B_SA].base, *ids = e->b[B_IDS].base, *out = e->b[B_OI].base;
            const uint8_t *val = e->b[B_VA].base;
            const float *probs = e->b[B_REN].base, *qo = e->b[B_QO].base;
            const int32_t *kidx = e->b[B_KI].base;
            if (!strcmp(c, "sample/index_past_rows") || !strcmp(c, "top_p/row_negative")) {
                const int r = !strcmp(c, "sample/index_past_rows") ? 1 : 3;
                for (int j = 0; j < 4; j++)
                    if (val[j] != (j != r) || (j == r && smp[j] != 0)) {
                        tu_note("%s: output %d: valid %d, token %d", c, j, val[j], smp[j]);
                        ok = 0;
                    }
            } else if (!strcmp(c, "softmax/temperature_row_negative")) {
                for (int j = 0; j < 32; j++)
                    if ((j / 8 == 2) != isnan(probs[j])) {
                        tu_note("%s: probs[%d] = %g (row 2 must be NaN, the others not)", c, j, probs[j]);
                        ok = 0;
                        break;
                    }
            } else if (!strcmp(c, "spec/draft_id_past_vocab")) {
                /* request 1's first draft (id 8) is rejected: position 0 holds
                 * a drawn token of the vocabulary, then -1 */
                if (out[3] < 0 || out[3] >= 8 || out[4] != -1 || out[5] != -1) {
                    tu_note("%s: request 1 emitted %d %d %d", c, out[3], out[4], out[5]);
                    ok = 0;
                }
                (void)ids;
            } else if (!strcmp(c, "top_k/length_past_cols")) {
                /* row 2's length is clamped to 8 columns: its top 3 are among them */
                for (int j = 0; j < 3; j++)
                    if (kidx[2 * 3 + j] < 0 || kidx[2 * 3 + j] >= 8) {
                        tu_note("%s: row 2 slot %d: index %d", c, j, kidx[2 * 3 + j]);
                        ok = 0;
                    }
            } else { /* token 1 (position 4 of a 4-row cache) skipped: its rows stay poisoned */
                for (int j = 8; j < 16; j++)
                    if (!isnan(qo[j])) {
                        tu_note("%s: q_out of the skipped token written (%g)", c, qo[j]);
                        ok = 0;
                        break;
                    }
                for (int j = 0; j < 8; j++)
                    if (isnan(qo[j])) {
                        tu_note("%s: q_out of token 0 not written", c);
                        ok = 0;
                        break;
                    }
            }
        }
        tu_view_set(&b->t, dv[i].at, dv[i].good);
        for (int j = 0; j < NBAD; j++) /* outputs poisoned again */
            if (j == B_SA || j == B_VA || j == B_REN || j == B_OI || j == B_VL || j == B_KI ||
                j == B_QO || j == B_KO || j == B_OUT || j == B_Q8 || j == B_AO)
                tu_buf_poison(&e->b[j]);
        if (!g_device && ok) tu_note("no CUDA device: the CPU half ran alone");
        tu_record("bad_input", what, !g_device && ok ? TU_SKIP : ok ? TU_PASS : TU_FAIL);
        bad += !ok;
    }
    return bad;
}

static void suite_bad_input(void) {
    tu_rng rng;
    tu_rng_seed(&rng, tu_hash("cuda serving bad_input"));
    bad_env e;
    memset(&e, 0, sizeof e);
    if (bad_env_alloc(&e, &rng)) {
        tu_record("bad_input", "bad_input/alloc", TU_FAIL);
        bad_env_free(&e);
        return;
    }
    char name[160];
    for (int i = 0; i < NUM_BAD; i++) {
        snprintf(name, sizeof name, "bad_input/%s", bad_cases[i].name);
        if (!tu_begin_case(name)) continue;
        int ok = !tu_expect_status(bad_call(bad_cases[i].name, g_cpu, e.host),
                                   FI_STATUS_INVALID_ARGUMENT, bad_cases[i].message, "cpu");
        if (g_device)
            ok &= !tu_expect_status(bad_call(bad_cases[i].name, g_cuda, e.dev),
                                    FI_STATUS_INVALID_ARGUMENT, bad_cases[i].message, "cuda");
        if (!g_device && ok) tu_note("no CUDA device: the CPU half ran alone");
        tu_record("bad_input", name, !g_device && ok ? TU_SKIP : ok ? TU_PASS : TU_FAIL);
    }
    device_value_cases(&e, "bad_input/device_values");
    if (g_device) rq_bad_input(g_cuda, "cuda", true);
    bad_env_free(&e);
}

/* ================================================================= main */

int main(int argc, char **argv) {
    int rc = tu_parse_args(argc, argv,
                           "Serving ops (norms, activations, RoPE, softmax, sampling, filters,\n"
                           "speculative sampling, top-k) on the CUDA backend against the CPU backend.");
    if (rc) return rc;
    setvbuf(stdout, NULL, _IOLBF, 0); /* a crash keeps the lines before it */
    if (!tu_backend_selected("cuda")) return tu_summary("test_cuda_serving");
    fi_context_options opt;
    fi_context_options_init(&opt);
    if (fi_context_create(&opt, &g_cpu) != FI_OK) {
        printf("test_cuda_serving: no CPU context: %s\n", fi_last_error());
        return 1;
    }
    if (!tu_opt.list) {
        if (gu_init(0) != 0) {
            printf("test_cuda_serving: no CUDA device (libcuda.so.1 or a GPU missing): "
                   "device runs skipped, the CPU halves only\n");
        } else {
            opt.device = FI_DEVICE_CUDA;
            if (fi_context_create(&opt, &g_cuda) != FI_OK)
                printf("test_cuda_serving: no CUDA context (%s): device runs skipped\n",
                       fi_last_error());
            else if (GU(gu.StreamCreate(&g_stream, 1 /* non-blocking */)))
                printf("test_cuda_serving: cannot create a stream: device runs skipped\n");
            else
                g_device = 1;
        }
    }
    suite_norm();
    suite_act();
    suite_rope();
    suite_qk_norm_rope();
    suite_rope_quant();
    suite_softmax();
    suite_sample();
    suite_stats();
    suite_filter();
    suite_spec();
    suite_topk();
    suite_graph();
    suite_bad_input();
    if (g_stream) gu.StreamDestroy(g_stream);
    fi_context_destroy(g_cuda);
    fi_context_destroy(g_cpu);
    return tu_summary("test_cuda_serving");
}
