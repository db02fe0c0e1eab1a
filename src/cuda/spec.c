/* spec.c — kernel configurations: from attention params to the entry-point
 * name (which encodes the configuration) and the -D options of the sources. */
#include "cuda/cuda_backend.h"
#include "core/cache.h"
#include "core/variant.h"
#include "../../kernels/fi_args.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void add_define(fi_kernel_spec *s, const char *fmt, ...) FI_PRINTF(2, 3);
static void add_define(fi_kernel_spec *s, const char *fmt, ...) {
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
    c->paged = p->kv_format != FI_KV_FORMAT_PAGED ? 0 : device_table ? 2 : 1;
    c->mask = p->mask_mode == FI_MASK_CAUSAL ? 1 : p->mask_mode == FI_MASK_CUSTOM ? 2 : 0;
    c->window = p->window_left >= 0;
    c->softcap = p->logits_soft_cap > 0.0f;
    c->pos = p->pos_encoding == FI_POS_ROPE_LLAMA ? 1 : p->pos_encoding == FI_POS_ALIBI ? 2 : 0;
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

int fi_cuda_separate_specs(const fi_attention_params *p, int device_table, const char *vsrc,
                           fi_kernel_spec specs[3], int *vhooks) {
    fi_attn_config cfg;
    fi_cuda_attn_config(p, p->num_qo_heads / p->num_kv_heads, device_table, &cfg);
    if (p->variant && vsrc) fi_cuda_attn_set_variant(&cfg, p->variant, vsrc);
    if (vhooks) *vhooks = cfg.vhooks;
    fi_cuda_attn_spec(&cfg, &specs[0]);
    fi_cuda_merge_spec_of(&cfg, &specs[1]);
    if (!fi_cuda_attn_tc_supported(&cfg)) return 2;
    fi_cuda_attn_tc_spec(&cfg, &specs[2]);
    return 3;
}

void fi_cuda_arch_name(int major, int minor, char *buf, size_t n) {
    snprintf(buf, n, "sm_%d%d%s", major, minor, major == 9 && minor == 0 ? "a" : "");
    const char *env = getenv("FLASHINFER_CUDA_ARCH");
    if (env && env[0]) snprintf(buf, n, "%s", env);
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
    add_define(s, "-DFI_VARIANT=1");
}

/* KV format in kernel names: "dtable" is paged KV with a device page table
 * (FI_PAGED = 2: its ids clamped) */
static const char *kv_format_name(int paged) {
    return paged == 2 ? "dtable" : paged ? "paged" : "ragged";
}

/* fi_attn_d128x128_q2k2o2_g4r4_paged_m0w0c0p0 */
void fi_cuda_attn_spec(const fi_attn_config *c, fi_kernel_spec *s) {
    memset(s, 0, sizeof *s);
    s->entry_file = "attention.cuh";
    snprintf(s->name, sizeof s->name, "fi_attn_d%dx%d_q%dk%do%d_g%dr%d_%s_m%dw%dc%dp%d", c->dqk,
             c->dvo, c->qt, c->kvt, c->ot, c->group, c->rows, kv_format_name(c->paged),
             c->mask, c->window, c->softcap, c->pos);
    add_variant(c, s);
    add_define(s, "-DFI_DQK=%d", c->dqk);
    add_define(s, "-DFI_DVO=%d", c->dvo);
    add_define(s, "-DFI_QT=%d", c->qt);
    add_define(s, "-DFI_KVT=%d", c->kvt);
    add_define(s, "-DFI_OT=%d", c->ot);
    add_define(s, "-DFI_GROUP=%d", c->group);
    add_define(s, "-DFI_ROWS=%d", c->rows);
    add_define(s, "-DFI_PAGED=%d", c->paged);
    add_define(s, "-DFI_MASK=%d", c->mask);
    add_define(s, "-DFI_WINDOW=%d", c->window);
    add_define(s, "-DFI_SOFTCAP=%d", c->softcap);
    add_define(s, "-DFI_POS=%d", c->pos);
    add_define(s, "-DFI_ATTN_NAME=%s", s->name);
    fi_cuda_env_defines(s);
}

int fi_cuda_env_count(const char *name) {
    const char *env = getenv(name);
    const int n = env ? atoi(env) : 0;
    return n > 0 ? n : 0;
}

/* Tuning experiments and A/B runs: FLASHINFER_CUDA_DEFINES="-DFI_STAGES=4
 * -DFI_ROPE_ACCURATE=1 ..." (while room is left; part of the disk-cache key,
 * not of the name, so a context's module cache keeps the first one). */
void fi_cuda_env_defines(fi_kernel_spec *s) {
    const char *extra = getenv("FLASHINFER_CUDA_DEFINES");
    char buf[192];
    snprintf(buf, sizeof buf, "%s", extra ? extra : "");
    char *save = NULL;
    for (char *tok = strtok_r(buf, " ", &save); tok && s->num_defines < FI_SPEC_MAX_DEFINES;
         tok = strtok_r(NULL, " ", &save))
        add_define(s, "%.60s", tok);
}

/* fi_merge_d128_o2 */
void fi_cuda_merge_spec(int dvo, int ot, fi_kernel_spec *s) {
    memset(s, 0, sizeof *s);
    s->entry_file = "merge.cuh";
    snprintf(s->name, sizeof s->name, "fi_merge_d%d_o%d", dvo, ot);
    add_define(s, "-DFI_DVO=%d", dvo);
    add_define(s, "-DFI_OT=%d", ot);
    add_define(s, "-DFI_MERGE_NAME=%s", s->name);
}

/* fi_merge_d128_o2_vsink_1a2b3c4d: a variant whose merge differs (output
 * hook, or partial sums that add) */
void fi_cuda_merge_spec_of(const fi_attn_config *c, fi_kernel_spec *s) {
    fi_cuda_merge_spec(c->dvo, c->ot, s);
    if (!(c->vhooks & (FI_VH_OUTPUT | FI_VH_NO_SOFTMAX))) return;
    s->num_defines--; /* the name define is redone */
    add_variant(c, s);
    add_define(s, "-DFI_MERGE_NAME=%s", s->name);
}

/* Tensor-core kernel: Q and KV one 16-bit dtype (FP8 KV and f32 stay on the
 * CUDA-core kernel), O any of f32/f16/bf16, head dims 64 or 128 (256 would
 * need a smaller tile: not yet), no fused RoPE (not yet). */
int fi_cuda_attn_tc_supported(const fi_attn_config *c) {
    const char *env = getenv("FLASHINFER_CUDA_TC"); /* "0": CUDA cores only */
    if (env && env[0] == '0') return 0;
    bool dt = (c->qt == FI_DTYPE_F16 || c->qt == FI_DTYPE_BF16) && c->kvt == c->qt;
    bool dims = (c->dqk == 64 || c->dqk == 128) && (c->dvo == 64 || c->dvo == 128);
    return dt && dims && c->pos != 1;
}

/* 128-row Q block + 2 stages of 64 keys of K and V, 16-bit, + two tiles of
 * K/V offsets (64 x 16 bytes each) (attention_tc.cuh). */
int fi_cuda_attn_tc_smem(const fi_attn_config *c) {
    int rows = c->tc_block == 64 ? 64 : 128;
    return rows * c->dqk * 2 + 2 * 64 * (c->dqk + c->dvo) * 2 + 2 * 64 * 16;
}

/* fi_attn_tc_d128x128_q2o2_g4_paged_m1w0c0p0 */
void fi_cuda_attn_tc_spec(const fi_attn_config *c, fi_kernel_spec *s) {
    memset(s, 0, sizeof *s);
    s->entry_file = "attention_tc.cuh";
    snprintf(s->name, sizeof s->name, "fi_attn_tc_d%dx%d_q%do%d_g%d_%s_m%dw%dc%dp%d", c->dqk,
             c->dvo, c->qt, c->ot, c->group, kv_format_name(c->paged), c->mask, c->window,
             c->softcap, c->pos);
    add_variant(c, s);
    add_define(s, "-DFI_DQK=%d", c->dqk);
    add_define(s, "-DFI_DVO=%d", c->dvo);
    add_define(s, "-DFI_QT=%d", c->qt);
    add_define(s, "-DFI_OT=%d", c->ot);
    add_define(s, "-DFI_GROUP=%d", c->group);
    add_define(s, "-DFI_PAGED=%d", c->paged);
    add_define(s, "-DFI_MASK=%d", c->mask);
    add_define(s, "-DFI_WINDOW=%d", c->window);
    add_define(s, "-DFI_SOFTCAP=%d", c->softcap);
    add_define(s, "-DFI_POS=%d", c->pos);
    add_define(s, "-DFI_ATTN_TC_NAME=%s", s->name);
    fi_cuda_env_defines(s);
}

int fi_cuda_persist_enabled(void) {
    const char *env = getenv("FLASHINFER_CUDA_PERSIST"); /* "0": separate kernels */
    return !(env && env[0] == '0');
}

/* Decode version 3 (kernels/decode_tc.cuh): the small items on tensor
 * cores, where the tensor-core kernel is supported and there is no custom
 * mask or logit transform; FLASHINFER_CUDA_DECODE_TC=0 keeps them on CUDA
 * cores (version 2). */
int fi_cuda_decode_tc_supported(const fi_attn_config *c) {
    const char *env = getenv("FLASHINFER_CUDA_DECODE_TC");
    if (env && env[0] == '0') return 0;
    return fi_cuda_attn_tc_supported(c) && c->mask != 2 && !c->softcap && c->pos != 2 &&
           !c->vname;
}

/* fi_pers_d128x128_q2k2o2_g4r4_paged_m0w0c0p0_t1d1: attention.cuh's
 * options, FI_TC, FI_DTC, and the entry point's name. */
static void persist_spec(const fi_attn_config *c, int tc, int dtc, fi_kernel_spec *s) {
    fi_cuda_attn_spec(c, s);
    const bool b64 = tc && c->tc_block == 64; /* fi_pers_..._t1d1_b64 */
    char name[sizeof s->name];
    snprintf(name, sizeof name, "fi_pers_%.70s_t%dd%d%s", s->name + strlen("fi_attn_"), tc, dtc,
             b64 ? "_b64" : "");
    memcpy(s->name, name, sizeof s->name);
    s->entry_file = "persistent.cuh";
    for (int i = 0; i < s->num_defines; i++)
        if (!strncmp(s->defines[i], "-DFI_ATTN_NAME=", 15))
            snprintf(s->defines[i], sizeof s->defines[i], "-DFI_PERSIST_NAME=%.96s", s->name);
    add_define(s, "-DFI_TC=%d", tc);
    add_define(s, "-DFI_DTC=%d", dtc);
    if (b64) add_define(s, "-DFI_TC_MT=1");
}

void fi_cuda_persist_spec(const fi_attn_config *c, fi_kernel_spec *s) {
    persist_spec(c, fi_cuda_attn_tc_supported(c), fi_cuda_decode_tc_supported(c), s);
}

/* The decode form: decode version 3 alone, where a GQA group's rows fit one
 * m16 tile (a token's rows in one slice); FLASHINFER_CUDA_DECODE_FORM=0:
 * not used. */
int fi_cuda_persist_decode_supported(const fi_attn_config *c) {
    const char *env = getenv("FLASHINFER_CUDA_DECODE_FORM");
    if (env && env[0] == '0') return 0;
    return fi_cuda_decode_tc_supported(c) && c->group <= FI_CUDA_DTC_MAX_ROWS;
}

/* fi_pers_..._t0d1 */
void fi_cuda_persist_decode_spec(const fi_attn_config *c, fi_kernel_spec *s) {
    persist_spec(c, 0, 1, s);
}

/* The mixed form: the full form with 64-row tensor-core blocks, for mixed
 * batches whose wide items are a small part of the work (its decode items
 * run without the 128-row form's spills); beside a decode form, for a plan
 * whose full form has 128-row blocks. FLASHINFER_CUDA_MIXED_B64=0: not
 * used. */
int fi_cuda_persist_mix_supported(const fi_attn_config *c) {
    const char *env = getenv("FLASHINFER_CUDA_MIXED_B64");
    return !(env && env[0] == '0') && c->tc_block != 64 && fi_cuda_attn_tc_supported(c) &&
           fi_cuda_persist_decode_supported(c);
}

/* fi_pers_..._t1d1_b64 */
void fi_cuda_persist_mix_spec(const fi_attn_config *c, fi_attn_config *mixed,
                              fi_kernel_spec *s) {
    *mixed = *c;
    mixed->tc_block = 64;
    fi_cuda_persist_spec(mixed, s);
}

/* 16-row Q tile + 2 stages of 64 keys of K and V, 16-bit (decode_tc.cuh),
 * with room for a third stage (FLASHINFER_CUDA_DEFINES=-DFI_DTC_STAGES=3:
 * two CTAs per SM either way). */
int fi_cuda_persist_decode_smem(const fi_attn_config *c) {
    /* room for 3 stages; FLASHINFER_CUDA_DECODE_ROOM=N (tuning, with
     * FLASHINFER_CUDA_DEFINES=-DFI_DTC_STAGES=N): N, up to 6 */
    const int asked = fi_cuda_env_count("FLASHINFER_CUDA_DECODE_ROOM");
    const int stages = asked >= 3 && asked <= 6 ? asked : 3;
    return 16 * c->dqk * 2 + stages * 64 * (c->dqk + c->dvo) * 2;
}

/* The larger of the tensor-core path's bytes and 48 KB, the most any
 * CUDA-core configuration uses (attention.cuh asserts it). */
int fi_cuda_persist_smem(const fi_attn_config *c) {
    int tc = fi_cuda_attn_tc_supported(c) ? fi_cuda_attn_tc_smem(c) : 0;
    return tc > 48 * 1024 ? tc : 48 * 1024;
}

int fi_cuda_persist_forms(const fi_attn_config *c, fi_attn_config *mixed, fi_kernel_spec specs[3]) {
    fi_cuda_persist_spec(c, &specs[0]);
    if (!fi_cuda_persist_decode_supported(c)) return 1;
    fi_cuda_persist_decode_spec(c, &specs[1]);
    if (!fi_cuda_persist_mix_supported(c)) return 2;
    fi_cuda_persist_mix_spec(c, mixed, &specs[2]);
    return 3;
}

int fi_cuda_plan_specs(const fi_attention_params *p, int device_table, const char *vsrc,
                       fi_kernel_spec specs[3], int *vhooks) {
    if (fi_cuda_persist_enabled() && !p->variant) {
        fi_attn_config cfg, mixed;
        fi_cuda_attn_config(p, p->num_qo_heads / p->num_kv_heads, device_table, &cfg);
        if (vhooks) *vhooks = 0;
        return fi_cuda_persist_forms(&cfg, &mixed, specs);
    }
    return fi_cuda_separate_specs(p, device_table, vsrc, specs, vhooks);
}
