/*
 * attention_avx512.c — the AVX-512 SIMD table (F, BW, VL, DQ; F16C).
 *
 * All arithmetic is f32 FMA. On the machine this was tuned on (Sapphire
 * Rapids under KVM) vdpbf16ps retires one per ~2.4 ns against ~4 f32 FMAs
 * per ns and shares their ports, so bf16 dot products lose to converting
 * bf16 to f32, which costs one op per 16 values when the even and odd
 * elements of a 32-element chunk are split (shift left 16 / mask high half).
 * Everything that meets a bf16 row then works in that split order: q is
 * reordered once per row block (qx), and o is kept split while V is bf16
 * and put back by finish_o. See docs/CPU_KERNELS.md for the numbers.
 *
 * Shapes: q, qx, o rows of dqk / dvo floats; s rows of FI_CPU_BN floats;
 * K/V rows through tile pointers. Rows go in groups of up to 4.
 */
#include "cpu/simd.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>

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
        __m256i mag = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7);
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
static float dtype_scale(fi_dtype dt, float scale) {
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

/* ------------------------------------------------------------------ q */

static void avx512_prepare_q(fi_cpu_tile *t) {
    if (t->k_dtype != FI_DTYPE_BF16) return;
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

static void avx512_softmax(fi_cpu_tile *t) {
    const __m512 big = _mm512_set1_ps(FLT_MAX);
    for (int32_t r = 0; r < t->rows; r++) {
        float *s = t->s + (size_t)r * FI_CPU_BN;
        __m512 mx = _mm512_set1_ps(t->m[r]);
        for (int32_t j = 0; j < t->keys; j += 16) {
            __mmask16 k = t->keys - j >= 16 ? 0xffff : (__mmask16)((1u << (t->keys - j)) - 1);
            __m512 x = _mm512_min_ps(_mm512_maskz_loadu_ps(k, s + j), big); /* +inf stays finite */
            mx = _mm512_mask_max_ps(mx, k, mx, x);
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
            __m512 x = _mm512_min_ps(_mm512_maskz_loadu_ps(k, s + j), big);
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
    if (t->v_dtype != FI_DTYPE_BF16) return;
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
