/*
 * oracle.c — fp64 attention, the reference of every attention test.
 *
 * The shape of llm.c's attention_forward: for each request, query token and
 * query head, score every visible key, softmax, weighted sum of V. The only
 * preparation is decoding K and V of one request into doubles (with RoPE
 * applied to K) so the inner loops read plain arrays.
 */
#include "oracle.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>

#define LOG2E 1.4426950408889634

double oracle_alibi_slope(int32_t h, int32_t num_heads) {
    int32_t n = 1;
    while (n * 2 <= num_heads) n *= 2; /* 2^floor(log2 H) */
    if (h < n) return pow(2.0, -8.0 * (h + 1) / n);
    return pow(2.0, -4.0 * (2 * (h - n) + 1) / n);
}

int64_t oracle_kv_len(const fi_attention_params *p, const fi_batch *batch, int32_t b) {
    int64_t n = batch->kv_indptr[b + 1] - batch->kv_indptr[b];
    if (p->kv_format == FI_KV_FORMAT_RAGGED) return n;
    if (n == 0) return 0;
    return (int64_t)p->page_size * (n - 1) + batch->kv_last_page_len[b];
}

int oracle_visible(const fi_attention_params *p, int64_t qo_len, int64_t kv_len,
                   int64_t i, int64_t j, const uint8_t *mask_seg) {
    int64_t qpos = kv_len - qo_len + i; /* the query's position among the keys */
    if (p->mask_mode == FI_MASK_CAUSAL && j > qpos) return 0;
    if (p->mask_mode == FI_MASK_CUSTOM) {
        int64_t bit = i * kv_len + j; /* row-major [qo_len, kv_len] */
        if (!((mask_seg[bit >> 3] >> (bit & 7)) & 1)) return 0;
    }
    if (p->window_left >= 0 && j < qpos - p->window_left) return 0;
    return 1;
}

/* Row (token t, kv head h) of a K or V tensor, decoded into out[D]. For the
 * paged format, token t of request b is slot t % page_size of page
 * kv_indices[kv_indptr[b] + t / page_size]; ragged token t is row
 * kv_indptr[b] + t. */
static void kv_row(const fi_attention_params *p, const fi_batch *batch, const fi_tensor *x,
                   int32_t b, int64_t t, int64_t h, int32_t D, double scale, double *out) {
    int64_t idx[4];
    if (p->kv_format == FI_KV_FORMAT_PAGED) {
        int64_t page = batch->kv_indices[batch->kv_indptr[b] + t / p->page_size];
        int64_t slot = t % p->page_size;
        if (p->kv_layout == FI_KV_LAYOUT_NHD) {
            idx[0] = page; idx[1] = slot; idx[2] = h; idx[3] = 0;
        } else {
            idx[0] = page; idx[1] = h; idx[2] = slot; idx[3] = 0;
        }
    } else {
        int64_t row = batch->kv_indptr[b] + t;
        if (p->kv_layout == FI_KV_LAYOUT_NHD) {
            idx[0] = row; idx[1] = h; idx[2] = 0;
        } else {
            idx[0] = h; idx[1] = row; idx[2] = 0;
        }
    }
    int64_t off = tu_offset(x, idx), step = x->stride[x->ndim - 1];
    for (int32_t d = 0; d < D; d++) out[d] = tu_load(x->data, x->dtype, off + d * step) * scale;
}

static int is_fp8(fi_dtype t) { return t == FI_DTYPE_E4M3 || t == FI_DTYPE_E5M2; }

/* LLaMA RoPE, non-interleaved halves, in place on x[dim] at position pos:
 * for k < dim/2, angle = (pos / scale) * theta^(-2k/dim),
 * x'[k] = x[k] cos - x[k+dim/2] sin, x'[k+dim/2] = x[k+dim/2] cos + x[k] sin. */
static void rope(double *x, int32_t dim, double pos, double scale, double theta) {
    int32_t half = dim / 2;
    for (int32_t k = 0; k < half; k++) {
        double angle = (pos / scale) * pow(theta, -2.0 * k / dim);
        double c = cos(angle), s = sin(angle);
        double x0 = x[k], x1 = x[k + half];
        x[k] = x0 * c - x1 * s;
        x[k + half] = x1 * c + x0 * s;
    }
}

/* Request b's custom-mask bits (NULL without a custom mask): at
 * mask_indptr[b], or packed one request after another from *packed. */
static const uint8_t *mask_segment(const fi_attention_params *p, const fi_batch *batch,
                                   const uint8_t *custom_mask, int32_t b, int64_t qo_len,
                                   int64_t kv_len, int64_t *packed) {
    if (p->mask_mode != FI_MASK_CUSTOM) return NULL;
    int64_t off = batch->mask_indptr ? batch->mask_indptr[b] : *packed;
    *packed += (qo_len * kv_len + 7) / 8;
    return custom_mask + off;
}

/* One request's working rows: decoded K [kv_len][Hkv][Dqk] and V
 * [kv_len][Hkv][Dvo], a value per key, one query row. */
typedef struct req_rows {
    double *kd, *vd, *key, *qv;
} req_rows;

static void req_rows_free(req_rows *r) {
    free(r->kd), free(r->vd), free(r->key), free(r->qv);
}

/* Allocates r and decodes request b's K and V (times k/v_scale for FP8 KV);
 * -1 when out of memory. */
static int req_rows_load(req_rows *r, const fi_attention_params *p, const fi_batch *batch,
                         const fi_tensor *k, const fi_tensor *v, int32_t b, int64_t kv_len) {
    const int32_t Hkv = p->num_kv_heads, Dqk = p->head_dim_qk, Dvo = p->head_dim_vo;
    const double k_scale = is_fp8(p->kv_dtype) ? p->k_scale : 1.0;
    const double v_scale = is_fp8(p->kv_dtype) ? p->v_scale : 1.0;
    size_t nk = (size_t)(kv_len > 0 ? kv_len : 1) * Hkv;
    r->kd = malloc(nk * Dqk * sizeof(double));
    r->vd = malloc(nk * Dvo * sizeof(double));
    r->key = malloc((size_t)(kv_len > 0 ? kv_len : 1) * sizeof(double));
    r->qv = malloc((size_t)Dqk * sizeof(double));
    if (!r->kd || !r->vd || !r->key || !r->qv) {
        req_rows_free(r);
        return -1;
    }
    for (int64_t j = 0; j < kv_len; j++)
        for (int32_t h = 0; h < Hkv; h++) {
            kv_row(p, batch, k, b, j, h, Dqk, k_scale, r->kd + ((size_t)j * Hkv + h) * Dqk);
            kv_row(p, batch, v, b, j, h, Dvo, v_scale, r->vd + ((size_t)j * Hkv + h) * Dvo);
        }
    return 0;
}

int oracle_attention(const fi_attention_params *p, const fi_batch *batch,
                     const fi_tensor *q, const fi_tensor *k, const fi_tensor *v,
                     const uint8_t *custom_mask, double *o, double *lse) {
    const int32_t B = batch->batch_size;
    const int32_t Hq = p->num_qo_heads, Hkv = p->num_kv_heads;
    const int32_t Dqk = p->head_dim_qk, Dvo = p->head_dim_vo;
    if (Hkv <= 0 || Hq % Hkv != 0) return -1;
    const int32_t group = Hq / Hkv;
    const double sm_scale = p->sm_scale != 0.0f ? p->sm_scale : 1.0 / sqrt((double)Dqk);
    const double rope_scale = p->rope_scale > 0 ? p->rope_scale : 1.0;
    const double rope_theta = p->rope_theta > 0 ? p->rope_theta : 1e4;
    const int use_rope = p->pos_encoding == FI_POS_ROPE_LLAMA;
    const int use_alibi = p->pos_encoding == FI_POS_ALIBI;

    int64_t mask_packed = 0; /* bytes, when mask_indptr is NULL */
    for (int32_t b = 0; b < B; b++) {
        const int64_t q0 = batch->qo_indptr[b];
        const int64_t qo_len = batch->qo_indptr[b + 1] - q0;
        const int64_t kv_len = oracle_kv_len(p, batch, b);
        const uint8_t *mask_seg = mask_segment(p, batch, custom_mask, b, qo_len, kv_len, &mask_packed);

        /* K and V of this request, decoded, K with RoPE at position j */
        req_rows rr;
        if (req_rows_load(&rr, p, batch, k, v, b, kv_len)) return -1;
        double *kd = rr.kd, *vd = rr.vd, *logit = rr.key, *qv = rr.qv;
        if (use_rope)
            for (int64_t j = 0; j < kv_len; j++)
                for (int32_t h = 0; h < Hkv; h++)
                    rope(kd + ((size_t)j * Hkv + h) * Dqk, Dqk, (double)j, rope_scale, rope_theta);

        for (int64_t i = 0; i < qo_len; i++) {
            const int64_t qpos = kv_len - qo_len + i;
            for (int32_t h = 0; h < Hq; h++) {
                const int32_t hk = h / group;
                const double slope = !use_alibi ? 0.0
                                   : p->alibi_slopes ? (double)p->alibi_slopes[h]
                                                     : oracle_alibi_slope(h, Hq);
                int64_t qidx[3] = {q0 + i, h, 0};
                int64_t qoff = tu_offset(q, qidx);
                for (int32_t d = 0; d < Dqk; d++)
                    qv[d] = tu_load(q->data, q->dtype, qoff + d * q->stride[2]);
                if (use_rope) rope(qv, Dqk, (double)qpos, rope_scale, rope_theta);

                /* logits of visible keys; max for a stable softmax; a NaN
                 * or +inf logit makes the row NaN (docs/SEMANTICS.md,
                 * "Non-finite values") */
                double maxl = -INFINITY;
                int poisoned = 0;
                for (int64_t j = 0; j < kv_len; j++) {
                    logit[j] = -INFINITY;
                    if (!oracle_visible(p, qo_len, kv_len, i, j, mask_seg)) continue;
                    const double *kr = kd + ((size_t)j * Hkv + hk) * Dqk;
                    double s = 0.0;
                    for (int32_t d = 0; d < Dqk; d++) s += qv[d] * kr[d];
                    double l = s * sm_scale;
                    if (p->logits_soft_cap > 0.0f)
                        l = p->logits_soft_cap * tanh(l / p->logits_soft_cap);
                    if (use_alibi) l += slope * (double)(j - qpos);
                    logit[j] = l;
                    poisoned |= !(l < INFINITY);
                    if (l > maxl) maxl = l;
                }

                double *orow = o + ((size_t)(q0 + i) * Hq + h) * Dvo;
                for (int32_t d = 0; d < Dvo; d++) orow[d] = poisoned ? NAN : 0.0;
                if (poisoned) {
                    if (lse) lse[(q0 + i) * Hq + h] = NAN;
                    continue;
                }
                if (maxl == -INFINITY) { /* no visible key */
                    if (lse) lse[(q0 + i) * Hq + h] = -INFINITY;
                    continue;
                }
                double sum = 0.0;
                for (int64_t j = 0; j < kv_len; j++) {
                    if (logit[j] == -INFINITY) continue;
                    double w = exp(logit[j] - maxl);
                    sum += w;
                    const double *vr = vd + ((size_t)j * Hkv + hk) * Dvo;
                    for (int32_t d = 0; d < Dvo; d++) orow[d] += w * vr[d];
                }
                for (int32_t d = 0; d < Dvo; d++) orow[d] /= sum;
                /* log2(sum_j e^l_j) = (max + ln sum) * log2(e) */
                if (lse) lse[(q0 + i) * Hq + h] = (maxl + log(sum)) * LOG2E;
            }
        }
        req_rows_free(&rr);
    }
    return 0;
}

/* ------------------------------------------------------------ with hooks */

/* x[n] through a float hook: doubles in, doubles out. */
static void through_floats(double *x, int32_t n, float *tmp) {
    for (int32_t d = 0; d < n; d++) x[d] = (double)tmp[d];
}

int oracle_attention_hooks(const fi_attention_params *p, const fi_batch *batch,
                           const fi_tensor *q, const fi_tensor *k, const fi_tensor *v,
                           const uint8_t *custom_mask, const fi_vk_hooks *hk,
                           const void *prm, double *o, double *lse) {
    const int32_t B = batch->batch_size;
    const int32_t Hq = p->num_qo_heads, Hkv = p->num_kv_heads;
    const int32_t Dqk = p->head_dim_qk, Dvo = p->head_dim_vo;
    if (Hkv <= 0 || Hq % Hkv != 0) return -1;
    const int32_t group = Hq / Hkv;
    const double sm_scale = p->sm_scale != 0.0f ? p->sm_scale : 1.0 / sqrt((double)Dqk);
    float tmp[512];

    int64_t mask_packed = 0;
    for (int32_t b = 0; b < B; b++) {
        const int64_t q0 = batch->qo_indptr[b];
        const int64_t qo_len = batch->qo_indptr[b + 1] - q0;
        const int64_t kv_len = oracle_kv_len(p, batch, b);
        const uint8_t *mask_seg = mask_segment(p, batch, custom_mask, b, qo_len, kv_len, &mask_packed);
        fi_vk_hook_ctx c = {(int32_t)b, -1, 0, -1, -1, (int32_t)qo_len, (int32_t)kv_len, 0,
                            (float)sm_scale};

        /* K, V decoded, then through the key and value hooks */
        req_rows rr;
        if (req_rows_load(&rr, p, batch, k, v, b, kv_len)) return -1;
        double *kd = rr.kd, *vd = rr.vd, *w = rr.key, *qv = rr.qv;
        for (int64_t j = 0; j < kv_len; j++) {
            for (int32_t h = 0; h < Hkv; h++) {
                double *kr = kd + ((size_t)j * Hkv + h) * Dqk;
                double *vr = vd + ((size_t)j * Hkv + h) * Dvo;
                c.kv_head = h, c.kv_pos = (int32_t)j;
                c.head_dim = Dqk;
                for (int32_t d = 0; d < Dqk; d++) tmp[d] = (float)kr[d];
                hk->key_transform(tmp, &c, prm);
                through_floats(kr, Dqk, tmp);
                c.head_dim = Dvo;
                for (int32_t d = 0; d < Dvo; d++) tmp[d] = (float)vr[d];
                hk->value_transform(tmp, &c, prm);
                through_floats(vr, Dvo, tmp);
            }
        }

        for (int64_t i = 0; i < qo_len; i++) {
            const int64_t qpos = kv_len - qo_len + i;
            for (int32_t h = 0; h < Hq; h++) {
                const int32_t hk_ = h / group;
                c.qo_head = h, c.kv_head = hk_, c.q_pos = (int32_t)qpos, c.kv_pos = -1;
                c.head_dim = Dqk;
                int64_t qidx[3] = {q0 + i, h, 0};
                int64_t qoff = tu_offset(q, qidx);
                for (int32_t d = 0; d < Dqk; d++)
                    tmp[d] = (float)tu_load(q->data, q->dtype, qoff + d * q->stride[2]);
                hk->query_transform(tmp, &c, prm);
                through_floats(qv, Dqk, tmp);

                /* weights (softmax: logits) of the kept keys */
                double maxl = -INFINITY;
                int any = 0;
                for (int64_t j = 0; j < kv_len; j++) {
                    w[j] = hk->use_softmax ? -INFINITY : 0.0;
                    if (!oracle_visible(p, qo_len, kv_len, i, j, mask_seg)) continue;
                    const double *kr = kd + ((size_t)j * Hkv + hk_) * Dqk;
                    double s = 0.0;
                    for (int32_t d = 0; d < Dqk; d++) s += qv[d] * kr[d];
                    c.kv_pos = (int32_t)j;
                    double l = hk->logits_transform((float)(s * sm_scale), &c, prm);
                    if (!hk->logits_mask(&c, prm)) continue;
                    w[j] = l;
                    any = 1;
                    if (l > maxl) maxl = l;
                }
                c.kv_pos = -1;

                double *orow = o + ((size_t)(q0 + i) * Hq + h) * Dvo;
                for (int32_t d = 0; d < Dvo; d++) orow[d] = 0.0;
                double lse_nat = 0.0;
                if (hk->use_softmax) {
                    lse_nat = -INFINITY;
                    if (any && maxl != -INFINITY) {
                        double sum = 0.0;
                        for (int64_t j = 0; j < kv_len; j++) {
                            if (w[j] == -INFINITY) continue;
                            double e = exp(w[j] - maxl);
                            sum += e;
                            const double *vr = vd + ((size_t)j * Hkv + hk_) * Dvo;
                            for (int32_t d = 0; d < Dvo; d++) orow[d] += e * vr[d];
                        }
                        for (int32_t d = 0; d < Dvo; d++) orow[d] /= sum;
                        lse_nat = maxl + log(sum);
                    }
                } else {
                    for (int64_t j = 0; j < kv_len; j++) {
                        if (w[j] == 0.0) continue;
                        const double *vr = vd + ((size_t)j * Hkv + hk_) * Dvo;
                        for (int32_t d = 0; d < Dvo; d++) orow[d] += w[j] * vr[d];
                    }
                }
                c.head_dim = Dvo;
                for (int32_t d = 0; d < Dvo; d++) tmp[d] = (float)orow[d];
                hk->output_transform(tmp, (float)lse_nat, &c, prm);
                through_floats(orow, Dvo, tmp);
                if (lse) lse[(q0 + i) * Hq + h] = hk->use_softmax ? lse_nat * LOG2E : 0.0;
            }
        }
        req_rows_free(&rr);
    }
    return 0;
}
