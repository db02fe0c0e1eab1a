/*
 * bench_decode.c — the paged decode cells (docs/BENCHMARKS.md) on the CUDA backend:
 * batch {1, 16, 64, 256} x kv_len {1024, 4096, 16384, 32768}, H_qo/H_kv
 * 32/8, d 128, page 16, NHD, bf16 (or --kv-dtype e4m3|e5m2: FP8 K/V with
 * scales 0.5 and 2, bf16 Q and O), no LSE.
 *
 * Pages are drawn at random from a pool of random values (never zeros): 4
 * GiB of K and V, or the largest cell's pages; a batch never holds a page twice
 * (gpu_util.h gu_draw_pages). Small cells rotate over several plans (different pages) so that
 * at least ~300 MB is read per timed graph and the 60 MB L2 cannot hold it.
 * Timing: a CUDA graph of one run per plan, replayed; device events around
 * each replay, median of >= 30 after warm-up; time per run = replay / plans.
 * Bytes = Q + K + V (once per KV head) + O; TB/s decimal; % of the measured
 * device-to-device copy ceiling (4.22 TB/s, docs/BENCHMARKS.md).
 *
 *   build/bench_decode [--json FILE] [--reps N] [--batch B] [--kv L]
 *                      [--cells 1x1024,256x4096,64x500-8000] [--workers N]
 *                      [--contiguous] [--split N] [--device-table] [--hnd]
 *                      [--pool PAGES] [--kv-dtype bf16|e4m3|e5m2]
 *                      [--heads HQ/HKV] [--head-dim D] [--page-size P]
 * --contiguous: the requests' pages are consecutive runs, back to back (as
 * FlashInfer's benchmarks lay them out), instead of pages drawn at random.
 * --cells: any cells B x L (not only the grid above); B x LO-HI draws each
 * request's length from U(LO, HI) (gu_draw_lengths: the same lengths as
 * bench_flashinfer.py's for that cell).
 * --heads, --head-dim, --page-size: another shape than 32/8, d 128, page 16
 * (the decode grid of tests/gpu/run_device.sh --decode-grid,
 * bench/cuda/decode_grid.txt).
 * --device-table: each plan's page table in device memory
 * (fi_plan_config.device_page_table: the kernels that clamp page ids).
 * --split N: fixed split-KV chunks of N keys (fi_plan_config.fixed_split_size)
 * instead of the scheduler's own choice (experiments on the chunk size).
 * --hnd: the cache laid out HND ([pages, H_kv, page, D]: a KV head's page is
 * one 4 KB run) instead of NHD (a head's keys are 256-byte runs 2 KB apart
 * in the page): tells the scattered runs' cost from the pages' own.
 * --pool PAGES: draw from a pool of this many pages (at least the largest
 * cell's) instead of 4 GiB: how far apart random pages lie, apart from
 * their order.
 */
#include "flashinfer.h"
#include "../../tests/gpu/gpu_util.h"
#include "../../tests/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAXPLANS = 16, MAXCELLS = 64 };
static const double CEILING = 4.22e12;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct cell_plan {
    fi_plan *plan;
    int32_t *qo_indptr, *kv_indptr, *indices, *last;
    gu_ptr table; /* --device-table: indices on the device */
} cell_plan;

int main(int argc, char **argv) {
    const char *json = NULL;
    int reps = 30, only_b = 0, only_l = 0, workers = 0, contiguous = 0, split = 0, dtable = 0;
    int hnd = 0, pool_pages = 0, HQ = 32, HKV = 8, D = 128, PS = 16;
    const char *cells = NULL;
    fi_dtype kvt = FI_DTYPE_BF16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) only_b = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv") && i + 1 < argc) only_l = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--workers") && i + 1 < argc) workers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--contiguous")) contiguous = 1;
        else if (!strcmp(argv[i], "--device-table")) dtable = 1;
        else if (!strcmp(argv[i], "--hnd")) hnd = 1;
        else if (!strcmp(argv[i], "--pool") && i + 1 < argc) pool_pages = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--split") && i + 1 < argc) split = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cells") && i + 1 < argc) cells = argv[++i];
        else if (!strcmp(argv[i], "--head-dim") && i + 1 < argc) D = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--page-size") && i + 1 < argc) PS = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--heads") && i + 1 < argc) {
            if (sscanf(argv[++i], "%d/%d", &HQ, &HKV) != 2 || HQ < 1 || HKV < 1 || HQ % HKV) {
                printf("--heads: expected HQ/HKV (HQ a multiple of HKV), got '%s'\n", argv[i]);
                return 1;
            }
        }
        else if (!strcmp(argv[i], "--kv-dtype") && i + 1 < argc) {
            const char *t = argv[++i];
            kvt = !strcmp(t, "e4m3") ? FI_DTYPE_E4M3 : !strcmp(t, "e5m2") ? FI_DTYPE_E5M2
                  : !strcmp(t, "bf16") ? FI_DTYPE_BF16 : FI_DTYPE_F32;
            if (kvt == FI_DTYPE_F32) {
                printf("--kv-dtype: expected bf16, e4m3 or e5m2, got '%s'\n", t);
                return 1;
            }
        }
    }
    const int kvb = kvt == FI_DTYPE_BF16 ? 2 : 1; /* bytes per K/V element */
    if (reps < 30) reps = 30;
    if (D < 8 || D % 8 || D > 512 || PS < 1) {
        printf("--head-dim %d / --page-size %d: expected a head dim a multiple of 8 up to 512 and a "
               "page size >= 1\n", D, PS);
        return 1;
    }
    /* the cells: the decode grid, or --cells (any B x L, or B x LO-HI) */
    static const int batches[] = {1, 16, 64, 256}, lens[] = {1024, 4096, 16384, 32768};
    int cell_b[MAXCELLS], cell_lo[MAXCELLS], cell_hi[MAXCELLS], ncells = 0, max_b = 1;
    if (cells) {
        for (const char *c = cells; *c && ncells < MAXCELLS;) {
            int b = 0, lo = 0, hi = 0, used = 0, used2 = 0;
            if (sscanf(c, "%dx%d%n", &b, &lo, &used) != 2 || b < 1 || lo < 1) {
                printf("--cells: expected BxL or BxLO-HI[,...], got '%s'\n", c);
                return 1;
            }
            hi = lo;
            if (c[used] == '-' && (sscanf(c + used + 1, "%d%n", &hi, &used2) != 1 || hi < lo)) {
                printf("--cells: expected BxLO-HI with LO <= HI, got '%s'\n", c);
                return 1;
            }
            c += used + (used2 ? used2 + 1 : 0);
            cell_b[ncells] = b, cell_lo[ncells] = lo, cell_hi[ncells++] = hi;
            if (*c == ',') c++;
        }
    } else {
        for (int bi = 0; bi < 4; bi++)
            for (int li = 0; li < 4; li++) {
                cell_b[ncells] = batches[bi];
                cell_lo[ncells] = cell_hi[ncells] = lens[li];
                ncells++;
            }
    }
    /* the pool: 4 GiB of K and V pages (or --pool pages), at least the
     * largest cell's pages (a batch never holds a page twice: gu_draw_pages) */
    const int64_t page_bytes = (int64_t)PS * HKV * D * 2;
    int64_t pool64 = pool_pages > 0 ? pool_pages : ((int64_t)2 << 30) / page_bytes;
    for (int i = 0; i < ncells; i++) {
        max_b = cell_b[i] > max_b ? cell_b[i] : max_b;
        int64_t need = (int64_t)cell_b[i] * ((cell_hi[i] + PS - 1) / PS);
        if (need > pool64) pool64 = need;
    }
    if (pool64 > INT32_MAX / 2) {
        printf("a pool of %lld pages: too many\n", (long long)pool64);
        return 1;
    }
    const int32_t pool = (int32_t)pool64;
    gu_bench bench;
    char what[160];
    snprintf(what, sizeof what, "%d/%d heads, d %d, page %d, %s%spages %s, pool of %d", HQ, HKV, D,
             PS, kvb == 1 ? "FP8 K/V, " : "", hnd ? "HND, " : "",
             contiguous ? "contiguous per request" : "random", (int)pool);
    int st = gu_bench_init(&bench, (size_t)max_b * HQ * D * 2, (size_t)pool * PS * HKV * D * 2, 42,
                           what);
    if (st) return st < 0;
    /* FP8: the pools' first halves hold random FP8 values instead */
    size_t kv8 = (size_t)pool * PS * HKV * D;
    if (kvb == 1 && (gu_fill_random_fp8(bench.k, kv8, kvt, &bench.rng) ||
                     gu_fill_random_fp8(bench.v, kv8, kvt, &bench.rng)))
        return 1;
    fi_context *ctx = bench.ctx;
    tu_rng rng = bench.rng;
    gu_ptr dk = bench.k, dv = bench.v, dq = bench.q, dout = bench.o;
    gu_stream s = bench.s;
    fi_attention_params p = gu_bench_params(HQ, HKV, D, PS);
    if (hnd) p.kv_layout = FI_KV_LAYOUT_HND;
    if (kvb == 1) p.kv_dtype = kvt, p.k_scale = 0.5f, p.v_scale = 2.0f;
    int64_t ks[4] = {pool, hnd ? HKV : PS, hnd ? PS : HKV, D};

    FILE *jf = json ? fopen(json, "w") : NULL;
    char table[16384];
    int tl = snprintf(table, sizeof table,
                      "| batch | kv_len | time (us) | TB/s | %% of 4.22 | plans | items | split |"
                      " plan_update (us) |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int ci = 0; ci < ncells; ci++) {
        {
            const int B = cell_b[ci], LO = cell_lo[ci], HI = cell_hi[ci], L = HI;
            if ((only_b && B != only_b) || (only_l && L != only_l)) continue;
            /* the requests' lengths, pages and last pages (the same for every plan) */
            int32_t *len = malloc(sizeof(int32_t) * (size_t)B);
            int32_t *kv_indptr = malloc(sizeof(int32_t) * (size_t)(B + 1));
            if (!len || !kv_indptr) return 1;
            gu_draw_lengths(len, B, LO, HI);
            double keys = 0;
            kv_indptr[0] = 0;
            for (int i = 0; i < B; i++) {
                kv_indptr[i + 1] = kv_indptr[i] + (len[i] + PS - 1) / PS;
                keys += len[i];
            }
            const int total_pages = kv_indptr[B];
            char lname[32];
            if (LO == HI) snprintf(lname, sizeof lname, "%d", L);
            else snprintf(lname, sizeof lname, "U(%d,%d)", LO, HI);
            double bytes = 2.0 * B * HQ * D * 2 + 2.0 * keys * HKV * D * kvb;
            int R = (int)ceil(300e6 / bytes);
            if (R < 1) R = 1;
            if (R > MAXPLANS) R = MAXPLANS;
            fi_plan_config cfg;
            fi_plan_config_init(&cfg);
            cfg.max_batch_size = B, cfg.max_total_qo = B, cfg.max_total_kv = total_pages;
            cfg.num_workers = workers;
            cfg.fixed_split_size = split;
            cell_plan cp[MAXPLANS];
            memset(cp, 0, sizeof cp);
            fi_plan_info info = {.struct_size = sizeof info};
            float upd[MAXPLANS];
            int bad = 0;
            for (int r = 0; r < R && !bad; r++) {
                cell_plan *c = &cp[r];
                c->qo_indptr = malloc(sizeof(int32_t) * (B + 1));
                c->kv_indptr = malloc(sizeof(int32_t) * (B + 1));
                c->last = malloc(sizeof(int32_t) * B);
                c->indices = malloc(sizeof(int32_t) * (size_t)total_pages);
                for (int i = 0; i <= B; i++) c->qo_indptr[i] = i, c->kv_indptr[i] = kv_indptr[i];
                for (int i = 0; i < B; i++) c->last[i] = len[i] - (kv_indptr[i + 1] - kv_indptr[i] - 1) * PS;
                if (gu_draw_pages(c->indices, B, c->kv_indptr, pool, contiguous, &rng)) return 1;
                fi_batch fb = {B, c->qo_indptr, c->kv_indptr, c->indices, c->last, NULL};
                if (dtable) {
                    size_t n = sizeof(int32_t) * (size_t)total_pages;
                    if (GU(gu.MemAlloc(&c->table, n)) || GU(gu.HtoD(c->table, c->indices, n)))
                        return 1;
                    fb.kv_indices = (const int32_t *)(uintptr_t)c->table;
                }
                cfg.device_page_table = dtable;
                bad = fi_plan_create(ctx, &p, &cfg, &c->plan) != FI_OK;
                double t0 = now();
                bad = bad || fi_plan_update(c->plan, &fb) != FI_OK;
                upd[r] = (float)(1e6 * (now() - t0));
                if (!bad && r == 0) fi_plan_get_info(c->plan, &info);
            }
            if (bad) {
                printf("cell %d x %s: %s\n", B, lname, fi_last_error());
                return 1;
            }
            qsort(upd, (size_t)R, sizeof upd[0], gu_cmp_float);
            fi_run_args a;
            memset(&a, 0, sizeof a);
            int64_t qs[3] = {B, HQ, D};
            a.q = fi_tensor_contiguous((void *)(uintptr_t)dq, FI_DTYPE_BF16, 3, qs);
            a.o = fi_tensor_contiguous((void *)(uintptr_t)dout, FI_DTYPE_BF16, 3, qs);
            a.k = fi_tensor_contiguous((void *)(uintptr_t)dk, kvt, 4, ks);
            a.v = fi_tensor_contiguous((void *)(uintptr_t)dv, kvt, 4, ks);
            a.stream = s;
            /* eager runs first: orders `s` after every plan's upload */
            for (int r = 0; r < R; r++)
                if (fi_plan_run(cp[r].plan, &a)) {
                    printf("run: %s\n", fi_last_error());
                    return 1;
                }
            gu_graph g = NULL;
            gu_exec ex = NULL;
            GU(gu.BeginCapture(s, 0));
            for (int r = 0; r < R; r++) fi_plan_run(cp[r].plan, &a);
            if (GU(gu.EndCapture(s, &g)) || GU(gu.GraphInstantiate(&ex, g, 0))) return 1;
            float *ms = malloc(sizeof(float) * reps);
            if (gu_replay_times(ex, s, bench.e0, bench.e1, reps, ms)) return 1;
            double us = 1e3 * ms[reps / 2] / R;
            double tbs = bytes / (us * 1e-6) / 1e12;
            /* the output must be finite (not a test; a guard against timing garbage) */
            uint16_t o16[64];
            GU(gu.DtoH(o16, dout, sizeof o16));
            int finite = 1;
            for (int i = 0; i < 64; i++) finite &= isfinite(tu_bf16_to_f32(o16[i]));
            tl += snprintf(table + tl, sizeof table - (size_t)tl,
                           "| %d | %s | %.1f | %.2f | %.0f%% | %d | %d | %d | %.0f |%s\n", B, lname, us,
                           tbs, 100 * tbs * 1e12 / CEILING, R, info.num_items,
                           info.num_split_items, upd[R / 2], finite ? "" : " NON-FINITE OUTPUT");
            printf("decode batch %3d kv %5s: %9.1f us %6.2f TB/s (%d plans, %d items, %d split, "
                   "min %.1f max %.1f us)\n",
                   B, lname, us, tbs, R, info.num_items, info.num_split_items, 1e3 * ms[0] / R,
                   1e3 * ms[reps - 1] / R);
            if (jf)
                fprintf(jf,
                        "{\"workload\":\"decode\",\"batch\":%d,\"kv_len\":%s%s%s,\"h_qo\":%d,"
                        "\"h_kv\":%d,\"d\":%d,\"page\":%d,\"layout\":\"%s\",\"dtype\":\"bf16\","
                        "\"kv_dtype\":\"%s\",\"us\":%.2f,"
                        "\"tb_s\":%.3f,\"bytes\":%.0f,\"plans\":%d,\"items\":%d,\"split_items\":%d,"
                        "\"plan_update_us\":%.1f,\"reps\":%d}\n",
                        B, LO == HI ? "" : "\"", lname, LO == HI ? "" : "\"", HQ, HKV, D, PS,
                        hnd ? "HND" : "NHD", fi_dtype_name(kvt), us, tbs,
                        bytes, R,
                        info.num_items, info.num_split_items, upd[R / 2], reps);
            free(ms);
            gu.GraphExecDestroy(ex);
            gu.GraphDestroy(g);
            for (int r = 0; r < R; r++) {
                fi_plan_destroy(cp[r].plan);
                free(cp[r].qo_indptr), free(cp[r].kv_indptr), free(cp[r].last),
                    free(cp[r].indices);
                if (cp[r].table) gu.MemFree(cp[r].table);
            }
            free(len), free(kv_indptr);
        }
    }
    if (jf) fclose(jf);
    printf("\n%s", table);
    fi_context_destroy(ctx);
    return 0;
}
