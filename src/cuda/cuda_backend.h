/*
 * cuda_backend.h — what the CUDA backend's files share: the context state,
 * kernel specs (a configuration -> entry-point name and -D options), the
 * NVRTC JIT with its disk and memory caches, and the plan's device state.
 */
#ifndef FI_CUDA_BACKEND_H
#define FI_CUDA_BACKEND_H

#include "cuda/cuda_api.h"

#include <pthread.h>

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

/* The compile-time facts of one attention kernel (see kernels/attention.cuh). */
typedef struct fi_attn_config {
    int dqk, dvo;
    int qt, kvt, ot; /* fi_dtype codes */
    int group, rows;
    int paged, mask, window, softcap, pos; /* paged: 0 ragged, 1, 2 device table */
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

/* The configuration of a plan's params; device_table: the plan takes a
 * device page table (fi_plan_config.device_page_table: paged = 2, kernels
 * that clamp page ids). A variant's text is attached with
 * fi_cuda_attn_set_variant. */
void fi_cuda_attn_config(const fi_attention_params *p, int32_t group, int device_table,
                         fi_attn_config *c);
/* Attach variant v's CUDA hook text `src` (kept by reference) to c. */
void fi_cuda_attn_set_variant(fi_attn_config *c, const fi_variant *v, const char *src);
void fi_cuda_attn_spec(const fi_attn_config *c, fi_kernel_spec *spec);
/* Appends the -D options of $FLASHINFER_CUDA_DEFINES (space-separated) to
 * spec: the attention kernels and the RoPE op take them. */
void fi_cuda_env_defines(fi_kernel_spec *spec);
/* A tuning variable's value as a positive integer, 0 where unset or not
 * positive (FLASHINFER_CUDA_WORKERS, _GRID_Y, _DECODE_ROOM, _MERGE_CTAS;
 * read at context or plan creation). */
int fi_cuda_env_count(const char *name);
/* The merge kernel of c's output (the built-in one unless c's variant has an
 * output hook or use_softmax = 0). */
void fi_cuda_merge_spec_of(const fi_attn_config *c, fi_kernel_spec *spec);
void fi_cuda_merge_spec(int dvo, int ot, fi_kernel_spec *spec);
/* The separate kernels of params `p` (a variant's plan runs these): attention,
 * its merge and, where the configuration allows, tensor-core attention
 * (specs[2]); returns how many (2 or 3). device_table: a plan with
 * fi_plan_config.device_page_table (paged kernels that clamp page ids,
 * FI_PAGED = 2). vsrc: p->variant's CUDA hook text (kept by reference), or
 * NULL without a variant; *vhooks (may be NULL) gets its FI_VH_* bits.
 * Plans and fi warmup get kernel names and cache keys from here (through
 * fi_cuda_plan_specs). */
int fi_cuda_separate_specs(const fi_attention_params *p, int device_table, const char *vsrc,
                           fi_kernel_spec specs[3], int *vhooks);
/* The tensor-core kernel (kernels/attention_tc.cuh): whether it supports the
 * configuration (16-bit Q == KV dtype, head dims 64/128, no fused RoPE), its
 * spec, and its dynamic shared memory in bytes. */
int fi_cuda_attn_tc_supported(const fi_attn_config *c);
void fi_cuda_attn_tc_spec(const fi_attn_config *c, fi_kernel_spec *spec);
int fi_cuda_attn_tc_smem(const fi_attn_config *c);
/* Items with at least this many packed rows (tokens x group) go to the
 * tensor-core kernel when the plan has one. */
#define FI_CUDA_TC_MIN_ROWS 16
/* Inside the persistent kernel with decode version 3, items of up to one
 * m16 tile of packed rows take that path (a 16-row item, e.g. 16 queries on
 * a cascade's shared prefix, would fill an eighth of a 128-row block). */
#define FI_CUDA_DTC_MAX_ROWS 16
/* A mixed batch runs the 64-row-block full form (persist_mix) when its wide
 * items' row x key products are below this many times its small items'
 * keys: per KV head that is their FLOPs over the small items' K/V bytes
 * (16-bit KV). H200 (docs/CUDA_KERNELS.md): the 64-row form reads decode K/V
 * at 4.5 TB/s instead of 3.65 but runs prefill at ~240 TFLOP/s instead of
 * ~300, so it pays below ~62 FLOP per byte. */
#define FI_CUDA_MIX_FLOP_PER_BYTE 62
/* The persistent kernel (kernels/persistent.cuh): both paths (the
 * tensor-core one when supported) and the fused merge in one launch; its
 * dynamic shared memory. */
void fi_cuda_persist_spec(const fi_attn_config *c, fi_kernel_spec *spec);
int fi_cuda_persist_smem(const fi_attn_config *c);
/* Its decode form (decode version 3 alone, without the full form's register
 * spills): runs batches whose items are all at most
 * FI_CUDA_DTC_MAX_ROWS packed rows; wide items in 16-row slices. */
int fi_cuda_persist_decode_supported(const fi_attn_config *c);
void fi_cuda_persist_decode_spec(const fi_attn_config *c, fi_kernel_spec *spec);
int fi_cuda_persist_decode_smem(const fi_attn_config *c);
/* The mixed form (the full form with 64-row blocks) where a plan with
 * config `c` also compiles it; its spec (and config, in `mixed`). */
int fi_cuda_persist_mix_supported(const fi_attn_config *c);
void fi_cuda_persist_mix_spec(const fi_attn_config *c, fi_attn_config *mixed,
                              fi_kernel_spec *spec);
/* The persistent kernel's forms for config `c`, in order: the full form,
 * its decode form and its mixed form where supported (the mixed form's
 * config in `mixed`); returns how many (1-3). */
int fi_cuda_persist_forms(const fi_attn_config *c, fi_attn_config *mixed, fi_kernel_spec specs[3]);
/* Whether the persistent kernel takes the small items on tensor cores
 * (decode version 3, kernels/decode_tc.cuh). That kernel has no CUDA-core
 * path: a run whose K/V rows are not 16-byte copyable, or whose page size is
 * not a power of two, takes the separate kernels instead. */
int fi_cuda_decode_tc_supported(const fi_attn_config *c);
/* Whether plans run the persistent kernel (default) or the separate
 * CUDA-core, tensor-core and merge kernels (FLASHINFER_CUDA_PERSIST=0). */
int fi_cuda_persist_enabled(void);
/* The kernels a plan with params `p` resolves, in order; returns how many
 * (at most 3): the persistent kernel, its decode form and its mixed form
 * where supported (when enabled, without a variant), else
 * fi_cuda_separate_specs. What `jit_compile --warm` and `fi warmup` compile
 * ahead. */
int fi_cuda_plan_specs(const fi_attention_params *p, int device_table, const char *vsrc,
                       fi_kernel_spec specs[3], int *vhooks);

/* ------------------------------------------------------------------- JIT */

/* Compile `spec` with NVRTC for `arch`: "sm_90a" gives a CUBIN, "compute_90a"
 * PTX. Needs NVRTC only (no driver, no GPU). *image is malloc'ed. */
fi_status fi_cuda_jit_compile(const fi_kernel_spec *spec, const char *arch, char **image,
                              size_t *size);
/* Compile `spec` into the disk cache unless it is there (no GPU needed):
 * pre-warming the cache, e.g. in parallel processes before a test run. */
fi_status fi_cuda_jit_warm(const fi_kernel_spec *spec, const char *arch, int *was_cached);
/* The directory of the on-disk cache: $FLASHINFER_CACHE_DIR, else
 * $XDG_CACHE_HOME/flashinfer-c, else $HOME/.cache/flashinfer-c. */
void fi_cuda_cache_dir(char *buf, size_t n);
/* 64-bit key of (sources, options, arch, NVRTC version). */
uint64_t fi_cuda_jit_key(const fi_kernel_spec *spec, const char *arch);
/* The cache file of `spec` for `arch`:
 * <dir>/<kernel name>-<arch>-<16 hex digits of fi_cuda_jit_key>.cubin. */
void fi_cuda_cache_path(const fi_kernel_spec *spec, const char *arch, char *buf, size_t n);
/* The NVRTC target of compute capability major.minor: "sm_90a" for 9.0
 * (Hopper's arch-specific target: wgmma, setmaxnreg), else "sm_<major><minor>";
 * $FLASHINFER_CUDA_ARCH overrides (e.g. "sm_90" to test). */
void fi_cuda_arch_name(int major, int minor, char *buf, size_t n);
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
/* Whether this process may use the table: not when FLASHINFER_AOT=0 or
 * FLASHINFER_JIT=force (tests comparing the two builds; read per context). */
int fi_cuda_aot_enabled(void);

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
    int use_aot;    /* fi_cuda_aot_enabled() at creation */
    int pdl;        /* the attention kernels launched with programmatic
                       dependent launch (sm_90 on, cuLaunchKernelEx;
                       FLASHINFER_CUDA_PDL=0 turns it off) */
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
 * serving loop's thread does (a push and a pop, 0.2-0.4 us on an H200's
 * host); *pushed says whether fi_cuda_leave must pop. */
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
    CUfunction last_form;    /* the persistent kernel's form the last run
                                launched (NULL: the separate kernels); tests
                                compare an eager run's with a graph's */
    CUfunction attn, merge;
    CUfunction attn_tc;      /* tensor-core kernel, NULL when unsupported */
    CUfunction persist;      /* one launch for everything (NULL: the three) */
    int persist_smem;
    int persist_dtc;         /* it has no CUDA-core path (decode_tc.cuh) */
    CUfunction persist_dec;  /* its decode form (NULL: none) */
    int persist_b64;         /* its tensor-core blocks are 64 rows */
    CUfunction persist_mix;  /* the full form with 64-row blocks for mixed
                                batches (NULL: none) */
    int persist_mix_smem;
    int mix_b64;             /* this schedule runs persist_mix */
    int persist_dec_smem;
    int heads_x;             /* its grid: x = KV heads, y = workers */
    int prefill_separate;    /* tensor-core-only runs: attn_tc */
    int has_tc_path;         /* the configuration has a tensor-core kernel */
    CUdeviceptr merge_count; /* int32 [max_total_qo, H_kv], zero between runs */
    int tc_smem;             /* its dynamic shared memory */
    int has_tc_items;        /* this schedule has items for attn_tc */
    int has_cc_items;        /* ... and for attn */
    int has_wide_items;      /* ... items wider than decode v3's m16 tile */
    unsigned grid_x, grid_y, merge_grid;
    int blocks_per_sm;
    char attn_name[FI_KERNEL_NAME_MAX];
    char *vsrc;              /* a user variant's CUDA hook text (malloc'd) */
    int vhooks;              /* its FI_VH_* bits */
} fi_cuda_plan;

fi_status fi_cuda_plan_init(struct fi_plan *plan);
void fi_cuda_plan_fini(struct fi_plan *plan);
fi_status fi_cuda_plan_upload(struct fi_plan *plan);
/* Resolve the separate kernels (attention, merge, tensor-core) of a plan
 * that runs the persistent kernel, for runs it cannot take; the context
 * current. */
fi_status fi_cuda_plan_resolve_separate(struct fi_plan *plan);
fi_status fi_cuda_run(struct fi_plan *plan, const fi_run_args *args);
/* Host bytes into device memory, queued on the stream of the plan's next
 * upload (its event then orders every run after the copy). */
fi_status fi_cuda_plan_copy_in(struct fi_plan *plan, void *dst, const void *src, size_t bytes);

#endif /* FI_CUDA_BACKEND_H */
