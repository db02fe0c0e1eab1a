/*
 * test_ops.c — the standalone ops against the fp64 references of
 * oracle_ops.c: fi_merge_state, fi_merge_state_in_place, fi_merge_states,
 * fi_append_paged_kv_cache, fi_rope_apply, fi_rope_apply_pos_ids.
 *
 * Every case gets fresh seeded inputs (the seed is a hash of the case name,
 * printed on failure; --seed overrides it), its outputs poisoned with NaN
 * (0xFF bytes) before the run, and runs on every CPU SIMD level. Besides
 * the values it checks that nothing outside an output view was written and
 * that inputs are unchanged. Categories of the summary:
 *   merge_state, merge_states   dtypes (mixed too), padded/permuted strides,
 *                               -inf states (their O poisoned: never read),
 *                               in place, masks, D past one chunk
 *   append                      every KV dtype, NHD/HND, one [pages,2,...]
 *                               tensor, page sizes, shuffled tokens
 *   rope                        pos_ids and indptr forms, rotary_dim < D,
 *                               interleave, LLaMA-3.1, in place, strides
 *   property                    merging states of disjoint key sets equals
 *                               attention over their union
 *   convert                     every f16/bf16 pattern read, f32 values
 *                               written to them (ties, overflow, subnormals)
 *   large                       sizes that split across the thread pool
 *   bad_input                   each invalid argument class: its status, its
 *                               message, and outputs left untouched
 */
#include "flashinfer.h"
#include "ops_cases.h"
#include "oracle_ops.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ backends */

typedef struct backend {
    const char *name; /* in case names */
    const char *simd;
    fi_context *ctx;
} backend;

static backend backends[] = {
    {"cpu-generic", "generic", NULL},
    {"cpu-avx2", "avx2", NULL},
    {"cpu-avx512", "avx512", NULL},
};
#define NUM_BACKENDS ((int)(sizeof backends / sizeof backends[0]))

static void backends_open(void) {
    for (int i = 0; i < NUM_BACKENDS; i++) {
        fi_context_options opt;
        fi_context_options_init(&opt);
        opt.device = FI_DEVICE_CPU;
        opt.num_threads = 2;
        opt.cpu_simd = backends[i].simd;
        if (fi_context_create(&opt, &backends[i].ctx) != FI_OK) {
            if (tu_opt.verbose)
                printf("skip %s: %s\n", backends[i].name, fi_last_error());
            backends[i].ctx = NULL;
        }
    }
}

static void backends_close(void) {
    for (int i = 0; i < NUM_BACKENDS; i++) fi_context_destroy(backends[i].ctx);
}

/* ================================================================= cases */

typedef int (*case_fn)(fi_context *ctx, tu_rng *rng, const void *cfg);

static void run_case(const char *category, const char *name, case_fn fn, const void *cfg,
                     fi_context *ctx) {
    if (!tu_begin_case(name)) return;
    uint64_t seed = tu_case_seed(name);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    int ok = fn(ctx, &rng, cfg);
    if (!ok) tu_note("seed %llu; rerun: --filter '%s'", (unsigned long long)seed, name);
    tu_record(category, name, ok ? TU_PASS : TU_FAIL);
}

/* ================================================================ merge */

typedef enum merge_mode {
    MERGE_OUT = 0,      /* fi_merge_state into fresh outputs */
    MERGE_OUT_IS_A,     /* fi_merge_state with v_out = v_a, s_out = s_a */
    MERGE_IN_PLACE,     /* fi_merge_state_in_place, no mask */
    MERGE_IN_PLACE_MASK /* fi_merge_state_in_place with a u8 mask */
} merge_mode;

typedef struct merge_cfg {
    int64_t n, heads, dim;
    fi_dtype da, db, dout;
    int strided;
    merge_mode mode;
    int nonfinite; /* rows of ops_put_nonfinite_states, compared by class */
} merge_cfg;

static int case_merge_state(fi_context *ctx, tu_rng *rng, const void *p) {
    const merge_cfg *c = p;
    const int64_t vs[3] = {c->n, c->heads, c->dim}, ss[2] = {c->n, c->heads};
    const int64_t ms[1] = {c->n};
    int in_place = c->mode != MERGE_OUT;
    tu_buf va, sa, vb, sb, vo, so, mask;
    memset(&mask, 0, sizeof mask);
    int ok = !ops_view_alloc(&va, c->da, 3, vs, c->strided, rng) &&
             !ops_view_alloc(&sa, FI_DTYPE_F32, 2, ss, c->strided, rng) &&
             !ops_view_alloc(&vb, c->db, 3, vs, c->strided, rng) &&
             !ops_view_alloc(&sb, FI_DTYPE_F32, 2, ss, c->strided, rng) &&
             !ops_view_alloc(&vo, c->dout, 3, vs, c->strided, rng) &&
             !ops_view_alloc(&so, FI_DTYPE_F32, 2, ss, c->strided, rng);
    if (ok && c->mode == MERGE_IN_PLACE_MASK)
        ok = !ops_view_alloc(&mask, FI_DTYPE_U8, 1, ms, c->strided, rng);
    if (!ok) {
        tu_note("allocation failed");
        return 0;
    }
    /* In place, a's O is the output: keep it finite where the mask leaves
     * it, so untouched rows compare exactly. */
    ops_fill_state(rng, &va.t, &sa.t, 0, c->mode != MERGE_IN_PLACE_MASK);
    ops_fill_state(rng, &vb.t, &sb.t, 1, 1);
    if (c->nonfinite) ops_put_nonfinite_states(&va.t, &sa.t, &vb.t, &sb.t, c->dout);
    uint8_t *keep = calloc((size_t)c->n + 1, 1);
    if (c->mode == MERGE_IN_PLACE_MASK)
        for (int64_t i = 0; i < c->n; i++) {
            keep[i] = (uint8_t)(tu_rng_int(rng, 0, 2) != 0);
            tu_view_set(&mask.t, i, keep[i] ? tu_rng_int(rng, 1, 255) : 0);
        }

    double *a = tu_view_read(&va.t), *la = tu_view_read(&sa.t);
    double *b = tu_view_read(&vb.t), *lb = tu_view_read(&sb.t);
    double *ref = malloc((size_t)(tu_numel(&va.t) + 1) * sizeof *ref);
    double *lref = malloc((size_t)(tu_numel(&sa.t) + 1) * sizeof *lref);
    oracle_merge_state(c->n, c->heads, c->dim, a, la, b, lb, ref, lref);
    if (c->mode == MERGE_IN_PLACE_MASK) /* rows with mask 0 keep a */
        for (int64_t i = 0; i < c->n; i++) {
            if (keep[i]) continue;
            int64_t rows = c->heads, len = c->heads * c->dim;
            memcpy(ref + i * len, a + i * len, (size_t)len * sizeof *ref);
            memcpy(lref + i * rows, la + i * rows, (size_t)rows * sizeof *lref);
        }

    void *snap_a = ops_snapshot(&va), *snap_sa = ops_snapshot(&sa);
    void *snap_b = ops_snapshot(&vb), *snap_sb = ops_snapshot(&sb);
    const tu_buf *out_v = in_place ? &va : &vo, *out_s = in_place ? &sa : &so;
    fi_status st;
    if (c->mode == MERGE_OUT)
        st = fi_merge_state(ctx, &va.t, &sa.t, &vb.t, &sb.t, &vo.t, &so.t, NULL);
    else if (c->mode == MERGE_OUT_IS_A)
        st = fi_merge_state(ctx, &va.t, &sa.t, &vb.t, &sb.t, &va.t, &sa.t, NULL);
    else
        st = fi_merge_state_in_place(ctx, &va.t, &sa.t, &vb.t, &sb.t,
                                     c->mode == MERGE_IN_PLACE_MASK ? &mask.t : NULL, NULL);
    ok = ops_check_ok(st, "merge");
    int (*check)(const char *, const fi_tensor *, const double *, double) =
        c->nonfinite ? ops_check_view_classes : ops_check_view;
    if (ok) {
        ok &= check("v_out", &out_v->t, ref, tu_dtype_tol(out_v->t.dtype));
        ok &= check("s_out", &out_s->t, lref, 1e-5);
        ok &= ops_check_outside("v_out", out_v) & ops_check_outside("s_out", out_s);
        ok &= ops_same_as_snapshot("v_b", &vb, snap_b) & ops_same_as_snapshot("s_b", &sb, snap_sb);
        if (!in_place)
            ok &= ops_same_as_snapshot("v_a", &va, snap_a) &
                  ops_same_as_snapshot("s_a", &sa, snap_sa);
        if (c->mode == MERGE_IN_PLACE_MASK) { /* untouched rows: bit for bit */
            double *got = tu_view_read(&va.t);
            for (int64_t i = 0; i < c->n * c->heads * c->dim && ok; i++)
                if (!keep[i / (c->heads * c->dim)] && got[i] != a[i] &&
                    !(isnan(got[i]) && isnan(a[i]))) {
                    tu_note("masked-off element %lld changed", (long long)i);
                    ok = 0;
                }
            free(got);
        }
    }
    free(a), free(la), free(b), free(lb), free(ref), free(lref), free(keep);
    free(snap_a), free(snap_sa), free(snap_b), free(snap_sb);
    tu_buf_free(&va), tu_buf_free(&sa), tu_buf_free(&vb), tu_buf_free(&sb);
    tu_buf_free(&vo), tu_buf_free(&so), tu_buf_free(&mask);
    return ok;
}

typedef struct merge_n_cfg {
    int64_t n, states, heads, dim;
    fi_dtype dv, dout;
    int strided;
    int nonfinite; /* states 0 and 1 get ops_put_nonfinite_states' rows */
} merge_n_cfg;


static int case_merge_states(fi_context *ctx, tu_rng *rng, const void *p) {
    const merge_n_cfg *c = p;
    const int64_t vs[4] = {c->n, c->states, c->heads, c->dim};
    const int64_t ss[3] = {c->n, c->states, c->heads};
    const int64_t os[3] = {c->n, c->heads, c->dim}, ls[2] = {c->n, c->heads};
    tu_buf v, s, vo, so;
    if (ops_view_alloc(&v, c->dv, 4, vs, c->strided, rng) ||
        ops_view_alloc(&s, FI_DTYPE_F32, 3, ss, c->strided, rng) ||
        ops_view_alloc(&vo, c->dout, 3, os, c->strided, rng) ||
        ops_view_alloc(&so, FI_DTYPE_F32, 2, ls, c->strided, rng)) {
        tu_note("allocation failed");
        return 0;
    }
    ops_fill_states(rng, &v.t, &s.t);
    if (c->nonfinite) {
        fi_tensor va = ops_state_view(&v.t, 0), sa = ops_state_view(&s.t, 0);
        fi_tensor vb = ops_state_view(&v.t, 1), sb = ops_state_view(&s.t, 1);
        ops_put_nonfinite_states(&va, &sa, &vb, &sb, c->dout);
    }
    double *x = tu_view_read(&v.t), *l = tu_view_read(&s.t);
    double *ref = malloc((size_t)(c->n * c->heads * c->dim + 1) * sizeof *ref);
    double *lref = malloc((size_t)(c->n * c->heads + 1) * sizeof *lref);
    oracle_merge_states(c->n, c->states, c->heads, c->dim, x, l, ref, lref);
    void *snap_v = ops_snapshot(&v), *snap_s = ops_snapshot(&s);
    int ok = ops_check_ok(fi_merge_states(ctx, &v.t, &s.t, &vo.t, &so.t, NULL), "fi_merge_states");
    int (*check)(const char *, const fi_tensor *, const double *, double) =
        c->nonfinite ? ops_check_view_classes : ops_check_view;
    if (ok) {
        ok &= check("v_out", &vo.t, ref, tu_dtype_tol(c->dout));
        ok &= check("s_out", &so.t, lref, 1e-5);
        ok &= ops_check_outside("v_out", &vo) & ops_check_outside("s_out", &so);
        ok &= ops_same_as_snapshot("v", &v, snap_v) & ops_same_as_snapshot("s", &s, snap_s);
    }
    free(x), free(l), free(ref), free(lref), free(snap_v), free(snap_s);
    tu_buf_free(&v), tu_buf_free(&s), tu_buf_free(&vo), tu_buf_free(&so);
    return ok;
}

static void suite_merge(const backend *be) {
    static const int64_t shapes[][3] = {{1, 1, 1}, {7, 3, 128}, {5, 2, 72}, {3, 2, 300}, {9, 4, 64}};
    static const char *const mode_names[] = {"out", "out=a", "in_place", "in_place_mask"};
    char name[160];
    for (int si = 0; si < 5; si++)
        for (int di = 0; di < 3; di++)
            for (int strided = 0; strided < 2; strided++)
                for (int mode = 0; mode < 4; mode++) {
                    if (tu_opt.quick && (si == 0 || si == 4) && mode != 0) continue;
                    merge_cfg c = {shapes[si][0], shapes[si][1], shapes[si][2],
                                   ops_float_dtypes[di], ops_float_dtypes[di], ops_float_dtypes[di],
                                   strided, (merge_mode)mode, 0};
                    snprintf(name, sizeof name, "merge_state/%s/%s/n%lld_h%lld_d%lld/%s/%s",
                             be->name, tu_dtype_name(c.da), (long long)c.n,
                             (long long)c.heads, (long long)c.dim,
                             strided ? "strided" : "contiguous", mode_names[mode]);
                    run_case("merge_state", name, case_merge_state, &c, be->ctx);
                }
    /* mixed dtypes: f32 partial states into a bf16/f16 output and back */
    static const fi_dtype mixed[][3] = {{FI_DTYPE_F32, FI_DTYPE_BF16, FI_DTYPE_F16},
                                        {FI_DTYPE_F16, FI_DTYPE_F32, FI_DTYPE_BF16},
                                        {FI_DTYPE_BF16, FI_DTYPE_F16, FI_DTYPE_F32}};
    for (int mi = 0; mi < 3; mi++)
        for (int mode = 0; mode < 4; mode += 2) {
            merge_cfg c = {6, 3, 96, mixed[mi][0], mixed[mi][1], mixed[mi][2], 1,
                           (merge_mode)mode, 0};
            snprintf(name, sizeof name, "merge_state/%s/mixed_%s_%s_%s/%s", be->name,
                     tu_dtype_name(c.da), tu_dtype_name(c.db), tu_dtype_name(c.dout),
                     mode_names[mode]);
            run_case("merge_state", name, case_merge_state, &c, be->ctx);
        }

    static const int64_t nshapes[][4] = {{1, 1, 1, 1}, {5, 2, 3, 128}, {4, 5, 2, 80},
                                         {3, 3, 2, 260}, {6, 0, 2, 64}, {2, 9, 4, 32}};
    for (int si = 0; si < 6; si++)
        for (int di = 0; di < 3; di++)
            for (int strided = 0; strided < 2; strided++) {
                merge_n_cfg c = {nshapes[si][0], nshapes[si][1], nshapes[si][2],
                                 nshapes[si][3], ops_float_dtypes[di],
                                 ops_float_dtypes[(di + strided) % 3], strided, 0};
                snprintf(name, sizeof name, "merge_states/%s/%s_to_%s/n%lld_s%lld_h%lld_d%lld/%s",
                         be->name, tu_dtype_name(c.dv), tu_dtype_name(c.dout),
                         (long long)c.n, (long long)c.states, (long long)c.heads,
                         (long long)c.dim, strided ? "strided" : "contiguous");
                run_case("merge_states", name, case_merge_states, &c, be->ctx);
            }
}

/* The merges on NaN and infinite inputs (docs/SEMANTICS.md, "Non-finite
 * values"): the rows of ops_put_nonfinite_states, every mode, dtypes. */
static void suite_nonfinite(const backend *be) {
    static const char *const mode_names[] = {"out", "out=a", "in_place", "in_place_mask"};
    char name[160];
    for (int di = 0; di < 3; di++)
        for (int mode = 0; mode < 4; mode++) {
            merge_cfg c = {12, 2, 72, FI_DTYPE_F32, ops_float_dtypes[di], ops_float_dtypes[di],
                           mode & 1, (merge_mode)mode, 1};
            snprintf(name, sizeof name, "nonfinite/%s/merge_state/f32_%s/%s", be->name,
                     tu_dtype_name(c.db), mode_names[mode]);
            run_case("nonfinite", name, case_merge_state, &c, be->ctx);
        }
    for (int di = 0; di < 3; di++) {
        merge_n_cfg c = {12, 4, 2, 72, FI_DTYPE_F32, ops_float_dtypes[di], di == 1, 1};
        snprintf(name, sizeof name, "nonfinite/%s/merge_states/f32_to_%s", be->name,
                 tu_dtype_name(c.dout));
        run_case("nonfinite", name, case_merge_states, &c, be->ctx);
    }
}

/* =============================================================== append */

typedef struct append_cfg {
    fi_dtype dtype;
    fi_kv_layout layout;
    int32_t page_size, batch, heads, dim_k, dim_v;
    ops_append_shape shape;
    int combined; /* one [pages, 2, ...] tensor split into K and V views */
    int strided;
    int32_t max_tokens; /* per request, for prefill and mixed */
} append_cfg;

static fi_tensor index_tensor(int32_t *data, int64_t len) {
    return fi_tensor_contiguous(data, FI_DTYPE_I32, 1, &len);
}

static int case_append(fi_context *ctx, tu_rng *rng, const void *p) {
    const append_cfg *c = p;
    ops_append_table t;
    int ok = 1;
    tu_buf ak, av, kc, vc;
    memset(&vc, 0, sizeof vc);
    if (ops_table_make(rng, c->shape, c->batch, c->page_size, c->max_tokens, &t)) {
        tu_note("allocation failed");
        ops_table_free(&t);
        return 0;
    }
    const int64_t aks[3] = {t.nnz, c->heads, c->dim_k}, avs[3] = {t.nnz, c->heads, c->dim_v};
    int nhd = c->layout == FI_KV_LAYOUT_NHD;
    int64_t ps = c->page_size, h = c->heads;
    fi_tensor k_cache, v_cache;
    ok = !ops_view_alloc(&ak, c->dtype, 3, aks, c->strided, rng) &&
         !ops_view_alloc(&av, c->dtype, 3, avs, c->strided, rng);
    if (ok && c->combined) { /* [pages, 2, ps, H, D] or [pages, 2, H, ps, D] */
        const int64_t s5[5] = {t.pages, 2, nhd ? ps : h, nhd ? h : ps, c->dim_k};
        ok = !ops_view_alloc(&kc, c->dtype, 5, s5, c->strided, rng) &&
             fi_tensor_split_kv(&kc.t, &k_cache, &v_cache) == FI_OK;
    } else if (ok) {
        const int64_t s4k[4] = {t.pages, nhd ? ps : h, nhd ? h : ps, c->dim_k};
        const int64_t s4v[4] = {t.pages, nhd ? ps : h, nhd ? h : ps, c->dim_v};
        ok = !ops_view_alloc(&kc, c->dtype, 4, s4k, c->strided, rng) &&
             !ops_view_alloc(&vc, c->dtype, 4, s4v, c->strided, rng);
        k_cache = kc.t;
        v_cache = vc.t;
    }
    if (!ok) {
        tu_note("allocation failed");
        ops_table_free(&t);
        return 0;
    }
    tu_fill_uniform(rng, &ak.t, -3.0, 3.0, 0.0);
    tu_fill_uniform(rng, &av.t, -3.0, 3.0, 0.0);
    ops_fill_bytes(rng, &kc);
    if (!c->combined) ops_fill_bytes(rng, &vc);

    /* Expected caches: the old bytes with the reference's writes. */
    void *want_k = ops_snapshot(&kc), *want_v = c->combined ? NULL : ops_snapshot(&vc);
    fi_tensor wk = ops_view_on(&k_cache, &kc, want_k);
    fi_tensor wv =
        c->combined ? ops_view_on(&v_cache, &kc, want_k) : ops_view_on(&v_cache, &vc, want_v);
    oracle_append_paged(&ak.t, &wk, c->layout, t.batch_indices, t.positions, t.indices, t.indptr);
    oracle_append_paged(&av.t, &wv, c->layout, t.batch_indices, t.positions, t.indices, t.indptr);

    fi_tensor bi = index_tensor(t.batch_indices, t.nnz), pos = index_tensor(t.positions, t.nnz);
    fi_tensor ind = index_tensor(t.indices, t.indptr[t.batch]);
    fi_tensor iptr = index_tensor(t.indptr, t.batch + 1), last = index_tensor(t.last, t.batch);
    void *snap_ak = ops_snapshot(&ak), *snap_av = ops_snapshot(&av);
    ok = ops_check_ok(fi_append_paged_kv_cache(ctx, &ak.t, &av.t, &bi, &pos, &k_cache, &v_cache,
                                               c->layout, &ind, &iptr, &last, NULL),
                      "fi_append_paged_kv_cache");
    if (ok) {
        ok &= ops_same_as_snapshot(c->combined ? "kv cache" : "k_cache", &kc, want_k);
        if (!c->combined) ok &= ops_same_as_snapshot("v_cache", &vc, want_v);
        ok &= ops_same_as_snapshot("append_k", &ak, snap_ak) &
              ops_same_as_snapshot("append_v", &av, snap_av);
    }
    free(want_k), free(want_v), free(snap_ak), free(snap_av);
    tu_buf_free(&ak), tu_buf_free(&av), tu_buf_free(&kc), tu_buf_free(&vc);
    ops_table_free(&t);
    return ok;
}

static void suite_append(const backend *be) {
    static const fi_dtype dtypes[5] = {FI_DTYPE_F32, FI_DTYPE_F16, FI_DTYPE_BF16,
                                       FI_DTYPE_E4M3, FI_DTYPE_E5M2};
    static const char *const shape_names[] = {"decode", "prefill", "mixed"};
    static const int32_t page_sizes[3] = {1, 3, 16};
    char name[160];
    for (int di = 0; di < 5; di++)
        for (int layout = 0; layout < 2; layout++)
            for (int shape = 0; shape < 3; shape++)
                for (int pi = 0; pi < 3; pi++)
                    for (int combined = 0; combined < 2; combined++) {
                        if (tu_opt.quick && (pi + shape + combined) % 2) continue;
                        int strided = (pi + shape + combined + di) % 2;
                        append_cfg c = {dtypes[di], (fi_kv_layout)layout, page_sizes[pi],
                                        1 + (pi * 3 + shape) % 5, 1 + (shape + di) % 4,
                                        64, combined ? 64 : 32 + 8 * pi, (ops_append_shape)shape,
                                        combined, strided, 12};
                        snprintf(name, sizeof name,
                                 "append/%s/%s/%s/%s/ps%d_b%d_h%d_dk%d_dv%d/%s/%s", be->name,
                                 tu_dtype_name(c.dtype), layout ? "HND" : "NHD",
                                 shape_names[shape], c.page_size, c.batch, c.heads, c.dim_k,
                                 c.dim_v, combined ? "kv_tensor" : "k_v_tensors",
                                 strided ? "strided" : "contiguous");
                        run_case("append", name, case_append, &c, be->ctx);
                    }
}

/* ================================================================= RoPE */

typedef struct rope_cfg {
    fi_dtype dq, dk;
    int64_t heads_q, heads_k, dim;
    int32_t rotary_dim, interleave, llama31;
    float scale, theta;
    int pos_ids;   /* fi_rope_apply_pos_ids, else indptr + offsets */
    int in_place;
    int strided;
    int32_t batch; /* requests (indptr form) */
    int64_t nnz;
    int32_t max_pos;
} rope_cfg;

static int case_rope(fi_context *ctx, tu_rng *rng, const void *p) {
    const rope_cfg *c = p;
    const int64_t qs[3] = {c->nnz, c->heads_q, c->dim}, ks[3] = {c->nnz, c->heads_k, c->dim};
    tu_buf q, k, qo, ko;
    memset(&qo, 0, sizeof qo);
    memset(&ko, 0, sizeof ko);
    int ok = !ops_view_alloc(&q, c->dq, 3, qs, c->strided, rng) &&
             !ops_view_alloc(&k, c->dk, 3, ks, c->strided, rng);
    if (ok && !c->in_place)
        ok = !ops_view_alloc(&qo, c->dq, 3, qs, c->strided, rng) &&
             !ops_view_alloc(&ko, c->dk, 3, ks, c->strided, rng);
    int32_t *ids = calloc((size_t)c->nnz + 1, sizeof *ids);
    int32_t *indptr = calloc((size_t)c->batch + 1, sizeof *indptr);
    int32_t *offsets = calloc((size_t)c->batch + 1, sizeof *offsets);
    int64_t *pos = calloc((size_t)c->nnz + 1, sizeof *pos);
    if (!ok || !ids || !indptr || !offsets || !pos) {
        tu_note("allocation failed");
        return 0;
    }
    tu_fill_uniform(rng, &q.t, -2.0, 2.0, 0.0);
    tu_fill_uniform(rng, &k.t, -2.0, 2.0, 0.0);
    if (c->pos_ids) {
        for (int64_t t = 0; t < c->nnz; t++) {
            ids[t] = tu_rng_int(rng, 0, c->max_pos);
            pos[t] = ids[t];
        }
    } else { /* random split of the first nnz - pad tokens into requests */
        int64_t covered = c->nnz - tu_rng_int(rng, 0, c->nnz > 2 ? 2 : (int32_t)c->nnz);
        for (int32_t b = 1; b < c->batch; b++) indptr[b] = tu_rng_int(rng, 0, (int32_t)covered);
        indptr[c->batch] = (int32_t)covered;
        for (int32_t b = 1; b < c->batch; b++) /* sort: insertion */
            for (int32_t j = b; j > 1 && indptr[j - 1] > indptr[j]; j--) {
                int32_t tmp = indptr[j];
                indptr[j] = indptr[j - 1];
                indptr[j - 1] = tmp;
            }
        for (int32_t b = 0; b < c->batch; b++) offsets[b] = tu_rng_int(rng, 0, c->max_pos);
        oracle_rope_positions(c->batch, indptr, offsets, c->nnz, pos);
    }
    fi_rope_params rp;
    fi_rope_params_init(&rp);
    rp.rotary_dim = c->rotary_dim;
    rp.interleave = c->interleave;
    rp.llama31 = c->llama31;
    rp.rope_scale = c->scale;
    rp.rope_theta = c->theta;

    double *xq = tu_view_read(&q.t), *xk = tu_view_read(&k.t);
    double *rq = calloc((size_t)(tu_numel(&q.t) + 1), sizeof *rq);
    double *rk = calloc((size_t)(tu_numel(&k.t) + 1), sizeof *rk);
    oracle_rope(&rp, c->nnz, c->heads_q, c->dim, xq, pos, rq);
    oracle_rope(&rp, c->nnz, c->heads_k, c->dim, xk, pos, rk);

    const tu_buf *oq = c->in_place ? &q : &qo, *ok_ = c->in_place ? &k : &ko;
    void *before_q = ops_snapshot(oq), *before_k = ops_snapshot(ok_);
    void *snap_q = ops_snapshot(&q), *snap_k = ops_snapshot(&k);
    fi_tensor tq = oq->t, tk = ok_->t;
    fi_status st;
    if (c->pos_ids) {
        fi_tensor tid = index_tensor(ids, c->nnz);
        st = fi_rope_apply_pos_ids(ctx, &rp, &q.t, &k.t, &tq, &tk, &tid, NULL);
    } else {
        fi_tensor tip = index_tensor(indptr, c->batch + 1), tof = index_tensor(offsets, c->batch);
        st = fi_rope_apply(ctx, &rp, &q.t, &k.t, &tq, &tk, &tip, &tof, NULL);
    }
    ok = ops_check_ok(st, c->pos_ids ? "fi_rope_apply_pos_ids" : "fi_rope_apply");
    if (ok) {
        ok &= ops_check_rope_out("q_out", oq, before_q, rq, pos, tu_dtype_tol(c->dq),
                                 "past indptr[B]");
        ok &= ops_check_rope_out("k_out", ok_, before_k, rk, pos, tu_dtype_tol(c->dk),
                                 "past indptr[B]");
        if (!c->in_place) {
            ok &= ops_check_outside("q_out", &qo) & ops_check_outside("k_out", &ko);
            ok &= ops_same_as_snapshot("q", &q, snap_q) & ops_same_as_snapshot("k", &k, snap_k);
        }
    }
    free(ids), free(indptr), free(offsets), free(pos), free(xq), free(xk), free(rq), free(rk);
    free(before_q), free(before_k), free(snap_q), free(snap_k);
    tu_buf_free(&q), tu_buf_free(&k), tu_buf_free(&qo), tu_buf_free(&ko);
    return ok;
}

static void suite_rope(const backend *be) {
    /* (head dim, rotary dim): full, partial, tiny, and past one block of
     * 128 pairs so the pair blocking is exercised. */
    static const int32_t dims[][2] = {{128, 0}, {128, 64}, {64, 32}, {6, 4}, {520, 516}, {80, 0}};
    char name[200];
    int variant = 0;
    for (int di = 0; di < 6; di++)
        for (int ti = 0; ti < 3; ti++)
            for (int form = 0; form < 2; form++)
                for (int inter = 0; inter < 2; inter++)
                    for (int llama = 0; llama < 2; llama++) {
                        variant++;
                        if (tu_opt.quick && variant % 3) continue;
                        int in_place = (variant / 2) % 2, strided = (variant / 3) % 2;
                        rope_cfg c = {ops_float_dtypes[ti], ops_float_dtypes[(ti + (di == 5)) % 3],
                                      1 + variant % 4, variant % 3, dims[di][0], dims[di][1],
                                      inter, llama,
                                      llama ? 8.0f : (variant % 2 ? 1.0f : 2.5f),
                                      llama ? 5e5f : (variant % 5 ? 1e4f : 1e6f), form,
                                      in_place, strided, 1 + variant % 5,
                                      3 + variant % 13, llama ? 131072 : 5000};
                        snprintf(name, sizeof name,
                                 "rope/%s/%s%s%s/d%lld_rd%d/%s/%s%s/hq%lld_hk%lld_nnz%lld/%s/%s",
                                 be->name, tu_dtype_name(c.dq), c.dk != c.dq ? "_k" : "",
                                 c.dk != c.dq ? tu_dtype_name(c.dk) : "", (long long)c.dim,
                                 c.rotary_dim, form ? "pos_ids" : "indptr",
                                 inter ? "interleave" : "halves", llama ? "_llama31" : "",
                                 (long long)c.heads_q, (long long)c.heads_k, (long long)c.nnz,
                                 in_place ? "in_place" : "out", strided ? "strided" : "contiguous");
                        run_case("rope", name, case_rope, &c, be->ctx);
                    }
}

/* ============================================================= property */

typedef struct property_cfg {
    int64_t n, heads, dim, keys;
    int32_t parts;
    double sm_scale;
} property_cfg;

/* Keys split at random into `parts` disjoint sets (the last one empty);
 * per (token, head) the attention state over each set comes from the
 * oracle. Merging them with fi_merge_state (two parts: first vs the rest),
 * fi_merge_states and a chain of fi_merge_state_in_place must each give
 * attention over all keys. */
static int case_property(fi_context *ctx, tu_rng *rng, const void *p) {
    const property_cfg *c = p;
    int64_t n = c->n, H = c->heads, D = c->dim, N = c->keys, P = c->parts;
    double *q = malloc(sizeof(double) * (size_t)(n * H * D));
    double *k = malloc(sizeof(double) * (size_t)(H * N * D));
    double *v = malloc(sizeof(double) * (size_t)(H * N * D));
    uint8_t *part = malloc((size_t)N), *use = malloc((size_t)N);
    double *o_part = malloc(sizeof(double) * (size_t)(n * P * H * D));
    double *l_part = malloc(sizeof(double) * (size_t)(n * P * H));
    double *o_all = malloc(sizeof(double) * (size_t)(n * H * D));
    double *l_all = malloc(sizeof(double) * (size_t)(n * H));
    double *o_ab = malloc(sizeof(double) * (size_t)(n * 2 * H * D));
    double *l_ab = malloc(sizeof(double) * (size_t)(n * 2 * H));
    double *tmp_o = malloc(sizeof(double) * (size_t)D);
    int ok = q && k && v && part && use && o_part && l_part && o_all && l_all && o_ab && l_ab && tmp_o;
    tu_buf sv, ss, va, sa, vb, sb, vo, so;
    const int64_t svs[4] = {n, P, H, D}, sss[3] = {n, P, H}, vs[3] = {n, H, D}, ls[2] = {n, H};
    ok = ok && !tu_buf_alloc(&sv, FI_DTYPE_F32, 4, svs) && !tu_buf_alloc(&ss, FI_DTYPE_F32, 3, sss) &&
         !tu_buf_alloc(&va, FI_DTYPE_F32, 3, vs) && !tu_buf_alloc(&sa, FI_DTYPE_F32, 2, ls) &&
         !tu_buf_alloc(&vb, FI_DTYPE_F32, 3, vs) && !tu_buf_alloc(&sb, FI_DTYPE_F32, 2, ls) &&
         !tu_buf_alloc(&vo, FI_DTYPE_F32, 3, vs) && !tu_buf_alloc(&so, FI_DTYPE_F32, 2, ls);
    if (!ok) {
        tu_note("allocation failed");
        return 0;
    }
    for (int64_t i = 0; i < n * H * D; i++) q[i] = tu_rng_normal(rng);
    for (int64_t i = 0; i < H * N * D; i++) k[i] = tu_rng_normal(rng), v[i] = tu_rng_normal(rng);
    for (int64_t j = 0; j < N; j++) part[j] = (uint8_t)tu_rng_int(rng, 0, (int32_t)P - 2);

    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < H; h++) {
            const double *qi = &q[(i * H + h) * D], *kh = &k[h * N * D], *vh = &v[h * N * D];
            oracle_attention_state(1, N, D, D, qi, kh, vh, NULL, c->sm_scale,
                                   &o_all[(i * H + h) * D], &l_all[i * H + h]);
            for (int64_t pi = 0; pi < P; pi++) {
                for (int64_t j = 0; j < N; j++) use[j] = part[j] == pi;
                oracle_attention_state(1, N, D, D, qi, kh, vh, use, c->sm_scale,
                                       &o_part[((i * P + pi) * H + h) * D],
                                       &l_part[(i * P + pi) * H + h]);
            }
            /* two states: part 0, and everything else */
            for (int64_t j = 0; j < N; j++) use[j] = part[j] != 0;
            oracle_attention_state(1, N, D, D, qi, kh, vh, use, c->sm_scale, tmp_o,
                                   &l_ab[(i * 2 + 1) * H + h]);
            memcpy(&o_ab[((i * 2 + 1) * H + h) * D], tmp_o, sizeof(double) * (size_t)D);
            memcpy(&o_ab[((i * 2 + 0) * H + h) * D], &o_part[((i * P + 0) * H + h) * D],
                   sizeof(double) * (size_t)D);
            l_ab[(i * 2 + 0) * H + h] = l_part[(i * P + 0) * H + h];
        }
    /* the states as f32 tensors */
    for (int64_t i = 0; i < n * P * H * D; i++) tu_view_set(&sv.t, i, o_part[i]);
    for (int64_t i = 0; i < n * P * H; i++) tu_view_set(&ss.t, i, l_part[i]);
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < H; h++) {
            for (int64_t d = 0; d < D; d++) {
                tu_view_set(&va.t, (i * H + h) * D + d, o_ab[((i * 2 + 0) * H + h) * D + d]);
                tu_view_set(&vb.t, (i * H + h) * D + d, o_ab[((i * 2 + 1) * H + h) * D + d]);
            }
            tu_view_set(&sa.t, i * H + h, l_ab[(i * 2 + 0) * H + h]);
            tu_view_set(&sb.t, i * H + h, l_ab[(i * 2 + 1) * H + h]);
        }
    /* f32 states: 1e-5 of rounding, a few times over */
    const double rtol = 2e-5;
    tu_buf_poison(&vo), tu_buf_poison(&so);
    ok = ops_check_ok(fi_merge_state(ctx, &va.t, &sa.t, &vb.t, &sb.t, &vo.t, &so.t, NULL),
                      "fi_merge_state");
    ok = ok && ops_check_view("merge_state O vs union", &vo.t, o_all, rtol) &
                   ops_check_view("merge_state LSE vs union", &so.t, l_all, rtol);
    tu_buf_poison(&vo), tu_buf_poison(&so);
    ok = ok &&
         ops_check_ok(fi_merge_states(ctx, &sv.t, &ss.t, &vo.t, &so.t, NULL), "fi_merge_states");
    ok = ok && ops_check_view("merge_states O vs union", &vo.t, o_all, rtol) &
                   ops_check_view("merge_states LSE vs union", &so.t, l_all, rtol);
    /* chain: start from part 0, merge parts 1.. in place */
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < H; h++) {
            for (int64_t d = 0; d < D; d++)
                tu_view_set(&va.t, (i * H + h) * D + d, o_part[((i * P + 0) * H + h) * D + d]);
            tu_view_set(&sa.t, i * H + h, l_part[(i * P + 0) * H + h]);
        }
    for (int64_t pi = 1; pi < P && ok; pi++) {
        for (int64_t i = 0; i < n; i++)
            for (int64_t h = 0; h < H; h++) {
                for (int64_t d = 0; d < D; d++)
                    tu_view_set(&vb.t, (i * H + h) * D + d, o_part[((i * P + pi) * H + h) * D + d]);
                tu_view_set(&sb.t, i * H + h, l_part[(i * P + pi) * H + h]);
            }
        ok = ops_check_ok(fi_merge_state_in_place(ctx, &va.t, &sa.t, &vb.t, &sb.t, NULL, NULL),
                          "fi_merge_state_in_place");
    }
    ok = ok && ops_check_view("in-place chain O vs union", &va.t, o_all, rtol) &
                   ops_check_view("in-place chain LSE vs union", &sa.t, l_all, rtol);

    free(q), free(k), free(v), free(part), free(use), free(o_part), free(l_part);
    free(o_all), free(l_all), free(o_ab), free(l_ab), free(tmp_o);
    tu_buf_free(&sv), tu_buf_free(&ss), tu_buf_free(&va), tu_buf_free(&sa);
    tu_buf_free(&vb), tu_buf_free(&sb), tu_buf_free(&vo), tu_buf_free(&so);
    return ok;
}

static void suite_property(const backend *be) {
    static const property_cfg cfgs[] = {
        {3, 2, 64, 37, 3, 0.125},  {4, 4, 128, 200, 5, 0.088}, {2, 1, 16, 9, 4, 1.0},
        {5, 2, 32, 64, 3, 4.0},    /* large logits: LSEs far apart */
        {1, 3, 256, 500, 8, 0.0625},
    };
    char name[160];
    for (int i = 0; i < (int)(sizeof cfgs / sizeof cfgs[0]); i++) {
        const property_cfg *c = &cfgs[i];
        snprintf(name, sizeof name, "property/%s/n%lld_h%lld_d%lld_keys%lld_parts%d_scale%g",
                 be->name, (long long)c->n, (long long)c->heads, (long long)c->dim,
                 (long long)c->keys, c->parts, c->sm_scale);
        run_case("property", name, case_property, c, be->ctx);
    }
}

/* ============================================================ convert */

/* The row conversions of every op, checked exhaustively through
 * fi_merge_states with one state of LSE 0 (weight exactly 1, so O is the
 * input converted to f32 and back): every f16 and bf16 bit pattern read,
 * and f32 values written to f16/bf16 - every representable value, every
 * midpoint between neighbours (ties to even), overflow, subnormals and
 * random bit patterns. Rows of 259 elements cover SIMD bodies and tails. */
typedef struct convert_cfg {
    fi_dtype from, to;
} convert_cfg;

/* The i-th f32 test value for a 16-bit format (decode: its decoder). */
static float convert_input(tu_rng *rng, int64_t i, float (*decode)(uint16_t)) {
    uint16_t h = (uint16_t)(i % 65536);
    switch ((i / 65536) % 3) {
    case 0: return decode(h);
    case 1: { /* midpoint to the next pattern of the same sign */
        float a = decode(h), b = decode((uint16_t)(h + 1));
        if ((h & 0x7fff) == 0x7fff || !isfinite(a) || !isfinite(b)) return a;
        return (float)(((double)a + (double)b) / 2.0);
    }
    default: {
        uint32_t u = (uint32_t)tu_rng_next(rng);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    }
}

static int case_convert(fi_context *ctx, tu_rng *rng, const void *p) {
    const convert_cfg *c = p;
    int narrowing = c->from == FI_DTYPE_F32;
    fi_dtype half = narrowing ? c->to : c->from;
    float (*decode)(uint16_t) = half == FI_DTYPE_F16 ? tu_f16_to_f32 : tu_bf16_to_f32;
    uint16_t (*encode)(float) = half == FI_DTYPE_F16 ? tu_f32_to_f16 : tu_f32_to_bf16;
    int64_t total = narrowing ? 3 * 65536 : 65536, dim = 259, heads = (total + dim - 1) / dim;
    const int64_t vs[4] = {1, 1, heads, dim}, ss[3] = {1, 1, heads};
    const int64_t os[3] = {1, heads, dim}, ls[2] = {1, heads};
    tu_buf v, s, vo, so;
    if (tu_buf_alloc(&v, c->from, 4, vs) || tu_buf_alloc(&s, FI_DTYPE_F32, 3, ss) ||
        tu_buf_alloc(&vo, c->to, 3, os) || tu_buf_alloc(&so, FI_DTYPE_F32, 2, ls)) {
        tu_note("allocation failed");
        return 0;
    }
    float *in32 = v.base;
    uint16_t *in16 = v.base;
    for (int64_t i = 0; i < heads * dim; i++) {
        if (narrowing) in32[i] = i < total ? convert_input(rng, i, decode) : 0.0f;
        else in16[i] = (uint16_t)(i % 65536);
    }
    memset(s.base, 0, s.bytes);
    tu_buf_poison(&vo);
    int ok = ops_check_ok(fi_merge_states(ctx, &v.t, &s.t, &vo.t, &so.t, NULL), "fi_merge_states");
    int64_t bad = 0;
    for (int64_t i = 0; ok && i < total; i++) {
        int pass;
        if (narrowing) {
            uint16_t got = ((uint16_t *)vo.base)[i], want = encode(in32[i]);
            float g = decode(got), w = decode(want);
            /* NaN payloads and the sign of zero (0 + -0 = +0) are free */
            pass = got == want || (isnan(g) && isnan(w)) || (g == 0.0f && w == 0.0f);
            if (!pass && bad < 3)
                tu_note("%s %.9g (0x%08x) -> 0x%04x, expected 0x%04x", tu_dtype_name(c->to),
                        (double)in32[i], (unsigned)((uint32_t *)v.base)[i], got, want);
        } else {
            float got = ((float *)vo.base)[i], want = decode(in16[i]);
            pass = got == want || (isnan(got) && isnan(want));
            if (!pass && bad < 3)
                tu_note("%s 0x%04x -> %.9g, expected %.9g", tu_dtype_name(c->from), in16[i],
                        (double)got, (double)want);
        }
        bad += !pass;
    }
    if (bad) tu_note("%lld of %lld conversions wrong", (long long)bad, (long long)total);
    tu_buf_free(&v), tu_buf_free(&s), tu_buf_free(&vo), tu_buf_free(&so);
    return ok && bad == 0;
}

static void suite_convert(const backend *be) {
    static const convert_cfg cfgs[4] = {{FI_DTYPE_F16, FI_DTYPE_F32},
                                        {FI_DTYPE_BF16, FI_DTYPE_F32},
                                        {FI_DTYPE_F32, FI_DTYPE_F16},
                                        {FI_DTYPE_F32, FI_DTYPE_BF16}};
    char name[160];
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "convert/%s/%s_to_%s", be->name,
                 tu_dtype_name(cfgs[i].from), tu_dtype_name(cfgs[i].to));
        run_case("convert", name, case_convert, &cfgs[i], be->ctx);
    }
}

/* ================================================================ large */

/* Sizes over the 1 MB threshold, so rows are split across the pool. */
static void suite_large(const backend *be) {
    char name[160];
    merge_cfg m = {1024, 8, 128, FI_DTYPE_BF16, FI_DTYPE_F32, FI_DTYPE_BF16, 0, MERGE_OUT, 0};
    snprintf(name, sizeof name, "large/%s/merge_state_n1024_h8_d128", be->name);
    run_case("large", name, case_merge_state, &m, be->ctx);
    merge_cfg mm = {1024, 8, 128, FI_DTYPE_F16, FI_DTYPE_F16, FI_DTYPE_F16, 1, MERGE_IN_PLACE_MASK,
                    0};
    snprintf(name, sizeof name, "large/%s/merge_in_place_mask_n1024_h8_d128_strided", be->name);
    run_case("large", name, case_merge_state, &mm, be->ctx);
    merge_n_cfg mn = {256, 4, 8, 128, FI_DTYPE_F16, FI_DTYPE_F32, 0, 0};
    snprintf(name, sizeof name, "large/%s/merge_states_n256_s4_h8_d128", be->name);
    run_case("large", name, case_merge_states, &mn, be->ctx);
    append_cfg a = {FI_DTYPE_BF16, FI_KV_LAYOUT_NHD, 16, 8, 8, 128, 128, APPEND_PREFILL, 0, 0, 300};
    snprintf(name, sizeof name, "large/%s/append_bf16_NHD_prefill_b8_h8_d128", be->name);
    run_case("large", name, case_append, &a, be->ctx);
    rope_cfg r = {FI_DTYPE_BF16, FI_DTYPE_BF16, 16, 4, 128, 0, 0, 1, 8.0f, 5e5f, 0, 1, 0, 7,
                  1024, 100000};
    snprintf(name, sizeof name, "large/%s/rope_bf16_llama31_nnz1024_hq16_hk4_d128", be->name);
    run_case("large", name, case_rope, &r, be->ctx);
}

/* ============================================================ bad input */

/* One call of an op with every argument held by value, so a case can break
 * one of them; the buffers behind them are shared and must stay unchanged. */
typedef struct bad_args {
    fi_context *ctx;
    /* merge */
    fi_tensor va, sa, vb, sb, vo, so, mask, v4, s3;
    /* append */
    fi_tensor ak, av, kc, vc, bi, pos, ind, iptr, last;
    fi_kv_layout layout;
    int32_t bi_data[4], pos_data[4], ind_data[6], iptr_data[4], last_data[3];
    /* rope */
    fi_rope_params rp;
    fi_tensor q, k, qo, ko, ids, rptr, offs;
    int32_t ids_data[5], rptr_data[3], offs_data[2];
} bad_args;

typedef enum bad_op { OP_MERGE, OP_MERGE_IN_PLACE, OP_MERGE_STATES, OP_APPEND, OP_ROPE,
                      OP_ROPE_POS } bad_op;

typedef struct bad_case {
    bad_op op;
    const char *name;
    fi_status status;
    const char *message; /* a substring of fi_last_error() */
} bad_case;

static const bad_case bad_cases[] = {
    {OP_MERGE, "null_ctx", FI_STATUS_INVALID_ARGUMENT, "fi_merge_state: ctx is NULL"},
    {OP_MERGE, "null_v_a", FI_STATUS_INVALID_ARGUMENT, "v_a: tensor is NULL"},
    {OP_MERGE, "null_v_b_data", FI_STATUS_INVALID_ARGUMENT, "v_b.data is NULL"},
    {OP_MERGE, "v_a_fp8", FI_STATUS_INVALID_ARGUMENT, "v_a.dtype is e4m3, expected f32, f16 or bf16"},
    {OP_MERGE, "s_a_f16", FI_STATUS_INVALID_ARGUMENT, "s_a.dtype is f16, expected f32"},
    {OP_MERGE, "v_b_heads", FI_STATUS_INVALID_ARGUMENT, "v_b.shape[1]=5, expected 3"},
    {OP_MERGE, "s_out_rows", FI_STATUS_INVALID_ARGUMENT, "s_out.shape[0]=3, expected 4"},
    {OP_MERGE, "v_out_rank", FI_STATUS_INVALID_ARGUMENT, "v_out.ndim is 2, expected 3"},
    {OP_MERGE, "v_out_negative_stride", FI_STATUS_INVALID_ARGUMENT, "negative strides"},
    {OP_MERGE, "v_out_alias_other_view", FI_STATUS_INVALID_ARGUMENT, "in place needs the same view"},
    {OP_MERGE, "v_a_negative_dim", FI_STATUS_INVALID_ARGUMENT, "v_a.shape[2]=-8 is negative"},
    {OP_MERGE, "s_b_misaligned", FI_STATUS_INVALID_ARGUMENT, "not aligned"},
    {OP_MERGE_IN_PLACE, "mask_dtype", FI_STATUS_INVALID_ARGUMENT, "mask.dtype is i32, expected u8"},
    {OP_MERGE_IN_PLACE, "mask_rows", FI_STATUS_INVALID_ARGUMENT, "mask.shape[0]=5, expected 4"},
    {OP_MERGE_IN_PLACE, "v_other_dim", FI_STATUS_INVALID_ARGUMENT, "v_other.shape[2]=7, expected 8"},
    {OP_MERGE_IN_PLACE, "null_s", FI_STATUS_INVALID_ARGUMENT, "s: tensor is NULL"},
    {OP_MERGE_STATES, "s_num_states", FI_STATUS_INVALID_ARGUMENT, "s.shape[1]=2, expected 3"},
    {OP_MERGE_STATES, "v_out_dim", FI_STATUS_INVALID_ARGUMENT, "v_out.shape[2]=9, expected 8"},
    {OP_MERGE_STATES, "v_rank", FI_STATUS_INVALID_ARGUMENT, "v.ndim is 3, expected 4"},
    {OP_MERGE_STATES, "v_out_aliases_v", FI_STATUS_INVALID_ARGUMENT, "must not share data"},
    {OP_APPEND, "batch_index_past_batch", FI_STATUS_INVALID_ARGUMENT,
     "batch_indices[1]=3 is outside the batch of 3 requests"},
    {OP_APPEND, "batch_index_negative", FI_STATUS_INVALID_ARGUMENT, "batch_indices[0]=-1"},
    {OP_APPEND, "position_past_length", FI_STATUS_INVALID_ARGUMENT,
     "positions[2]=5 is outside request 2, whose length is 5"},
    {OP_APPEND, "position_negative", FI_STATUS_INVALID_ARGUMENT, "positions[3]=-2"},
    {OP_APPEND, "page_id_past_cache", FI_STATUS_INVALID_ARGUMENT,
     "kv_indices[4]=6 is not a page of the cache (it has 6 pages)"},
    {OP_APPEND, "indptr_decreasing", FI_STATUS_INVALID_ARGUMENT, "must not decrease"},
    {OP_APPEND, "indptr_past_indices", FI_STATUS_INVALID_ARGUMENT, "kv_indptr[3]=7"},
    {OP_APPEND, "indptr_start", FI_STATUS_INVALID_ARGUMENT, "kv_indptr[0]=1"},
    {OP_APPEND, "last_page_len_past_page", FI_STATUS_INVALID_ARGUMENT,
     "kv_last_page_len[1]=5 is outside [1, page_size 4]"},
    {OP_APPEND, "last_page_len_zero", FI_STATUS_INVALID_ARGUMENT, "kv_last_page_len[0]=0"},
    {OP_APPEND, "dtype_mismatch", FI_STATUS_INVALID_ARGUMENT, "must share a dtype"},
    {OP_APPEND, "cache_heads", FI_STATUS_INVALID_ARGUMENT, "k_cache.shape[2]=3, expected 2"},
    {OP_APPEND, "v_cache_pages", FI_STATUS_INVALID_ARGUMENT, "v_cache.shape[0]=5, expected 6"},
    {OP_APPEND, "layout", FI_STATUS_INVALID_ARGUMENT, "layout=7 is neither NHD nor HND"},
    {OP_APPEND, "batch_indices_len", FI_STATUS_INVALID_ARGUMENT, "batch_indices.shape[0]=3, expected 4"},
    {OP_APPEND, "indptr_strided", FI_STATUS_INVALID_ARGUMENT, "must be contiguous"},
    {OP_APPEND, "append_v_heads", FI_STATUS_INVALID_ARGUMENT, "append_v.shape[1]=1, expected 2"},
    {OP_APPEND, "append_k_i32", FI_STATUS_INVALID_ARGUMENT, "append_k.dtype is i32"},
    {OP_APPEND, "last_page_len_len", FI_STATUS_INVALID_ARGUMENT, "kv_last_page_len.shape[0]=2, expected 3"},
    {OP_APPEND, "indptr_empty", FI_STATUS_INVALID_ARGUMENT, "kv_indptr has 0 entries"},
    {OP_APPEND, "null_positions", FI_STATUS_INVALID_ARGUMENT, "positions: tensor is NULL"},
    {OP_ROPE_POS, "null_params", FI_STATUS_INVALID_ARGUMENT, "params is NULL"},
    {OP_ROPE_POS, "struct_size", FI_STATUS_INVALID_ARGUMENT, "struct_size=0"},
    {OP_ROPE_POS, "rotary_dim_odd", FI_STATUS_INVALID_ARGUMENT, "rotary_dim=7 must be even"},
    {OP_ROPE_POS, "rotary_dim_past_head", FI_STATUS_INVALID_ARGUMENT, "rotary_dim=10 must be even and in [2, head_dim 8]"},
    {OP_ROPE_POS, "rope_scale_zero", FI_STATUS_INVALID_ARGUMENT, "rope_scale=0 must be > 0"},
    {OP_ROPE_POS, "rope_scale_nan", FI_STATUS_INVALID_ARGUMENT, "rope_scale=nan"},
    {OP_ROPE_POS, "rope_theta_negative", FI_STATUS_INVALID_ARGUMENT, "rope_theta=-1 must be > 0"},
    {OP_ROPE_POS, "llama31_factors", FI_STATUS_INVALID_ARGUMENT, "low_freq_factor < high_freq_factor"},
    {OP_ROPE_POS, "llama31_old_context", FI_STATUS_INVALID_ARGUMENT, "old_context_len=0"},
    {OP_ROPE_POS, "pos_id_negative", FI_STATUS_INVALID_ARGUMENT, "pos_ids[3]=-5"},
    {OP_ROPE_POS, "pos_ids_len", FI_STATUS_INVALID_ARGUMENT, "pos_ids.shape[0]=4, expected 5"},
    {OP_ROPE_POS, "k_dim", FI_STATUS_INVALID_ARGUMENT, "k.shape[2]=6, expected 8"},
    {OP_ROPE_POS, "k_tokens", FI_STATUS_INVALID_ARGUMENT, "k.shape[0]=4, expected 5"},
    {OP_ROPE_POS, "q_out_dtype", FI_STATUS_INVALID_ARGUMENT, "q_out.dtype is bf16, expected f32"},
    {OP_ROPE_POS, "q_out_alias_other_view", FI_STATUS_INVALID_ARGUMENT, "in place needs the same view"},
    {OP_ROPE_POS, "q_fp8", FI_STATUS_INVALID_ARGUMENT, "q.dtype is e5m2"},
    {OP_ROPE, "indptr_decreasing", FI_STATUS_INVALID_ARGUMENT, "must not decrease"},
    {OP_ROPE, "indptr_past_tokens", FI_STATUS_INVALID_ARGUMENT, "indptr[2]=6"},
    {OP_ROPE, "offset_negative", FI_STATUS_INVALID_ARGUMENT, "offsets[1]=-3"},
    {OP_ROPE, "offsets_len", FI_STATUS_INVALID_ARGUMENT, "offsets.shape[0]=1, expected 2"},
    {OP_ROPE, "null_ctx", FI_STATUS_INVALID_ARGUMENT, "fi_rope_apply: ctx is NULL"},
};
#define NUM_BAD ((int)(sizeof bad_cases / sizeof bad_cases[0]))

/* Buffers shared by every bad-input case: merge [4, 3, 8] f32 states and
 * [4, 3 states, 3, 8]; an NHD cache of 6 pages of 4 slots, 2 heads, D 8,
 * with B = 3 requests of lengths 5, 4, 5 and 4 new tokens; RoPE on q [5, 2,
 * 8] and k [5, 1, 8]. */
typedef struct bad_bufs {
    tu_buf m[6], mask, v4, s3, ak, av, kc, vc, q, k, qo, ko;
} bad_bufs;

static int bad_bufs_alloc(bad_bufs *b, tu_rng *rng) {
    const int64_t vs[3] = {4, 3, 8}, ss[2] = {4, 3}, ms[1] = {4};
    const int64_t v4s[4] = {4, 3, 3, 8}, s3s[3] = {4, 3, 3};
    const int64_t as[3] = {4, 2, 8}, cs[4] = {6, 4, 2, 8};
    const int64_t qs[3] = {5, 2, 8}, ks[3] = {5, 1, 8};
    int fail = 0;
    for (int i = 0; i < 6; i++)
        fail |= i % 2 ? tu_buf_alloc(&b->m[i], FI_DTYPE_F32, 2, ss)
                      : tu_buf_alloc(&b->m[i], FI_DTYPE_F32, 3, vs);
    fail |= tu_buf_alloc(&b->mask, FI_DTYPE_U8, 1, ms);
    fail |= tu_buf_alloc(&b->v4, FI_DTYPE_F32, 4, v4s) | tu_buf_alloc(&b->s3, FI_DTYPE_F32, 3, s3s);
    fail |= tu_buf_alloc(&b->ak, FI_DTYPE_F16, 3, as) | tu_buf_alloc(&b->av, FI_DTYPE_F16, 3, as);
    fail |= tu_buf_alloc(&b->kc, FI_DTYPE_F16, 4, cs) | tu_buf_alloc(&b->vc, FI_DTYPE_F16, 4, cs);
    fail |= tu_buf_alloc(&b->q, FI_DTYPE_F32, 3, qs) | tu_buf_alloc(&b->k, FI_DTYPE_F32, 3, ks);
    fail |= tu_buf_alloc(&b->qo, FI_DTYPE_F32, 3, qs) | tu_buf_alloc(&b->ko, FI_DTYPE_F32, 3, ks);
    if (fail) return -1;
    tu_buf *all[] = {&b->m[0], &b->m[1], &b->m[2], &b->m[3], &b->m[4], &b->m[5], &b->mask,
                     &b->v4, &b->s3, &b->ak, &b->av, &b->kc, &b->vc, &b->q, &b->k, &b->qo, &b->ko};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ops_fill_bytes(rng, all[i]);
    return 0;
}

static void bad_bufs_free(bad_bufs *b) {
    for (int i = 0; i < 6; i++) tu_buf_free(&b->m[i]);
    tu_buf *all[] = {&b->mask, &b->v4, &b->s3, &b->ak, &b->av, &b->kc, &b->vc,
                     &b->q, &b->k, &b->qo, &b->ko};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tu_buf_free(all[i]);
}

/* The valid call every bad case starts from. */
static void bad_args_valid(bad_args *a, const bad_bufs *b, fi_context *ctx) {
    memset(a, 0, sizeof *a);
    a->ctx = ctx;
    a->va = b->m[0].t, a->sa = b->m[1].t, a->vb = b->m[2].t, a->sb = b->m[3].t;
    a->vo = b->m[4].t, a->so = b->m[5].t, a->mask = b->mask.t, a->v4 = b->v4.t, a->s3 = b->s3.t;
    a->ak = b->ak.t, a->av = b->av.t, a->kc = b->kc.t, a->vc = b->vc.t;
    a->layout = FI_KV_LAYOUT_NHD;
    /* requests of 5, 4, 5 tokens over pages {0,1} {2} {3,4}; new tokens at
     * the ends of the requests */
    const int32_t bi[4] = {0, 1, 2, 2}, pos[4] = {4, 3, 4, 3}, ind[6] = {0, 1, 2, 3, 4, 5};
    const int32_t iptr[4] = {0, 2, 3, 5}, last[3] = {1, 4, 1};
    memcpy(a->bi_data, bi, sizeof bi), memcpy(a->pos_data, pos, sizeof pos);
    memcpy(a->ind_data, ind, sizeof ind), memcpy(a->iptr_data, iptr, sizeof iptr);
    memcpy(a->last_data, last, sizeof last);
    a->bi = index_tensor(a->bi_data, 4), a->pos = index_tensor(a->pos_data, 4);
    a->ind = index_tensor(a->ind_data, 6), a->iptr = index_tensor(a->iptr_data, 4);
    a->last = index_tensor(a->last_data, 3);
    fi_rope_params_init(&a->rp);
    a->q = b->q.t, a->k = b->k.t, a->qo = b->qo.t, a->ko = b->ko.t;
    const int32_t ids[5] = {0, 7, 3, 100, 2}, rptr[3] = {0, 2, 5}, offs[2] = {0, 9};
    memcpy(a->ids_data, ids, sizeof ids), memcpy(a->rptr_data, rptr, sizeof rptr);
    memcpy(a->offs_data, offs, sizeof offs);
    a->ids = index_tensor(a->ids_data, 5), a->rptr = index_tensor(a->rptr_data, 3);
    a->offs = index_tensor(a->offs_data, 2);
}

/* Break the one argument case i is about. Pointer arguments that should be
 * NULL are handled by the caller through *null_arg. */
static void bad_mutate(int i, bad_args *a, const char **null_arg) {
    const char *n = bad_cases[i].name;
    bad_op op = bad_cases[i].op;
    *null_arg = NULL;
    if (!strcmp(n, "null_ctx")) a->ctx = NULL;
    else if (!strcmp(n, "null_v_a")) *null_arg = "v_a";
    else if (!strcmp(n, "null_s")) *null_arg = "s";
    else if (!strcmp(n, "null_positions")) *null_arg = "positions";
    else if (!strcmp(n, "null_params")) *null_arg = "params";
    else if (!strcmp(n, "null_v_b_data")) a->vb.data = NULL;
    else if (!strcmp(n, "v_a_fp8")) a->va.dtype = FI_DTYPE_E4M3;
    else if (!strcmp(n, "s_a_f16")) a->sa.dtype = FI_DTYPE_F16;
    else if (!strcmp(n, "v_b_heads")) a->vb.shape[1] = 5;
    else if (!strcmp(n, "s_out_rows")) a->so.shape[0] = 3;
    else if (!strcmp(n, "v_out_rank")) a->vo.ndim = 2;
    else if (!strcmp(n, "v_out_negative_stride")) a->vo.stride[1] = -8;
    else if (!strcmp(n, "v_out_alias_other_view")) a->vo = a->va, a->vo.stride[2] = 2;
    else if (!strcmp(n, "v_a_negative_dim")) a->va.shape[2] = -8;
    else if (!strcmp(n, "s_b_misaligned")) a->sb.data = (char *)a->sb.data + 1;
    else if (!strcmp(n, "mask_dtype")) a->mask.dtype = FI_DTYPE_I32;
    else if (!strcmp(n, "mask_rows")) a->mask.shape[0] = 5;
    else if (!strcmp(n, "v_other_dim")) a->vb.shape[2] = 7;
    else if (!strcmp(n, "s_num_states")) a->s3.shape[1] = 2;
    else if (!strcmp(n, "v_out_dim")) a->vo.shape[2] = 9;
    else if (!strcmp(n, "v_rank")) a->v4.ndim = 3;
    else if (!strcmp(n, "v_out_aliases_v")) a->vo.data = a->v4.data;
    else if (!strcmp(n, "batch_index_past_batch")) a->bi_data[1] = 3;
    else if (!strcmp(n, "batch_index_negative")) a->bi_data[0] = -1;
    else if (!strcmp(n, "position_past_length")) a->pos_data[2] = 5;
    else if (!strcmp(n, "position_negative")) a->pos_data[3] = -2;
    else if (!strcmp(n, "page_id_past_cache")) a->ind_data[4] = 6;
    else if (!strcmp(n, "indptr_decreasing") && op == OP_APPEND) a->iptr_data[2] = 1;
    else if (!strcmp(n, "indptr_past_indices")) a->iptr_data[3] = 7;
    else if (!strcmp(n, "indptr_start")) a->iptr_data[0] = 1;
    else if (!strcmp(n, "last_page_len_past_page")) a->last_data[1] = 5;
    else if (!strcmp(n, "last_page_len_zero")) a->last_data[0] = 0;
    else if (!strcmp(n, "dtype_mismatch")) a->kc.dtype = FI_DTYPE_BF16;
    else if (!strcmp(n, "cache_heads")) a->kc.shape[2] = 3;
    else if (!strcmp(n, "v_cache_pages")) a->vc.shape[0] = 5;
    else if (!strcmp(n, "layout")) a->layout = (fi_kv_layout)7;
    else if (!strcmp(n, "batch_indices_len")) a->bi.shape[0] = 3;
    else if (!strcmp(n, "indptr_strided")) a->iptr.shape[0] = 2, a->iptr.stride[0] = 2, a->last.shape[0] = 1;
    else if (!strcmp(n, "append_v_heads")) a->av.shape[1] = 1;
    else if (!strcmp(n, "append_k_i32")) a->ak.dtype = FI_DTYPE_I32;
    else if (!strcmp(n, "last_page_len_len")) a->last.shape[0] = 2;
    else if (!strcmp(n, "indptr_empty")) a->iptr.shape[0] = 0;
    else if (!strcmp(n, "struct_size")) a->rp.struct_size = 0;
    else if (!strcmp(n, "rotary_dim_odd")) a->rp.rotary_dim = 7;
    else if (!strcmp(n, "rotary_dim_past_head")) a->rp.rotary_dim = 10;
    else if (!strcmp(n, "rope_scale_zero")) a->rp.rope_scale = 0.0f;
    else if (!strcmp(n, "rope_scale_nan")) a->rp.rope_scale = NAN;
    else if (!strcmp(n, "rope_theta_negative")) a->rp.rope_theta = -1.0f;
    else if (!strcmp(n, "llama31_factors")) a->rp.llama31 = 1, a->rp.high_freq_factor = 1.0f;
    else if (!strcmp(n, "llama31_old_context")) a->rp.llama31 = 1, a->rp.old_context_len = 0.0f;
    else if (!strcmp(n, "pos_id_negative")) a->ids_data[3] = -5;
    else if (!strcmp(n, "pos_ids_len")) a->ids.shape[0] = 4;
    else if (!strcmp(n, "k_dim")) a->k.shape[2] = 6;
    else if (!strcmp(n, "k_tokens")) a->k.shape[0] = 4;
    else if (!strcmp(n, "q_out_dtype")) a->qo.dtype = FI_DTYPE_BF16;
    else if (!strcmp(n, "q_out_alias_other_view")) a->qo = a->q, a->qo.stride[0] = 8, a->qo.shape[0] = 5;
    else if (!strcmp(n, "q_fp8")) a->q.dtype = FI_DTYPE_E5M2;
    else if (!strcmp(n, "indptr_decreasing")) a->rptr_data[1] = 6, a->rptr_data[2] = 5;
    else if (!strcmp(n, "indptr_past_tokens")) a->rptr_data[2] = 6;
    else if (!strcmp(n, "offset_negative")) a->offs_data[1] = -3;
    else if (!strcmp(n, "offsets_len")) a->offs.shape[0] = 1;
}

static fi_status bad_call(bad_op op, bad_args *a, const char *null_arg) {
#define ARG(field, label) (null_arg && !strcmp(null_arg, label) ? NULL : &a->field)
    switch (op) {
    case OP_MERGE:
        return fi_merge_state(a->ctx, ARG(va, "v_a"), &a->sa, &a->vb, &a->sb, &a->vo, &a->so, NULL);
    case OP_MERGE_IN_PLACE:
        return fi_merge_state_in_place(a->ctx, &a->va, ARG(sa, "s"), &a->vb, &a->sb, &a->mask, NULL);
    case OP_MERGE_STATES:
        return fi_merge_states(a->ctx, &a->v4, &a->s3, &a->vo, &a->so, NULL);
    case OP_APPEND:
        return fi_append_paged_kv_cache(a->ctx, &a->ak, &a->av, &a->bi, ARG(pos, "positions"),
                                        &a->kc, &a->vc, a->layout, &a->ind, &a->iptr, &a->last,
                                        NULL);
    case OP_ROPE:
        return fi_rope_apply(a->ctx, &a->rp, &a->q, &a->k, &a->qo, &a->ko, &a->rptr, &a->offs, NULL);
    case OP_ROPE_POS:
        return fi_rope_apply_pos_ids(a->ctx, null_arg && !strcmp(null_arg, "params") ? NULL : &a->rp,
                                     &a->q, &a->k, &a->qo, &a->ko, &a->ids, NULL);
    }
#undef ARG
    return FI_STATUS_INTERNAL;
}

static const char *const op_names[] = {"merge_state", "merge_state_in_place", "merge_states",
                                       "append", "rope_apply", "rope_apply_pos_ids"};

static void suite_bad_input(const backend *be) {
    char name[160];
    tu_rng rng;
    tu_rng_seed(&rng, tu_hash("bad_input"));
    bad_bufs bufs;
    memset(&bufs, 0, sizeof bufs);
    if (bad_bufs_alloc(&bufs, &rng)) {
        tu_note("allocation failed");
        tu_record("bad_input", "bad_input/alloc", TU_FAIL);
        return;
    }
    tu_buf *all[] = {&bufs.m[0], &bufs.m[1], &bufs.m[2], &bufs.m[3], &bufs.m[4], &bufs.m[5],
                     &bufs.mask, &bufs.v4, &bufs.s3, &bufs.ak, &bufs.av, &bufs.kc, &bufs.vc,
                     &bufs.q, &bufs.k, &bufs.qo, &bufs.ko};
    enum { NUM_ALL = sizeof all / sizeof all[0] };
    /* every op's baseline call must succeed, or the cases prove nothing */
    for (int op = OP_MERGE; op <= OP_ROPE_POS; op++) {
        snprintf(name, sizeof name, "bad_input/%s/%s/valid_baseline", be->name, op_names[op]);
        if (!tu_begin_case(name)) continue;
        bad_args a;
        bad_args_valid(&a, &bufs, be->ctx);
        int ok = ops_check_ok(bad_call((bad_op)op, &a, NULL), op_names[op]);
        tu_record("bad_input", name, ok ? TU_PASS : TU_FAIL);
    }
    for (int i = 0; i < NUM_BAD; i++) {
        const bad_case *bc = &bad_cases[i];
        snprintf(name, sizeof name, "bad_input/%s/%s/%s", be->name, op_names[bc->op], bc->name);
        if (!tu_begin_case(name)) continue;
        void *snaps[NUM_ALL];
        for (int j = 0; j < NUM_ALL; j++) snaps[j] = ops_snapshot(all[j]);
        bad_args a;
        const char *null_arg;
        bad_args_valid(&a, &bufs, be->ctx);
        bad_mutate(i, &a, &null_arg);
        fi_status st = bad_call(bc->op, &a, null_arg);
        const char *msg = fi_last_error();
        int ok = 1;
        if (st != bc->status) {
            tu_note("status %s, expected %s (message: %s)", fi_status_string(st),
                    fi_status_string(bc->status), msg);
            ok = 0;
        } else if (!strstr(msg, bc->message)) {
            tu_note("message \"%s\" does not contain \"%s\"", msg, bc->message);
            ok = 0;
        }
        for (int j = 0; j < NUM_ALL; j++) {
            if (memcmp(all[j]->base, snaps[j], all[j]->bytes)) {
                tu_note("buffer %d was written by a rejected call", j);
                ok = 0;
                memcpy(all[j]->base, snaps[j], all[j]->bytes);
            }
            free(snaps[j]);
        }
        tu_record("bad_input", name, ok ? TU_PASS : TU_FAIL);
    }
    bad_bufs_free(&bufs);
}

/* ================================================================= main */

int main(int argc, char **argv) {
    int rc = tu_parse_args(argc, argv,
                           "Standalone ops (merge, paged append, RoPE) on every CPU SIMD level\n"
                           "against the fp64 references of tests/oracle_ops.c.");
    if (rc) return rc;
    if (!tu_backend_selected("cpu")) return tu_summary("test_ops");
    backends_open();
    for (int i = 0; i < NUM_BACKENDS; i++) {
        const backend *be = &backends[i];
        if (!be->ctx) {
            char name[64];
            snprintf(name, sizeof name, "%s (not available)", be->name);
            tu_note("backend %s: not on this CPU or build", be->name);
            tu_record("skipped backends", name, TU_SKIP);
            continue;
        }
        suite_merge(be);
        suite_append(be);
        suite_rope(be);
        suite_property(be);
        suite_convert(be);
        suite_large(be);
        suite_bad_input(be);
        suite_nonfinite(be);
    }
    backends_close();
    return tu_summary("test_ops");
}
