/*
 * test_cuda_ops.c — the standalone ops on the CUDA backend against the fp64
 * references of tests/oracle_ops.c: fi_merge_state, fi_merge_state_in_place,
 * fi_merge_states, fi_append_paged_kv_cache, fi_rope_apply and
 * fi_rope_apply_pos_ids. Runs on the GPU machine (tests/gpu/run_device.sh).
 *
 * Each case builds its inputs in host buffers (tests/util.h: fresh seeded
 * values, outputs poisoned with 0xFF = NaN), computes the reference, copies
 * every buffer whole to the device between two guard zones filled with
 * 0xA5, runs the op on a non-blocking stream, copies everything back and
 * checks: values against the reference (tolerance by dtype), nothing
 * written outside an output view, inputs unchanged, guard zones intact.
 * Layouts: contiguous and 16-byte aligned (the kernels' vector path),
 * strided views (dims permuted in memory, padded, gaps between elements:
 * the element path), and contiguous but misaligned by one element (the
 * element path again, for rows that would otherwise vectorise).
 *
 * Categories:
 *   merge_state     dtypes (and mixed), -inf states whose O is NaN (never
 *                   read), out / out=a / in place / in place with a mask
 *   merge_states    dtypes in and out, 0 states, all -inf rows, one state
 *   append          every KV dtype incl. FP8, NHD/HND, [pages,2,...] tensor,
 *                   page sizes, decode / prefill / mixed
 *   append_bad      bad batch index, position, page id, last_page_len,
 *                   indptr: those tokens skipped, nothing out of bounds
 *   rope            both forms, halves / interleave, rotary_dim < D,
 *                   LLaMA-3.1, in place, q and k of different dtypes,
 *                   tokens past indptr[B] untouched
 *   rope_bad        malformed indptr: no write outside q_out/k_out
 *   large           sizes past one grid sweep (the kernels' stride loop)
 *   graph           a CUDA graph captured around the ops (warm, and a cold
 *                   configuration compiled inside the capture), replayed on
 *                   new inputs: matches the references and, bitwise, the
 *                   eager run; eager runs repeated are bitwise equal
 *
 * Without a CUDA device every case still builds its inputs and references
 * (the host logic) and is then counted as skipped; the exit status is 0.
 */
#include "flashinfer.h"
#include "gpu_util.h"
#include "../ops_cases.h"
#include "../oracle_ops.h"
#include "../util.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SKIP = -1 };

static fi_context *g_ctx;
static gu_stream g_stream;
static int g_device; /* a CUDA device and context are ready */

/* ============================================================ buffers */

typedef enum view_kind { ALIGNED = 0, STRIDED = 1, MISALIGNED = 2 } view_kind;
static const char *const view_names[] = {"aligned", "strided", "misaligned"};

/* ----------------------------------------------------- device mirrors */

/* b on the device (tests/gpu/gpu_util.h), or SKIP without one. */
static int dm_up(gu_mirror *m, const tu_buf *b, size_t shift) {
    memset(m, 0, sizeof *m);
    return g_device ? gu_mirror_up(m, b, shift) : SKIP;
}

/* The view t of host buffer b, moved onto its device mirror. */
static fi_tensor dm_view(const gu_mirror *m, const tu_buf *b, const fi_tensor *t) {
    fi_tensor r = *t;
    r.data = (void *)(uintptr_t)(m->dev + GU_GUARD + m->shift +
                                 (size_t)((const char *)t->data - (const char *)b->base));
    return r;
}

/* A contiguous int32 index array on the device. */
typedef struct dints {
    gu_ptr dev;
    fi_tensor t;
} dints;

static int di_up(dints *d, const int32_t *a, int64_t n) {
    memset(d, 0, sizeof *d);
    if (!g_device) return SKIP;
    if (GU(gu.MemAlloc(&d->dev, (size_t)(n > 0 ? n : 1) * 4))) {
        d->dev = 0;
        return 0;
    }
    if (n > 0 && GU(gu.HtoD(d->dev, a, (size_t)n * 4))) return 0;
    d->t = fi_tensor_contiguous((void *)(uintptr_t)d->dev, FI_DTYPE_I32, 1, &n);
    return 1;
}

static void di_free(dints *d) {
    if (d->dev) gu.MemFree(d->dev);
    d->dev = 0;
}

/* Uploads are synchronous copies on the legacy stream, the ops run on a
 * non-blocking one: order them by hand. */
static int device_sync(void) { return GU(gu.CtxSynchronize()) == 0; }

/* ================================================================ cases */

typedef int (*case_fn)(tu_rng *rng, const void *cfg);

static void run_case(const char *category, const char *name, case_fn fn, const void *cfg) {
    if (!tu_begin_case(name)) return;
    uint64_t seed = tu_case_seed(name);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    tu_crash_context(name, seed);
    int r = fn(&rng, cfg);
    tu_crash_context(NULL, 0);
    if (r == 0) tu_note("seed %llu; rerun: --filter '%s'", (unsigned long long)seed, name);
    tu_record(category, name, r == SKIP ? TU_SKIP : r ? TU_PASS : TU_FAIL);
}

/* The misalignment of a mirror: one element of the view's dtype. */
static size_t shift_for(view_kind v, const tu_buf *b) {
    return v == MISALIGNED ? tu_dtype_size(b->t.dtype) : 0;
}

/* ================================================================ merge */

typedef enum merge_mode { MERGE_OUT = 0, MERGE_OUT_IS_A, MERGE_IN_PLACE, MERGE_IN_PLACE_MASK } merge_mode;
static const char *const mode_names[] = {"out", "out=a", "in_place", "in_place_mask"};

typedef struct merge_cfg {
    int64_t n, heads, dim;
    fi_dtype da, db, dout;
    view_kind view;
    merge_mode mode;
    int nonfinite; /* rows of ops_put_nonfinite_states, compared by class */
} merge_cfg;

static int case_merge_state(tu_rng *rng, const void *p) {
    const merge_cfg *c = p;
    const int64_t vs[3] = {c->n, c->heads, c->dim}, ss[2] = {c->n, c->heads}, ms[1] = {c->n};
    const int strided = c->view == STRIDED;
    const int in_place = c->mode != MERGE_OUT;
    tu_buf va, sa, vb, sb, vo, so, mask;
    memset(&mask, 0, sizeof mask);
    int ok = !ops_view_alloc(&va, c->da, 3, vs, strided, rng) &&
             !ops_view_alloc(&sa, FI_DTYPE_F32, 2, ss, strided, rng) &&
             !ops_view_alloc(&vb, c->db, 3, vs, strided, rng) &&
             !ops_view_alloc(&sb, FI_DTYPE_F32, 2, ss, strided, rng) &&
             !ops_view_alloc(&vo, c->dout, 3, vs, strided, rng) &&
             !ops_view_alloc(&so, FI_DTYPE_F32, 2, ss, strided, rng);
    if (ok && c->mode == MERGE_IN_PLACE_MASK)
        ok = !ops_view_alloc(&mask, FI_DTYPE_U8, 1, ms, strided, rng);
    if (!ok) {
        tu_note("allocation failed");
        return 0;
    }
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
    if (c->mode == MERGE_IN_PLACE_MASK)
        for (int64_t i = 0; i < c->n; i++) {
            if (keep[i]) continue;
            int64_t len = c->heads * c->dim;
            memcpy(ref + i * len, a + i * len, (size_t)len * sizeof *ref);
            memcpy(lref + i * c->heads, la + i * c->heads, (size_t)c->heads * sizeof *lref);
        }
    void *snap_a = ops_snapshot(&va), *snap_sa = ops_snapshot(&sa);
    void *snap_b = ops_snapshot(&vb), *snap_sb = ops_snapshot(&sb);

    tu_buf *bufs[7] = {&va, &sa, &vb, &sb, &vo, &so, &mask};
    gu_mirror dm[7];
    memset(dm, 0, sizeof dm);
    int nb = c->mode == MERGE_IN_PLACE_MASK ? 7 : 6;
    int r = 1;
    for (int i = 0; i < nb && r == 1; i++) r = dm_up(&dm[i], bufs[i], shift_for(c->view, bufs[i]));
    if (r == 1) {
        fi_tensor tva = dm_view(&dm[0], &va, &va.t), tsa = dm_view(&dm[1], &sa, &sa.t);
        fi_tensor tvb = dm_view(&dm[2], &vb, &vb.t), tsb = dm_view(&dm[3], &sb, &sb.t);
        fi_tensor tvo = dm_view(&dm[4], &vo, &vo.t), tso = dm_view(&dm[5], &so, &so.t);
        fi_tensor tm = nb == 7 ? dm_view(&dm[6], &mask, &mask.t) : mask.t;
        fi_status st;
        r = device_sync();
        if (c->mode == MERGE_OUT)
            st = fi_merge_state(g_ctx, &tva, &tsa, &tvb, &tsb, &tvo, &tso, g_stream);
        else if (c->mode == MERGE_OUT_IS_A)
            st = fi_merge_state(g_ctx, &tva, &tsa, &tvb, &tsb, &tva, &tsa, g_stream);
        else
            st = fi_merge_state_in_place(g_ctx, &tva, &tsa, &tvb, &tsb,
                                         c->mode == MERGE_IN_PLACE_MASK ? &tm : NULL, g_stream);
        r = r && ops_check_ok(st, "merge") && device_sync();
        static const char *const names[7] = {"v_a", "s_a", "v_b", "s_b", "v_out", "s_out", "mask"};
        for (int i = 0; i < nb && r; i++) r &= gu_mirror_down(&dm[i], bufs[i], names[i]);
    }
    if (r == 1) {
        const tu_buf *out_v = in_place ? &va : &vo, *out_s = in_place ? &sa : &so;
        int (*check)(const char *, const fi_tensor *, const double *, double) =
            c->nonfinite ? ops_check_view_classes : ops_check_view;
        r &= check("v_out", &out_v->t, ref, tu_dtype_tol(out_v->t.dtype));
        r &= check("s_out", &out_s->t, lref, 1e-5);
        r &= ops_check_outside("v_out", out_v) & ops_check_outside("s_out", out_s);
        r &= ops_same_as_snapshot("v_b", &vb, snap_b) & ops_same_as_snapshot("s_b", &sb, snap_sb);
        if (!in_place)
            r &= ops_same_as_snapshot("v_a", &va, snap_a) &
                 ops_same_as_snapshot("s_a", &sa, snap_sa);
        if (c->mode == MERGE_IN_PLACE_MASK) { /* untouched rows: bit for bit */
            double *got = tu_view_read(&va.t);
            for (int64_t i = 0; i < c->n * c->heads * c->dim && r; i++)
                if (!keep[i / (c->heads * c->dim)] && !(got[i] == a[i] || (isnan(got[i]) && isnan(a[i])))) {
                    tu_note("masked-off element %lld changed", (long long)i);
                    r = 0;
                }
            free(got);
        }
    }
    for (int i = 0; i < 7; i++) gu_mirror_free(&dm[i]);
    free(a), free(la), free(b), free(lb), free(ref), free(lref), free(keep);
    free(snap_a), free(snap_sa), free(snap_b), free(snap_sb);
    for (int i = 0; i < 7; i++) tu_buf_free(bufs[i]);
    return r;
}

typedef struct merge_n_cfg {
    int64_t n, states, heads, dim;
    fi_dtype dv, dout;
    view_kind view;
    int nonfinite; /* states 0 and 1 get ops_put_nonfinite_states' rows */
} merge_n_cfg;


static int case_merge_states(tu_rng *rng, const void *p) {
    const merge_n_cfg *c = p;
    const int64_t vs[4] = {c->n, c->states, c->heads, c->dim};
    const int64_t ss[3] = {c->n, c->states, c->heads};
    const int64_t os[3] = {c->n, c->heads, c->dim}, ls[2] = {c->n, c->heads};
    const int strided = c->view == STRIDED;
    tu_buf v, s, vo, so;
    if (ops_view_alloc(&v, c->dv, 4, vs, strided, rng) ||
        ops_view_alloc(&s, FI_DTYPE_F32, 3, ss, strided, rng) ||
        ops_view_alloc(&vo, c->dout, 3, os, strided, rng) ||
        ops_view_alloc(&so, FI_DTYPE_F32, 2, ls, strided, rng)) {
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
    tu_buf *bufs[4] = {&v, &s, &vo, &so};
    static const char *const names[4] = {"v", "s", "v_out", "s_out"};
    gu_mirror dm[4];
    memset(dm, 0, sizeof dm);
    int r = 1;
    for (int i = 0; i < 4 && r == 1; i++) r = dm_up(&dm[i], bufs[i], shift_for(c->view, bufs[i]));
    if (r == 1) {
        fi_tensor tv = dm_view(&dm[0], &v, &v.t), ts = dm_view(&dm[1], &s, &s.t);
        fi_tensor tvo = dm_view(&dm[2], &vo, &vo.t), tso = dm_view(&dm[3], &so, &so.t);
        r = device_sync() &&
            ops_check_ok(fi_merge_states(g_ctx, &tv, &ts, &tvo, &tso, g_stream),
                         "fi_merge_states") &&
            device_sync();
        for (int i = 0; i < 4 && r; i++) r &= gu_mirror_down(&dm[i], bufs[i], names[i]);
    }
    if (r == 1) {
        int (*check)(const char *, const fi_tensor *, const double *, double) =
            c->nonfinite ? ops_check_view_classes : ops_check_view;
        r &= check("v_out", &vo.t, ref, tu_dtype_tol(c->dout));
        r &= check("s_out", &so.t, lref, 1e-5);
        r &= ops_check_outside("v_out", &vo) & ops_check_outside("s_out", &so);
        r &= ops_same_as_snapshot("v", &v, snap_v) & ops_same_as_snapshot("s", &s, snap_s);
    }
    for (int i = 0; i < 4; i++) gu_mirror_free(&dm[i]);
    free(x), free(l), free(ref), free(lref), free(snap_v), free(snap_s);
    for (int i = 0; i < 4; i++) tu_buf_free(bufs[i]);
    return r;
}

/* The merges on NaN and infinite inputs, as tests/test_ops.c's "nonfinite"
 * cases (docs/SEMANTICS.md, "Non-finite values"). */
static void suite_nonfinite(void) {
    char name[160];
    for (int di = 0; di < 3; di++)
        for (int mode = 0; mode < 4; mode++) {
            merge_cfg c = {12, 2, 72, FI_DTYPE_F32, ops_float_dtypes[di], ops_float_dtypes[di],
                           (mode & 1) ? STRIDED : ALIGNED, (merge_mode)mode, 1};
            snprintf(name, sizeof name, "nonfinite/merge_state/f32_%s/%s", tu_dtype_name(c.db),
                     mode_names[mode]);
            run_case("nonfinite", name, case_merge_state, &c);
        }
    for (int di = 0; di < 3; di++) {
        merge_n_cfg c = {12, 4, 2, 72, FI_DTYPE_F32, ops_float_dtypes[di],
                         di == 1 ? STRIDED : ALIGNED, 1};
        snprintf(name, sizeof name, "nonfinite/merge_states/f32_to_%s", tu_dtype_name(c.dout));
        run_case("nonfinite", name, case_merge_states, &c);
    }
}

static void suite_merge(void) {
    static const int64_t shapes[][3] = {{1, 1, 1}, {7, 3, 128}, {5, 2, 72}, {3, 2, 300},
                                        {9, 4, 64}, {33, 8, 256}, {4, 3, 8}};
    char name[160];
    for (int si = 0; si < 7; si++)
        for (int di = 0; di < 3; di++)
            for (int view = 0; view < 3; view++)
                for (int mode = 0; mode < 4; mode++) {
                    if (tu_opt.quick && (si + view + mode) % 3) continue;
                    merge_cfg c = {shapes[si][0], shapes[si][1], shapes[si][2],
                                   ops_float_dtypes[di], ops_float_dtypes[di], ops_float_dtypes[di],
                                   (view_kind)view, (merge_mode)mode, 0};
                    snprintf(name, sizeof name, "merge_state/%s/n%lld_h%lld_d%lld/%s/%s",
                             tu_dtype_name(c.da), (long long)c.n, (long long)c.heads,
                             (long long)c.dim, view_names[view], mode_names[mode]);
                    run_case("merge_state", name, case_merge_state, &c);
                }
    static const fi_dtype mixed[][3] = {{FI_DTYPE_F32, FI_DTYPE_BF16, FI_DTYPE_F16},
                                        {FI_DTYPE_F16, FI_DTYPE_F32, FI_DTYPE_BF16},
                                        {FI_DTYPE_BF16, FI_DTYPE_F16, FI_DTYPE_F32},
                                        {FI_DTYPE_F32, FI_DTYPE_F32, FI_DTYPE_BF16}};
    for (int mi = 0; mi < 4; mi++)
        for (int view = 0; view < 2; view++)
            for (int mode = 0; mode < 4; mode += 3) {
                merge_cfg c = {6, 3, 96, mixed[mi][0], mixed[mi][1], mixed[mi][2],
                               (view_kind)view, (merge_mode)mode, 0};
                snprintf(name, sizeof name, "merge_state/mixed_%s_%s_%s/%s/%s",
                         tu_dtype_name(c.da), tu_dtype_name(c.db), tu_dtype_name(c.dout),
                         view_names[view], mode_names[mode]);
                run_case("merge_state", name, case_merge_state, &c);
            }
    static const int64_t nshapes[][4] = {{1, 1, 1, 1}, {5, 2, 3, 128}, {4, 5, 2, 80},
                                         {3, 3, 2, 260}, {6, 0, 2, 64}, {2, 9, 4, 32},
                                         {17, 4, 8, 128}};
    for (int si = 0; si < 7; si++)
        for (int di = 0; di < 3; di++)
            for (int dj = 0; dj < 3; dj++)
                for (int view = 0; view < 3; view++) {
                    if ((dj != di && view != (si % 3)) || (tu_opt.quick && (si + di + view) % 3))
                        continue;
                    merge_n_cfg c = {nshapes[si][0], nshapes[si][1], nshapes[si][2],
                                     nshapes[si][3], ops_float_dtypes[di], ops_float_dtypes[dj],
                                     (view_kind)view, 0};
                    snprintf(name, sizeof name, "merge_states/%s_to_%s/n%lld_s%lld_h%lld_d%lld/%s",
                             tu_dtype_name(c.dv), tu_dtype_name(c.dout), (long long)c.n,
                             (long long)c.states, (long long)c.heads, (long long)c.dim,
                             view_names[view]);
                    run_case("merge_states", name, case_merge_states, &c);
                }
}

/* =============================================================== append */

static const char *const shape_names[] = {"decode", "prefill", "mixed"};

/* How a bad-index case breaks the table (append_bad). */
typedef enum append_bad {
    BAD_NONE = 0,
    BAD_BATCH,     /* batch_indices outside [0, B) */
    BAD_POSITION,  /* positions < 0 or >= the request's length */
    BAD_PAGE,      /* a kv_indices entry past the cache's pages, or negative */
    BAD_LAST,      /* kv_last_page_len 0 or > page_size for a non-empty request */
    BAD_INDPTR,    /* kv_indptr decreasing, or past kv_indices */
    BAD_ALL
} append_bad;
static const char *const bad_names[] = {"none", "batch", "position", "page", "last",
                                        "indptr", "all"};

typedef struct append_cfg {
    fi_dtype dtype;
    fi_kv_layout layout;
    int32_t page_size, batch, heads, dim_k, dim_v;
    ops_append_shape shape;
    int combined;
    view_kind view;
    int32_t max_tokens;
    append_bad bad;
} append_cfg;

/* Break the table as `bad` says (only index values: the shapes stay valid,
 * so the call reaches the kernel). */
static void table_break(tu_rng *rng, ops_append_table *t, append_bad bad) {
    for (int32_t n = 0; n < t->nnz; n++) {
        int k = tu_rng_int(rng, 0, 3);
        if (k) continue; /* about a quarter of the tokens */
        if (bad == BAD_BATCH || (bad == BAD_ALL && n % 2))
            t->batch_indices[n] = tu_rng_int(rng, 0, 1) ? t->batch + tu_rng_int(rng, 0, 5)
                                                        : -1 - tu_rng_int(rng, 0, 5);
        if (bad == BAD_POSITION || (bad == BAD_ALL && n % 2 == 0)) {
            int32_t b = t->batch_indices[n];
            int32_t len = b >= 0 && b < t->batch ? t->new_len[b] : 0;
            t->positions[n] = tu_rng_int(rng, 0, 1) ? len + tu_rng_int(rng, 0, 40)
                                                    : -1 - tu_rng_int(rng, 0, 40);
        }
    }
    if ((bad == BAD_PAGE || bad == BAD_ALL) && t->num_indices > 0) {
        for (int k = 0; k < 3; k++) {
            int32_t j = tu_rng_int(rng, 0, t->num_indices - 1);
            t->indices[j] = k == 0 ? -1 : k == 1 ? t->pages : t->pages + 1000;
        }
    }
    if (bad == BAD_LAST || bad == BAD_ALL) {
        for (int32_t b = 0; b < t->batch; b += 2)
            if (t->indptr[b + 1] > t->indptr[b]) t->last[b] = b % 4 ? 0 : 1 << 20;
    }
    if ((bad == BAD_INDPTR || bad == BAD_ALL) && t->batch >= 2) {
        /* request 0 ends after request 1 starts; the last one runs past
         * kv_indices */
        t->indptr[1] = t->indptr[2] + 1;
        t->indptr[t->batch] = t->num_indices + 7;
    }
}

/* Whether the kernel writes token n (the rule of kernels/ops.cuh). */
static int token_valid(const ops_append_table *t, int32_t n, int32_t ps) {
    int32_t b = t->batch_indices[n], p = t->positions[n];
    if (b < 0 || b >= t->batch || p < 0) return 0;
    int32_t first = t->indptr[b], end = t->indptr[b + 1];
    if (first < 0 || end <= first || end > t->num_indices) return 0;
    int32_t last = t->last[b];
    if (last < 1 || last > ps) return 0;
    if ((int64_t)p >= (int64_t)ps * (end - first - 1) + last) return 0;
    int32_t page = t->indices[first + p / ps];
    return page >= 0 && page < t->pages;
}

static int case_append(tu_rng *rng, const void *p) {
    const append_cfg *c = p;
    ops_append_table t;
    tu_buf ak, av, kc, vc;
    memset(&vc, 0, sizeof vc);
    if (ops_table_make(rng, c->shape, c->batch, c->page_size, c->max_tokens, &t)) {
        tu_note("allocation failed");
        ops_table_free(&t);
        return 0;
    }
    if (c->bad) table_break(rng, &t, c->bad);
    const int64_t aks[3] = {t.nnz, c->heads, c->dim_k}, avs[3] = {t.nnz, c->heads, c->dim_v};
    const int nhd = c->layout == FI_KV_LAYOUT_NHD, strided = c->view == STRIDED;
    const int64_t ps = c->page_size, h = c->heads;
    fi_tensor k_cache, v_cache;
    int ok = !ops_view_alloc(&ak, c->dtype, 3, aks, strided, rng) &&
             !ops_view_alloc(&av, c->dtype, 3, avs, strided, rng);
    if (ok && c->combined) {
        const int64_t s5[5] = {t.pages, 2, nhd ? ps : h, nhd ? h : ps, c->dim_k};
        ok = !ops_view_alloc(&kc, c->dtype, 5, s5, strided, rng) &&
             fi_tensor_split_kv(&kc.t, &k_cache, &v_cache) == FI_OK;
    } else if (ok) {
        const int64_t s4k[4] = {t.pages, nhd ? ps : h, nhd ? h : ps, c->dim_k};
        const int64_t s4v[4] = {t.pages, nhd ? ps : h, nhd ? h : ps, c->dim_v};
        ok = !ops_view_alloc(&kc, c->dtype, 4, s4k, strided, rng) &&
             !ops_view_alloc(&vc, c->dtype, 4, s4v, strided, rng);
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

    /* Expected caches: the old bytes with the reference's writes of the
     * tokens the kernel must write (all of them unless the table is bad). */
    int32_t *vb = malloc(sizeof(int32_t) * (size_t)(t.nnz + 1));
    int32_t *vp = malloc(sizeof(int32_t) * (size_t)(t.nnz + 1));
    int32_t nv = 0;
    for (int32_t n = 0; n < t.nnz; n++)
        if (token_valid(&t, n, c->page_size)) vb[nv] = t.batch_indices[n], vp[nv++] = t.positions[n];
    /* the reference walks rows of the valid tokens: gather them */
    const int64_t vks[3] = {nv, c->heads, c->dim_k}, vvs[3] = {nv, c->heads, c->dim_v};
    tu_buf gk, gv;
    ok = !tu_buf_alloc(&gk, c->dtype, 3, vks) && !tu_buf_alloc(&gv, c->dtype, 3, vvs);
    if (!ok) {
        tu_note("allocation failed");
        return 0;
    }
    {
        size_t es = tu_dtype_size(c->dtype);
        int32_t g = 0;
        for (int32_t n = 0; n < t.nnz; n++) {
            if (!token_valid(&t, n, c->page_size)) continue;
            for (int64_t hh = 0; hh < c->heads; hh++) {
                for (int64_t d = 0; d < c->dim_k; d++) {
                    int64_t si[3] = {n, hh, d}, di[3] = {g, hh, d};
                    memcpy((char *)gk.t.data + tu_offset(&gk.t, di) * (int64_t)es,
                           (char *)ak.t.data + tu_offset(&ak.t, si) * (int64_t)es, es);
                }
                for (int64_t d = 0; d < c->dim_v; d++) {
                    int64_t si[3] = {n, hh, d}, di[3] = {g, hh, d};
                    memcpy((char *)gv.t.data + tu_offset(&gv.t, di) * (int64_t)es,
                           (char *)av.t.data + tu_offset(&av.t, si) * (int64_t)es, es);
                }
            }
            g++;
        }
    }
    void *want_k = ops_snapshot(&kc), *want_v = c->combined ? NULL : ops_snapshot(&vc);
    fi_tensor wk = ops_view_on(&k_cache, &kc, want_k);
    fi_tensor wv =
        c->combined ? ops_view_on(&v_cache, &kc, want_k) : ops_view_on(&v_cache, &vc, want_v);
    oracle_append_paged(&gk.t, &wk, c->layout, vb, vp, t.indices, t.indptr);
    oracle_append_paged(&gv.t, &wv, c->layout, vb, vp, t.indices, t.indptr);
    void *snap_ak = ops_snapshot(&ak), *snap_av = ops_snapshot(&av);

    tu_buf *bufs[4] = {&ak, &av, &kc, &vc};
    static const char *const names[4] = {"append_k", "append_v", "k_cache", "v_cache"};
    int nb = c->combined ? 3 : 4;
    gu_mirror dm[4];
    dints ib[5];
    memset(dm, 0, sizeof dm);
    memset(ib, 0, sizeof ib);
    int r = 1;
    for (int i = 0; i < nb && r == 1; i++) r = dm_up(&dm[i], bufs[i], shift_for(c->view, bufs[i]));
    if (r == 1) r = di_up(&ib[0], t.batch_indices, t.nnz);
    if (r == 1) r = di_up(&ib[1], t.positions, t.nnz);
    if (r == 1) r = di_up(&ib[2], t.indices, t.num_indices);
    if (r == 1) r = di_up(&ib[3], t.indptr, t.batch + 1);
    if (r == 1) r = di_up(&ib[4], t.last, t.batch);
    if (r == 1) {
        fi_tensor tak = dm_view(&dm[0], &ak, &ak.t), tav = dm_view(&dm[1], &av, &av.t);
        fi_tensor tkc = dm_view(&dm[2], &kc, &k_cache);
        fi_tensor tvc = c->combined ? dm_view(&dm[2], &kc, &v_cache) : dm_view(&dm[3], &vc, &v_cache);
        r = device_sync() &&
            ops_check_ok(fi_append_paged_kv_cache(g_ctx, &tak, &tav, &ib[0].t, &ib[1].t, &tkc, &tvc,
                                                  c->layout, &ib[2].t, &ib[3].t, &ib[4].t,
                                                  g_stream),
                         "fi_append_paged_kv_cache") &&
            device_sync();
        for (int i = 0; i < nb && r; i++) r &= gu_mirror_down(&dm[i], bufs[i], names[i]);
    }
    if (r == 1) {
        r &= ops_same_as_snapshot(c->combined ? "kv cache" : "k_cache", &kc, want_k);
        if (!c->combined) r &= ops_same_as_snapshot("v_cache", &vc, want_v);
        r &= ops_same_as_snapshot("append_k", &ak, snap_ak) &
             ops_same_as_snapshot("append_v", &av, snap_av);
        if (!r && c->bad) tu_note("%d of %d tokens valid", (int)nv, (int)t.nnz);
    }
    for (int i = 0; i < 4; i++) gu_mirror_free(&dm[i]);
    for (int i = 0; i < 5; i++) di_free(&ib[i]);
    free(want_k), free(want_v), free(snap_ak), free(snap_av), free(vb), free(vp);
    tu_buf_free(&ak), tu_buf_free(&av), tu_buf_free(&kc), tu_buf_free(&vc);
    tu_buf_free(&gk), tu_buf_free(&gv);
    ops_table_free(&t);
    return r;
}

static const fi_dtype kv_dtypes[5] = {FI_DTYPE_F32, FI_DTYPE_F16, FI_DTYPE_BF16, FI_DTYPE_E4M3,
                                      FI_DTYPE_E5M2};

static void suite_append(void) {
    static const int32_t page_sizes[3] = {1, 3, 16};
    char name[200];
    for (int di = 0; di < 5; di++)
        for (int layout = 0; layout < 2; layout++)
            for (int shape = 0; shape < 3; shape++)
                for (int pi = 0; pi < 3; pi++)
                    for (int combined = 0; combined < 2; combined++) {
                        if (tu_opt.quick && (pi + shape + combined) % 2) continue;
                        view_kind view = (view_kind)((pi + shape + combined + di) % 3);
                        /* dims 64 and 128 vectorise for every dtype; 40 and
                         * 56 only where a row is a multiple of 16 bytes */
                        int32_t dk = pi == 1 ? 40 : 64 + 64 * (layout ^ combined);
                        int32_t dv = combined ? dk : 32 + 8 * pi + 24 * layout;
                        append_cfg c = {kv_dtypes[di], (fi_kv_layout)layout, page_sizes[pi],
                                        1 + (pi * 3 + shape) % 5, 1 + (shape + di) % 4, dk, dv,
                                        (ops_append_shape)shape, combined, view, 12, BAD_NONE};
                        snprintf(name, sizeof name,
                                 "append/%s/%s/%s/ps%d_b%d_h%d_dk%d_dv%d/%s/%s",
                                 tu_dtype_name(c.dtype), layout ? "HND" : "NHD",
                                 shape_names[shape], c.page_size, c.batch, c.heads, c.dim_k,
                                 c.dim_v, combined ? "kv_tensor" : "k_v_tensors",
                                 view_names[view]);
                        run_case("append", name, case_append, &c);
                    }
    for (int bad = BAD_BATCH; bad <= BAD_ALL; bad++)
        for (int di = 0; di < 5; di += 2)
            for (int layout = 0; layout < 2; layout++) {
                view_kind view = (view_kind)((bad + di + layout) % 3);
                append_cfg c = {kv_dtypes[di], (fi_kv_layout)layout, 4, 5, 2, 64, 64,
                                APPEND_MIXED, layout, view, 9, (append_bad)bad};
                snprintf(name, sizeof name, "append_bad/%s/%s/%s/%s", bad_names[bad],
                         tu_dtype_name(c.dtype), layout ? "HND" : "NHD", view_names[view]);
                run_case("append_bad", name, case_append, &c);
            }
}

/* ================================================================= RoPE */

typedef struct rope_cfg {
    fi_dtype dq, dk;
    int64_t heads_q, heads_k, dim;
    int32_t rotary_dim, interleave, llama31;
    float scale, theta;
    int pos_ids;
    int in_place;
    view_kind view;
    int32_t batch;
    int64_t nnz;
    int32_t max_pos;
    int malformed; /* indptr form: a decreasing indptr (only bounds are checked) */
} rope_cfg;

static int case_rope(tu_rng *rng, const void *p) {
    const rope_cfg *c = p;
    const int64_t qs[3] = {c->nnz, c->heads_q, c->dim}, ks[3] = {c->nnz, c->heads_k, c->dim};
    const int strided = c->view == STRIDED;
    tu_buf q, k, qo, ko;
    memset(&qo, 0, sizeof qo);
    memset(&ko, 0, sizeof ko);
    int ok = !ops_view_alloc(&q, c->dq, 3, qs, strided, rng) &&
             !ops_view_alloc(&k, c->dk, 3, ks, strided, rng);
    if (ok && !c->in_place)
        ok = !ops_view_alloc(&qo, c->dq, 3, qs, strided, rng) &&
             !ops_view_alloc(&ko, c->dk, 3, ks, strided, rng);
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
    } else {
        /* requests over [first, covered): tokens before and after have no
         * position and must stay untouched */
        int32_t first = c->nnz > 4 ? tu_rng_int(rng, 0, 2) : 0;
        int64_t covered = c->nnz - tu_rng_int(rng, 0, c->nnz > 2 ? 2 : (int32_t)c->nnz);
        if (covered < first) covered = first;
        indptr[0] = first;
        for (int32_t b = 1; b < c->batch; b++)
            indptr[b] = tu_rng_int(rng, first, (int32_t)covered);
        indptr[c->batch] = (int32_t)covered;
        for (int32_t b = 1; b < c->batch; b++)
            for (int32_t j = b; j > 1 && indptr[j - 1] > indptr[j]; j--) {
                int32_t tmp = indptr[j];
                indptr[j] = indptr[j - 1];
                indptr[j - 1] = tmp;
            }
        for (int32_t b = 0; b < c->batch; b++) offsets[b] = tu_rng_int(rng, 0, c->max_pos);
        for (int64_t t = 0; t < c->nnz; t++) pos[t] = -1;
        for (int32_t b = 0; b < c->batch; b++)
            for (int64_t t = indptr[b]; t < indptr[b + 1]; t++)
                pos[t] = (int64_t)offsets[b] + (t - indptr[b]);
        if (c->malformed && c->batch >= 3) { /* decreasing: only bounds are checked */
            int32_t tmp = indptr[1];
            indptr[1] = indptr[c->batch - 1] + 1;
            indptr[c->batch - 1] = tmp;
        }
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

    tu_buf *oq = c->in_place ? &q : &qo, *ok_ = c->in_place ? &k : &ko;
    void *before_q = ops_snapshot(oq), *before_k = ops_snapshot(ok_);
    void *snap_q = ops_snapshot(&q), *snap_k = ops_snapshot(&k);
    tu_buf *bufs[4] = {&q, &k, &qo, &ko};
    static const char *const names[4] = {"q", "k", "q_out", "k_out"};
    int nb = c->in_place ? 2 : 4;
    gu_mirror dm[4];
    dints ib[2];
    memset(dm, 0, sizeof dm);
    memset(ib, 0, sizeof ib);
    int r = 1;
    for (int i = 0; i < nb && r == 1; i++) r = dm_up(&dm[i], bufs[i], shift_for(c->view, bufs[i]));
    if (r == 1) r = c->pos_ids ? di_up(&ib[0], ids, c->nnz) : di_up(&ib[0], indptr, c->batch + 1);
    if (r == 1 && !c->pos_ids) r = di_up(&ib[1], offsets, c->batch);
    if (r == 1) {
        fi_tensor tq = dm_view(&dm[0], &q, &q.t), tk = dm_view(&dm[1], &k, &k.t);
        fi_tensor tqo = c->in_place ? tq : dm_view(&dm[2], &qo, &qo.t);
        fi_tensor tko = c->in_place ? tk : dm_view(&dm[3], &ko, &ko.t);
        fi_status st;
        r = device_sync();
        if (c->pos_ids)
            st = fi_rope_apply_pos_ids(g_ctx, &rp, &tq, &tk, &tqo, &tko, &ib[0].t, g_stream);
        else
            st = fi_rope_apply(g_ctx, &rp, &tq, &tk, &tqo, &tko, &ib[0].t, &ib[1].t, g_stream);
        r = r && ops_check_ok(st, c->pos_ids ? "fi_rope_apply_pos_ids" : "fi_rope_apply") &&
            device_sync();
        for (int i = 0; i < nb && r; i++) r &= gu_mirror_down(&dm[i], bufs[i], names[i]);
    }
    if (r == 1 && !c->malformed) {
        r &= ops_check_rope_out("q_out", oq, before_q, rq, pos, tu_dtype_tol(c->dq),
                                "without a position");
        r &= ops_check_rope_out("k_out", ok_, before_k, rk, pos, tu_dtype_tol(c->dk),
                                "without a position");
    }
    if (r == 1 && !c->in_place) {
        r &= ops_check_outside("q_out", &qo) & ops_check_outside("k_out", &ko);
        r &= ops_same_as_snapshot("q", &q, snap_q) & ops_same_as_snapshot("k", &k, snap_k);
    }
    for (int i = 0; i < 4; i++) gu_mirror_free(&dm[i]);
    for (int i = 0; i < 2; i++) di_free(&ib[i]);
    free(ids), free(indptr), free(offsets), free(pos), free(xq), free(xk), free(rq), free(rk);
    free(before_q), free(before_k), free(snap_q), free(snap_k);
    tu_buf_free(&q), tu_buf_free(&k), tu_buf_free(&qo), tu_buf_free(&ko);
    return r;
}

static void rope_name(char *name, size_t n, const char *cat, const rope_cfg *c) {
    snprintf(name, n, "%s/%s%s%s/d%lld_rd%d/%s/%s%s/hq%lld_hk%lld_nnz%lld/%s/%s", cat,
             tu_dtype_name(c->dq), c->dk != c->dq ? "_k" : "", c->dk != c->dq ? tu_dtype_name(c->dk) : "",
             (long long)c->dim, c->rotary_dim, c->pos_ids ? "pos_ids" : "indptr",
             c->interleave ? "interleave" : "halves", c->llama31 ? "_llama31" : "",
             (long long)c->heads_q, (long long)c->heads_k, (long long)c->nnz,
             c->in_place ? "in_place" : "out", view_names[c->view]);
}

static void suite_rope(void) {
    /* (head dim, rotary dim): full, partial, tiny, past 256 pairs, odd
     * multiples of 8, a rotary dim that vectorises only when interleaved */
    static const int32_t dims[][2] = {{128, 0}, {128, 64}, {64, 32}, {6, 4}, {520, 516},
                                      {80, 0}, {256, 0}, {128, 40}};
    char name[220];
    int variant = 0;
    for (int di = 0; di < 8; di++)
        for (int ti = 0; ti < 3; ti++)
            for (int form = 0; form < 2; form++)
                for (int inter = 0; inter < 2; inter++)
                    for (int llama = 0; llama < 2; llama++) {
                        variant++;
                        if (tu_opt.quick && variant % 3) continue;
                        int in_place = (variant / 2) % 2;
                        view_kind view = (view_kind)((variant / 3) % 3);
                        rope_cfg c = {ops_float_dtypes[ti], ops_float_dtypes[(ti + (di == 5)) % 3],
                                      1 + variant % 4, variant % 3, dims[di][0], dims[di][1],
                                      inter, llama,
                                      llama ? 8.0f : (variant % 2 ? 1.0f : 2.5f),
                                      llama ? 5e5f : (variant % 5 ? 1e4f : 1e6f), form,
                                      in_place, view, 1 + variant % 5, 3 + variant % 13,
                                      llama ? 131072 : 5000, 0};
                        rope_name(name, sizeof name, "rope", &c);
                        run_case("rope", name, case_rope, &c);
                    }
    for (int ti = 0; ti < 3; ti++)
        for (int view = 0; view < 3; view++) {
            rope_cfg c = {ops_float_dtypes[ti], ops_float_dtypes[ti], 4, 2, 128, 0, ti == 1, 0,
                          1.0f, 1e4f, 0, view == 1, (view_kind)view, 5, 40, 1000, 1};
            rope_name(name, sizeof name, "rope_bad/decreasing_indptr", &c);
            run_case("rope_bad", name, case_rope, &c);
        }
}

/* ================================================================ large */

static void suite_large(void) {
    char name[220];
    /* rows past one sweep of the grid (16 blocks per SM) */
    merge_cfg m = {4096, 32, 128, FI_DTYPE_BF16, FI_DTYPE_F32, FI_DTYPE_BF16, ALIGNED, MERGE_OUT, 0};
    run_case("large", "large/merge_state_n4096_h32_d128", case_merge_state, &m);
    merge_cfg mm = {2048, 8, 128, FI_DTYPE_F16, FI_DTYPE_F16, FI_DTYPE_F16, STRIDED,
                    MERGE_IN_PLACE_MASK, 0};
    run_case("large", "large/merge_in_place_mask_n2048_h8_d128_strided", case_merge_state, &mm);
    merge_n_cfg mn = {2048, 4, 8, 128, FI_DTYPE_F16, FI_DTYPE_F32, ALIGNED, 0};
    run_case("large", "large/merge_states_n2048_s4_h8_d128", case_merge_states, &mn);
    append_cfg a = {FI_DTYPE_BF16, FI_KV_LAYOUT_NHD, 16, 16, 8, 128, 128, APPEND_PREFILL, 0,
                    ALIGNED, 600, BAD_NONE};
    run_case("large", "large/append_bf16_NHD_prefill_b16_h8_d128", case_append, &a);
    append_cfg a2 = {FI_DTYPE_E4M3, FI_KV_LAYOUT_HND, 16, 16, 8, 128, 128, APPEND_MIXED, 1,
                     ALIGNED, 600, BAD_NONE};
    run_case("large", "large/append_e4m3_HND_mixed_b16_h8_d128_kv_tensor", case_append, &a2);
    rope_cfg r = {FI_DTYPE_BF16, FI_DTYPE_BF16, 32, 8, 128, 0, 0, 1, 8.0f, 5e5f, 0, 0, ALIGNED,
                  7, 8192, 100000, 0};
    rope_name(name, sizeof name, "large/rope", &r);
    run_case("large", name, case_rope, &r);
}

/* ================================================================ graph */

/* One fixed set of device buffers for a merge_state, a merge_states, an
 * append and a RoPE; filled with fresh inputs per round. */
enum { GN = 37, GH = 4, GD = 128, GS = 3, GPS = 16, GB = 4, GPAGES = 64, GT = 48 };

typedef struct graph_bufs {
    tu_buf va, sa, vb, sb, vo, so;     /* merge_state [GN, GH, GD] */
    tu_buf nv, ns, nvo, nso;           /* merge_states [GN, GS, GH, GD] */
    tu_buf ak, av, kc, vc;             /* append [GT, GH, GD] into [GPAGES, GPS, GH, GD] */
    tu_buf q, k, qo, ko;               /* rope [GT, 2*GH, GD], [GT, GH, GD] */
    gu_mirror dm[18];
    dints bi, pos, ind, iptr, last, ids;
    ops_append_table t;
    fi_tensor d[18];
} graph_bufs;

static tu_buf *gb_buf(graph_bufs *g, int i) {
    tu_buf *all[18] = {&g->va, &g->sa, &g->vb, &g->sb, &g->vo, &g->so, &g->nv, &g->ns,
                       &g->nvo, &g->nso, &g->ak, &g->av, &g->kc, &g->vc, &g->q, &g->k,
                       &g->qo, &g->ko};
    return all[i];
}

static int gb_alloc(graph_bufs *g) {
    memset(g, 0, sizeof *g);
    const int64_t v3[3] = {GN, GH, GD}, s2[2] = {GN, GH};
    const int64_t v4[4] = {GN, GS, GH, GD}, s3[3] = {GN, GS, GH};
    const int64_t a3[3] = {GT, GH, GD}, c4[4] = {GPAGES, GPS, GH, GD};
    const int64_t q3[3] = {GT, 2 * GH, GD};
    const fi_dtype bf = FI_DTYPE_BF16, f = FI_DTYPE_F32;
    return tu_buf_alloc(&g->va, bf, 3, v3) || tu_buf_alloc(&g->sa, f, 2, s2) ||
           tu_buf_alloc(&g->vb, bf, 3, v3) || tu_buf_alloc(&g->sb, f, 2, s2) ||
           tu_buf_alloc(&g->vo, bf, 3, v3) || tu_buf_alloc(&g->so, f, 2, s2) ||
           tu_buf_alloc(&g->nv, f, 4, v4) || tu_buf_alloc(&g->ns, f, 3, s3) ||
           tu_buf_alloc(&g->nvo, bf, 3, v3) || tu_buf_alloc(&g->nso, f, 2, s2) ||
           tu_buf_alloc(&g->ak, bf, 3, a3) || tu_buf_alloc(&g->av, bf, 3, a3) ||
           tu_buf_alloc(&g->kc, bf, 4, c4) || tu_buf_alloc(&g->vc, bf, 4, c4) ||
           tu_buf_alloc(&g->q, bf, 3, q3) || tu_buf_alloc(&g->k, bf, 3, a3) ||
           tu_buf_alloc(&g->qo, bf, 3, q3) || tu_buf_alloc(&g->ko, bf, 3, a3);
}

static void gb_free(graph_bufs *g) {
    for (int i = 0; i < 18; i++) {
        gu_mirror_free(&g->dm[i]);
        tu_buf_free(gb_buf(g, i));
    }
    di_free(&g->bi), di_free(&g->pos), di_free(&g->ind), di_free(&g->iptr), di_free(&g->last);
    di_free(&g->ids);
    ops_table_free(&g->t);
}

/* Fresh inputs (same shapes, same page table sizes), poisoned outputs. */
static void gb_fill(graph_bufs *g, tu_rng *rng, int32_t *ids) {
    ops_fill_state(rng, &g->va.t, &g->sa.t, 0, 1);
    ops_fill_state(rng, &g->vb.t, &g->sb.t, 1, 1);
    tu_fill_uniform(rng, &g->nv.t, -2, 2, 0);
    for (int64_t i = 0; i < GN * GS * GH; i++)
        tu_view_set(&g->ns.t, i, i % 7 == 3 ? -INFINITY : tu_rng_range(rng, -10, 10));
    tu_fill_uniform(rng, &g->ak.t, -3, 3, 0);
    tu_fill_uniform(rng, &g->av.t, -3, 3, 0);
    ops_fill_bytes(rng, &g->kc);
    ops_fill_bytes(rng, &g->vc);
    tu_fill_uniform(rng, &g->q.t, -2, 2, 0);
    tu_fill_uniform(rng, &g->k.t, -2, 2, 0);
    for (int i = 0; i < GT; i++) ids[i] = tu_rng_int(rng, 0, 70000);
    tu_buf_poison(&g->vo), tu_buf_poison(&g->so), tu_buf_poison(&g->nvo);
    tu_buf_poison(&g->nso), tu_buf_poison(&g->qo), tu_buf_poison(&g->ko);
}

/* Every buffer to the device (allocating the mirrors on the first call). */
static int gb_upload(graph_bufs *g, const int32_t *ids) {
    for (int i = 0; i < 18; i++) {
        tu_buf *b = gb_buf(g, i);
        if (!g->dm[i].dev) {
            if (dm_up(&g->dm[i], b, 0) != 1) return 0;
            g->d[i] = dm_view(&g->dm[i], b, &b->t);
        } else if (GU(gu.HtoD(g->dm[i].dev + GU_GUARD, b->base, b->bytes))) {
            return 0;
        }
    }
    if (!g->ids.dev) return di_up(&g->ids, ids, GT) == 1;
    return GU(gu.HtoD(g->ids.dev, ids, GT * 4)) == 0;
}

static int gb_download(graph_bufs *g) {
    int ok = 1;
    for (int i = 0; i < 18; i++) ok &= gu_mirror_down(&g->dm[i], gb_buf(g, i), "graph buffer");
    return ok;
}

/* The four ops on `stream`, as a serving step would issue them. */
static fi_status gb_ops(graph_bufs *g, fi_context *ctx, gu_stream stream) {
    fi_rope_params rp;
    fi_rope_params_init(&rp);
    rp.llama31 = 1;
    rp.rope_scale = 8.0f;
    rp.rope_theta = 5e5f;
    fi_tensor *d = g->d;
    fi_status st = fi_merge_state(ctx, &d[0], &d[1], &d[2], &d[3], &d[4], &d[5], stream);
    if (!st) st = fi_merge_states(ctx, &d[6], &d[7], &d[8], &d[9], stream);
    if (!st)
        st = fi_append_paged_kv_cache(ctx, &d[10], &d[11], &g->bi.t, &g->pos.t, &d[12], &d[13],
                                      FI_KV_LAYOUT_NHD, &g->ind.t, &g->iptr.t, &g->last.t,
                                      stream);
    if (!st) st = fi_rope_apply_pos_ids(ctx, &rp, &d[14], &d[15], &d[16], &d[17], &g->ids.t, stream);
    return st;
}

/* The references of the current host inputs, checked against the host
 * buffers after a run has been copied back. */
static int gb_check(graph_bufs *g, const void *kc_before, const void *vc_before,
                    const int32_t *ids) {
    int ok = 1;
    double *a = tu_view_read(&g->va.t), *la = tu_view_read(&g->sa.t);
    double *b = tu_view_read(&g->vb.t), *lb = tu_view_read(&g->sb.t);
    double *ref = malloc(sizeof(double) * GN * GH * GD), *lref = malloc(sizeof(double) * GN * GH);
    oracle_merge_state(GN, GH, GD, a, la, b, lb, ref, lref);
    ok &= ops_check_view("graph merge_state O", &g->vo.t, ref, tu_dtype_tol(FI_DTYPE_BF16));
    ok &= ops_check_view("graph merge_state LSE", &g->so.t, lref, 1e-5);
    double *nv = tu_view_read(&g->nv.t), *ns = tu_view_read(&g->ns.t);
    oracle_merge_states(GN, GS, GH, GD, nv, ns, ref, lref);
    ok &= ops_check_view("graph merge_states O", &g->nvo.t, ref, tu_dtype_tol(FI_DTYPE_BF16));
    ok &= ops_check_view("graph merge_states LSE", &g->nso.t, lref, 1e-5);
    /* append: the old caches with the reference's writes */
    void *wk = malloc(g->kc.bytes), *wv = malloc(g->vc.bytes);
    memcpy(wk, kc_before, g->kc.bytes);
    memcpy(wv, vc_before, g->vc.bytes);
    fi_tensor tk = ops_view_on(&g->kc.t, &g->kc, wk), tv = ops_view_on(&g->vc.t, &g->vc, wv);
    oracle_append_paged(&g->ak.t, &tk, FI_KV_LAYOUT_NHD, g->t.batch_indices, g->t.positions,
                        g->t.indices, g->t.indptr);
    oracle_append_paged(&g->av.t, &tv, FI_KV_LAYOUT_NHD, g->t.batch_indices, g->t.positions,
                        g->t.indices, g->t.indptr);
    ok &= ops_same_as_snapshot("graph k_cache", &g->kc, wk) &
          ops_same_as_snapshot("graph v_cache", &g->vc, wv);
    /* rope */
    fi_rope_params rp;
    fi_rope_params_init(&rp);
    rp.llama31 = 1;
    rp.rope_scale = 8.0f;
    rp.rope_theta = 5e5f;
    int64_t pos[GT];
    for (int i = 0; i < GT; i++) pos[i] = ids[i];
    double *xq = tu_view_read(&g->q.t), *xk = tu_view_read(&g->k.t);
    double *rq = malloc(sizeof(double) * GT * 2 * GH * GD), *rk = malloc(sizeof(double) * GT * GH * GD);
    oracle_rope(&rp, GT, 2 * GH, GD, xq, pos, rq);
    oracle_rope(&rp, GT, GH, GD, xk, pos, rk);
    ok &= ops_check_view("graph rope q", &g->qo.t, rq, tu_dtype_tol(FI_DTYPE_BF16));
    ok &= ops_check_view("graph rope k", &g->ko.t, rk, tu_dtype_tol(FI_DTYPE_BF16));
    free(a), free(la), free(b), free(lb), free(ref), free(lref), free(nv), free(ns);
    free(wk), free(wv), free(xq), free(xk), free(rq), free(rk);
    return ok;
}

/* Snapshot of every buffer's bytes (outputs after a run). */
static void **gb_snap(graph_bufs *g) {
    void **s = calloc(18, sizeof *s);
    for (int i = 0; s && i < 18; i++) s[i] = ops_snapshot(gb_buf(g, i));
    return s;
}

static void snaps_free(void **s) {
    for (int i = 0; s && i < 18; i++) free(s[i]);
    free(s);
}

static int case_graph(tu_rng *rng, const void *p) {
    const int cold = *(const int *)p; /* first use of the configurations inside the capture */
    graph_bufs g;
    int32_t ids[GT];
    append_cfg ac = {FI_DTYPE_BF16, FI_KV_LAYOUT_NHD, GPS, GB, GH, GD, GD, APPEND_DECODE, 0,
                     ALIGNED, 1, BAD_NONE};
    if (gb_alloc(&g) ||
        ops_table_make(rng, ac.shape, ac.batch, ac.page_size, ac.max_tokens, &g.t)) {
        tu_note("allocation failed");
        gb_free(&g);
        return 0;
    }
    /* decode appends GB tokens; the buffers hold GT rows: use the first
     * GB (the rest of append_k is unused padding the op never reads) */
    g.ak.t.shape[0] = g.av.t.shape[0] = g.t.nnz;
    gb_fill(&g, rng, ids);
    void *kc0 = ops_snapshot(&g.kc), *vc0 = ops_snapshot(&g.vc);
    if (!g_device) { /* host logic only */
        free(kc0), free(vc0);
        gb_free(&g);
        return SKIP;
    }
    fi_context *ctx = g_ctx;
    int ok = 1;
    if (cold) { /* a fresh context: its module cache is empty */
        fi_context_options opt;
        fi_context_options_init(&opt);
        opt.device = FI_DEVICE_CUDA;
        ok = ops_check_ok(fi_context_create(&opt, &ctx), "fi_context_create");
    }
    ok = ok && gb_upload(&g, ids) && di_up(&g.bi, g.t.batch_indices, g.t.nnz) == 1 &&
         di_up(&g.pos, g.t.positions, g.t.nnz) == 1 &&
         di_up(&g.ind, g.t.indices, g.t.num_indices) == 1 &&
         di_up(&g.iptr, g.t.indptr, g.t.batch + 1) == 1 &&
         di_up(&g.last, g.t.last, g.t.batch) == 1 && device_sync();
    for (int i = 10; i < 12 && ok; i++) g.d[i].shape[0] = g.t.nnz;
    void **eager = NULL;
    if (ok && !cold) { /* eager run: the reference and the bitwise target */
        ok = ops_check_ok(gb_ops(&g, ctx, g_stream), "eager ops") && device_sync() &&
             gb_download(&g);
        ok = ok && gb_check(&g, kc0, vc0, ids);
        eager = gb_snap(&g);
        /* determinism: the same inputs again, bitwise the same outputs */
        ok = ok && gb_upload(&g, ids) && device_sync();
        for (int i = 0; i < 18 && ok; i++) memcpy(gb_buf(&g, i)->base, eager[i], gb_buf(&g, i)->bytes);
    }
    gu_graph graph = NULL;
    gu_exec exec = NULL;
    if (ok) {
        ok = !GU(gu.BeginCapture(g_stream, 0 /* global mode */));
        fi_status st = ok ? gb_ops(&g, ctx, g_stream) : FI_OK;
        int end = GU(gu.EndCapture(g_stream, &graph));
        ok = ok && ops_check_ok(st, "ops inside a capture") && !end &&
             !GU(gu.GraphInstantiate(&exec, graph, 0));
    }
    /* replay on the inputs captured with, then on fresh ones */
    for (int round = 0; round < 3 && ok; round++) {
        if (round > 0) {
            gb_fill(&g, rng, ids);
            free(kc0), free(vc0);
            kc0 = ops_snapshot(&g.kc), vc0 = ops_snapshot(&g.vc);
            ok = gb_upload(&g, ids) && device_sync();
        } else {
            tu_buf_poison(&g.vo), tu_buf_poison(&g.so), tu_buf_poison(&g.nvo);
            tu_buf_poison(&g.nso), tu_buf_poison(&g.qo), tu_buf_poison(&g.ko);
            memcpy(g.kc.base, kc0, g.kc.bytes), memcpy(g.vc.base, vc0, g.vc.bytes);
            ok = gb_upload(&g, ids) && device_sync();
        }
        ok = ok && !GU(gu.GraphLaunch(exec, g_stream)) && device_sync() && gb_download(&g);
        if (ok && !gb_check(&g, kc0, vc0, ids)) {
            tu_note("graph replay %d differs from the references", round);
            ok = 0;
        }
        if (ok && round == 0 && eager) {
            for (int i = 0; i < 18; i++)
                if (memcmp(gb_buf(&g, i)->base, eager[i], gb_buf(&g, i)->bytes)) {
                    tu_note("graph replay: buffer %d is not bitwise the eager run", i);
                    ok = 0;
                }
        }
        if (ok && round == 2) { /* the same inputs eagerly: bitwise the replay */
            void **replay = gb_snap(&g);
            tu_buf_poison(&g.vo), tu_buf_poison(&g.so), tu_buf_poison(&g.nvo);
            tu_buf_poison(&g.nso), tu_buf_poison(&g.qo), tu_buf_poison(&g.ko);
            memcpy(g.kc.base, kc0, g.kc.bytes), memcpy(g.vc.base, vc0, g.vc.bytes);
            ok = gb_upload(&g, ids) && device_sync() &&
                 ops_check_ok(gb_ops(&g, ctx, g_stream), "eager ops") && device_sync() &&
                 gb_download(&g);
            for (int i = 0; i < 18 && ok; i++)
                if (memcmp(gb_buf(&g, i)->base, replay[i], gb_buf(&g, i)->bytes)) {
                    tu_note("eager run after replay: buffer %d is not bitwise the replay", i);
                    ok = 0;
                }
            snaps_free(replay);
        }
    }
    if (exec) gu.GraphExecDestroy(exec);
    if (graph) gu.GraphDestroy(graph);
    if (cold && ctx != g_ctx) fi_context_destroy(ctx);
    snaps_free(eager);
    free(kc0), free(vc0);
    gb_free(&g);
    return ok;
}

static void suite_graph(void) {
    static const int warm = 0, cold = 1;
    run_case("graph", "graph/warm/merge_state+merge_states+append+rope", case_graph, &warm);
    run_case("graph", "graph/cold_jit_inside_capture/merge_state+merge_states+append+rope",
             case_graph, &cold);
}

/* ================================================================= main */

int main(int argc, char **argv) {
    int rc = tu_parse_args(argc, argv,
                           "Standalone ops (merge, paged append, RoPE) on the CUDA backend\n"
                           "against the fp64 references of tests/oracle_ops.c.");
    if (rc) return rc;
    if (!tu_backend_selected("cuda")) return tu_summary("test_cuda_ops");
    if (!tu_opt.list) {
        if (gu_init(0) != 0) {
            printf("test_cuda_ops: no CUDA device (libcuda.so.1 or a GPU missing): "
                   "device runs skipped, host logic only\n");
        } else {
            fi_context_options opt;
            fi_context_options_init(&opt);
            opt.device = FI_DEVICE_CUDA;
            if (fi_context_create(&opt, &g_ctx) != FI_OK) {
                printf("test_cuda_ops: no CUDA context (%s): device runs skipped\n",
                       fi_last_error());
            } else if (GU(gu.StreamCreate(&g_stream, 1 /* non-blocking */))) {
                printf("test_cuda_ops: cannot create a stream: device runs skipped\n");
            } else {
                g_device = 1;
            }
        }
    }
    suite_merge();
    suite_append();
    suite_rope();
    suite_large();
    suite_graph();
    suite_nonfinite();
    if (g_stream) gu.StreamDestroy(g_stream);
    fi_context_destroy(g_ctx);
    return tu_summary("test_cuda_ops");
}
