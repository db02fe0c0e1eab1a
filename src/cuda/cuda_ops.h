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

/* The serving ops: norms, activations, RoPE from a cos/sin cache
 * (serving_ops.c, kernels/serving.cuh); softmax, sampling, filters, chain
 * speculative sampling, top-k (sampling_ops.c, kernels/sampling.cuh). */
fi_status fi_cuda_norm(fi_context *ctx, const fi_norm_args *a, void *stream);
fi_status fi_cuda_gated_act(fi_context *ctx, const fi_act_args *a, void *stream);
fi_status fi_cuda_softmax(fi_context *ctx, const fi_softmax_args *a, void *stream);
fi_status fi_cuda_sample(fi_context *ctx, const fi_sample_args *a, void *stream);
fi_status fi_cuda_filter(fi_context *ctx, const fi_filter_args *a, void *stream);
fi_status fi_cuda_chain_speculative(fi_context *ctx, const fi_spec_args *a, void *stream);
fi_status fi_cuda_top_k(fi_context *ctx, const fi_topk_args *a, void *stream);
fi_status fi_cuda_rope_cos_sin(fi_context *ctx, const fi_rope_cache_args *a, void *stream);
/* RoPE + FP8 quantize (+ paged append): rope_quant.c, kernels/rope_quant.cuh. */
fi_status fi_cuda_rope_quant(fi_context *ctx, const fi_rq_args *a, void *stream);

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

/* Kernel configurations of the serving ops (dtype codes as fi_dtype; -1:
 * no such tensor). Names start with "fi_sv_". */
typedef enum fi_sv_norm_form { FI_SV_RMS = 0, FI_SV_GEMMA = 1, FI_SV_LAYER = 2 } fi_sv_norm_form;
void fi_cuda_sv_norm_spec(fi_sv_norm_form form, int xt, int rt, int wt, int bt, int ot, int vec,
                          fi_kernel_spec *s);
void fi_cuda_sv_act_spec(int kind, int xt, int ot, int vec, fi_kernel_spec *s);
void fi_cuda_sv_rope_spec(int qt, int kt, int neox, fi_kernel_spec *s);
void fi_cuda_sv_qk_norm_rope_spec(int qt, int kt, int qwt, int kwt, int gemma, int neox,
                                  fi_kernel_spec *s);
void fi_cuda_sv_softmax_spec(int xt, int ot, fi_kernel_spec *s);
void fi_cuda_sv_sample_spec(int xt, int logits, fi_kernel_spec *s);
void fi_cuda_sv_filter_spec(int op, int xt, int ot, fi_kernel_spec *s); /* op: fi_filter_op */
void fi_cuda_sv_spec_spec(int dt, int tt, fi_kernel_spec *s);
void fi_cuda_sv_topk_spec(int xt, int ragged, fi_kernel_spec *s);
/* The serving kernels CI compiles (every value of every option): i of n. */
int fi_cuda_sv_num_ci_specs(void);
void fi_cuda_sv_ci_spec(int i, fi_kernel_spec *s);

/* The RoPE + FP8 quantize kernel (names start with "fi_rq_") and the
 * configurations CI compiles: i of n. */
void fi_cuda_rq_spec(int xt, int ot, int neox, int vec, fi_kernel_spec *s);
int fi_cuda_rq_num_ci_specs(void);
void fi_cuda_rq_ci_spec(int i, fi_kernel_spec *s);

/* What the serving ops' host code shares (serving_ops.c). */
/* Launch `spec` on a grid gx x gy of `threads`-thread blocks with `args`
 * (one struct, by value) on `stream`, in clusters of `cluster` blocks
 * along x when > 1 (gx a multiple; sm_90, cuLaunchKernelEx): the context
 * made current, the kernel found through the JIT (in relaxed capture mode
 * when the stream is capturing), nothing allocated or synchronised. */
fi_status fi_cuda_sv_launch(fi_context *ctx, const fi_kernel_spec *spec, int64_t gx, int64_t gy,
                            int threads, int cluster, void *args, void *stream);
/* Byte stride of dim d of t. */
int64_t fi_cuda_sv_bstride(const fi_tensor *t, int d);
/* Whether t's last dim is contiguous and every row (every index of the
 * other dims) starts `align`-byte aligned. */
bool fi_cuda_sv_rows_aligned(const fi_tensor *t, int64_t align);
/* Blocks of a one-block-per-row kernel over `rows` rows: two per SM at
 * most (1024 threads each), the kernel striding over the rest. */
int64_t fi_cuda_sv_row_blocks(const fi_context *ctx, int64_t rows);
/* CTAs of a cluster that share one row of `vocab` values (kernels/
 * select.cuh's teams) when `rows` rows run at once: up to 8 (the portable
 * cluster size) while the rows' clusters fit at once (clusters of 4 and 8
 * on 7/8 of the SMs), each CTA at least one draw block and at most SB of
 * them; 1 before sm_90. */
int fi_cuda_sv_team_size(const fi_context *ctx, int64_t rows, int64_t vocab);

#endif /* FI_CUDA_OPS_H */
