/*
 * internal.h — what the core and the backends share: errors, the context,
 * the backend table, the validated plan and its schedule. Not installed.
 */
#ifndef FI_INTERNAL_H
#define FI_INTERNAL_H

#include "flashinfer.h"
#include "core/serving.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define FI_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define FI_PRINTF(a, b)
#endif

/* ------------------------------------------------------------------ errors */

/* Record a message for fi_last_error() and return `status`. */
fi_status fi_error(fi_status status, const char *fmt, ...) FI_PRINTF(2, 3);
void fi_error_clear(void);

/* ----------------------------------------------------------------- handles */

/* Every object the API hands out (context, plan, cascade, block-sparse)
 * starts with one of these words while it is alive; destroy overwrites it
 * with FI_MAGIC_DEAD before the memory is freed. */
#define FI_MAGIC_CONTEXT 0x43584946u /* "FIXC" little-endian */
#define FI_MAGIC_PLAN 0x4e4c5046u
#define FI_MAGIC_CASCADE 0x43534346u
#define FI_MAGIC_BSR 0x52534246u
#define FI_MAGIC_VARIANT 0x52415646u
#define FI_MAGIC_DEAD 0xdeadf1f1u

/* FI_OK when `obj` is a live object of that magic, else
 * FI_STATUS_INVALID_ARGUMENT naming `fn` and `what` ("plan"). Best effort:
 * a destroyed object's memory may have been reused (then it reads as
 * whatever lives there now); under AddressSanitizer freed memory is
 * recognised without being read. */
fi_status fi_handle_check(const void *obj, uint32_t magic, const char *fn, const char *what);
/* fi_handle_check, then refuse a second thread while one is inside:
 * `busy` is the object's flag; on FI_OK the caller must fi_handle_leave. */
fi_status fi_handle_enter(const void *obj, uint32_t magic, _Atomic int32_t *busy,
                          const char *fn, const char *what);
static inline void fi_handle_leave(_Atomic int32_t *busy) {
    atomic_store_explicit(busy, 0, memory_order_release);
}
/* fi_handle_enter on an object with a `busy` member (obj may be NULL). */
#define FI_HANDLE_ENTER(obj, magic, fn, what) \
    fi_handle_enter((obj), (magic), (obj) ? &(obj)->busy : NULL, (fn), (what))
/* Mark an object dead just before it is freed (a store the compiler may not
 * drop as dead, which a plain one before free() would be). */
void fi_handle_retire(uint32_t *magic);
/* A context that may take a call or a new object: live, and not destroyed
 * while objects on it were alive (fi_context_destroy then defers the free
 * to the last of them). */
fi_status fi_context_check(const fi_context *ctx, const char *fn);
/* References of the objects made on a context (see struct fi_context). */
void fi_context_retain(fi_context *ctx);
void fi_context_release(fi_context *ctx);

/* ----------------------------------------------------------------- backend */

struct fi_plan;

/* How the scheduler cuts and orders a batch for one backend's kernels: the
 * backend's defaults (fi_backend.policy), which its plan_init may refine for
 * the kernels a plan runs (docs/SCHEDULER.md). */
typedef struct fi_sched_policy {
    /* Packed-row query tiles the kernels support, ascending. */
    int32_t q_tiles[4];
    int32_t num_q_tiles;
    /* The cost model of one work item, measured per backend:
     *   a * packed query rows + b * keys + c * packed query rows * keys,
     * where rows above cost_rows_exact count as whole blocks of
     * cost_rows_block (0: rows as they are). */
    double cost_per_q_row;
    double cost_per_key;
    double cost_per_row_key;
    int32_t cost_rows_exact;
    int32_t cost_rows_block;
    /* > 0: items that run at once, for the chunk bound ceil(S /
     * split_workers) (<= num_workers; 0: num_workers). */
    int32_t split_workers;
    /* > 0: automatic split-KV cuts the longest span into at most about
     * this many chunks (the chunk bound at least its weighted length over
     * this): a merge reads each chunk's partial state in turn. */
    int32_t split_max_chunks;
    /* Each worker's queue in generation order (request, tokens, keys)
     * instead of longest first; the same items on each worker. */
    bool queues_in_request_order;
    /* > 0: items of more packed rows lead their queues, their workers lead
     * the worker order. */
    int32_t wide_first_rows;
} fi_sched_policy;

/* fi_warmup_* on one backend (no context; arguments validated, index in
 * range): the kernels a plan with `params` and `config` compiles for target
 * `arch` ("" = the backend's default), all counted in *count, the first
 * `capacity` written; and kernel `index` of that list compiled into the
 * disk cache unless it is there. */
typedef fi_status fi_warmup_list_fn(const fi_attention_params *params,
                                    const fi_plan_config *config, const char *arch,
                                    fi_warmup_kernel *kernels, int32_t capacity,
                                    int32_t *count);
typedef fi_status fi_warmup_compile_fn(const fi_attention_params *params,
                                       const fi_plan_config *config, const char *arch,
                                       int32_t index, int32_t *was_cached);

/* A backend is a table of functions behind the context. Arguments reaching
 * these have been validated by the core (shapes, dtypes, bounds, indices). */
typedef struct fi_backend {
    const char *name;
    /* The kernels' tensors are host memory: the core may read index tensors
     * (page tables, positions) to check their values before a call. */
    bool host_memory;
    /* Non-zero when the backend can be used on this machine (CPU: always;
     * CUDA: the driver loads at run time and sees a GPU). */
    int32_t (*device_available)(void);
    fi_sched_policy policy; /* the scheduler's defaults for its kernels */
    fi_status (*context_init)(fi_context *ctx);
    void (*context_fini)(fi_context *ctx);
    /* Workers the scheduler plans for (threads; SMs x CTAs per SM). */
    int32_t (*num_workers)(const fi_context *ctx);
    /* Plan workspace beyond the host schedule (e.g. device memory), and the
     * copy of a freshly built schedule into it. May be NULL. */
    fi_status (*plan_init)(struct fi_plan *plan);
    void (*plan_fini)(struct fi_plan *plan);
    fi_status (*plan_upload)(struct fi_plan *plan);
    fi_status (*run)(struct fi_plan *plan, const fi_run_args *args);
    /* Memory the backend's kernels read and write (CUDA: device memory;
     * CPU: host memory), for objects that own workspaces (cascades, bsr).
     * Allocated at creation, never in a run. */
    fi_status (*mem_alloc)(fi_context *ctx, size_t bytes, void **out);
    void (*mem_free)(fi_context *ctx, void *ptr);
    /* Copy host bytes into mem_alloc memory so that the plan's later runs,
     * on any stream, see them (CUDA: on the stream of the plan's uploads,
     * complete on return). The source may be reused on return. */
    fi_status (*plan_copy_in)(struct fi_plan *plan, void *dst, const void *src, size_t bytes);

    fi_status (*merge_state)(fi_context *ctx, const fi_tensor *v_a,
                             const fi_tensor *s_a, const fi_tensor *v_b,
                             const fi_tensor *s_b, fi_tensor *v_out,
                             fi_tensor *s_out, void *stream);
    fi_status (*merge_state_in_place)(fi_context *ctx, fi_tensor *v, fi_tensor *s,
                                      const fi_tensor *v_other,
                                      const fi_tensor *s_other,
                                      const fi_tensor *mask, void *stream);
    fi_status (*merge_states)(fi_context *ctx, const fi_tensor *v,
                              const fi_tensor *s, fi_tensor *v_out,
                              fi_tensor *s_out, void *stream);
    fi_status (*append_paged_kv_cache)(
        fi_context *ctx, const fi_tensor *append_k, const fi_tensor *append_v,
        const fi_tensor *batch_indices, const fi_tensor *positions,
        fi_tensor *k_cache, fi_tensor *v_cache, fi_kv_layout layout,
        const fi_tensor *kv_indices, const fi_tensor *kv_indptr,
        const fi_tensor *kv_last_page_len, void *stream);
    /* RoPE with explicit positions: either pos_ids [nnz], or, when pos_ids is
     * NULL, indptr [B+1] + offsets [B]. */
    fi_status (*rope)(fi_context *ctx, const fi_rope_params *params,
                      const fi_tensor *q, const fi_tensor *k, fi_tensor *q_out,
                      fi_tensor *k_out, const fi_tensor *pos_ids,
                      const fi_tensor *indptr, const fi_tensor *offsets,
                      void *stream);

    /* The serving ops (core/serving.h), one entry per family; a backend
     * without a family returns FI_STATUS_UNSUPPORTED saying so. */
    fi_status (*norm)(fi_context *ctx, const fi_norm_args *a, void *stream);
    fi_status (*gated_act)(fi_context *ctx, const fi_act_args *a, void *stream);
    fi_status (*softmax)(fi_context *ctx, const fi_softmax_args *a, void *stream);
    fi_status (*sample)(fi_context *ctx, const fi_sample_args *a, void *stream);
    fi_status (*filter)(fi_context *ctx, const fi_filter_args *a, void *stream);
    fi_status (*chain_speculative)(fi_context *ctx, const fi_spec_args *a, void *stream);
    fi_status (*top_k)(fi_context *ctx, const fi_topk_args *a, void *stream);
    fi_status (*rope_cos_sin)(fi_context *ctx, const fi_rope_cache_args *a, void *stream);
    fi_status (*rope_quant)(fi_context *ctx, const fi_rq_args *a, void *stream);

    /* fi_warmup_*: what this process lacks to compile the backend's
     * kernels (NULL: nothing; else e.g. "no C compiler: ..."), the list of
     * a plan's kernels and the compile of one. */
    const char *(*warmup_missing)(void);
    fi_warmup_list_fn *warmup_list;
    fi_warmup_compile_fn *warmup_compile;

} fi_backend;

/* The table that serves `device` (src/backends.c); NULL for a value that is
 * not a fi_device_type. */
const fi_backend *fi_backend_for(fi_device_type device);

struct fi_context {
    uint32_t magic;           /* FI_MAGIC_CONTEXT while alive (fi_handle_check) */
    /* References: one for the context itself (dropped by fi_context_destroy)
     * and one per live plan, cascade and block-sparse object made on it; the
     * last one frees it. */
    _Atomic int32_t refs;
    _Atomic int32_t destroyed;/* fi_context_destroy was called */
    fi_device_type device;
    int32_t device_id;
    int32_t num_threads;      /* resolved: never 0 */
    char simd_request[16];    /* CPU SIMD level asked for; "" = best available */
    const fi_backend *backend;
    void *backend_state; /* CPU: thread pool and SIMD kernels */
    char description[160];
};

/* --------------------------------------------------------------- schedule */

/* One unit of work: the query tokens [q_start, q_end) of one request against
 * its keys [kv_start, kv_end), for every KV head (and the query heads of its
 * group). Positions are within the request. */
typedef struct fi_work_item {
    int32_t request;
    int32_t q_start, q_end;
    int32_t kv_start, kv_end;
    /* -1: write-through (O and LSE written directly). Otherwise the first row
     * of this item's partial state: rows partial_row + (t - q_start) of the
     * partial buffers, one row per query token holding all H_qo heads. */
    int32_t partial_row;
} fi_work_item;

/* Fixed-capacity arrays sized at plan creation; fi_schedule_build rewrites
 * their contents and allocates nothing. */
typedef struct fi_schedule_limits {
    int32_t max_batch_size;
    int32_t max_total_qo;
    int32_t max_workers;
    int32_t max_items;        /* work items */
    int32_t max_partial_rows; /* partial-state rows (one per token per split item) */
} fi_schedule_limits;

typedef struct fi_schedule {
    fi_schedule_limits limits;
    int32_t num_workers;
    int32_t q_tile_rows;   /* packed rows (tokens x group) per query tile */
    int32_t kv_chunk;      /* keys per chunk; 0 = nothing was split */
    int32_t num_items;
    fi_work_item *items;   /* [max_items], worker w runs items[worker_indptr[w] ..] */
    int32_t *worker_indptr;/* [max_workers + 1] */
    double *worker_cost;   /* [max_workers] the cost model's load per worker */
    /* Reduction map: output token merge_out_row[r] (global index into O) is
     * the merge, in order, of partial rows merge_src[merge_indptr[r] ..
     * merge_indptr[r+1]). Write-through tokens do not appear. */
    int32_t num_partial_rows;
    int32_t num_merge_rows;
    int32_t *merge_out_row;/* [max_total_qo] */
    int32_t *merge_indptr; /* [max_total_qo + 1] */
    int32_t *merge_src;    /* [max_partial_rows] */
    double total_cost;
    double max_worker_cost;
    void *scratch;         /* the scheduler's own working memory */
} fi_schedule;

/* What the scheduler needs to know of a batch. Lengths are per request. */
typedef struct fi_schedule_input {
    int32_t batch_size;
    const int32_t *qo_indptr; /* [B+1] */
    const int32_t *kv_len;    /* [B] keys per request */
    int32_t group_size;       /* H_qo / H_kv: query rows folded per token */
    int32_t num_kv_heads;
    bool causal;
    int32_t window_left;      /* -1 = none */
    int32_t num_workers;
    fi_sched_policy policy;
    bool disable_split_kv;
    int32_t fixed_split_size; /* > 0: chunks of exactly this many keys */
} fi_schedule_input;

fi_status fi_schedule_init(fi_schedule *s, const fi_schedule_limits *limits);
void fi_schedule_free(fi_schedule *s);
/* Bytes held by a schedule with these limits (arrays and scratch). */
size_t fi_schedule_bytes(const fi_schedule_limits *limits);
/* Build the schedule for one batch; FI_STATUS_BOUND_EXCEEDED names the bound. */
fi_status fi_schedule_build(fi_schedule *s, const fi_schedule_input *in);

/* ------------------------------------------------------------------- plan */

struct fi_plan {
    uint32_t magic;               /* FI_MAGIC_PLAN while alive */
    _Atomic int32_t busy;         /* a call is inside (fi_handle_enter) */
    fi_context *ctx;
    fi_attention_params params;   /* with defaults resolved (sm_scale, ...) */
    fi_plan_config config;
    float *alibi_slopes;          /* [num_qo_heads] when pos_encoding is ALiBi */
    int32_t group_size;           /* num_qo_heads / num_kv_heads */
    /* The scheduler's policy: the backend's, which its plan_init may refine
     * for the kernels the plan runs. */
    fi_sched_policy policy;

    /* An inner plan of a block-sparse object: its owner checked the
     * caller's outputs against the inputs, and runs it on views padded to
     * whole pages, which may reach past the tensors they view (so the
     * plan's own overlap check would see overlaps that are not there). */
    bool owner_checks_outputs;

    /* The batch of the last fi_plan_update, copied (capacity from config). */
    bool planned;
    int32_t batch_size;
    int32_t total_qo;
    int32_t *qo_indptr;           /* [max_batch_size + 1] */
    int32_t *kv_indptr;           /* [max_batch_size + 1] */
    const int32_t *kv_indices;    /* paged: the caller's page table, referenced */
    int32_t *kv_last_page_len;    /* [max_batch_size] paged */
    int32_t *kv_len;              /* [max_batch_size] keys per request */
    int64_t *mask_offset;         /* [max_batch_size + 1] custom mask bytes */
    int32_t max_kv_len;           /* longest request of the batch */
    int32_t num_pages;            /* entries of kv_indices the batch uses */
    bool pages_checked;           /* page ids scanned (CPU: by every run; CUDA: the
                                     copy of a host table, at the update) */
    int32_t max_page_index;       /* largest page id in kv_indices (-1: none) */
    int64_t mask_bytes;           /* custom mask bytes the batch reads */

    fi_schedule schedule;
    /* Partial states of split items, f32:
     * partial_o [max_partial_rows, H_qo, D_vo], partial_lse [max_partial_rows, H_qo] */
    float *partial_o;
    float *partial_lse;

    void *host_memory;            /* the one allocation the arrays above live in */
    void *backend_state;          /* e.g. device workspace */
    size_t workspace_bytes;
};

/* Backend memory (see fi_backend.mem_alloc / plan_copy_in); NULL-safe free. */
fi_status fi_backend_alloc(fi_context *ctx, size_t bytes, void **out);
void fi_backend_free(fi_context *ctx, void *ptr);
fi_status fi_plan_copy_in(struct fi_plan *plan, void *dst, const void *src, size_t bytes);

/* Partial-state rows for one chunk of `tokens` query tokens per item in
 * flight: on CUDA a worker runs one CTA per KV head at ~2 CTAs per SM, so
 * ~2 x workers / KV heads items run at once. At most 64 MiB of partial
 * state. `p` must be valid. */
int32_t fi_plan_split_rows(int32_t num_workers, const fi_attention_params *p, int64_t tokens);

/* A plan whose partial-state budget is at least min_partial_rows rows (the
 * cascade's shared levels: one query tile over a long prefix is split into
 * many chunks, each chunk's rows a partial state). */
fi_status fi_plan_create_budget(fi_context *ctx, const fi_attention_params *params,
                                const fi_plan_config *config, int32_t min_partial_rows,
                                fi_plan **out);

/* Level l's plan of a cascade as it last ran (auto: shared levels, then the
 * suffix; the plain plan when it did not split); NULL past the levels. For
 * benchmarks and tests that inspect a level's schedule. */
fi_plan *fi_cascade_level_plan(const fi_cascade *c, int32_t level);

/* ------------------------------------------------------------ validation */

/* Check a tensor: non-NULL data, dtype, rank, exact shape (-1 = any), an
 * extent whose byte offsets fit in int64,
 * element alignment, non-negative strides; `name` is used in messages. */
fi_status fi_check_tensor(const fi_tensor *t, const char *name, fi_dtype dtype,
                          int32_t ndim, const int64_t *shape);
/* Outputs against memory they must not share, on tensors that passed
 * fi_check_tensor (addresses only: nothing is read, so device memory
 * works). fi_check_disjoint: `out` and `other` share no byte (byte spans,
 * refined by a common row period: interleaved views of one buffer pass);
 * with same_view_ok the very same view (in place) is allowed. A tensor
 * with NULL data is skipped. fi_check_no_self_overlap: no two elements of
 * `t` share memory (no stride 0, no rows that overlap). */
fi_status fi_check_disjoint(const fi_tensor *out, const char *out_name, const fi_tensor *other,
                            const char *other_name, bool same_view_ok);
fi_status fi_check_no_self_overlap(const fi_tensor *t, const char *name);
/* Both at once, each span computed once: every output of outs[0..n_out)
 * apart from itself, the other outputs and ins[0..n_in) (NULL entries
 * skipped; at most 16 tensors in all). */
fi_status fi_check_apart(const fi_tensor *const *outs, const char *const *out_names, int n_out,
                         const fi_tensor *const *ins, const char *const *in_names, int n_in);
/* An attention call's outputs (o, lse) against themselves, each other and
 * its inputs (q, k, v, custom_mask): plans, cascades, block-sparse. */
fi_status fi_check_run_outputs(const fi_run_args *args);
/* Check a host int32 indptr of n+1 entries: starts at 0, never decreases,
 * ends at most at `max_last` (-1 = no limit). */
fi_status fi_check_indptr(const int32_t *indptr, int32_t n, const char *name,
                          int64_t max_last);

/* Smallest and largest of a[0..n) (INT32_MAX and -1 when n == 0). */
void fi_int32_range(const int32_t *a, int32_t n, int32_t *lo, int32_t *hi);
/* The same while copying a into dst (one pass: a backend that copies the
 * page table anyway checks it for free). */
void fi_int32_copy_range(int32_t *dst, const int32_t *a, int32_t n, int32_t *lo, int32_t *hi);

/* ------------------------------------------------------------ numerics */

/* The standard ALiBi slope of head h among n heads (as FlashInfer). */
float fi_alibi_slope(int32_t h, int32_t num_heads);

#endif /* FI_INTERNAL_H */
