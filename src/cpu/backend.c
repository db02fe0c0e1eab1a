/*
 * backend.c — the CPU backend's table: context setup (thread pool, SIMD
 * table, per-thread scratch), and the entry points the core calls.
 */
#include "cpu/attention.h"
#include "cpu/cpu.h"
#include "cpu/serving.h"
#include "cpu/variant_jit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* FI_CPU_SIMD=<level> overrides "auto" (tests run every level this way). */
static const char *simd_request(const fi_context *ctx) {
    if (ctx->simd_request[0]) return ctx->simd_request;
    const char *env = getenv("FI_CPU_SIMD");
    return env && env[0] ? env : "auto";
}

static void cpu_context_fini(fi_context *ctx) {
    fi_cpu_state *st = ctx->backend_state;
    if (!st) return;
    fi_thread_pool_destroy(st->pool);
    if (st->scratch)
        for (int32_t i = 0; i < ctx->num_threads; i++) fi_cpu_scratch_fini(&st->scratch[i]);
    free(st->scratch);
    free(st->serving_scratch);
    free(st);
    ctx->backend_state = NULL;
}

static fi_status cpu_context_init(fi_context *ctx) {
    const char *req = simd_request(ctx);
    const fi_cpu_simd *simd = fi_cpu_simd_select(req);
    if (!simd)
        return fi_error(FI_STATUS_UNSUPPORTED,
                        "cpu_simd \"%.16s\": this CPU or build cannot run that level", req);
    fi_cpu_state *st = calloc(1, sizeof *st);
    if (!st) return fi_error(FI_STATUS_OUT_OF_MEMORY, "CPU context: out of memory");
    ctx->backend_state = st;
    st->simd = simd;
    st->scratch = calloc((size_t)ctx->num_threads, sizeof *st->scratch);
    fi_status s = st->scratch ? FI_OK : fi_error(FI_STATUS_OUT_OF_MEMORY, "CPU context: out of memory");
    for (int32_t i = 0; i < ctx->num_threads && !s; i++) s = fi_cpu_scratch_init(&st->scratch[i]);
    if (!s) s = fi_thread_pool_create(ctx->num_threads, &st->pool);
    if (s) {
        cpu_context_fini(ctx);
        return s;
    }
    snprintf(ctx->description, sizeof ctx->description, "cpu: %d thread%s, simd %s",
             (int)ctx->num_threads, ctx->num_threads == 1 ? "" : "s", simd->name);
    return FI_OK;
}

/* Variant plans compile their kernel here (variant_jit.c). */
static fi_status cpu_plan_init(struct fi_plan *plan) {
    return plan->params.variant ? fi_cpu_variant_plan_init(plan) : FI_OK;
}

static int32_t cpu_num_workers(const fi_context *ctx) { return ctx->num_threads; }

static int32_t cpu_device_available(void) { return 1; }

static fi_status cpu_mem_alloc(fi_context *ctx, size_t bytes, void **out) {
    (void)ctx;
    *out = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    return *out ? FI_OK
                : fi_error(FI_STATUS_OUT_OF_MEMORY, "workspace of %zu bytes: out of memory", bytes);
}

static void cpu_mem_free(fi_context *ctx, void *ptr) {
    (void)ctx;
    free(ptr);
}

/* Runs are synchronous on the CPU: a plain copy is ordered before them. */
static fi_status cpu_plan_copy_in(struct fi_plan *plan, void *dst, const void *src,
                                  size_t bytes) {
    (void)plan;
    memcpy(dst, src, bytes);
    return FI_OK;
}

const fi_backend fi_cpu_backend = {
    .name = "cpu",
    .host_memory = true,
    .device_available = cpu_device_available,
    /* Packed-row tiles: a multiple of the kernel's 64-row block, or less for
     * small requests. Time per (packed row, key) dominates on the CPU:
     * bench_cost's fit, docs/SCHEDULER.md "Cost model". */
    .policy = {.q_tiles = {16, 64, 128},
               .num_q_tiles = 3,
               .cost_per_q_row = 0.0,
               .cost_per_key = 1.0,
               .cost_per_row_key = 0.1},
    .context_init = cpu_context_init,
    .context_fini = cpu_context_fini,
    .num_workers = cpu_num_workers,
    .plan_init = cpu_plan_init,
    .plan_fini = fi_cpu_variant_plan_fini,
    .plan_upload = NULL,
    .run = fi_cpu_run,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .plan_copy_in = cpu_plan_copy_in,
    .merge_state = fi_cpu_merge_state,
    .merge_state_in_place = fi_cpu_merge_state_in_place,
    .merge_states = fi_cpu_merge_states,
    .append_paged_kv_cache = fi_cpu_append_paged_kv_cache,
    .rope = fi_cpu_rope,
    .norm = fi_cpu_norm,
    .gated_act = fi_cpu_gated_act,
    .softmax = fi_cpu_softmax,
    .sample = fi_cpu_sample,
    .filter = fi_cpu_filter,
    .chain_speculative = fi_cpu_chain_speculative,
    .top_k = fi_cpu_top_k,
    .rope_cos_sin = fi_cpu_rope_cos_sin,
    .rope_quant = fi_cpu_rope_quant,
    .warmup_missing = fi_cpu_warmup_missing,
    .warmup_list = fi_cpu_warmup_list,
    .warmup_compile = fi_cpu_warmup_compile,
};
