/*
 * decode_tc.cuh — decode version 3: the work items with at most
 * MAX_ROWS (16) packed rows (decode, a few speculative tokens, 16 queries
 * of a cascade's shared prefix) on
 * tensor cores, for the configurations attention_tc.cuh supports without a
 * logit transform or custom mask. Used by persistent.cuh (FI_DTC = 1).
 *
 * One (item, KV head): its rows (tokens x GQA group, <= 16) padded to one
 * m16 tile, Q fragments held in registers for the whole item (beside the
 * 128-row path: read from shared memory each tile, Q_REGS). Keys in tiles
 * of BN = 64, STAGES tiles in flight (16-byte cp.async through the page
 * table, the tile's page ids loaded a tile ahead, fixed shared offsets
 * per thread); warp w takes keys
 * [16w, 16w + 16) of every tile and keeps its own online-softmax state:
 *
 *   S = Q K^T   16 x 16 per warp: DQK/16 x 2 mma.m16n8k16 (K by ldmatrix)
 *   m' = max(m, rowmax S q); P = 2^(S q - m'); l = l 2^(m - m') + rowsum P
 *   O = O 2^(m - m') + P V      DVO/8 mma (P from the S registers, V by
 *                               ldmatrix.trans)
 *
 * so a key costs ~2 mma and ~1 ldmatrix per warp instead of the CUDA-core
 * path's ~70 instructions. At the end the four
 * warps' states are merged through shared memory in warp order
 * (deterministic) and O / LSE or the item's partial rows are written.
 *
 * Shared memory: Q [16][DQK], then STAGES x (K [BN][DQK], V [BN][DVO]),
 * 16-bit, rows swizzled as in attention_tc.cuh; the merge reuses the stages.
 *
 * FP8 K/V (E4M3, E5M2; the decode form only): tiles land as bytes in
 * STAGES8 FP8 stages (rows of DQK and DVO bytes, unswizzled), so the kernel
 * reads half the bytes of a 16-bit cache; each thread widens the chunks it
 * copied itself into one 16-bit tile after the Q block, swizzled as above,
 * which the MMA then reads as it reads a 16-bit cache's tile. The widening
 * is exact (every E4M3 and E5M2 value is an f16 and a bf16); the scales
 * stay out of it (k_scale is in q_scale, v_scale multiplies O at the end).
 *
 * Included after attention_tc.cuh (whose device functions it uses), which
 * has no include guard.
 */

namespace fi_dtc {
using namespace fi_tc; /* dims, dtypes, masks, swz, ldmatrix, mma, pack2, load_q */

constexpr int MAX_ROWS = 16;             /* packed rows of one item: one m16 tile */
constexpr int KPW = BN / NWARP;          /* keys per warp per tile: 16 */
constexpr int CH = KCH > VCH ? KCH : VCH;
constexpr int PER = BN * CH / NT;        /* 16-byte chunks per thread per tile */
constexpr int DQ_BYTES = 16 * DQK * 2;
#if FI_TC
/* beside the 128-row path: as many stages as fit in its shared memory (the
 * persistent kernel's): 2 at d 128, 3 at d 64 (2 beside 64-row blocks) */
constexpr int STAGES_D = (fi_tc::SMEM_BYTES - DQ_BYTES) / STAGE_BYTES;
#else
/* alone (the decode form of persistent.cuh, two CTAs per SM): 2 stages,
 * 68 KB at d 128 (the host launches it with room for 3) */
constexpr int STAGES_D = 2;
#endif
/* (enumerators: constants the PTX need not hold) FP8 stages: 4, in the
 * bytes of 3 16-bit stages beside the 16-bit tile */
enum : int { FP8 = FI_KVT == FI_T_E4M3 || FI_KVT == FI_T_E5M2 };
enum : int { STAGES8 = 4, STAGE8_BYTES = BN * (DQK + DVO) };
constexpr int SMEM_D = FP8 ? DQ_BYTES + STAGE_BYTES + STAGES8 * STAGE8_BYTES
                           : DQ_BYTES + STAGES_D * STAGE_BYTES; /* <= the host's (select.c) */
/* merge: o [NWARP][16][DVO], m, l [NWARP][16] */
constexpr int RED_BYTES = 4 * (NWARP * 16 * DVO + 2 * NWARP * 16);
static_assert(KPW == 16, "one k16 step of P V per warp and tile");
static_assert(STAGES_D >= 2 && (!FI_TC || SMEM_D <= fi_tc::SMEM_BYTES), "stages");
static_assert(RED_BYTES <= SMEM_D - DQ_BYTES, "merge buffer");
static_assert(!FP8 || !FI_TC, "FP8 K/V: the decode form only");
/* Q's fragments in registers for the whole item, or (beside the 128-row
 * path) ldmatrix'd from shared memory each tile: in that form ptxas kept
 * the 32 registers of fragments in local memory and reloaded and stored
 * them every tile (16 LDL.64 + 16 STL.64; 8 LDSM instead) */
constexpr bool Q_REGS = !FI_TC || MT == 1;
static_assert(!fi_v::USER && !fi_v::ELEM_MASK && !TRANSFORM && !ROWS && !fi_v::OUTPUT && FI_POS == 0,
              "built-in causal / window only on this path");

/* This thread's part of every tile: 16-byte chunk `ch` of keys key0,
 * key0 + KSTEP, ... (a warp covers whole rows: coalesced). The swizzle of
 * those rows' chunk is the same (KSTEP is a multiple of 8), so the shared
 * addresses are fixed per item and the global ones need one page id and one
 * multiply-add per key. Needs a power-of-two page size (the host checks).
 * Geo<B8>: the geometry of a 16-bit stage (B8 0: CHK / CHV chunks per
 * K / V row) or an FP8 one (rows of DQK / 16 and DVO / 16 chunks). */
constexpr int KSTEP = NT / CH;
static_assert(KSTEP % 8 == 0, "one swizzle per thread");
template <int B8> struct Geo {
    enum : int { CHK = B8 ? DQK / 16 : KCH, CHV = B8 ? DVO / 16 : VCH };
    enum : int { CH = CHK > CHV ? CHK : CHV };
    enum : int { PER = BN * CH / NT, KSTEP = NT / CH };
};
template <int B8> struct Loader {
    const char *kb, *vb;  /* K/V of the item's KV head, this thread's chunk */
    uint32_t kdst, vdst;  /* its offsets in a stage's K and V */
    int ch, key0;
    int32_t id[Geo<B8>::PER]; /* page ids of the next tile to load */
};

template <int B8>
FI_DEV void loader_init(const fi_attn_args &a, const Item &it, Loader<B8> &L) {
    using G = Geo<B8>;
    L.ch = threadIdx.x % G::CH;
    L.key0 = threadIdx.x / G::CH;
    L.kb = a.k + (int64_t)it.hkv * a.k_head + L.ch * 16;
    L.vb = a.v + (int64_t)it.hkv * a.v_head + L.ch * 16;
    if constexpr (B8) { /* FP8 stages: rows as they are */
        L.kdst = (uint32_t)(L.key0 * DQK + L.ch * 16);
        L.vdst = (uint32_t)(BN * DQK + L.key0 * DVO + L.ch * 16);
    } else {
        L.kdst = swz<KCH>(L.key0, L.ch);
        L.vdst = K_BYTES + swz<VCH>(L.key0, L.ch);
    }
}

template <int B8>
FI_DEV void fetch_pages(const fi_attn_args &a, const fi_view &v, const Item &it, int j0, Loader<B8> &L) {
    using G = Geo<B8>;
#pragma unroll
    for (int k = 0; k < G::PER; k++) {
        const int j = j0 + L.key0 + k * G::KSTEP;
        /* raw: clamped where used (load_tile), so nothing waits on the load here */
        L.id[k] = PAGED && j < it.k1 ? __ldg(v.kv_indices + it.kv_base + (j >> a.page_shift)) : 0;
    }
}

/* Keys [j0, j0 + BN) into the stage at shared address `st` (32-bit
 * arithmetic); keys >= k1 zero-filled (paged: their page id is 0, so the
 * address stays inside the cache). */
template <int B8>
FI_DEV void load_tile(const fi_attn_args &a, const Item &it, uint32_t st, int j0, const Loader<B8> &L) {
    using G = Geo<B8>;
    const int mask = a.page_size - 1;
#pragma unroll
    for (int k = 0; k < G::PER; k++) {
        const int j = j0 + L.key0 + k * G::KSTEP;
        const bool ok = j < it.k1;
        int64_t ko, vo;
        if constexpr (PAGED) { /* slot x stride < the page stride: 32 bits */
            const int64_t page = fi_page_id<DEVICE_TABLE>(a, L.id[k]);
            ko = page * a.k_page + (int32_t)((j & mask) * (int32_t)a.k_slot);
            vo = page * a.v_page + (int32_t)((j & mask) * (int32_t)a.v_slot);
        } else { /* past the span: key 0 of the item */
            ko = (it.kv_base + (ok ? j : 0)) * a.k_slot;
            vo = (it.kv_base + (ok ? j : 0)) * a.v_slot;
        }
        const int bytes = ok ? 16 : 0;
        if (L.ch < G::CHK)
            fi_cp_async16_to(st + L.kdst + k * G::KSTEP * G::CHK * 16, L.kb + ko, bytes);
        if (L.ch < G::CHV)
            fi_cp_async16_to(st + L.vdst + k * G::KSTEP * G::CHV * 16, L.vb + vo, bytes);
    }
}

/* Two FP8 values (low 16 bits: element i, then i + 1) as the MMA's 16-bit
 * pair, exactly: f16 from the conversion instruction (sm_89 on), bf16
 * through f32. */
FI_DEV uint32_t widen2(uint32_t two) {
    uint32_t h;
#if __CUDA_ARCH__ >= 890
    const unsigned short b = (unsigned short)two;
    if constexpr (FI_KVT == FI_T_E4M3) asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(b));
    else asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h) : "h"(b));
#else
    const bool e4 = FI_KVT == FI_T_E4M3;
    const float lo = e4 ? fi_e4m3_to_f32(two & 0xffu) : fi_e5m2_to_f32(two & 0xffu);
    const float hi = e4 ? fi_e4m3_to_f32((two >> 8) & 0xffu) : fi_e5m2_to_f32((two >> 8) & 0xffu);
    h = pack2<false>(lo, hi);
#endif
    if constexpr (!BF16) return h;
    return pack2<true>(fi_f16_to_f32(h & 0xffffu), fi_f16_to_f32(h >> 16));
}

/* 16 FP8 values at shared address src as two 16-bit chunks at lo, hi. */
FI_DEV void widen_chunk(uint32_t src, uint32_t lo, uint32_t hi) {
    uint32_t w0, w1, w2, w3;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(w0), "=r"(w1), "=r"(w2), "=r"(w3) : "r"(src));
    asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" ::"r"(lo), "r"(widen2(w0)),
                 "r"(widen2(w0 >> 16)), "r"(widen2(w1)), "r"(widen2(w1 >> 16)) : "memory");
    asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" ::"r"(hi), "r"(widen2(w2)),
                 "r"(widen2(w2 >> 16)), "r"(widen2(w3)), "r"(widen2(w3 >> 16)) : "memory");
}

/* The chunks this thread copied into the FP8 stage at st8, widened into the
 * 16-bit tile at st16 (FP8 chunk c of a row is 16-bit chunks 2c, 2c + 1).
 * Its own copies: visible to it after its wait, with no barrier. Nothing
 * for 16-bit stages (B8 0), which the MMA reads as they land. */
template <int B8>
FI_DEV void widen_tile(uint32_t st8, uint32_t st16, const Loader<B8> &L) {
    using G = Geo<B8>;
#pragma unroll
    for (int k = 0; k < (B8 ? G::PER : 0); k++) {
        const int key = L.key0 + k * G::KSTEP;
        if (L.ch < G::CHK)
            widen_chunk(st8 + L.kdst + k * G::KSTEP * DQK, st16 + swz<KCH>(key, 2 * L.ch),
                        st16 + swz<KCH>(key, 2 * L.ch + 1));
        if (L.ch < G::CHV)
            widen_chunk(st8 + L.vdst + k * G::KSTEP * DVO, st16 + K_BYTES + swz<VCH>(key, 2 * L.ch),
                        st16 + K_BYTES + swz<VCH>(key, 2 * L.ch + 1));
    }
}

/* One (item, KV head), it.rows <= 16; smem holds fi_tc::SMEM_BYTES. Every
 * thread of the CTA calls it; it ends with a barrier. */
FI_DEV void run_item(const fi_attn_args &a, const fi_view &v, const Item &it, unsigned char *smem) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, tq = lane & 3;
    unsigned char *qs = smem, *kvs = smem + DQ_BYTES;
    const uint32_t qs_a = fi_smem_addr(qs), kvs_a = fi_smem_addr(kvs);
    const int diag0 = it.kv_len - it.qo_len + it.q0;
    const int ntiles = (it.k1 - it.k0 + BN - 1) / BN;
    const float qsc = a.q_scale;

    float m[2] = {FI_NEG_INF, FI_NEG_INF}, l[2] = {0.0f, 0.0f};
    float o[DT][4];
#pragma unroll
    for (int d = 0; d < DT; d++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[d][e] = 0.0f;
    uint32_t qa[Q_REGS ? DQK / 16 : 1][4];

    load_q<16>(a, it, 0, qs);
    /* the stages the copies land in: 16-bit ones the MMA reads, or (FP8)
     * byte stages after the one 16-bit tile at kvs */
    constexpr int NS = FP8 ? STAGES8 : STAGES_D, SB = FP8 ? STAGE8_BYTES : STAGE_BYTES;
    const uint32_t st_a = FP8 ? kvs_a + STAGE_BYTES : kvs_a;
    Loader<FP8> P;
    loader_init(a, it, P);
    fetch_pages(a, v, it, it.k0, P);
#pragma unroll
    for (int s = 0; s < NS - 1; s++) {
        if (s < ntiles) {
            load_tile(a, it, st_a + s * SB, it.k0 + s * BN, P);
            fetch_pages(a, v, it, it.k0 + (s + 1) * BN, P);
        }
        fi_cp_async_commit();
    }
    for (int t = 0; t < ntiles; t++) {
        const int tn = t + NS - 1;
        if (tn < ntiles) {
            load_tile(a, it, st_a + (tn % NS) * SB, it.k0 + tn * BN, P);
            fetch_pages(a, v, it, it.k0 + (tn + 1) * BN, P);
        }
        fi_cp_async_commit();
        fi_cp_async_wait<NS - 1>();
        if constexpr (FP8) widen_tile(st_a + (t % NS) * SB, kvs_a, P);
        __syncthreads();
        if (Q_REGS && t == 0) { /* Q landed with tile 0 */
#pragma unroll
            for (int kk = 0; kk < DQK / 16; kk++)
                ldsm_x4(qs_a + swz<KCH>(lane & 15, kk * 2 + (lane >> 4)), qa[kk][0], qa[kk][1],
                        qa[kk][2], qa[kk][3]);
        }
        const int j0 = it.k0 + t * BN, kw = warp * KPW;
        const uint32_t ks_a = FP8 ? kvs_a : kvs_a + (t % STAGES_D) * STAGE_BYTES;
        const uint32_t vs_a = ks_a + K_BYTES;
        /* S = Q K^T for this warp's 16 keys */
        float s[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < DQK / 16; kk++) {
            uint32_t b0, b1, b2, b3;
            ldsm_x4(ks_a + swz<KCH>(kw + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)),
                    b0, b1, b2, b3);
            const int qk = Q_REGS ? kk : 0;
            if constexpr (!Q_REGS)
                ldsm_x4(qs_a + swz<KCH>(lane & 15, kk * 2 + (lane >> 4)), qa[0][0], qa[0][1], qa[0][2],
                        qa[0][3]);
            mma(s[0], qa[qk], b0, b1);
            mma(s[1], qa[qk], b2, b3);
        }

        /* masks: a tile every row sees whole skips them */
        bool whole = j0 + BN <= it.k1;
        if constexpr (CAUSAL) whole = whole && j0 + BN - 1 <= diag0;
        if constexpr (WINDOW) whole = whole && j0 >= diag0 + (it.rows - 1) / GROUP - a.window_left;
        if (!whole) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int diag = diag0 + (g + 8 * h) / GROUP;
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int j = j0 + kw + nt * 8 + 2 * tq + e;
                        bool vis = j < it.k1;
                        if constexpr (CAUSAL) vis = vis && j <= diag;
                        if constexpr (WINDOW) vis = vis && j >= diag - a.window_left;
                        if (!vis) s[nt][2 * h + e] = FI_NEG_INF;
                    }
            }
        }

        /* online softmax, a row's four lanes together (m in the log2 domain) */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mold = m[h];
            mx = fmaxf(mold, mx * qsc);
            const float mref = mx == FI_NEG_INF ? 0.0f : mx;
            const float scale = fi_exp2(mold - mref);
            m[h] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float pr = fi_exp2(fmaf(s[nt][2 * h + e], qsc, -mref));
                    s[nt][2 * h + e] = pr;
                    sum += pr;
                }
            l[h] = fmaf(l[h], scale, sum);
            if (__any_sync(0xffffffffu, mold != mx)) {
#pragma unroll
                for (int d = 0; d < DT; d++) {
                    o[d][2 * h] *= scale;
                    o[d][2 * h + 1] *= scale;
                }
            }
        }

        /* O += P V */
        uint32_t pa[4];
        pa[0] = pack2(s[0][0], s[0][1]);
        pa[1] = pack2(s[0][2], s[0][3]);
        pa[2] = pack2(s[1][0], s[1][1]);
        pa[3] = pack2(s[1][2], s[1][3]);
#pragma unroll
        for (int dp = 0; dp < DT / 2; dp++) {
            uint32_t b0, b1, b2, b3;
            ldsm_x4_t(vs_a + swz<VCH>(kw + (lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4)),
                      b0, b1, b2, b3);
            mma(o[2 * dp], pa, b0, b1);
            mma(o[2 * dp + 1], pa, b2, b3);
        }
        __syncthreads(); /* the stage is refilled next */
    }
    fi_cp_async_wait<0>();
    __syncthreads(); /* Q and the stages become the merge buffer */

    /* the four warps' states, merged in warp order */
    float *red_o = reinterpret_cast<float *>(kvs);
    float *red_m = red_o + NWARP * 16 * DVO, *red_l = red_m + NWARP * 16;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = g + 8 * h;
        float L = l[h];
        L += __shfl_xor_sync(0xffffffffu, L, 1);
        L += __shfl_xor_sync(0xffffffffu, L, 2);
        if (r >= it.rows) continue; /* a padded row: never read */
        if (tq == 0) {
            red_m[warp * 16 + r] = m[h];
            red_l[warp * 16 + r] = L;
        }
#pragma unroll
        for (int d = 0; d < DT; d++)
            *reinterpret_cast<float2 *>(red_o + (warp * 16 + r) * DVO + d * 8 + 2 * tq) =
                make_float2(o[d][2 * h], o[d][2 * h + 1]);
    }
    __syncthreads();
    const int H = a.num_qo_heads;
    for (int idx = threadIdx.x; idx < it.rows * DVO; idx += NT) {
        const int r = idx / DVO, d = idx % DVO;
        float M = FI_NEG_INF;
#pragma unroll
        for (int w = 0; w < NWARP; w++) M = fmaxf(M, red_m[w * 16 + r]);
        float L = 0.0f, acc = 0.0f;
        if (M != FI_NEG_INF) {
#pragma unroll
            for (int w = 0; w < NWARP; w++) {
                const float wt = fi_exp2(red_m[w * 16 + r] - M);
                L = fmaf(wt, red_l[w * 16 + r], L);
                acc = fmaf(wt, red_o[(w * 16 + r) * DVO + d], acc);
            }
        }
        acc *= L > 0.0f ? a.v_scale / L : 0.0f;
        const float lse = L > 0.0f ? M + log2f(L) : FI_NEG_INF;
        const int t = it.q0 + r / GROUP, head = it.hkv * GROUP + r % GROUP;
        if (it.prow >= 0) {
            const int64_t row = (int64_t)(it.prow + t - it.q0) * H + head;
            a.partial_o[row * DVO + d] = acc;
            if (d == 0) a.partial_lse[row] = lse;
        } else {
            const int64_t tok = it.qo_base + t;
            fi_store_elem<OT>(a.o + tok * a.o_tok + (int64_t)head * a.o_head + d * a.o_dim, acc);
            if (d == 0 && a.lse) a.lse[tok * a.lse_tok + (int64_t)head * a.lse_head] = lse;
        }
    }
    __syncthreads(); /* smem is reused by the next item */
}

/* Any item, in slices of whole tokens of at most MAX_ROWS packed rows (the
 * decode form of persistent.cuh, which has no 128-row path, takes wide
 * items this way: correct, but each slice reads the item's keys again). */
FI_DEV void run_sliced(const fi_attn_args &a, const fi_view &v, const Item &it, unsigned char *smem) {
    static_assert(GROUP <= MAX_ROWS, "a token's rows fit one slice");
    constexpr int PER = MAX_ROWS / GROUP; /* tokens per slice */
    const int T = it.rows / GROUP;
    if (T <= PER) { /* one slice: the item as it is. The loop below would do the same,
                     * but this second inlined copy of run_item is measured faster */
        run_item(a, v, it, smem);
        return;
    }
    for (int t0 = 0; t0 < T; t0 += PER) {
        Item s = it;
        s.q0 = it.q0 + t0;
        s.rows = (T - t0 < PER ? T - t0 : PER) * GROUP;
        if (it.prow >= 0) s.prow = it.prow + t0; /* partial rows follow the tokens */
        run_item(a, v, s, smem);
    }
}

} /* namespace fi_dtc */
