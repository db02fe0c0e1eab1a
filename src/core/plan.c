/* plan.c — plan objects: creation with bounds (one fixed workspace), info. */
#include "core/checked.h"
#include "core/params.h"
#include "core/variant.h"
#include "core/schedule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define INVALID(...) fi_error(FI_STATUS_INVALID_ARGUMENT, __VA_ARGS__)

fi_status fi_plan_config_validate(const fi_plan_config *c, const fi_attention_params *p) {
    if (c->struct_size != sizeof *c)
        return INVALID("fi_plan_config.struct_size=%u, expected %zu: call fi_plan_config_init "
                       "first", (unsigned)c->struct_size, sizeof *c);
    if (c->max_batch_size <= 0 || c->max_total_qo <= 0 || c->max_total_kv <= 0)
        return INVALID("plan bounds max_batch_size=%d, max_total_qo=%d, max_total_kv=%d: all "
                       "must be positive", (int)c->max_batch_size, (int)c->max_total_qo,
                       (int)c->max_total_kv);
    if (c->num_workers < 0 || c->num_workers > 65536)
        return INVALID("num_workers=%d: expected 0 (backend default) to 65536",
                       (int)c->num_workers);
    if (c->fixed_split_size < 0)
        return INVALID("fixed_split_size=%d: use 0 for automatic, else a positive key count",
                       (int)c->fixed_split_size);
    if (c->device_page_table && p->kv_format != FI_KV_FORMAT_PAGED)
        return INVALID("device_page_table: a page table needs paged KV (kv_format=%d)",
                       (int)p->kv_format);
    return FI_OK;
}

/* Every host array the plan owns, carved from one allocation (in carve's
 * order, each 64-byte aligned); false when the total overflows size_t. */
static bool host_bytes(const fi_plan_config *c, const fi_schedule_limits *lim,
                       const fi_attention_params *p, size_t *bytes) {
    size_t b = (size_t)c->max_batch_size, rows;
    fi_size_sum sum = {64, false}; /* slack to align the allocation itself */
    fi_size_sum_add(&sum, b + 1, sizeof(int32_t), 64);          /* qo_indptr */
    fi_size_sum_add(&sum, b + 1, sizeof(int32_t), 64);          /* kv_indptr */
    fi_size_sum_add(&sum, b, sizeof(int32_t), 64);              /* kv_last_page_len */
    fi_size_sum_add(&sum, b, sizeof(int32_t), 64);              /* kv_len */
    fi_size_sum_add(&sum, b + 1, sizeof(int64_t), 64);          /* mask_offset */
    fi_size_sum_add(&sum, (size_t)p->num_qo_heads, sizeof(float), 64); /* alibi_slopes */
    if (!fi_mul_size((size_t)lim->max_partial_rows, (size_t)p->num_qo_heads, &rows)) return false;
    fi_size_sum_add(&sum, rows, (size_t)p->head_dim_vo * sizeof(float), 64); /* partial O */
    fi_size_sum_add(&sum, rows, sizeof(float), 64);             /* partial LSE */
    *bytes = sum.bytes;
    return !sum.overflow;
}

static void *carve(char **cursor, size_t bytes) {
    uintptr_t p = ((uintptr_t)*cursor + 63) & ~(uintptr_t)63;
    *cursor = (char *)(p + bytes);
    return (void *)p;
}

int32_t fi_plan_split_rows(int32_t num_workers, const fi_attention_params *p,
                           int64_t tokens) {
    int64_t n = num_workers > 0 ? num_workers : 1;
    int64_t k = 2 * n / p->num_kv_heads;
    if (k < 1) k = 1;
    if (k > n) k = n;
    int64_t rows = k * tokens;
    int64_t cap = ((int64_t)64 << 20) / ((int64_t)p->num_qo_heads * (p->head_dim_vo + 1) * 4);
    if (rows > cap) rows = cap;
    return (int32_t)(rows < INT32_MAX / 2 ? rows : INT32_MAX / 2);
}

fi_status fi_plan_create(fi_context *ctx, const fi_attention_params *params,
                         const fi_plan_config *config, fi_plan **out) {
    return fi_plan_create_budget(ctx, params, config, 0, out);
}

fi_status fi_plan_create_budget(fi_context *ctx, const fi_attention_params *params,
                                const fi_plan_config *config, int32_t min_partial_rows,
                                fi_plan **out) {
    if (!out) return INVALID("fi_plan_create: out is NULL");
    *out = NULL;
    fi_status st = fi_context_check(ctx, "fi_plan_create");
    if (st) return st;
    if ((st = fi_params_validate(params))) return st;
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    if (config) cfg = *config;
    if ((st = fi_plan_config_validate(&cfg, params))) return st;

    fi_plan *plan = calloc(1, sizeof *plan);
    if (!plan) return fi_error(FI_STATUS_OUT_OF_MEMORY, "fi_plan_create: out of memory");
    plan->magic = FI_MAGIC_PLAN;
    plan->ctx = ctx;
    fi_context_retain(ctx); /* released by fi_plan_destroy, also on the errors below */
    plan->params = *params;
    fi_variant_retain(params->variant); /* the variant lives as long as its plans */
    plan->config = cfg;
    plan->group_size = params->num_qo_heads / params->num_kv_heads;
    if (plan->params.sm_scale == 0.0f)
        plan->params.sm_scale = 1.0f / sqrtf((float)params->head_dim_qk);
    if (cfg.num_workers == 0) plan->config.num_workers = ctx->backend->num_workers(ctx);
    plan->params.alibi_slopes = NULL; /* the caller's array is not kept */

    fi_schedule_limits lim;
    if (cfg.fixed_split_size > 0) {
        int64_t max_kv_len = params->kv_format == FI_KV_FORMAT_PAGED
                                 ? (int64_t)cfg.max_total_kv * params->page_size
                                 : cfg.max_total_kv;
        fi_schedule_limits_for_fixed_split(&lim, cfg.max_batch_size, cfg.max_total_qo,
                                           max_kv_len, plan->config.num_workers,
                                           cfg.fixed_split_size);
    } else {
        fi_schedule_limits_for(&lim, cfg.max_batch_size, cfg.max_total_qo,
                               plan->config.num_workers);
        /* Room for one widest tile's tokens per item in flight, so that a
         * few prefill tiles split about as finely as decodes do (without it
         * a batch of a few prefill tiles on a GPU could split only some of
         * them: docs/SCHEDULER.md) */
        const fi_backend *be = ctx->backend;
        int64_t tile = be->policy.q_tiles[be->policy.num_q_tiles - 1] / plan->group_size;
        if (tile < 1) tile = 1;
        if (tile > cfg.max_total_qo) tile = cfg.max_total_qo;
        int32_t want = fi_plan_split_rows(plan->config.num_workers, params, tile);
        if (want < min_partial_rows) want = min_partial_rows;
        if (lim.max_partial_rows < want) lim.max_partial_rows = want;
    }
    size_t bytes = 0;
    char *mem = NULL;
    if (!host_bytes(&cfg, &lim, params, &bytes))
        st = INVALID("plan workspace for max_batch_size=%d, %d partial-state rows x "
                     "num_qo_heads=%d x head_dim_vo=%d overflows the address range",
                     (int)cfg.max_batch_size, (int)lim.max_partial_rows,
                     (int)params->num_qo_heads, (int)params->head_dim_vo);
    else if (!(mem = calloc(1, bytes)))
        st = fi_error(FI_STATUS_OUT_OF_MEMORY, "plan workspace of %zu bytes: out of memory",
                      bytes);
    else
        st = fi_schedule_init(&plan->schedule, &lim);
    if (st) {
        free(mem);
        fi_plan_destroy(plan);
        return st;
    }
    plan->host_memory = mem;
    size_t b = (size_t)cfg.max_batch_size;
    plan->qo_indptr = carve(&mem, (b + 1) * sizeof(int32_t));
    plan->kv_indptr = carve(&mem, (b + 1) * sizeof(int32_t));
    plan->kv_last_page_len = carve(&mem, b * sizeof(int32_t));
    plan->kv_len = carve(&mem, b * sizeof(int32_t));
    plan->mask_offset = carve(&mem, (b + 1) * sizeof(int64_t));
    plan->alibi_slopes = carve(&mem, (size_t)params->num_qo_heads * sizeof(float));
    size_t rows = (size_t)lim.max_partial_rows * (size_t)params->num_qo_heads;
    plan->partial_o = carve(&mem, rows * (size_t)params->head_dim_vo * sizeof(float));
    plan->partial_lse = carve(&mem, rows * sizeof(float));
    for (int32_t h = 0; h < params->num_qo_heads; h++)
        plan->alibi_slopes[h] = params->alibi_slopes ? params->alibi_slopes[h]
                                                     : fi_alibi_slope(h, params->num_qo_heads);
    plan->workspace_bytes = bytes + fi_schedule_bytes(&lim);
    const fi_backend *be = ctx->backend;
    plan->policy = be->policy;

    if (ctx->backend->plan_init && (st = ctx->backend->plan_init(plan))) {
        fi_plan_destroy(plan);
        return st;
    }
    *out = plan;
    return FI_OK;
}

fi_status fi_backend_alloc(fi_context *ctx, size_t bytes, void **out) {
    *out = NULL;
    return ctx->backend->mem_alloc(ctx, bytes ? bytes : 64, out);
}

void fi_backend_free(fi_context *ctx, void *ptr) {
    if (ptr) ctx->backend->mem_free(ctx, ptr);
}

fi_status fi_plan_copy_in(fi_plan *plan, void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return FI_OK;
    return plan->ctx->backend->plan_copy_in(plan, dst, src, bytes);
}

/* A plan another thread is inside is left alone (and reported): freeing it
 * under that call would be worse than the leak. */
void fi_plan_destroy(fi_plan *plan) {
    if (!plan) return;
    if (FI_HANDLE_ENTER(plan, FI_MAGIC_PLAN, "fi_plan_destroy", "plan")) return;
    fi_context *ctx = plan->ctx;
    if (plan->backend_state && ctx->backend->plan_fini) ctx->backend->plan_fini(plan);
    fi_schedule_free(&plan->schedule);
    free(plan->host_memory);
    fi_handle_retire(&plan->magic);
    fi_variant_release(plan->params.variant);
    free(plan);
    fi_context_release(ctx);
}

size_t fi_plan_workspace_size(const fi_plan *plan) {
    if (fi_handle_check(plan, FI_MAGIC_PLAN, "fi_plan_workspace_size", "plan")) return 0;
    return plan->workspace_bytes;
}

void fi_plan_info_init(fi_plan_info *info) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
}

fi_status fi_plan_get_info(const fi_plan *plan, fi_plan_info *info) {
    fi_status st = fi_handle_check(plan, FI_MAGIC_PLAN, "fi_plan_get_info", "plan");
    if (st) return st;
    if (!info) return INVALID("fi_plan_get_info: info is NULL");
    if (info->struct_size != sizeof *info)
        return INVALID("fi_plan_info.struct_size=%u, expected %zu", (unsigned)info->struct_size,
                       sizeof *info);
    if (!plan->planned)
        return fi_error(FI_STATUS_NOT_PLANNED, "fi_plan_get_info: no batch planned yet");
    const fi_schedule *s = &plan->schedule;
    memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
    info->batch_size = plan->batch_size;
    info->num_workers = s->num_workers;
    info->q_tile = s->q_tile_rows;
    info->kv_chunk = s->kv_chunk;
    info->num_items = s->num_items;
    for (int32_t i = 0; i < s->num_items; i++)
        info->num_split_items += s->items[i].partial_row >= 0;
    info->num_merge_rows = s->num_merge_rows;
    info->max_worker_cost = s->max_worker_cost;
    info->total_cost = s->total_cost;
    return FI_OK;
}

fi_status fi_plan_get_worker_loads(const fi_plan *plan, int32_t capacity, int32_t *num_items,
                                   int32_t *num_split_items, double *cost,
                                   int32_t *num_workers) {
    fi_status st = fi_handle_check(plan, FI_MAGIC_PLAN, "fi_plan_get_worker_loads", "plan");
    if (st) return st;
    if (capacity < 0)
        return INVALID("fi_plan_get_worker_loads: capacity=%d must not be negative",
                       (int)capacity);
    if (!plan->planned)
        return fi_error(FI_STATUS_NOT_PLANNED, "fi_plan_get_worker_loads: no batch planned yet");
    const fi_schedule *s = &plan->schedule;
    if (num_workers) *num_workers = s->num_workers;
    int32_t n = capacity < s->num_workers ? capacity : s->num_workers;
    for (int32_t w = 0; w < n; w++) {
        int32_t first = s->worker_indptr[w], end = s->worker_indptr[w + 1], split = 0;
        for (int32_t i = first; i < end; i++) split += s->items[i].partial_row >= 0;
        if (num_items) num_items[w] = end - first;
        if (num_split_items) num_split_items[w] = split;
        if (cost) cost[w] = s->worker_cost[w];
    }
    return FI_OK;
}
