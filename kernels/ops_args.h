/*
 * ops_args.h — the arguments of the standalone op kernels (kernels/ops.cuh),
 * shared by the host C code (src/cuda/ops.c) and the device code (nvcc or
 * NVRTC). Only fixed-width types and pointers, 8-byte fields first, then
 * 4-byte ones, padded to 8, so that C and CUDA lay them out alike.
 *
 * Tensor strides are in bytes for value tensors (any dtype) and in floats
 * for LSE tensors; index tensors are contiguous int32. Every launch walks
 * `rows` units with groups of 2^tpr_log2 threads (one group per unit), the
 * group size chosen by the host so that a row's 16-byte chunks (or
 * elements) cover it once.
 */
#ifndef FI_OPS_ARGS_H
#define FI_OPS_ARGS_H

/* merge_state (two states, optionally in place with a row mask) and
 * merge_states (n states). Unit: one (token, head) row. */
typedef struct fi_ops_merge_args {
    const char *va;            /* merge_state: state a [n, H, D]; merge_states: v [n, S, H, D] */
    const char *vb;            /* merge_state: state b; merge_states: unused */
    char *vo;                  /* [n, H, D] */
    const float *sa;           /* [n, H] (merge_states: s [n, S, H]) */
    const float *sb;
    float *so;                 /* [n, H] */
    const unsigned char *mask; /* [n] u8 or NULL: every row */
    int64_t va_tok, va_head, va_dim, va_state; /* bytes; va_state: merge_states */
    int64_t vb_tok, vb_head, vb_dim;
    int64_t vo_tok, vo_head, vo_dim;
    int64_t sa_tok, sa_head, sa_state;         /* floats; sa_state: merge_states */
    int64_t sb_tok, sb_head;
    int64_t so_tok, so_head;
    int64_t mask_stride;       /* bytes */
    int64_t rows;              /* n * H */
    int32_t heads;
    int32_t dim;
    int32_t states;            /* merge_states: S (may be 0) */
    int32_t tpr_log2;
} fi_ops_merge_args;

/* append_paged_kv_cache. Unit: one (token, head): its K row and V row. */
typedef struct fi_ops_append_args {
    const char *ak, *av;       /* [nnz, H, D_k], [nnz, H, D_v] */
    char *kc, *vc;             /* paged caches */
    const int32_t *batch;      /* [nnz] */
    const int32_t *pos;        /* [nnz] */
    const int32_t *indices;    /* [num_indices] */
    const int32_t *indptr;     /* [batch_size + 1] */
    const int32_t *last;       /* [batch_size] */
    int64_t ak_tok, ak_head, ak_dim; /* bytes */
    int64_t av_tok, av_head, av_dim;
    int64_t kc_page, kc_slot, kc_head, kc_dim; /* bytes; layout resolved on the host */
    int64_t vc_page, vc_slot, vc_head, vc_dim;
    int64_t rows;              /* nnz * H */
    int32_t heads;
    int32_t dim_k, dim_v;
    int32_t page_size;
    int32_t batch_size;
    int32_t num_indices;       /* entries of kv_indices */
    int32_t num_pages;         /* pages of the cache */
    int32_t tpr_log2;
} fi_ops_append_args;

/* RoPE on q and k. Unit: one (token, chunk of heads_per_unit heads of the
 * q heads followed by the k heads). */
typedef struct fi_ops_rope_args {
    const char *q, *k;
    char *qo, *ko;
    const int32_t *pos_ids;    /* [nnz] (pos_ids form) */
    const int32_t *indptr;     /* [batch + 1] (indptr form) */
    const int32_t *offsets;    /* [batch] */
    int64_t q_tok, q_head, q_dim;   /* bytes */
    int64_t k_tok, k_head, k_dim;
    int64_t qo_tok, qo_head, qo_dim;
    int64_t ko_tok, ko_head, ko_dim;
    int64_t rows;              /* nnz * head chunks */
    int64_t nnz;
    double rope_theta;         /* the frequency formula's parameters, as doubles */
    double rope_scale;
    double low_freq_factor, high_freq_factor, old_context_len;
    int32_t heads_q, heads_k;
    int32_t heads_per_unit;
    int32_t chunks;            /* head chunks per token */
    int32_t dim;
    int32_t rotary_dim;
    int32_t batch;
    int32_t llama31;
    int32_t copy_tail_q;       /* dims past rotary_dim copied (not in place) */
    int32_t copy_tail_k;
    int32_t tpr_log2;
    int32_t pad;
} fi_ops_rope_args;

#endif /* FI_OPS_ARGS_H */
