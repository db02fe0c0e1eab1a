/* tensor.c — version, dtypes, tensor views and their validation. */
#include "core/internal.h"

#include <stdio.h>

int32_t fi_version_number(void) { return FI_VERSION_NUMBER; }
const char *fi_version_string(void) { return FI_VERSION_STRING; }

size_t fi_dtype_size(fi_dtype dtype) {
    switch (dtype) {
    case FI_DTYPE_F32: case FI_DTYPE_I32: return 4;
    case FI_DTYPE_F16: case FI_DTYPE_BF16: return 2;
    case FI_DTYPE_E4M3: case FI_DTYPE_E5M2: case FI_DTYPE_U8: return 1;
    }
    return 0;
}

const char *fi_dtype_name(fi_dtype dtype) {
    switch (dtype) {
    case FI_DTYPE_F32: return "f32";
    case FI_DTYPE_F16: return "f16";
    case FI_DTYPE_BF16: return "bf16";
    case FI_DTYPE_E4M3: return "e4m3";
    case FI_DTYPE_E5M2: return "e5m2";
    case FI_DTYPE_I32: return "i32";
    case FI_DTYPE_U8: return "u8";
    }
    return "unknown";
}

fi_tensor fi_tensor_contiguous(void *data, fi_dtype dtype, int32_t ndim,
                               const int64_t *shape) {
    fi_tensor t = {0};
    t.data = data;
    t.dtype = dtype;
    t.ndim = (ndim < 0 || ndim > FI_MAX_DIMS) ? 0 : ndim;
    int64_t stride = 1;
    for (int32_t d = t.ndim - 1; d >= 0; d--) {
        t.shape[d] = shape[d];
        t.stride[d] = stride;
        stride *= shape[d];
    }
    return t;
}

fi_status fi_tensor_split_kv(const fi_tensor *kv, fi_tensor *k_out, fi_tensor *v_out) {
    if (!kv || !k_out || !v_out)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "fi_tensor_split_kv: NULL argument");
    if (kv->ndim < 2 || kv->shape[1] != 2)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "fi_tensor_split_kv: kv must be [pages, 2, ...], got ndim %d, shape[1]=%lld",
                        (int)kv->ndim, kv->ndim >= 2 ? (long long)kv->shape[1] : -1LL);
    fi_tensor k = {0};
    k.dtype = kv->dtype;
    k.ndim = kv->ndim - 1;
    k.shape[0] = kv->shape[0];
    k.stride[0] = kv->stride[0];
    for (int32_t d = 2; d < kv->ndim; d++) {
        k.shape[d - 1] = kv->shape[d];
        k.stride[d - 1] = kv->stride[d];
    }
    fi_tensor v = k;
    k.data = kv->data;
    v.data = kv->data ? (char *)kv->data + kv->stride[1] * (int64_t)fi_dtype_size(kv->dtype) : NULL;
    *k_out = k;
    *v_out = v;
    return FI_OK;
}

fi_status fi_check_tensor(const fi_tensor *t, const char *name, fi_dtype dtype,
                          int32_t ndim, const int64_t *shape) {
    if (!t) return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: tensor is NULL", name);
    if (!t->data) return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s.data is NULL", name);
    if (t->dtype != dtype)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s.dtype is %s, expected %s", name,
                        fi_dtype_name(t->dtype), fi_dtype_name(dtype));
    if (t->ndim != ndim)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s.ndim is %d, expected %d", name,
                        (int)t->ndim, (int)ndim);
    size_t elem = fi_dtype_size(dtype);
    if ((uintptr_t)t->data % elem)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s.data=%p is not aligned to its element size %zu", name,
                        t->data, elem);
    /* The farthest element's byte offset must be representable, so that no
     * index computation in a backend can overflow. */
    const int64_t limit = INT64_MAX / 4;
    int64_t last = 0;
    for (int32_t d = 0; d < ndim; d++) {
        if (t->shape[d] > 0 && t->stride[d] > 0 &&
            (t->shape[d] - 1 > limit / t->stride[d] ||
             last > limit - (t->shape[d] - 1) * t->stride[d]))
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "%s: shape[%d]=%lld with stride %lld overflows the address range",
                            name, (int)d, (long long)t->shape[d], (long long)t->stride[d]);
        if (t->shape[d] > 0 && t->stride[d] > 0) last += (t->shape[d] - 1) * t->stride[d];
        if (t->shape[d] < 0)
            return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s.shape[%d]=%lld is negative",
                            name, (int)d, (long long)t->shape[d]);
        if (shape && shape[d] >= 0 && t->shape[d] != shape[d])
            return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s.shape[%d]=%lld, expected %lld",
                            name, (int)d, (long long)t->shape[d], (long long)shape[d]);
        if (t->stride[d] < 0)
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "%s.stride[%d]=%lld: negative strides are not supported",
                            name, (int)d, (long long)t->stride[d]);
    }
    if (last > limit / (int64_t)elem)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: its extent overflows the address range",
                        name);
    return FI_OK;
}

fi_status fi_check_indptr(const int32_t *indptr, int32_t n, const char *name,
                          int64_t max_last) {
    if (!indptr) return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s is NULL", name);
    if (indptr[0] != 0)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s[0]=%d: an indptr must start at 0",
                        name, (int)indptr[0]);
    for (int32_t i = 0; i < n; i++)
        if (indptr[i + 1] < indptr[i])
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "%s[%d]=%d > %s[%d]=%d: an indptr must not decrease", name,
                            (int)i, (int)indptr[i], name, (int)(i + 1), (int)indptr[i + 1]);
    if (max_last >= 0 && indptr[n] > max_last)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s[%d]=%d exceeds %lld", name, (int)n,
                        (int)indptr[n], (long long)max_last);
    return FI_OK;
}

/* The page table is the one O(pages) array the plan reads, so gcc builds
 * these loops for AVX2 as well and picks the clone at load time (clang
 * vectorises them at -O2 by itself). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
__attribute__((target_clones("avx2", "default"), optimize("O3")))
#endif
void fi_int32_range(const int32_t *a, int32_t n, int32_t *lo, int32_t *hi) {
    int32_t l = INT32_MAX, h = -1;
    for (int32_t j = 0; j < n; j++) {
        l = a[j] < l ? a[j] : l;
        h = a[j] > h ? a[j] : h;
    }
    *lo = l;
    *hi = h;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
__attribute__((target_clones("avx2", "default"), optimize("O3")))
#endif
void fi_int32_copy_range(int32_t *dst, const int32_t *a, int32_t n, int32_t *lo, int32_t *hi) {
    int32_t l = INT32_MAX, h = -1;
    for (int32_t j = 0; j < n; j++) {
        int32_t x = a[j];
        dst[j] = x;
        l = x < l ? x : l;
        h = x > h ? x : h;
    }
    *lo = l;
    *hi = h;
}
