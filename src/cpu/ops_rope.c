/*
 * ops_rope.c — rotary position embedding (RoPE) of q and k on the CPU.
 *
 * Pair i (i < rotary_dim/2) of a head is (x[i], x[i + rotary_dim/2]), or
 * (x[2i], x[2i+1]) when interleaved; it turns by the angle pos * f_i with
 *   f_i = theta^(-2i/rotary_dim), smooth = 0, or with LLaMA-3.1 scaling
 *   smooth = clamp((old_context_len * f_i / 2pi - low) / (high - low), 0, 1)
 *   f_i <- (1 - smooth) * f_i / rope_scale + smooth * f_i
 * (FlashInfer's formula: without llama31, positions are divided by
 * rope_scale; with it, only low frequencies are). Dimensions past
 * rotary_dim are copied. Angles and their cos/sin are computed in double so
 * large positions stay exact; the rotation itself is f32. Tokens are split across the pool; for
 * each block of pairs a worker computes the frequencies once, then per
 * token the cos/sin shared by every head.
 */
/* GCC's -O2 vectorises only loops of a known trip count; these row loops
 * have run-time lengths. Clang vectorises them at -O2 already. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("vect-cost-model=dynamic")
#endif
#include "cpu/cpu.h"
#include "cpu/ops_rows.h"

#include <math.h>

/* Pairs per block: two f32 chunks of a row. */
#define ROPE_PAIRS (FI_OPS_CHUNK / 2)

typedef struct rope_job {
    fi_rope_params p;               /* resolved: rotary_dim set */
    const fi_tensor *q, *k;         /* [nnz, H_qo, D], [nnz, H_kv, D] */
    const fi_tensor *qo, *ko;       /* same shapes; may be q, k */
    const int32_t *pos_ids;         /* [nnz], or NULL: indptr + offsets */
    const int32_t *indptr, *offsets;/* [B+1], [B] */
    int32_t batch;
    fi_ops_isa isa;
} rope_job;

static double rope_freq(const fi_rope_params *p, int32_t i) {
    double f = pow((double)p->rope_theta, -2.0 * i / p->rotary_dim);
    double smooth = 0.0;
    if (p->llama31) {
        const double two_pi = 6.283185307179586;
        double low = p->low_freq_factor, high = p->high_freq_factor;
        smooth = (p->old_context_len * f / two_pi - low) / (high - low);
        smooth = smooth < 0.0 ? 0.0 : smooth > 1.0 ? 1.0 : smooth;
    }
    return (1.0 - smooth) * f / p->rope_scale + smooth * f;
}

/* Angles below this reduce exactly enough in double (and their quadrant
 * count fits the rounding trick); larger ones, only reachable with a tiny
 * rope_scale, go through libm. */
#define ROPE_POLY_MAX_ANGLE 0x1p40

/* cos and sin of n angles, branch-free so the loop vectorises: the angle is
 * reduced in double to r in [-pi/4, pi/4] plus a quadrant, where Taylor
 * polynomials are within 2e-9 of sin r and cos r. */
static void cos_sin_poly(const double *angle, int32_t n, float *c, float *s) {
    const double two_over_pi = 0.636619772367581343076;
    const double pio2_hi = 1.57079632679489655800, pio2_lo = 6.12323399573676603587e-17;
    const double round = 0x1.8p52; /* x + round - round: x to the nearest integer */
    for (int32_t i = 0; i < n; i++) {
        double a = angle[i];
        double k = (a * two_over_pi + round) - round;
        double r = (a - k * pio2_hi) - k * pio2_lo;
        double k4 = (k * 0.25 + round) - round;
        int32_t q = (int32_t)(k - 4.0 * k4) & 3; /* angle = r + q pi/2 (mod 2 pi) */
        double r2 = r * r;
        double sr = r * (1.0 + r2 * (-1.0 / 6 + r2 * (1.0 / 120 + r2 * (-1.0 / 5040 +
                                                                  r2 * (1.0 / 362880)))));
        double cr = 1.0 + r2 * (-0.5 + r2 * (1.0 / 24 + r2 * (-1.0 / 720 + r2 * (1.0 / 40320 +
                                                                  r2 * (-1.0 / 3628800)))));
        double odd = (double)(q & 1);
        double sin_sign = (double)(1 - (q & 2)), cos_sign = (double)(1 - ((q + 1) & 2));
        s[i] = (float)(sin_sign * (sr + (cr - sr) * odd));
        c[i] = (float)(cos_sign * (cr + (sr - cr) * odd));
    }
}

static void cos_sin(const double *angle, int32_t n, double max_angle, float *c, float *s) {
    if (max_angle < ROPE_POLY_MAX_ANGLE) {
        cos_sin_poly(angle, n, c, s);
        return;
    }
    for (int32_t i = 0; i < n; i++) {
        c[i] = (float)cos(angle[i]);
        s[i] = (float)sin(angle[i]);
    }
}

static inline fi_row head_row(const fi_tensor *t, int64_t n, int64_t h, int32_t d) {
    fi_row r = {fi_ops_at(t->data, t->dtype, n * t->stride[0] + h * t->stride[1] +
                                                 (int64_t)d * t->stride[2]),
                t->dtype, t->stride[2]};
    return r;
}

/* Rotate pairs [p0, p0 + n) of one head row `in` into `out`. */
static void rotate_block(const rope_job *j, const fi_tensor *in, const fi_tensor *out,
                         int64_t t, int64_t h, int32_t p0, int32_t n,
                         const float *c, const float *s) {
    float x[FI_OPS_CHUNK], y[FI_OPS_CHUNK];
    if (j->p.interleave) {
        fi_ops_load(j->isa, x, head_row(in, t, h, 2 * p0), 2 * n);
        for (int32_t i = 0; i < n; i++) {
            y[2 * i] = x[2 * i] * c[i] - x[2 * i + 1] * s[i];
            y[2 * i + 1] = x[2 * i + 1] * c[i] + x[2 * i] * s[i];
        }
        fi_ops_store(j->isa, head_row(out, t, h, 2 * p0), y, 2 * n);
        return;
    }
    int32_t half = j->p.rotary_dim / 2;
    float *x1 = x, *x2 = x + ROPE_PAIRS, *y1 = y, *y2 = y + ROPE_PAIRS;
    fi_ops_load(j->isa, x1, head_row(in, t, h, p0), n);
    fi_ops_load(j->isa, x2, head_row(in, t, h, half + p0), n);
    for (int32_t i = 0; i < n; i++) {
        y1[i] = x1[i] * c[i] - x2[i] * s[i];
        y2[i] = x2[i] * c[i] + x1[i] * s[i];
    }
    fi_ops_store(j->isa, head_row(out, t, h, p0), y1, n);
    fi_ops_store(j->isa, head_row(out, t, h, half + p0), y2, n);
}

/* Copy the dimensions past rotary_dim of every head of token t. */
static void copy_tail(const fi_tensor *in, const fi_tensor *out, int64_t t, int32_t from) {
    int64_t dim = in->shape[2];
    if (in->data == out->data || from >= dim) return; /* in place: already there */
    for (int64_t h = 0; h < in->shape[1]; h++) {
        fi_row src = head_row(in, t, h, from), dst = head_row(out, t, h, from);
        fi_ops_copy((void *)dst.p, dst.stride, src.p, src.stride, dim - from,
                    (size_t)fi_ops_elem(in->dtype));
    }
}

/* Position of token t; false for a token past indptr[B] (left untouched).
 * *req walks forward through the requests as t increases. */
static bool token_position(const rope_job *j, int64_t t, int32_t *req, int64_t *pos) {
    if (j->pos_ids) {
        *pos = j->pos_ids[t];
        return true;
    }
    while (*req < j->batch && j->indptr[*req + 1] <= t) (*req)++;
    if (*req == j->batch) return false;
    *pos = (int64_t)j->offsets[*req] + t - j->indptr[*req];
    return true;
}

static void rope_tokens(void *arg, int64_t begin, int64_t end) {
    const rope_job *j = arg;
    int32_t half = j->p.rotary_dim / 2;
    for (int32_t p0 = 0; p0 < half; p0 += ROPE_PAIRS) {
        int32_t n = half - p0 < ROPE_PAIRS ? half - p0 : ROPE_PAIRS;
        double freq[ROPE_PAIRS], max_freq = 0.0;
        for (int32_t i = 0; i < n; i++) {
            freq[i] = rope_freq(&j->p, p0 + i);
            max_freq = freq[i] > max_freq ? freq[i] : max_freq;
        }
        int32_t req = 0;
        for (int64_t t = begin; t < end; t++) {
            int64_t pos;
            if (!token_position(j, t, &req, &pos)) break;
            double angle[ROPE_PAIRS];
            float c[ROPE_PAIRS], s[ROPE_PAIRS];
            for (int32_t i = 0; i < n; i++) angle[i] = (double)pos * freq[i];
            cos_sin(angle, n, (double)pos * max_freq, c, s);
            for (int64_t h = 0; h < j->q->shape[1]; h++)
                rotate_block(j, j->q, j->qo, t, h, p0, n, c, s);
            for (int64_t h = 0; h < j->k->shape[1]; h++)
                rotate_block(j, j->k, j->ko, t, h, p0, n, c, s);
            if (p0 == 0) {
                copy_tail(j->q, j->qo, t, j->p.rotary_dim);
                copy_tail(j->k, j->ko, t, j->p.rotary_dim);
            }
        }
    }
}

fi_status fi_cpu_rope(fi_context *ctx, const fi_rope_params *params,
                      const fi_tensor *q, const fi_tensor *k, fi_tensor *q_out,
                      fi_tensor *k_out, const fi_tensor *pos_ids,
                      const fi_tensor *indptr, const fi_tensor *offsets,
                      void *stream) {
    (void)stream;
    rope_job j = {.p = *params, .q = q, .k = k, .qo = q_out, .ko = k_out};
    if (j.p.rotary_dim == 0) j.p.rotary_dim = (int32_t)q->shape[2];
    if (pos_ids) {
        j.pos_ids = pos_ids->data;
    } else {
        j.indptr = indptr->data;
        j.offsets = offsets->data;
        j.batch = (int32_t)offsets->shape[0];
    }
    j.isa = fi_ops_isa_for(ctx);
    int64_t nnz = q->shape[0];
    int64_t bytes = 2 * nnz * q->shape[2] *
                    (q->shape[1] * fi_ops_elem(q->dtype) +
                     k->shape[1] * fi_ops_elem(k->dtype));
    fi_ops_parallel_for(ctx, nnz, bytes, rope_tokens, &j);
    return FI_OK;
}
