/* params.c — defaults and validation of attention parameters; ALiBi slopes. */
#include "core/params.h"
#include "core/variant.h"

#include <math.h>
#include <string.h>

void fi_attention_params_init(fi_attention_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->head_dim_qk = 128;
    p->head_dim_vo = 128;
    p->kv_format = FI_KV_FORMAT_PAGED;
    p->page_size = 16;
    p->kv_layout = FI_KV_LAYOUT_NHD;
    p->q_dtype = p->kv_dtype = p->o_dtype = FI_DTYPE_F16;
    p->mask_mode = FI_MASK_NONE;
    p->window_left = -1;
    p->pos_encoding = FI_POS_NONE;
    p->rope_scale = 1.0f;
    p->rope_theta = 1e4f;
    p->k_scale = p->v_scale = 1.0f;
}

void fi_plan_config_init(fi_plan_config *c) {
    if (!c) return;
    memset(c, 0, sizeof *c);
    c->struct_size = sizeof *c;
    c->max_batch_size = 256;
    c->max_total_qo = 8192;
    c->max_total_kv = 1 << 20;
}

void fi_rope_params_init(fi_rope_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->rope_scale = 1.0f;
    p->rope_theta = 1e4f;
    p->low_freq_factor = 1.0f;
    p->high_freq_factor = 4.0f;
    p->old_context_len = 8192.0f;
}

float fi_alibi_slope(int32_t h, int32_t num_heads) {
    int32_t n = 1;
    while (n * 2 <= num_heads) n *= 2; /* largest power of two <= num_heads */
    if (h < n) return exp2f(-8.0f * (float)(h + 1) / (float)n);
    return exp2f(-4.0f * (float)(2 * (h - n) + 1) / (float)n);
}

/* Head dims every backend computes. */
static bool is_head_dim(int32_t d) {
    return d == 64 || d == 80 || d == 96 || d == 128 || d == 192 || d == 256 || d == 512;
}
static bool is_float_dtype(fi_dtype t) {
    return t == FI_DTYPE_F32 || t == FI_DTYPE_F16 || t == FI_DTYPE_BF16;
}
static bool is_positive_finite(float x) { return isfinite(x) && x > 0.0f; }

#define INVALID(...) fi_error(FI_STATUS_INVALID_ARGUMENT, __VA_ARGS__)

fi_status fi_params_validate(const fi_attention_params *p) {
    if (!p) return INVALID("attention params are NULL");
    if (p->struct_size != sizeof *p)
        return INVALID("fi_attention_params.struct_size=%u, expected %zu: call "
                       "fi_attention_params_init first", (unsigned)p->struct_size, sizeof *p);
    if (p->variant) {
        fi_status st = fi_variant_check(p->variant, "fi_attention_params.variant");
        if (st) return st;
    }
    if (p->num_qo_heads <= 0 || p->num_kv_heads <= 0)
        return INVALID("num_qo_heads=%d, num_kv_heads=%d: both must be positive",
                       (int)p->num_qo_heads, (int)p->num_kv_heads);
    if (p->num_qo_heads % p->num_kv_heads)
        return INVALID("num_qo_heads=%d is not divisible by num_kv_heads=%d",
                       (int)p->num_qo_heads, (int)p->num_kv_heads);
    if (!is_head_dim(p->head_dim_qk))
        return fi_error(FI_STATUS_UNSUPPORTED,
                        "head_dim_qk=%d: supported are 64, 80, 96, 128, 192, 256, 512 "
                        "(head_dim_qk and head_dim_vo independently)", (int)p->head_dim_qk);
    if (!is_head_dim(p->head_dim_vo))
        return fi_error(FI_STATUS_UNSUPPORTED,
                        "head_dim_vo=%d: supported are 64, 80, 96, 128, 192, 256, 512 "
                        "(head_dim_qk and head_dim_vo independently)", (int)p->head_dim_vo);
    if (p->kv_format != FI_KV_FORMAT_PAGED && p->kv_format != FI_KV_FORMAT_RAGGED)
        return INVALID("kv_format=%d is not a fi_kv_format", (int)p->kv_format);
    if (p->kv_format == FI_KV_FORMAT_PAGED && p->page_size <= 0)
        return INVALID("page_size=%d: must be positive", (int)p->page_size);
    if (p->kv_layout != FI_KV_LAYOUT_NHD && p->kv_layout != FI_KV_LAYOUT_HND)
        return INVALID("kv_layout=%d is not a fi_kv_layout", (int)p->kv_layout);
    if (!is_float_dtype(p->q_dtype))
        return fi_error(FI_STATUS_UNSUPPORTED, "q_dtype=%s: supported are f32, f16, bf16",
                        fi_dtype_name(p->q_dtype));
    if (!is_float_dtype(p->o_dtype))
        return fi_error(FI_STATUS_UNSUPPORTED, "o_dtype=%s: supported are f32, f16, bf16",
                        fi_dtype_name(p->o_dtype));
    if (!is_float_dtype(p->kv_dtype) && p->kv_dtype != FI_DTYPE_E4M3 &&
        p->kv_dtype != FI_DTYPE_E5M2)
        return fi_error(FI_STATUS_UNSUPPORTED,
                        "kv_dtype=%s: supported are f32, f16, bf16, e4m3, e5m2",
                        fi_dtype_name(p->kv_dtype));
    if (p->mask_mode < FI_MASK_NONE || p->mask_mode > FI_MASK_CUSTOM)
        return INVALID("mask_mode=%d is not a fi_mask_mode", (int)p->mask_mode);
    if (p->window_left < -1)
        return INVALID("window_left=%d: use -1 for no window, else >= 0", (int)p->window_left);
    if (!isfinite(p->logits_soft_cap) || p->logits_soft_cap < 0.0f)
        return INVALID("logits_soft_cap=%g: use 0 for none, else a positive cap",
                       (double)p->logits_soft_cap);
    if (!isfinite(p->sm_scale) || p->sm_scale < 0.0f)
        return INVALID("sm_scale=%g: use 0 for 1/sqrt(head_dim_qk), else a positive scale",
                       (double)p->sm_scale);
    if (p->pos_encoding < FI_POS_NONE || p->pos_encoding > FI_POS_ALIBI)
        return INVALID("pos_encoding=%d is not a fi_pos_encoding", (int)p->pos_encoding);
    if (p->pos_encoding == FI_POS_ROPE_LLAMA &&
        (!is_positive_finite(p->rope_scale) || !is_positive_finite(p->rope_theta)))
        return INVALID("rope_scale=%g, rope_theta=%g: both must be positive",
                       (double)p->rope_scale, (double)p->rope_theta);
    if (!is_positive_finite(p->k_scale) || !is_positive_finite(p->v_scale))
        return INVALID("k_scale=%g, v_scale=%g: both must be positive", (double)p->k_scale,
                       (double)p->v_scale);
    if (p->variant && p->pos_encoding != FI_POS_NONE)
        return fi_error(FI_STATUS_UNSUPPORTED,
                        "pos_encoding=%d with variant %s: a variant plan takes its positional "
                        "encoding from its hooks (see the rope_llama and alibi built-in specs)",
                        (int)p->pos_encoding, fi_variant_get_spec(p->variant)->name);
    if (p->variant && p->logits_soft_cap != 0.0f)
        return fi_error(FI_STATUS_UNSUPPORTED,
                        "logits_soft_cap=%g with variant %s: write the cap in its "
                        "logits_transform (see the soft_cap built-in spec)",
                        (double)p->logits_soft_cap, fi_variant_get_spec(p->variant)->name);
    if (p->pos_encoding == FI_POS_ALIBI && p->alibi_slopes)
        for (int32_t h = 0; h < p->num_qo_heads; h++)
            if (!isfinite(p->alibi_slopes[h]))
                return INVALID("alibi_slopes[%d]=%g is not finite", (int)h,
                               (double)p->alibi_slopes[h]);
    return FI_OK;
}
