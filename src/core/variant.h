/*
 * variant.h — what the core and the backends share about user-defined
 * variants: the validated spec (struct fi_variant), the layout of the
 * parameter struct the hooks read, run-time argument checks and packing, and
 * the hook-text generator (fi_variant_source in flashinfer.h) as a malloc'd
 * string. docs/VARIANTS.md describes the whole path.
 */
#ifndef FI_CORE_VARIANT_H
#define FI_CORE_VARIANT_H

#include "core/internal.h"

/* Hooks a spec may give, in the order of fi_variant_spec's fields. */
typedef enum fi_hook_id {
    FI_HOOK_QUERY_TRANSFORM = 0,
    FI_HOOK_KEY_TRANSFORM,
    FI_HOOK_VALUE_TRANSFORM,
    FI_HOOK_LOGITS_TRANSFORM,
    FI_HOOK_LOGITS_MASK,
    FI_HOOK_OUTPUT_TRANSFORM,
    FI_HOOK_COUNT
} fi_hook_id;

struct fi_variant {
    uint32_t magic;                                 /* FI_MAGIC_VARIANT while alive */
    /* The user's reference and one per plan made with it (fi_variant_retain):
     * the variant outlives fi_variant_destroy while a plan uses it. */
    _Atomic int32_t refs;
    fi_variant_spec spec;                           /* strings point into `text` */
    fi_variant_param params[FI_VARIANT_MAX_PARAMS]; /* names point into `text` */
    char *text;                                     /* every string, one allocation */
    bool builtin;                                   /* static: destroy is a no-op */
    /* fi_variant_params, as both compilers lay it out: members in spec order,
     * natural alignment (4-byte scalars, pointer-sized tensors). */
    int32_t offset[FI_VARIANT_MAX_PARAMS];
    int32_t params_size;                            /* sizeof(fi_variant_params) */
    uint64_t hash;                                  /* of the C hook text */
};

/* A live variant (user-made or built-in), or an error naming `fn`. */
fi_status fi_variant_check(const fi_variant *v, const char *fn);
/* A plan's reference to its variant (built-ins: none needed), dropped by
 * fi_variant_release; the last reference frees it. */
void fi_variant_retain(const fi_variant *v);
void fi_variant_release(const fi_variant *v);

/* Validate and copy a spec into static storage (the built-ins). */
fi_status fi_variant_init_static(fi_variant *v, const fi_variant_spec *spec);

/* The snippet of hook `id` (NULL = identity). */
const char *fi_variant_hook(const fi_variant *v, fi_hook_id id);

/* Run-time values: count, kinds, non-NULL tensors. `args` may be NULL for a
 * variant without parameters. */
fi_status fi_variant_check_args(const fi_variant *v, const fi_variant_args *args);
/* Lay checked values out as fi_variant_params into buf[v->params_size]. */
void fi_variant_pack(const fi_variant *v, const fi_variant_args *args, void *buf);

/* The hook text for a target, malloc'd (NULL when out of memory). */
char *fi_variant_source_alloc(const fi_variant *v, fi_variant_target target);

#endif /* FI_CORE_VARIANT_H */
