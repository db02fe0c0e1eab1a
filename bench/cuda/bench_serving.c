/*
 * bench_serving.c — the serving ops on the CUDA backend: rmsnorm and
 * fused_add_rmsnorm (bf16, rows 1 / 16 / 64 / 256 / 1024 / 4096 x hidden
 * 2048 / 4096 / 8192 / 16384), silu_and_mul (bf16, rows 1 / 64 / 256 /
 * 1024 / 4096 x d 4096 / 14336), softmax, top-k / top-p / top-k+top-p
 * sampling from probs, top_k_renorm_probs, top_k_mask_logits and top_k
 * (f32, rows 1 / 16 / 64 / 256 / 512 x vocab 128256),
 * apply_rope_with_cos_sin_cache (bf16, 32/8 heads, d 128), rope_quantize_fp8
 * (DeepSeek MLA: bf16 into e4m3, 128 heads, R 64, N 512) and
 * rope_quantize_fp8_append_paged_kv_cache (GQA 32/8 heads, R 128, N 0, V
 * 128, an NHD e4m3 cache of 16-token pages), 64 / 4096 tokens, and
 * qk_rmsnorm_rope (fi_qk_rmsnorm_rope on the q and k heads of a packed bf16
 * qkv of 32 + 8 + 8 heads of 128, in place; 64 / 4096 tokens).
 *
 * Each cell's inputs are random (probabilities in [0, 1), never a zero
 * row) in enough copies that one sweep over them reads >= 256 MB (at most
 * 16 copies), so the 60 MB L2 cannot hold them. Timing: one sweep (the op
 * once per copy, back to back on one stream) captured in a CUDA graph,
 * device events around each replay, median of >= 30 replays after warm-up;
 * time per op = replay / copies (bench/cuda/bench_serving_peers.py times
 * FlashInfer's and torch's ops on the same cells the same way).
 * Bytes = every tensor read or written once (sampling and top-k: the
 * input read once; what a one-pass kernel would move); GB/s decimal; % of
 * the measured device-to-device copy ceiling (4.22 TB/s,
 * docs/BENCHMARKS.md). The samplers read their row several times (select
 * passes from L2): their % says how far from one pass they are.
 *
 *   build/bench_serving [--json FILE] [--reps N] [--quick] [--op NAME]...
 *   (quick: rows 1, 64, 4096; --op: that op's cells only, repeatable)
 */
#include "flashinfer.h"
#include "../../tests/gpu/gpu_util.h"
#include "../../tests/util.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double CEILING = 4.22e12;

typedef enum op {
    OP_RMSNORM, OP_FUSED_ADD_RMSNORM, OP_SILU_AND_MUL, OP_SOFTMAX, OP_TOP_K_SAMPLING,
    OP_TOP_P_SAMPLING, OP_TOP_K_TOP_P_SAMPLING, OP_TOP_K_RENORM, OP_TOP_K_MASK, OP_TOP_K, OP_ROPE,
    OP_ROPE_QUANT, OP_ROPE_QUANT_APPEND, OP_QK_RMSNORM_ROPE
} op;
static const char *const op_names[] = {
    "rmsnorm", "fused_add_rmsnorm", "silu_and_mul", "softmax", "top_k_sampling",
    "top_p_sampling", "top_k_top_p_sampling", "top_k_renorm_probs", "top_k_mask_logits",
    "top_k", "rope_cos_sin_cache", "rope_quantize_fp8_mla", "rope_quantize_fp8_append_gqa",
    "qk_rmsnorm_rope"};

typedef struct cell {
    op op;
    int64_t rows, cols; /* rows x hidden (d, vocab); RoPE: tokens x (32 + 8) x 128 */
} cell;

enum { HQ = 32, HK = 8, HD = 128, MAXPOS = 8192, K = 50 };
/* MLA (DeepSeek-V3): 128 query heads, rope 64, nope (the latent) 512; page size */
enum { MLA_H = 128, MLA_R = 64, MLA_N = 512, PAGE = 16 };

/* Bytes of one input copy and of the output, and what the op moves. */
static void cell_bytes(const cell *c, size_t *in, size_t *out, double *moved) {
    const double n = (double)c->rows * (double)c->cols;
    switch (c->op) {
    case OP_RMSNORM: *in = (size_t)n * 2, *out = (size_t)n * 2, *moved = 4 * n; break;
    case OP_FUSED_ADD_RMSNORM: *in = (size_t)n * 4, *out = 0, *moved = 8 * n; break;
    case OP_SILU_AND_MUL: *in = (size_t)n * 4, *out = (size_t)n * 2, *moved = 6 * n; break;
    case OP_SOFTMAX: case OP_TOP_K_RENORM: case OP_TOP_K_MASK:
        *in = (size_t)n * 4, *out = (size_t)n * 4, *moved = 8 * n; break;
    case OP_TOP_K: *in = (size_t)n * 4, *out = (size_t)c->rows * K * 8, *moved = 4 * n; break;
    case OP_ROPE:
        *in = (size_t)c->rows * (HQ + HK) * HD * 2, *out = *in;
        *moved = 2.0 * (double)*in;
        break;
    case OP_ROPE_QUANT: /* bf16 in, e4m3 out */
        *in = (size_t)c->rows * ((MLA_H + 1) * (MLA_R + MLA_N)) * 2, *out = *in / 2;
        *moved = 1.5 * (double)*in;
        break;
    case OP_ROPE_QUANT_APPEND: /* q, k, v in; q out, the K/V cache rows */
        *in = (size_t)c->rows * (HQ + 2 * HK) * HD * 2, *out = *in / 2;
        *moved = 1.5 * (double)*in;
        break;
    case OP_QK_RMSNORM_ROPE: /* the packed qkv; q and k read and written in place */
        *in = (size_t)c->rows * (HQ + 2 * HK) * HD * 2, *out = 0;
        *moved = 2.0 * (double)c->rows * (HQ + HK) * HD * 2;
        break;
    default: *in = (size_t)n * 4, *out = (size_t)c->rows * 4, *moved = 4 * n; break;
    }
}

/* aux: the cos/sin cache [MAXPOS, HD], positions, then one bf16 weight [HD]
 * for q and k. */
static size_t qk_weight_offset(const cell *c) { return MAXPOS * HD * 4 + (size_t)c->rows * 16; }

/* n f32 values uniform in [lo, hi) at dst. */
static int fill_f32(gu_ptr dst, size_t n, float lo, float hi, tu_rng *rng) {
    const size_t block = (size_t)1 << 22;
    float *h = malloc((block + 64) * sizeof *h); /* each block read from its own shift */
    if (!h) return -1;
    for (size_t i = 0; i < block + 64; i++) h[i] = lo + (hi - lo) * (float)tu_rng_uniform(rng);
    for (size_t at = 0; at < n; at += block) {
        const size_t m = n - at < block ? n - at : block;
        if (GU(gu.HtoD(dst + at * 4, h + (at / block * 7) % 64, m * 4))) return free(h), -1;
    }
    free(h);
    return 0;
}

/* The two rope_quantize_fp8 cells: in holds the inputs one after the
 * other, out the FP8 outputs (or q_out and the caches), aux the cos/sin
 * cache [MAXPOS, R] f32, pos_ids, then (append) batch_indices, positions,
 * kv_indptr, kv_indices of one request holding every token in order. */
static fi_status run_rope_quant(fi_context *ctx, const cell *c, void *pi, void *po, gu_ptr aux,
                                gu_stream s) {
    const int64_t t = c->rows, pages = (t + PAGE - 1) / PAGE, two = 2;
    const int mla = c->op == OP_ROPE_QUANT;
    const int64_t hq = mla ? MLA_H : HQ, r = mla ? MLA_R : HD, n = mla ? MLA_N : 0;
    const int64_t qr[3] = {t, hq, r}, qn[3] = {t, hq, n}, kr[2] = {t, r}, kn[2] = {t, n};
    const int64_t k3[3] = {t, HK, HD}, cs[2] = {MAXPOS, r}, b1[1] = {t}, pg[1] = {pages};
    const int64_t kc[4] = {pages, PAGE, HK, HD};
    char *in = pi, *out = po, *ax = (char *)(uintptr_t)aux;
    fi_tensor q_rope = fi_tensor_contiguous(in, FI_DTYPE_BF16, 3, qr);
    in += t * hq * r * 2;
    fi_tensor q_nope = fi_tensor_contiguous(in, FI_DTYPE_BF16, 3, qn);
    in += t * hq * n * 2;
    fi_tensor k_rope = mla ? fi_tensor_contiguous(in, FI_DTYPE_BF16, 2, kr)
                           : fi_tensor_contiguous(in, FI_DTYPE_BF16, 3, k3);
    in += t * (mla ? 1 : HK) * r * 2;
    fi_tensor k_nope = fi_tensor_contiguous(in, FI_DTYPE_BF16, 2, kn);
    fi_tensor v = fi_tensor_contiguous(in, FI_DTYPE_BF16, 3, k3);
    fi_tensor qro = fi_tensor_contiguous(out, FI_DTYPE_E4M3, 3, qr);
    out += t * hq * r;
    fi_tensor qno = fi_tensor_contiguous(out, FI_DTYPE_E4M3, 3, qn);
    out += t * hq * n;
    fi_tensor kro = fi_tensor_contiguous(out, FI_DTYPE_E4M3, 2, kr);
    fi_tensor kno = fi_tensor_contiguous(out + t * r, FI_DTYPE_E4M3, 2, kn);
    fi_tensor k_cache = fi_tensor_contiguous(out, FI_DTYPE_E4M3, 4, kc);
    fi_tensor v_cache = fi_tensor_contiguous(out + pages * PAGE * HK * HD, FI_DTYPE_E4M3, 4, kc);
    fi_tensor cache = fi_tensor_contiguous(ax, FI_DTYPE_F32, 2, cs);
    ax += MAXPOS * r * 4;
    fi_tensor pos = fi_tensor_contiguous(ax, FI_DTYPE_I32, 1, b1);
    fi_tensor bi = fi_tensor_contiguous(ax + t * 4, FI_DTYPE_I32, 1, b1);
    fi_tensor sp = fi_tensor_contiguous(ax + t * 8, FI_DTYPE_I32, 1, b1);
    fi_tensor ptr = fi_tensor_contiguous(ax + t * 12, FI_DTYPE_I32, 1, &two);
    fi_tensor ids = fi_tensor_contiguous(ax + t * 12 + 8, FI_DTYPE_I32, 1, pg);
    fi_rope_quant_args a;
    fi_rope_quant_args_init(&a);
    a.q_rope = &q_rope, a.k_rope = &k_rope, a.cos_sin_cache = &cache, a.pos_ids = &pos;
    a.q_rope_out = &qro;
    if (mla) {
        a.q_nope = &q_nope, a.k_nope = &k_nope;
        a.q_nope_out = &qno, a.k_rope_out = &kro, a.k_nope_out = &kno;
        return fi_rope_quantize_fp8(ctx, &a, s);
    }
    a.v = &v, a.k_cache = &k_cache, a.v_cache = &v_cache;
    a.batch_indices = &bi, a.positions = &sp, a.kv_indptr = &ptr, a.kv_indices = &ids;
    return fi_rope_quantize_fp8_append_paged_kv_cache(ctx, &a, s);
}

static fi_status run_op(fi_context *ctx, const cell *c, gu_ptr in, gu_ptr out, gu_ptr aux,
                        gu_stream s) {
    void *pi = (void *)(uintptr_t)in, *po = (void *)(uintptr_t)out;
    const int64_t m2[2] = {c->rows, c->cols}, w1[1] = {c->cols}, i2[2] = {c->rows, 2 * c->cols};
    const int64_t b1[1] = {c->rows}, k2[2] = {c->rows, K};
    switch (c->op) {
    case OP_RMSNORM: case OP_FUSED_ADD_RMSNORM: {
        fi_tensor x = fi_tensor_contiguous(pi, FI_DTYPE_BF16, 2, m2);
        fi_tensor w = fi_tensor_contiguous((void *)(uintptr_t)aux, FI_DTYPE_BF16, 1, w1);
        if (c->op == OP_RMSNORM) {
            fi_tensor o = fi_tensor_contiguous(po, FI_DTYPE_BF16, 2, m2);
            return fi_rmsnorm(ctx, &x, &w, 1e-6f, &o, s);
        }
        fi_tensor r = fi_tensor_contiguous((char *)pi + c->rows * c->cols * 2, FI_DTYPE_BF16, 2, m2);
        return fi_fused_add_rmsnorm(ctx, &x, &r, &w, 1e-6f, s);
    }
    case OP_SILU_AND_MUL: {
        fi_tensor x = fi_tensor_contiguous(pi, FI_DTYPE_BF16, 2, i2);
        fi_tensor o = fi_tensor_contiguous(po, FI_DTYPE_BF16, 2, m2);
        return fi_silu_and_mul(ctx, &x, &o, s);
    }
    case OP_ROPE: {
        const int64_t qs[3] = {c->rows, HQ, HD}, ks[3] = {c->rows, HK, HD}, cs[2] = {MAXPOS, HD};
        fi_tensor q = fi_tensor_contiguous(pi, FI_DTYPE_BF16, 3, qs);
        fi_tensor k = fi_tensor_contiguous((char *)pi + c->rows * HQ * HD * 2, FI_DTYPE_BF16, 3, ks);
        fi_tensor qo = fi_tensor_contiguous(po, FI_DTYPE_BF16, 3, qs);
        fi_tensor ko = fi_tensor_contiguous((char *)po + c->rows * HQ * HD * 2, FI_DTYPE_BF16, 3, ks);
        fi_tensor cache = fi_tensor_contiguous((void *)(uintptr_t)aux, FI_DTYPE_F32, 2, cs);
        fi_tensor pos = fi_tensor_contiguous((char *)(uintptr_t)aux + MAXPOS * HD * 4, FI_DTYPE_I32, 1, b1);
        return fi_rope_apply_cos_sin_cache(ctx, &pos, &q, &k, &cache, 1, &qo, &ko, s);
    }
    case OP_ROPE_QUANT: case OP_ROPE_QUANT_APPEND: return run_rope_quant(ctx, c, pi, po, aux, s);
    case OP_QK_RMSNORM_ROPE: {
        const int64_t ps[3] = {c->rows, HQ + 2 * HK, HD}, cs[2] = {MAXPOS, HD}, ws[1] = {HD};
        fi_tensor q = fi_tensor_contiguous(pi, FI_DTYPE_BF16, 3, ps), k = q;
        q.shape[1] = HQ;
        k.data = (char *)pi + HQ * HD * 2, k.shape[1] = HK;
        fi_tensor cache = fi_tensor_contiguous((void *)(uintptr_t)aux, FI_DTYPE_F32, 2, cs);
        fi_tensor pos = fi_tensor_contiguous((char *)(uintptr_t)aux + MAXPOS * HD * 4, FI_DTYPE_I32, 1, b1);
        fi_tensor w = fi_tensor_contiguous((char *)(uintptr_t)aux + qk_weight_offset(c), FI_DTYPE_BF16, 1, ws);
        return fi_qk_rmsnorm_rope(ctx, &pos, &q, &k, &w, &w, 1e-6f, &cache, 1, &q, &k, s);
    }
    default: break;
    }
    fi_tensor x = fi_tensor_contiguous(pi, FI_DTYPE_F32, 2, m2);
    fi_tensor o = fi_tensor_contiguous(po, FI_DTYPE_F32, 2, m2);
    fi_tensor smp = fi_tensor_contiguous(po, FI_DTYPE_I32, 1, b1);
    fi_tensor idx = fi_tensor_contiguous(po, FI_DTYPE_I32, 2, k2);
    fi_tensor val = fi_tensor_contiguous((char *)po + c->rows * K * 4, FI_DTYPE_F32, 2, k2);
    switch (c->op) {
    case OP_SOFTMAX: return fi_softmax(ctx, &x, NULL, 0.8f, &o, s);
    case OP_TOP_K_SAMPLING: return fi_top_k_sampling_from_probs(ctx, &x, NULL, NULL, K, 1, 2, &smp, NULL, s);
    case OP_TOP_P_SAMPLING: return fi_top_p_sampling_from_probs(ctx, &x, NULL, NULL, 0.9f, 1, 2, &smp, NULL, s);
    case OP_TOP_K_TOP_P_SAMPLING:
        return fi_top_k_top_p_sampling_from_probs(ctx, &x, NULL, NULL, K, NULL, 0.9f,
                                                  FI_FILTER_TOP_K_FIRST, 1, 2, &smp, NULL, s);
    case OP_TOP_K_RENORM: return fi_top_k_renorm_probs(ctx, &x, NULL, K, &o, s);
    case OP_TOP_K_MASK: return fi_top_k_mask_logits(ctx, &x, NULL, K, &o, s);
    default: return fi_top_k(ctx, &x, K, NULL, NULL, &val, &idx, s);
    }
}

int main(int argc, char **argv) {
    const char *json = NULL;
    int reps = 30, quick = 0, num_ops = 0;
    const char *only[16];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--op") && i + 1 < argc && num_ops < 16) only[num_ops++] = argv[++i];
    }
    if (reps < 30) reps = 30;
    fi_context *ctx;
    int open = gu_bench_context(&ctx);
    if (open) return open < 0;
    printf("%s\n", fi_context_describe(ctx));
    gu_stream s;
    gu_event e0, e1;
    if (GU(gu.StreamCreate(&s, 1)) || GU(gu.EventCreate(&e0, 0)) || GU(gu.EventCreate(&e1, 0)))
        return 1;
    /* kept equal to bench_serving_peers.py's CELLS */
    static const int64_t norm_rows[] = {1, 16, 64, 256, 1024, 4096};
    static const int64_t norm_h[] = {2048, 4096, 8192, 16384};
    static const int64_t act_rows[] = {1, 64, 256, 1024, 4096}, act_d[] = {4096, 14336};
    static const int64_t vocab_rows[] = {1, 16, 64, 256, 512};
    enum { NR = 6, NH = 4, NAR = 5, NAD = 2, NV = 5 };
    cell cells[2 * NR * NH + NAR * NAD + (OP_TOP_K - OP_SOFTMAX + 1) * NV + 1 + 4 + 2];
    int nc = 0;
    for (int o = OP_RMSNORM; o <= OP_FUSED_ADD_RMSNORM; o++)
        for (int r = 0; r < NR; r++)
            for (int h = 0; h < NH; h++) cells[nc++] = (cell){(op)o, norm_rows[r], norm_h[h]};
    for (int r = 0; r < NAR; r++)
        for (int d = 0; d < NAD; d++) cells[nc++] = (cell){OP_SILU_AND_MUL, act_rows[r], act_d[d]};
    for (int o = OP_SOFTMAX; o <= OP_TOP_K; o++)
        for (int r = 0; r < NV; r++) cells[nc++] = (cell){(op)o, vocab_rows[r], 128256};
    cells[nc++] = (cell){OP_ROPE, 4096, (HQ + HK) * HD};
    static const int64_t rq_tokens[] = {64, 4096}; /* a decode step, a prefill chunk */
    for (int r = 0; r < 2; r++) { /* cols: input elements per token */
        cells[nc++] = (cell){OP_ROPE_QUANT, rq_tokens[r], (MLA_H + 1) * (MLA_R + MLA_N)};
        cells[nc++] = (cell){OP_ROPE_QUANT_APPEND, rq_tokens[r], (HQ + 2 * HK) * HD};
    }
    for (int r = 0; r < 2; r++) cells[nc++] = (cell){OP_QK_RMSNORM_ROPE, rq_tokens[r], (HQ + 2 * HK) * HD};
    FILE *jf = json ? fopen(json, "w") : NULL;
    char table[65536];
    int tl = snprintf(table, sizeof table, "| op | rows | cols | us | GB/s | %% of copy |\n"
                                           "|---|---|---|---|---|---|\n");
    tu_rng rng;
    tu_rng_seed(&rng, 11);
    int status = 0;
    for (int ci = 0; ci < nc; ci++) {
        const cell *c = &cells[ci];
        if (quick && c->rows != 1 && c->rows != 64 && c->rows != 4096) continue;
        bool wanted = num_ops == 0;
        for (int k = 0; k < num_ops; k++) wanted |= !strcmp(only[k], op_names[c->op]);
        if (!wanted) continue;
        size_t in, out;
        double moved;
        cell_bytes(c, &in, &out, &moved);
        int copies = (int)((((size_t)256 << 20) + in - 1) / in);
        copies = copies < 1 ? 1 : copies > 16 ? 16 : copies;
        gu_ptr din = 0, dout = 0, aux = 0;
        const size_t aux_bytes = MAXPOS * HD * 4 + (size_t)c->rows * 16 + (size_t)c->cols * 2 + 64;
        if (GU(gu.MemAlloc(&din, in * copies)) || GU(gu.MemAlloc(&dout, out ? out : 64)) ||
            GU(gu.MemAlloc(&aux, aux_bytes)))
            return 1;
        const int bf16 = c->op <= OP_SILU_AND_MUL || c->op >= OP_ROPE;
        if (bf16 ? gu_fill_random_bf16(din, in * copies, &rng)
                 : fill_f32(din, in * copies / 4, c->op == OP_TOP_K_MASK ? -8.0f : 0.0f, 1.0f, &rng))
            return 1;
        if (c->op >= OP_ROPE) { /* a cos/sin cache in [-1, 1), positions in range */
            const int64_t r = c->op == OP_ROPE_QUANT ? MLA_R : HD, t = c->rows;
            const int64_t pages = (t + PAGE - 1) / PAGE;
            /* pos_ids, batch_indices, positions, kv_indptr, kv_indices */
            int32_t *pos = malloc((size_t)(3 * t + 2 + pages) * 4);
            for (int64_t i = 0; i < t; i++)
                pos[i] = (int32_t)(i % MAXPOS), pos[t + i] = 0, pos[2 * t + i] = (int32_t)i;
            pos[3 * t] = 0, pos[3 * t + 1] = (int32_t)pages;
            for (int64_t i = 0; i < pages; i++) pos[3 * t + 2 + i] = (int32_t)i;
            if (fill_f32(aux, (size_t)(MAXPOS * r), -1.0f, 1.0f, &rng) ||
                GU(gu.HtoD(aux + MAXPOS * r * 4, pos, (size_t)(3 * t + 2 + pages) * 4)))
                return 1;
            if (c->op == OP_QK_RMSNORM_ROPE && gu_fill_random_bf16(aux + qk_weight_offset(c), HD * 2, &rng))
                return 1;
            free(pos);
        } else if (gu_fill_random_bf16(aux, aux_bytes & ~(size_t)1, &rng)) {
            return 1;
        }
        float *ms = malloc(sizeof(float) * (size_t)reps);
        fi_status st = FI_OK;
        /* an eager sweep first (loads the kernels), then the sweep's graph */
        for (int k = 0; k < copies && !st; k++) st = run_op(ctx, c, din + in * k, dout, aux, s);
        gu_graph g = NULL;
        gu_exec ex = NULL;
        if (!st) {
            if (GU(gu.BeginCapture(s, 0))) return 1;
            for (int k = 0; k < copies && !st; k++) st = run_op(ctx, c, din + in * k, dout, aux, s);
            if (GU(gu.EndCapture(s, &g)) || GU(gu.GraphInstantiate(&ex, g, 0))) return 1;
        }
        if (!st && gu_replay_times(ex, s, e0, e1, reps, ms)) return 1;
        if (ex) gu.GraphExecDestroy(ex);
        if (g) gu.GraphDestroy(g);
        if (st) {
            printf("%s %lld x %lld: %s\n", op_names[c->op], (long long)c->rows, (long long)c->cols,
                   fi_last_error());
            status = 1;
        } else {
            const double us = 1e3 * ms[reps / 2] / copies, gbs = moved / (us * 1e-6) / 1e9;
            printf("%-22s %5lld x %6lld: %9.2f us %8.1f GB/s (%2.0f%% of copy; %d copies)\n",
                   op_names[c->op], (long long)c->rows, (long long)c->cols, us, gbs,
                   100 * gbs * 1e9 / CEILING, copies);
            tl += snprintf(table + tl, sizeof table - (size_t)tl, "| %s | %lld | %lld | %.2f | %.1f | %.0f%% |\n",
                           op_names[c->op], (long long)c->rows, (long long)c->cols, us, gbs,
                           100 * gbs * 1e9 / CEILING);
            if (jf)
                fprintf(jf, "{\"workload\":\"serving\",\"op\":\"%s\",\"rows\":%lld,\"cols\":%lld,"
                            "\"us\":%.3f,\"gbps\":%.1f,\"copies\":%d,\"reps\":%d,\"timing\":\"graph\"}\n",
                        op_names[c->op], (long long)c->rows, (long long)c->cols, us, gbs, copies, reps);
        }
        free(ms);
        gu.MemFree(din), gu.MemFree(dout), gu.MemFree(aux);
    }
    if (jf) fclose(jf);
    printf("\n%s", table);
    fi_context_destroy(ctx);
    return status;
}
