/*
 * flashinfer.h — the whole public API of flashinfer.c.
 *
 * An attention engine for LLM serving: attention over batches of requests of
 * any lengths whose KV cache lives in pages, on the CPU or a CUDA GPU.
 *
 * Conventions
 *  - Every public name starts with fi_ / FI_. Enum values carry their enum's
 *    name; new values are only ever added at the end.
 *  - Every function that can fail returns fi_status (FI_OK == 0) and never
 *    aborts or exits. fi_last_error() gives a message for the last failure on
 *    the calling thread ("kv_indptr[3]=7 > kv_indptr[4]=5: ...").
 *  - Constructors return a status and hand the object back through their last
 *    argument. Destroy functions accept NULL.
 *  - Extensible structs carry their size as the first field; fill them with
 *    the matching *_init() function, then set what you need.
 *  - Index arrays are int32. Tensors carry shape and strides (in elements),
 *    so non-contiguous views work. The shape expected by each function is
 *    written in a comment right above it.
 *  - Plan/run: a plan is made once per batch (fi_plan_update) from the batch
 *    metadata and reused by fi_plan_run for every layer.
 *  - Threads: an object (context, plan, cascade, block-sparse) is used by
 *    one thread at a time; separate contexts may run concurrently. On the
 *    CPU, different plans (cascades, block-sparse objects) of one context
 *    may also be used from several threads at once: their runs and the ops
 *    are serialised by the context's thread pool. A call on an object that
 *    another thread is inside is refused (FI_STATUS_INVALID_ARGUMENT, "in
 *    use by another call"), as far as it is seen: the check is atomic, the
 *    misuse still is one.
 *  - Handles and destroy order: destroy plans, cascades and block-sparse
 *    objects before their context. A context destroyed while objects made
 *    on it live is only marked destroyed: every call on it or on them is
 *    refused with FI_STATUS_INVALID_ARGUMENT (their destroy functions still
 *    work), and its memory is freed by the last of them. A call with a
 *    destroyed handle, or one of another kind, is refused with
 *    FI_STATUS_INVALID_ARGUMENT ("not a live plan"). That check is best
 *    effort: it reads the handle's first word, so memory that was freed and
 *    reused by another object of the same kind passes it, and a pointer to
 *    no memory at all may fault. A variant may be destroyed before the plans
 *    made with it: they keep it until the last of them is destroyed.
 *  - Outputs never share memory with a call's inputs, with each other, or
 *    within themselves (a stride of 0, rows that overlap), except where a
 *    function says it works in place, and then only as the very same view;
 *    anything else is refused with FI_STATUS_INVALID_ARGUMENT. Views of one
 *    buffer that share no element (K and V of fi_tensor_split_kv, q and k
 *    of one fused qkv buffer) are apart.
 *  - Non-finite values (docs/SEMANTICS.md, "Non-finite values"), the same
 *    on every backend (every CPU SIMD level, the CUDA kernels): a key a
 *    query does not see never affects it; a NaN or +inf logit makes that
 *    query row's O and LSE NaN; a -inf logit drops its key; NaN and
 *    infinities in V enter O = sum_j P_j v_j as IEEE arithmetic says (an
 *    infinity stays one; opposite ones, or a NaN, give NaN); a row that
 *    sees no key has O = 0 and LSE = -inf. The state
 *    merges: a state with LSE -inf is not read, one with LSE NaN or +inf
 *    makes the row NaN, the others are read whatever their weight.
 *
 * Semantics (masks, RoPE, ALiBi, LSE in base 2, merge) are those of
 * FlashInfer; see docs/SEMANTICS.md and docs/ARCHITECTURE.md.
 */
#ifndef FLASHINFER_H
#define FLASHINFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(FI_BUILD_SHARED)
#define FI_API __declspec(dllexport)
#elif defined(__GNUC__)
#define FI_API __attribute__((visibility("default")))
#else
#define FI_API
#endif

/* ---------------------------------------------------------------- version */

#define FI_VERSION_MAJOR 0
#define FI_VERSION_MINOR 1
#define FI_VERSION_PATCH 0
#define FI_VERSION_STRING "0.1.0"
#define FI_VERSION_NUMBER \
    (FI_VERSION_MAJOR * 1000000 + FI_VERSION_MINOR * 1000 + FI_VERSION_PATCH)

/* The library's version at run time; compare with FI_VERSION_NUMBER. */
FI_API int32_t fi_version_number(void);
FI_API const char *fi_version_string(void);

/* ----------------------------------------------------------------- status */

typedef enum fi_status {
    FI_OK = 0,
    FI_STATUS_INVALID_ARGUMENT = 1, /* a bad value: NULL, shape, index ...  */
    FI_STATUS_UNSUPPORTED = 2,      /* valid, but not implemented here      */
    FI_STATUS_OUT_OF_MEMORY = 3,
    FI_STATUS_BOUND_EXCEEDED = 4,   /* the batch exceeds the plan's bounds  */
    FI_STATUS_NOT_PLANNED = 5,      /* run before a successful plan update  */
    FI_STATUS_NO_DEVICE = 6,        /* backend or device not present        */
    FI_STATUS_BACKEND_ERROR = 7,    /* e.g. a CUDA call failed              */
    FI_STATUS_INTERNAL = 8,
    FI_STATUS_COMPILE_ERROR = 9     /* a variant's hook source did not compile;
                                       fi_last_error() carries the log     */
} fi_status;

/* A constant name for a status ("invalid argument"). */
FI_API const char *fi_status_string(fi_status status);
/* The message of the last failed call on this thread ("" if none). */
FI_API const char *fi_last_error(void);

/* ------------------------------------------------------------------ enums */

typedef enum fi_dtype {
    FI_DTYPE_F32 = 0,
    FI_DTYPE_F16 = 1,
    FI_DTYPE_BF16 = 2,
    FI_DTYPE_E4M3 = 3, /* FP8, KV cache only, with a scale */
    FI_DTYPE_E5M2 = 4, /* FP8, KV cache only, with a scale */
    FI_DTYPE_I32 = 5,  /* index tensors */
    FI_DTYPE_U8 = 6    /* packed bit masks, byte masks */
} fi_dtype;

/* Bytes per element of a dtype (0 for an unknown value). */
FI_API size_t fi_dtype_size(fi_dtype dtype);
FI_API const char *fi_dtype_name(fi_dtype dtype);

typedef enum fi_kv_layout {
    FI_KV_LAYOUT_NHD = 0, /* paged [pages, page_size, H_kv, D]; ragged [tokens, H_kv, D] */
    FI_KV_LAYOUT_HND = 1  /* paged [pages, H_kv, page_size, D]; ragged [H_kv, tokens, D] */
} fi_kv_layout;

typedef enum fi_kv_format {
    FI_KV_FORMAT_PAGED = 0,  /* kv_indptr counts pages; kv_indices, last_page_len */
    FI_KV_FORMAT_RAGGED = 1  /* kv_indptr counts tokens of one K/V tensor */
} fi_kv_format;

typedef enum fi_device_type {
    FI_DEVICE_CPU = 0,
    FI_DEVICE_CUDA = 1
} fi_device_type;

typedef enum fi_mask_mode {
    FI_MASK_NONE = 0,
    FI_MASK_CAUSAL = 1, /* bottom-right aligned */
    FI_MASK_CUSTOM = 2  /* packed bits per request, see fi_batch */
} fi_mask_mode;

typedef enum fi_pos_encoding {
    FI_POS_NONE = 0,
    FI_POS_ROPE_LLAMA = 1, /* RoPE fused into the kernel, non-interleaved halves */
    FI_POS_ALIBI = 2
} fi_pos_encoding;

/* ---------------------------------------------------------------- tensors */

#define FI_MAX_DIMS 6

/* A view of memory: shape and strides in elements (not bytes). */
typedef struct fi_tensor {
    void *data;
    fi_dtype dtype;
    int32_t ndim;
    int64_t shape[FI_MAX_DIMS];
    int64_t stride[FI_MAX_DIMS];
} fi_tensor;

/* A contiguous row-major tensor over data. */
FI_API fi_tensor fi_tensor_contiguous(void *data, fi_dtype dtype, int32_t ndim,
                                      const int64_t *shape);

/* Split one [pages, 2, ...] KV tensor into its K and V views (no copy). */
FI_API fi_status fi_tensor_split_kv(const fi_tensor *kv, fi_tensor *k_out,
                                    fi_tensor *v_out);

/* ---------------------------------------------------------------- context */

typedef struct fi_context fi_context;

typedef struct fi_context_options {
    uint32_t struct_size;
    fi_device_type device;
    int32_t device_id;   /* CUDA ordinal; ignored on the CPU */
    int32_t num_threads; /* CPU worker threads; 0 = one per online core */
    /* CPU SIMD level to use, by name: NULL or "auto" = best the CPU has,
     * else one of "avx512", "avx2", "neon", "generic" (for testing). */
    const char *cpu_simd;
} fi_context_options;

FI_API void fi_context_options_init(fi_context_options *options);
FI_API fi_status fi_context_create(const fi_context_options *options,
                                   fi_context **out);
/* Destroy plans, cascades and block-sparse objects first: with any of them
 * alive the context is only marked destroyed (refusing every call, on it and
 * on them) and freed by the last one's destroy; fi_last_error() says so. */
FI_API void fi_context_destroy(fi_context *ctx);
/* One line naming the backend, threads and SIMD level in use. */
FI_API const char *fi_context_describe(const fi_context *ctx);
/* Non-zero when the backend for `device` can be used on this machine. */
FI_API int32_t fi_device_available(fi_device_type device);

/* --------------------------------------------------------------- variants */
/* docs/VARIANTS.md: user-defined attention variants. A spec names extra
 * per-run parameters and gives C snippets (bodies of six hook functions);
 * fi_plan_create compiles the plan's kernel with the hooks spliced in (CPU:
 * the system C compiler into a cached shared object; CUDA: NVRTC into the
 * cubin cache). The built-in variants are specs of the same kind. */

#define FI_VARIANT_MAX_PARAMS 16

typedef enum fi_variant_param_kind {
    FI_VARIANT_PARAM_F32 = 0,    /* a float scalar, given per run */
    FI_VARIANT_PARAM_I32 = 1,    /* an int32 scalar, given per run */
    FI_VARIANT_PARAM_TENSOR = 2  /* a pointer to memory of `dtype` on the plan's
                                    device (host memory on the CPU), given per
                                    run; the hooks index it, nothing checks
                                    its extent */
} fi_variant_param_kind;

typedef struct fi_variant_param {
    const char *name;            /* C identifier; snippets read it as p.<name> */
    fi_variant_param_kind kind;
    fi_dtype dtype;              /* tensors: F32 (float), F16/BF16 (uint16_t raw
                                    bits: fi_f16()/fi_bf16() give the float),
                                    I32 (int32_t) or U8 (uint8_t); ignored
                                    for scalars */
} fi_variant_param;

/* Hooks: each snippet is the BODY of one function (valid C and CUDA C++):
 *   void  query_transform(float *x, const fi_hook_ctx *c, p)  x[c->head_dim] in/out
 *   void  key_transform  (float *x, const fi_hook_ctx *c, p)  c->q_pos not valid
 *   void  value_transform(float *x, const fi_hook_ctx *c, p)  idem
 *   float logits_transform(float s, const fi_hook_ctx *c, p)  s = sm_scale * q.k;
 *         returns the logit (softmax) or the weight (use_softmax = 0)
 *   int   logits_mask(const fi_hook_ctx *c, p)                non-zero = keep
 *   void  output_transform(float *o, float lse, const fi_hook_ctx *c, p)
 *         o[c->head_dim] in/out; lse natural log of the final state;
 *         c->kv_pos not valid
 * p is the parameter struct (p.<name>); fi_hook_ctx has request, qo_head,
 * kv_head, q_pos (kv_len - qo_len + i), kv_pos, qo_len, kv_len, head_dim,
 * sm_scale. NULL = identity. Math: expf logf tanhf sinf cosf powf sqrtf
 * fabsf fminf fmaxf exp2f log2f. Library helper for row hooks:
 * fi_rope_row(x, dim, pos, scale, theta) rotates x[dim] as LLaMA RoPE on
 * halves, pair k by (pos / scale) * theta^(-2k/dim) in f32 (on the GPU with
 * the fast sin/cos: error < 1e-6 beyond the f32 angle's own). */
typedef struct fi_variant_spec {
    uint32_t struct_size;
    const char *name;            /* C identifier (part of kernel names, cache keys) */
    const fi_variant_param *params; /* [num_params], names unique */
    int32_t num_params;          /* 0 .. FI_VARIANT_MAX_PARAMS */
    const char *query_transform;
    const char *key_transform;
    const char *value_transform;
    const char *logits_transform;
    const char *logits_mask;
    const char *output_transform;
    int32_t use_softmax;         /* 1 (default): softmax over the logits;
                                    0: o = sum_j logits_transform(s_j) * v_j
                                    (FlashSigmoid); LSE is written as 0 */
    const char *helpers;         /* optional: extra definitions (functions
                                    qualified FI_HOOK) the hooks may call */
} fi_variant_spec;

/* A validated copy of a spec. Immutable: one variant may serve any number of
 * plans and contexts at once. */
typedef struct fi_variant fi_variant;

FI_API void fi_variant_spec_init(fi_variant_spec *spec);
/* Validate `spec` (identifiers, parameter kinds and dtypes, sizes) and copy
 * it, strings included. Compilation happens at fi_plan_create. */
FI_API fi_status fi_variant_create(const fi_variant_spec *spec, fi_variant **out);
/* Accepts NULL and built-in variants (a no-op for those). Plans made with a
 * variant hold a reference to it: it may be destroyed before them, and is
 * freed with the last of them. A destroyed variant named in params is
 * refused ("not a live variant", best effort: the check reads the handle's
 * first word). */
FI_API void fi_variant_destroy(fi_variant *variant);
/* The built-in variants as specs: "none", "soft_cap" (f32 cap), "alibi"
 * (f32 tensor slopes[H_qo]), "sliding_window" (i32 window_left),
 * "custom_mask" (u8 tensor mask, i32 tensor mask_indptr[B+1] in bytes; bits as
 * fi_batch), "rope_llama" (f32 rope_scale, f32 rope_theta). Static: never
 * destroyed. */
FI_API fi_status fi_variant_builtin(const char *name, const fi_variant **out);
/* The variant's spec (strings owned by the variant). */
FI_API const fi_variant_spec *fi_variant_get_spec(const fi_variant *variant);

typedef enum fi_variant_target {
    FI_VARIANT_TARGET_C = 0,     /* C11, hooks `static inline` */
    FI_VARIANT_TARGET_CUDA = 1   /* CUDA C++ device code for NVRTC, hooks
                                    `__device__ __forceinline__` */
} fi_variant_target;

/* The hook text both backends splice into their kernels: fi_hook_ctx, the
 * parameter struct fi_variant_params, fi_f16/fi_bf16, the helpers, and the
 * six hooks fi_query_transform ... fi_output_transform. Writes at most
 * `size` bytes (NUL-terminated when size > 0) and returns the text's length,
 * as snprintf; 0 for a NULL variant. */
FI_API size_t fi_variant_source(const fi_variant *variant, fi_variant_target target,
                                char *buf, size_t size);

/* One per-run parameter value; `kind` must match the spec's. */
typedef struct fi_variant_value {
    fi_variant_param_kind kind;
    float f32;
    int32_t i32;
    const void *ptr;
} fi_variant_value;

/* The values of one run, in the spec's parameter order. */
typedef struct fi_variant_args {
    int32_t num_values;
    const fi_variant_value *values;
} fi_variant_args;

static inline fi_variant_value fi_variant_f32(float x) {
    fi_variant_value v = {FI_VARIANT_PARAM_F32, x, 0, NULL};
    return v;
}
static inline fi_variant_value fi_variant_i32(int32_t x) {
    fi_variant_value v = {FI_VARIANT_PARAM_I32, 0.0f, x, NULL};
    return v;
}
static inline fi_variant_value fi_variant_tensor(const void *ptr) {
    fi_variant_value v = {FI_VARIANT_PARAM_TENSOR, 0.0f, 0, ptr};
    return v;
}

/* ------------------------------------------------------- attention params */

/* The model-level facts that fix which kernel runs. */
typedef struct fi_attention_params {
    uint32_t struct_size;
    int32_t num_qo_heads;
    int32_t num_kv_heads;   /* num_qo_heads % num_kv_heads == 0 */
    int32_t head_dim_qk;    /* 64, 80, 96, 128, 192, 256, 512 (CPU and CUDA) */
    int32_t head_dim_vo;    /* idem, independently of head_dim_qk */
    fi_kv_format kv_format;
    int32_t page_size;      /* tokens per page (paged format) */
    fi_kv_layout kv_layout;
    fi_dtype q_dtype;       /* f32, f16, bf16 */
    fi_dtype kv_dtype;      /* f32, f16, bf16, e4m3, e5m2 */
    fi_dtype o_dtype;       /* f32, f16, bf16 */
    fi_mask_mode mask_mode;
    int32_t window_left;    /* -1 = no sliding window */
    float logits_soft_cap;  /* 0 = off; else logit = c * tanh(s * sm_scale / c) */
    float sm_scale;         /* 0 = 1 / sqrt(head_dim_qk) */
    fi_pos_encoding pos_encoding;
    float rope_scale;       /* positions are divided by rope_scale (default 1) */
    float rope_theta;       /* default 1e4 */
    /* ALiBi slopes per query head, host memory, copied at plan creation;
     * NULL = the standard geometric slopes. */
    const float *alibi_slopes;
    float k_scale;          /* dequantisation scale of FP8 K (default 1) */
    float v_scale;          /* dequantisation scale of FP8 V (default 1) */
    /* A user-defined variant (NULL = the built-ins chosen by the fields
     * above). With a variant, mask_mode, window_left, sm_scale and the FP8
     * scales still apply; pos_encoding must be FI_POS_NONE and
     * logits_soft_cap 0 (express them as hooks: fi_variant_builtin). Kept by
     * reference: it must outlive the plan. */
    const fi_variant *variant;
} fi_attention_params;

FI_API void fi_attention_params_init(fi_attention_params *params);

/* ------------------------------------------------------------------- plan */

typedef struct fi_plan fi_plan;

/* Upper bounds that size the plan's fixed workspace, and scheduling options. */
typedef struct fi_plan_config {
    uint32_t struct_size;
    int32_t max_batch_size;  /* requests */
    int32_t max_total_qo;    /* query tokens over the batch */
    int32_t max_total_kv;    /* pages (paged) or tokens (ragged) over the batch */
    int32_t num_workers;     /* 0 = the backend's choice (threads, or SMs x CTAs) */
    int32_t disable_split_kv;/* non-zero: one work item per (request, query tile) */
    /* > 0: split every KV span into chunks of exactly this many keys, so a
     * request's output bits do not depend on the rest of the batch. */
    int32_t fixed_split_size;
    /* Non-zero (paged KV): every fi_plan_update's batch->kv_indices is a
     * device address of the plan's context, as a serving engine keeps its
     * page table; see fi_plan_update. CPU: device memory is host memory, and
     * the flag changes nothing (every run checks the table either way). */
    int32_t device_page_table;
} fi_plan_config;

FI_API void fi_plan_config_init(fi_plan_config *config);

/* The batch: host memory, read during fi_plan_update (kv_indices: device
 * memory for a plan with fi_plan_config.device_page_table). The lengths are
 * copied into the plan's workspace; the page table kv_indices is referenced
 * (a host one also validated), not copied: keep it alive and unchanged until
 * the plan's last fi_plan_run (as with FlashInfer's plan), or call
 * fi_plan_update again. (The CPU backend checks the ids at every
 * fi_plan_run, so a table rewritten between runs is refused, not read out
 * of bounds; CUDA copies a host table at the update.) Every size computed
 * from a batch, a bound or a tensor is checked arithmetic: one that does
 * not fit is refused, never wrapped.
 *   qo_indptr[B+1]        query tokens of request i: [qo_indptr[i], qo_indptr[i+1])
 *   kv_indptr[B+1]        paged: pages; ragged: tokens
 *   kv_indices[nnz]       paged: page ids, kv_indptr[B] entries
 *   kv_last_page_len[B]   paged: in [1, page_size], 0 only for a request with no pages
 *   mask_indptr[B+1]      custom mask: byte offset of each request's bit matrix;
 *                         NULL = packed back to back, each segment byte-aligned. */
typedef struct fi_batch {
    int32_t batch_size;
    const int32_t *qo_indptr;
    const int32_t *kv_indptr;
    const int32_t *kv_indices;
    const int32_t *kv_last_page_len;
    const int32_t *mask_indptr;
} fi_batch;

/* Make a plan for attention with `params`, its workspace sized by `config`. */
FI_API fi_status fi_plan_create(fi_context *ctx, const fi_attention_params *params,
                                const fi_plan_config *config, fi_plan **out);
FI_API void fi_plan_destroy(fi_plan *plan);

/* Schedule a batch: validate it, tile and split it, assign work to workers.
 * Allocates nothing; a batch over a bound returns FI_STATUS_BOUND_EXCEEDED.
 *
 * A plan made with fi_plan_config.device_page_table takes the page table
 * batch->kv_indices in device memory (kv_indptr[B] entries, laid out as in
 * host memory; the other arrays stay in host memory). The host neither
 * reads nor copies it, so an update costs O(requests), not O(pages); the
 * kernels read it at every fi_plan_run: keep it alive, and rewrite it only
 * where the stream of the runs allows (a CUDA graph captured around
 * fi_plan_run reads it at replay, from the address of the latest update).
 * CUDA: its ids are not checked: the kernels clamp each to the pages the
 * K/V tensors hold, so a bad id yields wrong rows for its request, never an
 * access outside the cache; the entries must lie inside one device
 * allocation, 4-byte aligned (FI_STATUS_INVALID_ARGUMENT otherwise). CPU:
 * every fi_plan_run reads the table once (one vectorised pass over its
 * kv_indptr[B] ids) and refuses a run with an id that is negative or past
 * the K/V tensors, naming it (FI_STATUS_INVALID_ARGUMENT, nothing written),
 * so a table rewritten between runs is never read outside the cache. */
FI_API fi_status fi_plan_update(fi_plan *plan, const fi_batch *batch);

/* Bytes of workspace this plan holds (host, and device for CUDA). */
FI_API size_t fi_plan_workspace_size(const fi_plan *plan);

/* What the last fi_plan_update decided, for logs and benchmarks. */
typedef struct fi_plan_info {
    uint32_t struct_size;
    int32_t batch_size;
    int32_t num_workers;
    int32_t q_tile;          /* packed query rows per tile */
    int32_t kv_chunk;        /* keys per split chunk (0 = not split) */
    int32_t num_items;       /* work items */
    int32_t num_split_items; /* items that write a partial state */
    int32_t num_merge_rows;  /* output rows that merge partial states */
    double max_worker_cost;  /* the cost model's figure for the busiest worker */
    double total_cost;
} fi_plan_info;

FI_API void fi_plan_info_init(fi_plan_info *info);
FI_API fi_status fi_plan_get_info(const fi_plan *plan, fi_plan_info *info);

/* The last fi_plan_update's schedule per worker, for workers
 * [0, min(capacity, fi_plan_info.num_workers)): the work items it runs, how
 * many of them are split items (write a partial state), and the cost
 * model's load (the units of fi_plan_info's costs: the loads sum to
 * total_cost, the largest is max_worker_cost). Any of the three arrays may
 * be NULL; *num_workers (may be NULL) gets the plan's worker count. */
FI_API fi_status fi_plan_get_worker_loads(const fi_plan *plan, int32_t capacity,
                                          int32_t *num_items, int32_t *num_split_items,
                                          double *cost, int32_t *num_workers);

/* The tensors of one attention call (one layer). D_qk/D_vo are head dims.
 *   q    [total_q, H_qo, D_qk]                        q_dtype
 *   k, v paged NHD [pages, page_size, H_kv, D]        kv_dtype
 *        paged HND [pages, H_kv, page_size, D]
 *        ragged NHD [total_kv, H_kv, D], ragged HND [H_kv, total_kv, D]
 *   o    [total_q, H_qo, D_vo]                        o_dtype
 *   lse  [total_q, H_qo] f32, base 2; data NULL = not wanted
 *   custom_mask [mask bytes] u8, when mask_mode is FI_MASK_CUSTOM
 * stream: a cudaStream_t for the CUDA backend; ignored on the CPU. On
 * sm_90 and later the attention kernels are launched with programmatic
 * dependent launch: their CTAs may start while the kernel before them in
 * the stream ends, and wait for it before touching any tensor (the same
 * stream order as a plain launch); they also let a kernel after them that
 * was launched with that attribute start early, which must then wait in
 * its turn (cudaGridDependencySynchronize). FLASHINFER_CUDA_PDL=0 turns
 * it off. */
typedef struct fi_run_args {
    fi_tensor q;
    fi_tensor k;
    fi_tensor v;
    fi_tensor o;
    fi_tensor lse;
    fi_tensor custom_mask;
    void *stream;
    /* The variant's per-run values (plans with params.variant; NULL is
     * accepted for a variant without parameters). */
    const fi_variant_args *variant_args;
} fi_run_args;

FI_API fi_status fi_plan_run(fi_plan *plan, const fi_run_args *args);

/* ----------------------------------------------------------------- warmup */
/* Compile ahead of time the kernels a plan compiles at fi_plan_create, into
 * the on-disk cache its JIT looks in first ($FLASHINFER_CACHE_DIR, else
 * $XDG_CACHE_HOME/flashinfer-c, else ~/.cache/flashinfer-c; docs/VARIANTS.md),
 * e.g. on a build machine, or before a serving process starts; `fi warmup`
 * is these calls over lists of variants, head dims and dtypes. No context is
 * made, and no GPU is needed unless CUDA's target is left to device 0.
 * "That plan" below is a plan on `device` with
 * `params` and `config` (NULL = fi_plan_config_init's defaults; on CUDA the
 * kernels depend on device_page_table and max_total_qo):
 *  - CPU: a plan with params.variant compiles one shared object with the
 *    system C compiler; any other plan runs the built-in SIMD kernels and
 *    compiles nothing (an empty list). `arch` is ignored.
 *  - CUDA: the cubins NVRTC compiles for target `arch`, e.g. "sm_90a" for an
 *    H200 (letters, digits and '_'); NULL or "" = the target of CUDA device
 *    0, which needs the driver and a GPU. The cache key includes the NVRTC
 *    version: a cache filled here serves machines with that NVRTC version
 *    (where NVRTC does not load, files are listed for version 0.0, which no
 *    compile writes).
 *    Kernels a library built with `make aot` carries are listed as well (a
 *    plan takes those from the library, not the cache).
 *
 * The cache's security model (docs/VARIANTS.md, "The cache and its
 * security"): the directory is one of the locations above, or the home
 * directory of the user's passwd entry; with none of them (and
 * $FLASHINFER_CACHE_DIR, which must be absolute, unset) a CPU variant plan
 * fails with FI_STATUS_UNSUPPORTED and CUDA compiles without storing, never
 * into a shared directory. Missing directories are created 0700. Nothing is
 * loaded from a directory that is not owned by this user (or root) or that
 * others may write to, nor from one under a directory others may change
 * (unless sticky, as /tmp). Each file has a record of the SHA-256 key of
 * everything it was built from (sources, options, compiler or NVRTC
 * identity, CPU) and of its own bytes; a file whose record or bytes do not
 * match is rebuilt, not loaded. The C compiler ($FLASHINFER_CC, else $CC,
 * else cc, split into words at blanks; no shell, no quoting) runs by
 * posix_spawn. A path that does not fit its buffer (cache_path below
 * included) is an error, never truncated. */

/* The directory of that on-disk cache, as this process resolves it now
 * (nothing is created or checked): written NUL-terminated into buf (cut to
 * capacity - 1 characters); returns its full length, as snprintf does (buf
 * may be NULL with capacity 0). With no private location (see above) it
 * writes "" and returns 0, fi_last_error() saying why. */
FI_API size_t fi_cache_directory(char *buf, size_t capacity);

/* A plan compiles at most this many kernels. */
#define FI_WARMUP_MAX_KERNELS 16

/* One kernel of that plan. */
typedef struct fi_warmup_kernel {
    char name[128];        /* unique within the list; part of the file name */
    char arch[32];         /* its target: CUDA the NVRTC one, CPU "native" */
    char cache_path[1024]; /* its file in the cache (a longer one is an error) */
    int32_t cached;        /* non-zero: that file exists already */
} fi_warmup_kernel;

/* FI_OK when this process can compile `device`'s kernels (CPU: the C
 * compiler, $FLASHINFER_CC else $CC else cc, is found; CUDA: NVRTC loads),
 * else FI_STATUS_UNSUPPORTED, and fi_last_error() says what is missing. */
FI_API fi_status fi_warmup_check(fi_device_type device);

/* The kernels of that plan, in a fixed order: *count gets how many there
 * are, kernels[0 .. min(*count, capacity)) their descriptions (kernels may
 * be NULL when capacity is 0). CPU: describing a variant's object needs the
 * C compiler (its identity is part of the key): FI_STATUS_UNSUPPORTED
 * without one. */
FI_API fi_status fi_warmup_list(fi_device_type device, const fi_attention_params *params,
                                const fi_plan_config *config, const char *arch,
                                fi_warmup_kernel *kernels, int32_t capacity,
                                int32_t *count);

/* Compile kernel `index` of fi_warmup_list's list into the cache, unless its
 * file is there already; *was_cached (may be NULL) says which. Calls for
 * different kernels may run at once, in threads or processes (files are
 * written through a temporary name): `fi warmup -j N` does so. */
FI_API fi_status fi_warmup_compile(fi_device_type device, const fi_attention_params *params,
                                   const fi_plan_config *config, const char *arch,
                                   int32_t index, int32_t *was_cached);

/* --------------------------------------------------- attention state ops */

/* Merge two attention states over disjoint key sets. A state with LSE -inf
 * is not read; one with LSE NaN or +inf makes the row's O and LSE NaN; the
 * others are read whatever their weight, their O in IEEE arithmetic, and
 * finite states never overflow to an infinity (docs/SEMANTICS.md). v_out
 * may be v_a (s_out s_a) as the very same view.
 *   v_a, v_b, v_out [n, H, D]  f32/f16/bf16
 *   s_a, s_b, s_out [n, H]     f32 (LSE, base 2) */
FI_API fi_status fi_merge_state(fi_context *ctx, const fi_tensor *v_a,
                                const fi_tensor *s_a, const fi_tensor *v_b,
                                const fi_tensor *s_b, fi_tensor *v_out,
                                fi_tensor *s_out, void *stream);

/* v, s <- merge((v, s), (v_other, s_other)) for the rows where mask[i] != 0
 * (mask: [n] u8, data NULL = every row).
 *   v, v_other [n, H, D]; s, s_other [n, H] f32 */
FI_API fi_status fi_merge_state_in_place(fi_context *ctx, fi_tensor *v,
                                         fi_tensor *s, const fi_tensor *v_other,
                                         const fi_tensor *s_other,
                                         const fi_tensor *mask, void *stream);

/* Merge num_states states per row, in index order.
 *   v [n, num_states, H, D]; s [n, num_states, H] f32
 *   v_out [n, H, D]; s_out [n, H] f32 */
FI_API fi_status fi_merge_states(fi_context *ctx, const fi_tensor *v,
                                 const fi_tensor *s, fi_tensor *v_out,
                                 fi_tensor *s_out, void *stream);

/* ---------------------------------------------------------- paged KV ops */

/* Write new tokens' K/V into their pages.
 *   append_k, append_v [nnz, H_kv, D]   same dtype as the cache
 *   batch_indices [nnz] i32, positions [nnz] i32 (position within request)
 *   k_cache, v_cache  paged NHD/HND as in fi_run_args
 *   kv_indices [pages] i32, kv_indptr [B+1] i32, kv_last_page_len [B] i32
 *   (the table after the append: it already counts the new tokens). */
FI_API fi_status fi_append_paged_kv_cache(
    fi_context *ctx, const fi_tensor *append_k, const fi_tensor *append_v,
    const fi_tensor *batch_indices, const fi_tensor *positions,
    fi_tensor *k_cache, fi_tensor *v_cache, fi_kv_layout layout,
    const fi_tensor *kv_indices, const fi_tensor *kv_indptr,
    const fi_tensor *kv_last_page_len, void *stream);

/* ------------------------------------------------------------------- RoPE */

typedef struct fi_rope_params {
    uint32_t struct_size;
    int32_t rotary_dim;   /* 0 = head_dim: rotate the first rotary_dim dims */
    int32_t interleave;   /* 0: halves (x[i], x[i+d/2]); 1: pairs (x[2i], x[2i+1]) */
    float rope_scale;     /* default 1 */
    float rope_theta;     /* default 1e4 */
    /* LLaMA-3.1 frequency scaling; off when llama31 == 0. */
    int32_t llama31;
    float low_freq_factor;        /* default 1 */
    float high_freq_factor;       /* default 4 */
    float old_context_len;        /* default 8192 */
} fi_rope_params;

FI_API void fi_rope_params_init(fi_rope_params *params);

/* RoPE on q and k; token t of request i is at position
 * offsets[i] + (t - indptr[i]). In place when q_out == q (k_out == k).
 *   q, q_out [nnz, H_qo, D]; k, k_out [nnz, H_kv, D]   f32/f16/bf16
 *   indptr [B+1] i32, offsets [B] i32 */
FI_API fi_status fi_rope_apply(fi_context *ctx, const fi_rope_params *params,
                               const fi_tensor *q, const fi_tensor *k,
                               fi_tensor *q_out, fi_tensor *k_out,
                               const fi_tensor *indptr, const fi_tensor *offsets,
                               void *stream);

/* RoPE on q and k with explicit positions.
 *   q, q_out [nnz, H_qo, D]; k, k_out [nnz, H_kv, D]; pos_ids [nnz] i32 */
FI_API fi_status fi_rope_apply_pos_ids(fi_context *ctx, const fi_rope_params *params,
                                       const fi_tensor *q, const fi_tensor *k,
                                       fi_tensor *q_out, fi_tensor *k_out,
                                       const fi_tensor *pos_ids, void *stream);

/* ------------------------------------------------------------ serving ops */
/* The rest of a serving step, under FlashInfer's names (docs/SEMANTICS.md,
 * "Serving ops"): normalization, gated activations, softmax, sampling and
 * top-k. Inputs f32/f16/bf16 unless said otherwise, arithmetic in f32.
 * "[rows..., H]" is any rank >= 1 whose last dimension is H: every leading
 * index is one row, any strides. Where a per-request parameter comes as
 * (tensor, value), the tensor ([batch], data non-NULL) wins over the
 * value, which serves every row when the tensor is NULL or has NULL data.
 * Sampling is reproducible: the draws of a call are a function of (seed,
 * offset, output row, draw number) only (Philox4x32-10), so the same call
 * gives the same tokens whatever the thread count or SIMD level; advance
 * `offset` (by 1 is enough) between calls that must differ. */

/* RMSNorm: out = x / sqrt(mean(x^2) + eps) * weight.
 *   input, out [rows..., H]; weight [H] (any float dtype each) */
FI_API fi_status fi_rmsnorm(fi_context *ctx, const fi_tensor *input, const fi_tensor *weight,
                            float eps, fi_tensor *out, void *stream);
/* Gemma's RMSNorm: the weight applied as (1 + weight). Shapes as fi_rmsnorm. */
FI_API fi_status fi_gemma_rmsnorm(fi_context *ctx, const fi_tensor *input,
                                  const fi_tensor *weight, float eps, fi_tensor *out,
                                  void *stream);
/* In place: residual += input (the f32 sum, stored rounded to residual's
 * dtype), then input = rmsnorm(sum) * weight; each tensor read once and
 * written once.
 *   input, residual [rows..., H]; weight [H] */
FI_API fi_status fi_fused_add_rmsnorm(fi_context *ctx, fi_tensor *input, fi_tensor *residual,
                                      const fi_tensor *weight, float eps, void *stream);
/* fi_fused_add_rmsnorm with the weight applied as (1 + weight). */
FI_API fi_status fi_gemma_fused_add_rmsnorm(fi_context *ctx, fi_tensor *input,
                                            fi_tensor *residual, const fi_tensor *weight,
                                            float eps, void *stream);
/* LayerNorm: out = (x - mean) / sqrt(var + eps) * gamma + beta (biased var).
 *   input, out [rows..., H]; gamma, beta [H] */
FI_API fi_status fi_layernorm(fi_context *ctx, const fi_tensor *input, const fi_tensor *gamma,
                              const fi_tensor *beta, float eps, fi_tensor *out, void *stream);
/* RMSNorm into FP8: out = fp8(clamp(rmsnorm(x) * weight / scale, +-max)),
 * max 448 (E4M3) or 57344 (E5M2), rounded to nearest even; scale > 0.
 *   input [rows..., H]; weight [H]; out [rows..., H] e4m3/e5m2 */
FI_API fi_status fi_rmsnorm_quant(fi_context *ctx, const fi_tensor *input,
                                  const fi_tensor *weight, float scale, float eps,
                                  fi_tensor *out, void *stream);
/* residual += input (in place, as fi_fused_add_rmsnorm), then out = the
 * FP8 RMSNorm of the sum as fi_rmsnorm_quant; input is only read.
 *   input, residual [rows..., H]; weight [H]; out [rows..., H] e4m3/e5m2 */
FI_API fi_status fi_fused_add_rmsnorm_quant(fi_context *ctx, const fi_tensor *input,
                                            fi_tensor *residual, const fi_tensor *weight,
                                            float scale, float eps, fi_tensor *out,
                                            void *stream);

/* Gated activations: out = act(x[..., :d]) * x[..., d:].
 *   input [rows..., 2d]; out [rows..., d]
 * silu(a) = a / (1 + e^-a); gelu(a) = a/2 (1 + erf(a / sqrt 2));
 * gelu_tanh(a) = a/2 (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3))). */
FI_API fi_status fi_silu_and_mul(fi_context *ctx, const fi_tensor *input, fi_tensor *out,
                                 void *stream);
FI_API fi_status fi_gelu_and_mul(fi_context *ctx, const fi_tensor *input, fi_tensor *out,
                                 void *stream);
FI_API fi_status fi_gelu_tanh_and_mul(fi_context *ctx, const fi_tensor *input,
                                      fi_tensor *out, void *stream);

/* probs = softmax(logits / temperature) per row; temperature > 0.
 *   logits [B, V]; temperature [B] f32 or (NULL, temperature_val);
 *   probs [B, V] (f32 as FlashInfer, or f16/bf16) */
FI_API fi_status fi_softmax(fi_context *ctx, const fi_tensor *logits,
                            const fi_tensor *temperature, float temperature_val,
                            fi_tensor *probs, void *stream);

/* How top-k and top-p combine (fi_top_k_top_p_sampling_*). */
typedef enum fi_filter_order {
    FI_FILTER_TOP_K_FIRST = 0, /* top-k, renormalise, then top-p over what is left */
    FI_FILTER_JOINT = 1        /* tokens that pass both filters on the whole row */
} fi_filter_order;

/* Sampling. Output b draws from row indices[b] of the input (indices [B]
 * i32 in [0, R); NULL or data NULL: row b, B = R). samples [B] i32;
 * valid [B] u8 (data NULL = not wanted): 1 when the row's (filtered)
 * distribution had positive finite mass, else 0 and sample 0. probs must
 * be >= 0 and need not sum to 1 (they are drawn in proportion); logits
 * are drawn as softmax(logits). Per-row parameters are indexed by b:
 *   top_k [B] i32 (k <= 0 or >= V: no top-k filter)
 *   top_p [B] f32 in [0, 1] (1: no filter; 0: the largest only)
 *   min_p [B] f32 in [0, 1]
 * Filters (ties at the boundary are all kept): top-k keeps p_i with fewer
 * than k larger values; top-p keeps p_i when the mass of larger values is
 * < top_p x the row's mass; min-p keeps p_i >= min_p x max p.
 *   probs, logits [R, V] */
FI_API fi_status fi_sampling_from_probs(fi_context *ctx, const fi_tensor *probs,
                                        const fi_tensor *indices, uint64_t seed,
                                        uint64_t offset, fi_tensor *samples,
                                        fi_tensor *valid, void *stream);
FI_API fi_status fi_sampling_from_logits(fi_context *ctx, const fi_tensor *logits,
                                         const fi_tensor *indices, uint64_t seed,
                                         uint64_t offset, fi_tensor *samples,
                                         fi_tensor *valid, void *stream);
FI_API fi_status fi_top_k_sampling_from_probs(fi_context *ctx, const fi_tensor *probs,
                                              const fi_tensor *indices,
                                              const fi_tensor *top_k, int32_t top_k_val,
                                              uint64_t seed, uint64_t offset,
                                              fi_tensor *samples, fi_tensor *valid,
                                              void *stream);
FI_API fi_status fi_top_p_sampling_from_probs(fi_context *ctx, const fi_tensor *probs,
                                              const fi_tensor *indices,
                                              const fi_tensor *top_p, float top_p_val,
                                              uint64_t seed, uint64_t offset,
                                              fi_tensor *samples, fi_tensor *valid,
                                              void *stream);
FI_API fi_status fi_min_p_sampling_from_probs(fi_context *ctx, const fi_tensor *probs,
                                              const fi_tensor *indices,
                                              const fi_tensor *min_p, float min_p_val,
                                              uint64_t seed, uint64_t offset,
                                              fi_tensor *samples, fi_tensor *valid,
                                              void *stream);
FI_API fi_status fi_top_k_top_p_sampling_from_probs(
    fi_context *ctx, const fi_tensor *probs, const fi_tensor *indices,
    const fi_tensor *top_k, int32_t top_k_val, const fi_tensor *top_p, float top_p_val,
    fi_filter_order order, uint64_t seed, uint64_t offset, fi_tensor *samples,
    fi_tensor *valid, void *stream);
/* From logits, top-k ranks the logits; top-p then applies to the softmax
 * of what top-k kept (TOP_K_FIRST) or of the whole row (JOINT). */
FI_API fi_status fi_top_k_top_p_sampling_from_logits(
    fi_context *ctx, const fi_tensor *logits, const fi_tensor *indices,
    const fi_tensor *top_k, int32_t top_k_val, const fi_tensor *top_p, float top_p_val,
    fi_filter_order order, uint64_t seed, uint64_t offset, fi_tensor *samples,
    fi_tensor *valid, void *stream);

/* The filtered distribution itself: kept probs divided by their sum, the
 * others 0 (a row with no mass stays 0; a row with a negative or NaN
 * value becomes NaN). out may be probs (the same view: in place).
 *   probs, out [B, V]; top_k [B] i32; top_p [B] f32 */
FI_API fi_status fi_top_k_renorm_probs(fi_context *ctx, const fi_tensor *probs,
                                       const fi_tensor *top_k, int32_t top_k_val,
                                       fi_tensor *out, void *stream);
FI_API fi_status fi_top_p_renorm_probs(fi_context *ctx, const fi_tensor *probs,
                                       const fi_tensor *top_p, float top_p_val,
                                       fi_tensor *out, void *stream);
/* Logits outside the top-k become -inf, the others are copied bit for bit.
 *   logits, out [B, V] (same dtype); out may be logits (in place) */
FI_API fi_status fi_top_k_mask_logits(fi_context *ctx, const fi_tensor *logits,
                                      const fi_tensor *top_k, int32_t top_k_val,
                                      fi_tensor *out, void *stream);

/* Chain speculative sampling (FlashInfer's): draft token i of request b is
 * accepted when u * draft_probs[b,i,t] < target_probs[b,i,t] (t its id, u
 * uniform in [0, 1)); the first rejected position j gets a token drawn
 * from max(target - draft, 0) at j (the target row when that is all 0),
 * and when all n are accepted a bonus token is drawn from target_probs[b,n].
 *   draft_probs [B, n, V]; draft_token_ids [B, n] i32 in [0, V);
 *   target_probs [B, n+1, V]
 *   output_token_ids [B, n+1] i32: the accepted drafts, the drawn token,
 *     then -1
 *   accepted_num [B] i32 += the positions accepted each on its own
 *   emitted_num [B] i32 += the drafts emitted (before the first rejection)
 *   (either may have data NULL: not wanted) */
FI_API fi_status fi_chain_speculative_sampling(
    fi_context *ctx, const fi_tensor *draft_probs, const fi_tensor *draft_token_ids,
    const fi_tensor *target_probs, uint64_t seed, uint64_t offset,
    fi_tensor *output_token_ids, fi_tensor *accepted_num, fi_tensor *emitted_num,
    void *stream);

/* The k largest values of each row, sorted (descending value, ties by
 * smaller index; NaN above +inf). Row r holds its first lengths[r] columns
 * (lengths [R] i32 in [0, N], NULL or data NULL: all N); offsets [R] i32
 * (NULL: 0) are added to the indices written; slots past a row's length
 * get index -1 and value -inf.
 *   input [R, N]; values [R, k] same dtype (data NULL = not wanted);
 *   indices [R, k] i32; k >= 1 */
FI_API fi_status fi_top_k(fi_context *ctx, const fi_tensor *input, int32_t k,
                          const fi_tensor *lengths, const fi_tensor *offsets,
                          fi_tensor *values, fi_tensor *indices, void *stream);
/* The same over ragged rows: row r is input[indptr[r] .. indptr[r+1]);
 * indices are positions within the row.
 *   input [nnz]; indptr [R+1] i32; values, indices [R, k] */
FI_API fi_status fi_top_k_ragged(fi_context *ctx, const fi_tensor *input,
                                 const fi_tensor *indptr, int32_t k, fi_tensor *values,
                                 fi_tensor *indices, void *stream);

/* RoPE from a precomputed cos/sin cache, the form vLLM and SGLang call
 * (FlashInfer's apply_rope_with_cos_sin_cache): token t turns by row
 * positions[t] of the cache, cos_sin_cache[p] = (cos[0 .. R/2), sin[0 ..
 * R/2)) for rotary_dim R (even, <= D). is_neox non-zero: pair i is (x[i],
 * x[i + R/2]); 0: (x[2i], x[2i+1]) (GPT-J). Dimensions past R are copied.
 * In place when q_out == q (k_out == k), as the same views.
 *   positions [nnz] i32 in [0, max_pos); cos_sin_cache [max_pos, R] f32
 *   q, q_out [nnz, H_qo, D]; k, k_out [nnz, H_kv, D]   f32/f16/bf16 */
FI_API fi_status fi_rope_apply_cos_sin_cache(fi_context *ctx, const fi_tensor *positions,
                                             const fi_tensor *q, const fi_tensor *k,
                                             const fi_tensor *cos_sin_cache, int32_t is_neox,
                                             fi_tensor *q_out, fi_tensor *k_out,
                                             void *stream);

/* Per-head RMSNorm of q and k, then RoPE from a cos/sin cache, in one pass
 * (the QK norm of Qwen3, Gemma 3 and OLMo 2 before attention): each head
 * row x [D] becomes n = x / sqrt(mean(x^2) + eps) * w (w = q_weight for q,
 * k_weight for k, one weight for every head; the gemma form applies 1 + w),
 * in f32; then the first rotary_dim R dims of n turn as in
 * fi_rope_apply_cos_sin_cache and the rest are n itself; the result is
 * rounded once, at the store. q and k may be views into one packed qkv
 * tensor (v is never touched); q_out == q and k_out == k (the same views)
 * write in place, any other overlap is refused. A position outside the
 * cache is refused on the CPU; on CUDA its token is not written.
 *   positions [nnz] i32 in [0, max_pos); cos_sin_cache [max_pos, R] f32
 *   q, q_out [nnz, H_qo, D]; k, k_out [nnz, H_kv, D]   f32/f16/bf16
 *   q_weight, k_weight [D] f32/f16/bf16; eps finite, >= 0 */
FI_API fi_status fi_qk_rmsnorm_rope(fi_context *ctx, const fi_tensor *positions,
                                    const fi_tensor *q, const fi_tensor *k,
                                    const fi_tensor *q_weight, const fi_tensor *k_weight,
                                    float eps, const fi_tensor *cos_sin_cache, int32_t is_neox,
                                    fi_tensor *q_out, fi_tensor *k_out, void *stream);
FI_API fi_status fi_gemma_qk_rmsnorm_rope(fi_context *ctx, const fi_tensor *positions,
                                          const fi_tensor *q, const fi_tensor *k,
                                          const fi_tensor *q_weight, const fi_tensor *k_weight,
                                          float eps, const fi_tensor *cos_sin_cache,
                                          int32_t is_neox, fi_tensor *q_out, fi_tensor *k_out,
                                          void *stream);

/* RoPE + FP8 quantize (+ append to a paged FP8 KV cache) in one pass, the
 * form of FlashInfer's rope_quantize_fp8 and
 * rope_quantize_fp8_append_paged_kv_cache that MLA and GQA engines call.
 * Token t turns by row pos_ids[t] of cos_sin_cache [max_pos, R] (cos in
 * the first R/2 columns, sin in the rest; pair i is (x[i], x[i + R/2])
 * when is_neox, else (x[2i], x[2i+1])), in f32, then every value is
 * multiplied by its scale and stored as FP8 (round to nearest even,
 * saturated to +-448 (E4M3) / +-57344 (E5M2), NaN stays NaN, as
 * fi_rmsnorm_quant stores):
 *   q_rope_out = fp8(rope(q_rope) * quant_scale_q)
 *   q_nope_out = fp8(q_nope * quant_scale_q)
 *   K rope     = fp8(rope(k_rope) * quant_scale_kv)
 *   K nope     = fp8(k_nope * quant_scale_kv),  V = fp8(v * quant_scale_kv)
 * A tensor pointer that is NULL, or whose data is NULL, is absent. Inputs
 * share one dtype (f32/f16/bf16); every FP8 output (and cache) one FP8
 * dtype; any strides (outputs may be slices of one [.., R + N] tensor).
 *   q_rope [nnz, H_q, R]; q_nope [nnz, H_q, N_q] or absent (N_q = 0)
 *   k_rope [nnz, H_k, R] (GQA/MHA) or [nnz, R] (MLA: one latent head)
 *   k_nope [nnz, H_k, N_k] / MLA [nnz, N_k], or absent (N_k = 0)
 *   cos_sin_cache [max_pos, R] f32; pos_ids [nnz] i32 in [0, max_pos)
 * fi_rope_quantize_fp8 writes q_rope_out, q_nope_out (present iff q_nope),
 * k_rope_out, k_nope_out (present iff k_nope), each the shape of its
 * input. fi_rope_quantize_fp8_append_paged_kv_cache writes Q the same way
 * and K/V into the cache: token t of request b = batch_indices[t] at
 * position p = positions[t] goes to page kv_indices[kv_indptr[b] + p /
 * page_size], slot p % page_size.
 *   GQA/MHA (k_rope 3-D): v [nnz, H_k, D_v]; k_cache [pages, page_size,
 *     H_k, R + N_k] (NHD) or [pages, H_k, page_size, R + N_k] (HND) holds
 *     (rope K | nope K); v_cache the same with D_v
 *   MLA (k_rope 2-D, v absent): ckv_cache [pages, page_size, N_k] holds
 *     nope K, kpe_cache [pages, page_size, R] rope K; k_nope required
 *   batch_indices, positions [nnz] i32; kv_indptr [B+1] i32 (pages);
 *   kv_indices [num_indices] i32 in [0, pages)
 * On the CPU every index is checked (FI_STATUS_INVALID_ARGUMENT names it);
 * on CUDA a token whose pos_id is outside the cache writes nothing, and
 * one whose request, position or page id is outside the table skips its
 * K/V write (its Q is still written), as fi_append_paged_kv_cache skips. */
typedef struct fi_rope_quant_args {
    uint32_t struct_size;
    const fi_tensor *q_rope, *q_nope, *k_rope, *k_nope, *v;
    const fi_tensor *cos_sin_cache, *pos_ids;
    int32_t is_neox;            /* default 1 */
    float quant_scale_q;        /* default 1; finite, > 0 */
    float quant_scale_kv;       /* default 1; finite, > 0 */
    fi_tensor *q_rope_out, *q_nope_out;
    fi_tensor *k_rope_out, *k_nope_out; /* fi_rope_quantize_fp8 only */
    /* fi_rope_quantize_fp8_append_paged_kv_cache only */
    fi_tensor *k_cache, *v_cache;       /* GQA/MHA */
    fi_tensor *ckv_cache, *kpe_cache;   /* MLA */
    fi_kv_layout layout;                /* GQA/MHA caches; default NHD */
    const fi_tensor *kv_indices, *kv_indptr, *batch_indices, *positions;
} fi_rope_quant_args;

FI_API void fi_rope_quant_args_init(fi_rope_quant_args *args);
FI_API fi_status fi_rope_quantize_fp8(fi_context *ctx, const fi_rope_quant_args *args,
                                      void *stream);
FI_API fi_status fi_rope_quantize_fp8_append_paged_kv_cache(fi_context *ctx,
                                                            const fi_rope_quant_args *args,
                                                            void *stream);

/* ---------------------------------------------------- composable formats */
/* docs/CASCADE.md: cascades (levels of shared KV merged exactly) and
 * block-sparse attention, both lowered onto plans and the state merge. */

#define FI_CASCADE_MAX_LEVELS 8
/* Levels an automatic cascade may build: shared prefix levels of a radix
 * tree (a global prefix, group prefixes, ...) plus the unique suffixes. */
#define FI_CASCADE_AUTO_MAX_LEVELS 4

typedef struct fi_cascade fi_cascade;

/* Automatic shared-prefix detection (fi_cascade_create_auto). */
typedef enum fi_prefix_detection {
    FI_PREFIX_DETECTION_AUTO = 0,   /* split when the cost model says it pays */
    FI_PREFIX_DETECTION_OFF = 1,    /* never split: exactly the single format */
    FI_PREFIX_DETECTION_ALWAYS = 2  /* split whenever a full page is shared */
} fi_prefix_detection;

typedef struct fi_cascade_options {
    uint32_t struct_size;
    fi_prefix_detection prefix_detection; /* fi_cascade_create_auto only */
    /* Memory for the levels' partial states, fi_cascade_workspace_size()
     * bytes, 64-byte aligned, on the context's device (device memory for
     * CUDA). NULL = the cascade allocates it at creation, on either backend.
     * Kept until fi_cascade_destroy. */
    void *workspace;
    size_t workspace_bytes;
} fi_cascade_options;

FI_API void fi_cascade_options_init(fi_cascade_options *options);

/* Bytes of partial-state workspace a cascade of num_levels levels
 * (FI_CASCADE_AUTO_MAX_LEVELS for an automatic one) over at most max_total_qo query tokens needs:
 * f32 O and LSE per level and token, and one f32 LSE per token. */
FI_API size_t fi_cascade_workspace_size(const fi_attention_params *params,
                                        int32_t num_levels, int32_t max_total_qo);

/* A cascade of num_levels levels over one paged KV pool, one plan per level
 * made here. Level l reads level_configs[l]'s bounds (and its num_workers,
 * split options). Every level but the last is non-causal with no window;
 * the mask mode, window and custom mask of `params` apply to the last level.
 * Fused RoPE and ALiBi need each key's absolute position, which a shared
 * level does not have: with num_levels > 1 they are FI_STATUS_UNSUPPORTED
 * (apply RoPE with fi_rope_apply before). params->kv_format must be paged.
 *   level_configs [num_levels], num_levels in [1, FI_CASCADE_MAX_LEVELS]
 *   options may be NULL (defaults) */
FI_API fi_status fi_cascade_create(fi_context *ctx, const fi_attention_params *params,
                                   int32_t num_levels,
                                   const fi_plan_config *level_configs,
                                   const fi_cascade_options *options,
                                   fi_cascade **out);

/* A cascade built from plain paged batches (fi_cascade_update_batch): it
 * finds runs of consecutive requests whose page tables start with the same
 * full pages, as a radix tree (runs sharing a global prefix, runs inside
 * them sharing more, ...), and splits the batch into up to
 * FI_CASCADE_AUTO_MAX_LEVELS - 1 shared-prefix levels and a unique-suffix
 * level when options->prefix_detection and the cost model say so.
 * `config` bounds the plain batch. */
FI_API fi_status fi_cascade_create_auto(fi_context *ctx, const fi_attention_params *params,
                                        const fi_plan_config *config,
                                        const fi_cascade_options *options,
                                        fi_cascade **out);
FI_API void fi_cascade_destroy(fi_cascade *cascade);

/* Plan every level (fi_cascade_create cascades). Host memory, as fi_batch.
 *   levels [num_levels]: each level's qo_indptr covers the same query tokens
 *   (qo_indptr[B_l] equal across levels; a level's request may have no
 *   pages); each level's page table indexes the same K/V pool. Query token
 *   t's keys are, in order, its level-0 request's keys, then level 1's ... */
FI_API fi_status fi_cascade_update(fi_cascade *cascade, const fi_batch *levels);

/* Plan a plain paged batch (fi_cascade_create_auto cascades): detect shared
 * prefixes, decide, plan. The page table is read here and copied (split) or
 * referenced (not split: keep it alive as for fi_plan_update). */
FI_API fi_status fi_cascade_update_batch(fi_cascade *cascade, const fi_batch *batch);

/* Attention over every level, merged in level order. Tensors as fi_run_args
 * (k, v: the paged pool every level indexes); custom_mask goes to the last
 * level. Allocates nothing. */
FI_API fi_status fi_cascade_run(fi_cascade *cascade, const fi_run_args *args);

/* What the last update decided. */
typedef struct fi_cascade_info {
    uint32_t struct_size;
    int32_t num_levels;       /* levels run (1 when an automatic cascade did not split) */
    int32_t split;            /* automatic: non-zero when split into prefixes + suffix */
    int32_t num_groups;       /* automatic: groups of >= 2 requests sharing pages,
                                 over every shared level */
    int64_t saved_page_reads; /* automatic: sum over groups of (members - 1) x shared pages */
    double cost_single;       /* automatic: the cost model's figure, one level */
    double cost_cascade;      /* automatic: prefix + suffix levels + merge */
} fi_cascade_info;

FI_API void fi_cascade_info_init(fi_cascade_info *info);
FI_API fi_status fi_cascade_get_info(const fi_cascade *cascade, fi_cascade_info *info);

/* Block-sparse attention over one sequence of M query tokens and N keys.
 * Lowered onto a paged plan: a block row is a request, its non-zero blocks
 * its pages (page_size = C over K/V viewed as [blocks, C, H_kv, D]), the
 * element mask its custom mask; variable blocks: one plan per KV head. */
typedef struct fi_bsr fi_bsr;

typedef struct fi_bsr_config {
    uint32_t struct_size;
    int32_t block_rows;       /* R: query rows per block (fixed blocks) */
    int32_t block_cols;       /* C: keys per block (C = 1: vector-sparse) */
    int32_t max_qo_len;       /* M bound */
    int32_t max_kv_len;       /* N bound */
    /* Fixed: non-zero blocks; variable: key pages (keys / col_granularity)
     * over all block rows of one KV head. 0 = the dense worst case. */
    int32_t max_nnz;
    int32_t element_mask;     /* non-zero: updates carry a per-block element mask */
    int32_t variable_blocks;  /* non-zero: per-KV-head variable block sizes */
    int32_t max_block_rows;   /* variable: bound on block rows (0 = max_qo_len) */
    int32_t col_granularity;  /* variable: every column block size is a multiple
                                 of it (default 1) */
    int32_t num_workers;      /* 0 = the backend's choice */
} fi_bsr_config;

FI_API void fi_bsr_config_init(fi_bsr_config *config);

/* params: heads, head dims, dtypes, soft-cap, sm_scale. K/V are
 * [N, H_kv, D] (kv_format, page_size, kv_layout are ignored); mask_mode must
 * be FI_MASK_NONE, window_left -1 and pos_encoding FI_POS_NONE (the pattern
 * is the mask; positions are not those of a dense sequence per block row). */
FI_API fi_status fi_bsr_create(fi_context *ctx, const fi_attention_params *params,
                               const fi_bsr_config *config, fi_bsr **out);
FI_API void fi_bsr_destroy(fi_bsr *bsr);

/* Fixed R x C blocks (host memory, read here; indices referenced until the
 * next update, as a page table).
 *   indptr [MB+1], MB = ceil(qo_len / R)
 *   indices [indptr[MB]] block columns in [0, ceil(kv_len / C)), strictly
 *     increasing within a block row
 *   block_mask [indptr[MB], R, C] u8 (non-zero = visible), or NULL = full
 *     blocks; only with config.element_mask */
FI_API fi_status fi_bsr_update(fi_bsr *bsr, int32_t qo_len, int32_t kv_len,
                               const int32_t *indptr, const int32_t *indices,
                               const uint8_t *block_mask);

/* Variable block sizes per KV head (config.variable_blocks), host memory.
 *   block_row_sz [H_kv, MB]  each row sums to qo_len
 *   block_col_sz [H_kv, NB]  each row sums to kv_len, multiples of col_granularity
 *   block_mask_map [H_kv, MB, NB] u8, non-zero = block (r, c) is read */
FI_API fi_status fi_bsr_update_variable(fi_bsr *bsr, int32_t qo_len, int32_t kv_len,
                                        int32_t num_block_rows, int32_t num_block_cols,
                                        const int32_t *block_row_sz,
                                        const int32_t *block_col_sz,
                                        const uint8_t *block_mask_map);

/* The packed element mask the last fi_bsr_update built, in host memory
 * (NULL, 0 without one). fi_bsr_update also copies it into the bsr's own
 * backend memory (device memory on CUDA, allocated at fi_bsr_create), which
 * fi_bsr_run uses unless args->custom_mask is given. */
FI_API fi_status fi_bsr_packed_mask(const fi_bsr *bsr, const uint8_t **bits,
                                    int64_t *bytes);

/*   q [M, H_qo, D_qk]; k [N, H_kv, D_qk]; v [N, H_kv, D_vo]
 *   o [M, H_qo, D_vo]; lse [M, H_qo] f32 (data NULL = not wanted)
 *   custom_mask: data NULL = the packed mask held by the bsr (any backend) */
FI_API fi_status fi_bsr_run(fi_bsr *bsr, const fi_run_args *args);

#ifdef __cplusplus
}
#endif

#endif /* FLASHINFER_H */
