/*
 * attention.h — one fi_plan_run on the CPU, resolved once per run into a
 * job (byte strides, folded scales, variant flags), and the per-worker
 * scratch the kernel works in.
 */
#ifndef FI_CPU_ATTENTION_H
#define FI_CPU_ATTENTION_H

#include "core/internal.h"
#include "cpu/simd.h"

/* Per-worker scratch, allocated at context creation for the largest shapes
 * (FI_CPU_BM rows, FI_CPU_BN keys, head dim FI_CPU_MAX_D). */
typedef struct fi_cpu_scratch {
    float *q;              /* [BM][MAX_D] staged queries */
    float *qx;             /* [BM][MAX_D] the SIMD table's copy of q */
    float *o;              /* [BM][MAX_D] output accumulator */
    float *s;              /* [BM][BN] logits / probabilities */
    float *m, *l, *alpha;  /* [BM] */
    float *kst, *vst;      /* [BN][MAX_D] staged K/V rows (RoPE, odd strides) */
    const uint8_t **kp;    /* [BN] K row pointers of the current block */
    const uint8_t **vp;    /* [BN] */
    void *work;            /* FI_CPU_WORK_BYTES for the SIMD table */
    void *memory;          /* the one allocation behind the above */
} fi_cpu_scratch;

fi_status fi_cpu_scratch_init(fi_cpu_scratch *s);
void fi_cpu_scratch_fini(fi_cpu_scratch *s);

/* A K or V cache in bytes: row of key j of head h is at
 *   paged:  base + page(j) * page_stride + (j % page_size) * slot_stride + h * head_stride
 *   ragged: base + (kv_indptr[req] + j) * slot_stride + h * head_stride */
typedef struct fi_cpu_kv {
    const uint8_t *base;
    int64_t page_stride, slot_stride, head_stride, elem_stride;
    fi_dtype dtype;
    size_t elem;           /* bytes per element */
    bool contiguous;       /* elem_stride == elem: SIMD tables can read rows */
} fi_cpu_kv;

/* The view of a K or V tensor of a plan's layout (the run's job, and the
 * variant kernel's). */
static inline fi_cpu_kv fi_cpu_kv_view(const struct fi_plan *plan, const fi_tensor *t) {
    const fi_attention_params *p = &plan->params;
    int64_t e = (int64_t)fi_dtype_size(t->dtype);
    bool nhd = p->kv_layout == FI_KV_LAYOUT_NHD;
    fi_cpu_kv kv = {.base = t->data, .dtype = t->dtype, .elem = (size_t)e};
    if (p->kv_format == FI_KV_FORMAT_PAGED) {
        /* NHD [pages, page_size, H, D]; HND [pages, H, page_size, D] */
        kv.page_stride = t->stride[0] * e;
        kv.slot_stride = t->stride[nhd ? 1 : 2] * e;
        kv.head_stride = t->stride[nhd ? 2 : 1] * e;
        kv.elem_stride = t->stride[3] * e;
    } else {
        /* NHD [tokens, H, D]; HND [H, tokens, D] */
        kv.slot_stride = t->stride[nhd ? 0 : 1] * e;
        kv.head_stride = t->stride[nhd ? 1 : 0] * e;
        kv.elem_stride = t->stride[2] * e;
    }
    kv.contiguous = kv.elem_stride == e;
    return kv;
}

/* Q, O and LSE of run args `a` into job `j` (fi_cpu_job, or the variant
 * ABI's fi_vk_job, which names them alike): data pointers, byte strides of
 * Q and O (token, head, element), element strides of LSE. */
#define FI_CPU_JOB_QO(j, p, a)                                                                  \
    do {                                                                                        \
        int64_t qe_ = (int64_t)fi_dtype_size((p)->q_dtype);                                    \
        int64_t oe_ = (int64_t)fi_dtype_size((p)->o_dtype);                                    \
        (j)->q = (a)->q.data;                                                                   \
        (j)->q_tok = (a)->q.stride[0] * qe_, (j)->q_head = (a)->q.stride[1] * qe_;              \
        (j)->q_elem = (a)->q.stride[2] * qe_;                                                   \
        (j)->o = (a)->o.data;                                                                   \
        (j)->o_tok = (a)->o.stride[0] * oe_, (j)->o_head = (a)->o.stride[1] * oe_;              \
        (j)->o_elem = (a)->o.stride[2] * oe_;                                                   \
        (j)->lse = (a)->lse.data;                                                               \
        if ((j)->lse) (j)->lse_tok = (a)->lse.stride[0], (j)->lse_head = (a)->lse.stride[1];    \
    } while (0)

typedef struct fi_cpu_job {
    const struct fi_plan *plan;
    const fi_cpu_simd *simd;
    fi_cpu_scratch *scratch;   /* [threads] */
    int32_t threads;

    const uint8_t *q;          /* [total_q, H_qo, D_qk] */
    int64_t q_tok, q_head, q_elem;          /* byte strides */
    uint8_t *o;                /* [total_q, H_qo, D_vo] */
    int64_t o_tok, o_head, o_elem;
    float *lse;                /* [total_q, H_qo] or NULL */
    int64_t lse_tok, lse_head; /* element strides */
    fi_cpu_kv k, v;
    const uint8_t *mask;       /* custom mask bytes or NULL */

    int32_t h_qo, h_kv, group, dqk, dvo;
    bool paged, causal, rope, alibi, softcap;
    int32_t page_size, window_left;
    float q_scale;             /* folded into staged q */
    float logit_scale;         /* after ALiBi / soft-cap: to log2 domain */
    float softcap_c;           /* soft-cap c */
    double rope_rcp_scale;
    float rope_theta;
    double rope_freq[FI_CPU_MAX_D / 2]; /* rcp_scale * theta^(-2i/D_qk) */
    float k_scale, v_scale;
    /* What the SIMD table reads: the cache itself, or f32 rows staged in
     * scratch (RoPE on K, a cache not contiguous along D). */
    bool stage_k, stage_v;
    fi_dtype k_dtype, v_dtype;
} fi_cpu_job;

/* Run one work item (all KV heads) with worker scratch `s`. */
void fi_cpu_attend_item(const fi_cpu_job *job, const fi_work_item *item, fi_cpu_scratch *s);

#endif /* FI_CPU_ATTENTION_H */
