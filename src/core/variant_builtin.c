/*
 * variant_builtin.c — the built-in variants written as specs, so built-ins
 * and user variants are one mechanism. The CPU SIMD kernels and the CUDA
 * kernels' compile-time paths are the ahead-of-time builds of these specs
 * (chosen by fi_attention_params' fields); a plan that names one of them as
 * params->variant runs it through the hook path instead.
 */
#include "core/variant.h"

#include <pthread.h>
#include <string.h>

static const fi_variant_param soft_cap_params[] = {{"cap", FI_VARIANT_PARAM_F32, FI_DTYPE_F32}};
static const fi_variant_param alibi_params[] = {{"slopes", FI_VARIANT_PARAM_TENSOR, FI_DTYPE_F32}};
static const fi_variant_param window_params[] = {
    {"window_left", FI_VARIANT_PARAM_I32, FI_DTYPE_I32}};
static const fi_variant_param mask_params[] = {
    {"mask", FI_VARIANT_PARAM_TENSOR, FI_DTYPE_U8},
    {"mask_indptr", FI_VARIANT_PARAM_TENSOR, FI_DTYPE_I32},
};
static const fi_variant_param rope_params[] = {
    {"rope_scale", FI_VARIANT_PARAM_F32, FI_DTYPE_F32},
    {"rope_theta", FI_VARIANT_PARAM_F32, FI_DTYPE_F32},
};


/* Row i of the request's [qo_len, kv_len] bit matrix at byte mask_indptr[request]. */
static const char mask_body[] =
    "int64_t i = c->q_pos - (c->kv_len - c->qo_len);\n"
    "int64_t bit = i * c->kv_len + c->kv_pos;\n"
    "const uint8_t *m = p.mask + p.mask_indptr[c->request];\n"
    "return (m[bit >> 3] >> (bit & 7)) & 1;";

/* The built-ins, in the order fi_variant_builtin searches them. */
enum {
    BUILTIN_NONE,
    BUILTIN_SOFT_CAP,
    BUILTIN_ALIBI,
    BUILTIN_SLIDING_WINDOW,
    BUILTIN_CUSTOM_MASK,
    BUILTIN_ROPE_LLAMA,
    NUM_BUILTINS
};

static fi_variant builtins[NUM_BUILTINS];
static fi_status builtin_status = FI_OK;
static pthread_once_t builtin_once = PTHREAD_ONCE_INIT;

static void spec_of(int i, fi_variant_spec *s) {
    fi_variant_spec_init(s);
    switch (i) {
    case BUILTIN_NONE: s->name = "none"; break;
    case BUILTIN_SOFT_CAP:
        s->name = "soft_cap", s->params = soft_cap_params, s->num_params = 1;
        s->logits_transform = "return p.cap * tanhf(s / p.cap);";
        break;
    case BUILTIN_ALIBI:
        s->name = "alibi", s->params = alibi_params, s->num_params = 1;
        s->logits_transform = "return s + p.slopes[c->qo_head] * (float)(c->kv_pos - c->q_pos);";
        break;
    case BUILTIN_SLIDING_WINDOW:
        s->name = "sliding_window", s->params = window_params, s->num_params = 1;
        s->logits_mask = "return c->kv_pos >= c->q_pos - p.window_left;";
        break;
    case BUILTIN_CUSTOM_MASK:
        s->name = "custom_mask", s->params = mask_params, s->num_params = 2;
        s->logits_mask = mask_body;
        break;
    default: /* BUILTIN_ROPE_LLAMA */
        s->name = "rope_llama", s->params = rope_params, s->num_params = 2;
        /* LLaMA RoPE on halves: angle_k = pos / scale * theta^(-2k/D), the
         * hooks' library helper (fast sin/cos on the GPU) */
        s->query_transform =
            "fi_rope_row(x, c->head_dim, c->q_pos, p.rope_scale, p.rope_theta);";
        s->key_transform =
            "fi_rope_row(x, c->head_dim, c->kv_pos, p.rope_scale, p.rope_theta);";
        break;
    }
}

static void init_builtins(void) {
    for (int i = 0; i < NUM_BUILTINS && builtin_status == FI_OK; i++) {
        fi_variant_spec s;
        spec_of(i, &s);
        builtin_status = fi_variant_init_static(&builtins[i], &s);
    }
}

fi_status fi_variant_builtin(const char *name, const fi_variant **out) {
    if (!out) return fi_error(FI_STATUS_INVALID_ARGUMENT, "fi_variant_builtin: out is NULL");
    *out = NULL;
    if (!name) return fi_error(FI_STATUS_INVALID_ARGUMENT, "fi_variant_builtin: name is NULL");
    pthread_once(&builtin_once, init_builtins);
    if (builtin_status)
        return fi_error(builtin_status, "built-in variants could not be initialised");
    for (int i = 0; i < NUM_BUILTINS; i++) {
        if (strcmp(builtins[i].spec.name, name) == 0) {
            *out = &builtins[i];
            return FI_OK;
        }
    }
    return fi_error(FI_STATUS_INVALID_ARGUMENT,
                    "no built-in variant \"%.40s\": expected none, soft_cap, alibi, "
                    "sliding_window, custom_mask or rope_llama", name);
}
