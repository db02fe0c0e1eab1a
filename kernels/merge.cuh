/*
 * merge.cuh — the plan's reduction map: output token merge_out_row[r] is the
 * merge, in order, of partial rows merge_src[merge_indptr[r] ..
 * merge_indptr[r+1]) (every query head). One warp per (row, head), a fixed
 * grid striding over them; the order of the sums is fixed, so the result is
 * bitwise the same run after run.
 *
 *   M = max_s lse_s;  w_s = 2^(lse_s - M);  O = sum_s w_s o_s / sum_s w_s
 *   LSE = M + log2(sum_s w_s);  states with lse = -inf contribute nothing.
 *
 * A user variant's merge (FI_VARIANT, kernels/variant.cuh): use_softmax = 0
 * sums the partial rows (LSE written as 0); an output hook runs once on each
 * merged row (a warp's row staged in shared memory, lane 0 calls it).
 *
 * Configuration: FI_DVO, FI_OT (output dtype code), FI_MERGE_NAME; FI_VARIANT,
 * FI_VHOOKS. persistent.cuh calls merge_row() in its fused merge (no
 * FI_MERGE_NAME, no entry point).
 */
#include "prelude.cuh"

#ifndef FI_DVO
#define FI_DVO 128
#define FI_OT 2
#define FI_MERGE_NAME fi_merge_default
#endif
#include "variant.cuh"

namespace fi_merge {
constexpr int DVO = FI_DVO, OT = FI_OT, NT = 128, PER = (DVO + 31) / 32;
constexpr bool SOFTMAX = fi_v::SOFTMAX;

/* The request of output token tok (qo_indptr is sorted). */
FI_DEV int request_of(const int32_t *qo_indptr, int batch, int64_t tok) {
    int lo = 0, hi = batch - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (qo_indptr[mid] <= tok) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Merge row r, query head h, by one warp; `rows`: this warp's [DVO + 1]
 * floats of shared memory (the output hook's row). Partial states are read
 * through L2 (ld.global.cg): in persistent.cuh's fused merge other CTAs
 * wrote them. */
FI_DEV void merge_row(const fi_attn_args &a, const fi_meta *meta, int r, int h, int lane,
                      const fi_variant_params &VP, float *rows) {
    const int32_t *out_row = (const int32_t *)(a.meta + meta->off_merge_out_row);
    const int32_t *indptr = (const int32_t *)(a.meta + meta->off_merge_indptr);
    const int32_t *src = (const int32_t *)(a.meta + meta->off_merge_src);
    const int H = a.num_qo_heads;
    const int s0 = indptr[r], s1 = indptr[r + 1];
    float M = FI_NEG_INF;
    if (SOFTMAX)
        for (int s = s0; s < s1; s++) M = fmaxf(M, __ldcg(a.partial_lse + (int64_t)src[s] * H + h));
    else
        M = 0.0f; /* weights 1: the partial sums add */
    float acc[PER], L = 0.0f;
#pragma unroll
    for (int e = 0; e < PER; e++) acc[e] = 0.0f;
    if (M != FI_NEG_INF) {
        for (int s = s0; s < s1; s++) {
            const int64_t row = (int64_t)src[s] * H + h;
            const float l = SOFTMAX ? __ldcg(a.partial_lse + row) : 0.0f;
            if (l == FI_NEG_INF) continue;
            const float wgt = SOFTMAX ? exp2f(l - M) : 1.0f;
            L += wgt;
            const float *po = a.partial_o + row * DVO;
#pragma unroll
            for (int e = 0; e < PER; e++) {
                int d = lane + 32 * e;
                if (d < DVO) acc[e] = fmaf(wgt, __ldcg(po + d), acc[e]);
            }
        }
    }
    const float inv = !SOFTMAX ? 1.0f : L > 0.0f ? 1.0f / L : 0.0f;
    const float lse = !SOFTMAX ? 0.0f : L > 0.0f ? M + log2f(L) : FI_NEG_INF;
    const int64_t tok = out_row[r];
    char *o = a.o + tok * a.o_tok + (int64_t)h * a.o_head;
#pragma unroll
    for (int e = 0; e < PER; e++) acc[e] *= inv;
    if constexpr (fi_v::OUTPUT) {
        float *row = rows;
#pragma unroll
        for (int e = 0; e < PER; e++)
            if (lane + 32 * e < DVO) row[lane + 32 * e] = acc[e];
        __syncwarp();
        if (lane == 0) {
            const int32_t *qo_indptr = (const int32_t *)(a.meta + meta->off_qo_indptr);
            const int32_t *kv_len = (const int32_t *)(a.meta + meta->off_kv_len);
            const int req = fi_merge::request_of(qo_indptr, meta->batch_size, tok);
            const int qo_len = qo_indptr[req + 1] - qo_indptr[req], kl = kv_len[req];
            const int q_pos = kl - qo_len + (int)(tok - qo_indptr[req]);
            fi_v::output(row, lse,
                         fi_v::ctx(req, h, h / (H / a.num_kv_heads), q_pos, -1, qo_len, kl, DVO,
                                   a.sm_scale),
                         VP);
        }
        __syncwarp();
#pragma unroll
        for (int e = 0; e < PER; e++)
            if (lane + 32 * e < DVO) acc[e] = row[lane + 32 * e];
        __syncwarp(); /* the row is rewritten by the warp's next pair */
    }
#pragma unroll
    for (int e = 0; e < PER; e++) {
        int d = lane + 32 * e;
        if (d < DVO) fi_store_elem<OT>(o + d * a.o_dim, acc[e]);
    }
    if (lane == 0 && a.lse) a.lse[tok * a.lse_tok + (int64_t)h * a.lse_head] = lse;
}
} /* namespace fi_merge */

#ifdef FI_MERGE_NAME
extern "C" __global__ void __launch_bounds__(fi_merge::NT) FI_MERGE_NAME(const fi_attn_args a) {
    using namespace fi_merge;
    const fi_meta *meta = (const fi_meta *)a.meta;
    const int H = a.num_qo_heads, lane = threadIdx.x & 31;
    __shared__ float rows[fi_v::OUTPUT ? NT / 32 : 1][fi_v::OUTPUT ? DVO + 1 : 1];
    const fi_variant_params VP = fi_v::params(a, (const float *)(a.meta + meta->off_alibi));
    const int64_t total = (int64_t)meta->num_merge_rows * H;
    const int64_t step = (int64_t)gridDim.x * (NT / 32);
    for (int64_t pair = blockIdx.x * (int64_t)(NT / 32) + (threadIdx.x >> 5); pair < total;
         pair += step)
        merge_row(a, meta, (int)(pair / H), (int)(pair % H), lane, VP,
                  rows[fi_v::OUTPUT ? threadIdx.x >> 5 : 0]);
}
#endif
