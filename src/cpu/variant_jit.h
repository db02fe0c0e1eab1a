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

/* The sources embedded for the JIT (src/embed.sh --flatten), in the order
 * of the Makefile's CPU_TEMPLATE_SRC, which is their dependency order: the
 * kernel's source is all of them concatenated. */
typedef struct fi_cpu_jit_file {
    const char *name;
    const char *text;
} fi_cpu_jit_file;
extern const fi_cpu_jit_file fi_cpu_jit_files[];
extern const int fi_cpu_jit_file_count;

/* Indices into fi_cpu_jit_files. */
enum {
    FI_CPU_JIT_FLASHINFER_H,
    FI_CPU_JIT_CONVERT_H,
    FI_CPU_JIT_VARIANT_ABI_H,
    FI_CPU_JIT_VARIANT_KERNEL_H,
    FI_CPU_JIT_FILE_COUNT
};

/* The kernel configuration a plan compiles. */
typedef struct fi_cpu_variant_config {
    int32_t head_dim_qk, head_dim_vo;
    fi_dtype q_dtype, kv_dtype, o_dtype;
} fi_cpu_variant_config;

/* The configuration a plan with params `p` compiles. */
static inline fi_cpu_variant_config fi_cpu_variant_config_of(const fi_attention_params *p) {
    fi_cpu_variant_config c = {p->head_dim_qk, p->head_dim_vo, p->q_dtype, p->kv_dtype,
                               p->o_dtype};
    return c;
}

/* The full C source of the kernel for `v` and `cfg`, malloc'd (NULL when out
 * of memory). */
char *fi_cpu_variant_source(const fi_variant *v, const fi_cpu_variant_config *cfg);
/* Its name in the cache: <variant>_d<qk>x<vo>_<q>_<kv>_<o> (at most 90
 * characters). */
void fi_cpu_variant_name(const fi_variant *v, const fi_cpu_variant_config *cfg, char *buf,
                         size_t n);

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
