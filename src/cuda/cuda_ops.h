/*
 * cuda_ops.h — the standalone ops on the CUDA backend (src/cuda/ops.c,
 * kernels/ops.cuh): the fi_backend entries and the kernel configurations
 * they compile, for tests/gpu/jit_compile (CI).
 */
#ifndef FI_CUDA_OPS_H
#define FI_CUDA_OPS_H

#include "cuda/cuda_backend.h"

fi_status fi_cuda_merge_state(fi_context *ctx, const fi_tensor *v_a, const fi_tensor *s_a,
                              const fi_tensor *v_b, const fi_tensor *s_b, fi_tensor *v_out,
                              fi_tensor *s_out, void *stream);
fi_status fi_cuda_merge_state_in_place(fi_context *ctx, fi_tensor *v, fi_tensor *s,
                                       const fi_tensor *v_other, const fi_tensor *s_other,
                                       const fi_tensor *mask, void *stream);
fi_status fi_cuda_merge_states(fi_context *ctx, const fi_tensor *v, const fi_tensor *s,
                               fi_tensor *v_out, fi_tensor *s_out, void *stream);
fi_status fi_cuda_append_paged_kv_cache(
    fi_context *ctx, const fi_tensor *append_k, const fi_tensor *append_v,
    const fi_tensor *batch_indices, const fi_tensor *positions, fi_tensor *k_cache,
    fi_tensor *v_cache, fi_kv_layout layout, const fi_tensor *kv_indices,
    const fi_tensor *kv_indptr, const fi_tensor *kv_last_page_len, void *stream);
fi_status fi_cuda_rope(fi_context *ctx, const fi_rope_params *params, const fi_tensor *q,
                       const fi_tensor *k, fi_tensor *q_out, fi_tensor *k_out,
                       const fi_tensor *pos_ids, const fi_tensor *indptr,
                       const fi_tensor *offsets, void *stream);

/* The serving ops (serving_ops.c): FI_STATUS_UNSUPPORTED for now. */
fi_status fi_cuda_norm(fi_context *ctx, const fi_norm_args *a, void *stream);
fi_status fi_cuda_gated_act(fi_context *ctx, const fi_act_args *a, void *stream);
fi_status fi_cuda_softmax(fi_context *ctx, const fi_softmax_args *a, void *stream);
fi_status fi_cuda_sample(fi_context *ctx, const fi_sample_args *a, void *stream);
fi_status fi_cuda_filter(fi_context *ctx, const fi_filter_args *a, void *stream);
fi_status fi_cuda_chain_speculative(fi_context *ctx, const fi_spec_args *a, void *stream);
fi_status fi_cuda_top_k(fi_context *ctx, const fi_topk_args *a, void *stream);
fi_status fi_cuda_rope_cos_sin(fi_context *ctx, const fi_rope_cache_args *a, void *stream);

/* Kernel configurations of kernels/ops.cuh (dtype codes as fi_dtype). */
void fi_cuda_ops_merge_spec(int va, int vb, int vo, int mask, int vec, fi_kernel_spec *s);
void fi_cuda_ops_merge_n_spec(int v, int vo, int vec, fi_kernel_spec *s);
void fi_cuda_ops_append_spec(int elem_bytes, int vec, fi_kernel_spec *s);
void fi_cuda_ops_rope_spec(int qt, int kt, int interleave, int pos_ids, int vec,
                           fi_kernel_spec *s);

/* A representative set covering every value of every option (CI compiles
 * these; the library compiles any other on first use): spec i of n. */
int fi_cuda_ops_num_ci_specs(void);
void fi_cuda_ops_ci_spec(int i, fi_kernel_spec *s);

#endif /* FI_CUDA_OPS_H */
