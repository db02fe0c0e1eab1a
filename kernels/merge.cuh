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
 * Configuration: FI_DVO, FI_OT (output dtype code), FI_MERGE_NAME.
 */
#include "prelude.cuh"

#ifndef FI_MERGE_NAME
#define FI_DVO 128
#define FI_OT 2
#define FI_MERGE_NAME fi_merge_default
#endif

namespace fi_merge {
constexpr int DVO = FI_DVO, OT = FI_OT, NT = 128, PER = (DVO + 31) / 32;
}

extern "C" __global__ void __launch_bounds__(fi_merge::NT) FI_MERGE_NAME(const fi_attn_args a) {
    using namespace fi_merge;
    const fi_meta *meta = (const fi_meta *)a.meta;
    const int32_t *out_row = (const int32_t *)(a.meta + meta->off_merge_out_row);
    const int32_t *indptr = (const int32_t *)(a.meta + meta->off_merge_indptr);
    const int32_t *src = (const int32_t *)(a.meta + meta->off_merge_src);
    const int H = a.num_qo_heads, lane = threadIdx.x & 31;
    const int64_t total = (int64_t)meta->num_merge_rows * H;
    const int64_t step = (int64_t)gridDim.x * (NT / 32);
    for (int64_t pair = blockIdx.x * (int64_t)(NT / 32) + (threadIdx.x >> 5); pair < total;
         pair += step) {
        const int r = (int)(pair / H), h = (int)(pair % H);
        const int s0 = indptr[r], s1 = indptr[r + 1];
        float M = FI_NEG_INF;
        for (int s = s0; s < s1; s++) M = fmaxf(M, a.partial_lse[(int64_t)src[s] * H + h]);
        float acc[PER], L = 0.0f;
#pragma unroll
        for (int e = 0; e < PER; e++) acc[e] = 0.0f;
        if (M != FI_NEG_INF) {
            for (int s = s0; s < s1; s++) {
                const int64_t row = (int64_t)src[s] * H + h;
                const float l = a.partial_lse[row];
                if (l == FI_NEG_INF) continue;
                const float wgt = exp2f(l - M);
                L += wgt;
                const float *po = a.partial_o + row * DVO;
#pragma unroll
                for (int e = 0; e < PER; e++) {
                    int d = lane + 32 * e;
                    if (d < DVO) acc[e] = fmaf(wgt, po[d], acc[e]);
                }
            }
        }
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
        const int64_t tok = out_row[r];
        char *o = a.o + tok * a.o_tok + (int64_t)h * a.o_head;
#pragma unroll
        for (int e = 0; e < PER; e++) {
            int d = lane + 32 * e;
            if (d < DVO) fi_store_elem<OT>(o + d * a.o_dim, acc[e] * inv);
        }
        if (lane == 0 && a.lse)
            a.lse[tok * a.lse_tok + (int64_t)h * a.lse_head] = L > 0.0f ? M + log2f(L) : FI_NEG_INF;
    }
}
