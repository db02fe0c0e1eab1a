/*
 * rope_quant_args.h — the arguments of the RoPE + FP8 quantize (+ paged
 * append) kernel (kernels/rope_quant.cuh), shared by the host C code
 * (src/cuda/rope_quant.c) and the device code (nvcc or NVRTC). Only
 * fixed-width types and pointers, 8-byte fields first, then 4-byte ones,
 * padded to 8, so C and CUDA lay them out alike. Strides of the value
 * tensors are in bytes; of the i32 index tensors and the f32 cos/sin
 * cache, in elements.
 */
#ifndef FI_ROPE_QUANT_ARGS_H
#define FI_ROPE_QUANT_ARGS_H

#define FI_RQ_SEGS 5
/* units of 8 elements a thread of the vector path loads before it stores */
#define FI_RQ_UNITS 2

/* One segment: rows [nnz, heads, width] of src into FP8 rows of dst, at
 * dst + t * d_row (an output) or dst + page * d_row + slot * d_slot (a
 * paged cache: `paged`), + h * d_head, + i * d_col. */
typedef struct fi_rq_kseg {
    const char *src;
    char *dst;
    int64_t s_tok, s_head, s_col;
    int64_t d_row, d_slot, d_head, d_col;
    int64_t units;          /* per token: heads x upr */
    int32_t heads, width;
    int32_t upr;            /* units of work per head row */
    int32_t rope;           /* width = rot, turned by the cache first */
    int32_t paged;
    float scale;
} fi_rq_kseg;

typedef struct fi_rq_kargs {
    fi_rq_kseg seg[FI_RQ_SEGS];
    const int32_t *pos;                     /* pos_ids [nnz] */
    const float *cache;                     /* [max_pos, rot] */
    const int32_t *batch, *slot_pos;        /* paged: batch_indices, positions [nnz] */
    const int32_t *indptr, *indices;        /* paged: kv_indptr [B+1], kv_indices */
    int64_t pos_st, cache_row, cache_col;
    int64_t batch_st, slot_pos_st, indptr_st, indices_st;
    int64_t nnz, max_pos, units;            /* units: per token, every segment */
    int32_t nseg, rot;
    int32_t page_size, batch_size;
    int32_t num_indices, num_pages;
} fi_rq_kargs;

#endif /* FI_ROPE_QUANT_ARGS_H */
