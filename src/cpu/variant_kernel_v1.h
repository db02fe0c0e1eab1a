/*
 * variant_kernel_v1.h — the previous version of variant_kernel.h (scalar
 * per-element hook/mask loop, exp not vectorised by GCC, logits and P.V
 * accumulators through memory), kept side by side for bench_variant_cpu
 * (FLASHINFER_CPU_VARIANT_KERNEL=1 selects it). The generic CPU attention
 * kernel of user-defined variants: a template the CPU backend compiles at run time with the system
 * C compiler (variant_jit.c), after a variant's hooks (fi_variant_source,
 * target C) and FI_VK_* configuration macros. Never compiled into the
 * library itself; embedded as text (with flashinfer.h, convert.h and
 * variant_abi.h, their quoted #includes dropped).
 *
 * One work item, every KV head; the GQA group's query heads are packed into
 * rows as the SIMD kernels do (row p: token q_start + p / group, query head
 * hkv * group + p % group). Up to FI_VK_BM rows are held at once, so each key
 * block is loaded, dequantised and passed through key_transform /
 * value_transform once per item. Per key block:
 *   S[r][:] = q_r . K^T over a transposed K block (vectorised across keys),
 *   logits_transform, masks (causal, window, custom bits, logits_mask),
 *   online softmax with a polynomial exp (vectorisable), or, with
 *   use_softmax = 0, the weights themselves; O[r][:] += p . V (vectorised
 *   across head_dim). Rows finish with output_transform (write-through) or
 * as partial states; merge_row merges split rows and then applies it.
 *
 * Configuration: FI_VK_DQK, FI_VK_DVO (64/128/256), FI_VK_Q_DTYPE,
 * FI_VK_KV_DTYPE, FI_VK_O_DTYPE (fi_dtype values).
 */
#include "flashinfer.h"
#include "cpu/convert.h"
#include "cpu/variant_abi.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif

#define DQK FI_VK_DQK
#define DVO FI_VK_DVO
#define BM FI_VK_BM
#define BN FI_VK_BN
#define QDT ((fi_dtype)FI_VK_Q_DTYPE)
#define KVDT ((fi_dtype)FI_VK_KV_DTYPE)
#define ODT ((fi_dtype)FI_VK_O_DTYPE)
#define VK_EXPORT __attribute__((visibility("default")))
#define VK_LOG2E 1.4426950408889634f
#define VK_LN2 0.6931471805599453f

/* Bytes per element of a storage dtype (constant-folded for the config). */
static inline int64_t vk_esize(fi_dtype t) {
    return t == FI_DTYPE_F32 ? 4 : t == FI_DTYPE_F16 || t == FI_DTYPE_BF16 ? 2 : 1;
}

/* e^x, branch-free so loops over it vectorise: 2^(x log2 e) = 2^n 2^f with
 * n = round, |f| <= 1/2, 2^f by its degree-7 Taylor series (rel. error
 * < 1e-8); x below -87 (-inf included) gives 0. */
static inline float vk_exp(float x) {
    float t = x * VK_LOG2E;
    t = t < -126.0f ? -126.0f : t > 126.0f ? 126.0f : t;
    int32_t ni = (int32_t)(t + 128.5f) - 128; /* round(t): the argument is positive */
    float f = t - (float)ni;
    float p = 1.525273380405984e-05f;
    p = p * f + 1.5403530393381606e-04f;
    p = p * f + 1.3333558146428443e-03f;
    p = p * f + 9.618129107628477e-03f;
    p = p * f + 5.550410866482158e-02f;
    p = p * f + 2.402265069591007e-01f;
    p = p * f + 6.931471805599453e-01f;
    p = p * f + 1.0f;
    uint32_t bits = (uint32_t)(ni + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return x < -87.0f ? 0.0f : p * scale;
}

typedef struct vk_scratch {
    float q[BM][DQK];      /* transformed queries, times sm_scale */
    float acc[BM][DVO];    /* output accumulators */
    float kt[DQK][BN];     /* the key block, transposed */
    float vb[BN][DVO];     /* the value block */
    float s[BM][BN];       /* logits, then probabilities / weights */
    float m[BM], l[BM];    /* running max and sum (softmax) */
    int32_t lo[BM], hi[BM];/* keys [lo, hi) a row may see by causal/window */
    float row[DQK > DVO ? DQK : DVO];
} vk_scratch;

/* What stays fixed while a row block walks its keys. */
typedef struct vk_block {
    const fi_vk_job *j;
    const fi_vk_item *it;
    const fi_variant_params *prm;
    int32_t qo_len, kv_len, hkv, row0, rows;
    const uint8_t *mask;   /* the request's custom mask bits, or NULL */
} vk_block;

static inline void vk_load_row(float *restrict dst, const uint8_t *src, fi_dtype t,
                               int64_t stride, int32_t n, float scale) {
#if defined(__F16C__) && defined(__AVX__)
    if (t == FI_DTYPE_F16 && stride == 2 && n % 8 == 0) { /* the hardware conversion */
        for (int32_t d = 0; d < n; d += 8) {
            __m128i h = _mm_loadu_si128((const __m128i *)(src + 2 * d));
            _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(scale)));
        }
        return;
    }
#endif
    if (t == FI_DTYPE_BF16 && stride == 2) { /* a shift: vectorises */
        const uint16_t *h = (const uint16_t *)src;
        for (int32_t d = 0; d < n; d++) {
            union { uint32_t u; float f; } x;
            x.u = (uint32_t)h[d] << 16;
            dst[d] = scale * x.f;
        }
        return;
    }
    if (stride == vk_esize(t)) {
        for (int32_t d = 0; d < n; d++) dst[d] = scale * fi_load_f32(src, t, d);
    } else {
        for (int32_t d = 0; d < n; d++) dst[d] = scale * fi_load_f32(src + d * stride, t, 0);
    }
}

static inline void vk_store_row(uint8_t *dst, fi_dtype t, int64_t stride, const float *src,
                                int32_t n) {
    if (stride == vk_esize(t)) {
        for (int32_t d = 0; d < n; d++) fi_store_f32(dst, t, d, src[d]);
    } else {
        for (int32_t d = 0; d < n; d++) fi_store_f32(dst + d * stride, t, 0, src[d]);
    }
}

/* The row of key `key` of KV head h in a cache. */
static inline const uint8_t *vk_kv_row(const fi_vk_job *j, const fi_vk_kv *kv, int32_t req,
                                       int32_t h, int32_t key) {
    const uint8_t *base = kv->base + h * kv->head_stride;
    if (!j->paged) return base + ((int64_t)j->kv_indptr[req] + key) * kv->slot_stride;
    int32_t page = j->kv_indices[j->kv_indptr[req] + key / j->page_size];
    return base + (int64_t)page * kv->page_stride + (int64_t)(key % j->page_size) * kv->slot_stride;
}

static inline fi_hook_ctx vk_ctx(const vk_block *b, int32_t head_dim) {
    fi_hook_ctx c;
    c.request = b->it->request;
    c.qo_head = -1;
    c.kv_head = b->hkv;
    c.q_pos = -1;
    c.kv_pos = -1;
    c.qo_len = b->qo_len;
    c.kv_len = b->kv_len;
    c.head_dim = head_dim;
    c.sm_scale = b->j->sm_scale;
    return c;
}

/* Stage the rows' queries and visible ranges; returns the keys [*kmin, *kmax)
 * any row may see. */
static void vk_stage_q(const vk_block *b, vk_scratch *sc, int32_t *kmin, int32_t *kmax) {
    const fi_vk_job *j = b->j;
    fi_hook_ctx c = vk_ctx(b, DQK);
    int64_t qo_base = j->qo_indptr[b->it->request];
    *kmin = b->it->kv_end, *kmax = b->it->kv_start;
    for (int32_t r = 0; r < b->rows; r++) {
        int32_t p = b->row0 + r, t = b->it->q_start + p / j->group;
        c.qo_head = b->hkv * j->group + p % j->group;
        c.q_pos = b->kv_len - b->qo_len + t;
        const uint8_t *src = j->q + (qo_base + t) * j->q_tok + c.qo_head * j->q_head;
        vk_load_row(sc->q[r], src, QDT, j->q_elem, DQK, 1.0f);
#if FI_VARIANT_HAS_QUERY_TRANSFORM
        fi_query_transform(sc->q[r], &c, b->prm);
#endif
        for (int32_t d = 0; d < DQK; d++) sc->q[r][d] *= j->sm_scale;
        int32_t lo = b->it->kv_start, hi = b->it->kv_end;
        if (j->causal && c.q_pos + 1 < hi) hi = c.q_pos + 1;
        if (j->window_left >= 0 && c.q_pos - j->window_left > lo) lo = c.q_pos - j->window_left;
        sc->lo[r] = lo, sc->hi[r] = hi;
        if (lo < hi && lo < *kmin) *kmin = lo;
        if (lo < hi && hi > *kmax) *kmax = hi;
        sc->m[r] = -INFINITY, sc->l[r] = 0.0f;
        memset(sc->acc[r], 0, sizeof sc->acc[r]);
    }
    for (int32_t r = b->rows; r < ((b->rows + 3) & ~3) && r < BM; r++)
        memset(sc->q[r], 0, sizeof sc->q[r]);
}

/* Keys [j0, j0 + n) of the block's KV head: K transposed into kt, V into vb. */
static void vk_stage_kv(const vk_block *b, vk_scratch *sc, int32_t j0, int32_t n) {
    const fi_vk_job *j = b->j;
    int32_t req = b->it->request;
    fi_hook_ctx ck = vk_ctx(b, DQK), cv = vk_ctx(b, DVO);
    for (int32_t jj = 0; jj < n; jj++) {
        ck.kv_pos = cv.kv_pos = j0 + jj;
        vk_load_row(sc->row, vk_kv_row(j, &j->k, req, b->hkv, j0 + jj), KVDT, j->k.elem_stride,
                    DQK, j->k_scale);
#if FI_VARIANT_HAS_KEY_TRANSFORM
        fi_key_transform(sc->row, &ck, b->prm);
#endif
        for (int32_t d = 0; d < DQK; d++) sc->kt[d][jj] = sc->row[d];
        vk_load_row(sc->vb[jj], vk_kv_row(j, &j->v, req, b->hkv, j0 + jj), KVDT,
                    j->v.elem_stride, DVO, j->v_scale);
#if FI_VARIANT_HAS_VALUE_TRANSFORM
        fi_value_transform(sc->vb[jj], &cv, b->prm);
#endif
    }
    if (n < BN)
        for (int32_t d = 0; d < DQK; d++)
            for (int32_t jj = n; jj < BN; jj++) sc->kt[d][jj] = 0.0f;
}

/* S[r][:] = q_r . K^T for rows [0, rows) rounded up to 4 (padding rows are 0). */
static void vk_logits(vk_scratch *sc, int32_t rows) {
    for (int32_t r = 0; r < rows; r += 4) {
        float *restrict s0 = sc->s[r], *restrict s1 = sc->s[r + 1];
        float *restrict s2 = sc->s[r + 2], *restrict s3 = sc->s[r + 3];
        for (int32_t jj = 0; jj < BN; jj++) s0[jj] = s1[jj] = s2[jj] = s3[jj] = 0.0f;
        for (int32_t d = 0; d < DQK; d++) {
            const float *restrict k = sc->kt[d];
            float q0 = sc->q[r][d], q1 = sc->q[r + 1][d], q2 = sc->q[r + 2][d], q3 = sc->q[r + 3][d];
            for (int32_t jj = 0; jj < BN; jj++) {
                s0[jj] += q0 * k[jj];
                s1[jj] += q1 * k[jj];
                s2[jj] += q2 * k[jj];
                s3[jj] += q3 * k[jj];
            }
        }
    }
}

/* Row r's logits of keys [j0, j0 + n): transform and masks, then softmax
 * probabilities (rescaling its accumulator) or weights. Returns 0 when the
 * row sees none of these keys. */
static int vk_row_weights(const vk_block *b, vk_scratch *sc, int32_t r, int32_t j0, int32_t n) {
    const fi_vk_job *j = b->j;
    float *s = sc->s[r];
    int32_t p = b->row0 + r, t = b->it->q_start + p / j->group;
    fi_hook_ctx c = vk_ctx(b, DQK);
    c.qo_head = b->hkv * j->group + p % j->group;
    c.q_pos = b->kv_len - b->qo_len + t;
    int32_t lo = sc->lo[r] - j0, hi = sc->hi[r] - j0, any = 0;
    const float off = FI_VARIANT_USE_SOFTMAX ? -INFINITY : 0.0f;
    for (int32_t jj = 0; jj < BN; jj++) {
        int keep = jj >= lo && jj < hi && jj < n;
        if (keep && b->mask) {
            int64_t bit = (int64_t)t * b->kv_len + j0 + jj;
            keep = (b->mask[bit >> 3] >> (bit & 7)) & 1;
        }
        if (keep) {
            c.kv_pos = j0 + jj;
#if FI_VARIANT_HAS_LOGITS_TRANSFORM
            s[jj] = fi_logits_transform(s[jj], &c, b->prm);
#endif
#if FI_VARIANT_HAS_LOGITS_MASK
            keep = fi_logits_mask(&c, b->prm) != 0;
#endif
        }
        s[jj] = keep ? s[jj] : off;
        any |= keep;
    }
    if (!any) return 0;
#if FI_VARIANT_USE_SOFTMAX
    /* max and sum over 16 lanes: independent chains vectorise */
    float lane[16], mx = sc->m[r], sum = 0.0f;
    for (int32_t u = 0; u < 16; u++) lane[u] = -INFINITY;
    for (int32_t jj = 0; jj < BN; jj += 16)
        for (int32_t u = 0; u < 16; u++) lane[u] = s[jj + u] > lane[u] ? s[jj + u] : lane[u];
    for (int32_t u = 0; u < 16; u++) mx = lane[u] > mx ? lane[u] : mx;
    if (mx == -INFINITY) return 0; /* every kept logit is -inf */
    float alpha = vk_exp(sc->m[r] - mx);
    for (int32_t jj = 0; jj < BN; jj++) s[jj] = vk_exp(s[jj] - mx);
    for (int32_t u = 0; u < 16; u++) lane[u] = 0.0f;
    for (int32_t jj = 0; jj < BN; jj += 16)
        for (int32_t u = 0; u < 16; u++) lane[u] += s[jj + u];
    for (int32_t u = 0; u < 16; u++) sum += lane[u];
    sc->m[r] = mx;
    sc->l[r] = sc->l[r] * alpha + sum;
    if (alpha != 1.0f)
        for (int32_t d = 0; d < DVO; d++) sc->acc[r][d] *= alpha;
#endif
    return 1;
}

/* acc[r][:] += sum_jj s[r][jj] * V[jj][:] for the rows flagged in `live`. */
static void vk_accumulate(vk_scratch *sc, const uint8_t *live, int32_t rows, int32_t n) {
    int32_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        if (!live[r] && !live[r + 1]) continue;
        float *restrict a0 = sc->acc[r], *restrict a1 = sc->acc[r + 1];
        const float *p0 = sc->s[r], *p1 = sc->s[r + 1];
        for (int32_t jj = 0; jj < n; jj++) {
            const float *restrict v = sc->vb[jj];
            float w0 = live[r] ? p0[jj] : 0.0f, w1 = live[r + 1] ? p1[jj] : 0.0f;
            for (int32_t d = 0; d < DVO; d++) {
                a0[d] += w0 * v[d];
                a1[d] += w1 * v[d];
            }
        }
    }
    for (; r < rows; r++) {
        if (!live[r]) continue;
        float *restrict a = sc->acc[r];
        for (int32_t jj = 0; jj < n; jj++) {
            float w = sc->s[r][jj];
            const float *restrict v = sc->vb[jj];
            for (int32_t d = 0; d < DVO; d++) a[d] += w * v[d];
        }
    }
}

/* Normalise row r into o[DVO]; returns its LSE, natural log (0 when
 * use_softmax is 0; -inf for a row that saw no key). */
static float vk_finish(vk_scratch *sc, int32_t r, float *o) {
#if FI_VARIANT_USE_SOFTMAX
    if (sc->l[r] <= 0.0f) {
        for (int32_t d = 0; d < DVO; d++) o[d] = 0.0f;
        return -INFINITY;
    }
    float inv = 1.0f / sc->l[r];
    for (int32_t d = 0; d < DVO; d++) o[d] = sc->acc[r][d] * inv;
    return sc->m[r] + logf(sc->l[r]);
#else
    for (int32_t d = 0; d < DVO; d++) o[d] = sc->acc[r][d];
    return 0.0f;
#endif
}

static void vk_write_rows(const vk_block *b, vk_scratch *sc) {
    const fi_vk_job *j = b->j;
    const fi_vk_item *it = b->it;
    fi_hook_ctx c = vk_ctx(b, DVO);
    float o[DVO];
    for (int32_t r = 0; r < b->rows; r++) {
        int32_t p = b->row0 + r, t = it->q_start + p / j->group;
        int32_t head = b->hkv * j->group + p % j->group;
        float lse = vk_finish(sc, r, o);
        float lse2 = FI_VARIANT_USE_SOFTMAX ? lse * VK_LOG2E : 0.0f;
        if (it->partial_row >= 0) {
            int64_t pr = (int64_t)(it->partial_row + t - it->q_start) * j->h_qo + head;
            memcpy(j->partial_o + pr * DVO, o, sizeof o);
            j->partial_lse[pr] = lse2;
            continue;
        }
        c.qo_head = head;
        c.q_pos = b->kv_len - b->qo_len + t;
#if FI_VARIANT_HAS_OUTPUT_TRANSFORM
        fi_output_transform(o, lse, &c, b->prm);
#endif
        int64_t tok = j->qo_indptr[it->request] + t;
        vk_store_row(j->o + tok * j->o_tok + head * j->o_head, ODT, j->o_elem, o, DVO);
        if (j->lse) j->lse[tok * j->lse_tok + head * j->lse_head] = lse2;
    }
}

static void vk_row_block(const vk_block *b, vk_scratch *sc) {
    int32_t kmin, kmax;
    uint8_t live[BM];
    vk_stage_q(b, sc, &kmin, &kmax);
    for (int32_t j0 = kmin; j0 < kmax; j0 += BN) {
        int32_t n = kmax - j0 < BN ? kmax - j0 : BN;
        vk_stage_kv(b, sc, j0, n);
        vk_logits(sc, b->rows);
        for (int32_t r = 0; r < b->rows; r++) live[r] = (uint8_t)vk_row_weights(b, sc, r, j0, n);
        vk_accumulate(sc, live, b->rows, n);
    }
    vk_write_rows(b, sc);
}

static void vk_attend(const fi_vk_job *j, const fi_vk_item *it, void *scratch) {
    vk_block b;
    b.j = j, b.it = it, b.prm = (const fi_variant_params *)j->params;
    b.qo_len = j->qo_indptr[it->request + 1] - j->qo_indptr[it->request];
    b.kv_len = j->kv_len[it->request];
    b.mask = j->mask ? j->mask + j->mask_offset[it->request] : NULL;
    int32_t rows = (it->q_end - it->q_start) * j->group;
    for (b.hkv = 0; b.hkv < j->h_kv; b.hkv++)
        for (b.row0 = 0; b.row0 < rows; b.row0 += BM) {
            b.rows = rows - b.row0 < BM ? rows - b.row0 : BM;
            vk_row_block(&b, (vk_scratch *)scratch);
        }
}

/* ------------------------------------------------------------------ merge */

/* The request holding global query token `row` (the last whose first token is
 * at or before it). */
static int32_t vk_request_of(const fi_vk_job *j, int32_t row) {
    int32_t lo = 0, hi = j->batch_size - 1;
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) / 2;
        if (j->qo_indptr[mid] <= row) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static void vk_merge_row(const fi_vk_job *j, int32_t row, const int32_t *src, int32_t n) {
    int32_t req = vk_request_of(j, row);
    fi_hook_ctx c;
    memset(&c, 0, sizeof c);
    c.request = req;
    c.qo_len = j->qo_indptr[req + 1] - j->qo_indptr[req];
    c.kv_len = j->kv_len[req];
    c.q_pos = c.kv_len - c.qo_len + (row - j->qo_indptr[req]);
    c.kv_pos = -1;
    c.head_dim = DVO;
    c.sm_scale = j->sm_scale;
    float acc[DVO];
    for (int32_t h = 0; h < j->h_qo; h++) {
        float lse2 = 0.0f;
        memset(acc, 0, sizeof acc);
#if FI_VARIANT_USE_SOFTMAX
        float mx = -INFINITY, wsum = 0.0f;
        for (int32_t i = 0; i < n; i++) {
            float l = j->partial_lse[(int64_t)src[i] * j->h_qo + h];
            mx = l > mx ? l : mx;
        }
        lse2 = -INFINITY;
        if (mx != -INFINITY) {
            for (int32_t i = 0; i < n; i++) {
                int64_t pr = (int64_t)src[i] * j->h_qo + h;
                if (j->partial_lse[pr] == -INFINITY) continue;
                float w = exp2f(j->partial_lse[pr] - mx);
                for (int32_t d = 0; d < DVO; d++) acc[d] += w * j->partial_o[pr * DVO + d];
                wsum += w;
            }
            for (int32_t d = 0; d < DVO; d++) acc[d] /= wsum;
            lse2 = mx + log2f(wsum);
        }
#else
        for (int32_t i = 0; i < n; i++) {
            const float *po = j->partial_o + ((int64_t)src[i] * j->h_qo + h) * DVO;
            for (int32_t d = 0; d < DVO; d++) acc[d] += po[d];
        }
#endif
        c.qo_head = h;
        c.kv_head = h / j->group;
#if FI_VARIANT_HAS_OUTPUT_TRANSFORM
        fi_output_transform(acc, FI_VARIANT_USE_SOFTMAX ? lse2 * VK_LN2 : 0.0f, &c,
                            (const fi_variant_params *)j->params);
#endif
        vk_store_row(j->o + (int64_t)row * j->o_tok + h * j->o_head, ODT, j->o_elem, acc, DVO);
        if (j->lse) j->lse[(int64_t)row * j->lse_tok + h * j->lse_head] = lse2;
    }
}

FI_STATIC_ASSERT(sizeof(fi_hook_ctx) == sizeof(fi_vk_hook_ctx), "fi_hook_ctx layout");

VK_EXPORT const fi_vk_entry fi_vk_entry_point = {
    FI_VK_ABI, DQK, DVO, FI_VK_Q_DTYPE, FI_VK_KV_DTYPE, FI_VK_O_DTYPE,
    (sizeof(vk_scratch) + 63) & ~(size_t)63, vk_attend, vk_merge_row,
};
