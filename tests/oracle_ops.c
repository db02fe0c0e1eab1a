/*
 * oracle_ops.c — fp64 references for merge, paged append and RoPE, written
 * for reading: one loop per index, no tricks. See oracle_ops.h.
 */
#include "oracle_ops.h"

#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- merge */

void oracle_merge_states(int64_t n, int64_t states, int64_t heads, int64_t dim,
                         const double *v, const double *s, double *vo, double *so) {
    for (int64_t i = 0; i < n; i++) {
        for (int64_t h = 0; h < heads; h++) {
            /* the largest LSE keeps 2^(L - M) in range */
            double m = -INFINITY;
            for (int64_t k = 0; k < states; k++) {
                double l = s[(i * states + k) * heads + h];
                if (l > m) m = l;
            }
            double *o = &vo[(i * heads + h) * dim];
            int poisoned = 0; /* a state with LSE NaN or +inf: the row is NaN */
            for (int64_t k = 0; k < states; k++) poisoned |= !(s[(i * states + k) * heads + h] < INFINITY);
            if (poisoned) {
                for (int64_t d = 0; d < dim; d++) o[d] = NAN;
                so[i * heads + h] = NAN;
                continue;
            }
            if (m == -INFINITY) { /* no state holds any key */
                for (int64_t d = 0; d < dim; d++) o[d] = 0.0;
                so[i * heads + h] = -INFINITY;
                continue;
            }
            double sum = 0.0;
            for (int64_t d = 0; d < dim; d++) o[d] = 0.0;
            for (int64_t k = 0; k < states; k++) {
                double l = s[(i * states + k) * heads + h];
                if (l == -INFINITY) continue; /* contributes nothing; not read */
                double w = exp2(l - m);
                const double *vk = &v[((i * states + k) * heads + h) * dim];
                for (int64_t d = 0; d < dim; d++) o[d] += w * vk[d];
                sum += w;
            }
            for (int64_t d = 0; d < dim; d++) o[d] /= sum;
            so[i * heads + h] = m + log2(sum);
        }
    }
}

void oracle_merge_state(int64_t n, int64_t heads, int64_t dim, const double *va,
                        const double *sa, const double *vb, const double *sb,
                        double *vo, double *so) {
    for (int64_t i = 0; i < n; i++) {
        for (int64_t h = 0; h < heads; h++) {
            double la = sa[i * heads + h], lb = sb[i * heads + h];
            double m = la > lb ? la : lb;
            const double *a = &va[(i * heads + h) * dim], *b = &vb[(i * heads + h) * dim];
            double *o = &vo[(i * heads + h) * dim];
            if (!(la < INFINITY) || !(lb < INFINITY)) { /* NaN or +inf: the row is NaN */
                for (int64_t d = 0; d < dim; d++) o[d] = NAN;
                so[i * heads + h] = NAN;
                continue;
            }
            if (m == -INFINITY) {
                for (int64_t d = 0; d < dim; d++) o[d] = 0.0;
                so[i * heads + h] = -INFINITY;
                continue;
            }
            double wa = la == -INFINITY ? 0.0 : exp2(la - m);
            double wb = lb == -INFINITY ? 0.0 : exp2(lb - m);
            for (int64_t d = 0; d < dim; d++) {
                double sum = 0.0; /* a state of LSE -inf is not read; the others
                                     are, whatever the weight */
                if (la != -INFINITY) sum += wa * a[d];
                if (lb != -INFINITY) sum += wb * b[d];
                o[d] = sum / (wa + wb);
            }
            so[i * heads + h] = m + log2(wa + wb);
        }
    }
}

void oracle_attention_state(int64_t nq, int64_t nk, int64_t dim, int64_t dim_v,
                            const double *q, const double *k, const double *v,
                            const uint8_t *use, double sm_scale, double *o, double *lse) {
    for (int64_t i = 0; i < nq; i++) {
        double m = -INFINITY;
        for (int64_t j = 0; j < nk; j++) {
            if (use && !use[j]) continue;
            double s = 0.0;
            for (int64_t d = 0; d < dim; d++) s += q[i * dim + d] * k[j * dim + d];
            if (s * sm_scale > m) m = s * sm_scale;
        }
        double *oi = &o[i * dim_v];
        for (int64_t d = 0; d < dim_v; d++) oi[d] = 0.0;
        if (m == -INFINITY) {
            lse[i] = -INFINITY;
            continue;
        }
        double sum = 0.0;
        for (int64_t j = 0; j < nk; j++) {
            if (use && !use[j]) continue;
            double s = 0.0;
            for (int64_t d = 0; d < dim; d++) s += q[i * dim + d] * k[j * dim + d];
            double p = exp(s * sm_scale - m);
            for (int64_t d = 0; d < dim_v; d++) oi[d] += p * v[j * dim_v + d];
            sum += p;
        }
        for (int64_t d = 0; d < dim_v; d++) oi[d] /= sum;
        lse[i] = (m + log(sum)) / log(2.0); /* natural log to base 2 */
    }
}

/* --------------------------------------------------------------- append */

void oracle_append_paged(const fi_tensor *rows, const fi_tensor *cache, fi_kv_layout layout,
                         const int32_t *batch_indices, const int32_t *positions,
                         const int32_t *kv_indices, const int32_t *kv_indptr) {
    int64_t page_size = layout == FI_KV_LAYOUT_NHD ? cache->shape[1] : cache->shape[2];
    size_t elem = fi_dtype_size(cache->dtype);
    for (int64_t n = 0; n < rows->shape[0]; n++) {
        int32_t b = batch_indices[n], p = positions[n];
        int64_t page = kv_indices[kv_indptr[b] + p / page_size];
        int64_t slot = p % page_size;
        for (int64_t h = 0; h < rows->shape[1]; h++) {
            for (int64_t d = 0; d < rows->shape[2]; d++) {
                int64_t from = n * rows->stride[0] + h * rows->stride[1] + d * rows->stride[2];
                int64_t to = page * cache->stride[0] + d * cache->stride[3];
                if (layout == FI_KV_LAYOUT_NHD)
                    to += slot * cache->stride[1] + h * cache->stride[2];
                else
                    to += h * cache->stride[1] + slot * cache->stride[2];
                memcpy((char *)cache->data + to * (int64_t)elem,
                       (const char *)rows->data + from * (int64_t)elem, elem);
            }
        }
    }
}

/* ----------------------------------------------------------------- RoPE */

double oracle_rope_freq(const fi_rope_params *p, int32_t rotary_dim, int32_t i) {
    double f = pow((double)p->rope_theta, -2.0 * i / rotary_dim);
    if (!p->llama31) return f / p->rope_scale;
    /* LLaMA-3.1: wavelength 2 pi / f; short ones (below old / high) keep f,
     * long ones (above old / low) get f / scale, and in between a blend. */
    double wavelen = 2.0 * 3.14159265358979323846 / f;
    double low = p->low_freq_factor, high = p->high_freq_factor;
    double old = p->old_context_len;
    if (wavelen < old / high) return f;
    if (wavelen > old / low) return f / p->rope_scale;
    double smooth = (old / wavelen - low) / (high - low);
    return (1.0 - smooth) * f / p->rope_scale + smooth * f;
}

void oracle_rope_positions(int32_t batch, const int32_t *indptr, const int32_t *offsets,
                           int64_t nnz, int64_t *pos) {
    for (int64_t t = 0; t < nnz; t++) pos[t] = -1;
    for (int32_t b = 0; b < batch; b++)
        for (int64_t t = indptr[b]; t < indptr[b + 1]; t++)
            pos[t] = (int64_t)offsets[b] + (t - indptr[b]);
}

void oracle_rope(const fi_rope_params *p, int64_t nnz, int64_t heads, int64_t dim,
                 const double *x, const int64_t *pos, double *out) {
    int32_t rd = p->rotary_dim ? p->rotary_dim : (int32_t)dim;
    int32_t half = rd / 2;
    for (int64_t t = 0; t < nnz; t++) {
        if (pos[t] < 0) continue;
        for (int64_t h = 0; h < heads; h++) {
            const double *xi = &x[(t * heads + h) * dim];
            double *oi = &out[(t * heads + h) * dim];
            for (int64_t d = rd; d < dim; d++) oi[d] = xi[d]; /* not rotated */
            for (int32_t i = 0; i < half; i++) {
                double angle = (double)pos[t] * oracle_rope_freq(p, rd, i);
                double c = cos(angle), s = sin(angle);
                /* the two dims of pair i: halves, or neighbours */
                int32_t a = p->interleave ? 2 * i : i;
                int32_t b = p->interleave ? 2 * i + 1 : i + half;
                oi[a] = xi[a] * c - xi[b] * s;
                oi[b] = xi[b] * c + xi[a] * s;
            }
        }
    }
}
