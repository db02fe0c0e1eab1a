/*
 * attention_neon.c — the AArch64 Advanced SIMD table (4-wide f32 FMA).
 * Built only on aarch64 (the Makefile drops *_neon.c elsewhere).
 *
 * Q.K^T as dot products over D for up to 4 rows x 4 keys (16 accumulators,
 * pairwise-add reduction), P.V for up to 4 rows x 16 dims. K/V rows are
 * converted 8 elements at a time in natural order (bf16 by a widening shift,
 * f16 by vcvt, FP8 through f16), so q and o need no reordering.
 */
#include "cpu/simd.h"

#include <arm_neon.h>
#include <float.h>
#include <math.h>

#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

/* f16 bits (u16) to two f32 vectors. */
INLINE void f16x8_to_f32(uint16x8_t h, float32x4_t out[2]) {
    float16x8_t f = vreinterpretq_f16_u16(h);
    out[0] = vcvt_f32_f16(vget_low_f16(f));
    out[1] = vcvt_high_f32_f16(f);
}

/* 8 elements of a K/V row from element i as f32 (E4M3 comes out / 256). */
INLINE void load8(const uint8_t *p, fi_dtype dt, int32_t i, float32x4_t out[2]) {
    switch (dt) {
    case FI_DTYPE_F16:
        f16x8_to_f32(vld1q_u16((const uint16_t *)(p + 2 * i)), out);
        break;
    case FI_DTYPE_BF16: {
        uint16x8_t h = vld1q_u16((const uint16_t *)(p + 2 * i));
        out[0] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
        out[1] = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
        break;
    }
    case FI_DTYPE_E5M2:
        f16x8_to_f32(vshll_n_u8(vld1_u8(p + i), 8), out);
        break;
    case FI_DTYPE_E4M3: {
        uint16x8_t w = vmovl_u8(vld1_u8(p + i));
        uint16x8_t low = vandq_u16(w, vdupq_n_u16(0x7f));
        /* S.1111.111 is NaN in E4M3FN: give it the f16 NaN, not 1.875 * 2^0 */
        uint16x8_t mag = vbslq_u16(vceqq_u16(low, vdupq_n_u16(0x7f)), vdupq_n_u16(0x7e00),
                                   vshlq_n_u16(low, 7));
        uint16x8_t sgn = vshlq_n_u16(vandq_u16(w, vdupq_n_u16(0x80)), 8);
        f16x8_to_f32(vorrq_u16(mag, sgn), out);
        break;
    }
    default:
        out[0] = vld1q_f32((const float *)p + i);
        out[1] = vld1q_f32((const float *)p + i + 4);
        break;
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
    for (int32_t i = j; i < j + n && i < have; i++)
        for (int32_t b = 0; b < bytes; b += 64) __builtin_prefetch(rows[i] + b, 0, 3);
}

/* ---------------------------------------------------------------- q k^T */

/* s[r][j .. j+4) for R <= 4 rows. Keys past nk repeat the last one. */
INLINE void qk_tile(const fi_cpu_tile *t, const float *q, float *s, int R, int32_t j,
                    int32_t nk, fi_dtype dt) {
    const uint8_t *kp[4];
    UNROLL
    for (int k = 0; k < 4; k++) kp[k] = t->k[j + (k < nk ? k : nk - 1)];
    float32x4_t acc[4][4];
    UNROLL
    for (int r = 0; r < 4; r++)
        UNROLL
        for (int k = 0; k < 4; k++) acc[r][k] = vdupq_n_f32(0.0f);
    for (int32_t d = 0; d < t->dqk; d += 8) {
        float32x4_t qv[4][2];
        UNROLL
        for (int r = 0; r < R; r++) {
            qv[r][0] = vld1q_f32(q + (size_t)r * t->dqk + d);
            qv[r][1] = vld1q_f32(q + (size_t)r * t->dqk + d + 4);
        }
        UNROLL
        for (int k = 0; k < 4; k++) {
            float32x4_t kv[2];
            load8(kp[k], dt, d, kv);
            UNROLL
            for (int r = 0; r < R; r++) {
                acc[r][k] = vfmaq_f32(acc[r][k], qv[r][0], kv[0]);
                acc[r][k] = vfmaq_f32(acc[r][k], qv[r][1], kv[1]);
            }
        }
    }
    UNROLL
    for (int r = 0; r < R; r++) {
        /* [sum acc0, sum acc1, sum acc2, sum acc3] */
        float32x4_t v = vpaddq_f32(vpaddq_f32(acc[r][0], acc[r][1]), vpaddq_f32(acc[r][2], acc[r][3]));
        float out[4];
        vst1q_f32(out, v);
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
    int32_t r = 0;
    for (; r + 4 <= t->rows; r += 4)
        qk_rows(t, t->q + (size_t)r * t->dqk, t->s + (size_t)r * FI_CPU_BN, 4, dt, r == 0);
    const float *q = t->q + (size_t)r * t->dqk;
    float *s = t->s + (size_t)r * FI_CPU_BN;
    switch (t->rows - r) {
    case 3: qk_rows(t, q, s, 3, dt, r == 0); break;
    case 2: qk_rows(t, q, s, 2, dt, r == 0); break;
    case 1: qk_rows(t, q, s, 1, dt, r == 0); break;
    default: break;
    }
}

static void neon_qk(fi_cpu_tile *t) {
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

/* 2^x for x <= 0; x < -126 (and -inf) gives 0. */
INLINE float32x4_t exp2_f32(float32x4_t x) {
    uint32x4_t live = vcgeq_f32(x, vdupq_n_f32(-126.0f));
    x = vmaxq_f32(x, vdupq_n_f32(-126.0f));
    float32x4_t n = vrndnq_f32(x);
    float32x4_t f = vsubq_f32(x, n);
    float32x4_t p = vdupq_n_f32(1.5403530393381606e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3333558146428443e-3f), p, f);
    p = vfmaq_f32(vdupq_n_f32(9.6181291076284772e-3f), p, f);
    p = vfmaq_f32(vdupq_n_f32(5.5504108664821580e-2f), p, f);
    p = vfmaq_f32(vdupq_n_f32(2.4022650695910071e-1f), p, f);
    p = vfmaq_f32(vdupq_n_f32(6.9314718055994531e-1f), p, f);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, f);
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    float32x4_t r = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vandq_u32(live, vreinterpretq_u32_f32(r)));
}

static void neon_softmax(fi_cpu_tile *t) {
    for (int32_t r = 0; r < t->rows; r++) {
        float *s = t->s + (size_t)r * FI_CPU_BN;
        float m = t->m[r];
        int32_t j = 0;
        float32x4_t mx = vdupq_n_f32(m);
        /* NaN or +inf: not below +inf; a NaN m: poisoned by an earlier block */
        uint32x4_t ok = vdupq_n_u32(m == m ? 0xffffffffu : 0);
        for (; j + 4 <= t->keys; j += 4) {
            float32x4_t x = vld1q_f32(s + j);
            ok = vandq_u32(ok, vcltq_f32(x, vdupq_n_f32(INFINITY)));
            mx = vmaxq_f32(mx, x);
        }
        bool bad = vminvq_u32(ok) == 0;
        m = vmaxvq_f32(mx);
        for (; j < t->keys; j++) {
            bad |= !(s[j] < INFINITY);
            if (s[j] > m) m = s[j];
        }
        if (bad) {
            fi_cpu_poison_row(t, r);
            continue;
        }
        if (m == -INFINITY) {
            t->alpha[r] = 1.0f;
            for (j = 0; j < t->keys; j++) s[j] = 0.0f;
            continue;
        }
        float32x4_t mv = vdupq_n_f32(m), sum = vdupq_n_f32(0.0f);
        for (j = 0; j + 4 <= t->keys; j += 4) {
            float32x4_t p = exp2_f32(vsubq_f32(vld1q_f32(s + j), mv));
            vst1q_f32(s + j, p);
            sum = vaddq_f32(sum, p);
        }
        float total = vaddvq_f32(sum);
        for (; j < t->keys; j++) {
            s[j] = exp2f(s[j] - m);
            total += s[j];
        }
        float alpha = t->m[r] == -INFINITY ? 0.0f : exp2f(t->m[r] - m);
        t->alpha[r] = alpha;
        t->l[r] = t->l[r] * alpha + total;
        t->m[r] = m;
    }
}

/* ----------------------------------------------------------------- P V */

/* o[r][d .. d + 16) for R <= 4 rows: four accumulators per row. */
INLINE void pv_tile(fi_cpu_tile *t, float *o, const float *p, const float *alpha, int R,
                    int32_t d, fi_dtype dt, bool pf) {
    int32_t bytes = t->dvo * dtype_bytes(dt), step = t->keys_next > t->keys ? 2 : 1;
    float32x4_t acc[4][4];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int c = 0; c < 4; c++)
            acc[r][c] = vmulq_n_f32(vld1q_f32(o + (size_t)r * t->dvo + d + 4 * c), alpha[r]);
    for (int32_t j = 0; j < t->keys; j++) {
        if (pf) prefetch_rows(t->v_next, t->keys_next, j * step, step, bytes);
        float32x4_t v[4];
        load8(t->v[j], dt, d, v);
        load8(t->v[j], dt, d + 8, v + 2);
        UNROLL
        for (int r = 0; r < R; r++) {
            float pj = p[(size_t)r * FI_CPU_BN + j];
            UNROLL
            for (int c = 0; c < 4; c++) acc[r][c] = vfmaq_n_f32(acc[r][c], v[c], pj);
        }
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int c = 0; c < 4; c++) vst1q_f32(o + (size_t)r * t->dvo + d + 4 * c, acc[r][c]);
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

static void neon_pv(fi_cpu_tile *t) {
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

const fi_cpu_simd fi_cpu_simd_neon = {
    .name = "neon",
    .prepare_q = NULL,
    .qk = neon_qk,
    .softmax = neon_softmax,
    .pv = neon_pv,
    .finish_o = NULL,
};
