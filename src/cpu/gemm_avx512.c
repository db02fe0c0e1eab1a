/*
 * gemm_avx512.c — the AVX-512 prefill path: row blocks of at least
 * FI_AVX512_GEMM_ROWS packed rows, where a K/V block is worth packing once
 * and reusing for every row.
 *
 *   S = Q K^T: K converted to f32 and transposed into kt [dqk][64] (keys
 *     contiguous), then 8 rows x 32 keys register tiles: per d, two kt
 *     vectors and eight broadcast q values feed 16 FMAs.
 *   O = alpha O + P V: V converted to f32 rows vf [keys][dvo], then 8 rows x 32 dims tiles: per key, two V vectors and
 *     eight broadcast p values feed 16 FMAs.
 * No horizontal sums, and each converted element is reused by all rows of
 * the block. o stays in natural order. No software prefetch: a prefill
 * row block re-reads K/V that the previous row blocks brought into L2, and
 * a burst of prefetches for a whole block stalls on fill buffers.
 */
#include "cpu/avx512_common.h"

#define KT_COLS FI_CPU_BN /* kt row stride (keys) */

/* 16 x 16 f32 transpose of r[0..16) in place. */
INLINE void transpose16(__m512 r[16]) {
    __m512 t[16];
    UNROLL
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    UNROLL
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    /* r[4a + b] now holds, per 128-bit lane L, elements b of rows 4a..4a+3
     * from lane L; gather lanes across the four groups. */
    UNROLL
    for (int b = 0; b < 4; b++) {
        __m512 x0 = _mm512_shuffle_f32x4(r[b], r[4 + b], 0x44);      /* lanes 0,1 of g0, g1 */
        __m512 x1 = _mm512_shuffle_f32x4(r[8 + b], r[12 + b], 0x44); /* lanes 0,1 of g2, g3 */
        __m512 x2 = _mm512_shuffle_f32x4(r[b], r[4 + b], 0xee);      /* lanes 2,3 of g0, g1 */
        __m512 x3 = _mm512_shuffle_f32x4(r[8 + b], r[12 + b], 0xee);
        t[b] = _mm512_shuffle_f32x4(x0, x1, 0x88);      /* lane 0: column b */
        t[4 + b] = _mm512_shuffle_f32x4(x0, x1, 0xdd);  /* lane 1: column 4 + b */
        t[8 + b] = _mm512_shuffle_f32x4(x2, x3, 0x88);  /* lane 2: column 8 + b */
        t[12 + b] = _mm512_shuffle_f32x4(x2, x3, 0xdd); /* lane 3: column 12 + b */
    }
    UNROLL
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* kt[d][g .. g+16) = K[g + i][d] for 16 keys from g (zeros past n). */
INLINE void pack_k16(const fi_cpu_tile *t, float *kt, int32_t g, fi_dtype dt) {
    for (int32_t d = 0; d < t->dqk; d += 16) {
        __m512 r[16];
        UNROLL
        for (int i = 0; i < 16; i++)
            r[i] = g + i < t->keys ? load16_any(t->k[g + i], dt, d) : _mm512_setzero_ps();
        transpose16(r);
        UNROLL
        for (int i = 0; i < 16; i++) _mm512_store_ps(kt + (size_t)(d + i) * KT_COLS + g, r[i]);
    }
}

/* s[r][p .. p+32) for R <= 8 rows from q rows (stride dqk). */
INLINE void qk_tile8(const fi_cpu_tile *t, const float *kt, const float *q, float *s, int R,
                     int32_t p) {
    __m512 acc[8][2];
    UNROLL
    for (int r = 0; r < 8; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int32_t d = 0; d < t->dqk; d++) {
        __m512 k0 = _mm512_load_ps(kt + (size_t)d * KT_COLS + p);
        __m512 k1 = _mm512_load_ps(kt + (size_t)d * KT_COLS + p + 16);
        UNROLL
        for (int r = 0; r < R; r++) {
            __m512 b = _mm512_set1_ps(q[(size_t)r * t->dqk + d]);
            acc[r][0] = _mm512_fmadd_ps(b, k0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(b, k1, acc[r][1]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(s + (size_t)r * FI_CPU_BN + p, acc[r][0]);
        _mm512_storeu_ps(s + (size_t)r * FI_CPU_BN + p + 16, acc[r][1]);
    }
}

static void qk_panel(const fi_cpu_tile *t, const float *kt, int32_t p) {
    int32_t r = 0;
    for (; r + 8 <= t->rows; r += 8)
        qk_tile8(t, kt, t->q + (size_t)r * t->dqk, t->s + (size_t)r * FI_CPU_BN, 8, p);
    const float *q = t->q + (size_t)r * t->dqk;
    float *s = t->s + (size_t)r * FI_CPU_BN;
    switch (t->rows - r) {
    case 7: qk_tile8(t, kt, q, s, 7, p); break;
    case 6: qk_tile8(t, kt, q, s, 6, p); break;
    case 5: qk_tile8(t, kt, q, s, 5, p); break;
    case 4: qk_tile8(t, kt, q, s, 4, p); break;
    case 3: qk_tile8(t, kt, q, s, 3, p); break;
    case 2: qk_tile8(t, kt, q, s, 2, p); break;
    case 1: qk_tile8(t, kt, q, s, 1, p); break;
    default: break;
    }
}

INLINE void pack_k(const fi_cpu_tile *t, float *kt, fi_dtype dt) {
    for (int32_t g = 0; g < t->keys; g += 16) pack_k16(t, kt, g, dt);
}

void fi_avx512_qk_gemm(fi_cpu_tile *t) {
    float *kt = t->work; /* [dqk][KT_COLS] */
    switch (t->k_dtype) {
    case FI_DTYPE_BF16: pack_k(t, kt, FI_DTYPE_BF16); break;
    case FI_DTYPE_F16: pack_k(t, kt, FI_DTYPE_F16); break;
    case FI_DTYPE_E4M3: pack_k(t, kt, FI_DTYPE_E4M3); break;
    case FI_DTYPE_E5M2: pack_k(t, kt, FI_DTYPE_E5M2); break;
    default: pack_k(t, kt, FI_DTYPE_F32); break;
    }
    for (int32_t p = 0; p < t->keys; p += 32) qk_panel(t, kt, p);
    float ks = dtype_scale(t->k_dtype, t->k_scale);
    if (ks != 1.0f)
        for (int32_t r = 0; r < t->rows; r++)
            for (int32_t j = 0; j < t->keys; j++) t->s[(size_t)r * FI_CPU_BN + j] *= ks;
}

/* ----------------------------------------------------------------- P V */

/* o[r][d .. d+32) = alpha o + sum_j p[r][j] v[j][d ..] for R <= 8 rows;
 * V rows are f32 at v[j] (stride in floats: none, row pointers). */
INLINE void pv_tile8(const fi_cpu_tile *t, const float *const *v, float *o, const float *p,
                     const float *alpha, int R, int32_t d) {
    __m512 acc[8][2];
    UNROLL
    for (int r = 0; r < R; r++) {
        __m512 a = _mm512_set1_ps(alpha[r]);
        acc[r][0] = _mm512_mul_ps(a, _mm512_loadu_ps(o + (size_t)r * t->dvo + d));
        acc[r][1] = _mm512_mul_ps(a, _mm512_loadu_ps(o + (size_t)r * t->dvo + d + 16));
    }
    for (int32_t j = 0; j < t->keys; j++) {
        __m512 v0 = _mm512_loadu_ps(v[j] + d), v1 = _mm512_loadu_ps(v[j] + d + 16);
        UNROLL
        for (int r = 0; r < R; r++) {
            __m512 b = _mm512_set1_ps(p[(size_t)r * FI_CPU_BN + j]);
            acc[r][0] = _mm512_fmadd_ps(b, v0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(b, v1, acc[r][1]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(o + (size_t)r * t->dvo + d, acc[r][0]);
        _mm512_storeu_ps(o + (size_t)r * t->dvo + d + 16, acc[r][1]);
    }
}

static void pv_panel(const fi_cpu_tile *t, const float *const *v, int32_t d) {
    int32_t r = 0;
    for (; r + 8 <= t->rows; r += 8)
        pv_tile8(t, v, t->o + (size_t)r * t->dvo, t->s + (size_t)r * FI_CPU_BN, t->alpha + r, 8, d);
    float *o = t->o + (size_t)r * t->dvo;
    const float *p = t->s + (size_t)r * FI_CPU_BN, *a = t->alpha + r;
    switch (t->rows - r) {
    case 7: pv_tile8(t, v, o, p, a, 7, d); break;
    case 6: pv_tile8(t, v, o, p, a, 6, d); break;
    case 5: pv_tile8(t, v, o, p, a, 5, d); break;
    case 4: pv_tile8(t, v, o, p, a, 4, d); break;
    case 3: pv_tile8(t, v, o, p, a, 3, d); break;
    case 2: pv_tile8(t, v, o, p, a, 2, d); break;
    case 1: pv_tile8(t, v, o, p, a, 1, d); break;
    default: break;
    }
}

/* vf[j] = V row j as f32, natural order. */
INLINE void convert_v(const fi_cpu_tile *t, float *vf, const float **rows, fi_dtype dt) {
    for (int32_t j = 0; j < t->keys; j++) {
        float *dst = vf + (size_t)j * t->dvo;
        for (int32_t d = 0; d < t->dvo; d += 16) _mm512_store_ps(dst + d, load16_any(t->v[j], dt, d));
        rows[j] = dst;
    }
}

void fi_avx512_pv_gemm(fi_cpu_tile *t) {
    /* work: kt [FI_CPU_MAX_D][BN] (qk's), then vf [BN][MAX_D], row pointers */
    float *vf = (float *)t->work + FI_CPU_MAX_D * FI_CPU_BN;
    const float **rows = (const float **)(vf + FI_CPU_BN * FI_CPU_MAX_D);
    switch (t->v_dtype) {
    case FI_DTYPE_BF16: convert_v(t, vf, rows, FI_DTYPE_BF16); break;
    case FI_DTYPE_F16: convert_v(t, vf, rows, FI_DTYPE_F16); break;
    case FI_DTYPE_E4M3: convert_v(t, vf, rows, FI_DTYPE_E4M3); break;
    case FI_DTYPE_E5M2: convert_v(t, vf, rows, FI_DTYPE_E5M2); break;
    default: /* copied too: cache rows a page stride apart alias in L1 */
        convert_v(t, vf, rows, FI_DTYPE_F32);
        break;
    }
    float vs = dtype_scale(t->v_dtype, t->v_scale);
    if (vs != 1.0f)
        for (int32_t r = 0; r < t->rows; r++)
            for (int32_t j = 0; j < t->keys; j++) t->s[(size_t)r * FI_CPU_BN + j] *= vs;
    for (int32_t d = 0; d < t->dvo; d += 32) pv_panel(t, rows, d);
}
