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
 * FP8 byte written once; the cos/sin row comes from L1/L2.
 *
 * Arithmetic is the CPU backend's (src/cpu/ops_rope_quant.c) bit for bit:
 * y = x c - x' s in f32 with round-to-nearest products (never an FMA),
 * then fp8(y * scale) by serving_math.cuh's to_fp8 (round to nearest even,
 * saturated to +-448 / +-57344, NaN 0x7f). Values the host cannot check
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

/* Unit u of a rope row: pairs turned by cos / sin (cs: the token's cache
 * row, col its element step), scaled, stored as FP8. */
FI_DEV void rope_unit(const fi_rq_kseg &s, const char *src, char *dst, int u, int half,
                      const float *cs, int64_t col) {
    if constexpr (VEC && NEOX) { /* pairs 8u .. 8u + 7: 8 from each half */
        const int i0 = 8 * u;
        float x1[8], x2[8], y1[8], y2[8];
        fi_load_vec<XT, 8>(src + i0 * ES, x1);
        fi_load_vec<XT, 8>(src + (i0 + half) * ES, x2);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float c = cs[(i0 + e) * col], sn = cs[(half + i0 + e) * col];
            y1[e] = mul(sub(mul(x1[e], c), mul(x2[e], sn)), s.scale);
            y2[e] = mul(add(mul(x2[e], c), mul(x1[e], sn)), s.scale);
        }
        store8<OT>(dst + i0, y1);
        store8<OT>(dst + i0 + half, y2);
    } else if constexpr (VEC) { /* elements 8u .. 8u + 7: pairs 4u .. 4u + 3 */
        float x[8], y[8];
        fi_load_vec<XT, 8>(src + 8 * u * ES, x);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int i = 4 * u + k;
            const float c = cs[i * col], sn = cs[(half + i) * col];
            y[2 * k] = mul(sub(mul(x[2 * k], c), mul(x[2 * k + 1], sn)), s.scale);
            y[2 * k + 1] = mul(add(mul(x[2 * k + 1], c), mul(x[2 * k], sn)), s.scale);
        }
        store8<OT>(dst + 8 * u, y);
    } else { /* pair u */
        const int64_t d1 = NEOX ? u : 2 * u, d2 = NEOX ? u + half : 2 * u + 1;
        const float c = cs[u * col], sn = cs[(half + u) * col];
        const float x1 = fi_load_elem<XT>(src + d1 * s.s_col);
        const float x2 = fi_load_elem<XT>(src + d2 * s.s_col);
        store<OT>(dst + d1 * s.d_col, mul(sub(mul(x1, c), mul(x2, sn)), s.scale));
        store<OT>(dst + d2 * s.d_col, mul(add(mul(x2, c), mul(x1, sn)), s.scale));
    }
}

/* Unit u of a plain row: scaled, stored as FP8. */
FI_DEV void plain_unit(const fi_rq_kseg &s, const char *src, char *dst, int u) {
    if constexpr (VEC) {
        float x[8];
        fi_load_vec<XT, 8>(src + 8 * u * ES, x);
#pragma unroll
        for (int e = 0; e < 8; e++) x[e] = mul(x[e], s.scale);
        store8<OT>(dst + 8 * u, x);
    } else {
        store<OT>(dst + u * s.d_col, mul(fi_load_elem<XT>(src + u * s.s_col), s.scale));
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

} // namespace fi_rq

extern "C" __global__ void __launch_bounds__(256) FI_RQ_NAME(const fi_rq_kargs a) {
    using namespace fi_rq;
    const int half = a.rot / 2;
    for (int64_t t = blockIdx.y; t < a.nnz; t += gridDim.y) {
        const int32_t p = a.pos[t * a.pos_st];
        if (p < 0 || p >= a.max_pos) continue; /* no row of the cache: skipped */
        const float *cs = a.cache + p * a.cache_row;
        int32_t page = 0, slot = 0;
        const bool slotted = token_slot(a, t, &page, &slot);
        for (int64_t f = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; f < a.units;
             f += (int64_t)gridDim.x * blockDim.x) {
            int64_t g = f;
#pragma unroll
            for (int si = 0; si < FI_RQ_SEGS; si++) { /* constant indices: a.seg stays in param space */
                const fi_rq_kseg &s = a.seg[si];
                if (si >= a.nseg) break;
                if (g >= s.units) {
                    g -= s.units;
                    continue;
                }
                if (s.paged && !slotted) break;
                const int h = (int)(g / s.upr), u = (int)(g % s.upr);
                const char *src = s.src + t * s.s_tok + h * s.s_head;
                char *dst = s.dst + h * s.d_head +
                            (s.paged ? page * s.d_row + slot * s.d_slot : t * s.d_row);
                if (s.rope) rope_unit(s, src, dst, u, half, cs, a.cache_col);
                else plain_unit(s, src, dst, u);
                break;
            }
        }
    }
}
