/* variant_examples.c — the example variants (variant_examples.h). */
#include "variant_examples.h"
#include "core/variant.h"
#include "cpu/variant_jit.h"
#include "oracle.h"

#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ specs */

static const fi_variant_param sigmoid_params[] = {{"bias", FI_VARIANT_PARAM_F32, FI_DTYPE_F32}};
static const fi_variant_param sink_params[] = {{"sink", FI_VARIANT_PARAM_TENSOR, FI_DTYPE_F32}};
static const fi_variant_param block_params[] = {
    {"block", FI_VARIANT_PARAM_I32, FI_DTYPE_I32},
    {"num_blocks", FI_VARIANT_PARAM_I32, FI_DTYPE_I32},
    {"blocks", FI_VARIANT_PARAM_TENSOR, FI_DTYPE_U8},
};
static const fi_variant_param streaming_params[] = {
    {"num_sink", FI_VARIANT_PARAM_I32, FI_DTYPE_I32},
    {"window", FI_VARIANT_PARAM_I32, FI_DTYPE_I32},
    {"rope_theta", FI_VARIANT_PARAM_F32, FI_DTYPE_F32},
};
static const fi_variant_param head_scale_params[] = {
    {"scale", FI_VARIANT_PARAM_TENSOR, FI_DTYPE_F32}};
static const fi_variant_param all_params[] = {
    {"qscale", FI_VARIANT_PARAM_TENSOR, FI_DTYPE_BF16},
    {"shift", FI_VARIANT_PARAM_TENSOR, FI_DTYPE_I32},
    {"vbias", FI_VARIANT_PARAM_F32, FI_DTYPE_F32},
    {"temp", FI_VARIANT_PARAM_F32, FI_DTYPE_F32},
    {"period", FI_VARIANT_PARAM_I32, FI_DTYPE_I32},
};


static fi_variant_spec specs[VX_COUNT];
static int specs_ready;

static void build_specs(void) {
    fi_variant_spec *s;
    for (int i = 0; i < VX_COUNT; i++) fi_variant_spec_init(&specs[i]);

    s = &specs[VX_SIGMOID];
    s->name = "sigmoid", s->params = sigmoid_params, s->num_params = 1, s->use_softmax = 0;
    s->logits_transform = "return 1.0f / (1.0f + expf(-(s + p.bias)));";

    s = &specs[VX_SINK];
    s->name = "sink", s->params = sink_params, s->num_params = 1;
    s->output_transform =
        "float w = 1.0f / (1.0f + expf(p.sink[c->qo_head] - lse));\n"
        "for (int32_t d = 0; d < c->head_dim; d++) o[d] *= w;";

    s = &specs[VX_BLOCK_MASK];
    s->name = "block_mask", s->params = block_params, s->num_params = 3;
    s->logits_mask =
        "return c->q_pos >= 0 &&\n"
        "       p.blocks[(c->q_pos / p.block) * p.num_blocks + c->kv_pos / p.block] != 0;";

    s = &specs[VX_STREAMING];
    s->name = "streaming", s->params = streaming_params, s->num_params = 3;
    /* RoPE on halves at the position in the cache: the library's helper */
    s->query_transform = "fi_rope_row(x, c->head_dim, c->q_pos, 1.0f, p.rope_theta);";
    s->key_transform = "fi_rope_row(x, c->head_dim, c->kv_pos, 1.0f, p.rope_theta);";
    s->logits_mask = "return c->kv_pos < p.num_sink || c->kv_pos >= c->q_pos - p.window;";

    s = &specs[VX_HEAD_SCALE];
    s->name = "head_scale", s->params = head_scale_params, s->num_params = 1;
    s->logits_transform = "return s * p.scale[c->qo_head];";

    s = &specs[VX_ALL_HOOKS];
    s->name = "all_hooks", s->params = all_params, s->num_params = 5;
    s->query_transform = "for (int32_t d = 0; d < c->head_dim; d++) x[d] *= fi_bf16(p.qscale[d]);";
    s->key_transform =
        "for (int32_t d = 0; d < c->head_dim; d++) x[d] *= 1.0f + 0.125f * (float)c->kv_head;";
    s->value_transform =
        "for (int32_t d = 0; d < c->head_dim; d++)\n"
        "    x[d] += p.vbias * (float)((c->kv_pos + d) % 5 - 2);";
    s->logits_transform = "return s / p.temp;";
    s->logits_mask = "return (c->kv_pos + p.shift[c->qo_head]) % p.period != 0;";
    s->output_transform =
        "for (int32_t d = 0; d < c->head_dim; d++) o[d] = 0.5f * o[d] + 0.25f * tanhf(lse);";
    specs_ready = 1;
}

const fi_variant_spec *vx_spec(int i) {
    if (!specs_ready) build_specs();
    return i >= 0 && i < VX_COUNT ? &specs[i] : NULL;
}

/* ----------------------------------------------------------------- values */

static void *host_tensor(vx_args *a, int k, size_t bytes) {
    a->host[k] = calloc(1, bytes ? bytes : 1);
    a->bytes[k] = bytes;
    a->values[k] = fi_variant_tensor(a->host[k]);
    return a->host[k];
}

static int make_block_mask(tu_rng *rng, const vx_shape *sh, vx_args *a) {
    int32_t block = tu_rng_int(rng, 1, 3) * 8;
    int32_t nb = (sh->max_kv_len + block - 1) / block + 1;
    uint8_t *t = host_tensor(a, 2, (size_t)nb * (size_t)nb);
    if (!t) return -1;
    for (int32_t i = 0; i < nb * nb; i++) t[i] = tu_rng_int(rng, 0, 3) != 0;
    a->values[0] = fi_variant_i32(block);
    a->values[1] = fi_variant_i32(nb);
    return 0;
}

int vx_make_args(int i, tu_rng *rng, const vx_shape *sh, vx_args *a) {
    memset(a, 0, sizeof *a);
    a->num_values = vx_spec(i)->num_params;
    size_t heads = (size_t)sh->num_qo_heads;
    float *f;
    switch (i) {
    case VX_SIGMOID:
        a->values[0] = fi_variant_f32((float)tu_rng_range(rng, -1.0, 1.0));
        return 0;
    case VX_SINK:
        if (!(f = host_tensor(a, 0, heads * sizeof(float)))) return -1;
        for (size_t h = 0; h < heads; h++) f[h] = (float)tu_rng_range(rng, -2.0, 3.0);
        return 0;
    case VX_BLOCK_MASK:
        return make_block_mask(rng, sh, a);
    case VX_STREAMING:
        a->values[0] = fi_variant_i32(tu_rng_int(rng, 1, 6));
        a->values[1] = fi_variant_i32(tu_rng_int(rng, 8, 64));
        a->values[2] = fi_variant_f32(1e4f);
        return 0;
    case VX_HEAD_SCALE:
        if (!(f = host_tensor(a, 0, heads * sizeof(float)))) return -1;
        for (size_t h = 0; h < heads; h++) f[h] = (float)tu_rng_range(rng, 0.25, 2.0);
        return 0;
    case VX_ALL_HOOKS: {
        uint16_t *qs = host_tensor(a, 0, 256 * sizeof(uint16_t));
        int32_t *sh_ = host_tensor(a, 1, heads * sizeof(int32_t));
        if (!qs || !sh_) return -1;
        for (int d = 0; d < 256; d++) qs[d] = tu_f32_to_bf16((float)tu_rng_range(rng, 0.5, 1.5));
        for (size_t h = 0; h < heads; h++) sh_[h] = tu_rng_int(rng, 0, 100);
        a->values[2] = fi_variant_f32((float)tu_rng_range(rng, 0.05, 0.2));
        a->values[3] = fi_variant_f32((float)tu_rng_range(rng, 0.7, 1.5));
        a->values[4] = fi_variant_i32(tu_rng_int(rng, 3, 7));
        return 0;
    }
    }
    return -1;
}

void vx_args_free(vx_args *a) {
    for (int k = 0; k < FI_VARIANT_MAX_PARAMS; k++) free(a->host[k]);
    memset(a, 0, sizeof *a);
}

fi_variant_args vx_variant_args(const vx_args *a) {
    fi_variant_args r = {a->num_values, a->values};
    return r;
}

/* ----------------------------------------------------------------- oracle */

int vx_oracle(const fi_variant *variant, const fi_variant_args *args,
              const fi_attention_params *params, const fi_batch *batch, const fi_tensor *q,
              const fi_tensor *k, const fi_tensor *v, const uint8_t *custom_mask, double *o,
              double *lse) {
    if (!fi_cc_available(NULL)) return -2;
    const fi_vk_hooks *hooks;
    void *handle;
    fi_status st = fi_cpu_variant_hooks(variant, &hooks, &handle);
    if (st) {
        tu_note("oracle hooks of %s: %s: %s", fi_variant_get_spec(variant)->name,
                fi_status_string(st), fi_last_error());
        return -1;
    }
    void *packed = calloc(1, (size_t)variant->params_size);
    int rc = -1;
    if (packed && fi_variant_check_args(variant, args) == FI_OK) {
        if (variant->spec.num_params) fi_variant_pack(variant, args, packed);
        rc = oracle_attention_hooks(params, batch, q, k, v, custom_mask, hooks, packed, o, lse);
    }
    free(packed);
    dlclose(handle);
    return rc;
}
