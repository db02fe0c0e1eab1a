/*
 * variant_jit.h — user-defined variants on the CPU: the kernel of a plan
 * (hooks + variant_kernel.h compiled by cc_jit), its run on the thread pool,
 * and the hooks alone for the fp64 test oracle.
 */
#ifndef FI_CPU_VARIANT_JIT_H
#define FI_CPU_VARIANT_JIT_H

#include "core/internal.h"
#include "cpu/cc_jit.h"
#include "cpu/variant_abi.h"

/* The sources embedded for the JIT (src/embed.sh --flatten): flashinfer.h,
 * convert.h, variant_abi.h, variant_kernel.h, variant_kernel_v1.h (the
 * previous kernel, for comparison), in that order. */
typedef struct fi_cpu_jit_file {
    const char *name;
    const char *text;
} fi_cpu_jit_file;
extern const fi_cpu_jit_file fi_cpu_jit_files[];
extern const int fi_cpu_jit_file_count;

/* The kernel configuration a plan compiles. */
typedef struct fi_cpu_variant_config {
    int32_t head_dim_qk, head_dim_vo;
    fi_dtype q_dtype, kv_dtype, o_dtype;
} fi_cpu_variant_config;

/* The full C source of the kernel for `v` and `cfg`, malloc'd (NULL when out
 * of memory). */
char *fi_cpu_variant_source(const fi_variant *v, const fi_cpu_variant_config *cfg);

/* Compile or load the kernel (fi warmup, and plans). On success *entry is
 * the object's table and result->handle its dlopen handle (dlclose it). */
fi_status fi_cpu_variant_load(const fi_variant *v, const fi_cpu_variant_config *cfg,
                              const fi_vk_entry **entry, fi_cc_result *result);

/* Plans with params.variant: compile at creation, run, release. */
fi_status fi_cpu_variant_plan_init(struct fi_plan *plan);
void fi_cpu_variant_plan_fini(struct fi_plan *plan);
fi_status fi_cpu_variant_run(struct fi_plan *plan, const fi_run_args *args);

/* The variant's hooks as callable functions (compiled from the same hook
 * text, without the kernel), for the fp64 oracle in tests/. *handle is the
 * dlopen handle to dlclose. */
fi_status fi_cpu_variant_hooks(const fi_variant *v, const fi_vk_hooks **hooks, void **handle);

#endif /* FI_CPU_VARIANT_JIT_H */
