/*
 * warmup.c — `fi warmup`: compile variants x head dims x dtypes into the
 * on-disk cache ahead of time (docs/VARIANTS.md), with a progress bar and a
 * summary. The CPU kernels are shared objects built by the system C
 * compiler; each is the one a plan with those params would load.
 *   fi warmup [--variants a,b,...|all] [--head-dims 64,128,256]
 *             [--dtypes f16,bf16,f32] [-j N] [--list]
 * Variants by name: the built-in specs (fi_variant_builtin) and the examples
 * of tests/variant_examples.h. Q, KV and O share each dtype.
 */
#include "tools.h"
#include "core/cache.h"
#include "cpu/variant_jit.h"
#include "../tests/variant_examples.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { MAX_JOBS = 512 };

static const char *const builtin_names[] = {"none", "soft_cap", "alibi", "sliding_window",
                                            "custom_mask", "rope_llama"};

typedef struct job {
    const fi_variant *v;
    fi_cpu_variant_config cfg;
    int cached;
    fi_status status;
    double seconds;
    char error[256];
} job;

static job jobs[MAX_JOBS];
static int num_jobs;
static atomic_int next_job, done_jobs;
static pthread_mutex_t print_lock = PTHREAD_MUTEX_INITIALIZER;

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

static int parse_dtype(const char *s, fi_dtype *t) {
    static const char *const names[] = {"f32", "f16", "bf16"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, names[i])) return *t = (fi_dtype)i, 0;
    return -1;
}

static void progress(const job *j) {
    int done = atomic_fetch_add(&done_jobs, 1) + 1, width = 30, fill = done * width / num_jobs;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    pthread_mutex_lock(&print_lock);
    fprintf(stderr, "%s[%s] %3d/%d  %-14s d%-3d %-4s %s %6.0f ms%s", isatty(2) ? "\r" : "",
            bar, done, num_jobs, fi_variant_get_spec(j->v)->name, (int)j->cfg.head_dim_qk,
            fi_dtype_name(j->cfg.q_dtype),
            j->status ? "FAILED" : j->cached ? "cached  " : "compiled", 1e3 * j->seconds,
            isatty(2) && done < num_jobs ? "" : "\n");
    pthread_mutex_unlock(&print_lock);
}

static void *worker(void *arg) {
    (void)arg;
    for (int i; (i = atomic_fetch_add(&next_job, 1)) < num_jobs;) {
        job *j = &jobs[i];
        const fi_vk_entry *e;
        fi_cc_result r;
        double t0 = now();
        j->status = fi_cpu_variant_load(j->v, &j->cfg, &e, &r);
        j->seconds = now() - t0;
        if (j->status) snprintf(j->error, sizeof j->error, "%s", fi_last_error());
        else j->cached = r.was_cached, dlclose(r.handle);
        progress(j);
    }
    return NULL;
}

static int usage(void) {
    fprintf(stderr,
            "usage: fi warmup [--variants a,b,...|all] [--head-dims 64,128,256]\n"
            "                 [--dtypes f16,bf16,f32] [-j N] [--list]\n"
            "Compile CPU variant kernels into the cache (docs/VARIANTS.md).\n");
    return 2;
}

int fi_warmup(int argc, char **argv) {
    char variants[1024] = "all", dims[128] = "64,128,256", dtypes[128] = "f16,bf16,f32";
    int threads = 1, list = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--list")) list = 1;
        else if (!val) return usage();
        else if (!strcmp(a, "--variants")) snprintf(variants, sizeof variants, "%s", val), i++;
        else if (!strcmp(a, "--head-dims")) snprintf(dims, sizeof dims, "%s", val), i++;
        else if (!strcmp(a, "--dtypes")) snprintf(dtypes, sizeof dtypes, "%s", val), i++;
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
                if (num_jobs == MAX_JOBS) {
                    fprintf(stderr, "fi warmup: more than %d kernels\n", MAX_JOBS);
                    return 2;
                }
                jobs[num_jobs++] = (job){.v = var, .cfg = {dim, dim, dt, dt, dt}};
            }
        }
    }
    const char *why = NULL;
    if (!fi_cc_available(&why)) {
        fprintf(stderr, "fi warmup: %s\n", why);
        return 1;
    }
    char dir[800];
    fi_cache_dir(dir, sizeof dir - 4);
    strcat(dir, "/cpu");
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    fprintf(stderr, "fi warmup: %d CPU kernels into %s, %d job%s\n", num_jobs, dir, threads,
            threads == 1 ? "" : "s");
    double t0 = now();
    pthread_t tid[64];
    for (int i = 1; i < threads; i++) pthread_create(&tid[i], NULL, worker, NULL);
    worker(NULL);
    for (int i = 1; i < threads; i++) pthread_join(tid[i], NULL);
    int compiled = 0, cached = 0, failed = 0;
    double compile_s = 0, load_s = 0;
    for (int i = 0; i < num_jobs; i++) {
        if (jobs[i].status) {
            failed++;
            fprintf(stderr, "  %s d%d %s: %s\n", fi_variant_get_spec(jobs[i].v)->name,
                    (int)jobs[i].cfg.head_dim_qk, fi_dtype_name(jobs[i].cfg.q_dtype),
                    jobs[i].error);
        } else if (jobs[i].cached) {
            cached++, load_s += jobs[i].seconds;
        } else {
            compiled++, compile_s += jobs[i].seconds;
        }
    }
    printf("fi warmup: %d kernels: %d compiled (%.2f s, %.0f ms each), %d already cached "
           "(%.2f ms each), %d failed; %.1f s wall; cache %s\n",
           num_jobs, compiled, compile_s, compiled ? 1e3 * compile_s / compiled : 0.0, cached,
           cached ? 1e3 * load_s / cached : 0.0, failed, now() - t0, dir);
    return failed ? 1 : 0;
}
