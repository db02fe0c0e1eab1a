/*
 * test_warmup.c — `fi warmup` (tools/warmup.c, run in-process) puts CUDA
 * kernels where a plan looks for them, without a GPU:
 *  - keys: for plans a user would create (heads, dims, dtypes, KV format,
 *    mask, variant), the cache files the CUDA backend computes at plan
 *    creation (fi_cuda_plan_specs + fi_cuda_cache_path for the target an
 *    H200 gets from fi_cuda_arch_name(9, 0)) equal the files fi warmup
 *    --arch sm_90a lists for the same configuration (--dry-run --manifest),
 *    no more and no fewer; the arch naming itself;
 *  - compile (needs NVRTC, not a GPU): fi warmup --arch sm_90a writes those
 *    files, each a cubin (ELF), nothing else; a second run compiles nothing;
 *  - args: bad head dims, dtypes, groups and masks are refused.
 * Everything runs in a temporary cache directory (tu_temp_cache_dir).
 */
#include "cuda/cuda_backend.h"
#include "core/variant.h"
#include "../tools/tools.h"
#include "util.h"
#include "variant_examples.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct wcase {
    const char *variant; /* a built-in or an example */
    int32_t d, hq, hkv;
    fi_dtype dt;
    fi_kv_format format;
    fi_mask_mode mask;
} wcase;

static const wcase cases[] = {
    {"sink", 128, 32, 8, FI_DTYPE_BF16, FI_KV_FORMAT_PAGED, FI_MASK_CAUSAL},
    {"streaming", 64, 16, 16, FI_DTYPE_F16, FI_KV_FORMAT_RAGGED, FI_MASK_NONE},
    {"sigmoid", 256, 64, 8, FI_DTYPE_F32, FI_KV_FORMAT_PAGED, FI_MASK_CUSTOM},
    {"none", 128, 8, 2, FI_DTYPE_F16, FI_KV_FORMAT_PAGED, FI_MASK_NONE},
};
enum { NUM_CASES = sizeof cases / sizeof cases[0] };

static const char *mask_name(fi_mask_mode m) {
    return m == FI_MASK_CAUSAL ? "causal" : m == FI_MASK_CUSTOM ? "custom" : "none";
}

static const fi_variant *variant_of(const char *name, fi_variant **owned) {
    const fi_variant *v = NULL;
    *owned = NULL;
    if (fi_variant_builtin(name, &v) == FI_OK) return v;
    for (int i = 0; i < VX_COUNT; i++)
        if (!strcmp(vx_spec(i)->name, name) && fi_variant_create(vx_spec(i), owned) == FI_OK)
            return *owned;
    return NULL;
}

/* The cache files a plan for case c looks up on an H200; returns how many. */
static int runtime_paths(const wcase *c, char paths[3][1024]) {
    fi_variant *owned;
    fi_attention_params p;
    fi_attention_params_init(&p);
    p.num_qo_heads = c->hq, p.num_kv_heads = c->hkv;
    p.head_dim_qk = p.head_dim_vo = c->d;
    p.q_dtype = p.kv_dtype = p.o_dtype = c->dt;
    p.kv_format = c->format, p.page_size = 16;
    p.mask_mode = c->mask;
    p.variant = variant_of(c->variant, &owned);
    char *src = p.variant ? fi_variant_source_alloc(p.variant, FI_VARIANT_TARGET_CUDA) : NULL;
    if (!src) return 0;
    char arch[32];
    fi_cuda_arch_name(9, 0, arch, sizeof arch);
    fi_kernel_spec specs[3];
    int n = fi_cuda_plan_specs(&p, 0, src, specs, NULL);
    for (int i = 0; i < n; i++) fi_cuda_cache_path(&specs[i], arch, paths[i], sizeof paths[i]);
    free(src);
    fi_variant_destroy(owned);
    return n;
}

/* fi warmup for case c with extra arguments; the manifest's CUDA paths into
 * got (at most 8); returns fi_warmup's exit code, or -1. */
static int run_warmup(const wcase *c, const char *extra, char got[8][1024], int *ngot) {
    char dims[16], group[16], manifest[1100];
    snprintf(dims, sizeof dims, "%d", (int)c->d);
    snprintf(group, sizeof group, "%d", (int)(c->hq / c->hkv));
    snprintf(manifest, sizeof manifest, "%s/manifest.txt", getenv("FLASHINFER_CACHE_DIR"));
    char *argv[24] = {"warmup", "--backends", "cuda", "--arch", "sm_90a", "--variants",
                      (char *)c->variant, "--head-dims", dims, "--dtypes",
                      (char *)tu_dtype_name(c->dt), "--groups", group, "--kv",
                      c->format == FI_KV_FORMAT_PAGED ? "paged" : "ragged", "--masks",
                      (char *)mask_name(c->mask), "-j", "2", "--manifest", manifest};
    int argc = 21;
    if (extra) argv[argc++] = (char *)extra;
    int rc = fi_warmup(argc, argv);
    *ngot = 0;
    FILE *f = fopen(manifest, "r");
    if (!f) return -1;
    char line[1400], backend[16], arch[32], name[256], path[1024];
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%15s %31s %255s %1023s", backend, arch, name, path) == 4 &&
            !strcmp(backend, "cuda") && *ngot < 8)
            snprintf(got[(*ngot)++], 1024, "%s", path);
    fclose(f);
    remove(manifest);
    return rc;
}

/* Whether the sets want[0..nw) and got[0..ng) are equal (no duplicates). */
static int same_set(char want[][1024], int nw, char got[][1024], int ng) {
    if (nw != ng) return 0;
    for (int i = 0; i < nw; i++) {
        int found = 0;
        for (int j = 0; j < ng && !found; j++) found = !strcmp(want[i], got[j]);
        if (!found) return 0;
    }
    return 1;
}

static void suite_keys(void) {
    char arch[32];
    int fail = 0;
    fi_cuda_arch_name(9, 0, arch, sizeof arch);
    fail |= strcmp(arch, "sm_90a") != 0;
    fi_cuda_arch_name(8, 0, arch, sizeof arch);
    fail |= strcmp(arch, "sm_80") != 0;
    if (fail) tu_note("arch names: 9.0 -> sm_90a, 8.0 -> sm_80 expected");
    tu_record("keys", "keys/arch-names", fail ? TU_FAIL : TU_PASS);
    for (int i = 0; i < NUM_CASES; i++) {
        const wcase *c = &cases[i];
        char name[128];
        snprintf(name, sizeof name, "keys/%s/d%d/%s/h%d-%d/%s/%s", c->variant, (int)c->d,
                 tu_dtype_name(c->dt), (int)c->hq, (int)c->hkv,
                 c->format == FI_KV_FORMAT_PAGED ? "paged" : "ragged", mask_name(c->mask));
        if (!tu_selected(name)) continue;
        char want[3][1024], got[8][1024];
        int nw = runtime_paths(c, want), ng = 0;
        int rc = run_warmup(c, "--dry-run", got, &ng);
        fail = nw < 2 || rc != 0 || !same_set(want, nw, got, ng);
        if (fail) {
            tu_note("runtime %d files, warmup rc %d with %d files", nw, rc, ng);
            for (int k = 0; k < nw; k++) tu_note("  runtime %s", want[k]);
            for (int k = 0; k < ng; k++) tu_note("  warmup  %s", got[k]);
        }
        tu_record("keys", name, fail ? TU_FAIL : TU_PASS);
    }
}

/* The regular files directly in dir (the cache's top level); -1 on error. */
static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char p[1400];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        n += stat(p, &st) == 0 && S_ISREG(st.st_mode);
    }
    closedir(d);
    return n;
}

static void suite_compile(void) {
    const char *name = "compile/head_scale/d64/f32/h4-4/ragged/none";
    if (!tu_selected(name)) return;
    const char *why;
    if (!fi_nvrtc_load(&why)) {
        printf("skip: %s: %s\n", name, why);
        tu_record("compile", name, TU_SKIP);
        return;
    }
    /* CUDA-core kernels only (f32): attention and the built-in merge */
    wcase c = {"head_scale", 64, 4, 4, FI_DTYPE_F32, FI_KV_FORMAT_RAGGED, FI_MASK_NONE};
    char want[3][1024], got[8][1024];
    int nw = runtime_paths(&c, want), ng = 0, fail = 0;
    int rc = run_warmup(&c, NULL, got, &ng);
    if (rc != 0 || !same_set(want, nw, got, ng)) {
        tu_note("warmup rc %d, %d files listed, %d expected", rc, ng, nw);
        fail = 1;
    }
    struct stat before[3];
    for (int i = 0; i < nw && !fail; i++) {
        FILE *f = fopen(want[i], "rb");
        unsigned char magic[4] = {0};
        if (!f || fread(magic, 1, 4, f) != 4 || memcmp(magic, "\x7f" "ELF", 4)) {
            tu_note("%s: missing or not a cubin", want[i]);
            fail = 1;
        }
        if (f) fclose(f);
        if (stat(want[i], &before[i])) fail = 1;
    }
    int files = count_files(getenv("FLASHINFER_CACHE_DIR"));
    if (!fail && files != nw) {
        tu_note("%d files in the cache, %d expected", files, nw);
        fail = 1;
    }
    if (!fail) { /* again: everything cached, nothing rewritten */
        rc = run_warmup(&c, NULL, got, &ng);
        for (int i = 0; i < nw; i++) {
            struct stat st;
            if (rc || stat(want[i], &st) || st.st_mtime != before[i].st_mtime ||
                st.st_ino != before[i].st_ino) {
                tu_note("second run (rc %d) rewrote %s", rc, want[i]);
                fail = 1;
            }
        }
    }
    tu_record("compile", name, fail ? TU_FAIL : TU_PASS);
}

static void suite_args(void) {
    static const char *const bad[][2] = {
        {"--head-dims", "96"}, {"--dtypes", "f8"}, {"--groups", "0"}, {"--masks", "sliding"},
        {"--kv", "dense"}, {"--variants", "no_such_variant"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "args/%s=%s", bad[i][0] + 2, bad[i][1]);
        if (!tu_selected(name)) continue;
        char *argv[] = {"warmup", "--backends", "cuda", "--arch", "sm_90a", "--dry-run",
                        (char *)bad[i][0], (char *)bad[i][1]};
        int rc = fi_warmup(8, argv);
        if (rc != 2) tu_note("exit code %d, 2 expected", rc);
        tu_record("args", name, rc == 2 ? TU_PASS : TU_FAIL);
    }
}

int main(int argc, char **argv) {
    if (tu_parse_args(argc, argv, "fi warmup's CUDA cache files against the runtime's"))
        return 2;
    unsetenv("FLASHINFER_CUDA_ARCH");
    unsetenv("FLASHINFER_CUDA_DEFINES");
    unsetenv("FLASHINFER_CUDA_TC");
    tu_temp_cache_dir();
    suite_keys();
    suite_compile();
    suite_args();
    return tu_summary("test_warmup");
}
