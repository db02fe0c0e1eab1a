/*
 * warmup.c — `fi warmup`: compile variants x head dims x dtypes into the
 * on-disk cache ahead of time (docs/VARIANTS.md), with one progress bar and
 * one summary over both backends:
 *  - CPU: the shared object a plan with those params would load (system C
 *    compiler; layout, format and masks are run-time values there);
 *  - CUDA: the cubins (NVRTC) a plan would load on a GPU of the target
 *    architecture, for each group size, KV format and mask mode asked for
 *    (compile-time facts of the CUDA kernels): attention, its merge and the
 *    tensor-core attention where supported — the specs of
 *    fi_cuda_plan_specs, cached under fi_cuda_cache_path, so the names and
 *    keys are the ones the plan computes. With a GPU the target is its
 *    architecture; without one, --arch (e.g. sm_90a for an H200) compiles
 *    for a machine that has it (the key covers the NVRTC version, so that
 *    machine needs the same NVRTC).
 *   fi warmup [--variants a,b,...|all] [--head-dims 64,128,256]
 *             [--dtypes f16,bf16,f32] [--backends cpu,cuda] [--arch sm_90a]
 *             [--groups 4] [--kv paged,ragged] [--masks none,causal]
 *             [-j N] [--dry-run] [--manifest FILE] [--list]
 * Variants by name: the built-in specs (fi_variant_builtin) and the examples
 * of tests/variant_examples.h. Q, KV and O share each dtype.
 */
#include "tools.h"
#include "core/cache.h"
#include "core/variant.h"
#include "cpu/variant_jit.h"
#include "cuda/cuda_backend.h"
#include "../tests/variant_examples.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { CPU = 0, CUDA = 1, MAX_VARIANTS = 32 };

static const char *const builtin_names[] = {"none", "soft_cap", "alibi", "sliding_window",
                                            "custom_mask", "rope_llama"};

typedef struct job {
    int backend;
    const fi_variant *v;
    fi_cpu_variant_config cfg; /* CPU */
    fi_kernel_spec spec;       /* CUDA */
    int cached;
    fi_status status;
    double seconds;
    char path[1024];
    char error[256];
} job;

typedef struct warmup {
    job *jobs;
    int num_jobs, cap;
    char arch[32];
    int dry_run;
    atomic_int next_job, done_jobs;
    pthread_mutex_t print_lock;
} warmup;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The variant called `name`: a built-in, else an example (created once). */
static const fi_variant *find_variant(const char *name) {
    static fi_variant *examples[VX_COUNT];
    const fi_variant *v = NULL;
    for (size_t i = 0; i < sizeof builtin_names / sizeof builtin_names[0]; i++)
        if (!strcmp(name, builtin_names[i]) && fi_variant_builtin(name, &v) == FI_OK) return v;
    for (int i = 0; i < VX_COUNT; i++) {
        if (strcmp(name, vx_spec(i)->name)) continue;
        if (!examples[i] && fi_variant_create(vx_spec(i), &examples[i])) return NULL;
        return examples[i];
    }
    return NULL;
}

/* A variant's CUDA hook text, generated once (kept for the process). */
static const char *cuda_source(const fi_variant *v) {
    static const fi_variant *keys[MAX_VARIANTS];
    static char *texts[MAX_VARIANTS];
    for (int i = 0; i < MAX_VARIANTS; i++) {
        if (keys[i] == v) return texts[i];
        if (!keys[i]) {
            keys[i] = v;
            return texts[i] = fi_variant_source_alloc(v, FI_VARIANT_TARGET_CUDA);
        }
    }
    return NULL;
}

static int parse_dtype(const char *s, fi_dtype *t) {
    static const char *const names[] = {"f32", "f16", "bf16"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, names[i])) return *t = (fi_dtype)i, 0;
    return -1;
}

static job *add_job(warmup *w) {
    if (w->num_jobs == w->cap) {
        int cap = w->cap ? 2 * w->cap : 256;
        job *j = realloc(w->jobs, sizeof *j * (size_t)cap);
        if (!j) return NULL;
        w->jobs = j, w->cap = cap;
    }
    job *j = &w->jobs[w->num_jobs++];
    memset(j, 0, sizeof *j);
    return j;
}

static void label(const job *j, char *buf, size_t n) {
    if (j->backend == CPU)
        snprintf(buf, n, "cpu  %s d%d %s", fi_variant_get_spec(j->v)->name,
                 (int)j->cfg.head_dim_qk, fi_dtype_name(j->cfg.q_dtype));
    else
        snprintf(buf, n, "cuda %s", j->spec.name);
}

static void progress(warmup *w, const job *j) {
    int done = atomic_fetch_add(&w->done_jobs, 1) + 1, width = 30;
    int fill = done * width / w->num_jobs;
    char bar[64], what[200];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    label(j, what, sizeof what);
    pthread_mutex_lock(&w->print_lock);
    fprintf(stderr, "%s[%s] %3d/%d  %-60.60s %s %6.0f ms%s", isatty(2) ? "\r" : "", bar, done,
            w->num_jobs, what, j->status ? "FAILED  " : j->cached ? "cached  " : "compiled",
            1e3 * j->seconds, isatty(2) && done < w->num_jobs ? "" : "\n");
    pthread_mutex_unlock(&w->print_lock);
}

static void run_job(warmup *w, job *j) {
    double t0 = now();
    if (j->backend == CPU) {
        const fi_vk_entry *e;
        fi_cc_result r;
        j->status = fi_cpu_variant_load(j->v, &j->cfg, &e, &r);
        if (!j->status) {
            j->cached = r.was_cached;
            snprintf(j->path, sizeof j->path, "%s", r.path);
            dlclose(r.handle);
        }
    } else {
        j->status = fi_cuda_jit_warm(&j->spec, w->arch, &j->cached);
    }
    j->seconds = now() - t0;
    if (j->status) snprintf(j->error, sizeof j->error, "%s", fi_last_error());
}

static void *worker(void *arg) {
    warmup *w = arg;
    for (int i; (i = atomic_fetch_add(&w->next_job, 1)) < w->num_jobs;) {
        run_job(w, &w->jobs[i]);
        progress(w, &w->jobs[i]);
    }
    return NULL;
}

static int usage(void) {
    fprintf(stderr,
            "usage: fi warmup [--variants a,b,...|all] [--head-dims 64,128,256]\n"
            "                 [--dtypes f16,bf16,f32] [--backends cpu,cuda] [--arch sm_90a]\n"
            "                 [--groups 4] [--kv paged,ragged] [--masks none,causal,custom]\n"
            "                 [-j N] [--dry-run] [--manifest FILE] [--list]\n"
            "Compile variant kernels into the cache (docs/VARIANTS.md): CPU objects, and\n"
            "CUDA cubins for this machine's GPU or for --arch (no GPU needed). --groups,\n"
            "--kv and --masks are the CUDA kernels' compile-time facts (query heads per KV\n"
            "head, KV format, mask mode); defaults 4, paged, none,causal.\n");
    return 2;
}

/* The CUDA kernels of (v, dim, dtype) for each group x format x mask, the
 * duplicates (a merge shared by several) dropped. */
static int add_cuda_jobs(warmup *w, const fi_variant *v, int dim, fi_dtype dt, const char *groups,
                         const char *kvs, const char *masks) {
    const char *vsrc = cuda_source(v);
    if (!vsrc) return fprintf(stderr, "fi warmup: variant source: out of memory\n"), -1;
    char gcopy[128], kcopy[128], mcopy[128], *gs, *ks, *ms;
    snprintf(gcopy, sizeof gcopy, "%s", groups);
    for (char *g = strtok_r(gcopy, ",", &gs); g; g = strtok_r(NULL, ",", &gs)) {
        int group = atoi(g);
        if (group < 1 || group > 64)
            return fprintf(stderr, "fi warmup: group %s: expected 1..64\n", g), -1;
        snprintf(kcopy, sizeof kcopy, "%s", kvs);
        for (char *k = strtok_r(kcopy, ",", &ks); k; k = strtok_r(NULL, ",", &ks)) {
            if (strcmp(k, "paged") && strcmp(k, "ragged"))
                return fprintf(stderr, "fi warmup: kv %s: expected paged or ragged\n", k), -1;
            snprintf(mcopy, sizeof mcopy, "%s", masks);
            for (char *m = strtok_r(mcopy, ",", &ms); m; m = strtok_r(NULL, ",", &ms)) {
                fi_attention_params p;
                fi_attention_params_init(&p);
                p.num_kv_heads = 1, p.num_qo_heads = group;
                p.head_dim_qk = p.head_dim_vo = dim;
                p.q_dtype = p.kv_dtype = p.o_dtype = dt;
                p.kv_format = !strcmp(k, "paged") ? FI_KV_FORMAT_PAGED : FI_KV_FORMAT_RAGGED;
                if (!strcmp(m, "none")) p.mask_mode = FI_MASK_NONE;
                else if (!strcmp(m, "causal")) p.mask_mode = FI_MASK_CAUSAL;
                else if (!strcmp(m, "custom")) p.mask_mode = FI_MASK_CUSTOM;
                else return fprintf(stderr, "fi warmup: mask %s: none, causal or custom\n", m), -1;
                p.variant = v;
                fi_kernel_spec specs[3];
                int n = fi_cuda_plan_specs(&p, 0, vsrc, specs, NULL);
                for (int i = 0; i < n; i++) {
                    int dup = 0;
                    for (int j = 0; j < w->num_jobs && !dup; j++)
                        dup = w->jobs[j].backend == CUDA && !strcmp(w->jobs[j].spec.name, specs[i].name);
                    if (dup) continue;
                    job *jb = add_job(w);
                    if (!jb) return fprintf(stderr, "fi warmup: out of memory\n"), -1;
                    jb->backend = CUDA, jb->v = v, jb->spec = specs[i];
                    fi_cuda_cache_path(&specs[i], w->arch, jb->path, sizeof jb->path);
                }
            }
        }
    }
    return 0;
}

static void summary(const warmup *w, int backend, const char *where) {
    int compiled = 0, cached = 0, failed = 0, total = 0;
    double compile_s = 0, load_s = 0;
    for (int i = 0; i < w->num_jobs; i++) {
        const job *j = &w->jobs[i];
        if (j->backend != backend) continue;
        total++;
        if (j->status) {
            char what[200];
            label(j, what, sizeof what);
            failed++;
            fprintf(stderr, "  %s: %s\n", what, j->error);
        } else if (j->cached) {
            cached++, load_s += j->seconds;
        } else {
            compiled++, compile_s += j->seconds;
        }
    }
    if (!total) return;
    printf("fi warmup: %-4s %d kernels: %d compiled (%.2f s, %.0f ms each), %d already cached "
           "(%.2f ms each), %d failed; cache %s\n",
           backend == CPU ? "CPU" : "CUDA", total, compiled, compile_s,
           compiled ? 1e3 * compile_s / compiled : 0.0, cached,
           cached ? 1e3 * load_s / cached : 0.0, failed, where);
}

static int write_manifest(const warmup *w, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return fprintf(stderr, "fi warmup: cannot write %s\n", path), -1;
    for (int i = 0; i < w->num_jobs; i++) {
        const job *j = &w->jobs[i];
        if (j->backend == CPU)
            fprintf(f, "cpu %s d%d %s %s\n", fi_variant_get_spec(j->v)->name,
                    (int)j->cfg.head_dim_qk, fi_dtype_name(j->cfg.q_dtype),
                    j->path[0] ? j->path : "-");
        else
            fprintf(f, "cuda %s %s %s\n", w->arch, j->spec.name, j->path);
    }
    return fclose(f) ? -1 : 0;
}

int fi_warmup(int argc, char **argv) {
    char variants[1024] = "all", dims[128] = "64,128,256", dtypes[128] = "f16,bf16,f32";
    char backends[64] = "", groups[128] = "4", kvs[128] = "paged", masks[128] = "none,causal";
    const char *manifest = NULL;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = ncpu > 0 ? (int)ncpu : 1, list = 0, rc = 0;
    warmup w;
    memset(&w, 0, sizeof w);
    pthread_mutex_init(&w.print_lock, NULL);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--list")) list = 1;
        else if (!strcmp(a, "--dry-run")) w.dry_run = 1;
        else if (!val) return usage();
        else if (!strcmp(a, "--variants")) snprintf(variants, sizeof variants, "%s", val), i++;
        else if (!strcmp(a, "--head-dims")) snprintf(dims, sizeof dims, "%s", val), i++;
        else if (!strcmp(a, "--dtypes")) snprintf(dtypes, sizeof dtypes, "%s", val), i++;
        else if (!strcmp(a, "--backends")) snprintf(backends, sizeof backends, "%s", val), i++;
        else if (!strcmp(a, "--arch")) snprintf(w.arch, sizeof w.arch, "%s", val), i++;
        else if (!strcmp(a, "--groups")) snprintf(groups, sizeof groups, "%s", val), i++;
        else if (!strcmp(a, "--kv")) snprintf(kvs, sizeof kvs, "%s", val), i++;
        else if (!strcmp(a, "--masks")) snprintf(masks, sizeof masks, "%s", val), i++;
        else if (!strcmp(a, "--manifest")) manifest = val, i++;
        else if (!strcmp(a, "-j")) threads = atoi(val), i++;
        else return usage();
    }
    if (!strcmp(variants, "all")) {
        int n = 0;
        for (size_t i = 0; i < sizeof builtin_names / sizeof builtin_names[0]; i++)
            n += snprintf(variants + n, sizeof variants - (size_t)n, "%s,", builtin_names[i]);
        for (int i = 0; i < VX_COUNT; i++)
            n += snprintf(variants + n, sizeof variants - (size_t)n, "%s,", vx_spec(i)->name);
        variants[n - 1] = 0;
    }
    if (list) {
        printf("variants: %s\n", variants);
        return 0;
    }
    /* Backends: as asked; by default the CPU's, and CUDA's with --arch or a GPU. */
    int explicit = backends[0] != 0;
    int want_cpu = !explicit || strstr(backends, "cpu") != NULL;
    int want_cuda = explicit ? strstr(backends, "cuda") != NULL : w.arch[0] != 0;
    int asked_cuda = want_cuda; /* not merely found: then a missing NVRTC fails */
    const char *why = NULL;
    if (want_cuda || !explicit) {
        if (!w.arch[0] && fi_cuda_device_arch(0, w.arch, sizeof w.arch) == FI_OK) want_cuda = 1;
        if (want_cuda && !w.arch[0]) {
            fprintf(stderr, "fi warmup: CUDA: %s; give --arch (e.g. sm_90a) to compile "
                            "without a GPU\n", fi_last_error());
            return 1;
        }
        if (want_cuda && !w.dry_run && !fi_nvrtc_load(&why)) {
            fprintf(stderr, "fi warmup: CUDA kernels: %s\n", why);
            if (asked_cuda) return 1;
            want_cuda = 0;
        }
    }
    if (want_cpu && !fi_cc_available(&why)) {
        fprintf(stderr, "fi warmup: CPU kernels: %s\n", why);
        if (explicit || !want_cuda) return 1;
        want_cpu = 0;
    }
    char *vs, *ds, *ts;
    for (char *v = strtok_r(variants, ",", &vs); v; v = strtok_r(NULL, ",", &vs)) {
        const fi_variant *var = find_variant(v);
        if (!var) {
            fprintf(stderr, "fi warmup: no variant \"%s\" (fi warmup --list)\n", v);
            return 2;
        }
        char dcopy[128];
        snprintf(dcopy, sizeof dcopy, "%s", dims);
        for (char *d = strtok_r(dcopy, ",", &ds); d; d = strtok_r(NULL, ",", &ds)) {
            int dim = atoi(d);
            if (dim != 64 && dim != 128 && dim != 256) {
                fprintf(stderr, "fi warmup: head dim %s: expected 64, 128 or 256\n", d);
                return 2;
            }
            char tcopy[128];
            snprintf(tcopy, sizeof tcopy, "%s", dtypes);
            for (char *t = strtok_r(tcopy, ",", &ts); t; t = strtok_r(NULL, ",", &ts)) {
                fi_dtype dt;
                if (parse_dtype(t, &dt)) {
                    fprintf(stderr, "fi warmup: dtype %s: expected f32, f16 or bf16\n", t);
                    return 2;
                }
                if (want_cpu) {
                    job *j = add_job(&w);
                    if (!j) return 1;
                    j->backend = CPU, j->v = var, j->cfg = (fi_cpu_variant_config){dim, dim, dt, dt, dt};
                }
                if (want_cuda && add_cuda_jobs(&w, var, dim, dt, groups, kvs, masks)) return 2;
            }
        }
    }
    char dir[800], cpu_dir[810];
    fi_cache_dir(dir, sizeof dir);
    snprintf(cpu_dir, sizeof cpu_dir, "%s/cpu", dir);
    int ncpu_jobs = 0;
    for (int i = 0; i < w.num_jobs; i++) ncpu_jobs += w.jobs[i].backend == CPU;
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    fprintf(stderr, "fi warmup: %d CPU kernels into %s, %d CUDA kernels for %s into %s; %d job%s%s\n",
            ncpu_jobs, cpu_dir, w.num_jobs - ncpu_jobs, want_cuda ? w.arch : "-", dir, threads,
            threads == 1 ? "" : "s", w.dry_run ? " (dry run: nothing compiled)" : "");
    double t0 = now();
    if (!w.dry_run && w.num_jobs) {
        pthread_t tid[64];
        int started[64] = {0};
        for (int i = 1; i < threads; i++)
            started[i] = pthread_create(&tid[i], NULL, worker, &w) == 0;
        worker(&w);
        for (int i = 1; i < threads; i++)
            if (started[i]) pthread_join(tid[i], NULL);
        summary(&w, CPU, cpu_dir);
        summary(&w, CUDA, dir);
        printf("fi warmup: %.1f s wall\n", now() - t0);
        for (int i = 0; i < w.num_jobs; i++) rc |= w.jobs[i].status != FI_OK;
    }
    if (manifest && write_manifest(&w, manifest)) rc = 1;
    free(w.jobs);
    return rc;
}
