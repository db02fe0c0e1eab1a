/*
 * checked.h — size arithmetic on caller values that cannot overflow
 * silently. Every function returns true when the exact result fits and
 * stores it; on overflow it returns false and leaves *out unchanged, so a
 * caller names the values and refuses them. Used wherever a size, a count
 * or a byte range is computed from bounds, shapes or strides a caller gave
 * (plans, cascades, block-sparse, the scheduler's limits, tensor extents).
 */
#ifndef FI_CORE_CHECKED_H
#define FI_CORE_CHECKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define FI_HAVE_OVERFLOW_BUILTINS 1
#endif

static inline bool fi_add_i64(int64_t a, int64_t b, int64_t *out) {
#ifdef FI_HAVE_OVERFLOW_BUILTINS
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) return false;
    *out = r;
    return true;
#else
    if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b)) return false;
    *out = a + b;
    return true;
#endif
}

static inline bool fi_mul_i64(int64_t a, int64_t b, int64_t *out) {
#ifdef FI_HAVE_OVERFLOW_BUILTINS
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r)) return false;
    *out = r;
    return true;
#else
    if (a == 0 || b == 0) {
        *out = 0;
        return true;
    }
    if (a > 0 ? (b > 0 ? a > INT64_MAX / b : b < INT64_MIN / a)
              : (b > 0 ? a < INT64_MIN / b : a < INT64_MAX / b))
        return false;
    *out = a * b;
    return true;
#endif
}

static inline bool fi_add_size(size_t a, size_t b, size_t *out) {
    if (a > SIZE_MAX - b) return false;
    *out = a + b;
    return true;
}

static inline bool fi_mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return false;
    *out = a * b;
    return true;
}

/* A running byte count: each step adds n x size rounded up to `align`
 * (a power of two, or 1), or marks the count as overflowed; the total is
 * read once at the end. For layouts carved from one allocation. */
typedef struct fi_size_sum {
    size_t bytes;
    bool overflow;
} fi_size_sum;

static inline void fi_size_sum_add(fi_size_sum *s, size_t n, size_t size, size_t align) {
    size_t b, at;
    if (s->overflow || !fi_mul_size(n, size, &b) || !fi_add_size(s->bytes, align - 1, &at)) {
        s->overflow = true;
        return;
    }
    at &= ~(align - 1);
    if (!fi_add_size(at, b, &s->bytes)) s->overflow = true;
}

/* Non-negative int64 to size_t, false if it does not fit (32-bit hosts). */
static inline bool fi_i64_to_size(int64_t v, size_t *out) {
    if (v < 0 || (uint64_t)v > (uint64_t)SIZE_MAX) return false;
    *out = (size_t)v;
    return true;
}

#endif /* FI_CORE_CHECKED_H */
