/*
 * serving.cuh — the row-wise serving ops on the GPU: RMSNorm / LayerNorm
 * (fused residual add, Gemma weights, FP8 output), the gated activations
 * and RoPE from a cos/sin cache. One kernel per compile, chosen by -D
 * constants (src/cuda/serving_ops.c builds the name and the options):
 *
 *   FI_SV_KIND   1 norm, 2 gated activation, 3 RoPE from a cos/sin cache
 *   FI_SV_XT FI_SV_RT FI_SV_WT FI_SV_BT FI_SV_OT   norm: input, residual
 *                (-1: none), weight, bias (-1: none), out dtypes (out may be
 *                FP8); act: FI_SV_XT, FI_SV_OT
 *   FI_SV_LAYER  norm: LayerNorm (else RMSNorm)
 *   FI_SV_GEMMA  norm: the weight applied as 1 + w
 *   FI_SV_ACT    act: 0 silu, 1 gelu (erf), 2 gelu (tanh)
 *   FI_SV_QT FI_SV_KT FI_SV_NEOX   rope: q, k dtypes; halves (else GPT-J pairs)
 *   FI_SV_VEC    norm, act: every row contiguous and aligned to 8 elements
 *                (16 bytes; 8 for FP8 out), H (d) a multiple of 8: units of
 *                8 elements with vector loads and stores; else one element
 *                at a time through the strides
 *   FI_SV_NAME   the entry point
 *
 * Semantics are the CPU backend's (src/cpu/ops_norm.c, docs/SEMANTICS.md
 * "Serving ops"). Norms: a row (group of 32 threads, or the whole block for
 * long rows) keeps up to 16 (8) of its f32 values per thread in registers, so
 * input, residual and out are each read or written once; the rest of a
 * longer row is read again. Sums in f32 in a fixed tree (bitwise the same
 * run after run; within rounding of the CPU's 16-lane sums). The fused add
 * stores the f32 sum rounded into the residual and normalises the
 * unrounded sum. Activations: serving_math.cuh's f32 functions, the CPU's
 * bits. RoPE: y = x c - x' s in f32 as the CPU; a token whose position is
 * outside the cache is skipped (the CPU backend refuses it; its rows are
 * not written).
 */
#include "serving_math.cuh"

#ifndef FI_SV_NAME
#define FI_SV_NAME fi_sv_default
#endif
#ifndef FI_SV_KIND
#define FI_SV_KIND 1
#endif
#ifndef FI_SV_XT
#define FI_SV_XT FI_T_BF16
#endif
#ifndef FI_SV_RT
#define FI_SV_RT -1
#endif
#ifndef FI_SV_WT
#define FI_SV_WT FI_SV_XT
#endif
#ifndef FI_SV_BT
#define FI_SV_BT -1
#endif
#ifndef FI_SV_OT
#define FI_SV_OT FI_SV_XT
#endif
#ifndef FI_SV_LAYER
#define FI_SV_LAYER 0
#endif
#ifndef FI_SV_GEMMA
#define FI_SV_GEMMA 0
#endif
#ifndef FI_SV_ACT
#define FI_SV_ACT 0
#endif
#ifndef FI_SV_QT
#define FI_SV_QT FI_T_BF16
#endif
#ifndef FI_SV_KT
#define FI_SV_KT FI_SV_QT
#endif
#ifndef FI_SV_NEOX
#define FI_SV_NEOX 1
#endif
#ifndef FI_SV_VEC
#define FI_SV_VEC 1
#endif

namespace fi_sv {

constexpr bool VEC = FI_SV_VEC != 0;
constexpr int EPU = VEC ? 8 : 1; /* elements per unit */

/* EPU elements of dtype T at element u * EPU of a row (p its start, col
 * the byte step between elements), as f32. */
template <int T>
FI_DEV void load_unit(const char *p, int64_t col, int64_t u, float *v) {
    constexpr int ES = fi_dtype_bytes<T>::value;
    if constexpr (VEC) fi_load_vec<T, 8>(p + u * 8 * ES, v);
    else v[0] = fi_load_elem<T>(p + u * col);
}

template <int T>
FI_DEV void store_unit(char *p, int64_t col, int64_t u, const float *v) {
    constexpr int ES = fi_dtype_bytes<T>::value;
    if constexpr (VEC) store8<T>(p + u * 8 * ES, v);
    else store<T>(p + u * col, v[0]);
}

} // namespace fi_sv

/* ================================================================ norms */
#if FI_SV_KIND == 1

namespace fi_sv {

constexpr int XT = FI_SV_XT, RT = FI_SV_RT, WT = FI_SV_WT, BT = FI_SV_BT, OT = FI_SV_OT;
constexpr bool FUSED = RT >= 0, LAYER = FI_SV_LAYER != 0, GEMMA = FI_SV_GEMMA != 0;
constexpr bool FP8_OUT = OT == FI_T_E4M3 || OT == FI_T_E5M2;
/* Units a thread keeps in registers: 16 f32 values (vector path) or 8
 * (element path), so rows of up to 16384 (8192) elements are read once by
 * 1024 threads; more did not fit the 64 registers of a 1024-thread block
 * without spills (ptxas, nvcc 13). */
constexpr int KEEP = VEC ? 2 : 8;

/* Unit u of a row: input (+ residual), the unrounded f32 sum. */
FI_DEV void row_unit(const fi_sv_norm_args &a, const char *xr, const char *rr, int64_t u,
                     float *v) {
    load_unit<XT>(xr, a.x_col, u, v);
    if constexpr (FUSED) {
        float r[EPU];
        load_unit<(FUSED ? RT : XT)>(rr, a.r_col, u, r);
#pragma unroll
        for (int e = 0; e < EPU; e++) v[e] = add(v[e], r[e]);
    }
}

/* Unit u normalised and stored (residual first, when fused). */
FI_DEV void row_out(const fi_sv_norm_args &a, char *rr, char *orow, int64_t u, const float *v,
                    float mean, float rstd) {
    if constexpr (FUSED) store_unit<(FUSED ? RT : XT)>(rr, a.r_col, u, v);
    float w[EPU], b[EPU], y[EPU];
    load_unit<WT>(a.w, a.w_col, u, w);
    if constexpr (BT >= 0) load_unit<(BT >= 0 ? BT : XT)>(a.b, a.b_col, u, b);
#pragma unroll
    for (int e = 0; e < EPU; e++) {
        const float we = GEMMA ? add(1.0f, w[e]) : w[e];
        y[e] = LAYER ? mul(mul(sub(v[e], mean), rstd), we) : mul(mul(v[e], rstd), we);
        if constexpr (BT >= 0) y[e] = add(y[e], b[e]);
        if constexpr (FP8_OUT) y[e] = mul(y[e], a.inv_scale);
    }
    store_unit<OT>(orow, a.o_col, u, y);
}

} // namespace fi_sv

extern "C" __global__ void __launch_bounds__(1024) FI_SV_NAME(const fi_sv_norm_args a) {
    using namespace fi_sv;
    __shared__ float red[32];
    const int G = a.group, sub_ = threadIdx.x % G;
    const int per_block = blockDim.x / G;
    const int64_t units = a.hidden / EPU;
    const float h = (float)a.hidden;
    /* a group's rows are uniform across it (a whole block when G > 32) */
    for (int64_t r = (int64_t)blockIdx.x * per_block + threadIdx.x / G; r < a.rows;
         r += (int64_t)gridDim.x * per_block) {
        const char *xr = a.x + row_offset(a.lead, a.x_lead, a.nlead, r);
        char *rr = FUSED ? a.res + row_offset(a.lead, a.r_lead, a.nlead, r) : nullptr;
        char *orow = a.out + row_offset(a.lead, a.o_lead, a.nlead, r);
        float keep[KEEP][EPU];
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < KEEP; k++) {
            const int64_t u = sub_ + (int64_t)k * G;
            if (u < units) {
                row_unit(a, xr, rr, u, keep[k]);
#pragma unroll
                for (int e = 0; e < EPU; e++) acc += LAYER ? keep[k][e] : keep[k][e] * keep[k][e];
            }
        }
        for (int64_t u = sub_ + (int64_t)KEEP * G; u < units; u += G) {
            float v[EPU];
            row_unit(a, xr, rr, u, v);
#pragma unroll
            for (int e = 0; e < EPU; e++) acc += LAYER ? v[e] : v[e] * v[e];
        }
        float total = group_sum(acc, G, red), mean = 0.0f;
        if constexpr (LAYER) { /* the squared deviations, as the CPU: a second sum */
            mean = total / h;
            acc = 0.0f;
#pragma unroll
            for (int k = 0; k < KEEP; k++) {
                const int64_t u = sub_ + (int64_t)k * G;
                if (u < units)
#pragma unroll
                    for (int e = 0; e < EPU; e++) {
                        const float d = keep[k][e] - mean;
                        acc += d * d;
                    }
            }
            for (int64_t u = sub_ + (int64_t)KEEP * G; u < units; u += G) {
                float v[EPU];
                row_unit(a, xr, rr, u, v);
#pragma unroll
                for (int e = 0; e < EPU; e++) {
                    const float d = v[e] - mean;
                    acc += d * d;
                }
            }
            total = group_sum(acc, G, red);
        }
        const float rstd = 1.0f / sqrtf(total / h + a.eps);
        /* in place, out (and the residual) alias what was read: each unit is
         * read and written by the thread that owns it */
#pragma unroll
        for (int k = 0; k < KEEP; k++) {
            const int64_t u = sub_ + (int64_t)k * G;
            if (u < units) row_out(a, rr, orow, u, keep[k], mean, rstd);
        }
        for (int64_t u = sub_ + (int64_t)KEEP * G; u < units; u += G) {
            float v[EPU];
            row_unit(a, xr, rr, u, v);
            row_out(a, rr, orow, u, v, mean, rstd);
        }
    }
}

/* ========================================================== activations */
#elif FI_SV_KIND == 2

extern "C" __global__ void __launch_bounds__(256) FI_SV_NAME(const fi_sv_act_args a) {
    using namespace fi_sv;
    constexpr int XT = FI_SV_XT, OT = FI_SV_OT, ES = fi_dtype_bytes<XT>::value;
    const int64_t units = a.dim / EPU;
    for (int64_t r = blockIdx.y; r < a.rows; r += gridDim.y) {
        const char *xr = a.x + row_offset(a.lead, a.x_lead, a.nlead, r);
        char *orow = a.out + row_offset(a.lead, a.o_lead, a.nlead, r);
        /* the up half: element d on */
        const char *ur = VEC ? xr + a.dim * ES : xr + a.dim * a.x_col;
        for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < units;
             u += (int64_t)gridDim.x * blockDim.x) {
            float g[EPU], up[EPU], y[EPU];
            load_unit<XT>(xr, a.x_col, u, g);
            load_unit<XT>(ur, a.x_col, u, up);
#pragma unroll
            for (int e = 0; e < EPU; e++) y[e] = gated<FI_SV_ACT>(g[e], up[e]);
            store_unit<OT>(orow, a.o_col, u, y);
        }
    }
}

/* =========================================================== RoPE cache */
#elif FI_SV_KIND == 3

namespace fi_sv {

/* Pair i (or, past the pairs, tail element rot + i - half) of one head row. */
template <int T>
FI_DEV void rope_unit(const char *in, int64_t in_dim, char *out, int64_t out_dim, int i,
                      int half, int rot, const float *cs, int64_t cs_col) {
    if (i >= half) {
        const int64_t d = rot + (i - half);
        fi_copy_raw<fi_dtype_bytes<T>::value>(out + d * out_dim, in + d * in_dim);
        return;
    }
    const int64_t d1 = FI_SV_NEOX ? i : 2 * i, d2 = FI_SV_NEOX ? i + half : 2 * i + 1;
    const float c = cs[(int64_t)i * cs_col], s = cs[(int64_t)(half + i) * cs_col];
    const float x1 = fi_load_elem<T>(in + d1 * in_dim), x2 = fi_load_elem<T>(in + d2 * in_dim);
    fi_store_elem<T>(out + d1 * out_dim, sub(mul(x1, c), mul(x2, s)));
    fi_store_elem<T>(out + d2 * out_dim, add(mul(x2, c), mul(x1, s)));
}

} // namespace fi_sv

extern "C" __global__ void __launch_bounds__(256) FI_SV_NAME(const fi_sv_rope_args a) {
    using namespace fi_sv;
    const int half = a.rot / 2, tail = a.dim - a.rot;
    const int per_q = half + (a.copy_tail_q ? tail : 0), per_k = half + (a.copy_tail_k ? tail : 0);
    const int64_t units = (int64_t)a.heads_q * per_q + (int64_t)a.heads_k * per_k;
    for (int64_t t = blockIdx.y; t < a.nnz; t += gridDim.y) {
        const int32_t p = a.pos[t * a.pos_st];
        if (p < 0 || p >= a.max_pos) continue; /* no row of the cache: skipped */
        const float *cs = a.cache + p * a.cache_row;
        for (int64_t f = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; f < units;
             f += (int64_t)gridDim.x * blockDim.x) {
            if (f < (int64_t)a.heads_q * per_q) {
                const int h = (int)(f / per_q), i = (int)(f % per_q);
                rope_unit<FI_SV_QT>(a.q + t * a.q_tok + h * a.q_head, a.q_dim,
                                    a.qo + t * a.qo_tok + h * a.qo_head, a.qo_dim, i, half,
                                    a.rot, cs, a.cache_col);
            } else {
                const int64_t g = f - (int64_t)a.heads_q * per_q;
                const int h = (int)(g / per_k), i = (int)(g % per_k);
                rope_unit<FI_SV_KT>(a.k + t * a.k_tok + h * a.k_head, a.k_dim,
                                    a.ko + t * a.ko_tok + h * a.ko_head, a.ko_dim, i, half,
                                    a.rot, cs, a.cache_col);
            }
        }
    }
}

#else
#error "FI_SV_KIND must be 1 (norm), 2 (gated activation) or 3 (RoPE from a cos/sin cache)"
#endif
