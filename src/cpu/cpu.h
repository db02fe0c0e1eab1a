/*
 * cpu.h — the CPU backend's internal interface: its state, the thread pool,
 * and the standalone ops (merge, append, RoPE) it exposes in fi_cpu_backend.
 */
#ifndef FI_CPU_H
#define FI_CPU_H

#include "core/internal.h"

/* The backend's table (backend.c), for the registry (src/backends.c). */
extern const fi_backend fi_cpu_backend;

/* fi_backend's warmup members (warmup.c). */
const char *fi_cpu_warmup_missing(void);
fi_warmup_list_fn fi_cpu_warmup_list;
fi_warmup_compile_fn fi_cpu_warmup_compile;

/* ------------------------------------------------------------ thread pool */

typedef struct fi_thread_pool fi_thread_pool;

/* fn(arg, worker, num_workers) runs once on every worker; worker 0 is the
 * calling thread. fi_thread_pool_run returns when all have finished. */
typedef void (*fi_pool_fn)(void *arg, int32_t worker, int32_t num_workers);

fi_status fi_thread_pool_create(int32_t num_threads, fi_thread_pool **out);
void fi_thread_pool_destroy(fi_thread_pool *pool);
int32_t fi_thread_pool_size(const fi_thread_pool *pool);
void fi_thread_pool_run(fi_thread_pool *pool, fi_pool_fn fn, void *arg);

/* The CPU backend's per-context state. */
typedef struct fi_cpu_state {
    fi_thread_pool *pool;
    const struct fi_cpu_simd *simd; /* the SIMD kernel table chosen at run time */
    struct fi_cpu_scratch *scratch; /* [num_threads] attention scratch (attention.h) */
    /* The serving ops' per-worker rows (serving.c), kept from call to call
     * (grown when a call needs more) so small calls fault in no pages. */
    void *serving_scratch;
    size_t serving_scratch_bytes;
} fi_cpu_state;

static inline fi_thread_pool *fi_cpu_pool(const fi_context *ctx) {
    return ((const fi_cpu_state *)ctx->backend_state)->pool;
}

/* ------------------------------------------------------------ attention */

fi_status fi_cpu_run(struct fi_plan *plan, const fi_run_args *args);

/* --------------------------------------------------------------- ops */

fi_status fi_cpu_merge_state(fi_context *ctx, const fi_tensor *v_a,
                             const fi_tensor *s_a, const fi_tensor *v_b,
                             const fi_tensor *s_b, fi_tensor *v_out,
                             fi_tensor *s_out, void *stream);
fi_status fi_cpu_merge_state_in_place(fi_context *ctx, fi_tensor *v, fi_tensor *s,
                                      const fi_tensor *v_other,
                                      const fi_tensor *s_other,
                                      const fi_tensor *mask, void *stream);
fi_status fi_cpu_merge_states(fi_context *ctx, const fi_tensor *v,
                              const fi_tensor *s, fi_tensor *v_out,
                              fi_tensor *s_out, void *stream);
fi_status fi_cpu_append_paged_kv_cache(
    fi_context *ctx, const fi_tensor *append_k, const fi_tensor *append_v,
    const fi_tensor *batch_indices, const fi_tensor *positions,
    fi_tensor *k_cache, fi_tensor *v_cache, fi_kv_layout layout,
    const fi_tensor *kv_indices, const fi_tensor *kv_indptr,
    const fi_tensor *kv_last_page_len, void *stream);
fi_status fi_cpu_rope(fi_context *ctx, const fi_rope_params *params,
                      const fi_tensor *q, const fi_tensor *k, fi_tensor *q_out,
                      fi_tensor *k_out, const fi_tensor *pos_ids,
                      const fi_tensor *indptr, const fi_tensor *offsets,
                      void *stream);

#endif /* FI_CPU_H */
