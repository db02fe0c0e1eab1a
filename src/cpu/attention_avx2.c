/*
 * attention_avx2.c — the AVX2 + FMA + F16C SIMD table (8-wide f32).
 *
 * The same shape as the AVX-512 table with half the width and half the
 * registers: Q.K^T as dot products over D for 2 rows x 4 keys (8
 * accumulators), P.V for up to 4 rows x 16 dims. bf16 rows are converted 16
 * at a time split into even and odd elements (one op per 8 values); q is
 * reordered to match (qx) and o is kept in that order while V is bf16.
 */
#include "cpu/simd.h"

#include <immintrin.h>
#include <math.h>

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

/* 8 elements of a K/V row as f32 from element i (E4M3 comes out / 256). */
INLINE __m256 load8(const uint8_t *p, fi_dtype dt, int32_t i) {
    switch (dt) {
    case FI_DTYPE_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i)));
    case FI_DTYPE_E5M2: {
        __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(p + i)));
        return _mm256_cvtph_ps(_mm_slli_epi16(w, 8));
    }
    case FI_DTYPE_E4M3: {
        __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(p + i)));
        __m128i low = _mm_and_si128(w, _mm_set1_epi16(0x7f));
        __m128i mag = _mm_slli_epi16(low, 7);
        /* S.1111.111 is NaN in E4M3FN: give it the f16 NaN, not 1.875 * 2^0 */
        __m128i nan = _mm_cmpeq_epi16(low, _mm_set1_epi16(0x7f));
        mag = _mm_blendv_epi8(mag, _mm_set1_epi16(0x7e00), nan);
        __m128i sgn = _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8);
        return _mm256_cvtph_ps(_mm_or_si128(mag, sgn));
    }
    default:
        return _mm256_loadu_ps((const float *)p + i);
    }
}

INLINE int chunk_width(fi_dtype dt) { return dt == FI_DTYPE_BF16 ? 2 : 1; }

/* bf16: 16 elements as (even, odd); other dtypes: 8 elements. */
INLINE void load_chunk(const uint8_t *p, fi_dtype dt, int32_t i, __m256 out[2]) {
    if (dt == FI_DTYPE_BF16) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(p + 2 * i));
        out[0] = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
        out[1] = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xffff0000u)));
    } else {
        out[0] = load8(p, dt, i);
    }
}

static float dtype_scale(fi_dtype dt, float scale) {
    return dt == FI_DTYPE_E4M3 ? scale * 256.0f : scale;
}

INLINE int32_t dtype_bytes(fi_dtype dt) {
    return dt == FI_DTYPE_F32 ? 4 : (dt == FI_DTYPE_F16 || dt == FI_DTYPE_BF16) ? 2 : 1;
}

INLINE void prefetch_rows(const uint8_t *const *rows, int32_t have, int32_t j, int32_t n,
                          int32_t bytes) {
    for (int32_t i = j; i < j + n && i < have; i++) {
        for (int32_t b = 0; b < bytes; b += 64) _mm_prefetch((const char *)rows[i] + b, _MM_HINT_T0);
        _mm_prefetch((const char *)rows[i] + bytes - 1, _MM_HINT_T0);
    }
}

/* ------------------------------------------------------------------ q */

static void avx2_prepare_q(fi_cpu_tile *t) {
    if (t->k_dtype != FI_DTYPE_BF16) return;
    for (int32_t r = 0; r < t->rows; r++) {
        const float *q = t->q + (size_t)r * t->dqk;
        float *x = t->qx + (size_t)r * t->dqk;
        for (int32_t d = 0; d < t->dqk; d += 16)
            for (int32_t i = 0; i < 8; i++) x[d + i] = q[d + 2 * i], x[d + 8 + i] = q[d + 2 * i + 1];
    }
}

/* ---------------------------------------------------------------- q k^T */

/* [sum a, sum b, sum c, sum d]. */
INLINE __m128 reduce4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* s[r][j .. j+4) for R <= 2 rows. Keys past nk repeat the last one. */
INLINE void qk_tile(const fi_cpu_tile *t, const float *q, float *s, int R, int32_t j,
                    int32_t nk, fi_dtype dt) {
    const int W = chunk_width(dt);
    const uint8_t *kp[4];
    UNROLL
    for (int k = 0; k < 4; k++) kp[k] = t->k[j + (k < nk ? k : nk - 1)];
    __m256 acc[2][4];
    UNROLL
    for (int r = 0; r < 2; r++)
        UNROLL
        for (int k = 0; k < 4; k++) acc[r][k] = _mm256_setzero_ps();
    for (int32_t d = 0; d < t->dqk; d += 8 * W) {
        __m256 qv[2][2];
        UNROLL
        for (int r = 0; r < R; r++)
            UNROLL
            for (int w = 0; w < W; w++) qv[r][w] = _mm256_loadu_ps(q + (size_t)r * t->dqk + d + 8 * w);
        UNROLL
        for (int k = 0; k < 4; k++) {
            __m256 kv[2];
            load_chunk(kp[k], dt, d, kv);
            UNROLL
            for (int r = 0; r < R; r++)
                UNROLL
                for (int w = 0; w < W; w++) acc[r][k] = _mm256_fmadd_ps(qv[r][w], kv[w], acc[r][k]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) {
        float out[4];
        _mm_storeu_ps(out, reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
        for (int k = 0; k < nk; k++) s[(size_t)r * FI_CPU_BN + j + k] = out[k];
    }
}

INLINE void qk_rows(const fi_cpu_tile *t, const float *q, float *s, int R, fi_dtype dt, bool pf) {
    int32_t bytes = t->dqk * dtype_bytes(dt), step = t->keys_next > t->keys ? 8 : 4;
    for (int32_t j = 0; j < t->keys; j += 4) {
        if (pf) prefetch_rows(t->k_next, t->keys_next, j / 4 * step, step, bytes);
        qk_tile(t, q, s, R, j, t->keys - j < 4 ? t->keys - j : 4, dt);
    }
}

INLINE void qk_dtype(fi_cpu_tile *t, fi_dtype dt) {
    const float *q = dt == FI_DTYPE_BF16 ? t->qx : t->q;
    int32_t r = 0;
    for (; r + 2 <= t->rows; r += 2)
        qk_rows(t, q + (size_t)r * t->dqk, t->s + (size_t)r * FI_CPU_BN, 2, dt, r == 0);
    if (r < t->rows) qk_rows(t, q + (size_t)r * t->dqk, t->s + (size_t)r * FI_CPU_BN, 1, dt, r == 0);
}

static void avx2_qk(fi_cpu_tile *t) {
    switch (t->k_dtype) {
    case FI_DTYPE_BF16: qk_dtype(t, FI_DTYPE_BF16); break;
    case FI_DTYPE_F16: qk_dtype(t, FI_DTYPE_F16); break;
    case FI_DTYPE_E4M3: qk_dtype(t, FI_DTYPE_E4M3); break;
    case FI_DTYPE_E5M2: qk_dtype(t, FI_DTYPE_E5M2); break;
    default: qk_dtype(t, FI_DTYPE_F32); break;
    }
    float ks = dtype_scale(t->k_dtype, t->k_scale);
    if (ks != 1.0f)
        for (int32_t r = 0; r < t->rows; r++)
            for (int32_t j = 0; j < t->keys; j++) t->s[(size_t)r * FI_CPU_BN + j] *= ks;
}

/* --------------------------------------------------------------- softmax */

/* 2^x for x <= 0; x < -126 (and -inf) gives 0. As the AVX-512 version, with
 * 2^n built in the exponent field. */
INLINE __m256 exp2_ps(__m256 x) {
    __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_GE_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-126.0f));
    __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(1.5403530393381606e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076284772e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108664821580e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650695910071e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718055994531e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(live, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

INLINE __m256 tail_mask(int32_t left) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(left), idx));
}

INLINE float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

INLINE float hsum(__m256 v) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static void avx2_softmax(fi_cpu_tile *t) {
    const __m256 inf = _mm256_set1_ps(INFINITY), ninf = _mm256_set1_ps(-INFINITY);
    for (int32_t r = 0; r < t->rows; r++) {
        float *s = t->s + (size_t)r * FI_CPU_BN;
        __m256 mx = _mm256_set1_ps(t->m[r]);
        __m256 bad = _mm256_setzero_ps();
        for (int32_t j = 0; j < t->keys; j += 8) {
            __m256 k = tail_mask(t->keys - j);
            __m256 x = _mm256_maskload_ps(s + j, _mm256_castps_si256(k));
            bad = _mm256_or_ps(bad, _mm256_and_ps(k, _mm256_cmp_ps(x, inf, _CMP_NLT_UQ)));
            mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, x, k));
        }
        if (_mm256_movemask_ps(bad) || t->m[r] != t->m[r]) { /* NaN or +inf; poisoned before */
            fi_cpu_poison_row(t, r);
            continue;
        }
        float m = hmax(mx);
        if (m == -INFINITY) {
            t->alpha[r] = 1.0f;
            for (int32_t j = 0; j < t->keys; j++) s[j] = 0.0f;
            continue;
        }
        __m256 mv = _mm256_set1_ps(m), sum = _mm256_setzero_ps();
        for (int32_t j = 0; j < t->keys; j += 8) {
            __m256 k = tail_mask(t->keys - j);
            __m256 x = _mm256_maskload_ps(s + j, _mm256_castps_si256(k));
            __m256 p = _mm256_and_ps(k, exp2_ps(_mm256_sub_ps(x, mv)));
            _mm256_maskstore_ps(s + j, _mm256_castps_si256(k), p);
            sum = _mm256_add_ps(sum, p);
        }
        float alpha = t->m[r] == -INFINITY ? 0.0f : exp2f(t->m[r] - m);
        t->alpha[r] = alpha;
        t->l[r] = t->l[r] * alpha + hsum(sum);
        t->m[r] = m;
    }
}

/* ----------------------------------------------------------------- P V */

/* o[r][d .. d + 16) for R <= 4 rows: two accumulators per row. */
INLINE void pv_tile(fi_cpu_tile *t, float *o, const float *p, const float *alpha, int R,
                    int32_t d, fi_dtype dt, bool pf) {
    const int W = chunk_width(dt);
    int32_t bytes = t->dvo * dtype_bytes(dt), step = t->keys_next > t->keys ? 2 : 1;
    __m256 acc[4][2];
    UNROLL
    for (int r = 0; r < R; r++) {
        __m256 a = _mm256_set1_ps(alpha[r]);
        UNROLL
        for (int c = 0; c < 2; c++)
            acc[r][c] = _mm256_mul_ps(a, _mm256_loadu_ps(o + (size_t)r * t->dvo + d + 8 * c));
    }
    for (int32_t j = 0; j < t->keys; j++) {
        if (pf) prefetch_rows(t->v_next, t->keys_next, j * step, step, bytes);
        __m256 v[2];
        UNROLL
        for (int c = 0; c < 2; c += W) load_chunk(t->v[j], dt, d + 8 * c, v + c);
        UNROLL
        for (int r = 0; r < R; r++) {
            __m256 pj = _mm256_broadcast_ss(p + (size_t)r * FI_CPU_BN + j);
            UNROLL
            for (int c = 0; c < 2; c++) acc[r][c] = _mm256_fmadd_ps(pj, v[c], acc[r][c]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int c = 0; c < 2; c++) _mm256_storeu_ps(o + (size_t)r * t->dvo + d + 8 * c, acc[r][c]);
}

INLINE void pv_rows(fi_cpu_tile *t, int32_t r0, int R, fi_dtype dt) {
    for (int32_t d = 0; d < t->dvo; d += 16)
        pv_tile(t, t->o + (size_t)r0 * t->dvo, t->s + (size_t)r0 * FI_CPU_BN, t->alpha + r0, R, d,
                dt, r0 == 0 && d == 0);
}

INLINE void pv_dtype(fi_cpu_tile *t, fi_dtype dt) {
    int32_t r = 0;
    for (; r + 4 <= t->rows; r += 4) pv_rows(t, r, 4, dt);
    switch (t->rows - r) {
    case 3: pv_rows(t, r, 3, dt); break;
    case 2: pv_rows(t, r, 2, dt); break;
    case 1: pv_rows(t, r, 1, dt); break;
    default: break;
    }
}

static void avx2_pv(fi_cpu_tile *t) {
    float vs = dtype_scale(t->v_dtype, t->v_scale);
    if (vs != 1.0f)
        for (int32_t r = 0; r < t->rows; r++)
            for (int32_t j = 0; j < t->keys; j++) t->s[(size_t)r * FI_CPU_BN + j] *= vs;
    switch (t->v_dtype) {
    case FI_DTYPE_BF16: pv_dtype(t, FI_DTYPE_BF16); break;
    case FI_DTYPE_F16: pv_dtype(t, FI_DTYPE_F16); break;
    case FI_DTYPE_E4M3: pv_dtype(t, FI_DTYPE_E4M3); break;
    case FI_DTYPE_E5M2: pv_dtype(t, FI_DTYPE_E5M2); break;
    default: pv_dtype(t, FI_DTYPE_F32); break;
    }
}

static void avx2_finish_o(fi_cpu_tile *t) {
    if (t->v_dtype != FI_DTYPE_BF16) return;
    for (int32_t r = 0; r < t->rows; r++) {
        float *o = t->o + (size_t)r * t->dvo, tmp[16];
        for (int32_t d = 0; d < t->dvo; d += 16) {
            for (int32_t i = 0; i < 8; i++) tmp[2 * i] = o[d + i], tmp[2 * i + 1] = o[d + 8 + i];
            for (int32_t i = 0; i < 16; i++) o[d + i] = tmp[i];
        }
    }
}

const fi_cpu_simd fi_cpu_simd_avx2 = {
    .name = "avx2",
    .prepare_q = avx2_prepare_q,
    .qk = avx2_qk,
    .softmax = avx2_softmax,
    .pv = avx2_pv,
    .finish_o = avx2_finish_o,
};
