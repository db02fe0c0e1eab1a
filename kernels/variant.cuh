/*
 * variant.cuh — the hook points of the attention kernels (attention.cuh,
 * attention_tc.cuh, merge.cuh): what a variant may change, as the six hook
 * functions of docs/VARIANTS.md over fi_hook_ctx and fi_variant_params:
 *
 *   fi_query_transform(x, c, p)   a q row (f32, in/out), once per row block
 *   fi_key_transform(x, c, p)     a k row, once per key tile and row block
 *   fi_value_transform(x, c, p)   a v row, idem
 *   fi_logits_transform(s, c, p)  s = sm_scale * q.k -> logit (or weight)
 *   fi_logits_mask(c, p)          non-zero: key kv_pos visible to q_pos
 *   fi_output_transform(o, lse, c, p)  the final row, once (after merging)
 *
 * Two builds of the same kernels:
 *
 * - FI_VARIANT = 0 (default): the built-ins, chosen by the -D constants the
 *   kernels always had (FI_SOFTCAP, FI_POS, FI_MASK == 2, FI_WINDOW), are
 *   these hooks, defined below; a hook the configuration does not use is
 *   never called (fi_v::HAS_* is a compile-time constant), so the identity
 *   costs nothing and a built-in costs what its inline code did.
 * - FI_VARIANT = 1: a user's variant. The host passes the hook text of
 *   fi_variant_source(..., FI_VARIANT_TARGET_CUDA) as the NVRTC header
 *   "fi_variant_hooks.cuh" (fi_hook_ctx, fi_variant_params, the six hooks,
 *   FI_VARIANT_HAS_* and FI_VARIANT_USE_SOFTMAX, from which FI_VHOOKS, the
 *   bit set of the hooks it has, follows: FI_VH_* below). Causal and window
 *   masks still apply (plan params).
 *
 * Built-in fused RoPE is a row transform of q and k (rotate_half at q_pos /
 * kv_pos); the CUDA-core kernel applies it element-wise (fi_rope_pair),
 * lane-parallel, with exact angles (frequencies as hi + lo floats). A
 * user's row hook runs one thread per row over a private f32 copy of the
 * row, rows spread over the CTA's warps; hooks may call fi_rope_row (the
 * rope_llama spec and the streaming example do). The tensor-core kernel
 * runs user row hooks on its shared-memory tiles (16-bit) and not the
 * built-in RoPE (CUDA cores).
 *
 * Per-run values: fi_attn_args.vparams is the raw bytes of
 * fi_variant_params, laid out by the host with C's rules (float, int32_t,
 * pointers, in the spec's order; src/cuda/variant.c).
 */
#ifndef FI_VARIANT_CUH
#define FI_VARIANT_CUH

#include "prelude.cuh"

#ifndef FI_VARIANT
#define FI_VARIANT 0
#endif

/* FI_VHOOKS bits: FI_VH_* in fi_args.h */

/* merge.cuh has none of these */
#ifndef FI_SOFTCAP
#define FI_SOFTCAP 0
#endif
#ifndef FI_POS
#define FI_POS 0
#endif
#ifndef FI_MASK
#define FI_MASK 0
#endif
#ifndef FI_WINDOW
#define FI_WINDOW 0
#endif

/* Custom mask bit of (q_pos, kv_pos): bit0 is the request's first bit, rows
 * of kv_len bits per query. */
FI_DEV bool fi_mask_bit(const uint8_t *mask, int64_t bit0, int q_pos, int kv_pos, int qo_len,
                        int kv_len) {
    const int64_t bit = bit0 + (int64_t)(q_pos - kv_len + qo_len) * kv_len + kv_pos;
    return (mask[bit >> 3] >> (bit & 7)) & 1;
}

/* LLaMA RoPE (rotate_half), the built-in's parts: the pair (x[i],
 * x[i + D/2]) turns by pos * f_i, f_i = theta^(-2i / D) / scale, f_i in
 * double once per thread and dimension (fi_rope_sincos: the angle exact). */
FI_DEV fi_rope_f fi_rope_freq(float theta, float scale, int i, int dim) {
    return fi_rope_split(pow((double)theta, -2.0 * i / dim) / (double)scale);
}
/* One element of the rotated row: x the element, xp its partner, lo whether
 * x is in the first half. */
FI_DEV float fi_rope_pair(float x, float xp, bool lo, fi_rope_f f, int pos) {
    float sn, cs;
    fi_rope_sincos(pos, f, &sn, &cs);
    return lo ? x * cs - xp * sn : x * cs + xp * sn;
}

/* For variant hooks (VARIANT_API.md): x, a row of dim floats, rotated as
 * LLaMA RoPE on halves at pos. The angle is the f32 one of the hooks' C
 * build (src/core/variant.c), (pos / scale) * 2^(-2k/dim log2 theta); its
 * sin/cos by fi_sincos_fast. */
FI_DEV void fi_rope_row(float *x, int32_t dim, int32_t pos, float scale, float theta) {
    const int32_t half = dim / 2;
    const float lt = log2f(theta), p = (float)pos / scale;
    for (int32_t k = 0; k < half; k++) {
        const float a = p * exp2f((float)(-2 * k) / (float)dim * lt);
        float sn, cs;
        fi_sincos_fast(a, 0.0f, &sn, &cs);
        const float x0 = x[k], x1 = x[k + half];
        x[k] = x0 * cs - x1 * sn;
        x[k + half] = x1 * cs + x0 * sn;
    }
}

#if FI_VARIANT

#include "fi_variant_hooks.cuh"
#ifndef FI_VHOOKS /* from the generated text's FI_VARIANT_HAS_* */
#define FI_VHOOKS                                                              \
    ((FI_VARIANT_HAS_QUERY_TRANSFORM ? FI_VH_QUERY : 0) |                      \
     (FI_VARIANT_HAS_KEY_TRANSFORM ? FI_VH_KEY : 0) |                          \
     (FI_VARIANT_HAS_VALUE_TRANSFORM ? FI_VH_VALUE : 0) |                      \
     (FI_VARIANT_HAS_LOGITS_TRANSFORM ? FI_VH_LOGITS : 0) |                    \
     (FI_VARIANT_HAS_LOGITS_MASK ? FI_VH_MASK : 0) |                           \
     (FI_VARIANT_HAS_OUTPUT_TRANSFORM ? FI_VH_OUTPUT : 0) |                    \
     (FI_VARIANT_USE_SOFTMAX ? 0 : FI_VH_NO_SOFTMAX))
#endif

#else /* the built-ins */

#define FI_HOOK __device__ __forceinline__

typedef struct fi_hook_ctx {
    int32_t request, qo_head, kv_head;
    int32_t q_pos, kv_pos;
    int32_t qo_len, kv_len;
    int32_t head_dim;
    float sm_scale;
    float alibi_slope; /* built-ins only: slopes[qo_head], loaded once per row
                          by the kernels (fi_v::row_slope) */
} fi_hook_ctx;

/* The built-in specs' parameters, filled by the kernels from fi_attn_args
 * (and mask_bit0 per request). */
typedef struct fi_variant_params {
    float cap, cap_rcp;         /* soft-cap c, 1 / c */
    const float *slopes;        /* ALiBi [H_qo] */
    int32_t window_left;        /* sliding window */
    const uint8_t *mask;        /* custom mask bits */
    int64_t mask_bit0;          /* first bit of this request's segment */
    float rope_scale, rope_theta;
} fi_variant_params;

/* soft-cap then ALiBi: logits leave the log2 domain */
FI_HOOK float fi_logits_transform(float s, const fi_hook_ctx *c, const fi_variant_params *p) {
    if (FI_SOFTCAP) s = p->cap * tanhf(s * p->cap_rcp);
    if (FI_POS == 2) s = fmaf(c->alibi_slope, (float)(c->kv_pos - c->q_pos), s); /* p->slopes[qo_head] */
    return s;
}

/* sliding window and custom mask bits (causal is the kernels' own: it
 * also decides which tiles are loaded) */
FI_HOOK int fi_logits_mask(const fi_hook_ctx *c, const fi_variant_params *p) {
    bool keep = true;
    if (FI_WINDOW) keep = c->kv_pos >= c->q_pos - p->window_left;
    if (FI_MASK == 2)
        keep = keep && fi_mask_bit(p->mask, p->mask_bit0, c->q_pos, c->kv_pos, c->qo_len, c->kv_len);
    return keep;
}

FI_HOOK void fi_query_transform(float *x, const fi_hook_ctx *c, const fi_variant_params *p) {
    if (FI_POS == 1) fi_rope_row(x, c->head_dim, c->q_pos, p->rope_scale, p->rope_theta);
}
FI_HOOK void fi_key_transform(float *x, const fi_hook_ctx *c, const fi_variant_params *p) {
    if (FI_POS == 1) fi_rope_row(x, c->head_dim, c->kv_pos, p->rope_scale, p->rope_theta);
}
FI_HOOK void fi_value_transform(float *, const fi_hook_ctx *, const fi_variant_params *) {}
FI_HOOK void fi_output_transform(float *, float, const fi_hook_ctx *, const fi_variant_params *) {}

/* Built-ins: logits hook for soft-cap / ALiBi, mask hook for custom bits
 * and the window; RoPE is applied element-wise (fi_rope_pair) by the
 * CUDA-core kernel (FI_POS == 1), so it is not among the row hooks. */
#define FI_VHOOKS                                                        \
    ((FI_SOFTCAP || FI_POS == 2 ? FI_VH_LOGITS : 0) |                    \
     (FI_MASK == 2 || FI_WINDOW ? FI_VH_MASK : 0))

#endif /* FI_VARIANT */

namespace fi_v {
constexpr bool QUERY = (FI_VHOOKS & FI_VH_QUERY) != 0;
constexpr bool KEY = (FI_VHOOKS & FI_VH_KEY) != 0;
constexpr bool VALUE = (FI_VHOOKS & FI_VH_VALUE) != 0;
constexpr bool LOGITS = (FI_VHOOKS & FI_VH_LOGITS) != 0;
constexpr bool MASK = (FI_VHOOKS & FI_VH_MASK) != 0;   /* per-element mask hook */
constexpr bool OUTPUT = (FI_VHOOKS & FI_VH_OUTPUT) != 0;
constexpr bool SOFTMAX = (FI_VHOOKS & FI_VH_NO_SOFTMAX) == 0;
constexpr bool USER = FI_VARIANT != 0;
/* a mask other than causal and the window (which the kernels also check per
 * tile): custom bits or a user's mask hook */
constexpr bool ELEM_MASK = FI_MASK == 2 || (USER && MASK);
/* some per-element mask besides causal */
constexpr bool ANY_MASK = ELEM_MASK || FI_WINDOW;
/* logits leave the log2 domain: q carries sm_scale only */
constexpr bool NATURAL = LOGITS || !SOFTMAX;
constexpr float LN2 = 0.69314718055994531f;

/* The per-run parameters from the launch's bytes (fi_attn_args.vparams). */
FI_DEV fi_variant_params params(const fi_attn_args &a, const float *alibi) {
#if FI_VARIANT
    static_assert(sizeof(fi_variant_params) <= sizeof(a.vparams), "variant parameters");
    union {
        fi_variant_params p;
        uint64_t w[sizeof(a.vparams) / 8];
    } u;
#pragma unroll
    for (int i = 0; i < (int)((sizeof(fi_variant_params) + 7) / 8); i++) u.w[i] = a.vparams[i];
    return u.p;
#else
    fi_variant_params p;
    p.cap = a.softcap;
    p.cap_rcp = a.softcap_rcp;
    p.slopes = alibi;
    p.window_left = a.window_left;
    p.mask = a.mask;
    p.mask_bit0 = 0;
    p.rope_scale = a.rope_scale;
    p.rope_theta = a.rope_theta;
    return p;
#endif
}
/* The first bit of a request's custom mask segment (0 without one). */
FI_DEV int64_t mask_bit0(fi_variant_params &p, const int64_t *mask_offset, int req) {
    if (FI_MASK != 2) return 0;
    const int64_t b = mask_offset[req] * 8;
#if !FI_VARIANT
    p.mask_bit0 = b;
#endif
    return b;
}

/* ALiBi's slope of a row, hoisted out of the key loops (0 otherwise). */
FI_DEV float row_slope(const fi_variant_params &p, int qo_head) {
#if !FI_VARIANT
    if (FI_POS == 2) return __ldg(p.slopes + qo_head);
#endif
    return 0.0f;
}

FI_DEV void set_slope(fi_hook_ctx &c, float slope) {
#if !FI_VARIANT
    c.alibi_slope = slope;
#endif
}

FI_DEV fi_hook_ctx ctx(int req, int qo_head, int kv_head, int q_pos, int kv_pos, int qo_len,
                       int kv_len, int head_dim, float sm_scale, float slope = 0.0f) {
    fi_hook_ctx c;
    c.request = req;
    c.qo_head = qo_head;
    c.kv_head = kv_head;
    c.q_pos = q_pos;
    c.kv_pos = kv_pos;
    c.qo_len = qo_len;
    c.kv_len = kv_len;
    c.head_dim = head_dim;
    c.sm_scale = sm_scale;
#if !FI_VARIANT
    c.alibi_slope = slope;
#endif
    return c;
}

/* Calls that exist only where the hook does (dependent on P, so a hook the
 * configuration lacks is never looked up). */
template <class P>
FI_DEV void query(float *x, const fi_hook_ctx &c, const P &p) {
    if constexpr (QUERY) fi_query_transform(x, &c, &p);
}
template <class P>
FI_DEV void key(float *x, const fi_hook_ctx &c, const P &p) {
    if constexpr (KEY) fi_key_transform(x, &c, &p);
}
template <class P>
FI_DEV void value(float *x, const fi_hook_ctx &c, const P &p) {
    if constexpr (VALUE) fi_value_transform(x, &c, &p);
}
template <class P>
FI_DEV float logits(float s, const fi_hook_ctx &c, const P &p) {
    if constexpr (LOGITS) return fi_logits_transform(s, &c, &p);
    else return s;
}
/* Window, custom bits and a user's mask hook (built-ins: the first two are
 * the mask hook). Causal is the kernels' own. */
template <class P>
FI_DEV bool visible(const fi_hook_ctx &c, const P &p, const fi_attn_args &a, int64_t bit0) {
#if FI_VARIANT
    bool keep = true;
    if (FI_WINDOW) keep = c.kv_pos >= c.q_pos - a.window_left;
    if (FI_MASK == 2)
        keep = keep && fi_mask_bit(a.mask, bit0, c.q_pos, c.kv_pos, c.qo_len, c.kv_len);
    if constexpr (MASK) keep = keep && fi_logits_mask(&c, &p) != 0;
    return keep;
#else
    return fi_logits_mask(&c, &p) != 0;
#endif
}
template <class P>
FI_DEV void output(float *o, float lse_log2, const fi_hook_ctx &c, const P &p) {
    if constexpr (OUTPUT) fi_output_transform(o, SOFTMAX ? lse_log2 * LN2 : 0.0f, &c, &p);
}
} /* namespace fi_v */

#endif /* FI_VARIANT_CUH */
