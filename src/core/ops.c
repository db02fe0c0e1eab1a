/*
 * ops.c — the public standalone ops: merging attention states, appending to
 * a paged KV cache, RoPE. Each one checks every argument (NULLs, dtypes,
 * ranks, shapes agreeing across tensors, and where the backend's tensors
 * are host memory the index values themselves) before the backend reads or
 * writes anything, then dispatches through ctx->backend.
 *
 * Index tensors (batch_indices, positions, kv_indptr ...) are int32 and
 * contiguous. On a CUDA context they live in device memory, so their values
 * cannot be read here: only their shapes are checked.
 */
#include "core/internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------- helpers */

/* A live context whose backend has the op: `op` is its member of fi_backend,
 * read only once the context is known to be one. */
#define CHECK_CTX(ctx, fn, op)                                                             \
    do {                                                                                   \
        fi_status cst_ = fi_context_check((ctx), (fn));                                    \
        if (!cst_ && !(ctx)->backend->op)                                                  \
            cst_ = fi_error(FI_STATUS_UNSUPPORTED, "%s: not supported by the %s backend", \
                            (fn), (ctx)->backend->name);                                   \
        if (cst_) return cst_;                                                             \
    } while (0)

static bool is_float_dtype(fi_dtype d) {
    return d == FI_DTYPE_F32 || d == FI_DTYPE_F16 || d == FI_DTYPE_BF16;
}

static bool is_kv_dtype(fi_dtype d) {
    return is_float_dtype(d) || d == FI_DTYPE_E4M3 || d == FI_DTYPE_E5M2;
}

/* A value tensor of f32, f16 or bf16; shape entries of -1 match anything. */
static fi_status check_float(const fi_tensor *t, const char *name, int32_t ndim,
                             const int64_t *shape) {
    if (t && !is_float_dtype(t->dtype))
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s.dtype is %s, expected f32, f16 or bf16", name,
                        fi_dtype_name(t->dtype));
    return fi_check_tensor(t, name, t ? t->dtype : FI_DTYPE_F32, ndim, shape);
}

/* A contiguous int32 index tensor of `len` entries. */
static fi_status check_index(const fi_tensor *t, const char *name, int64_t len) {
    fi_status st = fi_check_tensor(t, name, FI_DTYPE_I32, 1, &len);
    if (st) return st;
    if (t->shape[0] > 1 && t->stride[0] != 1)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s.stride[0]=%lld: index tensors must be contiguous", name,
                        (long long)t->stride[0]);
    return FI_OK;
}

/* An output may be its input (in place) only as the very same view, and
 * shares no memory with anything else. */
static fi_status check_alias(const fi_tensor *out, const char *out_name,
                             const fi_tensor *in, const char *in_name) {
    return fi_check_disjoint(out, out_name, in, in_name, true);
}

/* Output `out` shares no memory with any of others[0..n) (NULL entries
 * skipped), nor within itself. */
static fi_status check_apart(const fi_tensor *out, const char *out_name,
                             const fi_tensor *const *others, const char *const *names, int n) {
    fi_status st = fi_check_no_self_overlap(out, out_name);
    for (int i = 0; i < n && !st; i++)
        if (others[i]) st = fi_check_disjoint(out, out_name, others[i], names[i], false);
    return st;
}

/* A head dimension the backends' int32 loops can hold. */
static fi_status check_dim(int64_t dim, const char *name) {
    if (dim > INT32_MAX)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s=%lld is too large", name,
                        (long long)dim);
    return FI_OK;
}

#define FI_TRY(expr)                      \
    do {                                  \
        fi_status st_ = (expr);           \
        if (st_ != FI_OK) return st_;     \
    } while (0)

/* -------------------------------------------------------------- merge */

fi_status fi_merge_state(fi_context *ctx, const fi_tensor *v_a, const fi_tensor *s_a,
                         const fi_tensor *v_b, const fi_tensor *s_b, fi_tensor *v_out,
                         fi_tensor *s_out, void *stream) {
    CHECK_CTX(ctx, "fi_merge_state", merge_state);
    FI_TRY(check_float(v_a, "fi_merge_state: v_a", 3, NULL));
    const int64_t v_shape[3] = {v_a->shape[0], v_a->shape[1], v_a->shape[2]};
    const int64_t s_shape[2] = {v_a->shape[0], v_a->shape[1]};
    FI_TRY(check_dim(v_shape[2], "fi_merge_state: v_a.shape[2]"));
    FI_TRY(fi_check_tensor(s_a, "fi_merge_state: s_a", FI_DTYPE_F32, 2, s_shape));
    FI_TRY(check_float(v_b, "fi_merge_state: v_b", 3, v_shape));
    FI_TRY(fi_check_tensor(s_b, "fi_merge_state: s_b", FI_DTYPE_F32, 2, s_shape));
    FI_TRY(check_float(v_out, "fi_merge_state: v_out", 3, v_shape));
    FI_TRY(fi_check_tensor(s_out, "fi_merge_state: s_out", FI_DTYPE_F32, 2, s_shape));
    FI_TRY(check_alias(v_out, "fi_merge_state: v_out", v_a, "v_a"));
    FI_TRY(check_alias(v_out, "fi_merge_state: v_out", v_b, "v_b"));
    FI_TRY(check_alias(s_out, "fi_merge_state: s_out", s_a, "s_a"));
    FI_TRY(check_alias(s_out, "fi_merge_state: s_out", s_b, "s_b"));
    {
        const fi_tensor *vs[] = {s_a, s_b, s_out}, *ss[] = {v_a, v_b};
        static const char *const vn[] = {"s_a", "s_b", "s_out"}, *const sn[] = {"v_a", "v_b"};
        FI_TRY(check_apart(v_out, "fi_merge_state: v_out", vs, vn, 3));
        FI_TRY(check_apart(s_out, "fi_merge_state: s_out", ss, sn, 2));
    }
    return ctx->backend->merge_state(ctx, v_a, s_a, v_b, s_b, v_out, s_out, stream);
}

fi_status fi_merge_state_in_place(fi_context *ctx, fi_tensor *v, fi_tensor *s,
                                  const fi_tensor *v_other, const fi_tensor *s_other,
                                  const fi_tensor *mask, void *stream) {
    CHECK_CTX(ctx, "fi_merge_state_in_place", merge_state_in_place);
    FI_TRY(check_float(v, "fi_merge_state_in_place: v", 3, NULL));
    const int64_t v_shape[3] = {v->shape[0], v->shape[1], v->shape[2]};
    const int64_t s_shape[2] = {v->shape[0], v->shape[1]};
    FI_TRY(check_dim(v_shape[2], "fi_merge_state_in_place: v.shape[2]"));
    FI_TRY(fi_check_tensor(s, "fi_merge_state_in_place: s", FI_DTYPE_F32, 2, s_shape));
    FI_TRY(check_float(v_other, "fi_merge_state_in_place: v_other", 3, v_shape));
    FI_TRY(fi_check_tensor(s_other, "fi_merge_state_in_place: s_other", FI_DTYPE_F32, 2,
                           s_shape));
    if (mask && mask->data)
        FI_TRY(fi_check_tensor(mask, "fi_merge_state_in_place: mask", FI_DTYPE_U8, 1,
                               v_shape));
    {
        const fi_tensor *m = mask && mask->data ? mask : NULL;
        const fi_tensor *vs[] = {v_other, s_other, s, m}, *ss[] = {v_other, s_other, m};
        static const char *const vn[] = {"v_other", "s_other", "s", "mask"};
        static const char *const sn[] = {"v_other", "s_other", "mask"};
        FI_TRY(check_apart(v, "fi_merge_state_in_place: v", vs, vn, 4));
        FI_TRY(check_apart(s, "fi_merge_state_in_place: s", ss, sn, 3));
    }
    return ctx->backend->merge_state_in_place(ctx, v, s, v_other, s_other,
                                              (mask && mask->data) ? mask : NULL, stream);
}

fi_status fi_merge_states(fi_context *ctx, const fi_tensor *v, const fi_tensor *s,
                          fi_tensor *v_out, fi_tensor *s_out, void *stream) {
    CHECK_CTX(ctx, "fi_merge_states", merge_states);
    FI_TRY(check_float(v, "fi_merge_states: v", 4, NULL));
    const int64_t s_shape[3] = {v->shape[0], v->shape[1], v->shape[2]};
    const int64_t vo_shape[3] = {v->shape[0], v->shape[2], v->shape[3]};
    const int64_t so_shape[2] = {v->shape[0], v->shape[2]};
    FI_TRY(check_dim(v->shape[3], "fi_merge_states: v.shape[3]"));
    FI_TRY(fi_check_tensor(s, "fi_merge_states: s", FI_DTYPE_F32, 3, s_shape));
    FI_TRY(check_float(v_out, "fi_merge_states: v_out", 3, vo_shape));
    FI_TRY(fi_check_tensor(s_out, "fi_merge_states: s_out", FI_DTYPE_F32, 2, so_shape));
    {
        const fi_tensor *vs[] = {v, s, s_out}, *ss[] = {v, s};
        static const char *const vn[] = {"v", "s", "s_out"}, *const sn[] = {"v", "s"};
        FI_TRY(check_apart(v_out, "fi_merge_states: v_out", vs, vn, 3));
        FI_TRY(check_apart(s_out, "fi_merge_states: s_out", ss, sn, 2));
    }
    return ctx->backend->merge_states(ctx, v, s, v_out, s_out, stream);
}

/* --------------------------------------------------------- paged append */

/* The cache holding `rows` ([nnz, H, D]): same dtype, [pages, ps, H, D]
 * (NHD) or [pages, H, ps, D] (HND); pages and ps -1 = take from the tensor. */
static fi_status check_cache(const fi_tensor *cache, const char *name, const fi_tensor *rows,
                             const char *rows_name, fi_kv_layout layout, int64_t pages,
                             int64_t page_size) {
    if (cache && rows && cache->dtype != rows->dtype)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "fi_append_paged_kv_cache: %s.dtype is %s but %s.dtype is %s: "
                        "the cache and the appended rows must share a dtype",
                        name, fi_dtype_name(cache->dtype), rows_name,
                        fi_dtype_name(rows->dtype));
    int64_t heads = rows->shape[1], dim = rows->shape[2];
    int64_t shape[4] = {pages, page_size, heads, dim};
    if (layout == FI_KV_LAYOUT_HND) {
        shape[1] = heads;
        shape[2] = page_size;
    }
    char full[96];
    snprintf(full, sizeof full, "fi_append_paged_kv_cache: %s", name);
    return fi_check_tensor(cache, full, rows->dtype, 4, shape);
}

/* kv_indptr, kv_indices, kv_last_page_len: the page table after the append. */
static fi_status check_page_table(const int32_t *indptr, const int32_t *indices,
                                  const int32_t *last, int32_t batch, int64_t num_indices,
                                  int64_t pages, int64_t page_size) {
    FI_TRY(fi_check_indptr(indptr, batch, "kv_indptr", num_indices));
    for (int32_t j = 0; j < indptr[batch]; j++)
        if (indices[j] < 0 || indices[j] >= pages)
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "kv_indices[%d]=%d is not a page of the cache (it has %lld pages)",
                            (int)j, (int)indices[j], (long long)pages);
    for (int32_t b = 0; b < batch; b++) {
        bool empty = indptr[b + 1] == indptr[b];
        if (last[b] < (empty ? 0 : 1) || last[b] > page_size)
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "kv_last_page_len[%d]=%d is outside [%d, page_size %lld]",
                            (int)b, (int)last[b], empty ? 0 : 1, (long long)page_size);
    }
    return FI_OK;
}

/* Every new token's request and position lie inside the table. */
static fi_status check_token_slots(const int32_t *batch_indices, const int32_t *positions,
                                   int64_t nnz, const int32_t *indptr, const int32_t *last,
                                   int32_t batch, int64_t page_size) {
    for (int64_t n = 0; n < nnz; n++) {
        int32_t b = batch_indices[n], p = positions[n];
        if (b < 0 || b >= batch)
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "batch_indices[%lld]=%d is outside the batch of %d requests",
                            (long long)n, (int)b, (int)batch);
        int32_t num_pages = indptr[b + 1] - indptr[b];
        int64_t len = num_pages ? page_size * (num_pages - 1) + last[b] : 0;
        if (p < 0 || p >= len)
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "positions[%lld]=%d is outside request %d, whose length is %lld "
                            "(from kv_indptr and kv_last_page_len)",
                            (long long)n, (int)p, (int)b, (long long)len);
    }
    return FI_OK;
}

fi_status fi_append_paged_kv_cache(fi_context *ctx, const fi_tensor *append_k,
                                   const fi_tensor *append_v,
                                   const fi_tensor *batch_indices,
                                   const fi_tensor *positions, fi_tensor *k_cache,
                                   fi_tensor *v_cache, fi_kv_layout layout,
                                   const fi_tensor *kv_indices, const fi_tensor *kv_indptr,
                                   const fi_tensor *kv_last_page_len, void *stream) {
    const char *fn = "fi_append_paged_kv_cache";
    CHECK_CTX(ctx, fn, append_paged_kv_cache);
    if (layout != FI_KV_LAYOUT_NHD && layout != FI_KV_LAYOUT_HND)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: layout=%d is neither NHD nor HND",
                        fn, (int)layout);
    if (append_k && !is_kv_dtype(append_k->dtype))
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: append_k.dtype is %s, expected f32, f16, bf16, e4m3 or e5m2", fn,
                        fi_dtype_name(append_k->dtype));
    if (append_v && !is_kv_dtype(append_v->dtype))
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: append_v.dtype is %s, expected f32, f16, bf16, e4m3 or e5m2", fn,
                        fi_dtype_name(append_v->dtype));
    FI_TRY(fi_check_tensor(append_k, "fi_append_paged_kv_cache: append_k",
                           append_k ? append_k->dtype : FI_DTYPE_F32, 3, NULL));
    const int64_t nnz = append_k->shape[0], heads = append_k->shape[1];
    const int64_t v_rows[3] = {nnz, heads, -1};
    FI_TRY(fi_check_tensor(append_v, "fi_append_paged_kv_cache: append_v",
                           append_v ? append_v->dtype : FI_DTYPE_F32, 3, v_rows));
    FI_TRY(check_cache(k_cache, "k_cache", append_k, "append_k", layout, -1, -1));
    const int64_t pages = k_cache->shape[0];
    const int64_t page_size = k_cache->shape[layout == FI_KV_LAYOUT_NHD ? 1 : 2];
    if (page_size < 1 || page_size > INT32_MAX)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: k_cache has page_size %lld", fn,
                        (long long)page_size);
    FI_TRY(check_cache(v_cache, "v_cache", append_v, "append_v", layout, pages, page_size));

    FI_TRY(check_index(batch_indices, "fi_append_paged_kv_cache: batch_indices", nnz));
    FI_TRY(check_index(positions, "fi_append_paged_kv_cache: positions", nnz));
    FI_TRY(check_index(kv_indptr, "fi_append_paged_kv_cache: kv_indptr", -1));
    if (kv_indptr->shape[0] < 1 || kv_indptr->shape[0] - 1 > INT32_MAX)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: kv_indptr has %lld entries, expected batch size + 1", fn,
                        (long long)kv_indptr->shape[0]);
    const int32_t batch = (int32_t)(kv_indptr->shape[0] - 1);
    FI_TRY(check_index(kv_last_page_len, "fi_append_paged_kv_cache: kv_last_page_len", batch));
    FI_TRY(check_index(kv_indices, "fi_append_paged_kv_cache: kv_indices", -1));

    {
        const fi_tensor *ins[] = {append_k, append_v, batch_indices, positions, kv_indices,
                                  kv_indptr, kv_last_page_len};
        static const char *const names[] = {"append_k", "append_v", "batch_indices",
                                            "positions", "kv_indices", "kv_indptr",
                                            "kv_last_page_len"};
        FI_TRY(check_apart(k_cache, "fi_append_paged_kv_cache: k_cache", ins, names, 7));
        FI_TRY(check_apart(v_cache, "fi_append_paged_kv_cache: v_cache", ins, names, 7));
        FI_TRY(fi_check_disjoint(k_cache, "fi_append_paged_kv_cache: k_cache", v_cache,
                                 "v_cache", false));
    }
    if (ctx->backend->host_memory) {
        FI_TRY(check_page_table(kv_indptr->data, kv_indices->data, kv_last_page_len->data,
                                batch, kv_indices->shape[0], pages, page_size));
        FI_TRY(check_token_slots(batch_indices->data, positions->data, nnz, kv_indptr->data,
                                 kv_last_page_len->data, batch, page_size));
    }
    return ctx->backend->append_paged_kv_cache(ctx, append_k, append_v, batch_indices,
                                               positions, k_cache, v_cache, layout,
                                               kv_indices, kv_indptr, kv_last_page_len,
                                               stream);
}

/* ----------------------------------------------------------------- RoPE */

/* The caller's params, checked against the head dim, rotary_dim resolved. */
static fi_status resolve_rope_params(const fi_rope_params *in, int64_t head_dim,
                                     const char *fn, fi_rope_params *out) {
    if (!in) return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: params is NULL", fn);
    if (in->struct_size != sizeof *out)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: fi_rope_params.struct_size=%u, expected %zu: call "
                        "fi_rope_params_init first", fn, (unsigned)in->struct_size, sizeof *out);
    *out = *in;
    if (out->rotary_dim == 0) out->rotary_dim = (int32_t)head_dim;
    out->interleave = out->interleave != 0;
    out->llama31 = out->llama31 != 0;
    if (out->rotary_dim < 2 || out->rotary_dim % 2 || out->rotary_dim > head_dim)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: rotary_dim=%d must be even and in [2, head_dim %lld]", fn,
                        (int)out->rotary_dim, (long long)head_dim);
    if (!(out->rope_scale > 0.0f) || !isfinite(out->rope_scale))
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: rope_scale=%g must be > 0", fn,
                        (double)out->rope_scale);
    if (!(out->rope_theta > 0.0f) || !isfinite(out->rope_theta))
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: rope_theta=%g must be > 0", fn,
                        (double)out->rope_theta);
    if (out->llama31) {
        float low = out->low_freq_factor, high = out->high_freq_factor;
        if (!(low > 0.0f) || !(high > low) || !isfinite(high))
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "%s: llama31 needs 0 < low_freq_factor < high_freq_factor, got "
                            "%g and %g", fn, (double)low, (double)high);
        if (!(out->old_context_len > 0.0f) || !isfinite(out->old_context_len))
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "%s: old_context_len=%g must be > 0", fn,
                            (double)out->old_context_len);
    }
    return FI_OK;
}

/* q, k and their outputs: [nnz, H_qo, D], [nnz, H_kv, D], outputs the same
 * shape and dtype as their inputs, in place only as the same view. */
static fi_status check_rope_tensors(const fi_tensor *q, const fi_tensor *k,
                                    const fi_tensor *q_out, const fi_tensor *k_out,
                                    const char *fn) {
    char name[80];
    snprintf(name, sizeof name, "%s: q", fn);
    FI_TRY(check_float(q, name, 3, NULL));
    const int64_t nnz = q->shape[0], dim = q->shape[2];
    FI_TRY(check_dim(dim, "head dim (q.shape[2])"));
    const int64_t k_shape[3] = {nnz, -1, dim};
    snprintf(name, sizeof name, "%s: k", fn);
    FI_TRY(check_float(k, name, 3, k_shape));
    snprintf(name, sizeof name, "%s: q_out", fn);
    FI_TRY(fi_check_tensor(q_out, name, q->dtype, 3, q->shape));
    FI_TRY(check_alias(q_out, name, q, "q"));
    snprintf(name, sizeof name, "%s: k_out", fn);
    FI_TRY(fi_check_tensor(k_out, name, k->dtype, 3, k->shape));
    FI_TRY(check_alias(k_out, name, k, "k"));
    return FI_OK;
}

/* The outputs apart from everything they are not the very same view of:
 * each other, the other input, the index tensors (idx[0..n), NULL
 * skipped), and themselves. */
static fi_status check_rope_apart(const fi_tensor *q, const fi_tensor *k, const fi_tensor *q_out,
                                  const fi_tensor *k_out, const fi_tensor *const *idx,
                                  const char *const *idx_names, int n, const char *fn) {
    char qn[80], kn[80];
    snprintf(qn, sizeof qn, "%s: q_out", fn);
    snprintf(kn, sizeof kn, "%s: k_out", fn);
    const fi_tensor *qs[] = {k, k_out, idx[0], n > 1 ? idx[1] : NULL};
    const fi_tensor *ks[] = {q, idx[0], n > 1 ? idx[1] : NULL};
    const char *qnames[] = {"k", "k_out", idx_names[0], n > 1 ? idx_names[1] : ""};
    const char *knames[] = {"q", idx_names[0], n > 1 ? idx_names[1] : ""};
    FI_TRY(check_apart(q_out, qn, qs, qnames, 4));
    FI_TRY(check_apart(k_out, kn, ks, knames, 3));
    return FI_OK;
}

fi_status fi_rope_apply(fi_context *ctx, const fi_rope_params *params, const fi_tensor *q,
                        const fi_tensor *k, fi_tensor *q_out, fi_tensor *k_out,
                        const fi_tensor *indptr, const fi_tensor *offsets, void *stream) {
    const char *fn = "fi_rope_apply";
    CHECK_CTX(ctx, fn, rope);
    FI_TRY(check_rope_tensors(q, k, q_out, k_out, fn));
    fi_rope_params p;
    FI_TRY(resolve_rope_params(params, q->shape[2], fn, &p));
    FI_TRY(check_index(indptr, "fi_rope_apply: indptr", -1));
    if (indptr->shape[0] < 1 || indptr->shape[0] - 1 > INT32_MAX)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: indptr has %lld entries, expected batch size + 1", fn,
                        (long long)indptr->shape[0]);
    const int32_t batch = (int32_t)(indptr->shape[0] - 1);
    FI_TRY(check_index(offsets, "fi_rope_apply: offsets", batch));
    {
        const fi_tensor *idx[] = {indptr, offsets};
        static const char *const names[] = {"indptr", "offsets"};
        FI_TRY(check_rope_apart(q, k, q_out, k_out, idx, names, 2, fn));
    }
    if (ctx->backend->host_memory) {
        /* Tokens past indptr[B] belong to no request and are left alone. */
        FI_TRY(fi_check_indptr(indptr->data, batch, "indptr", q->shape[0]));
        const int32_t *off = offsets->data;
        for (int32_t b = 0; b < batch; b++)
            if (off[b] < 0)
                return fi_error(FI_STATUS_INVALID_ARGUMENT,
                                "%s: offsets[%d]=%d: positions must not be negative", fn,
                                (int)b, (int)off[b]);
    }
    return ctx->backend->rope(ctx, &p, q, k, q_out, k_out, NULL, indptr, offsets, stream);
}

fi_status fi_rope_apply_pos_ids(fi_context *ctx, const fi_rope_params *params,
                                const fi_tensor *q, const fi_tensor *k, fi_tensor *q_out,
                                fi_tensor *k_out, const fi_tensor *pos_ids, void *stream) {
    const char *fn = "fi_rope_apply_pos_ids";
    CHECK_CTX(ctx, fn, rope);
    FI_TRY(check_rope_tensors(q, k, q_out, k_out, fn));
    fi_rope_params p;
    FI_TRY(resolve_rope_params(params, q->shape[2], fn, &p));
    FI_TRY(check_index(pos_ids, "fi_rope_apply_pos_ids: pos_ids", q->shape[0]));
    {
        const fi_tensor *idx[] = {pos_ids};
        static const char *const names[] = {"pos_ids"};
        FI_TRY(check_rope_apart(q, k, q_out, k_out, idx, names, 1, fn));
    }
    if (ctx->backend->host_memory) {
        const int32_t *pos = pos_ids->data;
        for (int64_t t = 0; t < q->shape[0]; t++)
            if (pos[t] < 0)
                return fi_error(FI_STATUS_INVALID_ARGUMENT,
                                "%s: pos_ids[%lld]=%d: positions must not be negative", fn,
                                (long long)t, (int)pos[t]);
    }
    return ctx->backend->rope(ctx, &p, q, k, q_out, k_out, pos_ids, NULL, NULL, stream);
}
