/*
 * avx512_common.h — inline AVX-512 helpers shared by the AVX-512 attention
 * files (compiled with -mavx512*): K/V element conversion to f32, the
 * bf16 even/odd split order, exp2, prefetch. Include only from *_avx512.c.
 */
#ifndef FI_CPU_AVX512_COMMON_H
#define FI_CPU_AVX512_COMMON_H

#include "cpu/simd.h"

#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline))
/* Register tiles are small arrays indexed by constant-trip loops; they stay
 * in registers only when those loops are fully unrolled. */
#define UNROLL _Pragma("GCC unroll 16")

/* ------------------------------------------------------------ conversion */

/* 16 consecutive elements of a K/V row as f32, from element i. E4M3 comes
 * out divided by 256 (its bits are moved into an f16); callers fold 256
 * into the scale. */
INLINE __m512 load16(const uint8_t *p, fi_dtype dt, int32_t i) {
    switch (dt) {
    case FI_DTYPE_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 2 * i)));
    case FI_DTYPE_E5M2: {
        __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + i)));
        return _mm512_cvtph_ps(_mm256_slli_epi16(w, 8));
    }
    case FI_DTYPE_E4M3: {
        __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + i)));
        __m256i low = _mm256_and_si256(w, _mm256_set1_epi16(0x7f));
        __m256i mag = _mm256_slli_epi16(low, 7);
        /* S.1111.111 is NaN in E4M3FN: give it the f16 NaN, not 1.875 * 2^0 */
        __m256i nan = _mm256_cmpeq_epi16(low, _mm256_set1_epi16(0x7f));
        mag = _mm256_blendv_epi8(mag, _mm256_set1_epi16(0x7e00), nan);
        __m256i sgn = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8);
        return _mm512_cvtph_ps(_mm256_or_si256(mag, sgn));
    }
    default:
        return _mm512_loadu_ps((const float *)p + i);
    }
}

/* A chunk of a K/V row from element i: bf16 gives 32 elements as two
 * vectors (even, odd); other dtypes 16 elements as one. */
INLINE int chunk_width(fi_dtype dt) { return dt == FI_DTYPE_BF16 ? 2 : 1; }

INLINE void load_chunk(const uint8_t *p, fi_dtype dt, int32_t i, __m512 out[2]) {
    if (dt == FI_DTYPE_BF16) {
        __m512i x = _mm512_loadu_si512((const void *)(p + 2 * i));
        out[0] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
        out[1] = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
    } else {
        out[0] = load16(p, dt, i);
    }
}

/* The factor a dtype's raw values carry (E4M3 is decoded / 256). */
static inline float dtype_scale(fi_dtype dt, float scale) {
    return dt == FI_DTYPE_E4M3 ? scale * 256.0f : scale;
}

/* Split / unsplit one 32-float chunk: natural (a = 0..15, b = 16..31) <->
 * (even, odd). */
INLINE void split32(const float *src, float *dst) {
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    __m512 a = _mm512_loadu_ps(src), b = _mm512_loadu_ps(src + 16);
    _mm512_storeu_ps(dst, _mm512_permutex2var_ps(a, ie, b));
    _mm512_storeu_ps(dst + 16, _mm512_permutex2var_ps(a, io, b));
}

INLINE void unsplit32(float *x) {
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    __m512 e = _mm512_loadu_ps(x), o = _mm512_loadu_ps(x + 16);
    _mm512_storeu_ps(x, _mm512_permutex2var_ps(e, lo, o));
    _mm512_storeu_ps(x + 16, _mm512_permutex2var_ps(e, hi, o));
}

/* Pull rows [j, j + n) of the next block towards L1 (keys_next of them). */
INLINE void prefetch_rows(const uint8_t *const *rows, int32_t have, int32_t j, int32_t n,
                          int32_t bytes) {
    for (int32_t i = j; i < j + n && i < have; i++) {
        for (int32_t b = 0; b < bytes; b += 64) _mm_prefetch((const char *)rows[i] + b, _MM_HINT_T0);
        _mm_prefetch((const char *)rows[i] + bytes - 1, _MM_HINT_T0);
    }
}

INLINE int32_t dtype_bytes(fi_dtype dt) {
    return dt == FI_DTYPE_F32 ? 4 : (dt == FI_DTYPE_F16 || dt == FI_DTYPE_BF16) ? 2 : 1;
}

/* 2^x for x <= 0 (x < -126, -inf included, gives exactly 0): 2^round(x)
 * times a degree-6 Taylor polynomial of 2^f on [-0.5, 0.5] (rel. err ~2e-7). */
INLINE __m512 exp2_ps(__m512 x) {
    __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-126.0f));
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.5403530393381606e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(live, p, n);
}

/* 16 elements of a bf16 row from element i, natural order. */
INLINE __m512 load16_bf16(const uint8_t *p, int32_t i) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p + 2 * i)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* 16 elements of any K/V dtype from element i, natural order. */
INLINE __m512 load16_any(const uint8_t *p, fi_dtype dt, int32_t i) {
    return dt == FI_DTYPE_BF16 ? load16_bf16(p, i) : load16(p, dt, i);
}

/* Row groups of the prefill (GEMM) path start at this many rows. */
#define FI_AVX512_GEMM_ROWS 16

void fi_avx512_qk_gemm(fi_cpu_tile *t);
void fi_avx512_pv_gemm(fi_cpu_tile *t);

#endif /* FI_CPU_AVX512_COMMON_H */
