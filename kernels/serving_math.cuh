/*
 * serving_math.cuh — what the serving-op kernels share (kernels/serving.cuh,
 * select.cuh, sampling.cuh): rows of [rows..., H] tensors, stores of f32 as
 * any dtype (FP8 too), the CPU backend's f32 functions (exp, tanh, 1 + erf,
 * the gated activations: src/cpu/serving_kern.h), order-preserving keys of
 * floats, Philox4x32-10 (src/core/serving.h) and block reductions.
 *
 * Bit for bit with the CPU: every formula the CPU evaluates in a fixed
 * order of f32 operations is written here with the round-to-nearest
 * intrinsics (__fadd_rn, __fmul_rn, __fdiv_rn), which the compiler never
 * contracts into an FMA or reorders, in the CPU's order; so sk_exp gives
 * the CPU's bits, and the sampling weights and sums built from it do too
 * (docs/CUDA_KERNELS.md, "Serving ops"). The gated activations are the
 * exception: the CPU's formulas at MUFU speed, within rounding of its
 * results (they would be compute-bound otherwise).
 */
#ifndef FI_SERVING_MATH_CUH
#define FI_SERVING_MATH_CUH

#include "prelude.cuh"
#include "serving_args.h"

namespace fi_sv {

/* ------------------------------------------------------------------ rows */

/* Byte offset of row r of a tensor whose leading dims (extents lead, byte
 * strides st, outermost first) index its rows row-major. */
FI_DEV int64_t row_offset(const int64_t *lead, const int64_t *st, int nlead, int64_t r) {
    int64_t off = 0;
    for (int d = nlead - 1; d >= 0; d--) {
        const int64_t n = lead[d];
        off += (r % n) * st[d];
        r /= n;
    }
    return off;
}

/* ------------------------------------------------------- exact f32 maths */

FI_DEV float add(float a, float b) { return __fadd_rn(a, b); }
FI_DEV float sub(float a, float b) { return __fsub_rn(a, b); }
FI_DEV float mul(float a, float b) { return __fmul_rn(a, b); }
FI_DEV float dvd(float a, float b) { return __fdiv_rn(a, b); }
/* serving_kern.h's sk_min / sk_max (a NaN in a is kept, in b ignored) */
FI_DEV float vmin(float a, float b) { return b < a ? b : a; }
FI_DEV float vmax(float a, float b) { return b > a ? b : a; }

/* sk_exp: x clamped to [-88, 88] on its bits as integers, x = k ln2 + r,
 * e^r by a degree-5 polynomial in FMAs (the CPU's fmaf), 2^k by the
 * exponent bits (k + 127 = 0 below about -87.68: 0); a NaN gives 0 or
 * e^88 by its sign, as there. */
FI_DEV float sv_exp(float x) {
    const float log2e = 1.44269504f, ln2_hi = 0.693147182f, ln2_lo = -1.90465421e-9f;
    const float round = 12582912.0f;
    const int32_t hi = (int32_t)__float_as_uint(88.0f);
    const uint32_t lo = __float_as_uint(-88.0f);
    const int32_t xs = min((int32_t)__float_as_uint(x), hi);
    const float xc = __uint_as_float(min((uint32_t)xs, lo));
    const float t = __fmaf_rn(xc, log2e, round);
    const float kf = sub(t, round);
    const float r = __fmaf_rn(-kf, ln2_lo, __fmaf_rn(-kf, ln2_hi, xc));
    float p = 0x1.0fa832p-7f;
    p = __fmaf_rn(p, r, 0x1.573a54p-5f);
    p = __fmaf_rn(p, r, 0x1.555a6ap-3f);
    p = __fmaf_rn(p, r, 0x1.fffdc6p-2f);
    p = __fmaf_rn(p, r, 0x1.fffff6p-1f);
    p = __fmaf_rn(p, r, 1.0f);
    return mul(p, __uint_as_float((__float_as_uint(t) - __float_as_uint(round) + 127u) << 23));
}

/* The gated activations' f32 functions: the CPU's formulas (the same
 * Abramowitz-Stegun erf, tanh through e^2y) with e^x by the MUFU's 2^x and
 * approximate divisions, contracted into FMAs. Exact intrinsics would cost
 * ~50 instructions an element, more than the SM issues in the time its
 * bytes take to stream at the copy ceiling (H200: ~45); these cost ~12.
 * Within 1e-6 relative of the CPU's for |x| <= 20 (the tests' f32
 * tolerance is 2e-5); a NaN stays NaN. */
FI_DEV float act_exp(float x) { return fi_exp2(x * 1.44269504f); }

FI_DEV float act_tanh(float y) { return 1.0f - __fdividef(2.0f, act_exp(2.0f * y) + 1.0f); }

/* 1 + erf(z) by Abramowitz and Stegun 7.1.26 on |z| (sk_one_plus_erf). */
FI_DEV float act_one_plus_erf(float z) {
    const float a = fabsf(z);
    const float t = __fdividef(1.0f, 1.0f + 0.3275911f * a);
    float poly = 1.061405429f;
    poly = poly * t - 1.453152027f;
    poly = poly * t + 1.421413741f;
    poly = poly * t - 0.284496736f;
    poly = poly * t + 0.254829592f;
    const float erfc = poly * t * act_exp(-a * a);
    return z < 0.0f ? erfc : 2.0f - erfc;
}

/* act(a) * b for fi_act_kind 0 silu, 1 gelu (erf), 2 gelu (tanh). */
template <int KIND>
FI_DEV float gated(float a, float b) {
    if constexpr (KIND == 0) {
        return __fdividef(a, 1.0f + act_exp(-a)) * b;
    } else if constexpr (KIND == 1) {
        return 0.5f * a * act_one_plus_erf(a * 0.707106781f) * b;
    } else {
        const float inner = 0.797884561f * (a + 0.044715f * a * a * a);
        return 0.5f * a * (1.0f + act_tanh(inner)) * b;
    }
}

/* FP8 of v (already scaled), saturated to the largest finite value and
 * rounded to nearest even, NaN 0x7f: serving_kern.h's to_fp8. */
FI_DEV uint32_t to_fp8(float v, bool e5m2) {
    const float fmax = e5m2 ? 57344.0f : 448.0f;
    const float min_normal = e5m2 ? 0x1p-14f : 0x1p-6f;
    const float sub_scale = e5m2 ? 0x1p16f : 0x1p9f;
    const uint32_t shift = e5m2 ? 21 : 20;
    const uint32_t rebias = e5m2 ? (127u - 15u) << 2 : (127u - 7u) << 3;
    const float c = vmax(vmin(v, fmax), -fmax);
    const uint32_t u = __float_as_uint(c);
    const uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    const uint32_t rounded = a + ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u);
    const uint32_t normal = (rounded >> shift) - rebias;
    const float af = __uint_as_float(a), small = vmin(af, min_normal);
    const uint32_t subn =
        (uint32_t)(int32_t)sub(add(mul(small, sub_scale), 12582912.0f), 12582912.0f);
    const uint32_t code = af < min_normal ? subn : normal;
    return v != v ? 0x7fu : (code | sign);
}

/* FP8 codes of lo and hi (already scaled) in the low 16 bits, lo first:
 * to_fp8's codes. From sm_89 one cvt.rn.satfinite for the pair (the same
 * rounding and saturation; an infinity saturates too), its NaN made 0x7f
 * (the hardware keeps a NaN's sign); before, to_fp8 (about 20 instructions
 * a value). */
template <bool E5M2>
FI_DEV uint32_t fp8x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint16_t r;
    if constexpr (E5M2)
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    else
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    const uint32_t a = lo != lo ? 0x7fu : r & 0xffu, b = hi != hi ? 0x7fu : (uint32_t)r >> 8;
    return a | b << 8;
#else
    return to_fp8(lo, E5M2) | to_fp8(hi, E5M2) << 8;
#endif
}

/* --------------------------------------------------------------- stores */

/* One f32 value stored as dtype T (f32, f16, bf16, e4m3, e5m2; FP8 as
 * to_fp8 of the value as it is). */
template <int T>
FI_DEV void store(char *p, float x) {
    if constexpr (T == FI_T_E4M3 || T == FI_T_E5M2)
        *reinterpret_cast<uint8_t *>(p) = (uint8_t)to_fp8(x, T == FI_T_E5M2);
    else
        fi_store_elem<T>(p, x);
}

/* 8 values stored as dtype T at p (aligned to 8 elements' bytes, at most 16). */
template <int T>
FI_DEV void store8(char *p, const float *x) {
    if constexpr (T == FI_T_F32) {
        uint4 a, b;
        a.x = __float_as_uint(x[0]), a.y = __float_as_uint(x[1]);
        a.z = __float_as_uint(x[2]), a.w = __float_as_uint(x[3]);
        b.x = __float_as_uint(x[4]), b.y = __float_as_uint(x[5]);
        b.z = __float_as_uint(x[6]), b.w = __float_as_uint(x[7]);
        reinterpret_cast<uint4 *>(p)[0] = a;
        reinterpret_cast<uint4 *>(p)[1] = b;
    } else if constexpr (T == FI_T_F16 || T == FI_T_BF16) {
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t lo = T == FI_T_F16 ? fi_f32_to_f16(x[2 * i]) : fi_f32_to_bf16(x[2 * i]);
            const uint32_t hi =
                T == FI_T_F16 ? fi_f32_to_f16(x[2 * i + 1]) : fi_f32_to_bf16(x[2 * i + 1]);
            w[i] = lo | hi << 16;
        }
        uint4 v;
        v.x = w[0], v.y = w[1], v.z = w[2], v.w = w[3];
        *reinterpret_cast<uint4 *>(p) = v;
    } else {
        constexpr bool E5M2 = T == FI_T_E5M2;
        uint2 v;
        v.x = fp8x2<E5M2>(x[0], x[1]) | fp8x2<E5M2>(x[2], x[3]) << 16;
        v.y = fp8x2<E5M2>(x[4], x[5]) | fp8x2<E5M2>(x[6], x[7]) << 16;
        *reinterpret_cast<uint2 *>(p) = v;
    }
}

/* --------------------------------------------------------------- keys */

/* Order-preserving key of a float (-0 as +0, every NaN above +inf), and
 * back: the CPU's key_of / value_of. */
FI_DEV uint32_t key_of(float f) {
    uint32_t u = __float_as_uint(f);
    u = u == 0x80000000u ? 0u : u;
    const uint32_t key = u ^ ((uint32_t)((int32_t)u >> 31) | 0x80000000u);
    return (u & 0x7fffffffu) > 0x7f800000u ? 0xffffffffu : key;
}
FI_DEV float value_of(uint32_t key) {
    return __uint_as_float(key & 0x80000000u ? key & 0x7fffffffu : ~key);
}

/* ------------------------------------------------------------- Philox */

/* fi_uniform of src/core/serving.h: Philox4x32-10 keyed by the seed,
 * counter (offset low, offset high, row, draw), its first 53 bits / 2^53. */
FI_DEV double uniform(uint64_t seed, uint64_t offset, uint32_t row, uint32_t draw) {
    uint32_t c0 = (uint32_t)offset, c1 = (uint32_t)(offset >> 32), c2 = row, c3 = draw;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
#pragma unroll
    for (int i = 0; i < 10; i++) {
        const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0, c1 = (uint32_t)p1, c2 = n2, c3 = (uint32_t)p0;
        k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
    }
    const uint64_t bits = ((uint64_t)c0 << 32 | c1) >> 11;
    return (double)bits * 0x1p-53;
}

/* --------------------------------------------------------- reductions */

FI_DEV float warp_sum(float v) {
#pragma unroll
    for (int s = 16; s; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
    return v;
}

/* The sum over a group of G threads: a warp (G = 32) or the whole block
 * (G = blockDim.x, every thread calls it; red holds a float per warp). */
FI_DEV float group_sum(float v, int group, float *red) {
    v = warp_sum(v);
    if (group <= 32) return v;
    const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    __syncthreads(); /* red's last use is over */
    if ((threadIdx.x & 31) == 0) red[warp] = v;
    __syncthreads();
    float t = (threadIdx.x & 31) < warps ? red[threadIdx.x & 31] : 0.0f;
    return warp_sum(t);
}

} // namespace fi_sv

#endif /* FI_SERVING_MATH_CUH */
