/*
 * simd.h — the CPU attention kernel's SIMD interface: one table of block
 * functions per instruction set (generic C, AVX2, AVX-512, NEON), chosen at
 * context creation by run-time CPU detection.
 *
 * The portable driver (attention.c) walks a work item as FlashAttention does:
 * a block of up to FI_CPU_BM packed query rows (tokens x GQA group, token
 * major) against blocks of up to FI_CPU_BN keys. For each key block it calls
 *   qk       S = Q K^T                     (Q staged in f32, pre-scaled)
 *   [mask / soft-cap / ALiBi in portable C, only when the block needs it]
 *   softmax  online softmax update of m, l; P written over S; alpha per row
 *   pv       O = alpha * O + P V
 * The table functions see K/V rows only through per-key row pointers, so
 * page tables, NHD/HND layouts and strides never reach them.
 */
#ifndef FI_CPU_SIMD_H
#define FI_CPU_SIMD_H

#include "flashinfer.h"

#include <stdbool.h>
#include <stdint.h>

#define FI_CPU_BM 128     /* packed query rows per row block */
#define FI_CPU_BN 64      /* keys per key block */
#define FI_CPU_MAX_D 512  /* largest head dim */
/* Bytes of per-worker scratch a SIMD table may use for packed K/V and P. */
#define FI_CPU_WORK_BYTES (FI_CPU_BN * FI_CPU_MAX_D * 4 * 2 + FI_CPU_BM * FI_CPU_BN * 4 + 4096)

/* One row block against one key block. Rows past `rows` up to a multiple of
 * 8 are padding: their Q and P are zero, so kernels may compute them. */
typedef struct fi_cpu_tile {
    int32_t rows;            /* valid packed rows, 1..FI_CPU_BM */
    int32_t keys;            /* valid keys, 1..FI_CPU_BN */
    int32_t dqk, dvo;        /* head dims: 64, 128 or 256 */
    fi_dtype k_dtype, v_dtype;/* f32, f16, bf16, e4m3, e5m2 */
    float k_scale, v_scale;  /* FP8 dequantisation (1 otherwise) */
    const uint8_t *const *k; /* [keys] K row pointers, dqk contiguous elements */
    const uint8_t *const *v; /* [keys] V row pointers, dvo contiguous elements */
    const uint8_t *const *k_next, *const *v_next; /* the next block's rows ... */
    int32_t keys_next;       /* ... to prefetch while this one computes (0: none) */
    const float *q;          /* [FI_CPU_BM][dqk] staged, scaled queries */
    float *s;                /* [FI_CPU_BM][FI_CPU_BN] logits, then P */
    float *o;                /* [FI_CPU_BM][dvo] unnormalised output */
    float *m, *l, *alpha;    /* [FI_CPU_BM] running max, sum (log2 domain) */
    float *qx;               /* [FI_CPU_BM][FI_CPU_MAX_D]: the table's own copy of q */
    void *work;              /* FI_CPU_WORK_BYTES of table scratch, 64-byte aligned */
} fi_cpu_tile;

typedef struct fi_cpu_simd {
    const char *name;
    /* Called once per row block after q is staged, with k_dtype / v_dtype
     * set (e.g. q reordered into qx). May be NULL. */
    void (*prepare_q)(fi_cpu_tile *t);
    /* s[r][j] = q[r] . k[j] for r < rows, j < keys. */
    void (*qk)(fi_cpu_tile *t);
    /* Per row r < rows: m' = max(m, max_j s), alpha = 2^(m - m'), s[j] <-
     * 2^(s[j] - m'), l = alpha l + sum_j s[j]. A row whose m' is -inf gets
     * alpha 1 and P 0. Values of s are log2-domain logits, -inf = masked.
     * A row with a NaN or +inf logit, or whose m is NaN already, is
     * poisoned by fi_cpu_poison_row: it stays NaN to the end
     * (docs/SEMANTICS.md, "Non-finite values"). */
    void (*softmax)(fi_cpu_tile *t);
    /* o[r] = alpha[r] o[r] + sum_j s[r][j] v[j] for r < rows. The table may
     * keep o in its own element order ... */
    void (*pv)(fi_cpu_tile *t);
    /* ... which this puts back in natural order before o is written. May be NULL. */
    void (*finish_o)(fi_cpu_tile *t);
} fi_cpu_simd;

extern const fi_cpu_simd fi_cpu_simd_generic;
#if defined(__x86_64__) || defined(_M_X64)
extern const fi_cpu_simd fi_cpu_simd_avx2;
extern const fi_cpu_simd fi_cpu_simd_avx512;
#endif
#if defined(__aarch64__)
extern const fi_cpu_simd fi_cpu_simd_neon;
#endif

/* Row r's state after a NaN or +inf logit: m, l and alpha NaN (so o turns
 * NaN in pv and every later block keeps it), P zero. */
static inline void fi_cpu_poison_row(fi_cpu_tile *t, int32_t r) {
    float *s = t->s + (size_t)r * FI_CPU_BN;
    t->m[r] = t->l[r] = t->alpha[r] = __builtin_nanf("");
    for (int32_t j = 0; j < t->keys; j++) s[j] = 0.0f;
}

/* The table for a level name ("" / "auto" = best this CPU runs); NULL when
 * the level is unknown or this CPU cannot run it. */
const fi_cpu_simd *fi_cpu_simd_select(const char *request);

/* The table that runs head dims (dqk, dvo), given the context's `table`:
 * itself for 64, 128, 256; AVX-512 also for 192 and 512 (multiples of its
 * 64-element chunks), AVX2 (16-element steps) for 80 and 96 where the CPU
 * has it; else the generic table (any dim). */
const fi_cpu_simd *fi_cpu_simd_for_dims(const fi_cpu_simd *table, int32_t dqk, int32_t dvo);

#endif /* FI_CPU_SIMD_H */
