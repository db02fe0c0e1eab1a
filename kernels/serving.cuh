/*
 * serving.cuh — the row-wise serving ops on the GPU: RMSNorm / LayerNorm
 * (fused residual add, Gemma weights, FP8 output), the gated activations
 * and RoPE from a cos/sin cache. One kernel per compile, chosen by -D
 * constants (src/cuda/serving_ops.c builds the name and the options):
 *
 *   FI_SV_KIND   1 norm, 2 gated activation, 3 RoPE from a cos/sin cache,
 *                9 QK RMSNorm + RoPE from a cos/sin cache
 *   FI_SV_XT FI_SV_RT FI_SV_WT FI_SV_BT FI_SV_OT   norm: input, residual
 *                (-1: none), weight, bias (-1: none), out dtypes (out may be
 *                FP8); act: FI_SV_XT, FI_SV_OT
 *   FI_SV_LAYER  norm: LayerNorm (else RMSNorm)
 *   FI_SV_GEMMA  norm: the weight applied as 1 + w
 *   FI_SV_ACT    act: 0 silu, 1 gelu (erf), 2 gelu (tanh)
 *   FI_SV_QT FI_SV_KT FI_SV_NEOX   rope: q, k dtypes; halves (else GPT-J pairs)
 *   FI_SV_QWT FI_SV_KWT   QK norm: q_weight, k_weight dtypes (FI_SV_GEMMA: 1 + w)
 *   FI_SV_VEC    norm, act: every row contiguous and aligned to 8 elements
 *                (16 bytes; 8 for FP8 out), H (d) a multiple of 8: units of
 *                8 elements with vector loads and stores; else one element
 *                at a time through the strides
 *   FI_SV_NAME   the entry point
 *
 * Semantics are the CPU backend's (src/cpu/ops_norm.c, docs/SEMANTICS.md
 * "Serving ops"). Norms: a row (group of 32 threads, or the whole block for
 * long rows) keeps up to 16 (8) of its values per thread in registers, so
 * input, residual and out are each read or written once, and the next row
 * is loaded before this one is reduced; the rest of a longer row is read
 * again. Sums in f32 in a fixed tree (bitwise the same run after run;
 * within rounding of the CPU's 16-lane sums). The fused add stores the f32
 * sum rounded into the residual and normalises the unrounded sum.
 * Activations: serving_math.cuh's f32 functions (the CPU's formulas with
 * MUFU exponentials: within rounding of its results). RoPE: y = x c - x' s
 * in f32 as the CPU; a token whose position is outside the cache is
 * skipped (the CPU backend refuses it; its rows are not written). QK
 * norm + RoPE: one warp per head row sums its squares (the warp's fixed
 * tree), then each lane reads its pairs and tail dims again (from L1),
 * normalises them in f32 ((x rstd) w, as the CPU), turns the pairs and
 * stores each value once; every value a lane writes it has read itself
 * after the warp's reduction, so in place is safe.
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
#ifndef FI_SV_QWT
#define FI_SV_QWT FI_SV_QT
#endif
#ifndef FI_SV_KWT
#define FI_SV_KWT FI_SV_KT
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
/* Units a thread keeps in registers: 16 values (vector path) or 8 (element
 * path), so rows of up to 16384 (8192) elements are read once by 1024
 * threads. Kept as loaded (raw words, converted at each use), a thread's
 * row and the next row's load fit the 64 registers of a 1024-thread block
 * (ptxas, nvcc 13: no spills); weights are read at each row's stores (from
 * L1/L2: the same for every row). */
constexpr int KEEP = VEC ? 2 : 8;

/* EPU elements of dtype T as loaded: 16-byte (8-byte for FP8) vector
 * words, or one element already in f32 on the element path. */
template <int T>
struct raw {
    static constexpr int ES = fi_dtype_bytes<T>::value;
    static constexpr int W = VEC ? (8 * ES >= 4 ? 8 * ES / 4 : 1) : 1;
    uint32_t w[W];
    FI_DEV void load(const char *p, int64_t col, int64_t u) {
        if constexpr (VEC) {
            const char *q = p + u * 8 * ES;
            if constexpr (W >= 4) {
#pragma unroll
                for (int i = 0; i < W / 4; i++) {
                    const uint4 v = reinterpret_cast<const uint4 *>(q)[i];
                    w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
                }
            } else {
                const uint2 v = *reinterpret_cast<const uint2 *>(q);
                w[0] = v.x, w[1] = v.y;
            }
        } else {
            w[0] = __float_as_uint(fi_load_elem<T>(p + u * col));
        }
    }
    FI_DEV void get(float *v) const {
        if constexpr (VEC) fi_unpack<T, 8>(w, v);
        else v[0] = __uint_as_float(w[0]);
    }
};

/* Two rows' words fit beside the rest in 64 registers: 16 words a row (f32
 * input and residual, 32, spilled). */
constexpr bool AHEAD = KEEP * (raw<XT>::W + (FUSED ? raw<(FUSED ? RT : XT)>::W : 0)) <= 16;

/* The row units a thread owns (sub + k G, k < KEEP): input and, fused,
 * residual as loaded (AHEAD: two rows fit), else their f32 sums (one row:
 * fewer words when both are f32). */
struct row_regs {
    raw<XT> x[AHEAD ? KEEP : 1];
    raw<(FUSED ? RT : XT)> r[AHEAD && FUSED ? KEEP : 1];
    float v[AHEAD ? 1 : KEEP][AHEAD ? 1 : EPU];
};

FI_DEV void load_row(const fi_sv_norm_args &a, const char *xr, const char *rr, int sub_,
                     int units, row_regs &q) {
#pragma unroll
    for (int k = 0; k < KEEP; k++) {
        const int u = sub_ + k * a.group;
        if (u < units) {
            if constexpr (AHEAD) {
                q.x[AHEAD ? k : 0].load(xr, a.x_col, u);
                if constexpr (FUSED) q.r[AHEAD && FUSED ? k : 0].load(rr, a.r_col, u);
            } else {
                load_unit<XT>(xr, a.x_col, u, q.v[AHEAD ? 0 : k]);
                if constexpr (FUSED) {
                    float r[EPU];
                    load_unit<(FUSED ? RT : XT)>(rr, a.r_col, u, r);
#pragma unroll
                    for (int e = 0; e < EPU; e++)
                        q.v[AHEAD ? 0 : k][e] = add(q.v[AHEAD ? 0 : k][e], r[e]);
                }
            }
        }
    }
}

/* Unit k of q: input (+ residual), the unrounded f32 sum (recomputed at each
 * use from what was loaded: the same bits). */
FI_DEV void kept_unit(const row_regs &q, int k, float *v) {
    if constexpr (!AHEAD) {
#pragma unroll
        for (int e = 0; e < EPU; e++) v[e] = q.v[AHEAD ? 0 : k][e];
        return;
    }
    q.x[AHEAD ? k : 0].get(v);
    if constexpr (FUSED) {
        float r[EPU];
        q.r[AHEAD && FUSED ? k : 0].get(r);
#pragma unroll
        for (int e = 0; e < EPU; e++) v[e] = add(v[e], r[e]);
    }
}

/* Unit u of a row read from memory (past the kept units). */
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

/* Unit u normalised by weights w (and bias b) and stored (residual first,
 * when fused). */
FI_DEV void row_out(const fi_sv_norm_args &a, char *rr, char *orow, int64_t u, const float *v,
                    const float *w, const float *b, float mean, float rstd) {
    if constexpr (FUSED) store_unit<(FUSED ? RT : XT)>(rr, a.r_col, u, v);
    float y[EPU];
#pragma unroll
    for (int e = 0; e < EPU; e++) {
        const float we = GEMMA ? add(1.0f, w[e]) : w[e];
        y[e] = LAYER ? mul(mul(sub(v[e], mean), rstd), we) : mul(mul(v[e], rstd), we);
        if constexpr (BT >= 0) y[e] = add(y[e], b[e]);
        if constexpr (FP8_OUT) y[e] = mul(y[e], a.inv_scale);
    }
    store_unit<OT>(orow, a.o_col, u, y);
}

/* Unit u's weights (and bias) read from memory. */
FI_DEV void wb_unit(const fi_sv_norm_args &a, int64_t u, float *w, float *b) {
    load_unit<WT>(a.w, a.w_col, u, w);
    if constexpr (BT >= 0) load_unit<(BT >= 0 ? BT : XT)>(a.b, a.b_col, u, b);
}

} // namespace fi_sv

namespace fi_sv {

/* Byte offset of row r in a tensor of leading byte strides st: one stride
 * (FITS) or through the leading dims. */
template <bool FITS>
FI_DEV int64_t norm_row(const fi_sv_norm_args &a, const int64_t *st, int64_t r) {
    return FITS ? r * st[0] : row_offset(a.lead, st, a.nlead, r);
}

/* A group of G threads (a warp, or the whole block) per row, the grid
 * striding over the rows with the same thread-to-unit map. FITS: the row is
 * all in the group's registers (units <= KEEP G) and the rows are at one
 * stride; then row r + stride is loaded before row r is reduced, so that
 * load is in flight through the reduction's syncs and the stores, where a
 * row at a time leaves the memory idle between rows. Otherwise no
 * registers are left to load ahead (the 64-bit divisions of a row's
 * offset through several dims need theirs: ptxas spilled): a longer row
 * reads its units past the kept ones again. */
template <bool FITS>
FI_DEV void norm_rows(const fi_sv_norm_args &a, float *red) {
    const int G = a.group, sub_ = threadIdx.x % G;
    const int units = (int)(a.hidden / EPU); /* hidden < 2^31 (serving_ops.c) */
    const int64_t step = (int64_t)gridDim.x * (blockDim.x / G);
    const float h = (float)a.hidden;
    /* a group's rows are uniform across it (a whole block when G > 32) */
    int64_t r = (int64_t)blockIdx.x * (blockDim.x / G) + threadIdx.x / G;
    row_regs cur;
    if (FITS && r < a.rows)
        load_row(a, a.x + norm_row<FITS>(a, a.x_lead, r),
                 FUSED ? a.res + norm_row<FITS>(a, a.r_lead, r) : nullptr, sub_, units,
                 cur);
    for (; r < a.rows; r += step) {
        const char *xr = a.x + norm_row<FITS>(a, a.x_lead, r);
        char *rr = FUSED ? a.res + norm_row<FITS>(a, a.r_lead, r) : nullptr;
        char *orow = a.out + norm_row<FITS>(a, a.o_lead, r);
        row_regs nxt;
        if (!FITS)
            load_row(a, xr, rr, sub_, units, cur);
        else if (r + step < a.rows)
            load_row(a, a.x + norm_row<FITS>(a, a.x_lead, r + step),
                     FUSED ? a.res + norm_row<FITS>(a, a.r_lead, r + step) : nullptr,
                     sub_, units, nxt);
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < KEEP; k++) {
            if (sub_ + k * G < units) {
                float v[EPU];
                kept_unit(cur, k, v);
#pragma unroll
                for (int e = 0; e < EPU; e++) acc += LAYER ? v[e] : v[e] * v[e];
            }
        }
        if (!FITS)
            for (int u = sub_ + KEEP * G; u < units; u += G) {
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
                if (sub_ + k * G < units) {
                    float v[EPU];
                    kept_unit(cur, k, v);
#pragma unroll
                    for (int e = 0; e < EPU; e++) {
                        const float d = v[e] - mean;
                        acc += d * d;
                    }
                }
            }
            if (!FITS)
                for (int u = sub_ + KEEP * G; u < units; u += G) {
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
            const int u = sub_ + k * G;
            if (u < units) {
                float v[EPU], w[EPU], b[EPU];
                kept_unit(cur, k, v);
                wb_unit(a, u, w, b);
                row_out(a, rr, orow, u, v, w, b, mean, rstd);
            }
        }
        if (!FITS)
            for (int u = sub_ + KEEP * G; u < units; u += G) {
                float v[EPU], w[EPU], b[EPU];
                row_unit(a, xr, rr, u, v);
                wb_unit(a, u, w, b);
                row_out(a, rr, orow, u, v, w, b, mean, rstd);
            }
        if (FITS) cur = nxt;
    }
}

} // namespace fi_sv

extern "C" __global__ void __launch_bounds__(1024) FI_SV_NAME(const fi_sv_norm_args a) {
    using namespace fi_sv;
    __shared__ float red[32];
    if (AHEAD && a.nlead == 1 && a.hidden / EPU <= (int64_t)KEEP * a.group) norm_rows<AHEAD>(a, red);
    else norm_rows<false>(a, red);
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

/* ============================================== QK RMSNorm + RoPE cache */
#elif FI_SV_KIND == 9

namespace fi_sv {

template <int WT>
FI_DEV float weight_at(const char *w, int64_t col, int64_t d) {
    const float v = fi_load_elem<WT>(w + d * col);
    return FI_SV_GEMMA ? add(1.0f, v) : v;
}

/* Head row `in` [dim] normalised by w and turned by cs into `out`, by the
 * 32 lanes of one warp. */
template <int T, int WT>
FI_DEV void norm_rope_row(const fi_sv_rope_args &a, const char *in, int64_t in_dim, char *out,
                          int64_t out_dim, const char *w, int64_t w_col, const float *cs,
                          int lane) {
    float ss = 0.0f;
#pragma unroll 4
    for (int d = lane; d < a.dim; d += 32) {
        const float x = fi_load_elem<T>(in + d * in_dim);
        ss = add(ss, mul(x, x));
    }
    ss = warp_sum(ss); /* every lane has read its values before any lane writes */
    const float rstd = 1.0f / sqrtf(ss / (float)a.dim + a.eps);
    const int half = a.rot / 2;
#pragma unroll 2
    for (int i = lane; i < half; i += 32) {
        const int64_t d1 = FI_SV_NEOX ? i : 2 * i, d2 = FI_SV_NEOX ? i + half : 2 * i + 1;
        const float c = cs[(int64_t)i * a.cache_col], s = cs[(int64_t)(half + i) * a.cache_col];
        const float x1 = mul(mul(fi_load_elem<T>(in + d1 * in_dim), rstd), weight_at<WT>(w, w_col, d1));
        const float x2 = mul(mul(fi_load_elem<T>(in + d2 * in_dim), rstd), weight_at<WT>(w, w_col, d2));
        fi_store_elem<T>(out + d1 * out_dim, sub(mul(x1, c), mul(x2, s)));
        fi_store_elem<T>(out + d2 * out_dim, add(mul(x2, c), mul(x1, s)));
    }
#pragma unroll 1
    for (int d = a.rot + lane; d < a.dim; d += 32) {
        const float x = fi_load_elem<T>(in + d * in_dim);
        fi_store_elem<T>(out + d * out_dim, mul(mul(x, rstd), weight_at<WT>(w, w_col, d)));
    }
}

} // namespace fi_sv

/* blockIdx.y strides over tokens, the block's 8 warps (and blockIdx.x)
 * over the token's q heads then k heads. */
extern "C" __global__ void __launch_bounds__(256) FI_SV_NAME(const fi_sv_rope_args a) {
    using namespace fi_sv;
    const int lane = threadIdx.x & 31;
    const int64_t heads = (int64_t)a.heads_q + a.heads_k;
    for (int64_t t = blockIdx.y; t < a.nnz; t += gridDim.y) {
        const int32_t p = a.pos[t * a.pos_st];
        if (p < 0 || p >= a.max_pos) continue; /* no row of the cache: skipped */
        const float *cs = a.cache + p * a.cache_row;
        for (int64_t h = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5); h < heads;
             h += (int64_t)gridDim.x * 8) {
            if (h < a.heads_q)
                norm_rope_row<FI_SV_QT, FI_SV_QWT>(a, a.q + t * a.q_tok + h * a.q_head, a.q_dim,
                                                   a.qo + t * a.qo_tok + h * a.qo_head, a.qo_dim,
                                                   a.qw, a.qw_col, cs, lane);
            else
                norm_rope_row<FI_SV_KT, FI_SV_KWT>(
                    a, a.k + t * a.k_tok + (h - a.heads_q) * a.k_head, a.k_dim,
                    a.ko + t * a.ko_tok + (h - a.heads_q) * a.ko_head, a.ko_dim, a.kw, a.kw_col,
                    cs, lane);
        }
    }
}

#else
#error "FI_SV_KIND must be 1 (norm), 2 (gated activation), 3 (RoPE from a cos/sin cache) or 9 (QK RMSNorm + RoPE)"
#endif
