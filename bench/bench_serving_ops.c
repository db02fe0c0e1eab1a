/*
 * bench_serving_ops.c — the serving ops on the CPU backend: rmsnorm and
 * fused_add_rmsnorm (bf16, rows 1-4096 x hidden 2k-16k), silu_and_mul,
 * softmax, top-k / top-p / top-k+top-p sampling, top_k_renorm_probs and
 * top_k (f32, rows 1-512 x vocab 32k-256k), qk_rmsnorm_rope (bf16, tokens
 * 1-4096 of a packed qkv of 32 q + 8 k + 8 v heads of 128, q and k
 * normalised and turned in place: fi_qk_rmsnorm_rope), beside the
 * machine's read bandwidth. bench/torch_cpu_serving.py times torch's CPU composition of
 * the same cells (--from this program's JSON) and prints the ratio.
 *
 *   build/bench_serving_ops [--json PATH] [--reps N] [--threads N] [--quick] [--op NAME]...
 *   (--op: that op's cells only, repeatable)
 *
 * Prints one table: median ms and GB/s moved (each tensor read or written
 * once counts once).
 */
#include "common.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum op {
    OP_RMSNORM, OP_FUSED_ADD_RMSNORM, OP_SILU_AND_MUL, OP_SOFTMAX, OP_TOP_K_SAMPLING,
    OP_TOP_P_SAMPLING, OP_TOP_K_TOP_P_SAMPLING, OP_TOP_K_RENORM, OP_TOP_K, OP_QK_RMSNORM_ROPE
} op;

static const char *const op_names[] = {"rmsnorm", "fused_add_rmsnorm", "silu_and_mul",
                                       "softmax", "top_k_sampling", "top_p_sampling",
                                       "top_k_top_p_sampling", "top_k_renorm_probs", "top_k",
                                       "qk_rmsnorm_rope"};

/* qk_rmsnorm_rope: heads of the packed qkv (Qwen3-8B's attention); cols is
 * the head dim. */
enum { QK_HQ = 32, QK_HK = 8, QK_MAX_POS = 4096 };

typedef struct cell {
    op op;
    int64_t rows, cols; /* hidden (norms, activation: d), or vocab */
} cell;

static int reps = 10, threads = 0;

/* Random bytes as f32 in [0, 1) or bf16 in [-2, 2), a fixed seed per cell. */
static void *make(int64_t n, fi_dtype dtype, uint64_t seed, int positive) {
    size_t es = dtype == FI_DTYPE_F32 ? 4 : 2;
    void *p = malloc((size_t)n * es);
    if (!p) return NULL;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        float v = (float)(s >> 40) / 16777216.0f;
        if (!positive) v = 4.0f * v - 2.0f;
        if (es == 4) {
            ((float *)p)[i] = v;
        } else {
            uint32_t u;
            memcpy(&u, &v, 4);
            ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
        }
    }
    return p;
}

static double cell_bytes(const cell *c) {
    double n = (double)c->rows * (double)c->cols;
    switch (c->op) {
    case OP_RMSNORM: return 2 * n * 2;                   /* bf16 in, out */
    case OP_FUSED_ADD_RMSNORM: return 4 * n * 2;         /* input, residual: read + write */
    case OP_SILU_AND_MUL: return 3 * n * 2;              /* [rows, 2d] in, [rows, d] out */
    case OP_SOFTMAX: case OP_TOP_K_RENORM: return 2 * n * 4;
    case OP_QK_RMSNORM_ROPE: return 2 * n * (QK_HQ + QK_HK) * 2; /* q, k: read + write */
    default: return n * 4;                               /* probs read once */
    }
}

/* Runs op once on prepared buffers. */
typedef struct bufs {
    void *a, *b, *c, *w;
    int32_t *samples, *idx;
    float *cache; /* qk_rmsnorm_rope: [QK_MAX_POS, cols] */
} bufs;

/* q and k of the packed [rows, QK_HQ + 2 QK_HK, d] qkv in place; positions
 * in samples (t * 7 % QK_MAX_POS), the same weight for q and k. */
static fi_status run_qk_norm_rope(fi_context *ctx, const cell *c, bufs *b) {
    const int64_t r = c->rows, d = c->cols, heads = QK_HQ + 2 * QK_HK;
    const int64_t sp[3] = {r, heads, d}, sw[1] = {d}, sc[2] = {QK_MAX_POS, d}, sr[1] = {r};
    fi_tensor q = fi_tensor_contiguous(b->a, FI_DTYPE_BF16, 3, sp), k = q;
    q.shape[1] = QK_HQ;
    k.data = (uint16_t *)b->a + QK_HQ * d, k.shape[1] = QK_HK;
    fi_tensor w = fi_tensor_contiguous(b->w, FI_DTYPE_BF16, 1, sw);
    fi_tensor cache = fi_tensor_contiguous(b->cache, FI_DTYPE_F32, 2, sc);
    fi_tensor pos = fi_tensor_contiguous(b->samples, FI_DTYPE_I32, 1, sr);
    return fi_qk_rmsnorm_rope(ctx, &pos, &q, &k, &w, &w, 1e-6f, &cache, 1, &q, &k, NULL);
}

static fi_status run(fi_context *ctx, const cell *c, bufs *b) {
    const int64_t r = c->rows, n = c->cols;
    int64_t s2[2] = {r, n}, s1[1] = {n}, sa[2] = {r, 2 * n}, sb[1] = {r}, sk[2] = {r, 50};
    switch (c->op) {
    case OP_RMSNORM: {
        fi_tensor x = fi_tensor_contiguous(b->a, FI_DTYPE_BF16, 2, s2);
        fi_tensor o = fi_tensor_contiguous(b->b, FI_DTYPE_BF16, 2, s2);
        fi_tensor w = fi_tensor_contiguous(b->w, FI_DTYPE_BF16, 1, s1);
        return fi_rmsnorm(ctx, &x, &w, 1e-6f, &o, NULL);
    }
    case OP_FUSED_ADD_RMSNORM: {
        fi_tensor x = fi_tensor_contiguous(b->a, FI_DTYPE_BF16, 2, s2);
        fi_tensor res = fi_tensor_contiguous(b->b, FI_DTYPE_BF16, 2, s2);
        fi_tensor w = fi_tensor_contiguous(b->w, FI_DTYPE_BF16, 1, s1);
        return fi_fused_add_rmsnorm(ctx, &x, &res, &w, 1e-6f, NULL);
    }
    case OP_SILU_AND_MUL: {
        fi_tensor x = fi_tensor_contiguous(b->a, FI_DTYPE_BF16, 2, sa);
        fi_tensor o = fi_tensor_contiguous(b->b, FI_DTYPE_BF16, 2, s2);
        return fi_silu_and_mul(ctx, &x, &o, NULL);
    }
    case OP_QK_RMSNORM_ROPE: return run_qk_norm_rope(ctx, c, b);
    default: break;
    }
    fi_tensor p = fi_tensor_contiguous(b->a, FI_DTYPE_F32, 2, s2);
    fi_tensor o = fi_tensor_contiguous(b->b, FI_DTYPE_F32, 2, s2);
    fi_tensor s = fi_tensor_contiguous(b->samples, FI_DTYPE_I32, 1, sb);
    static uint64_t offset;
    offset++;
    switch (c->op) {
    case OP_SOFTMAX: return fi_softmax(ctx, &p, NULL, 0.8f, &o, NULL);
    case OP_TOP_K_SAMPLING:
        return fi_top_k_sampling_from_probs(ctx, &p, NULL, NULL, 50, 1, offset, &s, NULL, NULL);
    case OP_TOP_P_SAMPLING:
        return fi_top_p_sampling_from_probs(ctx, &p, NULL, NULL, 0.9f, 1, offset, &s, NULL, NULL);
    case OP_TOP_K_TOP_P_SAMPLING:
        return fi_top_k_top_p_sampling_from_probs(ctx, &p, NULL, NULL, 50, NULL, 0.9f,
                                                  FI_FILTER_TOP_K_FIRST, 1, offset, &s, NULL,
                                                  NULL);
    case OP_TOP_K_RENORM: return fi_top_k_renorm_probs(ctx, &p, NULL, 50, &o, NULL);
    case OP_TOP_K: {
        fi_tensor v = fi_tensor_contiguous(b->c, FI_DTYPE_F32, 2, sk);
        fi_tensor i = fi_tensor_contiguous(b->idx, FI_DTYPE_I32, 2, sk);
        return fi_top_k(ctx, &p, 50, NULL, NULL, &v, &i, NULL);
    }
    default: return FI_STATUS_INTERNAL;
    }
}

static int time_cell(fi_context *ctx, const cell *c, double *ms) {
    const int64_t r = c->rows, n = c->cols;
    const int qk = c->op == OP_QK_RMSNORM_ROPE;
    const int norm = c->op <= OP_SILU_AND_MUL || qk;
    const fi_dtype dt = norm ? FI_DTYPE_BF16 : FI_DTYPE_F32;
    const int64_t in_n = c->op == OP_SILU_AND_MUL ? 2 * r * n
                         : qk                     ? r * n * (QK_HQ + 2 * QK_HK)
                                                  : r * n;
    bufs b = {make(in_n, dt, 1, !norm), make(r * n, dt, 2, !norm), malloc((size_t)r * 50 * 4),
              make(n, dt, 3, 0), malloc((size_t)r * 4), malloc((size_t)r * 50 * 4),
              qk ? make(QK_MAX_POS * n, FI_DTYPE_F32, 4, 0) : NULL};
    if (qk && b.samples)
        for (int64_t t = 0; t < r; t++) b.samples[t] = (int32_t)(t * 7 % QK_MAX_POS);
    int rc = -1;
    if (b.a && b.b && b.c && b.w && b.samples && b.idx && (!qk || b.cache)) {
        fi_status st = run(ctx, c, &b);
        double *t = malloc(sizeof(double) * (size_t)reps);
        for (int i = 0; i < reps && !st; i++) {
            double t0 = bench_now();
            st = run(ctx, c, &b);
            t[i] = bench_now() - t0;
        }
        if (st) fprintf(stderr, "%s: %s\n", op_names[c->op], fi_last_error());
        else *ms = bench_median(t, reps) * 1e3, rc = 0;
        free(t);
    } else {
        fprintf(stderr, "%s %lld x %lld: out of memory\n", op_names[c->op], (long long)r,
                (long long)n);
    }
    free(b.a), free(b.b), free(b.c), free(b.w), free(b.samples), free(b.idx), free(b.cache);
    return rc;
}

int main(int argc, char **argv) {
    const char *json = NULL;
    int quick = 0, num_ops = 0;
    const char *only[16];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--op") && i + 1 < argc && num_ops < 16) only[num_ops++] = argv[++i];
        else {
            fprintf(stderr,
                    "usage: %s [--json PATH] [--reps N] [--threads N] [--quick] [--op NAME]...\n",
                    argv[0]);
            return 2;
        }
    }
    cell cells[128];
    int nc = 0;
    static const int64_t rows_h[] = {1, 64, 512, 4096}, hidden[] = {2048, 8192, 16384};
    static const int64_t rows_v[] = {1, 16, 128, 512}, vocab[] = {32000, 128256, 262144};
    for (int o = OP_RMSNORM; o <= OP_SILU_AND_MUL; o++)
        for (int r = 0; r < 4; r++)
            for (int h = 0; h < 3; h++) {
                if (quick && (r == 1 || h == 1)) continue;
                cells[nc++] = (cell){(op)o, rows_h[r], hidden[h]};
            }
    for (int o = OP_SOFTMAX; o <= OP_TOP_K; o++)
        for (int r = 0; r < 4; r++)
            for (int v = 0; v < 3; v++) {
                if (quick && (r == 1 || v == 2)) continue;
                cells[nc++] = (cell){(op)o, rows_v[r], vocab[v]};
            }
    for (int r = 0; r < 4; r++)
        if (!quick || r != 1) cells[nc++] = (cell){OP_QK_RMSNORM_ROPE, rows_h[r], 128};
    fi_context_options opt;
    fi_context_options_init(&opt);
    opt.num_threads = threads;
    fi_context *ctx;
    if (fi_context_create(&opt, &ctx)) {
        fprintf(stderr, "fi_context_create: %s\n", fi_last_error());
        return 1;
    }
    int nthreads = threads;
    double bw = bench_read_bandwidth(nthreads > 0 ? nthreads : 1);
    printf("%s; read bandwidth %.1f GB/s\n", fi_context_describe(ctx), bw);
    printf("%-22s %6s %7s %10s %8s\n", "op", "rows", "cols", "ms", "GB/s");
    FILE *f = json ? fopen(json, "w") : NULL;
    if (f) fprintf(f, "{\"describe\": \"%s\", \"read_gbs\": %.2f, \"cells\": [", fi_context_describe(ctx), bw);
    int written = 0;
    for (int i = 0; i < nc; i++) {
        bool wanted = num_ops == 0;
        for (int k = 0; k < num_ops; k++) wanted |= !strcmp(only[k], op_names[cells[i].op]);
        if (!wanted) continue;
        double ms = 0.0;
        if (time_cell(ctx, &cells[i], &ms)) continue;
        double gbs = cell_bytes(&cells[i]) / (ms * 1e-3) / 1e9;
        printf("%-22s %6lld %7lld %10.3f %8.1f\n", op_names[cells[i].op],
               (long long)cells[i].rows, (long long)cells[i].cols, ms, gbs);
        fflush(stdout);
        if (f)
            fprintf(f, "%s{\"op\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"ms\": %.4f, "
                       "\"gbs\": %.2f}",
                    written++ ? ", " : "", op_names[cells[i].op], (long long)cells[i].rows,
                    (long long)cells[i].cols, ms, gbs);
    }
    if (f) fprintf(f, "]}\n"), fclose(f);
    fi_context_destroy(ctx);
    return 0;
}
