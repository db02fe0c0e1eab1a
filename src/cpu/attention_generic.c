/*
 * attention_generic.c — the portable SIMD table: plain C loops, f32
 * accumulation, libm exp2f. The reference the vector tables are checked
 * against, and the path on CPUs without a faster one.
 */
#include "cpu/convert.h"
#include "cpu/simd.h"

#include <math.h>
#include <stdbool.h>

static void generic_qk(fi_cpu_tile *t) {
    float k[FI_CPU_MAX_D];
    int64_t ke = (int64_t)fi_dtype_size(t->k_dtype);
    for (int32_t j = 0; j < t->keys; j++) {
        fi_load_row_f32(k, t->k[j], t->k_dtype, ke, t->dqk, t->k_scale);
        for (int32_t r = 0; r < t->rows; r++) {
            const float *q = t->q + (size_t)r * t->dqk;
            float acc = 0.0f;
            for (int32_t d = 0; d < t->dqk; d++) acc += q[d] * k[d];
            t->s[(size_t)r * FI_CPU_BN + j] = acc;
        }
    }
}

static void generic_softmax(fi_cpu_tile *t) {
    for (int32_t r = 0; r < t->rows; r++) {
        float *s = t->s + (size_t)r * FI_CPU_BN;
        float mx = t->m[r];
        bool bad = mx != mx; /* a NaN m: an earlier block poisoned the row */
        for (int32_t j = 0; j < t->keys; j++) {
            bad |= !(s[j] < INFINITY); /* NaN or +inf */
            if (s[j] > mx) mx = s[j];
        }
        if (bad) {
            fi_cpu_poison_row(t, r);
            continue;
        }
        if (mx == -INFINITY) {
            t->alpha[r] = 1.0f;
            for (int32_t j = 0; j < t->keys; j++) s[j] = 0.0f;
            continue;
        }
        float alpha = exp2f(t->m[r] - mx), sum = 0.0f;
        for (int32_t j = 0; j < t->keys; j++) {
            s[j] = exp2f(s[j] - mx);
            sum += s[j];
        }
        t->alpha[r] = alpha;
        t->l[r] = t->l[r] * alpha + sum;
        t->m[r] = mx;
    }
}

static void generic_pv(fi_cpu_tile *t) {
    float v[FI_CPU_MAX_D];
    int64_t ve = (int64_t)fi_dtype_size(t->v_dtype);
    for (int32_t r = 0; r < t->rows; r++) {
        float *o = t->o + (size_t)r * t->dvo;
        for (int32_t d = 0; d < t->dvo; d++) o[d] *= t->alpha[r];
    }
    for (int32_t j = 0; j < t->keys; j++) {
        fi_load_row_f32(v, t->v[j], t->v_dtype, ve, t->dvo, t->v_scale);
        /* no skip for p == 0: a non-finite v must reach o (0 x NaN), which
         * then takes the exact path (attention.c) as on every SIMD level */
        for (int32_t r = 0; r < t->rows; r++) {
            float p = t->s[(size_t)r * FI_CPU_BN + j], *o = t->o + (size_t)r * t->dvo;
            for (int32_t d = 0; d < t->dvo; d++) o[d] += p * v[d];
        }
    }
}

const fi_cpu_simd fi_cpu_simd_generic = {
    .name = "generic",
    .prepare_q = NULL,
    .qk = generic_qk,
    .softmax = generic_softmax,
    .pv = generic_pv,
};
