/*
 * ops.cuh — the standalone ops on the GPU: merging attention states (two
 * states, in place with a row mask, n states), appending K/V rows to a paged
 * cache, and RoPE (indptr + offsets or pos_ids). One kernel per compile,
 * chosen and specialised by -D constants (src/cuda/ops.c builds the name and
 * the options):
 *
 *   FI_OPS_KIND  1 merge_state (two states; in place when the output is a)
 *                2 merge_states (n states per row, in index order)
 *                3 append_paged_kv_cache
 *                4 rope
 *   FI_OPS_VA FI_OPS_VB FI_OPS_VO   merge dtypes (codes of prelude.cuh)
 *   FI_OPS_MASK  merge_state: a u8 row mask (rows with 0 are left alone)
 *   FI_OPS_ES    append: bytes per element (values are copied, not converted)
 *   FI_OPS_QT FI_OPS_KT   rope: q and k dtypes (outputs share them)
 *   FI_OPS_INTER rope: pairs (x[2i], x[2i+1]) instead of halves (x[i], x[i+r/2])
 *   FI_OPS_POSIDS rope: positions from pos_ids, else from indptr + offsets
 *   FI_OPS_VEC   rows contiguous and 16-byte aligned (the host checked):
 *                chunks of 8 elements (merge, rope) or 16 bytes (append)
 *                with vector loads and stores; else one element at a time
 *                through the strides
 *   FI_OPS_NAME  the entry point
 *
 * Work: every launch walks `rows` units (a (token, head) row, or for RoPE a
 * token and a chunk of heads) with groups of 2^tpr_log2 threads, a grid of
 * 128-thread blocks striding over them. The loop is uniform per warp (every
 * lane runs the same iterations), so __syncwarp is legal inside it.
 *
 * Semantics are FlashInfer's and the CPU backend's (src/cpu/ops_*.c):
 *   merge   M = max L_s, w_s = 2^(L_s - M), O = sum w_s O_s / sum w_s,
 *           L = M + log2 sum w_s; non-finite values as docs/SEMANTICS.md
 *           says: a state with L = -inf is never read (its O may hold
 *           anything), one with L NaN or +inf makes the row NaN, every
 *           other one is read whatever its weight; no state left: O = 0,
 *           L = -inf; a sum past f32 is done again in f64. f32 sums in a
 *           fixed order, so the result is bitwise the same run after run.
 *   append  token n (request b = batch[n], position p) goes to page
 *           indices[indptr[b] + p / page_size], slot p % page_size, bit for
 *           bit. Index values cannot be checked on the host without a sync,
 *           so the kernel checks them: a token whose request is outside the
 *           batch, whose indptr entries are out of order or past
 *           kv_indices, whose last_page_len is outside [1, page_size], whose
 *           position is outside [0, length), or whose page id is outside the
 *           cache is skipped: nothing is written for it, and nothing reports
 *           it (no error flag: that would need a sync to read).
 *   rope    pair i turns by pos * f_i, f_i = theta^(-2i/rotary_dim) / scale
 *           (LLaMA-3.1: the smoothed blend); frequencies in double, once
 *           per block (shared memory), kept as hi + lo floats, so the f32
 *           angle is exact (positions < 2^24; beyond, double); its cos/sin
 *           by MUFU after a Cody-Waite reduction (prelude.cuh); the rotation in
 *           f32; dims past rotary_dim copied; tokens past indptr[B] (or with
 *           no request in a malformed indptr) untouched.
 */
#include "prelude.cuh"
#include "ops_args.h"

#ifndef FI_OPS_NAME
#define FI_OPS_NAME fi_ops_default
#endif
#ifndef FI_OPS_KIND
#define FI_OPS_KIND 1
#endif
#ifndef FI_OPS_VA
#define FI_OPS_VA FI_T_BF16
#endif
#ifndef FI_OPS_VB
#define FI_OPS_VB FI_OPS_VA
#endif
#ifndef FI_OPS_VO
#define FI_OPS_VO FI_OPS_VA
#endif
#ifndef FI_OPS_MASK
#define FI_OPS_MASK 0
#endif
#ifndef FI_OPS_ES
#define FI_OPS_ES 2
#endif
#ifndef FI_OPS_QT
#define FI_OPS_QT FI_T_BF16
#endif
#ifndef FI_OPS_KT
#define FI_OPS_KT FI_OPS_QT
#endif
#ifndef FI_OPS_INTER
#define FI_OPS_INTER 0
#endif
#ifndef FI_OPS_POSIDS
#define FI_OPS_POSIDS 0
#endif
#ifndef FI_OPS_VEC
#define FI_OPS_VEC 1
#endif

namespace fi_ops {

constexpr int NT = 128;        /* threads per block */
constexpr int EV = 8;          /* elements per vector chunk (merge, rope) */
constexpr bool VEC = FI_OPS_VEC != 0;

/* N f32 values stored as dtype T (f32/f16/bf16) at p, aligned to their
 * size, with the widest stores that fit (N * size a multiple of 4). */
template <int T, int N>
FI_DEV void store_vec(char *p, const float *x) {
    constexpr int BYTES = N * fi_dtype_bytes<T>::value;
    constexpr int WORDS = BYTES / 4;
    uint32_t w[WORDS];
#pragma unroll
    for (int i = 0; i < WORDS; i++) {
        if constexpr (T == FI_T_F32) {
            w[i] = __float_as_uint(x[i]);
        } else if constexpr (T == FI_T_F16) {
            w[i] = fi_f32_to_f16(x[2 * i]) | (fi_f32_to_f16(x[2 * i + 1]) << 16);
        } else {
            w[i] = fi_f32_to_bf16(x[2 * i]) | (fi_f32_to_bf16(x[2 * i + 1]) << 16);
        }
    }
    if constexpr (BYTES % 16 == 0) {
#pragma unroll
        for (int i = 0; i < BYTES / 16; i++) {
            uint4 v;
            v.x = w[4 * i], v.y = w[4 * i + 1], v.z = w[4 * i + 2], v.w = w[4 * i + 3];
            reinterpret_cast<uint4 *>(p)[i] = v;
        }
    } else if constexpr (BYTES == 8) {
        uint2 v;
        v.x = w[0], v.y = w[1];
        *reinterpret_cast<uint2 *>(p) = v;
    } else {
        *reinterpret_cast<uint32_t *>(p) = w[0];
    }
}

/* B bytes (a multiple of 16) from src to dst, both 16-byte aligned. */
template <int B>
FI_DEV void copy16(char *dst, const char *src) {
#pragma unroll
    for (int i = 0; i < B / 16; i++)
        reinterpret_cast<uint4 *>(dst)[i] = reinterpret_cast<const uint4 *>(src)[i];
}

/* The thread's place in the warp-uniform walk over units. */
struct walk {
    int sub;        /* thread within its group */
    int group;      /* group within the warp */
    int64_t first;  /* the warp's first unit */
    int64_t step;   /* units per sweep of the grid */
};

FI_DEV walk walk_init(int tpr_log2) {
    walk w;
    const int lane = threadIdx.x & 31;
    w.sub = lane & ((1 << tpr_log2) - 1);
    w.group = lane >> tpr_log2;
    const int64_t warp = ((int64_t)blockIdx.x * NT + threadIdx.x) >> 5;
    const int per_warp = 32 >> tpr_log2;
    w.first = warp * per_warp;
    w.step = (int64_t)gridDim.x * (NT / 32) * per_warp;
    return w;
}

} // namespace fi_ops

/* ========================================================== merge_state */
#if FI_OPS_KIND == 1

extern "C" __global__ void __launch_bounds__(fi_ops::NT) FI_OPS_NAME(const fi_ops_merge_args a) {
    using namespace fi_ops;
    constexpr int VA = FI_OPS_VA, VB = FI_OPS_VB, VO = FI_OPS_VO;
    constexpr int ESA = fi_dtype_bytes<VA>::value, ESB = fi_dtype_bytes<VB>::value,
                  ESO = fi_dtype_bytes<VO>::value;
    const walk w = walk_init(a.tpr_log2);
    const int tpr = 1 << a.tpr_log2;
    for (int64_t base = w.first; base < a.rows; base += w.step) {
        const int64_t row = base + w.group;
        bool live = row < a.rows;
        const int64_t i = live ? row / a.heads : 0, h = live ? row % a.heads : 0;
        if (FI_OPS_MASK && live) live = a.mask[i * a.mask_stride] != 0;
        float la = FI_NEG_INF, lb = FI_NEG_INF;
        if (live) {
            la = a.sa[i * a.sa_tok + h * a.sa_head];
            lb = a.sb[i * a.sb_tok + h * a.sb_head];
        }
        const bool poisoned = !(la < FI_POS_INF) || !(lb < FI_POS_INF);
        const float m = fmaxf(la, lb);
        float wa = 0.0f, wb = 0.0f, sum = 0.0f;
        if (m != FI_NEG_INF && !poisoned) {
            wa = exp2f(la - m);
            wb = exp2f(lb - m);
            sum = wa + wb;
            wa /= sum;
            wb /= sum;
        }
        /* every state with a finite LSE is read, whatever its weight */
        const bool ra = !poisoned && la != FI_NEG_INF, rb = !poisoned && lb != FI_NEG_INF;
        if (live) {
            const char *pa = a.va + i * a.va_tok + h * a.va_head;
            const char *pb = a.vb + i * a.vb_tok + h * a.vb_head;
            char *po = a.vo + i * a.vo_tok + h * a.vo_head;
            if constexpr (VEC) {
                for (int c = w.sub; c < a.dim / EV; c += tpr) {
                    float acc[EV], xa[EV], xb[EV];
#pragma unroll
                    for (int e = 0; e < EV; e++) acc[e] = poisoned ? FI_NAN : 0.0f, xa[e] = xb[e] = 0.0f;
                    if (ra) fi_load_vec<VA, EV>(pa + (int64_t)c * EV * ESA, xa);
                    if (rb) fi_load_vec<VB, EV>(pb + (int64_t)c * EV * ESB, xb);
#pragma unroll
                    for (int e = 0; e < EV; e++) {
                        if (ra) acc[e] = fmaf(wa, xa[e], acc[e]);
                        if (rb) acc[e] = fmaf(wb, xb[e], acc[e]);
                        if (!poisoned && !fi_finite(acc[e])) /* past f32: in f64 */
                            acc[e] = (float)((double)wa * xa[e] + (double)wb * xb[e]);
                    }
                    store_vec<VO, EV>(po + (int64_t)c * EV * ESO, acc);
                }
            } else {
                for (int d = w.sub; d < a.dim; d += tpr) {
                    const float xa = ra ? fi_load_elem<VA>(pa + d * a.va_dim) : 0.0f;
                    const float xb = rb ? fi_load_elem<VB>(pb + d * a.vb_dim) : 0.0f;
                    float acc = poisoned ? FI_NAN : 0.0f;
                    if (ra) acc = fmaf(wa, xa, acc);
                    if (rb) acc = fmaf(wb, xb, acc);
                    if (!poisoned && !fi_finite(acc)) acc = (float)((double)wa * xa + (double)wb * xb);
                    fi_store_elem<VO>(po + d * a.vo_dim, acc);
                }
            }
        }
        /* In place (s_out is s_a or s_b): every lane of the group has read
         * the LSEs before the first lane overwrites one. */
        __syncwarp();
        if (live && w.sub == 0)
            a.so[i * a.so_tok + h * a.so_head] =
                poisoned ? FI_NAN : m == FI_NEG_INF ? FI_NEG_INF : m + log2f(sum);
    }
}

/* ========================================================= merge_states */
#elif FI_OPS_KIND == 2

extern "C" __global__ void __launch_bounds__(fi_ops::NT) FI_OPS_NAME(const fi_ops_merge_args a) {
    using namespace fi_ops;
    constexpr int VA = FI_OPS_VA, VO = FI_OPS_VO;
    constexpr int ESA = fi_dtype_bytes<VA>::value, ESO = fi_dtype_bytes<VO>::value;
    const walk w = walk_init(a.tpr_log2);
    const int tpr = 1 << a.tpr_log2;
    for (int64_t base = w.first; base < a.rows; base += w.step) {
        const int64_t row = base + w.group;
        if (row >= a.rows) continue;
        const int64_t i = row / a.heads, h = row % a.heads;
        const float *ls = a.sa + i * a.sa_tok + h * a.sa_head;
        float m = FI_NEG_INF;
        bool poisoned = false; /* a state with LSE NaN or +inf: the row is NaN */
        for (int s = 0; s < a.states; s++) {
            const float l = ls[s * a.sa_state];
            poisoned = poisoned || !(l < FI_POS_INF);
            m = fmaxf(m, l);
        }
        const bool any = m != FI_NEG_INF && !poisoned;
        float sum = 0.0f;
        if (any)
            for (int s = 0; s < a.states; s++) sum += exp2f(ls[s * a.sa_state] - m);
        const float inv = any ? 1.0f / sum : poisoned ? FI_NAN : 0.0f;
        const char *pv = a.va + i * a.va_tok + h * a.va_head;
        char *po = a.vo + i * a.vo_tok + h * a.vo_head;
        /* every state with a finite LSE is read, whatever its weight (index
         * order: deterministic); a chunk whose f32 sum is not finite is
         * summed again in f64 */
        if constexpr (VEC) {
            for (int c = w.sub; c < a.dim / EV; c += tpr) {
                float acc[EV], x[EV];
#pragma unroll
                for (int e = 0; e < EV; e++) acc[e] = 0.0f;
                for (int s = 0; s < a.states && any; s++) {
                    const float l = ls[s * a.sa_state];
                    if (l == FI_NEG_INF) continue;
                    fi_load_vec<VA, EV>(pv + s * a.va_state + (int64_t)c * EV * ESA, x);
                    const float wgt = exp2f(l - m);
#pragma unroll
                    for (int e = 0; e < EV; e++) acc[e] = fmaf(wgt, x[e], acc[e]);
                }
                bool finite = true;
#pragma unroll
                for (int e = 0; e < EV; e++) {
                    acc[e] *= inv;
                    finite = finite && fi_finite(acc[e]);
                }
                if (any && !finite) {
                    double ex[EV];
#pragma unroll
                    for (int e = 0; e < EV; e++) ex[e] = 0.0;
                    for (int s = 0; s < a.states; s++) {
                        const float l = ls[s * a.sa_state];
                        if (l == FI_NEG_INF) continue;
                        fi_load_vec<VA, EV>(pv + s * a.va_state + (int64_t)c * EV * ESA, x);
                        const double wgt = exp2f(l - m) * inv;
#pragma unroll
                        for (int e = 0; e < EV; e++) ex[e] += wgt * x[e];
                    }
#pragma unroll
                    for (int e = 0; e < EV; e++) acc[e] = (float)ex[e];
                }
                store_vec<VO, EV>(po + (int64_t)c * EV * ESO, acc);
            }
        } else {
            for (int d = w.sub; d < a.dim; d += tpr) {
                float acc = 0.0f;
                for (int s = 0; s < a.states && any; s++) {
                    const float l = ls[s * a.sa_state];
                    if (l == FI_NEG_INF) continue;
                    acc = fmaf(exp2f(l - m), fi_load_elem<VA>(pv + s * a.va_state + d * a.va_dim), acc);
                }
                acc *= inv;
                if (any && !fi_finite(acc)) {
                    double ex = 0.0;
                    for (int s = 0; s < a.states; s++) {
                        const float l = ls[s * a.sa_state];
                        if (l == FI_NEG_INF) continue;
                        ex += (double)(exp2f(l - m) * inv) * fi_load_elem<VA>(pv + s * a.va_state + d * a.va_dim);
                    }
                    acc = (float)ex;
                }
                fi_store_elem<VO>(po + d * a.vo_dim, acc);
            }
        }
        if (w.sub == 0)
            a.so[i * a.so_tok + h * a.so_head] =
                poisoned ? FI_NAN : m == FI_NEG_INF ? FI_NEG_INF : m + log2f(sum);
    }
}

/* ======================================================= append (paged) */
#elif FI_OPS_KIND == 3

namespace fi_ops {

/* The row of `dim` elements at src copied into dst, by the group. */
FI_DEV void copy_row(char *dst, int64_t dst_dim, const char *src, int64_t src_dim, int dim,
                     int sub, int tpr) {
    constexpr int ES = FI_OPS_ES;
    if constexpr (VEC) {
        const int chunks = dim * ES / 16;
        for (int c = sub; c < chunks; c += tpr) copy16<16>(dst + 16 * c, src + 16 * c);
    } else {
        for (int d = sub; d < dim; d += tpr) fi_copy_raw<ES>(dst + d * dst_dim, src + d * src_dim);
    }
}

} // namespace fi_ops

extern "C" __global__ void __launch_bounds__(fi_ops::NT) FI_OPS_NAME(const fi_ops_append_args a) {
    using namespace fi_ops;
    const walk w = walk_init(a.tpr_log2);
    const int tpr = 1 << a.tpr_log2;
    for (int64_t base = w.first; base < a.rows; base += w.step) {
        const int64_t row = base + w.group;
        if (row >= a.rows) continue;
        const int64_t n = row / a.heads, h = row % a.heads;
        const int32_t b = a.batch[n], p = a.pos[n];
        /* Every index is checked before it is used: a bad one skips the
         * token (see the top of the file). */
        if (b < 0 || b >= a.batch_size || p < 0) continue;
        const int32_t first = a.indptr[b], end = a.indptr[b + 1];
        if (first < 0 || end <= first || end > a.num_indices) continue;
        const int32_t last = a.last[b];
        if (last < 1 || last > a.page_size) continue;
        const int64_t len = (int64_t)a.page_size * (end - first - 1) + last;
        if (p >= len) continue;
        const int32_t page = a.indices[first + p / a.page_size];
        if (page < 0 || page >= a.num_pages) continue;
        const int64_t slot = p % a.page_size;
        copy_row(a.kc + page * a.kc_page + slot * a.kc_slot + h * a.kc_head, a.kc_dim,
                 a.ak + n * a.ak_tok + h * a.ak_head, a.ak_dim, a.dim_k, w.sub, tpr);
        copy_row(a.vc + page * a.vc_page + slot * a.vc_slot + h * a.vc_head, a.vc_dim,
                 a.av + n * a.av_tok + h * a.av_head, a.av_dim, a.dim_v, w.sub, tpr);
    }
}

/* ================================================================= RoPE */
#elif FI_OPS_KIND == 4

namespace fi_ops {

constexpr int QT = FI_OPS_QT, KT = FI_OPS_KT;
constexpr bool INTER = FI_OPS_INTER != 0;
/* Pairs per unit: a chunk of EV elements holds EV/2 neighbour pairs, or,
 * for halves, EV pairs (EV elements from each half); one when scalar. */
constexpr int PV = VEC ? (INTER ? EV / 2 : EV) : 1;
/* Tail elements (past rotary_dim) per unit. */
constexpr int TV = VEC ? EV : 1;

/* FlashInfer's frequency of pair i, in double, as src/cpu/ops_rope.c. */
FI_DEV double rope_freq(const fi_ops_rope_args &a, int i) {
    const double f = pow(a.rope_theta, -2.0 * i / a.rotary_dim);
    double smooth = 0.0;
    if (a.llama31) {
        const double two_pi = 6.283185307179586;
        smooth = (a.old_context_len * f / two_pi - a.low_freq_factor) /
                 (a.high_freq_factor - a.low_freq_factor);
        smooth = smooth < 0.0 ? 0.0 : smooth > 1.0 ? 1.0 : smooth;
    }
    return (1.0 - smooth) * f / a.rope_scale + smooth * f;
}

/* Pairs whose frequencies a block keeps in shared memory (rotary_dim up to
 * 512; the rest computed when needed). */
constexpr int FMAX = 256;

/* cos/sin of pairs u*PV .. u*PV+PV-1 at pos, all in double. */
FI_DEV void cos_sin_double(const fi_ops_rope_args &a, double pos, int u, float *cs, float *sn) {
#pragma unroll
    for (int e = 0; e < PV; e++) {
        double s, c;
        sincos(pos * rope_freq(a, u * PV + e), &s, &c);
        cs[e] = (float)c;
        sn[e] = (float)s;
    }
}

/* cos/sin of pairs u*PV .. u*PV+PV-1 at pos: exact angles in f32
 * (fi_rope_sincos, frequencies from freq) for positions below 2^24, else
 * in double. */
FI_DEV void cos_sin(const fi_ops_rope_args &a, double pos, int u, const fi_rope_f *freq, float *cs,
                    float *sn) {
    if (fabs(pos) < 16777216.0) {
#pragma unroll
        for (int e = 0; e < PV; e++) {
            const int i = u * PV + e;
            fi_rope_sincos((int)pos, i < FMAX ? freq[i] : fi_rope_split(rope_freq(a, i)), &sn[e],
                           &cs[e]);
        }
        return;
    }
    cos_sin_double(a, pos, u, cs, sn);
}

/* Pairs u*PV .. u*PV+PV-1 of one head row, from `in` to `out`. */
template <int T>
FI_DEV void rotate(const char *in, int64_t in_dim, char *out, int64_t out_dim, int u, int half,
                   const float *cs, const float *sn) {
    constexpr int ES = fi_dtype_bytes<T>::value;
    if constexpr (VEC && INTER) {
        float x[EV], y[EV];
        fi_load_vec<T, EV>(in + (int64_t)u * EV * ES, x);
#pragma unroll
        for (int e = 0; e < EV / 2; e++) {
            y[2 * e] = x[2 * e] * cs[e] - x[2 * e + 1] * sn[e];
            y[2 * e + 1] = x[2 * e + 1] * cs[e] + x[2 * e] * sn[e];
        }
        store_vec<T, EV>(out + (int64_t)u * EV * ES, y);
    } else if constexpr (VEC) {
        float x1[EV], x2[EV], y1[EV], y2[EV];
        fi_load_vec<T, EV>(in + (int64_t)u * EV * ES, x1);
        fi_load_vec<T, EV>(in + (int64_t)(half + u * EV) * ES, x2);
#pragma unroll
        for (int e = 0; e < EV; e++) {
            y1[e] = x1[e] * cs[e] - x2[e] * sn[e];
            y2[e] = x2[e] * cs[e] + x1[e] * sn[e];
        }
        store_vec<T, EV>(out + (int64_t)u * EV * ES, y1);
        store_vec<T, EV>(out + (int64_t)(half + u * EV) * ES, y2);
    } else {
        const int64_t d1 = INTER ? 2 * u : u, d2 = INTER ? 2 * u + 1 : u + half;
        const float x1 = fi_load_elem<T>(in + d1 * in_dim), x2 = fi_load_elem<T>(in + d2 * in_dim);
        fi_store_elem<T>(out + d1 * out_dim, x1 * cs[0] - x2 * sn[0]);
        fi_store_elem<T>(out + d2 * out_dim, x2 * cs[0] + x1 * sn[0]);
    }
}

/* Tail unit u (elements rotary_dim + u*TV ...) copied unchanged. */
template <int T>
FI_DEV void copy_tail(const char *in, int64_t in_dim, char *out, int64_t out_dim, int u,
                      int rotary_dim) {
    constexpr int ES = fi_dtype_bytes<T>::value;
    const int64_t d = rotary_dim + (int64_t)u * TV;
    if constexpr (VEC) copy16<EV * ES>(out + d * ES, in + d * ES);
    else fi_copy_raw<ES>(out + d * out_dim, in + d * in_dim);
}

/* Position of token t, or -1 when it has none (past indptr[B], or a
 * malformed indptr puts it in no request). */
FI_DEV bool token_position(const fi_ops_rope_args &a, int64_t t, double *pos) {
#if FI_OPS_POSIDS
    *pos = (double)a.pos_ids[t];
    return true;
#else
    /* the last request b in [0, B] with indptr[b] <= t */
    int lo = 0, hi = a.batch; /* indptr[lo] <= t is the invariant once checked */
    if ((int64_t)a.indptr[0] > t) return false;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if ((int64_t)a.indptr[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    if (lo >= a.batch || t >= (int64_t)a.indptr[lo + 1]) return false;
    *pos = (double)a.offsets[lo] + (double)(t - a.indptr[lo]);
    return true;
#endif
}

} // namespace fi_ops

extern "C" __global__ void __launch_bounds__(fi_ops::NT) FI_OPS_NAME(const fi_ops_rope_args a) {
    using namespace fi_ops;
    const walk w = walk_init(a.tpr_log2);
    const int tpr = 1 << a.tpr_log2;
    const int half = a.rotary_dim / 2;
    const int pair_units = half / PV;
    const int tail_units = (a.dim - a.rotary_dim) / TV;
    const int heads = a.heads_q + a.heads_k;
    /* the frequencies of the first FMAX pairs, once per block */
    __shared__ fi_rope_f freq[FMAX];
    for (int i = threadIdx.x; i < half && i < FMAX; i += NT) freq[i] = fi_rope_split(rope_freq(a, i));
    __syncthreads();
    for (int64_t base = w.first; base < a.rows; base += w.step) {
        const int64_t row = base + w.group;
        if (row >= a.rows) continue;
        const int64_t t = row / a.chunks;
        const int h0 = (int)(row % a.chunks) * a.heads_per_unit;
        const int h1 = min(h0 + a.heads_per_unit, heads);
        double pos;
        if (!token_position(a, t, &pos)) continue;
        for (int u = w.sub; u < pair_units + tail_units; u += tpr) {
            if (u < pair_units) {
                float cs[PV], sn[PV];
                cos_sin(a, pos, u, freq, cs, sn);
                for (int h = h0; h < h1; h++) {
                    if (h < a.heads_q)
                        rotate<QT>(a.q + t * a.q_tok + h * a.q_head, a.q_dim,
                                   a.qo + t * a.qo_tok + h * a.qo_head, a.qo_dim, u, half, cs, sn);
                    else
                        rotate<KT>(a.k + t * a.k_tok + (h - a.heads_q) * a.k_head, a.k_dim,
                                   a.ko + t * a.ko_tok + (h - a.heads_q) * a.ko_head, a.ko_dim, u,
                                   half, cs, sn);
                }
            } else {
                const int v = u - pair_units;
                for (int h = h0; h < h1; h++) {
                    if (h < a.heads_q) {
                        if (a.copy_tail_q)
                            copy_tail<QT>(a.q + t * a.q_tok + h * a.q_head, a.q_dim,
                                          a.qo + t * a.qo_tok + h * a.qo_head, a.qo_dim, v,
                                          a.rotary_dim);
                    } else if (a.copy_tail_k) {
                        copy_tail<KT>(a.k + t * a.k_tok + (h - a.heads_q) * a.k_head, a.k_dim,
                                      a.ko + t * a.ko_tok + (h - a.heads_q) * a.ko_head, a.ko_dim,
                                      v, a.rotary_dim);
                    }
                }
            }
        }
    }
}

#else
#error "FI_OPS_KIND must be 1 (merge_state), 2 (merge_states), 3 (append) or 4 (rope)"
#endif
