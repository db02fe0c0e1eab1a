/*
 * select.cuh — one block of 1024 threads over one row of up to 2^31
 * values, no sort of the row (kernels/sampling.cuh's ops): the row's
 * largest value and the kinds of values it holds, the exact threshold of a
 * top-k or top-p filter by a radix select, and an exact inverse-CDF draw.
 * Each is the CPU's computation (src/cpu/ops_sample.c) with the same
 * results, bit for bit:
 *
 * - Select: the order-preserving 32-bit keys in three levels of 11, 11
 *   and 10 bits. Each level is a shared histogram of the candidates the
 *   level before left: counts (top-k) and, for top-p, the masses. A
 *   level-0 bucket holds values of one exponent, so a bucket's mass is an
 *   integer sum of 24-bit mantissas (shared u32 atomics with a carry word:
 *   exact, the same in any order), times that exponent's power of two: the
 *   CPU's f64 sum of those values is exact too (V < 2^29), so both have the
 *   same bucket masses. The row total and the walk from the top bucket
 *   down (the running mass above) are f64 sums in the CPU's bucket order,
 *   done by one warp. Candidates that fit (at most CAND) are gathered into
 *   shared memory on the way, so later levels need not read the row again.
 * - Draw: blocks of 1024 values, each summed as the CPU sums it (16 lanes,
 *   lane l adding values l, l + 16, ... in order, then lanes pairwise),
 *   blocks added in f64 in order; the block where u x total falls, then
 *   that block's values in index order.
 *
 * A row's values come from a functor (v(i): the value of element i as the
 * CPU's f32 row holds it), re-read or recomputed on every pass: rows stay
 * in global memory (L2), the block's shared memory holds the histograms.
 */
#ifndef FI_SELECT_CUH
#define FI_SELECT_CUH

#include "serving_math.cuh"

namespace fi_sv {

constexpr int NT = 1024, NW = NT / 32;
constexpr int BUCKETS = 2048;  /* level 0 and 1 (level 2: 1024) */
constexpr int CAND = 4096;     /* candidate keys gathered in shared memory */
constexpr int BLK = 1024;      /* elements per draw block (FI_SV_BLOCK) */
constexpr int SB = 1024;       /* block sums held at once */
constexpr int PAIRS = 4096;    /* top-k: (key, index) pairs sorted at once */
constexpr uint32_t FULL = 0xffffffffu;

#define FI_SV_NEGATIVE 1u
#define FI_SV_NAN 2u
#define FI_SV_POS_INF 4u

/* The block's shared memory: 40 KB of histograms (reused for the draw's
 * block sums and last block, and top-k's pairs), and the values one warp
 * computes for the whole block. */
struct shm {
    uint32_t count[BUCKETS]; /* draw: the last block's weights (floats) */
    union {
        struct {
            uint32_t mlo[BUCKETS], mhi[BUCKETS]; /* mantissa sums: low word, carries */
            uint32_t cand[CAND];
        } s;
        double blocks[SB];
        unsigned long long pairs[PAIRS];
    } u;
    float redf[NW];
    uint32_t redu[NW];
    double dv[3];
    int64_t iv[3];
    int ncand;
};

/* ------------------------------------------------------------- stats */

/* The largest value of v over [0, n) (NaN ignored; -inf when none) and the
 * kinds it holds (FI_SV_NEGATIVE | FI_SV_NAN | FI_SV_POS_INF), in every
 * thread. */
template <class F>
FI_DEV void row_stats(shm &s, const F &v, int64_t n, float *max, uint32_t *kinds) {
    float m = FI_NEG_INF;
    uint32_t k = 0;
    for (int64_t i = threadIdx.x; i < n; i += NT) {
        const float x = v(i);
        m = vmax(m, x);
        k |= (x < 0.0f ? FI_SV_NEGATIVE : 0u) | (x != x ? FI_SV_NAN : 0u) |
             (x == FI_POS_INF ? FI_SV_POS_INF : 0u);
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        m = vmax(m, __shfl_xor_sync(FULL, m, o));
        k |= __shfl_xor_sync(FULL, k, o);
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s.redf[threadIdx.x >> 5] = m, s.redu[threadIdx.x >> 5] = k;
    __syncthreads();
    m = s.redf[threadIdx.x & 31], k = s.redu[threadIdx.x & 31];
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        m = vmax(m, __shfl_xor_sync(FULL, m, o));
        k |= __shfl_xor_sync(FULL, k, o);
    }
    *max = m, *kinds = k;
}

/* ------------------------------------------------------------ select */

/* Count key into bucket b (and its mantissa into the mass), every lane of
 * the warp calling with its own bucket (0xffffffff: nothing): lanes of one
 * bucket are added by one atomic of their leader. */
FI_DEV void hist_add(shm &s, uint32_t b, uint32_t key, bool mass) {
    const uint32_t u = key & 0x7fffffffu, e = u >> 23;
    const uint32_t mant = (u & 0x7fffffu) | (e ? 0x800000u : 0u);
#if __CUDA_ARCH__ >= 800
    const unsigned peers = __match_any_sync(FULL, b);
    const uint32_t msum = mass ? __reduce_add_sync(peers, b == 0xffffffffu ? 0u : mant) : 0u;
    if (b == 0xffffffffu || (threadIdx.x & 31) != (uint32_t)(__ffs(peers) - 1)) return;
    atomicAdd(&s.count[b], (uint32_t)__popc(peers));
#else
    if (b == 0xffffffffu) return;
    const uint32_t msum = mant;
    atomicAdd(&s.count[b], 1u);
#endif
    if (mass) {
        const uint32_t old = atomicAdd(&s.u.s.mlo[b], msum);
        if (old + msum < old) atomicAdd(&s.u.s.mhi[b], 1u); /* the carry */
    }
}

/* The mass of bucket b as a double: its mantissa sum times 2^(E - 150),
 * E the biased exponent of its values (1 for subnormals and zero). */
FI_DEV double bucket_mass(const shm &s, int b, uint32_t e) {
    const uint64_t m = (uint64_t)s.u.s.mhi[b] << 32 | s.u.s.mlo[b];
    const int64_t ex = (int64_t)(e ? e : 1u) - 150 + 1023;
    return (double)m * __longlong_as_double(ex << 52);
}

/* One level's buckets [0, nb) read by one warp: (lvl 0, mass) the total
 * in ascending order; then from the top the first non-empty bucket whose
 * sum with *above reaches *target, *above += the buckets over it. -1 when
 * none does. Every lane returns the same. */
FI_DEV int boundary(shm &s, int nb, int lvl, bool mass, uint32_t e0, double frac, double *above,
                    double *target) {
    const int lane = threadIdx.x & 31;
    if (mass && lvl == 0) {
        double total = 0.0;
        for (int c = 0; c < nb; c += 32) {
            const int b = c + lane;
            unsigned nz = __ballot_sync(FULL, s.count[b] != 0);
            const double mv = bucket_mass(s, b, ((uint32_t)b >> 2) & 0xffu);
            while (nz) {
                const int l = __ffs(nz) - 1;
                nz &= nz - 1;
                total += __shfl_sync(FULL, mv, l);
            }
        }
        *target = frac * total;
    }
    for (int c = nb - 32; c >= 0; c -= 32) {
        const int b = c + lane;
        const uint32_t cnt = s.count[b];
        unsigned nz = __ballot_sync(FULL, cnt != 0);
        const double sv = mass ? bucket_mass(s, b, lvl == 0 ? ((uint32_t)b >> 2) & 0xffu : e0)
                               : (double)cnt;
        while (nz) {
            const int l = 31 - __clz(nz);
            nz &= ~(1u << l);
            const double x = __shfl_sync(FULL, sv, l);
            if (*above + x >= *target) return c + l;
            *above += x;
        }
    }
    return -1;
}

/* The key t with S(key > t) < X <= S(key >= t) over the values v(i),
 * i < n, whose key is >= lo, S counting them (mass false) or summing them
 * (mass: the values are >= 0); X is `count`, or frac x their total mass.
 * *all when they sum below X (then t = lo). *above_out (may be NULL):
 * S(key > t). Every thread returns the same. */
template <class F>
FI_DEV uint32_t select_key(shm &s, const F &v, int64_t n, uint32_t lo, bool mass, double count,
                           double frac, bool *all, double *above_out) {
    const int lane = threadIdx.x & 31;
    uint32_t prefix = 0, pmask = 0, e0 = 0;
    double above = 0.0, target = count;
    bool listed = false;
    int m = 0;
    int64_t left = n; /* candidates of this level (at most) */
    *all = false;
    for (int lvl = 0; lvl < 3; lvl++) {
        const int shift = lvl == 0 ? 21 : lvl == 1 ? 10 : 0, nb = lvl == 2 ? 1024 : 2048;
        const uint32_t bmask = (uint32_t)nb - 1;
        const bool gather = !listed && lvl < 2 && left <= CAND;
        __syncthreads(); /* the last level's histograms are read */
        for (int b = threadIdx.x; b < nb; b += NT) {
            s.count[b] = 0;
            if (mass) s.u.s.mlo[b] = s.u.s.mhi[b] = 0;
        }
        if (gather && threadIdx.x == 0) s.ncand = 0;
        __syncthreads();
        if (listed) {
            for (int c0 = threadIdx.x & ~31; c0 < m; c0 += NT) {
                const int c = c0 + lane;
                const uint32_t key = c < m ? s.u.s.cand[c] : 0u;
                const bool in = c < m && (key & pmask) == prefix;
                hist_add(s, in ? (key >> shift) & bmask : 0xffffffffu, key, mass);
            }
        } else {
            for (int64_t i0 = threadIdx.x & ~31; i0 < n; i0 += NT) {
                const int64_t i = i0 + lane;
                const uint32_t key = i < n ? key_of(v(i)) : 0u;
                const bool in = i < n && key >= lo && (key & pmask) == prefix;
                hist_add(s, in ? (key >> shift) & bmask : 0xffffffffu, key, mass);
                if (gather && in) s.u.s.cand[atomicAdd(&s.ncand, 1)] = key;
            }
        }
        __syncthreads();
        if (gather) listed = true, m = s.ncand;
        if (threadIdx.x < 32) {
            const int b = boundary(s, nb, lvl, mass, e0, frac, &above, &target);
            if (lane == 0) {
                s.iv[0] = b;
                s.iv[1] = b >= 0 ? s.count[b] : 0;
                s.dv[0] = above, s.dv[1] = target;
            }
        }
        __syncthreads();
        const int b = (int)s.iv[0];
        left = s.iv[1], above = s.dv[0], target = s.dv[1];
        if (b < 0) {
            *all = true;
            return lo;
        }
        if (lvl == 0) e0 = ((uint32_t)b >> 2) & 0xffu;
        prefix |= (uint32_t)b << shift;
        pmask |= bmask << shift;
    }
    if (above_out) *above_out = above;
    return prefix;
}

/* Threshold of top-k on v: the k-th largest value (k <= 0 or >= n: none,
 * -inf). */
template <class F>
FI_DEV float top_k_threshold(shm &s, const F &v, int64_t n, int32_t k) {
    if (k <= 0 || (int64_t)k >= n) return FI_NEG_INF;
    bool all;
    return value_of(select_key(s, v, n, 0u, false, (double)k, 0.0, &all, nullptr));
}

/* Threshold of top-p on weights w >= 0 among those >= lo (p >= 1: lo). */
template <class F>
FI_DEV float top_p_threshold(shm &s, const F &w, int64_t n, float p, float lo) {
    if (p >= 1.0f) return lo;
    bool all;
    const uint32_t t = select_key(s, w, n, key_of(lo), true, 0.0, (double)p, &all, nullptr);
    return all ? lo : value_of(t);
}

/* -------------------------------------------------------------- draw */

/* Sums of the w(i) >= t of blocks [b0, b1) of BLK elements into
 * s.u.blocks[b - b0], as the CPU's masked_sum sums a block. */
template <class W>
FI_DEV void block_sums(shm &s, const W &w, int64_t n, float t, int64_t b0, int64_t b1) {
    const int lane = threadIdx.x & 31;
    const int64_t tasks = (b1 - b0) * 16;
    for (int64_t k0 = threadIdx.x & ~31; k0 < tasks; k0 += NT) { /* uniform per warp */
        const int64_t task = k0 + lane;
        float acc = 0.0f;
        if (task < tasks) {
            const int64_t first = (b0 + task / 16) * BLK + (task & 15);
            if (first + 16 * 63 < n) {
#pragma unroll 8
                for (int j = 0; j < 64; j++) {
                    const float x = w(first + 16 * j);
                    acc = add(acc, x >= t ? x : 0.0f);
                }
            } else {
                for (int64_t i = first; i < n; i += 16) {
                    const float x = w(i);
                    acc = add(acc, x >= t ? x : 0.0f);
                }
            }
        }
#pragma unroll
        for (int o = 8; o; o >>= 1) acc = add(acc, __shfl_down_sync(FULL, acc, o, 16));
        if (task < tasks && (lane & 15) == 0) s.u.blocks[task / 16] = (double)acc;
    }
}

/* The f64 sum, in block order, of the blocks' sums (w >= t): the CPU's
 * block_total. Every thread returns it. */
template <class W>
FI_DEV double block_total(shm &s, const W &w, int64_t n, float t) {
    const int64_t nb = (n + BLK - 1) / BLK;
    double total = 0.0;
    for (int64_t g0 = 0; g0 < nb; g0 += SB) {
        const int64_t g1 = g0 + SB < nb ? g0 + SB : nb;
        __syncthreads(); /* s.u is free */
        block_sums(s, w, n, t, g0, g1);
        __syncthreads();
        if (threadIdx.x < 32)
            for (int64_t c = 0; c < g1 - g0; c += 32) {
                const double x = c + (threadIdx.x & 31) < g1 - g0 ? s.u.blocks[c + (threadIdx.x & 31)] : 0.0;
                unsigned nz = __ballot_sync(FULL, x != 0.0);
                while (nz) {
                    const int l = __ffs(nz) - 1;
                    nz &= nz - 1;
                    total += __shfl_sync(FULL, x, l);
                }
            }
    }
    __syncthreads();
    if (threadIdx.x == 0) s.dv[2] = total;
    __syncthreads();
    return s.dv[2];
}

/* The index drawn by u in [0, 1) from the weights w(i) >= t (w >= 0) over
 * [0, n): the CPU's draw. -1 when they have no positive finite mass. */
template <class W>
FI_DEV int64_t draw(shm &s, const W &w, int64_t n, float t, double u) {
    const int lane = threadIdx.x & 31;
    const int64_t nb = (n + BLK - 1) / BLK;
    const double total = block_total(s, w, n, t);
    if (!(total > 0.0) || !isfinite(total)) return -1;
    const double target = u * total;
    /* the block where target falls (its sums are still in s.u when the row
     * has at most SB blocks, else recomputed group by group) */
    double cum = 0.0;
    int64_t found = -1, last = -1;
    for (int64_t g0 = 0; g0 < nb && found < 0; g0 += SB) {
        const int64_t g1 = g0 + SB < nb ? g0 + SB : nb;
        if (nb > SB) {
            __syncthreads();
            block_sums(s, w, n, t, g0, g1);
            __syncthreads();
        }
        if (threadIdx.x < 32) {
            for (int64_t c = 0; c < g1 - g0 && found < 0; c += 32) {
                const double x = c + lane < g1 - g0 ? s.u.blocks[c + lane] : 0.0;
                unsigned nz = __ballot_sync(FULL, x != 0.0);
                while (nz) {
                    const int l = __ffs(nz) - 1;
                    nz &= nz - 1;
                    const double bx = __shfl_sync(FULL, x, l);
                    last = g0 + c + l;
                    if (cum + bx > target) {
                        found = last;
                        break;
                    }
                    cum += bx;
                }
            }
            if (lane == 0) s.iv[0] = found, s.iv[1] = last, s.dv[0] = cum;
        }
        __syncthreads();
        found = s.iv[0], last = s.iv[1], cum = s.dv[0];
    }
    double stop = target;
    if (found < 0) { /* rounding: u x total at the blocks' sum: the last kept value */
        found = last;
        stop = FI_POS_INF;
    }
    /* that block's weights, then its kept values in index order */
    const int64_t lo = found * BLK, len = n - lo < BLK ? n - lo : BLK;
    float *buf = reinterpret_cast<float *>(s.count);
    for (int64_t i = threadIdx.x; i < len; i += NT) buf[i] = w(lo + i);
    __syncthreads();
    if (threadIdx.x < 32) {
        int64_t pick = -1;
        bool done = false;
        for (int c = 0; c < len && !done; c += 32) {
            const float x = c + lane < len ? buf[c + lane] : 0.0f;
            unsigned kept = __ballot_sync(FULL, x >= t && x > 0.0f);
            while (kept) {
                const int l = __ffs(kept) - 1;
                kept &= kept - 1;
                pick = lo + c + l;
                cum += (double)__shfl_sync(FULL, x, l);
                if (cum > stop) {
                    done = true;
                    break;
                }
            }
        }
        if (lane == 0) s.iv[2] = pick;
    }
    __syncthreads();
    return s.iv[2];
}

} // namespace fi_sv

#endif /* FI_SELECT_CUH */
