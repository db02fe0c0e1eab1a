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
 *                       [--heads HQ/HKV] [--head-dim D]
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

enum { PS = 16 };
static int HQ = 32, HKV = 8, D = 128;
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
        }
    }
    if (reps < 30) reps = 30;
    const char *kernels = getenv("FLASHINFER_CUDA_KERNELS");
    const int64_t MAXTOK = 131072 * 4096 / ((int64_t)HQ * D); /* 128 x 1024 tokens at 32 x 128 */
    gu_bench bench;
    int st = gu_bench_init(&bench, (size_t)MAXTOK * HQ * D * 2, (size_t)MAXTOK * HKV * D * 2, 7,
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
    static const int Bs[] = {128, 64, 32, 16, 1, 1}, Ls[] = {1024, 2048, 4096, 8192, 16384, 32768};
    char table[8192];
    int tl = snprintf(table, sizeof table,
                      "| kv | batch | len | time (ms) | TFLOP/s | %% of 785 | items |\n"
                      "|---|---|---|---|---|---|---|\n");
    int status = 0;
    for (int paged = 1; paged >= 0; paged--) {
        if ((paged && !want_paged) || (!paged && !want_ragged)) continue;
        for (int ci = 0; ci < 6; ci++) {
            int B = Bs[ci], L = Ls[ci];
            if (cells) {
                char cell[32], list[256];
                snprintf(cell, sizeof cell, ",%dx%d,", B, L);
                snprintf(list, sizeof list, ",%s,", cells);
                if (!strstr(list, cell)) continue;
            }
            int64_t T = (int64_t)B * L, pages = T / PS;
            fi_attention_params p = gu_bench_params(HQ, HKV, D, paged ? PS : 1);
            p.mask_mode = FI_MASK_CAUSAL;
            p.kv_format = paged ? FI_KV_FORMAT_PAGED : FI_KV_FORMAT_RAGGED;
            fi_plan_config cfg;
            fi_plan_config_init(&cfg);
            cfg.max_batch_size = B, cfg.max_total_qo = (int32_t)T;
            cfg.max_total_kv = (int32_t)(paged ? pages : T);
            cfg.num_workers = workers; /* 0: the backend's choice */
            int32_t *qo = malloc(sizeof(int32_t) * (B + 1)), *kv = malloc(sizeof(int32_t) * (B + 1));
            int32_t *last = malloc(sizeof(int32_t) * B), *idx = malloc(sizeof(int32_t) * pages);
            for (int i = 0; i <= B; i++) qo[i] = i * L, kv[i] = paged ? i * (L / PS) : i * L;
            for (int i = 0; i < B; i++) last[i] = PS;
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
                printf("cell %d x %d: %s\n", B, L, fi_last_error());
                return 1;
            }
            fi_run_args a;
            memset(&a, 0, sizeof a);
            int64_t qs[3] = {T, HQ, D}, pk[4] = {pages, PS, HKV, D}, rk[3] = {T, HKV, D};
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
            double flops = 4.0 * HQ * D * (double)B * ((double)L * (L + 1) / 2);
            double tf = flops / (med * 1e-3) / 1e12;
            uint16_t o16[256];
            GU(gu.DtoH(o16, dout + (gu_ptr)(T - 1) * HQ * D * 2, sizeof o16));
            int finite = 1;
            for (int i = 0; i < 256; i++) finite &= isfinite(tu_bf16_to_f32(o16[i]));
            if (!finite) status = 1;
            tl += snprintf(table + tl, sizeof table - (size_t)tl, "| %s | %d | %d | %.3f | %.1f | %.0f%% | %d |%s\n",
                           !paged ? "ragged" : contiguous ? "paged 16, in order" : "paged 16", B, L, med, tf, 100 * tf * 1e12 / GEMM,
                           info.num_items, finite ? "" : " NON-FINITE OUTPUT");
            printf("prefill %-8s %3d x %5d: %8.3f ms %6.1f TFLOP/s (min %.3f max %.3f ms, %d items, q tile %d)\n",
                   !paged ? "ragged" : contiguous ? "paged-in-order" : "paged", B, L, med, tf, ms[0], ms[reps - 1], info.num_items,
                   info.q_tile);
            if (jf)
                fprintf(jf,
                        "{\"workload\":\"prefill\",\"kv\":\"%s\",\"batch\":%d,\"len\":%d,\"h_qo\":%d,"
                        "\"h_kv\":%d,\"d\":%d,\"causal\":1,\"dtype\":\"bf16\",\"ms\":%.4f,"
                        "\"tflops\":%.2f,\"items\":%d,\"q_tile\":%d,\"reps\":%d,\"tc\":%d}\n",
                        !paged ? "ragged" : contiguous ? "paged16_in_order" : "paged16", B, L, HQ, HKV, D, med, tf, info.num_items,
                        info.q_tile, reps, !(kernels && !strcmp(kernels, "cuda-cores")));
            free(ms);
            fi_plan_destroy(plan);
            free(qo), free(kv), free(last), free(idx);
        }
    }
    if (jf) fclose(jf);
    printf("\n%s", table);
    fi_context_destroy(ctx);
    return status;
}
