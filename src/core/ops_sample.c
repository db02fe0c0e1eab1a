/*
 * ops_sample.c — the public softmax, sampling, filter, speculative and
 * top-k ops: shapes, dtypes, overlap, and on host-memory backends the
 * values the kernels index with or divide by (indices, draft token ids,
 * lengths, ragged indptr, top_p / min_p / temperature), all checked before
 * the backend's entry is called. Per-row parameters (tensor, value): a
 * tensor with data wins; the value is then ignored and not checked.
 */
#include "core/ops_check.h"

#include <math.h>
#include <stdio.h>

/* Vocabularies, rows and k are int32 in the kernels' index outputs. */
static fi_status check_i32_size(int64_t n, const char *fn, const char *what) {
    if (n > INT32_MAX)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: %s=%lld is larger than INT32_MAX",
                        fn, what, (long long)n);
    return FI_OK;
}

/* A [rows, V] float matrix with V >= 1 and both sizes int32. */
static fi_status check_matrix(const fi_tensor *t, const char *fn, const char *name,
                              const int64_t *shape) {
    FI_OP_TRY(fi_op_float(t, fn, name, 2, shape, false));
    if (t->shape[1] < 1)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: %s.shape[1]=%lld: the vocabulary is empty",
                        fn, name, (long long)t->shape[1]);
    FI_OP_TRY(check_i32_size(t->shape[0], fn, "rows"));
    return check_i32_size(t->shape[1], fn, "vocabulary size");
}

/* A float parameter value in [lo, hi] (gt_lo: > lo). */
static fi_status check_value(float v, const char *fn, const char *name, int64_t row, float lo,
                             float hi, bool gt_lo) {
    bool ok = isfinite(v) && (gt_lo ? v > lo : v >= lo) && v <= hi;
    if (ok) return FI_OK;
    char where[48] = "";
    if (row >= 0) snprintf(where, sizeof where, "[%lld]", (long long)row);
    return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: %s%s=%g is outside %c%g, %g]", fn, name,
                    where, (double)v, gt_lo ? '(' : '[', (double)lo, (double)hi);
}

/* (arr, val) of an f32 parameter: arr [batch] f32 checked (its values too,
 * on host memory), else val. */
static fi_status check_param_f32(const fi_context *ctx, const fi_tensor *arr, float val,
                                 int64_t batch, const char *fn, const char *name, float lo,
                                 float hi, bool gt_lo, fi_param_f32 *out) {
    FI_OP_TRY(fi_op_param(arr, fn, name, FI_DTYPE_F32, batch, &out->arr));
    out->val = val;
    if (!out->arr) return check_value(val, fn, name, -1, lo, hi, gt_lo);
    if (ctx->backend->host_memory)
        for (int64_t b = 0; b < batch; b++)
            FI_OP_TRY(check_value(fi_op_f32_at(out->arr, b), fn, name, b, lo, hi, gt_lo));
    return FI_OK;
}

/* Every value of a host i32 tensor in [lo, hi]. */
static fi_status check_range(const fi_context *ctx, const fi_tensor *t, int64_t n, int64_t lo,
                             int64_t hi, const char *fn, const char *name, const char *why) {
    if (!ctx->backend->host_memory) return FI_OK;
    for (int64_t i = 0; i < n; i++) {
        int32_t v = fi_op_i32_at(t, i);
        if (v < lo || v > hi)
            return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: %s[%lld]=%d is outside [%lld, %lld]%s",
                            fn, name, (long long)i, (int)v, (long long)lo, (long long)hi, why);
    }
    return FI_OK;
}

/* ------------------------------------------------------------- softmax */

fi_status fi_softmax(fi_context *ctx, const fi_tensor *logits, const fi_tensor *temperature,
                     float temperature_val, fi_tensor *probs, void *stream) {
    const char *fn = "fi_softmax";
    FI_OP_CONTEXT(ctx, fn, softmax);
    FI_OP_TRY(check_matrix(logits, fn, "logits", NULL));
    FI_OP_TRY(fi_op_float(probs, fn, "probs", 2, logits->shape, false));
    fi_softmax_args a = {.logits = logits, .probs = probs};
    FI_OP_TRY(check_param_f32(ctx, temperature, temperature_val, logits->shape[0], fn,
                              "temperature", 0.0f, INFINITY, true, &a.temperature));
    {
        const fi_tensor *others[] = {logits, a.temperature.arr};
        static const char *const names[] = {"logits", "temperature"};
        const bool same[] = {true, false};
        FI_OP_TRY(fi_op_apart(probs, fn, "probs", others, names, same, 2));
    }
    if (logits->shape[0] == 0) return FI_OK;
    return ctx->backend->softmax(ctx, &a, stream);
}

/* ------------------------------------------------------------- sampling */

/* What differs between the sampling entry points. */
typedef struct sample_form {
    const char *fn;
    bool logits, top_k, top_p, min_p;
} sample_form;

static fi_status sample_run(fi_context *ctx, const sample_form *f, const fi_tensor *input,
                            const fi_tensor *indices, const fi_tensor *top_k, int32_t top_k_val,
                            const fi_tensor *top_p, float top_p_val, const fi_tensor *min_p,
                            float min_p_val, fi_filter_order order, uint64_t seed,
                            uint64_t offset, fi_tensor *samples, fi_tensor *valid,
                            void *stream) {
    const char *fn = f->fn;
    FI_OP_CONTEXT(ctx, fn, sample);
    FI_OP_TRY(check_matrix(input, fn, f->logits ? "logits" : "probs", NULL));
    const int64_t rows = input->shape[0];
    const fi_tensor *idx = NULL;
    int64_t batch = rows;
    if (indices && indices->data) {
        FI_OP_TRY(fi_op_index(indices, fn, "indices", -1));
        FI_OP_TRY(check_i32_size(indices->shape[0], fn, "indices.shape[0]"));
        idx = indices;
        batch = indices->shape[0];
    }
    FI_OP_TRY(fi_op_index(samples, fn, "samples", batch));
    const fi_tensor *ok_out = NULL;
    if (valid && valid->data) {
        char full[96];
        snprintf(full, sizeof full, "%s: valid", fn);
        FI_OP_TRY(fi_check_tensor(valid, full, FI_DTYPE_U8, 1, &batch));
        ok_out = valid;
    }
    if (f->top_k && f->top_p && order != FI_FILTER_TOP_K_FIRST && order != FI_FILTER_JOINT)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: order=%d is neither FI_FILTER_TOP_K_FIRST nor FI_FILTER_JOINT", fn,
                        (int)order);
    fi_sample_args a = {.input = input, .logits = f->logits, .indices = idx,
                        .use_top_k = f->top_k, .use_top_p = f->top_p, .use_min_p = f->min_p,
                        .order = order, .seed = seed, .offset = offset, .samples = samples,
                        .valid = (fi_tensor *)ok_out, .batch = batch};
    if (f->top_k) {
        FI_OP_TRY(fi_op_param(top_k, fn, "top_k", FI_DTYPE_I32, batch, &a.top_k.arr));
        a.top_k.val = top_k_val;
    }
    if (f->top_p)
        FI_OP_TRY(check_param_f32(ctx, top_p, top_p_val, batch, fn, "top_p", 0.0f, 1.0f, false,
                                  &a.top_p));
    if (f->min_p)
        FI_OP_TRY(check_param_f32(ctx, min_p, min_p_val, batch, fn, "min_p", 0.0f, 1.0f, false,
                                  &a.min_p));
    if (idx)
        FI_OP_TRY(check_range(ctx, idx, batch, 0, rows - 1, fn, "indices",
                              " (rows of the input)"));
    {
        const fi_tensor *others[] = {input, idx, a.top_k.arr, a.top_p.arr, a.min_p.arr, ok_out};
        static const char *const names[] = {"input", "indices", "top_k", "top_p", "min_p",
                                            "valid"};
        FI_OP_TRY(fi_op_apart(samples, fn, "samples", others, names, NULL, 6));
        if (ok_out) FI_OP_TRY(fi_op_apart(ok_out, fn, "valid", others, names, NULL, 5));
    }
    if (batch == 0) return FI_OK;
    return ctx->backend->sample(ctx, &a, stream);
}

fi_status fi_sampling_from_probs(fi_context *ctx, const fi_tensor *probs,
                                 const fi_tensor *indices, uint64_t seed, uint64_t offset,
                                 fi_tensor *samples, fi_tensor *valid, void *stream) {
    static const sample_form f = {"fi_sampling_from_probs", false, false, false, false};
    return sample_run(ctx, &f, probs, indices, NULL, 0, NULL, 1.0f, NULL, 0.0f,
                      FI_FILTER_TOP_K_FIRST, seed, offset, samples, valid, stream);
}

fi_status fi_sampling_from_logits(fi_context *ctx, const fi_tensor *logits,
                                  const fi_tensor *indices, uint64_t seed, uint64_t offset,
                                  fi_tensor *samples, fi_tensor *valid, void *stream) {
    static const sample_form f = {"fi_sampling_from_logits", true, false, false, false};
    return sample_run(ctx, &f, logits, indices, NULL, 0, NULL, 1.0f, NULL, 0.0f,
                      FI_FILTER_TOP_K_FIRST, seed, offset, samples, valid, stream);
}

fi_status fi_top_k_sampling_from_probs(fi_context *ctx, const fi_tensor *probs,
                                       const fi_tensor *indices, const fi_tensor *top_k,
                                       int32_t top_k_val, uint64_t seed, uint64_t offset,
                                       fi_tensor *samples, fi_tensor *valid, void *stream) {
    static const sample_form f = {"fi_top_k_sampling_from_probs", false, true, false, false};
    return sample_run(ctx, &f, probs, indices, top_k, top_k_val, NULL, 1.0f, NULL, 0.0f,
                      FI_FILTER_TOP_K_FIRST, seed, offset, samples, valid, stream);
}

fi_status fi_top_p_sampling_from_probs(fi_context *ctx, const fi_tensor *probs,
                                       const fi_tensor *indices, const fi_tensor *top_p,
                                       float top_p_val, uint64_t seed, uint64_t offset,
                                       fi_tensor *samples, fi_tensor *valid, void *stream) {
    static const sample_form f = {"fi_top_p_sampling_from_probs", false, false, true, false};
    return sample_run(ctx, &f, probs, indices, NULL, 0, top_p, top_p_val, NULL, 0.0f,
                      FI_FILTER_TOP_K_FIRST, seed, offset, samples, valid, stream);
}

fi_status fi_min_p_sampling_from_probs(fi_context *ctx, const fi_tensor *probs,
                                       const fi_tensor *indices, const fi_tensor *min_p,
                                       float min_p_val, uint64_t seed, uint64_t offset,
                                       fi_tensor *samples, fi_tensor *valid, void *stream) {
    static const sample_form f = {"fi_min_p_sampling_from_probs", false, false, false, true};
    return sample_run(ctx, &f, probs, indices, NULL, 0, NULL, 1.0f, min_p, min_p_val,
                      FI_FILTER_TOP_K_FIRST, seed, offset, samples, valid, stream);
}

fi_status fi_top_k_top_p_sampling_from_probs(fi_context *ctx, const fi_tensor *probs,
                                             const fi_tensor *indices, const fi_tensor *top_k,
                                             int32_t top_k_val, const fi_tensor *top_p,
                                             float top_p_val, fi_filter_order order,
                                             uint64_t seed, uint64_t offset,
                                             fi_tensor *samples, fi_tensor *valid,
                                             void *stream) {
    static const sample_form f = {"fi_top_k_top_p_sampling_from_probs", false, true, true, false};
    return sample_run(ctx, &f, probs, indices, top_k, top_k_val, top_p, top_p_val, NULL, 0.0f,
                      order, seed, offset, samples, valid, stream);
}

fi_status fi_top_k_top_p_sampling_from_logits(fi_context *ctx, const fi_tensor *logits,
                                              const fi_tensor *indices, const fi_tensor *top_k,
                                              int32_t top_k_val, const fi_tensor *top_p,
                                              float top_p_val, fi_filter_order order,
                                              uint64_t seed, uint64_t offset,
                                              fi_tensor *samples, fi_tensor *valid,
                                              void *stream) {
    static const sample_form f = {"fi_top_k_top_p_sampling_from_logits", true, true, true,
                                  false};
    return sample_run(ctx, &f, logits, indices, top_k, top_k_val, top_p, top_p_val, NULL,
                      0.0f, order, seed, offset, samples, valid, stream);
}

/* -------------------------------------------------------------- filters */

static fi_status filter_run(fi_context *ctx, fi_filter_op op, const char *fn,
                            const fi_tensor *input, const fi_tensor *top_k, int32_t top_k_val,
                            const fi_tensor *top_p, float top_p_val, fi_tensor *out,
                            void *stream) {
    FI_OP_CONTEXT(ctx, fn, filter);
    const char *in_name = op == FI_FILTER_TOP_K_MASK ? "logits" : "probs";
    FI_OP_TRY(check_matrix(input, fn, in_name, NULL));
    FI_OP_TRY(fi_op_float(out, fn, "out", 2, input->shape, false));
    if (op == FI_FILTER_TOP_K_MASK && out->dtype != input->dtype)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: out.dtype is %s but logits.dtype is %s: kept logits are copied "
                        "bit for bit", fn, fi_dtype_name(out->dtype),
                        fi_dtype_name(input->dtype));
    const int64_t batch = input->shape[0];
    fi_filter_args a = {.op = op, .input = input, .out = out};
    if (op == FI_FILTER_TOP_P_RENORM) {
        FI_OP_TRY(check_param_f32(ctx, top_p, top_p_val, batch, fn, "top_p", 0.0f, 1.0f, false,
                                  &a.top_p));
    } else {
        FI_OP_TRY(fi_op_param(top_k, fn, "top_k", FI_DTYPE_I32, batch, &a.top_k.arr));
        a.top_k.val = top_k_val;
    }
    {
        const fi_tensor *others[] = {input, a.top_k.arr, a.top_p.arr};
        const char *const names[] = {in_name, "top_k", "top_p"};
        const bool same[] = {true, false, false};
        FI_OP_TRY(fi_op_apart(out, fn, "out", others, names, same, 3));
    }
    if (batch == 0) return FI_OK;
    return ctx->backend->filter(ctx, &a, stream);
}

fi_status fi_top_k_renorm_probs(fi_context *ctx, const fi_tensor *probs, const fi_tensor *top_k,
                                int32_t top_k_val, fi_tensor *out, void *stream) {
    return filter_run(ctx, FI_FILTER_TOP_K_RENORM, "fi_top_k_renorm_probs", probs, top_k,
                      top_k_val, NULL, 1.0f, out, stream);
}

fi_status fi_top_p_renorm_probs(fi_context *ctx, const fi_tensor *probs, const fi_tensor *top_p,
                                float top_p_val, fi_tensor *out, void *stream) {
    return filter_run(ctx, FI_FILTER_TOP_P_RENORM, "fi_top_p_renorm_probs", probs, NULL, 0,
                      top_p, top_p_val, out, stream);
}

fi_status fi_top_k_mask_logits(fi_context *ctx, const fi_tensor *logits, const fi_tensor *top_k,
                               int32_t top_k_val, fi_tensor *out, void *stream) {
    return filter_run(ctx, FI_FILTER_TOP_K_MASK, "fi_top_k_mask_logits", logits, top_k,
                      top_k_val, NULL, 1.0f, out, stream);
}

/* --------------------------------------------------- chain speculative */

/* An optional [batch] i32 counter (accepted / emitted): NULL or data NULL
 * = not wanted. */
static fi_status check_counter(fi_tensor *t, int64_t batch, const char *fn, const char *name,
                               fi_tensor **out) {
    *out = NULL;
    if (!t || !t->data) return FI_OK;
    FI_OP_TRY(fi_op_index(t, fn, name, batch));
    *out = t;
    return FI_OK;
}

fi_status fi_chain_speculative_sampling(fi_context *ctx, const fi_tensor *draft_probs,
                                        const fi_tensor *draft_token_ids,
                                        const fi_tensor *target_probs, uint64_t seed,
                                        uint64_t offset, fi_tensor *output_token_ids,
                                        fi_tensor *accepted_num, fi_tensor *emitted_num,
                                        void *stream) {
    const char *fn = "fi_chain_speculative_sampling";
    FI_OP_CONTEXT(ctx, fn, chain_speculative);
    FI_OP_TRY(fi_op_float(draft_probs, fn, "draft_probs", 3, NULL, false));
    const int64_t batch = draft_probs->shape[0], n = draft_probs->shape[1];
    const int64_t vocab = draft_probs->shape[2];
    if (vocab < 1)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: draft_probs.shape[2]=%lld: the vocabulary is empty", fn,
                        (long long)vocab);
    FI_OP_TRY(check_i32_size(batch, fn, "batch"));
    FI_OP_TRY(check_i32_size(n + 1, fn, "num_speculate_tokens + 1"));
    FI_OP_TRY(check_i32_size(vocab, fn, "vocabulary size"));
    const int64_t ids_shape[2] = {batch, n}, target_shape[3] = {batch, n + 1, vocab};
    const int64_t out_shape[2] = {batch, n + 1};
    char full[96];
    snprintf(full, sizeof full, "%s: draft_token_ids", fn);
    FI_OP_TRY(fi_check_tensor(draft_token_ids, full, FI_DTYPE_I32, 2, ids_shape));
    FI_OP_TRY(fi_op_float(target_probs, fn, "target_probs", 3, target_shape, false));
    snprintf(full, sizeof full, "%s: output_token_ids", fn);
    FI_OP_TRY(fi_check_tensor(output_token_ids, full, FI_DTYPE_I32, 2, out_shape));
    fi_tensor *acc, *emi;
    FI_OP_TRY(check_counter(accepted_num, batch, fn, "accepted_num", &acc));
    FI_OP_TRY(check_counter(emitted_num, batch, fn, "emitted_num", &emi));
    {
        /* each output against the inputs and the outputs checked before it */
        const fi_tensor *others[] = {draft_probs, draft_token_ids, target_probs,
                                     output_token_ids, acc};
        static const char *const names[] = {"draft_probs", "draft_token_ids", "target_probs",
                                            "output_token_ids", "accepted_num"};
        FI_OP_TRY(fi_op_apart(output_token_ids, fn, "output_token_ids", others, names, NULL, 3));
        if (acc) FI_OP_TRY(fi_op_apart(acc, fn, "accepted_num", others, names, NULL, 4));
        if (emi) FI_OP_TRY(fi_op_apart(emi, fn, "emitted_num", others, names, NULL, 5));
    }
    if (ctx->backend->host_memory)
        for (int64_t b = 0; b < batch; b++)
            for (int64_t i = 0; i < n; i++) {
                const int32_t *p = draft_token_ids->data;
                int32_t t = p[b * draft_token_ids->stride[0] + i * draft_token_ids->stride[1]];
                if (t < 0 || t >= vocab)
                    return fi_error(FI_STATUS_INVALID_ARGUMENT,
                                    "%s: draft_token_ids[%lld][%lld]=%d is not a token of the "
                                    "vocabulary of %lld", fn, (long long)b, (long long)i,
                                    (int)t, (long long)vocab);
            }
    if (batch == 0) return FI_OK;
    fi_spec_args a = {.draft_probs = draft_probs, .draft_ids = draft_token_ids,
                      .target_probs = target_probs, .seed = seed, .offset = offset,
                      .out_ids = output_token_ids, .accepted = acc, .emitted = emi};
    return ctx->backend->chain_speculative(ctx, &a, stream);
}

/* ---------------------------------------------------------------- top-k */

/* values [rows, k] (optional, input's dtype) and indices [rows, k] i32,
 * apart from the inputs and each other. */
static fi_status check_topk_outputs(const fi_tensor *input, const fi_tensor *const *ins,
                                    const char *const *in_names, int n_in, int64_t rows,
                                    int32_t k, fi_tensor *values, fi_tensor *indices,
                                    const char *fn, fi_topk_args *a) {
    if (k < 1)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: k=%d must be >= 1", fn, (int)k);
    const int64_t shape[2] = {rows, k};
    char full[96];
    snprintf(full, sizeof full, "%s: indices", fn);
    FI_OP_TRY(fi_check_tensor(indices, full, FI_DTYPE_I32, 2, shape));
    a->values = NULL;
    if (values && values->data) {
        FI_OP_TRY(fi_op_float(values, fn, "values", 2, shape, false));
        if (values->dtype != input->dtype)
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "%s: values.dtype is %s but input.dtype is %s", fn,
                            fi_dtype_name(values->dtype), fi_dtype_name(input->dtype));
        a->values = values;
    }
    const fi_tensor *others[4] = {NULL, NULL, NULL, a->values};
    const char *names[4] = {"", "", "", "values"};
    for (int i = 0; i < n_in && i < 3; i++) others[i] = ins[i], names[i] = in_names[i];
    FI_OP_TRY(fi_op_apart(indices, fn, "indices", others, names, NULL, 4));
    if (a->values) FI_OP_TRY(fi_op_apart(a->values, fn, "values", others, names, NULL, 3));
    a->k = k;
    a->indices = indices;
    a->rows = rows;
    return FI_OK;
}

fi_status fi_top_k(fi_context *ctx, const fi_tensor *input, int32_t k, const fi_tensor *lengths,
                   const fi_tensor *offsets, fi_tensor *values, fi_tensor *indices,
                   void *stream) {
    const char *fn = "fi_top_k";
    FI_OP_CONTEXT(ctx, fn, top_k);
    FI_OP_TRY(fi_op_float(input, fn, "input", 2, NULL, false));
    const int64_t rows = input->shape[0], cols = input->shape[1];
    FI_OP_TRY(check_i32_size(rows, fn, "rows"));
    FI_OP_TRY(check_i32_size(cols, fn, "input.shape[1]"));
    fi_topk_args a = {.input = input};
    FI_OP_TRY(fi_op_param(lengths, fn, "lengths", FI_DTYPE_I32, rows, &a.lengths));
    FI_OP_TRY(fi_op_param(offsets, fn, "offsets", FI_DTYPE_I32, rows, &a.offsets));
    if (a.lengths)
        FI_OP_TRY(check_range(ctx, a.lengths, rows, 0, cols, fn, "lengths",
                              " (columns of the input)"));
    const fi_tensor *ins[] = {input, a.lengths, a.offsets};
    static const char *const names[] = {"input", "lengths", "offsets"};
    FI_OP_TRY(check_topk_outputs(input, ins, names, 3, rows, k, values, indices, fn, &a));
    if (rows == 0) return FI_OK;
    return ctx->backend->top_k(ctx, &a, stream);
}

fi_status fi_top_k_ragged(fi_context *ctx, const fi_tensor *input, const fi_tensor *indptr,
                          int32_t k, fi_tensor *values, fi_tensor *indices, void *stream) {
    const char *fn = "fi_top_k_ragged";
    FI_OP_CONTEXT(ctx, fn, top_k);
    FI_OP_TRY(fi_op_float(input, fn, "input", 1, NULL, false));
    FI_OP_TRY(fi_op_index(indptr, fn, "indptr", -1));
    if (indptr->shape[0] < 1)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: indptr has no entries, expected rows + 1", fn);
    const int64_t rows = indptr->shape[0] - 1;
    FI_OP_TRY(check_i32_size(rows, fn, "rows"));
    FI_OP_TRY(check_i32_size(input->shape[0], fn, "input.shape[0]"));
    if (ctx->backend->host_memory) {
        int32_t prev = fi_op_i32_at(indptr, 0);
        if (prev != 0)
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "%s: indptr[0]=%d: an indptr starts at 0", fn, (int)prev);
        for (int64_t r = 1; r <= rows; r++) {
            int32_t v = fi_op_i32_at(indptr, r);
            if (v < prev)
                return fi_error(FI_STATUS_INVALID_ARGUMENT,
                                "%s: indptr[%lld]=%d < indptr[%lld]=%d: an indptr must not "
                                "decrease", fn, (long long)r, (int)v, (long long)(r - 1),
                                (int)prev);
            prev = v;
        }
        if (prev > input->shape[0])
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "%s: indptr[%lld]=%d is past the input's %lld elements", fn,
                            (long long)rows, (int)prev, (long long)input->shape[0]);
    }
    fi_topk_args a = {.input = input, .indptr = indptr};
    const fi_tensor *ins[] = {input, indptr};
    static const char *const names[] = {"input", "indptr"};
    FI_OP_TRY(check_topk_outputs(input, ins, names, 2, rows, k, values, indices, fn, &a));
    if (rows == 0) return FI_OK;
    return ctx->backend->top_k(ctx, &a, stream);
}
