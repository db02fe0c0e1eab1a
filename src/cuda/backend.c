/*
 * backend.c — the CUDA backend's table and contexts: the driver is loaded at
 * run time, the requested device's primary context is retained (any
 * ordinal), and every call into the driver runs with it pushed current.
 */
#include "cuda/cuda_backend.h"
#include "cuda/cuda_ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int32_t cuda_device_available(void) {
    const fi_cu_api *cu = fi_cu_load(NULL);
    int n = 0;
    return cu && cu->DeviceGetCount(&n) == 0 && n > 0;
}

fi_status fi_cuda_push(const fi_cuda_ctx *cc) {
    FI_CU(cc->cu, CtxPushCurrent, cc->pctx);
    return FI_OK;
}

void fi_cuda_pop(const fi_cuda_ctx *cc) {
    CUcontext popped;
    cc->cu->CtxPopCurrent(&popped);
}

fi_status fi_cuda_enter(const fi_cuda_ctx *cc, bool *pushed) {
    CUcontext cur = NULL;
    *pushed = false;
    if (cc->cu->CtxGetCurrent(&cur) == 0 && cur == cc->pctx) return FI_OK;
    FI_CU(cc->cu, CtxPushCurrent, cc->pctx);
    *pushed = true;
    return FI_OK;
}

void fi_cuda_leave(const fi_cuda_ctx *cc, bool pushed) {
    if (pushed) fi_cuda_pop(cc);
}

static void cuda_context_fini(fi_context *ctx) {
    fi_cuda_ctx *cc = ctx->backend_state;
    if (!cc) return;
    if (cc->pctx && cc->cu->CtxPushCurrent(cc->pctx) == 0) {
        for (fi_cuda_module *m = cc->modules, *next; m; m = next) {
            next = m->next;
            cc->cu->ModuleUnload(m->module);
            free(m);
        }
        fi_cuda_pop(cc);
    }
    if (cc->pctx) cc->cu->DevicePrimaryCtxRelease(cc->dev);
    pthread_mutex_destroy(&cc->lock);
    free(cc);
    ctx->backend_state = NULL;
}

static fi_status device_facts(fi_cuda_ctx *cc) {
    const fi_cu_api *cu = cc->cu;
    FI_CU(cu, DeviceGetAttribute, &cc->sm_count, FI_CU_ATTR_SM_COUNT, cc->dev);
    FI_CU(cu, DeviceGetAttribute, &cc->cc_major, FI_CU_ATTR_CC_MAJOR, cc->dev);
    FI_CU(cu, DeviceGetAttribute, &cc->cc_minor, FI_CU_ATTR_CC_MINOR, cc->dev);
    FI_CU(cu, DeviceGetName, cc->name, (int)sizeof cc->name, cc->dev);
    fi_cuda_tuning_read(&cc->tuning);
    fi_cuda_arch_name(cc->cc_major, cc->cc_minor, &cc->tuning, cc->arch, sizeof cc->arch);
    cc->tuning.wgmma = fi_cuda_arch_wgmma(cc->arch);
    cc->pdl = cc->cc_major >= 9 && cu->LaunchKernelEx && cc->tuning.pdl;
    return FI_OK;
}

fi_status fi_cuda_device_arch(int32_t device, char *buf, size_t n) {
    const char *why;
    const fi_cu_api *cu = fi_cu_load(&why);
    if (!cu) return fi_error(FI_STATUS_NO_DEVICE, "device CUDA: %s", why);
    int count = 0, major = 0, minor = 0;
    CUdevice dev;
    FI_CU(cu, DeviceGetCount, &count);
    if (device < 0 || device >= count)
        return fi_error(FI_STATUS_NO_DEVICE, "device CUDA %d: the driver sees %d GPU%s",
                        (int)device, count, count == 1 ? "" : "s");
    FI_CU(cu, DeviceGet, &dev, device);
    FI_CU(cu, DeviceGetAttribute, &major, FI_CU_ATTR_CC_MAJOR, dev);
    FI_CU(cu, DeviceGetAttribute, &minor, FI_CU_ATTR_CC_MINOR, dev);
    fi_cuda_tuning t;
    fi_cuda_tuning_read(&t);
    fi_cuda_arch_name(major, minor, &t, buf, n);
    return FI_OK;
}

static fi_status cuda_context_init(fi_context *ctx) {
    const char *why;
    const fi_cu_api *cu = fi_cu_load(&why);
    if (!cu) return fi_error(FI_STATUS_NO_DEVICE, "device CUDA: %s", why);
    int n = 0;
    CUresult r = cu->DeviceGetCount(&n);
    if (r != 0) return fi_cu_error(cu, "cuDeviceGetCount", r);
    if (n == 0) return fi_error(FI_STATUS_NO_DEVICE, "device CUDA: the driver sees no GPU");
    if (ctx->device_id < 0 || ctx->device_id >= n)
        return fi_error(FI_STATUS_NO_DEVICE, "device_id=%d: this machine has %d CUDA device%s "
                        "(ordinals 0..%d)", (int)ctx->device_id, n, n == 1 ? "" : "s", n - 1);
    fi_cuda_ctx *cc = calloc(1, sizeof *cc);
    if (!cc) return fi_error(FI_STATUS_OUT_OF_MEMORY, "CUDA context: out of memory");
    cc->cu = cu;
    pthread_mutex_init(&cc->lock, NULL);
    ctx->backend_state = cc;
    fi_status st = FI_OK;
    if ((r = cu->DeviceGet(&cc->dev, ctx->device_id)) != 0) st = fi_cu_error(cu, "cuDeviceGet", r);
    else if ((r = cu->DevicePrimaryCtxRetain(&cc->pctx, cc->dev)) != 0) {
        cc->pctx = NULL;
        st = fi_cu_error(cu, "cuDevicePrimaryCtxRetain", r);
    }
    if (!st) st = device_facts(cc);
    if (st) {
        cuda_context_fini(ctx);
        return st;
    }
    ctx->num_threads = 1;
    snprintf(ctx->description, sizeof ctx->description, "cuda: device %d, %.64s (%.16s, %d SMs)",
             (int)ctx->device_id, cc->name, cc->arch, cc->sm_count);
    return FI_OK;
}

/* One worker per SM: the plan's items are spread over SMs; each worker's
 * CTAs also split the KV heads (grid.y, chosen at plan creation). */
static int32_t cuda_num_workers(const fi_context *ctx) {
    const fi_cuda_ctx *cc = ctx->backend_state;
    return cc && cc->sm_count > 0 ? cc->sm_count : 1;
}

/* Device memory for objects that own a workspace (cascades, bsr masks). */
static fi_status cuda_mem_alloc(fi_context *ctx, size_t bytes, void **out) {
    fi_cuda_ctx *cc = ctx->backend_state;
    fi_status st = fi_cuda_push(cc);
    if (st) return st;
    CUdeviceptr p = 0;
    CUresult r = cc->cu->MemAlloc(&p, bytes);
    fi_cuda_pop(cc);
    if (r != 0) return fi_cu_error(cc->cu, "cuMemAlloc", r);
    *out = (void *)(uintptr_t)p;
    return FI_OK;
}

static void cuda_mem_free(fi_context *ctx, void *ptr) {
    fi_cuda_ctx *cc = ctx->backend_state;
    if (fi_cuda_push(cc) != FI_OK) return;
    cc->cu->MemFree((CUdeviceptr)(uintptr_t)ptr);
    fi_cuda_pop(cc);
}

const fi_backend fi_cuda_backend = {
    .name = "cuda",
    .host_memory = false,
    .device_available = cuda_device_available,
    /* Packed-row tiles of the CUDA-core kernel, which runs any tile as
     * blocks of up to 8 rows, each block streaming the item's keys: cost ~
     * rows * keys / 8. Plans with a tensor-core path refine it (plan.c). */
    .policy = {.q_tiles = {8, 32, 128},
               .num_q_tiles = 3,
               .cost_per_q_row = 1.0,
               .cost_per_key = 0.0,
               .cost_per_row_key = 0.125},
    .context_init = cuda_context_init,
    .context_fini = cuda_context_fini,
    .num_workers = cuda_num_workers,
    .plan_init = fi_cuda_plan_init,
    .plan_fini = fi_cuda_plan_fini,
    .plan_upload = fi_cuda_plan_upload,
    .run = fi_cuda_run,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .plan_copy_in = fi_cuda_plan_copy_in,
    .merge_state = fi_cuda_merge_state,
    .merge_state_in_place = fi_cuda_merge_state_in_place,
    .merge_states = fi_cuda_merge_states,
    .append_paged_kv_cache = fi_cuda_append_paged_kv_cache,
    .rope = fi_cuda_rope,
    .norm = fi_cuda_norm,
    .gated_act = fi_cuda_gated_act,
    .softmax = fi_cuda_softmax,
    .sample = fi_cuda_sample,
    .filter = fi_cuda_filter,
    .chain_speculative = fi_cuda_chain_speculative,
    .top_k = fi_cuda_top_k,
    .rope_cos_sin = fi_cuda_rope_cos_sin,
    .rope_quant = fi_cuda_rope_quant,
    .warmup_missing = fi_cuda_warmup_missing,
    .warmup_list = fi_cuda_warmup_list,
    .warmup_compile = fi_cuda_warmup_compile,
};
