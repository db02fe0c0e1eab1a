/*
 * merge.cuh — the plan's reduction map: output token merge_out_row[r] is the
 * merge, in order, of partial rows merge_src[merge_indptr[r] ..
 * merge_indptr[r+1]) (every query head). One warp per (row, head), a fixed
 * grid striding over them (merge_pair); the order of the sums is fixed, so
 * the result is bitwise the same run after run.
 *
 *   M = max_s lse_s;  w_s = 2^(lse_s - M);  O = sum_s w_s o_s / sum_s w_s
 *   LSE = M + log2(sum_s w_s);  states with lse = -inf contribute nothing.
 *
 * Non-finite values (docs/SEMANTICS.md): a state with LSE NaN or +inf makes
 * the row's O and LSE NaN; every other state with a finite LSE is read
 * whatever its weight (a NaN in its O reaches the row); a row whose f32
 * sums are not finite without that is summed again in f64 (exact_columns).
 *
 * A user variant's merge (FI_VARIANT, kernels/variant.cuh): use_softmax = 0
 * sums the partial rows (LSE written as 0); an output hook runs once on each
 * merged row (a warp's row staged in shared memory, lane 0 calls it).
 *
 * Configuration: FI_DVO (a multiple of 16: 64 to 512), FI_OT (output dtype code), FI_MERGE_NAME; FI_VARIANT,
 * FI_VHOOKS. persistent.cuh calls merge_pair() in its fused merge (no
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
constexpr int DVO = FI_DVO, OT = FI_OT, NT = 128;
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

/* A merge row's n sources: source k's partial row is idx[k] (the separate
 * merge kernel: merge_src + merge_indptr[r]), or without idx first + k *
 * step (persistent.cuh's fused merge: the schedule's sources of a row are
 * evenly spaced, src/cuda/plan.c, so the merger loads no index). */
struct Sources {
    const int32_t *idx;
    int32_t first, step, n;
    FI_DEV int64_t row(int k) const { return idx ? __ldg(idx + k) : first + (int64_t)k * step; }
};

/* A merged row whose f32 sums came out not finite though no state is
 * poisoned: lane `sub`'s float4 columns (sub, sub + LPP, ...) summed again
 * in f64, as src/cpu/run.c merges, so that finite states never overflow
 * to an infinity (an infinity or NaN in a state's O stays one). Lane-local:
 * only the lanes with such a column call it. */
template <int LPP, int PERL>
FI_DEV void exact_columns(const fi_attn_args &a, const Sources &S, int h, float M, int sub,
                          float4 *acc) {
    constexpr int C4 = DVO / 4;
    double sum[PERL][4], L = 0.0;
#pragma unroll
    for (int j = 0; j < PERL; j++) sum[j][0] = sum[j][1] = sum[j][2] = sum[j][3] = 0.0;
    for (int k = 0; k < S.n; k++) {
        const int64_t row = S.row(k) * a.num_qo_heads + h;
        const float lk = __ldcg(a.partial_lse + row);
        if (lk == FI_NEG_INF) continue; /* not read */
        const double w = exp2((double)lk - M);
        L += w;
        const float4 *po = reinterpret_cast<const float4 *>(a.partial_o + row * DVO);
#pragma unroll
        for (int j = 0; j < PERL; j++) {
            if (sub + j * LPP >= C4) continue;
            const float4 x = __ldcg(po + sub + j * LPP);
            sum[j][0] += w * x.x;
            sum[j][1] += w * x.y;
            sum[j][2] += w * x.z;
            sum[j][3] += w * x.w;
        }
    }
#pragma unroll
    for (int j = 0; j < PERL; j++)
        acc[j] = make_float4((float)(sum[j][0] / L), (float)(sum[j][1] / L), (float)(sum[j][2] / L),
                             (float)(sum[j][3] / L));
}

/* Merge output token tok from the sources S, query head h, by a group
 * of LPP lanes (lanes [base, base + LPP) of a warp, LPP a power of two,
 * every lane of the group calling with the same row and head); `rows`: the
 * group's [DVO + 1] floats of shared memory (the output hook's row; LPP =
 * 32 only). Lane `sub` of the group owns the float4 columns sub, sub + LPP,
 * ... of the row; SRC_UNROLL sources are loaded at a time. F64: a row
 * whose f32 sums are not finite (no state poisoned) is summed again in f64
 * here; else the call returns true for it (the caller computes it again). 
 *
 * The sources' states are loaded LPP at a time, one per lane (source
 * index, then LSE), and handed round by shuffles, so a row of n sources
 * waits on about 2 n / LPP loads in a row rather than 3 n; the partial rows'
 * columns of several sources are in flight at once. Per element the
 * arithmetic is fixed whatever LPP (max, then weights and fmaf in source
 * order), so the result is bitwise the same whichever CTA or kernel merges.
 * Partial states are read through L2 (ld.global.cg): in persistent.cuh's
 * fused merge other CTAs wrote them; the plan's arrays do not change during
 * a launch (ld.global.nc). */
template <int LPP, int SRC_UNROLL = 8, bool F64 = true>
FI_DEV bool merge_pair(const fi_attn_args &a, const fi_meta *meta, int64_t tok, Sources S, int h,
                       const fi_variant_params &VP, float *rows) {
    static_assert(LPP >= 1 && LPP <= 32 && (LPP & (LPP - 1)) == 0, "lanes per row");
    static_assert(LPP == 32 || !fi_v::OUTPUT, "output hook: a warp per row");
    static_assert(DVO % 4 == 0, "float4 columns");
    constexpr int C4 = DVO / 4, PERL = (C4 + LPP - 1) / LPP; /* float4 columns per lane */
    constexpr int UNROLL = PERL <= 2 ? SRC_UNROLL : 1;      /* sources in flight */
    const int lane = threadIdx.x & 31, sub = lane & (LPP - 1);
    const unsigned gmask = LPP == 32 ? 0xffffffffu : ((1u << LPP) - 1u) << (lane - sub);
    const int H = a.num_qo_heads, n = S.n;

    /* this lane's source of the first LPP, kept for the sums below */
    int64_t row = 0;
    float l = FI_NEG_INF;
    if (sub < n) {
        row = S.row(sub) * H + h;
        l = SOFTMAX ? __ldcg(a.partial_lse + row) : 0.0f;
    }
    /* this lane's columns of the row of the group's lane k's source, or
     * zeros where `source` is false (no such source in the row). Loaded
     * whether or not the state counts (its LSE may be -inf): a source's
     * row always exists, and the loads need not wait on that test. */
    auto load_row = [&](int k, float4 *x, bool source = true) {
        const int64_t rk = __shfl_sync(gmask, row, k, LPP);
        const float4 *po = reinterpret_cast<const float4 *>(a.partial_o + rk * DVO);
#pragma unroll
        for (int j = 0; j < PERL; j++)
            x[j] = source && (C4 % LPP == 0 || sub + j * LPP < C4)
                       ? __ldcg(po + sub + j * LPP)
                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    };
    /* The first round's first PRE rows, loaded now beside the LSEs: the
     * row of a decode's few sources then waits on two loads in a row (the
     * index; the LSE and the row together), not three (the fused merge,
     * whose sources need no index: one). Only the round's sources: a lane
     * past n holds row 0, and every warp of the grid loading that one row
     * for its missing sources made one L2 line hot (measured much slower on
     * the separate merge kernel's 2-source rows) */
    constexpr int PRE = UNROLL;
    const int n0 = n < PRE ? n : PRE;
    float4 xp[PRE][PERL];
#pragma unroll
    for (int k = 0; k < PRE; k++) load_row(k, xp[k], k < n0);
    float M = 0.0f; /* no softmax: weights 1, the partial sums add */
    bool poisoned = false; /* a state with LSE NaN or +inf: the row is NaN */
    if (SOFTMAX) {
        M = l;
        poisoned = !(l < FI_POS_INF);
        for (int k = sub + LPP; k < n; k += LPP) {
            const float lk = __ldcg(a.partial_lse + S.row(k) * H + h);
            M = fmaxf(M, lk);
            poisoned = poisoned || !(lk < FI_POS_INF);
        }
#pragma unroll
        for (int off = LPP / 2; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(gmask, M, off));
        poisoned = __any_sync(gmask, poisoned);
    }
    float4 acc[PERL];
#pragma unroll
    for (int j = 0; j < PERL; j++) acc[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float L = 0.0f;
    if (M != FI_NEG_INF && !poisoned) {
        for (int b = 0; b < n; b += LPP) {
            if (b != 0 && b + sub < n) {
                row = S.row(b + sub) * H + h;
                l = SOFTMAX ? __ldcg(a.partial_lse + row) : 0.0f;
            }
            /* states with lse = -inf contribute nothing */
            const int ok = b + sub < n && l != FI_NEG_INF;
            const float w = !SOFTMAX ? 1.0f : ok ? exp2f(l - M) : 0.0f;
            const int nb = n - b < LPP ? n - b : LPP;
            /* source k of this round (its row x) into the sums */
            auto add_row = [&](int k, const float4 *x) {
                const int okk = __shfl_sync(gmask, ok, k, LPP);
                const float wk = __shfl_sync(gmask, w, k, LPP);
                if (okk) {
                    L += wk;
#pragma unroll
                    for (int j = 0; j < PERL; j++) {
                        acc[j].x = fmaf(wk, x[j].x, acc[j].x);
                        acc[j].y = fmaf(wk, x[j].y, acc[j].y);
                        acc[j].z = fmaf(wk, x[j].z, acc[j].z);
                        acc[j].w = fmaf(wk, x[j].w, acc[j].w);
                    }
                }
            };
            auto add_source = [&](int k) {
                float4 x[PERL];
                load_row(k, x);
                add_row(k, x);
            };
            /* the first round's rows loaded above */
            int k = 0;
            if (b == 0) {
#pragma unroll
                for (int u = 0; u < PRE; u++)
                    if (u < nb) add_row(u, xp[u]);
                k = PRE < nb ? PRE : nb;
            }
            /* the rest UNROLL at a time (rounds of 16 or 32 sources fully
             * unrolled doubled the merge's code and measured no faster) */
#pragma unroll UNROLL
            for (; k < nb; k++) add_source(k);
        }
    }
    const float inv = !SOFTMAX ? 1.0f : poisoned ? FI_NAN : L > 0.0f ? 1.0f / L : 0.0f;
    const float lse = !SOFTMAX ? 0.0f : poisoned ? FI_NAN : L > 0.0f ? M + log2f(L) : FI_NEG_INF;
    char *o = a.o + tok * a.o_tok + (int64_t)h * a.o_head;
    bool finite = true;
#pragma unroll
    for (int j = 0; j < PERL; j++) {
        acc[j].x *= inv;
        acc[j].y *= inv;
        acc[j].z *= inv;
        acc[j].w *= inv;
        finite = finite && fabsf(acc[j].x) < FI_POS_INF && fabsf(acc[j].y) < FI_POS_INF && fabsf(acc[j].z) < FI_POS_INF &&
                 fabsf(acc[j].w) < FI_POS_INF;
    }
    /* not finite though no state is poisoned: a NaN or infinity in a
     * state's O, or a sum past f32; F64: the columns summed again here
     * (else the caller computes the row again: persistent.cuh) */
    const bool redo = SOFTMAX && !poisoned && L > 0.0f && __any_sync(gmask, !finite);
    if (F64 && redo && !finite) exact_columns<LPP, PERL>(a, S, h, M, sub, acc);
    if constexpr (fi_v::OUTPUT) {
#pragma unroll
        for (int j = 0; j < PERL; j++) {
            float *x = rows + 4 * (sub + j * LPP);
            if (sub + j * LPP < C4) {
                x[0] = acc[j].x;
                x[1] = acc[j].y;
                x[2] = acc[j].z;
                x[3] = acc[j].w;
            }
        }
        __syncwarp();
        if (lane == 0) {
            const int32_t *qo_indptr = (const int32_t *)(a.meta + meta->off_qo_indptr);
            const int32_t *kv_len = (const int32_t *)(a.meta + meta->off_kv_len);
            const int req = fi_merge::request_of(qo_indptr, meta->batch_size, tok);
            const int qo_len = qo_indptr[req + 1] - qo_indptr[req], kl = kv_len[req];
            const int q_pos = kl - qo_len + (int)(tok - qo_indptr[req]);
            fi_v::output(rows, lse,
                         fi_v::ctx(req, h, h / (H / a.num_kv_heads), q_pos, -1, qo_len, kl, DVO,
                                   a.sm_scale),
                         VP);
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < PERL; j++) {
            const float *x = rows + 4 * (sub + j * LPP);
            if (sub + j * LPP < C4) acc[j] = make_float4(x[0], x[1], x[2], x[3]);
        }
        __syncwarp(); /* the row is rewritten by the warp's next pair */
    }
#pragma unroll
    for (int j = 0; j < PERL; j++) {
        const int c = sub + j * LPP;
        if (C4 % LPP == 0 || c < C4) {
            fi_store_elem<OT>(o + (4 * c + 0) * a.o_dim, acc[j].x);
            fi_store_elem<OT>(o + (4 * c + 1) * a.o_dim, acc[j].y);
            fi_store_elem<OT>(o + (4 * c + 2) * a.o_dim, acc[j].z);
            fi_store_elem<OT>(o + (4 * c + 3) * a.o_dim, acc[j].w);
        }
    }
    if (sub == 0 && a.lse) a.lse[tok * a.lse_tok + (int64_t)h * a.lse_head] = lse;
    return !F64 && redo;
}

/* Lanes per row for a CTA that merges many rows at once (persistent.cuh's
 * fused merge of a prefill tile): 8 float4 columns per lane (d 64: 2 lanes,
 * 128: 4, 256: 8), rounded up to a power of two (d 80, 96: 4 lanes of 5 or
 * 6 columns; 192: 8 of 6; 512: 16). */
__host__ __device__ constexpr int lanes_for(int c4) { return c4 > 8 ? 2 * lanes_for((c4 + 1) / 2) : 1; }
constexpr int LPP_WIDE = lanes_for(DVO / 4);
} /* namespace fi_merge */

#ifdef FI_MERGE_NAME
extern "C" __global__ void __launch_bounds__(fi_merge::NT) FI_MERGE_NAME(const fi_attn_args a) {
    using namespace fi_merge;
    fi_pdl_wait(); /* launched without the attribute (src/cuda/run.c): a no-op */
    fi_mark_upload_read(a);
    const fi_meta *meta = (const fi_meta *)a.meta;
    const int H = a.num_qo_heads;
    const int32_t *indptr = (const int32_t *)(a.meta + meta->off_merge_indptr);
    const int32_t *src = (const int32_t *)(a.meta + meta->off_merge_src);
    const int32_t *out_row = (const int32_t *)(a.meta + meta->off_merge_out_row);
    __shared__ float rows[fi_v::OUTPUT ? NT / 32 : 1][fi_v::OUTPUT ? DVO + 1 : 1];
    const fi_variant_params VP = fi_v::params(a, (const float *)(a.meta + meta->off_alibi));
    const int64_t total = (int64_t)meta->num_merge_rows * H;
    const int64_t step = (int64_t)gridDim.x * (NT / 32);
    for (int64_t pair = blockIdx.x * (int64_t)(NT / 32) + (threadIdx.x >> 5); pair < total;
         pair += step) {
        const int r = (int)(pair / H), s0 = __ldg(indptr + r);
        const Sources S = {src + s0, 0, 0, __ldg(indptr + r + 1) - s0};
        merge_pair<32>(a, meta, __ldg(out_row + r), S, (int)(pair % H), VP,
                       rows[fi_v::OUTPUT ? threadIdx.x >> 5 : 0]);
    }
}
#endif
