/* tensor.c — version, dtypes, tensor views and their validation. */
#include "core/checked.h"
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

/* A stride past what any tensor can hold (INT64_MAX) stands for one that
 * overflowed: fi_check_tensor then refuses the view ("overflows the address
 * range"), as it does every extent it cannot represent. */
fi_tensor fi_tensor_contiguous(void *data, fi_dtype dtype, int32_t ndim,
                               const int64_t *shape) {
    fi_tensor t = {0};
    t.data = data;
    t.dtype = dtype;
    t.ndim = (ndim < 0 || ndim > FI_MAX_DIMS || (ndim > 0 && !shape)) ? 0 : ndim;
    int64_t stride = 1;
    bool overflow = false;
    for (int32_t d = t.ndim - 1; d >= 0; d--) {
        t.shape[d] = shape[d];
        t.stride[d] = overflow ? INT64_MAX : stride;
        if (!overflow && shape[d] > 1 && !fi_mul_i64(stride, shape[d], &stride)) overflow = true;
    }
    return t;
}

fi_status fi_tensor_split_kv(const fi_tensor *kv, fi_tensor *k_out, fi_tensor *v_out) {
    if (!kv || !k_out || !v_out)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "fi_tensor_split_kv: NULL argument");
    if (kv->ndim < 2 || kv->ndim > FI_MAX_DIMS)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "fi_tensor_split_kv: kv.ndim=%d: must be in [2, FI_MAX_DIMS=%d] "
                        "([pages, 2, ...])", (int)kv->ndim, FI_MAX_DIMS);
    if (kv->shape[1] != 2)
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
    int64_t v_off;
    if (kv->stride[1] < 0 || !fi_mul_i64(kv->stride[1], (int64_t)fi_dtype_size(kv->dtype), &v_off))
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "fi_tensor_split_kv: kv.stride[1]=%lld: V's offset is not a valid "
                        "byte offset", (long long)kv->stride[1]);
    fi_tensor v = k;
    k.data = kv->data;
    v.data = kv->data ? (void *)((uintptr_t)kv->data + (uintptr_t)v_off) : NULL;
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

/* ---------------------------------------------------------------- overlap */

/* Whether the overlap checks can read t: a rank, shapes and strides that
 * fi_check_tensor would accept (they may run before it; a tensor they
 * cannot read is left to its refusal). */
static bool readable(const fi_tensor *t) {
    if (!t->data || t->ndim < 0 || t->ndim > FI_MAX_DIMS || !fi_dtype_size(t->dtype)) return false;
    for (int32_t d = 0; d < t->ndim; d++)
        if (t->shape[d] < 0 || t->stride[d] < 0) return false;
    return true;
}

/* Bytes [*lo, *hi) of a readable tensor (*lo == *hi: no element); false
 * when its extent overflows or passes the end of the address space. */
static bool span(const fi_tensor *t, uintptr_t *lo, uintptr_t *hi) {
    int64_t last = 0, elem = (int64_t)fi_dtype_size(t->dtype), bytes;
    bool empty = false;
    *lo = *hi = (uintptr_t)t->data;
    for (int32_t d = 0; d < t->ndim; d++) {
        empty |= t->shape[d] == 0;
        if (!fi_mul_i64(t->shape[d] - 1, t->stride[d], &bytes) || !fi_add_i64(last, bytes, &last))
            return false;
    }
    if (empty) return true;
    if (!fi_mul_i64(last, elem, &bytes) || !fi_add_i64(bytes, elem, &bytes) ||
        (uint64_t)bytes > (uint64_t)(UINTPTR_MAX - *lo))
        return false;
    *hi = *lo + (uintptr_t)bytes;
    return true;
}

/* A tensor as the byte strides of its dimensions of more than one element. */
typedef struct dims {
    int32_t n;
    int64_t shape[FI_MAX_DIMS], stride[FI_MAX_DIMS];
    int64_t elem;
} dims;

static dims dims_of(const fi_tensor *t) {
    dims r = {0, {0}, {0}, (int64_t)fi_dtype_size(t->dtype)};
    for (int32_t d = 0; d < t->ndim; d++)
        if (t->shape[d] > 1) {
            r.shape[r.n] = t->shape[d];
            r.stride[r.n++] = t->stride[d] * r.elem; /* bounded: the span exists */
        }
    return r;
}

/* Bytes from the tensor's first byte to past its last one. */
static int64_t extent(const dims *t) {
    int64_t e = t->elem;
    for (int32_t d = 0; d < t->n; d++) e += (t->shape[d] - 1) * t->stride[d];
    return e;
}

static void drop(dims *t, int32_t d) {
    for (int32_t i = d + 1; i < t->n; i++) t->shape[i - 1] = t->shape[i], t->stride[i - 1] = t->stride[i];
    t->n--;
}

/* Whether a (at byte 0) and b (at byte `delta`) surely share no byte. The
 * dimension of largest stride P, with any of the other tensor's of that
 * same stride, is peeled off: rows i P of a and delta + j P of b meet only
 * where what remains of a meets what remains of b at delta + (j - i) P, for
 * the few j - i whose rows' spans meet. Interleaved views of one buffer (K
 * and V of a [pages, 2, ...] tensor in any layout, q and k of a fused qkv
 * buffer) come apart this way. *budget bounds the work; false = may share. */
static bool apart(dims a, dims b, int64_t delta, int32_t *budget) {
    int64_t ea = extent(&a), eb = extent(&b);
    if (delta >= ea || delta + eb <= 0) return true;
    if ((a.n == 0 && b.n == 0) || --*budget < 0) return false;
    int32_t da = -1, db = -1;
    for (int32_t d = 0; d < a.n; d++) if (da < 0 || a.stride[d] > a.stride[da]) da = d;
    for (int32_t d = 0; d < b.n; d++) if (db < 0 || b.stride[d] > b.stride[db]) db = d;
    int64_t P = da < 0 ? b.stride[db] : db < 0 ? a.stride[da]
              : (a.stride[da] > b.stride[db] ? a.stride[da] : b.stride[db]);
    int64_t na = 1, nb = 1;
    if (da >= 0 && a.stride[da] == P) na = a.shape[da], drop(&a, da);
    if (db >= 0 && b.stride[db] == P) nb = b.shape[db], drop(&b, db);
    if (P <= 0) return false;
    ea = extent(&a), eb = extent(&b);
    /* k = j - i with delta + k P + eb > 0 and delta + k P < ea */
    int64_t kmin = -(na - 1), kmax = nb - 1;
    int64_t lo = (-delta - eb) / P - 1, hi = (ea - delta) / P + 1; /* a superset of k's */
    if (lo > kmin) kmin = lo;
    if (hi < kmax) kmax = hi;
    if (kmax - kmin > 8) return false;
    for (int64_t k = kmin; k <= kmax; k++) {
        int64_t off;
        if (!fi_mul_i64(k, P, &off) || !fi_add_i64(delta, off, &off)) return false;
        if (!apart(a, b, off, budget)) return false;
    }
    return true;
}

/* Whether two tensors with spans [alo, ahi) and [blo, bhi) may share a byte. */
static bool may_overlap(const fi_tensor *a, uintptr_t alo, uintptr_t ahi, const fi_tensor *b,
                        uintptr_t blo, uintptr_t bhi) {
    if (alo == ahi || blo == bhi || ahi <= blo || bhi <= alo) return false;
    /* spans meet: both lie within 2^62 bytes of each other */
    int64_t delta = blo >= alo ? (int64_t)(blo - alo) : -(int64_t)(alo - blo);
    int32_t budget = 256;
    return !apart(dims_of(a), dims_of(b), delta, &budget);
}

static bool same_view(const fi_tensor *a, const fi_tensor *b) {
    if (a->data != b->data || a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int32_t d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || a->stride[d] != b->stride[d]) return false;
    return true;
}

static fi_status self_overlap(const fi_tensor *t, const char *name);

/* A tensor's span, or false for one the checks leave to fi_check_tensor. */
static bool checked_span(const fi_tensor *t, uintptr_t *lo, uintptr_t *hi) {
    return readable(t) && span(t, lo, hi);
}

static fi_status overlap_error(const fi_tensor *out, const char *out_name, const fi_tensor *other,
                               const char *other_name, bool same_view_ok) {
    return fi_error(FI_STATUS_INVALID_ARGUMENT,
                    "%s (data %p) overlaps %s (data %p): an output must not share data with "
                    "another tensor of the call%s", out_name, out->data, other_name, other->data,
                    same_view_ok ? " (in place needs the same view: the same data, dtype, "
                                   "shape and strides)" : "");
}

fi_status fi_check_disjoint(const fi_tensor *out, const char *out_name, const fi_tensor *other,
                            const char *other_name, bool same_view_ok) {
    uintptr_t alo, ahi, blo, bhi;
    if (!checked_span(out, &alo, &ahi) || !checked_span(other, &blo, &bhi)) return FI_OK;
    if (same_view_ok && same_view(out, other)) return FI_OK;
    if (!may_overlap(out, alo, ahi, other, blo, bhi)) return FI_OK;
    return overlap_error(out, out_name, other, other_name, same_view_ok);
}

fi_status fi_check_apart(const fi_tensor *const *outs, const char *const *out_names, int n_out,
                         const fi_tensor *const *ins, const char *const *in_names, int n_in) {
    enum { MAX = 16 };
    uintptr_t lo[MAX], hi[MAX];
    bool known[MAX];
    int n = n_out + n_in;
    if (n > MAX) return fi_error(FI_STATUS_INTERNAL, "fi_check_apart: %d tensors", n);
    for (int i = 0; i < n; i++) {
        const fi_tensor *t = i < n_out ? outs[i] : ins[i - n_out];
        known[i] = t && checked_span(t, &lo[i], &hi[i]);
    }
    for (int i = 0; i < n_out; i++) {
        if (!known[i]) continue;
        fi_status st = self_overlap(outs[i], out_names[i]);
        if (st) return st;
        for (int k = i + 1; k < n; k++) {
            const fi_tensor *t = k < n_out ? outs[k] : ins[k - n_out];
            if (known[k] && may_overlap(outs[i], lo[i], hi[i], t, lo[k], hi[k]))
                return overlap_error(outs[i], out_names[i], t,
                                     k < n_out ? out_names[k] : in_names[k - n_out], false);
        }
    }
    return FI_OK;
}

fi_status fi_check_no_self_overlap(const fi_tensor *t, const char *name) {
    uintptr_t lo, hi;
    if (!checked_span(t, &lo, &hi)) return FI_OK;
    return self_overlap(t, name);
}

/* fi_check_no_self_overlap for a tensor whose span exists. */
static fi_status self_overlap(const fi_tensor *t, const char *name) {
    /* Dimensions in increasing stride: each stride must pass the extent of
     * those before it, or two indices reach one element. */
    int32_t order[FI_MAX_DIMS], n = 0;
    for (int32_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] <= 1) {
            if (t->shape[d] == 0) return FI_OK; /* no element at all */
            continue;
        }
        int32_t i = n++;
        while (i > 0 && t->stride[order[i - 1]] > t->stride[d]) {
            order[i] = order[i - 1];
            i--;
        }
        order[i] = d;
    }
    int64_t extent = 1;
    for (int32_t i = 0; i < n; i++) {
        int32_t d = order[i], e = i ? order[i - 1] : d;
        if (t->stride[d] < extent)
            return fi_error(FI_STATUS_INVALID_ARGUMENT,
                            "%s.stride[%d]=%lld (shape %lld) and %s.stride[%d]=%lld (shape "
                            "%lld): two of its elements share memory (an output's strides "
                            "must not make its rows overlap)", name, (int)e,
                            (long long)t->stride[e], (long long)t->shape[e], name, (int)d,
                            (long long)t->stride[d], (long long)t->shape[d]);
        extent += (t->shape[d] - 1) * t->stride[d]; /* bounded: its span exists */
    }
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
 * vectorises them at -O2 by itself). Not under ThreadSanitizer: the clone's
 * resolver runs at relocation, before the sanitizer's runtime is up. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__) && \
    !defined(__SANITIZE_THREAD__)
#define FI_INT32_CLONES 1
#endif
#ifdef FI_INT32_CLONES
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

#ifdef FI_INT32_CLONES
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
