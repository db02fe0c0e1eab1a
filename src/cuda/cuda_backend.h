/*
 * cuda_backend.h — what the CUDA backend's files share: the context state,
 * kernel specs (a configuration -> entry-point name and -D options), the
 * NVRTC JIT with its disk and memory caches, and the plan's device state.
 */
#ifndef FI_CUDA_BACKEND_H
#define FI_CUDA_BACKEND_H

#include "cuda/cuda_api.h"
#include "cuda/tuning.h"

#include <pthread.h>

/* The backend's table (backend.c), for the registry (src/backends.c). */
extern const fi_backend fi_cuda_backend;

/* fi_backend's warmup members (warmup.c). */
const char *fi_cuda_warmup_missing(void);
fi_warmup_list_fn fi_cuda_warmup_list;
fi_warmup_compile_fn fi_cuda_warmup_compile;

/* ---------------------------------------------------------------- kernels */

#define FI_SPEC_MAX_DEFINES 20

#define FI_KERNEL_NAME_MAX 128

/* One kernel: the kernels/ file that defines it, its entry point, its -D,
 * and a user variant's hook text (fi_variant_source for CUDA; NULL for the
 * built-ins), given to NVRTC as the header "fi_variant_hooks.cuh". */
typedef struct fi_kernel_spec {
    const char *entry_file;
    char name[FI_KERNEL_NAME_MAX];
    char defines[FI_SPEC_MAX_DEFINES][FI_KERNEL_NAME_MAX + 32];
    int num_defines;
    const char *header;
} fi_kernel_spec;

/* Where an attention kernel reads K/V (its FI_PAGED): a ragged tensor, pages
 * through a page table staged with the plan's metadata, or pages through the
 * caller's device page table (fi_plan_config.device_page_table), whose ids
 * the kernels clamp to the cache. */
typedef enum fi_cuda_kv_source {
    FI_CUDA_KV_RAGGED = 0,
    FI_CUDA_KV_PAGED = 1,
    FI_CUDA_KV_DEVICE_TABLE = 2,
} fi_cuda_kv_source;

/* The compile-time facts of one attention kernel (see kernels/attention.cuh);
 * the kernels' FI_MASK and FI_POS codes are the public enums' values. */
typedef struct fi_attn_config {
    int dqk, dvo;
    int qt, kvt, ot; /* fi_dtype codes */
    int group, rows;
    fi_cuda_kv_source paged;
    fi_mask_mode mask;
    int window, softcap; /* 0 or 1 */
    fi_pos_encoding pos;
    /* A user variant: its name, hook text (CUDA target; owned by the
     * caller) and hook bits (FI_VH_*); NULL / 0 for the built-ins. */
    const char *vname;
    const char *vsrc;
    int vhooks;
    /* Packed rows of the persistent kernel's tensor-core block: 0 = 128,
     * or 64 for a plan whose items never have more (17 to 64 = max_total_qo
     * x group: a cascade's shared level), which would leave half a 128-row
     * block idle. */
    int tc_block;
} fi_attn_config;

/* spec.c: configurations, their kernels' names and -D options. */

/* Append one "-D..." option (printf-style) to s; past FI_SPEC_MAX_DEFINES
 * nothing (the spec builders stay far below). */
void fi_cuda_spec_define(fi_kernel_spec *s, const char *fmt, ...) FI_PRINTF(2, 3);
/* The configuration of a plan's params; device_table: the plan takes a
 * device page table. A variant's text is attached with
 * fi_cuda_attn_set_variant. */
void fi_cuda_attn_config(const fi_attention_params *p, int32_t group, int device_table,
                         fi_attn_config *c);
/* Attach variant v's CUDA hook text `src` (kept by reference) to c. */
void fi_cuda_attn_set_variant(fi_attn_config *c, const fi_variant *v, const char *src);
/* The CUDA-core attention kernel (kernels/attention.cuh). */
void fi_cuda_attn_spec(const fi_attn_config *c, fi_kernel_spec *spec);
/* The tensor-core attention kernel (kernels/attention_tc.cuh). */
void fi_cuda_attn_tc_spec(const fi_attn_config *c, fi_kernel_spec *spec);
/* The Hopper prefill kernel (kernels/attention_wg.cuh), same options. */
void fi_cuda_attn_wg_spec(const fi_attn_config *c, fi_kernel_spec *spec);
/* The persistent kernel (kernels/persistent.cuh) with its tensor-core path
 * (tc) and decode version 3 for its small items (dtc); c->tc_block 64 gives
 * the 64-row-block form where tc. */
void fi_cuda_persist_spec(const fi_attn_config *c, int tc, int dtc, fi_kernel_spec *spec);
/* The merge kernel of c's output (the built-in one unless c's variant has an
 * output hook or use_softmax = 0). */
void fi_cuda_merge_spec_of(const fi_attn_config *c, fi_kernel_spec *spec);
void fi_cuda_merge_spec(int dvo, int ot, fi_kernel_spec *spec);

/* select.c: the one place that chooses kernels. */

/* The kernel forms a plan may launch: one row each of its table. */
typedef enum fi_cuda_form {
    FI_CUDA_FORM_PERSIST = 0,     /* the persistent kernel: every item and the merge */
    FI_CUDA_FORM_PERSIST_DECODE,  /* its decode form: decode version 3 alone */
    FI_CUDA_FORM_PERSIST_MIXED,   /* its full form with 64-row tensor-core blocks */
    FI_CUDA_FORM_ATTN,            /* separate kernels: CUDA-core attention, */
    FI_CUDA_FORM_ATTN_TC,         /*   tensor-core attention, */
    FI_CUDA_FORM_MERGE,           /*   the merge of split items */
    FI_CUDA_FORM_COUNT
} fi_cuda_form;

/* What a plan's configuration runs on: the forms in its table, their specs
 * and dynamic shared memory, and the facts run.c chooses a form by. */
typedef struct fi_cuda_selection {
    unsigned forms;                        /* bit f: form f is in the table */
    fi_kernel_spec spec[FI_CUDA_FORM_COUNT];
    int smem[FI_CUDA_FORM_COUNT];          /* bytes */
    int threads[FI_CUDA_FORM_COUNT];       /* per CTA */
    bool tc_path;          /* items of >= FI_CUDA_TC_MIN_ROWS packed rows run on
                              tensor cores (16-byte K/V rows at run time) */
    bool decode_tc;        /* the persistent kernel's small items on decode
                              version 3, which has no CUDA-core path: a run whose
                              K/V rows are not 16-byte copyable or whose page size
                              is not a power of two takes the separate kernels */
    bool prefill_separate; /* batches of tensor-core items only take the
                              separate tensor-core kernel */
    bool persist_tc;       /* the persistent kernel has a tensor-core path
                              (else its batches with tensor-core items take
                              the separate kernels) */
    int tc_block;          /* rows of the persistent kernel's tensor-core block */
} fi_cuda_selection;

/* The table of configuration `c` (its variant attached) for a plan whose
 * items have at most `max_rows` packed rows (max_total_qo x group), under
 * settings `t`. */
void fi_cuda_select(const fi_attn_config *c, int64_t max_rows, const fi_cuda_tuning *t,
                    fi_cuda_selection *sel);
static inline bool fi_cuda_has_form(const fi_cuda_selection *sel, fi_cuda_form f) {
    return (sel->forms >> f) & 1u;
}
/* The kernels a plan with params `p` loads on NVRTC target `arch`, in form
 * order, into specs; returns how many (at most FI_CUDA_FORM_COUNT). device_table: a plan with
 * fi_plan_config.device_page_table; max_rows as fi_cuda_select's; vsrc:
 * p->variant's CUDA hook text (kept by reference), or NULL without a
 * variant; *vhooks (may be NULL) gets its FI_VH_* bits. The settings are
 * read from the environment now. What fi warmup and `jit_compile --warm`
 * compile ahead. */
int fi_cuda_plan_specs(const fi_attention_params *p, const char *arch, int device_table,
                       int64_t max_rows, const char *vsrc,
                       fi_kernel_spec specs[FI_CUDA_FORM_COUNT], int *vhooks);
/* Items with at least this many packed rows (tokens x group) go to the
 * tensor-core kernel when the plan has one. */
#define FI_CUDA_TC_MIN_ROWS 16
/* Inside the persistent kernel with decode version 3, items of up to one
 * m16 tile of packed rows take that path (a 16-row item, e.g. 16 queries on
 * a cascade's shared prefix, would fill an eighth of a 128-row block). */
#define FI_CUDA_DTC_MAX_ROWS 16
/* A mixed batch runs the mixed form when its wide items' row x key products
 * are below this many times its small items' keys: per KV head that is
 * their FLOPs over the small items' K/V bytes (16-bit KV). The 64-row form
 * reads decode K/V faster but runs prefill slower than the 128-row one;
 * this is where they cross (measured, docs/BENCHMARKS.md). */
#define FI_CUDA_MIX_FLOP_PER_BYTE 62

/* ------------------------------------------------------------------- JIT */

/* Compile `spec` with NVRTC for `arch`: "sm_90a" gives a CUBIN, "compute_90a"
 * PTX. Needs NVRTC only (no driver, no GPU). *image is malloc'ed. */
fi_status fi_cuda_jit_compile(const fi_kernel_spec *spec, const char *arch, char **image,
                              size_t *size);
/* Compile `spec` into the disk cache unless it is there (no GPU needed):
 * pre-warming the cache, e.g. in parallel processes before a test run. */
fi_status fi_cuda_jit_warm(const fi_kernel_spec *spec, const char *arch, int *was_cached);
/* The directory of the on-disk cache (core/cache.h: $FLASHINFER_CACHE_DIR,
 * else $XDG_CACHE_HOME/flashinfer-c, else ~/.cache/flashinfer-c), created
 * and verified private. */
fi_status fi_cuda_cache_dir(char *buf, size_t n);
/* SHA-256 key of (sources, options, arch, NVRTC version). */
void fi_cuda_jit_key(const fi_kernel_spec *spec, const char *arch, uint8_t key[32]);
/* The cache file of `spec` for `arch` (nothing created or checked):
 * <dir>/<kernel name>-<arch>-<32 hex digits of fi_cuda_jit_key>.cubin, and
 * its key (key may be NULL). A path longer than n is an error. */
fi_status fi_cuda_cache_path(const fi_kernel_spec *spec, const char *arch, char *buf, size_t n,
                             uint8_t key[32]);
/* The NVRTC target of compute capability major.minor: "sm_90a" for 9.0
 * (Hopper's arch-specific target: wgmma, setmaxnreg), else "sm_<major><minor>";
 * t->arch (FLASHINFER_CUDA_ARCH) overrides (e.g. "sm_90" to test). */
void fi_cuda_arch_name(int major, int minor, const fi_cuda_tuning *t, char *buf, size_t n);
/* Whether NVRTC target `arch` has sm_90a's warpgroup MMA (sm_90a, compute_90a). */
bool fi_cuda_arch_wgmma(const char *arch);
/* The target of CUDA device `device` through the driver alone (no context):
 * FI_STATUS_NO_DEVICE without a driver or that device (fi warmup). */
fi_status fi_cuda_device_arch(int32_t device, char *buf, size_t n);

/* ------------------------------------------------------------------- AOT */

/* The configurations `make aot` compiles with nvcc (src/cuda/aot_set.c). */
int fi_cuda_aot_set_count(void);
void fi_cuda_aot_set_spec(int i, fi_kernel_spec *spec);
/* The cubin of `spec` for `arch` in the library's AOT table, matched by
 * entry file, name and every -D option; NULL when the library was built
 * without AOT (plain `make`) or holds no such kernel. */
const void *fi_cuda_aot_find(const fi_kernel_spec *spec, const char *arch, size_t *size);
/* Kernels in the table (0 without AOT). */
int fi_cuda_aot_count(void);

typedef struct fi_cuda_jit_stats {
    int compiled, disk_loads, memory_hits, aot_loads;
    double compile_seconds;   /* NVRTC, cold */
    double disk_load_seconds; /* file read + cuModuleLoadData, warm */
    double aot_load_seconds;  /* cuModuleLoadData of an embedded cubin */
} fi_cuda_jit_stats;

typedef struct fi_cuda_module {
    struct fi_cuda_module *next;
    char name[FI_KERNEL_NAME_MAX];
    CUmodule module;
    CUfunction function;
} fi_cuda_module;

/* ---------------------------------------------------------------- context */

typedef struct fi_cuda_ctx {
    const fi_cu_api *cu;
    CUdevice dev;
    CUcontext pctx; /* the device's primary context, retained */
    int sm_count, cc_major, cc_minor;
    char arch[16];  /* "sm_90a" */
    fi_cuda_tuning tuning; /* the settings, read at creation */
    int pdl;        /* the attention kernels launched with programmatic
                       dependent launch (sm_90 on, cuLaunchKernelEx;
                       unless tuning.pdl is off) */
    char name[128];
    pthread_mutex_t lock; /* guards modules and stats */
    fi_cuda_module *modules;
    fi_cuda_jit_stats stats;
} fi_cuda_ctx;

/* The entry point of `spec` in this context: from memory, the disk cache, or
 * NVRTC (then cached on disk). The context must be current. */
fi_status fi_cuda_jit_function(fi_cuda_ctx *cc, const fi_kernel_spec *spec, CUfunction *fn);
/* Compile those of specs[0..n) that are neither in the context nor on disk
 * into the disk cache, side by side (one thread each), so that a plan's
 * kernels compile cold in the time of the slowest; fi_cuda_jit_function then
 * loads them. Counted as compiled (wall time in compile_seconds). */
fi_status fi_cuda_jit_prepare(fi_cuda_ctx *cc, const fi_kernel_spec *const *specs, int n);
/* A copy of the context's JIT counters. */
fi_cuda_jit_stats fi_cuda_jit_get_stats(const fi_context *ctx);

fi_status fi_cuda_push(const fi_cuda_ctx *cc);
void fi_cuda_pop(const fi_cuda_ctx *cc);
/* The same for the per-step paths (fi_plan_update, fi_plan_run): nothing
 * is pushed when the calling thread has the context current already, as a
 * serving loop's thread does (a push and a pop cost a noticeable part of
 * the host step); *pushed says whether fi_cuda_leave must pop. */
fi_status fi_cuda_enter(const fi_cuda_ctx *cc, bool *pushed);
void fi_cuda_leave(const fi_cuda_ctx *cc, bool pushed);

/* ------------------------------------------------------------------- plan */

/* A plan's device side. The metadata region (kernels/fi_args.h) is packed in
 * pinned `staging` and sent by one async copy per fi_plan_update, on the
 * stream the plan last ran on (the legacy default stream before the first
 * run), followed by `uploaded`; a run on another stream first waits for that
 * event. So a graph captured around fi_plan_run and replayed on its capture
 * stream after another fi_plan_update reads the new batch: the copy was
 * queued on that stream before the replay. */
typedef struct fi_cuda_plan {
    fi_cuda_ctx *cc;
    CUdeviceptr meta;        /* [meta_cap] bytes, fixed */
    size_t meta_cap;
    CUdeviceptr partial_o;   /* f32 [max_partial_rows, H_qo, D_vo] */
    CUdeviceptr partial_lse; /* f32 [max_partial_rows, H_qo] */
    char *staging;           /* pinned host [meta_cap], then upload_done */
    CUevent uploaded;
    int upload_recorded;
    /* A pinned word, after staging, where the run's kernels write the
     * number of the upload they read (fi_meta.upload_seq): that copy is
     * then done, and the next update reads the word instead of waiting for
     * the event, a driver call (plan.c). NULL where it cannot be mapped. */
    uint32_t *upload_done;
    CUdeviceptr upload_done_dev;
    uint32_t upload_seq;     /* the last upload's number */
    CUstream upload_stream;  /* where the last copy was queued */
    CUstream ordered_stream; /* a stream known to be ordered after that copy */
    CUstream last_stream;    /* the stream of the last run */
    CUfunction last_form;    /* the form the last run launched (NULL: the
                                separate kernels); tests compare an eager
                                run's with a graph's */
    /* The plan's table (select.c), loaded at creation: each form's entry
     * point (NULL: not in the table) and dynamic shared memory. */
    CUfunction fn[FI_CUDA_FORM_COUNT];
    int smem[FI_CUDA_FORM_COUNT];
    int threads[FI_CUDA_FORM_COUNT];
    bool tc_path, decode_tc, prefill_separate, persist_tc; /* fi_cuda_selection's */
    int tc_block;
    CUdeviceptr merge_count; /* int32 [max_total_qo, H_kv], zero between runs */
    /* Facts of the last schedule, for run.c's choice of form (pack). */
    bool has_tc_items;       /* items for the tensor-core kernel */
    bool has_cc_items;       /* ... and for the CUDA-core one */
    bool has_wide_items;     /* items wider than decode v3's m16 tile */
    bool mixed_form;         /* the mixed form runs this schedule */
    unsigned grid_x, grid_y; /* workers, KV heads (the persistent kernel's
                                grid is transposed: x = KV heads) */
    unsigned merge_grid;
    int blocks_per_sm;       /* resident CTAs of the decode-bound form */
    char *vsrc;              /* a user variant's CUDA hook text (malloc'd) */
    int vhooks;              /* its FI_VH_* bits */
} fi_cuda_plan;

fi_status fi_cuda_plan_init(struct fi_plan *plan);
void fi_cuda_plan_fini(struct fi_plan *plan);
fi_status fi_cuda_plan_upload(struct fi_plan *plan);
fi_status fi_cuda_run(struct fi_plan *plan, const fi_run_args *args);
/* Host bytes into device memory, queued on the stream of the plan's next
 * upload (its event then orders every run after the copy). */
fi_status fi_cuda_plan_copy_in(struct fi_plan *plan, void *dst, const void *src, size_t bytes);

#endif /* FI_CUDA_BACKEND_H */
