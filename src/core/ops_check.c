/*
 * ops_check.c — the argument checks of the serving ops (ops_check.h).
 */
#include "core/ops_check.h"

#include "core/checked.h"

#include <stdio.h>

fi_status fi_op_backend_has(const fi_context *ctx, const char *fn, bool present) {
    if (present) return FI_OK;
    return fi_error(FI_STATUS_UNSUPPORTED, "%s: the %s backend does not implement it", fn,
                    ctx->backend->name);
}

static bool is_float(fi_dtype d) {
    return d == FI_DTYPE_F32 || d == FI_DTYPE_F16 || d == FI_DTYPE_BF16;
}

static bool is_fp8(fi_dtype d) { return d == FI_DTYPE_E4M3 || d == FI_DTYPE_E5M2; }

fi_status fi_op_float(const fi_tensor *t, const char *fn, const char *name, int32_t ndim,
                      const int64_t *shape, bool fp8_ok) {
    char full[96];
    snprintf(full, sizeof full, "%s: %s", fn, name);
    if (!t) return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: tensor is NULL", full);
    bool ok = is_float(t->dtype) || (fp8_ok && is_fp8(t->dtype));
    if (!ok)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s.dtype is %s, expected %s", full,
                        fi_dtype_name(t->dtype),
                        fp8_ok ? "f32, f16, bf16, e4m3 or e5m2" : "f32, f16 or bf16");
    if (ndim == 0) {
        if (t->ndim < 1 || t->ndim > FI_MAX_DIMS)
            return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s.ndim is %d, expected 1 to %d",
                            full, (int)t->ndim, FI_MAX_DIMS);
        ndim = t->ndim;
    }
    return fi_check_tensor(t, full, t->dtype, ndim, shape);
}

fi_status fi_op_rows(const fi_tensor *t, const char *fn, const char *name, int64_t *rows) {
    int64_t r = 1;
    for (int32_t d = 0; d + 1 < t->ndim; d++)
        if (!fi_mul_i64(r, t->shape[d], &r))
            return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: %s has too many rows", fn, name);
    *rows = r;
    return FI_OK;
}

fi_status fi_op_same_shape(const fi_tensor *b, const fi_tensor *a, int64_t last,
                           const char *fn, const char *b_name, const char *a_name) {
    if (b->ndim != a->ndim)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: %s.ndim is %d but %s.ndim is %d",
                        fn, b_name, (int)b->ndim, a_name, (int)a->ndim);
    for (int32_t d = 0; d < a->ndim; d++) {
        int64_t want = d + 1 == a->ndim && last >= 0 ? last : a->shape[d];
        if (b->shape[d] != want)
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "%s: %s.shape[%d]=%lld, expected %lld (from %s)", fn, b_name,
                            (int)d, (long long)b->shape[d], (long long)want, a_name);
    }
    return FI_OK;
}

fi_status fi_op_index(const fi_tensor *t, const char *fn, const char *name, int64_t len) {
    char full[96];
    snprintf(full, sizeof full, "%s: %s", fn, name);
    return fi_check_tensor(t, full, FI_DTYPE_I32, 1, &len);
}

fi_status fi_op_param(const fi_tensor *t, const char *fn, const char *name, fi_dtype dtype,
                      int64_t batch, const fi_tensor **out) {
    *out = NULL;
    if (!t || !t->data) return FI_OK;
    char full[96];
    snprintf(full, sizeof full, "%s: %s", fn, name);
    FI_OP_TRY(fi_check_tensor(t, full, dtype, 1, &batch));
    *out = t;
    return FI_OK;
}

fi_status fi_op_apart(const fi_tensor *out, const char *fn, const char *out_name,
                      const fi_tensor *const *others, const char *const *names,
                      const bool *same_ok, int n) {
    char full[96];
    snprintf(full, sizeof full, "%s: %s", fn, out_name);
    FI_OP_TRY(fi_check_no_self_overlap(out, full));
    for (int i = 0; i < n; i++)
        if (others[i])
            FI_OP_TRY(fi_check_disjoint(out, full, others[i], names[i],
                                        same_ok && same_ok[i]));
    return FI_OK;
}
