/*
 * variant_jit.c — user-defined variants on the CPU backend. A plan with
 * params.variant compiles (or loads from the cache) one shared object: the
 * variant's hook text (fi_variant_source, target C), FI_VK_* macros for its
 * head dims and dtypes, and the embedded kernel template. fi_plan_run fills
 * one fi_vk_job and runs the schedule on the thread pool, as the built-in
 * kernels do: phase 1 the items, phase 2 the merge rows (output_transform
 * applied after the merge).
 */
#include "cpu/variant_jit.h"
#include "core/variant.h"
#include "cpu/attention.h"
#include "cpu/cpu.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(fi_vk_item) == sizeof(fi_work_item), "fi_vk_item mirrors fi_work_item");

/* Concatenate n strings, malloc'd. */
static char *concat(const char *const *parts, int n) {
    size_t len = 0;
    for (int i = 0; i < n; i++) len += strlen(parts[i]);
    char *s = malloc(len + 1), *at = s;
    if (!s) return NULL;
    for (int i = 0; i < n; i++) {
        size_t k = strlen(parts[i]);
        memcpy(at, parts[i], k);
        at += k;
    }
    *at = 0;
    return s;
}

char *fi_cpu_variant_source(const fi_variant *v, const fi_cpu_variant_config *cfg) {
    char config[256];
    snprintf(config, sizeof config,
             "#define FI_VK_DQK %d\n#define FI_VK_DVO %d\n#define FI_VK_Q_DTYPE %d\n"
             "#define FI_VK_KV_DTYPE %d\n#define FI_VK_O_DTYPE %d\n",
             (int)cfg->head_dim_qk, (int)cfg->head_dim_vo, (int)cfg->q_dtype,
             (int)cfg->kv_dtype, (int)cfg->o_dtype);
    char *hooks = fi_variant_source_alloc(v, FI_VARIANT_TARGET_C);
    if (!hooks || fi_cpu_jit_file_count != FI_CPU_JIT_FILE_COUNT) {
        free(hooks);
        return NULL;
    }
    const char *parts[] = {config, hooks,
                           fi_cpu_jit_files[FI_CPU_JIT_FLASHINFER_H].text,
                           fi_cpu_jit_files[FI_CPU_JIT_CONVERT_H].text,
                           fi_cpu_jit_files[FI_CPU_JIT_VARIANT_ABI_H].text,
                           fi_cpu_jit_files[FI_CPU_JIT_VARIANT_KERNEL_H].text};
    char *s = concat(parts, (int)(sizeof parts / sizeof parts[0]));
    free(hooks);
    return s;
}

static fi_status resolve(void *handle, const char *symbol, const char *path, const void **out) {
    *out = dlsym(handle, symbol);
    if (*out) return FI_OK;
    dlclose(handle);
    return fi_error(FI_STATUS_BACKEND_ERROR, "%s has no symbol %s", path, symbol);
}

void fi_cpu_variant_name(const fi_variant *v, const fi_cpu_variant_config *cfg, char *buf,
                         size_t n) {
    snprintf(buf, n, "%s_d%dx%d_%s_%s_%s", v->spec.name, (int)cfg->head_dim_qk,
             (int)cfg->head_dim_vo, fi_dtype_name(cfg->q_dtype), fi_dtype_name(cfg->kv_dtype),
             fi_dtype_name(cfg->o_dtype));
}

fi_status fi_cpu_variant_load(const fi_variant *v, const fi_cpu_variant_config *cfg,
                              const fi_vk_entry **entry, fi_cc_result *result) {
    char name[200];
    fi_cpu_variant_name(v, cfg, name, sizeof name);
    char *src = fi_cpu_variant_source(v, cfg);
    if (!src) return fi_error(FI_STATUS_OUT_OF_MEMORY, "variant %s: out of memory", name);
    fi_status st = fi_cc_load(name, src, result);
    free(src);
    if (st) return st;
    const void *sym;
    if ((st = resolve(result->handle, "fi_vk_entry_point", result->path, &sym))) return st;
    const fi_vk_entry *e = sym;
    if (e->abi != FI_VK_ABI || e->dqk != cfg->head_dim_qk || e->dvo != cfg->head_dim_vo) {
        dlclose(result->handle);
        return fi_error(FI_STATUS_BACKEND_ERROR, "%s: stale object (abi %d, dims %dx%d)",
                        result->path, (int)e->abi, (int)e->dqk, (int)e->dvo);
    }
    *entry = e;
    return FI_OK;
}

/* ------------------------------------------------------------------- plan */

typedef struct cpu_variant_plan {
    void *handle;
    const fi_vk_entry *entry;
    size_t scratch_stride;     /* bytes per worker, 64-aligned */
    char *scratch;             /* [threads][scratch_stride] */
    void *params;              /* packed fi_variant_params of the current run */
} cpu_variant_plan;

fi_status fi_cpu_variant_plan_init(struct fi_plan *plan) {
    const fi_attention_params *p = &plan->params;
    fi_cpu_variant_config cfg = fi_cpu_variant_config_of(p);
    cpu_variant_plan *vp = calloc(1, sizeof *vp);
    if (!vp) return fi_error(FI_STATUS_OUT_OF_MEMORY, "variant plan: out of memory");
    fi_cc_result r;
    fi_status st = fi_cpu_variant_load(p->variant, &cfg, &vp->entry, &r);
    if (st) {
        free(vp);
        return st;
    }
    vp->handle = r.handle;
    vp->scratch_stride = (vp->entry->scratch_bytes + 63) & ~(size_t)63;
    size_t bytes = vp->scratch_stride * (size_t)plan->ctx->num_threads;
    if (posix_memalign((void **)&vp->scratch, 64, bytes) != 0) vp->scratch = NULL;
    vp->params = malloc((size_t)p->variant->params_size);
    plan->backend_state = vp;
    if (!vp->scratch || !vp->params) {
        fi_cpu_variant_plan_fini(plan);
        return fi_error(FI_STATUS_OUT_OF_MEMORY, "variant plan scratch of %zu bytes: out of memory",
                        bytes);
    }
    plan->workspace_bytes += bytes;
    return FI_OK;
}

void fi_cpu_variant_plan_fini(struct fi_plan *plan) {
    cpu_variant_plan *vp = plan->backend_state;
    if (!vp) return;
    if (vp->handle) dlclose(vp->handle);
    free(vp->scratch);
    free(vp->params);
    free(vp);
    plan->backend_state = NULL;
}

/* ------------------------------------------------------------------- run */

typedef struct variant_run {
    const fi_plan *plan;
    const cpu_variant_plan *vp;
    fi_vk_job job;
} variant_run;

static fi_vk_kv vk_kv(const fi_plan *plan, const fi_tensor *t) {
    fi_cpu_kv c = fi_cpu_kv_view(plan, t);
    fi_vk_kv kv = {c.base, c.page_stride, c.slot_stride, c.head_stride, c.elem_stride};
    return kv;
}

static void job_init(fi_vk_job *j, const fi_plan *plan, const fi_run_args *a, const void *prm) {
    const fi_attention_params *p = &plan->params;
    bool fp8 = p->kv_dtype == FI_DTYPE_E4M3 || p->kv_dtype == FI_DTYPE_E5M2;
    memset(j, 0, sizeof *j);
    FI_CPU_JOB_QO(j, p, a);
    j->k = vk_kv(plan, &a->k);
    j->v = vk_kv(plan, &a->v);
    j->mask = p->mask_mode == FI_MASK_CUSTOM ? a->custom_mask.data : NULL;
    j->mask_offset = plan->mask_offset;
    j->qo_indptr = plan->qo_indptr;
    j->kv_indptr = plan->kv_indptr;
    j->kv_indices = plan->kv_indices;
    j->kv_len = plan->kv_len;
    j->batch_size = plan->batch_size;
    j->paged = p->kv_format == FI_KV_FORMAT_PAGED;
    j->page_size = p->page_size;
    j->h_qo = p->num_qo_heads, j->h_kv = p->num_kv_heads, j->group = plan->group_size;
    j->causal = p->mask_mode == FI_MASK_CAUSAL;
    j->window_left = p->window_left;
    j->sm_scale = p->sm_scale;
    j->k_scale = fp8 ? p->k_scale : 1.0f;
    j->v_scale = fp8 ? p->v_scale : 1.0f;
    j->partial_o = plan->partial_o;
    j->partial_lse = plan->partial_lse;
    j->params = prm;
}

static void phase_items(void *arg, int32_t t, int32_t nt) {
    const variant_run *r = arg;
    const fi_schedule *s = &r->plan->schedule;
    void *scratch = r->vp->scratch + (size_t)t * r->vp->scratch_stride;
    for (int32_t w = t; w < s->num_workers; w += nt)
        for (int32_t i = s->worker_indptr[w]; i < s->worker_indptr[w + 1]; i++)
            r->vp->entry->attend(&r->job, (const fi_vk_item *)&s->items[i], scratch);
}

static void phase_merge(void *arg, int32_t t, int32_t nt) {
    const variant_run *r = arg;
    const fi_schedule *s = &r->plan->schedule;
    int32_t n = s->num_merge_rows;
    int32_t begin = (int32_t)((int64_t)n * t / nt), end = (int32_t)((int64_t)n * (t + 1) / nt);
    for (int32_t i = begin; i < end; i++)
        r->vp->entry->merge_row(&r->job, s->merge_out_row[i], s->merge_src + s->merge_indptr[i],
                                s->merge_indptr[i + 1] - s->merge_indptr[i]);
}

fi_status fi_cpu_variant_run(struct fi_plan *plan, const fi_run_args *args) {
    cpu_variant_plan *vp = plan->backend_state;
    const fi_variant *v = plan->params.variant;
    if (v->spec.num_params > 0) fi_variant_pack(v, args->variant_args, vp->params);
    else memset(vp->params, 0, (size_t)v->params_size);
    variant_run r = {.plan = plan, .vp = vp};
    job_init(&r.job, plan, args, vp->params);
    fi_thread_pool *pool = fi_cpu_pool(plan->ctx);
    if (plan->schedule.num_items > 0) fi_thread_pool_run(pool, phase_items, &r);
    if (plan->schedule.num_merge_rows > 0) fi_thread_pool_run(pool, phase_merge, &r);
    return FI_OK;
}

/* ------------------------------------------------------------ oracle hooks */

/* Wrappers with the ABI's types around the generated hooks, and their table. */
static const char hooks_table[] =
    "\n#define VK_CTX(c) ((const fi_hook_ctx *)(c))\n"
    "#define VK_PRM(p) ((const fi_variant_params *)(p))\n"
    "static void vk_q(float *x, const fi_vk_hook_ctx *c, const void *p) "
    "{ fi_query_transform(x, VK_CTX(c), VK_PRM(p)); }\n"
    "static void vk_k(float *x, const fi_vk_hook_ctx *c, const void *p) "
    "{ fi_key_transform(x, VK_CTX(c), VK_PRM(p)); }\n"
    "static void vk_v(float *x, const fi_vk_hook_ctx *c, const void *p) "
    "{ fi_value_transform(x, VK_CTX(c), VK_PRM(p)); }\n"
    "static float vk_s(float s, const fi_vk_hook_ctx *c, const void *p) "
    "{ return fi_logits_transform(s, VK_CTX(c), VK_PRM(p)); }\n"
    "static int vk_m(const fi_vk_hook_ctx *c, const void *p) "
    "{ return fi_logits_mask(VK_CTX(c), VK_PRM(p)); }\n"
    "static void vk_o(float *o, float lse, const fi_vk_hook_ctx *c, const void *p) "
    "{ fi_output_transform(o, lse, VK_CTX(c), VK_PRM(p)); }\n"
    "FI_STATIC_ASSERT(sizeof(fi_hook_ctx) == sizeof(fi_vk_hook_ctx), \"fi_hook_ctx\");\n"
    "__attribute__((visibility(\"default\"))) const fi_vk_hooks fi_vk_hook_table = {\n"
    "    FI_VK_ABI, FI_VARIANT_USE_SOFTMAX, vk_q, vk_k, vk_v, vk_s, vk_m, vk_o};\n";

fi_status fi_cpu_variant_hooks(const fi_variant *v, const fi_vk_hooks **hooks, void **handle) {
    *hooks = NULL;
    *handle = NULL;
    char *text = fi_variant_source_alloc(v, FI_VARIANT_TARGET_C);
    const char *parts[] = {text ? text : "", fi_cpu_jit_files[FI_CPU_JIT_VARIANT_ABI_H].text,
                           hooks_table};
    char *src = text ? concat(parts, (int)(sizeof parts / sizeof parts[0])) : NULL;
    free(text);
    if (!src) return fi_error(FI_STATUS_OUT_OF_MEMORY, "variant %s: out of memory", v->spec.name);
    char name[100];
    snprintf(name, sizeof name, "%s_hooks", v->spec.name);
    fi_cc_result r;
    fi_status st = fi_cc_load(name, src, &r);
    free(src);
    if (st) return st;
    const void *sym;
    if ((st = resolve(r.handle, "fi_vk_hook_table", r.path, &sym))) return st;
    *hooks = sym;
    *handle = r.handle;
    return FI_OK;
}
