/*
 * prelude.cuh — the only thing kernel sources include: fixed-width types
 * (by hand under NVRTC, which has no libc headers), dtype conversions in
 * inline PTX or bit operations, 16-byte cp.async, and small math helpers.
 * Shared verbatim by nvcc (CI, AOT) and NVRTC (the library's JIT).
 */
#ifndef FI_PRELUDE_CUH
#define FI_PRELUDE_CUH

#ifdef __CUDACC_RTC__
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif

#include "fi_args.h"

/* dtype codes: the values of fi_dtype in include/flashinfer.h */
#define FI_T_F32 0
#define FI_T_F16 1
#define FI_T_BF16 2
#define FI_T_E4M3 3
#define FI_T_E5M2 4

#define FI_DEV __device__ __forceinline__
#define FI_NEG_INF (__int_as_float(0xff800000))
#define FI_POS_INF (__int_as_float(0x7f800000))
#define FI_NAN (__int_as_float(0x7fc00000))

/* Whether x is finite (not NaN, not an infinity). */
FI_DEV bool fi_finite(float x) { return fabsf(x) < FI_POS_INF; }

/* Programmatic dependent launch (sm_90 on; the host launches the attention
 * kernels with it there, src/cuda/run.c). fi_pdl_launch_dependents: the
 * next kernel in the stream may start its CTAs once every CTA of this grid
 * has said so or ended (they then wait in fi_pdl_wait while this grid
 * finishes: their launch and first loads overlap its tail).
 * fi_pdl_wait: returns once the grid before this one in the stream has
 * completed and its writes are visible; nothing of the caller's tensors or
 * of the plan's scratch (partial rows, merge counts) may be touched before
 * it. Every CTA calls it, before it may end: a grid then never completes
 * ahead of the grid it follows. No-ops in a launch without the attribute. */
FI_DEV void fi_pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
FI_DEV void fi_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* The plan's last upload has been read (this launch follows its copy in
 * the stream): its number, written to a pinned host word, lets the host
 * rewrite its staging without a driver call (src/cuda/plan.c). One store,
 * by one thread of the launch, after fi_pdl_wait. */
FI_DEV void fi_mark_upload_read(const fi_attn_args &a) {
    if (a.upload_done && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0)
        *(volatile uint32_t *)a.upload_done = ((const fi_meta *)a.meta)->upload_seq;
}

/* *p += v at GPU scope with acquire-release semantics, returning the old
 * value: it publishes the writes this CTA made before a barrier that
 * precedes it (the barrier orders them before it at CTA scope, the release
 * carries them on), and a later barrier makes what it acquired visible to
 * the whole CTA. One atomic in place of a fence before and a fence after. */
FI_DEV int fi_atomic_add_acq_rel(int32_t *p, int v) {
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

template <int T> struct fi_dtype_bytes { static constexpr int value = T == FI_T_F32 ? 4 : (T == FI_T_F16 || T == FI_T_BF16) ? 2 : 1; };

/* ------------------------------------------------------------ conversions */

FI_DEV float fi_f16_to_f32(uint32_t h) {
    float f;
    unsigned short hs = (unsigned short)h;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(hs));
    return f;
}
FI_DEV float fi_bf16_to_f32(uint32_t b) { return __uint_as_float((b & 0xffffu) << 16); }
FI_DEV uint32_t fi_f32_to_f16(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
FI_DEV uint32_t fi_f32_to_bf16(float f) {
#if __CUDA_ARCH__ >= 800
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u; /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                     /* round to nearest even */
    return u >> 16;
#endif
}
/* FP8 E4M3 (bias 7, no infinities, S.1111.111 is NaN): exact. */
FI_DEV float fi_e4m3_to_f32(uint32_t b) {
    uint32_t e = (b >> 3) & 15u, m = b & 7u;
    float v = e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : (float)m * 0.001953125f;
    if (e == 15u && m == 7u) v = __uint_as_float(0x7fc00000u);
    return (b & 0x80u) ? -v : v;
}
/* FP8 E5M2 is the top byte of an IEEE half: exact, infinities and NaN too. */
FI_DEV float fi_e5m2_to_f32(uint32_t b) { return fi_f16_to_f32((b & 0xffu) << 8); }

/* Elements of a row held as 32-bit words (little endian), as f32. Called
 * in fully unrolled loops, so every index is a constant and w stays in
 * registers. */
template <int T, int N>
FI_DEV void fi_unpack(const uint32_t *w, float *out) {
#pragma unroll
    for (int e = 0; e < N; e++) {
        if constexpr (T == FI_T_F32) {
            out[e] = __uint_as_float(w[e]);
        } else if constexpr (T == FI_T_BF16) {
            uint32_t x = w[e / 2];
            out[e] = (e & 1) ? __uint_as_float(x & 0xffff0000u) : __uint_as_float(x << 16);
        } else if constexpr (T == FI_T_F16) {
            out[e] = fi_f16_to_f32(w[e / 2] >> (16 * (e & 1)));
        } else if constexpr (T == FI_T_E4M3) {
            out[e] = fi_e4m3_to_f32((w[e / 4] >> (8 * (e & 3))) & 0xffu);
        } else {
            out[e] = fi_e5m2_to_f32((w[e / 4] >> (8 * (e & 3))) & 0xffu);
        }
    }
}

/* N elements of dtype T from shared or global memory at p (aligned to their
 * size, N * size a power of two), as f32, with the widest loads that fit. */
template <int T, int N>
FI_DEV void fi_load_vec(const char *p, float *out) {
    constexpr int BYTES = N * fi_dtype_bytes<T>::value;
    constexpr int WORDS = BYTES >= 4 ? BYTES / 4 : 1;
    uint32_t w[WORDS];
    if constexpr (BYTES % 16 == 0) {
#pragma unroll
        for (int i = 0; i < BYTES / 16; i++) {
            uint4 v = reinterpret_cast<const uint4 *>(p)[i];
            w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
        }
    } else if constexpr (BYTES == 8) {
        uint2 v = *reinterpret_cast<const uint2 *>(p);
        w[0] = v.x, w[1] = v.y;
    } else if constexpr (BYTES == 4) {
        w[0] = *reinterpret_cast<const uint32_t *>(p);
    } else if constexpr (BYTES == 2) {
        w[0] = *reinterpret_cast<const uint16_t *>(p);
    } else {
        w[0] = *reinterpret_cast<const uint8_t *>(p);
    }
    fi_unpack<T, N>(w, out);
}

/* One element of dtype T at p (any alignment of its own size). */
template <int T>
FI_DEV float fi_load_elem(const char *p) {
    if constexpr (T == FI_T_F32) return *reinterpret_cast<const float *>(p);
    else if constexpr (T == FI_T_F16) return fi_f16_to_f32(*reinterpret_cast<const uint16_t *>(p));
    else if constexpr (T == FI_T_BF16) return fi_bf16_to_f32(*reinterpret_cast<const uint16_t *>(p));
    else if constexpr (T == FI_T_E4M3) return fi_e4m3_to_f32(*reinterpret_cast<const uint8_t *>(p));
    else return fi_e5m2_to_f32(*reinterpret_cast<const uint8_t *>(p));
}

template <int T>
FI_DEV void fi_store_elem(char *p, float x) {
    if constexpr (T == FI_T_F32) *reinterpret_cast<float *>(p) = x;
    else if constexpr (T == FI_T_F16) *reinterpret_cast<uint16_t *>(p) = (uint16_t)fi_f32_to_f16(x);
    else *reinterpret_cast<uint16_t *>(p) = (uint16_t)fi_f32_to_bf16(x);
}

/* Copy one raw element of B bytes (the slow, unaligned K/V path). */
template <int B>
FI_DEV void fi_copy_raw(char *dst, const char *src) {
    if constexpr (B == 4) *reinterpret_cast<uint32_t *>(dst) = *reinterpret_cast<const uint32_t *>(src);
    else if constexpr (B == 2) *reinterpret_cast<uint16_t *>(dst) = *reinterpret_cast<const uint16_t *>(src);
    else *reinterpret_cast<uint8_t *>(dst) = *reinterpret_cast<const uint8_t *>(src);
}
template <int B>
FI_DEV void fi_zero_raw(char *dst) {
    if constexpr (B == 4) *reinterpret_cast<uint32_t *>(dst) = 0u;
    else if constexpr (B == 2) *reinterpret_cast<uint16_t *>(dst) = 0;
    else *reinterpret_cast<uint8_t *>(dst) = 0;
}

/* 2^x in one MUFU op (relative error ~2^-22); 2^-inf = 0. */
FI_DEV float fi_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* ------------------------------------------------------------- RoPE angles */

/* sin/cos of RoPE angles (ops.cuh's RoPE, the built-in fused RoPE and the
 * hooks' fi_rope_row in variant.cuh): the angle reduced to [-pi, pi] by
 * Cody-Waite (2 pi = C1 + C2, fmaf) and the MUFU sin/cos; error below 1e-6
 * absolute for positions < 2^24 and any theta (docs/CUDA_KERNELS.md). */

/* A frequency as hi + lo (two floats, |lo| <= ulp(hi) / 2), from a double
 * computed once per thread and dimension: pos * (hi + lo) is the exact
 * angle to ~2^-48 relative. */
struct fi_rope_f {
    float hi, lo;
};
FI_DEV fi_rope_f fi_rope_split(double f) {
    fi_rope_f r;
    r.hi = (float)f;
    r.lo = (float)(f - (double)r.hi);
    return r;
}

/* sin and cos of a + e: a any f32 (|a| < 2^24 * 2 pi) reduced by
 * k = rint(a / 2 pi), r = (a - k C1) - k C2, each fmaf rounding once
 * (|r| <= pi + 2^-20: error <= ulp(pi) / 2 each); e a small correction
 * added after the reduction; then MUFU (max error 2^-21.4 on [-pi, pi]). */
FI_DEV void fi_sincos_fast(float a, float e, float *s, float *c) {
    const float k = rintf(a * 0.159154936671257f);
    float r = fmaf(-k, 6.2831854820251465f, a);
    r = fmaf(-k, -1.7484555314695172e-07f, r) + e;
    __sincosf(r, s, c);
}

/* sin and cos of pos * (f.hi + f.lo), pos an integer below 2^24 (exact in
 * f32): the product pos * f.hi splits exactly into a + its rounding error
 * (fmaf), which joins pos * f.lo after the reduction of a. */
FI_DEV void fi_rope_sincos(int pos, fi_rope_f f, float *s, float *c) {
    const float p = (float)pos, a = p * f.hi;
    fi_sincos_fast(a, fmaf(p, f.lo, fmaf(p, f.hi, -a)), s, c);
}

/* ---------------------------------------------------------------- cp.async */

FI_DEV uint32_t fi_smem_addr(const void *p) {
    uint32_t a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
/* 16 bytes global -> shared address `dst`, asynchronously; src_bytes 0
 * writes zeros. */
FI_DEV void fi_cp_async16_to(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}
FI_DEV void fi_cp_async16(void *dst, const void *src, int src_bytes) {
    fi_cp_async16_to(fi_smem_addr(dst), src, src_bytes);
}
FI_DEV void fi_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
FI_DEV void fi_cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

#endif /* FI_PRELUDE_CUH */
