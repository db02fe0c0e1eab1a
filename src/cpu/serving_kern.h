/*
 * serving_kern.h — the serving ops' vector kernels over contiguous f32
 * rows, written once in plain C and compiled once per SIMD level
 * (serving_generic.c, serving_avx2.c, serving_avx512.c define FI_SK_NAME
 * and include this file): the compiler vectorises the loops for that
 * level's registers.
 *
 * Every level computes the same operations in the same order (no
 * reassociation: sums keep FI_SK_LANES explicit lanes combined by a fixed
 * tree; no FMA contraction, a fused multiply-add only where the code
 * calls fmaf), so results are bitwise identical across levels, which
 * sampling relies on (docs/SEMANTICS.md, "Sampling").
 * Functions of transcendental values (exp, tanh, erf) are our own
 * branch-free polynomials for the same reason.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
/* GCC's -O2 vectorises only loops of a known trip count; these have
 * run-time lengths. ISO C mode (-std=c11) already keeps a*b+c unfused. */
#pragma GCC optimize("vect-cost-model=dynamic", "fp-contract=off", "no-trapping-math")
#endif

#include "cpu/serving.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Lanes of every sum, on every level (the results depend on it). */
#define FI_SK_LANES 16

#define FI_SK_CAT2(a, b) a##b
#define FI_SK_CAT(a, b) FI_SK_CAT2(a, b)
#define SK(name) FI_SK_CAT(name##_, FI_SK_NAME)
#define SK_INLINE static inline __attribute__((always_inline))

/* ------------------------------------------------------- scalar maths */

SK_INLINE uint32_t sk_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

SK_INLINE float sk_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

SK_INLINE float sk_min(float a, float b) { return b < a ? b : a; }
SK_INLINE float sk_max(float a, float b) { return b > a ? b : a; }

SK_INLINE float sk_from_bf16(uint16_t h) { return sk_float((uint32_t)h << 16); }

/* f32 -> bf16 bits, round to nearest even, NaN quieted: as ops_rows.c's
 * store, in masks (GCC vectorises no select here). */
SK_INLINE uint16_t sk_to_bf16(float f) {
    uint32_t u = sk_bits(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = 0u - (uint32_t)((u & 0x7fffffffu) > 0x7f800000u);
    return (uint16_t)((((u >> 16) | 0x40u) & nan) | (rounded & ~nan));
}

/* e^x for f32: x = k ln2 + r, |r| <= ln2/2, e^r by a degree-5 polynomial
 * (our near-minimax fit of the relative error, 9.1e-8 before f32
 * rounding), 2^k through the exponent bits. Every step is an explicit
 * fmaf or a plain operation, so all levels round alike (fmaf is one
 * instruction where the level has FMA). Measured over every f32 x in
 * [-87.3, 88] against libm's exp in f64: relative error <= 1.64e-7 (2.0
 * ulp, far under the f32 tolerance of 1e-5). The exp is bound by the FMA
 * units: degree 6 measured 1.0e-7 and 8% more time in exp_sum.
 * x is first clamped to [-88, 88] on its bits, as integers (GCC vectorises
 * no float min or max, for their NaN and -0 rules; an integer min is one
 * instruction): the signed min clamps the positive floats, the unsigned
 * one the negative. Below about -87.68 k + 127 is 0 and so is the result
 * (between it and -87.34, where e^x leaves the normal range, a subnormal);
 * from 88 on the result is e^88 (finite: callers never need a larger
 * value). A NaN gives 0 or e^88 (by its sign): the callers test their rows
 * for NaN first (softmax, sampling) or carry it in another factor (the
 * activations' x), so the input's NaN is the one that reaches the output,
 * on every level. */
SK_INLINE float sk_exp(float x) {
    const float log2e = 1.44269504f, ln2_hi = 0.693147182f, ln2_lo = -1.90465421e-9f;
    const float round = 12582912.0f; /* 1.5 x 2^23: x + round - round rounds to an integer */
    const int32_t hi = (int32_t)sk_bits(88.0f);
    const uint32_t lo = sk_bits(-88.0f);
    int32_t xs = (int32_t)sk_bits(x);
    xs = xs < hi ? xs : hi;
    uint32_t xu = (uint32_t)xs;
    float xc = sk_float(xu < lo ? xu : lo);
    float t = fmaf(xc, log2e, round); /* k in t's low mantissa bits */
    float kf = t - round;
    float r = fmaf(-kf, ln2_lo, fmaf(-kf, ln2_hi, xc));
    float p = 0x1.0fa832p-7f;
    p = fmaf(p, r, 0x1.573a54p-5f);
    p = fmaf(p, r, 0x1.555a6ap-3f);
    p = fmaf(p, r, 0x1.fffdc6p-2f);
    p = fmaf(p, r, 0x1.fffff6p-1f);
    p = fmaf(p, r, 1.0f);
    /* 2^k, k + 127 in [0, 254]: 0 makes the result 0 */
    return p * sk_float((sk_bits(t) - sk_bits(round) + 127u) << 23);
}

/* tanh y = 1 - 2 / (e^2y + 1) (e^2y stays finite: see sk_exp). */
SK_INLINE float sk_tanh(float y) {
    float e = sk_exp(2.0f * y);
    return 1.0f - 2.0f / (e + 1.0f);
}

/* 1 + erf(z), without the cancellation of 1 + erf for negative z: with
 * a = |z|, erfc(a) = P(t) e^-a^2, t = 1 / (1 + p a) (Abramowitz and
 * Stegun 7.1.26, |error| < 1.5e-7), and 1 + erf(z) = 2 - erfc(a) for z >= 0. */
SK_INLINE float sk_one_plus_erf(float z) {
    float a = z < 0.0f ? -z : z;
    float t = 1.0f / (1.0f + 0.3275911f * a);
    float poly = 1.061405429f;
    poly = poly * t - 1.453152027f;
    poly = poly * t + 1.421413741f;
    poly = poly * t - 0.284496736f;
    poly = poly * t + 0.254829592f;
    float erfc = poly * t * sk_exp(-a * a);
    return z < 0.0f ? erfc : 2.0f - erfc;
}

/* ------------------------------------------------------------- sums */

/* Sums keep FI_SK_LANES lanes: lane l adds elements l, l + LANES, ... in
 * order (a tail's elements go to lanes 0..), then lanes are added pairwise
 * (l + LANES/2 into l, ...). The same on every level. */
#define SK_LANE_SUM(acc, expr)                                                   \
    do {                                                                         \
        int64_t i_ = 0;                                                          \
        for (; i_ + FI_SK_LANES <= n; i_ += FI_SK_LANES)                         \
            for (int l = 0; l < FI_SK_LANES; l++) {                              \
                const int64_t j = i_ + l;                                        \
                acc[l] += (expr);                                                \
            }                                                                    \
        for (int l = 0; i_ + l < n; l++) {                                       \
            const int64_t j = i_ + l;                                            \
            acc[l] += (expr);                                                    \
        }                                                                        \
        for (int s = FI_SK_LANES / 2; s; s >>= 1)                                \
            for (int l = 0; l < s; l++) acc[l] += acc[l + s];                    \
    } while (0)

static float SK(sum_sq)(const float *restrict x, int64_t n) {
    float acc[FI_SK_LANES] = {0};
    SK_LANE_SUM(acc, x[j] * x[j]);
    return acc[0];
}

/* sum_sq of bf16 values (the same sum as of them converted to f32). */
static float SK(sum_sq_bf16)(const uint16_t *restrict x, int64_t n) {
    float acc[FI_SK_LANES] = {0};
    SK_LANE_SUM(acc, sk_from_bf16(x[j]) * sk_from_bf16(x[j]));
    return acc[0];
}

static float SK(sum)(const float *restrict x, int64_t n) {
    float acc[FI_SK_LANES] = {0};
    SK_LANE_SUM(acc, x[j]);
    return acc[0];
}

static float SK(sum_sq_dev)(const float *restrict x, float m, int64_t n) {
    float acc[FI_SK_LANES] = {0};
    SK_LANE_SUM(acc, (x[j] - m) * (x[j] - m));
    return acc[0];
}

/* The sum of the x[j] >= t. */
static float SK(masked_sum)(const float *restrict x, float t, int64_t n) {
    float acc[FI_SK_LANES] = {0};
    SK_LANE_SUM(acc, x[j] >= t ? x[j] : 0.0f);
    return acc[0];
}

/* y[j] = x[j] >= t ? e^((x[j] - m) s) : 0; returns their lane sum. */
static float SK(exp_sum)(float *restrict y, const float *restrict x, float m, float s, float t,
                         int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        float e = sk_exp((x[j] - m) * s);
        y[j] = x[j] >= t ? e : 0.0f;
    }
    return SK(sum)(y, n);
}

/* ------------------------------------------------------- reductions */

/* The largest x (NaN ignored; -inf for n == 0), and which kinds of value
 * the row holds (FI_SV_NEGATIVE | FI_SV_NAN | FI_SV_POS_INF). */
SK_INLINE uint32_t sk_kinds(float v) {
    return (uint32_t)(v < 0.0f) * FI_SV_NEGATIVE | (uint32_t)(v != v) * FI_SV_NAN |
           (uint32_t)(v == __builtin_inff()) * FI_SV_POS_INF;
}

static void SK(stats)(const float *restrict x, int64_t n, float *max, uint32_t *kinds) {
    float m[FI_SK_LANES];
    uint32_t b[FI_SK_LANES];
    for (int l = 0; l < FI_SK_LANES; l++) m[l] = -__builtin_inff(), b[l] = 0;
    int64_t i = 0;
    for (; i + FI_SK_LANES <= n; i += FI_SK_LANES)
        for (int l = 0; l < FI_SK_LANES; l++) {
            m[l] = sk_max(m[l], x[i + l]);
            b[l] |= sk_kinds(x[i + l]);
        }
    for (int l = 0; i + l < n; l++) {
        m[l] = sk_max(m[l], x[i + l]);
        b[l] |= sk_kinds(x[i + l]);
    }
    float mx = m[0];
    uint32_t bb = b[0];
    for (int l = 1; l < FI_SK_LANES; l++) mx = sk_max(mx, m[l]), bb |= b[l];
    *max = mx;
    *kinds = bb;
}

/* ---------------------------------------------------------- elementwise */

static void SK(add)(float *restrict y, const float *restrict a, const float *restrict b,
                    int64_t n) {
    for (int64_t j = 0; j < n; j++) y[j] = a[j] + b[j];
}

/* y = x s where x >= t, else 0. y may be x. */
static void SK(masked_scale)(float *y, const float *x, float t, float s, int64_t n) {
    for (int64_t j = 0; j < n; j++) y[j] = x[j] >= t ? x[j] * s : 0.0f;
}

/* y = x r w (RMSNorm). y may be x. */
static void SK(rms_apply)(float *y, const float *x, const float *restrict w, float r,
                          int64_t n) {
    for (int64_t j = 0; j < n; j++) y[j] = (x[j] * r) * w[j];
}

/* rms_apply into bf16 y, of bf16 xb or (xb NULL) f32 xf. y may be xb. */
static void SK(rms_apply_bf16)(uint16_t *y, const uint16_t *xb,
                               const float *restrict xf, const float *restrict w, float r,
                               int64_t n) {
    if (xb)
        for (int64_t j = 0; j < n; j++) y[j] = sk_to_bf16((sk_from_bf16(xb[j]) * r) * w[j]);
    else
        for (int64_t j = 0; j < n; j++) y[j] = sk_to_bf16((xf[j] * r) * w[j]);
}

/* The residual add of bf16 rows: sum = x + res in f32, res = sum rounded. */
static void SK(add_bf16)(float *restrict sum, uint16_t *restrict res,
                         const uint16_t *restrict x, int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        sum[j] = sk_from_bf16(x[j]) + sk_from_bf16(res[j]);
        res[j] = sk_to_bf16(sum[j]);
    }
}

/* RoPE of x's first 2 half values by (c, s) [half] into y: the pairs
 * (i, i + half) (NeoX) or (2i, 2i + 1); y is none of the inputs. */
static void SK(rotate)(float *restrict y, const float *restrict x, const float *restrict c,
                       const float *restrict s, int64_t half, int neox) {
    if (neox) {
        for (int64_t i = 0; i < half; i++) y[i] = x[i] * c[i] - x[i + half] * s[i];
        for (int64_t i = 0; i < half; i++) y[i + half] = x[i + half] * c[i] + x[i] * s[i];
    } else {
        for (int64_t i = 0; i < half; i++) {
            y[2 * i] = x[2 * i] * c[i] - x[2 * i + 1] * s[i];
            y[2 * i + 1] = x[2 * i + 1] * c[i] + x[2 * i] * s[i];
        }
    }
}

/* y = (x - m) r w + b (LayerNorm). y may be x. */
static void SK(ln_apply)(float *y, const float *x, const float *restrict w,
                         const float *restrict b, float m, float r, int64_t n) {
    for (int64_t j = 0; j < n; j++) y[j] = ((x[j] - m) * r) * w[j] + b[j];
}

/* FP8 of x s, saturated to the format's largest finite value and rounded
 * to nearest even (E4M3FN: 448, NaN 0x7f; E5M2: 57344, NaN 0x7f). */
static void SK(to_fp8)(uint8_t *restrict y, const float *restrict x, float s, int e5m2,
                       int64_t n) {
    /* E4M3: 3 mantissa bits, bias 7, normals from 2^-6, subnormal step 2^-9.
     * E5M2: 2 mantissa bits, bias 15, normals from 2^-14, step 2^-16. */
    const float fmax = e5m2 ? 57344.0f : 448.0f;
    const float min_normal = e5m2 ? 0x1p-14f : 0x1p-6f;
    const float sub_scale = e5m2 ? 0x1p16f : 0x1p9f;
    const uint32_t shift = e5m2 ? 21 : 20;
    const uint32_t rebias = e5m2 ? (127u - 15u) << 2 : (127u - 7u) << 3;
    for (int64_t j = 0; j < n; j++) {
        float v = x[j] * s;
        float c = sk_max(sk_min(v, fmax), -fmax);
        uint32_t u = sk_bits(c);
        uint32_t sign = (u >> 24) & 0x80u;
        uint32_t a = u & 0x7fffffffu;
        uint32_t rounded = a + ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u);
        uint32_t normal = (rounded >> shift) - rebias;
        float af = sk_float(a), small = sk_min(af, min_normal); /* <= 8 steps: fits */
        uint32_t sub = (uint32_t)(int32_t)((small * sub_scale + 12582912.0f) - 12582912.0f);
        uint32_t code = af < min_normal ? sub : normal;
        code = v != v ? 0x7fu : (code | sign);
        y[j] = (uint8_t)code;
    }
}

/* act(a) b for one of fi_act_kind. */
SK_INLINE float sk_silu_mul(float a, float b) { return a / (1.0f + sk_exp(-a)) * b; }

SK_INLINE float sk_gelu_mul(float a, float b) {
    return (0.5f * a) * sk_one_plus_erf(a * 0.707106781f) * b;
}

SK_INLINE float sk_gelu_tanh_mul(float a, float b) {
    const float c = 0.797884561f; /* sqrt(2 / pi) */
    float inner = c * (a + 0.044715f * (a * a * a));
    return (0.5f * a) * (1.0f + sk_tanh(inner)) * b;
}

/* One loop per kind (a switch inside would stop the vectoriser); LOAD
 * reads element j of a row, STORE writes y[j]. */
#define SK_ACT_LOOPS(LOAD, STORE)                                                 \
    switch (kind) {                                                               \
    case FI_ACT_SILU:                                                             \
        for (int64_t j = 0; j < n; j++) y[j] = STORE(sk_silu_mul(LOAD(a[j]), LOAD(b[j]))); \
        break;                                                                    \
    case FI_ACT_GELU:                                                             \
        for (int64_t j = 0; j < n; j++) y[j] = STORE(sk_gelu_mul(LOAD(a[j]), LOAD(b[j]))); \
        break;                                                                    \
    default:                                                                      \
        for (int64_t j = 0; j < n; j++)                                           \
            y[j] = STORE(sk_gelu_tanh_mul(LOAD(a[j]), LOAD(b[j])));               \
        break;                                                                    \
    }

#define SK_SAME(v) (v)

/* y = act(a) b for one of fi_act_kind. */
static void SK(act)(int kind, float *restrict y, const float *restrict a,
                    const float *restrict b, int64_t n) {
    SK_ACT_LOOPS(SK_SAME, SK_SAME)
}

/* act of bf16 rows into bf16 (the values act gives, rounded once). y may
 * be a or b. */
static void SK(act_bf16)(int kind, uint16_t *y, const uint16_t *a, const uint16_t *b,
                         int64_t n) {
    SK_ACT_LOOPS(sk_from_bf16, sk_to_bf16)
}

/* ------------------------------------------------------------- select */

/* The largest key (fi_sv_key) of each block of b values of x (the last
 * block may be shorter) into out[ceil(n / b)]. */
static void SK(block_max_keys)(const float *restrict x, int64_t n, int64_t b,
                               uint32_t *restrict out) {
    for (int64_t i = 0, o = 0; i < n; i += b, o++) {
        const int64_t len = n - i < b ? n - i : b;
        uint32_t m = 0;
        for (int64_t l = 0; l < len; l++) {
            uint32_t key = fi_sv_key(x[i + l]);
            m = key > m ? key : m;
        }
        out[o] = m;
    }
}

const fi_cpu_serving_kernels SK(fi_cpu_serving) = {
    .name = FI_SK_LEVEL,
    .sum_sq = SK(sum_sq),
    .sum = SK(sum),
    .sum_sq_dev = SK(sum_sq_dev),
    .masked_sum = SK(masked_sum),
    .exp_sum = SK(exp_sum),
    .stats = SK(stats),
    .add = SK(add),
    .masked_scale = SK(masked_scale),
    .rms_apply = SK(rms_apply),
    .rotate = SK(rotate),
    .ln_apply = SK(ln_apply),
    .to_fp8 = SK(to_fp8),
    .act = SK(act),
    .act_bf16 = SK(act_bf16),
    .sum_sq_bf16 = SK(sum_sq_bf16),
    .rms_apply_bf16 = SK(rms_apply_bf16),
    .add_bf16 = SK(add_bf16),
    .block_max_keys = SK(block_max_keys),
};
