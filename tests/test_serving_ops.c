/*
 * test_serving_ops.c — the serving ops (norms, gated activations, softmax,
 * sampling, filters, chain speculative sampling, top-k) on every CPU SIMD
 * level against the fp64 references of oracle_serving.c.
 *
 * Every case gets fresh seeded inputs (a hash of its name; --seed
 * overrides it) in poisoned buffers, contiguous or with padded, permuted
 * strides, and checks besides the values that nothing outside an output
 * view was written. Categories of the summary:
 *   norm          rmsnorm, gemma, fused add (both), layernorm, FP8 out (both
 *                 formats, fused too); hidden 1, 7, 8, 100, 4097; 3-D input
 *   act           silu / gelu / gelu_tanh _and_mul, d 1, 7, 256, 4097
 *   softmax       scalar and per-row temperature, non-finite rows
 *   sample        every sampling entry point against the oracle's inverse
 *                 CDF over its filtered distribution (same Philox draws):
 *                 dtypes, strides, per-row parameters, indices, ties, zeros
 *   stats         frequencies of many draws against the filtered
 *                 distribution (chi-square at p = 1e-6), and the same test
 *                 against deliberately wrong filters (mutants) must fail
 *   filter        top_k / top_p renorm, top_k_mask_logits (in place too)
 *   spec          chain speculative sampling
 *   topk          fi_top_k (lengths, offsets, ties, NaN) and fi_top_k_ragged
 *   rope_cache    fi_rope_apply_cos_sin_cache: NeoX and GPT-J pairs,
 *                 rotary_dim < head_dim, in place
 *   qk_norm_rope  fi_qk_rmsnorm_rope and its Gemma form: odd head dims,
 *                 rotary_dim < head_dim, NeoX / GPT-J, weights f32 or the
 *                 input's dtype, in place, strided, q and k views of one
 *                 packed qkv (v must stay untouched)
 *   rope_quant    fi_rope_quantize_fp8 and its append form (rope_quant_cases.c):
 *                 R 32 / 64 / 128, N 0 / 64 / 96 / 512, MLA / GQA / MHA, NHD /
 *                 HND caches of page size 1 / 16 / 32, strided inputs and
 *                 outputs, outputs sliced from one tensor, e4m3 / e5m2,
 *                 scales != 1, NeoX and GPT-J pairs
 *   repro         bitwise the same outputs on 1, 2, 3 threads and every level, and
 *                 on 16 threads over 2 rows (more workers than rows)
 *   rng           Philox4x32-10 known answers
 *   large         hidden 16384, vocab 262144 (split across the pool)
 *   bad_input     each invalid argument: its status and message, nothing
 *                 written; on a CUDA context (a GPU or tests/gpu/stub) the
 *                 same statuses for what the core checks
 */
#include "flashinfer.h"
#include "ops_cases.h"
#include "oracle_serving.h"
#include "rope_quant_cases.h"
#include "util.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*case_fn)(fi_context *ctx, tu_rng *rng, const void *cfg);

static void run_case(const char *category, const char *name, case_fn fn, const void *cfg,
                     fi_context *ctx) {
    if (!tu_begin_case(name)) return;
    uint64_t seed = tu_case_seed(name);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    tu_crash_context(name, seed);
    int ok = fn(ctx, &rng, cfg);
    tu_crash_context(NULL, 0);
    if (!ok) tu_note("seed %llu; rerun: --filter '%s'", (unsigned long long)seed, name);
    tu_record(category, name, ok ? TU_PASS : TU_FAIL);
}

static const fi_dtype float_dtypes[3] = {FI_DTYPE_F32, FI_DTYPE_F16, FI_DTYPE_BF16};

static fi_tensor vec_i32(int32_t *data, int64_t n) {
    return fi_tensor_contiguous(data, FI_DTYPE_I32, 1, &n);
}

static fi_tensor vec_f32(float *data, int64_t n) {
    return fi_tensor_contiguous(data, FI_DTYPE_F32, 1, &n);
}

/* Fill a view with values read back as doubles (rounded to its dtype). */
static double *fill_read(tu_rng *rng, const tu_buf *b, double lo, double hi) {
    tu_fill_uniform(rng, &b->t, lo, hi, 0.0);
    return tu_view_read(&b->t);
}

/* ================================================================= norm */

typedef enum norm_op {
    NORM_RMS,
    NORM_GEMMA,
    NORM_FUSED,
    NORM_GEMMA_FUSED,
    NORM_LAYER,
    NORM_QUANT,
    NORM_FUSED_QUANT
} norm_op;

static const char *const norm_names[] = {
    "rmsnorm",   "gemma_rmsnorm", "fused_add_rmsnorm",      "gemma_fused_add_rmsnorm",
    "layernorm", "rmsnorm_quant", "fused_add_rmsnorm_quant"};

typedef struct norm_cfg {
    norm_op op;
    int64_t rows, heads, hidden; /* heads > 0: a 3-D [rows, heads, hidden] input */
    fi_dtype dtype, out_dtype;   /* out_dtype: FP8 for the quant forms */
    int strided, in_place;
} norm_cfg;

static double fmax_clamp(double v, double m) { return v > m ? m : v < -m ? -m : v; }

/* An FP8 output against the reference: the rounding of ref / scale clamped
 * to the format's range, or of a value 1e-5 away (f32 arithmetic near a
 * rounding boundary). */
static int check_fp8(const fi_tensor *t, const double *ref, double scale) {
    double *got = tu_view_read(t);
    int64_t n = tu_numel(t), bad = 0;
    const double fmax = t->dtype == FI_DTYPE_E4M3 ? 448.0 : 57344.0;
    for (int64_t i = 0; i < n; i++) {
        double v = fmax_clamp(ref[i] / scale, fmax);
        bool ok = got[i] == tu_round(t->dtype, v) ||
                  got[i] == tu_round(t->dtype, fmax_clamp(v * (1 + 1e-5), fmax)) ||
                  got[i] == tu_round(t->dtype, fmax_clamp(v * (1 - 1e-5), fmax));
        if (!ok && bad++ == 0)
            tu_note("fp8 out[%lld]=%g, expected %g (from %.9g)", (long long)i, got[i],
                    tu_round(t->dtype, v), v);
    }
    free(got);
    return bad == 0;
}

static fi_status norm_call(fi_context *ctx, const norm_cfg *c, fi_tensor *x, fi_tensor *res,
                           const fi_tensor *w, const fi_tensor *b, float eps, float scale,
                           fi_tensor *out) {
    switch (c->op) {
    case NORM_RMS:
        return fi_rmsnorm(ctx, x, w, eps, out, NULL);
    case NORM_GEMMA:
        return fi_gemma_rmsnorm(ctx, x, w, eps, out, NULL);
    case NORM_FUSED:
        return fi_fused_add_rmsnorm(ctx, x, res, w, eps, NULL);
    case NORM_GEMMA_FUSED:
        return fi_gemma_fused_add_rmsnorm(ctx, x, res, w, eps, NULL);
    case NORM_LAYER:
        return fi_layernorm(ctx, x, w, b, eps, out, NULL);
    case NORM_QUANT:
        return fi_rmsnorm_quant(ctx, x, w, scale, eps, out, NULL);
    case NORM_FUSED_QUANT:
        return fi_fused_add_rmsnorm_quant(ctx, x, res, w, scale, eps, out, NULL);
    }
    return FI_STATUS_INTERNAL;
}

static int case_norm(fi_context *ctx, tu_rng *rng, const void *p) {
    const norm_cfg *c = p;
    const bool fused =
        c->op == NORM_FUSED || c->op == NORM_GEMMA_FUSED || c->op == NORM_FUSED_QUANT;
    const bool quant = c->op == NORM_QUANT || c->op == NORM_FUSED_QUANT;
    const bool writes_input = c->op == NORM_FUSED || c->op == NORM_GEMMA_FUSED;
    const int32_t nd = c->heads ? 3 : 2;
    const int64_t shape[3] = {c->rows, c->heads ? c->heads : c->hidden, c->hidden};
    const int64_t *sh = c->heads ? shape : (const int64_t[]){c->rows, c->hidden};
    const int64_t rows = c->rows * (c->heads ? c->heads : 1), h = c->hidden, hs[1] = {h};
    const float eps = 1e-6f, scale = quant ? 0.37f : 1.0f;
    tu_buf x, res, w, b, out;
    memset(&res, 0, sizeof res), memset(&b, 0, sizeof b), memset(&out, 0, sizeof out);
    int ok = !ops_view_alloc(&x, c->dtype, nd, sh, c->strided, rng) &&
             !ops_view_alloc(&w, c->dtype, 1, hs, c->strided, rng);
    if (ok && fused) ok = !ops_view_alloc(&res, c->dtype, nd, sh, c->strided, rng);
    if (ok && c->op == NORM_LAYER) ok = !ops_view_alloc(&b, FI_DTYPE_F32, 1, hs, 0, rng);
    if (ok && !writes_input && !c->in_place)
        ok = !ops_view_alloc(&out, c->out_dtype, nd, sh, c->strided, rng);
    if (!ok) {
        tu_note("allocation failed");
        return 0;
    }
    double *xv = fill_read(rng, &x, -2.0, 2.0), *wv = fill_read(rng, &w, -1.5, 1.5);
    double *rv = fused ? fill_read(rng, &res, -2.0, 2.0) : NULL;
    double *bv = c->op == NORM_LAYER ? fill_read(rng, &b, -1.0, 1.0) : NULL;
    double *sum = malloc((size_t)(rows * h + 1) * sizeof *sum);
    double *ref = malloc((size_t)(rows * h + 1) * sizeof *ref);
    for (int64_t i = 0; i < rows * h; i++) sum[i] = xv[i] + (rv ? rv[i] : 0.0);
    if (c->op == NORM_LAYER)
        oracle_layernorm(rows, h, sum, wv, bv, eps, ref);
    else
        oracle_rmsnorm(rows, h, sum, wv, eps, c->op == NORM_GEMMA || c->op == NORM_GEMMA_FUSED,
                       ref);
    void *snap_w = ops_snapshot(&w);
    const tu_buf *dst = writes_input || c->in_place ? &x : &out;
    fi_status st = norm_call(ctx, c, &x.t, fused ? &res.t : NULL, &w.t, bv ? &b.t : NULL, eps,
                             scale, (fi_tensor *)&dst->t);
    ok = ops_check_ok(st, norm_names[c->op]);
    if (ok) {
        if (quant)
            ok &= check_fp8(&dst->t, ref, scale);
        else
            ok &= ops_check_view("out", &dst->t, ref, tu_dtype_tol(dst->t.dtype) * 2);
        ok &= ops_check_outside("out", dst);
        if (fused) {
            for (int64_t i = 0; i < rows * h; i++) sum[i] = tu_round(c->dtype, sum[i]);
            ok &= ops_check_view("residual", &res.t, sum, tu_dtype_tol(c->dtype));
            ok &= ops_check_outside("residual", &res);
        }
        ok &= ops_same_as_snapshot("weight", &w, snap_w);
    }
    free(xv), free(wv), free(rv), free(bv), free(sum), free(ref), free(snap_w);
    tu_buf_free(&x), tu_buf_free(&w), tu_buf_free(&res), tu_buf_free(&b), tu_buf_free(&out);
    return ok;
}

static void suite_norm(const tu_cpu_backend *be) {
    static const int64_t hiddens[] = {1, 7, 8, 100, 4097};
    char name[160];
    for (int op = NORM_RMS; op <= NORM_FUSED_QUANT; op++)
        for (int hi = 0; hi < 5; hi++)
            for (int di = 0; di < 3; di++)
                for (int strided = 0; strided < 2; strided++) {
                    if (tu_opt.quick && (hi == 1 || hi == 3) && strided) continue;
                    const bool quant = op == NORM_QUANT || op == NORM_FUSED_QUANT;
                    norm_cfg c = {(norm_op)op,
                                  hi == 4 ? 3 : 9,
                                  0,
                                  hiddens[hi],
                                  float_dtypes[di],
                                  quant ? (di == 2 ? FI_DTYPE_E5M2 : FI_DTYPE_E4M3)
                                        : float_dtypes[(di + strided) % 3],
                                  strided,
                                  0};
                    snprintf(name, sizeof name, "norm/%s/%s/%s_to_%s/h%lld/%s", be->name,
                             norm_names[op], tu_dtype_name(c.dtype), tu_dtype_name(c.out_dtype),
                             (long long)c.hidden, strided ? "strided" : "contiguous");
                    run_case("norm", name, case_norm, &c, be->ctx);
                }
    /* per-head norm of a [tokens, heads, head_dim] tensor, and out = input */
    for (int di = 0; di < 3; di++) {
        norm_cfg c = {NORM_RMS, 5, 3, 64, float_dtypes[di], float_dtypes[di], 1, 0};
        snprintf(name, sizeof name, "norm/%s/rmsnorm/%s/3d_heads", be->name,
                 tu_dtype_name(c.dtype));
        run_case("norm", name, case_norm, &c, be->ctx);
        norm_cfg d = {di == 2 ? NORM_LAYER : NORM_RMS,
                      6,
                      0,
                      130,
                      float_dtypes[di],
                      float_dtypes[di],
                      di == 1,
                      1};
        snprintf(name, sizeof name, "norm/%s/%s/%s/in_place", be->name, norm_names[d.op],
                 tu_dtype_name(d.dtype));
        run_case("norm", name, case_norm, &d, be->ctx);
    }
}

/* ================================================================== act */

typedef struct act_cfg {
    int kind;
    int64_t rows, d;
    fi_dtype dtype, out_dtype;
    int strided;
} act_cfg;

static int case_act(fi_context *ctx, tu_rng *rng, const void *p) {
    const act_cfg *c = p;
    const int64_t is[2] = {c->rows, 2 * c->d}, os[2] = {c->rows, c->d};
    tu_buf x, out;
    if (ops_view_alloc(&x, c->dtype, 2, is, c->strided, rng) ||
        ops_view_alloc(&out, c->out_dtype, 2, os, c->strided, rng)) {
        tu_note("allocation failed");
        return 0;
    }
    double *xv = fill_read(rng, &x, -6.0, 6.0);
    double *ref = malloc((size_t)(c->rows * c->d + 1) * sizeof *ref);
    oracle_gated_act(c->kind, c->rows, c->d, xv, ref);
    void *snap = ops_snapshot(&x);
    fi_status st = c->kind == 0   ? fi_silu_and_mul(ctx, &x.t, &out.t, NULL)
                   : c->kind == 1 ? fi_gelu_and_mul(ctx, &x.t, &out.t, NULL)
                                  : fi_gelu_tanh_and_mul(ctx, &x.t, &out.t, NULL);
    int ok = ops_check_ok(st, "gated act");
    if (ok) {
        ok &= ops_check_view("out", &out.t, ref, tu_dtype_tol(c->out_dtype) * 2);
        ok &= ops_check_outside("out", &out) & ops_same_as_snapshot("input", &x, snap);
    }
    free(xv), free(ref), free(snap);
    tu_buf_free(&x), tu_buf_free(&out);
    return ok;
}

static void suite_act(const tu_cpu_backend *be) {
    static const char *const kinds[] = {"silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"};
    static const int64_t ds[] = {1, 7, 256, 4097};
    char name[160];
    for (int k = 0; k < 3; k++)
        for (int di = 0; di < 3; di++)
            for (int dd = 0; dd < 4; dd++)
                for (int strided = 0; strided < 2; strided++) {
                    if (tu_opt.quick && dd == 1 && strided) continue;
                    act_cfg c = {k,
                                 dd == 3 ? 3 : 11,
                                 ds[dd],
                                 float_dtypes[di],
                                 float_dtypes[(di + strided) % 3],
                                 strided};
                    snprintf(name, sizeof name, "act/%s/%s/%s_to_%s/d%lld/%s", be->name, kinds[k],
                             tu_dtype_name(c.dtype), tu_dtype_name(c.out_dtype), (long long)c.d,
                             strided ? "strided" : "contiguous");
                    run_case("act", name, case_act, &c, be->ctx);
                }
}

/* =========================================================== rope cache */

typedef struct rope_cache_cfg {
    int64_t nnz, hq, hk, dim, rot;
    fi_dtype dtype;
    int neox, strided, in_place;
    int norm;         /* fi_qk_rmsnorm_rope: 1 RMSNorm, 2 Gemma (1 + w); 0 plain RoPE */
    fi_dtype w_dtype; /* q_weight, k_weight */
    int packed;       /* q, k views of one [nnz, hq + 2 hk, dim] qkv tensor */
} rope_cache_cfg;

/* x [nnz][h][d] rotated by rows pos[t] of cache [.][rot] (cos, then sin). */
static void rope_cache_ref(const rope_cache_cfg *c, int64_t h, const double *x, const int32_t *pos,
                           const float *cache, double *out) {
    const int64_t half = c->rot / 2, d = c->dim;
    for (int64_t t = 0; t < c->nnz; t++)
        for (int64_t hh = 0; hh < h; hh++) {
            const double *v = x + (t * h + hh) * d;
            double *y = out + (t * h + hh) * d;
            const float *cs = cache + pos[t] * c->rot;
            for (int64_t i = 0; i < d; i++) y[i] = v[i];
            for (int64_t i = 0; i < half; i++) {
                int64_t a = c->neox ? i : 2 * i, b = c->neox ? i + half : 2 * i + 1;
                y[a] = v[a] * cs[i] - v[b] * cs[half + i];
                y[b] = v[b] * cs[i] + v[a] * cs[half + i];
            }
        }
}

/* vLLM's cache (theta 1e4) of max_pos rows. */
static float *rope_cache_table(int64_t max_pos, int64_t rot) {
    float *cache = malloc((size_t)(max_pos * rot) * sizeof *cache);
    if (!cache) return NULL;
    for (int64_t pp = 0; pp < max_pos; pp++)
        for (int64_t i = 0; i < rot / 2; i++) {
            double ang = (double)pp * pow(1e4, -2.0 * (double)i / (double)rot);
            cache[pp * rot + i] = (float)cos(ang);
            cache[pp * rot + rot / 2 + i] = (float)sin(ang);
        }
    return cache;
}

/* The view of heads [h0, h0 + n) of a packed [nnz, heads, dim] tensor. */
static fi_tensor head_slice(const fi_tensor *qkv, int64_t h0, int64_t n) {
    fi_tensor t = *qkv;
    t.data = (char *)qkv->data + h0 * qkv->stride[1] * (int64_t)fi_dtype_size(qkv->dtype);
    t.shape[1] = n;
    return t;
}

static int case_rope_cache(fi_context *ctx, tu_rng *rng, const void *p) {
    const rope_cache_cfg *c = p;
    const int64_t qs[3] = {c->nnz, c->hq, c->dim}, ks[3] = {c->nnz, c->hk, c->dim};
    const int64_t ps[3] = {c->nnz, c->hq + 2 * c->hk, c->dim};
    const int64_t max_pos = 4096;
    tu_buf q, k, qo, ko, qkv, qw, kw;
    memset(&q, 0, sizeof q), memset(&k, 0, sizeof k), memset(&qkv, 0, sizeof qkv);
    memset(&qo, 0, sizeof qo), memset(&ko, 0, sizeof ko);
    memset(&qw, 0, sizeof qw), memset(&kw, 0, sizeof kw);
    int ok = c->packed ? !ops_view_alloc(&qkv, c->dtype, 3, ps, c->strided, rng)
                       : !ops_view_alloc(&q, c->dtype, 3, qs, c->strided, rng) &&
                             !ops_view_alloc(&k, c->dtype, 3, ks, c->strided, rng);
    if (ok && !c->in_place)
        ok = !ops_view_alloc(&qo, c->dtype, 3, qs, c->strided, rng) &&
             !ops_view_alloc(&ko, c->dtype, 3, ks, c->strided, rng);
    if (ok && c->norm)
        ok = !ops_view_alloc(&qw, c->w_dtype, 1, &c->dim, c->strided, rng) &&
             !ops_view_alloc(&kw, c->w_dtype, 1, &c->dim, c->strided, rng);
    float *cache = rope_cache_table(max_pos, c->rot);
    int32_t *pos = malloc((size_t)(c->nnz + 1) * sizeof *pos);
    if (!ok || !cache || !pos) {
        tu_note("allocation failed");
        return 0;
    }
    for (int64_t t = 0; t < c->nnz; t++) pos[t] = tu_rng_int(rng, 0, (int32_t)max_pos - 1);
    fi_tensor tq = q.t, tk = k.t, tv;
    double *vv = NULL;
    if (c->packed) {
        vv = fill_read(rng, &qkv, -2, 2);
        tq = head_slice(&qkv.t, 0, c->hq), tk = head_slice(&qkv.t, c->hq, c->hk);
        tv = head_slice(&qkv.t, c->hq + c->hk, c->hk);
        free(vv);
        vv = tu_view_read(&tv);
    } else {
        tu_fill_uniform(rng, &q.t, -2, 2, 0.0), tu_fill_uniform(rng, &k.t, -2, 2, 0.0);
    }
    double *qv = tu_view_read(&tq), *kv = tu_view_read(&tk), *qwv = NULL, *kwv = NULL;
    double *qr = malloc((size_t)(c->nnz * c->hq * c->dim + 1) * sizeof *qr);
    double *kr = malloc((size_t)(c->nnz * c->hk * c->dim + 1) * sizeof *kr);
    const double eps = c->dim % 2 ? 1e-2 : 1e-6;
    if (c->norm) { /* Gemma weights sit near 0 (1 + w), the others near 1 */
        qwv = fill_read(rng, &qw, c->norm == 2 ? -0.5 : 0.5, c->norm == 2 ? 0.5 : 1.5);
        kwv = fill_read(rng, &kw, c->norm == 2 ? -0.5 : 0.5, c->norm == 2 ? 0.5 : 1.5);
        oracle_rmsnorm(c->nnz * c->hq, c->dim, qv, qwv, eps, c->norm == 2, qv);
        oracle_rmsnorm(c->nnz * c->hk, c->dim, kv, kwv, eps, c->norm == 2, kv);
    }
    rope_cache_ref(c, c->hq, qv, pos, cache, qr);
    rope_cache_ref(c, c->hk, kv, pos, cache, kr);
    const int64_t cshape[2] = {max_pos, c->rot};
    fi_tensor tc = fi_tensor_contiguous(cache, FI_DTYPE_F32, 2, cshape);
    fi_tensor tp = vec_i32(pos, c->nnz);
    fi_tensor dq = c->in_place ? tq : qo.t, dk = c->in_place ? tk : ko.t;
    fi_status st;
    const char *fn = c->norm == 2 ? "fi_gemma_qk_rmsnorm_rope"
                     : c->norm    ? "fi_qk_rmsnorm_rope"
                                  : "fi_rope_apply_cos_sin_cache";
    if (c->norm == 2)
        st = fi_gemma_qk_rmsnorm_rope(ctx, &tp, &tq, &tk, &qw.t, &kw.t, (float)eps, &tc, c->neox,
                                      &dq, &dk, NULL);
    else if (c->norm)
        st = fi_qk_rmsnorm_rope(ctx, &tp, &tq, &tk, &qw.t, &kw.t, (float)eps, &tc, c->neox, &dq,
                                &dk, NULL);
    else
        st = fi_rope_apply_cos_sin_cache(ctx, &tp, &tq, &tk, &tc, c->neox, &dq, &dk, NULL);
    ok = ops_check_ok(st, fn);
    if (ok) {
        /* one rounding of values up to ~3 (normalised, times w) */
        const double tol = tu_dtype_tol(c->dtype) * (c->norm ? 3 : 2);
        ok &= ops_check_view("q_out", &dq, qr, tol);
        ok &= ops_check_view("k_out", &dk, kr, tol);
        if (c->packed) {
            ok &= ops_check_view("v (untouched)", &tv, vv, 0.0);
            ok &= ops_check_outside("qkv", &qkv);
        } else if (c->in_place) {
            ok &= ops_check_outside("q_out", &q) & ops_check_outside("k_out", &k);
        }
        if (!c->in_place) ok &= ops_check_outside("q_out", &qo) & ops_check_outside("k_out", &ko);
    }
    free(cache), free(pos), free(qv), free(kv), free(qr), free(kr), free(vv), free(qwv), free(kwv);
    tu_buf_free(&q), tu_buf_free(&k), tu_buf_free(&qo), tu_buf_free(&ko), tu_buf_free(&qkv);
    tu_buf_free(&qw), tu_buf_free(&kw);
    return ok;
}

static void suite_rope_cache(const tu_cpu_backend *be) {
    static const int64_t shapes[][5] = {
        {1, 1, 1, 2, 2}, {7, 4, 2, 64, 64}, {5, 3, 1, 128, 64}, {9, 8, 8, 130, 96}};
    char name[160];
    for (int si = 0; si < 4; si++)
        for (int di = 0; di < 3; di++)
            for (int mode = 0; mode < 4; mode++) {
                rope_cache_cfg c = {shapes[si][0], shapes[si][1], shapes[si][2],
                                    shapes[si][3], shapes[si][4], float_dtypes[di],
                                    mode & 1,      mode >= 2,     mode == 3,
                                    0,             FI_DTYPE_F32,  0};
                snprintf(name, sizeof name, "rope_cache/%s/%s/h%lld_%lld_d%lld_r%lld/%s%s",
                         be->name, tu_dtype_name(c.dtype), (long long)c.hq, (long long)c.hk,
                         (long long)c.dim, (long long)c.rot, c.neox ? "neox" : "gptj",
                         c.in_place  ? "_in_place"
                         : c.strided ? "_strided"
                                     : "");
                run_case("rope_cache", name, case_rope_cache, &c, be->ctx);
            }
}

/* fi_qk_rmsnorm_rope / fi_gemma_qk_rmsnorm_rope: shapes (odd D, R < D),
 * dtypes with weights of the same dtype or f32, NeoX / GPT-J, contiguous,
 * strided, in place, views of one packed qkv (in place and out). */
static void suite_qk_norm_rope(const tu_cpu_backend *be) {
    static const int64_t shapes[][5] = {{1, 1, 1, 2, 2},      {7, 4, 2, 64, 64},
                                        {5, 3, 1, 128, 64},   {4, 2, 1, 67, 32},
                                        {9, 8, 8, 130, 96},   {3, 16, 2, 256, 256}};
    static const char *const modes[] = {"", "_strided", "_in_place", "_packed_in_place",
                                        "_packed_strided"};
    char name[192];
    for (int si = 0; si < 6; si++)
        for (int di = 0; di < 3; di++)
            for (int mode = 0; mode < 5; mode++)
                for (int form = 1; form <= 2; form++) {
                    const int neox = (si + mode + form) % 2;
                    const fi_dtype wt = (si + mode) % 3 ? float_dtypes[di] : FI_DTYPE_F32;
                    rope_cache_cfg c = {shapes[si][0], shapes[si][1], shapes[si][2],
                                        shapes[si][3], shapes[si][4], float_dtypes[di],
                                        neox, mode == 1 || mode == 4, mode == 2 || mode == 3,
                                        form, wt, mode >= 3};
                    snprintf(name, sizeof name,
                             "qk_norm_rope/%s/%s_w%s/h%lld_%lld_d%lld_r%lld/%s_%s%s", be->name,
                             tu_dtype_name(c.dtype), tu_dtype_name(wt), (long long)c.hq,
                             (long long)c.hk, (long long)c.dim, (long long)c.rot,
                             form == 2 ? "gemma" : "rms", neox ? "neox" : "gptj", modes[mode]);
                    run_case("qk_norm_rope", name, case_rope_cache, &c, be->ctx);
                }
}

/* =========================================================== rope quant */

static int case_rope_quant(fi_context *ctx, tu_rng *rng, const void *p) {
    rq_case k;
    tu_buf b[RQ_NBUF];
    void *before[RQ_NBUF] = {0};
    fi_tensor t[RQ_NBUF];
    int ok = !rq_case_alloc(&k, p, b, rng);
    for (int i = 0; i < RQ_NBUF && ok; i++) before[i] = ops_snapshot(&b[i]), t[i] = b[i].t;
    if (!ok) tu_note("allocation failed");
    ok = ok && ops_check_ok(rq_case_call(ctx, &k, t, NULL), "fi_rope_quantize_fp8");
    ok = ok && rq_case_check(&k, b, before, NULL);
    for (int i = 0; i < RQ_NBUF; i++) free(before[i]), tu_buf_free(&b[i]);
    return ok;
}

/* Shapes (nnz, H_q, H_k (0: MLA), R, N) x forms (plain, append NHD, HND;
 * MLA: plain, append) x four variants of dtypes, pairs, layouts, scales. */
static const int64_t rq_shapes[][5] = {
    {1, 1, 1, 32, 0},   {7, 4, 2, 64, 0},    {5, 3, 3, 128, 64}, {9, 8, 2, 64, 96},
    {13, 16, 0, 64, 512}, {6, 5, 0, 32, 96}, {3, 2, 1, 128, 512}, {300, 32, 8, 128, 0}};

static void suite_rope_quant(const tu_cpu_backend *be) {
    static const int page_sizes[3] = {1, 16, 32};
    static const float scales[4][2] = {{1, 1}, {0.5f, 4}, {3, 0.25f}, {1, 1}};
    char name[192], cfg[160];
    for (int si = 0; si < (int)(sizeof rq_shapes / sizeof rq_shapes[0]); si++)
        for (int form = 0; form < 3; form++)
            for (int v = 0; v < 4; v++) {
                const int64_t *s = rq_shapes[si];
                const bool big = s[0] > 100;
                if ((s[2] == 0 && form == 2) || (big && v) || (tu_opt.quick && (si + form + v) % 3))
                    continue;
                rq_cfg c = {s[0], s[1], s[2], s[3], s[4], float_dtypes[(si + v + be->index) % 3],
                            v & 1 ? FI_DTYPE_E5M2 : FI_DTYPE_E4M3, !(v & 1), form > 0, form == 2,
                            page_sizes[(si + v) % 3], v & 1, v >= 2, scales[v][0], scales[v][1]};
                rq_case_name(&c, cfg, sizeof cfg);
                snprintf(name, sizeof name, "rope_quant/%s/%s", be->name, cfg);
                run_case("rope_quant", name, case_rope_quant, &c, be->ctx);
            }
}

/* ============================================================== softmax */

typedef struct softmax_cfg {
    int64_t rows, v;
    fi_dtype dtype, out_dtype;
    int strided, per_row, nonfinite;
    int cold; /* temperature 0.05: (x - m) / T past exp's range unless m is the row's maximum */
} softmax_cfg;

static int case_softmax(fi_context *ctx, tu_rng *rng, const void *p) {
    const softmax_cfg *c = p;
    const int64_t shape[2] = {c->rows, c->v};
    tu_buf x, out;
    if (ops_view_alloc(&x, c->dtype, 2, shape, c->strided, rng) ||
        ops_view_alloc(&out, c->out_dtype, 2, shape, c->strided, rng)) {
        tu_note("allocation failed");
        return 0;
    }
    double *xv = fill_read(rng, &x, -8.0, 8.0);
    float *temp = malloc((size_t)c->rows * sizeof *temp);
    double *td = malloc((size_t)c->rows * sizeof *td);
    const float scalar = c->cold ? 0.05f : 0.7f;
    for (int64_t r = 0; r < c->rows; r++)
        td[r] = temp[r] = c->per_row && !c->cold ? (float)tu_rng_range(rng, 0.2, 3.0) : scalar;
    double *ref = malloc((size_t)(c->rows * c->v + 1) * sizeof *ref);
    if (c->nonfinite) { /* row 0: a NaN; row 1: +inf; row 2: all -inf; row 3: some -inf */
        for (int64_t i = 0; i < c->v; i++) {
            if (i == c->v / 2) tu_view_set(&x.t, i, NAN), xv[i] = NAN;
            if (i == 0) tu_view_set(&x.t, c->v + i, INFINITY), xv[c->v + i] = INFINITY;
            tu_view_set(&x.t, 2 * c->v + i, -INFINITY), xv[2 * c->v + i] = -INFINITY;
            if (i % 2) tu_view_set(&x.t, 3 * c->v + i, -INFINITY), xv[3 * c->v + i] = -INFINITY;
        }
    }
    oracle_softmax(c->rows, c->v, xv, td, ref);
    if (c->nonfinite)
        for (int64_t i = 0; i < 3 * c->v; i++) ref[i] = NAN;
    fi_tensor tt = vec_f32(temp, c->rows);
    fi_status st = fi_softmax(ctx, &x.t, c->per_row ? &tt : NULL, scalar, &out.t, NULL);
    int ok = ops_check_ok(st, "fi_softmax");
    if (ok) {
        ok &= (c->nonfinite ? ops_check_view_classes : ops_check_view)("probs", &out.t, ref,
                                                                       tu_dtype_tol(c->out_dtype));
        ok &= ops_check_outside("probs", &out);
    }
    free(xv), free(temp), free(td), free(ref);
    tu_buf_free(&x), tu_buf_free(&out);
    return ok;
}

static void suite_softmax(const tu_cpu_backend *be) {
    static const int64_t vs[] = {1, 7, 1000, 5000};
    char name[160];
    for (int vi = 0; vi < 4; vi++)
        for (int di = 0; di < 3; di++)
            for (int mode = 0; mode < 3; mode++) {
                if (mode == 2 && vs[vi] < 7) continue;
                softmax_cfg c = {
                    vi == 3 ? 4 : 6,  vs[vi],
                    float_dtypes[di], di == 0 ? FI_DTYPE_F32 : float_dtypes[(di + mode) % 3],
                    mode == 1,        mode == 1,
                    mode == 2,        0};
                snprintf(name, sizeof name, "softmax/%s/%s_to_%s/v%lld/%s", be->name,
                         tu_dtype_name(c.dtype), tu_dtype_name(c.out_dtype), (long long)c.v,
                         mode == 0   ? "scalar"
                         : mode == 1 ? "per_row_strided"
                                     : "nonfinite");
                run_case("softmax", name, case_softmax, &c, be->ctx);
            }
    /* 1-5 rows of one block: the per-block maxima, kinds and sums share
     * one small scratch (a layout that overlapped them passed at 0.7) */
    for (int di = 0; di < 3; di++)
        for (int rows = 1; rows <= 5; rows++)
            for (int per_row = 0; per_row < 2; per_row++) {
                softmax_cfg c = {rows, 314, float_dtypes[di], float_dtypes[di], 0, per_row, 0, 1};
                snprintf(name, sizeof name, "softmax/%s/%s/rows%d/cold%s", be->name,
                         tu_dtype_name(c.dtype), rows, per_row ? "_per_row" : "");
                run_case("softmax", name, case_softmax, &c, be->ctx);
            }
}

/* ============================================================= sampling */

typedef enum sample_op {
    S_PROBS,
    S_LOGITS,
    S_TOP_K,
    S_TOP_P,
    S_MIN_P,
    S_TOP_K_TOP_P,
    S_TOP_K_TOP_P_LOGITS
} sample_op;

static const char *const sample_names[] = {
    "sampling_from_probs", "sampling_from_logits",   "top_k_sampling",         "top_p_sampling",
    "min_p_sampling",      "top_k_top_p_from_probs", "top_k_top_p_from_logits"};

/* One sampling call's parameters (per row when per_row). */
typedef struct sample_params {
    int32_t *top_k;
    float *top_p, *min_p;
    fi_tensor tk, tp, mp;
    int32_t k_val;
    float p_val, m_val;
    fi_filter_order order;
    bool per_row;
} sample_params;

static fi_status sample_call(fi_context *ctx, sample_op op, const fi_tensor *in,
                             const fi_tensor *idx, const sample_params *sp, uint64_t seed,
                             uint64_t offset, fi_tensor *out, fi_tensor *valid) {
    const fi_tensor *tk = sp->per_row ? &sp->tk : NULL, *tp = sp->per_row ? &sp->tp : NULL;
    const fi_tensor *mp = sp->per_row ? &sp->mp : NULL;
    switch (op) {
    case S_PROBS:
        return fi_sampling_from_probs(ctx, in, idx, seed, offset, out, valid, NULL);
    case S_LOGITS:
        return fi_sampling_from_logits(ctx, in, idx, seed, offset, out, valid, NULL);
    case S_TOP_K:
        return fi_top_k_sampling_from_probs(ctx, in, idx, tk, sp->k_val, seed, offset, out, valid,
                                            NULL);
    case S_TOP_P:
        return fi_top_p_sampling_from_probs(ctx, in, idx, tp, sp->p_val, seed, offset, out, valid,
                                            NULL);
    case S_MIN_P:
        return fi_min_p_sampling_from_probs(ctx, in, idx, mp, sp->m_val, seed, offset, out, valid,
                                            NULL);
    case S_TOP_K_TOP_P:
        return fi_top_k_top_p_sampling_from_probs(ctx, in, idx, tk, sp->k_val, tp, sp->p_val,
                                                  sp->order, seed, offset, out, valid, NULL);
    case S_TOP_K_TOP_P_LOGITS:
        return fi_top_k_top_p_sampling_from_logits(ctx, in, idx, tk, sp->k_val, tp, sp->p_val,
                                                   sp->order, seed, offset, out, valid, NULL);
    }
    return FI_STATUS_INTERNAL;
}

/* The oracle's filter for output b of op (p: the row's weights, softmax
 * of the logits for the logits forms; rank: the logits or NULL). */
static void oracle_keep(sample_op op, const sample_params *sp, int64_t b, int64_t v,
                        const double *p, const double *rank, bool *keep) {
    int32_t k = 0;
    double tp = 1.0, mp = -1.0;
    if (op == S_TOP_K || op == S_TOP_K_TOP_P || op == S_TOP_K_TOP_P_LOGITS)
        k = sp->per_row ? sp->top_k[b] : sp->k_val;
    if (op == S_TOP_P || op == S_TOP_K_TOP_P || op == S_TOP_K_TOP_P_LOGITS)
        tp = sp->per_row ? sp->top_p[b] : sp->p_val;
    if (op == S_MIN_P) mp = sp->per_row ? sp->min_p[b] : sp->m_val;
    bool joint = sp->order == FI_FILTER_JOINT;
    if (op == S_TOP_K_TOP_P_LOGITS && !joint && k > 0 && k < v) {
        /* top-k on the logits, then top-p on the softmax of what is left */
        bool *kk = malloc((size_t)v);
        double *q = malloc((size_t)v * sizeof *q), mass = 0.0;
        oracle_filter(v, p, rank, k, 1.0, -1.0, false, kk);
        for (int64_t i = 0; i < v; i++) mass += kk[i] ? p[i] : 0.0;
        for (int64_t i = 0; i < v; i++) q[i] = kk[i] ? p[i] / mass : 0.0;
        oracle_filter(v, q, NULL, 0, tp, -1.0, false, keep);
        for (int64_t i = 0; i < v; i++) keep[i] = keep[i] && kk[i];
        free(kk), free(q);
        return;
    }
    oracle_filter(v, p, rank, k, tp, mp, joint, keep);
}

typedef struct sample_cfg {
    sample_op op;
    int64_t rows, v;
    fi_dtype dtype;
    int strided, per_row, use_indices, zeros;
    fi_filter_order order;
} sample_cfg;

/* Row weights as the sampler sees them: probs, or softmax of the logits. */
static void row_weights(bool logits, const double *x, int64_t v, double *p) {
    if (!logits) {
        memcpy(p, x, (size_t)v * sizeof *p);
        return;
    }
    double m = -INFINITY, s = 0.0;
    for (int64_t i = 0; i < v; i++) m = fmax(m, x[i]);
    for (int64_t i = 0; i < v; i++) s += exp(x[i] - m);
    for (int64_t i = 0; i < v; i++) p[i] = exp(x[i] - m) / s;
}

static void params_alloc(sample_params *sp, int64_t batch, tu_rng *rng, int64_t v, int per_row,
                         fi_filter_order order) {
    memset(sp, 0, sizeof *sp);
    sp->top_k = malloc((size_t)batch * sizeof *sp->top_k);
    sp->top_p = malloc((size_t)batch * sizeof *sp->top_p);
    sp->min_p = malloc((size_t)batch * sizeof *sp->min_p);
    static const float ps[] = {0.0f, 0.3f, 0.6f, 0.9f, 1.0f};
    for (int64_t b = 0; b < batch; b++) {
        int32_t kc[] = {1, 2, 5, (int32_t)v, 0, (int32_t)v + 3};
        sp->top_k[b] = kc[tu_rng_int(rng, 0, 5)];
        sp->top_p[b] = b % 3 ? (float)tu_rng_range(rng, 0.05, 0.95) : ps[tu_rng_int(rng, 0, 4)];
        sp->min_p[b] = (float)tu_rng_range(rng, 0.0, 0.6);
    }
    sp->tk = vec_i32(sp->top_k, batch), sp->tp = vec_f32(sp->top_p, batch);
    sp->mp = vec_f32(sp->min_p, batch);
    sp->k_val = v > 4 ? 4 : 1, sp->p_val = 0.7f, sp->m_val = 0.2f;
    sp->order = order;
    sp->per_row = per_row;
}

static void params_free(sample_params *sp) { free(sp->top_k), free(sp->top_p), free(sp->min_p); }

static int case_sample(fi_context *ctx, tu_rng *rng, const void *p) {
    const sample_cfg *c = p;
    const bool logits = c->op == S_LOGITS || c->op == S_TOP_K_TOP_P_LOGITS;
    const int64_t shape[2] = {c->rows, c->v};
    const int64_t batch = c->use_indices ? 2 * c->rows + 3 : c->rows;
    tu_buf x;
    if (ops_view_alloc(&x, c->dtype, 2, shape, c->strided, rng)) {
        tu_note("allocation failed");
        return 0;
    }
    double *xv = logits ? fill_read(rng, &x, -4.0, 4.0) : fill_read(rng, &x, 0.0, 1.0);
    if (!logits) /* ties and zeros: a few values repeated, some zero */
        for (int64_t r = 0; r < c->rows; r++)
            for (int64_t i = 0; i < c->v; i++) {
                int64_t e = r * c->v + i;
                if (c->zeros && i % 5 == 1)
                    tu_view_set(&x.t, e, 0.0), xv[e] = 0.0;
                else if (i % 7 == 3 && i > 3) {
                    tu_view_set(&x.t, e, xv[e - 3]);
                    xv[e] = xv[e - 3];
                }
            }
    int32_t *idx = malloc((size_t)batch * sizeof *idx), *got = malloc((size_t)batch * sizeof *got);
    uint8_t *valid = malloc((size_t)batch);
    for (int64_t b = 0; b < batch; b++) idx[b] = tu_rng_int(rng, 0, (int32_t)c->rows - 1);
    sample_params sp;
    params_alloc(&sp, batch, rng, c->v, c->per_row, c->order);
    fi_tensor ti = vec_i32(idx, batch), to = vec_i32(got, batch);
    int64_t nb = batch;
    fi_tensor tv = fi_tensor_contiguous(valid, FI_DTYPE_U8, 1, &nb);
    const uint64_t seed = tu_rng_next(rng), offset = (uint64_t)tu_rng_int(rng, 0, 1000);
    fi_status st =
        sample_call(ctx, c->op, &x.t, c->use_indices ? &ti : NULL, &sp, seed, offset, &to, &tv);
    int ok = ops_check_ok(st, sample_names[c->op]);
    double *w = malloc((size_t)c->v * sizeof *w);
    bool *keep = malloc((size_t)c->v);
    int64_t skipped = 0;
    for (int64_t b = 0; b < batch && ok; b++) {
        int64_t row = c->use_indices ? idx[b] : b;
        row_weights(logits, xv + row * c->v, c->v, w);
        oracle_keep(c->op, &sp, b, c->v, w, logits ? xv + row * c->v : NULL, keep);
        double margin;
        int64_t want =
            oracle_draw(c->v, w, keep, oracle_uniform(seed, offset, (uint32_t)b, 0), &margin);
        if ((want >= 0) != (valid[b] == 1)) {
            tu_note("output %lld: valid=%d, the oracle %s a token", (long long)b, valid[b],
                    want >= 0 ? "draws" : "has no");
            ok = 0;
        } else if (want >= 0 && got[b] != want) {
            if (margin < 1e-5 && got[b] >= 0 && got[b] < c->v && keep[got[b]]) {
                skipped++; /* within rounding of a CDF boundary */
            } else {
                tu_note("output %lld (row %lld): token %d, the oracle draws %lld (margin %.3g, "
                        "drawn one %s)",
                        (long long)b, (long long)row, got[b], (long long)want, margin,
                        got[b] >= 0 && got[b] < c->v && keep[got[b]] ? "kept" : "filtered out");
                ok = 0;
            }
        } else if (want < 0 && got[b] != 0) {
            tu_note("output %lld: invalid row gave token %d, expected 0", (long long)b, got[b]);
            ok = 0;
        }
    }
    if (skipped > batch / 8 + 1) {
        tu_note("%lld of %lld outputs fell within rounding of a boundary", (long long)skipped,
                (long long)batch);
        ok = 0;
    }
    free(xv), free(idx), free(got), free(valid), free(w), free(keep);
    params_free(&sp);
    tu_buf_free(&x);
    return ok;
}

static void suite_sample(const tu_cpu_backend *be) {
    static const int64_t vs[] = {1, 5, 37, 1000, 4100, 20000}; /* 20000: the sampled pivot */
    char name[160];
    for (int op = S_PROBS; op <= S_TOP_K_TOP_P_LOGITS; op++)
        for (int vi = 0; vi < 6; vi++)
            for (int di = 0; di < 3; di++)
                for (int mode = 0; mode < 3; mode++) {
                    if (tu_opt.quick && mode == 1 && di) continue;
                    const bool pair = op == S_TOP_K_TOP_P || op == S_TOP_K_TOP_P_LOGITS;
                    for (int order = 0; order < (pair ? 2 : 1); order++) {
                        if (vi == 5 && (tu_opt.quick || mode == 1)) continue;
                        sample_cfg c = {(sample_op)op,    vi >= 4 ? 7 : 13, vs[vi],
                                        float_dtypes[di], mode == 1,        mode >= 1,
                                        mode == 2,        di != 2,          (fi_filter_order)order};
                        snprintf(name, sizeof name, "sample/%s/%s%s/%s/v%lld/%s", be->name,
                                 sample_names[op], pair ? (order ? "/joint" : "/top_k_first") : "",
                                 tu_dtype_name(c.dtype), (long long)c.v,
                                 mode == 0   ? "scalar"
                                 : mode == 1 ? "per_row_strided"
                                             : "per_row_indices");
                        run_case("sample", name, case_sample, &c, be->ctx);
                    }
                }
}

/* ================================================================ stats */

/* A distribution, one filter and the tokens whose keep flag a wrong
 * filter (a mutant) would flip: the draws must fit the filter and fail
 * every mutant. */
typedef struct stats_cfg {
    sample_op op;
    int32_t k;
    float p, m;
    fi_filter_order order;
    const int32_t *flips; /* -1 terminated; one mutant per token */
    const char *const *mutants;
} stats_cfg;

/* Weights 1..9 with ties (two 7s, two 5s, ...): 69 in all. */
static const double stats_w[16] = {9, 1, 7, 3, 7, 2, 5, 8, 4, 6, 2, 3, 1, 5, 4, 2};

static int case_stats(fi_context *ctx, tu_rng *rng, const void *p) {
    const stats_cfg *c = p;
    const int64_t v = 16, n = tu_opt.quick ? 20000 : 60000;
    const bool logits = c->op == S_LOGITS || c->op == S_TOP_K_TOP_P_LOGITS;
    float row[16];
    double w[16];
    for (int i = 0; i < 16; i++) row[i] = logits ? (float)log(stats_w[i]) : (float)stats_w[i];
    for (int i = 0; i < 16; i++) w[i] = row[i];
    int64_t shape[2] = {1, v};
    fi_tensor in = fi_tensor_contiguous(row, FI_DTYPE_F32, 2, shape);
    int32_t *idx = calloc((size_t)n, sizeof *idx), *got = malloc((size_t)n * sizeof *got);
    fi_tensor ti = vec_i32(idx, n), to = vec_i32(got, n);
    sample_params sp;
    params_alloc(&sp, 1, rng, v, 0, c->order);
    sp.k_val = c->k, sp.p_val = c->p, sp.m_val = c->m;
    int ok = ops_check_ok(sample_call(ctx, c->op, &in, &ti, &sp, tu_rng_next(rng), 7, &to, NULL),
                          sample_names[c->op]);
    int64_t counts[16] = {0};
    for (int64_t b = 0; b < n && ok; b++) {
        if (got[b] < 0 || got[b] >= v) {
            tu_note("draw %lld: token %d", (long long)b, got[b]);
            ok = 0;
        } else {
            counts[got[b]]++;
        }
    }
    double q[16];
    bool keep[16];
    row_weights(logits, w, v, q);
    oracle_keep(c->op, &sp, 0, v, q, logits ? w : NULL, keep);
    double chi2;
    if (ok && !oracle_fits(counts, n, v, q, keep, &chi2)) {
        tu_note("the draws do not fit the filtered distribution: chi2 %.1f > %.1f", chi2,
                oracle_chi2_bound(15));
        ok = 0;
    }
    for (int f = 0; ok && c->flips && c->flips[f] >= 0; f++) {
        bool mutant[16];
        memcpy(mutant, keep, sizeof mutant);
        mutant[c->flips[f]] = !mutant[c->flips[f]];
        if (oracle_fits(counts, n, v, q, mutant, &chi2)) {
            tu_note("mutant \"%s\" (token %d %s) fits the draws too (chi2 %.1f): the test "
                    "cannot tell the filter from it",
                    c->mutants[f], c->flips[f], mutant[c->flips[f]] ? "kept" : "dropped", chi2);
            ok = 0;
        } else if (tu_opt.verbose) {
            printf("  mutant \"%s\" rejected (chi2 %.3g)\n", c->mutants[f], chi2);
        }
    }
    free(idx), free(got);
    params_free(&sp);
    return ok;
}

static void suite_stats(const tu_cpu_backend *be) {
    /* top-k 3 keeps 9, 8 and both 7s (tokens 0, 7, 2, 4) */
    static const int32_t k_flips[] = {4, 9, -1};
    static const char *const k_mut[] = {"exactly k, ties by index", "k + 1", NULL};
    /* top-p 0.5 of 69: 9, 8, 7, 7 (mass 31 above 6 < 34.5) and 6 (token 9) */
    static const int32_t p_flips[] = {9, 6, -1};
    static const char *const p_mut[] = {"mass including itself < p", "one token past the boundary",
                                        NULL};
    /* min-p 0.25 x 9 = 2.25: 3s (tokens 3, 11) are kept, 2s are not */
    static const int32_t m_flips[] = {3, 5, -1};
    static const char *const m_mut[] = {"drops a kept 3", "keeps a 2", NULL};
    /* top-k 5 then top-p 0.6: 9, 8, 7, 7 (of 37, 17 < 22.2 <= 31); joint
     * keeps 6 (token 9) too */
    static const int32_t kf_flips[] = {9, -1};
    static const char *const kf_mut[] = {"joint instead of top-k first", NULL};
    static const char *const j_mut[] = {"top-k first instead of joint", NULL};
    static const int32_t none[] = {-1};
    const stats_cfg cases[] = {
        {S_PROBS, 0, 1.0f, 0.0f, FI_FILTER_TOP_K_FIRST, none, NULL},
        {S_LOGITS, 0, 1.0f, 0.0f, FI_FILTER_TOP_K_FIRST, none, NULL},
        {S_TOP_K, 3, 1.0f, 0.0f, FI_FILTER_TOP_K_FIRST, k_flips, k_mut},
        {S_TOP_P, 0, 0.5f, 0.0f, FI_FILTER_TOP_K_FIRST, p_flips, p_mut},
        {S_MIN_P, 0, 1.0f, 0.25f, FI_FILTER_TOP_K_FIRST, m_flips, m_mut},
        {S_TOP_K_TOP_P, 5, 0.6f, 0.0f, FI_FILTER_TOP_K_FIRST, kf_flips, kf_mut},
        {S_TOP_K_TOP_P, 5, 0.6f, 0.0f, FI_FILTER_JOINT, kf_flips, j_mut},
        {S_TOP_K_TOP_P_LOGITS, 5, 0.6f, 0.0f, FI_FILTER_TOP_K_FIRST, kf_flips, kf_mut},
        {S_TOP_K_TOP_P_LOGITS, 5, 0.6f, 0.0f, FI_FILTER_JOINT, kf_flips, j_mut},
    };
    char name[160];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(name, sizeof name, "stats/%s/%s%s", be->name, sample_names[cases[i].op],
                 cases[i].op >= S_TOP_K_TOP_P ? (cases[i].order ? "/joint" : "/top_k_first") : "");
        run_case("stats", name, case_stats, &cases[i], be->ctx);
    }
}

/* =============================================================== filter */

typedef enum filter_op { F_TOP_K_RENORM, F_TOP_P_RENORM, F_TOP_K_MASK } filter_op;
static const char *const filter_names[] = {"top_k_renorm_probs", "top_p_renorm_probs",
                                           "top_k_mask_logits"};

typedef struct filter_cfg {
    filter_op op;
    int64_t rows, v;
    fi_dtype dtype;
    int strided, per_row, in_place;
} filter_cfg;

static int case_filter(fi_context *ctx, tu_rng *rng, const void *p) {
    const filter_cfg *c = p;
    const int64_t shape[2] = {c->rows, c->v};
    const bool mask = c->op == F_TOP_K_MASK;
    tu_buf x, out;
    memset(&out, 0, sizeof out);
    if (ops_view_alloc(&x, c->dtype, 2, shape, c->strided, rng) ||
        (!c->in_place &&
         ops_view_alloc(&out, mask ? c->dtype : FI_DTYPE_F32, 2, shape, c->strided, rng))) {
        tu_note("allocation failed");
        return 0;
    }
    double *xv = mask ? fill_read(rng, &x, -5.0, 5.0) : fill_read(rng, &x, 0.0, 1.0);
    for (int64_t e = 0; e < c->rows * c->v; e++)
        if (e % 6 == 4) tu_view_set(&x.t, e, xv[e - 2]), xv[e] = xv[e - 2];
    sample_params sp;
    params_alloc(&sp, c->rows, rng, c->v, c->per_row, FI_FILTER_TOP_K_FIRST);
    const tu_buf *dst = c->in_place ? &x : &out;
    const fi_tensor *tk = c->per_row ? &sp.tk : NULL, *tp = c->per_row ? &sp.tp : NULL;
    fi_status st = c->op == F_TOP_K_RENORM
                       ? fi_top_k_renorm_probs(ctx, &x.t, tk, sp.k_val, (fi_tensor *)&dst->t, NULL)
                   : c->op == F_TOP_P_RENORM
                       ? fi_top_p_renorm_probs(ctx, &x.t, tp, sp.p_val, (fi_tensor *)&dst->t, NULL)
                       : fi_top_k_mask_logits(ctx, &x.t, tk, sp.k_val, (fi_tensor *)&dst->t, NULL);
    int ok = ops_check_ok(st, filter_names[c->op]);
    double *ref = malloc((size_t)(c->rows * c->v + 1) * sizeof *ref);
    bool *keep = malloc((size_t)c->v);
    for (int64_t r = 0; r < c->rows; r++) {
        const double *row = xv + r * c->v;
        int32_t k = c->per_row ? sp.top_k[r] : sp.k_val;
        double tpv = c->per_row ? sp.top_p[r] : sp.p_val;
        if (c->op == F_TOP_P_RENORM)
            oracle_filter(c->v, row, NULL, 0, tpv, -1.0, false, keep);
        else
            oracle_filter(c->v, row, NULL, k, 1.0, -1.0, false, keep);
        double mass = 0.0;
        for (int64_t i = 0; i < c->v; i++) mass += keep[i] ? row[i] : 0.0;
        for (int64_t i = 0; i < c->v; i++)
            ref[r * c->v + i] =
                mask ? (keep[i] ? row[i] : -INFINITY) : (keep[i] && mass > 0 ? row[i] / mass : 0.0);
    }
    if (ok) {
        double tol = mask ? 0.0 : tu_dtype_tol(dst->t.dtype);
        ok &= ops_check_view("out", &dst->t, ref, tol) & ops_check_outside("out", dst);
    }
    free(xv), free(ref), free(keep);
    params_free(&sp);
    tu_buf_free(&x), tu_buf_free(&out);
    return ok;
}

static void suite_filter(const tu_cpu_backend *be) {
    static const int64_t vs[] = {1, 9, 600, 3000};
    char name[160];
    for (int op = 0; op < 3; op++)
        for (int vi = 0; vi < 4; vi++)
            for (int di = 0; di < 3; di++)
                for (int mode = 0; mode < 3; mode++) {
                    if (tu_opt.quick && mode == 1 && vi == 1) continue;
                    filter_cfg c = {(filter_op)op,
                                    6,
                                    vs[vi],
                                    float_dtypes[di],
                                    mode == 1,
                                    mode >= 1,
                                    mode == 2 && (op == F_TOP_K_MASK || di == 0)};
                    snprintf(name, sizeof name, "filter/%s/%s/%s/v%lld/%s", be->name,
                             filter_names[op], tu_dtype_name(c.dtype), (long long)c.v,
                             mode == 0    ? "scalar"
                             : mode == 1  ? "per_row_strided"
                             : c.in_place ? "per_row_in_place"
                                          : "per_row");
                    run_case("filter", name, case_filter, &c, be->ctx);
                }
}

/* ================================================================= spec */

typedef struct spec_cfg {
    int64_t batch, n, v;
    fi_dtype dtype;
    int strided;
} spec_cfg;

/* Rows of a [.., .., V] tensor as normalised random distributions (some
 * zeros), read back as doubles. */
static double *fill_dists(tu_rng *rng, const tu_buf *b, int64_t rows, int64_t v) {
    for (int64_t r = 0; r < rows; r++) {
        double *w = malloc((size_t)v * sizeof *w), s = 0.0;
        for (int64_t i = 0; i < v; i++)
            s += w[i] = tu_rng_uniform(rng) < 0.2 ? 0.0 : tu_rng_uniform(rng);
        if (s == 0.0) w[0] = s = 1.0;
        for (int64_t i = 0; i < v; i++) tu_view_set(&b->t, r * v + i, w[i] / s);
        free(w);
    }
    return tu_view_read(&b->t);
}

static int case_spec(fi_context *ctx, tu_rng *rng, const void *p) {
    const spec_cfg *c = p;
    const int64_t B = c->batch, n = c->n, v = c->v;
    const int64_t ds[3] = {B, n, v}, ts[3] = {B, n + 1, v}, is[2] = {B, n}, os[2] = {B, n + 1};
    tu_buf dp, tp, ids, out;
    if (ops_view_alloc(&dp, c->dtype, 3, ds, c->strided, rng) ||
        ops_view_alloc(&tp, c->dtype, 3, ts, c->strided, rng) ||
        ops_view_alloc(&ids, FI_DTYPE_I32, 2, is, c->strided, rng) ||
        ops_view_alloc(&out, FI_DTYPE_I32, 2, os, c->strided, rng)) {
        tu_note("allocation failed");
        return 0;
    }
    double *d = fill_dists(rng, &dp, B * n, v), *t = fill_dists(rng, &tp, B * (n + 1), v);
    /* request 0: target = draft (all accepted); request 1: a target of 0 on
     * its first draft token (rejected at once) */
    int32_t *id = malloc((size_t)(B * n + 1) * sizeof *id);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < n; i++) {
            id[b * n + i] = tu_rng_int(rng, 0, (int32_t)v - 1);
            if (d[(b * n + i) * v + id[b * n + i]] == 0.0) /* a token the draft can draw */
                for (int64_t x = 0; x < v; x++)
                    if (d[(b * n + i) * v + x] > 0.0) id[b * n + i] = (int32_t)x;
            tu_view_set(&ids.t, b * n + i, id[b * n + i]);
            if (b == 0)
                for (int64_t x = 0; x < v; x++) {
                    t[i * v + x] = d[i * v + x];
                    tu_view_set(&tp.t, i * v + x, d[i * v + x]);
                }
        }
    if (B > 1 && n > 0) {
        int64_t e = (n + 1) * v + id[n];
        t[e] = 0.0;
        tu_view_set(&tp.t, e, 0.0);
    }
    free(d), free(t);
    d = tu_view_read(&dp.t), t = tu_view_read(&tp.t);
    int32_t *acc = malloc((size_t)B * sizeof *acc), *emi = malloc((size_t)B * sizeof *emi);
    for (int64_t b = 0; b < B; b++) acc[b] = (int32_t)b, emi[b] = 100;
    fi_tensor ta = vec_i32(acc, B), te = vec_i32(emi, B);
    const uint64_t seed = tu_rng_next(rng), offset = 3;
    int ok = ops_check_ok(fi_chain_speculative_sampling(ctx, &dp.t, &ids.t, &tp.t, seed, offset,
                                                        &out.t, &ta, &te, NULL),
                          "fi_chain_speculative_sampling");
    double *gotv = tu_view_read(&out.t);
    int32_t *want = malloc((size_t)(n + 1) * sizeof *want);
    for (int64_t b = 0; b < B && ok; b++) {
        int32_t a, e;
        double margin;
        oracle_chain_spec(n, v, d + b * n * v, id + b * n, t + b * (n + 1) * v, seed, offset,
                          (uint32_t)b, want, &a, &e, &margin);
        if (acc[b] != b + a || emi[b] != 100 + e) {
            tu_note("request %lld: accepted +%d emitted +%d, expected +%d +%d", (long long)b,
                    acc[b] - (int32_t)b, emi[b] - 100, a, e);
            ok = 0;
        }
        if (b == 0 && e != n)
            tu_note("request 0 (target = draft) emitted %d of %lld", e, (long long)n), ok = 0;
        if (b == 1 && n > 0 && e != 0)
            tu_note("request 1 (target 0 on its draft) emitted %d", e), ok = 0;
        for (int64_t i = 0; i <= n && ok; i++)
            if (gotv[b * (n + 1) + i] != want[i] && !(i == e && margin < 1e-5)) {
                tu_note("request %lld token %lld: %g, expected %d", (long long)b, (long long)i,
                        gotv[b * (n + 1) + i], want[i]);
                ok = 0;
            }
    }
    ok &= ops_check_outside("output_token_ids", &out);
    free(d), free(t), free(id), free(acc), free(emi), free(gotv), free(want);
    tu_buf_free(&dp), tu_buf_free(&tp), tu_buf_free(&ids), tu_buf_free(&out);
    return ok;
}

static void suite_spec(const tu_cpu_backend *be) {
    static const int64_t shapes[][3] = {{3, 1, 4}, {9, 3, 50}, {5, 5, 1000}, {2, 0, 7}};
    char name[160];
    for (int si = 0; si < 4; si++)
        for (int di = 0; di < 3; di++)
            for (int strided = 0; strided < 2; strided++) {
                spec_cfg c = {shapes[si][0], shapes[si][1], shapes[si][2], float_dtypes[di],
                              strided};
                snprintf(name, sizeof name, "spec/%s/%s/b%lld_n%lld_v%lld/%s", be->name,
                         tu_dtype_name(c.dtype), (long long)c.batch, (long long)c.n, (long long)c.v,
                         strided ? "strided" : "contiguous");
                run_case("spec", name, case_spec, &c, be->ctx);
            }
}

/* ================================================================= topk */

typedef struct topk_cfg {
    int64_t rows, cols;
    int32_t k;
    fi_dtype dtype;
    int strided, ragged, lengths, nan;
} topk_cfg;

static int case_topk(fi_context *ctx, tu_rng *rng, const void *p) {
    const topk_cfg *c = p;
    const int64_t R = c->rows, k = c->k;
    int32_t *len = malloc((size_t)R * sizeof *len), *off = malloc((size_t)R * sizeof *off);
    int32_t *ptr = malloc((size_t)(R + 1) * sizeof *ptr);
    ptr[0] = 0;
    for (int64_t r = 0; r < R; r++) {
        len[r] = c->lengths || c->ragged ? tu_rng_int(rng, 0, (int32_t)c->cols) : (int32_t)c->cols;
        off[r] = c->lengths ? tu_rng_int(rng, 0, 1000) : 0;
        ptr[r + 1] = ptr[r] + len[r];
    }
    const int64_t shape2[2] = {R, c->cols}, shape1[1] = {ptr[R] + 2}, os[2] = {R, k};
    tu_buf x, vals, idx;
    if (ops_view_alloc(&x, c->dtype, c->ragged ? 1 : 2, c->ragged ? shape1 : shape2, c->strided,
                       rng) ||
        ops_view_alloc(&vals, c->dtype, 2, os, c->strided, rng) ||
        ops_view_alloc(&idx, FI_DTYPE_I32, 2, os, c->strided, rng)) {
        tu_note("allocation failed");
        return 0;
    }
    double *xv = fill_read(rng, &x, -3.0, 3.0);
    int64_t total = tu_numel(&x.t);
    for (int64_t e = 3; e < total; e += 5) tu_view_set(&x.t, e, xv[e - 3]), xv[e] = xv[e - 3];
    if (c->nan && total > 4) tu_view_set(&x.t, 4, NAN), xv[4] = NAN;
    fi_tensor tl = vec_i32(len, R), to = vec_i32(off, R), tp = vec_i32(ptr, R + 1);
    fi_status st = c->ragged ? fi_top_k_ragged(ctx, &x.t, &tp, c->k, &vals.t, &idx.t, NULL)
                             : fi_top_k(ctx, &x.t, c->k, c->lengths ? &tl : NULL,
                                        c->lengths ? &to : NULL, &vals.t, &idx.t, NULL);
    int ok = ops_check_ok(st, c->ragged ? "fi_top_k_ragged" : "fi_top_k");
    double *gi = tu_view_read(&idx.t), *gv = tu_view_read(&vals.t);
    int32_t *want = malloc((size_t)k * sizeof *want);
    for (int64_t r = 0; r < R && ok; r++) {
        const double *row = xv + (c->ragged ? ptr[r] : r * c->cols);
        oracle_top_k(len[r], row, c->k, want);
        for (int64_t j = 0; j < k && ok; j++) {
            double wi = want[j] < 0 ? -1 : want[j] + off[r];
            double wv = want[j] < 0 ? -INFINITY : row[want[j]];
            bool same_v = gv[r * k + j] == wv || (isnan(wv) && isnan(gv[r * k + j]));
            if (gi[r * k + j] != wi || !same_v) {
                tu_note("row %lld slot %lld: (index %g, value %g), expected (%g, %g)", (long long)r,
                        (long long)j, gi[r * k + j], gv[r * k + j], wi, wv);
                ok = 0;
            }
        }
    }
    ok &= ops_check_outside("values", &vals) & ops_check_outside("indices", &idx);
    free(len), free(off), free(ptr), free(xv), free(gi), free(gv), free(want);
    tu_buf_free(&x), tu_buf_free(&vals), tu_buf_free(&idx);
    return ok;
}

static void suite_topk(const tu_cpu_backend *be) {
    /* 3 x 20000: long enough for the sampled pivot of small k */
    static const int64_t shapes[][2] = {{3, 1}, {5, 40}, {4, 3000}, {3, 20000}};
    static const int32_t ks[] = {1, 5, 40, 45};
    char name[160];
    for (int si = 0; si < 4; si++)
        for (int ki = 0; ki < 4; ki++)
            for (int di = 0; di < 3; di++)
                for (int mode = 0; mode < 4; mode++) {
                    if (tu_opt.quick && mode == 1 && di) continue;
                    topk_cfg c = {shapes[si][0], shapes[si][1], ks[ki],    float_dtypes[di],
                                  mode == 1,     mode == 3,     mode == 2, di == 0 && mode == 0};
                    snprintf(name, sizeof name, "topk/%s/%s/r%lld_n%lld_k%d/%s", be->name,
                             tu_dtype_name(c.dtype), (long long)c.rows, (long long)c.cols, c.k,
                             mode == 0   ? "dense_nan"
                             : mode == 1 ? "strided"
                             : mode == 2 ? "lengths_offsets"
                                         : "ragged");
                    run_case("topk", name, case_topk, &c, be->ctx);
                }
}

/* ================================================================ repro */

/* The outputs of a fixed set of calls as bytes, to compare across
 * contexts: sampling (per-row filters, logits in f16), a renorm, softmax,
 * a norm and speculative sampling. */
typedef struct repro_out {
    int32_t s1[96], s2[96], s3[96], spec[24 * 4];
    float renorm[96 * 700], probs[96 * 700];
    uint16_t norm[64 * 1500];
} repro_out;

static int repro_run(fi_context *ctx, repro_out *o) {
    enum { B = 96, V = 700, H = 1500, NR = 64 };
    static float probs[B * V], logits32[B * V], x[NR * H], w[H], dp[24 * 3 * V], tp[24 * 4 * V];
    static uint16_t logits16[B * V];
    static int32_t ids[24 * 3];
    tu_rng rng;
    tu_rng_seed(&rng, 12345);
    for (int i = 0; i < B * V; i++) {
        probs[i] = (float)tu_rng_uniform(&rng);
        logits32[i] = (float)tu_rng_range(&rng, -6, 6);
        logits16[i] = tu_f32_to_f16(logits32[i]);
    }
    for (int i = 0; i < NR * H; i++) x[i] = (float)tu_rng_range(&rng, -2, 2);
    for (int i = 0; i < H; i++) w[i] = (float)tu_rng_range(&rng, -1, 1);
    for (int i = 0; i < 24 * 3 * V; i++) dp[i] = (float)tu_rng_uniform(&rng) / V * 2;
    for (int i = 0; i < 24 * 4 * V; i++) tp[i] = (float)tu_rng_uniform(&rng) / V * 2;
    for (int i = 0; i < 24 * 3; i++) ids[i] = tu_rng_int(&rng, 0, V - 1);
    sample_params sp;
    params_alloc(&sp, B, &rng, V, 1, FI_FILTER_TOP_K_FIRST);
    int64_t ms[2] = {B, V}, ns[2] = {NR, H}, hs[1] = {H};
    int64_t d3[3] = {24, 3, V}, t3[3] = {24, 4, V}, i2[2] = {24, 3}, o2[2] = {24, 4};
    fi_tensor tpr = fi_tensor_contiguous(probs, FI_DTYPE_F32, 2, ms);
    fi_tensor tl16 = fi_tensor_contiguous(logits16, FI_DTYPE_F16, 2, ms);
    fi_tensor tl32 = fi_tensor_contiguous(logits32, FI_DTYPE_F32, 2, ms);
    fi_tensor s1 = vec_i32(o->s1, B), s2 = vec_i32(o->s2, B), s3 = vec_i32(o->s3, B);
    fi_tensor ren = fi_tensor_contiguous(o->renorm, FI_DTYPE_F32, 2, ms);
    fi_tensor pro = fi_tensor_contiguous(o->probs, FI_DTYPE_F32, 2, ms);
    fi_tensor tx = fi_tensor_contiguous(x, FI_DTYPE_F32, 2, ns),
              tw = fi_tensor_contiguous(w, FI_DTYPE_F32, 1, hs);
    fi_tensor tn = fi_tensor_contiguous(o->norm, FI_DTYPE_BF16, 2, ns);
    fi_tensor tdp = fi_tensor_contiguous(dp, FI_DTYPE_F32, 3, d3),
              ttp = fi_tensor_contiguous(tp, FI_DTYPE_F32, 3, t3);
    fi_tensor tid = fi_tensor_contiguous(ids, FI_DTYPE_I32, 2, i2),
              tso = fi_tensor_contiguous(o->spec, FI_DTYPE_I32, 2, o2);
    int ok =
        ops_check_ok(fi_top_k_top_p_sampling_from_probs(ctx, &tpr, NULL, &sp.tk, 0, &sp.tp, 0,
                                                        FI_FILTER_JOINT, 99, 5, &s1, NULL, NULL),
                     "top_k_top_p") &&
        ops_check_ok(fi_top_k_top_p_sampling_from_logits(ctx, &tl16, NULL, &sp.tk, 0, &sp.tp, 0,
                                                         FI_FILTER_TOP_K_FIRST, 99, 6, &s2, NULL,
                                                         NULL),
                     "from_logits") &&
        ops_check_ok(
            fi_min_p_sampling_from_probs(ctx, &tpr, NULL, &sp.mp, 0, 99, 7, &s3, NULL, NULL),
            "min_p") &&
        ops_check_ok(fi_top_p_renorm_probs(ctx, &tpr, &sp.tp, 0, &ren, NULL), "top_p_renorm") &&
        ops_check_ok(fi_softmax(ctx, &tl32, NULL, 0.8f, &pro, NULL), "softmax") &&
        ops_check_ok(fi_rmsnorm(ctx, &tx, &tw, 1e-6f, &tn, NULL), "rmsnorm") &&
        ops_check_ok(
            fi_chain_speculative_sampling(ctx, &tdp, &tid, &ttp, 3, 4, &tso, NULL, NULL, NULL),
            "spec");
    params_free(&sp);
    return ok;
}

static int case_repro(fi_context *ctx, tu_rng *rng, const void *p) {
    (void)ctx, (void)rng, (void)p;
    static repro_out first, now;
    int ok = 1, have = 0;
    for (int level = 0; level < TU_NUM_CPU_BACKENDS; level++)
        for (int32_t threads = 1; threads <= 3; threads++) {
            tu_cpu_backend be;
            if (tu_cpu_backend_open(&be, level, threads)) continue;
            repro_out *o = have ? &now : &first;
            memset(o, 0, sizeof *o);
            ok &= repro_run(be.ctx, o);
            fi_context_destroy(be.ctx);
            if (have && memcmp(&first, &now, sizeof now)) {
                tu_note("%s with %d threads: outputs differ from the first context's", be.name,
                        (int)threads);
                ok = 0;
            }
            have = 1;
        }
    return ok;
}

/* A pool with more workers than the call has rows: each row's worker
 * must use one of the scratch slots made for the call (an earlier version
 * gave row r to pool worker 15 r / 2 and its slot, megabytes past the
 * allocation: too far for ASan's redzones to see, a crash on a 16-core
 * host). The same bytes as one thread. */
static int case_threads_past_rows(fi_context *ctx, tu_rng *rng, const void *p) {
    (void)ctx, (void)p;
    enum { R = 2, V = 65536 };
    static float x[R * V], one[R * V], many[R * V];
    static int32_t s1[R], s8[R];
    for (int i = 0; i < R * V; i++) x[i] = (float)tu_rng_uniform(rng);
    const int64_t shape[2] = {R, V}, rs[1] = {R};
    fi_tensor tx = fi_tensor_contiguous(x, FI_DTYPE_F32, 2, shape);
    int ok = 1;
    for (int threads = 1; threads <= 16 && ok; threads += 15) {
        tu_cpu_backend be;
        if (tu_cpu_backend_open(&be, 0, threads)) return 0;
        fi_tensor to = fi_tensor_contiguous(threads == 1 ? one : many, FI_DTYPE_F32, 2, shape);
        fi_tensor ts = fi_tensor_contiguous(threads == 1 ? s1 : s8, FI_DTYPE_I32, 1, rs);
        ok = ops_check_ok(fi_softmax(be.ctx, &tx, NULL, 0.9f, &to, NULL), "fi_softmax") &&
             ops_check_ok(fi_top_k_top_p_sampling_from_probs(be.ctx, &tx, NULL, NULL, 50, NULL,
                                                             0.9f, FI_FILTER_JOINT, 5, 6, &ts,
                                                             NULL, NULL),
                          "top_k_top_p");
        fi_context_destroy(be.ctx);
    }
    if (ok && (memcmp(one, many, sizeof one) || memcmp(s1, s8, sizeof s1))) {
        tu_note("16 threads over 2 rows differ from 1 thread");
        ok = 0;
    }
    return ok;
}

/* ================================================================== rng */

static int case_rng(fi_context *ctx, tu_rng *rng, const void *p) {
    (void)ctx, (void)rng, (void)p;
    /* Random123's known answers for Philox4x32-10 */
    static const struct {
        uint32_t ctr[4];
        uint64_t key;
        uint32_t want[4];
    } kat[] = {
        {{0, 0, 0, 0}, 0, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
        {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
         0xffffffffffffffffull,
         {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
        {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
         0x299f31d0a4093822ull,
         {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
    };
    int ok = 1;
    for (int i = 0; i < 3; i++) {
        uint32_t got[4];
        oracle_philox(kat[i].ctr, kat[i].key, got);
        if (memcmp(got, kat[i].want, sizeof got)) {
            tu_note("philox vector %d: %08x %08x %08x %08x", i, got[0], got[1], got[2], got[3]);
            ok = 0;
        }
    }
    return ok;
}

/* ================================================================ large */

static int case_large(fi_context *ctx, tu_rng *rng, const void *p) {
    (void)p;
    enum { R = 3, V = 262144, NR = 40, H = 16384 };
    sample_cfg c = {S_TOP_K_TOP_P, R, V, FI_DTYPE_BF16, 0, 1, 0, 1, FI_FILTER_JOINT};
    int ok = case_sample(ctx, rng, &c);
    sample_cfg d = {S_TOP_K_TOP_P_LOGITS, R, V, FI_DTYPE_F32, 1, 1, 1, 0, FI_FILTER_TOP_K_FIRST};
    ok &= case_sample(ctx, rng, &d);
    norm_cfg n = {NORM_FUSED, NR, 0, H, FI_DTYPE_BF16, FI_DTYPE_BF16, 0, 0};
    ok &= case_norm(ctx, rng, &n);
    act_cfg a = {0, NR, H, FI_DTYPE_F16, FI_DTYPE_F16, 0};
    ok &= case_act(ctx, rng, &a);
    topk_cfg t = {2, V, 50, FI_DTYPE_F32, 0, 0, 0, 0};
    ok &= case_topk(ctx, rng, &t);
    return ok;
}

/* ============================================================ bad input */

/* Valid arguments for every op, which each case breaks in one place. */
typedef struct bad_env {
    fi_context *ctx;
    tu_buf x, res, w, out, q8, act_out, probs, samples, valid, idx, tk, tp, ren;
    tu_buf dp, tp3, ids, oids, acc, vals, tki, ptr;
} bad_env;

static int bad_env_alloc(bad_env *e, tu_rng *rng) {
    const int64_t m[2] = {4, 8}, h[1] = {8}, a[2] = {4, 4}, b[1] = {4};
    const int64_t d3[3] = {4, 2, 8}, t3[3] = {4, 3, 8}, i2[2] = {4, 2}, o2[2] = {4, 3};
    const int64_t k2[2] = {4, 3}, p1[1] = {5};
    int f =
        tu_buf_alloc(&e->x, FI_DTYPE_F32, 2, m) | tu_buf_alloc(&e->res, FI_DTYPE_F32, 2, m) |
        tu_buf_alloc(&e->w, FI_DTYPE_F32, 1, h) | tu_buf_alloc(&e->out, FI_DTYPE_F32, 2, m) |
        tu_buf_alloc(&e->q8, FI_DTYPE_E4M3, 2, m) | tu_buf_alloc(&e->act_out, FI_DTYPE_F32, 2, a) |
        tu_buf_alloc(&e->probs, FI_DTYPE_F32, 2, m) |
        tu_buf_alloc(&e->samples, FI_DTYPE_I32, 1, b) | tu_buf_alloc(&e->valid, FI_DTYPE_U8, 1, b) |
        tu_buf_alloc(&e->idx, FI_DTYPE_I32, 1, b) | tu_buf_alloc(&e->tk, FI_DTYPE_I32, 1, b) |
        tu_buf_alloc(&e->tp, FI_DTYPE_F32, 1, b) | tu_buf_alloc(&e->ren, FI_DTYPE_F32, 2, m) |
        tu_buf_alloc(&e->dp, FI_DTYPE_F32, 3, d3) | tu_buf_alloc(&e->tp3, FI_DTYPE_F32, 3, t3) |
        tu_buf_alloc(&e->ids, FI_DTYPE_I32, 2, i2) | tu_buf_alloc(&e->oids, FI_DTYPE_I32, 2, o2) |
        tu_buf_alloc(&e->acc, FI_DTYPE_I32, 1, b) | tu_buf_alloc(&e->vals, FI_DTYPE_F32, 2, k2) |
        tu_buf_alloc(&e->tki, FI_DTYPE_I32, 2, k2) | tu_buf_alloc(&e->ptr, FI_DTYPE_I32, 1, p1);
    if (f) return -1;
    tu_fill_uniform(rng, &e->x.t, -1, 1, 0), tu_fill_uniform(rng, &e->res.t, -1, 1, 0);
    tu_fill_uniform(rng, &e->w.t, -1, 1, 0), tu_fill_uniform(rng, &e->probs.t, 0, 1, 0);
    tu_fill_uniform(rng, &e->dp.t, 0, 1, 0), tu_fill_uniform(rng, &e->tp3.t, 0, 1, 0);
    for (int i = 0; i < 4; i++) {
        tu_view_set(&e->idx.t, i, 3 - i), tu_view_set(&e->tk.t, i, i + 1);
        tu_view_set(&e->tp.t, i, 0.25 * (i + 1)), tu_view_set(&e->acc.t, i, 0);
    }
    for (int i = 0; i < 8; i++) tu_view_set(&e->ids.t, i, i % 8);
    static const int32_t ptr[5] = {0, 3, 3, 8, 8};
    for (int i = 0; i < 5; i++) tu_view_set(&e->ptr.t, i, ptr[i]);
    return 0;
}

static tu_buf *bad_env_buf(bad_env *e, int i) {
    tu_buf *all[] = {&e->x,       &e->res,   &e->w,    &e->out, &e->q8,   &e->act_out, &e->probs,
                     &e->samples, &e->valid, &e->idx,  &e->tk,  &e->tp,   &e->ren,     &e->dp,
                     &e->tp3,     &e->ids,   &e->oids, &e->acc, &e->vals, &e->tki,     &e->ptr};
    return i < (int)(sizeof all / sizeof all[0]) ? all[i] : NULL;
}

typedef struct bad_case {
    const char *name;
    fi_status status;
    const char *message;
} bad_case;

static const bad_case bad_cases[] = {
    {"rmsnorm/null_ctx", FI_STATUS_INVALID_ARGUMENT, "ctx"},
    {"rmsnorm/null_input", FI_STATUS_INVALID_ARGUMENT, "input: tensor is NULL"},
    {"rmsnorm/input_i32", FI_STATUS_INVALID_ARGUMENT, "input.dtype is i32"},
    {"rmsnorm/weight_len", FI_STATUS_INVALID_ARGUMENT, "weight.shape[0]=7, expected 8"},
    {"rmsnorm/out_shape", FI_STATUS_INVALID_ARGUMENT, "out.shape[0]=3, expected 4"},
    {"rmsnorm/out_rank", FI_STATUS_INVALID_ARGUMENT, "out.ndim is 1 but input.ndim is 2"},
    {"rmsnorm/out_overlaps_weight", FI_STATUS_INVALID_ARGUMENT, "weight"},
    {"rmsnorm/out_shifted_input", FI_STATUS_INVALID_ARGUMENT, "input"},
    {"rmsnorm/eps_negative", FI_STATUS_INVALID_ARGUMENT, "eps=-1"},
    {"rmsnorm/eps_nan", FI_STATUS_INVALID_ARGUMENT, "eps=nan"},
    {"rmsnorm/hidden_zero", FI_STATUS_INVALID_ARGUMENT, "hidden size"},
    {"rmsnorm/null_data", FI_STATUS_INVALID_ARGUMENT, "input.data is NULL"},
    {"rmsnorm/out_fp8", FI_STATUS_INVALID_ARGUMENT, "out.dtype is e4m3"},
    {"rmsnorm/misaligned", FI_STATUS_INVALID_ARGUMENT, "not aligned"},
    {"fused_add/residual_shape", FI_STATUS_INVALID_ARGUMENT, "residual.shape[1]=7"},
    {"fused_add/residual_is_input", FI_STATUS_INVALID_ARGUMENT, "residual"},
    {"fused_add/null_residual", FI_STATUS_INVALID_ARGUMENT, "residual: tensor is NULL"},
    {"layernorm/null_beta", FI_STATUS_INVALID_ARGUMENT, "beta"},
    {"quant/out_f32", FI_STATUS_INVALID_ARGUMENT, "expected e4m3 or e5m2"},
    {"quant/scale_zero", FI_STATUS_INVALID_ARGUMENT, "scale=0"},
    {"quant/scale_inf", FI_STATUS_INVALID_ARGUMENT, "scale=inf"},
    {"act/odd_last_dim", FI_STATUS_INVALID_ARGUMENT, "must be even"},
    {"act/out_dim", FI_STATUS_INVALID_ARGUMENT, "out.shape[1]=8, expected 4"},
    {"act/out_overlaps_input", FI_STATUS_INVALID_ARGUMENT, "input"},
    {"softmax/temperature_zero", FI_STATUS_INVALID_ARGUMENT, "temperature=0"},
    {"softmax/temperature_row_negative", FI_STATUS_INVALID_ARGUMENT, "temperature[2]=-1"},
    {"softmax/temperature_len", FI_STATUS_INVALID_ARGUMENT, "temperature.shape[0]=3"},
    {"softmax/probs_shape", FI_STATUS_INVALID_ARGUMENT, "probs.shape[1]=7"},
    {"softmax/empty_vocab", FI_STATUS_INVALID_ARGUMENT, "vocabulary is empty"},
    {"sample/samples_f32", FI_STATUS_INVALID_ARGUMENT, "samples.dtype is f32"},
    {"sample/samples_len", FI_STATUS_INVALID_ARGUMENT, "samples.shape[0]=3"},
    {"sample/index_past_rows", FI_STATUS_INVALID_ARGUMENT, "indices[1]=4 is outside [0, 3]"},
    {"sample/index_negative", FI_STATUS_INVALID_ARGUMENT, "indices[0]=-1"},
    {"sample/valid_i32", FI_STATUS_INVALID_ARGUMENT, "valid.dtype is i32"},
    {"sample/samples_overlap_probs", FI_STATUS_INVALID_ARGUMENT, "samples"},
    {"sample/samples_broadcast", FI_STATUS_INVALID_ARGUMENT, "samples"},
    {"sample/probs_3d", FI_STATUS_INVALID_ARGUMENT, "probs.ndim is 3, expected 2"},
    {"top_p/above_one", FI_STATUS_INVALID_ARGUMENT, "top_p=1.5 is outside [0, 1]"},
    {"top_p/nan", FI_STATUS_INVALID_ARGUMENT, "top_p=nan"},
    {"top_p/row_negative", FI_STATUS_INVALID_ARGUMENT, "top_p[3]=-0.5"},
    {"top_k/tensor_f32", FI_STATUS_INVALID_ARGUMENT, "top_k.dtype is f32"},
    {"min_p/negative", FI_STATUS_INVALID_ARGUMENT, "min_p=-0.1"},
    {"top_k_top_p/order", FI_STATUS_INVALID_ARGUMENT, "order=5"},
    {"renorm/out_shape", FI_STATUS_INVALID_ARGUMENT, "out.shape[0]=3"},
    {"mask/out_dtype", FI_STATUS_INVALID_ARGUMENT, "bit for bit"},
    {"renorm/out_overlaps_probs", FI_STATUS_INVALID_ARGUMENT, "probs"},
    {"spec/draft_id_past_vocab", FI_STATUS_INVALID_ARGUMENT, "draft_token_ids[1][0]=8"},
    {"spec/target_tokens", FI_STATUS_INVALID_ARGUMENT, "target_probs.shape[1]=2, expected 3"},
    {"spec/out_shape", FI_STATUS_INVALID_ARGUMENT, "output_token_ids.shape[1]=2"},
    {"spec/accepted_f32", FI_STATUS_INVALID_ARGUMENT, "accepted_num.dtype is f32"},
    {"spec/out_is_accepted", FI_STATUS_INVALID_ARGUMENT, "accepted_num"},
    {"top_k/k_zero", FI_STATUS_INVALID_ARGUMENT, "k=0 must be >= 1"},
    {"top_k/indices_shape", FI_STATUS_INVALID_ARGUMENT, "indices.shape[1]=2, expected 3"},
    {"top_k/values_dtype", FI_STATUS_INVALID_ARGUMENT,
     "values.dtype is f16 but input.dtype is f32"},
    {"top_k/length_past_cols", FI_STATUS_INVALID_ARGUMENT, "lengths[2]=9 is outside [0, 8]"},
    {"top_k/values_overlap_input", FI_STATUS_INVALID_ARGUMENT, "values"},
    {"ragged/indptr_start", FI_STATUS_INVALID_ARGUMENT, "indptr[0]=1"},
    {"ragged/indptr_decreasing", FI_STATUS_INVALID_ARGUMENT, "indptr[2]=2 < indptr[1]=3"},
    {"ragged/indptr_past_input", FI_STATUS_INVALID_ARGUMENT, "indptr[4]=40 is past"},
    {"rope_cache/position_past_cache", FI_STATUS_INVALID_ARGUMENT, "positions[1]=4 is not a row"},
    {"rope_cache/rotary_odd", FI_STATUS_INVALID_ARGUMENT, "must be even"},
    {"rope_cache/cache_f16", FI_STATUS_INVALID_ARGUMENT, "cos_sin_cache.dtype is f16"},
    {"rope_cache/k_out_is_q", FI_STATUS_INVALID_ARGUMENT, "k_out"},
    {"qk_norm_rope/null_q_weight", FI_STATUS_INVALID_ARGUMENT, "q_weight: tensor is NULL"},
    {"qk_norm_rope/null_k_weight", FI_STATUS_INVALID_ARGUMENT, "k_weight: tensor is NULL"},
    {"qk_norm_rope/q_weight_len", FI_STATUS_INVALID_ARGUMENT, "q_weight.shape[0]=3, expected 4"},
    {"qk_norm_rope/k_weight_i32", FI_STATUS_INVALID_ARGUMENT, "k_weight.dtype is i32"},
    {"qk_norm_rope/k_weight_2d", FI_STATUS_INVALID_ARGUMENT, "k_weight"},
    {"qk_norm_rope/eps_negative", FI_STATUS_INVALID_ARGUMENT, "eps=-2"},
    {"qk_norm_rope/eps_inf", FI_STATUS_INVALID_ARGUMENT, "eps=inf"},
    {"qk_norm_rope/rotary_past_dim", FI_STATUS_INVALID_ARGUMENT, "[2, head_dim 4]"},
    {"qk_norm_rope/q_out_over_k_weight", FI_STATUS_INVALID_ARGUMENT, "k_weight"},
    {"qk_norm_rope/k_out_one_head_into_q", FI_STATUS_INVALID_ARGUMENT, "k_out"},
    {"qk_norm_rope/q_out_dtype", FI_STATUS_INVALID_ARGUMENT, "q_out.dtype is f16"},
    {"qk_norm_rope/position_past_cache", FI_STATUS_INVALID_ARGUMENT,
     "positions[2]=9 is not a row"},
    {"gemma_qk_norm_rope/position_negative", FI_STATUS_INVALID_ARGUMENT,
     "positions[2]=-3 is not a row"},
};
#define NUM_BAD ((int)(sizeof bad_cases / sizeof bad_cases[0]))

/* The RoPE cases' q [4, 2, 4] and k [4, 1, 4] views of x and res, and a
 * [4, 4] cache of probs. */
static void rope_bad_views(const fi_tensor *x, const fi_tensor *res, const fi_tensor *pr,
                           fi_tensor *q3, fi_tensor *k3, fi_tensor *cache) {
    *q3 = *x, *k3 = *res, *cache = *pr;
    q3->ndim = k3->ndim = 3;
    q3->shape[1] = 2, q3->shape[2] = 4, q3->stride[0] = 8, q3->stride[1] = 4, q3->stride[2] = 1;
    k3->shape[1] = 1, k3->shape[2] = 4, k3->stride[0] = 8, k3->stride[1] = 4, k3->stride[2] = 1;
    cache->shape[1] = 4, cache->stride[0] = 8;
}

static fi_status bad_call(int i, bad_env *e) {
    const char *n = bad_cases[i].name;
    fi_context *ctx = e->ctx;
    fi_tensor x = e->x.t, res = e->res.t, w = e->w.t, out = e->out.t, q8 = e->q8.t;
    fi_tensor ao = e->act_out.t, pr = e->probs.t, sa = e->samples.t, va = e->valid.t;
    fi_tensor ix = e->idx.t, tk = e->tk.t, tp = e->tp.t, rn = e->ren.t, dp = e->dp.t;
    fi_tensor t3 = e->tp3.t, ids = e->ids.t, oi = e->oids.t, ac = e->acc.t, vl = e->vals.t;
    fi_tensor ki = e->tki.t, pt = e->ptr.t;
    float tv = 1.0f;
    if (!strcmp(n, "rmsnorm/null_ctx")) return fi_rmsnorm(NULL, &x, &w, 1e-6f, &out, NULL);
    if (!strcmp(n, "rmsnorm/null_input")) return fi_rmsnorm(ctx, NULL, &w, 1e-6f, &out, NULL);
    if (!strcmp(n, "rmsnorm/input_i32")) x.dtype = FI_DTYPE_I32;
    if (!strcmp(n, "rmsnorm/weight_len")) w.shape[0] = 7;
    if (!strcmp(n, "rmsnorm/out_shape")) out.shape[0] = 3;
    if (!strcmp(n, "rmsnorm/out_rank")) out.ndim = 1;
    if (!strcmp(n, "rmsnorm/out_overlaps_weight")) out.data = w.data;
    if (!strcmp(n, "rmsnorm/out_shifted_input"))
        out.data = (float *)x.data + 1, out.shape[0] = 3, x.shape[0] = 3;
    if (!strcmp(n, "rmsnorm/hidden_zero")) x.shape[1] = 0, out.shape[1] = 0, w.shape[0] = 0;
    if (!strcmp(n, "rmsnorm/null_data")) x.data = NULL;
    if (!strcmp(n, "rmsnorm/misaligned")) x.data = (char *)x.data + 2;
    if (!strncmp(n, "rmsnorm/", 8)) {
        float eps = !strcmp(n, "rmsnorm/eps_negative") ? -1.0f
                    : !strcmp(n, "rmsnorm/eps_nan")    ? NAN
                                                       : 1e-6f;
        return fi_rmsnorm(ctx, &x, &w, eps, !strcmp(n, "rmsnorm/out_fp8") ? &q8 : &out, NULL);
    }
    if (!strcmp(n, "fused_add/residual_shape")) res.shape[1] = 7;
    if (!strcmp(n, "fused_add/residual_is_input")) res = x;
    if (!strncmp(n, "fused_add/", 10))
        return fi_fused_add_rmsnorm(ctx, &x, !strcmp(n, "fused_add/null_residual") ? NULL : &res,
                                    &w, 1e-6f, NULL);
    if (!strcmp(n, "layernorm/null_beta"))
        return fi_layernorm(ctx, &x, &w, NULL, 1e-6f, &out, NULL);
    if (!strcmp(n, "quant/out_f32")) return fi_rmsnorm_quant(ctx, &x, &w, 1.0f, 1e-6f, &out, NULL);
    if (!strcmp(n, "quant/scale_zero"))
        return fi_rmsnorm_quant(ctx, &x, &w, 0.0f, 1e-6f, &q8, NULL);
    if (!strcmp(n, "quant/scale_inf"))
        return fi_fused_add_rmsnorm_quant(ctx, &x, &res, &w, INFINITY, 1e-6f, &q8, NULL);
    if (!strcmp(n, "act/odd_last_dim")) x.shape[1] = 7;
    if (!strcmp(n, "act/out_dim")) ao = out;
    if (!strcmp(n, "act/out_overlaps_input")) ao.data = x.data;
    if (!strncmp(n, "act/", 4)) return fi_silu_and_mul(ctx, &x, &ao, NULL);
    if (!strncmp(n, "softmax/", 8)) {
        fi_tensor *temp = NULL;
        if (!strcmp(n, "softmax/temperature_zero")) tv = 0.0f;
        if (!strcmp(n, "softmax/temperature_row_negative"))
            tu_view_set(&e->tp.t, 2, -1.0), temp = &tp;
        if (!strcmp(n, "softmax/temperature_len")) tp.shape[0] = 3, temp = &tp;
        if (!strcmp(n, "softmax/probs_shape")) rn.shape[1] = 7;
        if (!strcmp(n, "softmax/empty_vocab")) pr.shape[1] = 0, rn.shape[1] = 0;
        fi_status st = fi_softmax(ctx, &pr, temp, tv, &rn, NULL);
        tu_view_set(&e->tp.t, 2, 0.75);
        return st;
    }
    if (!strncmp(n, "sample/", 7)) {
        fi_tensor *idx = NULL;
        if (!strcmp(n, "sample/samples_f32")) sa.dtype = FI_DTYPE_F32;
        if (!strcmp(n, "sample/samples_len")) sa.shape[0] = 3;
        if (!strcmp(n, "sample/index_past_rows")) tu_view_set(&e->idx.t, 1, 4), idx = &ix;
        if (!strcmp(n, "sample/index_negative")) tu_view_set(&e->idx.t, 0, -1), idx = &ix;
        if (!strcmp(n, "sample/valid_i32")) va.dtype = FI_DTYPE_I32;
        if (!strcmp(n, "sample/samples_overlap_probs")) sa.data = pr.data;
        if (!strcmp(n, "sample/samples_broadcast")) sa.stride[0] = 0;
        if (!strcmp(n, "sample/probs_3d")) pr = dp;
        fi_status st = fi_sampling_from_probs(ctx, &pr, idx, 1, 2, &sa, &va, NULL);
        for (int r = 0; r < 4; r++) tu_view_set(&e->idx.t, r, 3 - r);
        return st;
    }
    if (!strncmp(n, "top_p/", 6)) {
        float p = !strcmp(n, "top_p/above_one") ? 1.5f : !strcmp(n, "top_p/nan") ? NAN : 0.5f;
        fi_tensor *arr = NULL;
        if (!strcmp(n, "top_p/row_negative")) tu_view_set(&e->tp.t, 3, -0.5), arr = &tp;
        fi_status st = fi_top_p_sampling_from_probs(ctx, &pr, NULL, arr, p, 1, 2, &sa, NULL, NULL);
        tu_view_set(&e->tp.t, 3, 1.0);
        return st;
    }
    if (!strcmp(n, "top_k/tensor_f32"))
        return fi_top_k_sampling_from_probs(ctx, &pr, NULL, &tp, 2, 1, 2, &sa, NULL, NULL);
    if (!strcmp(n, "min_p/negative"))
        return fi_min_p_sampling_from_probs(ctx, &pr, NULL, NULL, -0.1f, 1, 2, &sa, NULL, NULL);
    if (!strcmp(n, "top_k_top_p/order"))
        return fi_top_k_top_p_sampling_from_probs(ctx, &pr, NULL, &tk, 0, NULL, 0.5f,
                                                  (fi_filter_order)5, 1, 2, &sa, NULL, NULL);
    if (!strcmp(n, "renorm/out_shape")) rn.shape[0] = 3;
    if (!strcmp(n, "renorm/out_overlaps_probs"))
        rn.data = (float *)pr.data + 8, rn.shape[0] = 3, pr.shape[0] = 3;
    if (!strncmp(n, "renorm/", 7)) return fi_top_k_renorm_probs(ctx, &pr, NULL, 3, &rn, NULL);
    if (!strcmp(n, "mask/out_dtype")) {
        rn.dtype = FI_DTYPE_F16;
        return fi_top_k_mask_logits(ctx, &pr, NULL, 3, &rn, NULL);
    }
    if (!strncmp(n, "spec/", 5)) {
        fi_tensor *acc = &ac;
        if (!strcmp(n, "spec/draft_id_past_vocab")) tu_view_set(&e->ids.t, 2, 8);
        if (!strcmp(n, "spec/target_tokens")) t3.shape[1] = 2;
        if (!strcmp(n, "spec/out_shape")) oi.shape[1] = 2;
        if (!strcmp(n, "spec/accepted_f32")) ac.dtype = FI_DTYPE_F32;
        if (!strcmp(n, "spec/out_is_accepted")) ac.data = oi.data;
        fi_status st =
            fi_chain_speculative_sampling(ctx, &dp, &ids, &t3, 1, 2, &oi, acc, NULL, NULL);
        tu_view_set(&e->ids.t, 2, 2);
        return st;
    }
    if (!strncmp(n, "top_k/", 6)) {
        int32_t k = !strcmp(n, "top_k/k_zero") ? 0 : 3;
        fi_tensor *len = NULL;
        if (!strcmp(n, "top_k/indices_shape")) ki.shape[1] = 2;
        if (!strcmp(n, "top_k/values_dtype")) vl.dtype = FI_DTYPE_F16;
        if (!strcmp(n, "top_k/length_past_cols")) tu_view_set(&e->tk.t, 2, 9), len = &tk;
        if (!strcmp(n, "top_k/values_overlap_input")) vl.data = x.data;
        fi_status st = fi_top_k(ctx, &x, k, len, NULL, &vl, &ki, NULL);
        tu_view_set(&e->tk.t, 2, 3);
        return st;
    }
    if (!strncmp(n, "rope_cache/", 11)) {
        fi_tensor q3, k3, cache, pos = ix;
        rope_bad_views(&x, &res, &pr, &q3, &k3, &cache);
        fi_tensor qo3 = q3, ko3 = k3;
        if (!strcmp(n, "rope_cache/position_past_cache"))
            cache.shape[0] = 4, tu_view_set(&e->idx.t, 1, 4);
        if (!strcmp(n, "rope_cache/rotary_odd")) cache.shape[1] = 3;
        if (!strcmp(n, "rope_cache/cache_f16")) cache.dtype = FI_DTYPE_F16;
        if (!strcmp(n, "rope_cache/k_out_is_q")) ko3 = q3, ko3.shape[1] = 1;
        fi_status st =
            fi_rope_apply_cos_sin_cache(ctx, &pos, &q3, &k3, &cache, 1, &qo3, &ko3, NULL);
        for (int r = 0; r < 4; r++) tu_view_set(&e->idx.t, r, 3 - r);
        return st;
    }
    if (strstr(n, "qk_norm_rope/")) {
        /* weights [4]: the halves of w */
        fi_tensor q3, k3, cache, pos = ix, qw = w, kw = w;
        rope_bad_views(&x, &res, &pr, &q3, &k3, &cache);
        fi_tensor qo3 = q3, ko3 = k3;
        qw.shape[0] = kw.shape[0] = 4, kw.data = (float *)w.data + 4;
        float eps = 1e-6f;
        const fi_tensor *pq = &qw, *pk = &kw;
        int at = -1;
        if (!strcmp(n, "qk_norm_rope/null_q_weight")) pq = NULL;
        if (!strcmp(n, "qk_norm_rope/null_k_weight")) pk = NULL;
        if (!strcmp(n, "qk_norm_rope/q_weight_len")) qw.shape[0] = 3;
        if (!strcmp(n, "qk_norm_rope/k_weight_i32")) kw.dtype = FI_DTYPE_I32;
        if (!strcmp(n, "qk_norm_rope/k_weight_2d"))
            kw.ndim = 2, kw.shape[0] = 1, kw.shape[1] = 4, kw.stride[0] = 4, kw.stride[1] = 1;
        if (!strcmp(n, "qk_norm_rope/eps_negative")) eps = -2.0f;
        if (!strcmp(n, "qk_norm_rope/eps_inf")) eps = INFINITY;
        if (!strcmp(n, "qk_norm_rope/rotary_past_dim")) cache.shape[1] = 6;
        if (!strcmp(n, "qk_norm_rope/q_out_over_k_weight")) kw.data = q3.data;
        if (!strcmp(n, "qk_norm_rope/k_out_one_head_into_q"))
            ko3 = q3, ko3.shape[1] = 1, ko3.data = (float *)q3.data + 4;
        if (!strcmp(n, "qk_norm_rope/q_out_dtype")) qo3.dtype = FI_DTYPE_F16;
        if (!strcmp(n, "qk_norm_rope/position_past_cache"))
            cache.shape[0] = 4, at = 2, tu_view_set(&e->idx.t, 2, 9);
        if (!strcmp(n, "gemma_qk_norm_rope/position_negative"))
            at = 2, tu_view_set(&e->idx.t, 2, -3);
        fi_status st = !strncmp(n, "gemma_", 6)
                           ? fi_gemma_qk_rmsnorm_rope(ctx, &pos, &q3, &k3, pq, pk, eps, &cache, 0,
                                                      &qo3, &ko3, NULL)
                           : fi_qk_rmsnorm_rope(ctx, &pos, &q3, &k3, pq, pk, eps, &cache, 1,
                                                &qo3, &ko3, NULL);
        if (at >= 0) tu_view_set(&e->idx.t, at, 3 - at);
        return st;
    }
    if (!strncmp(n, "ragged/", 7)) {
        int which = !strcmp(n, "ragged/indptr_start")        ? 0
                    : !strcmp(n, "ragged/indptr_decreasing") ? 2
                                                             : 4;
        double old = which == 0 ? 0 : which == 2 ? 3 : 8;
        tu_view_set(&e->ptr.t, which, which == 0 ? 1 : which == 2 ? 2 : 40);
        fi_tensor flat = x;
        flat.ndim = 1, flat.shape[0] = 32, flat.stride[0] = 1;
        fi_status st = fi_top_k_ragged(ctx, &flat, &pt, 3, &vl, &ki, NULL);
        tu_view_set(&e->ptr.t, which, old);
        return st;
    }
    return FI_STATUS_INTERNAL;
}

/* The cases a backend without host memory cannot refuse: values in tensors
 * (the CUDA kernels handle them, docs/SEMANTICS.md "Serving ops"). */
static bool device_value_case(const char *name) {
    static const char *const names[] = {
        "sample/index_past_rows",   "sample/index_negative",     "top_p/row_negative",
        "softmax/temperature_row_negative", "spec/draft_id_past_vocab", "top_k/length_past_cols",
        "ragged/indptr_start",      "ragged/indptr_decreasing",  "ragged/indptr_past_input",
        "rope_cache/position_past_cache", "qk_norm_rope/position_past_cache",
        "gemma_qk_norm_rope/position_negative"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(name, names[i])) return true;
    return false;
}

/* Every bad case on `ctx` (backend `bname`); device: a CUDA context, where
 * the device-value cases are not run (they would launch on these host
 * buffers) and the others must be refused with the CPU's status and
 * message before anything is read. */
static void bad_input_on(const char *bname, fi_context *ctx, bool device) {
    char name[160];
    tu_rng rng;
    tu_rng_seed(&rng, tu_hash("serving bad_input"));
    bad_env e;
    memset(&e, 0, sizeof e);
    e.ctx = ctx;
    if (bad_env_alloc(&e, &rng)) {
        tu_record("bad_input", "bad_input/alloc", TU_FAIL);
        return;
    }
    for (int i = 0; i < NUM_BAD; i++) {
        snprintf(name, sizeof name, "bad_input/%s/%s", bname, bad_cases[i].name);
        if ((device && device_value_case(bad_cases[i].name)) || !tu_begin_case(name)) continue;
        void *snaps[32];
        int nbuf = 0;
        for (tu_buf *b; (b = bad_env_buf(&e, nbuf)); nbuf++) snaps[nbuf] = ops_snapshot(b);
        fi_status st = bad_call(i, &e);
        int ok =
            !tu_expect_status(st, bad_cases[i].status, bad_cases[i].message, bad_cases[i].name);
        for (int j = 0; j < nbuf; j++) {
            tu_buf *b = bad_env_buf(&e, j);
            if (memcmp(b->base, snaps[j], b->bytes)) {
                tu_note("buffer %d was written by a refused call", j);
                memcpy(b->base, snaps[j], b->bytes);
                ok = 0;
            }
            free(snaps[j]);
        }
        tu_record("bad_input", name, ok ? TU_PASS : TU_FAIL);
    }
    for (tu_buf *b; (b = bad_env_buf(&e, 0)) && b->base;) {
        for (int j = 0; (b = bad_env_buf(&e, j)); j++) tu_buf_free(b);
        break;
    }
}

static void suite_bad_input(const tu_cpu_backend *be) {
    bad_input_on(be->name, be->ctx, false);
    rq_bad_input(be->ctx, be->name, false);
}

/* ================================================================= cuda */

/* The serving ops on a CUDA context (where one can be made: a GPU, or the
 * stand-in driver of tests/gpu/stub on LD_LIBRARY_PATH): the backend has
 * every family, and each bad argument the core checks is refused with the
 * CPU's status and message before anything is read (the tensors here are
 * host memory; the kernels themselves run in tests/gpu/test_cuda_serving.c
 * against this backend's results). */
static void suite_cuda(void) {
    fi_context_options o;
    fi_context_options_init(&o);
    o.device = FI_DEVICE_CUDA;
    fi_context *ctx = NULL;
    if (!tu_backend_selected("cuda") || fi_context_create(&o, &ctx) != FI_OK) {
        if (tu_begin_case("bad_input/cuda")) {
            tu_note("backend cuda: no CUDA context here");
            tu_record("cuda", "bad_input/cuda", TU_SKIP);
        }
        return;
    }
    bad_input_on("cuda", ctx, true);
    rq_bad_input(ctx, "cuda", true);
    fi_context_destroy(ctx);
}

/* ================================================================= main */

static void suite_once(const tu_cpu_backend *be) {
    char name[160];
    snprintf(name, sizeof name, "repro/threads_1_2_3/every_level");
    run_case("repro", name, case_repro, NULL, be->ctx);
    run_case("rng", "rng/philox4x32_10_known_answers", case_rng, NULL, be->ctx);
    run_case("repro", "repro/threads_past_rows", case_threads_past_rows, NULL, be->ctx);
}

int main(int argc, char **argv) {
    int rc = tu_parse_args(argc, argv,
                           "Serving ops (norms, activations, softmax, sampling, top-k) on every "
                           "CPU SIMD level\nagainst the fp64 references of "
                           "tests/oracle_serving.c.");
    if (rc) return rc;
    int first = 1;
    for (int i = 0; i < TU_NUM_CPU_BACKENDS; i++) {
        tu_cpu_backend be;
        if (tu_cpu_backend_open(&be, i, 2)) {
            char name[64];
            snprintf(name, sizeof name, "%s (not available)", be.name);
            tu_note("backend %s: not on this CPU or build", be.name);
            tu_record("skipped backends", name, TU_SKIP);
            continue;
        }
        if (first) suite_once(&be);
        first = 0;
        suite_norm(&be);
        suite_act(&be);
        suite_softmax(&be);
        suite_sample(&be);
        suite_stats(&be);
        suite_filter(&be);
        suite_spec(&be);
        suite_topk(&be);
        suite_rope_cache(&be);
        suite_qk_norm_rope(&be);
        suite_rope_quant(&be);
        char name[96];
        snprintf(name, sizeof name, "large/%s/v262144_h16384", be.name);
        if (!tu_opt.quick || i == 0) run_case("large", name, case_large, NULL, be.ctx);
        suite_bad_input(&be);
        fi_context_destroy(be.ctx);
    }
    suite_cuda();
    return tu_summary("test_serving_ops");
}
