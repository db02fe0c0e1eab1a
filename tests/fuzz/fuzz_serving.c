/*
 * fuzz_serving.c — the serving ops from arbitrary bytes: the norms (RMSNorm,
 * Gemma, fused residual add, LayerNorm, FP8 out), the gated activations,
 * softmax, every sampler, the renorm / mask filters, chain speculative
 * sampling, top-k (dense and ragged), RoPE from a cos/sin cache (with the
 * per-head QK RMSNorm before it, fi_qk_rmsnorm_rope) and RoPE +
 * FP8 quantize (+ paged append: tests/rope_quant_cases.c). Rows of
 * 1-3 leading dimensions, padded strides, mixed dtypes, outputs in place,
 * overlapping an input or apart, parameters some out of range (eps, scale,
 * temperature, k, p, row indices, lengths, positions, draft ids). Every
 * call returns a status the header names; a call that succeeds is checked
 * against tests/oracle_serving.c (sampled tokens: inside the filtered set,
 * the same on a second call), and an overlapping output must be refused.
 */
#include "fuzz.h"
#include "../oracle_serving.h"
#include "../ops_cases.h"
#include "../rope_quant_cases.h"

static const fi_dtype float_dt[3] = {FI_DTYPE_F32, FI_DTYPE_F16, FI_DTYPE_BF16};

static double out_tol(fi_dtype d) {
    return d == FI_DTYPE_F16 ? 4e-3 : d == FI_DTYPE_BF16 ? 3e-2 : 1e-4;
}

/* A rows tensor [lead..., H] (1-3 leading dims, some 0) with values in
 * [-a, a]; `pad` elements after each row (a strided view). */
static int rows_tensor(tu_rng *rng, tu_buf *b, fi_dtype dt, int32_t nlead, const int64_t *lead,
                       int64_t h, int64_t pad, double a) {
    int64_t shape[4], pads[4] = {0, 0, 0, 0};
    for (int32_t i = 0; i < nlead; i++) shape[i] = lead[i];
    shape[nlead] = h, pads[nlead] = pad;
    memset(b, 0, sizeof *b);
    if (tu_buf_alloc_padded(b, dt, nlead + 1, shape, pads)) return -1;
    tu_fill_uniform(rng, &b->t, -a, a, 0.0);
    return 0;
}

/* The leading dims of a rows tensor and their product. */
static int64_t pick_lead(fz *f, int32_t *nlead, int64_t *lead) {
    *nlead = (int32_t)fz_range(f, 1, 3);
    int64_t rows = 1;
    for (int32_t i = 0; i < *nlead; i++) {
        lead[i] = fz_range(f, *nlead == 1 ? 0 : 1, *nlead == 1 ? 9 : 3);
        rows *= lead[i];
    }
    return rows;
}

/* out laid one row into `in` (the same bytes shifted): must be refused. */
static fi_tensor shifted(const tu_buf *in, fi_dtype dt) {
    fi_tensor t = in->t;
    t.dtype = dt;
    t.data = (char *)in->t.data + tu_dtype_size(in->t.dtype) * (size_t)in->t.stride[in->t.ndim - 2];
    return t;
}

static float pick_eps(fz *f) {
    static const float e[] = {1e-6f, 1e-5f, 0.1f, 1e-6f, 0.0f, -1e-3f, NAN, INFINITY};
    return e[fz_pick(f, 8)];
}

/* ------------------------------------------------------------------ norms */

static void fuzz_norm(fz *f, fi_context *ctx, tu_rng *rng) {
    enum { RMS, GEMMA, FUSED, GEMMA_FUSED, LAYER, QUANT, FUSED_QUANT };
    const int form = fz_pick(f, 7);
    int32_t nl;
    int64_t lead[3];
    const int64_t rows = pick_lead(f, &nl, lead), h = fz_range(f, 1, 300);
    const int64_t pad = fz_one_in(f, 3) ? fz_range(f, 1, 5) : 0;
    const bool fused = form == FUSED || form == GEMMA_FUSED || form == FUSED_QUANT;
    const bool quant = form == QUANT || form == FUSED_QUANT;
    const fi_dtype xt = float_dt[fz_pick(f, 3)], rt = float_dt[fz_pick(f, 3)];
    const fi_dtype ot = quant ? (fz_one_in(f, 2) ? FI_DTYPE_E4M3 : FI_DTYPE_E5M2) : float_dt[fz_pick(f, 3)];
    const float eps = pick_eps(f), scale = fz_one_in(f, 8) ? -1.0f : (float)fz_range(f, 1, 40) / 8.0f;
    const int alias = fz_pick(f, 6); /* 0: out is input (in place), 1: out overlaps input */
    int64_t hw = fz_one_in(f, 16) ? h + 1 : h; /* a weight of the wrong length */
    tu_buf x, r, w, g, o;
    memset(&r, 0, sizeof r), memset(&o, 0, sizeof o);
    if (rows_tensor(rng, &x, xt, nl, lead, h, pad, 2.0) ||
        (fused && rows_tensor(rng, &r, rt, nl, lead, h, 0, 2.0)) ||
        fz_tensor(&w, float_dt[fz_pick(f, 3)], 1, &hw, rng, 1.5) ||
        fz_tensor(&g, float_dt[fz_pick(f, 3)], 1, &h, rng, 1.0) ||
        rows_tensor(rng, &o, ot, nl, lead, h, 0, 1.0)) {
        tu_buf_free(&x), tu_buf_free(&r), tu_buf_free(&w), tu_buf_free(&g), tu_buf_free(&o);
        return;
    }
    double *xv = tu_view_read(&x.t), *rv = fused ? tu_view_read(&r.t) : NULL;
    double *wv = tu_view_read(&w.t), *gv = tu_view_read(&g.t);
    const bool in_place = alias == 0 && !quant && (form != FUSED && form != GEMMA_FUSED) && ot == xt;
    const bool overlap = alias == 1 && rows > 1 && !(fused && !quant);
    fi_tensor out = in_place ? x.t : overlap ? shifted(&x, ot) : o.t;
    fi_status st;
    const char *name;
    switch (form) {
    case RMS: name = "fi_rmsnorm", st = fi_rmsnorm(ctx, &x.t, &w.t, eps, &out, NULL); break;
    case GEMMA: name = "fi_gemma_rmsnorm", st = fi_gemma_rmsnorm(ctx, &x.t, &w.t, eps, &out, NULL); break;
    case FUSED: name = "fi_fused_add_rmsnorm", st = fi_fused_add_rmsnorm(ctx, &x.t, &r.t, &w.t, eps, NULL); break;
    case GEMMA_FUSED:
        name = "fi_gemma_fused_add_rmsnorm", st = fi_gemma_fused_add_rmsnorm(ctx, &x.t, &r.t, &w.t, eps, NULL);
        break;
    case LAYER: name = "fi_layernorm", st = fi_layernorm(ctx, &x.t, &w.t, &g.t, eps, &out, NULL); break;
    case QUANT: name = "fi_rmsnorm_quant", st = fi_rmsnorm_quant(ctx, &x.t, &w.t, scale, eps, &out, NULL); break;
    default:
        name = "fi_fused_add_rmsnorm_quant";
        st = fi_fused_add_rmsnorm_quant(ctx, &x.t, &r.t, &w.t, scale, eps, &out, NULL);
        break;
    }
    fz_check_status(st, name);
    const bool refused = eps < 0.0f || isnan(eps) || hw != h || (quant && !(scale > 0.0f));
    if (st == FI_OK && refused) FZ_FAIL("%s accepted eps %g, scale %g, weight of %lld for %lld", name,
                                       (double)eps, (double)scale, (long long)hw, (long long)h);
    if (st == FI_OK && overlap) FZ_FAIL("%s wrote over its input one row on", name);
    if (st == FI_OK && rows > 0 && eps > 0.0f && isfinite(eps)) {
        const int64_t n = rows * h;
        double *sum = malloc(sizeof(double) * (size_t)n), *ref = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) sum[i] = fused ? xv[i] + rv[i] : xv[i];
        if (form == LAYER) oracle_layernorm(rows, h, sum, wv, gv, eps, ref);
        else oracle_rmsnorm(rows, h, sum, wv, eps, form == GEMMA || form == GEMMA_FUSED, ref);
        if (fused) { /* the residual holds the sum, rounded to its dtype */
            double *got = tu_view_read(&r.t), *rs = malloc(sizeof(double) * (size_t)n);
            for (int64_t i = 0; i < n; i++) rs[i] = tu_round(rt, sum[i]);
            fz_compare("residual", got, rs, n, out_tol(rt));
            free(got), free(rs);
        }
        double tol = out_tol(fused && !quant ? xt : ot); /* the fused forms write input */
        if (quant) { /* FP8: the scaled, saturated value within one code */
            const double max = ot == FI_DTYPE_E4M3 ? 448.0 : 57344.0;
            for (int64_t i = 0; i < n; i++) ref[i] = fmax(-max, fmin(max, ref[i] / scale));
            tol = ot == FI_DTYPE_E4M3 ? 0.07 : 0.13;
        }
        double *got = tu_view_read(fused && !quant ? &x.t : &out);
        fz_compare(name, got, ref, n, tol);
        free(got), free(sum), free(ref);
    }
    free(xv), free(rv), free(wv), free(gv);
    tu_buf_free(&x), tu_buf_free(&r), tu_buf_free(&w), tu_buf_free(&g), tu_buf_free(&o);
}

/* ------------------------------------------------------------ activations */

static void fuzz_act(fz *f, fi_context *ctx, tu_rng *rng) {
    const int kind = fz_pick(f, 3); /* silu, gelu, gelu_tanh */
    int32_t nl;
    int64_t lead[3];
    const int64_t rows = pick_lead(f, &nl, lead), d = fz_range(f, 1, 200);
    const int64_t in_w = fz_one_in(f, 16) ? 2 * d + 1 : 2 * d; /* odd: refused */
    const fi_dtype it = float_dt[fz_pick(f, 3)], ot = float_dt[fz_pick(f, 3)];
    tu_buf x, o;
    if (rows_tensor(rng, &x, it, nl, lead, in_w, fz_one_in(f, 3) ? 3 : 0, 6.0) ||
        rows_tensor(rng, &o, ot, nl, lead, d, 0, 1.0)) {
        tu_buf_free(&x), tu_buf_free(&o);
        return;
    }
    const bool overlap = fz_one_in(f, 5) && rows > 0;
    fi_tensor out = o.t;
    if (overlap) out.data = x.t.data; /* over the input's first rows */
    fi_status st = kind == 0 ? fi_silu_and_mul(ctx, &x.t, &out, NULL)
                 : kind == 1 ? fi_gelu_and_mul(ctx, &x.t, &out, NULL)
                             : fi_gelu_tanh_and_mul(ctx, &x.t, &out, NULL);
    fz_check_status(st, "gated activation");
    if (st == FI_OK && in_w != 2 * d) FZ_FAIL("a gated activation accepted an odd last dim");
    if (st == FI_OK && overlap) FZ_FAIL("a gated activation wrote over its input");
    if (st == FI_OK && rows > 0) {
        double *xv = tu_view_read(&x.t), *ref = malloc(sizeof(double) * (size_t)(rows * d));
        oracle_gated_act(kind, rows, d, xv, ref);
        double *got = tu_view_read(&out);
        fz_compare("gated activation", got, ref, rows * d, out_tol(ot));
        free(xv), free(ref), free(got);
    }
    tu_buf_free(&x), tu_buf_free(&o);
}

/* ------------------------------------------------ softmax and the samplers */

/* A [B] f32 parameter tensor with values in [lo, hi] (sometimes one out of
 * range), or none (NULL). */
static int param_f32(fz *f, tu_rng *rng, tu_buf *b, int64_t n, double lo, double hi, bool *bad) {
    memset(b, 0, sizeof *b);
    if (!fz_one_in(f, 2)) return 0;
    if (tu_buf_alloc(b, FI_DTYPE_F32, 1, &n)) return -1;
    tu_fill_uniform(rng, &b->t, lo, hi, 0.0);
    if (n > 0 && fz_one_in(f, 6)) {
        tu_view_set(&b->t, fz_range(f, 0, n - 1), fz_one_in(f, 2) ? lo - 1.0 : NAN);
        *bad = true;
    }
    return 0;
}

static void fuzz_softmax(fz *f, fi_context *ctx, tu_rng *rng) {
    const int64_t B = fz_range(f, 0, 5), V = fz_range(f, 1, 3000), shape[2] = {B, V};
    const fi_dtype it = float_dt[fz_pick(f, 3)], ot = float_dt[fz_pick(f, 3)];
    bool bad = false;
    tu_buf x, o, t;
    memset(&t, 0, sizeof t);
    if (fz_tensor(&x, it, 2, shape, rng, 12.0) || fz_tensor(&o, ot, 2, shape, rng, 1.0) ||
        param_f32(f, rng, &t, B, 0.05, 3.0, &bad)) {
        tu_buf_free(&x), tu_buf_free(&o), tu_buf_free(&t);
        return;
    }
    float tv = fz_one_in(f, 10) ? (fz_one_in(f, 2) ? 0.0f : NAN) : (float)fz_range(f, 1, 40) / 10.0f;
    if (!t.base && !(tv > 0.0f)) bad = true;
    fi_status st = fi_softmax(ctx, &x.t, t.base ? &t.t : NULL, tv, &o.t, NULL);
    fz_check_status(st, "fi_softmax");
    if (st == FI_OK && B > 0 && !bad) {
        double *xv = tu_view_read(&x.t), *tt = malloc(sizeof(double) * (size_t)B);
        double *tr = t.base ? tu_view_read(&t.t) : NULL, *ref = malloc(sizeof(double) * (size_t)(B * V));
        for (int64_t b = 0; b < B; b++) tt[b] = tr ? tr[b] : tv;
        oracle_softmax(B, V, xv, tt, ref);
        double *got = tu_view_read(&o.t);
        fz_compare("fi_softmax", got, ref, B * V, out_tol(ot) + 1e-6);
        free(xv), free(tt), free(tr), free(ref), free(got);
    }
    tu_buf_free(&x), tu_buf_free(&o), tu_buf_free(&t);
}

enum { S_PLAIN, S_LOGITS, S_TOP_K, S_TOP_P, S_MIN_P, S_K_P, S_K_P_LOGITS, S_COUNT };

static fi_status sample(fi_context *ctx, int op, const fi_tensor *x, const fi_tensor *idx,
                        const fi_tensor *tk, int32_t k, const fi_tensor *tp, float p,
                        const fi_tensor *tm, float m, fi_filter_order order, uint64_t seed,
                        uint64_t offset, fi_tensor *samples, fi_tensor *valid) {
    switch (op) {
    case S_PLAIN: return fi_sampling_from_probs(ctx, x, idx, seed, offset, samples, valid, NULL);
    case S_LOGITS: return fi_sampling_from_logits(ctx, x, idx, seed, offset, samples, valid, NULL);
    case S_TOP_K: return fi_top_k_sampling_from_probs(ctx, x, idx, tk, k, seed, offset, samples, valid, NULL);
    case S_TOP_P: return fi_top_p_sampling_from_probs(ctx, x, idx, tp, p, seed, offset, samples, valid, NULL);
    case S_MIN_P: return fi_min_p_sampling_from_probs(ctx, x, idx, tm, m, seed, offset, samples, valid, NULL);
    case S_K_P:
        return fi_top_k_top_p_sampling_from_probs(ctx, x, idx, tk, k, tp, p, order, seed, offset,
                                                  samples, valid, NULL);
    default:
        return fi_top_k_top_p_sampling_from_logits(ctx, x, idx, tk, k, tp, p, order, seed, offset,
                                                   samples, valid, NULL);
    }
}

static void fuzz_sample(fz *f, fi_context *ctx, tu_rng *rng) {
    const int op = fz_pick(f, S_COUNT);
    const bool logits = op == S_LOGITS || op == S_K_P_LOGITS;
    const int64_t R = fz_range(f, 1, 5), V = fz_range(f, 1, 2500), shape[2] = {R, V};
    const bool use_idx = fz_one_in(f, 3);
    const int64_t B = use_idx ? fz_range(f, 0, 6) : R;
    bool bad = false, bad_idx = false;
    tu_buf x, idx, tk, tp, tm, smp, val;
    memset(&idx, 0, sizeof idx), memset(&tk, 0, sizeof tk);
    int fail = fz_tensor(&x, logits ? float_dt[fz_pick(f, 3)] : FI_DTYPE_F32, 2, shape, rng, logits ? 8.0 : 1.0);
    if (!fail && !logits) /* weights >= 0, some zero */
        for (int64_t i = 0; i < R * V; i++) {
            double v = fabs(tu_load(x.t.data, FI_DTYPE_F32, i));
            tu_store(x.t.data, FI_DTYPE_F32, i, fz_one_in(f, 8) ? 0.0 : v);
        }
    if (!fail && use_idx) {
        fail = tu_buf_alloc(&idx, FI_DTYPE_I32, 1, &B);
        for (int64_t b = 0; !fail && b < B; b++) ((int32_t *)idx.t.data)[b] = tu_rng_int(rng, 0, (int32_t)R - 1);
        if (!fail && B > 0 && fz_one_in(f, 6))
            ((int32_t *)idx.t.data)[fz_range(f, 0, B - 1)] = (int32_t)R, bad = bad_idx = true;
    }
    if (!fail && fz_one_in(f, 2)) { /* per-row top_k */
        fail = tu_buf_alloc(&tk, FI_DTYPE_I32, 1, &B);
        for (int64_t b = 0; !fail && b < B; b++) ((int32_t *)tk.t.data)[b] = tu_rng_int(rng, -1, (int32_t)V + 2);
    }
    fail = fail || param_f32(f, rng, &tp, B, 0.0, 1.0, &bad) || param_f32(f, rng, &tm, B, 0.0, 1.0, &bad) ||
           tu_buf_alloc(&smp, FI_DTYPE_I32, 1, &B) || tu_buf_alloc(&val, FI_DTYPE_U8, 1, &B);
    if (fail) goto done;
    const int32_t k = (int32_t)fz_range(f, -1, V + 2);
    const float p = fz_one_in(f, 12) ? 1.5f : (float)fz_range(f, 0, 100) / 100.0f;
    const float m = fz_one_in(f, 12) ? -0.5f : (float)fz_range(f, 0, 100) / 100.0f;
    const bool uses_p = op == S_TOP_P || op == S_K_P || op == S_K_P_LOGITS, uses_m = op == S_MIN_P;
    if ((uses_p && !tp.base && !(p >= 0.0f && p <= 1.0f)) || (uses_m && !tm.base && !(m >= 0.0f && m <= 1.0f)))
        bad = true; /* (the checks below are skipped: what a call refuses is bad_input's) */
    const fi_filter_order order = (fi_filter_order)fz_pick(f, 2);
    const uint64_t seed = fz_u32(f), offset = fz_u32(f);
    fi_tensor *ik = tk.base ? &tk.t : NULL, *ip = tp.base ? &tp.t : NULL, *im = tm.base ? &tm.t : NULL;
    fi_status st = sample(ctx, op, &x.t, use_idx ? &idx.t : NULL, ik, k, ip, p, im, m, order, seed,
                          offset, &smp.t, &val.t);
    fz_check_status(st, "sampling");
    if (st == FI_OK && bad_idx) FZ_FAIL("sampling accepted a row index past the input");
    if (st != FI_OK || B == 0) goto done;
    int32_t *s1 = malloc(sizeof(int32_t) * (size_t)B);
    memcpy(s1, smp.t.data, sizeof(int32_t) * (size_t)B);
    st = sample(ctx, op, &x.t, use_idx ? &idx.t : NULL, ik, k, ip, p, im, m, order, seed, offset,
                &smp.t, &val.t);
    fz_check_status(st, "sampling, again");
    if (st != FI_OK || memcmp(s1, smp.t.data, sizeof(int32_t) * (size_t)B))
        FZ_FAIL("the same sampling call gave other tokens (or failed) the second time");
    double *xv = tu_view_read(&x.t);
    bool *keep = malloc((size_t)V);
    for (int64_t b = 0; b < B; b++) {
        const int32_t row = use_idx ? ((int32_t *)idx.t.data)[b] : (int32_t)b, s = s1[b];
        const uint8_t ok = ((uint8_t *)val.t.data)[b];
        if (ok > 1 || (!ok && s != 0) || s < 0 || s >= V)
            FZ_FAIL("row %lld: token %d, valid %d (vocab %lld)", (long long)b, s, ok, (long long)V);
        if (logits || !ok || bad) continue; /* logits: the softmax's rounding may move a boundary */
        const double *pr = xv + (int64_t)row * V;
        const int32_t kb = tk.base ? ((int32_t *)tk.t.data)[b] : k;
        const double pb = tp.base ? tu_load(tp.t.data, FI_DTYPE_F32, b) : p;
        const double mb = tm.base ? tu_load(tm.t.data, FI_DTYPE_F32, b) : m;
        oracle_filter(V, pr, NULL, op == S_TOP_K || op == S_K_P ? kb : 0, uses_p ? pb : 1.0,
                      uses_m ? mb : -1.0, order == FI_FILTER_JOINT, keep);
        if (!keep[s] || !(pr[s] > 0.0))
            FZ_FAIL("row %lld drew token %d, outside its filtered set (p %g)", (long long)b, s, pr[s]);
    }
    free(xv), free(keep), free(s1);
done:
    tu_buf_free(&x), tu_buf_free(&idx), tu_buf_free(&tk), tu_buf_free(&tp), tu_buf_free(&tm);
    tu_buf_free(&smp), tu_buf_free(&val);
}

/* ------------------------------------------------------------- filters */

static void fuzz_filter(fz *f, fi_context *ctx, tu_rng *rng) {
    const int op = fz_pick(f, 3); /* top_k renorm, top_p renorm, top_k mask */
    const int64_t B = fz_range(f, 0, 5), V = fz_range(f, 1, 2000), shape[2] = {B, V};
    const fi_dtype dt = op == 2 ? float_dt[fz_pick(f, 3)] : FI_DTYPE_F32;
    bool bad = false;
    tu_buf x, o, tk, tp;
    memset(&tk, 0, sizeof tk);
    int fail = fz_tensor(&x, dt, 2, shape, rng, op == 2 ? 6.0 : 1.0) || fz_tensor(&o, dt, 2, shape, rng, 1.0);
    if (!fail && op < 2)
        for (int64_t i = 0; i < B * V; i++) tu_store(x.t.data, dt, i, fabs(tu_load(x.t.data, dt, i)));
    if (!fail && op != 1 && fz_one_in(f, 2)) {
        fail = tu_buf_alloc(&tk, FI_DTYPE_I32, 1, &B);
        for (int64_t b = 0; !fail && b < B; b++) ((int32_t *)tk.t.data)[b] = tu_rng_int(rng, -1, (int32_t)V + 1);
    }
    memset(&tp, 0, sizeof tp);
    fail = fail || (op == 1 && param_f32(f, rng, &tp, B, 0.0, 1.0, &bad));
    if (fail) goto done;
    const int32_t k = (int32_t)fz_range(f, -1, V + 1);
    const float p = fz_one_in(f, 10) ? -0.5f : (float)fz_range(f, 0, 100) / 100.0f;
    if (op == 1 && !tp.base && !(p >= 0.0f && p <= 1.0f)) bad = true;
    const int where = fz_pick(f, 3); /* out apart, in place, one row into the input */
    fi_tensor out = where == 1 ? x.t : where == 2 && B > 1 ? shifted(&x, dt) : o.t;
    double *xv = tu_view_read(&x.t);
    fi_status st = op == 0 ? fi_top_k_renorm_probs(ctx, &x.t, tk.base ? &tk.t : NULL, k, &out, NULL)
                 : op == 1 ? fi_top_p_renorm_probs(ctx, &x.t, tp.base ? &tp.t : NULL, p, &out, NULL)
                           : fi_top_k_mask_logits(ctx, &x.t, tk.base ? &tk.t : NULL, k, &out, NULL);
    fz_check_status(st, "filter");
    if (st == FI_OK && where == 2 && B > 1) FZ_FAIL("a filter wrote one row into its input");
    if (st == FI_OK && B > 0 && !bad && !(where == 2 && B > 1)) {
        double *got = tu_view_read(&out), *ref = malloc(sizeof(double) * (size_t)(B * V));
        bool *keep = malloc((size_t)V);
        for (int64_t b = 0; b < B; b++) {
            const double *r = xv + b * V;
            const int32_t kb = tk.base ? ((int32_t *)tk.t.data)[b] : k;
            const double pb = tp.base ? tu_load(tp.t.data, FI_DTYPE_F32, b) : p;
            oracle_filter(V, r, NULL, op == 1 ? 0 : kb, op == 1 ? pb : 1.0, -1.0, false, keep);
            double mass = 0.0;
            for (int64_t i = 0; i < V; i++) mass += keep[i] ? r[i] : 0.0;
            for (int64_t i = 0; i < V; i++)
                ref[b * V + i] = op == 2 ? (keep[i] ? r[i] : -INFINITY)
                                         : (keep[i] && mass > 0.0 ? r[i] / mass : 0.0);
        }
        fz_compare("filter", got, ref, B * V, op == 2 ? 0.0 : 1e-5);
        free(got), free(ref), free(keep);
    }
    free(xv);
done:
    tu_buf_free(&x), tu_buf_free(&o), tu_buf_free(&tk), tu_buf_free(&tp);
}

/* ------------------------------------------------- speculative and top-k */

static void fuzz_spec(fz *f, fi_context *ctx, tu_rng *rng) {
    const int64_t B = fz_range(f, 1, 3), n = fz_range(f, 0, 4), V = fz_range(f, 1, 40);
    const int64_t ds[3] = {B, n, V}, ts[3] = {B, n + 1, V}, is[2] = {B, n}, os[2] = {B, n + 1};
    tu_buf dp, tp, ids, out, acc, emi;
    int fail = fz_tensor(&dp, FI_DTYPE_F32, 3, ds, rng, 1.0) || fz_tensor(&tp, FI_DTYPE_F32, 3, ts, rng, 1.0) ||
               tu_buf_alloc(&ids, FI_DTYPE_I32, 2, is) || tu_buf_alloc(&out, FI_DTYPE_I32, 2, os) ||
               tu_buf_alloc(&acc, FI_DTYPE_I32, 1, &B) || tu_buf_alloc(&emi, FI_DTYPE_I32, 1, &B);
    bool bad = false;
    if (!fail) {
        for (int64_t i = 0; i < B * n * V; i++) tu_store(dp.t.data, FI_DTYPE_F32, i, fabs(tu_load(dp.t.data, FI_DTYPE_F32, i)));
        for (int64_t i = 0; i < B * (n + 1) * V; i++) tu_store(tp.t.data, FI_DTYPE_F32, i, fabs(tu_load(tp.t.data, FI_DTYPE_F32, i)));
        for (int64_t i = 0; i < B * n; i++) ((int32_t *)ids.t.data)[i] = tu_rng_int(rng, 0, (int32_t)V - 1);
        if (n > 0 && fz_one_in(f, 6)) ((int32_t *)ids.t.data)[fz_range(f, 0, B * n - 1)] = (int32_t)V, bad = true;
        memset(acc.t.data, 0, (size_t)B * 4), memset(emi.t.data, 0, (size_t)B * 4);
        const uint64_t seed = fz_u32(f), offset = fz_u32(f);
        fi_status st = fi_chain_speculative_sampling(ctx, &dp.t, &ids.t, &tp.t, seed, offset, &out.t,
                                                     &acc.t, &emi.t, NULL);
        fz_check_status(st, "fi_chain_speculative_sampling");
        if (st == FI_OK && bad) FZ_FAIL("fi_chain_speculative_sampling accepted a draft id past the vocabulary");
        if (st == FI_OK) {
            double *d = tu_view_read(&dp.t), *t = tu_view_read(&tp.t);
            int32_t *want = malloc(sizeof(int32_t) * (size_t)(n + 1));
            for (int64_t b = 0; b < B; b++) {
                int32_t a, e;
                double margin;
                oracle_chain_spec(n, V, d + b * n * V, (int32_t *)ids.t.data + b * n, t + b * (n + 1) * V,
                                  seed, offset, (uint32_t)b, want, &a, &e, &margin);
                if (margin < 1e-6) continue; /* a draw at a boundary: rounding decides */
                const int32_t *got = (int32_t *)out.t.data + b * (n + 1);
                if (memcmp(got, want, sizeof(int32_t) * (size_t)(n + 1)) || ((int32_t *)acc.t.data)[b] != a ||
                    ((int32_t *)emi.t.data)[b] != e)
                    FZ_FAIL("speculative request %lld: tokens, accepted %d (want %d), emitted %d (want %d)",
                            (long long)b, ((int32_t *)acc.t.data)[b], a, ((int32_t *)emi.t.data)[b], e);
            }
            free(d), free(t), free(want);
        }
    }
    tu_buf_free(&dp), tu_buf_free(&tp), tu_buf_free(&ids), tu_buf_free(&out), tu_buf_free(&acc), tu_buf_free(&emi);
}

static void fuzz_top_k(fz *f, fi_context *ctx, tu_rng *rng) {
    const bool ragged = fz_one_in(f, 3);
    const int64_t R = fz_range(f, 0, 5), N = fz_range(f, 1, 600);
    const int32_t k = fz_one_in(f, 12) ? 0 : (int32_t)fz_range(f, 1, N + 3);
    const fi_dtype dt = float_dt[fz_pick(f, 3)];
    bool bad = k < 1;
    tu_buf x, len, off, ptr, vals, idx;
    memset(&len, 0, sizeof len), memset(&off, 0, sizeof off), memset(&ptr, 0, sizeof ptr);
    const int64_t shape[2] = {R, N}, nnz = R * N, ks[2] = {R, k > 0 ? k : 1}, np1 = R + 1;
    int fail = fz_tensor(&x, dt, ragged ? 1 : 2, ragged ? &nnz : shape, rng, 4.0) ||
               fz_tensor(&vals, dt, 2, ks, rng, 1.0) || tu_buf_alloc(&idx, FI_DTYPE_I32, 2, ks);
    if (!fail && ragged) { /* row r: [indptr[r], indptr[r + 1]) of x */
        fail = tu_buf_alloc(&ptr, FI_DTYPE_I32, 1, &np1);
        int32_t *p = fail ? NULL : ptr.t.data;
        for (int64_t r = 0; p && r <= R; r++) p[r] = r == 0 ? 0 : tu_rng_int(rng, p[r - 1], (int32_t)nnz);
        if (p && R > 0) p[R] = (int32_t)nnz;
        if (p && R > 1 && fz_one_in(f, 6)) p[1] = p[2] + 1, bad = p[1] > p[2];
    } else if (!fail) {
        if (fz_one_in(f, 2)) {
            fail = tu_buf_alloc(&len, FI_DTYPE_I32, 1, &R);
            for (int64_t r = 0; !fail && r < R; r++) ((int32_t *)len.t.data)[r] = tu_rng_int(rng, 0, (int32_t)N);
            if (!fail && R > 0 && fz_one_in(f, 6)) ((int32_t *)len.t.data)[0] = (int32_t)N + 1, bad = true;
        }
        if (!fail && fz_one_in(f, 2)) {
            fail = tu_buf_alloc(&off, FI_DTYPE_I32, 1, &R);
            for (int64_t r = 0; !fail && r < R; r++) ((int32_t *)off.t.data)[r] = tu_rng_int(rng, 0, 1000);
        }
    }
    if (!fail) {
        fi_status st = ragged ? fi_top_k_ragged(ctx, &x.t, &ptr.t, k, &vals.t, &idx.t, NULL)
                              : fi_top_k(ctx, &x.t, k, len.base ? &len.t : NULL, off.base ? &off.t : NULL,
                                         &vals.t, &idx.t, NULL);
        fz_check_status(st, ragged ? "fi_top_k_ragged" : "fi_top_k");
        if (st == FI_OK && bad) FZ_FAIL("top-k accepted k %d, a length past N or a decreasing indptr", k);
        if (st == FI_OK && R > 0) {
            double *xv = tu_view_read(&x.t), *gv = tu_view_read(&vals.t);
            int32_t *want = malloc(sizeof(int32_t) * (size_t)k);
            for (int64_t r = 0; r < R; r++) {
                const int64_t base = ragged ? ((int32_t *)ptr.t.data)[r] : r * N;
                const int64_t n = ragged ? ((int32_t *)ptr.t.data)[r + 1] - base
                                         : len.base ? ((int32_t *)len.t.data)[r] : N;
                const int32_t shift = off.base ? ((int32_t *)off.t.data)[r] : 0;
                oracle_top_k(n, xv + base, k, want);
                for (int32_t j = 0; j < k; j++) {
                    const int32_t got = ((int32_t *)idx.t.data)[r * k + j];
                    const int32_t w = want[j] < 0 ? -1 : want[j] + shift;
                    const double v = gv[r * k + j], wv = want[j] < 0 ? -INFINITY : xv[base + want[j]];
                    if (got != w || !(v == wv || (isnan(v) && isnan(wv))))
                        FZ_FAIL("top-k row %lld slot %d: index %d value %g, want %d %g", (long long)r, j, got,
                                v, w, wv);
                }
            }
            free(xv), free(gv), free(want);
        }
    }
    tu_buf_free(&x), tu_buf_free(&len), tu_buf_free(&off), tu_buf_free(&ptr), tu_buf_free(&vals), tu_buf_free(&idx);
}

/* ------------------------------------------------------- RoPE from a cache */

/* RoPE from a cache, or (norm 1 / 2) fi_qk_rmsnorm_rope / its Gemma form:
 * each head row RMS-normalised by its weight before it turns. The norm's
 * choices come last, so older inputs keep their meaning (norm 0). */
static void fuzz_rope_cache(fz *f, fi_context *ctx, tu_rng *rng) {
    const int64_t nnz = fz_range(f, 0, 6), hq = fz_range(f, 1, 3), hk = fz_range(f, 1, 2);
    const int64_t d = 2 * fz_range(f, 1, 40), maxp = fz_range(f, 1, 50);
    int64_t rot = fz_one_in(f, 10) ? fz_range(f, 1, d + 3) : 2 * fz_range(f, 1, d / 2);
    const int neox = fz_pick(f, 2), inplace = fz_one_in(f, 3);
    const fi_dtype qt = float_dt[fz_pick(f, 3)], kt = float_dt[fz_pick(f, 3)];
    const int64_t qs[3] = {nnz, hq, d}, ks[3] = {nnz, hk, d}, cs[2] = {maxp, rot};
    bool bad = rot % 2 || rot > d;
    tu_buf q, k, qo, ko, c, pos, qw, kw;
    memset(&qw, 0, sizeof qw), memset(&kw, 0, sizeof kw);
    int fail = fz_tensor(&q, qt, 3, qs, rng, 2.0) || fz_tensor(&k, kt, 3, ks, rng, 2.0) ||
               fz_tensor(&qo, qt, 3, qs, rng, 1.0) || fz_tensor(&ko, kt, 3, ks, rng, 1.0) ||
               fz_tensor(&c, FI_DTYPE_F32, 2, cs, rng, 1.0) || tu_buf_alloc(&pos, FI_DTYPE_I32, 1, &nnz);
    if (!fail) {
        for (int64_t t = 0; t < nnz; t++) ((int32_t *)pos.t.data)[t] = tu_rng_int(rng, 0, (int32_t)maxp - 1);
        if (nnz > 0 && fz_one_in(f, 6)) ((int32_t *)pos.t.data)[fz_range(f, 0, nnz - 1)] = (int32_t)maxp, bad = true;
        const int norm = fz_pick(f, 3);
        const float eps = norm ? pick_eps(f) : 0.0f;
        const int64_t qwl = norm && fz_one_in(f, 12) ? d + 1 : d; /* a weight of the wrong length */
        const bool wover = norm && !inplace && nnz > 0 && fz_one_in(f, 8); /* q_out over k_weight */
        if (norm) {
            fail = fz_tensor(&qw, float_dt[fz_pick(f, 3)], 1, &qwl, rng, 1.5) ||
                   fz_tensor(&kw, float_dt[fz_pick(f, 3)], 1, &d, rng, 1.5);
            bad = bad || eps < 0.0f || !isfinite(eps) || qwl != d || wover;
        }
        fi_tensor kwt = kw.t;
        if (wover) kwt = qo.t, kwt.ndim = 1, kwt.shape[0] = d, kwt.stride[0] = qo.t.stride[2];
        double *qv = tu_view_read(&q.t), *kv = tu_view_read(&k.t), *cv = tu_view_read(&c.t);
        fi_tensor *qd = inplace ? &q.t : &qo.t, *kd = inplace ? &k.t : &ko.t;
        const char *name = norm == 2 ? "fi_gemma_qk_rmsnorm_rope"
                           : norm    ? "fi_qk_rmsnorm_rope"
                                     : "fi_rope_apply_cos_sin_cache";
        fi_status st = fail ? FI_STATUS_OUT_OF_MEMORY
                       : norm == 2 ? fi_gemma_qk_rmsnorm_rope(ctx, &pos.t, &q.t, &k.t, &qw.t, &kwt, eps, &c.t,
                                                              neox, qd, kd, NULL)
                       : norm ? fi_qk_rmsnorm_rope(ctx, &pos.t, &q.t, &k.t, &qw.t, &kwt, eps, &c.t, neox, qd,
                                                   kd, NULL)
                              : fi_rope_apply_cos_sin_cache(ctx, &pos.t, &q.t, &k.t, &c.t, neox, qd, kd, NULL);
        if (!fail) fz_check_status(st, name);
        if (st == FI_OK && bad) FZ_FAIL("%s accepted rotary dim %lld of %lld, a position past the cache, eps %g, "
                                        "a q_weight of %lld or q_out over k_weight", name, (long long)rot,
                                        (long long)d, (double)eps, (long long)qwl);
        for (int side = 0; st == FI_OK && side < 2; side++) { /* q, then k */
            const int64_t h = side ? hk : hq, n = nnz * h * d;
            double *x = side ? kv : qv;
            double *ref = malloc(sizeof(double) * (size_t)(n + 1));
            if (norm) { /* normalised in place, then turned */
                double *wv = tu_view_read(side ? &kw.t : &qw.t);
                oracle_rmsnorm(nnz * h, d, x, wv, eps, norm == 2, x);
                free(wv);
            }
            for (int64_t t = 0; t < nnz; t++) {
                const double *cr = cv + (int64_t)((int32_t *)pos.t.data)[t] * rot;
                for (int64_t hh = 0; hh < h; hh++) {
                    const double *v = x + (t * h + hh) * d;
                    double *y = ref + (t * h + hh) * d;
                    for (int64_t i = rot; i < d; i++) y[i] = v[i];
                    oracle_rope_cos_sin(rot, neox, v, cr, y);
                }
            }
            double *got = tu_view_read(side ? kd : qd);
            /* normalised values times weights reach ~4 */
            const double tol = out_tol(side ? kt : qt) * (norm ? 4 : 1);
            fz_compare(side ? "RoPE k" : "RoPE q", got, ref, n, tol);
            free(got), free(ref);
        }
        free(qv), free(kv), free(cv);
    }
    tu_buf_free(&q), tu_buf_free(&k), tu_buf_free(&qo), tu_buf_free(&ko), tu_buf_free(&c), tu_buf_free(&pos);
    tu_buf_free(&qw), tu_buf_free(&kw);
}

/* ------------------------------------------- RoPE + FP8 quantize (+ append) */

static void fuzz_rope_quant(fz *f, fi_context *ctx, tu_rng *rng) {
    static const int64_t rots[4] = {2, 8, 32, 64}, nopes[4] = {0, 1, 8, 24};
    rq_cfg c = {fz_range(f, 0, 7), fz_range(f, 1, 4), fz_range(f, 0, 3), rots[fz_pick(f, 4)],
                nopes[fz_pick(f, 4)], float_dt[fz_pick(f, 3)],
                fz_pick(f, 2) ? FI_DTYPE_E5M2 : FI_DTYPE_E4M3, fz_pick(f, 2), fz_pick(f, 2),
                fz_pick(f, 2), (int)fz_range(f, 1, 5), fz_pick(f, 2), fz_pick(f, 2),
                (float)fz_range(f, 1, 8) / 4.0f, (float)fz_range(f, 1, 8) / 4.0f};
    if (c.append && c.hk == 0 && c.nope == 0) c.nope = 8; /* MLA appends k_nope */
    rq_case k;
    tu_buf b[RQ_NBUF];
    void *before[RQ_NBUF] = {0};
    fi_tensor t[RQ_NBUF];
    if (rq_case_alloc(&k, &c, b, rng) == 0) {
        const bool bad = c.nnz > 0 && fz_one_in(f, 5); /* a negative pos_id: refused */
        if (bad) tu_view_set(&b[RQ_INDEX].t, fz_range(f, 0, c.nnz - 1), -1.0 - fz_range(f, 0, 99));
        for (int i = 0; i < RQ_NBUF; i++) before[i] = ops_snapshot(&b[i]), t[i] = b[i].t;
        fi_status st = rq_case_call(ctx, &k, t, NULL);
        fz_check_status(st, "fi_rope_quantize_fp8");
        if (st == FI_OK && bad) FZ_FAIL("fi_rope_quantize_fp8 accepted a negative pos_id");
        if (st == FI_OK && !rq_case_check(&k, b, before, NULL))
            FZ_FAIL("fi_rope_quantize_fp8 wrote what the oracle does not");
    }
    for (int i = 0; i < RQ_NBUF; i++) free(before[i]), tu_buf_free(&b[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz f = {data, size};
    fi_context *ctx = fz_context(&f);
    tu_rng rng;
    tu_rng_seed(&rng, fz_u32(&f));
    switch (fz_pick(&f, 9)) {
    case 0: fuzz_norm(&f, ctx, &rng); break;
    case 1: fuzz_act(&f, ctx, &rng); break;
    case 2: fuzz_softmax(&f, ctx, &rng); break;
    case 3: fuzz_sample(&f, ctx, &rng); break;
    case 4: fuzz_filter(&f, ctx, &rng); break;
    case 5: fuzz_spec(&f, ctx, &rng); break;
    case 6: fuzz_top_k(&f, ctx, &rng); break;
    case 7: fuzz_rope_cache(&f, ctx, &rng); break;
    default: fuzz_rope_quant(&f, ctx, &rng); break;
    }
    return 0;
}
