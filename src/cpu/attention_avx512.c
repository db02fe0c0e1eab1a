/*
 * attention_avx512.c — the AVX-512 SIMD table (F, BW, VL, DQ; F16C).
 *
 * All arithmetic is f32 FMA. vdpbf16ps shares the FMA ports at a lower
 * instruction rate, so bf16 dot products lose to converting bf16 to f32,
 * which costs one op per 16 values when the even and odd elements of a
 * 32-element chunk are split (shift left 16 / mask high half).
 * Everything that meets a bf16 row then works in that split order: q is
 * reordered once per row block (qx), and o is kept split while V is bf16
 * and put back by finish_o. See docs/CPU_KERNELS.md for the numbers.
 *
 * Shapes: q, qx, o rows of dqk / dvo floats; s rows of FI_CPU_BN floats;
 * K/V rows through tile pointers. Rows go in groups of up to 4.
 */
#include "cpu/simd.h"

#include <math.h>

#include "cpu/avx512_common.h"

/* ------------------------------------------------------------------ q */

static void avx512_prepare_q(fi_cpu_tile *t) {
    if (t->k_dtype != FI_DTYPE_BF16 || t->rows >= FI_AVX512_GEMM_ROWS) return;
    for (int32_t r = 0; r < t->rows; r++)
        for (int32_t d = 0; d < t->dqk; d += 32)
            split32(t->q + (size_t)r * t->dqk + d, t->qx + (size_t)r * t->dqk + d);
}

/* ---------------------------------------------------------------- q k^T */

/* [sum a, sum b, sum c, sum d]. */
INLINE __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
    __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xee));
    /* 128-bit lanes: partial sums of a, b, c, d */
    __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xdd));
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4e));
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0xb1));
    const __m512i pick = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(pick, s));
}

/* s[r][j .. j+4) for R rows from q (row stride dqk): dot products along D,
 * each K chunk loaded and converted once for the R rows. Keys past `nk`
 * repeat the last one and are not stored. */
INLINE void qk_tile(const fi_cpu_tile *t, const float *q, float *s, int R, int32_t j,
                    int32_t nk, fi_dtype dt) {
    const int W = chunk_width(dt);
    const uint8_t *kp[4];
    UNROLL
    for (int k = 0; k < 4; k++) kp[k] = t->k[j + (k < nk ? k : nk - 1)];
    __m512 acc[4][4];
    UNROLL
    for (int r = 0; r < 4; r++)
        UNROLL
        for (int k = 0; k < 4; k++) acc[r][k] = _mm512_setzero_ps();
    for (int32_t d = 0; d < t->dqk; d += 16 * W) {
        __m512 qv[4][2];
        UNROLL
        for (int r = 0; r < R; r++)
            UNROLL
            for (int w = 0; w < W; w++) qv[r][w] = _mm512_loadu_ps(q + (size_t)r * t->dqk + d + 16 * w);
        UNROLL
        for (int k = 0; k < 4; k++) {
            __m512 kv[2];
            load_chunk(kp[k], dt, d, kv);
            UNROLL
            for (int r = 0; r < R; r++)
                UNROLL
                for (int w = 0; w < W; w++) acc[r][k] = _mm512_fmadd_ps(qv[r][w], kv[w], acc[r][k]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) {
        __m128 v = reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
        float *dst = s + (size_t)r * FI_CPU_BN + j;
        if (nk == 4) _mm_storeu_ps(dst, v);
        else _mm_mask_storeu_ps(dst, (__mmask8)((1u << nk) - 1), v);
    }
}

/* The first row group also prefetches the next block's K, 4 rows a step. */
INLINE void qk_rows(const fi_cpu_tile *t, const float *q, float *s, int R, fi_dtype dt,
                    bool pf) {
    int32_t bytes = t->dqk * dtype_bytes(dt), step = t->keys_next > t->keys ? 8 : 4;
    for (int32_t j = 0; j < t->keys; j += 4) {
        if (pf) prefetch_rows(t->k_next, t->keys_next, j / 4 * step, step, bytes);
        qk_tile(t, q, s, R, j, t->keys - j < 4 ? t->keys - j : 4, dt);
    }
}

INLINE void qk_dtype(fi_cpu_tile *t, fi_dtype dt) {
    const float *q = dt == FI_DTYPE_BF16 ? t->qx : t->q;
    int32_t r = 0;
    for (; r + 4 <= t->rows; r += 4)
        qk_rows(t, q + (size_t)r * t->dqk, t->s + (size_t)r * FI_CPU_BN, 4, dt, r == 0);
    bool pf = r == 0;
    switch (t->rows - r) {
    case 3: qk_rows(t, q + (size_t)r * t->dqk, t->s + (size_t)r * FI_CPU_BN, 3, dt, pf); break;
    case 2: qk_rows(t, q + (size_t)r * t->dqk, t->s + (size_t)r * FI_CPU_BN, 2, dt, pf); break;
    case 1: qk_rows(t, q + (size_t)r * t->dqk, t->s + (size_t)r * FI_CPU_BN, 1, dt, pf); break;
    default: break;
    }
}

static void avx512_qk(fi_cpu_tile *t) {
    if (t->rows >= FI_AVX512_GEMM_ROWS) {
        fi_avx512_qk_gemm(t);
        return;
    }
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

static void avx512_softmax(fi_cpu_tile *t) {
    const __m512 inf = _mm512_set1_ps(INFINITY);
    for (int32_t r = 0; r < t->rows; r++) {
        float *s = t->s + (size_t)r * FI_CPU_BN;
        __m512 mx = _mm512_set1_ps(t->m[r]);
        __mmask16 bad = t->m[r] != t->m[r]; /* poisoned by an earlier block */
        for (int32_t j = 0; j < t->keys; j += 16) {
            __mmask16 k = t->keys - j >= 16 ? 0xffff : (__mmask16)((1u << (t->keys - j)) - 1);
            __m512 x = _mm512_maskz_loadu_ps(k, s + j);
            bad |= _mm512_mask_cmp_ps_mask(k, x, inf, _CMP_NLT_UQ); /* NaN or +inf */
            mx = _mm512_mask_max_ps(mx, k, mx, x);
        }
        if (bad) {
            fi_cpu_poison_row(t, r);
            continue;
        }
        float m = _mm512_reduce_max_ps(mx);
        if (m == -INFINITY) {
            t->alpha[r] = 1.0f;
            for (int32_t j = 0; j < t->keys; j++) s[j] = 0.0f;
            continue;
        }
        __m512 mv = _mm512_set1_ps(m), sum = _mm512_setzero_ps();
        for (int32_t j = 0; j < t->keys; j += 16) {
            __mmask16 k = t->keys - j >= 16 ? 0xffff : (__mmask16)((1u << (t->keys - j)) - 1);
            __m512 x = _mm512_maskz_loadu_ps(k, s + j);
            __m512 p = _mm512_maskz_mov_ps(k, exp2_ps(_mm512_sub_ps(x, mv)));
            _mm512_mask_storeu_ps(s + j, k, p);
            sum = _mm512_add_ps(sum, p);
        }
        float alpha = t->m[r] == -INFINITY ? 0.0f : exp2f(t->m[r] - m);
        t->alpha[r] = alpha;
        t->l[r] = t->l[r] * alpha + _mm512_reduce_add_ps(sum);
        t->m[r] = m;
    }
}

/* ----------------------------------------------------------------- P V */

/* o[r][d .. d + 64) (R rows) = alpha o + sum_j p[r][j] v[j][d ..]: four
 * accumulators per row, each V chunk converted once for the R rows. */
INLINE void pv_tile(fi_cpu_tile *t, float *o, const float *p, int R, int32_t d, fi_dtype dt,
                    bool pf) {
    int32_t bytes = t->dvo * dtype_bytes(dt), step = t->keys_next > t->keys ? 2 : 1;
    const int W = chunk_width(dt);
    __m512 acc[4][4];
    UNROLL
    for (int r = 0; r < R; r++) {
        __m512 a = _mm512_set1_ps(t->alpha[r]);
        UNROLL
        for (int c = 0; c < 4; c++)
            acc[r][c] = _mm512_mul_ps(a, _mm512_loadu_ps(o + (size_t)r * t->dvo + d + 16 * c));
    }
    for (int32_t j = 0; j < t->keys; j++) {
        if (pf) prefetch_rows(t->v_next, t->keys_next, j * step, step, bytes);
        __m512 v[4];
        UNROLL
        for (int c = 0; c < 4; c += W) load_chunk(t->v[j], dt, d + 16 * c, v + c);
        UNROLL
        for (int r = 0; r < R; r++) {
            __m512 pj = _mm512_set1_ps(p[(size_t)r * FI_CPU_BN + j]);
            UNROLL
            for (int c = 0; c < 4; c++) acc[r][c] = _mm512_fmadd_ps(pj, v[c], acc[r][c]);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int c = 0; c < 4; c++) _mm512_storeu_ps(o + (size_t)r * t->dvo + d + 16 * c, acc[r][c]);
}

INLINE void pv_rows(fi_cpu_tile *t, int32_t r0, int R, fi_dtype dt) {
    fi_cpu_tile sub = *t;
    sub.alpha = t->alpha + r0;
    for (int32_t d = 0; d < t->dvo; d += 64)
        pv_tile(&sub, t->o + (size_t)r0 * t->dvo, t->s + (size_t)r0 * FI_CPU_BN, R, d, dt,
                r0 == 0 && d == 0);
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

static void avx512_pv(fi_cpu_tile *t) {
    if (t->rows >= FI_AVX512_GEMM_ROWS) {
        fi_avx512_pv_gemm(t);
        return;
    }
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

static void avx512_finish_o(fi_cpu_tile *t) {
    if (t->v_dtype != FI_DTYPE_BF16 || t->rows >= FI_AVX512_GEMM_ROWS) return;
    for (int32_t r = 0; r < t->rows; r++)
        for (int32_t d = 0; d < t->dvo; d += 32) unsplit32(t->o + (size_t)r * t->dvo + d);
}

const fi_cpu_simd fi_cpu_simd_avx512 = {
    .name = "avx512",
    .prepare_q = avx512_prepare_q,
    .qk = avx512_qk,
    .softmax = avx512_softmax,
    .pv = avx512_pv,
    .finish_o = avx512_finish_o,
};
