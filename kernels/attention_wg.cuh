/*
 * attention_wg.cuh — the plan's work items with many packed query rows on
 * Hopper (sm_90a): warpgroup MMA (wgmma) from swizzled shared memory, warp
 * specialised. It takes the place of attention_tc.cuh on sm_90a (same
 * items, same grid: x = workers, y = KV heads; same outputs), 384 threads:
 *
 *   warpgroup 0 (producer, few registers): per KV tile, the keys' K/V byte
 *     offsets through the page table into shared memory, then cp.async of
 *     the K and V rows (16 bytes each, a warp covering whole rows, every
 *     thread the same chunk of rows a fixed stride apart) into a stage,
 *     completing on the stage's "full" mbarrier;
 *   warpgroups 1, 2 (consumers, the registers the producer gave up): 64
 *     packed rows each of a 128-row block. Per tile: wait "full",
 *       S = Q K^T        wgmma m64 n BN k16, Q and K from shared memory
 *       masks, logit hooks, online softmax on the accumulators (log2)
 *       O += P V         wgmma, P from registers, V from shared memory
 *     then each warp arrives on the stage's "empty" mbarrier.
 *
 * Packed rows p = token * GROUP + head-in-group (the group folded into the
 * query tile), as in attention.cuh. Tiles of BN keys (128; 64 where a head
 * dim is 256) from the block's first visible key; a consumer whose rows see
 * none of a tile (causal, window) skips its GEMMs but still frees the stage.
 *
 * Shared memory (dynamic, the base rounded up to 1024 bytes for the
 * swizzle): Q [BM rows], then STAGES x (K [BN rows], V [BN rows]); each tile
 * in panels of 64 columns (128-byte rows, 16-byte chunk c of row r at chunk
 * c ^ (r & 7): the 128-byte swizzle wgmma reads), then the stages' offset
 * tables [STAGES][BN] and the mbarriers.
 *
 * Supported (src/cuda/select.c decides): Q and KV of one 16-bit dtype, O
 * f16/bf16/f32, head dims DQK, DVO in {64, 128, 256} (DQK = 192 with DVO =
 * 128 too), any group, paged (any page size) or ragged, causal, window,
 * custom mask, soft-cap, ALiBi, a user variant's logits and mask hooks and
 * use_softmax = 0; not: row hooks (query/key/value), output hooks, built-in
 * RoPE, FP8 K/V (attention_tc.cuh or the CUDA-core kernel take those).
 * K/V rows 16-byte aligned and contiguous (a.tc_min_rows is 0 otherwise).
 *
 * Configuration (-D): those of attention_tc.cuh, and FI_ATTN_WG_NAME.
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
#define FI_ATTN_WG_NAME fi_attn_wg_default
#endif
#include "variant.cuh"
#include "exact.cuh"
#include "wgmma.cuh"

namespace fi_wg {

constexpr int DQK = FI_DQK, DVO = FI_DVO;
constexpr int QT = FI_QT, OT = FI_OT;
constexpr int GROUP = FI_GROUP;
constexpr bool PAGED = FI_PAGED != 0;
constexpr bool DEVICE_TABLE = FI_PAGED == 2;
constexpr bool CAUSAL = FI_MASK == 1;
constexpr bool WINDOW = FI_WINDOW != 0;
constexpr bool TRANSFORM = fi_v::NATURAL;
constexpr bool SOFTMAX = fi_v::SOFTMAX;
constexpr bool BF16 = QT == FI_T_BF16;
/* rows whose result is not finite are computed again (exact.cuh) */
constexpr bool EXACT = SOFTMAX && !fi_v::USER;
static_assert(QT == FI_T_F16 || QT == FI_T_BF16, "16-bit Q/KV");
static_assert(!fi_v::QUERY && !fi_v::KEY && !fi_v::VALUE && !fi_v::OUTPUT,
              "row and output hooks run on attention_tc.cuh");
static_assert(FI_POS != 1 || fi_v::USER, "built-in RoPE runs on the CUDA-core kernel");
static_assert(DQK % 64 == 0 && DVO % 64 == 0 && DQK <= 256 && DVO <= 256, "head dims");

constexpr int NT = 384;      /* producer + two consumer warpgroups */
constexpr int BM = 128;      /* packed rows per block, 64 per consumer */
constexpr int BN = DQK > 192 || DVO > 128 ? 64 : 128; /* keys per tile */
constexpr int STAGES = 2;
constexpr int KCH = DQK / 8, VCH = DVO / 8; /* 16-byte chunks per row */
constexpr int Q_BYTES = BM * DQK * 2;
constexpr int K_BYTES = BN * DQK * 2, V_BYTES = BN * DVO * 2;
constexpr int STAGE_BYTES = K_BYTES + V_BYTES;
constexpr int OFF_BYTES = STAGES * BN * 16;
constexpr int BAR_BYTES = 2 * STAGES * 8;
/* = select.c's attn_wg_smem(): 1024 bytes of room to align the base */
constexpr int SMEM_BYTES = 1024 + Q_BYTES + STAGES * STAGE_BYTES + OFF_BYTES + BAR_BYTES;
static_assert(SMEM_BYTES <= 227 * 1024, "shared memory");
/* registers after the hand-over: setmaxnreg moves them within the CTA's
 * allocation at launch (384 x 168): 128 x 56 + 256 x 224 must not exceed it */
constexpr int PRODUCER_REGS = 56, CONSUMER_REGS = 224;
static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= NT * 168, "register hand-over");
constexpr float LOG2E = 1.4426950408889634f;

/* Byte offset of 16-byte chunk ch of row r in a tile of R rows. */
template <int R>
FI_DEV uint32_t tile_off(int r, int ch) {
    return (uint32_t)((ch >> 3) * R * 128 + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
}

FI_DEV void bar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
FI_DEV void bar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred done;\nwait_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra wait_%=;\n}" ::"r"(bar), "r"(parity) : "memory");
}
FI_DEV void bar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* arrives once this thread's earlier cp.async have landed */
FI_DEV void bar_arrive_copies(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
/* generic-proxy writes (cp.async, stores) ordered before wgmma's reads */
FI_DEV void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
FI_DEV void named_sync(int id) { asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory"); }
/* The last barrier (id 4) of all NT threads: whether any of them passed
 * pred (barrier.red.or); the CTA's writes before it are visible after. */
FI_DEV bool all_done_or(bool pred) {
    uint32_t r;
    asm volatile("{ .reg .pred p, q; setp.ne.u32 p, %1, 0; barrier.red.or.pred q, 4, %2, p; selp.u32 %0, 1, 0, q; }"
                 : "=r"(r) : "r"((uint32_t)pred), "n"(NT) : "memory");
    return r != 0;
}

template <bool B16 = BF16>
FI_DEV uint32_t pack2(float lo, float hi) {
    uint32_t r;
    if constexpr (B16) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

using Item = fi_item;

struct alignas(16) KVOff {
    long long k, v;
};

/* The keys a 128-row block sees: whole tiles from k0 (its first tile
 * aligned to BN past k0), ntiles of them. */
struct Span {
    int kbeg, ntiles, diag0;
};
FI_DEV Span block_span(const fi_attn_args &a, const Item &it, int rb) {
    Span s;
    const int rlast = (rb + BM < it.rows ? rb + BM : it.rows) - 1;
    s.diag0 = it.kv_len - it.qo_len + it.q0;
    int kend = it.k1, kbeg = it.k0;
    if constexpr (CAUSAL) kend = min(kend, s.diag0 + rlast / GROUP + 1);
    if constexpr (WINDOW) kbeg = max(kbeg, s.diag0 + rb / GROUP - a.window_left);
    if (kbeg > it.k0) kbeg = it.k0 + (kbeg - it.k0) / BN * BN;
    s.kbeg = kbeg;
    s.ntiles = kend > kbeg ? (kend - kbeg + BN - 1) / BN : 0;
    return s;
}

/* Every (KV head, item, 128-row block) of this CTA, in the same order for
 * the producer and the consumers (their stage counters agree). */
template <class F>
FI_DEV void for_each_block(const fi_attn_args &a, F f) {
    const fi_item_rec *items = fi_items(a, gridDim.x);
    int ib, ie;
    fi_worker_range(a, gridDim.x, blockIdx.x, ib, ie);
    for (int hkv = blockIdx.y; hkv < a.num_kv_heads; hkv += gridDim.y)
        for (int n = ib; n < ie; n++) {
            if (!fi_item_on_tc(a, items, n, GROUP)) continue; /* the CUDA-core kernel's */
            const Item it = fi_item_load(items, n, hkv, GROUP);
            for (int rb = 0; rb < it.rows; rb += BM) f(it, rb);
        }
}

/* Key j's K and V byte offsets (0 past the span: its rows are zero-filled). */
FI_DEV KVOff kv_off(const fi_attn_args &a, const fi_view &v, const Item &it, int j) {
    KVOff r;
    r.k = r.v = 0;
    if (j >= it.k1) return r;
    int64_t page = 0, slot;
    if constexpr (PAGED) {
        const int pi = a.page_shift >= 0 ? j >> a.page_shift : j / a.page_size;
        page = fi_page_id<DEVICE_TABLE>(a, __ldg(v.kv_indices + it.kv_base + pi));
        slot = a.page_shift >= 0 ? (j & (a.page_size - 1)) : j % a.page_size;
    } else {
        slot = it.kv_base + j;
    }
    r.k = page * a.k_page + slot * a.k_slot + (int64_t)it.hkv * a.k_head;
    r.v = page * a.v_page + slot * a.v_slot + (int64_t)it.hkv * a.v_head;
    return r;
}

/* The K (or V) rows of a tile into the stage's tile at shared address dst
 * (1024-aligned), from byte offsets tab[r] (rows >= valid zero-filled):
 * thread t copies chunk t % CH of rows t / CH + k (128 / CH), so a warp
 * covers whole rows, and its shared and table addresses are fixed per
 * thread up to a constant per k (the swizzle's row bits of r and of
 * t / CH differ by the constant (k 128 / CH) & 7). */
template <int CH, bool V>
FI_DEV void copy_tile(uint32_t dst, const char *src, const KVOff *tab, int valid, int t) {
    if constexpr (128 % CH == 0) {
        constexpr int RPI = 128 / CH; /* rows per pass */
        static_assert(RPI % 4 == 0, "r0 + k RPI and r0 differ in row bits by (k RPI) & 7 alone");
        const int ch = t % CH, r0 = t / CH;
        const uint32_t base = dst + tile_off<BN>(r0, ch);
        src += ch * 16;
#pragma unroll
        for (int k = 0; k < BN / RPI; k++) {
            const int r = r0 + k * RPI;
            const uint32_t d = (base + (uint32_t)(k * RPI * 128)) ^ (uint32_t)(((k * RPI) & 7) << 4);
            fi_cp_async16_to(d, src + (V ? tab[r].v : tab[r].k), r < valid ? 16 : 0);
        }
    } else {
#pragma unroll 4
        for (int i = t; i < BN * CH; i += 128) {
            const int r = i / CH, ch = i % CH;
            fi_cp_async16_to(dst + tile_off<BN>(r, ch), src + (V ? tab[r].v : tab[r].k) + ch * 16,
                             r < valid ? 16 : 0);
        }
    }
}

/* The producer warpgroup (t = its thread, 0..127): every tile of every
 * block into the stages, in order. */
FI_DEV void produce(const fi_attn_args &a, const fi_view &v, unsigned char *sm, uint32_t sm_a) {
    const int t = threadIdx.x;
    const uint32_t kv_a = sm_a + Q_BYTES, bars = sm_a + Q_BYTES + STAGES * STAGE_BYTES + OFF_BYTES;
    KVOff *offs = reinterpret_cast<KVOff *>(sm + Q_BYTES + STAGES * STAGE_BYTES);
    int n = 0;
    for_each_block(a, [&](const Item &it, int rb) {
        const Span sp = block_span(a, it, rb);
        for (int ti = 0; ti < sp.ntiles; ti++, n++) {
            const int j0 = sp.kbeg + ti * BN, st = n % STAGES;
            KVOff off;
            if (t < BN) off = kv_off(a, v, it, j0 + t); /* the page id in flight while we wait */
            bar_wait(bars + (STAGES + st) * 8, ((n / STAGES) & 1) ^ 1); /* the stage is free */
            if (t < BN) offs[st * BN + t] = off;
            named_sync(1);
            const uint32_t ks = kv_a + st * STAGE_BYTES, vs = ks + K_BYTES;
            const KVOff *tab = offs + st * BN;
            const int valid = it.k1 - j0;
            copy_tile<KCH, false>(ks, a.k, tab, valid, t);
            copy_tile<VCH, true>(vs, a.v, tab, valid, t);
            bar_arrive_copies(bars + st * 8);
        }
    });
    /* the consumers' rows that came out not finite, again, exactly
     * (exact.cuh), by this warpgroup once they are done: in the consumers
     * (after their loop, inlined or called) the path moved their per-tile
     * stage and descriptor arithmetic out of the uniform registers */
    if (EXACT && all_done_or(false))
        for_each_block(a, [&](const Item &it, int rb) {
            const int last = rb + BM < it.rows ? rb + BM : it.rows;
            for (int p = rb + (t >> 5); p < last; p += 4)
                fi_exact_recheck<QT, QT, OT, DQK, DVO, GROUP, PAGED, DEVICE_TABLE, CAUSAL, false>(
                    a, it, v.kv_indices, v.mask_offset, v.alibi, p);
        });
}

/* Q rows [r0, r0 + 64) of the item (zeros past its rows) into rows
 * [r0 - rb, +64) of the block's Q tile; t: the consumer's thread. */
FI_DEV void load_q(const fi_attn_args &a, const Item &it, int r0, int trow, uint32_t qs, int t) {
    for (int i = t; i < 64 * KCH; i += 128) {
        const int r = i / KCH, ch = i % KCH, p = r0 + r;
        const bool ok = p < it.rows;
        const int tok = p / GROUP, head = it.hkv * GROUP + p % GROUP;
        const char *src = a.q + (ok ? (it.qo_base + it.q0 + tok) * a.q_tok + (int64_t)head * a.q_head : 0);
        const uint32_t dst = qs + tile_off<BM>(trow + r, ch);
        if (a.q_vec_ok) {
            fi_cp_async16_to(dst, src + ch * 16, ok ? 16 : 0);
        } else {
            uint32_t w[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const uint32_t lo = ok ? *reinterpret_cast<const uint16_t *>(src + (int64_t)(ch * 8 + 2 * e) * a.q_dim) : 0;
                const uint32_t hi = ok ? *reinterpret_cast<const uint16_t *>(src + (int64_t)(ch * 8 + 2 * e + 1) * a.q_dim) : 0;
                w[e] = lo | hi << 16;
            }
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(w[0]), "r"(w[1]),
                         "r"(w[2]), "r"(w[3]) : "memory");
        }
    }
}

/* A consumer warpgroup (c = 0 or 1; t = its thread, 0..127): rows
 * [64 c, 64 c + 64) of every block. */
FI_DEV void consume(const fi_attn_args &a, const fi_view &v, uint32_t sm_a, int c) {
    const int t = threadIdx.x - 128 * (c + 1);
    const int lane = t & 31, warp = t >> 5, g = lane >> 2, tq = lane & 3;
    const uint32_t qs = sm_a, kv_a = sm_a + Q_BYTES;
    const uint32_t bars = sm_a + Q_BYTES + STAGES * STAGE_BYTES + OFF_BYTES;
    fi_variant_params VP = fi_v::params(a, v.alibi);
    constexpr int NTILE = BN / 8, DT = DVO / 8;
    int n = 0;
    bool redo = false; /* a row of this warp's came out not finite */
    for_each_block(a, [&](const Item &item, int rb) {
        Item it = item;
        it.mask_bit0 = fi_v::mask_bit0(VP, v.mask_offset, it.req);
        const Span sp = block_span(a, it, rb);
        const int r0 = rb + 64 * c;                          /* this warpgroup's first row */
        const int nrows = min(max(it.rows - r0, 0), 64);     /* and how many it has */
        const int diag0 = sp.diag0;

        named_sync(2 + c); /* the previous block's GEMMs of this warpgroup are done with Q */
        load_q(a, it, r0, 64 * c, qs, t);
        fi_cp_async_commit();
        fi_cp_async_wait<0>();
        fence_async_smem();
        named_sync(2 + c);

        float m[2], l[2], slope[2];
        float o[DVO / 2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            m[h] = FI_NEG_INF;
            l[h] = 0.0f;
            const int p = r0 + warp * 16 + g + 8 * h;
            slope[h] = p < it.rows ? fi_v::row_slope(VP, it.hkv * GROUP + p % GROUP) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < DVO / 2; i++) o[i] = 0.0f;
        /* descriptors: Q rows of this warpgroup; K and V of stage 0 */
        const uint64_t dq = fi_wg_desc(qs + 64 * c * 128, 16, 1024);
        const uint64_t dk = fi_wg_desc(kv_a, 16, 1024);
        const uint64_t dv = fi_wg_desc(kv_a + K_BYTES, BN * 128, 1024);

        for (int ti = 0; ti < sp.ntiles; ti++, n++) {
            const int j0 = sp.kbeg + ti * BN, st = n % STAGES;
            bool skip = nrows <= 0;
            if constexpr (CAUSAL) skip = skip || j0 > diag0 + (r0 + nrows - 1) / GROUP;
            if constexpr (WINDOW) skip = skip || j0 + BN - 1 < diag0 + r0 / GROUP - a.window_left;
            bar_wait(bars + st * 8, (n / STAGES) & 1);
            if (!skip) {
                fence_async_smem();
                const uint32_t so = (uint32_t)(st * STAGE_BYTES) >> 4; /* descriptor units */
                float s[BN / 2];
                fi_wg_fence();
#pragma unroll
                for (int kk = 0; kk < DQK / 16; kk++) {
                    const uint32_t qo = ((kk >> 2) * BM * 128 + (kk & 3) * 32) >> 4;
                    const uint32_t ko = ((kk >> 2) * BN * 128 + (kk & 3) * 32) >> 4;
                    fi_wg_ss<BN>(s, dq + qo, dk + so + ko, kk > 0);
                }
                fi_wg_commit();
                fi_wg_wait<0>();
                fi_wg_pin<BN / 2>(s);

                /* logits: transforms, masks (a tile every row sees whole
                 * needs none without a transform) */
                bool whole = j0 + BN <= it.k1 && (nrows == 64 || !fi_v::USER) && !fi_v::ELEM_MASK;
                if constexpr (CAUSAL) whole = whole && j0 + BN - 1 <= diag0 + r0 / GROUP;
                if constexpr (WINDOW)
                    whole = whole && j0 >= diag0 + (r0 + nrows - 1) / GROUP - a.window_left;
                if (TRANSFORM || !whole)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int p = r0 + warp * 16 + g + 8 * h;
                        const int diag = diag0 + p / GROUP;
#pragma unroll
                        for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
                            for (int e = 0; e < 2; e++) {
                                float x = s[4 * nt + 2 * h + e];
                                const int j = j0 + nt * 8 + 2 * tq + e;
                                const fi_hook_ctx hc = fi_v::ctx(it.req, it.hkv * GROUP + p % GROUP, it.hkv,
                                                                 diag, j, it.qo_len, it.kv_len, DQK,
                                                                 a.sm_scale, slope[h]);
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
                                    if constexpr (fi_v::LOGITS && fi_v::USER) x = vis ? fi_v::logits(x, hc, VP) : x;
                                    if constexpr (TRANSFORM && SOFTMAX && fi_v::USER) x *= LOG2E;
                                    if (!vis) x = SOFTMAX ? FI_NEG_INF : 0.0f;
                                }
                                s[4 * nt + 2 * h + e] = x;
                            }
                    }

                /* online softmax, a row's four lanes together; m in the
                 * log2 domain, s raw (times qsc) */
                const float qsc = TRANSFORM ? 1.0f : a.q_scale;
                if constexpr (SOFTMAX) {
                    float mx[2], scale[2], mref[2];
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        float r[4] = {FI_NEG_INF, FI_NEG_INF, FI_NEG_INF, FI_NEG_INF}; /* 4 chains */
#pragma unroll
                        for (int nt = 0; nt < NTILE; nt++)
                            r[nt & 3] = fmaxf(r[nt & 3], fmaxf(s[4 * nt + 2 * h], s[4 * nt + 2 * h + 1]));
                        mx[h] = fmaxf(fmaxf(r[0], r[1]), fmaxf(r[2], r[3]));
                    }
#pragma unroll
                    for (int lanes = 1; lanes <= 2; lanes *= 2)
#pragma unroll
                        for (int h = 0; h < 2; h++) mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], lanes));
                    bool moved = false;
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const float mold = m[h], mnew = fmaxf(mold, mx[h] * qsc);
                        mref[h] = mnew == FI_NEG_INF ? 0.0f : mnew;
                        scale[h] = fi_exp2(mold - mref[h]);
                        moved = moved || mold != mnew;
                        m[h] = mnew;
                        l[h] *= scale[h];
                    }
                    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
                        for (int d = 0; d < DT; d++)
#pragma unroll
                            for (int e = 0; e < 4; e++) o[4 * d + e] *= scale[e >> 1];
                    }
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        float sum[2] = {0.0f, 0.0f};
#pragma unroll
                        for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
                            for (int e = 0; e < 2; e++) {
                                const float pr = fi_exp2(fmaf(s[4 * nt + 2 * h + e], qsc, -mref[h]));
                                s[4 * nt + 2 * h + e] = pr;
                                sum[e] += pr;
                            }
                        l[h] += sum[0] + sum[1];
                    }
                }

                /* O += P V: P's k16 slice kk is S's n8 tiles 2 kk, 2 kk + 1 */
                uint32_t pa[BN / 16][4];
#pragma unroll
                for (int kk = 0; kk < BN / 16; kk++) {
                    pa[kk][0] = pack2(s[8 * kk + 0], s[8 * kk + 1]);
                    pa[kk][1] = pack2(s[8 * kk + 2], s[8 * kk + 3]);
                    pa[kk][2] = pack2(s[8 * kk + 4], s[8 * kk + 5]);
                    pa[kk][3] = pack2(s[8 * kk + 6], s[8 * kk + 7]);
                }
                fi_wg_fence();
#pragma unroll
                for (int kk = 0; kk < BN / 16; kk++)
                    fi_wg_rs<DVO>(o, pa[kk], dv + so + ((kk * 16 * 128) >> 4));
                fi_wg_commit();
                fi_wg_wait<0>();
                fi_wg_pin<DVO / 2>(o);
            }
            __syncwarp();
            if (lane == 0) bar_arrive(bars + (STAGES + st) * 8); /* this warp is done with the stage */
        }

        /* O / l and LSE (log2 domain), or the item's partial rows;
         * use_softmax = 0: O as summed, LSE 0 */
        const int H = a.num_qo_heads;
        const bool opairs = OT != FI_T_F32 && a.o_vec_ok;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float L = l[h];
            L += __shfl_xor_sync(0xffffffffu, L, 1);
            L += __shfl_xor_sync(0xffffffffu, L, 2);
            const int p = r0 + warp * 16 + g + 8 * h;
            const float inv = !SOFTMAX ? a.v_scale : L > 0.0f ? a.v_scale / L : 0.0f;
            const float lse = !SOFTMAX ? 0.0f : L > 0.0f ? m[h] + log2f(L) : L == 0.0f ? FI_NEG_INF : FI_NAN;
            if constexpr (EXACT) {
                float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
                for (int d = 0; d < DT; d++) {
                    s0 += fabsf(o[4 * d + 2 * h]);
                    s1 += fabsf(o[4 * d + 2 * h + 1]);
                }
                redo = redo || (p < it.rows && fi_row_bad(s0 + s1, inv, L));
            }
            if (p >= it.rows) continue;
            const int tk = it.q0 + p / GROUP, head = it.hkv * GROUP + p % GROUP;
            if (it.prow >= 0) {
                const int64_t row = (int64_t)(it.prow + tk - it.q0) * H + head;
                float *po = a.partial_o + row * DVO;
#pragma unroll
                for (int d = 0; d < DT; d++)
                    *reinterpret_cast<float2 *>(po + d * 8 + 2 * tq) =
                        make_float2(o[4 * d + 2 * h] * inv, o[4 * d + 2 * h + 1] * inv);
                if (tq == 0) a.partial_lse[row] = lse;
            } else if (opairs) {
                const int64_t tok = it.qo_base + tk;
                char *ob = a.o + tok * a.o_tok + (int64_t)head * a.o_head + 4 * tq;
#pragma unroll
                for (int d = 0; d < DT; d++)
                    *reinterpret_cast<uint32_t *>(ob + d * 16) =
                        pack2<OT == FI_T_BF16>(o[4 * d + 2 * h] * inv, o[4 * d + 2 * h + 1] * inv);
                if (tq == 0 && a.lse) a.lse[tok * a.lse_tok + (int64_t)head * a.lse_head] = lse;
            } else {
                const int64_t tok = it.qo_base + tk;
                char *ob = a.o + tok * a.o_tok + (int64_t)head * a.o_head;
#pragma unroll
                for (int d = 0; d < DT; d++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        fi_store_elem<OT>(ob + (int64_t)(d * 8 + 2 * tq + e) * a.o_dim,
                                          o[4 * d + 2 * h + e] * inv);
                if (tq == 0 && a.lse) a.lse[tok * a.lse_tok + (int64_t)head * a.lse_head] = lse;
            }
        }
    });
    /* rows that came out not finite: the producer computes them again */
    if (EXACT) all_done_or(redo);
}

} /* namespace fi_wg */

extern "C" __global__ void __launch_bounds__(fi_wg::NT, 1) FI_ATTN_WG_NAME(const fi_attn_args a) {
    using namespace fi_wg;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    fi_pdl_launch_dependents();
    fi_pdl_wait();
    fi_mark_upload_read(a);
    if (a.tc_min_rows <= 0) return;
    {
        uint32_t dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < (uint32_t)SMEM_BYTES) __trap(); /* the host launched it wrong */
    }
    const uint32_t raw_a = fi_smem_addr(smem_raw), pad = (1024 - (raw_a & 1023)) & 1023;
    unsigned char *sm = smem_raw + pad;
    const uint32_t sm_a = raw_a + pad;
    const uint32_t bars = sm_a + Q_BYTES + STAGES * STAGE_BYTES + OFF_BYTES;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            bar_init(bars + s * 8, 128);          /* full: the producer's threads */
            bar_init(bars + (STAGES + s) * 8, 8); /* empty: the consumers' warps */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const fi_view v = fi_view_of(a);
    if (threadIdx.x < 128) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(PRODUCER_REGS));
        produce(a, v, sm, sm_a);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(CONSUMER_REGS));
        consume(a, v, sm_a, threadIdx.x < 256 ? 0 : 1);
    }
}
