/*
 * ops_norm.c — the public norm and gated-activation ops (and RoPE from a
 * cos/sin cache, the other row-wise op of a layer, with its QK-RMSNorm
 * form fi_qk_rmsnorm_rope: one `rope_cos_sin` entry): every argument
 * checked (context, dtypes, ranks, shapes against the input, eps and the
 * FP8 scale, outputs apart from the inputs and from themselves) before the
 * backend's `norm` / `gated_act` entry is called with one fi_norm_args /
 * fi_act_args.
 */
#include "core/ops_check.h"

#include <math.h>
#include <stdio.h>

/* What differs between the norm entry points. */
typedef struct norm_form {
    const char *fn;
    fi_norm_kind kind;
    bool gemma;
    bool fused; /* residual += input first */
    bool quant; /* out is FP8 */
} norm_form;

/* input / out as the form takes them: out NULL means input is written. */
static fi_status norm_check(fi_context *ctx, const norm_form *f, const fi_tensor *input,
                            fi_tensor *residual, const fi_tensor *weight, const fi_tensor *bias,
                            float eps, float scale, fi_tensor *out, fi_norm_args *a) {
    const char *fn = f->fn;
    FI_OP_CONTEXT(ctx, fn, norm);
    FI_OP_TRY(fi_op_float(input, fn, "input", 0, NULL, false));
    const int64_t hidden = input->shape[input->ndim - 1];
    if (hidden < 1)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: input's hidden size (its last dim) is %lld, expected >= 1", fn,
                        (long long)hidden);
    int64_t rows;
    FI_OP_TRY(fi_op_rows(input, fn, "input", &rows));
    FI_OP_TRY(
        fi_op_float(weight, fn, f->kind == FI_NORM_LAYER ? "gamma" : "weight", 1, &hidden, false));
    if (bias) FI_OP_TRY(fi_op_float(bias, fn, "beta", 1, &hidden, false));
    if (f->fused) {
        FI_OP_TRY(fi_op_float(residual, fn, "residual", 0, NULL, false));
        FI_OP_TRY(fi_op_same_shape(residual, input, -1, fn, "residual", "input"));
    }
    fi_tensor *dst = out ? out : (fi_tensor *)input;
    if (out) {
        FI_OP_TRY(fi_op_float(out, fn, "out", 0, NULL, f->quant));
        if (f->quant && out->dtype != FI_DTYPE_E4M3 && out->dtype != FI_DTYPE_E5M2)
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "%s: out.dtype is %s, expected e4m3 or e5m2", fn,
                            fi_dtype_name(out->dtype));
        FI_OP_TRY(fi_op_same_shape(out, input, -1, fn, "out", "input"));
    }
    if (!isfinite(eps) || eps < 0.0f)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: eps=%g must be finite and >= 0", fn,
                        (double)eps);
    if (f->quant && !(scale > 0.0f && isfinite(scale)))
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: scale=%g must be finite and > 0", fn,
                        (double)scale);

    /* out may be input itself (rmsnorm in place; the fused forms write the
     * input they read); residual is apart from everything. */
    {
        const fi_tensor *others[] = {input, weight, bias, residual};
        static const char *const names[] = {"input", "weight", "beta", "residual"};
        const bool same[] = {true, false, false, false};
        FI_OP_TRY(fi_op_apart(dst, fn, out ? "out" : "input", others, names, same, 4));
    }
    if (f->fused) {
        const fi_tensor *others[] = {input, weight, dst};
        static const char *const names[] = {"input", "weight", "out"};
        FI_OP_TRY(fi_op_apart(residual, fn, "residual", others, names, NULL, 3));
    }
    *a = (fi_norm_args){.kind = f->kind,
                        .gemma = f->gemma,
                        .input = input,
                        .residual = f->fused ? residual : NULL,
                        .weight = weight,
                        .bias = bias,
                        .out = dst,
                        .eps = eps,
                        .quant_scale = f->quant ? scale : 1.0f,
                        .rows = rows,
                        .hidden = hidden};
    return FI_OK;
}

static fi_status norm_run(fi_context *ctx, const norm_form *f, const fi_tensor *input,
                          fi_tensor *residual, const fi_tensor *weight, const fi_tensor *bias,
                          float eps, float scale, fi_tensor *out, void *stream) {
    fi_norm_args a;
    FI_OP_TRY(norm_check(ctx, f, input, residual, weight, bias, eps, scale, out, &a));
    if (a.rows == 0) return FI_OK;
    return ctx->backend->norm(ctx, &a, stream);
}

fi_status fi_rmsnorm(fi_context *ctx, const fi_tensor *input, const fi_tensor *weight, float eps,
                     fi_tensor *out, void *stream) {
    static const norm_form f = {"fi_rmsnorm", FI_NORM_RMS, false, false, false};
    if (!out) return fi_error(FI_STATUS_INVALID_ARGUMENT, "fi_rmsnorm: out is NULL");
    return norm_run(ctx, &f, input, NULL, weight, NULL, eps, 1.0f, out, stream);
}

fi_status fi_gemma_rmsnorm(fi_context *ctx, const fi_tensor *input, const fi_tensor *weight,
                           float eps, fi_tensor *out, void *stream) {
    static const norm_form f = {"fi_gemma_rmsnorm", FI_NORM_RMS, true, false, false};
    if (!out) return fi_error(FI_STATUS_INVALID_ARGUMENT, "fi_gemma_rmsnorm: out is NULL");
    return norm_run(ctx, &f, input, NULL, weight, NULL, eps, 1.0f, out, stream);
}

fi_status fi_fused_add_rmsnorm(fi_context *ctx, fi_tensor *input, fi_tensor *residual,
                               const fi_tensor *weight, float eps, void *stream) {
    static const norm_form f = {"fi_fused_add_rmsnorm", FI_NORM_RMS, false, true, false};
    return norm_run(ctx, &f, input, residual, weight, NULL, eps, 1.0f, NULL, stream);
}

fi_status fi_gemma_fused_add_rmsnorm(fi_context *ctx, fi_tensor *input, fi_tensor *residual,
                                     const fi_tensor *weight, float eps, void *stream) {
    static const norm_form f = {"fi_gemma_fused_add_rmsnorm", FI_NORM_RMS, true, true, false};
    return norm_run(ctx, &f, input, residual, weight, NULL, eps, 1.0f, NULL, stream);
}

fi_status fi_layernorm(fi_context *ctx, const fi_tensor *input, const fi_tensor *gamma,
                       const fi_tensor *beta, float eps, fi_tensor *out, void *stream) {
    static const norm_form f = {"fi_layernorm", FI_NORM_LAYER, false, false, false};
    if (!beta) return fi_error(FI_STATUS_INVALID_ARGUMENT, "fi_layernorm: beta: tensor is NULL");
    if (!out) return fi_error(FI_STATUS_INVALID_ARGUMENT, "fi_layernorm: out is NULL");
    return norm_run(ctx, &f, input, NULL, gamma, beta, eps, 1.0f, out, stream);
}

fi_status fi_rmsnorm_quant(fi_context *ctx, const fi_tensor *input, const fi_tensor *weight,
                           float scale, float eps, fi_tensor *out, void *stream) {
    static const norm_form f = {"fi_rmsnorm_quant", FI_NORM_RMS, false, false, true};
    if (!out) return fi_error(FI_STATUS_INVALID_ARGUMENT, "fi_rmsnorm_quant: out is NULL");
    return norm_run(ctx, &f, input, NULL, weight, NULL, eps, scale, out, stream);
}

fi_status fi_fused_add_rmsnorm_quant(fi_context *ctx, const fi_tensor *input, fi_tensor *residual,
                                     const fi_tensor *weight, float scale, float eps,
                                     fi_tensor *out, void *stream) {
    static const norm_form f = {"fi_fused_add_rmsnorm_quant", FI_NORM_RMS, false, true, true};
    if (!out)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "fi_fused_add_rmsnorm_quant: out is NULL");
    return norm_run(ctx, &f, input, residual, weight, NULL, eps, scale, out, stream);
}

/* ---------------------------------------------------------- activations */

static fi_status act_run(fi_context *ctx, fi_act_kind kind, const char *fn, const fi_tensor *input,
                         fi_tensor *out, void *stream) {
    FI_OP_CONTEXT(ctx, fn, gated_act);
    FI_OP_TRY(fi_op_float(input, fn, "input", 0, NULL, false));
    const int64_t last = input->shape[input->ndim - 1];
    if (last % 2)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: input's last dim is %lld; it must be even ([..., 2d]: gate, up)", fn,
                        (long long)last);
    int64_t rows;
    FI_OP_TRY(fi_op_rows(input, fn, "input", &rows));
    FI_OP_TRY(fi_op_float(out, fn, "out", 0, NULL, false));
    FI_OP_TRY(fi_op_same_shape(out, input, last / 2, fn, "out", "input"));
    {
        const fi_tensor *others[] = {input};
        static const char *const names[] = {"input"};
        FI_OP_TRY(fi_op_apart(out, fn, "out", others, names, NULL, 1));
    }
    if (rows == 0 || last == 0) return FI_OK;
    fi_act_args a = {.kind = kind, .input = input, .out = out, .rows = rows, .dim = last / 2};
    return ctx->backend->gated_act(ctx, &a, stream);
}

fi_status fi_silu_and_mul(fi_context *ctx, const fi_tensor *input, fi_tensor *out, void *stream) {
    return act_run(ctx, FI_ACT_SILU, "fi_silu_and_mul", input, out, stream);
}

fi_status fi_gelu_and_mul(fi_context *ctx, const fi_tensor *input, fi_tensor *out, void *stream) {
    return act_run(ctx, FI_ACT_GELU, "fi_gelu_and_mul", input, out, stream);
}

fi_status fi_gelu_tanh_and_mul(fi_context *ctx, const fi_tensor *input, fi_tensor *out,
                               void *stream) {
    return act_run(ctx, FI_ACT_GELU_TANH, "fi_gelu_tanh_and_mul", input, out, stream);
}

/* ----------------------------------------------------- RoPE from a cache */

/* RoPE from a cache, and the QK-norm form of it (q_w non-NULL): the
 * weights [D] are checked beside the rest, then one backend entry runs
 * both. */
static fi_status rope_cache_run(fi_context *ctx, const char *fn, const fi_tensor *positions,
                                const fi_tensor *q, const fi_tensor *k, const fi_tensor *q_w,
                                const fi_tensor *k_w, float eps, bool gemma,
                                const fi_tensor *cos_sin_cache, int32_t is_neox,
                                fi_tensor *q_out, fi_tensor *k_out, void *stream) {
    FI_OP_CONTEXT(ctx, fn, rope_cos_sin);
    FI_OP_TRY(fi_op_float(q, fn, "q", 3, NULL, false));
    const int64_t nnz = q->shape[0], dim = q->shape[2];
    const int64_t k_shape[3] = {nnz, -1, dim};
    FI_OP_TRY(fi_op_float(k, fn, "k", 3, k_shape, false));
    FI_OP_TRY(fi_op_index(positions, fn, "positions", nnz));
    char full[96];
    snprintf(full, sizeof full, "%s: cos_sin_cache", fn);
    FI_OP_TRY(fi_check_tensor(cos_sin_cache, full, FI_DTYPE_F32, 2, NULL));
    const int64_t max_pos = cos_sin_cache->shape[0], rot = cos_sin_cache->shape[1];
    if (rot < 2 || rot % 2 || rot > dim)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: cos_sin_cache.shape[1]=%lld (rotary_dim) must be even and in "
                        "[2, head_dim %lld]",
                        fn, (long long)rot, (long long)dim);
    if (q_w) {
        FI_OP_TRY(fi_op_float(q_w, fn, "q_weight", 1, &dim, false));
        FI_OP_TRY(fi_op_float(k_w, fn, "k_weight", 1, &dim, false));
        if (!isfinite(eps) || eps < 0.0f)
            return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: eps=%g must be finite and >= 0",
                            fn, (double)eps);
    }
    snprintf(full, sizeof full, "%s: q_out", fn);
    FI_OP_TRY(fi_check_tensor(q_out, full, q->dtype, 3, q->shape));
    snprintf(full, sizeof full, "%s: k_out", fn);
    FI_OP_TRY(fi_check_tensor(k_out, full, k->dtype, 3, k->shape));
    {
        const fi_tensor *others[] = {q, k, positions, cos_sin_cache, q_w, k_w, k_out};
        static const char *const names[] = {"q",        "k",        "positions", "cos_sin_cache",
                                            "q_weight", "k_weight", "k_out"};
        const bool same_q[] = {true, false, false, false, false, false, false};
        const bool same_k[] = {false, true, false, false, false, false};
        FI_OP_TRY(fi_op_apart(q_out, fn, "q_out", others, names, same_q, 7));
        FI_OP_TRY(fi_op_apart(k_out, fn, "k_out", others, names, same_k, 6));
    }
    if (ctx->backend->host_memory)
        for (int64_t t = 0; t < nnz; t++) {
            int32_t p = fi_op_i32_at(positions, t);
            if (p < 0 || p >= max_pos)
                return fi_error(FI_STATUS_INVALID_ARGUMENT,
                                "%s: positions[%lld]=%d is not a row of cos_sin_cache (it has "
                                "%lld)",
                                fn, (long long)t, (int)p, (long long)max_pos);
        }
    if (nnz == 0) return FI_OK;
    fi_rope_cache_args a = {.positions = positions,
                            .q = q,
                            .k = k,
                            .cache = cos_sin_cache,
                            .neox = is_neox != 0,
                            .q_out = q_out,
                            .k_out = k_out,
                            .q_w = q_w,
                            .k_w = q_w ? k_w : NULL,
                            .eps = eps,
                            .gemma = gemma};
    return ctx->backend->rope_cos_sin(ctx, &a, stream);
}

fi_status fi_rope_apply_cos_sin_cache(fi_context *ctx, const fi_tensor *positions,
                                      const fi_tensor *q, const fi_tensor *k,
                                      const fi_tensor *cos_sin_cache, int32_t is_neox,
                                      fi_tensor *q_out, fi_tensor *k_out, void *stream) {
    return rope_cache_run(ctx, "fi_rope_apply_cos_sin_cache", positions, q, k, NULL, NULL, 0.0f,
                          false, cos_sin_cache, is_neox, q_out, k_out, stream);
}

/* q_weight NULL must not fall back to plain RoPE: the NULL is refused. */
static fi_status qk_norm_rope(fi_context *ctx, const char *fn, bool gemma,
                              const fi_tensor *positions, const fi_tensor *q, const fi_tensor *k,
                              const fi_tensor *q_weight, const fi_tensor *k_weight, float eps,
                              const fi_tensor *cos_sin_cache, int32_t is_neox, fi_tensor *q_out,
                              fi_tensor *k_out, void *stream) {
    if (!q_weight)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: q_weight: tensor is NULL", fn);
    return rope_cache_run(ctx, fn, positions, q, k, q_weight, k_weight, eps, gemma, cos_sin_cache,
                          is_neox, q_out, k_out, stream);
}

fi_status fi_qk_rmsnorm_rope(fi_context *ctx, const fi_tensor *positions, const fi_tensor *q,
                             const fi_tensor *k, const fi_tensor *q_weight,
                             const fi_tensor *k_weight, float eps, const fi_tensor *cos_sin_cache,
                             int32_t is_neox, fi_tensor *q_out, fi_tensor *k_out, void *stream) {
    return qk_norm_rope(ctx, "fi_qk_rmsnorm_rope", false, positions, q, k, q_weight, k_weight,
                        eps, cos_sin_cache, is_neox, q_out, k_out, stream);
}

fi_status fi_gemma_qk_rmsnorm_rope(fi_context *ctx, const fi_tensor *positions,
                                   const fi_tensor *q, const fi_tensor *k,
                                   const fi_tensor *q_weight, const fi_tensor *k_weight, float eps,
                                   const fi_tensor *cos_sin_cache, int32_t is_neox,
                                   fi_tensor *q_out, fi_tensor *k_out, void *stream) {
    return qk_norm_rope(ctx, "fi_gemma_qk_rmsnorm_rope", true, positions, q, k, q_weight,
                        k_weight, eps, cos_sin_cache, is_neox, q_out, k_out, stream);
}
