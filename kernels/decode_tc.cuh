/*
 * decode_tc.cuh — decode version 3: the work items with at most
 * MAX_ROWS (16) packed rows (decode, a few speculative tokens, 16 queries
 * of a cascade's shared prefix) on
 * tensor cores, for the configurations attention_tc.cuh supports without a
 * logit transform or custom mask, and (the decode form) FP8 K/V and head
 * dim 256. Used by persistent.cuh (FI_DTC = 1).
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
 * Where D_qk + D_vo > 256 (SPLIT, below) tiles are 32 keys, warp w takes
 * S for keys [8w, 8w + 8), and the tile's S goes through shared memory so
 * that every warp runs the whole tile's softmax and P V for its quarter
 * of O's columns: one state, no merge.
 *
 * Shared memory: Q [16][DQK], then STAGES x (K [BN][DQK], V [BN][DVO]),
 * 16-bit, rows swizzled as in attention_tc.cuh (SPLIT: then S [16][BN + 8]
 * f32); the merge reuses the stages.
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
/* SPLIT (D_qk + D_vo > 256, the decode form only): O's columns split over
 * the warps. A warp's O of 16 rows x D_vo f32 would be 128 registers at
 * D_vo 256 beside Q's 64, so warp w keeps columns [w D_vo / 4, (w + 1)
 * D_vo / 4) of O for every key of a tile: it computes S for 8 keys of a
 * 32-key tile, the four warps exchange S through shared memory, and each
 * runs the same online softmax over the tile's 32 keys (bitwise the same
 * m and l in every warp), then P V for its columns. 32-key tiles keep
 * three 16-bit stages (or one 16-bit tile and four FP8 stages) at 104 KB
 * at d 256, 106.5 KB with Q and S: two CTAs per SM. */
enum : int { SPLIT = DQK + DVO > 256 };
constexpr int BN = SPLIT ? 32 : fi_tc::BN; /* keys per tile */
constexpr int K_BYTES = BN * DQK * 2, V_BYTES = BN * DVO * 2;
constexpr int STAGE_BYTES = K_BYTES + V_BYTES;
constexpr int KPW = BN / NWARP;          /* keys per warp per tile: 16, or 8 (SPLIT) */
constexpr int DVW = SPLIT ? DVO / NWARP : DVO; /* O columns per warp */
constexpr int ODT = DVW / 8;             /* n8 tiles of O per warp */
constexpr int NSLOT = SPLIT ? 1 : NWARP; /* softmax states merged at the end */
constexpr int DQ_BYTES = 16 * DQK * 2;
/* SPLIT: the tile's scores S [16][SBS] f32 after the stages (rows padded
 * by 8 floats: a warp's float2 reads and writes in two wavefronts) */
constexpr int SBS = BN + 8;
constexpr int SB_BYTES = SPLIT ? 16 * SBS * 4 : 0;
#if FI_TC
/* beside the 128-row path: as many stages as fit in its shared memory (the
 * persistent kernel's): 2 at d 128, 3 at d 64 (2 beside 64-row blocks) */
constexpr int STAGES_D = (fi_tc::SMEM_BYTES - DQ_BYTES) / STAGE_BYTES;
#else
/* alone (the decode form of persistent.cuh, two CTAs per SM): 2 stages,
 * 68 KB at d 128 (the host launches it with room for 3); SPLIT: the 3
 * the host has room for, two 32 KB tiles in flight at d 256 */
constexpr int STAGES_D = SPLIT ? 3 : 2;
#endif
/* (enumerators: constants the PTX need not hold) FP8 stages: 4, in the
 * bytes of 3 16-bit stages beside the 16-bit tile */
enum : int { FP8 = FI_KVT == FI_T_E4M3 || FI_KVT == FI_T_E5M2 };
enum : int { STAGES8 = 4, STAGE8_BYTES = BN * (DQK + DVO) };
constexpr int SMEM_D = (FP8 ? DQ_BYTES + STAGE_BYTES + STAGES8 * STAGE8_BYTES
                            : DQ_BYTES + STAGES_D * STAGE_BYTES) + SB_BYTES; /* <= the host's (select.c) */
/* merge: o [NSLOT][16][DVO], m, l [NSLOT][16] */
constexpr int RED_BYTES = 4 * (NSLOT * 16 * DVO + 2 * NSLOT * 16);
static_assert(SPLIT ? KPW == 8 && DVW % 16 == 0 : KPW == 16, "P V: one k16 step per warp and tile, "
              "or (SPLIT) the tile's two over a warp's columns");
static_assert(!SPLIT || !FI_TC, "SPLIT: the decode form only");
static_assert((DQK == 64 || DQK == 128 || DQK == 256) && (DVO == 64 || DVO == 128 || DVO == 256),
              "head dims");
static_assert(STAGES_D >= 2 && (!FI_TC || SMEM_D <= fi_tc::SMEM_BYTES), "stages");
static_assert(RED_BYTES <= SMEM_D - DQ_BYTES - SB_BYTES, "merge buffer");
static_assert(!FP8 || !FI_TC, "FP8 K/V: the decode form only");
/* Q's fragments in registers for the whole item, or (beside the 128-row
 * path) ldmatrix'd from shared memory each tile: in that form ptxas kept
 * the 32 registers of fragments in local memory and reloaded and stored
 * them every tile (16 LDL.64 + 16 STL.64; 8 LDSM instead) */
constexpr bool Q_REGS = !FI_TC || MT == 1;
static_assert(!fi_v::USER && !fi_v::ELEM_MASK && !TRANSFORM && !ROWS && !fi_v::OUTPUT && FI_POS == 0,
              "built-in causal / window only on this path");

/* This thread's part of every tile: 16-byte chunks ch (and, in rows of
 * 32 chunks, ch + 16: CPT 2) of keys key0, key0 + KSTEP, ... (a warp
 * covers whole runs of rows: coalesced). The swizzle of those rows' chunks
 * is the same (KSTEP and the chunk step TPK are multiples of 8), so the
 * shared addresses are fixed per item and the global ones need one page
 * id and one multiply-add per key. Needs a power-of-two page size (the
 * host checks). Two chunks a key at d 256 rather than one for twice the
 * keys: half the page ids and key addresses in registers (with one chunk,
 * ptxas spilled there). Geo<B8>: the geometry of a 16-bit stage (B8 0:
 * CHK / CHV chunks per K / V row) or an FP8 one (rows of DQK / 16 and
 * DVO / 16 chunks, unswizzled). */
template <int B8> struct Geo {
    enum : int { CHK = B8 ? DQK / 16 : KCH, CHV = B8 ? DVO / 16 : VCH };
    enum : int { CH = CHK > CHV ? CHK : CHV };
    enum : int { CPT = CH > 16 ? 2 : 1, TPK = CH / CPT }; /* chunks a thread, threads a key */
    enum : int { KSTEP = NT / TPK, PER = BN / KSTEP };    /* keys apart, keys a thread */
    static_assert(KSTEP % 8 == 0 && (CPT == 1 || (TPK % 8 == 0 && !B8)) && PER >= 1,
                  "one swizzle per thread (FP8 rows: one chunk a key, widen_tile)");
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
    L.ch = threadIdx.x % G::TPK;
    L.key0 = threadIdx.x / G::TPK;
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
#pragma unroll
        for (int c = 0; c < G::CPT; c++) { /* chunk ch + cc: cc x 16 bytes on, in shared too */
            const int cc = c * G::TPK;
            if (L.ch + cc < G::CHK)
                fi_cp_async16_to(st + L.kdst + k * G::KSTEP * G::CHK * 16 + cc * 16, L.kb + ko + cc * 16,
                                 bytes);
            if (L.ch + cc < G::CHV)
                fi_cp_async16_to(st + L.vdst + k * G::KSTEP * G::CHV * 16 + cc * 16, L.vb + vo + cc * 16,
                                 bytes);
        }
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

/* The online softmax over N n8 tiles of scores s (accumulator layout: a
 * row's four lanes together; m in the log2 domain), s becoming P, O's NO
 * n8 tiles rescaled where a row's max moved. */
template <int N, int NO>
FI_DEV void online_softmax(float (&s)[N][4], float (&o)[NO][4], float (&m)[2], float (&l)[2], float qsc) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float mx = fmaxf(s[0][2 * h], s[0][2 * h + 1]);
#pragma unroll
        for (int nt = 1; nt < N; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mold = m[h];
        mx = fmaxf(mold, mx * qsc);
        const float mref = mx == FI_NEG_INF ? 0.0f : mx;
        const float scale = fi_exp2(mold - mref);
        m[h] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < N; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float pr = fi_exp2(fmaf(s[nt][2 * h + e], qsc, -mref));
                s[nt][2 * h + e] = pr;
                sum += pr;
            }
        l[h] = fmaf(l[h], scale, sum);
        if (__any_sync(0xffffffffu, mold != mx)) {
#pragma unroll
            for (int d = 0; d < NO; d++) {
                o[d][2 * h] *= scale;
                o[d][2 * h + 1] *= scale;
            }
        }
    }
}

/* O's NO n8 tiles (columns from 16-byte chunk c0 of V's rows) += P V for
 * keys [key, key + 16) of the stage's V at vs_a; P: the A operand from
 * the n8 score tiles s0 (keys key..key + 7) and s1 (key + 8..key + 15). */
template <int NO>
FI_DEV void pv_step(float (&o)[NO][4], const float (&s0)[4], const float (&s1)[4], uint32_t vs_a,
                    int key, int c0, int lane) {
    uint32_t pa[4];
    pa[0] = pack2(s0[0], s0[1]);
    pa[1] = pack2(s0[2], s0[3]);
    pa[2] = pack2(s1[0], s1[1]);
    pa[3] = pack2(s1[2], s1[3]);
#pragma unroll
    for (int dp = 0; dp < NO / 2; dp++) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(vs_a + swz<VCH>(key + (lane & 7) + (((lane >> 3) & 1) << 3), c0 + dp * 2 + (lane >> 4)),
                  b0, b1, b2, b3);
        mma(o[2 * dp], pa, b0, b1);
        mma(o[2 * dp + 1], pa, b2, b3);
    }
}

/* One (item, KV head), it.rows <= 16; smem holds fi_tc::SMEM_BYTES. Every
 * thread of the CTA calls it; it ends with a barrier. Returns (uniformly)
 * whether a row came out not finite. */
FI_DEV bool run_item(const fi_attn_args &a, const fi_view &v, const Item &it, unsigned char *smem) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, tq = lane & 3;
    unsigned char *qs = smem, *kvs = smem + DQ_BYTES;
    float *sb = reinterpret_cast<float *>(smem + SMEM_D - SB_BYTES); /* SPLIT: S [16][SBS] */
    const uint32_t qs_a = fi_smem_addr(qs), kvs_a = fi_smem_addr(kvs);
    const int diag0 = it.kv_len - it.qo_len + it.q0;
    const int ntiles = (it.k1 - it.k0 + BN - 1) / BN;
    const float qsc = a.q_scale;

    float m[2] = {FI_NEG_INF, FI_NEG_INF}, l[2] = {0.0f, 0.0f};
    float o[ODT][4];
#pragma unroll
    for (int d = 0; d < ODT; d++)
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
        if constexpr (SPLIT) { /* 8 keys: the even and odd k16 steps as two chains, summed */
#pragma unroll
            for (int kk = 0; kk < DQK / 16; kk += 2) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4(ks_a + swz<KCH>(kw + (lane & 7), kk * 2 + (lane >> 3)), b0, b1, b2, b3);
                mma(s[0], qa[kk], b0, b1);
                mma(s[1], qa[kk + 1], b2, b3);
            }
#pragma unroll
            for (int e = 0; e < 4; e++) s[0][e] += s[1][e];
        } else {
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
                for (int nt = 0; nt < KPW / 8; nt++)
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

        if constexpr (SPLIT) {
            /* the tile's S through shared memory: every warp the same
             * softmax over the tile's 32 keys, then P V for its columns */
#pragma unroll
            for (int h = 0; h < 2; h++)
                *reinterpret_cast<float2 *>(sb + (g + 8 * h) * SBS + kw + 2 * tq) =
                    make_float2(s[0][2 * h], s[0][2 * h + 1]);
            __syncthreads();
            float p[BN / 8][4];
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const float2 x = *reinterpret_cast<const float2 *>(sb + (g + 8 * h) * SBS + nt * 8 + 2 * tq);
                    p[nt][2 * h] = x.x;
                    p[nt][2 * h + 1] = x.y;
                }
            online_softmax(p, o, m, l, qsc);
#pragma unroll
            for (int ks = 0; ks < BN / 16; ks++)
                pv_step(o, p[2 * ks], p[2 * ks + 1], vs_a, 16 * ks, warp * (DVW / 8), lane);
        } else {
            online_softmax(s, o, m, l, qsc); /* this warp's 16 keys */
            pv_step(o, s[0], s[1], vs_a, kw, 0, lane);
        }
        __syncthreads(); /* the stage is refilled next */
    }
    fi_cp_async_wait<0>();
    __syncthreads(); /* Q and the stages become the merge buffer */

    /* the four warps' states, merged in warp order (SPLIT: one state,
     * each warp's columns of it) */
    float *red_o = reinterpret_cast<float *>(kvs);
    float *red_m = red_o + NSLOT * 16 * DVO, *red_l = red_m + NSLOT * 16;
    const int slot = SPLIT ? 0 : warp, c0 = SPLIT ? warp * DVW : 0;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = g + 8 * h;
        float L = l[h];
        L += __shfl_xor_sync(0xffffffffu, L, 1);
        L += __shfl_xor_sync(0xffffffffu, L, 2);
        if (r >= it.rows) continue; /* a padded row: never read */
        if (tq == 0 && (!SPLIT || warp == 0)) {
            red_m[slot * 16 + r] = m[h];
            red_l[slot * 16 + r] = L;
        }
#pragma unroll
        for (int d = 0; d < ODT; d++)
            *reinterpret_cast<float2 *>(red_o + (slot * 16 + r) * DVO + c0 + d * 8 + 2 * tq) =
                make_float2(o[d][2 * h], o[d][2 * h + 1]);
    }
    __syncthreads();
    const int H = a.num_qo_heads;
    bool bad = false; /* this thread wrote an element that is not finite */
    for (int idx = threadIdx.x; idx < it.rows * DVO; idx += NT) {
        const int r = idx / DVO, d = idx % DVO;
        float M = FI_NEG_INF, Lsum = 0.0f;
#pragma unroll
        for (int w = 0; w < NSLOT; w++) {
            M = fmaxf(M, red_m[w * 16 + r]);
            Lsum += red_l[w * 16 + r]; /* NaN where a slot saw a NaN or +inf logit */
        }
        float L = 0.0f, acc = 0.0f;
        if (M != FI_NEG_INF) {
#pragma unroll
            for (int w = 0; w < NSLOT; w++) {
                const float wt = fi_exp2(red_m[w * 16 + r] - M);
                L = fmaf(wt, red_l[w * 16 + r], L);
                acc = fmaf(wt, red_o[(w * 16 + r) * DVO + d], acc);
            }
        }
        acc *= L > 0.0f ? a.v_scale / L : 0.0f;
        float lse = L > 0.0f ? M + log2f(L) : FI_NEG_INF;
        if (!(Lsum < FI_POS_INF)) acc = lse = FI_NAN; /* the contract's row, and seen below */
        bad = bad || !fi_finite(acc);
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
    /* smem is reused by the next item; whether a row came out not finite
     * (computed again: recheck) */
    return __syncthreads_or(bad);
}

/* Item `it`'s rows that are not finite as written, again, exactly
 * (exact.cuh): a warp a row. After run_item's closing barrier. */
FI_DEV void recheck(const fi_attn_args &a, const fi_view &v, const Item &it) {
    for (int p = threadIdx.x >> 5; p < it.rows; p += NWARP)
        fi_exact_recheck<QT, FP8 ? FI_KVT : QT, OT, DQK, DVO, GROUP, PAGED, DEVICE_TABLE, CAUSAL, false>(
            a, it, v.kv_indices, v.mask_offset, v.alibi, p);
}

/* Any item, in slices of whole tokens of at most MAX_ROWS packed rows (the
 * decode form of persistent.cuh, which has no 128-row path, takes wide
 * items this way: correct, but each slice reads the item's keys again). */
FI_DEV bool run_sliced(const fi_attn_args &a, const fi_view &v, const Item &it, unsigned char *smem) {
    static_assert(GROUP <= MAX_ROWS, "a token's rows fit one slice");
    constexpr int PER = MAX_ROWS / GROUP; /* tokens per slice */
    const int T = it.rows / GROUP;
    /* one slice: the item as it is. The loop below would do the same, but
     * this second inlined copy of run_item is measured faster at d 64 and
     * 128; beside SPLIT's, ptxas spilled (NVRTC, causal + window) */
    if (!SPLIT && T <= PER) return run_item(a, v, it, smem);
    bool redo = false;
    for (int t0 = 0; t0 < T; t0 += PER) {
        Item s = it;
        s.q0 = it.q0 + t0;
        s.rows = (T - t0 < PER ? T - t0 : PER) * GROUP;
        if (it.prow >= 0) s.prow = it.prow + t0; /* partial rows follow the tokens */
        redo = run_item(a, v, s, smem) || redo;
    }
    return redo;
}

} /* namespace fi_dtc */
