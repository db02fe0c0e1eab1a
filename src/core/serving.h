/*
 * serving.h — the serving ops (norms, gated activations, softmax, sampling,
 * top-k) as the core hands them to a backend: one validated description per
 * family, so a backend's table has one entry per family rather than one per
 * public function. Included by internal.h; every tensor here has passed the
 * core's checks (shapes, dtypes, strides, overlap, and on host-memory
 * backends the index and parameter values).
 */
#ifndef FI_CORE_SERVING_H
#define FI_CORE_SERVING_H

#include "flashinfer.h"

#include <stdbool.h>
#include <stdint.h>

/* ---------------------------------------------------------------- norms */

typedef enum fi_norm_kind {
    FI_NORM_RMS = 0,  /* x / sqrt(mean(x^2) + eps) * w */
    FI_NORM_LAYER = 1 /* (x - mean) / sqrt(var + eps) * w + bias */
} fi_norm_kind;

/* One norm call. Rows are every leading index of input ([rows..., H]);
 * residual, out have input's shape (their own strides and dtypes). */
typedef struct fi_norm_args {
    fi_norm_kind kind;
    bool gemma;               /* RMS: the weight applied as 1 + w */
    const fi_tensor *input;   /* [rows..., H] */
    fi_tensor *residual;      /* fused add: residual += input first; else NULL */
    const fi_tensor *weight;  /* [H] */
    const fi_tensor *bias;    /* LAYER: [H]; else NULL */
    fi_tensor *out;           /* [rows..., H]; may be input (fused add in place) */
    float eps;
    float quant_scale;        /* out FP8: out = fp8(clamp(y / quant_scale)) */
    int64_t rows;             /* product of the leading dims */
    int64_t hidden;           /* H */
} fi_norm_args;

/* ---------------------------------------------------------- activations */

typedef enum fi_act_kind {
    FI_ACT_SILU = 0,
    FI_ACT_GELU = 1,     /* erf form */
    FI_ACT_GELU_TANH = 2 /* tanh approximation */
} fi_act_kind;

typedef struct fi_act_args {
    fi_act_kind kind;
    const fi_tensor *input; /* [rows..., 2d] */
    fi_tensor *out;         /* [rows..., d] */
    int64_t rows, dim;      /* d */
} fi_act_args;

/* ------------------------------------------------------------- sampling */

/* A per-row parameter: arr [batch] (dtype as the op says) when non-NULL,
 * else val for every row. */
typedef struct fi_param_i32 {
    const fi_tensor *arr;
    int32_t val;
} fi_param_i32;
typedef struct fi_param_f32 {
    const fi_tensor *arr;
    float val;
} fi_param_f32;

typedef struct fi_softmax_args {
    const fi_tensor *logits;  /* [B, V] */
    fi_param_f32 temperature; /* > 0 */
    fi_tensor *probs;         /* [B, V] */
} fi_softmax_args;

/* The filters of one sampling call (docs/SEMANTICS.md, "Sampling"). */
typedef struct fi_sample_args {
    const fi_tensor *input;   /* probs or logits [R, V] */
    bool logits;              /* input are logits: drawn as softmax(input) */
    const fi_tensor *indices; /* [B] i32 in [0, R), or NULL: output b from row b */
    bool use_top_k, use_top_p, use_min_p;
    fi_param_i32 top_k;       /* <= 0 or >= V: off */
    fi_param_f32 top_p;       /* [0, 1] */
    fi_param_f32 min_p;       /* [0, 1] */
    fi_filter_order order;    /* with both top-k and top-p */
    uint64_t seed, offset;
    fi_tensor *samples;       /* [B] i32 */
    fi_tensor *valid;         /* [B] u8, or NULL */
    int64_t batch;            /* B */
} fi_sample_args;

typedef enum fi_filter_op {
    FI_FILTER_TOP_K_RENORM = 0, /* probs -> kept / sum(kept), others 0 */
    FI_FILTER_TOP_P_RENORM = 1,
    FI_FILTER_TOP_K_MASK = 2    /* logits -> kept as they are, others -inf */
} fi_filter_op;

typedef struct fi_filter_args {
    fi_filter_op op;
    const fi_tensor *input; /* [B, V] */
    fi_tensor *out;         /* [B, V]; may be input (the same view) */
    fi_param_i32 top_k;
    fi_param_f32 top_p;
} fi_filter_args;

typedef struct fi_spec_args {
    const fi_tensor *draft_probs;  /* [B, n, V] */
    const fi_tensor *draft_ids;    /* [B, n] i32 */
    const fi_tensor *target_probs; /* [B, n+1, V] */
    uint64_t seed, offset;
    fi_tensor *out_ids;            /* [B, n+1] i32 */
    fi_tensor *accepted;           /* [B] i32 (+=), or NULL */
    fi_tensor *emitted;            /* [B] i32 (+=), or NULL */
} fi_spec_args;

typedef struct fi_topk_args {
    const fi_tensor *input;   /* [R, N], or ragged [nnz] */
    const fi_tensor *indptr;  /* ragged: [R+1] i32; else NULL */
    const fi_tensor *lengths; /* [R] i32, or NULL: N */
    const fi_tensor *offsets; /* [R] i32, or NULL: 0 */
    int32_t k;
    fi_tensor *values;        /* [R, k] input's dtype, or NULL */
    fi_tensor *indices;       /* [R, k] i32 */
    int64_t rows;
} fi_topk_args;

/* RoPE from a cos/sin cache (fi_rope_apply_cos_sin_cache). */
typedef struct fi_rope_cache_args {
    const fi_tensor *positions; /* [nnz] i32 */
    const fi_tensor *q, *k;     /* [nnz, H, D] */
    const fi_tensor *cache;     /* [max_pos, R] f32 */
    bool neox;
    fi_tensor *q_out, *k_out;   /* may be q, k (in place) */
    /* fi_qk_rmsnorm_rope: each head row RMS-normalised by q_w / k_w [D]
     * (1 + w when gemma) before it turns; q_w NULL: plain RoPE */
    const fi_tensor *q_w, *k_w;
    float eps;
    bool gemma;
} fi_rope_cache_args;

/* RoPE + FP8 quantize (+ paged append): fi_rope_quantize_fp8 and its
 * append form, as the core lowers them: up to five segments, each a
 * source of [nnz, H, W] rows and where its FP8 rows go. MLA's 2-D K
 * inputs and 3-D caches arrive as H = 1 views; a GQA K cache row (rope |
 * nope) as two column ranges of the cache; an HND cache as NHD strides. */
typedef struct fi_rq_seg {
    fi_tensor src;  /* [nnz, H, W] f32/f16/bf16 */
    fi_tensor dst;  /* plain: [nnz, H, W]; append: [pages, page_size, H, W]; FP8 */
    bool rope;      /* W = R: turned by the cos/sin cache first */
    float scale;    /* fp8(value * scale) */
} fi_rq_seg;

#define FI_RQ_MAX_SEGS 5

typedef struct fi_rq_args {
    fi_rq_seg seg[FI_RQ_MAX_SEGS];
    int32_t nseg;
    int32_t nq;                 /* seg[0, nq) are Q's: written whatever the page table */
    const fi_tensor *cache;     /* [max_pos, R] f32 */
    const fi_tensor *pos_ids;   /* [nnz] i32 */
    bool neox;
    bool append;                /* segments past nq go to pages */
    const fi_tensor *batch_indices, *positions, *kv_indptr, *kv_indices; /* append */
    int64_t nnz, rot, pages, page_size;
} fi_rq_args;

/* ------------------------------------------------------------ helpers */

/* Element offset of row r of a tensor whose rows are its leading ndim - 1
 * dims (row-major over them), and of element j of it. */
static inline int64_t fi_row_offset(const fi_tensor *t, int64_t r) {
    int64_t off = 0;
    for (int32_t d = t->ndim - 2; d >= 0; d--) {
        int64_t n = t->shape[d];
        off += (r % n) * t->stride[d];
        r /= n;
    }
    return off;
}

/* The random numbers every backend draws: Philox4x32-10 (Salmon et al.,
 * SC'11) keyed by the seed, counter (offset low, offset high, row, draw);
 * a uniform double in [0, 1) from its first 53 output bits. Rows are the
 * output rows of one call (< 2^31: the core bounds every batch). */
static inline void fi_philox_round(uint32_t c[4], const uint32_t k[2]) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t n0 = hi1 ^ c[1] ^ k[0], n2 = hi0 ^ c[3] ^ k[1];
    c[0] = n0, c[1] = lo1, c[2] = n2, c[3] = lo0;
}

static inline void fi_philox4x32_10(const uint32_t ctr[4], uint64_t seed, uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    for (int i = 0; i < 10; i++) {
        fi_philox_round(c, k);
        k[0] += 0x9E3779B9u, k[1] += 0xBB67AE85u;
    }
    out[0] = c[0], out[1] = c[1], out[2] = c[2], out[3] = c[3];
}

static inline double fi_uniform(uint64_t seed, uint64_t offset, uint32_t row, uint32_t draw) {
    const uint32_t ctr[4] = {(uint32_t)offset, (uint32_t)(offset >> 32), (uint32_t)row, draw};
    uint32_t r[4];
    fi_philox4x32_10(ctr, seed, r);
    uint64_t bits = ((uint64_t)r[0] << 32 | r[1]) >> 11;
    return (double)bits * 0x1p-53;
}

#endif /* FI_CORE_SERVING_H */
