/*
 * select.c — the one place that chooses CUDA kernels. From a plan's kernel
 * configuration, its bounds and the context's settings, fi_cuda_select
 * computes once, at plan creation, the table of kernel forms the plan may
 * launch (each form's spec and dynamic shared memory) and the facts a run
 * chooses a form by; plan.c loads the whole table in one JIT/AOT step and
 * run.c picks a row per run. A new kernel family is a spec (spec.c), a
 * predicate here and a row of the table.
 */
#include "cuda/cuda_backend.h"
#include "../../kernels/fi_args.h" /* FI_VH_* */

#include <string.h>

/* The tensor-core kernels (attention_tc.cuh, and the persistent kernel's
 * tensor-core path): Q and KV one 16-bit dtype (FP8 and f32 KV stay on
 * CUDA cores), O any of f32/f16/bf16, head dims 64 or 128, no fused RoPE. */
static bool tc_supported(const fi_attn_config *c, const fi_cuda_tuning *t) {
    if (t->kernels == FI_CUDA_KERNELS_CUDA_CORES) return false;
    const bool dt = (c->qt == FI_DTYPE_F16 || c->qt == FI_DTYPE_BF16) && c->kvt == c->qt;
    const bool dims = (c->dqk == 64 || c->dqk == 128) && (c->dvo == 64 || c->dvo == 128);
    return dt && dims && c->pos != FI_POS_ROPE_LLAMA;
}

/* The Hopper prefill kernel (attention_wg.cuh), on sm_90a in place of the
 * standalone tensor-core kernel: 16-bit Q and KV of one dtype, head dims 64,
 * 128 or 256, or 192 x 128 (DeepSeek's prefill; the kernel's 64-column
 * panels), every mask and logits hook; not built-in RoPE, nor a user's row
 * or output hooks (attention_tc.cuh runs those). Where only this kernel has
 * tensor cores (d 256, 192 x 128) the persistent kernel has none, and
 * batches with tensor-core items take the separate kernels (run.c). */
static bool wg_supported(const fi_attn_config *c, const fi_cuda_tuning *t) {
    if (!t->wgmma || t->kernels == FI_CUDA_KERNELS_CUDA_CORES) return false;
    const bool dt = (c->qt == FI_DTYPE_F16 || c->qt == FI_DTYPE_BF16) && c->kvt == c->qt;
    const bool dims = ((c->dqk == 64 || c->dqk == 128 || c->dqk == 256) &&
                       (c->dvo == 64 || c->dvo == 128 || c->dvo == 256)) ||
                      (c->dqk == 192 && c->dvo == 128);
    const int rows = FI_VH_QUERY | FI_VH_KEY | FI_VH_VALUE | FI_VH_OUTPUT;
    return dt && dims && c->pos != FI_POS_ROPE_LLAMA && !(c->vhooks & rows);
}

/* Decode version 3 (decode_tc.cuh): 16-bit Q with K/V of its dtype or FP8
 * (widened in the kernel), head dims 64, 128 or 256 (qk and vo apart;
 * 256 only in the decode form, where tc_supported is false), without a
 * custom mask, a position encoding, a logit transform or a user variant. */
static bool dtc_supported(const fi_attn_config *c, const fi_cuda_tuning *t) {
    if (t->kernels == FI_CUDA_KERNELS_CUDA_CORES) return false;
    const bool q16 = c->qt == FI_DTYPE_F16 || c->qt == FI_DTYPE_BF16;
    const bool kv = c->kvt == c->qt || c->kvt == FI_DTYPE_E4M3 || c->kvt == FI_DTYPE_E5M2;
    const bool dims = (c->dqk == 64 || c->dqk == 128 || c->dqk == 256) &&
                      (c->dvo == 64 || c->dvo == 128 || c->dvo == 256);
    return q16 && kv && dims && c->mask != FI_MASK_CUSTOM && !c->softcap &&
           c->pos == FI_POS_NONE && !c->vname;
}

/* The persistent kernel's full form runs its small items on decode version
 * 3 beside its tensor-core path. */
static bool decode_tc_supported(const fi_attn_config *c, const fi_cuda_tuning *t) {
    return tc_supported(c, t) && dtc_supported(c, t);
}

/* The decode form, decode version 3 alone (without the full form's register
 * spills; FP8 K/V: the only tensor-core path): where a GQA group's rows fit
 * one m16 tile. */
static bool decode_form_supported(const fi_attn_config *c, const fi_cuda_tuning *t) {
    return t->kernels != FI_CUDA_KERNELS_FULL_FORM && dtc_supported(c, t) &&
           c->group <= FI_CUDA_DTC_MAX_ROWS;
}

/* The persistent kernel runs the built-in configurations; a user variant's
 * plan runs the separate kernels (its merge may carry an output hook, the
 * persistent kernel's fused merge is the built-in one). */
static bool persistent_supported(const fi_attn_config *c, const fi_cuda_tuning *t) {
    return t->kernels != FI_CUDA_KERNELS_SEPARATE && !c->vname;
}

/* A 128-row (or c->tc_block = 64-row) Q block + 2 stages of 64 keys of K and
 * V, 16-bit, + two tiles of K/V offsets (64 x 16 bytes each). */
static int attn_tc_smem(const fi_attn_config *c) {
    const int rows = c->tc_block == 64 ? 64 : 128;
    return rows * c->dqk * 2 + 2 * 64 * (c->dqk + c->dvo) * 2 + 2 * 64 * 16;
}

/* The larger of the tensor-core path's bytes and 48 KB, the most any
 * CUDA-core configuration uses (attention.cuh asserts it). */
static int persist_smem(const fi_attn_config *c, bool tc) {
    const int bytes = tc ? attn_tc_smem(c) : 0;
    return bytes > 48 * 1024 ? bytes : 48 * 1024;
}

/* attention_wg.cuh's SMEM_BYTES: 1024 bytes of alignment room, a 128-row Q
 * block, 2 stages of BN keys of K and V (BN = 64 where a head dim is 256,
 * else 128), their offset tables (16 bytes a key) and 4 mbarriers. */
static int attn_wg_smem(const fi_attn_config *c) {
    const int bn = c->dqk > 192 || c->dvo > 128 ? 64 : 128;
    return 1024 + 128 * c->dqk * 2 + 2 * bn * (c->dqk + c->dvo) * 2 + 2 * bn * 16 + 32;
}

/* decode_tc.cuh's SMEM_D at most: a 16-row Q tile + 3 stages of 64 keys of
 * K and V, 16-bit (it uses two; the room for a third still leaves two CTAs
 * per SM; FP8 K/V: one 16-bit tile and four FP8 stages, the same bytes);
 * where D_qk + D_vo > 256 (its SPLIT form) 3 stages of 32 keys and the
 * tile's scores, 16 x 40 f32: 104 KB + 2.5 KB at d 256. */
static int decode_smem(const fi_attn_config *c) {
    const bool split = c->dqk + c->dvo > 256;
    const int bn = split ? 32 : 64;
    return 16 * c->dqk * 2 + 3 * bn * (c->dqk + c->dvo) * 2 + (split ? 16 * (bn + 8) * 4 : 0);
}

static fi_kernel_spec *row(fi_cuda_selection *sel, fi_cuda_form f, int smem) {
    sel->forms |= 1u << f;
    sel->smem[f] = smem;
    sel->threads[f] = 128;
    return &sel->spec[f];
}

void fi_cuda_select(const fi_attn_config *c, int64_t max_rows, const fi_cuda_tuning *t,
                    fi_cuda_selection *sel) {
    memset(sel, 0, sizeof *sel);
    const bool tc = tc_supported(c, t), wg = wg_supported(c, t);
    sel->tc_path = tc || wg;
    sel->tc_block = 128;
    if (persistent_supported(c, t)) {
        fi_attn_config full = *c;
        /* 17-64 packed rows at most (a cascade's shared level): 64-row
         * blocks, as a 128-row block would be half idle; at most 16 never
         * reach the full form */
        if (tc && max_rows > FI_CUDA_DTC_MAX_ROWS && max_rows <= 64) full.tc_block = 64;
        sel->tc_block = full.tc_block == 64 ? 64 : 128;
        sel->decode_tc = decode_tc_supported(c, t);
        fi_cuda_persist_spec(&full, tc, sel->decode_tc,
                             row(sel, FI_CUDA_FORM_PERSIST, persist_smem(&full, tc)));
        if (decode_form_supported(c, t)) {
            fi_cuda_persist_spec(c, 0, 1, row(sel, FI_CUDA_FORM_PERSIST_DECODE, decode_smem(c)));
            /* beside the decode form, for batches of mostly decode work
             * whose wide items would spill in the 128-row full form */
            if (tc && full.tc_block != 64) {
                fi_attn_config mixed = *c;
                mixed.tc_block = 64;
                fi_cuda_persist_spec(&mixed, 1, 1,
                                     row(sel, FI_CUDA_FORM_PERSIST_MIXED,
                                         persist_smem(&mixed, true)));
            }
        }
        /* tensor-core-only batches (prefill) on the standalone tensor-core
         * kernel, measured faster than inside the persistent kernel, whose
         * full form spills; not with 64-row blocks, where its 128-row
         * blocks would be half idle */
        sel->prefill_separate = (tc || wg) && sel->tc_block == 128;
        /* where the persistent kernel has no tensor-core path (head dim
         * 256, 192 x 128 on sm_90a), any batch with tensor-core items takes
         * the separate kernels */
        sel->persist_tc = tc;
        /* the separate kernels also take the runs decode version 3 cannot
         * (K/V rows not 16-byte copyable, pages not a power of two); a plan
         * that needs neither stops here */
        if (!sel->decode_tc && !sel->prefill_separate) return;
    }
    fi_cuda_attn_spec(c, row(sel, FI_CUDA_FORM_ATTN, 0));
    if (wg) {
        fi_cuda_attn_wg_spec(c, row(sel, FI_CUDA_FORM_ATTN_TC, attn_wg_smem(c)));
        sel->threads[FI_CUDA_FORM_ATTN_TC] = 384;
    } else if (tc) {
        fi_attn_config sep = *c;
        sep.tc_block = 0;
        fi_cuda_attn_tc_spec(c, row(sel, FI_CUDA_FORM_ATTN_TC, attn_tc_smem(&sep)));
    }
    fi_cuda_merge_spec_of(c, row(sel, FI_CUDA_FORM_MERGE, 0));
}

int fi_cuda_plan_specs(const fi_attention_params *p, const char *arch, int device_table,
                       int64_t max_rows, const char *vsrc, fi_kernel_spec specs[FI_CUDA_FORM_COUNT], int *vhooks) {
    fi_attn_config cfg;
    fi_cuda_attn_config(p, p->num_qo_heads / p->num_kv_heads, device_table, &cfg);
    if (p->variant) fi_cuda_attn_set_variant(&cfg, p->variant, vsrc);
    if (vhooks) *vhooks = cfg.vhooks;
    fi_cuda_tuning t;
    fi_cuda_tuning_read(&t);
    t.wgmma = fi_cuda_arch_wgmma(arch);
    fi_cuda_selection sel;
    fi_cuda_select(&cfg, max_rows, &t, &sel);
    int n = 0;
    for (int f = 0; f < FI_CUDA_FORM_COUNT; f++)
        if (fi_cuda_has_form(&sel, (fi_cuda_form)f)) specs[n++] = sel.spec[f];
    return n;
}
