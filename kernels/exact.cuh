/*
 * exact.cuh — one query row of a work item computed again exactly as
 * docs/SEMANTICS.md ("Non-finite values") says, by one warp, for the
 * attention kernels' rows whose fast result is not finite.
 *
 * The fast paths (attention.cuh, attention_tc.cuh, attention_wg.cuh,
 * decode_tc.cuh) take maxima with fmaxf (a NaN logit is passed over) and
 * feed a masked key's V to the MMA with weight 0 (0 x NaN is NaN), so
 * their answer on non-finite inputs is not the contract's. But every such
 * case leaves an element of the row's written O that is not finite: a NaN
 * or +inf logit makes l and P NaN (2^NaN, 2^(inf - inf)), so O is NaN; a
 * NaN or infinity in V, or a sum past f32, shows in O itself. So:
 *
 *   1. each kernel checks the O it writes (fi_row_bad: one sum of |O|
 *      over a thread's elements of a row, one test) and remembers whether
 *      any row failed;
 *   2. only then, after its item loops (inside them, this code cost the
 *      tile loops registers: spills, uniform arithmetic moved to IMAD +
 *      R2UR), it walks its items again and each row whose written O is not
 *      finite (fi_exact_recheck) is computed again by fi_exact_row, which
 *      writes it over the fast path's output:
 *
 *   keys of the item the row sees (causal, window, custom bits), logits
 *   formed as the kernels form them (the f32 q (and k) rows, RoPE rotated
 *   where built in, the dot product in f64, q_scale, soft-cap, ALiBi);
 *   a NaN or +inf logit: O and LSE NaN; -inf: the key dropped, its V not
 *   read; else O = sum_j 2^(s_j - m) v_j / l in f64, every kept v read
 *   whatever its weight; no key kept: O = 0, LSE = -inf.
 *
 * As src/cpu/attention.c's exact_row does, per item: a split row's
 * partial state is exact before the merge kernel reads it (merge.cuh keeps
 * the merge rules). The persistent kernel merges split rows while it runs:
 * a merged row that is not finite is computed again over the request's
 * keys whole (persistent.cuh fix_rows). Built-in variants only: a user
 * variant's hooks decide, with no recomputation (as on the CPU).
 *
 * Lanes take the dims (lane, lane + 32, ...), keys go one at a time: slow
 * (a key costs a warp reduction), and only rows that need it come here.
 *
 * Included by each kernel after variant.cuh (its fi_v configuration).
 */
#ifndef FI_EXACT_CUH
#define FI_EXACT_CUH

#include "work.cuh"

template <int QT, int KT, int OT, int DQK, int DVO, int GROUP, bool PAGED, bool DEVICE_TABLE,
          bool CAUSAL, bool ROPE>
FI_DEV void fi_exact_row(const fi_attn_args &a, const fi_item &it, const int32_t *kv_indices,
                         const int64_t *mask_offset, const float *alibi, int p) {
    constexpr int NQ = (DQK + 31) / 32, NV = (DVO + 31) / 32;
    constexpr bool TRANSFORM = fi_v::NATURAL;
    const int lane = threadIdx.x & 31;
    const int t = it.q0 + p / GROUP, head = it.hkv * GROUP + p % GROUP;
    const int diag = it.kv_len - it.qo_len + t;
    fi_variant_params VP = fi_v::params(a, alibi);
    const int64_t bit0 = fi_v::mask_bit0(VP, mask_offset, it.req);
    const float slope = fi_v::row_slope(VP, head);

    /* the lane's q elements as f32 (rotated at the row's position) */
    const char *qrow = a.q + (it.qo_base + t) * a.q_tok + (int64_t)head * a.q_head;
    float q[NQ];
#pragma unroll
    for (int i = 0; i < NQ; i++) {
        const int d = lane + 32 * i;
        q[i] = 0.0f;
        if (d >= DQK) continue;
        q[i] = fi_load_elem<QT>(qrow + d * a.q_dim);
        if constexpr (ROPE) {
            const int pd = d < DQK / 2 ? d + DQK / 2 : d - DQK / 2;
            q[i] = fi_rope_pair(q[i], fi_load_elem<QT>(qrow + pd * a.q_dim), d < DQK / 2,
                                fi_rope_freq(a.rope_theta, a.rope_scale, d % (DQK / 2), DQK), diag);
        }
    }

    int lo = it.k0, hi = it.k1;
    if constexpr (CAUSAL) hi = hi < diag + 1 ? hi : diag + 1;
    double m = __longlong_as_double((long long)0xfff0000000000000ull) /* -inf */, l = 0.0, acc[NV];
#pragma unroll
    for (int i = 0; i < NV; i++) acc[i] = 0.0;
    bool poisoned = false;
#pragma unroll 1
    for (int j = lo; j < hi; j++) {
        const fi_hook_ctx hc = fi_v::ctx(it.req, head, it.hkv, diag, j, it.qo_len, it.kv_len, DQK,
                                         a.sm_scale, slope);
        if constexpr (fi_v::ANY_MASK)
            if (!fi_v::visible(hc, VP, a, bit0)) continue;
        int64_t ko, vo;
        fi_kv_offsets<PAGED, DEVICE_TABLE>(a, kv_indices, it, j, &ko, &vo);
        double dot = 0.0;
#pragma unroll
        for (int i = 0; i < NQ; i++) {
            const int d = lane + 32 * i;
            if (d >= DQK) continue;
            float k = fi_load_elem<KT>(a.k + ko + d * a.k_dim);
            if constexpr (ROPE) {
                const int pd = d < DQK / 2 ? d + DQK / 2 : d - DQK / 2;
                k = fi_rope_pair(k, fi_load_elem<KT>(a.k + ko + pd * a.k_dim), d < DQK / 2,
                                 fi_rope_freq(a.rope_theta, a.rope_scale, d % (DQK / 2), DQK), j);
            }
            dot += (double)q[i] * k;
        }
#pragma unroll
        for (int off = 16; off >= 1; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        float x = (float)dot * a.q_scale; /* log2 domain, or (a transform) natural */
        if constexpr (TRANSFORM) {
            x = fi_v::logits(x, hc, VP);
            x *= 1.4426950408889634f;
        }
        if (!(x < FI_POS_INF)) { /* NaN or +inf */
            poisoned = true;
            break;
        }
        if (x == FI_NEG_INF) continue;
        if (x > m) { /* what is summed so far, to the new maximum */
            const double r = exp2(m - x);
            l *= r;
#pragma unroll
            for (int i = 0; i < NV; i++) acc[i] *= r;
            m = x;
        }
        const double w = exp2(x - m);
        l += w;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int d = lane + 32 * i;
            if (d < DVO) acc[i] += w * fi_load_elem<KT>(a.v + vo + d * a.v_dim);
        }
    }

    float lse;
    float out[NV];
    if (poisoned || l == 0.0) {
        const float fill = poisoned ? FI_NAN : 0.0f;
#pragma unroll
        for (int i = 0; i < NV; i++) out[i] = fill;
        lse = poisoned ? fill : FI_NEG_INF;
    } else {
        const double inv = (double)a.v_scale / l;
#pragma unroll
        for (int i = 0; i < NV; i++) out[i] = (float)(acc[i] * inv);
        lse = (float)(m + log2(l));
    }
    if (it.prow >= 0) {
        const int64_t row = (int64_t)(it.prow + t - it.q0) * a.num_qo_heads + head;
#pragma unroll
        for (int i = 0; i < NV; i++)
            if (lane + 32 * i < DVO) a.partial_o[row * DVO + lane + 32 * i] = out[i];
        if (lane == 0) a.partial_lse[row] = lse;
    } else {
        const int64_t tok = it.qo_base + t;
        char *orow = a.o + tok * a.o_tok + (int64_t)head * a.o_head;
#pragma unroll
        for (int i = 0; i < NV; i++)
            if (lane + 32 * i < DVO) fi_store_elem<OT>(orow + (int64_t)(lane + 32 * i) * a.o_dim, out[i]);
        if (lane == 0 && a.lse) a.lse[tok * a.lse_tok + (int64_t)head * a.lse_head] = lse;
    }
}

/* Row p of item `it` as the kernel wrote it (its partial row, or its output
 * row, dtype OT): an element that is not finite sends the row to
 * fi_exact_row. One warp, after the row's writes are ordered before it. */
template <int QT, int KT, int OT, int DQK, int DVO, int GROUP, bool PAGED, bool DEVICE_TABLE,
          bool CAUSAL, bool ROPE>
FI_DEV void fi_exact_recheck(const fi_attn_args &a, const fi_item &it, const int32_t *kv_indices,
                             const int64_t *mask_offset, const float *alibi, int p) {
    const int lane = threadIdx.x & 31;
    const int t = it.q0 + p / GROUP, head = it.hkv * GROUP + p % GROUP;
    bool bad = false;
    if (it.prow >= 0) {
        const float *row = a.partial_o + ((int64_t)(it.prow + t - it.q0) * a.num_qo_heads + head) * DVO;
        for (int d = lane; d < DVO; d += 32) bad = bad || !fi_finite(row[d]);
    } else {
        const char *row = a.o + (it.qo_base + t) * a.o_tok + (int64_t)head * a.o_head;
        for (int d = lane; d < DVO; d += 32) bad = bad || !fi_finite(fi_load_elem<OT>(row + d * a.o_dim));
    }
    if (__any_sync(0xffffffffu, bad))
        fi_exact_row<QT, KT, OT, DQK, DVO, GROUP, PAGED, DEVICE_TABLE, CAUSAL, ROPE>(
            a, it, kv_indices, mask_offset, alibi, p);
}

/* Whether a row as an epilogue writes it needs fi_exact_row: l NaN or
 * +inf (a NaN or +inf logit), or an element of O x inv not finite. sabs:
 * the sum of |O| over this thread's elements of the row (one FADD an
 * element: a NaN or an infinity in any shows in the sum; a finite sum past
 * f32 costs only an exact recomputation that changes nothing). */
FI_DEV bool fi_row_bad(float sabs, float inv, float L) {
    return !(fabsf(sabs * inv) < FI_POS_INF) || !(L < FI_POS_INF);
}

#endif /* FI_EXACT_CUH */
