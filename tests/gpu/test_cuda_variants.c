/*
 * test_cuda_variants.c — user-defined variants on the CUDA backend against
 * the fp64 oracle with the same hooks (tests/variant_examples.c: vx_oracle
 * compiles the very hook text the kernels splice, for the host).
 *
 *   cases   every example variant (FlashSigmoid, attention sink, custom
 *           block mask, StreamingLLM, per-head logit scaling, and the test's
 *           every-hook variant) x paged / ragged KV x decode (CUDA-core
 *           kernel) / prefill (packed rows >= 16: tensor-core kernel) x
 *           bf16 / f16 x head dims 64 / 128 x split-KV off / on (fixed
 *           chunks of 48 keys, so rows merge through merge.cuh and its
 *           variant form): fresh random inputs and parameters per case,
 *           outputs poisoned first, O and LSE compared (NaN never passes)
 *   graph   a CUDA graph captured around a variant plan's run, replayed
 *           after the tensor parameter's device contents changed: it reads
 *           the new values (parameters go by value in the launch, tensors by
 *           pointer), bitwise the eager run of the same values
 *   compile a snippet that does not compile: FI_STATUS_COMPILE_ERROR and
 *           NVRTC's log naming the snippet in fi_last_error(), both through
 *           the JIT alone (no GPU needed) and from fi_plan_create
 *
 * The kernels are compiled into the disk cache first by one process per
 * core (as tests/gpu/run_device.sh warms the harness's).
 *
 *   build/test_cuda_variants [--quick] [--filter STR] [-v]
 */
#include "flashinfer.h"
#include "cuda/cuda_backend.h"
#include "core/variant.h"
#include "gpu_util.h"
#include "../oracle.h"
#include "../util.h"
#include "../variant_examples.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { HQ = 8, HKV = 2, PS = 16, SPLIT = 48, MAXREQ = 4 };

static int passed, skipped; /* failures: gu_failures(), counted by CHECK (gpu_util.h) */

static fi_variant *variants[VX_COUNT];

/* One case's shape. */
typedef struct vcase {
    int ex, ragged, prefill, dt, dim, split;
    char name[128];
} vcase;

static const fi_dtype dtypes[2] = {FI_DTYPE_BF16, FI_DTYPE_F16};

static int case_at(int i, vcase *c) {
    if (i >= VX_COUNT * 32) return 0;
    c->ex = i / 32, c->ragged = (i >> 4) & 1, c->prefill = (i >> 3) & 1, c->dt = (i >> 2) & 1;
    c->dim = (i >> 1) & 1 ? 128 : 64, c->split = i & 1;
    snprintf(c->name, sizeof c->name, "cuda/variants/%s/%s/%s/%s/d%d/%s",
             vx_spec(c->ex)->name, c->ragged ? "ragged" : "paged",
             c->prefill ? "prefill" : "decode", tu_dtype_name(dtypes[c->dt]), c->dim,
             c->split ? "split" : "nosplit");
    return 1;
}

static fi_attention_params case_params(const vcase *c) {
    fi_attention_params p;
    fi_attention_params_init(&p);
    p.num_qo_heads = HQ, p.num_kv_heads = HKV;
    p.head_dim_qk = p.head_dim_vo = c->dim;
    p.kv_format = c->ragged ? FI_KV_FORMAT_RAGGED : FI_KV_FORMAT_PAGED;
    p.page_size = c->ragged ? 1 : PS;
    p.mask_mode = FI_MASK_CAUSAL; /* decode: one query, the last position */
    p.q_dtype = p.kv_dtype = p.o_dtype = dtypes[c->dt];
    p.variant = variants[c->ex];
    return p;
}

/* --------------------------------------------------------- warm the cache */

/* Every kernel the cases use, compiled into the disk cache by `jobs`
 * processes (the test's own plans then load them). */
static void warm(const char *arch, int jobs) {
    enum { MAXS = VX_COUNT * 8 * 3 };
    static fi_kernel_spec specs[MAXS];
    static char *srcs[VX_COUNT];
    int n = 0;
    for (int i = 0; i < VX_COUNT * 32; i += 2) { /* split on/off share kernels */
        vcase c;
        case_at(i, &c);
        if (!tu_selected(c.name) || c.prefill) continue; /* decode and prefill share too */
        if (!srcs[c.ex]) srcs[c.ex] = fi_variant_source_alloc(variants[c.ex], FI_VARIANT_TARGET_CUDA);
        if (!srcs[c.ex]) continue;
        fi_attention_params p = case_params(&c);
        fi_attn_config cfg;
        fi_cuda_attn_config(&p, HQ / HKV, 0, &cfg);
        fi_cuda_attn_set_variant(&cfg, variants[c.ex], srcs[c.ex]);
        /* a variant's plan: the separate kernels (select.c) */
        fi_cuda_tuning t;
        fi_cuda_tuning_read(&t);
        t.wgmma = fi_cuda_arch_wgmma(arch);
        fi_cuda_selection sel;
        fi_cuda_select(&cfg, INT32_MAX, &t, &sel);
        fi_kernel_spec s[3];
        int k = 0;
        s[k++] = sel.spec[FI_CUDA_FORM_ATTN];
        if (fi_cuda_has_form(&sel, FI_CUDA_FORM_ATTN_TC)) s[k++] = sel.spec[FI_CUDA_FORM_ATTN_TC];
        s[k++] = sel.spec[FI_CUDA_FORM_MERGE];
        for (int j = 0; j < k; j++) {
            int dup = 0;
            for (int m = 0; m < n && !dup; m++) dup = !strcmp(specs[m].name, s[j].name);
            if (!dup && n < MAXS) specs[n++] = s[j];
        }
    }
    fflush(stdout);
    for (int w = 0; w < jobs; w++) {
        pid_t pid = fork();
        if (pid < 0) break;
        if (pid > 0) continue;
        int bad = 0;
        for (int i = w; i < n; i += jobs) {
            int cached = 0;
            if (fi_cuda_jit_warm(&specs[i], arch, &cached)) {
                printf("warm %s: %s\n", specs[i].name, fi_last_error());
                bad = 1;
            }
        }
        fflush(stdout);
        _exit(bad);
    }
    for (int w = 0; w < jobs; w++) {
        int status = 0;
        if (wait(&status) < 0) break;
    }
    printf("warm: %d variant kernels for %s, %d processes\n", n, arch, jobs);
    for (int i = 0; i < VX_COUNT; i++) free(srcs[i]);
}

/* ------------------------------------------------------------------ cases */

typedef struct dev_args {
    vx_args host;
    fi_variant_value dev[FI_VARIANT_MAX_PARAMS]; /* tensors repointed to the device */
    gu_ptr mem[FI_VARIANT_MAX_PARAMS];
} dev_args;

static int dev_args_make(dev_args *d, int ex, tu_rng *rng, const vx_shape *sh) {
    memset(d, 0, sizeof *d);
    if (vx_make_args(ex, rng, sh, &d->host)) return -1;
    for (int i = 0; i < d->host.num_values; i++) {
        d->dev[i] = d->host.values[i];
        if (d->host.values[i].kind != FI_VARIANT_PARAM_TENSOR) continue;
        if (GU(gu.MemAlloc(&d->mem[i], d->host.bytes[i] ? d->host.bytes[i] : 1)) ||
            GU(gu.HtoD(d->mem[i], d->host.host[i], d->host.bytes[i] ? d->host.bytes[i] : 1)))
            return -1;
        d->dev[i].ptr = (const void *)(uintptr_t)d->mem[i];
    }
    return 0;
}

static void dev_args_free(dev_args *d) {
    for (int i = 0; i < d->host.num_values; i++)
        if (d->mem[i]) gu.MemFree(d->mem[i]);
    vx_args_free(&d->host);
}

/* A random batch: decode 3 requests of 1 query, prefill 2 requests with
 * 7-40 queries (x group 4 >= 16 packed rows: the tensor-core kernel). */
typedef struct vbatch {
    int n;
    int32_t qo_indptr[MAXREQ + 1], kv_indptr[MAXREQ + 1], last[MAXREQ];
    int32_t *indices;
    int64_t total_kv, pages;
    fi_batch view;
} vbatch;

static void make_batch(vbatch *b, const vcase *c, tu_rng *rng) {
    memset(b, 0, sizeof *b);
    b->n = c->prefill ? 2 : 3;
    int32_t kvl[MAXREQ];
    for (int i = 0; i < b->n; i++) {
        int qo = c->prefill ? tu_rng_int(rng, 7, 40) : 1;
        /* split cases: every request longer than one chunk, so items split */
        kvl[i] = qo + tu_rng_int(rng, c->split ? SPLIT + 1 : 0, c->prefill ? 150 : 400);
        b->qo_indptr[i + 1] = b->qo_indptr[i] + qo;
        int units = c->ragged ? kvl[i] : (kvl[i] + PS - 1) / PS;
        b->kv_indptr[i + 1] = b->kv_indptr[i] + units;
        b->last[i] = kvl[i] - PS * ((kvl[i] + PS - 1) / PS - 1);
    }
    b->total_kv = b->kv_indptr[b->n];
    if (!c->ragged) { /* pages in random order from a pool twice the need */
        b->pages = 2 * b->total_kv;
        b->indices = malloc(sizeof(int32_t) * (size_t)b->pages);
        for (int64_t i = 0; i < b->pages; i++) b->indices[i] = (int32_t)i;
        for (int64_t i = b->pages - 1; i > 0; i--) {
            int32_t j = tu_rng_int(rng, 0, (int32_t)i), t = b->indices[i];
            b->indices[i] = b->indices[j], b->indices[j] = t;
        }
    }
    b->view = (fi_batch){b->n, b->qo_indptr, b->kv_indptr, b->indices,
                         c->ragged ? NULL : b->last, NULL};
}

typedef struct hbufs {
    tu_buf q, k, v;
    gu_ptr dq, dk, dv, dout, dlse;
    int64_t nq;
} hbufs;

static int hbufs_make(hbufs *h, const vcase *c, const vbatch *b, tu_rng *rng) {
    memset(h, 0, sizeof *h);
    fi_dtype t = dtypes[c->dt];
    h->nq = b->qo_indptr[b->n];
    int64_t qs[3] = {h->nq, HQ, c->dim};
    int64_t pk[4] = {b->pages, PS, HKV, c->dim}, rk[3] = {b->total_kv, HKV, c->dim};
    if (tu_buf_alloc(&h->q, t, 3, qs) || tu_buf_alloc(&h->k, t, c->ragged ? 3 : 4, c->ragged ? rk : pk) ||
        tu_buf_alloc(&h->v, t, c->ragged ? 3 : 4, c->ragged ? rk : pk))
        return -1;
    tu_fill_uniform(rng, &h->q.t, -1, 1, 0);
    tu_fill_uniform(rng, &h->k.t, -1, 1, 0);
    tu_fill_uniform(rng, &h->v.t, -1, 1, 0);
    size_t ob = (size_t)h->nq * HQ * c->dim * 2, lb = (size_t)h->nq * HQ * 4;
    if (GU(gu.MemAlloc(&h->dq, h->q.bytes)) || GU(gu.MemAlloc(&h->dk, h->k.bytes)) ||
        GU(gu.MemAlloc(&h->dv, h->v.bytes)) || GU(gu.MemAlloc(&h->dout, ob)) ||
        GU(gu.MemAlloc(&h->dlse, lb)) || GU(gu.HtoD(h->dq, h->q.base, h->q.bytes)) ||
        GU(gu.HtoD(h->dk, h->k.base, h->k.bytes)) || GU(gu.HtoD(h->dv, h->v.base, h->v.bytes)) ||
        GU(gu.MemsetD8(h->dout, 0xff, ob)) || GU(gu.MemsetD8(h->dlse, 0xff, lb)))
        return -1;
    return 0;
}

static void hbufs_free(hbufs *h) {
    tu_buf_free(&h->q), tu_buf_free(&h->k), tu_buf_free(&h->v);
    gu.MemFree(h->dq), gu.MemFree(h->dk), gu.MemFree(h->dv), gu.MemFree(h->dout),
        gu.MemFree(h->dlse);
}

static fi_run_args device_args(const hbufs *h, const vcase *c, const fi_variant_args *va,
                               gu_stream s) {
    fi_run_args a;
    memset(&a, 0, sizeof a);
    int64_t qs[3] = {h->nq, HQ, c->dim}, ls[2] = {h->nq, HQ};
    a.q = fi_tensor_contiguous((void *)(uintptr_t)h->dq, h->q.t.dtype, 3, qs);
    a.k = h->k.t, a.k.data = (void *)(uintptr_t)h->dk;
    a.v = h->v.t, a.v.data = (void *)(uintptr_t)h->dv;
    a.o = fi_tensor_contiguous((void *)(uintptr_t)h->dout, h->q.t.dtype, 3, qs);
    a.lse = fi_tensor_contiguous((void *)(uintptr_t)h->dlse, FI_DTYPE_F32, 2, ls);
    a.variant_args = va;
    a.stream = s;
    return a;
}

/* Download and compare with the oracle; returns the number of bad values. */
static int64_t compare(const vcase *c, const hbufs *h, const vbatch *b, const dev_args *d,
                       const fi_attention_params *p, double *worst) {
    int64_t no = h->nq * HQ * c->dim, nl = h->nq * HQ;
    uint16_t *ob = malloc((size_t)no * 2);
    float *lb = malloc((size_t)nl * 4);
    double *got = malloc((size_t)no * 8), *ref = malloc((size_t)no * 8);
    double *lgot = malloc((size_t)nl * 8), *lref = malloc((size_t)nl * 8);
    int64_t bad = -1;
    fi_variant_args ha = vx_variant_args(&d->host);
    if (ob && lb && got && ref && lgot && lref && !GU(gu.DtoH(ob, h->dout, (size_t)no * 2)) &&
        !GU(gu.DtoH(lb, h->dlse, (size_t)nl * 4))) {
        int rc = vx_oracle(variants[c->ex], &ha, p, &b->view, &h->q.t, &h->k.t, &h->v.t, NULL,
                           ref, lref);
        if (rc == -2) {
            bad = -2;
        } else if (rc == 0) {
            double scale = 1.0;
            for (int64_t i = 0; i < no; i++) {
                got[i] = tu_load(ob, dtypes[c->dt], i);
                if (isfinite(ref[i]) && fabs(ref[i]) > scale) scale = fabs(ref[i]);
            }
            for (int64_t i = 0; i < nl; i++) lgot[i] = lb[i];
            /* bf16: the tensor-core kernel rounds P (and a row hook's rows)
             * to bf16; tolerances scale with the output's magnitude (use_softmax
             * = 0 sums weights) */
            double tol = c->dt == 0 ? 2e-2 : 5e-3;
            tu_cmp co, cl;
            bad = tu_compare(got, ref, no, tol * scale, 2 * tol, &co) +
                  tu_compare(lgot, lref, nl, 2 * tol, tol, &cl);
            *worst = co.max_abs_err > cl.max_abs_err ? co.max_abs_err : cl.max_abs_err;
            if (bad)
                printf("  %s: O %lld bad (max err %.3g, worst %g vs %g), LSE %lld bad (max err "
                       "%.3g, worst %g vs %g)\n",
                       c->name, (long long)co.bad, co.max_abs_err, co.worst_got, co.worst_ref,
                       (long long)cl.bad, cl.max_abs_err, cl.worst_got, cl.worst_ref);
        }
    }
    free(ob), free(lb), free(got), free(ref), free(lgot), free(lref);
    return bad;
}

static void run_case(fi_context *ctx, const vcase *c, gu_stream s, uint64_t seed) {
    tu_rng rng;
    tu_rng_seed(&rng, seed ^ tu_hash(c->name));
    vbatch b;
    make_batch(&b, c, &rng);
    hbufs h;
    dev_args d;
    int32_t maxkv = 0;
    for (int i = 0; i < b.n; i++) {
        int32_t l = c->ragged ? b.kv_indptr[i + 1] - b.kv_indptr[i]
                              : PS * (b.kv_indptr[i + 1] - b.kv_indptr[i] - 1) + b.last[i];
        if (l > maxkv) maxkv = l;
    }
    vx_shape sh = {HQ, c->dim, maxkv};
    if (hbufs_make(&h, c, &b, &rng) || dev_args_make(&d, c->ex, &rng, &sh)) {
        CHECK(0, "%s: buffers", c->name);
        free(b.indices);
        return;
    }
    fi_attention_params p = case_params(c);
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    cfg.max_batch_size = MAXREQ, cfg.max_total_qo = (int32_t)h.nq;
    cfg.max_total_kv = (int32_t)(c->ragged ? b.total_kv : b.pages);
    if (c->split) cfg.fixed_split_size = SPLIT;
    else cfg.disable_split_kv = 1;
    fi_plan *plan = NULL;
    fi_variant_args va = {d.host.num_values, d.dev};
    fi_run_args a = device_args(&h, c, &va, s);
    fi_plan_info info = {.struct_size = sizeof info};
    fi_status st = fi_plan_create(ctx, &p, &cfg, &plan);
    if (!st) st = fi_plan_update(plan, &b.view);
    if (!st) st = fi_plan_get_info(plan, &info);
    if (!st) st = fi_plan_run(plan, &a);
    if (!st && GU(gu.StreamSynchronize(s))) st = FI_STATUS_BACKEND_ERROR;
    CHECK(st == FI_OK, "%s: create/update/run: %s", c->name, fi_status_string(st));
    if (!st) {
        CHECK(!c->split || info.num_split_items > 0, "%s: no split items", c->name);
        double worst = 0;
        int64_t bad = compare(c, &h, &b, &d, &p, &worst);
        if (bad == -2) {
            skipped++;
        } else {
            CHECK(bad == 0, "%s: %lld values off the oracle", c->name, (long long)bad);
            if (bad == 0) passed++;
            if (tu_opt.verbose || bad)
                printf("%s %s (%d items, %d split, max err %.2e)\n", bad ? "FAIL" : "PASS",
                       c->name, info.num_items, info.num_split_items, worst);
        }
    }
    fi_plan_destroy(plan);
    dev_args_free(&d);
    hbufs_free(&h);
    free(b.indices);
}

/* ------------------------------------------------------------------ graph */

/* The sink variant (a tensor parameter): capture a run, change the sink
 * logits on the device, replay: the replay reads them. */
static void test_graph(fi_context *ctx, gu_stream s) {
    vcase c = {VX_SINK, 0, 0, 0, 128, 1, "cuda/variants/graph"};
    if (!tu_selected(c.name)) return;
    tu_rng rng;
    tu_rng_seed(&rng, 77);
    vbatch b;
    make_batch(&b, &c, &rng);
    hbufs h;
    dev_args d;
    vx_shape sh = {HQ, c.dim, 2000};
    if (hbufs_make(&h, &c, &b, &rng) || dev_args_make(&d, c.ex, &rng, &sh)) {
        CHECK(0, "graph: buffers");
        return;
    }
    fi_attention_params p = case_params(&c);
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    cfg.max_batch_size = MAXREQ, cfg.max_total_qo = (int32_t)h.nq;
    cfg.max_total_kv = (int32_t)b.pages, cfg.fixed_split_size = SPLIT;
    fi_plan *plan = NULL;
    fi_variant_args va = {d.host.num_values, d.dev};
    fi_run_args a = device_args(&h, &c, &va, s);
    gu_graph g = NULL;
    gu_exec ex = NULL;
    int ok = fi_plan_create(ctx, &p, &cfg, &plan) == FI_OK && fi_plan_update(plan, &b.view) == FI_OK &&
             fi_plan_run(plan, &a) == FI_OK && !GU(gu.StreamSynchronize(s)) &&
             !GU(gu.BeginCapture(s, 0)) && fi_plan_run(plan, &a) == FI_OK &&
             !GU(gu.EndCapture(s, &g)) && !GU(gu.GraphInstantiate(&ex, g, 0));
    CHECK(ok, "graph: capture");
    size_t ob = (size_t)h.nq * HQ * c.dim * 2;
    uint16_t *eager = malloc(ob), *replay = malloc(ob);
    for (int round = 0; ok && round < 2; round++) {
        /* new sink logits, in place on the device */
        float *sink = d.host.host[0];
        for (int i = 0; i < HQ; i++) sink[i] = (float)tu_rng_range(&rng, -3, 3);
        GU(gu.HtoD(d.mem[0], sink, HQ * 4));
        GU(gu.MemsetD8(h.dout, 0xff, ob));
        GU(gu.CtxSynchronize());
        ok = fi_plan_run(plan, &a) == FI_OK && !GU(gu.StreamSynchronize(s)) &&
             !GU(gu.DtoH(eager, h.dout, ob));
        double worst = 0;
        int64_t bad = ok ? compare(&c, &h, &b, &d, &p, &worst) : -1;
        GU(gu.MemsetD8(h.dout, 0xff, ob));
        GU(gu.CtxSynchronize());
        ok = ok && !GU(gu.GraphLaunch(ex, s)) && !GU(gu.StreamSynchronize(s)) &&
             !GU(gu.DtoH(replay, h.dout, ob));
        CHECK(ok && (bad == 0 || bad == -2) && !memcmp(eager, replay, ob),
              "graph round %d: replay after new sink values (oracle bad %lld, bitwise %s)", round,
              (long long)bad, ok && !memcmp(eager, replay, ob) ? "same" : "different");
        if (ok && bad == 0 && !memcmp(eager, replay, ob)) passed++;
    }
    printf("graph: variant sink captured once, replayed after new tensor contents: %s\n",
           ok ? "done" : "failed");
    free(eager), free(replay);
    if (ex) gu.GraphExecDestroy(ex);
    if (g) gu.GraphDestroy(g);
    fi_plan_destroy(plan);
    dev_args_free(&d);
    hbufs_free(&h);
    free(b.indices);
}

/* ---------------------------------------------------------------- compile */

static const fi_variant_spec *bad_spec(void) {
    static fi_variant_spec s;
    fi_variant_spec_init(&s);
    s.name = "broken";
    s.logits_transform = "return s * undefined_thing;";
    return &s;
}

static void check_log(const char *where) {
    const char *e = fi_last_error();
    CHECK(strstr(e, "broken.logits_transform") && strstr(e, "undefined_thing"),
          "%s: the log names the snippet and the error", where);
    if (strstr(e, "broken.logits_transform") && strstr(e, "undefined_thing")) passed++;
}

/* Through the JIT alone: needs NVRTC only. */
static void test_compile_error_jit(void) {
    if (!tu_selected("cuda/variants/compile")) return;
    const char *why = NULL;
    if (!fi_nvrtc_load(&why)) {
        printf("compile: no NVRTC (%s): skipped\n", why);
        skipped++;
        return;
    }
    fi_variant *v = NULL;
    CHECK(fi_variant_create(bad_spec(), &v) == FI_OK, "bad variant create");
    if (!v) return;
    char *src = fi_variant_source_alloc(v, FI_VARIANT_TARGET_CUDA);
    fi_attention_params p;
    fi_attention_params_init(&p);
    p.num_qo_heads = HQ, p.num_kv_heads = HKV, p.q_dtype = p.kv_dtype = p.o_dtype = FI_DTYPE_BF16;
    fi_attn_config cfg;
    fi_cuda_attn_config(&p, HQ / HKV, 0, &cfg);
    fi_cuda_attn_set_variant(&cfg, v, src);
    fi_kernel_spec spec;
    fi_cuda_attn_spec(&cfg, &spec);
    char *image = NULL;
    size_t size = 0;
    fi_status st = fi_cuda_jit_compile(&spec, "compute_90a", &image, &size);
    CHECK(st == FI_STATUS_COMPILE_ERROR, "jit: status %s", fi_status_string(st));
    if (st == FI_STATUS_COMPILE_ERROR) {
        passed++;
        check_log("jit");
    }
    if (tu_opt.verbose) printf("compile error log:\n%s\n", fi_last_error());
    free(image), free(src);
    fi_variant_destroy(v);
}

static void test_compile_error_plan(fi_context *ctx) {
    if (!tu_selected("cuda/variants/compile")) return;
    fi_variant *v = NULL;
    if (fi_variant_create(bad_spec(), &v)) return;
    fi_attention_params p;
    fi_attention_params_init(&p);
    p.num_qo_heads = HQ, p.num_kv_heads = HKV, p.q_dtype = p.kv_dtype = p.o_dtype = FI_DTYPE_BF16;
    p.variant = v;
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    fi_plan *plan = NULL;
    fi_status st = fi_plan_create(ctx, &p, &cfg, &plan);
    CHECK(st == FI_STATUS_COMPILE_ERROR && !plan, "plan create: status %s", fi_status_string(st));
    if (st == FI_STATUS_COMPILE_ERROR) {
        passed++;
        check_log("plan");
    }
    fi_plan_destroy(plan);
    fi_variant_destroy(v);
}

int main(int argc, char **argv) {
    if (tu_parse_args(argc, argv, "test_cuda_variants: example variants on the CUDA backend"))
        return 2;
    for (int i = 0; i < VX_COUNT; i++)
        if (fi_variant_create(vx_spec(i), &variants[i])) {
            printf("variant %d: %s\n", i, fi_last_error());
            return 1;
        }
    if (tu_opt.list) {
        vcase c;
        for (int i = 0; case_at(i, &c); i++) printf("%s\n", c.name);
        return 0;
    }
    test_compile_error_jit();
    if (!fi_device_available(FI_DEVICE_CUDA) || gu_init(0)) {
        printf("no CUDA device: %d variant cases skipped; %d passed, %d failed\n",
               VX_COUNT * 32, passed, *gu_failures());
        return *gu_failures() ? 1 : 0;
    }
    fi_context_options opt;
    fi_context_options_init(&opt);
    opt.device = FI_DEVICE_CUDA;
    fi_context *ctx = NULL;
    if (fi_context_create(&opt, &ctx)) {
        printf("context: %s\n", fi_last_error());
        return 1;
    }
    printf("%s\n", fi_context_describe(ctx));
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    warm(((fi_cuda_ctx *)ctx->backend_state)->arch, cores > 1 ? (int)cores : 1);
    gu_stream s = NULL;
    GU(gu.StreamCreate(&s, 1));
    uint64_t seed = tu_opt.has_seed ? tu_opt.seed : 20261129;
    vcase c;
    for (int i = 0; case_at(i, &c); i++) {
        if (!tu_selected(c.name)) continue;
        if (tu_opt.quick && (i % 3)) continue; /* a third, every example */
        run_case(ctx, &c, s, seed);
    }
    test_graph(ctx, s);
    test_compile_error_plan(ctx);
    printf("test_cuda_variants: %d passed, %d failed, %d skipped\n", passed, *gu_failures(),
           skipped);
    fi_context_destroy(ctx);
    for (int i = 0; i < VX_COUNT; i++) fi_variant_destroy(variants[i]);
    return *gu_failures() ? 1 : 0;
}
