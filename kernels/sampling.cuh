/*
 * sampling.cuh — softmax, sampling (top-k / top-p / min-p), the filters
 * (top_k / top_p renorm, top_k_mask_logits), chain speculative sampling
 * and top-k on the GPU: one block of 1024 threads per row (select.cuh),
 * blocks striding over the rows; softmax, sampling and the filters also
 * run a row on the CTAs of a cluster (a team, select.cuh) when the launch
 * gives one (few rows: src/cuda/sampling_ops.c), clusters striding over
 * the rows. One kernel per compile (src/cuda/sampling_ops.c builds the
 * name and the options):
 *
 *   FI_SV_KIND   4 softmax, 5 sampling, 6 filter, 7 chain speculative, 8 top-k
 *   FI_SV_XT     the input's dtype (spec: the draft's); FI_SV_OT the output's
 *                (softmax, renorm); FI_SV_TT spec: the target's
 *   FI_SV_LOGITS sampling: the input is logits (drawn as their softmax)
 *   FI_SV_OP     filter: 0 top_k renorm, 1 top_p renorm, 2 top_k mask
 *   FI_SV_RAGGED top-k: rows from an indptr
 *   FI_SV_NAME   the entry point
 *
 * Every op is the CPU backend's (src/cpu/ops_sample.c) with the same
 * results bit for bit (select.cuh): the same thresholds, the same f32 and
 * f64 sums in the same order, the same Philox draws, so both backends give
 * the same tokens for the same (seed, offset). Values the CPU backend
 * refuses before running but the host cannot read here (device memory)
 * are handled in the kernels: a sampling row index outside the input, or
 * top_p / min_p outside [0, 1], gives that output no token (valid 0); a
 * temperature <= 0 or not finite a NaN softmax row; a renorm top_p outside
 * [0, 1] a NaN row; a draft token id outside the vocabulary is rejected
 * (never emitted); top-k lengths are clamped to [0, N] and a ragged
 * indptr to the input.
 */
#include "select.cuh"

#ifndef FI_SV_NAME
#define FI_SV_NAME fi_sv_default
#endif
#ifndef FI_SV_KIND
#define FI_SV_KIND 5
#endif
#ifndef FI_SV_XT
#define FI_SV_XT FI_T_F32
#endif
#ifndef FI_SV_OT
#define FI_SV_OT FI_SV_XT
#endif
#ifndef FI_SV_TT
#define FI_SV_TT FI_SV_XT
#endif
#ifndef FI_SV_LOGITS
#define FI_SV_LOGITS 0
#endif
#ifndef FI_SV_OP
#define FI_SV_OP 0
#endif
#ifndef FI_SV_RAGGED
#define FI_SV_RAGGED 0
#endif

namespace fi_sv {

/* Element i of a strided row of dtype T, as f32. */
template <int T>
struct row_of {
    const char *p;
    int64_t col;
    FI_DEV float operator()(int64_t i) const { return fi_load_elem<T>(p + i * col); }
};

/* e^(x - m) where x >= thr, else 0 (the CPU's exp_sum weights, scale s). */
template <int T>
struct exp_of {
    row_of<T> x;
    float m, s, thr;
    FI_DEV float of(float v) const {
        const float e = sv_exp(mul(sub(v, m), s));
        return v >= thr ? e : 0.0f;
    }
    FI_DEV float operator()(int64_t i) const { return of(x(i)); }
};

/* max(t - d, 0) (chain speculative sampling's residual distribution). */
template <int D, int T>
struct residual_of {
    row_of<D> d;
    row_of<T> t;
    FI_DEV float operator()(int64_t i) const {
        const float e = sub(t(i), d(i));
        return e > 0.0f ? e : 0.0f;
    }
};

/* The bits of -inf in dtype T, stored at p. */
template <int T>
FI_DEV void store_neg_inf(char *p) {
    if constexpr (T == FI_T_F32) *reinterpret_cast<uint32_t *>(p) = 0xff800000u;
    else *reinterpret_cast<uint16_t *>(p) = T == FI_T_F16 ? 0xfc00u : 0xff80u;
}

} // namespace fi_sv

/* ============================================================== softmax */
#if FI_SV_KIND == 4

extern "C" __global__ void __launch_bounds__(1024) FI_SV_NAME(const fi_sv_softmax_args a) {
    using namespace fi_sv;
    __shared__ shm s;
    uint32_t rank, size, cluster, clusters;
    cluster_place(&rank, &size, &cluster, &clusters);
    const team t = team_of(rank, size, a.vocab);
    for (int64_t r = cluster; r < a.rows; r += clusters) {
        const row_of<FI_SV_XT> x{a.x + r * a.x_row, a.x_col};
        char *out = a.out + r * a.o_row;
        float m;
        uint32_t kinds;
        row_stats(s, t, x, &m, &kinds);
        const float temp = a.temp ? a.temp[r * a.temp_st] : a.temp_val;
        /* a NaN or +inf, only -inf, or (device values) a bad temperature */
        if ((kinds & (FI_SV_NAN | FI_SV_POS_INF)) || m == FI_NEG_INF || !(temp > 0.0f) ||
            temp == FI_POS_INF) {
            for (int64_t i = t.lo() + threadIdx.x; i < t.hi(); i += NT)
                fi_sv::store<FI_SV_OT>(out + i * a.o_col, __int_as_float(0x7fffffff));
            continue;
        }
        const exp_of<FI_SV_XT> e{x, m, dvd(1.0f, temp), FI_NEG_INF};
        const float inv = (float)(1.0 / block_total(s, t, e, a.vocab, FI_NEG_INF));
        row_map(t, x, [&](int64_t i, float xi) {
            fi_sv::store<FI_SV_OT>(out + i * a.o_col, mul(e.of(xi), inv));
        });
    }
    team_sync(t); /* no CTA leaves while the team reads its shared memory */
}

/* ============================================================= sampling */
#elif FI_SV_KIND == 5

namespace fi_sv {

/* Output b's token, or -1 when its filtered distribution has no mass (or
 * its row is no distribution). */
FI_DEV int64_t sample_row(shm &s, const team &tm, const fi_sv_sample_args &a, int64_t b) {
    int64_t row = b;
    if (a.indices) {
        row = a.indices[b * a.idx_st];
        if (row < 0 || row >= a.rows) return -1;
    }
    const row_of<FI_SV_XT> x{a.x + row * a.x_row, a.x_col};
    const int64_t v = a.vocab;
    float m;
    uint32_t kinds;
    row_stats(s, tm, x, &m, &kinds);
    const int32_t top_k = a.use_top_k ? (a.top_k ? a.top_k[b * a.tk_st] : a.top_k_val) : 0;
    const float top_p = a.use_top_p ? (a.top_p ? a.top_p[b * a.tp_st] : a.top_p_val) : 1.0f;
    const float min_p = a.use_min_p ? (a.min_p ? a.min_p[b * a.mp_st] : a.min_p_val) : 0.0f;
    if (!(top_p >= 0.0f && top_p <= 1.0f) || !(min_p >= 0.0f && min_p <= 1.0f)) return -1;
    const bool joint = a.use_top_k && a.joint;
    const double u = uniform(a.seed, a.offset, (uint32_t)b, 0);
    float t = 0.0f; /* kept: w >= t */
#if FI_SV_LOGITS
    if ((kinds & (FI_SV_NAN | FI_SV_POS_INF)) || m == FI_NEG_INF) return -1;
    /* top-k ranks the logits; top-p the softmax weights after it (top-k
     * first) or of the whole row (joint) */
    const float tk = top_k_threshold(s, tm, x, v, top_k);
    if (top_p < 1.0f)
        t = top_p_threshold(s, tm, exp_of<FI_SV_XT>{x, m, 1.0f, joint ? FI_NEG_INF : tk}, v, top_p,
                            0.0f);
    return draw(s, tm, exp_of<FI_SV_XT>{x, m, 1.0f, tk}, v, t, u);
#else
    if (kinds) return -1;
    const float tk = top_k_threshold(s, tm, x, v, top_k);
    t = tk > 0.0f ? tk : 0.0f;
    if (a.use_min_p) {
        const float mp = mul(min_p, m);
        t = mp > t ? mp : t;
    }
    if (top_p < 1.0f) {
        const float tp = top_p_threshold(s, tm, x, v, top_p, joint ? 0.0f : t);
        t = tp > t ? tp : t;
    }
    return draw(s, tm, x, v, t, u);
#endif
}

} // namespace fi_sv

extern "C" __global__ void __launch_bounds__(1024) FI_SV_NAME(const fi_sv_sample_args a) {
    using namespace fi_sv;
    __shared__ shm s;
    uint32_t rank, size, cluster, clusters;
    cluster_place(&rank, &size, &cluster, &clusters);
    const team t = team_of(rank, size, a.vocab);
    for (int64_t b = cluster; b < a.batch; b += clusters) {
        const int64_t tok = sample_row(s, t, a, b);
        if (rank == 0 && threadIdx.x == 0) {
            a.samples[b * a.s_st] = tok >= 0 ? (int32_t)tok : 0;
            if (a.valid) a.valid[b * a.v_st] = tok >= 0;
        }
    }
    team_sync(t); /* no CTA leaves while the team reads its shared memory */
}

/* ============================================================== filters */
#elif FI_SV_KIND == 6

extern "C" __global__ void __launch_bounds__(1024) FI_SV_NAME(const fi_sv_filter_args a) {
    using namespace fi_sv;
    constexpr int XT = FI_SV_XT, OT = FI_SV_OT;
    __shared__ shm s;
    const int64_t v = a.vocab;
    uint32_t rank, size, cluster, clusters;
    cluster_place(&rank, &size, &cluster, &clusters);
    const team tm = team_of(rank, size, v);
    for (int64_t r = cluster; r < a.rows; r += clusters) {
        const row_of<XT> x{a.x + r * a.x_row, a.x_col};
        char *out = a.out + r * a.o_row;
#if FI_SV_OP == 2
        /* logits outside the top-k become -inf; the kept ones are copied
         * bit for bit (left alone in place) */
        constexpr int ES = fi_dtype_bytes<XT>::value;
        const int32_t k = a.top_k ? a.top_k[r * a.tk_st] : a.top_k_val;
        const bool all = k <= 0 || (int64_t)k >= v;
        bool none;
        const uint32_t t =
            all ? 0u : select_key(s, tm, x, v, 0u, false, (double)k, 0.0, &none, nullptr);
        if (all && a.in_place) continue;
        row_map(tm, x, [&](int64_t i, float xi) {
            if (!all && key_of(xi) < t) store_neg_inf<XT>(out + i * a.o_col);
            else if (!a.in_place) fi_copy_raw<ES>(out + i * a.o_col, x.p + i * a.x_col);
        });
#else
        float m;
        uint32_t kinds;
        row_stats(s, tm, x, &m, &kinds);
        const float p = FI_SV_OP == 1 ? (a.top_p ? a.top_p[r * a.tp_st] : a.top_p_val) : 1.0f;
        if (kinds || !(p >= 0.0f && p <= 1.0f)) { /* no distribution: NaN */
            for (int64_t i = tm.lo() + threadIdx.x; i < tm.hi(); i += NT)
                fi_sv::store<OT>(out + i * a.o_col, __int_as_float(0x7fffffff));
            continue;
        }
        const int32_t k = FI_SV_OP == 0 && a.top_k ? a.top_k[r * a.tk_st] : a.top_k_val;
        const float t = FI_SV_OP == 0 ? top_k_threshold(s, tm, x, v, k)
                                      : top_p_threshold(s, tm, x, v, p, 0.0f);
        const double total = block_total(s, tm, x, v, t);
        const float inv = total > 0.0 ? (float)(1.0 / total) : 0.0f;
        row_map(tm, x, [&](int64_t i, float xi) {
            fi_sv::store<OT>(out + i * a.o_col, xi >= t ? mul(xi, inv) : 0.0f);
        });
#endif
    }
    team_sync(tm); /* no CTA leaves while the team reads its shared memory */
}

/* ==================================================== chain speculative */
#elif FI_SV_KIND == 7

extern "C" __global__ void __launch_bounds__(1024) FI_SV_NAME(const fi_sv_spec_args a) {
    using namespace fi_sv;
    constexpr int DT = FI_SV_XT, TT = FI_SV_TT;
    __shared__ shm s;
    const int lane = threadIdx.x & 31;
    const team solo = team_of(0, 1, a.vocab);
    for (int64_t b = blockIdx.x; b < a.batch; b += gridDim.x) {
        /* positions accepted each on its own, and the first rejected one */
        if (threadIdx.x < 32) {
            int32_t accepted = 0;
            int64_t first = a.n;
            for (int64_t i0 = 0; i0 < a.n; i0 += 32) {
                const int64_t i = i0 + lane;
                bool ok = false;
                if (i < a.n) {
                    const int32_t tok = a.ids[b * a.ids_b + i * a.ids_i];
                    if (tok >= 0 && tok < a.vocab) { /* an id outside: rejected */
                        const double u = uniform(a.seed, a.offset, (uint32_t)b, (uint32_t)i);
                        const float d = fi_load_elem<DT>(a.dp + b * a.dp_b + i * a.dp_i + tok * a.dp_v);
                        const float t = fi_load_elem<TT>(a.tp + b * a.tp_b + i * a.tp_i + tok * a.tp_v);
                        ok = u * (double)d < (double)t;
                    }
                }
                const unsigned acc = __ballot_sync(FULL, ok), rej = __ballot_sync(FULL, !ok && i < a.n);
                accepted += __popc(acc);
                if (rej && first == a.n) first = i0 + __ffs(rej) - 1;
            }
            if (lane == 0) s.iv[0] = first, s.iv[1] = accepted;
        }
        __syncthreads();
        const int64_t emitted = s.iv[0];
        const int32_t accepted = (int32_t)s.iv[1];
        /* the token at `emitted`: from max(target - draft, 0) after a
         * rejection (the target row when that is all 0), else the bonus
         * token from the target */
        const row_of<TT> t{a.tp + b * a.tp_b + emitted * a.tp_i, a.tp_v};
        const double u = uniform(a.seed, a.offset, (uint32_t)b, (uint32_t)a.n);
        int64_t tok = -1;
        if (emitted < a.n) {
            const row_of<DT> d{a.dp + b * a.dp_b + emitted * a.dp_i, a.dp_v};
            tok = draw(s, solo, residual_of<DT, TT>{d, t}, a.vocab, 0.0f, u);
        }
        if (tok < 0) tok = draw(s, solo, t, a.vocab, 0.0f, u);
        if (tok < 0) tok = 0;
        for (int64_t i = threadIdx.x; i <= a.n; i += NT)
            a.out_ids[b * a.out_b + i * a.out_i] =
                i < emitted ? a.ids[b * a.ids_b + i * a.ids_i] : i == emitted ? (int32_t)tok : -1;
        if (threadIdx.x == 0) {
            if (a.acc) a.acc[b * a.acc_st] += accepted;
            if (a.emi) a.emi[b * a.emi_st] += (int32_t)emitted;
        }
        __syncthreads(); /* s.iv is read */
    }
}

/* ================================================================ top-k */
#elif FI_SV_KIND == 8

namespace fi_sv {

/* Exclusive prefix counts, in thread order, of two flags over the block;
 * *ta, *tb the block's totals. */
FI_DEV void scan2(shm &s, bool fa, bool fb, int *pa, int *pb, int *ta, int *tb) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned ba = __ballot_sync(FULL, fa), bb = __ballot_sync(FULL, fb);
    const unsigned below = (1u << lane) - 1u;
    __syncthreads();
    if (lane == 0) s.redu[warp] = (uint32_t)__popc(ba) | (uint32_t)__popc(bb) << 16;
    __syncthreads();
    uint32_t before = 0, all = 0;
    for (int w = 0; w < NW; w++) {
        const uint32_t c = s.redu[w];
        if (w < warp) before += c;
        all += c;
    }
    *pa = (int)(before & 0xffffu) + __popc(ba & below);
    *pb = (int)(before >> 16) + __popc(bb & below);
    *ta = (int)(all & 0xffffu), *tb = (int)(all >> 16);
}

/* Sort s.u.pairs[0, n) descending (bitonic over the next power of two,
 * zeros padding: every real pair is larger). */
FI_DEV void sort_pairs(shm &s, int n) {
    int p = 1;
    while (p < n) p <<= 1;
    for (int i = n + threadIdx.x; i < p; i += NT) s.u.pairs[i] = 0ull;
    __syncthreads();
    for (int k = 2; k <= p; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < p; i += NT) {
                const int o = i ^ j;
                if (o <= i) continue;
                const unsigned long long x = s.u.pairs[i], y = s.u.pairs[o];
                if ((i & k) == 0 ? x < y : x > y) s.u.pairs[i] = y, s.u.pairs[o] = x;
            }
            __syncthreads();
        }
}

} // namespace fi_sv

extern "C" __global__ void __launch_bounds__(1024) FI_SV_NAME(const fi_sv_topk_args a) {
    using namespace fi_sv;
    constexpr int XT = FI_SV_XT, ES = fi_dtype_bytes<XT>::value;
    __shared__ shm s;
    for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
        int64_t begin = 0, len, off = 0;
#if FI_SV_RAGGED
        begin = a.indptr[r * a.ptr_st];
        int64_t end = a.indptr[(r + 1) * a.ptr_st];
        begin = begin < 0 ? 0 : begin > a.cols ? a.cols : begin;
        end = end < begin ? begin : end > a.cols ? a.cols : end;
        len = end - begin;
        const row_of<XT> x{a.x + begin * a.x_col, a.x_col};
#else
        len = a.lengths ? a.lengths[r * a.len_st] : a.cols;
        len = len < 0 ? 0 : len > a.cols ? a.cols : len;
        if (a.offsets) off = a.offsets[r * a.off_st];
        const row_of<XT> x{a.x + r * a.x_row, a.x_col};
#endif
        const int64_t kk = len < a.k ? len : a.k;
        /* bands of PAIRS ranks [r0, r1): the keys at ranks r1 - 1 (t_lo, with
         * a_lo larger keys) and r0 - 1 (t_hi, the band before's t_lo); ties
         * at either go to the smaller indices first */
        uint32_t t_hi = 0;
        double a_hi = 0.0;
        for (int64_t r0 = 0; r0 < kk; r0 += PAIRS) {
            const int64_t r1 = r0 + PAIRS < kk ? r0 + PAIRS : kk;
            bool none;
            double a_lo;
            const uint32_t t_lo =
                select_key(s, team_of(0, 1, len), x, len, 0u, false, (double)r1, 0.0, &none, &a_lo);
            __syncthreads();
            if (threadIdx.x == 0) s.ncand = 0;
            int64_t q_hi = 0, q_lo = 0; /* ties seen so far, in index order */
            uint32_t keys[AHEAD];
            __syncthreads();
            for (int64_t i0 = 0; i0 < len; i0 += NT) {
                /* keys loaded AHEAD chunks at a time, each chunk then scanned in order */
                const int j = (int)((i0 / NT) % AHEAD);
                if (j == 0)
#pragma unroll
                    for (int c = 0; c < AHEAD; c++) {
                        const int64_t ic = i0 + (int64_t)c * NT + threadIdx.x;
                        keys[c] = ic < len ? key_of(x(ic)) : 0u;
                    }
                const int64_t i = i0 + threadIdx.x;
                uint32_t key = 0u;
#pragma unroll
                for (int c = 0; c < AHEAD; c++) key = c == j ? keys[c] : key;
                const bool live = i < len;
                int ph, pl, th, tl;
                scan2(s, live && r0 > 0 && key == t_hi, live && key == t_lo, &ph, &pl, &th, &tl);
                const int64_t rank_hi = (int64_t)a_hi + q_hi + ph, rank_lo = (int64_t)a_lo + q_lo + pl;
                bool in;
                if (r0 == 0) in = key > t_lo || (key == t_lo && rank_lo < r1);
                else if (t_hi == t_lo) in = key == t_hi && rank_hi >= r0 && rank_hi < r1;
                else in = (key < t_hi && key > t_lo) || (key == t_hi && rank_hi >= r0) ||
                          (key == t_lo && rank_lo < r1);
                if (live && in) { /* r1 - r0 <= PAIRS of them */
                    const int slot = atomicAdd(&s.ncand, 1);
                    if (slot < PAIRS)
                        s.u.pairs[slot] = (unsigned long long)key << 32 | (uint32_t) ~(uint32_t)i;
                }
                q_hi += th, q_lo += tl;
            }
            __syncthreads();
            const int n = s.ncand < PAIRS ? s.ncand : PAIRS;
            sort_pairs(s, n);
            for (int c = threadIdx.x; c < n; c += NT) {
                const int64_t idx = (int64_t)(uint32_t) ~(uint32_t)s.u.pairs[c];
                const int64_t slot = r0 + c;
                a.idx[r * a.idx_r + slot * a.idx_c] = (int32_t)(idx + off);
                if (a.vals) fi_copy_raw<ES>(a.vals + r * a.val_r + slot * a.val_c, x.p + idx * a.x_col);
            }
            t_hi = t_lo, a_hi = a_lo;
        }
        for (int64_t c = kk + threadIdx.x; c < a.k; c += NT) {
            a.idx[r * a.idx_r + c * a.idx_c] = -1;
            if (a.vals) store_neg_inf<XT>(a.vals + r * a.val_r + c * a.val_c);
        }
        __syncthreads(); /* s.u.pairs is read */
    }
}

#else
#error "FI_SV_KIND must be 4 (softmax) to 8 (top-k) in sampling.cuh"
#endif
