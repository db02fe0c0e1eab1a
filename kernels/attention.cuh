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
 *   TX = max(D_qk, D_vo) / 8 lanes share one key (each holds EQ = D_qk / TX
 *   q elements and EV = D_vo / TX o elements of every row), so a warp works
 *   on 32 / TX keys at once and the CTA on NG = 4 * 32 / TX "key groups".
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
 *   FI_DQK, FI_DVO    head dims (64, 128, 256)
 *   FI_QT, FI_KVT, FI_OT  dtype codes (fi_dtype values)
 *   FI_GROUP          H_qo / H_kv;  FI_ROWS rows per block (1..8)
 *   FI_PAGED          1 paged, 0 ragged KV
 *   FI_MASK           0 none, 1 causal, 2 custom bits
 *   FI_WINDOW         1: sliding window (window_left >= 0)
 *   FI_SOFTCAP        1: logits soft-cap
 *   FI_POS            0 none, 1 LLaMA RoPE fused, 2 ALiBi
 *   FI_ATTN_NAME      the extern "C" entry point's name
 */
#include "prelude.cuh"

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

namespace fi_attn {

__host__ __device__ constexpr int pow2_floor(int x) { return x >= 2 ? 2 * pow2_floor(x / 2) : 1; }
__host__ __device__ constexpr int imax(int a, int b) { return a > b ? a : b; }
__host__ __device__ constexpr int imin(int a, int b) { return a < b ? a : b; }

constexpr int DQK = FI_DQK, DVO = FI_DVO;
constexpr int QT = FI_QT, KT = FI_KVT, OT = FI_OT;
constexpr int GROUP = FI_GROUP, RM = FI_ROWS;
constexpr bool PAGED = FI_PAGED != 0;
constexpr bool CAUSAL = FI_MASK == 1, CUSTOM = FI_MASK == 2;
constexpr bool WINDOW = FI_WINDOW != 0, SOFTCAP = FI_SOFTCAP != 0;
constexpr bool ROPE = FI_POS == 1, ALIBI = FI_POS == 2;
constexpr bool TRANSFORM = SOFTCAP || ALIBI; /* logits leave the log2 domain */

constexpr int NT = 128, NWARP = NT / 32;
constexpr int TX = imax(DQK, DVO) / 8;       /* lanes per key: 8, 16, 32 */
constexpr int EQ = DQK / TX, EV = DVO / TX;  /* elements per lane */
constexpr int KG = 32 / TX, NG = NWARP * KG; /* key groups per warp, per CTA */
constexpr int KB = fi_dtype_bytes<KT>::value;
constexpr int KROW = DQK * KB, VROW = DVO * KB;           /* bytes per key */
#ifndef FI_TILE_BYTES
#define FI_TILE_BYTES 16384 /* K + V bytes per stage (tuning knob) */
#endif
#ifndef FI_STAGES
#define FI_STAGES 3
#endif
constexpr int KPG = imin(pow2_floor(imax(FI_TILE_BYTES / (KROW + VROW) / NG, 1)), 128 / NG);
constexpr int BN = NG * KPG;                 /* keys per tile (<= 16 KB of K+V) */
constexpr int KSUB = imin(KPG, 4);           /* keys per softmax update */
constexpr int STAGES = FI_STAGES;
constexpr int STAGE_BYTES = BN * (KROW + VROW);
constexpr int KCH = KROW / 16, VCH = VROW / 16, CH = imax(KCH, VCH);
/* final merge: o [NG][RM][DVO], m, l, w [NG][RM], inv, lse [RM] */
constexpr int RED_BYTES = 4 * (NG * RM * DVO + 3 * NG * RM + 2 * RM);
constexpr int SMEM_BYTES = imax(STAGES * STAGE_BYTES, RED_BYTES);
#ifdef FI_MIN_BLOCKS
constexpr int MIN_BLOCKS = FI_MIN_BLOCKS;
#else
constexpr int MIN_BLOCKS = RM <= 2 ? 4 : RM <= 4 ? 3 : 2; /* registers: q, o, s per row */
#endif
constexpr float LOG2E = 1.4426950408889634f;

static_assert(TX >= 8 && TX <= 32 && EQ >= 1 && EV >= 1, "head dims");
static_assert(RM >= 1 && RM <= 8, "rows per block");
static_assert(KPG % KSUB == 0, "sub-tiles");
static_assert(SMEM_BYTES <= 48 * 1024, "static shared memory");

/* What stays fixed while one (item, KV head) runs. */
struct Item {
    int req, q0, rows, k0, k1, prow;
    int qo_len, kv_len;
    int64_t qo_base;   /* qo_indptr[req] */
    int64_t kv_base;   /* paged: kv_indptr[req] (pages); ragged: first token */
    int64_t mask_bit0; /* custom mask: first bit of the request's segment */
    int hkv;
};

/* Byte offsets of key j's K and V rows (KV head included). */
FI_DEV void kv_offsets(const fi_attn_args &a, const int32_t *kv_indices, const Item &it, int j,
                       int64_t *ko, int64_t *vo) {
    int64_t page = 0, slot;
    if constexpr (PAGED) {
        int pi, s;
        if (a.page_shift >= 0) {
            pi = j >> a.page_shift;
            s = j & (a.page_size - 1);
        } else {
            pi = j / a.page_size;
            s = j - pi * a.page_size;
        }
        page = kv_indices[it.kv_base + pi];
        slot = s;
    } else {
        slot = it.kv_base + j;
    }
    *ko = page * a.k_page + slot * a.k_slot + (int64_t)it.hkv * a.k_head;
    *vo = page * a.v_page + slot * a.v_slot + (int64_t)it.hkv * a.v_head;
}

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
                P.id[k] = kv_indices[it.kv_base + pi];
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
                page = ok ? P.id[k] : 0;
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
                kv_offsets(a, kv_indices, it, j, &ko, &vo);
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
                kv_offsets(a, kv_indices, it, j, &ko, &vo);
                fi_copy_raw<KB>((char *)dst, a.v + vo + d * a.v_dim);
            } else {
                fi_zero_raw<KB>((char *)dst);
            }
        }
    }
}

/* RoPE frequency of the pair that dimension d belongs to. */
FI_DEV float rope_freq(const fi_attn_args &a, int d) {
    int i = d % (DQK / 2);
    return exp2f(-2.0f * (float)i / (float)DQK * a.rope_log2_theta) * a.rope_rcp_scale;
}

/* The per-thread state of one row block. */
struct State {
    float q[RM][EQ];
    float o[RM][EV];
    float m[RM], l[RM];
    float slope[RM];
    float freq[EQ];
};

FI_DEV void load_q(const fi_attn_args &a, const Item &it, int rb, int c, const float *alibi,
                   State &S) {
    const int diag0 = it.kv_len - it.qo_len + it.q0;
#pragma unroll
    for (int r = 0; r < RM; r++) {
        int p = rb + r, t = p / GROUP, head = it.hkv * GROUP + p % GROUP;
        bool valid = p < it.rows;
        const char *base = a.q + (it.qo_base + it.q0 + t) * a.q_tok + (int64_t)head * a.q_head;
#pragma unroll
        for (int e = 0; e < EQ; e++) {
            int d = c * EQ + e;
            float x = valid ? fi_load_elem<QT>(base + d * a.q_dim) : 0.0f;
            if constexpr (ROPE) {
                int pd = d < DQK / 2 ? d + DQK / 2 : d - DQK / 2;
                float xp = valid ? fi_load_elem<QT>(base + pd * a.q_dim) : 0.0f;
                float sn, cs;
                sincosf((float)(diag0 + t) * S.freq[e], &sn, &cs);
                x = d < DQK / 2 ? x * cs - xp * sn : x * cs + xp * sn;
            }
            S.q[r][e] = x * a.q_scale;
        }
        if constexpr (ALIBI) S.slope[r] = valid ? alibi[head] : 0.0f;
        S.m[r] = FI_NEG_INF;
        S.l[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < EV; e++) S.o[r][e] = 0.0f;
    }
}

/* One stage of keys [j0, j0 + BN): this thread's key group's KPG keys. */
FI_DEV void compute_tile(const fi_attn_args &a, const Item &it, int rb, int c, int g,
                         const unsigned char *st, int j0, State &S) {
    const unsigned char *ks = st, *vs = st + BN * KROW;
    const int diag0 = it.kv_len - it.qo_len + it.q0;
#pragma unroll
    for (int kb = 0; kb < KPG; kb += KSUB) {
        float s[KSUB][RM];
#pragma unroll
        for (int i = 0; i < KSUB; i++) {
            const int key = g * KPG + kb + i;
            float kf[EQ];
            fi_load_vec<KT, EQ>((const char *)ks + key * KROW + c * EQ * KB, kf);
            if constexpr (ROPE) {
                float kp[EQ];
                fi_load_vec<KT, EQ>((const char *)ks + key * KROW + (c ^ (TX / 2)) * EQ * KB, kp);
                const float pos = (float)(j0 + key);
#pragma unroll
                for (int e = 0; e < EQ; e++) {
                    float sn, cs;
                    sincosf(pos * S.freq[e], &sn, &cs);
                    kf[e] = c < TX / 2 ? kf[e] * cs - kp[e] * sn : kf[e] * cs + kp[e] * sn;
                }
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
        bool whole = j0 + BN <= it.k1 && rb + RM <= it.rows && !CUSTOM && !TRANSFORM;
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
                    if constexpr (WINDOW) vis = vis && j >= diag - a.window_left;
                    if constexpr (CUSTOM) {
                        if (vis) {
                            int64_t bit = it.mask_bit0 + (int64_t)(it.q0 + p / GROUP) * it.kv_len + j;
                            vis = (a.mask[bit >> 3] >> (bit & 7)) & 1;
                        }
                    }
                    float x = s[i][r];
                    if constexpr (SOFTCAP) x = a.softcap * tanhf(x * a.softcap_rcp);
                    if constexpr (ALIBI) x = fmaf(S.slope[r], (float)(j - diag), x);
                    if constexpr (TRANSFORM) x *= LOG2E;
                    s[i][r] = vis ? x : FI_NEG_INF;
                }
            }
        }

        /* online softmax */
#pragma unroll
        for (int r = 0; r < RM; r++) {
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
            fi_load_vec<KT, EV>((const char *)vs + key * VROW + c * EV * KB, vf);
#pragma unroll
            for (int r = 0; r < RM; r++)
#pragma unroll
                for (int e = 0; e < EV; e++) S.o[r][e] = fmaf(s[i][r], vf[e], S.o[r][e]);
        }
    }
}

/* Merge the NG key groups' states in group order; write O and LSE (or the
 * item's partial rows). */
FI_DEV void finish_rows(const fi_attn_args &a, const Item &it, int rb, int c, int g,
                        unsigned char *smem, const State &S) {
    float *red_o = (float *)smem;
    float *red_m = red_o + NG * RM * DVO;
    float *red_l = red_m + NG * RM;
    float *red_w = red_l + NG * RM;
    float *row_inv = red_w + NG * RM;
    float *row_lse = row_inv + RM;
    const int tid = threadIdx.x;
#pragma unroll
    for (int r = 0; r < RM; r++) {
#pragma unroll
        for (int e = 0; e < EV; e++) red_o[(g * RM + r) * DVO + c * EV + e] = S.o[r][e];
        if (c == 0) {
            red_m[g * RM + r] = S.m[r];
            red_l[g * RM + r] = S.l[r];
        }
    }
    __syncthreads();
    if (tid < RM) {
        const int r = tid;
        float M = FI_NEG_INF;
        for (int gg = 0; gg < NG; gg++) M = fmaxf(M, red_m[gg * RM + r]);
        float L = 0.0f;
        for (int gg = 0; gg < NG; gg++) {
            float w = M == FI_NEG_INF ? 0.0f : exp2f(red_m[gg * RM + r] - M);
            red_w[gg * RM + r] = w;
            L = fmaf(w, red_l[gg * RM + r], L);
        }
        row_inv[r] = L > 0.0f ? a.v_scale / L : 0.0f;
        row_lse[r] = L > 0.0f ? M + log2f(L) : FI_NEG_INF;
    }
    __syncthreads();
    const int H = a.num_qo_heads;
    for (int idx = tid; idx < RM * DVO; idx += NT) {
        const int r = idx / DVO, d = idx % DVO, p = rb + r;
        if (p >= it.rows) continue;
        float acc = 0.0f;
        for (int gg = 0; gg < NG; gg++) acc = fmaf(red_w[gg * RM + r], red_o[(gg * RM + r) * DVO + d], acc);
        acc *= row_inv[r];
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
    __syncthreads(); /* the stages are reused by the next block */
}

} /* namespace fi_attn */

extern "C" __global__ void __launch_bounds__(fi_attn::NT, fi_attn::MIN_BLOCKS)
FI_ATTN_NAME(const fi_attn_args a) {
    using namespace fi_attn;
    __shared__ __align__(16) unsigned char smem[SMEM_BYTES];
    const fi_meta *meta = (const fi_meta *)a.meta;
    const int w = blockIdx.x;
    if (w >= meta->num_workers) return;
    const int32_t *qo_indptr = (const int32_t *)(a.meta + meta->off_qo_indptr);
    const int32_t *kv_indptr = (const int32_t *)(a.meta + meta->off_kv_indptr);
    const int32_t *kv_indices = (const int32_t *)(a.meta + meta->off_kv_indices);
    const int32_t *kv_len = (const int32_t *)(a.meta + meta->off_kv_len);
    const int64_t *mask_offset = (const int64_t *)(a.meta + meta->off_mask_offset);
    const int32_t *items = (const int32_t *)(a.meta + meta->off_items);
    const int32_t *worker_indptr = (const int32_t *)(a.meta + meta->off_worker_indptr);
    const float *alibi = (const float *)(a.meta + meta->off_alibi);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c = lane % TX, g = warp * KG + lane / TX;
    const int ib = worker_indptr[w], ie = worker_indptr[w + 1];

    State S;
    if constexpr (ROPE) {
#pragma unroll
        for (int e = 0; e < EQ; e++) S.freq[e] = rope_freq(a, c * EQ + e);
    }
    for (int hkv = blockIdx.y; hkv < a.num_kv_heads; hkv += gridDim.y) {
        for (int n = ib; n < ie; n++) {
            const int32_t *wi = items + 6 * (int64_t)n; /* fi_work_item */
            Item it;
            it.req = wi[0];
            it.q0 = wi[1];
            it.rows = (wi[2] - wi[1]) * GROUP;
            if (a.tc_min_rows > 0 && it.rows >= a.tc_min_rows) continue; /* attention_tc.cuh's */
            it.k0 = wi[3];
            it.k1 = wi[4];
            it.prow = wi[5];
            it.qo_base = qo_indptr[it.req];
            it.qo_len = qo_indptr[it.req + 1] - qo_indptr[it.req];
            it.kv_len = kv_len[it.req];
            it.kv_base = kv_indptr[it.req];
            it.mask_bit0 = CUSTOM ? mask_offset[it.req] * 8 : 0;
            it.hkv = hkv;
            const int ntiles = (it.k1 - it.k0 + BN - 1) / BN;
            for (int rb = 0; rb < it.rows; rb += RM) {
                load_q(a, it, rb, c, alibi, S);
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
                    compute_tile(a, it, rb, c, g, smem + (t % STAGES) * STAGE_BYTES, it.k0 + t * BN, S);
                    __syncthreads();
                }
                fi_cp_async_wait<0>();
                finish_rows(a, it, rb, c, g, smem, S);
            }
        }
    }
}
