/*
 * rope_quant.cuh — RoPE + FP8 quantize (+ append to a paged FP8 cache) in
 * one launch: fi_rope_quantize_fp8 and its append form. One kernel per
 * compile, chosen by -D constants (src/cuda/rope_quant.c builds the name
 * and the options):
 *
 *   FI_RQ_XT    the inputs' dtype (f32, f16, bf16)
 *   FI_RQ_OT    the FP8 outputs' dtype (e4m3, e5m2)
 *   FI_RQ_NEOX  pair i is (x[i], x[i + R/2]); else (x[2i], x[2i+1])
 *   FI_RQ_VEC   every row contiguous, input rows 16-byte and output rows
 *               8-byte aligned, every width a multiple of 8 (R of 16 for
 *               NeoX): units of 8 elements (NeoX rope: 8 pairs) with
 *               vector loads and stores; else a pair or an element at a
 *               time through the strides
 *   FI_RQ_NAME  the entry point
 *
 * Work: blockIdx.y strides over tokens; the threads of blockIdx.x stride
 * over the token's units, segment after segment (Q rope, Q nope, K rope,
 * K nope, V: kernels/rope_quant_args.h), so one block covers a token's
 * heads of every tensor and the loads of neighbouring threads are
 * neighbouring 16 bytes. Bandwidth-bound: each input byte read once, each
 * FP8 byte written once; the cos/sin row comes from L1/L2. On the vector
 * path a thread loads FI_RQ_UNITS units (a stride of the grid's width
 * apart) before it reads the token's pos id and page table and stores
 * any (2: 4 held the registers of too many loads, measured slower).
 *
 * Arithmetic is the CPU backend's (src/cpu/ops_rope_quant.c) bit for bit:
 * y = x c - x' s in f32 with round-to-nearest products (never an FMA),
 * then fp8(y * scale) by serving_math.cuh's store8 / to_fp8 (round to
 * nearest even, saturated to +-448 / +-57344, NaN 0x7f). Values the host cannot check
 * without a sync are checked here: a token whose pos_id is outside the
 * cache writes nothing; one whose request, position or page id is outside
 * the page table (batch_indices outside the batch, kv_indptr out of order
 * or past kv_indices, position past its pages, page id outside the cache)
 * writes its Q rows and skips its K/V rows, as the paged append does
 * (kernels/ops.cuh).
 */
#include "serving_math.cuh"
#include "rope_quant_args.h"

#ifndef FI_RQ_NAME
#define FI_RQ_NAME fi_rq_default
#endif
#ifndef FI_RQ_XT
#define FI_RQ_XT FI_T_BF16
#endif
#ifndef FI_RQ_OT
#define FI_RQ_OT FI_T_E4M3
#endif
#ifndef FI_RQ_NEOX
#define FI_RQ_NEOX 1
#endif
#ifndef FI_RQ_VEC
#define FI_RQ_VEC 1
#endif

namespace fi_rq {

using namespace fi_sv;

constexpr int XT = FI_RQ_XT, OT = FI_RQ_OT, ES = fi_dtype_bytes<XT>::value;
constexpr bool NEOX = FI_RQ_NEOX != 0, VEC = FI_RQ_VEC != 0;

/* Pair u of a rope row (the strided path): turned by cos / sin (cs: the
 * token's cache row, col its element step), scaled, stored as FP8. */
FI_DEV void rope_pair(const fi_rq_kseg &s, const char *src, char *dst, int u, int half,
                      const float *cs, int64_t col) {
    const int64_t d1 = NEOX ? u : 2 * u, d2 = NEOX ? u + half : 2 * u + 1;
    const float c = cs[u * col], sn = cs[(half + u) * col];
    const float x1 = fi_load_elem<XT>(src + d1 * s.s_col);
    const float x2 = fi_load_elem<XT>(src + d2 * s.s_col);
    store<OT>(dst + d1 * s.d_col, mul(sub(mul(x1, c), mul(x2, sn)), s.scale));
    store<OT>(dst + d2 * s.d_col, mul(add(mul(x2, c), mul(x1, sn)), s.scale));
}

/* 32-bit words of 8 elements of dtype XT */
constexpr int W8 = 2 * ES;

/* 8 elements at p (16-byte aligned) as words: loaded now, used later. */
FI_DEV void load8(const char *p, uint32_t *w) {
#pragma unroll
    for (int i = 0; i < W8 / 4; i++) {
        const uint4 v = reinterpret_cast<const uint4 *>(p)[i];
        w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
}

/* Unit u of a row on the vector path, its words w1 (and w2: NeoX rope,
 * the second half's 8), to its FP8 row dst: plain (scaled), or pairs
 * turned by cos / sin first (cs: the token's cache row, col its step). */
FI_DEV void unit8(bool rope, float scale, const uint32_t *w1, const uint32_t *w2, char *dst, int u,
                  int half, const float *cs, int64_t col) {
    float x1[8];
    fi_unpack<XT, 8>(w1, x1);
    if (!rope) {
#pragma unroll
        for (int e = 0; e < 8; e++) x1[e] = mul(x1[e], scale);
        store8<OT>(dst + 8 * u, x1);
    } else if constexpr (NEOX) { /* pairs 8u .. 8u + 7: 8 from each half */
        const int i0 = 8 * u;
        float x2[8], y1[8], y2[8];
        fi_unpack<XT, 8>(w2, x2);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float c = cs[(i0 + e) * col], sn = cs[(half + i0 + e) * col];
            y1[e] = mul(sub(mul(x1[e], c), mul(x2[e], sn)), scale);
            y2[e] = mul(add(mul(x2[e], c), mul(x1[e], sn)), scale);
        }
        store8<OT>(dst + i0, y1);
        store8<OT>(dst + i0 + half, y2);
    } else { /* elements 8u .. 8u + 7: pairs 4u .. 4u + 3 */
        float y[8];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int i = 4 * u + k;
            const float c = cs[i * col], sn = cs[(half + i) * col];
            y[2 * k] = mul(sub(mul(x1[2 * k], c), mul(x1[2 * k + 1], sn)), scale);
            y[2 * k + 1] = mul(add(mul(x1[2 * k + 1], c), mul(x1[2 * k], sn)), scale);
        }
        store8<OT>(dst + 8 * u, y);
    }
}

/* Token t's (page, slot) in the paged cache; false when the op does not
 * append or the page table does not hold the token. */
FI_DEV bool token_slot(const fi_rq_kargs &a, int64_t t, int32_t *page, int32_t *slot) {
    if (!a.batch) return false;
    const int32_t b = a.batch[t * a.batch_st], p = a.slot_pos[t * a.slot_pos_st];
    if (b < 0 || b >= a.batch_size || p < 0) return false;
    const int32_t first = a.indptr[(int64_t)b * a.indptr_st];
    const int32_t end = a.indptr[(int64_t)(b + 1) * a.indptr_st];
    if (first < 0 || end < first || end > a.num_indices) return false;
    const int32_t pi = p / a.page_size;
    if (pi >= end - first) return false;
    const int32_t id = a.indices[(int64_t)(first + pi) * a.indices_st];
    if (id < 0 || id >= a.num_pages) return false;
    *page = id, *slot = p % a.page_size;
    return true;
}

/* f(segment, its index, head, unit of the head's row) for unit g of a
 * token, on the segment that holds it (none past them). a.seg is read
 * with constant indices (the loop unrolled): it stays in param space. */
template <typename F>
FI_DEV void with_unit(const fi_rq_kargs &a, int64_t g, F &&f) {
#pragma unroll
    for (int si = 0; si < FI_RQ_SEGS; si++) {
        const fi_rq_kseg &s = a.seg[si];
        if (si >= a.nseg) return;
        if (g < s.units) {
            f(s, si, (int)(g / s.upr), (int)(g % s.upr));
            return;
        }
        g -= s.units;
    }
}

/* Units a thread loads before it stores any (vector path): a token's
 * chain (pos id, page table, loads, stores) carries FI_RQ_UNITS of them. */
constexpr int U = FI_RQ_UNITS;

/* The vector path: U units of token t at f0, f0 + step, ...; their loads
 * go out before the token's pos id and page table are looked at (they do
 * not depend on them). A unit keeps its segment, head and unit index
 * across (the segment's fields are read again from parameter space after:
 * held in registers they cost the occupancy). */
FI_DEV void run_vec(const fi_rq_kargs &a, int64_t t, int64_t f0, int64_t step, int half,
                    const float *cs, bool keep, bool &slot_known, bool &slotted, int32_t &page,
                    int32_t &slot) {
    uint32_t w1[U][W8], w2[U][W8];
    int sg[U], hh[U], uu[U];
#pragma unroll
    for (int k = 0; k < U; k++) {
        const int64_t g = f0 + k * step;
        sg[k] = -1, hh[k] = uu[k] = 0;
        if (g >= a.units) continue;
        with_unit(a, g, [&](const fi_rq_kseg &s, int si, int h, int u) {
            const char *src = s.src + t * s.s_tok + h * s.s_head;
            load8(src + 8 * u * ES, w1[k]);
            if (NEOX && s.rope) load8(src + (8 * u + half) * ES, w2[k]);
            sg[k] = si, hh[k] = h, uu[k] = u;
        });
    }
    if (!keep) return; /* a pos id outside the cache: the token writes nothing */
    if (!slot_known) {
        slotted = token_slot(a, t, &page, &slot);
        slot_known = true;
    }
#pragma unroll
    for (int k = 0; k < U; k++) {
        char *d = nullptr;
        float scale = 0.0f;
        bool rope = false;
#pragma unroll
        for (int si = 0; si < FI_RQ_SEGS; si++) {
            const fi_rq_kseg &s = a.seg[si];
            if (si != sg[k] || (s.paged && !slotted)) continue;
            d = s.dst + hh[k] * s.d_head + (s.paged ? page * s.d_row + slot * s.d_slot : t * s.d_row);
            scale = s.scale, rope = s.rope;
        }
        if (d) unit8(rope, scale, w1[k], w2[k], d, uu[k], half, cs, a.cache_col);
    }
}

} // namespace fi_rq

extern "C" __global__ void __launch_bounds__(256) FI_RQ_NAME(const fi_rq_kargs a) {
    using namespace fi_rq;
    const int half = a.rot / 2;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = blockIdx.y; t < a.nnz; t += gridDim.y) {
        const int32_t p = a.pos[t * a.pos_st];
        const bool keep = p >= 0 && p < a.max_pos; /* else no row of the cache: skipped */
        const float *cs = a.cache + (keep ? p : 0) * a.cache_row;
        int32_t page = 0, slot = 0;
        bool slot_known = false, slotted = false;
        if constexpr (VEC) {
            for (int64_t f0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; f0 < a.units; f0 += U * step)
                run_vec(a, t, f0, step, half, cs, keep, slot_known, slotted, page, slot);
            continue;
        }
        if (!keep) continue;
        slotted = token_slot(a, t, &page, &slot);
        for (int64_t f = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; f < a.units; f += step)
            with_unit(a, f, [&](const fi_rq_kseg &s, int, int h, int u) {
                if (s.paged && !slotted) return;
                const char *src = s.src + t * s.s_tok + h * s.s_head;
                char *dst = s.dst + h * s.d_head +
                            (s.paged ? page * s.d_row + slot * s.d_slot : t * s.d_row);
                if (s.rope) rope_pair(s, src, dst, u, half, cs, a.cache_col);
                else store<OT>(dst + u * s.d_col, mul(fi_load_elem<XT>(src + u * s.s_col), s.scale));
            });
    }
}
