/*
 * attention.cuh — batched attention over a plan's work items, on CUDA cores:
 * paged or ragged KV, decode and small query tiles (any item the scheduler
 * emits is computed right; long query tiles loop over row blocks).
 *
 * Grid: x = the plan's workers (CTA w runs items[worker_indptr[w] ..
 * worker_indptr[w+1]) in order), y = KV-head slices (CTA y handles KV heads
 * y, y + gridDim.y, ...). 128 threads.
 *
 * One item, one KV head: its tokens x the GQA group are packed into rows
 * (row p = token q_start + p / GROUP, query head hkv * GROUP + p % GROUP), so
 * one K/V read from memory serves the whole group. Rows go in blocks of RM.
 * Keys go in tiles of BN, gathered from their pages by 16-byte cp.async into
 * shared memory, STAGES tiles in flight. Thread layout per tile:
 *
 *   TX lanes share one key (each holds EQ = D_qk / TX q elements and
 *   EV = D_vo / TX o elements of every row), so a warp works on 32 / TX keys
 *   at once and the CTA on NG = 4 * 32 / TX "key groups". TX is
 *   max(D_qk, D_vo) / 8 rounded up to a power of two, at most 32 and
 *   dividing both dims (d 64: 8, 128: 16, 256: 32, so 8 elements a lane;
 *   80: 16 lanes of 5, 96: 16 of 6, 192: 32 of 6, 512: 32 of 16). A lane's
 *   elements are one contiguous run where EQ is a power of two, else
 *   power-of-two parts (lane_dim: 5 = 4 + 1), each one aligned vector load.
 *   Group g owns keys [g * KPG, (g + 1) * KPG) of each tile and keeps its own
 *   online-softmax state (m, l, o) for all RM rows; at the end of the item
 *   the NG states are merged through shared memory in a fixed order.
 *
 *   s[key][row] = q[row] . k[key]       (partial dot per lane, then a
 *                                        butterfly over the TX lanes)
 *   mask, soft-cap, ALiBi, log2 domain  (q carries sm_scale [* log2 e])
 *   m' = max(m, max s); p = 2^(s - m'); l = l 2^(m - m') + sum p
 *   o = o 2^(m - m') + p . v
 *
 * Configuration (-D, all required by the host; defaults are for editors):
 *   FI_DQK, FI_DVO    head dims (64, 80, 96, 128, 192, 256, 512, any pair)
 *   FI_QT, FI_KVT, FI_OT  dtype codes (fi_dtype values)
 *   FI_GROUP          H_qo / H_kv;  FI_ROWS rows per block (1..8; fewer
 *                     where a lane holds more than 8 elements: RM)
 *   FI_PAGED          1 paged, 0 ragged KV, 2 paged with the page table in
 *                     device memory (ids clamped: work.cuh fi_page_id)
 *   FI_MASK           0 none, 1 causal, 2 custom bits
 *   FI_WINDOW         1: sliding window (window_left >= 0)
 *   FI_SOFTCAP        1: logits soft-cap
 *   FI_POS            0 none, 1 LLaMA RoPE fused, 2 ALiBi
 *   FI_ATTN_NAME      the extern "C" entry point's name
 *   FI_VARIANT, FI_VHOOKS  a user variant's hooks (kernels/variant.cuh)
 *
 * Soft-cap, ALiBi, the window and the custom mask are the hooks of
 * variant.cuh (the built-ins), called where a user variant's are: row hooks
 * where rows are loaded (q: an f32 copy in shared memory, one thread per
 * row; k/v: each landed key row through a private f32 copy, one thread per
 * row, the tile's rows spread over every warp, into f32 rows in shared
 * memory; 2 stages of up to 32 keys then), logits hooks on the scores, the
 * output hook on write-through rows (split rows: merge.cuh). use_softmax = 0
 * (FI_VH_NO_SOFTMAX) accumulates o += w v with no max or sum.
 */
#include "work.cuh"

#ifndef FI_DQK
#define FI_DQK 128
#define FI_DVO 128
#define FI_QT 2
#define FI_KVT 2
#define FI_OT 2
#define FI_GROUP 4
#define FI_ROWS 4
#define FI_PAGED 1
#define FI_MASK 0
#define FI_WINDOW 0
#define FI_SOFTCAP 0
#define FI_POS 0
#define FI_ATTN_NAME fi_attn_default
#endif
#include "variant.cuh"
#include "exact.cuh"

namespace fi_attn {

__host__ __device__ constexpr int pow2_floor(int x) { return x >= 2 ? 2 * pow2_floor(x / 2) : 1; }
__host__ __device__ constexpr int pow2_ceil(int x) { return x > 1 ? 2 * pow2_ceil((x + 1) / 2) : 1; }
__host__ __device__ constexpr int imax(int a, int b) { return a > b ? a : b; }
__host__ __device__ constexpr int imin(int a, int b) { return a < b ? a : b; }

constexpr int DQK = FI_DQK, DVO = FI_DVO;
constexpr int QT = FI_QT, KT = FI_KVT, OT = FI_OT;
constexpr int GROUP = FI_GROUP;
constexpr bool PAGED = FI_PAGED != 0;
constexpr bool DEVICE_TABLE = FI_PAGED == 2;
constexpr bool CAUSAL = FI_MASK == 1, CUSTOM = FI_MASK == 2;
constexpr bool WINDOW = FI_WINDOW != 0;
constexpr bool ROPE = FI_POS == 1 && !fi_v::USER; /* built-in, element-wise */
constexpr bool TRANSFORM = fi_v::NATURAL;         /* logits leave the log2 domain */
constexpr bool SOFTMAX = fi_v::SOFTMAX;
constexpr bool ROW_KV = fi_v::KEY || fi_v::VALUE; /* f32 K/V rows per tile */
/* rows whose result is not finite are computed again (exact.cuh) */
constexpr bool EXACT = SOFTMAX && !fi_v::USER;

constexpr int NT = 128, NWARP = NT / 32;
/* lanes per key: 8, 16, 32 (the lowest set bit of a dim: the largest power
 * of two dividing it) */
constexpr int TX = imin(imin(pow2_ceil((imax(DQK, DVO) + 7) / 8), 32), imin(DQK & -DQK, DVO & -DVO));
constexpr int EQ = DQK / TX, EV = DVO / TX;  /* elements per lane */
constexpr int KG = 32 / TX, NG = NWARP * KG; /* key groups per warp, per CTA */
/* rows per block: FI_ROWS, fewer where a lane holds more than 8 elements
 * of a row (d 512: 16 elements, 4 rows), so that q and o stay within 64
 * registers each */
constexpr int RM = imin(FI_ROWS, 64 / imax(EQ, EV));
constexpr int KB = fi_dtype_bytes<KT>::value;
constexpr int KROW = DQK * KB, VROW = DVO * KB;           /* bytes per key */
/* Row hooks: 2 stages, and the f32 rows of K / V beside them (ROWF bytes
 * per key), with as many keys per tile as 48 KB holds, so that more
 * threads share a tile's hooks (bf16 d 128, key hook: 32 keys). */
constexpr int ROWF = (fi_v::KEY ? DQK * 4 : 0) + (fi_v::VALUE ? DVO * 4 : 0);
/* K + V bytes per stage (an enumerator: a constant the PTX need not hold) */
enum : int {
    TILE_BYTES = !ROW_KV ? 16384 : 48 * 1024 / (2 * (KROW + VROW) + ROWF) * (KROW + VROW)
};
constexpr int KPG = imin(pow2_floor(imax(TILE_BYTES / (KROW + VROW) / NG, 1)), 128 / NG);
constexpr int BN = NG * KPG;                 /* keys per tile (<= 16 KB of K+V) */
constexpr int KSUB = imin(KPG, 4);           /* keys per softmax update */
constexpr int STAGE_BYTES = BN * (KROW + VROW);
constexpr int KCH = KROW / 16, VCH = VROW / 16, CH = imax(KCH, VCH);
/* row hooks' f32 rows: K [BN][DQK], V [BN][DVO] after the stages */
constexpr int KBUF_BYTES = fi_v::KEY ? BN * DQK * 4 : 0;
constexpr int VBUF_BYTES = fi_v::VALUE ? BN * DVO * 4 : 0;
/* 3 stages (2 with row hooks), fewer where a tile of one key per group
 * does not fit them in 48 KB (f32 K/V of d 80 x 512: 8 keys of 2368 bytes) */
__host__ __device__ constexpr int stages_fit(int s) {
    return s > 1 && s * STAGE_BYTES + KBUF_BYTES + VBUF_BYTES > 48 * 1024 ? stages_fit(s - 1) : s;
}
constexpr int STAGES = stages_fit(ROW_KV ? 2 : 3);
/* final merge: o [NG][RM][DVO], m, l, w [NG][RM], inv, lse [RM], then the
 * output hook's rows [RM][DVO] */
constexpr int RED_BYTES = 4 * (NG * RM * DVO + 3 * NG * RM + 2 * RM + (fi_v::OUTPUT ? RM * DVO : 0));
constexpr int SMEM_BYTES = imax(STAGES * STAGE_BYTES + KBUF_BYTES + VBUF_BYTES, RED_BYTES);
static_assert(RM * DQK * 4 <= STAGES * STAGE_BYTES, "q rows of the query hook");
/* registers: q, o, s per row (RW: RM rows at 8 elements a lane) */
constexpr int RW = (RM * imax(EQ, EV) + 7) / 8;
constexpr int MIN_BLOCKS = RW <= 2 ? 4 : RW <= 4 ? 3 : 2;
constexpr float LOG2E = 1.4426950408889634f;

static_assert(TX >= 8 && TX <= 32 && EQ >= 1 && EV >= 1, "head dims");
static_assert(DQK % TX == 0 && DVO % TX == 0 && DQK % 16 == 0 && DVO % 16 == 0, "head dims");
static_assert(RM >= 1 && RM <= 8, "rows per block");
static_assert(KPG % KSUB == 0, "sub-tiles");
static_assert(SMEM_BYTES <= 48 * 1024, "static shared memory");

/* Lane layout of a row of D = TX * E elements. E a power of two: lane c
 * holds [c E, c E + E). Otherwise E splits into power-of-two parts, widest
 * first (5 = 4 + 1, 6 = 4 + 2, 3 = 2 + 1), and each half row into regions
 * by part: part w of lane c sits at D / 2 * (c / (TX / 2)) + TX / 2 * o +
 * (c % (TX / 2)) * w, o the lane's elements before it, so that each part is
 * one aligned vector load (a lane of 16-bit d 80: 8 bytes and 2), and the
 * RoPE partner of a lane's element e (d +- D / 2) is element e of lane
 * c ^ TX / 2, as in the contiguous layout. */
__host__ __device__ constexpr bool is_pow2(int x) { return (x & (x - 1)) == 0; }
/* a half row's start (D / 2 = TX / 2 * E) aligned for the widest part */
static_assert(is_pow2(EQ) || (TX / 2) % pow2_floor(EQ) == 0, "lane parts of q/k");
static_assert(is_pow2(EV) || (TX / 2) % pow2_floor(EV) == 0, "lane parts of v/o");

/* The dim of lane c's element e (e < E; called with a constant e, which
 * folds it to c * w + k). Element e's part: the highest bit in which e
 * (< E) and E differ is its width w, E's bits above it its offset o. */
template <int D, int E>
FI_DEV int lane_dim(int c, int e) {
    if constexpr (is_pow2(E)) {
        return c * E + e;
    } else {
        const int w = 1 << (31 - __clz(E ^ e)), o = E & ~(2 * w - 1);
        return (c / (TX / 2)) * (D / 2) + (TX / 2) * o + (c % (TX / 2)) * w + (e - o);
    }
}

/* Lane c's E elements (E not a power of two: the parts) of a row of D
 * (dtype T, 16-byte aligned) as f32. A power-of-two E is one
 * fi_load_vec<T, E> at c E, written at the call sites. */
template <int T, int E, int W = 32, int O = 0>
FI_DEV void load_parts(const char *half, int cl, float *out) {
    if constexpr (W > 0) {
        constexpr bool in = (E & W) != 0;
        if constexpr (in) fi_load_vec<T, W>(half + ((TX / 2) * O + cl * W) * fi_dtype_bytes<T>::value, out + O);
        load_parts<T, E, W / 2, in ? O + W : O>(half, cl, out);
    }
}
template <int T, int D, int E>
FI_DEV void load_lane_parts(const char *row, int c, float *out) {
    static_assert(!is_pow2(E), "one load");
    load_parts<T, E>(row + (c / (TX / 2)) * (D / 2) * fi_dtype_bytes<T>::value, c % (TX / 2), out);
}

/* What stays fixed while one (item, KV head) runs. */
using Item = fi_item;

constexpr int PER = (BN * CH + NT - 1) / NT; /* 16-byte chunks per thread per tile */

/* Page ids of this thread's rows of one tile (-1: no row), fetched a tile
 * ahead so that the page-table latency hides behind a tile of compute. */
struct Pages {
    int32_t id[PER];
};

FI_DEV void fetch_pages(const fi_attn_args &a, const int32_t *kv_indices, const Item &it, int j0,
                        Pages &P) {
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = threadIdx.x + k * NT, j = j0 + i / CH;
        P.id[k] = -1;
        if (i < BN * CH && j < it.k1) {
            if constexpr (PAGED) {
                int pi = a.page_shift >= 0 ? j >> a.page_shift : j / a.page_size;
                P.id[k] = kv_indices[it.kv_base + pi]; /* clamped where used */
            } else {
                P.id[k] = 0;
            }
        }
    }
}

/* Keys [j0, j0 + BN) into one stage: K rows then V rows; keys >= k1 zeroed.
 * P holds the tile's page ids (vector path). */
FI_DEV void load_tile(const fi_attn_args &a, const int32_t *kv_indices, const Item &it,
                      unsigned char *st, int j0, const Pages &P) {
    unsigned char *ks = st, *vs = st + BN * KROW;
    if (a.kv_vec_ok) {
#pragma unroll
        for (int k = 0; k < PER; k++) {
            const int i = threadIdx.x + k * NT, key = i / CH, ch = i % CH, j = j0 + key;
            if (i >= BN * CH) break;
            const bool ok = P.id[k] >= 0;
            int64_t page = 0, slot;
            if constexpr (PAGED) {
                page = ok ? fi_page_id<DEVICE_TABLE>(a, P.id[k]) : 0; /* a negative id: not ok, zeros */
                slot = a.page_shift >= 0 ? (j & (a.page_size - 1)) : j % a.page_size;
            } else {
                slot = it.kv_base + j;
            }
            const int64_t ko = ok ? page * a.k_page + slot * a.k_slot + (int64_t)it.hkv * a.k_head : 0;
            const int64_t vo = ok ? page * a.v_page + slot * a.v_slot + (int64_t)it.hkv * a.v_head : 0;
            if (ch < KCH)
                fi_cp_async16(ks + key * KROW + ch * 16, a.k + ko + ch * 16, ok ? 16 : 0);
            if (ch < VCH)
                fi_cp_async16(vs + key * VROW + ch * 16, a.v + vo + ch * 16, ok ? 16 : 0);
        }
    } else { /* rows not 16-byte aligned or not contiguous: element by element */
        for (int i = threadIdx.x; i < BN * DQK; i += NT) {
            int key = i / DQK, d = i % DQK, j = j0 + key;
            unsigned char *dst = ks + key * KROW + d * KB;
            if (j < it.k1) {
                int64_t ko, vo;
                fi_kv_offsets<PAGED, DEVICE_TABLE>(a, kv_indices, it, j, &ko, &vo);
                fi_copy_raw<KB>((char *)dst, a.k + ko + d * a.k_dim);
            } else {
                fi_zero_raw<KB>((char *)dst);
            }
        }
        for (int i = threadIdx.x; i < BN * DVO; i += NT) {
            int key = i / DVO, d = i % DVO, j = j0 + key;
            unsigned char *dst = vs + key * VROW + d * KB;
            if (j < it.k1) {
                int64_t ko, vo;
                fi_kv_offsets<PAGED, DEVICE_TABLE>(a, kv_indices, it, j, &ko, &vo);
                fi_copy_raw<KB>((char *)dst, a.v + vo + d * a.v_dim);
            } else {
                fi_zero_raw<KB>((char *)dst);
            }
        }
    }
}

/* The per-thread state of one row block. */
struct State {
    float q[RM][EQ];
    float o[RM][EV];
    float m[RM], l[RM];
    float slope[RM]; /* built-in ALiBi */
    fi_rope_f freq[EQ]; /* built-in RoPE */
};

/* The hook context of row p (q fields) at key j. */
FI_DEV fi_hook_ctx row_ctx(const fi_attn_args &a, const Item &it, int p, int j, int dim) {
    const int diag = it.kv_len - it.qo_len + it.q0 + p / GROUP;
    return fi_v::ctx(it.req, it.hkv * GROUP + p % GROUP, it.hkv, diag, j, it.qo_len, it.kv_len,
                     dim, a.sm_scale);
}

/* Rows [rb, rb + RM) of q into registers (this thread's EQ elements each),
 * scaled by q_scale; with a query hook, through f32 rows in shared memory
 * (free here: the stages are refilled after). */
FI_DEV void load_q(const fi_attn_args &a, const Item &it, int rb, int c,
                   const fi_variant_params &P, unsigned char *smem, State &S) {
    const int diag0 = it.kv_len - it.qo_len + it.q0;
    if constexpr (fi_v::QUERY) {
        float *rows = (float *)smem; /* [RM][DQK] */
        for (int i = threadIdx.x; i < RM * DQK; i += NT) {
            const int r = i / DQK, d = i % DQK, p = rb + r, t = p / GROUP;
            const int head = it.hkv * GROUP + p % GROUP;
            const char *base = a.q + (it.qo_base + it.q0 + t) * a.q_tok + (int64_t)head * a.q_head;
            rows[i] = p < it.rows ? fi_load_elem<QT>(base + d * a.q_dim) : 0.0f;
        }
        __syncthreads();
        /* row r on lane r / NWARP of warp r % NWARP: every warp takes rows */
        const int r = (threadIdx.x & 31) * NWARP + (threadIdx.x >> 5);
        if (r < RM && rb + r < it.rows)
            fi_v::query(rows + r * DQK, row_ctx(a, it, rb + r, -1, DQK), P);
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < RM; r++) {
        int p = rb + r, t = p / GROUP, head = it.hkv * GROUP + p % GROUP;
        bool valid = p < it.rows;
        const char *base = a.q + (it.qo_base + it.q0 + t) * a.q_tok + (int64_t)head * a.q_head;
#pragma unroll
        for (int e = 0; e < EQ; e++) {
            int d = lane_dim<DQK, EQ>(c, e);
            float x;
            if constexpr (fi_v::QUERY) {
                x = ((const float *)smem)[r * DQK + d];
            } else {
                x = valid ? fi_load_elem<QT>(base + d * a.q_dim) : 0.0f;
            }
            if constexpr (ROPE) {
                int pd = d < DQK / 2 ? d + DQK / 2 : d - DQK / 2;
                float xp = valid ? fi_load_elem<QT>(base + pd * a.q_dim) : 0.0f;
                x = fi_rope_pair(x, xp, d < DQK / 2, S.freq[e], diag0 + t);
            }
            S.q[r][e] = x * a.q_scale;
        }
        S.slope[r] = valid ? fi_v::row_slope(P, head) : 0.0f;
        S.m[r] = FI_NEG_INF;
        S.l[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < EV; e++) S.o[r][e] = 0.0f;
    }
    if constexpr (fi_v::QUERY) __syncthreads(); /* rows read before the stages refill */
}

/* Row hooks' threads: one per row (the hooks' contract), HS apart, so that
 * the tile's rows spread over every warp of the CTA; with both key and
 * value hooks a key's V row runs on the thread after its K row's. */
constexpr int HS = NT / BN;
static_assert(BN <= NT && NT % BN == 0, "a thread per key row");

/* One landed D-element row at src (dtype KT) as f32 (times scale) in a
 * private array, the hook, then into dst (f32, 16-byte aligned); keys past
 * the span are zeros and see no hook. */
template <int D, class F>
FI_DEV void hook_row(const unsigned char *src, float scale, bool in, float *dst, F hook) {
    float x[D]; /* local memory (the hook indexes it): 8 values live at a time,
                   so the tile loop's registers stay */
#pragma unroll 1
    for (int c = 0; c < D / 8; c++) {
        float y[8];
        fi_load_vec<KT, 8>((const char *)src + c * 8 * KB, y);
#pragma unroll
        for (int e = 0; e < 8; e++) x[c * 8 + e] = in ? y[e] * scale : 0.0f;
    }
    if (in) hook(x);
#pragma unroll 1
    for (int d = 0; d < D; d += 4)
        *reinterpret_cast<float4 *>(dst + d) = make_float4(x[d], x[d + 1], x[d + 2], x[d + 3]);
}

/* Key and value hooks: the landed tile's rows as f32 (dequantised) into
 * kbuf / vbuf, transformed there. */
FI_DEV void transform_tile(const fi_attn_args &a, const Item &it, const fi_variant_params &P,
                           const unsigned char *st, int j0, float *kbuf, float *vbuf) {
    const int key = threadIdx.x / HS, role = threadIdx.x % HS;
    const int j = j0 + key;
    const bool in = j < it.k1;
    fi_hook_ctx hc = fi_v::ctx(it.req, it.hkv * GROUP, it.hkv, -1, j, it.qo_len, it.kv_len, DQK,
                               a.sm_scale);
    if constexpr (fi_v::KEY) {
        if (role == 0)
            hook_row<DQK>(st + key * KROW, a.k_scale, in, kbuf + key * DQK,
                          [&](float *x) { fi_v::key(x, hc, P); });
    }
    if constexpr (fi_v::VALUE) {
        hc.head_dim = DVO;
        if (role == (fi_v::KEY && HS > 1 ? 1 : 0))
            hook_row<DVO>(st + BN * KROW + key * VROW, a.v_scale, in, vbuf + key * DVO,
                          [&](float *x) { fi_v::value(x, hc, P); });
    }
}

/* One stage of keys [j0, j0 + BN): this thread's key group's KPG keys. */
FI_DEV void compute_tile(const fi_attn_args &a, const Item &it, int rb, int c, int g,
                         const unsigned char *st, int j0, const fi_variant_params &P,
                         const float *kbuf, const float *vbuf, State &S) {
    const unsigned char *ks = st, *vs = st + BN * KROW;
    const int diag0 = it.kv_len - it.qo_len + it.q0;
#pragma unroll
    for (int kb = 0; kb < KPG; kb += KSUB) {
        float s[KSUB][RM];
#pragma unroll
        for (int i = 0; i < KSUB; i++) {
            const int key = g * KPG + kb + i;
            float kf[EQ];
            if constexpr (fi_v::KEY && is_pow2(EQ)) fi_load_vec<FI_T_F32, EQ>((const char *)(kbuf + key * DQK + c * EQ), kf);
            else if constexpr (fi_v::KEY) load_lane_parts<FI_T_F32, DQK, EQ>((const char *)(kbuf + key * DQK), c, kf);
            else if constexpr (is_pow2(EQ)) fi_load_vec<KT, EQ>((const char *)ks + key * KROW + c * EQ * KB, kf);
            else load_lane_parts<KT, DQK, EQ>((const char *)ks + key * KROW, c, kf);
            if constexpr (ROPE) {
                float kp[EQ];
                if constexpr (is_pow2(EQ)) fi_load_vec<KT, EQ>((const char *)ks + key * KROW + (c ^ (TX / 2)) * EQ * KB, kp);
                else load_lane_parts<KT, DQK, EQ>((const char *)ks + key * KROW, c ^ (TX / 2), kp);
                const int pos = j0 + key;
#pragma unroll
                for (int e = 0; e < EQ; e++) kf[e] = fi_rope_pair(kf[e], kp[e], c < TX / 2, S.freq[e], pos);
            }
#pragma unroll
            for (int r = 0; r < RM; r++) {
                float acc = 0.0f;
#pragma unroll
                for (int e = 0; e < EQ; e++) acc = fmaf(S.q[r][e], kf[e], acc);
                s[i][r] = acc;
            }
        }
#pragma unroll
        for (int i = 0; i < KSUB; i++)
#pragma unroll
            for (int r = 0; r < RM; r++)
#pragma unroll
                for (int off = TX / 2; off >= 1; off >>= 1)
                    s[i][r] += __shfl_xor_sync(0xffffffffu, s[i][r], off);

        /* masks and logit transforms; a tile every row sees whole (the
         * common case of decode) skips the per-element checks */
        const int t_first = rb / GROUP, t_last = (rb + RM - 1) / GROUP;
        bool whole = j0 + BN <= it.k1 && rb + RM <= it.rows && !fi_v::ELEM_MASK && !TRANSFORM;
        if constexpr (CAUSAL) whole = whole && j0 + BN - 1 <= diag0 + t_first;
        if constexpr (WINDOW) whole = whole && j0 >= diag0 + t_last - a.window_left;
        if (!whole) {
#pragma unroll
            for (int i = 0; i < KSUB; i++) {
                const int j = j0 + g * KPG + kb + i;
#pragma unroll
                for (int r = 0; r < RM; r++) {
                    const int p = rb + r, diag = diag0 + p / GROUP;
                    bool vis = j < it.k1 && p < it.rows;
                    if constexpr (CAUSAL) vis = vis && j <= diag;
                    /* a user's hooks only on keys and rows that exist (they
                     * may index their tensors by position); the built-ins
                     * are safe anywhere and run branch-free */
                    fi_hook_ctx hc = row_ctx(a, it, p, j, DQK);
                    fi_v::set_slope(hc, S.slope[r]); /* built-in ALiBi */
                    if constexpr (fi_v::ANY_MASK) vis = vis && fi_v::visible(hc, P, a, it.mask_bit0);
                    float x = s[i][r];
                    if constexpr (fi_v::LOGITS) x = vis || !fi_v::USER ? fi_v::logits(x, hc, P) : x;
                    if constexpr (TRANSFORM && SOFTMAX) x *= LOG2E;
                    s[i][r] = vis ? x : SOFTMAX ? FI_NEG_INF : 0.0f;
                }
            }
        }

        /* online softmax (use_softmax = 0: s are the weights) */
#pragma unroll
        for (int r = 0; r < RM && SOFTMAX; r++) {
            float mx = S.m[r];
#pragma unroll
            for (int i = 0; i < KSUB; i++) mx = fmaxf(mx, s[i][r]);
            const float mref = mx == FI_NEG_INF ? 0.0f : mx;
            const float scale = fi_exp2(S.m[r] - mref);
            S.m[r] = mx;
            S.l[r] *= scale;
#pragma unroll
            for (int e = 0; e < EV; e++) S.o[r][e] *= scale;
#pragma unroll
            for (int i = 0; i < KSUB; i++) {
                float pr = fi_exp2(s[i][r] - mref);
                s[i][r] = pr;
                S.l[r] += pr;
            }
        }

        /* o += p . v */
#pragma unroll
        for (int i = 0; i < KSUB; i++) {
            const int key = g * KPG + kb + i;
            float vf[EV];
            if constexpr (fi_v::VALUE && is_pow2(EV)) fi_load_vec<FI_T_F32, EV>((const char *)(vbuf + key * DVO + c * EV), vf);
            else if constexpr (fi_v::VALUE) load_lane_parts<FI_T_F32, DVO, EV>((const char *)(vbuf + key * DVO), c, vf);
            else if constexpr (is_pow2(EV)) fi_load_vec<KT, EV>((const char *)vs + key * VROW + c * EV * KB, vf);
            else load_lane_parts<KT, DVO, EV>((const char *)vs + key * VROW, c, vf);
#pragma unroll
            for (int r = 0; r < RM; r++)
#pragma unroll
                for (int e = 0; e < EV; e++) S.o[r][e] = fmaf(s[i][r], vf[e], S.o[r][e]);
        }
    }
}

/* Merge the NG key groups' states in group order; write O and LSE (or the
 * item's partial rows). use_softmax = 0: the groups' sums add, LSE is 0.
 * An output hook sees each write-through row once, in shared memory. */
FI_DEV bool finish_rows(const fi_attn_args &a, const Item &it, int rb, int c, int g,
                        const fi_variant_params &P, unsigned char *smem, const State &S) {
    float *red_o = (float *)smem;
    float *red_m = red_o + NG * RM * DVO;
    float *red_l = red_m + NG * RM;
    float *red_w = red_l + NG * RM;
    float *row_inv = red_w + NG * RM;
    float *row_lse = row_inv + RM;
    float *out_rows = row_lse + RM; /* [RM][DVO], output hook */
    const int tid = threadIdx.x;
    bool bad = false; /* this thread wrote an element that is not finite */
    const float vsc = fi_v::VALUE ? 1.0f : a.v_scale; /* V rows dequantised already */
#pragma unroll
    for (int r = 0; r < RM; r++) {
#pragma unroll
        for (int e = 0; e < EV; e++) red_o[(g * RM + r) * DVO + lane_dim<DVO, EV>(c, e)] = S.o[r][e];
        if (c == 0) {
            red_m[g * RM + r] = S.m[r];
            red_l[g * RM + r] = S.l[r];
        }
    }
    __syncthreads();
    if (tid < RM && !SOFTMAX) {
        for (int gg = 0; gg < NG; gg++) red_w[gg * RM + tid] = 1.0f;
        row_inv[tid] = vsc;
        row_lse[tid] = 0.0f;
    } else if (tid < RM) {
        const int r = tid;
        float M = FI_NEG_INF;
        for (int gg = 0; gg < NG; gg++) M = fmaxf(M, red_m[gg * RM + r]);
        float L = 0.0f;
        for (int gg = 0; gg < NG; gg++) {
            float w = M == FI_NEG_INF ? 0.0f : exp2f(red_m[gg * RM + r] - M);
            red_w[gg * RM + r] = w;
            L = fmaf(w, red_l[gg * RM + r], L);
        }
        row_inv[r] = L > 0.0f ? vsc / L : 0.0f;
        /* NaN where a NaN or +inf logit was seen: a merge must not skip it */
        row_lse[r] = L > 0.0f ? M + log2f(L) : L == 0.0f ? FI_NEG_INF : FI_NAN;
    }
    __syncthreads();
    const int H = a.num_qo_heads;
    const bool hook = fi_v::OUTPUT && it.prow < 0; /* uniform over the CTA */
    if (hook) {
        for (int idx = tid; idx < RM * DVO; idx += NT) {
            const int r = idx / DVO, d = idx % DVO;
            float acc = 0.0f;
            for (int gg = 0; gg < NG; gg++) acc = fmaf(red_w[gg * RM + r], red_o[(gg * RM + r) * DVO + d], acc);
            out_rows[idx] = acc * row_inv[r];
        }
        __syncthreads();
        if (tid < RM && rb + tid < it.rows)
            fi_v::output(out_rows + tid * DVO, row_lse[tid], row_ctx(a, it, rb + tid, -1, DVO), P);
        __syncthreads();
    }
    for (int idx = tid; idx < RM * DVO; idx += NT) {
        const int r = idx / DVO, d = idx % DVO, p = rb + r;
        if (p >= it.rows) continue;
        float acc = 0.0f;
        if (hook) {
            acc = out_rows[idx];
        } else {
            for (int gg = 0; gg < NG; gg++) acc = fmaf(red_w[gg * RM + r], red_o[(gg * RM + r) * DVO + d], acc);
            acc *= row_inv[r];
        }
        bad = bad || (EXACT && !fi_finite(acc));
        const int t = it.q0 + p / GROUP, head = it.hkv * GROUP + p % GROUP;
        if (it.prow >= 0) {
            int64_t row = (int64_t)(it.prow + t - it.q0) * H + head;
            a.partial_o[row * DVO + d] = acc;
            if (d == 0) a.partial_lse[row] = row_lse[r];
        } else {
            int64_t tok = it.qo_base + t;
            fi_store_elem<OT>(a.o + tok * a.o_tok + (int64_t)head * a.o_head + d * a.o_dim, acc);
            if (d == 0 && a.lse) a.lse[tok * a.lse_tok + (int64_t)head * a.lse_head] = row_lse[r];
        }
    }
    /* the stages are reused by the next block; whether some row is not
     * finite (it is computed again: recheck) */
    return __syncthreads_or(bad);
}

/* Item `it`'s rows that are not finite as written, again, exactly
 * (exact.cuh): a warp a row. After run_item's closing barrier. */
FI_DEV void recheck(const fi_attn_args &a, const fi_view &v, const Item &it) {
    for (int p = threadIdx.x >> 5; p < it.rows; p += NWARP)
        fi_exact_recheck<QT, KT, OT, DQK, DVO, GROUP, PAGED, DEVICE_TABLE, CAUSAL, ROPE>(
            a, it, v.kv_indices, v.mask_offset, v.alibi, p);
}

/* One (item, KV head) on CUDA cores, every row block; smem holds
 * SMEM_BYTES. Every thread of the CTA calls it; it ends with a barrier.
 * Returns (uniformly) whether a row came out not finite (EXACT: recheck
 * computes it again). */
FI_DEV bool run_item(const fi_attn_args &a, const fi_view &v, const Item &item, unsigned char *smem) {
    const int32_t *kv_indices = v.kv_indices;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c = lane % TX, g = warp * KG + lane / TX;
    fi_variant_params VP = fi_v::params(a, v.alibi);
    float *kbuf = (float *)(smem + STAGES * STAGE_BYTES);
    float *vbuf = (float *)(smem + STAGES * STAGE_BYTES + KBUF_BYTES);
    State S;
    if constexpr (ROPE) {
#pragma unroll
        for (int e = 0; e < EQ; e++) S.freq[e] = fi_rope_freq(a.rope_theta, a.rope_scale, lane_dim<DQK, EQ>(c, e) % (DQK / 2), DQK);
    }
    Item it = item;
    it.mask_bit0 = fi_v::mask_bit0(VP, v.mask_offset, it.req);
    const int ntiles = (it.k1 - it.k0 + BN - 1) / BN;
    bool redo = false;
    for (int rb = 0; rb < it.rows; rb += RM) {
        load_q(a, it, rb, c, VP, smem, S);
        Pages P; /* the page ids of the next tile to load */
        if (a.kv_vec_ok) fetch_pages(a, kv_indices, it, it.k0, P);
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++) {
            if (s < ntiles) {
                load_tile(a, kv_indices, it, smem + s * STAGE_BYTES, it.k0 + s * BN, P);
                if (a.kv_vec_ok) fetch_pages(a, kv_indices, it, it.k0 + (s + 1) * BN, P);
            }
            fi_cp_async_commit();
        }
        for (int t = 0; t < ntiles; t++) {
            const int tn = t + STAGES - 1;
            if (tn < ntiles) {
                load_tile(a, kv_indices, it, smem + (tn % STAGES) * STAGE_BYTES, it.k0 + tn * BN, P);
                if (a.kv_vec_ok) fetch_pages(a, kv_indices, it, it.k0 + (tn + 1) * BN, P);
            }
            fi_cp_async_commit();
            fi_cp_async_wait<STAGES - 1>();
            __syncthreads();
            const unsigned char *st = smem + (t % STAGES) * STAGE_BYTES;
            if constexpr (ROW_KV) {
                transform_tile(a, it, VP, st, it.k0 + t * BN, kbuf, vbuf);
                __syncthreads();
            }
            compute_tile(a, it, rb, c, g, st, it.k0 + t * BN, VP, kbuf, vbuf, S);
            __syncthreads();
        }
        fi_cp_async_wait<0>();
        redo = finish_rows(a, it, rb, c, g, VP, smem, S) || redo;
    }
    return redo;
}

} /* namespace fi_attn */

/* The entry point; persistent.cuh includes this file for its device
 * functions and leaves FI_ATTN_NAME undefined. */
#ifdef FI_ATTN_NAME
extern "C" __global__ void __launch_bounds__(fi_attn::NT, fi_attn::MIN_BLOCKS)
FI_ATTN_NAME(const fi_attn_args a) {
    using namespace fi_attn;
    __shared__ __align__(16) unsigned char smem[SMEM_BYTES];
    fi_pdl_launch_dependents();
    fi_pdl_wait();
    fi_mark_upload_read(a);
    const fi_view v = fi_view_of(a);
    const fi_item_rec *items = fi_items(a, gridDim.x);
    int ib, ie;
    fi_worker_range(a, gridDim.x, blockIdx.x, ib, ie);
    bool redo = false;
    for (int hkv = blockIdx.y; hkv < a.num_kv_heads; hkv += gridDim.y)
        for (int n = ib; n < ie; n++) {
            if (fi_item_on_tc(a, items, n, GROUP)) continue; /* attention_tc.cuh's */
            redo = run_item(a, v, fi_item_load(items, n, hkv, GROUP), smem) || redo;
        }
    /* rows that came out not finite, again, after the item loops (inside
     * them the path changed the loops' code: exact.cuh) */
    if (EXACT && redo)
        for (int hkv = blockIdx.y; hkv < a.num_kv_heads; hkv += gridDim.y)
            for (int n = ib; n < ie; n++)
                if (!fi_item_on_tc(a, items, n, GROUP)) recheck(a, v, fi_item_load(items, n, hkv, GROUP));
}
#endif
