/*
 * serving_args.h — the arguments of the serving-op kernels (kernels/serving.cuh:
 * norms, gated activations, RoPE from a cos/sin cache; kernels/sampling.cuh:
 * softmax, sampling, filters, chain speculative sampling, top-k), shared by
 * the host C code (src/cuda/serving_ops.c, src/cuda/sampling_ops.c) and the
 * device code (nvcc or NVRTC). Only fixed-width types and pointers, 8-byte
 * fields first, then 4-byte ones, padded to 8, so C and CUDA lay them out
 * alike. Strides of value tensors are in bytes; of int32/f32 parameter and
 * index tensors, in elements.
 */
#ifndef FI_SERVING_ARGS_H
#define FI_SERVING_ARGS_H

/* Leading dimensions of a [rows..., H] tensor a kernel walks (FI_MAX_DIMS - 1). */
#define FI_SV_LEAD 5

/* Norms. Row r of input / residual / out starts at the byte offset its
 * leading indices give (lead[0..nlead) the extents, outermost first, shared
 * by the three tensors; *_lead their byte strides). */
typedef struct fi_sv_norm_args {
    const char *x;     /* input [rows..., H] */
    char *res;         /* residual (fused add), or NULL */
    const char *w;     /* weight [H] */
    const char *b;     /* bias [H] (LayerNorm), or NULL */
    char *out;         /* [rows..., H]; may be x */
    int64_t lead[FI_SV_LEAD];
    int64_t x_lead[FI_SV_LEAD], r_lead[FI_SV_LEAD], o_lead[FI_SV_LEAD];
    int64_t x_col, r_col, o_col, w_col, b_col; /* bytes between a row's elements */
    int64_t rows, hidden;
    float eps;
    float inv_scale;   /* FP8 out: 1 / scale */
    int32_t nlead;
    int32_t group;     /* threads per row: 32, or the whole block */
} fi_sv_norm_args;

/* Gated activations: out[r, j] = act(x[r, j]) * x[r, d + j]. */
typedef struct fi_sv_act_args {
    const char *x;     /* [rows..., 2d] */
    char *out;         /* [rows..., d] */
    int64_t lead[FI_SV_LEAD], x_lead[FI_SV_LEAD], o_lead[FI_SV_LEAD];
    int64_t x_col, o_col;
    int64_t rows, dim;
    int32_t nlead;
    int32_t pad;
} fi_sv_act_args;

/* RoPE from a cos/sin cache (fi_rope_apply_cos_sin_cache), and the QK
 * RMSNorm before it (fi_qk_rmsnorm_rope). */
typedef struct fi_sv_rope_args {
    const char *q, *k;
    char *qo, *ko;
    const int32_t *pos;    /* [nnz] */
    const float *cache;    /* [max_pos, rot] */
    int64_t q_tok, q_head, q_dim, k_tok, k_head, k_dim;         /* bytes */
    int64_t qo_tok, qo_head, qo_dim, ko_tok, ko_head, ko_dim;
    int64_t pos_st, cache_row, cache_col;                       /* elements */
    int64_t nnz, max_pos;
    int32_t heads_q, heads_k, dim, rot;
    int32_t copy_tail_q, copy_tail_k; /* dims past rot copied (not in place) */
    /* QK RMSNorm + RoPE (fi_qk_rmsnorm_rope, FI_SV_KIND 9) only */
    const char *qw, *kw;   /* [dim] */
    int64_t qw_col, kw_col; /* bytes */
    float eps;
    int32_t pad;
} fi_sv_rope_args;

/* softmax(logits / temperature) per row. */
typedef struct fi_sv_softmax_args {
    const char *x;
    char *out;
    const float *temp;     /* [rows], or NULL: temp_val */
    int64_t x_row, x_col, o_row, o_col, temp_st;
    int64_t rows, vocab;
    float temp_val;
    int32_t pad;
} fi_sv_softmax_args;

/* Sampling (one output row per block). */
typedef struct fi_sv_sample_args {
    const char *x;          /* probs or logits [R, V] */
    const int32_t *indices; /* [batch], or NULL: row b */
    const int32_t *top_k;   /* [batch], or NULL: top_k_val */
    const float *top_p, *min_p;
    int32_t *samples;
    unsigned char *valid;   /* or NULL */
    uint64_t seed, offset;
    int64_t x_row, x_col;
    int64_t idx_st, tk_st, tp_st, mp_st, s_st, v_st;
    int64_t rows, vocab, batch;
    int32_t top_k_val;
    float top_p_val, min_p_val;
    int32_t use_top_k, use_top_p, use_min_p, joint;
    int32_t pad;
} fi_sv_sample_args;

/* top_k / top_p renorm, top_k_mask_logits. */
typedef struct fi_sv_filter_args {
    const char *x;
    char *out;              /* may be x (the same view) */
    const int32_t *top_k;
    const float *top_p;
    int64_t x_row, x_col, o_row, o_col, tk_st, tp_st;
    int64_t rows, vocab;
    int32_t top_k_val;
    float top_p_val;
    int32_t in_place;
    int32_t pad;
} fi_sv_filter_args;

/* Chain speculative sampling (one request per block). */
typedef struct fi_sv_spec_args {
    const char *dp, *tp;    /* [B, n, V], [B, n+1, V] */
    const int32_t *ids;     /* [B, n] */
    int32_t *out_ids;       /* [B, n+1] */
    int32_t *acc, *emi;     /* [B], or NULL */
    uint64_t seed, offset;
    int64_t dp_b, dp_i, dp_v, tp_b, tp_i, tp_v;    /* bytes */
    int64_t ids_b, ids_i, out_b, out_i, acc_st, emi_st;
    int64_t batch, n, vocab;
} fi_sv_spec_args;

/* top_k (dense rows with lengths and offsets, or ragged rows). */
typedef struct fi_sv_topk_args {
    const char *x;
    const int32_t *lengths, *offsets, *indptr; /* each may be NULL */
    int32_t *idx;           /* [R, k] */
    char *vals;             /* [R, k], or NULL */
    int64_t x_row, x_col;   /* bytes (ragged: x_col alone) */
    int64_t len_st, off_st, ptr_st, idx_r, idx_c;
    int64_t val_r, val_c;   /* bytes */
    int64_t rows, cols;     /* dense: N; ragged: elements of x */
    int32_t k;
    int32_t pad;
} fi_sv_topk_args;

#endif /* FI_SERVING_ARGS_H */
