/*
 * jit_compile.c — compile every supported CUDA kernel configuration without
 * a GPU: through the library's own NVRTC JIT path (compile only, PTX for
 * compute_90a by default), or list the configurations for nvcc (CI).
 *
 *   build/jit_compile                 NVRTC every configuration, print times
 *   build/jit_compile --arch sm_90a   the same, to CUBIN
 *   build/jit_compile --list          one line per kernel: entry file, name, -D...
 *                                     (attention, merge, the standalone ops, the
 *                                     serving ops (fi_sv_*), the variants, the AOT set)
 *   build/jit_compile --filter STR    only names containing STR
 *   build/jit_compile --out DIR       also write each image to DIR/NAME.cubin|.ptx
 *   build/jit_compile --list --variant-dir DIR
 *       also write each example variant's hook text (tests/variant_examples)
 *       to DIR/<variant>/fi_variant_hooks.cuh and add -IDIR/<variant> to its
 *       kernels' lines, so nvcc compiles them (tests/gpu/ci_compile.sh)
 *   build/jit_compile --warm [-j N] [--arch sm_90a]
 *       read attention configurations from stdin, one per line as
 *       "paged mask window softcap pos qt kvt ot dqk dvo hq hkv" (paged 2:
 *       a device page table; what
 *       tests/gpu/harness_configs.py prints), and compile the kernels a
 *       plan of each loads (its table: fi_cuda_plan_specs, under the
 *       settings of the environment, e.g. FLASHINFER_CUDA_KERNELS) into
 *       the disk cache ($FLASHINFER_CACHE_DIR), N at once
 *
 * The configurations cover every value of every compile-time option at
 * least once (head dims, dtypes, FP8, group sizes and row blocks, paged /
 * ragged, each mask and variant); the library compiles any other
 * combination on first use the same way. Then every example variant
 * (tests/variant_examples.h) x the main configurations (CUDA-core and
 * tensor-core kernels, paged / ragged, masks, FP8, f32) and their merges.
 * Then the AOT set (src/cuda/aot_set.c), without repeats: so CI's nvcc pass
 * (tests/gpu/ci_compile.sh) writes every cubin `make aot` embeds.
 */
#include "cuda/cuda_backend.h"
#include "cuda/cuda_ops.h"
#include "core/variant.h"
#include "../variant_examples.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { F32 = 0, F16 = 1, BF16 = 2, E4M3 = 3, E5M2 = 4 };

/* dqk dvo qt kvt ot group rows paged mask window softcap pos (then the
 * variant fields, zero) */
#define C(dqk, dvo, qt, kvt, ot, g, r, pg, m, w, c, p) \
    {dqk, dvo, qt, kvt, ot, g, r, pg, m, w, c, p, NULL, NULL, 0, 0}
static const fi_attn_config attn_configs[] = {
    C(128, 128, BF16, BF16, BF16, 4, 4, 1, 0, 0, 0, 0), /* decode 32/8 bf16: the benchmark's */
    C(128, 128, F16, F16, F16, 4, 4, 1, 0, 0, 0, 0),
    C(128, 128, BF16, BF16, BF16, 8, 8, 1, 0, 0, 0, 0), /* 32/4 */
    C(128, 128, BF16, BF16, BF16, 1, 1, 1, 0, 0, 0, 0), /* MHA */
    C(128, 128, F16, F16, F16, 2, 2, 1, 0, 0, 0, 0),
    C(128, 128, F16, F16, F16, 3, 3, 1, 0, 0, 0, 0),
    C(128, 128, BF16, BF16, BF16, 16, 8, 1, 0, 0, 0, 0), /* group > rows */
    C(64, 64, BF16, BF16, BF16, 4, 4, 1, 0, 0, 0, 0),
    C(256, 256, BF16, BF16, BF16, 4, 4, 1, 0, 0, 0, 0),
    C(256, 256, F16, F16, F16, 8, 8, 1, 1, 0, 0, 0),
    C(64, 128, F16, F16, F16, 4, 4, 1, 0, 0, 0, 0), /* qk != vo */
    C(128, 64, F16, F16, F16, 4, 4, 1, 0, 0, 0, 0),
    C(64, 256, F16, F16, F16, 4, 4, 1, 0, 0, 0, 0),
    C(128, 128, F32, F32, F32, 4, 4, 1, 0, 0, 0, 0),
    C(256, 256, F32, F32, F32, 4, 4, 1, 0, 0, 0, 0),
    C(64, 64, F32, F32, F32, 1, 1, 1, 0, 0, 0, 0),
    C(128, 128, F16, F16, F32, 4, 4, 1, 0, 0, 0, 0), /* mixed dtypes */
    C(128, 128, BF16, F32, F16, 4, 4, 1, 0, 0, 0, 0),
    C(128, 128, BF16, E4M3, BF16, 4, 4, 1, 0, 0, 0, 0), /* FP8 KV */
    C(128, 128, F16, E5M2, F16, 4, 4, 1, 0, 0, 0, 0),
    C(64, 64, BF16, E4M3, BF16, 8, 8, 1, 0, 0, 0, 0),
    C(256, 256, F16, E4M3, F16, 1, 1, 1, 0, 0, 0, 0),
    /* d 256 decode (decode version 3's split-O form): FP8, GQA 16, masks, ragged, qk != vo */
    C(256, 256, BF16, E4M3, BF16, 8, 8, 1, 1, 1, 0, 0),
    C(256, 256, F16, E5M2, F16, 16, 8, 1, 0, 0, 0, 0),
    C(256, 256, BF16, BF16, BF16, 16, 8, 0, 1, 1, 0, 0),
    C(256, 128, BF16, BF16, BF16, 4, 4, 1, 1, 0, 0, 0),
    C(128, 256, BF16, E4M3, BF16, 2, 2, 1, 0, 0, 0, 0),
    C(128, 128, BF16, BF16, BF16, 4, 4, 1, 1, 0, 0, 0), /* causal */
    C(128, 128, F16, F16, F16, 4, 4, 1, 1, 1, 0, 0),    /* causal + window */
    C(128, 128, F16, F16, F16, 4, 4, 1, 0, 1, 0, 0),    /* window */
    C(128, 128, F16, F16, F16, 4, 4, 1, 0, 0, 1, 0),    /* soft-cap */
    C(128, 128, F16, F16, F16, 4, 4, 1, 1, 0, 0, 2),    /* ALiBi */
    C(128, 128, F16, F16, F16, 4, 4, 1, 1, 0, 0, 1),    /* RoPE */
    C(256, 256, BF16, BF16, BF16, 8, 8, 1, 1, 0, 0, 1),
    C(128, 128, F16, F16, F16, 4, 4, 1, 2, 0, 0, 0),    /* custom mask */
    C(128, 128, F16, F16, F16, 4, 4, 1, 2, 1, 1, 2),    /* everything at once */
    C(128, 128, BF16, BF16, BF16, 4, 4, 0, 1, 0, 0, 0), /* ragged */
    C(128, 128, F16, F16, F16, 1, 1, 0, 2, 0, 0, 1),
    C(64, 64, F32, F32, F32, 8, 8, 0, 0, 0, 0, 0),
    /* head dims beyond 64/128/256 (CUDA cores; lanes of 5, 6, 3, 12, 16 elements) */
    C(80, 80, BF16, BF16, BF16, 4, 4, 1, 1, 0, 0, 0),
    C(80, 80, F16, F16, F16, 8, 8, 1, 0, 0, 0, 1),      /* RoPE pairs d, d + 40 */
    C(80, 80, F16, E4M3, F16, 4, 4, 1, 0, 0, 0, 0),     /* FP8 rows of 80 bytes */
    C(96, 96, F16, F16, F16, 8, 8, 1, 1, 0, 0, 0),
    C(96, 96, BF16, BF16, BF16, 4, 4, 0, 1, 1, 1, 1),   /* ragged, window, soft-cap, RoPE */
    C(96, 96, F32, F32, F32, 1, 1, 1, 0, 0, 0, 0),
    C(192, 192, BF16, BF16, BF16, 4, 4, 1, 1, 0, 0, 0),
    C(192, 192, F16, E5M2, F16, 8, 8, 1, 2, 0, 0, 2),   /* FP8, custom mask, ALiBi */
    C(192, 128, BF16, BF16, BF16, 1, 1, 0, 1, 0, 0, 0), /* DeepSeek's prefill, MHA, ragged */
    C(192, 128, BF16, BF16, BF16, 8, 8, 1, 1, 0, 0, 0),
    C(512, 512, BF16, BF16, BF16, 8, 8, 1, 0, 0, 0, 0), /* rows capped at 4 */
    C(512, 512, BF16, E4M3, BF16, 16, 8, 1, 0, 0, 0, 0),
    C(512, 512, F16, F16, F16, 4, 4, 1, 1, 0, 1, 1),    /* RoPE, soft-cap */
    C(512, 512, F32, F32, F32, 1, 1, 1, 0, 0, 0, 0),
    C(96, 64, F16, F16, F16, 4, 4, 1, 1, 0, 0, 0),
    C(80, 512, F32, F32, F32, 4, 4, 1, 0, 0, 0, 0),     /* 2 stages: 8 keys of 2368 bytes */
    C(192, 80, BF16, BF16, BF16, 8, 8, 1, 0, 0, 0, 1),  /* lanes of 12 and 5, RoPE */
};

static const int merge_dims[] = {64, 128, 256, 80, 96, 192, 512};
static const int merge_dtypes[] = {F32, F16, BF16};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Tensor-core kernels (kernels/attention_tc.cuh): every attention
 * configuration above that has them (the prefill benchmark's, causal bf16
 * 32/8 d 128, paged and ragged, among them), plus these. */
static const fi_attn_config tc_configs[] = {
    C(64, 64, F16, F16, F16, 1, 1, 0, 1, 1, 0, 0),
    C(128, 128, BF16, BF16, F32, 8, 8, 1, 2, 0, 1, 2),
};

enum { NA = sizeof attn_configs / sizeof attn_configs[0], MAXS = 4096 };
static fi_kernel_spec all[MAXS];
static int nall = -1;
static const fi_cuda_tuning defaults = {.use_aot = true, .pdl = true, .wgmma = true};
/* the selection of a GPU without sm_90a's wgmma (the mma.sync kernel) */
static const fi_cuda_tuning pre_hopper = {.use_aot = true, .pdl = true};

static void add(const fi_kernel_spec *s) {
    for (int j = 0; j < nall; j++)
        if (!strcmp(all[j].name, s->name)) return; /* the AOT set overlaps the others */
    if (nall < MAXS) all[nall++] = *s;
}

/* Every attention configuration's CUDA-core kernel, the merges, the
 * tensor-core kernels, then the persistent kernel's forms as plans select
 * them (select.c): the full form, its decode form where supported, and its
 * 64-row tensor-core block form (plans with at most 64 packed rows) where
 * there is a tensor-core path. */
static void attention_specs(void) {
    fi_kernel_spec s;
    fi_cuda_selection sel;
    for (int i = 0; i < NA; i++) {
        fi_cuda_attn_spec(&attn_configs[i], &s);
        add(&s);
    }
    enum { NMD = sizeof merge_dims / sizeof merge_dims[0] };
    for (int i = 0; i < 3 * NMD; i++) {
        fi_cuda_merge_spec(merge_dims[i / 3], merge_dtypes[i % 3], &s);
        add(&s);
    }
    for (int i = 0; i < NA; i++) { /* the Hopper kernel, and the mma.sync one elsewhere */
        fi_cuda_select(&attn_configs[i], INT32_MAX, &defaults, &sel);
        if (fi_cuda_has_form(&sel, FI_CUDA_FORM_ATTN_TC)) add(&sel.spec[FI_CUDA_FORM_ATTN_TC]);
        fi_cuda_select(&attn_configs[i], INT32_MAX, &pre_hopper, &sel);
        if (fi_cuda_has_form(&sel, FI_CUDA_FORM_ATTN_TC)) add(&sel.spec[FI_CUDA_FORM_ATTN_TC]);
    }
    for (int i = 0; i < (int)(sizeof tc_configs / sizeof tc_configs[0]); i++) {
        fi_cuda_attn_tc_spec(&tc_configs[i], &s);
        add(&s);
    }
    for (int i = 0; i < NA; i++) {
        fi_cuda_select(&attn_configs[i], INT32_MAX, &defaults, &sel);
        add(&sel.spec[FI_CUDA_FORM_PERSIST]);
    }
    for (int i = 0; i < NA; i++) {
        fi_cuda_select(&attn_configs[i], INT32_MAX, &defaults, &sel);
        if (fi_cuda_has_form(&sel, FI_CUDA_FORM_PERSIST_DECODE))
            add(&sel.spec[FI_CUDA_FORM_PERSIST_DECODE]);
    }
    for (int i = 0; i < NA; i++) {
        fi_cuda_select(&attn_configs[i], 64, &defaults, &sel);
        if (sel.tc_path) add(&sel.spec[FI_CUDA_FORM_PERSIST]);
    }
}

/* Example variants x these configurations: decode-like bf16 d 128 group 4
 * paged, f16 d 64 MHA ragged causal + window, FP8 KV with a custom mask
 * (CUDA cores), f32 d 256 causal (CUDA cores); each with its tensor-core
 * kernel where supported and its merge where it differs. */
static const fi_attn_config variant_configs[] = {
    C(128, 128, BF16, BF16, BF16, 4, 4, 1, 0, 0, 0, 0),
    C(64, 64, F16, F16, F16, 1, 1, 0, 1, 1, 0, 0),
    C(128, 128, BF16, E4M3, BF16, 8, 8, 1, 2, 0, 0, 0),
    C(256, 256, F32, F32, F32, 2, 2, 1, 1, 0, 0, 0),
};
enum { NVC = sizeof variant_configs / sizeof variant_configs[0] };
static fi_variant *variants[VX_COUNT];
static char *vsources[VX_COUNT];

/* The example variants' kernels, each with its tensor-core kernel where
 * the configuration has one and its merge. */
static void variant_specs(void) {
    for (int v = 0; v < VX_COUNT; v++) {
        if (fi_variant_create(vx_spec(v), &variants[v]) ||
            !(vsources[v] = fi_variant_source_alloc(variants[v], FI_VARIANT_TARGET_CUDA))) {
            fprintf(stderr, "variant %d: %s\n", v, fi_last_error());
            continue;
        }
        for (int k = 0; k < NVC; k++) {
            fi_attn_config c = variant_configs[k];
            fi_cuda_attn_set_variant(&c, variants[v], vsources[v]);
            fi_cuda_selection sel;
            fi_cuda_select(&c, INT32_MAX, &defaults, &sel); /* a variant: the separate kernels */
            add(&sel.spec[FI_CUDA_FORM_ATTN]);
            if (fi_cuda_has_form(&sel, FI_CUDA_FORM_ATTN_TC)) add(&sel.spec[FI_CUDA_FORM_ATTN_TC]);
            add(&sel.spec[FI_CUDA_FORM_MERGE]);
            fi_cuda_select(&c, INT32_MAX, &pre_hopper, &sel);
            if (fi_cuda_has_form(&sel, FI_CUDA_FORM_ATTN_TC)) add(&sel.spec[FI_CUDA_FORM_ATTN_TC]);
        }
    }
}

/* Everything, in order: attention, the standalone ops' kernels
 * (kernels/ops.cuh, src/cuda/ops.c), the serving ops' (kernels/serving.cuh,
 * sampling.cuh: src/cuda/serving_ops.c), the variants', and the AOT set. */
static void build_list(void) {
    nall = 0;
    attention_specs();
    fi_kernel_spec s;
    for (int i = 0; i < fi_cuda_ops_num_ci_specs(); i++) {
        fi_cuda_ops_ci_spec(i, &s);
        add(&s);
    }
    for (int i = 0; i < fi_cuda_sv_num_ci_specs(); i++) { /* the serving ops: fi_sv_* */
        fi_cuda_sv_ci_spec(i, &s);
        add(&s);
    }
    for (int i = 0; i < fi_cuda_rq_num_ci_specs(); i++) { /* RoPE + FP8 quantize: fi_rq_* */
        fi_cuda_rq_ci_spec(i, &s);
        add(&s);
    }
    variant_specs();
    for (int i = 0; i < fi_cuda_aot_set_count(); i++) {
        fi_cuda_aot_set_spec(i, &s);
        add(&s);
    }
}

/* --out DIR: DIR/NAME.cubin (or .ptx), to compare with nvcc's output. */
static void write_image(const char *dir, const fi_kernel_spec *s, const char *arch,
                        const char *image, size_t size) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.%s", dir, s->name, strncmp(arch, "sm_", 3) ? "ptx" : "cubin");
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(image, 1, size, f) != size) printf("cannot write %s\n", path);
    if (f) fclose(f);
}

/* --list --variant-dir: a variant kernel's header into DIR/<variant>/ and
 * the -I that finds it (printed). */
static int write_header(const char *dir, const fi_kernel_spec *s) {
    if (!s->header) return 0;
    const char *tag = strstr(s->name, "_v");
    while (tag && strstr(tag + 2, "_v")) tag = strstr(tag + 2, "_v"); /* the last _v... */
    char sub[512], path[600];
    snprintf(sub, sizeof sub, "%s/%s", dir, tag ? tag + 2 : s->name);
    mkdir(dir, 0755);
    mkdir(sub, 0755);
    snprintf(path, sizeof path, "%s/fi_variant_hooks.cuh", sub);
    FILE *f = fopen(path, "w");
    if (!f || fputs(s->header, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        return -1;
    }
    printf(" -I%s", sub);
    return 0;
}

/* --warm: the specs named on stdin into the disk cache, `jobs` processes. */
static int warm(const char *arch, int jobs) {
    enum { MAXW = 4096 };
    static fi_kernel_spec specs[MAXW];
    int n = 0;
    char line[256];
    while (n < MAXW - FI_CUDA_FORM_COUNT && fgets(line, sizeof line, stdin)) {
        int v[12];
        if (sscanf(line, "%d %d %d %d %d %d %d %d %d %d %d %d", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &v[11]) != 12)
            continue;
        fi_attention_params p;
        fi_attention_params_init(&p);
        p.kv_format = v[0] ? FI_KV_FORMAT_PAGED : FI_KV_FORMAT_RAGGED;
        p.mask_mode = v[1] == 1 ? FI_MASK_CAUSAL : v[1] == 2 ? FI_MASK_CUSTOM : FI_MASK_NONE;
        p.window_left = v[2] ? 1 : -1;
        p.logits_soft_cap = v[3] ? 1.0f : 0.0f;
        p.pos_encoding = v[4] == 1 ? FI_POS_ROPE_LLAMA : v[4] == 2 ? FI_POS_ALIBI : FI_POS_NONE;
        p.q_dtype = (fi_dtype)v[5], p.kv_dtype = (fi_dtype)v[6], p.o_dtype = (fi_dtype)v[7];
        p.head_dim_qk = v[8], p.head_dim_vo = v[9];
        p.num_qo_heads = v[10], p.num_kv_heads = v[11] > 0 ? v[11] : 1;
        n += fi_cuda_plan_specs(&p, arch, v[0] == 2, INT32_MAX, NULL, &specs[n], NULL); /* 2: device table */
    }
    /* drop duplicates */
    int m = 0;
    for (int i = 0; i < n; i++) {
        int dup = 0;
        for (int j = 0; j < m && !dup; j++) dup = !strcmp(specs[j].name, specs[i].name);
        if (!dup) specs[m++] = specs[i];
    }
    double t0 = now();
    int failed = 0;
    for (int w = 0; w < jobs; w++) {
        pid_t pid = jobs > 1 ? fork() : 0;
        if (pid < 0) return 1;
        if (pid > 0) continue;
        int bad = 0;
        for (int i = w; i < m; i += jobs) {
            int cached = 0;
            if (fi_cuda_jit_warm(&specs[i], arch, &cached)) {
                printf("FAIL %s: %s\n", specs[i].name, fi_last_error());
                bad = 1;
            }
        }
        fflush(stdout);
        if (jobs > 1) _exit(bad);
        failed = bad;
    }
    for (int w = 0; w < jobs && jobs > 1; w++) {
        int status = 0;
        if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status)) failed = 1;
    }
    char dir[512];
    fi_cuda_cache_dir(dir, sizeof dir);
    printf("warm: %d kernels for %s in %s, %d processes, %.1f s%s\n", m, arch, dir, jobs,
           now() - t0, failed ? ", FAILURES" : "");
    return failed;
}

int main(int argc, char **argv) {
    const char *arch = "compute_90a", *filter = NULL, *vdir = NULL, *outdir = NULL;
    int list = 0, do_warm = 0, jobs = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--arch") && i + 1 < argc) arch = argv[++i];
        else if (!strcmp(argv[i], "--warm")) do_warm = 1;
        else if (!strcmp(argv[i], "-j") && i + 1 < argc) jobs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
        else if (!strcmp(argv[i], "--list")) list = 1;
        else if (!strcmp(argv[i], "--variant-dir") && i + 1 < argc) vdir = argv[++i];
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) outdir = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--arch compute_90a|sm_90a] [--filter STR] [--list]\n",
                    argv[0]);
            return 2;
        }
    }
    if (do_warm) return warm(strcmp(arch, "compute_90a") ? arch : "sm_90a", jobs > 0 ? jobs : 1);
    int failed = 0, done = 0;
    double total = 0;
    build_list();
    for (int i = 0; i < nall; i++) {
        const fi_kernel_spec s = all[i];
        if (filter && !strstr(s.name, filter)) continue;
        if (list) {
            if (s.header && !vdir) continue; /* nvcc could not find its header */
            printf("%s %s", s.entry_file, s.name);
            for (int d = 0; d < s.num_defines; d++) printf(" %s", s.defines[d]);
            if (vdir && write_header(vdir, &s)) return 1;
            printf("\n");
            continue;
        }
        char *image = NULL;
        size_t size = 0;
        double t0 = now();
        fi_status st = fi_cuda_jit_compile(&s, arch, &image, &size);
        double dt = now() - t0;
        total += dt;
        done++;
        if (st) {
            failed++;
            printf("FAIL %-48s %s\n", s.name, fi_last_error());
            if (st == FI_STATUS_COMPILE_ERROR) printf("%s\n", fi_last_error());
            if (st == FI_STATUS_NO_DEVICE) return 1; /* no NVRTC: nothing else will work */
        } else {
            printf("ok   %-48s %7.0f ms  %8zu bytes\n", s.name, 1e3 * dt, size);
            if (outdir) write_image(outdir, &s, arch, image, size);
        }
        free(image);
    }
    if (!list)
        printf("%d kernels compiled by NVRTC for %s in %.1f s, %d failed\n", done, arch, total,
               failed);
    return failed ? 1 : 0;
}
