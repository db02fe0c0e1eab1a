/*
 * work.cuh — the plan's metadata as the attention kernels read it: the
 * arrays of the fi_meta region (kernels/fi_args.h) and one work item with
 * the facts of its request, for one KV head.
 */
#ifndef FI_WORK_CUH
#define FI_WORK_CUH

#include "prelude.cuh"

/* The arrays of the metadata region the attention paths read, found
 * through its header (the items and worker_indptr sit at fixed offsets:
 * fi_worker_range, fi_items; the items carry their requests' facts; the
 * merge reads its map through the header itself, merge.cuh). */
struct fi_view {
    const fi_meta *meta;
    const int32_t *kv_indices;
    const int64_t *mask_offset;
    const fi_part_merge *part_merge;
    const float *alibi;
};

FI_DEV fi_view fi_view_of(const fi_attn_args &a) {
    fi_view v;
    v.meta = (const fi_meta *)a.meta;
    v.kv_indices = (const int32_t *)(a.meta + v.meta->off_kv_indices);
    v.mask_offset = (const int64_t *)(a.meta + v.meta->off_mask_offset);
    v.part_merge = (const fi_part_merge *)(a.meta + v.meta->off_part_merge);
    v.alibi = (const float *)(a.meta + v.meta->off_alibi);
    return v;
}

/* A page id as the kernels use it. A table the host checked (in host
 * memory) is in range: the id as is. A device page table
 * (fi_plan_config.device_page_table; kernels built with FI_PAGED = 2) is
 * read by no one before the kernels, so each id is clamped to [0,
 * a.max_page], the pages both caches hold: a bad id reads some page of the
 * cache, never memory outside it. Only those kernels pay for the clamp. */
template <bool CLAMP>
FI_DEV int32_t fi_page_id(const fi_attn_args &a, int32_t id) {
    if constexpr (!CLAMP) return id;
    const uint32_t u = (uint32_t)id, last = (uint32_t)a.max_page;
    return (int32_t)(u < last ? u : last);
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

/* Byte offsets of key j's K and V rows of item `it` (its KV head
 * included): through the page table (PAGED; ids clamped where the table is
 * the device's, DEVICE_TABLE) or the request's first token (ragged). */
template <bool PAGED, bool DEVICE_TABLE>
FI_DEV void fi_kv_offsets(const fi_attn_args &a, const int32_t *kv_indices, const fi_item &it,
                          int j, int64_t *ko, int64_t *vo) {
    int64_t page = 0, slot;
    if constexpr (PAGED) {
        int pi, s;
        if (a.page_shift >= 0) {
            pi = j >> a.page_shift;
            s = j & (a.page_size - 1);
        } else {
            pi = j / a.page_size;
            s = j - pi * a.page_size;
        }
        page = fi_page_id<DEVICE_TABLE>(a, kv_indices[it.kv_base + pi]);
        slot = s;
    } else {
        slot = it.kv_base + j;
    }
    *ko = page * a.k_page + slot * a.k_slot + (int64_t)it.hkv * a.k_head;
    *vo = page * a.v_page + slot * a.v_slot + (int64_t)it.hkv * a.v_head;
}

/* Worker w's items [ib, ie) in a grid of W workers: read without the
 * header (fi_args.h), so a CTA's first item waits on two loads, not three. */
FI_DEV void fi_worker_range(const fi_attn_args &a, int W, int w, int &ib, int &ie) {
    const int32_t *wi = (const int32_t *)(a.meta + FI_META_WORKERS);
    ib = __ldg(wi + w);
    ie = __ldg(wi + w + 1);
}
FI_DEV const fi_item_rec *fi_items(const fi_attn_args &a, int W) {
    return (const fi_item_rec *)(a.meta + fi_meta_items(W));
}

/* Packed rows (tokens x group) of item n: which kernel path takes it. */
FI_DEV int fi_item_rows(const fi_item_rec *items, int n, int group) {
    const int4 w = __ldg(reinterpret_cast<const int4 *>(items + n));
    return (w.z - w.y) * group;
}

/* Whether the separate path's tensor-core kernel (attention_tc.cuh,
 * attention_wg.cuh) runs item n, else the CUDA-core kernel does: items of
 * at least a.tc_min_rows packed rows, and the other items of requests that
 * wide: a prefill's last few tokens, a long key span the CUDA cores would
 * run alone after the rest of the batch (src/cuda/plan.c pack counts the
 * same). */
FI_DEV bool fi_item_on_tc(const fi_attn_args &a, const fi_item_rec *items, int n, int group) {
    if (a.tc_min_rows <= 0) return false;
    return fi_item_rows(items, n, group) >= a.tc_min_rows ||
           __ldg(&items[n].qo_len) * group >= a.tc_min_rows;
}

FI_DEV fi_item fi_item_load(const fi_item_rec *items, int n, int hkv, int group) {
    const int4 *p = reinterpret_cast<const int4 *>(items + n); /* 48-byte records */
    const int4 w0 = __ldg(p), w1 = __ldg(p + 1), w2 = __ldg(p + 2);
    fi_item it;
    it.req = w0.x;
    it.q0 = w0.y;
    it.rows = (w0.z - w0.y) * group;
    it.k0 = w0.w;
    it.k1 = w1.x;
    it.prow = w1.y;
    it.qo_base = w1.z;
    it.qo_len = w1.w;
    it.kv_len = w2.x;
    it.kv_base = w2.y;
    it.mask_bit0 = 0;
    it.hkv = hkv;
    return it;
}

#endif /* FI_WORK_CUH */
