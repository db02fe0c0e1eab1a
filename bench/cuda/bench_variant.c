/*
 * bench_variant.c — user-defined variants on the CUDA backend (issue 7):
 *
 * 1. JIT: a variant's kernels (the StreamingLLM example of
 *    tests/variant_examples.c: attention, tensor-core attention, merge)
 *    compiled cold by NVRTC into an empty disk cache (plan create), then
 *    loaded warm from the disk cache by a fresh context, then from the
 *    context's memory. Targets: <= 3 s cold, <= 5 ms warm.
 * 2. Fused RoPE vs RoPE as a separate pass, on the benchmark shapes (32/8 heads,
 *    d 128, bf16, paged NHD page 16; each request's pages contiguous, so the
 *    cache is also a token-major [tokens, 8, 128] tensor for fi_rope_apply).
 *    The StreamingLLM setting: keys are cached un-rotated and every call
 *    rotates them at their current positions.
 *      plain      attention alone, no RoPE (the floor of the others)
 *      separate   fi_rope_apply over the cached K (to a second buffer) and q,
 *                 then plain attention on the rotated copy
 *      builtin    fused, pos_encoding = FI_POS_ROPE_LLAMA (CUDA-core kernel,
 *                 element-wise; decode only: prefill would take seconds)
 *      variant    fused, params.variant = the rope_llama built-in spec
 *                 (spliced row hooks; prefill on tensor cores)
 *    Decode: one token per request, kv_len L. Prefill: causal, qo = kv = L.
 *    Bandwidth utilisation = attention's bytes (Q + K + V + O) / time /
 *    4.22 TB/s (the copy ceiling, docs/BENCHMARKS.md), the same numerator for every mode,
 *    so the ratio fused / separate is the speed-up. Decode's separate pass
 *    for K passes head 0 of K as fi_rope_apply's k argument too (it needs
 *    one; 1/8 extra of K's traffic) and rotates q by a second call.
 *
 * Inputs random bf16 (never zeros). Device events around each mode's calls,
 * median of >= 30 after warm-up. The fused outputs are compared with the
 * separate pass's (max |diff|, printed: a sanity check, not a test).
 *
 *   build/bench_variant [--json FILE] [--reps N] [--decode 64x4096,...]
 *                       [--prefill 32x4096,...] [--no-jit]
 */
#include "flashinfer.h"
#include "cuda/cuda_backend.h"
#include "../../tests/gpu/gpu_util.h"
#include "../../tests/util.h"
#include "../../tests/variant_examples.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { HQ = 32, HKV = 8, D = 128, PS = 16 };
static const double CEILING = 4.22e12;
static int reps = 30;
static FILE *jf;
static char table[8192];
static int tl;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static fi_context *new_context(void) {
    fi_context_options opt;
    fi_context_options_init(&opt);
    opt.device = FI_DEVICE_CUDA;
    fi_context *ctx = NULL;
    if (fi_context_create(&opt, &ctx)) printf("context: %s\n", fi_last_error());
    return ctx;
}

/* ------------------------------------------------------------------ JIT */

static int bench_jit(void) {
    char dir[] = "/tmp/fi-bench-variant-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    setenv("FLASHINFER_CACHE_DIR", dir, 1);
    fi_variant *v = NULL;
    if (fi_variant_create(vx_spec(VX_STREAMING), &v)) {
        printf("variant: %s\n", fi_last_error());
        return 1;
    }
    fi_attention_params p;
    fi_attention_params_init(&p);
    p.num_qo_heads = HQ, p.num_kv_heads = HKV, p.head_dim_qk = p.head_dim_vo = D;
    p.page_size = PS, p.mask_mode = FI_MASK_CAUSAL;
    p.q_dtype = p.kv_dtype = p.o_dtype = FI_DTYPE_BF16;
    p.variant = v;
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    const char *what[3] = {"cold (NVRTC, empty cache)", "warm (disk cache, new context)",
                           "hot (context memory)"};
    fi_context *ctx = NULL;
    for (int pass = 0; pass < 3; pass++) {
        if (pass < 2) {
            if (ctx) fi_context_destroy(ctx);
            if (!(ctx = new_context())) return 1;
        }
        fi_cuda_jit_stats s0 = fi_cuda_jit_get_stats(ctx);
        fi_plan *plan = NULL;
        double t0 = now();
        fi_status st = fi_plan_create(ctx, &p, &cfg, &plan);
        double ms = 1e3 * (now() - t0);
        if (st) {
            printf("plan create: %s\n", fi_last_error());
            return 1;
        }
        fi_cuda_jit_stats s = fi_cuda_jit_get_stats(ctx);
        int n = s.compiled - s0.compiled + s.disk_loads - s0.disk_loads +
                s.memory_hits - s0.memory_hits;
        double jit_ms = 1e3 * (s.compile_seconds - s0.compile_seconds +
                               s.disk_load_seconds - s0.disk_load_seconds);
        printf("jit %-32s %d kernels (%d compiled, %d from disk, %d from memory): %.2f ms in "
               "the JIT, plan create %.2f ms\n",
               what[pass], n, s.compiled - s0.compiled, s.disk_loads - s0.disk_loads,
               s.memory_hits - s0.memory_hits, jit_ms, ms);
        tl += snprintf(table + tl, sizeof table - (size_t)tl, "| jit %s | %d kernels | %.2f ms | plan create %.2f ms |\n",
                       what[pass], n, jit_ms, ms);
        if (jf)
            fprintf(jf, "{\"bench\":\"variant_jit\",\"variant\":\"streaming\",\"pass\":\"%s\","
                        "\"kernels\":%d,\"jit_ms\":%.3f,\"plan_create_ms\":%.3f}\n",
                    pass == 0 ? "cold" : pass == 1 ? "warm" : "hot", n, jit_ms, ms);
        fi_plan_destroy(plan);
    }
    fi_context_destroy(ctx);
    fi_variant_destroy(v);
    return 0;
}

/* ------------------------------------------------------------- fused RoPE */

typedef struct buffers {
    gu_ptr q, qrot, k, krot, v, o, oref, scratch;
    size_t qbytes, kvbytes;
} buffers;

typedef struct cell {
    int decode, B, L;
    int64_t T, nq;      /* tokens of K/V, of Q */
    int32_t *qo, *kv, *idx, *last, *ro_indptr, *ro_offsets, *rq_offsets;
    gu_ptr d_kv_indptr, d_offsets, d_q_indptr, d_q_offsets;
} cell;

static fi_plan *make_plan(fi_context *ctx, const cell *c, int pos, const fi_variant *v) {
    fi_attention_params p;
    fi_attention_params_init(&p);
    p.num_qo_heads = HQ, p.num_kv_heads = HKV, p.head_dim_qk = p.head_dim_vo = D;
    p.page_size = PS;
    p.mask_mode = c->decode ? FI_MASK_NONE : FI_MASK_CAUSAL;
    p.q_dtype = p.kv_dtype = p.o_dtype = FI_DTYPE_BF16;
    p.pos_encoding = pos ? FI_POS_ROPE_LLAMA : FI_POS_NONE;
    p.variant = v;
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    cfg.max_batch_size = c->B, cfg.max_total_qo = (int32_t)c->nq;
    cfg.max_total_kv = (int32_t)(c->T / PS);
    fi_plan *plan = NULL;
    fi_batch fb = {c->B, c->qo, c->kv, c->idx, c->last, NULL};
    if (fi_plan_create(ctx, &p, &cfg, &plan) || fi_plan_update(plan, &fb)) {
        printf("plan: %s\n", fi_last_error());
        fi_plan_destroy(plan);
        return NULL;
    }
    return plan;
}

static fi_run_args run_args(const cell *c, const buffers *b, gu_ptr q, gu_ptr k, gu_ptr o,
                            gu_stream s) {
    fi_run_args a;
    memset(&a, 0, sizeof a);
    int64_t qs[3] = {c->nq, HQ, D}, ks[4] = {c->T / PS, PS, HKV, D};
    a.q = fi_tensor_contiguous((void *)(uintptr_t)q, FI_DTYPE_BF16, 3, qs);
    a.o = fi_tensor_contiguous((void *)(uintptr_t)o, FI_DTYPE_BF16, 3, qs);
    a.k = fi_tensor_contiguous((void *)(uintptr_t)k, FI_DTYPE_BF16, 4, ks);
    a.v = fi_tensor_contiguous((void *)(uintptr_t)b->v, FI_DTYPE_BF16, 4, ks);
    a.stream = s;
    return a;
}

/* The separate pass: RoPE on K (and q) into krot (qrot). */
static fi_status rope_pass(fi_context *ctx, const cell *c, const buffers *b, gu_stream s) {
    fi_rope_params rp;
    fi_rope_params_init(&rp);
    int64_t qs[3] = {c->nq, HQ, D}, ks[3] = {c->T, HKV, D};
    fi_tensor k = fi_tensor_contiguous((void *)(uintptr_t)b->k, FI_DTYPE_BF16, 3, ks);
    fi_tensor kr = fi_tensor_contiguous((void *)(uintptr_t)b->krot, FI_DTYPE_BF16, 3, ks);
    fi_tensor q = fi_tensor_contiguous((void *)(uintptr_t)b->q, FI_DTYPE_BF16, 3, qs);
    fi_tensor qr = fi_tensor_contiguous((void *)(uintptr_t)b->qrot, FI_DTYPE_BF16, 3, qs);
    int64_t one[1] = {c->B + 1}, bo[1] = {c->B};
    fi_tensor indptr = fi_tensor_contiguous((void *)(uintptr_t)c->d_kv_indptr, FI_DTYPE_I32, 1, one);
    fi_tensor offs = fi_tensor_contiguous((void *)(uintptr_t)c->d_offsets, FI_DTYPE_I32, 1, bo);
    if (!c->decode) /* q and k share their tokens: one call */
        return fi_rope_apply(ctx, &rp, &q, &k, &qr, &kr, &indptr, &offs, s);
    /* decode: K (head 0 of K as the k argument, into scratch), then q (head 0
     * of q likewise) at position L - 1 */
    int64_t k0s[3] = {c->T, 1, D}, q0s[3] = {c->nq, 1, D};
    fi_tensor k0 = k, sk = fi_tensor_contiguous((void *)(uintptr_t)b->scratch, FI_DTYPE_BF16, 3, k0s);
    k0.shape[1] = 1;
    fi_status st = fi_rope_apply(ctx, &rp, &k, &k0, &kr, &sk, &indptr, &offs, s);
    if (st) return st;
    fi_tensor q0 = q, sq = fi_tensor_contiguous((void *)(uintptr_t)b->scratch, FI_DTYPE_BF16, 3, q0s);
    q0.shape[1] = 1;
    fi_tensor qind = fi_tensor_contiguous((void *)(uintptr_t)c->d_q_indptr, FI_DTYPE_I32, 1, one);
    fi_tensor qoff = fi_tensor_contiguous((void *)(uintptr_t)c->d_q_offsets, FI_DTYPE_I32, 1, bo);
    return fi_rope_apply(ctx, &rp, &q, &q0, &qr, &sq, &qind, &qoff, s);
}

static float max_diff(gu_ptr a, gu_ptr b, size_t n) {
    uint16_t *x = malloc(n * 2), *y = malloc(n * 2);
    float m = 0;
    if (x && y && !GU(gu.DtoH(x, a, n * 2)) && !GU(gu.DtoH(y, b, n * 2)))
        for (size_t i = 0; i < n; i++) {
            float d = fabsf(tu_bf16_to_f32(x[i]) - tu_bf16_to_f32(y[i]));
            if (!(d <= m)) m = d; /* NaN sticks */
        }
    free(x), free(y);
    return m;
}

enum { M_PLAIN, M_SEPARATE, M_BUILTIN, M_VARIANT, NMODES };
static const char *mode_names[NMODES] = {"plain", "separate", "builtin", "variant"};

static int bench_cell(fi_context *ctx, buffers *b, cell *c, gu_stream s, gu_event e0,
                      gu_event e1, const fi_variant *rope) {
    fi_plan *plain = make_plan(ctx, c, 0, NULL), *builtin = c->decode ? make_plan(ctx, c, 1, NULL) : NULL;
    fi_plan *var = make_plan(ctx, c, 0, rope);
    if (!plain || !var || (c->decode && !builtin)) return 1;
    fi_variant_value vals[2] = {fi_variant_f32(1.0f), fi_variant_f32(1e4f)};
    fi_variant_args va = {2, vals};
    double bytes = 2.0 * (double)c->nq * HQ * D * 2 + 2.0 * (double)c->T * HKV * D * 2;
    double us[NMODES] = {0};
    float diff[NMODES] = {0};
    for (int m = 0; m < NMODES; m++) {
        if (m == M_BUILTIN && !c->decode) continue;
        fi_run_args a = run_args(c, b, m == M_SEPARATE ? b->qrot : b->q,
                                 m == M_SEPARATE ? b->krot : b->k, b->o, s);
        if (m == M_VARIANT) a.variant_args = &va;
        fi_plan *plan = m == M_BUILTIN ? builtin : m == M_VARIANT ? var : plain;
        float *ms = malloc(sizeof(float) * (size_t)reps);
        for (int t = -3; t < reps; t++) {
            fi_status st = GU(gu.EventRecord(e0, s)) ? FI_STATUS_BACKEND_ERROR : FI_OK;
            if (!st && m == M_SEPARATE) st = rope_pass(ctx, c, b, s);
            if (!st) st = fi_plan_run(plan, &a);
            if (st || GU(gu.EventRecord(e1, s)) || GU(gu.EventSynchronize(e1))) {
                printf("%s: %s\n", mode_names[m], fi_last_error());
                return 1;
            }
            if (t >= 0) GU(gu.EventElapsedTime(&ms[t], e0, e1));
        }
        qsort(ms, (size_t)reps, sizeof ms[0], gu_cmp_float);
        us[m] = 1e3 * ms[reps / 2];
        free(ms);
        size_t n = (size_t)c->nq * HQ * D;
        if (m == M_SEPARATE) { /* keep the reference output */
            uint16_t *h = malloc(n * 2);
            if (h && !GU(gu.DtoH(h, b->o, n * 2))) GU(gu.HtoD(b->oref, h, n * 2));
            free(h);
        }
        if (m == M_BUILTIN || m == M_VARIANT) diff[m] = max_diff(b->o, b->oref, n);
    }
    const char *w = c->decode ? "decode" : "prefill";
    printf("%s %3d x %5d:", w, c->B, c->L);
    for (int m = 0; m < NMODES; m++) {
        if (!us[m]) continue;
        double util = bytes / (us[m] * 1e-6) / CEILING;
        printf("  %s %.1f us (%.0f%%)", mode_names[m], us[m], 100 * util);
        if (jf)
            fprintf(jf,
                    "{\"bench\":\"fused_rope\",\"workload\":\"%s\",\"batch\":%d,\"len\":%d,"
                    "\"h_qo\":%d,\"h_kv\":%d,\"d\":%d,\"dtype\":\"bf16\",\"mode\":\"%s\","
                    "\"us\":%.2f,\"bytes\":%.0f,\"bw_util\":%.4f,\"max_diff_vs_separate\":%.5f,"
                    "\"reps\":%d}\n",
                    w, c->B, c->L, HQ, HKV, D, mode_names[m], us[m], bytes, util, diff[m], reps);
    }
    printf("  | max diff vs separate: builtin %.4f variant %.4f\n", diff[M_BUILTIN],
           diff[M_VARIANT]);
    char bcol[64] = "-";
    if (us[M_BUILTIN])
        snprintf(bcol, sizeof bcol, "%.1f (%.2fx)", us[M_BUILTIN], us[M_SEPARATE] / us[M_BUILTIN]);
    tl += snprintf(table + tl, sizeof table - (size_t)tl,
                   "| %s | %d x %d | %.1f | %.1f | %s | %.1f | %.0f%% | %.0f%% | %.2fx |\n", w,
                   c->B, c->L, us[M_PLAIN], us[M_SEPARATE], bcol, us[M_VARIANT],
                   100 * bytes / (us[M_SEPARATE] * 1e-6) / CEILING,
                   100 * bytes / (us[M_VARIANT] * 1e-6) / CEILING, us[M_SEPARATE] / us[M_VARIANT]);
    fi_plan_destroy(plain), fi_plan_destroy(builtin), fi_plan_destroy(var);
    return 0;
}

static int setup_cell(cell *c, int decode, int B, int L) {
    memset(c, 0, sizeof *c);
    c->decode = decode, c->B = B, c->L = L;
    c->T = (int64_t)B * L, c->nq = decode ? B : c->T;
    int pages = L / PS;
    c->qo = malloc(sizeof(int32_t) * (B + 1)), c->kv = malloc(sizeof(int32_t) * (B + 1));
    c->ro_indptr = malloc(sizeof(int32_t) * (B + 1));
    c->last = malloc(sizeof(int32_t) * B), c->idx = malloc(sizeof(int32_t) * (size_t)B * pages);
    c->ro_offsets = calloc((size_t)B, sizeof(int32_t));
    c->rq_offsets = malloc(sizeof(int32_t) * B);
    int32_t *qind = malloc(sizeof(int32_t) * (B + 1));
    for (int i = 0; i <= B; i++) {
        c->qo[i] = decode ? i : i * L, c->kv[i] = i * pages, c->ro_indptr[i] = i * L;
        qind[i] = i;
    }
    for (int i = 0; i < B; i++) c->last[i] = PS, c->rq_offsets[i] = L - 1;
    for (int64_t j = 0; j < (int64_t)B * pages; j++) c->idx[j] = (int32_t)j;
    size_t ib = sizeof(int32_t) * (B + 1), ob = sizeof(int32_t) * B;
    int bad = GU(gu.MemAlloc(&c->d_kv_indptr, ib)) || GU(gu.MemAlloc(&c->d_offsets, ob)) ||
              GU(gu.MemAlloc(&c->d_q_indptr, ib)) || GU(gu.MemAlloc(&c->d_q_offsets, ob)) ||
              GU(gu.HtoD(c->d_kv_indptr, c->ro_indptr, ib)) ||
              GU(gu.HtoD(c->d_offsets, c->ro_offsets, ob)) || GU(gu.HtoD(c->d_q_indptr, qind, ib)) ||
              GU(gu.HtoD(c->d_q_offsets, c->rq_offsets, ob));
    free(qind);
    return bad;
}

static void free_cell(cell *c) {
    free(c->qo), free(c->kv), free(c->idx), free(c->last), free(c->ro_indptr);
    free(c->ro_offsets), free(c->rq_offsets);
    gu.MemFree(c->d_kv_indptr), gu.MemFree(c->d_offsets), gu.MemFree(c->d_q_indptr),
        gu.MemFree(c->d_q_offsets);
}

static int in_list(const char *list, int B, int L) {
    char cellname[32], l[512];
    snprintf(cellname, sizeof cellname, ",%dx%d,", B, L);
    snprintf(l, sizeof l, ",%s,", list);
    return strstr(l, cellname) != NULL;
}

int main(int argc, char **argv) {
    const char *json = NULL, *dec = "16x4096,64x4096,256x4096", *pre = "32x4096,1x16384";
    int do_jit = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc) dec = argv[++i];
        else if (!strcmp(argv[i], "--prefill") && i + 1 < argc) pre = argv[++i];
        else if (!strcmp(argv[i], "--no-jit")) do_jit = 0;
    }
    if (reps < 30) reps = 30;
    if (!fi_device_available(FI_DEVICE_CUDA) || gu_init(0)) {
        printf("no CUDA device\n");
        return 0;
    }
    jf = json ? fopen(json, "w") : NULL;
    if (do_jit && bench_jit()) return 1;
    fi_context *ctx = new_context();
    if (!ctx) return 1;
    printf("%s\n", fi_context_describe(ctx));
    const fi_variant *rope = NULL;
    if (fi_variant_builtin("rope_llama", &rope)) return 1;
    /* buffers for the largest cell: 256 x 4096 decode or 32 x 4096 prefill
     * (1M tokens of K/V), q up to 131072 tokens */
    const int64_t MAXT = 1 << 20, MAXQ = 131072;
    buffers b;
    memset(&b, 0, sizeof b);
    b.qbytes = (size_t)MAXQ * HQ * D * 2, b.kvbytes = (size_t)MAXT * HKV * D * 2;
    tu_rng rng;
    tu_rng_seed(&rng, 11);
    if (GU(gu.MemAlloc(&b.q, b.qbytes)) || GU(gu.MemAlloc(&b.qrot, b.qbytes)) ||
        GU(gu.MemAlloc(&b.o, b.qbytes)) || GU(gu.MemAlloc(&b.oref, b.qbytes)) ||
        GU(gu.MemAlloc(&b.k, b.kvbytes)) || GU(gu.MemAlloc(&b.krot, b.kvbytes)) ||
        GU(gu.MemAlloc(&b.v, b.kvbytes)) || GU(gu.MemAlloc(&b.scratch, (size_t)MAXT * D * 2)) ||
        gu_fill_random_bf16(b.q, b.qbytes, &rng) || gu_fill_random_bf16(b.k, b.kvbytes, &rng) ||
        gu_fill_random_bf16(b.v, b.kvbytes, &rng))
        return 1;
    gu_stream s = NULL;
    gu_event e0 = NULL, e1 = NULL;
    GU(gu.StreamCreate(&s, 1));
    GU(gu.EventCreate(&e0, 0));
    GU(gu.EventCreate(&e1, 0));
    tl += snprintf(table + tl, sizeof table - (size_t)tl,
                   "\n| workload | cell | plain (us) | separate (us) | builtin fused (us, speed-up) | variant fused (us) |"
                   " separate BW | fused BW | fused speed-up |\n|---|---|---|---|---|---|---|---|---|\n");
    static const int dB[] = {1, 16, 64, 256}, dL[] = {1024, 4096, 16384};
    static const int pB[] = {128, 32, 16, 1}, pL[] = {1024, 4096, 8192, 16384};
    int status = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) {
                int B = pass == 0 ? dB[i] : pB[i], L = pass == 0 ? (j < 3 ? dL[j] : 0) : pL[j];
                if (!L || !in_list(pass == 0 ? dec : pre, B, L)) continue;
                if ((int64_t)B * L > MAXT || (pass == 1 && (int64_t)B * L > MAXQ)) continue;
                cell c;
                if (setup_cell(&c, pass == 0, B, L)) return 1;
                status |= bench_cell(ctx, &b, &c, s, e0, e1, rope);
                free_cell(&c);
            }
    }
    if (jf) fclose(jf);
    printf("%s", table);
    fi_context_destroy(ctx);
    return status;
}
