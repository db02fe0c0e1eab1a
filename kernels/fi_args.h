/*
 * fi_args.h — the structs the host passes to the CUDA kernels, shared by the
 * host C code (src/cuda) and the device code (kernels/, nvcc or NVRTC).
 * Only fixed-width types and pointers, laid out so that C and CUDA agree
 * (8-byte fields first, then 4-byte ones, explicit padding).
 *
 * The plan's device metadata ("meta") is one region written by one async
 * copy per fi_plan_update: a fi_meta header, then the arrays at the byte
 * offsets the header names. The arrays are packed for the batch at hand, so
 * the copy moves only what the batch uses; the kernels find them through the
 * header, so `run` reads only fixed addresses (the region's base). Two
 * arrays come first at offsets that depend only on the grid's worker count
 * W (fixed per plan), so a CTA reads its item range and first item without
 * waiting for the header: worker_indptr at FI_META_WORKERS, W + 1 entries
 * (workers past the schedule's have empty ranges), then the items at
 * fi_meta_items(W).
 */
#ifndef FI_KERNEL_ARGS_H
#define FI_KERNEL_ARGS_H

/* The hooks a user variant has (kernels/variant.cuh's FI_VHOOKS; the host
 * decides q_scale and the merge kernel from the same bits). */
#define FI_VH_QUERY 1
#define FI_VH_KEY 2
#define FI_VH_VALUE 4
#define FI_VH_LOGITS 8
#define FI_VH_MASK 16
#define FI_VH_OUTPUT 32
#define FI_VH_NO_SOFTMAX 64

typedef struct fi_meta {
    int64_t off_qo_indptr;     /* int32 [B+1] */
    int64_t reserved0;         /* 0 (was kv_indptr, which the item records carry) */
    int64_t off_kv_indices;    /* int32 [kv_indptr[B]] paged only */
    int64_t off_kv_len;        /* int32 [B] keys per request */
    int64_t off_mask_offset;   /* int64 [B+1] custom-mask byte offsets */
    int64_t off_items;         /* fi_item_rec [num_items] = fi_meta_items(W) */
    int64_t off_worker_indptr; /* int32 [W+1] = FI_META_WORKERS */
    int64_t off_merge_out_row; /* int32 [num_merge_rows] */
    int64_t off_merge_indptr;  /* int32 [num_merge_rows+1] */
    int64_t off_merge_src;     /* int32 [merge_indptr[num_merge_rows]] */
    int64_t off_alibi;         /* float [H_qo] */
    int64_t off_part_merge;    /* fi_part_merge [partial rows] */
    int64_t bytes;             /* bytes of the region in use */
    int32_t batch_size;
    int32_t total_qo;
    int32_t num_items;
    int32_t num_workers;
    int32_t num_merge_rows;
    uint32_t upload_seq;       /* the upload's number: the kernels write it to
                                  fi_attn_args.upload_done */
    int32_t pad[4];
} fi_meta;

/* The header's room, and where the items start for a grid of W workers. */
#define FI_META_WORKERS 256
#define fi_meta_items(W) (FI_META_WORKERS + (((int64_t)(W) + 1) * 4 + 15) / 16 * 16)

/* One work item as the kernels read it (three 16-byte loads): the
 * scheduler's item (core/internal.h fi_work_item) with its request's facts,
 * so that starting an item waits on one load, not two. */
typedef struct fi_item_rec {
    int32_t req, q0, q1, k0, k1, prow; /* request, its tokens [q0, q1), keys
                                          [k0, k1), first partial row or -1 */
    int32_t qo_base;                   /* qo_indptr[req] */
    int32_t qo_len;                    /* the request's query tokens */
    int32_t kv_len;                    /* its keys */
    int32_t kv_base;                   /* kv_indptr[req]: pages (paged) or first token */
    int32_t pad[2];
} fi_item_rec;

/* A partial row's merge, so that counting a row in and merging it need no
 * further lookups: merge row r (its count word), its output token
 * (merge_out_row[r]), and its sources, evenly spaced: partial rows first +
 * k * step for k < n (n_step = n | step << 16). */
typedef struct fi_part_merge {
    int32_t r, tok, first, n_step;
} fi_part_merge;

/* One attention launch (also read by the merge kernel). Strides are in
 * bytes; *_ok flags are decided by the host. */
typedef struct fi_attn_args {
    const char *meta;          /* device fi_meta region (fixed address) */
    float *partial_o;          /* [max_partial_rows, H_qo, D_vo] */
    float *partial_lse;        /* [max_partial_rows, H_qo] */
    const char *q;             /* [tokens, H_qo, D_qk] */
    const char *k;             /* paged [pages, ...] or ragged [tokens, ...] */
    const char *v;
    char *o;                   /* [tokens, H_qo, D_vo] */
    float *lse;                /* [tokens, H_qo] or NULL */
    const unsigned char *mask; /* custom mask bits or NULL */
    int32_t *merge_count;      /* [max merge rows, H_kv] zeros between runs
                                  (persistent.cuh's fused merge) */
    int64_t q_tok, q_head, q_dim;
    int64_t o_tok, o_head, o_dim;
    int64_t lse_tok, lse_head; /* in floats */
    int64_t k_page, k_slot, k_head, k_dim; /* ragged: k_slot is the token stride */
    int64_t v_page, v_slot, v_head, v_dim;
    int32_t num_qo_heads;
    int32_t num_kv_heads;
    int32_t page_size;
    int32_t page_shift;        /* log2(page_size) when a power of two, else -1 */
    int32_t kv_vec_ok;         /* K/V rows 16-byte aligned and contiguous */
    int32_t window_left;
    int32_t tc_min_rows;       /* > 0: items with >= this many packed rows run
                                  on the tensor-core kernel (attention_tc.cuh),
                                  the CUDA-core kernel skips them; 0: none */
    int32_t q_vec_ok;          /* Q rows 16-byte aligned and contiguous */
    int32_t o_vec_ok;          /* O rows 16-byte aligned and contiguous */
    int32_t heads_x;           /* persistent.cuh: grid x = KV heads, y = workers
                                  (a worker's heads dispatched together) */
    float q_scale;             /* sm_scale * k_scale (* log2 e when no transform) */
    float softcap;             /* c of c * tanh(x / c) */
    float softcap_rcp;         /* 1 / c */
    float v_scale;
    float rope_scale;          /* positions / rope_scale (> 0) */
    float rope_theta;          /* > 0 */
    float sm_scale;            /* the hooks' c->sm_scale */
    float k_scale;             /* FP8 K scale (q_scale leaves it out when a
                                  key hook sees dequantised rows) */
    int32_t max_page;          /* paged: the last page both caches hold; a
                                  device page table's ids are clamped to it
                                  (work.cuh fi_page_id); here, the hole before
                                  vparams, so no other field moves */
    /* A user variant's per-run parameters: the bytes of its
     * fi_variant_params (kernels/variant.cuh), laid out by the host. */
    uint64_t vparams[16];
    /* A pinned host word (or NULL): one thread of each launch writes the
     * meta's upload_seq there, telling the host that copy is done
     * (src/cuda/plan.c; prelude.cuh fi_mark_upload_read). */
    uint32_t *upload_done;
} fi_attn_args;

#endif /* FI_KERNEL_ARGS_H */
