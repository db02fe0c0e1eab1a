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
 *   that block's values in index order (found by a block scan that
 *   brackets the CPU's running sum, walked one value at a time only when
 *   the bracket holds two: pick_in_block).
 *
 * Passes over a row load AHEAD values a thread before using any: a block
 * of 1024 threads needs tens of KB in flight to stream a row at more than
 * a few GB/s.
 *
 * A row's values come from a functor (v(i): the value of element i as the
 * CPU's f32 row holds it), re-read or recomputed on every pass: rows stay
 * in global memory (L2), the block's shared memory holds the histograms.
 *
 * A row may be shared by the CTAs of a thread-block cluster (sm_90, a
 * team): each CTA passes over its own slice of whole draw blocks, and the
 * team combines what the passes found through distributed shared memory:
 * the maximum and kinds, the histograms (integer counts and mantissa sums:
 * exact in any order), the block sums (walked in block order, CTA after
 * CTA, as one CTA walks them). Every CTA then holds the same combined
 * values and makes the same decisions, so the results are the one-CTA
 * results bit for bit.
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
/* Values a thread loads before it uses any on a pass over a row: 8 x 4
 * bytes x 1024 threads = 32 KB a block in flight (one value at a time, 4
 * KB, left a pass latency-bound at a few GB/s per SM). */
constexpr int AHEAD = 8;
static_assert(BLK == NT, "a draw block's weights are one a thread (pick_in_block)");

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
    float team_max;      /* this CTA's row_stats, read by the team */
    uint32_t team_kinds;
    uint32_t team_left;  /* select_key: this CTA's candidates in the chosen bucket */
    double dv[3];
    int64_t iv[3];
    int ncand;
};

/* ------------------------------------------------------------- teams */

/* The CTAs that share one row of n values: `size` CTAs of a cluster (1: a
 * CTA alone), this one of rank `rank` owning the draw blocks [blo, bhi)
 * of the row, elements [lo(), hi()). */
struct team {
    uint32_t rank, size, blo, bhi; /* blocks: n < 2^31 */
    int64_t n;
    FI_DEV int64_t lo() const { return (int64_t)blo * BLK; }
    FI_DEV int64_t hi() const { return (int64_t)bhi * BLK < n ? (int64_t)bhi * BLK : n; }
};

/* Rank `rank`'s share of a row of n values among `size` CTAs. */
FI_DEV team team_of(uint32_t rank, uint32_t size, int64_t n) {
    const int64_t nb = (n + BLK - 1) / BLK;
    team t;
    t.rank = rank, t.size = size, t.n = n;
    t.blo = (uint32_t)(nb * rank / size), t.bhi = (uint32_t)(nb * (rank + 1) / size);
    return t;
}

/* This CTA's cluster: its rank and size, the cluster's index in the grid
 * and the number of clusters (sm_90; elsewhere the CTA alone). */
FI_DEV void cluster_place(uint32_t *rank, uint32_t *size, uint32_t *id, uint32_t *count) {
#if __CUDA_ARCH__ >= 900
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(*rank));
    asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(*size));
    asm("mov.u32 %0, %%clusterid.x;" : "=r"(*id));
    asm("mov.u32 %0, %%nclusterid.x;" : "=r"(*count));
#else
    *rank = 0, *size = 1, *id = blockIdx.x, *count = gridDim.x;
#endif
}

/* Every thread of every CTA of the team waits for all (a block barrier for
 * a CTA alone); shared memory written before is visible to all after. */
FI_DEV void team_sync(const team &t) {
#if __CUDA_ARCH__ >= 900
    if (t.size > 1) {
        asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
                     "barrier.cluster.wait.acquire.aligned;" ::: "memory");
        return;
    }
#endif
    __syncthreads();
}

/* p (this CTA's shared memory) in the CTA of rank `rank` of the cluster. */
template <class T>
FI_DEV const T *peer(const T *p, uint32_t rank) {
#if __CUDA_ARCH__ >= 900
    uint64_t q;
    asm("mapa.u64 %0, %1, %2;" : "=l"(q) : "l"(p), "r"(rank));
    return reinterpret_cast<const T *>(q);
#else
    return rank ? nullptr : p;
#endif
}

/* body(i, v(i)) for this thread's i = t.lo() + threadIdx.x + j NT < t.hi(),
 * AHEAD loads issued before any body runs. A body may store element i
 * (each is read and then written by one thread: in place is safe). */
template <class F, class B>
FI_DEV void row_map(const team &t, const F &v, B body) {
    const int64_t hi = t.hi();
    for (int64_t i0 = t.lo() + threadIdx.x; i0 < hi; i0 += (int64_t)AHEAD * NT) {
        float x[AHEAD];
#pragma unroll
        for (int j = 0; j < AHEAD; j++)
            if (i0 + (int64_t)j * NT < hi) x[j] = v(i0 + (int64_t)j * NT);
#pragma unroll
        for (int j = 0; j < AHEAD; j++)
            if (i0 + (int64_t)j * NT < hi) body(i0 + (int64_t)j * NT, x[j]);
    }
}

/* ------------------------------------------------------------- stats */

/* The largest value of v over the team's row (NaN ignored; -inf when none)
 * and the kinds it holds (FI_SV_NEGATIVE | FI_SV_NAN | FI_SV_POS_INF), in
 * every thread of the team. */
template <class F>
FI_DEV void row_stats(shm &s, const team &t, const F &v, float *max, uint32_t *kinds) {
    float m = FI_NEG_INF;
    uint32_t k = 0;
    row_map(t, v, [&](int64_t, float x) {
        m = vmax(m, x);
        k |= (x < 0.0f ? FI_SV_NEGATIVE : 0u) | (x != x ? FI_SV_NAN : 0u) |
             (x == FI_POS_INF ? FI_SV_POS_INF : 0u);
    });
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        m = vmax(m, __shfl_xor_sync(FULL, m, o));
        k |= __shfl_xor_sync(FULL, k, o);
    }
    team_sync(t); /* s.redf and s.team_* are free (the team's last reads of them are done) */
    if ((threadIdx.x & 31) == 0) s.redf[threadIdx.x >> 5] = m, s.redu[threadIdx.x >> 5] = k;
    __syncthreads();
    m = s.redf[threadIdx.x & 31], k = s.redu[threadIdx.x & 31];
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        m = vmax(m, __shfl_xor_sync(FULL, m, o));
        k |= __shfl_xor_sync(FULL, k, o);
    }
    if (t.size > 1) { /* max and or: the same in any order */
        if (threadIdx.x == 0) s.team_max = m, s.team_kinds = k;
        team_sync(t);
        for (uint32_t q = 0; q < t.size; q++) {
            m = vmax(m, *peer(&s.team_max, q));
            k |= *peer(&s.team_kinds, q);
        }
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
    /* 2^(52 + k), 2^k the unit of a level-1 or level-2 bucket's mass */
    const double exact_below =
        __longlong_as_double(((int64_t)(e0 ? e0 : 1u) - 150 + 52 + 1023) << 52);
    for (int c = nb - 32; c >= 0; c -= 32) {
        const int b = c + lane;
        const uint32_t cnt = s.count[b];
        unsigned nz = __ballot_sync(FULL, cnt != 0);
        if (!nz) continue;
        const double sv = cnt == 0 ? 0.0
                          : mass   ? bucket_mass(s, b, lvl == 0 ? ((uint32_t)b >> 2) & 0xffu : e0)
                                   : (double)cnt;
        /* The CPU adds the buckets to *above one at a time from the top and
         * stops at the first whose sum reaches *target. The chunk's suffix
         * sums by a scan decide that in a few steps: counts are exact
         * integers in either order; masses (33 terms at most) are within
         * 2^-47 of their bound T = *above + the chunk's total either way,
         * so the top bucket reaching target - E and the top one reaching
         * target + E (E = 2^-45 T) bracket the CPU's; when they differ (a
         * sum within E of target: rare) this chunk is walked as the CPU
         * walks it. *above is the CPU's sum of the buckets over: where
         * every partial sum is exact (counts; the masses of levels 1 and 2,
         * multiples of one power of two 2^k, as *above is, while the sum
         * stays below 2^(52 + k)) the chunk's scanned sum is that sum, in
         * any order; else they are added one at a time in the CPU's order. */
        double suffix = sv;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const double y = __shfl_down_sync(FULL, suffix, o);
            if (lane + o < 32) suffix += y;
        }
        const double p = *above + suffix, chunk = __shfl_sync(FULL, suffix, 0);
        const double e = mass ? (*above + chunk) * 0x1p-45 : 0.0;
        const unsigned reach_lo = __ballot_sync(FULL, cnt != 0 && p >= *target - e);
        const unsigned reach_hi = __ballot_sync(FULL, cnt != 0 && p >= *target + e);
        const int top_lo = reach_lo ? 31 - __clz(reach_lo) : -1;
        const int top_hi = reach_hi ? 31 - __clz(reach_hi) : -1;
        if (top_lo < 0 || top_lo == top_hi) {
            /* the buckets over the chosen one (all of them when none is) */
            const double past = __shfl_sync(FULL, suffix, (top_lo + 1) & 31);
            if (!mass || (lvl > 0 && *above + chunk <= exact_below)) {
                *above += top_lo < 0 ? chunk : top_lo == 31 ? 0.0 : past;
            } else {
                unsigned over = top_lo < 0 ? nz : nz & ~((2u << top_lo) - 1u);
                while (over) {
                    const int l = 31 - __clz(over);
                    over &= ~(1u << l);
                    *above += __shfl_sync(FULL, sv, l);
                }
            }
            if (top_lo >= 0) return c + top_lo;
            continue;
        }
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

/* The team's histograms of buckets [0, nb) summed into every CTA's (the
 * counts and mantissa sums are integers: exact in any order); this CTA's
 * own counts kept in `own` when not NULL. */
FI_DEV void team_hist(shm &s, const team &t, int nb, bool mass, uint32_t *own) {
    if (t.size == 1) return;
    constexpr int PER = BUCKETS / NT;
    uint32_t cnt[PER];
    uint64_t sum[PER];
    team_sync(t); /* every CTA's histogram is complete */
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int b = threadIdx.x + j * NT;
        cnt[j] = 0, sum[j] = 0;
        if (b >= nb) continue;
        if (own) own[b] = s.count[b];
        for (uint32_t q = 0; q < t.size; q++) {
            cnt[j] += *peer(&s.count[b], q);
            if (mass)
                sum[j] += (uint64_t)*peer(&s.u.s.mhi[b], q) << 32 | *peer(&s.u.s.mlo[b], q);
        }
    }
    team_sync(t); /* every CTA has read them */
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int b = threadIdx.x + j * NT;
        if (b >= nb) continue;
        s.count[b] = cnt[j];
        if (mass) s.u.s.mlo[b] = (uint32_t)sum[j], s.u.s.mhi[b] = (uint32_t)(sum[j] >> 32);
    }
}

/* The key t with S(key > t) < X <= S(key >= t) over the values v(i) of
 * the team's row of n, whose key is >= lo, S counting them (mass false) or
 * summing them (mass: the values are >= 0); X is `count`, or frac x their
 * total mass. *all when they sum below X (then t = lo). *above_out (may be
 * NULL): S(key > t). Every thread of the team returns the same. */
template <class F>
FI_DEV uint32_t select_key(shm &s, const team &t, const F &v, int64_t n, uint32_t lo, bool mass,
                           double count, double frac, bool *all, double *above_out) {
    const int lane = threadIdx.x & 31;
    uint32_t prefix = 0, pmask = 0, e0 = 0;
    double above = 0.0, target = count;
    bool listed = false;
    int m = 0;
    /* the most candidates of this level one CTA holds (a team's CTAs
     * gather their own) */
    int64_t left = t.size > 1 ? ((int64_t)(n + BLK - 1) / BLK + t.size - 1) / t.size * BLK : n;
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
            const int64_t hi = t.hi();
            for (int64_t w0 = t.lo() + (threadIdx.x & ~31); w0 < hi; w0 += (int64_t)AHEAD * NT) {
                uint32_t key[AHEAD]; /* w0 is uniform per warp (hist_add's shuffles) */
#pragma unroll
                for (int j = 0; j < AHEAD; j++) {
                    const int64_t i = w0 + lane + (int64_t)j * NT;
                    key[j] = i < hi ? key_of(v(i)) : 0u;
                }
#pragma unroll
                for (int j = 0; j < AHEAD; j++) {
                    const bool in = w0 + lane + (int64_t)j * NT < hi && key[j] >= lo &&
                                    (key[j] & pmask) == prefix;
                    hist_add(s, in ? (key[j] >> shift) & bmask : 0xffffffffu, key[j], mass);
                    if (gather && in) s.u.s.cand[atomicAdd(&s.ncand, 1)] = key[j];
                }
            }
        }
        __syncthreads();
        /* the candidates array is free at a level that neither gathers nor
         * reads it: it keeps this CTA's own counts */
        const bool own = !gather && !listed && lvl < 2;
        team_hist(s, t, nb, mass, own ? s.u.s.cand : nullptr);
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
        if (t.size > 1) { /* the next level's candidates: the most one CTA holds */
            if (threadIdx.x == 0) s.team_left = own && b >= 0 ? s.u.s.cand[b] : 0xffffffffu;
            team_sync(t);
            uint32_t most = 0;
            for (uint32_t q = 0; q < t.size; q++) {
                const uint32_t l = *peer(&s.team_left, q);
                most = l > most ? l : most;
            }
            left = most;
        }
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
FI_DEV float top_k_threshold(shm &s, const team &t, const F &v, int64_t n, int32_t k) {
    if (k <= 0 || (int64_t)k >= n) return FI_NEG_INF;
    bool all;
    return value_of(select_key(s, t, v, n, 0u, false, (double)k, 0.0, &all, nullptr));
}

/* Threshold of top-p on weights w >= 0 among those >= lo (p >= 1: lo). */
template <class F>
FI_DEV float top_p_threshold(shm &s, const team &t, const F &w, int64_t n, float p, float lo) {
    if (p >= 1.0f) return lo;
    bool all;
    const uint32_t k = select_key(s, t, w, n, key_of(lo), true, 0.0, (double)p, &all, nullptr);
    return all ? lo : value_of(k);
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
            if (first + 16 * 63 < n) { /* 16 loads in flight a thread: 64 KB a block */
#pragma unroll 16
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

/* Adds the sums of blocks [0, len) of `sums` (those != 0) to *total in
 * order, by one warp. */
FI_DEV void add_block_sums(const double *sums, int64_t len, double *total) {
    const int lane = threadIdx.x & 31;
    for (int64_t c = 0; c < len; c += 32) {
        const double x = c + lane < len ? sums[c + lane] : 0.0;
        unsigned nz = __ballot_sync(FULL, x != 0.0);
        while (nz) {
            const int l = __ffs(nz) - 1;
            nz &= nz - 1;
            *total += __shfl_sync(FULL, x, l);
        }
    }
}

/* The f64 sum, in block order, of the blocks' sums (w >= t): the CPU's
 * block_total. Every thread of the team returns it. A team's CTAs keep
 * their blocks' sums in s.u.blocks (at most SB blocks each: the launch
 * sees to it); a CTA alone sums a longer row SB blocks at a time. */
template <class W>
FI_DEV double block_total(shm &s, const team &tm, const W &w, int64_t n, float t) {
    double total = 0.0;
    if (tm.size > 1) {
        team_sync(tm); /* s.u is free in every CTA */
        block_sums(s, w, n, t, tm.blo, tm.bhi);
        team_sync(tm);
        if (threadIdx.x < 32)
            for (uint32_t q = 0; q < tm.size; q++) {
                const team o = team_of(q, tm.size, n);
                add_block_sums(peer(s.u.blocks, q), o.bhi - o.blo, &total);
            }
    } else {
        const int64_t nb = (n + BLK - 1) / BLK;
        for (int64_t g0 = 0; g0 < nb; g0 += SB) {
            const int64_t g1 = g0 + SB < nb ? g0 + SB : nb;
            __syncthreads(); /* s.u is free */
            block_sums(s, w, n, t, g0, g1);
            __syncthreads();
            if (threadIdx.x < 32) add_block_sums(s.u.blocks, g1 - g0, &total);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) s.dv[2] = total;
    __syncthreads();
    return s.dv[2];
}

/* The CPU's pick in a block's weights buf[0, len) (len <= NT, one a
 * thread): running from cum, it adds the kept ones (x >= t, x > 0) in f64
 * one at a time and takes the first whose sum passes stop, else the last
 * kept. A block scan in f64 gives those sums in another order; each is a
 * sum of at most 1025 non-negative terms, so both are within 2^-42 of
 * their bound T = cum + the block's kept sum, by the standard bound on
 * recursive summation. The first kept value whose scanned sum passes
 * stop + E and the first past stop - E (E = 2^-40 T) bracket the CPU's:
 * when they are the same value, or none passes stop - E (then the CPU's
 * sum never passes stop: the last kept), that is the pick; else (a sum
 * within E of stop: rare) -1 and the caller walks as the CPU. s.redu[0..2]
 * set to len, len, 0 before the sync that follows buf's writes. */
FI_DEV int64_t pick_in_block(shm &s, const float *buf, int len, float t, double cum, double stop) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, c = threadIdx.x;
    const float x = c < len ? buf[c] : 0.0f;
    const bool kept = c < len && x >= t && x > 0.0f;
    double incl = kept ? (double)x : 0.0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(FULL, incl, o);
        if (lane >= o) incl += y;
    }
    double *wsum = s.u.blocks; /* the block sums are read */
    if (lane == 31) wsum[warp] = incl;
    __syncthreads();
    if (warp == 0) { /* the warps' totals: exclusive prefix, and the sum at NW */
        const double ws = wsum[lane];
        double pre = ws;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const double y = __shfl_up_sync(FULL, pre, o);
            if (lane >= o) pre += y;
        }
        wsum[lane] = pre - ws; /* rounding: inside the bound below */
        if (lane == 31) wsum[NW] = pre;
    }
    __syncthreads();
    const double sum = cum + (wsum[warp] + incl), e = (cum + wsum[NW]) * 0x1p-40;
    if (kept && sum > stop - e) atomicMin(&s.redu[0], (uint32_t)c);
    if (kept && sum > stop + e) atomicMin(&s.redu[1], (uint32_t)c);
    if (kept) atomicMax(&s.redu[2], (uint32_t)c + 1u);
    __syncthreads();
    const uint32_t first_lo = s.redu[0], first_hi = s.redu[1], last = s.redu[2];
    __syncthreads(); /* s.redu and s.u are free again */
    if (first_lo == (uint32_t)len) return (int64_t)last - 1;
    return first_lo == first_hi ? (int64_t)first_lo : -1;
}

/* The block where the running sum of the blocks' sums [0, len) of `sums`
 * (block g0 first) passes target, by one warp: *found (else unchanged),
 * *last the last non-zero block, *cum the sum of the blocks before. */
FI_DEV void find_block(const double *sums, int64_t g0, int64_t len, double target, double *cum,
                       int64_t *found, int64_t *last) {
    const int lane = threadIdx.x & 31;
    for (int64_t c = 0; c < len && *found < 0; c += 32) {
        const double x = c + lane < len ? sums[c + lane] : 0.0;
        unsigned nz = __ballot_sync(FULL, x != 0.0);
        while (nz) {
            const int l = __ffs(nz) - 1;
            nz &= nz - 1;
            const double bx = __shfl_sync(FULL, x, l);
            *last = g0 + c + l;
            if (*cum + bx > target) {
                *found = *last;
                break;
            }
            *cum += bx;
        }
    }
}

/* The index drawn by u in [0, 1) from the weights w(i) >= t (w >= 0) over
 * the team's row of n: the CPU's draw. -1 when they have no positive
 * finite mass. Every thread of the team returns the same. */
template <class W>
FI_DEV int64_t draw(shm &s, const team &tm, const W &w, int64_t n, float t, double u) {
    const int lane = threadIdx.x & 31;
    const int64_t nb = (n + BLK - 1) / BLK;
    const double total = block_total(s, tm, w, n, t);
    if (!(total > 0.0) || !isfinite(total)) return -1;
    const double target = u * total;
    /* the block where target falls (its sums are still in s.u when the row
     * has at most SB blocks or a team holds them, else recomputed group by
     * group) */
    double cum = 0.0;
    int64_t found = -1, last = -1;
    if (tm.size > 1) {
        if (threadIdx.x < 32) {
            for (uint32_t q = 0; q < tm.size && found < 0; q++) {
                const team o = team_of(q, tm.size, n);
                find_block(peer(s.u.blocks, q), o.blo, o.bhi - o.blo, target, &cum, &found, &last);
            }
            if (lane == 0) s.iv[0] = found, s.iv[1] = last, s.dv[0] = cum;
        }
        team_sync(tm); /* the team's block sums are read: s.u is free */
        found = s.iv[0], last = s.iv[1], cum = s.dv[0];
    }
    for (int64_t g0 = 0; tm.size == 1 && g0 < nb && found < 0; g0 += SB) {
        const int64_t g1 = g0 + SB < nb ? g0 + SB : nb;
        if (nb > SB) {
            __syncthreads();
            block_sums(s, w, n, t, g0, g1);
            __syncthreads();
        }
        if (threadIdx.x < 32) {
            find_block(s.u.blocks, g0, g1 - g0, target, &cum, &found, &last);
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
    if (threadIdx.x == 0) s.redu[0] = s.redu[1] = (uint32_t)len, s.redu[2] = 0;
    __syncthreads();
    const int64_t pick = pick_in_block(s, buf, (int)len, t, cum, stop);
    if (pick >= 0) return lo + pick;
    if (threadIdx.x < 32) { /* the CPU's walk, one kept value at a time */
        int64_t at = -1;
        bool done = false;
        for (int c = 0; c < len && !done; c += 32) {
            const float x = c + lane < len ? buf[c + lane] : 0.0f;
            unsigned kept = __ballot_sync(FULL, x >= t && x > 0.0f);
            while (kept) {
                const int l = __ffs(kept) - 1;
                kept &= kept - 1;
                at = lo + c + l;
                cum += (double)__shfl_sync(FULL, x, l);
                if (cum > stop) {
                    done = true;
                    break;
                }
            }
        }
        if (lane == 0) s.iv[2] = at;
    }
    __syncthreads();
    return s.iv[2];
}

} // namespace fi_sv

#endif /* FI_SELECT_CUH */
