/* plan.c — plan objects: creation with bounds (one fixed workspace), info. */
#include "core/params.h"
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

/* Every host array the plan owns, carved from one allocation. */
static size_t host_bytes(const fi_plan_config *c, const fi_schedule_limits *lim,
                         const fi_attention_params *p) {
    size_t b = (size_t)c->max_batch_size;
    size_t bytes = 0;
    bytes += 2 * (b + 1) * sizeof(int32_t);           /* qo_indptr, kv_indptr */
    bytes += 2 * b * sizeof(int32_t);                  /* kv_last_page_len, kv_len */
    bytes += (b + 1) * sizeof(int64_t);                /* mask_offset */
    bytes += (size_t)p->num_qo_heads * sizeof(float);  /* alibi_slopes */
    size_t rows = (size_t)lim->max_partial_rows * (size_t)p->num_qo_heads;
    bytes += rows * ((size_t)p->head_dim_vo + 1) * sizeof(float); /* partial O, LSE */
    return bytes + 8 * 64;                             /* alignment slack */
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
    if (!ctx) return INVALID("fi_plan_create: context is NULL");
    fi_status st = fi_params_validate(params);
    if (st) return st;
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    if (config) cfg = *config;
    if ((st = fi_plan_config_validate(&cfg, params))) return st;

    fi_plan *plan = calloc(1, sizeof *plan);
    if (!plan) return fi_error(FI_STATUS_OUT_OF_MEMORY, "fi_plan_create: out of memory");
    plan->ctx = ctx;
    plan->params = *params;
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
    size_t bytes = host_bytes(&cfg, &lim, params);
    char *mem = calloc(1, bytes);
    st = mem ? fi_schedule_init(&plan->schedule, &lim)
             : fi_error(FI_STATUS_OUT_OF_MEMORY, "plan workspace of %zu bytes: out of memory",
                        bytes);
    if (st) {
        free(mem);
        free(plan);
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

void fi_plan_destroy(fi_plan *plan) {
    if (!plan) return;
    if (plan->backend_state && plan->ctx->backend->plan_fini)
        plan->ctx->backend->plan_fini(plan);
    fi_schedule_free(&plan->schedule);
    free(plan->host_memory);
    free(plan);
}

size_t fi_plan_workspace_size(const fi_plan *plan) { return plan ? plan->workspace_bytes : 0; }

void fi_plan_info_init(fi_plan_info *info) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
}

fi_status fi_plan_get_info(const fi_plan *plan, fi_plan_info *info) {
    if (!plan || !info) return INVALID("fi_plan_get_info: NULL argument");
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
