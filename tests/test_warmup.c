/*
 * test_warmup.c — the public warmup API (fi_warmup_check / _list /
 * _compile) and `fi warmup` (tools/warmup.c, run in-process) on top of it,
 * through include/flashinfer.h alone:
 *  - args: bad devices, params, configs, targets, buffers and indices are
 *    refused with a message naming the value;
 *  - cpu: built-in params list nothing; a variant's plan lists one object in
 *    <cache>/cpu, which fi_warmup_compile writes, after which it is listed
 *    as cached, compiles as cached, and a plan with those params adds no
 *    file to the cache (it found the object: the keys agree);
 *  - cuda keys, no GPU: for plans a user would create (heads, dims, dtypes,
 *    format, mask, variant, page table) the list for sm_90a names distinct
 *    kernels whose files are <cache>/<name>-sm_90a-<32 hex digits>.cubin, a
 *    variant's names carry it, a device page table and another target give
 *    other files, a short buffer gets the count and no more;
 *  - tool: `fi warmup --dry-run --manifest` lists exactly the files of
 *    fi_warmup_list for the same plans; without CUDA its summary names the
 *    CPU alone; bad arguments exit with 2;
 *  - compile (needs NVRTC, not a GPU): fi warmup --arch sm_90a writes those
 *    files as cubins (ELF) and nothing else, a second run rewrites none;
 *  - gpu: after fi_warmup_compile for the device's target, a CUDA plan with
 *    the same params (a variant; the built-in kernels) adds no file.
 * Everything runs in a temporary cache directory (tu_temp_cache_dir).
 */
#include "../tools/tools.h"
#include "util.h"
#include "variant_examples.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { MAX_FILES = 64 };

typedef struct wcase {
    const char *variant; /* a built-in or an example (NULL: none) */
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

/* Example variants, created once (kept for the process). */
static const fi_variant *variant_of(const char *name) {
    static fi_variant *examples[VX_COUNT];
    const fi_variant *v = NULL;
    if (fi_variant_builtin(name, &v) == FI_OK) return v;
    for (int i = 0; i < VX_COUNT; i++) {
        if (strcmp(vx_spec(i)->name, name)) continue;
        if (!examples[i] && fi_variant_create(vx_spec(i), &examples[i])) return NULL;
        return examples[i];
    }
    return NULL;
}

static void params_of(const wcase *c, fi_attention_params *p) {
    fi_attention_params_init(p);
    p->num_qo_heads = c->hq, p->num_kv_heads = c->hkv;
    p->head_dim_qk = p->head_dim_vo = c->d;
    p->q_dtype = p->kv_dtype = p->o_dtype = c->dt;
    p->kv_format = c->format, p->page_size = 16;
    p->mask_mode = c->mask;
    p->variant = c->variant ? variant_of(c->variant) : NULL;
}

static const char *cache_dir(void) { return getenv("FLASHINFER_CACHE_DIR"); }

/* The regular files directly in dir, by name; returns how many (-1: error). */
static int list_files(const char *dir, char names[][256], int max) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char p[1400];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &st) || !S_ISREG(st.st_mode)) continue;
        if (n < max) snprintf(names[n], 256, "%s", e->d_name);
        n++;
    }
    closedir(d);
    return n;
}

/* Files of `dir` now that are not in before[0..nb): into added; how many. */
static int new_files(const char *dir, char before[][256], int nb, char added[][256]) {
    char now[MAX_FILES][256];
    int n = list_files(dir, now, MAX_FILES), na = 0;
    for (int i = 0; i < n && i < MAX_FILES; i++) {
        int old = 0;
        for (int j = 0; j < nb && !old; j++) old = !strcmp(now[i], before[j]);
        if (!old) snprintf(added[na++], 256, "%.255s", now[i]);
    }
    return na;
}

/* ------------------------------------------------------------------ args */

static void suite_args(void) {
    if (!tu_begin_case("args/api")) return;
    fi_attention_params p, bad;
    fi_attention_params_init(&p);
    p.num_qo_heads = 8, p.num_kv_heads = 2;
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    fi_warmup_kernel k[2];
    int32_t n = -1, cached;
    int fail = 0;
    const fi_device_type cuda = FI_DEVICE_CUDA, cpu = FI_DEVICE_CPU;
    fail |= tu_expect_status(fi_warmup_check((fi_device_type)7), FI_STATUS_INVALID_ARGUMENT,
                             "device=7", "check: device 7");
    fail |= tu_expect_status(fi_warmup_list((fi_device_type)7, &p, NULL, "sm_90a", k, 2, &n),
                             FI_STATUS_INVALID_ARGUMENT, "device=7", "list: device 7");
    fail |= tu_expect_status(fi_warmup_list(cuda, &p, NULL, "sm_90a", k, 2, NULL),
                             FI_STATUS_INVALID_ARGUMENT, "count", "list: count NULL");
    fail |= tu_expect_status(fi_warmup_list(cuda, &p, NULL, "sm_90a", NULL, 2, &n),
                             FI_STATUS_INVALID_ARGUMENT, "kernels", "list: kernels NULL");
    fail |= tu_expect_status(fi_warmup_list(cuda, &p, NULL, "sm_90a", k, -1, &n),
                             FI_STATUS_INVALID_ARGUMENT, "capacity", "list: capacity -1");
    fail |= tu_expect_status(fi_warmup_list(cpu, NULL, NULL, NULL, k, 2, &n),
                             FI_STATUS_INVALID_ARGUMENT, "params", "list: params NULL");
    bad = p, bad.struct_size = 0;
    fail |= tu_expect_status(fi_warmup_list(cpu, &bad, NULL, NULL, k, 2, &n),
                             FI_STATUS_INVALID_ARGUMENT, "struct_size", "list: params size");
    bad = p, bad.head_dim_qk = 100;
    fail |= tu_expect_status(fi_warmup_list(cuda, &bad, NULL, "sm_90a", k, 2, &n),
                             FI_STATUS_UNSUPPORTED, "head_dim_qk=100", "list: head dim 100");
    fi_plan_config c = cfg;
    c.struct_size = 4;
    fail |= tu_expect_status(fi_warmup_list(cuda, &p, &c, "sm_90a", k, 2, &n),
                             FI_STATUS_INVALID_ARGUMENT, "struct_size", "list: config size");
    bad = p, bad.kv_format = FI_KV_FORMAT_RAGGED;
    c = cfg, c.device_page_table = 1;
    fail |= tu_expect_status(fi_warmup_list(cuda, &bad, &c, "sm_90a", k, 2, &n),
                             FI_STATUS_INVALID_ARGUMENT, "device_page_table",
                             "list: ragged with a device page table");
    fail |= tu_expect_status(fi_warmup_list(cuda, &p, NULL, "sm_90a/../x", k, 2, &n),
                             FI_STATUS_INVALID_ARGUMENT, "arch", "list: arch with '/'");
    fail |= tu_expect_status(fi_warmup_list(cuda, &p, NULL, "sm_90aaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                                            k, 2, &n),
                             FI_STATUS_INVALID_ARGUMENT, "arch", "list: arch too long");
    if (n != 0) tu_note("count %d after a refused list, 0 expected", (int)n), fail = 1;
    int32_t count = 0;
    fi_status st = fi_warmup_list(cuda, &p, NULL, "sm_90a", NULL, 0, &count);
    fail |= tu_expect_status(st, FI_OK, NULL, "list: count only");
    fail |= tu_expect_status(fi_warmup_compile(cuda, &p, NULL, "sm_90a", -1, &cached),
                             FI_STATUS_INVALID_ARGUMENT, "index=-1", "compile: index -1");
    fail |= tu_expect_status(fi_warmup_compile(cuda, &p, NULL, "sm_90a", count, &cached),
                             FI_STATUS_INVALID_ARGUMENT, "index=", "compile: index = count");
    fail |= tu_expect_status(fi_warmup_compile(cpu, &p, NULL, NULL, 0, NULL),
                             FI_STATUS_INVALID_ARGUMENT, "0 kernels",
                             "compile: a CPU plan without a variant");
    if (!fi_device_available(cuda))
        fail |= tu_expect_status(fi_warmup_list(cuda, &p, NULL, NULL, k, 2, &n),
                                 FI_STATUS_NO_DEVICE, "arch", "list: no GPU, no arch");
    tu_record("args", "args/api", fail ? TU_FAIL : TU_PASS);
}

/* ------------------------------------------------------------------- cpu */

static void suite_cpu(void) {
    const char *name = "cpu/none-is-empty";
    if (tu_begin_case(name)) {
        fi_attention_params p;
        fi_attention_params_init(&p);
        p.num_qo_heads = 8, p.num_kv_heads = 2;
        p.logits_soft_cap = 30.0f, p.mask_mode = FI_MASK_CAUSAL;
        int32_t n = -1;
        fi_status st = fi_warmup_list(FI_DEVICE_CPU, &p, NULL, NULL, NULL, 0, &n);
        int fail = tu_expect_status(st, FI_OK, NULL, "list");
        if (n != 0) tu_note("built-in params list %d CPU kernels, 0 expected", (int)n), fail = 1;
        tu_record("cpu", name, fail ? TU_FAIL : TU_PASS);
    }
    name = "cpu/head_scale/d64/f32";
    if (!tu_begin_case(name)) return;
    if (fi_warmup_check(FI_DEVICE_CPU)) {
        tu_note("%s", fi_last_error());
        tu_record("cpu", name, TU_SKIP);
        return;
    }
    wcase c = {"head_scale", 64, 4, 2, FI_DTYPE_F32, FI_KV_FORMAT_PAGED, FI_MASK_NONE};
    fi_attention_params p;
    params_of(&c, &p);
    fi_warmup_kernel k[2];
    memset(&k[1], 0x5a, sizeof k[1]);
    int32_t n = 0, cached = -1;
    int fail = tu_expect_status(fi_warmup_list(FI_DEVICE_CPU, &p, NULL, NULL, k, 1, &n), FI_OK,
                                NULL, "list");
    char dir[1100], want_prefix[1200];
    snprintf(dir, sizeof dir, "%s/cpu", cache_dir());
    snprintf(want_prefix, sizeof want_prefix, "%s/head_scale_d64x64_f32_f32_f32-", dir);
    if (!fail && (n != 1 || strcmp(k[0].arch, "native") || strncmp(k[0].name, "head_scale", 10) ||
                  strncmp(k[0].cache_path, want_prefix, strlen(want_prefix)) ||
                  !strstr(k[0].cache_path, ".so") || k[1].name[0] != 0x5a)) {
        tu_note("list: %d kernels, %s (%s) at %s", (int)n, k[0].name, k[0].arch, k[0].cache_path);
        fail = 1;
    }
    if (!fail)
        fail |= tu_expect_status(fi_warmup_compile(FI_DEVICE_CPU, &p, NULL, NULL, 0, &cached),
                                 FI_OK, NULL, "compile");
    if (!fail && access(k[0].cache_path, R_OK)) tu_note("%s not written", k[0].cache_path), fail = 1;
    fi_warmup_kernel again;
    if (!fail && (fi_warmup_list(FI_DEVICE_CPU, &p, NULL, NULL, &again, 1, &n) || !again.cached ||
                  strcmp(again.cache_path, k[0].cache_path))) {
        tu_note("after compile: listed %s, cached %d", again.cache_path, (int)again.cached);
        fail = 1;
    }
    if (!fail && (fi_warmup_compile(FI_DEVICE_CPU, &p, NULL, NULL, 0, &cached) || !cached)) {
        tu_note("second compile: was_cached %d (%s)", (int)cached, fi_last_error());
        fail = 1;
    }
    /* the plan finds the object: no new file */
    char before[MAX_FILES][256], added[MAX_FILES][256];
    int nb = list_files(dir, before, MAX_FILES);
    fi_context *ctx = NULL;
    fi_plan *plan = NULL;
    fi_context_options opt;
    fi_context_options_init(&opt);
    opt.num_threads = 1;
    if (!fail && (fi_context_create(&opt, &ctx) || fi_plan_create(ctx, &p, NULL, &plan))) {
        tu_note("plan: %s", fi_last_error());
        fail = 1;
    }
    int na = fail ? 0 : new_files(dir, before, nb, added);
    for (int i = 0; i < na; i++) tu_note("the plan wrote %s/%s", dir, added[i]);
    fail |= na != 0;
    fi_plan_destroy(plan);
    fi_context_destroy(ctx);
    tu_record("cpu", name, fail ? TU_FAIL : TU_PASS);
}

/* ------------------------------------------------------------- cuda keys */

/* The kernels of case c's plan for arch; returns how many (-1: refused). */
static int cuda_list(const wcase *c, int device_table, const char *arch,
                     fi_warmup_kernel k[FI_WARMUP_MAX_KERNELS]) {
    fi_attention_params p;
    params_of(c, &p);
    fi_plan_config cfg;
    fi_plan_config_init(&cfg);
    cfg.device_page_table = device_table;
    int32_t n = 0;
    if (fi_warmup_list(FI_DEVICE_CUDA, &p, &cfg, arch, k, FI_WARMUP_MAX_KERNELS, &n)) {
        tu_note("fi_warmup_list: %s", fi_last_error());
        return -1;
    }
    return n;
}

/* Whether kernel k's file is <cache>/<name>-<arch>-<32 hex digits>.cubin
 * (128 bits of the SHA-256 key). */
static int well_named(const fi_warmup_kernel *k, const char *arch) {
    char want[1400];
    snprintf(want, sizeof want, "%.1000s/%.127s-%.31s-", cache_dir(), k->name, arch);
    size_t n = strlen(want), len = strlen(k->cache_path);
    if (strncmp(k->cache_path, want, n) || len != n + 32 + 6 ||
        strcmp(k->cache_path + n + 32, ".cubin") || strcmp(k->arch, arch))
        return 0;
    for (size_t i = n; i < n + 32; i++)
        if (!strchr("0123456789abcdef", k->cache_path[i])) return 0;
    return 1;
}

static int disjoint(const fi_warmup_kernel *a, int na, const fi_warmup_kernel *b, int nb) {
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nb; j++)
            if (!strcmp(a[i].cache_path, b[j].cache_path)) return 0;
    return 1;
}

static void check_case_keys(const wcase *c, const char *name) {
    fi_warmup_kernel k[FI_WARMUP_MAX_KERNELS], other[FI_WARMUP_MAX_KERNELS];
    int n = cuda_list(c, 0, "sm_90a", k), fail = n < 1;
    char tag[80];
    snprintf(tag, sizeof tag, "_v%s_", c->variant);
    int tagged = 0; /* the attention kernels carry the variant, a built-in merge not */
    for (int i = 0; i < n; i++) {
        tagged += strstr(k[i].name, tag) != NULL;
        if (!well_named(&k[i], "sm_90a") || k[i].cached) {
            tu_note("kernel %d: %s (%s) at %s, cached %d", i, k[i].name, k[i].arch,
                    k[i].cache_path, (int)k[i].cached);
            fail = 1;
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(k[i].name, k[j].name)) tu_note("%s listed twice", k[i].name), fail = 1;
    }
    if (!tagged) tu_note("no kernel name carries %s", tag), fail = 1;
    int m = cuda_list(c, 0, "sm_80", other);
    if (m < 1 || !disjoint(k, n, other, m)) tu_note("sm_80 shares files with sm_90a"), fail = 1;
    if (c->format == FI_KV_FORMAT_PAGED) {
        m = cuda_list(c, 1, "sm_90a", other);
        /* the merge does not read K/V: a device page table changes the rest */
        int same = 0;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < m; j++) same += !strcmp(k[i].cache_path, other[j].cache_path);
        if (m < 1 || same >= n) tu_note("a device page table changes no kernel"), fail = 1;
    }
    /* a buffer of one: the count, one entry, the next one untouched */
    fi_attention_params p;
    params_of(c, &p);
    fi_warmup_kernel one[2];
    memset(&one[1], 0x5a, sizeof one[1]);
    int32_t count = 0;
    if (fi_warmup_list(FI_DEVICE_CUDA, &p, NULL, "sm_90a", one, 1, &count) || count != n ||
        strcmp(one[0].cache_path, k[0].cache_path) || one[1].name[0] != 0x5a) {
        tu_note("capacity 1: count %d of %d", (int)count, n);
        fail = 1;
    }
    tu_record("keys", name, fail ? TU_FAIL : TU_PASS);
}

static void suite_keys(void) {
    for (int i = 0; i < NUM_CASES; i++) {
        const wcase *c = &cases[i];
        char name[128];
        snprintf(name, sizeof name, "keys/%s/d%d/%s/h%d-%d/%s/%s", c->variant, (int)c->d,
                 tu_dtype_name(c->dt), (int)c->hq, (int)c->hkv,
                 c->format == FI_KV_FORMAT_PAGED ? "paged" : "ragged", mask_name(c->mask));
        if (tu_begin_case(name)) check_case_keys(c, name);
    }
}

/* ------------------------------------------------------------------- tool */

/* fi warmup for the built-in case c, --backends `backends`, extra arguments;
 * the manifest's paths of `device` ("cpu", "cuda") into got. Returns
 * fi_warmup's exit code, or -1. */
static int run_warmup(const wcase *c, const char *backends, const char *device,
                      const char *extra, char got[][1024], int *ngot) {
    char dims[16], group[16], manifest[1100];
    snprintf(dims, sizeof dims, "%d", (int)c->d);
    snprintf(group, sizeof group, "%d", (int)(c->hq / c->hkv));
    snprintf(manifest, sizeof manifest, "%s/manifest.txt", cache_dir());
    char *argv[24] = {"warmup", "--backends", (char *)backends, "--arch", "sm_90a",
                      "--variants", (char *)c->variant, "--head-dims", dims, "--dtypes",
                      (char *)tu_dtype_name(c->dt), "--groups", group, "--kv",
                      c->format == FI_KV_FORMAT_PAGED ? "paged" : "ragged", "--masks",
                      (char *)mask_name(c->mask), "-j", "2", "--manifest", manifest};
    int argc = 21;
    if (extra) argv[argc++] = (char *)extra;
    int rc = fi_warmup(argc, argv);
    *ngot = 0;
    FILE *f = fopen(manifest, "r");
    if (!f) return -1;
    /* "cpu <variant> d<dim> <dtype> <path>", "cuda <arch> <name> <path>" */
    char line[1400], w[5][1024];
    int want_words = strcmp(device, "cpu") ? 4 : 5;
    while (fgets(line, sizeof line, f)) {
        int n = sscanf(line, "%1023s %1023s %1023s %1023s %1023s", w[0], w[1], w[2], w[3], w[4]);
        if (n == want_words && !strcmp(w[0], device) && *ngot < MAX_FILES)
            snprintf(got[(*ngot)++], 1024, "%s", w[n - 1]);
    }
    fclose(f);
    remove(manifest);
    return rc;
}

/* Whether the sets want[0..nw) and got[0..ng) are equal (no duplicates). */
static int same_set(const fi_warmup_kernel *want, int nw, char got[][1024], int ng) {
    if (nw != ng) return 0;
    for (int i = 0; i < nw; i++) {
        int found = 0;
        for (int j = 0; j < ng && !found; j++) found = !strcmp(want[i].cache_path, got[j]);
        if (!found) return 0;
    }
    return 1;
}

/* stderr of fi warmup with argv, into buf. Returns its exit code. */
static int warmup_stderr(int argc, char **argv, char *buf, size_t n) {
    char path[1100];
    snprintf(path, sizeof path, "%s/stderr.txt", cache_dir());
    fflush(stderr);
    int saved = dup(2);
    FILE *f = fopen(path, "w+");
    if (saved < 0 || !f) return -1;
    dup2(fileno(f), 2);
    int rc = fi_warmup(argc, argv);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(f);
    size_t got = fread(buf, 1, n - 1, f);
    buf[got] = 0;
    fclose(f);
    remove(path);
    return rc;
}

static void suite_tool(void) {
    /* built-in variants (the tool's): the manifest is fi_warmup_list's */
    static const wcase tool_cases[] = {
        {"soft_cap", 128, 32, 8, FI_DTYPE_BF16, FI_KV_FORMAT_PAGED, FI_MASK_CAUSAL},
        {"rope_llama", 64, 8, 8, FI_DTYPE_F16, FI_KV_FORMAT_RAGGED, FI_MASK_NONE},
    };
    for (size_t i = 0; i < sizeof tool_cases / sizeof tool_cases[0]; i++) {
        const wcase *c = &tool_cases[i];
        char name[96];
        snprintf(name, sizeof name, "tool/manifest/%s", c->variant);
        if (!tu_begin_case(name)) continue;
        fi_warmup_kernel want[FI_WARMUP_MAX_KERNELS];
        char got[MAX_FILES][1024];
        int ng = 0, nw = cuda_list(c, 0, "sm_90a", want);
        int rc = run_warmup(c, "cuda", "cuda", "--dry-run", got, &ng);
        int fail = nw < 1 || rc != 0 || !same_set(want, nw, got, ng);
        if (fail) {
            tu_note("the list has %d files, warmup rc %d with %d files", nw, rc, ng);
            for (int k = 0; k < nw; k++) tu_note("  list    %s", want[k].cache_path);
            for (int k = 0; k < ng; k++) tu_note("  warmup  %s", got[k]);
        }
        if (!fail && fi_warmup_check(FI_DEVICE_CPU) == FI_OK) {
            fi_attention_params p;
            params_of(c, &p);
            int32_t n = 0;
            fail = fi_warmup_list(FI_DEVICE_CPU, &p, NULL, NULL, want, 1, &n) != FI_OK ||
                   run_warmup(c, "cpu", "cpu", "--dry-run", got, &ng) != 0 ||
                   !same_set(want, n, got, ng);
            if (fail) tu_note("CPU: listed %s, the manifest has %d files", want[0].cache_path, ng);
        }
        tu_record("tool", name, fail ? TU_FAIL : TU_PASS);
    }
    const char *name = "tool/cpu-only-summary";
    if (tu_begin_case(name)) {
        char *argv[] = {"warmup", "--backends", "cpu", "--variants", "soft_cap", "--head-dims",
                        "64", "--dtypes", "f32", "--dry-run"};
        char err[4096];
        int rc = warmup_stderr(10, argv, err, sizeof err);
        int ok_rc = fi_warmup_check(FI_DEVICE_CPU) == FI_OK ? 0 : 1;
        int fail = rc != ok_rc || strstr(err, "CUDA") != NULL ||
                   (rc == 0 && !strstr(err, "1 CPU kernel into "));
        if (fail) tu_note("rc %d (%d expected), stderr: %s", rc, ok_rc, err);
        tu_record("tool", name, fail ? TU_FAIL : TU_PASS);
    }
    static const char *const bad[][2] = {
        {"--head-dims", "100"}, {"--head-dims", "x"},      {"--dtypes", "f8"},
        {"--groups", "0"},      {"--masks", "sliding"},    {"--kv", "dense"},
        {"--variants", "sink"}, {"--variants", "no_such"}, {"--backends", "gpu"},
        {"--page-tables", "both"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char case_name[64];
        snprintf(case_name, sizeof case_name, "tool/args/%s=%s", bad[i][0] + 2, bad[i][1]);
        if (!tu_begin_case(case_name)) continue;
        char *argv[] = {"warmup", "--backends", "cuda", "--arch", "sm_90a", "--dry-run",
                        (char *)bad[i][0], (char *)bad[i][1]};
        int rc = fi_warmup(8, argv);
        if (rc != 2) tu_note("exit code %d, 2 expected", rc);
        tu_record("tool", case_name, rc == 2 ? TU_PASS : TU_FAIL);
    }
}

/* ---------------------------------------------------------------- compile */

static void suite_compile(void) {
    const char *name = "compile/soft_cap/d64/f32/h4-4/ragged/none";
    if (!tu_begin_case(name)) return;
    if (fi_warmup_check(FI_DEVICE_CUDA)) {
        tu_note("%s", fi_last_error());
        tu_record("compile", name, TU_SKIP);
        return;
    }
    /* CUDA-core kernels only (f32): attention and the built-in merge */
    wcase c = {"soft_cap", 64, 4, 4, FI_DTYPE_F32, FI_KV_FORMAT_RAGGED, FI_MASK_NONE};
    fi_warmup_kernel want[FI_WARMUP_MAX_KERNELS];
    char got[MAX_FILES][1024], before[MAX_FILES][256], added[MAX_FILES][256];
    int nb = list_files(cache_dir(), before, MAX_FILES);
    int ng = 0, nw = cuda_list(&c, 0, "sm_90a", want), fail = 0;
    int rc = run_warmup(&c, "cuda", "cuda", NULL, got, &ng);
    if (rc != 0 || !same_set(want, nw, got, ng)) {
        tu_note("warmup rc %d, %d files listed, %d expected", rc, ng, nw);
        fail = 1;
    }
    struct stat st0[FI_WARMUP_MAX_KERNELS];
    for (int i = 0; i < nw && !fail; i++) {
        FILE *f = fopen(want[i].cache_path, "rb");
        unsigned char magic[4] = {0};
        if (!f || fread(magic, 1, 4, f) != 4 || memcmp(magic, "\x7f" "ELF", 4)) {
            tu_note("%s: missing or not a cubin", want[i].cache_path);
            fail = 1;
        }
        if (f) fclose(f);
        if (stat(want[i].cache_path, &st0[i])) fail = 1;
    }
    int na = fail ? 0 : new_files(cache_dir(), before, nb, added);
    for (int i = 0; i < na; i++) {
        char path[1400];
        snprintf(path, sizeof path, "%.1000s/%.255s", cache_dir(), added[i]);
        int listed = 0;
        for (int k = 0; k < nw && !listed; k++) {
            /* a listed file, or its record (<file>.sha256: core/cache.h) */
            size_t len = strlen(want[k].cache_path);
            listed = !strncmp(path, want[k].cache_path, len) &&
                     (path[len] == 0 || !strcmp(path + len, ".sha256"));
        }
        if (!listed) tu_note("%s written, not listed", path), fail = 1;
    }
    if (!fail) { /* again: everything cached, nothing rewritten */
        rc = run_warmup(&c, "cuda", "cuda", NULL, got, &ng);
        for (int i = 0; i < nw; i++) {
            struct stat st;
            if (rc || stat(want[i].cache_path, &st) || st.st_mtime != st0[i].st_mtime ||
                st.st_ino != st0[i].st_ino) {
                tu_note("second run (rc %d) rewrote %s", rc, want[i].cache_path);
                fail = 1;
            }
        }
    }
    tu_record("compile", name, fail ? TU_FAIL : TU_PASS);
}

/* With a GPU: the kernels of case c's plan compiled for the device's own
 * target, then a plan with the same params compiles nothing (no new file in
 * the cache). variant NULL: the built-in kernels. */
static void check_plan_after_warmup(const wcase *c, const char *name) {
    fi_attention_params p;
    params_of(c, &p);
    int32_t n = 0, cached;
    int fail = tu_expect_status(fi_warmup_list(FI_DEVICE_CUDA, &p, NULL, NULL, NULL, 0, &n),
                                FI_OK, NULL, "list for device 0");
    for (int32_t i = 0; i < n && !fail; i++)
        fail |= tu_expect_status(fi_warmup_compile(FI_DEVICE_CUDA, &p, NULL, NULL, i, &cached),
                                 FI_OK, NULL, "compile");
    char before[MAX_FILES][256], added[MAX_FILES][256];
    int nb = list_files(cache_dir(), before, MAX_FILES);
    fi_context_options opt;
    fi_context_options_init(&opt);
    opt.device = FI_DEVICE_CUDA;
    fi_context *ctx = NULL;
    fi_plan *plan = NULL;
    if (!fail && (fi_context_create(&opt, &ctx) || fi_plan_create(ctx, &p, NULL, &plan))) {
        tu_note("plan: %s", fi_last_error());
        fail = 1;
    }
    int na = fail ? 0 : new_files(cache_dir(), before, nb, added);
    for (int i = 0; i < na; i++) tu_note("the plan wrote %s", added[i]);
    fail |= na != 0 || n < 1;
    fi_plan_destroy(plan);
    fi_context_destroy(ctx);
    tu_record("gpu", name, fail ? TU_FAIL : TU_PASS);
}

static void suite_gpu(void) {
    static const wcase gpu_cases[] = {
        {"head_scale", 128, 32, 8, FI_DTYPE_BF16, FI_KV_FORMAT_PAGED, FI_MASK_CAUSAL},
        {NULL, 128, 32, 8, FI_DTYPE_BF16, FI_KV_FORMAT_PAGED, FI_MASK_CAUSAL},
    };
    for (size_t i = 0; i < sizeof gpu_cases / sizeof gpu_cases[0]; i++) {
        char name[96];
        snprintf(name, sizeof name, "gpu/plan-after-warmup/%s",
                 gpu_cases[i].variant ? gpu_cases[i].variant : "built-in");
        if (!tu_begin_case(name)) continue;
        if (!fi_device_available(FI_DEVICE_CUDA) || fi_warmup_check(FI_DEVICE_CUDA)) {
            tu_note("no GPU or no NVRTC");
            tu_record("gpu", name, TU_SKIP);
            continue;
        }
        check_plan_after_warmup(&gpu_cases[i], name);
    }
}

int main(int argc, char **argv) {
    if (tu_parse_args(argc, argv, "the warmup API and fi warmup against the plans' kernels"))
        return 2;
    unsetenv("FLASHINFER_CUDA_ARCH");
    unsetenv("FLASHINFER_CUDA_KERNELS");
    tu_temp_cache_dir();
    suite_args();
    suite_cpu();
    suite_keys();
    suite_tool();
    suite_compile();
    suite_gpu();
    return tu_summary("test_warmup");
}
