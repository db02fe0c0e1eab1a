/*
 * work.cuh — the plan's metadata as the attention kernels read it: the
 * arrays of the fi_meta region (kernels/fi_args.h) and one work item with
 * the facts of its request, for one KV head.
 */
#ifndef FI_WORK_CUH
#define FI_WORK_CUH

#include "prelude.cuh"

/* The arrays of the metadata region, found through its header. */
struct fi_view {
    const fi_meta *meta;
    const int32_t *qo_indptr, *kv_indptr, *kv_indices, *kv_len;
    const int64_t *mask_offset;
    const int32_t *items, *worker_indptr;
    const int32_t *merge_out_row, *merge_indptr, *merge_src, *part_merge;
    const float *alibi;
};

FI_DEV fi_view fi_view_of(const fi_attn_args &a) {
    fi_view v;
    v.meta = (const fi_meta *)a.meta;
    v.qo_indptr = (const int32_t *)(a.meta + v.meta->off_qo_indptr);
    v.kv_indptr = (const int32_t *)(a.meta + v.meta->off_kv_indptr);
    v.kv_indices = (const int32_t *)(a.meta + v.meta->off_kv_indices);
    v.kv_len = (const int32_t *)(a.meta + v.meta->off_kv_len);
    v.mask_offset = (const int64_t *)(a.meta + v.meta->off_mask_offset);
    v.items = (const int32_t *)(a.meta + v.meta->off_items);
    v.worker_indptr = (const int32_t *)(a.meta + v.meta->off_worker_indptr);
    v.merge_out_row = (const int32_t *)(a.meta + v.meta->off_merge_out_row);
    v.merge_indptr = (const int32_t *)(a.meta + v.meta->off_merge_indptr);
    v.merge_src = (const int32_t *)(a.meta + v.meta->off_merge_src);
    v.part_merge = (const int32_t *)(a.meta + v.meta->off_part_merge);
    v.alibi = (const float *)(a.meta + v.meta->off_alibi);
    return v;
}

/* What stays fixed while one (item, KV head) runs. */
struct fi_item {
    int req, q0, rows, k0, k1, prow;
    int qo_len, kv_len;
    int64_t qo_base;   /* qo_indptr[req] */
    int64_t kv_base;   /* paged: kv_indptr[req] (pages); ragged: first token */
    int64_t mask_bit0; /* element mask: first bit of the request's segment
                          (set by the path: fi_v::mask_bit0) */
    int hkv;
};

/* Packed rows (tokens x group) of item n: which kernel path takes it. */
FI_DEV int fi_item_rows(const fi_view &v, int n, int group) {
    const int32_t *wi = v.items + 6 * (int64_t)n; /* fi_work_item */
    return (wi[2] - wi[1]) * group;
}

FI_DEV fi_item fi_item_load(const fi_view &v, int n, int hkv, int group) {
    const int32_t *wi = v.items + 6 * (int64_t)n;
    fi_item it;
    it.req = wi[0];
    it.q0 = wi[1];
    it.rows = (wi[2] - wi[1]) * group;
    it.k0 = wi[3];
    it.k1 = wi[4];
    it.prow = wi[5];
    it.qo_base = v.qo_indptr[it.req];
    it.qo_len = v.qo_indptr[it.req + 1] - v.qo_indptr[it.req];
    it.kv_len = v.kv_len[it.req];
    it.kv_base = v.kv_indptr[it.req];
    it.mask_bit0 = 0;
    it.hkv = hkv;
    return it;
}

#endif /* FI_WORK_CUH */
