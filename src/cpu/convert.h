/*
 * convert.h — scalar conversions between the storage dtypes and f32.
 * f16/bf16 round to nearest even; FP8 is decoded exactly (E4M3 is the "FN"
 * variant: no infinities, S.1111.111 is NaN).
 */
#ifndef FI_CPU_CONVERT_H
#define FI_CPU_CONVERT_H

#include "flashinfer.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

static inline float fi_bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t fi_f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float fi_bf16_to_f32(uint16_t h) { return fi_bits_to_f32((uint32_t)h << 16); }

static inline uint16_t fi_f32_to_bf16(float f) {
    uint32_t u = fi_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float fi_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return fi_bits_to_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) { /* zero or subnormal: man * 2^-24 */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return fi_bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t fi_f32_to_f16(float f) {
    uint32_t u = fi_f32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;             /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u;            /* overflow -> inf */
    if (a < 0x38800000u) {                                  /* subnormal or zero */
        float v = fi_bits_to_f32(a) * 16777216.0f;          /* in units of 2^-24 */
        return sign | (uint16_t)lrintf(v);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);            /* round to nearest even */
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

static inline float fi_e5m2_to_f32(uint8_t b) { return fi_f16_to_f32((uint16_t)b << 8); }

static inline float fi_e4m3_to_f32(uint8_t b) {
    uint32_t sign = b & 0x80u, exp = (b >> 3) & 0xfu, man = b & 7u;
    if (exp == 0xf && man == 7) return NAN;
    float v = exp ? ldexpf(1.0f + (float)man / 8.0f, (int)exp - 7)
                  : ldexpf((float)man / 8.0f, -6);
    return sign ? -v : v;
}

/* Element i of a buffer of `dtype` as f32 (f32/f16/bf16/e4m3/e5m2). */
static inline float fi_load_f32(const void *p, fi_dtype dtype, int64_t i) {
    switch (dtype) {
    case FI_DTYPE_F32: return ((const float *)p)[i];
    case FI_DTYPE_F16: return fi_f16_to_f32(((const uint16_t *)p)[i]);
    case FI_DTYPE_BF16: return fi_bf16_to_f32(((const uint16_t *)p)[i]);
    case FI_DTYPE_E4M3: return fi_e4m3_to_f32(((const uint8_t *)p)[i]);
    case FI_DTYPE_E5M2: return fi_e5m2_to_f32(((const uint8_t *)p)[i]);
    default: return 0.0f;
    }
}

/* Store f32 as element i of a buffer of `dtype` (f32/f16/bf16). */
static inline void fi_store_f32(void *p, fi_dtype dtype, int64_t i, float v) {
    switch (dtype) {
    case FI_DTYPE_F32: ((float *)p)[i] = v; break;
    case FI_DTYPE_F16: ((uint16_t *)p)[i] = fi_f32_to_f16(v); break;
    case FI_DTYPE_BF16: ((uint16_t *)p)[i] = fi_f32_to_bf16(v); break;
    default: break;
    }
}

/* dst[i] = scale * row[i] for i < n, the row's elements `stride` bytes apart. */
static inline void fi_load_row_f32(float *dst, const void *row, fi_dtype dtype, int64_t stride,
                                   int32_t n, float scale) {
    const uint8_t *p = (const uint8_t *)row;
    int64_t e = (int64_t)fi_dtype_size(dtype);
    if (stride == e) {
        for (int32_t i = 0; i < n; i++) dst[i] = scale * fi_load_f32(p, dtype, i);
    } else {
        for (int32_t i = 0; i < n; i++) dst[i] = scale * fi_load_f32(p + i * stride, dtype, 0);
    }
}

/* row[i] = mul * src[i] rounded to `dtype` (f32/f16/bf16), `stride` bytes apart. */
static inline void fi_store_row_f32(void *row, fi_dtype dtype, int64_t stride, const float *src,
                                    float mul, int32_t n) {
    uint8_t *p = (uint8_t *)row;
    int64_t e = (int64_t)fi_dtype_size(dtype);
    if (stride == e) {
        for (int32_t i = 0; i < n; i++) fi_store_f32(p, dtype, i, mul * src[i]);
    } else {
        for (int32_t i = 0; i < n; i++) fi_store_f32(p + i * stride, dtype, 0, mul * src[i]);
    }
}

/* Whether every x[0..n) is finite (an exponent field short of all ones):
 * the test that sends a row or chunk to an exact path (attention.c,
 * ops_merge.c). */
static inline bool fi_all_finite(const float *x, int32_t n) {
    uint32_t bad = 0;
    for (int32_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
    }
    return !bad;
}

#endif /* FI_CPU_CONVERT_H */
