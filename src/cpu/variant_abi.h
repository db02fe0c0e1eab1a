/*
 * variant_abi.h — the call between the CPU backend and a variant kernel it
 * compiled (variant_kernel.h + a variant's hooks, in a shared object): one
 * job per fi_plan_run, work items as the scheduler made them. This header is
 * compiled into both sides (the library, and the JIT source as text), so the
 * layouts agree by construction; FI_VK_ABI guards against a stale object.
 */
#ifndef FI_CPU_VARIANT_ABI_H
#define FI_CPU_VARIANT_ABI_H

#include <stddef.h>
#include <stdint.h>

#define FI_VK_ABI 1

#define FI_VK_BM 128 /* packed query rows held at once (the CPU's largest q tile) */
#define FI_VK_BN 64  /* keys per key block */

/* A K or V cache in bytes: the row of key j of KV head h is at
 *   paged:  base + page(j) * page_stride + (j % page_size) * slot_stride + h * head_stride
 *   ragged: base + (kv_indptr[req] + j) * slot_stride + h * head_stride
 * with elements elem_stride bytes apart. */
typedef struct fi_vk_kv {
    const uint8_t *base;
    int64_t page_stride, slot_stride, head_stride, elem_stride;
} fi_vk_kv;

/* One fi_plan_run. Dtypes and head dims are compiled into the object. */
typedef struct fi_vk_job {
    const uint8_t *q;                 /* [total_q, H_qo, D_qk] */
    int64_t q_tok, q_head, q_elem;    /* byte strides */
    uint8_t *o;                       /* [total_q, H_qo, D_vo] */
    int64_t o_tok, o_head, o_elem;
    float *lse;                       /* [total_q, H_qo] or NULL; element strides */
    int64_t lse_tok, lse_head;
    fi_vk_kv k, v;
    const uint8_t *mask;              /* custom mask bits, or NULL */
    const int64_t *mask_offset;       /* [B+1] byte offset of each request's bits */
    const int32_t *qo_indptr;         /* [B+1] */
    const int32_t *kv_indptr;         /* [B+1] pages (paged) or tokens (ragged) */
    const int32_t *kv_indices;        /* paged: page ids */
    const int32_t *kv_len;            /* [B] keys per request */
    int32_t batch_size;
    int32_t paged, page_size;
    int32_t h_qo, h_kv, group;
    int32_t causal, window_left;      /* window_left -1 = none */
    float sm_scale, k_scale, v_scale; /* k/v_scale multiply FP8 KV (else 1) */
    float *partial_o;                 /* [rows, H_qo, D_vo] f32 split states */
    float *partial_lse;               /* [rows, H_qo] base 2 (softmax variants) */
    const void *params;               /* packed fi_variant_params */
} fi_vk_job;

/* A work item, as fi_work_item. */
typedef struct fi_vk_item {
    int32_t request;
    int32_t q_start, q_end;
    int32_t kv_start, kv_end;
    int32_t partial_row;              /* -1 = write-through */
} fi_vk_item;

/* The hook context, laid out as the generated fi_hook_ctx. */
typedef struct fi_vk_hook_ctx {
    int32_t request, qo_head, kv_head, q_pos, kv_pos, qo_len, kv_len, head_dim;
    float sm_scale;
} fi_vk_hook_ctx;

/* What a compiled object exports (symbol "fi_vk_entry"). */
typedef struct fi_vk_entry {
    int32_t abi;                      /* FI_VK_ABI */
    int32_t dqk, dvo;                 /* compiled head dims */
    int32_t q_dtype, kv_dtype, o_dtype;
    size_t scratch_bytes;             /* per worker, 64-byte aligned by the caller */
    void (*attend)(const fi_vk_job *job, const fi_vk_item *item, void *scratch);
    /* Output token `row` (global index) from partial rows src[0..n). */
    void (*merge_row)(const fi_vk_job *job, int32_t row, const int32_t *src, int32_t n);
} fi_vk_entry;

/* The hooks alone (symbol "fi_vk_hooks"): what the fp64 test oracle calls. */
typedef struct fi_vk_hooks {
    int32_t abi;
    int32_t use_softmax;
    void (*query_transform)(float *x, const fi_vk_hook_ctx *c, const void *params);
    void (*key_transform)(float *x, const fi_vk_hook_ctx *c, const void *params);
    void (*value_transform)(float *x, const fi_vk_hook_ctx *c, const void *params);
    float (*logits_transform)(float s, const fi_vk_hook_ctx *c, const void *params);
    int (*logits_mask)(const fi_vk_hook_ctx *c, const void *params);
    void (*output_transform)(float *o, float lse, const fi_vk_hook_ctx *c, const void *params);
} fi_vk_hooks;

#endif /* FI_CPU_VARIANT_ABI_H */
