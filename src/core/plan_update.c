/* plan_update.c — fi_plan_update: validate and copy a batch, then schedule it.
 * Nothing is allocated: every array lives in the plan's fixed workspace.
 * The page table is referenced, not copied or read (as FlashInfer's plan):
 * it is the one O(pages) array and would dominate the plan's cost. Its page
 * ids are checked by fi_plan_run before any kernel reads memory (on the CPU
 * at every run; plan_run.c). */
#include "core/schedule.h"

#include <string.h>

#define INVALID(...) fi_error(FI_STATUS_INVALID_ARGUMENT, __VA_ARGS__)
#define OVER(...) fi_error(FI_STATUS_BOUND_EXCEEDED, __VA_ARGS__)

/* Paged lengths: last_page_len consistent, bounds; fills kv_len. The page
 * table itself is only referenced (see the top of the file). */
static fi_status check_paged(fi_plan *plan, const fi_batch *b) {
    int32_t n = b->batch_size, ps = plan->params.page_size;
    int32_t nnz = b->kv_indptr[n];
    if (nnz > plan->config.max_total_kv)
        return OVER("kv_indptr[%d]=%d pages > plan bound max_total_kv=%d", (int)n, (int)nnz,
                    (int)plan->config.max_total_kv);
    if (nnz > 0 && !b->kv_indices) return INVALID("kv_indices is NULL");
    if (n > 0 && !b->kv_last_page_len) return INVALID("kv_last_page_len is NULL");
    for (int32_t i = 0; i < n; i++) {
        int32_t pages = b->kv_indptr[i + 1] - b->kv_indptr[i], last = b->kv_last_page_len[i];
        if (pages > 0 && (last < 1 || last > ps))
            return INVALID("kv_last_page_len[%d]=%d: must be in [1, page_size=%d] for a request "
                           "with %d pages", (int)i, (int)last, (int)ps, (int)pages);
        if (pages == 0 && (last < 0 || last > ps)) /* ignored, as many engines pass page_size */
            return INVALID("kv_last_page_len[%d]=%d: must be in [0, page_size=%d]", (int)i,
                           (int)last, (int)ps);
        int64_t len = pages ? (int64_t)ps * (pages - 1) + last : 0;
        if (len > INT32_MAX)
            return INVALID("request %d has %lld keys: at most %d are supported", (int)i,
                           (long long)len, (int)INT32_MAX);
        plan->kv_len[i] = (int32_t)len;
    }
    return FI_OK;
}

static fi_status check_ragged(fi_plan *plan, const fi_batch *b) {
    int32_t n = b->batch_size;
    if (b->kv_indptr[n] > plan->config.max_total_kv)
        return OVER("kv_indptr[%d]=%d tokens > plan bound max_total_kv=%d", (int)n,
                    (int)b->kv_indptr[n], (int)plan->config.max_total_kv);
    for (int32_t i = 0; i < n; i++) plan->kv_len[i] = b->kv_indptr[i + 1] - b->kv_indptr[i];
    return FI_OK;
}

/* Byte offsets of each request's packed [qo_len, kv_len] bit matrix. */
static fi_status custom_mask_offsets(fi_plan *plan, const fi_batch *b) {
    int32_t n = b->batch_size;
    plan->mask_offset[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t bits = (int64_t)(b->qo_indptr[i + 1] - b->qo_indptr[i]) * plan->kv_len[i];
        int64_t need = (bits + 7) / 8;
        if (!b->mask_indptr) {
            plan->mask_offset[i + 1] = plan->mask_offset[i] + need;
            continue;
        }
        int64_t have = (int64_t)b->mask_indptr[i + 1] - b->mask_indptr[i];
        if (have < need)
            return INVALID("mask_indptr: request %d has %lld mask bytes, needs %lld for "
                           "qo_len x kv_len bits", (int)i, (long long)have, (long long)need);
        plan->mask_offset[i] = b->mask_indptr[i];
        plan->mask_offset[i + 1] = b->mask_indptr[i + 1];
    }
    plan->mask_bytes = plan->mask_offset[n];
    return FI_OK;
}

/* The requests' lengths when every one is valid (indptrs non-decreasing;
 * paged: last_page_len in range, the length within INT32_MAX, checked as
 * at most max_pages pages), in one branch-free pass that vectorises:
 * kv_len filled and its maximum returned, or -1 when any request breaks a
 * rule. 32-bit lanes: a length that would need more fails here, and
 * check_batch decides it exactly. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
static int32_t lengths_pass(int32_t n, const int32_t *restrict qo, const int32_t *restrict kv,
                            const int32_t *restrict last, int32_t page_size, int32_t max_pages,
                            int32_t *restrict kv_len) {
    uint32_t bad = 0;
    int32_t max_len = 0;
    for (int32_t i = 0; i < n; i++) {
        /* unsigned: a difference of a faulty indptr wraps instead of overflowing */
        const int32_t dk = (int32_t)((uint32_t)kv[i + 1] - (uint32_t)kv[i]);
        int32_t len = dk;
        bad |= (uint32_t)(qo[i + 1] < qo[i]) | (uint32_t)(kv[i + 1] < kv[i]);
        if (last) {
            const int32_t l = last[i];
            len = dk > 0 ? (int32_t)((uint32_t)page_size * (uint32_t)(dk - 1) + (uint32_t)l) : 0;
            bad |= (uint32_t)(dk > max_pages) | (uint32_t)(l < (dk > 0)) |
                   (uint32_t)(l > page_size);
        }
        kv_len[i] = len;
        max_len = len > max_len ? len : max_len;
    }
    return bad ? -1 : max_len;
}

/* The checks of check_batch below, for a batch without a custom mask, in
 * one pass (lengths_pass): kv_len filled and its largest value returned, or
 * -1 when the batch breaks any rule (check_batch then finds the first
 * fault and says what it is). check_batch takes ~6 passes over the batch;
 * this one, copies included, measured several times faster
 * (docs/SCHEDULER.md). */
static int32_t valid_lengths(fi_plan *plan, const fi_batch *b) {
    const fi_plan_config *c = &plan->config;
    const int32_t n = b->batch_size, *qo = b->qo_indptr, *kv = b->kv_indptr;
    const bool paged = plan->params.kv_format == FI_KV_FORMAT_PAGED;
    if (n < 0 || n > c->max_batch_size || !qo || !kv || qo[0] != 0 || kv[0] != 0 ||
        qo[n] > c->max_total_qo || kv[n] > c->max_total_kv ||
        plan->params.mask_mode == FI_MASK_CUSTOM)
        return -1;
    if (!paged) return lengths_pass(n, qo, kv, NULL, 1, 0, plan->kv_len);
    if ((kv[n] > 0 && !b->kv_indices) || (n > 0 && !b->kv_last_page_len)) return -1;
    /* at most max_pages pages: ps x (pages - 1) + last <= INT32_MAX */
    const int32_t ps = plan->params.page_size, max_pages = (INT32_MAX - ps) / ps + 1;
    return lengths_pass(n, qo, kv, b->kv_last_page_len, ps, max_pages, plan->kv_len);
}

/* Every rule a batch must keep, each fault named; fills kv_len and its
 * largest value. */
static fi_status check_batch(fi_plan *plan, const fi_batch *b, int32_t *max_len) {
    const fi_plan_config *c = &plan->config;
    int32_t n = b->batch_size;
    if (n < 0) return INVALID("batch_size=%d is negative", (int)n);
    if (n > c->max_batch_size)
        return OVER("batch_size=%d > plan bound max_batch_size=%d", (int)n, (int)c->max_batch_size);
    fi_status st = fi_check_indptr(b->qo_indptr, n, "qo_indptr", -1);
    if (!st) st = fi_check_indptr(b->kv_indptr, n, "kv_indptr", -1);
    if (!st && plan->params.mask_mode == FI_MASK_CUSTOM && b->mask_indptr)
        st = fi_check_indptr(b->mask_indptr, n, "mask_indptr", -1);
    if (st) return st;
    if (b->qo_indptr[n] > c->max_total_qo)
        return OVER("qo_indptr[%d]=%d query tokens > plan bound max_total_qo=%d", (int)n,
                    (int)b->qo_indptr[n], (int)c->max_total_qo);
    const bool paged = plan->params.kv_format == FI_KV_FORMAT_PAGED;
    if ((st = paged ? check_paged(plan, b) : check_ragged(plan, b))) return st;
    *max_len = 0;
    for (int32_t i = 0; i < n; i++)
        if (plan->kv_len[i] > *max_len) *max_len = plan->kv_len[i];
    return FI_OK;
}

/* The batch checked (the one-pass form where it holds, else every check
 * with its message) and copied into the plan. */
static fi_status validate_and_copy(fi_plan *plan, const fi_batch *b) {
    int32_t n = b->batch_size, max_len = valid_lengths(plan, b);
    fi_status st;
    if (max_len < 0 && (st = check_batch(plan, b, &max_len))) return st;
    if (plan->params.kv_format == FI_KV_FORMAT_PAGED) {
        plan->kv_indices = b->kv_indices;
        plan->num_pages = b->kv_indptr[n];
        plan->pages_checked = false; /* fi_plan_run scans the page ids */
        if (n > 0) memcpy(plan->kv_last_page_len, b->kv_last_page_len, (size_t)n * sizeof(int32_t));
    } else {
        plan->num_pages = 0;
        plan->pages_checked = true;
    }
    plan->mask_bytes = 0;
    if (plan->params.mask_mode == FI_MASK_CUSTOM && (st = custom_mask_offsets(plan, b))) return st;
    memcpy(plan->qo_indptr, b->qo_indptr, (size_t)(n + 1) * sizeof(int32_t));
    memcpy(plan->kv_indptr, b->kv_indptr, (size_t)(n + 1) * sizeof(int32_t));
    plan->batch_size = n;
    plan->total_qo = b->qo_indptr[n];
    plan->max_kv_len = max_len;
    return FI_OK;
}

static fi_status plan_update(fi_plan *plan, const fi_batch *batch) {
    fi_status st = fi_context_check(plan->ctx, "fi_plan_update");
    if (st) return st;
    if (!batch) return INVALID("fi_plan_update: batch is NULL");
    plan->planned = false; /* a failed update leaves nothing runnable */
    if ((st = validate_and_copy(plan, batch))) return st;

    const fi_backend *be = plan->ctx->backend;
    fi_schedule_input in = {
        .batch_size = plan->batch_size,
        .qo_indptr = plan->qo_indptr,
        .kv_len = plan->kv_len,
        .group_size = plan->group_size,
        .num_kv_heads = plan->params.num_kv_heads,
        .causal = plan->params.mask_mode == FI_MASK_CAUSAL,
        .window_left = plan->params.window_left,
        .num_workers = plan->config.num_workers,
        .policy = plan->policy,
        .disable_split_kv = plan->config.disable_split_kv != 0,
        .fixed_split_size = plan->config.fixed_split_size,
    };
    if ((st = fi_schedule_build(&plan->schedule, &in))) return st;
    if (be->plan_upload && (st = be->plan_upload(plan))) return st;
    plan->planned = true;
    return FI_OK;
}

fi_status fi_plan_update(fi_plan *plan, const fi_batch *batch) {
    fi_status st = FI_HANDLE_ENTER(plan, FI_MAGIC_PLAN, "fi_plan_update", "plan");
    if (st) return st;
    st = plan_update(plan, batch);
    fi_handle_leave(&plan->busy);
    return st;
}
