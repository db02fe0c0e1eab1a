/*
 * warmup.c — `fi warmup`: compile ahead of time, into the on-disk cache,
 * the kernels plans would compile at creation (docs/VARIANTS.md), with one
 * progress bar and a summary table. It is the public warmup API over lists:
 * every combination is a plan's params and config, fi_warmup_list names its
 * kernels (duplicates across plans dropped: a merge serves several), and
 * -j worker threads call fi_warmup_compile on them.
 *  - By default, what the built-in paths use: the CUDA kernels of plans
 *    without a variant, for the visible GPU (or --arch, no GPU needed), over
 *    the head dims, dtypes, group sizes, KV formats, masks and page tables
 *    asked for. The CPU's built-in kernels are part of the library: it has
 *    nothing to compile unless variants are named.
 *  - --variants names built-in variant specs (the JIT's path, as a
 *    user-defined variant takes): on the CPU the shared object of each
 *    (variant, dim, dtype), layout, format and masks being run-time values
 *    there; on CUDA the cubins, as above.
 *   fi warmup [--variants builtin,a,b,...|all] [--head-dims 64,128,256]
 *             [--dtypes f16,bf16,f32] [--backends cpu,cuda] [--arch sm_90a]
 *             [--groups 4] [--kv paged,ragged] [--masks none,causal,custom]
 *             [--page-tables host,device] [-j N] [--dry-run] [--manifest FILE]
 *             [--list]
 * Q, KV and O share each dtype.
 */
#include "tools.h"

#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* "builtin": plans without a variant (the built-in kernels); the rest are
 * the built-in variant specs, by fi_variant_builtin's names. */
static const char *const variant_names[] = {"builtin",        "none",        "soft_cap",
                                            "alibi",          "sliding_window", "custom_mask",
                                            "rope_llama"};
#define BUILTIN_PATH "builtin"
static const char *const dtype_names[] = {"f32", "f16", "bf16"};
static const fi_dtype dtype_values[] = {FI_DTYPE_F32, FI_DTYPE_F16, FI_DTYPE_BF16};
static const char *const kv_names[] = {"paged", "ragged"};
static const char *const mask_names[] = {"none", "causal", "custom"};
static const char *const table_names[] = {"host", "device"};
static const char *const backend_names[] = {"cpu", "cuda"};

#define COUNT(a) ((int)(sizeof a / sizeof a[0]))
enum { MAX_ITEMS = 16, ITEM_CHARS = 32 };

/* A comma-separated list, split: its items and how many. */
typedef struct list {
    char item[MAX_ITEMS][ITEM_CHARS];
    int n;
} list;

/* The command line. */
typedef struct options {
    list variants, dims, dtypes, backends, groups, kvs, masks, tables;
    char arch[32];
    const char *manifest;
    int threads, dry_run, show_list;
} options;

/* One kernel to compile: kernel `index` of the plan (device, params, config). */
typedef struct job {
    fi_device_type device;
    fi_attention_params params;
    fi_plan_config config;
    int32_t index;
    fi_warmup_kernel kernel;
    const char *variant; /* for the CPU's manifest lines */
    int32_t cached;
    fi_status status;
    double seconds;
    char error[256];
} job;

typedef struct warmup {
    job *jobs;
    int num_jobs, cap;
    const char *arch; /* NULL: the GPU's */
    atomic_int next_job, done_jobs;
    pthread_mutex_t print_lock;
} warmup;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int usage(FILE *f) {
    fprintf(f,
            "usage: fi warmup [--variants builtin,a,b,...|all] [--head-dims 64,128,256]\n"
            "                 [--dtypes f16,bf16,f32] [--backends cpu,cuda] [--arch sm_90a]\n"
            "                 [--groups 4] [--kv paged,ragged] [--masks none,causal,custom]\n"
            "                 [--page-tables host,device] [-j N] [--dry-run]\n"
            "                 [--manifest FILE] [--list]\n");
    if (f != stdout) {
        fprintf(f, "(fi warmup --help)\n");
        return FI_EXIT_USAGE;
    }
    fprintf(f,
            "Compile into the kernel cache, ahead of a serving process, the kernels its plans\n"
            "would compile at creation (docs/VARIANTS.md), so no plan waits for a compiler.\n"
            "By default: what the built-in paths use, the CUDA kernels of plans without a\n"
            "variant for this machine's GPU, or for --arch (e.g. sm_90a; no GPU needed).\n"
            "The CPU's built-in kernels are part of the library: the CPU compiles only\n"
            "variants, named with --variants (the built-in specs; `all` is every one and\n"
            "the built-in path; --list shows them), into shared objects.\n"
            "  --head-dims, --dtypes   the plans' head dims and dtypes (Q, KV and O alike)\n"
            "  --groups, --kv, --masks, --page-tables\n"
            "                          the CUDA kernels' compile-time facts: query heads per\n"
            "                          KV head, KV format, mask mode, a host or a device page\n"
            "                          table; defaults 4, paged, none,causal, host\n"
            "  --backends cpu,cuda     only these (default: CUDA where a GPU or --arch is,\n"
            "                          the CPU where --variants names a variant)\n"
            "  -j N                    compile N at once (default: one per core)\n"
            "  --dry-run               list, compile nothing; --manifest FILE writes the list\n"
            "One progress line, then a table per backend: kernels compiled, already cached,\n"
            "failed, and the cache directory (`fi info` shows its size).\n");
    return 0;
}

static int split(const char *text, list *out) {
    char copy[1024], *save;
    snprintf(copy, sizeof copy, "%s", text);
    out->n = 0;
    for (char *s = strtok_r(copy, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
        if (out->n == MAX_ITEMS || strlen(s) >= ITEM_CHARS) return -1;
        snprintf(out->item[out->n++], ITEM_CHARS, "%s", s);
    }
    return out->n ? 0 : -1;
}

/* The index of `s` among names[0..n), or -1. */
static int find(const char *s, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

static int has(const list *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->item[i], name)) return 1;
    return 0;
}

/* Every item of l is one of names[0..n); else -1 after a message. */
static int check_names(const list *l, const char *const *names, int n, const char *what) {
    for (int i = 0; i < l->n; i++) {
        if (find(l->item[i], names, n) >= 0) continue;
        fprintf(stderr, "fi warmup: %s %s: expected", what, l->item[i]);
        for (int k = 0; k < n; k++) fprintf(stderr, "%s %s", k ? "," : "", names[k]);
        fprintf(stderr, "\n");
        return -1;
    }
    return 0;
}

static int check_numbers(const list *l, const char *what) {
    for (int i = 0; i < l->n; i++) {
        char *end;
        long v = strtol(l->item[i], &end, 10);
        if (*end || v < 1 || v > 65536) {
            fprintf(stderr, "fi warmup: %s %s: expected a positive number\n", what, l->item[i]);
            return -1;
        }
    }
    return 0;
}

/* Parse argv into o; returns 0, -1 after --help, or the exit code (2)
 * after a message. */
static int parse(int argc, char **argv, options *o) {
    const char *variants = BUILTIN_PATH, *dims = "64,128,256", *dtypes = "f16,bf16,f32";
    const char *backends = "", *groups = "4", *kvs = "paged", *masks = "none,causal";
    const char *tables = "host", *arch = "", *jobs = NULL;
    memset(o, 0, sizeof *o);
    enum { O_VARIANTS = 256, O_DIMS, O_DTYPES, O_BACKENDS, O_ARCH, O_GROUPS, O_KV, O_MASKS,
           O_TABLES, O_MANIFEST, O_DRY_RUN, O_LIST };
    static const struct option flags[] = {
        {"variants", required_argument, NULL, O_VARIANTS},
        {"head-dims", required_argument, NULL, O_DIMS},
        {"dtypes", required_argument, NULL, O_DTYPES},
        {"backends", required_argument, NULL, O_BACKENDS},
        {"arch", required_argument, NULL, O_ARCH},
        {"groups", required_argument, NULL, O_GROUPS},
        {"kv", required_argument, NULL, O_KV},
        {"masks", required_argument, NULL, O_MASKS},
        {"page-tables", required_argument, NULL, O_TABLES},
        {"manifest", required_argument, NULL, O_MANIFEST},
        {"jobs", required_argument, NULL, 'j'},
        {"dry-run", no_argument, NULL, O_DRY_RUN},
        {"list", no_argument, NULL, O_LIST},
        {"help", no_argument, NULL, 'h'},
        {0, 0, 0, 0}};
    optind = 0; /* from the start: the tests call fi_warmup more than once */
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, ":j:h", flags, NULL)) != -1;) {
        switch (c) {
        case O_VARIANTS: variants = optarg; break;
        case O_DIMS: dims = optarg; break;
        case O_DTYPES: dtypes = optarg; break;
        case O_BACKENDS: backends = optarg; break;
        case O_ARCH: arch = optarg; break;
        case O_GROUPS: groups = optarg; break;
        case O_KV: kvs = optarg; break;
        case O_MASKS: masks = optarg; break;
        case O_TABLES: tables = optarg; break;
        case O_MANIFEST: o->manifest = optarg; break;
        case 'j': jobs = optarg; break;
        case O_DRY_RUN: o->dry_run = 1; break;
        case O_LIST: o->show_list = 1; break;
        case 'h': usage(stdout); return -1;
        case ':':
            fprintf(stderr, "fi warmup: %s needs a value\n", argv[optind - 1]);
            return usage(stderr);
        default:
            fprintf(stderr, "fi warmup: unknown option %s\n", argv[optind - 1]);
            return usage(stderr);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "fi warmup: unexpected argument %s\n", argv[optind]);
        return usage(stderr);
    }
    if (strlen(arch) >= sizeof o->arch) {
        fprintf(stderr, "fi warmup: --arch %s: too long (e.g. sm_90a)\n", arch);
        return FI_EXIT_USAGE;
    }
    snprintf(o->arch, sizeof o->arch, "%s", arch);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o->threads = ncpu > 0 ? (int)(ncpu < 64 ? ncpu : 64) : 1;
    if (jobs && fi_tool_number("warmup", "-j", jobs, 1, 64, &o->threads)) return FI_EXIT_USAGE;
    if (!strcmp(variants, "all")) {
        o->variants.n = COUNT(variant_names);
        for (int i = 0; i < o->variants.n; i++)
            snprintf(o->variants.item[i], ITEM_CHARS, "%s", variant_names[i]);
    } else if (split(variants, &o->variants)) {
        fprintf(stderr, "fi warmup: --variants %s: a comma-separated list\n", variants);
        return FI_EXIT_USAGE;
    }
    const struct {
        const char *flag, *text;
        list *out;
    } lists[] = {{"--backends", backends, &o->backends}, {"--head-dims", dims, &o->dims},
                 {"--dtypes", dtypes, &o->dtypes},       {"--groups", groups, &o->groups},
                 {"--kv", kvs, &o->kvs},                 {"--masks", masks, &o->masks},
                 {"--page-tables", tables, &o->tables}};
    for (int i = 0; i < COUNT(lists); i++) {
        if (lists[i].out == &o->backends && !backends[0]) continue; /* the default */
        if (split(lists[i].text, lists[i].out)) {
            fprintf(stderr, "fi warmup: %s %s: a comma-separated list (at most %d)\n",
                    lists[i].flag, lists[i].text, MAX_ITEMS);
            return FI_EXIT_USAGE;
        }
    }
    if (check_names(&o->variants, variant_names, COUNT(variant_names), "variant") ||
        check_names(&o->dtypes, dtype_names, COUNT(dtype_names), "dtype") ||
        check_names(&o->backends, backend_names, COUNT(backend_names), "backend") ||
        check_names(&o->kvs, kv_names, COUNT(kv_names), "kv") ||
        check_names(&o->masks, mask_names, COUNT(mask_names), "mask") ||
        check_names(&o->tables, table_names, COUNT(table_names), "page table") ||
        check_numbers(&o->dims, "head dim") || check_numbers(&o->groups, "group"))
        return FI_EXIT_USAGE;
    return 0;
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

static const char *device_name(fi_device_type d) { return d == FI_DEVICE_CPU ? "cpu" : "cuda"; }

/* The kernels of one plan, those already listed (by file) dropped. */
static int add_plan(warmup *w, fi_device_type device, const fi_attention_params *p,
                    const fi_plan_config *c, const char *variant) {
    fi_warmup_kernel k[FI_WARMUP_MAX_KERNELS];
    int32_t n = 0;
    if (fi_warmup_list(device, p, c, w->arch, k, FI_WARMUP_MAX_KERNELS, &n)) {
        fprintf(stderr, "fi warmup: %s %s d%d %s: %s\n", device_name(device), variant,
                (int)p->head_dim_qk, fi_dtype_name(p->q_dtype), fi_last_error());
        return -1;
    }
    for (int32_t i = 0; i < n && i < FI_WARMUP_MAX_KERNELS; i++) {
        int dup = 0;
        for (int j = 0; j < w->num_jobs && !dup; j++)
            dup = !strcmp(w->jobs[j].kernel.cache_path, k[i].cache_path);
        if (dup) continue;
        job *jb = add_job(w);
        if (!jb) return fprintf(stderr, "fi warmup: out of memory\n"), -1;
        jb->device = device, jb->params = *p, jb->config = *c, jb->index = i;
        jb->kernel = k[i], jb->variant = variant;
    }
    return 0;
}

/* The axes of the combinations, digits of a mixed-radix number (the first
 * varies slowest); the CPU's kernel depends on the first three alone. */
enum { AX_VARIANT, AX_DIM, AX_DTYPE, CPU_AXES, AX_GROUP = CPU_AXES, AX_KV, AX_MASK, AX_TABLE,
       CUDA_AXES };

static const list *axis(const options *o, int a) {
    const list *axes[CUDA_AXES] = {&o->variants, &o->dims,  &o->dtypes, &o->groups,
                                   &o->kvs,      &o->masks, &o->tables};
    return axes[a];
}

/* Combination `c` over the first `naxes` axes as a plan (the other axes at
 * their first value, the page table on the host); 0 when it is none (a
 * device page table needs paged KV). */
static int plan_of(const options *o, long c, int naxes, fi_attention_params *p,
                   fi_plan_config *cfg, const char **variant) {
    int at[CUDA_AXES] = {0};
    for (int a = naxes - 1; a >= 0; a--) {
        at[a] = (int)(c % axis(o, a)->n);
        c /= axis(o, a)->n;
    }
#define ITEM(a) axis(o, a)->item[at[a]]
    *variant = ITEM(AX_VARIANT);
    fi_attention_params_init(p);
    p->num_kv_heads = 1;
    p->num_qo_heads = (int32_t)strtol(ITEM(AX_GROUP), NULL, 10); /* checked by parse */
    p->head_dim_qk = p->head_dim_vo = (int32_t)strtol(ITEM(AX_DIM), NULL, 10);
    p->q_dtype = p->kv_dtype = p->o_dtype =
        dtype_values[find(ITEM(AX_DTYPE), dtype_names, COUNT(dtype_names))];
    p->kv_format = find(ITEM(AX_KV), kv_names, COUNT(kv_names)) ? FI_KV_FORMAT_RAGGED
                                                                  : FI_KV_FORMAT_PAGED;
    p->mask_mode = (fi_mask_mode)find(ITEM(AX_MASK), mask_names, COUNT(mask_names));
    fi_plan_config_init(cfg);
    if (naxes > AX_TABLE)
        cfg->device_page_table = find(ITEM(AX_TABLE), table_names, COUNT(table_names));
#undef ITEM
    if (strcmp(*variant, BUILTIN_PATH)) /* else no variant: the built-in kernels */
        fi_variant_builtin(*variant, &p->variant); /* a built-in name: checked by parse */
    return !(cfg->device_page_table && p->kv_format != FI_KV_FORMAT_PAGED);
}

/* The kernels of every combination asked for on `device`. */
static int add_plans(warmup *w, const options *o, fi_device_type device) {
    int naxes = device == FI_DEVICE_CPU ? CPU_AXES : CUDA_AXES;
    long combos = 1;
    for (int a = 0; a < naxes; a++) combos *= axis(o, a)->n;
    for (long c = 0; c < combos; c++) {
        fi_attention_params p;
        fi_plan_config cfg;
        const char *variant;
        if (plan_of(o, c, naxes, &p, &cfg, &variant) && add_plan(w, device, &p, &cfg, variant))
            return -1;
    }
    return 0;
}

static void label(const job *j, char *buf, size_t n) {
    snprintf(buf, n, "%-4s %s", device_name(j->device), j->kernel.name);
}

/* One progress line on a terminal, redrawn per kernel (the latest one
 * named); elsewhere (a log) the same line at each quarter, so a long warmup
 * still shows it moves. */
static void progress(warmup *w, const job *j) {
    int done = atomic_fetch_add(&w->done_jobs, 1) + 1, width = 30, n = w->num_jobs;
    int tty = isatty(2);
    if (!tty && done != n && done * 4 / n == (done - 1) * 4 / n) return;
    int fill = done * width / n;
    char bar[64], what[200];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    label(j, what, sizeof what);
    pthread_mutex_lock(&w->print_lock);
    if (tty)
        fprintf(stderr, "\r[%s] %3d/%d  %-50.50s %s\033[K%s", bar, done, n, what,
                j->status ? "FAILED" : j->cached ? "cached" : "compiled", done < n ? "" : "\n");
    else
        fprintf(stderr, "[%s] %3d/%d kernels\n", bar, done, n);
    pthread_mutex_unlock(&w->print_lock);
}

static void *worker(void *arg) {
    warmup *w = arg;
    for (int i; (i = atomic_fetch_add(&w->next_job, 1)) < w->num_jobs;) {
        job *j = &w->jobs[i];
        double t0 = now();
        j->status = fi_warmup_compile(j->device, &j->params, &j->config, w->arch, j->index,
                                      &j->cached);
        j->seconds = now() - t0;
        if (j->status) snprintf(j->error, sizeof j->error, "%s", fi_last_error());
        progress(w, j);
    }
    return NULL;
}

static void compile_all(warmup *w, int threads) {
    pthread_t tid[64];
    int started[64] = {0};
    for (int i = 1; i < threads; i++) started[i] = pthread_create(&tid[i], NULL, worker, w) == 0;
    worker(w);
    for (int i = 1; i < threads; i++)
        if (started[i]) pthread_join(tid[i], NULL);
}

/* The directory of device's first kernel file ("" without kernels), and
 * how many kernels it has. */
static int cache_dir_of(const warmup *w, fi_device_type device, char *dir, size_t n) {
    int count = 0;
    dir[0] = 0;
    for (int i = 0; i < w->num_jobs; i++) {
        if (w->jobs[i].device != device) continue;
        if (!count++) {
            snprintf(dir, n, "%s", w->jobs[i].kernel.cache_path);
            char *slash = strrchr(dir, '/');
            if (slash) *slash = 0;
        }
    }
    return count;
}

static const char *arch_of(const warmup *w, fi_device_type device) {
    for (int i = 0; i < w->num_jobs; i++)
        if (w->jobs[i].device == device) return w->jobs[i].kernel.arch;
    return "";
}

/* "fi warmup: 6 CPU kernels into DIR, 12 CUDA kernels for sm_90a into DIR;
 * 4 jobs": only the backends that have kernels. */
static void announce(const warmup *w, int threads, int dry_run) {
    char line[2400], dir[1024];
    int at = snprintf(line, sizeof line, "fi warmup:");
    int n = cache_dir_of(w, FI_DEVICE_CPU, dir, sizeof dir);
    if (n) at += snprintf(line + at, sizeof line - (size_t)at, " %d CPU kernel%s into %s", n,
                          n == 1 ? "" : "s", dir);
    int m = cache_dir_of(w, FI_DEVICE_CUDA, dir, sizeof dir);
    if (m) at += snprintf(line + at, sizeof line - (size_t)at, "%s %d CUDA kernel%s for %s into %s",
                          n ? "," : "", m, m == 1 ? "" : "s", arch_of(w, FI_DEVICE_CUDA), dir);
    if (!n && !m)
        at += snprintf(line + at, sizeof line - (size_t)at,
                       " nothing to compile (plans without a variant on the CPU run the "
                       "library's own kernels)");
    fprintf(stderr, "%s; %d job%s%s\n", line, threads, threads == 1 ? "" : "s",
            dry_run ? " (dry run: nothing compiled)" : "");
}

/* The table's header, before the first backend's row. */
static void summary_header(void) {
    printf("%-7s %-8s %8s %9s %7s %7s %10s  %s\n", "backend", "target", "kernels", "compiled",
           "cached", "failed", "compile", "cache");
}

/* One row of the table for `device` (none when it has no kernels); the
 * failed kernels' errors go to stderr first. */
static void summary(const warmup *w, fi_device_type device) {
    int compiled = 0, cached = 0, failed = 0, total = 0;
    double compile_s = 0;
    char dir[1024];
    if (!cache_dir_of(w, device, dir, sizeof dir)) return;
    for (int i = 0; i < w->num_jobs; i++) {
        const job *j = &w->jobs[i];
        if (j->device != device) continue;
        total++;
        if (j->status) {
            char what[200];
            label(j, what, sizeof what);
            failed++;
            fprintf(stderr, "fi warmup: FAILED %s: %s\n", what, j->error);
        } else if (j->cached) {
            cached++;
        } else {
            compiled++, compile_s += j->seconds;
        }
    }
    char secs[32];
    snprintf(secs, sizeof secs, "%.1f s", compile_s);
    printf("%-7s %-8s %8d %9d %7d %7d %10s  %s\n", device == FI_DEVICE_CPU ? "CPU" : "CUDA",
           arch_of(w, device), total, compiled, cached, failed, secs, dir);
}

/* One line per kernel: "cpu <variant> d<dim> <dtype> <path>" or
 * "cuda <arch> <name> <path>". */
static int write_manifest(const warmup *w, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return fprintf(stderr, "fi warmup: cannot write %s\n", path), -1;
    for (int i = 0; i < w->num_jobs; i++) {
        const job *j = &w->jobs[i];
        if (j->device == FI_DEVICE_CPU)
            fprintf(f, "cpu %s d%d %s %s\n", j->variant, (int)j->params.head_dim_qk,
                    fi_dtype_name(j->params.q_dtype), j->kernel.cache_path);
        else
            fprintf(f, "cuda %s %s %s\n", j->kernel.arch, j->kernel.name, j->kernel.cache_path);
    }
    return fclose(f) ? -1 : 0;
}

/* Whether the variants name a spec (any but the built-in path). */
static int names_spec(const options *o) {
    for (int i = 0; i < o->variants.n; i++)
        if (strcmp(o->variants.item[i], BUILTIN_PATH)) return 1;
    return 0;
}

/* Which backends: as asked; by default CUDA's with --arch or a GPU, and the
 * CPU's when a variant spec is named (its built-in kernels are in the
 * library). A backend that cannot compile here is an error when asked for
 * by name (or --arch), else left out with a note. Returns 0 or an exit
 * code. */
static int choose_backends(const options *o, int *cpu, int *cuda) {
    int named = o->backends.n > 0;
    *cpu = named ? has(&o->backends, "cpu") : names_spec(o);
    *cuda = named ? has(&o->backends, "cuda") : o->arch[0] || fi_device_available(FI_DEVICE_CUDA);
    int cuda_asked = named ? *cuda : o->arch[0] != 0;
    if (*cuda && !o->arch[0] && !fi_device_available(FI_DEVICE_CUDA)) {
        fprintf(stderr, "fi warmup: CUDA: the driver sees no GPU; give --arch (e.g. sm_90a) "
                        "to compile without one\n");
        return 1;
    }
    if (*cuda && !o->dry_run && fi_warmup_check(FI_DEVICE_CUDA)) {
        fprintf(stderr, "fi warmup: %s\n", fi_last_error());
        if (cuda_asked) return 1;
        *cuda = 0;
    }
    if (*cpu && names_spec(o) && fi_warmup_check(FI_DEVICE_CPU)) { /* keys need the compiler */
        fprintf(stderr, "fi warmup: %s\n", fi_last_error());
        if (named || !*cuda) return 1;
        *cpu = 0;
    }
    return 0;
}

int fi_warmup(int argc, char **argv) {
    options o;
    int rc = parse(argc, argv, &o), cpu, cuda;
    if (rc) return rc < 0 ? 0 : rc; /* -1: --help */
    if (o.show_list) {
        printf("variants (--variants, comma-separated; all = every one):\n"
               "  %-15s plans without a variant: the built-in kernels (CUDA; the default)\n",
               BUILTIN_PATH);
        for (int i = 1; i < COUNT(variant_names); i++)
            printf("  %-15s the built-in variant spec (docs/VARIANTS.md)\n", variant_names[i]);
        return 0;
    }
    if ((rc = choose_backends(&o, &cpu, &cuda))) return rc;
    if (!cpu && !cuda) {
        printf("fi warmup: nothing to prepare: the CPU's built-in kernels are part of the "
               "library, and no GPU is visible (--arch sm_90a fills the cache for one; "
               "--variants for variant kernels; fi warmup --help)\n");
        return 0;
    }
    warmup w;
    memset(&w, 0, sizeof w);
    pthread_mutex_init(&w.print_lock, NULL);
    w.arch = o.arch[0] ? o.arch : NULL;
    if ((cpu && add_plans(&w, &o, FI_DEVICE_CPU)) || (cuda && add_plans(&w, &o, FI_DEVICE_CUDA))) {
        free(w.jobs);
        return 2;
    }
    announce(&w, o.threads, o.dry_run);
    if (!o.dry_run && w.num_jobs) {
        double t0 = now();
        compile_all(&w, o.threads);
        summary_header();
        summary(&w, FI_DEVICE_CUDA);
        summary(&w, FI_DEVICE_CPU);
        printf("fi warmup: %d kernel%s ready in %.1f s (the compile column adds up each "
               "kernel's time)\n", w.num_jobs, w.num_jobs == 1 ? "" : "s", now() - t0);
        for (int i = 0; i < w.num_jobs; i++) rc |= w.jobs[i].status != FI_OK;
    }
    if (o.manifest && write_manifest(&w, o.manifest)) rc = 1;
    free(w.jobs);
    pthread_mutex_destroy(&w.print_lock);
    return rc;
}
