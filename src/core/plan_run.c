/* plan_run.c — fi_plan_run: check the tensors against the planned batch, then
 * hand them to the backend. Shapes may be larger than the batch needs (padded
 * buffers, as CUDA graphs use), never smaller. */
#include "core/internal.h"
#include "core/variant.h"

#define INVALID(...) fi_error(FI_STATUS_INVALID_ARGUMENT, __VA_ARGS__)

/* A tensor's leading extent (tokens or pages) must cover `need`. */
static fi_status check_rows(const fi_tensor *t, const char *name, int32_t dim, int64_t need,
                            const char *what) {
    if (t->shape[dim] < need)
        return INVALID("%s.shape[%d]=%lld is too small: the batch has %lld %s", name, (int)dim,
                       (long long)t->shape[dim], (long long)need, what);
    return FI_OK;
}

static fi_status check_kv(const fi_plan *plan, const fi_tensor *t, const char *name,
                          int32_t head_dim) {
    const fi_attention_params *p = &plan->params;
    bool nhd = p->kv_layout == FI_KV_LAYOUT_NHD;
    fi_status st;
    if (p->kv_format == FI_KV_FORMAT_PAGED) {
        int64_t shape[4] = {-1, nhd ? p->page_size : p->num_kv_heads,
                            nhd ? p->num_kv_heads : p->page_size, head_dim};
        if ((st = fi_check_tensor(t, name, p->kv_dtype, 4, shape))) return st;
        if (plan->max_page_index >= t->shape[0] && plan->ctx->backend->host_memory)
            for (int32_t j = 0; j < plan->num_pages; j++)
                if (plan->kv_indices[j] >= t->shape[0])
                    return INVALID("kv_indices[%d]=%d: page ids must be < %s.shape[0]=%lld, "
                                   "the pages the cache holds (the table needs %lld)", (int)j,
                                   (int)plan->kv_indices[j], name, (long long)t->shape[0],
                                   (long long)plan->max_page_index + 1);
        return check_rows(t, name, 0, (int64_t)plan->max_page_index + 1,
                          "as its largest page id + 1");
    }
    int64_t shape[3] = {nhd ? -1 : p->num_kv_heads, nhd ? p->num_kv_heads : -1, head_dim};
    if ((st = fi_check_tensor(t, name, p->kv_dtype, 3, shape))) return st;
    return check_rows(t, name, nhd ? 0 : 1, plan->kv_indptr[plan->batch_size], "KV tokens");
}

/* The page ids: all >= 0, and the largest, which the K/V tensors must
 * cover. The CPU's kernels read the caller's table itself (host or
 * "device" table alike), which may be rewritten between runs: checked at
 * every run, one vectorised pass, the offending entry searched for only
 * when there is one. A backend that copied the table at the update
 * (CUDA) marks it checked there. */
static fi_status check_pages(fi_plan *plan) {
    if (plan->ctx->backend->host_memory && plan->num_pages > 0) plan->pages_checked = false;
    if (plan->pages_checked) return FI_OK;
    int32_t lo, hi;
    fi_int32_range(plan->kv_indices, plan->num_pages, &lo, &hi);
    if (lo < 0)
        for (int32_t j = 0; j < plan->num_pages; j++)
            if (plan->kv_indices[j] < 0)
                return INVALID("kv_indices[%d]=%d: page ids must be >= 0", (int)j,
                               (int)plan->kv_indices[j]);
    plan->max_page_index = hi;
    plan->pages_checked = true;
    return FI_OK;
}

static fi_status check_args(const fi_plan *plan, const fi_run_args *a) {
    const fi_attention_params *p = &plan->params;
    int64_t q_shape[3] = {-1, p->num_qo_heads, p->head_dim_qk};
    int64_t o_shape[3] = {-1, p->num_qo_heads, p->head_dim_vo};
    fi_status st;
    if ((st = fi_check_tensor(&a->q, "q", p->q_dtype, 3, q_shape))) return st;
    if ((st = check_rows(&a->q, "q", 0, plan->total_qo, "query tokens"))) return st;
    if ((st = fi_check_tensor(&a->o, "o", p->o_dtype, 3, o_shape))) return st;
    if ((st = check_rows(&a->o, "o", 0, plan->total_qo, "query tokens"))) return st;
    if (a->lse.data) {
        int64_t lse_shape[2] = {-1, p->num_qo_heads};
        if ((st = fi_check_tensor(&a->lse, "lse", FI_DTYPE_F32, 2, lse_shape))) return st;
        if ((st = check_rows(&a->lse, "lse", 0, plan->total_qo, "query tokens"))) return st;
    }
    if ((st = check_kv(plan, &a->k, "k", p->head_dim_qk))) return st;
    if ((st = check_kv(plan, &a->v, "v", p->head_dim_vo))) return st;
    if (p->mask_mode == FI_MASK_CUSTOM) {
        if ((st = fi_check_tensor(&a->custom_mask, "custom_mask", FI_DTYPE_U8, 1, NULL)))
            return st;
        if ((st = check_rows(&a->custom_mask, "custom_mask", 0, plan->mask_bytes, "mask bytes")))
            return st;
    }
    if (p->variant && (st = fi_variant_check_args(p->variant, a->variant_args))) return st;
    return plan->owner_checks_outputs ? FI_OK : fi_check_run_outputs(a);
}

fi_status fi_check_run_outputs(const fi_run_args *a) {
    const fi_tensor *outs[] = {&a->o, &a->lse}, *ins[] = {&a->q, &a->k, &a->v, &a->custom_mask};
    static const char *const out_names[] = {"o", "lse"};
    static const char *const in_names[] = {"q", "k", "v", "custom_mask"};
    return fi_check_apart(outs, out_names, 2, ins, in_names, 4);
}

static fi_status plan_run(fi_plan *plan, const fi_run_args *args) {
    fi_status st = fi_context_check(plan->ctx, "fi_plan_run");
    if (st) return st;
    if (!args) return INVALID("fi_plan_run: args is NULL");
    if (!plan->planned)
        return fi_error(FI_STATUS_NOT_PLANNED,
                        "fi_plan_run: no batch planned; call fi_plan_update first");
    if ((st = check_pages(plan)) || (st = check_args(plan, args))) return st;
    return plan->ctx->backend->run(plan, args);
}

fi_status fi_plan_run(fi_plan *plan, const fi_run_args *args) {
    fi_status st = FI_HANDLE_ENTER(plan, FI_MAGIC_PLAN, "fi_plan_run", "plan");
    if (st) return st;
    st = plan_run(plan, args);
    fi_handle_leave(&plan->busy);
    return st;
}
