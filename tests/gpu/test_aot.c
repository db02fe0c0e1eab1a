/*
 * test_aot.c — the kernels compiled ahead of time by nvcc (`make aot`, the
 * library's table) against the same configurations compiled by NVRTC (the
 * JIT): same plan, same inputs, O and LSE bit for bit. Two contexts on one
 * device: the first created with FLASHINFER_AOT=0 (NVRTC or its disk
 * cache), the second with the table; their JIT counters show which path
 * each took. Every output is also checked against the fp64 oracle, and
 * poisoned (NaN) before each run.
 *
 *   build/test_aot              every case, both builds, compared
 *   build/test_aot --list       the cases' configurations for `jit_compile
 *                               --warm` (NVRTC them in parallel first)
 *   build/test_aot --one        the library's default path only, no
 *                               comparison (small shapes for
 *                               compute-sanitizer, tests/gpu/run_device.sh)
 *
 * Cases (each configuration is in src/cuda/aot_set.c), each through the
 * library's default path (the persistent kernel) and the separate kernels
 * (FLASHINFER_CUDA_KERNELS=separate): decode with a split request (split items
 * merged), prefill chunks of 5 and 40 tokens beside decodes (tensor-core
 * path too), a prefill-only batch, paged and ragged, causal and not,
 * bf16 and f16, head dims 128 and 64, groups 1, 4, 8.
 * Without a GPU: checks that every configuration of the AOT set is in the
 * table (when the library was built with AOT) and that a spec with another
 * -D option is not.
 */
#include "flashinfer.h"
#include "cuda/cuda_backend.h"
#include "gpu_util.h"
#include "../oracle.h"
#include "../util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { HKV = 2, PS = 16, MAXB = 6 };


typedef struct tcase {
    const char *name;
    fi_dtype dt;
    int d, group, paged, causal;
    int n, qo[MAXB], kv[MAXB];
} tcase;

/* qo <= kv everywhere (causal aligns the queries to the end of the keys). */
static const tcase cases[] = {
    {"decode bf16 d128 g4 paged, one request split", FI_DTYPE_BF16, 128, 4, 1, 0,
     4, {1, 1, 1, 1}, {3000, 37, 512, 129}},
    {"mixed bf16 d128 g4 paged causal", FI_DTYPE_BF16, 128, 4, 1, 1,
     5, {1, 5, 40, 1, 3}, {700, 5, 300, 2100, 64}},
    {"mixed f16 d128 g8 ragged causal", FI_DTYPE_F16, 128, 8, 0, 1,
     4, {40, 1, 2, 17}, {40, 1500, 90, 600}},
    {"mixed f16 d64 g1 paged", FI_DTYPE_F16, 64, 1, 1, 0,
     4, {1, 24, 1, 3}, {2500, 300, 45, 16}},
    {"mixed bf16 d64 g8 ragged", FI_DTYPE_BF16, 64, 8, 0, 0,
     3, {1, 33, 6}, {1800, 200, 6}},
    {"prefill bf16 d128 g1 ragged causal", FI_DTYPE_BF16, 128, 1, 0, 1,
     2, {64, 20}, {64, 500}},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

/* --------------------------------------------------- without a GPU too */

static void test_table(void) {
    int n = fi_cuda_aot_count(), found = 0;
    for (int i = 0; i < fi_cuda_aot_set_count(); i++) {
        fi_kernel_spec s;
        fi_cuda_aot_set_spec(i, &s);
        size_t size = 0;
        found += fi_cuda_aot_find(&s, "sm_90a", &size) && size > 0;
        if (i == 0 && n) {
            snprintf(s.defines[s.num_defines++], sizeof s.defines[0], "-DFI_STAGES=4");
            CHECK(!fi_cuda_aot_find(&s, "sm_90a", &size), "a spec with another option matched");
            s.num_defines--;
            CHECK(!fi_cuda_aot_find(&s, "sm_80", &size), "a spec for another arch matched");
        }
    }
    printf("table: %d kernels in the library's AOT table; %d of the %d in the AOT set found\n", n,
           found, fi_cuda_aot_set_count());
    CHECK(n == 0 || found == fi_cuda_aot_set_count(), "AOT set not all in the table");
}

/* ---------------------------------------------------------------- GPU */

typedef struct data {
    fi_attention_params p;
    fi_batch view;
    int32_t qo_indptr[MAXB + 1], kv_indptr[MAXB + 1], last[MAXB], *indices;
    int32_t total_q, total_kv, pages;
    tu_buf q, k, v;
    gu_ptr dq, dk, dv, o[2], lse[2];
    size_t ob, lb;
} data;

static int make_data(const tcase *c, data *x, tu_rng *rng) {
    memset(x, 0, sizeof *x);
    fi_attention_params *p = &x->p;
    fi_attention_params_init(p);
    p->num_kv_heads = HKV;
    p->num_qo_heads = HKV * c->group;
    p->head_dim_qk = p->head_dim_vo = c->d;
    p->q_dtype = p->kv_dtype = p->o_dtype = c->dt;
    p->mask_mode = c->causal ? FI_MASK_CAUSAL : FI_MASK_NONE;
    p->kv_format = c->paged ? FI_KV_FORMAT_PAGED : FI_KV_FORMAT_RAGGED;
    p->page_size = c->paged ? PS : 1;
    for (int i = 0; i < c->n; i++) {
        x->qo_indptr[i + 1] = x->qo_indptr[i] + c->qo[i];
        int pages = (c->kv[i] + PS - 1) / PS;
        x->kv_indptr[i + 1] = x->kv_indptr[i] + (c->paged ? pages : c->kv[i]);
        x->last[i] = c->kv[i] - PS * (pages - 1);
        x->pages += pages;
        x->total_kv += c->kv[i];
    }
    x->total_q = x->qo_indptr[c->n];
    int64_t pool = x->pages + 7; /* spare pages never referenced */
    if (c->paged) {
        x->indices = malloc(sizeof(int32_t) * (size_t)pool);
        for (int64_t i = 0; i < pool; i++) x->indices[i] = (int32_t)i;
        for (int64_t i = pool - 1; i > 0; i--) { /* random pages */
            int32_t j = tu_rng_int(rng, 0, (int32_t)i), t = x->indices[i];
            x->indices[i] = x->indices[j], x->indices[j] = t;
        }
    }
    x->view = (fi_batch){c->n, x->qo_indptr, x->kv_indptr, x->indices, c->paged ? x->last : NULL,
                         NULL};
    int64_t qs[3] = {x->total_q, p->num_qo_heads, c->d};
    int64_t pk[4] = {pool, PS, HKV, c->d}, rk[3] = {x->total_kv, HKV, c->d};
    if (tu_buf_alloc(&x->q, c->dt, 3, qs) || tu_buf_alloc(&x->k, c->dt, c->paged ? 4 : 3, c->paged ? pk : rk) ||
        tu_buf_alloc(&x->v, c->dt, c->paged ? 4 : 3, c->paged ? pk : rk))
        return -1;
    tu_fill_uniform(rng, &x->q.t, -1, 1, 0);
    tu_fill_uniform(rng, &x->k.t, -1, 1, 0);
    tu_fill_uniform(rng, &x->v.t, -1, 1, 0);
    x->ob = x->q.bytes;
    x->lb = (size_t)x->total_q * (size_t)p->num_qo_heads * 4;
    if (GU(gu.MemAlloc(&x->dq, x->q.bytes)) || GU(gu.MemAlloc(&x->dk, x->k.bytes)) ||
        GU(gu.MemAlloc(&x->dv, x->v.bytes)) || GU(gu.HtoD(x->dq, x->q.base, x->q.bytes)) ||
        GU(gu.HtoD(x->dk, x->k.base, x->k.bytes)) || GU(gu.HtoD(x->dv, x->v.base, x->v.bytes)))
        return -1;
    for (int s = 0; s < 2; s++)
        if (GU(gu.MemAlloc(&x->o[s], x->ob)) || GU(gu.MemAlloc(&x->lse[s], x->lb))) return -1;
    return 0;
}

static void free_data(data *x) {
    gu.MemFree(x->dq), gu.MemFree(x->dk), gu.MemFree(x->dv);
    for (int s = 0; s < 2; s++) gu.MemFree(x->o[s]), gu.MemFree(x->lse[s]);
    tu_buf_free(&x->q), tu_buf_free(&x->k), tu_buf_free(&x->v);
    free(x->indices);
}

/* Plan, poison, run on `stream`, wait. Returns the plan's info. */
static int run_once(fi_context *ctx, data *x, int slot, gu_stream stream, fi_plan_info *info) {
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    cfg.max_batch_size = MAXB;
    cfg.max_total_qo = x->total_q;
    cfg.max_total_kv = x->p.kv_format == FI_KV_FORMAT_PAGED ? x->pages : x->total_kv;
    fi_plan *plan = NULL;
    info->struct_size = sizeof *info;
    if (fi_plan_create(ctx, &x->p, &cfg, &plan) || fi_plan_update(plan, &x->view) ||
        fi_plan_get_info(plan, info)) {
        fi_plan_destroy(plan);
        return -1;
    }
    if (GU(gu.MemsetD8(x->o[slot], 0xff, x->ob)) || GU(gu.MemsetD8(x->lse[slot], 0xff, x->lb)) ||
        GU(gu.CtxSynchronize()))
        return -1;
    fi_run_args a;
    memset(&a, 0, sizeof a);
    int64_t qs[3] = {x->total_q, x->p.num_qo_heads, x->p.head_dim_qk}, ls[2] = {x->total_q, x->p.num_qo_heads};
    a.q = fi_tensor_contiguous((void *)(uintptr_t)x->dq, x->p.q_dtype, 3, qs);
    a.k = x->k.t, a.v = x->v.t; /* shapes and strides of the host views */
    a.k.data = (void *)(uintptr_t)x->dk, a.v.data = (void *)(uintptr_t)x->dv;
    a.o = fi_tensor_contiguous((void *)(uintptr_t)x->o[slot], x->p.o_dtype, 3, qs);
    a.lse = fi_tensor_contiguous((void *)(uintptr_t)x->lse[slot], FI_DTYPE_F32, 2, ls);
    a.stream = stream;
    int st = fi_plan_run(plan, &a);
    if (!st) st = GU(gu.StreamSynchronize(stream));
    fi_plan_destroy(plan);
    return st ? -1 : 0;
}

/* O and LSE of slot against the oracle; the raw bytes into o_bits/lse_bits. */
static void check_oracle(const char *what, data *x, int slot, void *o_bits, float *lse_bits) {
    int64_t no = (int64_t)x->total_q * x->p.num_qo_heads * x->p.head_dim_vo;
    int64_t nl = (int64_t)x->total_q * x->p.num_qo_heads;
    GU(gu.DtoH(o_bits, x->o[slot], x->ob));
    GU(gu.DtoH(lse_bits, x->lse[slot], x->lb));
    double *ref = malloc(sizeof(double) * (size_t)no), *got = malloc(sizeof(double) * (size_t)no);
    double *lref = malloc(sizeof(double) * (size_t)nl), *lgot = malloc(sizeof(double) * (size_t)nl);
    oracle_attention(&x->p, &x->view, &x->q.t, &x->k.t, &x->v.t, NULL, ref, lref);
    for (int64_t i = 0; i < no; i++) got[i] = tu_load(o_bits, x->p.o_dtype, i);
    for (int64_t i = 0; i < nl; i++) lgot[i] = lse_bits[i];
    tu_cmp c, cl;
    int64_t bad = tu_compare(got, ref, no, 1e-2, 2e-2, &c);
    int64_t badl = tu_compare(lgot, lref, nl, 1e-3, 1e-3, &cl);
    CHECK(!bad && !badl, "%s: %lld O and %lld LSE values off the oracle (worst O %g vs %g)", what,
          (long long)bad, (long long)badl, c.worst_got, c.worst_ref);
    free(ref), free(got), free(lref), free(lgot);
}

static fi_context *make_context(int aot) {
    if (aot) unsetenv("FLASHINFER_AOT");
    else setenv("FLASHINFER_AOT", "0", 1);
    fi_context_options opt;
    fi_context_options_init(&opt);
    opt.device = FI_DEVICE_CUDA;
    fi_context *ctx = NULL;
    CHECK(fi_context_create(&opt, &ctx) == FI_OK, "context (aot %d)", aot);
    unsetenv("FLASHINFER_AOT");
    return ctx;
}

static void test_device(int one) {
    gu_stream s = NULL;
    if (GU(gu.StreamCreate(&s, 1))) {
        CHECK(0, "stream");
        return;
    }
    tu_rng rng;
    tu_rng_seed(&rng, 20261129);
    /* pass 0: the library's default (the persistent kernel; the separate
     * tensor-core kernel for an uncaptured prefill-only batch); pass 1: the
     * separate kernels (FLASHINFER_CUDA_KERNELS=separate, read at context
     * creation) */
    for (int pass = 0; pass < 2; pass++) {
    if (pass) setenv("FLASHINFER_CUDA_KERNELS", "separate", 1);
    /* one: the default path only (AOT where the table has the kernel) */
    fi_context *ctx[2] = {one ? NULL : make_context(0), make_context(1)};
    unsetenv("FLASHINFER_CUDA_KERNELS");
    if ((!one && !ctx[0]) || !ctx[1]) return;
    if (pass == 0)
        printf("device: %s; %d kernels in the AOT table\n", fi_context_describe(ctx[1]),
               fi_cuda_aot_count());
    for (int ci = 0; ci < NCASES; ci++) {
        const tcase *c = &cases[ci];
        if (one && ci >= 3 && ci != NCASES - 1) continue; /* decode, prefill, ragged, d 64 skipped */
        data x;
        if (make_data(c, &x, &rng)) {
            CHECK(0, "%s: buffers", c->name);
            return;
        }
        void *ob[2] = {malloc(x.ob), malloc(x.ob)};
        float *lb[2] = {malloc(x.lb), malloc(x.lb)};
        fi_plan_info info[2];
        memset(info, 0, sizeof info);
        for (int k = one; k < 2; k++) {
            CHECK(run_once(ctx[k], &x, k, s, &info[k]) == 0, "%s: run (%s)", c->name,
                  k ? "aot" : "jit");
            check_oracle(c->name, &x, k, ob[k], lb[k]);
        }
        int same = 1;
        if (!one) {
            same = info[0].num_items == info[1].num_items &&
                   info[0].num_split_items == info[1].num_split_items &&
                   !memcmp(ob[0], ob[1], x.ob) && !memcmp(lb[0], lb[1], x.lb);
            CHECK(same, "%s: the AOT and JIT outputs differ", c->name);
        }
        printf("%-9s %-48s %3d items %2d split: %s\n", pass ? "separate" : "default", c->name,
               info[1].num_items, info[1].num_split_items,
               one ? "ran" : same ? "bitwise equal" : "DIFFER");
        free(ob[0]), free(ob[1]), free(lb[0]), free(lb[1]);
        free_data(&x);
    }
    for (int k = one; k < 2; k++) {
        fi_cuda_jit_stats st = fi_cuda_jit_get_stats(ctx[k]);
        printf("%s %s context: %d from the AOT table (%.2f ms), %d compiled by NVRTC (%.0f ms), "
               "%d from the disk cache\n", pass ? "separate" : "default", k ? "aot" : "jit",
               st.aot_loads, 1e3 * st.aot_load_seconds, st.compiled, 1e3 * st.compile_seconds,
               st.disk_loads);
        if (k == 0) CHECK(st.aot_loads == 0, "FLASHINFER_AOT=0 context used the table");
        else if (fi_cuda_aot_count() > 0)
            CHECK(st.aot_loads > 0 && st.compiled == 0 && st.disk_loads == 0,
                  "the AOT context compiled or loaded from disk");
        fi_context_destroy(ctx[k]);
    }
    }
    gu.StreamDestroy(s);
}

/* --list: "paged mask window softcap pos qt kvt ot dqk dvo hq hkv" per case */
static void list_cases(void) {
    for (int ci = 0; ci < NCASES; ci++) {
        const tcase *c = &cases[ci];
        printf("%d %d 0 0 0 %d %d %d %d %d %d %d\n", c->paged, c->causal, (int)c->dt, (int)c->dt,
               (int)c->dt, c->d, c->d, HKV * c->group, HKV);
    }
}

int main(int argc, char **argv) {
    int one = argc > 1 && !strcmp(argv[1], "--one");
    if (argc > 1 && !strcmp(argv[1], "--list")) {
        list_cases();
        return 0;
    }
    test_table();
    if (!fi_device_available(FI_DEVICE_CUDA) || gu_init(0)) {
        printf("no CUDA device: the device part not run\n");
    } else {
        if (!one && fi_cuda_aot_count() == 0) {
            printf("the library was built without AOT (make aot / make gpu where nvcc is): "
                   "nothing to compare\n");
            (*gu_failures())++;
        }
        test_device(one);
    }
    return gu_summary("test_aot");
}
