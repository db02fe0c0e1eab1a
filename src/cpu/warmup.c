/*
 * warmup.c — fi_warmup_* on the CPU. Only a plan with params.variant
 * compiles (cpu_plan_init: its shared object, variant_jit.c); the built-in
 * attention is the SIMD kernels in the library, so other plans list
 * nothing. The object's name, source and cache path are the ones
 * fi_cpu_variant_load computes for the plan.
 */
#include "cpu/cpu.h"
#include "cpu/variant_jit.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

const char *fi_cpu_warmup_missing(void) {
    const char *why = NULL;
    return fi_cc_available(&why) ? NULL : why;
}

fi_status fi_cpu_warmup_list(const fi_attention_params *params, const fi_plan_config *config,
                             const char *arch, fi_warmup_kernel *kernels, int32_t capacity,
                             int32_t *count) {
    *count = params->variant ? 1 : 0;
    if (!params->variant || capacity < 1) return FI_OK;
    fi_cpu_variant_config cfg = fi_cpu_variant_config_of(params);
    fi_warmup_kernel *k = &kernels[0];
    fi_cpu_variant_name(params->variant, &cfg, k->name, sizeof k->name);
    snprintf(k->arch, sizeof k->arch, "native");
    char *src = fi_cpu_variant_source(params->variant, &cfg);
    if (!src) return fi_error(FI_STATUS_OUT_OF_MEMORY, "variant %s: out of memory", k->name);
    fi_status st = fi_cc_path(k->name, src, k->cache_path, sizeof k->cache_path);
    free(src);
    if (st) return st;
    k->cached = access(k->cache_path, R_OK) == 0;
    return FI_OK;
}

fi_status fi_cpu_warmup_compile(const fi_attention_params *params,
                                const fi_plan_config *config, const char *arch,
                                int32_t index, int32_t *was_cached) {
    fi_cpu_variant_config cfg = fi_cpu_variant_config_of(params);
    const fi_vk_entry *entry;
    fi_cc_result r;
    fi_status st = fi_cpu_variant_load(params->variant, &cfg, &entry, &r);
    if (st) return st;
    *was_cached = r.was_cached;
    dlclose(r.handle);
    return FI_OK;
}
