/*
 * test_variant_run.c — user-defined variants on the CPU backend against the
 * fp64 oracle applying the same hooks (oracle_attention_hooks):
 *  - examples: the variants of variant_examples.h over paged/ragged, NHD/HND,
 *    f32/f16/bf16 (and FP8 KV), head dims 64/128/256, causal/window/custom
 *    masks combined with the hooks, split-KV with merges (fixed splits),
 *    decode, prefill and mixed batches; outputs poisoned before each run;
 *  - builtin: the built-in specs run as variants against the plain oracle
 *    with the equivalent fields (soft-cap, ALiBi, RoPE, window, custom mask);
 *  - errors: a snippet that does not compile (FI_STATUS_COMPILE_ERROR with
 *    the log), no compiler (FI_STATUS_UNSUPPORTED; built-ins still run), bad
 *    run arguments, fields a variant plan rejects.
 * Needs a C compiler (cc, or $FLASHINFER_CC / $CC): without one every case
 * that compiles is skipped with that reason.
 */
#include "cpu/cc_jit.h"
#include "cpu/variant_jit.h"
#include "oracle.h"
#include "util.h"
#include "variant_examples.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_B = 8 };

typedef struct vcase {
    const char *suite;
    const fi_variant *variant;    /* the variant a plan runs */
    const char *name;             /* its name in case names */
    int example;                  /* vx example (values), or -1 */
    fi_kv_format format;
    fi_kv_layout layout;
    int32_t page_size;
    fi_dtype q_dt, kv_dt, o_dt;
    int32_t d, hq, hkv;
    fi_mask_mode mask;
    int32_t window_left;
    int32_t fixed_split;          /* > 0: chunks of this many keys (merges) */
    const char *shape;            /* decode, prefill, mixed */
} vcase;

typedef struct problem {
    int32_t B, qo[MAX_B], kv[MAX_B];
    int32_t qo_indptr[MAX_B + 1], kv_indptr[MAX_B + 1], last[MAX_B], mask_indptr[MAX_B + 1];
    int32_t *pages;
    fi_batch batch;
    tu_buf q, k, v, o, lse, mask;
    int32_t max_kv, total_q;
} problem;

static fi_context *ctx;

static void lengths(const vcase *c, tu_rng *g, problem *p) {
    if (!strcmp(c->shape, "decode")) {
        p->B = 5;
        for (int32_t b = 0; b < p->B; b++) p->qo[b] = 1, p->kv[b] = tu_rng_int(g, 1, 300);
    } else if (!strcmp(c->shape, "prefill")) {
        p->B = 2;
        for (int32_t b = 0; b < p->B; b++) {
            p->qo[b] = tu_rng_int(g, 1, 40);
            p->kv[b] = p->qo[b] + tu_rng_int(g, 0, 120);
        }
    } else { /* mixed: decodes, a prefill, a request with no keys */
        p->B = 4;
        p->qo[0] = 1, p->kv[0] = tu_rng_int(g, 1, 200);
        p->qo[1] = tu_rng_int(g, 2, 30), p->kv[1] = p->qo[1] + tu_rng_int(g, 0, 90);
        p->qo[2] = 1, p->kv[2] = 0;
        p->qo[3] = 3, p->kv[3] = tu_rng_int(g, 3, 150);
    }
}

static void problem_free(problem *p) {
    free(p->pages);
    tu_buf_free(&p->q), tu_buf_free(&p->k), tu_buf_free(&p->v);
    tu_buf_free(&p->o), tu_buf_free(&p->lse), tu_buf_free(&p->mask);
}

static int problem_build(const vcase *c, tu_rng *g, problem *p) {
    memset(p, 0, sizeof *p);
    lengths(c, g, p);
    int32_t rows = 0;
    p->qo_indptr[0] = p->kv_indptr[0] = p->mask_indptr[0] = 0;
    for (int32_t b = 0; b < p->B; b++) {
        p->qo_indptr[b + 1] = p->qo_indptr[b] + p->qo[b];
        int32_t n = c->format == FI_KV_FORMAT_PAGED ? (p->kv[b] + c->page_size - 1) / c->page_size
                                                     : p->kv[b];
        p->kv_indptr[b + 1] = p->kv_indptr[b] + n;
        p->last[b] = n ? p->kv[b] - c->page_size * (n - 1) : 0;
        p->mask_indptr[b + 1] = p->mask_indptr[b] + (p->qo[b] * p->kv[b] + 7) / 8;
        if (p->kv[b] > p->max_kv) p->max_kv = p->kv[b];
        rows += n;
    }
    p->total_q = p->qo_indptr[p->B];
    int32_t slots = rows + 2; /* pages (paged) or token rows, with spares */
    p->pages = malloc(sizeof(int32_t) * (size_t)slots);
    for (int32_t i = 0; i < slots; i++) p->pages[i] = i;
    for (int32_t i = slots - 1; i > 0; i--) { /* pages handed out in random order */
        int32_t j = tu_rng_int(g, 0, i), t = p->pages[i];
        p->pages[i] = p->pages[j], p->pages[j] = t;
    }
    p->batch = (fi_batch){p->B, p->qo_indptr, p->kv_indptr, p->pages,
                          c->format == FI_KV_FORMAT_PAGED ? p->last : NULL, NULL};
    bool nhd = c->layout == FI_KV_LAYOUT_NHD;
    int64_t qs[3] = {p->total_q, c->hq, c->d}, ls[2] = {p->total_q, c->hq};
    int64_t kvs[4], ms[1] = {p->mask_indptr[p->B] + 1};
    int32_t nd;
    if (c->format == FI_KV_FORMAT_PAGED) {
        kvs[0] = slots, kvs[1] = nhd ? c->page_size : c->hkv, kvs[2] = nhd ? c->hkv : c->page_size;
        kvs[3] = c->d, nd = 4;
    } else {
        kvs[0] = nhd ? slots : c->hkv, kvs[1] = nhd ? c->hkv : slots, kvs[2] = c->d, nd = 3;
    }
    if (tu_buf_alloc(&p->q, c->q_dt, 3, qs) || tu_buf_alloc(&p->o, c->o_dt, 3, qs) ||
        tu_buf_alloc(&p->lse, FI_DTYPE_F32, 2, ls) || tu_buf_alloc(&p->k, c->kv_dt, nd, kvs) ||
        tu_buf_alloc(&p->v, c->kv_dt, nd, kvs) || tu_buf_alloc(&p->mask, FI_DTYPE_U8, 1, ms))
        return -1;
    bool fp8 = c->kv_dt == FI_DTYPE_E4M3 || c->kv_dt == FI_DTYPE_E5M2;
    tu_fill_uniform(g, &p->q.t, -1.0, 1.0, 0);
    tu_fill_uniform(g, &p->k.t, -1.0, 1.0, fp8 ? 0.5 : 0);
    tu_fill_uniform(g, &p->v.t, -1.0, 1.0, fp8 ? 0.25 : 0);
    uint8_t *m = p->mask.base;
    for (int64_t i = 0; i < ms[0]; i++) m[i] = (uint8_t)tu_rng_next(g);
    return 0;
}

static fi_attention_params case_params(const vcase *c) {
    fi_attention_params pa;
    fi_attention_params_init(&pa);
    pa.num_qo_heads = c->hq, pa.num_kv_heads = c->hkv;
    pa.head_dim_qk = pa.head_dim_vo = c->d;
    pa.kv_format = c->format, pa.page_size = c->page_size, pa.kv_layout = c->layout;
    pa.q_dtype = c->q_dt, pa.kv_dtype = c->kv_dt, pa.o_dtype = c->o_dt;
    pa.mask_mode = c->mask, pa.window_left = c->window_left;
    pa.k_scale = 0.5f, pa.v_scale = 0.25f;
    pa.variant = c->variant;
    return pa;
}

static fi_run_args run_args(problem *p, const fi_variant_args *va) {
    fi_run_args a;
    memset(&a, 0, sizeof a);
    a.q = p->q.t, a.k = p->k.t, a.v = p->v.t, a.o = p->o.t, a.lse = p->lse.t;
    a.custom_mask = p->mask.t;
    a.variant_args = va;
    return a;
}

static double tol_of(const vcase *c) {
    double t = 2e-5;
    fi_dtype d[3] = {c->q_dt, c->kv_dt, c->o_dt};
    for (int i = 0; i < 3; i++) {
        double x = d[i] == FI_DTYPE_F16 ? 2e-3 : d[i] == FI_DTYPE_BF16 ? 1.6e-2 : d[i] == FI_DTYPE_F32 ? 2e-5 : 2e-3;
        if (x > t) t = x;
    }
    return t;
}

/* Plan, run (outputs poisoned), compare with ref/ref_lse. Returns 0 if it holds. */
static int run_compare(const vcase *c, problem *p, const fi_attention_params *pa,
                       const fi_variant_args *va, const double *ref, const double *ref_lse,
                       int check_lse) {
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    cfg.max_batch_size = MAX_B, cfg.max_total_qo = 256, cfg.max_total_kv = 4096;
    cfg.fixed_split_size = c->fixed_split;
    fi_plan *plan = NULL;
    fi_status st = fi_plan_create(ctx, pa, &cfg, &plan);
    if (!st) st = fi_plan_update(plan, &p->batch);
    tu_buf_poison(&p->o), tu_buf_poison(&p->lse);
    fi_run_args a = run_args(p, va);
    if (!st) st = fi_plan_run(plan, &a);
    int fail = 0;
    if (st) {
        tu_note("%s: %s", fi_status_string(st), fi_last_error());
        fail = 1;
    } else {
        fi_plan_info info;
        fi_plan_info_init(&info);
        fi_plan_get_info(plan, &info);
        if (c->fixed_split && info.num_merge_rows == 0 && p->max_kv > 2 * c->fixed_split) {
            tu_note("fixed split %d made no merge rows", (int)c->fixed_split);
            fail = 1;
        }
        double *got = tu_view_read(&p->o.t), *gl = tu_view_read(&p->lse.t);
        int64_t n = (int64_t)p->total_q * c->hq;
        tu_cmp cm;
        double tol = tol_of(c);
        if (tu_compare(got, ref, n * c->d, tol, tol, &cm)) {
            tu_note("O: %lld of %lld bad (%lld NaN), worst [%lld] got %.7g want %.7g", (long long)cm.bad,
                    (long long)cm.n, (long long)cm.nan, (long long)cm.worst, cm.worst_got, cm.worst_ref);
            fail = 1;
        }
        if (check_lse && tu_compare(gl, ref_lse, n, 1e-4, 1e-4, &cm)) {
            tu_note("LSE: %lld bad, worst [%lld] got %.7g want %.7g", (long long)cm.bad,
                    (long long)cm.worst, cm.worst_got, cm.worst_ref);
            fail = 1;
        }
        free(got), free(gl);
    }
    fi_plan_destroy(plan);
    return fail;
}

static void case_name(const vcase *c, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s/%s-%s/%s-%s-%s/d%d/h%d-%d/%s%s/w%d/split%d/%s", c->suite, c->name,
             c->format == FI_KV_FORMAT_PAGED ? "paged" : "ragged",
             c->layout == FI_KV_LAYOUT_NHD ? "nhd" : "hnd", tu_dtype_name(c->q_dt),
             tu_dtype_name(c->kv_dt), tu_dtype_name(c->o_dt), (int)c->d, (int)c->hq, (int)c->hkv,
             c->mask == FI_MASK_CAUSAL ? "causal" : c->mask == FI_MASK_CUSTOM ? "custom" : "nomask",
             "", (int)c->window_left, (int)c->fixed_split, c->shape);
}

static void example_case(const vcase *c) {
    char name[256];
    case_name(c, name, sizeof name);
    if (!tu_selected(name)) return;
    if (!fi_cc_available(NULL)) {
        tu_note("no C compiler for the CPU JIT");
        tu_record(c->suite, name, TU_SKIP);
        return;
    }
    uint64_t seed = tu_case_seed(name);
    tu_crash_context(name, seed);
    tu_rng g;
    tu_rng_seed(&g, seed);
    problem p;
    vx_args va;
    int fail = problem_build(c, &g, &p) != 0;
    vx_shape sh = {c->hq, c->d, p.max_kv};
    fail |= vx_make_args(c->example, &g, &sh, &va) != 0;
    size_t n = (size_t)p.total_q * (size_t)c->hq;
    double *ref = malloc(sizeof(double) * (n * (size_t)c->d + 1));
    double *ref_lse = malloc(sizeof(double) * (n + 1));
    fi_attention_params pa = case_params(c);
    fi_variant_args args = vx_variant_args(&va);
    if (!fail) {
        int rc = vx_oracle(c->variant, &args, &pa, &p.batch, &p.q.t, &p.k.t, &p.v.t, p.mask.base,
                           ref, ref_lse);
        fail = rc != 0;
        if (!fail) fail = run_compare(c, &p, &pa, &args, ref, ref_lse, 1);
    }
    free(ref), free(ref_lse);
    vx_args_free(&va);
    problem_free(&p);
    tu_crash_context(NULL, 0);
    tu_record(c->suite, name, fail ? TU_FAIL : TU_PASS);
}

/* The configurations every example runs in (quick: the first two). Their
 * compile-time parts (head dim, dtypes: one shared object each) are four
 * tuples covering each dim, each Q/KV/O dtype path, FP8 KV and a mixed O:
 * (128, f32), (64, f16) twice, (256, bf16), (128, f16 / e4m3 / bf16)
 * twice; the run-time parts (format, layout, page size, heads, masks,
 * window, splits, shape) differ in every one. */
static const vcase configs[] = {
    {.format = FI_KV_FORMAT_PAGED, .layout = FI_KV_LAYOUT_NHD, .page_size = 16,
     .q_dt = FI_DTYPE_F32, .kv_dt = FI_DTYPE_F32, .o_dt = FI_DTYPE_F32, .d = 128, .hq = 4,
     .hkv = 2, .mask = FI_MASK_NONE, .window_left = -1, .shape = "decode"},
    {.format = FI_KV_FORMAT_PAGED, .layout = FI_KV_LAYOUT_HND, .page_size = 8,
     .q_dt = FI_DTYPE_F16, .kv_dt = FI_DTYPE_F16, .o_dt = FI_DTYPE_F16, .d = 64, .hq = 8,
     .hkv = 2, .mask = FI_MASK_CAUSAL, .window_left = -1, .fixed_split = 16, .shape = "prefill"},
    {.format = FI_KV_FORMAT_RAGGED, .layout = FI_KV_LAYOUT_NHD, .q_dt = FI_DTYPE_BF16,
     .kv_dt = FI_DTYPE_BF16, .o_dt = FI_DTYPE_BF16, .d = 256, .hq = 2, .hkv = 1,
     .mask = FI_MASK_CAUSAL, .window_left = 20, .shape = "mixed"},
    {.format = FI_KV_FORMAT_RAGGED, .layout = FI_KV_LAYOUT_HND, .q_dt = FI_DTYPE_F16,
     .kv_dt = FI_DTYPE_F16, .o_dt = FI_DTYPE_F16, .d = 64, .hq = 4, .hkv = 4,
     .mask = FI_MASK_CUSTOM, .window_left = -1, .fixed_split = 32, .shape = "mixed"},
    {.format = FI_KV_FORMAT_PAGED, .layout = FI_KV_LAYOUT_NHD, .page_size = 16,
     .q_dt = FI_DTYPE_F16, .kv_dt = FI_DTYPE_E4M3, .o_dt = FI_DTYPE_BF16, .d = 128, .hq = 4,
     .hkv = 1, .mask = FI_MASK_CAUSAL, .window_left = -1, .fixed_split = 40, .shape = "mixed"},
    {.format = FI_KV_FORMAT_PAGED, .layout = FI_KV_LAYOUT_HND, .page_size = 4,
     .q_dt = FI_DTYPE_F16, .kv_dt = FI_DTYPE_E4M3, .o_dt = FI_DTYPE_BF16, .d = 128, .hq = 6,
     .hkv = 3, .mask = FI_MASK_NONE, .window_left = 10, .fixed_split = 24, .shape = "prefill"},
};
#define NUM_CONFIGS ((int)(sizeof configs / sizeof configs[0]))

static void suite_examples(void) {
    for (int e = 0; e < VX_COUNT; e++) {
        fi_variant *v = NULL;
        if (fi_variant_create(vx_spec(e), &v) != FI_OK) {
            tu_record("examples", vx_spec(e)->name, TU_FAIL);
            tu_note("create: %s", fi_last_error());
            continue;
        }
        for (int k = 0; k < (tu_opt.quick ? 2 : NUM_CONFIGS); k++) {
            vcase c = configs[k];
            c.suite = "examples", c.variant = v, c.name = vx_spec(e)->name, c.example = e;
            example_case(&c);
        }
        fi_variant_destroy(v);
    }
}

/* ------------------------------------------------------- precompiling */

/* The objects the cases load, compiled side by side first (one compiler
 * process per CPU): on a fresh cache most of this test's time is the C
 * compiler. The cases then load them from the (temporary) cache. */
typedef struct precompile_job {
    fi_variant *v;
    fi_cpu_variant_config cfg;
    int hooks; /* the oracle's hook object instead of a kernel */
} precompile_job;

enum { MAX_PRE = 96 };
static precompile_job pre[MAX_PRE];
static int npre;
static atomic_int next_pre;

static void pre_add(const fi_variant_spec *spec, const vcase *c, int hooks) {
    fi_cpu_variant_config cfg = {c->d, c->d, c->q_dt, c->kv_dt, c->o_dt};
    for (int i = 0; i < npre; i++)
        if (!strcmp(fi_variant_get_spec(pre[i].v)->name, spec->name) && pre[i].hooks == hooks &&
            (hooks || !memcmp(&pre[i].cfg, &cfg, sizeof cfg)))
            return;
    if (npre == MAX_PRE || fi_variant_create(spec, &pre[npre].v) != FI_OK) return;
    pre[npre].cfg = cfg, pre[npre++].hooks = hooks;
}

static void *pre_worker(void *arg) {
    (void)arg;
    for (int i; (i = atomic_fetch_add(&next_pre, 1)) < npre;) {
        const fi_vk_entry *e;
        const fi_vk_hooks *h;
        fi_cc_result r;
        void *handle = NULL;
        if (pre[i].hooks) {
            if (fi_cpu_variant_hooks(pre[i].v, &h, &handle) != FI_OK) handle = NULL;
        } else if (fi_cpu_variant_load(pre[i].v, &pre[i].cfg, &e, &r) == FI_OK) {
            handle = r.handle;
        }
        if (handle) dlclose(handle); /* failures show in the cases themselves */
    }
    return NULL;
}

static void precompile(void) {
    static const char *const builtins[] = {"soft_cap", "alibi", "rope_llama", "sliding_window",
                                           "custom_mask"};
    for (int e = 0; e < VX_COUNT; e++) {
        pre_add(vx_spec(e), &configs[0], 1);
        for (int k = 0; k < (tu_opt.quick ? 2 : NUM_CONFIGS); k++) pre_add(vx_spec(e), &configs[k], 0);
    }
    for (int i = 0; i < 5; i++) {
        const fi_variant *v;
        if (fi_variant_builtin(builtins[i], &v) != FI_OK) continue;
        pre_add(fi_variant_get_spec(v), &configs[0], 0);
        if (!tu_opt.quick) pre_add(fi_variant_get_spec(v), &configs[i == 4 ? 1 : 2], 0);
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = ncpu < 1 ? 1 : ncpu > 16 ? 16 : (int)ncpu;
    pthread_t tid[16];
    int started[16] = {0};
    for (int t = 1; t < nt; t++) started[t] = pthread_create(&tid[t], NULL, pre_worker, NULL) == 0;
    pre_worker(NULL);
    for (int t = 1; t < nt; t++)
        if (started[t]) pthread_join(tid[t], NULL);
    for (int i = 0; i < npre; i++) fi_variant_destroy(pre[i].v);
}

/* ------------------------------------------------------------- built-ins */

/* A built-in spec as a variant against the plain oracle with the fields it
 * stands for. */
static void builtin_case(const char *which, int k) {
    vcase c = configs[k];
    c.suite = "builtin", c.name = which, c.example = -1;
    if (fi_variant_builtin(which, &c.variant) != FI_OK) return;
    char name[256];
    case_name(&c, name, sizeof name);
    if (!tu_selected(name)) return;
    if (!fi_cc_available(NULL)) {
        tu_note("no C compiler for the CPU JIT");
        tu_record("builtin", name, TU_SKIP);
        return;
    }
    tu_rng g;
    tu_rng_seed(&g, tu_case_seed(name));
    problem p;
    int fail = problem_build(&c, &g, &p) != 0;
    fi_attention_params pa = case_params(&c), plain = pa;
    plain.variant = NULL;
    float slopes[16];
    for (int32_t h = 0; h < c.hq; h++) slopes[h] = 0.05f + 0.07f * (float)h;
    fi_variant_value vals[2];
    fi_variant_args va = {0, vals};
    if (!strcmp(which, "soft_cap")) {
        vals[0] = fi_variant_f32(0.6f), va.num_values = 1;
        plain.logits_soft_cap = 0.6f;
    } else if (!strcmp(which, "alibi")) {
        vals[0] = fi_variant_tensor(slopes), va.num_values = 1;
        plain.pos_encoding = FI_POS_ALIBI, plain.alibi_slopes = slopes;
    } else if (!strcmp(which, "rope_llama")) {
        vals[0] = fi_variant_f32(2.0f), vals[1] = fi_variant_f32(1e4f), va.num_values = 2;
        plain.pos_encoding = FI_POS_ROPE_LLAMA, plain.rope_scale = 2.0f, plain.rope_theta = 1e4f;
    } else if (!strcmp(which, "sliding_window")) {
        vals[0] = fi_variant_i32(17), va.num_values = 1;
        plain.window_left = 17;
        pa.window_left = -1; /* the hook is the window */
    } else { /* custom_mask: the bits as tensors, the plan without a mask mode */
        vals[0] = fi_variant_tensor(p.mask.base), vals[1] = fi_variant_tensor(p.mask_indptr);
        va.num_values = 2;
        plain.mask_mode = FI_MASK_CUSTOM;
        pa.mask_mode = FI_MASK_NONE;
    }
    size_t n = (size_t)p.total_q * (size_t)c.hq;
    double *ref = malloc(sizeof(double) * (n * (size_t)c.d + 1));
    double *ref_lse = malloc(sizeof(double) * (n + 1));
    if (!fail) {
        fail = oracle_attention(&plain, &p.batch, &p.q.t, &p.k.t, &p.v.t, p.mask.base, ref,
                                ref_lse) != 0;
        c.mask = pa.mask_mode;
        if (!fail) fail = run_compare(&c, &p, &pa, &va, ref, ref_lse, 1);
    }
    free(ref), free(ref_lse);
    problem_free(&p);
    tu_record("builtin", name, fail ? TU_FAIL : TU_PASS);
}

static void suite_builtin(void) {
    const char *names[] = {"soft_cap", "alibi", "rope_llama", "sliding_window", "custom_mask"};
    for (int i = 0; i < 5; i++) {
        builtin_case(names[i], 0);
        if (!tu_opt.quick) builtin_case(names[i], i == 4 ? 1 : 2);
    }
}

/* ---------------------------------------------------------------- errors */

static fi_attention_params small_params(const fi_variant *v) {
    vcase c = configs[0];
    c.variant = v;
    return case_params(&c);
}

static int expect_plan(const fi_attention_params *pa, fi_status want, const char *needle,
                       const char *what) {
    fi_plan *plan = NULL;
    fi_status st = fi_plan_create(ctx, pa, NULL, &plan);
    int fail = tu_expect_status(st, want, needle, what);
    fi_plan_destroy(plan);
    return fail;
}

static void error_compile(void) {
    if (!tu_selected("errors/compile")) return;
    if (!fi_cc_available(NULL)) {
        tu_note("no C compiler for the CPU JIT");
        tu_record("errors", "errors/compile", TU_SKIP);
        return;
    }
    fi_variant_spec s;
    fi_variant_spec_init(&s);
    s.name = "broken";
    s.logits_transform = "return s * undeclared_thing;";
    fi_variant *v = NULL;
    int fail = fi_variant_create(&s, &v) != FI_OK;
    fi_attention_params pa = small_params(v);
    if (!fail) {
        fail |= expect_plan(&pa, FI_STATUS_COMPILE_ERROR, "undeclared_thing", "compile error");
        fail |= strstr(fi_last_error(), "broken.logits_transform:1") == NULL;
        if (fail) tu_note("log: %.300s", fi_last_error());
    }
    fi_variant_destroy(v);
    tu_record("errors", "errors/compile", fail ? TU_FAIL : TU_PASS);
}

/* No compiler: custom variants say why, built-in plans keep running. */
static void error_no_compiler(void) {
    if (!tu_selected("errors/no_compiler")) return;
    const char *old = getenv("FLASHINFER_CC");
    char saved[512] = "";
    if (old) snprintf(saved, sizeof saved, "%s", old);
    setenv("FLASHINFER_CC", "/nonexistent/cc", 1);
    fi_variant *v = NULL;
    int fail = fi_variant_create(vx_spec(VX_HEAD_SCALE), &v) != FI_OK;
    fi_attention_params pa = small_params(v);
    fail |= expect_plan(&pa, FI_STATUS_UNSUPPORTED, "no C compiler", "no compiler");
    pa.variant = NULL;
    pa.logits_soft_cap = 3.0f;
    fail |= expect_plan(&pa, FI_OK, NULL, "built-in without a compiler");
    if (old) setenv("FLASHINFER_CC", saved, 1);
    else unsetenv("FLASHINFER_CC");
    fi_variant_destroy(v);
    tu_record("errors", "errors/no_compiler", fail ? TU_FAIL : TU_PASS);
}

static void error_fields(void) {
    if (!tu_selected("errors/fields")) return;
    const fi_variant *v;
    fi_variant_builtin("none", &v);
    fi_attention_params pa = small_params(v);
    pa.pos_encoding = FI_POS_ROPE_LLAMA;
    int fail = expect_plan(&pa, FI_STATUS_UNSUPPORTED, "rope_llama", "pos_encoding");
    pa.pos_encoding = FI_POS_NONE, pa.logits_soft_cap = 2.0f;
    fail |= expect_plan(&pa, FI_STATUS_UNSUPPORTED, "soft_cap", "soft-cap");
    tu_record("errors", "errors/fields", fail ? TU_FAIL : TU_PASS);
}

/* Run arguments: count, kinds, NULL tensors, NULL args. */
static void error_args(void) {
    if (!tu_selected("errors/args")) return;
    if (!fi_cc_available(NULL)) {
        tu_note("no C compiler for the CPU JIT");
        tu_record("errors", "errors/args", TU_SKIP);
        return;
    }
    fi_variant *v = NULL;
    fi_variant_create(vx_spec(VX_BLOCK_MASK), &v);
    vcase c = configs[0];
    c.variant = v;
    tu_rng g;
    tu_rng_seed(&g, 7);
    problem p;
    int fail = problem_build(&c, &g, &p) != 0;
    fi_attention_params pa = case_params(&c);
    fi_plan *plan = NULL;
    fail |= fi_plan_create(ctx, &pa, NULL, &plan) != FI_OK;
    fail |= !plan || fi_plan_update(plan, &p.batch) != FI_OK;
    uint8_t blocks[4] = {1, 1, 1, 1};
    fi_variant_value vals[3] = {fi_variant_i32(1024), fi_variant_i32(2), fi_variant_tensor(blocks)};
    struct {
        fi_variant_args a;
        int null_args;
        const char *needle;
    } bad[] = {
        {{0, vals}, 1, "variant_args is NULL"},
        {{2, vals}, 0, "takes 3 parameters, variant_args has 2"},
        {{3, NULL}, 0, "values is NULL"},
    };
    for (size_t i = 0; plan && i < sizeof bad / sizeof bad[0]; i++) {
        fi_run_args a = run_args(&p, bad[i].null_args ? NULL : &bad[i].a);
        fail |= tu_expect_status(fi_plan_run(plan, &a), FI_STATUS_INVALID_ARGUMENT, bad[i].needle,
                                 bad[i].needle);
    }
    fi_variant_args ok = {3, vals};
    fi_run_args a = run_args(&p, &ok);
    vals[1] = fi_variant_f32(2.0f);
    if (plan)
        fail |= tu_expect_status(fi_plan_run(plan, &a), FI_STATUS_INVALID_ARGUMENT,
                                 "values[1] (num_blocks) is a f32, the spec declares a i32", "kind");
    vals[1] = fi_variant_i32(2), vals[2] = fi_variant_tensor(NULL);
    if (plan)
        fail |= tu_expect_status(fi_plan_run(plan, &a), FI_STATUS_INVALID_ARGUMENT,
                                 "tensor parameter blocks (values[2]) is NULL", "NULL tensor");
    vals[2] = fi_variant_tensor(blocks);
    if (plan) fail |= tu_expect_status(fi_plan_run(plan, &a), FI_OK, NULL, "good args");
    fi_plan_destroy(plan);
    problem_free(&p);
    fi_variant_destroy(v);
    tu_record("errors", "errors/args", fail ? TU_FAIL : TU_PASS);
}

int main(int argc, char **argv) {
    if (tu_parse_args(argc, argv, "user-defined variants on the CPU against the fp64 oracle"))
        return 2;
    const char *why = NULL;
    if (!fi_cc_available(&why)) printf("skip: cases that compile a variant: %s\n", why);
    tu_temp_cache_dir(); /* not the user's cache */
    fi_context_options o;
    fi_context_options_init(&o);
    o.num_threads = 3;
    if (!tu_backend_selected("cpu") || fi_context_create(&o, &ctx) != FI_OK) {
        printf("skip: the CPU backend is not selected\n");
        return tu_summary("test_variant_run");
    }
    if (fi_cc_available(NULL) && !tu_opt.list && !tu_opt.num_filters) precompile();
    suite_examples();
    suite_builtin();
    error_compile();
    error_no_compiler();
    error_fields();
    error_args();
    fi_context_destroy(ctx);
    return tu_summary("test_variant_run");
}
