/*
 * bench_prefill.c — the prefill cells (docs/BENCHMARKS.md) on the CUDA backend: causal,
 * H_qo/H_kv 32/8, d 128, bf16, (batch, len) = (128, 1k), (64, 2k), (32, 4k),
 * (16, 8k), (1, 16k), (1, 32k); paged (page 16, NHD, random pages) and ragged
 * KV. Every query of a request is a new token (qo_len = kv_len = len).
 *
 * Inputs are random bf16 (never zeros). Timing: device events around one
 * run (each run is milliseconds: no graph needed), warm-up first, median of
 * >= 30. FLOPs = 4 * H_qo * D * visible (query, key) pairs (causal: the
 * lower triangle, len (len + 1) / 2 per request); TFLOP/s; % of the
 * measured bf16 GEMM rate (785 TFLOP/s, docs/BENCHMARKS.md).
 *
 *   build/bench_prefill [--json FILE] [--reps N] [--cells 128x1024,1x32768]
 *                       [--ragged-only | --paged-only] [--contiguous] [--workers N]
 *                       [--heads HQ/HKV] [--head-dim D] [--page-size P]
 * --cells: any cells: B x L (L new tokens a request), B x LO-HI (each
 * request's length drawn from U(LO, HI): gu_draw_lengths, the same requests
 * as bench_flashinfer.py's), B x Q+P (a chunk of Q new tokens over a cached
 * prefix of P: kv_len P + Q, causal bottom-right); the prefill grid of
 * tests/gpu/run_device.sh --prefill-grid (bench/cuda/prefill_grid.txt).
 * --contiguous: the paged cells' pages in order (page i holds tokens
 * 16 i ..) instead of a random permutation: the paged kernel on the ragged
 * cells' addresses, which tells its own cost from the scattered pages'.
 * --workers N: the plan's workers (fi_plan_config.num_workers; default the
 * backend's, one per SM). --heads, --head-dim: other head configurations
 * than 32/8 d 128 (e.g. 16/8 d 256), on the same cells.
 * FLASHINFER_CUDA_KERNELS=cuda-cores in the environment times the CUDA-core
 * kernel instead of the tensor-core one.
 */
#include "flashinfer.h"
#include "../../tests/gpu/gpu_util.h"
#include "../../tests/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int HQ = 32, HKV = 8, D = 128, PS = 16;
enum { MAXCELLS = 32 };

/* A cell: B requests, q_len[i] new tokens over kv_len[i] keys; its label
 * ("1024", "U(300,4000)", "2048+10240") names it in the output. */
typedef struct cell {
    int B, lo, hi, prefix;
    char label[40];
} cell;

/* "BxL", "BxLO-HI" or "BxQ+P" at *s (advanced past it); 0 if malformed. */
static int parse_cell(const char **s, cell *c) {
    int used = 0, used2 = 0;
    memset(c, 0, sizeof *c);
    if (sscanf(*s, "%dx%d%n", &c->B, &c->lo, &used) != 2 || c->B < 1 || c->lo < 1) return 0;
    c->hi = c->lo;
    if ((*s)[used] == '-' && (sscanf(*s + used + 1, "%d%n", &c->hi, &used2) != 1 || c->hi < c->lo))
        return 0;
    if ((*s)[used] == '+' && (sscanf(*s + used + 1, "%d%n", &c->prefix, &used2) != 1 || c->prefix < 0))
        return 0;
    if (c->prefix) snprintf(c->label, sizeof c->label, "%d+%d", c->lo, c->prefix);
    else if (c->hi != c->lo) snprintf(c->label, sizeof c->label, "U(%d,%d)", c->lo, c->hi);
    else snprintf(c->label, sizeof c->label, "%d", c->lo);
    *s += used + (used2 ? used2 + 1 : 0);
    return 1;
}
static const double GEMM = 785e12;

int main(int argc, char **argv) {
    const char *json = NULL, *cells = NULL;
    int reps = 30, want_paged = 1, want_ragged = 1, contiguous = 0, workers = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cells") && i + 1 < argc) cells = argv[++i];
        else if (!strcmp(argv[i], "--ragged-only")) want_paged = 0;
        else if (!strcmp(argv[i], "--paged-only")) want_ragged = 0;
        else if (!strcmp(argv[i], "--contiguous")) contiguous = 1;
        else if (!strcmp(argv[i], "--workers") && i + 1 < argc) workers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--heads") && i + 1 < argc) {
            if (sscanf(argv[++i], "%d/%d", &HQ, &HKV) != 2 || HQ < 1 || HKV < 1 || HQ % HKV) {
                fprintf(stderr, "--heads HQ/HKV: HQ a multiple of HKV\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--head-dim") && i + 1 < argc) {
            D = atoi(argv[++i]);
            if (D != 64 && D != 128 && D != 256) {
                fprintf(stderr, "--head-dim: 64, 128 or 256\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--page-size") && i + 1 < argc) {
            PS = atoi(argv[++i]);
            if (PS < 1) {
                fprintf(stderr, "--page-size: at least 1\n");
                return 2;
            }
        }
    }
    if (reps < 30) reps = 30;
    /* the cells: the six of docs/BENCHMARKS.md, or --cells */
    cell cl[MAXCELLS];
    int ncells = 0;
    const char *list = cells ? cells : "128x1024,64x2048,32x4096,16x8192,1x16384,1x32768";
    for (const char *c = list; *c && ncells < MAXCELLS;) {
        if (!parse_cell(&c, &cl[ncells++])) {
            fprintf(stderr, "--cells: expected BxL, BxLO-HI or BxQ+P[,...], got '%s'\n", c);
            return 2;
        }
        if (*c == ',') c++;
    }
    /* buffers for the largest cell: its query tokens, and its keys in pages */
    int64_t max_q = 1, max_kv = 1;
    for (int i = 0; i < ncells; i++) {
        const cell *c = &cl[i];
        max_q = c->B * (int64_t)c->hi > max_q ? c->B * (int64_t)c->hi : max_q;
        int64_t kv = c->B * (((int64_t)c->hi + c->prefix + PS - 1) / PS * PS);
        max_kv = kv > max_kv ? kv : max_kv;
    }
    const char *kernels = getenv("FLASHINFER_CUDA_KERNELS");
    gu_bench bench;
    int st = gu_bench_init(&bench, (size_t)max_q * HQ * D * 2, (size_t)max_kv * HKV * D * 2, 7,
                           kernels && !strcmp(kernels, "cuda-cores")
                               ? "kernel: CUDA cores (FLASHINFER_CUDA_KERNELS=cuda-cores)"
                               : "kernel: tensor cores");
    if (st) return st < 0;
    fi_context *ctx = bench.ctx;
    tu_rng rng = bench.rng;
    gu_ptr dq = bench.q, dk = bench.k, dv = bench.v, dout = bench.o;
    gu_stream s = bench.s;
    gu_event e0 = bench.e0, e1 = bench.e1;
    FILE *jf = json ? fopen(json, "w") : NULL;
    char table[16384];
    int tl = snprintf(table, sizeof table,
                      "| kv | batch | len | time (ms) | TFLOP/s | %% of 785 | items |\n"
                      "|---|---|---|---|---|---|---|\n");
    int status = 0;
    for (int paged = 1; paged >= 0; paged--) {
        if ((paged && !want_paged) || (!paged && !want_ragged)) continue;
        for (int ci = 0; ci < ncells; ci++) {
            const int B = cl[ci].B;
            const char *label = cl[ci].label;
            /* the requests' new tokens and keys (the same for paged and ragged) */
            int32_t *qlen = malloc(sizeof(int32_t) * B);
            if (!qlen) return 1;
            gu_draw_lengths(qlen, B, cl[ci].lo, cl[ci].hi);
            int32_t *qo = malloc(sizeof(int32_t) * (B + 1)), *kv = malloc(sizeof(int32_t) * (B + 1));
            int32_t *last = malloc(sizeof(int32_t) * B);
            if (!qo || !kv || !last) return 1;
            double pairs = 0; /* visible (query, key) pairs, causal bottom-right */
            qo[0] = kv[0] = 0;
            for (int i = 0; i < B; i++) {
                const int32_t q = qlen[i], k = q + cl[ci].prefix, np = (k + PS - 1) / PS;
                qo[i + 1] = qo[i] + q;
                kv[i + 1] = kv[i] + (paged ? np : k);
                last[i] = k - (np - 1) * PS;
                pairs += (double)q * (k - q) + (double)q * (q + 1) / 2;
            }
            const int64_t T = qo[B], pages = paged ? kv[B] : 0;
            fi_attention_params p = gu_bench_params(HQ, HKV, D, paged ? PS : 1);
            p.mask_mode = FI_MASK_CAUSAL;
            p.kv_format = paged ? FI_KV_FORMAT_PAGED : FI_KV_FORMAT_RAGGED;
            fi_plan_config cfg;
            fi_plan_config_init(&cfg);
            cfg.max_batch_size = B, cfg.max_total_qo = (int32_t)T;
            cfg.max_total_kv = kv[B];
            cfg.num_workers = workers; /* 0: the backend's choice */
            int32_t *idx = malloc(sizeof(int32_t) * (size_t)(pages ? pages : 1));
            if (!idx) return 1;
            /* a random permutation of the pool's pages */
            for (int64_t i = 0; i < pages; i++) idx[i] = (int32_t)i;
            for (int64_t i = pages - 1; i > 0 && !contiguous; i--) {
                int64_t j = tu_rng_int(&rng, 0, (int32_t)i);
                int32_t t = idx[i];
                idx[i] = idx[j], idx[j] = t;
            }
            fi_batch fb = {B, qo, kv, paged ? idx : NULL, paged ? last : NULL, NULL};
            fi_plan *plan = NULL;
            fi_plan_info info = {.struct_size = sizeof info};
            if (fi_plan_create(ctx, &p, &cfg, &plan) || fi_plan_update(plan, &fb) ||
                fi_plan_get_info(plan, &info)) {
                printf("cell %d x %s: %s\n", B, label, fi_last_error());
                return 1;
            }
            fi_run_args a;
            memset(&a, 0, sizeof a);
            int64_t qs[3] = {T, HQ, D}, pk[4] = {pages, PS, HKV, D}, rk[3] = {kv[B], HKV, D};
            a.q = fi_tensor_contiguous((void *)(uintptr_t)dq, FI_DTYPE_BF16, 3, qs);
            a.o = fi_tensor_contiguous((void *)(uintptr_t)dout, FI_DTYPE_BF16, 3, qs);
            a.k = fi_tensor_contiguous((void *)(uintptr_t)dk, FI_DTYPE_BF16, paged ? 4 : 3, paged ? pk : rk);
            a.v = fi_tensor_contiguous((void *)(uintptr_t)dv, FI_DTYPE_BF16, paged ? 4 : 3, paged ? pk : rk);
            a.stream = s;
            for (int w = 0; w < 3; w++)
                if (fi_plan_run(plan, &a)) {
                    printf("run: %s\n", fi_last_error());
                    return 1;
                }
            float *ms = malloc(sizeof(float) * reps);
            for (int t = 0; t < reps; t++) {
                if (GU(gu.EventRecord(e0, s)) || fi_plan_run(plan, &a) || GU(gu.EventRecord(e1, s)) ||
                    GU(gu.EventSynchronize(e1)) || GU(gu.EventElapsedTime(&ms[t], e0, e1))) {
                    printf("timing: %s\n", fi_last_error());
                    return 1;
                }
            }
            qsort(ms, (size_t)reps, sizeof ms[0], gu_cmp_float);
            double med = ms[reps / 2];
            double flops = 4.0 * HQ * D * pairs;
            double tf = flops / (med * 1e-3) / 1e12;
            uint16_t o16[256];
            GU(gu.DtoH(o16, dout + (gu_ptr)(T - 1) * HQ * D * 2, sizeof o16));
            int finite = 1;
            for (int i = 0; i < 256; i++) finite &= isfinite(tu_bf16_to_f32(o16[i]));
            if (!finite) status = 1;
            char kvname[32];
            if (!paged) snprintf(kvname, sizeof kvname, "ragged");
            else snprintf(kvname, sizeof kvname, "paged %d%s", PS, contiguous ? ", in order" : "");
            tl += snprintf(table + tl, sizeof table - (size_t)tl, "| %s | %d | %s | %.3f | %.1f | %.0f%% | %d |%s\n",
                           kvname, B, label, med, tf, 100 * tf * 1e12 / GEMM, info.num_items,
                           finite ? "" : " NON-FINITE OUTPUT");
            printf("prefill %-8s %3d x %5s: %8.3f ms %6.1f TFLOP/s (min %.3f max %.3f ms, %d items, q tile %d)\n",
                   !paged ? "ragged" : contiguous ? "paged-in-order" : "paged", B, label, med, tf, ms[0], ms[reps - 1], info.num_items,
                   info.q_tile);
            if (jf) {
                /* len, q_len, kv_len: numbers, or (drawn lengths) "U(lo,hi)" */
                const cell *c = &cl[ci];
                char len_s[48], q_s[48], kv_s[48];
                if (c->lo == c->hi) {
                    snprintf(q_s, sizeof q_s, "%d", c->lo);
                    snprintf(kv_s, sizeof kv_s, "%d", c->lo + c->prefix);
                } else {
                    snprintf(q_s, sizeof q_s, "\"%s\"", label);
                    snprintf(kv_s, sizeof kv_s, "\"%s\"", label);
                }
                if (c->lo == c->hi && !c->prefix) snprintf(len_s, sizeof len_s, "%d", c->lo);
                else snprintf(len_s, sizeof len_s, "\"%s\"", label);
                fprintf(jf,
                        "{\"workload\":\"prefill\",\"kv\":\"%s\",\"page\":%d,\"batch\":%d,"
                        "\"len\":%s,\"q_len\":%s,\"kv_len\":%s,\"h_qo\":%d,\"h_kv\":%d,\"d\":%d,"
                        "\"causal\":1,\"dtype\":\"bf16\",\"ms\":%.4f,\"tflops\":%.2f,\"items\":%d,"
                        "\"q_tile\":%d,\"reps\":%d,\"tc\":%d}\n",
                        !paged ? "ragged" : contiguous ? "paged_in_order" : "paged", paged ? PS : 0,
                        B, len_s, q_s, kv_s, HQ, HKV, D, med, tf, info.num_items, info.q_tile, reps,
                        !(kernels && !strcmp(kernels, "cuda-cores")));
            }
            free(ms);
            fi_plan_destroy(plan);
            free(qo), free(kv), free(last), free(idx), free(qlen);
        }
    }
    if (jf) fclose(jf);
    printf("\n%s", table);
    fi_context_destroy(ctx);
    return status;
}
