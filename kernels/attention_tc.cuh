/*
 * attention_tc.cuh — the plan's work items with many packed query rows, on
 * tensor cores (FlashAttention-2 style): mma.sync m16n8k16 (f16/bf16 inputs,
 * f32 accumulate), ldmatrix from swizzled shared memory, a 2-stage cp.async
 * K/V pipeline gathered through the page table, online softmax in registers,
 * causal and window masks skipping whole KV tiles.
 *
 * Launched beside the CUDA-core kernel (attention.cuh) on the same grid
 * (x = workers, y = KV heads), 128 threads: this kernel takes the items with
 * at least a.tc_min_rows packed rows and the prefill tails (work.cuh
 * fi_item_on_tc), the CUDA-core kernel the others (a.tc_min_rows == 0: this
 * kernel does nothing).
 *
 * One (item, KV head): packed rows p = token * GROUP + head-in-group, as in
 * attention.cuh, in blocks of BM = 128 rows; warp w owns rows [32w, 32w+32)
 * of a block as two m16 tiles (FI_TC_MT = 1: 64-row blocks, one m16 tile
 * per warp). Keys in tiles of BN = 64:
 *
 *   S = Q K^T          (mma, A = Q by ldmatrix, B = K by ldmatrix)
 *   scale, mask, soft-cap, ALiBi on the accumulators (log2 domain)
 *   m' = max(m, rowmax S); P = 2^(S - m'); l = l 2^(m - m') + rowsum P
 *   O = O 2^(m - m') + P V   (A = P from the S registers, B = V by
 *                             ldmatrix.trans)
 *
 * Shared memory (dynamic): Q [BM][DQK], then 2 stages of K [BN][DQK] and
 * V [BN][DVO], 16-bit elements; a row's 16-byte chunk c sits at chunk
 * c ^ (row & 7), so ldmatrix's eight row addresses hit distinct banks. Then
 * two slots of [BN] {K, V} byte offsets: tile t + 2's page ids are loaded
 * while tile t computes, so the cp.async of a tile never waits on the page
 * table.
 *
 * Supported (the host checks, src/cuda/spec.c): Q and KV of one 16-bit dtype
 * (f16 or bf16), O f16/bf16/f32, DQK and DVO in {64, 128}, every mask,
 * window, soft-cap and ALiBi, paged or ragged; no fused RoPE, no FP8 KV
 * (those run on the CUDA-core kernel). K/V rows must be 16-byte aligned and
 * contiguous (a.tc_min_rows is 0 otherwise).
 *
 * Configuration (-D): FI_DQK FI_DVO FI_QT FI_OT FI_GROUP FI_PAGED FI_MASK
 * FI_WINDOW FI_SOFTCAP FI_POS FI_ATTN_TC_NAME, and FI_VARIANT FI_VHOOKS.
 *
 * Hooks (kernels/variant.cuh): soft-cap, ALiBi, window and custom mask are
 * the built-in logits/mask hooks, applied on the accumulators as a user
 * variant's are. A user's row hooks rewrite the shared-memory tiles in
 * place (16-bit, as the MMA reads them): the Q block once (one thread per
 * row, when tile 0 has landed), each K/V tile once per row block (one
 * thread per K row and one per V row: 64 keys on 128 threads, every warp
 * working), through an f32 row in local memory. use_softmax = 0: P
 * holds the weights, no max or sum. The output hook runs on write-through
 * rows, staged as f32 in the (then free) shared memory.
 */
#include "work.cuh"

#ifndef FI_DQK
#define FI_DQK 128
#define FI_DVO 128
#define FI_QT 2
#define FI_OT 2
#define FI_GROUP 4
#define FI_PAGED 1
#define FI_MASK 1
#define FI_WINDOW 0
#define FI_SOFTCAP 0
#define FI_POS 0
#define FI_ATTN_TC_NAME fi_attn_tc_default
#endif
#include "variant.cuh"
#include "exact.cuh"

namespace fi_tc {

constexpr int DQK = FI_DQK, DVO = FI_DVO;
constexpr int QT = FI_QT, OT = FI_OT;
constexpr int GROUP = FI_GROUP;
constexpr bool PAGED = FI_PAGED != 0;
constexpr bool DEVICE_TABLE = FI_PAGED == 2; /* ids clamped where used */
constexpr bool CAUSAL = FI_MASK == 1;
constexpr bool WINDOW = FI_WINDOW != 0;
constexpr bool TRANSFORM = fi_v::NATURAL; /* logits leave the log2 domain */
constexpr bool SOFTMAX = fi_v::SOFTMAX;
constexpr bool ROWS = fi_v::QUERY || fi_v::KEY || fi_v::VALUE;
static_assert(FI_POS != 1 || fi_v::USER, "built-in RoPE runs on the CUDA-core kernel");
constexpr bool BF16 = QT == FI_T_BF16;
/* rows whose result is not finite are computed again (exact.cuh) */
constexpr bool EXACT = SOFTMAX && !fi_v::USER;

#ifndef FI_TC_MT
#define FI_TC_MT 2
#endif
/* m16 tiles per warp: 2 (128-row blocks), or 1 (64-row blocks, for plans
 * whose items never have more rows: a cascade's shared level) */
constexpr int NT = 128, NWARP = 4, MT = FI_TC_MT;
constexpr int BM = NWARP * MT * 16;          /* packed rows per block */
static_assert(MT == 1 || MT == 2, "64- or 128-row blocks");
constexpr int BN = 64;                       /* keys per tile */
constexpr int NTILE = BN / 8;                /* n8 tiles of S */
constexpr int DT = DVO / 8;                  /* n8 tiles of O */
constexpr int KCH = DQK / 8, VCH = DVO / 8;  /* 16-byte chunks per row */
constexpr int Q_BYTES = BM * DQK * 2;
constexpr int K_BYTES = BN * DQK * 2, V_BYTES = BN * DVO * 2;
constexpr int STAGE_BYTES = K_BYTES + V_BYTES;
constexpr int STAGES = 2;
/* the K/V byte offsets of one tile's keys, two tiles (slots) deep */
constexpr int OFF_BYTES = 2 * BN * 16;
constexpr int SMEM_BYTES = Q_BYTES + STAGES * STAGE_BYTES + OFF_BYTES; /* = fi_cuda_attn_tc_smem() */
constexpr float LOG2E = 1.4426950408889634f;
/* output hook: f32 rows [BM][DVO] over Q and the stages */
static_assert(!fi_v::OUTPUT || BM * (DVO + 1) * 4 <= SMEM_BYTES, "output rows");
static_assert(2 * BN == NT, "row hooks: a thread per K row and one per V row");

static_assert(QT == FI_T_F16 || QT == FI_T_BF16, "16-bit Q/KV");
#if !defined(FI_TC) || FI_TC
static_assert((DQK == 64 || DQK == 128) && (DVO == 64 || DVO == 128), "head dims");
#endif /* (persistent.cuh's decode form, FI_TC = 0: decode_tc.cuh's, 256 too) */

/* Byte offset of 16-byte chunk ch of row r in a tile of NCH chunks per row. */
template <int NCH>
FI_DEV uint32_t swz(int r, int ch) {
    return (uint32_t)(r * NCH * 16 + ((ch ^ (r & 7)) << 4));
}

/* A lane's ldmatrix offset in a swizzled tile for row r (whose r & 7 the
 * lane's row keeps for every step) and chunk half hi: chunk 2 k + hi of the
 * row sits at swz_lane(r, hi) ^ (k << 5) (the XOR touches bits 5..8 only,
 * below the row's bytes), so a step costs one XOR, not the swizzle. */
template <int NCH>
FI_DEV uint32_t swz_lane(int r, int hi) {
    const int r7 = r & 7;
    return (uint32_t)(r * NCH * 16 + ((hi ^ (r7 & 1)) << 4) + ((r7 >> 1) << 5));
}

FI_DEV void ldsm_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
FI_DEV void ldsm_x4_t(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

/* c += a b, m16n8k16, f32 accumulators. */
FI_DEV void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    if constexpr (BF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

/* Two f32 as a pair of 16-bit values (bf16 where B16, else f16; the
 * operands' type by default), lo in the low half. */
template <bool B16 = BF16>
FI_DEV uint32_t pack2(float lo, float hi) {
    uint32_t r;
    if constexpr (B16) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

using Item = fi_item;

/* A user row hook on row r of a swizzled 16-bit tile of NCH chunks per row:
 * out to f32 (times scale), the hook, back in place. */
template <int NCH, class F>
FI_DEV void row_hook(unsigned char *tile, int r, float scale, F hook) {
    float x[NCH * 8];
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        const uint4 w = *reinterpret_cast<const uint4 *>(tile + swz<NCH>(r, ch));
        const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
        fi_unpack<QT, 8>(ws, x + ch * 8);
    }
#pragma unroll
    for (int d = 0; d < NCH * 8; d++) x[d] *= scale;
    hook(x);
#pragma unroll
    for (int ch = 0; ch < NCH; ch++) {
        uint4 w;
        w.x = pack2(x[ch * 8], x[ch * 8 + 1]);
        w.y = pack2(x[ch * 8 + 2], x[ch * 8 + 3]);
        w.z = pack2(x[ch * 8 + 4], x[ch * 8 + 5]);
        w.w = pack2(x[ch * 8 + 6], x[ch * 8 + 7]);
        *reinterpret_cast<uint4 *>(tile + swz<NCH>(r, ch)) = w;
    }
}

/* Q rows [rb, rb + ROWS) of the item into shared memory (zeros past rows). */
template <int ROWS = BM>
FI_DEV void load_q(const fi_attn_args &a, const Item &it, int rb, unsigned char *qs) {
    for (int i = threadIdx.x; i < ROWS * KCH; i += NT) {
        const int r = i / KCH, ch = i % KCH, p = rb + r;
        const bool ok = p < it.rows;
        const int t = p / GROUP, head = it.hkv * GROUP + p % GROUP;
        const char *src = a.q + (ok ? (it.qo_base + it.q0 + t) * a.q_tok + (int64_t)head * a.q_head : 0);
        unsigned char *dst = qs + swz<KCH>(r, ch);
        if (a.q_vec_ok) {
            fi_cp_async16(dst, src + ch * 16, ok ? 16 : 0);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)
                reinterpret_cast<uint16_t *>(dst)[e] =
                    ok ? *reinterpret_cast<const uint16_t *>(src + (int64_t)(ch * 8 + e) * a.q_dim) : 0;
        }
    }
}

/* A key's K and V byte offsets in the caches (0 past the span: load_kv
 * zero-fills those keys). One tile's 64 entries sit in shared memory,
 * filled a tile ahead, so no cp.async waits on the page table. */
struct alignas(16) KVOff {
    long long k, v;
};
/* The standalone kernel (this file's entry point) and the persistent
 * kernel's tensor-core path share the code below; where ptxas allocates the
 * two differently, each takes the form that did not spill (measured). */
#ifdef FI_ATTN_TC_NAME
enum { STANDALONE = 1 }; /* an enumerator: a constant the PTX need not hold */
#else
enum { STANDALONE = 0 };
#endif
/* Who keeps the table: for paged KV in the standalone kernel every thread
 * (key tid % BN; warps 0-1 its K offset, warps 2-3 its V offset, each
 * loading the key's page id), so no two warps carry the upkeep that the
 * CTA's barriers then wait for; otherwise threads 0-63, a key each: spread
 * there, ptxas spilled in the ragged tile loop and in the persistent
 * kernel's decode loop. */
constexpr bool SPREAD_OFFS = STANDALONE && PAGED;
static_assert(2 * BN == NT, "a thread per key and cache");

/* Key j's page id (paged KV; 0 past the span): issued a tile before use,
 * as loaded (kv_off and put_off_spread clamp it where they use it: a clamp
 * here would wait on the load at once, measured slower on paged prefill). */
FI_DEV int page_of(const fi_attn_args &a, const int32_t *kv_indices, const Item &it, int j) {
    if (!PAGED || j >= it.k1) return 0;
    const int pi = a.page_shift >= 0 ? j >> a.page_shift : j / a.page_size;
    return __ldg(kv_indices + it.kv_base + pi);
}
FI_DEV KVOff kv_off(const fi_attn_args &a, const Item &it, int j, int page) {
    KVOff r;
    if (j >= it.k1) {
        r.k = r.v = 0;
        return r;
    }
    int64_t slot;
    if constexpr (PAGED) {
        slot = a.page_shift >= 0 ? (j & (a.page_size - 1)) : j % a.page_size;
        page = fi_page_id<DEVICE_TABLE>(a, page);
    } else {
        slot = it.kv_base + j;
    }
    r.k = (int64_t)page * a.k_page + slot * a.k_slot + (int64_t)it.hkv * a.k_head;
    r.v = (int64_t)page * a.v_page + slot * a.v_slot + (int64_t)it.hkv * a.v_head;
    return r;
}
/* SPREAD_OFFS: this thread's entry of the slot for keys [j0, j0 + BN), key
 * j0 + tid % BN (page id `page`): its K offset on warps 0-1, V on 2-3. */
FI_DEV void put_off_spread(KVOff *slot, const fi_attn_args &a, const Item &it, int j0, int page) {
    const int key = threadIdx.x % BN, j = j0 + key;
    int64_t off = 0; /* past the span, as kv_off */
    if (j < it.k1) {
        const int64_t s = a.page_shift >= 0 ? (j & (a.page_size - 1)) : j % a.page_size;
        page = fi_page_id<DEVICE_TABLE>(a, page);
        off = threadIdx.x < BN
                  ? (int64_t)page * a.k_page + s * a.k_slot + (int64_t)it.hkv * a.k_head
                  : (int64_t)page * a.v_page + s * a.v_slot + (int64_t)it.hkv * a.v_head;
    }
    (threadIdx.x < BN ? slot[key].k : slot[key].v) = off;
}

/* One tile's keys into one stage (K then V) from its offset table; keys
 * from `valid` on (past the span) are zero-filled. A thread copies CPT
 * 16-byte chunks of a key's K and V rows, TPK = CH / CPT chunks apart (each
 * copy instruction of a warp still covers whole runs of a row), for keys
 * NT / TPK apart: per key one table read and one address for its copies.
 * CPT = 2 in the standalone kernel: with 1, the adds after the table reads
 * stalled its tile loop (ncu), and 2 shortens the loop without spills. The
 * persistent kernel keeps 1: with 2 its other paths spill more. */
FI_DEV void load_kv(const fi_attn_args &a, const KVOff *tab, uint32_t st, int valid) {
    const uint32_t ks = st, vs = st + K_BYTES; /* shared addresses: 32-bit arithmetic */
    constexpr int CH = KCH > VCH ? KCH : VCH, CPT = STANDALONE ? 2 : 1, TPK = CH / CPT,
                  KPI = NT / TPK;
    static_assert(CH % CPT == 0 && BN % KPI == 0, "chunks per thread");
    const int cg = threadIdx.x % TPK, key0 = threadIdx.x / TPK;
    const char *kb = a.k + cg * 16, *vb = a.v + cg * 16;
#pragma unroll
    for (int it = 0; it < BN / KPI; it++) {
        const int key = key0 + it * KPI;
        const KVOff off = tab[key];
        const int bytes = key < valid ? 16 : 0;
        if constexpr (CPT == 1) { /* the loop below with c = 0, written out:
                                     * ptxas allocates the persistent kernel
                                     * differently from the loop's form */
            if (cg < KCH) fi_cp_async16_to(ks + swz<KCH>(key, cg), kb + off.k, bytes);
            if (cg < VCH) fi_cp_async16_to(vs + swz<VCH>(key, cg), vb + off.v, bytes);
        } else {
#pragma unroll
            for (int c = 0; c < CPT; c++) {
                const int ch = cg + c * TPK;
                if (ch < KCH) fi_cp_async16_to(ks + swz<KCH>(key, ch), kb + off.k + c * TPK * 16, bytes);
                if (ch < VCH) fi_cp_async16_to(vs + swz<VCH>(key, ch), vb + off.v + c * TPK * 16, bytes);
            }
        }
    }
}

/* The row sums l of the 128-row path: in registers, or (inside the
 * persistent kernel's full form, whose 128-row path ptxas spilled exactly
 * these four floats to local memory, reloaded every tile) in shared memory,
 * [mt][h][thread]: conflict-free, and a shared load's latency, not a local
 * one's that may reach L2. d 64 x 64 does not spill them. */
constexpr bool L_SMEM = !STANDALONE && MT == 2 && DQK + DVO > 128;

/* One (item, KV head) on tensor cores, every 128-row block; smem holds
 * SMEM_BYTES (dynamic shared memory, 128-byte aligned). Every thread of the
 * CTA calls it; it ends with a barrier. */
FI_DEV bool run_item(const fi_attn_args &a, const fi_view &v, const Item &item, unsigned char *smem) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    bool redo = false; /* a row of this warp's came out not finite (recheck) */
    const int g = lane >> 2, tq = lane & 3;
    fi_variant_params VP = fi_v::params(a, v.alibi);
    unsigned char *qs = smem;
    unsigned char *kvs = smem + Q_BYTES;
    KVOff *offs = reinterpret_cast<KVOff *>(smem + Q_BYTES + STAGES * STAGE_BYTES); /* [2][BN] */
    const uint32_t qs_a = fi_smem_addr(qs), kvs_a = fi_smem_addr(kvs);
    /* ldmatrix offsets of this lane: Q (A operand), K (B), V (B, transposed) */
    const uint32_t q_off = swz_lane<KCH>(warp * (MT * 16) + (lane & 15), lane >> 4);
    const uint32_t k_off = swz_lane<KCH>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
    const uint32_t v_off = swz_lane<VCH>((lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4);
    Item it = item;
    it.mask_bit0 = fi_v::mask_bit0(VP, v.mask_offset, it.req);
    const int diag0 = it.kv_len - it.qo_len + it.q0;
    for (int rb = 0; rb < it.rows; rb += BM) {
        const int rlast = (rb + BM < it.rows ? rb + BM : it.rows) - 1;
        /* the block's visible key range, whole tiles from k0 */
        int kend = it.k1, kbeg = it.k0;
        if constexpr (CAUSAL) kend = kend < diag0 + rlast / GROUP + 1 ? kend : diag0 + rlast / GROUP + 1;
        if constexpr (WINDOW) {
            const int lo = diag0 + rb / GROUP - a.window_left;
            kbeg = kbeg > lo ? kbeg : lo;
        }
        if (kbeg > it.k0) kbeg = it.k0 + (kbeg - it.k0) / BN * BN;
        const int ntiles = kend > kbeg ? (kend - kbeg + BN - 1) / BN : 0;

        /* this thread's rows: [mt][h] = rb + warp*16MT + mt*16 + g + 8h */
        float m[MT][2], lreg[MT][2], slope[MT][2];
        __shared__ float lsm[L_SMEM ? MT * 2 * NT : 1];
        auto l = [&](int mt, int h) -> float & {
            if constexpr (L_SMEM) return lsm[(mt * 2 + h) * NT + threadIdx.x];
            else return lreg[mt][h];
        };
        float o[MT][DT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                m[mt][h] = FI_NEG_INF;
                l(mt, h) = 0.0f;
                const int p = rb + warp * (MT * 16) + mt * 16 + g + 8 * h;
                slope[mt][h] = p < it.rows ? fi_v::row_slope(VP, it.hkv * GROUP + p % GROUP) : 0.0f;
            }
#pragma unroll
            for (int d = 0; d < DT; d++)
#pragma unroll
                for (int e = 0; e < 4; e++) o[mt][d][e] = 0.0f;
        }

        load_q(a, it, rb, qs);
        /* offset tables of tiles 0 and 1 (slot t & 1 holds tile t) */
        if constexpr (SPREAD_OFFS) {
#pragma unroll
            for (int t = 0; t < 2; t++) {
                const int j0t = kbeg + t * BN;
                put_off_spread(offs + t * BN, a, it, j0t,
                               page_of(a, v.kv_indices, it, j0t + threadIdx.x % BN));
            }
        } else if (threadIdx.x < BN) {
#pragma unroll
            for (int t = 0; t < 2; t++) {
                const int j = kbeg + t * BN + threadIdx.x;
                offs[t * BN + threadIdx.x] = kv_off(a, it, j, page_of(a, v.kv_indices, it, j));
            }
        }
        __syncthreads();
        if (ntiles > 0) load_kv(a, offs, kvs_a, it.k1 - kbeg);
        fi_cp_async_commit();
        for (int t = 0; t < ntiles; t++) {
            const int j0 = kbeg + t * BN;
            if (t + 1 < ntiles)
                load_kv(a, offs + ((t + 1) & 1) * BN, kvs_a + ((t + 1) % STAGES) * STAGE_BYTES,
                        it.k1 - j0 - BN);
            fi_cp_async_commit();
            /* tile t + 2's page id, in flight while tile t computes;
             * its offsets go to slot t & 1 (tile t's, read above in
             * iteration t - 1) at the end of the tile */
            const int pn = SPREAD_OFFS
                               ? (t + 2 < ntiles
                                      ? page_of(a, v.kv_indices, it, j0 + 2 * BN + threadIdx.x % BN) : 0)
                               : t + 2 < ntiles && threadIdx.x < BN
                               ? page_of(a, v.kv_indices, it, j0 + 2 * BN + threadIdx.x) : 0;
            fi_cp_async_wait<1>();
            __syncthreads();
            if constexpr (ROWS) { /* a user's row hooks, on the landed tiles */
                const int tid = threadIdx.x;
                if (fi_v::QUERY && t == 0 && tid < BM && rb + tid < it.rows) {
                    const int p = rb + tid;
                    const fi_hook_ctx hc = fi_v::ctx(it.req, it.hkv * GROUP + p % GROUP, it.hkv,
                                                     diag0 + p / GROUP, -1, it.qo_len, it.kv_len,
                                                     DQK, a.sm_scale);
                    row_hook<KCH>(qs, tid, 1.0f, [&](float *x) { fi_v::query(x, hc, VP); });
                }
                unsigned char *kst = kvs + (t % STAGES) * STAGE_BYTES;
                /* key row tid / 2 on even threads, its V row on the
                 * odd one: the tile's rows over every warp */
                const int key = tid >> 1, role = tid & 1;
                if ((fi_v::KEY || fi_v::VALUE) && j0 + key < it.k1) {
                    fi_hook_ctx hc = fi_v::ctx(it.req, it.hkv * GROUP, it.hkv, -1, j0 + key,
                                               it.qo_len, it.kv_len, DQK, a.sm_scale);
                    if constexpr (fi_v::KEY) {
                        if (role == 0)
                            row_hook<KCH>(kst, key, a.k_scale, [&](float *x) { fi_v::key(x, hc, VP); });
                    }
                    hc.head_dim = DVO;
                    if constexpr (fi_v::VALUE) {
                        if (role == (fi_v::KEY ? 1 : 0))
                            row_hook<VCH>(kst + K_BYTES, key, a.v_scale,
                                          [&](float *x) { fi_v::value(x, hc, VP); });
                    }
                }
                __syncthreads();
            }
            const uint32_t ks_a = kvs_a + (t % STAGES) * STAGE_BYTES;
            const uint32_t vs_a = ks_a + K_BYTES;

            /* S = Q K^T */
            float s[MT][NTILE][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[mt][nt][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < DQK / 16; kk++) {
                uint32_t qa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    ldsm_x4(qs_a + (q_off ^ (kk << 5)) + mt * 16 * KCH * 16,
                            qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3]);
#pragma unroll
                for (int np = 0; np < NTILE / 2; np++) {
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4(ks_a + (k_off ^ (kk << 5)) + np * 16 * KCH * 16, b0, b1, b2, b3);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma(s[mt][2 * np], qa[mt], b0, b1);
                        mma(s[mt][2 * np + 1], qa[mt], b2, b3);
                    }
                }
            }

            /* logits: transforms, masks (a tile every row of the
             * block sees whole skips all of it without a transform).
             * Rows past the item need no mask: their Q is zero, rows do
             * not mix, and nothing reads them; only a user's hooks must
             * not see them (a block of 68 rows, as chunks beside decodes
             * have, masked every tile element by element before) */
            bool whole = j0 + BN <= it.k1 && (rb + BM <= it.rows || !fi_v::USER) && !fi_v::ELEM_MASK;
            if constexpr (CAUSAL) whole = whole && j0 + BN - 1 <= diag0 + rb / GROUP;
            if constexpr (WINDOW) whole = whole && j0 >= diag0 + rlast / GROUP - a.window_left;
            if (TRANSFORM || !whole)
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int p = rb + warp * (MT * 16) + mt * 16 + g + 8 * h;
                    const int diag = diag0 + p / GROUP;
#pragma unroll
                    for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            /* without a transform the scale goes into the exp2's
                             * FFMA below (q_scale > 0: the host refuses sm_scale < 0) */
                            float x = s[mt][nt][2 * h + e];
                            const int j = j0 + nt * 8 + 2 * tq + e;
                            const fi_hook_ctx hc = fi_v::ctx(it.req, it.hkv * GROUP + p % GROUP, it.hkv,
                                                             diag, j, it.qo_len, it.kv_len, DQK,
                                                             a.sm_scale, slope[mt][h]);
                            if constexpr (TRANSFORM) x *= a.q_scale;
                            if constexpr (fi_v::LOGITS && !fi_v::USER) x = fi_v::logits(x, hc, VP);
                            if constexpr (TRANSFORM && SOFTMAX && !fi_v::USER) x *= LOG2E;
                            if (!whole || fi_v::USER) {
                                bool vis = true;
                                if (!whole) {
                                    vis = j < it.k1 && p < it.rows;
                                    if constexpr (CAUSAL) vis = vis && j <= diag;
                                    if constexpr (fi_v::ANY_MASK)
                                        vis = vis && fi_v::visible(hc, VP, a, it.mask_bit0);
                                }
                                /* a user's hook only where the key and row exist */
                                if constexpr (fi_v::LOGITS && fi_v::USER) x = vis ? fi_v::logits(x, hc, VP) : x;
                                if constexpr (TRANSFORM && SOFTMAX && fi_v::USER) x *= LOG2E;
                                if (!vis) x = SOFTMAX ? FI_NEG_INF : 0.0f;
                            }
                            s[mt][nt][2 * h + e] = x;
                        }
                }

            /* online softmax, a row's four lanes together; m is in
             * the log2 domain, s raw (times qs) */
            const float qs = TRANSFORM ? 1.0f : a.q_scale;
#ifdef FI_ATTN_TC_NAME
            /* The standalone kernel (a shorter tile loop, no spills): the
             * thread's 2 MT rows side by side, each step over all of
             * them: the maxes as trees, then the shuffles, the exponentials
             * and the sums, so the rows' latency chains overlap; one vote
             * for all rows decides the rescale of O */
            if constexpr (SOFTMAX) {
                float mx[MT][2];
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        float r[NTILE];
#pragma unroll
                        for (int nt = 0; nt < NTILE; nt++) r[nt] = fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]);
#pragma unroll
                        for (int half = NTILE / 2; half > 0; half /= 2)
#pragma unroll
                            for (int i = 0; i < half; i++) r[i] = fmaxf(r[i], r[i + half]);
                        mx[mt][h] = r[0];
                    }
#pragma unroll
                for (int lanes = 1; lanes <= 2; lanes *= 2)
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int h = 0; h < 2; h++)
                            mx[mt][h] = fmaxf(mx[mt][h], __shfl_xor_sync(0xffffffffu, mx[mt][h], lanes));
                bool moved = false;
                float mref[MT][2], scale[MT][2];
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const float mold = m[mt][h], mnew = fmaxf(mold, mx[mt][h] * qs);
                        mref[mt][h] = mnew == FI_NEG_INF ? 0.0f : mnew;
                        scale[mt][h] = fi_exp2(mold - mref[mt][h]);
                        moved = moved || mold != mnew;
                        m[mt][h] = mnew;
                        l(mt, h) *= scale[mt][h];
                    }
                /* rescale O only where some row's max moved (after the
                 * first tiles it rarely does; an unmoved row's scale is 1) */
                if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int d = 0; d < DT; d++)
#pragma unroll
                            for (int e = 0; e < 4; e++) o[mt][d][e] *= scale[mt][e >> 1];
                }
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        float sum[2] = {0.0f, 0.0f}; /* two chains: even and odd keys */
#pragma unroll
                        for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
                            for (int e = 0; e < 2; e++) {
                                const float pr = fi_exp2(fmaf(s[mt][nt][2 * h + e], qs, -mref[mt][h]));
                                s[mt][nt][2 * h + e] = pr;
                                sum[e] += pr;
                            }
                        l(mt, h) += sum[0] + sum[1];
                    }
            }
#else /* the persistent kernel, which spills with the form above: row by
       * row, one vote per row pair */
#pragma unroll
            for (int mt = 0; mt < MT && SOFTMAX; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float mx = FI_NEG_INF;
#pragma unroll
                    for (int nt = 0; nt < NTILE; nt++)
                        mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const float mold = m[mt][h];
                    mx = fmaxf(mold, mx * qs);
                    const float mref = mx == FI_NEG_INF ? 0.0f : mx;
                    const float scale = fi_exp2(mold - mref);
                    m[mt][h] = mx;
                    float sum = 0.0f;
#pragma unroll
                    for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const float pr = fi_exp2(fmaf(s[mt][nt][2 * h + e], qs, -mref));
                            s[mt][nt][2 * h + e] = pr;
                            sum += pr;
                        }
                    l(mt, h) = fmaf(l(mt, h), scale, sum);
                    /* rescale O only where some row's max moved (after
                     * the first tiles it rarely does) */
                    if (__any_sync(0xffffffffu, mold != mx)) {
#pragma unroll
                        for (int d = 0; d < DT; d++) {
                            o[mt][d][2 * h] *= scale;
                            o[mt][d][2 * h + 1] *= scale;
                        }
                    }
                }

#endif

            /* O += P V */
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                uint32_t pa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    pa[mt][0] = pack2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                    pa[mt][1] = pack2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                    pa[mt][2] = pack2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                    pa[mt][3] = pack2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
                }
#pragma unroll
                for (int dp = 0; dp < DT / 2; dp++) {
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4_t(vs_a + (v_off ^ (dp << 5)) + kk * 16 * VCH * 16, b0, b1, b2, b3);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma(o[mt][2 * dp], pa[mt], b0, b1);
                        mma(o[mt][2 * dp + 1], pa[mt], b2, b3);
                    }
                }
            }
            if constexpr (SPREAD_OFFS) {
                if (t + 2 < ntiles) put_off_spread(offs + (t & 1) * BN, a, it, j0 + 2 * BN, pn);
            } else if (t + 2 < ntiles && threadIdx.x < BN) {
                offs[(t & 1) * BN + threadIdx.x] = kv_off(a, it, j0 + 2 * BN + threadIdx.x, pn);
            }
            __syncthreads(); /* the stage is refilled next */
        }
        fi_cp_async_wait<0>();

        /* O / l and LSE (log2 domain), or the item's partial rows;
         * use_softmax = 0: O as summed, LSE 0. With an output hook,
         * write-through rows go through shared memory (f32). */
        const int H = a.num_qo_heads;
        const bool hook = fi_v::OUTPUT && it.prow < 0; /* uniform */
        float *orow = reinterpret_cast<float *>(smem), *olse = orow + BM * DVO;
        if (hook) __syncthreads(); /* Q and the stages are free */
        /* 16-bit rows, contiguous and 16-byte aligned: a thread's two
         * adjacent elements in one 4-byte store (uniform). Not in a user
         * variant's kernel: there (block_mask) ptxas spilled in the tile
         * loop with it. */
        const bool opairs = !fi_v::USER && OT != FI_T_F32 && a.o_vec_ok;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float L = l(mt, h);
                L += __shfl_xor_sync(0xffffffffu, L, 1);
                L += __shfl_xor_sync(0xffffffffu, L, 2);
                const int p = rb + warp * (MT * 16) + mt * 16 + g + 8 * h;
                const float inv = !SOFTMAX ? a.v_scale : L > 0.0f ? a.v_scale / L : 0.0f;
                const float lse = !SOFTMAX ? 0.0f : L > 0.0f ? m[mt][h] + log2f(L) : L == 0.0f ? FI_NEG_INF : FI_NAN;
                if constexpr (EXACT) {
                    bool bad = !(L < FI_POS_INF); /* NaN: a NaN or +inf logit */
#pragma unroll
                    for (int d = 0; d < DT; d++)
                        bad = bad || !fi_finite(o[mt][d][2 * h] * inv) || !fi_finite(o[mt][d][2 * h + 1] * inv);
                    redo = __any_sync(0xffffffffu, bad && p < it.rows) || redo;
                }
                if (p >= it.rows) continue;
                const int t = it.q0 + p / GROUP, head = it.hkv * GROUP + p % GROUP;
                if (hook) {
                    const int rl = p - rb;
#pragma unroll
                    for (int d = 0; d < DT; d++)
#pragma unroll
                        for (int e = 0; e < 2; e++)
                            orow[rl * DVO + d * 8 + 2 * tq + e] = o[mt][d][2 * h + e] * inv;
                    if (tq == 0) olse[rl] = lse;
                } else if (it.prow >= 0) {
                    const int64_t row = (int64_t)(it.prow + t - it.q0) * H + head;
                    float *po = a.partial_o + row * DVO;
#pragma unroll
                    for (int d = 0; d < DT; d++) {
                        float2 v2 = make_float2(o[mt][d][2 * h] * inv, o[mt][d][2 * h + 1] * inv);
                        *reinterpret_cast<float2 *>(po + d * 8 + 2 * tq) = v2;
                    }
                    if (tq == 0) a.partial_lse[row] = lse;
                } else if (opairs) {
                    const int64_t tok = it.qo_base + t;
                    char *ob = a.o + tok * a.o_tok + (int64_t)head * a.o_head + 4 * tq;
#pragma unroll
                    for (int d = 0; d < DT; d++)
                        *reinterpret_cast<uint32_t *>(ob + d * 16) =
                            pack2<OT == FI_T_BF16>(o[mt][d][2 * h] * inv, o[mt][d][2 * h + 1] * inv);
                    if (tq == 0 && a.lse) a.lse[tok * a.lse_tok + (int64_t)head * a.lse_head] = lse;
                } else {
                    const int64_t tok = it.qo_base + t;
                    char *ob = a.o + tok * a.o_tok + (int64_t)head * a.o_head;
#pragma unroll
                    for (int d = 0; d < DT; d++)
#pragma unroll
                        for (int e = 0; e < 2; e++)
                            fi_store_elem<OT>(ob + (int64_t)(d * 8 + 2 * tq + e) * a.o_dim,
                                              o[mt][d][2 * h + e] * inv);
                    if (tq == 0 && a.lse) a.lse[tok * a.lse_tok + (int64_t)head * a.lse_head] = lse;
                }
            }
        if (hook) {
            __syncthreads();
            const int p = rb + threadIdx.x;
            if (threadIdx.x < BM && p < it.rows)
                fi_v::output(orow + threadIdx.x * DVO, olse[threadIdx.x],
                             fi_v::ctx(it.req, it.hkv * GROUP + p % GROUP, it.hkv, diag0 + p / GROUP,
                                       -1, it.qo_len, it.kv_len, DVO, a.sm_scale),
                             VP);
            __syncthreads();
            for (int i = threadIdx.x; i < BM * DVO; i += NT) {
                const int rl = i / DVO, d = i % DVO, pp = rb + rl;
                if (pp >= it.rows) continue;
                const int64_t tok = it.qo_base + it.q0 + pp / GROUP;
                const int head = it.hkv * GROUP + pp % GROUP;
                fi_store_elem<OT>(a.o + tok * a.o_tok + (int64_t)head * a.o_head + (int64_t)d * a.o_dim,
                                  orow[i]);
                if (d == 0 && a.lse) a.lse[tok * a.lse_tok + (int64_t)head * a.lse_head] = olse[rl];
            }
        }
        __syncthreads(); /* Q and the stages are reused by the next block */
    }
    return redo;
}

/* Item `it`'s rows of this warp (as run_item wrote them) that are not
 * finite, again, exactly (exact.cuh). */
FI_DEV void recheck(const fi_attn_args &a, const fi_view &v, const Item &it) {
    const int warp = threadIdx.x >> 5;
    for (int rb = 0; rb < it.rows; rb += BM)
        for (int i = 0; i < MT * 16; i++) {
            const int p = rb + warp * (MT * 16) + i;
            if (p < it.rows)
                fi_exact_recheck<QT, QT, OT, DQK, DVO, GROUP, PAGED, DEVICE_TABLE, CAUSAL, false>(
                    a, it, v.kv_indices, v.mask_offset, v.alibi, p);
        }
}

} /* namespace fi_tc */

/* The entry point; persistent.cuh includes this file for its device
 * functions and leaves FI_ATTN_TC_NAME undefined. */
#ifdef FI_ATTN_TC_NAME
extern "C" __global__ void __launch_bounds__(fi_tc::NT, 2)
FI_ATTN_TC_NAME(const fi_attn_args a) {
    using namespace fi_tc;
    extern __shared__ __align__(128) unsigned char smem[];
    fi_pdl_launch_dependents();
    fi_pdl_wait();
    fi_mark_upload_read(a);
    if (a.tc_min_rows <= 0) return;
    {
        uint32_t dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < (uint32_t)SMEM_BYTES) __trap(); /* the host launched it wrong */
    }
    const fi_view v = fi_view_of(a);
    const fi_item_rec *items = fi_items(a, gridDim.x);
    int ib, ie;
    fi_worker_range(a, gridDim.x, blockIdx.x, ib, ie);
    bool redo = false;
    for (int hkv = blockIdx.y; hkv < a.num_kv_heads; hkv += gridDim.y)
        for (int n = ib; n < ie; n++) {
            if (!fi_item_on_tc(a, items, n, GROUP)) continue; /* the CUDA-core kernel's */
            redo = run_item(a, v, fi_item_load(items, n, hkv, GROUP), smem) || redo;
        }
    /* this warp's rows that came out not finite, again, after the item
     * loops (exact.cuh) */
    if (EXACT && redo)
        for (int hkv = blockIdx.y; hkv < a.num_kv_heads; hkv += gridDim.y)
            for (int n = ib; n < ie; n++)
                if (fi_item_on_tc(a, items, n, GROUP)) recheck(a, v, fi_item_load(items, n, hkv, GROUP));
}
#endif
