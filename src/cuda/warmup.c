/*
 * warmup.c — fi_warmup_* on CUDA: the kernels a plan loads
 * (fi_cuda_plan_specs, from the same configuration, bounds and variant hook
 * text as fi_cuda_plan_init) and their files in the disk cache
 * (fi_cuda_cache_path), compiled by NVRTC alone (fi_cuda_jit_warm): no
 * driver and no GPU unless the target is device 0's.
 */
#include "cuda/cuda_backend.h"
#include "core/variant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

_Static_assert(FI_CUDA_FORM_COUNT <= FI_WARMUP_MAX_KERNELS,
               "FI_WARMUP_MAX_KERNELS bounds a plan's kernel forms");

/* A plan's kernels for one target. */
typedef struct plan_kernels {
    char arch[32];
    char *vsrc; /* the variant's CUDA hook text the specs point at (malloc'd) */
    int count;
    fi_kernel_spec specs[FI_CUDA_FORM_COUNT];
} plan_kernels;

static fi_status device_arch(char *buf, size_t n) {
    if (fi_cuda_device_arch(0, buf, n) == FI_OK) return FI_OK;
    char why[300];
    snprintf(why, sizeof why, "%s", fi_last_error());
    return fi_error(FI_STATUS_NO_DEVICE,
                    "CUDA kernels for device 0's target: %s; give arch (e.g. \"sm_90a\") to "
                    "compile without a GPU", why);
}

static void plan_kernels_free(plan_kernels *k) {
    if (!k) return;
    free(k->vsrc);
    free(k);
}

/* The kernels of a plan with `p` and `c` for `arch` ("" = device 0's). */
static fi_status plan_kernels_get(const fi_attention_params *p, const fi_plan_config *c,
                                  const char *arch, plan_kernels **out) {
    *out = NULL;
    plan_kernels *k = calloc(1, sizeof *k);
    if (!k) return fi_error(FI_STATUS_OUT_OF_MEMORY, "fi_warmup: out of memory");
    fi_status st = FI_OK;
    if (arch[0]) snprintf(k->arch, sizeof k->arch, "%s", arch);
    else st = device_arch(k->arch, sizeof k->arch);
    if (!st && p->variant && !(k->vsrc = fi_variant_source_alloc(p->variant,
                                                                 FI_VARIANT_TARGET_CUDA)))
        st = fi_error(FI_STATUS_OUT_OF_MEMORY, "variant source: out of memory");
    if (st) {
        plan_kernels_free(k);
        return st;
    }
    int64_t max_rows = (int64_t)c->max_total_qo * (p->num_qo_heads / p->num_kv_heads);
    k->count = fi_cuda_plan_specs(p, k->arch, c->device_page_table != 0, max_rows, k->vsrc, k->specs,
                                  NULL);
    *out = k;
    return FI_OK;
}

const char *fi_cuda_warmup_missing(void) {
    const char *why = NULL;
    return fi_nvrtc_load(&why) ? NULL : why;
}

fi_status fi_cuda_warmup_list(const fi_attention_params *params, const fi_plan_config *config,
                              const char *arch, fi_warmup_kernel *kernels, int32_t capacity,
                              int32_t *count) {
    plan_kernels *k;
    fi_status st = plan_kernels_get(params, config, arch, &k);
    if (st) return st;
    *count = k->count;
    for (int i = 0; i < k->count && i < capacity; i++) {
        fi_warmup_kernel *w = &kernels[i];
        snprintf(w->name, sizeof w->name, "%s", k->specs[i].name);
        snprintf(w->arch, sizeof w->arch, "%s", k->arch);
        st = fi_cuda_cache_path(&k->specs[i], k->arch, w->cache_path, sizeof w->cache_path, NULL);
        if (st) break;
        w->cached = access(w->cache_path, R_OK) == 0;
    }
    plan_kernels_free(k);
    return st;
}

fi_status fi_cuda_warmup_compile(const fi_attention_params *params,
                                 const fi_plan_config *config, const char *arch,
                                 int32_t index, int32_t *was_cached) {
    plan_kernels *k;
    fi_status st = plan_kernels_get(params, config, arch, &k);
    if (st) return st;
    int cached = 0;
    st = index < k->count ? fi_cuda_jit_warm(&k->specs[index], k->arch, &cached)
                          : fi_error(FI_STATUS_INVALID_ARGUMENT,
                                     "fi_warmup_compile: index=%d: the plan has %d kernels",
                                     (int)index, k->count);
    *was_cached = cached;
    plan_kernels_free(k);
    return st;
}
