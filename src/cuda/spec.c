/* spec.c — kernel configurations: from attention params to the entry-point
 * name (which encodes the configuration) and the -D options of the sources.
 * Which kernels a plan runs is select.c's. */
#include "cuda/cuda_backend.h"
#include "core/cache.h"
#include "core/variant.h"
#include "../../kernels/fi_args.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The kernels test FI_MASK and FI_POS against these codes. */
_Static_assert(FI_MASK_NONE == 0 && FI_MASK_CAUSAL == 1 && FI_MASK_CUSTOM == 2 &&
                   FI_POS_NONE == 0 && FI_POS_ROPE_LLAMA == 1 && FI_POS_ALIBI == 2,
               "kernel codes of mask_mode and pos_encoding");

void fi_cuda_spec_define(fi_kernel_spec *s, const char *fmt, ...) {
    if (s->num_defines >= FI_SPEC_MAX_DEFINES) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->defines[s->num_defines++], sizeof s->defines[0], fmt, ap);
    va_end(ap);
}

void fi_cuda_attn_config(const fi_attention_params *p, int32_t group, int device_table,
                         fi_attn_config *c) {
    memset(c, 0, sizeof *c);
    c->dqk = p->head_dim_qk;
    c->dvo = p->head_dim_vo;
    c->qt = (int)p->q_dtype;
    c->kvt = (int)p->kv_dtype;
    c->ot = (int)p->o_dtype;
    c->group = group;
    c->rows = group < 8 ? group : 8; /* one block holds a decode token's group */
    c->paged = p->kv_format != FI_KV_FORMAT_PAGED ? FI_CUDA_KV_RAGGED
               : device_table                     ? FI_CUDA_KV_DEVICE_TABLE
                                                  : FI_CUDA_KV_PAGED;
    c->mask = p->mask_mode;
    c->window = p->window_left >= 0;
    c->softcap = p->logits_soft_cap > 0.0f;
    c->pos = p->pos_encoding;
}

void fi_cuda_attn_set_variant(fi_attn_config *c, const fi_variant *v, const char *src) {
    static const int bits[FI_HOOK_COUNT] = {FI_VH_QUERY,  FI_VH_KEY,  FI_VH_VALUE,
                                            FI_VH_LOGITS, FI_VH_MASK, FI_VH_OUTPUT};
    c->vname = v->spec.name;
    c->vsrc = src;
    c->vhooks = v->spec.use_softmax ? 0 : FI_VH_NO_SOFTMAX;
    for (int i = 0; i < FI_HOOK_COUNT; i++)
        if (fi_variant_hook(v, (fi_hook_id)i)) c->vhooks |= bits[i];
}

void fi_cuda_arch_name(int major, int minor, const fi_cuda_tuning *t, char *buf, size_t n) {
    if (t->arch[0]) snprintf(buf, n, "%s", t->arch);
    else snprintf(buf, n, "sm_%d%d%s", major, minor, major == 9 && minor == 0 ? "a" : "");
}

/* "_v<name>_<hash of the hook text>" for a variant's kernels, "" otherwise;
 * and its -D. The name is cut to 32 characters (the hash tells apart). */
static void add_variant(const fi_attn_config *c, fi_kernel_spec *s) {
    if (!c->vsrc) return;
    uint64_t h = fi_fnv_str(FI_FNV_SEED, c->vsrc);
    size_t n = strlen(s->name);
    snprintf(s->name + n, sizeof s->name - n, "_v%.32s_%08x", c->vname,
             (unsigned)(h ^ (h >> 32)));
    s->header = c->vsrc;
    fi_cuda_spec_define(s, "-DFI_VARIANT=1");
}

/* KV source in kernel names: "dtable" is paged KV with a device page table
 * (its ids clamped) */
static const char *kv_source_name(fi_cuda_kv_source k) {
    return k == FI_CUDA_KV_DEVICE_TABLE ? "dtable" : k == FI_CUDA_KV_PAGED ? "paged" : "ragged";
}

/* fi_attn_d128x128_q2k2o2_g4r4_paged_m0w0c0p0 */
void fi_cuda_attn_spec(const fi_attn_config *c, fi_kernel_spec *s) {
    memset(s, 0, sizeof *s);
    s->entry_file = "attention.cuh";
    snprintf(s->name, sizeof s->name, "fi_attn_d%dx%d_q%dk%do%d_g%dr%d_%s_m%dw%dc%dp%d", c->dqk,
             c->dvo, c->qt, c->kvt, c->ot, c->group, c->rows, kv_source_name(c->paged),
             (int)c->mask, c->window, c->softcap, (int)c->pos);
    add_variant(c, s);
    fi_cuda_spec_define(s, "-DFI_DQK=%d", c->dqk);
    fi_cuda_spec_define(s, "-DFI_DVO=%d", c->dvo);
    fi_cuda_spec_define(s, "-DFI_QT=%d", c->qt);
    fi_cuda_spec_define(s, "-DFI_KVT=%d", c->kvt);
    fi_cuda_spec_define(s, "-DFI_OT=%d", c->ot);
    fi_cuda_spec_define(s, "-DFI_GROUP=%d", c->group);
    fi_cuda_spec_define(s, "-DFI_ROWS=%d", c->rows);
    fi_cuda_spec_define(s, "-DFI_PAGED=%d", (int)c->paged);
    fi_cuda_spec_define(s, "-DFI_MASK=%d", (int)c->mask);
    fi_cuda_spec_define(s, "-DFI_WINDOW=%d", c->window);
    fi_cuda_spec_define(s, "-DFI_SOFTCAP=%d", c->softcap);
    fi_cuda_spec_define(s, "-DFI_POS=%d", (int)c->pos);
    fi_cuda_spec_define(s, "-DFI_ATTN_NAME=%s", s->name);
}

/* fi_merge_d128_o2 */
void fi_cuda_merge_spec(int dvo, int ot, fi_kernel_spec *s) {
    memset(s, 0, sizeof *s);
    s->entry_file = "merge.cuh";
    snprintf(s->name, sizeof s->name, "fi_merge_d%d_o%d", dvo, ot);
    fi_cuda_spec_define(s, "-DFI_DVO=%d", dvo);
    fi_cuda_spec_define(s, "-DFI_OT=%d", ot);
    fi_cuda_spec_define(s, "-DFI_MERGE_NAME=%s", s->name);
}

/* fi_merge_d128_o2_vsink_1a2b3c4d: a variant whose merge differs (output
 * hook, or partial sums that add) */
void fi_cuda_merge_spec_of(const fi_attn_config *c, fi_kernel_spec *s) {
    fi_cuda_merge_spec(c->dvo, c->ot, s);
    if (!(c->vhooks & (FI_VH_OUTPUT | FI_VH_NO_SOFTMAX))) return;
    s->num_defines--; /* the name define is redone */
    add_variant(c, s);
    fi_cuda_spec_define(s, "-DFI_MERGE_NAME=%s", s->name);
}

/* fi_attn_tc_d128x128_q2o2_g4_paged_m1w0c0p0 */
/* The tensor-core kernels' options: attention_tc.cuh's (prefix "fi_attn_tc",
 * entry FI_ATTN_TC_NAME) and attention_wg.cuh's ("fi_attn_wg", FI_ATTN_WG_NAME). */
static void tc_options(const fi_attn_config *c, const char *file, const char *prefix,
                       const char *entry, fi_kernel_spec *s) {
    memset(s, 0, sizeof *s);
    s->entry_file = file;
    snprintf(s->name, sizeof s->name, "%s_d%dx%d_q%do%d_g%d_%s_m%dw%dc%dp%d", prefix, c->dqk,
             c->dvo, c->qt, c->ot, c->group, kv_source_name(c->paged), (int)c->mask, c->window,
             c->softcap, (int)c->pos);
    add_variant(c, s);
    fi_cuda_spec_define(s, "-DFI_DQK=%d", c->dqk);
    fi_cuda_spec_define(s, "-DFI_DVO=%d", c->dvo);
    fi_cuda_spec_define(s, "-DFI_QT=%d", c->qt);
    fi_cuda_spec_define(s, "-DFI_OT=%d", c->ot);
    fi_cuda_spec_define(s, "-DFI_GROUP=%d", c->group);
    fi_cuda_spec_define(s, "-DFI_PAGED=%d", (int)c->paged);
    fi_cuda_spec_define(s, "-DFI_MASK=%d", (int)c->mask);
    fi_cuda_spec_define(s, "-DFI_WINDOW=%d", c->window);
    fi_cuda_spec_define(s, "-DFI_SOFTCAP=%d", c->softcap);
    fi_cuda_spec_define(s, "-DFI_POS=%d", (int)c->pos);
    fi_cuda_spec_define(s, "-D%s=%s", entry, s->name);
}

void fi_cuda_attn_tc_spec(const fi_attn_config *c, fi_kernel_spec *s) {
    tc_options(c, "attention_tc.cuh", "fi_attn_tc", "FI_ATTN_TC_NAME", s);
}

void fi_cuda_attn_wg_spec(const fi_attn_config *c, fi_kernel_spec *s) {
    tc_options(c, "attention_wg.cuh", "fi_attn_wg", "FI_ATTN_WG_NAME", s);
}

bool fi_cuda_arch_wgmma(const char *arch) {
    return !strcmp(arch, "sm_90a") || !strcmp(arch, "compute_90a");
}

/* fi_pers_d128x128_q2k2o2_g4r4_paged_m0w0c0p0_t1d1 (and _b64): attention.cuh's
 * options, FI_TC, FI_DTC, and the entry point's name. */
void fi_cuda_persist_spec(const fi_attn_config *c, int tc, int dtc, fi_kernel_spec *s) {
    fi_cuda_attn_spec(c, s);
    const bool b64 = tc && c->tc_block == 64;
    char name[sizeof s->name];
    snprintf(name, sizeof name, "fi_pers_%.70s_t%dd%d%s", s->name + strlen("fi_attn_"), tc, dtc,
             b64 ? "_b64" : "");
    memcpy(s->name, name, sizeof s->name);
    s->entry_file = "persistent.cuh";
    for (int i = 0; i < s->num_defines; i++)
        if (!strncmp(s->defines[i], "-DFI_ATTN_NAME=", 15))
            snprintf(s->defines[i], sizeof s->defines[i], "-DFI_PERSIST_NAME=%.96s", s->name);
    fi_cuda_spec_define(s, "-DFI_TC=%d", tc);
    fi_cuda_spec_define(s, "-DFI_DTC=%d", dtc);
    if (b64) fi_cuda_spec_define(s, "-DFI_TC_MT=1");
}
