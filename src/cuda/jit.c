/*
 * jit.c — kernels compiled on first use: a spec (entry file, name, -D
 * options) is compiled by NVRTC from the sources embedded in the library,
 * for the device's architecture, cached on disk under the SHA-256 key of
 * (sources, options, arch, NVRTC version) in the private, verified cache of
 * core/cache.h (a cubin is loaded only when its record matches; without a
 * usable cache directory kernels are compiled and not stored), and loaded
 * with cuModuleLoadData; each context keeps its loaded modules in memory.
 * Kernels compiled ahead of time by nvcc (src/cuda/aot.c) are taken from
 * the library's table first.
 */
#include "cuda/cuda_backend.h"
#include "cuda/kernel_sources.h"
#include "core/cache.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define JIT_FORMAT "flashinfer-c jit 2"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The embedded kernel sources, hashed once per process. */
static uint8_t sources_digest[FI_SHA256_BYTES];
static pthread_once_t sources_once = PTHREAD_ONCE_INIT;

static void sources_hash(void) {
    fi_sha256 h;
    fi_sha256_init(&h);
    for (int i = 0; i < fi_kernel_file_count; i++) {
        fi_sha256_str(&h, fi_kernel_files[i].name);
        fi_sha256_field(&h, fi_kernel_files[i].text, fi_kernel_files[i].size);
    }
    fi_sha256_final(&h, sources_digest);
}

/* NVRTC options of a spec, in order; returns how many. */
static int spec_options(const fi_kernel_spec *spec, const char *arch, char *archopt, size_t n,
                        const char **opts) {
    int k = 0;
    snprintf(archopt, n, "--gpu-architecture=%s", arch);
    opts[k++] = archopt;
    opts[k++] = "-std=c++17";
    for (int i = 0; i < spec->num_defines; i++) opts[k++] = spec->defines[i];
    return k;
}

void fi_cuda_jit_key(const fi_kernel_spec *spec, const char *arch,
                     uint8_t key[FI_SHA256_BYTES]) {
    const char *why;
    const fi_nvrtc_api *nv = fi_nvrtc_load(&why);
    pthread_once(&sources_once, sources_hash);
    fi_sha256 h;
    fi_sha256_init(&h);
    fi_sha256_str(&h, JIT_FORMAT);
    fi_sha256_field(&h, sources_digest, sizeof sources_digest);
    fi_sha256_str(&h, spec->entry_file);
    fi_sha256_str(&h, spec->name);
    const char *opts[FI_SPEC_MAX_DEFINES + 4];
    char archopt[64];
    int n = spec_options(spec, arch, archopt, sizeof archopt, opts);
    for (int i = 0; i < n; i++) fi_sha256_str(&h, opts[i]);
    fi_sha256_str(&h, spec->header ? spec->header : ""); /* a variant's hook text */
    int32_t ver[2] = {nv ? nv->major : 0, nv ? nv->minor : 0};
    fi_sha256_field(&h, ver, sizeof ver);
    fi_sha256_final(&h, key);
}

fi_status fi_cuda_jit_compile(const fi_kernel_spec *spec, const char *arch, char **image,
                              size_t *size) {
    *image = NULL;
    *size = 0;
    const char *why;
    const fi_nvrtc_api *nv = fi_nvrtc_load(&why);
    if (!nv) return fi_error(FI_STATUS_NO_DEVICE, "kernel %s: %s", spec->name, why);
    enum { MAX_HEADERS = 32 }; /* every kernels/ file, and a variant's hooks */
    const char *hdr[MAX_HEADERS], *inc[MAX_HEADERS];
    if (fi_kernel_file_count > MAX_HEADERS - 1)
        return fi_error(FI_STATUS_INTERNAL,
                        "kernel %s: %d embedded kernel sources, NVRTC is given at most %d",
                        spec->name, fi_kernel_file_count, MAX_HEADERS - 1);
    int nh = fi_kernel_file_count;
    for (int i = 0; i < nh; i++) {
        hdr[i] = fi_kernel_files[i].text;
        inc[i] = fi_kernel_files[i].name;
    }
    if (spec->header) { /* kernels/variant.cuh includes it under FI_VARIANT */
        hdr[nh] = spec->header;
        inc[nh++] = "fi_variant_hooks.cuh";
    }
    char main_src[160];
    snprintf(main_src, sizeof main_src, "#include \"%s\"\n", spec->entry_file);
    char prog_name[FI_KERNEL_NAME_MAX + 8];
    snprintf(prog_name, sizeof prog_name, "%s.cu", spec->name);
    nvrtcProgram prog = NULL;
    int r = nv->CreateProgram(&prog, main_src, prog_name, nh, hdr, inc);
    if (r != 0)
        return fi_error(FI_STATUS_BACKEND_ERROR, "nvrtcCreateProgram(%s) failed: %s", spec->name,
                        nv->GetErrorString(r));
    const char *opts[FI_SPEC_MAX_DEFINES + 4];
    char archopt[64];
    int n = spec_options(spec, arch, archopt, sizeof archopt, opts);
    r = nv->CompileProgram(prog, n, opts);
    if (r != 0) {
        size_t logn = 0;
        char log[7000] = "";
        if (nv->GetProgramLogSize(prog, &logn) == 0 && logn > 0) {
            char *full = malloc(logn + 1);
            if (full && nv->GetProgramLog(prog, full) == 0) {
                full[logn] = 0;
                snprintf(log, sizeof log, "%s", full);
            }
            free(full);
        }
        nv->DestroyProgram(&prog);
        /* with a variant, most likely its hook source: the log says where
         * (the generated text names each snippet "<variant>.<hook>") */
        return fi_error(spec->header ? FI_STATUS_COMPILE_ERROR : FI_STATUS_BACKEND_ERROR,
                        "NVRTC compile of %s for %s failed: %s\n%s", spec->name, arch,
                        nv->GetErrorString(r), log);
    }
    int want_cubin = strncmp(arch, "sm_", 3) == 0;
    size_t len = 0;
    r = want_cubin ? nv->GetCUBINSize(prog, &len) : nv->GetPTXSize(prog, &len);
    char *buf = r == 0 ? malloc(len ? len : 1) : NULL;
    if (r == 0 && !buf) {
        nv->DestroyProgram(&prog);
        return fi_error(FI_STATUS_OUT_OF_MEMORY, "kernel %s: out of memory", spec->name);
    }
    if (r == 0) r = want_cubin ? nv->GetCUBIN(prog, buf) : nv->GetPTX(prog, buf);
    nv->DestroyProgram(&prog);
    if (r != 0) {
        free(buf);
        return fi_error(FI_STATUS_BACKEND_ERROR, "NVRTC output of %s: %s", spec->name,
                        nv->GetErrorString(r));
    }
    *image = buf;
    *size = len;
    return FI_OK;
}

/* ------------------------------------------------------------ disk cache */

fi_status fi_cuda_cache_dir(char *buf, size_t n) { return fi_cache_dir(buf, n); }

fi_status fi_cuda_cache_path(const fi_kernel_spec *spec, const char *arch, char *buf, size_t n,
                             uint8_t key[FI_SHA256_BYTES]) {
    uint8_t k[FI_SHA256_BYTES];
    char dir[PATH_MAX], hex[FI_CACHE_NAME_HEX + 1];
    fi_cuda_jit_key(spec, arch, k);
    if (key) memcpy(key, k, sizeof k);
    fi_sha256_hex(k, FI_CACHE_NAME_HEX / 2, hex);
    fi_status st = fi_cache_location(dir, sizeof dir);
    if (!st) st = fi_cache_format(buf, n, spec->name, "%s/%s-%s-%s.cubin", dir, spec->name, arch, hex);
    return st;
}

fi_status fi_cuda_jit_warm(const fi_kernel_spec *spec, const char *arch, int *was_cached) {
    char path[PATH_MAX], dir[PATH_MAX];
    uint8_t key[FI_SHA256_BYTES];
    fi_status st = fi_cache_dir(dir, sizeof dir); /* created and verified */
    if (!st) st = fi_cuda_cache_path(spec, arch, path, sizeof path, key);
    if (st) return st;
    *was_cached = fi_cache_check(path, key);
    if (*was_cached) return FI_OK;
    char *image = NULL;
    size_t size = 0;
    if ((st = fi_cuda_jit_compile(spec, arch, &image, &size))) return st;
    st = fi_cache_store(path, key, image, size);
    free(image);
    return st;
}

/* ----------------------------------------------------------- per context */

static fi_status load_module(fi_cuda_ctx *cc, const fi_kernel_spec *spec, const void *image,
                             fi_cuda_module *m) {
    const fi_cu_api *cu = cc->cu;
    FI_CU(cu, ModuleLoadData, &m->module, image);
    CUresult r = cu->ModuleGetFunction(&m->function, m->module, spec->name);
    if (r != 0) {
        cu->ModuleUnload(m->module);
        m->module = NULL;
        return fi_cu_error(cu, "cuModuleGetFunction", r);
    }
    return FI_OK;
}

/* The library's AOT table, else disk, else NVRTC; fills m. Called with
 * cc->lock held. */
static fi_status build_module(fi_cuda_ctx *cc, const fi_kernel_spec *spec, fi_cuda_module *m) {
    double t0 = now_seconds();
    size_t size = 0;
    const void *aot = cc->tuning.use_aot ? fi_cuda_aot_find(spec, cc->arch, &size) : NULL;
    if (aot) {
        fi_status st = load_module(cc, spec, aot, m);
        if (st == FI_OK) {
            double dt = now_seconds() - t0;
            cc->stats.aot_loads++;
            cc->stats.aot_load_seconds += dt;
            if (cc->tuning.jit_log)
                fprintf(stderr, "flashinfer-c jit: %s loaded from the AOT table in %.2f ms\n",
                        spec->name, 1e3 * dt);
            return FI_OK;
        }
        fi_error_clear(); /* a cubin this driver refuses: the JIT path below */
    }
    /* the disk cache when its directory passes the checks (core/cache.h),
     * else compiled and kept in memory only */
    char path[PATH_MAX], dir[PATH_MAX];
    uint8_t key[FI_SHA256_BYTES];
    bool disk = fi_cache_dir(dir, sizeof dir) == FI_OK &&
                fi_cuda_cache_path(spec, cc->arch, path, sizeof path, key) == FI_OK;
    if (!disk) {
        if (cc->tuning.jit_log)
            fprintf(stderr, "flashinfer-c jit: no disk cache (%s)\n", fi_last_error());
        fi_error_clear();
    }
    t0 = now_seconds();
    char *image = disk ? fi_cache_load(path, key, &size) : NULL;
    if (image) {
        fi_status st = load_module(cc, spec, image, m);
        free(image);
        if (st == FI_OK) {
            double dt = now_seconds() - t0;
            cc->stats.disk_loads++;
            cc->stats.disk_load_seconds += dt;
            if (cc->tuning.jit_log)
                fprintf(stderr, "flashinfer-c jit: %s loaded from %s in %.2f ms\n", spec->name,
                        path, 1e3 * dt);
            return FI_OK;
        }
        fi_error_clear(); /* a stale or broken file: compile afresh */
    }
    t0 = now_seconds();
    fi_status st = fi_cuda_jit_compile(spec, cc->arch, &image, &size);
    if (st) return st;
    double dt = now_seconds() - t0;
    cc->stats.compiled++;
    cc->stats.compile_seconds += dt;
    if (disk && fi_cache_store(path, key, image, size)) fi_error_clear(); /* kept in memory */
    st = load_module(cc, spec, image, m);
    free(image);
    if (cc->tuning.jit_log)
        fprintf(stderr, "flashinfer-c jit: %s compiled by NVRTC for %s in %.1f ms -> %s\n",
                spec->name, cc->arch, 1e3 * dt, path);
    return st;
}

fi_status fi_cuda_jit_function(fi_cuda_ctx *cc, const fi_kernel_spec *spec, CUfunction *fn) {
    *fn = NULL;
    pthread_mutex_lock(&cc->lock);
    for (fi_cuda_module *m = cc->modules; m; m = m->next) {
        if (strcmp(m->name, spec->name) == 0) {
            cc->stats.memory_hits++;
            *fn = m->function;
            pthread_mutex_unlock(&cc->lock);
            return FI_OK;
        }
    }
    fi_cuda_module *m = calloc(1, sizeof *m);
    fi_status st = m ? build_module(cc, spec, m)
                     : fi_error(FI_STATUS_OUT_OF_MEMORY, "kernel %s: out of memory", spec->name);
    if (st == FI_OK) {
        snprintf(m->name, sizeof m->name, "%s", spec->name);
        m->next = cc->modules;
        cc->modules = m;
        *fn = m->function;
    } else {
        free(m);
    }
    pthread_mutex_unlock(&cc->lock);
    return st;
}

/* ------------------------------------------------- parallel cold compiles */

typedef struct warm_job {
    const fi_kernel_spec *spec;
    const char *arch;
    pthread_t thread;
    int started, cached;
    fi_status st;
    char msg[1024];
} warm_job;

static void *warm_thread(void *arg) {
    warm_job *j = arg;
    j->st = fi_cuda_jit_warm(j->spec, j->arch, &j->cached);
    if (j->st) snprintf(j->msg, sizeof j->msg, "%s", fi_last_error());
    return NULL;
}

static bool in_memory(fi_cuda_ctx *cc, const fi_kernel_spec *spec) {
    bool hit = false;
    pthread_mutex_lock(&cc->lock);
    for (fi_cuda_module *m = cc->modules; m && !hit; m = m->next) hit = !strcmp(m->name, spec->name);
    pthread_mutex_unlock(&cc->lock);
    return hit;
}

fi_status fi_cuda_jit_prepare(fi_cuda_ctx *cc, const fi_kernel_spec *const *specs, int n) {
    enum { MAXJ = 8 };
    warm_job jobs[MAXJ];
    int k = 0;
    for (int i = 0; i < n && k < MAXJ; i++) {
        size_t aot_size;
        if (in_memory(cc, specs[i]) ||
            (cc->tuning.use_aot && fi_cuda_aot_find(specs[i], cc->arch, &aot_size)))
            continue;
        char path[PATH_MAX];
        if (fi_cuda_cache_path(specs[i], cc->arch, path, sizeof path, NULL) == FI_OK &&
            access(path, R_OK) == 0)
            continue; /* verified when it is loaded */
        fi_error_clear();
        memset(&jobs[k], 0, sizeof jobs[k]);
        jobs[k].spec = specs[i], jobs[k++].arch = cc->arch;
    }
    if (k < 2) return FI_OK; /* nothing to overlap: fi_cuda_jit_function compiles it */
    double t0 = now_seconds();
    for (int i = 0; i < k; i++)
        jobs[i].started = pthread_create(&jobs[i].thread, NULL, warm_thread, &jobs[i]) == 0;
    fi_status st = FI_OK;
    int compiled = 0;
    for (int i = 0; i < k; i++) {
        if (jobs[i].started) pthread_join(jobs[i].thread, NULL);
        else warm_thread(&jobs[i]); /* no thread: compile here */
        if (jobs[i].st && !st) st = fi_error(jobs[i].st, "%s", jobs[i].msg);
        compiled += !jobs[i].st && !jobs[i].cached;
    }
    double dt = now_seconds() - t0;
    pthread_mutex_lock(&cc->lock);
    cc->stats.compiled += compiled;
    cc->stats.compile_seconds += dt;
    pthread_mutex_unlock(&cc->lock);
    if (cc->tuning.jit_log)
        fprintf(stderr, "flashinfer-c jit: %d kernels compiled by NVRTC side by side in %.1f ms\n",
                compiled, 1e3 * dt);
    return st;
}

fi_cuda_jit_stats fi_cuda_jit_get_stats(const fi_context *ctx) {
    fi_cuda_jit_stats s;
    memset(&s, 0, sizeof s);
    if (!ctx || ctx->device != FI_DEVICE_CUDA || !ctx->backend_state) return s;
    fi_cuda_ctx *cc = ctx->backend_state;
    pthread_mutex_lock(&cc->lock);
    s = cc->stats;
    pthread_mutex_unlock(&cc->lock);
    return s;
}
