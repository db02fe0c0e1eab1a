/*
 * ops_rope_quant.c — fi_rope_quantize_fp8 and
 * fi_rope_quantize_fp8_append_paged_kv_cache: every argument checked
 * (ranks, shapes against q_rope / k_rope, one input dtype, one FP8 output
 * dtype, the scales, the caches' layout and page size, outputs apart from
 * the inputs and from each other, and on host-memory backends pos_ids, the
 * page table and every token's slot), then the op lowered to the segments
 * of fi_rq_args (core/serving.h) for the backend's `rope_quant` entry.
 */
#include "core/ops_check.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void fi_rope_quant_args_init(fi_rope_quant_args *a) {
    if (!a) return;
    memset(a, 0, sizeof *a);
    a->struct_size = sizeof *a;
    a->is_neox = 1;
    a->quant_scale_q = 1.0f;
    a->quant_scale_kv = 1.0f;
    a->layout = FI_KV_LAYOUT_NHD;
}

/* A tensor argument as given: NULL when the pointer or its data is NULL. */
static const fi_tensor *given(const fi_tensor *t) { return t && t->data ? t : NULL; }

static fi_status must_be_absent(const fi_tensor *t, const char *fn, const char *name,
                                const char *why) {
    if (!given(t)) return FI_OK;
    return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: %s is given, but %s", fn, name, why);
}

/* An input of the op's one float dtype, rank ndim, shape (-1: any). */
static fi_status check_input(const fi_tensor *t, const char *fn, const char *name, int32_t ndim,
                             const int64_t *shape, fi_dtype dtype) {
    FI_OP_TRY(fi_op_float(t, fn, name, ndim, shape, false));
    if (t->dtype != dtype)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: %s.dtype is %s but q_rope.dtype is %s: the inputs share one dtype",
                        fn, name, fi_dtype_name(t->dtype), fi_dtype_name(dtype));
    return FI_OK;
}

/* An FP8 output (or cache) of dtype `od` and rank ndim, shape (-1: any). */
static fi_status check_output(const fi_tensor *t, const char *fn, const char *name, int32_t ndim,
                              const int64_t *shape, fi_dtype od) {
    char full[96];
    snprintf(full, sizeof full, "%s: %s", fn, name);
    if (!given(t))
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: tensor is NULL (an output)", full);
    if (t->dtype != od)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s.dtype is %s, expected %s (q_rope_out's: every output and cache is "
                        "one FP8 dtype)",
                        full, fi_dtype_name(t->dtype), fi_dtype_name(od));
    return fi_check_tensor(t, full, od, ndim, shape);
}

/* t [nnz, W] (MLA) as [nnz, 1, W]. */
static fi_tensor one_head(const fi_tensor *t) {
    fi_tensor v = *t;
    v.ndim = 3;
    v.shape[2] = t->shape[1], v.stride[2] = t->stride[1];
    v.shape[1] = 1, v.stride[1] = 0; /* one head: its stride is never used */
    return v;
}

/* A paged cache as [pages, page_size, H, W] (NHD order; HND by its
 * strides; a 3-D MLA cache with H = 1), columns [col, col + width). */
static fi_tensor cache_view(const fi_tensor *c, fi_kv_layout layout, int64_t col, int64_t width) {
    fi_tensor v = *c;
    v.ndim = 4;
    if (c->ndim == 3) {
        v.shape[3] = c->shape[2], v.stride[3] = c->stride[2];
        v.shape[2] = 1, v.stride[2] = 0;
    } else if (layout == FI_KV_LAYOUT_HND) {
        v.shape[1] = c->shape[2], v.stride[1] = c->stride[2];
        v.shape[2] = c->shape[1], v.stride[2] = c->stride[1];
    }
    v.data = (char *)c->data + col * v.stride[3] * (int64_t)fi_dtype_size(c->dtype);
    v.shape[3] = width;
    return v;
}

/* The page table and every token's slot, read on the host: batch_indices
 * name a request, kv_indptr is a CSR over kv_indices whose ids are pages,
 * and position p needs page p / page_size of its request. */
static fi_status check_slots(const fi_rq_args *a, const char *fn) {
    const fi_tensor *ptr = a->kv_indptr, *idx = a->kv_indices;
    const int64_t batch = ptr->shape[0] - 1;
    if (fi_op_i32_at(ptr, 0) != 0)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: kv_indptr[0]=%d, expected 0", fn,
                        (int)fi_op_i32_at(ptr, 0));
    for (int64_t b = 0; b < batch; b++) {
        int32_t lo = fi_op_i32_at(ptr, b), hi = fi_op_i32_at(ptr, b + 1);
        if (hi < lo)
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "%s: kv_indptr[%lld]=%d > kv_indptr[%lld]=%d: indptr must not "
                            "decrease",
                            fn, (long long)b, (int)lo, (long long)b + 1, (int)hi);
    }
    const int32_t used = fi_op_i32_at(ptr, batch);
    if (used > idx->shape[0])
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: kv_indptr[%lld]=%d is past kv_indices, which has %lld entries", fn,
                        (long long)batch, (int)used, (long long)idx->shape[0]);
    for (int32_t j = 0; j < used; j++) {
        int32_t page = fi_op_i32_at(idx, j);
        if (page < 0 || page >= a->pages)
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "%s: kv_indices[%d]=%d is not a page of the cache (it has %lld "
                            "pages)",
                            fn, (int)j, (int)page, (long long)a->pages);
    }
    for (int64_t t = 0; t < a->nnz; t++) {
        int32_t b = fi_op_i32_at(a->batch_indices, t), p = fi_op_i32_at(a->positions, t);
        if (b < 0 || b >= batch)
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "%s: batch_indices[%lld]=%d is outside the batch of %lld requests",
                            fn, (long long)t, (int)b, (long long)batch);
        int32_t pages = fi_op_i32_at(ptr, b + 1) - fi_op_i32_at(ptr, b);
        if (p < 0 || p / a->page_size >= pages)
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "%s: positions[%lld]=%d is outside request %d, whose %d pages of "
                            "%lld hold positions [0, %lld)",
                            fn, (long long)t, (int)p, (int)b, (int)pages,
                            (long long)a->page_size, (long long)pages * a->page_size);
    }
    return FI_OK;
}

/* The inputs: shapes, the dtype, the cos/sin cache, pos_ids, the scales. */
static fi_status check_inputs(const char *fn, const fi_rope_quant_args *u, bool append,
                              fi_rq_args *a, bool *mla) {
    FI_OP_TRY(fi_op_float(u->q_rope, fn, "q_rope", 3, NULL, false));
    const fi_dtype dt = u->q_rope->dtype;
    const int64_t nnz = u->q_rope->shape[0], hq = u->q_rope->shape[1], rot = u->q_rope->shape[2];
    if (rot < 2 || rot % 2)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: q_rope's last dim (the rotary dim R) is %lld; it must be even and "
                        ">= 2",
                        fn, (long long)rot);
    *mla = u->k_rope && u->k_rope->ndim == 2;
    const int64_t k3[3] = {nnz, -1, rot}, k2[2] = {nnz, rot};
    FI_OP_TRY(check_input(u->k_rope, fn, "k_rope", *mla ? 2 : 3, *mla ? k2 : k3, dt));
    const int64_t hk = *mla ? 1 : u->k_rope->shape[1];
    if (given(u->q_nope)) {
        const int64_t s[3] = {nnz, hq, -1};
        FI_OP_TRY(check_input(u->q_nope, fn, "q_nope", 3, s, dt));
    }
    if (given(u->k_nope)) {
        const int64_t s3[3] = {nnz, hk, -1}, s2[2] = {nnz, -1};
        FI_OP_TRY(check_input(u->k_nope, fn, "k_nope", *mla ? 2 : 3, *mla ? s2 : s3, dt));
    }
    if (!append)
        FI_OP_TRY(must_be_absent(u->v, fn, "v",
                                 "only fi_rope_quantize_fp8_append_paged_kv_cache takes v"));
    else if (*mla)
        FI_OP_TRY(must_be_absent(u->v, fn, "v",
                                 "k_rope is 2-D (MLA), whose paged cache holds no V"));
    else {
        if (!given(u->v))
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "%s: v is absent, but k_rope is 3-D (GQA/MHA): v [nnz, H_k, D_v] "
                            "is appended to v_cache",
                            fn);
        const int64_t s[3] = {nnz, hk, -1};
        FI_OP_TRY(check_input(u->v, fn, "v", 3, s, dt));
    }
    if (append && *mla && !given(u->k_nope))
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: k_nope is absent, but MLA appends it to ckv_cache", fn);
    char full[96];
    snprintf(full, sizeof full, "%s: cos_sin_cache", fn);
    FI_OP_TRY(fi_check_tensor(u->cos_sin_cache, full, FI_DTYPE_F32, 2, NULL));
    if (u->cos_sin_cache->shape[1] != rot)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: cos_sin_cache.shape[1]=%lld, expected %lld (R, q_rope's last dim)",
                        fn, (long long)u->cos_sin_cache->shape[1], (long long)rot);
    FI_OP_TRY(fi_op_index(u->pos_ids, fn, "pos_ids", nnz));
    const float sc[2] = {u->quant_scale_q, u->quant_scale_kv};
    static const char *const sn[2] = {"quant_scale_q", "quant_scale_kv"};
    for (int i = 0; i < 2; i++)
        if (!(sc[i] > 0.0f && isfinite(sc[i])))
            return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: %s=%g must be finite and > 0", fn,
                            sn[i], (double)sc[i]);
    a->nnz = nnz, a->rot = rot;
    a->cache = u->cos_sin_cache, a->pos_ids = u->pos_ids;
    a->neox = u->is_neox != 0;
    return FI_OK;
}

/* The segment of rows src (3-D, or MLA 2-D) into dst. */
static void add_seg(fi_rq_args *a, const fi_tensor *src, fi_tensor dst, bool rope, float scale) {
    fi_rq_seg *s = &a->seg[a->nseg++];
    s->src = src->ndim == 2 ? one_head(src) : *src;
    s->dst = dst;
    s->rope = rope;
    s->scale = scale;
}

static fi_tensor as_rows(const fi_tensor *t) { return t->ndim == 2 ? one_head(t) : *t; }

/* Q's outputs, then (plain) K's: shapes and the one FP8 dtype. */
static fi_status check_plain_outputs(const char *fn, const fi_rope_quant_args *u, bool append,
                                     fi_rq_args *a, fi_dtype *od) {
    const fi_tensor *qr = u->q_rope;
    if (!given(u->q_rope_out))
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: q_rope_out: tensor is NULL (an output)",
                        fn);
    *od = u->q_rope_out->dtype;
    if (*od != FI_DTYPE_E4M3 && *od != FI_DTYPE_E5M2)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: q_rope_out.dtype is %s, expected e4m3 or e5m2", fn,
                        fi_dtype_name(*od));
    FI_OP_TRY(check_output(u->q_rope_out, fn, "q_rope_out", 3, qr->shape, *od));
    add_seg(a, qr, *u->q_rope_out, true, u->quant_scale_q);
    if (given(u->q_nope)) {
        FI_OP_TRY(check_output(u->q_nope_out, fn, "q_nope_out", 3, u->q_nope->shape, *od));
        add_seg(a, u->q_nope, *u->q_nope_out, false, u->quant_scale_q);
    } else {
        FI_OP_TRY(must_be_absent(u->q_nope_out, fn, "q_nope_out", "q_nope is absent"));
    }
    a->nq = a->nseg;
    if (append) {
        static const char *const why = "the append form writes K into the paged cache";
        FI_OP_TRY(must_be_absent(u->k_rope_out, fn, "k_rope_out", why));
        return must_be_absent(u->k_nope_out, fn, "k_nope_out", why);
    }
    const fi_tensor *kr = u->k_rope;
    FI_OP_TRY(check_output(u->k_rope_out, fn, "k_rope_out", kr->ndim, kr->shape, *od));
    add_seg(a, kr, as_rows(u->k_rope_out), true, u->quant_scale_kv);
    if (given(u->k_nope)) {
        const fi_tensor *kn = u->k_nope;
        FI_OP_TRY(check_output(u->k_nope_out, fn, "k_nope_out", kn->ndim, kn->shape, *od));
        add_seg(a, kn, as_rows(u->k_nope_out), false, u->quant_scale_kv);
    } else {
        FI_OP_TRY(must_be_absent(u->k_nope_out, fn, "k_nope_out", "k_nope is absent"));
    }
    static const char *const why = "fi_rope_quantize_fp8 writes no paged cache (call "
                                   "fi_rope_quantize_fp8_append_paged_kv_cache)";
    const fi_tensor *pg[] = {u->k_cache, u->v_cache, u->ckv_cache, u->kpe_cache, u->kv_indices,
                             u->kv_indptr, u->batch_indices, u->positions};
    static const char *const pn[] = {"k_cache", "v_cache", "ckv_cache", "kpe_cache",
                                     "kv_indices", "kv_indptr", "batch_indices", "positions"};
    for (int i = 0; i < 8; i++) FI_OP_TRY(must_be_absent(pg[i], fn, pn[i], why));
    return FI_OK;
}

/* The paged caches and the page table; K's (and V's) segments into them. */
static fi_status check_caches(const char *fn, const fi_rope_quant_args *u, bool mla,
                              fi_dtype od, fi_rq_args *a) {
    const int64_t rot = a->rot, nk = given(u->k_nope) ? u->k_nope->shape[u->k_nope->ndim - 1] : 0;
    const fi_kv_layout layout = u->layout;
    if (layout != FI_KV_LAYOUT_NHD && layout != FI_KV_LAYOUT_HND)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: layout=%d is neither NHD nor HND", fn,
                        (int)layout);
    const fi_tensor *first;
    if (mla) {
        static const char *const why = "k_rope is 2-D (MLA): K goes to ckv_cache and kpe_cache";
        FI_OP_TRY(must_be_absent(u->k_cache, fn, "k_cache", why));
        FI_OP_TRY(must_be_absent(u->v_cache, fn, "v_cache", why));
        const int64_t s[3] = {-1, -1, nk};
        FI_OP_TRY(check_output(u->ckv_cache, fn, "ckv_cache", 3, s, od));
        first = u->ckv_cache;
        const int64_t ks[3] = {first->shape[0], first->shape[1], rot};
        FI_OP_TRY(check_output(u->kpe_cache, fn, "kpe_cache", 3, ks, od));
    } else {
        static const char *const why =
            "k_rope is 3-D (GQA/MHA): K and V go to k_cache and v_cache";
        FI_OP_TRY(must_be_absent(u->ckv_cache, fn, "ckv_cache", why));
        FI_OP_TRY(must_be_absent(u->kpe_cache, fn, "kpe_cache", why));
        const int64_t hk = u->k_rope->shape[1], nhd = layout == FI_KV_LAYOUT_NHD;
        int64_t s[4] = {-1, nhd ? -1 : hk, nhd ? hk : -1, rot + nk};
        FI_OP_TRY(check_output(u->k_cache, fn, "k_cache", 4, s, od));
        first = u->k_cache;
        s[0] = first->shape[0], s[nhd ? 1 : 2] = first->shape[nhd ? 1 : 2];
        s[3] = u->v->shape[2];
        FI_OP_TRY(check_output(u->v_cache, fn, "v_cache", 4, s, od));
    }
    a->pages = first->shape[0];
    a->page_size = first->shape[mla || layout == FI_KV_LAYOUT_NHD ? 1 : 2];
    if (a->page_size < 1 || a->page_size > INT32_MAX)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: the cache has page_size %lld", fn,
                        (long long)a->page_size);
    FI_OP_TRY(fi_op_index(u->batch_indices, fn, "batch_indices", a->nnz));
    FI_OP_TRY(fi_op_index(u->positions, fn, "positions", a->nnz));
    FI_OP_TRY(fi_op_index(u->kv_indptr, fn, "kv_indptr", -1));
    if (u->kv_indptr->shape[0] < 1 || u->kv_indptr->shape[0] - 1 > INT32_MAX)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: kv_indptr has %lld entries, expected batch size + 1", fn,
                        (long long)u->kv_indptr->shape[0]);
    FI_OP_TRY(fi_op_index(u->kv_indices, fn, "kv_indices", -1));
    a->batch_indices = u->batch_indices, a->positions = u->positions;
    a->kv_indptr = u->kv_indptr, a->kv_indices = u->kv_indices;
    const float s = u->quant_scale_kv;
    if (mla) {
        add_seg(a, u->k_rope, cache_view(u->kpe_cache, layout, 0, rot), true, s);
        add_seg(a, u->k_nope, cache_view(u->ckv_cache, layout, 0, nk), false, s);
    } else {
        add_seg(a, u->k_rope, cache_view(u->k_cache, layout, 0, rot), true, s);
        if (nk) add_seg(a, u->k_nope, cache_view(u->k_cache, layout, rot, nk), false, s);
        add_seg(a, u->v, cache_view(u->v_cache, layout, 0, u->v->shape[2]), false, s);
    }
    return FI_OK;
}

static fi_status rope_quant(fi_context *ctx, const char *fn, const fi_rope_quant_args *u,
                            bool append, void *stream) {
    FI_OP_CONTEXT(ctx, fn, rope_quant);
    if (!u) return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: args is NULL", fn);
    if (u->struct_size != sizeof *u)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: fi_rope_quant_args.struct_size=%u, expected %zu: call "
                        "fi_rope_quant_args_init first",
                        fn, (unsigned)u->struct_size, sizeof *u);
    fi_rq_args a;
    memset(&a, 0, sizeof a);
    a.append = append;
    bool mla = false;
    fi_dtype od = FI_DTYPE_E4M3;
    FI_OP_TRY(check_inputs(fn, u, append, &a, &mla));
    FI_OP_TRY(check_plain_outputs(fn, u, append, &a, &od));
    if (append) FI_OP_TRY(check_caches(fn, u, mla, od, &a));
    {
        /* the four outputs of the form: Q's, then K's rows or the two caches */
        const fi_tensor *ca = mla ? u->ckv_cache : u->k_cache, *cb = mla ? u->kpe_cache : u->v_cache;
        const fi_tensor *outs[] = {u->q_rope_out, given(u->q_nope_out),
                                   append ? ca : u->k_rope_out,
                                   append ? cb : given(u->k_nope_out)};
        const char *on[] = {"q_rope_out", "q_nope_out",
                            append ? (mla ? "ckv_cache" : "k_cache") : "k_rope_out",
                            append ? (mla ? "kpe_cache" : "v_cache") : "k_nope_out"};
        const fi_tensor *ins[] = {u->q_rope, given(u->q_nope), u->k_rope, given(u->k_nope),
                                  given(u->v), u->cos_sin_cache, u->pos_ids,
                                  append ? u->kv_indices : NULL, append ? u->kv_indptr : NULL,
                                  append ? u->batch_indices : NULL,
                                  append ? u->positions : NULL};
        static const char *const in[] = {"q_rope", "q_nope", "k_rope", "k_nope", "v",
                                         "cos_sin_cache", "pos_ids", "kv_indices", "kv_indptr",
                                         "batch_indices", "positions"};
        char names[4][96];
        const char *full[4];
        for (int i = 0; i < 4; i++) {
            snprintf(names[i], sizeof names[i], "%s: %s", fn, on[i]);
            full[i] = names[i];
        }
        FI_OP_TRY(fi_check_apart(outs, full, 4, ins, in, 11));
    }
    if (ctx->backend->host_memory) {
        const int64_t max_pos = a.cache->shape[0];
        for (int64_t t = 0; t < a.nnz; t++) {
            int32_t p = fi_op_i32_at(a.pos_ids, t);
            if (p < 0 || p >= max_pos)
                return fi_error(FI_STATUS_INVALID_ARGUMENT,
                                "%s: pos_ids[%lld]=%d is not a row of cos_sin_cache (it has "
                                "%lld)",
                                fn, (long long)t, (int)p, (long long)max_pos);
        }
        if (append) FI_OP_TRY(check_slots(&a, fn));
    }
    if (a.nnz == 0) return FI_OK;
    return ctx->backend->rope_quant(ctx, &a, stream);
}

fi_status fi_rope_quantize_fp8(fi_context *ctx, const fi_rope_quant_args *args, void *stream) {
    return rope_quant(ctx, "fi_rope_quantize_fp8", args, false, stream);
}

fi_status fi_rope_quantize_fp8_append_paged_kv_cache(fi_context *ctx,
                                                     const fi_rope_quant_args *args,
                                                     void *stream) {
    return rope_quant(ctx, "fi_rope_quantize_fp8_append_paged_kv_cache", args, true, stream);
}
