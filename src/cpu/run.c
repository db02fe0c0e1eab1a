/*
 * run.c — fi_cpu_run: execute a plan's schedule on the thread pool.
 * Phase 1: thread t runs the items of workers t, t + T, ... (worker w's items
 * are items[worker_indptr[w] .. worker_indptr[w+1])), writing O/LSE directly
 * or f32 partial states. Phase 2: each merge row combines its partial states
 * in schedule order (fixed order: bitwise deterministic).
 */
#include "cpu/attention.h"
#include "cpu/convert.h"
#include "cpu/cpu.h"
#include "cpu/variant_jit.h"

#include <math.h>
#include <string.h>

#define LOG2E 1.4426950408889634f

static void job_init(fi_cpu_job *j, const fi_plan *plan, const fi_run_args *a) {
    const fi_attention_params *p = &plan->params;
    const fi_cpu_state *st = plan->ctx->backend_state;
    memset(j, 0, sizeof *j);
    j->plan = plan;
    j->simd = fi_cpu_simd_for_dims(st->simd, p->head_dim_qk, p->head_dim_vo);
    j->scratch = st->scratch;
    j->threads = plan->ctx->num_threads;
    FI_CPU_JOB_QO(j, p, a);
    j->k = fi_cpu_kv_view(plan, &a->k);
    j->v = fi_cpu_kv_view(plan, &a->v);
    j->mask = p->mask_mode == FI_MASK_CUSTOM ? a->custom_mask.data : NULL;
    j->h_qo = p->num_qo_heads, j->h_kv = p->num_kv_heads, j->group = plan->group_size;
    j->dqk = p->head_dim_qk, j->dvo = p->head_dim_vo;
    j->paged = p->kv_format == FI_KV_FORMAT_PAGED;
    j->page_size = p->page_size;
    j->causal = p->mask_mode == FI_MASK_CAUSAL;
    j->window_left = p->window_left;
    j->rope = p->pos_encoding == FI_POS_ROPE_LLAMA;
    j->alibi = p->pos_encoding == FI_POS_ALIBI;
    j->softcap = p->logits_soft_cap > 0.0f;
    j->softcap_c = p->logits_soft_cap;
    /* Staged q carries sm_scale, and log2 e too when no logit transform
     * follows, so a plain block's logits leave qk already in the log2 domain. */
    if (j->softcap || j->alibi) {
        j->q_scale = p->sm_scale;
        j->logit_scale = LOG2E;
    } else {
        j->q_scale = p->sm_scale * LOG2E;
        j->logit_scale = 1.0f;
    }
    j->rope_rcp_scale = 1.0 / (p->rope_scale > 0.0f ? (double)p->rope_scale : 1.0);
    j->rope_theta = p->rope_theta > 0.0f ? p->rope_theta : 1e4f;
    if (j->rope)
        for (int32_t i = 0; i < j->dqk / 2; i++)
            j->rope_freq[i] = pow((double)j->rope_theta, -2.0 * i / (double)j->dqk) *
                              (double)j->rope_rcp_scale;
    bool fp8 = p->kv_dtype == FI_DTYPE_E4M3 || p->kv_dtype == FI_DTYPE_E5M2;
    j->k_scale = fp8 ? p->k_scale : 1.0f;
    j->v_scale = fp8 ? p->v_scale : 1.0f;
    j->stage_k = j->rope || !j->k.contiguous;
    j->stage_v = !j->v.contiguous;
    j->k_dtype = j->stage_k ? FI_DTYPE_F32 : j->k.dtype;
    j->v_dtype = j->stage_v ? FI_DTYPE_F32 : j->v.dtype;
}

static void phase_items(void *arg, int32_t t, int32_t nt) {
    const fi_cpu_job *j = arg;
    const fi_schedule *s = &j->plan->schedule;
    for (int32_t w = t; w < s->num_workers; w += nt)
        for (int32_t i = s->worker_indptr[w]; i < s->worker_indptr[w + 1]; i++)
            fi_cpu_attend_item(j, &s->items[i], &j->scratch[t]);
}

/* Output token `row` = merge of partial rows src[0..n), every head, by the
 * state merge of docs/SEMANTICS.md: a state with LSE NaN (a poisoned row)
 * makes the row NaN; one with LSE -inf is not read; every other one is,
 * whatever its weight, so a non-finite element of its O (from a V it saw)
 * reaches the output as it would unsplit. Sums in f64: f32 ones of large
 * finite values could overflow. */
static void merge_row(const fi_cpu_job *j, int32_t row, const int32_t *src, int32_t n) {
    const fi_plan *plan = j->plan;
    float acc[FI_CPU_MAX_D];
    double sum[FI_CPU_MAX_D];
    for (int32_t h = 0; h < j->h_qo; h++) {
        float mx = -INFINITY;
        bool poisoned = false;
        for (int32_t i = 0; i < n; i++) {
            float l = plan->partial_lse[(int64_t)src[i] * j->h_qo + h];
            poisoned |= !(l < INFINITY);
            if (l > mx) mx = l;
        }
        float lse = poisoned ? NAN : -INFINITY;
        for (int32_t d = 0; d < j->dvo; d++) acc[d] = poisoned ? NAN : 0.0f;
        if (!poisoned && mx != -INFINITY) {
            double wsum = 0.0;
            for (int32_t d = 0; d < j->dvo; d++) sum[d] = 0.0;
            for (int32_t i = 0; i < n; i++) {
                int64_t r = (int64_t)src[i] * j->h_qo + h;
                float l = plan->partial_lse[r];
                if (l == -INFINITY) continue;
                double w = exp2((double)l - mx);
                const float *po = plan->partial_o + r * j->dvo;
                for (int32_t d = 0; d < j->dvo; d++) sum[d] += w * po[d];
                wsum += w;
            }
            for (int32_t d = 0; d < j->dvo; d++) acc[d] = (float)(sum[d] / wsum);
            lse = (float)(mx + log2(wsum));
        }
        uint8_t *o = j->o + row * j->o_tok + h * j->o_head;
        fi_dtype od = plan->params.o_dtype;
        if (j->o_elem == (int64_t)fi_dtype_size(od)) {
            for (int32_t d = 0; d < j->dvo; d++) fi_store_f32(o, od, d, acc[d]);
        } else {
            for (int32_t d = 0; d < j->dvo; d++) fi_store_f32(o + d * j->o_elem, od, 0, acc[d]);
        }
        if (j->lse) j->lse[row * j->lse_tok + h * j->lse_head] = lse;
    }
}

static void phase_merge(void *arg, int32_t t, int32_t nt) {
    const fi_cpu_job *j = arg;
    const fi_schedule *s = &j->plan->schedule;
    int32_t n = s->num_merge_rows;
    int32_t begin = (int32_t)((int64_t)n * t / nt), end = (int32_t)((int64_t)n * (t + 1) / nt);
    for (int32_t r = begin; r < end; r++)
        merge_row(j, s->merge_out_row[r], s->merge_src + s->merge_indptr[r],
                  s->merge_indptr[r + 1] - s->merge_indptr[r]);
}

fi_status fi_cpu_run(struct fi_plan *plan, const fi_run_args *args) {
    if (plan->params.variant) return fi_cpu_variant_run(plan, args);
    fi_cpu_job job;
    job_init(&job, plan, args);
    fi_thread_pool *pool = fi_cpu_pool(plan->ctx);
    if (plan->schedule.num_items > 0) fi_thread_pool_run(pool, phase_items, &job);
    if (plan->schedule.num_merge_rows > 0) fi_thread_pool_run(pool, phase_merge, &job);
    return FI_OK;
}
