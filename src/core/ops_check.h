/*
 * ops_check.h — argument checks the serving ops share (ops_norm.c,
 * ops_sample.c): a context with the backend family, float tensors of any
 * rank, per-row parameters as (tensor, value), index tensors, and outputs
 * apart from everything else. Each returns FI_OK or the fi_error() status
 * whose message names the function and the argument.
 */
#ifndef FI_CORE_OPS_CHECK_H
#define FI_CORE_OPS_CHECK_H

#include "core/internal.h"

/* Return the status of `expr` when it is not FI_OK. */
#define FI_OP_TRY(expr)                       \
    do {                                      \
        fi_status op_st_ = (expr);            \
        if (op_st_ != FI_OK) return op_st_;   \
    } while (0)

/* A live context whose backend has the family `op` (its table entry). */
#define FI_OP_CONTEXT(ctx, fn, op)                                         \
    do {                                                                   \
        FI_OP_TRY(fi_context_check((ctx), (fn)));                          \
        FI_OP_TRY(fi_op_backend_has((ctx), (fn), (ctx)->backend->op != NULL)); \
    } while (0)
fi_status fi_op_backend_has(const fi_context *ctx, const char *fn, bool present);

/* t is f32/f16/bf16 (or, with fp8_ok, e4m3/e5m2), of rank ndim (0: any
 * rank 1..FI_MAX_DIMS), shape as fi_check_tensor (NULL, -1 = any). */
fi_status fi_op_float(const fi_tensor *t, const char *fn, const char *name, int32_t ndim,
                      const int64_t *shape, bool fp8_ok);

/* The product of t's leading dims (its rows), checked to fit int64. */
fi_status fi_op_rows(const fi_tensor *t, const char *fn, const char *name, int64_t *rows);

/* b has a's rank and shape, but for the last dim, which is `last` (-1: a's). */
fi_status fi_op_same_shape(const fi_tensor *b, const fi_tensor *a, int64_t last,
                           const char *fn, const char *b_name, const char *a_name);

/* An index or count tensor: i32, 1-D, `len` entries (-1 = any), any stride. */
fi_status fi_op_index(const fi_tensor *t, const char *fn, const char *name, int64_t len);

/* A per-row parameter tensor (NULL or data NULL: absent, *out = NULL):
 * 1-D [batch] of dtype. */
fi_status fi_op_param(const fi_tensor *t, const char *fn, const char *name, fi_dtype dtype,
                      int64_t batch, const fi_tensor **out);

/* Output `out` holds no element twice and shares no byte with others[0..n)
 * (NULL entries skipped); with same_ok the very same view of others[i] is
 * allowed when same_ok[i] (in place). */
fi_status fi_op_apart(const fi_tensor *out, const char *fn, const char *out_name,
                      const fi_tensor *const *others, const char *const *names,
                      const bool *same_ok, int n);

/* Element i of a 1-D host tensor. */
static inline int32_t fi_op_i32_at(const fi_tensor *t, int64_t i) {
    return ((const int32_t *)t->data)[i * t->stride[0]];
}
static inline float fi_op_f32_at(const fi_tensor *t, int64_t i) {
    return ((const float *)t->data)[i * t->stride[0]];
}

#endif /* FI_CORE_OPS_CHECK_H */
